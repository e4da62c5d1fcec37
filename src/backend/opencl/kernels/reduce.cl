/* reduce.cl — reductions, norms, losses, pooling and embeddings on the device
 * (see reduce.c, which enqueues them, and src/backend/cpu for the semantics
 * each one copies). Tensors are (buffer, element offset) pairs. Sums run in
 * double where the device has cl_khr_fp64 (as the CPU kernels do), in float
 * otherwise. Every output value is computed by one work-item in a fixed
 * order, or by a work-group of a fixed size reducing in a fixed tree, so
 * the same inputs give the same bits. No float atomics. */

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;
#else
typedef float acc_t;
#endif

/* a*b+c stays two roundings, as on the host */
#pragma OPENCL FP_CONTRACT OFF

#define WG 64 /* lanes of the work-groups that reduce (a row, a channel, a loss) */

/* 16-bit tensors: dt 0 = f32, 1 = f16, 2 = bf16 (the offset is in elements
 * of dt). A bf16 NaN is quieted, as core/half.c widens it. */
static float ld(__global const float *x, ulong i, int dt) {
    if (dt == 0) return x[i];
    if (dt == 1) return vload_half(i, (__global const half *)x);
    uint u = (uint)((__global const ushort *)x)[i] << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x400000u;
    return as_float(u);
}

/* v rounded to nearest even into dt (a NaN stays a NaN) */
static void st(__global float *y, ulong i, int dt, float v) {
    if (dt == 0) {
        y[i] = v;
    } else if (dt == 1) {
        vstore_half_rte(v, i, (__global half *)y);
    } else {
        uint u = as_uint(v);
        ushort r = (u & 0x7fffffffu) > 0x7f800000u
                       ? (ushort)((u >> 16) | 0x40u)
                       : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        ((__global ushort *)y)[i] = r;
    }
}

/* The sum over the WG lanes of v, the same tree every time; every lane
 * calls it and gets the total. */
