/* publish.c — placeholder until shared-memory publication is written:
 * publication is reported as unsupported and every hook is a no-op. */
#include "internal.h"

int gm_allocator_publish(gm_allocator *a, const char *label) {
    (void)a;
    (void)label;
    return GM_ENOTSUP;
}
void gm_allocator_unpublish(gm_allocator *a) { (void)a; }
void gm__publisher_update(gm__publisher *p, int device, const gm_stats *s) {
    (void)p;
    (void)device;
    (void)s;
}
void gm__publisher_close(gm__publisher *p) { (void)p; }
int gm__publish_from_env(struct gm_allocator *a) {
    (void)a;
    return GM_OK;
}
