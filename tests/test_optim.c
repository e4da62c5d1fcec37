/* test_optim.c — the optimizer kernels (src/backend/cpu/optim.c) and options
 * (src/optim/rules.c) against independent references:
 *   - closed forms derived by hand and evaluated in double (SGD on a constant
 *     gradient with momentum, dampening, Nesterov and weight decay; Adam's
 *     first step moving each weight by lr * g / (|g| + eps); Adam on a
 *     constant gradient; AdamW's pure decay p0 (1 - lr wd)^T versus Adam's
 *     L2 term, which Adam normalises away);
 *   - a plain double-precision re-statement of the update rules run on
 *     varying gradients;
 *   - a PyTorch dump (tests/optim_ref.h, made by tests/ref/optim_ref.py with
 *     torch.optim, foreach=False, options as Python floats, 37 elements) for 8 steps of
 *     10 option sets: Adam and AdamW bit for bit after every step, weights,
 *     exp_avg and exp_avg_sq (0 ulp); SGD within 5e-6;
 *   - the same bits whether the loop runs in parallel or not;
 *   - fr_optim_defaults and fr_optim_parse.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "check.h"
#include "optim_ref.h"

/* |got - want| <= rtol * max(|want|, floor). */
static int close_to(double got, double want, double rtol, double floor_) {
    return fabs(got - want) <= rtol * fmax(fabs(want), floor_);
}

static void check_vec(const char *what, const float *got, const double *want, int n, double rtol,
                      double floor_) {
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (!close_to(got[i], want[i], rtol, floor_)) bad = i;
    CHECK(bad < 0, "%s: element %d is %.9g, want %.9g", what, bad, bad < 0 ? 0.0 : got[bad],
          bad < 0 ? 0.0 : want[bad]);
}

static fr_optim_opts sgd_opts(float lr, float mom, float damp, int nesterov, float wd) {
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_SGD);
    o.lr = lr, o.momentum = mom, o.dampening = damp, o.nesterov = nesterov, o.weight_decay = wd;
    return o;
}

static fr_optim_opts adam_opts(fr_optim_kind kind, float lr, float b1, float b2, float eps,
                               float wd) {
    fr_optim_opts o = fr_optim_defaults(kind);
    o.lr = lr, o.beta1 = b1, o.beta2 = b2, o.eps = eps, o.weight_decay = wd;
    return o;
}

#define NV 5
static const float P0[NV] = {1.5f, -0.75f, 0.0f, 3.0f, -2.0f};
static const float G[NV] = {0.5f, -2.0f, 0.25f, 0.0f, 4.0f};

