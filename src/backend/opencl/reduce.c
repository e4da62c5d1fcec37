/* reduce.c (opencl) — batch and layer normalisation, the losses, pooling and
 * the embeddings on an OpenCL device, with the CPU kernels' semantics and
 * messages (src/backend/cpu/norm.c, loss.c, pool.c, embedding.c); their
 * OpenCL C is kernels/reduce.cl. Shapes are checked by the CPU's own checks
 * (backend/kcheck.h); labels and ids are read back a block at a time and checked
 * on the host before anything is enqueued, so a bad one fails with the CPU's
 * message and writes nothing. Kernels are enqueued without waiting. */
#include "backend/opencl/reduce.h"
#include <string.h>
#include "backend/kcheck.h"
#include "backend/opencl/dref.h"

#define WG 64       /* reduce.cl's work-group size for the kernels that reduce */
#define EMB_ROWS 64 /* vocabulary rows a work-group of embedding_bwd owns (reduce.cl) */

static int acc_bit(const fr_kernel_call *c, int i) { return (int)((c->accumulate >> i) & 1u); }

/* reduce.cl's dtype code of a tensor read or written as floats */
static cl_int dcode(fr_dtype d) { return d == FR_F16 ? 1 : d == FR_BF16 ? 2 : 0; }

static int need_f32(fr_kernel_call *c, const char *op, const fr_tensor *t, const char *what) {
    if (!t->buf || t->dtype == FR_F32) return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG, "opencl: %s: the %s is %s, not f32 (not supported)", op,
                   what, fr_dtype_name(t->dtype));
}

static int kernel(fr_ctx *ctx, fr_cl *cl, const char *name, cl_kernel *k) {
    *k = fr_cl_kernel(ctx, cl, "reduce", name);
    return *k ? FR_OK : FR_ERR_ARG;
}

/* n work-items, one per value (the implementation picks the groups) */
static int run_items(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int64_t n) {
    if (n <= 0) return FR_OK;
    const size_t g = (size_t)((n + WG - 1) / WG * WG);
    return fr_cl_run(ctx, cl, k, 1, &g, NULL);
}

/* a work-item per (d0, d1, d2), the implementation's groups */
static int run_3d(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int64_t d0, int64_t d1, int64_t d2) {
    if (d0 <= 0 || d1 <= 0 || d2 <= 0) return FR_OK;
    const size_t g[3] = {(size_t)d0, (size_t)d1, (size_t)d2};
    return fr_cl_run(ctx, cl, k, 3, g, NULL);
}

/* `groups` work-groups of WG lanes */
static int run_groups(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int64_t groups) {
    if (groups <= 0) return FR_OK;
    const size_t g = (size_t)groups * WG, l = WG;
    return fr_cl_run(ctx, cl, k, 1, &g, &l);
}

/* The first of the n i32 values of t outside [0, V): *at its index (-1:
 * none), *val its value. Read back a block at a time into the stack (this
 * waits for the queue). */
static int first_bad(fr_ctx *ctx, fr_cl *cl, const fr_tensor *t, int64_t n, int64_t V, int64_t *at,
                     int32_t *val) {
    enum { BLK = 1024 };
    int32_t b[BLK];
    *at = -1;
    for (int64_t lo = 0; lo < n; lo += BLK) {
        const int64_t cnt = n - lo < BLK ? n - lo : BLK;
        int st = fr_cl_read(ctx, cl, fr_cl_mem(t), t->off + (size_t)lo * sizeof(int32_t), b,
                            (size_t)cnt * sizeof(int32_t));
        if (st) return st;
        for (int64_t i = 0; i < cnt; i++)
            if (b[i] < 0 || b[i] >= V) {
                *at = lo + i, *val = b[i];
                return FR_OK;
            }
    }
    return FR_OK;
}

/* ---- batch normalisation ---- */

