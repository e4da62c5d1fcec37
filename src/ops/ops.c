/* ops.c — the op table: for every op its name, arity, shape rule, kernel,
 * backward rule, in-place/view permission and FLOP estimate. Adding an op is
 * one row here, one X() line in ops.h and one kernel file; the generic
 * gradient test picks it up from this table. */
#include <math.h>
#include "autodiff/autodiff.h"
#include "ops/ops.h"
#include "quant/quant.h"

#define V(i) (&g->vals[n->in[i]])
#define NUMEL(i) ((double)fr_shape_numel(&V(i)->shape))

static int fail_shape(fr_graph *g, const fr_node *n, const char *what) {
    char a[64] = "", b[64] = "";
    if (n->in[0] >= 0) fr_shape_str(&V(0)->shape, a, sizeof a);
    if (n->n_in > 1 && n->in[1] >= 0) fr_shape_str(&V(1)->shape, b, sizeof b);
    return fr_fail(g->ctx, FR_ERR_SHAPE, "%s: %s (input %s%s%s)", fr_op_get(n->op)->name, what, a,
                   b[0] ? ", " : "", b);
}

/* ---- shape rules ---- */

/* x (..., K) of rank 2..4, W (O, K) -> y (..., O): the last dimension is mapped */
static int sh_linear(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape;
    if (x->ndim < 2) return fail_shape(g, n, "input must be (batch, features): add flatten");
    if (x->d[x->ndim - 1] != w->d[1])
        return fail_shape(g, n,
                          x->ndim > 2 && fr_shape_numel(x) / x->d[0] == w->d[1]
                              ? "input must be (batch, features): add flatten"
                              : "input features do not match the weight");
    o[0] = *x;
    o[0].d[x->ndim - 1] = w->d[0];
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

/* x (..., K), Wq u8 (fr_quant_bytes(qfmt, O, K)), (O, K) = attr.shape -> y (..., O), ws */
static int sh_qlinear(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape, *qs = &n->attr.shape;
    if (qs->ndim != 2 || V(1)->dtype != FR_U8 || w->ndim != 1 ||
        (size_t)w->d[0] != fr_quant_bytes((fr_qfmt)n->attr.qfmt, qs->d[0], qs->d[1]))
        return fail_shape(g, n, "the weight is not a quantized (O, K) block of its format");
    if (x->ndim < 2 || x->d[x->ndim - 1] != qs->d[1])
        return fail_shape(g, n, "input features do not match the weight");
    if (n->in[2] >= 0 && fr_shape_numel(&V(2)->shape) != qs->d[0])
        return fail_shape(g, n, "the bias does not match the weight");
    o[0] = *x;
    o[0].d[x->ndim - 1] = qs->d[0];
    o[1] = fr_shape1(fr_backend_ws(g, n, 1));
    dt[0] = dt[1] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

static int64_t conv_out(int64_t h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; }

static int sh_conv2d(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape;
    const fr_attr *a = &n->attr;
    if (x->ndim != 4) return fail_shape(g, n, "input must be (batch, channels, height, width)");
    if (x->d[1] != w->d[1]) return fail_shape(g, n, "input channels do not match the weight");
    if (x->d[2] + 2 * a->pad < a->kernel || x->d[3] + 2 * a->pad < a->kernel)
        return fail_shape(g, n, "kernel larger than the padded input");
    o[0] = fr_shape4(x->d[0], w->d[0], conv_out(x->d[2], a->kernel, a->stride, a->pad),
                     conv_out(x->d[3], a->kernel, a->stride, a->pad));
    o[1] = fr_shape1(fr_backend_ws(g, n, 1));
    dt[0] = dt[1] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

static int sh_pool(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    const fr_attr *a = &n->attr;
    if (x->ndim != 4) return fail_shape(g, n, "input must be (batch, channels, height, width)");
    if (x->d[2] < a->kernel || x->d[3] < a->kernel)
        return fail_shape(g, n, "window larger than the input");
    o[0] = fr_shape4(x->d[0], x->d[1], conv_out(x->d[2], a->kernel, a->stride, 0),
                     conv_out(x->d[3], a->kernel, a->stride, 0));
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

static int sh_gap(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    if (x->ndim != 4) return fail_shape(g, n, "input must be (batch, channels, height, width)");
    o[0] = fr_shape2(x->d[0], x->d[1]);
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

/* Same shape as input 0 (elementwise ops, their backward on input 0). */
static int sh_same(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    o[0] = V(0)->shape;
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

static int sh_cast(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    o[0] = V(0)->shape;
    dt[0] = n->attr.dtype;
    b[0] = V(0)->batched;
    return 0;
}

/* A copy of input 0 elsewhere: its shape, dtype and batch dim (OFFLOAD, FETCH). */
static int sh_move(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    o[0] = V(0)->shape;
    dt[0] = V(0)->dtype;
    b[0] = V(0)->batched;
    return 0;
}

/* out[0] is the parameter itself (the graph pass binds it): its shape, f32 */
static int sh_optim_step(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    o[0] = V(0)->shape;
    dt[0] = FR_F32;
    b[0] = 0;
    return 0;
}

static int sh_add(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    if (!fr_shape_eq(&V(0)->shape, &V(1)->shape))
        return fail_shape(g, n, "the two branches of a residual add differ in shape");
    return sh_same(g, n, o, dt, b);
}

static int sh_batchnorm(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    if (x->ndim != 2 && x->ndim != 4) return fail_shape(g, n, "input must be (N,C) or (N,C,H,W)");
    if (V(1)->shape.d[0] != x->d[1]) return fail_shape(g, n, "channels do not match the weight");
    o[0] = *x;
    o[1] = o[2] = fr_shape1(x->d[1]);
    dt[0] = dt[1] = dt[2] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

/* Leading dimensions of x left when its trailing ones hold D elements
 * (D = numel(weight)): 1 for x (N, C, H, W) and weight (C, H, W), 2 for x
 * (B, T, C) and weight (C); 0 when no trailing block holds exactly D. */
static int lead_dims(const fr_shape *x, int64_t D) {
    int64_t p = 1;
    for (int k = x->ndim - 1; k >= 1; k--) {
        p *= x->d[k];
        if (p == D) return k;
        if (p > D) return 0;
    }
    return 0;
}

static int sh_layernorm(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    if (n->in[1] < 0) return fail_shape(g, n, "the weight gives the normalised shape: add one");
    int lead = lead_dims(x, fr_shape_numel(&V(1)->shape));
    if (lead < 1 || (n->in[2] >= 0 && !fr_shape_eq(&V(1)->shape, &V(2)->shape)))
        return fail_shape(g, n, "normalised shape does not match the weight");
    o[0] = *x;
    o[1].ndim = lead;
    for (int k = 0; k < lead; k++) o[1].d[k] = x->d[k];
    o[2] = o[1];
    dt[0] = dt[1] = dt[2] = FR_F32;
    b[0] = b[1] = b[2] = V(0)->batched;
    return 0;
}

/* x (..., C), w (C) -> y (x's shape), rstd (x's leading shape): RMSNORM
 * normalises the last dimension only (HF LlamaRMSNorm) */
static int sh_rmsnorm(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    if (n->in[1] < 0) return fail_shape(g, n, "the weight gives the normalised size: add one");
    const fr_shape *w = &V(1)->shape;
    if (x->ndim < 2 || w->ndim != 1 || w->d[0] != x->d[x->ndim - 1])
        return fail_shape(g, n, "the weight (C) must match the input's last dimension");
    o[0] = *x;
    o[1].ndim = x->ndim - 1;
    for (int k = 0; k < x->ndim - 1; k++) o[1].d[k] = x->d[k];
    dt[0] = dt[1] = FR_F32;
    b[0] = b[1] = V(0)->batched;
    return 0;
}

/* gate, up of one shape -> y (that shape) */
static int sh_swiglu(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    if (!fr_shape_eq(&V(0)->shape, &V(1)->shape))
        return fail_shape(g, n, "gate and up must have the same shape");
    return sh_same(g, n, o, dt, b);
}

static int sh_dropout(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    o[0] = o[1] = V(0)->shape;
    dt[0] = FR_F32;
    dt[1] = FR_U8;
    b[0] = b[1] = V(0)->batched;
    return 0;
}

static int sh_view(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    if (fr_shape_numel(&n->attr.shape) != fr_shape_numel(&V(0)->shape))
        return fail_shape(g, n, "a view must keep the number of elements");
    o[0] = n->attr.shape;
    dt[0] = V(0)->dtype;
    b[0] = V(0)->batched;
    return 0;
}

/* cross-entropy: logits (..., V) of rank 2..4, labels of the leading shape;
 * mse: pred and target (N, D) */
static int sh_loss(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *z = &V(0)->shape, *y = &V(1)->shape;
    if (n->op == FR_OP_CROSS_ENTROPY) {
        if (z->ndim < 2) return fail_shape(g, n, "the loss needs (batch, classes) outputs");
        int ok = y->ndim == z->ndim - 1;
        for (int k = 0; ok && k < y->ndim; k++) ok = y->d[k] == z->d[k];
        if (!ok) return fail_shape(g, n, "targets do not match the outputs");
    } else {
        if (z->ndim != 2) return fail_shape(g, n, "the loss needs (batch, classes) outputs");
        if (!fr_shape_eq(z, y)) return fail_shape(g, n, "targets do not match the outputs");
    }
    o[0] = fr_shape1(1);
    dt[0] = FR_F32;
    b[0] = 0;
    return 0;
}

/* idx i32 (B, T), W (V, C) -> y (B, T, C) */
static int sh_embedding(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape;
    if (V(0)->dtype != FR_I32 || x->ndim < 1 || x->ndim > 3)
        return fail_shape(g, n, "ids must be i32 (batch, positions)");
    if (w->ndim != 2) return fail_shape(g, n, "the table must be (vocabulary, channels)");
    o[0] = *x;
    o[0].ndim = x->ndim + 1;
    o[0].d[x->ndim] = w->d[1];
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

/* x (B, T, C), W (Tmax, C) with T <= Tmax -> y (B, T, C) */
static int sh_pos_embedding(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape;
    if (x->ndim != 3) return fail_shape(g, n, "input must be (batch, positions, channels)");
    if (w->ndim != 2 || w->d[1] != x->d[2])
        return fail_shape(g, n, "channels do not match the position table (positions, channels)");
    if (x->d[1] > w->d[0]) {
        char m[96];
        snprintf(m, sizeof m, "sequence of %lld positions but the position table has %lld",
                 (long long)x->d[1], (long long)w->d[0]);
        return fail_shape(g, n, m);
    }
    return sh_same(g, n, o, dt, b);
}

/* qkv (B, T, 3C), causal, with heads dividing C: the checks of ATTENTION
 * and ATTENTION_KV; C in *C. Grouped-query attention (attr.kv_heads NKV,
 * 0 or heads: multi-head): qkv (B, T, (NH + 2 NKV) HS) with NKV dividing NH,
 * C = NH HS; the head size in *HS when HS is given. */
static int sh_qkv_hs(fr_graph *g, fr_node *n, const fr_shape *x, int64_t *C, int64_t *HS) {
    const int nh = n->attr.heads, kv = n->attr.kv_heads;
    if (kv && kv != nh) {
        if (kv < 0 || nh < 1 || nh % kv)
            return fail_shape(g, n, "the number of kv heads must divide the number of heads");
        if (x->ndim != 3 || x->d[2] % (nh + 2 * kv) || x->d[2] == 0)
            return fail_shape(g, n,
                              "input must be (batch, positions, (heads + 2 kv heads) x head "
                              "size): q, k, v heads");
        if (n->attr.causal != 1) return fail_shape(g, n, "only causal attention is supported");
        const int64_t hs = x->d[2] / (nh + 2 * kv);
        *C = hs * nh;
        if (HS) *HS = hs;
        return 0;
    }
    if (x->ndim != 3 || x->d[2] % 3)
        return fail_shape(g, n, "input must be (batch, positions, 3 x channels): q, k, v");
    if (n->attr.causal != 1) return fail_shape(g, n, "only causal attention is supported");
    *C = x->d[2] / 3;
    if (nh < 1 || *C % nh || *C == 0)
        return fail_shape(g, n, "the number of heads must divide the channels");
    if (HS) *HS = *C / nh;
    return 0;
}

static int sh_qkv(fr_graph *g, fr_node *n, const fr_shape *x, int64_t *C) {
    return sh_qkv_hs(g, n, x, C, NULL);
}

/* qkv (B, T, 3C) -> y (B, T, C), lse (B, NH, T), ws (a tile per thread) */
static int sh_attention(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape;
    const int nh = n->attr.heads;
    int64_t C;
    const int st = sh_qkv(g, n, x, &C);
    if (st) return st;
    o[0] = fr_shape3(x->d[0], x->d[1], C);
    o[1] = fr_shape3(x->d[0], nh, x->d[1]);
    o[2] = fr_shape1(fr_backend_ws(g, n, 2));
    dt[0] = dt[1] = dt[2] = FR_F32;
    b[0] = b[1] = V(0)->batched;
    b[2] = 0;
    return 0;
}

/* qkv (B, P, 3C), K and V caches (B, NH, Tc, HS) with P <= Tc -> y (B, P, C)
 * (grouped: qkv (B, P, (NH + 2 NKV) HS), caches (B, NKV, Tc, HS), C = NH HS),
 * ws (the backend's): generation's chunk of P positions */
static int sh_attention_kv(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *k = &V(1)->shape;
    const int nkv = n->attr.kv_heads ? n->attr.kv_heads : n->attr.heads;
    int64_t C, HS;
    const int st = sh_qkv_hs(g, n, x, &C, &HS);
    if (st) return st;
    if (k->ndim != 4 || k->d[0] != x->d[0] || k->d[1] != nkv || k->d[3] != HS ||
        k->d[2] < x->d[1] || !fr_shape_eq(k, &V(2)->shape) || V(1)->dtype != FR_F32 ||
        V(2)->dtype != FR_F32)
        return fail_shape(g, n,
                          "the caches must be f32 (batch, kv heads, positions, head size), both "
                          "alike, with room for the chunk");
    o[0] = fr_shape3(x->d[0], x->d[1], C);
    o[1] = fr_shape1(fr_backend_ws(g, n, 1));
    dt[0] = dt[1] = FR_F32;
    b[0] = V(0)->batched;
    b[1] = 0;
    return 0;
}

/* x (B, T, ...) -> y (B, 1, ...): its last row along dimension 1, any dtype */
static int sh_last_row(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    if (V(0)->shape.ndim < 2 || V(0)->shape.d[1] < 1)
        return fail_shape(g, n, "input must have rows along its second dimension");
    o[0] = V(0)->shape;
    o[0].d[1] = 1;
    dt[0] = V(0)->dtype;
    b[0] = V(0)->batched;
    return 0;
}

/* x (..., C) of rank 2..3, W (V, C), b (V) or absent, labels i32 of x's
 * leading shape -> loss (1), hits (1) i32, ws (one chunk of logits, the
 * backend's) */
static int sh_linear_ce(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *x = &V(0)->shape, *w = &V(1)->shape, *y = &V(3)->shape;
    if (x->ndim < 2 || x->ndim > 3) return fail_shape(g, n, "input must be (rows, features)");
    if (w->ndim != 2 || x->d[x->ndim - 1] != w->d[1])
        return fail_shape(g, n, "input features do not match the weight (vocabulary, features)");
    if (n->in[2] >= 0 && (V(2)->shape.ndim != 1 || V(2)->shape.d[0] != w->d[0]))
        return fail_shape(g, n, "the bias does not match the weight's rows");
    int ok = V(3)->dtype == FR_I32 && y->ndim == x->ndim - 1;
    for (int k = 0; ok && k < y->ndim; k++) ok = y->d[k] == x->d[k];
    if (!ok) return fail_shape(g, n, "targets must be i32, one per row of the input");
    o[0] = o[1] = fr_shape1(1);
    o[2] = fr_shape1(fr_backend_ws(g, n, 2));
    dt[0] = dt[2] = FR_F32;
    dt[1] = FR_I32;
    b[0] = b[1] = b[2] = 0;
    return 0;
}

/* q (B, T, NH HS), k and v (B, T, NKV HS), HS even -> qkv (B, T, (NH + 2 NKV) HS):
 * ROPE_QKV's checks, the rope's parameters included */
static int sh_rope_qkv(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_shape *q = &V(0)->shape, *k = &V(1)->shape, *v = &V(2)->shape;
    const int nh = n->attr.heads, nkv = n->attr.kv_heads ? n->attr.kv_heads : nh;
    const fr_rope *r = &n->attr.rope;
    if (nh < 1 || nkv < 1 || nh % nkv)
        return fail_shape(g, n, "the number of kv heads must divide the number of heads");
    if (q->ndim != 3 || q->d[2] % nh || q->d[2] == 0 || (q->d[2] / nh) % 2)
        return fail_shape(g, n,
                          "q must be (batch, positions, heads x head size) with an even head size");
    const int64_t hs = q->d[2] / nh;
    if (k->ndim != 3 || k->d[0] != q->d[0] || k->d[1] != q->d[1] || k->d[2] != nkv * hs ||
        !fr_shape_eq(k, v))
        return fail_shape(g, n,
                          "k and v must both be (batch, positions, kv heads x head size) of q's "
                          "batch, positions and head size");
    if (V(0)->dtype != FR_F32 || V(1)->dtype != FR_F32 || V(2)->dtype != FR_F32)
        return fail_shape(g, n, "q, k and v must be f32");
    if (!(r->theta >= 0.0f) || !isfinite(r->theta))
        return fail_shape(g, n, "rope theta must be finite and >= 0");
    if (r->type != FR_ROPE_DEFAULT && r->type != FR_ROPE_LINEAR && r->type != FR_ROPE_LLAMA3)
        return fail_shape(g, n, "unknown rope type (default, linear or llama3)");
    if (r->type != FR_ROPE_DEFAULT && !(r->factor > 0.0f && isfinite(r->factor)))
        return fail_shape(g, n, "rope scaling factor must be > 0");
    if (r->type == FR_ROPE_LLAMA3 &&
        !(r->low_freq_factor > 0.0f && r->high_freq_factor > r->low_freq_factor &&
          isfinite(r->high_freq_factor) && r->orig_context > 0))
        return fail_shape(g, n,
                          "llama3 rope needs 0 < low_freq_factor < high_freq_factor and "
                          "original_max_position_embeddings > 0");
    o[0] = fr_shape3(q->d[0], q->d[1], (nh + 2 * nkv) * hs);
    dt[0] = FR_F32;
    b[0] = V(0)->batched;
    return 0;
}

/* Backward ops: out[i] is the gradient of the forward node's input i. */
static int sh_grads(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    const fr_node *f = &g->nodes[n->fwd];
    for (int i = 0; i < n->n_out && i < f->n_in; i++) {
        if (f->in[i] < 0) continue;
        o[i] = g->vals[f->in[i]].shape;
        dt[i] = FR_F32;
        b[i] = g->vals[f->in[i]].batched;
    }
    return 0;
}

/* The same, and the backend's workspace in the last output, past the
 * forward's inputs: CONV2D_BWD's and QLINEAR_BWD's out[3] (dy, Wq -> dx, -,
 * -, ws), LINEAR_CE_BWD's out[4] (x, W, b, y -> dx, dW, db, -, ws). */
static int sh_grads_ws(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    sh_grads(g, n, o, dt, b);
    const int j = n->n_out - 1;
    o[j] = fr_shape1(fr_backend_ws(g, n, j));
    dt[j] = FR_F32;
    b[j] = 0;
    return 0;
}

/* dy, qkv, y, lse -> dqkv (B, T, 3C), D (B, NH, T), ws */
static int sh_attention_bwd(fr_graph *g, fr_node *n, fr_shape *o, fr_dtype *dt, uint8_t *b) {
    sh_grads(g, n, o, dt, b);
    const fr_node *f = &g->nodes[n->fwd];
    o[1] = g->vals[f->out[1]].shape;
    o[2] = fr_shape1(fr_backend_ws(g, n, 2));
    dt[1] = dt[2] = FR_F32;
    b[1] = g->vals[f->out[1]].batched;
    b[2] = 0;
    return 0;
}

/* ---- FLOP estimates (a multiply-add is 2) ---- */

int64_t fr_op_linear_rows(const fr_graph *g, const fr_node *n) {
    const int bwd = n->op == FR_OP_LINEAR_BWD;
    if (n->op != FR_OP_LINEAR && !bwd) return 0;
    const fr_shape *w = &g->vals[n->in[bwd + 1]].shape;
    if (w->ndim != 2 || w->d[0] < 1 || w->d[1] < 1) return 0;
    return n->in[bwd] >= 0 ? fr_shape_numel(&g->vals[n->in[bwd]].shape) / w->d[1]
                           : fr_shape_numel(&g->vals[n->in[0]].shape) / w->d[0];
}

int64_t fr_op_ce_chunk_rows(const fr_graph *g, const fr_node *n) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    if (f->op != FR_OP_LINEAR_CE) return 0;
    const fr_shape *x = &g->vals[f->in[0]].shape, *w = &g->vals[f->in[1]].shape;
    if (x->ndim < 2 || w->ndim != 2 || w->d[1] < 1) return 0;
    int64_t N = fr_shape_numel(x) / w->d[1], r = f->attr.rows;
    return r < 1 || r > N ? N : r;
}

/* logits N V of C products each; a row's logsumexp, loss and argmax about 8 a logit */
static double fl_linear_ce(const fr_graph *g, const fr_node *n) {
    const double V = (double)V(1)->shape.d[0], C = (double)V(1)->shape.d[1];
    const double N = C > 0 ? NUMEL(0) / C : 0;
    return 2.0 * N * C * V + 8.0 * N * V;
}
/* the logits made again (the forward's GEMM), then dx and dW by one GEMM each */
static double fl_linear_ce_bwd(const fr_graph *g, const fr_node *n) {
    const double V = (double)V(1)->shape.d[0], C = (double)V(1)->shape.d[1];
    const double N = C > 0 ? NUMEL(0) / C : 0;
    return 2.0 * N * C * V * (1 + (n->out[0] >= 0) + (n->out[1] >= 0)) + 8.0 * N * V;
}

static double fl_linear(const fr_graph *g, const fr_node *n) {
    return 2.0 * NUMEL(0) * (double)V(1)->shape.d[0];
}
static double fl_linear_bwd(const fr_graph *g, const fr_node *n) {
    if (n->in[1] < 0) /* no x: dx = dy W alone */
        return 2.0 * NUMEL(0) * (double)V(2)->shape.d[1];
    return 4.0 * NUMEL(1) * (double)V(2)->shape.d[0];
}
static double fl_qlinear(const fr_graph *g, const fr_node *n) {
    return 2.0 * NUMEL(0) * (double)n->attr.shape.d[0];
}
static double fl_qlinear_bwd(const fr_graph *g, const fr_node *n) {
    return 2.0 * NUMEL(0) * (double)n->attr.shape.d[1];
}
static double fl_conv2d(const fr_graph *g, const fr_node *n) {
    const fr_shape *w = &V(1)->shape;
    double out = (double)fr_shape_numel(&g->vals[n->out[0]].shape);
    return 2.0 * out * (double)(w->d[1] * w->d[2] * w->d[3]);
}
static double fl_conv2d_bwd(const fr_graph *g, const fr_node *n) {
    const fr_shape *w = &V(2)->shape;
    return 4.0 * NUMEL(0) * (double)(w->d[1] * w->d[2] * w->d[3]);
}
static double fl_pool(const fr_graph *g, const fr_node *n) {
    return NUMEL(0) * n->attr.kernel * n->attr.kernel / (double)(n->attr.stride * n->attr.stride);
}
static double fl_elem(const fr_graph *g, const fr_node *n) { return NUMEL(0); }
static double fl_norm(const fr_graph *g, const fr_node *n) { return 6.0 * NUMEL(0); }
static double fl_gelu(const fr_graph *g, const fr_node *n) { return 20.0 * NUMEL(0); }
/* RMSNORM: x^2 summed, then x rstd w: 4 a value; its backward (x is in[1]):
 * g = dy w, the row's sum of g xhat, dx, and dw's dy xhat: about 8 */
static double fl_rmsnorm(const fr_graph *g, const fr_node *n) { return 4.0 * NUMEL(0); }
static double fl_rmsnorm_bwd(const fr_graph *g, const fr_node *n) { return 8.0 * NUMEL(1); }
/* SWIGLU: silu (an exp, an add, a division) and a product, as the sigmoid
 * (fl_gelu's 20) and 2; its backward the sigmoid again and 8 more */
static double fl_swiglu(const fr_graph *g, const fr_node *n) { return 22.0 * NUMEL(0); }
static double fl_swiglu_bwd(const fr_graph *g, const fr_node *n) { return 28.0 * NUMEL(0); }
static double fl_none(const fr_graph *g, const fr_node *n) {
    (void)g;
    (void)n;
    return 0.0;
}
static double fl_loss(const fr_graph *g, const fr_node *n) { return 8.0 * NUMEL(0); }
static double fl_out(const fr_graph *g, const fr_node *n) {
    return (double)fr_shape_numel(&g->vals[n->out[0]].shape);
}
/* the output channels C = NH HS of an attention node's qkv x (grouped or not) */
static double attn_c(const fr_node *f, const fr_shape *x) {
    const int nh = f->attr.heads, kv = f->attr.kv_heads ? f->attr.kv_heads : nh;
    return nh > 0 && kv > 0 && kv != nh ? (double)(x->d[2] / (nh + 2 * kv) * nh)
                                        : (double)(x->d[2] / 3);
}
/* causal: 2 GEMMs (q k^T, P v) of 2 B NH T^2 HS each, half of them masked away */
static double fl_attention(const fr_graph *g, const fr_node *n) {
    const fr_shape *x = &V(0)->shape;
    return 2.0 * (double)x->d[0] * (double)x->d[1] * (double)x->d[1] * attn_c(n, x);
}
/* a chunk of P queries at positions pos.. over pos+t+1 keys each: 2 GEMM-like
 * passes of 2 B NH HS per query and key; pos is known only when it runs, so
 * counted as the largest, the cache full (Tc keys for every query) */
static double fl_attention_kv(const fr_graph *g, const fr_node *n) {
    const fr_shape *x = &V(0)->shape, *k = &V(1)->shape;
    return 4.0 * (double)x->d[0] * (double)x->d[1] * (double)k->d[2] * attn_c(n, x);
}
/* qkv is in[1]: recomputing the scores and four more GEMMs, about 2.5 the forward */
static double fl_attention_bwd(const fr_graph *g, const fr_node *n) {
    const fr_shape *x = &V(1)->shape;
    return 5.0 * (double)x->d[0] * (double)x->d[1] * (double)x->d[1] * attn_c(n, x);
}

/* a rotation of q's and k's elements: 2 multiplies and an add each (the angles
 * a row's, shared by its heads) */
static double fl_rope(const fr_graph *g, const fr_node *n) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    return 3.0 * (double)(fr_shape_numel(&g->vals[f->in[0]].shape) +
                          fr_shape_numel(&g->vals[f->in[1]].shape));
}

/* ---- 16-bit inputs read directly (the mixed-precision pass, precision.c) ---- */

/* the saved y (or x) of ReLU/GELU/sigmoid/tanh backward */
static int hi_act_bwd(const fr_graph *g, const fr_node *n, int j) {
    (void)g, (void)n;
    return j == 1;
}

/* max pooling's x and y, BatchNorm's x (both ways) and y, ReLU's x, a
 * convolution's image and y:
 * where the context's backend says its kernel takes them, a limit of the
 * kernel (fr_backend.half_io; j = -1: out[0]) */
static int hi_backend(const fr_graph *g, const fr_node *n, int j) {
    return fr_backend_half_io(g, n, j);
}

static int ho_backend(const fr_graph *g, const fr_node *n) { return hi_backend(g, n, -1); }

/* the residual stream's sums (add, pos_embedding) and ReLU with a 16-bit copy */
static int hc_backend(const fr_graph *g, const fr_node *n) { return hi_backend(g, n, -2); }

/* 16-bit outputs: any size for the activations */
static int ho_any(const fr_graph *g, const fr_node *n) {
    (void)g, (void)n;
    return 1;
}

/* the tanh GELU's backward writes a 16-bit dx (for a bf16 GEMM's dy) */
static int ho_gelu_bwd(const fr_graph *g, const fr_node *n) {
    (void)g;
    return n->attr.approx == 1;
}

/* ---- the table ---- */

/* Arity comes from the X-macro in ops.h so the two cannot drift apart. */
#define FR_OP_ARITY(NAME, name, nin, nout) FR_NIN_##NAME = nin, FR_NOUT_##NAME = nout,
enum { FR_OPS(FR_OP_ARITY) };
#undef FR_OP_ARITY

#define ROW(op, nm, sh, bw, inpl, view, fl) \
    [FR_OP_##op] = {nm, FR_NIN_##op, FR_NOUT_##op, sh, bw, inpl, view, fl, NULL, NULL, 0, NULL}
/* the same, for an op whose kernel reads some inputs in 16 bits itself */
#define ROWH(op, nm, sh, bw, inpl, view, fl, half) \
    [FR_OP_##op] = {nm, FR_NIN_##op, FR_NOUT_##op, sh, bw, inpl, view, fl, half, NULL, 0, NULL}
/* the same, for an op whose kernel may also write out[0] in 16 bits */
#define ROWHO(op, nm, sh, bw, inpl, view, fl, half, ho) \
    [FR_OP_##op] = {nm, FR_NIN_##op, FR_NOUT_##op, sh, bw, inpl, view, fl, half, ho, 0, NULL}
/* a loss's backward (fr_op_info.loss_bwd) */
#define ROWLB(op, nm, sh, bw, inpl, view, fl, half, ho) \
    [FR_OP_##op] = {nm, FR_NIN_##op, FR_NOUT_##op, sh, bw, inpl, view, fl, half, ho, 1, NULL}
/* the same, and a 16-bit copy of an f32 out[0] (fr_op_info.half_copy) */
#define ROWHOC(op, nm, sh, bw, inpl, view, fl, half, ho, copy) \
    [FR_OP_##op] = {nm, FR_NIN_##op, FR_NOUT_##op, sh, bw, inpl, view, fl, half, ho, 0, copy}

/* As ggml does: the count is written here by hand, so an op added to FR_OPS
 * fails to compile until its row below is written and the count raised. */
_Static_assert(FR_OP_COUNT == 53, "fr_op_table has 53 rows: add the new op's row, then this count");
const fr_op_info fr_op_table[FR_OP_COUNT] = {
    ROWHO(LINEAR, "linear", sh_linear, fr_bw_linear, -1, 0, fl_linear, NULL, ho_backend),
    ROWHO(LINEAR_BWD, "linear_bwd", sh_grads, NULL, -1, 0, fl_linear_bwd, NULL, ho_backend),
    ROWHO(CONV2D, "conv2d", sh_conv2d, fr_bw_conv2d, -1, 0, fl_conv2d, hi_backend, ho_backend),
    ROWH(CONV2D_BWD, "conv2d_bwd", sh_grads_ws, NULL, -1, 0, fl_conv2d_bwd, hi_backend),
    ROWHO(MAXPOOL2D, "maxpool2d", sh_pool, fr_bw_maxpool2d, -1, 0, fl_pool, hi_backend, ho_backend),
    ROWH(MAXPOOL2D_BWD, "maxpool2d_bwd", sh_grads, NULL, -1, 0, fl_pool, hi_backend),
    ROW(AVGPOOL2D, "avgpool2d", sh_pool, fr_bw_avgpool2d, -1, 0, fl_pool),
    ROW(AVGPOOL2D_BWD, "avgpool2d_bwd", sh_grads, NULL, -1, 0, fl_elem),
    ROW(GLOBAL_AVGPOOL, "global_avgpool", sh_gap, fr_bw_global_avgpool, -1, 0, fl_elem),
    ROW(GLOBAL_AVGPOOL_BWD, "global_avgpool_bwd", sh_grads, NULL, -1, 0, fl_elem),
    ROWHOC(RELU, "relu", sh_same, fr_bw_by_output, 0, 0, fl_elem, hi_backend, ho_any, hc_backend),
    ROWH(RELU_BWD, "relu_bwd", sh_grads, NULL, 0, 0, fl_elem, hi_act_bwd),
    ROWHO(GELU, "gelu", sh_same, fr_bw_by_input, -1, 0, fl_gelu, hi_backend, ho_any),
    ROWHO(GELU_BWD, "gelu_bwd", sh_grads, NULL, 0, 0, fl_gelu, hi_act_bwd, ho_gelu_bwd),
    ROWHO(SIGMOID, "sigmoid", sh_same, fr_bw_by_output, 0, 0, fl_gelu, NULL, ho_any),
    ROWH(SIGMOID_BWD, "sigmoid_bwd", sh_grads, NULL, 0, 0, fl_elem, hi_act_bwd),
    ROWHO(TANH, "tanh", sh_same, fr_bw_by_output, 0, 0, fl_gelu, NULL, ho_any),
    ROWH(TANH_BWD, "tanh_bwd", sh_grads, NULL, 0, 0, fl_elem, hi_act_bwd),
    ROWHO(BATCHNORM, "batchnorm", sh_batchnorm, fr_bw_batchnorm, -1, 0, fl_norm, hi_backend,
          ho_backend),
    ROWH(BATCHNORM_BWD, "batchnorm_bwd", sh_grads, NULL, -1, 0, fl_norm, hi_backend),
    ROWHO(LAYERNORM, "layernorm", sh_layernorm, fr_bw_layernorm, -1, 0, fl_norm, NULL, ho_backend),
    ROWH(LAYERNORM_BWD, "layernorm_bwd", sh_grads, NULL, -1, 0, fl_norm, hi_backend),
    ROW(DROPOUT, "dropout", sh_dropout, fr_bw_dropout, -1, 0, fl_elem),
    ROW(DROPOUT_BWD, "dropout_bwd", sh_grads, NULL, 0, 0, fl_elem),
    ROWHOC(ADD, "add", sh_add, fr_bw_add, 0, 0, fl_elem, NULL, NULL, hc_backend),
    ROW(COPY, "copy", sh_same, NULL, -1, 0, fl_elem),
    ROW(CAST, "cast", sh_cast, NULL, -1, 0, fl_none),
    ROW(VIEW, "view", sh_view, fr_bw_view, -1, 1, fl_none),
    ROW(CROSS_ENTROPY, "cross_entropy", sh_loss, fr_bw_loss, -1, 0, fl_loss),
    ROWLB(CROSS_ENTROPY_BWD, "cross_entropy_bwd", sh_grads, NULL, -1, 0, fl_loss, NULL, ho_any),
    ROW(MSE, "mse", sh_loss, fr_bw_loss, -1, 0, fl_elem),
    ROWLB(MSE_BWD, "mse_bwd", sh_grads, NULL, -1, 0, fl_elem, NULL, NULL),
    ROW(OPTIM_STEP, "optim_step", sh_optim_step, NULL, -1, 0, fl_none),
    ROW(EMBEDDING, "embedding", sh_embedding, fr_bw_embedding, -1, 0, fl_out),
    ROW(EMBEDDING_BWD, "embedding_bwd", sh_grads, NULL, -1, 0, fl_elem),
    ROWHOC(POS_EMBEDDING, "pos_embedding", sh_pos_embedding, fr_bw_pos_embedding, 0, 0, fl_elem,
           NULL, NULL, hc_backend),
    ROW(POS_EMBEDDING_BWD, "pos_embedding_bwd", sh_grads, NULL, -1, 0, fl_elem),
    ROWHO(ATTENTION, "attention", sh_attention, fr_bw_attention, -1, 0, fl_attention, hi_backend,
          ho_backend),
    ROWHO(ATTENTION_BWD, "attention_bwd", sh_attention_bwd, NULL, -1, 0, fl_attention_bwd,
          hi_backend, ho_backend),
    ROW(OFFLOAD, "offload", sh_move, NULL, -1, 0, fl_none),
    ROW(FETCH, "fetch", sh_move, NULL, -1, 0, fl_none),
    ROW(ATTENTION_KV, "attention_kv", sh_attention_kv, NULL, -1, 0, fl_attention_kv),
    ROW(LAST_ROW, "last_row", sh_last_row, NULL, -1, 0, fl_out),
    ROW(QLINEAR, "qlinear", sh_qlinear, fr_bw_qlinear, -1, 0, fl_qlinear),
    ROW(QLINEAR_BWD, "qlinear_bwd", sh_grads_ws, NULL, -1, 0, fl_qlinear_bwd),
    ROW(LINEAR_CE, "linear_ce", sh_linear_ce, fr_bw_linear_ce, -1, 0, fl_linear_ce),
    ROWLB(LINEAR_CE_BWD, "linear_ce_bwd", sh_grads_ws, NULL, -1, 0, fl_linear_ce_bwd, NULL, NULL),
    ROW(RMSNORM, "rmsnorm", sh_rmsnorm, fr_bw_rmsnorm, -1, 0, fl_rmsnorm),
    ROW(RMSNORM_BWD, "rmsnorm_bwd", sh_grads, NULL, -1, 0, fl_rmsnorm_bwd),
    ROW(SWIGLU, "swiglu", sh_swiglu, fr_bw_swiglu, 0, 0, fl_swiglu),
    ROW(SWIGLU_BWD, "swiglu_bwd", sh_grads, NULL, 0, 0, fl_swiglu_bwd),
    ROW(ROPE_QKV, "rope_qkv", sh_rope_qkv, fr_bw_rope_qkv, -1, 0, fl_rope),
    ROW(ROPE_QKV_BWD, "rope_qkv_bwd", sh_grads, NULL, -1, 0, fl_rope),
};

void fr_ops_resize_ws(fr_graph *g, const int *order, int n) {
    for (int t = 0; t < n; t++) {
        const fr_node *nd = &g->nodes[order[t]];
        const int j = nd->op == FR_OP_CONV2D          ? 1
                      : nd->op == FR_OP_CONV2D_BWD    ? 3
                      : nd->op == FR_OP_ATTENTION_BWD ? 2
                                                      : -1;
        if (j < 0 || nd->out[j] < 0) continue;
        g->vals[nd->out[j]].shape = fr_shape1(fr_backend_ws(g, nd, j));
    }
}
