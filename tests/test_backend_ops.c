/* test_backend_ops.c — every op, forward and backward, on every backend
 * built, against the CPU backend (ggml's test-backend-ops is the model).
 *
 * Each case of op_cases.h (one per differentiable op, the gradient check's)
 * becomes the same graph on both backends: the op, a view to (N, D) and an
 * MSE loss against a fixed target, differentiated by autodiff, planned and
 * run by the executor; the device's inputs are uploaded into buffers of its
 * own memory and its outputs read back. The CPU backend's results are checked
 * elsewhere against float64, finite differences and PyTorch; here the
 * device's forward output, loss and every input gradient must agree with
 * them within the bound below, and two device runs must give the same bits.
 * COPY and CAST (not differentiable) run alone and must agree bit for bit.
 * An op whose device kernel is missing fails its case, and a table check
 * fails for any op no case ran on the device (OPTIM_STEP, the step inside
 * backward, runs in test_opencl_optim.c with the optimizer's state).
 *
 * Bound, f32: |device - cpu| <= 1e-4 * max|cpu| over the tensor, plus 1e-6.
 * The device sums in a different order (CLBlast's GEMM tiles, tree
 * reductions) and its exp, erf and tanh may differ from glibc's by their
 * specified few ulp; at these sizes (K <= 67 terms) reassociation moves a
 * float by well under 1e-5 of the largest term, so 1e-4 leaves room for the
 * loss's division and the gradient chain without hiding a wrong index, which
 * moves values by O(1) of the tensor's scale. Integers and casts: exact.
 *
 * 16 bits. Each case runs again in mixed precision, f16 and bf16: its first
 * float input is made a step value (h = x + x, which the op's backward may
 * save) and the graph goes through the precision pass (plan/precision.c),
 * as training in --precision fp16-mixed / bf16-mixed does: saved values
 * stored in 16 bits (CAST nodes, or written in 16 bits by the op itself),
 * read back by CASTs or by kernels that widen them as they read (activation
 * backwards, pooling, BatchNorm backward, the convolution's unroll), GEMM
 * inputs rounded through 16 bits. Both backends run the same rewritten
 * graph, except that a CPU with a native bf16 GEMM (gemm16.h) takes its
 * linear layers' operands in bf16, dy too (a rounding the device's f32 GEMMs
 * do not make: the linear cases stay within 2.3e-3 of max|cpu| here); f32
 * reassociation (the bound above) can move a value across a
 * 16-bit rounding boundary, changing it by one 16-bit ulp of its magnitude
 * (2^-11 for f16, 2^-8 for bf16, relative), which the next ops carry on. The
 * bound is four such ulps of the tensor's largest value: 2e-3 (f16) and
 * 1.6e-2 (bf16) of max|cpu|, plus 1e-6; an indexing or conversion error
 * moves values by O(1) of the scale (a wrong bf16/f16 decode by far more). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "autodiff/autodiff.h"
#include "check.h"
#include "core/half.h"
#include "core/rng.h"
#include "exec/exec.h"
#include "op_cases.h"
#include "plan/precision.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "backend/opencl/backend.h"

#define MAXV 256

static float frand(fr_rng *r) { return 2.0f * fr_rng_next_uniform(r) - 1.0f; }

/* The host data of one case, the same for every backend. */
typedef struct data {
    void *in[5];
    size_t bytes[5];
    int is_int[5];
    float *target;
    size_t target_n;
} data;

/* One backend's graph, plan and executor for a case, and its results. */
typedef struct side {
    fr_ctx *ctx;
    fr_dtype half; /* FR_F16 / FR_BF16: mixed precision (the pass); FR_F32: none */
    fr_graph g;
    fr_plan plan;
    fr_exec ex;
    int built;
    int in_val[5], grad_val[5], target_val, main_out, loss;
    void *dbuf[16]; /* device buffers the side allocated */
    int ndbuf;
    float *out, *grad[5], lossv;
    size_t out_n;
    void *gemm_ws; /* on the CPU: the 16-bit GEMMs' scratch (gemm16.h) */
} side;

