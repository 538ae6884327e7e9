/* Status-style replies written once, read two ways: sections of key:value lines for people
 * ("# job\nepoch:1.50\n") or one JSON object of objects for programs. */
#pragma once

#include <stdint.h>

#include "strbuf.h"

typedef struct {
    omv_strbuf_t *out;
    int json;
    int n_sections, n_keys;
} omv_kv_t;

void omv_kv_begin(omv_kv_t *self, omv_strbuf_t *out, int json);
void omv_kv_section(omv_kv_t *self, const char *name);
void omv_kv_int(omv_kv_t *self, const char *key, int64_t v);
/* A number with `decimals` digits after the point; NaN is written as null / empty. */
void omv_kv_double(omv_kv_t *self, const char *key, double v, int decimals);
void omv_kv_str(omv_kv_t *self, const char *key, const char *v);
/* A value that is already JSON (for arrays); in text it is written as it is. */
void omv_kv_raw(omv_kv_t *self, const char *key, const char *json);
/* Ends the last section and the object; JSON ends with a newline. */
void omv_kv_end(omv_kv_t *self);
