/* Every layer kind of the gradient engine: finite-difference checks of the parameter gradients
 * through each kind (layers without parameters sit between layers with them, so their backward
 * carries the checked gradient), the convolution against a direct convolution written here,
 * pooling by hand, and dropout's mask. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gemm.h"
#include "model.h"
#include "net.h"
#include "rng.h"
#include "testutil.h"

static omv_model_layout_t parse(const char *text)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    int r = omv_model_parse(&l, text, "test", err);
    ck_assert_msg(r == 0, "%s", err);
    return l;
}

typedef struct {
    omv_net_t *net;
    float *params, *grad, *scratch;
    float *x;
    uint8_t *y;
    uint32_t batch;
    uint64_t dropout_seed;
} fixture_t;

static float loss_at(fixture_t *f, float *grad)
{
    /* Dropout masks are drawn from a fixed stream so that every evaluation sees the same one. */
    omv_net_seed(f->net, f->dropout_seed);
    return omv_net_train_step(f->net, f->params, f->x, f->y, f->batch, grad);
}

static float central(fixture_t *f, size_t i, float eps)
{
    float saved = f->params[i];
    f->params[i] = saved + eps;
    float lp = loss_at(f, f->scratch);
    f->params[i] = saved - eps;
    float lm = loss_at(f, f->scratch);
    f->params[i] = saved;
    return (lp - lm) / (2.0f * eps);
}

/* Whether parameter i is among per evenly spaced weights of its layer, or among 3 of its
 * biases (per 0: every parameter is). */
static bool sampled(const omv_model_layout_t *l, size_t i, size_t per)
{
    if (per == 0)
        return true;
    for (uint32_t j = 0; j < l->n_layers; j++) {
        const omv_model_layer_t *L = &l->layers[j];
        size_t w_step = L->w_count / per ? L->w_count / per : 1;
        size_t b_step = L->b_count / 3 ? L->b_count / 3 : 1;
        if (i >= L->w_offset && i < L->w_offset + L->w_count)
            return (i - L->w_offset) % w_step == w_step / 2;
        if (i >= L->b_offset && i < L->b_offset + L->b_count)
            return (i - L->b_offset) % b_step == b_step / 2;
    }
    return false;
}

/* Builds the model, checks the gradient of every parameter (per 0) or of a sample of each
 * layer's (sampled) against central differences at two step sizes (a parameter where they
 * disagree sits on a ReLU or max kink and is skipped; there must be few), and returns how many
 * disagreed with the analytic gradient. */
static int gradient_mismatches_sampled(const char *text, uint32_t batch, uint64_t seed, size_t per)
{
    omv_model_layout_t l = parse(text);
    fixture_t f = {0};
    f.batch = batch;
    f.dropout_seed = seed * 7 + 1;
    f.net = omv_net_new(&l, batch + 3); /* a batch below the built size on purpose */
    ck_assert_ptr_nonnull(f.net);
    size_t n = l.param_count;
    f.params = malloc(n * sizeof(float));
    f.grad = malloc(n * sizeof(float));
    f.scratch = malloc(n * sizeof(float));
    f.x = malloc((size_t)batch * l.inputs * sizeof(float));
    f.y = malloc(batch);
    omv_model_init(&l, f.params, seed);
    omv_rng_t rng;
    omv_rng_init(&rng, seed + 100);
    for (size_t i = 0; i < n; i++) /* biases become nonzero too */
        f.params[i] += (float)(omv_rng_uniform(&rng) - 0.5) * 0.2f;
    for (size_t i = 0; i < (size_t)batch * l.inputs; i++)
        f.x[i] = (float)omv_rng_normal(&rng);
    for (uint32_t i = 0; i < batch; i++)
        f.y[i] = (uint8_t)omv_rng_below(&rng, l.classes);

    float loss = loss_at(&f, f.grad);
    ck_assert(isfinite(loss) && loss > 0.0f);
    /* The gradient is written, not added: a dirty buffer gives the same result. */
    for (size_t i = 0; i < n; i++)
        f.scratch[i] = 123.0f;
    ck_assert_float_eq(loss_at(&f, f.scratch), loss);
    ck_assert_mem_eq(f.scratch, f.grad, n * sizeof(float));

    const float eps = 3e-3f;
    int kinks = 0, bad = 0, checked = 0;
    /* The state after state_offset (batch norm's running statistics) is not trained: what the
     * step writes there is checked in test_batchnorm_running_stats. */
    n = l.state_offset;
    for (size_t i = 0; i < n; i++) {
        if (!sampled(&l, i, per))
            continue;
        checked++;
        float num = central(&f, i, eps);
        float half = central(&f, i, eps / 2);
        if (fabsf(num - half) > 2e-3f + 1e-2f * fabsf(num)) {
            kinks++;
            continue;
        }
        float tol = 1e-2f * fmaxf(1.0f, fabsf(num)) + 1e-3f;
        if (fabsf(num - f.grad[i]) > tol) {
            if (bad < 5)
                fprintf(stderr, "%s: parameter %zu: numeric %g analytic %g\n", text, i, (double)num,
                        (double)f.grad[i]);
            bad++;
        }
    }
    ck_assert_msg(kinks <= checked / 20 + 1, "%d of %d parameters on kinks", kinks, checked);
    /* A zero gradient everywhere would pass a careless check: some must be large. */
    float largest = 0.0f;
    for (size_t i = 0; i < n; i++)
        largest = fmaxf(largest, fabsf(f.grad[i]));
    ck_assert_float_gt(largest, 1e-2f);
    free(f.params), free(f.grad), free(f.scratch), free(f.x), free(f.y);
    omv_net_destroy(&f.net);
    return bad;
}

