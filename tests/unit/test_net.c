/* The gradient engine on MLPs (the [model] layers form): finite-difference check of every
 * parameter's gradient, the loss of a zero model, evaluation on a hand-made case, and local SGD
 * that learns separable data. Layer kinds one by one: test_layers.c. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "model.h"
#include "net.h"
#include "rng.h"
#include "testutil.h"

#define EPS 1e-2f

/* The engine for an MLP of widths[n], as the worker builds it from `layers = ...`. */
static omv_net_t *mlp_new(const uint32_t *widths, uint32_t n, uint32_t max_batch)
{
    omv_model_layout_t l;
    if (omv_model_layout(&l, widths, n) < 0) {
        errno = EINVAL;
        return NULL;
    }
    return omv_net_new(&l, max_batch);
}

/* The check a correct gradient passes: |num - ana| <= 1e-2 * max(1, |num|) + 1e-3. */
static int mismatches(const float *num, const float *ana, const uint8_t *skip, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip[i])
            continue;
        float tol = 1e-2f * fmaxf(1.0f, fabsf(num[i])) + 1e-3f;
        bad += fabsf(num[i] - ana[i]) > tol;
    }
    return bad;
}

static float central(omv_net_t *mlp, float *params, size_t i, float eps, const float *x,
                     const uint8_t *y, uint32_t batch, float *scratch)
{
    float saved = params[i];
    params[i] = saved + eps;
    float lp = omv_net_train_step(mlp, params, x, y, batch, scratch);
    params[i] = saved - eps;
    float lm = omv_net_train_step(mlp, params, x, y, batch, scratch);
    params[i] = saved;
    return (lp - lm) / (2.0f * eps);
}

START_TEST(test_gradient_finite_differences)
{
    const uint32_t widths[] = {7, 5, 4, 3};
    enum { BATCH = 4 };
    omv_net_t *mlp = mlp_new(widths, 4, 8); /* batch below max_batch on purpose */
    ck_assert_ptr_nonnull(mlp);
    const omv_model_layout_t *l = omv_net_layout(mlp);
    size_t n = l->param_count;
    ck_assert_uint_eq(n, 7 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);

    float *params = malloc(n * sizeof(float)), *grad = malloc(n * sizeof(float));
    float *again = malloc(n * sizeof(float)), *scratch = malloc(n * sizeof(float));
    float *num = malloc(n * sizeof(float)), *wrong = malloc(n * sizeof(float));
    uint8_t *skip = calloc(n, 1);
    omv_model_init(l, params, 11);
    omv_rng_t rng;
    omv_rng_init(&rng, 5);
    for (size_t i = 0; i < n; i++) /* biases become nonzero too */
        params[i] += (float)(omv_rng_uniform(&rng) - 0.5) * 0.2f;
    float x[BATCH * 7];
    for (size_t i = 0; i < BATCH * 7; i++)
        x[i] = (float)omv_rng_normal(&rng);
    const uint8_t y[BATCH] = {0, 2, 1, 2};

    float loss = omv_net_train_step(mlp, params, x, y, BATCH, grad);
    ck_assert(isfinite(loss) && loss > 0.0f);
    /* The gradient is written, not added: a dirty buffer gives the same result. */
    for (size_t i = 0; i < n; i++)
        again[i] = 123.0f;
    ck_assert_float_eq(omv_net_train_step(mlp, params, x, y, BATCH, again), loss);
    ck_assert_mem_eq(again, grad, n * sizeof(float));

    /* A ReLU kink inside [-eps, eps] makes the difference quotient meaningless; the two step
     * sizes then disagree. Such parameters are skipped, and there must be few of them. */
    int kinks = 0;
    for (size_t i = 0; i < n; i++) {
        num[i] = central(mlp, params, i, EPS, x, y, BATCH, scratch);
        float half = central(mlp, params, i, EPS / 2, x, y, BATCH, scratch);
        if (fabsf(num[i] - half) > 2e-3f + 1e-2f * fabsf(num[i])) {
            skip[i] = 1;
            kinks++;
        }
    }
    ck_assert_int_le(kinks, (int)n / 20);
    ck_assert_int_eq(mismatches(num, grad, skip, n), 0);

    /* The same check catches wrong gradients: 10% off, one entry off, no bias gradients. */
    for (size_t i = 0; i < n; i++)
        wrong[i] = grad[i] * 1.1f;
    ck_assert_int_gt(mismatches(num, wrong, skip, n), 0);
    memcpy(wrong, grad, n * sizeof(float));
    size_t probe = l->layers[0].w_offset + 3;
    ck_assert(!skip[probe]);
    wrong[probe] += 0.02f;
    ck_assert_int_eq(mismatches(num, wrong, skip, n), 1);
    memcpy(wrong, grad, n * sizeof(float));
    for (uint32_t k = 0; k < l->n_layers; k++)
        memset(wrong + l->layers[k].b_offset, 0, l->layers[k].b_count * sizeof(float));
    ck_assert_int_gt(mismatches(num, wrong, skip, n), 0);

    free(params), free(grad), free(again), free(scratch), free(num), free(wrong), free(skip);
    omv_net_destroy(&mlp);
    ck_assert_ptr_null(mlp);
}
END_TEST