static acc_t wg_sum(__local acc_t *s, acc_t v) {
    const int l = get_local_id(0);
    s[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) s[l] += s[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const acc_t r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* The maximum over the lanes (exact, so any tree gives the same value). */
static float wg_max(__local float *s, float v) {
    const int l = get_local_id(0);
    s[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h && s[l + h] > s[l]) s[l] = s[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = s[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* ---- batch normalisation: one work-group per channel ---- */

/* Runs the statements for each value of channel ch of (ROWS,C,HW) that lane
 * l owns, with i its index: planes of WG values or more are strided within
 * each plane (no division), smaller ones flat over (n, i). */
#define FOR_CHANNEL(ROWS, i, ...)                                             \
    if (HW >= WG) {                                                           \
        for (long n_ = 0; n_ < (ROWS); n_++)                                  \
            for (long j_ = l; j_ < HW; j_ += WG) {                            \
                const long i = (n_ * C + ch) * HW + j_;                       \
                __VA_ARGS__                                                   \
            }                                                                 \
    } else {                                                                  \
        for (long e_ = l; e_ < (ROWS)*HW; e_ += WG) {                         \
            const long n_ = e_ / HW, i = (n_ * C + ch) * HW + (e_ - n_ * HW); \
            __VA_ARGS__                                                       \
        }                                                                     \
    }

/* x, y (N,C,HW); gamma, beta, rmean, rvar, smean, sinv (C); any of gamma,
 * beta, rmean, rvar, smean, sinv may be absent (NULL); relu: y = ReLU(y)
 * (the relu kernel's v < 0 ? 0 : v). See fr_k_batchnorm. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
batchnorm(__global const float *x, ulong x_off, __global const float *gamma, ulong g_off,
          __global const float *beta, ulong b_off, __global float *rmean, ulong rm_off,
          __global float *rvar, ulong rv_off, __global float *y, ulong y_off, __global float *smean,
          ulong sm_off, __global float *sinv, ulong si_off, long N, long C, long HW, int training,
          int recompute, float eps, float mom, int relu) {
    __local acc_t s[WG];
    const long ch = get_group_id(0), cnt = N * HW;
    const int l = get_local_id(0);
    /* the sums run in eval mode too, over nothing: every lane meets the
     * same barriers */
    const long rows = training ? N : 0;
    acc_t a = 0;
    FOR_CHANNEL(rows, i, a += x[x_off + i];)
    acc_t mean = wg_sum(s, a) / (acc_t)cnt;
    const float s_hi = (float)mean, s_lo = (float)(mean - s_hi);
    acc_t q = 0;
    FOR_CHANNEL(rows, i, const float d = (x[x_off + i] - s_hi) - s_lo; q += (acc_t)d * d;)
    const acc_t var = wg_sum(s, q) / (acc_t)cnt;
    acc_t invstd = 1 / sqrt(var + (acc_t)eps);
    if (training && l == 0) {
        if (smean) smean[sm_off + ch] = (float)mean;
        if (sinv) sinv[si_off + ch] = (float)invstd;
        /* a recomputed clone leaves the running stats alone */
        if (rmean && !recompute)
            rmean[rm_off + ch] = (float)((1 - (acc_t)mom) * rmean[rm_off + ch] + (acc_t)mom * mean);
        if (rvar && !recompute)
            rvar[rv_off + ch] = (float)((1 - (acc_t)mom) * rvar[rv_off + ch] +
                                        (acc_t)mom * var * (acc_t)cnt / (acc_t)(cnt - 1));
    }
    if (!training) {
        mean = rmean[rm_off + ch];
        invstd = 1 / sqrt((acc_t)rvar[rv_off + ch] + (acc_t)eps);
    }
    const acc_t g = gamma ? (acc_t)gamma[g_off + ch] : (acc_t)1;
    const float m_hi = (float)mean, m_lo = (float)(mean - m_hi);
    const float scale = (float)(g * invstd), b = beta ? beta[b_off + ch] : 0.0f;
    FOR_CHANNEL(N, i, const float v = ((x[x_off + i] - m_hi) - m_lo) * scale + b;
                y[y_off + i] = relu && v < 0.0f ? 0.0f : v;)
}

/* dy, x, dx (N,C,HW), x of dtype xdt; gamma, mean, invstd, dgamma, dbeta
 * (C); dx, dgamma, dbeta, gamma may be absent. See fr_k_batchnorm_bwd. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
batchnorm_bwd(__global const float *dy, ulong dy_off, __global const float *x, ulong x_off,
              __global const float *gamma, ulong g_off, __global const float *smean, ulong sm_off,
              __global const float *sinv, ulong si_off, __global float *dx, ulong dx_off,
              __global float *dgamma, ulong dg_off, __global float *dbeta, ulong db_off, long N,
              long C, long HW, int xdt, int acc_x, int acc_g, int acc_b) {
    __local acc_t s[WG];
    const long ch = get_group_id(0), cnt = N * HW;
    const int l = get_local_id(0);
    const acc_t inv = sinv[si_off + ch];
    const float m = smean[sm_off + ch];
    acc_t a = 0, b = 0; /* sum dy, sum dy (x - mean) */
    FOR_CHANNEL(N, i, const float d = dy[dy_off + i]; a += d; b += d * (ld(x, x_off + i, xdt) - m);)
    const acc_t sdy = wg_sum(s, a), sdyx = wg_sum(s, b);
    const acc_t dg = sdyx * inv; /* sum dy xhat */
    if (l == 0) {
        if (dgamma) dgamma[dg_off + ch] = (float)(acc_g ? dgamma[dg_off + ch] + dg : dg);
        if (dbeta) dbeta[db_off + ch] = (float)(acc_b ? dbeta[db_off + ch] + sdy : sdy);
    }
    if (!dx || cnt == 0) return;
    const acc_t g = gamma ? (acc_t)gamma[g_off + ch] : (acc_t)1;
    const float k = (float)(g * inv), mdy = (float)(sdy / (acc_t)cnt),
                q = (float)(sdyx / (acc_t)cnt * inv * inv);
    FOR_CHANNEL(N, i, const float v = k * (dy[dy_off + i] - mdy - (ld(x, x_off + i, xdt) - m) * q);
                dx[dx_off + i] = acc_x ? dx[dx_off + i] + v : v;)
}

/* ---- layer normalisation over rows of D: one work-group per row ---- */

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
layernorm(__global const float *x, ulong x_off, __global const float *gamma, ulong g_off,
          __global const float *beta, ulong b_off, __global float *y, ulong y_off,
          __global float *smean, ulong sm_off, __global float *srstd, ulong sr_off, long D,
          float eps) {
    __local acc_t s[WG];
    const long n = get_group_id(0);
    const int l = get_local_id(0);
    __global const float *xp = x + x_off + n * D;
    acc_t a = 0;
    for (long d = l; d < D; d += WG) a += xp[d];
    const acc_t mean = wg_sum(s, a) / (acc_t)D;
    acc_t q = 0;
    for (long d = l; d < D; d += WG) {
        const acc_t v = xp[d] - mean;
        q += v * v;
    }
    const acc_t rstd = 1 / sqrt(wg_sum(s, q) / (acc_t)D + (acc_t)eps);
    if (l == 0) {
        if (smean) smean[sm_off + n] = (float)mean;
        if (srstd) srstd[sr_off + n] = (float)rstd;
    }
    const float m_hi = (float)mean, m_lo = (float)(mean - m_hi), r = (float)rstd;
    for (long d = l; d < D; d += WG) {
        float v = ((xp[d] - m_hi) - m_lo) * r;
        if (gamma) v *= gamma[g_off + d];
        if (beta) v += beta[b_off + d];
        y[y_off + n * D + d] = v;
    }
}

/* dx of a row: one work-group per row. See fr_k_layernorm_bwd. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
layernorm_bwd_dx(__global const float *dy, ulong dy_off, __global const float *x, ulong x_off,
                 __global const float *gamma, ulong g_off, __global const float *smean,
                 ulong sm_off, __global const float *srstd, ulong sr_off, __global float *dx,
                 ulong dx_off, long D, int acc) {
    __local acc_t s[WG];
    const long n = get_group_id(0);
    const int l = get_local_id(0);
    __global const float *xp = x + x_off + n * D, *dyp = dy + dy_off + n * D;
    __global float *dxp = dx + dx_off + n * D;
    const float m = smean[sm_off + n], r = srstd[sr_off + n];
    acc_t a = 0, b = 0; /* sum g, sum g xhat */
    for (long d = l; d < D; d += WG) {
        const acc_t g = gamma ? (acc_t)dyp[d] * gamma[g_off + d] : (acc_t)dyp[d];
        a += g;
        b += g * ((xp[d] - m) * r);
    }
    const float mg = (float)(wg_sum(s, a) / (acc_t)D), mgx = (float)(wg_sum(s, b) / (acc_t)D);
    for (long d = l; d < D; d += WG) {
        const float g = gamma ? dyp[d] * gamma[g_off + d] : dyp[d];
        const float v = r * (g - mg - (xp[d] - m) * r * mgx);
        dxp[d] = acc ? dxp[d] + v : v;
    }
}

/* dgamma, dbeta: one work-item per column, the rows in order. */
__kernel void layernorm_bwd_dgb(__global const float *dy, ulong dy_off, __global const float *x,
                                ulong x_off, __global const float *smean, ulong sm_off,
                                __global const float *srstd, ulong sr_off, __global float *dgamma,
                                ulong dg_off, __global float *dbeta, ulong db_off, long N, long D,
                                int acc_g, int acc_b) {
    const long d = get_global_id(0);
    if (d >= D) return;
    acc_t sg = 0, sb = 0;
    for (long n = 0; n < N; n++) {
        const float v = dy[dy_off + n * D + d];
        sb += v;
        sg += (acc_t)v * ((x[x_off + n * D + d] - smean[sm_off + n]) * srstd[sr_off + n]);
    }
    if (dgamma) dgamma[dg_off + d] = (float)(acc_g ? dgamma[dg_off + d] + sg : sg);
    if (dbeta) dbeta[db_off + d] = (float)(acc_b ? dbeta[db_off + d] + sb : sb);
}

/* ---- losses ---- */

/* logsumexp of a row of C, max-shifted (fr_k_cross_entropy's row_lse) */
static acc_t row_lse(__global const float *z, long C) {
    acc_t m = z[0];
    for (long j = 1; j < C; j++)
        if (z[j] > m) m = z[j];
    acc_t s = 0;
    for (long j = 0; j < C; j++) s += exp((acc_t)z[j] - m);
    return m + log(s);
}

/* One work-group of WG lanes: lane b sums the rows of block b of the CPU's
 * 64 fixed blocks, lane 0 adds the blocks in order: the CPU's order. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
cross_entropy(__global const float *z, ulong z_off, __global const int *lab, ulong l_off,
              __global float *loss, ulong loss_off, long N, long C) {
    __local acc_t part[WG];
    const int b = get_local_id(0);
    acc_t s = 0;
    for (long n = N * b / WG; n < N * (b + 1) / WG; n++)
        s += row_lse(z + z_off + n * C, C) - (acc_t)z[z_off + n * C + lab[l_off + n]];
    part[b] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (b == 0) {
        acc_t t = 0;
        for (int i = 0; i < WG; i++) t += part[i];
        loss[loss_off] = (float)(t / (acc_t)N);
    }
}

/* dz[n,j] = scale (softmax(z[n,:])_j - [j == y[n]]) / N: one work-group per row */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
cross_entropy_bwd(__global const float *z, ulong z_off, __global const int *lab, ulong l_off,
                  __global float *dz, ulong dz_off, long N, long C, float scale, int acc) {
    __local acc_t s[WG];
    __local float sm[WG];
    const long n = get_group_id(0);
    const int l = get_local_id(0);
    __global const float *zr = z + z_off + n * C;
    __global float *dr = dz + dz_off + n * C;
    float m = zr[0];
    for (long j = l; j < C; j += WG)
        if (zr[j] > m) m = zr[j];
    const acc_t mx = wg_max(sm, m);
    acc_t a = 0;
    for (long j = l; j < C; j += WG) a += exp((acc_t)zr[j] - mx);
    const acc_t lse = mx + log(wg_sum(s, a));
    const acc_t k = (acc_t)scale / (acc_t)N;
    const int y = lab[l_off + n];
    for (long j = l; j < C; j += WG) {
        const acc_t g = k * (exp((acc_t)zr[j] - lse) - (j == y ? (acc_t)1 : (acc_t)0));
        dr[j] = (float)(acc ? dr[j] + g : g);
    }
}

/* ---- the head fused with its loss (LINEAR_CE, gemm.c): a chunk's rows ---- */

/* Row n0 + i of a chunk of logits z (rows of V): term[n0 + i] = logsumexp(z_i)
 * - z_i[y] (acc_t) and hit[n0 + i] = whether its first argmax (strict >, as
 * `hits`) is y. One work-group per row. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
lce_rows(__global const float *z, ulong z_off, __global const int *lab, ulong l_off,
         __global float *ws, ulong ws_off, long N, long n0, long V) {
    __local acc_t s[WG];
    __local float sm[WG];
    __local long si[WG];
    const long i = get_group_id(0), n = n0 + i;
    const int l = get_local_id(0);
    __global const float *zr = z + z_off + i * V;
    float m = zr[0];
    for (long j = l; j < V; j += WG)
        if (zr[j] > m) m = zr[j];
    const float mx = wg_max(sm, m);
    acc_t a = 0;
    for (long j = l; j < V; j += WG) a += exp((acc_t)zr[j] - mx);
    const acc_t lse = (acc_t)mx + log(wg_sum(s, a));
    long first = V; /* the first index holding the maximum (a NaN never does) */
    for (long j = l; j < V && first == V; j += WG)
        if (zr[j] == mx) first = j;
    si[l] = first;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h && si[l + h] < si[l]) si[l] = si[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) {
        const int y = lab[l_off + n];
        const long best = zr[0] != zr[0] || si[0] == V ? 0 : si[0];
        __global acc_t *term = (__global acc_t *)(ws + ws_off);
        __global int *hit = (__global int *)(ws + ws_off + 2 * N);
        term[n] = lse - (acc_t)zr[y];
        hit[n] = best == y;
    }
}

