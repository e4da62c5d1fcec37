/* model.h — a model as the user built it: layers, each one op applied to
 * values made before it (the graph-level builder: fr_linear(m, x, ...)
 * returns the value it makes), the sequential calls (fr_model_linear, ...,
 * residual blocks) being that builder applied to the value made last; and
 * the parameter tensors the layers own, with PyTorch state_dict names. It
 * knows per-sample shapes and how to emit its forward graph; it knows
 * nothing of memory plans or kernels. */
#ifndef FR_MODEL_H
#define FR_MODEL_H

#include "graph/graph.h"
#include "io/safetensors.h"

typedef enum fr_layer_kind {
    FR_L_LINEAR = 0,
    FR_L_CONV2D,
    FR_L_MAXPOOL2D,
    FR_L_AVGPOOL2D,
    FR_L_GLOBAL_AVGPOOL,
    FR_L_RELU,
    FR_L_GELU,
    FR_L_SIGMOID,
    FR_L_TANH,
    FR_L_BATCHNORM,
    FR_L_LAYERNORM,
    FR_L_DROPOUT,
    FR_L_FLATTEN,
    FR_L_RES_BEGIN,
    FR_L_RES_SHORTCUT,
    FR_L_RES_END,
    FR_L_EMBEDDING,     /* token ids -> rows of a (vocab, dim) table */
    FR_L_POS_EMBEDDING, /* x + a (positions, dim) table's first T rows */
    FR_L_ATTENTION,     /* causal multi-head self-attention on (T, 3C) q|k|v */
    FR_L_ADD,           /* the sum of two values */
    FR_L_RMSNORM,       /* Llama's RMSNorm over the last dimension (weight only) */
    FR_L_SWIGLU,        /* silu(gate) * up of two values (Llama's MLP) */
    FR_L_ROPE_QKV,      /* q, k, v (three values) rotated and packed for attention */
    FR_L_COUNT
} fr_layer_kind;

typedef struct fr_layer {
    fr_layer_kind kind;
    int src[3]; /* the values it reads: a layer's index, FR_MODEL_INPUT, or FR_NO_VAL */
    int out, kernel, stride, pad, bias;
    int heads, approx; /* attention heads; GELU's tanh approximation */
    int kv_heads;      /* attention, rope_qkv: key/value heads (grouped-query); 0: heads */
    float eps;         /* the norms' epsilon (0: 1e-5) */
    fr_rope rope;      /* rope_qkv: the rotation's frequencies */
    float p;
    float std;          /* > 0: weights drawn from N(0, std^2), biases 0 (GPT-2's init) */
    int wparam, bparam; /* the weight and bias it reads (a tied weight is another layer's); -1 */
    char name[FR_ST_NAME_MAX]; /* state_dict prefix, e.g. "0", "fc1", "3.body.1" */
    fr_shape in, out_shape;    /* per sample (no batch dim) */
    int first_param, n_params;
    int frozen;
    int unit;       /* checkpointing unit: a weighted layer or residual block and what follows it */
    int index;      /* top-level nn.Sequential position */
    int checkpoint; /* marked for recomputation (the unit it starts) */
    /* LoRA (fr_model_lora): its adapters' params A (r, in) and B (out, r),
     * y = base(x) + lora_scale (dropout(x, lora_p) A^T) B^T; lora 0: none */
    int lora, lora_a, lora_b;
    float lora_scale, lora_p;
} fr_layer;

typedef enum fr_param_role {
    FR_P_WEIGHT = 0,
    FR_P_BIAS,
    FR_P_RUNNING_MEAN,
    FR_P_RUNNING_VAR,
    FR_P_NUM_BATCHES,
    FR_P_LORA_A, /* a LoRA adapter's down projection (r, in): trained, its layer's base frozen */
    FR_P_LORA_B  /* and its up projection (out, r), zeros at first */
} fr_param_role;

typedef struct fr_param {
    char name[FR_ST_NAME_MAX]; /* full state_dict name, e.g. "0.weight" */
    fr_shape shape;
    fr_dtype dtype;
    fr_param_role role;
    int trainable; /* a weight or bias (0 for buffers): its role, not whether it learns */
    int frozen;    /* no gradient: its layer is under --freeze, or it is a --lora base */
    int layer;
    int64_t fan_in;
    /* Its values on the host: the model's parameter block at byte off
     * (FR_MEM_PARAMS; core/flat.h's layout); at ZeRO 3 a trainable weight
     * is this rank's shard instead, data NULL outside a step's gather. */
    void *data;
    size_t off;
    /* On a device backend: the parameter block's copy in the device's
     * memory (a handle of its fr_mem), holding it at off, the current copy
     * while a step runs there (fr_model_to_host brings it back); NULL on the
     * CPU. Its gradient and optimizer state are the optimizer's
     * (optim/optim.h, model->optim). */
    void *ddata;
    /* 0, or 1 + fr_qfmt (quant/quant.h): a frozen linear weight stored in
     * fewer bits (fr_model_quantize_base): dtype FR_U8, shape (its bytes),
     * qshape the weight's (O, K); its layer runs QLINEAR */
    int quant;
    fr_shape qshape;
} fr_param;

