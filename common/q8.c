/* int8 values with a scale per block: gradients, and changes to parameters. */
#include "q8.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Hot on the worker and the server of every step: AVX2 where the machine has it (as bf16.c). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

/* v[n] (n <= OMV_Q8_BLOCK) into q[n] with scale *scale_p; residual (or NULL) gets the error. */
static inline void encode_block(int8_t *q, float *scale_p, const float *v, float *residual,
                                size_t n)
{
    /* The largest magnitude, from the values' bits: for finite floats without their sign the
     * order of the bits is the order of the values, and integer reductions vectorise where a
     * float maximum (NaN's rules) does not. An exponent of all ones is NaN or infinite. */
    uint32_t top = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof(u));
        u &= 0x7fffffffu;
        bad |= u >= 0x7f800000u;
        top = u > top ? u : top;
    }
    float amax;
    memcpy(&amax, &top, sizeof(amax));
    if (bad) {
        *scale_p = NAN;
        memset(q, 0, n);
        if (residual)
            memset(residual, 0, n * sizeof(float));
        return;
    }
    float scale = amax / 127.0f, inv = 127.0f / amax;
    if (!(inv <= FLT_MAX)) {
        /* Zeros, or values so small (below 127 / FLT_MAX) that their steps would overflow:
         * nothing is sent and all of it is kept. */
        *scale_p = 0.0f;
        memset(q, 0, n);
        if (residual)
            memcpy(residual, v, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float t = rintf(v[i] * inv);
        t = t > 127.0f ? 127.0f : t < -127.0f ? -127.0f : t;
        q[i] = (int8_t)t;
        if (residual)
            residual[i] = v[i] - t * scale;
    }
    *scale_p = scale;
}

HOT void omv_q8_encode(void *dst, const float *src, float *residual, size_t n)
{
    size_t blocks = omv_q8_blocks(n);
    unsigned char *scales = dst;
    int8_t *q = (int8_t *)(scales + blocks * sizeof(float));
    float v[OMV_Q8_BLOCK];
    for (size_t b = 0; b < blocks; b++) {
        size_t at = b * OMV_Q8_BLOCK, len = n - at < OMV_Q8_BLOCK ? n - at : OMV_Q8_BLOCK;
        const float *in = src + at;
        if (residual) {
            for (size_t i = 0; i < len; i++)
                v[i] = in[i] + residual[at + i];
            in = v;
        }
        float scale;
        encode_block(q + at, &scale, in, residual ? residual + at : NULL, len);
        memcpy(scales + b * sizeof(float), &scale, sizeof(scale));
    }
}

/* dst[n] = (add: dst +) the values src stands for; add is a constant where it is inlined. */
static inline void decode_into(float *dst, const void *src, size_t n, int add)
{
    size_t blocks = omv_q8_blocks(n);
    const unsigned char *scales = src;
    const int8_t *q = (const int8_t *)(scales + blocks * sizeof(float));
    for (size_t b = 0; b < blocks; b++) {
        size_t at = b * OMV_Q8_BLOCK, len = n - at < OMV_Q8_BLOCK ? n - at : OMV_Q8_BLOCK;
        float scale;
        memcpy(&scale, scales + b * sizeof(float), sizeof(scale));
        for (size_t i = 0; i < len; i++)
            if (add)
                dst[at + i] += (float)q[at + i] * scale;
            else
                dst[at + i] = (float)q[at + i] * scale;
    }
}

HOT void omv_q8_decode(float *dst, const void *src, size_t n)
{
    decode_into(dst, src, n, 0);
}

HOT void omv_q8_encode_delta(void *dst, const float *params, float *view, size_t n)
{
    size_t blocks = omv_q8_blocks(n);
    unsigned char *scales = dst;
    int8_t *q = (int8_t *)(scales + blocks * sizeof(float));
    float v[OMV_Q8_BLOCK];
    for (size_t b = 0; b < blocks; b++) {
        size_t at = b * OMV_Q8_BLOCK, len = n - at < OMV_Q8_BLOCK ? n - at : OMV_Q8_BLOCK;
        for (size_t i = 0; i < len; i++)
            v[i] = params[at + i] - view[at + i];
        float scale;
        encode_block(q + at, &scale, v, NULL, len);
        memcpy(scales + b * sizeof(float), &scale, sizeof(scale));
        for (size_t i = 0; i < len; i++) /* omv_q8_add's sum, so that the views agree */
            view[at + i] += (float)q[at + i] * scale;
    }
}

HOT void omv_q8_add(float *view, const void *src, size_t n)
{
    decode_into(view, src, n, 1);
}
