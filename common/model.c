/* Model definitions: the one-layer-per-line parser, shape checks, parameter layout,
 * initialisation, the summary table and sharding. */
#include "model.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rng.h"

static const char *const kind_names[] = {
    [OMV_LAYER_FC] = "fc",
    [OMV_LAYER_CONV] = "conv",
    [OMV_LAYER_MAXPOOL] = "maxpool",
    [OMV_LAYER_AVGPOOL] = "avgpool",
    [OMV_LAYER_RELU] = "relu",
    [OMV_LAYER_DROPOUT] = "dropout",
    [OMV_LAYER_FLATTEN] = "flatten",
    [OMV_LAYER_GLOBALAVGPOOL] = "globalavgpool",
    [OMV_LAYER_BATCHNORM] = "batchnorm",
    [OMV_LAYER_SAVE] = "save",
    [OMV_LAYER_ADD] = "add",
};

const char *omv_model_layer_name(omv_layer_kind_t kind)
{
    return kind_names[kind];
}

/* The parser's state: where it is, for messages. */
typedef struct {
    const char *name;
    int line;
    char *err;
} ctx_t;

__attribute__((format(printf, 2, 3))) static int fail(ctx_t *c, const char *fmt, ...)
{
    char what[OMV_CONFIG_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(c->err, OMV_CONFIG_ERR_MAX, "%s:%d: %s", c->name, c->line, what);
    return -EINVAL;
}

/* Splits a line into words in place; returns their count (at most cap). */
static int split(char *line, char **words, int cap)
{
    int n = 0;
    char *p = line;
    while (*p) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0')
            break;
        if (n == cap)
            return cap + 1;
        words[n++] = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        if (*p)
            *p++ = '\0';
    }
    return n;
}

/* A positive integer no larger than max. */
static int parse_uint(ctx_t *c, const char *word, const char *what, uint32_t max, uint32_t *ret)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(word, &end, 10);
    if (end == word || *end != '\0' || errno || v < 1 || v > max || word[0] == '-')
        return fail(c, "%s '%s' is not an integer in [1, %u]", what, word, max);
    *ret = (uint32_t)v;
    return 0;
}

/* "5" or "5x3": rows x cols. */
static int parse_window(ctx_t *c, const char *word, uint32_t *ret_h, uint32_t *ret_w)
{
    char buf[64];
    if (strlen(word) >= sizeof(buf))
        return fail(c, "window '%s' is too long", word);
    strcpy(buf, word);
    char *x = strchr(buf, 'x');
    if (x == NULL) {
        if (parse_uint(c, buf, "window", OMV_MODEL_MAX_DIM, ret_h) < 0)
            return -EINVAL;
        *ret_w = *ret_h;
        return 0;
    }
    *x = '\0';
    if (parse_uint(c, buf, "window height", OMV_MODEL_MAX_DIM, ret_h) < 0 ||
        parse_uint(c, x + 1, "window width", OMV_MODEL_MAX_DIM, ret_w) < 0)
        return -EINVAL;
    return 0;
}

/* "1x28x28" (channels x height x width) or "784" (a vector). */
static int parse_input(ctx_t *c, const char *word, omv_shape_t *ret)
{
    char buf[64];
    char *parts[3];
    int n = 0;
    if (strlen(word) >= sizeof(buf))
        return fail(c, "input shape '%s' is too long", word);
    strcpy(buf, word);
    for (char *p = buf; n < 3;) {
        parts[n++] = p;
        p = strchr(p, 'x');
        if (p == NULL)
            break;
        *p++ = '\0';
        if (n == 3)
            return fail(c, "input shape '%s' has more than 3 dimensions (CxHxW)", word);
    }
    if (n == 2)
        return fail(c, "input shape '%s' needs channels x height x width, or one size", word);
    uint32_t d[3] = {1, 1, 1};
    for (int i = 0; i < n; i++)
        if (parse_uint(c, parts[i], "input dimension", OMV_MODEL_MAX_DIM, &d[i]) < 0)
            return -EINVAL;
    *ret = (omv_shape_t){d[0], d[1], d[2]};
    if (omv_shape_size(*ret) > OMV_MODEL_MAX_ACTIVATION)
        return fail(c, "input of %zu values per image is over the limit of %u",
                    omv_shape_size(*ret), OMV_MODEL_MAX_ACTIVATION);
    return 0;
}

