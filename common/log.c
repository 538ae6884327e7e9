/* Logging to stderr: level threshold, tag, journald priority prefixes under systemd. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

omv_log_level_t omv_log_threshold = OMV_LOG_INFO;

static const char *ident = "omnivore";
static int journal = -1; /* -1: not yet decided */

static const char *const level_names[] = {"error", "warn", "info", "debug"};
/* syslog priorities: err, warning, info, debug. */
static const int level_priority[] = {3, 4, 6, 7};

int omv_log_set_level_name(const char *name)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            omv_log_threshold = (omv_log_level_t)i;
            return 0;
        }
    }
    return -EINVAL;
}

void omv_log_set_ident(const char *name)
{
    ident = name;
}

void omv_log_fatal(const char *fmt, ...)
{
    char line[2048];
    if (journal < 0)
        journal = getenv("JOURNAL_STREAM") != NULL;
    int n = snprintf(line, sizeof(line), "%s%s: ", journal ? "<3>" : "", ident);
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (size_t)(m < 0 ? 0 : m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

void omv_log_write(omv_log_level_t level, const char *tag, const char *fmt, ...)
{
    char line[2048];
    int n;
    if (journal < 0)
        journal = getenv("JOURNAL_STREAM") != NULL;
    if (journal) {
        n = snprintf(line, sizeof(line), "<%d>%s: ", level_priority[level], tag);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        localtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %s[%d] %-5s %s: ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, ident, (int)getpid(),
                     level_names[level], tag);
    }
    if (n < 0 || (size_t)n >= sizeof(line))
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    /* One write per line so that lines from several processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
