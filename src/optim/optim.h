/* optim.h — the optimizer: torch.optim's update rules (SGD with momentum,
 * Nesterov, dampening and weight decay; Adam; AdamW; Adafactor) over a model's
 * parameters, with their state formats (fp32; bf16 or int8 for Adam's
 * moments; a 16-bit weight's state in its own format), the loss scaler's
 * unscale with its inf/NaN check, clip_grad_norm_, and the bytes each takes.
 * It owns flat blocks in a backend's memory (core/flat.h's layout, the
 * data-parallel flat vector's): the gradients (when kept), the state (a
 * ZeRO rank's: its range of each tensor) and their host copies (--offload
 * optimizer's gradients, a device's state for a checkpoint); its records
 * on the model (model->optim), one per parameter, are views into them (the
 * parameters' own block is the model's: model.h). The arithmetic of one
 * tensor is the backend's (fr_backend's optim_update, grad_unscale,
 * grad_sumsq and grad_scale: the CPU's kernels in backend/cpu/optim.c and
 * optim_state.c, a device's own); which tensors, in which order, in which
 * format and with which step count is here. The step (train/) says which
 * parameters have a gradient this step (gv[i] >= 0) and which it already
 * updated inside backward (fused[i], by fr_optim_step_param); a
 * ZeRO rank steps its range of a parameter on the host
 * (fr_optim_step_range). A new rule is a kind in frugal.h, one row of
 * rules.c's table (its name, defaults, state and what the engine may do
 * with it: the questions below) and its kernels in each backend (their
 * optim_update, which also steps one parameter inside backward for an
 * OPTIM_STEP node: fr_optim_step_param); nothing outside optim/ and the
 * backends names a rule. */
#ifndef FR_OPTIM_H
#define FR_OPTIM_H

#include "backend/backend.h"
#include "model/model.h"
#include "optim/scaler.h"
#include "core/flat.h"

/* The optimizer's part of one parameter: where its gradient and its state
 * are, each a view (handle, byte offset) of a flat block in a backend's
 * memory (fr_backend's handles: host pointers on the CPU; a device's
 * buffers with their offsets, as fr_tensor's .buf and .off). The parameter
 * itself keeps its name, shape, role and data (model.h). */
typedef struct fr_optim_param {
    void *grad;         /* the gradient block (or, at ZeRO 2 and 3, a bucket's); NULL: none */
    size_t grad_off;    /* its byte offset there */
    fr_dtype grad_dt;   /* FR_F32, or the weights' 16-bit format (pure half precision) */
    int grad_valid;     /* 0: the next backward overwrites instead of adding */
    int grad_view;      /* grad is a transient bucket's (ZeRO 2 and 3), not the flat block */
    void *state[2];     /* the state blocks (momentum, or exp_avg and exp_avg_sq); NULL: none */
    size_t state_off;   /* the byte offset of this parameter's state in each */
    int state_kind;     /* fr_state_kind of Adam's moments (fp32, bf16, int8) */
    size_t state_bytes; /* its bytes in each block (the rule's parts: fr_optim_state_parts) */
} fr_optim_param;

/* One flat block of a backend's memory: every parameter's tensor of one
 * category end to end (fr_flat_place). */
typedef struct fr_optim_block {
    void *buf;            /* the backend's handle; NULL: none */
    size_t bytes;         /* its size, padding included */
    const fr_backend *be; /* whose memory */
    int host;             /* 1: host memory (buf is a pointer), 0: a device's */
} fr_optim_block;

/* Every parameter's records, by index (fr_optim_of), and the flat blocks
 * they are views of: the gradients (when kept: not those stepped inside
 * backward, not at ZeRO 2 and 3), their host copy under --offload
 * optimizer, the state (a ZeRO rank's: its range of each tensor only) and
 * a device's state brought to the host for a checkpoint. The host copies
 * have the layout of the blocks they copy. */
struct fr_optim {
    size_t n;
    fr_optim_param *p;
    fr_optim_block grads, host_grads;
    fr_optim_block state[2], host_state[2];
    fr_optim_block scratch; /* a device's step's scratch (fr_optim_scratch_bytes), or none */
};

/* The blocks take core/flat.h's layout (fr_flat_place: reverse parameter
 * order, each tensor at a multiple of its element: f32 4, 16-bit 2, int8
 * state 4 for its absmax floats). */
