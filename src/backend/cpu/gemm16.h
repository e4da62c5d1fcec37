/* gemm16.h — GEMMs of 16-bit operands with f32 accumulation and an f32
 * result, through oneDNN's matmul (Debian's libdnnl), for the linear layer
 * under mixed precision. OpenBLAS (Debian's build) has no 16-bit GEMM; on a
 * CPU with AVX512_BF16 oneDNN's bf16 kernels do twice the FLOPs of an f32
 * GEMM (bench/bench_gemm16.c measures both).
 *
 * Products of bf16 values are exact in f32, so the result is the GEMM of the
 * operands' exact values with f32 sums, as the f32 GEMM of their widened
 * copies, up to the order of the sums. Bits depend on the shapes and the
 * thread count, not on scheduling (oneDNN's kernels split work statically). */
#ifndef FR_GEMM16_H
#define FR_GEMM16_H

#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"

/* Whether this build and this CPU run 16-bit GEMMs of dtype dt natively:
 * bf16 with oneDNN, when the CPU has AVX512_BF16 or AMX-BF16 and oneDNN's
 * kernel for bf16 is not its reference C loop (elsewhere the mixed-precision
 * pass keeps f32 GEMMs of rounded operands). FRUGAL_GEMM16=0 in the
 * environment turns it off (to compare the two); FRUGAL_GEMM16=1 turns it on
 * wherever oneDNN has a jit bf16 kernel, emulated on AVX-512 without
 * AVX512_BF16 (slow: for tests of this path on such a host). Decided once
 * per process. */
int fr_gemm16_native(fr_dtype dt);

/* C (M,N) = op(A) op(B) + beta C, row-major, beta 0 or 1. op(A) is (M,K): A
 * stored (M,K) with row stride lda, or (K,M) when ta; op(B) is (K,N): B
 * stored (K,N) with row stride ldb, or (N,K) when tb. A and B bf16, C f32.
 * ws: scratch of fr_gemm16_ws() bytes (oneDNN's scratchpad, planned by the
 * step so that it is counted). Uses the OpenMP threads of the caller. */
int fr_gemm16(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
              int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc,
              void *ws, size_t ws_bytes);

/* The scratch bytes fr_gemm16 needs for these arguments (0 if none). */
size_t fr_gemm16_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                    float beta, int64_t ldc);

/* The GEMM's epilogue, done by oneDNN on the f32 sums before C is written:
 * bias (f32, N values, or NULL) added to every row (y = A B + bias: one f32
 * addition, as seeding C with the bias and beta 1 does), and C stored in
 * bf16 when c16 (each value rounded to nearest even, as CAST rounds: the
 * bits of the f32 result cast). */
typedef struct fr_gemm16_out {
    const float *bias;
    int c16;
    int ab32; /* A and B are f32 (oneDNN's f32 matmul, fr_gemm32_onednn), not bf16 */
} fr_gemm16_out;

/* fr_gemm16 with an epilogue (e NULL: none); C is float * or, with e->c16,
 * uint16_t * (bf16), ldc in its elements; A and B uint16_t * (bf16) or,
 * with e->ab32, float *. With e->ab32 and less scratch than the call needs
 * (a caller that planned none: a kernel called directly, generation's
 * plan) it returns FR_GEMM16_DECLINE, sets no error and writes nothing:
 * the caller runs its OpenBLAS GEMM instead. */
#define FR_GEMM16_DECLINE (-2)
int fr_gemm16_epi(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A,
                  int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc,
                  const fr_gemm16_out *e, void *ws, size_t ws_bytes);

/* Whether the linear layers' f32 GEMMs x W^T and dy W (M x N x K
 * multiply-adds) run on oneDNN's f32 matmul (its brgemm kernels, scratch
 * planned like the bf16 one's) rather than on OpenBLAS. FRUGAL_GEMM (read
 * once per process, where the build has oneDNN):
 *  - unset (or "auto"): GEMMs of at least FR_GEMM32_ONEDNN_MIN
 *    multiply-adds where oneDNN runs AVX-512 kernels. On this AVX-512 host
 *    oneDNN's sgemm is the faster (bench/out/gemm_f32_linear.txt: the seed
 *    MLP's step at batch 1024 0.94x of OpenBLAS's); a small layer keeps
 *    OpenBLAS, whose call costs less and needs no scratch (oneDNN's, up to a
 *    megabyte a layer, raised the smallest budgets small models fit in by a
 *    third). On AVX2-only hosts it was not measured: OpenBLAS.
 *  - "onednn": every layer; "openblas": none.
 * Weight gradients, convolutions' and attention's GEMMs stay OpenBLAS's. */
#define FR_GEMM32_ONEDNN_MIN 268435456.0 /* 2^28 multiply-adds */
int fr_gemm32_onednn_for(int64_t M, int64_t N, int64_t K);
/* FRUGAL_GEMM=onednn: every f32 linear layer on oneDNN */
int fr_gemm32_onednn(void);

/* Kernels that round or dequantize a weight into bf16 a panel at a time
 * for these GEMMs (qlinear.c, linear_ce.c) carve the step's GEMM scratch
 * into their panels and oneDNN's scratch. n lines of the weight (rows or
 * columns) of len values each go in balanced panels of at most
 * FR_GEMM16_PANEL values, at least 16 lines a panel unless n has fewer:
 * returns the lines a panel, and in *last (may be NULL) the last panel's. */
#define FR_GEMM16_PANEL (1 << 20) /* bf16 values (2 MiB) */
int64_t fr_gemm16_panel(int64_t n, int64_t len, int64_t *last);
/* bytes rounded up to 64 (a cache line): a buffer's share of the scratch */
size_t fr_gemm16_round(size_t bytes);
size_t fr_gemm16_epi_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                        float beta, int64_t ldc, const fr_gemm16_out *e);

#ifdef FR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
/* The process's oneDNN CPU engine and in-order stream, made once (NULL when
 * oneDNN could not make them), for every oneDNN primitive frugal runs. */
dnnl_engine_t fr_dnnl_engine(void);
dnnl_stream_t fr_dnnl_stream(void);
#endif

#endif
