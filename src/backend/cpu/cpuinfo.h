/* cpuinfo.h — what the CPU can do and which GEMM kernels run on it: cpuid's
 * feature bits and brand string, OpenBLAS's core and build, whether that core
 * is narrower than the CPU (a generic fallback, AVX2 on AVX-512), oneDNN's
 * instruction set; the restart that makes OpenBLAS use the right core; a
 * short GEMM probe per provider. The public half (fr_cpu, fr_cpu_setup, fr_cpu_warning, fr_gemm_probe) is declared in
 * frugal.h; this header adds what the CLI prints. It does not route GEMMs:
 * fp32 GEMMs call OpenBLAS where they are (linear.c, conv.c, attention.c). */
#ifndef FR_CPUINFO_H
#define FR_CPUINFO_H

#include <stdio.h>

#include "frugal.h"

/* When OpenBLAS runs a narrower core than the CPU can, set
 * OPENBLAS_CORETYPE to the right core (and FRUGAL_BLAS_FELL_BACK to the
 * narrow one, the marker that stops a second restart) and return 1: the
 * caller then starts the program again. 0: nothing to change, or
 * FRUGAL_BLAS_FIX=0 in the environment, or this process is the restart. */
int fr_cpu_fix_env(void);

/* fr_cpu()->features without the rest of fr_cpu (no BLAS or oneDNN
 * queries): safe to call from what fr_cpu itself calls. */
unsigned fr_cpu_features(void);

/* "OpenBLAS 0.3.21 SkylakeX"; the bf16 GEMM: "oneDNN matmul avx512_core_bf16",
 * or "f32 GEMM of rounded operands" where oneDNN has no native bf16 kernel. */
const char *fr_cpu_gemm_f32(char *buf, size_t n);
const char *fr_cpu_gemm_bf16(char *buf, size_t n);

/* Where the linear layers' f32 GEMMs run: "OpenBLAS, from 2^28
 * multiply-adds oneDNN matmul avx512_core" (the default on AVX-512),
 * "oneDNN matmul avx512_core" (FRUGAL_GEMM=onednn) or "OpenBLAS" (their
 * weight gradients always do); fr_gemm32_onednn_for. */
const char *fr_cpu_linear32(char *buf, size_t n);

/* The convolutions' path: "im2col/shifted GEMMs, bf16 and nChw16c oneDNN
 * avx512_core_bf16" (the default where the CPU has native bf16: f32 NCHW
 * images on GEMMs, bf16 ones and those the layout pass blocked on oneDNN,
 * plan/layout.h), "im2col/shifted GEMMs, nChw16c oneDNN ..." (no native
 * bf16), "im2col/shifted GEMMs" (no oneDNN, or FRUGAL_CONV=gemm), or
 * "oneDNN avx512_core_bf16" (FRUGAL_CONV=dnnl); conv_dnnl.h. */
const char *fr_cpu_conv(char *buf, size_t n);

/* One line for people (no newline at the end), and a JSON object's text
 * ({"model": ..., "features": [...], ...}); rates NULL leaves the measured
 * GFLOP/s out. */
void fr_cpu_line(FILE *f, const fr_gemm_rates *rates);
void fr_cpu_json(FILE *f, const fr_gemm_rates *rates);

#endif
