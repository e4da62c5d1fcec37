/* gemm.c (opencl) — LINEAR, LINEAR_BWD, CONV2D, CONV2D_BWD and the head fused
 * with its loss (LINEAR_CE, LINEAR_CE_BWD: its chunks' GEMMs here, its rows
 * by reduce.cl) on an OpenCL device: the products by CLBlast's SGEMM on the device's queue, the rest
 * by gemm.cl (bias seeding, bias gradients, im2col, col2im, the plain SGD
 * step), with the CPU kernels' semantics (linear.c, conv.c): absent outputs
 * skipped, accumulate bits, the same shape errors. It owns the size of the
 * convolutions' device workspace (fr_cl_ws_conv2d*) and of the step's GEMM
 * scratch (fr_cl_ws_gemm); it allocates nothing, and neither does CLBlast:
 *
 * The step's GEMM scratch. CLBlast's indirect GEMM (large products) pads and
 * transposes its operands in temporary buffers that it would allocate itself
 * on every call, outside the device's accounting. On the device
 * fr_kernel_call.grad_ws is instead the step's planned scratch, a cl_mem (cast
 * to float *) of grad_ws_len floats: a GEMM whose shape needs temporary
 * buffers (CLBlastSGemmTempBufferSize > 0) takes them from its start
 * (CLBlastSgemmWithTempBuffer), and LINEAR_BWD's fused SGD step on the weight
 * (the node's update bit 1) forms the weight's gradient, O*K floats, at its end. A GEMM
 * whose shape needs none is called as before; one that needs more than the
 * scratch holds is refused. fr_cl_ws_gemm sizes the temporary part per node
 * at plan time with every operand offset non-zero, the most CLBlast asks for
 * any offset.
 *
 * Bits: every output element is computed by one work-item or by one GEMM of
 * fixed sizes, so a call gives the same bits run after run. They are not the
 * CPU's bits: CLBlast sums a product in its own order. The bias gradients
 * sum in double in the CPU's order and match it exactly where the device has
 * cl_khr_fp64. The fused SGD step forms the weight's gradient by the GEMM the
 * kept gradient is formed by (the same shapes) and steps with optim.cl's
 * float operations: the bits of --keep-grads. */
#include "backend/opencl/gemm.h"
#include <clblast_c.h>
#include "backend/kcheck.h"

/* ---- helpers ---- */

static int acc_bit(const fr_kernel_call *c, int i) { return (int)((c->accumulate >> i) & 1u); }

/* What a CLBlast status means (its codes above -1024 are OpenCL's). */
static const char *blast_str(CLBlastStatusCode s) {
    switch (s) {
    case CLBlastTempBufferAllocFailure: return "its temporary buffer could not be allocated";
    case CLBlastOpenCLOutOfResources: return "out of device resources";
    case CLBlastOpenCLOutOfHostMemory: return "out of host memory";
    case CLBlastOpenCLBuildProgramFailure: return "its kernel did not build";
    case CLBlastInvalidDimension: return "a zero dimension";
    case CLBlastInsufficientMemoryA: return "A's buffer is too small";
    case CLBlastInsufficientMemoryB: return "B's buffer is too small";
    case CLBlastInsufficientMemoryC: return "C's buffer is too small";
    case CLBlastInvalidLocalMemUsage: return "not enough local memory on the device";
    case CLBlastDatabaseError: return "no parameters for this device";
    default: return (int)s > -1000 ? fr_cl_errstr((cl_int)s) : "see clblast_c.h";
    }
}

/* A CLBlast status as an error naming the op (out of memory: FR_ERR_NOMEM). */
static int blast_check(fr_kernel_call *c, CLBlastStatusCode s, const char *op) {
    if (s == CLBlastSuccess) return FR_OK;
    int nomem = s == CLBlastTempBufferAllocFailure || s == CLBlastOpenCLOutOfResources ||
                s == CLBlastOpenCLOutOfHostMemory;
    return fr_fail(c->ctx, nomem ? FR_ERR_NOMEM : FR_ERR_ARG,
                   "opencl: %s: CLBlast SGEMM failed with status %d (%s)", op, (int)s,
                   blast_str(s));
}

typedef struct mat {
    cl_mem m;
    size_t off, ld; /* elements */
} mat;

static mat mat_of(const fr_tensor *t, size_t ld) { return (mat){fr_cl_mem(t), fr_cl_off(t), ld}; }
static mat mat_at(mat a, size_t off) { return (mat){a.m, a.off + off, a.ld}; }

/* The temporary bytes CLBlast's SGEMM needs for these operands (0: none,
 * it will not allocate); SIZE_MAX when it cannot say. */
static size_t temp_bytes(cl_command_queue q, int ta, int tb, size_t m, size_t n, size_t k,
                         size_t ao, size_t lda, size_t bo, size_t ldb, size_t co, size_t ldc) {
    size_t bytes = 0;
    CLBlastStatusCode s = CLBlastSGemmTempBufferSize(
        CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo,
        tb ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, ao, lda, bo, ldb, co, ldc, &q,
        &bytes);
    return s == CLBlastSuccess ? bytes : SIZE_MAX;
}

/* The scratch a call's GEMMs may take their temporary buffers from: its
 * first `bytes` (the rest may hold the fused step's gradient). */
typedef struct scratch {
    cl_mem m; /* NULL: none given */
    size_t bytes;
} scratch;

static scratch scratch_of(const fr_kernel_call *c, size_t tail_floats) {
    scratch s = {(cl_mem)(void *)c->grad_ws, 0};
    if (s.m && c->grad_ws_len > tail_floats)
        s.bytes = (c->grad_ws_len - tail_floats) * sizeof(float);
    return s;
}

/* C (m, n) = alpha A' B' + beta C, row-major, A' = A or A^T (ta), B' likewise;
 * CLBlast's temporary buffers from the scratch */
