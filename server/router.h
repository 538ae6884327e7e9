/* The daemon's worker endpoint: a ZeroMQ ROUTER socket (libzmq lives behind this file on the
 * daemon side). Each message comes with the peer that sent it, so replies go to that peer. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

typedef struct {
    uint8_t id[256];
    size_t len;
} omv_peer_t;

typedef struct omv_router omv_router_t;

/* Binds endpoint (tcp://0.0.0.0:5555 or ipc:///run/omnivore/workers.sock). Returns NULL with
 * errno set. */
omv_router_t *omv_router_new(const char *endpoint);
void omv_router_destroy(omv_router_t **self_p);

/* Waits up to timeout_ms for a message on the router or input on any of fds[nfds]; revents[i]
 * gets POLLIN for ready fds, *ret_router whether the router has messages. Returns >= 0 or a
 * negative errno (-EINTR on a signal). */
int omv_router_poll(omv_router_t *self, const int *fds, int nfds, short *revents, int *ret_router,
                    int timeout_ms);

/* Receives one message without waiting. Returns 0, -EAGAIN when none is queued, or -EPROTO for a
 * malformed one (reason in why[OMV_WIRE_REASON_MAX], *ret_peer still set so it can be answered).
 * The payload stays readable through omv_router_payload until the next receive. */
int omv_router_recv(omv_router_t *self, omv_peer_t *ret_peer, omv_msg_t *ret, char *why);
const void *omv_router_payload(const omv_router_t *self, size_t *ret_len);

/* Sends msg (and its payload) to peer without blocking; a peer that is gone or not reading
 * loses the message. Returns 0 or a negative errno. */
int omv_router_send(omv_router_t *self, const omv_peer_t *peer, const omv_msg_t *msg,
                    const float *payload);
