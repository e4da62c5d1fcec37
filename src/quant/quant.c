/* quant.c — the int8, NF4 and bf16 weight formats of quant.h: quantizing (once, as
 * a frozen weight is loaded), dequantizing a range of values, and the tiled
 * GEMMs of a frozen quantized weight (the forward product and the input
 * gradient). It owns no state but the dynamic map, built once.
 *
 * Sources followed (bitsandbytes-foundation/bitsandbytes):
 *  - NF4's values: csrc/kernels.cu's nf4_dequantization_lut (dDequantizeNF4);
 *    its thresholds, the tie rule (x > t: a value on a threshold takes the
 *    lower code), the normalisation x * (1.0f / absmax) and the nibble order
 *    (the first value of a pair in the high nibble): kQuantizeBlockwise and
 *    dQuantizeNF4 of csrc/cuda/blockwise_quantization.cu (commit 12297f3).
 *    The values come from create_normal_map(offset = 0.9677083) of
 *    bitsandbytes/functional.py; tests/test_quant.c recomputes them.
 *  - Double quantization: functional.py's quantize_4bit(compress_statistics
 *    = True) (offset = absmax.mean(); quantize_blockwise(absmax - offset,
 *    blocksize = 256) with the signed dynamic map) and dequantize_4bit
 *    (dequantize_blockwise(...) + offset). The nearest map entry is found
 *    as backend/cpu/optim_state.c finds it (exact midpoints, a tie to the
 *    lower entry); bitsandbytes' dQuantize compares with f32 midpoints and
 *    breaks a tie toward its last probe, so the two can differ only for a
 *    quotient within an ulp of a midpoint. */
#include "quant/quant.h"
#include "core/half.h"

#include <cblas.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define QUANT_PAR_MIN 65536 /* values below which quantizing runs on one thread */

/* ---- the NF4 table ---------------------------------------------------------- */

static const float nf4[16] = {-1.0f,
                              -0.6961928009986877f,
                              -0.5250730514526367f,
                              -0.39491748809814453f,
                              -0.28444138169288635f,
                              -0.18477343022823334f,
                              -0.09105003625154495f,
                              0.0f,
                              0.07958029955625534f,
                              0.16093020141124725f,
                              0.24611230194568634f,
                              0.33791524171829224f,
                              0.44070982933044434f,
                              0.5626170039176941f,
                              0.7229568362236023f,
                              1.0f};

/* dQuantizeNF4's tree as a list: thr[j] separates codes j and j + 1 (the
 * midpoint of the two values, rounded to f32). */
static const float nf4_thr[15] = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f};

#define NF4_ZERO_CODE 7

const float *fr_nf4_values(void) { return nf4; }

/* The code of x: how many thresholds lie below it (NaN: 0, as the tree). */
static inline unsigned nf4_code(float x) {
    unsigned c = 0;
    for (int j = 0; j < 15; j++) c += x > nf4_thr[j];
    return c;
}

/* ---- the signed dynamic map (double quantization) ------------------------- */

/* bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7,
 * total_bits=8): decade i = 0..6 gives the midpoints of linspace(0.1, 1,
 * 2^i + 1) times 10^(i - 6), each also negated (254 values); then 0 and 1;
 * sorted. torch's scalar linspace formula, the decade a double rounded to
 * f32 times the f32 midpoint: as backend/cpu/optim_state.c builds it. */
static float dyn_val[256];
static double dyn_mid[256]; /* dyn_mid[k] = (val[k] + val[k+1]) / 2, exact; [255] = +inf */
static pthread_once_t dyn_once = PTHREAD_ONCE_INIT;

#define DYN_ZERO_CODE 127

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void dyn_build(void) {
    static const double decade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    float v[256], bnd[65];
    int cnt = 0;
    for (int i = 0; i < 7; i++) {
        const int steps = (1 << i) + 1, half = steps / 2;
        const float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1);
        for (int j = 0; j < steps; j++)
            bnd[j] = j < half ? start + step * (float)j : end - step * (float)(steps - j - 1);
        const float scale = (float)decade[i];
        for (int j = 0; j + 1 < steps; j++) {
            const float x = scale * ((bnd[j] + bnd[j + 1]) / 2.0f);
            v[cnt++] = x;
            v[cnt++] = -x;
        }
    }
    v[cnt++] = 0.0f;
    v[cnt++] = 1.0f;
    qsort(v, 256, sizeof v[0], cmp_float);
    memcpy(dyn_val, v, sizeof v);
    for (int k = 0; k < 255; k++) dyn_mid[k] = ((double)v[k] + (double)v[k + 1]) / 2.0;
    dyn_mid[255] = INFINITY;
}

