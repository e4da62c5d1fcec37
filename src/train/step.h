/* step.h — a compiled training (or eval) step: the model's graph, its
 * backward, the memory plan and the executor, plus the optimizer update.
 * This is what fr_step in the public API is. Its calls live in train/
 * (step.c, account.c, place.c, zero.c) and in run/ (planner.c: the
 * budget's choice and fr_step_prepare; checkpoint.c: save and load). */
#ifndef FR_STEP_H
#define FR_STEP_H

#include "exec/exec.h"
#include "model/model.h"
#include "optim/optim.h"
#include "optim/scaler.h"

/* The step's schedule: micro-batches, the units of checkpointing and what
 * recomputing costs, the loss's position, the runs so far. */
typedef struct fr_step_sched {
    int micro, accumulate; /* micro-batch size and how many make a batch */
    int *unit;             /* per node: its unit (top-level layer) */
    int first_unit;        /* the first unit with backward work */
    int recomputed_units;  /* unit forwards run again by the schedule */
    double flops, extra_flops;
    int loss_pos;  /* plan position of the loss node (forward ends there) */
    uint64_t runs; /* micro-batches run (dropout stream) */
} fr_step_sched;

/* The optimizer's side of the step: its step count, the loss scaler, and
 * the steps taken inside backward (plan/fuse.h). */
typedef struct fr_step_opt {
    int64_t t;         /* optimizer steps taken (Adam's t) */
    fr_scaler scaler;  /* dynamic loss scaling (enabled or not) */
    int inject_inf;    /* testing: poison a gradient in the next step */
    uint8_t *fused;    /* per model param: updated inside backward, no gradient kept
                         (1: by LINEAR_BWD, plain SGD; 2: by an OPTIM_STEP node) */
    int n_fused;       /* how many params are */
    size_t upd_ws_len; /* floats of scratch for their gradient tiles (category grads) */
    float *upd_ws;
} fr_step_opt;

/* Where the step's own buffers live (train/place.c). */
typedef struct fr_step_place {
    size_t gemm_ws;      /* floats of GEMM scratch: CLBlast's temporary buffers on a device,
                       oneDNN's scratchpad for 16-bit GEMMs on the CPU (category workspace) */
    void *scratch;       /* its buffer in the backend's memory (a device's: gemm_ws + upd_ws_len) */
    void *dev_x, *dev_y; /* on a device: a micro-batch's inputs and labels */
    struct fr_feed *feed;   /* or two whole-batch slots uploaded ahead (train/feed.c) */
    int n_offloaded;        /* --offload activations: saved values moved to the host */
    size_t offloaded_bytes; /* and their bytes (plan/offload.c) */
    int n_blocked;          /* activations stored nChw16c (plan/layout.c) */
    int n_folded;           /* ReLU backward passes folded into max pooling's (plan/fold.h) */
    int n_folded_bn;        /* ReLUs folded into the BatchNorm before them (plan/fold.h) */
} fr_step_place;

/* Data parallelism over ranks (train/zero.c). */
typedef struct fr_step_dp {
    struct fr_comm *comm;       /* parallel/comm.h; NULL: one process */
    struct fr_buckets *buckets; /* the gradients' buckets, summed over the ranks */
    int global_n;               /* samples of the global batch this rank's slice is of (0: b->n) */
    int global_batch;           /* the global --batch (0: one process) */
    uint64_t rank_seed;         /* added to the seed of the dropout streams: differs per rank */
    void **whole_state;         /* zero >= 1, saving on rank 0: the shards set aside */
    struct fr_pshard *pshard;   /* zero 3: the weights' shards this step made (m->shard) */
    struct fr_gathers *gathers; /* a model with sharded weights: this step's gathers */
    int active;                 /* this micro-batch sends its buckets (post-node hook) */
    uint8_t *stepped;           /* per param: stepped in backward this step (fr_step_shard_steps) */
} fr_step_dp;

struct fr_step {
    fr_ctx *ctx;
    fr_model *m;
    fr_step_opts o;
    fr_graph g;
    fr_plan plan;
    fr_exec ex;
    int *pv;              /* per model param: its graph value */
    int *gv;              /* per model param: its gradient value, -1 if none */
    size_t meta_bytes;    /* graph and plan metadata (category other) */
    size_t meta_reserved; /* the same as the allocator reserves it (headers, rounding) */
    fr_step_sched sched;
    fr_step_opt opt;
    fr_step_place place;
    fr_step_dp dp;
};

