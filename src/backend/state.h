/* state.h — the optimizer state's storage formats, shared by every backend
 * and by the host code that saves, loads and shards state (checkpoints,
 * ZeRO): fp32, bf16 (round to nearest even), or int8 by block-wise dynamic
 * quantization (Dettmers et al., "8-bit Optimizers via Block-wise
 * Quantization", 2022; the bitsandbytes scheme): each kind, its size rule,
 * the bytes of one buffer and the whole-buffer conversions (implemented on
 * the host, in backend/cpu/optim_state.c; the update kernels are each
 * backend's).
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
#ifndef FR_BACKEND_STATE_H
#define FR_BACKEND_STATE_H

#include <stddef.h>
#include <stdint.h>
#include "core/tensor.h"
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

/* Whole-buffer conversions (checkpoints, tests). is_signed picks the int8
 * map: 1 for a first moment, 0 for a second (whose values must be >= 0);
 * it is ignored by the other kinds. Encoding int8 sets each block's absmax
 * to max |x| over the block and each code to the map entry nearest
 * x / absmax (ties to the lower entry). */
void fr_state_decode(const void *buf, fr_state_kind k, size_t n, int is_signed, float *out);
void fr_state_encode(const float *in, fr_state_kind k, size_t n, int is_signed, void *buf);

/* Adafactor's state of one parameter: one f32 region (torch.optim.Adafactor's
 * state_dict names). A tensor of 2 or more dims is seen as (L, R, C), its
 * last two dims factored and the leading ones a batch: row_var (L, R) at 0,
 * col_var (L, C) at L R. A vector or scalar of n values keeps variance (n)
 * at 0. With a first moment (beta1 != 0) exp_avg (n) follows, at first_at. */
typedef struct fr_factored {
    int factored;             /* 1: row_var and col_var; 0: variance */
    int64_t L, R, C, n;       /* the (L, R, C) view; n = L R C, the numel */
    int64_t second, first_at; /* the second moment's floats; exp_avg's offset */
} fr_factored;

static inline fr_factored fr_factored_of(const fr_shape *s) {
    fr_factored f = {0, 1, 1, 1, 1, 0, 0};
    for (int i = 0; i < s->ndim; i++) f.n *= s->d[i];
    if (s->ndim >= 2) {
        f.factored = 1;
        f.R = s->d[s->ndim - 2], f.C = s->d[s->ndim - 1];
        for (int i = 0; i < s->ndim - 2; i++) f.L *= s->d[i];
        f.second = f.L * (f.R + f.C);
    } else {
        f.C = f.n, f.second = f.n;
    }
    f.first_at = f.second;
    return f;
}
/* A device's scratch for one step of such a parameter: the sums' partials
 * (8 bytes each: the weights' in blocks of FR_FACTORED_CHUNK, or U^2's in
 * blocks of it within each slice, the total after them), then the slices'
 * max(mean_i r_i, eps1) (L floats) from *rden_at bytes. */
#define FR_FACTORED_CHUNK 2048
static inline size_t fr_factored_scratch(const fr_factored *f, size_t *rden_at) {
    int64_t slices = f->factored ? f->L : 1, each = f->factored ? f->R * f->C : f->n;
    int64_t cps = (each + FR_FACTORED_CHUNK - 1) / FR_FACTORED_CHUNK;
    int64_t nb = (f->n + FR_FACTORED_CHUNK - 1) / FR_FACTORED_CHUNK;
    size_t parts = (size_t)(slices * cps > nb ? slices * cps : nb) + 1;
    if (rden_at) *rden_at = parts * 8;
    return parts * 8 + (f->factored ? (size_t)f->L * 4 : 0);
}
/* The region's floats: the second moment and, with a first moment, exp_avg. */
static inline size_t fr_factored_floats(const fr_factored *f, int first_moment) {
    return (size_t)(f->second + (first_moment ? f->n : 0));
}

#endif
