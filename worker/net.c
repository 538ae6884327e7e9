/* The network: layers in a row, softmax cross-entropy on the last one's outputs. */
#include "net.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "rng.h"
#include "util.h"

struct omv_net {
    omv_model_layout_t layout;
    uint32_t max_batch;
    omv_layer_t layers[OMV_MODEL_MAX_LAYERS];
    float *prob; /* [max_batch][classes] */
    omv_rng_t rng;
    double *seconds; /* [n_layers] or NULL: per-layer time, for benchmarks */
};

omv_net_t *omv_net_new(const omv_model_layout_t *layout, uint32_t max_batch)
{
    if (max_batch == 0 || layout->n_layers == 0 || layout->n_layers > OMV_MODEL_MAX_LAYERS) {
        errno = EINVAL;
        return NULL;
    }
    omv_net_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->layout = *layout;
    self->max_batch = max_batch;
    omv_rng_init(&self->rng, 1);
    int ok = 1;
    for (uint32_t i = 0; i < layout->n_layers; i++) {
        omv_layer_t *l = &self->layers[i];
        /* A ReLU after a layer works in that layer's buffers: half the memory traffic. The
         * network's input is the caller's, so a first ReLU keeps its own. */
        bool in_place = i > 0 && layout->layers[i].kind == OMV_LAYER_RELU;
        ok &= omv_layer_init(l, &self->layout.layers[i], max_batch, in_place) == 0;
        if ((l->spec.kind == OMV_LAYER_FLATTEN || in_place) && i > 0)
            l->dout = self->layers[i - 1].dout;
    }
    self->prob = malloc((size_t)max_batch * layout->classes * sizeof(float));
    ok &= self->prob != NULL;
    if (!ok) {
        omv_net_destroy(&self);
        errno = ENOMEM;
        return NULL;
    }
    memset(self->prob, 0, (size_t)max_batch * layout->classes * sizeof(float));
    return self;
}

void omv_net_destroy(omv_net_t **self_p)
{
    omv_net_t *self = *self_p;
    if (self == NULL)
        return;
    for (uint32_t i = 0; i < self->layout.n_layers; i++)
        omv_layer_fini(&self->layers[i]);
    free(self->prob);
    free(self);
    *self_p = NULL;
}

const omv_model_layout_t *omv_net_layout(const omv_net_t *self)
{
    return &self->layout;
}

void omv_net_seed(omv_net_t *self, uint64_t seed)
{
    omv_rng_init(&self->rng, seed);
}

void omv_net_profile(omv_net_t *self, double *seconds)
{
    self->seconds = seconds;
}

const float *omv_net_output(const omv_net_t *self, uint32_t i)
{
    return self->layers[i].out;
}

const float *omv_net_probabilities(const omv_net_t *self)
{
    return self->prob;
}

/* Runs every layer, then the softmax of the last one's outputs into prob. */
static void forward(omv_net_t *self, const float *params, const float *x, uint32_t batch,
                    bool train)
{
    const float *in = x;
    uint32_t n = self->layout.n_layers;
    for (uint32_t i = 0; i < n; i++) {
        double t0 = self->seconds ? omv_time_s() : 0.0;
        omv_layer_forward(&self->layers[i], params, in, batch, train, &self->rng);
        if (self->seconds)
            self->seconds[i] += omv_time_s() - t0;
        in = self->layers[i].out;
    }
    /* Softmax per row, shifted by the row maximum for stability. */
    uint32_t c = self->layout.classes;
    for (uint32_t r = 0; r < batch; r++) {
        const float *z = in + (size_t)r * c;
        float *row = self->prob + (size_t)r * c;
        float m = z[0];
        for (uint32_t j = 1; j < c; j++)
            m = z[j] > m ? z[j] : m;
        float sum = 0.0f;
        for (uint32_t j = 0; j < c; j++) {
            row[j] = expf(z[j] - m);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (uint32_t j = 0; j < c; j++)
            row[j] *= inv;
    }
}

static float nll(float p)
{
    return -logf(p > 1e-30f ? p : 1e-30f);
}

float omv_net_train_step(omv_net_t *self, const float *params, const float *x,
                         const uint8_t *labels, uint32_t batch, float *grad)
{
    uint32_t n = self->layout.n_layers, c = self->layout.classes;
    forward(self, params, x, batch, true);

    /* dL/dlogits = (p - onehot) / batch */
    float *d = self->layers[n - 1].dout;
    double loss = 0.0;
    float inv_b = 1.0f / (float)batch;
    for (uint32_t r = 0; r < batch; r++) {
        const float *pr = self->prob + (size_t)r * c;
        float *dr = d + (size_t)r * c;
        loss += nll(pr[labels[r]]);
        for (uint32_t j = 0; j < c; j++)
            dr[j] = pr[j] * inv_b;
        dr[labels[r]] -= inv_b;
    }
    for (uint32_t i = n; i-- > 0;) {
        const float *in = i == 0 ? x : self->layers[i - 1].out;
        float *din = i == 0 ? NULL : self->layers[i - 1].dout;
        double t0 = self->seconds ? omv_time_s() : 0.0;
        omv_layer_backward(&self->layers[i], params, in, din, batch, grad);
        if (self->seconds)
            self->seconds[i] += omv_time_s() - t0;
    }
    return (float)(loss / batch);
}

void omv_net_evaluate(omv_net_t *self, const float *params, const float *x, const uint8_t *labels,
                      uint32_t batch, uint32_t *ret_correct, double *ret_loss_sum)
{
    uint32_t c = self->layout.classes;
    forward(self, params, x, batch, false);
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t r = 0; r < batch; r++) {
        const float *pr = self->prob + (size_t)r * c;
        uint32_t best = 0;
        for (uint32_t j = 1; j < c; j++)
            best = pr[j] > pr[best] ? j : best;
        correct += best == labels[r];
        loss += nll(pr[labels[r]]);
    }
    *ret_correct = correct;
    *ret_loss_sum = loss;
}
