/* attention.cl — causal multi-head self-attention on the fused qkv (B,T,3C)
 * layout, forward and backward, as src/backend/cpu/attention.c computes it
 * (FlashAttention-2): an online softmax over key tiles in the forward, P
 * recomputed from lse in the backward, nothing T x T stored.
 *
 * Layout: q, k, v of (b, head h, position t) are the HS floats at
 * qkv[b T 3C + t 3C + {0, C, 2C} + h HS]; y, dy at b T C + t C + h HS; lse and
 * D at (b NH + h) T + t. Scale s = 1/sqrt(HS); query t attends keys 0..t.
 * Grouped-query attention (NKV kv heads, G = NH / NKV): qkv rows are
 * W = (NH + 2 NKV) HS wide, q at column h HS, k of kv head g at C + g HS, v
 * at C + CK + g HS (CK = NKV HS); query head h reads kv head h / G, and the
 * backward's dk, dv of a kv head sum its group's heads in increasing order.
 * NKV = NH is the layout above, the same operations.
 *
 * Each output row is computed by one work-item in a fixed order (no atomics),
 * so the same inputs give the same bits:
 *  - forward: a work-group per (b, head, tile of R queries), a work-item per
 *    query row walking key tiles of R left to right (online softmax);
 *  - backward: D per row; then a work-group per (b, kv head, tile of R keys),
 *    a work-item per key row, for dk, dv (the group's heads in increasing
 *    order, in each query rows t >= u in increasing t),
 *    and one per (b, head, tile of R queries) for dq (keys u <= t in
 *    increasing u) — the CPU's two-pass mode, a row at a time.
 * Tiles live in local memory: R = min(KT, tile floats / (HS + 1)) rows, the
 * host's choice (attention.c), a function of HS only, so the bits do not
 * depend on the device's limits. No local array is larger than a tile. */
#pragma OPENCL FP_CONTRACT OFF

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t; /* D's dot product, in double as on the CPU */
#else
typedef float acc_t;
#endif

#define KT 32 /* at most this many rows per tile (scores held in private memory) */
#define ATTN_TILE 1536 /* floats of a local tile of the forward (4 tiles: 24 KiB) */
#define ATTN_BTILE 1024 /* of the backward (6 tiles: 24 KiB) */

/* y (B,T,C), lse (B,NH,T) (has_lse 0: not written) from qkv (B,T,3C).
 * Global size (B NH, ceil(T / R) R), work-groups (1, R) of R <= KT rows with
 * R (HS + 1) <= ATTN_TILE. Local memory holds the group's query tile Q
 * (transposed, Qt[d R + r]), its output rows O (Os[r (HS + 1) + d]: the odd
 * stride puts the rows of a column on different banks) and each key tile's
 * K (transposed, Kt[d R + c]) and V (Vs[c HS + d]), loaded with consecutive
 * work-items on consecutive columns. The loops run over one tile's keys c or
 * one row's columns d innermost, each element summed in the same order as a
 * plain dot product (scores over d increasing, outputs over keys
 * increasing): loops a compiler can vectorize without reassociating. */
