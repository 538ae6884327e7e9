/* Model definitions: the parser, shape chaining, parameter layout, errors with line numbers,
 * the MLP form, initialisation and the summary table. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model.h"
#include "testutil.h"

static const char *const cnn_text = "# the Fashion-MNIST CNN\n"
                                    "input 1x28x28\n"
                                    "conv 32 5x5 pad 2\n"
                                    "relu\n"
                                    "maxpool 2\n"
                                    "\n"
                                    "conv 64 5x5 pad 2   # second block\n"
                                    "relu\n"
                                    "maxpool 2\n"
                                    "flatten\n"
                                    "fc 256\n"
                                    "relu\n"
                                    "dropout 0.5\n"
                                    "fc 10\n"
                                    "softmax\n";

START_TEST(test_cnn_shapes_and_layout)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_msg(omv_model_parse(&l, cnn_text, "cnn.model", err) == 0, "%s", err);
    ck_assert_uint_eq(l.n_layers, 11);
    ck_assert_uint_eq(l.inputs, 784);
    ck_assert_uint_eq(l.classes, 10);
    const omv_model_layer_t *c1 = &l.layers[0], *c2 = &l.layers[3], *f1 = &l.layers[7];
    ck_assert_int_eq(c1->kind, OMV_LAYER_CONV);
    ck_assert_uint_eq(c1->out.c, 32);
    ck_assert_uint_eq(c1->out.h, 28);
    ck_assert_uint_eq(c1->line, 3);
    ck_assert_uint_eq(l.layers[2].out.h, 14);
    ck_assert_uint_eq(c2->fan_in, 32 * 25);
    ck_assert_uint_eq(c2->line, 7);
    ck_assert_uint_eq(l.layers[5].out.h, 7);
    ck_assert_uint_eq(l.layers[6].out.c, 64 * 7 * 7);
    ck_assert_int_eq(f1->kind, OMV_LAYER_FC);
    ck_assert_uint_eq(f1->fan_in, 3136);
    ck_assert_float_eq(l.layers[9].rate, 0.5f);
    size_t want = (25 * 32 + 32) + (800 * 64 + 64) + (3136 * 256 + 256) + (256 * 10 + 10);
    ck_assert_uint_eq(l.param_count, want);
    /* Parameters are packed in layer order, weights before biases. */
    ck_assert_uint_eq(c1->w_offset, 0);
    ck_assert_uint_eq(c1->b_offset, 800);
    ck_assert_uint_eq(c2->w_offset, 832);
    ck_assert_uint_eq(l.layers[10].b_offset + 10, want);

    char table[4096];
    omv_model_summary(&l, table, sizeof(table));
    ck_assert_ptr_nonnull(strstr(table, "conv 32 5x5"));
    ck_assert_ptr_nonnull(strstr(table, "32x28x28"));
    ck_assert_ptr_nonnull(strstr(table, "64x7x7"));
    ck_assert_ptr_nonnull(strstr(table, "3136"));
    char total[32];
    snprintf(total, sizeof(total), "%zu", want);
    ck_assert_ptr_nonnull(strstr(table, total));
}
END_TEST

START_TEST(test_options)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_msg(omv_model_parse(&l,
                                  "input 3x32x32\nconv 16 3 stride 2 pad 1\n"
                                  "avgpool 3x3 stride 2\nfc 10\n",
                                  "m", err) == 0,
                  "%s", err);
    ck_assert_uint_eq(l.layers[0].out.h, 16); /* (32 + 2 - 3) / 2 + 1 */
    ck_assert_uint_eq(l.layers[0].kh, 3);
    ck_assert_uint_eq(l.layers[0].kw, 3);
    ck_assert_uint_eq(l.layers[1].out.h, 7); /* (16 - 3) / 2 + 1 */
    ck_assert_uint_eq(l.layers[2].fan_in, 16 * 7 * 7);
    ck_assert_int_eq(omv_model_parse(&l, "INPUT 784\nFC 10\n", "m", err), 0);
    ck_assert_uint_eq(l.input.c, 784);
}
END_TEST

/* The definition is refused with the name, the line and the words given. */
static void refused(const char *text, int line, const char *what)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX], at[32];
    ck_assert_int_eq(omv_model_parse(&l, text, "net.model", err), -EINVAL);
    snprintf(at, sizeof(at), "net.model:%d:", line);
    ck_assert_msg(strncmp(err, at, strlen(at)) == 0, "'%s' does not start with '%s'", err, at);
    ck_assert_msg(strstr(err, what) != NULL, "'%s' does not say '%s'", err, what);
}