/* loss = (1/N) sum of the N terms over the CPU's 64 fixed blocks, in order;
 * hits = the count of the N flags. One work-group. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
lce_sum(__global float *ws, ulong ws_off, long N, __global float *loss, ulong loss_off,
        __global int *hits, ulong h_off) {
    __local acc_t part[WG];
    __local long cnt[WG];
    const int b = get_local_id(0);
    __global const acc_t *term = (__global const acc_t *)(ws + ws_off);
    __global const int *hit = (__global const int *)(ws + ws_off + 2 * N);
    acc_t s = 0;
    long c = 0;
    for (long n = N * b / WG; n < N * (b + 1) / WG; n++) s += term[n], c += hit[n];
    part[b] = s;
    cnt[b] = c;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (b == 0) {
        acc_t t = 0;
        long h = 0;
        for (int i = 0; i < WG; i++) t += part[i], h += cnt[i];
        loss[loss_off] = (float)(t / (acc_t)N);
        if (hits) hits[h_off] = (int)h;
    }
}

/* sums[j] (acc_t) = (first ? 0 : sums[j]) + the r rows of dz's column j, in
 * order; one work-item per column */
__kernel void lce_db_add(__global const float *dz, ulong dz_off, __global float *ws, ulong ws_off,
                         long r, long V, int first) {
    const long j = get_global_id(0);
    if (j >= V) return;
    __global acc_t *sums = (__global acc_t *)(ws + ws_off);
    acc_t s = first ? 0 : sums[j];
    for (long i = 0; i < r; i++) s += dz[dz_off + i * V + j];
    sums[j] = s;
}

