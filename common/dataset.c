/* IDX reader (gzip through zlib, which reads uncompressed files as they are). */
#include "dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_UBYTE 0x08

typedef struct {
    gzFile gz;
    uint32_t dims[3];
    int ndims;
} idx_file_t;

static int gz_fail(gzFile gz, const char *path, const char *what, char *err)
{
    int zerr = 0;
    const char *msg = gz ? gzerror(gz, &zerr) : "";
    if (zerr != Z_OK && zerr != Z_STREAM_END)
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: corrupt gzip data while reading %s: %s", path,
                 what, msg);
    else
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: truncated: file ends inside the %s", path, what);
    return -EPROTO;
}

static int idx_open(idx_file_t *f, const char *path, int want_ndims, char *err)
{
    unsigned char head[4], dim[4];
    memset(f, 0, sizeof(*f));
    f->gz = gzopen(path, "rb");
    if (f->gz == NULL) {
        int e = errno ? errno : ENOMEM;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    gzbuffer(f->gz, 1 << 17);
    if (gzread(f->gz, head, 4) != 4)
        return gz_fail(f->gz, path, "IDX header", err);
    if (head[0] != 0 || head[1] != 0 || head[2] != IDX_UBYTE || head[3] != want_ndims) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: not an IDX %s file (magic %02x%02x%02x%02x, expected 000008%02x)", path,
                 want_ndims == 3 ? "image" : "label", head[0], head[1], head[2], head[3],
                 want_ndims);
        return -EPROTO;
    }
    f->ndims = want_ndims;
    for (int i = 0; i < want_ndims; i++) {
        if (gzread(f->gz, dim, 4) != 4)
            return gz_fail(f->gz, path, "IDX header", err);
        f->dims[i] = (uint32_t)dim[0] << 24 | (uint32_t)dim[1] << 16 | (uint32_t)dim[2] << 8 | dim[3];
        uint32_t limit = i == 0 ? OMV_DATASET_MAX_COUNT : OMV_DATASET_MAX_DIM;
        if (f->dims[i] == 0 || f->dims[i] > limit) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: dimension %d is %u, outside [1, %u]", path, i,
                     f->dims[i], limit);
            return -EPROTO;
        }
    }
    return 0;
}

static void idx_close(idx_file_t *f)
{
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/* Skips `bytes` forward and reads `len` bytes into dst; a short read is truncation. */
static int idx_read(idx_file_t *f, const char *path, uint64_t skip, uint8_t *dst, uint64_t len,
                    const char *what, char *err)
{
    if (skip > 0 && gzseek(f->gz, (z_off_t)skip, SEEK_CUR) < 0)
        return gz_fail(f->gz, path, what, err);
    while (len > 0) {
        unsigned chunk = len > (1u << 30) ? (1u << 30) : (unsigned)len;
        int got = gzread(f->gz, dst, chunk);
        if (got <= 0 || (unsigned)got != chunk)
            return gz_fail(f->gz, path, what, err);
        dst += chunk;
        len -= chunk;
    }
    return 0;
}

int omv_dataset_probe(const char *images_path, uint32_t *ret_count, uint32_t *ret_rows,
                      uint32_t *ret_cols, char *err)
{
    idx_file_t f;
    int r = idx_open(&f, images_path, 3, err);
    if (r == 0) {
        *ret_count = f.dims[0];
        *ret_rows = f.dims[1];
        *ret_cols = f.dims[2];
    }
    idx_close(&f);
    return r;
}

int omv_dataset_load(omv_dataset_t *ret, const char *images_path, const char *labels_path,
                     uint32_t begin, uint32_t count, char *err)
{
    idx_file_t fi, fl;
    omv_dataset_t d;
    int r;
    memset(&d, 0, sizeof(d));
    memset(&fl, 0, sizeof(fl));
    r = idx_open(&fi, images_path, 3, err);
    if (r < 0)
        goto out;
    r = idx_open(&fl, labels_path, 1, err);
    if (r < 0)
        goto out;
    if (fi.dims[0] != fl.dims[0]) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: holds %u labels but %s holds %u images",
                 labels_path, fl.dims[0], images_path, fi.dims[0]);
        r = -EPROTO;
        goto out;
    }
    d.total = fi.dims[0];
    if (count == 0 && begin < d.total)
        count = d.total - begin;
    if (begin >= d.total || count > d.total - begin) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: asked for images [%u, %u) of %u", images_path,
                 begin, begin + count, d.total);
        r = -ERANGE;
        goto out;
    }
    d.count = count;
    d.rows = fi.dims[1];
    d.cols = fi.dims[2];
    uint64_t size = (uint64_t)d.rows * d.cols;
    d.pixels = malloc(count * size);
    d.labels = malloc(count);
    if (d.pixels == NULL || d.labels == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: out of memory for %u images", images_path, count);
        r = -ENOMEM;
        goto out;
    }
    r = idx_read(&fi, images_path, (uint64_t)begin * size, d.pixels, (uint64_t)count * size,
                 "image data", err);
    if (r < 0)
        goto out;
    r = idx_read(&fl, labels_path, begin, d.labels, count, "label data", err);
    if (r < 0)
        goto out;
    for (uint32_t i = 0; i < count; i++)
        if (d.labels[i] > d.max_label)
            d.max_label = d.labels[i];
    *ret = d;
    memset(&d, 0, sizeof(d));
out:
    idx_close(&fi);
    idx_close(&fl);
    omv_dataset_fini(&d);
    return r;
}

void omv_dataset_fini(omv_dataset_t *self)
{
    free(self->pixels);
    free(self->labels);
    memset(self, 0, sizeof(*self));
}
