/* gpumem.c — the `gpumem` policy: gpumem's own low-fragmentation,
 * low-latency placement. This file, the top of src/policy/gpumem/, holds the
 * ops table, the size-class cache for small blocks and the OOM retry; below
 * it (base.h has the stack): the invariant check and segment walk in check.c,
 * the plan in plan/, the per-stream arenas in arena.c, the free-range index
 * in va.c, the no-VMM fallback in plain.c, the physical chunks in chunks.c.
 *
 * How it works (with VMM):
 *  - Each stream gets two arenas, one per pool (small: <= 1 MiB): a virtual
 *    range (twice the device memory) where blocks (512-byte multiples) are
 *    placed best fit, ties to the lower address, and coalesce when freed.
 *    Best fit in one large range packs blocks tightly across 2 MiB granule
 *    boundaries, so only the granules live blocks touch need memory. A free
 *    range is reused at once by its own stream; other streams never see it
 *    (their arenas are elsewhere).
 *  - Physical memory is a per-device pool of chunks, by default one granule
 *    (2 MiB) each, mapped lazily and kept mapped when their blocks die.
 *    Placement takes the best fit unless it needs unmapped granules (or would
 *    leave a multi-granule idle chunk partly used); then it looks for a range
 *    that is mapped already, so mappings get reused (where no plan serves, a
 *    large block also looks inside its range for the place over the most
 *    mapped granules: va.c, densest_window). A placement that still
 *    needs granules takes a loose (unmapped) chunk, else moves the idle
 *    (mapped, no live block) chunk highest in the arena, else from another arena
 *    — after syncing the stream that last freed memory in that arena — and
 *    creates memory only when no chunk is idle: physical memory held is the
 *    peak of granules touched by live blocks (against the peak requested:
 *    bench/RESULTS.md, "Summary: the headline figures").
 *  - gpumem_slack (config) decides when idle chunks move: memory may grow to
 *    (1 + slack) x the peak of live granules before they do. inf moves them
 *    only when creating fails or passes the memory fraction, so a repeating
 *    workload makes no device call after its first step (held memory =
 *    granules ever touched); slack 0 gives the least memory (held = peak
 *    live granules) but moves memory in every step. The default, auto, is 0
 *    while the program warms up, so no early step's layout sets the peak;
 *    once the plan (gpumem_plan:on, also the default) has served a step, or
 *    after PL_WARM allocations with none (gm__gp_loosen), the reserve budget
 *    holds: memory may grow to GP_BUDGET_PERMILLE over the run's peak
 *    allocated so far, and idle chunks move only past that (chunks.c,
 *    reserve_budget). Steps a plan serves then make no device call; steps
 *    whose shapes change move idle memory to where they need it.
 *    bench/gpumem_policy_tradeoff.md and bench/RESULTS.md ("2026-12-07
 *    (evening)") have the measured trade-offs.
 *  - gpumem_chunks (config; run and auto apply only at gpumem_slack:inf,
 *    granule otherwise). granule: every chunk is one granule. run: a
 *    placement's run of unmapped granules gets one chunk (up to
 *    GP_RUN_GRANULES = 1 GiB) and placement stops avoiding partly used idle
 *    chunks (at inf they do not move anyway): far fewer create+map calls on
 *    a cold start (bench/gpumem_policy_tradeoff.md), same peak memory while the device has room, but it may run
 *    out of memory earlier on a nearly full device: a chunk with one live
 *    block pins all its granules, where granule chunks could move singly.
 *    auto (default): run's chunks, at most 1/GP_AUTO_HEADROOM of the free
 *    memory each, while memory held is below GP_AUTO_PERMILLE (15%) of the
 *    device; past that, only a large block's interior (granules no other
 *    block can touch while it lives) gets a multi-granule chunk, and an idle
 *    chunk that a placement would use in part is first cut into chunks over
 *    the same granules (split_partial_at in chunks.c), so nothing made
 *    once the device may fill up pins memory. A cold pass costs run's calls
 *    when the device has room, and every trace that fits with granule chunks
 *    just above its peak fits with auto (bench/gpumem_policy_tradeoff.md).
 *  - The price of moving is device calls: memory between live blocks moves to where
 *    it is needed, one granule per call, on a cold start and in later steps
 *    whenever the live set moves to other granules. One chunk per big block's
 *    interior was measured as the alternative (bench/gpumem_policy_tradeoff.md):
 *    far fewer calls, but more memory, since a chunk that is partly used can
 *    neither move nor be given back; gpumem_chunks:auto keeps its speed only
 *    while the device has room.
 *  - Small blocks are freed into per-arena exact size-class lists and reused
 *    in O(1); the lists are flushed back into the arena whenever a placement
 *    would need more mapping, and on empty_cache / OOM.
 *  - OOM: flush the caches, let the front end finish pending frees
 *    (gm__device_process_events(d, true)), release every unused chunk, retry;
 *    if that fails too, release what the failed placement mapped, so an OOM
 *    holds no more memory than before it.
 *  - Without VMM (granularity gives GM_ENOTSUP) each block is one plain
 *    device allocation, small ones cached by size class (plain.c).
 *
 * Stats: a "segment" is one physical chunk (VMM) or one plain device
 * allocation, counted in the pool of the arena it is mapped in (a chunk moved
 * to the other pool's arena moves its count and bytes). reserved_bytes =
 * physical bytes held. active counts blocks handed out. inactive_split counts
 * small blocks cached in size-class lists, blocks parked for the plan's next
 * block (plan/park.c) and free ranges of an arena other
 * than its topmost one. gm_walk_segments reports, as torch's snapshot does
 * for expandable segments, one segment per maximal run of mapped granules in
 * an arena (total_size = mapped_size = the run's bytes; unmapped address
 * space is not reported), so the sizes add up to reserved_bytes per pool
 * (short of a chunk held but unmapped, which only a failed placement leaves
 * until the next empty_cache). Whether a pointer lies in an arena at all
 * (a double free or a foreign pointer) is the ops' `owns`. */
