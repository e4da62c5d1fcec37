/* test_backend_cpu.c — the CPU as a complete backend: every member of
 * fr_cpu_backend is there (wait_copy, documented optional, is NULL) and does
 * what backend.h says, each against a computation written here:
 *   memory    alloc/release/arena/track seen in the host fr_mem's stats by
 *             category, reserved bytes by the size classes' rule by hand;
 *             refusals are NULL with the error set;
 *   copies    write/read/zero at offsets against a shadow array;
 *   optimizer optim_update over two steps of SGD (momentum with dampening,
 *             Nesterov, weight decay), Adam (L2) and AdamW against the
 *             PyTorch formulas in float64 (within float rounding), f32 and
 *             bf16 weights; and bit for bit the host step's kernels
 *             (fr_k_sgd, fr_k_adam, fr_k_adam_state, fr_k_adam_half);
 *   scaling   unscale's found_inf on inf and on NaN, g*inv and g*f exactly
 *             (a float product of two floats is the double one rounded
 *             once), the sum of squares in float64;
 *   accuracy  hits on a hand-made logits matrix with ties (first max wins);
 *   uploads   a synchronous copy at an offset with NULL events.
 * Then, where an OpenCL device is found (PoCL in CI), the same calls through
 * fr_cl_backend's members, compared with the CPU's (ggml's test-backend-ops
 * idea): bytes, counts and flags the same; optimizer and scaling the same
 * bits where the device has fp64 (test_opencl_optim's bound), else within
 * 1e-5 relative. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "bf16_ref.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/optim_state.h"
#include "core/ctx.h"
#include "core/half.h"
#include "frugal.h"
#if FR_HAVE_OPENCL
#include "cl_device.h"
#endif

typedef struct dev {
    fr_ctx *ctx;
    const fr_backend *be;
    fr_mem *mem; /* where its buffers are accounted */
    int exact;   /* 1: the same bits as the CPU expected */
} dev;

/* A tensor over bytes off.. of buffer h, as the backend addresses it. */
static fr_tensor at(const dev *d, void *h, size_t off, fr_dtype dt, fr_shape s) {
    fr_tensor t = {.dtype = dt, .shape = s};
    if (!h) return t;
    if (d->be->host_memory) t.data = (char *)h + off;
    else t.buf = h, t.off = off;
    return t;
}

static void *put(const dev *d, const void *src, size_t off, size_t bytes) {
    void *h = d->be->alloc(d->ctx, off + bytes, FR_MEM_OTHER);
    CHECK(h != NULL, "%s: alloc %zu: %s", d->be->name, off + bytes, fr_last_error(d->ctx));
    if (h && src)
        CHECK(d->be->write(d->ctx, h, off, src, bytes) == FR_OK, "%s: write: %s", d->be->name,
              fr_last_error(d->ctx));
    return h;
}

static void get(const dev *d, void *h, size_t off, void *dst, size_t bytes) {
    CHECK(d->be->read(d->ctx, h, off, dst, bytes) == FR_OK, "%s: read: %s", d->be->name,
          fr_last_error(d->ctx));
}

/* ---- the table ---- */

/* Every member; the optional ones as backend.h has them: gemm16 (NULL: f32
 * GEMM operands, the OpenCL backend's) checked on the CPU, wait_copy (NULL:
 * copies done on return, the CPU's) on a device. */
static void test_members(const fr_backend *be) {
#define MEMBER(m) CHECK(be->m != NULL, "%s: member " #m " is NULL", be->name)
    MEMBER(name);
    MEMBER(kernels);
    MEMBER(ws_elems);
    MEMBER(alloc);
    MEMBER(release);
    MEMBER(arena_alloc);
    MEMBER(arena_free);
    MEMBER(track);
    MEMBER(write);
    MEMBER(read);
    MEMBER(zero);
    MEMBER(finish);
    MEMBER(max_buffer);
    MEMBER(global_mem);
    MEMBER(copy_rate);
    MEMBER(flop_rate);
    MEMBER(copy_overlap);
    MEMBER(optim_update);
    MEMBER(grad_unscale);
    MEMBER(grad_sumsq);
    MEMBER(grad_scale);
    MEMBER(hits);
    MEMBER(upload_open);
    MEMBER(upload_close);
    MEMBER(upload);
    MEMBER(upload_finish);
    MEMBER(event_mark);
    MEMBER(event_order);
    MEMBER(event_wait);
    MEMBER(event_release);
    MEMBER(event_times);
    if (be->host_memory) MEMBER(gemm16);
    else MEMBER(wait_copy);
#undef MEMBER
}

/* ---- memory ---- */

