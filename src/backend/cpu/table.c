/* table.c — the CPU backend: its kernel table, its workspace sizes and its
 * fr_backend (every member but the optional wait_copy). */
#include "backend/cpu/attention.h"
#include "backend/cpu/blocked_io.h"
#include "backend/cpu/conv_dnnl.h"
#include "backend/cpu/gemm16.h"
#include "backend/cpu/half_io.h"
#include "backend/cpu/host.h"
#include "backend/cpu/kernels.h"
#include "core/ctx.h"
#include "ops/ops.h"
#include "quant/quant.h"

/* VIEW has no kernel on any backend: the executor binds its output to its
 * input's storage (fr_op_info.view). Nor has OPTIM_STEP: the executor hands
 * it to the optimizer (exec.h, param_step). */
#define fr_k_view NULL
#define fr_k_optim_step NULL

/* One row per op of FR_OPS, each naming fr_k_<name>: an op added to ops.h
 * without a CPU kernel fails to compile here. */
#define FR_CPU_ROW(NAME, name, nin, nout) [FR_OP_##NAME] = fr_k_##name,
static const fr_kernel_fn cpu_kernels[FR_OP_COUNT] = {FR_OPS(FR_CPU_ROW)};
#undef FR_CPU_ROW

/* j = -1: the step's GEMM scratch, oneDNN's scratchpad for a linear layer
 * on bf16 operands, or on f32 ones where fr_gemm32_onednn() (gemm16.h), in
 * floats */
static int64_t gemm16_ws(const fr_graph *g, const fr_node *n) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    if ((n->op == FR_OP_QLINEAR || n->op == FR_OP_QLINEAR_BWD) && n->in[0] >= 0 &&
        g->vals[n->in[0]].dtype == FR_BF16 && f->attr.shape.ndim == 2) {
        /* a bf16 input (precision.c): a bf16 panel of W' and oneDNN's scratch */
        const int bwd = n->op == FR_OP_QLINEAR_BWD;
        const int64_t O = f->attr.shape.d[0], K = f->attr.shape.d[1];
        const int64_t N = fr_shape_numel(&g->vals[n->in[0]].shape) / (bwd ? O : K);
        size_t b = fr_k_qlinear16_ws(N, O, K, bwd);
        return (int64_t)((b + sizeof(float) - 1) / sizeof(float));
    }
    if ((n->op == FR_OP_LINEAR_CE || n->op == FR_OP_LINEAR_CE_BWD) && n->in[0] >= 0 &&
        g->vals[n->in[0]].dtype == FR_BF16) {
        /* a bf16 x (precision.c): panels of W and dz in bf16, oneDNN's scratch */
        const fr_shape *w = &g->vals[n->in[1]].shape;
        if (w->ndim != 2 || w->d[1] < 1) return 0;
        const int64_t N = fr_shape_numel(&g->vals[n->in[0]].shape) / w->d[1];
        size_t b = fr_k_linear_ce16_ws(N, fr_op_ce_chunk_rows(g, n), w->d[1], w->d[0],
                                       n->op == FR_OP_LINEAR_CE_BWD);
        return (int64_t)((b + sizeof(float) - 1) / sizeof(float));
    }
    int bwd = n->op == FR_OP_LINEAR_BWD;
    if (n->op != FR_OP_LINEAR && !bwd) return 0;
    /* the GEMM's operands' dtype: x's, or dy's in a backward without x */
    fr_dtype dt = g->vals[n->in[bwd] >= 0 ? n->in[bwd] : n->in[0]].dtype;
    const fr_shape *w = &g->vals[n->in[bwd + 1]].shape;
    int64_t N = fr_op_linear_rows(g, n);
    if (N < 1 || w->ndim != 2) return 0;
    int64_t O = w->d[0], K = w->d[1];
    int ab32 = dt == FR_F32 && fr_gemm32_onednn_for(N, O, K);
    if (dt != FR_BF16 && !ab32) return 0;
    size_t b = fr_k_linear_gemm16_ws(N, O, K, bwd, fr_get_threads(g->ctx), ab32);
    return (int64_t)((b + sizeof(float) - 1) / sizeof(float));
}