static int gemm_alpha(fr_kernel_call *c, const char *op, scratch sc, int ta, int tb, size_t m,
                      size_t n, size_t k, float alpha, mat a, mat b, float beta, mat cm) {
    cl_command_queue q = fr_cl_queue(fr_cl_of(c->ctx));
    const CLBlastTranspose at = ta ? CLBlastTransposeYes : CLBlastTransposeNo,
                           bt = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    size_t need = temp_bytes(q, ta, tb, m, n, k, a.off, a.ld, b.off, b.ld, cm.off, cm.ld);
    if (need == 0)
        return blast_check(c,
                           CLBlastSgemm(CLBlastLayoutRowMajor, at, bt, m, n, k, alpha, a.m, a.off,
                                        a.ld, b.m, b.off, b.ld, beta, cm.m, cm.off, cm.ld, &q,
                                        NULL),
                           op);
    if (need == SIZE_MAX || !sc.m || need > sc.bytes)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "opencl: %s: a %zux%zux%zu GEMM needs %zu bytes of CLBlast temporary "
                       "buffers, the planned GEMM scratch holds %zu",
                       op, m, n, k, need, sc.m ? sc.bytes : 0);
    return blast_check(c,
                       CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, at, bt, m, n, k, alpha,
                                                  a.m, a.off, a.ld, b.m, b.off, b.ld, beta, cm.m,
                                                  cm.off, cm.ld, &q, NULL, sc.m),
                       op);
}

static int gemm(fr_kernel_call *c, const char *op, scratch sc, int ta, int tb, size_t m, size_t n,
                size_t k, mat a, mat b, float beta, mat cm) {
    return gemm_alpha(c, op, sc, ta, tb, m, n, k, 1.0f, a, b, beta, cm);
}

/* A linear node's attr.scale: y = scale (x W^T) + b, 0 read as 1 (the CPU's lin_scale) */
static float lin_scale(const fr_kernel_call *c) {
    float s = c->node ? c->node->attr.scale : 0.0f;
    return s == 0.0f ? 1.0f : s;
}

/* count GEMMs as above, the i-th on A, B and C advanced by i times their
 * stride: one strided-batched call where one such GEMM needs no temporary
 * buffers (the batched call then allocates none either: CLBlast decides per
 * shape), else one call each with the scratch */
static int gemm_batched(fr_kernel_call *c, const char *op, scratch sc, int ta, int tb, size_t m,
                        size_t n, size_t k, mat a, size_t sa, mat b, size_t sb, float beta, mat cm,
                        size_t sc_stride, size_t count) {
    cl_command_queue q = fr_cl_queue(fr_cl_of(c->ctx));
    int alone = count == 1;
    for (size_t i = 0; i < count && !alone; i++) /* every one's offsets */
        alone = temp_bytes(q, ta, tb, m, n, k, a.off + i * sa, a.ld, b.off + i * sb, b.ld,
                           cm.off + i * sc_stride, cm.ld) != 0;
    if (alone) {
        for (size_t i = 0; i < count; i++) {
            int st = gemm(c, op, sc, ta, tb, m, n, k, mat_at(a, i * sa), mat_at(b, i * sb), beta,
                          mat_at(cm, i * sc_stride));
            if (st) return st;
        }
        return FR_OK;
    }
    CLBlastStatusCode s = CLBlastSgemmStridedBatched(
        CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo,
        tb ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, 1.0f, a.m, a.off, a.ld, sa, b.m,
        b.off, b.ld, sb, beta, cm.m, cm.off, cm.ld, sc_stride, count, &q, NULL);
    return blast_check(c, s, op);
}

/* Runs gemm.cl's kernel `name` over n work-items with the arguments set. */
#define LAUNCH(c, name, n, ...)                                                   \
    do {                                                                          \
        fr_cl *cl_ = fr_cl_of((c)->ctx);                                          \
        cl_kernel k_ = fr_cl_kernel((c)->ctx, cl_, "gemm", (name));               \
        if (!k_) return FR_ERR_ARG;                                               \
        int st_ = FR_CL_ARGS((c)->ctx, k_, __VA_ARGS__);                          \
        if (st_) return st_;                                                      \
        size_t g_ = (size_t)(n);                                                  \
        if (g_ && (st_ = fr_cl_run((c)->ctx, cl_, k_, 1, &g_, NULL))) return st_; \
    } while (0)

/* y (n values) = b[(i / inner) % nb] */
static int bias_fill(fr_kernel_call *c, const fr_tensor *y, const fr_tensor *b, int64_t n,
                     int64_t nb, int64_t inner) {
    cl_mem ym = fr_cl_mem(y), bm = fr_cl_mem(b);
    cl_ulong yo = fr_cl_off(y), bo = fr_cl_off(b), un = (cl_ulong)n, unb = (cl_ulong)nb,
             uin = (cl_ulong)inner;
    LAUNCH(c, "bias_fill", n, sizeof ym, &ym, sizeof yo, &yo, sizeof un, &un, sizeof bm, &bm,
           sizeof bo, &bo, sizeof unb, &unb, sizeof uin, &uin);
    return FR_OK;
}

static int zero_tensor(fr_kernel_call *c, const fr_tensor *t, int64_t n) {
    return fr_cl_zero(c->ctx, fr_cl_of(c->ctx), fr_cl_mem(t), t->off, (size_t)n * sizeof(float));
}

static int need_f32(fr_kernel_call *c, const char *op, const fr_tensor *t, const char *what) {
    if (!t->buf || t->dtype == FR_F32) return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: a 16-bit %s is not supported", op, what);
}

/* ---- LINEAR ---- */

// x is (N,K) (N = numel / K), W is (O,K), b is (O) or absent, y is (N,O)
// y = b (seeded by bias_fill), then y = s x W^T + beta y by one GEMM (No, Yes), s lin_scale
int fr_cl_k_linear(fr_kernel_call *c) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *b = &c->in[2], *y = &c->out[0];
    fr_linear_dims d;
    int st = fr_kcheck_linear(c, &d);
    if (st) return st;
    const int64_t K = d.K, O = d.O, N = d.N;
    if ((st = need_f32(c, "linear", x, "input")) || (st = need_f32(c, "linear", w, "weight")) ||
        (st = need_f32(c, "linear", b, "bias")))
        return st;
    if (N == 0 || O == 0) return FR_OK;
    int has_b = b->buf != NULL;
    if (has_b && (st = bias_fill(c, y, b, N * O, O, 1))) return st;
    if (K == 0) return has_b ? FR_OK : zero_tensor(c, y, N * O);
    return gemm_alpha(c, "linear", scratch_of(c, 0), 0, 1, (size_t)N, (size_t)O, (size_t)K,
                      lin_scale(c), mat_of(x, (size_t)K), mat_of(w, (size_t)K), has_b ? 1.0f : 0.0f,
                      mat_of(y, (size_t)O));
}

/* W (n values from its offset) = W + (-lr)(g + wd W), g the scratch's
 * tail, lr and wd the node's attr: plain SGD in optim.cl's (and fr_k_sgd's)
 * float operations */