/* Reads "key value" option pairs after the fixed words of a conv or pooling line. */
static int parse_options(ctx_t *c, char **words, int n, omv_model_layer_t *l, int allow_pad)
{
    for (int i = 0; i < n; i += 2) {
        if (i + 1 >= n)
            return fail(c, "'%s' needs a value", words[i]);
        if (strcmp(words[i], "stride") == 0) {
            if (parse_uint(c, words[i + 1], "stride", OMV_MODEL_MAX_DIM, &l->stride) < 0)
                return -EINVAL;
        } else if (allow_pad && strcmp(words[i], "pad") == 0) {
            if (strcmp(words[i + 1], "0") == 0)
                l->pad = 0;
            else if (parse_uint(c, words[i + 1], "pad", OMV_MODEL_MAX_DIM, &l->pad) < 0)
                return -EINVAL;
        } else {
            return fail(c, "unknown option '%s' (expected %s)", words[i],
                        allow_pad ? "stride or pad" : "stride");
        }
    }
    return 0;
}

/* Output size of a window sliding over n values; 0 when the window does not fit. */
static uint32_t slide(uint32_t n, uint32_t k, uint32_t stride, uint32_t pad)
{
    uint64_t span = (uint64_t)n + 2ull * pad;
    return span < k ? 0 : (uint32_t)((span - k) / stride + 1);
}

static int shape_text(omv_shape_t s, char *buf, size_t cap)
{
    if (s.h == 1 && s.w == 1)
        return snprintf(buf, cap, "%u", s.c);
    return snprintf(buf, cap, "%ux%ux%u", s.c, s.h, s.w);
}

/* An add whose saved shape differs from its input: a 1x1 convolution with the one stride that
 * brings the saved height and width to the input's. */
static int projection(ctx_t *c, omv_model_layer_t *l)
{
    char from[64], to[64];
    shape_text(l->skip, from, sizeof(from));
    shape_text(l->in, to, sizeof(to));
    for (uint32_t st = 1; st <= l->skip.h && st <= l->skip.w; st++) {
        if (slide(l->skip.h, 1, st, 0) == l->in.h && slide(l->skip.w, 1, st, 0) == l->in.w) {
            l->proj_stride = st;
            l->fan_in = l->skip.c;
            l->w_count = (size_t)l->skip.c * l->in.c;
            l->b_count = l->in.c;
            return 0;
        }
    }
    return fail(c,
                "add %s: the output saved as '%s' is %s, which no 1x1 projection with a stride "
                "turns into this layer's input %s",
                l->name, l->name, from, to);
}

