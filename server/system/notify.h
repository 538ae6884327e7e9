/* Tells systemd how omnivored is doing (sd_notify): ready, a one-line status, stopping. The one
 * file behind libsystemd; every call is a no-op when built without it (-Dsystemd=disabled) or
 * when not started by systemd ($NOTIFY_SOCKET unset). */
#pragma once

/* The sockets are bound and the control socket answers: READY=1, with status (may be NULL). */
void omv_notify_ready(const char *status);
/* STATUS=line, at most once every OMV_NOTIFY_STATUS_MS unless the text changed its first word
 * (the job's state), and never twice the same. line is borrowed. */
void omv_notify_status(const char *line);
/* WATCHDOG=1 every half of the unit's WatchdogSec= ($WATCHDOG_USEC), from the event loop: a
 * loop that stops turning (a deadlock, a stuck thread) gets the daemon restarted, and it resumes
 * from its last checkpoint. Cheap to call often. */
void omv_notify_watchdog(void);
/* RELOADING=1 before the daemon re-reads its config on SIGHUP, and READY=1 after it, so that
 * systemctl shows it reloading. */
void omv_notify_reloading(void);
void omv_notify_reloaded(void);
/* STOPPING=1: the daemon is on its way out (sent once). */
void omv_notify_stopping(void);
/* Whether notifications are compiled in. */
int omv_notify_enabled(void);

#define OMV_NOTIFY_STATUS_MS 2000
