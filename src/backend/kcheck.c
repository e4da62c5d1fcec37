/* kcheck.c — the backend-independent checks of a kernel call (kcheck.h):
 * one function per op family, called by the CPU and the OpenCL kernels. */
#include "backend/kcheck.h"
#include "quant/quant.h"

/* Rows of x seen as (N, K): N = numel / K, whether x is (N, K), (B, T, K) or
 * an image batch (N, C, H, W) whose sample of K = C H W values is flattened. */
static int64_t rows_of(const fr_tensor *x, int64_t K) {
    return K > 0 ? fr_shape_numel(&x->shape) / K : (x->shape.ndim ? x->shape.d[0] : 0);
}

static void linear_dims(const fr_tensor *x, const fr_tensor *w, fr_linear_dims *d) {
    d->K = w->shape.d[1], d->O = w->shape.d[0], d->N = rows_of(x, d->K);
}

int fr_kcheck_linear(fr_kernel_call *c, fr_linear_dims *d) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *y = &c->out[0];
    linear_dims(x, w, d);
    if (w->shape.ndim != 2 || d->N * d->K != fr_shape_numel(&x->shape) ||
        fr_shape_numel(&y->shape) != d->N * d->O)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "linear: x has %lld elements, not rows of K = %lld for W (%lld, %lld)",
                       (long long)fr_shape_numel(&x->shape), (long long)d->K, (long long)d->O,
                       (long long)d->K);
    return FR_OK;
}

int fr_kcheck_linear_bwd(fr_kernel_call *c, fr_linear_dims *d) {
    const fr_tensor *dy = &c->in[0], *x = &c->in[1];
    if (!x->data && !x->buf) { /* no x (the weight gets no gradient): rows from dy */
        const fr_tensor *w = &c->in[2];
        d->K = w->shape.d[1], d->O = w->shape.d[0];
        d->N = d->O > 0 ? fr_shape_numel(&dy->shape) / d->O : 0;
        if (c->out[1].data || c->out[1].buf)
            return fr_fail(c->ctx, FR_ERR_ARG, "linear_bwd: dW is wanted but x is not given");
        if (d->N * d->O != fr_shape_numel(&dy->shape))
            return fr_fail(c->ctx, FR_ERR_SHAPE,
                           "linear_bwd: dy has %lld elements, not rows of O = %lld",
                           (long long)fr_shape_numel(&dy->shape), (long long)d->O);
        return FR_OK;
    }
    linear_dims(x, &c->in[2], d);
    if (d->N * d->K != fr_shape_numel(&x->shape) || fr_shape_numel(&dy->shape) != d->N * d->O)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "linear_bwd: dy has %lld elements, expected %lld x %lld",
                       (long long)fr_shape_numel(&dy->shape), (long long)d->N, (long long)d->O);
    return FR_OK;
}

int fr_kcheck_qlinear(fr_kernel_call *c, int bwd, int bf16_in, fr_linear_dims *d) {
    const char *op = bwd ? "qlinear_bwd" : "qlinear";
    const fr_attr *a = &c->node->attr;
    const fr_tensor *in = &c->in[0], *wq = &c->in[1], *out = &c->out[0];
    if (a->shape.ndim != 2 || a->shape.d[0] < 1 || a->shape.d[1] < 1 ||
        (unsigned)a->qfmt >= FR_QFMT_COUNT)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: the node has no quantized weight's shape", op);
    d->O = a->shape.d[0], d->K = a->shape.d[1];
    const size_t bytes = fr_quant_bytes((fr_qfmt)a->qfmt, d->O, d->K);
    if (wq->dtype != FR_U8 || (size_t)fr_shape_numel(&wq->shape) != bytes)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: the weight has %lld bytes, a (%lld, %lld) %s weight %zu", op,
                       (long long)fr_shape_numel(&wq->shape), (long long)d->O, (long long)d->K,
                       fr_qfmt_name((fr_qfmt)a->qfmt), bytes);
    const int64_t ci = bwd ? d->O : d->K, co = bwd ? d->K : d->O;
    d->N = fr_shape_numel(&in->shape) / ci;
    if ((in->dtype != FR_F32 && (in->dtype != FR_BF16 || !bf16_in)) || out->dtype != FR_F32 ||
        d->N * ci != fr_shape_numel(&in->shape) || d->N * co != fr_shape_numel(&out->shape))
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: input of %lld (%s) and output of %lld (f32) values are not N rows of "
                       "%lld and %lld",
                       op, (long long)fr_shape_numel(&in->shape), bf16_in ? "f32 or bf16" : "f32",
                       (long long)fr_shape_numel(&out->shape), (long long)ci, (long long)co);
    return FR_OK;
}

