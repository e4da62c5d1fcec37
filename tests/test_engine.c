/* test_engine.c — the engine as a whole through the C API: the seed's byte
 * arithmetic, predicted versus measured step memory, the arena's placement
 * (values live together never share bytes), eval with no backward
 * state, determinism, allocation failure at every point of a training step,
 * and a non-finite loss refused before the weights change. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fault_sweep.h"
#include "core/rng.h"
#include "plan/plan.h"
#include "train/step.h"

static fr_model *seed_mlp(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1000, 1, 1);
    if (!m) return NULL;
    if (fr_model_linear(m, 2000, 1) || fr_model_relu(m) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

typedef struct data {
    float *x;
    int32_t *y;
} data;

static data make_data(int n, int d, uint64_t seed) {
    data b = {malloc((size_t)n * d * sizeof(float)), malloc((size_t)n * sizeof(int32_t))};
    fr_rng r = fr_rng_make(seed, 3);
    for (int i = 0; i < n * d; i++) b.x[i] = fr_rng_next_uniform(&r);
    for (int i = 0; i < n; i++) b.y[i] = (int32_t)fr_rng_below(&r, 10);
    return b;
}

/* The seed document's arithmetic for Linear(1000,2000)-ReLU-Linear(2000,10), batch 32, fp32. */
static void test_seed_arithmetic(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = seed_mlp(ctx);
    /* keep_grads: the tutorial's loop, which stores every gradient (by default
     * plain SGD updates Linear layers inside backward: test_fused_sgd) */
    fr_step_opts o = {.batch = 32,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_SGD),
                      .seed = 1,
                      .keep_grads = 1};
    fr_step *s = fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    if (!s) return;
    CHECK(fr_value_bytes(&s->g.vals[s->g.input]) == 32 * 1000 * 4, "input 128,000 B");
    CHECK(strcmp(m->params[0].name, "0.weight") == 0, "state_dict name %s", m->params[0].name);
    CHECK(fr_shape_numel(&m->params[0].shape) * 4 == 8000000, "first weight 8,000,000 B");
    CHECK(fr_value_bytes(&s->g.vals[s->g.nodes[0].out[0]]) == 32 * 2000 * 4,
          "first output 256,000 B");
    CHECK(fr_shape_numel(&m->params[2].shape) * 4 == 80000, "second weight 80,000 B");
    size_t pred[FR_MEM_CAT_COUNT], total;
    fr_step_predicted(s, pred, &total);
    /* By hand: params = grads = (2000*1000 + 2000 + 10*2000 + 10) * 4 = 8,088,040 B; SGD without
     * momentum keeps no state. Saved for backward: the ReLU output (256,000 B, which fc1's
     * output becomes in place) and its view into fc2 + logits (1,280 B kept to the end). */
    CHECK(pred[FR_MEM_PARAMS] == 8088040, "params %zu", pred[FR_MEM_PARAMS]);
    CHECK(pred[FR_MEM_GRADS] == 8088040, "grads %zu", pred[FR_MEM_GRADS]);
    CHECK(pred[FR_MEM_OPTIM] == 0, "SGD keeps no state: %zu", pred[FR_MEM_OPTIM]);
    CHECK(pred[FR_MEM_ACTIVATIONS] == 256000 + 1280, "activations %zu", pred[FR_MEM_ACTIVATIONS]);
    fr_step_free(s);
    o.optim = fr_optim_defaults(FR_OPTIM_ADAM);
    s = fr_step_compile(m, &o);
    fr_step_predicted(s, pred, &total);
    CHECK(pred[FR_MEM_OPTIM] == 2 * 8088040, "Adam keeps two copies: %zu", pred[FR_MEM_OPTIM]);
    fr_step_free(s);
    /* Adafactor: a row and a column a matrix, a vector its own:
     * (2000 + 1000) + 2000 + (10 + 2000) + 10 = 7,020 floats = 28,080 B */
    o.optim = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    s = fr_step_compile(m, &o);
    fr_step_predicted(s, pred, &total);
    CHECK(pred[FR_MEM_OPTIM] == 28080, "Adafactor's factors: %zu", pred[FR_MEM_OPTIM]);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* The executor's accounting of step values must reach exactly the planned
 * peak, and everything must be released at the end. */