/* SGD on a constant gradient g, T steps, closed forms in double. */
static void test_sgd_closed_forms(void) {
    const int T = 7;
    const double lr = 0.03125, m = 0.75, d = 0.25; /* exact in float */
    float p[NV], buf[NV];
    double want[NV];
    char what[96];

    /* plain: p_T = p0 - T lr g */
    fr_optim_opts o = sgd_opts((float)lr, 0, 0, 0, 0);
    memcpy(p, P0, sizeof p);
    for (int t = 0; t < T; t++) fr_k_sgd(p, G, NULL, NV, &o, t == 0);
    for (int i = 0; i < NV; i++) want[i] = P0[i] - T * lr * G[i];
    check_vec("sgd plain", p, want, NV, 1e-6, 1.0);

    /* momentum m, no dampening: buf_t = g (1 - m^t) / (1 - m),
     * p_T = p0 - lr g sum_{t=1..T} (1 - m^t) / (1 - m) */
    o = sgd_opts((float)lr, (float)m, 0, 0, 0);
    memcpy(p, P0, sizeof p);
    for (int t = 0; t < T; t++) fr_k_sgd(p, G, buf, NV, &o, t == 0);
    double s = 0;
    for (int t = 1; t <= T; t++) s += (1 - pow(m, t)) / (1 - m);
    for (int i = 0; i < NV; i++) want[i] = P0[i] - lr * G[i] * s;
    check_vec("sgd momentum: p", p, want, NV, 1e-6, 1.0);
    for (int i = 0; i < NV; i++) want[i] = G[i] * (1 - pow(m, T)) / (1 - m);
    check_vec("sgd momentum: buf", buf, want, NV, 1e-6, 1.0);

    /* dampening d: buf_1 = g (the first step is not damped, as PyTorch),
     * buf_t = m^(t-1) g + (1 - d) g (1 - m^(t-1)) / (1 - m) */
    o = sgd_opts((float)lr, (float)m, (float)d, 0, 0);
    memcpy(p, P0, sizeof p);
    for (int t = 0; t < T; t++) fr_k_sgd(p, G, buf, NV, &o, t == 0);
    s = 0;
    for (int t = 1; t <= T; t++) s += pow(m, t - 1) + (1 - d) * (1 - pow(m, t - 1)) / (1 - m);
    for (int i = 0; i < NV; i++) want[i] = P0[i] - lr * G[i] * s;
    check_vec("sgd dampening: p", p, want, NV, 1e-6, 1.0);
    for (int i = 0; i < NV; i++)
        want[i] = G[i] * (pow(m, T - 1) + (1 - d) * (1 - pow(m, T - 1)) / (1 - m));
    check_vec("sgd dampening: buf", buf, want, NV, 1e-6, 1.0);

    /* Nesterov: the step direction is g + m buf_t */
    o = sgd_opts((float)lr, (float)m, 0, 1, 0);
    memcpy(p, P0, sizeof p);
    for (int t = 0; t < T; t++) fr_k_sgd(p, G, buf, NV, &o, t == 0);
    s = 0;
    for (int t = 1; t <= T; t++) s += 1 + m * (1 - pow(m, t)) / (1 - m);
    for (int i = 0; i < NV; i++) want[i] = P0[i] - lr * G[i] * s;
    check_vec("sgd nesterov: p", p, want, NV, 1e-6, 1.0);

    /* weight decay wd, no momentum: p_t = a p_(t-1) - lr g with a = 1 - lr wd,
     * so p_T = a^T p0 - lr g (1 - a^T) / (1 - a) */
    const double wd = 0.5;
    o = sgd_opts((float)lr, 0, 0, 0, (float)wd);
    memcpy(p, P0, sizeof p);
    for (int t = 0; t < T; t++) fr_k_sgd(p, G, NULL, NV, &o, t == 0);
    double a = 1 - lr * wd;
    for (int i = 0; i < NV; i++)
        want[i] = pow(a, T) * P0[i] - lr * G[i] * (1 - pow(a, T)) / (1 - a);
    check_vec("sgd weight decay", p, want, NV, 1e-6, 1.0);

    /* Nesterov with a first step only: d = g + m g = (1 + m) g */
    o = sgd_opts((float)lr, (float)m, 0, 1, 0);
    memcpy(p, P0, sizeof p);
    fr_k_sgd(p, G, buf, NV, &o, 1);
    for (int i = 0; i < NV; i++) want[i] = P0[i] - lr * (1 + m) * G[i];
    snprintf(what, sizeof what, "sgd nesterov first step");
    check_vec(what, p, want, NV, 1e-7, 1.0);
}