// x is (N,C) or (N,C,H,W), gamma, beta, running_mean, running_var are (C), y is x's shape,
// mean, invstd (C): training normalises by the batch's statistics, saves them and moves
// the running ones by the momentum; eval uses the running ones; attr.relu: y = ReLU(y)
// (fr_k_batchnorm).
// One work-group of WG lanes per channel.
int fr_cl_k_batchnorm(fr_kernel_call *c) {
    const fr_attr *a = &c->node->attr;
    int64_t N = 0, C = 0, HW = 0;
    int st = fr_kcheck_bn_dims(c, "batchnorm", &c->in[0].shape, &N, &C, &HW);
    if (st || (st = need_f32(c, "batchnorm", &c->in[0], "input"))) return st;
    if ((st = fr_kcheck_bn_mode(c, N, HW, c->in[3].buf && c->in[4].buf))) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "batchnorm", &k))) return st;
    dref x = dref_of(&c->in[0]), g = dref_of(&c->in[1]), b = dref_of(&c->in[2]),
         rm = dref_of(&c->in[3]), rv = dref_of(&c->in[4]), y = dref_of(&c->out[0]),
         sm = dref_of(&c->out[1]), si = dref_of(&c->out[2]);
    cl_long n = N, ch = C, hw = HW;
    cl_int training = a->training, recompute = a->recompute, relu = a->relu;
    cl_float eps = a->eps, mom = a->momentum;
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(g), TA(b), TA(rm), TA(rv), TA(y), TA(sm), TA(si), VA(n),
                    VA(ch), VA(hw), VA(training), VA(recompute), VA(eps), VA(mom), VA(relu));
    return st ? st : run_groups(c->ctx, cl, k, C);
}

// dy, x (x f32, f16 or bf16) are (N,C) or (N,C,H,W); gamma, mean, invstd are (C)
// dx = gamma invstd (dy - sum dy/n - xhat sum(dy xhat)/n); dgamma = sum dy xhat; dbeta = sum dy
// One work-group per channel.
int fr_cl_k_batchnorm_bwd(fr_kernel_call *c) {
    int64_t N = 0, C = 0, HW = 0;
    int st = fr_kcheck_bn_dims(c, "batchnorm_bwd", &c->in[1].shape, &N, &C, &HW);
    if (st || (st = need_f32(c, "batchnorm_bwd", &c->in[0], "gradient"))) return st;
    if (!c->in[3].buf || !c->in[4].buf)
        return fr_fail(c->ctx, FR_ERR_ARG, "batchnorm_bwd: the saved mean and invstd are missing");
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "batchnorm_bwd", &k))) return st;
    dref dy = dref_of(&c->in[0]), x = dref_of(&c->in[1]), g = dref_of(&c->in[2]),
         sm = dref_of(&c->in[3]), si = dref_of(&c->in[4]), dx = dref_of(&c->out[0]),
         dg = dref_of(&c->out[1]), db = dref_of(&c->out[2]);
    cl_long n = N, ch = C, hw = HW;
    cl_int xdt = dcode(c->in[1].dtype), ax = acc_bit(c, 0), ag = acc_bit(c, 1), ab = acc_bit(c, 2);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(g), TA(sm), TA(si), TA(dx), TA(dg), TA(db), VA(n),
                    VA(ch), VA(hw), VA(xdt), VA(ax), VA(ag), VA(ab));
    return st ? st : run_groups(c->ctx, cl, k, C);
}

/* ---- layer normalisation ---- */

// x is (N, D...) or (B,T,D), gamma, beta (D...), y x's shape, mean, rstd (N):
// y = (x - mean) rstd gamma + beta over each row of D. One work-group per row.
int fr_cl_k_layernorm(fr_kernel_call *c) {
    int64_t N, Dn;
    int st = fr_kcheck_ln_rows(c, "layernorm", &c->in[0], &c->in[1], &c->out[1], &N, &Dn);
    if (st || (st = need_f32(c, "layernorm", &c->in[0], "input"))) return st;
    if (Dn == 0 || N == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "layernorm", &k))) return st;
    dref x = dref_of(&c->in[0]), g = dref_of(&c->in[1]), b = dref_of(&c->in[2]),
         y = dref_of(&c->out[0]), sm = dref_of(&c->out[1]), sr = dref_of(&c->out[2]);
    cl_long d = Dn;
    cl_float eps = c->node->attr.eps;
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(g), TA(b), TA(y), TA(sm), TA(sr), VA(d), VA(eps));
    return st ? st : run_groups(c->ctx, cl, k, N);
}

