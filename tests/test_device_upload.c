/* test_device_upload.c — what the batch feed (train/feed.c) rests on, on the
 * OpenCL device (PoCL in CI): an upload on a second queue runs while a slow
 * kernel runs on the step's queue (profiled: the upload starts before the
 * kernel ends), an upload told to wait for the step's mark starts only after
 * the step's end (the loader never overwrites a slot a step still reads),
 * and a barrier on the upload's event makes the step's next kernel read the
 * whole upload (the step never reads a half-written slot: a copy of the slot
 * equals what was uploaded, byte for byte). Then a training step that
 * uploads into two slots gives the losses of one that writes each batch
 * itself, bit for bit, over steps of alternating batches. Test
 * tests/test_device_feed.sh runs the feed through `frugal train`.
 * Skipped (77) without a device. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include "backend/opencl/backend.h"

/* spin: each item iterates a contraction `iters` times (a step made slow on
 * purpose); copy: dst = src, the step reading its slot. */
static const char *prog = "__kernel void spin(__global float *a, int iters) {\n"
                          "    size_t i = get_global_id(0);\n"
                          "    float x = a[i];\n"
                          "    for (int k = 0; k < iters; k++) x = x * 0.999f + 0.001f;\n"
                          "    a[i] = x;\n"
                          "}\n"
                          "__kernel void copy(__global float *dst, __global const float *src) {\n"
                          "    size_t i = get_global_id(0);\n"
                          "    dst[i] = src[i];\n"
                          "}\n";

static cl_ulong prof(cl_event e, cl_profiling_info what) {
    cl_ulong t = 0;
    clGetEventProfilingInfo(e, what, sizeof t, &t, NULL);
    return t;
}

enum { NS = 1 << 20 }; /* floats in a slot: 4 MiB */

static void test_queues(fr_ctx *ctx) {
    fr_cl *cl = fr_cl_of(ctx);
    cl_program p = NULL;
    cl_command_queue q = NULL;
    CHECK(fr_cl_build(ctx, cl, "upload_test", prog, &p) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_queue_new(ctx, cl, &q) == FR_OK, "%s", fr_last_error(ctx));
    if (!p || !q) return;
    cl_int err;
    cl_kernel spin = clCreateKernel(p, "spin", &err), copy = clCreateKernel(p, "copy", &err);
    cl_mem work = NULL, slot = NULL, dst = NULL;
    size_t spin_n = 64;
    CHECK(fr_cl_alloc(ctx, cl, spin_n * sizeof(float), &work) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, NS * sizeof(float), &slot) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, NS * sizeof(float), &dst) == FR_OK, "%s", fr_last_error(ctx));
    float *host = malloc(NS * sizeof *host), *back = malloc(NS * sizeof *back);
    fr_rng r = fr_rng_make(11, 0);
    for (int i = 0; i < NS; i++) host[i] = fr_rng_next_uniform(&r);
    CHECK(fr_cl_zero(ctx, cl, work, 0, spin_n * sizeof(float)) == FR_OK, "zero");
    CHECK(fr_cl_finish(ctx, cl) == FR_OK, "finish");
    int iters = 1 << 22; /* ~0.1-1 s on a CPU core: far longer than a 4 MiB copy */

    /* 1. the step runs (spin, then its release mark); an upload into the
     * other slot, enqueued after the step, waits for nothing: it starts
     * before the step ends */
    cl_event rel = NULL, up = NULL, upx = NULL;
    CHECK(FR_CL_ARGS(ctx, spin, sizeof work, &work, sizeof iters, &iters) == FR_OK, "args");
    CHECK(fr_cl_run(ctx, cl, spin, 1, &spin_n, NULL) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_mark(ctx, cl, &rel) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_write_on(ctx, q, slot, 0, host, NS * sizeof(float), 0, NULL, &up) == FR_OK, "%s",
          fr_last_error(ctx));
    clWaitForEvents(1, &up);
    clWaitForEvents(1, &rel);
    cl_ulong u0 = prof(up, CL_PROFILING_COMMAND_START), u1 = prof(up, CL_PROFILING_COMMAND_END);
    cl_ulong s1 = prof(rel, CL_PROFILING_COMMAND_END);
    printf("upload beside a slow step: upload %.3f..%.3f ms, step ends at %.3f ms\n", 0.0,
           (u1 - u0) * 1e-6, ((double)s1 - (double)u0) * 1e-6);
    CHECK(u0 < s1, "the upload started %.3f ms after the step ended: not overlapped",
          ((double)u0 - (double)s1) * 1e-6);
    /* (whether it also ends before the step depends on the host's load: not checked) */

    /* 2. an upload into the slot a step reads waits for that step's mark */
    for (int i = 0; i < NS; i++) host[i] = -host[i];
    clReleaseEvent(rel), clReleaseEvent(up);
    CHECK(fr_cl_run(ctx, cl, spin, 1, &spin_n, NULL) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_mark(ctx, cl, &rel) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_write_on(ctx, q, slot, 0, host, NS * sizeof(float), 1, &rel, &up) == FR_OK, "%s",
          fr_last_error(ctx));
    clWaitForEvents(1, &up);
    u0 = prof(up, CL_PROFILING_COMMAND_START);
    s1 = prof(rel, CL_PROFILING_COMMAND_END);
    CHECK(u0 >= s1, "an upload told to wait for the step started %.3f ms before its end",
          ((double)s1 - (double)u0) * 1e-6);

    /* 3. the step's queue waits for an upload (a barrier on its event): the
     * copy after it reads every byte uploaded, in two writes as the feed
     * makes them (inputs, then labels) */
    for (int i = 0; i < NS; i++) host[i] = (float)i * 0.5f;
    clReleaseEvent(up);
    size_t half = NS / 2 * sizeof(float);
    CHECK(fr_cl_write_on(ctx, q, slot, 0, host, half, 0, NULL, &upx) == FR_OK, "write");
    CHECK(fr_cl_write_on(ctx, q, slot, half, (char *)host + half, half, 0, NULL, &up) == FR_OK,
          "write");
    CHECK(fr_cl_wait_for(ctx, cl, 1, &up) == FR_OK, "%s", fr_last_error(ctx));
    size_t ns = NS;
    CHECK(FR_CL_ARGS(ctx, copy, sizeof dst, &dst, sizeof slot, &slot) == FR_OK, "args");
    CHECK(fr_cl_run(ctx, cl, copy, 1, &ns, NULL) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_read(ctx, cl, dst, 0, back, NS * sizeof(float)) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!memcmp(back, host, NS * sizeof(float)), "the step read a slot not fully uploaded");

    clReleaseEvent(rel), clReleaseEvent(up), clReleaseEvent(upx);
    free(host), free(back);
    fr_cl_release(work), fr_cl_release(slot), fr_cl_release(dst);
    clReleaseKernel(spin), clReleaseKernel(copy);
    clReleaseProgram(p);
    fr_cl_queue_free(q);
}

