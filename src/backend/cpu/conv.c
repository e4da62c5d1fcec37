/* conv.c — 2-D convolution, forward and backward. Where the build has
 * oneDNN and FRUGAL_CONV=dnnl asks for them, its convolution primitives
 * run them (conv_dnnl.c: opt-in, faster here but with memory the planner
 * cannot see); otherwise, or where oneDNN declines a geometry, GEMMs do,
 * and they stay the reference: "same" convolutions (stride 1, 2P = K - 1)
 * with 8 or more input channels by one GEMM per kernel tap over zero-padded
 * planes (see "shifted GEMMs" below: no unroll at all, 1.3-1.6x faster on
 * the ResNet's layers), the rest by im2col + GEMM. It owns
 * CONV2D, CONV2D_BWD and the size of their workspace (fr_conv2d_ws_elems);
 * the planner allocates that workspace, this file only uses it.
 *
 * Strategy: the batch is cut into S contiguous chunks of images, S at most
 * the thread count, and each chunk has its own slot in the workspace. One
 * thread takes a chunk and, image by image, unrolls the image into its slot
 * (col, (C*K*K, OH*OW): small enough to stay in the core's L2) and runs a
 * single-threaded GEMM straight into the NCHW output (OpenBLAS runs serially
 * inside an OpenMP region). No scatter or transpose is needed. Weight
 * gradients are summed per chunk (chunk 0 into dW itself, chunk s > 0 into a
 * partial in the workspace), then the partials are added into dW in chunk
 * order, so the bits depend on S only, never on which thread ran what. With
 * one slot the loop runs outside any parallel region and OpenBLAS threads
 * each GEMM itself. The shifted-GEMM path keeps the same chunking, with a
 * dW partial for every chunk (its layout, [tap][OC][C], is not dW's). */
#include <cblas.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu/conv_dnnl.h"
#include "backend/cpu/half_in.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

/* Workspace budget: at most this many floats (8 MiB), but always one image. */
#define CONV_WS_BUDGET ((int64_t)2 << 20)
#define CONV_PAR_MIN 16384

/* The geometry (kcheck.h): direct is 1x1 stride 1 no padding (col is the
 * image itself), same is stride 1 with OH = H and OW = W (rows of col are
 * shifted planes); Hp x Wp is the padded plane of the shifted GEMMs. */
typedef fr_conv_dims conv_geom;

/* The shifted-GEMM path pays K*K GEMM calls of depth C per image; below this
 * many input channels the im2col GEMM (depth C*K*K) is faster. */
#define CONV_SHIFT_MIN_C 8

/* The shifted-GEMM path: same, K > 1, enough channels (one GEMM per tap, no im2col). */
static int shifted(const conv_geom *g) { return g->same && g->K > 1 && g->C >= CONV_SHIFT_MIN_C; }

/* ---- "same" convolutions by shifted GEMMs ---------------------------------
 * With stride 1 and 2P = K - 1 the output has the input's size. Pad the image
 * with zeros into planes of Hp x Wp (Hp = H + 2P, Wp = W + 2P) and compute
 * the output in "wide" rows of Wp values (the last 2P of each row are wrapped
 * garbage, dropped when copying into y). Then each kernel tap k = (kh, kw) is
 * one GEMM over the channels, its B matrix the padded planes shifted by
 * kh Wp + kw (rows are planes, ld = Hp Wp):
 *   yw (OC, H Wp) += Wk (OC, C) @ xp[:, kh Wp + kw ...]          Wk = W[:, :, kh, kw]
 * K*K GEMMs of depth C replace the im2col unroll (K*K copies of the image)
 * and its one GEMM of depth C K K: no unroll, no col buffer. Backward:
 *   dxw (C, H Wp) += Wk'^T (C, OC) @ dyp[:, kh Wp + kw ...]      k' = (K-1-kh, K-1-kw)
 *       (dx is the same convolution of dy, padded, with the kernel flipped)
 *   dWk (OC, C)   += dyp[:, P Wp + P ...] (OC, H Wp) @ xp[:, kh Wp + kw ...]^T
 *       (read from P Wp + P, the padded dy is dy in wide rows whose wrapped
 *       columns are padding zeros, so the garbage positions add nothing)
 * Shifted reads run up to K - 1 floats past the last plane; the padded
 * buffers carry K zero floats of tail. All sums are in a fixed order per
 * chunk of images; chunk partials of dW are added in chunk order. */

