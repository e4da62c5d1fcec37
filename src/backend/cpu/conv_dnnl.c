/* conv_dnnl.c — CONV2D and CONV2D_BWD on oneDNN's convolution primitives
 * (see conv_dnnl.h): the plans (primitives, reorders, workspace layout) per
 * geometry and thread count, their cache, and the kernels that run them. The
 * ops, their checks and the GEMM fallback are conv.c's. */
#include "backend/cpu/conv_dnnl.h"

#include <stdlib.h>
#include <string.h>

int fr_conv_flags(const fr_node *n, fr_dtype ydt) {
    const fr_attr *a = &n->attr;
    if (n->op == FR_OP_CONV2D)
        return (fr_blk_in(a, 0) ? FR_CONV_BLK_X : 0) | (fr_blk_out(a, 0) ? FR_CONV_BLK_Y : 0) |
               (ydt == FR_BF16 ? FR_CONV_Y16 : 0);
    return (fr_blk_in(a, 1) ? FR_CONV_BLK_X : 0) | (fr_blk_in(a, 0) ? FR_CONV_BLK_Y : 0) |
           (fr_blk_out(a, 0) ? FR_CONV_BLK_DX : 0);
}

#ifdef FR_HAVE_ONEDNN
#include <omp.h>
#include <pthread.h>
#include "backend/cpu/gemm16.h"
#include "backend/cpu/reduce.h"

/* The budget fr_conv_dnnl_impl's report plans with (32 MiB of copies). */
#define DNNL_REPORT_BUDGET ((int64_t)8 << 20)
/* Plans kept for the process; past this many a plan is made for its call only. */
#define DNNL_CACHE_MAX 512
#define DNNL_ALIGN 64

/* ---- the path, decided once ---------------------------------------------- */

enum { PATH_GEMM, PATH_BF16, PATH_ALL };
static int g_path, g_allowed;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* By default bf16 images only. On a quiet 2-core AMD EPYC oneDNN's
 * convolutions are faster than the GEMM path (bench/out/conv_dnnl.txt: CNN
 * 0.90x, ResNet 0.82x of its step in f32, CNN 0.70x in bf16-mixed, where
 * the GEMM path emulates bf16 on f32 GEMMs: item 4 of issue 23 asks for
 * native bf16 there) but the process's peak RSS grows by about 11 MiB (CNN
 * 71.6 -> 82.5 MiB, ResNet 119.3 -> 130.7 MiB in f32: oneDNN's JIT-compiled
 * kernels and its caches, bench/out/compare-issue23b.md), memory the
 * planner cannot see or budget. f32 NCHW images keep the GEMMs, so the
 * default step's memory stays all accounted; bf16-mixed, asked for speed,
 * takes the native kernels, and so do operands the layout pass stored in
 * nChw16c (plan/layout.h): with no reordered copies oneDNN's kernels beat
 * the GEMMs there and the planned peak is no higher (README, "layout").
 * FRUGAL_CONV=dnnl sends every image, =gemm none (and then
 * nothing is blocked). */
static void decide(void) {
    const char *env = getenv("FRUGAL_CONV");
    g_allowed = fr_dnnl_engine() != NULL && !(env && strcmp(env, "gemm") == 0);
    if (!g_allowed) g_path = PATH_GEMM;
    else if (env && strcmp(env, "dnnl") == 0) g_path = PATH_ALL;
    else g_path = fr_gemm16_native(FR_BF16) ? PATH_BF16 : PATH_GEMM;
}

int fr_conv_dnnl_on(void) {
    pthread_once(&g_once, decide);
    return g_path == PATH_ALL;
}

int fr_conv_dnnl_for(fr_dtype xdt) {
    pthread_once(&g_once, decide);
    return g_path == PATH_ALL || (g_path == PATH_BF16 && xdt == FR_BF16);
}

int fr_conv_dnnl_built(void) { return fr_dnnl_engine() != NULL; }

int fr_conv_dnnl_allowed(void) {
    pthread_once(&g_once, decide);
    return g_allowed;
}

/* ---- one primitive and the reorders around it ---------------------------- */

/* A primitive with its user-managed scratchpad's descriptor. */
typedef struct op {
    dnnl_primitive_t p;
    dnnl_memory_desc_t sp;
    size_t sp_bytes;
} op;

