/* bfloat16: the high 16 bits of an IEEE float (sign, 8-bit exponent, 7-bit mantissa), as
 * parameters and gradients travel with [cluster] wire = bf16. Conversions round to nearest,
 * ties to even; NaN stays NaN (quiet) and infinities stay infinite. Plain loops the compiler
 * vectorises. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* dst[n] = src[n] rounded to bfloat16. */
void omv_bf16_from_f32(uint16_t *dst, const float *src, size_t n);
/* dst[n] = src[n] widened to float (exact). src may be unaligned. */
void omv_bf16_to_f32(float *dst, const void *src, size_t n);
/* Whether none of src[n] (bf16, any alignment) is NaN or infinite. */
int omv_bf16_all_finite(const void *src, size_t n);

/* The sum of the squares of src[n] (bf16, any alignment), in float. */
float omv_bf16_sum_squares(const void *src, size_t n);
