/* step.c — building, materializing and running one step, one run for
 * every backend: model -> graph -> autodiff -> rematerialization schedule
 * -> graph passes (precision, half gradients, activation offload, the
 * optimizer step inside backward) -> plan -> exec, then the update through
 * optim/ (the scaler, clipping, PyTorch's rules) on the backend where the
 * optimizer lives. A step may split its batch into micro-batches whose
 * gradients accumulate (the loss of each scaled by its share of the batch),
 * and may recompute activations instead of keeping them; with a budget the
 * planner (run/planner.c) picks both. Where tensors live is place.c's, the
 * ranks' buckets and shards zero.c's, the predicted bytes account.c's. */
#include <math.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "core/half.h"
#include "parallel/buckets.h"
#include "train/buffers.h"
#include "parallel/pshard.h"
#include "parallel/shard.h"
#include "backend/state.h"
#include "plan/fold.h"
#include "plan/fuse.h"
#include "plan/insert.h"
#include "plan/layout.h"
#include "plan/narrow.h"
#include "plan/offload.h"
#include "plan/precision.h"
#include "plan/remat.h"
#include "optim/optim.h"
#include "train/step.h"
#include "train/place.h"
#include "train/feed.h"
#include "train/zero.h"

size_t fr_step_grad_bytes(const fr_step *s, size_t i) {
    if (s->gv[i] < 0 || (s->opt.fused && s->opt.fused[i])) return 0;
    return (size_t)fr_shape_numel(&s->m->params[i].shape) *
           fr_dtype_size(s->g.vals[s->gv[i]].dtype);
}

/* Whether the optimizer lives on the host while the step runs on a device
 * (--offload optimizer: ZeRO-Offload). */
static int offloaded(const fr_step *s) {
    return (s->o.offload & FR_OFFLOAD_OPTIMIZER) && fr_place_second_memory(s->ctx);
}

/* Param i's gradient kept in the optimizer's gradient block (fr_optim_size_fn). */
static size_t grad_size(const void *arg, size_t i, fr_dtype *dt) {
    const fr_step *s = arg;
    size_t bytes = fr_step_grad_bytes(s, i);
    if (bytes) *dt = s->g.vals[s->gv[i]].dtype;
    return bytes;
}

size_t fr_step_grads_block(const fr_step *s) {
    if (s->dp.buckets && s->o.zero >= 2) return 0; /* views of the transient buckets */
    return fr_optim_grads_bytes(s->m, grad_size, s);
}

/* The gradients backward writes: one block in the step's backend (under
 * data parallelism at ZeRO 0 and 1, the buckets are views of it; at 2 and
 * 3 the gradients are views of the buckets, taken as backward reaches
 * them: fr_zero_take_buckets). */
static fr_status alloc_grads(fr_step *s) {
    fr_model *m = s->m;
    const fr_backend *be = fr_backend_of(s->ctx);
    int host = !fr_place_second_memory(s->ctx);
    if (s->opt.upd_ws_len && !s->opt.upd_ws && host) { /* a device's is in its scratch */
        s->opt.upd_ws = fr_alloc(s->ctx, s->opt.upd_ws_len * sizeof(float), FR_MEM_GRADS);
        if (!s->opt.upd_ws) return FR_ERR_NOMEM;
    }
    fr_buckets *b = s->dp.buckets;
    if (b && s->o.zero >= 2) return fr_buckets_alloc(s->ctx, b, NULL);
    fr_status st = fr_optim_alloc_grads(s->ctx, be, host, m, grad_size, s, b != NULL);
    if (st || !b) return st;
    return fr_buckets_alloc(s->ctx, b, (float *)m->optim->grads.buf);
}

/* Bytes of one optimizer-state buffer of param i on this rank: at ZeRO >= 1
 * its owned elements' (the kind is the whole tensor's: f32 or bf16, whose
 * elements are encoded one by one). */
size_t fr_step_state_here(const fr_step *s, size_t i, int *kind) {
    size_t bytes = fr_optim_state_bytes(&s->o.optim, s->o.optim_state, &s->m->params[i], kind), a,
           b;
    if (s->o.zero >= 1 && s->dp.buckets)
        bytes = fr_step_owned(s, i, &a, &b) ? fr_state_bytes((fr_state_kind)*kind, b - a) : 0;
    return bytes;
}

/* Param i's state on this rank (fr_optim_state_fn): none without a gradient. */
static size_t state_size(const void *arg, size_t i, int *kind) {
    const fr_step *s = arg;
    return s->gv[i] < 0 ? 0 : fr_step_state_here(s, i, kind);
}

size_t fr_step_state_block(const fr_step *s) {
    return fr_optim_states(&s->o.optim) ? fr_optim_state_block_bytes(s->m, state_size, s) : 0;
}

