/* IDX and CIFAR-10 readers (gzip through zlib, which reads uncompressed files as they are), and
 * the normalising gather. */
#include "dataset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "rng.h"

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
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: corrupt gzip data while reading %s: %s", path, what,
                 msg);
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
        f->dims[i] =
            (uint32_t)dim[0] << 24 | (uint32_t)dim[1] << 16 | (uint32_t)dim[2] << 8 | dim[3];
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

/* deflate shrinks data by at most about 1032:1, so a compressed file of n bytes holds at most
 * this many bytes; an uncompressed file holds exactly its size. */
#define DEFLATE_MAX_RATIO 1100u

/* Checks, before anything is allocated, that the file can hold `need` bytes of data after its
 * header: a short file must not make the loader allocate what its header claims (found by
 * fuzzing: 73 bytes that asked for 6.7 GB). */
static int idx_fits(idx_file_t *f, const char *path, uint64_t need, const char *what, char *err)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return 0; /* gzopen succeeded: reading will say what is wrong */
    uint64_t head = 4 + 4 * (uint64_t)f->ndims, size = (uint64_t)st.st_size;
    uint64_t room = gzdirect(f->gz) ? (size > head ? size - head : 0) : size * DEFLATE_MAX_RATIO;
    if (!S_ISREG(st.st_mode) || need <= room)
        return 0;
    snprintf(err, OMV_CONFIG_ERR_MAX,
             "%s: truncated: its header announces %llu bytes of %s but the file has %llu bytes%s",
             path, (unsigned long long)need, what, (unsigned long long)size,
             gzdirect(f->gz) ? "" : " (compressed)");
    return -EPROTO;
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
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: holds %u labels but %s holds %u images", labels_path,
                 fl.dims[0], images_path, fi.dims[0]);
        r = -EPROTO;
        goto out;
    }
    d.total = fi.dims[0];
    if (count == 0 && begin < d.total)
        count = d.total - begin;
    if (begin >= d.total || count > d.total - begin) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: asked for images [%u, %u) of %u", images_path, begin,
                 begin + count, d.total);
        r = -ERANGE;
        goto out;
    }
    d.count = count;
    d.channels = 1;
    d.rows = fi.dims[1];
    d.cols = fi.dims[2];
    uint64_t size = (uint64_t)d.rows * d.cols;
    r = idx_fits(&fi, images_path, (uint64_t)(begin + count) * size, "image data", err);
    if (r == 0)
        r = idx_fits(&fl, labels_path, (uint64_t)begin + count, "label data", err);
    if (r < 0)
        goto out;
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

/* Counts the records of one CIFAR-10 file: its length must be a whole number of them. */
static int cifar_count(const char *path, uint64_t *ret_count, char *err)
{
    gzFile gz = gzopen(path, "rb");
    if (gz == NULL) {
        int e = errno ? errno : ENOMEM;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    gzbuffer(gz, 1 << 17);
    uint8_t buf[1 << 15];
    uint64_t len = 0;
    int got;
    while ((got = gzread(gz, buf, sizeof(buf))) > 0)
        len += (uint64_t)got;
    int r = 0;
    if (got < 0) {
        r = gz_fail(gz, path, "CIFAR-10 records", err);
    } else if (len == 0 || len % OMV_CIFAR_RECORD != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: %llu bytes is not a whole number of CIFAR-10 records of %d bytes "
                 "(truncated, or not a CIFAR-10 binary batch)",
                 path, (unsigned long long)len, OMV_CIFAR_RECORD);
        r = -EPROTO;
    } else if (len / OMV_CIFAR_RECORD > OMV_DATASET_MAX_COUNT) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: more than %u records", path, OMV_DATASET_MAX_COUNT);
        r = -EPROTO;
    }
    gzclose(gz);
    if (r == 0)
        *ret_count = len / OMV_CIFAR_RECORD;
    return r;
}

/* Calls fn(path, arg) for each comma-separated path; stops at the first failure. */
static int each_path(const char *paths, int (*fn)(const char *, void *), void *arg, char *err)
{
    const char *p = paths;
    do {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char path[4096];
        while (len > 0 && *p == ' ')
            p++, len--;
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len == 0 || len >= sizeof(path)) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: %s path in the list", paths,
                     len ? "too long a" : "an empty");
            return -EINVAL;
        }
        memcpy(path, p, len);
        path[len] = '\0';
        int r = fn(path, arg);
        if (r < 0)
            return r;
        p = comma ? comma + 1 : NULL;
    } while (p != NULL);
    return 0;
}

typedef struct {
    char *err;
    uint64_t total;        /* records in the files so far */
    uint32_t begin, count; /* the slice */
    omv_dataset_t *d;      /* NULL: only count */
} cifar_walk_t;

