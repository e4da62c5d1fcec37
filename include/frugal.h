/* frugal.h — the public C API of libfrugal.
 *
 * frugal trains neural networks on the CPU and accounts for every byte it
 * takes. A caller makes a context (which owns the accounting allocator and the
 * last error message), builds or loads a model, compiles a training step for a
 * batch size and optimizer, runs steps, and reads memory statistics.
 *
 * The conventions every declaration below follows:
 *  - A function that can fail returns an fr_status (FR_OK is 0) and leaves a
 *    message saying what failed (for a file: its name, the position and the
 *    fault) in fr_last_error(ctx), ctx being the context passed in or the
 *    one the model or step was made with. Nothing in the library calls
 *    exit() or abort().
 *  - A function that returns an object returns NULL on failure, the message
 *    on the context (except fr_ctx_new: NULL means the context itself could
 *    not be allocated).
 *  - A function that returns void or a plain value cannot fail. The report
 *    writers (fr_mem_summary, fr_model_describe, fr_step_describe_plan, ...)
 *    write to the caller's FILE and leave its errors to ferror(out).
 *  - Results go to out-parameters; they hold a result only on FR_OK.
 *  - The parse helpers (fr_optim_parse, fr_precision_parse) take a ctx that
 *    may be NULL: then only the status tells.
 *  - Objects (context, model, step) must not be NULL where one is expected;
 *    fr_*_free accepts NULL. Whatever a function allocates is accounted to
 *    the context, which must outlive every model and step made with it.
 *  - A choice among several is an enum, never a bare integer (switches are
 *    int 0/1); each enum keeps its values across versions.
 */
#ifndef FRUGAL_H
#define FRUGAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FR_VERSION "0.1.0"

/* What libfrugal.so exports: the functions declared here, nothing else (the
 * library is built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define FR_API __attribute__((visibility("default")))
#else
#define FR_API
#endif

typedef enum fr_status {
    FR_OK = 0,
    FR_ERR_NOMEM,   /* an allocation failed (or the budget refused it) */
    FR_ERR_IO,      /* a file could not be opened, read or written */
    FR_ERR_FORMAT,  /* a file's content is malformed */
    FR_ERR_SHAPE,   /* shapes do not chain */
    FR_ERR_ARG,     /* a bad argument or option */
    FR_ERR_NUMERIC, /* a non-finite loss or gradient */
    FR_ERR_BUDGET,  /* no plan fits the memory budget */
} fr_status;

typedef enum fr_dtype {
    FR_F32 = 0,
    FR_F16,
    FR_BF16,
    FR_I32,
    FR_U8,
    FR_I64,
    FR_DTYPE_COUNT
} fr_dtype;

/* Memory categories: every byte the engine takes carries one. */
typedef enum fr_mem_cat {
    FR_MEM_PARAMS = 0,  /* weights, biases and buffers (BatchNorm running stats) */
    FR_MEM_GRADS,       /* parameter gradients */
    FR_MEM_OPTIM,       /* optimizer state (momentum, Adam moments) */
    FR_MEM_ACTIVATIONS, /* forward values saved for backward */
    FR_MEM_WORKSPACE,   /* temporaries: unsaved forward values, activation grads, im2col */
    FR_MEM_DATA,        /* data batches, prefetch queue, dataset buffers */
    FR_MEM_OTHER,       /* graph, plan and model metadata */
    FR_MEM_KV_CACHE,    /* generation: keys and values of past positions */
    FR_MEM_CAT_COUNT
} fr_mem_cat;

FR_API const char *fr_mem_cat_name(fr_mem_cat cat);
FR_API const char *fr_dtype_name(fr_dtype dt);
FR_API size_t fr_dtype_size(fr_dtype dt);

/* Allocator statistics; the vocabulary is PyTorch's (torch.cuda.memory_stats):
 * "allocated" bytes are in use by live tensors, "reserved" bytes are held from
 * the system (allocated + cached free blocks + unused planned arena). */