int fr_kcheck_gemm_ws(fr_kernel_call *c, const char *op, size_t need) {
    if (c->gemm_ws && c->gemm_ws_len >= need) return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG,
                   "%s: a bf16 input needs %zu bytes of GEMM scratch, the plan gave %zu", op, need,
                   c->gemm_ws ? c->gemm_ws_len : 0);
}

int fr_conv_dims_make(fr_conv_dims *g, const fr_shape *x, int64_t oc, int k, int s, int p) {
    if (x->ndim != 4 || k < 1 || s < 1 || p < 0) return -1;
    g->N = x->d[0], g->C = x->d[1], g->H = x->d[2], g->W = x->d[3];
    g->OC = oc, g->K = k, g->S = s, g->P = p;
    if (g->H + 2 * p < k || g->W + 2 * p < k) return -1;
    g->OH = (g->H + 2 * p - k) / s + 1;
    g->OW = (g->W + 2 * p - k) / s + 1;
    g->ckk = g->C * k * k;
    g->ohw = g->OH * g->OW;
    g->chw = g->C * g->H * g->W;
    g->direct = k == 1 && s == 1 && p == 0;
    g->col = g->direct ? 0 : g->ckk * g->ohw;
    g->same = s == 1 && 2 * p == k - 1;
    g->Hp = g->H + 2 * p, g->Wp = g->W + 2 * p;
    g->plane = g->Hp * g->Wp;
    g->wide = g->H * g->Wp;
    return 0;
}

int fr_kcheck_conv2d(fr_kernel_call *c, const char *op, fr_conv_dims *g, const fr_tensor *x,
                     const fr_tensor *w, const fr_shape *y) {
    const fr_attr *a = &c->node->attr;
    char bx[64], bw[64];
    if (w->shape.ndim != 4 ||
        fr_conv_dims_make(g, &x->shape, w->shape.d[0], a->kernel, a->stride, a->pad) ||
        w->shape.d[1] != g->C || w->shape.d[2] != a->kernel || w->shape.d[3] != a->kernel)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: x %s and W %s do not fit kernel %d stride %d pad %d", op,
                       fr_shape_str(&x->shape, bx, sizeof bx),
                       fr_shape_str(&w->shape, bw, sizeof bw), a->kernel, a->stride, a->pad);
    if (y->ndim != 4 || y->d[0] != g->N || y->d[1] != g->OC || y->d[2] != g->OH || y->d[3] != g->OW)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: output %s, expected (%lld, %lld, %lld, %lld)", op,
                       fr_shape_str(y, bx, sizeof bx), (long long)g->N, (long long)g->OC,
                       (long long)g->OH, (long long)g->OW);
    return FR_OK;
}

int fr_kcheck_pool(fr_kernel_call *c, const char *op, const fr_shape *x, const fr_shape *y,
                   fr_pool_dims *g) {
    const fr_attr *a = &c->node->attr;
    char bx[64], by[64];
    if (x->ndim < 2 || a->kernel < 1 || a->stride < 1 || x->d[x->ndim - 2] < a->kernel ||
        x->d[x->ndim - 1] < a->kernel)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: input %s does not fit kernel %d stride %d", op,
                       fr_shape_str(x, bx, sizeof bx), a->kernel, a->stride);
    g->H = x->d[x->ndim - 2], g->W = x->d[x->ndim - 1], g->K = a->kernel, g->S = a->stride;
    g->OH = (g->H - g->K) / g->S + 1, g->OW = (g->W - g->K) / g->S + 1;
    g->planes = fr_shape_numel(x) / (g->H * g->W);
    if (fr_shape_numel(y) != g->planes * g->OH * g->OW)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: output %s does not match input %s", op,
                       fr_shape_str(y, by, sizeof by), fr_shape_str(x, bx, sizeof bx));
    return FR_OK;
}

