/* The worker's connection to omnivored: a ZeroMQ DEALER socket (libzmq lives behind this file
 * on the worker side). A message is an envelope frame and, when the envelope says so, a frame of
 * raw float32 values. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

typedef struct omv_link omv_link_t;

/* CURVE keys (Z85): the daemon's public key, and this worker's key pair. */
typedef struct {
    const char *server_key, *public_key, *secret_key;
} omv_link_curve_t;

/* Connects to endpoint (tcp://host:port or ipc://path), with CURVE when curve is not NULL.
 * ZeroMQ connects in the background and reconnects by itself. Returns NULL with errno set
 * (ENOTSUP: libzmq has no CURVE). Caller owns; release with omv_link_destroy. */
omv_link_t *omv_link_new(const char *endpoint, const omv_link_curve_t *curve);
/* The same, but a message to a peer that is not connected is dropped: omv_link_send returns
 * -EAGAIN at once, where the other kind queues it for the reconnection. */
omv_link_t *omv_link_new_lossy(const char *endpoint, const omv_link_curve_t *curve);
/* Closes the link, flushing what was sent for up to 2 s. */
void omv_link_destroy(omv_link_t **self_p);
/* Closes the link at once, dropping what was not sent (the daemon is gone). */
void omv_link_abandon(omv_link_t **self_p);

/* Sends msg, followed by its payload (omv_wire_payload_count(msg) floats) when it has one.
 * Returns 0 or a negative errno. */
int omv_link_send(omv_link_t *self, const omv_msg_t *msg, const void *payload);

/* Sends an envelope encoded already (omv_wire_encode) of a message that carries no values: the
 * same frame omv_link_send would send for that message. For envelopes encoded for the
 * shared-memory connection (worker/shmlink.h) that go over the socket after all, so that
 * nothing is decoded to be encoded again. Returns 0 or a negative errno. */
int omv_link_send_raw(omv_link_t *self, const void *env, size_t len);

/* Waits up to timeout_ms (-1: forever) for a message. Returns 0, -EAGAIN on timeout, -EPROTO for
 * a malformed one (reason in why[OMV_WIRE_REASON_MAX]), -EINTR when a signal came. The payload,
 * if any, stays readable through omv_link_payload until the next receive. */
int omv_link_recv(omv_link_t *self, omv_msg_t *ret, int timeout_ms, char *why);

/* Waits up to timeout_ms for one of links[n] (n at most 1 + OMV_WIRE_MAX_SERVERS) to have a
 * message. Returns its index (the first ready), -EAGAIN on timeout, or a negative errno. */
int omv_link_poll(omv_link_t *const *links, int n, int timeout_ms);

/* The same, also waiting for fd (-1: none) to be readable: its index is n (checked first). */
int omv_link_poll_fd(omv_link_t *const *links, int n, int fd, int timeout_ms);

/* The payload of the last message received: bytes (NULL when none); *ret_len gets its length. */
const void *omv_link_payload(const omv_link_t *self, size_t *ret_len);