/* What one request reserves, by the rules mem.h states: the host's 64-byte
 * multiples below 64 KiB, 4 KiB multiples from there; a device's 512-byte
 * multiples (at least 512) up to 1 MiB, 2 MiB multiples above. */
static size_t class_of(int host, size_t n) {
    size_t r;
    if (host) r = n < (64u << 10) ? 64 : 4096;
    else r = n <= (1u << 20) ? 512 : 2u << 20;
    n = n ? n : 1;
    return (n + r - 1) / r * r;
}

static void test_memory(const dev *d) {
    const fr_backend *be = d->be;
    const char *nm = be->name;
    fr_mem_stats a, b;
    fr_mem_empty_cache_of(d->mem);
    fr_mem_stats_of(d->mem, &a);
    void *g = be->alloc(d->ctx, 1000, FR_MEM_GRADS);
    fr_mem_stats_of(d->mem, &b);
    CHECK(g != NULL, "%s: alloc: %s", nm, fr_last_error(d->ctx));
    CHECK(b.allocated[FR_MEM_GRADS] - a.allocated[FR_MEM_GRADS] == 1000,
          "%s: 1000 bytes of gradients allocated %zu", nm,
          b.allocated[FR_MEM_GRADS] - a.allocated[FR_MEM_GRADS]);
    CHECK(b.reserved - a.reserved == class_of(be->host_memory, 1000),
          "%s: 1000 bytes reserved %zu, the class %zu", nm, b.reserved - a.reserved,
          class_of(be->host_memory, 1000));
    be->release(d->ctx, g); /* back to the source, or cached (a device caches every block) */
    fr_mem_stats_of(d->mem, &b);
    CHECK(b.allocated[FR_MEM_GRADS] == a.allocated[FR_MEM_GRADS] &&
              b.reserved - b.cached == a.reserved,
          "%s: released, gradients %zu (were %zu), reserved %zu less %zu cached (was %zu)", nm,
          b.allocated[FR_MEM_GRADS], a.allocated[FR_MEM_GRADS], b.reserved, b.cached, a.reserved);
    fr_mem_empty_cache_of(d->mem);

    /* the arena: reserved, nothing allocated until the plan's events say */
    const size_t arena = 100000;
    void *ar = be->arena_alloc(d->ctx, arena);
    fr_mem_stats_of(d->mem, &b);
    CHECK(ar != NULL, "%s: arena: %s", nm, fr_last_error(d->ctx));
    CHECK(b.allocated_total == a.allocated_total &&
              b.reserved - a.reserved == class_of(be->host_memory, arena),
          "%s: an arena of %zu: allocated %zu (was %zu), reserved +%zu (the class %zu)", nm, arena,
          b.allocated_total, a.allocated_total, b.reserved - a.reserved,
          class_of(be->host_memory, arena));
    be->track(d->ctx, FR_MEM_ACTIVATIONS, 4096);
    fr_mem_stats_of(d->mem, &b);
    CHECK(b.allocated[FR_MEM_ACTIVATIONS] - a.allocated[FR_MEM_ACTIVATIONS] == 4096,
          "%s: track +4096 activations: %zu", nm,
          b.allocated[FR_MEM_ACTIVATIONS] - a.allocated[FR_MEM_ACTIVATIONS]);
    be->track(d->ctx, FR_MEM_ACTIVATIONS, -4096);
    be->arena_free(d->ctx, ar);
    fr_mem_stats_of(d->mem, &b);
    CHECK(b.allocated_total == a.allocated_total,
          "%s: the arena given back: allocated %zu, was %zu", nm, b.allocated_total,
          a.allocated_total);
    fr_mem_empty_cache_of(d->mem);
    fr_mem_stats_of(d->mem, &b);
    CHECK(b.reserved == a.reserved, "%s: the cache emptied: reserved %zu, was %zu", nm, b.reserved,
          a.reserved);

    /* refusals: NULL with the error set, counted */
    fr_mem_fail_at_of(d->mem, 1);
    d->ctx->err[0] = 0;
    void *no = be->alloc(d->ctx, 64, FR_MEM_DATA);
    CHECK(no == NULL && strstr(fr_last_error(d->ctx), "injected"),
          "%s: an injected failure: %p, '%s'", nm, no, fr_last_error(d->ctx));
    fr_mem_fail_at_of(d->mem, 0);
    fr_mem_set_limit_of(d->mem, a.reserved + 4096);
    d->ctx->err[0] = 0;
    no = be->alloc(d->ctx, 1u << 20, FR_MEM_DATA);
    CHECK(no == NULL && strstr(fr_last_error(d->ctx), "budget"), "%s: over the limit: %p, '%s'", nm,
          no, fr_last_error(d->ctx));
    fr_mem_set_limit_of(d->mem, 0);
    be->release(d->ctx, no);

    CHECK(be->finish(d->ctx) == FR_OK, "%s: finish: %s", nm, fr_last_error(d->ctx));
    CHECK(be->max_buffer(d->ctx) >= (1u << 20), "%s: max_buffer %zu", nm, be->max_buffer(d->ctx));
    CHECK(be->global_mem(d->ctx) >= (1u << 20), "%s: global_mem %zu", nm, be->global_mem(d->ctx));
}

