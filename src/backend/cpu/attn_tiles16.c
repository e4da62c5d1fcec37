/* attn_tiles16.c — attention's bf16 tile products (see attn_tiles16.h): a
 * 4-row x 64-column register block of VDPBF16PS, and the packers that put
 * the operands in its pair layout. */
#include "backend/cpu/attn_tiles16.h"
#include "backend/cpu/cpuinfo.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define T16_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define T16_INLINE static inline __attribute__((always_inline))

/* AVX512F, BW, VL and AVX512_BF16, with the OS saving the opmask and ZMM
 * state (cpuinfo.c's cpuid, asked once) */
int fr_t16_cpu(void) {
    const unsigned need = FR_CPU_AVX512F | FR_CPU_AVX512BW | FR_CPU_AVX512VL | FR_CPU_AVX512_BF16;
    return (fr_cpu_features() & need) == need;
}

int fr_t16_on(void) {
    const char *e = getenv("FRUGAL_ATTN");
    return fr_t16_cpu() && !(e && strcmp(e, "f32") == 0);
}

/* pair (i, p) of A */
T16_INLINE uint32_t a_pair(const uint16_t *A, size_t lda, int mode, int i, int p) {
    if (mode == FR_T16_ROWS) {
        uint32_t w;
        memcpy(&w, A + (size_t)i * lda + 2 * (size_t)p, sizeof w);
        return w;
    }
    return A[2 * (size_t)p * lda + (size_t)i] | (uint32_t)A[(2 * (size_t)p + 1) * lda + (size_t)i]
                                                    << 16;
}

static __mmask16 cols_mask(int left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* Rows i0 .. i0 + mr - 1 (mr <= 4) x columns j0 .. j0 + 16 NV - 1 of C: a
 * row past mr repeats the last one and is not stored. */
T16_TGT T16_INLINE void block(const int NV, const int mode, int i0, int mr, int j0, int n, int kp,
                              const uint16_t *A, size_t lda, const uint32_t *B, size_t ldb,
                              float alpha, int acc, float *C, size_t ldc) {
    /* every loop over r and v fully unrolled, so that the 4 x NV
     * accumulators live in registers */
    __m512 c[4][4];
    int row[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        row[r] = i0 + (r < mr ? r : mr - 1);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps();
    }
    for (int p = 0; p < kp; p++) {
        const uint32_t *b = B + (size_t)p * ldb + j0;
        __m512i bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bv[v] = _mm512_loadu_si512((const void *)(b + 16 * v));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512i a = _mm512_set1_epi32((int)a_pair(A, lda, mode, row[r], p));
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)bv[v]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        if (r >= mr) break;
        float *cr = C + (size_t)(i0 + r) * ldc + j0;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            const __mmask16 k = cols_mask(n - j0 - 16 * v);
            __m512 x = _mm512_mul_ps(al, c[r][v]);
            if (acc) x = _mm512_add_ps(_mm512_maskz_loadu_ps(k, cr + 16 * v), x);
            _mm512_mask_storeu_ps(cr + 16 * v, k, x);
        }
    }
}

#define T16_BLOCKS(MODE)                                                                 \
    switch (nv) {                                                                        \
    case 1: block(1, MODE, i, mr, j, n, kp, a, lda, B, ldb, alpha, acc, C, ldc); break;  \
    case 2: block(2, MODE, i, mr, j, n, kp, a, lda, B, ldb, alpha, acc, C, ldc); break;  \
    case 3: block(3, MODE, i, mr, j, n, kp, a, lda, B, ldb, alpha, acc, C, ldc); break;  \
    default: block(4, MODE, i, mr, j, n, kp, a, lda, B, ldb, alpha, acc, C, ldc); break; \
    }

T16_TGT void fr_t16_gemm(int m, int n, int kp, const void *A, size_t lda, int amode,
                         const uint32_t *B, size_t ldb, float alpha, int acc, float *C,
                         size_t ldc) {
    const uint16_t *a = A;
    for (int i = 0; i < m; i += 4) {
        const int mr = m - i < 4 ? m - i : 4;
        for (int j = 0; j < n; j += 64) {
            int nv = (n - j + 15) / 16;
            if (amode == FR_T16_ROWS) {
                T16_BLOCKS(FR_T16_ROWS)
            } else {
                T16_BLOCKS(FR_T16_COLS)
            }
        }
    }
}

T16_TGT void fr_t16_round_rows(const float *src, size_t ld, int rows, int cols, uint16_t *dst,
                               size_t ldd) {
    const int ce = (cols + 1) & ~1;
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * ld;
        uint16_t *d = dst + (size_t)r * ldd;
        for (int c = 0; c < cols; c += 16) {
            const __mmask16 k = cols_mask(cols - c);
            const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, s + c));
            _mm256_mask_storeu_epi16(d + c, k, (__m256i)h);
        }
        if (ce > cols) d[cols] = 0;
    }
    if (rows & 1) memset(dst + (size_t)rows * ldd, 0, (size_t)ce * sizeof *dst);
}

