/* remat.h — rematerialization: trading recomputation for memory. A step's
 * forward graph is cut into units (the model's top-level layers; a residual
 * block is one unit). A schedule is a list of actions over units: FWD(u)
 * runs unit u's forward (the first time it is the original forward pass;
 * later times, clones of its nodes that recompute its values from the
 * current version of its input), BACK(u) runs unit u's backward nodes,
 * reading the latest version of the values they need. Liveness in the plan
 * then frees what no later node reads, so a unit recomputed before its
 * backward holds nothing between the forward and the backward pass.
 *
 * Schedules: keep everything; segments (PyTorch's checkpoint and
 * checkpoint_sequential: keep each segment's input, recompute the segment
 * just before its backward); and binomial checkpointing (Griewank's revolve)
 * with s slots, which reaches the least number of recomputed unit forwards,
 * T(l, s) = min over 0<j<l of j + T(l-j, s-1) + T(j, s), T(1, s) = 0,
 * T(l, 1) = l(l-1)/2, which has Griewank and Walther's closed form (remat.c):
 * T(l, s) and each split cost O(r) arithmetic, r the repetition number, so a
 * schedule for thousands of units costs its own length and no table. */
#ifndef FR_REMAT_H
#define FR_REMAT_H

#include "graph/graph.h"

/* What a clone's attr.recompute says (0: not a clone): made by fr_remat_apply
 * for a unit forward the schedule runs again, or by fr_remat_cheap for one
 * cheap op's output. Both leave BatchNorm's running statistics alone. */
enum { FR_REMAT_UNIT = 1, FR_REMAT_CHEAP = 2 };

typedef struct fr_action {
    int back; /* 0: FWD(unit), 1: BACK(unit) */
    int unit;
} fr_action;

typedef struct fr_schedule {
    fr_action *a;
    int n, cap;
} fr_schedule;

void fr_schedule_release(fr_ctx *ctx, fr_schedule *s);

/* Actions for units [first, n): a prefix [0, first) without backward only
 * runs forward. seg_end[u] >= 0 marks u as recomputed: it belongs to the
 * segment [u', seg_end[u]] and the whole segment re-runs before BACK of its
 * last unit (NULL: keep everything). */
fr_status fr_schedule_segments(fr_ctx *ctx, int n, const int *seg_start, fr_schedule *out);
/* Binomial checkpointing of units [first, n) with `slots` stored states. */
fr_status fr_schedule_revolve(fr_ctx *ctx, int first, int n, int slots, fr_schedule *out);
/* T(l, s): the least number of recomputed unit forwards (slots >= 1; -1 for
 * l < 1 or s < 1). */
int64_t fr_revolve_cost(int l, int s);
/* The number of FWD actions beyond each unit's first: recomputed units. */
int fr_schedule_recomputed(const fr_schedule *s);

/* Apply a schedule to a differentiated graph: unit[i] gives the unit of
 * node i (forward and backward). Appends clone nodes to g and returns the
 * execution order (allocated, category other), origin (allocated, one entry
 * per value of g: the value a clone's output recomputes, every other value
 * itself) and the FLOPs of the clones. */
fr_status fr_remat_apply(fr_graph *g, const int *unit, int n_units, const fr_schedule *s,
                         int **order, int *n_order, int **origin, double *extra_flops);

/* Selective recomputation of cheap values (Megatron-LM's selective
 * activation recomputation, at the level of single ops): a value made before
 * the loss by an op that is cheap to run again (GELU, LayerNorm's output)
 * and read again only in backward, whose inputs are alive at that point
 * anyway (GELU's x and LayerNorm's x are read by their own backward, later),
 * is not kept: a clone of its op remakes it right before its first backward
 * reader, which reads the clone's output instead. The clone runs the same
 * kernel on the same inputs, so the bits are the same; a GPT block then holds
 * its MLP's GELU output and its LayerNorm outputs for no time at all, for
 * about 1% more compute. Updates order, origin (for the new values) and the
 * clones' FLOPs in *extra_flops; its clones carry attr.recompute =
 * FR_REMAT_CHEAP (fr_remat_apply's FR_REMAT_UNIT).
 * half: saved activations will be stored in 16 bits (mixed precision,
 * precision.h). LayerNorm's backward then reads a 16-bit copy of its x, so a
 * clone would hold the f32 x for itself alone (2 bytes a value more than
 * keeping the output in 16 bits): LayerNorm is not remade. GELU is, its x
 * read rounded by the forward and the clone alike (the mixed pass rounds
 * it, as the 16-bit output of a linear layer under autocast would be).
 * The Llama family's RMSNorm and SwiGLU are remade as LayerNorm is (their
 * inputs x, gate and up are read by their own backward; not under half). */
fr_status fr_remat_cheap(fr_graph *g, int **order, int *n_order, int **origin, double *extra_flops,
                         int half);

#endif
