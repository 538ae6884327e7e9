/* Declarative INI configuration through inih: typed fields, ranges, file:line errors. */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

static const omv_config_entry_t *find(const omv_config_entry_t *table, size_t n,
                                      const char *section, const char *key, size_t *ret_index)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(table[i].section, section) == 0 && strcmp(table[i].key, key) == 0) {
            *ret_index = i;
            return &table[i];
        }
    }
    return NULL;
}

static int parse_bool(const char *v, int *ret)
{
    static const char *const yes[] = {"1", "yes", "true", "on"};
    static const char *const no[] = {"0", "no", "false", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *ret = 1;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *ret = 0;
            return 0;
        }
    }
    return -EINVAL;
}

static int set_entry(const omv_config_entry_t *e, void *target, const char *value, char *err)
{
    char *field = (char *)target + e->offset;
    char *end = NULL;
    switch (e->type) {
    case OMV_CONFIG_INT: {
        if ((e->flags & OMV_CONFIG_NONE_IS_NEG) && strcasecmp(value, "none") == 0) {
            *(int64_t *)field = -1;
            return 0;
        }
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end != '\0') {
            snprintf(err, OMV_CONFIG_ERR_MAX, "'%s' is not an integer", value);
            return -EINVAL;
        }
        int none_ok = (e->flags & OMV_CONFIG_NONE_IS_NEG) && v == -1;
        if (!none_ok && ((double)v < e->min || (double)v > e->max)) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%lld is out of range [%.0f, %.0f]", v, e->min,
                     e->max);
            return -EINVAL;
        }
        *(int64_t *)field = v;
        return 0;
    }
    case OMV_CONFIG_DOUBLE: {
        errno = 0;
        double v = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !isfinite(v)) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "'%s' is not a finite number", value);
            return -EINVAL;
        }
        if (v < e->min || v > e->max) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%g is out of range [%g, %g]", v, e->min, e->max);
            return -EINVAL;
        }
        *(double *)field = v;
        return 0;
    }
    case OMV_CONFIG_STRING:
        if (strlen(value) >= e->size) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "value is longer than %zu characters", e->size - 1);
            return -EINVAL;
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    case OMV_CONFIG_BOOL: {
        int b;
        if (parse_bool(value, &b) < 0) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "'%s' is not yes or no", value);
            return -EINVAL;
        }
        *(int *)field = b;
        return 0;
    }
    }
    snprintf(err, OMV_CONFIG_ERR_MAX, "unknown type");
    return -EINVAL;
}

int omv_config_defaults(const omv_config_entry_t *table, size_t n, void *target)
{
    char err[OMV_CONFIG_ERR_MAX];
    for (size_t i = 0; i < n; i++) {
        const omv_config_entry_t *e = &table[i];
        if (e->def == NULL) {
            if (e->type == OMV_CONFIG_STRING)
                ((char *)target + e->offset)[0] = '\0';
            continue;
        }
        if (set_entry(e, target, e->def, err) < 0)
            return -EINVAL;
    }
    return 0;
}

int omv_config_set(const omv_config_entry_t *table, size_t n, void *target, const char *section,
                   const char *key, const char *value, char *err)
{
    size_t index;
    const omv_config_entry_t *e = find(table, n, section, key, &index);
    if (e == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "[%s] %s: unknown key", section, key);
        return -ENOENT;
    }
    char why[OMV_CONFIG_ERR_MAX];
    int r = set_entry(e, target, value, why);
    if (r < 0)
        snprintf(err, OMV_CONFIG_ERR_MAX, "[%s] %s: %s", section, key, why);
    return r;
}

int omv_config_set_arg(const omv_config_entry_t *table, size_t n, void *target, const char *arg,
                       char *err)
{
    char section[64], key[64];
    const char *dot = strchr(arg, '.');
    const char *eq = strchr(arg, '=');
    if (dot == NULL || eq == NULL || dot > eq || (size_t)(dot - arg) >= sizeof(section) ||
        (size_t)(eq - dot - 1) >= sizeof(key)) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "'%s': expected section.key=value", arg);
        return -EINVAL;
    }
    memcpy(section, arg, (size_t)(dot - arg));
    section[dot - arg] = '\0';
    memcpy(key, dot + 1, (size_t)(eq - dot - 1));
    key[eq - dot - 1] = '\0';
    return omv_config_set(table, n, target, section, key, eq + 1, err);
}

typedef struct {
    const omv_config_entry_t *table;
    size_t n;
    void *target;
    int *lines;
    FILE *file;
    int line;
    char *err;
    int failed;
} load_ctx_t;