/* The alignment of a gradient in dt and of a state of kind (16-bit
 * weights' state: wide 0, else 1). */
size_t fr_optim_grad_align(fr_dtype dt);
size_t fr_optim_state_align(int kind, int half_weight);
/* A host block's bytes at a view (handle, off): the CPU's handle is its pointer. */
static inline void *fr_optim_at(void *handle, size_t off) {
    return handle ? (char *)handle + off : NULL;
}

/* Bytes of param i's gradient to keep (0: none) and its format *dt; of
 * its state (0: none), its format in *kind. */
typedef size_t (*fr_optim_size_fn)(const void *arg, size_t i, fr_dtype *dt);
typedef size_t (*fr_optim_state_fn)(const void *arg, size_t i, int *kind);
/* The gradient block's bytes (fr_flat_place's layout), and the block made
 * in be's memory (host: 1 when that is the host's, its handles pointers)
 * if there is none (zeros with `zero`: the data-parallel
 * buckets, views of it, are summed whole), its records pointed into it,
 * each to be overwritten by the next backward. */
size_t fr_optim_grads_bytes(const fr_model *m, fr_optim_size_fn size, const void *arg);
fr_status fr_optim_alloc_grads(fr_ctx *ctx, const fr_backend *be, int host, fr_model *m,
                               fr_optim_size_fn size, const void *arg, int zero);
/* --offload optimizer: the gradient block's host copy (same layout). */
fr_status fr_optim_alloc_host_grads(fr_ctx *ctx, fr_model *m);
/* One state block's bytes; the ns blocks made in be's memory if absent
 * (zeros, or a device's state loaded on the host: fr_model_to_host's
 * copy), the records pointed into them. A layout or format other than the
 * blocks' (a resumed run with another --optimizer-state) starts over. */
size_t fr_optim_state_block_bytes(const fr_model *m, fr_optim_state_fn size, const void *arg);
fr_status fr_optim_alloc_state(fr_ctx *ctx, const fr_backend *be, int host, fr_model *m, int ns,
                               fr_optim_state_fn size, const void *arg);
/* The step's scratch block in be's memory (bytes, category optimizer),
 * made if absent or of another size; none for 0 bytes. */
fr_status fr_optim_alloc_scratch(fr_ctx *ctx, const fr_backend *be, fr_model *m, size_t bytes);
/* A device's blocks to their host copies (made if absent) and back:
 * fr_model_to_host and fr_model_to_device. */
fr_status fr_optim_state_down(fr_model *m);
fr_status fr_optim_state_up(fr_model *m);
/* --offload optimizer: the gradients brought to the host copy. */
fr_status fr_optim_grads_down(fr_model *m);

/* m's optimizer records, made (all empty) on the first call; NULL when out
 * of memory (the error set). Freed with the model, buffers and all. */
struct fr_optim *fr_optim_of(fr_model *m);
/* What those records take of category other: bytes (reserved 0), or as the
 * allocator rounds their blocks (reserved 1). */
size_t fr_optim_meta_bytes(const fr_model *m, int reserved);
static inline fr_optim_param *fr_optp(const fr_model *m, size_t i) { return &m->optim->p[i]; }
/* Param i's gradient and state on the host (a CPU run: the buffers
 * themselves; a device's: what fr_model_to_host brought back); NULL: none. */
void *fr_optim_host_grad(const fr_model *m, size_t i);
void *fr_optim_host_state(const fr_model *m, size_t i, int k);
/* Introspection by parameter (tests, tools): p's host gradient as f32 or
 * 16-bit (NULL when it is the other format or has none), its host state k
 * and its state format. */