/* db[j] = sums[j] (or added into db: acc) */
__kernel void lce_db_store(__global const float *ws, ulong ws_off, __global float *db,
                           ulong db_off, long V, int acc) {
    const long j = get_global_id(0);
    if (j >= V) return;
    const acc_t s = ((__global const acc_t *)(ws + ws_off))[j];
    db[db_off + j] = (float)(acc ? (acc_t)db[db_off + j] + s : s);
}

/* loss = (1/n) sum (p - t)^2 over the CPU's 64 fixed blocks, in order */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
mse(__global const float *p, ulong p_off, __global const float *t, ulong t_off,
    __global float *loss, ulong loss_off, long n) {
    __local acc_t part[WG];
    const int b = get_local_id(0);
    acc_t s = 0;
    for (long i = n * b / WG; i < n * (b + 1) / WG; i++) {
        const acc_t d = (acc_t)p[p_off + i] - t[t_off + i];
        s += d * d;
    }
    part[b] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (b == 0) {
        acc_t u = 0;
        for (int i = 0; i < WG; i++) u += part[i];
        loss[loss_off] = (float)(u / (acc_t)n);
    }
}

/* dp = k (p - t), k = scale 2 / n rounded to float on the host */
__kernel void mse_bwd(__global const float *p, ulong p_off, __global const float *t, ulong t_off,
                      __global float *dp, ulong dp_off, long n, float k, int acc) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float g = k * (p[p_off + i] - t[t_off + i]);
    dp[dp_off + i] = acc ? dp[dp_off + i] + g : g;
}

