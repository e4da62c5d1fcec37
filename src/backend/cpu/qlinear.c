/* qlinear.c — the linear layer over a frozen quantized weight, QLINEAR and
 * QLINEAR_BWD: the weight's bytes are viewed in place (quant/quant.h) and
 * its tiled GEMMs dequantize a tile at a time into the node's planned
 * workspace, so no f32 copy of the weight ever exists. The weight and its
 * bias are frozen: the backward gives dx alone. */
#include "backend/cpu/kernels.h"
#include "backend/kcheck.h"
#include "quant/quant.h"

static int view(fr_kernel_call *c, const fr_linear_dims *d, fr_qweight *w) {
    return fr_quant_view(c->ctx, (fr_qfmt)c->node->attr.qfmt, d->O, d->K, c->in[1].data, w);
}

// x is (N,K), Wq is W' (O,K) quantized, b is (O) or absent, y is (N,O)
// y[n,o] = sum_k x[n,k] W'[o,k] + b[o]
int fr_k_qlinear(fr_kernel_call *c) {
    fr_linear_dims d;
    fr_qweight w;
    int st = fr_kcheck_qlinear(c, 0, &d);
    if (!st) st = view(c, &d, &w);
    if (st) return st;
    const fr_tensor *b = &c->in[2], *ws = &c->out[1];
    return fr_qgemm(c->ctx, &w, c->in[0].data, d.N, b->data ? fr_f32(b) : NULL, c->out[0].data, 0,
                    ws->data, (size_t)fr_shape_numel(&ws->shape));
}

// dy is (N,O), Wq is W' (O,K) quantized, dx is (N,K)
// dx[n,k] = sum_o dy[n,o] W'[o,k]
int fr_k_qlinear_bwd(fr_kernel_call *c) {
    fr_linear_dims d;
    fr_qweight w;
    int st = fr_kcheck_qlinear(c, 1, &d);
    if (!st) st = view(c, &d, &w);
    if (st) return st;
    const fr_tensor *ws = &c->out[3];
    return fr_qgemm_dx(c->ctx, &w, c->in[0].data, d.N, c->out[0].data, (int)(c->accumulate & 1),
                       ws->data, (size_t)fr_shape_numel(&ws->shape));
}
