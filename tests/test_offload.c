/* test_offload.c — --offload activations (fr_step_opts.offload &
 * FR_OFFLOAD_ACTIVATIONS, plan/offload.c). For a small CNN (BatchNorm, a
 * residual block, max-pool, dropout) and the small GPT of
 * tests/data/small_gpt.model, on the CPU backend and on the first OpenCL
 * device when there is one, three Adam steps with and without offload:
 *   - the losses are the same bits (OFFLOAD and FETCH copy bytes; every
 *     kernel reads the same values);
 *   - the graph: each offloaded value goes to a host value and comes back
 *     through a fetched copy, read only after the loss; no backward node
 *     reads an offloaded value itself;
 *   - the step's planned peak falls by at least the offloaded bytes that
 *     sit on the host at the new peak's position (every other value is live
 *     there in both plans alike); the arena falls; on the device the
 *     measured allocated peak falls by exactly the plan's fall and the
 *     reserved peak falls. (The bound "offloaded minus the most fetched
 *     bytes live at once" holds only where the old peak is at the end of
 *     forward: it is printed, not checked; see the CNN on the device, whose
 *     peak is the first conv's backward with its workspace.)
 *   - predicted == measured: the device's activations peak is the plan's;
 *     its reserved peak is fr_dev_step_reserved; the host's activations hold
 *     exactly the host block of the offloaded values, which
 *     fr_step_persistent predicts (on the CPU, block plus the plan's peak);
 *     on the CPU the host's reserved peak is fr_step_reserved;
 *   - the prefetch: every FETCH the pass could move stands ahead of its
 *     first reader, and the planned peak is no higher than with each FETCH
 *     right before its reader (that order's plan built here); the waits
 *     the executor issues on a device (fr_offload_waits) are at each
 *     fetched value's first reader and at the first value made over each
 *     offloaded value's arena bytes, found here from producers and offsets;
 *   - every host allocation of an offloaded CPU step made to fail in turn:
 *     a clean out-of-memory each time, nothing leaked.
 * The expected bytes are counted here from the graph and the order the step
 * runs (values feeding OFFLOAD nodes, lifetimes of FETCH outputs), not taken
 * from the pass's own tallies, which are checked against them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fault_sweep.h"
#include "core/ctx.h"
#include "core/rng.h"
#include "frugal.h"
#include "core/mem.h"
#include "plan/offload.h"
#include "train/place.h"
#include "train/step.h"
#ifdef FR_HAVE_OPENCL
#include "backend/opencl/backend.h"
#endif

enum { STEPS = 3, N = 8 };

typedef struct result {
    float loss[STEPS];
    int n_off;                 /* offloaded values (the pass's count) */
    size_t off_bytes;          /* their bytes, counted here */
    size_t host_block;         /* the host block, 64-aligned per value, counted here */
    size_t fetched_live;       /* the most fetched bytes live at one position */
    size_t host_at_peak;       /* offloaded bytes on the host at the plan's peak position */
    size_t arena, plan_peak;   /* the plan */
    size_t plan_act;           /* the plan's activations peak */
    size_t pred_host_act;      /* fr_step_persistent's activations */
    size_t host_act_peak;      /* measured on the host */
    size_t host_act_after;     /* host activations while the step is compiled, between runs */
    size_t dev_act_peak;       /* measured on the device (0 on the CPU) */
    size_t dev_alloc_peak;     /* measured, all categories */
    size_t dev_reserved_peak;  /* measured */
    size_t dev_reserved_pred;  /* fr_dev_step_reserved */
    size_t host_reserved_meas; /* CPU: the host's reserved peak over the step's life */
    size_t host_reserved_pred; /* fr_step_reserved less the batch it counts */
    int graph_ok;              /* the rewiring checks */
    int prefetched;            /* FETCHes with a node between them and their first reader */
    int n_fetch;               /* FETCH nodes */
    size_t jit_peak;           /* the plan's peak with every FETCH right before its reader */
    int waits_ok;              /* fr_offload_waits against the plan, checked here */
} result;

