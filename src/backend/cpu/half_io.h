/* half_io.h — which inputs and outputs the CPU kernels take in f16/bf16
 * themselves (fr_backend.half_io of the CPU backend; half_io.c). */
#ifndef FR_CPU_HALF_IO_H
#define FR_CPU_HALF_IO_H

#include "backend/backend.h"

int fr_cpu_half_io(const fr_graph *g, const fr_node *n, int j);
/* fr_backend.native16: a convolution whose image is an activation (the
 * mixed-precision pass rounds it to bf16; the batch itself stays f32) where
 * bf16 images go to oneDNN's native primitives (conv_dnnl.h); attention
 * where its bf16 tile products run (attn_tiles16.h: AVX512_BF16, an even
 * head size). */
int fr_cpu_native16(const fr_graph *g, const fr_node *n);
/* An attention node's head size: qkv x (B, T, (NH + 2 NKV) HS), NKV =
 * attr.kv_heads or NH (f: the forward node, whose attributes hold them). */
int fr_cpu_attn_hs(const fr_node *f, const fr_shape *x);

#endif
