/* precision.c — the mixed-precision pass (see precision.h). */
#include <string.h>
#include "backend/backend.h"
#include "plan/precision.h"

/* Forward work: the original forward nodes and recomputed clones. */
static int is_forward(const fr_graph *g, int i, int n_nodes0) {
    return i < g->n_forward || (i >= n_nodes0 && g->nodes[i].attr.recompute);
}

/* Whether forward reader `op` reads its input j rounded to 16 bits: matmuls
 * and convolutions (as a 16-bit GEMM would), max pooling (so that its
 * backward, comparing rounded values, finds the same maximum), GELU (as it
 * would read a linear layer's 16-bit output under autocast; so its clone
 * before backward, fr_remat_cheap, reads the saved 16-bit x as the forward
 * did and the f32 x is not held for it), attention's qkv (its products are
 * matmuls, in 16 bits under autocast; the qkv its backward reads is then
 * the one its forward read, and no f32 qkv is held or made for either),
 * BatchNorm's x (autocast's convolution writes a 16-bit output, which its
 * BatchNorm reads; the x its backward reads is the one its forward read,
 * and the convolution may write the 16-bit value itself). */
static int rounded_fwd(fr_op op, int j) {
    return j == 0 && (op == FR_OP_MAXPOOL2D || op == FR_OP_LINEAR || op == FR_OP_CONV2D ||
                      op == FR_OP_GELU || op == FR_OP_ATTENTION || op == FR_OP_BATCHNORM);
}
/* Whether forward node n may read input j rounded because what it makes is:
 * ReLU, where its y is stored in 16 bits and no forward reader takes y in
 * f32 (half_only, set below), reads a 16-bit x (max(round x, 0) is
 * round(max(x, 0)) but for the sign of a zero: fr_relu16), so that what
 * feeds it, BatchNorm's y in a CNN, is made in 16 bits and not in f32
 * first; only where the backend's ReLU takes a 16-bit x and x's producer
 * writes 16 bits itself (else a CAST would round it: one pass more, not
 * less). Decided once, on the graph
 * before the pass (through[], by ReLU's y: a recomputed clone does what
 * its original does). */
static int rounds_through(const fr_graph *g, const fr_node *n, int j, const uint8_t *half_only,
                          const int *origin) {
    if (j != 0 || n->op != FR_OP_RELU || n->out[0] < 0 || n->in[0] < 0) return 0;
    const int p = g->vals[n->in[0]].producer;
    const fr_op_info *info = fr_op_get(n->op), *pi = p >= 0 ? fr_op_get(g->nodes[p].op) : NULL;
    return half_only[origin[n->out[0]]] && info->half_in && info->half_in(g, n, 0) && pi &&
           pi->half_out && pi->half_out(g, &g->nodes[p]);
}

/* Whether ReLU node n was found (through[], by its y) to read its x rounded */
static int passes_through(const fr_node *n, const uint8_t *through, const int *origin, size_t nv0) {
    return n->op == FR_OP_RELU && n->out[0] >= 0 && (size_t)n->out[0] < nv0 &&
           through[origin[n->out[0]]];
}

/* Whether input j of node n is an operand of its GEMM that the backend
 * takes in 16 bits (g16: it has a native 16-bit GEMM): x and W of a linear
 * layer, and dy too in its backward; not the bias. A scaled linear node
 * (attr.scale, LoRA's B product) is not: the 16-bit GEMM has no alpha, and
 * its inner dimension is the adapter's rank, too small to gain from one. A
 * quantized layer's x (dy in its backward) is: its kernel dequantizes the
 * weight into bf16 panels itself (backend/cpu/qlinear.c); so is the fused
 * head's x, its kernel rounding W a panel at a time (linear_ce.c). */
