/* test_quant.c — the quantized frozen-weight formats (src/quant): the NF4
 * table against its definition (create_normal_map's normal quantiles,
 * recomputed here in float64 with this file's own inverse normal CDF) and
 * against bitsandbytes' literal table; the dynamic map against the dump of
 * tests/dynamic_map_ref.h; int8 and NF4 quantize/dequantize against float64
 * references of the formats written here, with the round-trip error bounds
 * derived below; the tiled GEMMs (forward and dx) against cblas_sgemm on the
 * fully dequantized weight and a float64 product, within the bound of f32
 * summation; bit-identical results for 1 and 2 threads and any workspace;
 * bad input refused with its message. */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/rng.h"
#include "dynamic_map_ref.h"
#include "quant/quant.h"

static fr_ctx *g_ctx;
static uint64_t g_seed = 11;

#define U32 (1.0 / 16777216.0) /* 2^-24, the unit roundoff of f32 */

/* bitsandbytes' NF4 table as its kernels spell it (csrc/kernels.cu,
 * nf4_dequantization_lut), typed here from the source. */
static const double nf4_lit[16] = {-1.0,
                                   -0.6961928009986877,
                                   -0.5250730514526367,
                                   -0.39491748809814453,
                                   -0.28444138169288635,
                                   -0.18477343022823334,
                                   -0.09105003625154495,
                                   0.0,
                                   0.07958029955625534,
                                   0.16093020141124725,
                                   0.24611230194568634,
                                   0.33791524171829224,
                                   0.44070982933044434,
                                   0.5626170039176941,
                                   0.7229568362236023,
                                   1.0};

/* ---- the inverse normal CDF ------------------------------------------------ */

static double norm_cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* Acklam's rational approximation (relative error below 1.2e-9), then
 * Halley steps on cdf(x) - p with erfc, to full double precision. */
static double norm_ppf(double p) {
    static const double a[6] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                -2.759285104469687e+02, 1.383577518672690e+02,
                                -3.066479806614716e+01, 2.506628277459239e+00};
    static const double b[5] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                -1.556989798598866e+02, 6.680131188771972e+01,
                                -1.328068155288572e+01};
    static const double c[6] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                -2.400758277161838e+00, -2.549732539343734e+00,
                                4.374664141464968e+00,  2.938163982698783e+00};
    static const double d[4] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                3.754408661907416e+00};
    const double plow = 0.02425;
    double x;
    if (p < plow || p > 1 - plow) {
        const double q = sqrt(-2 * log(p < plow ? p : 1 - p));
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
        if (p > plow) x = -x;
    } else {
        const double q = p - 0.5, r = q * q;
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
    }
    for (int it = 0; it < 3; it++) {
        const double e = norm_cdf(x) - p, u = e * sqrt(2 * M_PI) * exp(x * x / 2);
        x = x - u / (1 + x * u / 2);
    }
    return x;
}