START_TEST(test_errors_name_the_line)
{
    refused("input 1x28x28\nconv 32 5x5\nrelu\nconvolve 3\nfc 10\n", 4, "unknown layer 'convolve'");
    refused("conv 32 5x5\nfc 10\n", 1, "first line must be 'input");
    refused("input 1x4x4\nconv 8 5x5\nfc 10\n", 2, "does not fit the input 1x4x4");
    refused("input 1x4x4\nmaxpool 8\nfc 10\n", 2, "does not fit");
    refused("input 1x8x8\nconv 8 3x3 pud 1\nfc 10\n", 2, "unknown option 'pud'");
    refused("input 1x8x8\nconv 8 3x3 pad\nfc 10\n", 2, "needs a value");
    refused("input 1x8x8\nconv 0 3x3\nfc 10\n", 2, "channels '0'");
    refused("input 1x8x8\nconv 8 3x3 pad 3\nfc 10\n", 2, "pad 3 must be smaller");
    refused("input 1x8x8\nfc 10\nrelu\n", 3, "last layer must be 'fc");
    refused("input 1x8x8\nfc 1\n", 2, "at least 2 classes");
    refused("input 1x8\nfc 10\n", 1, "channels x height x width");
    refused("input 1x8x8\nfc 10\nsoftmax\nfc 3\n", 4, "nothing may follow softmax");
    refused("input 1x8x8\ndropout 1.0\nfc 10\n", 2, "dropout P");
    refused("input 1x8x8\nrelu 3\nfc 10\n", 2, "takes no arguments");
    refused("", 0, "empty model");
    refused("input 1x65536x65536\nfc 10\n", 1, "over the limit");
    refused("input 1x1000x1000\nfc 2000\n", 2, "more than");
}
END_TEST

START_TEST(test_residual_and_batchnorm)
{
    /* A block whose shape changes: the add projects the saved 4x8x8 to 8x4x4 (1x1, stride 2);
     * batch norm's weight and bias are trained, its running statistics are state at the end. */
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    const char *text = "input 1x8x8\nconv 4 3x3 pad 1\nbatchnorm\nrelu\nsave a\n"
                       "conv 8 3x3 stride 2 pad 1\nbatchnorm\nadd a\nrelu\nglobalavgpool\nfc 10\n";
    ck_assert_msg(omv_model_parse(&l, text, "net.model", err) == 0, "%s", err);
    const omv_model_layer_t *add = &l.layers[6], *bn = &l.layers[1];
    ck_assert_uint_eq(add->kind, OMV_LAYER_ADD);
    ck_assert_uint_eq(add->ref, 3);
    ck_assert_uint_eq(add->proj_stride, 2);
    ck_assert_uint_eq(add->w_count, 4 * 8);
    ck_assert_uint_eq(add->b_count, 8);
    ck_assert_uint_eq(l.layers[8].out.c, 8);
    ck_assert_uint_eq(l.layers[8].out.h, 1);
    ck_assert_uint_eq(bn->w_count, 4);
    ck_assert_uint_eq(bn->s_count, 8);
    size_t trained = (4 * 9 + 4) + 8 + (8 * 9 * 4 + 8) + 16 + (32 + 8) + (8 * 10 + 10);
    ck_assert_uint_eq(l.state_offset, trained);
    ck_assert_uint_eq(l.param_count, trained + 8 + 16);
    ck_assert_uint_eq(bn->s_offset, trained);
    ck_assert_uint_eq(l.layers[5].s_offset, trained + 8);
    /* The same shape needs no projection. */
    ck_assert_int_eq(
        omv_model_parse(&l, "input 2x4x4\nsave x\nconv 2 3x3 pad 1\nadd x\nfc 2\n", "m", err), 0);
    ck_assert_uint_eq(l.layers[2].w_count, 0);
    refused("input 1x8x8\nconv 4 3x3\nadd a\nfc 2\n", 3, "no 'save a' on an earlier line");
    refused("input 1x8x8\nsave a\nsave a\nadd a\nfc 2\n", 3, "line 2 saved that name already");
    refused("input 1x8x8\nsave a\nconv 2 3x3 pad 1\nfc 2\n", 2, "never added back");
    refused("input 1x8x8\nsave a\nadd a\nadd a\nfc 2\n", 4, "line 3 added it already");
    refused("input 1x8x8\nsave a\nconv 2 3x3\nadd a\nfc 2\n", 4, "no 1x1 projection");
    refused("input 1x8x8\nbatchnorm 0.1\nfc 2\n", 2, "takes no arguments");
    refused("input 1x8x8\nsave\nfc 2\n", 2, "expected 'save NAME'");
}
END_TEST

