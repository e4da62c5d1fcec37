/* half.c — f32 <-> f16 (IEEE binary16) and f32 <-> bf16 conversions by bit
 * manipulation alone (no _Float16, no FPU rounding modes): round to nearest,
 * ties to even; subnormals kept; values that round past the largest finite
 * value become infinity; a NaN stays a NaN of the same sign with its quiet
 * bit set and the top of its payload kept. It owns nothing else: where
 * 16-bit storage is used is the planner's and the kernels' business. */
#include "core/half.h"

#include <omp.h>
#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_f32(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* f32 fields: sign 1, exponent 8 (bias 127), mantissa 23.
 * f16 fields: sign 1, exponent 5 (bias 15),  mantissa 10.
 * Rebiasing an exponent from f16 to f32 adds 127 - 15 = 112. */
uint16_t fr_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) { /* inf or NaN */
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu); /* quiet, payload top */
    }
    /* 65520 = 0x477ff000 is the midpoint between the largest f16 (65504) and
     * 2^16, the next value were the exponent unbounded; it ties to the even
     * side, 2^16, which overflows. Everything at or above it is infinity. */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;

    if (ax < 0x38800000u) { /* below 2^-14: an f16 subnormal or zero */
        /* At or below 2^-25 (= 0x33000000, half the smallest subnormal; the
         * tie goes to the even 0) everything rounds to zero. */
        if (ax <= 0x33000000u) return sign;
        /* The value is mant * 2^(e - 150) with the implicit bit restored;
         * in units of the smallest subnormal 2^-24 that is mant >> (126 - e),
         * a shift of 14 (e = 112) to 24 (e = 102). */
        uint32_t e = ax >> 23;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++; /* may carry into 2^-14: right */
        return sign | (uint16_t)q;
    }

    /* Normal: rebias the exponent and drop 13 mantissa bits, rounding; a
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t h = (ax - 0x38000000u) >> 13; /* 0x38000000 = 112 << 23 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float fr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    uint32_t x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
    } else if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* m * 2^-24: normalise so the leading bit lands on bit 10 */
            uint32_t sh = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                sh++;
            }
            x = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return bits_f32(x);
}

/* bf16 is the top half of an f32: same exponent, 7 mantissa bits, so f32
 * subnormals round like any other value and the overflow to infinity comes
 * from the carry out of the largest exponent. */
uint16_t fr_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: never round it (it could become inf) */
        return (uint16_t)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float fr_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u; /* quiet a signalling NaN */
    return bits_f32(x);
}

#define FR_HALF_PAR_MIN 65536 /* below this a thread team costs more than it saves */

/* Array conversions. On x86-64 with F16C and AVX2 (checked at run time) 8
 * values go at a time: F16C's VCVTPS2PH rounds to nearest even with
 * subnormals and overflow exactly as the scalar code; bf16 rounding is the
 * same integer arithmetic on 8 lanes. A group holding a NaN goes through the
 * scalar code so NaN payloads come out bit for bit the same. The rest of an
 * array (n % 8) is scalar too. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <pthread.h>
#include <immintrin.h>
#define FR_HALF_SIMD 1

/* AVX2 and F16C, and an OS that saves the YMM registers (CPUID + XGETBV;
 * clang 14 has no __builtin_cpu_supports("f16c")). Asked once: CPUID traps
 * to the hypervisor in a virtual machine. */
static int simd_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int f16c = (c >> 29) & 1, avx = (c >> 28) & 1, osxsave = (c >> 27) & 1;
    if (!f16c || !avx || !osxsave) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return 0; /* XMM and YMM state enabled */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1; /* AVX2 */
}

static pthread_once_t simd_once = PTHREAD_ONCE_INIT;
static int simd_have; /* written once, under simd_once */
static void simd_init(void) { simd_have = simd_probe(); }
static int simd_ok(void) {
    pthread_once(&simd_once, simd_init);
    return simd_have;
}

__attribute__((target("avx2,f16c"))) static void f32_to_f16_8(const float *s, uint16_t *d) {
    __m256 x = _mm256_loadu_ps(s);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) {
        for (int k = 0; k < 8; k++) d[k] = fr_f32_to_f16(s[k]);
        return;
    }
    _mm_storeu_si128((__m128i *)d, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_8(const uint16_t *s, float *d) {
    __m128i h = _mm_loadu_si128((const __m128i *)s);
    __m128i mag = _mm_and_si128(h, _mm_set1_epi16(0x7fff));
    if (_mm_movemask_epi8(_mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7c00)))) { /* a NaN */
        for (int k = 0; k < 8; k++) d[k] = fr_f16_to_f32(s[k]);
        return;
    }
    _mm256_storeu_ps(d, _mm256_cvtph_ps(h));
}

