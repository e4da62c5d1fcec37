/* gemm16.c — 16-bit GEMMs through oneDNN's matmul (see gemm16.h). */
#include "backend/cpu/gemm16.h"

#include <stdlib.h>
#include <string.h>

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

static int make_pd(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                   float beta, int64_t ldc, dnnl_primitive_desc_t *pd);

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
    dnnl_primitive_desc_t pd;
    if (make_pd(0, 1, 64, 64, 64, 64, 64, 0.0f, 64, &pd)) return;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
        g_native = strncmp(impl, "ref", 3) != 0;
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

/* 2-D memory descriptors of op(A) (M,K), op(B) (K,N) and C (M,N) by strides */
static int make_pd(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                   float beta, int64_t ldc, dnnl_primitive_desc_t *pd) {
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {ta ? 1 : lda, ta ? lda : 1}, bs = {tb ? 1 : ldb, tb ? ldb : 1}, cs = {ldc, 1};
    if (dnnl_memory_desc_init_by_strides(&a, 2, ad, dnnl_bf16, as) ||
        dnnl_memory_desc_init_by_strides(&b, 2, bd, dnnl_bf16, bs) ||
        dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs))
        return -1;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c)) return -1;
    dnnl_primitive_attr_t at;
    if (dnnl_primitive_attr_create(&at)) return -1;
    int bad = dnnl_primitive_attr_set_scratchpad_mode(at, dnnl_scratchpad_mode_user) != 0;
    if (!bad && beta != 0.0f) { /* C = A B + beta C: oneDNN's sum post-op */
        dnnl_post_ops_t po;
        bad = dnnl_post_ops_create(&po) != 0;
        if (!bad) {
            bad = dnnl_post_ops_append_sum(po, beta) || dnnl_primitive_attr_set_post_ops(at, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (!bad) bad = dnnl_primitive_desc_create(pd, &md, at, g_engine, NULL) != 0;
    dnnl_primitive_attr_destroy(at);
    return bad ? -1 : 0;
}

size_t fr_gemm16_ws(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                    float beta, int64_t ldc) {
    if (!fr_gemm16_native(FR_BF16) || M <= 0 || N <= 0 || K <= 0) return 0;
    /* oneDNN sizes its scratchpad for the threads it will run on: planned
     * for the most a later fr_set_threads may give (the cores, or more if
     * asked now), so a step compiled on fewer threads still runs */
    int now = omp_get_max_threads(), most = omp_get_num_procs() > now ? omp_get_num_procs() : now;
    dnnl_primitive_desc_t pd;
    omp_set_num_threads(most);
    int bad = make_pd(ta, tb, M, N, K, lda, ldb, beta, ldc, &pd);
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
    if (!fr_gemm16_native(FR_BF16))
        return fr_fail(ctx, FR_ERR_ARG, "gemm16: no native bf16 GEMM on this CPU");
    if (M <= 0 || N <= 0) return FR_OK;
    if (K <= 0) { /* an empty sum */
        if (beta == 0.0f)
            for (int64_t m = 0; m < M; m++) memset(C + m * ldc, 0, (size_t)N * sizeof(float));
        return FR_OK;
    }
    dnnl_primitive_desc_t pd;
    if (make_pd(ta, tb, M, N, K, lda, ldb, beta, ldc, &pd))
        return fr_fail(ctx, FR_ERR_ARG, "gemm16: oneDNN has no bf16 matmul for %lld x %lld x %lld",
                       (long long)M, (long long)N, (long long)K);
    const dnnl_memory_desc_t *spd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t need = spd ? dnnl_memory_desc_get_size(spd) : 0;
    int st = FR_OK;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    if (need > ws_bytes) {
        st = fr_fail(ctx, FR_ERR_ARG,
                     "gemm16: %lld x %lld x %lld needs %zu bytes of scratch, the plan gave %zu",
                     (long long)M, (long long)N, (long long)K, need, ws_bytes);
        goto done;
    }
    const dnnl_memory_desc_t *a = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
                             *b = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0),
                             *c = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (dnnl_primitive_create(&p, pd) || dnnl_memory_create(&ma, a, g_engine, (void *)A) ||
        dnnl_memory_create(&mb, b, g_engine, (void *)B) ||
        dnnl_memory_create(&mc, c, g_engine, C) ||
        (need && dnnl_memory_create(&ms, spd, g_engine, ws))) {
        st = fr_fail(ctx, FR_ERR_NOMEM, "gemm16: oneDNN could not make its matmul");
        goto done;
    }
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}};
    if (dnnl_primitive_execute(p, g_stream, need ? 4 : 3, args) || dnnl_stream_wait(g_stream))
        st = fr_fail(ctx, FR_ERR_ARG, "gemm16: oneDNN's matmul failed");
done:
    if (ms) dnnl_memory_destroy(ms);
    if (mc) dnnl_memory_destroy(mc);
    if (mb) dnnl_memory_destroy(mb);
    if (ma) dnnl_memory_destroy(ma);
    if (p) dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
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

#endif
