/* estimate.c — the per-layer byte table of `frugal estimate`: what each
 * layer holds (weights, biases and buffers, gradients, optimizer state), what
 * it produces per step, what of that is saved for backward, its workspace,
 * and the predicted peak of one step by category. Reads the compiled step's
 * graph and plan; changes nothing. */
#include <string.h>
#include "backend/state.h"
#include "parallel/shard.h"
#include "report/report.h"
#include "model/model.h"
#include "optim/optim.h"
#include "train/step.h"

static fr_shape with_batch(int n, fr_shape s) {
    fr_shape b = {s.ndim + 1, {n, 0, 0, 0}};
    for (int i = 0; i < s.ndim && i < 3; i++) b.d[i + 1] = s.d[i];
    return b;
}

typedef struct layer_row {
    size_t weight, other, grads, optim, output, saved, workspace;
} layer_row;

static void fill_rows(const fr_step *s, layer_row *rows) {
    const fr_model *m = s->m;
    const fr_graph *g = &s->g;
    size_t buffers = (size_t)fr_optim_states(&s->o.optim);
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        size_t b = (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
        layer_row *r = &rows[p->layer];
        if (p->role == FR_P_WEIGHT || p->role == FR_P_LORA_A || p->role == FR_P_LORA_B)
            r->weight += b; /* a layer's adapters beside its weight */
        else r->other += b;
        if (s->gv[i] >= 0) {
            int kind;
            r->grads += fr_step_grad_bytes(s, i);
            r->optim += buffers * fr_optim_state_bytes(&s->o.optim, s->o.optim_state, p, &kind);
        }
    }
    for (size_t i = 0; i < (size_t)g->n_forward; i++) {
        const fr_node *n = &g->nodes[i];
        if (n->layer < 0 || fr_op_get(n->op)->view) continue;
        layer_row *r = &rows[n->layer];
        r->output += fr_value_bytes(&g->vals[n->out[0]]);
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            if (v < 0) continue;
            if (g->vals[v].saved) r->saved += fr_value_bytes(&g->vals[v]);
            if ((k > 0 && n->op == FR_OP_CONV2D) || (k == 2 && n->op == FR_OP_LINEAR_CE))
                r->workspace += fr_value_bytes(&g->vals[v]); /* a chunk of logits */
        }
    }
}

/* Optimizer state for the step's trainable weights, for each choice side by
 * side: SGD none, momentum one copy, Adam two, in fp32, bf16 or int8 blocks
 * (tensors under one 2048-value block keep fp32), Adafactor's factors (a row
 * and a column vector a matrix, without its optional first moment). */
typedef struct state_row {
    const char *name;
    size_t bytes;
} state_row;

static int state_rows(const fr_step *s, state_row *r, size_t *trainable) {
    size_t params = 0, b16 = 0, b8 = 0, af = 0;
    const fr_optim_opts afo = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    for (size_t i = 0; i < s->m->n_params; i++) {
        if (s->gv[i] < 0) continue;
        size_t n = (size_t)fr_shape_numel(&s->m->params[i].shape);
        params += n * 4;
        af += 4 * fr_optim_state_elems(&afo, &s->m->params[i].shape);
        b16 += 2 * fr_state_bytes(fr_state_kind_for(FR_STATE_BF16, n), n);
        b8 += 2 * fr_state_bytes(fr_state_kind_for(FR_STATE_INT8, n), n);
    }
    *trainable = params;
    r[0] = (state_row){"sgd", 0};
    r[1] = (state_row){"sgd+momentum", params};
    r[2] = (state_row){"adam/adamw fp32", 2 * params};
    r[3] = (state_row){"adam/adamw bf16", b16};
    r[4] = (state_row){"adam/adamw int8", b8};
    r[5] = (state_row){"adafactor", af};
    return 6;
}