static fr_model *small_cnn(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 3, 16, 16);
    if (!m) return NULL;
    if (fr_model_conv2d(m, 8, 3, 1, 1, 1) || fr_model_batchnorm(m) || fr_model_relu(m) ||
        fr_model_residual_begin(m) || fr_model_conv2d(m, 8, 3, 1, 1, 0) || fr_model_batchnorm(m) ||
        fr_model_relu(m) || fr_model_residual_end(m) || fr_model_maxpool2d(m, 2, 2) ||
        fr_model_conv2d(m, 16, 3, 1, 1, 1) || fr_model_relu(m) || fr_model_flatten(m) ||
        fr_model_dropout(m, 0.2f) || fr_model_linear(m, 32, 1) || fr_model_relu(m) ||
        fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

static fr_model *small_gpt(fr_ctx *ctx) {
    const char *src = getenv("FR_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/small_gpt.model", src ? src : "..");
    return fr_model_load(ctx, path);
}

/* The step's batch: random images and labels, or random token ids and
 * next tokens (the same every run). */
typedef struct data {
    float *x;
    int32_t *idx, *y;
} data;

static data make_data(int gpt) {
    data d = {0};
    fr_rng r = fr_rng_make(11, 2);
    if (gpt) {
        d.idx = malloc(N * 32 * sizeof *d.idx);
        d.y = malloc(N * 32 * sizeof *d.y);
        for (int i = 0; i < N * 32; i++) d.idx[i] = (int32_t)fr_rng_below(&r, 256);
        for (int i = 0; i < N * 32; i++) d.y[i] = (int32_t)fr_rng_below(&r, 256);
    } else {
        d.x = malloc(N * 3 * 16 * 16 * sizeof *d.x);
        d.y = malloc(N * sizeof *d.y);
        for (int i = 0; i < N * 3 * 16 * 16; i++) d.x[i] = 2 * fr_rng_next_uniform(&r) - 1;
        for (int i = 0; i < N; i++) d.y[i] = (int32_t)fr_rng_below(&r, 10);
    }
    return d;
}

/* The position of the first node at or after k that reads v (n: none). */
static int first_reader(const fr_graph *g, const fr_plan *p, int v, int k) {
    for (; k < p->n_nodes; k++) {
        const fr_node *nd = &g->nodes[p->order[k]];
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] == v) return k;
    }
    return p->n_nodes;
}

/* The prefetch: how many FETCHes stand ahead of their first reader; the
 * peak of the same order with every FETCH moved right before its reader
 * (the plan without prefetch, built here); and the executor's waits
 * (fr_offload_waits) against the plan: a FETCH waited for at its first
 * reader, an OFFLOAD at the first node that makes a value over its bytes in
 * the arena (found here from each value's producer position and offset). */
static void check_prefetch(const fr_step *s, result *r) {
    const fr_graph *g = &s->g;
    const fr_plan *p = &s->plan;
    int n = p->n_nodes, *jit = malloc((size_t)n * sizeof *jit), w = 0;
    int *at = malloc((size_t)n * sizeof *at), *pos = malloc(g->n_nodes * sizeof *pos);
    uint8_t *keep = calloc(g->n_vals, 1);
    r->waits_ok = 1;
    for (size_t i = 0; i < g->n_nodes; i++) pos[i] = -1;
    for (int k = 0; k < n; k++) pos[p->order[k]] = k;
    fr_offload_waits(g, p, at);
    for (int k = 0; k < n; k++) { /* the order without prefetch */
        const fr_node *nd = &g->nodes[p->order[k]];
        if (nd->op == FR_OP_FETCH) {
            int rd = first_reader(g, p, nd->out[0], k + 1);
            r->n_fetch++;
            r->prefetched += rd > k + 1;
            if (at[k] != rd) r->waits_ok = 0;
            continue;
        }
        for (int q = 0; q < k; q++) { /* fetches whose first reader is this node */
            const fr_node *f = &g->nodes[p->order[q]];
            if (f->op == FR_OP_FETCH && first_reader(g, p, f->out[0], q + 1) == k)
                jit[w++] = p->order[q];
        }
        jit[w++] = p->order[k];
        if (nd->op == FR_OP_OFFLOAD) {
            int x = nd->in[0], first = n;
            int64_t lo = p->offset[x], hi = lo + (int64_t)fr_value_bytes(&g->vals[x]);
            for (size_t u = 0; u < g->n_vals; u++) {
                const fr_value *val = &g->vals[u];
                if (val->producer < 0 || val->alias_of >= 0 || p->offset[u] < 0) continue;
                int made = pos[val->producer];
                int64_t a = p->offset[u], z = a + (int64_t)fr_value_bytes(val);
                if (made > k && made < first && a < hi && lo < z) first = made;
            }
            if (at[k] != first) r->waits_ok = 0;
        } else if (at[k] != -1) {
            r->waits_ok = 0;
        }
    }
    keep[g->loss] = keep[g->logits] = 1;
    fr_plan q;
    if (w == n && fr_plan_build((fr_graph *)g, keep, jit, n, &q) == FR_OK) {
        r->jit_peak = q.peak_total;
        fr_plan_release(&q);
    }
    free(jit);
    free(at);
    free(pos);
    free(keep);
}