/* The CPU's global memory is the machine's: /proc/meminfo's MemTotal. */
static void test_cpu_sizes(fr_ctx *ctx) {
    const fr_backend *be = &fr_cpu_backend;
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    if (kb) {
        double want = (double)kb * 1024, got = (double)be->global_mem(ctx);
        CHECK(fabs(got - want) <= 0.01 * want, "cpu: global_mem %.0f, /proc/meminfo %.0f", got,
              want);
    }
    CHECK(be->max_buffer(ctx) == (size_t)PTRDIFF_MAX, "cpu: max_buffer %zu", be->max_buffer(ctx));
    /* not measured: the planner keeps --offload on the host uncosted */
    CHECK(be->copy_rate(ctx) == 0 && be->flop_rate(ctx) == 0 && be->copy_overlap(ctx) == 0,
          "cpu: rates %g %g %g", be->copy_rate(ctx), be->flop_rate(ctx), be->copy_overlap(ctx));
    CHECK(be->host_memory == 1 && !fr_backend_is_device(be) && be->wait_copy == NULL,
          "cpu: host_memory %d, is_device %d", be->host_memory, fr_backend_is_device(be));
}

/* ---- copies ---- */

enum { NB = 256 };

/* zero everything, write 100 bytes at 37, zero 20 at 50; *out = the buffer */
static void test_copies(const dev *d, uint8_t out[NB]) {
    uint8_t src[100], shadow[NB], part[30];
    for (int i = 0; i < 100; i++) src[i] = (uint8_t)(7 * i + 3);
    for (int i = 0; i < NB; i++) shadow[i] = 0;
    for (int i = 0; i < 100; i++) shadow[37 + i] = src[i];
    for (int i = 50; i < 70; i++) shadow[i] = 0;
    void *h = put(d, NULL, 0, NB);
    if (!h) return;
    CHECK(d->be->zero(d->ctx, h, 0, NB) == FR_OK, "%s: zero", d->be->name);
    CHECK(d->be->write(d->ctx, h, 37, src, 100) == FR_OK, "%s: write", d->be->name);
    CHECK(d->be->zero(d->ctx, h, 50, 20) == FR_OK, "%s: zero at 50", d->be->name);
    get(d, h, 0, out, NB);
    int bad = -1;
    for (int i = 0; i < NB && bad < 0; i++)
        if (out[i] != shadow[i]) bad = i;
    CHECK(bad < 0, "%s: byte %d is %d, the shadow's %d", d->be->name, bad, bad < 0 ? 0 : out[bad],
          bad < 0 ? 0 : shadow[bad]);
    get(d, h, 40, part, sizeof part);
    CHECK(!memcmp(part, shadow + 40, sizeof part), "%s: 30 bytes read at 40 differ", d->be->name);
    d->be->release(d->ctx, h);
}

/* ---- the optimizer ---- */

static float val(uint64_t seed, int i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31, x *= 0x94D049BB133111EBull, x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* PyTorch's step in float64: p, m, v (SGD: m the momentum buffer) updated
 * in place for step t from gradient g. */
static void ref_step(const fr_optim_opts *o, int64_t t, double *p, double g, double *m, double *v) {
    if (o->kind == FR_OPTIM_SGD) {
        double d = g + o->weight_decay * *p;
        if (o->momentum != 0) {
            *m = t == 1 ? d : o->momentum * *m + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * *m : *m;
        }
        *p -= o->lr * d;
        return;
    }
    if (o->kind == FR_OPTIM_ADAM) g += o->weight_decay * *p;
    else *p *= 1 - o->lr * o->weight_decay;
    *m = o->beta1 * *m + (1 - o->beta1) * g;
    *v = o->beta2 * *v + (1 - o->beta2) * g * g;
    double bc1 = 1 - pow(o->beta1, (double)t), bc2 = 1 - pow(o->beta2, (double)t);
    *p -= o->lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + o->eps);
}

enum { NP = 37, STEPS = 2, OFF = 64 };