START_TEST(test_mlp_form)
{
    const uint32_t widths[] = {784, 256, 10};
    omv_model_layout_t l;
    ck_assert_int_eq(omv_model_layout(&l, widths, 3), 0);
    ck_assert_uint_eq(l.n_layers, 3);
    ck_assert_int_eq(l.layers[0].kind, OMV_LAYER_FC);
    ck_assert_int_eq(l.layers[1].kind, OMV_LAYER_RELU);
    ck_assert_uint_eq(l.param_count, 784 * 256 + 256 + 256 * 10 + 10);
    char text[256];
    ck_assert_int_eq(omv_model_mlp_text(widths, 3, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "input 784\nfc 256\nrelu\nfc 10\n");
    ck_assert_int_eq(omv_model_mlp_text(widths, 3, text, 12), -ENOSPC);
    const uint32_t bad[] = {784, 0, 10};
    ck_assert_int_eq(omv_model_layout(&l, bad, 3), -EINVAL);
    ck_assert_int_eq(omv_model_layout(&l, widths, 1), -EINVAL);
}
END_TEST

START_TEST(test_init_by_fan_in)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_model_parse(&l,
                                     "input 4x10x10\nconv 50 5x5\nrelu\nmaxpool 2\n"
                                     "fc 400\nfc 10\n",
                                     "m", err),
                     0);
    float *p = malloc(l.param_count * sizeof(float)), *q = malloc(l.param_count * sizeof(float));
    omv_model_init(&l, p, 9);
    omv_model_init(&l, q, 9);
    ck_assert_mem_eq(p, q, l.param_count * sizeof(float));
    /* He (2 / fan_in) before a ReLU, 1 / fan_in otherwise; zero biases. */
    const double want[] = {sqrt(2.0 / 100), 0, 0, sqrt(1.0 / 450), sqrt(1.0 / 400)};
    for (uint32_t i = 0; i < l.n_layers; i++) {
        const omv_model_layer_t *x = &l.layers[i];
        if (x->w_count == 0)
            continue;
        double ss = 0;
        for (size_t j = 0; j < x->w_count; j++)
            ss += (double)p[x->w_offset + j] * p[x->w_offset + j];
        double sd = sqrt(ss / (double)x->w_count);
        ck_assert_msg(fabs(sd - want[i]) < 0.05 * want[i], "layer %u: std %g, want %g", i, sd,
                      want[i]);
        for (size_t j = 0; j < x->b_count; j++)
            ck_assert_float_eq(p[x->b_offset + j], 0.0f);
    }
    omv_model_init(&l, q, 10);
    ck_assert(memcmp(p, q, l.param_count * sizeof(float)) != 0);
    free(p), free(q);
}
END_TEST

START_TEST(test_shard_offsets)
{
    uint32_t off[4];
    omv_model_shard_offsets(10, 3, off);
    ck_assert_uint_eq(off[0], 0);
    ck_assert_uint_eq(off[1], 3);
    ck_assert_uint_eq(off[2], 6);
    ck_assert_uint_eq(off[3], 10);
}
END_TEST

/* Whether offset lies on a layer's start or end, or between two rows of a layer's weights. */
static int on_layer_or_row(const omv_model_layout_t *l, uint32_t off)
{
    for (uint32_t i = 0; i < l->n_layers; i++) {
        const omv_model_layer_t *y = &l->layers[i];
        size_t end = y->b_offset + y->b_count, row = y->units ? y->w_count / y->units : 1;
        if (y->w_count + y->b_count == 0)
            continue;
        if (off == y->w_offset || off == end)
            return 1;
        if (off > y->w_offset && off < end)
            return off < y->w_offset + y->w_count && (off - y->w_offset) % row == 0;
    }
    return 0;
}

