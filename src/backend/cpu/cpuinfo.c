/* cpuinfo.c — the CPU's description and the GEMM probe (see cpuinfo.h and
 * frugal.h's "the CPU and its GEMM"). Both are made once per process under
 * pthread_once; the only other state is the environment fr_cpu_fix_env sets
 * before a restart. */
#include "backend/cpu/cpuinfo.h"
#include "backend/cpu/conv_dnnl.h"
#include "core/names.h"
#include "plan/layout.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef FR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "backend/cpu/gemm16.h"

#define FELL_BACK_ENV "FRUGAL_BLAS_FELL_BACK"

/* One row per feature: its bit and /proc/cpuinfo's name. */
static const struct {
    fr_cpu_feature bit;
    const char *name;
} features[] = {
    {FR_CPU_SSE42, "sse4_2"},      {FR_CPU_AVX, "avx"},
    {FR_CPU_FMA, "fma"},           {FR_CPU_AVX2, "avx2"},
    {FR_CPU_AVX512F, "avx512f"},   {FR_CPU_AVX512BW, "avx512bw"},
    {FR_CPU_AVX512VL, "avx512vl"}, {FR_CPU_AVX512_BF16, "avx512_bf16"},
    {FR_CPU_AMX_TILE, "amx_tile"}, {FR_CPU_AMX_BF16, "amx_bf16"},
};
#define NFEAT (sizeof features / sizeof features[0])

/* OpenBLAS 0.3's x86-64 cores (driver/others/dynamic.c's names) by the
 * widest vectors their sgemm kernels use: 1 SSE, 2 AVX, 3 AVX2+FMA, 4 AVX-512. */
static const struct {
    const char *name;
    int level;
} cores[] = {
    {"Unknown", 1},     {"Katmai", 1},        {"Coppermine", 1},     {"Northwood", 1},
    {"Prescott", 1},    {"Banias", 1},        {"Atom", 1},           {"Core2", 1},
    {"Penryn", 1},      {"Dunnington", 1},    {"Nehalem", 1},        {"Athlon", 1},
    {"Opteron", 1},     {"Opteron(SSE3)", 1}, {"Barcelona", 1},      {"Nano", 1},
    {"Bobcat", 1},      {"Sandybridge", 2},   {"Bulldozer", 2},      {"Piledriver", 2},
    {"Steamroller", 2}, {"Excavator", 2},     {"Haswell", 3},        {"Zen", 3},
    {"SkylakeX", 4},    {"Cooperlake", 4},    {"SapphireRapids", 4},
};

/* The core a level calls for. SkylakeX, not Cooperlake, for AVX-512: in
 * OpenBLAS 0.3.21 Cooperlake's sgemm is SkylakeX's (it adds only a bf16
 * GEMM frugal does not call), they measure the same (bench/out/
 * gemm_providers.txt), and SkylakeX does not need AVX512_BF16. */
static const char *const best_for_level[] = {NULL, NULL, "Sandybridge", "Haswell", "SkylakeX"};

/* what a level's kernels are called in the warning: "generic Prescott",
 * "AVX2 Haswell" */
static const char *const level_word[] = {"", "generic", "AVX", "AVX2", "AVX-512"};

static int core_level(const char *name) {
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
        if (!strcasecmp(name, cores[i].name)) return cores[i].level;
    return 0; /* a core this table does not know: never called narrow */
}

static int cpu_level(unsigned f) {
    if (f & FR_CPU_AVX512F) return 4;
    if ((f & FR_CPU_AVX2) && (f & FR_CPU_FMA)) return 3;
    return f & FR_CPU_AVX ? 2 : 1;
}

static fr_cpu_info g_cpu;
static char g_warning[320];
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

static void copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Features the CPU has and the OS saves the registers of (XCR0): what
 * /proc/cpuinfo lists, as the kernel clears what it does not enable. */
