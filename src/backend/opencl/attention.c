/* attention.c (opencl) — the ATTENTION / ATTENTION_BWD kernels of the OpenCL
 * backend: shape checks and error messages as the CPU's, then
 * kernels/attention.cl (forward: a work-group per (b, head, query tile),
 * online softmax; backward: D, then dk/dv a key row per work-item and dq a
 * query row per work-item). Grouped-query attention with attr.kv_heads
 * (the CPU's layout). No workspace. Also generation's ATTENTION_KV
 * (a chunk of positions over the KV caches) and LAST_ROW, as the CPU's
 * (backend/cpu/attention.h). */
#include "backend/opencl/attention.h"
#include <math.h>
#include <stdint.h>
#include "backend/cpu/reduce.h"
#include "backend/kcheck.h"

#define ATTN_QT 32      /* rows per work-group at most: attention.cl's KT */
#define ATTN_TILE 1536  /* floats of one local tile: attention.cl's ATTN_TILE */
#define ATTN_BTILE 1024 /* of the backward: attention.cl's ATTN_BTILE */

int64_t fr_cl_ws_attention(const fr_graph *g, const fr_node *n, int j) {
    (void)g, (void)n;
    return j == 2 ? 1 : -1;
}

static int attn_dims(fr_kernel_call *c, const char *op, const fr_tensor *qkv, cl_int *B, cl_int *T,
                     cl_int *NH, cl_int *HS, cl_int *NKV) {
    fr_attn_dims d;
    int st = fr_kcheck_attention(c, op, qkv, &d);
    if (!st) *B = d.B, *T = d.T, *NH = d.NH, *HS = d.HS, *NKV = d.NKV;
    return st;
}

/* The 2-D range (B NH, T rounded up to R), work-groups (1, R). */
static int run_rows(fr_ctx *ctx, fr_cl *cl, cl_kernel k, int B, int NH, int T, int R) {
    const size_t global[2] = {(size_t)B * (size_t)NH, ((size_t)T + R - 1) / R * R};
    const size_t local[2] = {1, (size_t)R};
    return fr_cl_run(ctx, cl, k, 2, global, local);
}

/* Rows per tile of a kernel that keeps tiles of `tile` floats in local
 * memory (R HS <= tile, at most ATTN_QT); 0 when a head is too large. */
static int tile_rows(int tile, int HS) {
    const int r = tile / HS;
    return r < ATTN_QT ? r : ATTN_QT;
}

/* attn_fwd: y (B,T,C) and, when lse is given, lse (B,NH,T) from qkv
 * (B,T,(NH+2NKV)HS). */
static int run_fwd(fr_kernel_call *c, const fr_tensor *qkv_t, const fr_tensor *y_t,
                   const fr_tensor *lse_t, cl_int B, cl_int T, cl_int NH, cl_int HS, cl_int NKV) {
    int st;
    fr_cl *cl = fr_cl_of(c->ctx);
    cl_kernel k = fr_cl_kernel(c->ctx, cl, "attention", "attn_fwd");
    if (!k) return FR_ERR_ARG;
    const cl_mem qkv = fr_cl_mem(qkv_t), y = fr_cl_mem(y_t), lse = lse_t ? fr_cl_mem(lse_t) : NULL;
    const cl_ulong qkv_off = fr_cl_off(qkv_t), y_off = fr_cl_off(y_t);
    const cl_ulong lse_off = lse ? fr_cl_off(lse_t) : 0;
    const cl_int has_lse = lse != NULL;
    const float s = 1.0f / sqrtf((float)HS);
    const cl_int R = tile_rows(ATTN_TILE, HS + 1); /* O rows are HS + 1 apart */
    if (R < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: attention: head size %d is over %d", HS,
                       ATTN_TILE - 1);
    st = FR_CL_ARGS(c->ctx, k, sizeof qkv, &qkv, sizeof qkv_off, &qkv_off, sizeof y, &y,
                    sizeof y_off, &y_off, sizeof lse, &lse, sizeof lse_off, &lse_off,
                    sizeof has_lse, &has_lse, sizeof T, &T, sizeof NH, &NH, sizeof HS, &HS,
                    sizeof s, &s, sizeof R, &R, sizeof NKV, &NKV);
    return st ? st : run_rows(c->ctx, cl, k, B, NH, T, R);
}

