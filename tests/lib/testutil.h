/* Helpers shared by the test suites: temporary folders and small generated IDX data sets. */
#pragma once

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* Makes a fresh temporary folder; returns its path (static storage, one per call site copy). */
void omv_test_tmpdir(char *out, size_t cap);

/* Writes an IDX image file (count x rows x cols bytes) and a label file. gz: gzip them.
 * Returns 0 or a negative errno. */
int omv_test_write_idx(const char *images_path, const char *labels_path, const uint8_t *pixels,
                       const uint8_t *labels, uint32_t count, uint32_t rows, uint32_t cols, int gz);

/* A small separable problem: `count` images of rows x cols whose class (of `classes`) decides
 * which block of pixels is bright, with seeded noise. Writes the IDX pair. */
int omv_test_make_blobs(const char *images_path, const char *labels_path, uint32_t count,
                        uint32_t rows, uint32_t cols, uint32_t classes, uint64_t seed, int gz);

/* Writes a CIFAR-10 binary batch: count records of a label byte and 3072 pixel bytes (red,
 * green, blue 32x32 planes). gz: gzip it. Returns 0 or a negative errno. */
int omv_test_write_cifar(const char *path, const uint8_t *pixels, const uint8_t *labels,
                         uint32_t count, int gz);

/* Removes a folder and everything in it. */
void omv_test_rmdir(const char *dir);

/* Runs a suite (taken) with Check's normal output; returns the process exit status. */
int omv_test_run(Suite *suite);
