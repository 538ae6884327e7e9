/* A parameter shard: SGD with momentum and weight decay, Adam and AdamW against hand
 * computations, the mean over contributors, per-group pending sums, and discarding; and its
 * thread's answers to pulls once every snapshot is in flight. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "router.h"
#include "bf16.h"
#include "q8.h"
#include "shard.h"
#include "shard_thread.h"
#include "testutil.h"
#include "util.h"

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
    /* The update leaves the sum empty: the next step's first gradient (fp32, then bf16) is
     * written over what is left in it, not added to it. */
    ck_assert(omv_shard_sum_empty(&sh, 0));
    const float c[N] = {1, 1, 1, 1};
    omv_shard_accumulate(&sh, 0, c);
    ck_assert(!omv_shard_sum_empty(&sh, 0));
    omv_shard_apply(&sh, 0, 1, &sgd);
    const float want2[N] = {-3, -2, 2, -0.5f};
    ck_assert_mem_eq(params, want2, sizeof(want2));
    const uint16_t two16[N] = {0x4000, 0x4000, 0x4000, 0x4000}; /* 2.0 in bf16 */
    ck_assert_int_eq(omv_shard_accumulate_bf16(&sh, 0, two16), 0);
    omv_shard_apply(&sh, 0, 1, &sgd);
    const float want3[N] = {-5, -4, 0, -2.5f};
    ck_assert_mem_eq(params, want3, sizeof(want3));
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
    ck_assert(omv_shard_sum_empty(&sh, 0));
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(sh.velocity[i], 0.0f);
    /* The dropped sum does not leak into the next update: w moves by the next gradient and
     * weight decay alone, w -= h + 0.5 w. */
    const omv_sgd_t decay = {.learning_rate = 1.0f, .momentum = 0.0f, .weight_decay = 0.5f};
    const float h[N] = {1, 1, 1};
    omv_shard_accumulate(&sh, 0, h);
    omv_shard_apply(&sh, 0, 1, &decay);
    const float want[N] = {-0.5f, 0.0f, 0.5f};
    ck_assert_mem_eq(params, want, sizeof(want));
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
    ck_assert(omv_shard_sum_empty(&sh, 2));
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
    ck_assert(omv_shard_sum_empty(&sh, 0));
    ck_assert(!omv_shard_sum_empty(&sh, 1));
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(sh.pending[1][i], 4.0f); /* the other group keeps its sum */
    omv_shard_apply(&sh, 0, 1, &sgd);               /* nothing pending, no decay: no change */
    const float same[N] = {1, -1, 2};
    ck_assert_mem_eq(params, same, sizeof(same));
    omv_shard_fini(&sh);
}
END_TEST

/* The thread keeps this many snapshots in flight before it answers a pull with a copy. */
enum { SNAPSHOTS = 16, PULLS = SNAPSHOTS + 4, PULL_COUNT = 1000 };

/* A router on an ipc endpoint in a new temporary folder (dir[cap]; omv_test_rmdir it). */
static omv_router_t *tmp_router(char *dir, size_t cap)
{
    char endpoint[300];
    omv_test_tmpdir(dir, cap);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", dir);
    omv_router_t *router = omv_router_new(endpoint, 0, NULL);
    ck_assert_ptr_nonnull(router);
    return router;
}

/* Pulls of PULLS distinct versions (a RESTORE before each), none of whose answers is closed until
 * the last has come: the first SNAPSHOTS are answered from snapshots, the rest with copies of
 * their own. Every answer must carry its own version's parameters, and closing the answers must
 * free every copy, leaving nothing in flight. */