static void make_data(fr_ctx *ctx, const gcase *c, data *d) {
    fr_rng r = fr_rng_make(42, (uint64_t)c->op);
    memset(d, 0, sizeof *d);
    for (int i = 0; i < c->n_in; i++) {
        if (c->in[i].ndim == 0) continue;
        size_t n = (size_t)fr_shape_numel(&c->in[i]);
        if (c->is_int[i] < 0) { /* random (O, K) values quantized: the weight's bytes */
            float *w = malloc(n * sizeof *w);
            for (size_t k = 0; k < n; k++) w[k] = frand(&r);
            fr_qweight q;
            CHECK(fr_quantize(ctx, OP_QFMT(c->is_int[i]), w, c->in[i].d[0], c->in[i].d[1], &q) ==
                      FR_OK,
                  "%s: %s", c->what, fr_last_error(ctx));
            d->bytes[i] = fr_quant_bytes(q.fmt, c->in[i].d[0], c->in[i].d[1]);
            d->in[i] = malloc(d->bytes[i]);
            memcpy(d->in[i], q.block, d->bytes[i]);
            fr_quant_free(ctx, &q);
            free(w);
            continue;
        }
        if (c->is_int[i]) {
            uint64_t below = c->is_int[i] > 1 ? (uint64_t)c->is_int[i]
                                              : (uint64_t)(c->op == FR_OP_LINEAR_CE
                                                               ? c->in[1].d[0]
                                                               : c->in[0].d[c->in[0].ndim - 1]);
            int32_t *x = malloc(n * sizeof *x);
            for (size_t k = 0; k < n; k++) x[k] = (int32_t)fr_rng_below(&r, below);
            d->in[i] = x, d->bytes[i] = n * sizeof *x, d->is_int[i] = 1;
            continue;
        }
        float *x = malloc(n * sizeof *x);
        for (size_t k = 0; k < n; k++) {
            float v = frand(&r);
            if (c->positive[i] == 1) v = 0.1f + fabsf(v);
            if (c->positive[i] == 2) v = (v < 0 ? -0.1f : 0.1f) + v;
            x[k] = v;
        }
        if (c->op == FR_OP_MAXPOOL2D && i == 0) /* a unique max per window */
            for (size_t k = 0; k < n; k++) x[k] = (float)((k * 7919) % n) / (float)n - 0.5f;
        d->in[i] = x, d->bytes[i] = n * sizeof *x;
    }
    d->target_n = 4096;
    d->target = malloc(d->target_n * sizeof(float));
    for (size_t k = 0; k < d->target_n; k++) d->target[k] = frand(&r);
}

static void free_data(data *d) {
    for (int i = 0; i < 5; i++) free(d->in[i]);
    free(d->target);
}

/* Storage for value v holding `bytes` (from host src when given). */
static int bind(side *s, int v, const void *src, size_t bytes) {
    const fr_backend *be = fr_backend_of(s->ctx);
    if (!fr_backend_is_device(be)) {
        fr_exec_bind(&s->ex, v, (void *)src);
        return FR_OK;
    }
    void *b = be->alloc(s->ctx, bytes, FR_MEM_OTHER);
    if (!b) return FR_ERR_NOMEM;
    s->dbuf[s->ndbuf++] = b;
    if (src && be->write(s->ctx, b, 0, src, bytes)) return FR_ERR_ARG;
    fr_exec_bind_dev(&s->ex, v, b, 0);
    return FR_OK;
}

static int fetch(side *s, int v, void *dst, size_t bytes) {
    const fr_backend *be = fr_backend_of(s->ctx);
    if (!fr_backend_is_device(be)) {
        memcpy(dst, s->ex.ptr[v], bytes);
        return FR_OK;
    }
    return be->read(s->ctx, s->ex.buf[v], s->ex.off[v], dst, bytes);
}

/* The case's graph in s->ctx: the op, then (unless it is a loss) a view to
 * (N, D) and MSE against the target; autodiff, plan, executor. */
