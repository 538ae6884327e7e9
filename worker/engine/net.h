/* The gradient engine: a network of layers (worker/layers.h) built from a model layout for a
 * batch size, with softmax cross-entropy at the end. Every buffer is made by omv_net_new; the
 * training step allocates nothing. Parameters live in one flat vector (common/model.h). */
#pragma once

#include <stdint.h>

#include "model.h"

typedef struct omv_net omv_net_t;

/* Builds the engine for a layout (copied) and at most max_batch images a step. Returns NULL
 * with errno set (EINVAL, ENOMEM). Caller owns; release with omv_net_destroy. */
omv_net_t *omv_net_new(const omv_model_layout_t *layout, uint32_t max_batch);

/* The same on `threads` threads (at most 64): each step splits the batch among them, each with
 * its own buffers, and sums their gradients. The calling thread is one of them. Set BLAS to one
 * thread (omv_blas_set_threads) so that the two do not compete for the cores: measured faster
 * than BLAS threads on the whole batch (bench/bench_net.c). */
omv_net_t *omv_net_new_threads(const omv_model_layout_t *layout, uint32_t max_batch,
                               uint32_t threads);

/* Threads the engine runs (fewer than asked when max_batch is smaller). */
uint32_t omv_net_threads(const omv_net_t *self);
void omv_net_destroy(omv_net_t **self_p);

const omv_model_layout_t *omv_net_layout(const omv_net_t *self);

/* Restarts the streams dropout draws its masks from (one per thread). */
void omv_net_seed(omv_net_t *self, uint64_t seed);

/* Forward and backward on x[batch][h][w][c] (channels-last; for one channel the usual row-major
 * image) with labels[batch] (each < classes): writes the gradient of the mean loss into
 * grad[param_count] and returns the mean loss. */
float omv_net_train_step(omv_net_t *self, const float *params, const float *x,
                         const uint8_t *labels, uint32_t batch, float *grad);

/* What a training step tells its caller while it runs, so that communication overlaps it.
 * need(ctx, from, to) comes before forward reads parameters: params[from, to) must hold the
 * step's values when it returns (the caller may still be receiving the rest). It comes per
 * layer, first layer first; a fully connected layer that cuts (ascending parameter offsets,
 * the caller's pieces: its shards) fall between rows of its weights asks for its biases, then
 * piece by piece, the last piece first, and computes each piece's outputs as it comes (its
 * pieces come in the order they were sent back: the last first). ready(ctx, from) comes when
 * grad[from, param_count) is final (after each layer's backward, the last layers first, and in
 * such a layer after each piece, the last first): that range may be sent while backward goes
 * on; from never grows. The last need is for the whole vector, the last ready from = 0. With
 * more than one thread the step needs every parameter before it starts and the gradient is
 * final only when the lanes are summed: one need and one ready. */
typedef struct {
    void (*need)(void *ctx, size_t from, size_t to);
    void (*ready)(void *ctx, size_t from);
    void *ctx;
    const uint32_t *cuts; /* [n_cuts], or NULL: no layer is cut */
    uint32_t n_cuts;
} omv_net_hooks_t;

/* omv_net_train_step, telling hooks (which may be NULL) as it goes. What it computes is the
 * same, bit for bit. */
float omv_net_train_step_hooked(omv_net_t *self, const float *params, const float *x,
                                const uint8_t *labels, uint32_t batch, float *grad,
                                const omv_net_hooks_t *hooks);

/* tick(ctx) is called between layers, forward and backward, in every step and evaluation, on
 * the caller's thread (whatever the threads and hooks): a long step's heartbeats go there.
 * NULL: none. */
void omv_net_set_tick(omv_net_t *self, void (*tick)(void *ctx), void *ctx);

/* Forward only (dropout off): counts correct top-1 predictions and sums the loss. */
void omv_net_evaluate(omv_net_t *self, const float *params, const float *x, const uint8_t *labels,
                      uint32_t batch, uint32_t *ret_correct, double *ret_loss_sum);

/* Benchmarks: while seconds is set, every step adds each layer's forward and backward time (of
 * the first thread's lane) into seconds[n_layers] (borrowed; NULL stops). */
void omv_net_profile(omv_net_t *self, double *seconds);

/* The output of layer i ([batch][out_size], channels-last) after the last forward, of the first
 * thread's lane (the whole batch with one thread); borrowed. */
const float *omv_net_output(const omv_net_t *self, uint32_t i);