__attribute__((target("avx2"))) static void f32_to_bf16_8(const float *s, uint16_t *d) {
    __m256i x = _mm256_loadu_si256((const __m256i *)s);
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
    r = _mm256_blendv_epi8(r, q, nan);
    _mm_storeu_si128((__m128i *)d,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

__attribute__((target("avx2"))) static void bf16_to_f32_8(const uint16_t *s, float *d) {
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16);
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    x = _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000))); /* quiet it */
    _mm256_storeu_si256((__m256i *)d, x);
}
/* AVX-512 (F and BW, and the OS saving the opmask and ZMM state): bf16
 * goes 16 values at a time, the same integer arithmetic on 16 lanes. */
static int simd512_probe(void) {
    unsigned a, b, c, d;
    if (!simd_ok()) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6u) != 0xe6u) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return ((b >> 16) & 1) && ((b >> 30) & 1); /* AVX512F, AVX512BW */
}
/* AVX512_BF16 (CPUID leaf 7, subleaf 1, EAX bit 5), asked with the probe above */
static int bf16cvt_probe(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
}
static pthread_once_t simd512_once = PTHREAD_ONCE_INIT;
static int simd512_have, bf16cvt_have; /* written once, under simd512_once */
static void simd512_init(void) {
    simd512_have = simd512_probe();
    bf16cvt_have = simd512_have && bf16cvt_probe();
}
static int simd512_ok(void) {
    pthread_once(&simd512_once, simd512_init);
    return simd512_have;
}
static int bf16cvt_ok(void) {
    pthread_once(&simd512_once, simd512_init);
    return bf16cvt_have;
}

__attribute__((target("avx512f,avx512bw"))) static void f32_to_bf16_16(const float *s,
                                                                       uint16_t *d) {
    const __m512i x = _mm512_loadu_si512((const void *)s);
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x0040));
    r = _mm512_mask_blend_epi32(nan, r, q);
    _mm256_storeu_si256((__m256i *)d, _mm512_cvtepi32_epi16(r));
}

__attribute__((target("avx512f,avx512bw"))) static void bf16_to_f32_16(const uint16_t *s,
                                                                       float *d) {
    __m512i x =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16);
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    x = _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x400000)); /* quiet it */
    _mm512_storeu_si512((void *)d, x);
}

/* the loops over groups of 8 carry the target too, so the groups inline */
#define FR_HALF_LOOP(loop, group, T_IN, T_OUT, tgt)                                         \
    __attribute__((target(tgt))) static void loop(const T_IN *s, T_OUT *d, size_t groups) { \
        for (size_t g = 0; g < groups; g++) group(s + 8 * g, d + 8 * g);                    \
    }
FR_HALF_LOOP(f32_to_f16_loop, f32_to_f16_8, float, uint16_t, "avx2,f16c")
FR_HALF_LOOP(f16_to_f32_loop, f16_to_f32_8, uint16_t, float, "avx2,f16c")
FR_HALF_LOOP(f32_to_bf16_loop8, f32_to_bf16_8, float, uint16_t, "avx2")
FR_HALF_LOOP(bf16_to_f32_loop8, bf16_to_f32_8, uint16_t, float, "avx2")

/* bf16: pairs of groups of 8 as groups of 16 where AVX-512 runs, the rest
 * (and everything elsewhere) 8 at a time; the same bits either way */
#define FR_HALF_LOOP16(loop, loop8, group16, T_IN, T_OUT)                                     \
    __attribute__((target("avx512f,avx512bw"))) static void loop##16(const T_IN *s, T_OUT *d, \
                                                                     size_t n) {              \
        for (size_t g = 0; g < n; g++) group16(s + 16 * g, d + 16 * g);                       \
    }                                                                                         \
    static void loop(const T_IN *s, T_OUT *d, size_t groups) {                                \
        size_t pairs = simd512_ok() ? groups / 2 : 0;                                         \
        if (pairs) loop##16(s, d, pairs);                                                     \
        if (groups > 2 * pairs) loop8(s + 16 * pairs, d + 16 * pairs, groups - 2 * pairs);    \
    }
FR_HALF_LOOP16(f32_to_bf16_loop_int, f32_to_bf16_loop8, f32_to_bf16_16, float, uint16_t)

