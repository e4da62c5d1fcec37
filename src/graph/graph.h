/* graph.h — the forward/backward IR: values (shape, dtype, kind) and nodes
 * (an op, its inputs and outputs, its attributes). The graph knows shapes and
 * dtypes, nothing of memory: sizes and lifetimes are the planner's business. */
#ifndef FR_GRAPH_H
#define FR_GRAPH_H

#include "core/ctx.h"
#include "core/tensor.h"
#include "ops/ops.h"

#define FR_MAX_IN 6
#define FR_MAX_OUT 5 /* LINEAR_CE_BWD: dx, dW, db, (labels: none), ws */

typedef enum fr_value_kind {
    FR_VAL_INPUT = 0, /* the batch's samples (bound at run time) */
    FR_VAL_LABEL,     /* the batch's labels or targets (bound at run time) */
    FR_VAL_PARAM,     /* a trainable weight (persistent, model-owned) */
    FR_VAL_BUFFER,    /* a non-trainable state tensor (BatchNorm running stats) */
    FR_VAL_GRAD,      /* a parameter's gradient (persistent, accumulates) */
    FR_VAL_STEP,      /* lives within one step: planned in the arena */
    FR_VAL_HOST,      /* a step value offloaded to host memory (an OFFLOAD's output,
                         plan/offload.c): not in the arena, bound by the executor */
} fr_value_kind;

typedef struct fr_value {
    fr_shape shape;
    fr_dtype dtype;
    fr_value_kind kind;
    int producer; /* node index, -1 for inputs, params, buffers */
    int alias_of; /* -1, or a value whose storage this one shares (views) */
    int param;    /* PARAM/BUFFER/GRAD: index into the model's tensors */
    int saved;    /* 1: a forward value read by some backward node */
    int batched;  /* 1: dim 0 is the batch (rebound when a batch is smaller) */
    int blocked;  /* 1: a 4-d (N,C,H,W) value stored nChw16c, oneDNN's blocked format:
                     element (n,c,h,w) at ((n C/16 + c/16) H W + h W + w) 16 + c%16
                     (plan/layout.c); 0: NCHW */
} fr_value;

/* Rotary position embeddings (ROPE_QKV), as Hugging Face's Llama: the
 * inverse frequencies of modeling_rope_utils.py's rope_type "default",
 * "linear" and "llama3" (backend/cpu/rope.c). */
#define FR_ROPE_DEFAULT 0
#define FR_ROPE_LINEAR 1
#define FR_ROPE_LLAMA3 2
typedef struct fr_rope {
    float theta;                             /* rope_theta (10000 for Llama 2); 0: no rotation */
    int type;                                /* FR_ROPE_DEFAULT, FR_ROPE_LINEAR, FR_ROPE_LLAMA3 */
    float factor;                            /* linear / llama3: the config's rope_scaling.factor */
    float low_freq_factor, high_freq_factor; /* llama3 */
    int orig_context;                        /* llama3: original_max_position_embeddings */
    int pos_from_step;                       /* 1 in generation's chunk graphs: row t is position
                          fr_kernel_call.step + t (as ATTENTION_KV); 0: position t */
} fr_rope;

