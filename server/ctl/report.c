/* The training report's data: reading omnivored's `history --json`, the CSV table, and writing
 * the files. The picture is drawn in report_svg.c. */
#include "report.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define MAX_DEPTH 32

void omv_report_init(omv_report_t *self)
{
    memset(self, 0, sizeof(*self));
    self->test_accuracy = NAN;
    self->wall_s = NAN;
}

void omv_report_fini(omv_report_t *self)
{
    free(self->train);
    free(self->eval);
    free(self->config);
    free(self->phases);
    omv_report_init(self);
}

/* ---- reading JSON ---- */

typedef struct {
    const char *p;
    char *err;
    size_t cap;
    int failed;
} reader_t;

static int fail(reader_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(reader_t *r, const char *fmt, ...)
{
    if (!r->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->cap, fmt, ap);
        va_end(ap);
        r->failed = 1;
    }
    return -EPROTO;
}

static void skip_ws(reader_t *r)
{
    while (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')
        r->p++;
}

/* Consumes c (after white space) when it comes next. */
static int accept(reader_t *r, char c)
{
    skip_ws(r);
    if (*r->p != c)
        return 0;
    r->p++;
    return 1;
}

static int expect(reader_t *r, char c)
{
    return accept(r, c) ? 0 : fail(r, "expected '%c' at \"%.20s\"", c, r->p);
}

static void put_utf8(char *out, size_t cap, size_t *n, unsigned cp)
{
    char b[4];
    size_t k;
    if (cp < 0x80) {
        b[0] = (char)cp, k = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    }
    for (size_t i = 0; i < k && *n + 1 < cap; i++)
        out[(*n)++] = b[i];
}

static int hex4(reader_t *r, unsigned *ret)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(r, "bad \\u escape");
    }
    r->p += 4;
    *ret = v;
    return 0;
}

/* A string into out[cap] (cut to fit; out may be NULL to skip it). */
static int read_string(reader_t *r, char *out, size_t cap)
{
    if (!accept(r, '"'))
        return fail(r, "expected a string at \"%.20s\"", r->p);
    size_t n = 0;
    for (;;) {
        unsigned char c = (unsigned char)*r->p++;
        if (c == '\0' || c < 0x20)
            return fail(r, "unterminated string");
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *r->p++;
            unsigned cp;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                cp = (unsigned char)e;
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u':
                if (hex4(r, &cp) < 0)
                    return -EPROTO;
                if (cp >= 0xD800 && cp < 0xDC00 && r->p[0] == '\\' && r->p[1] == 'u') {
                    unsigned lo;
                    r->p += 2;
                    if (hex4(r, &lo) < 0)
                        return -EPROTO;
                    cp = lo >= 0xDC00 && lo < 0xE000
                             ? 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                             : 0xFFFD;
                } else if (cp >= 0xD800 && cp < 0xE000) {
                    cp = 0xFFFD;
                }
                break;
            default:
                return fail(r, "bad escape '\\%c'", e ? e : '0');
            }
            if (out)
                put_utf8(out, cap, &n, cp);
            continue;
        }
        if (out && n + 1 < cap)
            out[n++] = (char)c;
    }
    if (out && cap)
        out[n] = '\0';
    return 0;
}

/* A JSON number, read the same whatever the C library's locale says a decimal point is. */
static int read_number(reader_t *r, double *ret)
{
    const char *s = r->p;
    size_t n = strspn(s, "+-0123456789.eE");
    char buf[64];
    if (n == 0 || n >= 24)
        return fail(r, "expected a number at \"%.20s\"", s);
    const char *dp = localeconv()->decimal_point;
    size_t dl = dp && *dp ? strlen(dp) : 1, k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.' && dp && strcmp(dp, ".") != 0) {
            memcpy(buf + k, dp, dl);
            k += dl;
        } else {
            buf[k++] = s[i];
        }
    }
    buf[k] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (*end != '\0')
        return fail(r, "bad number \"%.*s\"", (int)n, s);
    r->p += n;
    *ret = v;
    return 0;
}

