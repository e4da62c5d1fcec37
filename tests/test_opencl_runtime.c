/* test_opencl_runtime.c — the OpenCL runtime on a real device (PoCL in CI, no
 * mocks): device count and description, buffers and transfers at offsets,
 * zero and copy, runtime.cl's kernels against the same float operations on
 * the host, build errors with their log, refusals (too large a buffer, a
 * device past the last) and one CLBlast SGEMM on the runtime's queue against
 * a float64 product. Returns 77 (skipped) when no device is found. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "core/ctx.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include <math.h>
#include <clblast_c.h>
#include "backend/opencl/runtime.h"

static int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

static void test_describe(fr_ctx *ctx, int n) {
    for (int i = 0; i < n; i++) {
        fr_cl_info in;
        CHECK(fr_cl_describe(ctx, i, &in) == FR_OK, "describe %d: %s", i, fr_last_error(ctx));
        CHECK(in.name[0] && in.platform[0], "device %d: name '%s', platform '%s'", i, in.name,
              in.platform);
        CHECK(!strncmp(in.version, "OpenCL ", 7), "device %d version '%s'", i, in.version);
        CHECK(in.global_mem > 0 && in.max_alloc > 0 && in.max_alloc <= in.global_mem,
              "device %d: global %zu, max alloc %zu", i, in.global_mem, in.max_alloc);
        /* the standard's minimum: max(global/4, 128 MiB) for a full profile */
        CHECK(in.max_alloc >= in.global_mem / 4 || in.max_alloc >= (128u << 20),
              "device %d: max alloc %zu", i, in.max_alloc);
        CHECK(in.base_align >= 4 && (in.base_align & (in.base_align - 1)) == 0,
              "device %d: base align %zu bytes", i, in.base_align);
        CHECK(in.compute_units >= 1, "device %d: %d compute units", i, in.compute_units);
        CHECK((in.fp16 == 0 || in.fp16 == 1) && (in.fp64 == 0 || in.fp64 == 1), "flags %d %d",
              in.fp16, in.fp64);
    }
    fr_cl_info in;
    CHECK(fr_cl_describe(ctx, n, &in) == FR_ERR_ARG, "describe past the last");
    char want[64];
    snprintf(want, sizeof want, "%d device", n);
    CHECK(contains(fr_last_error(ctx), want), "names the count: %s", fr_last_error(ctx));
}

/* Round trip at offsets; zero and copy within and across buffers. */
static void test_buffers(fr_ctx *ctx, fr_cl *cl) {
    enum { N = 4096 };
    static unsigned char src[N], got[N], want[N];
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 3);
    cl_mem a, b;
    CHECK(fr_cl_alloc(ctx, cl, N, &a) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, N, &b) == FR_OK, "%s", fr_last_error(ctx));
    if (!a || !b) return;
    CHECK(fr_cl_write(ctx, cl, a, 0, src, N) == FR_OK, "%s", fr_last_error(ctx));
    /* a span of 1000 bytes written at 100 from src+5, read back at 100 */
    CHECK(fr_cl_write(ctx, cl, a, 100, src + 5, 1000) == FR_OK, "%s", fr_last_error(ctx));
    memcpy(want, src, N);
    memcpy(want + 100, src + 5, 1000);
    memset(got, 0, N);
    CHECK(fr_cl_read(ctx, cl, a, 100, got + 100, 1000) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!memcmp(got + 100, want + 100, 1000), "round trip at offset 100");
    CHECK(fr_cl_read(ctx, cl, a, 0, got, N) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!memcmp(got, want, N), "the bytes around the span untouched");

    /* zero 256 bytes at 64; copy 512 bytes of a at 128 to b at 256 */
    CHECK(fr_cl_zero(ctx, cl, a, 64, 256) == FR_OK, "%s", fr_last_error(ctx));
    memset(want + 64, 0, 256);
    CHECK(fr_cl_write(ctx, cl, b, 0, src, N) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_copy(ctx, cl, b, 256, a, 128, 512) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_read(ctx, cl, a, 0, got, N) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!memcmp(got, want, N), "zero: 256 bytes at 64, the rest kept");
    unsigned char wantb[N];
    memcpy(wantb, src, N);
    memcpy(wantb + 256, want + 128, 512);
    CHECK(fr_cl_read(ctx, cl, b, 0, got, N) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!memcmp(got, wantb, N), "copy: 512 bytes from a+128 to b+256");

    /* a copy past the end is an error naming the copy, not a crash */
    CHECK(fr_cl_copy(ctx, cl, b, N - 8, a, 0, 64) == FR_ERR_ARG, "copy past the end");
    CHECK(contains(fr_last_error(ctx), "clEnqueueCopyBuffer") &&
              contains(fr_last_error(ctx), "CL_INVALID_VALUE"),
          "%s", fr_last_error(ctx));
    fr_cl_release(a);
    fr_cl_release(b);
}