__kernel void attn_fwd(__global const float *qkv, ulong qkv_off, __global float *y, ulong y_off,
                       __global float *lse, ulong lse_off, int has_lse, int T, int NH, int HS,
                       float s, int R, int NKV) {
    __local float Qt[ATTN_TILE], Os[ATTN_TILE], Kt[ATTN_TILE], Vs[ATTN_TILE];
    const int bh = (int)get_group_id(0), r = (int)get_local_id(1);
    const int q0 = (int)get_group_id(1) * R, t = q0 + r;
    const int b = bh / NH, h = bh % NH, RH = R * HS, P = HS + 1;
    const long C = (long)NH * HS, CK = (long)NKV * HS, C3 = C + 2 * CK;
    __global const float *base = qkv + qkv_off + (long)b * T * C3 + (long)h * HS;
    __global const float *kb = qkv + qkv_off + (long)b * T * C3 + C + (long)(h / (NH / NKV)) * HS;
    for (int i = r; i < RH; i += R) {
        const int row = i / HS, d = i % HS;
        Qt[d * R + row] = q0 + row < T ? base[(long)(q0 + row) * C3 + d] : 0.0f;
    }
    __local float *O = Os + r * P;
    for (int d = 0; d < HS; d++) O[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    float S[KT];
    const int last = min(q0 + R, T) - 1; /* the tile's last query */
    for (int k0 = 0; k0 <= last; k0 += R) {
        barrier(CLK_LOCAL_MEM_FENCE); /* the previous tile's K, V are read */
        for (int i = r; i < RH; i += R) {
            const int row = i / HS, d = i % HS;
            const bool in = k0 + row < T;
            Kt[d * R + row] = in ? kb[(long)(k0 + row) * C3 + d] : 0.0f;
            Vs[i] = in ? kb[(long)(k0 + row) * C3 + CK + d] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int n = t < T ? min(R, t - k0 + 1) : 0; /* visible keys of this tile */
        if (n <= 0) continue;
        for (int c = 0; c < n; c++) S[c] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float qd = Qt[d * R + r];
            for (int c = 0; c < n; c++) S[c] += qd * Kt[d * R + c];
        }
        float mx = m;
        for (int c = 0; c < n; c++) {
            S[c] = s * S[c];
            mx = S[c] > mx ? S[c] : mx;
        }
        float sum = 0.0f;
        for (int c = 0; c < n; c++) {
            S[c] = exp(S[c] - mx);
            sum += S[c];
        }
        if (mx != m) { /* m = -inf before the first tile: alpha 0 */
            const float alpha = exp(m - mx);
            for (int d = 0; d < HS; d++) O[d] *= alpha;
            l *= alpha;
        }
        l += sum;
        m = mx;
        for (int c = 0; c < n; c++) {
            const float p = S[c];
            for (int d = 0; d < HS; d++) O[d] += p * Vs[c * HS + d];
        }
    }
    if (t >= T) return;
    __global float *yt = y + y_off + ((long)b * T + t) * C + (long)h * HS;
    const float inv = 1.0f / l;
    for (int d = 0; d < HS; d++) yt[d] = O[d] * inv;
    if (has_lse) lse[lse_off + (long)bh * T + t] = m + log(l);
}

/* D[b,h,t] = dy[b,t,h] . y[b,t,h] over HS. Global size (B NH, T). */
__kernel void attn_bwd_d(__global const float *dy, ulong dy_off, __global const float *y,
                         ulong y_off, __global float *D, ulong D_off, int T, int NH, int HS) {
    const int bh = (int)get_global_id(0), t = (int)get_global_id(1);
    if (t >= T) return;
    const int b = bh / NH, h = bh % NH;
    const long o = ((long)b * T + t) * NH * HS + (long)h * HS;
    acc_t acc = 0;
    for (int d = 0; d < HS; d++) acc += (acc_t)dy[dy_off + o + d] * (acc_t)y[y_off + o + d];
    D[D_off + (long)bh * T + t] = (float)acc;
}

/* dk, dv of key row u = k0 + r (work-item r of a group of R): over the query
 * tiles from k0 on, t increasing, with p = exp(s q_t.k_u - lse_t) and
 * ds = s (p (dy_t.v_u - D_t)): dv_u += p dy_t, dk_u += ds q_t. Local memory:
 * the group's K, V rows (transposed), its dK, dV accumulators (rows HS + 1
 * apart), each query tile's Q and dY (transposed), lse and D; R (HS + 1) <=
 * ATTN_BTILE. Loops innermost over a tile's rows or a row's columns, each
 * element summed in the plain order, as the forward. Global size
 * (B NH, ceil(T / R) R), work-groups (1, R). */
__kernel void attn_bwd_kv(__global const float *dy, ulong dy_off, __global const float *qkv,
                          ulong qkv_off, __global const float *lse, ulong lse_off,
                          __global const float *D, ulong D_off, __global float *dqkv,
                          ulong dqkv_off, int T, int NH, int HS, float s, int R, int NKV) {
    __local float Kt[ATTN_BTILE], Vt[ATTN_BTILE], dKs[ATTN_BTILE], dVs[ATTN_BTILE];
    __local float Qt[ATTN_BTILE], dYt[ATTN_BTILE], Ls[KT], Ds[KT];
    const int bg = (int)get_group_id(0), r = (int)get_local_id(1); /* (b, kv head) */
    const int k0 = (int)get_group_id(1) * R, u = k0 + r;
    const int b = bg / NKV, g = bg % NKV, G = NH / NKV, RH = R * HS, P = HS + 1;
    const long C = (long)NH * HS, CK = (long)NKV * HS, C3 = C + 2 * CK;
    const long krow0 = (long)b * T * C3 + C + (long)g * HS;
    __global const float *kb = qkv + qkv_off + krow0;
    for (int i = r; i < RH; i += R) {
        const int row = i / HS, d = i % HS;
        const bool in = k0 + row < T;
        Kt[d * R + row] = in ? kb[(long)(k0 + row) * C3 + d] : 0.0f;
        Vt[d * R + row] = in ? kb[(long)(k0 + row) * C3 + CK + d] : 0.0f;
    }
    __local float *dK = dKs + r * P, *dV = dVs + r * P;
    for (int d = 0; d < HS; d++) dK[d] = 0.0f, dV[d] = 0.0f;
    float QK[KT], DV[KT];
    for (int h = g * G; h < (g + 1) * G; h++) { /* the group's heads, in order */
        const int bh = b * NH + h;
        __global const float *base = qkv + qkv_off + (long)b * T * C3 + (long)h * HS;
        __global const float *dyb = dy + dy_off + (long)b * T * C + (long)h * HS;
        __global const float *lb = lse + lse_off + (long)bh * T, *Db = D + D_off + (long)bh * T;
        for (int q0 = k0; q0 < T; q0 += R) {
            barrier(CLK_LOCAL_MEM_FENCE); /* the previous query tile is read */
            for (int i = r; i < RH; i += R) {
                const int row = i / HS, d = i % HS;
                const bool in = q0 + row < T;
                Qt[d * R + row] = in ? base[(long)(q0 + row) * C3 + d] : 0.0f;
                dYt[d * R + row] = in ? dyb[(long)(q0 + row) * C + d] : 0.0f;
            }
            Ls[r] = q0 + r < T ? lb[q0 + r] : 0.0f;
            Ds[r] = q0 + r < T ? Db[q0 + r] : 0.0f;
            barrier(CLK_LOCAL_MEM_FENCE);
            if (u >= T) continue;
            const int lo = max(u - q0, 0), hi = min(R, T - q0); /* rows t >= u, t < T */
            for (int row = lo; row < hi; row++) QK[row] = 0.0f, DV[row] = 0.0f;
            for (int d = 0; d < HS; d++) {
                const float kd = Kt[d * R + r], vd = Vt[d * R + r];
                for (int row = lo; row < hi; row++) {
                    QK[row] += Qt[d * R + row] * kd;
                    DV[row] += dYt[d * R + row] * vd;
                }
            }
            for (int row = lo; row < hi; row++) {
                const float p = exp(s * QK[row] - Ls[row]);
                QK[row] = p;
                DV[row] = s * (p * (DV[row] - Ds[row]));
            }
            for (int row = lo; row < hi; row++) {
                const float p = QK[row], ds = DV[row];
                for (int d = 0; d < HS; d++) {
                    dV[d] += p * dYt[d * R + row];
                    dK[d] += ds * Qt[d * R + row];
                }
            }
        }
    }
    if (u >= T) return;
    __global float *dku = dqkv + dqkv_off + krow0 + (long)u * C3, *dvu = dku + CK;
    for (int d = 0; d < HS; d++) dku[d] = dK[d], dvu[d] = dV[d];
}

/* dq of query row t = q0 + r: over keys u <= t, increasing, dq_t += ds k_u
 * with ds as above. Local memory: the group's Q, dY rows (transposed) and
 * dQ accumulators (rows HS + 1 apart), each key tile's K, V (transposed).
 * Ranges as attn_bwd_kv's. */
__kernel void attn_bwd_q(__global const float *dy, ulong dy_off, __global const float *qkv,
                         ulong qkv_off, __global const float *lse, ulong lse_off,
                         __global const float *D, ulong D_off, __global float *dqkv,
                         ulong dqkv_off, int T, int NH, int HS, float s, int R, int NKV) {
    __local float Qt[ATTN_BTILE], dYt[ATTN_BTILE], dQs[ATTN_BTILE], Kt[ATTN_BTILE],
        Vt[ATTN_BTILE];
    const int bh = (int)get_group_id(0), r = (int)get_local_id(1);
    const int q0 = (int)get_group_id(1) * R, t = q0 + r;
    const int b = bh / NH, h = bh % NH, RH = R * HS, P = HS + 1;
    const long C = (long)NH * HS, CK = (long)NKV * HS, C3 = C + 2 * CK;
    const long row0 = (long)b * T * C3 + (long)h * HS;
    __global const float *base = qkv + qkv_off + row0;
    __global const float *kb = qkv + qkv_off + (long)b * T * C3 + C + (long)(h / (NH / NKV)) * HS;
    __global const float *dyb = dy + dy_off + (long)b * T * C + (long)h * HS;
    for (int i = r; i < RH; i += R) {
        const int row = i / HS, d = i % HS;
        const bool in = q0 + row < T;
        Qt[d * R + row] = in ? base[(long)(q0 + row) * C3 + d] : 0.0f;
        dYt[d * R + row] = in ? dyb[(long)(q0 + row) * C + d] : 0.0f;
    }
    __local float *dQ = dQs + r * P;
    for (int d = 0; d < HS; d++) dQ[d] = 0.0f;
    const float lse_t = t < T ? lse[lse_off + (long)bh * T + t] : 0.0f;
    const float D_t = t < T ? D[D_off + (long)bh * T + t] : 0.0f;
    float QK[KT], DV[KT];
    const int last = min(q0 + R, T) - 1;
    for (int k0 = 0; k0 <= last; k0 += R) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = r; i < RH; i += R) {
            const int row = i / HS, d = i % HS;
            const bool in = k0 + row < T;
            Kt[d * R + row] = in ? kb[(long)(k0 + row) * C3 + d] : 0.0f;
            Vt[d * R + row] = in ? kb[(long)(k0 + row) * C3 + CK + d] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const int n = t < T ? min(R, t - k0 + 1) : 0; /* keys u <= t of this tile */
        if (n <= 0) continue;
        for (int c = 0; c < n; c++) QK[c] = 0.0f, DV[c] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float qd = Qt[d * R + r], gd = dYt[d * R + r];
            for (int c = 0; c < n; c++) {
                QK[c] += qd * Kt[d * R + c];
                DV[c] += gd * Vt[d * R + c];
            }
        }
        for (int c = 0; c < n; c++) {
            const float p = exp(s * QK[c] - lse_t);
            DV[c] = s * (p * (DV[c] - D_t));
        }
        for (int c = 0; c < n; c++) {
            const float ds = DV[c];
            for (int d = 0; d < HS; d++) dQ[d] += ds * Kt[d * R + c];
        }
    }
    if (t >= T) return;
    __global float *dqt = dqkv + dqkv_off + row0 + (long)t * C3;
    for (int d = 0; d < HS; d++) dqt[d] = dQ[d];
}

