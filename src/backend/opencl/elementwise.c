/* elementwise.c — the OpenCL kernels of the elementwise ops (RELU, GELU,
 * SIGMOID, TANH and their backward, ADD, COPY, CAST, DROPOUT and its
 * backward, POS_EMBEDDING) and the step's gradient scaling, with the CPU
 * kernels' semantics and error messages (src/backend/cpu/activation.c,
 * copy.c, cast.c, dropout.c, embedding.c, grad.c). The arithmetic is in
 * kernels/elementwise.cl; this file checks shapes and dtypes, sets the
 * arguments and enqueues one work-item per element. Nothing here waits,
 * except the unscale check, which reads its flag back. */
#include "backend/opencl/elementwise.h"

#include <stdio.h>
#include <string.h>

#include "backend/opencl/backend.h"
#include "core/ctx.h"
#include "backend/kcheck.h"

#define PROG "elementwise"

/* The .cl's dtype codes. */
enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_NONE = -1 };

static int dt_code(fr_dtype dt) {
    return dt == FR_F32 ? DT_F32 : dt == FR_F16 ? DT_F16 : dt == FR_BF16 ? DT_BF16 : DT_NONE;
}

static int acc_bit(const fr_kernel_call *c, int j) { return (c->accumulate >> j) & 1u; }

static int present(const fr_tensor *t) { return t->buf != NULL; }

/* the same storage: a kernel that would copy a tensor onto itself does nothing */
static int same_place(const fr_tensor *a, const fr_tensor *b) {
    return a->buf == b->buf && a->off == b->off;
}

/* PROG's kernel `name`. fr_cl_kernel answers NULL with its message set:
 * the status is FR_ERR_NOMEM when that message says memory ran out (a host
 * allocation, or the CL's own), else FR_ERR_ARG (a build or lookup error). */
static int kernel_of(fr_ctx *ctx, fr_cl *cl, const char *name, cl_kernel *k) {
    *k = fr_cl_kernel(ctx, cl, PROG, name);
    if (*k) return FR_OK;
    return strstr(ctx->err, "out of memory") || strstr(ctx->err, "OUT_OF_") ? FR_ERR_NOMEM
                                                                            : FR_ERR_ARG;
}

/* Enqueue k over n work-items once its arguments are set (args_status: the
 * status of setting them). */
static int run_1d(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int args_status, int64_t n) {
    if (args_status) return args_status;
    const size_t global = (size_t)n;
    return fr_cl_run(ctx, cl, k, 1, &global, NULL);
}

static int need_f32(fr_kernel_call *c, const fr_tensor *t, const char *op, const char *what) {
    if (t->dtype == FR_F32) return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: %s is %s, only f32 is supported", op, what,
                   fr_dtype_name(t->dtype));
}

/* ---- activations ---- */

/* the activation kernel NAME_fwd / NAME_bwd, or its 16-bit twin NAME_fwd_h / NAME_bwd_h */
static int act_kernel(fr_ctx *ctx, fr_cl *cl, const char *name, const char *dir, int half,
                      cl_kernel *k) {
    char full[64];
    snprintf(full, sizeof full, "%s_%s%s", name, dir, half ? "_h" : "");
    return kernel_of(ctx, cl, full, k);
}

// y = F(x): x f32 (n), y f32, f16 or bf16 (n; the f32 result rounded); name: the .cl's formula
static int act_fwd(fr_kernel_call *c, const char *op, const char *name) {
    int64_t n;
    int st = fr_kcheck_same_numel(c, op, &n);
    if (st || (st = need_f32(c, &c->in[0], op, "x"))) return st;
    const int ydt = dt_code(c->out[0].dtype);
    if (ydt == DT_NONE)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: output dtype %s is not supported", op,
                       fr_dtype_name(c->out[0].dtype));
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = act_kernel(c->ctx, cl, name, "fwd", ydt != DT_F32, &k))) return st;
    cl_mem x = fr_cl_mem(&c->in[0]), y = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, xo = fr_cl_off(&c->in[0]), yo = fr_cl_off(&c->out[0]);
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof x, &x, sizeof xo, &xo, sizeof y, &y,
                    sizeof yo, &yo);
    if (!st && ydt != DT_F32) st = fr_cl_arg(c->ctx, k, 5, sizeof ydt, &ydt);
    return run_1d(c->ctx, cl, k, st, n);
}