typedef struct optim_case {
    const char *name;
    fr_optim_opts o;
    fr_dtype pdt; /* f32 or bf16 weights (the state then in their format) */
    int kind;     /* fr_state_kind of f32 weights' Adam state */
} optim_case;

/* The weights and state after STEPS steps through d's optim_update, as
 * floats (bf16 widened); the state bytes as stored in sb. */
typedef struct optim_out {
    float p[NP], s[2][NP];
    uint8_t sb[2][4 * NP + 64];
} optim_out;

static size_t state_bytes(const optim_case *c) {
    if (c->pdt != FR_F32) return NP * 2;
    return fr_state_bytes((fr_state_kind)c->kind, NP);
}

static int run_optim(const dev *d, const optim_case *c, optim_out *out) {
    const size_t esz = fr_dtype_size(c->pdt), sb = state_bytes(c);
    int ns = c->o.kind == FR_OPTIM_SGD ? c->o.momentum != 0 : 2;
    uint8_t p0[NP * 4], zeros[4 * NP + 64] = {0};
    for (int i = 0; i < NP; i++) {
        float x = val(1, i);
        if (c->pdt == FR_F32) memcpy(p0 + 4 * i, &x, 4);
        else {
            uint16_t h = ref_bf16(x);
            memcpy(p0 + 2 * i, &h, 2);
        }
    }
    void *hp = put(d, p0, OFF, NP * esz), *hg = put(d, NULL, OFF, NP * 4), *hs[2] = {0};
    for (int k = 0; k < ns; k++) hs[k] = put(d, zeros, 0, sb); /* the device's: from byte 0 */
    int st = !hp || !hg || (ns > 0 && !hs[0]) || (ns > 1 && !hs[1]);
    for (int64_t t = 1; t <= STEPS && !st; t++) {
        float g[NP];
        for (int i = 0; i < NP; i++) g[i] = val(10 + (uint64_t)t, i);
        st = d->be->write(d->ctx, hg, OFF, g, sizeof g);
        fr_tensor p = at(d, hp, OFF, c->pdt, fr_shape1(NP)), gt = at(d, hg, OFF, FR_F32, p.shape);
        fr_tensor s[2] = {at(d, hs[0], 0, c->pdt, p.shape), at(d, hs[1], 0, c->pdt, p.shape)};
        if (!st) st = d->be->optim_update(d->ctx, &c->o, t, &p, &gt, s, c->kind);
        CHECK(st == FR_OK, "%s: %s step %lld: %s", d->be->name, c->name, (long long)t,
              fr_last_error(d->ctx));
    }
    if (!st) {
        uint8_t raw[NP * 4];
        get(d, hp, OFF, raw, NP * esz);
        for (int i = 0; i < NP; i++) {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            if (c->pdt == FR_F32) memcpy(&out->p[i], raw + 4 * i, 4);
            else out->p[i] = ref_bf16_value(h);
        }
        memset(out->s, 0, sizeof out->s);
        memset(out->sb, 0, sizeof out->sb);
        for (int k = 0; k < ns; k++) {
            get(d, hs[k], 0, out->sb[k], sb);
            for (int i = 0; i < NP; i++) {
                uint16_t h;
                memcpy(&h, out->sb[k] + 2 * i, 2);
                if (c->pdt != FR_F32) out->s[k][i] = ref_bf16_value(h);
                else if (c->kind == FR_STATE_F32) memcpy(&out->s[k][i], out->sb[k] + 4 * i, 4);
            }
        }
    }
    d->be->release(d->ctx, hp), d->be->release(d->ctx, hg);
    d->be->release(d->ctx, hs[0]), d->be->release(d->ctx, hs[1]);
    return st;
}

/* The host step's own calls on plain arrays (step.c's optimizer_update for
 * one tensor), for the bit-for-bit check of the CPU's member. */