/* Floats of the shift path's workspace: the taps' weights [K*K][OC][C]
 * shared, then per slot xp, yw, a widened image (forward) or xp, dyp, dxw,
 * dW partial (backward; dxw, free until the dx GEMMs, widens the image). */
static int64_t shift_shared(const conv_geom *g) { return g->K * g->K * g->OC * g->C; }
static int64_t shift_slot(const conv_geom *g, int backward) {
    int64_t xp = g->C * g->plane + g->K;
    if (!backward) return xp + g->OC * g->wide + g->C * g->H * g->W;
    return xp + (g->OC * g->plane + g->K) + g->C * g->wide + g->K * g->K * g->OC * g->C;
}

static int64_t shift_slots(const conv_geom *g, int backward, int64_t have, int64_t cap) {
    int64_t s = (have - shift_shared(g)) / shift_slot(g, backward);
    return s < cap ? s : cap;
}

/* wk[k][oc][c] = W[oc][c][kh][kw] */
static void shift_weights(const conv_geom *g, const float *w, float *wk) {
    const int64_t KK = g->K * g->K;
    for (int64_t oc = 0; oc < g->OC; oc++)
        for (int64_t c = 0; c < g->C; c++)
            for (int64_t k = 0; k < KK; k++)
                wk[(k * g->OC + oc) * g->C + c] = w[(oc * g->C + c) * KK + k];
}

/* planes (ch, H, W) of t from value off into the interior of the zeroed
 * padded planes; a 16-bit t is first widened whole into tmp (ch H W floats:
 * one long conversion, not a short one per row) */
static void pad_planes(const conv_geom *g, int64_t ch, const fr_tensor *t, int64_t off, float *tmp,
                       float *dst) {
    const float *src = in_f32(t, off, ch * g->H * g->W, tmp);
    for (int64_t c = 0; c < ch; c++)
        for (int64_t h = 0; h < g->H; h++)
            memcpy(dst + c * g->plane + (h + g->P) * g->Wp + g->P, src + (c * g->H + h) * g->W,
                   (size_t)g->W * sizeof(float));
}

/* dst (ch, H, W) = (or +=) the valid columns of the wide rows src (ch, H, Wp) */
static void crop_wide(const conv_geom *g, int64_t ch, const float *src, float *dst, int add) {
    for (int64_t c = 0; c < ch; c++)
        for (int64_t h = 0; h < g->H; h++) {
            const float *s = src + (c * g->H + h) * g->Wp;
            float *d = dst + (c * g->H + h) * g->W;
            if (add) {
#pragma omp simd
                for (int64_t w = 0; w < g->W; w++) d[w] += s[w];
            } else {
                memcpy(d, s, (size_t)g->W * sizeof(float));
            }
        }
}

static void shift_forward(const conv_geom *g, const float *wk, const fr_tensor *x, int64_t xoff,
                          const float *b, float *y, float *xp, float *yw) {
    const int64_t KK = g->K * g->K;
    pad_planes(g, g->C, x, xoff, yw + g->OC * g->wide, xp);
    if (b)
        for (int64_t oc = 0; oc < g->OC; oc++)
            for (int64_t i = 0; i < g->wide; i++) yw[oc * g->wide + i] = b[oc];
    for (int64_t k = 0; k < KK; k++) {
        int64_t kh = k / g->K, kw = k % g->K;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->OC, (int)g->wide, (int)g->C,
                    1.0f, wk + k * g->OC * g->C, (int)g->C, xp + kh * g->Wp + kw, (int)g->plane,
                    k || b ? 1.0f : 0.0f, yw, (int)g->wide);
    }
    crop_wide(g, g->OC, yw, y, 0);
}

/* Floats per slot: the col buffer, and for backward a dW partial (chunks >= 1). */
static int64_t col_elems(const conv_geom *g) { return g->col; }

/* Largest slot count s <= cap with s*col + (s-1)*part <= have (0 if none fits). */
static int64_t slots_fitting(int64_t have, int64_t col, int64_t part, int64_t cap) {
    if (col + part == 0) return cap;
    int64_t s = (have + part) / (col + part);
    return s < cap ? s : cap;
}

