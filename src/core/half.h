/* half.h — exact conversions between f32 and the 16-bit float formats:
 * IEEE binary16 (f16) and bfloat16 (bf16), round to nearest even, with
 * subnormals, infinities and NaN handled as IEEE 754 prescribes. */
#ifndef FR_HALF_H
#define FR_HALF_H

#include <stddef.h>
#include <stdint.h>

uint16_t fr_f32_to_f16(float f);
float fr_f16_to_f32(uint16_t h);
uint16_t fr_f32_to_bf16(float f);
float fr_bf16_to_f32(uint16_t h);

void fr_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void fr_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void fr_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void fr_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);
/* The same on the calling thread only (inside a parallel loop). */
void fr_f32_to_f16_n_seq(const float *src, uint16_t *dst, size_t n);
void fr_f16_to_f32_n_seq(const uint16_t *src, float *dst, size_t n);
void fr_f32_to_bf16_n_seq(const float *src, uint16_t *dst, size_t n);
void fr_bf16_to_f32_n_seq(const uint16_t *src, float *dst, size_t n);
/* The serial pair for either format: f16 when is_f16, else bf16. */
void fr_half_to_f32_n_seq(const uint16_t *src, float *dst, size_t n, int is_f16);
void fr_f32_to_half_n_seq(const float *src, uint16_t *dst, size_t n, int is_f16);

#endif