// dy, x (N, D...), gamma (D...), mean, rstd (N): dx = rstd (g - E g - xhat E(g xhat)),
// g = dy gamma (a work-group per row); dgamma = sum_n dy xhat, dbeta = sum_n dy (a
// work-item per column, the rows in order).
int fr_cl_k_layernorm_bwd(fr_kernel_call *c) {
    int64_t N, Dn;
    int st = fr_kcheck_ln_rows(c, "layernorm_bwd", &c->in[1], &c->in[2], &c->in[3], &N, &Dn);
    if (st || (st = need_f32(c, "layernorm_bwd", &c->in[1], "input"))) return st;
    if (Dn == 0) return FR_OK;
    if (!c->in[3].buf || !c->in[4].buf)
        return fr_fail(c->ctx, FR_ERR_ARG, "layernorm_bwd: the saved mean and rstd are missing");
    fr_cl *cl = fr_cl_of(c->ctx);
    dref dy = dref_of(&c->in[0]), x = dref_of(&c->in[1]), g = dref_of(&c->in[2]),
         sm = dref_of(&c->in[3]), sr = dref_of(&c->in[4]), dx = dref_of(&c->out[0]),
         dg = dref_of(&c->out[1]), db = dref_of(&c->out[2]);
    cl_long n = N, d = Dn;
    cl_int ax = acc_bit(c, 0), ag = acc_bit(c, 1), ab = acc_bit(c, 2);
    cl_kernel k;
    if (dx.m && N > 0) {
        if ((st = kernel(c->ctx, cl, "layernorm_bwd_dx", &k))) return st;
        st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(g), TA(sm), TA(sr), TA(dx), VA(d), VA(ax));
        if (st || (st = run_groups(c->ctx, cl, k, N))) return st;
    }
    if (dg.m || db.m) {
        if ((st = kernel(c->ctx, cl, "layernorm_bwd_dgb", &k))) return st;
        st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(sm), TA(sr), TA(dg), TA(db), VA(n), VA(d),
                        VA(ag), VA(ab));
        if (st || (st = run_items(c->ctx, cl, k, Dn))) return st;
    }
    return FR_OK;
}

/* ---- losses ---- */

/* logits (..., C) of rank 2..4 are N = numel / C rows; labels one per row,
 * each in [0, C) (the checks and messages: kcheck.h) */
static int ce_check(fr_kernel_call *c, const char *op, int64_t *N, int64_t *C) {
    int st = fr_kcheck_ce(c, op, N, C);
    if (st || (st = need_f32(c, op, &c->in[0], "logits tensor"))) return st;
    int64_t n;
    int32_t y;
    if ((st = first_bad(c->ctx, fr_cl_of(c->ctx), &c->in[1], *N, *C, &n, &y)) || n < 0) return st;
    return fr_kcheck_bad_label(c, op, n, y, *C);
}

// logits (N,C) or (B,T,C), labels (N) or (B,T) i32, loss (1):
// loss = (1/N) sum_n (logsumexp(z[n,:]) - z[n,y[n]]). One work-group, the CPU's blocks.
int fr_cl_k_cross_entropy(fr_kernel_call *c) {
    int64_t N, C;
    int st = ce_check(c, "cross_entropy", &N, &C);
    if (st) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    dref z = dref_of(&c->in[0]), lab = dref_of(&c->in[1]), loss = dref_of(&c->out[0]);
    if (N == 0 || C == 0) return fr_cl_zero(c->ctx, cl, loss.m, c->out[0].off, sizeof(float));
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "cross_entropy", &k))) return st;
    cl_long n = N, ncls = C;
    st = FR_CL_ARGS(c->ctx, k, TA(z), TA(lab), TA(loss), VA(n), VA(ncls));
    return st ? st : run_groups(c->ctx, cl, k, 1);
}

