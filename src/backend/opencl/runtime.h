/* runtime.h — the OpenCL runtime of the device backend: finding devices,
 * opening one (context and its one in-order queue), building the embedded
 * programs (src/backend/opencl/kernels/FILE.cl) on first use and caching
 * their kernels, buffers and transfers. It knows nothing of ops or tensors:
 * the kernels that run ops live beside it and call it.
 *
 * Every function that can fail returns FR_OK or an fr_status with a message
 * in the context naming what failed and the CL status ("clBuildProgram
 * norm.cl on DEVICE: CL_BUILD_PROGRAM_FAILURE (-11): LOG"). Transfers are
 * blocking; kernel enqueues are not (fr_cl_finish waits for the queue). */
#ifndef FR_CL_RUNTIME_H
#define FR_CL_RUNTIME_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <stddef.h>
#include <CL/cl.h>
#include "core/ctx.h"

/* One opened device: platform, device, context, one in-order queue,
 * programs and kernels built on first use and cached. */
typedef struct fr_cl fr_cl;

typedef struct fr_cl_info {
    char name[256], platform[256], version[128];
    size_t global_mem, max_alloc, base_align; /* bytes; base_align from bits */
    int fp16, fp64, compute_units;            /* cl_khr_fp16, cl_khr_fp64 */
    int cpu; /* CL_DEVICE_TYPE_CPU: kernels and copies share the host's cores */
} fr_cl_info;

/* Devices over all platforms, in platform order (0 with no platform). */
int fr_cl_count(fr_ctx *ctx, int *n);
int fr_cl_describe(fr_ctx *ctx, int index, fr_cl_info *out);
/* No platform: an error naming the packages (ocl-icd-libopencl1,
 * pocl-opencl-icd or a GPU's ICD); an index past the last names the count.
 * The context must outlive the fr_cl (close frees through it). */
int fr_cl_open(fr_ctx *ctx, int index, fr_cl **out);
void fr_cl_close(fr_cl *cl);
const fr_cl_info *fr_cl_info_of(const fr_cl *cl);

/* A kernel of program FILE (src/backend/opencl/kernels/FILE.cl, FILE without
 * ".cl"; embedded at build time), the program built once per fr_cl with
 * "-cl-std=CL1.2", after kernels/prelude.cl (the functions every program
 * shares). The kernel is cached and owned by cl: do not release it.
 * NULL with the build log in the error on failure. */
cl_kernel fr_cl_kernel(fr_ctx *ctx, fr_cl *cl, const char *file, const char *name);
/* Build TEXT as fr_cl_kernel builds an embedded program (FILE names it in
 * messages); the caller releases *out. fr_cl_kernel's builder, open to tests
 * and tools with a source of their own. */
int fr_cl_build(fr_ctx *ctx, fr_cl *cl, const char *file, const char *text, cl_program *out);

/* Set argument i; fails naming the kernel, the index and the CL status. */
int fr_cl_arg(fr_ctx *ctx, cl_kernel k, cl_uint i, size_t size, const void *value);
typedef struct fr_cl_argv {
    size_t size;
    const void *value;
} fr_cl_argv;
int fr_cl_args(fr_ctx *ctx, cl_kernel k, const fr_cl_argv *args, size_t n);
/* FR_CL_ARGS(ctx, k, sizeof x, &x, sizeof n, &n, ...): every argument in
 * order from flat (size, pointer) pairs, up to 24; FR_OK or the first
 * failure. The pairs become a braced fr_cl_argv array (each size converted
 * to size_t, each pointer to const void *), counted at compile time. */
#define FR_CL_ARGS(ctx, k, ...)                                             \
    fr_cl_args((ctx), (k), (const fr_cl_argv[]){FR_CL_PAIRS_(__VA_ARGS__)}, \
               sizeof((const fr_cl_argv[]){FR_CL_PAIRS_(__VA_ARGS__)}) / sizeof(fr_cl_argv))
