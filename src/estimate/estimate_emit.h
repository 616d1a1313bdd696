/* estimate_emit.h — the estimator's emitter, shared by its units (internal
 * to src/estimate/):
 *   estimate_plan.c    the blocks and parameter tensors of each model
 *   estimate_blocks.c  what each block kind allocates in forward, and its
 *                      backward working set
 *   estimate_loop.c    the training loop (forward, backward, optimizer
 *                      step) and generate(): gm__est_build
 *   estimate.c         run defaults and checks, scan, replay, fit
 * This header holds the block and plan types, the emitter state (X) and the
 * allocation primitives (ALLOC, FREE, TMP, SAVE, ...), static inline.
 *
 * The estimator emits a training loop's allocations as an event sequence.
 * A model is a list of blocks (embeddings, each layer, the head with the
 * loss; for ResNet the stem, each residual block and the head). Each block
 * has its parameter tensors and a forward emitter that allocates what the
 * model's code allocates, in order: tensors that autograd saves for backward
 * go on a stack (SAVE), the rest are freed when the code drops them (TMP).
 * Backward walks the blocks in reverse: per block it allocates the incoming
 * gradients' working set, the parameter gradients (set_to_none: allocated on
 * the first micro-batch, accumulated through a temporary later), frees the
 * block's saved tensors and hands a gradient to the block below. With
 * checkpointing a layer's forward runs without saving (only its input is
 * kept) and runs again at the start of its backward.
 *
 * Sizes follow the code of transformers 5 / torchvision 0.26 / torch 2.11
 * under each precision: under autocast, matmul inputs and weights are cast
 * to 16 bits (the weight casts live until the layer's backward), LayerNorm
 * and softmax run in fp32, the residual stream stays fp32, the loss upcasts
 * the logits to fp32. Where a size is calibrated rather than derived, the
 * comment says so and bench/RESULTS.md has the measurement. */
#ifndef GPUMEM_ESTIMATE_EMIT_H
#define GPUMEM_ESTIMATE_EMIT_H

#include "estimate.h"

#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* cuBLAS workspace per handle and stream on Hopper (torch's default
 * CUBLAS_WORKSPACE_CONFIG on sm90: 32 MiB), one for the forward thread and
 * one for the autograd thread; allocated through the caching allocator and
 * kept (seen in the GPT-2 and ResNet-50 snapshots in ../shared/traces). */
#define CUBLAS_WORKSPACE ((uint64_t)32 << 20)

/* ---- blocks and parameters ---------------------------------------------- */

enum {
    K_GPT2_EMB, K_GPT2_LAYER, K_LLAMA_EMB, K_LLAMA_LAYER, K_BERT_EMB, K_BERT_LAYER, K_VITHF_EMB,
    K_VITHF_LAYER, K_VITTV_EMB, K_VITTV_LAYER, K_LM_HEAD, K_MLM_HEAD, K_SEQCLS_HEAD, K_VIT_HEAD,
    K_RN_STEM, K_RN_BLOCK, K_RN_HEAD,
};

typedef struct blk {
    int kind;
    bool layer;          /* checkpointable transformer layer */
    int32_t li;          /* index among the repeated layers, -1 for other blocks */
    size_t p0, np;       /* its parameter tensors */
    size_t mark;         /* saved-stack position at its forward start */
    int64_t c_in, width, c_out, stride, h_in; /* resnet block geometry */
    bool downsample;
} blk;

typedef struct ptensor {
    int64_t elems, rows, cols; /* rows x cols = the last two dims (0 for 1-D) */
    int32_t layer;             /* its block's li */
    int64_t dim0;              /* its first dimension (FSDP shards along it) */
} ptensor;

typedef struct plan {
    blk *b;
    size_t nb, capb;
    ptensor *p;
    size_t np, capp;
    size_t wte; /* index of the token embedding (tied LM heads) */
    int32_t cur_layer; /* li of the block being planned */
    int err;
} plan;

/* estimate_plan.c: the model's blocks and parameters, with `layers`
 * repeated layers (estimate.h: GM_EST_REPLAY_LAYERS); GM_ENOHOSTMEM (no
 * error detail set) when out of memory. Free with gm__est_plan_free even
 * on failure. */
int gm__est_make_plan(const gm_est_model *m, int64_t layers, plan *pl);
void gm__est_plan_free(plan *pl);

/* ---- the emitter ----------------------------------------------------------- */

