/* ops.h — the one table of ops. Each op is registered exactly once, in the
 * FR_OPS X-macro below and in the table in ops.c: its name, arity, shape
 * rule, kernel, backward rule, whether its output may take an input's storage,
 * and its cost. A static assert keeps the table and the enum in step. */
#ifndef FR_OPS_H
#define FR_OPS_H

#include <stdint.h>
#include "core/tensor.h"

/* A backward op's out[i] is the gradient of its forward op's input i (-1
 * where none is wanted: EMBEDDING_BWD's ids, POS_EMBEDDING_BWD's x, whose
 * gradient is dy itself); outputs past the forward's inputs are workspace.
 * The GPT ops (shapes in backend/cpu/kernels.h):
 *   EMBEDDING          idx (B,T) i32, W (V,C)      -> y (B,T,C)
 *   POS_EMBEDDING      x (B,T,C), W (Tmax,C)       -> y = x + W[t]
 *   ATTENTION          qkv (B,T,3C)                -> y (B,T,C), lse (B,NH,T), ws
 *   ATTENTION_BWD      dy, qkv, y, lse             -> dqkv, D (B,NH,T), ws
 * LINEAR, LAYERNORM and CROSS_ENTROPY take (B,T,C) as B T rows.
 * OFFLOAD x -> h copies a device value to host memory (h is FR_VAL_HOST,
 * outside the arena); FETCH h -> x' copies it back into a fresh arena value.
 * Both are inserted after autodiff (plan/offload.c): no backward rule.
 * Generation's ops (infer/generate.c), forward only (no backward rule):
 *   ATTENTION_KV  qkv (B,P,3C), K, V (B,NH,Tc,HS)  -> y (B,P,C), ws
 *                 a chunk of P positions from pos = fr_kernel_call.step (the
 *                 executor's step argument): its keys and values written into
 *                 the caches K, V (persistent values, rows pos .. pos+P-1),
 *                 query row t attending positions 0 .. pos+t of the caches
 *   LAST_ROW      x (B,T,...)                      -> y (B,1,...) = x[:, T-1]
 * A frozen weight stored in fewer bits (quant/quant.h), attr.qfmt its format
 * and attr.shape its (O, K):
 *   QLINEAR       x (..., K), Wq u8 (bytes), b (O) | absent -> y (..., O), ws
 *                 y = x W'^T + b, W' dequantized a tile at a time into ws
 *   QLINEAR_BWD   dy (..., O), Wq                  -> dx, -, -, ws
 *                 dx = dy W' (the weight and its bias get no gradient)
 * The head and its loss fused (a language model's logits never stored):
 *   LINEAR_CE      x (N,C) or (B,T,C), W (V,C), b (V)|absent, y (N) or (B,T) i32
 *                  -> loss (1) = mean_n (logsumexp(z_n) - z_n[y_n]), z = x W^T + b,
 *                     hits (1) i32 (rows whose first argmax is y_n), ws
 *   LINEAR_CE_BWD  x, W, b, y -> dx, dW, db, (y: -1), ws: each chunk's logits made
 *                  again, its lse with them, dz = scale (softmax(z) - onehot(y)) / N
 *                  turned into dx = dz W, dW += dz^T x, db += sum dz at once
 *   attr.rows logits rows a chunk (ws holds one chunk's logits).
 * The Llama family's norm and MLP gate (f32; backend/cpu/rmsnorm.c, swiglu.c):
 *   RMSNORM      x (B,T,C) or (N,C), w (C)        -> y (x's shape), rstd (B,T) or (N)
 *                rstd = 1/sqrt(mean_c x^2 + attr.eps), y = w (x rstd) (HF LlamaRMSNorm)
 *   RMSNORM_BWD  dy, x, w, rstd                  -> dx, dw
 *   SWIGLU       gate, up (same shape)           -> y = silu(gate) up, silu(g) = g sigmoid(g)
 *   SWIGLU_BWD   dy, gate, up                    -> dgate, dup
 * Grouped-query attention (attr.kv_heads NKV dividing NH; 0: NH): ATTENTION's
 * qkv is (B,T,(NH+2NKV)HS), [q heads | k heads | v heads], query head h
 * reading kv head h / (NH/NKV); ATTENTION_KV's caches are (B,NKV,Tc,HS).
 * Rotary position embeddings (Llama's; backend/cpu/rope.h has the formulas):
 *   ROPE_QKV      q (B,T,NH*HS), k, v (B,T,NKV*HS) -> qkv (B,T,(NH+2NKV)HS)
 *                 = [rot(q) | rot(k) | v], attr.heads, attr.kv_heads, attr.rope;
 *                 row t at position t (attr.rope.pos_from_step: step + t)
 *   ROPE_QKV_BWD  dqkv -> dq, dk, dv (the inverse rotation; dv copied) */
