/* optim.c — the optimizer updates on flat f32 arrays: SGD (momentum,
 * dampening, Nesterov, L2 weight decay), Adam (L2 weight decay) and AdamW
 * (decoupled weight decay). The formulas and the order of the float
 * operations are those of PyTorch's single-tensor (foreach=False) code paths
 * in torch/optim/{sgd,adam,adamw}.py: scalars derived from the options (the
 * bias corrections, 1 - dampening, 1 - lr wd) are computed in double and
 * rounded to float once, as PyTorch does when a Python number meets a float
 * tensor; the elementwise update is float. It owns no state: the momentum
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
    const float lr = o->lr, wd = o->weight_decay, mom = o->momentum;
    const float keep = (float)(1.0 - (double)o->dampening);
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

/* p, g, m, v: (n); step is 1-based (the count after this update). PyTorch:
 *   Adam:  g = g.add(p, alpha=wd)                 (if wd != 0)
 *   AdamW: p.mul_(1 - lr*wd)
 *   m.mul_(b1).add_(g, alpha=1-b1)
 *   v.mul_(b2).addcmul_(g, g, value=1-b2)
 *   step_size = lr / (1 - b1^t);  bc2_sqrt = sqrt(1 - b2^t)   (double)
 *   denom = (v.sqrt() / bc2_sqrt).add_(eps)
 *   p.addcdiv_(m, denom, value=-step_size)   = p + (-step_size * m) / denom
 * (the last line in the operand order of PyTorch's addcdiv CPU kernel). */
void fr_k_adam(float *p, const float *g, float *m, float *v, size_t n, const fr_optim_opts *o,
               int64_t step, int decoupled) {
    const double t = (double)step;
    const double bc1 = 1.0 - pow((double)o->beta1, t);
    const double bc2 = 1.0 - pow((double)o->beta2, t);
    const float neg_step_size = (float)-((double)o->lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    const float one_minus_b1 = (float)(1.0 - (double)o->beta1);
    const float one_minus_b2 = (float)(1.0 - (double)o->beta2);
    const float wd = o->weight_decay;
    const float shrink = (float)(1.0 - (double)o->lr * (double)o->weight_decay);
    const int l2 = !decoupled && wd != 0.0f, dec = decoupled && wd != 0.0f;
    const int64_t len = (int64_t)n;
    /* simd: the same IEEE operations lane by lane (no contraction), the same bits */
#pragma omp parallel for simd schedule(static) if (len >= OPTIM_PAR_MIN)
    for (int64_t i = 0; i < len; i++) {
        float gi = g[i];
        float pi = p[i];
        if (l2) gi = gi + wd * pi;
        if (dec) pi = pi * shrink;
        float mi = m[i] * b1 + one_minus_b1 * gi;
        float vi = v[i] * b2 + one_minus_b2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step_size * mi / denom;
    }
}