typedef struct X {
    gm_est_program *p;
    const gm_est_model *m;
    const gm_est_run *r;
    plan pl;
    int a;   /* bytes of an activation element */
    int rb;  /* bytes of the residual stream (fp32 under autocast) */
    int pb;  /* bytes of a parameter */
    bool ac; /* autocast */
    int64_t B, T, N; /* micro-batch, tokens per sample, tokens per micro-batch */
    uint8_t phase, step;
    int32_t layer; /* tag of the events emitted now (gm_est_event.layer) */
    int64_t nlayers; /* repeated layers in this program */
    /* saved for backward */
    uint32_t *sv;
    size_t nsv, capsv;
    /* no-grad forward (checkpointing): the last few tensors stay live */
    bool nograd;
    uint32_t ngw[2];
    int nngw;
    bool recompute;
    /* held by the model output (keep_output): freed when the next forward
     * returns and `out` is rebound */
    uint32_t *held, *held_prev;
    int32_t *heldl, *heldl_prev; /* their layer tags */
    size_t nheld, nheld_prev, capheld, capheld_prev;
    uint32_t fwd_tmp[4]; /* per-forward temporaries (masks, inputs) */
    int nfwd_tmp;
    uint32_t input;     /* the micro-batch's input tensor */
    uint32_t cur_out;   /* output of the last block run */
    uint32_t dx;        /* gradient flowing into the block being differentiated */
    uint32_t *pid, *gid; /* parameter and gradient tensor ids per parameter */
    uint32_t ws_fwd, ws_bwd;
    uint32_t lsm, loss_extra; /* the loss's saved tensors */
    bool loss_upcast, loss_extra_ok;
    int64_t loss_rows, loss_classes;
    /* data parallelism (estimate_shard.c); groups are the repeated layers
     * (index li + 1) and the root (index 0: every other parameter) */
    int64_t W;
    uint32_t *uid;      /* per parameter: its unsharded copy (FSDP, ZeRO-3) */
    uint32_t *ugid;     /* per parameter: its unsharded gradient (FSDP) */
    uint32_t *keep;     /* per-rank buffers freed at the end (buckets, partitions) */
    int32_t *keepl;     /* their tags */
    size_t nkeep, capkeep;
    uint32_t *gflat;    /* per group: all-gather output held (FSDP) */
    uint32_t *sgrad;    /* per group: its sharded gradient (FSDP) */
    size_t ngroups;
    uint32_t ag_state;  /* FSDP forward: the last all-gather output, freed by the next */
    uint32_t rs_state;  /* FSDP backward: the last reduce-scatter input, freed by the next */
    uint32_t zpart;     /* ZeRO-2/3: the gradient partition; ZeRO: the ipg bucket */
    uint32_t zbucket;
    int err;
} X;

static inline uint32_t ev(X *x, uint64_t size, bool fr, uint32_t id, int cat) {
    if (x->err) return 0;
    gm_est_program *p = x->p;
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 4096;
        gm_est_event *n = realloc(p->ev, nc * sizeof *n);
        if (!n) {
            x->err = GM_ENOHOSTMEM;
            return 0;
        }
        p->ev = n;
        p->cap = nc;
    }
    if (!fr) id = ++p->ntensors;
    p->ev[p->n++] = (gm_est_event){fr ? 0 : size, id, x->layer, fr, (uint8_t)cat, x->phase, x->step};
    return id;
}

static inline uint32_t ALLOC(X *x, int64_t bytes, int cat) {
    if (bytes <= 0) return 0;
    return ev(x, (uint64_t)bytes, false, 0, cat);
}
static inline void FREE(X *x, uint32_t id) {
    if (id) ev(x, 0, true, id, 0);
}
static inline uint32_t TMP(X *x, int64_t bytes) { return ALLOC(x, bytes, GM_EST_CAT_TEMPS); }

static inline void push(X *x, uint32_t **arr, size_t *n, size_t *cap, uint32_t id) {
    if (!id || x->err) return;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        uint32_t *na = realloc(*arr, nc * sizeof *na);
        if (!na) {
            x->err = GM_ENOHOSTMEM;
            return;
        }
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = id;
}

/* A tensor autograd saves. Without grad (checkpointed forward) nothing is
 * saved: it lives until two more such tensors exist. */
