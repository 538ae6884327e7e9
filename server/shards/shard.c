/* A shard's parameters, optimizer state (momentum; Adam's moments) and per-group pending
 * gradients. */
#include "shard.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int omv_shard_init(omv_shard_t *self, float *params, uint32_t offset, uint32_t count,
                   uint32_t n_groups)
{
    memset(self, 0, sizeof(*self));
    self->params = params;
    self->offset = offset;
    self->count = count;
    self->trained = count;
    self->n_groups = n_groups;
    self->velocity = calloc(count ? count : 1, sizeof(float));
    self->pending = calloc(n_groups ? n_groups : 1, sizeof(float *));
    self->empty = malloc(n_groups ? n_groups : 1);
    if (self->velocity == NULL || self->pending == NULL || self->empty == NULL) {
        omv_shard_fini(self);
        return -ENOMEM;
    }
    memset(self->empty, 1, n_groups ? n_groups : 1);
    return 0;
}

void omv_shard_fini(omv_shard_t *self)
{
    for (uint32_t g = 0; self->pending && g < self->n_groups; g++)
        free(self->pending[g]);
    free(self->velocity);
    free(self->second);
    free(self->pending);
    free(self->empty);
    memset(self, 0, sizeof(*self));
}

void omv_shard_set_state(omv_shard_t *self, size_t state_offset)
{
    size_t end = (size_t)self->offset + self->count;
    self->trained = state_offset <= self->offset ? 0
                    : state_offset >= end        ? self->count
                                                 : (uint32_t)(state_offset - self->offset);
}

int omv_shard_use_adam(omv_shard_t *self)
{
    if (self->second == NULL)
        self->second = calloc(self->count ? self->count : 1, sizeof(float));
    if (self->second == NULL)
        return -ENOMEM;
    self->steps = 0;
    return 0;
}

/* The hot loops are built for AVX2 too (chosen at load time where the CPU has it); they are
 * memory-bound, and wider loads and stores are most of what there is to win. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

HOT static void add_into(float *restrict sum, const float *restrict grad, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] += grad[i];
}

/* The step's first gradient over a stale sum: what adding it onto zeros gives (0.0f + -0.0f is
 * 0.0f). */
HOT static void set_into(float *restrict sum, const float *restrict grad, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = 0.0f + grad[i];
}

/* One pass: the update (the sum is left stale: the group's next gradient overwrites it). */
HOT static void sgd_step(float *restrict w, float *restrict v, const float *restrict sum, size_t n,
                         float inv, float lr, float mu, float wd)
{
    for (size_t i = 0; i < n; i++) {
        float g = sum[i] * inv + wd * w[i];
        float vi = mu * v[i] + g;
        v[i] = vi;
        w[i] -= lr * vi;
    }
}

HOT static void sgd_step_one(float *restrict w, float *restrict v, const float *restrict grad,
                             size_t n, float lr, float mu, float wd)
{
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] + wd * w[i];
        float vi = mu * v[i] + g;
        v[i] = vi;
        w[i] -= lr * vi;
    }
}

/* Adam's constants for one step, worked out once per update. */
typedef struct {
    float b1, c1, b2, c2; /* betas and 1 - betas */
    float step;           /* learning_rate / (1 - b1^t) */
    float rc2;            /* 1 / sqrt(1 - b2^t) */
    float eps;
    float wd;    /* added to the gradient (Adam) */
    float decay; /* the weight's factor before the step (AdamW: 1 - lr * wd) */
} adam_t;

static adam_t adam_consts(const omv_sgd_t *u, uint64_t t)
{
    double b1 = u->momentum, b2 = u->beta2;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    int decoupled = u->kind == OMV_UPDATE_ADAMW;
    return (adam_t){
        .b1 = (float)b1,
        .c1 = (float)(1.0 - b1),
        .b2 = (float)b2,
        .c2 = (float)(1.0 - b2),
        .step = (float)(u->learning_rate / bc1),
        .rc2 = (float)(1.0 / sqrt(bc2)),
        .eps = u->epsilon,
        .wd = decoupled ? 0.0f : u->weight_decay,
        .decay = decoupled ? 1.0f - u->learning_rate * u->weight_decay : 1.0f,
    };
}

/* One weight's Adam step from its gradient g (inlined into each loop below). */
static inline void adam_one(float *restrict w, float *restrict m, float *restrict s, float g,
                            const adam_t *k)
{
    g += k->wd * *w;
    float mi = k->b1 * *m + k->c1 * g;
    float si = k->b2 * *s + k->c2 * g * g;
    *m = mi;
    *s = si;
    *w = *w * k->decay - k->step * mi / (sqrtf(si) * k->rc2 + k->eps);
}

HOT static void adam_step(float *restrict w, float *restrict m, float *restrict s,
                          const float *restrict sum, size_t n, float inv, adam_t k)
{
    for (size_t i = 0; i < n; i++)
        adam_one(&w[i], &m[i], &s[i], sum[i] * inv, &k);
}

HOT static void adam_step_one(float *restrict w, float *restrict m, float *restrict s,
                              const float *restrict grad, size_t n, adam_t k)
{
    for (size_t i = 0; i < n; i++)
        adam_one(&w[i], &m[i], &s[i], grad[i], &k);
}

