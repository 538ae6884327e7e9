/* Logging to stderr, journald-friendly: one line per event, a level and a per-file tag.
 * Under systemd (JOURNAL_STREAM set) lines carry <N> priority prefixes instead of timestamps. */
#pragma once

#include <stdbool.h>

typedef enum {
    OMV_LOG_ERROR = 0,
    OMV_LOG_WARN = 1,
    OMV_LOG_INFO = 2,
    OMV_LOG_DEBUG = 3,
} omv_log_level_t;

/* The current threshold; messages above it are not formatted. */
extern omv_log_level_t omv_log_threshold;

/* Sets the threshold; names: error, warn, info, debug. Returns 0 or -EINVAL. */
int omv_log_set_level_name(const char *name);
/* Sets the program name printed on each line (borrowed; must outlive logging). */
void omv_log_set_ident(const char *ident);

/* An error that ends the process (a bad flag or config file): "IDENT: message" on stderr, as a
 * command line tool says it, whatever the level; at err priority under journald, so that
 * `journalctl -p err` shows why a unit did not start. */
void omv_log_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void omv_log_write(omv_log_level_t level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifndef OMV_LOG_TAG
#define OMV_LOG_TAG "omnivore"
#endif

#define omv_log_at(level, ...)                                                                     \
    do {                                                                                           \
        if ((level) <= omv_log_threshold)                                                          \
            omv_log_write((level), OMV_LOG_TAG, __VA_ARGS__);                                      \
    } while (0)
#define omv_log_error(...) omv_log_at(OMV_LOG_ERROR, __VA_ARGS__)
#define omv_log_warn(...) omv_log_at(OMV_LOG_WARN, __VA_ARGS__)
#define omv_log_info(...) omv_log_at(OMV_LOG_INFO, __VA_ARGS__)
#define omv_log_debug(...) omv_log_at(OMV_LOG_DEBUG, __VA_ARGS__)
