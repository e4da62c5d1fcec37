/* optim_state.h — Adam/AdamW with the moments stored compressed: fp32 (as
 * fr_k_adam), bf16 (round to nearest even), or int8 by block-wise dynamic
 * quantization (Dettmers et al., "8-bit Optimizers via Block-wise
 * Quantization", 2022; the bitsandbytes scheme). It owns the storage formats
 * of one moment buffer, their sizes and the update kernel; it does not own
 * the buffers (category FR_MEM_OPTIM, the caller's), nor the choice of kind
 * per tensor beyond fr_state_kind_for's size rule.
 *
 * Buffer layouts for n elements (one moment):
 *   FR_STATE_F32   float[n]
 *   FR_STATE_BF16  uint16_t[n], bf16 bit patterns
 *   FR_STATE_INT8  uint8_t codes[n], zero padding to a multiple of 4 bytes,
 *                  then float absmax[ceil(n / FR_STATE_INT8_BLOCK)];
 *                  element i is map[codes[i]] * absmax[i / BLOCK], where map
 *                  is the signed dynamic map for the first moment and the
 *                  unsigned one for the second. An absmax of 0 decodes the
 *                  block as zeros, so an all-zero (calloc) buffer is a zero
 *                  state for every kind; a NaN absmax marks a block that held
 *                  a non-finite value and decodes as NaN.
 * The buffers must be 4-byte aligned (any malloc or arena block is). */
#ifndef FR_OPTIM_STATE_H
#define FR_OPTIM_STATE_H

#include <stddef.h>
#include <stdint.h>
#include "frugal.h"

typedef enum fr_state_kind { FR_STATE_F32 = 0, FR_STATE_BF16, FR_STATE_INT8 } fr_state_kind;
#define FR_STATE_KIND_COUNT 3

#define FR_STATE_INT8_BLOCK 2048
/* Tensors smaller than one quantization block keep fp32 state (bitsandbytes'
 * min_8bit_size, which defaults to 4096 there; one block here). */
#define FR_STATE_INT8_MIN FR_STATE_INT8_BLOCK

/* The kind a tensor of n elements gets when `requested` is asked for: int8
 * falls back to f32 below FR_STATE_INT8_MIN; the others are kept. */
fr_state_kind fr_state_kind_for(fr_state_kind requested, size_t n);

/* Bytes of ONE moment buffer of n elements: f32 4n; bf16 2n; int8
 * round_up(n, 4) + 4 ceil(n / FR_STATE_INT8_BLOCK). */
size_t fr_state_bytes(fr_state_kind k, size_t n);

/* "fp32", "bf16", "int8"; NULL for an unknown kind. */
const char *fr_state_kind_name(fr_state_kind k);
/* The inverse of fr_state_kind_name, any letter case; FR_ERR_ARG for anything else. */
fr_status fr_state_kind_parse(const char *s, fr_state_kind *out);

/* One Adam (decoupled = 0) or AdamW (decoupled = 1) step on p (n), with g
 * (n) and the moments m, v stored as k (layouts above). Each element is
 * decoded, updated in f32 with exactly fr_k_adam's operations, and encoded
 * back; p gets the update computed from the f32 moments (before they are
 * rounded for storage). FR_STATE_F32 is fr_k_adam, bit for bit. The kernel
 * does what k says for any n; the size rule is fr_state_kind_for's. */
void fr_k_adam_state(float *p, const float *g, void *m, void *v, size_t n, const fr_optim_opts *o,
                     int64_t step, int decoupled, fr_state_kind k);

/* Whole-buffer conversions (checkpoints, tests). is_signed picks the int8
 * map: 1 for a first moment, 0 for a second (whose values must be >= 0);
 * it is ignored by the other kinds. Encoding int8 sets each block's absmax
 * to max |x| over the block and each code to the map entry nearest
 * x / absmax (ties to the lower entry). */
void fr_state_decode(const void *buf, fr_state_kind k, size_t n, int is_signed, float *out);
void fr_state_encode(const float *in, fr_state_kind k, size_t n, int is_signed, void *buf);

/* Adam/AdamW for pure half precision: p, m and v all stored in 16 bits
 * (is_f16: IEEE f16, else bf16), g f32 or (g_half) in the same 16-bit
 * format; each element is widened, updated with fr_k_adam's f32 operations
 * and rounded back (round to nearest even). */
void fr_k_adam_half(uint16_t *p, const void *g, int g_half, uint16_t *m, uint16_t *v, size_t n,
                    const fr_optim_opts *o, int64_t step, int decoupled, int is_f16);

/* Testing: on = 0 keeps the int8 code search on its scalar path; returns
 * whether the AVX-512 path now runs. */
int fr_state_simd(int on);
/* Testing: whether the int8 encoders use the one-entry bucket table (every
 * bucket holds at most one midpoint) rather than the binary search. */
int fr_state_bucket_table(void);

#endif