static void cpuid_describe(fr_cpu_info *c) {
    unsigned a, b, cx, d, max = __get_cpuid_max(0, NULL);
    if (max < 1 || !__get_cpuid(1, &a, &b, &cx, &d)) return;
    unsigned fam = (a >> 8) & 15, mod = (a >> 4) & 15;
    if (fam == 15) fam += (a >> 20) & 255;
    if (fam == 6 || fam >= 15) mod |= ((a >> 16) & 15) << 4;
    c->family = (int)fam, c->model_id = (int)mod;
    unsigned f = 0;
    if (cx & (1u << 20)) f |= FR_CPU_SSE42;
    uint64_t xcr0 = (cx & (1u << 27)) ? xgetbv0() : 0; /* OSXSAVE */
    int ymm = (xcr0 & 6) == 6, zmm = ymm && (xcr0 & 0xe0) == 0xe0,
        tiles = (xcr0 & 0x60000) == 0x60000;
    if (ymm && (cx & (1u << 28))) f |= FR_CPU_AVX;
    if (ymm && (cx & (1u << 12))) f |= FR_CPU_FMA;
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        unsigned sub = a;
        if (ymm && (b & (1u << 5))) f |= FR_CPU_AVX2;
        if (zmm && (b & (1u << 16))) f |= FR_CPU_AVX512F;
        if (zmm && (b & (1u << 30))) f |= FR_CPU_AVX512BW;
        if (zmm && (b & (1u << 31))) f |= FR_CPU_AVX512VL;
        if (tiles && (d & (1u << 24))) f |= FR_CPU_AMX_TILE;
        if (tiles && (d & (1u << 22))) f |= FR_CPU_AMX_BF16;
        if (sub >= 1) {
            __cpuid_count(7, 1, a, b, cx, d);
            if (zmm && (a & (1u << 5))) f |= FR_CPU_AVX512_BF16;
        }
    }
    c->features = f;
    unsigned brand[12];
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2],
                        &brand[4 * i + 3]);
        char s[49];
        memcpy(s, brand, 48);
        s[48] = 0;
        char *p = s, *e = s + strlen(s);
        while (*p == ' ') p++;
        while (e > p && (e[-1] == ' ' || e[-1] == 0)) *--e = 0;
        copy(c->model, sizeof c->model, p);
    }
}
#else
static void cpuid_describe(fr_cpu_info *c) { (void)c; }
#endif

/* /proc/cpuinfo's "model name", where cpuid gave none */
static void proc_model(fr_cpu_info *c) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        char *p = colon + 1;
        while (*p == ' ' || *p == '\t') p++;
        p[strcspn(p, "\n")] = 0;
        copy(c->model, sizeof c->model, p);
        break;
    }
    fclose(f);
}

static void blas_describe(fr_cpu_info *c) {
    const char *config = openblas_get_config(); /* "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..." */
    const char *core = openblas_get_corename();
    copy(c->blas_core, sizeof c->blas_core, core);
    char name[16] = "", version[16] = "";
    if (config && sscanf(config, "%15s %15s", name, version) == 2)
        snprintf(c->blas, sizeof c->blas, "%s %s", name, version);
    else copy(c->blas, sizeof c->blas, "OpenBLAS");
    c->blas_dynamic = config && strstr(config, "DYNAMIC_ARCH") != NULL;
    int have = cpu_level(c->features), level = core_level(c->blas_core);
    c->best_core = best_for_level[have];
    /* a core below the CPU's level: the generic SSE3 fallback on a model
     * OpenBLAS does not know, or AVX2 kernels on an AVX-512 CPU it takes
     * for an older one (0.3.21 on AMD family 26, Zen 5, picks Haswell).
     * SkylakeX against AVX2 kernels on an AVX-512 CPU: no slower where the
     * FMA units are 256 bits wide (Zen 4 runs 512-bit vectors in two
     * halves), faster where they are 512 (bench/out/gemm_providers.txt). */
    c->blas_narrow = level > 0 && level < have && have >= 3;
    const char *fell = getenv(FELL_BACK_ENV);
    if (fell) copy(c->fell_back, sizeof c->fell_back, fell);
}