/* runtime.cl: fill_f32 and axpy_f32 at element offsets, against the host's
 * float a*x+y (no contraction on either side: the same bits). */
static void test_kernels(fr_ctx *ctx, fr_cl *cl) {
    enum { N = 1000, XO = 16, YO = 48, TOTAL = 1100 };
    static float x[TOTAL], y[TOTAL], got[TOTAL], want[TOTAL];
    for (int i = 0; i < TOTAL; i++) {
        x[i] = (float)sin(0.1 * i) * 3.0f;
        y[i] = (float)cos(0.37 * i) - 0.5f;
    }
    cl_mem bx, by;
    CHECK(fr_cl_alloc(ctx, cl, sizeof x, &bx) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, sizeof y, &by) == FR_OK, "%s", fr_last_error(ctx));
    if (!bx || !by) return;
    CHECK(fr_cl_write(ctx, cl, bx, 0, x, sizeof x) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_write(ctx, cl, by, 0, y, sizeof y) == FR_OK, "%s", fr_last_error(ctx));

    cl_kernel axpy = fr_cl_kernel(ctx, cl, "runtime", "axpy_f32");
    CHECK(axpy != NULL, "%s", fr_last_error(ctx));
    CHECK(fr_cl_kernel(ctx, cl, "runtime", "axpy_f32") == axpy, "the kernel is cached");
    cl_ulong n = N, xo = XO, yo = YO;
    float a = 0.7f;
    if (axpy) {
        CHECK(FR_CL_ARGS(ctx, axpy, sizeof n, &n, sizeof a, &a, sizeof bx, &bx, sizeof xo, &xo,
                         sizeof by, &by, sizeof yo, &yo) == FR_OK,
              "%s", fr_last_error(ctx));
        size_t global = 1024; /* more work-items than elements: the kernel's bound check */
        CHECK(fr_cl_run(ctx, cl, axpy, 1, &global, NULL) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(fr_cl_read(ctx, cl, by, 0, got, sizeof got) == FR_OK, "%s", fr_last_error(ctx));
        memcpy(want, y, sizeof y);
        for (int i = 0; i < N; i++) {
            volatile float ax = a * x[XO + i];
            want[YO + i] = ax + y[YO + i];
        }
        CHECK(!memcmp(got, want, sizeof got), "axpy: the host's bits, the rest untouched");
    }

    cl_kernel fill = fr_cl_kernel(ctx, cl, "runtime", "fill_f32");
    CHECK(fill != NULL, "%s", fr_last_error(ctx));
    if (fill) {
        cl_ulong off = 7, cnt = 300;
        float v = -2.25f;
        CHECK(FR_CL_ARGS(ctx, fill, sizeof bx, &bx, sizeof off, &off, sizeof cnt, &cnt, sizeof v,
                         &v) == FR_OK,
              "%s", fr_last_error(ctx));
        size_t global = 300;
        CHECK(fr_cl_run(ctx, cl, fill, 1, &global, NULL) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(fr_cl_finish(ctx, cl) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(fr_cl_read(ctx, cl, bx, 0, got, sizeof got) == FR_OK, "%s", fr_last_error(ctx));
        int bad = 0;
        for (int i = 0; i < TOTAL; i++) bad += got[i] != (i >= 7 && i < 307 ? v : x[i]);
        CHECK(bad == 0, "fill: %d elements wrong", bad);

        /* a bad argument index names the kernel and the index */
        CHECK(fr_cl_arg(ctx, fill, 9, sizeof v, &v) == FR_ERR_ARG, "argument 9 of 4");
        CHECK(contains(fr_last_error(ctx), "fill_f32") &&
                  contains(fr_last_error(ctx), "argument 9") &&
                  contains(fr_last_error(ctx), "CL_INVALID_ARG_INDEX"),
              "%s", fr_last_error(ctx));
    }
    CHECK(fr_cl_kernel(ctx, cl, "runtime", "no_such_kernel") == NULL, "unknown kernel");
    CHECK(contains(fr_last_error(ctx), "no_such_kernel") &&
              contains(fr_last_error(ctx), "CL_INVALID_KERNEL_NAME"),
          "%s", fr_last_error(ctx));
    CHECK(fr_cl_kernel(ctx, cl, "no_such_file", "k") == NULL, "unknown program");
    CHECK(contains(fr_last_error(ctx), "no_such_file.cl"), "%s", fr_last_error(ctx));
    fr_cl_release(bx);
    fr_cl_release(by);
}

static void test_build_error(fr_ctx *ctx, fr_cl *cl) {
    const char *bad = "__kernel void broken(__global float *x) {\n    x[0] = ;\n}\n";
    cl_program p = NULL;
    CHECK(fr_cl_build(ctx, cl, "broken", bad, &p) == FR_ERR_ARG, "a syntax error fails");
    CHECK(p == NULL, "no program");
    const char *e = fr_last_error(ctx);
    CHECK(contains(e, "clBuildProgram broken.cl") && contains(e, "CL_BUILD_PROGRAM_FAILURE"), "%s",
          e);
    /* the log: clang's "error: expected expression" at line 2 */
    CHECK(contains(e, "error") && contains(e, ":2:"), "the build log: %s", e);
}

/* C (m,n) = A (m,k) B (k,n), row-major, at offsets, by CLBlast on our queue. */
static void test_clblast(fr_ctx *ctx, fr_cl *cl) {
    enum { M = 37, N = 29, K = 53, AO = 5, BO = 11, CO = 3 };
    static float a[AO + M * K], b[BO + K * N], c[CO + M * N];
    for (int i = 0; i < AO + M * K; i++) a[i] = (float)((i * 37 % 101) - 50) / 25.0f;
    for (int i = 0; i < BO + K * N; i++) b[i] = (float)((i * 53 % 97) - 48) / 31.0f;
    cl_mem ba, bb, bc;
    CHECK(fr_cl_alloc(ctx, cl, sizeof a, &ba) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, sizeof b, &bb) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_cl_alloc(ctx, cl, sizeof c, &bc) == FR_OK, "%s", fr_last_error(ctx));
    if (!ba || !bb || !bc) return;
    fr_cl_write(ctx, cl, ba, 0, a, sizeof a);
    fr_cl_write(ctx, cl, bb, 0, b, sizeof b);
    fr_cl_zero(ctx, cl, bc, 0, sizeof c);
    cl_command_queue q = fr_cl_queue(cl);
    CLBlastStatusCode s =
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, M, N, K, 1.0f,
                     ba, AO, K, bb, BO, N, 0.0f, bc, CO, N, &q, NULL);
    CHECK(s == CLBlastSuccess, "CLBlastSgemm: %d", (int)s);
    CHECK(fr_cl_read(ctx, cl, bc, 0, c, sizeof c) == FR_OK, "%s", fr_last_error(ctx));
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double r = 0, mag = 0;
            for (int p = 0; p < K; p++) {
                r += (double)a[AO + i * K + p] * b[BO + p * N + j];
                mag += fabs((double)a[AO + i * K + p] * b[BO + p * N + j]);
            }
            double err = fabs(c[CO + i * N + j] - r) / (mag + 1e-30);
            if (err > worst) worst = err;
        }
    /* float32 sums of K terms: a few K*eps of the absolute sum at most */
    CHECK(worst < 4.0 * K * 6e-8, "SGEMM vs float64: worst relative error %.3g", worst);
    fr_cl_release(ba);
    fr_cl_release(bb);
    fr_cl_release(bc);
}