/* ---- pooling: square windows K, stride S, no padding, floor mode ---- */

/* The offset kh*W + kw of the window's first maximum in row-major order (a
 * NaN wins, the last one), as fr_k_maxpool2d's window_argmax. */
static long window_argmax(__global const float *x, ulong o, int dt, long W, long K) {
    long best = 0;
    float m = ld(x, o, dt);
    for (long kh = 0; kh < K; kh++)
        for (long kw = 0; kw < K; kw++) {
            const float v = ld(x, o + kh * W + kw, dt);
            if (v > m || isnan(v)) m = v, best = kh * W + kw;
        }
    return best;
}

/* one work-item per output value, global (OW, OH, planes); x of dtype xdt,
 * y of dtype ydt */
__kernel void maxpool2d(__global const float *x, ulong x_off, __global float *y, ulong y_off,
                        long planes, long H, long W, long K, long S, long OH, long OW, int xdt,
                        int ydt) {
    const long ow = get_global_id(0), oh = get_global_id(1), p = get_global_id(2);
    const long o = (p * OH + oh) * OW + ow;
    const ulong w0 = x_off + p * H * W + oh * S * W + ow * S;
    float v;
    if (K == 2) { /* the CPU's max2: the maximum, or NaN when one is NaN */
        const float a = ld(x, w0, xdt), b = ld(x, w0 + 1, xdt), c = ld(x, w0 + W, xdt),
                    d = ld(x, w0 + W + 1, xdt);
        float m = b > a ? b : a;
        m = c > m ? c : m;
        m = d > m ? d : m;
        v = isnan(a) | isnan(b) | isnan(c) | isnan(d) ? a + b + c + d : m;
    } else {
        v = ld(x, w0 + window_argmax(x, w0, xdt, W, K), xdt);
    }
    st(y, y_off + o, ydt, v);
}

