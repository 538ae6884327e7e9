/* Messages from workers: each is checked against the member records and handed to the member
 * records (Hello, Leave, Heartbeat) or to the current run (Pull, Push, EvalResult). */
#pragma once

#include "daemon_priv.h"

/* Receives and handles what is queued on the worker endpoint (a bounded number, so that the
 * control socket is never starved). */
void omv_messages_drain(omv_daemon_t *d);

/* Declares silent members dead (from the cron). */
void omv_messages_expire(omv_daemon_t *d);