static int sgd_step(fr_kernel_call *c, const fr_tensor *w, cl_mem g, size_t g_off, int64_t n) {
    cl_mem wm = fr_cl_mem(w);
    cl_ulong wo = fr_cl_off(w), go = g_off, un = (cl_ulong)n;
    cl_float lr = c->node->attr.lr, wd = c->node->attr.wd;
    LAUNCH(c, "sgd_plain", n, sizeof wm, &wm, sizeof wo, &wo, sizeof g, &g, sizeof go, &go,
           sizeof un, &un, sizeof lr, &lr, sizeof wd, &wd);
    return FR_OK;
}

// dy is (N,O), x is (N,K), W is (O,K)
// (s = lin_scale: dx and dW are scaled by it, db is not)
// dx (N,K) = s dy W     (No, No; beta 1 with accumulate bit 0)
// dW (O,K) = s dy^T x   (Yes, No; beta 1 with accumulate bit 1; with update
//                        bit 1 dW is W itself: the gradient goes into the
//                        scratch's last O*K floats, then W takes the SGD step)
// db (O)   = sum_n dy   (col_sums, in double; accumulate bit 2, or update bit 2: the SGD step)
// dx is computed first, from the weights before the step.
int fr_cl_k_linear_bwd(fr_kernel_call *c) {
    const fr_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2];
    const fr_tensor *dx = &c->out[0], *dw = &c->out[1], *db = &c->out[2];
    fr_linear_dims d;
    int st = fr_kcheck_linear_bwd(c, &d);
    if (st) return st;
    const int64_t K = d.K, O = d.O, N = d.N;
    const float s = lin_scale(c);
    const int upd_w = dw->buf && (c->node->update & 2u) && O * K > 0;
    if (upd_w && (!c->grad_ws || c->grad_ws_len < (size_t)(O * K)))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "opencl: linear_bwd: the weight's SGD step needs %lld floats of device "
                       "scratch for its gradient, %zu given",
                       (long long)(O * K), c->grad_ws ? c->grad_ws_len : (size_t)0);
    const scratch sc = scratch_of(c, upd_w ? (size_t)(O * K) : 0);
    for (int i = 0; i < 3 && !st; i++) st = need_f32(c, "linear_bwd", &c->in[i], "input");
    if (st) return st;
    if (dx->buf && N * K > 0) {
        if (O == 0) {
            if (!acc_bit(c, 0) && (st = zero_tensor(c, dx, N * K))) return st;
        } else {
            st = gemm_alpha(c, "linear_bwd", sc, 0, 0, (size_t)N, (size_t)K, (size_t)O, s,
                            mat_of(dy, (size_t)O), mat_of(w, (size_t)K),
                            acc_bit(c, 0) ? 1.0f : 0.0f, mat_of(dx, (size_t)K));
            if (st) return st;
        }
    }
    if (upd_w) { /* no rows (N == 0): no step, as the CPU's */
        const size_t g_off = c->grad_ws_len - (size_t)(O * K);
        const mat gm = {(cl_mem)(void *)c->grad_ws, g_off, (size_t)K};
        if (N > 0 && ((st = gemm_alpha(c, "linear_bwd", sc, 1, 0, (size_t)O, (size_t)K, (size_t)N,
                                       s, mat_of(dy, (size_t)O), mat_of(x, (size_t)K), 0.0f, gm)) ||
                      (st = sgd_step(c, dw, gm.m, g_off, O * K))))
            return st;
    } else if (dw->buf && O * K > 0) {
        if (N > 0) {
            st = gemm_alpha(c, "linear_bwd", sc, 1, 0, (size_t)O, (size_t)K, (size_t)N, s,
                            mat_of(dy, (size_t)O), mat_of(x, (size_t)K),
                            acc_bit(c, 1) ? 1.0f : 0.0f, mat_of(dw, (size_t)K));
            if (st) return st;
        } else if (!acc_bit(c, 1) && (st = zero_tensor(c, dw, O * K))) {
            return st;
        }
    }
    if (db->buf && O > 0) {
        cl_mem dym = fr_cl_mem(dy), dbm = fr_cl_mem(db);
        cl_ulong dyo = fr_cl_off(dy), dbo = fr_cl_off(db), un = (cl_ulong)N, uo = (cl_ulong)O;
        cl_int acc = acc_bit(c, 2), upd = (c->node->update & 4u) != 0;
        cl_float lr = c->node->attr.lr, wd = c->node->attr.wd;
        LAUNCH(c, "col_sums", O, sizeof dym, &dym, sizeof dyo, &dyo, sizeof un, &un, sizeof uo, &uo,
               sizeof dbm, &dbm, sizeof dbo, &dbo, sizeof acc, &acc, sizeof upd, &upd, sizeof lr,
               &lr, sizeof wd, &wd);
    }
    return FR_OK;
}

/* ---- QLINEAR ---- */

/* A frozen quantized weight (quant.cl) is widened a tile of whole rows at a
 * time into the node's workspace, about CL_QTILE_FLOATS values, and each
 * tile multiplied by CLBlast: no f32 copy of the weight exists. */
#define CL_QTILE_FLOATS ((int64_t)1 << 20) /* 4 MiB */

static int64_t q_tile_rows(int64_t O, int64_t K) {
    int64_t t = K > 0 ? CL_QTILE_FLOATS / K : 1;
    if (t < 1) t = 1;
    return t < O ? t : O;
}

int64_t fr_cl_ws_qlinear(const fr_graph *g, const fr_node *n, int j) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    const fr_shape *s = &f->attr.shape;
    if (j != (n->op == FR_OP_QLINEAR ? 1 : 3) || s->ndim != 2 || s->d[0] < 1 || s->d[1] < 1)
        return 0;
    return q_tile_rows(s->d[0], s->d[1]) * s->d[1];
}

