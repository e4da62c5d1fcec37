/* optim_state.c — Adam/AdamW over compressed moments (fp32, bf16, int8
 * block-wise dynamic quantization), the moment buffers' byte sizes and
 * whole-buffer conversions, and the two 256-entry dynamic quantization maps
 * (built once, at first use). The f32 update arithmetic is fr_k_adam's
 * (src/backend/cpu/optim.c) restated operation for operation; the buffers
 * are the caller's. */
#include "backend/cpu/optim_state.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "core/half.h"

/* x86 only: the AVX-512 block passes (compiled with target attributes, run
 * when the CPU has AVX-512F and BW) and AVX2 clones of the plain loops (glibc
 * picks one at load time). Elsewhere the scalar code alone, which gives the
 * same bits. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STATE_X86 1
#define AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define STATE_X86 0
#define AVX2_CLONES
#endif

#define STATE_PAR_MIN 16384 /* as optim.c: below this a thread team costs more than it saves */

/* ---- the dynamic quantization maps ------------------------------------- */

/* bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7,
 * total_bits = 8). With non_sign_bits = total_bits - 1 = 7, decade
 * i = 0..6 contributes the midpoints of linspace(0.1, 1, F_i) scaled by
 * 10^(i - 6), where F_i = 2^i + 1 when signed (each midpoint also negated)
 * and 2^(i+1) + 1 when not: 2 (2^7 - 1) = 254 values either way. Then 0 and
 * 1 are appended (additional_items = 2^(7 - 7) - 1 = 0 adds nothing), which
 * makes exactly 256, and the list is sorted ascending. So the signed map
 * spans [-0.99297, 1] with 0 at index 127, the unsigned map [0, 1] with 0 at
 * index 0, and the nonzero magnitudes run from 5.5e-7 (signed) or 3.25e-7
 * (unsigned) up, about 2^(i+1) (unsigned) or 2^i (signed) codes per decade.
 *
 * Float arithmetic as torch does it: linspace is torch's scalar formula
 * (step = (1 - 0.1f) / (F - 1); start + step j for j < F/2, end - step
 * (F - 1 - j) after), the midpoint (b_j + b_j+1) / 2, the decade factor a
 * double rounded to float times the midpoint. torch's vectorised CPU
 * linspace can differ from the scalar formula in the last bit, and so
 * bitsandbytes' own map by up to 2 ulp in some entries, depending on the
 * CPU; tests/ref/dynamic_map.py dumps both for the test. */
#define MAP_TOTAL_BITS 8
#define MAP_MAX_EXP_BITS 7
#define MAP_NON_SIGN_BITS (MAP_TOTAL_BITS - 1)
_Static_assert(MAP_NON_SIGN_BITS == MAP_MAX_EXP_BITS, "the map has no additional items");

/* The nearest code from one table entry. A float's magnitude bits select a
 * bucket (exponent and the top 8 mantissa bits: under 0.4% wide, narrower
 * than the gap between adjacent codes, 0.7% or more), so at most one
 * midpoint lies inside a bucket. The bucket's 32-bit entry holds the code of
 * its smallest magnitude (bits 24-31) and the low 15 bits of the smallest
 * magnitude that crosses the midpoint (bits 0-15; 0x8000, never reached,
 * when none does): code = base + 1 for a positive y at or past it, base - 1
 * for a negative one. Magnitudes below 2^-23 (under every map's first
 * midpoint, 1.6e-7) share entry 0, the zero's code; |y| <= 1 ends at the
 * bucket of 1.0. One gather and a compare per 16 values, no walk; the scalar
 * encoder reads the same entry. (int8 Adam, one thread, 4M parameters: a
 * byte table of first guesses and a walk up the thresholds, a gather a step,
 * 3.5 ns a parameter; this table, 2.8.)
 * Both signs have their own half, positive first. */
#define BKT_SHIFT 15                         /* magnitude bits >> 15: exponent, 8 mantissa bits */
#define BKT_FIRST (0x34000000u >> BKT_SHIFT) /* 2^-23 */
#define BKT_LAST (0x3F800000u >> BKT_SHIFT)  /* 1.0 */
#define BKT_HALF (BKT_LAST - BKT_FIRST + 2)  /* entry 0 below 2^-23, then one per bucket */
#define BKT_NONE 0x8000u