#include "gpumem.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- size-class cache ------------------------------------------------------ */

/* Stats of a block entering / leaving the active set (every malloc and
 * free: inc/dec, no sign branches); the size-class lists' are in base.h. */
static inline void active_inc(gp_state *st, const gp_block *b) {
    gm__stat_block_inc(st->d->stats.active, st->d->stats.active_bytes, b->h.pool, b->h.size);
}
static inline void active_dec(gp_state *st, const gp_block *b) {
    gm__stat_block_dec(st->d->stats.active, st->d->stats.active_bytes, b->h.pool, b->h.size);
}

/* ---- ops ------------------------------------------------------------------- */

static int gp_create(gm__device *d, void **state) {
    gp_state *st = calloc(1, sizeof *st);
    if (!st) return GM_ENOHOSTMEM;
    st->d = d;
    st->chunk_free = -1;
    /* without a config, the documented default: no plan, so inf */
    st->slack = d->cfg ? d->cfg->gpumem_slack : INFINITY;
    /* gpumem_slack:auto warms up tight (slack 0): memory moves to where the
     * first steps need it, so the whole run's peak never forms; the plan
     * then serves later steps with no device call (gm__gp_loosen). Without
     * a plan there is nothing to warm up for: inf. */
    if (st->slack == GM_GPUMEM_SLACK_AUTO) {
        st->mode.warming = st->mode.autoslack = d->cfg && d->cfg->gpumem_plan;
        st->slack = st->mode.warming ? 0.0 : INFINITY;
    }
    gm__gp_slack_modes(st);
    st->lazy = st->lazy_ok;
    for (int o = 0; o < GP_NORDERS; o++)
        st->idle[o] = st->loose[o] = st->idle_tail[o] = st->loose_tail[o] = -1;
    uint64_t g = 0;
    int rc = gm__be_granularity(d, &g);
    if (rc == GM_OK && g && !(g & (g - 1))) {
        st->vmm = true;
        st->gran = g;
        st->gshift = (unsigned)__builtin_ctzll(g);
    } else if (rc == GM_OK || rc == GM_ENOTSUP) {
        st->vmm = false; /* plain device allocations */
        st->gran = 2 * GM__MIB;
        st->gshift = 21;
    } else {
        free(st);
        return rc;
    }
    if (st->vmm && d->cfg && d->cfg->gpumem_plan && (rc = gm__gp_plan_create(st)) != GM_OK) {
        free(st);
        return rc;
    }
    if (!st->plan) gm__gp_loosen(st), st->mode.autoslack = false; /* no VMM: no plan to warm up for */
    *state = st;
    return GM_OK;
}

static void gp_destroy(void *state) {
    gp_state *st = state;
    if (!st) return;
    gm__gp_plan_destroy(st);
    if (st->vmm) {
        gm__gp_release_all(st);
    } else {
        for (gp_block *b = st->plain; b; b = b->next) (void)gm__be_cleanup_free(st->d, b->h.ptr, b->h.size);
    }
    for (uint32_t i = 0; i < st->narenas; i++) gm__gp_arena_free(st, st->arenas[i]);
    free(st->arenas);
    free(st->chunks);
    for (size_t i = 0; i < st->nslabs; i++) free(st->slabs[i]);
    free(st->slabs);
    free(st);
}

static int place(gp_state *st, gp_arena *a, uint64_t units, gp_block **out) {
    return st->vmm ? gm__gp_va_place(st, a, units, out) : gm__gp_plain_malloc(st, a, units, out);
}

/* A block for `units` from arena a: the size-class cache, else a placement
 * (with the OOM retry). Inlined into both entry points below. */