static void pull_past_snapshots(int threaded)
{
    char dir[256];
    omv_router_t *router = tmp_router(dir, sizeof(dir));
    static float params[PULL_COUNT], src[PULLS][PULL_COUNT];
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, PULL_COUNT, 1), 0);
    omv_shard_thread_t *t = omv_shard_thread_new(router, &sh, 0, threaded);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(omv_shard_thread_threaded(t), threaded);
    omv_pipe_t *pipe = omv_shard_thread_pipe(t);

    const omv_peer_t peer = {.id = "w0", .len = 2};
    for (int v = 0; v < PULLS; v++) {
        for (int i = 0; i < PULL_COUNT; i++)
            src[v][i] = (float)v + (float)i * 0.5f;
        const omv_shard_cmd_t restore = {.type = OMV_SHARD_CMD_RESTORE, .params_src = src[v]};
        ck_assert_int_eq(omv_shard_thread_send(t, &restore, NULL, NULL), 0);
        const omv_shard_cmd_t serve = {.type = OMV_SHARD_CMD_SERVE,
                                       .step = (uint64_t)v,
                                       .worker_id = 7,
                                       .slice_count = 1,
                                       .batch = 1};
        ck_assert_int_eq(omv_shard_thread_send(t, &serve, &peer, NULL), 0);
    }
    uint64_t made, freed;
    if (!threaded) {
        /* The commands ran in the sends, and their answers wait in the pipe, each holding its
         * snapshot or copy. */
        omv_shard_thread_copies(t, &made, &freed);
        ck_assert_uint_eq(made, PULLS - SNAPSHOTS);
        ck_assert_uint_eq(freed, 0);
    }

    /* The answers leave the pipe but stay open, so they hold their buffers as the queued ones
     * did, and the receives wait (with a timeout) for a thread to have answered them all. The
     * first of them is a reply, not the thread's ready signal, which the constructor took. */
    omv_payload_t out[PULLS];
    int n_out = 0, acks = 0;
    for (int k = 0; k < 2 * PULLS; k++) {
        omv_shard_reply_t rep;
        size_t len, extra_len, bytes;
        uint8_t extra[sizeof(peer.id) + OMV_WIRE_MAX_ENVELOPE];
        int has_payload;
        ck_assert_int_lt(n_out, PULLS);
        ck_assert_int_eq(omv_pipe_recv(pipe, &rep, sizeof(rep), &len, extra, sizeof(extra),
                                       &extra_len, &out[n_out], &has_payload, 5000),
                         0);
        ck_assert_uint_eq(len, sizeof(rep));
        if (rep.type == OMV_SHARD_REPLY_ACK) {
            ck_assert_int_eq(has_payload, 0);
            acks++;
            continue;
        }
        ck_assert_uint_eq(rep.type, OMV_SHARD_REPLY_OUT);
        ck_assert_int_eq(has_payload, 1);
        ck_assert_uint_eq(rep.step, (uint64_t)n_out);
        ck_assert_uint_eq(rep.peer_len, peer.len);
        ck_assert_mem_eq(extra, peer.id, peer.len);
        const float *data = omv_payload_data(&out[n_out], &bytes);
        ck_assert_uint_eq(bytes, sizeof(src[n_out]));
        ck_assert_mem_eq(data, src[n_out], bytes);
        n_out++;
    }
    ck_assert_int_eq(acks, PULLS);
    ck_assert_int_eq(n_out, PULLS);
    {
        omv_shard_reply_t rep;
        size_t len, extra_len;
        uint8_t extra[8];
        omv_payload_t p;
        int has_payload;
        ck_assert_int_eq(omv_pipe_recv(pipe, &rep, sizeof(rep), &len, extra, sizeof(extra),
                                       &extra_len, &p, &has_payload, 0),
                         -EAGAIN);
    }
    uint64_t snapshots, serves;
    omv_shard_thread_stats(t, &snapshots, &serves);
    ck_assert_uint_eq(snapshots, SNAPSHOTS);
    ck_assert_uint_eq(serves, PULLS);
    omv_shard_thread_copies(t, &made, &freed);
    ck_assert_uint_eq(made, PULLS - SNAPSHOTS);
    ck_assert_uint_eq(freed, 0);
    ck_assert_int_eq(omv_shard_thread_in_flight(t), 1);

    for (int k = 0; k < n_out; k++)
        omv_payload_close(&out[k]);
    omv_shard_thread_copies(t, &made, &freed);
    ck_assert_uint_eq(made, PULLS - SNAPSHOTS);
    ck_assert_uint_eq(freed, made);
    ck_assert_int_eq(omv_shard_thread_in_flight(t), 0);

    omv_shard_thread_destroy(&t);
    ck_assert_ptr_null(t);
    omv_router_destroy(&router);
    omv_shard_fini(&sh);
    omv_test_rmdir(dir);
}

/* The one pass that takes a gradient in (from a worker's shared segment): the copy, the
 * finite check and the squares are bit for bit what the three passes it replaces give, and
 * "onto zero" is what adding to a zero sum gives, signed zeros too. */
START_TEST(test_take_checked_is_the_three_passes)
{
    enum { N = 1003, TRAINED = 997 };
    static float src[N], dst[N], want[N], zero[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)((i * 7919) % 2001 - 1000) / 64.0f * (i % 3 ? 1.0f : 1e-20f);
    src[5] = -0.0f;
    src[6] = 0.0f;
    src[N - 1] = 1e30f; /* past the trained values: no square of it */
    float squares = -1.0f;
    ck_assert(omv_take_checked(dst, src, N, TRAINED, 0, &squares));
    ck_assert_int_eq(memcmp(dst, src, sizeof(src)), 0);
    float ref = omv_sum_squares(src, TRAINED);
    ck_assert_int_eq(memcmp(&squares, &ref, sizeof(ref)), 0);
    memset(zero, 0, sizeof(zero));
    for (int i = 0; i < N; i++)
        want[i] = zero[i] + src[i];
    ck_assert(omv_take_checked(dst, src, N, TRAINED, 1, &squares));
    ck_assert_int_eq(memcmp(dst, want, sizeof(want)), 0);
    ck_assert(signbit(dst[5]) == 0 && signbit(src[5]) != 0); /* 0.0f + -0.0f is +0 */
    /* A value that is not finite, anywhere, the state's part too. */
    const int at[] = {0, 8, TRAINED - 1, N - 1};
    for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
        float keep = src[at[k]];
        src[at[k]] = k % 2 ? NAN : -INFINITY;
        ck_assert(!omv_take_checked(dst, src, N, TRAINED, 0, &squares));
        ck_assert_int_eq(omv_all_finite(src, N), 0);
        src[at[k]] = keep;
    }
}
END_TEST

