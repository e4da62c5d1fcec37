/* half_io.c — the CPU backend's fr_backend.half_io: whether a kernel reads
 * input j (j >= 0) or writes out[0] (j = -1; j = -2: a 16-bit copy of it as
 * one more output) in f16/bf16 itself, for the ops whose answer is a limit
 * of the kernel (the op table asks here at plan time, for the
 * mixed-precision pass). Not the kernels themselves (pool.c, norm.c,
 * conv.c), nor the ops every backend reads in 16 bits at any size (ops.c). */
#include "backend/cpu/half_io.h"
#include "backend/cpu/attn_tiles16.h"
#include "backend/cpu/conv_dnnl.h"
#include "backend/cpu/gemm16.h"
#include "backend/cpu/kernels.h"

/* values in one (H,W) plane of a 4-d tensor; 1 for (N,C) */
static int64_t plane_of(const fr_shape *s) { return s->ndim == 4 ? s->d[2] * s->d[3] : 1; }

int fr_cpu_half_io(const fr_graph *g, const fr_node *n, int j) {
    const fr_value *v = g->vals;
    switch (n->op) {
    /* max pooling widens a plane of x on its stack (pool.c), and rounds a
     * plane of y there when y is 16-bit */
    case FR_OP_MAXPOOL2D:
        if (j == -1) {
            const fr_shape *y = &v[n->out[0]].shape;
            return y->ndim == 4 && y->d[2] * y->d[3] <= FR_HALF_OUT_PLANE_MAX;
        }
        return j == 0 && plane_of(&v[n->in[0]].shape) <= FR_HALF_PLANE_MAX;
    /* attention widens 16-bit q, k, v and y a tile at a time and rounds y
     * from its f32 rows, its backward dqkv from a head's f32 sums
     * (attention.c) */
    case FR_OP_ATTENTION: return j == -1 || j == 0;
    case FR_OP_ATTENTION_BWD: return j == -1 || j == 1 || j == 2;
    /* the tanh GELU widens a 16-bit x a chunk at a time (activation.c); its
     * backward a 16-bit dy too (its saved x: the op table's, any size) */
    case FR_OP_GELU: return j == 0 && n->attr.approx == 1;
    case FR_OP_GELU_BWD: return j == 0 && n->attr.approx == 1;
    /* LayerNorm rounds y from its stack (any size); its backward widens
     * x a row at a time there (norm.c) */
    case FR_OP_LAYERNORM: return j == -1;
    case FR_OP_LAYERNORM_BWD: {
        const fr_shape *gm = &v[n->in[2]].shape, *x = &v[n->in[1]].shape;
        int64_t D = gm->ndim ? fr_shape_numel(gm) : (x->ndim ? x->d[x->ndim - 1] : 0);
        return j == 1 && D <= FR_HALF_PLANE_MAX;
    }
    /* BatchNorm reads a bf16 x in its loops (NCHW or blocked: norm.c,
     * norm_blocked.c) or widens a plane of an f16 one on its stack, and
     * rounds a plane of a 16-bit y there (NCHW; blocked, a run of
     * positions) */
    case FR_OP_BATCHNORM:
        if (j == -1) return plane_of(&v[n->out[0]].shape) <= FR_HALF_OUT_PLANE_MAX;
        return j == 0 && plane_of(&v[n->in[0]].shape) <= FR_HALF_PLANE_MAX;
    /* ReLU on a 16-bit x's bits (activation.c); on an f32 x, y and its
     * 16-bit copy, a chunk at a time (a residual net's block output, which
     * the shortcut's add reads in f32) */
    case FR_OP_RELU: return j == 0 || (j == -2 && v[n->in[0]].dtype == FR_F32);
    /* the residual stream's sums round a chunk (a row) of y as they write
     * it (activation.c, embedding.c) */
    case FR_OP_ADD:
    case FR_OP_POS_EMBEDDING: return j == -2;
    case FR_OP_MAXPOOL2D_BWD: /* dy, x, y: x */
    case FR_OP_BATCHNORM_BWD: /* dy, x, gamma, mean, invstd: x, a plane at a time (norm.c) */
        return j == 1 && plane_of(&v[n->in[1]].shape) <= FR_HALF_PLANE_MAX;
    /* the image of a convolution on the shifted-GEMM path, whose padded
     * copy widens it (conv.c), or on oneDNN's where it takes the pass's
     * 16-bit dtype (conv_dnnl.h); the weight (OC,C,K,K) follows the image */
    case FR_OP_CONV2D:
    case FR_OP_CONV2D_BWD: {
        int x = n->op == FR_OP_CONV2D ? 0 : 1;
        /* and y in bf16 from oneDNN's native bf16 primitive, whose sums are
         * f32 (as autocast's convolution writes its output); or, for an f32
         * x (the model's input, which stays f32), from the im2col GEMMs'
         * f32 y, rounded as the CAST after it would */
        if (j == -1) {
            const fr_value *x = &v[n->in[0]];
            const int64_t oc = v[n->in[1]].shape.d[0];
            if (n->op != FR_OP_CONV2D || g->half != FR_BF16) return 0;
            if (x->dtype == FR_F32)
                return fr_conv2d_rounds_y(&x->shape, oc, n->attr.kernel, n->attr.stride,
                                          n->attr.pad);
            return x->dtype == FR_BF16 && fr_gemm16_native(FR_BF16) && fr_conv_dnnl_for(FR_BF16) &&
                   fr_conv2d_blockable(&x->shape, FR_BF16, oc, n->attr.kernel, n->attr.stride,
                                       n->attr.pad);
        }
        return j == x &&
               fr_conv2d_reads_half(&v[n->in[x]].shape, g->half, v[n->in[x + 1]].shape.d[0],
                                    n->attr.kernel, n->attr.stride, n->attr.pad);
    }
    /* a linear layer on bf16 operands writes a bf16 y as its GEMM's
     * epilogue (linear.c, gemm16.h) */
    case FR_OP_LINEAR: {
        const fr_value *w = &v[n->in[1]];
        return j == -1 && v[n->in[0]].dtype == FR_BF16 && w->dtype == FR_BF16 &&
               w->shape.ndim == 2 && w->shape.d[1] > 0 && fr_gemm16_native(FR_BF16);
    }
    /* and its backward a bf16 dx from bf16 dy and W (the pass asks once it
     * has bound them) */
    case FR_OP_LINEAR_BWD: {
        const fr_value *w = &v[n->in[2]];
        return j == -1 && v[n->in[0]].dtype == FR_BF16 && w->dtype == FR_BF16 &&
               (n->in[1] < 0 || v[n->in[1]].dtype == FR_BF16) && w->shape.ndim == 2 &&
               w->shape.d[0] > 0 && fr_gemm16_native(FR_BF16);
    }
    default: return 0;
    }
}

int fr_cpu_native16(const fr_graph *g, const fr_node *n) {
    switch (n->op) {
    case FR_OP_CONV2D:
    case FR_OP_CONV2D_BWD: {
        const int x = n->in[n->op == FR_OP_CONV2D ? 0 : 1];
        return x >= 0 && x != g->input && fr_conv_dnnl_for(FR_BF16);
    }
    case FR_OP_ATTENTION:
    case FR_OP_ATTENTION_BWD: {
        const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
        const fr_shape *x = &g->vals[f->in[0]].shape;
        if (x->ndim != 3 || f->attr.heads < 1) return 0;
        const int hs = fr_cpu_attn_hs(f, x);
        return hs > 0 && hs % 2 == 0 && fr_t16_on();
    }
    default: return 0;
    }
}

int fr_cpu_attn_hs(const fr_node *f, const fr_shape *x) {
    const int nh = f->attr.heads, kv = f->attr.kv_heads > 0 ? f->attr.kv_heads : nh;
    return (int)(x->d[2] / (nh + 2 * kv));
}