/* Fills in the output shape and parameter counts of l from its input shape. */
static int chain(ctx_t *c, omv_model_layer_t *l)
{
    omv_shape_t in = l->in;
    char shape[64];
    shape_text(in, shape, sizeof(shape));
    switch (l->kind) {
    case OMV_LAYER_FC:
        l->fan_in = (uint32_t)omv_shape_size(in);
        l->out = (omv_shape_t){l->units, 1, 1};
        l->w_count = (size_t)l->fan_in * l->units;
        l->b_count = l->units;
        break;
    case OMV_LAYER_CONV: {
        uint32_t oh = slide(in.h, l->kh, l->stride, l->pad);
        uint32_t ow = slide(in.w, l->kw, l->stride, l->pad);
        if (oh == 0 || ow == 0)
            return fail(c, "a %ux%u kernel with pad %u does not fit the input %s", l->kh, l->kw,
                        l->pad, shape);
        if (l->pad >= l->kh || l->pad >= l->kw)
            return fail(c, "pad %u must be smaller than the %ux%u kernel", l->pad, l->kh, l->kw);
        l->fan_in = in.c * l->kh * l->kw;
        l->out = (omv_shape_t){l->units, oh, ow};
        l->w_count = (size_t)l->fan_in * l->units;
        l->b_count = l->units;
        break;
    }
    case OMV_LAYER_MAXPOOL:
    case OMV_LAYER_AVGPOOL: {
        uint32_t oh = slide(in.h, l->kh, l->stride, 0);
        uint32_t ow = slide(in.w, l->kw, l->stride, 0);
        if (oh == 0 || ow == 0)
            return fail(c, "a %ux%u window does not fit the input %s", l->kh, l->kw, shape);
        l->out = (omv_shape_t){in.c, oh, ow};
        break;
    }
    case OMV_LAYER_FLATTEN:
        l->out = (omv_shape_t){(uint32_t)omv_shape_size(in), 1, 1};
        break;
    case OMV_LAYER_GLOBALAVGPOOL:
        l->out = (omv_shape_t){in.c, 1, 1};
        break;
    case OMV_LAYER_BATCHNORM:
        l->out = in;
        l->w_count = l->b_count = in.c;
        l->s_count = 2 * (size_t)in.c;
        break;
    case OMV_LAYER_ADD:
        l->out = in;
        if (l->skip.c != in.c || l->skip.h != in.h || l->skip.w != in.w)
            return projection(c, l);
        break;
    case OMV_LAYER_RELU:
    case OMV_LAYER_DROPOUT:
    case OMV_LAYER_SAVE:
        l->out = in;
        break;
    }
    if (omv_shape_size(l->out) > OMV_MODEL_MAX_ACTIVATION)
        return fail(c, "output of %zu values per image is over the limit of %u",
                    omv_shape_size(l->out), OMV_MODEL_MAX_ACTIVATION);
    return 0;
}

/* "save NAME" or "add NAME": the name, and for add the save it refers to (among the n layers
 * of m before it), used once. */
static int parse_link(ctx_t *c, char **w, int n, const omv_model_layout_t *m, omv_model_layer_t *l)
{
    const char *k = w[0];
    l->kind = k[0] == 's' ? OMV_LAYER_SAVE : OMV_LAYER_ADD;
    if (n != 2 || strlen(w[1]) >= OMV_MODEL_NAME_MAX)
        return fail(c, "expected '%s NAME' with a name of 1 to %d characters, e.g. %s a", k,
                    OMV_MODEL_NAME_MAX - 1, k);
    strcpy(l->name, w[1]);
    int found = -1;
    for (uint32_t i = 0; i < m->n_layers; i++) {
        const omv_model_layer_t *o = &m->layers[i];
        if (strcmp(o->name, l->name) != 0)
            continue;
        if (l->kind == OMV_LAYER_SAVE && o->kind == OMV_LAYER_SAVE)
            return fail(c, "'save %s' again: line %d saved that name already", l->name, o->line);
        if (l->kind == OMV_LAYER_ADD && o->kind == OMV_LAYER_ADD)
            return fail(c, "'add %s' again: line %d added it already", l->name, o->line);
        if (o->kind == OMV_LAYER_SAVE)
            found = (int)i;
    }
    if (l->kind == OMV_LAYER_ADD) {
        if (found < 0)
            return fail(c, "add %s: no 'save %s' on an earlier line", l->name, l->name);
        l->ref = (uint32_t)found;
        l->skip = m->layers[found].out;
    }
    return 0;
}

/* Parses one layer line (already split) into l, whose input shape is set; m holds the layers
 * before it. */
