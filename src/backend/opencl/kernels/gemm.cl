/* gemm.cl — the small kernels around CLBlast's GEMMs for LINEAR and CONV2D
 * (gemm.c): seeding an output with its bias, the bias gradients (column and
 * plane sums, each output summed by one work-item in a fixed order), and the
 * convolution's unroll (im2col, reading f32, f16 or bf16 images) and its
 * adjoint (col2im as a gather: each input pixel sums its taps in order),
 * and the plain SGD step of a weight whose gradient LINEAR_BWD formed in
 * scratch (the step inside backward).
 * Tensors are (buffer, element offset) pairs. */

/* No contraction to fma: the CPU kernels' a*b+c give the same bits. */
#pragma OPENCL FP_CONTRACT OFF

/* The bias gradients sum in double where the device has it, as the CPU does. */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;
#else
typedef float acc_t;
#endif

/* y[i] = b[(i / inner) % nb], i in [0, n): the bias of a linear output
 * (N, O) (inner 1, nb O) or of a convolution's (N, OC, OH*OW) (inner OH*OW,
 * nb OC), before a GEMM adds onto it with beta 1 */
__kernel void bias_fill(__global float *y, ulong y_off, ulong n, __global const float *b,
                        ulong b_off, ulong nb, ulong inner) {
    size_t i = get_global_id(0);
    if (i < n) y[y_off + i] = b[b_off + (i / inner) % nb];
}

/* db[o] = sum_n dy[n, o] of dy (N, O), in double, n in order; with acc
 * db[o] + that sum; with upd the plain SGD step on the bias instead:
 * g = sum (+ wd db), db = db + (-lr) g (linear.c's order) */
__kernel void col_sums(__global const float *dy, ulong dy_off, ulong N, ulong O,
                       __global float *db, ulong db_off, int acc, int upd, float lr, float wd) {
    size_t o = get_global_id(0);
    if (o >= O) return;
    acc_t s = 0;
    for (ulong n = 0; n < N; n++) s += dy[dy_off + n * O + o];
    float bj = db[db_off + o];
    if (upd) {
        float g = (float)s;
        if (wd != 0.0f) g = g + wd * bj;
        db[db_off + o] = bj + (-lr) * g;
    } else {
        db[db_off + o] = (float)(acc ? (acc_t)bj + s : s);
    }
}

/* db[oc] = sum over images and positions of dy (N, OC, HW): per image the
 * plane's sum in eight chains then paired (reduce.h's sum_f64), the images
 * added in order onto db[oc] (acc) or 0 */
__kernel void plane_sums(__global const float *dy, ulong dy_off, ulong N, ulong OC, ulong hw,
                         __global float *db, ulong db_off, int acc) {
    size_t oc = get_global_id(0);
    if (oc >= OC) return;
    acc_t s = acc ? (acc_t)db[db_off + oc] : 0;
    for (ulong n = 0; n < N; n++) {
        __global const float *p = dy + dy_off + (n * OC + oc) * hw;
        acc_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        ulong i = 0;
        for (; i + 8 <= hw; i += 8)
            for (int j = 0; j < 8; j++) a[j] += p[i + j];
        for (; i < hw; i++) a[0] += p[i];
        s += ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    }
    db[db_off + oc] = (float)s;
}

/* The geometry of a convolution: x (C, H, W) per image, square kernel K,
 * stride S, zero padding P, output OH x OW. */
#define GEOM_ARGS ulong C, ulong H, ulong W, ulong K, ulong S, ulong P, ulong OH, ulong OW

/* col for images [0, nimg) of x (from x_off): one slab (C*K*K, OH*OW) per
 * image, col[n][(c*K + kh)*K + kw][oh*OW + ow] = x[n][c][oh*S-P+kh][ow*S-P+kw],
 * 0 outside the image. LOAD(i) reads element i of x as a float. */
#define IM2COL(NAME, T, LOAD)                                                                \
    __kernel void NAME(__global const T *x, ulong x_off, __global float *col, ulong col_off, \
                       ulong nimg, GEOM_ARGS) {                                              \
        size_t i = get_global_id(0);                                                         \
        const ulong ohw = OH * OW, kk = K * K, per = C * kk * ohw;                           \
        if (i >= nimg * per) return;                                                         \
        ulong n = i / per, r = i % per, row = r / ohw, p = r % ohw;                          \
        ulong c = row / kk, kh = row % kk / K, kw = row % K;                                 \
        long ih = (long)(p / OW * S + kh) - (long)P, iw = (long)(p % OW * S + kw) - (long)P; \
        float v = 0.0f;                                                                      \
        if (ih >= 0 && ih < (long)H && iw >= 0 && iw < (long)W)                              \
            v = LOAD(x_off + ((n * C + c) * H + (ulong)ih) * W + (ulong)iw);                 \
        col[col_off + i] = v;                                                                \
    }

#define LOAD_F32(j) x[j]
#define LOAD_F16(j) vload_half(j, x)
#define LOAD_BF16(j) as_float((uint)x[j] << 16)
IM2COL(im2col_f32, float, LOAD_F32)
IM2COL(im2col_f16, half, LOAD_F16)
IM2COL(im2col_bf16, ushort, LOAD_BF16)

/* dx for images [0, nimg) (from dx_off) from dcol (col's layout): each pixel
 * (n, c, ih, iw) starts at dx (acc) or 0 and adds its taps (kh, kw) in
 * order, the tap's output position being oh = (ih + P - kh) / S where that
 * divides and lands inside, as the CPU's col2im adds its rows in order */
__kernel void col2im(__global const float *col, ulong col_off, __global float *dx, ulong dx_off,
                     ulong nimg, GEOM_ARGS, int acc) {
    size_t i = get_global_id(0);
    const ulong hw = H * W, per = C * hw, ohw = OH * OW;
    if (i >= nimg * per) return;
    ulong n = i / per, c = i % per / hw, ih = i % hw / W, iw = i % W;
    __global const float *slab = col + col_off + (n * C + c) * K * K * ohw;
    float v = acc ? dx[dx_off + i] : 0.0f;
    for (ulong kh = 0; kh < K; kh++) {
        long th = (long)(ih + P) - (long)kh;
        if (th < 0 || th % (long)S != 0 || th / (long)S >= (long)OH) continue;
        ulong oh = (ulong)th / S;
        for (ulong kw = 0; kw < K; kw++) {
            long tw = (long)(iw + P) - (long)kw;
            if (tw < 0 || tw % (long)S != 0 || tw / (long)S >= (long)OW) continue;
            v += slab[(kh * K + kw) * ohw + oh * OW + (ulong)tw / S];
        }
    }
    dx[dx_off + i] = v;
}

/* w[i] = w[i] + (-lr)(g[i] + wd w[i]), i in [0, n): fr_k_sgd without
 * momentum (optim.cl's sgd_f32, the same float operations) */
__kernel void sgd_plain(__global float *w, ulong w_off, __global const float *g, ulong g_off,
                        ulong n, float lr, float wd) {
    size_t i = get_global_id(0);
    if (i >= n) return;
    float pi = w[w_off + i];
    float d = g[g_off + i];
    if (wd != 0.0f) d = d + wd * pi;
    w[w_off + i] = pi + (-lr) * d;
}