/* the workspace ws (its first rows K floats) = W'[o0 : o0 + rows] */
static int dequant(fr_kernel_call *c, const fr_tensor *wq, const fr_tensor *ws, int64_t o0,
                   int64_t rows, const fr_linear_dims *d) {
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k = fr_cl_kernel(c->ctx, cl, "quant", "dequant");
    if (!k) return FR_ERR_ARG;
    cl_mem wm = fr_cl_mem(wq), tm = fr_cl_mem(ws);
    cl_ulong wo = wq->off, to = fr_cl_off(ws), uO = (cl_ulong)d->O, uK = (cl_ulong)d->K,
             i0 = (cl_ulong)(o0 * d->K), un = (cl_ulong)(rows * d->K);
    cl_int fmt = c->node->attr.qfmt;
    int st =
        FR_CL_ARGS(c->ctx, k, sizeof wm, &wm, sizeof wo, &wo, sizeof fmt, &fmt, sizeof uO, &uO,
                   sizeof uK, &uK, sizeof i0, &i0, sizeof un, &un, sizeof tm, &tm, sizeof to, &to);
    size_t gsz = (size_t)un;
    if (!st && gsz) st = fr_cl_run(c->ctx, cl, k, 1, &gsz, NULL);
    return st;
}

/* the tile's rows the workspace holds (an error if fewer than the plan's) */
static int q_tile(fr_kernel_call *c, const char *op, const fr_tensor *ws, const fr_linear_dims *d,
                  int64_t *T) {
    *T = q_tile_rows(d->O, d->K);
    if (!ws->buf || fr_shape_numel(&ws->shape) < *T * d->K)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: a workspace of %lld floats, need %lld", op,
                       (long long)(ws->buf ? fr_shape_numel(&ws->shape) : 0),
                       (long long)(*T * d->K));
    return FR_OK;
}

// x is (N,K), Wq is W' (O,K) quantized, b is (O) or absent, y is (N,O)
// y = b (bias_fill), then per tile of T rows y[:, o0:o0+T] = x W'[o0:o0+T]^T + beta y
int fr_cl_k_qlinear(fr_kernel_call *c) {
    const fr_tensor *x = &c->in[0], *wq = &c->in[1], *b = &c->in[2], *y = &c->out[0];
    const fr_tensor *ws = &c->out[1];
    fr_linear_dims d;
    int64_t T;
    int st = fr_kcheck_qlinear(c, 0, 0, &d);
    if (!st) st = need_f32(c, "qlinear", b, "bias");
    if (!st) st = q_tile(c, "qlinear", ws, &d, &T);
    if (st || d.N == 0) return st;
    const int has_b = b->buf != NULL;
    if (has_b && (st = bias_fill(c, y, b, d.N * d.O, d.O, 1))) return st;
    const mat tile = mat_of(ws, (size_t)d.K), ym = mat_of(y, (size_t)d.O);
    for (int64_t o0 = 0; o0 < d.O && !st; o0 += T) {
        const int64_t rows = d.O - o0 < T ? d.O - o0 : T;
        st = dequant(c, wq, ws, o0, rows, &d);
        if (!st)
            st = gemm(c, "qlinear", scratch_of(c, 0), 0, 1, (size_t)d.N, (size_t)rows, (size_t)d.K,
                      mat_of(x, (size_t)d.K), tile, has_b ? 1.0f : 0.0f, mat_at(ym, (size_t)o0));
    }
    return st;
}

// dy is (N,O), Wq is W' (O,K) quantized, dx is (N,K)
// per tile of T rows dx = dy[:, o0:o0+T] W'[o0:o0+T] + beta dx (beta 1 after the
// first tile, or with accumulate bit 0)
int fr_cl_k_qlinear_bwd(fr_kernel_call *c) {
    const fr_tensor *dy = &c->in[0], *wq = &c->in[1], *dx = &c->out[0], *ws = &c->out[3];
    fr_linear_dims d;
    int64_t T;
    int st = fr_kcheck_qlinear(c, 1, 0, &d);
    if (!st) st = q_tile(c, "qlinear_bwd", ws, &d, &T);
    if (st || d.N == 0 || !dx->buf) return st;
    const mat tile = mat_of(ws, (size_t)d.K), dym = mat_of(dy, (size_t)d.O);
    for (int64_t o0 = 0; o0 < d.O && !st; o0 += T) {
        const int64_t rows = d.O - o0 < T ? d.O - o0 : T;
        st = dequant(c, wq, ws, o0, rows, &d);
        if (!st)
            st = gemm(c, "qlinear_bwd", scratch_of(c, 0), 0, 0, (size_t)d.N, (size_t)d.K,
                      (size_t)rows, mat_at(dym, (size_t)o0), tile,
                      o0 > 0 || acc_bit(c, 0) ? 1.0f : 0.0f, mat_of(dx, (size_t)d.K));
    }
    return st;
}

/* ---- CONV2D ---- */

typedef fr_conv_dims geom; /* col: floats of one image's unroll (0: direct) */

#define CL_CONV_WS_BUDGET ((int64_t)4 << 20) /* floats (16 MiB) of unrolled images */

/* Images per chunk of the workspace: as many as the budget holds, 1..N. */
static int64_t chunk_images(const geom *g) {
    int64_t b = g->col ? CL_CONV_WS_BUDGET / g->col : g->N;
    if (b > g->N) b = g->N;
    return b < 1 ? 1 : b;
}

static int64_t ws_of(const fr_graph *g, const fr_node *n, int j, int want_j) {
    if (j != want_j) return 0;
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    geom gm;
    if (fr_conv_dims_make(&gm, &g->vals[f->in[0]].shape, g->vals[f->in[1]].shape.d[0],
                          f->attr.kernel, f->attr.stride, f->attr.pad) ||
        gm.N < 1 || gm.col == 0)
        return 0;
    return chunk_images(&gm) * gm.col;
}

int64_t fr_cl_ws_conv2d(const fr_graph *g, const fr_node *n, int j) { return ws_of(g, n, j, 1); }
int64_t fr_cl_ws_conv2d_bwd(const fr_graph *g, const fr_node *n, int j) {
    return ws_of(g, n, j, 3);
}