START_TEST(test_shard_layout_follows_layers)
{
    /* The MLP of the examples: its first layer holds 99% of the parameters and is cut between
     * rows of 784 weights; the small last layer rides with the last piece. */
    omv_model_layout_t l;
    uint32_t widths[] = {784, 256, 10}, off[OMV_MODEL_MAX_SHARDS + 1];
    ck_assert_int_eq(omv_model_layout(&l, widths, 3), 0);
    ck_assert_uint_eq(omv_model_shard_layout(&l, 2, off), 2);
    ck_assert_uint_eq(off[0], 0);
    ck_assert_uint_eq(off[1], 128 * 784); /* 100352: row 128 of 256 */
    ck_assert_uint_eq(off[2], 203530);
    uint32_t n = omv_model_shard_layout(&l, 8, off);
    ck_assert_uint_eq(n, 8);
    for (uint32_t i = 1; i < n; i++) {
        ck_assert_uint_eq(off[i] % 784, 0);
        ck_assert_uint_lt(off[i], 784 * 256);
        ck_assert_uint_gt(off[i], off[i - 1]);
    }
    ck_assert_uint_eq(off[n], 203530);
    /* A CNN: small layers share a shard, never split; the large fc is cut between rows; sizes
     * stay within a quarter over the target, but for a whole small layer. */
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_model_parse(&l,
                                     "input 1x28x28\nconv 32 5x5 pad 2\nrelu\nmaxpool 2\n"
                                     "conv 64 5x5 pad 2\nrelu\nmaxpool 2\nflatten\nfc 128\nrelu\n"
                                     "fc 10\n",
                                     "cnn", err),
                     0);
    for (uint32_t want = 1; want <= 16; want++) {
        n = omv_model_shard_layout(&l, want, off);
        ck_assert_uint_ge(n, 1);
        ck_assert_uint_le(n, want + 1);
        ck_assert_uint_eq(off[0], 0);
        ck_assert_uint_eq(off[n], l.param_count);
        size_t target = (l.param_count + want - 1) / want;
        for (uint32_t i = 1; i <= n; i++) {
            ck_assert_uint_gt(off[i], off[i - 1]);
            ck_assert_msg(want == 1 || on_layer_or_row(&l, off[i]),
                          "%u shards: offset %u cuts a layer off a row", want, off[i]);
            ck_assert_msg(want == 1 || off[i] - off[i - 1] <= target + target / 4 + 32 * 25 + 32,
                          "%u shards: shard %u has %u parameters (target %zu)", want, i - 1,
                          off[i] - off[i - 1], target);
        }
    }
    /* More shards than parameters: one parameter each, as before. */
    ck_assert_int_eq(omv_model_layout(&l, (uint32_t[]){2, 2}, 2), 0);
    ck_assert_uint_eq(omv_model_shard_layout(&l, 8, off), 6);
}
END_TEST

START_TEST(test_shard_ranges_even)
{
    /* The example MLP in 8 shards of about 25k parameters: 2 servers get 4 shards each, 4 get
     * 2 each (an unsigned slip once gave the first server 1 shard and the last 7). */
    omv_model_layout_t l;
    uint32_t widths[] = {784, 256, 10}, off[OMV_MODEL_MAX_SHARDS + 1], ends[16];
    ck_assert_int_eq(omv_model_layout(&l, widths, 3), 0);
    ck_assert_uint_eq(omv_model_shard_layout(&l, 8, off), 8);
    omv_model_shard_ranges(off, 8, 2, ends);
    ck_assert_uint_eq(ends[0], 4);
    ck_assert_uint_eq(ends[1], 8);
    omv_model_shard_ranges(off, 8, 4, ends);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_eq(ends[i], 2 * (i + 1));
    omv_model_shard_ranges(off, 8, 1, ends);
    ck_assert_uint_eq(ends[0], 8);
    /* As many holders as shards: one each. Uneven shards: each range ends at the boundary
     * nearest its share, and every holder gets at least one shard. */
    omv_model_shard_ranges(off, 8, 8, ends);
    for (uint32_t i = 0; i < 8; i++)
        ck_assert_uint_eq(ends[i], i + 1);
    uint32_t skew[] = {0, 10, 20, 30, 1000, 1010, 1020, 1030, 2000};
    omv_model_shard_ranges(skew, 8, 2, ends);
    ck_assert_uint_eq(ends[0], 4); /* 1000 is the half's end */
    omv_model_shard_ranges(skew, 8, 4, ends);
    /* shares end at 500, 1000, 1500: nearest are 30 (or 1000), 1000, then 1030 (a shard left
     * for the last) */
    ck_assert_uint_eq(ends[0], 3);
    ck_assert_uint_eq(ends[1], 4);
    ck_assert_uint_eq(ends[2], 7);
    ck_assert_uint_eq(ends[3], 8);
    omv_model_shard_ranges(skew, 2, 4, ends); /* more holders than shards: nothing past them */
    ck_assert_uint_eq(ends[0], 1);
    ck_assert_uint_eq(ends[1], 2);
    ck_assert_uint_eq(ends[2], 2);
    ck_assert_uint_eq(ends[3], 2);
    uint32_t big_first[] = {0, 900, 910, 920, 1000};
    omv_model_shard_ranges(big_first, 4, 3, ends);
    ck_assert_uint_eq(ends[0], 1);
    ck_assert_uint_eq(ends[1], 2);
    ck_assert_uint_eq(ends[2], 4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("definition");
    tcase_add_test(tc, test_cnn_shapes_and_layout);
    tcase_add_test(tc, test_options);
    tcase_add_test(tc, test_errors_name_the_line);
    tcase_add_test(tc, test_residual_and_batchnorm);
    tcase_add_test(tc, test_mlp_form);
    tcase_add_test(tc, test_init_by_fan_in);
    tcase_add_test(tc, test_shard_offsets);
    tcase_add_test(tc, test_shard_layout_follows_layers);
    tcase_add_test(tc, test_shard_ranges_even);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
