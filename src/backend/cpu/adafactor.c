/* adafactor.c — the CPU's Adafactor step (Shazeer & Stern 2018) as
 * torch.optim.Adafactor's _single_tensor_adafactor (PyTorch 2.5) computes
 * it, on one f32 tensor and its state region (backend/state.h's
 * fr_factored layout). At step t (1-based), lr g, beta2_decay tau, eps1,
 * eps2, d, weight decay wd:
 *   w = t^tau;  rho = min(lr, 1/sqrt(t));  alpha = max(eps2, RMS(p)) rho
 *   p *= 1 - lr wd                                (RMS taken before)
 *   matrix (L, R, C): r = lerp(r, mean_j g^2, w);  c = lerp(c, mean_i g^2, w)
 *                     V = r_i c_j / max(mean_i r_i, eps1)   (per l)
 *   vector:           v = lerp(v, g^2, w);  V = v
 *   U = g rsqrt(max(V, eps1^2));  denom = max(1, RMS(U) / d)
 *   p -= (alpha / denom) U
 * With beta1 > 0, Hugging Face's first moment (transformers' Adafactor):
 *   m = beta1 m + (1 - beta1) (U / denom) alpha;  p -= m.
 * Every sum is in double, over blocks fixed by the shape (a row, a column,
 * a fixed chunk of elements), added in block order: the bits do not depend
 * on the thread count. Scalars are formed in double from the
 * options and rounded to float once, as PyTorch's Python floats are. No
 * temporary of the tensor's size: U is recomputed in each pass. */
#include <math.h>
#include <omp.h>
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "backend/state.h"

#define AF_CHUNK 2048    /* the blocks of the sums over every element */
#define AF_GROUP 256     /* block sums on the stack, a group at a time */
#define AF_SPAN 1024     /* the widest span of columns summed together, down the rows */
#define AF_PAR_MIN 16384 /* below this a thread team costs more than it saves */

/* torch.lerp with a scalar weight (ATen's Lerp.h): exact at w = 1. */
static inline float lerpf(float a, float b, float w) {
    return fabsf(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

/* One slice of the tensor: a matrix (R, C) of a factored tensor (the
 * leading dims' index l) with its row_var, col_var and max(mean_i r_i,
 * eps1); or a whole vector (n) with its variance. */
typedef struct af_slice {
    int factored;
    int64_t R, C, n;
    const float *g, *r, *c, *v;
    float rden, eps_sq;
} af_slice;

/* U_k = g_k / sqrt(max(V_k, eps1^2)), k in the slice. */
static inline float af_u(const af_slice *a, int64_t k) {
    float var = a->factored ? a->r[k / a->C] * a->c[k % a->C] / a->rden : a->v[k];
    return a->g[k] * (1.0f / sqrtf(var > a->eps_sq ? var : a->eps_sq));
}

/* The sum of U^2 over a slice, in double, in fixed chunks. */
static double af_sumsq_u(const af_slice *a) {
    const int64_t n = a->n, blocks = (n + AF_CHUNK - 1) / AF_CHUNK;
    double total = 0;
    for (int64_t b0 = 0; b0 < blocks; b0 += AF_GROUP) {
        const int64_t nb = blocks - b0 < AF_GROUP ? blocks - b0 : AF_GROUP;
        double part[AF_GROUP];
#pragma omp parallel for schedule(static) if (n >= AF_PAR_MIN)
        for (int64_t j = 0; j < nb; j++) {
            const int64_t lo = (b0 + j) * AF_CHUNK, hi = lo + AF_CHUNK < n ? lo + AF_CHUNK : n;
            double s = 0;
            for (int64_t k = lo; k < hi; k++) {
                double u = af_u(a, k);
                s += u * u;
            }
            part[j] = s;
        }
        for (int64_t j = 0; j < nb; j++) total += part[j];
    }
    return total;
}

/* The factors' update for one (R, C) slice: each row's mean of g^2 (a
 * row's sum in order), each column's (down the rows in order, a span of
 * columns a thread: fr_col_span), lerped into r and c. */
static void af_factors(const float *g, float *r, float *c, int64_t R, int64_t C, float w) {
    const int par = R * C >= AF_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < R; i++) {
        const float *gi = g + i * C;
        double s = 0;
        for (int64_t j = 0; j < C; j++) s += (double)gi[j] * gi[j];
        r[i] = lerpf(r[i], (float)(s / (double)C), w);
    }
    const int64_t span = fr_col_span(C, par ? omp_get_max_threads() : 1, AF_SPAN);
    const int64_t cb = (C + span - 1) / span;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < cb; b++) {
        const int64_t j0 = b * span, nj = C - j0 < span ? C - j0 : span;
        double s[AF_SPAN] = {0};
        for (int64_t i = 0; i < R; i++) {
            const float *gi = g + i * C + j0;
            for (int64_t j = 0; j < nj; j++) s[j] += (double)gi[j] * gi[j];
        }
        for (int64_t j = 0; j < nj; j++) c[j0 + j] = lerpf(c[j0 + j], (float)(s[j] / (double)R), w);
    }
}

