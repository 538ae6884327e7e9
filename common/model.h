/* The model's parameter layout, shared by daemon and workers: an MLP's weights and biases laid
 * out in one flat float vector, its initialisation, and how the vector splits into shards. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "job.h"

typedef struct {
    uint32_t in, out;
    size_t w_offset; /* [out][in] */
    size_t b_offset; /* [out] */
} omv_model_dense_t;

typedef struct {
    uint32_t n_dense;
    omv_model_dense_t dense[OMV_JOB_MAX_LAYERS - 1];
    size_t param_count;
    uint32_t inputs, classes;
} omv_model_layout_t;

/* Lays out an MLP of widths[n] (input first). Returns 0, or -EINVAL when n < 2 or the model has
 * more than OMV_MODEL_MAX_PARAMS parameters. */
#define OMV_MODEL_MAX_PARAMS (1u << 30)
int omv_model_layout(omv_model_layout_t *ret, const uint32_t *widths, uint32_t n);

/* He-normal weights (std sqrt(2 / fan_in)), zero biases, from seed. params has param_count. */
void omv_model_init(const omv_model_layout_t *self, float *params, uint64_t seed);

/* Splits count parameters into n_shards near-equal contiguous ranges; offsets has n_shards + 1
 * entries. A tensor may span shards. */
void omv_model_shard_offsets(size_t count, uint32_t n_shards, uint32_t *offsets);