static int gemm16_slot(int g16, const fr_node *n, int j) {
    if (n->attr.scale != 0.0f && n->attr.scale != 1.0f) return 0;
    return g16 && ((n->op == FR_OP_LINEAR && j < 2) || (n->op == FR_OP_LINEAR_BWD && j < 3) ||
                   ((n->op == FR_OP_QLINEAR || n->op == FR_OP_QLINEAR_BWD ||
                     n->op == FR_OP_LINEAR_CE || n->op == FR_OP_LINEAR_CE_BWD) &&
                    j == 0));
}

/* Whether input j of backward node n is read rounded to 16 bits, as
 * autocast would hand it over, where the backend has a native 16-bit GEMM
 * (g16): the tanh GELU's dy, which under autocast is the bf16 output of the
 * next linear layer's backward matmul; only where the backend's kernel
 * widens a 16-bit dy itself (fr_backend.half_io). Such an input is bound as
 * a 16-bit GEMM operand is (below): its producer writes it in 16 bits (the
 * op table's half_out: the linear layer's dx, as its GEMM's epilogue), or
 * else a CAST rounds it. */
static int rounded_bwd(const fr_graph *g, int g16, const fr_node *n, int j) {
    return g16 && j == 0 && n->op == FR_OP_GELU_BWD && fr_backend_half_io(g, n, 0);
}

/* Whether input j of node n is taken in 16 bits as it is (gemm16_slot,
 * rounded_bwd) */
static int half_slot(const fr_graph *g, int g16, const fr_node *n, int j) {
    return gemm16_slot(g16, n, j) || rounded_bwd(g, g16, n, j);
}

/* Add CAST(src -> dt) for the reader at `layer`; its output in *out.
 * Returns the node id, or -1 with g->status set. */
static int cast_node(fr_graph *g, int src, fr_dtype dt, int layer, int *out) {
    fr_attr a = {0};
    a.dtype = dt;
    int c = fr_graph_node(g, FR_OP_CAST, &src, 1, &a, -1, 0, out);
    if (c >= 0) g->nodes[c].layer = layer;
    return c;
}

/* Make node i read input j through CAST(-> dt), rounded through `round`
 * (FR_F32: not) when dt is f32. Returns the CAST's id, or -1 with
 * g->status set. */
static int cast_input(fr_graph *g, int i, int j, fr_dtype dt, fr_dtype round) {
    int up, c = cast_node(g, g->nodes[i].in[j], dt, g->nodes[i].layer, &up);
    if (c < 0) return -1;
    if (round != FR_F32) g->nodes[c].attr.round = round;
    g->nodes[i].in[j] = up;
    return c;
}

/* Node i writes its out[0] (value v) in 16 bits itself: a new value of
 * dtype half takes v's place as the output. Returns it, or -1 with
 * g->status set. */
static int half_output(fr_graph *g, int i, int v, fr_dtype half) {
    int h = fr_graph_value(g, FR_VAL_STEP, half, g->vals[v].shape);
    if (h < 0) return -1;
    g->vals[h].batched = g->vals[v].batched;
    g->vals[h].producer = i;
    g->vals[v].producer = -1;
    g->nodes[i].out[0] = h;
    return h;
}

/* Whether node n can write its out[0] rounded as one more output */
static int writes_copy(const fr_graph *g, const fr_node *n) {
    const fr_op_info *info = fr_op_get(n->op);
    return info->half_copy && n->n_out < FR_MAX_OUT && info->half_copy(g, n);
}

/* Node i also writes out[0] (value v) rounded to half, as one more output
 * (fr_op_info.half_copy). Returns the 16-bit value, or -1 with g->status
 * set. */
static int copy_output(fr_graph *g, int i, int v, fr_dtype half) {
    int h = fr_graph_value(g, FR_VAL_STEP, half, g->vals[v].shape);
    if (h < 0) return -1;
    g->vals[h].batched = g->vals[v].batched;
    g->vals[h].producer = i;
    g->nodes[i].out[g->nodes[i].n_out++] = h;
    return h;
}

