/* estimate_shard.c — data-parallel training as one rank sees it: what
 * torch DDP, FSDP2's fully_shard and DeepSpeed's ZeRO stages allocate
 * around the single-GPU loop (estimate_loop.c calls these hooks; for one
 * GPU each is a no-op). Modelled from the code (docs/estimate.md says what
 * is and is not, and which were measured):
 *
 * DDP (torch/nn/parallel/distributed.py, reducer.cpp): full parameters,
 *   gradients and optimizer state; at construction the module states are
 *   broadcast through flat buffers of up to 250 MiB (_sync_module_states),
 *   then the reducer allocates its gradient buckets, bucket_cap_mb each (the
 *   first 1 MiB), kept for the whole run (gradient_as_bucket_view=False:
 *   the gradients themselves are separate tensors). Buckets here are cut
 *   per layer, in reverse order (torch packs across layer boundaries: the
 *   same bytes, a few more tensors).
 * FSDP2 (torch/distributed/fsdp/_fully_shard: fully_shard on every layer
 *   and on the root, no mixed-precision policy, parameters initialised on
 *   the meta device and materialised sharded): each parameter's dim-0
 *   shard, padded to a multiple of the world size. A group's unshard
 *   allocates the all-gather output (the group's padded size) and copies it
 *   out into one unsharded tensor per parameter; in forward the output is
 *   held until the next group's copy-out (implicit prefetch), in backward it
 *   is freed at once, and the group below is prefetched. The root stays
 *   unsharded from its forward to the end of backward. Post-backward frees
 *   the unsharded parameters (reshard), then reduce-scatters: the input
 *   (the group's padded size) is held until the next group's reduce, the
 *   output (its shard) becomes the sharded gradient or is added to it.
 * ZeRO (DeepSpeed stage_1_and_2.py, stage3.py; FusedAdam, no foreach
 *   temporaries): 16-bit (or fp32) parameters, flattened at construction
 *   (stage 1/2) or partitioned per parameter (stage 3, parameters of at most
 *   1e5 elements kept whole: stage3_param_persistence_threshold); an fp32
 *   master partition and the optimizer state on it; the reduce ("ipg")
 *   bucket, reduce_bucket_size = 5e8 elements of the 16-bit dtype,
 *   allocated by backward() (contiguous_gradients, the default) and kept;
 *   stage 1 keeps full gradients and reduces them at the step, stage 2 and
 *   3 copy each into the bucket as it is produced and keep only their
 *   partition; stage 3 gathers a block's parameters before its forward and
 *   backward and releases them after. Not measured (no DeepSpeed on the
 *   GPU machine). */
#include "estimate_emit.h"

#define ZERO_BUCKET_ELEMS ((int64_t)500000000)  /* reduce_bucket_size */
#define ZERO_PERSIST_ELEMS ((int64_t)100000)    /* stage3_param_persistence_threshold */
#define DDP_BROADCAST_BYTES ((int64_t)250 << 20) /* _sync_module_states' buffer */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static bool is(const X *x, gm_est_shard s) { return x->r->shard == s; }
static bool zero(const X *x) { return x->r->shard >= GM_EST_SHARD_ZERO1; }
static size_t group_of(const X *x, size_t i) { return (size_t)(x->pl.p[i].layer + 1); }

/* FSDP: a parameter's padded dim-0 shard (rank 0 holds a full chunk) */
static int64_t fsdp_shard(const X *x, size_t i) {
    const ptensor *p = &x->pl.p[i];
    int64_t d0 = p->dim0 > 0 ? p->dim0 : p->elems;
    return cdiv(d0, x->W) * (p->elems / d0);
}

static bool zero3_partitioned(const X *x, size_t i) { return x->pl.p[i].elems > ZERO_PERSIST_ELEMS; }

int64_t gm__est_param_elems(const X *x, size_t i) {
    if (is(x, GM_EST_SHARD_FSDP)) return fsdp_shard(x, i);
    if (is(x, GM_EST_SHARD_ZERO3) && zero3_partitioned(x, i)) return cdiv(x->pl.p[i].elems, x->W);
    return x->pl.p[i].elems;
}