// dx (+)= G(dy, s): dy, dx f32 (n), s the saved y or x in f32, f16 or bf16 (n); dx absent:
// nothing; name: the .cl's formula
static int act_bwd(fr_kernel_call *c, const char *op, const char *name) {
    int64_t n;
    int st = fr_kcheck_same_numel(c, op, &n);
    if (st) return st;
    if (fr_shape_numel(&c->in[1].shape) != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: saved input has %lld elements, dy %lld", op,
                       (long long)fr_shape_numel(&c->in[1].shape), (long long)n);
    if (!present(&c->out[0])) return FR_OK;
    if ((st = need_f32(c, &c->in[0], op, "dy")) || (st = need_f32(c, &c->out[0], op, "dx")))
        return st;
    const int sdt = dt_code(c->in[1].dtype);
    if (sdt == DT_NONE)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: saved input dtype %s is not supported", op,
                       fr_dtype_name(c->in[1].dtype));
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = act_kernel(c->ctx, cl, name, "bwd", sdt != DT_F32, &k))) return st;
    cl_mem dy = fr_cl_mem(&c->in[0]), s = fr_cl_mem(&c->in[1]), dx = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, dyo = fr_cl_off(&c->in[0]), so = fr_cl_off(&c->in[1]),
             dxo = fr_cl_off(&c->out[0]);
    const int acc = acc_bit(c, 0);
    if (sdt == DT_F32)
        st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof dy, &dy, sizeof dyo, &dyo, sizeof s, &s,
                        sizeof so, &so, sizeof dx, &dx, sizeof dxo, &dxo, sizeof acc, &acc);
    else
        st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof dy, &dy, sizeof dyo, &dyo, sizeof s, &s,
                        sizeof so, &so, sizeof sdt, &sdt, sizeof dx, &dx, sizeof dxo, &dxo,
                        sizeof acc, &acc);
    return run_1d(c->ctx, cl, k, st, n);
}

static int tanh_form(const fr_kernel_call *c) { return c->node && c->node->attr.approx; }

// y = max(x, 0) (a NaN passes through); dx = dy where y > 0, else 0
int fr_cl_k_relu(fr_kernel_call *c) { return act_fwd(c, "relu", "relu"); }
int fr_cl_k_relu_bwd(fr_kernel_call *c) { return act_bwd(c, "relu_bwd", "relu"); }
// attr.approx 0: y = 0.5 x (1 + erf(x / sqrt 2)); 1: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
int fr_cl_k_gelu(fr_kernel_call *c) {
    return act_fwd(c, "gelu", tanh_form(c) ? "gelu_tanh" : "gelu_erf");
}
int fr_cl_k_gelu_bwd(fr_kernel_call *c) {
    return act_bwd(c, "gelu_bwd", tanh_form(c) ? "gelu_tanh" : "gelu_erf");
}
// y = 1 / (1 + exp(-x)); dx = dy y (1 - y)
int fr_cl_k_sigmoid(fr_kernel_call *c) { return act_fwd(c, "sigmoid", "sigmoid"); }
int fr_cl_k_sigmoid_bwd(fr_kernel_call *c) { return act_bwd(c, "sigmoid_bwd", "sigmoid"); }
// y = tanh(x); dx = dy (1 - y^2)
int fr_cl_k_tanh(fr_kernel_call *c) { return act_fwd(c, "tanh", "tanh"); }
int fr_cl_k_tanh_bwd(fr_kernel_call *c) { return act_bwd(c, "tanh_bwd", "tanh"); }

/* ---- ADD, COPY ---- */

// a, b, y all f32 with n elements; y = a + b (y may alias a or b)
int fr_cl_k_add(fr_kernel_call *c) {
    int64_t n;
    int st = fr_kcheck_add(c, &n);
    if (st) return st;
    if ((st = need_f32(c, &c->in[0], "add", "a")) || (st = need_f32(c, &c->in[1], "add", "b")) ||
        (st = need_f32(c, &c->out[0], "add", "y")))
        return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    st = kernel_of(c->ctx, cl, "add_f32", &k);
    if (st) return st;
    cl_mem a = fr_cl_mem(&c->in[0]), b = fr_cl_mem(&c->in[1]), y = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, ao = fr_cl_off(&c->in[0]), bo = fr_cl_off(&c->in[1]),
             yo = fr_cl_off(&c->out[0]);
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof a, &a, sizeof ao, &ao, sizeof b, &b,
                    sizeof bo, &bo, sizeof y, &y, sizeof yo, &yo);
    return run_1d(c->ctx, cl, k, st, n);
}