/* Our reader for ini_parse_stream: inih's handler gets no line number, so we count lines.
 * inih reads into a fixed buffer of num bytes; a longer line would be split into two bogus
 * lines, so it is refused here with its number instead. */
static char *reader(char *str, int num, void *stream)
{
    load_ctx_t *ctx = stream;
    char *s = fgets(str, num, ctx->file);
    if (s == NULL)
        return NULL;
    ctx->line++;
    size_t len = strlen(s);
    if (len == (size_t)num - 1 && s[len - 1] != '\n' && !feof(ctx->file)) {
        int c;
        while ((c = fgetc(ctx->file)) != EOF && c != '\n')
            ;
        if (!ctx->failed) {
            snprintf(ctx->err, OMV_CONFIG_ERR_MAX, "line %d: line is longer than %d characters",
                     ctx->line, num - 2);
            ctx->failed = 1;
        }
        str[0] = '\0';
    }
    return s;
}

static int handler(void *user, const char *section, const char *key, const char *value)
{
    load_ctx_t *ctx = user;
    if (ctx->failed)
        return 1;
    size_t index;
    char why[OMV_CONFIG_ERR_MAX];
    if (key == NULL) /* a section header alone */
        return 1;
    if (find(ctx->table, ctx->n, section, key, &index) == NULL) {
        snprintf(ctx->err, OMV_CONFIG_ERR_MAX, "line %d: [%s] %s: unknown key", ctx->line, section,
                 key);
        ctx->failed = 1;
        return 0;
    }
    if (ctx->lines[index] != 0) {
        snprintf(ctx->err, OMV_CONFIG_ERR_MAX,
                 "line %d: [%s] %s: duplicate key (first set on line %d)", ctx->line, section, key,
                 ctx->lines[index]);
        ctx->failed = 1;
        return 0;
    }
    if (set_entry(&ctx->table[index], ctx->target, value, why) < 0) {
        snprintf(ctx->err, OMV_CONFIG_ERR_MAX, "line %d: [%s] %s: %s", ctx->line, section, key,
                 why);
        ctx->failed = 1;
        return 0;
    }
    ctx->lines[index] = ctx->line;
    return 1;
}

static int load_stream(const omv_config_entry_t *table, size_t n, const char *path, FILE *f,
                       void *target, int *ret_lines, char *err);

int omv_config_load(const omv_config_entry_t *table, size_t n, const char *path, void *target,
                    int *ret_lines, char *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int r = -errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open: %s", path, strerror(errno));
        return r;
    }
    return load_stream(table, n, path, f, target, ret_lines, err);
}

int omv_config_load_text(const omv_config_entry_t *table, size_t n, const char *path,
                         const char *text, void *target, int *ret_lines, char *err)
{
    /* An empty text is an empty file; fmemopen refuses a size of 0. */
    static const char empty[] = "\n";
    size_t len = strlen(text);
    FILE *f = fmemopen((void *)(len ? text : empty), len ? len : 1, "r");
    if (f == NULL) {
        int r = -errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot read: %s", path, strerror(errno));
        return r;
    }
    return load_stream(table, n, path, f, target, ret_lines, err);
}

/* Parses f (taken: closed here) as path's contents. */
static int load_stream(const omv_config_entry_t *table, size_t n, const char *path, FILE *f,
                       void *target, int *ret_lines, char *err)
{
    char why[OMV_CONFIG_ERR_MAX] = "";
    int *lines = calloc(n ? n : 1, sizeof(int));
    int r = 0;
    load_ctx_t ctx = {table, n, target, lines, f, 0, why, 0};
    if (lines == NULL) {
        r = -ENOMEM;
        goto out;
    }
    int pr = ini_parse_stream(reader, &ctx, handler, &ctx);
    /* why starts with "line N: "; inih's pr is the first bad line of either kind, so a syntax
     * error before our first refusal is the one to report. */
    int line = 0;
    const char *rest = why;
    if (ctx.failed && sscanf(why, "line %d: ", &line) == 1)
        rest = strchr(why, ':') + 2;
    if (ctx.failed && !(pr > 0 && pr < line)) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s:%d: %s", path, line, rest);
        r = -EINVAL;
        goto out;
    }
    if (pr != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s:%d: syntax error (expected [section] or key = value)",
                 path, pr);
        r = -EINVAL;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if ((table[i].flags & OMV_CONFIG_REQUIRED) && lines[i] == 0) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [%s] %s: required key is missing", path,
                     table[i].section, table[i].key);
            r = -EINVAL;
            goto out;
        }
    }
    if (ret_lines)
        memcpy(ret_lines, lines, n * sizeof(int));
out:
    if (ctx.file)
        fclose(ctx.file);
    free(lines);
    return r;
}