/* A later gradient onto the group's sum: dst = sum + src is bit for bit the old copy and
 * sum[i] += copy[i] (signed zeros, tiny and huge values too), the squares are src's, the sum
 * is left as it was, and a value that is not finite is caught wherever it is. */
START_TEST(test_take_checked_onto_is_copy_and_add)
{
    enum { N = 1003, TRAINED = 997 };
    static float src[N], sum[N], keep[N], dst[N], want[N];
    for (int i = 0; i < N; i++) {
        src[i] = (float)((i * 7919) % 2001 - 1000) / 64.0f * (i % 3 ? 1.0f : 1e-20f);
        sum[i] = (float)((i * 104729) % 3001 - 1500) / 16.0f * (i % 5 ? 1.0f : 1e20f);
    }
    src[5] = -0.0f;
    sum[5] = -0.0f; /* -0 + -0 is -0 */
    src[6] = -0.0f;
    sum[6] = 0.0f; /* 0 + -0 is +0 */
    src[7] = 3.0f;
    sum[7] = -3.0f;
    src[N - 1] = 1e30f;
    memcpy(keep, sum, sizeof(sum));
    memcpy(want, sum, sizeof(sum));
    for (int i = 0; i < N; i++)
        want[i] += src[i];
    float squares = -1.0f;
    ck_assert(omv_take_checked_onto(dst, sum, src, N, TRAINED, &squares));
    ck_assert_int_eq(memcmp(dst, want, sizeof(want)), 0);
    ck_assert_int_eq(memcmp(sum, keep, sizeof(sum)), 0);
    ck_assert(signbit(dst[5]) != 0 && signbit(dst[6]) == 0);
    float ref = omv_sum_squares(src, TRAINED);
    ck_assert_int_eq(memcmp(&squares, &ref, sizeof(ref)), 0);
    const int at[] = {0, 8, TRAINED - 1, N - 1};
    for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
        float was = src[at[k]];
        src[at[k]] = k % 2 ? NAN : INFINITY;
        ck_assert(!omv_take_checked_onto(dst, sum, src, N, TRAINED, &squares));
        src[at[k]] = was;
    }
    ck_assert_int_eq(memcmp(sum, keep, sizeof(sum)), 0);
}
END_TEST

START_TEST(test_start_stop)
{
    /* Each start returns with the thread in its loop and its ready signal taken off the pipe,
     * and each stop right after it (QUIT as the first command) joins the thread. */
    char dir[256];
    omv_router_t *router = tmp_router(dir, sizeof(dir));
    float params[4] = {0};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, 4, 1), 0);
    for (int k = 0; k < 20; k++) {
        omv_shard_thread_t *t = omv_shard_thread_new(router, &sh, 0, k % 2 == 0);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(omv_shard_thread_threaded(t), k % 2 == 0);
        omv_shard_reply_t rep;
        size_t len, extra_len;
        uint8_t extra[8];
        omv_payload_t p;
        int has_payload;
        ck_assert_int_eq(omv_pipe_recv(omv_shard_thread_pipe(t), &rep, sizeof(rep), &len, extra,
                                       sizeof(extra), &extra_len, &p, &has_payload, 0),
                         -EAGAIN);
        omv_shard_thread_destroy(&t);
        ck_assert_ptr_null(t);
        /* The loop ends stay with the router until it drops them, as the daemon does between
         * jobs; 20 of them are well under OMV_PIPE_MAX. */
    }
    omv_router_destroy(&router);
    omv_shard_fini(&sh);
    omv_test_rmdir(dir);
}
END_TEST

START_TEST(test_pull_copies_threaded)
{
    pull_past_snapshots(1);
}
END_TEST

START_TEST(test_pull_copies_unthreaded)
{
    pull_past_snapshots(0);
}
END_TEST

/* ---- bf16 on the wire ---- */

enum { BF_COUNT = 1000 };

static void no_release(void *data, void *hint)
{
    (void)data, (void)hint;
}

/* Sends a PUSH of bytes[len] for group 0 alone (its update applies at once). */
static void push_solo_rule(omv_shard_thread_t *t, const void *bytes, size_t len, uint32_t wire,
                           const omv_sgd_t *rule)
{
    omv_payload_t payload;
    ck_assert_int_eq(omv_payload_init_shared(&payload, (void *)bytes, len, no_release, NULL), 0);
    const omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_PUSH,
                                 .group = 0,
                                 .worker_id = 1,
                                 .sgd = *rule,
                                 .solo = 1,
                                 .wire = wire};
    const omv_peer_t peer = {.id = "w1", .len = 2};
    ck_assert_int_eq(omv_shard_thread_send(t, &cmd, &peer, &payload), 0);
}