/* y += x over n f32 values at element offsets */
static int add_into(fr_ctx *ctx, fr_cl *cl, cl_mem x, cl_ulong xo, cl_mem y, cl_ulong yo,
                    int64_t n) {
    cl_kernel k;
    int st = kernel_of(ctx, cl, "acc_f32", &k);
    if (st) return st;
    cl_ulong un = (cl_ulong)n;
    st = FR_CL_ARGS(ctx, k, sizeof un, &un, sizeof x, &x, sizeof xo, &xo, sizeof y, &y, sizeof yo,
                    &yo);
    return run_1d(ctx, cl, k, st, n);
}

/* y = x, n bytes (nothing when they are the same storage) */
static int copy_bytes(fr_ctx *ctx, const fr_tensor *x, const fr_tensor *y, size_t bytes) {
    if (same_place(x, y)) return FR_OK;
    return fr_cl_copy(ctx, fr_cl_of(ctx), fr_cl_mem(y), y->off, fr_cl_mem(x), x->off, bytes);
}

// x and y f32 with the same number of elements: y = x, or y += x under accumulate bit 0
int fr_cl_k_copy(fr_kernel_call *c) {
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    int st;
    if ((st = need_f32(c, &c->in[0], "copy", "x")) || (st = need_f32(c, &c->out[0], "copy", "y")))
        return st;
    if (!acc_bit(c, 0)) return copy_bytes(c->ctx, &c->in[0], &c->out[0], (size_t)n * 4);
    return add_into(c->ctx, fr_cl_of(c->ctx), fr_cl_mem(&c->in[0]), fr_cl_off(&c->in[0]),
                    fr_cl_mem(&c->out[0]), fr_cl_off(&c->out[0]), n);
}

/* ---- CAST ---- */

// x and y have the same shape; dtypes f32, f16 or bf16; attr.round: f32 -> f32
// rounded through that 16-bit format. With the accumulate bit, f32 -> f16/bf16
// adds into y (round(widen(y) + x)).
int fr_cl_k_cast(fr_kernel_call *c) {
    const fr_dtype from = c->in[0].dtype, to = c->out[0].dtype;
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_mem x = fr_cl_mem(&c->in[0]), y = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, xo = fr_cl_off(&c->in[0]), yo = fr_cl_off(&c->out[0]);
    const int xdt = dt_code(from), ydt = dt_code(to);
    int st;
    if (acc_bit(c, 0)) {
        if (from != FR_F32 || (to != FR_F16 && to != FR_BF16))
            return fr_fail(c->ctx, FR_ERR_ARG, "cast: adding %s into %s is not supported",
                           fr_dtype_name(from), fr_dtype_name(to));
        cl_kernel k;
        st = kernel_of(c->ctx, cl, "cast_add", &k);
        if (st) return st;
        st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof x, &x, sizeof xo, &xo, sizeof y, &y,
                        sizeof yo, &yo, sizeof ydt, &ydt);
        return run_1d(c->ctx, cl, k, st, n);
    }
    const fr_dtype round = c->node ? c->node->attr.round : FR_F32;
    int rdt = DT_F32;
    if (from == FR_F32 && to == FR_F32 && (round == FR_F16 || round == FR_BF16)) {
        rdt = dt_code(round);
    } else if (from == to) {
        return copy_bytes(c->ctx, &c->in[0], &c->out[0], (size_t)n * fr_dtype_size(from));
    } else if (!((from == FR_F32 && (to == FR_F16 || to == FR_BF16)) ||
                 (to == FR_F32 && (from == FR_F16 || from == FR_BF16)))) {
        return fr_fail(c->ctx, FR_ERR_ARG, "cast from %s to %s is not supported",
                       fr_dtype_name(from), fr_dtype_name(to));
    }
    cl_kernel k;
    st = kernel_of(c->ctx, cl, "cast", &k);
    if (st) return st;
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof x, &x, sizeof xo, &xo, sizeof xdt, &xdt,
                    sizeof y, &y, sizeof yo, &yo, sizeof ydt, &ydt, sizeof rdt, &rdt);
    return run_1d(c->ctx, cl, k, st, n);
}

/* ---- DROPOUT ---- */

/* The scale applied to kept elements: 1/(1-p); with p >= 1 nothing is kept. */
static float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

/* core/rng.c's fr_rng_u64(seed, stream, i) = mix(mix(mix(seed) ^ stream) ^ i):
 * the part that does not depend on i, made here once for the device. */