const float *fr_quant_dynamic_map(void) {
    pthread_once(&dyn_once, dyn_build);
    return dyn_val;
}

/* The entry nearest y: the number of midpoints below y (a tie goes low). */
static uint8_t dyn_code(double y) {
    unsigned k = 0;
    for (unsigned s = 128; s; s >>= 1)
        if (dyn_mid[k + s - 1] < y) k += s;
    return (uint8_t)k;
}

/* ---- sizes ---------------------------------------------------------------- */

const char *fr_qfmt_name(fr_qfmt fmt) {
    static const char *names[FR_QFMT_COUNT] = {"int8", "nf4", "bf16"};
    return (unsigned)fmt < FR_QFMT_COUNT ? names[fmt] : "?";
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t imin64(int64_t a, int64_t b) { return a < b ? a : b; }

static int shape_ok(int64_t O, int64_t K) {
    return O >= 1 && K >= 1 && O <= INT_MAX && K <= INT_MAX;
}

size_t fr_quant_bytes(fr_qfmt fmt, int64_t O, int64_t K) {
    if (!shape_ok(O, K)) return 0;
    const int64_t n = O * K; /* below 2^62 */
    if (fmt == FR_QFMT_INT8) return (size_t)n + (size_t)O * sizeof(float);
    if (fmt == FR_QFMT_BF16) return (size_t)n * sizeof(uint16_t);
    if (fmt != FR_QFMT_NF4) return 0;
    const int64_t nb = cdiv(n, FR_NF4_BLOCK), n2 = cdiv(nb, FR_NF4_DQ_BLOCK);
    return (size_t)(n2 + 1) * sizeof(float) + (size_t)nb + (size_t)cdiv(n, 2);
}

/* Points w's arrays into its block. */
static void layout(fr_qweight *w) {
    const int64_t n = w->O * w->K;
    char *p = w->block;
    if (w->fmt == FR_QFMT_BF16) {
        w->h = (uint16_t *)p;
        return;
    }
    if (w->fmt == FR_QFMT_INT8) {
        w->scale = (float *)p;
        w->q = (int8_t *)(p + (size_t)w->O * sizeof(float));
        return;
    }
    const int64_t nb = cdiv(n, FR_NF4_BLOCK), n2 = cdiv(nb, FR_NF4_DQ_BLOCK);
    w->absmax2 = (float *)p;
    w->offset = w->absmax2 + n2;
    w->qabsmax = (uint8_t *)(w->offset + 1);
    w->codes = w->qabsmax + nb;
}

/* ---- quantizing ----------------------------------------------------------- */

/* The lowest index of a value that is not finite, or n. */
static int64_t first_bad(const float *w, int64_t n) {
    int64_t bad = n;
#pragma omp parallel for schedule(static) reduction(min : bad) if (n >= QUANT_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(w[i]) && i < bad) bad = i;
    return bad;
}

static float absmax_of(const float *w, int64_t n) {
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(w[i]));
    return a;
}

static void quantize_int8(const float *w, fr_qweight *q) {
    const int64_t O = q->O, K = q->K;
#pragma omp parallel for schedule(static) if (O * K >= QUANT_PAR_MIN)
    for (int64_t o = 0; o < O; o++) {
        const float *row = w + o * K;
        int8_t *qr = q->q + o * K;
        const float s = absmax_of(row, K) / 127.0f;
        q->scale[o] = s;
        if (s == 0.0f) {
            memset(qr, 0, (size_t)K);
            continue;
        }
        for (int64_t k = 0; k < K; k++) {
            /* a subnormal s can put the quotient past 127: clamped */
            double r = nearbyint((double)row[k] / (double)s);
            qr[k] = (int8_t)(r > 127.0 ? 127.0 : r < -127.0 ? -127.0 : r);
        }
    }
}

/* NF4 codes of the n values of w into q->codes, their block absmaxes into
 * amax (nb floats). */
