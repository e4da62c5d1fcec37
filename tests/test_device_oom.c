/* test_device_oom.c — `frugal train` on the OpenCL device (PoCL in CI) when
 * the device refuses memory. The n-th device allocation of a whole training
 * run (fr_train: the parameter block, the optimizer's gradient and state
 * blocks, the two batch slots, the
 * arena, the accuracy count, the evaluation) is made to fail, for every n:
 * each failure is FR_ERR_NOMEM whose message names the tensor, its
 * category and the smallest budget that fits, and the device holds nothing
 * afterwards. That budget is checked by running with it (the run fits) and
 * with one byte less (refused). Skipped (77) without a device or data. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "core/ctx.h"
#include "frugal.h"
#include "core/mem.h"
#include "run/trainer.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "cl_device.h"

static fr_train_cfg config(const char *data) {
    fr_train_cfg c;
    memset(&c, 0, sizeof c);
    c.model = "cnn";
    c.data = data;
    c.epochs = 1;
    c.step.batch = 32;
    c.step.optim = fr_optim_defaults(FR_OPTIM_ADAM);
    c.step.seed = 5;
    c.progress = -1;
    c.limit_train = 64;
    c.limit_test = 32;
    c.queue = 2;
    c.val_fraction = 0.1;
    return c;
}

/* The device's memory after a run: nothing allocated, nothing reserved
 * beyond its cache. */
static int device_clean(fr_ctx *ctx) {
    fr_mem_stats ms;
    fr_mem_stats_of(ctx->dmem, &ms);
    return ms.allocated_total == 0 && ms.reserved == ms.cached;
}

int main(void) {
    const char *data = getenv("FR_DATA_DIR");
    if (!data || !*data) data = "/usr/share/datasets/fashion-mnist";
    struct stat sb;
    if (stat(data, &sb) != 0) {
        printf("skipped: no data at %s\n", data);
        return 77;
    }
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_set_threads(ctx, 2);
    fr_train_cfg cfg = config(data);
    fr_train_result res;
    CHECK(fr_train(ctx, &cfg, &res) == FR_OK, "the run without faults: %s", fr_last_error(ctx));
    CHECK(device_clean(ctx), "device memory held after the run without faults");

    int n, failures = 0, bad = 0, named[4] = {0};
    size_t smallest = 0;
    for (n = 1; n < 1000; n++) {
        fr_mem_fail_at_of(ctx->dmem, (uint64_t)n);
        fr_status st = fr_train(ctx, &cfg, &res);
        int injected = ctx->dmem->fail_at == 0;
        fr_mem_fail_at_of(ctx->dmem, 0);
        const char *e = fr_last_error(ctx);
        if (st) {
            failures++;
            const char *at = strstr(e, "the smallest budget that fits is ");
            const char *b = at ? strchr(at, '(') : NULL;
            size_t s = b ? strtoull(b + 1, NULL, 10) : 0;
            if (st != FR_ERR_NOMEM || !strstr(e, "injected") || !strstr(e, "(for ") ||
                !strstr(e, ", category ") || !s || !strstr(e, "--budget")) {
                if (bad++ < 3) fprintf(stderr, "device allocation %d: status %d, '%s'\n", n, st, e);
            } else if (smallest && s != smallest && bad++ < 3) {
                fprintf(stderr, "device allocation %d: smallest budget %zu, before %zu\n", n, s,
                        smallest);
            }
            smallest = s;
            named[0] += strstr(e, "for the parameter ") != NULL;
            named[1] += strstr(e, "for optimizer state ") != NULL;
            named[2] += strstr(e, "for the two batch slots") != NULL;
            named[3] += strstr(e, "for the step's arena") != NULL;
            if (n <= 2 || strstr(e, "batch slots")) printf("device allocation %d: %s\n", n, e);
        }
        if (!device_clean(ctx) && bad++ < 3)
            fprintf(stderr, "device allocation %d: device memory still held\n", n);
        fr_mem_empty_cache(ctx);
        if (!injected) break; /* the whole run never reached allocation n */
    }
    CHECK(bad == 0, "%d device failure points misbehaved", bad);
    /* the parameter block, the gradient and state blocks, the batch slots,
     * the arena, the scratches, the hits count, evaluation's: over 10 */
    CHECK(failures == n - 1 && n > 10, "every one of the %d device allocations failed (%d seen)",
          n - 1, failures);
    CHECK(named[0] && named[1] && named[2] && named[3],
          "messages named parameters %d, optimizer state %d, batch slots %d, arena %d times",
          named[0], named[1], named[2], named[3]);
    printf("device allocation failure in a training run: %d points\n", n - 1);

    /* the smallest budget named: a run under it fits, one byte less is refused */
    cfg.step.budget = smallest;
    fr_mem_reset_peak_of(ctx->dmem);
    fr_status st = fr_train(ctx, &cfg, &res);
    CHECK(st == FR_OK, "a run under the smallest budget named (%zu): %s", smallest,
          fr_last_error(ctx));
    CHECK(res.measured_reserved_peak <= smallest, "its device peak %zu is over the budget %zu",
          res.measured_reserved_peak, smallest);
    fr_mem_set_limit_of(ctx->dmem, 0);
    fr_mem_empty_cache(ctx);
    cfg.step.budget = smallest - 1;
    st = fr_train(ctx, &cfg, &res);
    CHECK(st == FR_ERR_BUDGET, "a budget one byte below the smallest: status %d, '%s'", st,
          fr_last_error(ctx));
    printf("smallest budget %zu: fits; %zu: %s\n", smallest, smallest - 1, fr_last_error(ctx));
    fr_mem_set_limit_of(ctx->dmem, 0);
    CHECK(device_clean(ctx), "device memory held after the budgeted runs");
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
#endif