/* The shared shape check (kcheck.h), then the device's own limit. */
static int check_shapes(fr_kernel_call *c, const char *op, geom *g, const fr_tensor *x,
                        const fr_tensor *w, const fr_shape *y) {
    int st = fr_kcheck_conv2d(c, op, g, x, w, y);
    if (st) return st;
    if (g->direct && x->dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: a 16-bit input on a 1x1 convolution", op);
    return FR_OK;
}

/* Images per chunk that the planned workspace ws holds (an error if none). */
static int ws_chunk(fr_kernel_call *c, const char *op, const geom *g, const fr_tensor *ws,
                    int64_t *B) {
    if (!g->col) {
        *B = g->N;
        return FR_OK;
    }
    int64_t have = ws->buf ? fr_shape_numel(&ws->shape) : 0;
    *B = have / g->col < g->N ? have / g->col : g->N;
    if (*B < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: workspace of %lld floats, need at least %lld", op,
                       (long long)have, (long long)g->col);
    return FR_OK;
}

/* The geometry as gemm.cl's GEOM_ARGS, after the other arguments. */
#define GEOM_PAIRS(u)                                                                            \
    sizeof u[0], &u[0], sizeof u[1], &u[1], sizeof u[2], &u[2], sizeof u[3], &u[3], sizeof u[4], \
        &u[4], sizeof u[5], &u[5], sizeof u[6], &u[6], sizeof u[7], &u[7]

static void geom_args(const geom *g, cl_ulong u[8]) {
    const int64_t v[8] = {g->C, g->H, g->W, g->K, g->S, g->P, g->OH, g->OW};
    for (int i = 0; i < 8; i++) u[i] = (cl_ulong)v[i];
}

/* ws (from its start) = the unroll of images [n0, n0 + nimg) of x */
static int im2col(fr_kernel_call *c, const geom *g, const fr_tensor *x, int64_t n0, int64_t nimg,
                  const fr_tensor *ws) {
    const char *name = x->dtype == FR_F16    ? "im2col_f16"
                       : x->dtype == FR_BF16 ? "im2col_bf16"
                                             : "im2col_f32";
    cl_mem xm = fr_cl_mem(x), wm = fr_cl_mem(ws);
    cl_ulong xo = fr_cl_off(x) + (cl_ulong)(n0 * g->chw), wo = fr_cl_off(ws), un = (cl_ulong)nimg;
    cl_ulong u[8];
    geom_args(g, u);
    LAUNCH(c, name, nimg * g->col, sizeof xm, &xm, sizeof xo, &xo, sizeof wm, &wm, sizeof wo, &wo,
           sizeof un, &un, GEOM_PAIRS(u));
    return FR_OK;
}

// x is (N,C,H,W), W is (OC,C,K,K), b is (OC) or absent, y is (N,OC,OH,OW)
// per chunk of images: col = im2col(x_n) in the workspace, then one batched
// GEMM y_n (OC, OH*OW) = W (OC, C*K*K) @ col_n (C*K*K, OH*OW) + beta y_n,
// y seeded with the bias first (beta 1) when there is one
int fr_cl_k_conv2d(fr_kernel_call *c) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *b = &c->in[2], *y = &c->out[0];
    const fr_tensor *ws = &c->out[1];
    geom g;
    int st = check_shapes(c, "conv2d", &g, x, w, &y->shape);
    if (st || (st = need_f32(c, "conv2d", w, "weight")) || (st = need_f32(c, "conv2d", b, "bias")))
        return st;
    if (g.N == 0 || g.OC == 0 || g.ohw == 0) return FR_OK;
    int64_t B;
    if ((st = ws_chunk(c, "conv2d", &g, ws, &B))) return st;
    const int has_b = b->buf != NULL;
    if (has_b && (st = bias_fill(c, y, b, g.N * g.OC * g.ohw, g.OC, g.ohw))) return st;
    if (g.ckk == 0) return has_b ? FR_OK : zero_tensor(c, y, g.N * g.OC * g.ohw);
    const mat wmat = mat_of(w, (size_t)g.ckk), ymat = mat_of(y, (size_t)g.ohw);
    for (int64_t n0 = 0; n0 < g.N; n0 += B) {
        int64_t nb = g.N - n0 < B ? g.N - n0 : B;
        mat cols = mat_of(g.direct ? x : ws, (size_t)g.ohw);
        if (g.direct) cols = mat_at(cols, (size_t)(n0 * g.chw));
        else if ((st = im2col(c, &g, x, n0, nb, ws))) return st;
        st = gemm_batched(c, "conv2d", scratch_of(c, 0), 0, 0, (size_t)g.OC, (size_t)g.ohw,
                          (size_t)g.ckk, wmat, 0, cols, (size_t)(g.direct ? g.chw : g.col),
                          has_b ? 1.0f : 0.0f, mat_at(ymat, (size_t)(n0 * g.OC * g.ohw)),
                          (size_t)(g.OC * g.ohw), (size_t)nb);
        if (st) return st;
    }
    return FR_OK;
}