/*  NAME, name (its kernels are fr_k_name, fr_cl_k_name, ...), n_in, n_out */
#define FR_OPS(X)                                   \
    X(LINEAR, linear, 3, 1)                         \
    X(LINEAR_BWD, linear_bwd, 3, 3)                 \
    X(CONV2D, conv2d, 3, 2)                         \
    X(CONV2D_BWD, conv2d_bwd, 3, 4)                 \
    X(MAXPOOL2D, maxpool2d, 1, 1)                   \
    X(MAXPOOL2D_BWD, maxpool2d_bwd, 3, 1)           \
    X(AVGPOOL2D, avgpool2d, 1, 1)                   \
    X(AVGPOOL2D_BWD, avgpool2d_bwd, 1, 1)           \
    X(GLOBAL_AVGPOOL, global_avgpool, 1, 1)         \
    X(GLOBAL_AVGPOOL_BWD, global_avgpool_bwd, 1, 1) \
    X(RELU, relu, 1, 1)                             \
    X(RELU_BWD, relu_bwd, 2, 1)                     \
    X(GELU, gelu, 1, 1)                             \
    X(GELU_BWD, gelu_bwd, 2, 1)                     \
    X(SIGMOID, sigmoid, 1, 1)                       \
    X(SIGMOID_BWD, sigmoid_bwd, 2, 1)               \
    X(TANH, tanh, 1, 1)                             \
    X(TANH_BWD, tanh_bwd, 2, 1)                     \
    X(BATCHNORM, batchnorm, 5, 3)                   \
    X(BATCHNORM_BWD, batchnorm_bwd, 5, 3)           \
    X(LAYERNORM, layernorm, 3, 3)                   \
    X(LAYERNORM_BWD, layernorm_bwd, 5, 3)           \
    X(DROPOUT, dropout, 1, 2)                       \
    X(DROPOUT_BWD, dropout_bwd, 2, 1)               \
    X(ADD, add, 2, 1)                               \
    X(COPY, copy, 1, 1)                             \
    X(CAST, cast, 1, 1)                             \
    X(VIEW, view, 1, 1)                             \
    X(CROSS_ENTROPY, cross_entropy, 2, 1)           \
    X(CROSS_ENTROPY_BWD, cross_entropy_bwd, 2, 1)   \
    X(MSE, mse, 2, 1)                               \
    X(MSE_BWD, mse_bwd, 2, 1)                       \
    X(OPTIM_STEP, optim_step, 1, 1)                 \
    X(EMBEDDING, embedding, 2, 1)                   \
    X(EMBEDDING_BWD, embedding_bwd, 2, 2)           \
    X(POS_EMBEDDING, pos_embedding, 2, 1)           \
    X(POS_EMBEDDING_BWD, pos_embedding_bwd, 1, 2)   \
    X(ATTENTION, attention, 1, 3)                   \
    X(ATTENTION_BWD, attention_bwd, 4, 3)           \
    X(OFFLOAD, offload, 1, 1)                       \
    X(FETCH, fetch, 1, 1)                           \
    X(ATTENTION_KV, attention_kv, 3, 2)             \
    X(LAST_ROW, last_row, 1, 1)                     \
    X(QLINEAR, qlinear, 3, 2)                       \
    X(QLINEAR_BWD, qlinear_bwd, 2, 4)               \
    X(LINEAR_CE, linear_ce, 4, 3)                   \
    X(LINEAR_CE_BWD, linear_ce_bwd, 4, 5)           \
    X(RMSNORM, rmsnorm, 2, 2)                       \
    X(RMSNORM_BWD, rmsnorm_bwd, 4, 2)               \
    X(SWIGLU, swiglu, 2, 1)                         \
    X(SWIGLU_BWD, swiglu_bwd, 3, 2)                 \
    X(ROPE_QKV, rope_qkv, 3, 1)                     \
    X(ROPE_QKV_BWD, rope_qkv_bwd, 1, 3)

typedef enum fr_op {
#define FR_OP_ENUM(NAME, name, nin, nout) FR_OP_##NAME,
    FR_OPS(FR_OP_ENUM)
#undef FR_OP_ENUM
        FR_OP_COUNT
} fr_op;

struct fr_graph;
struct fr_node;
struct fr_kernel_call;

/* Shape rule: fill the output shapes, dtypes and batched flags of node n
 * (whose inputs are in g); return 0 or an fr_status with the error set. */