static int build(side *s, const gcase *c, const data *d) {
    fr_graph_init(&s->g, s->ctx);
    s->built = 1;
    int grad_of[MAXV];
    for (int i = 0; i < MAXV; i++) grad_of[i] = -1;
    for (int i = 0; i < 5; i++) s->in_val[i] = s->grad_val[i] = -1;
    s->target_val = -1;
    for (int i = 0; i < c->n_in; i++) {
        if (c->in[i].ndim == 0) continue;
        if (c->is_int[i] < 0) { /* a frozen quantized weight: its bytes */
            s->in_val[i] =
                fr_graph_value(&s->g, FR_VAL_BUFFER, FR_U8, fr_shape1((int64_t)d->bytes[i]));
            continue;
        }
        int lab = c->is_int[i] == 1, ids = c->is_int[i] > 1;
        s->in_val[i] = fr_graph_value(&s->g,
                                      lab   ? FR_VAL_LABEL
                                      : ids ? FR_VAL_INPUT
                                            : (c->no_grad[i] ? FR_VAL_BUFFER : FR_VAL_PARAM),
                                      lab || ids ? FR_I32 : FR_F32, c->in[i]);
        s->g.vals[s->in_val[i]].batched = i == 0 || lab;
        if (!lab && !ids && !c->no_grad[i]) {
            s->grad_val[i] = fr_graph_value(&s->g, FR_VAL_GRAD, FR_F32, c->in[i]);
            grad_of[s->in_val[i]] = s->grad_val[i];
        }
    }
    int out[FR_MAX_OUT], op_in[5];
    memcpy(op_in, s->in_val, sizeof op_in);
    if (s->half != FR_F32 && s->grad_val[0] >= 0) { /* x0 as a step value: h = x0 + x0 */
        int two[2] = {s->in_val[0], s->in_val[0]}, h;
        fr_attr none = {0};
        if (fr_graph_node(&s->g, FR_OP_ADD, two, 2, &none, -1, 0, &h) < 0) return FR_ERR_ARG;
        op_in[0] = h;
    }
    fr_attr attr = c->attr;
    if (fr_graph_node(&s->g, c->op, op_in, c->n_in, &attr, -1, 0, out) < 0) return FR_ERR_ARG;
    s->main_out = out[0];
    if (c->op == FR_OP_CROSS_ENTROPY || c->op == FR_OP_MSE || c->op == FR_OP_LINEAR_CE) {
        s->loss = s->g.loss = out[0];
    } else {
        fr_shape os = s->g.vals[out[0]].shape;
        fr_attr va = {0};
        va.shape = os.ndim == 1 ? fr_shape2(1, os.d[0])
                                : fr_shape2(os.d[0], fr_shape_numel(&os) / os.d[0]);
        int flat;
        fr_graph_node(&s->g, FR_OP_VIEW, &out[0], 1, &va, -1, 0, &flat);
        s->target_val = fr_graph_value(&s->g, FR_VAL_LABEL, FR_F32, va.shape);
        fr_attr la = {.scale = 1.0f};
        int lin[2] = {flat, s->target_val};
        fr_graph_node(&s->g, FR_OP_MSE, lin, 2, &la, -1, 0, &s->loss);
        s->g.loss = s->loss;
    }
    if ((int)s->g.n_vals > MAXV) return FR_ERR_ARG;
    if (fr_autodiff(&s->g, grad_of)) return FR_ERR_ARG;
    uint8_t keep[MAXV] = {0};
    keep[s->loss] = keep[s->main_out] = 1;
    int *order = NULL, n_order = 0;
    if (s->half != FR_F32) { /* the mixed-precision pass over the graph in node order */
        int origin[MAXV];
        n_order = (int)s->g.n_nodes;
        if (!(order = fr_alloc(s->ctx, (size_t)n_order * sizeof *order, FR_MEM_OTHER)))
            return FR_ERR_NOMEM;
        for (int i = 0; i < n_order; i++) order[i] = i;
        for (int v = 0; v < (int)s->g.n_vals; v++) origin[v] = v;
        int st = fr_precision_apply(&s->g, s->half, n_order, origin, &order, &n_order);
        if (st || (int)s->g.n_vals > MAXV) {
            fr_free(s->ctx, order);
            return st ? st : FR_ERR_ARG;
        }
    }
    int st = fr_plan_build(&s->g, keep, order, n_order, &s->plan);
    fr_free(s->ctx, order);
    if (st) return FR_ERR_ARG;
    if ((st = fr_exec_init(&s->ex, &s->g, &s->plan)) || fr_backend_is_device(fr_backend_of(s->ctx)))
        return st;
    /* on the CPU, the scratch of its bf16 GEMMs, the most a node asks, as the step plans it */
    int64_t most = 0;
    for (int k = 0; k < s->plan.n_nodes; k++) {
        int64_t f = fr_backend_ws(&s->g, &s->g.nodes[s->plan.order[k]], -1);
        most = f > most ? f : most;
    }
    if (most && !(s->gemm_ws = malloc((size_t)most * sizeof(float)))) return FR_ERR_NOMEM;
    s->ex.gemm_ws = s->gemm_ws;
    s->ex.gemm_ws_len = (size_t)most * sizeof(float);
    return FR_OK;
}

