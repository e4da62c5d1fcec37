/* qlinear.c — the linear layer over a frozen quantized weight, QLINEAR and
 * QLINEAR_BWD: the weight's bytes are viewed in place (quant/quant.h) and
 * dequantized a tile or panel at a time, so no full-size copy of the weight
 * ever exists. The weight and its bias are frozen: the backward gives dx
 * alone. The GEMM follows the input's dtype, as the linear layer's does:
 *
 * - x (dy) f32: quant.c's tiled f32 GEMMs, the tiles in the node's planned
 *   workspace (out[1], out[3]).
 * - x (dy) bf16: the mixed-precision pass gives a bf16 input where the CPU
 *   has a native bf16 GEMM (precision.c). A panel of W' is dequantized into
 *   bf16 (fr_dequantize_bf16: rounded to nearest even, as the pass rounds a
 *   linear layer's f32 weight) and oneDNN's bf16 matmul (gemm16.h) reads it:
 *   twice the f32 GEMM's rate on an AVX512_BF16 CPU. The panel and oneDNN's
 *   scratch are the step's GEMM scratch (gemm_ws), sized by
 *   fr_k_qlinear16_ws. The forward's panels are rows of W' (columns of y, the
 *   bias in the GEMM's epilogue); the backward's are columns of W' (columns
 *   of dx): every output is one GEMM's sum over the whole inner dimension. */
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"
#include "backend/kcheck.h"
#include "quant/quant.h"

static int view(fr_kernel_call *c, const fr_linear_dims *d, fr_qweight *w) {
    return fr_quant_view(c->ctx, (fr_qfmt)c->node->attr.qfmt, d->O, d->K, c->in[1].data, w);
}

/* ---- the bf16 path ---------------------------------------------------------- */

#define Q16_PANEL (1 << 20) /* bf16 values a panel of W' holds at most (2 MiB) */
#define Q16_ALIGN 64

/* A panel split of n lines of `len` values each: *each lines a panel (the
 * last one *last), balanced, at least 16 lines unless n is smaller. */
static void panels(int64_t n, int64_t len, int64_t *each, int64_t *last) {
    int64_t most = len > 0 ? Q16_PANEL / len : n;
    if (most < 16) most = 16;
    const int64_t np = (n + most - 1) / most > 0 ? (n + most - 1) / most : 1;
    *each = (n + np - 1) / np;
    *last = n - (np - 1) * *each;
}

static size_t panel_bytes(int64_t each, int64_t len) {
    size_t b = (size_t)(each * len) * sizeof(uint16_t);
    return (b + Q16_ALIGN - 1) / Q16_ALIGN * Q16_ALIGN;
}

size_t fr_k_qlinear16_ws(int64_t N, int64_t O, int64_t K, int bwd) {
    if (N < 1 || O < 1 || K < 1) return 0;
    int64_t each, last;
    size_t most = 0;
    if (!bwd) { /* panels of P rows of W': y[:, o0 : o0 + P] = x W'[o0 : o0 + P]^T (+ b) */
        panels(O, K, &each, &last);
        static const float some_bias = 0.0f; /* only the bias's presence counts */
        for (int k = 0; k < 4; k++) {
            fr_gemm16_out e = {k & 1 ? &some_bias : NULL, 0, 0};
            size_t a = fr_gemm16_epi_ws(0, 1, N, k & 2 ? last : each, K, K, K, 0.0f, O, &e);
            if (a > most) most = a;
        }
        return panel_bytes(each, K) + most;
    }
    /* panels of C columns of W': dx[:, k0 : k0 + C] = dy W'[:, k0 : k0 + C] */
    panels(K, O, &each, &last);
    for (int k = 0; k < 4; k++) {
        size_t a = fr_gemm16_ws(0, 0, N, k & 2 ? last : each, O, O, each, (float)(k & 1), K);
        if (a > most) most = a;
    }
    return panel_bytes(each, O) + most;
}

/* The scratch for a bf16 call: the panel at its start, oneDNN's after it */
static int scratch(fr_kernel_call *c, const char *op, const fr_linear_dims *d, int bwd,
                   uint16_t **panel, void **ws, size_t *ws_bytes) {
    const size_t need = fr_k_qlinear16_ws(d->N, d->O, d->K, bwd);
    if (!c->gemm_ws || c->gemm_ws_len < need)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "%s: a bf16 input needs %zu bytes of GEMM scratch, the plan gave %zu", op,
                       need, c->gemm_ws ? c->gemm_ws_len : 0);
    int64_t each, last;
    if (bwd) panels(d->K, d->O, &each, &last);
    else panels(d->O, d->K, &each, &last);
    const size_t pb = panel_bytes(each, bwd ? d->O : d->K);
    *panel = c->gemm_ws;
    *ws = (char *)c->gemm_ws + pb;
    *ws_bytes = c->gemm_ws_len - pb;
    return FR_OK;
}