/* Build without allocating parameters, gradients, optimizer state or the
 * arena: shapes and dtypes only. fr_step_materialize allocates them (and
 * initialises the model if nothing did). */
fr_step *fr_step_build(fr_model *m, const fr_step_opts *opts);
fr_status fr_step_materialize(fr_step *s);
/* The planner: the least extra compute whose reserved bytes fit opts->budget. */
fr_step *fr_step_plan_budget(fr_model *m, const fr_step_opts *opts);
/* What the smallest candidate needs when nothing fits: its reserved bytes
 * (fr_step_reserved; 0: no candidate could be built) and its options. */
typedef struct fr_plan_need {
    size_t reserved;
    fr_ckpt_mode mode;
    int arg, micro;
    fr_precision prec;
    fr_offload offload;
    int head_rows;          /* the fused head's rows a chunk (fr_step_opts.head_rows) */
    fr_base_precision base; /* the frozen base's format (fr_step_opts.base_precision) */
} fr_plan_need;
/* The planner's choice built but not materialized (nothing of the model
 * allocated); NULL with *need set when nothing fits (no message: the caller
 * words it), NULL with need->reserved 0 on another failure (message set). */
fr_step *fr_step_plan_choose(fr_model *m, const fr_step_opts *opts, fr_plan_need *need);
/* The step-budget refusal: "no plan fits the budget of ...: the smallest needs ..." */
fr_status fr_plan_refuse(fr_ctx *ctx, const fr_step_opts *opts, const fr_plan_need *need);
/* "checkpoint revolve 2, micro-batch 1, precision fp32" */
int fr_plan_need_str(const fr_plan_need *n, char *buf, size_t len);
/* What fr_step_compile runs, built but not materialized: planned within
 * opts->budget (or checkpoint auto) by the planner, else built as given. */
fr_step *fr_step_prepare(fr_model *m, const fr_step_opts *opts);
/* Whether some plan with the whole batch fits opts->budget. */
int fr_plan_fits(fr_model *m, const fr_step_opts *opts);
/* Give the arena back (e.g. while an eval step runs) and take it again. */
fr_status fr_step_arena_release(fr_step *s);
fr_status fr_step_arena_acquire(fr_step *s);
/* Bytes of one optimizer-state buffer of param i on this rank: at ZeRO >= 1
 * its owned elements' (its format in *kind). */
size_t fr_step_state_here(const fr_step *s, size_t i, int *kind);
/* Bytes of param i's gradient buffer: 0 if frozen or updated inside backward. */
size_t fr_step_grad_bytes(const fr_step *s, size_t i);
/* The optimizer's flat blocks as this step makes them (optim/optim.h's
 * layout, padding included): the gradient block (0 at ZeRO 2 and 3, whose
 * gradients are views of the transient buckets) and one state block. */
size_t fr_step_grads_block(const fr_step *s);
size_t fr_step_state_block(const fr_step *s);
/* The device step's scratch for a whole-tensor rule (Adafactor's sums):
 * the largest fr_optim_scratch_bytes of a parameter with a gradient; 0 on
 * the host or with the optimizer offloaded. */
size_t fr_step_state_scratch(const fr_step *s);
/* The optimizer's state blocks made (or kept) and the records pointed
 * into them: at materialize, and after a checkpoint's whole-state swap. */
fr_status fr_step_alloc_state(fr_step *s);

/* What the materialized step reserves, as the allocator rounds each block:
 * parameters, gradients, optimizer state, update tiles, the arena, the
 * executor's tables and the step's metadata, plus one batch of data (held
 * by the caller, e.g. the loader). fr_plan_info.reserved is this. */
size_t fr_step_reserved(const fr_step *s);
/* Its device part: what it reserves in a device's memory (its classes'
 * rounding); SIZE_MAX when its arena exceeds the device's largest buffer. */