/* What the graph says was offloaded, counted from the nodes in the order:
 * OFFLOAD's inputs (bytes), their host values (the block), the fetched
 * copies' lifetimes (the most live at once); and whether every backward
 * reader of an offloaded value reads its fetched copy instead. */
static void count_graph(const fr_step *s, result *r) {
    const fr_graph *g = &s->g;
    const fr_plan *p = &s->plan;
    int n = p->n_nodes, loss_pos = -1;
    int *last = calloc(g->n_vals, sizeof *last), *born = calloc(g->n_vals, sizeof *born);
    uint8_t *moved = calloc(g->n_vals, 1);
    r->graph_ok = 1;
    for (int k = 0; k < n; k++)
        for (int j = 0; j < g->nodes[p->order[k]].n_out; j++)
            if (g->nodes[p->order[k]].out[j] == g->loss) loss_pos = k;
    for (int k = 0; k < n; k++) {
        const fr_node *nd = &g->nodes[p->order[k]];
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= 0) last[nd->in[j]] = k;
        if (nd->op == FR_OP_OFFLOAD) {
            const fr_value *x = &g->vals[nd->in[0]], *h = &g->vals[nd->out[0]];
            size_t b = (size_t)fr_shape_numel(&x->shape) * fr_dtype_size(x->dtype);
            r->off_bytes += b;
            r->host_block += (b + 63) / 64 * 64;
            moved[nd->in[0]] = 1;
            if (h->kind != FR_VAL_HOST || p->offset[nd->out[0]] >= 0 || k > loss_pos)
                r->graph_ok = 0;
        }
        if (nd->op == FR_OP_FETCH) {
            born[nd->out[0]] = k;
            if (g->vals[nd->in[0]].kind != FR_VAL_HOST || p->offset[nd->out[0]] < 0 ||
                k <= loss_pos)
                r->graph_ok = 0;
        }
    }
    for (int k = loss_pos + 1; k < n; k++) { /* backward reads no offloaded value itself */
        const fr_node *nd = &g->nodes[p->order[k]];
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] >= 0 && moved[nd->in[j]] && nd->op != FR_OP_OFFLOAD) r->graph_ok = 0;
    }
    /* On the host at position k: offloaded at an earlier position, fetched
     * at a later one. Every other value is live at k in both plans alike, so
     * the plan without offload holds these bytes more at the same point. */
    for (int k = 0; k < n; k++) {
        const fr_node *nd = &g->nodes[p->order[k]];
        if (nd->op != FR_OP_OFFLOAD || k >= p->peak_node) continue;
        int fetch_at = -1;
        for (int q = k + 1; q < n; q++)
            if (g->nodes[p->order[q]].op == FR_OP_FETCH &&
                g->nodes[p->order[q]].in[0] == nd->out[0])
                fetch_at = q;
        if (fetch_at > p->peak_node) r->host_at_peak += fr_value_bytes(&g->vals[nd->in[0]]);
    }
    for (int k = 0; k < n; k++) { /* fetched bytes live at position k */
        size_t live = 0;
        for (int q = 0; q < n; q++) {
            const fr_node *nd = &g->nodes[p->order[q]];
            if (nd->op != FR_OP_FETCH) continue;
            int v = nd->out[0];
            if (born[v] <= k && k <= last[v]) live += fr_value_bytes(&g->vals[v]);
        }
        if (live > r->fetched_live) r->fetched_live = live;
    }
    free(last);
    free(born);
    free(moved);
}