static void host_step(const optim_case *c, optim_out *out) {
    int ns = c->o.kind == FR_OPTIM_SGD ? c->o.momentum != 0 : 2;
    float p[NP], s[2][NP] = {{0}}, w[NP];
    uint16_t p16[NP], s16[2][NP] = {{0}};
    uint8_t sk[2][4 * NP + 64] = {{0}};
    for (int i = 0; i < NP; i++) p[i] = val(1, i), p16[i] = ref_bf16(p[i]);
    for (int64_t t = 1; t <= STEPS; t++) {
        float g[NP];
        for (int i = 0; i < NP; i++) g[i] = val(10 + (uint64_t)t, i);
        int adamw = c->o.kind == FR_OPTIM_ADAMW;
        if (c->pdt != FR_F32 && c->o.kind != FR_OPTIM_SGD) {
            fr_k_adam_half(p16, g, 0, s16[0], s16[1], NP, &c->o, t, adamw, 0);
        } else if (c->pdt != FR_F32) { /* SGD in f32 working copies, rounded back */
            fr_bf16_to_f32_n(p16, w, NP);
            float m[NP];
            if (ns) fr_bf16_to_f32_n(s16[0], m, NP);
            fr_k_sgd(w, g, ns ? m : NULL, NP, &c->o, t == 1);
            fr_f32_to_bf16_n(w, p16, NP);
            if (ns) fr_f32_to_bf16_n(m, s16[0], NP);
        } else if (c->o.kind == FR_OPTIM_SGD) {
            fr_k_sgd(p, g, ns ? s[0] : NULL, NP, &c->o, t == 1);
        } else if (c->kind != FR_STATE_F32) {
            fr_k_adam_state(p, g, sk[0], sk[1], NP, &c->o, t, adamw, (fr_state_kind)c->kind);
        } else {
            fr_k_adam(p, g, s[0], s[1], NP, &c->o, t, adamw);
        }
    }
    memset(out, 0, sizeof *out);
    for (int i = 0; i < NP; i++) {
        out->p[i] = c->pdt == FR_F32 ? p[i] : ref_bf16_value(p16[i]);
        for (int k = 0; k < 2; k++)
            out->s[k][i] = c->pdt != FR_F32          ? ref_bf16_value(s16[k][i])
                           : c->kind == FR_STATE_F32 ? s[k][i]
                                                     : 0;
    }
    if (c->pdt == FR_F32 && c->kind != FR_STATE_F32) memcpy(out->sb, sk, sizeof sk);
}

/* The float64 reference after STEPS steps: the weights and (f32 state) the
 * moments, from the bf16-rounded start for bf16 weights. */
static void ref_run(const optim_case *c, double p[NP], double s[2][NP]) {
    for (int i = 0; i < NP; i++) {
        p[i] = c->pdt == FR_F32 ? val(1, i) : ref_bf16_value(ref_bf16(val(1, i)));
        s[0][i] = s[1][i] = 0;
        for (int64_t t = 1; t <= STEPS; t++)
            ref_step(&c->o, t, &p[i], val(10 + (uint64_t)t, i), &s[0][i], &s[1][i]);
    }
}

static optim_case *cases(int *n) {
    static optim_case c[8];
    int k = 0;
    fr_optim_opts sgd = fr_optim_defaults(FR_OPTIM_SGD);
    sgd.lr = 0.05, sgd.momentum = 0.9, sgd.dampening = 0.1, sgd.weight_decay = 0.01;
    c[k++] = (optim_case){"sgd momentum dampening wd", sgd, FR_F32, FR_STATE_F32};
    sgd.dampening = 0, sgd.nesterov = 1;
    c[k++] = (optim_case){"sgd nesterov", sgd, FR_F32, FR_STATE_F32};
    sgd.momentum = 0, sgd.nesterov = 0;
    c[k++] = (optim_case){"sgd plain", sgd, FR_F32, FR_STATE_F32};
    fr_optim_opts adam = fr_optim_defaults(FR_OPTIM_ADAM);
    adam.weight_decay = 0.01, adam.lr = 0.01;
    c[k++] = (optim_case){"adam l2", adam, FR_F32, FR_STATE_F32};
    fr_optim_opts adamw = fr_optim_defaults(FR_OPTIM_ADAMW);
    adamw.lr = 0.01;
    c[k++] = (optim_case){"adamw", adamw, FR_F32, FR_STATE_F32};
    c[k++] = (optim_case){"adamw bf16 state", adamw, FR_F32, FR_STATE_BF16};
    c[k++] = (optim_case){"adamw bf16 weights", adamw, FR_BF16, FR_STATE_F32};
    sgd.momentum = 0.9;
    c[k++] = (optim_case){"sgd momentum bf16 weights", sgd, FR_BF16, FR_STATE_F32};
    *n = k;
    return c;
}