// dz[n,j] = scale (softmax(z[n,:])_j - [j == y[n]]) / N, dz z's shape. A work-group per row.
int fr_cl_k_cross_entropy_bwd(fr_kernel_call *c) {
    int64_t N, C;
    int st = ce_check(c, "cross_entropy_bwd", &N, &C);
    if (st) return st;
    if ((st = fr_kcheck_ce_dlogits(c, N, C))) return st;
    if (!c->out[0].buf || N == 0 || C == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "cross_entropy_bwd", &k))) return st;
    dref z = dref_of(&c->in[0]), lab = dref_of(&c->in[1]), dz = dref_of(&c->out[0]);
    cl_long n = N, ncls = C;
    cl_float scale = c->node->attr.scale;
    cl_int acc = acc_bit(c, 0);
    st = FR_CL_ARGS(c->ctx, k, TA(z), TA(lab), TA(dz), VA(n), VA(ncls), VA(scale), VA(acc));
    return st ? st : run_groups(c->ctx, cl, k, N);
}

static int mse_check(fr_kernel_call *c, const char *op, int64_t *n) {
    int st = fr_kcheck_mse(c, op, n);
    if (st || (st = need_f32(c, op, &c->in[0], "prediction"))) return st;
    return need_f32(c, op, &c->in[1], "target");
}

// pred, target (N,D), loss (1) = (1/(N D)) sum (pred - target)^2. One work-group.
int fr_cl_k_mse(fr_kernel_call *c) {
    int64_t n;
    int st = mse_check(c, "mse", &n);
    if (st) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    dref p = dref_of(&c->in[0]), t = dref_of(&c->in[1]), loss = dref_of(&c->out[0]);
    if (n == 0) return fr_cl_zero(c->ctx, cl, loss.m, c->out[0].off, sizeof(float));
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "mse", &k))) return st;
    cl_long nn = n;
    st = FR_CL_ARGS(c->ctx, k, TA(p), TA(t), TA(loss), VA(nn));
    return st ? st : run_groups(c->ctx, cl, k, 1);
}

// dpred = scale 2 (pred - target) / (N D). A work-item per value.
int fr_cl_k_mse_bwd(fr_kernel_call *c) {
    int64_t n;
    int st = mse_check(c, "mse_bwd", &n);
    if (st) return st;
    if (!c->out[0].buf || n == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "mse_bwd", &k))) return st;
    dref p = dref_of(&c->in[0]), t = dref_of(&c->in[1]), dp = dref_of(&c->out[0]);
    cl_long nn = n;
    cl_float kk = (float)(2.0 * (double)c->node->attr.scale / (double)n);
    cl_int acc = acc_bit(c, 0);
    st = FR_CL_ARGS(c->ctx, k, TA(p), TA(t), TA(dp), VA(nn), VA(kk), VA(acc));
    return st ? st : run_items(c->ctx, cl, k, n);
}

/* ---- pooling ---- */

typedef fr_pool_dims pool_geom; /* the kernels take its int64_t fields as cl_long */
_Static_assert(sizeof(int64_t) == sizeof(cl_long), "pool_geom's fields pass as cl_long");
#define GEOM(g) VA((g).planes), VA((g).H), VA((g).W), VA((g).K), VA((g).S), VA((g).OH), VA((g).OW)

// x (N,C,H,W) f32/f16/bf16, y (N,C,OH,OW) f32/f16/bf16: the window's maximum.
int fr_cl_k_maxpool2d(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "maxpool2d", &c->in[0].shape, &c->out[0].shape, &g);
    if (st) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "maxpool2d", &k))) return st;
    dref x = dref_of(&c->in[0]), y = dref_of(&c->out[0]);
    cl_int xdt = dcode(c->in[0].dtype), ydt = dcode(c->out[0].dtype);
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(y), GEOM(g), VA(xdt), VA(ydt));
    return st ? st : run_3d(c->ctx, cl, k, g.OW, g.OH, g.planes);
}

