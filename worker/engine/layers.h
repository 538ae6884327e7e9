/* The layers of the gradient engine: each owns its activations, the gradient of its output and
 * its scratch, all made by omv_layer_init for a batch size, so forward and backward allocate
 * nothing. Activations are channels-last: [batch][h][w][c]. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "rng.h"

/* Per-channel rows of a batch norm's stats (worker/layers.c names them). */
#define OMV_LAYER_BN_STATS 7

typedef struct omv_layer {
    omv_model_layer_t spec;
    uint32_t max_batch;
    size_t in_size, out_size; /* floats per image */
    float *out;               /* [batch][out_size]; flatten, in-place ReLU: the input's */
    float *dout;              /* [batch][out_size] gradient of the loss by out; flatten,
                                 in-place ReLU: the previous layer's */
    float *col;               /* conv: [chunk * oh * ow][kh * kw * in_c], the lowered input of
                                 chunk images, then its gradient */
    float *wt;                /* conv: [kh * kw * in_c][out_c] the weights transposed */
    uint32_t chunk;           /* conv: images lowered at a time */
    float *mask;              /* dropout: [batch][out_size], 0 or 1 / (1 - rate) */
    uint32_t *arg;            /* maxpool: [batch][out_size] index of the maximum in the input */
    float *dres;              /* save: [batch][out_size] the gradient its add sends back */
    struct omv_layer *skip;   /* add: its save layer (borrowed; set by the net) */
    struct omv_layer *proj;   /* add of another shape: the 1x1 projection it owns */
    float *stats;             /* batchnorm: [OMV_LAYER_BN_STATS][c] the batch's mean, variance,
                                 1 / std, and per-channel factors and scratch */
    double *acc;              /* batchnorm: [2][c] sums for the mean and variance */
    bool owns_out;
} omv_layer_t;

/* Makes every buffer of a layer for at most max_batch images. Returns 0 or -ENOMEM (then
 * omv_layer_fini is still safe). The buffers are written once here so that their pages are
 * resident before the first step. in_place (ReLU only): the layer owns no buffers and works in
 * those of the layer before it, which must not need its own output in backward (no layer kind
 * does); the net sets dout to that layer's. */
int omv_layer_init(omv_layer_t *self, const omv_model_layer_t *spec, uint32_t max_batch,
                   bool in_place);
void omv_layer_fini(omv_layer_t *self);

/* out = layer(in) for in[batch][in_size]; params is the whole model's vector. train: dropout
 * draws a fresh mask from rng (else passes values through). */
void omv_layer_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch,
                       bool train, omv_rng_t *rng);

/* From dout (and in, the input of the last forward): writes this layer's parameter gradients
 * into grad (the whole model's vector) and, unless din is NULL, the gradient by the input into
 * din[batch][in_size]. Must follow a forward with the same params, in and batch. Batch norm
 * writes its running statistics updated by the batch's into grad's state (spec.s_offset): they
 * are values for the daemon to average, not gradients. An add writes the gradient of its saved
 * input into the save layer's dres, which the save adds to its own when its backward runs. */
void omv_layer_backward(omv_layer_t *self, const float *params, const float *in, float *din,
                        uint32_t batch, float *grad);

/* A fully connected layer in pieces, units [u0, u1) (rows of its weights) at a time, so that a
 * step whose parameters come and whose gradient goes piece by piece overlaps them: forward
 * writes those outputs (with their biases); backward writes those rows of dW, the biases'
 * gradient, and (din) the gradient by the input, which the whole layer's backward does in one.
 * Each piece's values are the whole layer's, bit for bit, where omv_layer_fc_split_exact says
 * so (the engine's own product kernels; a BLAS may block a product by its shape). */
bool omv_layer_fc_split_exact(const omv_layer_t *self);
void omv_layer_fc_forward_units(omv_layer_t *self, const float *params, const float *in,
                                uint32_t batch, uint32_t u0, uint32_t u1);
void omv_layer_fc_backward_units(omv_layer_t *self, const float *in, uint32_t batch, float *grad,
                                 uint32_t u0, uint32_t u1);
void omv_layer_fc_backward_bias(omv_layer_t *self, uint32_t batch, float *grad);
void omv_layer_fc_backward_input(omv_layer_t *self, const float *params, float *din,
                                 uint32_t batch);
