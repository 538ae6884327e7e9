/* MLP forward and backward over whole batches with GEMM. */
#include "mlp.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

struct omv_mlp {
    omv_model_layout_t layout;
    uint32_t max_batch;
    float *act[OMV_JOB_MAX_LAYERS]; /* act[i+1]: [batch][dense[i].out], output of layer i */
    float *delta[2];                /* [batch][widest] ping-pong for backward */
    float *ones;                    /* [max_batch] for bias gradients as a GEMV-shaped GEMM */
};

omv_mlp_t *omv_mlp_new(const uint32_t *widths, uint32_t n, uint32_t max_batch)
{
    omv_mlp_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    if (max_batch == 0 || omv_model_layout(&self->layout, widths, n) < 0) {
        free(self);
        errno = EINVAL;
        return NULL;
    }
    self->max_batch = max_batch;
    uint32_t widest = 0;
    for (uint32_t i = 0; i < n; i++)
        widest = widths[i] > widest ? widths[i] : widest;
    int ok = 1;
    for (uint32_t i = 0; i < self->layout.n_dense; i++) {
        self->act[i + 1] = calloc((size_t)max_batch * self->layout.dense[i].out, sizeof(float));
        ok &= self->act[i + 1] != NULL;
    }
    for (int i = 0; i < 2; i++) {
        self->delta[i] = calloc((size_t)max_batch * widest, sizeof(float));
        ok &= self->delta[i] != NULL;
    }
    self->ones = malloc(max_batch * sizeof(float));
    ok &= self->ones != NULL;
    if (!ok) {
        omv_mlp_destroy(&self);
        errno = ENOMEM;
        return NULL;
    }
    for (uint32_t i = 0; i < max_batch; i++)
        self->ones[i] = 1.0f;
    return self;
}

void omv_mlp_destroy(omv_mlp_t **self_p)
{
    omv_mlp_t *self = *self_p;
    if (self == NULL)
        return;
    for (uint32_t i = 0; i < OMV_JOB_MAX_LAYERS; i++)
        free(self->act[i]);
    free(self->delta[0]);
    free(self->delta[1]);
    free(self->ones);
    free(self);
    *self_p = NULL;
}

const omv_model_layout_t *omv_mlp_layout(const omv_mlp_t *self)
{
    return &self->layout;
}

/* Fills act[1..] and leaves softmax probabilities in the last one. */
static void forward(omv_mlp_t *self, const float *params, const float *x, uint32_t batch)
{
    const omv_model_layout_t *l = &self->layout;
    const float *in = x;
    for (uint32_t i = 0; i < l->n_dense; i++) {
        const omv_model_dense_t *d = &l->dense[i];
        float *out = self->act[i + 1];
        const float *bias = params + d->b_offset;
        for (uint32_t r = 0; r < batch; r++)
            memcpy(out + (size_t)r * d->out, bias, d->out * sizeof(float));
        /* out[batch][out] += in[batch][in] * W[out][in]^T */
        omv_blas_gemm(false, true, (int)batch, (int)d->out, (int)d->in, 1.0f, in, (int)d->in,
                      params + d->w_offset, (int)d->in, 1.0f, out, (int)d->out);
        size_t len = (size_t)batch * d->out;
        if (i + 1 < l->n_dense) {
            for (size_t j = 0; j < len; j++)
                out[j] = out[j] > 0.0f ? out[j] : 0.0f;
        }
        in = out;
    }
    /* Softmax per row, shifted by the row maximum for stability. */
    uint32_t c = l->classes;
    float *p = self->act[l->n_dense];
    for (uint32_t r = 0; r < batch; r++) {
        float *row = p + (size_t)r * c;
        float m = row[0];
        for (uint32_t j = 1; j < c; j++)
            m = row[j] > m ? row[j] : m;
        float sum = 0.0f;
        for (uint32_t j = 0; j < c; j++) {
            row[j] = expf(row[j] - m);
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

float omv_mlp_train_step(omv_mlp_t *self, const float *params, const float *x,
                         const uint8_t *labels, uint32_t batch, float *grad)
{
    const omv_model_layout_t *l = &self->layout;
    uint32_t c = l->classes;
    forward(self, params, x, batch);

    /* dL/dlogits = (p - onehot) / batch */
    float *d = self->delta[0];
    const float *p = self->act[l->n_dense];
    double loss = 0.0;
    float inv_b = 1.0f / (float)batch;
    for (uint32_t r = 0; r < batch; r++) {
        const float *pr = p + (size_t)r * c;
        float *dr = d + (size_t)r * c;
        loss += nll(pr[labels[r]]);
        for (uint32_t j = 0; j < c; j++)
            dr[j] = pr[j] * inv_b;
        dr[labels[r]] -= inv_b;
    }

    int cur = 0;
    for (uint32_t i = l->n_dense; i-- > 0;) {
        const omv_model_dense_t *dl = &l->dense[i];
        const float *in = i == 0 ? x : self->act[i];
        float *dout = self->delta[cur];
        /* dW[out][in] = dout^T[out][batch] * in[batch][in] */
        omv_blas_gemm(true, false, (int)dl->out, (int)dl->in, (int)batch, 1.0f, dout,
                      (int)dl->out, in, (int)dl->in, 0.0f, grad + dl->w_offset, (int)dl->in);
        /* db[out] = ones[batch] * dout[batch][out] */
        omv_blas_gemm(false, false, 1, (int)dl->out, (int)batch, 1.0f, self->ones, (int)batch,
                      dout, (int)dl->out, 0.0f, grad + dl->b_offset, (int)dl->out);
        if (i == 0)
            break;
        /* din[batch][in] = dout[batch][out] * W[out][in], then through the ReLU of layer i-1 */
        float *din = self->delta[cur ^ 1];
        omv_blas_gemm(false, false, (int)batch, (int)dl->in, (int)dl->out, 1.0f, dout,
                      (int)dl->out, params + dl->w_offset, (int)dl->in, 0.0f, din, (int)dl->in);
        size_t len = (size_t)batch * dl->in;
        for (size_t j = 0; j < len; j++)
            din[j] = in[j] > 0.0f ? din[j] : 0.0f;
        cur ^= 1;
    }
    return (float)(loss / batch);
}

void omv_mlp_evaluate(omv_mlp_t *self, const float *params, const float *x, const uint8_t *labels,
                      uint32_t batch, uint32_t *ret_correct, double *ret_loss_sum)
{
    const omv_model_layout_t *l = &self->layout;
    uint32_t c = l->classes;
    forward(self, params, x, batch);
    const float *p = self->act[l->n_dense];
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t r = 0; r < batch; r++) {
        const float *pr = p + (size_t)r * c;
        uint32_t best = 0;
        for (uint32_t j = 1; j < c; j++)
            best = pr[j] > pr[best] ? j : best;
        correct += best == labels[r];
        loss += nll(pr[labels[r]]);
    }
    *ret_correct = correct;
    *ret_loss_sum = loss;
}