/* ---- generation: a chunk of P positions from pos over the KV caches ----
 * K, V caches (B, NKV, Tc, HS): position u of kv head g at ((b NKV + g) Tc + u) HS.
 * attn_kv_store: the chunk's keys and values into rows pos .. pos+P-1 of the
 * caches. Global size (B P, NKV HS), one element each. */
__kernel void attn_kv_store(__global const float *qkv, ulong qkv_off, __global float *K,
                            ulong k_off, __global float *V, ulong v_off, int P, int NH, int HS,
                            int Tc, int pos, int NKV) {
    const int bt = (int)get_global_id(0), c = (int)get_global_id(1);
    const int b = bt / P, t = bt % P, g = c / HS, j = c % HS;
    const long C = (long)NH * HS, CK = (long)NKV * HS;
    __global const float *src = qkv + qkv_off + (long)bt * (C + 2 * CK) + C + c;
    const long row = (((long)b * NKV + g) * Tc + pos + t) * HS + j;
    K[k_off + row] = src[0];
    V[v_off + row] = src[CK];
}

/* y (B, P, C): query row t of the chunk (position pos + t) over the cached
 * positions 0 .. pos+t, an online softmax over the keys in increasing order
 * (the forward's rule, a key at a time). A work-item per (b, head, row);
 * work-groups (1, R) as attn_fwd's, each row's output accumulated in local
 * memory (rows HS + 1 apart). Global size (B NH, ceil(P / R) R). */