/* Attributes of every op in one small struct; each op reads what it needs. */
typedef struct fr_attr {
    int kernel, stride, pad; /* conv and pool */
    int training;            /* batchnorm, dropout: 1 in training mode */
    /* the norms' pair or LINEAR_BWD's, never both: the node keeps its size */
    union {
        struct {
            float eps, momentum; /* norms */
        };
        struct {
            float lr, wd; /* LINEAR_BWD with update bits: plain SGD's rate and weight decay */
        };
    };
    float p;          /* dropout probability */
    float scale;      /* losses: multiply the gradient (1/K under accumulation);
                     * linear: y = scale (x W^T) + b, 0 read as 1 (LoRA's B product) */
    uint32_t salt;    /* dropout: per-node random stream */
    fr_shape shape;   /* view: the target shape (batch dim included) */
    int recompute;    /* a rematerialized clone: BatchNorm leaves running stats alone */
    fr_dtype dtype;   /* cast: the target dtype */
    fr_dtype round;   /* cast f32 -> f32: round through this 16-bit format (FR_F32: none) */
    int param;        /* optim_step: the model parameter it updates */
    int heads;        /* attention: number of heads NH (divides C) */
    int kv_heads;     /* attention, rope_qkv: key/value heads NKV (divides heads; grouped-query
                       attention); 0 means heads (multi-head) */
    fr_rope rope;     /* rope_qkv */
    int causal;       /* attention: 1 = query t attends keys 0..t (the only mode) */
    int approx;       /* gelu: 0 exact (erf), 1 tanh approximation (GPT-2) */
    int masked;       /* maxpool2d_bwd: dy only where x > 0 (the backward of the ReLU
                         that made x, folded into it: plan/fold.h) */
    int relu;         /* batchnorm: y = ReLU(y), the ReLU reading y folded into it (plan/fold.h) */
    int qfmt;         /* qlinear: the weight's format (fr_qfmt), attr.shape its (O, K) */
    int rows;         /* linear_ce: rows of logits a chunk (1 .. N; clamped to N) */
    uint32_t blocked; /* bit j: in[j] is nChw16c, bit FR_BLK_OUT + j: out[j] (fr_value.blocked,
                         set by plan/layout.c for the kernels) */
} fr_attr;

#define FR_BLK_OUT 8
static inline int fr_blk_in(const fr_attr *a, int j) { return (a->blocked >> j) & 1u; }
static inline int fr_blk_out(const fr_attr *a, int j) {
    return (a->blocked >> (FR_BLK_OUT + j)) & 1u;
}

typedef struct fr_node {
    fr_op op;
    int n_in, n_out;
    int in[FR_MAX_IN];   /* value ids, -1 for an absent optional input */
    int out[FR_MAX_OUT]; /* value ids, -1 for an output nobody wants */
    fr_attr attr;
    int fwd;             /* backward nodes: the forward node they differentiate; else -1 */
    int layer;           /* model layer index that emitted it (for per-layer tables) */
    uint32_t accumulate; /* bit i: out[i] is a parameter gradient to add into */
    uint32_t update;     /* bit i: out[i] is bound to the parameter itself, updated in place
                            with the gradient the node computes (the optimizer step in
                            backward, plan/fuse.h): LINEAR_BWD's kernel by plain SGD,
                            p = p + (-attr.lr)(g + attr.wd p); OPTIM_STEP by the optimizer */
} fr_node;

typedef struct fr_graph {
    fr_ctx *ctx;
    fr_value *vals;
    size_t n_vals, cap_vals;
    fr_node *nodes;
    size_t n_nodes, cap_nodes;
    int n_forward; /* nodes [0, n_forward) are the forward pass */
    /* logits: -1 where none is made (a head fused with its loss, LINEAR_CE);
     * hits: the batch's count of rows whose argmax is the label (i32 (1)),
     * where the loss op makes it (LINEAR_CE), else -1 */
    int input, label, loss, logits, hits;
    fr_status status; /* why the last fr_graph_node/fr_graph_value failed */
    /* the mixed-precision pass's 16-bit dtype while and after it runs
     * (fr_precision_apply), for the backend's answers on 16-bit inputs
     * (fr_backend.half_io); FR_F32 before it or without it */
    fr_dtype half;
} fr_graph;

void fr_graph_init(fr_graph *g, fr_ctx *ctx);
void fr_graph_release(fr_graph *g);

/* Add a value; returns its id or -1 (error set). */
int fr_graph_value(fr_graph *g, fr_value_kind kind, fr_dtype dt, fr_shape shape);
/* Add a node: runs the op's shape rule, creates its step-scoped outputs
 * (except those whose bit is set in `skip`, left -1) and stores their ids in
 * out_ids (may be NULL). Returns the node id or -1 with the error set. */
int fr_graph_node(fr_graph *g, fr_op op, const int *in, int n_in, const fr_attr *attr, int fwd,
                  uint32_t skip, int *out_ids);

/* Write a readable listing of the graph (for debugging and tests). */
void fr_graph_dump(const fr_graph *g, FILE *out);

#endif