static int literal(reader_t *r, const char *word)
{
    size_t n = strlen(word);
    if (strncmp(r->p, word, n) != 0)
        return 0;
    r->p += n;
    return 1;
}

/* A number, null (NaN) or a boolean (1 or 0). */
static int read_scalar(reader_t *r, double *ret)
{
    skip_ws(r);
    if (literal(r, "null")) {
        *ret = NAN;
        return 0;
    }
    if (literal(r, "true")) {
        *ret = 1;
        return 0;
    }
    if (literal(r, "false")) {
        *ret = 0;
        return 0;
    }
    return read_number(r, ret);
}

static int skip_value(reader_t *r, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(r, "nested too deeply");
    skip_ws(r);
    if (*r->p == '"')
        return read_string(r, NULL, 0);
    if (accept(r, '{')) {
        if (accept(r, '}'))
            return 0;
        do {
            if (read_string(r, NULL, 0) < 0 || expect(r, ':') < 0 || skip_value(r, depth + 1) < 0)
                return -EPROTO;
        } while (accept(r, ','));
        return expect(r, '}');
    }
    if (accept(r, '[')) {
        if (accept(r, ']'))
            return 0;
        do {
            if (skip_value(r, depth + 1) < 0)
                return -EPROTO;
        } while (accept(r, ','));
        return expect(r, ']');
    }
    double v;
    return read_scalar(r, &v);
}

/* How the keys of a point's object land in its struct. */
typedef enum { F_DOUBLE, F_FLAG, F_TEXT } field_kind_t;
typedef struct {
    const char *key;
    size_t offset;
    field_kind_t kind;
    size_t size; /* F_TEXT */
} field_t;

/* clang-format off */
#define D(type, key, member) {key, offsetof(type, member), F_DOUBLE, 0}
/* clang-format on */
static const field_t train_fields[] = {
    D(omv_report_train_t, "wall_seconds", wall_s),
    D(omv_report_train_t, "epoch", epoch),
    D(omv_report_train_t, "step", step),
    D(omv_report_train_t, "images", images),
    D(omv_report_train_t, "train_loss", train_loss),
    D(omv_report_train_t, "images_per_second", images_per_s),
    D(omv_report_train_t, "groups", groups),
    D(omv_report_train_t, "momentum", momentum),
    D(omv_report_train_t, "learning_rate", learning_rate),
    {"probing", offsetof(omv_report_train_t, probing), F_FLAG, 0},
    {NULL, 0, F_DOUBLE, 0},
};
static const field_t eval_fields[] = {
    D(omv_report_eval_t, "wall_seconds", wall_s),
    D(omv_report_eval_t, "epoch", epoch),
    D(omv_report_eval_t, "test_accuracy", test_accuracy),
    D(omv_report_eval_t, "test_loss", test_loss),
    {NULL, 0, F_DOUBLE, 0},
};
static const field_t change_fields[] = {
    D(omv_report_change_t, "wall_seconds", wall_s),
    D(omv_report_change_t, "epoch", epoch),
    D(omv_report_change_t, "step", step),
    D(omv_report_change_t, "groups", groups),
    D(omv_report_change_t, "momentum", momentum),
    D(omv_report_change_t, "learning_rate", learning_rate),
    {"probing", offsetof(omv_report_change_t, probing), F_FLAG, 0},
    {"cause", offsetof(omv_report_change_t, cause), F_TEXT,
     sizeof(((omv_report_change_t *)0)->cause)},
    {NULL, 0, F_DOUBLE, 0},
};
static const field_t phase_fields[] = {
    D(omv_report_phase_t, "phase", phase),
    D(omv_report_phase_t, "groups", groups),
    D(omv_report_phase_t, "momentum", momentum),
    D(omv_report_phase_t, "learning_rate", learning_rate),
    D(omv_report_phase_t, "epoch", epoch),
    {NULL, 0, F_DOUBLE, 0},
};
#undef D