/* Whether param p gets a gradient and an optimizer update. */
static inline int fr_param_learns(const fr_param *p) { return p->trainable && !p->frozen; }

#define FR_RES_MAX_DEPTH 4

/* A second state_dict name for a parameter (weight tying: nanoGPT's
 * lm_head.weight is transformer.wte.weight): saved under both names,
 * owned by one layer, read by two. */
typedef struct fr_alias {
    char name[FR_ST_NAME_MAX];
    int param; /* the parameter it names */
    int layer; /* the layer that reads it under this name */
} fr_alias;

struct fr_model {
    fr_ctx *ctx;
    fr_shape in;       /* per sample: (c, h, w), (features), or (context) token ids */
    fr_dtype in_dtype; /* FR_F32, or FR_I32 for token ids */
    int seq;           /* token models: positions a sample has in the graph (<= context) */
    fr_shape cur;      /* the shape of cur_val */
    int cur_val;       /* the value made last: what the sequential calls apply to */
    fr_layer *layers;
    size_t n_layers, cap_layers;
    fr_param *params;
    size_t n_params, cap_params;
    fr_loss loss;
    int top_index; /* next top-level sequential index */
    int depth;     /* open residual blocks */
    int res_layer[FR_RES_MAX_DEPTH];
    int res_index[FR_RES_MAX_DEPTH][2]; /* next body / shortcut index */
    int res_in_shortcut[FR_RES_MAX_DEPTH];
    fr_shape res_in[FR_RES_MAX_DEPTH], res_body_out[FR_RES_MAX_DEPTH];
    int res_in_val[FR_RES_MAX_DEPTH], res_body_val[FR_RES_MAX_DEPTH];
    int block, block_unit, block_index; /* an open fr_model_block_begin: one unit */
    fr_alias *alias;
    size_t n_alias, cap_alias;
    int initialised;
    fr_lora_cfg lora; /* the adapters fr_model_lora added (r 0: none) */
    int base_conv1d;  /* the weights last loaded had Hugging Face's Conv1D layout */
    int n_units;
    int default_batch; /* the model file's `default batch N` (0: none) */
    /* ZeRO 3 (parallel/pshard.h): the trainable weights it holds live as this
     * rank's shard, their data NULL outside a step's gather (NULL: none) */
    struct fr_pshard *shard;
    /* The parameter block: every parameter holding values, end to end
     * (fr_model_alloc_params); its device copy (place.c) */
    void *pblock;
    size_t pblock_bytes;
    void *dblock;
    fr_status status; /* why the last layer could not be added */
    /* The optimizer's gradients and state (optim/optim.h), made by the first
     * training step and kept for the next one compiled on the model; freed
     * with it through optim_free. */
    struct fr_optim *optim;
    void (*optim_free)(struct fr_model *m);
};

/* Forward graph for a batch of n: sets g->input, g->label, g->loss and
 * g->logits. training selects BatchNorm/Dropout modes. The parameter value
 * of model param i is param_value[i] (length n_params). head_rows (the step's
 * fr_step_opts.head_rows): non-zero where the model ends in a Linear layer
 * under cross-entropy fuses that head with the loss (LINEAR_CE, rows a chunk:
 * head_rows, or fr_model_head_rows_auto's for -1): g->logits is then -1 and
 * g->hits the op's count of argmax hits. */
fr_status fr_model_build_graph(fr_model *m, fr_graph *g, int n, int training, int head_rows,
                               int *param_value);
/* Whether the model's head can be fused with its loss (a last Linear layer
 * under cross-entropy); *V, *C its vocabulary and features when it can. */
int fr_model_fusable_head(const fr_model *m, int64_t *V, int64_t *C);
/* Liger's chunk of rows for N rows of C features over a vocabulary of V:
 * next_pow2(ceil(N / ceil(V / C))), at most N: transient logits about the
 * size of the head's input. */
