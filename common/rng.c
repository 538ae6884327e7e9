/* Seeded random numbers: xoroshiro128+ seeded by splitmix64. */
#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void omv_rng_init(omv_rng_t *self, uint64_t seed)
{
    uint64_t x = seed;
    self->s[0] = splitmix64(&x);
    self->s[1] = splitmix64(&x);
}

uint64_t omv_rng_next(omv_rng_t *self)
{
    uint64_t s0 = self->s[0], s1 = self->s[1];
    uint64_t r = s0 + s1;
    s1 ^= s0;
    self->s[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    self->s[1] = rotl(s1, 37);
    return r;
}

double omv_rng_uniform(omv_rng_t *self)
{
    return (double)(omv_rng_next(self) >> 11) * (1.0 / 9007199254740992.0);
}

uint32_t omv_rng_below(omv_rng_t *self, uint32_t n)
{
    /* Multiply-shift: bias is below 2^-32 per draw, far under anything a shuffle can show. */
    return (uint32_t)(((omv_rng_next(self) >> 32) * (uint64_t)n) >> 32);
}

double omv_rng_normal(omv_rng_t *self)
{
    double u1 = omv_rng_uniform(self);
    double u2 = omv_rng_uniform(self);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void omv_rng_shuffle(omv_rng_t *self, uint32_t *v, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = omv_rng_below(self, (uint32_t)i);
        uint32_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}