/* The budget of the oneDNN path's reordered copies of a chunk of images
 * (x's and y's in the blocked formats): 32 MiB, or what the GEMM path needs
 * for one slot where that is more. Each primitive call and each reorder is
 * a parallel region with a fixed cost, and oneDNN's kernels are slow on a
 * few images: cut in one-slot chunks (1 to 13 images) the ResNet's step
 * took 4.6x the GEMM path's, nearly all of it per-call cost; a batch of 128
 * goes whole in this budget. */
#define CONV_DNNL_BUDGET ((int64_t)8 << 20)

static int64_t dnnl_budget(const conv_geom *g, int backward) {
    int64_t slot = shifted(g) ? shift_shared(g) + shift_slot(g, backward)
                              : col_elems(g) + (backward ? g->OC * g->ckk : 0);
    return slot > CONV_DNNL_BUDGET ? slot : CONV_DNNL_BUDGET;
}

/* The oneDNN path's workspace when it runs this geometry on an image of
 * dtype xdt (0 if it does not): the most of its plans with and without a
 * bias. */
static int64_t dnnl_ws(const conv_geom *g, int backward, int threads, fr_dtype xdt, int blk) {
    int64_t most = 0;
    for (int bias = 0; bias <= !backward; bias++) {
        int64_t n = fr_conv_dnnl_ws(g, dnnl_budget(g, backward), backward, bias, xdt, threads, blk);
        if (n == 0) return 0;
        if (n > most) most = n;
    }
    return most;
}

int64_t fr_conv2d_ws_elems(const fr_shape *x, fr_dtype xdt, int64_t out_ch, int kernel, int stride,
                           int pad, int backward, int blk) {
    conv_geom g;
    if (fr_conv_dims_make(&g, x, out_ch, kernel, stride, pad) != 0 || g.N < 1) return 0;
    /* oneDNN's, or on the shifted-GEMM path the most of both (the GEMMs take
     * a 16-bit image there should oneDNN decline the call); blocked
     * operands never go to the GEMMs */
    const int layout = blk & ~FR_CONV_Y16; /* blocked operands (a bf16 y is not one) */
    int64_t dnnl = layout || fr_conv_dnnl_for(xdt)
                       ? dnnl_ws(&g, backward, omp_get_max_threads(), xdt, blk)
                       : 0;
    if (dnnl > 0 && (!shifted(&g) || blk)) return dnnl;
    int64_t col = col_elems(&g) + (!backward && (blk & FR_CONV_Y16) ? g.OC * g.ohw : 0);
    int64_t part = backward ? g.OC * g.ckk : 0;
    int64_t cap = omp_get_max_threads();
    if (cap > g.N) cap = g.N;
    if (shifted(&g)) {
        int64_t s = shift_slots(&g, backward, CONV_WS_BUDGET, cap);
        if (s < 1) s = 1;
        int64_t gemm = shift_shared(&g) + s * shift_slot(&g, backward);
        return dnnl > gemm ? dnnl : gemm;
    }
    int64_t s = slots_fitting(CONV_WS_BUDGET, col, part, cap);
    if (s < 1) s = 1;
    return s * col + (s - 1) * part;
}

int fr_conv2d_blockable(const fr_shape *x, fr_dtype xdt, int64_t out_ch, int kernel, int stride,
                        int pad) {
    conv_geom g;
    return (xdt == FR_F32 || xdt == FR_BF16) &&
           fr_conv_dims_make(&g, x, out_ch, kernel, stride, pad) == 0 && fr_conv_dnnl_can(&g, xdt);
}

int fr_conv2d_rounds_y(const fr_shape *x, int64_t out_ch, int kernel, int stride, int pad) {
    conv_geom g;
    return fr_conv_dims_make(&g, x, out_ch, kernel, stride, pad) == 0 && !shifted(&g);
}

int fr_conv2d_reads_half(const fr_shape *x, fr_dtype half, int64_t out_ch, int kernel, int stride,
                         int pad) {
    conv_geom g;
    return fr_conv_dims_make(&g, x, out_ch, kernel, stride, pad) == 0 &&
           (shifted(&g) || fr_conv_dnnl_for(half));
}