void fr_step_estimate_table(const fr_step *s, FILE *out, int json) {
    const fr_model *m = s->m;
    fr_ctx *ctx = s->ctx;
    layer_row *rows = fr_calloc(ctx, (m->n_layers + 1) * sizeof *rows, FR_MEM_OTHER);
    if (!rows) {
        fprintf(out, json ? "{\"error\": \"out of memory\"}\n" : "out of memory\n");
        return;
    }
    fill_rows(s, rows);
    size_t pred[FR_MEM_CAT_COUNT], total;
    fr_step_predicted(s, pred, &total);
    size_t input = fr_value_bytes(&s->g.vals[s->g.input]);
    size_t labels = fr_value_bytes(&s->g.vals[s->g.label]);
    char b[7][32], sh[64];
    if (json) {
        fprintf(out, "{\"batch\": %d, \"input_bytes\": %zu, \"label_bytes\": %zu, \"layers\": [",
                s->o.batch, input, labels);
        int first = 1;
        for (size_t i = 0; i < m->n_layers; i++) {
            const fr_layer *l = &m->layers[i];
            if (l->kind == FR_L_RES_SHORTCUT) continue;
            const layer_row *r = &rows[i];
            fr_shape os = with_batch(s->o.batch, l->out_shape);
            fprintf(out,
                    "%s\n  {\"name\": \"%s\", \"type\": \"%s\", \"output_shape\": \"%s\", "
                    "\"weight_bytes\": %zu, \"bias_buffer_bytes\": %zu, \"grad_bytes\": %zu, "
                    "\"optimizer_bytes\": %zu, \"output_bytes\": %zu, \"saved_bytes\": %zu, "
                    "\"workspace_bytes\": %zu}",
                    first ? "" : ",", l->name[0] ? l->name : "end", fr_layer_kind_name(l->kind),
                    fr_shape_str(&os, sh, sizeof sh), r->weight, r->other, r->grads, r->optim,
                    r->output, r->saved, r->workspace);
            first = 0;
        }
        fprintf(out, "\n], \"predicted_peak\": {");
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
            fprintf(out, "%s\"%s\": %zu", c ? ", " : "", fr_mem_cat_name(c), pred[c]);
        state_row sr[6];
        size_t tp;
        int ns = state_rows(s, sr, &tp);
        fprintf(out,
                "}, \"predicted_peak_total\": %zu, \"arena_bytes\": %zu, \"precision\": \"%s\", "
                "\"trainable_param_bytes\": %zu, \"optimizer_state_bytes\": {",
                total, s->plan.arena_bytes, fr_precision_name(s->o.precision), tp);
        for (int i = 0; i < ns; i++)
            fprintf(out, "%s\"%s\": %zu", i ? ", " : "", sr[i].name, sr[i].bytes);
        fprintf(out, "}}\n");
        fr_free(ctx, rows);
        return;
    }
    int nw = fr_model_name_width(m, 16); /* e.g. transformer.h.11.attn.c_attn */
    fprintf(out, "%-*s %-14s %-16s %12s %12s %12s %12s %12s %12s %12s\n", nw, "layer", "type",
            "output", "weight", "bias/buffer", "grad", "optimizer", "output B", "saved",
            "workspace");
    fprintf(out, "%-*s %-14s %-16s %12s %12s %12s %12s %12zu %12s %12s\n", nw, "input", "data",
            fr_shape_str(&s->g.vals[s->g.input].shape, sh, sizeof sh), "", "", "", "", input, "",
            "");
    for (size_t i = 0; i < m->n_layers; i++) {
        const fr_layer *l = &m->layers[i];
        if (l->kind == FR_L_RES_SHORTCUT) continue;
        const layer_row *r = &rows[i];
        fr_shape os = with_batch(s->o.batch, l->out_shape);
        if (fr_model_seq(m) && os.ndim >= 2) os.d[1] = fr_model_seq(m); /* --seq, not the context */
        fprintf(out, "%-*s %-14s %-16s %12zu %12zu %12zu %12zu %12zu %12zu %12zu\n", nw,
                l->name[0] ? l->name : "(end)", fr_layer_kind_name(l->kind),
                fr_shape_str(&os, sh, sizeof sh), r->weight, r->other, r->grads, r->optim,
                r->output, r->saved, r->workspace);
    }
    fprintf(out, "\npredicted peak of one %s step (batch %d):\n",
            s->o.training ? "training" : "eval", s->o.batch);
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++)
        if (pred[c])
            fprintf(out, "  %-12s %14zu B  %10s\n", fr_mem_cat_name(c), pred[c],
                    fr_human_bytes(pred[c], b[0], sizeof b[0]));
    fprintf(out, "  %-12s %14zu B  %10s   (arena %s)\n", "total", total,
            fr_human_bytes(total, b[1], sizeof b[1]),
            fr_human_bytes(s->plan.arena_bytes, b[2], sizeof b[2]));
    if (s->opt.n_fused) {
        size_t kept = 0;
        for (size_t i = 0; i < m->n_params; i++)
            if (s->opt.fused[i])
                kept += (size_t)fr_shape_numel(&m->params[i].shape) * sizeof(float);
        if (s->opt.upd_ws_len)
            fprintf(
                out,
                "\ngradients: plain SGD updates %d Linear tensors inside backward, so their %s\n"
                "of gradients are never stored, only a %s tile of scratch (--keep-grads stores "
                "them)\n",
                s->opt.n_fused, fr_human_bytes(kept, b[5], sizeof b[5]),
                fr_human_bytes(s->opt.upd_ws_len * sizeof(float), b[6], sizeof b[6]));
        else
            fprintf(
                out,
                "\ngradients: %s steps %d tensors inside backward, each as its gradient is made,\n"
                "so their %s of gradients are never all stored: each lives in the arena until\n"
                "its step (--keep-grads stores them)\n",
                fr_optim_title(s->o.optim.kind), s->opt.n_fused,
                fr_human_bytes(kept, b[5], sizeof b[5]));
    }
    size_t qb = 0, qf = 0; /* a frozen base in fewer bits (--base-precision) */
    int nq = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].quant) {
            nq++;
            qb += (size_t)fr_shape_numel(&m->params[i].shape);
            qf += (size_t)fr_param_numel(&m->params[i]) * sizeof(float);
        }
    if (nq)
        fprintf(out,
                "\nfrozen base: %d linear weights stored in %s, %zu B (%s; %s in f32: %.2fx)\n", nq,
                fr_base_precision_name(s->o.base_precision), qb,
                fr_human_bytes(qb, b[5], sizeof b[5]), fr_human_bytes(qf, b[6], sizeof b[6]),
                (double)qb / (double)qf);
    size_t ab = 0; /* adapters (--lora): their weights beside the frozen base */
    int na = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].role == FR_P_LORA_A || m->params[i].role == FR_P_LORA_B)
            na++, ab += (size_t)fr_shape_numel(&m->params[i].shape) * sizeof(float);
    if (na)
        fprintf(out,
                "\nadapters: %d LoRA tensors, %zu B (%s) of weights: with their gradients and "
                "optimizer state\nthe only trained bytes (in each adapted layer's weight column)\n",
                na, ab, fr_human_bytes(ab, b[5], sizeof b[5]));
    for (size_t i = 0; i < (size_t)s->g.n_forward; i++) { /* --fused-head */
        const fr_node *n = &s->g.nodes[i];
        if (n->op != FR_OP_LINEAR_CE) continue;
        const fr_shape *w = &s->g.vals[n->in[1]].shape;
        size_t logits =
            (size_t)(fr_shape_numel(&s->g.vals[n->in[0]].shape) / w->d[1] * w->d[0]) * 4;
        fprintf(out,
                "\nfused head: %s and the loss in chunks of %lld rows, a %s workspace: the %s "
                "of logits\n(and in backward their gradient) are never stored\n",
                m->layers[n->layer].name, (long long)fr_op_ce_chunk_rows(&s->g, n),
                fr_human_bytes(fr_value_bytes(&s->g.vals[n->out[2]]), b[5], sizeof b[5]),
                fr_human_bytes(logits, b[6], sizeof b[6]));
    }
    state_row sr[6];
    size_t tp;
    int ns = state_rows(s, sr, &tp);
    fprintf(out, "\noptimizer state for these %s of trainable weights (precision %s):\n",
            fr_human_bytes(tp, b[3], sizeof b[3]), fr_precision_name(s->o.precision));
    for (int i = 0; i < ns; i++)
        fprintf(out, "  %-16s %14zu B  %10s  %5.2fx the weights\n", sr[i].name, sr[i].bytes,
                fr_human_bytes(sr[i].bytes, b[4], sizeof b[4]),
                tp ? (double)sr[i].bytes / tp : 0.0);
    fr_free(ctx, rows);
}