static void test_optim_cpu(fr_ctx *ctx) {
    const dev d = {ctx, &fr_cpu_backend, &ctx->mem, 1};
    int n;
    const optim_case *c = cases(&n);
    for (int k = 0; k < n; k++) {
        optim_out got, host;
        if (run_optim(&d, &c[k], &got)) continue;
        host_step(&c[k], &host);
        CHECK(!memcmp(got.p, host.p, sizeof got.p) && !memcmp(got.s, host.s, sizeof got.s),
              "cpu: %s: not the host step's bits", c[k].name);
        if (c[k].kind != FR_STATE_F32)
            CHECK(!memcmp(got.sb, host.sb, sizeof got.sb), "cpu: %s: state bytes differ",
                  c[k].name);
        /* float64: within float rounding (f32: a few ulp over two steps;
         * bf16 weights: a bf16 ulp, 2^-8 relative) */
        double p[NP], s[2][NP];
        ref_run(&c[k], p, s);
        int bf = c[k].pdt == FR_BF16, worst = -1;
        /* bf16 weights or state keep the state in bf16 between steps: the
         * second step's update is off by a few bf16 ulp of lr */
        int lossy = bf || c[k].kind != FR_STATE_F32;
        double rel = bf ? 1.0 / 128 : 1e-6, tol_abs = lossy ? c[k].o.lr / 32 : 1e-7, err = 0;
        for (int i = 0; i < NP; i++) {
            double e = fabs(got.p[i] - p[i]) / (rel * fabs(p[i]) + tol_abs);
            if (e > err) err = e, worst = i;
        }
        CHECK(err <= 1, "cpu: %s: p[%d] %.9g, float64 %.9g", c[k].name, worst, got.p[worst],
              p[worst]);
        if (c[k].pdt == FR_F32 && c[k].kind == FR_STATE_F32) {
            int ns = c[k].o.kind == FR_OPTIM_SGD ? c[k].o.momentum != 0 : 2;
            for (int j = 0; j < ns; j++)
                for (int i = 0; i < NP; i++)
                    CHECK(fabs(got.s[j][i] - s[j][i]) <= 1e-6 * fabs(s[j][i]) + 1e-6,
                          "cpu: %s: state %d [%d] %.9g, float64 %.9g", c[k].name, j, i, got.s[j][i],
                          s[j][i]);
        }
    }
}

/* ---- gradient scaling ---- */

enum { NG = 1000 };

static void grads(float g[NG]) {
    for (int i = 0; i < NG; i++) g[i] = 100.0f * val(3, i);
}

/* unscale finite (found 0, g*inv), unscale with inf at 500 and with NaN at
 * 999 (found 1), sumsq, scale: the flags in found[3], sumsq in *sq, the
 * unscaled and the scaled f32 values in u and sc. */
static int scaling(const dev *d, int found[3], double *sq, float u[NG], float sc[NG]) {
    float g[NG], inv = 1.0f / 1024.0f, f = 0.3f;
    grads(g);
    void *h = put(d, g, OFF, sizeof g);
    if (!h) return 1;
    fr_tensor t = at(d, h, OFF, FR_F32, fr_shape2(40, NG / 40));
    int st = d->be->grad_unscale(d->ctx, &t, inv, &found[0]);
    get(d, h, OFF, u, sizeof g);
    if (!st) st = d->be->grad_sumsq(d->ctx, &t, sq);
    if (!st) st = d->be->grad_scale(d->ctx, &t, f);
    get(d, h, OFF, sc, sizeof g);
    float bad[2] = {INFINITY, NAN};
    int where[2] = {500, 999};
    for (int k = 0; k < 2 && !st; k++) {
        float gg[NG];
        grads(gg);
        gg[where[k]] = bad[k];
        st = d->be->write(d->ctx, h, OFF, gg, sizeof gg);
        if (!st) st = d->be->grad_unscale(d->ctx, &t, inv, &found[1 + k]);
    }
    CHECK(st == FR_OK, "%s: scaling: %s", d->be->name, fr_last_error(d->ctx));
    d->be->release(d->ctx, h);
    return st;
}

