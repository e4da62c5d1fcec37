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

size_t fr_k_qlinear16_ws(int64_t N, int64_t O, int64_t K, int bwd) {
    if (N < 1 || O < 1 || K < 1) return 0;
    int64_t last;
    size_t most = 0;
    if (!bwd) { /* panels of P rows of W': y[:, o0 : o0 + P] = x W'[o0 : o0 + P]^T (+ b) */
        const int64_t each = fr_gemm16_panel(O, K, &last);
        static const float some_bias = 0.0f; /* only the bias's presence counts */
        for (int k = 0; k < 4; k++) {
            fr_gemm16_out e = {k & 1 ? &some_bias : NULL, 0, 0};
            size_t a = fr_gemm16_epi_ws(0, 1, N, k & 2 ? last : each, K, K, K, 0.0f, O, &e);
            if (a > most) most = a;
        }
        return fr_gemm16_round((size_t)(each * K) * sizeof(uint16_t)) + most;
    }
    /* panels of C columns of W': dx[:, k0 : k0 + C] = dy W'[:, k0 : k0 + C] */
    const int64_t each = fr_gemm16_panel(K, O, &last);
    for (int k = 0; k < 4; k++) {
        size_t a = fr_gemm16_ws(0, 0, N, k & 2 ? last : each, O, O, each, (float)(k & 1), K);
        if (a > most) most = a;
    }
    return fr_gemm16_round((size_t)(each * O) * sizeof(uint16_t)) + most;
}

/* A bf16 call's scratch: the panel (each lines of W') at its start, oneDNN's after it */
typedef struct q16 {
    uint16_t *panel;
    void *ws;
    size_t ws_bytes;
    int64_t each;
} q16;

static int q16_take(fr_kernel_call *c, const char *op, const fr_linear_dims *d, int bwd, q16 *g) {
    int st = fr_kcheck_gemm_ws(c, op, fr_k_qlinear16_ws(d->N, d->O, d->K, bwd));
    if (st) return st;
    const int64_t len = bwd ? d->O : d->K;
    g->each = fr_gemm16_panel(bwd ? d->K : d->O, len, NULL);
    const size_t pb = fr_gemm16_round((size_t)(g->each * len) * sizeof(uint16_t));
    g->panel = c->gemm_ws;
    g->ws = (char *)c->gemm_ws + pb;
    g->ws_bytes = c->gemm_ws_len - pb;
    return FR_OK;
}

static int qlinear16(fr_kernel_call *c, const fr_linear_dims *d, const fr_qweight *w) {
    q16 g;
    int st = q16_take(c, "qlinear", d, 0, &g);
    if (st) return st;
    const float *bias = c->in[2].data ? fr_f32(&c->in[2]) : NULL;
    const uint16_t *x = c->in[0].data;
    float *y = c->out[0].data;
    for (int64_t o0 = 0; o0 < d->O && !st; o0 += g.each) {
        const int64_t rows = d->O - o0 < g.each ? d->O - o0 : g.each;
        fr_gemm16_out e = {bias ? bias + o0 : NULL, 0, 0};
        st = fr_dequantize_bf16(c->ctx, w, o0, rows, 0, d->K, g.panel, d->K);
        if (!st)
            st = fr_gemm16_epi(c->ctx, 0, 1, d->N, rows, d->K, x, d->K, g.panel, d->K, 0.0f, y + o0,
                               d->O, &e, g.ws, g.ws_bytes);
    }
    return st;
}

static int qlinear16_bwd(fr_kernel_call *c, const fr_linear_dims *d, const fr_qweight *w) {
    q16 g;
    int st = q16_take(c, "qlinear_bwd", d, 1, &g);
    if (st) return st;
    const uint16_t *dy = c->in[0].data;
    float *dx = c->out[0].data;
    const float beta = (c->accumulate & 1) ? 1.0f : 0.0f;
    for (int64_t k0 = 0; k0 < d->K && !st; k0 += g.each) {
        const int64_t cols = d->K - k0 < g.each ? d->K - k0 : g.each;
        st = fr_dequantize_bf16(c->ctx, w, 0, d->O, k0, cols, g.panel, g.each);
        if (!st)
            st = fr_gemm16(c->ctx, 0, 0, d->N, cols, d->O, dy, d->O, g.panel, g.each, beta, dx + k0,
                           d->K, g.ws, g.ws_bytes);
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