int fr_kcheck_bn_dims(fr_kernel_call *c, const char *op, const fr_shape *x, int64_t *N, int64_t *C,
                      int64_t *HW) {
    char b[64];
    if (x->ndim != 2 && x->ndim != 4)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: input %s must be (N,C) or (N,C,H,W)", op,
                       fr_shape_str(x, b, sizeof b));
    *N = x->d[0], *C = x->d[1], *HW = x->ndim == 4 ? x->d[2] * x->d[3] : 1;
    return FR_OK;
}

int fr_kcheck_bn_mode(fr_kernel_call *c, int64_t N, int64_t HW, int have_running) {
    const int64_t cnt = N * HW;
    if (c->node->attr.training && cnt < 2)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "batchnorm: training needs more than 1 value per channel, got %lld",
                       (long long)cnt);
    if (!c->node->attr.training && !have_running)
        return fr_fail(c->ctx, FR_ERR_ARG, "batchnorm: eval mode needs the running statistics");
    return FR_OK;
}

int fr_kcheck_ln_rows(fr_kernel_call *c, const char *op, const fr_tensor *x, const fr_tensor *gamma,
                      const fr_tensor *mean, int64_t *N, int64_t *D) {
    const int64_t nx = fr_shape_numel(&x->shape);
    if (gamma->shape.ndim) *D = fr_shape_numel(&gamma->shape);
    else if (mean->shape.ndim && fr_shape_numel(&mean->shape))
        *D = nx / fr_shape_numel(&mean->shape);
    else *D = x->shape.ndim && x->shape.d[0] ? nx / x->shape.d[0] : 0;
    *N = *D ? nx / *D : 0;
    if (*N * *D != nx || (mean->shape.ndim && fr_shape_numel(&mean->shape) != *N))
        return fr_fail(
            c->ctx, FR_ERR_SHAPE,
            "%s: x has %lld elements, not rows of gamma's %lld (statistics for %lld rows)", op,
            (long long)nx, (long long)*D, (long long)fr_shape_numel(&mean->shape));
    return FR_OK;
}

int fr_kcheck_ce(fr_kernel_call *c, const char *op, int64_t *N, int64_t *C) {
    const fr_tensor *lab = &c->in[1];
    const fr_shape *zs = &c->in[0].shape;
    char b[64];
    *C = zs->ndim >= 2 ? zs->d[zs->ndim - 1] : 0;
    *N = *C ? fr_shape_numel(zs) / *C : (zs->ndim ? zs->d[0] : 0);
    if (zs->ndim < 2 || fr_shape_numel(&lab->shape) != *N || lab->dtype != FR_I32)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: logits %s need i32 labels, one per row", op,
                       fr_shape_str(zs, b, sizeof b));
    return FR_OK;
}

int fr_kcheck_bad_label(fr_kernel_call *c, const char *op, int64_t n, int32_t y, int64_t C) {
    const fr_shape *zs = &c->in[0].shape;
    const int64_t N = C ? fr_shape_numel(zs) / C : zs->d[0];
    const int64_t T = zs->ndim > 2 ? N / zs->d[0] : 1; /* rows per sample */
    if (T == 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: label %d of sample %lld is outside [0, %lld)", op,
                       (int)y, (long long)n, (long long)C);
    return fr_fail(c->ctx, FR_ERR_ARG,
                   "%s: label %d of sample %lld at position %lld is outside [0, %lld)", op, (int)y,
                   (long long)(n / T), (long long)(n % T), (long long)C);
}

