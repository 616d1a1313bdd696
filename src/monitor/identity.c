/* identity.c — who a publishing process is (issue 27): its rank, local
 * rank and world size and the job's run id, from the launchers' own
 * environment variables (torchrun, SLURM, Open MPI), and where it runs (host
 * name, Kubernetes pod, cgroup). And the map between PID namespaces: a
 * publisher in a container records its pid as it sees it and the inode of
 * its PID namespace; a reader outside finds the pid it sees for that process
 * through /proc/<pid>/status's NSpid line. */
#include "internal.h"
#include "monitor/monitor.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first of the variables that is set and not empty, or NULL. */
static const char *first_env(const char *const *names) {
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) return v;
    }
    return NULL;
}

/* An integer from the first variable set: -1 when none is, or it is not a
 * number from 0 to 2^31 - 1 (a bad value is unknown, never a guess). */
static int32_t env_int(const char *const *names) {
    const char *v = first_env(names);
    if (!v) return -1;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end || n < 0 || n > 0x7fffffff) return -1;
    return (int32_t)n;
}

/* The cgroup v2 path of this process ("0::<path>" in /proc/self/cgroup), or
 * the first v1 line's path: a container's is its id, "/" outside one. */
static void own_cgroup(char *buf, size_t len) {
    buf[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *path = strchr(line, ':');
        path = path ? strchr(path + 1, ':') : NULL;
        if (!path) continue;
        bool v2 = !strncmp(line, "0::", 3);
        if (v2 || !buf[0]) snprintf(buf, len, "%s", path + 1);
        if (v2) break;
    }
    fclose(f);
}

void gm__identity_fill(gm__shm_header *h) {
    static const char *const run_env[] = {"GPUMEM_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", NULL};
    static const char *const rank_env[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", NULL};
    static const char *const local_env[] = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const world_env[] = {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", NULL};
    const char *run = first_env(run_env);
    snprintf(h->run_id, sizeof h->run_id, "%s", run ? run : "");
    h->rank = env_int(rank_env);
    h->local_rank = env_int(local_env);
    h->world_size = env_int(world_env);
    if (gethostname(h->hostname, sizeof h->hostname) != 0) h->hostname[0] = '\0';
    h->hostname[sizeof h->hostname - 1] = '\0';
    if (getenv("KUBERNETES_SERVICE_HOST")) {
        const char *ns = getenv("POD_NAMESPACE"), *pod = getenv("POD_NAME");
        snprintf(h->k8s_pod, sizeof h->k8s_pod, "%s%s%s", ns && *ns ? ns : "", ns && *ns ? "/" : "",
                 pod && *pod ? pod : h->hostname);
    }
    own_cgroup(h->cgroup, sizeof h->cgroup);
}

uint64_t gm__proc_pidns(int pid) {
    char path[64];
    if (pid > 0) snprintf(path, sizeof path, "/proc/%d/ns/pid", pid);
    else snprintf(path, sizeof path, "/proc/self/ns/pid");
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* The last number of the NSpid line of /proc/<pid>/status: the pid in the
 * process's own namespace. -1 if unreadable. */
static int innermost_pid(int pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int last = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6)) continue;
        for (char *p = line + 6;;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            last = (int)v;
            p = end;
        }
        break;
    }
    fclose(f);
    return last;
}

int gm__pid_from_ns(uint64_t pidns, int ns_pid) {
    if (!pidns || ns_pid <= 0) return 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        /* NSpid first (one read), the namespace's inode only on a match */
        if (innermost_pid(pid) == ns_pid && gm__proc_pidns(pid) == pidns) found = pid;
    }
    closedir(d);
    return found;
}
