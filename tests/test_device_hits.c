/* test_device_hits.c — accuracy counted on the OpenCL device (PoCL in CI;
 * fr_backend.hits: only the count comes back, not the
 * logits) against the CPU backend's count (fr_step_hits on the host's
 * logits) for the same model, weights and batch: an eval step of 256
 * samples, and the first training step of 64 in micro-batches of 16 (the
 * labels read at each micro-batch's offset in the device's batch slot).
 * Both take the first maximum of a row (strict >), so the counts differ
 * only where a row's two largest logits are within the backends' rounding
 * of each other (the losses agree to 1e-6 here); on these inputs none are,
 * so the test demands equality. Skipped (77) without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "check.h"
#include "core/ctx.h"
#include "core/rng.h"
#include "frugal.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "cl_device.h"

enum { N = 256, D = 144 };

/* The correct answers of one step over the first n samples. */
static int correct(fr_ctx *ctx, int training, int n, int micro, const float *x, const int32_t *y,
                   float *loss) {
    fr_model *m = small_cnn_new(ctx);
    fr_step *s = NULL;
    int c = -1;
    fr_status st = m ? fr_model_init(m, 3) : FR_ERR_NOMEM;
    fr_step_opts o = {.batch = n,
                      .training = training,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .micro_batch = micro};
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    fr_batch b = {.n = n, .x = x, .y = y};
    if (!st) st = fr_step_run(s, &b, loss, &c);
    CHECK(st == FR_OK, "step (training %d): %s", training, fr_last_error(ctx));
    fr_step_free(s);
    fr_model_free(m);
    return c;
}

int main(void) {
    fr_ctx *dev = cl_device_ctx();
    if (!dev) return 77;
    fr_ctx *cpu = fr_ctx_new();
    fr_set_threads(dev, 2);
    fr_set_threads(cpu, 2);
    float *x = malloc(N * D * sizeof *x);
    int32_t *y = malloc(N * sizeof *y);
    fr_rng r = fr_rng_make(9, 1);
    for (int i = 0; i < N * D; i++) x[i] = fr_rng_next_uniform(&r);
    for (int i = 0; i < N; i++) y[i] = (int32_t)fr_rng_below(&r, 10);
    struct {
        int training, n, micro;
    } cases[] = {{0, N, 0}, {1, 128, 32}, {1, 128, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        float lc = 0, ld = 0;
        int c = correct(cpu, cases[k].training, cases[k].n, cases[k].micro, x, y, &lc);
        int d = correct(dev, cases[k].training, cases[k].n, cases[k].micro, x, y, &ld);
        printf("%s step of %d (micro-batch %d): %d correct on the CPU, %d on the device (loss "
               "%.6f / %.6f)\n",
               cases[k].training ? "training" : "eval", cases[k].n, cases[k].micro, c, d,
               (double)lc, (double)ld);
        CHECK(c > 0 && c < cases[k].n, "a count of %d says nothing", c);
        CHECK(c == d, "correct answers: %d on the CPU, %d on the device", c, d);
    }
    fr_mem_stats ms;
    fr_mem_stats_of(dev->dmem, &ms);
    CHECK(ms.allocated_total == 0, "%zu device bytes left", ms.allocated_total);
    free(x);
    free(y);
    fr_ctx_free(cpu);
    fr_cl_unuse(dev);
    fr_ctx_free(dev);
    return check_done();
}
#endif
