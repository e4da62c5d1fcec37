/* budget.c — one accounting of the user's --budget, shared by `frugal train`
 * and `frugal plan` (and --batch auto in both). The budget is split into
 *
 *   data loading  the open datasets, the training loader (its permutation and
 *                 (queue + 1) batch buffers) and, while evaluating, the eval
 *                 loader and eval step beyond the training arena they replace;
 *   the model     parameters and buffers, from their shapes (nothing is
 *                 allocated to count them);
 *   metadata      the model's description, held already;
 *   the step      what is left: gradients, optimizer state, the arena, the
 *                 executor's tables, the step's own metadata,
 *
 * every term as the allocator reserves it (headers and rounding included),
 * and the planner fills the step's share. The step's plan counts the
 * parameters and the batch it reads (fr_step_reserved); that batch is one of
 * the loader's buffers and the parameters are the model's term, so the
 * planner is given the step's share plus those two and nothing is counted
 * twice. A refusal names the user's budget and what takes it.
 *
 * One rank of a data-parallel run (d->ranks > 1): the budget is the rank's.
 * The caller plans the rank's step (its slice of the global batch, every
 * gradient kept), so the loader's batch buffers and the step's data are the
 * slice's; at ZeRO stage K the step's share is the planner's candidate less
 * what the stage shards away (fr_step_rank_bytes' saving: ZeRO's formulas
 * for parameters, gradients and optimizer state, the bucket buffers added),
 * so the planner is given the share plus that saving. */
#include <stdlib.h>
#include <string.h>
#include "data/loader.h"
#include "data/tokens.h"
#include "core/names.h"
#include "core/flat.h"
#include "run/trainer.h"

/* The parameter block as it will be allocated (model.h: one block, core/
 * flat.h's layout): in 16 bits for trainable tensors under pure fp16/bf16
 * (fr_model_to_dtype), else in their dtype; with allocated_only, the one
 * the model holds now (0: none yet). */
static size_t param_blocks(const fr_model *m, fr_precision prec, int allocated_only) {
    if (allocated_only) return m->pblock ? fr_mem_block_bytes(m->pblock_bytes) : 0;
    int half = prec == FR_PREC_FP16 || prec == FR_PREC_BF16;
    size_t end = 0;
    for (size_t i = m->n_params; i-- > 0;) {
        const fr_param *p = &m->params[i];
        size_t es =
            half && p->trainable && p->dtype == FR_F32 && !p->quant ? 2 : fr_dtype_size(p->dtype);
        /* a quantized weight's block (floats first) at 16 bytes, as model.c places it */
        fr_flat_place(&end, (size_t)fr_shape_numel(&p->shape) * es, p->quant ? 16 : es);
    }
    return end ? fr_mem_block_bytes(end) : 0;
}

/* The same without the allocator's headers and rounding: the tensors' bytes. */
static size_t param_raw(const fr_model *m, fr_precision prec) {
    int half = prec == FR_PREC_FP16 || prec == FR_PREC_BF16;
    size_t r = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        size_t es =
            half && p->trainable && p->dtype == FR_F32 && !p->quant ? 2 : fr_dtype_size(p->dtype);
        r += (size_t)fr_shape_numel(&p->shape) * es;
    }
    return r;
}

/* The batch a step reads (its plan's data term): f32 inputs and i32 labels,
 * or f32 targets for MSE; a token model's seq i32 ids and as many targets. */
static size_t data_bytes(const fr_model *m, int batch) {
    if (fr_model_seq(m)) return (size_t)fr_model_seq(m) * 8 * (size_t)batch;
    size_t label = m->loss == FR_LOSS_CROSS_ENTROPY ? 4 : (size_t)fr_model_num_classes(m) * 4;
    return ((size_t)fr_shape_numel(&m->in) * 4 + label) * (size_t)batch;
}

/* The training loader's permutation (counted with the datasets) */
static size_t perm_bytes(const fr_budget_data *d) {
    int64_t n = d->limit_train > 0 && d->limit_train < d->n_train ? d->limit_train : d->n_train;
    return fr_mem_block_bytes((size_t)n * sizeof(int64_t));
}

/* What a loader of n samples (token windows for a token model) whose
 * buffers hold `batch` reserves: fr_loader_reserved or
 * fr_token_loader_reserved (a rank's: batch is its slice's). */
