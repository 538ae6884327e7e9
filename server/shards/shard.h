/* One shard of the model: a contiguous range of the flat parameter vector, its optimizer state,
 * and one pending gradient sum per compute group (made the first time the group sums a gradient,
 * so that room for many groups costs nothing until they are used). The update, on the mean of a
 * group's gradients, is SGD with momentum and weight decay, Adam, or AdamW (PyTorch's forms). */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t offset, count; /* range in the flat parameter vector */
    uint32_t trained;       /* values [0, trained) are trained by the update rule; the rest are
                             * state (batch norm's running statistics) that takes the mean of
                             * the values the members send in the gradient's place
                             * (omv_shard_set_state; count without state) */
    uint32_t n_groups;
    float *params;   /* [count], borrowed: a view into the daemon's model */
    float *velocity; /* [count] SGD's momentum buffer; Adam's first moment */
    float *second;   /* [count] Adam's second moment; NULL for SGD (omv_shard_use_adam) */
    uint64_t steps;  /* Adam's updates applied, for the bias correction */
    float **pending; /* [n_groups] -> [count] sums of the gradients of the group's current step,
                      * NULL until the group first sums one */
    uint8_t *empty;  /* [n_groups] 1: the group's sum holds no gradient of the step yet (what is
                      * in it is stale: the next gradient overwrites it, so that neither the
                      * update nor a discard spends a pass clearing it) */
} omv_shard_t;

/* Which update rule a shard applies. */
typedef enum {
    OMV_UPDATE_SGD = 0,
    OMV_UPDATE_ADAM,  /* weight decay added to the gradient (L2), as torch.optim.Adam */
    OMV_UPDATE_ADAMW, /* weight decay decoupled from the gradient, as torch.optim.AdamW */
} omv_update_kind_t;

/* The update rule in force. For Adam and AdamW momentum is beta1 (the knob the optimizer
 * tunes); beta2 and epsilon are only read by them. */
typedef struct {
    float learning_rate;
    float momentum;
    float weight_decay;
    uint32_t kind; /* omv_update_kind_t */
    double beta2;  /* double: 1 - beta2 is small, and float would round it by 1e-5 */
    float epsilon;
} omv_sgd_t;

/* Sets up the shard over params[count] (borrowed). Returns 0 or -ENOMEM. */
int omv_shard_init(omv_shard_t *self, float *params, uint32_t offset, uint32_t count,
                   uint32_t n_groups);
void omv_shard_fini(omv_shard_t *self);
/* The model's state (untrained values) begins at state_offset of the flat vector: this shard's
 * share of it is set apart from the update rule. */
void omv_shard_set_state(omv_shard_t *self, size_t state_offset);
/* Makes room for Adam's second moment (zero, with no steps taken): needed before an update of
 * kind ADAM or ADAMW is applied. Returns 0 or -ENOMEM. */
int omv_shard_use_adam(omv_shard_t *self);

/* Adds grad[count] to the group's pending sum. Returns 0, or -ENOMEM when the group's sum
 * could not be made (the gradient is then not added). */
int omv_shard_accumulate(omv_shard_t *self, uint32_t group, const float *grad);
/* The group's pending sum (made the first time), for a gradient taken straight into it; NULL
 * when it cannot be made. While omv_shard_sum_empty says so, its values are stale: the caller
 * writes the step's first gradient over them (as 0.0f + g, what adding onto zeros gives), then
 * says so with omv_shard_sum_filled. */
float *omv_shard_sum(omv_shard_t *self, uint32_t group);
int omv_shard_sum_empty(const omv_shard_t *self, uint32_t group);
void omv_shard_sum_filled(omv_shard_t *self, uint32_t group);
/* The same for a gradient of bf16 values (any alignment), widened as it is added: exactly what
 * adding its fp32 widening would do, in one pass. */
int omv_shard_accumulate_bf16(omv_shard_t *self, uint32_t group, const void *grad16);
/* Makes buf (count floats, malloc'ed, holding a gradient) group's sum; the caller takes the one
 * it replaces. */
void omv_shard_swap_sum(omv_shard_t *self, uint32_t group, float *buf);

/* Applies the group's pending sum as one update with the mean over `contributors` gradients
 * (none: the model is left as it is); the sum is then empty. With g = sum / contributors:
 *   SGD:   g += weight_decay * w;  v = momentum * v + g;  w -= learning_rate * v
 *   Adam:  g += weight_decay * w (ADAMW instead: w *= 1 - learning_rate * weight_decay);
 *          t = ++steps;  m = b1 * m + (1 - b1) * g;  s = b2 * s + (1 - b2) * g * g;
 *          w -= learning_rate * (m / (1 - b1^t)) / (sqrt(s / (1 - b2^t)) + epsilon)
 * with m in velocity, s in second, b1 = momentum, b2 = beta2. State values (from `trained` on)
 * become the mean of the values sent instead: w = sum / contributors. */
void omv_shard_apply(omv_shard_t *self, uint32_t group, uint32_t contributors,
                     const omv_sgd_t *sgd);

/* Applies grad[count] at once, as the group's only gradient of the step (a group of one member:
 * no sum to keep). The same update as accumulate + apply with one contributor. */
void omv_shard_apply_one(omv_shard_t *self, const float *grad, const omv_sgd_t *sgd);
/* The same for a gradient of bf16 values (any alignment). */
void omv_shard_apply_one_bf16(omv_shard_t *self, const void *grad16, const omv_sgd_t *sgd);

/* Discards the group's pending sum (its members are gone). */
void omv_shard_discard(omv_shard_t *self, uint32_t group);