size_t fr_step_state_scratch(const fr_step *s) {
    size_t most = 0;
    if (!s->o.training || offloaded(s) || !fr_place_second_memory(s->ctx)) return 0;
    for (size_t i = 0; i < s->m->n_params; i++) {
        size_t b = s->gv[i] < 0 ? 0 : fr_optim_scratch_bytes(&s->o.optim, &s->m->params[i].shape);
        most = b > most ? b : most;
    }
    return most;
}

/* The optimizer's state, one block a buffer, in the optimizer's backend:
 * the step's, or the host's when offloaded (zeros; a device's takes a
 * resumed run's host state, fr_model_to_host's, loaded from a checkpoint). */
fr_status fr_step_alloc_state(fr_step *s) {
    int off = offloaded(s), host = off || !fr_place_second_memory(s->ctx);
    const fr_backend *be = off ? &fr_cpu_backend : fr_backend_of(s->ctx);
    fr_status st =
        fr_optim_alloc_state(s->ctx, be, host, s->m, fr_optim_states(&s->o.optim), state_size, s);
    return st ? st : fr_optim_alloc_scratch(s->ctx, be, s->m, fr_step_state_scratch(s));
}

/* The step's GEMM scratch: the most any of its nodes asks (the backend's
 * ws_elems, j = -1), planned with the arena's values. */
static void plan_gemm_scratch(fr_step *s) {
    const fr_graph *g = &s->g;
    const fr_backend *be = fr_backend_of(s->ctx);
    int64_t most = 0;
    for (int k = 0; k < s->plan.n_nodes; k++) {
        int64_t f = be->ws_elems(g, &g->nodes[s->plan.order[k]], -1);
        if (f > most) most = f;
    }
    s->place.gemm_ws = (size_t)most;
}

void fr_step_free(fr_step *s) {
    if (!s) return;
    fr_ctx *ctx = s->ctx;
    if (s->dp.buckets) { /* the gradients were views: the model must not free them */
        for (size_t i = 0; s->m->optim && i < s->m->n_params; i++)
            if (fr_optp(s->m, i)->grad_view)
                fr_optp(s->m, i)->grad = NULL, fr_optp(s->m, i)->grad_view = 0;
        /* the buckets were views of the gradient block: it goes with them */
        if (s->o.zero < 2) fr_optim_zero_grad(s->m, 1);
        fr_buckets_release(ctx, s->dp.buckets);
        fr_free(ctx, s->dp.buckets);
    }
    if (s->dp.gathers) {
        fr_gathers_release(ctx, s->dp.gathers);
        fr_free(ctx, s->dp.gathers);
    }
    if (s->dp.pshard) { /* the weights' shards go with the step that made them */
        if (s->m->shard == s->dp.pshard) s->m->shard = NULL;
        fr_pshard_release(ctx, s->dp.pshard);
        fr_free(ctx, s->dp.pshard);
    }
    fr_place_free(s);
    fr_exec_release(&s->ex);
    fr_plan_release(&s->plan);
    fr_graph_release(&s->g);
    fr_free(ctx, s->pv);
    fr_free(ctx, s->gv);
    fr_free(ctx, s->sched.unit);
    fr_free(ctx, s->opt.fused);
    fr_free(ctx, s->opt.upd_ws);
    fr_free(ctx, s->dp.stepped);
    fr_free(ctx, s);
}

/* Unit of every node: its layer's top-level position; the loss belongs to
 * the last unit; gradient sums and copies (no forward node) to the unit of
 * the backward node before them. */
static fr_status assign_units(fr_step *s) {
    fr_graph *g = &s->g;
    s->sched.unit = fr_alloc(s->ctx, (g->n_nodes + 1) * sizeof *s->sched.unit, FR_MEM_OTHER);
    if (!s->sched.unit) return FR_ERR_NOMEM;
    int last = s->m->n_units - 1;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const fr_node *n = &g->nodes[i];
        int layer = n->fwd >= 0 ? g->nodes[n->fwd].layer : n->layer;
        if (n->fwd < 0 && (int)i >= g->n_forward && i > 0) s->sched.unit[i] = s->sched.unit[i - 1];
        else s->sched.unit[i] = layer >= 0 ? s->m->layers[layer].unit : last;
    }
    /* The chain starts at the first unit that has backward work. */
    s->sched.first_unit = s->m->n_units;
    for (size_t i = (size_t)g->n_forward; i < g->n_nodes; i++)
        if (s->sched.unit[i] < s->sched.first_unit) s->sched.first_unit = s->sched.unit[i];
    if (s->sched.first_unit >= s->m->n_units) s->sched.first_unit = s->m->n_units - 1;
    return FR_OK;
}