static int parse_layer(ctx_t *c, char **w, int n, const omv_model_layout_t *m, omv_model_layer_t *l)
{
    const char *k = w[0];
    if (strcmp(k, "save") == 0 || strcmp(k, "add") == 0) {
        if (parse_link(c, w, n, m, l) < 0)
            return -EINVAL;
    } else if (strcmp(k, "globalavgpool") == 0 || strcmp(k, "batchnorm") == 0) {
        l->kind = k[0] == 'g' ? OMV_LAYER_GLOBALAVGPOOL : OMV_LAYER_BATCHNORM;
        if (n != 1)
            return fail(c, "'%s' takes no arguments", k);
    } else if (strcmp(k, "fc") == 0) {
        l->kind = OMV_LAYER_FC;
        if (n != 2)
            return fail(c, "expected 'fc OUTPUTS', e.g. fc 256");
        if (parse_uint(c, w[1], "outputs", 1u << 24, &l->units) < 0)
            return -EINVAL;
    } else if (strcmp(k, "conv") == 0) {
        l->kind = OMV_LAYER_CONV;
        if (n < 3)
            return fail(c,
                        "expected 'conv CHANNELS KxK [stride S] [pad P]', e.g. conv 32 5x5 pad 2");
        if (parse_uint(c, w[1], "channels", 1u << 16, &l->units) < 0 ||
            parse_window(c, w[2], &l->kh, &l->kw) < 0)
            return -EINVAL;
        l->stride = 1;
        if (parse_options(c, w + 3, n - 3, l, 1) < 0)
            return -EINVAL;
    } else if (strcmp(k, "maxpool") == 0 || strcmp(k, "avgpool") == 0) {
        l->kind = k[0] == 'm' ? OMV_LAYER_MAXPOOL : OMV_LAYER_AVGPOOL;
        if (n < 2)
            return fail(c, "expected '%s K [stride S]', e.g. %s 2", k, k);
        if (parse_window(c, w[1], &l->kh, &l->kw) < 0)
            return -EINVAL;
        l->stride = l->kh == l->kw ? l->kh : 0;
        if (parse_options(c, w + 2, n - 2, l, 0) < 0)
            return -EINVAL;
        if (l->stride == 0)
            return fail(c, "a %ux%u window needs an explicit stride", l->kh, l->kw);
    } else if (strcmp(k, "relu") == 0 || strcmp(k, "flatten") == 0) {
        l->kind = k[0] == 'r' ? OMV_LAYER_RELU : OMV_LAYER_FLATTEN;
        if (n != 1)
            return fail(c, "'%s' takes no arguments", k);
    } else if (strcmp(k, "dropout") == 0) {
        l->kind = OMV_LAYER_DROPOUT;
        char *end;
        double p = n == 2 ? strtod(w[1], &end) : -1.0;
        if (n != 2 || *end != '\0' || !(p >= 0.0 && p < 1.0))
            return fail(c, "expected 'dropout P' with P in [0, 1), e.g. dropout 0.5");
        l->rate = (float)p;
    } else {
        return fail(c,
                    "unknown layer '%s' (expected conv, maxpool, avgpool, globalavgpool, relu, "
                    "batchnorm, dropout, flatten, save, add, fc or softmax)",
                    k);
    }
    return chain(c, l);
}

/* Every save is added back somewhere (else the name is a slip). */
static int check_links(ctx_t *c, const omv_model_layout_t *m)
{
    for (uint32_t i = 0; i < m->n_layers; i++) {
        const omv_model_layer_t *l = &m->layers[i];
        if (l->kind != OMV_LAYER_SAVE)
            continue;
        int added = 0;
        for (uint32_t j = i + 1; j < m->n_layers; j++)
            added |= m->layers[j].kind == OMV_LAYER_ADD && m->layers[j].ref == i;
        if (!added) {
            c->line = l->line;
            return fail(c, "'save %s' is never added back (expected a later 'add %s')", l->name,
                        l->name);
        }
    }
    return 0;
}