/* FR_OFFLOAD_DEBUG=1: the order with the live bytes after each position. */
static void dump(const fr_step *s) {
    const fr_graph *g = &s->g;
    const fr_plan *p = &s->plan;
    int64_t live = 0;
    for (int k = 0; k <= p->n_nodes; k++) {
        for (int e = p->ev_start[k]; e < p->ev_start[k + 1]; e++) {
            int ev = p->ev[e], v = (ev > 0 ? ev : -ev) - 1;
            live += (ev > 0 ? 1 : -1) * (int64_t)fr_value_bytes(&g->vals[v]);
        }
        if (k == p->n_nodes) break;
        const fr_node *nd = &g->nodes[p->order[k]];
        fprintf(stderr, "%3d %-20s out %4d %8zu live %8lld%s\n", k, fr_op_get(nd->op)->name,
                nd->out[0], nd->out[0] >= 0 ? fr_value_bytes(&g->vals[nd->out[0]]) : 0,
                (long long)live, k == p->peak_node ? "  <- peak" : "");
    }
}

static int run_case(int device, int gpt, int offload, result *r) {
    memset(r, 0, sizeof *r);
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 1;
    fr_set_threads(ctx, 2);
#ifdef FR_HAVE_OPENCL
    if (device && fr_cl_use(ctx, 0)) {
        CHECK(0, "opening device 0: %s", fr_last_error(ctx));
        fr_ctx_free(ctx);
        return 1;
    }
#endif
    fr_model *m = gpt ? small_gpt(ctx) : small_cnn(ctx);
    CHECK(m != NULL, "model: %s", fr_last_error(ctx));
    fr_mem_stats before;
    fr_mem_get_stats(ctx, &before);
    fr_status st = m ? fr_model_init(m, 1) : FR_ERR_ARG;
    fr_step_opts o = {
        .batch = N, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 1};
    o.offload = offload ? FR_OFFLOAD_ACTIVATIONS : 0;
    fr_step *s = st ? NULL : fr_step_compile(m, &o);
    CHECK(s != NULL, "compile: %s", fr_last_error(ctx));
    data d = make_data(gpt);
    if (s) {
        count_graph(s, r);
        if (getenv("FR_OFFLOAD_DEBUG")) dump(s);
        r->n_off = s->place.n_offloaded;
        r->arena = s->plan.arena_bytes;
        r->plan_peak = s->plan.peak_total;
        r->plan_act = s->plan.peak[FR_MEM_ACTIVATIONS];
        size_t pers[FR_MEM_CAT_COUNT];
        fr_step_persistent(s, pers);
        r->pred_host_act = pers[FR_MEM_ACTIVATIONS];
        if (device) r->dev_reserved_pred = fr_dev_step_reserved(s);
        fr_batch b = {.n = N, .x = d.x, .y = d.y, .idx = d.idx};
        for (int k = 0; k < STEPS && !st; k++) {
            st = fr_step_run(s, &b, &r->loss[k], NULL);
            CHECK(!st, "step %d: %s", k, fr_last_error(ctx));
        }
        CHECK(s->place.offloaded_bytes == r->off_bytes, "the pass tallies %zu bytes, the graph %zu",
              s->place.offloaded_bytes, r->off_bytes);
        fr_mem_stats hs, ds;
        fr_mem_get_stats(ctx, &hs);
        r->host_act_peak = hs.allocated_peak[FR_MEM_ACTIVATIONS];
        r->host_act_after = hs.allocated[FR_MEM_ACTIVATIONS];
        if (!device) {
            size_t batch = (fr_value_bytes(&s->g.vals[s->g.input]) +
                            fr_value_bytes(&s->g.vals[s->g.label])); /* the caller's */
            r->host_reserved_meas = hs.reserved_peak - before.reserved;
            r->host_reserved_pred = fr_step_reserved(s) - batch;
        }
        if (device) {
            fr_mem_stats_of(ctx->dmem, &ds);
            r->dev_act_peak = ds.allocated_peak[FR_MEM_ACTIVATIONS];
            r->dev_alloc_peak = ds.allocated_total_peak;
            r->dev_reserved_peak = ds.reserved_peak;
        }
        check_prefetch(s, r); /* after the measures: it builds a plan of its own */
    }
    fr_step_free(s);
    fr_model_free(m);
    fr_mem_stats end;
    fr_mem_get_stats(ctx, &end);
    CHECK(end.allocated[FR_MEM_ACTIVATIONS] == 0, "%zu host activation bytes left",
          end.allocated[FR_MEM_ACTIVATIONS]);
#ifdef FR_HAVE_OPENCL
    if (device) fr_cl_unuse(ctx);
#endif
    fr_ctx_free(ctx);
    free(d.x);
    free(d.idx);
    free(d.y);
    return st != FR_OK;
}