/* Segment starts for the segment modes; NULL-equivalent (all -1) keeps all. */
static void segments_for(const fr_step *s, fr_ckpt_mode mode, int arg, int *seg) {
    int n = s->m->n_units, f = s->sched.first_unit, L = n - f;
    for (int u = 0; u < n; u++) seg[u] = -1;
    int size = 0;
    switch (mode) {
    case FR_CKPT_MARKS:
        for (size_t i = 0; i < s->m->n_layers; i++)
            if (s->m->layers[i].checkpoint) seg[s->m->layers[i].unit] = s->m->layers[i].unit;
        return;
    case FR_CKPT_ALL: size = 1; break;
    case FR_CKPT_SQRT: size = (int)ceil(sqrt((double)L)); break;
    case FR_CKPT_EVERY: size = arg; break;
    case FR_CKPT_SEGMENTS: size = arg > 0 ? L / arg : L; break;
    default: return;
    }
    if (size < 1) size = 1;
    /* Every segment but the last is recomputed: the last one's backward runs
     * right after the forward, so recomputing it would save nothing. */
    int segs = mode == FR_CKPT_SEGMENTS ? arg : (L + size - 1) / size;
    for (int k = 0; k + 1 < segs; k++)
        for (int u = f + k * size; u < f + (k + 1) * size && u < n; u++) seg[u] = f + k * size;
}

/* Whether the optimizer may step inside backward (plan/fuse.h), where
 * nothing can tell the difference: training, no --keep-grads, no loss
 * scaler (it must see every gradient before any update), no clipping (it
 * needs the global norm), one micro-batch (accumulation needs the buffer),
 * and the optimizer where backward runs (on a device with the optimizer
 * offloaded, the step runs on the host). */
static int steps_in_backward(const fr_step *s) {
    return s->o.training && !s->o.keep_grads && !offloaded(s) && !s->opt.scaler.enabled &&
           !(s->o.clip_grad_norm > 0) && s->sched.accumulate == 1;
}

/* The scratch of LINEAR_BWD's fused update of an out x in weight, as the
 * backend sizes it (fr_backend.upd_tile). */
static size_t upd_tile(int64_t out, int64_t in, int64_t rows, void *arg) {
    const fr_step *s = arg;
    return fr_backend_of(s->ctx)->upd_tile(s->ctx, out, in, rows);
}

/* The loss's plan position; with plain SGD, the step inside LINEAR_BWD
 * (plan/fuse.h), whose weights' tiles take upd_ws_len floats. */
static fr_status plan_fused_updates(fr_step *s) {
    const fr_plan *pl = &s->plan;
    s->sched.loss_pos = fr_order_last_writer(&s->g, pl->order, pl->n_nodes, s->g.loss);
    if (!steps_in_backward(s) || !fr_optim_in_gemm(&s->o.optim) || s->sched.loss_pos < 0)
        return FR_OK;
    s->opt.fused = fr_calloc(s->ctx, s->m->n_params + 1, FR_MEM_OTHER);
    if (!s->opt.fused) return FR_ERR_NOMEM;
    s->opt.n_fused +=
        fr_fuse_linear_updates(&s->g, pl->order, pl->n_nodes, s->sched.loss_pos, s->m->n_params,
                               s->pv, s->gv, upd_tile, s, s->opt.fused, &s->opt.upd_ws_len);
    return FR_OK;
}

/* With every other rule, OPTIM_STEP nodes in backward (plan/fuse.h), which
 * the executor hands to the optimizer (bind: step_in_backward). */
static fr_status fuse_optim_steps(fr_step *s, int **order, int *n_order) {
    if (!steps_in_backward(s) || fr_optim_in_gemm(&s->o.optim)) return FR_OK;
    int loss_pos = fr_order_last_writer(&s->g, *order, *n_order, s->g.loss);
    if (loss_pos < 0) return FR_OK;
    size_t np = s->m->n_params;
    if (!(s->opt.fused = fr_calloc(s->ctx, np + 1, FR_MEM_OTHER))) return FR_ERR_NOMEM;
    return fr_fuse_optim_steps(&s->g, order, n_order, loss_pos, np, s->pv, s->gv, s->opt.fused,
                               &s->opt.n_fused);
}

/* Build graph, backward, schedule and plan for the given options; no
 * parameters, arena, gradients or optimizer state yet (the planner compares
 * candidates). */