static inline size_t fr_param_index(const fr_model *m, const fr_param *p) {
    return (size_t)(p - m->params);
}
static inline float *fr_grad32(const fr_model *m, const fr_param *p) {
    if (!m->optim) return NULL;
    const fr_optim_param *q = fr_optp(m, fr_param_index(m, p));
    return q->grad_dt == FR_F32 ? (float *)fr_optim_host_grad(m, fr_param_index(m, p)) : NULL;
}
static inline uint16_t *fr_grad16(const fr_model *m, const fr_param *p) {
    if (!m->optim) return NULL;
    const fr_optim_param *q = fr_optp(m, fr_param_index(m, p));
    return q->grad_dt != FR_F32 ? (uint16_t *)fr_optim_host_grad(m, fr_param_index(m, p)) : NULL;
}
static inline void *fr_state_of(const fr_model *m, const fr_param *p, int k) {
    return fr_optim_host_state(m, fr_param_index(m, p), k);
}
static inline int fr_state_kind_of(const fr_model *m, const fr_param *p) {
    return m->optim ? fr_optp(m, fr_param_index(m, p))->state_kind : 0;
}
/* Bytes of one state buffer param i holds now, in its format (a 16-bit
 * weight's state in the weight's format; the rule's elements,
 * fr_optim_state_elems, on this rank); 0 without state. */
size_t fr_optim_held_bytes(const fr_model *m, size_t i);

/* The update rules' table (rules.c), one row per fr_optim_kind. */
#define FR_OPTIM_KINDS FR_OPTIM_KIND_COUNT /* fr_optim_kind's count */
/* The rule's name ("sgd": --optimizer, a checkpoint's "optimizer") and its
 * title in reports ("SGD"); "?" for a kind outside the table. */
const char *fr_optim_name(fr_optim_kind kind);
const char *fr_optim_title(fr_optim_kind kind);
/* Every rule's name, in kind order, joined by sep and, before the last, by
 * last ("sgd, adam or adamw"), into out (cap bytes, cut to fit); out. */
const char *fr_optim_names(char *out, size_t cap, const char *sep, const char *last);
/* State blocks the rule keeps under o (SGD 1 with momentum, else 0; Adam
 * and AdamW 2; Adafactor 1); what lies in them: fr_optim_state_parts. */
int fr_optim_states(const fr_optim_opts *o);
/* 1: the rule's state may be stored bf16 or int8 (--optimizer-state: Adam's
 * moments; SGD's momentum stays f32). */
int fr_optim_compresses(const fr_optim_opts *o);
/* 1: under o the step needs nothing but the gradient (SGD without
 * momentum): LINEAR_BWD may make it in its GEMM epilogue (plan/fuse.h). */
int fr_optim_in_gemm(const fr_optim_opts *o);
/* 1: on 16-bit weights the backend's kernel steps f32 working copies of one
 * tensor at a time (SGD; Adam is one fused pass without them). */
int fr_optim_f32_copies(const fr_optim_opts *o);
/* 1: the state holds squared gradients (exp_avg_sq), which underflow in
 * pure fp16. */
int fr_optim_squares(const fr_optim_opts *o);
/* 1: the rule takes --momentum, --dampening and --nesterov (SGD). */
int fr_optim_takes_momentum(fr_optim_kind kind);
/* The storage of one state buffer of p in format fmt (a compressible
 * rule's: bf16, int8 by blocks, small tensors keeping fp32; otherwise f32;
 * a 16-bit weight's state takes the weight's format); the kind in *kind. */
size_t fr_optim_state_bytes(const fr_optim_opts *o, fr_optim_state fmt, const fr_param *p,
                            int *kind);
/* One named tensor of a parameter's optimizer state, as PyTorch's
 * optimizer.state_dict() has it: its name, the state block it lies in, its
 * offset there in floats from the parameter's state_off, and its shape. */
typedef struct fr_state_part {
    const char *name;
    int block;
    size_t off;
    fr_shape shape;
} fr_state_part;
#define FR_STATE_PARTS_MAX 4
/* The f32 elements of one parameter of shape s in each state block (an
 * elementwise rule: numel; Adafactor: its factors, backend/state.h), and
 * its parts in out (their count: SGD momentum_buffer; Adam exp_avg in block
 * 0 and exp_avg_sq in block 1, each the parameter's shape at 0; Adafactor
 * row_var (..., R, 1) and col_var (..., 1, C), or variance, then exp_avg
 * with a first moment, all in block 0). */
size_t fr_optim_state_elems(const fr_optim_opts *o, const fr_shape *s);
int fr_optim_state_parts(const fr_optim_opts *o, const fr_shape *s,
                         fr_state_part out[FR_STATE_PARTS_MAX]);
/* The scratch a device's step of a parameter of shape s takes (Adafactor:
 * its sums' partials and per-slice floors, backend/state.h's
 * fr_factored_scratch; 0 for an elementwise rule): the optimizer holds one
 * block of the largest (fr_optim_alloc_scratch) and hands it to the
 * backend's step as state[1]. */
