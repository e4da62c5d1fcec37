/* account.c — what a step holds, predicted from its plan and options before
 * anything is allocated: persistent bytes by category (parameters,
 * gradients, optimizer state, one data batch), the predicted peak, and the
 * bytes reserved as the allocator rounds each block (in the host's memory,
 * and in a device's: fr_dev_step_reserved); fr_plan_info for the public
 * API. The same numbers the run then measures. */
#include <string.h>
#include "backend/backend.h"
#include "parallel/buckets.h"
#include "parallel/pshard.h"
#include "plan/offload.h"
#include "train/place.h"
#include "train/feed.h"
#include "train/zero.h"

void fr_step_persistent(const fr_step *s, size_t out[FR_MEM_CAT_COUNT]) {
    const fr_model *m = s->m;
    memset(out, 0, FR_MEM_CAT_COUNT * sizeof out[0]);
    const fr_pshard *ps = m->shard;
    size_t grads = 0; /* the gradients' bytes, parameter by parameter */
    for (size_t i = 0; i < m->n_params; i++)
        if (s->gv[i] >= 0) grads += fr_step_grad_bytes(s, i);
    out[FR_MEM_PARAMS] += fr_model_block_bytes(m, NULL); /* all but ZeRO 3's shards */
    /* the optimizer's flat blocks (at ZeRO 2 and 3 the gradients are views
     * of the buckets, counted as the tensors' bytes) */
    out[FR_MEM_GRADS] += s->dp.buckets && s->o.zero >= 2 ? grads : fr_step_grads_block(s);
    out[FR_MEM_OPTIM] += (size_t)fr_optim_states(&s->o.optim) * fr_step_state_block(s);
    out[FR_MEM_OPTIM] += fr_step_state_scratch(s); /* a device's Adafactor sums */
    if (s->dp.buckets && s->o.zero >= 2) { /* the gradient shard, and the buckets at their worst */
        size_t peak, res;
        fr_step_bucket_peak(s, s->o.zero, &peak, &res);
        out[FR_MEM_GRADS] += peak;
        if (!s->dp.buckets->on_share)
            out[FR_MEM_GRADS] += (s->dp.buckets->hi - s->dp.buckets->lo) * 4;
    }
    if (ps) { /* ZeRO 3: the weights' shard and what the step gathers at its worst */
        size_t peak, res;
        fr_step_gathered_peak(s, &peak, &res);
        out[FR_MEM_PARAMS] += (ps->hi - ps->lo) * sizeof(float) + peak;
    }
    size_t per = (fr_value_bytes(&s->g.vals[s->g.input]) + fr_value_bytes(&s->g.vals[s->g.label])) /
                 (size_t)s->sched.micro;
    out[FR_MEM_GRADS] += s->opt.upd_ws_len * sizeof(float);
    out[FR_MEM_WORKSPACE] += s->place.gemm_ws * sizeof(float);           /* the GEMM scratch */
    out[FR_MEM_ACTIVATIONS] += fr_offload_host_place(&s->g, NULL, NULL); /* host block */
    out[FR_MEM_DATA] = per * (size_t)s->o.batch;
    /* the step's metadata, and a training step's optimizer records (kept with the model) */
    out[FR_MEM_OTHER] = s->meta_bytes + (s->o.training ? fr_optim_meta_bytes(m, 0) : 0);
}

void fr_step_predicted(const fr_step *s, size_t out[FR_MEM_CAT_COUNT], size_t *peak_total) {
    fr_step_persistent(s, out);
    size_t persistent = 0;
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) persistent += out[c];
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) out[c] += s->plan.peak[c];
    if (peak_total) *peak_total = persistent + s->plan.peak_total;
}