int fr_kcheck_ce_dlogits(fr_kernel_call *c, int64_t N, int64_t C) {
    if (fr_shape_numel(&c->out[0].shape) != N * C)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "cross_entropy_bwd: dlogits has %lld elements, need %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)(N * C));
    return FR_OK;
}

int fr_kcheck_linear_ce(fr_kernel_call *c, const char *op, int ws, int64_t n_mult, int64_t v_mult,
                        fr_ce_dims *d) {
    const fr_shape *x = &c->in[0].shape, *w = &c->in[1].shape;
    char a[64], b[64];
    fr_shape_str(x, a, sizeof a), fr_shape_str(w, b, sizeof b);
    if (x->ndim < 2 || w->ndim != 2 || x->d[x->ndim - 1] != w->d[1])
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: input %s does not match the weight %s (vocabulary, features)", op, a,
                       b);
    d->C = w->d[1], d->V = w->d[0];
    d->N = d->C ? fr_shape_numel(x) / d->C : x->d[0];
    const int64_t r = c->node->attr.rows;
    d->R = r < 1 || r > d->N ? d->N : r;
    if (fr_shape_numel(&c->in[3].shape) != d->N || c->in[3].dtype != FR_I32)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: input %s needs i32 labels, one per row", op, a);
    if ((c->in[2].data || c->in[2].buf) && fr_shape_numel(&c->in[2].shape) != d->V)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: the bias has %lld values, the weight %lld rows",
                       op, (long long)fr_shape_numel(&c->in[2].shape), (long long)d->V);
    const fr_tensor *o = c->out;
    if (ws == 4 && (((o[0].data || o[0].buf) && fr_shape_numel(&o[0].shape) != d->N * d->C) ||
                    ((o[1].data || o[1].buf) && fr_shape_numel(&o[1].shape) != d->V * d->C) ||
                    ((o[2].data || o[2].buf) && fr_shape_numel(&o[2].shape) != d->V)))
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: a gradient does not match its input", op);
    const int64_t need = d->R * d->V + n_mult * d->N + v_mult * d->V,
                  have = fr_shape_numel(&o[ws].shape);
    if (d->N > 0 && ((!o[ws].data && !o[ws].buf) || have < need))
        return fr_fail(
            c->ctx, FR_ERR_ARG, "%s: workspace of %lld floats, a chunk of %lld rows needs %lld", op,
            (long long)((o[ws].data || o[ws].buf) ? have : 0), (long long)d->R, (long long)need);
    return FR_OK;
}

int fr_kcheck_linear_ce_label(fr_kernel_call *c, const char *op, int64_t n, int32_t y, int64_t V) {
    const fr_shape *x = &c->in[0].shape;
    const int64_t T = x->ndim > 2 ? x->d[1] : 1; /* rows per sample */
    if (T <= 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: label %d of sample %lld is outside [0, %lld)", op,
                       (int)y, (long long)n, (long long)V);
    return fr_fail(c->ctx, FR_ERR_ARG,
                   "%s: label %d of sample %lld at position %lld is outside [0, %lld)", op, (int)y,
                   (long long)(n / T), (long long)(n % T), (long long)V);
}

int fr_kcheck_mse(fr_kernel_call *c, const char *op, int64_t *n) {
    *n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->in[1].shape) != *n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: pred has %lld elements, target %lld", op,
                       (long long)*n, (long long)fr_shape_numel(&c->in[1].shape));
    return FR_OK;
}

int fr_kcheck_embedding(fr_kernel_call *c, int64_t *R, int64_t *V, int64_t *C) {
    const fr_tensor *idx = &c->in[0], *w = &c->in[1];
    *V = w->shape.d[0], *C = w->shape.d[1], *R = fr_shape_numel(&idx->shape);
    if (fr_shape_numel(&c->out[0].shape) != *R * *C)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "embedding: y has %lld elements, need %lld x %lld",
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)*R, (long long)*C);
    if (idx->dtype != FR_I32) return fr_fail(c->ctx, FR_ERR_ARG, "embedding: ids must be i32");
    return FR_OK;
}

