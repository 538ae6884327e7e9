/* Small shared helpers: monotonic time, random tokens, error names, checked string copies. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define OMV_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Monotonic clock in milliseconds and seconds. */
int64_t omv_time_ms(void);
double omv_time_s(void);

/* A nonzero random 64-bit token (getrandom; the clock and salt if it fails), for secrets such
 * as the tokens a daemon gives a worker to prove who it is on a second channel. */
uint64_t omv_random_token(const void *salt);

/* Names a negative errno (or our protocol codes) for messages. */
const char *omv_strerror(int err);

/* Copies src into dst[cap], always terminating; returns -ENAMETOOLONG when it had to cut. */
int omv_strlcpy(char *dst, const char *src, size_t cap);

/* Copies src into dst[cap] with control characters (and DEL) written as \xNN and a backslash
 * as \\, so that a string from a peer cannot start a line of its own in a log or a key:value
 * reply; an escape is never cut in half. Returns -ENAMETOOLONG when it had to cut, else 0. */
int omv_str_escape(char *dst, const char *src, size_t cap);

/* Tunes the allocator so that large buffers freed and allocated again (ZeroMQ messages of
 * parameters and gradients) reuse resident memory instead of fresh pages. Call once at start. */
void omv_keep_memory_resident(void);

/* True when every one of the n floats is finite. */
int omv_all_finite(const float *v, size_t n);

/* A gradient taken in, in one pass over src[n] that reads each value once (src may be memory a
 * peer writes meanwhile: what is checked is what is kept): dst[i] = src[i], or with onto_zero
 * 0.0f + src[i] (bit for bit what adding it to a sum of zeros gives); *ret_sum_squares gets
 * omv_sum_squares(src, n_squares) bit for bit (n_squares <= n). Returns whether all n are
 * finite. */
int omv_take_checked(float *dst, const float *src, size_t n, size_t n_squares, int onto_zero,
                     float *ret_sum_squares);
/* The same, onto a sum: dst[i] = base[i] + src[i] (bit for bit base[i] += src[i]), in one pass
 * that reads base and src once and leaves base as it was (dst must not overlap either). */
int omv_take_checked_onto(float *dst, const float *base, const float *src, size_t n,
                          size_t n_squares, float *ret_sum_squares);

/* The sum of the squares of v[n], in float: infinite for values whose squares overflow. */
float omv_sum_squares(const float *v, size_t n);