static size_t loader_bytes(const fr_budget_data *d, int64_t n, int batch, int shuffle, int queue,
                           int64_t limit) {
    if (d->seq) {
        if (limit > 0 && limit < n) n = limit;
        fr_token_loader_opts to = {batch, d->seq, shuffle, 0, queue, 0, 0, n * d->seq + 1, 0, 0, 0};
        return fr_token_loader_reserved(&to);
    }
    fr_loader_opts lo = {batch, shuffle, 0, 0, queue, limit, 0, 0};
    return fr_loader_reserved(n, d->sample, &lo);
}

/* and the rest of it: (queue + 1) batch buffers and its handle (batch: the
 * rank's step's, already its slice) */
static size_t train_loader(const fr_budget_data *d, int batch) {
    return loader_bytes(d, d->n_train, batch, 1, d->queue, d->limit_train) - perm_bytes(d);
}

/* What the planner may give the step at this batch: the user's budget less
 * everything outside the step, plus the parameters and the batch the step's
 * plan counts itself. 0 if nothing is left. */
static size_t step_budget(const fr_model *m, const fr_budget *b, const fr_budget_data *d, int batch,
                          size_t eval_extra) {
    size_t out = b->datasets + train_loader(d, batch) + eval_extra + b->meta + b->model;
    if (out >= b->total) return 0;
    return b->total - out + b->model + data_bytes(m, batch);
}

/* What ZeRO's stage d->zero on d->ranks takes off one rank's step at this
 * batch: the same for every schedule and micro-batch (parameters, gradients
 * and optimizer state do not depend on them), so it is read from the step
 * that keeps everything. 0 for one process or stage 0. */
static fr_status zero_saving(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                             int batch, size_t *saving) {
    *saving = 0;
    if (d->ranks <= 1 || d->zero <= 0) return FR_OK;
    fr_step_opts o = *opts;
    o.batch = batch;
    o.budget = 0;
    o.checkpoint = FR_CKPT_NONE, o.ckpt_arg = 0, o.micro_batch = 0;
    if (o.precision == FR_PREC_AUTO) o.precision = FR_PREC_FP32;
    fr_step *s = fr_step_build(m, &o);
    if (!s) return FR_ERR_NOMEM; /* (the message is set) */
    fr_rank_bytes r;
    fr_step_rank_bytes(s, d->ranks, d->zero, &r);
    fr_step_free(s);
    *saving = r.saving;
    return FR_OK;
}

/* While evaluating, the training arena is released and the eval loader
 * (FR_EVAL_QUEUE) and an eval step at the eval batch take its place: what they
 * need beyond it. */
static fr_status eval_extra(fr_model *m, const fr_step *s, const fr_budget_data *d,
                            const fr_budget *b, size_t *extra) {
    /* one rank scores its slice of each eval batch, and its eval step and
     * loader buffers hold the largest slice: of --eval-batch, or of the
     * global micro-batch, about the rank's own (the trainer's evaluate_test) */
    int eb = d->eval_batch > 0 ? d->eval_batch : s->sched.micro;
    if (d->ranks > 1 && d->eval_batch > 0) eb = (eb + d->ranks - 1) / d->ranks;
    fr_step_opts eo = {0};
    eo.batch = eb;
    eo.training = 0;
    eo.head_rows = s->o.head_rows;
    fr_step *e = fr_step_build(m, &eo);
    if (!e) return FR_ERR_NOMEM; /* (the message is set) */
    size_t need = fr_step_reserved(e) - b->model - data_bytes(m, eb) +
                  loader_bytes(d, d->n_test, eb, 0, FR_EVAL_QUEUE, d->limit_test);
    fr_step_free(e);
    size_t arena = s->plan.arena_bytes ? fr_mem_block_bytes(s->plan.arena_bytes) : 0;
    *extra = need > arena ? need - arena : 0;
    return FR_OK;
}

/* Everything outside the step at this batch; the step gets the rest. */
static size_t outside(const fr_budget *b) {
    return b->datasets + b->queue + b->eval + b->meta + b->model;
}

static void fill(fr_budget *b, const fr_budget_data *d, int batch, size_t eval) {
    b->batch = batch;
    b->ranks = d->ranks, b->zero = d->zero;
    b->queue = train_loader(d, batch);
    b->eval = eval;
    b->step = b->total > outside(b) ? b->total - outside(b) : 0;
}

/* "data loading takes 1.9 MiB (datasets 0.9 MiB, the loader's queue of 3
 * batches of 64 samples 1.0 MiB, evaluation 0.1 MiB)" */