static void quantize_nf4_codes(const float *w, int64_t n, fr_qweight *q, float *amax) {
    const int64_t nb = cdiv(n, FR_NF4_BLOCK);
#pragma omp parallel for schedule(static) if (n >= QUANT_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i0 = b * FR_NF4_BLOCK, cnt = imin64(FR_NF4_BLOCK, n - i0);
        const float *x = w + i0;
        uint8_t *out = q->codes + i0 / 2; /* i0 is even */
        const float a = absmax_of(x, cnt);
        amax[b] = a;
        if (a == 0.0f) {
            memset(out, NF4_ZERO_CODE << 4 | NF4_ZERO_CODE, (size_t)cdiv(cnt, 2));
            continue;
        }
        const float inv = 1.0f / a;
        const int by_div = isinf(inv); /* a subnormal absmax: divide instead */
        for (int64_t j = 0; j < cnt; j += 2) {
            const float x0 = by_div ? x[j] / a : x[j] * inv;
            unsigned c1 = NF4_ZERO_CODE; /* an odd n's last low nibble: bitsandbytes' 0 pad */
            if (j + 1 < cnt) c1 = nf4_code(by_div ? x[j + 1] / a : x[j + 1] * inv);
            out[j / 2] = (uint8_t)(nf4_code(x0) << 4 | c1);
        }
    }
}

/* The double quantization of the nb absmaxes amax into q. */
static void quantize_nf4_scales(const float *amax, int64_t nb, fr_qweight *q) {
    double sum = 0.0;
    for (int64_t b = 0; b < nb; b++) sum += amax[b];
    const float offset = (float)(sum / (double)nb);
    *q->offset = offset;
    const int64_t n2 = cdiv(nb, FR_NF4_DQ_BLOCK);
#pragma omp parallel for schedule(static) if (nb >= QUANT_PAR_MIN / 16)
    for (int64_t j = 0; j < n2; j++) {
        const int64_t b0 = j * FR_NF4_DQ_BLOCK, cnt = imin64(FR_NF4_DQ_BLOCK, nb - b0);
        float a2 = 0.0f;
        for (int64_t b = b0; b < b0 + cnt; b++) a2 = fmaxf(a2, fabsf(amax[b] - offset));
        q->absmax2[j] = a2;
        for (int64_t b = b0; b < b0 + cnt; b++) {
            const float c = amax[b] - offset;
            q->qabsmax[b] = a2 == 0.0f ? DYN_ZERO_CODE : dyn_code((double)c / (double)a2);
        }
    }
}

/* The checks of fr_quantize(_into): 0 or the failure. */
static fr_status check_quantize(fr_ctx *ctx, fr_qfmt fmt, const float *w, int64_t O, int64_t K) {
    if ((unsigned)fmt >= FR_QFMT_COUNT)
        return fr_fail(ctx, FR_ERR_ARG, "quantize: unknown format %d (int8, nf4 or bf16)",
                       (int)fmt);
    if (!shape_ok(O, K))
        return fr_fail(ctx, FR_ERR_SHAPE,
                       "quantize: a %s weight of shape (%lld,%lld): each dimension must be 1 to "
                       "%d",
                       fr_qfmt_name(fmt), (long long)O, (long long)K, INT_MAX);
    if (!w) return fr_fail(ctx, FR_ERR_ARG, "quantize: no weight values");
    const int64_t n = O * K, bad = first_bad(w, n);
    if (bad < n)
        return fr_fail(ctx, FR_ERR_NUMERIC,
                       "quantize: weight (%lld,%lld) is %g: only finite values can be quantized",
                       (long long)(bad / K), (long long)(bad % K), (double)w[bad]);
    return FR_OK;
}

/* Fills q (its block laid out) from w. */
static fr_status fill(fr_ctx *ctx, const float *w, fr_qweight *q) {
    const int64_t n = q->O * q->K;
    if (q->fmt == FR_QFMT_BF16) {
        fr_f32_to_bf16_n(w, q->h, (size_t)n);
    } else if (q->fmt == FR_QFMT_INT8) {
        quantize_int8(w, q);
    } else {
        const int64_t nb = cdiv(n, FR_NF4_BLOCK);
        float *amax = fr_alloc(ctx, (size_t)nb * sizeof(float), FR_MEM_WORKSPACE);
        if (!amax) return FR_ERR_NOMEM;
        pthread_once(&dyn_once, dyn_build);
        quantize_nf4_codes(w, n, q, amax);
        quantize_nf4_scales(amax, nb, q);
        fr_free(ctx, amax);
    }
    return FR_OK;
}