/* one work-item per dx value, global (W, H, planes): dy of the windows
 * holding (h,w) whose first maximum it is, added in window order (the
 * CPU's order of addition); masked: 0 where x <= 0 (ReLU's backward folded
 * in, plan/fold.h: its y > 0 ? d : 0) */
__kernel void maxpool2d_bwd(__global const float *dy, ulong dy_off, __global const float *x,
                            ulong x_off, __global float *dx, ulong dx_off, long planes, long H,
                            long W, long K, long S, long OH, long OW, int xdt, int acc,
                            int masked) {
    const long w = get_global_id(0), h = get_global_id(1), p = get_global_id(2);
    const long i = (p * H + h) * W + w;
    if (masked && !(ld(x, x_off + i, xdt) > 0.0f)) {
        dx[dx_off + i] = acc ? dx[dx_off + i] + 0.0f : 0.0f;
        return;
    }
    const long oh0 = h >= K ? (h - K) / S + 1 : 0, ow0 = w >= K ? (w - K) / S + 1 : 0;
    const long oh1 = min(h / S, OH - 1), ow1 = min(w / S, OW - 1);
    /* 2x2 stride 2 on the CPU writes a window's values whole (a -0 stays -0) */
    int first = !acc && K == 2 && S == 2;
    float v = acc ? dx[dx_off + i] : 0.0f;
    for (long oh = oh0; oh <= oh1; oh++)
        for (long ow = ow0; ow <= ow1; ow++) {
            const long b = oh * S * W + ow * S;
            if (b + window_argmax(x, x_off + p * H * W + b, xdt, W, K) != h * W + w) continue;
            const float g = dy[dy_off + p * OH * OW + oh * OW + ow];
            v = first ? g : v + g;
            first = 0;
        }
    dx[dx_off + i] = v;
}

/* Disjoint windows (S >= K): one work-item per window, global (OW, OH,
 * planes), finds the maximum once and writes its share of dx, the window's
 * S x S tile (the last row and column of windows to the plane's edge): dy
 * at the first maximum, zeros elsewhere (the tile's values are in no other
 * window). As the CPU: 2x2 stride 2 writes dy as it is (a -0 stays -0),
 * other sizes add it to a cleared value. */
__kernel void maxpool2d_bwd_tiles(__global const float *dy, ulong dy_off, __global const float *x,
                                  ulong x_off, __global float *dx, ulong dx_off, long planes,
                                  long H, long W, long K, long S, long OH, long OW, int xdt,
                                  int acc, int masked) {
    const long ow = get_global_id(0), oh = get_global_id(1), p = get_global_id(2);
    const long h0 = oh * S, w0 = ow * S;
    const long h1 = oh == OH - 1 ? H : h0 + S, w1 = ow == OW - 1 ? W : w0 + S;
    const long b = h0 * W + w0, best = b + window_argmax(x, x_off + p * H * W + b, xdt, W, K);
    /* masked (ReLU's backward folded in): +0 where the maximum is not above 0 */
    const float g = masked && !(ld(x, x_off + p * H * W + best, xdt) > 0.0f)
                        ? 0.0f
                        : dy[dy_off + (p * OH + oh) * OW + ow];
    __global float *dxp = dx + dx_off + p * H * W;
    for (long h = h0; h < h1; h++)
        for (long w = w0; w < w1; w++) {
            const long i = h * W + w;
            if (i == best) dxp[i] = acc ? dxp[i] + g : K == 2 && S == 2 ? g : 0.0f + g;
            else if (!acc) dxp[i] = 0.0f;
        }
}

