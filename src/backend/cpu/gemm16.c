/* gemm16.c — 16-bit GEMMs through oneDNN's matmul (see gemm16.h). */
#include "backend/cpu/gemm16.h"
#include "backend/cpu/cpuinfo.h"

#include <stdlib.h>
#include <string.h>

int64_t fr_gemm16_panel(int64_t n, int64_t len, int64_t *last) {
    if (n < 1) {
        if (last) *last = 0;
        return 1;
    }
    int64_t most = len > 0 ? FR_GEMM16_PANEL / len : n;
    if (most < 16) most = 16;
    const int64_t np = (n + most - 1) / most, each = (n + np - 1) / np;
    if (last) *last = n - (n - 1) / each * each;
    return each;
}

size_t fr_gemm16_round(size_t bytes) { return (bytes + 63) / 64 * 64; }

#ifdef FR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>

/* One CPU engine and one in-order stream for the process; a primitive is
 * made for each call's shapes, which oneDNN's own primitive cache answers
 * in about 2 us after the first time. */
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static int g_native; /* bf16 runs on a kernel other than oneDNN's reference loops */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* A matmul call's shape and epilogue: what its primitive is made from, and
 * (with the thread count oneDNN splits its work for) the primitive cache's
 * key. */
typedef struct mm_key {
    int ta, tb, c16, ab32, bias, threads;
    int64_t M, N, K, lda, ldb, ldc;
    float beta;
} mm_key;

static mm_key key_of(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                     float beta, int64_t ldc, const fr_gemm16_out *e) {
    mm_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp: no stray padding bytes */
    k.ta = ta, k.tb = tb, k.c16 = e && e->c16, k.ab32 = e && e->ab32, k.bias = e && e->bias;
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc, k.beta = beta;
    return k;
}

static int make_pd(const mm_key *k, dnnl_primitive_desc_t *pd);

static void init_once(void) {
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) {
        g_engine = NULL;
        return;
    }
    if (dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(g_engine);
        g_engine = NULL;
        return;
    }
    const char *env = getenv("FRUGAL_GEMM16");
    if (env && strcmp(env, "0") == 0) return;
    const int forced = env && strcmp(env, "1") == 0;
    dnnl_primitive_desc_t pd;
    const mm_key probe = key_of(0, 1, 64, 64, 64, 64, 64, 0.0f, 64, NULL);
    if (make_pd(&probe, &pd)) return;
    const char *impl = NULL;
    /* A jit kernel is not enough: on AVX-512 without AVX512_BF16 oneDNN
     * emulates bf16 products in its jit kernels, far slower than the f32
     * GEMM of the rounded operands (bench/out/intel_207.md). The CPU's bits
     * decide, not a timing, so that the path (and the bits it gives) is the
     * same in every run on a host. FRUGAL_GEMM16=1 takes the jit kernel
     * whatever the CPU (the tests of the bf16 path, on any AVX-512 host). */
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        g_native = strncmp(impl, "ref", 3) != 0 &&
                   (forced || (fr_cpu_features() & (FR_CPU_AVX512_BF16 | FR_CPU_AMX_BF16)) != 0);
    dnnl_primitive_desc_destroy(pd);
}

dnnl_engine_t fr_dnnl_engine(void) {
    pthread_once(&g_once, init_once);
    return g_engine;
}

dnnl_stream_t fr_dnnl_stream(void) {
    pthread_once(&g_once, init_once);
    return g_stream;
}

int fr_gemm16_native(fr_dtype dt) {
    if (dt != FR_BF16) return 0;
    pthread_once(&g_once, init_once);
    return g_engine && g_native;
}

/* 2-D memory descriptors of op(A) (M,K), op(B) (K,N), C (M,N) by strides
 * and the bias (1,N), as k says */