typedef int (*fr_shape_fn)(struct fr_graph *g, struct fr_node *n, fr_shape *out, fr_dtype *dt,
                           uint8_t *batched);
typedef int (*fr_kernel_fn)(struct fr_kernel_call *c);
/* Backward rule: given the gradient value of each output (-1: none) and
 * which inputs need a gradient, add backward nodes to g and store the
 * gradient value of each input (-1: none) in din. Returns 0 or a status. */
typedef int (*fr_backward_fn)(struct fr_graph *g, int node, const int *dout, const uint8_t *need,
                              int *din);
/* Cost: forward multiply-adds counted as 2 FLOPs. */
typedef double (*fr_flops_fn)(const struct fr_graph *g, const struct fr_node *n);
/* Whether node n's kernel reads input j as f16/bf16 itself (widening exactly
 * as it goes), so the mixed-precision pass may hand it the 16-bit value. */
typedef int (*fr_half_in_fn)(const struct fr_graph *g, const struct fr_node *n, int j);
/* Whether node n's kernel can write out[0] as f16/bf16 (rounding its f32
 * result), so the pass may bind the saved 16-bit value there directly.
 * Where either is a limit of the kernel (a plane on its stack, one path of
 * a convolution), the context's backend answers (fr_backend.half_io). */
typedef int (*fr_half_out_fn)(const struct fr_graph *g, const struct fr_node *n);
/* (The same type:) whether node n's kernel, writing out[0] in f32, can also
 * write it rounded to the pass's 16-bit dtype into one more output that the
 * pass appends (out[n_out], n_out raised by one), so that a value read in
 * f32 by forward and saved in 16 bits for backward (the residual stream
 * LayerNorm reads) is written once and not read again by a CAST. Asked of
 * the backend (fr_backend.half_io, j = -2). */
/* What the shape rules ask of the context's backend (fr_backend's ws_elems
 * and half_io): the elements of node n's workspace output j (j = -1: the
 * step's GEMM scratch), and whether its kernel takes input j (-1: writes
 * out[0]) in 16 bits. Declared here, where they are asked, and defined by
 * backend/ (cpu/table.c), which fills this table's kernels: the op table
 * includes nothing of the backends. */
int64_t fr_backend_ws(const struct fr_graph *g, const struct fr_node *n, int j);
/* (half_io's j = -2: writes the 16-bit copy of out[0], fr_op_info.half_copy) */
int fr_backend_half_io(const struct fr_graph *g, const struct fr_node *n, int j);
/* Workspaces are sized when a node is made, for its inputs' dtypes and
 * layouts then; a convolution's depends on both (the CPU runs a bf16 image
 * on oneDNN's native kernels, and reorders only NCHW operands), so the
 * passes that change them (plan/precision.c, plan/layout.c) size the
 * convolutions of order[0..n) again, and attention's backward, which sums
 * a 16-bit dqkv in f32 in its workspace. */
void fr_ops_resize_ws(struct fr_graph *g, const int *order, int n);

typedef struct fr_op_info {
    const char *name;
    int n_in, n_out;
    fr_shape_fn shape;
    fr_backward_fn backward; /* NULL: not differentiable (backward ops, losses' labels) */
    int inplace_in;          /* input whose storage out[0] may take when it dies here; -1 */
    int view;                /* out[0] always shares in[0]'s storage (no copy at all) */
    fr_flops_fn flops;
    fr_half_in_fn half_in;   /* NULL: every input must be f32 (or its own dtype) */
    fr_half_out_fn half_out; /* NULL: out[0] is f32 */
    int loss_bwd; /* a loss's backward: attr.scale is the step's loss scale (micro-batches,
                     the scaler), its input gradient the start of backward */
    fr_half_out_fn half_copy; /* NULL: no 16-bit copy of out[0] */
} fr_op_info;

extern const fr_op_info fr_op_table[FR_OP_COUNT];

static inline const fr_op_info *fr_op_get(fr_op op) { return &fr_op_table[op]; }

/* The rows of a LINEAR or LINEAR_BWD node's GEMMs (samples times
 * positions): x's rows of K values, or, in a backward without x (its
 * weight gets no gradient), dy's rows of O; 0 for any other node or a W
 * that is not (O, K) with O, K >= 1. */
int64_t fr_op_linear_rows(const struct fr_graph *g, const struct fr_node *n);

/* Rows of logits a chunk of a LINEAR_CE node (or its backward) makes at
 * once: attr.rows, clamped to 1 .. N (0 or more than N: N, one chunk); 0
 * for any other node. */
int64_t fr_op_ce_chunk_rows(const struct fr_graph *g, const struct fr_node *n);

#endif