static void push_solo(omv_shard_thread_t *t, const void *bytes, size_t len, uint32_t wire)
{
    omv_payload_t payload;
    ck_assert_int_eq(omv_payload_init_shared(&payload, (void *)bytes, len, no_release, NULL), 0);
    const omv_shard_cmd_t cmd = {
        .type = OMV_SHARD_CMD_PUSH,
        .group = 0,
        .worker_id = 1,
        .sgd = {.learning_rate = 0.125f, .momentum = 0.5f, .weight_decay = 0.01f},
        .solo = 1,
        .wire = wire};
    const omv_peer_t peer = {.id = "w1", .len = 2};
    ck_assert_int_eq(omv_shard_thread_send(t, &cmd, &peer, &payload), 0);
}

/* Serves a pull as wire asks; checks the Params it says and returns its payload (copied). */
static size_t serve_one(omv_shard_thread_t *t, uint32_t wire, void *out, size_t cap)
{
    const omv_peer_t peer = {.id = "w1", .len = 2};
    const omv_shard_cmd_t serve = {
        .type = OMV_SHARD_CMD_SERVE, .step = 3, .worker_id = 1, .batch = 1, .wire = wire};
    ck_assert_int_eq(omv_shard_thread_send(t, &serve, &peer, NULL), 0);
    omv_shard_reply_t rep;
    size_t len, extra_len, bytes;
    uint8_t extra[sizeof(peer.id) + OMV_WIRE_MAX_ENVELOPE];
    omv_payload_t p;
    int has_payload;
    ck_assert_int_eq(omv_pipe_recv(omv_shard_thread_pipe(t), &rep, sizeof(rep), &len, extra,
                                   sizeof(extra), &extra_len, &p, &has_payload, 5000),
                     0);
    ck_assert_uint_eq(rep.type, OMV_SHARD_REPLY_OUT);
    ck_assert_int_eq(has_payload, 1);
    omv_msg_t m;
    char why[OMV_WIRE_REASON_MAX];
    ck_assert_int_eq(omv_wire_decode(extra + rep.peer_len, extra_len - rep.peer_len, &m, why), 0);
    ck_assert_uint_eq(m.u.params.wire, wire);
    ck_assert_uint_eq(m.u.params.count, BF_COUNT);
    const void *data = omv_payload_data(&p, &bytes);
    ck_assert_uint_eq(bytes, omv_wire_payload_bytes(&m));
    ck_assert_uint_le(bytes, cap);
    memcpy(out, data, bytes);
    omv_payload_close(&p);
    return bytes;
}

/* Two shards a and b of the same parameters, each behind a thread run inline, and a gradient
 * grad: what one wire does to a, the other does to b. */
typedef struct {
    char dir[256];
    omv_router_t *router;
    float a[BF_COUNT], b[BF_COUNT], grad[BF_COUNT];
    omv_shard_t sa, sb;
    omv_shard_thread_t *ta, *tb;
} twin_shards_t;

static twin_shards_t *twins_open(void)
{
    static twin_shards_t t;
    memset(&t, 0, sizeof(t));
    t.router = tmp_router(t.dir, sizeof(t.dir));
    for (int i = 0; i < BF_COUNT; i++) {
        t.a[i] = t.b[i] = 0.001f * (float)(i - 500);
        t.grad[i] = 1.0f / (float)(i + 3) - 0.1f;
    }
    ck_assert_int_eq(omv_shard_init(&t.sa, t.a, 0, BF_COUNT, 1), 0);
    ck_assert_int_eq(omv_shard_init(&t.sb, t.b, 0, BF_COUNT, 1), 0);
    t.ta = omv_shard_thread_new(t.router, &t.sa, 0, 0);
    t.tb = omv_shard_thread_new(t.router, &t.sb, 1, 0);
    ck_assert(t.ta && t.tb);
    return &t;
}

static void twins_close(twin_shards_t *t)
{
    omv_shard_thread_destroy(&t->ta);
    omv_shard_thread_destroy(&t->tb);
    omv_shard_fini(&t->sa);
    omv_shard_fini(&t->sb);
    omv_router_destroy(&t->router);
    omv_test_rmdir(t->dir);
}

/* The next reply of thread th is a refusal of a gradient that is not finite, with no payload. */
static void expect_not_finite(omv_shard_thread_t *th)
{
    omv_shard_reply_t rep;
    size_t len, extra_len;
    uint8_t extra[64];
    omv_payload_t p;
    int has_payload;
    ck_assert_int_eq(omv_pipe_recv(omv_shard_thread_pipe(th), &rep, sizeof(rep), &len, extra,
                                   sizeof(extra), &extra_len, &p, &has_payload, 5000),
                     0);
    ck_assert_uint_eq(rep.type, OMV_SHARD_REPLY_NOT_FINITE);
    ck_assert_int_eq(has_payload, 0);
}