fr_status fr_precision_apply(fr_graph *g, fr_dtype half, int n_nodes0, const int *origin,
                             int **order_io, int *n_io) {
    int store_half = half != FR_F32; /* FR_F32: only bring 16-bit weights to f32 */
    fr_ctx *ctx = g->ctx;
    g->half = half; /* the backend's half_io answers for this dtype */
    const fr_backend *be = fr_backend_of(ctx);
    /* A backend with a native 16-bit GEMM gets its linear layers' operands in
     * 16 bits (saved halves as they are, casts of the rest), not f32 copies */
    int g16 = store_half && be->gemm16 && be->gemm16(half);
    int n = *n_io, *order = *order_io;
    size_t nv0 = g->n_vals, nn0 = g->n_nodes;
    uint8_t *cast = fr_calloc(ctx, nv0, FR_MEM_OTHER), *f32_read = NULL; /* cast: store in half */
    uint8_t *g16_only = NULL, *read_back = NULL, *half_only = NULL, *castable = NULL;
    uint8_t *through = NULL; /* by a ReLU's y: that ReLU reads its x rounded */
    int *hv = fr_alloc(ctx, nv0 * sizeof *hv, FR_MEM_OTHER);
    size_t cap = (size_t)n * 3 + 16, k = 0;
    int *out = fr_alloc(ctx, cap * sizeof *out, FR_MEM_OTHER);
    fr_status st = FR_OK;
    if (!cast || !hv || !out) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    /* Every decision is made per original value (origin[] maps a recomputed
     * value to the one it recomputes) and on the graph as it was before
     * rematerialization: the original forward nodes and the backward nodes.
     * So whether a value is stored in 16 bits, and which forward readers read
     * it rounded, is a property of the model and the precision, the same for
     * every checkpointing schedule, and a recomputed forward reproduces the
     * first one's bits. Castable: an f32 step value made as out[0] of forward
     * work, read by backward, not by a loss's backward, and never through a
     * view of a view. */
    for (size_t v = 0; v < nv0; v++) {
        const fr_value *val = &g->vals[v];
        hv[v] = -1;
        int p = val->producer;
        cast[v] = origin[v] == (int)v && val->kind == FR_VAL_STEP && val->dtype == FR_F32 &&
                  val->alias_of < 0 && p >= 0 && p < g->n_forward && g->nodes[p].out[0] == (int)v &&
                  g->nodes[p].op != FR_OP_VIEW;
    }
    read_back = fr_calloc(ctx, nv0, FR_MEM_OTHER);
    f32_read = fr_calloc(ctx, nv0, FR_MEM_OTHER);  /* some forward reader reads the f32 value */
    half_only = fr_calloc(ctx, nv0, FR_MEM_OTHER); /* stored in half, no f32 forward reader */
    castable = fr_alloc(ctx, nv0, FR_MEM_OTHER);
    through = fr_calloc(ctx, nv0, FR_MEM_OTHER);
    if (!read_back || !f32_read || !half_only || !castable || !through) {
        st = FR_ERR_NOMEM;
        goto done;
    }
    memcpy(castable, cast, nv0);
    for (size_t v = 0; v < nv0; v++) /* a view shares the f32 storage */
        if (g->vals[v].alias_of >= 0) f32_read[origin[g->vals[v].alias_of]] = 1;
    for (size_t i = 0; i < nn0; i++) {
        const fr_node *nd = &g->nodes[i];
        if (is_forward(g, (int)i, n_nodes0)) continue;
        for (int j = 0; j < nd->n_in; j++) {
            int x = nd->in[j];
            if (x < 0) continue;
            if (fr_op_get(nd->op)->loss_bwd) cast[origin[x]] = 0;
            read_back[origin[x]] = 1;
            if (g->vals[x].alias_of >= 0) { /* read through a view (flatten) */
                int r = g->vals[x].alias_of;
                if (g->vals[r].alias_of >= 0) { /* views of views: keep the root f32 */
                    while (g->vals[r].alias_of >= 0) r = g->vals[r].alias_of;
                    cast[origin[r]] = 0;
                } else {
                    read_back[origin[r]] = 1;
                }
            }
        }
    }
    for (size_t v = 0; v < nv0; v++) cast[v] &= read_back[v] & store_half;
    /* The forward readers, last first (a value's readers come after its
     * producer), so that whether a ReLU's y has an f32 reader is known when
     * the ReLU is reached (clones read what their originals read). A value
     * a rounding reader (rounded_fwd) or a rounding-through reader takes is
     * stored in half even where backward does not read it: a matmul then
     * reads its x rounded whether or not x is saved for backward, so that
     * freezing a layer (or evaluating) does not change what the forward
     * computes, with 16-bit GEMMs or without them. */
    for (int i = g->n_forward - 1; i >= 0; i--) {
        const fr_node *nd = &g->nodes[i];
        const int v = nd->out[0]; /* its readers all seen */
        if (v >= 0 && (size_t)v < nv0 && origin[v] == v && cast[v] && !f32_read[v])
            half_only[v] = 1;
        for (int j = 0; j < nd->n_in; j++) {
            const int x = nd->in[j];
            if (x < 0) continue;
            if (rounded_fwd(nd->op, j)) {
                const int r = g->vals[x].alias_of >= 0 ? g->vals[x].alias_of : x; /* a view */
                if (store_half && g->vals[r].alias_of < 0 && castable[origin[r]] &&
                    !read_back[origin[r]]) /* (what backward reads is decided above) */
                    cast[origin[r]] = 1;
                continue;
            }
            if (store_half && rounds_through(g, nd, j, half_only, origin) && castable[origin[x]]) {
                cast[origin[x]] = 1;
                through[v] = 1;
                continue;
            }
            f32_read[origin[x]] = 1;
        }
    }
    /* g16: backward values (dy) whose every reader takes them as a 16-bit
     * GEMM operand (or rounded as one, rounded_bwd), read directly (no
     * view): their producer may write the 16-bit value itself (the op
     * table's half_out), no f32 copy is made */
    if (g16) {
        if (!(g16_only = fr_calloc(ctx, nv0, FR_MEM_OTHER))) {
            st = FR_ERR_NOMEM;
            goto done;
        }
        for (size_t v = 0; v < nv0; v++) g16_only[v] = 1;
        for (int pos = 0; pos < n; pos++) {
            const fr_node *nd = &g->nodes[order[pos]];
            for (int j = 0; j < nd->n_in; j++) {
                int x = nd->in[j];
                if (x < 0 || (size_t)x >= nv0) continue;
                if (!half_slot(g, g16, nd, j)) g16_only[x] = 0;
                if (g->vals[x].alias_of >= 0) g16_only[g->vals[x].alias_of] = 0;
            }
        }
    }
#define EMIT(id)                                                                   \
    do {                                                                           \
        if (fr_grow(ctx, (void **)&out, &cap, k + 1, sizeof *out, FR_MEM_OTHER)) { \
            st = FR_ERR_NOMEM;                                                     \
            goto done;                                                             \
        }                                                                          \
        out[k++] = (id);                                                           \
    } while (0)
/* node i reads its input j through a CAST (cast_input), emitted before it */
#define CAST_INPUT(j, dt, round)                       \
    do {                                               \
        int c_ = cast_input(g, i, (j), (dt), (round)); \
        if (c_ < 0) {                                  \
            st = g->status;                            \
            goto done;                                 \
        }                                              \
        EMIT(c_);                                      \
    } while (0)
    for (int pos = 0; pos < n; pos++) {
        int i = order[pos];
        { /* bring saved halves back to f32 for late readers (and max pooling) */
            for (int j = 0; j < g->nodes[i].n_in; j++) {
                int x = g->nodes[i].in[j];
                /* Matmuls and convolutions read their input rounded, as a 16-bit
                 * GEMM with f32 accumulation would (products of 16-bit values are
                 * exact in f32); max pooling too, so that its backward, comparing
                 * rounded values, finds the same maximum. */
                fr_op op = g->nodes[i].op;
                if (x < 0 || (size_t)x >= nv0 ||
                    (is_forward(g, i, n_nodes0) && !rounded_fwd(op, j) &&
                     !(j == 0 && passes_through(&g->nodes[i], through, origin, nv0))) ||
                    half_slot(g, g16, &g->nodes[i], j))
                    continue;
                int r = g->vals[x].alias_of >= 0 ? g->vals[x].alias_of : x; /* one view deep */
                if (!cast[origin[r]] || hv[r] < 0) continue;
                const fr_op_info *info = fr_op_get(op);
                if (r == x && info->half_in && info->half_in(g, &g->nodes[i], j)) {
                    g->nodes[i].in[j] = hv[r]; /* the kernel widens as it reads */
                    continue;
                }
                int up, c = cast_node(g, hv[r], FR_F32, g->nodes[i].layer, &up);
                if (c < 0) {
                    st = g->status;
                    goto done;
                }
                EMIT(c);
                if (r != x) { /* the same view of the f32 copy */
                    fr_attr va = {0};
                    va.shape = g->vals[x].shape;
                    int w, vn = fr_graph_node(g, FR_OP_VIEW, &up, 1, &va, -1, 0, &w);
                    if (vn < 0) {
                        st = g->status;
                        goto done;
                    }
                    g->nodes[vn].layer = g->nodes[i].layer;
                    EMIT(vn);
                    up = w;
                }
                g->nodes[i].in[j] = up;
            }
        }
        for (int j = 0; j < g->nodes[i].n_in; j++) { /* a native 16-bit GEMM's operands */
            int x = g->nodes[i].in[j];
            if (x < 0 || !half_slot(g, g16, &g->nodes[i], j) ||
                g->vals[x].dtype != FR_F32) /* a 16-bit one is taken as it is */
                continue;
            int r = (size_t)x < nv0 && g->vals[x].alias_of >= 0 ? g->vals[x].alias_of : x;
            if ((size_t)r < nv0 && (cast[origin[r]] || (g16_only && g16_only[r])) && hv[r] >= 0) {
                g->nodes[i].in[j] = hv[r]; /* the saved half; a view of it reads alike */
                continue;
            }
            /* dy made by a backward sum that f32 readers take too (the
             * residual stream's gradient): the sum writes its 16-bit copy
             * as it writes dy (half_copy), one for every such reader */
            const int p = r == x && (size_t)x < nv0 ? g->vals[x].producer : -1;
            if (p >= 0 && hv[x] < 0 && !is_forward(g, p, n_nodes0) && g->nodes[p].out[0] == x &&
                !(g->nodes[p].accumulate & 1u) && writes_copy(g, &g->nodes[p])) {
                if ((hv[x] = copy_output(g, p, x, half)) < 0) {
                    st = g->status;
                    goto done;
                }
            }
            if (p >= 0 && hv[x] >= 0 && g->vals[hv[x]].producer == p) {
                g->nodes[i].in[j] = hv[x];
                continue;
            }
            /* a weight, dy, or an input saved in f32: a 16-bit copy for this
             * reader alone (a weight's is made from the master right before) */
            CAST_INPUT(j, half, FR_F32);
        }
        if (store_half) { /* mixed: weights of matmuls and convolutions rounded to 16 bits */
            fr_op op = g->nodes[i].op;
            int j = (op == FR_OP_LINEAR || op == FR_OP_CONV2D)           ? 1
                    : (op == FR_OP_LINEAR_BWD || op == FR_OP_CONV2D_BWD) ? 2
                                                                         : -1;
            int w = j >= 0 ? g->nodes[i].in[j] : -1;
            if (w >= 0 && (size_t)w < nv0 && g->vals[w].kind == FR_VAL_PARAM &&
                g->vals[w].dtype == FR_F32) {
                /* a rounded f32 copy for each reader, made from the master
                 * weight right before it and dropped right after: nothing
                 * 16-bit is held through the step (the weight does not
                 * change between its forward and its backward reader) */
                CAST_INPUT(j, FR_F32, half);
            }
        }
        for (int j = 0; j < g->nodes[i].n_in; j++) { /* 16-bit weights (pure half): f32 copies */
            int x = g->nodes[i].in[j]; /* (a quantized base's bytes, u8, are its op's own) */
            if (x < 0 || g->vals[x].kind != FR_VAL_PARAM ||
                (g->vals[x].dtype != FR_F16 && g->vals[x].dtype != FR_BF16) ||
                (gemm16_slot(g16, &g->nodes[i], j) && g->vals[x].dtype == half))
                continue;
            CAST_INPUT(j, FR_F32, FR_F32);
        }
        EMIT(i);
        if (g16_only && !is_forward(g, i, n_nodes0)) { /* dy made in 16 bits for its GEMMs */
            int v = g->nodes[i].out[0];
            const fr_op_info *pi = fr_op_get(g->nodes[i].op);
            if (v >= 0 && (size_t)v < nv0 && g16_only[v] && g->vals[v].kind == FR_VAL_STEP &&
                g->vals[v].dtype == FR_F32 && g->vals[v].alias_of < 0 &&
                !(g->nodes[i].accumulate & 1u) && pi->half_out && pi->half_out(g, &g->nodes[i])) {
                if ((hv[v] = half_output(g, i, v, half)) < 0) {
                    st = g->status;
                    goto done;
                }
            }
        }
        if (is_forward(g, i, n_nodes0)) { /* store what backward will read in half */
            int v = g->nodes[i].out[0];
            const fr_op_info *pi = fr_op_get(g->nodes[i].op);
            if (v >= 0 && (size_t)v < nv0 && cast[origin[v]] && pi->half_out &&
                pi->half_out(g, &g->nodes[i]) && !f32_read[origin[v]]) {
                /* nobody reads the f32 value: the producer writes the half */
                if ((hv[v] = half_output(g, i, v, half)) < 0) {
                    st = g->status;
                    goto done;
                }
                g->vals[hv[v]].saved = read_back[origin[v]];
                g->vals[v].saved = 0;
            } else if (v >= 0 && (size_t)v < nv0 && cast[origin[v]]) {
                /* an f32 forward reader: the producer writes both where its
                 * kernel can (the residual stream's sums), else a CAST after */
                int h = -1;
                if (writes_copy(g, &g->nodes[i])) {
                    if ((h = copy_output(g, i, v, half)) < 0) {
                        st = g->status;
                        goto done;
                    }
                } else {
                    int c = cast_node(g, v, half, g->nodes[i].layer, &h);
                    if (c < 0) {
                        st = g->status;
                        goto done;
                    }
                    EMIT(c);
                }
                hv[v] = h;
                g->vals[h].saved = read_back[origin[v]];
                g->vals[v].saved = 0;
            }
        }
    }
#undef CAST_INPUT
#undef EMIT
done:
    fr_free(ctx, cast);
    fr_free(ctx, f32_read);
    fr_free(ctx, read_back);
    fr_free(ctx, half_only);
    fr_free(ctx, castable);
    fr_free(ctx, through);
    fr_free(ctx, g16_only);
    fr_free(ctx, hv);
    if (st) {
        fr_free(ctx, out);
        return st;
    }
    fr_free(ctx, order);
    *order_io = out;
    *n_io = (int)k;
    fr_ops_resize_ws(g, out, (int)k); /* a convolution's depends on its image's dtype */
    return FR_OK;
}