/* Bind the case's data, run the whole graph once and read the results. */
static int run(side *s, const gcase *c, const data *d) {
    s->ndbuf = 0;
    for (int i = 0; i < 5; i++) {
        if (s->in_val[i] < 0) continue;
        if (bind(s, s->in_val[i], d->in[i], d->bytes[i])) return FR_ERR_NOMEM;
        if (s->grad_val[i] >= 0) {
            s->grad[i] = malloc(d->bytes[i]);
            if (bind(s, s->grad_val[i], s->grad[i], d->bytes[i])) return FR_ERR_NOMEM;
            s->ex.written[s->grad_val[i]] = 0;
        }
    }
    if (s->target_val >= 0) {
        size_t n = (size_t)fr_shape_numel(&s->g.vals[s->target_val].shape);
        if (n > d->target_n) return FR_ERR_ARG;
        if (bind(s, s->target_val, d->target, n * sizeof(float))) return FR_ERR_NOMEM;
    }
    int st = fr_exec_run(&s->ex, 0, s->plan.n_nodes, (int)c->in[0].d[0], 7, 0);
    if (st) return st;
    fr_exec_finish(&s->ex);
    s->out_n = (size_t)fr_shape_numel(&s->g.vals[s->main_out].shape);
    s->out = malloc(s->out_n * sizeof(float));
    fr_dtype odt = s->g.vals[s->main_out].dtype; /* 16 bits when the op wrote it so */
    if (odt == FR_F16 || odt == FR_BF16) {
        uint16_t *h = malloc(s->out_n * sizeof *h);
        st = fetch(s, s->main_out, h, s->out_n * sizeof *h);
        for (size_t k = 0; k < s->out_n && !st; k++)
            s->out[k] = odt == FR_F16 ? fr_f16_to_f32(h[k]) : fr_bf16_to_f32(h[k]);
        free(h);
        if (st) return FR_ERR_ARG;
    } else if (fetch(s, s->main_out, s->out, s->out_n * sizeof(float))) {
        return FR_ERR_ARG;
    }
    if (fetch(s, s->loss, &s->lossv, sizeof(float))) return FR_ERR_ARG;
    for (int i = 0; i < 5; i++)
        if (s->grad_val[i] >= 0 && fetch(s, s->grad_val[i], s->grad[i], d->bytes[i]))
            return FR_ERR_ARG;
    return FR_OK;
}

static void release(side *s) {
    const fr_backend *be = fr_backend_of(s->ctx);
    for (int i = 0; i < s->ndbuf; i++) be->release(s->ctx, s->dbuf[i]);
    s->ndbuf = 0;
    if (s->built) {
        fr_exec_release(&s->ex);
        fr_plan_release(&s->plan);
        fr_graph_release(&s->g);
    }
    free(s->out);
    free(s->gemm_ws);
    s->gemm_ws = NULL;
    for (int i = 0; i < 5; i++) free(s->grad[i]);
    s->built = 0;
    s->out = NULL;
    memset(s->grad, 0, sizeof s->grad);
}

