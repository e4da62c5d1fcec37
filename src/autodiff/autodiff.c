/* autodiff.c — reverse-mode differentiation over the forward graph, and the
 * backward rules of the op table. A rule sees the gradient of each output of
 * one forward node and emits the backward node(s) giving the gradients of its
 * inputs; the driver sums gradients of values used twice (ADD nodes) and
 * points parameter gradients at their persistent FR_VAL_GRAD values. */
#include <string.h>
#include "autodiff/autodiff.h"

/* Emit bwd op `op` for forward node `node`, with inputs in[], producing the
 * gradients of the forward inputs listed as wanted in need[] (output slot i
 * is the gradient of forward input i). Extra outputs past the forward
 * arity (workspace) are always created. */
static int emit(fr_graph *g, int node, fr_op op, const int *in, int n_in, const uint8_t *need,
                int *din) {
    const fr_node *f = &g->nodes[node];
    uint32_t skip = 0;
    for (int i = 0; i < f->n_in; i++)
        if (!need[i] || f->in[i] < 0) skip |= 1u << i;
    int out[FR_MAX_OUT];
    fr_attr attr = g->nodes[node].attr;
    if (fr_graph_node(g, op, in, n_in, &attr, node, skip, out) < 0) return g->status;
    int n = g->nodes[node].n_in < fr_op_get(op)->n_out ? g->nodes[node].n_in : fr_op_get(op)->n_out;
    for (int i = 0; i < n; i++) din[i] = out[i];
    return 0;
}

/* x is read only for dW: a layer whose weight gets no gradient (frozen, or
 * the base under adapters) passes none, so nothing is saved for its own
 * backward (dx = dy W and db = sum dy need no x) */
int fr_bw_linear(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[3] = {dout[0], need[1] ? f->in[0] : -1, f->in[1]};
    return emit(g, node, FR_OP_LINEAR_BWD, in, 3, need, din);
}

/* A quantized weight is frozen (a buffer): dx = dy W' alone, nothing saved
 * but the weight itself. Its bias is frozen with it. */
int fr_bw_qlinear(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    if (need[1] || (f->in[2] >= 0 && need[2]))
        return fr_fail(g->ctx, FR_ERR_ARG,
                       "qlinear: a quantized layer is frozen: its weight and bias take no "
                       "gradient");
    int in[2] = {dout[0], f->in[1]};
    return emit(g, node, FR_OP_QLINEAR_BWD, in, 2, need, din);
}

int fr_bw_conv2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[3] = {dout[0], f->in[0], f->in[1]};
    return emit(g, node, FR_OP_CONV2D_BWD, in, 3, need, din);
}

int fr_bw_maxpool2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    /* no y: the kernel finds each window's maximum again in x, and passing y
     * would keep it alive (and, in mixed precision, widen it) for nothing */
    int in[3] = {dout[0], f->in[0], -1};
    return emit(g, node, FR_OP_MAXPOOL2D_BWD, in, 3, need, din);
}

int fr_bw_avgpool2d(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    return emit(g, node, FR_OP_AVGPOOL2D_BWD, dout, 1, need, din);
}

int fr_bw_global_avgpool(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    return emit(g, node, FR_OP_GLOBAL_AVGPOOL_BWD, dout, 1, need, din);
}

/* The backward op follows the forward op in the table (RELU -> RELU_BWD). */
int fr_bw_by_output(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[2] = {dout[0], f->out[0]};
    return emit(g, node, (fr_op)(f->op + 1), in, 2, need, din);
}

int fr_bw_by_input(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[2] = {dout[0], f->in[0]};
    return emit(g, node, (fr_op)(f->op + 1), in, 2, need, din);
}

int fr_bw_batchnorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[5] = {dout[0], f->in[0], f->in[1], f->out[1], f->out[2]};
    uint8_t n3[5] = {need[0], need[1], need[2], 0, 0};
    return emit(g, node, FR_OP_BATCHNORM_BWD, in, 5, n3, din);
}

int fr_bw_layernorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[5] = {dout[0], f->in[0], f->in[1], f->out[1], f->out[2]};
    return emit(g, node, FR_OP_LAYERNORM_BWD, in, 5, need, din);
}

