/* gm_limits.h — every limit gpumem enforces on its inputs and on the sizes it
 * is asked for, in one place (docs/RELIABILITY.md lists them with their
 * values). Each is checked where the input is read, and exceeding one is an
 * error that names the limit, never a crash, a hang or a silent truncation. */
#ifndef GPUMEM_LIMITS_H
#define GPUMEM_LIMITS_H

#include <stdint.h>

/* The largest single allocation request any policy accepts, and the largest
 * size a trace event may carry (1 PiB: thousands of times any GPU). Larger
 * requests are GM_ENOMEM; rounding a request this size never wraps. A trace
 * event above it is a replay anomaly ("bad_events"), skipped. */
#define GM_LIMIT_ALLOC_BYTES ((uint64_t)1 << 50)

/* Trace readers (pickle snapshots and .gmt files). */
#define GM_LIMIT_TRACE_FILE_BYTES ((uint64_t)4 << 30) /* a trace file as stored (gzip: 4 GiB) */
#define GM_LIMIT_TRACE_INPUT_BYTES ((uint64_t)16 << 30) /* bytes read, after gunzip */
#define GM_LIMIT_TRACE_MEMORY ((uint64_t)4 << 30)       /* host memory the unpickler may hold, and the trace built */
#define GM_LIMIT_DECLARED_LENGTH ((uint64_t)256 << 20)  /* one string/bytes/section length */
#define GM_LIMIT_GMT_BODY ((uint64_t)16 << 30)          /* a .gmt body (decoded as it is inflated) */
#define GM_LIMIT_TRACE_EVENTS (((uint64_t)1 << 31) - 1) /* events per trace */
#define GM_LIMIT_STACK_DEPTH 4096                       /* frames per stack */

/* The Prometheus exporter (gpumem exporter). */
#define GM_LIMIT_HTTP_CONNECTIONS 256       /* open connections in all */
#define GM_LIMIT_HTTP_CONNECTIONS_PER_IP 32 /* open connections from one address */
#define GM_LIMIT_HTTP_TIMEOUT_S 10          /* seconds a connection may stay idle */
#define GM_LIMIT_HTTP_REQUEST_S 30          /* seconds one request may take, however it trickles */

#endif /* GPUMEM_LIMITS_H */