/* kept to the end, freed under the tag it was allocated with */
static void keep(X *x, uint32_t id) { tpush(x, &x->keep, &x->keepl, &x->nkeep, &x->capkeep, id); }

static int64_t total_params(const X *x) {
    int64_t n = 0;
    for (size_t i = 0; i < x->pl.np; i++) n += x->pl.p[i].elems;
    return n;
}
/* ZeRO's flat partition: this rank's share of every parameter */
static int64_t zero_partition(const X *x) { return cdiv(total_params(x), x->W); }

int gm__est_shard_init(X *x) {
    x->W = x->r->world;
    if (x->r->shard == GM_EST_SHARD_NONE) return GM_OK;
    size_t np = x->pl.np ? x->pl.np : 1;
    x->ngroups = 1;
    for (size_t i = 0; i < x->pl.nb; i++)
        if (x->pl.b[i].li >= 0) x->ngroups = (size_t)x->pl.b[i].li + 2;
    x->uid = calloc(np, sizeof *x->uid);
    x->ugid = calloc(np, sizeof *x->ugid);
    x->gflat = calloc(x->ngroups, sizeof *x->gflat);
    x->sgrad = calloc(x->ngroups, sizeof *x->sgrad);
    return x->uid && x->ugid && x->gflat && x->sgrad ? GM_OK : GM_ENOHOSTMEM;
}

void gm__est_shard_free(X *x) {
    x->layer = -1;
    for (size_t i = 0; x->uid && i < x->pl.np; i++) FREE(x, x->uid[i]), FREE(x, x->ugid[i]);
    for (size_t g = 0; x->sgrad && g < x->ngroups; g++) FREE(x, x->sgrad[g]), FREE(x, x->gflat[g]);
    FREE(x, x->ag_state), FREE(x, x->rs_state), FREE(x, x->zpart), FREE(x, x->zbucket);
    for (size_t i = 0; i < x->nkeep; i++) {
        x->layer = x->keepl[i];
        FREE(x, x->keep[i]);
    }
    x->layer = -1;
    free(x->uid), free(x->ugid), free(x->gflat), free(x->sgrad), free(x->keep), free(x->keepl);
    x->keepl = NULL;
    x->uid = x->ugid = x->gflat = x->sgrad = x->keep = NULL;
}

/* DDP's buckets over one group's parameters, last registered first: a
 * bucket closes once it reaches its limit (torch's
 * compute_bucket_assignment_by_size) */
static void ddp_buckets(X *x, size_t g, int64_t *limit) {
    int64_t acc = 0;
    for (size_t i = x->pl.np; i-- > 0;) {
        if (group_of(x, i) != g) continue;
        acc += x->pl.p[i].elems * x->pb;
        if (acc >= *limit) {
            keep(x, ALLOC(x, acc, GM_EST_CAT_GRADS));
            acc = 0;
            *limit = x->r->bucket_mb << 20;
        }
    }
    if (acc) keep(x, ALLOC(x, acc, GM_EST_CAT_GRADS));
}

void gm__est_shard_setup(X *x) {
    if (is(x, GM_EST_SHARD_DDP)) {
        int64_t all = total_params(x) * x->pb;
        x->layer = -1;
        FREE(x, TMP(x, all < DDP_BROADCAST_BYTES ? all : DDP_BROADCAST_BYTES));
        int64_t limit = GM_EST_DDP_FIRST_BUCKET;
        ddp_buckets(x, 0, &limit); /* the root's parameters come last in the model */
        for (size_t g = x->ngroups; g-- > 1;) {
            x->layer = (int32_t)(g - 1);
            ddp_buckets(x, g, &limit);
        }
        x->layer = -1;
    } else if (zero(x)) {
        int64_t part = zero_partition(x);
        x->layer = -1;
        if (!is(x, GM_EST_SHARD_ZERO3)) { /* flatten: one buffer, the parameters become views */
            uint32_t flat = ALLOC(x, part * x->W * x->pb, GM_EST_CAT_PARAMS);
            for (size_t i = 0; i < x->pl.np; i++) {
                x->layer = x->pl.p[i].layer;
                FREE(x, x->pid[i]);
                x->pid[i] = 0;
            }
            x->layer = -1;
            keep(x, flat);
        }
        keep(x, ALLOC(x, part * 4, GM_EST_CAT_OPTSTATE)); /* fp32 master partition */
    }
}