/* Slots for the shift path in a workspace of `have` floats (error if none). */
static int shift_plan(fr_kernel_call *c, const conv_geom *g, int backward, const fr_tensor *ws,
                      int64_t *S) {
    int64_t cap = omp_get_max_threads();
    if (cap > g->N) cap = g->N;
    int64_t have = ws->data ? fr_shape_numel(&ws->shape) : 0;
    *S = shift_slots(g, backward, have, cap);
    if (*S < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "%s: workspace of %lld floats, need at least %lld",
                       backward ? "conv2d_bwd" : "conv2d", (long long)have,
                       (long long)(shift_shared(g) + shift_slot(g, backward)));
    return FR_OK;
}

static int shift_fwd(fr_kernel_call *c, const conv_geom *g) {
    const fr_tensor *ws = &c->out[1];
    int64_t S;
    int st = shift_plan(c, g, 0, ws, &S);
    if (st) return st;
    const float *bp = fr_f32(&c->in[2]);
    float *yp = fr_f32(&c->out[0]), *wk = fr_f32(ws);
    shift_weights(g, fr_f32(&c->in[1]), wk);
    const int64_t slot = shift_slot(g, 0), pad = g->C * g->plane + g->K;
#pragma omp parallel for schedule(static) num_threads((int)S) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        float *xpad = wk + shift_shared(g) + s * slot, *yw = xpad + pad;
        memset(xpad, 0, (size_t)pad * sizeof(float));
        for (int64_t n = g->N * s / S; n < g->N * (s + 1) / S; n++)
            shift_forward(g, wk, &c->in[0], n * g->C * g->H * g->W, bp, yp + n * g->OC * g->ohw,
                          xpad, yw);
    }
    return FR_OK;
}

static int shift_bwd(fr_kernel_call *c, const conv_geom *g, float *dx, float *dw) {
    const fr_tensor *ws = &c->out[3];
    int64_t S;
    int st = shift_plan(c, g, 1, ws, &S);
    if (st) return st;
    const int64_t K = g->K, KK = K * K, P = g->P, Wp = g->Wp, OCC = g->OC * g->C;
    const int64_t xpad_n = g->C * g->plane + K, dypad_n = g->OC * g->plane + K;
    const int64_t slot = shift_slot(g, 1);
    const int acc_w = acc_bit(c, 1), acc_x = acc_bit(c, 0);
    float *wk = fr_f32(ws), *slots = wk + shift_shared(g);
    if (dx) shift_weights(g, fr_f32(&c->in[2]), wk);
#pragma omp parallel for schedule(static) num_threads((int)S) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        float *xpad = slots + s * slot, *dypad = xpad + xpad_n, *dxw = dypad + dypad_n;
        float *part = dxw + g->C * g->wide;
        if (dw) memset(xpad, 0, (size_t)xpad_n * sizeof(float));
        memset(dypad, 0, (size_t)dypad_n * sizeof(float));
        int first = 1;
        for (int64_t n = g->N * s / S; n < g->N * (s + 1) / S; n++) {
            pad_planes(g, g->OC, &c->in[0], n * g->OC * g->ohw, NULL, dypad);
            if (dw) {
                pad_planes(g, g->C, &c->in[1], n * g->C * g->H * g->W, dxw, xpad);
                for (int64_t k = 0; k < KK; k++)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->OC, (int)g->C,
                                (int)g->wide, 1.0f, dypad + P * Wp + P, (int)g->plane,
                                xpad + (k / K) * Wp + k % K, (int)g->plane, first ? 0.0f : 1.0f,
                                part + k * OCC, (int)g->C);
            }
            if (dx) {
                for (int64_t k = 0; k < KK; k++) {
                    int64_t flip = (K - 1 - k / K) * K + (K - 1 - k % K);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g->C, (int)g->wide,
                                (int)g->OC, 1.0f, wk + flip * OCC, (int)g->C,
                                dypad + (k / K) * Wp + k % K, (int)g->plane, k ? 1.0f : 0.0f, dxw,
                                (int)g->wide);
                }
                crop_wide(g, g->C, dxw, dx + n * g->C * g->H * g->W, acc_x);
            }
            first = 0;
        }
    }
    if (dw) { /* dW[oc][c][k] (+)= the chunk partials [k][oc][c], in chunk order */
        const float *parts = slots + xpad_n + dypad_n + g->C * g->wide; /* slot 0's partial */
#pragma omp parallel for schedule(static) if (OCC * KK * S >= CONV_PAR_MIN)
        for (int64_t i = 0; i < OCC; i++) {
            for (int64_t k = 0; k < KK; k++) {
                float v = acc_w ? dw[i * KK + k] : 0.0f;
                for (int64_t s = 0; s < S; s++) v += parts[s * slot + k * OCC + i];
                dw[i * KK + k] = v;
            }
        }
    }
    return FR_OK;
}