/* VCVTNEPS2BF16 rounds to nearest even and makes a NaN its top 16 bits
 * with the quiet bit set, as the integer arithmetic does, but reads an f32
 * subnormal as zero (DAZ): 16 values a time by it, and a group holding a
 * subnormal by the integer code, so that every bit is the same. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void
f32_to_bf16_cvt(const float *s, uint16_t *d, size_t n) {
    const __m512i expo = _mm512_set1_epi32(0x7f800000), mant = _mm512_set1_epi32(0x007fffff);
    for (size_t g = 0; g < n; g++) {
        const __m512i x = _mm512_loadu_si512((const void *)(s + 16 * g));
        if (_mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(x, expo), x, mant))
            f32_to_bf16_16(s + 16 * g, d + 16 * g);
        else
            _mm256_storeu_si256((__m256i *)(d + 16 * g),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(x)));
    }
}

/* groups of 8 values: pairs by VCVTNEPS2BF16 where the CPU has it */
static void f32_to_bf16_loop(const float *s, uint16_t *d, size_t groups) {
    size_t pairs = bf16cvt_ok() ? groups / 2 : 0;
    if (pairs) f32_to_bf16_cvt(s, d, pairs);
    if (groups > 2 * pairs)
        f32_to_bf16_loop_int(s + 16 * pairs, d + 16 * pairs, groups - 2 * pairs);
}
FR_HALF_LOOP16(bf16_to_f32_loop, bf16_to_f32_loop8, bf16_to_f32_16, uint16_t, float)
#else
#define FR_HALF_SIMD 0
#endif

/* Convert n values: 8 at a time where the CPU allows, the rest one by one;
 * name runs on the thread team for large arrays, name##_seq on the calling
 * thread only (for kernels that are already inside a parallel loop). */
#define FR_HALF_ARRAY(name, T_IN, T_OUT, scalar, loop)                                   \
    void name##_seq(const T_IN *src, T_OUT *dst, size_t n) {                             \
        size_t groups = FR_HALF_SIMD && simd_ok() ? n / 8 : 0;                           \
        if (groups) loop(src, dst, groups);                                              \
        for (size_t i = 8 * groups; i < n; i++) dst[i] = scalar(src[i]);                 \
    }                                                                                    \
    void name(const T_IN *src, T_OUT *dst, size_t n) {                                   \
        if (n < FR_HALF_PAR_MIN) {                                                       \
            name##_seq(src, dst, n);                                                     \
            return;                                                                      \
        }                                                                                \
        size_t groups = FR_HALF_SIMD && simd_ok() ? n / 8 : 0;                           \
        _Pragma("omp parallel") {                                                        \
            size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads(); \
            size_t a = groups * t / nt, b = groups * (t + 1) / nt;                       \
            if (b > a) loop(src + 8 * a, dst + 8 * a, b - a);                            \
        }                                                                                \
        for (size_t i = 8 * groups; i < n; i++) dst[i] = scalar(src[i]);                 \
    }

#if !FR_HALF_SIMD
static int simd_ok(void) { return 0; }
static void f32_to_f16_loop(const float *s, uint16_t *d, size_t g) { (void)s, (void)d, (void)g; }
static void f16_to_f32_loop(const uint16_t *s, float *d, size_t g) { (void)s, (void)d, (void)g; }
static void f32_to_bf16_loop(const float *s, uint16_t *d, size_t g) { (void)s, (void)d, (void)g; }
static void bf16_to_f32_loop(const uint16_t *s, float *d, size_t g) { (void)s, (void)d, (void)g; }
#endif

FR_HALF_ARRAY(fr_f32_to_f16_n, float, uint16_t, fr_f32_to_f16, f32_to_f16_loop)
FR_HALF_ARRAY(fr_f16_to_f32_n, uint16_t, float, fr_f16_to_f32, f16_to_f32_loop)
FR_HALF_ARRAY(fr_f32_to_bf16_n, float, uint16_t, fr_f32_to_bf16, f32_to_bf16_loop)
FR_HALF_ARRAY(fr_bf16_to_f32_n, uint16_t, float, fr_bf16_to_f32, bf16_to_f32_loop)

void fr_half_to_f32_n_seq(const uint16_t *src, float *dst, size_t n, int is_f16) {
    if (is_f16) fr_f16_to_f32_n_seq(src, dst, n);
    else fr_bf16_to_f32_n_seq(src, dst, n);
}

void fr_f32_to_half_n_seq(const float *src, uint16_t *dst, size_t n, int is_f16) {
    if (is_f16) fr_f32_to_f16_n_seq(src, dst, n);
    else fr_f32_to_bf16_n_seq(src, dst, n);
}
