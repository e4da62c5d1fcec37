/* attn_tiles16.h — attention's tile products on bf16 operands, where the CPU
 * has AVX512_BF16 (VDPBF16PS: two bf16 products summed into each f32 lane,
 * the products exact, the sums f32). attention.c calls these for a bf16 qkv
 * (bf16-mixed) instead of widening q, k and v to f32 for OpenBLAS.
 *
 * Why a kernel of our own: a tile product is 64 x 64 x HS, a few
 * microseconds of arithmetic; oneDNN 2.6's matmul primitive (Debian 12's)
 * costs more than that per call, and its small-GEMM interface (brgemm
 * ukernels) is public only from oneDNN 3.5. PyTorch's CPU flash attention
 * (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp) likewise runs its own
 * tile loop, on bf16 operands with f32 accumulation, and rounds the
 * probabilities to bf16 for P V; so do these.
 *
 * C (m x n, f32, row stride ldc) = alpha A B, or C += alpha A B, over k
 * (in pairs: kp = ceil(k / 2)). B is packed: word (p, j) at B[p * ldb + j]
 * holds B[2p][j] (low half) and B[2p + 1][j] (high half), ldb a multiple of
 * 16 and the columns n .. ldb-1 zero. A is read in one of two ways:
 *  - rows (FR_T16_ROWS): pair (i, p) is elements 2p and 2p + 1 of row i of
 *    a bf16 matrix (row stride lda elements, even) whose rows hold k
 *    contiguous values (k even, or the pad element zero);
 *  - columns (FR_T16_COLS): pair (i, p) is X[2p][i] | X[2p + 1][i] << 16 of a
 *    bf16 matrix X (row stride lda elements) holding A transposed (row 2p + 1
 *    zero when k is odd).
 * The packers round f32 values to bf16 to nearest even with VCVTNEPS2BF16,
 * which treats subnormal inputs as zero. Bits depend on the operands only
 * (one thread, a fixed order of pairs). */
#ifndef FR_ATTN_TILES16_H
#define FR_ATTN_TILES16_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU runs these (AVX512F, BW, VL and BF16, ZMM state saved by
 * the OS) and FRUGAL_ATTN is not "f32"; FRUGAL_ATTN=f32 forces the widening
 * path. Read at each call (cheap), so a test can switch. */
int fr_t16_on(void);
/* 1 when the CPU could run them, whatever FRUGAL_ATTN says (workspaces are
 * sized for either path). */
int fr_t16_cpu(void);

enum { FR_T16_ROWS = 0, FR_T16_COLS = 1 };

/* Columns of a packed B for n values: n rounded up to 16. */
static inline size_t fr_t16_ld(int n) { return ((size_t)(n > 0 ? n : 0) + 15) / 16 * 16; }

void fr_t16_gemm(int m, int n, int kp, const void *A, size_t lda, int amode, const uint32_t *B,
                 size_t ldb, float alpha, int acc, float *C, size_t ldc);

/* rows x cols f32 (row stride ld) rounded to bf16 rows of dst (row stride
 * ldd elements, even); columns cols .. cols rounded up to even and, when rows
 * is odd, row `rows` are zero. */
void fr_t16_round_rows(const float *src, size_t ld, int rows, int cols, uint16_t *dst, size_t ldd);

/* B packed from k rows of n values (row stride ld): f32 (rounded) when f32,
 * else bf16. ceil(k / 2) rows of ldb words. */
void fr_t16_pack_rows(const void *src, int f32, size_t ld, int k, int n, uint32_t *dst, size_t ldb);

/* B packed from n rows of 2 kp bf16 values (row stride ld elements, even):
 * word (p, j) = word p of row j, the transpose of the rows' pairs. */
void fr_t16_pack_pairs(const uint16_t *src, size_t ld, int n, int kp, uint32_t *dst, size_t ldb);

#endif
