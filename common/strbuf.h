/* A growable text buffer for status replies, summaries and JSON. */
#pragma once

#include <stddef.h>

typedef struct {
    char *data; /* always NUL-terminated once anything was added */
    size_t len, cap;
    int failed; /* an allocation failed: the text is cut short */
} omv_strbuf_t;

void omv_strbuf_init(omv_strbuf_t *self);
void omv_strbuf_fini(omv_strbuf_t *self);
void omv_strbuf_clear(omv_strbuf_t *self);
void omv_strbuf_printf(omv_strbuf_t *self, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void omv_strbuf_append(omv_strbuf_t *self, const char *s, size_t n);
/* Appends s as a JSON string literal, quotes included. */
void omv_strbuf_json_string(omv_strbuf_t *self, const char *s);
/* Returns the text ("" when empty). */
const char *omv_strbuf_str(const omv_strbuf_t *self);
