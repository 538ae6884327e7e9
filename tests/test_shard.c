/* A parameter shard: SGD with momentum and weight decay against a hand computation, the mean over
 * contributors, per-group pending sums, and discarding. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "shard.h"
#include "testutil.h"

/* The update as the header documents it, written out on its own in double. The test numbers are
 * short binary fractions, so every intermediate is exact in float as well. */
static void reference_step(double *w, double *v, const double *sum, int n, double contributors,
                           double lr, double mu, double wd)
{
    for (int i = 0; i < n; i++) {
        double g = sum[i] / contributors + wd * w[i];
        v[i] = mu * v[i] + g;
        w[i] = w[i] - lr * v[i];
    }
}

START_TEST(test_momentum_by_hand)
{
    enum { N = 3 };
    float params[N] = {1.0f, -2.0f, 0.5f};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    const omv_sgd_t sgd = {.learning_rate = 0.5f, .momentum = 0.5f, .weight_decay = 0.25f};

    /* Step 1, by hand: sums {2, -1, 0} over 2 contributors.
     *   w0 = 1:    g = 1 + 0.25 = 1.25,      v = 1.25,   w = 1 - 0.625 = 0.375
     *   w1 = -2:   g = -0.5 - 0.5 = -1,      v = -1,     w = -2 + 0.5 = -1.5
     *   w2 = 0.5:  g = 0 + 0.125 = 0.125,    v = 0.125,  w = 0.5 - 0.0625 = 0.4375 */
    const float a1[N] = {0.5f, 0.25f, -1.0f}, b1[N] = {1.5f, -1.25f, 1.0f};
    omv_shard_accumulate(&sh, 0, a1);
    omv_shard_accumulate(&sh, 0, b1);
    omv_shard_apply(&sh, 0, 2, &sgd);
    ck_assert_float_eq(params[0], 0.375f);
    ck_assert_float_eq(params[1], -1.5f);
    ck_assert_float_eq(params[2], 0.4375f);
    ck_assert_float_eq(sh.velocity[0], 1.25f);
    ck_assert_float_eq(sh.velocity[1], -1.0f);
    ck_assert_float_eq(sh.velocity[2], 0.125f);

    /* Steps 2 and 3 against the reference formula. */
    double w[N] = {0.375, -1.5, 0.4375}, v[N] = {1.25, -1.0, 0.125};
    const float grads[2][2][N] = {
        {{0.75f, -0.5f, 2.0f}, {0.25f, 1.0f, -3.0f}},
        {{-1.0f, 0.125f, 0.5f}, {3.0f, 0.375f, 1.5f}},
    };
    for (int s = 0; s < 2; s++) {
        double sum[N];
        for (int i = 0; i < N; i++)
            sum[i] = (double)grads[s][0][i] + grads[s][1][i];
        omv_shard_accumulate(&sh, 0, grads[s][0]);
        omv_shard_accumulate(&sh, 0, grads[s][1]);
        omv_shard_apply(&sh, 0, 2, &sgd);
        reference_step(w, v, sum, N, 2, 0.5, 0.5, 0.25);
        for (int i = 0; i < N; i++) {
            ck_assert_float_eq(params[i], (float)w[i]);
            ck_assert_float_eq(sh.velocity[i], (float)v[i]);
        }
    }
    omv_shard_fini(&sh);
    ck_assert_ptr_null(sh.velocity);
}
END_TEST

