/* gm_test.h — helpers shared by the cmocka tests: build a sim backend and an
 * allocator in one call, and assert the allocator's invariants with the
 * broken one in the failure message.
 *
 *   gm_backend *b; gm_allocator *a;
 *   assert_int_equal(gm_test_make(GM_POLICY_TORCH, "max_split_size_mb:64",
 *                                 8 * GM_TEST_GIB, true, &b, &a), GM_OK);
 *   ...  gm_test_check(a);  ...
 *   gm_test_destroy(b, a);
 *
 * Include after <cmocka.h> (with its usual prerequisites). */
#ifndef GM_TEST_H
#define GM_TEST_H

#include "gpumem/backend.h"
#include "gpumem/gpumem.h"

#include <stdbool.h>
#include <stdint.h>

#define GM_TEST_KIB ((uint64_t)1024)
#define GM_TEST_MIB (GM_TEST_KIB * 1024)
#define GM_TEST_GIB (GM_TEST_MIB * 1024)

/* A one-device sim backend of `capacity` bytes (0: the sim default, 141 GiB)
 * whose events complete only through gm_sim_complete_events when
 * manual_events, and an allocator on it with `policy` and the settings in
 * `conf` (PYTORCH_CUDA_ALLOC_CONF syntax, NULL or "" for none; a policy: key
 * in conf wins over `policy`). On error nothing is left allocated and
 * *b, *a are NULL. */
int gm_test_make(gm_policy_kind policy, const char *conf, uint64_t capacity, bool manual_events,
                 gm_backend **b, gm_allocator **a);
/* Same with full sim options (device count, granularity, ...). */
int gm_test_make_opts(gm_policy_kind policy, const char *conf, const gm_sim_options *opts,
                      gm_backend **b, gm_allocator **a);
/* Destroy the allocator, then the backend (either may be NULL). */
void gm_test_destroy(gm_backend *b, gm_allocator *a);

/* Fail the current test (cmocka) unless gm_check(a, -1) passes; the message
 * names the broken invariant and the caller's line. */
#define gm_test_check(a) gm_test_check_at((a), __FILE__, __LINE__)
void gm_test_check_at(gm_allocator *a, const char *file, int line);

/* gm_malloc on device 0, failing the test (with the error's detail) unless
 * it returns a block. */
gm_devptr gm_test_alloc(gm_allocator *a, uint64_t size, gm_stream stream);

/* Fetch stats of device 0, failing the test on error. */
gm_stats gm_test_stats(gm_allocator *a);

/* Finish a trace built with gm__tb_* and compile device 0's program,
 * failing the test on error (the builder is consumed). */
struct gm__trace_builder;
struct gm_replay_prog;
struct gm_replay_prog *gm_test_compile(struct gm__trace_builder *b);

#endif /* GM_TEST_H */