// dy is (N,OC,OH,OW), x is (N,C,H,W), W is (OC,C,K,K); each output absent when buf is NULL
// db (OC)        = sum_{n,oh,ow} dy (plane_sums, in double; accumulate bit 2)
// dW (OC, C*K*K) = sum_n dy_n (OC, OH*OW) @ col_n^T: one GEMM per image, in
//                  order, beta 1 after the first (accumulate bit 1: from the first)
// dx_n           = col2im(W^T (C*K*K, OC) @ dy_n): a batched GEMM per chunk
//                  into the workspace, then the gather (accumulate bit 0);
//                  a 1x1 unpadded convolution's GEMM writes dx itself
int fr_cl_k_conv2d_bwd(fr_kernel_call *c) {
    const fr_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2];
    const fr_tensor *dx = &c->out[0], *dw = &c->out[1], *db = &c->out[2], *ws = &c->out[3];
    geom g;
    int st = check_shapes(c, "conv2d_bwd", &g, x, w, &dy->shape);
    if (st || (st = need_f32(c, "conv2d_bwd", dy, "gradient")) ||
        (st = need_f32(c, "conv2d_bwd", w, "weight")))
        return st;
    const int64_t wn = g.OC * g.ckk, yn = g.OC * g.ohw;
    if (db->buf && g.OC > 0) {
        cl_mem dym = fr_cl_mem(dy), dbm = fr_cl_mem(db);
        cl_ulong dyo = fr_cl_off(dy), dbo = fr_cl_off(db), un = (cl_ulong)g.N, uoc = (cl_ulong)g.OC,
                 uhw = (cl_ulong)g.ohw;
        cl_int acc = acc_bit(c, 2);
        LAUNCH(c, "plane_sums", g.OC, sizeof dym, &dym, sizeof dyo, &dyo, sizeof un, &un,
               sizeof uoc, &uoc, sizeof uhw, &uhw, sizeof dbm, &dbm, sizeof dbo, &dbo, sizeof acc,
               &acc);
    }
    const int want_dx = dx->buf != NULL, want_dw = dw->buf != NULL;
    if (!want_dx && !want_dw) return FR_OK;
    if (g.N == 0 || g.ckk == 0) { /* nothing flows: clear what is not accumulated */
        if (want_dw && wn > 0 && !acc_bit(c, 1) && (st = zero_tensor(c, dw, wn))) return st;
        if (want_dx && g.N * g.chw > 0 && !acc_bit(c, 0) && (st = zero_tensor(c, dx, g.N * g.chw)))
            return st;
        return FR_OK;
    }
    if (g.OC == 0 || g.ohw == 0) { /* no output positions: the gradients are zero */
        if (want_dw && !acc_bit(c, 1) && (st = zero_tensor(c, dw, wn))) return st;
        if (want_dx && !acc_bit(c, 0) && (st = zero_tensor(c, dx, g.N * g.chw))) return st;
        return FR_OK;
    }
    int64_t B;
    if ((st = ws_chunk(c, "conv2d_bwd", &g, ws, &B))) return st;
    const mat dymat = mat_of(dy, (size_t)g.ohw), wmat = mat_of(w, (size_t)g.ckk);
    const int acc_w = acc_bit(c, 1), acc_x = acc_bit(c, 0);
    if (want_dx && g.direct) /* dx_n (C, HW) = W^T (C, OC) @ dy_n, all images at once */
        if ((st =
                 gemm_batched(c, "conv2d_bwd", scratch_of(c, 0), 1, 0, (size_t)g.ckk, (size_t)g.ohw,
                              (size_t)g.OC, wmat, 0, dymat, (size_t)yn, acc_x ? 1.0f : 0.0f,
                              mat_of(dx, (size_t)g.ohw), (size_t)g.chw, (size_t)g.N)))
            return st;
    cl_ulong u[8];
    geom_args(&g, u);
    for (int64_t n0 = 0; n0 < g.N; n0 += B) {
        int64_t nb = g.N - n0 < B ? g.N - n0 : B;
        if (want_dw) {
            mat cols = mat_of(g.direct ? x : ws, (size_t)g.ohw);
            if (g.direct) cols = mat_at(cols, (size_t)(n0 * g.chw));
            else if ((st = im2col(c, &g, x, n0, nb, ws))) return st;
            for (int64_t i = 0; i < nb; i++) {
                float beta = n0 + i == 0 && !acc_w ? 0.0f : 1.0f;
                st = gemm(c, "conv2d_bwd", scratch_of(c, 0), 0, 1, (size_t)g.OC, (size_t)g.ckk,
                          (size_t)g.ohw, mat_at(dymat, (size_t)((n0 + i) * yn)),
                          mat_at(cols, (size_t)(i * (g.direct ? g.chw : g.col))), beta,
                          mat_of(dw, (size_t)g.ckk));
                if (st) return st;
            }
        }
        if (want_dx && !g.direct) {
            st = gemm_batched(c, "conv2d_bwd", scratch_of(c, 0), 1, 0, (size_t)g.ckk, (size_t)g.ohw,
                              (size_t)g.OC, wmat, 0, mat_at(dymat, (size_t)(n0 * yn)), (size_t)yn,
                              0.0f, mat_of(ws, (size_t)g.ohw), (size_t)g.col, (size_t)nb);
            if (st) return st;
            cl_mem wsm = fr_cl_mem(ws), dxm = fr_cl_mem(dx);
            cl_ulong wso = fr_cl_off(ws), dxo = fr_cl_off(dx) + (cl_ulong)(n0 * g.chw),
                     un = (cl_ulong)nb;
            cl_int acc = acc_x;
            LAUNCH(c, "col2im", nb * g.chw, sizeof wsm, &wsm, sizeof wso, &wso, sizeof dxm, &dxm,
                   sizeof dxo, &dxo, sizeof un, &un, GEOM_PAIRS(u), sizeof acc, &acc);
        }
    }
    return FR_OK;
}

/* ---- the step's GEMM scratch, planned ---- */

/* The most temporary bytes CLBlast asks for this GEMM at any operand offset
 * (offsets 1: every operand that might be copied counted as copied). */