START_TEST(test_zero_model_loss)
{
    const uint32_t widths[] = {7, 5, 4, 3};
    enum { BATCH = 4 };
    omv_net_t *mlp = mlp_new(widths, 4, BATCH);
    ck_assert_ptr_nonnull(mlp);
    const omv_model_layout_t *l = omv_net_layout(mlp);
    float *params = calloc(l->param_count, sizeof(float));
    float *grad = malloc(l->param_count * sizeof(float));
    float x[BATCH * 7];
    for (int i = 0; i < BATCH * 7; i++)
        x[i] = (float)(i % 5) - 2.0f;
    const uint8_t y[BATCH] = {0, 2, 2, 1};
    float loss = omv_net_train_step(mlp, params, x, y, BATCH, grad);
    ck_assert_float_eq_tol(loss, logf(3.0f), 1e-6f);
    /* Uniform predictions: the output bias gradient is 1/3 minus each class's share. */
    const float *gb = grad + l->layers[4].b_offset;
    ck_assert_float_eq_tol(gb[0], 1.0f / 3 - 0.25f, 1e-6f);
    ck_assert_float_eq_tol(gb[1], 1.0f / 3 - 0.25f, 1e-6f);
    ck_assert_float_eq_tol(gb[2], 1.0f / 3 - 0.50f, 1e-6f);
    uint32_t correct;
    double sum;
    omv_net_evaluate(mlp, params, x, y, BATCH, &correct, &sum);
    ck_assert_double_eq_tol(sum, BATCH * log(3.0), 1e-5);
    free(params);
    free(grad);
    omv_net_destroy(&mlp);
}
END_TEST

START_TEST(test_evaluate_by_hand)
{
    const uint32_t widths[] = {3, 3};
    enum { BATCH = 4 };
    omv_net_t *mlp = mlp_new(widths, 2, BATCH);
    ck_assert_ptr_nonnull(mlp);
    const omv_model_layout_t *l = omv_net_layout(mlp);
    ck_assert_uint_eq(l->param_count, 12);
    float params[12] = {0};
    for (int k = 0; k < 3; k++)
        params[l->layers[0].w_offset + 4 * k] = 5.0f; /* W = 5 I, b = 0 */
    const float x[BATCH * 3] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0};
    const uint8_t y[BATCH] = {0, 1, 0, 2}; /* predictions 0 1 2 0: two right */
    uint32_t correct = 99;
    double sum = -1;
    omv_net_evaluate(mlp, params, x, y, BATCH, &correct, &sum);
    ck_assert_uint_eq(correct, 2);
    double z = exp(5.0) + 2.0;
    double want = 2.0 * -log(exp(5.0) / z) + 2.0 * -log(1.0 / z);
    ck_assert_double_eq_tol(sum, want, 1e-4);
    float grad[12];
    float mean = omv_net_train_step(mlp, params, x, y, BATCH, grad);
    ck_assert_double_eq_tol((double)mean * BATCH, sum, 1e-4);
    /* Labels that match every prediction. */
    const uint8_t all[BATCH] = {0, 1, 2, 0};
    omv_net_evaluate(mlp, params, x, all, BATCH, &correct, &sum);
    ck_assert_uint_eq(correct, 4);
    omv_net_destroy(&mlp);
}
END_TEST