fr_step *fr_step_build(fr_model *m, const fr_step_opts *opts) {
    fr_ctx *ctx = m->ctx;
    if (opts->batch <= 0) {
        fr_fail(ctx, FR_ERR_ARG, "batch size must be positive, got %d", opts->batch);
        return NULL;
    }
    int micro = opts->micro_batch > 0 ? opts->micro_batch : opts->batch;
    if (micro > opts->batch || opts->batch % micro != 0) {
        fr_fail(ctx, FR_ERR_ARG,
                "micro-batch %d does not divide the batch %d: choose a divisor (e.g. %d) or "
                "change --batch",
                micro, opts->batch, opts->batch % 2 == 0 ? opts->batch / 2 : 1);
        return NULL;
    }
    if (m->n_units == 0) {
        fr_fail(ctx, FR_ERR_ARG, "the model has no layers");
        return NULL;
    }
    /* Building works on shapes and dtypes only: the parameters are allocated
     * and initialised by fr_step_materialize, so planning and estimating
     * never take the model's bytes. */
    if ((unsigned)opts->optim_state > FR_OPTIM_STATE_INT8 ||
        (opts->loss_scaling != FR_LOSS_SCALE_AUTO && opts->loss_scaling != FR_LOSS_SCALE_DYNAMIC &&
         opts->loss_scaling != FR_LOSS_SCALE_NONE)) {
        fr_fail(ctx, FR_ERR_ARG,
                "optim_state %d or loss_scaling %d is not a value of its enum (fr_optim_state, "
                "fr_loss_scaling)",
                (int)opts->optim_state, (int)opts->loss_scaling);
        return NULL;
    }
    if (opts->training &&
        fr_optim_check(ctx, &opts->optim, opts->optim_state, opts->precision, opts->zero))
        return NULL;
    /* --base-precision: frozen linear weights stored in fewer bits, their
     * layers run QLINEAR (on a model not yet allocated only the dtype and
     * shape change); first, so that model.half() below leaves them be */
    if (opts->base_precision && fr_model_quantize_base(m, opts->base_precision)) return NULL;
    if (opts->precision == FR_PREC_FP16 || opts->precision == FR_PREC_BF16) {
        /* model.half(): weights and biases stored in 16 bits from here on
         * (BatchNorm's running statistics stay f32: they are updated in place
         * by an f32 kernel, as cuDNN keeps them in f32 for half inputs); on
         * a model not yet allocated only the dtype changes. */
        if (fr_model_to_dtype(m, opts->precision == FR_PREC_FP16 ? FR_F16 : FR_BF16)) return NULL;
    }
    fr_mem_stats before;
    fr_mem_get_stats(ctx, &before);
    fr_step *s = fr_calloc(ctx, sizeof *s, FR_MEM_OTHER);
    if (!s) return NULL;
    s->ctx = ctx;
    s->m = m;
    s->o = *opts;
    s->sched.micro = micro;
    s->sched.accumulate = opts->batch / micro;
    fr_graph_init(&s->g, ctx);
    fr_status st = FR_ERR_NOMEM;
    int *grad_of = NULL, *seg = NULL, *order = NULL, *origin = NULL, n_order = 0;
    uint8_t *keep = NULL;
    fr_schedule sched = {0};
    s->pv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->pv, FR_MEM_OTHER);
    s->gv = fr_alloc(ctx, (m->n_params + 1) * sizeof *s->gv, FR_MEM_OTHER);
    if (!s->pv || !s->gv) goto fail;
    if ((st = fr_model_build_graph(m, &s->g, micro, opts->training, opts->head_rows, s->pv)))
        goto fail;
    for (size_t i = 0; i < m->n_params; i++) s->gv[i] = -1;
    int any_trainable = 0;
    if (opts->training) {
        st = FR_ERR_NOMEM;
        if (!(grad_of = fr_alloc(ctx, s->g.n_vals * sizeof *grad_of, FR_MEM_OTHER))) goto fail;
        for (size_t v = 0; v < s->g.n_vals; v++) grad_of[v] = -1;
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *p = &m->params[i];
            if (!fr_param_learns(p)) continue;
            int gvv = fr_graph_value(&s->g, FR_VAL_GRAD, FR_F32, p->shape);
            if (gvv < 0) goto fail;
            s->g.vals[gvv].param = (int)i;
            s->gv[i] = gvv;
            grad_of[s->pv[i]] = gvv;
            any_trainable = 1;
        }
        if (!any_trainable) {
            st = fr_fail(ctx, FR_ERR_ARG, "every layer is frozen: nothing to train");
            goto fail;
        }
        if ((st = fr_autodiff(&s->g, grad_of))) goto fail;
    } else {
        s->g.n_forward = (int)s->g.n_nodes;
    }
    if ((st = assign_units(s))) goto fail;
    st = FR_ERR_NOMEM;
    if (!(seg = fr_alloc(ctx, ((size_t)m->n_units + 1) * sizeof *seg, FR_MEM_OTHER))) goto fail;
    if (!opts->training) {
        st = fr_schedule_segments(ctx, m->n_units, NULL, &sched);
    } else if (opts->checkpoint == FR_CKPT_REVOLVE) {
        st = fr_schedule_revolve(ctx, s->sched.first_unit, m->n_units, opts->ckpt_arg, &sched);
    } else {
        if ((opts->checkpoint == FR_CKPT_EVERY || opts->checkpoint == FR_CKPT_SEGMENTS) &&
            opts->ckpt_arg < 1) {
            st = fr_fail(ctx, FR_ERR_ARG, "checkpoint every:N and --segments N need N >= 1");
            goto fail;
        }
        segments_for(s, opts->checkpoint, opts->ckpt_arg, seg);
        st = fr_schedule_segments(ctx, m->n_units, seg, &sched);
    }
    if (st) goto fail;
    s->sched.recomputed_units = fr_schedule_recomputed(&sched);
    int n_nodes0 = (int)s->g.n_nodes;
    if ((st = fr_remat_apply(&s->g, s->sched.unit, m->n_units, &sched, &order, &n_order, &origin,
                             &s->sched.extra_flops)))
        goto fail;
    fr_precision prec = opts->precision;
    int store16 = opts->training && prec != FR_PREC_FP32 && prec != FR_PREC_AUTO;
    if (opts->training &&
        (st = fr_remat_cheap(&s->g, &order, &n_order, &origin, &s->sched.extra_flops, store16)))
        goto fail;
    if (opts->training && (st = fr_fold_relu_into_pool(&s->g, order, &n_order, &s->place.n_folded)))
        goto fail;
    if (opts->training &&
        (st = fr_fold_relu_into_bn(&s->g, order, &n_order, &s->place.n_folded_bn)))
        goto fail;
    int half_weights = 0;
    for (size_t i = 0; i < m->n_params; i++)
        half_weights |= m->params[i].dtype == FR_F16 || m->params[i].dtype == FR_BF16;
    if (store16 || half_weights) {
        fr_dtype half = !store16                                               ? FR_F32
                        : (prec == FR_PREC_FP16 || prec == FR_PREC_FP16_MIXED) ? FR_F16
                                                                               : FR_BF16;
        if ((st = fr_precision_apply(&s->g, half, n_nodes0, origin, &order, &n_order))) goto fail;
    }
    if (opts->training && half_weights &&
        (st = fr_narrow_half_grads(&s->g, &order, &n_order, m->n_params, s->pv, s->gv)))
        goto fail;
    if (opts->training && (opts->offload & FR_OFFLOAD_ACTIVATIONS) &&
        (st = fr_offload_saved(&s->g, &order, &n_order, FR_OFFLOAD_MIN_BYTES, &s->place.n_offloaded,
                               &s->place.offloaded_bytes)))
        goto fail;
    s->opt.scaler = fr_scaler_default();
    s->opt.scaler.enabled = opts->loss_scaling == FR_LOSS_SCALE_DYNAMIC ||
                            (opts->loss_scaling == FR_LOSS_SCALE_AUTO &&
                             (prec == FR_PREC_FP16 || prec == FR_PREC_FP16_MIXED));
    if ((st = fuse_optim_steps(s, &order, &n_order))) goto fail;
    if ((st = fr_layout_apply(&s->g, order, n_order, &s->place.n_blocked))) goto fail;
    st = FR_ERR_NOMEM;
    if (!(keep = fr_calloc(ctx, s->g.n_vals + 1, FR_MEM_OTHER))) goto fail;
    keep[s->g.loss] = 1;
    if (s->g.logits >= 0) keep[s->g.logits] = 1; /* a head fused with its loss makes none */
    if (s->g.hits >= 0) keep[s->g.hits] = 1;     /* and counts the hits itself */
    if ((st = fr_plan_build(&s->g, keep, order, n_order, &s->plan))) goto fail;
    if ((st = plan_fused_updates(s))) goto fail;
    plan_gemm_scratch(s);
    for (int i = 0; i < n_order; i++) {
        const fr_node *n = &s->g.nodes[order[i]];
        s->sched.flops += fr_op_get(n->op)->flops(&s->g, n);
    }
    s->sched.flops *= s->sched.accumulate;
    s->sched.extra_flops *= s->sched.accumulate;
    fr_free(ctx, grad_of);
    fr_free(ctx, seg);
    fr_free(ctx, order);
    fr_free(ctx, origin);
    fr_free(ctx, keep);
    fr_schedule_release(ctx, &sched);
    fr_mem_stats after;
    fr_mem_get_stats(ctx, &after);
    s->meta_bytes = after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
    /* the blocks still held (freed temporaries are back in the system or cached) */
    s->meta_reserved = (after.reserved - after.cached) - (before.reserved - before.cached);
    return s;