/* ---- per rank under data parallelism: ZeRO's stages ----------------------
 * The step s is one rank's (its batch the largest slice of the global one,
 * every gradient kept). With P parameter, G gradient and O optimizer-state
 * bytes (the whole model's) on N ranks, a rank holds
 *   stage 0: P + G + O                 (everything replicated; buckets are
 *                                       views of the gradients: no extra)
 *   stage 1: P + G + O/N               (optimizer state sharded)
 *   stage 2: P + G/N + bucket + O/N    (gradients sharded: a bucket's full
 *                                       gradients live from their first writer
 *                                       until reduce-scattered)
 *   stage 3: Pt/N + (P - Pt) + gathered + G/N + bucket + O/N (the Pt
 *                                       trainable parameter bytes sharded)
 * G/N is 0 at stages 2 and 3 when the rank steps each bucket's share as
 * its sums arrive (fr_step_shard_steps: the step inside backward, no
 * gradient shard kept);
 * each shard the largest one of parallel/shard.h's rule (the one the run
 * uses): the E trainable gradient elements end to end, ceil(E/N) of them
 * a rank, so x/N means x/E * ceil(E/N); bucket = the bucket blocks held
 * at the step's worst position by parallel/buckets.h's rule (DDP's caps: at
 * most two of 25 MiB without accumulation, all of G with it); gathered
 * = the bytes of units' weights gathered at the step's worst position, by
 * the walk the run makes over its plan (parallel/pshard.h: each unit's weights
 * from just before its first use to right after its last, in forward and
 * again in backward, the next unit's prefetched). The step's activations,
 * workspace, data and metadata are the rank's own plan's, the same at every
 * stage (fr_step_rank_bytes, train/zero.c, computes them). */

