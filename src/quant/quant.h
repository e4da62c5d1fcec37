/* quant.h — frozen weights stored in fewer bits, and the GEMMs that read
 * them: int8 with one absmax scale per output row (LLM.int8's weight
 * storage) and NF4 with block-wise absmax and double-quantized scales
 * (QLoRA's). A quantized weight is one block from the accounting allocator
 * (FR_MEM_PARAMS); the GEMMs dequantize a tile of it at a time into the
 * caller's workspace and run OpenBLAS on the tile, so no full-precision copy
 * of the weight ever exists. The weight is frozen: there is no weight
 * gradient. It knows nothing of graphs, plans or the linear op.
 *
 * The formats, for W (O,K) row-major, f32, n = O K values:
 *
 * bf16: W'[o,k] = W[o,k] rounded to bf16 (to nearest, ties to even). Stored:
 *   the 16-bit values (2n bytes).
 *
 * int8: s[o] = max_k |W[o,k]| / 127 (an f32 division), q[o,k] =
 *   round-half-to-even(W[o,k] / s[o]) (the quotient exact, in double),
 *   clamped to [-127, 127]; a zero row has s = 0 and q = 0. (Only a row
 *   whose absmax is below 127 FLT_MIN, s subnormal, ever needs the clamp.)
 *   W'[o,k] = q[o,k] * s[o] (f32). Stored: q (n bytes), s (O floats).
 *
 * NF4: the flattened W in blocks of 64 (the last may be shorter); block b's
 *   absmax a[b] = max |W[i]| over it (f32). Each value is normalised as
 *   bitsandbytes' kQuantizeBlockwise does, x = W[i] * (1.0f / a[b]) (f32),
 *   and coded c = the number of thresholds t[j] (j = 0..14) with x > t[j],
 *   t[j] dQuantizeNF4's f32 literal for the midpoint of codes j and j+1
 *   (the double midpoint's shortest decimal; 4 of the 15 round the other
 *   way from the midpoint, which lies halfway between two floats): the
 *   nearest code, a value on a threshold going to the lower one. A block
 *   with a = 0 codes every value 7 (the code of 0.0; bitsandbytes would
 *   code 0 * inf = NaN as 0, -1.0); a subnormal a, whose reciprocal
 *   overflows, divides instead. Value i's code is in byte i/2, the high
 *   nibble for even i (the first of a pair), the low nibble for odd i; the
 *   unused low nibble of an odd n's last byte is 7.
 *   Double quantization (bitsandbytes' quantize_4bit with
 *   compress_statistics=True): offset = the mean of the a[b] (summed in
 *   double, rounded to f32); c[b] = a[b] - offset (f32), in blocks of 256
 *   with a2[j] = max |c| over block j; qa[b] = the code of the entry of the
 *   signed 8-bit dynamic map (fr_quant_dynamic_map) nearest c[b] / a2[j]
 *   (the quotient in double; a tie to the lower entry; 127, the map's 0, when
 *   a2[j] = 0). Dequantized:
 *     a'[b]  = map[qa[b]] * a2[b / 256] + offset   (two f32 operations)
 *     W'[i]  = nf4[c[i]] * a'[i / 64]               (f32)
 *   Stored: the codes (ceil(n/2) bytes), qa (one byte a block), a2 (one
 *   float per 256 blocks), offset (one float). */
#ifndef FR_QUANT_H
#define FR_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/ctx.h"

#define FR_NF4_BLOCK 64     /* values per NF4 absmax */
#define FR_NF4_DQ_BLOCK 256 /* NF4 absmaxes per double-quantization scale */

/* bf16 is the plain 16-bit storage (round to nearest even; dequantizing
 * widens exactly): one tiled GEMM serves every frozen-weight format. */
typedef enum fr_qfmt { FR_QFMT_INT8 = 0, FR_QFMT_NF4, FR_QFMT_BF16, FR_QFMT_COUNT } fr_qfmt;

/* "int8", "nf4", "bf16"; "?" for anything else. */
const char *fr_qfmt_name(fr_qfmt fmt);

/* A quantized (O,K) weight. All arrays point into `block`, one allocation of
 * fr_quant_bytes(fmt, O, K) bytes (category FR_MEM_PARAMS). */
typedef struct fr_qweight {
    fr_qfmt fmt;
    int64_t O, K;
    void *block;
    /* int8 */
    float *scale; /* (O) */
    int8_t *q;    /* (O,K) */
    /* nf4 */
    float *absmax2;   /* (ceil(nblocks / 256)) */
    float *offset;    /* (1): the mean subtracted from the absmaxes */
    uint8_t *qabsmax; /* (nblocks), nblocks = ceil(O K / 64) */
    uint8_t *codes;   /* (ceil(O K / 2)) */
    /* bf16 */
    uint16_t *h; /* (O,K) */
} fr_qweight;