// col (C*K*K, OH*OW) from one image x (C,H,W):
// col[(c*K + kh)*K + kw][oh*OW + ow] = x[c][oh*S - P + kh][ow*S - P + kw], 0 outside the image
static void im2col_same(const conv_geom *g, const float *x, float *col);

static void im2col(const conv_geom *g, const float *x, float *col) {
    const int64_t K = g->K, S = g->S, P = g->P, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    if (g->same) {
        im2col_same(g, x, col);
        return;
    }
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kh = 0; kh < K; kh++)
            for (int64_t kw = 0; kw < K; kw++) {
                float *row = col + ((c * K + kh) * K + kw) * g->ohw;
                /* ow in [lo, hi) reads inside the image: 0 <= ow*S - P + kw < W */
                int64_t lo = P - kw > 0 ? (P - kw + S - 1) / S : 0;
                int64_t hi = W - 1 + P - kw >= 0 ? (W - 1 + P - kw) / S + 1 : 0;
                if (hi > OW) hi = OW;
                if (lo > hi) lo = hi;
                for (int64_t oh = 0; oh < OH; oh++) {
                    float *dst = row + oh * OW;
                    int64_t ih = oh * S - P + kh;
                    if (ih < 0 || ih >= H) {
                        memset(dst, 0, (size_t)OW * sizeof(float));
                        continue;
                    }
                    const float *src = x + (c * H + ih) * W - P + kw;
                    for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                    if (S == 1) memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * S];
                    for (int64_t ow = hi; ow < OW; ow++) dst[ow] = 0.0f;
                }
            }
}

/* "Same" convolutions (stride 1, 2P = K - 1, so OH = H and OW = W), the
 * common case: row (c,kh,kw) of col is the image plane shifted by
 * off = (kh - P) W + (kw - P), so it is one contiguous copy, clipped to the
 * plane, after which the entries that wrapped around a row edge (they stand
 * for padding) are zeroed. */
typedef struct same_row {
    int64_t off, oh0, oh1, i0, i1; /* valid rows [oh0, oh1), copied range [i0, i1) */
    int64_t zlo, zhi;              /* columns [zlo, zhi) of each valid row are padding */
} same_row;

static same_row same_row_make(const conv_geom *g, int64_t kh, int64_t kw) {
    const int64_t P = g->P, H = g->H, W = g->W;
    same_row r;
    r.off = (kh - P) * W + (kw - P);
    r.oh0 = P - kh > 0 ? P - kh : 0;
    r.oh1 = H + P - kh < H ? H + P - kh : H;
    if (r.oh1 < r.oh0) r.oh1 = r.oh0;
    r.i0 = r.oh0 * W > -r.off ? r.oh0 * W : -r.off;
    r.i1 = r.oh1 * W < H * W - r.off ? r.oh1 * W : H * W - r.off;
    if (r.i0 > H * W) r.i0 = H * W; /* a kernel taller than the image */
    if (r.i1 < r.i0) r.i1 = r.i0;
    if (kw < P) r.zlo = 0, r.zhi = P - kw < W ? P - kw : W;
    else if (kw > P) r.zlo = W - (kw - P) > 0 ? W - (kw - P) : 0, r.zhi = W;
    else r.zlo = r.zhi = 0;
    return r;
}

static void zero_wrapped(const same_row *r, int64_t W, float *row) {
    if (r->zlo == r->zhi) return;
    for (int64_t oh = r->oh0; oh < r->oh1; oh++)
        for (int64_t ow = r->zlo; ow < r->zhi; ow++) row[oh * W + ow] = 0.0f;
}

