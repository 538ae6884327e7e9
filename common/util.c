/* Small shared helpers: monotonic time, random tokens, error names, checked string copies. */
#include "util.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int64_t omv_time_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double omv_time_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *omv_strerror(int err)
{
    if (err < 0)
        err = -err;
    switch (err) {
    case EPROTO:
        return "malformed or unexpected message";
    case ETIMEDOUT:
        return "timed out";
    default:
        return strerror(err);
    }
}

int omv_strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strlen(src);
    if (n >= cap) {
        memcpy(dst, src, cap - 1);
        dst[cap - 1] = '\0';
        return -ENAMETOOLONG;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

int omv_str_escape(char *dst, const char *src, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
        char esc[4] = {(char)*p};
        size_t n = 1;
        if (*p < 0x20 || *p == 0x7f) {
            esc[0] = '\\', esc[1] = 'x', esc[2] = hex[*p >> 4], esc[3] = hex[*p & 15];
            n = 4;
        } else if (*p == '\\') {
            esc[1] = '\\';
            n = 2;
        }
        if (o + n >= cap) {
            dst[o] = '\0';
            return -ENAMETOOLONG;
        }
        memcpy(dst + o, esc, n);
        o += n;
    }
    dst[o] = '\0';
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
int omv_all_finite(const float *v, size_t n)
{
    /* A float is NaN or infinite when its exponent bits are all ones. Integer ops and an OR
     * over the whole array, no early exit: the loop vectorises (the data is finite but for a
     * broken worker, so exiting early gains nothing). */
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof(bits));
        bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
float omv_sum_squares(const float *v, size_t n)
{
    /* Eight partial sums, so that the loop vectorises without reassociating one. */
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += v[i + k] * v[i + k];
    for (; i < n; i++)
        acc[0] += v[i] * v[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The loop of omv_take_checked and omv_take_checked_onto, dst[i] = OUT(i, v) for each value v
 * = src[i]: the finite check and the squares (in omv_sum_squares' eight partial sums and order)
 * of the first m values, then the rest. A macro, so that each function has its own loop
 * without a branch in it (GCC unswitches loops only at -O3). */
#define TAKE_LOOP(OUT)                                                                             \
    do {                                                                                           \
        for (; i + 8 <= m; i += 8)                                                                 \
            for (int k = 0; k < 8; k++) {                                                          \
                float v = src[i + k];                                                              \
                uint32_t bits;                                                                     \
                memcpy(&bits, &v, sizeof(bits));                                                   \
                lanes[k] |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);                       \
                acc[k] += v * v;                                                                   \
                dst[i + k] = OUT(i + k, v);                                                        \
            }                                                                                      \
        for (; i < n; i++) {                                                                       \
            float v = src[i];                                                                      \
            uint32_t bits;                                                                         \
            memcpy(&bits, &v, sizeof(bits));                                                       \
            lanes[0] |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);                           \
            if (i < m)                                                                             \
                acc[0] += v * v;                                                                   \
            dst[i] = OUT(i, v);                                                                    \
        }                                                                                          \
    } while (0)

/* What the loop leaves: the squares, and whether every value was finite. */
static int take_result(const float *acc, const uint32_t *lanes, float *ret_squares)
{
    uint32_t bad = 0;
    for (int k = 0; k < 8; k++)
        bad |= lanes[k];
    *ret_squares =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return bad == 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
int omv_take_checked(float *restrict dst, const float *restrict src, size_t n, size_t n_squares,
                     int onto_zero, float *ret_sum_squares)
{
    /* x + -0.0f is x for every x (a -0 too); 0.0f + x is what a sum of zeros gives. */
    const float z = onto_zero ? 0.0f : -0.0f;
    float acc[8] = {0};
    uint32_t lanes[8] = {0}; /* per lane in the loop: no reduction inside it */
    size_t i = 0, m = n_squares < n ? n_squares : n;
#define TAKE_COPY(j, v) ((v) + z)
    TAKE_LOOP(TAKE_COPY);
#undef TAKE_COPY
    return take_result(acc, lanes, ret_sum_squares);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
int omv_take_checked_onto(float *restrict dst, const float *restrict base,
                          const float *restrict src, size_t n, size_t n_squares,
                          float *ret_sum_squares)
{
    float acc[8] = {0};
    uint32_t lanes[8] = {0};
    size_t i = 0, m = n_squares < n ? n_squares : n;
#define TAKE_ONTO(j, v) (base[j] + (v))
    TAKE_LOOP(TAKE_ONTO);
#undef TAKE_ONTO
    return take_result(acc, lanes, ret_sum_squares);
}

void omv_keep_memory_resident(void)
{
    /* glibc maps buffers over its threshold (128 KiB, growing) fresh from the kernel and
     * unmaps them on free, and trims the heap top: every message of a large model would touch
     * new pages, at about 11 us per 4 KiB page on these VMs. Keep them in the heap instead. */
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
}

uint64_t omv_random_token(const void *salt)
{
    uint64_t token = 0;
    while (token == 0)
        if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token))
            token = ((uint64_t)omv_time_ms() << 20) ^ (uint64_t)(uintptr_t)salt;
    return token;
}
