/* backend.c — the OpenCL backend (see backend.h): its table, its workspace
 * sizes, the device's memory (an fr_mem over buffers of the device) and
 * the uploads beside the step on a queue of their own. */
#include "backend/opencl/backend.h"
#include "backend/opencl/attention.h"
#include "backend/opencl/elementwise.h"
#include "backend/opencl/gemm.h"
#include "backend/opencl/optim.h"
#include "backend/opencl/reduce.h"
#include <clblast_c.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* VIEW has no kernel on any backend (fr_op_info.view), nor OPTIM_STEP: the
 * executor hands it to the optimizer (exec.h, param_step). */
#define fr_cl_k_view NULL
#define fr_cl_k_optim_step NULL

/* One row per op of FR_OPS, each naming fr_cl_k_<name>: an op without an
 * OpenCL kernel fails to link. */
#define FR_CL_ROW(NAME, name, nin, nout) [FR_OP_##NAME] = fr_cl_k_##name,
static const fr_kernel_fn cl_kernels[FR_OP_COUNT] = {FR_OPS(FR_CL_ROW)};
#undef FR_CL_ROW

/* The device's workspaces: what its kernels ask for (j = -1: the step's
 * GEMM scratch, CLBlast's temporary buffers). */
static int64_t cl_ws(const fr_graph *g, const fr_node *n, int j) {
    if (j == -1) return fr_cl_ws_gemm(g, n);
    switch (n->op) {
    case FR_OP_CONV2D: return fr_cl_ws_conv2d(g, n, j);
    case FR_OP_CONV2D_BWD: return fr_cl_ws_conv2d_bwd(g, n, j);
    case FR_OP_QLINEAR:
    case FR_OP_QLINEAR_BWD: return fr_cl_ws_qlinear(g, n, j);
    case FR_OP_ATTENTION:
    case FR_OP_ATTENTION_BWD: return j == 2 ? fr_cl_ws_attention(g, n, j) : 0;
    case FR_OP_LINEAR_CE:
    case FR_OP_LINEAR_CE_BWD: return fr_cl_ws_linear_ce(g, n, j);
    default: return 0;
    }
}

/* ---- the step's whole-tensor passes ---- */

static int cl_optim_update(fr_ctx *ctx, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                           const fr_tensor *g, fr_tensor *state, int state_kind) {
    return fr_cl_optim_update(ctx, fr_cl_of(ctx), o, t, p, g, state, state_kind);
}

static int cl_grad_unscale(fr_ctx *ctx, fr_tensor *g, float inv, int *found_inf) {
    return fr_cl_grad_unscale(ctx, fr_cl_of(ctx), fr_cl_mem(g), fr_cl_off(g), g->dtype,
                              (size_t)fr_shape_numel(&g->shape), inv, found_inf);
}

static int cl_grad_sumsq(fr_ctx *ctx, const fr_tensor *g, double *out) {
    return fr_cl_grad_sumsq(ctx, fr_cl_of(ctx), fr_cl_mem(g), fr_cl_off(g), g->dtype,
                            (size_t)fr_shape_numel(&g->shape), out);
}

static int cl_grad_scale(fr_ctx *ctx, fr_tensor *g, float f) {
    return fr_cl_grad_scale(ctx, fr_cl_of(ctx), fr_cl_mem(g), fr_cl_off(g), g->dtype,
                            (size_t)fr_shape_numel(&g->shape), f);
}

static int cl_hits(fr_ctx *ctx, const fr_tensor *z, const fr_tensor *y, int64_t *out) {
    const fr_shape *zs = &z->shape;
    int64_t K = zs->d[zs->ndim - 1], N = fr_shape_numel(zs) / (K ? K : 1);
    if (N > INT32_MAX || K > INT32_MAX)
        return fr_fail(ctx, FR_ERR_ARG, "opencl: hits of %lld rows of %lld logits: too many",
                       (long long)N, (long long)K);
    return fr_cl_hits(ctx, fr_cl_of(ctx), fr_cl_mem(z), fr_cl_off(z), fr_cl_mem(y), fr_cl_off(y),
                      (int)N, (int)K, out);
}

/* ---- the device's memory ---- */

typedef struct cl_source {
    fr_ctx *ctx;
    fr_cl *cl;
} cl_source;

static void *src_take(void *self, size_t bytes) {
    cl_source *s = self;
    cl_mem m = NULL;
    return fr_cl_alloc(s->ctx, s->cl, bytes, &m) ? NULL : (void *)m;
}

static void src_give(void *self, void *handle) {
    (void)self;
    fr_cl_release((cl_mem)handle);
}