/* QLoRA's 16 NF4 values, ascending, exactly bitsandbytes' table. */
const float *fr_nf4_values(void);
/* bitsandbytes' create_dynamic_map(signed=True, 7, 8): 256 values ascending,
 * 0 at index 127 (built once, at first use). */
const float *fr_quant_dynamic_map(void);

/* The bytes format fmt stores for an (O,K) weight (the block's payload;
 * what it reserves is fr_mem_block_bytes of it); 0 for O or K below 1, a
 * bad fmt, or a size that overflows. */
size_t fr_quant_bytes(fr_qfmt fmt, int64_t O, int64_t K);

/* Quantizes w (O,K) into *out (allocated here, FR_MEM_PARAMS; *out is left
 * zeroed on failure). Errors: FR_ERR_ARG (a bad fmt, NULL pointers),
 * FR_ERR_SHAPE (O or K below 1, or above INT_MAX), FR_ERR_NUMERIC (a value
 * that is not finite), FR_ERR_NOMEM (the allocator's message). */
fr_status fr_quantize(fr_ctx *ctx, fr_qfmt fmt, const float *w, int64_t O, int64_t K,
                      fr_qweight *out);
/* As fr_quantize, into dst, fr_quant_bytes(fmt, O, K) bytes the caller owns
 * (aligned to 4 bytes: the block starts with floats); *out views it. */
fr_status fr_quantize_into(fr_ctx *ctx, fr_qfmt fmt, const float *w, int64_t O, int64_t K,
                           void *dst, fr_qweight *out);
/* Views a block of fr_quant_bytes(fmt, O, K) bytes that fr_quantize(_into)
 * filled (a parameter's bytes, a device's copy): FR_ERR_ARG for a bad fmt,
 * shape or a block that is NULL or not 4-byte aligned. Allocates nothing. */
fr_status fr_quant_view(fr_ctx *ctx, fr_qfmt fmt, int64_t O, int64_t K, void *block,
                        fr_qweight *out);
/* Gives the block back and zeroes *q; NULL and zeroed weights are ignored. */
void fr_quant_free(fr_ctx *ctx, fr_qweight *q);

/* out (rows,K) = W'[o0 : o0 + rows, :]. FR_ERR_ARG for a range outside W. */
fr_status fr_dequantize_rows(fr_ctx *ctx, const fr_qweight *w, int64_t o0, int64_t rows,
                             float *out);

/* out (rows, kc) = W'[o0 : o0 + rows, k0 : k0 + kc] rounded to bf16 (to
 * nearest even, as fr_f32_to_bf16: a bf16 weight's values as they are),
 * row r at out + r ld; rows in parallel on the caller's OpenMP threads.
 * For a 16-bit GEMM over the weight (backend/cpu/qlinear.c). FR_ERR_ARG for
 * a range outside W. */
fr_status fr_dequantize_bf16(fr_ctx *ctx, const fr_qweight *w, int64_t o0, int64_t rows, int64_t k0,
                             int64_t kc, uint16_t *out, int64_t ld);

/* The workspace (floats) that fr_qgemm and fr_qgemm_dx need to run on
 * `threads` threads (below 1: one) for a weight of (O,K): a tile per
 * thread. With less (but at least one tile) they run on fewer threads. */
size_t fr_qgemm_ws_floats(int64_t O, int64_t K, int threads);

// x is (N,K), W' is (O,K) (dequantized a tile of rows at a time), b is (O) or NULL, y is (N,O)
// y[n,o] = sum_k x[n,k] W'[o,k] + b[o]  (+ y[n,o] before the call when accumulate)
/* Work is split in tasks of (a tile of W's rows, a chunk of x's rows) run on
 * fr_get_threads(ctx) threads (fewer when ws holds fewer tiles), each task's
 * GEMM on one thread; the split depends on the shapes only, so the bits
 * depend on neither the thread count nor scheduling. */
fr_status fr_qgemm(fr_ctx *ctx, const fr_qweight *w, const float *x, int64_t N, const float *b,
                   float *y, int accumulate, float *ws, size_t ws_floats);

// dy is (N,O), W' is (O,K) (dequantized a tile at a time), dx is (N,K)
// dx[n,k] = sum_o dy[n,o] W'[o,k]  (+ dx[n,k] before the call when accumulate)
/* Tasks of (a panel of dx's columns, a chunk of dy's rows); within a task
 * the sum over o runs tile by tile in order (a tile of W' rows and the
 * panel's columns dequantized, then one GEMM added in). As fr_qgemm, the
 * bits depend on the shapes only. */
fr_status fr_qgemm_dx(fr_ctx *ctx, const fr_qweight *w, const float *dy, int64_t N, float *dx,
                      int accumulate, float *ws, size_t ws_floats);

#endif