size_t fr_dev_step_reserved(const fr_step *s);
/* The error of a non-finite loss at micro-batch run `step` (1-based). */
fr_status fr_step_nonfinite(fr_step *s, float l, uint64_t step);
fr_status fr_step_report(fr_step *s, const fr_batch *b, double total, int hits, float *loss,
                         int *correct, float *l);
/* After backward: scaler, clipping, optimizer, zero_grad (optim/), where
 * the optimizer lives (the host's when offloaded; a ZeRO rank's shard). */
fr_status fr_step_update(fr_step *s, float loss);
/* Whether the step's context runs on a device (its tensors outside host
 * memory). */
/* Set the loss gradient's scale (the share of this micro-batch in the batch). */
void fr_step_set_loss_scale(fr_step *s, float scale);
/* Predicted persistent bytes by category (params, grads, optimizer state,
 * one data batch); step values come from the plan. */
void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]);
/* Data parallelism (before fr_step_materialize): gradients summed over the
 * ranks of c in buckets (parallel/buckets.h; caps s->o.bucket_first_cap and
 * bucket_cap in bytes, 0: DDP's 1 and 25 MiB) started as backward makes
 * them (or all after it: s->o.no_overlap), at ZeRO stage s->o.zero. Needs
 * f32 gradients and no step inside backward (the trainer keeps every
 * gradient: the step needs the sums). */
fr_status fr_step_distribute(fr_step *s, struct fr_comm *c);
/* ZeRO stages 1, 2 and 3 (zero >= 1, parallel/shard.h's rule over the flat vector
 * of the buckets): this rank owns the elements [*a, *b) of param i (all of
 * a trainable one without sharding); 0 when it owns none. Its optimizer
 * state holds those elements only. */
int fr_step_owned(const fr_step *s, size_t i, size_t *a, size_t *b);
/* For a checkpoint at ZeRO >= 1 (every rank calls it): on 1, the optimizer
 * state of every parameter is gathered whole on rank 0 (blocks of category
 * workspace) and set in place of its shards; on 0, the shards come back. */
fr_status fr_step_state_whole(fr_step *s, int on);
/* For a checkpoint at ZeRO 3 (every rank calls it): on 1, every sharded
 * weight is gathered whole on rank 0 (blocks of category workspace) into
 * its data; on 0, those blocks are freed. */
fr_status fr_step_params_whole(fr_step *s, int on);
/* ZeRO 3: the bytes of weights gathered at the step's worst position
 * (allocated; as the allocator rounds the blocks), 0 without; for a step
 * of one process, what ZeRO 3 would gather (the same walk on its plan). */
void fr_step_gathered_peak(const fr_step *s, size_t *peak, size_t *reserved);
/* ZeRO 2 and 3 (zero >= 2): the bytes of gradient buckets held at the
 * step's worst position (parallel/buckets.h's rule; a step of one process:
 * DDP's caps on its plan); 0 below stage 2. */
void fr_step_bucket_peak(const fr_step *s, int zero, size_t *peak, size_t *reserved);
/* 1 when this rank's step at ZeRO stage `zero` steps each bucket's owned
 * share as its sum arrives (the step inside backward of a rank, no gradient
 * shard): stage 2 or 3, opts.rank_step_in_backward, no scaler, clipping or
 * micro-batches, and (stage 2) no node reading a weight after its bucket's
 * freeing position. For a step of one process, what its rank would do. */
int fr_step_shard_steps(const fr_step *s, int zero);
fr_status fr_step_save_meta(fr_step *s, const char *path, const fr_st_meta *meta, int n_meta);
fr_status fr_step_load_meta(fr_step *s, const char *path, fr_st_meta *meta, int *n_meta);

/* One rank's bytes at ZeRO stage `zero` (0-3) on `ranks` ranks, from a
 * rank's step s (its batch the rank's slice, every gradient kept): ZeRO's
 * formulas over s's parameter, gradient and optimizer bytes, the bucket
 * buffers, and the rest of s's predicted peak (train/zero.c). */
typedef struct fr_rank_bytes {
    size_t params, grads, optim, buckets, rest, total;
    size_t saving; /* what stage `zero` saves against keeping everything (stage 0) */
} fr_rank_bytes;
void fr_step_rank_bytes(const fr_step *s, int ranks, int zero, fr_rank_bytes *out);

#endif