fail:
    fr_free(ctx, grad_of);
    fr_free(ctx, seg);
    fr_free(ctx, order);
    fr_free(ctx, origin);
    fr_free(ctx, keep);
    fr_schedule_release(ctx, &sched);
    fr_step_free(s);
    return NULL;
}

fr_status fr_step_materialize(fr_step *s) {
    fr_status st;
    if (!s->m->initialised) {
        if ((st = fr_model_init(s->m, s->o.seed))) return st;
        /* what initialising freed (a quantized base's f32 values) is not the
         * step's to hold: cached, it stayed reserved beside the arena */
        fr_mem_empty_cache(s->ctx);
    }
    if (s->o.training && (st = alloc_grads(s))) return st;
    if (s->o.training && offloaded(s) && (st = fr_optim_alloc_host_grads(s->ctx, s->m))) return st;
    if (s->o.training && (st = fr_step_alloc_state(s))) return st;
    if ((st = fr_place_materialize(s)) || (st = fr_place_scratch_take(s, 1))) return st;
    if (s->m->shard && !s->dp.gathers) { /* ZeRO 3: this step's gathers, its metadata */
        fr_mem_stats before, after;
        fr_mem_get_stats(s->ctx, &before);
        if (!(s->dp.gathers = fr_calloc(s->ctx, sizeof *s->dp.gathers, FR_MEM_OTHER)))
            return FR_ERR_NOMEM;
        if ((st = fr_zero_plan_gathers(s, s->m->shard, s->dp.gathers))) {
            fr_free(s->ctx, s->dp.gathers);
            s->dp.gathers = NULL;
            return st;
        }
        fr_mem_get_stats(s->ctx, &after);
        s->meta_bytes += after.allocated[FR_MEM_OTHER] - before.allocated[FR_MEM_OTHER];
        s->meta_reserved += (after.reserved - after.cached) - (before.reserved - before.cached);
    }
    return fr_exec_init(&s->ex, &s->g, &s->plan);
}

