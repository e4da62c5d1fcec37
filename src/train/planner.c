/* planner.c — give it a budget and it chooses: among plans that keep
 * everything, recompute segments (checkpoint_sequential), or use binomial
 * checkpointing with s slots, each at the full batch or split into
 * micro-batches, it builds each candidate's exact plan (the same plan the
 * executor runs), keeps those whose reserved bytes fit, and picks the least
 * costly. Cost is the extra FLOPs as a fraction of the step's, plus 3% per
 * halving of the micro-batch (smaller GEMMs run less efficiently: measured
 * 2-5% per halving on the seed MLP here) and a whole step more when the model
 * has BatchNorm (micro-batches change its batch statistics, so it is the last
 * resort). Nothing fits: the error names the smallest budget that does and
 * the plan that gets there. Also the plan description of `frugal plan`. */
#include <math.h>
#include <string.h>
#include "report/report.h"
#include "train/step.h"

typedef struct candidate {
    fr_ckpt_mode mode;
    int arg, micro;
    fr_precision prec;
    double cost;
    size_t reserved;
} candidate;

static int has_batchnorm(const fr_model *m) {
    for (size_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == FR_L_BATCHNORM) return 1;
    return 0;
}

static const char *mode_name(fr_ckpt_mode m) {
    static const char *names[] = {"marks", "none", "all", "sqrt", "every", "segments", "revolve", "auto"};
    /* (every:1 is printed as "every 1": the same plan as "all") */
    return (unsigned)m <= FR_CKPT_AUTO ? names[m] : "?";
}

/* Build a candidate and read its reserved bytes and cost; 0 if it failed. */
static int try_candidate(fr_model *m, const fr_step_opts *base, candidate *c, int bn) {
    fr_step_opts o = *base;
    o.checkpoint = c->mode;
    o.ckpt_arg = c->arg;
    o.micro_batch = c->micro;
    o.precision = c->prec;
    o.budget = 0;
    fr_step *s = fr_step_build(m, &o);
    if (!s) return 0;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    c->reserved = info.reserved;
    int k = info.accumulate;
    double plain = info.flops - info.extra_flops;
    c->cost = info.extra_flops / (plain > 0 ? plain : 1) +
              (k > 1 ? 0.03 * log2((double)k) + (bn ? 1.0 : 0.0) : 0.0) +
              (c->prec == FR_PREC_BF16_MIXED && base->precision == FR_PREC_AUTO ? 0.10 : 0.0);
    fr_step_free(s);
    return 1;
}

/* Search the candidates: best (least cost within opts->budget; 0 = no
 * limit) and smallest (least reserved). whole = 1 keeps the batch whole.
 * Returns 1 if one fits, 0 if none, -1 on an allocation failure. */
static int plan_search(fr_model *m, const fr_step_opts *opts, int whole, candidate *best,
                       candidate *smallest) {
    fr_ctx *ctx = m->ctx;
    int bn = has_batchnorm(m);
    size_t budget = opts->budget;
    memset(best, 0, sizeof *best);
    memset(smallest, 0, sizeof *smallest);
    best->cost = INFINITY;
    smallest->reserved = SIZE_MAX;
    int found = 0;
    fr_mem_stats ms0;
    fr_mem_get_stats(ctx, &ms0);
    int fixed_micro = opts->micro_batch > 0 || whole;
    int units = m->n_units < 512 ? m->n_units : 512;
    candidate *list = fr_alloc(ctx, 2 * (3 * 512 + 4) * sizeof *list, FR_MEM_OTHER);
    if (!list) return -1;
    for (int micro = opts->micro_batch > 0 ? opts->micro_batch : opts->batch; micro >= 1; micro--) {
        if (opts->batch % micro) continue;
        int n = 0;
        /* --precision auto may store activations in bf16 (costed at 10%: the
         * casts, measured 4-9% here, and the rounding) when that fits. */
        fr_precision precs[2] = {opts->precision, opts->precision};
        int np = 1;
        if (opts->precision == FR_PREC_AUTO) precs[0] = FR_PREC_FP32, precs[1] = FR_PREC_BF16_MIXED, np = 2;
        for (int q = 0; q < np; q++) {
            fr_precision pr = precs[q];
            /* A budget without an explicit mode lets the planner choose. */
            if (opts->checkpoint != FR_CKPT_AUTO && opts->checkpoint != FR_CKPT_MARKS) {
                list[n++] = (candidate){opts->checkpoint, opts->ckpt_arg, micro, pr, 0, 0};
                continue;
            }
            list[n++] = (candidate){FR_CKPT_NONE, 0, micro, pr, 0, 0};
            for (int k = 2; k <= units; k++) /* checkpoint_sequential(k) */
                list[n++] = (candidate){FR_CKPT_SEGMENTS, k, micro, pr, 0, 0};
            for (int k = 1; k < units; k++) /* every:k (every:1 = all, and sqrt among them) */
                list[n++] = (candidate){FR_CKPT_EVERY, k, micro, pr, 0, 0};
            for (int sl = units; sl >= 1; sl--) /* binomial checkpointing with sl slots */
                list[n++] = (candidate){FR_CKPT_REVOLVE, sl, micro, pr, 0, 0};
        }
        for (int i = 0; i < n; i++) {
            if (!try_candidate(m, opts, &list[i], bn)) {
                if (ctx->mem.st.num_ooms > ms0.num_ooms) { /* a real allocation failure */
                    fr_free(ctx, list);
                    return -1;
                }
                continue;
            }
            if (list[i].reserved < smallest->reserved) *smallest = list[i];
            if (budget && list[i].reserved > budget) continue;
            if (list[i].cost < best->cost) {
                *best = list[i];
                found = 1;
            }
            if (i == 0 && found && best->cost == 0) break; /* keeping everything in fp32 fits: done */
        }
        if (found && best->micro == opts->batch) break; /* no need to split the batch */
        if (fixed_micro) break;
        if (found && micro < best->micro / 2) break; /* smaller micro-batches only cost more */
    }
    fr_free(ctx, list);
    fr_mem_empty_cache(ctx); /* what comparing candidates freed is not the step's to hold */
    return found;
}