// dy (N,C,OH,OW), x (N,C,H,W) (any float dtype), dx (N,C,H,W): dy of each window to
// its first maximum. Disjoint windows: a work-item per window writes its tile of dx;
// overlapping ones: a work-item per dx value adds its windows in order.
int fr_cl_k_maxpool2d_bwd(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "maxpool2d_bwd", &c->in[1].shape, &c->in[0].shape, &g);
    if (st || (st = need_f32(c, "maxpool2d_bwd", &c->in[0], "gradient"))) return st;
    if (!c->out[0].buf) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    const int tiles = g.S >= g.K; /* disjoint windows: one work-item a window */
    if ((st = kernel(c->ctx, cl, tiles ? "maxpool2d_bwd_tiles" : "maxpool2d_bwd", &k))) return st;
    dref dy = dref_of(&c->in[0]), x = dref_of(&c->in[1]), dx = dref_of(&c->out[0]);
    cl_int xdt = dcode(c->in[1].dtype), acc = acc_bit(c, 0);
    cl_int masked = c->node && c->node->attr.masked;
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(x), TA(dx), GEOM(g), VA(xdt), VA(acc), VA(masked));
    if (st) return st;
    return tiles ? run_3d(c->ctx, cl, k, g.OW, g.OH, g.planes)
                 : run_3d(c->ctx, cl, k, g.W, g.H, g.planes);
}

// x (N,C,H,W), y (N,C,OH,OW): the window's mean.
int fr_cl_k_avgpool2d(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "avgpool2d", &c->in[0].shape, &c->out[0].shape, &g);
    if (st || (st = need_f32(c, "avgpool2d", &c->in[0], "input"))) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "avgpool2d", &k))) return st;
    dref x = dref_of(&c->in[0]), y = dref_of(&c->out[0]);
    cl_float inv = 1.0f / (float)(g.K * g.K);
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(y), GEOM(g), VA(inv));
    return st ? st : run_3d(c->ctx, cl, k, g.OW, g.OH, g.planes);
}

// dy (N,C,OH,OW), dx (N,C,H,W): dy/(K K) to every value of the window.
int fr_cl_k_avgpool2d_bwd(fr_kernel_call *c) {
    pool_geom g;
    int st = fr_kcheck_pool(c, "avgpool2d_bwd", &c->out[0].shape, &c->in[0].shape, &g);
    if (st || (st = need_f32(c, "avgpool2d_bwd", &c->in[0], "gradient"))) return st;
    if (!c->out[0].buf) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "avgpool2d_bwd", &k))) return st;
    dref dy = dref_of(&c->in[0]), dx = dref_of(&c->out[0]);
    cl_float inv = 1.0f / (float)(g.K * g.K);
    cl_int acc = acc_bit(c, 0);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(dx), GEOM(g), VA(inv), VA(acc));
    return st ? st : run_3d(c->ctx, cl, k, g.W, g.H, g.planes);
}

// x (N,C,H,W), y (N,C): the plane's mean. A work-item per plane.
int fr_cl_k_global_avgpool(fr_kernel_call *c) {
    const fr_shape *xs = &c->in[0].shape;
    if (xs->ndim != 4 || fr_shape_numel(&c->out[0].shape) != xs->d[0] * xs->d[1])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "global_avgpool: input must be (N,C,H,W), output (N,C)");
    int st = need_f32(c, "global_avgpool", &c->in[0], "input");
    if (st) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "global_avgpool", &k))) return st;
    dref x = dref_of(&c->in[0]), y = dref_of(&c->out[0]);
    cl_long planes = xs->d[0] * xs->d[1], hw = xs->d[2] * xs->d[3];
    st = FR_CL_ARGS(c->ctx, k, TA(x), TA(y), VA(planes), VA(hw));
    return st ? st : run_items(c->ctx, cl, k, planes);
}

// dy (N,C), dx (N,C,H,W) = dy / (H W).
int fr_cl_k_global_avgpool_bwd(fr_kernel_call *c) {
    const fr_shape *xs = &c->out[0].shape;
    if (xs->ndim != 4 || fr_shape_numel(&c->in[0].shape) != xs->d[0] * xs->d[1])
        return fr_fail(c->ctx, FR_ERR_SHAPE, "global_avgpool_bwd: dy must be (N,C), dx (N,C,H,W)");
    int st = need_f32(c, "global_avgpool_bwd", &c->in[0], "gradient");
    if (st) return st;
    cl_long planes = xs->d[0] * xs->d[1], hw = xs->d[2] * xs->d[3];
    if (!c->out[0].buf || hw == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "global_avgpool_bwd", &k))) return st;
    dref dy = dref_of(&c->in[0]), dx = dref_of(&c->out[0]);
    cl_int acc = acc_bit(c, 0);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(dx), VA(planes), VA(hw), VA(acc));
    return st ? st : run_items(c->ctx, cl, k, planes * hw);
}