/* Two alternating batches of N samples for small_cnn_new. */
enum { N = 8, D = 144 };

/* Six Adam steps on batches 0, 1, 0, 1, ... (micro-batches of micro). */
static fr_status run(fr_ctx *ctx, int sync, int micro, const float *x, const int32_t *y,
                     float *losses) {
    fr_model *m = small_cnn_new(ctx);
    fr_step *s = NULL;
    fr_status st = m ? fr_model_init(m, 1) : FR_ERR_NOMEM;
    fr_step_opts o = {.batch = N,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_ADAM),
                      .seed = 1,
                      .micro_batch = micro,
                      .sync_upload = sync};
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    for (int k = 0; k < 6 && !st; k++) {
        fr_batch b = {.n = N, .x = x + (k % 2) * N * D, .y = y + (k % 2) * N};
        st = fr_step_run(s, &b, &losses[k], NULL);
    }
    fr_step_free(s);
    fr_model_free(m);
    return st;
}

static void test_steps(fr_ctx *ctx) {
    float *x = malloc(2 * N * D * sizeof *x);
    int32_t y[2 * N];
    fr_rng r = fr_rng_make(7, 3);
    for (int i = 0; i < 2 * N * D; i++) x[i] = fr_rng_next_uniform(&r);
    for (int i = 0; i < 2 * N; i++) y[i] = (int32_t)fr_rng_below(&r, 10);
    for (int micro = 0; micro <= 4; micro += 4) {
        float a[6], b[6];
        CHECK(run(ctx, 1, micro, x, y, a) == FR_OK, "synchronous: %s", fr_last_error(ctx));
        CHECK(run(ctx, 0, micro, x, y, b) == FR_OK, "two slots: %s", fr_last_error(ctx));
        for (int k = 0; k < 6; k++)
            CHECK(!memcmp(&a[k], &b[k], sizeof a[k]),
                  "micro-batch %d, step %d: loss %.9g through the slots, %.9g written by the step",
                  micro, k, (double)b[k], (double)a[k]);
    }
    fr_mem_stats ms;
    fr_mem_stats_of(ctx->dmem, &ms);
    CHECK(ms.allocated_total == 0, "%zu device bytes left after the steps", ms.allocated_total);
    free(x);
}

int main(void) {
    fr_ctx *ctx = cl_device_ctx();
    if (!ctx) return 77;
    fr_set_threads(ctx, 2);
    test_queues(ctx);
    test_steps(ctx);
    fr_cl_unuse(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
#endif
