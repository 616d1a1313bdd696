/* fuzz_http.c — libFuzzer target: the exporter's request-target handling
 * (src/monitor/http_route.c) on arbitrary methods and targets. Decoding
 * never lengthens a target or produces a NUL, and /metrics is served only
 * for a target that decodes to exactly "/metrics". */
#include "monitor/monitor.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 8192) return 0;
    /* "METHOD\nTARGET" (no newline: GET) */
    const uint8_t *nl = memchr(data, '\n', size);
    size_t ml = nl ? (size_t)(nl - data) : 0;
    const uint8_t *t = nl ? nl + 1 : data;
    size_t tl = size - (size_t)(t - data);
    char *m = fuzz_cstr(data, ml), *u = fuzz_cstr(t, tl);
    if (!m || !u) goto out;
    size_t before = strlen(u);
    size_t after = gm__http_unescape(u);
    if (after > before || after != strlen(u)) abort(); /* longer, or a NUL smuggled in */
    int page = gm__http_route(nl ? m : "GET", u);
    if (page == GM_HTTP_METRICS && strcmp(u, "/metrics")) abort();
    if (page == GM_HTTP_METRICS && strcmp(nl ? m : "GET", "GET") && strcmp(m, "HEAD")) abort();
out:
    free(m);
    free(u);
    return 0;
}