typedef struct dyn_map {
    float val[256];  /* ascending */
    double mid[256]; /* mid[k] = (val[k] + val[k+1]) / 2, exact in double; mid[255] = +inf */
    float thr[256];  /* the smallest float above mid[k]: y > mid[k] exactly when y >= thr[k] */
    uint8_t zero;    /* the index of the value 0 */
    uint32_t bucket[2 * BKT_HALF];
} dyn_map;

/* Whether every bucket holds at most one midpoint (checked as the tables are
 * built; true for these maps): otherwise encoders use the binary search. */
static int bucket_ok;

static dyn_map map_tables[2]; /* [0] unsigned (second moment), [1] signed (first moment) */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static void linspace_01(int steps, float *b) {
    const float start = 0.1f, end = 1.0f;
    const float step = (end - start) / (float)(steps - 1);
    const int half = steps / 2;
    for (int j = 0; j < steps; j++)
        b[j] = j < half ? start + step * (float)j : end - step * (float)(steps - j - 1);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void build_map(int is_signed, dyn_map *d) {
    static const double decade[MAP_MAX_EXP_BITS] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    float vals[256], b[(1 << MAP_NON_SIGN_BITS) + 1];
    int cnt = 0;
    for (int i = 0; i < MAP_MAX_EXP_BITS; i++) {
        const int shift = i + MAP_NON_SIGN_BITS - MAP_MAX_EXP_BITS + (is_signed ? 0 : 1);
        const int items = (1 << shift) + 1;
        const float scale = (float)decade[i];
        linspace_01(items, b);
        for (int j = 0; j + 1 < items; j++) {
            const float x = scale * ((b[j] + b[j + 1]) / 2.0f);
            vals[cnt++] = x;
            if (is_signed) vals[cnt++] = -x;
        }
    }
    vals[cnt++] = 0.0f;
    vals[cnt++] = 1.0f;
    while (cnt < 256) vals[cnt++] = 0.0f; /* never taken with these parameters */
    qsort(vals, 256, sizeof vals[0], cmp_float);

    memcpy(d->val, vals, sizeof vals);
    for (int k = 0; k < 255; k++) d->mid[k] = ((double)vals[k] + (double)vals[k + 1]) / 2.0;
    d->mid[255] = INFINITY;
    for (int k = 0; k < 256; k++) {
        float t = (float)d->mid[k];
        if ((double)t <= d->mid[k]) t = nextafterf(t, INFINITY);
        d->thr[k] = t;
    }
    d->zero = 0;
    for (int k = 0; k < 256; k++)
        if (vals[k] == 0.0f) {
            d->zero = (uint8_t)k;
            break;
        }
}

static uint8_t nearest_code_search(const dyn_map *d, float y);

static float from_bits(uint32_t u) {
    float y;
    memcpy(&y, &u, sizeof y);
    return y;
}

/* One bucket's entry (see BKT_SHIFT): the code at its smallest magnitude and
 * where, if anywhere, the code moves by one; 0 if it moves by more. */
static int bucket_entry(const dyn_map *d, uint32_t lo, uint32_t hi, uint32_t sign,
                        uint32_t *entry) {
    const unsigned c0 = nearest_code_search(d, from_bits(lo | sign));
    const unsigned c1 = nearest_code_search(d, from_bits(hi | sign));
    uint32_t t = BKT_NONE;
    if (c1 != c0) {
        if ((sign ? c0 - c1 : c1 - c0) != 1) return 0;
        uint32_t a = lo, b = hi; /* the first magnitude whose code is c1: in (a, b] */
        while (b - a > 1) {
            const uint32_t mid = a + (b - a) / 2;
            if (nearest_code_search(d, from_bits(mid | sign)) == c1) b = mid;
            else a = mid;
        }
        t = b & 0x7FFFu;
    }
    *entry = (uint32_t)c0 << 24 | t;
    return 1;
}

static int build_buckets(dyn_map *d) {
    for (uint32_t s = 0; s < 2; s++) {
        uint32_t *half = d->bucket + s * BKT_HALF, sign = s << 31;
        /* below 2^-23: the code of zero, which no value there leaves */
        if (!bucket_entry(d, 0, (BKT_FIRST << BKT_SHIFT) - 1, sign, &half[0]) ||
            (half[0] & 0xFFFFu) != BKT_NONE)
            return 0;
        for (uint32_t h = BKT_FIRST; h <= BKT_LAST; h++) {
            const uint32_t lo = h << BKT_SHIFT, hi = lo | ((1u << BKT_SHIFT) - 1);
            if (!bucket_entry(d, lo, hi, sign, &half[h - BKT_FIRST + 1])) return 0;
        }
    }
    return 1;
}

static void build_maps(void) {
    build_map(0, &map_tables[0]);
    build_map(1, &map_tables[1]);
    bucket_ok = build_buckets(&map_tables[0]) && build_buckets(&map_tables[1]);
}

static const dyn_map *dynamic_map(int is_signed) {
    pthread_once(&map_once, build_maps);
    return &map_tables[is_signed ? 1 : 0];
}

/* The code of the entry nearest y: the number of midpoints below y, found by
 * an 8-step binary search; y on a midpoint goes to the lower entry. Adjacent
 * entries are within a factor of about 1.1 of each other or one is 0, so
 * their midpoint is exact in double and the comparison is exact. */
static uint8_t nearest_code_search(const dyn_map *d, float y) {
    const double yd = y;
    unsigned k = 0;
    for (unsigned s = 128; s; s >>= 1)
        if (d->mid[k + s - 1] < yd) k += s;
    return (uint8_t)k;
}

/* The same answer from the bucket table (see BKT_SHIFT). */
static inline uint8_t nearest_code(const dyn_map *d, float y) {
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    const uint32_t mag = bits & 0x7FFFFFFFu, sign = bits >> 31, h = mag >> BKT_SHIFT;
    const uint32_t i = h < BKT_FIRST ? 0 : (h > BKT_LAST ? BKT_LAST : h) - BKT_FIRST + 1;
    const uint32_t e = d->bucket[sign * BKT_HALF + i];
    const unsigned cross = (mag & 0x7FFFu) >= (e & 0xFFFFu); /* never in entry 0 */
    return (uint8_t)((e >> 24) + (sign ? -cross : cross));
}

/* ---- int8 blocks -------------------------------------------------------- */

#if STATE_X86
/* nearest_code for 16 values at a time where the CPU has AVX-512: the same
 * division and bucket entry, one gather. Returns how many leading values it
 * coded (a multiple of 16). */
__attribute__((target("avx512f,avx512bw"))) static size_t
nearest_codes_avx512(const float *x, size_t cnt, float amax, const dyn_map *d, uint8_t *codes) {
    const __m512 vam = _mm512_set1_ps(amax);
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF), low = _mm512_set1_epi32(0x7FFF),
                  tmask = _mm512_set1_epi32(0xFFFF), one = _mm512_set1_epi32(1),
                  first = _mm512_set1_epi32(BKT_FIRST - 1),
                  last = _mm512_set1_epi32(BKT_LAST - BKT_FIRST + 1),
                  half = _mm512_set1_epi32(BKT_HALF), zero = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 16 <= cnt; i += 16) {
        const __m512i bits = _mm512_castps_si512(_mm512_div_ps(_mm512_loadu_ps(x + i), vam));
        const __m512i mag = _mm512_and_si512(bits, absm);
        const __mmask16 neg = _mm512_cmplt_epi32_mask(bits, zero);
        __m512i idx = _mm512_sub_epi32(_mm512_srli_epi32(mag, BKT_SHIFT), first);
        idx = _mm512_min_epi32(_mm512_max_epi32(idx, zero), last);
        idx = _mm512_mask_add_epi32(idx, neg, idx, half);
        const __m512i e = _mm512_i32gather_epi32(idx, d->bucket, 4);
        const __mmask16 cross =
            _mm512_cmpge_epi32_mask(_mm512_and_si512(mag, low), _mm512_and_si512(e, tmask));
        __m512i k = _mm512_srli_epi32(e, 24);
        k = _mm512_mask_add_epi32(k, cross & (__mmask16)~neg, k, one);
        k = _mm512_mask_sub_epi32(k, cross & neg, k, one);
        _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(k));
    }
    return i;
}
#endif