int fr_kcheck_embedding_bwd(fr_kernel_call *c, int64_t *R, int64_t *V, int64_t *C) {
    const fr_tensor *dy = &c->in[0], *idx = &c->in[1];
    *V = c->out[1].shape.d[0], *C = c->out[1].shape.d[1], *R = fr_shape_numel(&idx->shape);
    if (fr_shape_numel(&dy->shape) != *R * *C)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "embedding_bwd: dy has %lld elements, need %lld x %lld",
                       (long long)fr_shape_numel(&dy->shape), (long long)*R, (long long)*C);
    if (idx->dtype != FR_I32) return fr_fail(c->ctx, FR_ERR_ARG, "embedding_bwd: ids must be i32");
    return FR_OK;
}

int fr_kcheck_bad_id(fr_kernel_call *c, const char *op, const fr_tensor *idx, int64_t r, int32_t id,
                     int64_t V) {
    const int64_t R = fr_shape_numel(&idx->shape);
    const int64_t T = idx->shape.ndim >= 2 ? idx->shape.d[idx->shape.ndim - 1] : R;
    return fr_fail(c->ctx, FR_ERR_ARG,
                   "%s: id %d at sample %lld, position %lld is outside the table [0, %lld)", op,
                   (int)id, (long long)(T ? r / T : 0), (long long)(T ? r % T : r), (long long)V);
}

int fr_kcheck_same_numel(fr_kernel_call *c, const char *op, int64_t *n) {
    *n = fr_shape_numel(&c->in[0].shape);
    if (fr_shape_numel(&c->out[0].shape) != *n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: output has %lld elements, input %lld", op,
                       (long long)fr_shape_numel(&c->out[0].shape), (long long)*n);
    return FR_OK;
}

int fr_kcheck_add(fr_kernel_call *c, int64_t *n) {
    int st = fr_kcheck_same_numel(c, "add", n);
    if (st) return st;
    if (fr_shape_numel(&c->in[1].shape) != *n)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "add: operands have %lld and %lld elements",
                       (long long)*n, (long long)fr_shape_numel(&c->in[1].shape));
    return fr_kcheck_copy16(c, "add");
}

int fr_kcheck_copy16(fr_kernel_call *c, const char *op) {
    const fr_tensor *h = fr_kcopy16(c);
    if (!h) return FR_OK;
    if (h->dtype != FR_F16 && h->dtype != FR_BF16)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: its 16-bit copy of y is %s", op,
                       fr_dtype_name(h->dtype));
    if (fr_shape_numel(&h->shape) != fr_shape_numel(&c->out[0].shape))
        return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: y has %lld elements, its 16-bit copy %lld", op,
                       (long long)fr_shape_numel(&c->out[0].shape),
                       (long long)fr_shape_numel(&h->shape));
    return FR_OK;
}

int fr_kcheck_attention(fr_kernel_call *c, const char *op, const fr_tensor *qkv, fr_attn_dims *d) {
    const fr_shape *x = &qkv->shape;
    const int nh = c->node->attr.heads, kv = c->node->attr.kv_heads;
    const int nkv = kv ? kv : nh;
    if (!kv || kv == nh) {
        if (x->ndim != 3 || x->d[2] % 3 || nh < 1 || (x->d[2] / 3) % nh ||
            c->node->attr.causal != 1)
            return fr_fail(c->ctx, FR_ERR_SHAPE,
                           "%s: qkv must be (B,T,3C) with heads dividing C, causal (heads %d)", op,
                           nh);
    } else if (x->ndim != 3 || nh < 1 || kv < 1 || nh % kv || x->d[2] % (nh + 2 * kv) ||
               c->node->attr.causal != 1)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: qkv must be (B,T,(heads+2 kv_heads) HS) with kv_heads dividing heads, "
                       "causal (heads %d, kv_heads %d)",
                       op, nh, kv);
    d->B = (int)x->d[0], d->T = (int)x->d[1], d->NH = nh, d->NKV = nkv;
    d->HS = (int)(x->d[2] / (nh + 2 * nkv));
    return FR_OK;
}