typedef struct fr_mem_stats {
    size_t allocated[FR_MEM_CAT_COUNT];      /* current, per category */
    size_t allocated_peak[FR_MEM_CAT_COUNT]; /* peak, per category */
    size_t allocated_total;                  /* current, all categories */
    size_t allocated_total_peak;             /* peak of the sum (not the sum of peaks) */
    size_t reserved;                         /* current bytes held from the system */
    size_t reserved_peak;
    size_t cached;       /* free blocks kept for reuse (part of reserved) */
    size_t limit;        /* 0: none; otherwise reserved may never exceed it */
    uint64_t num_allocs; /* calls that returned memory */
    uint64_t num_frees;
    uint64_t num_cache_hits; /* allocations served from the cache */
    uint64_t num_ooms;       /* allocations refused (system or limit) */
} fr_mem_stats;

typedef struct fr_ctx fr_ctx;

FR_API fr_ctx *fr_ctx_new(void); /* NULL only if the context itself cannot be allocated */
FR_API void fr_ctx_free(fr_ctx *ctx);
FR_API const char *fr_last_error(const fr_ctx *ctx);
FR_API void fr_set_threads(fr_ctx *ctx, int threads); /* 0: OpenMP default */
FR_API int fr_get_threads(const fr_ctx *ctx);

FR_API void fr_mem_get_stats(const fr_ctx *ctx, fr_mem_stats *out);
FR_API void fr_mem_reset_peak(fr_ctx *ctx);
FR_API void fr_mem_empty_cache(fr_ctx *ctx); /* return cached free blocks to the system */
FR_API void fr_mem_set_limit(fr_ctx *ctx, size_t bytes);
/* Testing: make the n-th allocation from now fail (1 = the next); 0 disables. */
FR_API void fr_mem_fail_at(fr_ctx *ctx, uint64_t n);
/* Human summary in the spirit of torch.cuda.memory_summary(), and JSON. */
FR_API void fr_mem_summary(const fr_ctx *ctx, FILE *out);
FR_API void fr_mem_json(const fr_ctx *ctx, FILE *out);
/* Every rank's peak by category, as the min and max over the ranks of a
 * data-parallel run (lo and hi: FR_MEM_CAT_COUNT categories, then the
 * total allocated and the reserved peak): a table, or a JSON object's
 * members ("ranks": N, "rank_peaks": {...}) without braces. */
FR_API void fr_mem_ranks_summary(int ranks, const size_t *lo, const size_t *hi, FILE *out,
                                 int json);

/* ---- the CPU and its GEMM ----------------------------------------------
 * f32 GEMMs run on OpenBLAS, bf16 GEMMs (mixed precision) on oneDNN's matmul.
 * OpenBLAS (a DYNAMIC_ARCH build, as Debian's) picks its kernels by CPU model
 * when it is loaded; on a model it does not know it falls back to generic
 * SSE3 kernels (its "Prescott" core), at a third or less of an AVX-512
 * CPU's speed, or it takes a newer CPU for an older one (AVX2 kernels on an
 * AVX-512 CPU: half the speed where the FMA units are 512 bits wide), and
 * only OPENBLAS_CORETYPE in the environment at start-up changes that. So a
 * program that links frugal calls fr_cpu_setup(argv) first thing in main
 * (frugal's CLI does): if OpenBLAS runs narrower
 * vectors than the CPU has, it sets OPENBLAS_CORETYPE to the core the CPU's
 * features call for (SkylakeX for AVX-512, Haswell for AVX2) and starts the
 * program again, once.
 * FRUGAL_BLAS_FIX=0 in the environment keeps the core OpenBLAS chose. */

/* cpuid bits that the CPU has and the OS enables (saves their registers) */
typedef enum fr_cpu_feature {
    FR_CPU_SSE42 = 1 << 0,
    FR_CPU_AVX = 1 << 1,
    FR_CPU_FMA = 1 << 2,
    FR_CPU_AVX2 = 1 << 3,
    FR_CPU_AVX512F = 1 << 4,
    FR_CPU_AVX512_BF16 = 1 << 5,
    FR_CPU_AMX_TILE = 1 << 6,
    FR_CPU_AMX_BF16 = 1 << 7,
    FR_CPU_AVX512BW = 1 << 8,
    FR_CPU_AVX512VL = 1 << 9,
} fr_cpu_feature;