#define FR_CL_NARG_(...)                                                                          \
    FR_CL_NARG2_(__VA_ARGS__, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, \
                 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,  \
                 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define FR_CL_NARG2_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, \
                     _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32,  \
                     _33, _34, _35, _36, _37, _38, _39, _40, _41, _42, _43, _44, _45, _46, _47,  \
                     _48, N, ...)                                                                \
    N
#define FR_CL_CAT_(a, b) FR_CL_CAT2_(a, b)
#define FR_CL_CAT2_(a, b) a##b
#define FR_CL_PAIRS_(...) FR_CL_CAT_(FR_CL_P, FR_CL_NARG_(__VA_ARGS__))(__VA_ARGS__)
#define FR_CL_P2(s, v) \
    { (size_t)(s), (const void *)(v) }
#define FR_CL_P4(s, v, ...) FR_CL_P2(s, v), FR_CL_P2(__VA_ARGS__)
#define FR_CL_P6(s, v, ...) FR_CL_P2(s, v), FR_CL_P4(__VA_ARGS__)
#define FR_CL_P8(s, v, ...) FR_CL_P2(s, v), FR_CL_P6(__VA_ARGS__)
#define FR_CL_P10(s, v, ...) FR_CL_P2(s, v), FR_CL_P8(__VA_ARGS__)
#define FR_CL_P12(s, v, ...) FR_CL_P2(s, v), FR_CL_P10(__VA_ARGS__)
#define FR_CL_P14(s, v, ...) FR_CL_P2(s, v), FR_CL_P12(__VA_ARGS__)
#define FR_CL_P16(s, v, ...) FR_CL_P2(s, v), FR_CL_P14(__VA_ARGS__)
#define FR_CL_P18(s, v, ...) FR_CL_P2(s, v), FR_CL_P16(__VA_ARGS__)
#define FR_CL_P20(s, v, ...) FR_CL_P2(s, v), FR_CL_P18(__VA_ARGS__)
#define FR_CL_P22(s, v, ...) FR_CL_P2(s, v), FR_CL_P20(__VA_ARGS__)
#define FR_CL_P24(s, v, ...) FR_CL_P2(s, v), FR_CL_P22(__VA_ARGS__)
#define FR_CL_P26(s, v, ...) FR_CL_P2(s, v), FR_CL_P24(__VA_ARGS__)
#define FR_CL_P28(s, v, ...) FR_CL_P2(s, v), FR_CL_P26(__VA_ARGS__)
#define FR_CL_P30(s, v, ...) FR_CL_P2(s, v), FR_CL_P28(__VA_ARGS__)
#define FR_CL_P32(s, v, ...) FR_CL_P2(s, v), FR_CL_P30(__VA_ARGS__)
#define FR_CL_P34(s, v, ...) FR_CL_P2(s, v), FR_CL_P32(__VA_ARGS__)
#define FR_CL_P36(s, v, ...) FR_CL_P2(s, v), FR_CL_P34(__VA_ARGS__)
#define FR_CL_P38(s, v, ...) FR_CL_P2(s, v), FR_CL_P36(__VA_ARGS__)
#define FR_CL_P40(s, v, ...) FR_CL_P2(s, v), FR_CL_P38(__VA_ARGS__)
#define FR_CL_P42(s, v, ...) FR_CL_P2(s, v), FR_CL_P40(__VA_ARGS__)
#define FR_CL_P44(s, v, ...) FR_CL_P2(s, v), FR_CL_P42(__VA_ARGS__)
#define FR_CL_P46(s, v, ...) FR_CL_P2(s, v), FR_CL_P44(__VA_ARGS__)
#define FR_CL_P48(s, v, ...) FR_CL_P2(s, v), FR_CL_P46(__VA_ARGS__)

/* Enqueue k over global[0..dims) work-items (local NULL: the implementation
 * chooses the work-group size). Does not wait. A zero in global enqueues
 * nothing (OpenCL 1.2 refuses an empty range; an empty tensor is no error). */