int fr_kcheck_last_row(fr_kernel_call *c, int64_t *B, int64_t *T, size_t *row) {
    const fr_shape *x = &c->in[0].shape;
    const int64_t n = fr_shape_numel(x);
    if (x->ndim < 2 || x->d[1] < 1 || c->out[0].dtype != c->in[0].dtype ||
        fr_shape_numel(&c->out[0].shape) * x->d[1] != n)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "last_row: y must be x's last row along dimension 1, of its dtype");
    *B = x->d[0], *T = x->d[1];
    *row = n ? (size_t)(n / (*B * *T)) * fr_dtype_size(c->in[0].dtype) : 0;
    return FR_OK;
}

int fr_kcheck_rmsnorm(fr_kernel_call *c, const char *op, const fr_tensor *x, const fr_tensor *w,
                      const fr_tensor *rstd, int64_t *N, int64_t *C) {
    const fr_shape *xs = &x->shape;
    const int64_t nx = fr_shape_numel(xs);
    *C = xs->ndim ? xs->d[xs->ndim - 1] : 0;
    *N = *C ? nx / *C : 0;
    const int64_t nw = w->shape.ndim ? fr_shape_numel(&w->shape) : *C;
    const int64_t nr = rstd->shape.ndim ? fr_shape_numel(&rstd->shape) : *N;
    char b[64];
    if (xs->ndim < 1 || nw != *C || nr != *N)
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "%s: x %s needs a weight of its last dimension and one rstd a row "
                       "(weight %lld, rstd %lld)",
                       op, fr_shape_str(xs, b, sizeof b), (long long)nw, (long long)nr);
    const fr_tensor *all[] = {x, w, rstd};
    for (int i = 0; i < 3; i++)
        if (all[i]->shape.ndim && all[i]->dtype != FR_F32)
            return fr_fail(c->ctx, FR_ERR_ARG, "%s: %s is %s, not f32", op,
                           i == 0   ? "x"
                           : i == 1 ? "the weight"
                                    : "rstd",
                           fr_dtype_name(all[i]->dtype));
    return FR_OK;
}

int fr_kcheck_rmsnorm_bwd(fr_kernel_call *c, int64_t *N, int64_t *C) {
    int st = fr_kcheck_rmsnorm(c, "rmsnorm_bwd", &c->in[1], &c->in[2], &c->in[3], N, C);
    if (st) return st;
    if (fr_shape_numel(&c->in[0].shape) != *N * *C || c->in[0].dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_SHAPE, "rmsnorm_bwd: dy must be f32 of x's %lld values",
                       (long long)(*N * *C));
    return FR_OK;
}

int fr_kcheck_swiglu(fr_kernel_call *c, const char *op, int bwd, int64_t *n) {
    const fr_tensor *t[5] = {&c->in[bwd], &c->in[bwd + 1], &c->out[0], bwd ? &c->out[1] : NULL,
                             bwd ? &c->in[0] : NULL};
    static const char *const name[5] = {"gate", "up", "the output", "dup", "dy"};
    *n = fr_shape_numel(&t[0]->shape);
    for (int i = 0; i < 5; i++) {
        if (!t[i] || (i >= 2 && !t[i]->shape.ndim)) continue; /* an absent output */
        if (fr_shape_numel(&t[i]->shape) != *n || !t[i]->shape.ndim)
            return fr_fail(c->ctx, FR_ERR_SHAPE, "%s: %s has %lld elements, gate %lld", op, name[i],
                           (long long)fr_shape_numel(&t[i]->shape), (long long)*n);
        if (t[i]->dtype != FR_F32)
            return fr_fail(c->ctx, FR_ERR_ARG, "%s: %s is %s, not f32", op, name[i],
                           fr_dtype_name(t[i]->dtype));
    }
    return FR_OK;
}