typedef struct fr_cpu_info {
    char model[64];        /* cpuid's brand string: "AMD EPYC", "Intel(R) Xeon(R) ..." */
    int family, model_id;  /* cpuid's display family and model (6 and 207, say) */
    unsigned features;     /* fr_cpu_feature bits */
    char blas[32];         /* "OpenBLAS 0.3.21" */
    char blas_core[32];    /* the kernels it runs: "SkylakeX", "Haswell", "Prescott" */
    int blas_dynamic;      /* built with DYNAMIC_ARCH: OPENBLAS_CORETYPE chooses the core */
    int blas_narrow;       /* blas_core's vectors are narrower than the CPU's: a generic
                            * fallback, or AVX2 kernels on an AVX-512 CPU */
    const char *best_core; /* the core for the CPU's features; NULL: none better than SSE */
    char fell_back[32];    /* the narrow core fr_cpu_setup restarted away from, or "" */
    char onednn_isa[32];   /* oneDNN's instruction set: "avx512_core_bf16"; "" without it */
    int bf16_native;       /* bf16 GEMMs run on oneDNN, not as f32 GEMMs of rounded operands */
} fr_cpu_info;

/* This process's CPU, described once (thread-safe) and never freed. */
FR_API const fr_cpu_info *fr_cpu(void);
/* A feature's name as /proc/cpuinfo spells it ("avx512_bf16"); NULL for a non-feature. */
FR_API const char *fr_cpu_feature_name(fr_cpu_feature f);
/* Returns 0 when nothing needs to change (or FRUGAL_BLAS_FIX=0, or this is
 * the restart); otherwise restarts the program (execv of /proc/self/exe with
 * argv, the environment changed as above) and returns -1 only if that failed. */
FR_API int fr_cpu_setup(char **argv);
/* One line saying what to set or install when OpenBLAS still runs a
 * narrower core than the CPU can (generic SSE3, or AVX2 on AVX-512), or
 * NULL; the CLI prints it on stderr. */
FR_API const char *fr_cpu_warning(void);

/* GFLOP/s of an n x n x n GEMM (n 512; the best of a few runs, about 0.2 s in
 * all on the first call, then cached) on the threads OpenMP has: OpenBLAS's
 * and oneDNN's f32 (dnnl_sgemm), and the bf16 GEMM of mixed precision (0
 * where it is not native, or without oneDNN). */
typedef struct fr_gemm_rates {
    int n, threads;
    double blas_f32, onednn_f32, bf16;
} fr_gemm_rates;
FR_API void fr_gemm_probe(fr_gemm_rates *out);

/* ---- models ------------------------------------------------------------ */

typedef struct fr_model fr_model;

typedef enum fr_loss { FR_LOSS_CROSS_ENTROPY = 0, FR_LOSS_MSE } fr_loss;

/* A sequential model whose per-sample input is (c, h, w); with h = w = 1 the
 * input is a flat vector of c features (an MLP). */
FR_API fr_model *fr_model_new(fr_ctx *ctx, int c, int h, int w);
FR_API void fr_model_free(fr_model *m);
FR_API fr_status fr_model_linear(fr_model *m, int out_features, int bias);
FR_API fr_status fr_model_conv2d(fr_model *m, int out_ch, int kernel, int stride, int padding,
                                 int bias);
FR_API fr_status fr_model_maxpool2d(fr_model *m, int kernel, int stride);
FR_API fr_status fr_model_avgpool2d(fr_model *m, int kernel, int stride);
FR_API fr_status fr_model_global_avgpool(fr_model *m);
FR_API fr_status fr_model_relu(fr_model *m);
FR_API fr_status fr_model_gelu(fr_model *m);
FR_API fr_status fr_model_sigmoid(fr_model *m);
FR_API fr_status fr_model_tanh(fr_model *m);
FR_API fr_status fr_model_batchnorm(fr_model *m); /* BatchNorm1d/2d, eps 1e-5, momentum 0.1 */
FR_API fr_status fr_model_layernorm(fr_model *m); /* over all non-batch dims, eps 1e-5 */
FR_API fr_status fr_model_dropout(fr_model *m, float p);
FR_API fr_status fr_model_flatten(fr_model *m);
/* Residual block: y = body(x) + shortcut(x). Layers added after begin go to
 * the body; after fr_model_shortcut they go to the shortcut (identity if none). */
