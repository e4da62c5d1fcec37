/* ctx.h — the context every call carries: allocator state, thread count,
 * the last error message and the backend's open device. ctx.c itself keeps
 * no static state, but not all state is the context's: fr_set_threads also
 * sets OpenMP's thread count (of the calling thread) and OpenBLAS's (of the
 * whole process), and the CPU backend keeps process-wide caches, each made
 * once under pthread_once or an atomic (the SIMD probes of core/half.c and
 * backend/cpu/optim_state.c, the latter's quantization-map tables, oneDNN's
 * engine and stream in backend/cpu/gemm16.c, the CPU's description and
 * GEMM probe in backend/cpu/cpuinfo.c), plus optim_state.c's switch
 * for the AVX-512 paths that tests flip (fr_state_simd). */
#ifndef FR_CTX_H
#define FR_CTX_H

#include "frugal.h"
#include "core/mem.h"

#define FR_ERR_LEN 512

struct fr_ctx {
    char err[FR_ERR_LEN];
    fr_status err_status; /* the status fr_fail returned with err */
    int threads;          /* 0: OpenMP default */
    fr_mem mem;
    const struct fr_backend *be; /* NULL: the CPU (backend/backend.h) */
    void *dev;                   /* the backend's open device, if any */
    fr_mem *dmem;                /* and its memory (NULL on the CPU) */
    char dev_name[192];          /* "opencl:0 (NAME)" */
    int notices;                 /* 1: the library may tell a waiting user on stderr what it waits
                    for (the OpenCL driver compiling kernels); 0 (fr_ctx_new's
                    default): it prints nothing */
};

/* Record a message (printf-style) and return st, so callers can write
 * `return fr_fail(ctx, FR_ERR_FORMAT, "%s: byte %ld: bad magic", ...)`. */
fr_status fr_fail(fr_ctx *ctx, fr_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