/* torch.linspace(start, end, steps) in f32, torch's scalar formula. */
static void linspace_f32(float start, float end, int steps, float *out) {
    const float step = (end - start) / (float)(steps - 1);
    for (int j = 0; j < steps; j++)
        out[j] = j < steps / 2 ? start + step * (float)j : end - step * (float)(steps - j - 1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double ulp_f32(double v) {
    float f = (float)fabs(v);
    return (double)nextafterf(f, INFINITY) - (double)f;
}

/* create_normal_map(offset=0.9677083, use_extra_value=True): v1 =
 * ppf(linspace(offset, 0.5, 9)[:-1]), v3 = -ppf(linspace(offset, 0.5, 8)[:-1]),
 * and 0; the quantiles rounded to f32 (torch.Tensor), sorted, divided by
 * the largest in f32. */
static void test_nf4_table(void) {
    for (double p = 0.001; p < 1; p += 0.0123) /* the inverse CDF itself */
        CHECK(fabs(norm_cdf(norm_ppf(p)) - p) <= 4e-16, "cdf(ppf(%g)) = %.17g", p,
              norm_cdf(norm_ppf(p)));
    const float off = 0.9677083f;
    float p9[9], p8[8];
    linspace_f32(off, 0.5f, 9, p9);
    linspace_f32(off, 0.5f, 8, p8);
    double z[16], zd[16]; /* quantiles of the f32 p; of p in exact arithmetic */
    int m = 0;
    for (int j = 0; j < 8; j++, m++) {
        z[m] = norm_ppf(p9[j]);
        zd[m] = norm_ppf(0.9677083 + j * (0.5 - 0.9677083) / 8);
    }
    for (int j = 0; j < 7; j++, m++) {
        z[m] = -norm_ppf(p8[j]);
        zd[m] = -norm_ppf(0.9677083 + j * (0.5 - 0.9677083) / 7);
    }
    z[m] = zd[m] = 0.0;
    qsort(z, 16, sizeof z[0], cmp_double);
    qsort(zd, 16, sizeof zd[0], cmp_double);
    const float zmax = (float)z[15];
    const float *tab = fr_nf4_values();
    int exact = 0;
    double worst_ulp = 0, worst_d = 0;
    for (int i = 0; i < 16; i++) {
        const float v = (float)z[i] / zmax; /* torch: f32 values, an f32 division */
        exact += v == (float)nf4_lit[i];
        const double u = fabs((double)v - nf4_lit[i]) / ulp_f32(nf4_lit[i] ? nf4_lit[i] : 1);
        if (u > worst_ulp) worst_ulp = u;
        /* The quantiles from exact p: p's f32 rounding (at most 2^-25 for p
         * in [0.5, 1), one more rounding in linspace: 2^-24) moves ppf by
         * dp / pdf(z); with the division by the largest, and two f32
         * roundings of the value: */
        const double dv = zd[i] / zd[15], zi = fabs(zd[i]), zm = zd[15];
        const double pdf = exp(-zi * zi / 2) / sqrt(2 * M_PI),
                     pdfm = exp(-zm * zm / 2) / sqrt(2 * M_PI);
        const double tol = U32 * (1 / pdf + fabs(dv) / pdfm) / zm + 2 * U32;
        CHECK(fabs(dv - nf4_lit[i]) <= tol, "nf4[%d]: %.17g from exact p, the table's %.17g (%g)",
              i, dv, nf4_lit[i], tol);
        if (fabs(dv - nf4_lit[i]) > worst_d) worst_d = fabs(dv - nf4_lit[i]);
        CHECK(tab[i] == (float)nf4_lit[i], "fr_nf4_values()[%d] = %.9g, bitsandbytes' %.17g", i,
              (double)tab[i], nf4_lit[i]);
        CHECK((double)(float)nf4_lit[i] == nf4_lit[i], "nf4[%d] = %.17g is an f32", i, nf4_lit[i]);
    }
    CHECK(exact == 16, "create_normal_map's f32 pipeline gives %d of the 16 values exactly", exact);
    printf("NF4 table: %d/16 equal to create_normal_map recomputed (f32 p, largest %.2g ulp off); "
           "from exact p within %.2g\n",
           exact, worst_ulp, worst_d);
}

static void test_dynamic_map(void) {
    const float *map = fr_quant_dynamic_map();
    int same = 1, close = 1;
    for (int k = 0; k < 256; k++) {
        same &= map[k] == dynamic_map_scalar_signed[k];
        const double u = fabs((double)map[k] - dynamic_map_bnb_signed[k]) /
                         ulp_f32(dynamic_map_bnb_signed[k] ? dynamic_map_bnb_signed[k] : 1e-7);
        close &= u <= DYNAMIC_MAP_REF_MAX_ULP;
    }
    CHECK(same, "the dynamic map differs from torch's scalar-linspace dump");
    CHECK(close, "the dynamic map is more than %d ulp from bitsandbytes' dump",
          DYNAMIC_MAP_REF_MAX_ULP);
    CHECK(map[127] == 0.0f && map[255] == 1.0f, "map[127] = %g, map[255] = %g", (double)map[127],
          (double)map[255]);
}

/* ---- weights ---------------------------------------------------------------- */

/* (O,K) values: rows of a roughly normal shape, each row's magnitude drawn
 * over a few decades; row 1 (if any) zero. */
static float *make_weight(int64_t O, int64_t K) {
    float *w = malloc((size_t)(O * K) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 3);
    for (int64_t o = 0; o < O; o++) {
        const float mag = powf(10.0f, -3.0f + 3.0f * fr_rng_next_uniform(&r));
        for (int64_t k = 0; k < K; k++) {
            float s = 0;
            for (int t = 0; t < 4; t++) s += fr_rng_next_uniform(&r) - 0.5f;
            w[o * K + k] = o == 1 ? 0.0f : mag * s;
        }
    }
    return w;
}

/* ---- int8 ------------------------------------------------------------------ */

/* The reference: s = max|w| / 127 rounded once to f32 (an f32 division is
 * that), q = rne(w / s), W' = q s rounded once to f32. */
static void test_int8(int64_t O, int64_t K) {
    float *w = make_weight(O, K);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_INT8, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    float *d = malloc((size_t)(O * K) * sizeof(float));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, d) == FR_OK, "%s", fr_last_error(g_ctx));
    long long bad_s = 0, bad_q = 0, bad_d = 0, over = 0;
    double worst = 0;
    for (int64_t o = 0; o < O; o++) {
        double amax = 0;
        for (int64_t k = 0; k < K; k++) amax = fmax(amax, fabs((double)w[o * K + k]));
        const float s = (float)(amax / 127.0);
        bad_s += q.scale[o] != s;
        for (int64_t k = 0; k < K; k++) {
            const double x = w[o * K + k];
            const double qr = s ? nearbyint(x / s) : 0.0;
            bad_q += q.q[o * K + k] != (int8_t)qr;
            const float dr = (float)((int8_t)qr * (double)s); /* an int8 has no -0 */
            bad_d += memcmp(&d[o * K + k], &dr, sizeof dr) != 0;
            /* |x - q s| <= s/2 (q the nearest integer to x/s, |x/s| <= 127
             * up to a rounding of s); rounding q s adds at most 127 s 2^-24 */
            const double err = fabs(x - d[o * K + k]), bound = s * (0.5 + 127 * U32);
            over += err > bound;
            if (s && err / s > worst) worst = err / s;
        }
    }
    CHECK(bad_s == 0 && bad_q == 0 && bad_d == 0,
          "int8 (%lld,%lld): %lld scales, %lld codes, %lld values differ from the reference",
          (long long)O, (long long)K, bad_s, bad_q, bad_d);
    CHECK(over == 0, "int8 (%lld,%lld): %lld values past s (1/2 + 127 2^-24)", (long long)O,
          (long long)K, over);
    printf("int8 (%lld,%lld): round trip |W - W'| <= %.6f s (bound s/2 + 127 s 2^-24)\n",
           (long long)O, (long long)K, worst);
    fr_quant_free(g_ctx, &q);
    free(d);
    free(w);
}