fr_status fr_quantize(fr_ctx *ctx, fr_qfmt fmt, const float *w, int64_t O, int64_t K,
                      fr_qweight *out) {
    if (!out) return fr_fail(ctx, FR_ERR_ARG, "quantize: no output weight");
    memset(out, 0, sizeof *out);
    fr_status st = check_quantize(ctx, fmt, w, O, K);
    if (st) return st;
    fr_qweight q = {.fmt = fmt, .O = O, .K = K};
    if (!(q.block = fr_alloc(ctx, fr_quant_bytes(fmt, O, K), FR_MEM_PARAMS))) return FR_ERR_NOMEM;
    layout(&q);
    if ((st = fill(ctx, w, &q))) {
        fr_free(ctx, q.block);
        return st;
    }
    *out = q;
    return FR_OK;
}

fr_status fr_quant_view(fr_ctx *ctx, fr_qfmt fmt, int64_t O, int64_t K, void *block,
                        fr_qweight *out) {
    if (!out) return fr_fail(ctx, FR_ERR_ARG, "quantized weight: no output view");
    memset(out, 0, sizeof *out);
    uint64_t bits = 0; /* the address's low bits (memcpy, as core/mem.c: no integer cast) */
    memcpy(&bits, &block, sizeof block < sizeof bits ? sizeof block : sizeof bits);
    if ((unsigned)fmt >= FR_QFMT_COUNT || !shape_ok(O, K) || !block || (bits & 3))
        return fr_fail(ctx, FR_ERR_ARG,
                       "quantized weight: format %d, shape (%lld,%lld) at %p: not a quantized "
                       "block (int8, nf4 or bf16; dimensions 1 to %d; 4-byte aligned)",
                       (int)fmt, (long long)O, (long long)K, block, INT_MAX);
    fr_qweight q = {.fmt = fmt, .O = O, .K = K, .block = block};
    layout(&q);
    *out = q;
    return FR_OK;
}

fr_status fr_quantize_into(fr_ctx *ctx, fr_qfmt fmt, const float *w, int64_t O, int64_t K,
                           void *dst, fr_qweight *out) {
    fr_qweight q;
    fr_status st = check_quantize(ctx, fmt, w, O, K);
    if (!st) st = fr_quant_view(ctx, fmt, O, K, dst, &q);
    if (!st) st = fill(ctx, w, &q);
    if (out) *out = st ? (fr_qweight){0} : q;
    return st;
}

void fr_quant_free(fr_ctx *ctx, fr_qweight *q) {
    if (!q) return;
    fr_free(ctx, q->block);
    memset(q, 0, sizeof *q);
}

/* ---- dequantizing ----------------------------------------------------------- */

/* out[0 .. cnt) = W'[i0 .. i0 + cnt) of the flattened weight. */
static void deq_range(const fr_qweight *w, int64_t i0, int64_t cnt, float *out) {
    const int64_t end = i0 + cnt;
    if (w->fmt == FR_QFMT_BF16) {
        fr_bf16_to_f32_n_seq(w->h + i0, out, (size_t)cnt);
        return;
    }
    if (w->fmt == FR_QFMT_INT8) {
        for (int64_t i = i0; i < end;) {
            const int64_t o = i / w->K, stop = imin64((o + 1) * w->K, end);
            const float s = w->scale[o];
            const int8_t *q = w->q;
            for (; i < stop; i++) *out++ = (float)q[i] * s;
        }
        return;
    }
    const float offset = *w->offset;
    const uint8_t *codes = w->codes;
    for (int64_t i = i0; i < end;) {
        const int64_t b = i / FR_NF4_BLOCK, stop = imin64((b + 1) * FR_NF4_BLOCK, end);
        float a = dyn_val[w->qabsmax[b]] * w->absmax2[b / FR_NF4_DQ_BLOCK];
        a = a + offset; /* two roundings, as bitsandbytes (C11: no contraction) */
        float sv[16];
        for (int c = 0; c < 16; c++) sv[c] = nf4[c] * a;
        if (i & 1) *out++ = sv[codes[i >> 1] & 15], i++;
        for (; i + 1 < stop; i += 2, out += 2) {
            const uint8_t byte = codes[i >> 1];
            out[0] = sv[byte >> 4];
            out[1] = sv[byte & 15];
        }
        if (i < stop) *out++ = sv[codes[i >> 1] >> 4], i++;
    }
}

static fr_status check_weight(fr_ctx *ctx, const char *op, const fr_qweight *w) {
    if (!w || !w->block) return fr_fail(ctx, FR_ERR_ARG, "%s: no quantized weight", op);
    if ((unsigned)w->fmt >= FR_QFMT_COUNT || !shape_ok(w->O, w->K))
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: the weight (format %d, shape (%lld,%lld)) is not one "
                       "fr_quantize made",
                       op, (int)w->fmt, (long long)w->O, (long long)w->K);
    return FR_OK;
}

