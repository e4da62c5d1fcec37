/* optim_state.h — the CPU's Adam/AdamW kernels on compressed moments
 * (the formats: backend/state.h): the update decodes, steps in f32 with
 * fr_k_adam's operations and encodes back; and pure half precision's fused
 * pass. It does not own the buffers (category FR_MEM_OPTIM, the caller's). */
#ifndef FR_OPTIM_STATE_H
#define FR_OPTIM_STATE_H

#include "backend/state.h"

/* One Adam (decoupled = 0) or AdamW (decoupled = 1) step on p (n), with g
 * (n) and the moments m, v stored as k (layouts above). Each element is
 * decoded, updated in f32 with exactly fr_k_adam's operations, and encoded
 * back; p gets the update computed from the f32 moments (before they are
 * rounded for storage). FR_STATE_F32 is fr_k_adam, bit for bit. The kernel
 * does what k says for any n; the size rule is fr_state_kind_for's. */
void fr_k_adam_state(float *p, const float *g, void *m, void *v, size_t n, const fr_optim_opts *o,
                     int64_t step, int decoupled, fr_state_kind k);

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