static void test_predicted_equals_measured(void) {
    for (int which = 0; which < 4; which++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = which % 2 ? residual_cnn(ctx) : seed_mlp(ctx);
        int d = which % 2 ? 144 : 1000, n = 16;
        fr_step_opts o = {.batch = n,
                          .training = 1,
                          .optim =
                              fr_optim_defaults(which < 2 ? FR_OPTIM_ADAM : FR_OPTIM_ADAFACTOR),
                          .seed = 1};
        fr_step *s = fr_step_compile(m, &o);
        CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
        if (!s) continue;
        data b = make_data(n, d, 5);
        fr_mem_stats before, after;
        fr_mem_get_stats(ctx, &before);
        fr_mem_reset_peak(ctx);
        fr_batch batch = {n, b.x, b.y, NULL, NULL};
        float loss;
        CHECK(fr_step_run(s, &batch, &loss, NULL) == FR_OK, "run: %s", fr_last_error(ctx));
        fr_mem_get_stats(ctx, &after);
        /* step values: activations, workspace, and the gradients stepped in
         * backward (arena values above the persistent gradients) */
        size_t step_peak = after.allocated_peak[FR_MEM_ACTIVATIONS] +
                           after.allocated_peak[FR_MEM_WORKSPACE] +
                           (after.allocated_peak[FR_MEM_GRADS] - before.allocated[FR_MEM_GRADS]);
        /* what stays: the step's planned GEMM scratch (oneDNN's matmuls, held
         * across steps as workspace: train/place.c), nothing else */
        size_t held = s->place.scratch ? s->place.gemm_ws * sizeof(float) : 0;
        CHECK(after.allocated[FR_MEM_ACTIVATIONS] == 0 && after.allocated[FR_MEM_WORKSPACE] == held,
              "step values released at the end of the step (workspace %zu, the GEMM scratch %zu)",
              after.allocated[FR_MEM_WORKSPACE], held);
        size_t pred[FR_MEM_CAT_COUNT], total;
        fr_step_predicted(s, pred, &total);
        CHECK(after.allocated_peak[FR_MEM_OPTIM] == pred[FR_MEM_OPTIM] && pred[FR_MEM_OPTIM] > 0,
              "%s: optimizer state measured %zu, predicted %zu", fr_optim_name(o.optim.kind),
              after.allocated_peak[FR_MEM_OPTIM], pred[FR_MEM_OPTIM]);
        CHECK(after.allocated_peak[FR_MEM_ACTIVATIONS] == s->plan.peak[FR_MEM_ACTIVATIONS],
              "activations: measured %zu, predicted %zu", after.allocated_peak[FR_MEM_ACTIVATIONS],
              s->plan.peak[FR_MEM_ACTIVATIONS]);
        CHECK(step_peak >= s->plan.peak_total && s->plan.arena_bytes >= s->plan.peak_total,
              "arena %zu holds the step peak %zu", s->plan.arena_bytes, s->plan.peak_total);
        /* The arena never needs more than all step values side by side. */
        size_t all = 0;
        for (size_t v = 0; v < s->g.n_vals; v++)
            if (s->plan.offset[v] >= 0 && s->g.vals[v].alias_of < 0)
                all += fr_value_bytes(&s->g.vals[v]);
        CHECK(s->plan.arena_bytes < all, "liveness reuses memory: arena %zu < %zu",
              s->plan.arena_bytes, all);
        free(b.x);
        free(b.y);
        fr_step_free(s);
        fr_model_free(m);
        fr_mem_stats end;
        fr_mem_get_stats(ctx, &end);
        CHECK(end.allocated_total == 0, "leak: %zu bytes", end.allocated_total);
        fr_ctx_free(ctx);
    }
}

/* The arena's placement (plan.c: in-order best fit, or greedy by size
 * where that needs less): any two step values live at the same time have
 * disjoint bytes, except a value and the one an op writes over it in place
 * (which takes its storage at the node where it dies). Lifetimes here from
 * the plan's order alone: a value is live from its producer's position to
 * the last reader of it or of a view of it (the kept loss, logits and hits
 * to the end), both inclusive. */
static int root_val(const fr_graph *g, int v) {
    while (g->vals[v].alias_of >= 0) v = g->vals[v].alias_of;
    return v;
}