static int gradient_mismatches(const char *text, uint32_t batch, uint64_t seed)
{
    return gradient_mismatches_sampled(text, batch, seed, 0);
}

START_TEST(test_fc_gradients)
{
    /* fc on an image takes it as a flat vector. */
    ck_assert_int_eq(gradient_mismatches("input 2x3x3\nfc 5\nfc 3\n", 4, 1), 0);
}
END_TEST

START_TEST(test_relu_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 6\nfc 7\nrelu\nfc 5\nrelu\nfc 3\n", 5, 2), 0);
}
END_TEST

START_TEST(test_conv_gradients)
{
    static const char *const models[] = {
        "input 3x6x5\nconv 4 3x3 stride 2 pad 1\nfc 3\n",
        "input 2x5x5\nconv 3 3x2 pad 1\nfc 3\n",
        "input 1x7x7\nconv 2 5x5 pad 2\nfc 2\n",
        "input 2x4x4\nconv 3 1x1\nfc 3\n",
        /* The second convolution's input gradient (col2im) reaches the first one's weights. */
        "input 2x6x6\nconv 3 3x3 pad 1\nconv 4 3x3 stride 2\nfc 3\n",
    };
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
        ck_assert_int_eq(gradient_mismatches(models[i], 3, 10 + i), 0);
}
END_TEST

/* The convolution tests run once per kernel set (worker/gemm.h): BLAS with the generic
 * lowering, then our AVX2 and AVX-512 kernels where the CPU has them. False: skipped. */
static bool use_kernels(int i)
{
    static const omv_gemm_kernels_t sets[] = {OMV_GEMM_BLAS, OMV_GEMM_AVX2, OMV_GEMM_AVX512};
    if (omv_gemm_use(sets[i]) == 0)
        return true;
    fprintf(stderr, "test_layers: no %s kernels here: skipped\n", omv_gemm_name(sets[i]));
    return false;
}

START_TEST(test_wide_conv_gradients)
{
    if (!use_kernels(_i))
        return;
    /* Channels that fill whole vectors take the engine's own GEMM kernels (worker/gemm.c); in
     * the first model images large enough for several lowering chunks (14 images of 16x8x8
     * through a 3x3 fill one): batch 17 runs a full chunk and a short one, backward from the
     * last. A sample of the parameters (8 weights and 3 biases a layer), and a batch of 4 for
     * the others, keep it quick (under valgrind too). */
    static const char *const defs[] = {
        "input 16x8x8\nconv 16 3x3 pad 1\nrelu\nconv 32 3x3 stride 2 pad 1\nglobalavgpool\nfc 3\n",
        "input 8x8x8\nconv 16 3x3 pad 1\nconv 16 3x3 pad 1\nflatten\nfc 3\n",
        "input 8x5x6\nconv 8 5x5 pad 2\nconv 16 5x3 stride 2 pad 2\nflatten\nfc 3\n",
        /* A first layer's weight gradient made transposed (k = 9 fills no vector, 16 does). */
        "input 1x9x9\nconv 16 3x3 pad 1\nconv 8 5x5 stride 2 pad 2\nflatten\nfc 3\n",
    };
    for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++)
        ck_assert_int_eq(gradient_mismatches_sampled(defs[i], i == 0 ? 17 : 4, 40 + i, 8), 0);
}
END_TEST

START_TEST(test_maxpool_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 2x6x6\nconv 3 3x3 pad 1\nmaxpool 2\nfc 3\n", 3, 3),
                     0);
    /* Overlapping windows: one input can be the maximum of two outputs. */
    ck_assert_int_eq(
        gradient_mismatches("input 1x7x7\nconv 2 3x3 pad 1\nmaxpool 3 stride 2\nfc 3\n", 3, 4), 0);
}
END_TEST

START_TEST(test_avgpool_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 2x6x6\nconv 3 3x3 pad 1\navgpool 2\nfc 3\n", 3, 5),
                     0);
    ck_assert_int_eq(
        gradient_mismatches("input 1x7x7\nconv 2 3x3\navgpool 3x2 stride 2\nfc 3\n", 3, 6), 0);
}
END_TEST

START_TEST(test_dropout_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 6\nfc 8\ndropout 0.5\nfc 3\n", 4, 7), 0);
    ck_assert_int_eq(
        gradient_mismatches("input 2x4x4\nconv 3 3x3\ndropout 0.25\nrelu\nfc 3\n", 4, 8), 0);
}
END_TEST