static void test_scaling_cpu(fr_ctx *ctx) {
    const dev d = {ctx, &fr_cpu_backend, &ctx->mem, 1};
    int found[3] = {-1, -1, -1};
    double sq = -1;
    float u[NG], sc[NG], g[NG];
    if (scaling(&d, found, &sq, u, sc)) return;
    grads(g);
    CHECK(found[0] == 0 && found[1] == 1 && found[2] == 1,
          "cpu: found_inf %d (finite), %d (inf), %d (NaN)", found[0], found[1], found[2]);
    double want = 0;
    int bad_u = -1, bad_s = -1;
    for (int i = 0; i < NG; i++) {
        float ui = (float)((double)g[i] / 1024.0); /* exact: a power of two */
        float si = (float)((double)ui * (double)0.3f);
        want += (double)ui * ui;
        if (u[i] != ui && bad_u < 0) bad_u = i;
        if (sc[i] != si && bad_s < 0) bad_s = i;
    }
    CHECK(bad_u < 0, "cpu: unscaled [%d] %.9g, g/1024 %.9g", bad_u, bad_u < 0 ? 0 : u[bad_u],
          bad_u < 0 ? 0 : g[bad_u] / 1024.0);
    CHECK(bad_s < 0, "cpu: scaled [%d] %.9g, want %.9g", bad_s, bad_s < 0 ? 0 : sc[bad_s],
          bad_s < 0 ? 0 : (double)u[bad_s] * 0.3f);
    CHECK(fabs(sq - want) <= 1e-12 * want, "cpu: sumsq %.17g, float64 %.17g", sq, want);

    /* a bf16 gradient: each product rounded to bf16 once */
    uint16_t h[NG];
    for (int i = 0; i < NG; i++) h[i] = ref_bf16(g[i]);
    fr_tensor t = {.dtype = FR_BF16, .shape = fr_shape1(NG), .data = h};
    CHECK(fr_cpu_backend.grad_scale(ctx, &t, 0.3f) == FR_OK, "bf16 scale");
    int bad = -1;
    for (int i = 0; i < NG && bad < 0; i++)
        if (h[i] != ref_bf16((float)((double)ref_bf16_value(ref_bf16(g[i])) * (double)0.3f)))
            bad = i;
    CHECK(bad < 0, "cpu: bf16 scaled [%d] differs from the product rounded once", bad);
}

/* ---- accuracy ---- */

/* 6 rows of 4 logits: ties go to the first maximum */
static const float logits[6][4] = {
    {1, 3, 3, 0},     /* max 3 first at 1 */
    {1, 3, 3, 0},     /* the same row, label 2: a miss (not the first max) */
    {2, 2, 2, 2},     /* all equal: index 0 */
    {-5, -1, -2, -1}, /* -1 first at 1 */
    {0, 0, 0, 9},     /* 3 */
    {4, 1, 4, 1},     /* 0; label 2 is the tie's second */
};
static const int32_t labels[6] = {1, 2, 0, 1, 2, 2};
enum { WANT_HITS = 3 }; /* rows 0, 2, 3 */

static int64_t hits_on(const dev *d) {
    void *z = put(d, logits, OFF, sizeof logits), *y = put(d, labels, OFF, sizeof labels);
    int64_t h = -1;
    if (z && y) {
        fr_tensor zt = at(d, z, OFF, FR_F32, fr_shape2(6, 4));
        fr_tensor yt = at(d, y, OFF, FR_I32, fr_shape1(6));
        CHECK(d->be->hits(d->ctx, &zt, &yt, &h) == FR_OK, "%s: hits: %s", d->be->name,
              fr_last_error(d->ctx));
    }
    d->be->release(d->ctx, z), d->be->release(d->ctx, y);
    return h;
}

/* ---- uploads ---- */

/* A mark on the step's queue, an upload of 64 bytes at 128 after it, the
 * host waiting for it, the step's queue ordered after it: *out the bytes
 * read back; *times whether the done event's interval is profiled. */
static void test_upload(const dev *d, uint8_t out[64], double times[2]) {
    uint8_t src[64];
    for (int i = 0; i < 64; i++) src[i] = (uint8_t)(255 - 3 * i);
    void *h = put(d, NULL, 0, 256), *q = NULL, *mark = NULL, *done = NULL;
    char err[256] = "";
    if (!h) return;
    CHECK(d->be->upload_open(d->ctx, &q) == FR_OK, "%s: upload_open: %s", d->be->name,
          fr_last_error(d->ctx));
    CHECK(d->be->event_mark(d->ctx, &mark) == FR_OK, "%s: mark", d->be->name);
    CHECK(d->be->upload(q, h, 128, src, 64, mark, &done, err, sizeof err) == FR_OK,
          "%s: upload: %s", d->be->name, err);
    CHECK(d->be->event_wait(d->ctx, done) == FR_OK, "%s: event_wait: %s", d->be->name,
          fr_last_error(d->ctx));
    CHECK(d->be->event_order(d->ctx, done) == FR_OK, "%s: event_order: %s", d->be->name,
          fr_last_error(d->ctx));
    d->be->event_times(done, &times[0], &times[1]);
    CHECK(d->be->upload_finish(d->ctx, q) == FR_OK, "%s: upload_finish", d->be->name);
    get(d, h, 128, out, 64);
    CHECK(!memcmp(out, src, 64), "%s: the upload's bytes differ", d->be->name);
    d->be->event_release(mark), d->be->event_release(done);
    d->be->upload_close(d->ctx, q);
    d->be->release(d->ctx, h);
}