/* Round half to even, by hand: a row of absmax 127 has s = 1, so W / s = W. */
static void test_int8_ties(void) {
    const float w[8] = {127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, -126.5f};
    const int8_t want[8] = {127, 2, 4, -2, 0, 0, 2, -126};
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_INT8, w, 1, 8, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    CHECK(q.scale[0] == 1.0f, "scale %g", (double)q.scale[0]);
    for (int k = 0; k < 8; k++)
        CHECK(q.q[k] == want[k], "rne(%g) = %d, want %d", (double)w[k], q.q[k], want[k]);
    fr_quant_free(g_ctx, &q);
}

/* ---- NF4 --------------------------------------------------------------------- */

/* The nearest NF4 code to x by exact midpoints (a tie goes low); *tie: the
 * distance from x to the nearest midpoint. */
static int nf4_ref_code(double x, double *tie) {
    int c = 0;
    *tie = INFINITY;
    for (int j = 0; j < 15; j++) {
        const double mid = (nf4_lit[j] + nf4_lit[j + 1]) / 2;
        c += x > mid;
        if (fabs(x - mid) < *tie) *tie = fabs(x - mid);
    }
    return c;
}

static int dyn_ref_code(double y) {
    int c = 0;
    for (int k = 0; k < 255; k++)
        c += y > ((double)dynamic_map_scalar_signed[k] + dynamic_map_scalar_signed[k + 1]) / 2;
    return c;
}

static int nibble(const uint8_t *codes, int64_t i) {
    return i & 1 ? codes[i >> 1] & 15 : codes[i >> 1] >> 4;
}

/* The reference of the format (quant.h): block absmax a, double-quantized
 * a' = map[qa] a2 + offset, W' = nf4[code] a'. The codes must equal the
 * nearest codes of w / a except within 2^-21 of a midpoint, where the f32
 * normalisation w * (1/a) (two roundings, 2^-23 of |x| <= 1) and the f32
 * thresholds (2^-25) may decide the other way. Bound on |W - W'|:
 *   the code is nearest to x' = fl(w fl(1/a)), |x' - w/a| <= 2^-22, so
 *   |w - v a| <= a (h + 2^-22), h = half the largest gap between
 *   neighbouring codes, (nf4[1] - nf4[0]) / 2 = 0.1519;
 *   |v| <= 1, so |v a - v a'| <= |a - a'|;
 *   |a - a'| <= a2 (hd + 2^-23) + 2^-24 |a'|: the nearest map entry is
 *   within hd (half the map's largest gap) of c / a2, and c = a - offset,
 *   map[qa] a2 and the sum each round once;
 *   rounding v a' adds 2^-24 |a'|. */
