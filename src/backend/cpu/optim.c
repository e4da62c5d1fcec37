/* optim.c — the optimizer updates on flat f32 arrays: SGD (momentum,
 * dampening, Nesterov, L2 weight decay), Adam (L2 weight decay) and AdamW
 * (decoupled weight decay). The formulas and the order of the float
 * operations are those of PyTorch's single-tensor (foreach=False) code paths
 * in torch/optim/{sgd,adam,adamw}.py: the options are doubles (Python
 * floats); scalars derived from them (1 - b1, 1 - b2, the bias corrections,
 * 1 - dampening, 1 - lr wd) are computed in double and rounded to float
 * once, as PyTorch does when a Python number meets a float tensor; the
 * elementwise update is float. It owns no state: the momentum
 * buffer and the Adam moments are the caller's (category FR_MEM_OPTIM). */
#include <math.h>
#include "backend/cpu/kernels.h"

#define OPTIM_PAR_MIN 16384 /* below this a thread team costs more than it saves */

/* p, g, buf: (n). PyTorch:
 *   d = g.add(p, alpha=wd)                       (if wd != 0)
 *   buf = clone(d)                               (first step)
 *   buf.mul_(momentum).add_(d, alpha=1-dampening) (later steps)
 *   d = d.add(buf, alpha=momentum) if nesterov else buf
 *   p.add_(d, alpha=-lr)
 * buf may be NULL when momentum is 0. */
void fr_k_sgd(float *p, const float *g, float *buf, size_t n, const fr_optim_opts *o,
              int first_step) {
    const float lr = (float)o->lr, wd = (float)o->weight_decay, mom = (float)o->momentum;
    const float keep = (float)(1.0 - o->dampening);
    const int nesterov = o->nesterov;
    const int64_t len = (int64_t)n;
#pragma omp parallel for schedule(static) if (len >= OPTIM_PAR_MIN)
    for (int64_t i = 0; i < len; i++) {
        float d = g[i];
        if (wd != 0.0f) d = d + wd * p[i];
        if (mom != 0.0f) {
            float b = first_step ? d : buf[i] * mom + keep * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] + (-lr) * d;
    }
}

fr_adam_consts fr_adam_setup(const fr_optim_opts *o, int64_t step, int decoupled) {
    fr_adam_consts c;
    const double t = (double)step;
    const double bc1 = 1.0 - pow(o->beta1, t);
    const double bc2 = 1.0 - pow(o->beta2, t);
    c.neg_step_size = (float)-(o->lr / bc1);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.b1 = (float)o->beta1;
    c.b2 = (float)o->beta2;
    c.eps = (float)o->eps;
    c.one_minus_b1 = (float)(1.0 - o->beta1);
    c.one_minus_b2 = (float)(1.0 - o->beta2);
    c.wd = (float)o->weight_decay;
    c.shrink = (float)(1.0 - o->lr * o->weight_decay);
    c.l2 = !decoupled && c.wd != 0.0f;
    c.dec = decoupled && c.wd != 0.0f;
    return c;
}

/* p, g, m, v: (n) with fr_adam_elem. The clone for CPUs with FMA makes its
 * fmaf one instruction, 8 lanes at a time; elsewhere fmaf is libm's, with
 * the same single rounding: the same bits. */
FR_V3_CLONES static void adam_span(const fr_adam_consts *c, float *p, const float *g, float *m,
                                   float *v, size_t n) {
    const fr_adam_consts cl = *c; /* a private copy: its branches then vectorize */
#pragma omp simd
    for (size_t i = 0; i < n; i++) fr_adam_elem(&cl, &p[i], g[i], &m[i], &v[i]);
}

#define ADAM_CHUNK 4096

/* p, g, m, v: (n); step is 1-based (the count after this update); the
 * update is fr_adam_elem (PyTorch's, see kernels.h), elementwise, so the
 * bits do not depend on the thread count. */
void fr_k_adam(float *p, const float *g, float *m, float *v, size_t n, const fr_optim_opts *o,
               int64_t step, int decoupled) {
    const fr_adam_consts c = fr_adam_setup(o, step, decoupled);
    const int64_t chunks = (int64_t)((n + ADAM_CHUNK - 1) / ADAM_CHUNK);
#pragma omp parallel for schedule(static) if (n >= OPTIM_PAR_MIN)
    for (int64_t k = 0; k < chunks; k++) {
        const size_t lo = (size_t)k * ADAM_CHUNK, cnt = n - lo < ADAM_CHUNK ? n - lo : ADAM_CHUNK;
        adam_span(&c, p + lo, g + lo, m + lo, v + lo, cnt);
    }
}
