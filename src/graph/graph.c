/* graph.c — building the IR: values and nodes, checked by each op's shape
 * rule as they are added. Owns no memory policy: the arrays are metadata
 * (category other) and values carry only shapes and kinds. */
#include <string.h>
#include "graph/graph.h"

void fr_graph_init(fr_graph *g, fr_ctx *ctx) {
    memset(g, 0, sizeof *g);
    g->ctx = ctx;
    g->input = g->label = g->loss = g->logits = g->hits = -1;
}

void fr_graph_release(fr_graph *g) {
    fr_free(g->ctx, g->vals);
    fr_free(g->ctx, g->nodes);
    g->vals = NULL;
    g->nodes = NULL;
    g->n_vals = g->n_nodes = g->cap_vals = g->cap_nodes = 0;
}

int fr_graph_value(fr_graph *g, fr_value_kind kind, fr_dtype dt, fr_shape shape) {
    if (fr_grow(g->ctx, (void **)&g->vals, &g->cap_vals, g->n_vals + 1, sizeof *g->vals,
                FR_MEM_OTHER)) {
        g->status = FR_ERR_NOMEM;
        return -1;
    }
    fr_value *v = &g->vals[g->n_vals];
    memset(v, 0, sizeof *v);
    v->shape = shape;
    v->dtype = dt;
    v->kind = kind;
    v->producer = -1;
    v->alias_of = -1;
    v->param = -1;
    return (int)g->n_vals++;
}

int fr_graph_node(fr_graph *g, fr_op op, const int *in, int n_in, const fr_attr *attr, int fwd,
                  uint32_t skip, int *out_ids) {
    const fr_op_info *info = fr_op_get(op);
    if (n_in != info->n_in) {
        g->status =
            fr_fail(g->ctx, FR_ERR_ARG, "%s takes %d inputs, got %d", info->name, info->n_in, n_in);
        return -1;
    }
    if (fr_grow(g->ctx, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes,
                FR_MEM_OTHER)) {
        g->status = FR_ERR_NOMEM;
        return -1;
    }
    fr_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->n_in = n_in;
    n->n_out = info->n_out;
    n->fwd = fwd;
    n->layer = fwd >= 0 ? g->nodes[fwd].layer : -1;
    if (attr) n->attr = *attr;
    for (int i = 0; i < FR_MAX_IN; i++) n->in[i] = i < n_in ? in[i] : -1;
    for (int i = 0; i < FR_MAX_OUT; i++) n->out[i] = -1;

    fr_shape shapes[FR_MAX_OUT] = {0};
    fr_dtype dts[FR_MAX_OUT] = {0};
    uint8_t batched[FR_MAX_OUT] = {0};
    int st = info->shape(g, n, shapes, dts, batched);
    if (st != 0) {
        g->status = (fr_status)st;
        return -1;
    }
    int id = (int)g->n_nodes;
    for (int i = 0; i < info->n_out; i++) {
        if (skip & (1u << i)) continue;
        int v = fr_graph_value(g, FR_VAL_STEP, dts[i], shapes[i]);
        if (v < 0) return -1;
        g->vals[v].producer = id;
        g->vals[v].batched = batched[i];
        g->nodes[id].out[i] = v; /* g->nodes may not move here, but be explicit */
    }
    if (info->view) g->vals[g->nodes[id].out[0]].alias_of = in[0];
    g->n_nodes++;
    if (out_ids)
        for (int i = 0; i < info->n_out; i++) out_ids[i] = g->nodes[id].out[i];
    return id;
}

void fr_graph_dump(const fr_graph *g, FILE *out) {
    char buf[64];
    for (size_t i = 0; i < g->n_nodes; i++) {
        const fr_node *n = &g->nodes[i];
        fprintf(out, "%3zu %-20s in:", i, fr_op_get(n->op)->name);
        for (int j = 0; j < n->n_in; j++) fprintf(out, " %d", n->in[j]);
        fprintf(out, "  out:");
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            fprintf(out, " %d", v);
            if (v >= 0) fprintf(out, "%s", fr_shape_str(&g->vals[v].shape, buf, sizeof buf));
        }
        fprintf(out, "\n");
    }
}