static size_t plan_temp(cl_command_queue q, int ta, int tb, int64_t m, int64_t n, int64_t k,
                        int64_t lda, int64_t ldb, int64_t ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    return temp_bytes(q, ta, tb, (size_t)m, (size_t)n, (size_t)k, 1, (size_t)lda, 1, (size_t)ldb, 1,
                      (size_t)ldc);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

int64_t fr_cl_ws_gemm(const fr_graph *g, const fr_node *n) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    size_t bytes = 0;
    switch (n->op) {
    case FR_OP_LINEAR:
    case FR_OP_LINEAR_BWD: { /* x, W: LINEAR's in[0], in[1]; LINEAR_BWD's in[1], in[2] */
        const int bwd = n->op == FR_OP_LINEAR_BWD;
        const fr_shape *w = &g->vals[n->in[1 + bwd]].shape;
        if (w->ndim != 2 || w->d[1] <= 0 || w->d[0] <= 0) return 0;
        /* rows: of x, or of dy in a backward without x (no dW) */
        const int64_t O = w->d[0], K = w->d[1], N = fr_op_linear_rows(g, n);
        cl_command_queue q = fr_cl_queue(fr_cl_of(g->ctx));
        if (n->op == FR_OP_LINEAR) {
            bytes = plan_temp(q, 0, 1, N, O, K, K, K, O);
        } else {
            bytes =
                max_sz(plan_temp(q, 0, 0, N, K, O, O, K, K), plan_temp(q, 1, 0, O, K, N, O, K, K));
        }
        break;
    }
    case FR_OP_QLINEAR:
    case FR_OP_QLINEAR_BWD: { /* x (N,K) times a tile (T,K)^T; dy's columns (N,T) times it */
        const fr_shape *s = &f->attr.shape;
        if (s->ndim != 2 || s->d[0] < 1 || s->d[1] < 1) return 0;
        const int64_t O = s->d[0], K = s->d[1], T = q_tile_rows(O, K);
        const int64_t N =
            fr_shape_numel(&g->vals[n->in[0]].shape) / (n->op == FR_OP_QLINEAR ? K : O);
        cl_command_queue q = fr_cl_queue(fr_cl_of(g->ctx));
        bytes = n->op == FR_OP_QLINEAR ? plan_temp(q, 0, 1, N, T, K, K, K, O)
                                       : plan_temp(q, 0, 0, N, K, T, O, K, K);
        break;
    }
    case FR_OP_CONV2D:
    case FR_OP_CONV2D_BWD: {
        geom gm;
        if (fr_conv_dims_make(&gm, &g->vals[f->in[0]].shape, g->vals[f->in[1]].shape.d[0],
                              f->attr.kernel, f->attr.stride, f->attr.pad))
            return 0;
        cl_command_queue q = fr_cl_queue(fr_cl_of(g->ctx));
        if (n->op == FR_OP_CONV2D) {
            bytes = plan_temp(q, 0, 0, gm.OC, gm.ohw, gm.ckk, gm.ckk, gm.ohw, gm.ohw);
        } else {
            bytes = max_sz(plan_temp(q, 1, 0, gm.ckk, gm.ohw, gm.OC, gm.ckk, gm.ohw, gm.ohw),
                           plan_temp(q, 0, 1, gm.OC, gm.ckk, gm.ohw, gm.ohw, gm.ohw, gm.ckk));
        }
        break;
    }
    case FR_OP_LINEAR_CE:
    case FR_OP_LINEAR_CE_BWD: { /* a chunk's GEMMs: its logits, then dz W and dz^T x */
        const fr_shape *w = &g->vals[f->in[1]].shape;
        if (w->ndim != 2 || w->d[1] <= 0 || w->d[0] <= 0) return 0;
        const int64_t V = w->d[0], C = w->d[1], R = fr_op_ce_chunk_rows(g, n);
        const int64_t N = fr_shape_numel(&g->vals[f->in[0]].shape) / C;
        const int64_t rows[2] = {R, R > 0 && N % R ? N % R : R}; /* a chunk, the last one */
        cl_command_queue q = fr_cl_queue(fr_cl_of(g->ctx));
        for (int i = 0; i < 2; i++) {
            bytes = max_sz(bytes, plan_temp(q, 0, 1, rows[i], V, C, C, C, V));
            if (n->op == FR_OP_LINEAR_CE_BWD)
                bytes = max_sz(max_sz(bytes, plan_temp(q, 0, 0, rows[i], C, V, V, C, C)),
                               plan_temp(q, 1, 0, V, C, rows[i], V, C, C));
        }
        break;
    }
    default: return 0;
    }
    if (bytes == SIZE_MAX) return 0; /* CLBlast cannot size it: the kernel will say so */
    return (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
}

/* ---- the head fused with its loss: LINEAR_CE, LINEAR_CE_BWD ---- */

/* Workspace (floats; backend.c's cl_ws sizes it with fr_cl_ws_linear_ce):
 *   forward  [2 N: each row's lse - z[y] (reduce.cl's acc_t) | N: its hit flag | R V: logits]
 *   backward [2 V: db's column sums (acc_t) | R V: a chunk's logits, then dz] */
int64_t fr_cl_ws_linear_ce(const fr_graph *g, const fr_node *n, int j) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    const int bwd = n->op == FR_OP_LINEAR_CE_BWD;
    const fr_shape *w = &g->vals[f->in[1]].shape;
    if (j != (bwd ? 4 : 2) || w->ndim != 2 || w->d[1] < 1) return 0;
    const int64_t N = fr_shape_numel(&g->vals[f->in[0]].shape) / w->d[1], V = w->d[0];
    return fr_op_ce_chunk_rows(g, n) * V + (bwd ? 2 * V : 3 * N);
}

#define RWG 64 /* reduce.cl's work-group size */

/* reduce.cl's kernel `name` with the arguments set, over `groups` work-groups
 * of RWG lanes (one_per_item: over n work-items, the implementation's groups) */
#define LAUNCH_R(c, name, n, one_per_item, ...)                                              \
    do {                                                                                     \
        fr_cl *cl_ = fr_cl_of((c)->ctx);                                                     \
        cl_kernel k_ = fr_cl_kernel((c)->ctx, cl_, "reduce", (name));                        \
        if (!k_) return FR_ERR_ARG;                                                          \
        int st_ = FR_CL_ARGS((c)->ctx, k_, __VA_ARGS__);                                     \
        if (st_) return st_;                                                                 \
        size_t g_ = (size_t)(n), l_ = RWG;                                                   \
        if (!(one_per_item)) g_ *= RWG;                                                      \
        else g_ = (g_ + RWG - 1) / RWG * RWG;                                                \
        if (g_ && (st_ = fr_cl_run((c)->ctx, cl_, k_, 1, &g_, (one_per_item) ? NULL : &l_))) \
            return st_;                                                                      \
    } while (0)

/* the N labels in [0, V), read back a block at a time (this waits for the
 * queue); the CPU's message for the first one outside */
static int lce_labels(fr_kernel_call *c, const char *op, int64_t N, int64_t V) {
    enum { BLK = 1024 };
    int32_t b[BLK];
    const fr_tensor *t = &c->in[3];
    for (int64_t lo = 0; lo < N; lo += BLK) {
        const int64_t cnt = N - lo < BLK ? N - lo : BLK;
        int st =
            fr_cl_read(c->ctx, fr_cl_of(c->ctx), fr_cl_mem(t),
                       t->off + (size_t)lo * sizeof(int32_t), b, (size_t)cnt * sizeof(int32_t));
        if (st) return st;
        for (int64_t i = 0; i < cnt; i++)
            if (b[i] < 0 || b[i] >= V) return fr_kcheck_linear_ce_label(c, op, lo + i, b[i], V);
    }
    return FR_OK;
}

/* z (r, V) at float offset zoff of the workspace = x[n0 : n0 + r] W^T + b */
static int lce_logits(fr_kernel_call *c, const char *op, const fr_tensor *ws, size_t zoff,
                      int64_t n0, int64_t r, int64_t C, int64_t V) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *b = &c->in[2];
    fr_tensor zt = *ws;
    zt.off += zoff * sizeof(float);
    int st;
    if (b->buf && (st = bias_fill(c, &zt, b, r * V, V, 1))) return st;
    if (C == 0) return b->buf ? FR_OK : zero_tensor(c, &zt, r * V);
    return gemm(c, op, scratch_of(c, 0), 0, 1, (size_t)r, (size_t)V, (size_t)C,
                mat_at(mat_of(x, (size_t)C), (size_t)(n0 * C)), mat_of(w, (size_t)C),
                b->buf ? 1.0f : 0.0f, mat_of(&zt, (size_t)V));
}