/* Adam's closed forms. */
static void test_adam_closed_forms(void) {
    const double lr = 1e-3, eps = 1e-8;
    char what[96];

    /* First step: m1 = (1-b1) g, v1 = (1-b2) g^2, so m1/(1-b1) = g and
     * sqrt(v1/(1-b2)) = |g|: p1 = p0 - lr g / (|g| + eps), about lr sign(g),
     * whatever the scale of g; g = 0 leaves p; g = eps moves by lr/2. */
    const float gs[] = {1e3f, 1.0f, -1e-3f, 0.0f, 1e-8f, -3e-5f};
    const int ng = (int)(sizeof gs / sizeof gs[0]);
    for (int kind = FR_OPTIM_ADAM; kind <= FR_OPTIM_ADAMW; kind++) {
        fr_optim_opts o = adam_opts((fr_optim_kind)kind, (float)lr, 0.9f, 0.999f, (float)eps, 0);
        float p[6], m[6] = {0}, v[6] = {0};
        double want[6];
        for (int i = 0; i < ng; i++) p[i] = 0.25f * (float)(i + 1);
        fr_k_adam(p, gs, m, v, (size_t)ng, &o, 1, kind == FR_OPTIM_ADAMW);
        for (int i = 0; i < ng; i++)
            want[i] = 0.25 * (i + 1) - lr * (double)gs[i] / (fabs((double)gs[i]) + eps);
        snprintf(what, sizeof what, "%s first step", kind == FR_OPTIM_ADAM ? "adam" : "adamw");
        check_vec(what, p, want, ng, 2e-7, 1.0);
        CHECK(p[3] == 0.25f * 4, "a zero gradient leaves the weight exactly (%.9g)", p[3]);
    }

    /* Constant gradient: bias correction makes m_hat = g and v_hat = g^2 at
     * every step, so each step moves by lr g / (|g| + eps): p_T = p0 - T lr g/(|g|+eps). */
    {
        const int T = 10;
        fr_optim_opts o = adam_opts(FR_OPTIM_ADAM, (float)lr, 0.9f, 0.999f, (float)eps, 0);
        float p[NV], m[NV] = {0}, v[NV] = {0};
        double want[NV];
        memcpy(p, P0, sizeof p);
        for (int t = 1; t <= T; t++) fr_k_adam(p, G, m, v, NV, &o, t, 0);
        for (int i = 0; i < NV; i++) want[i] = P0[i] - T * lr * G[i] / (fabs(G[i]) + eps);
        check_vec("adam constant gradient", p, want, NV, 2e-6, 1.0);
        for (int i = 0; i < NV; i++) want[i] = G[i] * (1 - pow(0.9f, T));
        check_vec("adam m after T steps = g (1 - b1^T)", m, want, NV, 1e-5, 1e-3);
        for (int i = 0; i < NV; i++) want[i] = (double)G[i] * G[i] * (1 - pow(0.999f, T));
        check_vec("adam v after T steps = g^2 (1 - b2^T)", v, want, NV, 1e-5, 1e-3);
    }

    /* No gradient, weight decay wd. AdamW: m = v = 0, only the decoupled
     * decay acts: p_T = p0 (1 - lr wd)^T. Adam (L2): the decay is a
     * gradient g' = wd p that Adam normalises: the first step moves by
     * lr wd p0 / (wd |p0| + eps), about lr, not lr wd p0. */
    {
        const int T = 6;
        const double wd = 0.25;
        const float zero[NV] = {0};
        float p[NV], m[NV] = {0}, v[NV] = {0};
        double want[NV];
        fr_optim_opts o = adam_opts(FR_OPTIM_ADAMW, 0.01f, 0.9f, 0.999f, (float)eps, (float)wd);
        memcpy(p, P0, sizeof p);
        for (int t = 1; t <= T; t++) fr_k_adam(p, zero, m, v, NV, &o, t, 1);
        for (int i = 0; i < NV; i++) want[i] = P0[i] * pow(1 - 0.01 * wd, T);
        check_vec("adamw pure decoupled decay", p, want, NV, 1e-6, 1e-6);

        o = adam_opts(FR_OPTIM_ADAM, 0.01f, 0.9f, 0.999f, (float)eps, (float)wd);
        memset(m, 0, sizeof m), memset(v, 0, sizeof v);
        memcpy(p, P0, sizeof p);
        fr_k_adam(p, zero, m, v, NV, &o, 1, 0);
        for (int i = 0; i < NV; i++) want[i] = P0[i] - 0.01 * wd * P0[i] / (wd * fabs(P0[i]) + eps);
        check_vec("adam L2 first step moves by lr", p, want, NV, 1e-6, 1e-6);
    }
}

/* The update rules restated in double, run on varying gradients. */
static void ref_adam_double(double *p, const float *g, double *m, double *v, int n, double lr,
                            double b1, double b2, double eps, double wd, int decoupled, int t) {
    for (int i = 0; i < n; i++) {
        double gi = g[i];
        if (decoupled) p[i] *= 1 - lr * wd;
        else gi += wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mh / (sqrt(vh) + eps);
    }
}