int fr_cl_run(fr_ctx *ctx, fr_cl *cl, cl_kernel k, cl_uint dims, const size_t *global,
              const size_t *local);

/* Buffers. CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES and
 * CL_OUT_OF_HOST_MEMORY are FR_ERR_NOMEM; bytes > max_alloc is refused
 * (FR_ERR_NOMEM naming the size and the limit) before asking the driver. */
int fr_cl_alloc(fr_ctx *ctx, fr_cl *cl, size_t bytes, cl_mem *out);
void fr_cl_release(cl_mem m); /* NULL: nothing */
int fr_cl_write(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, const void *src, size_t n);
int fr_cl_read(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, void *dst, size_t n);
/* n bytes from src+soff to dst+doff, and n zero bytes at m+off: enqueued,
 * not waited for (the queue is in order). */
int fr_cl_copy(fr_ctx *ctx, fr_cl *cl, cl_mem dst, size_t doff, cl_mem src, size_t soff, size_t n);
int fr_cl_zero(fr_ctx *ctx, fr_cl *cl, cl_mem m, size_t off, size_t n);
int fr_cl_finish(fr_ctx *ctx, fr_cl *cl);
cl_command_queue fr_cl_queue(fr_cl *cl); /* for CLBlast calls */

/* A second in-order queue on cl's context (uploads beside the step's queue),
 * with CL_QUEUE_PROFILING_ENABLE; fr_cl_queue_free finishes and releases it. */
int fr_cl_queue_new(fr_ctx *ctx, fr_cl *cl, cl_command_queue *out);
void fr_cl_queue_free(cl_command_queue q); /* NULL: nothing */
/* n bytes of host src into m+off on queue q once the n_wait events of wait
 * have completed, not waited for: *done completes when the bytes are there,
 * and src must stay as it is until then. Flushed, so it starts now. */
int fr_cl_write_on(fr_ctx *ctx, cl_command_queue q, cl_mem m, size_t off, const void *src, size_t n,
                   cl_uint n_wait, const cl_event *wait, cl_event *done);
/* On cl's queue: what is enqueued after this waits for the n events (a
 * barrier); *out, an event that completes when everything enqueued before it
 * has (a marker). Both enqueued, not waited for. */
int fr_cl_wait_for(fr_ctx *ctx, fr_cl *cl, cl_uint n, const cl_event *events);
int fr_cl_mark(fr_ctx *ctx, fr_cl *cl, cl_event *out);
/* Submit what cl's queue holds (a marker another queue waits on must be). */
int fr_cl_flush(fr_ctx *ctx, fr_cl *cl);

/* The copy queue of offloaded activations (backend/opencl/offload.c): a
 * third in-order queue on cl's context, made on first use and released by
 * fr_cl_close. fr_cl_read_on is fr_cl_write_on's other direction: n bytes of
 * m+off into host dst on q once the n_wait events have completed, flushed,
 * not waited for; dst must not be touched until *done completes. */
int fr_cl_copy_queue(fr_ctx *ctx, fr_cl *cl, cl_command_queue *out);
int fr_cl_read_on(fr_ctx *ctx, cl_command_queue q, cl_mem m, size_t off, void *dst, size_t n,
                  cl_uint n_wait, const cl_event *wait, cl_event *done);

/* "CL_OUT_OF_RESOURCES" ...; "CL_UNKNOWN_ERROR" for a code it does not know. */
const char *fr_cl_errstr(cl_int err);
/* FR_OK for CL_SUCCESS, else fails "WHAT: CL_... (code)": FR_ERR_NOMEM for the
 * three out-of-memory statuses, FR_ERR_ARG for the others. */
int fr_cl_check(fr_ctx *ctx, cl_int err, const char *what);

/* The embedded programs, one per .cl file in kernels/ (generated by CMake). */
typedef struct fr_cl_source {
    const char *file; /* "runtime" for kernels/runtime.cl */
    const char *text;
} fr_cl_source;
extern const fr_cl_source fr_cl_sources[];
extern const int fr_cl_n_sources;

#endif