int omv_model_parse(omv_model_layout_t *ret, const char *text, const char *name, char *err)
{
    omv_model_layout_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: out of memory", name);
        return -ENOMEM;
    }
    ctx_t c = {name, 0, err};
    int r = 0, have_input = 0, have_softmax = 0, last_line = 0;
    size_t offset = 0;
    const char *p = text;
    while (*p && r == 0) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[256];
        char *words[12];
        c.line++;
        if (len >= sizeof(line)) {
            r = fail(&c, "line is longer than %zu characters", sizeof(line) - 1);
            break;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (eol != NULL);
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        int n = split(line, words, 11);
        if (n == 0)
            continue;
        if (n > 11) {
            r = fail(&c, "too many words");
            break;
        }
        for (char *q = words[0]; *q; q++)
            *q = (char)tolower((unsigned char)*q);
        last_line = c.line;
        if (have_softmax) {
            r = fail(&c, "nothing may follow softmax: it is the loss at the end");
        } else if (strcmp(words[0], "input") == 0) {
            if (have_input)
                r = fail(&c, "a second input line");
            else if (n != 2)
                r = fail(&c, "expected 'input CxHxW', e.g. input 1x28x28");
            else
                r = parse_input(&c, words[1], &m->input);
            have_input = 1;
        } else if (!have_input) {
            r = fail(&c, "the first line must be 'input CxHxW', e.g. input 1x28x28");
        } else if (strcmp(words[0], "softmax") == 0) {
            if (n != 1)
                r = fail(&c, "'softmax' takes no arguments");
            have_softmax = 1;
        } else if (m->n_layers == OMV_MODEL_MAX_LAYERS) {
            r = fail(&c, "more than %d layers", OMV_MODEL_MAX_LAYERS);
        } else {
            omv_model_layer_t *l = &m->layers[m->n_layers];
            l->line = c.line;
            l->in = m->n_layers ? m->layers[m->n_layers - 1].out : m->input;
            r = parse_layer(&c, words, n, m, l);
            if (r == 0) {
                l->w_offset = offset;
                l->b_offset = offset + l->w_count;
                offset += l->w_count + l->b_count;
                if (offset > OMV_MODEL_MAX_PARAMS)
                    r = fail(&c, "the model has more than %u parameters", OMV_MODEL_MAX_PARAMS);
                m->n_layers++;
            }
        }
    }
    if (r == 0) {
        c.line = last_line;
        if (!have_input)
            r = fail(&c, "empty model: expected 'input CxHxW' and layers, one per line");
        else if (m->n_layers == 0 || m->layers[m->n_layers - 1].kind != OMV_LAYER_FC)
            r = fail(&c, "the last layer must be 'fc CLASSES': its outputs feed the softmax");
        else if (m->layers[m->n_layers - 1].units < 2)
            r = fail(&c, "the output needs at least 2 classes");
    }
    if (r == 0)
        r = check_links(&c, m);
    if (r == 0) {
        m->state_offset = offset;
        for (uint32_t i = 0; i < m->n_layers; i++) {
            m->layers[i].s_offset = offset;
            offset += m->layers[i].s_count;
        }
        if (offset > OMV_MODEL_MAX_PARAMS)
            r = fail(&c, "the model has more than %u parameters", OMV_MODEL_MAX_PARAMS);
    }
    if (r == 0) {
        m->param_count = offset;
        m->inputs = (uint32_t)omv_shape_size(m->input);
        m->classes = m->layers[m->n_layers - 1].units;
        *ret = *m;
    }
    free(m);
    return r;
}

int omv_model_mlp_text(const uint32_t *widths, uint32_t n, char *buf, size_t cap)
{
    size_t at = 0;
    int w = snprintf(buf, cap, "input %u\n", n ? widths[0] : 0);
    for (uint32_t i = 1; w >= 0 && (size_t)w < cap - at && i < n; i++) {
        at += (size_t)w;
        w = snprintf(buf + at, cap - at, i + 1 < n ? "fc %u\nrelu\n" : "fc %u\n", widths[i]);
    }
    return w < 0 || (size_t)w >= cap - at ? -ENOSPC : 0;
}

