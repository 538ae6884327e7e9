/* key:value sections or JSON from the same calls. */
#include "kv.h"

#include <math.h>

void omv_kv_begin(omv_kv_t *self, omv_strbuf_t *out, int json)
{
    self->out = out;
    self->json = json;
    self->n_sections = 0;
    self->n_keys = 0;
    if (json)
        omv_strbuf_append(out, "{", 1);
}

void omv_kv_section(omv_kv_t *self, const char *name)
{
    if (self->json) {
        if (self->n_sections > 0)
            omv_strbuf_append(self->out, "},", 2);
        omv_strbuf_json_string(self->out, name);
        omv_strbuf_append(self->out, ":{", 2);
    } else {
        omv_strbuf_printf(self->out, "%s# %s\n", self->n_sections > 0 ? "\n" : "", name);
    }
    self->n_sections++;
    self->n_keys = 0;
}

static void key(omv_kv_t *self, const char *k)
{
    if (self->json) {
        if (self->n_keys > 0)
            omv_strbuf_append(self->out, ",", 1);
        omv_strbuf_json_string(self->out, k);
        omv_strbuf_append(self->out, ":", 1);
    } else {
        omv_strbuf_printf(self->out, "%s:", k);
    }
    self->n_keys++;
}

void omv_kv_int(omv_kv_t *self, const char *k, int64_t v)
{
    key(self, k);
    omv_strbuf_printf(self->out, "%lld%s", (long long)v, self->json ? "" : "\n");
}

void omv_kv_double(omv_kv_t *self, const char *k, double v, int decimals)
{
    key(self, k);
    if (!isfinite(v))
        omv_strbuf_printf(self->out, "%s", self->json ? "null" : "\n");
    else
        omv_strbuf_printf(self->out, "%.*f%s", decimals, v, self->json ? "" : "\n");
}

void omv_kv_str(omv_kv_t *self, const char *k, const char *v)
{
    key(self, k);
    if (self->json)
        omv_strbuf_json_string(self->out, v);
    else
        omv_strbuf_printf(self->out, "%s\n", v);
}

void omv_kv_raw(omv_kv_t *self, const char *k, const char *json)
{
    key(self, k);
    omv_strbuf_printf(self->out, "%s%s", json, self->json ? "" : "\n");
}

void omv_kv_end(omv_kv_t *self)
{
    if (self->json)
        omv_strbuf_append(self->out, self->n_sections > 0 ? "}}\n" : "}\n",
                          self->n_sections > 0 ? 3 : 2);
}