/* ---- embeddings ---- */

/* Every one of the R i32 ids in [0, V), read back a block at a time (the
 * message: kcheck.h) */
static int check_ids(fr_kernel_call *c, const char *op, const fr_tensor *idx, int64_t R,
                     int64_t V) {
    int64_t r;
    int32_t id;
    int st = first_bad(c->ctx, fr_cl_of(c->ctx), idx, R, V, &r, &id);
    if (st || r < 0) return st;
    return fr_kcheck_bad_id(c, op, idx, r, id, V);
}

// idx (B,T) i32, W (V,C), y (B,T,C): y[b,t,:] = W[idx[b,t],:].
int fr_cl_k_embedding(fr_kernel_call *c) {
    const fr_tensor *idx = &c->in[0], *w = &c->in[1];
    int64_t R, V, C;
    int st = fr_kcheck_embedding(c, &R, &V, &C);
    if (!st) st = check_ids(c, "embedding", idx, R, V);
    if (st || (st = need_f32(c, "embedding", w, "table"))) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "embedding", &k))) return st;
    dref id = dref_of(idx), wt = dref_of(w), y = dref_of(&c->out[0]);
    cl_long r = R, cc = C;
    st = FR_CL_ARGS(c->ctx, k, TA(id), TA(wt), TA(y), VA(r), VA(cc));
    return st ? st : run_items(c->ctx, cl, k, R * C);
}

// dy (B,T,C), idx (B,T), dW (V,C) (out[1]; out[0] absent): dW[v,:] (+)= the dy rows
// whose id is v, in order. A work-group owns 64 rows and 64 columns of dW and scans the
// ids: R V / 64 id tests, R C adds.
int fr_cl_k_embedding_bwd(fr_kernel_call *c) {
    const fr_tensor *dyt = &c->in[0], *idx = &c->in[1];
    if (!c->out[1].buf) return FR_OK;
    int64_t R, V, C;
    int st = fr_kcheck_embedding_bwd(c, &R, &V, &C);
    if (!st) st = check_ids(c, "embedding_bwd", idx, R, V);
    if (st || (st = need_f32(c, "embedding_bwd", dyt, "gradient"))) return st;
    if (V == 0 || C == 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "embedding_bwd", &k))) return st;
    dref dy = dref_of(dyt), id = dref_of(idx), dw = dref_of(&c->out[1]);
    cl_long r = R, cc = C, vv = V;
    cl_int acc = acc_bit(c, 1);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(id), TA(dw), VA(r), VA(cc), VA(vv), VA(acc));
    if (st) return st;
    const size_t g[2] = {(size_t)((C + WG - 1) / WG * WG), (size_t)((V + EMB_ROWS - 1) / EMB_ROWS)},
                 l[2] = {WG, 1};
    return fr_cl_run(c->ctx, cl, k, 2, g, l);
}

// dy (B,T,C), dW (Tmax,C) (out[1]): dW[t,:] (+)= sum_b dy[b,t,:], 0 for t >= T.
int fr_cl_k_pos_embedding_bwd(fr_kernel_call *c) {
    if (!c->out[1].buf) return FR_OK;
    const fr_shape *ys = &c->in[0].shape, *ws = &c->out[1].shape;
    if (ys->ndim != 3 || ws->ndim != 2 || ws->d[1] != ys->d[2] || ys->d[1] > ws->d[0])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "pos_embedding_bwd: dy must be (B,T,C) and dW (Tmax,C) with T <= Tmax");
    int st = need_f32(c, "pos_embedding_bwd", &c->in[0], "gradient");
    if (st) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k;
    if ((st = kernel(c->ctx, cl, "pos_embedding_bwd", &k))) return st;
    dref dy = dref_of(&c->in[0]), dw = dref_of(&c->out[1]);
    cl_long B = ys->d[0], T = ys->d[1], C = ys->d[2], Tmax = ws->d[0];
    cl_int acc = acc_bit(c, 1);
    st = FR_CL_ARGS(c->ctx, k, TA(dy), TA(dw), VA(B), VA(T), VA(C), VA(Tmax), VA(acc));
    return st ? st : run_items(c->ctx, cl, k, Tmax * C);
}