int omv_model_layout(omv_model_layout_t *ret, const uint32_t *widths, uint32_t n)
{
    char text[OMV_JOB_MAX_LAYERS * 24], err[OMV_CONFIG_ERR_MAX];
    if (n < 2 || n > OMV_JOB_MAX_LAYERS)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (widths[i] == 0)
            return -EINVAL;
    if (omv_model_mlp_text(widths, n, text, sizeof(text)) < 0)
        return -EINVAL;
    return omv_model_parse(ret, text, "layers", err) < 0 ? -EINVAL : 0;
}

/* Whether the layer after i that decides the gain is a ReLU (pooling and dropout pass it on). */
static int feeds_relu(const omv_model_layout_t *self, uint32_t i)
{
    for (uint32_t j = i + 1; j < self->n_layers; j++) {
        omv_layer_kind_t k = self->layers[j].kind;
        if (k == OMV_LAYER_RELU)
            return 1;
        if (k == OMV_LAYER_FC || k == OMV_LAYER_CONV)
            return 0;
    }
    return 0;
}

void omv_model_init(const omv_model_layout_t *self, float *params, uint64_t seed)
{
    omv_rng_t rng;
    omv_rng_init(&rng, seed);
    for (uint32_t i = 0; i < self->n_layers; i++) {
        const omv_model_layer_t *l = &self->layers[i];
        if (l->kind == OMV_LAYER_BATCHNORM) {
            for (size_t j = 0; j < l->w_count; j++) {
                params[l->w_offset + j] = 1.0f;              /* weight */
                params[l->b_offset + j] = 0.0f;              /* bias */
                params[l->s_offset + j] = 0.0f;              /* running mean */
                params[l->s_offset + l->w_count + j] = 1.0f; /* running variance */
            }
            continue;
        }
        if (l->w_count == 0)
            continue;
        float std = sqrtf((feeds_relu(self, i) ? 2.0f : 1.0f) / (float)l->fan_in);
        float *w = params + l->w_offset;
        for (size_t j = 0; j < l->w_count; j++)
            w[j] = (float)omv_rng_normal(&rng) * std;
        memset(params + l->b_offset, 0, l->b_count * sizeof(float));
    }
}

void omv_model_summary(const omv_model_layout_t *self, char *buf, size_t cap)
{
    size_t at = 0;
    char shape[64], what[64];
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(buf + at, cap - at, __VA_ARGS__);                                        \
        if (w_ < 0 || (size_t)w_ >= cap - at)                                                      \
            return;                                                                                \
        at += (size_t)w_;                                                                          \
    } while (0)
    if (cap == 0)
        return;
    buf[0] = '\0';
    shape_text(self->input, shape, sizeof(shape));
    PUT("%-3s %-24s %-12s %12s\n", "#", "layer", "output", "parameters");
    PUT("%-3s %-24s %-12s %12s\n", "", "input", shape, "0");
    for (uint32_t i = 0; i < self->n_layers; i++) {
        const omv_model_layer_t *l = &self->layers[i];
        const char *name = omv_model_layer_name(l->kind);
        switch (l->kind) {
        case OMV_LAYER_FC:
            snprintf(what, sizeof(what), "fc %u", l->units);
            break;
        case OMV_LAYER_CONV:
            snprintf(what, sizeof(what), "conv %u %ux%u s%u p%u", l->units, l->kh, l->kw, l->stride,
                     l->pad);
            break;
        case OMV_LAYER_MAXPOOL:
        case OMV_LAYER_AVGPOOL:
            snprintf(what, sizeof(what), "%s %ux%u s%u", name, l->kh, l->kw, l->stride);
            break;
        case OMV_LAYER_DROPOUT:
            snprintf(what, sizeof(what), "dropout %.2f", (double)l->rate);
            break;
        case OMV_LAYER_SAVE:
            snprintf(what, sizeof(what), "save %s", l->name);
            break;
        case OMV_LAYER_ADD:
            if (l->w_count)
                snprintf(what, sizeof(what), "add %s (1x1 s%u)", l->name, l->proj_stride);
            else
                snprintf(what, sizeof(what), "add %s", l->name);
            break;
        default:
            snprintf(what, sizeof(what), "%s", name);
            break;
        }
        shape_text(l->out, shape, sizeof(shape));
        PUT("%-3u %-24s %-12s %12zu\n", i + 1, what, shape, l->w_count + l->b_count + l->s_count);
    }
    PUT("%-3s %-24s %-12s %12zu\n", "", "total (softmax loss)", "", self->param_count);