fr_status fr_dequantize_rows(fr_ctx *ctx, const fr_qweight *w, int64_t o0, int64_t rows,
                             float *out) {
    fr_status st = check_weight(ctx, "dequantize", w);
    if (st) return st;
    if (o0 < 0 || rows < 0 || o0 > w->O - rows)
        return fr_fail(ctx, FR_ERR_ARG, "dequantize: rows %lld to %lld of a weight of %lld rows",
                       (long long)o0, (long long)(o0 + rows), (long long)w->O);
    if (rows && !out) return fr_fail(ctx, FR_ERR_ARG, "dequantize: no output");
    if (w->fmt == FR_QFMT_NF4) pthread_once(&dyn_once, dyn_build);
    deq_range(w, o0 * w->K, rows * w->K, out);
    return FR_OK;
}

fr_status fr_dequantize_bf16(fr_ctx *ctx, const fr_qweight *w, int64_t o0, int64_t rows, int64_t k0,
                             int64_t kc, uint16_t *out, int64_t ld) {
    fr_status st = check_weight(ctx, "dequantize_bf16", w);
    if (st) return st;
    if (o0 < 0 || rows < 0 || o0 > w->O - rows || k0 < 0 || kc < 0 || k0 > w->K - kc ||
        (rows && kc && (!out || ld < kc)))
        return fr_fail(ctx, FR_ERR_ARG,
                       "dequantize_bf16: rows %lld to %lld, columns %lld to %lld (row stride "
                       "%lld) of a (%lld,%lld) weight",
                       (long long)o0, (long long)(o0 + rows), (long long)k0, (long long)(k0 + kc),
                       (long long)ld, (long long)w->O, (long long)w->K);
    if (w->fmt == FR_QFMT_NF4) pthread_once(&dyn_once, dyn_build);
#pragma omp parallel for schedule(static) if (rows * kc >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *o = out + r * ld;
        const int64_t at = (o0 + r) * w->K + k0;
        if (w->fmt == FR_QFMT_BF16) {
            memcpy(o, w->h + at, (size_t)kc * sizeof *o);
            continue;
        }
        float buf[256];
        for (int64_t c = 0; c < kc; c += 256) {
            const int64_t n = imin64(256, kc - c);
            deq_range(w, at + c, n, buf);
            fr_f32_to_bf16_n_seq(buf, o + c, (size_t)n);
        }
    }
    return FR_OK;
}

/* ---- the GEMMs ---------------------------------------------------------------- */

/* Tiles. The forward product dequantizes TF whole rows of W' (about
 * QG_TILE_FLOATS values, at least QG_MIN_ROWS rows); dx a TD x KC block of
 * them. A task takes QG_CHUNK rows of x (dy). A thread's slot holds the
 * larger of the two tiles, so one workspace serves both products. */
#define QG_TILE_FLOATS 131072
#define QG_MIN_ROWS 64
#define QG_DX_ROWS 256
#define QG_DX_COLS 256
#define QG_CHUNK 512

static int64_t fwd_rows(int64_t O, int64_t K) {
    int64_t t = QG_TILE_FLOATS / K;
    if (t < QG_MIN_ROWS) t = QG_MIN_ROWS;
    return imin64(t, O);
}

static size_t slot_floats(int64_t O, int64_t K) {
    const size_t f = (size_t)(fwd_rows(O, K) * K);
    const size_t d = (size_t)(imin64(O, QG_DX_ROWS) * imin64(K, QG_DX_COLS));
    return f > d ? f : d;
}

size_t fr_qgemm_ws_floats(int64_t O, int64_t K, int threads) {
    if (!shape_ok(O, K)) return 0;
    return slot_floats(O, K) * (size_t)(threads > 1 ? threads : 1);
}

/* Checks a GEMM's arguments; *nt: the threads to run (as many as
 * fr_get_threads(ctx), ws's slots and the tasks allow). */
