/* step.h — a compiled training (or eval) step: the model's graph, its
 * backward, the memory plan and the executor, plus the optimizer update.
 * This is what fr_step in the public API is. */
#ifndef FR_STEP_H
#define FR_STEP_H

#include "exec/exec.h"
#include "model/model.h"

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
    uint64_t runs; /* steps run (dropout stream) */
};

/* Predicted persistent bytes by category (params, grads, optimizer state,
 * one data batch); step values come from the plan. */
void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]);
fr_status fr_step_save_meta(fr_step *s, const char *path, const fr_st_meta *meta, int n_meta);
fr_status fr_step_load_meta(fr_step *s, const char *path, fr_st_meta *meta, int *n_meta);

#endif
