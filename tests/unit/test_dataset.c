/* The IDX and CIFAR-10 readers: raw and gzipped files load byte for byte, slices select the
 * right images, and broken, mismatched, missing or out-of-range inputs are refused with the file
 * named; the gather normalises and turns planes into channels-last. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dataset.h"
#include "testutil.h"

#define COUNT 5
#define ROWS 3
#define COLS 4
#define SIZE (ROWS * COLS)

static char dir[256];
static char images[512], labels[512];
static uint8_t pixels[COUNT * SIZE], label_bytes[COUNT];

/* One folder per test case, made and removed outside the forked tests so that a failing test
 * leaves nothing behind; every test writes the files it reads. */
static void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
    snprintf(images, sizeof(images), "%s/images.idx", dir);
    snprintf(labels, sizeof(labels), "%s/labels.idx", dir);
    for (int i = 0; i < COUNT * SIZE; i++)
        pixels[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < COUNT; i++)
        label_bytes[i] = (uint8_t)((i * 3 + 1) % 7); /* 1 4 0 3 6 */
}

static void teardown(void)
{
    omv_test_rmdir(dir);
}

static void write_pair(int gz)
{
    ck_assert_int_eq(omv_test_write_idx(images, labels, pixels, label_bytes, COUNT, ROWS, COLS, gz),
                     0);
}

/* Writes bytes[len] to path, gzipped or not. */
static void write_bytes(const char *path, const uint8_t *bytes, size_t len, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, bytes, (unsigned)len), (int)len);
        ck_assert_int_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
        fclose(f);
    }
}

/* An image file whose header claims COUNT images but holds only `present` of them. */
static void write_short_images(uint32_t present, int gz)
{
    uint8_t buf[16 + COUNT * SIZE] = {0, 0, 8, 3, 0, 0, 0, COUNT, 0, 0, 0, ROWS, 0, 0, 0, COLS};
    memcpy(buf + 16, pixels, present * SIZE);
    write_bytes(images, buf, 16 + present * SIZE, gz);
}

static void assert_refused(int want, const char *path, const char *words)
{
    omv_dataset_t d;
    memset(&d, 0, sizeof(d));
    d.count = 12345;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, 0, err), want);
    ck_assert_msg(strstr(err, path) != NULL, "error '%s' does not name %s", err, path);
    ck_assert_msg(strstr(err, words) != NULL, "error '%s' does not say '%s'", err, words);
    ck_assert_uint_eq(d.count, 12345); /* untouched on failure */
}

static void load_whole(int gz)
{
    write_pair(gz);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_dataset_load(&d, images, labels, 0, 0, err) == 0, "%s", err);
    ck_assert_uint_eq(d.count, COUNT);
    ck_assert_uint_eq(d.total, COUNT);
    ck_assert_uint_eq(d.rows, ROWS);
    ck_assert_uint_eq(d.cols, COLS);
    ck_assert_mem_eq(d.pixels, pixels, sizeof(pixels));
    ck_assert_mem_eq(d.labels, label_bytes, COUNT);
    ck_assert_uint_eq(d.max_label, 6);
    omv_dataset_fini(&d);
    ck_assert_ptr_null(d.pixels);
}

START_TEST(test_load_raw)
{
    load_whole(0);
    FILE *f = fopen(images, "rb");
    uint8_t magic[4];
    ck_assert_uint_eq(fread(magic, 1, 4, f), 4);
    fclose(f);
    ck_assert_uint_eq(magic[3], 3); /* really the raw IDX file */
}
END_TEST

START_TEST(test_load_gz)
{
    load_whole(1);
    FILE *f = fopen(images, "rb");
    uint8_t magic[2];
    ck_assert_uint_eq(fread(magic, 1, 2, f), 2);
    fclose(f);
    ck_assert(magic[0] == 0x1f && magic[1] == 0x8b); /* really gzipped */
}
END_TEST

static void load_slice(int gz, uint32_t begin, uint32_t count, uint32_t want_count)
{
    write_pair(gz);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_dataset_load(&d, images, labels, begin, count, err) == 0, "%s", err);
    ck_assert_uint_eq(d.count, want_count);
    ck_assert_uint_eq(d.total, COUNT);
    ck_assert_mem_eq(d.pixels, pixels + begin * SIZE, want_count * SIZE);
    ck_assert_mem_eq(d.labels, label_bytes + begin, want_count);
    omv_dataset_fini(&d);
}