/* Every host allocation of open, a kernel's build and caching, and close
 * fails in turn: each failure is FR_ERR_NOMEM with a message and leaves no
 * host bytes behind; once none fails the kernel runs. */
static void test_allocation_failures(void) {
    int n, failures = 0, bad = 0;
    for (n = 1; n < 1000; n++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_mem_fail_at(ctx, (uint64_t)n);
        fr_cl *cl = NULL;
        int st = fr_cl_open(ctx, 0, &cl);
        if (st == FR_OK) {
            if (!fr_cl_kernel(ctx, cl, "runtime", "fill_f32")) st = FR_ERR_NOMEM;
            else if (!fr_cl_kernel(ctx, cl, "runtime", "axpy_f32")) st = FR_ERR_NOMEM;
        }
        int injected = ctx->mem.fail_at == 0;
        fr_cl_close(cl);
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        if (st != FR_OK) {
            failures++;
            if (st != FR_ERR_NOMEM || !fr_last_error(ctx)[0] || !injected) bad++;
        }
        if (ms.allocated[FR_MEM_OTHER] != 0) bad++;
        fr_ctx_free(ctx);
        if (st == FR_OK && !injected) break;
    }
    CHECK(n < 1000 && failures >= 3, "%d allocations failed in turn", failures);
    CHECK(bad == 0, "%d of %d injected failures unclean or leaking", bad, failures);
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    CHECK(!strcmp(fr_cl_errstr(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES"), "errstr");
    CHECK(!strcmp(fr_cl_errstr(-9999), "CL_UNKNOWN_ERROR"), "errstr of an unknown code");
    CHECK(fr_cl_check(ctx, CL_SUCCESS, "x") == FR_OK, "success");
    CHECK(fr_cl_check(ctx, CL_MEM_OBJECT_ALLOCATION_FAILURE, "clThing") == FR_ERR_NOMEM, "nomem");
    CHECK(!strcmp(fr_last_error(ctx), "clThing: CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)"), "%s",
          fr_last_error(ctx));
    CHECK(fr_cl_check(ctx, CL_INVALID_VALUE, "clOther") == FR_ERR_ARG, "arg");

    int n = 0;
    CHECK(fr_cl_count(ctx, &n) == FR_OK, "%s", fr_last_error(ctx));
    if (n == 0) {
        fr_ctx_free(ctx);
        puts("skipped: no OpenCL device");
        return 77;
    }
    test_describe(ctx, n);

    fr_cl *cl = NULL;
    CHECK(fr_cl_open(ctx, n, &cl) == FR_ERR_ARG && cl == NULL, "open past the last");
    char want[64];
    snprintf(want, sizeof want, "OpenCL device %d: there", n);
    CHECK(contains(fr_last_error(ctx), want), "names the index and count: %s", fr_last_error(ctx));
    CHECK(fr_cl_open(ctx, -1, &cl) == FR_ERR_ARG, "open -1");

    CHECK(fr_cl_open(ctx, 0, &cl) == FR_OK, "%s", fr_last_error(ctx));
    if (!cl) return check_done();
    fr_cl_info in;
    fr_cl_describe(ctx, 0, &in);
    CHECK(!strcmp(fr_cl_info_of(cl)->name, in.name), "info_of: %s", fr_cl_info_of(cl)->name);
    printf("device 0: %s (%s), %zu MiB, largest buffer %zu MiB\n", in.name, in.platform,
           in.global_mem >> 20, in.max_alloc >> 20);

    test_buffers(ctx, cl);
    test_kernels(ctx, cl);
    test_build_error(ctx, cl);

    /* more than the largest buffer: refused before the driver, naming both */
    cl_mem big = NULL;
    size_t too_big = in.max_alloc + 1;
    CHECK(fr_cl_alloc(ctx, cl, too_big, &big) == FR_ERR_NOMEM && big == NULL, "too large");
    snprintf(want, sizeof want, "%zu bytes", too_big);
    CHECK(contains(fr_last_error(ctx), want), "names the size: %s", fr_last_error(ctx));

    test_clblast(ctx, cl);
    CHECK(fr_cl_finish(ctx, cl) == FR_OK, "%s", fr_last_error(ctx));
    fr_cl_close(cl);

    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    CHECK(ms.allocated[FR_MEM_OTHER] == 0, "the runtime's host memory freed: %zu bytes left",
          ms.allocated[FR_MEM_OTHER]);
    fr_ctx_free(ctx);
    test_allocation_failures();
    return check_done();
}
#endif