/* Slice l of the tensor (its factors' rden as stored by the caller). */
static af_slice af_slice_of(const fr_factored *f, const float *g, const float *st, int64_t l,
                            float eps_sq) {
    af_slice a = {.factored = f->factored, .eps_sq = eps_sq};
    if (!f->factored) {
        a.R = 1, a.C = a.n = f->n, a.g = g, a.v = st;
        return a;
    }
    a.R = f->R, a.C = f->C, a.n = f->R * f->C;
    a.g = g + l * a.n, a.r = st + l * f->R, a.c = st + f->L * f->R + l * f->C;
    return a;
}

/* The slice's rden: max(mean_i r_i, eps1), the mean in double. */
static float af_rden(const af_slice *a, float eps1) {
    double s = 0;
    for (int64_t i = 0; i < a->R; i++) s += a->r[i];
    float mean = (float)(s / (double)a->R);
    return mean > eps1 ? mean : eps1;
}

fr_adafactor_consts fr_adafactor_setup(const fr_optim_opts *o, int64_t step, double sumsq_p,
                                       int64_t n) {
    fr_adafactor_consts c = {0};
    const double t = (double)step;
    const double eps1 = o->eps > 0 ? o->eps : 1.1920928955078125e-07; /* finfo(float32).eps */
    c.w = (float)pow(t, o->beta2_decay), c.eps1 = (float)eps1, c.eps_sq = (float)(eps1 * eps1);
    const double rho = fmin(o->lr, 1.0 / sqrt(t));
    const double rms_p = (double)(float)sqrt(sumsq_p) / sqrt((double)n); /* .norm(2).item() */
    c.alpha = fmax(o->eps2, rms_p) * rho;
    c.shrink = (float)(1.0 - o->lr * o->weight_decay), c.decay = o->weight_decay != 0.0;
    c.b1 = (float)o->beta1, c.keep = (float)(1.0 - o->beta1), c.first_moment = o->beta1 != 0.0;
    return c;
}

void fr_adafactor_finish(fr_adafactor_consts *c, const fr_optim_opts *o, double sumsq_u,
                         int64_t n) {
    const double rms_u = (double)(float)sqrt(sumsq_u) / (sqrt((double)n) * o->clip_threshold);
    const double denom = fmax(1.0, rms_u);
    c->fden = (float)denom, c->falpha = (float)c->alpha, c->neg = (float)(-c->alpha / denom);
}

void fr_k_adafactor(float *p, const float *g, float *st, const fr_shape *shape,
                    const fr_optim_opts *o, int64_t step) {
    const fr_factored f = fr_factored_of(shape);
    if (f.n == 0) return;
    fr_adafactor_consts c =
        fr_adafactor_setup(o, step, fr_k_grad_sumsq(p, FR_F32, (size_t)f.n), f.n);
    /* the second moment, then the sum of U^2 slice by slice */
    double sum_u = 0;
    const int64_t L = f.factored ? f.L : 1;
    for (int64_t l = 0; l < L; l++) {
        af_slice a = af_slice_of(&f, g, st, l, c.eps_sq);
        if (f.factored) {
            af_factors(a.g, st + l * f.R, st + f.L * f.R + l * f.C, f.R, f.C, c.w);
            a.rden = af_rden(&a, c.eps1);
        } else {
            float *v = st;
#pragma omp parallel for schedule(static) if (f.n >= AF_PAR_MIN)
            for (int64_t k = 0; k < f.n; k++) v[k] = lerpf(v[k], g[k] * g[k], c.w);
        }
        sum_u += af_sumsq_u(&a);
    }
    fr_adafactor_finish(&c, o, sum_u, f.n);
    for (int64_t l = 0; l < L; l++) {
        af_slice a = af_slice_of(&f, g, st, l, c.eps_sq);
        if (f.factored) a.rden = af_rden(&a, c.eps1);
        float *pl = p + l * a.n;
        if (c.first_moment) { /* HF: u = U / denom * alpha; m = b1 m + (1 - b1) u; p -= m */
            float *m = st + f.first_at + l * a.n;
#pragma omp parallel for schedule(static) if (a.n >= AF_PAR_MIN)
            for (int64_t k = 0; k < a.n; k++) {
                float u = af_u(&a, k) / c.fden * c.falpha;
                m[k] = m[k] * c.b1 + c.keep * u;
                float pk = c.decay ? pl[k] * c.shrink : pl[k];
                pl[k] = pk - m[k];
            }
        } else {
#pragma omp parallel for schedule(static) if (a.n >= AF_PAR_MIN)
            for (int64_t k = 0; k < a.n; k++) {
                float pk = c.decay ? pl[k] * c.shrink : pl[k];
                pl[k] = pk + c.neg * af_u(&a, k);
            }
        }
    }
}