static void test_nf4(int64_t O, int64_t K) {
    const int64_t n = O * K, nb = (n + 63) / 64, n2 = (nb + 255) / 256;
    float *w = make_weight(O, K);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    float *d = malloc((size_t)n * sizeof(float));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, d) == FR_OK, "%s", fr_last_error(g_ctx));
    double *a = malloc((size_t)nb * sizeof(double)), sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        a[b] = 0;
        for (int64_t i = b * 64; i < n && i < b * 64 + 64; i++) a[b] = fmax(a[b], fabs(w[i]));
        sum += a[b];
    }
    const float offset = (float)(sum / (double)nb);
    CHECK(*q.offset == offset, "offset %.9g, want %.9g", (double)*q.offset, (double)offset);
    double h = 0, hd = 0;
    for (int j = 0; j < 15; j++) h = fmax(h, (nf4_lit[j + 1] - nf4_lit[j]) / 2);
    for (int k = 0; k < 255; k++)
        hd =
            fmax(hd, ((double)dynamic_map_scalar_signed[k + 1] - dynamic_map_scalar_signed[k]) / 2);
    /* the map's -1 end is -0.99297: c / a2 = -1 lies that far from it */
    hd = fmax(hd, 1.0 + dynamic_map_scalar_signed[0]);
    long long bad_a2 = 0, bad_qa = 0, bad_code = 0, near_tie = 0, bad_d = 0, over = 0;
    double worst = 0;
    for (int64_t j = 0; j < n2; j++) {
        double a2 = 0;
        for (int64_t b = j * 256; b < nb && b < j * 256 + 256; b++)
            a2 = fmax(a2, fabs((double)(float)(a[b] - offset)));
        bad_a2 += q.absmax2[j] != (float)a2;
        for (int64_t b = j * 256; b < nb && b < j * 256 + 256; b++) {
            const float c = (float)(a[b] - offset);
            const int qa = a2 ? dyn_ref_code(c / a2) : 127;
            bad_qa += q.qabsmax[b] != qa;
            const float ap = (float)((double)(float)((double)dynamic_map_scalar_signed[qa] * a2) +
                                     (double)offset);
            for (int64_t i = b * 64; i < n && i < b * 64 + 64; i++) {
                double tie;
                const int code = nibble(q.codes, i);
                const int want = a[b] ? nf4_ref_code(w[i] / a[b], &tie) : 7;
                if (code != want) {
                    if (a[b] && tie <= 0x1p-21 && abs(code - want) == 1) near_tie++;
                    else bad_code++;
                }
                const float dr = (float)(nf4_lit[code] * (double)ap); /* from the stored code */
                bad_d += memcmp(&d[i], &dr, sizeof dr) != 0;
                const double err = fabs((double)w[i] - d[i]);
                const double bound = a[b] * (h + 0x1p-22) + a2 * (hd + 0x1p-23) + 2 * U32 * ap;
                over += err > bound;
                if (err / bound > worst) worst = err / bound;
            }
        }
    }
    if (n & 1) CHECK(nibble(q.codes, n) == 7, "pad nibble %d", nibble(q.codes, n));
    CHECK(bad_a2 == 0 && bad_qa == 0 && bad_code == 0 && bad_d == 0,
          "nf4 (%lld,%lld): %lld scales, %lld scale codes, %lld codes, %lld values differ",
          (long long)O, (long long)K, bad_a2, bad_qa, bad_code, bad_d);
    CHECK(over == 0, "nf4 (%lld,%lld): %lld values past the bound", (long long)O, (long long)K,
          over);
    printf("nf4 (%lld,%lld): %lld codes decided by f32 at a near-tie; round trip at most %.3f of "
           "the bound a (%.4f + 2^-22) + a2 (%.5f + 2^-23) + 2^-23 a'\n",
           (long long)O, (long long)K, near_tie, worst, h, hd);
    fr_quant_free(g_ctx, &q);
    free(a);
    free(d);
    free(w);
}

/* The threshold between codes j and j+1 as bitsandbytes' tree has it: the
 * midpoint of the two values in double (exact: they are f32), printed as
 * Python prints a float (the shortest decimal that reads back as the same
 * double) and compiled as an f32 literal. Where the midpoint lies exactly
 * halfway between two floats (often: the sum of two floats of one binade
 * has 25 bits) the decimal is a hair off the midpoint, and the literal's
 * rounding follows the decimal, not round-half-even. */
static float nf4_threshold(int j) {
    const double mid = (nf4_lit[j] + nf4_lit[j + 1]) / 2;
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, mid);
        if (strtod(buf, NULL) == mid) break;
    }
    return strtof(buf, NULL);
}

/* The tie rule and the thresholds: in a block of absmax 1 the normalised
 * value is the value itself. A value on the threshold between codes j and
 * j+1 takes j (bitsandbytes' x > t); the next float up takes j+1. */