START_TEST(test_bf16_push_and_serve)
{
    twin_shards_t *t = twins_open();
    float *a = t->a, *b = t->b;
    static float widened[BF_COUNT], got32[BF_COUNT];
    static uint16_t grad16[BF_COUNT], want16[BF_COUNT], got16[BF_COUNT];
    /* A bf16 gradient moves the model exactly as the fp32 gradient it stands for. */
    omv_bf16_from_f32(grad16, t->grad, BF_COUNT);
    omv_bf16_to_f32(widened, grad16, BF_COUNT);
    push_solo(t->ta, grad16, sizeof(grad16), OMV_WIRE_BF16);
    push_solo(t->tb, widened, sizeof(widened), OMV_WIRE_FP32);
    ck_assert_mem_eq(a, b, sizeof(t->a));
    ck_assert(a[10] != 0.001f * (float)(10 - 500)); /* it did move */
    /* A pull in bf16 gets the fp32 model rounded, in half the bytes; one in fp32 the model. */
    omv_bf16_from_f32(want16, a, BF_COUNT);
    ck_assert_uint_eq(serve_one(t->ta, OMV_WIRE_BF16, got16, sizeof(got16)), sizeof(got16));
    ck_assert_mem_eq(got16, want16, sizeof(got16));
    ck_assert_uint_eq(serve_one(t->ta, OMV_WIRE_FP32, got32, sizeof(got32)), sizeof(got32));
    ck_assert_mem_eq(got32, a, sizeof(got32));
    ck_assert_uint_eq(serve_one(t->ta, OMV_WIRE_BF16, got16, sizeof(got16)), sizeof(got16));
    ck_assert_mem_eq(got16, want16, sizeof(got16));
    /* A gradient whose size fits neither is dropped, and the model stays. */
    push_solo(t->ta, grad16, sizeof(grad16) - 2, OMV_WIRE_BF16);
    ck_assert_mem_eq(a, b, sizeof(t->a));
    /* A bf16 gradient with an infinity (or a NaN) is refused and changes nothing. */
    static uint16_t bad16[BF_COUNT];
    memcpy(bad16, grad16, sizeof(bad16));
    bad16[BF_COUNT - 1] = 0xff80; /* -inf */
    push_solo(t->ta, bad16, sizeof(bad16), OMV_WIRE_BF16);
    ck_assert_mem_eq(a, b, sizeof(t->a));
    expect_not_finite(t->ta);
    twins_close(t);
}
END_TEST

START_TEST(test_int8_push)
{
    /* An int8 gradient moves the model exactly as the fp32 values it decodes to; one of the
     * wrong size is dropped; one whose scale is NaN (what the worker sends for a gradient with
     * a NaN or an infinity) is refused and changes nothing. */
    twin_shards_t *t = twins_open();
    static float widened[BF_COUNT];
    static unsigned char grad8[BF_COUNT + 4 * ((BF_COUNT + OMV_Q8_BLOCK - 1) / OMV_Q8_BLOCK)];
    ck_assert_uint_eq(omv_q8_bytes(BF_COUNT), sizeof(grad8));
    omv_q8_encode(grad8, t->grad, NULL, BF_COUNT);
    omv_q8_decode(widened, grad8, BF_COUNT);
    push_solo(t->ta, grad8, sizeof(grad8), OMV_WIRE_INT8);
    push_solo(t->tb, widened, sizeof(widened), OMV_WIRE_FP32);
    ck_assert_mem_eq(t->a, t->b, sizeof(t->a));
    ck_assert(t->a[10] != 0.001f * (float)(10 - 500));
    push_solo(t->ta, grad8, sizeof(grad8) - 1, OMV_WIRE_INT8);
    ck_assert_mem_eq(t->a, t->b, sizeof(t->a));
    float nan = NAN;
    memcpy(grad8 + 4, &nan, sizeof(nan)); /* block 1's scale */
    push_solo(t->ta, grad8, sizeof(grad8), OMV_WIRE_INT8);
    expect_not_finite(t->ta);
    ck_assert_mem_eq(t->a, t->b, sizeof(t->a));
    twins_close(t);
}
END_TEST