START_TEST(test_sgd_learns_blobs)
{
    enum { IN = 16, CLASSES = 4, N = 256, BATCH = 32 };
    const uint32_t widths[] = {IN, 16, CLASSES};
    omv_net_t *mlp = mlp_new(widths, 3, N);
    ck_assert_ptr_nonnull(mlp);
    const omv_model_layout_t *l = omv_net_layout(mlp);
    float *params = malloc(l->param_count * sizeof(float));
    float *grad = malloc(l->param_count * sizeof(float));
    float *x = malloc(N * IN * sizeof(float));
    uint8_t y[N];
    omv_rng_t rng;
    omv_rng_init(&rng, 99);
    for (int i = 0; i < N; i++) {
        y[i] = (uint8_t)omv_rng_below(&rng, CLASSES);
        for (int k = 0; k < IN; k++)
            x[i * IN + k] = (k / (IN / CLASSES) == y[i]) + 0.3f * (float)omv_rng_normal(&rng);
    }
    omv_model_init(l, params, 3);
    uint32_t correct;
    double before, after;
    omv_net_evaluate(mlp, params, x, y, N, &correct, &before);
    for (int step = 0; step < 300; step++) {
        int b = step % (N / BATCH);
        omv_net_train_step(mlp, params, x + b * BATCH * IN, y + b * BATCH, BATCH, grad);
        for (size_t i = 0; i < l->param_count; i++)
            params[i] -= 0.2f * grad[i];
    }
    omv_net_evaluate(mlp, params, x, y, N, &correct, &after);
    ck_assert_double_gt(before / N, 0.8);
    ck_assert_msg(after / N < 0.1, "mean loss %.4f after 300 steps (%.4f before)", after / N,
                  before / N);
    ck_assert_uint_ge(correct, N - 3);
    free(params);
    free(grad);
    free(x);
    omv_net_destroy(&mlp);
}
END_TEST

START_TEST(test_new_refuses)
{
    const uint32_t widths[] = {4, 0, 2};
    errno = 0;
    ck_assert_ptr_null(mlp_new(widths, 1, 4));
    ck_assert_int_eq(errno, EINVAL);
    errno = 0;
    ck_assert_ptr_null(mlp_new(widths, 3, 4)); /* a zero width */
    ck_assert_int_eq(errno, EINVAL);
    const uint32_t ok[] = {4, 2};
    ck_assert_ptr_null(mlp_new(ok, 2, 0));
    omv_model_layout_t l;
    ck_assert_int_eq(omv_model_layout(&l, ok, 2), 0);
    ck_assert_uint_eq(l.n_layers, 1);
    l.n_layers = 0;
    errno = 0;
    ck_assert_ptr_null(omv_net_new(&l, 4)); /* no layers */
    ck_assert_int_eq(errno, EINVAL);
    omv_net_t *none = NULL;
    omv_net_destroy(&none);
}
END_TEST

/* What the hooks saw of a step: the parameters they let through (the rest NaN until asked
 * for), and the gradient as it was when each part of it was said to be final. */
typedef struct {
    const float *params, *grad;
    float *given, *final;
    uint8_t *declared;
    size_t count, last_from;
    int needs, readies, late;
} seen_t;

static void seen_need(void *ctx, size_t from, size_t to)
{
    seen_t *h = ctx;
    ck_assert(from <= to && to <= h->count);
    memcpy(h->given + from, h->params + from, (to - from) * sizeof(float));
    h->needs++;
}