/* Whether this CPU runs the AVX-512 paths (asked once); tests may turn
 * them off to check the scalar paths. */
static int avx512_off;
static int have_avx512(void) {
    static int known = -1;
    int h = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (h < 0) {
#if STATE_X86
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
        h = 0;
#endif
        __atomic_store_n(&known, h, __ATOMIC_RELAXED);
    }
    return h && !__atomic_load_n(&avx512_off, __ATOMIC_RELAXED);
}

int fr_state_bucket_table(void) {
    dynamic_map(0);
    return bucket_ok;
}

int fr_state_simd(int on) {
    __atomic_store_n(&avx512_off, !on, __ATOMIC_RELAXED);
    return have_avx512();
}

/* encode_block's second half, given the block's largest magnitude amax and
 * whether it holds an inf or NaN (bad): its absmax and codes. */
static void encode_known(const float *x, size_t cnt, float amax, int bad, const dyn_map *d,
                         uint8_t *codes, float *absmax) {
    if (bad || amax == 0.0f) {
        *absmax = bad ? NAN : 0.0f;
        memset(codes, d->zero, cnt);
        return;
    }
    *absmax = amax;
    size_t i = 0;
    if (!bucket_ok) {
        for (; i < cnt; i++) codes[i] = nearest_code_search(d, x[i] / amax);
        return;
    }
#if STATE_X86
    if (have_avx512()) i = nearest_codes_avx512(x, cnt, amax, d, codes);
#endif
    for (; i < cnt; i++) codes[i] = nearest_code(d, x[i] / amax);
}