static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// x, y f32 (n elements), mask u8 (n) or absent
// training: keep_i = fr_rng_uniform(seed, (step << 32) | salt, i) >= p;
//           y_i = keep_i ? x_i / (1 - p) : 0; mask_i = keep_i
// eval: y = x (mask absent)
int fr_cl_k_dropout(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->out[0].shape) != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "dropout: output has %lld elements, input %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)n);
    int st;
    if ((st = need_f32(c, &c->in[0], "dropout", "x")) ||
        (st = need_f32(c, &c->out[0], "dropout", "y")))
        return st;
    if (!a->training) return copy_bytes(c->ctx, &c->in[0], &c->out[0], (size_t)n * 4);
    if (a->p < 0.0f || a->p > 1.0f)
        return fr_fail(c->ctx, FR_ERR_ARG, "dropout: p = %g is outside [0, 1]", (double)a->p);
    const float p = a->p, scale = keep_scale(p);
    const cl_ulong mixed = mix(mix(c->seed) ^ (((uint64_t)c->step << 32) | a->salt));
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    st = kernel_of(c->ctx, cl, "dropout_fwd", &k);
    if (st) return st;
    cl_mem x = fr_cl_mem(&c->in[0]), y = fr_cl_mem(&c->out[0]), m = fr_cl_mem(&c->out[1]);
    const int has_mask = present(&c->out[1]);
    cl_mem mk = has_mask ? m : y; /* a valid buffer the kernel never writes */
    cl_ulong un = (cl_ulong)n, xo = fr_cl_off(&c->in[0]), yo = fr_cl_off(&c->out[0]),
             mo = has_mask ? c->out[1].off : 0; /* u8: bytes are elements */
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof x, &x, sizeof xo, &xo, sizeof y, &y,
                    sizeof yo, &yo, sizeof mk, &mk, sizeof mo, &mo, sizeof has_mask, &has_mask,
                    sizeof mixed, &mixed, sizeof p, &p, sizeof scale, &scale);
    return run_1d(c->ctx, cl, k, st, n);
}

// dy, dx f32 (n elements), mask u8 (n); dx_i (+)= mask_i ? dy_i / (1 - p) : 0 (dx may alias dy)
// attr.p must be the forward's p. In eval mode (attr.training == 0, no mask) dx (+)= dy.
int fr_cl_k_dropout_bwd(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    const int64_t n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->out[0].shape) != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "dropout_bwd: dx has %lld elements, dy %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)n);
    if (!present(&c->out[0])) return FR_OK;
    int st;
    if ((st = need_f32(c, &c->in[0], "dropout_bwd", "dy")) ||
        (st = need_f32(c, &c->out[0], "dropout_bwd", "dx")))
        return st;
    const int acc = acc_bit(c, 0);
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_mem dy = fr_cl_mem(&c->in[0]), dx = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, dyo = fr_cl_off(&c->in[0]), dxo = fr_cl_off(&c->out[0]);
    if (!present(&c->in[1])) {
        if (a->training)
            return fr_fail(c->ctx, FR_ERR_ARG, "dropout_bwd: the mask is missing in training mode");
        /* eval dropout is the identity */
        if (acc) return add_into(c->ctx, cl, dy, dyo, dx, dxo, n);
        return copy_bytes(c->ctx, &c->in[0], &c->out[0], (size_t)n * 4);
    }
    const float scale = keep_scale(a->p);
    cl_kernel k;
    st = kernel_of(c->ctx, cl, "dropout_bwd", &k);
    if (st) return st;
    cl_mem m = fr_cl_mem(&c->in[1]);
    cl_ulong mo = c->in[1].off; /* u8: bytes are elements */
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof dy, &dy, sizeof dyo, &dyo, sizeof m, &m,
                    sizeof mo, &mo, sizeof dx, &dx, sizeof dxo, &dxo, sizeof scale, &scale,
                    sizeof acc, &acc);
    return run_1d(c->ctx, cl, k, st, n);
}

/* ---- POS_EMBEDDING ---- */