/* y = (sum of the window in row-major order) inv, inv = 1/(K K) from the
 * host; global (OW, OH, planes) */
__kernel void avgpool2d(__global const float *x, ulong x_off, __global float *y, ulong y_off,
                        long planes, long H, long W, long K, long S, long OH, long OW, float inv) {
    const long ow = get_global_id(0), oh = get_global_id(1), p = get_global_id(2);
    const long o = (p * OH + oh) * OW + ow;
    __global const float *win = x + x_off + p * H * W + oh * S * W + ow * S;
    float s = 0.0f;
    for (long kh = 0; kh < K; kh++)
        for (long kw = 0; kw < K; kw++) s += win[kh * W + kw];
    y[y_off + o] = s * inv;
}

__kernel void avgpool2d_bwd(__global const float *dy, ulong dy_off, __global float *dx,
                            ulong dx_off, long planes, long H, long W, long K, long S, long OH,
                            long OW, float inv, int acc) {
    /* global (W, H, planes) */
    const long w = get_global_id(0), h = get_global_id(1), p = get_global_id(2);
    const long i = (p * H + h) * W + w;
    const long oh0 = h >= K ? (h - K) / S + 1 : 0, ow0 = w >= K ? (w - K) / S + 1 : 0;
    const long oh1 = min(h / S, OH - 1), ow1 = min(w / S, OW - 1);
    float v = acc ? dx[dx_off + i] : 0.0f;
    for (long oh = oh0; oh <= oh1; oh++)
        for (long ow = ow0; ow <= ow1; ow++) v += dy[dy_off + p * OH * OW + oh * OW + ow] * inv;
    dx[dx_off + i] = v;
}

/* one work-item per plane, summed in order */
__kernel void global_avgpool(__global const float *x, ulong x_off, __global float *y, ulong y_off,
                             long planes, long hw) {
    const long p = get_global_id(0);
    if (p >= planes) return;
    acc_t s = 0;
    for (long i = 0; i < hw; i++) s += x[x_off + p * hw + i];
    y[y_off + p] = hw ? (float)(s / (acc_t)hw) : 0.0f;
}

__kernel void global_avgpool_bwd(__global const float *dy, ulong dy_off, __global float *dx,
                                 ulong dx_off, long planes, long hw, int acc) {
    const long i = get_global_id(0);
    if (i >= planes * hw) return;
    const float v = dy[dy_off + i / hw] / (float)hw;
    dx[dx_off + i] = acc ? dx[dx_off + i] + v : v;
}

/* ---- embeddings ---- */

/* y[r,:] = W[id[r],:], ids already checked */
__kernel void embedding(__global const int *id, ulong id_off, __global const float *w, ulong w_off,
                        __global float *y, ulong y_off, long R, long C) {
    const long i = get_global_id(0);
    if (i >= R * C) return;
    const long r = i / C;
    y[y_off + i] = w[w_off + (long)id[id_off + r] * C + (i - r * C)];
}

#define EMB_ROWS 64 /* vocabulary rows a work-group of embedding_bwd owns */

/* dW[v,j] (+)= sum of dy[r,j] over r with id[r] == v, in order of r. A
 * work-group owns EMB_ROWS rows of dW and WG columns (lane l column j): it
 * clears them (unless accumulating), then takes the ids WG at a time: lane
 * l tests whether id r0 + l falls in its rows and sets bit l of a mask
 * (integer atomics: the same mask whatever the order), then each lane adds
 * the dy rows of the set bits in increasing r into its own values of dW.
 * Every value of dW has one owner adding in order of r, as the CPU's.
 * Global (ceil(C/WG) WG, ceil(V/EMB_ROWS)). */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
