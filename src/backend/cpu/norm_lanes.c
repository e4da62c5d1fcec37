/* norm_lanes.c — BatchNorm's four-plane sums on 16 lanes (see norm_lanes.h). */
#include "backend/cpu/norm_lanes.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/half_in.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX__) && \
    defined(FR_SIMD_LOOPS_VECTORIZED)
#include <immintrin.h>
#define LANES_TGT __attribute__((target("avx512f,avx512bw,avx512vl")))

int fr_bn_lanes_on(void) {
    const char *e = getenv("FRUGAL_BN_SUMS");
    if (e && strcmp(e, "sse") == 0) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

/* elements i .. i+3 of the four planes: plane k in lanes 4k .. 4k+3 */
LANES_TGT static inline __m512 load_f32(const float *p, int64_t s, int64_t i) {
    __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p + i));
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p + s + i), 1);
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p + 2 * s + i), 2);
    return _mm512_insertf32x4(v, _mm_loadu_ps(p + 3 * s + i), 3);
}

/* the same of bf16 planes, as their exact f32 values (fr_bf16_bits) */
LANES_TGT static inline __m512 load_bf(const uint16_t *p, int64_t s, int64_t i) {
    const __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(p + i)),
                                          _mm_loadl_epi64((const __m128i *)(p + s + i)));
    const __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(p + 2 * s + i)),
                                          _mm_loadl_epi64((const __m128i *)(p + 3 * s + i)));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* the reference's end: the tail into lane 0 of each plane, then each
 * plane's lanes added in order onto 0 */
#define FINISH_(L, out, off)       \
    for (int k_ = 0; k_ < 4; k_++) \
        out[(off) + k_] = (((0.0f + L[4 * k_]) + L[4 * k_ + 1]) + L[4 * k_ + 2]) + L[4 * k_ + 3];

#define LANES_BODY(X, LOAD)                                                               \
    const int64_t nv = n / 4 * 4;                                                         \
    const __m512 mh = _mm512_set1_ps(m_hi), ml = _mm512_set1_ps(m_lo);                    \
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();                         \
    float L[16], L2[16];                                                                  \
    if (kind == 0) {                                                                      \
        for (int64_t i = 0; i < nv; i += 4) acc = _mm512_add_ps(acc, LOAD(p, stride, i)); \
        _mm512_storeu_ps(L, acc);                                                         \
        for (int64_t i = nv; i < n; i++)                                                  \
            for (int k = 0; k < 4; k++) L[4 * k] += X(p[k * stride + i]);                 \
        FINISH_(L, out, 0);                                                               \
    } else if (kind == 1) {                                                               \
        for (int64_t i = 0; i < nv; i += 4) {                                             \
            const __m512 d = _mm512_sub_ps(_mm512_sub_ps(LOAD(p, stride, i), mh), ml);    \
            acc = _mm512_add_ps(acc, _mm512_mul_ps(d, d));                                \
        }                                                                                 \
        _mm512_storeu_ps(L, acc);                                                         \
        for (int64_t i = nv; i < n; i++)                                                  \
            for (int k = 0; k < 4; k++) {                                                 \
                const float d = (X(p[k * stride + i]) - m_hi) - m_lo;                     \
                L[4 * k] += d * d;                                                        \
            }                                                                             \
        FINISH_(L, out, 0);                                                               \
    } else {                                                                              \
        for (int64_t i = 0; i < nv; i += 4) {                                             \
            const __m512 g = load_f32(dy, stride, i);                                     \
            const __m512 d = _mm512_sub_ps(_mm512_sub_ps(LOAD(p, stride, i), mh), ml);    \
            acc = _mm512_add_ps(acc, g);                                                  \
            acc2 = _mm512_add_ps(acc2, _mm512_mul_ps(g, d));                              \
        }                                                                                 \
        _mm512_storeu_ps(L, acc);                                                         \
        _mm512_storeu_ps(L2, acc2);                                                       \
        for (int64_t i = nv; i < n; i++)                                                  \
            for (int k = 0; k < 4; k++) {                                                 \
                const float g = dy[k * stride + i];                                       \
                L[4 * k] += g;                                                            \
                L2[4 * k] += g * ((X(p[k * stride + i]) - m_hi) - m_lo);                  \
            }                                                                             \
        FINISH_(L, out, 0);                                                               \
        FINISH_(L2, out, 4);                                                              \
    }

#define F32_(v) (v)
LANES_TGT void fr_bn_lanes_f32(const float *p, const float *dy, int64_t stride, int64_t n,
                               float m_hi, float m_lo, int kind,
                               float out[8]){LANES_BODY(F32_, load_f32)} LANES_TGT
    void fr_bn_lanes_bf(const uint16_t *p, const float *dy, int64_t stride, int64_t n, float m_hi,
                        float m_lo, int kind, float out[8]) {
    LANES_BODY(fr_bf16_bits, load_bf)
}
#undef F32_

#else /* not x86-64, a build whose own loops are wider, or one that does not vectorize them
       * (FR_SIMD_LOOPS_VECTORIZED, CMakeLists.txt): the reference loops only */
int fr_bn_lanes_on(void) { return 0; }
void fr_bn_lanes_f32(const float *p, const float *dy, int64_t stride, int64_t n, float m_hi,
                     float m_lo, int kind, float out[8]) {
    (void)p, (void)dy, (void)stride, (void)n, (void)m_hi, (void)m_lo, (void)kind;
    memset(out, 0, 8 * sizeof *out);
}
void fr_bn_lanes_bf(const uint16_t *p, const float *dy, int64_t stride, int64_t n, float m_hi,
                    float m_lo, int kind, float out[8]) {
    (void)p, (void)dy, (void)stride, (void)n, (void)m_hi, (void)m_lo, (void)kind;
    memset(out, 0, 8 * sizeof *out);
}
#endif
