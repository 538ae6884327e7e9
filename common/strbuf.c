/* Growable text buffer. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void omv_strbuf_init(omv_strbuf_t *self)
{
    memset(self, 0, sizeof(*self));
}

void omv_strbuf_fini(omv_strbuf_t *self)
{
    free(self->data);
    memset(self, 0, sizeof(*self));
}

void omv_strbuf_clear(omv_strbuf_t *self)
{
    self->len = 0;
    if (self->data)
        self->data[0] = '\0';
}

static int reserve(omv_strbuf_t *self, size_t extra)
{
    if (self->failed)
        return -1;
    if (self->len + extra + 1 <= self->cap)
        return 0;
    size_t cap = self->cap ? self->cap : 256;
    while (cap < self->len + extra + 1)
        cap *= 2;
    char *p = realloc(self->data, cap);
    if (p == NULL) {
        self->failed = 1;
        return -1;
    }
    self->data = p;
    self->cap = cap;
    return 0;
}

void omv_strbuf_append(omv_strbuf_t *self, const char *s, size_t n)
{
    if (reserve(self, n) < 0)
        return;
    memcpy(self->data + self->len, s, n);
    self->len += n;
    self->data[self->len] = '\0';
}

void omv_strbuf_printf(omv_strbuf_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(self, (size_t)n) < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(self->data + self->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    self->len += (size_t)n;
}

void omv_strbuf_json_string(omv_strbuf_t *self, const char *s)
{
    omv_strbuf_append(self, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            omv_strbuf_append(self, esc, 2);
        } else if (*p < 0x20) {
            omv_strbuf_printf(self, "\\u%04x", *p);
        } else {
            omv_strbuf_append(self, (const char *)p, 1);
        }
    }
    omv_strbuf_append(self, "\"", 1);
}

const char *omv_strbuf_str(const omv_strbuf_t *self)
{
    return self->data ? self->data : "";
}
