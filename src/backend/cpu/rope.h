/* rope.h — rotary position embeddings as Hugging Face's Llama applies them
 * (modeling_llama.py's apply_rotary_pos_emb with rotate_half, the inverse
 * frequencies of modeling_rope_utils.py): ROPE_QKV and its backward
 * (fr_k_rope_qkv, fr_k_rope_qkv_bwd in kernels.h).
 *
 * Per head of HS values x (HS even, h2 = HS / 2), at position p, for i < h2:
 *   a = p inv_freq[i]
 *   out[i]      = x[i] cos a - x[i + h2] sin a
 *   out[i + h2] = x[i + h2] cos a + x[i] sin a
 * and the backward the transposed rotation (a rotation's inverse):
 *   dx[i] = dy[i] cos a + dy[i + h2] sin a,  dx[i + h2] = dy[i + h2] cos a - dy[i] sin a.
 * As Hugging Face computes them (float32 tensors): inv_freq[i] a float, the
 * angle the float product inv_freq[i] * float(p) (its matmul of a (h2, 1) by
 * a (1, T) tensor: one product each), cos and sin of that float. */
#ifndef FR_ROPE_H
#define FR_ROPE_H

#include "graph/graph.h"

/* inv_freq[i] of a head size HS (i < HS / 2) for rope r (r->theta > 0):
 *  default (_compute_default_rope_parameters):
 *    inv_freq[i] = 1 / theta^(2i / HS)
 *  linear (_compute_linear_scaling_rope_parameters): inv_freq[i] / factor
 *  llama3 (_compute_llama3_parameters), with wavelen = 2 pi / inv_freq[i],
 *    low_wl = orig_context / low_freq_factor, high_wl = orig_context / high_freq_factor:
 *    wavelen > low_wl:  inv_freq[i] / factor            (low frequencies, scaled)
 *    wavelen < high_wl: inv_freq[i]                     (high frequencies, kept)
 *    else, smooth = (orig_context / wavelen - low_freq_factor)
 *                   / (high_freq_factor - low_freq_factor):
 *                   (1 - smooth) inv_freq[i] / factor + smooth inv_freq[i] */
float fr_rope_inv_freq(const fr_rope *r, int i, int HS);

#endif
