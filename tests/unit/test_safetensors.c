/* Safetensors export and import: the file read back by a reader written here (the header's
 * length, every tensor's dtype, shape and byte range, no holes, the values in PyTorch's layouts
 * computed here from the model's), the metadata, a round trip, and refusals that name the
 * tensor. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "model.h"
#include "safetensors.h"
#include "testutil.h"

/* conv on an image, batch norm, a block with a 1x1 projection, fc on an image (PyTorch flattens
 * it channels first). */
static const char *const model_text = "input 2x4x4\nconv 3 3x3 pad 1\nbatchnorm\nrelu\nsave a\n"
                                      "conv 5 3x3 stride 2 pad 1\nadd a\nflatten\nfc 4\n";

static char dir[256], path[512];

static void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
}

static void teardown(void)
{
    omv_test_rmdir(dir);
}

static omv_model_layout_t parse(void)
{
    omv_model_layout_t l;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_msg(omv_model_parse(&l, model_text, "test", err) == 0, "%s", err);
    return l;
}

static unsigned char *slurp(size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *ret_len = (size_t)n;
    return buf;
}

/* The reader: finds "NAME":{"dtype":"D","shape":[...],"data_offsets":[B,E]} in the header as
 * omnivore writes it (keys in this order) and returns a pointer to the values, checking the
 * shape; *ret_begin and *ret_end get the range. */
static const unsigned char *find(const unsigned char *file, const char *header, const char *name,
                                 const char *dtype, const char *shape, uint64_t *ret_begin,
                                 uint64_t *ret_end)
{
    char key[128];
    snprintf(key, sizeof(key), "\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[", name,
             dtype, shape);
    const char *at = strstr(header, key);
    ck_assert_msg(at != NULL, "no tensor %s of %s [%s] in %s", name, dtype, shape, header);
    unsigned long long b, e;
    ck_assert_int_eq(sscanf(at + strlen(key), "%llu,%llu]", &b, &e), 2);
    *ret_begin = b, *ret_end = e;
    uint64_t hlen;
    memcpy(&hlen, file, 8);
    return file + 8 + hlen + b;
}