static void im2col_same(const conv_geom *g, const float *x, float *col) {
    const int64_t K = g->K, HW = g->H * g->W;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kh = 0; kh < K; kh++)
            for (int64_t kw = 0; kw < K; kw++) {
                float *row = col + ((c * K + kh) * K + kw) * HW;
                const float *plane = x + c * HW;
                same_row r = same_row_make(g, kh, kw);
                memset(row, 0, (size_t)r.i0 * sizeof(float));
                memcpy(row + r.i0, plane + r.i0 + r.off, (size_t)(r.i1 - r.i0) * sizeof(float));
                memset(row + r.i1, 0, (size_t)(HW - r.i1) * sizeof(float));
                zero_wrapped(&r, g->W, row);
            }
}

/* the adjoint: zero the wrapped entries of col (workspace), then one add */
static void col2im_same(const conv_geom *g, float *col, float *dx) {
    const int64_t K = g->K, HW = g->H * g->W;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kh = 0; kh < K; kh++)
            for (int64_t kw = 0; kw < K; kw++) {
                float *restrict row = col + ((c * K + kh) * K + kw) * HW;
                float *restrict plane = dx + c * HW;
                same_row r = same_row_make(g, kh, kw);
                zero_wrapped(&r, g->W, row);
                const int64_t off = r.off;
#pragma omp simd
                for (int64_t i = r.i0; i < r.i1; i++) plane[i + off] += row[i];
            }
}

// dx (C,H,W) += col (C*K*K, OH*OW) folded back: the adjoint of im2col
static void col2im(const conv_geom *g, float *col, float *dx) {
    const int64_t K = g->K, S = g->S, P = g->P, H = g->H, W = g->W, OH = g->OH, OW = g->OW;
    if (g->same) {
        col2im_same(g, col, dx);
        return;
    }
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t kh = 0; kh < K; kh++)
            for (int64_t kw = 0; kw < K; kw++) {
                const float *row = col + ((c * K + kh) * K + kw) * g->ohw;
                int64_t lo = P - kw > 0 ? (P - kw + S - 1) / S : 0;
                int64_t hi = W - 1 + P - kw >= 0 ? (W - 1 + P - kw) / S + 1 : 0;
                if (hi > OW) hi = OW;
                for (int64_t oh = 0; oh < OH; oh++) {
                    int64_t ih = oh * S - P + kh;
                    if (ih < 0 || ih >= H) continue;
                    const float *src = row + oh * OW;
                    float *dst = dx + (c * H + ih) * W - P + kw;
                    if (S == 1) {
#pragma omp simd
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow] += src[ow];
                    } else {
                        for (int64_t ow = lo; ow < hi; ow++) dst[ow * S] += src[ow];
                    }
                }
            }
}

/* The layout pass asked oneDNN before it blocked an operand, and the
 * mixed-precision pass before it gave a convolution a bf16 y
 * (fr_conv2d_blockable); a decline here is a workspace sized for other
 * operands, or a plan oneDNN could not make again. */
static int blocked_declined(fr_kernel_call *c, const char *op) {
    return fr_fail(c->ctx, FR_ERR_ARG,
                   "%s: oneDNN declined a convolution on nChw16c operands or with a bf16 y "
                   "(its workspace of %lld floats, or no primitive); FRUGAL_LAYOUT=plain runs "
                   "them NCHW",
                   op,
                   (long long)fr_shape_numel(&c->out[c->node->op == FR_OP_CONV2D ? 1 : 3].shape));
}

