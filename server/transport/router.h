/* The daemon's worker endpoint: a ZeroMQ ROUTER socket (libzmq lives behind this file on the
 * daemon side). Each message comes with the peer that sent it, so replies go to that peer. */
#pragma once

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

typedef struct {
    uint8_t id[256];
    size_t len;
    char key[41]; /* the Z85 public key it connected with (CURVE); "" without */
} omv_peer_t;

typedef struct omv_router omv_router_t;

/* Messages queued per peer each way before sends to it fail with -EAGAIN (answers to a peer
 * that does not read are dropped) and its own sends wait. */
#define OMV_ROUTER_HWM 4096

/* Asked once per connection that completes a CURVE handshake, with the client's Z85 public key:
 * returns whether it may connect (its messages then carry the key). */
typedef int (*omv_router_auth_fn)(void *ctx, const char *public_key);

/* CURVE on the endpoint: the daemon's secret key (Z85) and who decides on clients. */
typedef struct {
    const char *secret_key;
    omv_router_auth_fn auth;
    void *ctx;
} omv_router_curve_t;

/* Binds endpoint (tcp://0.0.0.0:5555 or ipc:///run/omnivore/workers.sock); a peer sending a
 * frame over max_message_bytes (0: no limit) is disconnected before the frame is buffered.
 * With curve (may be NULL: plain), only clients that complete a CURVE handshake with a key
 * curve->auth admits may connect (a ZAP handler on the loop's thread, served by
 * omv_router_poll). Returns NULL with errno set. */
omv_router_t *omv_router_new(const char *endpoint, int64_t max_message_bytes,
                             const omv_router_curve_t *curve);

/* Makes a CURVE key pair, Z85 (41 bytes each with the NUL). Returns 0 or a negative errno
 * (-ENOTSUP: libzmq was built without CURVE). */
int omv_router_keypair(char *ret_public, char *ret_secret);
/* Connections that failed their CURVE handshake before ZAP was asked (no CURVE, bad bytes). */
uint64_t omv_router_handshakes_failed(const omv_router_t *self);

/* The frame limit it was made with (0: none). */
int64_t omv_router_max_message(const omv_router_t *self);
void omv_router_destroy(omv_router_t **self_p);

/* The most fds omv_router_poll takes: the control socket's, and a connection for each worker
 * on the daemon's host (server/local.h). */
#define OMV_ROUTER_FDS_MAX 1152

/* Waits up to timeout_ms for a message on the router, on any loop end of the pipes made with
 * omv_router_pipe, or what fds[nfds] (at most OMV_ROUTER_FDS_MAX) ask for (POLLIN, POLLOUT; their
 * revents are set); *ret_router says whether the router has messages, *ret_pipes whether a pipe
 * has. Returns >= 0 or a negative errno (-EINTR on a signal). */
int omv_router_poll(omv_router_t *self, struct pollfd *fds, int nfds, int *ret_router,
                    int *ret_pipes, int timeout_ms);

/* Receives one message without waiting. Returns 0, -EAGAIN when none is queued, or -EPROTO for a
 * malformed one (reason in why[OMV_WIRE_REASON_MAX], *ret_peer still set so it can be answered).
 * The payload stays readable through omv_router_payload until the next receive. */
int omv_router_recv(omv_router_t *self, omv_peer_t *ret_peer, omv_msg_t *ret, char *why);
const void *omv_router_payload(const omv_router_t *self, size_t *ret_len);

/* Sends msg (and its payload) to peer without blocking; a peer that is gone or not reading
 * loses the message. Returns 0 or a negative errno. */
int omv_router_send(omv_router_t *self, const omv_peer_t *peer, const omv_msg_t *msg,
                    const float *payload);

/* ---- payloads that move between threads without copies ---- */

/* Room for a ZeroMQ message; use only through the functions below. */
typedef struct {
    _Alignas(16) unsigned char opaque[64];
} omv_payload_t;

/* Wraps data[len] without copying; release(data, hint) runs (on any thread) when the last
 * message using it is gone. Returns 0 or a negative errno. */
int omv_payload_init_shared(omv_payload_t *self, void *data, size_t len,
                            void (*release)(void *data, void *hint), void *hint);
void *omv_payload_data(omv_payload_t *self, size_t *ret_len);
void omv_payload_close(omv_payload_t *self);

/* Moves the payload of the last message received into ret (the router no longer has it). */
void omv_router_take_payload(omv_router_t *self, omv_payload_t *ret);

/* Sends an encoded envelope env[len] and a payload (taken, sent without a copy) to peer. */
int omv_router_send_raw(omv_router_t *self, const omv_peer_t *peer, const void *env, size_t len,
                        omv_payload_t *payload);

/* ---- pipes between the event loop and its threads (ZeroMQ inproc PAIRs) ---- */

/* ---- the upstream link: a shard server's DEALER to its coordinator, polled with the router
 * (omv_router_poll's ret_router says either is readable) ---- */

/* CURVE keys (Z85) for the upstream link: the coordinator's public key, and our key pair. */
typedef struct {
    const char *server_key, *public_key, *secret_key;
} omv_upstream_curve_t;

/* Connects the upstream link (once), with CURVE when curve is not NULL. Returns 0 or a negative
 * errno. */
int omv_router_upstream(omv_router_t *self, const char *endpoint,
                        const omv_upstream_curve_t *curve);
/* Sends msg (and its payload) to the coordinator. Returns 0 or a negative errno. */
int omv_router_up_send(omv_router_t *self, const omv_msg_t *msg, const void *payload);
/* Receives one message from the coordinator without waiting: 0, -EAGAIN (none), -EPROTO (why).
 * Its payload stays readable through omv_router_up_payload until the next receive. */
int omv_router_up_recv(omv_router_t *self, omv_msg_t *ret, char *why);
const void *omv_router_up_payload(const omv_router_t *self, size_t *ret_len);

typedef struct omv_pipe omv_pipe_t;

#define OMV_PIPE_MAX 256

/* Makes a pipe; the loop end is polled by omv_router_poll and closed by omv_router_destroy;
 * the other end belongs to a thread, and its owner closes it with omv_pipe_destroy after the
 * thread ends (before omv_router_destroy). Returns 0 or a negative errno. */
int omv_router_pipe(omv_router_t *self, omv_pipe_t **ret_loop_end, omv_pipe_t **ret_thread_end);
void omv_pipe_destroy(omv_pipe_t **self_p);
/* Closes every loop end (their threads have ended and closed their ends): between jobs. */
void omv_router_drop_pipes(omv_router_t *self);

/* Sends a message of three parts: cmd[len], extra[extra_len] (may be empty) and, when payload
 * is not NULL, the payload (taken). Returns 0 or a negative errno. */
int omv_pipe_send(omv_pipe_t *self, const void *cmd, size_t len, const void *extra,
                  size_t extra_len, omv_payload_t *payload);

/* Receives one message, waiting up to timeout_ms (-1: forever): cmd into cmd[cap] (its length
 * in *ret_len), extra into extra[extra_cap] (*ret_extra_len), the payload into ret_payload
 * (*ret_has_payload says whether there was one; close it when done). Returns 0, -EAGAIN, or a
 * negative errno. */
int omv_pipe_recv(omv_pipe_t *self, void *cmd, size_t cap, size_t *ret_len, void *extra,
                  size_t extra_cap, size_t *ret_extra_len, omv_payload_t *ret_payload,
                  int *ret_has_payload, int timeout_ms);