int fr_plan_fits(fr_model *m, const fr_step_opts *opts) {
    candidate best, smallest;
    return plan_search(m, opts, 1, &best, &smallest) == 1;
}

fr_step *fr_step_plan_choose(fr_model *m, const fr_step_opts *opts, fr_plan_need *need) {
    candidate best, smallest;
    memset(need, 0, sizeof *need);
    int found = plan_search(m, opts, 0, &best, &smallest);
    if (found < 0) return NULL;
    if (!found) {
        if (smallest.reserved != SIZE_MAX)
            *need = (fr_plan_need){smallest.reserved, smallest.mode, smallest.arg, smallest.micro, smallest.prec};
        return NULL;
    }
    fr_step_opts o = *opts;
    o.checkpoint = best.mode;
    o.ckpt_arg = best.arg;
    o.micro_batch = best.micro;
    o.precision = best.prec;
    fr_step *s = fr_step_build(m, &o);
    fr_mem_empty_cache(m->ctx); /* what building freed is not the step's to hold */
    return s;
}

int fr_plan_need_str(const fr_plan_need *n, char *buf, size_t len) {
    return snprintf(buf, len, "checkpoint %s%s%.0d, micro-batch %d, precision %s", mode_name(n->mode),
                    n->arg ? " " : "", n->arg, n->micro, fr_precision_name(n->prec));
}

fr_status fr_plan_refuse(fr_ctx *ctx, const fr_step_opts *opts, const fr_plan_need *need) {
    char a[32], b[32], how[128];
    fr_plan_need_str(need, how, sizeof how);
    return fr_fail(ctx, FR_ERR_BUDGET,
                   "no plan fits the budget of %s: the smallest needs %s (%zu bytes) with %s; raise "
                   "--budget to at least that, or shrink --batch or the model%s",
                   fr_human_bytes(opts->budget, a, sizeof a), fr_human_bytes(need->reserved, b, sizeof b),
                   need->reserved, how,
                   opts->precision == FR_PREC_FP32 ? " (--precision auto may store activations in bf16)" : "");
}

fr_step *fr_step_plan_budget(fr_model *m, const fr_step_opts *opts) {
    fr_plan_need need;
    fr_step *s = fr_step_plan_choose(m, opts, &need);
    if (!s && need.reserved) fr_plan_refuse(m->ctx, opts, &need);
    if (s && fr_step_materialize(s)) {
        fr_step_free(s);
        return NULL;
    }
    return s;
}

/* Gradient bytes the SGD step inside backward saves (step.c). */
static size_t fused_bytes(const fr_step *s) {
    size_t b = 0;
    for (size_t i = 0; i < s->m->n_params && s->fused; i++)
        if (s->fused[i]) b += (size_t)fr_shape_numel(&s->m->params[i].shape) * sizeof(float);
    return b;
}