/* 16 values of row r (columns c..) as bf16, zero past n or past the k rows */
T16_TGT T16_INLINE __m256i row16(const void *src, int f32, size_t ld, int r, int k, int c, int n) {
    const __mmask16 m = r < k ? cols_mask(n - c) : 0;
    if (!m) return _mm256_setzero_si256();
    if (f32) {
        const float *s = (const float *)src + (size_t)r * ld + c;
        return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s));
    }
    return _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + (size_t)r * ld + c);
}

/* element 2i of the result is element i of the low half, 2i + 1 element i
 * of the high half */
static const uint16_t interleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                        21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                        11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

T16_TGT void fr_t16_pack_rows(const void *src, int f32, size_t ld, int k, int n, uint32_t *dst,
                              size_t ldb) {
    const __m512i idx = _mm512_loadu_si512((const void *)interleave);
    const int kp = (k + 1) / 2;
    for (int p = 0; p < kp; p++)
        for (int c = 0; c < (int)ldb; c += 16) {
            const __m256i lo = row16(src, f32, ld, 2 * p, k, c, n);
            const __m256i hi = row16(src, f32, ld, 2 * p + 1, k, c, n);
            const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            _mm512_storeu_si512((void *)(dst + (size_t)p * ldb + c),
                                _mm512_permutexvar_epi16(idx, both));
        }
}

/* r[i] word j becomes r[j] word i: a 16 x 16 transpose of 32-bit words in
 * four stages (pairs of words, pairs of pairs, then 128-bit lanes twice).
 * After the second stage b[4i + k] holds, in its 128-bit lane L, rows 4i ..
 * 4i + 3 of column 4L + k. */
T16_TGT T16_INLINE void transpose16(__m512i r[16]) {
    __m512i a[16], b[16], c[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    /* c[4k + q]: lanes (0, 2) (0x88) or (1, 3) (0xdd) of rows 0-3 with 4-7
     * (q 0, 1), of rows 8-11 with 12-15 (q 2, 3), column k's group */
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        c[4 * k] = _mm512_shuffle_i32x4(b[k], b[4 + k], 0x88);
        c[4 * k + 1] = _mm512_shuffle_i32x4(b[k], b[4 + k], 0xdd);
        c[4 * k + 2] = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0x88);
        c[4 * k + 3] = _mm512_shuffle_i32x4(b[8 + k], b[12 + k], 0xdd);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_shuffle_i32x4(c[4 * k], c[4 * k + 2], 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(c[4 * k], c[4 * k + 2], 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(c[4 * k + 1], c[4 * k + 3], 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(c[4 * k + 1], c[4 * k + 3], 0xdd);
    }
}

/* 16 rows by 16 words at a time: the rows' words loaded (0 past n rows or
 * kp words), transposed in registers, stored as 16 rows of dst */
T16_TGT void fr_t16_pack_pairs(const uint16_t *src, size_t ld, int n, int kp, uint32_t *dst,
                               size_t ldb) {
    for (int j = 0; j < (int)ldb; j += 16)
        for (int w = 0; w < kp; w += 16) {
            const __mmask16 words = cols_mask(kp - w);
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = j + i < n ? _mm512_maskz_loadu_epi32(
                                       words, (const void *)(src + (size_t)(j + i) * ld + 2 * w))
                                 : _mm512_setzero_si512();
            transpose16(r);
            for (int p = 0; p < 16 && w + p < kp; p++)
                _mm512_storeu_si512((void *)(dst + (size_t)(w + p) * ldb + j), r[p]);
        }
}

#else /* no x86-64 AVX-512: attention widens its 16-bit operands (fr_t16_on is 0,
       * so the functions below are never called) */

int fr_t16_cpu(void) { return 0; }
int fr_t16_on(void) { return 0; }
void fr_t16_gemm(int m, int n, int kp, const void *A, size_t lda, int amode, const uint32_t *B,
                 size_t ldb, float alpha, int acc, float *C, size_t ldc) {
    (void)m, (void)n, (void)kp, (void)A, (void)lda, (void)amode, (void)B, (void)ldb, (void)alpha,
        (void)acc, (void)C, (void)ldc;
}
void fr_t16_round_rows(const float *src, size_t ld, int rows, int cols, uint16_t *dst, size_t ldd) {
    (void)src, (void)ld, (void)rows, (void)cols, (void)dst, (void)ldd;
}
void fr_t16_pack_rows(const void *src, int f32, size_t ld, int k, int n, uint32_t *dst,
                      size_t ldb) {
    (void)src, (void)f32, (void)ld, (void)k, (void)n, (void)dst, (void)ldb;
}
void fr_t16_pack_pairs(const uint16_t *src, size_t ld, int n, int kp, uint32_t *dst, size_t ldb) {
    (void)src, (void)ld, (void)n, (void)kp, (void)dst, (void)ldb;
}

#endif