__kernel void attn_kv_fwd(__global const float *qkv, ulong qkv_off, __global const float *K,
                          ulong k_off, __global const float *V, ulong v_off, __global float *y,
                          ulong y_off, int P, int NH, int HS, int Tc, int pos, float s, int R,
                          int NKV) {
    __local float Os[ATTN_TILE];
    const int bh = (int)get_group_id(0), r = (int)get_local_id(1);
    const int t = (int)get_group_id(1) * R + r;
    if (t >= P) return;
    const int b = bh / NH, h = bh % NH;
    const long C = (long)NH * HS, CK = (long)NKV * HS;
    const long kvh = (long)b * NKV + h / (NH / NKV);
    __global const float *q = qkv + qkv_off + ((long)b * P + t) * (C + 2 * CK) + (long)h * HS;
    __global const float *Kh = K + k_off + kvh * Tc * HS;
    __global const float *Vh = V + v_off + kvh * Tc * HS;
    __local float *O = Os + r * (HS + 1);
    for (int d = 0; d < HS; d++) O[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int n = pos + t + 1;
    for (int u = 0; u < n; u++) {
        __global const float *k = Kh + (long)u * HS, *v = Vh + (long)u * HS;
        float sc = 0.0f;
        for (int d = 0; d < HS; d++) sc += q[d] * k[d];
        sc = s * sc;
        if (sc > m) { /* m = -inf before the first key: alpha 0 */
            const float alpha = exp(m - sc);
            for (int d = 0; d < HS; d++) O[d] *= alpha;
            l *= alpha;
            m = sc;
        }
        const float p = exp(sc - m);
        l += p;
        for (int d = 0; d < HS; d++) O[d] += p * v[d];
    }
    __global float *yt = y + y_off + ((long)b * P + t) * C + (long)h * HS;
    const float inv = 1.0f / l;
    for (int d = 0; d < HS; d++) yt[d] = O[d] * inv;
}