/* FSDP: unshard a group: the all-gather output, then one tensor per
 * parameter (copy-out); returns the output, which the caller frees or holds */
static uint32_t fsdp_gather_out(X *x, size_t g) {
    int64_t n = 0;
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g) n += fsdp_shard(x, i);
    return ALLOC(x, n * x->W * x->pb, GM_EST_CAT_PARAMS);
}
static void fsdp_copy_out(X *x, size_t g) {
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g && !x->uid[i]) x->uid[i] = ALLOC(x, fsdp_shard(x, i) * x->W * x->pb, GM_EST_CAT_PARAMS);
}
static bool unsharded(const X *x, size_t g) {
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g) return x->uid[i] != 0;
    return true; /* no parameters: nothing to gather */
}
static void reshard(X *x, size_t g) {
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g) {
            FREE(x, x->uid[i]);
            x->uid[i] = 0;
        }
}

/* ZeRO-3: gather (or release) the partitioned parameters a block uses */
static void zero3_block(X *x, const blk *b, bool gather) {
    bool tied_head = (b->kind == K_LM_HEAD || b->kind == K_MLM_HEAD) && x->m->tied;
    for (size_t i = 0; i < x->pl.np; i++) {
        bool mine = (i >= b->p0 && i < b->p0 + b->np) || (tied_head && i == x->pl.wte);
        if (!mine || !zero3_partitioned(x, i)) continue;
        if (gather && !x->uid[i]) x->uid[i] = ALLOC(x, x->pl.p[i].elems * x->pb, GM_EST_CAT_PARAMS);
        if (!gather) {
            FREE(x, x->uid[i]);
            x->uid[i] = 0;
        }
    }
}

void gm__est_shard_pre_fwd(X *x, blk *b) {
    if (is(x, GM_EST_SHARD_ZERO3)) zero3_block(x, b, true);
    if (!is(x, GM_EST_SHARD_FSDP)) return;
    size_t g = (size_t)(b->li + 1);
    if (unsharded(x, g)) return;
    uint32_t out = fsdp_gather_out(x, g);
    FREE(x, x->ag_state); /* the previous group's output, after this copy-in */
    fsdp_copy_out(x, g);
    x->ag_state = out;
}

void gm__est_shard_post_fwd(X *x, blk *b) {
    if (is(x, GM_EST_SHARD_ZERO3)) zero3_block(x, b, false);
    if (is(x, GM_EST_SHARD_FSDP) && b->li >= 0 && x->r->reshard_after_forward) reshard(x, (size_t)(b->li + 1));
}

void gm__est_shard_fwd_end(X *x) {
    FREE(x, x->ag_state); /* the last state flushes the reference */
    x->ag_state = 0;
}

void gm__est_shard_pre_bwd(X *x, size_t bi) {
    blk *b = &x->pl.b[bi];
    if (zero(x) && !x->zbucket) { /* the ipg bucket, from the first backward on */
        int32_t l = x->layer;
        x->layer = -1;
        x->zbucket = ALLOC(x, ZERO_BUCKET_ELEMS * x->pb, GM_EST_CAT_GRADS);
        x->layer = l;
    }
    if (is(x, GM_EST_SHARD_ZERO3)) zero3_block(x, b, true);
    if (!is(x, GM_EST_SHARD_FSDP)) return;
    size_t g = (size_t)(b->li + 1);
    if (!unsharded(x, g)) {
        uint32_t out = x->gflat[g] ? x->gflat[g] : fsdp_gather_out(x, g);
        x->gflat[g] = 0;
        fsdp_copy_out(x, g);
        FREE(x, out);
    }
    if (bi == 0) return;
    const blk *below = &x->pl.b[bi - 1]; /* prefetch it in the reverse post-forward order */
    size_t gb = (size_t)(below->li + 1);
    if (below->li >= 0 && !unsharded(x, gb) && !x->gflat[gb]) x->gflat[gb] = fsdp_gather_out(x, gb);
}

