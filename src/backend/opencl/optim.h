/* optim.h (opencl) — the optimizer step on the device: OPTIM_STEP's kernel
 * (fr_cl_k_optim_step, declared in backend.h) and the update the training
 * step applies to a parameter from its gradient, both with
 * src/backend/cpu/optim.c's formulas and float operations.
 *
 * State: o->slot[i].state_buf[k] is the cl_mem of moment k (SGD: the
 * momentum buffer in [0], absent when momentum is 0; Adam/AdamW: m in [0],
 * v in [1]), the state from byte 0 in fr_state_bytes' layout for the slot's
 * state_kind (f32, bf16 or int8), or for a 16-bit parameter in its format. */
#ifndef FR_CL_OPTIM_H
#define FR_CL_OPTIM_H

#include "backend/opencl/backend.h"

/* One step of o's optimizer (step o->t, 1-based) on parameter p, a device
 * tensor, from its gradient g (same numel), with the state of
 * o->slot[param_index]. p f32: g f32, the state as the slot's kind says.
 * p f16 or bf16 (pure 16-bit training): g f32 or in p's format, the state in
 * p's format (the CPU step's fr_k_adam_half, and widen / fr_k_sgd / narrow).
 * Enqueued, not waited for. */
int fr_cl_optim_update(fr_ctx *ctx, fr_cl *cl, const fr_optim_ctx *o, int param_index, fr_tensor *p,
                       const fr_tensor *g);

#endif