// x is (N,C,H,W), W is (OC,C,K,K), b is (OC) or absent, y is (N,OC,OH,OW)
// y[n,oc,oh,ow] = b[oc] + sum_{c,kh,kw} W[oc,c,kh,kw] x[n,c,oh*S-P+kh,ow*S-P+kw]
// per image: y_n (OC, OH*OW) = W (OC, C*K*K) @ col_n (C*K*K, OH*OW)
int fr_k_conv2d(fr_kernel_call *c) {
    const fr_tensor *x = &c->in[0], *w = &c->in[1], *ws = &c->out[1];
    conv_geom g;
    int st = fr_kcheck_conv2d(c, "conv2d", &g, x, w, &c->out[0].shape);
    if (st) return st;
    if (g.N == 0 || g.OC == 0 || g.ohw == 0) return FR_OK;
    /* a blocked operand: oneDNN's alone; a bf16 y of a 16-bit image too,
     * where oneDNN runs such images */
    const int layout = fr_conv_flags(c->node, c->out[0].dtype) & ~FR_CONV_Y16;
    const int y16 = c->out[0].dtype != FR_F32;
    if ((layout || fr_conv_dnnl_for(x->dtype)) && g.C > 0) {
        st = fr_conv_dnnl_fwd(c, &g, dnnl_budget(&g, 0));
        if (st != FR_CONV_DNNL_DECLINE) return st;
        if (layout) return blocked_declined(c, "conv2d");
    }
    if (shifted(&g) && !y16) return shift_fwd(c, &g);
    if (x->dtype != FR_F32 || (y16 && c->out[0].dtype != FR_BF16))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       y16 ? "conv2d: a 16-bit output only as bf16 from an f32 input off oneDNN"
                           : "conv2d: a 16-bit input only on the shifted-GEMM path");
    /* a bf16 y is each image's f32 y, made after col in the slot, rounded */
    const int64_t col = col_elems(&g) + (y16 ? g.OC * g.ohw : 0);
    int64_t cap = omp_get_max_threads();
    if (cap > g.N) cap = g.N;
    int64_t have = ws->data ? fr_shape_numel(&ws->shape) : 0;
    int64_t S = slots_fitting(have, col, 0, cap);
    if (S < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "conv2d: workspace of %lld floats, need at least %lld",
                       (long long)have, (long long)col);
    const float *xp = fr_f32(x), *wp = fr_f32(w), *bp = fr_f32(&c->in[2]);
    float *yp = y16 ? NULL : fr_f32(&c->out[0]), *wsp = fr_f32(ws);

#pragma omp parallel for schedule(static) num_threads((int)S) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        float *colp = col ? wsp + s * col : NULL;
        for (int64_t n = g.N * s / S; n < g.N * (s + 1) / S; n++) {
            const float *xn = xp + n * g.C * g.H * g.W;
            float *yn = y16 ? colp + col_elems(&g) : yp + n * g.OC * g.ohw;
            const float *b_mat = xn;
            if (!g.direct) {
                im2col(&g, xn, colp);
                b_mat = colp;
            }
            if (bp)
                for (int64_t oc = 0; oc < g.OC; oc++)
                    for (int64_t i = 0; i < g.ohw; i++) yn[oc * g.ohw + i] = bp[oc];
            if (g.ckk == 0) {
                if (!bp) memset(yn, 0, (size_t)(g.OC * g.ohw) * sizeof(float));
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.OC, (int)g.ohw,
                            (int)g.ckk, 1.0f, wp, (int)g.ckk, b_mat, (int)g.ohw, bp ? 1.0f : 0.0f,
                            yn, (int)g.ohw);
            }
            if (y16) out_store(&c->out[0], n * g.OC * g.ohw, yn, g.OC * g.ohw);
        }
    }
    return FR_OK;
}

