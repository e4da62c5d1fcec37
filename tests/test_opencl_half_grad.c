/* test_opencl_half_grad.c — the training step's whole-gradient passes on a
 * 16-bit gradient on the OpenCL device (pure half precision, --precision
 * fp16|bf16): the loss scaler's unscale with its inf/NaN check, clipping's
 * sum of squares and its rescale (fr_cl_grad_unscale, fr_cl_grad_sumsq,
 * fr_cl_grad_scale), against the CPU backend's fr_k_grad_* on the same
 * values. Both widen exactly, compute in f32 and round back to nearest
 * even, so the results are compared bit for bit; the sum of squares is
 * summed in double in the same blocks and order, bit for bit where the
 * device has cl_khr_fp64 (else within 1e-6 relative: float partial sums).
 * The gradient sits 64 bytes into its buffer, the values around it must stay
 * untouched; sizes cross the 2048-value blocks. Returns 77 without a device. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#ifndef FR_HAVE_OPENCL
int main(void) {
    puts("skipped: frugal built without OpenCL");
    return 77;
}
#else
#include "backend/cpu/kernels.h"
#include "backend/opencl/elementwise.h"
#include "backend/opencl/reduce.h"
#include "cl_device.h"
#include "core/half.h"

#define OFF 32 /* elements (64 bytes) before the gradient; as many after */

static fr_ctx *g_dev;
static fr_cl *g_cl;

static unsigned long long g_rng = 0x2545f4914f6cdd1dull;
static float urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static uint16_t narrow(fr_dtype dt, float x) {
    return dt == FR_F16 ? fr_f32_to_f16(x) : fr_f32_to_bf16(x);
}

/* n 16-bit values of magnitudes from 2^-20 to 2^10 (f16: subnormals too) */
static uint16_t *values(fr_dtype dt, size_t n) {
    uint16_t *h = calloc(n ? n : 1, sizeof *h); /* (zeroed: GCC's -O1 sees n = 0 paths) */
    if (!h) {
        fputs("test_opencl_half_grad: out of host memory\n", stderr);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) h[i] = narrow(dt, urand() * ldexpf(1.0f, (int)(i % 31) - 20));
    return h;
}

/* a device buffer: OFF guards of 0xABCD, the n values, OFF guards */
static cl_mem put(const uint16_t *h, size_t n) {
    size_t total = n + 2 * OFF;
    uint16_t *all = malloc(total * sizeof *all);
    for (size_t i = 0; i < total; i++) all[i] = 0xABCD;
    memcpy(all + OFF, h, n * sizeof *h);
    cl_mem m = NULL;
    CHECK(fr_cl_alloc(g_dev, g_cl, total * 2, &m) == FR_OK, "%s", fr_last_error(g_dev));
    CHECK(fr_cl_write(g_dev, g_cl, m, 0, all, total * 2) == FR_OK, "%s", fr_last_error(g_dev));
    free(all);
    return m;
}

/* reads the n values back; 0 when a guard changed */
static int get(cl_mem m, uint16_t *h, size_t n) {
    size_t total = n + 2 * OFF;
    uint16_t *all = malloc(total * sizeof *all);
    CHECK(fr_cl_read(g_dev, g_cl, m, 0, all, total * 2) == FR_OK, "%s", fr_last_error(g_dev));
    int ok = 1;
    for (size_t i = 0; i < OFF; i++) ok &= all[i] == 0xABCD && all[OFF + n + i] == 0xABCD;
    memcpy(h, all + OFF, n * sizeof *h);
    free(all);
    return ok;
}