typedef struct cl_full {
    fr_cl_state st; /* first: ctx->dev points at it */
    cl_source src;
    double copy_rate, flop_rate; /* measured on first use (0: not yet) */
} cl_full;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Host <-> device: 8 MiB down and back, the best of 3 (a buffer outside the
 * accounting: it lives only here). */
static double cl_copy_rate(fr_ctx *ctx) {
    cl_full *f = ctx->dev;
    if (f->copy_rate > 0) return f->copy_rate;
    const size_t n = 8u << 20;
    char *host = malloc(n);
    cl_mem m = NULL;
    if (host && !fr_cl_alloc(ctx, f->st.cl, n, &m)) {
        memset(host, 1, n);
        double best = 0;
        for (int k = 0; k < 3; k++) {
            double t0 = seconds();
            if (fr_cl_write(ctx, f->st.cl, m, 0, host, n) ||
                fr_cl_read(ctx, f->st.cl, m, 0, host, n))
                break;
            double dt = seconds() - t0;
            if (dt > 0 && 2.0 * (double)n / dt > best) best = 2.0 * (double)n / dt;
        }
        f->copy_rate = best;
    }
    fr_cl_release(m);
    free(host);
    return f->copy_rate;
}

/* A 256^3 SGEMM through CLBlast after one warm-up call (which compiles). */
static double cl_flop_rate(fr_ctx *ctx) {
    cl_full *f = ctx->dev;
    if (f->flop_rate > 0) return f->flop_rate;
    const size_t n = 256, bytes = n * n * sizeof(float);
    cl_mem a = NULL, b = NULL, c = NULL;
    if (!fr_cl_alloc(ctx, f->st.cl, bytes, &a) && !fr_cl_alloc(ctx, f->st.cl, bytes, &b) &&
        !fr_cl_alloc(ctx, f->st.cl, bytes, &c) && !fr_cl_zero(ctx, f->st.cl, a, 0, bytes) &&
        !fr_cl_zero(ctx, f->st.cl, b, 0, bytes)) {
        cl_command_queue q = fr_cl_queue(f->st.cl);
        double best = 0;
        for (int k = 0; k < 3; k++) {
            double t0 = seconds();
            if (CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n,
                             1.0f, a, 0, n, b, 0, n, 0.0f, c, 0, n, &q, NULL) != CLBlastSuccess ||
                fr_cl_finish(ctx, f->st.cl))
                break;
            double dt = seconds() - t0;
            if (k && dt > 0 && 2.0 * (double)(n * n * n) / dt > best)
                best = 2.0 * (double)(n * n * n) / dt;
        }
        f->flop_rate = best;
    }
    fr_cl_release(a);
    fr_cl_release(b);
    fr_cl_release(c);
    return f->flop_rate;
}

/* A CPU device (PoCL) copies with the cores its kernels run on: nothing is
 * hidden; a GPU's copy engine runs beside its kernels. */
static double cl_copy_overlap(fr_ctx *ctx) { return fr_cl_info_of(fr_cl_of(ctx))->cpu ? 0.0 : 1.0; }

static void *cl_alloc(fr_ctx *ctx, size_t bytes, fr_mem_cat cat) {
    return fr_mem_take(ctx, fr_cl_memory(ctx), bytes, cat);
}
static void cl_release(fr_ctx *ctx, void *buf) { fr_mem_give(ctx, fr_cl_memory(ctx), buf); }
static void *cl_arena_alloc(fr_ctx *ctx, size_t bytes) {
    return fr_mem_take_arena(ctx, fr_cl_memory(ctx), bytes);
}
static void cl_track(fr_ctx *ctx, fr_mem_cat cat, int64_t delta) {
    fr_mem_track_of(fr_cl_memory(ctx), cat, delta);
}
static int cl_write(fr_ctx *ctx, void *buf, size_t off, const void *src, size_t n) {
    return fr_cl_write(ctx, fr_cl_of(ctx), (cl_mem)buf, off, src, n);
}
static int cl_read(fr_ctx *ctx, void *buf, size_t off, void *dst, size_t n) {
    return fr_cl_read(ctx, fr_cl_of(ctx), (cl_mem)buf, off, dst, n);
}
static int cl_zero(fr_ctx *ctx, void *buf, size_t off, size_t n) {
    return fr_cl_zero(ctx, fr_cl_of(ctx), (cl_mem)buf, off, n);
}
static int cl_finish(fr_ctx *ctx) { return fr_cl_finish(ctx, fr_cl_of(ctx)); }
/* The host's bytes copied into a buffer of the device's own (made once). */
static int cl_mirror(fr_ctx *ctx, void **buf, const void *src, size_t n, fr_mem_cat cat) {
    if (!*buf && !(*buf = cl_alloc(ctx, n, cat))) return FR_ERR_NOMEM;
    return src ? cl_write(ctx, *buf, 0, src, n) : FR_OK;
}
static size_t cl_mirror_bytes(fr_ctx *ctx, size_t n) {
    (void)ctx;
    return n;
}
static size_t cl_max_buffer(fr_ctx *ctx) { return fr_cl_info_of(fr_cl_of(ctx))->max_alloc; }