/* One block of cnt <= FR_STATE_INT8_BLOCK elements.
 * encode: absmax = max_i |x_i|; code_i = nearest(x_i / absmax). A block of
 *         zeros gets absmax 0 (and the zero code); a block holding a NaN or
 *         an infinity gets absmax NaN, so the fault stays visible.
 * decode: x_i = map[code_i] * absmax; absmax 0 gives +0 whatever the codes. */
AVX2_CLONES static void encode_block(const float *x, size_t cnt, const dyn_map *d, uint8_t *codes,
                                     float *absmax) {
    /* absmax in 8 independent lanes (no branches; the max of finite values
     * does not depend on the order), and whether any value is inf or NaN */
    float lane[8] = {0};
    int bad = 0;
    size_t i8 = 0;
    for (; i8 + 8 <= cnt; i8 += 8)
        for (int j = 0; j < 8; j++) {
            const float a = fabsf(x[i8 + j]);
            bad |= !(a <= FLT_MAX);
            lane[j] = a > lane[j] ? a : lane[j];
        }
    for (; i8 < cnt; i8++) {
        const float a = fabsf(x[i8]);
        bad |= !(a <= FLT_MAX);
        lane[0] = a > lane[0] ? a : lane[0];
    }
    float amax = 0.0f;
    for (int j = 0; j < 8; j++) amax = lane[j] > amax ? lane[j] : amax;
    encode_known(x, cnt, amax, bad, d, codes, absmax);
}

AVX2_CLONES static void decode_block(const uint8_t *codes, float absmax, size_t cnt,
                                     const dyn_map *d, float *x) {
    if (absmax == 0.0f) {
        for (size_t i = 0; i < cnt; i++) x[i] = 0.0f;
        return;
    }
    for (size_t i = 0; i < cnt; i++) x[i] = d->val[codes[i]] * absmax;
}

static size_t int8_blocks(size_t n) { return (n + FR_STATE_INT8_BLOCK - 1) / FR_STATE_INT8_BLOCK; }
static size_t int8_codes_bytes(size_t n) { return (n + 3) & ~(size_t)3; }

/* ---- kinds, sizes, names ------------------------------------------------ */

static const char *const kind_names[] = {"fp32", "bf16", "int8"};
_Static_assert(sizeof kind_names / sizeof kind_names[0] == FR_STATE_KIND_COUNT,
               "one name per state kind");

fr_state_kind fr_state_kind_for(fr_state_kind requested, size_t n) {
    return requested == FR_STATE_INT8 && n < FR_STATE_INT8_MIN ? FR_STATE_F32 : requested;
}

size_t fr_state_bytes(fr_state_kind k, size_t n) {
    switch (k) {
    case FR_STATE_F32: return n * sizeof(float);
    case FR_STATE_BF16: return n * sizeof(uint16_t);
    case FR_STATE_INT8: return int8_codes_bytes(n) + int8_blocks(n) * sizeof(float);
    }
    return 0;
}