static void data_words(const fr_budget *b, char *buf, size_t len) {
    char h[4][32];
    snprintf(buf, len,
             "data loading takes %s (datasets %s, the loader's queue of %d batches of %d samples "
             "%s%s%s)",
             fr_human_bytes(b->datasets + b->queue + b->eval, h[0], 32),
             fr_human_bytes(b->datasets, h[1], 32), b->queue_batches, b->batch,
             fr_human_bytes(b->queue, h[2], 32), b->eval ? ", evaluation " : "",
             b->eval ? fr_human_bytes(b->eval, h[3], 32) : "");
}

/* ... and "the model's parameters 1.6 MiB and metadata 9.8 KiB" */
static void words(const fr_budget *b, char *buf, size_t len) {
    char d[256], h[2][32];
    data_words(b, d, sizeof d);
    snprintf(buf, len, "%s, the model's parameters %s and metadata %s", d,
             fr_human_bytes(b->model, h[0], 32), fr_human_bytes(b->meta, h[1], 32));
}

static fr_status refuse(fr_ctx *ctx, const fr_budget *b, const fr_plan_need *need,
                        const char *lead) {
    char a[32], l[32], n[32], s[32], how[128], what[512];
    words(b, what, sizeof what);
    fr_plan_need_str(need, how, sizeof how);
    return fr_fail(ctx, FR_ERR_BUDGET,
                   "%sno plan fits the budget of %s: %s, leaving %s for the step, whose smallest "
                   "plan needs %s (%s); the smallest budget that fits is %s (%zu bytes): raise "
                   "--budget to it, or shrink --batch or the model",
                   lead, fr_human_bytes(b->total, a, sizeof a), what,
                   fr_human_bytes(b->step, l, sizeof l), fr_human_bytes(b->step_need, n, sizeof n),
                   how, fr_human_bytes(outside(b) + b->step_need, s, sizeof s),
                   outside(b) + b->step_need);
}

static void budget_split(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                         fr_budget *b);

/* The plan at one batch within the split: the planner gets the step's
 * share; then the eval phase is checked and, if it needs more than the arena
 * it replaces, the step is planned again with that much less (its need
 * depends on the micro-batch chosen, so a few rounds at most). Returns the
 * step (not materialized) with *b filled, or NULL: need->reserved set when
 * nothing fits (b->step_need then the smallest plan's), 0 on another failure
 * (message set). No message for a plan that does not fit. */
static fr_step *plan_at(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d, int batch,
                        fr_budget *b, fr_plan_need *need) {
    size_t extra = 0, save;
    memset(need, 0, sizeof *need);
    if (zero_saving(m, opts, d, batch, &save)) return NULL;
    b->zero_saving = save;
    for (int round = 0; round < 4; round++) {
        fr_step_opts o = *opts;
        o.batch = batch;
        fill(b, d, batch, extra);
        o.budget = step_budget(m, b, d, batch, extra);
        /* nothing left (0 would mean no limit): 1, the smallest, for the message */
        o.budget = o.budget ? o.budget + save : 1;
        fr_step *s = fr_step_plan_choose(m, &o, need);
        if (!s) {
            if (!need->reserved) return NULL;
            b->step_need = need->reserved - b->model - data_bytes(m, batch);
            b->step_need = b->step_need > save ? b->step_need - save : 0;
            /* the smallest plan's own evaluation, for the smallest budget */
            o.checkpoint = need->mode, o.ckpt_arg = need->arg, o.micro_batch = need->micro;
            o.precision = need->prec, o.offload = need->offload;
            fr_step *small = fr_step_build(m, &o);
            size_t e;
            if (small && !eval_extra(m, small, d, b, &e)) {
                fill(b, d, batch, e);
                /* The rounds raise the room for evaluation by the eval of the
                 * plans they chose (a smaller arena leaves more to replace),
                 * which can squeeze out the smallest plan that fits with its
                 * own: at the budget named for it, that plan is the answer. */
                if (outside(b) + b->step_need <= b->total) {
                    small->o.budget = b->total;
                    return small;
                }
            }
            fr_step_free(small);
            return NULL;
        }
        size_t e;
        if (eval_extra(m, s, d, b, &e)) {
            fr_step_free(s);
            return NULL;
        }
        if (e <= extra) {
            b->step_need = fr_step_reserved(s) - b->model - data_bytes(m, batch) - save;
            s->o.budget = b->total;
            return s;
        }
        fr_step_free(s);
        extra = e;
    }
    fr_fail(m->ctx, FR_ERR_BUDGET, "the budget of %zu bytes: no plan leaves room for evaluation",
            b->total);
    return NULL;
}