// qkv is (B,T,(NH+2NKV)HS) (3C when NKV = NH), y is (B,T,C), lse is (B,NH,T) (may be
// absent), ws unused
int fr_cl_k_attention(fr_kernel_call *c) {
    cl_int B, T, NH, HS, NKV;
    int st = attn_dims(c, "attention", &c->in[0], &B, &T, &NH, &HS, &NKV);
    if (st) return st;
    if (B <= 0 || T <= 0 || HS <= 0) return FR_OK;
    return run_fwd(c, &c->in[0], &c->out[0], &c->out[1], B, T, NH, HS, NKV);
}

// dy, y are (B,T,C), qkv and dqkv (B,T,(NH+2NKV)HS), lse and D (B,NH,T), ws unused;
// dk, dv of a kv head: a work-group per (b, kv head, key tile) over its group's heads
int fr_cl_k_attention_bwd(fr_kernel_call *c) {
    cl_int B, T, NH, HS, NKV;
    int st = attn_dims(c, "attention_bwd", &c->in[1], &B, &T, &NH, &HS, &NKV);
    if (st) return st;
    if (!fr_cl_mem(&c->out[0])) return FR_OK;
    if (acc_bit(c, 0))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "attention_bwd: dqkv is written whole, it cannot be added into");
    if (!fr_cl_mem(&c->out[1]) || !fr_cl_mem(&c->in[3]))
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_bwd: the saved lse or D's buffer is missing");
    if (B <= 0 || T <= 0 || HS <= 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    const cl_mem dy = fr_cl_mem(&c->in[0]), qkv = fr_cl_mem(&c->in[1]), y = fr_cl_mem(&c->in[2]);
    const cl_mem lse = fr_cl_mem(&c->in[3]), D = fr_cl_mem(&c->out[1]),
                 dqkv = fr_cl_mem(&c->out[0]);
    const cl_ulong dy_off = fr_cl_off(&c->in[0]), qkv_off = fr_cl_off(&c->in[1]),
                   y_off = fr_cl_off(&c->in[2]), lse_off = fr_cl_off(&c->in[3]),
                   D_off = fr_cl_off(&c->out[1]), dqkv_off = fr_cl_off(&c->out[0]);
    const float s = 1.0f / sqrtf((float)HS);
    const cl_int R = tile_rows(ATTN_BTILE, HS + 1);
    if (R < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: attention_bwd: head size %d is over %d", HS,
                       ATTN_BTILE - 1);

    cl_kernel kd = fr_cl_kernel(c->ctx, cl, "attention", "attn_bwd_d");
    if (!kd) return FR_ERR_ARG;
    st = FR_CL_ARGS(c->ctx, kd, sizeof dy, &dy, sizeof dy_off, &dy_off, sizeof y, &y, sizeof y_off,
                    &y_off, sizeof D, &D, sizeof D_off, &D_off, sizeof T, &T, sizeof NH, &NH,
                    sizeof HS, &HS);
    if (!st) st = run_rows(c->ctx, cl, kd, B, NH, T, ATTN_QT);
    static const char *const passes[2] = {"attn_bwd_kv", "attn_bwd_q"};
    for (int i = 0; i < 2 && !st; i++) {
        cl_kernel k = fr_cl_kernel(c->ctx, cl, "attention", passes[i]);
        if (!k) return FR_ERR_ARG;
        st = FR_CL_ARGS(c->ctx, k, sizeof dy, &dy, sizeof dy_off, &dy_off, sizeof qkv, &qkv,
                        sizeof qkv_off, &qkv_off, sizeof lse, &lse, sizeof lse_off, &lse_off,
                        sizeof D, &D, sizeof D_off, &D_off, sizeof dqkv, &dqkv, sizeof dqkv_off,
                        &dqkv_off, sizeof T, &T, sizeof NH, &NH, sizeof HS, &HS, sizeof s, &s,
                        sizeof R, &R, sizeof NKV, &NKV);
        if (!st) st = run_rows(c->ctx, cl, k, B, i == 0 ? NKV : NH, T, R);
    }
    return st;
}

/* ---- generation (ops.h: ATTENTION_KV, LAST_ROW) ---- */