static int make_pd(const mm_key *k, dnnl_primitive_desc_t *pd) {
    const int64_t M = k->M, N = k->N, K = k->K;
    dnnl_memory_desc_t a, b, c, bias;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N}, biasd = {1, N};
    dnnl_dims_t as = {k->ta ? 1 : k->lda, k->ta ? k->lda : 1},
                bs = {k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1}, cs = {k->ldc, 1}, biass = {N, 1};
    dnnl_data_type_t ab = k->ab32 ? dnnl_f32 : dnnl_bf16;
    if (dnnl_memory_desc_init_by_strides(&a, 2, ad, ab, as) ||
        dnnl_memory_desc_init_by_strides(&b, 2, bd, ab, bs) ||
        dnnl_memory_desc_init_by_strides(&c, 2, cd, k->c16 ? dnnl_bf16 : dnnl_f32, cs) ||
        (k->bias && dnnl_memory_desc_init_by_strides(&bias, 2, biasd, dnnl_f32, biass)))
        return -1;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &a, &b, k->bias ? &bias : NULL, &c)) return -1;
    dnnl_primitive_attr_t at;
    if (dnnl_primitive_attr_create(&at)) return -1;
    int bad = dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != 0;
    if (!bad && k->beta != 0.0f) { /* C = A B + beta C: oneDNN's sum post-op */
        dnnl_post_ops_t po;
        bad = dnnl_post_ops_create(&po) != 0;
        if (!bad) {
            bad = dnnl_post_ops_append_sum(po, k->beta) || dnnl_primitive_attr_set_post_ops(at, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (!bad) bad = dnnl_primitive_desc_create(pd, &md, at, g_engine, NULL) != 0;
    dnnl_primitive_attr_destroy(at);
    return bad ? -1 : 0;
}

/* ---- the matmul primitives, made once per call shape ---- */

/* The primitives are kept for the process by the call's shape, epilogue
 * and thread count (oneDNN sizes its scratch and splits its work by the
 * threads it will run on), so a step's calls after the first only look one
 * up and run it. Past MM_CACHE_MAX shapes a primitive is made for its call
 * only. */
#define MM_CACHE_MAX 256

typedef struct mm_entry {
    mm_key key;
    dnnl_primitive_t p;
    dnnl_memory_desc_t a, b, c, bias, sp;
    size_t need; /* scratch bytes */
} mm_entry;

static mm_entry g_mm[MM_CACHE_MAX];
static int g_nmm;
static pthread_mutex_t g_mm_lock = PTHREAD_MUTEX_INITIALIZER;

/* The entry for key (made and kept, or made into *own when the cache is
 * full); NULL when oneDNN has no matmul for it. */
static mm_entry *mm_get(const mm_key *key, mm_entry *own) {
    pthread_mutex_lock(&g_mm_lock);
    for (int i = 0; i < g_nmm; i++)
        if (memcmp(&g_mm[i].key, key, sizeof *key) == 0) {
            pthread_mutex_unlock(&g_mm_lock);
            return &g_mm[i];
        }
    mm_entry *en = g_nmm < MM_CACHE_MAX ? &g_mm[g_nmm] : own;
    memset(en, 0, sizeof *en);
    en->key = *key;
    dnnl_primitive_desc_t pd;
    int bad = make_pd(key, &pd);
    if (!bad) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        en->need = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (sp) en->sp = *sp;
        en->a = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        en->b = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        en->c = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        if (key->bias) en->bias = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        bad = dnnl_primitive_create(&en->p, pd) != dnnl_success;
        dnnl_primitive_desc_destroy(pd);
    }
    if (!bad && en != own) g_nmm++;
    pthread_mutex_unlock(&g_mm_lock);
    return bad ? NULL : en;
}

size_t fr_gemm16_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                    float beta, int64_t ldc) {
    return fr_gemm16_epi_ws(ta, tb, M, N, K, lda, ldb, beta, ldc, NULL);
}

/* oneDNN runs this call: bf16 natively, or f32 operands on the engine */
static int runs(const fr_gemm16_out *e) {
    return e && e->ab32 ? fr_dnnl_engine() != NULL : fr_gemm16_native(FR_BF16);
}

enum { G32_OPENBLAS, G32_LARGE, G32_ALL };
static int g32;
static pthread_once_t g32_once = PTHREAD_ONCE_INIT;

/* oneDNN's effective ISA contains AVX-512 (its ISA values are nested bit
 * sets) */
static int isa_avx512(void) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core;
}

static void decide32(void) {
    const char *env = getenv("FRUGAL_GEMM");
    if (!fr_dnnl_engine() || (env && strcmp(env, "openblas") == 0)) g32 = G32_OPENBLAS;
    else if (env && strcmp(env, "onednn") == 0) g32 = G32_ALL;
    else g32 = isa_avx512() ? G32_LARGE : G32_OPENBLAS;
}

int fr_gemm32_onednn(void) {
    pthread_once(&g32_once, decide32);
    return g32 == G32_ALL;
}

int fr_gemm32_onednn_for(int64_t M, int64_t N, int64_t K) {
    pthread_once(&g32_once, decide32);
    if (g32 == G32_ALL) return 1;
    return g32 == G32_LARGE && M > 0 && N > 0 && K > 0 &&
           (double)M * (double)N * (double)K >= FR_GEMM32_ONEDNN_MIN;
}

size_t fr_gemm16_epi_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                        float beta, int64_t ldc, const fr_gemm16_out *e) {
    if (!runs(e) || M <= 0 || N <= 0 || K <= 0) return 0;
    /* oneDNN sizes its scratchpad for the threads it will run on: planned
     * for the most a later fr_set_threads may give (the cores, or more if
     * asked now), so a step compiled on fewer threads still runs */
    int now = omp_get_max_threads(), most = omp_get_num_procs() > now ? omp_get_num_procs() : now;
    dnnl_primitive_desc_t pd;
    const mm_key key = key_of(ta, tb, M, N, K, lda, ldb, beta, ldc, e);
    omp_set_num_threads(most);
    int bad = make_pd(&key, &pd);
    omp_set_num_threads(now);
    if (bad) return 0;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t n = sp ? dnnl_memory_desc_get_size(sp) : 0;
    dnnl_primitive_desc_destroy(pd);
    return n;
}

