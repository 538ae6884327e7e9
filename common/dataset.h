/* Image classification data from IDX files (MNIST, Fashion-MNIST), raw or gzipped, or from
 * CIFAR-10 binary batches: a slice of images kept as bytes, with their labels, and the
 * normalisation that turns them into the engine's channels-last floats. */
#pragma once

#include <stdint.h>

#include "config.h"

#define OMV_DATASET_MAX_COUNT 100000000u
#define OMV_DATASET_MAX_DIM 65536u

#define OMV_DATASET_MAX_CHANNELS 16
#define OMV_CIFAR_RECORD (1 + 3 * 32 * 32) /* label byte, then red, green, blue 32x32 planes */

typedef struct {
    uint32_t count; /* images in this slice */
    uint32_t total; /* images in the file(s) */
    uint32_t channels, rows, cols;
    uint8_t *pixels; /* [count][channels][rows][cols] as stored in the file */
    uint8_t *labels; /* [count] */
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

/* Reads images [begin, begin + count) (count 0: to the end) of CIFAR-10 binary batches:
 * `paths` is one file or several separated by commas, taken in order as one set. Every file
 * must be whole records of OMV_CIFAR_RECORD bytes with labels 0..9 (raw or gzipped); others are
 * refused with "file: reason" in err[OMV_CONFIG_ERR_MAX]. */
int omv_dataset_load_cifar(omv_dataset_t *ret, const char *paths, uint32_t begin, uint32_t count,
                           char *err);

/* By format ("idx": images_path and labels_path; "cifar10": images_path lists the batches,
 * labels_path is unused): omv_dataset_load or omv_dataset_load_cifar, or only the count and
 * shape (probe). Unknown formats are -EINVAL. */
int omv_dataset_open(omv_dataset_t *ret, const char *format, const char *images_path,
                     const char *labels_path, uint32_t begin, uint32_t count, char *err);
int omv_dataset_probe_format(const char *format, const char *images_path, uint32_t *ret_count,
                             uint32_t *ret_channels, uint32_t *ret_rows, uint32_t *ret_cols,
                             char *err);

void omv_dataset_fini(omv_dataset_t *self);

/* value = (byte * scale - mean[c]) / std[c]; n_mean and n_std are 0 (0 and 1 for every
 * channel), 1 (the same for every channel) or the channel count. */
typedef struct {
    float scale;
    float mean[OMV_DATASET_MAX_CHANNELS], std[OMV_DATASET_MAX_CHANNELS];
    uint32_t n_mean, n_std;
    /* Augmentation (training only; 0 and 0: off): each image is zero-padded by augment_pad
     * pixels on every side and cropped back at a random place, then flipped left to right with
     * probability 1/2 when augment_flip is set. The draws for image i come from augment_seed
     * and i alone: set augment_seed anew for every pass. */
    uint32_t augment_pad, augment_flip;
    uint64_t augment_seed;
} omv_dataset_norm_t;

/* Writes images idx[0..n) of the slice into x[n][rows][cols][channels] (channels-last, as the
 * engine takes them), normalised (and augmented, when norm says so), and their labels into
 * y[n]. */
void omv_dataset_gather(const omv_dataset_t *self, const omv_dataset_norm_t *norm,
                        const uint32_t *idx, uint32_t n, float *x, uint8_t *y);