static int cifar_count_one(const char *path, void *arg)
{
    cifar_walk_t *w = arg;
    uint64_t n;
    int r = cifar_count(path, &n, w->err);
    if (r == 0 && w->total + n > OMV_DATASET_MAX_COUNT) {
        snprintf(w->err, OMV_CONFIG_ERR_MAX, "%s: more than %u records in all", path,
                 OMV_DATASET_MAX_COUNT);
        r = -EPROTO;
    }
    w->total += n;
    return r;
}

/* Reads the records of one file that fall in the slice. */
static int cifar_read_one(const char *path, void *arg)
{
    cifar_walk_t *w = arg;
    uint64_t n;
    int r = cifar_count(path, &n, w->err); /* the file may have changed since counting */
    if (r < 0)
        return r;
    uint64_t first = w->total, end = w->total + n;
    w->total = end;
    uint64_t lo = first > w->begin ? first : w->begin;
    uint64_t hi = end < (uint64_t)w->begin + w->count ? end : (uint64_t)w->begin + w->count;
    if (lo >= hi)
        return 0;
    gzFile gz = gzopen(path, "rb");
    if (gz == NULL) {
        snprintf(w->err, OMV_CONFIG_ERR_MAX, "%s: cannot open: %s", path, strerror(errno));
        return -EIO;
    }
    gzbuffer(gz, 1 << 17);
    if ((lo - first) > 0 && gzseek(gz, (z_off_t)((lo - first) * OMV_CIFAR_RECORD), SEEK_CUR) < 0)
        r = gz_fail(gz, path, "CIFAR-10 records", w->err);
    const size_t size = OMV_CIFAR_RECORD - 1;
    uint8_t rec[OMV_CIFAR_RECORD];
    for (uint64_t i = lo; r == 0 && i < hi; i++) {
        if (gzread(gz, rec, OMV_CIFAR_RECORD) != OMV_CIFAR_RECORD) {
            r = gz_fail(gz, path, "CIFAR-10 records", w->err);
            break;
        }
        if (rec[0] > 9) {
            snprintf(w->err, OMV_CONFIG_ERR_MAX,
                     "%s: record %llu has label %u; CIFAR-10 labels are 0 to 9 (corrupt, or not "
                     "a CIFAR-10 binary batch)",
                     path, (unsigned long long)(i - first), rec[0]);
            r = -EPROTO;
            break;
        }
        size_t at = (size_t)(i - w->begin);
        w->d->labels[at] = rec[0];
        memcpy(w->d->pixels + at * size, rec + 1, size);
    }
    gzclose(gz);
    return r;
}

int omv_dataset_load_cifar(omv_dataset_t *ret, const char *paths, uint32_t begin, uint32_t count,
                           char *err)
{
    cifar_walk_t w = {err, 0, 0, 0, NULL};
    int r = each_path(paths, cifar_count_one, &w, err);
    if (r < 0)
        return r;
    uint32_t total = (uint32_t)w.total;
    if (count == 0 && begin < total)
        count = total - begin;
    if (begin >= total || count > total - begin) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: asked for images [%u, %u) of %u", paths, begin,
                 begin + count, total);
        return -ERANGE;
    }
    omv_dataset_t d;
    memset(&d, 0, sizeof(d));
    d.count = count;
    d.total = total;
    d.channels = 3;
    d.rows = d.cols = 32;
    d.pixels = malloc((size_t)count * (OMV_CIFAR_RECORD - 1));
    d.labels = malloc(count);
    if (d.pixels == NULL || d.labels == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: out of memory for %u images", paths, count);
        omv_dataset_fini(&d);
        return -ENOMEM;
    }
    w = (cifar_walk_t){err, 0, begin, count, &d};
    r = each_path(paths, cifar_read_one, &w, err);
    if (r < 0) {
        omv_dataset_fini(&d);
        return r;
    }
    for (uint32_t i = 0; i < count; i++)
        if (d.labels[i] > d.max_label)
            d.max_label = d.labels[i];
    *ret = d;
    return 0;
}

int omv_dataset_open(omv_dataset_t *ret, const char *format, const char *images_path,
                     const char *labels_path, uint32_t begin, uint32_t count, char *err)
{
    if (strcmp(format, "idx") == 0)
        return omv_dataset_load(ret, images_path, labels_path, begin, count, err);
    if (strcmp(format, "cifar10") == 0)
        return omv_dataset_load_cifar(ret, images_path, begin, count, err);
    snprintf(err, OMV_CONFIG_ERR_MAX, "%s: unknown data format '%s' (idx or cifar10)", images_path,
             format);
    return -EINVAL;
}

