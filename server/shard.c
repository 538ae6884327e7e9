/* A shard's parameters, momentum and per-group pending gradients. */
#include "shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int omv_shard_init(omv_shard_t *self, float *params, uint32_t offset, uint32_t count,
                   uint32_t n_groups)
{
    memset(self, 0, sizeof(*self));
    self->params = params;
    self->offset = offset;
    self->count = count;
    self->n_groups = n_groups;
    self->velocity = calloc(count ? count : 1, sizeof(float));
    self->pending = calloc((size_t)n_groups * (count ? count : 1), sizeof(float));
    if (self->velocity == NULL || self->pending == NULL) {
        omv_shard_fini(self);
        return -ENOMEM;
    }
    return 0;
}

void omv_shard_fini(omv_shard_t *self)
{
    free(self->velocity);
    free(self->pending);
    memset(self, 0, sizeof(*self));
}

void omv_shard_accumulate(omv_shard_t *self, uint32_t group, const float *grad)
{
    float *restrict sum = self->pending + (size_t)group * self->count;
    for (uint32_t i = 0; i < self->count; i++)
        sum[i] += grad[i];
}

void omv_shard_apply(omv_shard_t *self, uint32_t group, uint32_t contributors,
                     const omv_sgd_t *sgd)
{
    float *restrict sum = self->pending + (size_t)group * self->count;
    if (contributors > 0) {
        float *restrict w = self->params;
        float *restrict v = self->velocity;
        const float inv = 1.0f / (float)contributors;
        const float lr = sgd->learning_rate, mu = sgd->momentum, wd = sgd->weight_decay;
        for (uint32_t i = 0; i < self->count; i++) {
            float g = sum[i] * inv + wd * w[i];
            v[i] = mu * v[i] + g;
            w[i] -= lr * v[i];
        }
    }
    memset(sum, 0, self->count * sizeof(float));
}

void omv_shard_discard(omv_shard_t *self, uint32_t group)
{
    memset(self->pending + (size_t)group * self->count, 0, self->count * sizeof(float));
}