static void test_nf4_ties(void) {
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = 0.0f;
    w[0] = 1.0f;
    int off_mid = 0;
    for (int j = 0; j < 15; j++) {
        const float t = nf4_threshold(j);
        off_mid += t != (float)((nf4_lit[j] + nf4_lit[j + 1]) / 2);
        w[2 + 2 * j] = t;
        w[3 + 2 * j] = nextafterf(t, INFINITY);
    }
    w[32] = -1.0f;
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, w, 1, 64, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    CHECK(nibble(q.codes, 0) == 15 && nibble(q.codes, 1) == 7 && nibble(q.codes, 32) == 0,
          "codes of 1, 0, -1: %d %d %d", nibble(q.codes, 0), nibble(q.codes, 1),
          nibble(q.codes, 32));
    CHECK(q.codes[0] == (15 << 4 | 7), "byte 0 = 0x%02x: the first value in the high nibble",
          q.codes[0]);
    for (int j = 0; j < 15; j++) {
        CHECK(nibble(q.codes, 2 + 2 * j) == j, "threshold %d: %.9g coded %d", j,
              (double)w[2 + 2 * j], nibble(q.codes, 2 + 2 * j));
        CHECK(nibble(q.codes, 3 + 2 * j) == j + 1, "above threshold %d: %.9g coded %d", j,
              (double)w[3 + 2 * j], nibble(q.codes, 3 + 2 * j));
    }
    printf("NF4 thresholds: %d of 15 differ from the midpoint rounded half-even\n", off_mid);
    fr_quant_free(g_ctx, &q);
    /* a zero block codes 7 everywhere; with a nonzero block beside it its
     * a' is nonzero, yet its values dequantize to 0 */
    float z[130];
    for (int i = 0; i < 130; i++) z[i] = i < 64 ? 0.0f : (float)(i - 97) / 8;
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, z, 2, 65, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    float d[130];
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, 2, d) == FR_OK, "%s", fr_last_error(g_ctx));
    int zeros = 1;
    for (int i = 0; i < 64; i++) zeros &= nibble(q.codes, i) == 7 && d[i] == 0.0f;
    CHECK(zeros, "a zero block does not come back zero");
    fr_quant_free(g_ctx, &q);
}

/* ---- the GEMMs --------------------------------------------------------------- */

static float *frand(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    fr_rng r = fr_rng_make(g_seed++, 7);
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * fr_rng_next_uniform(&r);
    return p;
}

static void fill_nan(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* gamma_m = m u / (1 - m u): an f32 sum of m terms (FMAs or not, any
 * order) is within gamma_m sum |terms| of the exact sum. */
static double gamma_f32(int64_t m) { return (double)m * U32 / (1 - (double)m * U32); }

typedef struct gemm_case {
    int64_t N, O, K;
} gemm_case;

/* One shape, one format: y = x W'^T + b (+ y0), dx = dy W' (+ dx0), on 1 and
 * 2 threads, against cblas_sgemm on W' (dequantized whole, here only) and
 * the float64 product. */
static void test_gemm(fr_qfmt fmt, gemm_case g, int use_bias, int accumulate) {
    const int64_t N = g.N, O = g.O, K = g.K;
    float *w = make_weight(O, K);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, fmt, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    float *wd = malloc((size_t)(O * K) * sizeof(float));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, wd) == FR_OK, "%s", fr_last_error(g_ctx));
    float *x = frand(N * K, -1, 1), *dy = frand(N * O, -1, 1), *b = frand(O, -1, 1);
    float *y0 = frand(N * O, -1, 1), *dx0 = frand(N * K, -1, 1);
    const float *bias = use_bias ? b : NULL;

    /* cblas on the whole W' */
    float *yr = malloc((size_t)(N * O) * sizeof(float)), *dxr = malloc((size_t)(N * K) * 4);
    for (int64_t i = 0; i < N * O; i++) yr[i] = accumulate ? y0[i] : 0.0f;
    for (int64_t i = 0; i < N * K; i++) dxr[i] = accumulate ? dx0[i] : 0.0f;
    if (bias)
        for (int64_t i = 0; i < N * O; i++) yr[i] += bias[i % O];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)K, 1.0f, x, (int)K,
                wd, (int)K, 1.0f, yr, (int)O);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)K, (int)O, 1.0f, dy, (int)O,
                wd, (int)K, 1.0f, dxr, (int)K);

    float *y[3], *dx[3];
    const int threads[3] = {1, 2, 2};
    for (int r = 0; r < 3; r++) {
        fr_set_threads(g_ctx, threads[r]);
        /* run 2: two tiles of workspace; run 3: one (one thread runs) */
        const size_t wsn = fr_qgemm_ws_floats(O, K, r == 2 ? 1 : threads[r]);
        float *ws = malloc(wsn * sizeof(float));
        y[r] = malloc((size_t)(N * O) * sizeof(float));
        dx[r] = malloc((size_t)(N * K) * sizeof(float));
        if (accumulate) {
            memcpy(y[r], y0, (size_t)(N * O) * sizeof(float));
            memcpy(dx[r], dx0, (size_t)(N * K) * sizeof(float));
        } else {
            fill_nan(y[r], (size_t)(N * O));
            fill_nan(dx[r], (size_t)(N * K));
        }
        fill_nan(ws, wsn);
        CHECK(fr_qgemm(g_ctx, &q, x, N, bias, y[r], accumulate, ws, wsn) == FR_OK, "%s",
              fr_last_error(g_ctx));
        fill_nan(ws, wsn);
        CHECK(fr_qgemm_dx(g_ctx, &q, dy, N, dx[r], accumulate, ws, wsn) == FR_OK, "%s",
              fr_last_error(g_ctx));
        free(ws);
    }
    fr_set_threads(g_ctx, 2);

    long long over = 0, same_y = 0, same_dx = 0;
    const double gy = gamma_f32(K + 2), gd = gamma_f32(O + 1);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double ex = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ex += (double)x[n * K + k] * wd[o * K + k];
                mag += fabs((double)x[n * K + k] * wd[o * K + k]);
            }
            if (bias) ex += bias[o], mag += fabs(bias[o]);
            if (accumulate) ex += y0[n * O + o], mag += fabs(y0[n * O + o]);
            const double v = y[0][n * O + o], vr = yr[n * O + o];
            over += !(fabs(v - ex) <= gy * mag + 1e-12 * mag) || !(fabs(v - vr) <= 2 * gy * mag);
            same_y += v == vr;
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            double ex = 0, mag = 0;
            for (int64_t o = 0; o < O; o++) {
                ex += (double)dy[n * O + o] * wd[o * K + k];
                mag += fabs((double)dy[n * O + o] * wd[o * K + k]);
            }
            if (accumulate) ex += dx0[n * K + k], mag += fabs(dx0[n * K + k]);
            const double v = dx[0][n * K + k], vr = dxr[n * K + k];
            over += !(fabs(v - ex) <= gd * mag + 1e-12 * mag) || !(fabs(v - vr) <= 2 * gd * mag);
            same_dx += v == vr;
        }
    CHECK(over == 0, "%s (%lld,%lld,%lld) bias %d acc %d: %lld values past the f32 sum bound",
          fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, use_bias, accumulate, over);
    for (int r = 1; r < 3; r++) {
        CHECK(memcmp(y[0], y[r], (size_t)(N * O) * sizeof(float)) == 0,
              "%s (%lld,%lld,%lld): y of run %d differs from one thread's", fr_qfmt_name(fmt),
              (long long)N, (long long)O, (long long)K, r);
        CHECK(memcmp(dx[0], dx[r], (size_t)(N * K) * sizeof(float)) == 0,
              "%s (%lld,%lld,%lld): dx of run %d differs from one thread's", fr_qfmt_name(fmt),
              (long long)N, (long long)O, (long long)K, r);
    }
    printf("%s (N,O,K) = (%lld,%lld,%lld) bias %d acc %d: equal to cblas on W' in %.1f%% (y), "
           "%.1f%% (dx) of the values, all within the bound\n",
           fr_qfmt_name(fmt), (long long)N, (long long)O, (long long)K, use_bias, accumulate,
           100.0 * same_y / (double)(N * O), 100.0 * same_dx / (double)(N * K));
    for (int r = 0; r < 3; r++) free(y[r]), free(dx[r]);
    free(yr), free(dxr), free(x), free(dy), free(b), free(y0), free(dx0), free(wd), free(w);
    fr_quant_free(g_ctx, &q);
}