int omv_dataset_probe_format(const char *format, const char *images_path, uint32_t *ret_count,
                             uint32_t *ret_channels, uint32_t *ret_rows, uint32_t *ret_cols,
                             char *err)
{
    if (strcmp(format, "cifar10") == 0) {
        cifar_walk_t w = {err, 0, 0, 0, NULL};
        int r = each_path(images_path, cifar_count_one, &w, err);
        if (r < 0)
            return r;
        *ret_count = (uint32_t)w.total;
        *ret_channels = 3;
        *ret_rows = *ret_cols = 32;
        return 0;
    }
    if (strcmp(format, "idx") != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: unknown data format '%s' (idx or cifar10)",
                 images_path, format);
        return -EINVAL;
    }
    int r = omv_dataset_probe(images_path, ret_count, ret_rows, ret_cols, err);
    if (r == 0)
        *ret_channels = 1;
    return r;
}

/* One image, shifted by (dy, dx) (the crop's place in the padded image less the padding) and
 * flipped: out(y, x) = the source at (y + dy, x' + dx), x' = flip ? cols - 1 - x : x, and the
 * value of a zero pixel outside it. */
static void augment_one(const omv_dataset_t *self, const uint8_t *px, float *xr, const float *mul,
                        const float *add, int dy, int dx, int flip)
{
    uint32_t c = self->channels, rows = self->rows, cols = self->cols;
    size_t plane = (size_t)rows * cols;
    for (uint32_t yy = 0; yy < rows; yy++) {
        int sy = (int)yy + dy;
        for (uint32_t xx = 0; xx < cols; xx++) {
            int sx = (int)(flip ? cols - 1 - xx : xx) + dx;
            int inside = sy >= 0 && sy < (int)rows && sx >= 0 && sx < (int)cols;
            size_t at = inside ? (size_t)sy * cols + (size_t)sx : 0;
            float *o = xr + ((size_t)yy * cols + xx) * c;
            for (uint32_t k = 0; k < c; k++)
                o[k] = (inside ? (float)px[k * plane + at] : 0.0f) * mul[k] + add[k];
        }
    }
}

/* Draws image i's crop and flip from the pass's seed, and writes it. */
static void augment(const omv_dataset_t *self, const omv_dataset_norm_t *norm, uint32_t i,
                    const uint8_t *px, float *xr, const float *mul, const float *add)
{
    omv_rng_t rng;
    omv_rng_init(&rng, norm->augment_seed ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ULL));
    int pad = (int)norm->augment_pad;
    int dy = pad ? (int)omv_rng_below(&rng, 2 * (uint32_t)pad + 1) - pad : 0;
    int dx = pad ? (int)omv_rng_below(&rng, 2 * (uint32_t)pad + 1) - pad : 0;
    int flip = norm->augment_flip ? (int)(omv_rng_next(&rng) >> 63) : 0;
    augment_one(self, px, xr, mul, add, dy, dx, flip);
}

void omv_dataset_gather(const omv_dataset_t *self, const omv_dataset_norm_t *norm,
                        const uint32_t *idx, uint32_t n, float *x, uint8_t *y)
{
    uint32_t c = self->channels, plane = self->rows * self->cols;
    size_t size = (size_t)c * plane;
    float mul[OMV_DATASET_MAX_CHANNELS], add[OMV_DATASET_MAX_CHANNELS];
    float scale = norm->scale > 0.0f ? norm->scale : 1.0f / 255.0f;
    for (uint32_t k = 0; k < c && k < OMV_DATASET_MAX_CHANNELS; k++) {
        float mean = norm->n_mean == 0 ? 0.0f : norm->mean[norm->n_mean == 1 ? 0 : k];
        float std = norm->n_std == 0 ? 1.0f : norm->std[norm->n_std == 1 ? 0 : k];
        mul[k] = scale / std; /* (byte * scale - mean) / std = byte * mul + add */
        add[k] = -mean / std;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *px = self->pixels + (size_t)idx[i] * size;
        float *xr = x + (size_t)i * size;
        if (norm->augment_pad || norm->augment_flip) {
            augment(self, norm, idx[i], px, xr, mul, add);
        } else if (c == 1) {
            for (uint32_t p = 0; p < plane; p++)
                xr[p] = (float)px[p] * mul[0] + add[0];
        } else { /* planes in the file, channels-last for the engine */
            for (uint32_t k = 0; k < c; k++)
                for (uint32_t p = 0; p < plane; p++)
                    xr[(size_t)p * c + k] = (float)px[(size_t)k * plane + p] * mul[k] + add[k];
        }
        y[i] = self->labels[idx[i]];
    }
}

void omv_dataset_fini(omv_dataset_t *self)
{
    free(self->pixels);
    free(self->labels);
    memset(self, 0, sizeof(*self));
}
