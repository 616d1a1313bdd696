/* shm_test.h — setup shared by the tests of shared-memory publication
 * (test_monitor_shm.c, test_monitor_hostile.c): a bare allocator object to
 * publish from, and a segment tag of the test's own so that its segments
 * never mix with another test's or a real process's.
 *
 *   static int setup(void **state) { gm_test_shm_tag("hostile"); return 0; }
 *   gm_allocator *a = gm_test_shm_allocator(1);
 *   gm_allocator_publish(a, "job"); ...
 *   gm_test_shm_allocator_free(a);
 *
 * Uses the library's internals (internal.h): include after <cmocka.h>. */
#ifndef GM_TEST_SHM_H
#define GM_TEST_SHM_H

#include "gpumem/gpumem.h"

#include <stddef.h>

/* An allocator object with `ndevices` devices and nothing else:
 * publication needs only the devices table. */
gm_allocator *gm_test_shm_allocator(int ndevices);
/* Unpublish (if published) and free it. */
void gm_test_shm_allocator_free(gm_allocator *a);
/* GPUMEM_SHM_TAG=<tag><pid>: this process's segments under a prefix of its own. */
void gm_test_shm_tag(const char *tag);

/* The beacon path (/dev/shm/...) of a segment under this test's prefix
 * whose header names pid `pid` (as the publisher saw itself): how many were
 * found; path is the last one's. Names are random since issue 26 (defect 5),
 * so tests find segments by their contents. */
int gm_test_shm_path(int pid, char *path, size_t len);

#endif /* GM_TEST_SHM_H */