static int op_make(op *o, dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    o->sp_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sp) o->sp = *sp;
    int bad = dnnl_primitive_create(&o->p, pd) != dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (bad) o->p = NULL;
    return bad ? -1 : 0;
}

static void op_free(op *o) {
    if (o->p) dnnl_primitive_destroy(o->p);
    o->p = NULL;
}

static dnnl_primitive_attr_t user_scratch_attr(float sum) {
    dnnl_primitive_attr_t at;
    if (dnnl_primitive_attr_create(&at)) return NULL;
    int bad = dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != 0;
    if (!bad && sum != 0.0f) { /* dst = src + sum * dst */
        dnnl_post_ops_t po;
        bad = dnnl_post_ops_create(&po) != 0;
        if (!bad) {
            bad = dnnl_post_ops_append_sum(po, sum) || dnnl_primitive_attr_set_post_ops(at, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (bad) {
        dnnl_primitive_attr_destroy(at);
        return NULL;
    }
    return at;
}

/* A reorder of at most this many bytes (a layer's weights) runs on one
 * thread: oneDNN fixes a primitive's thread count when it makes it, and
 * waking a sleeping team (OMP_WAIT_POLICY=passive) for every call costs
 * many times the copy of a 3x3 kernel's weights on one thread. */
#define DNNL_REORDER_ONE_THREAD ((size_t)256 << 10)

static int reorder_make(op *o, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                        float sum) {
    dnnl_primitive_attr_t at = user_scratch_attr(sum);
    if (!at) return -1;
    dnnl_primitive_desc_t pd;
    dnnl_engine_t e = fr_dnnl_engine();
    const size_t fb = dnnl_memory_desc_get_size(from), tb = dnnl_memory_desc_get_size(to);
    const size_t bytes = fb > tb ? fb : tb;
    const int prev = omp_get_max_threads(), one = bytes <= DNNL_REORDER_ONE_THREAD && prev > 1;
    if (one) omp_set_num_threads(1);
    int bad = dnnl_reorder_primitive_desc_create(&pd, from, e, to, e, at) != dnnl_success;
    dnnl_primitive_attr_destroy(at);
    bad = bad ? -1 : op_make(o, pd);
    if (one) omp_set_num_threads(prev);
    return bad;
}

/* Runs o on n (argument, descriptor, data) triples and its scratchpad. */
static int op_run(const op *o, int n, const int *arg, const dnnl_memory_desc_t *const *md,
                  void *const *data, void *scratch) {
    dnnl_memory_t m[6] = {0};
    dnnl_exec_arg_t a[6];
    dnnl_engine_t e = fr_dnnl_engine();
    int bad = 0, k = 0;
    for (; k < n && !bad; k++) {
        bad = dnnl_memory_create(&m[k], md[k], e, data[k]) != dnnl_success;
        a[k] = (dnnl_exec_arg_t){arg[k], m[k]};
    }
    if (!bad && o->sp_bytes) {
        bad = dnnl_memory_create(&m[k], &o->sp, e, scratch) != dnnl_success;
        a[k] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[k]};
        k++;
    }
    if (!bad) bad = dnnl_primitive_execute(o->p, fr_dnnl_stream(), k, a) != dnnl_success;
    for (int i = 0; i < k; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    return bad ? -1 : 0;
}

static int reorder_run(const op *o, const dnnl_memory_desc_t *from, const void *src,
                       const dnnl_memory_desc_t *to, void *dst, void *scratch) {
    const int arg[2] = {DNNL_ARG_FROM, DNNL_ARG_TO};
    const dnnl_memory_desc_t *md[2] = {from, to};
    void *data[2] = {(void *)src, dst};
    return op_run(o, 2, arg, md, data, scratch);
}

/* The three tensors of a primitive: the image side (x, dx), the weight side
 * (W, dW) and the output side (y, dy). */
enum { T_X, T_W, T_Y, T_COUNT };
enum { K_FWD, K_BWD_W, K_BWD_D };

/* One convolution primitive for a chunk of nb images: md[] its formats,
 * user[] the user's (NCHW/OIHW), in[t] the reorder user -> md of an input
 * (p NULL: the same format, read in place), out / out_acc the reorders of
 * its output md -> user, overwriting and adding. */
typedef struct prim {
    op conv, in[T_COUNT], out, out_acc;
    dnnl_memory_desc_t md[T_COUNT], user[T_COUNT], bias;
    int kind, out_t, direct_out;
    size_t scratch; /* the most any of its ops needs */
} prim;

static void prim_free(prim *p) {
    op_free(&p->conv), op_free(&p->out), op_free(&p->out_acc);
    for (int t = 0; t < T_COUNT; t++) op_free(&p->in[t]);
}

static const dnnl_query_t md_query[3][T_COUNT] = {
    [K_FWD] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
    [K_BWD_W] = {dnnl_query_src_md, dnnl_query_diff_weights_md, dnnl_query_diff_dst_md},
    [K_BWD_D] = {dnnl_query_diff_src_md, dnnl_query_weights_md, dnnl_query_diff_dst_md},
};
static const int out_of[3] = {[K_FWD] = T_Y, [K_BWD_W] = T_W, [K_BWD_D] = T_X};

/* A primitive of kind for nb images, its image of dtype xdt; "ref" kernels
 * (oneDNN's plain C loops) are refused: the GEMM path is faster. native:
 * the operands in bf16 (the image's, W and dy rounded to nearest even by
 * the reorders), the results (y, dx, dW) in f32 with f32 sums; otherwise
 * all f32 (a 16-bit image widened by its reorder). */
static int prim_make(prim *p, int kind, const fr_conv_dims *g, int64_t nb, int bias,
                     dnnl_data_type_t xdt, int native, int blk, int probe) {
    memset(p, 0, sizeof *p);
    p->kind = kind, p->out_t = out_of[kind];
    dnnl_dims_t xd = {nb, g->C, g->H, g->W}, wd = {g->OC, g->C, g->K, g->K},
                yd = {nb, g->OC, g->OH, g->OW}, bd = {g->OC};
    dnnl_dims_t st = {g->S, g->S}, pad = {g->P, g->P};
    /* each tensor's type: an operand's is c, a result's f32 (a bf16 y
     * where the user's is, FR_CONV_Y16: rounded from the f32 sums as it is
     * stored, so the forward's own desc takes fy, and no f32 y is made for
     * a reorder to round); the forward desc of a backward primitive (its
     * hint) has c throughout */
    const dnnl_data_type_t c = native ? dnnl_bf16 : dnnl_f32, f = dnnl_f32;
    const dnnl_data_type_t fy = blk & FR_CONV_Y16 ? c : f;
    const dnnl_data_type_t ty[3][T_COUNT] = {
        [K_FWD] = {c, c, fy}, [K_BWD_W] = {c, f, c}, [K_BWD_D] = {f, c, c}};
    dnnl_memory_desc_t x, w, y, hx, hw, hy;
    if (dnnl_memory_desc_init_by_tag(&x, 4, xd, ty[kind][T_X], dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, ty[kind][T_W], dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&y, 4, yd, ty[kind][T_Y], dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&hx, 4, xd, c, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&hw, 4, wd, c, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&hy, 4, yd, kind == K_FWD ? fy : c, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(
            &p->user[T_X], 4, xd, kind == K_BWD_D ? dnnl_f32 : xdt,
            blk & (kind == K_BWD_D ? FR_CONV_BLK_DX : FR_CONV_BLK_X) ? dnnl_nChw16c : dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&p->user[T_W], 4, wd, dnnl_f32, dnnl_oihw) ||
        dnnl_memory_desc_init_by_tag(&p->user[T_Y], 4, yd,
                                     kind == K_FWD && (blk & FR_CONV_Y16) ? dnnl_bf16 : dnnl_f32,
                                     blk & FR_CONV_BLK_Y ? dnnl_nChw16c : dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&p->bias, 1, bd, dnnl_f32, dnnl_a))
        return -1;
    dnnl_engine_t e = fr_dnnl_engine();
    dnnl_primitive_attr_t at = user_scratch_attr(0.0f);
    if (!at) return -1;
    dnnl_convolution_desc_t fd, cd;
    dnnl_primitive_desc_t hint = NULL, pd = NULL;
    int bad = dnnl_convolution_forward_desc_init(
                  &fd, dnnl_forward_training, dnnl_convolution_direct, &hx, &hw,
                  kind == K_FWD && bias ? &p->bias : NULL, &hy, st, pad, pad) != dnnl_success;
    if (!bad && kind == K_FWD) bad = dnnl_primitive_desc_create(&pd, &fd, at, e, NULL) != 0;
    else if (!bad) {
        bad = dnnl_primitive_desc_create(&hint, &fd, NULL, e, NULL) != 0;
        if (!bad && kind == K_BWD_W)
            bad = dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &x, &w,
                                                              NULL, &y, st, pad, pad) != 0;
        if (!bad && kind == K_BWD_D)
            bad = dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &x, &w, &y,
                                                           st, pad, pad) != 0;
        if (!bad) bad = dnnl_primitive_desc_create(&pd, &cd, at, e, hint) != 0;
        if (hint) dnnl_primitive_desc_destroy(hint);
    }
    dnnl_primitive_attr_destroy(at);
    if (bad) return -1;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success ||
        !impl || strncmp(impl, "ref", 3) == 0 || probe) {
        dnnl_primitive_desc_destroy(pd);
        return probe && impl && strncmp(impl, "ref", 3) != 0 ? 0 : -1;
    }
    for (int t = 0; t < T_COUNT; t++)
        p->md[t] = *dnnl_primitive_desc_query_md(pd, md_query[kind][t], 0);
    if (op_make(&p->conv, pd)) return -1;
    size_t most = p->conv.sp_bytes;
    for (int t = 0; t < T_COUNT; t++) {
        op *o = t == p->out_t ? &p->out : &p->in[t];
        if (dnnl_memory_desc_equal(&p->md[t], &p->user[t]) && t != p->out_t) continue;
        if (t == p->out_t) {
            p->direct_out = dnnl_memory_desc_equal(&p->md[t], &p->user[t]);
            if (reorder_make(o, &p->md[t], &p->user[t], 0.0f) ||
                reorder_make(&p->out_acc, &p->md[t], &p->user[t], 1.0f))
                goto fail;
            if (p->out_acc.sp_bytes > most) most = p->out_acc.sp_bytes;
        } else if (reorder_make(o, &p->user[t], &p->md[t], 0.0f)) {
            goto fail;
        }
        if (o->sp_bytes > most) most = o->sp_bytes;
    }
    p->scratch = most;
    return 0;
fail:
    prim_free(p);
    return -1;
}

/* ---- plans: the primitives of a geometry and the workspace's layout ------ */

typedef struct plan_key {
    int64_t N, C, H, W, OC, K, S, P, budget;
    int backward, bias, xdt, threads, blk;
} plan_key;

/* The batch in chunks of nb images, the last of N - (chunks - 1) nb; a[]
 * the forward or backward-weights primitives and b[] the backward-data ones
 * for a full chunk [0] and the last [1]. The workspace, in bytes from its
 * start: the scratchpad, then the buffers of x (or dx), y (or dy), W and dW
 * in the primitives' formats. */
typedef struct conv_plan {
    plan_key key;
    int64_t nb, chunks;
    prim a[2], b[2];
    int nprim;  /* 1: the last chunk is full (a[1], b[1] unused) */
    int native; /* bf16 primitives (prim_make) */
    size_t x_off, y_off, w_off, dw_off, bytes;
    char impl[64];
} conv_plan;

static size_t align_up(size_t n) { return (n + DNNL_ALIGN - 1) / DNNL_ALIGN * DNNL_ALIGN; }
static int64_t up16(int64_t c) { return (c + 15) / 16 * 16; }

static void plan_free(conv_plan *pl) {
    for (int i = 0; i < 2; i++) prim_free(&pl->a[i]), prim_free(&pl->b[i]);
    free(pl);
}

static size_t md_bytes(const dnnl_memory_desc_t *md) { return dnnl_memory_desc_get_size(md); }

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* pl's primitives for chunks of pl->nb images and a last of `last`; 1 if
 * all were made (pl->native says whether they are bf16's), else 0 with
 * none kept. */
static int prims_make(conv_plan *pl, const plan_key *k, const fr_conv_dims *g, int64_t last,
                      int native) {
    dnnl_data_type_t xdt = k->xdt == FR_BF16 ? dnnl_bf16 : k->xdt == FR_F16 ? dnnl_f16 : dnnl_f32;
    int n = last == pl->nb ? 1 : 2, ok = 1;
    pl->native = native;
    for (int i = 0; i < n && ok; i++) {
        int64_t nb = i ? last : pl->nb;
        ok = prim_make(&pl->a[i], k->backward ? K_BWD_W : K_FWD, g, nb, k->bias, xdt, native,
                       k->blk, 0) == 0;
        if (ok && k->backward) {
            ok = prim_make(&pl->b[i], K_BWD_D, g, nb, 0, xdt, native, k->blk, 0) == 0;
            if (!ok) prim_free(&pl->a[i]);
        }
        if (!ok)
            for (int j = 0; j < i; j++) prim_free(&pl->a[j]), prim_free(&pl->b[j]);
    }
    return ok;
}

/* Made on the key's thread count: oneDNN sizes its scratchpad and splits its
 * work for the OpenMP thread count at creation. */
static conv_plan *plan_make(const plan_key *k, const fr_conv_dims *g) {
    conv_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    pl->key = *k;
    int64_t per = up16(g->C) * g->H * g->W + up16(g->OC) * g->OH * g->OW;
    int64_t most = k->budget / per;
    if (most < 1) most = 1;
    pl->chunks = (g->N + most - 1) / most;
    pl->nb = (g->N + pl->chunks - 1) / pl->chunks;
    int64_t last = g->N - (pl->chunks - 1) * pl->nb;
    pl->nprim = last == pl->nb ? 1 : 2;
    /* a bf16 image: bf16 primitives where oneDNN has bf16 kernels for all
     * of them, else f32 ones on the widened image */
    if (!prims_make(pl, k, g, last, k->xdt == FR_BF16 && fr_gemm16_native(FR_BF16)) &&
        !(pl->native && prims_make(pl, k, g, last, 0))) {
        plan_free(pl);
        return NULL;
    }
    size_t scratch = 0, xb = 0, yb = 0, wb = 0, dwb = 0;
    for (int i = 0; i < pl->nprim; i++) {
        /* a copy in the primitive's format only where the user's differs;
         * dx's also where it is added into the user's, which a blocked dx
         * (a step value, never a parameter's gradient) is not */
        const prim *a = &pl->a[i], *b = &pl->b[i];
        scratch = max_sz(scratch, a->scratch);
        if (a->in[T_X].p) xb = max_sz(xb, md_bytes(&a->md[T_X]));
        if (a->in[T_Y].p || (!k->backward && !a->direct_out))
            yb = max_sz(yb, md_bytes(&a->md[T_Y]));
        if (k->backward) {
            scratch = max_sz(scratch, b->scratch);
            if (!(b->direct_out && (k->blk & FR_CONV_BLK_DX)))
                xb = max_sz(xb, md_bytes(&b->md[T_X]));
            if (b->in[T_Y].p) yb = max_sz(yb, md_bytes(&b->md[T_Y]));
            dwb = max_sz(dwb, md_bytes(&a->md[T_W]));
            wb = max_sz(wb, md_bytes(&b->md[T_W]));
        } else {
            wb = max_sz(wb, md_bytes(&a->md[T_W]));
        }
    }
    pl->x_off = align_up(scratch);
    pl->y_off = pl->x_off + align_up(xb);
    pl->w_off = pl->y_off + align_up(yb);
    pl->dw_off = pl->w_off + align_up(wb);
    pl->bytes = pl->dw_off + align_up(dwb);
    const_dnnl_primitive_desc_t cpd;
    const char *impl = NULL;
    if (dnnl_primitive_get_primitive_desc(pl->a[0].conv.p, &cpd) == dnnl_success &&
        dnnl_primitive_desc_query(cpd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        snprintf(pl->impl, sizeof pl->impl, "%s", impl);
    return pl;
}

/* Plans are never freed while the process runs, so a plan found is used
 * without the lock; a geometry oneDNN cannot do is kept as a NULL plan. */
static struct {
    pthread_mutex_t lock;
    int n;
    plan_key key[DNNL_CACHE_MAX];
    conv_plan *plan[DNNL_CACHE_MAX];
} g_cache = {PTHREAD_MUTEX_INITIALIZER, 0, {{0}}, {0}};

/* The plan for g on `threads` threads; *own: the caller frees it (cache full). */
static conv_plan *plan_get(const fr_conv_dims *g, int64_t budget, int backward, int bias,
                           fr_dtype xdt, int threads, int blk, int *own) {
    plan_key k;
    memset(&k, 0, sizeof k);
    k.N = g->N, k.C = g->C, k.H = g->H, k.W = g->W, k.OC = g->OC, k.K = g->K, k.S = g->S;
    k.P = g->P, k.budget = budget, k.backward = backward, k.bias = bias, k.xdt = xdt,
    k.threads = threads, k.blk = blk;
    *own = 0;
    pthread_mutex_lock(&g_cache.lock);
    for (int i = 0; i < g_cache.n; i++)
        if (memcmp(&g_cache.key[i], &k, sizeof k) == 0) {
            conv_plan *pl = g_cache.plan[i];
            pthread_mutex_unlock(&g_cache.lock);
            return pl;
        }
    int prev = omp_get_max_threads();
    if (prev != threads) omp_set_num_threads(threads);
    conv_plan *pl = plan_make(&k, g);
    if (prev != threads) omp_set_num_threads(prev);
    if (g_cache.n < DNNL_CACHE_MAX) {
        g_cache.key[g_cache.n] = k;
        g_cache.plan[g_cache.n++] = pl;
    } else {
        *own = pl != NULL;
    }
    pthread_mutex_unlock(&g_cache.lock);
    return pl;
}

static int64_t floats_of(size_t bytes) {
    return (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
}

int64_t fr_conv_dnnl_ws(const fr_conv_dims *g, int64_t budget, int backward, int bias, fr_dtype xdt,
                        int threads, int blk) {
    if (!(blk ? fr_conv_dnnl_allowed() : fr_conv_dnnl_for(xdt)) || g->N < 1 || g->OC < 1 ||
        g->C < 1)
        return 0;
    int own;
    conv_plan *pl = plan_get(g, budget, backward, bias, xdt, threads > 0 ? threads : 1, blk, &own);
    int64_t n = pl ? floats_of(pl->bytes) : 0;
    if (own) plan_free(pl);
    return n;
}

int fr_conv_dnnl_can(const fr_conv_dims *g, fr_dtype xdt) {
    if (!fr_conv_dnnl_allowed() || g->N < 1 || g->OC < 1 || g->C < 1) return 0;
    const dnnl_data_type_t dt = xdt == FR_BF16 ? dnnl_bf16 : xdt == FR_F16 ? dnnl_f16 : dnnl_f32;
    const int tries = xdt == FR_BF16 && fr_gemm16_native(FR_BF16) ? 2 : 1;
    for (int t = 0; t < tries; t++) { /* native bf16 kernels, else f32 ones (plan_make) */
        const int native = tries == 2 && t == 0;
        prim p;
        if (prim_make(&p, K_FWD, g, g->N, 0, dt, native, 0, 1) == 0 &&
            prim_make(&p, K_BWD_W, g, g->N, 0, dt, native, 0, 1) == 0 &&
            prim_make(&p, K_BWD_D, g, g->N, 0, dt, native, 0, 1) == 0)
            return 1;
    }
    return 0;
}

const char *fr_conv_dnnl_impl(const fr_conv_dims *g, fr_dtype xdt) {
    if (!fr_conv_dnnl_for(xdt)) return "";
    int own;
    conv_plan *pl = plan_get(g, DNNL_REPORT_BUDGET, 0, 0, xdt, omp_get_max_threads(), 0, &own);
    if (!pl) return "";
    if (own) { /* a full cache: a static copy (a report's, not a kernel's) */
        static char name[64];
        snprintf(name, sizeof name, "%s", pl->impl);
        plan_free(pl);
        return name;
    }
    return pl->impl;
}

/* ---- the kernels ---------------------------------------------------------- */

/* The plan on the most threads, up to the caller's, whose workspace fits
 * the planned one: fewer only when the thread count was raised after the
 * step was planned. */
typedef struct run {
    conv_plan *pl;
    int own, threads, prev;
    char *ws;
} run;

static int run_begin(run *r, const fr_conv_dims *g, int64_t budget, int backward, int bias,
                     fr_dtype xdt, int blk, const fr_tensor *ws) {
    size_t have = ws->data ? (size_t)fr_shape_numel(&ws->shape) * sizeof(float) : 0;
    r->prev = omp_get_max_threads();
    for (int t = r->prev; t >= 1; t--) {
        r->pl = plan_get(g, budget, backward, bias, xdt, t, blk, &r->own);
        if (!r->pl) return FR_CONV_DNNL_DECLINE;
        if (r->pl->bytes <= have) {
            r->threads = t, r->ws = ws->data;
            if (t != r->prev) omp_set_num_threads(t);
            return FR_OK;
        }
        if (r->own) plan_free(r->pl);
    }
    return FR_CONV_DNNL_DECLINE;
}

static int run_end(run *r, fr_kernel_call *c, const char *op, int bad) {
    if (!bad) bad = dnnl_stream_wait(fr_dnnl_stream()) != dnnl_success;
    if (r->threads != r->prev) omp_set_num_threads(r->prev);
    if (r->own) plan_free(r->pl);
    return bad ? fr_fail(c->ctx, FR_ERR_ARG, "%s: oneDNN's convolution failed", op) : FR_OK;
}

/* The input t of p from the user's data (in place when the formats agree). */
static const void *input(const prim *p, int t, const void *user, void *buf, void *scratch,
                         int *bad) {
    if (!p->in[t].p) return user;
    *bad |= reorder_run(&p->in[t], &p->user[t], user, &p->md[t], buf, scratch);
    return buf;
}

/* p's output, in buf, into the user's data: added when acc. */
static int output(const prim *p, const void *buf, void *user, int acc, void *scratch) {
    return reorder_run(acc ? &p->out_acc : &p->out, &p->md[p->out_t], buf, &p->user[p->out_t], user,
                       scratch);
}

int fr_conv_dnnl_fwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget) {
    const fr_tensor *x = &c->in[0];
    const void *bias = c->in[2].data;
    run r;
    int st = run_begin(&r, g, budget, 0, bias != NULL, x->dtype,
                       fr_conv_flags(c->node, c->out[0].dtype), &c->out[1]);
    if (st) return st;
    const conv_plan *pl = r.pl;
    char *ws = r.ws, *xb = ws + pl->x_off, *yb = ws + pl->y_off, *wb = ws + pl->w_off;
    const size_t xel = x->dtype == FR_F32 ? 4 : 2;
    const float *wp = fr_f32(&c->in[1]);
    char *yp = c->out[0].data;
    const size_t yel = c->out[0].dtype == FR_F32 ? 4 : 2;
    const prim *wfor = NULL; /* whose format wb holds */
    int bad = 0;
    for (int64_t q = 0; q < pl->chunks && !bad; q++) {
        int64_t n0 = q * pl->nb;
        const prim *p = &pl->a[q == pl->chunks - 1 && pl->nprim == 2];
        const void *xs = input(p, T_X, (const char *)x->data + n0 * g->chw * xel, xb, ws, &bad);
        const void *w = wp;
        if (p->in[T_W].p) {
            if (!wfor || !dnnl_memory_desc_equal(&wfor->md[T_W], &p->md[T_W]))
                bad |= reorder_run(&p->in[T_W], &p->user[T_W], wp, &p->md[T_W], wb, ws);
            wfor = p, w = wb;
        }
        char *yu = yp + n0 * g->OC * g->ohw * yel;
        void *y = p->direct_out ? (void *)yu : yb;
        const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
        const dnnl_memory_desc_t *md[4] = {&p->md[T_X], &p->md[T_W], &p->md[T_Y], &p->bias};
        void *data[4] = {(void *)xs, (void *)w, y, (void *)bias};
        if (!bad) bad = op_run(&p->conv, bias ? 4 : 3, arg, md, data, ws);
        if (!bad && !p->direct_out) bad = output(p, yb, yu, 0, ws);
    }
    return run_end(&r, c, "conv2d", bad);
}

int fr_conv_dnnl_bwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget, float *dx,
                     float *dw) {
    const fr_tensor *x = &c->in[1];
    run r;
    const int blk = fr_conv_flags(c->node, FR_F32);
    int st = run_begin(&r, g, budget, 1, 0, x->dtype, blk, &c->out[3]);
    if (st) return st;
    const conv_plan *pl = r.pl;
    char *ws = r.ws, *xb = ws + pl->x_off, *yb = ws + pl->y_off, *wb = ws + pl->w_off,
         *dwb = ws + pl->dw_off;
    const size_t xel = x->dtype == FR_F32 ? 4 : 2;
    const float *dyp = fr_f32(&c->in[0]), *wp = fr_f32(&c->in[2]);
    const int acc_w = acc_bit(c, 1), acc_x = acc_bit(c, 0);
    if (acc_x && dx && (blk & FR_CONV_BLK_DX)) {
        run_end(&r, c, "conv2d_bwd", 0);
        return fr_fail(c->ctx, FR_ERR_ARG, "conv2d_bwd: a blocked dx is never added into");
    }
    const prim *wfor = NULL;
    int bad = 0;
    for (int64_t q = 0; q < pl->chunks && !bad; q++) {
        int64_t n0 = q * pl->nb, i = q == pl->chunks - 1 && pl->nprim == 2;
        const float *dyu = dyp + n0 * g->OC * g->ohw;
        const prim *yfor = NULL; /* whose format yb holds for this chunk */
        if (dw) {                /* dW (+)= this chunk's, chunk by chunk in order */
            const prim *p = &pl->a[i];
            const void *xs = input(p, T_X, (const char *)x->data + n0 * g->chw * xel, xb, ws, &bad);
            const void *dy = input(p, T_Y, dyu, yb, ws, &bad);
            if (p->in[T_Y].p) yfor = p;
            int direct = p->direct_out && pl->chunks == 1 && !acc_w;
            const int arg[3] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_DST};
            const dnnl_memory_desc_t *md[3] = {&p->md[T_X], &p->md[T_W], &p->md[T_Y]};
            void *data[3] = {(void *)xs, direct ? (void *)dw : dwb, (void *)dy};
            if (!bad) bad = op_run(&p->conv, 3, arg, md, data, ws);
            if (!bad && !direct) bad = output(p, dwb, dw, q > 0 || acc_w, ws);
        }
        if (dx && !bad) {
            const prim *p = &pl->b[i];
            const void *dy = dyu;
            if (p->in[T_Y].p) {
                dy = yb;
                if (!yfor || !dnnl_memory_desc_equal(&yfor->md[T_Y], &p->md[T_Y]))
                    bad |= reorder_run(&p->in[T_Y], &p->user[T_Y], dyu, &p->md[T_Y], yb, ws);
            }
            const void *w = wp;
            if (p->in[T_W].p) {
                if (!wfor || !dnnl_memory_desc_equal(&wfor->md[T_W], &p->md[T_W]))
                    bad |= reorder_run(&p->in[T_W], &p->user[T_W], wp, &p->md[T_W], wb, ws);
                wfor = p, w = wb;
            }
            float *dxu = dx + n0 * g->chw;
            int direct = p->direct_out && !acc_x;
            const int arg[3] = {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_DST};
            const dnnl_memory_desc_t *md[3] = {&p->md[T_X], &p->md[T_W], &p->md[T_Y]};
            void *data[3] = {direct ? (void *)dxu : xb, (void *)w, (void *)dy};
            if (!bad) bad = op_run(&p->conv, 3, arg, md, data, ws);
            if (!bad && !direct) bad = output(p, xb, dxu, acc_x, ws);
        }
    }
    return run_end(&r, c, "conv2d_bwd", bad);
}

#else /* built without oneDNN: every convolution takes the GEMM path */

int fr_conv_dnnl_on(void) { return 0; }
int fr_conv_dnnl_for(fr_dtype xdt) {
    (void)xdt;
    return 0;
}
int fr_conv_dnnl_built(void) { return 0; }
int fr_conv_dnnl_allowed(void) { return 0; }
int fr_conv_dnnl_can(const fr_conv_dims *g, fr_dtype xdt) {
    (void)g, (void)xdt;
    return 0;
}
const char *fr_conv_dnnl_impl(const fr_conv_dims *g, fr_dtype xdt) {
    (void)g, (void)xdt;
    return "";
}
int64_t fr_conv_dnnl_ws(const fr_conv_dims *g, int64_t budget, int backward, int bias, fr_dtype xdt,
                        int threads, int blk) {
    (void)g, (void)budget, (void)backward, (void)bias, (void)xdt, (void)threads, (void)blk;
    return 0;
}
int fr_conv_dnnl_fwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget) {
    (void)c, (void)g, (void)budget;
    return FR_CONV_DNNL_DECLINE;
}
int fr_conv_dnnl_bwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget, float *dx,
                     float *dw) {
    (void)c, (void)g, (void)budget, (void)dx, (void)dw;
    return FR_CONV_DNNL_DECLINE;
}

#endif