START_TEST(test_mean_of_three)
{
    /* Three contributors: 1/3 is not exact, so allow a few ulps. */
    enum { N = 4 };
    float params[N] = {0.1f, 0.2f, -0.3f, 0.4f};
    double w[N], v[N] = {0}, sum[N] = {0};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    const omv_sgd_t sgd = {.learning_rate = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
    const float g[3][N] = {{1, 2, 3, 4}, {0.5f, -1, 7, 0}, {-0.25f, 0.1f, 0, 1}};
    for (int i = 0; i < N; i++)
        w[i] = params[i];
    for (int m = 0; m < 3; m++) {
        omv_shard_accumulate(&sh, 0, g[m]);
        for (int i = 0; i < N; i++)
            sum[i] += g[m][i];
    }
    omv_shard_apply(&sh, 0, 3, &sgd);
    reference_step(w, v, sum, N, 3, 0.1f, 0.9f, 0.01f);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq_tol(params[i], (float)w[i], 1e-6f);
    omv_shard_fini(&sh);
}
END_TEST

START_TEST(test_mean_of_two_members)
{
    /* Plain SGD (no momentum, no decay): the step is lr times the mean of the two gradients. */
    enum { N = 4 };
    float params[N] = {1, 1, 1, 1};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    const omv_sgd_t sgd = {.learning_rate = 1.0f, .momentum = 0.0f, .weight_decay = 0.0f};
    const float a[N] = {2, 4, -6, 0}, b[N] = {4, 0, 2, 1};
    omv_shard_accumulate(&sh, 0, a);
    omv_shard_accumulate(&sh, 0, b);
    omv_shard_apply(&sh, 0, 2, &sgd);
    const float want[N] = {1 - 3, 1 - 2, 1 + 2, 1 - 0.5f};
    ck_assert_mem_eq(params, want, sizeof(want));
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(sh.pending[0][i], 0.0f);
    omv_shard_fini(&sh);
}
END_TEST

START_TEST(test_no_contributors)
{
    enum { N = 3 };
    float params[N] = {1, 2, 3};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    const omv_sgd_t sgd = {.learning_rate = 0.5f, .momentum = 0.5f, .weight_decay = 0.5f};
    const float g[N] = {10, 20, 30};
    omv_shard_accumulate(&sh, 0, g);
    omv_shard_apply(&sh, 0, 0, &sgd);
    const float same[N] = {1, 2, 3};
    ck_assert_mem_eq(params, same, sizeof(same));
    for (int i = 0; i < N; i++) {
        ck_assert_float_eq(sh.pending[0][i], 0.0f);
        ck_assert_float_eq(sh.velocity[i], 0.0f);
    }
    /* The cleared sum does not leak into the next update: only weight decay moves w. */
    const omv_sgd_t decay = {.learning_rate = 1.0f, .momentum = 0.0f, .weight_decay = 0.5f};
    omv_shard_apply(&sh, 0, 1, &decay);
    const float halved[N] = {0.5f, 1.0f, 1.5f};
    ck_assert_mem_eq(params, halved, sizeof(halved));
    omv_shard_fini(&sh);
}
END_TEST

START_TEST(test_groups_independent)
{
    enum { N = 2 };
    float model[6] = {9, 9, 1, 1, 9, 9}; /* the shard sees model[2..3] */
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, model + 2, 2, N, 3), 0);
    ck_assert_uint_eq(sh.offset, 2);
    const omv_sgd_t sgd = {.learning_rate = 1.0f, .momentum = 0.0f, .weight_decay = 0.0f};
    const float g0[N] = {0.5f, 0.25f}, g1[N] = {-1, -2}, g2[N] = {100, 100};
    omv_shard_accumulate(&sh, 0, g0);
    omv_shard_accumulate(&sh, 1, g1);
    omv_shard_accumulate(&sh, 2, g2);
    omv_shard_apply(&sh, 1, 1, &sgd);
    ck_assert_float_eq(model[2], 2.0f);
    ck_assert_float_eq(model[3], 3.0f);
    /* Group 0's sum is still there, untouched by group 1's update. */
    ck_assert_float_eq(sh.pending[0][0], 0.5f);
    ck_assert_float_eq(sh.pending[0][1], 0.25f);
    omv_shard_apply(&sh, 0, 1, &sgd);
    ck_assert_float_eq(model[2], 1.5f);
    ck_assert_float_eq(model[3], 2.75f);
    /* Group 2's members left: its sum goes without touching the model. */
    omv_shard_discard(&sh, 2);
    ck_assert_float_eq(sh.pending[2][0], 0.0f);
    ck_assert_float_eq(sh.pending[2][1], 0.0f);
    omv_shard_apply(&sh, 2, 1, &sgd);
    ck_assert_float_eq(model[2], 1.5f);
    ck_assert_float_eq(model[3], 2.75f);
    /* Neighbours outside the shard's range never change. */
    ck_assert(model[0] == 9 && model[1] == 9 && model[4] == 9 && model[5] == 9);
    omv_shard_fini(&sh);
}
END_TEST

START_TEST(test_apply_one_is_sum_and_apply)
{
    /* A group of one member applies straight from its gradient: the same update, bit for bit,
     * as summing it and applying the sum of one, over several steps of momentum and decay. */
    enum { N = 37 };
    float a[N], b[N];
    for (int i = 0; i < N; i++)
        a[i] = b[i] = (float)(i % 7) - 3.0f;
    omv_shard_t sa, sb;
    ck_assert_int_eq(omv_shard_init(&sa, a, 0, N, 1), 0);
    ck_assert_int_eq(omv_shard_init(&sb, b, 0, N, 1), 0);
    const omv_sgd_t sgd = {.learning_rate = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
    for (int step = 0; step < 5; step++) {
        float g[N];
        for (int i = 0; i < N; i++)
            g[i] = (float)((i * 13 + step * 7) % 11) * 0.25f - 1.0f;
        omv_shard_accumulate(&sa, 0, g);
        omv_shard_apply(&sa, 0, 1, &sgd);
        omv_shard_apply_one(&sb, g, &sgd);
    }
    ck_assert_mem_eq(a, b, sizeof(a));
    ck_assert_mem_eq(sa.velocity, sb.velocity, N * sizeof(float));
    omv_shard_fini(&sa);
    omv_shard_fini(&sb);
}
END_TEST

START_TEST(test_discard)
{
    enum { N = 3 };
    float params[N] = {1, -1, 2};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 2), 0);
    const omv_sgd_t sgd = {.learning_rate = 0.5f, .momentum = 0.9f, .weight_decay = 0.0f};
    const float g[N] = {4, 4, 4};
    omv_shard_accumulate(&sh, 1, g);
    omv_shard_accumulate(&sh, 0, g);
    omv_shard_discard(&sh, 0);
    for (int i = 0; i < N; i++) {
        ck_assert_float_eq(sh.pending[0][i], 0.0f);
        ck_assert_float_eq(sh.pending[1][i], 4.0f); /* the other group keeps its sum */
    }
    omv_shard_apply(&sh, 0, 1, &sgd); /* nothing pending, no decay: no change */
    const float same[N] = {1, -1, 2};
    ck_assert_mem_eq(params, same, sizeof(same));
    omv_shard_fini(&sh);
}
END_TEST

static Suite *shard_suite(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("update");
    tcase_add_test(tc, test_momentum_by_hand);
    tcase_add_test(tc, test_mean_of_three);
    tcase_add_test(tc, test_mean_of_two_members);
    tcase_add_test(tc, test_no_contributors);
    tcase_add_test(tc, test_groups_independent);
    tcase_add_test(tc, test_discard);
    tcase_add_test(tc, test_apply_one_is_sum_and_apply);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(shard_suite());
}