START_TEST(test_weighted_mean_of_uneven_members)
{
    /* 64 images over 3 members: 22, 21, 21. Each gradient counts for its images over the mean
     * share (22 * 3 / 64 and 21 * 3 / 64), so the update is the mean weighted by images:
     * (22 g1 + 21 g2 + 21 g3) / 64, by hand below. */
    char dir[256];
    omv_router_t *router = tmp_router(dir, sizeof(dir));
    enum { N = 4 };
    static float params[N] = {0.5f, -0.25f, 1.0f, 0.0f};
    static const float g[3][N] = {{1, 2, 3, 4}, {0.5f, -1, 7, 0}, {-0.25f, 0.125f, 0, 1}};
    const uint32_t images[3] = {22, 21, 21};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    omv_shard_thread_t *t = omv_shard_thread_new(router, &sh, 0, 0);
    ck_assert_ptr_nonnull(t);
    const omv_sgd_t sgd = {.learning_rate = 0.5f, .momentum = 0.9f, .weight_decay = 0};
    const omv_peer_t peer = {.id = "w1", .len = 2};
    for (int m = 0; m < 3; m++) {
        omv_payload_t payload;
        ck_assert_int_eq(
            omv_payload_init_shared(&payload, (void *)g[m], sizeof(g[m]), no_release, NULL), 0);
        const omv_shard_cmd_t push = {.type = OMV_SHARD_CMD_PUSH,
                                      .worker_id = (uint32_t)m + 1,
                                      .sgd = sgd,
                                      .weight = (float)(images[m] * 3) / 64.0f};
        ck_assert_int_eq(omv_shard_thread_send(t, &push, &peer, &payload), 0);
    }
    const omv_shard_cmd_t apply = {.type = OMV_SHARD_CMD_APPLY, .sgd = sgd};
    ck_assert_int_eq(omv_shard_thread_send(t, &apply, NULL, NULL), 0);
    /* By hand, for the first value: (22 * 1 + 21 * 0.5 + 21 * -0.25) / 64 = 27.25 / 64, so
     * w = 0.5 - 0.5 * 27.25 / 64 = 0.287109375. */
    ck_assert_float_eq_tol(params[0], 0.287109375f, 1e-6f);
    for (int i = 0; i < N; i++) {
        double mean = (22.0 * g[0][i] + 21.0 * g[1][i] + 21.0 * g[2][i]) / 64.0;
        ck_assert_float_eq_tol(params[i],
                               (float)((i == 0   ? 0.5
                                        : i == 1 ? -0.25
                                        : i == 2 ? 1.0
                                                 : 0.0) -
                                       0.5 * mean),
                               1e-6f);
    }
    omv_shard_thread_destroy(&t);
    omv_shard_fini(&sh);
    omv_router_destroy(&router);
    omv_test_rmdir(dir);
}
END_TEST

/* Adam as torch.optim.Adam and AdamW document it, written out on its own in double: t is the
 * step (from 1), m and s the moments. */
static void reference_adam(double *w, double *m, double *s, const double *g_in, int n, int t,
                           double lr, double b1, double b2, double eps, double wd, int decoupled)
{
    for (int i = 0; i < n; i++) {
        double g = g_in[i];
        if (decoupled)
            w[i] -= lr * wd * w[i];
        else
            g += wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        s[i] = b2 * s[i] + (1 - b2) * g * g;
        double mhat = m[i] / (1 - pow(b1, t)), shat = s[i] / (1 - pow(b2, t));
        w[i] -= lr * mhat / (sqrt(shat) + eps);
    }
}

/* Three steps of Adam and of AdamW on the mean of two members' gradients: the first by hand,
 * all three against the reference. */
static void adam_three_steps(uint32_t kind, float wd)
{
    enum { N = 3 };
    float params[N] = {1.0f, -2.0f, 0.5f};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    ck_assert_int_eq(omv_shard_use_adam(&sh), 0);
    const omv_sgd_t rule = {.learning_rate = 0.1f,
                            .momentum = 0.9f,
                            .weight_decay = wd,
                            .kind = kind,
                            .beta2 = 0.999,
                            .epsilon = 1e-8f};
    const float grads[3][2][N] = {
        {{1.5f, -0.75f, 0.0f}, {0.5f, -0.25f, 0.5f}},
        {{0.75f, -0.5f, 2.0f}, {0.25f, 1.0f, -3.0f}},
        {{-1.0f, 0.125f, 0.5f}, {3.0f, 0.375f, 1.5f}},
    };
    double w[N] = {1.0, -2.0, 0.5}, m[N] = {0}, v[N] = {0};
    for (int t = 1; t <= 3; t++) {
        double mean[N];
        for (int i = 0; i < N; i++)
            mean[i] = ((double)grads[t - 1][0][i] + grads[t - 1][1][i]) / 2;
        omv_shard_accumulate(&sh, 0, grads[t - 1][0]);
        omv_shard_accumulate(&sh, 0, grads[t - 1][1]);
        omv_shard_apply(&sh, 0, 2, &rule);
        if (t == 1 && wd == 0.0f) {
            /* By hand: after one step m / (1 - b1) = g and s / (1 - b2) = g^2, so each weight
             * moves by the learning rate against its gradient's sign (means {1, -0.5, 0.25}),
             * less eps / |g|. */
            ck_assert_float_eq_tol(params[0], 0.9f, 1e-6f);
            ck_assert_float_eq_tol(params[1], -1.9f, 1e-6f);
            ck_assert_float_eq_tol(params[2], 0.4f, 1e-6f);
            ck_assert_float_eq_tol(sh.velocity[1], -0.05f, 1e-7f);
            ck_assert_float_eq_tol(sh.second[1], 0.00025f, 1e-9f);
        }
        reference_adam(w, m, v, mean, N, t, 0.1, 0.9, 0.999, 1e-8, wd, kind == OMV_UPDATE_ADAMW);
        for (int i = 0; i < N; i++) {
            ck_assert_float_eq_tol(params[i], (float)w[i], 2e-6f);
            ck_assert_float_eq_tol(sh.velocity[i], (float)m[i], 1e-6f);
            ck_assert_float_eq_tol(sh.second[i], (float)v[i], 1e-6f);
        }
    }
    ck_assert_uint_eq(sh.steps, 3);
    omv_shard_fini(&sh);
    ck_assert_ptr_null(sh.second);
}