START_TEST(test_slice)
{
    load_slice(0, 2, 2, 2);
    load_slice(1, 2, 2, 2);
    load_slice(0, 4, 1, 1);
    load_slice(1, 1, 4, 4);
}
END_TEST

START_TEST(test_slice_to_end)
{
    load_slice(0, 3, 0, 2);
    load_slice(1, 3, 0, 2);
    load_slice(0, 4, 0, 1);
}
END_TEST

START_TEST(test_wrong_magic)
{
    write_pair(0);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    /* The label file given as images, then the image file given as labels. */
    ck_assert_int_eq(omv_dataset_load(&d, labels, labels, 0, 0, err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, labels));
    ck_assert_ptr_nonnull(strstr(err, "not an IDX image file"));
    ck_assert_int_eq(omv_dataset_load(&d, images, images, 0, 0, err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, images));
    ck_assert_ptr_nonnull(strstr(err, "not an IDX label file"));
}
END_TEST

START_TEST(test_truncated_images_raw)
{
    write_pair(0);
    write_short_images(3, 0);
    assert_refused(-EPROTO, images, "image data");
}
END_TEST

START_TEST(test_truncated_images_gz)
{
    write_pair(1);
    write_short_images(3, 1);
    assert_refused(-EPROTO, images, "image data");
}
END_TEST

START_TEST(test_gz_cut_short)
{
    write_pair(1);
    /* Keep only the first half of the compressed stream. */
    FILE *f = fopen(images, "rb");
    uint8_t buf[4096];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ck_assert_uint_gt(n, 20);
    write_bytes(images, buf, n / 2, 0);
    assert_refused(-EPROTO, images, "");
}
END_TEST

START_TEST(test_truncated_header_and_labels)
{
    static const uint8_t head[] = {0, 0, 8, 3, 0, 0, 0, COUNT, 0, 0};
    write_pair(0);
    write_bytes(images, head, sizeof(head), 0);
    assert_refused(-EPROTO, images, "header");

    write_pair(0);
    uint8_t lab[8 + COUNT] = {0, 0, 8, 1, 0, 0, 0, COUNT};
    write_bytes(labels, lab, 8 + COUNT - 1, 0); /* one label short */
    assert_refused(-EPROTO, labels, "label data");
}
END_TEST

/* A header that announces far more than the file holds is refused before the loader allocates
 * what it announces (fuzzing found 73 bytes that asked for 6.7 GB). */
START_TEST(test_huge_header_small_file)
{
    uint8_t head[16 + 57] = {0, 0, 8, 3, 0, 0x01, 0x86, 0xa0, 0, 0, 1, 0, 0, 0, 1, 0};
    uint8_t lab[8 + 100000] = {0, 0, 8, 1, 0, 0x01, 0x86, 0xa0};
    write_bytes(labels, lab, sizeof(lab), 0);
    for (int gz = 0; gz <= 1; gz++) {
        write_bytes(images, head, sizeof(head), gz);
        omv_dataset_t d;
        char err[OMV_CONFIG_ERR_MAX] = "";
        ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, 0, err), -EPROTO);
        ck_assert_ptr_nonnull(strstr(err, images));
        ck_assert_msg(strstr(err, "announces 6553600000 bytes of image data") != NULL, "%s", err);
    }
}
END_TEST

START_TEST(test_zero_dimension)
{
    static const uint8_t head[] = {0, 0, 8, 3, 0, 0, 0, COUNT, 0, 0, 0, 0, 0, 0, 0, COLS};
    write_pair(0);
    write_bytes(images, head, sizeof(head), 0);
    assert_refused(-EPROTO, images, "dimension");
}
END_TEST

START_TEST(test_count_mismatch)
{
    char other_images[600], other_labels[600];
    snprintf(other_images, sizeof(other_images), "%s/other-images", dir);
    snprintf(other_labels, sizeof(other_labels), "%s/other-labels", dir);
    ck_assert_int_eq(omv_test_write_idx(other_images, other_labels, pixels, label_bytes, COUNT - 1,
                                        ROWS, COLS, 0),
                     0);
    write_pair(0);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_eq(omv_dataset_load(&d, images, other_labels, 0, 0, err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, other_labels));
    ck_assert_ptr_nonnull(strstr(err, "holds 4 labels"));
    ck_assert_int_eq(omv_dataset_load(&d, other_images, labels, 0, 0, err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, labels));
    ck_assert_ptr_nonnull(strstr(err, "holds 5 labels"));
}
END_TEST

