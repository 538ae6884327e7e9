/* MLP parameter layout, initialisation and sharding. */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "rng.h"

int omv_model_layout(omv_model_layout_t *ret, const uint32_t *widths, uint32_t n)
{
    omv_model_layout_t l;
    memset(&l, 0, sizeof(l));
    if (n < 2 || n > OMV_JOB_MAX_LAYERS)
        return -EINVAL;
    size_t off = 0;
    for (uint32_t i = 0; i + 1 < n; i++) {
        omv_model_dense_t *d = &l.dense[i];
        d->in = widths[i];
        d->out = widths[i + 1];
        if (d->in == 0 || d->out == 0)
            return -EINVAL;
        d->w_offset = off;
        off += (size_t)d->in * d->out;
        d->b_offset = off;
        off += d->out;
        if (off > OMV_MODEL_MAX_PARAMS)
            return -EINVAL;
    }
    l.n_dense = n - 1;
    l.param_count = off;
    l.inputs = widths[0];
    l.classes = widths[n - 1];
    *ret = l;
    return 0;
}

void omv_model_init(const omv_model_layout_t *self, float *params, uint64_t seed)
{
    omv_rng_t rng;
    omv_rng_init(&rng, seed);
    for (uint32_t i = 0; i < self->n_dense; i++) {
        const omv_model_dense_t *d = &self->dense[i];
        float std = sqrtf(2.0f / (float)d->in);
        float *w = params + d->w_offset;
        for (size_t j = 0; j < (size_t)d->in * d->out; j++)
            w[j] = (float)omv_rng_normal(&rng) * std;
        memset(params + d->b_offset, 0, d->out * sizeof(float));
    }
}

void omv_model_shard_offsets(size_t count, uint32_t n_shards, uint32_t *offsets)
{
    for (uint32_t i = 0; i <= n_shards; i++)
        offsets[i] = (uint32_t)(count * i / n_shards);
}