START_TEST(test_flatten_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 2x4x4\nconv 3 3x3\nflatten\nrelu\nfc 3\n", 3, 9),
                     0);
    ck_assert_int_eq(gradient_mismatches("input 2x3x3\nflatten\nfc 4\nfc 3\n", 3, 10), 0);
}
END_TEST

START_TEST(test_whole_cnn_gradients)
{
    ck_assert_int_eq(gradient_mismatches("input 1x8x8\nconv 3 3x3 pad 1\nrelu\nmaxpool 2\n"
                                         "conv 4 3x3 pad 1\nrelu\navgpool 2\nflatten\nfc 6\n"
                                         "relu\ndropout 0.2\nfc 3\nsoftmax\n",
                                         4, 11),
                     0);
}
END_TEST

/* A direct convolution on channels-first images with channels-first weights, written without
 * the engine's lowering: out[n][o][oy][ox] = b[o] + sum w[o][c][ky][kx] * in[n][c][y][x]. */
static void direct_conv(const float *in, const float *w, const float *b, float *out, uint32_t nb,
                        uint32_t c, uint32_t h, uint32_t wd, uint32_t o, uint32_t kh, uint32_t kw,
                        uint32_t stride, uint32_t pad, uint32_t oh, uint32_t ow)
{
    for (uint32_t n = 0; n < nb; n++)
        for (uint32_t oc = 0; oc < o; oc++)
            for (uint32_t oy = 0; oy < oh; oy++)
                for (uint32_t ox = 0; ox < ow; ox++) {
                    double sum = b[oc];
                    for (uint32_t ic = 0; ic < c; ic++)
                        for (uint32_t ky = 0; ky < kh; ky++)
                            for (uint32_t kx = 0; kx < kw; kx++) {
                                int y = (int)(oy * stride + ky) - (int)pad;
                                int x = (int)(ox * stride + kx) - (int)pad;
                                if (y < 0 || x < 0 || y >= (int)h || x >= (int)wd)
                                    continue;
                                sum += (double)w[((oc * c + ic) * kh + ky) * kw + kx] *
                                       in[((n * c + ic) * h + (uint32_t)y) * wd + (uint32_t)x];
                            }
                    out[((n * o + oc) * oh + oy) * ow + ox] = (float)sum;
                }
}

START_TEST(test_conv_matches_direct)
{
    if (!use_kernels(_i))
        return;
    static const struct {
        uint32_t c, h, w, o, kh, kw, stride, pad;
    } cases[] = {
        {1, 8, 8, 4, 5, 5, 1, 2},
        {3, 7, 6, 5, 3, 3, 2, 1},
        {2, 9, 5, 3, 3, 2, 1, 0},
        {4, 6, 6, 2, 1, 1, 1, 0},
        {2, 10, 10, 3, 4, 4, 3, 2},
        /* Whole vectors of channels (the engine's own kernels), and in the second images large
         * enough to be lowered one at a time (worker/layers.c, CONV_CHUNK_FLOATS). */
        {16, 9, 7, 32, 3, 3, 2, 1},
        {16, 28, 28, 16, 3, 3, 1, 1},
        /* Windows wider than the image, uneven strides, 8 channels (AVX2 vectors). */
        {8, 5, 6, 16, 5, 5, 1, 2},
        {16, 4, 4, 16, 5, 5, 2, 3},
        {8, 10, 3, 8, 3, 1, 3, 0},
    };
    enum { NB = 3 };
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        uint32_t c = cases[t].c, h = cases[t].h, wd = cases[t].w, o = cases[t].o;
        uint32_t kh = cases[t].kh, kw = cases[t].kw, s = cases[t].stride, p = cases[t].pad;
        char text[256];
        snprintf(text, sizeof(text), "input %ux%ux%u\nconv %u %ux%u stride %u pad %u\nfc 2\n", c, h,
                 wd, o, kh, kw, s, p);
        omv_model_layout_t l = parse(text);
        const omv_model_layer_t *cl = &l.layers[0];
        uint32_t oh = (h + 2 * p - kh) / s + 1, ow = (wd + 2 * p - kw) / s + 1;
        ck_assert_uint_eq(cl->out.h, oh);
        ck_assert_uint_eq(cl->out.w, ow);
        ck_assert_uint_eq(cl->out.c, o);

        size_t in_n = (size_t)NB * c * h * wd, w_n = (size_t)o * c * kh * kw;
        size_t out_n = (size_t)NB * o * oh * ow;
        float *in_chw = malloc(in_n * sizeof(float)), *in_hwc = malloc(in_n * sizeof(float));
        float *w_chw = malloc(w_n * sizeof(float)), *bias = malloc(o * sizeof(float));
        float *want = malloc(out_n * sizeof(float));
        float *params = calloc(l.param_count, sizeof(float));
        float *grad = malloc(l.param_count * sizeof(float));
        omv_rng_t rng;
        omv_rng_init(&rng, 40 + t);
        for (size_t i = 0; i < in_n; i++)
            in_chw[i] = (float)omv_rng_normal(&rng);
        for (size_t i = 0; i < w_n; i++)
            w_chw[i] = (float)omv_rng_normal(&rng);
        for (uint32_t i = 0; i < o; i++)
            bias[i] = (float)omv_rng_normal(&rng);
        direct_conv(in_chw, w_chw, bias, want, NB, c, h, wd, o, kh, kw, s, p, oh, ow);

        /* The engine's layouts: channels-last images, weights [o][ky][kx][c]. */
        for (uint32_t n = 0; n < NB; n++)
            for (uint32_t ic = 0; ic < c; ic++)
                for (uint32_t y = 0; y < h; y++)
                    for (uint32_t x = 0; x < wd; x++)
                        in_hwc[((n * h + y) * wd + x) * c + ic] =
                            in_chw[((n * c + ic) * h + y) * wd + x];
        float *w = params + cl->w_offset;
        for (uint32_t oc = 0; oc < o; oc++)
            for (uint32_t ic = 0; ic < c; ic++)
                for (uint32_t ky = 0; ky < kh; ky++)
                    for (uint32_t kx = 0; kx < kw; kx++)
                        w[((oc * kh + ky) * kw + kx) * c + ic] =
                            w_chw[((oc * c + ic) * kh + ky) * kw + kx];
        memcpy(params + cl->b_offset, bias, o * sizeof(float));

        omv_net_t *net = omv_net_new(&l, NB);
        ck_assert_ptr_nonnull(net);
        uint8_t y[NB] = {0, 1, 0};
        omv_net_train_step(net, params, in_hwc, y, NB, grad);
        const float *got = omv_net_output(net, 0);
        for (uint32_t n = 0; n < NB; n++)
            for (uint32_t oc = 0; oc < o; oc++)
                for (uint32_t oy = 0; oy < oh; oy++)
                    for (uint32_t ox = 0; ox < ow; ox++) {
                        float a = got[((n * oh + oy) * ow + ox) * o + oc];
                        float b = want[((n * o + oc) * oh + oy) * ow + ox];
                        ck_assert_msg(fabsf(a - b) <= 1e-4f * (1.0f + fabsf(b)),
                                      "case %zu: out[%u][%u][%u][%u] = %g, direct %g", t, n, oc, oy,
                                      ox, (double)a, (double)b);
                    }
        omv_net_destroy(&net);
        free(in_chw), free(in_hwc), free(w_chw), free(bias), free(want), free(params), free(grad);
    }
}
END_TEST

