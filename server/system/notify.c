/* systemd notifications for omnivored through libsystemd's sd_notify; compiled away without it. */
#define OMV_LOG_TAG "notify"
#include "notify.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util.h"

#ifdef OMV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static char last_status[256];
static int64_t last_status_ms;
static int stopping_sent;

int omv_notify_enabled(void)
{
    return 1;
}

void omv_notify_ready(const char *status)
{
    if (status) {
        sd_notifyf(0, "READY=1\nSTATUS=%s", status);
        omv_strlcpy(last_status, status, sizeof(last_status));
        last_status_ms = omv_time_ms();
    } else {
        sd_notify(0, "READY=1");
    }
}

/* The first word of a status line: the job's state. */
static size_t first_word(const char *s)
{
    return strcspn(s, ": ");
}

void omv_notify_status(const char *line)
{
    int64_t now = omv_time_ms();
    if (strcmp(line, last_status) == 0)
        return;
    int new_state = first_word(line) != first_word(last_status) ||
                    strncmp(line, last_status, first_word(line)) != 0;
    if (!new_state && now - last_status_ms < OMV_NOTIFY_STATUS_MS)
        return;
    sd_notifyf(0, "STATUS=%s", line);
    omv_strlcpy(last_status, line, sizeof(last_status));
    last_status_ms = now;
}

void omv_notify_watchdog(void)
{
    static int64_t interval_ms = -1, last_ms;
    if (interval_ms < 0) {
        uint64_t usec = 0;
        /* WatchdogSec= in the unit: systemd restarts a daemon that stays silent that long. */
        interval_ms = sd_watchdog_enabled(0, &usec) > 0 ? (int64_t)(usec / 2000) : 0;
        if (interval_ms == 0 && usec > 0)
            interval_ms = 1;
    }
    int64_t now = omv_time_ms();
    if (interval_ms == 0 || now - last_ms < interval_ms)
        return;
    sd_notify(0, "WATCHDOG=1");
    last_ms = now;
}

void omv_notify_reloading(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
               (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
}

void omv_notify_reloaded(void)
{
    sd_notify(0, "READY=1");
}

void omv_notify_stopping(void)
{
    if (stopping_sent)
        return;
    stopping_sent = 1;
    sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}

#else

int omv_notify_enabled(void)
{
    return 0;
}

void omv_notify_ready(const char *status)
{
    (void)status;
}

void omv_notify_status(const char *line)
{
    (void)line;
}

void omv_notify_watchdog(void)
{
}

void omv_notify_reloading(void)
{
}

void omv_notify_reloaded(void)
{
}

void omv_notify_stopping(void)
{
}

#endif
