/* plan/plan_check.c — what the plan tells the rest of the policy: its
 * counters, its layout, and its part of the invariant check (gm_check). */
#include "plan.h"

uint64_t gm__gp_plan_served(const gp_state *st) { return st->plan ? st->plan->served : 0; }
uint64_t gm__gp_plan_claimed(const gp_state *st) { return st->plan ? st->plan->claimed : 0; }
uint64_t gm__gp_plan_work(const gp_state *st) { return st->plan ? st->plan->work : 0; }
uint64_t gm__gp_plan_starved(const gp_state *st) { return st->plan ? st->plan->starved : 0; }
uint64_t gm__gp_plan_ops(const gp_state *st) { return st->plan ? (uint64_t)st->plan->op : 0; }

int gm__gp_plan_layout(const gp_state *st) {
    const gp_plan *pl = st->plan;
    return pl && pl->state == PL_ACTIVE ? (pl->rebase ? 'B' : 'A') : 0;
}

/* Only the active plan's arenas have a free-range index, and it lists
 * exactly that arena's free ranges in address order. */
int gm__gp_plan_check(gp_state *st, char *err, size_t errlen) {
    gp_plan *pl = st->plan;
    for (uint32_t k = 0; k < st->narenas; k++) {
        const gp_arena *a = st->arenas[k];
        if (!a->fidx) continue;
        if (!pl || pl->state != PL_ACTIVE || (pl->ra != a && pl->ma != a))
            return gm__check_fail(err, errlen, "arena %d has a free-range index but no active plan", a->index);
        uint64_t i = 0;
        for (const gp_block *b = a->head; b; b = b->next) {
            if (b->state != GP_FREE) continue;
            if (i >= a->nfidx || a->fidx[i] != b)
                return gm__check_fail(err, errlen, "plan: free range 0x%llx missing from the index at %llu",
                                      (unsigned long long)b->h.ptr, (unsigned long long)i);
            i++;
        }
        if (i != a->nfidx) return gm__check_fail(err, errlen, "plan: index holds %llu ranges, the arena %llu", (unsigned long long)a->nfidx, (unsigned long long)i);
    }
    return GM_OK;
}