/* ---- sizes and bad input ----------------------------------------------------- */

static void test_sizes(void) {
    /* int8: a byte a value, an f32 scale a row */
    CHECK(fr_quant_bytes(FR_QFMT_INT8, 3, 5) == 15 + 3 * 4, "int8 (3,5)");
    /* nf4 (37,131): n = 4847 values: 2424 bytes of codes, 76 blocks (76
     * bytes), one second-level scale and the offset (8 bytes) */
    CHECK(fr_quant_bytes(FR_QFMT_NF4, 37, 131) == 2424 + 76 + 8, "nf4 (37,131): %zu",
          fr_quant_bytes(FR_QFMT_NF4, 37, 131));
    /* GPT-2's c_attn (768, 2304): n/2 + n/64 + 4 (n/64/256 + 1) */
    const size_t n = 768 * 2304;
    CHECK(fr_quant_bytes(FR_QFMT_NF4, 768, 2304) == n / 2 + n / 64 + 4 * (n / 64 / 256 + 1),
          "nf4 (768,2304): %zu", fr_quant_bytes(FR_QFMT_NF4, 768, 2304));
    CHECK(fr_quant_bytes(FR_QFMT_INT8, 0, 5) == 0 && fr_quant_bytes(FR_QFMT_NF4, 5, -1) == 0 &&
              fr_quant_bytes((fr_qfmt)9, 5, 5) == 0,
          "bad sizes");
    /* the block comes from the accounting allocator, as parameters */
    fr_mem_stats s0, s1, s2;
    fr_mem_get_stats(g_ctx, &s0);
    float *w = make_weight(37, 131);
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, w, 37, 131, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    fr_mem_get_stats(g_ctx, &s1);
    CHECK(s1.allocated[FR_MEM_PARAMS] - s0.allocated[FR_MEM_PARAMS] >= 2424 + 76 + 8 &&
              s1.allocated[FR_MEM_WORKSPACE] == s0.allocated[FR_MEM_WORKSPACE],
          "parameters +%zu, workspace %zu -> %zu",
          s1.allocated[FR_MEM_PARAMS] - s0.allocated[FR_MEM_PARAMS], s0.allocated[FR_MEM_WORKSPACE],
          s1.allocated[FR_MEM_WORKSPACE]);
    fr_quant_free(g_ctx, &q);
    fr_mem_get_stats(g_ctx, &s2);
    CHECK(s2.allocated[FR_MEM_PARAMS] == s0.allocated[FR_MEM_PARAMS],
          "the block is not given back");
    CHECK(q.block == NULL, "fr_quant_free leaves the weight zeroed");
    free(w);
}