static int64_t cpu_ws(const fr_graph *g, const fr_node *n, int j) {
    const fr_node *f = n->fwd >= 0 ? &g->nodes[n->fwd] : n;
    const fr_shape *x = &g->vals[f->in[0]].shape;
    if (j == -1) return gemm16_ws(g, n);
    switch (n->op) {
    case FR_OP_CONV2D:
    case FR_OP_CONV2D_BWD:
        if (j != (n->op == FR_OP_CONV2D ? 1 : 3)) return 0;
        /* the image the kernel reads: its dtype picks the path (conv_dnnl.h);
         * the mixed-precision pass sizes this again once it is final */
        const int xi = n->op == FR_OP_CONV2D ? n->in[0] : n->in[1];
        return fr_conv2d_ws_elems(
            x, xi >= 0 ? g->vals[xi].dtype : FR_F32, g->vals[f->in[1]].shape.d[0], f->attr.kernel,
            f->attr.stride, f->attr.pad, n->op == FR_OP_CONV2D_BWD,
            fr_conv_flags(n, n->out[0] >= 0 ? g->vals[n->out[0]].dtype : FR_F32));
    case FR_OP_ATTENTION:
    case FR_OP_ATTENTION_BWD:
        /* sized at graph time, before the mixed-precision pass picks dtypes:
         * room for 16-bit qkv and y (the widened tiles), as convolutions
         * plan the most of their image's dtypes; the backward's sums of a
         * 16-bit dqkv once the pass has made it 16-bit (fr_ops_resize_ws) */
        if (j != 2 || f->attr.heads < 1) return 0;
        return (int64_t)fr_attention_bwd_ws_floats(
            (int)x->d[1], fr_cpu_attn_hs(f, x), fr_get_threads(g->ctx), 1,
            n->op == FR_OP_ATTENTION_BWD && n->out[0] >= 0 && g->vals[n->out[0]].dtype != FR_F32);
    case FR_OP_QLINEAR:
    case FR_OP_QLINEAR_BWD: /* a tile of the dequantized weight per thread */
        if (j != (n->op == FR_OP_QLINEAR ? 1 : 3) || f->attr.shape.ndim != 2) return 0;
        return (int64_t)fr_qgemm_ws_floats(f->attr.shape.d[0], f->attr.shape.d[1],
                                           fr_get_threads(g->ctx));
    case FR_OP_LINEAR_CE:
    case FR_OP_LINEAR_CE_BWD: {
        const int bwd = n->op == FR_OP_LINEAR_CE_BWD;
        const fr_shape *w = &g->vals[f->in[1]].shape;
        if (j != (bwd ? 4 : 2) || w->ndim != 2 || w->d[1] < 1) return 0;
        const int64_t N = fr_shape_numel(x) / w->d[1];
        return FR_K_LINEAR_CE_WS(fr_op_ce_chunk_rows(g, n), N, w->d[0], bwd);
    }
    case FR_OP_ATTENTION_KV:
        if (j != 1 || n->attr.heads < 1) return 0;
        return fr_attention_kv_ws((int)x->d[1], n->attr.heads, (int)g->vals[n->in[1]].shape.d[2],
                                  fr_cpu_attn_hs(n, x), fr_get_threads(g->ctx));
    default: return 0;
    }
}

/* Every member but wait_copy (optional: its copies are done on return);
 * the memory, copies and uploads in memory.c, the passes in passes.c. */
static size_t cpu_upd_tile(fr_ctx *ctx, int64_t out, int64_t in, int64_t rows) {
    return fr_k_linear_upd_ws(out, in, rows, fr_get_threads(ctx));
}

const fr_backend fr_cpu_backend = {
    .name = "cpu",
    .kernels = cpu_kernels,
    .ws_elems = cpu_ws,
    .gemm16 = fr_gemm16_native,
    .host_memory = 1,
    .alloc = fr_cpu_alloc,
    .release = fr_cpu_release,
    .arena_alloc = fr_cpu_arena_alloc,
    .arena_free = fr_cpu_arena_free,
    .track = fr_cpu_track,
    .write = fr_cpu_write,
    .read = fr_cpu_read,
    .zero = fr_cpu_zero,
    .finish = fr_cpu_finish,
    .max_buffer = fr_cpu_max_buffer,
    .global_mem = fr_cpu_global_mem,
    .copy_rate = fr_cpu_rate,
    .flop_rate = fr_cpu_rate,
    .copy_overlap = fr_cpu_rate,
    .optim_update = fr_cpu_optim_update,
    .grad_unscale = fr_cpu_grad_unscale,
    .grad_sumsq = fr_cpu_grad_sumsq,
    .grad_scale = fr_cpu_grad_scale,
    .hits = fr_cpu_hits,
    .upload_open = fr_cpu_upload_open,
    .upload_close = fr_cpu_upload_close,
    .upload = fr_cpu_upload,
    .upload_finish = fr_cpu_upload_finish,
    .event_mark = fr_cpu_event_mark,
    .event_order = fr_cpu_event_order,
    .event_wait = fr_cpu_event_wait,
    .event_release = fr_cpu_event_release,
    .event_times = fr_cpu_event_times,
    .half_io = fr_cpu_half_io,
    .native16 = fr_cpu_native16,
    .blocked_io = fr_cpu_blocked_io,
    .upd_tile = cpu_upd_tile,
    .mirror = fr_cpu_mirror,
    .mirror_bytes = fr_cpu_mirror_bytes,
};

const fr_backend *fr_backend_of(const fr_ctx *ctx) {
    return ctx && ctx->be ? ctx->be : &fr_cpu_backend;
}

int64_t fr_backend_ws(const fr_graph *g, const fr_node *n, int j) {
    return fr_backend_of(g->ctx)->ws_elems(g, n, j);
}

int fr_backend_half_io(const fr_graph *g, const fr_node *n, int j) {
    const fr_backend *be = fr_backend_of(g->ctx);
    return be->half_io && be->half_io(g, n, j);
}