// qkv is (B,P,(NH+2NKV)HS), K and V are (B,NKV,Tc,HS), y is (B,P,C), ws unused; pos = c->step.
// attn_kv_store writes the chunk's keys and values at rows pos .. pos+P-1; at
// pos 0 the chunk attends over itself (attn_fwd, the forward's kernel), past
// it each row over the caches (attn_kv_fwd).
int fr_cl_k_attention_kv(fr_kernel_call *c) {
    cl_int B, P, NH, HS, NKV;
    int st = attn_dims(c, "attention_kv", &c->in[0], &B, &P, &NH, &HS, &NKV);
    if (st) return st;
    const fr_shape *ks = &c->in[1].shape;
    if (ks->ndim != 4 || ks->d[0] != B || ks->d[1] != NKV || ks->d[3] != HS ||
        !fr_shape_eq(ks, &c->in[2].shape) || ks->d[2] < P || ks->d[2] > INT32_MAX ||
        c->step > (uint64_t)(ks->d[2] - P))
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "attention_kv: positions %llu .. %llu do not fit caches of (%d, %d, %lld, "
                       "%d) (batch, heads, positions, head size)",
                       (unsigned long long)c->step, (unsigned long long)c->step + P - 1, B, NKV,
                       ks->ndim == 4 ? (long long)ks->d[2] : 0LL, HS);
    if (!fr_cl_mem(&c->in[1]) || !fr_cl_mem(&c->in[2]) || !fr_cl_mem(&c->in[0]) ||
        !fr_cl_mem(&c->out[0]))
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_kv: a cache, qkv or y is not bound");
    if (B <= 0 || P <= 0 || HS <= 0) return FR_OK;
    fr_cl *cl = fr_cl_of(c->ctx);
    const cl_mem qkv = fr_cl_mem(&c->in[0]), K = fr_cl_mem(&c->in[1]), V = fr_cl_mem(&c->in[2]);
    const cl_ulong qkv_off = fr_cl_off(&c->in[0]), k_off = fr_cl_off(&c->in[1]),
                   v_off = fr_cl_off(&c->in[2]);
    const cl_int Tc = (cl_int)ks->d[2], pos = (cl_int)c->step;
    cl_kernel ks_k = fr_cl_kernel(c->ctx, cl, "attention", "attn_kv_store");
    if (!ks_k) return FR_ERR_ARG;
    st = FR_CL_ARGS(c->ctx, ks_k, sizeof qkv, &qkv, sizeof qkv_off, &qkv_off, sizeof K, &K,
                    sizeof k_off, &k_off, sizeof V, &V, sizeof v_off, &v_off, sizeof P, &P,
                    sizeof NH, &NH, sizeof HS, &HS, sizeof Tc, &Tc, sizeof pos, &pos, sizeof NKV,
                    &NKV);
    const size_t store[2] = {(size_t)B * (size_t)P, (size_t)NKV * (size_t)HS};
    if (!st) st = fr_cl_run(c->ctx, cl, ks_k, 2, store, NULL);
    if (st) return st;
    if (pos == 0) return run_fwd(c, &c->in[0], &c->out[0], NULL, B, P, NH, HS, NKV);
    const cl_int R = tile_rows(ATTN_TILE, HS + 1);
    if (R < 1)
        return fr_fail(c->ctx, FR_ERR_ARG, "opencl: attention_kv: head size %d is over %d", HS,
                       ATTN_TILE - 1);
    cl_kernel k = fr_cl_kernel(c->ctx, cl, "attention", "attn_kv_fwd");
    if (!k) return FR_ERR_ARG;
    const cl_mem y = fr_cl_mem(&c->out[0]);
    const cl_ulong y_off = fr_cl_off(&c->out[0]);
    const float s = 1.0f / sqrtf((float)HS);
    st = FR_CL_ARGS(c->ctx, k, sizeof qkv, &qkv, sizeof qkv_off, &qkv_off, sizeof K, &K,
                    sizeof k_off, &k_off, sizeof V, &V, sizeof v_off, &v_off, sizeof y, &y,
                    sizeof y_off, &y_off, sizeof P, &P, sizeof NH, &NH, sizeof HS, &HS, sizeof Tc,
                    &Tc, sizeof pos, &pos, sizeof s, &s, sizeof R, &R, sizeof NKV, &NKV);
    return st ? st : run_rows(c->ctx, cl, k, B, NH, P, R);
}

// x is (B,T,...) of any dtype, y is (B,1,...): y[b] = x[b, T-1], one copy a batch row
int fr_cl_k_last_row(fr_kernel_call *c) {
    int64_t B, T;
    size_t row;
    int st = fr_kcheck_last_row(c, &B, &T, &row);
    if (st || row == 0) return st;
    fr_cl *cl = fr_cl_of(c->ctx);
    for (int64_t b = 0; b < B && !st; b++)
        st = fr_cl_copy(c->ctx, cl, fr_cl_mem(&c->out[0]), c->out[0].off + (size_t)b * row,
                        fr_cl_mem(&c->in[0]), c->in[0].off + (size_t)(b * T + T - 1) * row, row);
    return st;
}
