/* test_mirror.c — where tensors live, as the engine asks it (issue 22):
 * fr_backend.mirror and mirror_bytes, and train/place.c's one question
 * fr_place_second_memory, on each backend against what backend.h states:
 *   the CPU   a mirror makes nothing, writes nothing and takes nothing of
 *             the host's fr_mem (its stats unchanged); the second memory is
 *             no; a training step leaves every parameter and batch on the
 *             host (no ddata, no batch buffers, no feed);
 *   a device  (PoCL in CI; skipped parts without one) a mirror of n bytes
 *             takes n of the device's fr_mem in its category, holds src's
 *             bytes (read back), a second mirror into the same buffer
 *             writes without a new allocation, src NULL makes only; the
 *             second memory is yes; a training step mirrors every
 *             parameter, and its batch goes through the feed, or into a
 *             micro-batch's buffers with sync_upload. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "backend/backend.h"
#include "core/ctx.h"
#include "frugal.h"
#include "core/mem.h"
#include "train/place.h"
#include "small_cnn.h"
#if FR_HAVE_OPENCL
#include "cl_device.h"
#endif

enum { N = 64, D = 144 };

/* One training step of the small CNN on ctx; the step is left for the
 * caller to inspect and free. */
static fr_step *one_step(fr_ctx *ctx, fr_model **mo, int sync_upload, const float *x,
                         const int32_t *y) {
    fr_model *m = small_cnn_new(ctx);
    fr_step *s = NULL;
    fr_status st = m ? fr_model_init(m, 3) : FR_ERR_NOMEM;
    fr_step_opts o = {.batch = N,
                      .training = 1,
                      .optim = fr_optim_defaults(FR_OPTIM_SGD),
                      .seed = 1,
                      .sync_upload = sync_upload};
    if (!st && !(s = fr_step_compile(m, &o))) st = FR_ERR_NOMEM;
    fr_batch b = {.n = N, .x = x, .y = y};
    float loss;
    int c;
    if (!st) st = fr_step_run(s, &b, &loss, &c);
    CHECK(st == FR_OK, "a step (sync_upload %d): %s", sync_upload, fr_last_error(ctx));
    *mo = m;
    return s;
}

static void test_cpu(const float *x, const int32_t *y) {
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    const fr_backend *be = fr_backend_of(ctx);
    CHECK(be->mirror && be->mirror_bytes, "cpu: mirror members present");
    CHECK(!fr_place_second_memory(ctx), "cpu: its memory is the host's");
    CHECK(be->mirror_bytes(ctx, 1) == 0 && be->mirror_bytes(ctx, 1 << 20) == 0,
          "cpu: a mirror takes nothing");
    fr_mem_stats a, b;
    fr_mem_stats_of(&ctx->mem, &a);
    uint8_t src[100], host[100];
    for (int i = 0; i < 100; i++) src[i] = (uint8_t)i, host[i] = 0xee;
    void *buf = NULL, *held = host;
    CHECK(be->mirror(ctx, &buf, src, sizeof src, FR_MEM_PARAMS) == FR_OK && buf == NULL,
          "cpu: a mirror makes no buffer");
    CHECK(be->mirror(ctx, &held, src, sizeof src, FR_MEM_PARAMS) == FR_OK && held == host,
          "cpu: a mirror keeps the handle it is given");
    int untouched = 1;
    for (int i = 0; i < 100; i++) untouched &= host[i] == 0xee;
    CHECK(untouched, "cpu: a mirror writes nothing");
    fr_mem_stats_of(&ctx->mem, &b);
    CHECK(b.num_allocs == a.num_allocs && b.allocated_total == a.allocated_total,
          "cpu: a mirror allocates nothing (%llu -> %llu allocations)",
          (unsigned long long)a.num_allocs, (unsigned long long)b.num_allocs);

    fr_model *m = NULL;
    fr_step *s = one_step(ctx, &m, 0, x, y);
    if (s && m) {
        int none = 1;
        for (size_t i = 0; i < m->n_params; i++) none &= m->params[i].ddata == NULL;
        CHECK(none, "cpu: no parameter has a copy");
        CHECK(!s->place.dev_x && !s->place.dev_y && !s->place.feed,
              "cpu: the batch is bound in place (no buffers, no feed)");
    }
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
}

