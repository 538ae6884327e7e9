/* Image classification data from IDX files (MNIST, Fashion-MNIST), raw or gzipped: a slice of
 * images kept as bytes, with their labels. */
#pragma once

#include <stdint.h>

#include "config.h"

#define OMV_DATASET_MAX_COUNT 100000000u
#define OMV_DATASET_MAX_DIM 65536u

typedef struct {
    uint32_t count;   /* images in this slice */
    uint32_t total;   /* images in the file */
    uint32_t rows, cols;
    uint8_t *pixels;  /* [count][rows * cols] */
    uint8_t *labels;  /* [count] */
    uint8_t max_label;
} omv_dataset_t;

/* Reads images [begin, begin + count) of an IDX image file and its label file (count 0: to the
 * end). Wrong magic, truncation, mismatched counts and gzip errors are refused: returns a
 * negative errno with "file: reason" in err[OMV_CONFIG_ERR_MAX]. The caller owns the result and
 * releases it with omv_dataset_fini. */
int omv_dataset_load(omv_dataset_t *ret, const char *images_path, const char *labels_path,
                     uint32_t begin, uint32_t count, char *err);

/* Reads only the header of an IDX image file: how many images it holds and their size. */
int omv_dataset_probe(const char *images_path, uint32_t *ret_count, uint32_t *ret_rows,
                      uint32_t *ret_cols, char *err);

void omv_dataset_fini(omv_dataset_t *self);
