/* A small seeded random number generator (xoshiro128+ style, splitmix64 seeding): the same seed
 * gives the same stream on every machine, for initialisation and per-epoch shuffles. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[2];
} omv_rng_t;

void omv_rng_init(omv_rng_t *self, uint64_t seed);
uint64_t omv_rng_next(omv_rng_t *self);
/* Uniform in [0, 1). */
double omv_rng_uniform(omv_rng_t *self);
/* Uniform integer in [0, n); n > 0. */
uint32_t omv_rng_below(omv_rng_t *self, uint32_t n);
/* Standard normal (Box-Muller). */
double omv_rng_normal(omv_rng_t *self);
/* Fisher-Yates shuffle of v[n]. */
void omv_rng_shuffle(omv_rng_t *self, uint32_t *v, size_t n);
