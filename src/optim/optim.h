/* optim.h — the optimizer: torch.optim's update rules (SGD with momentum,
 * Nesterov, dampening and weight decay; Adam; AdamW) over a model's
 * parameters, with their state formats (fp32; bf16 or int8 for Adam's
 * moments; a 16-bit weight's state in its own format), the loss scaler's
 * unscale with its inf/NaN check, clip_grad_norm_, and the bytes each takes.
 * The arithmetic of one tensor is the backend's kernels (backend/cpu/
 * optim.c, optim_state.c); which tensors, in which order, in which format
 * and with which step count is here. The step (train/) says which
 * parameters have a gradient this step (gv[i] >= 0) and which it already
 * updated inside backward (fused[i]); a ZeRO rank steps its range of a
 * parameter (fr_optim_step_range). A new rule is a kind in frugal.h, its
 * defaults in opts.c and its branch in fr_optim_step_range. */
#ifndef FR_OPTIM_H
#define FR_OPTIM_H

#include "model/model.h"

/* State buffers a rule keeps per parameter: SGD 1 with momentum (else 0),
 * Adam and AdamW 2 (exp_avg, exp_avg_sq). */
int fr_optim_states(const fr_optim_opts *o);
/* The storage of one state buffer of p in format fmt (Adam's moments may be
 * compressed: bf16, int8 by blocks; small tensors keep fp32; a 16-bit
 * weight's state takes the weight's format); the kind in *kind. */
size_t fr_optim_state_bytes(const fr_optim_opts *o, fr_optim_state fmt, const fr_param *p,
                            int *kind);

/* A parameter's gradient storage, f32 or in the weights' 16-bit format
 * (pure half), NULL while it has none; its format; one element set
 * (testing: an overflow injected). */
void *fr_grad_data(const fr_param *p);
fr_dtype fr_grad_dtype(const fr_param *p);
void fr_grad_set(fr_param *p, int64_t k, float x);

/* optimizer.step() at step t (1-based) over every parameter i of m with a
 * gradient (gv[i] >= 0 and grad_valid) that was not updated inside
 * backward (fused NULL or fused[i] == 0), in parameter order. */
fr_status fr_optim_update(fr_ctx *ctx, const fr_optim_opts *o, fr_model *m, const int *gv,
                          const uint8_t *fused, int64_t t);
/* The step of p's elements [a, a + n) at t: weights w, f32 gradients g
 * (the update is elementwise, so a ZeRO rank steps its range; its state
 * holds those elements only). */
void fr_optim_step_range(const fr_optim_opts *o, fr_param *p, float *w, const float *g, size_t n,
                         int64_t t);
/* The scaler's unscale: every gradient times inv, in one pass that looks for
 * inf or NaN; 1 if it found one (the rest is left: the step is skipped). */
int fr_optim_unscale(fr_model *m, const int *gv, float inv);
/* clip_grad_norm_(max_norm, 2): the squares summed in double (fixed
 * blocks), tensors in order; the gradients scaled by the coefficient when
 * it is below 1. fr_optim_clip_coef is PyTorch's max_norm / (norm + 1e-6). */
void fr_optim_clip(fr_model *m, const int *gv, float max_norm);
float fr_optim_clip_coef(double sumsq, float max_norm);

#endif
