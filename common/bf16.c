/* bfloat16 conversions. */
#include "bf16.h"

#include <string.h>

static inline uint16_t round_one(uint32_t u)
{
    /* Round to nearest even by adding 0x7fff plus the lowest kept bit; a NaN keeps its high
     * bits with the quiet bit set, so that rounding cannot turn it into an infinity. */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Hot on both sides of every step: AVX2 where the machine has it. */
/* gcc's; clang 14 leaves an exported function's clones unresolved at link time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

HOT void omv_bf16_from_f32(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof(u));
        dst[i] = round_one(u);
    }
}

HOT void omv_bf16_to_f32(float *dst, const void *src, size_t n)
{
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, sizeof(h));
        uint32_t u = (uint32_t)h << 16;
        memcpy(&dst[i], &u, sizeof(u));
    }
}

HOT int omv_bf16_all_finite(const void *src, size_t n)
{
    /* An exponent of all ones is an infinity or a NaN; one pass, no early exit, so that it
     * vectorises (a gradient is almost always finite). */
    const unsigned char *s = src;
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, sizeof(h));
        bad |= (h & 0x7f80u) == 0x7f80u;
    }
    return !bad;
}

HOT float omv_bf16_sum_squares(const void *src, size_t n)
{
    const unsigned char *s = src;
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) {
            uint16_t h;
            memcpy(&h, s + 2 * (i + k), sizeof(h));
            uint32_t u = (uint32_t)h << 16;
            float f;
            memcpy(&f, &u, sizeof(f));
            acc[k] += f * f;
        }
    }
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, sizeof(h));
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof(f));
        acc[0] += f * f;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