FR_API fr_status fr_model_residual_begin(fr_model *m);
FR_API fr_status fr_model_residual_shortcut(fr_model *m);
FR_API fr_status fr_model_residual_end(fr_model *m);
FR_API fr_status fr_model_set_loss(fr_model *m, fr_loss loss);
/* Name the layer added last (its state_dict prefix); default: its index. */
FR_API fr_status fr_model_name_last(fr_model *m, const char *name);
/* Mark the layer (or residual block, when called right after
 * fr_model_residual_end) added last for recomputation, like PyTorch's
 * checkpoint(self.layer1, x): its activations are not kept for backward. */
FR_API fr_status fr_model_checkpoint_last(fr_model *m);
/* Freeze layers by state_dict prefix or top-level index, comma separated,
 * with ranges ("0-3,fc1"): no gradients, no optimizer state, nothing saved
 * for them, and no backward below the lowest trainable layer. */
FR_API fr_status fr_model_freeze(fr_model *m, const char *layers);
/* LoRA (PEFT's LoraConfig, bias "none"): low-rank adapters on linear layers,
 * y = base(x) + (dropout(x) A^T B^T) alpha / r with A (r, in) drawn as
 * PyTorch's kaiming_uniform_(a=sqrt(5)) and B (out, r) zeros; every other
 * parameter is frozen. targets: comma-separated layer names, each matching
 * a layer named it or ending in "." it, or a glob (fnmatch) on the whole
 * name. Parsed from "r=8,alpha=16,dropout=0.05,target=a,b" (target last:
 * it takes the rest). */
#define FR_LORA_TARGETS_MAX 512
typedef struct fr_lora_cfg {
    int r;          /* rank; 0: no adapters */
    double alpha;   /* lora_alpha (default 8, PEFT's): the scale is alpha / r */
    double dropout; /* lora_dropout on the adapter's input (default 0) */
    char targets[FR_LORA_TARGETS_MAX];
} fr_lora_cfg;
FR_API fr_status fr_lora_parse(fr_ctx *ctx, const char *spec, fr_lora_cfg *out);
/* Add adapters to the layers c->targets name (before the first training
 * step is built; on a model holding values the new A draws from seed's
 * streams, B is zero). Refused, with the model unchanged, for a target
 * matching no linear layer or a rank above a matched layer's smaller
 * dimension. */
FR_API fr_status fr_model_lora(fr_model *m, const fr_lora_cfg *c, uint64_t seed);
/* fr_lora_parse(spec) then fr_model_lora. */
FR_API fr_status fr_model_lora_spec(fr_model *m, const char *spec, uint64_t seed);
FR_API int fr_model_lora_rank(const fr_model *m); /* 0: no adapters */
/* Elements of the parameters that get a gradient (not frozen). */
FR_API size_t fr_model_num_trained(const fr_model *m);

/* ---- the graph-level builder ------------------------------------------
 * A model is a graph of values: the input, and the output of each layer.
 * Each call below adds one layer applied to values made before it and
 * returns the value it makes (FR_NO_VAL on failure, the message on the
 * context); the sequential calls above apply the same layers to the value
 * made last. The model's output is the value made last. Layers are named
 * by fr_model_name_last, as above. */
typedef int fr_val;
#define FR_MODEL_INPUT (-1) /* the model's input value */
#define FR_NO_VAL (-2)      /* no value: the call failed */

/* A language model's input: `context` token ids per sample (int32); the
 * loss is taken at every position. */
FR_API fr_model *fr_model_new_tokens(fr_ctx *ctx, int context);
FR_API fr_val fr_model_last_value(const fr_model *m);
FR_API fr_val fr_linear(fr_model *m, fr_val x, int out_features, int bias); /* over the last dim */
FR_API fr_val fr_add(fr_model *m, fr_val a, fr_val b);
FR_API fr_val fr_gelu(fr_model *m, fr_val x, int tanh_approx); /* GPT-2's: tanh_approx = 1 */
FR_API fr_val fr_relu(fr_model *m, fr_val x);
/* nn.LayerNorm(dim) over the last dimension, which must be dim. */
FR_API fr_val fr_layernorm(fr_model *m, fr_val x, int dim);
/* nn.Embedding(vocab, dim) of token ids: (T) -> (T, dim). */
FR_API fr_val fr_embedding(fr_model *m, fr_val tokens, int vocab, int dim);
/* x + nn.Embedding(positions, C)(arange(T)) for x (T, C), T <= positions. */
FR_API fr_val fr_pos_embedding(fr_model *m, fr_val x, int positions);
/* Causal multi-head self-attention: qkv (T, 3C) holds q, k, v along its last
 * dimension (the output of nanoGPT's c_attn), the result is (T, C), heads
 * dividing C. Computed in tiles: nothing T x T is stored. */