int fr_bw_dropout(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[2] = {dout[0], f->out[1]};
    return emit(g, node, FR_OP_DROPOUT_BWD, in, 2, need, din);
}

int fr_bw_add(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    (void)g;
    (void)node;
    din[0] = need[0] ? dout[0] : -1;
    din[1] = need[1] ? dout[0] : -1;
    return 0;
}

int fr_bw_view(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    din[0] = -1;
    if (!need[0]) return 0;
    fr_attr a = {0};
    a.shape = g->vals[g->nodes[node].in[0]].shape;
    int out;
    if (fr_graph_node(g, FR_OP_VIEW, dout, 1, &a, node, 0, &out) < 0) return g->status;
    din[0] = out;
    return 0;
}

/* Losses are the root: their output gradient is 1 (times attr.scale). */
int fr_bw_loss(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    (void)dout;
    const fr_node *f = &g->nodes[node];
    int in[2] = {f->in[0], f->in[1]};
    uint8_t n1[2] = {need[0], 0};
    return emit(g, node, (fr_op)(f->op + 1), in, 2, n1, din);
}

/* The fused head is the root too: nothing saved but its inputs (the chunks'
 * logits and their logsumexp are made again in backward). */
int fr_bw_linear_ce(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    (void)dout;
    const fr_node *f = &g->nodes[node];
    int in[4] = {f->in[0], f->in[1], f->in[2], f->in[3]};
    uint8_t n3[4] = {need[0], need[1], need[2], 0};
    return emit(g, node, FR_OP_LINEAR_CE_BWD, in, 4, n3, din);
}

/* The table rows' gradient: the ids are integers, never differentiated. */
int fr_bw_embedding(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[2] = {dout[0], f->in[0]};
    uint8_t n1[2] = {0, need[1]};
    return emit(g, node, FR_OP_EMBEDDING_BWD, in, 2, n1, din);
}

/* y = x + W[t]: x's gradient is dy itself (as ADD passes it), the table's a
 * sum over the batch by POS_EMBEDDING_BWD. */
int fr_bw_pos_embedding(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    if (need[1]) {
        uint8_t n1[2] = {0, 1};
        int st = emit(g, node, FR_OP_POS_EMBEDDING_BWD, dout, 1, n1, din);
        if (st) return st;
    }
    din[0] = need[0] ? dout[0] : -1;
    return 0;
}

/* Nothing recomputed here: the kernel retiles from qkv, y and the saved lse. */
int fr_bw_attention(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[4] = {dout[0], f->in[0], f->out[0], f->out[1]};
    return emit(g, node, FR_OP_ATTENTION_BWD, in, 4, need, din);
}

/* x and the saved rstd (y is not kept: dx and dw need only x rstd). */
int fr_bw_rmsnorm(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[4] = {dout[0], f->in[0], f->in[1], f->out[1]};
    return emit(g, node, FR_OP_RMSNORM_BWD, in, 4, need, din);
}

/* gate and up (silu and its slope are made again from gate). */
int fr_bw_swiglu(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    const fr_node *f = &g->nodes[node];
    int in[3] = {dout[0], f->in[0], f->in[1]};
    return emit(g, node, FR_OP_SWIGLU_BWD, in, 3, need, din);
}

/* dq, dk, dv from dqkv alone: the rotation is linear, nothing saved */
int fr_bw_rope_qkv(fr_graph *g, int node, const int *dout, const uint8_t *need, int *din) {
    int in[1] = {dout[0]};
    return emit(g, node, FR_OP_ROPE_QKV_BWD, in, 1, need, din);
}

/* Deliver gradient value v into parameter gradient gv. When v was made by
 * this rule for this input alone, its producer writes gv directly (no copy);
 * a gradient passed through (add, view) is copied or added by a COPY node. */