/* Reads an array of flat objects into a growing array of `size`-byte structs, every double
 * NaN and everything else zero unless the object says otherwise. */
static int read_points(reader_t *r, const field_t *fields, size_t size, void **ret_items,
                       size_t *ret_n)
{
    if (!accept(r, '['))
        return fail(r, "expected an array at \"%.20s\"", r->p);
    char *items = NULL;
    size_t n = 0, cap = 0;
    int rc = -EPROTO;
    if (accept(r, ']'))
        goto done;
    do {
        if (n == OMV_REPORT_MAX_POINTS) {
            fail(r, "more than %u points of one kind", OMV_REPORT_MAX_POINTS);
            goto fail;
        }
        if (n == cap) {
            size_t want = cap ? cap * 2 : 64;
            char *p = realloc(items, want * size);
            if (p == NULL) {
                rc = -ENOMEM;
                fail(r, "out of memory");
                goto fail;
            }
            items = p;
            cap = want;
        }
        char *item = items + n * size;
        memset(item, 0, size);
        for (const field_t *f = fields; f->key; f++)
            if (f->kind == F_DOUBLE)
                *(double *)(item + f->offset) = NAN;
        if (expect(r, '{') < 0)
            goto fail;
        if (!accept(r, '}')) {
            do {
                char key[64];
                if (read_string(r, key, sizeof(key)) < 0 || expect(r, ':') < 0)
                    goto fail;
                const field_t *f = fields;
                while (f->key && strcmp(f->key, key) != 0)
                    f++;
                int ok;
                if (f->key == NULL) {
                    ok = skip_value(r, 1);
                } else if (f->kind == F_TEXT) {
                    ok = read_string(r, item + f->offset, f->size);
                } else {
                    double v;
                    ok = read_scalar(r, &v);
                    if (ok == 0 && f->kind == F_DOUBLE)
                        *(double *)(item + f->offset) = v;
                    else if (ok == 0)
                        *(int *)(item + f->offset) = v != 0 && !isnan(v);
                }
                if (ok < 0)
                    goto fail;
            } while (accept(r, ','));
            if (expect(r, '}') < 0)
                goto fail;
        }
        n++;
    } while (accept(r, ','));
    if (expect(r, ']') < 0)
        goto fail;
done:
    free(*ret_items);
    *ret_items = items;
    *ret_n = n;
    return 0;
fail:
    free(items);
    return rc;
}

int omv_report_parse(omv_report_t *self, const char *json, char *err, size_t cap)
{
    omv_report_fini(self);
    reader_t r = {json, err, cap, 0};
    int rc = -EPROTO;
    if (expect(&r, '{') < 0)
        goto fail;
    if (!accept(&r, '}')) {
        do {
            char key[64];
            if (read_string(&r, key, sizeof(key)) < 0 || expect(&r, ':') < 0)
                goto fail;
            int ok;
            skip_ws(&r);
            if (strcmp(key, "job") == 0) {
                ok = read_string(&r, self->job, sizeof(self->job));
            } else if (strcmp(key, "state") == 0) {
                ok = read_string(&r, self->state, sizeof(self->state));
            } else if (strcmp(key, "test_accuracy") == 0) {
                ok = read_scalar(&r, &self->test_accuracy);
            } else if (strcmp(key, "wall_seconds") == 0) {
                ok = read_scalar(&r, &self->wall_s);
            } else if (strcmp(key, "train") == 0) {
                ok = read_points(&r, train_fields, sizeof(*self->train), (void **)&self->train,
                                 &self->n_train);
            } else if (strcmp(key, "eval") == 0) {
                ok = read_points(&r, eval_fields, sizeof(*self->eval), (void **)&self->eval,
                                 &self->n_eval);
            } else if (strcmp(key, "config") == 0) {
                ok = read_points(&r, change_fields, sizeof(*self->config), (void **)&self->config,
                                 &self->n_config);
            } else if (strcmp(key, "phases") == 0) {
                ok = read_points(&r, phase_fields, sizeof(*self->phases), (void **)&self->phases,
                                 &self->n_phases);
            } else {
                ok = skip_value(&r, 1);
            }
            if (ok < 0) {
                rc = ok;
                goto fail;
            }
        } while (accept(&r, ','));
        if (expect(&r, '}') < 0)
            goto fail;
    }
    skip_ws(&r);
    if (*r.p != '\0') {
        fail(&r, "text after the object: \"%.20s\"", r.p);
        goto fail;
    }
    return 0;
fail:
    omv_report_fini(self);
    return rc;
}