FR_API fr_val fr_attention(fr_model *m, fr_val qkv, int heads);
/* Grouped-query attention (Llama's num_key_value_heads): qkv (T, (heads + 2
 * kv_heads) head_dim) holds q's heads, then k's and v's kv_heads; query head
 * h reads key/value head h / (heads / kv_heads). kv_heads 0 or heads: as
 * fr_attention. */
FR_API fr_val fr_attention_gqa(fr_model *m, fr_val qkv, int heads, int kv_heads);
/* Llama's RMSNorm over the last dimension (dim): x / sqrt(mean(x^2) + eps)
 * times a weight (dim), in f32 (Hugging Face's LlamaRMSNorm). */
FR_API fr_val fr_rmsnorm(fr_model *m, fr_val x, int dim, float eps);
/* silu(gate) * up, gate and up of one shape (Llama's MLP before down_proj). */
FR_API fr_val fr_swiglu(fr_model *m, fr_val gate, fr_val up);
/* Initialise the last layer's weight from N(0, std^2) and its bias with 0
 * (GPT-2's initialisation) instead of PyTorch's default. */
FR_API fr_status fr_model_init_std_last(fr_model *m, float std);
/* Tie the last layer's weight (a linear's) to parameter `to` (a state_dict
 * name, or a layer's name for its weight), as nanoGPT ties lm_head to wte:
 * one tensor read by both, whose gradient is the sum of both uses, saved
 * under both names. */
FR_API fr_status fr_model_tie_last(fr_model *m, const char *to);
/* Layers added between begin and end form one checkpointing unit (a
 * transformer block): kept or recomputed as a whole. */
FR_API fr_status fr_model_block_begin(fr_model *m);
FR_API fr_status fr_model_block_end(fr_model *m);
/* Token models: the positions of a training sample (--seq), at most the
 * context; the default is the context. */
FR_API fr_status fr_model_set_seq(fr_model *m, int seq);
FR_API int fr_model_seq(const fr_model *m);     /* 0 for models without token input */
FR_API int fr_model_context(const fr_model *m); /* 0 for models without token input */

/* Load a model file (see README), a built-in name ("mlp", "cnn", "resnet",
 * "gpt-tiny", "gpt2"), or a Hugging Face config.json (LlamaForCausalLM,
 * MistralForCausalLM, GPT2LMHeadModel; the file or its directory). */
FR_API fr_model *fr_model_load(fr_ctx *ctx, const char *file_or_name);
/* PyTorch's default initialisation (kaiming_uniform_(a=sqrt(5)), bias
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), BatchNorm weight 1 bias 0), seeded. */
FR_API fr_status fr_model_init(fr_model *m, uint64_t seed);
FR_API size_t fr_model_num_params(const fr_model *m);
FR_API int fr_model_num_classes(const fr_model *m);
FR_API void fr_model_describe(const fr_model *m, FILE *out);

/* ---- optimizers -------------------------------------------------------- */

typedef enum fr_optim_kind {
    FR_OPTIM_SGD = 0,
    FR_OPTIM_ADAM,
    FR_OPTIM_ADAMW,
    FR_OPTIM_ADAFACTOR, /* torch.optim.Adafactor: factored second moment, relative step */
    FR_OPTIM_KIND_COUNT /* the number of rules (src/optim/rules.c has a row for each) */
} fr_optim_kind;

/* Defaults match PyTorch: fr_optim_defaults() fills them. The values are
 * doubles, as PyTorch's are Python floats: the kernels form 1 - beta2,
 * lr / (1 - beta1^t), ... in double and round to float once, as PyTorch does. */
typedef struct fr_optim_opts {
    fr_optim_kind kind;
    double lr;
    double momentum, dampening; /* SGD */
    int nesterov;               /* SGD */
    double weight_decay;        /* SGD/Adam: L2 added to grad; AdamW: decoupled */
    double beta1, beta2, eps;   /* Adam/AdamW; Adafactor: eps is eps1 (0: float32's 2^-23),
                                   beta1 its optional first moment (0: none) */
    double beta2_decay, eps2, clip_threshold; /* Adafactor: PyTorch's beta2_decay, eps[1], d */
    int zero_grad_to_none; /* zero_grad(set_to_none=True): release grad buffers */
} fr_optim_opts;