int fr_gemm16(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
              int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc,
              void *ws, size_t ws_bytes) {
    return fr_gemm16_epi(ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, NULL, ws, ws_bytes);
}

int fr_gemm16_epi(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A,
                  int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc,
                  const fr_gemm16_out *e, void *ws, size_t ws_bytes) {
    if (!runs(e))
        return fr_fail(ctx, FR_ERR_ARG,
                       e && e->ab32 ? "gemm16: no oneDNN engine for an f32 matmul"
                                    : "gemm16: no native bf16 GEMM on this CPU");
    if (M <= 0 || N <= 0) return FR_OK;
    if (K <= 0 && (!e || (!e->c16 && !e->bias))) { /* an empty sum */
        if (beta == 0.0f)
            for (int64_t m = 0; m < M; m++)
                memset((float *)C + m * ldc, 0, (size_t)N * sizeof(float));
        return FR_OK;
    }
    if (K <= 0) return fr_fail(ctx, FR_ERR_ARG, "gemm16: an empty sum with a bias or a 16-bit C");
    mm_key key = key_of(ta, tb, M, N, K, lda, ldb, beta, ldc, e);
    key.threads = omp_get_max_threads();
    mm_entry own, *en = mm_get(&key, &own);
    if (!en)
        return fr_fail(ctx, FR_ERR_ARG, "gemm16: oneDNN has no %s matmul for %lld x %lld x %lld",
                       e && e->ab32 ? "f32" : "bf16", (long long)M, (long long)N, (long long)K);
    size_t need = en->need;
    int st = FR_OK;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL, mbias = NULL;
    if (need > ws_bytes && key.ab32) {
        st = FR_GEMM16_DECLINE;
        goto done;
    }
    if (need > ws_bytes) {
        st = fr_fail(ctx, FR_ERR_ARG,
                     "gemm16: %lld x %lld x %lld needs %zu bytes of scratch, the plan gave %zu",
                     (long long)M, (long long)N, (long long)K, need, ws_bytes);
        goto done;
    }
    if (dnnl_memory_create(&ma, &en->a, g_engine, (void *)A) ||
        dnnl_memory_create(&mb, &en->b, g_engine, (void *)B) ||
        dnnl_memory_create(&mc, &en->c, g_engine, C) ||
        (need && dnnl_memory_create(&ms, &en->sp, g_engine, ws)) ||
        (key.bias && dnnl_memory_create(&mbias, &en->bias, g_engine, (void *)e->bias))) {
        st = fr_fail(ctx, FR_ERR_NOMEM, "gemm16: oneDNN could not make its matmul");
        goto done;
    }
    dnnl_primitive_t p = en->p;
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    int na = 3;
    if (need) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
    if (mbias) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mbias};
    if (dnnl_primitive_execute(p, g_stream, na, args) || dnnl_stream_wait(g_stream))
        st = fr_fail(ctx, FR_ERR_ARG, "gemm16: oneDNN's matmul failed");
done:
    if (mbias) dnnl_memory_destroy(mbias);
    if (ms) dnnl_memory_destroy(ms);
    if (mc) dnnl_memory_destroy(mc);
    if (mb) dnnl_memory_destroy(mb);
    if (ma) dnnl_memory_destroy(ma);
    if (en == &own) dnnl_primitive_destroy(own.p); /* a full cache: made for this call only */
    return st;
}

#else /* built without oneDNN: the pass keeps f32 GEMMs of rounded operands */

int fr_gemm16_native(fr_dtype dt) {
    (void)dt;
    return 0;
}

size_t fr_gemm16_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                    float beta, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)lda, (void)ldb, (void)beta, (void)ldc;
    return 0;
}

int fr_gemm16(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
              int64_t lda, const uint16_t *B, int64_t ldb, float beta, float *C, int64_t ldc,
              void *ws, size_t ws_bytes) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb;
    (void)beta, (void)C, (void)ldc, (void)ws, (void)ws_bytes;
    return fr_fail(ctx, FR_ERR_ARG, "gemm16: frugal was built without oneDNN");
}

size_t fr_gemm16_epi_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                        float beta, int64_t ldc, const fr_gemm16_out *e) {
    (void)e;
    return fr_gemm16_ws(ta, tb, M, N, K, lda, ldb, beta, ldc);
}

int fr_gemm16_epi(fr_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A,
                  int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc,
                  const fr_gemm16_out *e, void *ws, size_t ws_bytes) {
    (void)e;
    return fr_gemm16(ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ws, ws_bytes);
}

int fr_gemm32_onednn(void) { return 0; }
int fr_gemm32_onednn_for(int64_t M, int64_t N, int64_t K) {
    (void)M, (void)N, (void)K;
    return 0;
}

#endif
