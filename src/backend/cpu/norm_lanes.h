/* norm_lanes.h — BatchNorm's sums over four planes of one channel (norm.c's
 * planes4 loops) on AVX-512, with their bits.
 *
 * The reference loops are `omp simd` reductions of 4 lanes (the baseline
 * ISA's, and simdlen(4) for bf16 x): for each plane, lane l sums elements
 * i = l (mod 4) in order, the n mod 4 last elements go into lane 0, and
 * the plane's sum is (((0 + l0) + l1) + l2) + l3. Here the four planes'
 * four lanes are the 16 lanes of one register (plane k in lanes 4k..4k+3),
 * so each lane runs the same chain of adds as the reference's and one
 * 512-bit add advances all 16; the tail and the final sums are the
 * reference's, element by element. */
#ifndef FR_NORM_LANES_H
#define FR_NORM_LANES_H

#include <stdint.h>

/* Whether fr_bn_lanes_f32/_bf run here: an optimized build for the baseline
 * ISA (whose loops are vectorized in 4 lanes: FR_SIMD_LOOPS_VECTORIZED, set by
 * CMakeLists.txt; at -O1 they run element by element, another order),
 * AVX512F/BW/VL, and FRUGAL_BN_SUMS not "sse" (which
 * keeps the reference loops, for tests). Read once per call: a kernel asks
 * once and passes it on. */
int fr_bn_lanes_on(void);

/* kind 0: out[k] = sum of plane k; kind 1: sum of ((x - m_hi) - m_lo)^2;
 * kind 2: out[k] = sum of dy, out[4 + k] = sum of dy ((x - m_hi) - m_lo),
 * plane k at p + k stride (dy likewise), n values each. */
void fr_bn_lanes_f32(const float *p, const float *dy, int64_t stride, int64_t n, float m_hi,
                     float m_lo, int kind, float out[8]);
void fr_bn_lanes_bf(const uint16_t *p, const float *dy, int64_t stride, int64_t n, float m_hi,
                    float m_lo, int kind, float out[8]);

#endif
