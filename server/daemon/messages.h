/* Messages from workers: each is checked against the member records and handed to the member
 * records (Hello, Leave, Heartbeat) or to the current run (Pull, Push, EvalResult). */
#pragma once

#include <poll.h>
#include <stdint.h>

#include "daemon_priv.h"

/* Receives and handles what is queued on the worker endpoint (a bounded number, so that the
 * control socket is never starved). */
void omv_messages_drain(omv_daemon_t *d);

/* Handles one message from peer (from the worker endpoint, or a local worker's connection). */
void omv_messages_dispatch(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg);

/* Handles the envelopes on local workers' connections that poll found ready (fds[n], who[n]
 * from omv_local_pollfds): Pull, shared-memory Push and Leave, as if they came on the worker
 * endpoint (anything else is refused as malformed), and the connections that closed (the member is
 * gone). */
void omv_messages_drain_local(omv_daemon_t *d, const struct pollfd *fds, const uint32_t *who,
                              int n);

/* Declares silent members dead (from the cron, every EXPIRE_PERIOD_MS). */
#define EXPIRE_PERIOD_MS 100
void omv_messages_expire(omv_daemon_t *d);
