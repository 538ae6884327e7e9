/* Models in and out of omnivore as safetensors files (Hugging Face's format: an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
 * then the raw little-endian data with no holes), with the tensor names and layouts PyTorch's
 * state_dict of the same network has: conv<i>.weight [out][in][kh][kw] and .bias, bn<i>.weight,
 * .bias, .running_mean, .running_var, .num_batches_tracked, fc<i>.weight [out][in] (in in
 * PyTorch's channels-first flattening order) and .bias, and proj<i>.weight [out][in][1][1] and
 * .bias for a residual add's 1x1 projection; i counts layers of that kind from 1. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define OMV_SAFETENSORS_ERR_MAX 512
/* Header bytes a file may declare before anything is allocated for it. */
#define OMV_SAFETENSORS_MAX_HEADER (16u << 20)

/* One tensor of the export: its name, its PyTorch shape, and where its values are in the flat
 * parameter vector (o x h x w x c there, channels last, written o x c x h x w). */
typedef struct {
    char name[32];
    uint32_t ndim;
    uint64_t shape[4];
    size_t offset, count;
    uint32_t o, h, w, c; /* the permutation: identity when h = w = 1 */
    int is_counter;      /* num_batches_tracked: an int64 scalar, not in the vector */
} omv_tensor_t;

/* Lists the tensors of a layout into ret[cap]. Returns their count, or -ENOSPC. */
int omv_safetensors_tensors(const omv_model_layout_t *layout, omv_tensor_t *ret, size_t cap);

/* Writes params[param_count] of layout to path (through a temporary file and a rename), with
 * n_meta string pairs in __metadata__ (keys and values any UTF-8 text; escaped here).
 * batches is what num_batches_tracked says. Returns 0 or a negative errno with the reason in
 * err[OMV_SAFETENSORS_ERR_MAX]. */
int omv_safetensors_write(const char *path, const omv_model_layout_t *layout, const float *params,
                          const char *const *meta_keys, const char *const *meta_values,
                          size_t n_meta, int64_t batches, char *err);

/* Reads path into params[param_count] of layout: every tensor the layout has must be in the file
 * as F32 with its shape (a missing tensor or another shape is refused, naming it); extra tensors
 * are refused too. Returns 0 or a negative errno with the reason in err. */
int omv_safetensors_read(const char *path, const omv_model_layout_t *layout, float *params,
                         char *err);
