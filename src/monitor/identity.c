/* identity.c — who a publishing process is: its rank, local
 * rank and world size and the job's run id, from the launchers' own
 * environment variables (torchrun, SLURM, Open MPI), and where it runs (host
 * name, Kubernetes pod, cgroup). And the map between PID namespaces: a
 * publisher in a container records its pid as it sees it and the inode of
 * its PID namespace (and its host pid, when its /proc shows the host's
 * namespace); a reader outside finds the pid it sees for that process
 * through /proc/<pid>/status's NSpid line. Which NVML process a row is:
 * pidmap.c. /proc is $GPUMEM_PROC_ROOT's when set (tests plant one). */
#include "internal.h"
#include "monitor/monitor.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
    FILE *f = gm__proc_fopen("/proc/self/cgroup");
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
    /* values from the environment go out as label values: valid UTF-8, cut
     * on character boundaries (util/utf8.c) */
    gm__utf8_copy(h->run_id, sizeof h->run_id, first_env(run_env));
    h->rank = env_int(rank_env);
    h->local_rank = env_int(local_env);
    h->world_size = env_int(world_env);
    char buf[512];
    if (gethostname(buf, sizeof buf) != 0) buf[0] = '\0';
    buf[sizeof buf - 1] = '\0';
    gm__utf8_copy(h->hostname, sizeof h->hostname, buf);
    if (getenv("KUBERNETES_SERVICE_HOST")) {
        const char *ns = getenv("POD_NAMESPACE"), *pod = getenv("POD_NAME");
        snprintf(buf, sizeof buf, "%s%s%s", ns && *ns ? ns : "", ns && *ns ? "/" : "",
                 pod && *pod ? pod : h->hostname);
        gm__utf8_copy(h->k8s_pod, sizeof h->k8s_pod, buf);
    }
    own_cgroup(buf, sizeof buf);
    gm__utf8_copy(h->cgroup, sizeof h->cgroup, buf);
}

const char *gm__proc_root(void) {
    const char *r = getenv("GPUMEM_PROC_ROOT");
    return r && r[0] == '/' ? r : "/proc";
}

FILE *gm__proc_fopen(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return NULL;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) close(fd);
    return f;
}

void gm__proc_path(char *buf, size_t len, int pid, const char *what) {
    if (pid > 0) snprintf(buf, len, "%s/%d/%s", gm__proc_root(), pid, what);
    else snprintf(buf, len, "%s/self/%s", gm__proc_root(), what);
}

/* The inode a namespace link names: "pid:[4026531836]" (what readlink gives
 * for /proc/<pid>/ns/pid; its stat's st_ino is the same number, but a test's
 * planted /proc can only hold the link). 0 if unreadable or malformed. */
static uint64_t ns_link_inode(const char *path) {
    char target[64];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = '\0';
    if (strncmp(target, "pid:[", 5) || !isdigit((unsigned char)target[5])) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(target + 5, &end, 10);
    return errno || strcmp(end, "]") ? 0 : (uint64_t)v;
}

uint64_t gm__proc_pidns(int pid) {
    char path[PATH_MAX];
    gm__proc_path(path, sizeof path, pid, "ns/pid");
    return ns_link_inode(path);
}

bool gm__procfs_is_init(void) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/1/ns/pid", gm__proc_root());
    uint64_t ns = ns_link_inode(path); /* the namespace whose pid 1 this /proc shows */
    if (!ns) ns = gm__proc_pidns(0);    /* not allowed to look (not root): our own */
    return ns == GM__PIDNS_INIT_INO;
}

/* Parse the numbers of an NSpid line after "NSpid:": false when anything
 * but pids from 1 to 2^31 - 1 separated by blanks is there. */
static bool parse_nspid(const char *p, int *ids, int max, int *count) {
    *count = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || !*p) return *count > 0;
        if (!isdigit((unsigned char)*p)) return false;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || v <= 0 || v > 0x7fffffff || (*end && !strchr(" \t\n", *end))) return false;
        if (*count < max) ids[*count] = (int)v;
        (*count)++;
        p = end;
    }
}

int gm__proc_nspid(int pid, int *ids, int max) {
    char path[PATH_MAX], line[512];
    gm__proc_path(path, sizeof path, pid, "status");
    FILE *f = gm__proc_fopen(path);
    if (!f) return 0;
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6)) continue;
        /* a line longer than the buffer (33 levels at most fit) is malformed */
        if (!strchr(line, '\n') && !feof(f)) break;
        if (!parse_nspid(line + 6, ids, max, &count)) count = 0;
        break;
    }
    fclose(f);
    return count > max ? max : count;
}

/* The last number of the NSpid line of /proc/<pid>/status: the pid in the
 * process's own namespace. -1 if unreadable. */
static int innermost_pid(int pid) {
    int ids[GM__NSPID_MAX];
    int n = gm__proc_nspid(pid, ids, GM__NSPID_MAX);
    return n > 0 ? ids[n - 1] : -1;
}

int gm__host_pid_self(void) {
    int ids[GM__NSPID_MAX];
    if (gm__proc_nspid(0, ids, GM__NSPID_MAX) < 1 || !gm__procfs_is_init()) return 0;
    return ids[0];
}

int gm__pid_from_ns(uint64_t pidns, int ns_pid) {
    if (!pidns || ns_pid <= 0) return 0;
    DIR *d = opendir(gm__proc_root());
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        int pid = atoi(e->d_name);
        /* NSpid first (one read), the namespace's inode only on a match */
        if (pid > 0 && innermost_pid(pid) == ns_pid && gm__proc_pidns(pid) == pidns) found = pid;
    }
    closedir(d);
    return found;
}