static double g_tol = 1e-4; /* the bound's relative part for the run at hand (see the top) */

/* Worst |a - b| / (max|b| + 1e-2) and whether every element is within the bound. */
static int close_enough(const float *a, const float *b, size_t n, double *worst) {
    double m = 0, w = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(b[i]));
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= g_tol * m + 1e-6)) ok = 0;
        if (!(d <= w)) w = d;
    }
    *worst = w / (m + 1e-2);
    return ok;
}

static uint8_t ran_on_device[FR_OP_COUNT];

static void check_case(fr_ctx *cpu, fr_ctx *dev, const gcase *c, fr_dtype half) {
    data d;
    make_data(cpu, c, &d);
    side a = {.ctx = cpu, .half = half}, b = {.ctx = dev, .half = half},
         b2 = {.ctx = dev, .half = half};
    g_tol = half == FR_F16 ? 2e-3 : half == FR_BF16 ? 1.6e-2 : 1e-4;
    char what[96];
    snprintf(what, sizeof what, "%s%s", c->what,
             half == FR_F16    ? " f16-mixed"
             : half == FR_BF16 ? " bf16-mixed"
                               : "");
    int st = build(&a, c, &d) || run(&a, c, &d);
    CHECK(!st, "%s: the CPU run failed: %s", what, fr_last_error(cpu));
    st = build(&b, c, &d);
    if (!st) st = run(&b, c, &d);
    CHECK(!st, "%s: the device run failed: %s", what, fr_last_error(dev));
    if (!st) {
        for (size_t i = 0; i < b.g.n_nodes; i++) ran_on_device[b.g.nodes[i].op] = 1;
        double w = 0, worst = 0;
        CHECK(close_enough(b.out, a.out, a.out_n, &w), "%s: forward output off (worst %.3g)", what,
              w);
        worst = fmax(worst, w);
        CHECK(close_enough(&b.lossv, &a.lossv, 1, &w),
              "%s: loss %.9g on the device, %.9g on the CPU", what, (double)b.lossv,
              (double)a.lossv);
        for (int i = 0; i < 5; i++) {
            if (a.grad_val[i] < 0) continue;
            CHECK(close_enough(b.grad[i], a.grad[i], d.bytes[i] / 4, &w),
                  "%s: gradient of input %d off (worst %.3g)", what, i, w);
            worst = fmax(worst, w);
        }
        /* a second device run, in a fresh graph: the same bits */
        int st2 = build(&b2, c, &d);
        if (!st2) st2 = run(&b2, c, &d);
        CHECK(!st2, "%s: the second device run failed: %s", what, fr_last_error(dev));
        if (!st2) {
            int same = !memcmp(b.out, b2.out, a.out_n * 4) && b.lossv == b2.lossv;
            for (int i = 0; i < 5; i++)
                if (a.grad_val[i] >= 0) same &= !memcmp(b.grad[i], b2.grad[i], d.bytes[i]);
            CHECK(same, "%s: two device runs differ", what);
        }
        int n16 = 0; /* values the pass stored in 16 bits */
        for (size_t v = 0; v < b.g.n_vals; v++)
            n16 += b.g.vals[v].dtype == FR_F16 || b.g.vals[v].dtype == FR_BF16;
        /* a loss's logits and a view of a leaf stay f32 (precision.c), a quantized
         * linear layer saves nothing; any other op's input or saved value is stored
         * in 16 bits */
        int f32_only = c->op == FR_OP_VIEW || c->op == FR_OP_CROSS_ENTROPY || c->op == FR_OP_MSE ||
                       c->op == FR_OP_LINEAR_CE || c->op == FR_OP_QLINEAR;
        CHECK(half == FR_F32 || f32_only || n16 > 0, "%s: nothing was stored in 16 bits", what);
        printf("%-24s device vs cpu: worst %.2e of the largest value%s\n", what, worst,
               half == FR_F32 ? ""
               : n16          ? " (16-bit values)"
                              : " (no 16-bit value)");
    }
    release(&a);
    release(&b);
    release(&b2);
    free_data(&d);
}