START_TEST(test_adam_by_hand)
{
    adam_three_steps(OMV_UPDATE_ADAM, 0.0f);
    adam_three_steps(OMV_UPDATE_ADAM, 0.25f); /* L2: added to the gradient */
}
END_TEST

START_TEST(test_adamw_by_hand)
{
    adam_three_steps(OMV_UPDATE_ADAMW, 0.0f);
    /* Decoupled, by hand for the first weight of step 1: w = 1 * (1 - 0.1 * 0.5) - 0.1 = 0.85,
     * the decay not touching the moments. */
    enum { N = 1 };
    float params[N] = {1.0f};
    const float g[N] = {2.0f};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, params, 0, N, 1), 0);
    ck_assert_int_eq(omv_shard_use_adam(&sh), 0);
    const omv_sgd_t rule = {.learning_rate = 0.1f,
                            .momentum = 0.9f,
                            .weight_decay = 0.5f,
                            .kind = OMV_UPDATE_ADAMW,
                            .beta2 = 0.999,
                            .epsilon = 1e-8f};
    omv_shard_apply_one(&sh, g, &rule);
    ck_assert_float_eq_tol(params[0], 0.85f, 1e-6f);
    ck_assert_float_eq_tol(sh.velocity[0], 0.2f, 1e-7f);
    omv_shard_fini(&sh);
    adam_three_steps(OMV_UPDATE_ADAMW, 0.5f);
}
END_TEST

/* The state a probe base or a checkpoint keeps (parameters, both moments and the step count)
 * is all Adam needs: a shard restored from it goes on exactly as the one it was taken from; and
 * a bf16 gradient moves it exactly as its fp32 widening. */
START_TEST(test_adam_state_restores_and_bf16)
{
    char dir[256];
    omv_router_t *router = tmp_router(dir, sizeof(dir));
    enum { N = 64 };
    static float a[N], b[N], grad[N], widened[N], p_out[N], m_out[N], s_out[N];
    static uint16_t grad16[N];
    for (int i = 0; i < N; i++) {
        a[i] = 0.01f * (float)(i - 30);
        b[i] = 5.0f; /* overwritten by the restore */
        grad[i] = 1.0f / (float)(i + 3) - 0.1f;
    }
    omv_bf16_from_f32(grad16, grad, N);
    omv_bf16_to_f32(widened, grad16, N);
    omv_shard_t sa, sb;
    ck_assert_int_eq(omv_shard_init(&sa, a, 0, N, 1), 0);
    ck_assert_int_eq(omv_shard_init(&sb, b, 0, N, 1), 0);
    ck_assert_int_eq(omv_shard_use_adam(&sa), 0);
    ck_assert_int_eq(omv_shard_use_adam(&sb), 0);
    omv_shard_thread_t *ta = omv_shard_thread_new(router, &sa, 0, 0);
    omv_shard_thread_t *tb = omv_shard_thread_new(router, &sb, 0, 0);
    ck_assert(ta && tb);
    const omv_sgd_t rule = {.learning_rate = 0.01f,
                            .momentum = 0.9f,
                            .weight_decay = 0.01f,
                            .kind = OMV_UPDATE_ADAMW,
                            .beta2 = 0.99f,
                            .epsilon = 1e-8f};
    push_solo_rule(ta, grad, sizeof(grad), OMV_WIRE_FP32, &rule);
    push_solo_rule(ta, widened, sizeof(widened), OMV_WIRE_FP32, &rule);
    uint64_t steps[1] = {0};
    const omv_shard_cmd_t gather = {.type = OMV_SHARD_CMD_GATHER,
                                    .params_dst = p_out,
                                    .velocity_dst = m_out,
                                    .second_dst = s_out,
                                    .steps_dst = steps};
    ck_assert_int_eq(omv_shard_thread_send(ta, &gather, NULL, NULL), 0);
    ck_assert_uint_eq(steps[0], 2);
    const omv_shard_cmd_t restore = {.type = OMV_SHARD_CMD_RESTORE,
                                     .params_src = p_out,
                                     .velocity_src = m_out,
                                     .second_src = s_out,
                                     .steps_src = steps};
    ck_assert_int_eq(omv_shard_thread_send(tb, &restore, NULL, NULL), 0);
    ck_assert_mem_eq(a, b, sizeof(a));
    /* Step 3: bf16 on one, its widening in fp32 on the other. */
    push_solo_rule(ta, grad16, sizeof(grad16), OMV_WIRE_BF16, &rule);
    push_solo_rule(tb, widened, sizeof(widened), OMV_WIRE_FP32, &rule);
    ck_assert_uint_eq(sb.steps, 3);
    for (int i = 0; i < N; i++) {
        ck_assert_float_eq_tol(a[i], b[i], 1e-7f);
        ck_assert_float_eq_tol(sa.second[i], sb.second[i], 1e-9f);
    }
    ck_assert(a[0] != p_out[0]); /* it did move */
    omv_shard_thread_destroy(&ta);
    omv_shard_thread_destroy(&tb);
    omv_shard_fini(&sa);
    omv_shard_fini(&sb);
    omv_router_destroy(&router);
    omv_test_rmdir(dir);
}
END_TEST