START_TEST(test_pooling_by_hand)
{
    /* One channel, 4x4 image 0..15: 2x2 max pooling takes each window's bottom-right value,
     * average pooling its mean. */
    static const char *const defs[] = {"input 1x4x4\nmaxpool 2\nfc 2\n",
                                       "input 1x4x4\navgpool 2\nfc 2\n"};
    const float want[2][4] = {{5, 7, 13, 15}, {2.5f, 4.5f, 10.5f, 12.5f}};
    for (int k = 0; k < 2; k++) {
        omv_model_layout_t l = parse(defs[k]);
        ck_assert_uint_eq(l.layers[0].out.h, 2);
        omv_net_t *net = omv_net_new(&l, 1);
        float x[16], *params = calloc(l.param_count, sizeof(float));
        float *grad = malloc(l.param_count * sizeof(float));
        for (int i = 0; i < 16; i++)
            x[i] = (float)i;
        uint8_t y = 1;
        omv_net_train_step(net, params, x, &y, 1, grad);
        const float *out = omv_net_output(net, 0);
        for (int i = 0; i < 4; i++)
            ck_assert_float_eq(out[i], want[k][i]);
        free(params), free(grad);
        omv_net_destroy(&net);
    }
}
END_TEST

START_TEST(test_dropout_mask)
{
    omv_model_layout_t l = parse("input 1000\ndropout 0.3\nfc 2\n");
    omv_net_t *net = omv_net_new(&l, 2);
    float *x = malloc(2000 * sizeof(float)), *params = calloc(l.param_count, sizeof(float));
    float *grad = malloc(l.param_count * sizeof(float));
    for (int i = 0; i < 2000; i++)
        x[i] = 1.0f + (float)(i % 7);
    uint8_t y[2] = {0, 1};
    omv_net_seed(net, 5);
    omv_net_train_step(net, params, x, y, 2, grad);
    const float *out = omv_net_output(net, 0);
    int dropped = 0;
    for (int i = 0; i < 2000; i++) {
        if (out[i] == 0.0f)
            dropped++;
        else /* kept values are scaled by 1 / (1 - rate) */
            ck_assert_float_eq_tol(out[i], x[i] / 0.7f, 1e-5f);
    }
    ck_assert_int_gt(dropped, 540);
    ck_assert_int_lt(dropped, 660);
    /* The same seed gives the same mask; the next step a different one. */
    float *first = malloc(2000 * sizeof(float));
    memcpy(first, out, 2000 * sizeof(float));
    omv_net_seed(net, 5);
    omv_net_train_step(net, params, x, y, 2, grad);
    ck_assert_mem_eq(first, omv_net_output(net, 0), 2000 * sizeof(float));
    omv_net_train_step(net, params, x, y, 2, grad);
    ck_assert(memcmp(first, omv_net_output(net, 0), 2000 * sizeof(float)) != 0);
    /* Evaluation does not drop. */
    uint32_t correct;
    double sum;
    omv_net_evaluate(net, params, x, y, 2, &correct, &sum);
    ck_assert_mem_eq(x, omv_net_output(net, 0), 2000 * sizeof(float));
    free(x), free(params), free(grad), free(first);
    omv_net_destroy(&net);
}
END_TEST

