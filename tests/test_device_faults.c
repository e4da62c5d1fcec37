/* test_device_faults.c — the device's memory refuses cleanly. The n-th
 * allocation in the device's memory is made to fail, for every n across
 * compiling and running two training steps of a small CNN (with BatchNorm,
 * a residual block, dropout; Adam, zero_grad to none) on the OpenCL device:
 * each failure is an out-of-memory error naming what it was for, and once
 * the step and the model are freed the device holds nothing (allocated 0,
 * every reserved buffer cached or given back) — the device twin of
 * test_engine's host test. Then a budget below the step's plan: refused
 * before anything runs, naming the budget. Skipped (77) without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "fault_sweep.h"
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
#include "backend/opencl/backend.h"

enum { N = 4, D = 144 };

static fr_step_opts opts(void) {
    fr_step_opts o = {
        .batch = N, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_ADAM), .seed = 1};
    o.optim.zero_grad_to_none = 1;
    return o;
}

/* Build, compile and run two steps; the status of the first failure. */
static fr_status scenario(fr_ctx *ctx, const float *x, const int32_t *y) {
    fr_model *m = residual_cnn(ctx);
    fr_step *s = NULL;
    fr_status st = m ? fr_model_init(m, 1) : FR_ERR_NOMEM;
    fr_step_opts o = opts();
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    fr_batch b = {.n = N, .x = (float *)x, .y = (int32_t *)y};
    float loss;
    for (int k = 0; k < 2 && !st; k++) st = fr_step_run(s, &b, &loss, NULL);
    fr_step_free(s);
    fr_model_free(m);
    return st;
}

static void test_failures(fr_ctx *ctx, const float *x, const int32_t *y) {
    int n, failures = 0, bad = 0;
    for (n = 1; n < 10000; n++) {
        fr_mem_fail_at_of(ctx->dmem, (uint64_t)n);
        fr_status st = scenario(ctx, x, y);
        int injected = ctx->dmem->fail_at == 0;
        if (st) {
            failures++;
            const char *e = fr_last_error(ctx);
            if (st != FR_ERR_NOMEM || !strstr(e, "injected") ||
                !strstr(e, "on the OpenCL device")) {
                if (bad++ < 3) fprintf(stderr, "device allocation %d: status %d, '%s'\n", n, st, e);
            }
        }
        fr_mem_stats ms;
        fr_mem_stats_of(ctx->dmem, &ms);
        if ((ms.allocated_total != 0 || ms.reserved != ms.cached) && bad++ < 3)
            fprintf(stderr, "device allocation %d: %zu bytes still allocated, %zu reserved\n", n,
                    ms.allocated_total, ms.reserved - ms.cached);
        fr_mem_empty_cache(ctx);
        if (!injected) break; /* the whole scenario ran without reaching allocation n */
    }
    fr_mem_fail_at_of(ctx->dmem, 0);
    CHECK(bad == 0, "%d device failure points misbehaved", bad);
    CHECK(failures == n - 1 && n > 10,
          "every one of the %d device allocations was made to fail (%d failures seen)", n - 1,
          failures);
    printf("device allocation failure: %d points tested\n", n - 1);
}

static void test_budget(fr_ctx *ctx) {
    fr_model *m = residual_cnn(ctx);
    CHECK(m && !fr_model_init(m, 1), "model");
    fr_step_opts o = opts();
    o.budget = 16 << 10; /* below every device plan, optimizer offloaded or not */
    fr_step *s = fr_step_compile(m, &o);
    CHECK(!s, "a 16 KiB device budget was accepted");
    CHECK(strstr(fr_last_error(ctx), "budget") != NULL, "the refusal names the budget: '%s'",
          fr_last_error(ctx));
    printf("budget below the plan: %s\n", fr_last_error(ctx));
    fr_step_free(s);
    fr_model_free(m);
    fr_mem_stats ms;
    fr_mem_stats_of(ctx->dmem, &ms);
    CHECK(ms.allocated_total == 0, "%zu device bytes left after the refusal", ms.allocated_total);
}

int main(void) {
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_set_threads(ctx, 2);
    float *x = malloc(N * D * sizeof *x);
    int32_t *y = malloc(N * sizeof *y);
    fr_rng r = fr_rng_make(7, 3);
    for (int i = 0; i < N * D; i++) x[i] = fr_rng_next_uniform(&r);
    for (int i = 0; i < N; i++) y[i] = (int32_t)fr_rng_below(&r, 10);
    CHECK(scenario(ctx, x, y) == FR_OK, "the scenario without faults: %s", fr_last_error(ctx));
    test_failures(ctx, x, y);
    test_budget(ctx);
    free(x);
    free(y);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
#endif