static void check_disjoint(const fr_step *s, const char *what) {
    const fr_graph *g = &s->g;
    const fr_plan *p = &s->plan;
    const int nv = (int)g->n_vals, n = p->n_nodes;
    int *start = malloc((size_t)nv * sizeof *start), *end = malloc((size_t)nv * sizeof *end);
    for (int v = 0; v < nv; v++) start[v] = -1, end[v] = -1;
    for (int i = 0; i < n; i++) {
        const fr_node *nd = &g->nodes[p->order[i]];
        for (int k = 0; k < nd->n_out; k++) {
            int o = nd->out[k];
            if (o >= 0 && g->vals[o].producer == p->order[i] && start[o] < 0) start[o] = end[o] = i;
        }
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= 0) {
                int r = root_val(g, nd->in[j]);
                if (end[r] < i) end[r] = i;
            }
    }
    const int kept[3] = {g->loss, g->logits, g->hits};
    for (int k = 0; k < 3; k++)
        if (kept[k] >= 0) end[root_val(g, kept[k])] = n;
    long long pairs = 0, bad = 0;
    for (int u = 0; u < nv; u++) {
        const fr_value *a = &g->vals[u];
        if (a->kind != FR_VAL_STEP || a->alias_of >= 0 || p->offset[u] < 0 || start[u] < 0)
            continue;
        const int64_t ua = p->offset[u], uz = ua + (int64_t)fr_value_bytes(a);
        for (int v = u + 1; v < nv; v++) {
            const fr_value *b = &g->vals[v];
            if (b->kind != FR_VAL_STEP || b->alias_of >= 0 || p->offset[v] < 0 || start[v] < 0)
                continue;
            if (start[u] > end[v] || start[v] > end[u]) continue;
            pairs++;
            const int64_t va = p->offset[v], vz = va + (int64_t)fr_value_bytes(b);
            if (ua >= vz || va >= uz || ua == uz || va == vz) continue;
            /* in place: the later one made where the earlier dies, by a reader of it */
            int first = start[u] <= start[v] ? u : v, second = first == u ? v : u;
            const fr_node *pn = &g->nodes[g->vals[second].producer];
            int reads = 0;
            for (int j = 0; j < pn->n_in; j++)
                reads |= pn->in[j] >= 0 && root_val(g, pn->in[j]) == first;
            if (end[first] == start[second] && reads && p->offset[first] == p->offset[second])
                continue;
            if (bad++ < 3)
                CHECK(0, "%s: values %d [%d, %d] and %d [%d, %d] share bytes", what, u, start[u],
                      end[u], v, start[v], end[v]);
        }
    }
    CHECK(bad == 0 && pairs > 0, "%s: %lld of %lld pairs live together overlap", what, bad, pairs);
    free(start), free(end);
}

static void test_plan_disjoint(void) {
    const char *models[] = {"cnn", "resnet", "gpt-tiny", "mlp"};
    for (int k = 0; k < 4; k++)
        for (int prec = 0; prec < 2; prec++) {
            fr_ctx *ctx = fr_ctx_new();
            fr_model *m = fr_model_load(ctx, models[k]);
            CHECK(m != NULL, "load %s: %s", models[k], fr_last_error(ctx));
            if (!m) {
                fr_ctx_free(ctx);
                continue;
            }
            fr_step_opts o = {.batch = k == 2 ? 2 : 16,
                              .training = 1,
                              .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                              .seed = 1,
                              .precision = prec ? FR_PREC_BF16_MIXED : FR_PREC_FP32};
            fr_step *s = fr_step_compile(m, &o);
            CHECK(s != NULL, "compile %s: %s", models[k], fr_last_error(ctx));
            if (s) {
                char what[64];
                snprintf(what, sizeof what, "%s %s", models[k], prec ? "bf16-mixed" : "fp32");
                check_disjoint(s, what);
                fr_step_free(s);
            }
            fr_model_free(m);
            fr_ctx_free(ctx);
        }
}