#undef PUT
}

void omv_model_shard_offsets(size_t count, uint32_t n_shards, uint32_t *offsets)
{
    for (uint32_t i = 0; i <= n_shards; i++)
        offsets[i] = (uint32_t)(count * i / n_shards);
}

/* Appends to cuts[*n] the ends of the pieces layer l splits into: about target parameters each,
 * cut between rows of its weights (one output's inputs), the biases with the last piece. */
static void layer_pieces(const omv_model_layer_t *l, size_t target, size_t *cuts, uint32_t *n,
                         uint32_t cap)
{
    size_t size = l->w_count + l->b_count, end = l->b_offset + l->b_count;
    size_t k = (size + target / 2) / target, row = l->units ? l->w_count / l->units : 1;
    if (k == 0 || size / k > target + target / 4)
        k++;
    for (size_t j = 1; j < k && *n < cap; j++) {
        size_t at = l->w_offset + (j * l->w_count / k) / row * row;
        if (at > (*n ? cuts[*n - 1] : 0) && at < l->w_offset + l->w_count)
            cuts[(*n)++] = at;
    }
    if (*n < cap)
        cuts[(*n)++] = end;
}

uint32_t omv_model_shard_layout(const omv_model_layout_t *self, uint32_t n_shards,
                                uint32_t *offsets)
{
    size_t total = self->param_count;
    if (n_shards > OMV_MODEL_MAX_SHARDS)
        n_shards = OMV_MODEL_MAX_SHARDS;
    if (n_shards <= 1 || total < n_shards) {
        n_shards = total < n_shards ? (uint32_t)total : n_shards;
        omv_model_shard_offsets(total, n_shards ? n_shards : 1, offsets);
        return n_shards ? n_shards : 1;
    }
    size_t target = (total + n_shards - 1) / n_shards;
    size_t cuts[OMV_MODEL_MAX_SHARDS * 2];
    uint32_t n_cuts = 0;
    for (uint32_t i = 0; i < self->n_layers; i++)
        if (self->layers[i].w_count + self->layers[i].b_count > 0)
            layer_pieces(&self->layers[i], target, cuts, &n_cuts, OMV_MODEL_MAX_SHARDS * 2);
    /* Pieces (whole small layers, parts of large ones) join while a shard stays within a
     * quarter over the target. */
    uint32_t n = 0;
    offsets[0] = 0;
    for (uint32_t c = 0; c < n_cuts; c++) {
        int last = c + 1 == n_cuts;
        if (last ||
            (cuts[c + 1] - offsets[n] > target + target / 4 && n + 1 < OMV_MODEL_MAX_SHARDS))
            offsets[++n] = (uint32_t)cuts[c];
    }
    offsets[n] = (uint32_t)total;
    return n;
}

/* How far boundary at is from goal, in parameters. */
static uint64_t distance(uint64_t at, uint64_t goal)
{
    return at > goal ? at - goal : goal - at;
}

void omv_model_shard_ranges(const uint32_t *offsets, uint32_t n_shards, uint32_t n, uint32_t *ends)
{
    uint64_t total = offsets[n_shards];
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t goal = total * (i + 1) / n;
        uint32_t left = n - 1 - i; /* holders after this one, a shard each */
        uint32_t last = n_shards > left ? n_shards - left : 0, end = at + 1;
        if (end > n_shards)
            end = n_shards; /* more holders than shards (the caller refuses it): empty ranges */
        while (end < last && distance(offsets[end + 1], goal) < distance(offsets[end], goal))
            end++;
        ends[i] = i == n - 1 ? n_shards : end;
        at = ends[i];
    }
}