bool gm__est_shard_grad(X *x, size_t i) {
    int64_t bytes = x->pl.p[i].elems * x->pb;
    if (is(x, GM_EST_SHARD_FSDP)) {
        if (!x->ugid[i]) x->ugid[i] = ALLOC(x, bytes, GM_EST_CAT_GRADS);
        else FREE(x, TMP(x, bytes)); /* a tied weight's second gradient, accumulated */
        return true;
    }
    if (is(x, GM_EST_SHARD_ZERO2) || is(x, GM_EST_SHARD_ZERO3)) {
        int32_t l = x->layer;
        x->layer = -1;
        if (!x->zpart) x->zpart = ALLOC(x, zero_partition(x) * x->pb, GM_EST_CAT_GRADS);
        x->layer = l;
        FREE(x, ALLOC(x, bytes, GM_EST_CAT_GRADS)); /* autograd's, copied into the bucket, dropped */
        return true;
    }
    return false;
}

/* FSDP post-backward of group g: reshard, then reduce-scatter */
static void fsdp_reduce(X *x, size_t g) {
    reshard(x, g);
    FREE(x, x->rs_state);
    int64_t n = 0;
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g) n += fsdp_shard(x, i);
    x->rs_state = ALLOC(x, n * x->W * x->pb, GM_EST_CAT_GRADS);
    for (size_t i = 0; i < x->pl.np; i++)
        if (group_of(x, i) == g) {
            FREE(x, x->ugid[i]);
            x->ugid[i] = 0;
        }
    uint32_t out = ALLOC(x, n * x->pb, GM_EST_CAT_GRADS);
    if (!x->sgrad[g]) x->sgrad[g] = out;
    else FREE(x, out); /* added to the sharded gradient */
}

void gm__est_shard_post_bwd(X *x, blk *b) {
    if (is(x, GM_EST_SHARD_ZERO3)) zero3_block(x, b, false);
    if (is(x, GM_EST_SHARD_FSDP) && b->li >= 0) fsdp_reduce(x, (size_t)(b->li + 1));
}

void gm__est_shard_bwd_end(X *x) {
    if (!is(x, GM_EST_SHARD_FSDP)) return;
    x->layer = -1;
    fsdp_reduce(x, 0); /* the root's post-backward, from the final callback */
    FREE(x, x->rs_state);
    x->rs_state = 0;
}

void gm__est_shard_zero_grad(X *x) {
    for (size_t g = 0; x->sgrad && g < x->ngroups; g++) {
        x->layer = (int32_t)g - 1;
        FREE(x, x->sgrad[g]);
        x->sgrad[g] = 0;
    }
    x->layer = -1;
}

bool gm__est_shard_opt_step(X *x, bool first) {
    if (!zero(x)) return false;
    int64_t part = zero_partition(x);
    x->layer = -1;
    if (first) {
        int states = x->r->optimizer == GM_EST_OPT_SGD ? 0 : x->r->optimizer == GM_EST_OPT_SGD_MOMENTUM ? 1 : 2;
        for (int k = 0; k < states; k++) keep(x, ALLOC(x, part * 4, GM_EST_CAT_OPTSTATE));
    }
    FREE(x, TMP(x, part * 4)); /* the partition's gradient in fp32 for the step */
    /* zero_grad */
    for (size_t i = 0; i < x->pl.np; i++) {
        x->layer = x->pl.p[i].layer;
        FREE(x, x->gid[i]);
        x->gid[i] = 0;
    }
    x->layer = -1;
    FREE(x, x->zpart);
    x->zpart = 0;
    return true;
}
