/* test_rss.c — the engine's own accounting agrees with what the operating
 * system sees. Two training steps, each in a process of its own: a large
 * MLP (about 400 MiB of parameters, gradients, Adam state and activations;
 * its layers on oneDNN's f32 matmul where the CPU has AVX-512, gemm16.h),
 * and the CNN at batch 1024 in bf16-mixed (its convolutions on oneDNN's
 * native bf16 primitives where the CPU has them, conv_dnnl.h). The growth
 * of the process's peak RSS over the steps must match the engine's peak
 * reserved bytes within 5% + 16 MiB. The margin covers what is not the
 * engine's: OpenBLAS's per-thread packing buffers (warmed up before the
 * baseline, but they can grow with larger GEMMs), oneDNN's JIT-compiled
 * kernels and caches, OpenMP thread stacks, libc's heap slack and page
 * rounding. Under AddressSanitizer RSS includes shadow memory, so the
 * comparison is skipped there (FR_SANITIZED=1). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "core/rng.h"
#include "run/trainer.h"

/* The peak RSS growth over the steps against the engine's reserved peak. */
static void compare(fr_ctx *ctx, const char *what, size_t base, size_t at_least) {
    size_t grown = fr_peak_rss_kib() * 1024 - base;
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    double diff = (double)grown - (double)st.reserved_peak;
    double margin = 0.05 * (double)st.reserved_peak + 16.0 * 1048576;
    printf("%s: engine reserved peak %.1f MiB, allocated peak %.1f MiB, process RSS growth "
           "%.1f MiB, difference %.1f MiB (margin %.1f MiB)\n",
           what, st.reserved_peak / 1048576.0, st.allocated_total_peak / 1048576.0,
           grown / 1048576.0, diff / 1048576.0, margin / 1048576.0);
    CHECK(st.reserved_peak > at_least, "%s: the scenario is large enough to measure: %zu", what,
          st.reserved_peak);
    CHECK(diff <= margin && -diff <= margin,
          "%s: RSS growth and engine accounting differ by %.1f MiB", what, diff / 1048576.0);
}

/* n random rows of d inputs and their labels (of 10 classes) */
static void make_batch(int n, int d, uint64_t seed, float **x, int32_t **y) {
    *x = malloc((size_t)n * d * sizeof(float));
    *y = malloc((size_t)n * sizeof(int32_t));
    fr_rng r = fr_rng_make(seed, 1);
    for (int i = 0; i < n * d; i++) (*x)[i] = fr_rng_next_uniform(&r);
    for (int i = 0; i < n; i++) (*y)[i] = (int32_t)fr_rng_below(&r, 10);
}

/* Compile m with o, run two steps of the batch (n rows of x, labels y),
 * compare, and free everything the scenario made. */
static int run_scenario(fr_ctx *ctx, fr_model *m, const fr_step_opts *o, int n, float *x,
                        int32_t *y, const char *what, size_t base, size_t at_least) {
    fr_step *s = m ? fr_step_compile(m, o) : NULL;
    CHECK(s != NULL, "%s: compile: %s", what, fr_last_error(ctx));
    fr_batch b = {n, x, y, NULL, NULL};
    float loss;
    for (int i = 0; i < 2 && s; i++)
        CHECK(fr_step_run(s, &b, &loss, NULL) == FR_OK, "%s: %s", what, fr_last_error(ctx));
    if (s) compare(ctx, what, base, at_least);
    fr_step_free(s);
    fr_model_free(m);
    free(x);
    free(y);
    fr_ctx_free(ctx);
    return check_done();
}

static int mlp_fp32(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    /* Warm OpenBLAS up with GEMMs of the sizes the step will use. */
    {
        int n = 1024;
        float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4),
              *c = calloc((size_t)n * n, 4);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        free(a);
        free(b);
        free(c);
    }
    int n = 256, d = 2048;
    float *x;
    int32_t *y;
    make_batch(n, d, 1, &x, &y);
    size_t base = fr_peak_rss_kib() * 1024;
    fr_model *m = fr_model_new(ctx, d, 1, 1);
    fr_model_linear(m, 4096, 1);
    fr_model_relu(m);
    fr_model_linear(m, 4096, 1);
    fr_model_relu(m);
    fr_model_linear(m, 10, 1);
    fr_step_opts o = {.batch = n,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .keep_grads = 1}; /* the tutorial's loop: every gradient stored */
    o.optim.zero_grad_to_none = 0;
    return run_scenario(ctx, m, &o, n, x, y, "MLP, fp32", base, 380u << 20);
}

/* The CNN at batch 1024 in bf16-mixed, Adam: two steps. */
static int cnn_bf16(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    const int n = 1024, d = 28 * 28;
    float *x;
    int32_t *y;
    make_batch(n, d, 2, &x, &y);
    size_t base = fr_peak_rss_kib() * 1024;
    fr_model *m = fr_model_load(ctx, "cnn");
    CHECK(m != NULL, "load cnn: %s", fr_last_error(ctx));
    fr_step_opts o = {.batch = n,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .precision = FR_PREC_BF16_MIXED};
    /* about 262 MiB reserved: well above the 16 MiB of the margin's constant */
    return run_scenario(ctx, m, &o, n, x, y, "CNN, batch 1024, bf16-mixed", base, 200u << 20);
}

/* each scenario in a child of its own: a peak RSS is the process's */
static int child(int (*scenario)(void)) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = scenario();
        fflush(stdout);
        _exit(rc ? 1 : 0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void) {
    if (getenv("FR_SANITIZED")) {
        printf("skipped under sanitizers (RSS includes shadow memory)\n");
        return check_done();
    }
    int a = child(mlp_fp32), b = child(cnn_bf16);
    CHECK(a == 0, "the MLP's scenario: exit status %d", a);
    CHECK(b == 0, "the CNN's scenario: exit status %d", b);
    return check_done();
}