void fr_step_ranks_table(const fr_step *s, int ranks, int zero, FILE *out, int json) {
    size_t per[FR_MEM_CAT_COUNT];
    fr_step_persistent(s, per);
    size_t P = per[FR_MEM_PARAMS], G = per[FR_MEM_GRADS], O = per[FR_MEM_OPTIM];
    char h[6][32];
    if (!json)
        fprintf(out,
                "\nper rank on %d ranks (data parallel, each rank's batch %d; ZeRO's formulas, "
                "P %s, G %s, O %s):\n%-6s %14s %14s %14s %14s %14s %14s\n",
                ranks, s->o.batch, fr_human_bytes(P, h[0], 32), fr_human_bytes(G, h[1], 32),
                fr_human_bytes(O, h[2], 32), "stage", "parameters", "gradients", "optimizer",
                "buckets", "step (rest)", "total");
    else fprintf(out, "{\"ranks\": %d, \"rank_batch\": %d, \"stages\": [", ranks, s->o.batch);
    int first = 1;
    for (int k = 0; k <= 3; k++) {
        if (zero >= 0 && k != zero) continue;
        if (k >= 1 && fr_optim_whole_tensor(&s->o.optim)) continue; /* Adafactor: refused */
        fr_rank_bytes r;
        fr_step_rank_bytes(s, ranks, k, &r);
        if (json)
            fprintf(out,
                    "%s{\"zero\": %d, \"parameters\": %zu, \"gradients\": %zu, \"optimizer\": "
                    "%zu, \"buckets\": %zu, \"rest\": %zu, \"total\": %zu}",
                    first ? "" : ", ", k, r.params, r.grads, r.optim, r.buckets, r.rest, r.total);
        else
            fprintf(out, "%-6d %14s %14s %14s %14s %14s %14s\n", k,
                    fr_human_bytes(r.params, h[0], 32), fr_human_bytes(r.grads, h[1], 32),
                    fr_human_bytes(r.optim, h[2], 32), fr_human_bytes(r.buckets, h[3], 32),
                    fr_human_bytes(r.rest, h[4], 32), fr_human_bytes(r.total, h[5], 32));
        first = 0;
    }
    if (json) fprintf(out, "]}\n");
    else if (fr_optim_whole_tensor(&s->o.optim))
        fprintf(out, "(%s's factored state is not sharded: stage 0 only)\n",
                fr_optim_name(s->o.optim.kind));
    else fprintf(out, "(`mpirun -np %d frugal train --zero K` runs each stage)\n", ranks);
}