size_t fr_step_reserved(const fr_step *s) {
    if (fr_place_second_memory(s->ctx)) return fr_dev_step_reserved(s); /* the budget is its */
    const fr_model *m = s->m;
    size_t r = 0;
    int ns = fr_optim_states(&s->o.optim);
    const fr_pshard *ps = m->shard;
    if (ps) { /* ZeRO 3: the weights' shard and the gathered blocks at the worst position */
        size_t peak, res;
        fr_step_gathered_peak(s, &peak, &res);
        if (ps->hi > ps->lo) r += fr_mem_block_bytes((ps->hi - ps->lo) * sizeof(float));
        r += res;
    }
    size_t pb = fr_model_block_bytes(m, NULL); /* the parameter block: all but ZeRO 3's shards */
    if (pb) r += fr_mem_block_bytes(pb);
    size_t gb = fr_step_grads_block(s), sb = s->o.training ? fr_step_state_block(s) : 0;
    if (gb) r += fr_mem_block_bytes(gb); /* the gradient block (the buckets' at ZeRO 0 and 1) */
    if (sb) r += (size_t)ns * fr_mem_block_bytes(sb);
    if (s->opt.upd_ws_len) r += fr_mem_block_bytes(s->opt.upd_ws_len * sizeof(float));
    if (s->place.gemm_ws) r += fr_mem_block_bytes(s->place.gemm_ws * sizeof(float));
    if (s->dp.buckets && s->o.zero >= 2) { /* the shard, and the bucket blocks at their worst */
        size_t peak, res;
        fr_step_bucket_peak(s, s->o.zero, &peak, &res);
        r += res;
        if (s->dp.buckets->hi > s->dp.buckets->lo && !s->dp.buckets->on_share)
            r += fr_mem_block_bytes((s->dp.buckets->hi - s->dp.buckets->lo) * sizeof(float));
    }
    /* optimizer_update's f32 working copies of one 16-bit tensor at a time
     * (SGD on 16-bit weights; Adam there is one fused pass without them) */
    size_t widest = 0;
    for (size_t i = 0; s->o.training && fr_optim_f32_copies(&s->o.optim) && i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (s->gv[i] < 0 || p->dtype == FR_F32 || (s->opt.fused && s->opt.fused[i])) continue;
        size_t w = (size_t)fr_shape_numel(&p->shape) * sizeof(float) * (size_t)(2 + ns);
        if (w > widest) widest = w;
    }
    if (widest) r += fr_mem_block_bytes(widest);
    if (s->plan.arena_bytes) r += fr_mem_block_bytes(s->plan.arena_bytes);
    size_t host = fr_offload_host_place(&s->g, NULL, NULL); /* offloaded activations */
    if (host) r += fr_mem_block_bytes(host);
    r += fr_mem_block_bytes(s->g.n_vals * sizeof(void *)) +
         fr_mem_block_bytes(s->g.n_vals); /* fr_exec_init */
    size_t per[FR_MEM_CAT_COUNT];
    fr_step_persistent(s, per);
    if (s->o.training) r += fr_optim_meta_bytes(m, 1); /* the optimizer's records */
    return r + s->meta_reserved + per[FR_MEM_DATA];
}

void fr_step_plan_info(const fr_step *s, fr_plan_info *o) {
    memset(o, 0, sizeof *o);
    o->micro_batch = s->sched.micro;
    o->accumulate = s->sched.accumulate;
    o->units = s->m->n_units;
    o->recomputed_units = s->sched.recomputed_units;
    o->flops = s->sched.flops;
    o->extra_flops = s->sched.extra_flops;
    o->arena = s->plan.arena_bytes;
    o->mode = s->o.checkpoint;
    o->ckpt_arg = s->o.ckpt_arg;
    o->reserved = fr_step_reserved(s);
}

/* What the step reserves in a device's memory (its classes' rounding);
 * SIZE_MAX when its arena exceeds the device's largest buffer. */
size_t fr_dev_step_reserved(const fr_step *s) {
    const fr_model *m = s->m;
    const fr_mem *dm = s->ctx->dmem;
    const fr_backend *be = fr_backend_of(s->ctx);
    if (s->plan.arena_bytes > be->max_buffer(s->ctx)) return SIZE_MAX; /* cannot be one buffer */
    size_t r = 0;
    int ns = fr_optim_states(&s->o.optim);
    size_t pb = fr_model_block_bytes(m, NULL); /* the parameter block's copy */
    if (pb) r += fr_mem_class_bytes(dm, pb);
    /* the optimizer's flat blocks: the gradients (but those stepped inside
     * backward) and, unless offloaded to the host, the state */
    size_t gb = s->o.training ? fr_step_grads_block(s) : 0;
    size_t sb =
        s->o.training && !(s->o.offload & FR_OFFLOAD_OPTIMIZER) ? fr_step_state_block(s) : 0;
    if (gb) r += fr_mem_class_bytes(dm, gb);
    if (sb) r += (size_t)ns * fr_mem_class_bytes(dm, sb);
    if (fr_step_state_scratch(s)) r += fr_mem_class_bytes(dm, fr_step_state_scratch(s));
    const fr_graph *g = &s->g;
    if (fr_feed_used(s)) r += fr_feed_reserved(s);
    else
        r += fr_mem_class_bytes(dm, fr_value_bytes(&g->vals[g->input])) +
             fr_mem_class_bytes(dm, fr_value_bytes(&g->vals[g->label]));
    if (s->plan.arena_bytes) r += fr_mem_class_bytes(dm, s->plan.arena_bytes);
    if (s->m->loss == FR_LOSS_CROSS_ENTROPY && g->hits < 0) /* fr_backend.hits' count */
        r += fr_mem_class_bytes(dm, FR_HITS_SCRATCH);
    if (fr_place_scratch_floats(s))
        r += fr_mem_class_bytes(dm, fr_place_scratch_floats(s) * sizeof(float));
    return r;
}