static void ref_sgd_double(double *p, const float *g, double *buf, int n, double lr, double mom,
                           double damp, int nesterov, double wd, int first) {
    for (int i = 0; i < n; i++) {
        double d = g[i] + wd * p[i];
        if (mom != 0) {
            buf[i] = first ? d : mom * buf[i] + (1 - damp) * d;
            d = nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

static void test_double_reference(void) {
    enum { N = 16, T = 20 };
    float g[T][N];
    uint64_t s = 12345;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            g[t][i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1) * (float)(1 + i % 4);
        }
    for (int kind = 0; kind < 3; kind++) {
        float p[N], b1[N] = {0}, b2[N] = {0};
        double pd[N], d1[N] = {0}, d2[N] = {0};
        for (int i = 0; i < N; i++) p[i] = (float)(pd[i] = 0.1 * (i - 7));
        fr_optim_opts o = kind == 0 ? sgd_opts(0.05f, 0.9f, 0.1f, 1, 0.01f)
                                    : adam_opts((fr_optim_kind)kind, 0.01f, 0.9f, 0.999f, 1e-8f,
                                                kind == 1 ? 0.05f : 0.1f);
        for (int t = 1; t <= T; t++) {
            if (kind == 0) {
                fr_k_sgd(p, g[t - 1], b1, N, &o, t == 1);
                ref_sgd_double(pd, g[t - 1], d1, N, o.lr, o.momentum, o.dampening, o.nesterov,
                               o.weight_decay, t == 1);
            } else {
                fr_k_adam(p, g[t - 1], b1, b2, N, &o, t, kind == 2);
                ref_adam_double(pd, g[t - 1], d1, d2, N, o.lr, o.beta1, o.beta2, o.eps,
                                o.weight_decay, kind == 2, t);
            }
        }
        char what[64];
        static const char *names[3] = {"sgd", "adam", "adamw"};
        snprintf(what, sizeof what, "%s 20 steps vs double", names[kind]);
        check_vec(what, p, pd, N, 1e-5, 1.0);
    }
}

/* Float ulps between got and want (0: the same bits). */
static double ulps(float got, float want) {
    if (!memcmp(&got, &want, sizeof got)) return 0;
    return fabs((double)got - want) / fmax(nextafterf(fabsf(want), INFINITY) - fabsf(want), 1e-45);
}

/* The PyTorch dump, every step. Adam and AdamW must give PyTorch's bits:
 * the weights, exp_avg and exp_avg_sq after each step (0 ulp), which holds
 * only if 1 - b1, 1 - b2, the bias corrections and 1 - lr wd are formed from
 * the double options and rounded to float once, as PyTorch does. SGD is
 * held to 5e-6 of O(1) values: PyTorch fuses its adds with alpha into FMAs
 * (as in fr_adam_elem), frugal's SGD does not (its fused-in-backward twin in
 * linear.c would have to change with it).
 * Reports the largest difference in float ulps. */
static void test_pytorch_reference(void) {
    const int ncase = (int)(sizeof optim_ref_cases / sizeof optim_ref_cases[0]);
    for (int c = 0; c < ncase; c++) {
        const optim_ref_case *rc = &optim_ref_cases[c];
        fr_optim_opts o = fr_optim_defaults((fr_optim_kind)rc->kind);
        o.lr = rc->lr, o.momentum = rc->momentum, o.dampening = rc->dampening;
        o.nesterov = rc->nesterov, o.weight_decay = rc->weight_decay;
        o.beta1 = rc->beta1, o.beta2 = rc->beta2, o.eps = rc->eps;
        float p[OPTIM_REF_N], s1[OPTIM_REF_N] = {0}, s2[OPTIM_REF_N] = {0};
        memcpy(p, optim_ref_p0, sizeof p);
        double maxulp[3] = {0, 0, 0};
        const int adam = rc->kind != FR_OPTIM_SGD;
        for (int t = 0; t < OPTIM_REF_STEPS; t++) {
            if (!adam) fr_k_sgd(p, optim_ref_grads[t], s1, OPTIM_REF_N, &o, t == 0);
            else
                fr_k_adam(p, optim_ref_grads[t], s1, s2, OPTIM_REF_N, &o, t + 1,
                          rc->kind == FR_OPTIM_ADAMW);
            const float *got[3] = {p, s1, s2}, *want[3] = {rc->p[t], rc->s1[t], rc->s2[t]};
            static const char *what[3] = {"weights", "state 1", "state 2"};
            for (int q = 0; q < 3; q++) {
                int worst = -1;
                double wu = 0;
                for (int i = 0; i < OPTIM_REF_N; i++) {
                    double u = ulps(got[q][i], want[q][i]);
                    if (u > wu) wu = u, worst = i;
                }
                maxulp[q] = fmax(maxulp[q], wu);
                if (adam) {
                    CHECK(worst < 0,
                          "torch %s: %s after step %d: [%d] %.9g, PyTorch %.9g (%.0f ulp)",
                          rc->name, what[q], t + 1, worst, worst < 0 ? 0.0 : got[q][worst],
                          worst < 0 ? 0.0 : want[q][worst], wu);
                } else {
                    double w[OPTIM_REF_N];
                    char label[96];
                    for (int i = 0; i < OPTIM_REF_N; i++) w[i] = want[q][i];
                    snprintf(label, sizeof label, "torch %s: %s after step %d", rc->name, what[q],
                             t + 1);
                    check_vec(label, got[q], w, OPTIM_REF_N, 5e-6, 1.0);
                }
            }
        }
        printf("  torch %-28s max ulp: weights %.0f, state %.0f, %.0f\n", rc->name, maxulp[0],
               maxulp[1], maxulp[2]);
    }
}

/* Parallel and serial give the same bits: update a long array in one call
 * (OpenMP team) and in slices too short to go parallel. */
static void test_parallel_bits(void) {
    const size_t n = 100003, slice = 1000;
    float *p1 = malloc(n * sizeof(float)), *p2 = malloc(n * sizeof(float));
    float *g = malloc(n * sizeof(float)), *m1 = calloc(n, sizeof(float)),
          *m2 = calloc(n, sizeof(float)), *v1 = calloc(n, sizeof(float)),
          *v2 = calloc(n, sizeof(float));
    if (!p1 || !p2 || !g || !m1 || !m2 || !v1 || !v2) {
        CHECK(0, "malloc");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        p1[i] = p2[i] = (float)sin((double)i);
        g[i] = (float)cos(0.37 * (double)i);
    }
    fr_optim_opts o = adam_opts(FR_OPTIM_ADAMW, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f);
    for (int t = 1; t <= 3; t++) {
        fr_k_adam(p1, g, m1, v1, n, &o, t, 1);
        for (size_t i = 0; i < n; i += slice) {
            size_t k = n - i < slice ? n - i : slice;
            fr_k_adam(p2 + i, g + i, m2 + i, v2 + i, k, &o, t, 1);
        }
    }
    CHECK(!memcmp(p1, p2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)) &&
              !memcmp(v1, v2, n * sizeof(float)),
          "adam: parallel and sliced updates differ");
    fr_optim_opts s = sgd_opts(0.01f, 0.9f, 0, 1, 1e-4f);
    for (int t = 0; t < 3; t++) {
        fr_k_sgd(p1, g, m1, n, &s, t == 0);
        for (size_t i = 0; i < n; i += slice) {
            size_t k = n - i < slice ? n - i : slice;
            fr_k_sgd(p2 + i, g + i, m2 + i, k, &s, t == 0);
        }
    }
    CHECK(!memcmp(p1, p2, n * sizeof(float)) && !memcmp(m1, m2, n * sizeof(float)),
          "sgd: parallel and sliced updates differ");
out:
    free(p1), free(p2), free(g), free(m1), free(m2), free(v1), free(v2);
}

static void test_opts(void) {
    fr_optim_opts o = fr_optim_defaults(FR_OPTIM_SGD);
    CHECK(o.kind == FR_OPTIM_SGD && o.lr == 0.01 && o.momentum == 0 && o.dampening == 0 &&
              o.nesterov == 0 && o.weight_decay == 0 && o.zero_grad_to_none == 1,
          "sgd defaults");
    o = fr_optim_defaults(FR_OPTIM_ADAM);
    CHECK(o.kind == FR_OPTIM_ADAM && o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 &&
              o.eps == 1e-8 && o.weight_decay == 0 && o.zero_grad_to_none == 1,
          "adam defaults");
    o = fr_optim_defaults(FR_OPTIM_ADAMW);
    CHECK(o.kind == FR_OPTIM_ADAMW && o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 &&
              o.eps == 1e-8 && o.weight_decay == 1e-2 && o.zero_grad_to_none == 1,
          "adamw defaults");

    const struct {
        const char *name;
        fr_optim_kind kind;
    } ok[] = {
        {"sgd", FR_OPTIM_SGD},     {"adam", FR_OPTIM_ADAM},           {"adamw", FR_OPTIM_ADAMW},
        {"AdamW", FR_OPTIM_ADAMW}, {"Adafactor", FR_OPTIM_ADAFACTOR}, {"SGD", FR_OPTIM_SGD}};
    fr_ctx *ctx = fr_ctx_new();
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        fr_optim_kind k = (fr_optim_kind)-1;
        fr_status st = fr_optim_parse(ctx, ok[i].name, &k);
        CHECK(st == FR_OK && k == ok[i].kind && fr_last_error(ctx)[0] == 0, "parse '%s'",
              ok[i].name);
    }
    const char *bad[] = {"rmsprop", "", "adam ", "adamww", "ada", "sgdx", "adafactorx"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fr_optim_kind k = FR_OPTIM_ADAM;
        char want[128];
        fr_status st = fr_optim_parse(ctx, bad[i], &k);
        snprintf(want, sizeof want, "unknown optimizer '%s' (choose sgd, adam, adamw or adafactor)",
                 bad[i]);
        CHECK(st == FR_ERR_ARG && k == FR_OPTIM_ADAM && !strcmp(fr_last_error(ctx), want),
              "parse '%s': status %d, message '%s'", bad[i], (int)st, fr_last_error(ctx));
    }
    fr_optim_kind k;
    CHECK(fr_optim_parse(NULL, "lbfgs", &k) == FR_ERR_ARG, "parse with no context");
    CHECK(fr_optim_parse(ctx, NULL, &k) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "unknown optimizer ''"),
          "parse NULL: %s", fr_last_error(ctx));
    fr_ctx_free(ctx);
}

int main(void) {
    test_sgd_closed_forms();
    test_adam_closed_forms();
    test_double_reference();
    test_pytorch_reference();
    test_parallel_bits();
    test_opts();
    return check_done();
}