#if FR_HAVE_OPENCL
static void test_device(fr_ctx *ctx, const float *x, const int32_t *y) {
    const fr_backend *be = fr_backend_of(ctx);
    CHECK(fr_place_second_memory(ctx), "device: its memory is a second one");
    CHECK(be->mirror_bytes(ctx, 1) == 1 && be->mirror_bytes(ctx, 12345) == 12345,
          "device: a mirror of n bytes takes n");
    enum { B = 3000 };
    uint8_t src[B], back[B];
    for (int i = 0; i < B; i++) src[i] = (uint8_t)(i * 7 + 1);
    fr_mem_stats a, b;
    fr_mem_stats_of(ctx->dmem, &a);
    void *buf = NULL;
    CHECK(be->mirror(ctx, &buf, src, B, FR_MEM_PARAMS) == FR_OK && buf, "device: mirror: %s",
          fr_last_error(ctx));
    fr_mem_stats_of(ctx->dmem, &b);
    CHECK(b.allocated[FR_MEM_PARAMS] - a.allocated[FR_MEM_PARAMS] == B &&
              b.num_allocs == a.num_allocs + 1,
          "device: one buffer of %d bytes in params (%zu more, %llu allocations)", B,
          b.allocated[FR_MEM_PARAMS] - a.allocated[FR_MEM_PARAMS],
          (unsigned long long)(b.num_allocs - a.num_allocs));
    CHECK(buf && be->read(ctx, buf, 0, back, B) == FR_OK && !memcmp(back, src, B),
          "device: the mirror holds src's bytes");
    for (int i = 0; i < B; i++) src[i] = (uint8_t)(255 - i);
    void *same = buf;
    CHECK(be->mirror(ctx, &buf, src, B, FR_MEM_PARAMS) == FR_OK && buf == same,
          "device: a second mirror keeps the buffer");
    fr_mem_stats_of(ctx->dmem, &a);
    CHECK(a.num_allocs == b.num_allocs, "device: and allocates nothing");
    CHECK(be->read(ctx, buf, 0, back, B) == FR_OK && !memcmp(back, src, B),
          "device: the second mirror's bytes are there");
    void *only = NULL;
    CHECK(be->mirror(ctx, &only, NULL, 100, FR_MEM_DATA) == FR_OK && only,
          "device: src NULL makes the buffer");
    fr_mem_stats_of(ctx->dmem, &b);
    CHECK(b.allocated[FR_MEM_DATA] - a.allocated[FR_MEM_DATA] == 100, "device: 100 bytes of data");
    be->release(ctx, buf);
    be->release(ctx, only);

    for (int sync = 0; sync < 2; sync++) {
        fr_model *m = NULL;
        fr_step *s = one_step(ctx, &m, sync, x, y);
        if (s && m) {
            int all = 1;
            for (size_t i = 0; i < m->n_params; i++) all &= m->params[i].ddata != NULL;
            CHECK(all, "device: every parameter has a copy");
            if (sync)
                CHECK(s->place.dev_x && s->place.dev_y && !s->place.feed,
                      "device, sync_upload: a micro-batch's buffers, no feed");
            else CHECK(s->place.feed && !s->place.dev_x, "device: the batch goes through the feed");
        }
        fr_step_free(s);
        fr_model_free(m);
    }
    fr_mem_stats_of(ctx->dmem, &a);
    CHECK(a.allocated_total == 0, "device: %zu bytes left", a.allocated_total);
}
#endif

int main(void) {
    float *x = malloc(N * D * sizeof *x);
    int32_t *y = malloc(N * sizeof *y);
    for (int i = 0; i < N * D; i++) x[i] = (float)((i * 37) % 101) / 101.0f;
    for (int i = 0; i < N; i++) y[i] = i % 10;
    test_cpu(x, y);
#if FR_HAVE_OPENCL
    fr_ctx *dev = cl_device_ctx();
    if (dev) {
        fr_set_threads(dev, 2);
        test_device(dev, x, y);
        fr_cl_unuse(dev);
        fr_ctx_free(dev);
    }
#endif
    free(x);
    free(y);
    return check_done();
}