const char *fr_state_kind_name(fr_state_kind k) {
    return (unsigned)k < FR_STATE_KIND_COUNT ? kind_names[k] : NULL;
}

fr_status fr_state_kind_parse(const char *s, fr_state_kind *out) {
    if (!s) return FR_ERR_ARG;
    for (int k = 0; k < FR_STATE_KIND_COUNT; k++) {
        const char *a = s, *b = kind_names[k];
        while (*a && *b && tolower((unsigned char)*a) == *b) a++, b++;
        if (!*a && !*b) {
            if (out) *out = (fr_state_kind)k;
            return FR_OK;
        }
    }
    return FR_ERR_ARG;
}

/* ---- whole buffers ------------------------------------------------------ */

void fr_state_decode(const void *buf, fr_state_kind k, size_t n, int is_signed, float *out) {
    if (n == 0) return;
    if (k == FR_STATE_F32) {
        memcpy(out, buf, n * sizeof(float));
        return;
    }
    if (k == FR_STATE_BF16) {
        fr_bf16_to_f32_n(buf, out, n);
        return;
    }
    if (k != FR_STATE_INT8) return;
    const dyn_map *d = dynamic_map(is_signed);
    const uint8_t *codes = buf;
    const float *absmax = (const float *)(codes + int8_codes_bytes(n));
    const int64_t nb = (int64_t)int8_blocks(n);
#pragma omp parallel for schedule(static) if (n >= STATE_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const size_t lo = (size_t)b * FR_STATE_INT8_BLOCK;
        const size_t cnt = n - lo < FR_STATE_INT8_BLOCK ? n - lo : FR_STATE_INT8_BLOCK;
        decode_block(codes + lo, absmax[b], cnt, d, out + lo);
    }
}

void fr_state_encode(const float *in, fr_state_kind k, size_t n, int is_signed, void *buf) {
    if (n == 0) return;
    if (k == FR_STATE_F32) {
        memcpy(buf, in, n * sizeof(float));
        return;
    }
    if (k == FR_STATE_BF16) {
        fr_f32_to_bf16_n(in, buf, n);
        return;
    }
    if (k != FR_STATE_INT8) return;
    const dyn_map *d = dynamic_map(is_signed);
    uint8_t *codes = buf;
    float *absmax = (float *)(codes + int8_codes_bytes(n));
    /* zero the padding, so that equal states are equal bytes */
    memset(codes + n, 0, int8_codes_bytes(n) - n);
    const int64_t nb = (int64_t)int8_blocks(n);
#pragma omp parallel for schedule(static) if (n >= STATE_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const size_t lo = (size_t)b * FR_STATE_INT8_BLOCK;
        const size_t cnt = n - lo < FR_STATE_INT8_BLOCK ? n - lo : FR_STATE_INT8_BLOCK;
        encode_block(in + lo, cnt, d, codes + lo, absmax + b);
    }
}

/* ---- the update --------------------------------------------------------- */

/* p, g: f32 (n); m, v: uint16_t (n) bf16. Elementwise: decode, update, round
 * to nearest even. */
/* Chunks of BF16_CHUNK: the moments are widened with the array conversions
 * (8 at a time), updated, and rounded back; element for element the same
 * operations as before. */
#define BF16_CHUNK 1024

static void adam_bf16(float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                      const fr_adam_consts *c) {
    const int64_t chunks = (int64_t)((n + BF16_CHUNK - 1) / BF16_CHUNK);
#pragma omp parallel for schedule(static) if (n >= STATE_PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        float mb[BF16_CHUNK], vb[BF16_CHUNK];
        const size_t lo = (size_t)k * BF16_CHUNK, cnt = n - lo < BF16_CHUNK ? n - lo : BF16_CHUNK;
        fr_bf16_to_f32_n_seq(m + lo, mb, cnt);
        fr_bf16_to_f32_n_seq(v + lo, vb, cnt);
#pragma omp simd
        for (size_t j = 0; j < cnt; j++) fr_adam_elem(c, &p[lo + j], g[lo + j], &mb[j], &vb[j]);
        fr_f32_to_bf16_n_seq(mb, m + lo, cnt);
        fr_f32_to_bf16_n_seq(vb, v + lo, cnt);
    }
}

