/* model.h — a model as the user built it: a sequence of layers (residual
 * blocks nest one level of body/shortcut) and the parameter tensors they own,
 * with PyTorch state_dict names. It knows per-sample shapes and how to emit
 * its forward graph; it knows nothing of memory plans or kernels. */
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
    FR_L_COUNT
} fr_layer_kind;

typedef struct fr_layer {
    fr_layer_kind kind;
    int out, kernel, stride, pad, bias;
    float p;
    char name[FR_ST_NAME_MAX]; /* state_dict prefix, e.g. "0", "fc1", "3.body.1" */
    fr_shape in, out_shape;    /* per sample (no batch dim) */
    int first_param, n_params;
    int frozen;
    int unit;       /* checkpointing unit: a weighted layer or residual block and what follows it */
    int index;      /* top-level nn.Sequential position */
    int checkpoint; /* marked for recomputation (the unit it starts) */
} fr_layer;

typedef enum fr_param_role {
    FR_P_WEIGHT = 0,
    FR_P_BIAS,
    FR_P_RUNNING_MEAN,
    FR_P_RUNNING_VAR,
    FR_P_NUM_BATCHES
} fr_param_role;

typedef struct fr_param {
    char name[FR_ST_NAME_MAX]; /* full state_dict name, e.g. "0.weight" */
    fr_shape shape;
    fr_dtype dtype;
    fr_param_role role;
    int trainable; /* 0 for buffers */
    int layer;
    int64_t fan_in;
    void *data;       /* FR_MEM_PARAMS */
    float *grad;      /* FR_MEM_GRADS, NULL until needed */
    uint16_t *grad16; /* FR_MEM_GRADS: instead of grad, the gradient in the weights' own 16-bit
                         format (pure half precision, as model.half() keeps it) */
    int grad_valid;   /* 0: the next backward overwrites instead of adding */
    float *state[2];  /* FR_MEM_OPTIM: momentum buffer, or Adam's exp_avg, exp_avg_sq */
    int state_kind;   /* fr_state_kind of Adam's moments (fp32, bf16, int8) */
} fr_param;

#define FR_RES_MAX_DEPTH 4

struct fr_model {
    fr_ctx *ctx;
    fr_shape in; /* per sample */
    fr_shape cur;
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
    int initialised;
    int n_units;
    fr_status status; /* why the last layer could not be added */
};

/* Forward graph for a batch of n: returns the logits value; sets g->input,
 * g->label and g->loss. training selects BatchNorm/Dropout modes. The
 * parameter value of model param i is param_value[i] (length n_params). */
fr_status fr_model_build_graph(fr_model *m, fr_graph *g, int n, int training, int *param_value);
fr_status fr_model_alloc_params(fr_model *m);
/* model.half(): store weights and biases as dt (FR_F16 or FR_BF16). */
fr_status fr_model_to_dtype(fr_model *m, fr_dtype dt);
const char *fr_layer_kind_name(fr_layer_kind k);

#endif