fr_status fr_step_arena_release(fr_step *s) {
    fr_exec_release(&s->ex);
    return fr_place_scratch_take(s, 0); /* the GEMM scratch goes with it */
}

fr_status fr_step_arena_acquire(fr_step *s) {
    if (s->ex.ctx) return FR_OK;
    fr_status st = fr_place_scratch_take(s, 1);
    return st ? st : fr_exec_init(&s->ex, &s->g, &s->plan);
}

void fr_step_scaler(const fr_step *s, float *scale, uint64_t *skipped) {
    if (scale) *scale = s->opt.scaler.enabled ? s->opt.scaler.scale : 1.0f;
    if (skipped) *skipped = s->opt.scaler.skipped;
}

/* Rows of outputs (labels) a sample has: 1, or its positions (a token
 * model); from the labels, as the logits may never be made (a fused head). */
static int64_t rows_per_sample(const fr_step *s) {
    const fr_shape *y = &s->g.vals[s->g.label].shape;
    return y->d[0] ? fr_shape_numel(y) / y->d[0] : 0;
}

void fr_step_set_loss_scale(fr_step *s, float scale) {
    fr_graph *g = &s->g;
    for (size_t i = 0; i < g->n_nodes; i++) {
        if (fr_op_get(g->nodes[i].op)->loss_bwd) g->nodes[i].attr.scale = scale;
    }
}

/* The batch's mean loss from its micro-batches' sums, into *loss, *correct
 * and *l; a non-finite one is an error unless the scaler will skip it. */
fr_status fr_step_nonfinite(fr_step *s, float l, uint64_t step) {
    return fr_fail(s->ctx, FR_ERR_NUMERIC,
                   "non-finite loss (%g) at step %llu: lower the learning rate or check the data; "
                   "the weights were not updated",
                   (double)l, (unsigned long long)step);
}

fr_status fr_step_report(fr_step *s, const fr_batch *b, double total, int hits, float *loss,
                         int *correct, float *l) {
    *l = (float)(total / b->n);
    if (correct) *correct = hits;
    if (loss) *loss = *l;
    if (!isfinite(*l) && !(s->o.training && s->opt.scaler.enabled))
        return fr_step_nonfinite(s, *l, s->sched.runs);
    return FR_OK;
}

/* An OPTIM_STEP node (exec.h's param_step): the optimizer steps its
 * parameter at t + 1, the step this backward's gradients are for, as the
 * step after backward steps the others. */
static fr_status step_in_backward(void *arg, const fr_node *n, const fr_tensor *grad) {
    fr_step *s = arg;
    return fr_optim_step_param(s->ctx, fr_backend_of(s->ctx), &s->o.optim, s->m,
                               (size_t)n->attr.param, grad, s->opt.t + 1);
}

/* The step's parameters and gradients bound where its backend reads them
 * (a parameter's buffer: its device copy, else its host data), and the
 * optimizer's steps inside backward: OPTIM_STEP's, and LINEAR_BWD's plain
 * SGD with this run's rate and weight decay in its node. */
