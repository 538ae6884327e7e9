/* One shard of the model: a contiguous range of the flat parameter vector, its momentum, and
 * one pending gradient sum per compute group (made the first time the group sums a gradient,
 * so that room for many groups costs nothing until they are used). The update is SGD with
 * momentum and weight decay (PyTorch's form) on the mean of a group's gradients. */
#pragma once

#include <stdint.h>

typedef struct {
    uint32_t offset, count; /* range in the flat parameter vector */
    uint32_t n_groups;
    float *params;   /* [count], borrowed: a view into the daemon's model */
    float *velocity; /* [count] */
    float **pending; /* [n_groups] -> [count] sums of the gradients of the group's current step,
                      * NULL until the group first sums one */
} omv_shard_t;

typedef struct {
    float learning_rate;
    float momentum;
    float weight_decay;
} omv_sgd_t;

/* Sets up the shard over params[count] (borrowed). Returns 0 or -ENOMEM. */
int omv_shard_init(omv_shard_t *self, float *params, uint32_t offset, uint32_t count,
                   uint32_t n_groups);
void omv_shard_fini(omv_shard_t *self);

/* Adds grad[count] to the group's pending sum. Returns 0, or -ENOMEM when the group's sum
 * could not be made (the gradient is then not added). */
int omv_shard_accumulate(omv_shard_t *self, uint32_t group, const float *grad);
/* The same for a gradient of bf16 values (any alignment), widened as it is added: exactly what
 * adding its fp32 widening would do, in one pass. */
int omv_shard_accumulate_bf16(omv_shard_t *self, uint32_t group, const void *grad16);

/* Applies the group's pending sum as one update with the mean over `contributors` gradients
 * (none: the model is left as it is), then clears the sum:
 *   g = sum / contributors + weight_decay * w;  v = momentum * v + g;  w -= learning_rate * v */
void omv_shard_apply(omv_shard_t *self, uint32_t group, uint32_t contributors,
                     const omv_sgd_t *sgd);

/* Applies grad[count] at once, as the group's only gradient of the step (a group of one member:
 * no sum to keep). The same update as accumulate + apply with one contributor. */
void omv_shard_apply_one(omv_shard_t *self, const float *grad, const omv_sgd_t *sgd);
/* The same for a gradient of bf16 values (any alignment). */
void omv_shard_apply_one_bf16(omv_shard_t *self, const void *grad16, const omv_sgd_t *sgd);

/* Discards the group's pending sum (its members are gone). */
void omv_shard_discard(omv_shard_t *self, uint32_t group);