/* Eval: no backward nodes, no gradients, no optimizer state, nothing saved. */
static void test_eval_has_no_backward_state(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = residual_cnn(ctx);
    fr_model_init(m, 3);
    fr_mem_reset_peak(ctx);
    fr_step_opts o = {
        .batch = 8, .training = 0, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 1};
    fr_step *s = fr_step_compile(m, &o);
    data b = make_data(8, 144, 9);
    fr_batch batch = {8, b.x, b.y, NULL, NULL};
    float loss;
    CHECK(s && fr_step_run(s, &batch, &loss, NULL) == FR_OK, "eval run: %s", fr_last_error(ctx));
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    CHECK(st.allocated_peak[FR_MEM_GRADS] == 0, "eval allocated %zu gradient bytes",
          st.allocated_peak[FR_MEM_GRADS]);
    CHECK(st.allocated_peak[FR_MEM_OPTIM] == 0, "eval allocated optimizer state");
    CHECK(st.allocated_peak[FR_MEM_ACTIVATIONS] == 0, "eval saved %zu bytes for backward",
          st.allocated_peak[FR_MEM_ACTIVATIONS]);
    int bwd = 0;
    for (size_t i = 0; s && i < s->g.n_nodes; i++) bwd += s->g.nodes[i].fwd >= 0;
    CHECK(bwd == 0, "eval graph has %d backward nodes", bwd);
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* Same seed, same threads: the same losses bit for bit (dropout included). */
static void run_losses(float *out, int steps) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = residual_cnn(ctx);
    fr_model_init(m, 11);
    fr_step_opts o = {
        .batch = 16, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 11};
    fr_step *s = fr_step_compile(m, &o);
    data b = make_data(16, 144, 13);
    fr_batch batch = {16, b.x, b.y, NULL, NULL};
    for (int i = 0; i < steps; i++) fr_step_run(s, &batch, &out[i], NULL);
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

static void test_determinism(void) {
    float a[6], b[6];
    run_losses(a, 6);
    run_losses(b, 6);
    CHECK(memcmp(a, b, sizeof a) == 0, "losses differ between identical runs");
    CHECK(a[5] < a[0], "training on one batch lowers its loss: %g -> %g", a[0], a[5]);
}

/* Make the n-th allocation fail for every n across building, compiling and
 * running a training step: each failure is reported and leaks nothing. */
/* Two Adam steps of the CNN from model creation on. */
static fr_status cnn_steps(fr_ctx *ctx, void *arg) {
    (void)arg;
    fr_model *m = residual_cnn(ctx);
    fr_step *s = NULL;
    fr_status st = m ? fr_model_init(m, 1) : FR_ERR_NOMEM;
    fr_step_opts o = {
        .batch = 4, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 1};
    o.optim.zero_grad_to_none = 1;
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    data b = make_data(4, 144, 1);
    fr_batch batch = {4, b.x, b.y, NULL, NULL};
    float loss;
    for (int k = 0; k < 2 && !st; k++) st = fr_step_run(s, &batch, &loss, NULL);
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    return st;
}

static void test_allocation_failures(void) { fault_sweep("allocation failure", cnn_steps, NULL); }

/* A non-finite loss stops the step before the optimizer touches the weights. */
static void test_nonfinite_loss(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = seed_mlp(ctx);
    fr_step_opts o = {
        .batch = 4, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = 1};
    fr_step *s = fr_step_compile(m, &o);
    data b = make_data(4, 1000, 2);
    b.x[5] = NAN;
    float before = ((float *)m->params[0].data)[0], loss;
    fr_batch batch = {4, b.x, b.y, NULL, NULL};
    fr_status st = fr_step_run(s, &batch, &loss, NULL);
    CHECK(st == FR_ERR_NUMERIC && strstr(fr_last_error(ctx), "non-finite loss"), "status %d: %s",
          st, fr_last_error(ctx));
    CHECK(((float *)m->params[0].data)[0] == before, "weights unchanged");
    b.y[0] = 12;
    b.x[5] = 0;
    st = fr_step_run(s, &batch, &loss, NULL);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx), "12"), "label out of range: %s",
          fr_last_error(ctx));
    free(b.x);
    free(b.y);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* Shapes that do not chain are refused with a message. */
static void test_shape_errors(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_new(ctx, 1, 28, 28);
    CHECK(fr_model_linear(m, 10, 1) == FR_ERR_SHAPE && strstr(fr_last_error(ctx), "flatten"), "%s",
          fr_last_error(ctx));
    fr_model_conv2d(m, 8, 3, 2, 0, 1);
    fr_model_residual_begin(m);
    fr_model_conv2d(m, 16, 3, 1, 1, 1);
    CHECK(fr_model_residual_end(m) == FR_ERR_SHAPE && strstr(fr_last_error(ctx), "shortcut"), "%s",
          fr_last_error(ctx));
    fr_model_free(m);
    fr_ctx_free(ctx);
}

int main(void) {
    test_seed_arithmetic();
    test_predicted_equals_measured();
    test_plan_disjoint();
    test_eval_has_no_backward_state();
    test_determinism();
    test_nonfinite_loss();
    test_shape_errors();
    test_allocation_failures();
    return check_done();
}