/* COPY and CAST alone: x -> y on both backends, the same bits. */
static void check_unary(fr_ctx *cpu, fr_ctx *dev, fr_op op, fr_dtype to, const char *what) {
    const size_t n = 1000;
    float x[1000];
    fr_rng r = fr_rng_make(3, (uint64_t)op);
    for (size_t i = 0; i < n; i++) x[i] = 300.0f * frand(&r);
    uint16_t out[2][1000 * 2];
    fr_ctx *ctxs[2] = {cpu, dev};
    for (int k = 0; k < 2; k++) {
        side s = {.ctx = ctxs[k]};
        fr_graph_init(&s.g, s.ctx);
        s.built = 1;
        int xin = fr_graph_value(&s.g, FR_VAL_INPUT, FR_F32, fr_shape2(10, 100)), y;
        s.g.vals[xin].batched = 1;
        fr_attr at = {.dtype = to};
        int ok = fr_graph_node(&s.g, op, &xin, 1, &at, -1, 0, &y) >= 0;
        uint8_t keep[8] = {0};
        keep[y] = 1;
        ok = ok && !fr_plan_build(&s.g, keep, NULL, 0, &s.plan) &&
             !fr_exec_init(&s.ex, &s.g, &s.plan) && !bind(&s, xin, x, sizeof x) &&
             !fr_exec_run(&s.ex, 0, (int)s.g.n_nodes, 10, 7, 0);
        if (ok) fr_exec_finish(&s.ex);
        size_t bytes = n * fr_dtype_size(s.g.vals[y].dtype);
        ok = ok && !fetch(&s, y, out[k], bytes);
        CHECK(ok, "%s on %s: %s", what, k ? "the device" : "the CPU", fr_last_error(ctxs[k]));
        if (k && ok) {
            ran_on_device[op] = 1;
            CHECK(!memcmp(out[0], out[1], bytes), "%s: the device's bits differ from the CPU's",
                  what);
            printf("%-24s device vs cpu: the same bits\n", what);
        }
        release(&s);
    }
}

int main(void) {
    fr_ctx *cpu = fr_ctx_new(), *dev = fr_ctx_new();
    int n = 0;
    if (!cpu || !dev) return 2;
    if (fr_cl_count(dev, &n) || n < 1) {
        puts("skipped: no OpenCL device");
        fr_ctx_free(cpu), fr_ctx_free(dev);
        return 77;
    }
    CHECK(fr_cl_use(dev, 0) == FR_OK, "opening device 0: %s", fr_last_error(dev));
    gcase cases[OP_CASES_MAX];
    int ncase = op_cases(cases);
    for (int i = 0; i < ncase; i++) check_case(cpu, dev, &cases[i], FR_F32);
    for (int i = 0; i < ncase; i++) check_case(cpu, dev, &cases[i], FR_F16);
    for (int i = 0; i < ncase; i++) check_case(cpu, dev, &cases[i], FR_BF16);
    check_unary(cpu, dev, FR_OP_COPY, FR_F32, "copy");
    check_unary(cpu, dev, FR_OP_CAST, FR_BF16, "cast f32 -> bf16");
    check_unary(cpu, dev, FR_OP_CAST, FR_F16, "cast f32 -> f16");
    for (int op = 0; op < FR_OP_COUNT; op++) {
        if (fr_op_get((fr_op)op)->view || op == FR_OP_OPTIM_STEP) continue;
        if (op == FR_OP_OFFLOAD || op == FR_OP_FETCH) continue; /* test_offload runs them */
        if (op == FR_OP_ATTENTION_KV || op == FR_OP_LAST_ROW)
            continue; /* test_generate_device runs them */
        CHECK(ran_on_device[op], "%s never ran on the device: no case covers it",
              fr_op_get((fr_op)op)->name);
    }
    fr_mem_stats st;
    fr_mem_stats_of(fr_cl_memory(dev), &st);
    CHECK(st.allocated_total == 0, "%zu device bytes still allocated", st.allocated_total);
    fr_cl_unuse(dev);
    fr_ctx_free(dev);
    fr_ctx_free(cpu);
    return check_done();
}
#endif