START_TEST(test_cnn_learns_blobs)
{
    /* Bright 3x3 blocks in one of four quadrants of a noisy 8x8 image: a small CNN learns which. */
    enum { N = 128, BATCH = 16, H = 8 };
    omv_model_layout_t l = parse("input 1x8x8\nconv 4 3x3 pad 1\nrelu\nmaxpool 2\nflatten\nfc 4\n");
    omv_net_t *net = omv_net_new(&l, N);
    float *params = malloc(l.param_count * sizeof(float));
    float *grad = malloc(l.param_count * sizeof(float));
    float *x = malloc(N * H * H * sizeof(float));
    uint8_t y[N];
    omv_rng_t rng;
    omv_rng_init(&rng, 77);
    for (int i = 0; i < N; i++) {
        y[i] = (uint8_t)omv_rng_below(&rng, 4);
        int qy = (y[i] / 2) * 4, qx = (y[i] % 2) * 4;
        for (int p = 0; p < H * H; p++) {
            int r = p / H, c = p % H;
            int lit = r >= qy && r < qy + 3 && c >= qx && c < qx + 3;
            x[i * H * H + p] = (float)lit + 0.3f * (float)omv_rng_normal(&rng);
        }
    }
    omv_model_init(&l, params, 3);
    uint32_t correct;
    double before, after;
    omv_net_evaluate(net, params, x, y, N, &correct, &before);
    for (int step = 0; step < 200; step++) {
        int b = step % (N / BATCH);
        omv_net_train_step(net, params, x + b * BATCH * H * H, y + b * BATCH, BATCH, grad);
        for (size_t i = 0; i < l.param_count; i++)
            params[i] -= 0.1f * grad[i];
    }
    omv_net_evaluate(net, params, x, y, N, &correct, &after);
    ck_assert_msg(after / N < 0.1 && after < before / 5, "mean loss %.4f after (%.4f before)",
                  after / N, before / N);
    ck_assert_uint_ge(correct, N - 2);
    free(params), free(grad), free(x);
    omv_net_destroy(&net);
}
END_TEST

START_TEST(test_threads_split_the_batch)
{
    /* A batch split over threads gives the single thread's loss, gradient and evaluation. */
    omv_model_layout_t l = parse("input 2x8x8\nconv 4 3x3 pad 1\nrelu\nmaxpool 2\nconv 3 3x3\n"
                                 "relu\navgpool 2\nfc 5\nrelu\nfc 3\n");
    enum { B = 7 };
    size_t n = l.param_count;
    float *params = malloc(n * sizeof(float)), *g1 = malloc(n * sizeof(float));
    float *g2 = malloc(n * sizeof(float)), *x = malloc(B * l.inputs * sizeof(float));
    uint8_t y[B];
    omv_model_init(&l, params, 21);
    omv_rng_t rng;
    omv_rng_init(&rng, 22);
    for (size_t i = 0; i < B * l.inputs; i++)
        x[i] = (float)omv_rng_normal(&rng);
    for (int i = 0; i < B; i++)
        y[i] = (uint8_t)omv_rng_below(&rng, 3);
    omv_net_t *one = omv_net_new(&l, B);
    float loss1 = omv_net_train_step(one, params, x, y, B, g1);
    uint32_t c1;
    double s1;
    omv_net_evaluate(one, params, x, y, B, &c1, &s1);
    const uint32_t threads[] = {2, 3, 16};
    for (size_t t = 0; t < 3; t++) {
        omv_net_t *many = omv_net_new_threads(&l, B, threads[t]);
        ck_assert_ptr_nonnull(many);
        ck_assert_uint_eq(omv_net_threads(many), threads[t] < B ? threads[t] : B);
        for (int rep = 0; rep < 3; rep++) { /* the threads wake for every step */
            for (size_t i = 0; i < n; i++)
                g2[i] = 99.0f;
            /* A smaller batch leaves some threads a share of one image or none. */
            uint32_t b = rep == 2 ? 2 : B;
            float loss2 = omv_net_train_step(many, params, x, y, b, g2);
            if (b != B)
                continue;
            ck_assert_float_eq_tol(loss2, loss1, 1e-5f);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(fabsf(g2[i] - g1[i]) <= 1e-5f + 1e-4f * fabsf(g1[i]),
                              "%u threads: grad[%zu] %g, one thread %g", threads[t], i,
                              (double)g2[i], (double)g1[i]);
        }
        uint32_t c2;
        double s2;
        omv_net_evaluate(many, params, x, y, B, &c2, &s2);
        ck_assert_uint_eq(c2, c1);
        ck_assert_double_eq_tol(s2, s1, 1e-4);
        omv_net_destroy(&many);
    }
    omv_net_t *small = omv_net_new_threads(&l, B, 2);
    float loss_small = omv_net_train_step(small, params, x, y, 2, g2);
    float loss_ref = omv_net_train_step(one, params, x, y, 2, g1);
    ck_assert_float_eq_tol(loss_small, loss_ref, 1e-5f);
    for (size_t i = 0; i < n; i++)
        ck_assert(fabsf(g2[i] - g1[i]) <= 1e-5f + 1e-4f * fabsf(g1[i]));
    omv_net_destroy(&small);
    errno = 0;
    ck_assert_ptr_null(omv_net_new_threads(&l, B, 0));
    ck_assert_int_eq(errno, EINVAL);
    omv_net_destroy(&one);
    free(params), free(g1), free(g2), free(x);
}
END_TEST

