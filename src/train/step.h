/* step.h — a compiled training (or eval) step: the model's graph, its
 * backward, the memory plan and the executor, plus the optimizer update.
 * This is what fr_step in the public API is. */
#ifndef FR_STEP_H
#define FR_STEP_H

#include "backend/cpu/kernels.h"
#include "exec/exec.h"
#include "model/model.h"
#include "train/scaler.h"

struct fr_step {
    fr_ctx *ctx;
    fr_model *m;
    fr_step_opts o;
    fr_graph g;
    fr_plan plan;
    fr_exec ex;
    int *pv;       /* per model param: its graph value */
    int *gv;       /* per model param: its gradient value, -1 if none */
    int64_t t;     /* optimizer steps taken (Adam's t) */
    uint64_t runs; /* micro-batches run (dropout stream) */
    int micro, accumulate;  /* micro-batch size and how many make a batch */
    int *unit;              /* per node: its unit (top-level layer) */
    int first_unit;         /* the first unit with backward work */
    int recomputed_units;   /* unit forwards run again by the schedule */
    double flops, extra_flops;
    size_t meta_bytes;      /* graph and plan metadata (category other) */
    fr_scaler scaler;       /* dynamic loss scaling (enabled or not) */
    int inject_inf;         /* testing: poison a gradient in the next step */
    uint8_t *fused;         /* per model param: updated inside backward, no gradient kept
                               (1: by LINEAR_BWD, plain SGD; 2: by an OPTIM_STEP node) */
    int n_fused;            /* how many params are */
    size_t upd_ws_len;      /* floats of scratch for their gradient tiles (category grads) */
    float *upd_ws;
    int loss_pos;           /* plan position of the loss node (forward ends there) */
    fr_optim_slot *slots;   /* per model param: its state, for OPTIM_STEP nodes */
    fr_optim_ctx optim_ctx;
};

/* Build without allocating gradients, optimizer state or the arena. */
fr_step *fr_step_build(fr_model *m, const fr_step_opts *opts);
fr_status fr_step_materialize(fr_step *s);
/* The planner: the least extra compute whose reserved bytes fit opts->budget. */
fr_step *fr_step_plan_budget(fr_model *m, const fr_step_opts *opts);
/* Whether some plan with the whole batch fits opts->budget. */
int fr_plan_fits(fr_model *m, const fr_step_opts *opts);
/* Give the arena back (e.g. while an eval step runs) and take it again. */
fr_status fr_step_arena_release(fr_step *s);
fr_status fr_step_arena_acquire(fr_step *s);
int fr_step_optim_states(const fr_optim_opts *o);
/* Bytes of param i's gradient buffer: 0 if frozen or updated inside backward. */
size_t fr_step_grad_bytes(const fr_step *s, size_t i);
/* Bytes of one optimizer-state buffer of p (its format in *kind). */
size_t fr_step_state_bytes(const fr_step *s, const fr_param *p, int *kind);

/* Predicted persistent bytes by category (params, grads, optimizer state,
 * one data batch); step values come from the plan. */
void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]);
fr_status fr_step_save_meta(fr_step *s, const char *path, const fr_st_meta *meta, int n_meta);
fr_status fr_step_load_meta(fr_step *s, const char *path, fr_st_meta *meta, int *n_meta);

#endif