static void check_pair(int device, int gpt) {
    const char *what = gpt ? "gpt" : "cnn", *where = device ? "device" : "cpu";
    result a, b;
    if (run_case(device, gpt, 0, &a) || run_case(device, gpt, 1, &b)) {
        CHECK(0, "%s on the %s: a run failed", what, where);
        return;
    }
    printf("%s on the %s: losses", what, where);
    for (int k = 0; k < STEPS; k++) printf(" %.9g/%.9g", (double)a.loss[k], (double)b.loss[k]);
    printf("\n  %d values offloaded, %zu bytes (host block %zu); most fetched live %zu\n", b.n_off,
           b.off_bytes, b.host_block, b.fetched_live);
    printf("  plan: arena %zu -> %zu, peak %zu -> %zu, activations %zu -> %zu\n", a.arena, b.arena,
           a.plan_peak, b.plan_peak, a.plan_act, b.plan_act);
    CHECK(memcmp(a.loss, b.loss, sizeof a.loss) == 0, "%s on the %s: offloaded losses differ", what,
          where);
    CHECK(b.n_off > 0 && b.off_bytes > 0, "%s on the %s: nothing offloaded", what, where);
    CHECK(a.n_off == 0 && a.host_block == 0, "%s on the %s: offload without the option", what,
          where);
    CHECK(b.graph_ok, "%s on the %s: the offloaded graph is not wired as it should", what, where);
    /* the prefetch: fetches ahead of their readers, never above the peak of
     * fetching each just in time; the executor waits where the plan says */
    printf("  prefetch: %d of %d fetches ahead of their reader; peak %zu (just in time: %zu)\n",
           b.prefetched, b.n_fetch, b.plan_peak, b.jit_peak);
    CHECK(b.prefetched > 0, "%s on the %s: no fetch is issued ahead of its reader", what, where);
    CHECK(b.jit_peak > 0 && b.plan_peak <= b.jit_peak,
          "%s on the %s: prefetching raised the planned peak %zu -> %zu", what, where, b.jit_peak,
          b.plan_peak);
    CHECK(b.waits_ok, "%s on the %s: fr_offload_waits is not where the plan reuses a slot", what,
          where);
    /* The peak falls by at least what sits on the host at the new peak;
     * where the old peak was at the end of forward (nothing of backward
     * live yet) that is every offloaded byte but those fetched back. */
    CHECK(b.plan_peak < a.plan_peak && a.plan_peak - b.plan_peak >= b.host_at_peak,
          "%s on the %s: planned peak %zu -> %zu, falls by less than the %zu bytes on the host "
          "there",
          what, where, a.plan_peak, b.plan_peak, b.host_at_peak);
    CHECK(b.arena < a.arena, "%s on the %s: arena %zu -> %zu", what, where, a.arena, b.arena);
    size_t need = b.off_bytes > b.fetched_live ? b.off_bytes - b.fetched_live : 0;
    printf("  peak falls by %zu: %zu on the host there; offloaded minus most fetched live: %zu\n",
           a.plan_peak - b.plan_peak, b.host_at_peak, need);
    /* the host: the block, predicted and measured */
    CHECK(b.pred_host_act == b.host_block,
          "%s on the %s: fr_step_persistent predicts %zu activation bytes, the block is %zu", what,
          where, b.pred_host_act, b.host_block);
    size_t want_host = device ? b.host_block : b.host_block + b.plan_act;
    CHECK(b.host_act_peak == want_host, "%s on the %s: host activations peak %zu, predicted %zu",
          what, where, b.host_act_peak, want_host);
    CHECK(b.host_act_after == b.host_block,
          "%s on the %s: host holds %zu activation bytes, not "
          "the block's %zu",
          what, where, b.host_act_after, b.host_block);
    if (!device) {
        /* the allocator's reserved bytes are what fr_step_reserved predicts
         * (test_planner allows 1% + 64 KiB; here they agree to the byte) */
        for (int k = 0; k < 2; k++) {
            const result *x = k ? &b : &a;
            CHECK(x->host_reserved_meas == x->host_reserved_pred,
                  "%s on the cpu%s: host reserved measured %zu, predicted %zu", what,
                  k ? " offloaded" : "", x->host_reserved_meas, x->host_reserved_pred);
        }
        printf("  host reserved: measured %zu -> %zu, predicted %zu -> %zu\n", a.host_reserved_meas,
               b.host_reserved_meas, a.host_reserved_pred, b.host_reserved_pred);
        return;
    }
    printf("  device: activations %zu -> %zu, allocated peak %zu -> %zu, reserved %zu -> %zu "
           "(predicted %zu -> %zu)\n",
           a.dev_act_peak, b.dev_act_peak, a.dev_alloc_peak, b.dev_alloc_peak, a.dev_reserved_peak,
           b.dev_reserved_peak, a.dev_reserved_pred, b.dev_reserved_pred);
    CHECK(a.dev_act_peak == a.plan_act && b.dev_act_peak == b.plan_act,
          "%s: device activations measured %zu/%zu, planned %zu/%zu", what, a.dev_act_peak,
          b.dev_act_peak, a.plan_act, b.plan_act);
    CHECK(a.dev_alloc_peak - b.dev_alloc_peak == a.plan_peak - b.plan_peak,
          "%s: the device's allocated peak falls by %zd, the plan's by %zu", what,
          (ssize_t)(a.dev_alloc_peak - b.dev_alloc_peak), a.plan_peak - b.plan_peak);
    CHECK(a.dev_reserved_peak == a.dev_reserved_pred && b.dev_reserved_peak == b.dev_reserved_pred,
          "%s: device reserved measured %zu/%zu, predicted %zu/%zu", what, a.dev_reserved_peak,
          b.dev_reserved_peak, a.dev_reserved_pred, b.dev_reserved_pred);
    CHECK(b.dev_reserved_peak < a.dev_reserved_peak, "%s: device reserved peak %zu -> %zu", what,
          a.dev_reserved_peak, b.dev_reserved_peak);
}

