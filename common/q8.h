/* int8 values with a scale per block, as they travel with [cluster] wire = int8: a block of
 * OMV_Q8_BLOCK values becomes its scale (max |v| / 127, a little-endian float) and one signed
 * byte per value (v / scale rounded to nearest, ties to even). A shard's bytes are
 * its blocks' scales first, then its values. The worker keeps what rounding lost and adds it
 * to its next gradient (error feedback, as in 1-bit SGD and EF-SGD), so no part of a gradient
 * is lost for good, only late. Plain loops the compiler vectorises. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define OMV_Q8_BLOCK 64

/* Blocks (and so scales) n values take. */
static inline size_t omv_q8_blocks(size_t n)
{
    return (n + OMV_Q8_BLOCK - 1) / OMV_Q8_BLOCK;
}

/* Bytes n values take. */
static inline size_t omv_q8_bytes(size_t n)
{
    return omv_q8_blocks(n) * sizeof(float) + n;
}

/* dst[omv_q8_bytes(n)] = src[n] + residual[n] quantised; residual[n] (may be NULL: none) gets
 * what the rounding lost. A block with a NaN or an infinity gets a NaN scale, so that the
 * receiver refuses the gradient, and its residual is cleared. */
void omv_q8_encode(void *dst, const float *src, float *residual, size_t n);

/* dst[n] = the values src[omv_q8_bytes(n)] (any alignment) stand for. */
void omv_q8_decode(float *dst, const void *src, size_t n);

/* Parameters travel the same way, as changes to a copy the worker keeps (a view): the server
 * keeps the same copy for each worker, sends dst = params - view quantised, and both sides add
 * what dst stands for to their view (omv_q8_encode_delta does it as it goes, omv_q8_add
 * after). What rounding lost stays in the
 * difference and goes with the next change, so a view is never further from the parameters
 * than one change's rounding (at most its block's largest change / 254), and it never drifts.
 * The two views stay equal bit for bit because both add the same way (a multiply and an add,
 * never fused: the build sets no -march, and the AVX2 clone has no FMA). */
void omv_q8_encode_delta(void *dst, const float *params, float *view, size_t n);

/* view[n] += the values src[omv_q8_bytes(n)] stands for. */
void omv_q8_add(float *view, const void *src, size_t n);