// x is (N,C) or (B,T,C), W is (V,C), b is (V) or absent, y is (N) i32 (fr_k_linear_ce):
// per chunk of R rows the logits by CLBlast, lce_rows a row each; lce_sum in the CPU's blocks
int fr_cl_k_linear_ce(fr_kernel_call *c) {
    fr_ce_dims d;
    int st = fr_kcheck_linear_ce(c, "linear_ce", 2, 3, 0, &d);
    if (st) return st;
    for (int i = 0; i < 3 && !st; i++) st = need_f32(c, "linear_ce", &c->in[i], "input");
    if (st || (st = lce_labels(c, "linear_ce", d.N, d.V))) return st;
    const int64_t N = d.N, C = d.C, V = d.V, R = d.R;
    const fr_tensor *ws = &c->out[2];
    cl_mem lm = fr_cl_mem(&c->out[0]), hm = fr_cl_mem(&c->out[1]), wm = fr_cl_mem(ws),
           ym = fr_cl_mem(&c->in[3]);
    cl_ulong lo = fr_cl_off(&c->out[0]), ho = hm ? c->out[1].off / sizeof(int32_t) : 0,
             wo = fr_cl_off(ws), yo = c->in[3].off / sizeof(int32_t);
    if (N == 0 || V == 0) {
        if (hm && (st = fr_cl_zero(c->ctx, fr_cl_of(c->ctx), hm, c->out[1].off, 4))) return st;
        return fr_cl_zero(c->ctx, fr_cl_of(c->ctx), lm, c->out[0].off, sizeof(float));
    }
    const size_t zoff = (size_t)(3 * N);
    cl_long n = N, v = V;
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        if ((st = lce_logits(c, "linear_ce", ws, zoff, n0, r, C, V))) return st;
        cl_ulong zo = wo + zoff;
        cl_long first = n0;
        LAUNCH_R(c, "lce_rows", r, 0, sizeof wm, &wm, sizeof zo, &zo, sizeof ym, &ym, sizeof yo,
                 &yo, sizeof wm, &wm, sizeof wo, &wo, sizeof n, &n, sizeof first, &first, sizeof v,
                 &v);
    }
    LAUNCH_R(c, "lce_sum", 1, 0, sizeof wm, &wm, sizeof wo, &wo, sizeof n, &n, sizeof lm, &lm,
             sizeof lo, &lo, sizeof hm, &hm, sizeof ho, &ho);
    return FR_OK;
}

// the backward of fr_cl_k_linear_ce (fr_k_linear_ce_bwd): per chunk the logits again,
// dz in place by reduce.cl's cross_entropy_bwd (its divisor N, the chunk's rows),
// dx = dz W and dW += dz^T x by CLBlast, db's sums in acc_t across the chunks
int fr_cl_k_linear_ce_bwd(fr_kernel_call *c) {
    fr_ce_dims d;
    int st = fr_kcheck_linear_ce(c, "linear_ce_bwd", 4, 0, 2, &d);
    if (st) return st;
    for (int i = 0; i < 3 && !st; i++) st = need_f32(c, "linear_ce_bwd", &c->in[i], "input");
    if (st || (st = lce_labels(c, "linear_ce_bwd", d.N, d.V))) return st;
    if (c->node->update)
        return fr_fail(c->ctx, FR_ERR_ARG, "linear_ce_bwd: no optimizer step inside this kernel");
    const int64_t N = d.N, C = d.C, V = d.V, R = d.R;
    const fr_tensor *dx = &c->out[0], *dw = &c->out[1], *db = &c->out[2], *ws = &c->out[4];
    const int ax = acc_bit(c, 0), aw = acc_bit(c, 1), ab = acc_bit(c, 2);
    if (N == 0 || V == 0) {
        if (dx->buf && !ax && N * C > 0 && (st = zero_tensor(c, dx, N * C))) return st;
        if (dw->buf && !aw && V * C > 0 && (st = zero_tensor(c, dw, V * C))) return st;
        if (db->buf && !ab && V && (st = zero_tensor(c, db, V))) return st;
        return FR_OK;
    }
    const size_t zoff = (size_t)(2 * V);
    cl_mem wm = fr_cl_mem(ws), ym = fr_cl_mem(&c->in[3]);
    cl_ulong wo = fr_cl_off(ws), yo = c->in[3].off / sizeof(int32_t), zo = wo + zoff;
    cl_long n = N, v = V;
    cl_float scale = c->node->attr.scale;
    cl_int acc0 = 0;
    const mat z = {wm, (size_t)zo, (size_t)V};
    for (int64_t n0 = 0; n0 < N; n0 += R) {
        const int64_t r = N - n0 < R ? N - n0 : R;
        if ((st = lce_logits(c, "linear_ce_bwd", ws, zoff, n0, r, C, V))) return st;
        cl_ulong yo0 = yo + (cl_ulong)n0;
        LAUNCH_R(c, "cross_entropy_bwd", r, 0, sizeof wm, &wm, sizeof zo, &zo, sizeof ym, &ym,
                 sizeof yo0, &yo0, sizeof wm, &wm, sizeof zo, &zo, sizeof n, &n, sizeof v, &v,
                 sizeof scale, &scale, sizeof acc0, &acc0);
        if (dx->buf && C > 0 &&
            (st = gemm(c, "linear_ce_bwd", scratch_of(c, 0), 0, 0, (size_t)r, (size_t)C, (size_t)V,
                       z, mat_of(&c->in[1], (size_t)C), ax ? 1.0f : 0.0f,
                       mat_at(mat_of(dx, (size_t)C), (size_t)(n0 * C)))))
            return st;
        if (dw->buf && C > 0 &&
            (st = gemm(c, "linear_ce_bwd", scratch_of(c, 0), 1, 0, (size_t)V, (size_t)C, (size_t)r,
                       z, mat_at(mat_of(&c->in[0], (size_t)C), (size_t)(n0 * C)),
                       n0 == 0 && !aw ? 0.0f : 1.0f, mat_of(dw, (size_t)C))))
            return st;
        if (db->buf) {
            cl_long rr = r;
            cl_int first = n0 == 0;
            LAUNCH_R(c, "lce_db_add", V, 1, sizeof wm, &wm, sizeof zo, &zo, sizeof wm, &wm,
                     sizeof wo, &wo, sizeof rr, &rr, sizeof v, &v, sizeof first, &first);
        }
    }
    if (db->buf) {
        cl_mem dbm = fr_cl_mem(db);
        cl_ulong dbo = fr_cl_off(db);
        cl_int acc = ab;
        LAUNCH_R(c, "lce_db_store", V, 1, sizeof wm, &wm, sizeof wo, &wo, sizeof dbm, &dbm,
                 sizeof dbo, &dbo, sizeof v, &v, sizeof acc, &acc);
    }
    return FR_OK;
}