embedding_bwd(__global const float *dy, ulong dy_off, __global const int *id, ulong id_off,
              __global float *dw, ulong dw_off, long R, long C, long V, int acc) {
    __local uint mask[WG / 32];
    __local int ids[WG];
    const long j = get_global_id(0), v0 = get_global_id(1) * EMB_ROWS;
    const long v1 = min(v0 + EMB_ROWS, V);
    const int l = get_local_id(0);
    __global float *dwj = dw + dw_off + j;
    if (!acc && j < C)
        for (long v = v0; v < v1; v++) dwj[v * C] = 0.0f;
    for (long r0 = 0; r0 < R; r0 += WG) {
        if (l < WG / 32) mask[l] = 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        const int v = r0 + l < R ? id[id_off + r0 + l] : -1;
        ids[l] = v;
        if (v >= v0 && v < v1) atomic_or(&mask[l >> 5], 1u << (l & 31));
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int w = 0; w < WG / 32; w++) {
            uint m = mask[w];
            while (m && j < C) {
                const int k = w * 32 + 31 - (int)clz(m & (0u - m)); /* the lowest set bit */
                dwj[(long)ids[k] * C] += dy[dy_off + (r0 + k) * C + j];
                m &= m - 1;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* all have read the mask before it is cleared */
    }
}

/* dW[t,j] (+)= sum_b dy[b,t,j] in order of b for t < T; 0 for t >= T (left
 * alone when accumulating). One work-item per value of dW (Tmax, C). */
__kernel void pos_embedding_bwd(__global const float *dy, ulong dy_off, __global float *dw,
                                ulong dw_off, long B, long T, long C, long Tmax, int acc) {
    const long i = get_global_id(0);
    if (i >= Tmax * C) return;
    const long t = i / C, j = i - t * C;
    float s = acc ? dw[dw_off + i] : 0.0f;
    if (t < T)
        for (long b = 0; b < B; b++) s += dy[dy_off + (b * T + t) * C + j];
    dw[dw_off + i] = s;
}

/* ---- whole-tensor passes of the step ---- */

/* part[b] = sum of x^2 over block b of CHUNK values, in index order (the
 * blocks of fr_k_grad_sumsq) */
__kernel void sumsq_blocks(__global const float *x, ulong x_off, ulong n, ulong chunk,
                           __global acc_t *part) {
    const ulong b = get_global_id(0), lo = b * chunk;
    if (lo >= n) return;
    const ulong hi = n - lo < chunk ? n : lo + chunk;
    acc_t s = 0;
    for (ulong i = lo; i < hi; i++) s += (acc_t)x[x_off + i] * x[x_off + i];
    part[b] = s;
}

/* the same over a 16-bit gradient (dt 1 f16, 2 bf16), widened exactly */
__kernel void sumsq_blocks_h(__global const float *x, ulong x_off, ulong n, ulong chunk,
                             __global acc_t *part, int dt) {
    const ulong b = get_global_id(0), lo = b * chunk;
    if (lo >= n) return;
    const ulong hi = n - lo < chunk ? n : lo + chunk;
    acc_t s = 0;
    for (ulong i = lo; i < hi; i++) {
        float v = ld(x, x_off + i, dt);
        s += (acc_t)v * v;
    }
    part[b] = s;
}

/* part[nb] = the blocks' sums added in block order (one work-item) */
__kernel void sum_in_order(__global acc_t *part, ulong nb) {
    acc_t s = 0;
    for (ulong b = 0; b < nb; b++) s += part[b];
    part[nb] = s;
}

/* out[0] = rows whose first maximum (strict >) is at their label; one
 * work-group, lanes over rows, counts added in a fixed tree */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
hits(__global const float *z, ulong z_off, __global const int *lab, ulong l_off, long N, long K,
     __global long *out) {
    __local long s[WG];
    const int l = get_local_id(0);
    long c = 0;
    for (long i = l; i < N; i += WG) {
        __global const float *zr = z + z_off + i * K;
        long best = 0;
        for (long k = 1; k < K; k++)
            if (zr[k] > zr[best]) best = k;
        c += best == lab[l_off + i];
    }
    s[l] = c;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) s[l] += s[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) out[0] = s[0];
}