static inline __attribute__((always_inline)) int take(gp_state *st, gp_arena *a, uint64_t units, int pool,
                                                      gp_block **out) {
    gp_block *b;
    if (units <= GP_SMALL_UNITS && (b = a->quick[units]) != NULL) {
        a->quick[units] = b->fnext;
        if (!b->fnext) a->qmap[(units - 1) >> 6] &= ~((uint64_t)1 << ((units - 1) & 63));
        b->fnext = NULL;
        a->ncached--;
        gm__gp_cached_dec(st, b);
        b->state = GP_USED;
    } else {
        int rc = place(st, a, units, &b);
        /* during a capture nothing is synchronised or given back */
        if (rc == GM_ENOMEM && !gm__device_capturing(st->d)) {
            st->d->stats.num_alloc_retries++;
            gm__gp_flush_quick(st);
            gm__gp_unpark_all(st);
            gm__device_process_events(st->d, true);
            gm__gp_flush_quick(st);
            for (uint32_t k = 0; k < st->narenas; k++) gm__gp_sync_arena(st, st->arenas[k]);
            if (st->vmm) gm__gp_release_unused(st);
            rc = place(st, a, units, &b);
            /* the failed placement mapped what it could on its way: give it
             * back, so an OOM leaves the device as free as it found it */
            if (rc == GM_ENOMEM && st->vmm) gm__gp_release_unused(st);
        }
        if (rc) return rc;
        b->h.pool = (uint8_t)pool;
    }
    *out = b;
    return GM_OK;
}

/* A freed block back to its arena: small ones into the size-class cache. */
static inline __attribute__((always_inline)) void give(gp_state *st, gp_block *b) {
    gp_arena *a = st->arenas[b->arena];
    uint64_t units = b->h.size >> GP_ALIGN_SHIFT;
    if (units <= GP_SMALL_UNITS) {
        b->state = GP_CACHED;
        b->fnext = a->quick[units];
        a->quick[units] = b;
        a->qmap[(units - 1) >> 6] |= (uint64_t)1 << ((units - 1) & 63);
        a->ncached++;
        a->dirty = true;
        gm__gp_cached_inc(st, b);
        return;
    }
    gm__gp_block_release(st, a, b);
}

/* The entry points with a plan (gpumem_plan:on) live apart from the warm
 * path: without a plan, gp_malloc and gp_free make no call that needs
 * registers saved, as before plans existed (bench_hotpath under callgrind). */
__attribute__((noinline, cold)) static int gp_malloc_planned(gp_state *st, gp_arena *a, uint64_t units, int pool,
                                                            gm_stream stream, gm__block_hdr **out) {
    gp_block *b;
    int rc = gm__gp_plan_malloc(st, units, pool, stream, &b);
    if (rc < 0) return rc;
    if (rc == 0) {
        if ((rc = take(st, a, units, pool, &b)) != GM_OK) return rc;
        gm__gp_plan_placed(st, b);
    }
    active_inc(st, b);
    *out = &b->h;
    return GM_OK;
}

__attribute__((noinline, cold)) static void gp_free_planned(gp_state *st, gp_block *b) {
    if (!gm__gp_plan_free(st, b)) give(st, b);
}

static int gp_malloc(void *state, uint64_t size, gm_stream stream, gm__block_hdr **out) {
    gp_state *st = state;
    if (size > UINT64_MAX - GP_ALIGN) return GM_ENOMEM;
    uint64_t units = (size + GP_ALIGN - 1) >> GP_ALIGN_SHIFT;
    if (units == 0) units = 1;
    int pool = units <= GP_SMALL_UNITS ? GM_POOL_SMALL : GM_POOL_LARGE;
    gp_arena *a;
    int rc = gm__gp_arena_of(st, stream, pool, &a);
    if (rc) return rc;
    if (__builtin_expect(st->plan != NULL, 0)) return gp_malloc_planned(st, a, units, pool, stream, out);
    gp_block *b;
    if ((rc = take(st, a, units, pool, &b)) != GM_OK) return rc;
    active_inc(st, b);
    *out = &b->h;
    return GM_OK;
}

static void gp_free(void *state, gm__block_hdr *hdr) {
    gp_state *st = state;
    gp_block *b = (gp_block *)hdr;
    active_dec(st, b);
    if (__builtin_expect(st->plan != NULL, 0)) {
        gp_free_planned(st, b);
        return;
    }
    give(st, b);
}

static int gp_empty_cache(void *state) {
    gp_state *st = state;
    gm__gp_flush_quick(st);
    if (!st->vmm) return GM_OK;
    gm__gp_unpark_all(st);
    return gm__gp_release_unused(st);
}

static void gp_step_mark(void *state) {
    gp_state *st = state;
    if (st->plan) gm__gp_plan_step(st);
}

const gm__policy_ops gm__policy_gpumem = {
    .name = "gpumem",
    .create = gp_create,
    .destroy = gp_destroy,
    .malloc = gp_malloc,
    .free = gp_free,
    .empty_cache = gp_empty_cache,
    .check = gm__gp_check,
    .walk_segments = gm__gp_walk,
    .owns = gm__gp_owns,
    .step_mark = gp_step_mark,
};
