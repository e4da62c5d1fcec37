/* optim.h (opencl) — the optimizer step on the device: the update the
 * training step applies to a parameter from its gradient (the backend's
 * optim_update, after backward over every parameter and inside backward for
 * one), with src/backend/cpu/optim.c's formulas and float operations.
 *
 * State: state[k].buf is the cl_mem of moment k (SGD: the momentum buffer
 * in [0], absent when momentum is 0; Adam/AdamW: m in [0], v in [1]), the
 * state from byte state[k].off (a view of the optimizer's flat state block;
 * a multiple of the format's element, 4 for int8) in fr_state_bytes' layout for state_kind (f32, bf16 or
 * int8), or for a 16-bit parameter in its format. Adafactor: state[0] its
 * f32 region (backend/state.h's fr_factored layout), state[1] the
 * optimizer's scratch from byte 0 (fr_factored_scratch's bytes at least);
 * it waits for two sums it reads back. */
#ifndef FR_CL_OPTIM_H
#define FR_CL_OPTIM_H

#include "backend/opencl/backend.h"

/* One step of o's optimizer (step t, 1-based) on parameter p, a device
 * tensor, from its gradient g (same numel), with its state. p f32: g f32,
 * the state as state_kind says.
 * p f16 or bf16 (pure 16-bit training): g f32 or in p's format, the state in
 * p's format (the CPU step's fr_k_adam_half, and widen / fr_k_sgd / narrow).
 * Enqueued, not waited for. */
int fr_cl_optim_update(fr_ctx *ctx, fr_cl *cl, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                       const fr_tensor *g, const fr_tensor *state, int state_kind);

#endif