#if FR_HAVE_OPENCL
/* The same calls on the device, against the CPU's results. */
static void test_opencl(fr_ctx *cctx) {
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return;
    const dev d = {ctx, fr_backend_of(ctx), ctx->dmem, fr_cl_info_of(fr_cl_of(ctx))->fp64};
    const dev c = {cctx, &fr_cpu_backend, &cctx->mem, 1};
    printf("opencl: %s, the optimizer %s\n", ctx->dev_name,
           d.exact ? "bit-identical expected (fp64)" : "within 1e-5 relative (no fp64)");
    test_members(d.be);
    CHECK(d.be->host_memory == 0 && fr_backend_is_device(d.be), "opencl: host_memory %d",
          d.be->host_memory);
    test_memory(&d);
    uint8_t a[NB], b[NB];
    test_copies(&c, a);
    test_copies(&d, b);
    CHECK(!memcmp(a, b, NB), "opencl: the copies' bytes are not the CPU's");

    int n;
    const optim_case *cs = cases(&n);
    for (int k = 0; k < n; k++) {
        optim_out x, y;
        if (run_optim(&c, &cs[k], &x) || run_optim(&d, &cs[k], &y)) continue;
        int bad = -1;
        for (int i = 0; i < NP && bad < 0; i++) {
            float u = x.p[i], v = y.p[i];
            if (d.exact ? memcmp(&u, &v, 4) != 0 : fabsf(u - v) > 1e-5f * fabsf(u) + 1e-7f) bad = i;
        }
        CHECK(bad < 0, "opencl: %s: p[%d] %.9g, the CPU's %.9g", cs[k].name, bad,
              bad < 0 ? 0 : y.p[bad], bad < 0 ? 0 : x.p[bad]);
        if (d.exact)
            CHECK(!memcmp(x.s, y.s, sizeof x.s) && !memcmp(x.sb, y.sb, sizeof x.sb),
                  "opencl: %s: the state is not the CPU's bits", cs[k].name);
    }

    int fc[3], fd[3];
    double sc_ = 0, sd = 0;
    float uc[NG], ud[NG], scc[NG], scd[NG];
    if (!scaling(&c, fc, &sc_, uc, scc) && !scaling(&d, fd, &sd, ud, scd)) {
        CHECK(!memcmp(fc, fd, sizeof fc), "opencl: found_inf %d %d %d, the CPU's %d %d %d", fd[0],
              fd[1], fd[2], fc[0], fc[1], fc[2]);
        CHECK(!memcmp(uc, ud, sizeof uc) && !memcmp(scc, scd, sizeof scc),
              "opencl: unscaled or scaled values are not the CPU's");
        CHECK(d.exact ? sc_ == sd : fabs(sc_ - sd) <= 1e-6 * sc_,
              "opencl: sumsq %.17g, the CPU's %.17g", sd, sc_);
    }
    int64_t hc = hits_on(&c), hd = hits_on(&d);
    CHECK(hd == hc && hd == WANT_HITS, "opencl: hits %lld, the CPU's %lld, by hand %d",
          (long long)hd, (long long)hc, WANT_HITS);

    uint8_t uc8[64], ud8[64];
    double tc[2] = {-1, -1}, td[2] = {-1, -1};
    test_upload(&c, uc8, tc);
    test_upload(&d, ud8, td);
    CHECK(!memcmp(uc8, ud8, 64), "opencl: uploaded bytes are not the CPU's");
    CHECK(td[0] > 0 && td[1] >= td[0], "opencl: the upload's profiled interval %.3f..%.3f us",
          td[0], td[1]);
    fr_mem_stats ms;
    fr_mem_stats_of(ctx->dmem, &ms);
    CHECK(ms.allocated_total == 0, "opencl: %zu bytes still allocated on the device",
          ms.allocated_total);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx);
}
#endif

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    CHECK(ctx != NULL, "context");
    if (!ctx) return check_done();
    const dev d = {ctx, &fr_cpu_backend, &ctx->mem, 1};
    test_members(&fr_cpu_backend);
    test_cpu_sizes(ctx);
    test_memory(&d);
    uint8_t bytes[NB];
    test_copies(&d, bytes);
    test_optim_cpu(ctx);
    test_scaling_cpu(ctx);
    int64_t h = hits_on(&d);
    CHECK(h == WANT_HITS, "cpu: hits %lld, by hand %d", (long long)h, WANT_HITS);
    uint8_t up[64];
    double times[2] = {-1, -1};
    test_upload(&d, up, times);
    CHECK(times[0] == 0 && times[1] == 0, "cpu: event times %g %g", times[0], times[1]);
#if FR_HAVE_OPENCL
    test_opencl(ctx);
#endif
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated_total == 0, "cpu: %zu bytes still allocated", ms.allocated_total);
    fr_ctx_free(ctx);
    return check_done();
}