/* --batch auto: whether some plan of the whole batch (or of the given
 * micro-batch) fits, with everything the batch brings (queue, evaluation);
 * -1 if an allocation failed while finding out (message set). */
static int batch_fits(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d, int batch) {
    fr_step_opts o = *opts;
    if (!o.micro_batch) o.micro_batch = batch;
    if (o.micro_batch > batch || batch % o.micro_batch) return 0;
    fr_budget b = {0};
    b.total = opts->budget;
    fr_plan_need need;
    char saved[FR_ERR_LEN];
    fr_mem_stats m0, m1;
    fr_mem_get_stats(m->ctx, &m0);
    memcpy(saved, m->ctx->err, sizeof saved);
    budget_split(m, opts, d, &b);
    fr_step *s = plan_at(m, &o, d, batch, &b, &need);
    fr_step_free(s);
    fr_mem_get_stats(m->ctx, &m1);
    if (m1.num_ooms > m0.num_ooms) return -1; /* keep the allocator's message */
    memcpy(m->ctx->err, saved, sizeof saved);
    return s != NULL;
}

/* The largest batch that fits, 0 if not even 1, -1 on an allocation failure. */
static int largest_batch(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                         int max_batch) {
    int f = batch_fits(m, opts, d, 1);
    if (f <= 0) return f;
    int lo = 1, hi = 2;
    while (hi <= max_batch && (f = batch_fits(m, opts, d, hi)) > 0) lo = hi, hi *= 2;
    if (f < 0) return -1;
    if (hi > max_batch) hi = max_batch + 1;
    while (hi - lo > 1) { /* lo fits, hi does not */
        int mid = lo + (hi - lo) / 2;
        if ((f = batch_fits(m, opts, d, mid)) < 0) return -1;
        if (f) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The terms that do not depend on the batch: parameters (from shapes),
 * metadata (held now, less what is counted elsewhere), datasets. */
static void budget_split(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                         fr_budget *b) {
    b->total = opts->budget;
    b->queue_batches = d->queue + 1;
    b->model = param_blocks(m, opts->precision, 0);
    fr_mem_stats ms;
    fr_mem_get_stats(m->ctx, &ms);
    size_t held = ms.reserved - ms.cached;
    size_t mine = param_blocks(m, opts->precision, 1) + (d->assumed ? 0 : d->handles);
    b->meta = held > mine ? held - mine : 0;
    b->datasets = d->handles + perm_bytes(d);
}

static fr_step *budget_plan(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                            int batch_auto, fr_budget *b);

/* The frozen base's format first (its bytes are the parameters' share):
 * given, the model takes it now (on a model not yet allocated, shapes only);
 * auto, each from the most precise, fp32, bf16, int8, nf4, until one's plan
 * fits (accuracy first: the tiled GEMMs' time is not weighed); the refusal
 * is the last's, the smallest. */
fr_step *fr_budget_plan(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                        int batch_auto, fr_budget *b) {
    static const fr_base_precision order[] = {FR_BASE_FP32, FR_BASE_BF16, FR_BASE_INT8,
                                              FR_BASE_NF4};
    const int autob = opts->base_precision == FR_BASE_AUTO;
    const int n = autob ? (fr_model_quantizable(m) ? 4 : 1) : 1;
    for (int k = 0; k < n; k++) {
        fr_step_opts o = *opts;
        if (autob) o.base_precision = order[k];
        if (fr_model_quantize_base(m, o.base_precision)) return NULL;
        fr_mem_stats m0, m1;
        fr_mem_get_stats(m->ctx, &m0);
        fr_step *s = budget_plan(m, &o, d, batch_auto, b);
        fr_mem_get_stats(m->ctx, &m1);
        if (s || k + 1 == n || m->ctx->err_status != FR_ERR_BUDGET || m1.num_ooms > m0.num_ooms)
            return s;
    }
    return NULL;
}

static fr_step *budget_plan(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                            int batch_auto, fr_budget *b) {
    fr_ctx *ctx = m->ctx;
    memset(b, 0, sizeof *b);
    budget_split(m, opts, d, b);
    /* Refuse before anything is planned or allocated when the parameters
     * and the least data loading (a batch of 1) alone exceed the budget. */
    fill(b, d, 1, 0);
    /* (ZeRO stage 3 shards the parameters too: the planner judges them) */
    int sharded = d->ranks > 1 && d->zero == 3;
    if (!sharded && b->datasets + b->queue + b->meta + b->model > b->total) {
        char what[256], a[32], p[32], t[32], n[32];
        data_words(b, what, sizeof what);
        fr_fail(
            ctx, FR_ERR_BUDGET,
            "the budget of %s cannot hold the model: its parameters alone take %s (%zu bytes of "
            "tensors); with the least else (at a batch of 1 %s, metadata %s) it needs %s before "
            "any step; nothing was allocated",
            fr_human_bytes(b->total, a, sizeof a), fr_human_bytes(b->model, p, sizeof p),
            param_raw(m, opts->precision), what, fr_human_bytes(b->meta, t, sizeof t),
            fr_human_bytes(b->datasets + b->queue + b->meta + b->model, n, sizeof n));
        return NULL;
    }
    int batch = opts->batch;
    const char *lead = "";
    if (batch_auto) {
        /* (no larger than the samples an epoch uses: a bigger buffer would stay part empty) */
        int64_t n = d->limit_train > 0 && d->limit_train < d->n_train ? d->limit_train : d->n_train;
        batch = largest_batch(m, opts, d, n < (1 << 16) ? (int)n : 1 << 16);
        if (batch < 0) return NULL;
        if (!batch) batch = 1, lead = "--batch auto: not even a batch of 1 fits: ";
    }
    fr_plan_need need;
    fr_step *s = plan_at(m, opts, d, batch, b, &need);
    if (!s && need.reserved) refuse(ctx, b, &need, lead);
    return s;
}

size_t fr_budget_smallest(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                          fr_plan_need *need) {
    fr_budget b = {0};
    fr_step_opts o = *opts;
    o.budget = 1; /* below every plan: the search ends with the smallest */
    budget_split(m, &o, d, &b);
    fr_step *s = plan_at(m, &o, d, o.batch, &b, need);
    fr_step_free(s);
    return !s && need->reserved ? outside(&b) + b.step_need : 0;
}

void fr_budget_describe(const fr_budget *b, FILE *out, int json) {
    if (json) {
        fprintf(out,
                "{\"budget\": %zu, \"datasets\": %zu, \"queue\": %zu, \"queue_batches\": %d, "
                "\"evaluation\": %zu, \"parameters\": %zu, \"metadata\": %zu, \"step\": %zu, "
                "\"step_needs\": %zu, \"ranks\": %d, \"zero\": %d, \"zero_saving\": %zu, "
                "\"total\": %zu}",
                b->total, b->datasets, b->queue, b->queue_batches, b->eval, b->model, b->meta,
                b->step, b->step_need, b->ranks > 1 ? b->ranks : 1, b->ranks > 1 ? b->zero : 0,
                b->zero_saving, outside(b) + b->step_need);
        return;
    }
    char h[9][32];
    if (b->ranks > 1)
        fprintf(out, "the budget of %s for one rank of %d at ZeRO stage %d (its batch %d):\n",
                fr_human_bytes(b->total, h[0], 32), b->ranks, b->zero, b->batch);
    else
        fprintf(out, "the budget of %s (batch %d):\n", fr_human_bytes(b->total, h[0], 32),
                b->batch);
    fprintf(out, "  %-22s %12s\n", "datasets", fr_human_bytes(b->datasets, h[1], 32));
    char q[64];
    snprintf(q, sizeof q, "loader queue (%d)", b->queue_batches);
    fprintf(out, "  %-22s %12s\n", q, fr_human_bytes(b->queue, h[2], 32));
    if (b->eval) fprintf(out, "  %-22s %12s\n", "evaluation", fr_human_bytes(b->eval, h[3], 32));
    fprintf(out, "  %-22s %12s\n", "model parameters", fr_human_bytes(b->model, h[4], 32));
    fprintf(out, "  %-22s %12s\n", "metadata", fr_human_bytes(b->meta, h[5], 32));
    fprintf(out, "  %-22s %12s  (of %s left for it)\n", "the step",
            fr_human_bytes(b->step_need, h[6], 32), fr_human_bytes(b->step, h[7], 32));
    if (b->zero_saving)
        fprintf(out, "  %-22s %12s  (sharded away by ZeRO stage %d: not in the step's figure)\n",
                "", fr_human_bytes(b->zero_saving, h[1], 32), b->zero);
    fprintf(out, "  %-22s %12s\n", "total", fr_human_bytes(outside(b) + b->step_need, h[8], 32));
}