/* Make the n-th host allocation fail for every n across compiling and
 * running two offloaded steps of the CNN on the CPU (the pass's tables, the
 * host block): each failure is a clean out-of-memory and leaks nothing. */
static fr_status offloaded_steps(fr_ctx *ctx, void *arg) {
    const data *d = arg;
    fr_model *m = small_cnn(ctx);
    fr_step *s = NULL;
    fr_status st = m ? fr_model_init(m, 1) : FR_ERR_NOMEM;
    fr_step_opts o = {.batch = N,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .offload = FR_OFFLOAD_ACTIVATIONS};
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    fr_batch b = {.n = N, .x = d->x, .y = d->y};
    float loss;
    for (int k = 0; k < 2 && !st; k++) st = fr_step_run(s, &b, &loss, NULL);
    fr_step_free(s);
    fr_model_free(m);
    return st;
}

static void test_allocation_failures(void) {
    data d = make_data(0);
    fault_sweep("allocation failure with offload", offloaded_steps, &d);
    free(d.x);
    free(d.y);
}

int main(void) {
    test_allocation_failures();
    for (int gpt = 0; gpt < 2; gpt++) check_pair(0, gpt);
#ifdef FR_HAVE_OPENCL
    fr_ctx *probe = fr_ctx_new();
    int n = 0;
    if (probe && !fr_cl_count(probe, &n) && n > 0)
        for (int gpt = 0; gpt < 2; gpt++) check_pair(1, gpt);
    else puts("no OpenCL device: the device half is skipped");
    fr_ctx_free(probe);
#else
    puts("built without OpenCL: the device half is skipped");
#endif
    return check_done();
}
