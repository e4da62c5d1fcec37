/* test_offload_planner.c — under --budget on a device the planner weighs
 * moving the saved activations to the host against recomputing them
 * (planner.c). On the first OpenCL device (skipped without one), with the
 * device's measured rates replaced by set ones (a copy of the backend's
 * table with its copy_rate, flop_rate and copy_overlap swapped), for an MLP
 * whose saved activations are large beside its weights (16 x (linear 64,
 * relu) at batch 1024: 4 MiB of saved activations, 0.8 MiB of weights and
 * Adam state), under a budget that the plan keeping everything on the
 * device does not fit and that offloading the optimizer alone cannot reach:
 *   - copies cheap (1 PB/s against 1 GFLOP/s): the planner offloads the
 *     activations and recomputes nothing;
 *   - copies dear (1 kB/s): it recomputes and offloads no activation;
 *   - the plan's JSON states the offloaded bytes, counted here from the
 *     graph (the inputs of OFFLOAD nodes), and the cost the model of
 *     planner.c gives, recomputed here by hand from those bytes, the step's
 *     FLOPs and the set rates: 2 B / bw exposed on a device whose copies
 *     share its cores (overlap 0), and nothing exposed when a copy engine
 *     hides them (overlap 1) and they take less than a third of the
 *     step's compute. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"
#include "frugal.h"
#include "train/step.h"
#ifdef FR_HAVE_OPENCL
#include "cl_device.h"

enum { WIDTH = 64, DEPTH = 16, BATCH = 1024 };

static double set_copy, set_flop, set_overlap;
static double copy_rate(fr_ctx *ctx) { return (void)ctx, set_copy; }
static double flop_rate(fr_ctx *ctx) { return (void)ctx, set_flop; }
static double copy_overlap(fr_ctx *ctx) { return (void)ctx, set_overlap; }

static fr_model *mlp(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, WIDTH, 1, 1);
    for (int i = 0; m && i < DEPTH; i++)
        if (fr_model_linear(m, WIDTH, 1) || fr_model_relu(m)) {
            fr_model_free(m);
            return NULL;
        }
    if (m && fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

static fr_step_opts opts(int offload, size_t budget) {
    fr_step_opts o = {.batch = BATCH,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .offload = offload,
                      .budget = budget};
    return o;
}

/* The reserved bytes of the plan as given (no planner). */
static size_t reserved_of(fr_model *m, int offload) {
    fr_step_opts o = opts(offload, 0);
    fr_step *s = fr_step_build(m, &o);
    CHECK(s != NULL, "build: %s", fr_last_error(m->ctx));
    if (!s) return 0;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    fr_step_free(s);
    return info.reserved;
}

/* Bytes the OFFLOAD nodes of s copy down, from the graph. */
static size_t offloaded_bytes(const fr_step *s) {
    size_t b = 0;
    for (int i = 0; i < s->plan.n_nodes; i++) {
        const fr_node *nd = &s->g.nodes[s->plan.order[i]];
        if (nd->op == FR_OP_OFFLOAD) b += fr_value_bytes(&s->g.vals[nd->in[0]]);
    }
    return b;
}