/* ---- whole-tensor passes of the step ---- */

#define SUMSQ_CHUNK 2048 /* fr_k_grad_sumsq's blocks (GRAD_CHUNK in cpu/grad.c) */

int fr_cl_sumsq(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off_elems, size_t n, double *out) {
    return fr_cl_grad_sumsq(ctx, cl, m, off_elems, FR_F32, n, out);
}

int fr_cl_grad_sumsq(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off_elems, fr_dtype dt, size_t n,
                     double *out) {
    *out = 0;
    if (dt != FR_F32 && dt != FR_F16 && dt != FR_BF16)
        return fr_fail(ctx, FR_ERR_ARG,
                       "opencl: sumsq: a gradient of dtype %s (f32, f16 or bf16 only)",
                       fr_dtype_name(dt));
    if (n == 0) return FR_OK;
    if (!ctx->dev)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: sumsq needs a context on the device (fr_cl_use)");
    const int fp64 = fr_cl_info_of(cl)->fp64;
    const size_t each = fp64 ? sizeof(double) : sizeof(float);
    cl_ulong nb = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK, nn = n, off = off_elems, chunk = SUMSQ_CHUNK;
    cl_mem part = fr_mem_take(ctx, fr_cl_memory(ctx), (size_t)(nb + 1) * each, FR_MEM_OTHER);
    if (!part) return FR_ERR_NOMEM;
    cl_kernel k1, k2;
    const cl_int dtc = dt == FR_F16 ? 1 : 2; /* reduce.cl's ld() codes */
    int st = kernel(ctx, cl, dt == FR_F32 ? "sumsq_blocks" : "sumsq_blocks_h", &k1);
    if (!st) st = kernel(ctx, cl, "sum_in_order", &k2);
    if (!st) st = FR_CL_ARGS(ctx, k1, VA(m), VA(off), VA(nn), VA(chunk), VA(part));
    if (!st && dt != FR_F32) st = fr_cl_arg(ctx, k1, 5, sizeof dtc, &dtc);
    if (!st) st = run_items(ctx, cl, k1, (int64_t)nb);
    if (!st) st = FR_CL_ARGS(ctx, k2, VA(part), VA(nb));
    const size_t one = 1;
    if (!st) st = fr_cl_run(ctx, cl, k2, 1, &one, NULL);
    if (!st) {
        unsigned char b[sizeof(double)];
        st = fr_cl_read(ctx, cl, part, (size_t)nb * each, b, each);
        if (!st && fp64) memcpy(out, b, sizeof(double));
        else if (!st) {
            float f;
            memcpy(&f, b, sizeof f);
            *out = f;
        }
    }
    fr_mem_give(ctx, fr_cl_memory(ctx), part);
    return st;
}

int fr_cl_hits(fr_ctx *ctx, fr_cl *cl, cl_mem logits, size_t logits_off, cl_mem labels,
               size_t labels_off, int N, int K, int64_t *hits) {
    *hits = 0;
    if (N <= 0 || K <= 0) return FR_OK;
    if (!ctx->dev)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: hits needs a context on the device (fr_cl_use)");
    cl_mem out = fr_mem_take(ctx, fr_cl_memory(ctx), sizeof(cl_long), FR_MEM_OTHER);
    if (!out) return FR_ERR_NOMEM;
    cl_ulong zo = logits_off, lo = labels_off;
    cl_long n = N, kk = K;
    cl_kernel k;
    int st = kernel(ctx, cl, "hits", &k);
    if (!st)
        st = FR_CL_ARGS(ctx, k, VA(logits), VA(zo), VA(labels), VA(lo), VA(n), VA(kk), VA(out));
    if (!st) st = run_groups(ctx, cl, k, 1);
    cl_long h = 0;
    if (!st) st = fr_cl_read(ctx, cl, out, 0, &h, sizeof h);
    if (!st) *hits = h;
    fr_mem_give(ctx, fr_cl_memory(ctx), out);
    return st;
}
