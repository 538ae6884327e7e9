/* The gradient engine for multilayer perceptrons: dense layers with ReLU between them and
 * softmax cross-entropy at the end. Every buffer is made by omv_mlp_new for a batch size; the
 * training step allocates nothing. Parameters live in one flat vector (common/model.h). */
#pragma once

#include <stdint.h>

#include "model.h"

typedef struct omv_mlp omv_mlp_t;

/* Builds the engine for widths[n] (input first) and at most max_batch images a step.
 * Returns NULL with errno set. Caller owns; release with omv_mlp_destroy. */
omv_mlp_t *omv_mlp_new(const uint32_t *widths, uint32_t n, uint32_t max_batch);
void omv_mlp_destroy(omv_mlp_t **self_p);

const omv_model_layout_t *omv_mlp_layout(const omv_mlp_t *self);

/* Forward and backward on x[batch][inputs] with labels[batch] (each < classes): writes the
 * gradient of the mean loss into grad[param_count] and returns the mean loss. */
float omv_mlp_train_step(omv_mlp_t *self, const float *params, const float *x,
                         const uint8_t *labels, uint32_t batch, float *grad);

/* Forward only: counts correct top-1 predictions and sums the loss over the batch. */
void omv_mlp_evaluate(omv_mlp_t *self, const float *params, const float *x, const uint8_t *labels,
                      uint32_t batch, uint32_t *ret_correct, double *ret_loss_sum);