static inline float widen(const unsigned char *p, size_t i)
{
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof(h));
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

HOT static void add_into_bf16(float *restrict sum, const unsigned char *restrict grad, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] += widen(grad, i);
}

HOT static void set_into_bf16(float *restrict sum, const unsigned char *restrict grad, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sum[i] = 0.0f + widen(grad, i);
}

HOT static void sgd_step_one_bf16(float *restrict w, float *restrict v,
                                  const unsigned char *restrict grad, size_t n, float lr, float mu,
                                  float wd)
{
    for (size_t i = 0; i < n; i++) {
        float g = widen(grad, i) + wd * w[i];
        float vi = mu * v[i] + g;
        v[i] = vi;
        w[i] -= lr * vi;
    }
}

HOT static void adam_step_one_bf16(float *restrict w, float *restrict m, float *restrict s,
                                   const unsigned char *restrict grad, size_t n, adam_t k)
{
    for (size_t i = 0; i < n; i++)
        adam_one(&w[i], &m[i], &s[i], widen(grad, i), &k);
}

static int is_adam(const omv_shard_t *self, const omv_sgd_t *u)
{
    if (u->kind == OMV_UPDATE_SGD)
        return 0;
    assert(self->second != NULL); /* omv_shard_use_adam was not called: our bug */
    return 1;
}

/* The state at the shard's end (from `trained` on: batch norm's running statistics) is not
 * trained: it takes the value the group's members sent, their mean. */
HOT static void state_mean(float *restrict w, const float *restrict sum, size_t n, float inv)
{
    for (size_t i = 0; i < n; i++)
        w[i] = sum[i] * inv;
}

static void state_one_bf16(float *restrict w, const unsigned char *restrict v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        w[i] = widen(v, i);
}

void omv_shard_apply_one_bf16(omv_shard_t *self, const void *grad16, const omv_sgd_t *sgd)
{
    size_t n = self->trained;
    const unsigned char *g = grad16;
    state_one_bf16(self->params + n, g + 2 * n, self->count - n);
    if (is_adam(self, sgd))
        adam_step_one_bf16(self->params, self->velocity, self->second, g, n,
                           adam_consts(sgd, ++self->steps));
    else
        sgd_step_one_bf16(self->params, self->velocity, g, n, sgd->learning_rate, sgd->momentum,
                          sgd->weight_decay);
}

int omv_shard_accumulate_bf16(omv_shard_t *self, uint32_t group, const void *grad16)
{
    float *sum = omv_shard_sum(self, group);
    if (sum == NULL)
        return -ENOMEM;
    if (self->empty[group])
        set_into_bf16(sum, grad16, self->count);
    else
        add_into_bf16(sum, grad16, self->count);
    self->empty[group] = 0;
    return 0;
}

void omv_shard_apply_one(omv_shard_t *self, const float *grad, const omv_sgd_t *sgd)
{
    size_t n = self->trained;
    memcpy(self->params + n, grad + n, (self->count - n) * sizeof(float));
    if (is_adam(self, sgd))
        adam_step_one(self->params, self->velocity, self->second, grad, n,
                      adam_consts(sgd, ++self->steps));
    else
        sgd_step_one(self->params, self->velocity, grad, n, sgd->learning_rate, sgd->momentum,
                     sgd->weight_decay);
}

float *omv_shard_sum(omv_shard_t *self, uint32_t group)
{
    if (self->pending[group] == NULL) {
        self->pending[group] = malloc((self->count ? self->count : 1) * sizeof(float));
        self->empty[group] = 1;
    }
    return self->pending[group];
}

int omv_shard_sum_empty(const omv_shard_t *self, uint32_t group)
{
    return self->empty[group];
}

void omv_shard_sum_filled(omv_shard_t *self, uint32_t group)
{
    self->empty[group] = 0;
}

void omv_shard_swap_sum(omv_shard_t *self, uint32_t group, float *buf)
{
    self->pending[group] = buf;
    self->empty[group] = 0;
}

int omv_shard_accumulate(omv_shard_t *self, uint32_t group, const float *grad)
{
    float *sum = omv_shard_sum(self, group);
    if (sum == NULL)
        return -ENOMEM;
    if (self->empty[group])
        set_into(sum, grad, self->count);
    else
        add_into(sum, grad, self->count);
    self->empty[group] = 0;
    return 0;
}

void omv_shard_apply(omv_shard_t *self, uint32_t group, uint32_t contributors, const omv_sgd_t *sgd)
{
    float *sum = self->pending[group];
    if (sum == NULL || self->empty[group] || contributors == 0) {
        self->empty[group] = 1; /* nothing was summed, or nothing is to be applied */
        return;
    }
    self->empty[group] = 1; /* what the update leaves in it is stale */
    size_t n = self->trained;
    float inv = 1.0f / (float)contributors;
    state_mean(self->params + n, sum + n, self->count - n, inv);
    if (is_adam(self, sgd))
        adam_step(self->params, self->velocity, self->second, sum, n, inv,
                  adam_consts(sgd, ++self->steps));
    else
        sgd_step(self->params, self->velocity, sum, n, inv, sgd->learning_rate, sgd->momentum,
                 sgd->weight_decay);
}

void omv_shard_discard(omv_shard_t *self, uint32_t group)
{
    self->empty[group] = 1;
}