/* CL_DEVICE_GLOBAL_MEM_SIZE; FRUGAL_CL_GLOBAL_MEM=<bytes> reports less (a
 * testing knob: the check against it is the one real devices get). */
static size_t cl_global_mem(fr_ctx *ctx) {
    size_t g = fr_cl_info_of(fr_cl_of(ctx))->global_mem;
    const char *env = getenv("FRUGAL_CL_GLOBAL_MEM");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == 0 && v > 0 && v < g) g = (size_t)v;
    }
    return g;
}

/* ---- uploads beside the step (train/feed.c): a profiled queue of their
 * own, ordered against the step's queue by cl_events ---- */

static int cl_upload_open(fr_ctx *ctx, void **queue) {
    cl_command_queue q = NULL;
    int st = fr_cl_queue_new(ctx, fr_cl_of(ctx), &q);
    *queue = q;
    return st;
}

static void cl_upload_close(fr_ctx *ctx, void *queue) {
    (void)ctx;
    fr_cl_queue_free((cl_command_queue)queue);
}

/* Flushed, so it starts now. No context: the message goes into err. */
static int cl_upload(void *queue, void *buf, size_t off, const void *src, size_t n, void *after,
                     void **done, char *err, size_t errlen) {
    cl_command_queue q = queue;
    cl_event wait = after, ev = NULL;
    cl_int e = clEnqueueWriteBuffer(q, (cl_mem)buf, CL_FALSE, off, n, src, wait ? 1 : 0,
                                    wait ? &wait : NULL, &ev);
    if (e == CL_SUCCESS) e = clFlush(q);
    *done = ev;
    if (e == CL_SUCCESS) return FR_OK;
    snprintf(err, errlen, "clEnqueueWriteBuffer of %zu bytes at %zu on the upload queue: %s (%d)",
             n, off, fr_cl_errstr(e), (int)e);
    return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES ||
                   e == CL_OUT_OF_HOST_MEMORY
               ? FR_ERR_NOMEM
               : FR_ERR_IO;
}

static int cl_upload_finish(fr_ctx *ctx, void *queue) {
    return fr_cl_check(ctx, clFinish((cl_command_queue)queue), "clFinish (the upload queue)");
}

static int cl_event_mark(fr_ctx *ctx, void **out) {
    cl_event ev = NULL;
    int st = fr_cl_mark(ctx, fr_cl_of(ctx), &ev);
    *out = ev;
    return st;
}

static int cl_event_order(fr_ctx *ctx, void *event) {
    if (!event) return FR_OK;
    const cl_event ev = event;
    return fr_cl_wait_for(ctx, fr_cl_of(ctx), 1, &ev);
}

static int cl_event_wait(fr_ctx *ctx, void *event) {
    if (!event) return FR_OK;
    const cl_event ev = event;
    return fr_cl_check(ctx, clWaitForEvents(1, &ev), "clWaitForEvents");
}

static void cl_event_release(void *event) {
    if (event) clReleaseEvent((cl_event)event);
}

static double event_us(cl_event e, cl_profiling_info what) {
    cl_ulong t = 0;
    if (e) clGetEventProfilingInfo(e, what, sizeof t, &t, NULL);
    return (double)t * 1e-3;
}

static void cl_event_times(void *event, double *start_us, double *end_us) {
    *start_us = event_us((cl_event)event, CL_PROFILING_COMMAND_START);
    *end_us = event_us((cl_event)event, CL_PROFILING_COMMAND_END);
}

/* The device's kernels take 16 bits more widely than the CPU's (reduce.c's
 * pooling and BatchNorm at any plane size, gemm.c's im2col, though not its
 * direct 1x1 path); answering as the CPU does keeps a device step's plan,
 * values and memory those of the host's step (tests/test_golden.sh). Except
 * where the CPU's kernels do what the device's do not: a bf16 GEMM's 16-bit
 * y (no bf16 GEMM here), LayerNorm's 16-bit y and its backward's 16-bit x,
 * GELU's and ReLU's 16-bit x (elementwise.cl reads an f32 x), attention's
 * 16-bit qkv and y, BatchNorm's 16-bit x and y and a convolution's 16-bit
 * y; the values are the same (a CAST does the rounding or widening), the
 * memory a little more. */
/* The fused SGD step's weight gradient, whole (opencl/gemm.c). */
static size_t cl_upd_tile(fr_ctx *ctx, int64_t out, int64_t in, int64_t rows) {
    (void)ctx, (void)rows;
    return (size_t)(out * in);
}

static int cl_half_io(const fr_graph *g, const fr_node *n, int j) {
    if (j == -2) return 0; /* no 16-bit copies: a CAST makes them */
    switch (n->op) {
    case FR_OP_LINEAR:
    case FR_OP_ATTENTION:
    case FR_OP_ATTENTION_BWD:
    case FR_OP_LAYERNORM:
    case FR_OP_LAYERNORM_BWD:
    case FR_OP_GELU:
    case FR_OP_RELU:
    case FR_OP_BATCHNORM: return 0;
    case FR_OP_CONV2D: return j == -1 ? 0 : fr_cpu_backend.half_io(g, n, j);
    default: return fr_cpu_backend.half_io(g, n, j);
    }
}

const fr_backend fr_cl_backend = {
    .name = "opencl",
    .kernels = cl_kernels,
    .ws_elems = cl_ws,
    .alloc = cl_alloc,
    .release = cl_release,
    .arena_alloc = cl_arena_alloc,
    .arena_free = cl_release,
    .track = cl_track,
    .write = cl_write,
    .read = cl_read,
    .zero = cl_zero,
    .finish = cl_finish,
    .max_buffer = cl_max_buffer,
    .global_mem = cl_global_mem,
    .copy_rate = cl_copy_rate,
    .flop_rate = cl_flop_rate,
    .copy_overlap = cl_copy_overlap,
    .wait_copy = fr_cl_wait_copy,
    .optim_update = cl_optim_update,
    .grad_unscale = cl_grad_unscale,
    .grad_sumsq = cl_grad_sumsq,
    .grad_scale = cl_grad_scale,
    .hits = cl_hits,
    .upload_open = cl_upload_open,
    .upload_close = cl_upload_close,
    .upload = cl_upload,
    .upload_finish = cl_upload_finish,
    .event_mark = cl_event_mark,
    .event_order = cl_event_order,
    .event_wait = cl_event_wait,
    .event_release = cl_event_release,
    .event_times = cl_event_times,
    .half_io = cl_half_io,
    .upd_tile = cl_upd_tile,
    .mirror = cl_mirror,
    .mirror_bytes = cl_mirror_bytes,
};

int fr_cl_use(fr_ctx *ctx, int index) {
    if (ctx->dev) return fr_fail(ctx, FR_ERR_ARG, "opencl: this context already uses a device");
    cl_full *f = calloc(1, sizeof *f);
    if (!f) return fr_fail(ctx, FR_ERR_NOMEM, "opencl: out of memory opening device %d", index);
    int st = fr_cl_open(ctx, index, &f->st.cl);
    if (st) {
        free(f);
        return st;
    }
    f->src = (cl_source){ctx, f->st.cl};
    const fr_mem_source src = {src_take, src_give, &f->src, "the OpenCL device"};
    if (fr_mem_init_source(&f->st.mem, &src, &fr_mem_device_classes)) {
        fr_cl_close(f->st.cl);
        free(f);
        return fr_fail(ctx, FR_ERR_NOMEM, "opencl: the device's allocator could not start");
    }
    ctx->dev = f;
    ctx->dmem = &f->st.mem;
    ctx->be = &fr_cl_backend;
    snprintf(ctx->dev_name, sizeof ctx->dev_name, "opencl:%d (%.160s)", index,
             fr_cl_info_of(f->st.cl)->name);
    for (char *ch = ctx->dev_name; *ch; ch++) /* printed inside JSON strings */
        if (*ch == '"' || *ch == '\\' || (unsigned char)*ch < 0x20) *ch = '_';
    return FR_OK;
}

void fr_cl_unuse(fr_ctx *ctx) {
    if (!ctx || !ctx->dev) return;
    cl_full *f = ctx->dev;
    fr_mem_destroy(&f->st.mem);
    fr_cl_close(f->st.cl);
    free(f);
    ctx->dev = NULL;
    ctx->dmem = NULL;
    ctx->dev_name[0] = 0;
    ctx->be = NULL;
}
