/* Safetensors export and import: the PyTorch names and layouts of a model's tensors, the writer,
 * and a reader with a small JSON parser for the header (objects, arrays, strings, integers). */
#include "safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strbuf.h"
#include "util.h"

/* ---- names and layouts ---- */

typedef struct {
    omv_tensor_t *t;
    size_t n, cap;
} list_t;

static omv_tensor_t *add(list_t *l, const char *prefix, uint32_t index, const char *what)
{
    if (l->n == l->cap)
        return NULL;
    omv_tensor_t *t = &l->t[l->n++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s%u.%s", prefix, index, what);
    t->h = t->w = 1;
    return t;
}

/* A vector of count values at offset. */
static int vec(list_t *l, const char *prefix, uint32_t index, const char *what, size_t offset,
               size_t count)
{
    omv_tensor_t *t = add(l, prefix, index, what);
    if (t == NULL)
        return -ENOSPC;
    t->ndim = 1;
    t->shape[0] = count;
    t->offset = offset;
    t->count = count;
    t->o = (uint32_t)count;
    t->c = 1;
    return 0;
}

/* A weight stored [o][h][w][c] and written [o][c][h][w]: conv (h, w the kernel), fc on an image
 * (h, w, c its input's; PyTorch flattens channels first) or a 1x1 projection. 4-D for conv and
 * projection, 2-D [o][c*h*w] for fc. */
static int weight(list_t *l, const char *prefix, uint32_t index, const omv_model_layer_t *L,
                  uint32_t h, uint32_t w, uint32_t c, int four_d)
{
    omv_tensor_t *t = add(l, prefix, index, "weight");
    if (t == NULL)
        return -ENOSPC;
    t->o = (uint32_t)(L->w_count / ((size_t)h * w * c));
    t->h = h, t->w = w, t->c = c;
    t->offset = L->w_offset;
    t->count = L->w_count;
    t->shape[0] = t->o;
    if (four_d) {
        t->ndim = 4;
        t->shape[1] = c, t->shape[2] = h, t->shape[3] = w;
    } else {
        t->ndim = 2;
        t->shape[1] = (uint64_t)c * h * w;
    }
    return 0;
}

/* The image a layer's input was flattened from (through flatten, and ReLU, dropout or 1-D batch
 * norm after it, which keep the order of the features): an fc layer's weights and a 1-D batch
 * norm's vectors are in that image's order, which PyTorch flattens channels first. */
static omv_shape_t flat_from(const omv_model_layout_t *layout, uint32_t i)
{
    omv_shape_t in = layout->layers[i].in;
    for (uint32_t j = i; j-- > 0;) {
        const omv_model_layer_t *L = &layout->layers[j];
        bool vector_bn = L->kind == OMV_LAYER_BATCHNORM && L->in.h == 1 && L->in.w == 1;
        if (L->kind == OMV_LAYER_FLATTEN)
            in = L->in;
        else if (L->kind != OMV_LAYER_RELU && L->kind != OMV_LAYER_DROPOUT && !vector_bn)
            break;
    }
    return in;
}

/* A 1-D batch norm on a flattened image: its vectors [h * w * c] in our (y, x, c) order are
 * PyTorch's (c, y, x), the permutation of an fc weight of one output. */
static void flattened_vector(omv_tensor_t *t, omv_shape_t img)
{
    t->o = 1;
    t->h = img.h, t->w = img.w, t->c = img.c;
}

int omv_safetensors_tensors(const omv_model_layout_t *layout, omv_tensor_t *ret, size_t cap)
{
    list_t l = {ret, 0, cap};
    uint32_t n_conv = 0, n_bn = 0, n_fc = 0, n_proj = 0;
    for (uint32_t i = 0; i < layout->n_layers; i++) {
        const omv_model_layer_t *L = &layout->layers[i];
        int r = 0;
        if (L->kind == OMV_LAYER_CONV) {
            r = weight(&l, "conv", ++n_conv, L, L->kh, L->kw, L->in.c, 1);
            r = r ? r : vec(&l, "conv", n_conv, "bias", L->b_offset, L->b_count);
        } else if (L->kind == OMV_LAYER_FC) {
            omv_shape_t in = flat_from(layout, i);
            r = weight(&l, "fc", ++n_fc, L, in.h, in.w, in.c, 0);
            r = r ? r : vec(&l, "fc", n_fc, "bias", L->b_offset, L->b_count);
        } else if (L->kind == OMV_LAYER_ADD && L->w_count > 0) {
            r = weight(&l, "proj", ++n_proj, L, 1, 1, L->skip.c, 1);
            r = r ? r : vec(&l, "proj", n_proj, "bias", L->b_offset, L->b_count);
        } else if (L->kind == OMV_LAYER_BATCHNORM) {
            uint32_t k = ++n_bn, c = L->in.c;
            size_t first = l.n;
            r = vec(&l, "bn", k, "weight", L->w_offset, c);
            r = r ? r : vec(&l, "bn", k, "bias", L->b_offset, c);
            r = r ? r : vec(&l, "bn", k, "running_mean", L->s_offset, c);
            r = r ? r : vec(&l, "bn", k, "running_var", L->s_offset + c, c);
            omv_shape_t img = flat_from(layout, i);
            bool flattened = L->in.h == 1 && L->in.w == 1 && img.h * img.w > 1;
            for (size_t v = first; r == 0 && flattened && v < l.n; v++)
                flattened_vector(&l.t[v], img);
            omv_tensor_t *t = r ? NULL : add(&l, "bn", k, "num_batches_tracked");
            if (t)
                t->is_counter = 1; /* a scalar: ndim 0 */
            r = r ? r : t ? 0 : -ENOSPC;
        }
        if (r < 0)
            return r;
    }
    return (int)l.n;
}

/* Copies one tensor between the flat vector (channels last) and PyTorch's order; to_torch says
 * which way. */
static void permute(const omv_tensor_t *t, const float *src, float *dst, int to_torch)
{
    size_t hw = (size_t)t->h * t->w;
    for (uint32_t o = 0; o < t->o; o++)
        for (size_t p = 0; p < hw; p++)
            for (uint32_t c = 0; c < t->c; c++) {
                size_t ours = ((size_t)o * hw + p) * t->c + c;
                size_t theirs = ((size_t)o * t->c + c) * hw + p;
                if (to_torch)
                    dst[theirs] = src[ours];
                else
                    dst[ours] = src[theirs];
            }
}

/* ---- writing ---- */

static void header_text(omv_strbuf_t *b, const omv_tensor_t *t, int n, const char *const *meta_keys,
                        const char *const *meta_values, size_t n_meta)
{
    omv_strbuf_printf(b, "%s", "{\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++) {
        if (i)
            omv_strbuf_printf(b, "%s", ",");
        omv_strbuf_json_string(b, meta_keys[i]);
        omv_strbuf_printf(b, "%s", ":");
        omv_strbuf_json_string(b, meta_values[i]);
    }
    omv_strbuf_printf(b, "%s", "}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = t[i].is_counter ? 8 : t[i].count * 4;
        omv_strbuf_printf(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                          t[i].is_counter ? "I64" : "F32");
        for (uint32_t d = 0; d < t[i].ndim; d++)
            omv_strbuf_printf(b, "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
        omv_strbuf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                          (unsigned long long)(at + bytes));
        at += bytes;
    }
    omv_strbuf_printf(b, "%s", "}");
    /* Padded with spaces so that the data starts 8-byte aligned, as the format allows. */
    while ((b->len + 8) % 8 != 0)
        omv_strbuf_printf(b, "%s", " ");
}

static int write_all(FILE *f, const omv_tensor_t *t, int n, const float *params, int64_t batches,
                     const char *header, size_t header_len)
{
    uint64_t len = header_len;
    int ok = fwrite(&len, 8, 1, f) == 1 && fwrite(header, 1, header_len, f) == header_len;
    size_t most = 0;
    for (int i = 0; i < n; i++)
        most = t[i].count > most ? t[i].count : most;
    float *buf = malloc((most ? most : 1) * sizeof(float));
    if (buf == NULL)
        return -ENOMEM;
    for (int i = 0; ok && i < n; i++) {
        if (t[i].is_counter) {
            ok = fwrite(&batches, 8, 1, f) == 1;
            continue;
        }
        permute(&t[i], params + t[i].offset, buf, 1);
        ok = fwrite(buf, sizeof(float), t[i].count, f) == t[i].count;
    }
    free(buf);
    return ok ? 0 : -EIO;
}

int omv_safetensors_write(const char *path, const omv_model_layout_t *layout, const float *params,
                          const char *const *meta_keys, const char *const *meta_values,
                          size_t n_meta, int64_t batches, char *err)
{
    omv_tensor_t t[OMV_MODEL_MAX_LAYERS * 5];
    int n = omv_safetensors_tensors(layout, t, sizeof(t) / sizeof(t[0]));
    if (n < 0) {
        snprintf(err, OMV_SAFETENSORS_ERR_MAX, "%s: too many tensors", path);
        return n;
    }
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    header_text(&b, t, n, meta_keys, meta_values, n_meta);
    if (b.failed) {
        omv_strbuf_fini(&b);
        snprintf(err, OMV_SAFETENSORS_ERR_MAX, "%s: no memory for the header", path);
        return -ENOMEM;
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int r = f ? 0 : -errno;
    if (r == 0)
        r = write_all(f, t, n, params, batches, omv_strbuf_str(&b), b.len);
    if (f && fclose(f) != 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) != 0)
        r = -errno;
    if (r < 0) {
        snprintf(err, OMV_SAFETENSORS_ERR_MAX, "cannot write %s: %s", path, strerror(-r));
        unlink(tmp);
    }
    omv_strbuf_fini(&b);
    return r;
}

/* ---- reading ---- */

/* One tensor as the header names it. */
typedef struct {
    char name[64];
    char dtype[8];
    uint32_t ndim;
    uint64_t shape[8];
    uint64_t begin, end;
} entry_t;

typedef struct {
    const char *p, *end;
    int bad;
} json_t;

static void ws(json_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int eat(json_t *j, char c)
{
    ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

/* A string into out[cap] (escapes kept as their second character: names and dtypes need
 * none); too long or unterminated sets bad. */
static void string(json_t *j, char *out, size_t cap)
{
    size_t n = 0;
    if (!eat(j, '"')) {
        j->bad = 1;
        return;
    }
    while (j->p < j->end && *j->p != '"') {
        if (*j->p == '\\' && j->p + 1 < j->end)
            j->p++;
        if (out && n + 1 < cap)
            out[n++] = *j->p;
        else if (out)
            j->bad = 1;
        j->p++;
    }
    if (out && cap)
        out[n] = '\0';
    if (!eat(j, '"'))
        j->bad = 1;
}

static uint64_t integer(json_t *j)
{
    ws(j);
    uint64_t v = 0;
    const char *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9' && v < (1ull << 60))
        v = v * 10 + (uint64_t)(*j->p++ - '0');
    if (j->p == start || (j->p < j->end && *j->p >= '0' && *j->p <= '9'))
        j->bad = 1;
    return v;
}

/* [n, n, ...] into v[cap]; returns the count. */
static uint32_t int_array(json_t *j, uint64_t *v, uint32_t cap)
{
    uint32_t n = 0;
    if (!eat(j, '[')) {
        j->bad = 1;
        return 0;
    }
    if (eat(j, ']'))
        return 0;
    do {
        uint64_t x = integer(j);
        if (n < cap)
            v[n++] = x;
        else
            j->bad = 1;
    } while (!j->bad && eat(j, ','));
    if (!eat(j, ']'))
        j->bad = 1;
    return n;
}

/* Skips the __metadata__ object: string values only, as the format says. */
static void metadata(json_t *j)
{
    if (!eat(j, '{')) {
        j->bad = 1;
        return;
    }
    if (eat(j, '}'))
        return;
    do {
        string(j, NULL, 0);
        if (!eat(j, ':'))
            j->bad = 1;
        string(j, NULL, 0);
    } while (!j->bad && eat(j, ','));
    if (!eat(j, '}'))
        j->bad = 1;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} in any order. */
static void tensor(json_t *j, entry_t *e)
{
    uint64_t off[2] = {0, 0};
    int have = 0;
    if (!eat(j, '{')) {
        j->bad = 1;
        return;
    }
    do {
        char key[16];
        string(j, key, sizeof(key));
        if (!eat(j, ':'))
            j->bad = 1;
        if (j->bad)
            return;
        if (strcmp(key, "dtype") == 0) {
            string(j, e->dtype, sizeof(e->dtype));
            have |= 1;
        } else if (strcmp(key, "shape") == 0) {
            e->ndim = int_array(j, e->shape, 8);
            have |= 2;
        } else if (strcmp(key, "data_offsets") == 0) {
            j->bad |= int_array(j, off, 2) != 2;
            have |= 4;
        } else {
            j->bad = 1;
        }
    } while (!j->bad && eat(j, ','));
    if (!eat(j, '}') || have != 7 || off[1] < off[0])
        j->bad = 1;
    e->begin = off[0], e->end = off[1];
}

/* The header's tensors into e[cap]; returns their count, or -1 when the header is malformed or
 * names more than cap. */
static int parse_header(const char *text, size_t len, entry_t *e, int cap)
{
    json_t j = {text, text + len, 0};
    int n = 0;
    if (!eat(&j, '{'))
        return -1;
    if (eat(&j, '}'))
        return 0;
    do {
        char name[64];
        string(&j, name, sizeof(name));
        if (!eat(&j, ':'))
            j.bad = 1;
        if (j.bad)
            break;
        if (strcmp(name, "__metadata__") == 0) {
            metadata(&j);
            continue;
        }
        if (n == cap)
            return -1;
        memset(&e[n], 0, sizeof(e[n]));
        omv_strlcpy(e[n].name, name, sizeof(e[n].name));
        tensor(&j, &e[n]);
        n++;
    } while (!j.bad && eat(&j, ','));
    if (j.bad || !eat(&j, '}'))
        return -1;
    ws(&j);
    return j.p == j.end ? n : -1;
}

__attribute__((format(printf, 2, 3))) static int refuse(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, OMV_SAFETENSORS_ERR_MAX, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* Checks the file's entry for t: dtype, shape and a byte range inside the data. */
static int check_entry(const char *path, const omv_tensor_t *t, const entry_t *e, uint64_t data,
                       char *err)
{
    int same = e->ndim == t->ndim;
    for (uint32_t d = 0; same && d < t->ndim; d++)
        same = e->shape[d] == t->shape[d];
    char want[64] = "", got[64] = "";
    for (uint32_t d = 0; d < t->ndim; d++)
        snprintf(want + strlen(want), sizeof(want) - strlen(want), "%s%llu", d ? "x" : "",
                 (unsigned long long)t->shape[d]);
    for (uint32_t d = 0; d < e->ndim && d < 8; d++)
        snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%llu", d ? "x" : "",
                 (unsigned long long)e->shape[d]);
    const char *dtype = t->is_counter ? "I64" : "F32";
    if (strcmp(e->dtype, dtype) != 0)
        return refuse(err, "%s: tensor '%s' is %s, the model needs %s", path, t->name, e->dtype,
                      dtype);
    if (!same)
        return refuse(err, "%s: tensor '%s' has shape [%s], the model needs [%s]", path, t->name,
                      got, want);
    uint64_t bytes = t->is_counter ? 8 : t->count * 4;
    if (e->end - e->begin != bytes || e->end > data)
        return refuse(err, "%s: tensor '%s': bytes %llu to %llu do not fit its shape or the file",
                      path, t->name, (unsigned long long)e->begin, (unsigned long long)e->end);
    return 0;
}

/* Matches the file's entries to the model's tensors and copies the values in. */
static int take_tensors(const char *path, const omv_model_layout_t *layout, float *params,
                        const entry_t *e, int n, const unsigned char *data, uint64_t data_len,
                        char *err)
{
    omv_tensor_t t[OMV_MODEL_MAX_LAYERS * 5];
    int nt = omv_safetensors_tensors(layout, t, sizeof(t) / sizeof(t[0]));
    if (nt < 0)
        return refuse(err, "%s: the model has too many tensors", path);
    for (int k = 0; k < n; k++) {
        int known = 0;
        for (int i = 0; i < nt && !known; i++)
            known = strcmp(e[k].name, t[i].name) == 0;
        if (!known)
            return refuse(err, "%s: tensor '%s' is not in this model", path, e[k].name);
    }
    for (int i = 0; i < nt; i++) {
        const entry_t *found = NULL;
        for (int k = 0; k < n && !found; k++)
            found = strcmp(e[k].name, t[i].name) == 0 ? &e[k] : NULL;
        if (found == NULL && t[i].is_counter)
            continue; /* optional: only PyTorch reads it */
        if (found == NULL)
            return refuse(err, "%s: tensor '%s' is missing", path, t[i].name);
        int r = check_entry(path, &t[i], found, data_len, err);
        if (r < 0)
            return r;
        if (!t[i].is_counter)
            permute(&t[i], (const float *)(const void *)(data + found->begin), params + t[i].offset,
                    0);
    }
    return 0;
}

int omv_safetensors_read(const char *path, const omv_model_layout_t *layout, float *params,
                         char *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int r = -errno;
        snprintf(err, OMV_SAFETENSORS_ERR_MAX, "cannot open %s: %s", path, strerror(-r));
        return r;
    }
    unsigned char *buf = NULL;
    entry_t *e = NULL;
    uint64_t hlen = 0;
    int r = 0;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    rewind(f);
    if (size < 8 || fread(&hlen, 8, 1, f) != 1 || hlen > OMV_SAFETENSORS_MAX_HEADER ||
        hlen > (uint64_t)size - 8) {
        r = refuse(err, "%s: not a safetensors file (header length %llu for %ld bytes)", path,
                   (unsigned long long)hlen, size);
        goto out;
    }
    /* The data is read whole: parameters are what a model file holds. */
    buf = malloc((size_t)size - 8 + 1);
    int cap = (int)(layout->n_layers * 5 + 16);
    e = calloc((size_t)cap, sizeof(*e));
    if (buf == NULL || e == NULL) {
        r = -ENOMEM;
        snprintf(err, OMV_SAFETENSORS_ERR_MAX, "%s: no memory for %ld bytes", path, size);
        goto out;
    }
    if (fread(buf, 1, (size_t)size - 8, f) != (size_t)size - 8) {
        r = refuse(err, "%s: cannot read it whole", path);
        goto out;
    }
    int n = parse_header((const char *)buf, hlen, e, cap);
    if (n < 0) {
        r = refuse(err,
                   "%s: the JSON header is malformed (or names far more tensors than the "
                   "model has)",
                   path);
        goto out;
    }
    /* The data is aligned for floats when the header length is a multiple of 4 (writers pad
     * to 8); else it is copied to where it is. */
    unsigned char *data = buf + hlen;
    if (hlen % 4 != 0) {
        memmove(buf, data, (size_t)size - 8 - hlen);
        data = buf;
    }
    r = take_tensors(path, layout, params, e, n, data, (uint64_t)size - 8 - hlen, err);
out:
    free(buf);
    free(e);
    fclose(f);
    return r;
}