size_t fr_optim_scratch_bytes(const fr_optim_opts *o, const fr_shape *s);
/* 1: the step needs a whole tensor (Adafactor's factored state): no ZeRO
 * shard, f32 weights, f32 state. */
int fr_optim_whole_tensor(const fr_optim_opts *o);
/* The options the rule refuses, with a message naming the option: for a
 * whole-tensor rule a compressed state format fmt, pure 16-bit weights
 * (prec), ZeRO stage zero >= 1, and its hyper-parameters out of range. */
fr_status fr_optim_check(fr_ctx *ctx, const fr_optim_opts *o, fr_optim_state fmt, fr_precision prec,
                         int zero);

/* optimizer.step() for parameter i of m alone at step t (1-based), from its
 * gradient g as be's kernels see it (.data on the host; .buf and .off on a
 * device), on the weights and the state: the step inside backward of an
 * OPTIM_STEP node (plan/fuse.h), which the executor hands over once the
 * gradient is complete (exec.h's param_step), and the one
 * fr_optim_update takes for each parameter. The in-backward step steps one
 * tensor, the ordinary step all of them. */
fr_status fr_optim_step_param(fr_ctx *ctx, const fr_backend *be, const fr_optim_opts *o,
                              fr_model *m, size_t i, const fr_tensor *g, int64_t t);
/* optimizer.step() at step t (1-based) over every parameter i of m with a
 * gradient (gv[i] >= 0 and grad_valid) that was not updated inside
 * backward (fused NULL or fused[i] == 0), in parameter order, by be's
 * optim_update on the weights (.data on the host, .buf on a device), the
 * gradient (the host's copy when offloaded) and the state. */
fr_status fr_optim_update(fr_ctx *ctx, const fr_backend *be, const fr_optim_opts *o, fr_model *m,
                          const int *gv, const uint8_t *fused, int64_t t, int offloaded);
/* The step of q's parameter's elements [a, a + n) at t on the host:
 * weights w, f32 gradients g (the update is elementwise, so a ZeRO rank
 * steps its range; its state holds those elements only); and a range's
 * unscale (1: inf or NaN found), sum of squares and scaling. Through the
 * CPU backend's passes, as the whole-tensor ones. */
fr_status fr_optim_step_range(fr_ctx *ctx, const fr_optim_opts *o, fr_optim_param *q, float *w,
                              const float *g, size_t n, int64_t t);
int fr_optim_range_unscale(fr_ctx *ctx, float *g, size_t n, float inv);
double fr_optim_range_sumsq(fr_ctx *ctx, const float *g, size_t n);
void fr_optim_range_scale(fr_ctx *ctx, float *g, size_t n, float f);
/* The scaler's unscale: every gradient times inv, in one pass that looks for
 * inf or NaN; *found_inf 1 if it found one (the rest is left: the step is
 * skipped). */
fr_status fr_optim_unscale(fr_ctx *ctx, const fr_backend *be, fr_model *m, const int *gv, float inv,
                           int offloaded, int *found_inf);
/* clip_grad_norm_(max_norm, 2): the squares summed in double (fixed
 * blocks), tensors in order; the gradients scaled by the coefficient when
 * it is below 1. fr_optim_clip_coef is PyTorch's max_norm / (norm + 1e-6). */
fr_status fr_optim_clip(fr_ctx *ctx, const fr_backend *be, fr_model *m, const int *gv,
                        float max_norm, int offloaded);
float fr_optim_clip_coef(double sumsq, float max_norm);
/* After backward: the loss scaler's unscale and check (a non-finite loss
 * or gradient skips the step and backs the scale off), clipping (max_norm >
 * 0), the rule at ++*t, the scaler's growth. */
fr_status fr_optim_after_backward(fr_ctx *ctx, const fr_backend *be, fr_model *m,
                                  const fr_optim_opts *o, const int *gv, const uint8_t *fused,
                                  fr_scaler *sc, float max_norm, float loss, int64_t *t,
                                  int offloaded);
/* zero_grad: every gradient stale; with set_to_none (to_none) the buffers
 * released, but for buckets' views. */
void fr_optim_zero_grad(fr_model *m, int to_none);

#endif
