/* pidmap.c — which published row each of NVML's processes is (PIDs right
 * inside a container).
 *
 * NVML numbers processes in the initial PID namespace (the host's) on the
 * drivers that do not translate (every one before the open modules began
 * to, some 560s do: github.com/Project-HAMi/HAMi-core/issues/112); a reader
 * in a container sees its own numbers in /proc and in publication. So:
 *
 *  - host view (the reader's /proc is the initial namespace's, see
 *    gm__procfs_is_init): the published rows already carry the pid this
 *    /proc shows (discover.c maps a container's publisher through NSpid),
 *    so a row and NVML's process are one exactly when the numbers are
 *    equal. EXACT.
 *  - from inside a PID namespace, in this order:
 *    1. the publisher recorded its host pid itself (its /proc showed the
 *       initial namespace: gm__host_pid_self) and NVML lists it. EXACT.
 *    2. NVML lists the row's own pid (a translating driver) and its used
 *       memory can hold the row's reserved bytes. INFERRED: on a driver
 *       that does not translate, the same number may be another process.
 *    3. elimination: a row whose reserved bytes only one of NVML's
 *       remaining processes can hold, and that process no other remaining
 *       row, are paired; repeated while it pairs. INFERRED.
 *    Anything else stays apart: two rows of one size on one GPU, or a
 *    process of another container as big as ours, are never guessed. */
#include "internal.h"
#include "monitor/monitor.h"

#include <stdlib.h>

const char *gm__pidmap_name(int how) {
    switch (how) {
    case GM_PIDMAP_EXACT: return "exact";
    case GM_PIDMAP_INFERRED: return "inferred";
    case GM_PIDMAP_UNMAPPED: return "unmapped";
    default: return NULL;
    }
}

static bool candidate(const gm__mon_row *r, int device) {
    return r->device == device && r->source != 0 && !r->have_nvml_used;
}

/* NVML's process p can be row r: its used memory (context and libraries
 * included) holds the allocator's reserved bytes; unknown either way is no
 * objection. */
static bool fits(const gm__nvml_proc *p, const gm__mon_row *r) {
    if (!p->have_used || !r->have_alloc || r->v.reserved <= 0) return true;
    return p->used >= (uint64_t)r->v.reserved;
}

/* Step 3: pair a row with the one process that fits it when that process
 * fits no other row; until nothing pairs. taken[] marks rows matched. */
static void eliminate(const gm__mon_row *rows, int nrows, int device, const gm__nvml_proc *np, int n,
                      bool *taken, int *row_of, int *how) {
    for (bool paired = true; paired;) {
        paired = false;
        for (int k = 0; k < nrows; k++) {
            if (taken[k] || !candidate(&rows[k], device)) continue;
            int only = -1, fitting = 0;
            for (int i = 0; i < n; i++)
                if (row_of[i] < 0 && fits(&np[i], &rows[k])) {
                    only = i;
                    fitting++;
                }
            if (fitting != 1) continue;
            int rivals = 0;
            for (int j = 0; j < nrows; j++)
                if (!taken[j] && candidate(&rows[j], device) && fits(&np[only], &rows[j])) rivals++;
            if (rivals != 1) continue;
            row_of[only] = k;
            how[only] = GM_PIDMAP_INFERRED;
            taken[k] = paired = true;
        }
    }
}

/* The row for NVML's pid by one of the kernel's numbers: the reader's
 * (host view) or the publisher's own host pid; -1 if none. */
static int by_number(const gm__mon_row *rows, int nrows, int device, const bool *taken, int pid, bool host_view) {
    for (int k = 0; k < nrows; k++)
        if (!taken[k] && candidate(&rows[k], device) && (host_view ? rows[k].pid : rows[k].host_pid) == pid)
            return k;
    return -1;
}

void gm__pidmap_match(const gm__mon_row *rows, int nrows, int device, const gm__nvml_proc *np, int n,
                      bool host_view, int *row_of, int *how) {
    bool *taken = calloc((size_t)(nrows ? nrows : 1), sizeof *taken);
    for (int i = 0; i < n; i++) {
        row_of[i] = -1;
        how[i] = host_view ? GM_PIDMAP_EXACT : GM_PIDMAP_UNMAPPED;
    }
    if (!taken) return; /* out of memory: nothing joined, nothing wrong */
    for (int i = 0; i < n; i++) { /* host view, or step 1 */
        int k = np[i].pid > 0 ? by_number(rows, nrows, device, taken, np[i].pid, host_view) : -1;
        if (k < 0) continue;
        row_of[i] = k;
        how[i] = GM_PIDMAP_EXACT;
        taken[k] = true;
    }
    if (!host_view) {
        for (int i = 0; i < n; i++) { /* step 2 */
            if (row_of[i] >= 0 || np[i].pid <= 0) continue;
            for (int k = 0; k < nrows && row_of[i] < 0; k++)
                if (!taken[k] && candidate(&rows[k], device) && rows[k].pid == np[i].pid && fits(&np[i], &rows[k])) {
                    row_of[i] = k;
                    how[i] = GM_PIDMAP_INFERRED;
                    taken[k] = true;
                }
        }
        eliminate(rows, nrows, device, np, n, taken, row_of, how);
    }
    free(taken);
}
