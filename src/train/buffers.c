/* buffers.c — rank 0's buffers to every rank (buffers.h says why and when). */
#include <stdio.h>
#include "train/buffers.h"

fr_status fr_buffers_bcast(fr_ctx *ctx, const fr_comm *c, fr_model *m) {
    fr_status st = FR_OK;
    for (size_t i = 0; i < m->n_params && !st; i++) {
        fr_param *p = &m->params[i];
        if (p->trainable) continue;
        char what[160];
        snprintf(what, sizeof what, "rank 0's buffer %.100s", p->name);
        st = fr_comm_bcast(ctx, c, p->data,
                           (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype), what);
    }
    return st;
}