START_TEST(test_globalavgpool_gradients)
{
    ck_assert_int_eq(
        gradient_mismatches("input 2x4x4\nconv 3 3x3 pad 1\nglobalavgpool\nfc 3\n", 3, 31), 0);
}
END_TEST

START_TEST(test_batchnorm_gradients)
{
    /* 2-D (per channel over the batch and positions) and 1-D (per value, after fc). Batch norm
     * centres its outputs on 0, where a ReLU after it has its kink: the 2-D case has none. */
    ck_assert_int_eq(gradient_mismatches("input 2x4x4\nconv 3 3x3 pad 1\nbatchnorm\nfc 3\n", 4, 32),
                     0);
    ck_assert_int_eq(gradient_mismatches("input 6\nfc 5\nbatchnorm\nfc 3\n", 5, 33), 0);
}
END_TEST

START_TEST(test_residual_gradients)
{
    static const char *const models[] = {
        /* Same shape: the saved output is added as it is. */
        "input 2x4x4\nconv 3 3x3 pad 1\nsave a\nconv 3 3x3 pad 1\nrelu\nadd a\nfc 3\n",
        /* Another shape: a 1x1 projection with stride 2 (its weights are checked too). */
        "input 2x6x6\nconv 2 3x3 pad 1\nsave a\nconv 4 3x3 stride 2 pad 1\nadd a\nrelu\nfc 3\n",
        /* A ReLU on a saved output works in a buffer of its own; two blocks in a row. */
        "input 2x4x4\nconv 3 3x3 pad 1\nrelu\nsave a\nrelu\nconv 3 3x3 pad 1\nadd a\nsave b\n"
        "conv 3 3x3 pad 1\nadd b\nflatten\nfc 3\n",
    };
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++)
        ck_assert_int_eq(gradient_mismatches(models[i], 3, 34 + i), 0);
}
END_TEST

/* A small residual network as examples/fashion-resnet.model builds them. */
static const char *const small_resnet =
    "input 2x6x6\nconv 3 3x3 pad 1\nbatchnorm\nrelu\nsave a\nconv 4 3x3 stride 2 pad 1\n"
    "batchnorm\nrelu\nconv 4 3x3 pad 1\nbatchnorm\nadd a\nrelu\nglobalavgpool\nfc 3\n";

START_TEST(test_whole_resnet_gradients)
{
    ck_assert_int_eq(gradient_mismatches(small_resnet, 4, 37), 0);
}
END_TEST

/* Training-mode batch norm on channels-first x[n][c][hw] in place, as PyTorch defines it. */
static void ref_batchnorm(double *x, uint32_t nb, uint32_t c, uint32_t hw, const float *g,
                          const float *b)
{
    for (uint32_t ch = 0; ch < c; ch++) {
        double mean = 0, var = 0;
        for (uint32_t n = 0; n < nb; n++)
            for (uint32_t i = 0; i < hw; i++)
                mean += x[(n * c + ch) * hw + i];
        mean /= nb * hw;
        for (uint32_t n = 0; n < nb; n++)
            for (uint32_t i = 0; i < hw; i++)
                var += pow(x[(n * c + ch) * hw + i] - mean, 2);
        var /= nb * hw;
        for (uint32_t n = 0; n < nb; n++)
            for (uint32_t i = 0; i < hw; i++) {
                double *v = &x[(n * c + ch) * hw + i];
                *v = g[ch] * (*v - mean) / sqrt(var + 1e-5) + b[ch];
            }
    }
}