/* p, g: f32 (n); m, v: int8 layout (codes (n), pad, absmax (ceil(n/2048))).
 * Block by block, each block wholly one thread's: decode m (signed map) and
 * v (unsigned map) into f32 scratch, update every element, then take the
 * block's new absmax and re-encode. The result does not depend on the
 * thread count. */
/* The update of one decoded block, in 8-wide lanes with one-instruction
 * fmaf where the CPU has AVX2 and FMA (the same IEEE operations either way:
 * the same bits). */
FR_V3_CLONES static void update_block(const fr_adam_consts *c, float *p, const float *g, float *mb,
                                      float *vb, size_t cnt) {
    const fr_adam_consts cl = *c;
#pragma omp simd
    for (size_t j = 0; j < cnt; j++) fr_adam_elem(&cl, &p[j], g[j], &mb[j], &vb[j]);
}

#if STATE_X86
/* One whole int8 block with AVX-512: decode_block, update_block and
 * encode_block's absmax in one pass, 16 values at a time, then the codes.
 * The same IEEE operations in the same order, value for value (max of the
 * magnitudes as encode_block takes it: a NaN never replaces the running
 * maximum; it is flagged instead), so the same bits. */
__attribute__((target("avx512f,avx512bw"))) static void
adam_block_avx512(const fr_adam_consts *c, float *p, const float *g, uint8_t *mc, float *mabs,
                  uint8_t *vc, float *vabs, const dyn_map *ms, const dyn_map *vs) {
    enum { B = FR_STATE_INT8_BLOCK };
    float mb[B], vb[B];
    const int mzero = *mabs == 0.0f, vzero = *vabs == 0.0f;
    const __m512 am = _mm512_set1_ps(*mabs), av = _mm512_set1_ps(*vabs);
    const __m512 b1 = _mm512_set1_ps(c->b1), b2 = _mm512_set1_ps(c->b2);
    const __m512 omb1 = _mm512_set1_ps(c->one_minus_b1), omb2 = _mm512_set1_ps(c->one_minus_b2);
    const __m512 bc2 = _mm512_set1_ps(c->bc2_sqrt), eps = _mm512_set1_ps(c->eps);
    const __m512 nss = _mm512_set1_ps(c->neg_step_size), wd = _mm512_set1_ps(c->wd);
    const __m512 shrink = _mm512_set1_ps(c->shrink), fmax = _mm512_set1_ps(FLT_MAX);
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    __m512 mmax = _mm512_setzero_ps(), vmax = _mm512_setzero_ps();
    __mmask16 mbad = 0, vbad = 0;
    for (int i = 0; i < B; i += 16) {
        __m512 m = _mm512_setzero_ps(), v = _mm512_setzero_ps();
        if (!mzero)
            m = _mm512_mul_ps(
                _mm512_i32gather_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mc + i))), ms->val, 4),
                am);
        if (!vzero)
            v = _mm512_mul_ps(
                _mm512_i32gather_ps(
                    _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(vc + i))), vs->val, 4),
                av);
        __m512 gi = _mm512_loadu_ps(g + i), pi = _mm512_loadu_ps(p + i);
        if (c->l2) gi = _mm512_fmadd_ps(pi, wd, gi);
        if (c->dec) pi = _mm512_mul_ps(pi, shrink);
        const __m512 mi = _mm512_fmadd_ps(gi, omb1, _mm512_mul_ps(m, b1));
        const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(omb2, gi), gi, _mm512_mul_ps(v, b2));
        const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
        _mm512_storeu_ps(p + i, _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(nss, mi), denom)));
        _mm512_storeu_ps(mb + i, mi);
        _mm512_storeu_ps(vb + i, vi);
        const __m512 ma = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(mi), absm));
        const __m512 va = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(vi), absm));
        mbad |= _mm512_cmp_ps_mask(ma, fmax, _CMP_NLE_UQ); /* !(a <= FLT_MAX): inf or NaN */
        vbad |= _mm512_cmp_ps_mask(va, fmax, _CMP_NLE_UQ);
        mmax = _mm512_max_ps(ma, mmax); /* a > max ? a : max */
        vmax = _mm512_max_ps(va, vmax);
    }
    encode_known(mb, B, _mm512_reduce_max_ps(mmax), mbad != 0, ms, mc, mabs);
    encode_known(vb, B, _mm512_reduce_max_ps(vmax), vbad != 0, vs, vc, vabs);
}
#endif

