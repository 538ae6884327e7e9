/* Small shared helpers: monotonic time, error names, checked string copies. */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <string.h>
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

int omv_all_finite(const float *v, size_t n)
{
    /* isfinite per element; the loop vectorises and is far cheaper than the update itself. */
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= isfinite(v[i]) != 0;
    return ok;
}