START_TEST(test_range_past_end)
{
    write_pair(0);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 4, 2, err), -ERANGE);
    ck_assert_ptr_nonnull(strstr(err, images));
    err[0] = '\0';
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, COUNT, 0, err), -ERANGE);
    ck_assert_ptr_nonnull(strstr(err, images));
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, COUNT + 1, err), -ERANGE);
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, UINT32_MAX, 2, err), -ERANGE);
    /* The largest valid range still loads. */
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, COUNT, err), 0);
    omv_dataset_fini(&d);
}
END_TEST

START_TEST(test_missing_file)
{
    write_pair(0);
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/no-such-file.gz", dir);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_eq(omv_dataset_load(&d, missing, labels, 0, 0, err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, missing));
    ck_assert_int_eq(omv_dataset_load(&d, images, missing, 0, 0, err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, missing));
}
END_TEST

START_TEST(test_probe)
{
    uint32_t count = 0, rows = 0, cols = 0;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_eq(omv_test_make_blobs(images, labels, 40, 7, 9, 3, 1, 1), 0);
    ck_assert_msg(omv_dataset_probe(images, &count, &rows, &cols, err) == 0, "%s", err);
    ck_assert_uint_eq(count, 40);
    ck_assert_uint_eq(rows, 7);
    ck_assert_uint_eq(cols, 9);

    count = rows = cols = 99;
    ck_assert_int_eq(omv_dataset_probe(labels, &count, &rows, &cols, err), -EPROTO);
    ck_assert_ptr_nonnull(strstr(err, labels));
    ck_assert_uint_eq(count, 99); /* untouched on failure */
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/missing", dir);
    ck_assert_int_eq(omv_dataset_probe(missing, &count, &rows, &cols, err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, missing));
}
END_TEST

/* CIFAR-10: five records in two files, the second gzipped. */
static uint8_t cifar_px[5 * 3072], cifar_lab[5] = {3, 9, 0, 7, 1};
static char cifar_a[512], cifar_b[512], cifar_list[1100];

static void write_cifar_pair(void)
{
    for (size_t i = 0; i < sizeof(cifar_px); i++)
        cifar_px[i] = (uint8_t)(i * 7 + i / 3072);
    snprintf(cifar_a, sizeof(cifar_a), "%s/data_batch_1.bin", dir);
    snprintf(cifar_b, sizeof(cifar_b), "%s/data_batch_2.bin.gz", dir);
    snprintf(cifar_list, sizeof(cifar_list), "%s, %s", cifar_a, cifar_b);
    ck_assert_int_eq(omv_test_write_cifar(cifar_a, cifar_px, cifar_lab, 3, 0), 0);
    ck_assert_int_eq(omv_test_write_cifar(cifar_b, cifar_px + 3 * 3072, cifar_lab + 3, 2, 1), 0);
}

START_TEST(test_cifar_load)
{
    write_cifar_pair();
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_dataset_open(&d, "cifar10", cifar_list, "", 0, 0, err) == 0, "%s", err);
    ck_assert_uint_eq(d.count, 5);
    ck_assert_uint_eq(d.total, 5);
    ck_assert_uint_eq(d.channels, 3);
    ck_assert_uint_eq(d.rows, 32);
    ck_assert_uint_eq(d.cols, 32);
    ck_assert_mem_eq(d.pixels, cifar_px, sizeof(cifar_px));
    ck_assert_mem_eq(d.labels, cifar_lab, 5);
    ck_assert_uint_eq(d.max_label, 9);
    omv_dataset_fini(&d);
    /* A slice across the two files. */
    ck_assert_msg(omv_dataset_load_cifar(&d, cifar_list, 2, 2, err) == 0, "%s", err);
    ck_assert_uint_eq(d.count, 2);
    ck_assert_mem_eq(d.pixels, cifar_px + 2 * 3072, 2 * 3072);
    ck_assert_uint_eq(d.labels[0], 0);
    ck_assert_uint_eq(d.labels[1], 7);
    omv_dataset_fini(&d);
    uint32_t n, c, h, w;
    ck_assert_int_eq(omv_dataset_probe_format("cifar10", cifar_list, &n, &c, &h, &w, err), 0);
    ck_assert_uint_eq(n, 5);
    ck_assert_uint_eq(c * h * w, 3072);
    ck_assert_int_eq(omv_dataset_load_cifar(&d, cifar_list, 4, 2, err), -ERANGE);
}
END_TEST