/* ---- CSV ---- */

/* A number in out[32], the same in every locale: integers without a point, others with six
 * significant digits; empty for NaN. */
static const char *fmt_num(char out[32], double v)
{
    if (!isfinite(v)) {
        out[0] = '\0';
        return out;
    }
    if (v == trunc(v) && fabs(v) < 1e15) {
        snprintf(out, 32, "%.0f", v);
        return out;
    }
    snprintf(out, 32, "%.6g", v);
    const char *dp = localeconv()->decimal_point;
    if (dp && strcmp(dp, ".") != 0) {
        char *at = strstr(out, dp);
        if (at) {
            size_t dl = strlen(dp);
            *at = '.';
            memmove(at + 1, at + dl, strlen(at + dl) + 1);
        }
    }
    return out;
}

/* A CSV field: quoted when it holds a comma, a quote or a line break. */
static void csv_text(omv_strbuf_t *out, const char *s)
{
    if (strpbrk(s, ",\"\r\n") == NULL) {
        omv_strbuf_append(out, s, strlen(s));
        return;
    }
    omv_strbuf_append(out, "\"", 1);
    for (; *s; s++) {
        if (*s == '"')
            omv_strbuf_append(out, "\"\"", 2);
        else
            omv_strbuf_append(out, s, 1);
    }
    omv_strbuf_append(out, "\"", 1);
}

static void csv_nums(omv_strbuf_t *out, const double *v, size_t n)
{
    char b[32];
    for (size_t i = 0; i < n; i++)
        omv_strbuf_printf(out, ",%s", fmt_num(b, v[i]));
}

/* The wall_s of each list's next row; lists run in time order, so their merge does too (a list
 * out of order still has every row written). */
static double next_wall(double w)
{
    return isnan(w) ? -INFINITY : w;
}

void omv_report_csv(const omv_report_t *self, omv_strbuf_t *out)
{
    omv_strbuf_printf(out, "kind,wall_s,epoch,step,images,train_loss,images_per_s,test_loss,"
                           "test_accuracy,groups,momentum,learning_rate,probing,cause\n");
    size_t t = 0, e = 0, c = 0;
    while (t < self->n_train || e < self->n_eval || c < self->n_config) {
        double wt = t < self->n_train ? next_wall(self->train[t].wall_s) : INFINITY;
        double we = e < self->n_eval ? next_wall(self->eval[e].wall_s) : INFINITY;
        double wc = c < self->n_config ? next_wall(self->config[c].wall_s) : INFINITY;
        /* At equal times: the configuration first, then the training point, then the eval. */
        if (c < self->n_config && wc <= wt && wc <= we) {
            const omv_report_change_t *p = &self->config[c++];
            double v[] = {p->wall_s, p->epoch,    p->step,         NAN, NAN, NAN, NAN, NAN,
                          p->groups, p->momentum, p->learning_rate};
            omv_strbuf_append(out, "config", 6);
            csv_nums(out, v, OMV_ARRAY_SIZE(v));
            omv_strbuf_printf(out, ",%d,", p->probing);
            csv_text(out, p->cause);
        } else if (t < self->n_train && wt <= we) {
            const omv_report_train_t *p = &self->train[t++];
            double v[] = {p->wall_s,       p->epoch, p->step, p->images, p->train_loss,
                          p->images_per_s, NAN,      NAN,     p->groups, p->momentum,
                          p->learning_rate};
            omv_strbuf_append(out, "train", 5);
            csv_nums(out, v, OMV_ARRAY_SIZE(v));
            omv_strbuf_printf(out, ",%d,", p->probing);
        } else {
            const omv_report_eval_t *p = &self->eval[e++];
            double v[] = {p->wall_s,    p->epoch,         NAN, NAN, NAN, NAN,
                          p->test_loss, p->test_accuracy, NAN, NAN, NAN};
            omv_strbuf_append(out, "eval", 4);
            csv_nums(out, v, OMV_ARRAY_SIZE(v));
            omv_strbuf_append(out, ",,", 2);
        }
        omv_strbuf_append(out, "\n", 1);
    }
}

