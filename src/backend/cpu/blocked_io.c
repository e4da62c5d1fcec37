/* blocked_io.c — the CPU backend's fr_backend.blocked_io (backend.h): the
 * kernels that take a 4-d operand in nChw16c (plan/layout.h). Element-wise
 * kernels index every operand alike, so any layout shared by all of them
 * is theirs; BatchNorm and global average pooling have blocked loops
 * (norm.c, pool.c), max pooling 16 lanes at a time with each operand in
 * its own layout (pool.c); a convolution runs such operands on oneDNN
 * (conv_dnnl.h), each in its own layout. */
#include "backend/cpu/blocked_io.h"

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

/* input j, or output -1-j */
static int operand(const fr_node *n, int j) { return j >= 0 ? n->in[j] : n->out[-1 - j]; }

static int conv_ok(const fr_graph *g, const fr_node *n) {
    const fr_node *f = n->op == FR_OP_CONV2D ? n : &g->nodes[n->fwd];
    const fr_value *x = &g->vals[f->in[0]];
    const int xi = n->op == FR_OP_CONV2D ? n->in[0] : n->in[1];
    return fr_conv2d_blockable(&x->shape, xi >= 0 ? g->vals[xi].dtype : x->dtype,
                               g->vals[f->in[1]].shape.d[0], f->attr.kernel, f->attr.stride,
                               f->attr.pad);
}

int fr_cpu_blocked_io(const fr_graph *g, const fr_node *n, int j) {
    const int v = operand(n, j);
    if (v < 0) return FR_BLK_NO;
    const fr_dtype dt = g->vals[v].dtype;
    switch (n->op) {
    case FR_OP_RELU:
    case FR_OP_RELU_BWD:
    case FR_OP_ADD:
    case FR_OP_COPY:
    case FR_OP_CAST: return FR_BLK_TIED;
    /* x and y; dy, x and dx: the per-channel loops of norm_blocked.c (x f32
     * or bf16; y f32 or 16-bit) */
    case FR_OP_BATCHNORM:
        if (j == 0) return dt == FR_F32 || dt == FR_BF16 ? FR_BLK_TIED : FR_BLK_NO;
        return j == -1 ? FR_BLK_TIED : FR_BLK_NO;
    case FR_OP_BATCHNORM_BWD:
        if (j == 1) return dt == FR_F32 || dt == FR_BF16 ? FR_BLK_TIED : FR_BLK_NO;
        return (j == 0 || j == -1) && dt == FR_F32 ? FR_BLK_TIED : FR_BLK_NO;
    /* x and y; dy, x and dx: each in its own layout (pool.c's lanes) */
    case FR_OP_MAXPOOL2D: return j == 0 || j == -1 ? FR_BLK_FREE : FR_BLK_NO;
    case FR_OP_MAXPOOL2D_BWD: return j == 0 || j == 1 || j == -1 ? FR_BLK_FREE : FR_BLK_NO;
    case FR_OP_GLOBAL_AVGPOOL: return j == 0 && dt == FR_F32 ? FR_BLK_TIED : FR_BLK_NO;
    case FR_OP_GLOBAL_AVGPOOL_BWD: return j == -1 && dt == FR_F32 ? FR_BLK_TIED : FR_BLK_NO;
    /* x and y; dy, x and dx (not dy when db is wanted: conv.c sums it by plane) */
    case FR_OP_CONV2D: return (j == 0 || j == -1) && conv_ok(g, n) ? FR_BLK_FREE : FR_BLK_NO;
    case FR_OP_CONV2D_BWD:
        if (j == 0 && n->out[2] >= 0) return FR_BLK_NO;
        return (j == 0 || j == 1 || j == -1) && conv_ok(g, n) ? FR_BLK_FREE : FR_BLK_NO;
    default: return FR_BLK_NO;
    }
}