static float f32(const unsigned char *p, size_t i)
{
    float v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

START_TEST(test_export_as_pytorch_lays_it_out)
{
    omv_model_layout_t l = parse();
    float *params = malloc(l.param_count * sizeof(float));
    for (size_t i = 0; i < l.param_count; i++)
        params[i] = (float)i * 0.5f - 7.0f; /* each value says where it was */
    const char *keys[] = {"model", "summary"};
    const char *values[] = {model_text, "test_accuracy: 0.5 \"quoted\""};
    char err[OMV_SAFETENSORS_ERR_MAX] = "";
    ck_assert_msg(omv_safetensors_write(path, &l, params, keys, values, 2, 77, err) == 0, "%s",
                  err);
    size_t len;
    unsigned char *file = slurp(&len);
    uint64_t hlen;
    memcpy(&hlen, file, 8);
    ck_assert_uint_eq((8 + hlen) % 8, 0); /* the data starts aligned */
    char *header = malloc(hlen + 1);
    memcpy(header, file + 8, hlen);
    header[hlen] = '\0';
    /* The metadata holds the definition, escaped. */
    ck_assert_ptr_nonnull(strstr(header, "\"model\":\"input 2x4x4\\u000aconv 3 3x3 pad 1\\u000a"));
    ck_assert_ptr_nonnull(strstr(header, "\\\"quoted\\\""));

    const omv_model_layer_t *conv1 = &l.layers[0], *bn = &l.layers[1], *conv2 = &l.layers[4];
    const omv_model_layer_t *add = &l.layers[5], *fc = &l.layers[7];
    uint64_t b, e, total = 0;
    /* conv1.weight [3][2][3][3]: PyTorch's [o][c][ky][kx] is our [o][ky][kx][c]. */
    const unsigned char *w = find(file, header, "conv1.weight", "F32", "3,2,3,3", &b, &e);
    total += e - b;
    ck_assert_uint_eq(e - b, 3 * 2 * 9 * 4);
    for (uint32_t o = 0; o < 3; o++)
        for (uint32_t c = 0; c < 2; c++)
            for (uint32_t k = 0; k < 9; k++)
                ck_assert_float_eq(f32(w, (o * 2 + c) * 9 + k),
                                   params[conv1->w_offset + (o * 9 + k) * 2 + c]);
    w = find(file, header, "conv1.bias", "F32", "3", &b, &e);
    total += e - b;
    ck_assert_float_eq(f32(w, 2), params[conv1->b_offset + 2]);
    const char *bn_names[] = {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"};
    const size_t bn_at[] = {bn->w_offset, bn->b_offset, bn->s_offset, bn->s_offset + 3};
    for (int i = 0; i < 4; i++) {
        w = find(file, header, bn_names[i], "F32", "3", &b, &e);
        total += e - b;
        for (uint32_t c = 0; c < 3; c++)
            ck_assert_float_eq(f32(w, c), params[bn_at[i] + c]);
    }
    w = find(file, header, "bn1.num_batches_tracked", "I64", "", &b, &e);
    total += e - b;
    int64_t batches;
    memcpy(&batches, w, 8);
    ck_assert_int_eq(batches, 77);
    w = find(file, header, "conv2.weight", "F32", "5,3,3,3", &b, &e);
    total += e - b;
    ck_assert_float_eq(f32(w, (4 * 3 + 1) * 9 + 5), params[conv2->w_offset + (4 * 9 + 5) * 3 + 1]);
    w = find(file, header, "conv2.bias", "F32", "5", &b, &e);
    total += e - b;
    /* The projection: [5][3][1][1]. */
    w = find(file, header, "proj1.weight", "F32", "5,3,1,1", &b, &e);
    total += e - b;
    for (uint32_t i = 0; i < 15; i++)
        ck_assert_float_eq(f32(w, i), params[add->w_offset + i]);
    w = find(file, header, "proj1.bias", "F32", "5", &b, &e);
    total += e - b;
    /* fc1.weight [4][5*2*2]: PyTorch's input index (c, y, x) is our (y, x, c). */
    w = find(file, header, "fc1.weight", "F32", "4,20", &b, &e);
    total += e - b;
    for (uint32_t o = 0; o < 4; o++)
        for (uint32_t c = 0; c < 5; c++)
            for (uint32_t p = 0; p < 4; p++)
                ck_assert_float_eq(f32(w, o * 20 + c * 4 + p),
                                   params[fc->w_offset + o * 20 + p * 5 + c]);
    w = find(file, header, "fc1.bias", "F32", "4", &b, &e);
    total += e - b;
    ck_assert_float_eq(f32(w, 3), params[fc->b_offset + 3]);
    /* Every byte after the header belongs to exactly one tensor: no holes, nothing else. */
    ck_assert_uint_eq(total, len - 8 - hlen);
    ck_assert_uint_eq(total, l.param_count * 4 + 8);

    /* And back in: the same parameters. */
    float *back = calloc(l.param_count, sizeof(float));
    ck_assert_msg(omv_safetensors_read(path, &l, back, err) == 0, "%s", err);
    ck_assert_mem_eq(back, params, l.param_count * sizeof(float));
    free(back), free(header), free(file), free(params);
}
END_TEST

START_TEST(test_flattened_batchnorm_in_pytorch_order)
{
    /* A 1-D batch norm straight after flatten normalises features that PyTorch numbers
     * channels first, (c, y, x), and we channels last, (y, x, c): its four vectors are written
     * in PyTorch's order, and so is the weight of the fc after it (through the ReLU too). A
     * batch norm after an fc is over that layer's outputs: as they are. */
    omv_model_layout_t l;
    char perr[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_model_parse(&l,
                                     "input 3x2x2\nflatten\nbatchnorm\nrelu\nfc 4\nbatchnorm\n"
                                     "fc 2\n",
                                     "flat", perr),
                     0);
    const omv_model_layer_t *bn1 = &l.layers[1], *fc1 = &l.layers[3], *bn2 = &l.layers[4];
    ck_assert_uint_eq(bn1->in.c, 12);
    float *params = malloc(l.param_count * sizeof(float));
    for (size_t i = 0; i < l.param_count; i++)
        params[i] = (float)i;
    char err[OMV_SAFETENSORS_ERR_MAX] = "";
    ck_assert_msg(omv_safetensors_write(path, &l, params, NULL, NULL, 0, 1, err) == 0, "%s", err);
    size_t len;
    unsigned char *file = slurp(&len);
    uint64_t hlen, b, e;
    memcpy(&hlen, file, 8);
    char *header = malloc(hlen + 1);
    memcpy(header, file + 8, hlen);
    header[hlen] = '\0';
    const char *bn_names[] = {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"};
    const size_t bn_at[] = {bn1->w_offset, bn1->b_offset, bn1->s_offset, bn1->s_offset + 12};
    for (int i = 0; i < 4; i++) {
        const unsigned char *w = find(file, header, bn_names[i], "F32", "12", &b, &e);
        for (uint32_t c = 0; c < 3; c++)
            for (uint32_t p = 0; p < 4; p++)
                ck_assert_float_eq(f32(w, c * 4 + p), params[bn_at[i] + p * 3 + c]);
    }
    const unsigned char *w = find(file, header, "fc1.weight", "F32", "4,12", &b, &e);
    for (uint32_t o = 0; o < 4; o++)
        for (uint32_t c = 0; c < 3; c++)
            for (uint32_t p = 0; p < 4; p++)
                ck_assert_float_eq(f32(w, o * 12 + c * 4 + p),
                                   params[fc1->w_offset + o * 12 + p * 3 + c]);
    w = find(file, header, "bn2.running_var", "F32", "4", &b, &e);
    for (uint32_t j = 0; j < 4; j++)
        ck_assert_float_eq(f32(w, j), params[bn2->s_offset + 4 + j]);
    float *back = calloc(l.param_count, sizeof(float));
    ck_assert_msg(omv_safetensors_read(path, &l, back, err) == 0, "%s", err);
    ck_assert_mem_eq(back, params, l.param_count * sizeof(float));
    free(back), free(header), free(file), free(params);
}
END_TEST

START_TEST(test_import_refuses_naming_the_tensor)
{
    omv_model_layout_t l = parse();
    float *params = calloc(l.param_count, sizeof(float));
    char err[OMV_SAFETENSORS_ERR_MAX] = "";
    ck_assert_int_eq(omv_safetensors_write(path, &l, params, NULL, NULL, 0, 0, err), 0);
    /* Another model: conv1 has 4 channels, not 3. */
    omv_model_layout_t other;
    char perr[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_model_parse(&other,
                                     "input 2x4x4\nconv 4 3x3 pad 1\nbatchnorm\nrelu\nsave a\n"
                                     "conv 5 3x3 stride 2 pad 1\nadd a\nflatten\nfc 4\n",
                                     "other", perr),
                     0);
    float *p2 = calloc(other.param_count, sizeof(float));
    ck_assert_int_eq(omv_safetensors_read(path, &other, p2, err), -EINVAL);
    ck_assert_msg(strstr(err, "'conv1.weight' has shape [3x2x3x3], the model needs [4x2x3x3]"),
                  "%s", err);
    /* A model without the projection: the file has a tensor it does not. */
    ck_assert_int_eq(omv_model_parse(&other,
                                     "input 2x4x4\nconv 3 3x3 pad 1\nbatchnorm\nrelu\nsave a\n"
                                     "conv 3 3x3 pad 1\nadd a\nflatten\nfc 4\n",
                                     "other", perr),
                     0);
    ck_assert_int_eq(omv_safetensors_read(path, &other, p2, err), -EINVAL);
    ck_assert_msg(strstr(err, "conv2.weight") || strstr(err, "proj1"), "%s", err);
    /* Damage: a header length past the end, and a header that is not JSON. */
    FILE *f = fopen(path, "r+b");
    uint64_t huge = 1u << 20;
    fwrite(&huge, 8, 1, f);
    fclose(f);
    ck_assert_int_eq(omv_safetensors_read(path, &l, params, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a safetensors file"));
    f = fopen(path, "r+b");
    uint64_t small = 8;
    fwrite(&small, 8, 1, f);
    fwrite("{\"x\":{}}", 8, 1, f);
    fclose(f);
    ck_assert_int_eq(omv_safetensors_read(path, &l, params, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "malformed"));
    ck_assert_int_lt(omv_safetensors_read("/nonexistent/x.safetensors", &l, params, err), 0);
    free(params), free(p2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("export");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_export_as_pytorch_lays_it_out);
    tcase_add_test(tc, test_flattened_batchnorm_in_pytorch_order);
    tcase_add_test(tc, test_import_refuses_naming_the_tensor);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