static int route_to_param_grad(fr_graph *g, int v, int gv, int first_new_node) {
    int p = g->vals[v].producer;
    int shared = p < first_new_node || fr_op_get(g->nodes[p].op)->view;
    if (shared) {
        int n = fr_graph_node(g, FR_OP_COPY, &v, 1, NULL, -1, 0, NULL);
        if (n < 0) return g->status;
        int tmp = g->nodes[n].out[0];
        g->vals[tmp].producer = -1; /* replaced by gv below */
        g->nodes[n].out[0] = gv;
        g->nodes[n].accumulate = 1u;
        return FR_OK;
    }
    fr_node *n = &g->nodes[p];
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i] == v) {
            n->out[i] = gv;
            n->accumulate |= 1u << i;
        }
    g->vals[v].producer = -1; /* orphaned: no node reads or writes it */
    return FR_OK;
}

fr_status fr_autodiff(fr_graph *g, const int *grad_value) {
    fr_ctx *ctx = g->ctx;
    size_t nv = g->n_vals;
    int nf = (int)g->n_nodes;
    g->n_forward = nf;
    int *grad = fr_alloc(ctx, nv * sizeof *grad, FR_MEM_OTHER);
    uint8_t *needs = fr_calloc(ctx, nv, FR_MEM_OTHER);
    if (!grad || !needs) {
        fr_free(ctx, grad);
        fr_free(ctx, needs);
        return FR_ERR_NOMEM;
    }
    for (size_t v = 0; v < nv; v++) grad[v] = -1;
    /* A value needs a gradient when a trainable parameter flows into it. */
    for (size_t v = 0; v < nv; v++)
        if (g->vals[v].kind == FR_VAL_PARAM && grad_value[v] >= 0) needs[v] = 1;
    for (int i = 0; i < nf; i++) {
        const fr_node *n = &g->nodes[i];
        int any = 0;
        for (int j = 0; j < n->n_in; j++) any |= n->in[j] >= 0 && needs[n->in[j]];
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j] >= 0) needs[n->out[j]] = (uint8_t)any;
    }
    fr_status st = FR_OK;
    for (int i = nf - 1; i >= 0 && st == FR_OK; i--) {
        fr_node n = g->nodes[i]; /* copy: rules may grow g->nodes */
        int dout[FR_MAX_OUT], din[FR_MAX_IN];
        uint8_t need[FR_MAX_IN] = {0};
        int has = 0;
        for (int j = 0; j < FR_MAX_OUT; j++) {
            dout[j] = n.out[j] >= 0 ? grad[n.out[j]] : -1;
            has |= dout[j] >= 0;
        }
        if (n.out[0] == g->loss) has = 1;
        int want = 0;
        for (int j = 0; j < n.n_in; j++) {
            need[j] = n.in[j] >= 0 && needs[n.in[j]];
            want |= need[j];
        }
        if (!has || !want) continue;
        const fr_op_info *info = fr_op_get(n.op);
        for (int j = 0; j < FR_MAX_IN; j++) din[j] = -1;
        int first_new = (int)g->n_nodes;
        st = info->backward(g, i, dout, need, din);
        for (int j = 0; j < n.n_in && st == FR_OK; j++) {
            int x = n.in[j], d = din[j];
            if (d < 0) continue;
            if (g->vals[x].kind == FR_VAL_PARAM) {
                st = route_to_param_grad(g, d, grad_value[x], first_new);
            } else if (grad[x] < 0) {
                grad[x] = d;
            } else { /* used twice: sum the gradients */
                int in2[2] = {grad[x], d}, s;
                if (fr_graph_node(g, FR_OP_ADD, in2, 2, NULL, -1, 0, &s) < 0) st = FR_ERR_NOMEM;
                else grad[x] = s;
            }
        }
    }
    /* A forward value read by a backward node is saved for backward. */
    for (size_t i = (size_t)nf; i < g->n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++) {
            int x = g->nodes[i].in[j];
            if (x < 0) continue;
            while (g->vals[x].alias_of >= 0 && g->vals[x].producer >= 0 && g->vals[x].producer < nf)
                x = g->vals[x].alias_of;
            int p = g->vals[x].producer;
            if (p >= 0 && p < nf) g->vals[x].saved = 1;
        }
    fr_free(ctx, grad);
    fr_free(ctx, needs);
    return st;
}