static void onednn_describe(fr_cpu_info *c) {
#ifdef FR_HAVE_ONEDNN
    static const struct {
        dnnl_cpu_isa_t isa;
        const char *name;
    } isas[] = {
        {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
        {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
        {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
        {dnnl_cpu_isa_avx512_core, "avx512_core"},
        {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
        {dnnl_cpu_isa_avx2, "avx2"},
        {dnnl_cpu_isa_avx, "avx"},
        {dnnl_cpu_isa_sse41, "sse41"},
    };
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    copy(c->onednn_isa, sizeof c->onednn_isa, "any");
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
        if (isa == isas[i].isa) {
            copy(c->onednn_isa, sizeof c->onednn_isa, isas[i].name);
            break;
        }
#endif
    c->bf16_native = fr_gemm16_native(FR_BF16);
}

static void warning_describe(const fr_cpu_info *c) {
    if (!c->blas_narrow) return;
    const char *want = c->best_core, *feat = cpu_level(c->features) == 4 ? "AVX-512" : "AVX2",
               *kind = level_word[core_level(c->blas_core)];
    if (!c->blas_dynamic)
        snprintf(g_warning, sizeof g_warning,
                 "frugal: warning: %s was built for %s %s kernels only, on this %s CPU: "
                 "install an OpenBLAS built with DYNAMIC_ARCH (Debian's libopenblas0-openmp)",
                 c->blas, kind, c->blas_core, feat);
    else if (c->fell_back[0])
        snprintf(g_warning, sizeof g_warning,
                 "frugal: warning: %s kept its %s %s kernels with OPENBLAS_CORETYPE=%s on "
                 "this %s CPU: install an OpenBLAS that has that core (Debian's "
                 "libopenblas0-openmp)",
                 c->blas, kind, c->blas_core, want, feat);
    else
        snprintf(g_warning, sizeof g_warning,
                 "frugal: warning: %s runs its %s %s kernels on this %s CPU: set "
                 "OPENBLAS_CORETYPE=%s before the program starts",
                 c->blas, kind, c->blas_core, feat, want);
}

/* cpuid's half alone, under its own once: fr_gemm16_native asks for the
 * feature bits while describe_once runs (onednn_describe). */
static fr_cpu_info g_id;
static pthread_once_t g_id_once = PTHREAD_ONCE_INIT;

static void id_once(void) {
    cpuid_describe(&g_id);
    if (!g_id.model[0]) proc_model(&g_id);
}

unsigned fr_cpu_features(void) {
    pthread_once(&g_id_once, id_once);
    return g_id.features;
}

static void describe_once(void) {
    fr_cpu_info *c = &g_cpu;
    pthread_once(&g_id_once, id_once);
    *c = g_id;
    blas_describe(c);
    onednn_describe(c);
    warning_describe(c);
}

const fr_cpu_info *fr_cpu(void) {
    pthread_once(&g_cpu_once, describe_once);
    return &g_cpu;
}

const char *fr_cpu_feature_name(fr_cpu_feature f) {
    for (size_t i = 0; i < NFEAT; i++)
        if (features[i].bit == f) return features[i].name;
    return NULL;
}

const char *fr_cpu_warning(void) { return fr_cpu()->blas_narrow ? g_warning : NULL; }

int fr_cpu_fix_env(void) {
    const fr_cpu_info *c = fr_cpu();
    const char *fix = getenv("FRUGAL_BLAS_FIX");
    if (!c->blas_narrow || !c->blas_dynamic || !c->best_core || c->fell_back[0] ||
        (fix && !strcmp(fix, "0")))
        return 0;
    if (setenv(FELL_BACK_ENV, c->blas_core, 1) || setenv("OPENBLAS_CORETYPE", c->best_core, 1))
        return 0;
    return 1;
}

int fr_cpu_setup(char **argv) {
    if (!fr_cpu_fix_env()) return 0;
    execv("/proc/self/exe", argv);
    unsetenv(FELL_BACK_ENV); /* still this process: OpenBLAS keeps its core */
    return -1;
}

const char *fr_cpu_gemm_f32(char *buf, size_t n) {
    const fr_cpu_info *c = fr_cpu();
    snprintf(buf, n, "%.31s %.31s", c->blas, c->blas_core);
    return buf;
}

const char *fr_cpu_gemm_bf16(char *buf, size_t n) {
    const fr_cpu_info *c = fr_cpu();
    if (c->bf16_native) snprintf(buf, n, "oneDNN matmul %.31s", c->onednn_isa);
    else snprintf(buf, n, "f32 GEMM of rounded operands");
    return buf;
}

const char *fr_cpu_linear32(char *buf, size_t n) {
    if (fr_gemm32_onednn()) snprintf(buf, n, "oneDNN matmul %.31s", fr_cpu()->onednn_isa);
    else if (fr_gemm32_onednn_for(1024, 1024, 1024)) /* 2^30: a large layer */
        snprintf(buf, n, "OpenBLAS, from 2^28 multiply-adds oneDNN matmul %.31s",
                 fr_cpu()->onednn_isa);
    else snprintf(buf, n, "OpenBLAS");
    return buf;
}

const char *fr_cpu_conv(char *buf, size_t n) {
    if (fr_conv_dnnl_on()) snprintf(buf, n, "oneDNN %.31s", fr_cpu()->onednn_isa);
    else if (fr_conv_dnnl_for(FR_BF16) && fr_conv_dnnl_allowed() && fr_layout_enabled())
        snprintf(buf, n, "im2col/shifted GEMMs, bf16 and nChw16c oneDNN %.31s",
                 fr_cpu()->onednn_isa);
    else if (fr_conv_dnnl_for(FR_BF16))
        snprintf(buf, n, "im2col/shifted GEMMs, bf16 oneDNN %.31s", fr_cpu()->onednn_isa);
    else if (fr_conv_dnnl_allowed() && fr_layout_enabled())
        snprintf(buf, n, "im2col/shifted GEMMs, nChw16c oneDNN %.31s", fr_cpu()->onednn_isa);
    else snprintf(buf, n, "im2col/shifted GEMMs");
    return buf;
}

/* ---- the probe ----------------------------------------------------------- */

#define PROBE_N 512
#define PROBE_MIN_RUNS 5
#define PROBE_MIN_S 0.05 /* per provider: about 0.2 s for the three */

static fr_gemm_rates g_rates;
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the provider's GEMM C = A B, n x n, row-major; 0 on success */
typedef int (*gemm_fn)(int n, const void *A, const void *B, float *C, void *ws, size_t ws_bytes);

static int blas_f32(int n, const void *A, const void *B, float *C, void *ws, size_t wsb) {
    (void)ws, (void)wsb;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    return 0;
}

#ifdef FR_HAVE_ONEDNN
static int onednn_f32(int n, const void *A, const void *B, float *C, void *ws, size_t wsb) {
    (void)ws, (void)wsb;
    return dnnl_sgemm('N', 'N', n, n, n, 1.0f, A, n, B, n, 0.0f, C, n) != dnnl_success;
}
#endif

static int bf16(int n, const void *A, const void *B, float *C, void *ws, size_t wsb) {
    return fr_gemm16(NULL, 0, 0, n, n, n, A, n, B, n, 0.0f, C, n, ws, wsb) != FR_OK;
}

/* GFLOP/s of the fastest run, after one to warm up; 0 when the provider
 * fails or its C differs from the float64 product (at two places) */
static double rate(gemm_fn f, int n, const void *A, const void *B, float *C, void *ws, size_t wsb,
                   const double ref[2]) {
    if (f(n, A, B, C, ws, wsb)) return 0;
    const double got[2] = {C[0], C[(size_t)n * n - 1]};
    for (int i = 0; i < 2;
         i++) { /* the sums are exact in f32 (8-bit values): any error is a fault */
        double tol = 1e-3 * (1 + (ref[i] < 0 ? -ref[i] : ref[i]));
        if (!(got[i] - ref[i] <= tol && ref[i] - got[i] <= tol)) return 0;
    }
    double best = 1e30, t0 = now_s();
    for (int r = 0; r < 200 && (r < PROBE_MIN_RUNS || now_s() - t0 < PROBE_MIN_S); r++) {
        double t = now_s();
        if (f(n, A, B, C, ws, wsb)) return 0;
        t = now_s() - t;
        if (t < best) best = t;
    }
    return 2.0 * n * n * n / best * 1e-9;
}

static void probe_once(void) {
    const int n = PROBE_N;
    const size_t nn = (size_t)n * n;
    g_rates.n = n;
    g_rates.threads = omp_get_max_threads();
    float *A = malloc(nn * sizeof *A), *B = malloc(nn * sizeof *B), *C = malloc(nn * sizeof *C);
    uint16_t *A16 = malloc(nn * sizeof *A16), *B16 = malloc(nn * sizeof *B16);
    if (!A || !B || !C || !A16 || !B16) goto done;
    /* values with at most 8 significant bits: exact in bf16, so every
     * provider multiplies the same numbers */
    for (size_t i = 0; i < nn; i++) {
        A[i] = (float)((int)((i * 37) % 17) - 8) / 16.0f;
        B[i] = (float)((int)((i * 11) % 13) - 6) / 8.0f;
        uint32_t ua, ub;
        memcpy(&ua, &A[i], 4), memcpy(&ub, &B[i], 4);
        A16[i] = (uint16_t)(ua >> 16), B16[i] = (uint16_t)(ub >> 16);
    }
    double ref[2] = {0, 0}; /* C[0][0] and C[n-1][n-1] in float64 */
    for (int k = 0; k < n; k++) {
        ref[0] += (double)A[k] * B[(size_t)k * n];
        ref[1] += (double)A[(size_t)(n - 1) * n + k] * B[(size_t)k * n + n - 1];
    }
    g_rates.blas_f32 = rate(blas_f32, n, A, B, C, NULL, 0, ref);
#ifdef FR_HAVE_ONEDNN
    g_rates.onednn_f32 = rate(onednn_f32, n, A, B, C, NULL, 0, ref);
#endif
    if (fr_cpu()->bf16_native) {
        size_t wsb = fr_gemm16_ws(0, 0, n, n, n, n, n, 0.0f, n);
        void *ws = wsb ? malloc(wsb) : NULL;
        if (!wsb || ws) g_rates.bf16 = rate(bf16, n, A16, B16, C, ws, wsb, ref);
        free(ws);
    }
done:
    free(A), free(B), free(C), free(A16), free(B16);
}

void fr_gemm_probe(fr_gemm_rates *out) {
    pthread_once(&g_probe_once, probe_once);
    *out = g_rates;
}

/* ---- what the CLI prints --------------------------------------------------- */

void fr_cpu_line(FILE *f, const fr_gemm_rates *r) {
    const fr_cpu_info *c = fr_cpu();
    char g32[96], g16[96];
    fprintf(f, "cpu   %s (family %d model %d):", c->model[0] ? c->model : "unknown", c->family,
            c->model_id);
    for (size_t i = 0; i < NFEAT; i++)
        if (c->features & features[i].bit) fprintf(f, " %s", features[i].name);
    fprintf(f, "; GEMM f32 %s", fr_cpu_gemm_f32(g32, sizeof g32));
    if (c->fell_back[0]) fprintf(f, " (OpenBLAS chose %s: restarted)", c->fell_back);
    else if (c->blas_narrow) fprintf(f, " (%s kernels)", level_word[core_level(c->blas_core)]);
    if (r) {
        fprintf(f, " %.0f GFLOP/s", r->blas_f32);
        if (r->onednn_f32 > 0) fprintf(f, " (oneDNN sgemm %.0f)", r->onednn_f32);
    }
    fprintf(f, ", bf16 %s", fr_cpu_gemm_bf16(g16, sizeof g16));
    if (r && r->bf16 > 0) fprintf(f, " %.0f GFLOP/s", r->bf16);
    fprintf(f, "; conv %s", fr_cpu_conv(g16, sizeof g16));
    fprintf(f, "; linear f32 %s", fr_cpu_linear32(g16, sizeof g16));
    if (r) fprintf(f, "; %d threads, %d^3", r->threads, r->n);
}

void fr_cpu_json(FILE *f, const fr_gemm_rates *r) {
    const fr_cpu_info *c = fr_cpu();
    char buf[96];
    fputs("{\"model\": ", f);
    fr_json_str(f, c->model);
    fprintf(f, ", \"family\": %d, \"model_id\": %d, \"features\": [", c->family, c->model_id);
    int n = 0;
    for (size_t i = 0; i < NFEAT; i++)
        if (c->features & features[i].bit)
            fprintf(f, "%s\"%s\"", n++ ? ", " : "", features[i].name);
    fputs("], \"blas\": ", f);
    fr_json_str(f, c->blas);
    fputs(", \"blas_core\": ", f);
    fr_json_str(f, c->blas_core);
    fprintf(f, ", \"blas_dynamic\": %s, \"blas_narrow\": %s, \"best_core\": ",
            c->blas_dynamic ? "true" : "false", c->blas_narrow ? "true" : "false");
    if (c->best_core) fr_json_str(f, c->best_core);
    else fputs("null", f);
    fputs(", \"fell_back_from\": ", f);
    if (c->fell_back[0]) fr_json_str(f, c->fell_back);
    else fputs("null", f);
    fputs(", \"onednn_isa\": ", f);
    fr_json_str(f, c->onednn_isa);
    fputs(", \"gemm_f32\": ", f);
    fr_json_str(f, fr_cpu_gemm_f32(buf, sizeof buf));
    fputs(", \"gemm_bf16\": ", f);
    fr_json_str(f, fr_cpu_gemm_bf16(buf, sizeof buf));
    fputs(", \"conv\": ", f);
    fr_json_str(f, fr_cpu_conv(buf, sizeof buf));
    fputs(", \"linear_f32\": ", f);
    fr_json_str(f, fr_cpu_linear32(buf, sizeof buf));
    fputs(", \"warning\": ", f);
    const char *w = fr_cpu_warning();
    if (w) fr_json_str(f, w);
    else fputs("null", f);
    if (r)
        fprintf(f,
                ", \"probe\": {\"n\": %d, \"threads\": %d, \"gflops_blas_f32\": %.1f, "
                "\"gflops_onednn_f32\": %.1f, \"gflops_bf16\": %.1f}",
                r->n, r->threads, r->blas_f32, r->onednn_f32, r->bf16);
    fputc('}', f);
}