// dy is (N,OC,OH,OW), x is (N,C,H,W), W is (OC,C,K,K); each output absent when data is NULL
// dW (OC, C*K*K) = sum_n dy_n (OC, OH*OW) @ col_n^T       (accumulate bit 1)
// db (OC)        = sum_{n,oh,ow} dy[n,oc,oh,ow]            (accumulate bit 2)
// dx_n           = col2im(W^T (C*K*K, OC) @ dy_n)          (accumulate bit 0)
int fr_k_conv2d_bwd(fr_kernel_call *c) {
    const fr_tensor *dy = &c->in[0], *x = &c->in[1], *w = &c->in[2], *ws = &c->out[3];
    conv_geom g;
    int st = fr_kcheck_conv2d(c, "conv2d_bwd", &g, x, w, &dy->shape);
    if (st) return st;
    float *dx = fr_f32(&c->out[0]), *dw = fr_f32(&c->out[1]), *db = fr_f32(&c->out[2]);
    const float *dyp = fr_f32(dy), *xp = fr_f32(x), *wp = fr_f32(w);
    const int64_t wn = g.OC * g.ckk, xn_el = g.C * g.H * g.W, yn_el = g.OC * g.ohw;

    if (db) {
        int acc = acc_bit(c, 2);
#pragma omp parallel for schedule(static) if (g.N * yn_el >= CONV_PAR_MIN)
        for (int64_t oc = 0; oc < g.OC; oc++) {
            double s = acc ? db[oc] : 0.0;
            for (int64_t n = 0; n < g.N; n++) s += sum_f64(dyp + n * yn_el + oc * g.ohw, g.ohw);
            db[oc] = (float)s;
        }
    }
    if (!dx && !dw) return FR_OK;
    if (g.N == 0 || g.ckk == 0) { /* nothing flows: clear what is not accumulated */
        if (dw && !acc_bit(c, 1)) memset(dw, 0, (size_t)wn * sizeof(float));
        if (dx && !acc_bit(c, 0)) memset(dx, 0, (size_t)(g.N * xn_el) * sizeof(float));
        return FR_OK;
    }

    const int blk = fr_conv_flags(c->node, FR_F32);
    if (blk || fr_conv_dnnl_for(x->dtype)) {
        st = fr_conv_dnnl_bwd(c, &g, dnnl_budget(&g, 1), dx, dw);
        if (st != FR_CONV_DNNL_DECLINE) return st;
        if (blk) return blocked_declined(c, "conv2d_bwd");
    }
    if (shifted(&g)) return shift_bwd(c, &g, dx, dw);
    if (x->dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "conv2d_bwd: a 16-bit input only on the shifted-GEMM path");
    const int64_t col = col_elems(&g), part = dw ? wn : 0;
    int64_t cap = omp_get_max_threads();
    if (cap > g.N) cap = g.N;
    int64_t have = ws->data ? fr_shape_numel(&ws->shape) : 0;
    int64_t S = slots_fitting(have, col, part, cap);
    if (S < 1)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "conv2d_bwd: workspace of %lld floats, need at least %lld", (long long)have,
                       (long long)col);
    float *wsp = fr_f32(ws);
    const int acc_w = acc_bit(c, 1), acc_x = acc_bit(c, 0);

#pragma omp parallel for schedule(static) num_threads((int)S) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        float *colp = col ? wsp + s * col : NULL;
        float *dws = s == 0 || !dw ? dw : wsp + S * col + (s - 1) * part; /* this chunk's dW */
        int first = 1;
        for (int64_t n = g.N * s / S; n < g.N * (s + 1) / S; n++) {
            const float *xn = xp + n * xn_el, *dyn = dyp + n * yn_el;
            float *dxn = dx ? dx + n * xn_el : NULL;
            if (dw) {
                const float *cm = xn;
                if (!g.direct) {
                    im2col(&g, xn, colp);
                    cm = colp;
                }
                float beta = first ? (s == 0 && acc_w ? 1.0f : 0.0f) : 1.0f;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.OC, (int)g.ckk,
                            (int)g.ohw, 1.0f, dyn, (int)g.ohw, cm, (int)g.ohw, beta, dws,
                            (int)g.ckk);
                first = 0;
            }
            if (dxn) {
                if (g.direct) { /* col2im is the identity: GEMM straight into dx */
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.ckk, (int)g.ohw,
                                (int)g.OC, 1.0f, wp, (int)g.ckk, dyn, (int)g.ohw,
                                acc_x ? 1.0f : 0.0f, dxn, (int)g.ohw);
                } else {
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.ckk, (int)g.ohw,
                                (int)g.OC, 1.0f, wp, (int)g.ckk, dyn, (int)g.ohw, 0.0f, colp,
                                (int)g.ohw);
                    if (!acc_x) memset(dxn, 0, (size_t)xn_el * sizeof(float));
                    col2im(&g, colp, dxn);
                }
            }
        }
    }
    if (dw && S > 1) { /* add the chunk partials into dW in chunk order */
        const float *parts = wsp + S * col;
#pragma omp parallel for schedule(static) if (wn * (S - 1) >= CONV_PAR_MIN)
        for (int64_t i = 0; i < wn; i++) {
            float v = dw[i];
            for (int64_t s = 1; s < S; s++) v += parts[(s - 1) * wn + i];
            dw[i] = v;
        }
    }
    return FR_OK;
}