/* A convolution on channels-first double images with the engine's weights ([o][ky][kx][c]). */
static void ref_conv(const double *in, double *out, const float *w, const float *bias, uint32_t nb,
                     uint32_t c, uint32_t h, uint32_t o, uint32_t k, uint32_t stride, uint32_t pad,
                     uint32_t oh)
{
    for (uint32_t n = 0; n < nb; n++)
        for (uint32_t oc = 0; oc < o; oc++)
            for (uint32_t oy = 0; oy < oh; oy++)
                for (uint32_t ox = 0; ox < oh; ox++) {
                    double sum = bias[oc];
                    for (uint32_t ky = 0; ky < k; ky++)
                        for (uint32_t kx = 0; kx < k; kx++) {
                            int y = (int)(oy * stride + ky) - (int)pad;
                            int x = (int)(ox * stride + kx) - (int)pad;
                            if (y < 0 || x < 0 || y >= (int)h || x >= (int)h)
                                continue;
                            for (uint32_t ic = 0; ic < c; ic++)
                                sum += (double)w[((oc * k + ky) * k + kx) * c + ic] *
                                       in[((n * c + ic) * h + (uint32_t)y) * h + (uint32_t)x];
                        }
                    out[((n * o + oc) * oh + oy) * oh + ox] = sum;
                }
}

START_TEST(test_resnet_forward_matches_reference)
{
    /* small_resnet's logits against the same network written out here, channels-first in
     * double: conv, batch norm with the batch's statistics, ReLU, the block (stride 2) whose
     * saved input comes through a 1x1 projection with stride 2, global average pooling, fc. */
    omv_model_layout_t l = parse(small_resnet);
    enum { NB = 3 };
    const omv_model_layer_t *L = l.layers;
    ck_assert_uint_eq(L[9].kind, OMV_LAYER_ADD);
    ck_assert_uint_eq(L[9].proj_stride, 2);
    float *params = malloc(l.param_count * sizeof(float)), *grad = malloc(l.param_count * 4);
    float *x = malloc(NB * l.inputs * sizeof(float));
    omv_model_init(&l, params, 50);
    omv_rng_t rng;
    omv_rng_init(&rng, 51);
    for (size_t i = 0; i < l.state_offset; i++)
        params[i] += (float)(omv_rng_uniform(&rng) - 0.5) * 0.4f;
    static double in[NB * 2 * 36], a[NB * 3 * 36], b[NB * 4 * 9], c[NB * 4 * 9], p[NB * 4 * 9];
    for (uint32_t n = 0; n < NB; n++)
        for (uint32_t ch = 0; ch < 2; ch++)
            for (uint32_t i = 0; i < 36; i++) {
                float v = (float)omv_rng_normal(&rng);
                x[(n * 36 + i) * 2 + ch] = v; /* the engine's channels-last input */
                in[(n * 2 + ch) * 36 + i] = v;
            }
    ref_conv(in, a, params + L[0].w_offset, params + L[0].b_offset, NB, 2, 6, 3, 3, 1, 1, 6);
    ref_batchnorm(a, NB, 3, 36, params + L[1].w_offset, params + L[1].b_offset);
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++)
        a[i] = a[i] > 0 ? a[i] : 0; /* saved as 'a' */
    ref_conv(a, b, params + L[4].w_offset, params + L[4].b_offset, NB, 3, 6, 4, 3, 2, 1, 3);
    ref_batchnorm(b, NB, 4, 9, params + L[5].w_offset, params + L[5].b_offset);
    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++)
        b[i] = b[i] > 0 ? b[i] : 0;
    ref_conv(b, c, params + L[7].w_offset, params + L[7].b_offset, NB, 4, 3, 4, 3, 1, 1, 3);
    ref_batchnorm(c, NB, 4, 9, params + L[8].w_offset, params + L[8].b_offset);
    ref_conv(a, p, params + L[9].w_offset, params + L[9].b_offset, NB, 3, 6, 4, 1, 2, 0, 3);
    double logits[NB][3];
    const float *fw = params + L[12].w_offset, *fb = params + L[12].b_offset;
    for (uint32_t n = 0; n < NB; n++) {
        double pooled[4] = {0};
        for (uint32_t ch = 0; ch < 4; ch++)
            for (uint32_t i = 0; i < 9; i++) {
                size_t at = (n * 4 + ch) * 9 + i;
                double v = c[at] + p[at];
                pooled[ch] += (v > 0 ? v : 0) / 9.0;
            }
        for (uint32_t k = 0; k < 3; k++) {
            logits[n][k] = fb[k];
            for (uint32_t ch = 0; ch < 4; ch++)
                logits[n][k] += (double)fw[k * 4 + ch] * pooled[ch];
        }
    }
    omv_net_t *net = omv_net_new(&l, NB);
    ck_assert_ptr_nonnull(net);
    uint8_t y[NB] = {0, 1, 2};
    omv_net_train_step(net, params, x, y, NB, grad);
    const float *got = omv_net_output(net, l.n_layers - 1);
    for (uint32_t n = 0; n < NB; n++)
        for (uint32_t k = 0; k < 3; k++)
            ck_assert_msg(fabs(got[n * 3 + k] - logits[n][k]) <= 1e-4 * (1 + fabs(logits[n][k])),
                          "logit[%u][%u] = %g, reference %g", n, k, (double)got[n * 3 + k],
                          logits[n][k]);
    omv_net_destroy(&net);
    free(params), free(grad), free(x);
}
END_TEST