FR_API fr_optim_opts fr_optim_defaults(fr_optim_kind kind);
/* "sgd", "adam", "adamw" or "adafactor", in any letter case. */
FR_API fr_status fr_optim_parse(fr_ctx *ctx, const char *name, fr_optim_kind *out);

/* ---- training steps ---------------------------------------------------- */

typedef struct fr_step fr_step;

/* Activation checkpointing (rematerialization). */
typedef enum fr_ckpt_mode {
    FR_CKPT_MARKS = 0, /* only what the model marks (fr_model_checkpoint_last); the default */
    FR_CKPT_NONE,      /* keep everything, ignore marks */
    FR_CKPT_ALL,       /* recompute every top-level layer before its backward */
    FR_CKPT_SQRT,      /* segments of about sqrt(n) layers */
    FR_CKPT_EVERY,     /* segments of ckpt_arg layers */
    FR_CKPT_SEGMENTS,  /* PyTorch's checkpoint_sequential(ckpt_arg segments): size floor(n/N),
                          the last segment not checkpointed */
    FR_CKPT_REVOLVE,   /* binomial checkpointing with ckpt_arg stored states */
    FR_CKPT_AUTO,      /* the least recompute that fits the budget */
} fr_ckpt_mode;

/* Precision. *-mixed keeps fp32 master weights and optimizer state and stores
 * the activations saved for backward in 16 bits; pure fp16/bf16 also stores
 * the weights in 16 bits (model.half()). */
typedef enum fr_precision {
    FR_PREC_FP32 = 0,
    FR_PREC_BF16,
    FR_PREC_FP16,
    FR_PREC_BF16_MIXED,
    FR_PREC_FP16_MIXED,
    FR_PREC_AUTO, /* the planner may choose bf16-mixed to fit a budget */
} fr_precision;
FR_API const char *fr_precision_name(fr_precision p);
/* The names fr_precision_name gives: "fp32", "bf16", "fp16", "bf16-mixed",
 * "fp16-mixed", "auto". */
FR_API fr_status fr_precision_parse(fr_ctx *ctx, const char *name, fr_precision *out);

/* How frozen linear weights are stored (--base-precision): as loaded (fp32),
 * or in bf16, int8 (one absmax scale per output row) or NF4 (QLoRA's 4-bit
 * blocks of 64, double-quantized scales); the layer's GEMMs widen a tile of
 * rows at a time. Only the weights of frozen linear layers (--freeze, or
 * the base under --lora) that no other layer shares are stored so. */
typedef enum fr_base_precision {
    FR_BASE_FP32 = 0,
    FR_BASE_BF16,
    FR_BASE_INT8,
    FR_BASE_NF4,
    FR_BASE_AUTO, /* under a budget: the most precise of the four whose plan fits */
} fr_base_precision;
FR_API const char *fr_base_precision_name(fr_base_precision b);
/* "fp32", "bf16", "int8", "nf4", "auto" */
FR_API fr_status fr_base_precision_parse(fr_ctx *ctx, const char *name, fr_base_precision *out);

/* How Adam/AdamW store their two moments (SGD's momentum is always fp32).
 * Tensors too small to fill one int8 block keep fp32. */
typedef enum fr_optim_state {
    FR_OPTIM_STATE_FP32 = 0,
    FR_OPTIM_STATE_BF16 = 1,
    FR_OPTIM_STATE_INT8 = 2, /* block-wise dynamic quantization (bitsandbytes' 8-bit Adam) */
} fr_optim_state;

/* The loss scaler (torch.amp.GradScaler's dynamic scaling). */
typedef enum fr_loss_scaling {
    FR_LOSS_SCALE_AUTO = 0,    /* dynamic for fp16 and fp16-mixed, none otherwise; the default */
    FR_LOSS_SCALE_DYNAMIC = 1, /* dynamic whatever the precision */
    FR_LOSS_SCALE_NONE = -1,   /* never */
} fr_loss_scaling;

