/* shm_test.c — see shm_test.h. */
#include "shm_test.h"

#include "internal.h"

#include "monitor/monitor.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
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

int gm_test_shm_path(int pid, char *path, size_t len) {
    char prefix[80];
    gm__shm_prefix(prefix, sizeof prefix);
    DIR *d = opendir(GM__SHM_DIR);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char p[300];
        snprintf(p, sizeof p, GM__SHM_DIR "/%s", e->d_name);
        int fd = open(p, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue;
        int32_t hp = 0;
        if (pread(fd, &hp, sizeof hp, offsetof(gm__shm_header, pid)) == (ssize_t)sizeof hp && hp == pid) {
            snprintf(path, len, "%s", p);
            n++;
        }
        close(fd);
    }
    closedir(d);
    return n;
}
