/* op_cases.h — one small case per differentiable op of the op table (and
 * the shapes that matter: (B,T,C) inputs, absent biases, tiles crossed),
 * shared by the gradient check (test_gradcheck.c) and the backend check
 * (test_backend_ops.c). */
#ifndef FR_TEST_OP_CASES_H
#define FR_TEST_OP_CASES_H

#include "ops/ops.h"
#include "quant/quant.h"

typedef struct gcase {
    fr_op op;
    int n_in;
    fr_shape in[5];
    int is_int[5];  /* i32 inputs, not differentiated: 1 labels (cross-entropy, below the
                        logits' last dimension; linear_ce: below W's rows); k > 1 ids below k
                        (embedding), an input; OP_QUANT(fmt): a frozen quantized weight
                        (QLINEAR), in[i]'s (O, K) random values quantized by fr_quantize, u8
                        bytes */
    int no_grad[5]; /* inputs not differentiated (BatchNorm running stats) */
    fr_attr attr;
    int positive[5]; /* keep away from kinks: |x| >= 0.1 */
    const char *what;
} gcase;

#define OP_CASES_MAX 64
#define OP_QUANT(fmt) (-1 - (int)(fmt)) /* is_int of a quantized weight */
#define OP_QFMT(is_int) ((fr_qfmt)(-1 - (is_int)))