static void assert_cifar_refused(const char *list, const char *path, const char *words)
{
    omv_dataset_t d;
    memset(&d, 0, sizeof(d));
    d.count = 12345;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_int_lt(omv_dataset_load_cifar(&d, list, 0, 0, err), 0);
    ck_assert_msg(strstr(err, path) != NULL, "error '%s' does not name %s", err, path);
    ck_assert_msg(strstr(err, words) != NULL, "error '%s' does not say '%s'", err, words);
    ck_assert_uint_eq(d.count, 12345);
}

START_TEST(test_cifar_refused)
{
    write_cifar_pair();
    /* Truncated: the second file loses its last byte. */
    uint8_t *buf = malloc(2 * 3073);
    for (int i = 0; i < 2; i++) {
        buf[i * 3073] = cifar_lab[3 + i];
        memcpy(buf + i * 3073 + 1, cifar_px + (3 + i) * 3072, 3072);
    }
    write_bytes(cifar_b, buf, 2 * 3073 - 1, 1);
    assert_cifar_refused(cifar_list, cifar_b, "not a whole number of CIFAR-10 records");
    /* A label that CIFAR-10 does not have. */
    buf[3073] = 200;
    write_bytes(cifar_b, buf, 2 * 3073, 0);
    assert_cifar_refused(cifar_list, cifar_b, "label 200");
    free(buf);
    /* An IDX file is not a CIFAR-10 batch. */
    write_pair(0);
    assert_cifar_refused(images, images, "CIFAR-10");
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/nosuch.bin", dir);
    assert_cifar_refused(missing, missing, "cannot open");
    char err[OMV_CONFIG_ERR_MAX];
    omv_dataset_t d;
    ck_assert_int_eq(omv_dataset_open(&d, "png", cifar_a, "", 0, 0, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "unknown data format 'png'"));
}
END_TEST

START_TEST(test_gather_normalises)
{
    write_cifar_pair();
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_dataset_load_cifar(&d, cifar_list, 0, 0, err), 0);
    omv_dataset_norm_t norm = {0.5f, {1.0f, 2.0f, 3.0f}, {2.0f, 4.0f, 8.0f}, 3, 3, 0, 0, 0};
    const uint32_t idx[2] = {4, 1};
    float *x = malloc(2 * 3072 * sizeof(float));
    uint8_t y[2];
    omv_dataset_gather(&d, &norm, idx, 2, x, y);
    ck_assert_uint_eq(y[0], 1);
    ck_assert_uint_eq(y[1], 9);
    /* x[i][row][col][channel] from the file's planes [channel][row][col]. */
    for (int i = 0; i < 2; i++)
        for (int p = 0; p < 1024; p += 97)
            for (int c = 0; c < 3; c++) {
                float byte = cifar_px[idx[i] * 3072 + c * 1024 + p];
                float want = (byte * 0.5f - norm.mean[c]) / norm.std[c];
                ck_assert_float_eq_tol(x[i * 3072 + p * 3 + c], want, 1e-4f);
            }
    /* One mean and std for every channel. */
    omv_dataset_norm_t one = {1.0f / 255, {0.5f}, {0.25f}, 1, 1, 0, 0, 0};
    omv_dataset_gather(&d, &one, idx, 1, x, y);
    float byte = cifar_px[4 * 3072 + 2 * 1024 + 5];
    ck_assert_float_eq_tol(x[5 * 3 + 2], (byte / 255 - 0.5f) / 0.25f, 1e-5f);
    omv_dataset_fini(&d);
    /* IDX: one channel, the default scale of 1/255. */
    write_pair(0);
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, 0, err), 0);
    omv_dataset_norm_t none = {0};
    const uint32_t first = 2;
    omv_dataset_gather(&d, &none, &first, 1, x, y);
    for (int p = 0; p < SIZE; p++)
        ck_assert_float_eq_tol(x[p], pixels[2 * SIZE + p] / 255.0f, 1e-7f);
    ck_assert_uint_eq(y[0], label_bytes[2]);
    free(x);
    omv_dataset_fini(&d);
}
END_TEST

/* Which crop and flip turned image i of the IDX set into out (scale 1: the bytes): the shift
 * (dy, dx) in [-pad, pad] and the flip, found by trying them all; -1 when none does. */