/* ---- files ---- */

void omv_report_default_base(const char *job, char *out, size_t cap)
{
    snprintf(out, cap, "omnivore-report-%s", job && *job ? job : "job");
    for (char *p = out + strlen("omnivore-report-"); p < out + strlen(out); p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            *p = '_';
}

/* Makes dir and the folders above it that are missing. */
static int make_dirs(const char *dir)
{
    char path[4096];
    if (omv_strlcpy(path, dir, sizeof(path)) < 0)
        return -ENAMETOOLONG;
    if (path[0] == '\0')
        return 0;
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char was = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return -errno;
        *p = was;
        if (was == '\0')
            break;
    }
    return 0;
}

static int write_file(const char *path, const omv_strbuf_t *text, char *err, size_t errcap)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        int r = -errno;
        snprintf(err, errcap, "cannot write %s: %s", tmp, strerror(-r));
        return r;
    }
    size_t n = fwrite(omv_strbuf_str(text), 1, text->len, f);
    int bad = n != text->len || fflush(f) != 0 || ferror(f);
    int r = bad ? -(errno ? errno : EIO) : 0;
    if (fclose(f) != 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) != 0)
        r = -errno;
    if (r < 0) {
        snprintf(err, errcap, "cannot write %s: %s", path, strerror(-r));
        unlink(tmp);
    }
    return r;
}

int omv_report_write(const omv_report_t *self, const char *dir, const char *base, char *ret_csv,
                     char *ret_svg, size_t cap, char *err, size_t errcap)
{
    char csv_path[4096], svg_path[4096];
    if (dir == NULL || dir[0] == '\0')
        dir = ".";
    if (base[0] == '\0' || strchr(base, '/')) {
        snprintf(err, errcap, "'%s' is not a file name (no folders: give them with --out)", base);
        return -EINVAL;
    }
    if ((size_t)snprintf(csv_path, sizeof(csv_path), "%s/%s.csv", dir, base) >= sizeof(csv_path) ||
        (size_t)snprintf(svg_path, sizeof(svg_path), "%s/%s.svg", dir, base) >= sizeof(svg_path)) {
        snprintf(err, errcap, "the path %s/%s is too long", dir, base);
        return -ENAMETOOLONG;
    }
    int r = make_dirs(dir);
    if (r < 0) {
        snprintf(err, errcap, "cannot make the folder %s: %s", dir, strerror(-r));
        return r;
    }
    omv_strbuf_t text;
    omv_strbuf_init(&text);
    omv_report_csv(self, &text);
    r = text.failed ? -ENOMEM : write_file(csv_path, &text, err, errcap);
    if (r == 0) {
        omv_strbuf_clear(&text);
        omv_report_svg(self, &text);
        r = text.failed ? -ENOMEM : write_file(svg_path, &text, err, errcap);
    }
    if (r == -ENOMEM)
        snprintf(err, errcap, "out of memory for the report");
    omv_strbuf_fini(&text);
    if (r < 0)
        return r;
    omv_strlcpy(ret_csv, csv_path, cap);
    omv_strlcpy(ret_svg, svg_path, cap);
    return 0;
}