/* Fills cases (OP_CASES_MAX) and returns how many. */
static inline int op_cases(gcase *out) {
    fr_attr none = {0};
    fr_attr conv = {.kernel = 3, .stride = 2, .pad = 1};
    fr_attr pool = {.kernel = 2, .stride = 2};
    fr_attr bn = {.eps = 1e-5f, .momentum = 0.1f, .training = 1};
    fr_attr ln = {.eps = 1e-5f};
    fr_attr drop = {.p = 0.3f, .training = 1, .salt = 5};
    fr_attr ce = {.scale = 1.0f};
    fr_attr lce = {.scale = 1.0f, .rows = 3}; /* chunks of 3 rows: 10 rows are 3, 3, 3, 1 */
    fr_attr gelu_tanh = {.approx = 1};
    fr_attr attn2 = {.heads = 2, .causal = 1};
    fr_attr q_int8 = {.shape = fr_shape2(6, 70), .qfmt = FR_QFMT_INT8};
    fr_attr q_nf4 = {.shape = fr_shape2(6, 70), .qfmt = FR_QFMT_NF4};
    fr_attr q_bf16 = {.shape = fr_shape2(4, 5), .qfmt = FR_QFMT_BF16};
    fr_attr lin_half = {.scale = 0.5f};
    fr_attr attn_g2 = {.heads = 4, .kv_heads = 2, .causal = 1}; /* groups of 2 */
    fr_attr attn_g4 = {.heads = 4, .kv_heads = 1, .causal = 1}; /* one kv head */
    fr_attr rope = {.heads = 4, .kv_heads = 2};
    rope.rope.theta = 10000.0f;
    /* Llama 3's published scaling: each of its three bands at HS 8 (wavelengths
     * 6.3, 167 below 2048; 4443 between; 118000 above 8192) */
    fr_attr rope3 = {.heads = 2, .kv_heads = 1};
    rope3.rope = (fr_rope){500000.0f, FR_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 0};
    gcase cases[] = {
        {FR_OP_LINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0},
         {0},
         none,
         {0},
         "linear"},
        {FR_OP_LINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), {0}},
         {0},
         {0},
         none,
         {0},
         "linear (no bias)"},
        {FR_OP_LINEAR,
         3,
         {fr_shape3(2, 3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0},
         {0},
         none,
         {0},
         "linear (B,T,K)"},
        {FR_OP_QLINEAR,
         3,
         {fr_shape3(2, 3, 70), fr_shape2(6, 70), fr_shape1(6)},
         {0, OP_QUANT(FR_QFMT_INT8)},
         {0, 0, 1},
         q_int8,
         {0},
         "qlinear int8 (B,T,K)"},
        {FR_OP_QLINEAR,
         3,
         {fr_shape2(3, 70), fr_shape2(6, 70), {0}},
         {0, OP_QUANT(FR_QFMT_NF4)},
         {0},
         q_nf4,
         {0},
         "qlinear nf4 (no bias)"},
        {FR_OP_QLINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0, OP_QUANT(FR_QFMT_BF16)},
         {0, 0, 1},
         q_bf16,
         {0},
         "qlinear bf16"},
        {FR_OP_LINEAR,
         3,
         {fr_shape2(3, 5), fr_shape2(4, 5), fr_shape1(4)},
         {0},
         {0},
         lin_half,
         {0},
         "linear, scale 0.5 (y = 0.5 x W^T + b)"},
        {FR_OP_CONV2D,
         3,
         {fr_shape4(2, 3, 5, 6), fr_shape4(4, 3, 3, 3), fr_shape1(4)},
         {0},
         {0},
         conv,
         {0},
         "conv2d s2 p1"},
        {FR_OP_MAXPOOL2D, 1, {fr_shape4(2, 2, 4, 6)}, {0}, {0}, pool, {0}, "maxpool2d"},
        {FR_OP_AVGPOOL2D, 1, {fr_shape4(2, 2, 4, 6)}, {0}, {0}, pool, {0}, "avgpool2d"},
        {FR_OP_GLOBAL_AVGPOOL, 1, {fr_shape4(2, 3, 3, 4)}, {0}, {0}, none, {0}, "global_avgpool"},
        {FR_OP_RELU, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {2}, "relu"},
        {FR_OP_GELU, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "gelu"},
        {FR_OP_GELU, 1, {fr_shape3(2, 3, 4)}, {0}, {0}, gelu_tanh, {0}, "gelu (tanh)"},
        {FR_OP_SIGMOID, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "sigmoid"},
        {FR_OP_TANH, 1, {fr_shape2(4, 6)}, {0}, {0}, none, {0}, "tanh"},
        {FR_OP_BATCHNORM,
         5,
         {fr_shape4(3, 2, 2, 3), fr_shape1(2), fr_shape1(2), fr_shape1(2), fr_shape1(2)},
         {0},
         {0, 0, 0, 1, 1},
         bn,
         {0, 0, 0, 0, 1},
         "batchnorm (train)"},
        {FR_OP_BATCHNORM,
         5,
         {fr_shape2(5, 3), fr_shape1(3), fr_shape1(3), fr_shape1(3), fr_shape1(3)},
         {0},
         {0, 0, 0, 1, 1},
         bn,
         {0, 0, 0, 0, 1},
         "batchnorm1d (train)"},
        {FR_OP_LAYERNORM,
         3,
         {fr_shape2(3, 6), fr_shape1(6), fr_shape1(6)},
         {0},
         {0},
         ln,
         {0},
         "layernorm"},
        {FR_OP_LAYERNORM,
         3,
         {fr_shape3(2, 3, 6), fr_shape1(6), fr_shape1(6)},
         {0},
         {0},
         ln,
         {0},
         "layernorm (B,T,C)"},
        {FR_OP_DROPOUT, 1, {fr_shape2(4, 8)}, {0}, {0}, drop, {0}, "dropout"},
        {FR_OP_ADD, 2, {fr_shape2(3, 4), fr_shape2(3, 4)}, {0}, {0}, none, {0}, "add"},
        {FR_OP_VIEW, 1, {fr_shape3(2, 3, 4)}, {0}, {0}, {.shape = {2, {2, 12}}}, {0}, "view"},
        {FR_OP_CROSS_ENTROPY,
         2,
         {fr_shape2(4, 5), fr_shape1(4)},
         {0, 1},
         {0},
         ce,
         {0},
         "cross_entropy"},
        {FR_OP_CROSS_ENTROPY,
         2,
         {fr_shape3(2, 3, 5), fr_shape2(2, 3)},
         {0, 1},
         {0},
         ce,
         {0},
         "cross_entropy (B,T,V)"},
        {FR_OP_MSE, 2, {fr_shape2(3, 4), fr_shape2(3, 4)}, {0}, {0, 1}, ce, {0}, "mse"},
        /* the head fused with its loss: labels below W's rows (11 classes) */
        {FR_OP_LINEAR_CE,
         4,
         {fr_shape3(2, 5, 6), fr_shape2(11, 6), fr_shape1(11), fr_shape2(2, 5)},
         {0, 0, 0, 1},
         {0},
         lce,
         {0},
         "linear_ce (B,T,C)"},
        {FR_OP_LINEAR_CE,
         4,
         {fr_shape2(10, 6), fr_shape2(11, 6), {0}, fr_shape1(10)},
         {0, 0, 0, 1},
         {0},
         lce,
         {0},
         "linear_ce (no bias)"},
        /* ids below 5 over 6 positions: some rows of W repeat, some are never
         * read (their gradient must be 0) */
        {FR_OP_EMBEDDING, 2, {fr_shape2(2, 3), fr_shape2(5, 4)}, {5}, {0}, none, {0}, "embedding"},
        /* T = 3 of Tmax = 5: rows 3, 4 get no gradient */
        {FR_OP_POS_EMBEDDING,
         2,
         {fr_shape3(2, 3, 4), fr_shape2(5, 4)},
         {0},
         {0},
         none,
         {0},
         "pos_embedding"},
        {FR_OP_ATTENTION, 1, {fr_shape3(2, 5, 12)}, {0}, {0}, attn2, {0}, "attention NH 2"},
        /* past a key tile (32) and a query tile (64): T = 67, C = 8, HS 4 */
        {FR_OP_ATTENTION, 1, {fr_shape3(1, 67, 24)}, {0}, {0}, attn2, {0}, "attention T 67"},
        /* the Llama family's norm and MLP gate: odd sizes */
        {FR_OP_RMSNORM, 2, {fr_shape2(3, 5), fr_shape1(5)}, {0}, {0}, ln, {0}, "rmsnorm"},
        {FR_OP_RMSNORM,
         2,
         {fr_shape3(2, 3, 7), fr_shape1(7)},
         {0},
         {0},
         ln,
         {0},
         "rmsnorm (B,T,C)"},
        {FR_OP_SWIGLU, 2, {fr_shape2(3, 5), fr_shape2(3, 5)}, {0}, {0}, none, {0}, "swiglu"},
        {FR_OP_SWIGLU,
         2,
         {fr_shape3(2, 3, 6), fr_shape3(2, 3, 6)},
         {0},
         {0},
         none,
         {0},
         "swiglu (B,T,I)"},
        /* grouped-query: (NH + 2 NKV) HS = (4 + 4) 2 and (4 + 2) 3 */
        {FR_OP_ATTENTION, 1, {fr_shape3(2, 5, 16)}, {0}, {0}, attn_g2, {0}, "attention GQA 4/2"},
        {FR_OP_ATTENTION, 1, {fr_shape3(1, 67, 18)}, {0}, {0}, attn_g4, {0}, "attention GQA 4/1"},
        {FR_OP_ROPE_QKV,
         3,
         {fr_shape3(2, 5, 16), fr_shape3(2, 5, 8), fr_shape3(2, 5, 8)},
         {0},
         {0},
         rope,
         {0},
         "rope_qkv 4/2"},
        {FR_OP_ROPE_QKV,
         3,
         {fr_shape3(1, 7, 16), fr_shape3(1, 7, 8), fr_shape3(1, 7, 8)},
         {0},
         {0},
         rope3,
         {0},
         "rope_qkv llama3"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n && i < OP_CASES_MAX; i++) out[i] = cases[i];
    return n;
}

#endif