static int find_augment(const float *out, uint32_t i, int pad, int *ret_dy, int *ret_dx)
{
    for (int flip = 0; flip < 2; flip++)
        for (int dy = -pad; dy <= pad; dy++)
            for (int dx = -pad; dx <= pad; dx++) {
                int same = 1;
                for (int y = 0; y < ROWS && same; y++)
                    for (int x = 0; x < COLS && same; x++) {
                        int sy = y + dy, sx = (flip ? COLS - 1 - x : x) + dx;
                        float want = sy >= 0 && sy < ROWS && sx >= 0 && sx < COLS
                                         ? pixels[i * SIZE + sy * COLS + sx]
                                         : 0.0f;
                        same = out[y * COLS + x] == want;
                    }
                if (same) {
                    *ret_dy = dy, *ret_dx = dx;
                    return flip;
                }
            }
    return -1;
}

START_TEST(test_augment_crops_and_flips)
{
    /* Every augmented image is its source padded by 1, cropped at a place in [-1, 1]^2 and
     * maybe flipped; the same seed gives the same images, another pass's seed others; over many
     * draws every shift and both flips occur. */
    write_pair(0);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_int_eq(omv_dataset_load(&d, images, labels, 0, 0, err), 0);
    omv_dataset_norm_t norm = {.scale = 1.0f, .augment_pad = 1, .augment_flip = 1};
    uint32_t idx[COUNT] = {0, 1, 2, 3, 4};
    float a[COUNT * SIZE], b[COUNT * SIZE], prev[COUNT * SIZE];
    uint8_t y[COUNT];
    int seen[2][3][3] = {{{0}}};
    int differs = 0;
    for (uint64_t pass = 0; pass < 40; pass++) {
        norm.augment_seed = pass * 1000 + 7;
        omv_dataset_gather(&d, &norm, idx, COUNT, a, y);
        omv_dataset_gather(&d, &norm, idx, COUNT, b, y);
        ck_assert_mem_eq(a, b, sizeof(a));
        for (uint32_t i = 0; i < COUNT; i++) {
            int dy, dx, flip = find_augment(a + i * SIZE, i, 1, &dy, &dx);
            ck_assert_msg(flip >= 0, "pass %d image %u is no crop or flip of its source", (int)pass,
                          i);
            seen[flip][dy + 1][dx + 1]++;
            ck_assert_uint_eq(y[i], label_bytes[i]);
        }
        if (pass > 0)
            differs |= memcmp(a, prev, sizeof(a)) != 0;
        memcpy(prev, a, sizeof(a));
    }
    ck_assert_msg(differs, "every pass drew the same images");
    for (int f = 0; f < 2; f++)
        for (int dy = 0; dy < 3; dy++)
            for (int dx = 0; dx < 3; dx++)
                ck_assert_msg(seen[f][dy][dx] > 0, "flip %d shift (%d, %d) never drawn", f, dy - 1,
                              dx - 1);
    /* Off: the images as they are. */
    omv_dataset_norm_t off = {.scale = 1.0f};
    omv_dataset_gather(&d, &off, idx, 1, a, y);
    for (int p = 0; p < SIZE; p++)
        ck_assert_float_eq(a[p], pixels[p]);
    omv_dataset_fini(&d);
}
END_TEST

static Suite *dataset_suite(void)
{
    Suite *s = suite_create("dataset");
    TCase *tc = tcase_create("load");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_load_raw);
    tcase_add_test(tc, test_load_gz);
    tcase_add_test(tc, test_slice);
    tcase_add_test(tc, test_slice_to_end);
    tcase_add_test(tc, test_probe);
    tcase_add_test(tc, test_augment_crops_and_flips);
    suite_add_tcase(s, tc);
    tc = tcase_create("refusals");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_wrong_magic);
    tcase_add_test(tc, test_truncated_images_raw);
    tcase_add_test(tc, test_truncated_images_gz);
    tcase_add_test(tc, test_gz_cut_short);
    tcase_add_test(tc, test_truncated_header_and_labels);
    tcase_add_test(tc, test_zero_dimension);
    tcase_add_test(tc, test_huge_header_small_file);
    tcase_add_test(tc, test_count_mismatch);
    tcase_add_test(tc, test_range_past_end);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_cifar_load);
    tcase_add_test(tc, test_cifar_refused);
    tcase_add_test(tc, test_gather_normalises);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(dataset_suite());
}