static fr_status check_gemm(fr_ctx *ctx, const char *op, const fr_qweight *w, int64_t N,
                            const void *a, const void *c, const float *ws, size_t ws_floats,
                            int64_t tasks, int *nt) {
    fr_status st = check_weight(ctx, op, w);
    if (st) return st;
    if (N < 0 || N > INT_MAX)
        return fr_fail(ctx, FR_ERR_SHAPE, "%s: %lld rows: must be 0 to %d", op, (long long)N,
                       INT_MAX);
    if (N && (!a || !c)) return fr_fail(ctx, FR_ERR_ARG, "%s: an input or output is NULL", op);
    const size_t slot = slot_floats(w->O, w->K), slots = ws ? ws_floats / slot : 0;
    if (slots < 1)
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: a workspace of %zu floats is too small: a (%lld,%lld) %s weight needs "
                       "%zu for one tile (fr_qgemm_ws_floats)",
                       op, ws ? ws_floats : 0, (long long)w->O, (long long)w->K,
                       fr_qfmt_name(w->fmt), slot);
    long long t = fr_get_threads(ctx);
    if ((long long)slots < t) t = (long long)slots;
    if (tasks < t) t = tasks;
    *nt = t > 1 ? (int)t : 1;
    if (w->fmt == FR_QFMT_NF4) pthread_once(&dyn_once, dyn_build);
    return FR_OK;
}

/* Every GEMM runs on one thread (OpenBLAS's bits depend on how many threads
 * split a GEMM): in a team of several OpenBLAS sees omp_in_parallel(); in a
 * team of one each thread sets its own nthreads-var to 1, which OpenBLAS's
 * OpenMP build reads (as backend/cpu/attention.c). */

fr_status fr_qgemm(fr_ctx *ctx, const fr_qweight *w, const float *x, int64_t N, const float *b,
                   float *y, int accumulate, float *ws, size_t ws_floats) {
    const int64_t O = w ? w->O : 0, K = w ? w->K : 0;
    const int64_t T = w && shape_ok(O, K) ? fwd_rows(O, K) : 1;
    const int64_t nO = cdiv(O, T), nN = cdiv(N, QG_CHUNK), tasks = nO * nN;
    int nt;
    fr_status st = check_gemm(ctx, "qgemm", w, N, x, y, ws, ws_floats, tasks, &nt);
    if (st || N == 0) return st;
    const size_t slot = slot_floats(O, K);
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (above) */
        float *tile = ws + (size_t)omp_get_thread_num() * slot;
        int64_t have = -1; /* the row tile in `tile`: consecutive tasks share it */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t ot = t / nN, o0 = ot * T, rows = imin64(T, O - o0);
            const int64_t n0 = (t % nN) * QG_CHUNK, nr = imin64(QG_CHUNK, N - n0);
            if (ot != have) deq_range(w, o0 * K, rows * K, tile), have = ot;
            float *yt = y + n0 * O + o0;
            float beta = accumulate ? 1.0f : 0.0f;
            if (b) { /* y seeded with the bias (added to it when accumulating) */
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t o = 0; o < rows; o++)
                        yt[r * O + o] = accumulate ? yt[r * O + o] + b[o0 + o] : b[o0 + o];
                beta = 1.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)rows, (int)K, 1.0f,
                        x + n0 * K, (int)K, tile, (int)K, beta, yt, (int)O);
        }
    }
    return FR_OK;
}

fr_status fr_qgemm_dx(fr_ctx *ctx, const fr_qweight *w, const float *dy, int64_t N, float *dx,
                      int accumulate, float *ws, size_t ws_floats) {
    const int64_t O = w ? w->O : 0, K = w ? w->K : 0;
    const int64_t TD = imin64(O, QG_DX_ROWS), KC = K < QG_DX_COLS ? K : QG_DX_COLS;
    const int64_t nK = KC > 0 ? cdiv(K, KC) : 0, nN = cdiv(N, QG_CHUNK), tasks = nK * nN;
    int nt;
    fr_status st = check_gemm(ctx, "qgemm_dx", w, N, dy, dx, ws, ws_floats, tasks, &nt);
    if (st || N == 0) return st;
    const size_t slot = slot_floats(O, K);
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (above) */
        float *tile = ws + (size_t)omp_get_thread_num() * slot;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t k0 = (t / nN) * KC, kc = imin64(KC, K - k0);
            const int64_t n0 = (t % nN) * QG_CHUNK, nr = imin64(QG_CHUNK, N - n0);
            float *dxt = dx + n0 * K + k0;
            for (int64_t o0 = 0; o0 < O; o0 += TD) {
                const int64_t rows = imin64(TD, O - o0);
                for (int64_t r = 0; r < rows; r++)
                    deq_range(w, (o0 + r) * K + k0, kc, tile + r * kc);
                const float beta = o0 > 0 || accumulate ? 1.0f : 0.0f;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)kc, (int)rows,
                            1.0f, dy + n0 * O + o0, (int)O, tile, (int)kc, beta, dxt, (int)K);
            }
        }
    }
    return FR_OK;
}
