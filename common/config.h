/* Declarative INI configuration: one table per file kind (job file, daemon config) names each
 * key, its type, the field it fills, its default and its range. Unknown keys, duplicates, values
 * out of range and missing required keys are refused with file, line and reason. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef enum {
    OMV_CONFIG_INT,    /* int64_t */
    OMV_CONFIG_DOUBLE, /* double */
    OMV_CONFIG_STRING, /* char[size] */
    OMV_CONFIG_BOOL,   /* int: yes/no, true/false, on/off, 1/0 */
} omv_config_type_t;

enum {
    OMV_CONFIG_REQUIRED = 1 << 0,    /* must be present in the file */
    OMV_CONFIG_NONE_IS_NEG = 1 << 1, /* an INT that also takes "none" (stored as -1) */
    OMV_CONFIG_RUNTIME = 1 << 2,     /* may change while running (documented; used by reload) */
};

typedef struct {
    const char *section;
    const char *key;
    omv_config_type_t type;
    size_t offset;   /* offsetof the field in the target struct */
    size_t size;     /* for strings: the field's capacity */
    const char *def; /* default, as text; NULL: none (zero) */
    double min, max; /* range for numbers (inclusive) */
    unsigned flags;
    const char *help; /* one line for people */
} omv_config_entry_t;

#define OMV_CONFIG_ERR_MAX 512

/* Writes every entry's default into target. Returns 0 or -EINVAL (a bad default: a bug). */
int omv_config_defaults(const omv_config_entry_t *table, size_t n, void *target);

/* Parses the INI file at path into target (defaults must already be set). On failure returns a
 * negative errno and writes "path:line: [section] key: reason" into err[OMV_CONFIG_ERR_MAX].
 * ret_lines (optional, n ints) gets the line of each key set, 0 for keys left at default. */
int omv_config_load(const omv_config_entry_t *table, size_t n, const char *path, void *target,
                    int *ret_lines, char *err);
/* The same for a file's contents already read: text (NUL-terminated) is parsed as path's. */
int omv_config_load_text(const omv_config_entry_t *table, size_t n, const char *path,
                         const char *text, void *target, int *ret_lines, char *err);

/* Sets one key from text (a command-line override "section.key=value" or the file).
 * Returns 0, -ENOENT for an unknown key, or -EINVAL with the reason in err. */
int omv_config_set(const omv_config_entry_t *table, size_t n, void *target, const char *section,
                   const char *key, const char *value, char *err);

/* Parses "section.key=value" and sets it; errors as omv_config_set. */
int omv_config_set_arg(const omv_config_entry_t *table, size_t n, void *target, const char *arg,
                       char *err);