int fr_model_head_rows_auto(int64_t N, int64_t C, int64_t V);
/* The forward graph of a chunk of generation (infer/generate.c): P positions
 * of one sequence, eval, no label or loss (g->logits is the last layer's
 * value). An attention layer li runs ATTENTION_KV over its caches, FR_VAL_BUFFER
 * values (1, heads, context, C / heads) the builder adds: kv[li] the keys,
 * kv[li] + 1 the values (-1 for other layers). A position table is read
 * through pos_rows[li], a value of the rows the chunk adds, (rows, C), which
 * the caller binds at the chunk's first position. The layers after the last
 * attention layer compute the last row only: what they read from before it
 * goes through LAST_ROW. Dropout passes its input on. */
typedef struct fr_chunk_graph {
    int P;         /* positions in the chunk */
    int Tc;        /* positions the caches hold (0: the model's context) */
    int *kv;       /* [n_layers], filled */
    int *pos_rows; /* [n_layers], filled */
} fr_chunk_graph;
fr_status fr_model_build_chunk_graph(fr_model *m, fr_graph *g, const fr_chunk_graph *c,
                                     int *param_value);
/* The parameter block made for every parameter that holds values (not a
 * ZeRO 3 shard's): zeros for those without values yet, the values of those
 * with them copied in. fr_model_relayout does the same with each
 * parameter's dtype dt[i] (f32 values narrowed to 16 bits; NULL: as is),
 * after ZeRO 3 took its shards (their values dropped) or model.half(). */
fr_status fr_model_alloc_params(fr_model *m);
fr_status fr_model_relayout(fr_model *m, const fr_dtype *dt);
/* The parameter block's bytes (padding included) with each parameter's
 * dtype dt[i] (NULL: its own), every one but ZeRO 3's shards. */
size_t fr_model_block_bytes(const fr_model *m, const fr_dtype *dt);
/* The longest layer name, at least `min`: a table's name column. */
int fr_model_name_width(const fr_model *m, int min);
/* The per-sample shape of value v (a layer's output or the model input). */
fr_shape fr_model_value_shape(const fr_model *m, int v);
/* model.half(): store weights and biases as dt (FR_F16 or FR_BF16). */
fr_status fr_model_to_dtype(fr_model *m, fr_dtype dt);
/* --base-precision: the weight of every frozen linear layer that owns it
 * alone (no other layer reads it: a tied head does not) stored in format b
 * from here on. On a model not yet allocated only the dtype and shape
 * change (planning; FR_BASE_FP32 there widens them back, so the planner can
 * weigh each format); on an allocated one FR_BASE_FP32 and FR_BASE_AUTO
 * change nothing, and another format's values
 * are quantized into a new block. Refused: no frozen linear layer, a
 * weight already stored in another format, a model sharded by ZeRO 3. */
fr_status fr_model_quantize_base(fr_model *m, fr_base_precision b);
/* The frozen linear weights --base-precision would store in fewer bits. */
int fr_model_quantizable(const fr_model *m);
/* The values of param p (fr_shape_numel(&p->shape) of them, or of qshape
 * when it is quantized) as f32 into dst. */
fr_status fr_param_read_f32(fr_ctx *ctx, const fr_param *p, float *dst);
/* Elements of the tensor p stands for: its qshape's when quantized. */
int64_t fr_param_numel(const fr_param *p);
const char *fr_layer_kind_name(fr_layer_kind k);
/* Initialise params first .. n_params - 1 as fr_model_init does (param i
 * from stream (seed, i)); the block must hold them. */
fr_status fr_model_init_params(fr_model *m, uint64_t seed, size_t first);
/* LoRA's part of layer li's forward (lora.c): out[0] (the output of its
 * base LINEAR, node base) plus the adapters' product of x, the sum's value
 * into out[0]; sets every node's layer to li and returns the sum's node
 * (-1 with g->status set). Dropout only when training. */
/* The Llama family's layers (the public ones are in frugal.h): q (T, heads
 * head_dim), k and v (T, kv_heads head_dim) rotated and packed as ATTENTION
 * reads them (kv_heads 0: heads). */
fr_val fr_rope_qkv(fr_model *m, fr_val q, fr_val k, fr_val v, int heads, int kv_heads,
                   const fr_rope *rope);
/* A Hugging Face model from its config.json (hf.c): path the file or its
 * directory. */
fr_model *fr_model_from_hf(fr_ctx *ctx, const char *path);
/* The same from a config's text (file names it in messages). */
fr_model *fr_model_from_hf_text(fr_ctx *ctx, const char *file, const char *text, size_t len);

int fr_lora_emit(fr_graph *g, const fr_layer *l, int li, int x, int base, const int *pv,
                 int training, int *out);

#endif