static int says(const char *part) { return strstr(fr_last_error(g_ctx), part) != NULL; }

static void test_bad_input(void) {
    float w[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_INT8, w, 0, 12, &q) == FR_ERR_SHAPE &&
              says("quantize: a int8 weight of shape (0,12): each dimension must be 1 to"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_quantize(g_ctx, (fr_qfmt)7, w, 3, 4, &q) == FR_ERR_ARG &&
              says("quantize: unknown format 7"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, NULL, 3, 4, &q) == FR_ERR_ARG &&
              says("quantize: no weight values"),
          "%s", fr_last_error(g_ctx));
    w[6] = NAN;
    CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, w, 3, 4, &q) == FR_ERR_NUMERIC &&
              says("quantize: weight (1,2) is nan: only finite values"),
          "%s", fr_last_error(g_ctx));
    w[6] = -INFINITY;
    CHECK(fr_quantize(g_ctx, FR_QFMT_INT8, w, 3, 4, &q) == FR_ERR_NUMERIC &&
              says("weight (1,2) is -inf"),
          "%s", fr_last_error(g_ctx));
    w[6] = 7;
    /* allocation failures: the block (1), NF4's temporary absmaxes (2) */
    for (int at = 1; at <= 2; at++) {
        fr_mem_stats s0, s1;
        fr_mem_get_stats(g_ctx, &s0);
        fr_mem_fail_at(g_ctx, (uint64_t)at);
        CHECK(fr_quantize(g_ctx, FR_QFMT_NF4, w, 3, 4, &q) == FR_ERR_NOMEM &&
                  says("(injected failure)") && q.block == NULL,
              "failure %d: %s", at, fr_last_error(g_ctx));
        fr_mem_fail_at(g_ctx, 0);
        fr_mem_get_stats(g_ctx, &s1);
        CHECK(s1.allocated[FR_MEM_PARAMS] == s0.allocated[FR_MEM_PARAMS] &&
                  s1.allocated[FR_MEM_WORKSPACE] == s0.allocated[FR_MEM_WORKSPACE],
              "failure %d leaves bytes allocated", at);
    }

    CHECK(fr_quantize(g_ctx, FR_QFMT_INT8, w, 3, 4, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    float out[12], ws[4096], x[8], y[6];
    CHECK(fr_dequantize_rows(g_ctx, &q, 2, 2, out) == FR_ERR_ARG &&
              says("dequantize: rows 2 to 4 of a weight of 3 rows"),
          "%s", fr_last_error(g_ctx));
    const size_t need = fr_qgemm_ws_floats(3, 4, 1);
    CHECK(need > 0 && need <= 4096, "ws %zu", need);
    CHECK(fr_qgemm(g_ctx, &q, x, 2, NULL, y, 0, ws, need - 1) == FR_ERR_ARG &&
              says("qgemm: a workspace of") && says("floats is too small: a (3,4) int8 weight") &&
              says("(fr_qgemm_ws_floats)"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_qgemm_dx(g_ctx, &q, y, 2, x, 0, NULL, need) == FR_ERR_ARG &&
              says("qgemm_dx: a workspace of 0 floats is too small"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_qgemm(g_ctx, &q, x, -1, NULL, y, 0, ws, need) == FR_ERR_SHAPE &&
              says("qgemm: -1 rows: must be 0 to"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_qgemm(g_ctx, &q, NULL, 2, NULL, y, 0, ws, need) == FR_ERR_ARG &&
              says("qgemm: an input or output is NULL"),
          "%s", fr_last_error(g_ctx));
    CHECK(fr_qgemm(g_ctx, &q, NULL, 0, NULL, NULL, 0, ws, need) == FR_OK, "N = 0: %s",
          fr_last_error(g_ctx));
    fr_quant_free(g_ctx, &q);
    CHECK(fr_qgemm(g_ctx, &q, x, 2, NULL, y, 0, ws, need) == FR_ERR_ARG &&
              says("qgemm: no quantized weight"),
          "%s", fr_last_error(g_ctx));
    fr_qweight fake = {.fmt = (fr_qfmt)5, .O = 3, .K = 4, .block = ws};
    CHECK(fr_qgemm_dx(g_ctx, &fake, y, 2, x, 0, ws, need) == FR_ERR_ARG &&
              says("qgemm_dx: the weight (format 5, shape (3,4)) is not one fr_quantize made"),
          "%s", fr_last_error(g_ctx));
}

/* bf16: the stored values are w rounded to nearest even (by hand here, in
 * integers, for finite w), widened exactly; fr_quantize_into fills a
 * caller's block with the bytes fr_quantize makes, for every format;
 * fr_quant_view refuses a block that is not 4-byte aligned. */
static void test_bf16_into_view(void) {
    enum { O = 7, K = 45 };
    float w[O * K], out[O * K];
    fr_rng r = fr_rng_make(5, 9);
    for (int i = 0; i < O * K; i++)
        w[i] = (2.0f * fr_rng_next_uniform(&r) - 1.0f) * (i % 3 ? 1e-3f : 7.0f);
    w[3] = 0x1.0101p0f; /* above halfway: up */
    w[4] = 0x1.01p0f;   /* halfway, even below: down */
    w[5] = 0x1.03p0f;   /* halfway, odd below: up */
    fr_qweight q;
    CHECK(fr_quantize(g_ctx, FR_QFMT_BF16, w, O, K, &q) == FR_OK, "%s", fr_last_error(g_ctx));
    CHECK(fr_dequantize_rows(g_ctx, &q, 0, O, out) == FR_OK, "%s", fr_last_error(g_ctx));
    int bad = 0;
    for (int i = 0; i < O * K; i++) {
        uint32_t u;
        memcpy(&u, &w[i], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        float ref;
        memcpy(&ref, &u, 4);
        bad += memcmp(&ref, &out[i], 4) != 0;
    }
    CHECK(bad == 0, "bf16: %d values are not w rounded to nearest even", bad);
    CHECK(out[3] == 0x1.02p0f && out[4] == 1.0f && out[5] == 0x1.04p0f, "bf16 ties: %a %a %a",
          (double)out[3], (double)out[4], (double)out[5]);
    CHECK(fr_quant_bytes(FR_QFMT_BF16, O, K) == 2 * O * K, "bf16 bytes");
    fr_quant_free(g_ctx, &q);
    for (int f = 0; f < FR_QFMT_COUNT; f++) {
        const size_t n = fr_quant_bytes((fr_qfmt)f, O, K);
        float *dst = malloc(n + 8);
        fr_qweight a, b;
        CHECK(fr_quantize(g_ctx, (fr_qfmt)f, w, O, K, &a) == FR_OK &&
                  fr_quantize_into(g_ctx, (fr_qfmt)f, w, O, K, dst, &b) == FR_OK,
              "%s", fr_last_error(g_ctx));
        CHECK(!memcmp(a.block, dst, n) && b.block == dst, "%s: quantize_into's bytes differ",
              fr_qfmt_name((fr_qfmt)f));
        CHECK(fr_quant_view(g_ctx, (fr_qfmt)f, O, K, (char *)dst + 2, &b) == FR_ERR_ARG &&
                  says("not a quantized block") && b.block == NULL,
              "%s: a misaligned view: %s", fr_qfmt_name((fr_qfmt)f), fr_last_error(g_ctx));
        fr_quant_free(g_ctx, &a);
        free(dst);
    }
    CHECK(fr_quant_view(g_ctx, FR_QFMT_COUNT, O, K, w, &q) == FR_ERR_ARG, "a bad format's view");
}

int main(void) {
    g_ctx = fr_ctx_new();
    test_bf16_into_view();
    fr_set_threads(g_ctx, 2);
    test_nf4_table();
    test_dynamic_map();
    test_int8_ties();
    test_nf4_ties();
    /* odd sizes; (37,131) ends in a short NF4 block of 47 values and an odd
     * count; (300,4097) has 5 blocks of double quantization, the last short */
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {37, 131}, {64, 64}, {300, 4097}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        test_int8(shapes[i][0], shapes[i][1]);
        test_nf4(shapes[i][0], shapes[i][1]);
    }
    /* N = 1; with quant.c's tiles: two chunks of x (N > 512) and two forward
     * row tiles (K = 1500: 87 rows a tile); dx with two row tiles and three
     * column panels (O, K > 256), the last of one column */
    const gemm_case cases[] = {{1, 1, 1},       {1, 37, 131},  {3, 5, 7},
                               {530, 97, 1500}, {2, 300, 513}, {300, 290, 77}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int f = 0; f < FR_QFMT_COUNT; f++) {
            test_gemm((fr_qfmt)f, cases[i], 1, 0);
            if (i % 2) test_gemm((fr_qfmt)f, cases[i], i % 4 == 1, 1);
            else test_gemm((fr_qfmt)f, cases[i], 0, 0);
        }
    test_sizes();
    test_bad_input();
    fr_ctx_free(g_ctx);
    return check_done();
}