static void adam_int8(float *p, const float *g, uint8_t *m, uint8_t *v, size_t n,
                      const fr_adam_consts *c) {
    const dyn_map *ms = dynamic_map(1), *vs = dynamic_map(0);
    float *m_absmax = (float *)(m + int8_codes_bytes(n));
    float *v_absmax = (float *)(v + int8_codes_bytes(n));
    const int64_t nb = (int64_t)int8_blocks(n);
#if STATE_X86
    const int fused = bucket_ok && have_avx512();
#endif
#pragma omp parallel for schedule(static) if (n >= STATE_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        float mb[FR_STATE_INT8_BLOCK], vb[FR_STATE_INT8_BLOCK];
        const size_t lo = (size_t)b * FR_STATE_INT8_BLOCK;
        const size_t cnt = n - lo < FR_STATE_INT8_BLOCK ? n - lo : FR_STATE_INT8_BLOCK;
#if STATE_X86
        if (fused && cnt == FR_STATE_INT8_BLOCK) {
            adam_block_avx512(c, p + lo, g + lo, m + lo, &m_absmax[b], v + lo, &v_absmax[b], ms,
                              vs);
            continue;
        }
#endif
        decode_block(m + lo, m_absmax[b], cnt, ms, mb);
        decode_block(v + lo, v_absmax[b], cnt, vs, vb);
        update_block(c, p + lo, g + lo, mb, vb, cnt);
        encode_block(mb, cnt, ms, m + lo, &m_absmax[b]);
        encode_block(vb, cnt, vs, v + lo, &v_absmax[b]);
    }
}

/* Pure half precision: weights and both moments stored in 16 bits (f16 or
 * bf16), the update in f32 with fr_k_adam's operations, the results rounded
 * back: one pass over chunks, widening and narrowing 8 at a time. */
void fr_k_adam_half(uint16_t *p, const void *g, int g_half, uint16_t *m, uint16_t *v, size_t n,
                    const fr_optim_opts *o, int64_t step, int decoupled, int is_f16) {
    if (n == 0) return;
    const fr_adam_consts c = fr_adam_setup(o, step, decoupled);
    const int64_t chunks = (int64_t)((n + BF16_CHUNK - 1) / BF16_CHUNK);
#pragma omp parallel for schedule(static) if (n >= STATE_PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        float pb[BF16_CHUNK], mb[BF16_CHUNK], vb[BF16_CHUNK], gb[BF16_CHUNK];
        const size_t lo = (size_t)k * BF16_CHUNK, cnt = n - lo < BF16_CHUNK ? n - lo : BF16_CHUNK;
        fr_half_to_f32_n_seq(p + lo, pb, cnt, is_f16);
        fr_half_to_f32_n_seq(m + lo, mb, cnt, is_f16);
        fr_half_to_f32_n_seq(v + lo, vb, cnt, is_f16);
        const float *gp = (const float *)g + lo;
        if (g_half) {
            fr_half_to_f32_n_seq((const uint16_t *)g + lo, gb, cnt, is_f16);
            gp = gb;
        }
        const fr_adam_consts cl = c; /* a private copy: its branches then vectorize */
#pragma omp simd
        for (size_t j = 0; j < cnt; j++) fr_adam_elem(&cl, &pb[j], gp[j], &mb[j], &vb[j]);
        fr_f32_to_half_n_seq(pb, p + lo, cnt, is_f16);
        fr_f32_to_half_n_seq(mb, m + lo, cnt, is_f16);
        fr_f32_to_half_n_seq(vb, v + lo, cnt, is_f16);
    }
}

void fr_k_adam_state(float *p, const float *g, void *m, void *v, size_t n, const fr_optim_opts *o,
                     int64_t step, int decoupled, fr_state_kind k) {
    if (n == 0) return;
    if (k == FR_STATE_F32) {
        fr_k_adam(p, g, m, v, n, o, step, decoupled);
        return;
    }
    const fr_adam_consts c = fr_adam_setup(o, step, decoupled);
    if (k == FR_STATE_BF16) adam_bf16(p, g, m, v, n, &c);
    else if (k == FR_STATE_INT8) adam_int8(p, g, m, v, n, &c);
}