START_TEST(test_batchnorm_running_stats)
{
    /* 1-D batch norm on a batch of 4 values per feature: the step writes the running statistics
     * moved a tenth of the way to the batch's (unbiased variance), by hand; evaluation then
     * normalises by the running statistics in the parameters. */
    omv_model_layout_t l = parse("input 2\nbatchnorm\nfc 2\n");
    const omv_model_layer_t *bn = &l.layers[0];
    ck_assert_uint_eq(bn->s_count, 4);
    ck_assert_uint_eq(l.state_offset, l.param_count - 4);
    ck_assert_uint_eq(bn->s_offset, l.state_offset);
    float *params = malloc(l.param_count * sizeof(float)), *grad = malloc(l.param_count * 4);
    omv_model_init(&l, params, 60);
    float *run = params + bn->s_offset;
    ck_assert_float_eq(params[bn->w_offset], 1.0f); /* weight 1, bias 0, mean 0, variance 1 */
    ck_assert_float_eq(params[bn->b_offset], 0.0f);
    ck_assert_float_eq(run[0], 0.0f);
    ck_assert_float_eq(run[2], 1.0f);
    run[0] = 1.0f, run[1] = -2.0f, run[2] = 4.0f, run[3] = 0.5f;
    /* Feature 0: 1, 2, 3, 6 (mean 3, unbiased variance 14 / 3); feature 1: 0, 0, 4, 4 (mean 2,
     * unbiased variance 16 / 3). */
    const float x[8] = {1, 0, 2, 0, 3, 4, 6, 4};
    const uint8_t y[4] = {0, 1, 0, 1};
    omv_net_t *net = omv_net_new(&l, 4);
    omv_net_train_step(net, params, x, y, 4, grad);
    float *got = grad + bn->s_offset;
    ck_assert_float_eq_tol(got[0], 0.9f * 1.0f + 0.1f * 3.0f, 1e-6f);
    ck_assert_float_eq_tol(got[1], 0.9f * -2.0f + 0.1f * 2.0f, 1e-6f);
    ck_assert_float_eq_tol(got[2], 0.9f * 4.0f + 0.1f * 14.0f / 3.0f, 1e-6f);
    ck_assert_float_eq_tol(got[3], 0.9f * 0.5f + 0.1f * 16.0f / 3.0f, 1e-6f);
    /* Training normalises by the batch: feature 0 of image 0 is (1 - 3) / sqrt(3.5 + eps). */
    ck_assert_float_eq_tol(omv_net_output(net, 0)[0], -2.0f / sqrtf(3.5f + 1e-5f), 1e-5f);
    uint32_t correct;
    double loss;
    omv_net_evaluate(net, params, x, y, 4, &correct, &loss);
    ck_assert_float_eq_tol(omv_net_output(net, 0)[0], (1.0f - 1.0f) / sqrtf(4.0f + 1e-5f), 1e-6f);
    ck_assert_float_eq_tol(omv_net_output(net, 0)[1], (0.0f + 2.0f) / sqrtf(0.5f + 1e-5f), 1e-5f);
    /* Split over threads, each part's statistics are averaged, not summed. */
    omv_net_t *two = omv_net_new_threads(&l, 4, 2);
    float *grad2 = malloc(l.param_count * 4);
    omv_net_train_step(two, params, x, y, 4, grad2);
    /* Parts {1, 2} and {3, 6}: means 1.5 and 4.5, so the mean running mean moves to 3 too. */
    ck_assert_float_eq_tol(grad2[bn->s_offset], 0.9f + 0.1f * 3.0f, 1e-6f);
    omv_net_destroy(&two);
    omv_net_destroy(&net);
    free(params), free(grad), free(grad2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layers");
    TCase *tc = tcase_create("gradients");
    tcase_add_test(tc, test_fc_gradients);
    tcase_add_test(tc, test_relu_gradients);
    tcase_add_test(tc, test_conv_gradients);
    tcase_add_loop_test(tc, test_wide_conv_gradients, 0, 3);
    tcase_add_test(tc, test_maxpool_gradients);
    tcase_add_test(tc, test_avgpool_gradients);
    tcase_add_test(tc, test_dropout_gradients);
    tcase_add_test(tc, test_flatten_gradients);
    tcase_add_test(tc, test_whole_cnn_gradients);
    tcase_add_test(tc, test_globalavgpool_gradients);
    tcase_add_test(tc, test_batchnorm_gradients);
    tcase_add_test(tc, test_residual_gradients);
    tcase_add_test(tc, test_whole_resnet_gradients);
    tcase_add_test(tc, test_resnet_forward_matches_reference);
    tcase_add_test(tc, test_batchnorm_running_stats);
    suite_add_tcase(s, tc);
    TCase *tv = tcase_create("values");
    tcase_add_loop_test(tv, test_conv_matches_direct, 0, 3);
    tcase_add_test(tv, test_pooling_by_hand);
    tcase_add_test(tv, test_dropout_mask);
    tcase_add_test(tv, test_cnn_learns_blobs);
    tcase_add_test(tv, test_threads_split_the_batch);
    suite_add_tcase(s, tv);
    return omv_test_run(s);
}