/* What --offload moves to the host on a device (flags, or'd). */
typedef enum fr_offload {
    FR_OFFLOAD_NONE = 0,
    FR_OFFLOAD_OPTIMIZER = 1,  /* the optimizer's state and step (ZeRO-Offload) */
    FR_OFFLOAD_ACTIVATIONS = 2 /* values saved for backward (save_on_cpu) */
} fr_offload;

typedef struct fr_step_opts {
    int batch;    /* samples per step */
    int training; /* 1: forward+backward+update; 0: eval (no backward state at all) */
    fr_optim_opts optim;
    uint64_t seed; /* dropout stream */
    fr_ckpt_mode checkpoint;
    int ckpt_arg;    /* N for every:N, segments N, revolve slots */
    int micro_batch; /* 0: the whole batch; else split it and accumulate gradients */
    size_t budget;   /* bytes for auto planning (0: none) */
    fr_precision precision;
    fr_base_precision base_precision; /* frozen linear weights (fr_base_precision) */
    fr_optim_state optim_state;       /* Adam/AdamW moments */
    float clip_grad_norm;             /* > 0: clip the global L2 norm (after unscaling) */
    fr_loss_scaling loss_scaling;
    /* 0: without a loss scaler, clipping or micro-batches, each f32 parameter
     * takes its optimizer step inside backward right after its gradient is
     * computed, and no gradient buffer is kept for it (plain SGD inside the
     * Linear kernel; momentum SGD, Adam, AdamW by a step node, the gradient a
     * short-lived arena value); the results are bit for bit those of 1: keep
     * every parameter gradient and update after backward. */
    int keep_grads;
    /* On a device (--offload): FR_OFFLOAD_OPTIMIZER keeps the optimizer's
     * state and step on the host (ZeRO-Offload): each gradient is copied
     * down after backward and each updated weight up. FR_OFFLOAD_ACTIVATIONS
     * (torch.autograd.graph.save_on_cpu) copies each value saved for backward
     * (4 KiB or more) to host memory after its last forward use and back
     * right before its first backward reader: the step's arena shrinks by
     * them, the host holds them (category activations). Same losses, bit for
     * bit; on the CPU backend both copies are host memory. */
    fr_offload offload;
    /* On a device, training: 0 uploads the next batch into a second device
     * slot while the step runs (fr_feed); 1 writes each micro-batch when its
     * step starts, nothing ahead (the same losses, bit for bit). */
    int sync_upload;
    /* One rank's step under data parallelism (keep_grads forced to 1: the
     * sums come before any update): 1 when the run keeps the step inside
     * backward. At ZeRO stage 2 or 3, without a loss scaler, clipping or
     * micro-batches, each gradient bucket's owned share then takes its
     * optimizer step as soon as its reduce-scatter arrives, during backward,
     * and no gradient shard is kept; the same bits as after backward. */
    int rank_step_in_backward;
    /* Data parallel (mpirun): the ranks the global batch is split over (0 or
     * 1: one process), the ZeRO stage (0: every rank holds everything; 1:
     * optimizer state sharded; 2: gradients too; 3: weights too), the
     * gradient buckets' caps in bytes (0: DDP's 1 MiB first, 25 MiB after)
     * and no_overlap (1: the buckets are summed after backward, not during). */
    int ranks, zero;
    size_t bucket_first_cap, bucket_cap;
    int no_overlap;
    /* A language model's head fused with its cross-entropy (--fused-head):
     * 0 stores the N x V logits as a plain Linear then the loss do (the
     * default); > 0 makes them that many rows at a time, reduced to the loss
     * at once and made again in backward, so neither the logits nor their
     * gradient exist (Liger's FusedLinearCrossEntropy, Cut Cross-Entropy);
     * -1 picks the rows: Liger's rule, next_pow2(ceil(N / ceil(V / C))), or
     * under a budget the planner's choice. Only where the model ends in a
     * Linear layer under cross-entropy; elsewhere ignored. */
    int head_rows;
} fr_step_opts;

/* The loss scaler's state: current scale and steps skipped for inf/NaN. */
FR_API void fr_step_scaler(const fr_step *s, float *scale, uint64_t *skipped);

/* The largest batch (<= max_batch) whose plan with opts (opts->budget, and
 * its checkpoint mode; FR_CKPT_AUTO: any schedule) fits, in *batch;
 * FR_ERR_BUDGET if not even a batch of 1 does. */