static fr_status bind(fr_step *s) {
    fr_model *m = s->m;
    fr_exec *e = &s->ex;
    fr_status st = s->o.training ? alloc_grads(s) : FR_OK; /* zero_grad may have freed them */
    if (st) return st;
    e->param_step = step_in_backward;
    e->param_arg = s;
    for (size_t i = 0; i < m->n_params; i++) {
        fr_param *p = &m->params[i];
        void *w = p->ddata ? p->ddata : p->data; /* the block's copy at off, or the host's */
        size_t w_off = p->ddata ? p->off : 0;
        fr_exec_bind_dev(e, s->pv[i], w, w_off);
        if (s->gv[i] < 0 || (s->opt.fused && s->opt.fused[i] == 2)) continue; /* an arena value */
        int f = s->opt.fused && s->opt.fused[i]; /* 1: LINEAR_BWD steps the weight itself */
        const fr_optim_param *q = fr_optp(m, i);
        fr_exec_bind_dev(e, s->gv[i], f ? w : q->grad, f ? w_off : q->grad_off);
        e->written[s->gv[i]] = (uint8_t)(!f && fr_optp(m, i)->grad_valid);
    }
    for (size_t k = 0; s->opt.fused && k < s->g.n_nodes; k++) {
        fr_node *n = &s->g.nodes[k];
        if (n->op != FR_OP_LINEAR_BWD || !n->update) continue;
        n->attr.lr = (float)s->o.optim.lr;
        n->attr.wd = (float)s->o.optim.weight_decay;
    }
    fr_place_scratch(s);
    return FR_OK;
}

fr_status fr_step_run(fr_step *s, const fr_batch *b, float *loss, int *correct) {
    fr_model *m = s->m;
    fr_graph *g = &s->g;
    fr_exec *e = &s->ex;
    if (!e->ctx) return fr_fail(s->ctx, FR_ERR_ARG, "the step's arena is released");
    if (b->n <= 0 || b->n > s->o.batch)
        return fr_fail(s->ctx, FR_ERR_ARG, "batch of %d samples for a step compiled for %d", b->n,
                       s->o.batch);
    int ce = m->loss == FR_LOSS_CROSS_ENTROPY, tokens = m->in_dtype == FR_I32;
    const void *labels = ce ? (const void *)b->y : (const void *)b->target;
    const void *inputs = tokens ? (const void *)b->idx : (const void *)b->x;
    if ((!inputs || !labels) &&
        !(s->place.feed && fr_feed_holds(s->place.feed, b))) /* else on the device */
        return fr_fail(s->ctx, FR_ERR_ARG, "batch without %s",
                       inputs   ? "labels"
                       : tokens ? "token ids (idx)"
                                : "inputs");
    /* Labels (and token ids) are checked once for the whole batch, by their
     * position in it, before any micro-batch runs (a dataset's are checked
     * against the model, by index in their file, before training; a fed
     * batch's, on the device only, were checked so). */
    int64_t rows = ce && b->y ? b->n * rows_per_sample(s) : 0;
    for (int64_t i = 0, classes = fr_model_num_classes(m); i < rows; i++)
        if (b->y[i] < 0 || b->y[i] >= classes)
            return fr_fail(s->ctx, FR_ERR_ARG,
                           "label %d at position %lld of the batch is outside [0, %lld)",
                           (int)b->y[i], (long long)i, (long long)classes);
    fr_status st = bind(s);
    int slot = -1;
    if (!st && s->place.feed) st = fr_feed_acquire(s, b, &slot);
    if (st) return st;
    double total = 0;
    int hits = 0;
    /* Data parallel: b is this rank's slice of a global batch of global_n
     * samples; each micro-batch's loss is seeded with its share of the
     * global batch, so the sum over the ranks of the gradients is the one
     * process's gradient of the whole batch. */
    int ranks = s->o.training && s->dp.buckets ? fr_comm_size(s->dp.comm) : 1;
    int global = ranks > 1 && s->dp.global_n > 0 ? s->dp.global_n : b->n;
    uint64_t seed = s->o.seed + s->dp.rank_seed; /* dropout: a stream per rank */
    for (int off = 0; off < b->n && !st; off += s->sched.micro) {
        int n = b->n - off < s->sched.micro ? b->n - off : s->sched.micro, h = 0;
        if ((st = fr_place_batch(s, b, slot, off, n))) break;
        float share = (float)n / (float)global, lm = 0;
        fr_step_set_loss_scale(s, s->opt.scaler.enabled ? share * s->opt.scaler.scale : share);
        /* the buckets are sent during the last micro-batch's backward only:
         * before it, the gradients are partial sums of this rank */
        int last = off + s->sched.micro >= b->n;
        s->dp.active = ranks > 1 && last;
        if (s->dp.buckets && s->o.training && (off == 0 || s->dp.active)) /* a step's first or */
            fr_buckets_begin(s->dp.buckets); /* sending micro-batch: none started nor freed yet */
        if (s->dp.gathers) fr_gathers_begin(s->dp.gathers);
        int lazy = s->dp.buckets && s->o.zero >= 2; /* buckets taken before their first writer */
        e->post_node = s->dp.active || s->dp.gathers ? fr_zero_after_node : NULL;
        e->pre_node = s->dp.gathers || lazy ? fr_zero_before_node : NULL;
        e->post_arg = s;
        int split =
            s->opt.n_fused ? s->sched.loss_pos + 1 : s->plan.n_nodes; /* updates in backward: */
        st = fr_exec_run(e, 0, split, n, seed, s->sched.runs);        /* check the loss first */
        if (!st) st = fr_exec_read(e, g->loss, 0, &lm, sizeof lm);
        if (!st && split < s->plan.n_nodes && !isfinite(lm)) { /* (never sharded: no gathers) */
            st = fr_step_hits_of(s, n, &h);
            fr_exec_finish(e);
            s->sched.runs++;
            if (loss) *loss = lm;
            if (correct) *correct = hits + h;
            if (!st) st = fr_step_nonfinite(s, lm, s->sched.runs);
            break;
        }
        if (!st) st = fr_exec_run(e, split, s->plan.n_nodes, n, seed, s->sched.runs);
        e->post_node = NULL, e->pre_node = NULL;
        if (s->dp.gathers) {
            fr_status gs =
                fr_gathers_end(s->ctx, s->m->shard, s->dp.gathers, !st, fr_zero_bind_group, s);
            if (!st) st = gs;
        }
        if (!st && ranks > 1 && last) st = fr_buckets_finish(s->ctx, s->dp.comm, s->dp.buckets);
        s->sched.runs++;
        if (!st) st = fr_exec_read(e, g->loss, 0, &lm, sizeof lm);
        if (!st) st = fr_step_hits_of(s, n, &h);
        total += (double)lm * n;
        hits += h;
        fr_exec_finish(e);
    }
    if (slot >= 0) { /* its last read of the slot is enqueued */
        fr_status rs = fr_feed_release(s, slot);
        if (!st) st = rs;
    }
    if (st || (ranks > 1 && (st = fr_buffers_bcast(s->ctx, s->dp.comm, m)))) return st;
    fr_batch gb = *b; /* the global batch: its loss and hits summed over the ranks */
    if (ranks > 1) {
        double sums[2] = {total, (double)hits};
        if ((st = fr_comm_sum_f64(s->ctx, s->dp.comm, sums, 2, "the loss and hits of a step")))
            return st;
        total = sums[0], hits = (int)sums[1], gb.n = global;
    }
    float l;
    if ((st = fr_step_report(s, &gb, total, hits, loss, correct, &l)) || !s->o.training) return st;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].role == FR_P_NUM_BATCHES)
            (*(int64_t *)m->params[i].data) += s->sched.accumulate;
    return fr_step_update(s, l);
}

/* After backward: the scaler's check, clipping, the optimizer step and
 * zero_grad (optim/), where the optimizer lives: the step's backend, or
 * the host with the gradients brought down and the weights sent back
 * (--offload optimizer); a ZeRO rank's over its shard (zero.c). */
fr_status fr_step_update(fr_step *s, float l) {
    fr_model *m = s->m;
    const fr_backend *be = fr_backend_of(s->ctx);
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params; i++)
        if (s->gv[i] >= 0 && !(s->opt.fused && s->opt.fused[i]))
            fr_optp(m, i)->grad_valid = s->ex.written[s->gv[i]];
    if (s->o.zero >= 1 && s->dp.buckets) return fr_zero_update(s, l);
    if (s->opt.inject_inf) { /* testing: an overflow in backward, in the first gradient */
        for (size_t i = 0; i < m->n_params; i++)
            if (fr_optp(m, i)->grad && fr_optp(m, i)->grad_valid) {
                const fr_optim_param *q = fr_optp(m, i);
                float inf = INFINITY;
                uint16_t h = q->grad_dt == FR_F16 ? fr_f32_to_f16(inf) : fr_f32_to_bf16(inf);
                const void *x = q->grad_dt == FR_F32 ? (const void *)&inf : (const void *)&h;
                if ((st = be->write(s->ctx, q->grad, q->grad_off, x, fr_dtype_size(q->grad_dt))))
                    return st;
                break;
            }
        s->opt.inject_inf = 0;
    }
    int off = offloaded(s); /* zero_grad may have freed the host copies */
    if (off && ((st = fr_optim_alloc_host_grads(s->ctx, m)) || (st = fr_place_grads_down(s))))
        return st;
    st = fr_optim_after_backward(s->ctx, off ? &fr_cpu_backend : be, m, &s->o.optim, s->gv,
                                 s->opt.fused, &s->opt.scaler, s->o.clip_grad_norm, l, &s->opt.t,
                                 off);
    if (!st && off) st = fr_place_params_up(s);
    if (st) return st;
    /* zero_grad: set_to_none releases the buffers, otherwise the next backward
     * overwrites them (the same as zeroing, without the memset) */
    fr_optim_zero_grad(m, s->o.optim.zero_grad_to_none);
    return FR_OK;
}