START_TEST(test_state_takes_the_mean)
{
    /* A shard over values 4..8 of a model whose state (batch norm's running statistics) begins
     * at 6: values 4 and 5 are trained by SGD, 6 and 7 become the mean of what the members
     * sent, untouched by momentum, decay or Adam. */
    enum { N = 4 };
    float model[8] = {0, 0, 0, 0, 1.0f, 2.0f, 5.0f, 5.0f};
    omv_shard_t sh;
    ck_assert_int_eq(omv_shard_init(&sh, model + 4, 4, N, 1), 0);
    omv_shard_set_state(&sh, 6);
    ck_assert_uint_eq(sh.trained, 2);
    const omv_sgd_t sgd = {.learning_rate = 0.5f, .momentum = 0.9f, .weight_decay = 0.5f};
    const float a[N] = {1.0f, 0.0f, 0.25f, 3.0f}, b[N] = {3.0f, 2.0f, 0.75f, 1.0f};
    omv_shard_accumulate(&sh, 0, a);
    omv_shard_accumulate(&sh, 0, b);
    omv_shard_apply(&sh, 0, 2, &sgd);
    /* w0: g = 2 + 0.5 = 2.5, w = 1 - 1.25; w1: g = 1 + 1 = 2, w = 2 - 1. */
    ck_assert_float_eq(model[4], -0.25f);
    ck_assert_float_eq(model[5], 1.0f);
    ck_assert_float_eq(model[6], 0.5f);
    ck_assert_float_eq(model[7], 2.0f);
    ck_assert_float_eq(sh.velocity[2], 0.0f);
    /* A group of one: the state is what it sent, in fp32 and in bf16 (exact for these). */
    const float c[N] = {0.0f, 0.0f, 0.375f, -4.0f};
    omv_shard_apply_one(&sh, c, &sgd);
    ck_assert_float_eq(model[6], 0.375f);
    ck_assert_float_eq(model[7], -4.0f);
    uint16_t c16[N];
    const float d[N] = {0.0f, 0.0f, 1.5f, 0.125f};
    omv_bf16_from_f32(c16, d, N);
    ck_assert_int_eq(omv_shard_use_adam(&sh), 0);
    const omv_sgd_t adam = {.learning_rate = 0.1f,
                            .momentum = 0.9f,
                            .kind = OMV_UPDATE_ADAM,
                            .beta2 = 0.999,
                            .epsilon = 1e-8f};
    omv_shard_apply_one_bf16(&sh, c16, &adam);
    ck_assert_float_eq(model[6], 1.5f);
    ck_assert_float_eq(model[7], 0.125f);
    ck_assert_float_eq(sh.second[3], 0.0f);
    /* A shard wholly before or after the state. */
    omv_shard_set_state(&sh, 100);
    ck_assert_uint_eq(sh.trained, N);
    omv_shard_set_state(&sh, 2);
    ck_assert_uint_eq(sh.trained, 0);
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
    tcase_add_test(tc, test_take_checked_is_the_three_passes);
    tcase_add_test(tc, test_take_checked_onto_is_copy_and_add);
    tcase_add_test(tc, test_apply_one_is_sum_and_apply);
    tcase_add_test(tc, test_adam_by_hand);
    tcase_add_test(tc, test_adamw_by_hand);
    tcase_add_test(tc, test_state_takes_the_mean);
    suite_add_tcase(s, tc);
    TCase *th = tcase_create("thread");
    tcase_add_test(th, test_start_stop);
    tcase_add_test(th, test_pull_copies_threaded);
    tcase_add_test(th, test_pull_copies_unthreaded);
    tcase_add_test(th, test_bf16_push_and_serve);
    tcase_add_test(th, test_int8_push);
    tcase_add_test(th, test_weighted_mean_of_uneven_members);
    tcase_add_test(th, test_adam_state_restores_and_bf16);
    suite_add_tcase(s, th);
    return s;
}

int main(void)
{
    return omv_test_run(shard_suite());
}
