/* shm_test.c — see shm_test.h. */
#include "shm_test.h"

#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

gm_allocator *gm_test_shm_allocator(int ndevices) {
    gm_allocator *a = calloc(1, sizeof *a);
    if (!a) abort();
    a->ndevices = ndevices;
    pthread_mutex_init(&a->devices_lock, NULL);
    return a;
}

void gm_test_shm_allocator_free(gm_allocator *a) {
    gm_allocator_unpublish(a);
    pthread_mutex_destroy(&a->devices_lock);
    free(a);
}

void gm_test_shm_tag(const char *tag) {
    char t[64];
    snprintf(t, sizeof t, "%s%d", tag, (int)getpid());
    setenv("GPUMEM_SHM_TAG", t, 1);
}
