/* pshard.h — ZeRO stage 3: the trainable weights live as this rank's shard
 * of the flat vector (parallel/shard.h's rule, the gradients' layout of parallel/
 * buckets.h), and a step sees a weight only while its unit's weights are
 * gathered. A gather group is the trainable weights of one checkpointing
 * unit (a weighted layer or residual block and what follows it); its
 * weights are consecutive parameters, so the group is one range of the flat
 * vector and one MPI_Iallgatherv.
 *
 * A step's schedule (fr_gathers) is made from its own plan: each group is
 * used in forward (positions up to the loss) and, in a training step, in
 * backward (recomputed forwards included); each such run of uses is an
 * interval, gathered just before its first use into a block of category
 * params and freed right after its last (a backward interval that would be
 * gathered while the same group's forward block is still held keeps that
 * block instead: one interval). Intervals are taken in order of
 * first use; when one is waited for, the next one's gather starts
 * (prefetch), so at most the current and the next are in flight. The same
 * walk, on sizes only, gives the bytes gathered at the step's worst
 * position: the run and the prediction (report/estimate.c) share it.
 *
 * Outside a step the whole weights exist nowhere: a checkpoint gathers each
 * tensor on rank 0, initialisation and loading make one tensor at a time
 * and keep this rank's slice of it. */
#ifndef FR_PSHARD_H
#define FR_PSHARD_H

#include <stdint.h>
#include "parallel/comm.h"

#define FR_PSHARD_NONE ((size_t)-1)

typedef struct fr_pshard {
    fr_comm *comm;
    int n_params;
    size_t *flat;         /* per param: its first flat element; FR_PSHARD_NONE: whole everywhere */
    size_t *numel;        /* per param: elements */
    int *group;           /* per param: its gather group, -1 */
    int n_groups;         /* groups are numbered 0.. in order of their ranges */
    size_t *g_at, *g_len; /* per group: its range of the flat vector */
    size_t total, lo, hi; /* the flat vector and this rank's elements [lo, hi) */
    float *data;          /* those elements (category params, tag "weight shard") */
    int slot0;            /* comm request slots slot0 .. slot0 + 2 * n_groups - 1 */
} fr_pshard;

/* The layout of n params: flat[i] (FR_PSHARD_NONE: not sharded), numel[i],
 * unit[i] (the checkpointing unit of its layer); rank `rank` of `ranks`.
 * Refused (FR_ERR_ARG) when a unit's weights are not one range. The shard
 * block is allocated zeroed (ranks 0: the layout alone, no block). */
fr_status fr_pshard_init(fr_ctx *ctx, fr_comm *c, int n, const size_t *flat, const size_t *numel,
                         const int *unit, size_t total, int rank, int ranks, int slot0,
                         fr_pshard *s);
void fr_pshard_release(fr_ctx *ctx, fr_pshard *s);
/* 1 when param i lives sharded. */
int fr_pshard_holds(const fr_pshard *s, int i);
/* Param i's elements [*a, *b) owned here and where they sit in the shard
 * (NULL when none). */
float *fr_pshard_slice(const fr_pshard *s, int i, size_t *a, size_t *b);
/* Keep this rank's slice of the whole tensor `whole` of param i. */
void fr_pshard_keep(fr_pshard *s, int i, const float *whole);
/* Param i whole into full[0..numel) on rank 0 (every rank calls it). */
fr_status fr_pshard_gather_root(fr_ctx *ctx, fr_pshard *s, int i, float *full);

/* A step's gathers. uses: per plan position k, the groups its node reads,
 * grp[use_off[k] .. use_off[k+1]); positions <= split are forward. */
typedef struct fr_gathers {
    int n;                           /* intervals, in order of first use */
    int *grp, *phase, *first, *last; /* per interval */
    int *alloc_at;                   /* per interval: the position whose pre-node gathers it */
    float **buf;                     /* per interval: its block while gathered */
    uint8_t *started, *ready;        /* per interval, this run */
    int next;                        /* the next interval to wait for */
    size_t peak, peak_reserved;      /* bytes gathered at the worst position (allocated, as
                                          the allocator rounds the blocks) */
    int64_t gathers;                 /* intervals gathered over the run */
} fr_gathers;

fr_status fr_gathers_plan(fr_ctx *ctx, const fr_pshard *s, int n_pos, const int *use_off,
                          const int *grp, int split, fr_gathers *g);
/* The same walk from group sizes alone (bytes per group), for a prediction
 * without ranks: the peak bytes, allocated and rounded. */
void fr_gathers_peak(const fr_gathers *g, const size_t *group_bytes, size_t *peak,
                     size_t *peak_reserved);
void fr_gathers_release(fr_ctx *ctx, fr_gathers *g);

/* bind(arg, group, block): the group's weights are at block (NULL: gone). */
typedef void (*fr_gathers_bind)(void *arg, int group, float *block);
void fr_gathers_begin(fr_gathers *g);
/* Before the node at pos: wait for the intervals it starts (gathering them
 * first if not yet started), bind them and start the next one's gather. */
fr_status fr_gathers_pre(fr_ctx *ctx, fr_pshard *s, fr_gathers *g, int pos, fr_gathers_bind bind,
                         void *arg);
/* After it: free the intervals whose last use it was. */
void fr_gathers_post(fr_ctx *ctx, fr_gathers *g, int pos, fr_gathers_bind bind, void *arg);
/* After a run: free what is left (waiting for its gather first when ok;
 * after a failure a gather still in flight keeps its block). */
fr_status fr_gathers_end(fr_ctx *ctx, fr_pshard *s, fr_gathers *g, int ok, fr_gathers_bind bind,
                         void *arg);

#endif