static int qlinear16(fr_kernel_call *c, const fr_linear_dims *d, const fr_qweight *w) {
    uint16_t *panel = NULL;
    void *ws = NULL;
    size_t wsb = 0;
    int st = scratch(c, "qlinear", d, 0, &panel, &ws, &wsb);
    if (st) return st;
    const fr_tensor *b = &c->in[2];
    const float *bias = b->data ? fr_f32(b) : NULL;
    const uint16_t *x = c->in[0].data;
    float *y = c->out[0].data;
    int64_t each, last;
    panels(d->O, d->K, &each, &last);
    for (int64_t o0 = 0; o0 < d->O && !st; o0 += each) {
        const int64_t rows = o0 + each <= d->O ? each : d->O - o0;
        st = fr_dequantize_bf16(c->ctx, w, o0, rows, 0, d->K, panel, d->K);
        fr_gemm16_out e = {bias ? bias + o0 : NULL, 0, 0};
        if (!st)
            st = fr_gemm16_epi(c->ctx, 0, 1, d->N, rows, d->K, x, d->K, panel, d->K, 0.0f, y + o0,
                               d->O, &e, ws, wsb);
    }
    return st;
}

static int qlinear16_bwd(fr_kernel_call *c, const fr_linear_dims *d, const fr_qweight *w) {
    uint16_t *panel = NULL;
    void *ws = NULL;
    size_t wsb = 0;
    int st = scratch(c, "qlinear_bwd", d, 1, &panel, &ws, &wsb);
    if (st) return st;
    const uint16_t *dy = c->in[0].data;
    float *dx = c->out[0].data;
    const float beta = (c->accumulate & 1) ? 1.0f : 0.0f;
    int64_t each, last;
    panels(d->K, d->O, &each, &last);
    for (int64_t k0 = 0; k0 < d->K && !st; k0 += each) {
        const int64_t cols = k0 + each <= d->K ? each : d->K - k0;
        st = fr_dequantize_bf16(c->ctx, w, 0, d->O, k0, cols, panel, each);
        if (!st)
            st = fr_gemm16(c->ctx, 0, 0, d->N, cols, d->O, dy, d->O, panel, each, beta, dx + k0,
                           d->K, ws, wsb);
    }
    return st;
}

/* ---- the kernels ------------------------------------------------------------ */

// x is (N,K) f32 or bf16, Wq is W' (O,K) quantized, b is (O) or absent, y is (N,O) f32
// y[n,o] = sum_k x[n,k] W'[o,k] + b[o]   (bf16 x: W' rounded to bf16, f32 sums)
int fr_k_qlinear(fr_kernel_call *c) {
    fr_linear_dims d;
    fr_qweight w;
    int st = fr_kcheck_qlinear(c, 0, 1, &d);
    if (!st) st = view(c, &d, &w);
    if (st) return st;
    if (c->in[0].dtype == FR_BF16) return d.N ? qlinear16(c, &d, &w) : FR_OK;
    const fr_tensor *b = &c->in[2], *ws = &c->out[1];
    return fr_qgemm(c->ctx, &w, c->in[0].data, d.N, b->data ? fr_f32(b) : NULL, c->out[0].data, 0,
                    ws->data, (size_t)fr_shape_numel(&ws->shape));
}

// dy is (N,O) f32 or bf16, Wq is W' (O,K) quantized, dx is (N,K) f32
// dx[n,k] = sum_o dy[n,o] W'[o,k]   (bf16 dy: W' rounded to bf16, f32 sums)
int fr_k_qlinear_bwd(fr_kernel_call *c) {
    fr_linear_dims d;
    fr_qweight w;
    int st = fr_kcheck_qlinear(c, 1, 1, &d);
    if (!st) st = view(c, &d, &w);
    if (st) return st;
    if (c->in[0].dtype == FR_BF16) return d.N ? qlinear16_bwd(c, &d, &w) : FR_OK;
    const fr_tensor *ws = &c->out[3];
    return fr_qgemm_dx(c->ctx, &w, c->in[0].data, d.N, c->out[0].data, (int)(c->accumulate & 1),
                       ws->data, (size_t)fr_shape_numel(&ws->shape));
}
