/* conv_dnnl.h — CONV2D and CONV2D_BWD through oneDNN's convolution
 * primitives (forward, backward-data, backward-weights). Which images take
 * them (FRUGAL_CONV, read once; conv_dnnl.c says why):
 *  - unset (or "auto"): bf16 images (bf16-mixed) where the CPU has native
 *    bf16 kernels (AVX512_BF16 or AMX); f32 and f16 ones run as GEMMs;
 *  - "dnnl": every image; "gemm": none.
 * bench/out/conv_dnnl.txt compares the paths' time. conv.c owns the ops and
 * dispatches here; im2col + GEMM there is the fallback and the reference.
 *
 * The primitives are f32, except for a bf16 image (bf16-mixed) where the
 * CPU has bf16 kernels (fr_gemm16_native: AVX512_BF16 or AMX): their
 * operands are then bf16 (W and dy rounded to nearest even by their
 * reorders), products exact and summed in f32, y, dx and dW f32. An f16
 * image, or a bf16 one elsewhere, is widened by its reorder.
 *
 * Layout: the user's tensors are NCHW/OIHW (f32; the image may be bf16),
 * or nChw16c where the layout pass blocked them (plan/layout.h); the
 * primitives take the formats oneDNN picks for the CPU (nChw16c on
 * AVX-512), into which x, W and dy are reordered where the user's differ,
 * and out of which y, dx and dW are reordered, in the node's workspace. The batch is cut into as
 * few chunks as the caller's budget for the reordered copies allows (conv.c
 * gives 32 MiB: a batch of 128 small images goes whole); dW sums the chunks
 * in chunk order. oneDNN's scratchpad is user-managed, in the same
 * workspace, so the planner's arena holds all of it.
 *
 * Bits depend on the geometry and the thread count only (oneDNN's kernels
 * split work statically). The primitives are made once per geometry and
 * thread count and kept for the process. */
#ifndef FR_CONV_DNNL_H
#define FR_CONV_DNNL_H

#include <stdint.h>

#include "backend/cpu/kernels.h"
#include "backend/kcheck.h"

/* 1 when every convolution goes to oneDNN: built with it, its engine made,
 * and FRUGAL_CONV=dnnl. Decided once per process. */
int fr_conv_dnnl_on(void);

/* 1 when a convolution of an image of dtype xdt goes to oneDNN: every image
 * with FRUGAL_CONV=dnnl; with it unset, a bf16 one where the CPU has native
 * bf16 kernels (fr_gemm16_native); never with FRUGAL_CONV=gemm. */
int fr_conv_dnnl_for(fr_dtype xdt);

/* 1 when the build has oneDNN and its CPU engine was made (the path can
 * be turned on), whatever FRUGAL_CONV says. */
int fr_conv_dnnl_built(void);

/* 1 when the path may run: built, and FRUGAL_CONV is not "gemm". A
 * convolution with a blocked operand (plan/layout.h) runs on it whatever
 * the image's dtype: the GEMM path takes NCHW only. */
int fr_conv_dnnl_allowed(void);

/* 1 when the path may run and oneDNN has kernels (not its reference
 * loops) for this geometry's three primitives with an image of dtype xdt:
 * asked of primitive descriptors only, nothing compiled or kept. */
int fr_conv_dnnl_can(const fr_conv_dims *g, fr_dtype xdt);

/* The operand flags of a CONV2D or CONV2D_BWD node (blk below): which
 * operands are nChw16c (attr.blocked: the image x, y or dy, dx) and whether
 * a CONV2D writes a bf16 y (its y's dtype ydt: bf16-mixed's stored output). */
enum { FR_CONV_BLK_X = 1, FR_CONV_BLK_Y = 2, FR_CONV_BLK_DX = 4, FR_CONV_Y16 = 8 };
int fr_conv_flags(const fr_node *n, fr_dtype ydt);

/* The name of oneDNN's implementation for this geometry's forward with an
 * image of dtype xdt, for reports and tests ("jit:avx512_core_bf16" for a
 * native bf16 one); "" when none. */
const char *fr_conv_dnnl_impl(const fr_conv_dims *g, fr_dtype xdt);

/* Floats of workspace the oneDNN path needs for this geometry on `threads`
 * threads (scratchpad and reorder buffers, the batch cut so that the copies
 * of x and y take at most `budget` floats, or one image); 0 when oneDNN has
 * no primitive for it (the GEMM path runs). backward: CONV2D_BWD (both gradients); bias:
 * the forward has one; xdt: the image's dtype (f32 or bf16); blk: the
 * operands in nChw16c (FR_CONV_BLK_*), which need no copy. */
int64_t fr_conv_dnnl_ws(const fr_conv_dims *g, int64_t budget, int backward, int bias, fr_dtype xdt,
                        int threads, int blk);

/* The kernels on the oneDNN path. They run on the caller's OpenMP thread
 * count, or on fewer when the planned workspace was sized for fewer (a
 * thread count raised after the step was compiled). FR_CONV_DNNL_DECLINE:
 * no primitive fits; the caller runs the GEMM path. */
#define FR_CONV_DNNL_DECLINE (-1)
int fr_conv_dnnl_fwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget);
int fr_conv_dnnl_bwd(fr_kernel_call *c, const fr_conv_dims *g, int64_t budget, float *dx,
                     float *dw);

#endif