static inline uint32_t SAVE(X *x, int64_t bytes) {
    if (x->nograd) {
        uint32_t id = TMP(x, bytes);
        if (x->nngw == 2) {
            FREE(x, x->ngw[0]);
            x->ngw[0] = x->ngw[1];
            x->nngw = 1;
        }
        x->ngw[x->nngw++] = id;
        return id;
    }
    uint32_t id = ALLOC(x, bytes, GM_EST_CAT_ACTS);
    push(x, &x->sv, &x->nsv, &x->capsv, id);
    return id;
}
/* A list whose entries are freed later under the tag they were allocated
 * with (held outputs, optimizer state, per-rank buffers). */
static inline void tpush(X *x, uint32_t **ids, int32_t **tags, size_t *n, size_t *cap, uint32_t id) {
    if (!id || x->err) return;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        uint32_t *ni = realloc(*ids, nc * sizeof *ni);
        if (ni) *ids = ni;
        int32_t *nl = ni ? realloc(*tags, nc * sizeof *nl) : NULL;
        if (nl) *tags = nl;
        if (!ni || !nl) {
            x->err = GM_ENOHOSTMEM;
            return;
        }
        *cap = nc;
    }
    (*tags)[*n] = x->layer;
    (*ids)[(*n)++] = id;
}
static inline void hold(X *x, uint32_t id) { tpush(x, &x->held, &x->heldl, &x->nheld, &x->capheld, id); }
/* Saved in the plain forward; held by the output instead when it is kept. */
static inline uint32_t HOLD_OR_SAVE(X *x, int64_t bytes) {
    if (!x->r->keep_output || x->nograd || x->recompute) return SAVE(x, bytes);
    uint32_t id = ALLOC(x, bytes, GM_EST_CAT_ACTS);
    hold(x, id);
    return id;
}
/* Under autocast a matmul's weight (and bias) is cast to 16 bits and the
 * copy is saved for backward. */
static inline void WCOPY(X *x, int64_t elems) {
    if (x->ac) SAVE(x, elems * 2);
}
/* Under autocast a matmul's fp32 input is cast (and the copy saved);
 * otherwise the input itself is saved (by reference: the caller keeps it). */
static inline void CAST_IN(X *x, int64_t elems) {
    if (x->ac) SAVE(x, elems * 2);
}
static inline void first_matmul(X *x) {
    if (!x->ws_fwd) x->ws_fwd = TMP(x, (int64_t)CUBLAS_WORKSPACE);
}

/* The block input handed from the block below: saved by this block's
 * first op (or, with checkpointing, by the checkpoint). */
static inline void take_input(X *x, bool saved) {
    uint32_t in = x->cur_out;
    if (!in) return;
    if (x->recompute) return; /* already on the stack from the first forward */
    if (saved || x->nograd) /* saved by its first op, or kept by the checkpoint */
        push(x, &x->sv, &x->nsv, &x->capsv, in);
}
/* A block input not saved by anything is freed once used. */
static inline void input_done(X *x, uint32_t in, bool saved) {
    if (saved || x->nograd || x->recompute || !in) return;
    FREE(x, in);
}
static inline uint32_t OUT(X *x, int64_t bytes) { return ALLOC(x, bytes, GM_EST_CAT_ACTS); }

/* estimate_shard.c: what data parallelism adds around the loop. Every
 * hook is a no-op for a single GPU. */
int gm__est_shard_init(X *x);                  /* arrays; GM_ENOHOSTMEM */
void gm__est_shard_free(X *x);                 /* frees what it kept, then its arrays */
int64_t gm__est_param_elems(const X *x, size_t i); /* elements of parameter i this rank holds */
void gm__est_shard_setup(X *x);                /* after the parameters: buckets, partitions */
void gm__est_shard_pre_fwd(X *x, blk *b);
void gm__est_shard_post_fwd(X *x, blk *b);
void gm__est_shard_fwd_end(X *x);
void gm__est_shard_pre_bwd(X *x, size_t bi);   /* block bi of x->pl.b, walking down */
bool gm__est_shard_grad(X *x, size_t i);       /* true: it placed parameter i's gradient */
void gm__est_shard_post_bwd(X *x, blk *b);
void gm__est_shard_bwd_end(X *x);
/* the optimizer step: true when the strategy ran it (ZeRO's partition) */
bool gm__est_shard_opt_step(X *x, bool first);
void gm__est_shard_zero_grad(X *x);            /* FSDP's sharded gradients */

/* estimate_blocks.c: a block's forward; its backward working set (allocated
 * before the saved tensors are freed); the gradient it hands the block below. */
void gm__est_block_fwd(X *x, blk *b);
int64_t gm__est_block_bwd_tmp(X *x, blk *b);
int64_t gm__est_dx_bytes(X *x, blk *b);

#endif