void fr_step_describe_plan(const fr_step *s, FILE *out, int json) {
    const fr_model *m = s->m;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    size_t pred[FR_MEM_CAT_COUNT], total;
    fr_step_predicted(s, pred, &total);
    /* Which units keep their activations and which are recomputed; what runs in place. */
    int n = m->n_units;
    int recomputed[4096] = {0};
    int inplace = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) { /* clones carry attr.recompute */
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if (nd->attr.recompute && nd->layer >= 0 && m->layers[nd->layer].unit < 4096)
            recomputed[m->layers[nd->layer].unit] = 1;
    }
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        int j = fr_op_get(nd->op)->inplace_in;
        if (j >= 0 && nd->out[0] >= 0 && nd->in[j] >= 0 && s->plan.offset[nd->out[0]] >= 0 &&
            s->plan.offset[nd->out[0]] == s->plan.offset[nd->in[j]])
            inplace++;
    }
    double base = info.flops - info.extra_flops;
    double frac = info.extra_flops / (base > 0 ? base : 1); /* relative to the step without recompute */
    char h[8][32];
    if (json) {
        fprintf(out, "{\"batch\": %d, \"precision\": \"%s\", \"micro_batch\": %d, \"accumulate\": %d, \"checkpoint\": \"%s\", "
                "\"checkpoint_arg\": %d, \"units\": %d, \"recomputed_unit_forwards\": %d, "
                "\"extra_compute\": %.6f, \"inplace_ops\": %d, \"arena_bytes\": %zu, "
                "\"reserved_bytes\": %zu, \"predicted_peak_total\": %zu, \"budget\": %zu, "
                "\"updated_in_backward\": %d, \"gradient_bytes_not_kept\": %zu, "
                "\"update_scratch_bytes\": %zu, \"layers\": [",
                s->o.batch, fr_precision_name(s->o.precision), info.micro_batch, info.accumulate, mode_name(info.mode), info.ckpt_arg, n,
                info.recomputed_units, frac, inplace, info.arena, info.reserved, total, s->o.budget,
                s->n_fused, fused_bytes(s), s->upd_ws_len * sizeof(float));
        int first = 1;
        for (size_t i = 0; i < m->n_layers; i++) {
            const fr_layer *l = &m->layers[i];
            if (l->kind == FR_L_RES_SHORTCUT || l->kind == FR_L_RES_END) continue;
            int u = l->unit;
            fprintf(out, "%s{\"name\": \"%s\", \"unit\": %d, \"activations\": \"%s\", \"frozen\": %s}",
                    first ? "" : ", ", l->name, u,
                    u < s->first_unit ? "none" : (u < 4096 && recomputed[u]) ? "recomputed" : "kept",
                    l->frozen ? "true" : "false");
            first = 0;
        }
        fprintf(out, "], \"predicted_peak\": {");
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
            fprintf(out, "%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name(c), pred[c]);
        fprintf(out, "}}\n");
        return;
    }
    fprintf(out, "plan for batch %d: ", s->o.batch);
    if (info.accumulate > 1)
        fprintf(out, "%d micro-batches of %d (gradients accumulate, loss scaled by each one's share)\n",
                info.accumulate, info.micro_batch);
    else
        fprintf(out, "the whole batch at once\n");
    fprintf(out, "checkpointing: %s", mode_name(info.mode));
    if (info.ckpt_arg) fprintf(out, " %d", info.ckpt_arg);
    fprintf(out, " -> %d unit forwards recomputed per micro-batch, extra compute %.1f%% of a step\n",
            info.recomputed_units, 100 * frac);
    fprintf(out, "precision: %s\n", fr_precision_name(s->o.precision));
    fprintf(out, "in place: %d ops write over an input that dies there\n", inplace);
    if (s->n_fused && !s->upd_ws_len)
        fprintf(out, "optimizer step inside backward: %d tensors stepped as their gradient is made, "
                "%s of gradients never all stored (--keep-grads to store them)\n",
                s->n_fused, fr_human_bytes(fused_bytes(s), h[5], sizeof h[5]));
    else if (s->n_fused)
        fprintf(out, "SGD step inside backward: %d Linear tensors updated as their gradient is "
                "computed, %s of gradients never stored, a %s tile of scratch instead "
                "(--keep-grads to store them)\n",
                s->n_fused, fr_human_bytes(fused_bytes(s), h[5], sizeof h[5]),
                fr_human_bytes(s->upd_ws_len * sizeof(float), h[6], sizeof h[6]));
    fprintf(out, "\n");
    fprintf(out, "%-6s %-16s %-14s %s\n", "unit", "layer", "type", "activations");
    for (size_t i = 0; i < m->n_layers; i++) {
        const fr_layer *l = &m->layers[i];
        if (l->kind == FR_L_RES_SHORTCUT || l->kind == FR_L_RES_END) continue;
        int u = l->unit;
        fprintf(out, "%-6d %-16s %-14s %s%s\n", u, l->name, fr_layer_kind_name(l->kind),
                u < s->first_unit ? "no backward (below the lowest trainable layer)"
                : (u < 4096 && recomputed[u]) ? "recomputed before its backward" : "kept",
                l->frozen ? ", frozen" : "");
    }
    fprintf(out, "\npredicted peak by category:\n");
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
        if (pred[c]) fprintf(out, "  %-12s %12s\n", fr_mem_cat_name(c), fr_human_bytes(pred[c], h[0], sizeof h[0]));
    fprintf(out, "  %-12s %12s  (live bytes at the peak)\n", "total", fr_human_bytes(total, h[1], sizeof h[1]));
    fprintf(out, "  %-12s %12s  (persistent + arena %s)\n", "reserved", fr_human_bytes(info.reserved, h[2], sizeof h[2]),
            fr_human_bytes(info.arena, h[3], sizeof h[3]));
    if (s->o.budget)
        fprintf(out, "  %-12s %12s  (%s)\n", "budget", fr_human_bytes(s->o.budget, h[4], sizeof h[4]),
                info.reserved <= s->o.budget ? "fits" : "does NOT fit");
}