/* A number after "key": in JSON text; NAN when absent. */
static double json_num(const char *text, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static char *plan_json(const fr_step *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    fr_step_describe_plan(s, f, 1);
    fclose(f);
    return buf;
}

typedef struct choice {
    int offload, recomputed;
    size_t reserved, bytes;
    double cost, flops; /* the JSON's offload_activations cost; the step's FLOPs */
} choice;

static int choose(fr_model *m, size_t budget, choice *c) {
    memset(c, 0, sizeof *c);
    fr_step_opts o = opts(0, budget);
    fr_plan_need need;
    fr_step *s = fr_step_plan_choose(m, &o, &need);
    CHECK(s != NULL, "the planner found no plan under %zu: %s", budget, fr_last_error(m->ctx));
    if (!s) return 1;
    fr_plan_info info;
    fr_step_plan_info(s, &info);
    c->offload = s->o.offload;
    c->recomputed = info.recomputed_units;
    c->reserved = info.reserved;
    c->bytes = offloaded_bytes(s);
    c->flops = info.flops - info.extra_flops;
    char *j = plan_json(s);
    CHECK(j != NULL, "describing the plan");
    if (j) {
        const char *want = c->offload & FR_OFFLOAD_ACTIVATIONS ? "activations" : "none";
        CHECK(strstr(j, want) != NULL, "the plan's JSON names no '%s': %.300s", want, j);
        if (c->offload & FR_OFFLOAD_ACTIVATIONS) {
            CHECK((size_t)json_num(j, "bytes") == c->bytes,
                  "JSON offload_activations.bytes %.0f, the graph's OFFLOAD inputs %zu",
                  json_num(j, "bytes"), c->bytes);
            c->cost = json_num(j, "cost");
        }
        free(j);
    }
    fr_step_free(s);
    return 0;
}

int main(void) {
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_backend fake = *fr_backend_of(ctx);
    fake.copy_rate = copy_rate;
    fake.flop_rate = flop_rate;
    fake.copy_overlap = copy_overlap;
    ctx->be = &fake;
    fr_model *m = mlp(ctx);
    CHECK(m && !fr_model_init(m, 1), "model: %s", fr_last_error(ctx));
    if (!m) return check_done();
    size_t whole = reserved_of(m, 0), act = reserved_of(m, FR_OFFLOAD_ACTIVATIONS),
           opt = reserved_of(m, FR_OFFLOAD_OPTIMIZER);
    /* below keeping everything and below the optimizer offloaded alone, at
     * or above the activations offloaded */
    size_t budget = act + (whole - act) / 4;
    printf("reserved: everything on the device %zu, optimizer on the host %zu, activations on "
           "the host %zu; budget %zu\n",
           whole, opt, act, budget);
    CHECK(act < whole && budget < opt && budget < whole,
          "the MLP does not separate the plans: %zu / %zu / %zu", whole, opt, act);

    choice cheap, dear, hidden;
    set_copy = 1e15, set_flop = 1e9, set_overlap = 0;
    if (!choose(m, budget, &cheap)) {
        printf("copies at 1 PB/s: offload %d, %d unit forwards recomputed, reserved %zu, "
               "%zu bytes offloaded, cost %.3g\n",
               cheap.offload, cheap.recomputed, cheap.reserved, cheap.bytes, cheap.cost);
        CHECK((cheap.offload & FR_OFFLOAD_ACTIVATIONS) && cheap.recomputed == 0,
              "cheap copies: the planner chose offload %d with %d recomputed unit forwards",
              cheap.offload, cheap.recomputed);
        CHECK(cheap.reserved <= budget, "the choice holds %zu over the budget %zu", cheap.reserved,
              budget);
        /* the model, by hand: 2 B / bw exposed, over the step's time F / fl */
        double want = (2.0 * (double)cheap.bytes / set_copy) / (cheap.flops / set_flop);
        CHECK(fabs(cheap.cost - want) <= 1e-4 * want, "cost %.6g in the plan, %.6g by hand",
              cheap.cost, want);
    }
    set_copy = 1e3;
    if (!choose(m, budget, &dear)) {
        printf("copies at 1 kB/s: offload %d, %d unit forwards recomputed, reserved %zu\n",
               dear.offload, dear.recomputed, dear.reserved);
        CHECK(!(dear.offload & FR_OFFLOAD_ACTIVATIONS) && dear.recomputed > 0,
              "dear copies: the planner chose offload %d with %d recomputed unit forwards",
              dear.offload, dear.recomputed);
        CHECK(dear.reserved <= budget, "the choice holds %zu over the budget %zu", dear.reserved,
              budget);
    }
    /* a copy engine (overlap 1) and copies of a tenth of the step's compute
     * time: hidden, no cost */
    set_overlap = 1, set_copy = 1e9;
    if (!choose(m, budget, &hidden) && (hidden.offload & FR_OFFLOAD_ACTIVATIONS)) {
        double copy_s = 2.0 * (double)hidden.bytes / set_copy, t = hidden.flops / set_flop;
        printf("copies %.3g s beside %.3g s of compute with a copy engine: cost %.3g\n", copy_s, t,
               hidden.cost);
        CHECK(copy_s / 2 < t / 3 && hidden.cost == 0,
              "hidden copies cost %.6g (copies %.3g s, "
              "compute %.3g s)",
              hidden.cost, copy_s, t);
    } else {
        CHECK(0, "with hidden copies the planner chose offload %d", hidden.offload);
    }
    fr_model_free(m);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
#else
int main(void) {
    puts("skipped: built without OpenCL");
    return 77;
}
#endif