static void seen_ready(void *ctx, size_t from)
{
    seen_t *h = ctx;
    h->late += from > h->last_from; /* from must never grow */
    h->last_from = from;
    for (size_t i = from; i < h->count; i++)
        if (!h->declared[i]) {
            h->final[i] = h->grad[i];
            h->declared[i] = 1;
        }
    h->readies++;
}

START_TEST(test_hooks_in_pieces)
{
    /* A step told by hooks, its layers cut at the shards' offsets: each large fully connected
     * layer asks for its parameters piece by piece (the last first) and says its gradient is
     * final piece by piece. It reads no parameter before asking for it (the others are NaN),
     * what it says is final does not change after, and loss and gradient are those of the step
     * without hooks, bit for bit. */
    const uint32_t widths[] = {64, 96, 32, 10};
    enum { BATCH = 6 };
    omv_net_t *a = mlp_new(widths, 4, 8), *b = mlp_new(widths, 4, 8);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    const omv_model_layout_t *l = omv_net_layout(a);
    size_t n = l->param_count;
    uint32_t cuts[OMV_MODEL_MAX_SHARDS + 1];
    uint32_t n_shards = omv_model_shard_layout(l, 6, cuts);
    ck_assert_uint_ge(n_shards, 5);
    float *params = malloc(n * sizeof(float)), *given = malloc(n * sizeof(float));
    float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    float *final = malloc(n * sizeof(float));
    uint8_t *declared = calloc(n, 1), y[BATCH];
    float x[BATCH * 64];
    omv_model_init(l, params, 3);
    omv_rng_t rng;
    omv_rng_init(&rng, 5);
    for (int i = 0; i < BATCH * 64; i++)
        x[i] = (float)(omv_rng_next(&rng) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < BATCH; i++)
        y[i] = (uint8_t)(omv_rng_next(&rng) % 10);
    for (size_t i = 0; i < n; i++)
        given[i] = NAN;
    float loss_want = omv_net_train_step(a, params, x, y, BATCH, want);
    seen_t h = {params, got, given, final, declared, n, n, 0, 0, 0};
    const omv_net_hooks_t hooks = {seen_need, seen_ready, &h, cuts, n_shards + 1};
    float loss = omv_net_train_step_hooked(b, given, x, y, BATCH, got, &hooks);
    ck_assert_msg(memcmp(&loss, &loss_want, sizeof(loss)) == 0, "loss %g, without hooks %g", loss,
                  loss_want);
    ck_assert_msg(memcmp(got, want, n * sizeof(float)) == 0, "the gradients differ");
    ck_assert_int_eq(h.late, 0);
    ck_assert_uint_eq(h.last_from, 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(declared[i] && memcmp(&final[i], &got[i], sizeof(float)) == 0,
                      "gradient %zu changed after it was said to be final", i);
    /* 3 layers asked for once each at least; cut, the first two ask per piece (and for their
     * biases first), and say per piece that their gradient is final. */
    if (omv_gemm_current() != OMV_GEMM_BLAS && omv_gemm_fits(64) && omv_gemm_fits(96)) {
        ck_assert_msg(h.needs > 3 + 4, "%d asks", h.needs);
        ck_assert_msg(h.readies > 3 + 3, "%d finals", h.readies);
    }
    free(params);
    free(given);
    free(want);
    free(got);
    free(final);
    free(declared);
    omv_net_destroy(&a);
    omv_net_destroy(&b);
}
END_TEST

static Suite *net_suite(void)
{
    Suite *s = suite_create("net");
    TCase *tc = tcase_create("mlp");
    tcase_add_test(tc, test_gradient_finite_differences);
    tcase_add_test(tc, test_zero_model_loss);
    tcase_add_test(tc, test_evaluate_by_hand);
    tcase_add_test(tc, test_sgd_learns_blobs);
    tcase_add_test(tc, test_new_refuses);
    tcase_add_test(tc, test_hooks_in_pieces);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(net_suite());
}