/* unscale (with a value poisoned at `bad`, or none: SIZE_MAX), then scale */
static void passes(fr_dtype dt, size_t n, float inv, float f, size_t bad, float poison) {
    const char *nm = dt == FR_F16 ? "f16" : "bf16";
    uint16_t *h = values(dt, n), *want = malloc(n * 2), *got = malloc(n * 2);
    if (bad < n) h[bad] = narrow(dt, poison);
    /* sum of squares */
    double s_cpu = fr_k_grad_sumsq(h, dt, n), s_dev = -1;
    cl_mem m = put(h, n);
    CHECK(fr_cl_grad_sumsq(g_dev, g_cl, m, OFF, dt, n, &s_dev) == FR_OK, "%s",
          fr_last_error(g_dev));
    if (fr_cl_info_of(g_cl)->fp64 || !isfinite(s_cpu))
        CHECK(memcmp(&s_cpu, &s_dev, sizeof s_cpu) == 0 || (isnan(s_cpu) && isnan(s_dev)),
              "%s n %zu: sumsq %.17g, CPU %.17g", nm, n, s_dev, s_cpu);
    else
        CHECK(fabs(s_dev - s_cpu) <= 1e-6 * s_cpu, "%s n %zu: sumsq %.9g, CPU %.9g", nm, n, s_dev,
              s_cpu);
    /* unscale and its check */
    memcpy(want, h, n * 2);
    int inf_cpu = fr_k_grad_unscale(want, dt, n, inv), inf_dev = -1;
    CHECK(fr_cl_grad_unscale(g_dev, g_cl, m, OFF, dt, n, inv, &inf_dev) == FR_OK, "%s",
          fr_last_error(g_dev));
    CHECK(inf_dev == inf_cpu && inf_cpu == (bad < n && !isfinite(poison)),
          "%s n %zu: found_inf %d, CPU %d", nm, n, inf_dev, inf_cpu);
    CHECK(get(m, got, n), "%s n %zu: unscale wrote around the gradient", nm, n);
    CHECK(!memcmp(got, want, n * 2), "%s n %zu: unscale: not the CPU's bits", nm, n);
    /* scale */
    fr_k_grad_scale(want, dt, n, f);
    CHECK(fr_cl_grad_scale(g_dev, g_cl, m, OFF, dt, n, f) == FR_OK, "%s", fr_last_error(g_dev));
    CHECK(get(m, got, n), "%s n %zu: scale wrote around the gradient", nm, n);
    CHECK(!memcmp(got, want, n * 2), "%s n %zu: scale: not the CPU's bits", nm, n);
    printf("%-4s n %5zu inv %g f %g: sumsq %.9g, found_inf %d, the CPU's bits\n", nm, n, inv, f,
           s_dev, inf_dev);
    fr_cl_release(m);
    free(h), free(want), free(got);
}

int main(void) {
    g_dev = cl_device_ctx();
    if (!g_dev) return 77;
    g_cl = fr_cl_of(g_dev);
    const fr_dtype dts[2] = {FR_F16, FR_BF16};
    for (int k = 0; k < 2; k++) {
        fr_dtype dt = dts[k];
        passes(dt, 1, 0.5f, 3.0f, SIZE_MAX, 0);
        passes(dt, 2047, 1.0f / 65536, 0.3f, SIZE_MAX, 0);
        passes(dt, 5001, 1.0f / 1024, 0.7f, SIZE_MAX, 0);
        passes(dt, 5001, 1.0f / 1024, 0.7f, 4321, INFINITY);
        passes(dt, 4096, 2.0f, 0.1f, 17, NAN);
        passes(dt, 300, 64.0f, 1000.0f, SIZE_MAX, 0); /* f16 overflows to inf: rounded so */
    }
    /* a dtype the passes do not take */
    double s;
    int found;
    CHECK(fr_cl_grad_sumsq(g_dev, g_cl, NULL, 0, FR_I32, 4, &s) == FR_ERR_ARG &&
              strstr(fr_last_error(g_dev), "sumsq: a gradient of dtype i32"),
          "i32 sumsq: %s", fr_last_error(g_dev));
    CHECK(fr_cl_grad_unscale(g_dev, g_cl, NULL, 0, FR_I32, 4, 1.0f, &found) == FR_ERR_ARG &&
              strstr(fr_last_error(g_dev), "unscale: a gradient of dtype i32"),
          "i32 unscale: %s", fr_last_error(g_dev));
    fr_cl_unuse(g_dev);
    fr_ctx_free(g_dev);
    return check_done();
}
#endif