// x (B,T,C), W (Tmax,C) with T <= Tmax, y (B,T,C): y[b,t] = x[b,t] + W[t] (y may alias x)
int fr_cl_k_pos_embedding(fr_kernel_call *c) {
    const fr_shape *xs = &c->in[0].shape, *ws = &c->in[1].shape;
    if (xs->ndim != 3 || ws->ndim != 2 || ws->d[1] != xs->d[2] || xs->d[1] > ws->d[0])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "pos_embedding: x must be (B,T,C) and W (Tmax,C) with T <= Tmax");
    int st;
    if ((st = need_f32(c, &c->in[0], "pos_embedding", "x")) ||
        (st = need_f32(c, &c->in[1], "pos_embedding", "W")) ||
        (st = need_f32(c, &c->out[0], "pos_embedding", "y")))
        return st;
    const int64_t n = xs->d[0] * xs->d[1] * xs->d[2];
    if (n == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    st = kernel_of(c->ctx, cl, "pos_embedding", &k);
    if (st) return st;
    cl_mem x = fr_cl_mem(&c->in[0]), w = fr_cl_mem(&c->in[1]), y = fr_cl_mem(&c->out[0]);
    cl_ulong un = (cl_ulong)n, T = (cl_ulong)xs->d[1], C = (cl_ulong)xs->d[2],
             xo = fr_cl_off(&c->in[0]), wo = fr_cl_off(&c->in[1]), yo = fr_cl_off(&c->out[0]);
    st = FR_CL_ARGS(c->ctx, k, sizeof un, &un, sizeof T, &T, sizeof C, &C, sizeof x, &x, sizeof xo,
                    &xo, sizeof w, &w, sizeof wo, &wo, sizeof y, &y, sizeof yo, &yo);
    return run_1d(c->ctx, cl, k, st, n);
}

/* ---- the step's gradient passes ---- */

/* A gradient's dtype as the passes' kernels take it, or an error. */
static int grad_dtype(fr_ctx *ctx, fr_dtype dt, const char *what, cl_int *is_f16) {
    *is_f16 = dt == FR_F16;
    if (dt == FR_F32 || dt == FR_F16 || dt == FR_BF16) return FR_OK;
    return fr_fail(ctx, FR_ERR_ARG, "opencl: %s: a gradient of dtype %s (f32, f16 or bf16 only)",
                   what, fr_dtype_name(dt));
}

int fr_cl_grad_scale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, fr_dtype dt, size_t n, float f) {
    cl_int is_f16;
    int st = grad_dtype(ctx, dt, "gradient scale", &is_f16);
    cl_kernel k;
    if (st || (st = kernel_of(ctx, cl, dt == FR_F32 ? "scale_f32" : "scale_h", &k))) return st;
    cl_ulong un = n, go = off;
    st = FR_CL_ARGS(ctx, k, sizeof un, &un, sizeof g, &g, sizeof go, &go, sizeof f, &f);
    if (!st && dt != FR_F32) st = fr_cl_arg(ctx, k, 4, sizeof is_f16, &is_f16);
    return run_1d(ctx, cl, k, st, (int64_t)n);
}

int fr_cl_scale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, size_t n, float f) {
    return fr_cl_grad_scale(ctx, cl, g, off, FR_F32, n, f);
}

int fr_cl_grad_unscale(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, fr_dtype dt, size_t n,
                       float inv, int *found_inf) {
    *found_inf = 0;
    cl_int is_f16;
    int st = grad_dtype(ctx, dt, "unscale", &is_f16);
    if (st || n == 0) return st;
    cl_kernel k;
    if ((st = kernel_of(ctx, cl, dt == FR_F32 ? "unscale_check_f32" : "unscale_check_h", &k)))
        return st;
    cl_mem flag;
    st = fr_cl_alloc(ctx, cl, sizeof(cl_int), &flag);
    if (st) return st;
    cl_int found = 0;
    cl_ulong un = n, go = off;
    if (!(st = fr_cl_write(ctx, cl, flag, 0, &found, sizeof found)))
        st = FR_CL_ARGS(ctx, k, sizeof un, &un, sizeof g, &g, sizeof go, &go, sizeof inv, &inv,
                        sizeof flag, &flag);
    if (!st && dt != FR_F32) st = fr_cl_arg(ctx, k, 5, sizeof is_f16, &is_f16);
    if (!st) st = run_1d(ctx, cl, k, st, (int64_t)n);
    if (!st) st = fr_cl_read(ctx, cl, flag, 0, &found, sizeof found);
    fr_cl_release(flag);
    if (!st) *found_inf = found != 0;
    return st;
}

int fr_cl_unscale_check(fr_ctx *ctx, fr_cl *cl, cl_mem g, size_t off, size_t n, float inv,
                        int *found_inf) {
    return fr_cl_grad_unscale(ctx, cl, g, off, FR_F32, n, inv, found_inf);
}
