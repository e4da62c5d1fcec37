/* fault_sweep.h — the host allocation-failure sweep of the tests
 * (test_engine.c, test_offload.c, test_plan_fuse.c, test_plan_narrow.c),
 * the end-of-test leak check of a test's own context (ctx_free_done), and
 * the small residual CNN that test_engine.c and test_device_faults.c step.
 * A scenario builds what it needs on the context it is given and frees it
 * all before returning; fault_sweep runs it once per host allocation n, on a
 * fresh context whose allocation n fails, until a run never reaches n, and
 * checks that every point failed cleanly (FR_ERR_NOMEM saying "out of
 * memory") and leaked nothing. Include after check.h. */
#ifndef FR_FAULT_SWEEP_H
#define FR_FAULT_SWEEP_H

#include <stdio.h>
#include <string.h>
#include "core/ctx.h"
#include "frugal.h"

/* conv(4) bn relu [conv(4) bn] + relu maxpool flatten dropout linear(10) on
 * 1x12x12 images: every kind of layer a CNN step plans, in a few KiB. */
static inline fr_model *residual_cnn(fr_ctx *ctx) {
    fr_model *m = fr_model_new(ctx, 1, 12, 12);
    if (!m) return NULL;
    if (fr_model_conv2d(m, 4, 3, 1, 1, 1) || fr_model_batchnorm(m) || fr_model_relu(m) ||
        fr_model_residual_begin(m) || fr_model_conv2d(m, 4, 3, 1, 1, 0) || fr_model_batchnorm(m) ||
        fr_model_residual_end(m) || fr_model_relu(m) || fr_model_maxpool2d(m, 2, 2) ||
        fr_model_flatten(m) || fr_model_dropout(m, 0.2f) || fr_model_linear(m, 10, 1)) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* Runs scenario(ctx, arg) with host allocation n = 1, 2, ... failing, and
 * checks that it made at least `least` allocations; `what` names the sweep
 * in the summary line. */
static inline void fault_sweep_least(const char *what, int least,
                                     fr_status (*scenario)(fr_ctx *, void *), void *arg) {
    int n, failures = 0, bad = 0;
    for (n = 1; n < 100000; n++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_mem_fail_at(ctx, (uint64_t)n);
        fr_status st = scenario(ctx, arg);
        int injected = ctx->mem.fail_at == 0;
        if (st) {
            failures++;
            if ((st != FR_ERR_NOMEM || !strstr(fr_last_error(ctx), "out of memory")) && bad++ < 3)
                fprintf(stderr, "allocation %d: status %d, message '%s'\n", n, st,
                        fr_last_error(ctx));
        }
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        if (ms.allocated_total != 0 && bad++ < 3)
            fprintf(stderr, "allocation %d: %zu bytes leaked\n", n, ms.allocated_total);
        fr_ctx_free(ctx);
        if (!injected) break; /* the whole scenario ran without reaching allocation n */
    }
    CHECK(bad == 0, "%d failure points misbehaved", bad);
    CHECK(failures == n - 1 && n - 1 >= least,
          "every one of the %d allocations was made to fail (%d failures seen)", n - 1, failures);
    printf("%s: %d points tested\n", what, n - 1);
}

/* The end of a test's main: nothing is left allocated on the test's own
 * context, which is freed; returns check_done()'s exit status. */
static inline int ctx_free_done(fr_ctx *ctx) {
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated_total == 0, "%zu bytes leaked", ms.allocated_total);
    fr_ctx_free(ctx);
    return check_done();
}

/* The sweep of a scenario that makes more than 20 allocations (a step). */
static inline void fault_sweep(const char *what, fr_status (*scenario)(fr_ctx *, void *),
                               void *arg) {
    fault_sweep_least(what, 20, scenario, arg);
}

#endif