FR_API fr_status fr_batch_auto(fr_model *m, const fr_step_opts *opts, int max_batch, int *batch);

/* The memory timeline (what `frugal profile` writes): start recording every
 * allocation and free with its op and category, then write the record as
 * Chrome Trace Event JSON and as an SVG chart (budget 0: no budget line). */
FR_API void fr_mem_trace(fr_ctx *ctx, int on);
FR_API fr_status fr_timeline_chrome(fr_ctx *ctx, const char *path);
FR_API fr_status fr_timeline_svg(fr_ctx *ctx, const char *path, const char *title, size_t budget);

/* A batch: images as f32 (n, c, h, w) row-major, labels as i32 (n) for
 * cross-entropy or f32 targets (n, classes) for MSE; for a token model,
 * idx and y, both i32 (n, seq). */
typedef struct fr_batch {
    int n;
    const float *x;
    const int32_t *y;
    const float *target;
    const int32_t *idx; /* token models: (n, seq) token ids, with y (n, seq) the next ones */
} fr_batch;

/* Compile a step: the graph, its backward, the schedule of kept and
 * recomputed activations, and the memory plan (opts->budget or FR_CKPT_AUTO:
 * the plan that fits the budget), then allocate what running it needs.
 * The model stays the caller's and must outlive the step; the step keeps a
 * pointer to it and to its context, not a copy. Compiling changes the model:
 *  - an uninitialised model is initialised first (fr_model_init with
 *    opts->seed);
 *  - FR_PREC_FP16 and FR_PREC_BF16 (pure 16 bits, model.half()) convert the
 *    weights and biases to 16 bits in place, for good (BatchNorm's running
 *    statistics stay fp32); a later step on the same model keeps them so;
 *  - when training, the gradient buffers and the optimizer state are
 *    allocated on the model's parameters: they belong to the model, are
 *    reused (optimizer state included) by the next step compiled on it, and
 *    are freed by fr_model_free.
 * The step owns the graph, the plan and the activation arena; fr_step_free
 * releases them (and leaves the model as it is). On failure: NULL, the
 * message on the model's context, and any of the changes above that were
 * made stay made. */
FR_API fr_step *fr_step_compile(fr_model *m, const fr_step_opts *opts);
FR_API void fr_step_free(fr_step *s);
/* One step: forward, and when training backward and the optimizer update.
 * loss receives the mean loss; correct (may be NULL) the number of argmax hits. */
FR_API fr_status fr_step_run(fr_step *s, const fr_batch *b, float *loss, int *correct);
/* Predicted peak bytes of one step by category (the plan the step runs). */
FR_API void fr_step_predicted(const fr_step *s, size_t out[FR_MEM_CAT_COUNT], size_t *peak_total);
/* What the plan chose: micro-batch, recomputed layers, extra FLOPs as a
 * fraction of one step's, and the bytes it reserves (persistent + arena). */
typedef struct fr_plan_info {
    int micro_batch, accumulate;
    int units, recomputed_units;
    double flops, extra_flops;
    size_t reserved; /* parameters + gradients + optimizer state + arena + one batch */
    size_t arena;
    fr_ckpt_mode mode;
    int ckpt_arg;
} fr_plan_info;
FR_API void fr_step_plan_info(const fr_step *s, fr_plan_info *out);
/* Write the step's plan (text or JSON): kept and recomputed layers, in-place
 * ops, micro-batching, predicted peak by category and extra compute. */
FR_API void fr_step_describe_plan(const fr_step *s, FILE *out, int json);
/* Per-layer table of bytes (the `frugal estimate` table). */
FR_API void fr_step_estimate_table(const fr_step *s, FILE *out, int json);

/* ---- checkpoints (safetensors, PyTorch state_dict names) --------------- */

FR_API fr_status fr_save(fr_step *s, const char *path); /* weights + optimizer state */
FR_API fr_status fr_load(fr_step *s, const char *path); /* restores what save wrote */
/* Weights only, strictly (every tensor the model has, no other): path a
 * safetensors file, a Hugging Face index (model.safetensors.index.json and
 * its shards), or a directory holding model.safetensors or the index. */
FR_API fr_status fr_model_load_weights(fr_model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif
