/* runtime.c — the OpenCL runtime (see runtime.h): devices over all platforms,
 * one opened device with its context and in-order queue, the embedded
 * programs built on first use, a cache of their kernels, buffers and
 * transfers. It owns no op and no tensor layout. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "backend/opencl/runtime.h"

#define FR_CL_MAX_PLATFORMS 16
#define FR_CL_MAX_DEVICES 64

typedef struct cl_cached_kernel {
    int program; /* index in fr_cl_sources */
    char *name;
    cl_kernel k;
} cl_cached_kernel;

struct fr_cl {
    fr_ctx *ctx; /* what allocated this; close frees through it */
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    cl_command_queue copy_queue; /* fr_cl_copy_queue: made on first use */
    fr_cl_info info;
    cl_program *programs; /* fr_cl_n_sources, NULL until first built */
    cl_cached_kernel *kernels;
    size_t n_kernels, cap_kernels;
    int n_compiled;      /* programs built since the compiling notice, 0 before it */
    double compiling_t0; /* when the first slow build began (CLOCK_MONOTONIC) */
};

const char *fr_cl_errstr(cl_int err) {
    switch (err) {
#define E(x) \
    case x: return #x;
        E(CL_SUCCESS)
        E(CL_DEVICE_NOT_FOUND)
        E(CL_DEVICE_NOT_AVAILABLE)
        E(CL_COMPILER_NOT_AVAILABLE)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        E(CL_OUT_OF_RESOURCES)
        E(CL_OUT_OF_HOST_MEMORY)
        E(CL_PROFILING_INFO_NOT_AVAILABLE)
        E(CL_MEM_COPY_OVERLAP)
        E(CL_IMAGE_FORMAT_MISMATCH)
        E(CL_IMAGE_FORMAT_NOT_SUPPORTED)
        E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_MAP_FAILURE)
        E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        E(CL_COMPILE_PROGRAM_FAILURE)
        E(CL_LINKER_NOT_AVAILABLE)
        E(CL_LINK_PROGRAM_FAILURE)
        E(CL_DEVICE_PARTITION_FAILED)
        E(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
        E(CL_INVALID_VALUE)
        E(CL_INVALID_DEVICE_TYPE)
        E(CL_INVALID_PLATFORM)
        E(CL_INVALID_DEVICE)
        E(CL_INVALID_CONTEXT)
        E(CL_INVALID_QUEUE_PROPERTIES)
        E(CL_INVALID_COMMAND_QUEUE)
        E(CL_INVALID_HOST_PTR)
        E(CL_INVALID_MEM_OBJECT)
        E(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
        E(CL_INVALID_IMAGE_SIZE)
        E(CL_INVALID_SAMPLER)
        E(CL_INVALID_BINARY)
        E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_PROGRAM)
        E(CL_INVALID_PROGRAM_EXECUTABLE)
        E(CL_INVALID_KERNEL_NAME)
        E(CL_INVALID_KERNEL_DEFINITION)
        E(CL_INVALID_KERNEL)
        E(CL_INVALID_ARG_INDEX)
        E(CL_INVALID_ARG_VALUE)
        E(CL_INVALID_ARG_SIZE)
        E(CL_INVALID_KERNEL_ARGS)
        E(CL_INVALID_WORK_DIMENSION)
        E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE)
        E(CL_INVALID_GLOBAL_OFFSET)
        E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_EVENT)
        E(CL_INVALID_OPERATION)
        E(CL_INVALID_GL_OBJECT)
        E(CL_INVALID_BUFFER_SIZE)
        E(CL_INVALID_MIP_LEVEL)
        E(CL_INVALID_GLOBAL_WORK_SIZE)
        E(CL_INVALID_PROPERTY)
        E(CL_INVALID_IMAGE_DESCRIPTOR)
        E(CL_INVALID_COMPILER_OPTIONS)
        E(CL_INVALID_LINKER_OPTIONS)
        E(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef E
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "CL_UNKNOWN_ERROR";
    }
}

static int is_nomem(cl_int err) {
    return err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
           err == CL_OUT_OF_HOST_MEMORY;
}

int fr_cl_check(fr_ctx *ctx, cl_int err, const char *what) {
    if (err == CL_SUCCESS) return FR_OK;
    return fr_fail(ctx, is_nomem(err) ? FR_ERR_NOMEM : FR_ERR_ARG, "%s: %s (%d)", what,
                   fr_cl_errstr(err), (int)err);
}

/* ---- devices ------------------------------------------------------------ */

/* The platforms and their devices in order. An ICD loader with no platform
 * answers CL_PLATFORM_NOT_FOUND_KHR (-1001): that is zero devices, not a
 * failure; so is a platform without devices (CL_DEVICE_NOT_FOUND). */
typedef struct cl_devices {
    int n;
    cl_platform_id platform[FR_CL_MAX_DEVICES];
    cl_device_id device[FR_CL_MAX_DEVICES];
    int n_platforms;
} cl_devices;

static int list_devices(fr_ctx *ctx, cl_devices *d) {
    cl_platform_id plats[FR_CL_MAX_PLATFORMS];
    cl_uint np = 0;
    d->n = 0;
    d->n_platforms = 0;
    cl_int err = clGetPlatformIDs(FR_CL_MAX_PLATFORMS, plats, &np);
    if (err == -1001 || (err == CL_SUCCESS && np == 0)) return FR_OK;
    if (err != CL_SUCCESS) return fr_cl_check(ctx, err, "clGetPlatformIDs");
    if (np > FR_CL_MAX_PLATFORMS) np = FR_CL_MAX_PLATFORMS;
    d->n_platforms = (int)np;
    for (cl_uint p = 0; p < np && d->n < FR_CL_MAX_DEVICES; p++) {
        cl_uint nd = 0;
        cl_uint room = (cl_uint)(FR_CL_MAX_DEVICES - d->n);
        err = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, room, d->device + d->n, &nd);
        if (err == CL_DEVICE_NOT_FOUND) continue;
        if (err != CL_SUCCESS) return fr_cl_check(ctx, err, "clGetDeviceIDs");
        if (nd > room) nd = room;
        for (cl_uint i = 0; i < nd; i++) d->platform[d->n + (int)i] = plats[p];
        d->n += (int)nd;
    }
    return FR_OK;
}

int fr_cl_count(fr_ctx *ctx, int *n) {
    cl_devices d;
    int st = list_devices(ctx, &d);
    if (st == FR_OK) *n = d.n;
    return st;
}

static int describe(fr_ctx *ctx, cl_platform_id p, cl_device_id dev, fr_cl_info *out) {
    memset(out, 0, sizeof *out);
    cl_ulong global = 0, max_alloc = 0;
    cl_uint align_bits = 0, units = 0;
    size_t ext_len = 0;
    cl_int err;
    if ((err = clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof out->platform - 1, out->platform,
                                 NULL)) != CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof out->name - 1, out->name, NULL)) !=
            CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof out->version - 1, out->version,
                               NULL)) != CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL)) !=
            CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                               NULL)) != CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits,
                               NULL)) != CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL)) !=
            CL_SUCCESS ||
        (err = clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len)) != CL_SUCCESS)
        return fr_cl_check(ctx, err, "clGetDeviceInfo");
    out->global_mem = (size_t)global;
    out->max_alloc = (size_t)max_alloc;
    out->base_align = align_bits / 8;
    out->compute_units = (int)units;
    cl_device_type type = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL) == CL_SUCCESS)
        out->cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    char *ext = fr_alloc(ctx, ext_len + 1, FR_MEM_OTHER);
    if (!ext) return FR_ERR_NOMEM;
    err = clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, ext_len, ext, NULL);
    ext[ext_len] = '\0';
    if (err == CL_SUCCESS) {
        /* whole words only: "cl_khr_fp16" is not found in "cl_khr_fp16_foo" */
        char *save = NULL;
        for (char *w = strtok_r(ext, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            if (!strcmp(w, "cl_khr_fp16")) out->fp16 = 1;
            if (!strcmp(w, "cl_khr_fp64")) out->fp64 = 1;
        }
    }
    fr_free(ctx, ext);
    return fr_cl_check(ctx, err, "clGetDeviceInfo CL_DEVICE_EXTENSIONS");
}

static int pick(fr_ctx *ctx, int index, cl_devices *d) {
    int st = list_devices(ctx, d);
    if (st != FR_OK) return st;
    if (d->n == 0)
        return fr_fail(ctx, FR_ERR_ARG,
                       "no OpenCL device found (%d platforms): install ocl-icd-libopencl1 with "
                       "pocl-opencl-icd (a CPU device) or your GPU's OpenCL driver (ICD)",
                       d->n_platforms);
    if (index < 0 || index >= d->n)
        return fr_fail(ctx, FR_ERR_ARG, "OpenCL device %d: there %s %d device%s (0..%d)", index,
                       d->n == 1 ? "is" : "are", d->n, d->n == 1 ? "" : "s", d->n - 1);
    return FR_OK;
}

int fr_cl_describe(fr_ctx *ctx, int index, fr_cl_info *out) {
    cl_devices d;
    int st = pick(ctx, index, &d);
    return st != FR_OK ? st : describe(ctx, d.platform[index], d.device[index], out);
}

int fr_cl_open(fr_ctx *ctx, int index, fr_cl **out) {
    *out = NULL;
    cl_devices d;
    int st = pick(ctx, index, &d);
    if (st != FR_OK) return st;
    fr_cl *cl = fr_calloc(ctx, sizeof *cl, FR_MEM_OTHER);
    if (!cl) return FR_ERR_NOMEM;
    cl->ctx = ctx;
    cl->platform = d.platform[index];
    cl->device = d.device[index];
    if ((st = describe(ctx, cl->platform, cl->device, &cl->info)) != FR_OK) goto fail;
    cl->programs =
        fr_calloc(ctx, (fr_cl_n_sources ? fr_cl_n_sources : 1) * sizeof(cl_program), FR_MEM_OTHER);
    if (!cl->programs) {
        st = FR_ERR_NOMEM;
        goto fail;
    }
    cl_int err;
    /* no properties: the one device names its platform */
    cl->context = clCreateContext(NULL, 1, &cl->device, NULL, NULL, &err);
    if ((st = fr_cl_check(ctx, err, "clCreateContext")) != FR_OK) goto fail;
    /* in order; profiled so that an upload queue's events (fr_cl_queue_new)
     * can be set against the step's on one clock */
    cl->queue = clCreateCommandQueue(cl->context, cl->device, CL_QUEUE_PROFILING_ENABLE, &err);
    if ((st = fr_cl_check(ctx, err, "clCreateCommandQueue")) != FR_OK) goto fail;
    *out = cl;
    return FR_OK;
fail:
    fr_cl_close(cl);
    return st;
}

void fr_cl_close(fr_cl *cl) {
    if (!cl) return;
    fr_ctx *ctx = cl->ctx;
    if (cl->queue) clFinish(cl->queue);
    if (cl->copy_queue) clFinish(cl->copy_queue);
    for (size_t i = 0; i < cl->n_kernels; i++) {
        clReleaseKernel(cl->kernels[i].k);
        fr_free(ctx, cl->kernels[i].name);
    }
    fr_free(ctx, cl->kernels);
    if (cl->programs) {
        for (int i = 0; i < fr_cl_n_sources; i++)
            if (cl->programs[i]) clReleaseProgram(cl->programs[i]);
        fr_free(ctx, cl->programs);
    }
    if (cl->queue) clReleaseCommandQueue(cl->queue);
    fr_cl_queue_free(cl->copy_queue);
    if (cl->context) clReleaseContext(cl->context);
    fr_free(ctx, cl);
}

const fr_cl_info *fr_cl_info_of(const fr_cl *cl) { return &cl->info; }
cl_command_queue fr_cl_queue(fr_cl *cl) { return cl->queue; }

/* ---- programs and kernels ---------------------------------------------- */

/* A build that found its binary in the driver's cache (PoCL's kcache, a GPU
 * driver's own) takes a few hundredths of a second of this thread's CPU
 * time; one that compiles takes from a third of a second to several. CPU
 * time, not wall time: a busy machine does not make a cached build look
 * slow. */
#define FR_CL_COMPILING_CPU_S 0.25

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Tell a waiting user (ctx->notices) that the driver is compiling: once,
 * at the first build that compiled, then a line per program built after
 * it. The kernels' first runs compile more (PoCL specializes each for its
 * work-group size, CLBlast builds its own programs), so the first step
 * waits longer than these builds; the next run finds it all cached. */
static void compiling_notice(fr_ctx *ctx, fr_cl *cl, const char *file, double t0, double cpu) {
    if (!ctx->notices) return;
    if (!cl->n_compiled) {
        if (cpu < FR_CL_COMPILING_CPU_S) return;
        cl->compiling_t0 = t0;
        fprintf(stderr,
                "compiling OpenCL kernels for %s (first run only: the driver caches them; "
                "the first step waits for it, up to a minute on a CPU device)\n",
                cl->info.name);
    }
    cl->n_compiled++;
    fprintf(stderr, "  compiled %s.cl (program %d, %.1f s so far)\n", file, cl->n_compiled,
            seconds(CLOCK_MONOTONIC) - cl->compiling_t0);
    fflush(stderr);
}

/* Build the program of the n texts one after the other (FILE names it in
 * messages). */
static int build(fr_ctx *ctx, fr_cl *cl, const char *file, const char **texts, cl_uint n,
                 cl_program *out) {
    *out = NULL;
    cl_int err;
    cl_program p = clCreateProgramWithSource(cl->context, n, texts, NULL, &err);
    char what[128];
    snprintf(what, sizeof what, "clCreateProgramWithSource %s.cl", file);
    int st = fr_cl_check(ctx, err, what);
    if (st != FR_OK) return st;
    double t0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    err = clBuildProgram(p, 1, &cl->device, "-cl-std=CL1.2", NULL, NULL);
    if (err == CL_SUCCESS) {
        compiling_notice(ctx, cl, file, t0, seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0);
        *out = p;
        return FR_OK;
    }
    /* the start of the build log: where a compiler puts the first error */
    size_t len = 0;
    char log[FR_ERR_LEN];
    log[0] = '\0';
    if (clGetProgramBuildInfo(p, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) == CL_SUCCESS &&
        len > 0) {
        char *full = fr_alloc(ctx, len + 1, FR_MEM_OTHER);
        if (full && clGetProgramBuildInfo(p, cl->device, CL_PROGRAM_BUILD_LOG, len, full, NULL) ==
                        CL_SUCCESS) {
            full[len] = '\0';
            snprintf(log, sizeof log, "%s", full);
        }
        fr_free(ctx, full);
    }
    clReleaseProgram(p);
    return fr_fail(ctx, is_nomem(err) ? FR_ERR_NOMEM : FR_ERR_ARG,
                   "clBuildProgram %s.cl on %s: %s (%d): %s", file, cl->info.name,
                   fr_cl_errstr(err), (int)err, log[0] ? log : "(no build log)");
}

int fr_cl_build(fr_ctx *ctx, fr_cl *cl, const char *file, const char *text, cl_program *out) {
    return build(ctx, cl, file, &text, 1, out);
}

/* An embedded program: prelude.cl's shared functions, then its own text,
 * numbered from its line 1 in the compiler's messages. */
static int build_embedded(fr_ctx *ctx, fr_cl *cl, int prog, cl_program *out) {
    const char *texts[3] = {"", "\n#line 1\n", fr_cl_sources[prog].text};
    for (int i = 0; i < fr_cl_n_sources; i++)
        if (!strcmp(fr_cl_sources[i].file, "prelude")) texts[0] = fr_cl_sources[i].text;
    return build(ctx, cl, fr_cl_sources[prog].file, texts, 3, out);
}

cl_kernel fr_cl_kernel(fr_ctx *ctx, fr_cl *cl, const char *file, const char *name) {
    int prog = -1;
    for (int i = 0; i < fr_cl_n_sources; i++)
        if (!strcmp(fr_cl_sources[i].file, file)) prog = i;
    if (prog < 0) {
        fr_fail(ctx, FR_ERR_ARG, "OpenCL program %s.cl: not among the %d embedded programs", file,
                fr_cl_n_sources);
        return NULL;
    }
    for (size_t i = 0; i < cl->n_kernels; i++)
        if (cl->kernels[i].program == prog && !strcmp(cl->kernels[i].name, name))
            return cl->kernels[i].k;
    if (!cl->programs[prog] && build_embedded(ctx, cl, prog, &cl->programs[prog]) != FR_OK)
        return NULL;
    if (fr_grow(ctx, (void **)&cl->kernels, &cl->cap_kernels, cl->n_kernels + 1,
                sizeof *cl->kernels, FR_MEM_OTHER) != 0)
        return NULL;
    char *copy = fr_strdup(ctx, name, FR_MEM_OTHER);
    if (!copy) return NULL;
    cl_int err;
    cl_kernel k = clCreateKernel(cl->programs[prog], name, &err);
    char what[160];
    snprintf(what, sizeof what, "clCreateKernel %s in %s.cl", name, file);
    if (fr_cl_check(ctx, err, what) != FR_OK) {
        fr_free(ctx, copy);
        return NULL;
    }
    cl->kernels[cl->n_kernels++] = (cl_cached_kernel){prog, copy, k};
    return k;
}

static void kernel_name(cl_kernel k, char *name, size_t cap) {
    if (clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, cap - 1, name, NULL) != CL_SUCCESS)
        snprintf(name, cap, "?");
    name[cap - 1] = '\0';
}

int fr_cl_arg(fr_ctx *ctx, cl_kernel k, cl_uint i, size_t size, const void *value) {
    cl_int err = clSetKernelArg(k, i, size, value);
    if (err == CL_SUCCESS) return FR_OK;
    char name[128], what[192];
    kernel_name(k, name, sizeof name);
    snprintf(what, sizeof what, "clSetKernelArg %s argument %u (%zu bytes)", name, (unsigned)i,
             size);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_args(fr_ctx *ctx, cl_kernel k, const fr_cl_argv *args, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int st = fr_cl_arg(ctx, k, (cl_uint)i, args[i].size, args[i].value);
        if (st != FR_OK) return st;
    }
    return FR_OK;
}

int fr_cl_run(fr_ctx *ctx, fr_cl *cl, cl_kernel k, cl_uint dims, const size_t *global,
              const size_t *local) {
    for (cl_uint d = 0; d < dims; d++)
        if (global[d] == 0) return FR_OK; /* nothing to do (CL refuses an empty range) */
    cl_int err = clEnqueueNDRangeKernel(cl->queue, k, dims, NULL, global, local, 0, NULL, NULL);
    if (err == CL_SUCCESS) return FR_OK;
    char name[128], what[192];
    kernel_name(k, name, sizeof name);
    snprintf(what, sizeof what, "clEnqueueNDRangeKernel %s (%u dims, global %zu)", name,
             (unsigned)dims, dims ? global[0] : 0);
    return fr_cl_check(ctx, err, what);
}

/* ---- buffers ------------------------------------------------------------ */

int fr_cl_alloc(fr_ctx *ctx, fr_cl *cl, size_t bytes, cl_mem *out) {
    *out = NULL;
    if (bytes > cl->info.max_alloc)
        return fr_fail(ctx, FR_ERR_NOMEM,
                       "OpenCL buffer of %zu bytes: larger than %s's largest buffer (%zu bytes)",
                       bytes, cl->info.name, cl->info.max_alloc);
    cl_int err;
    cl_mem m = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, bytes ? bytes : 1, NULL, &err);
    char what[96];
    snprintf(what, sizeof what, "clCreateBuffer of %zu bytes", bytes);
    int st = fr_cl_check(ctx, err, what);
    if (st == FR_OK) *out = m;
    return st;
}

void fr_cl_release(cl_mem m) {
    if (m) clReleaseMemObject(m);
}

int fr_cl_write(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, const void *src, size_t n) {
    if (n == 0) return FR_OK;
    cl_int err = clEnqueueWriteBuffer(cl->queue, m, CL_TRUE, off, n, src, 0, NULL, NULL);
    char what[96];
    snprintf(what, sizeof what, "clEnqueueWriteBuffer of %zu bytes at %zu", n, off);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_read(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, void *dst, size_t n) {
    if (n == 0) return FR_OK;
    cl_int err = clEnqueueReadBuffer(cl->queue, m, CL_TRUE, off, n, dst, 0, NULL, NULL);
    char what[96];
    snprintf(what, sizeof what, "clEnqueueReadBuffer of %zu bytes at %zu", n, off);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_copy(fr_ctx *ctx, fr_cl *cl, cl_mem dst, size_t doff, cl_mem src, size_t soff, size_t n) {
    if (n == 0) return FR_OK;
    cl_int err = clEnqueueCopyBuffer(cl->queue, src, dst, soff, doff, n, 0, NULL, NULL);
    char what[128];
    snprintf(what, sizeof what, "clEnqueueCopyBuffer of %zu bytes from %zu to %zu", n, soff, doff);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_zero(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, size_t n) {
    if (n == 0) return FR_OK;
    const cl_uchar zero = 0;
    cl_int err = clEnqueueFillBuffer(cl->queue, m, &zero, 1, off, n, 0, NULL, NULL);
    char what[96];
    snprintf(what, sizeof what, "clEnqueueFillBuffer of %zu zero bytes at %zu", n, off);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_finish(fr_ctx *ctx, fr_cl *cl) {
    return fr_cl_check(ctx, clFinish(cl->queue), "clFinish");
}

/* ---- a second queue and events ----------------------------------------- */

int fr_cl_queue_new(fr_ctx *ctx, fr_cl *cl, cl_command_queue *out) {
    cl_int err;
    *out = clCreateCommandQueue(cl->context, cl->device, CL_QUEUE_PROFILING_ENABLE, &err);
    int st = fr_cl_check(ctx, err, "clCreateCommandQueue (an upload queue)");
    if (st != FR_OK) *out = NULL;
    return st;
}

void fr_cl_queue_free(cl_command_queue q) {
    if (!q) return;
    clFinish(q);
    clReleaseCommandQueue(q);
}

/* A non-blocking copy between host memory and m+off on queue q after the
 * n_wait events (n = 0: a marker), flushed so other queues may wait on it. */
static int copy_on(fr_ctx *ctx, cl_command_queue q, int write, cl_mem m, size_t off, void *host,
                   size_t n, cl_uint n_wait, const cl_event *wait, cl_event *done) {
    const cl_event *w = n_wait ? wait : NULL;
    cl_int err = !n      ? clEnqueueMarkerWithWaitList(q, n_wait, w, done)
                 : write ? clEnqueueWriteBuffer(q, m, CL_FALSE, off, n, host, n_wait, w, done)
                         : clEnqueueReadBuffer(q, m, CL_FALSE, off, n, host, n_wait, w, done);
    if (err == CL_SUCCESS) err = clFlush(q);
    char what[112];
    snprintf(what, sizeof what, "%s (%s queue) of %zu bytes at %zu",
             write ? "clEnqueueWriteBuffer" : "clEnqueueReadBuffer", write ? "upload" : "copy", n,
             off);
    return fr_cl_check(ctx, err, what);
}

int fr_cl_write_on(fr_ctx *ctx, cl_command_queue q, cl_mem m, size_t off, const void *src, size_t n,
                   cl_uint n_wait, const cl_event *wait, cl_event *done) {
    return copy_on(ctx, q, 1, m, off, (void *)src, n, n_wait, wait, done);
}

int fr_cl_wait_for(fr_ctx *ctx, fr_cl *cl, cl_uint n, const cl_event *events) {
    if (n == 0) return FR_OK;
    return fr_cl_check(ctx, clEnqueueBarrierWithWaitList(cl->queue, n, events, NULL),
                       "clEnqueueBarrierWithWaitList");
}

int fr_cl_mark(fr_ctx *ctx, fr_cl *cl, cl_event *out) {
    return fr_cl_check(ctx, clEnqueueMarkerWithWaitList(cl->queue, 0, NULL, out),
                       "clEnqueueMarkerWithWaitList");
}

/* ---- the copy queue of offloaded activations ---------------------------- */

int fr_cl_copy_queue(fr_ctx *ctx, fr_cl *cl, cl_command_queue *out) {
    int st = cl->copy_queue ? FR_OK : fr_cl_queue_new(ctx, cl, &cl->copy_queue);
    *out = cl->copy_queue;
    return st;
}

int fr_cl_read_on(fr_ctx *ctx, cl_command_queue q, cl_mem m, size_t off, void *dst, size_t n,
                  cl_uint n_wait, const cl_event *wait, cl_event *done) {
    return copy_on(ctx, q, 0, m, off, dst, n, n_wait, wait, done);
}

int fr_cl_flush(fr_ctx *ctx, fr_cl *cl) { return fr_cl_check(ctx, clFlush(cl->queue), "clFlush"); }
