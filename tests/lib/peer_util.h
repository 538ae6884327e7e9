/* A hand-driven peer speaking the wire protocol (see peer_util.c); failures fail the test. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

typedef struct {
    void *ctx, *sock;
} peer_t;

/* Connects a DEALER to the test's endpoint. */
void peer_open(peer_t *p);
/* The same over CURVE with the daemon's public key and ours (Z85). */
void peer_open_curve(peer_t *p, const char *server_key, const char *public_key,
                     const char *secret_key);
void peer_close(peer_t *p);
/* Whether a message comes within timeout_ms (it is left queued). */
int peer_answers(peer_t *p, int timeout_ms);
/* Sends a[alen] and, when b is not NULL, b[blen] as a second frame. */
void peer_send_raw(peer_t *p, const void *a, size_t alen, const void *b, size_t blen);
void peer_send(peer_t *p, const omv_msg_t *m, const float *payload, size_t count);
/* Receives one message (within 5 s); the payload, if any, goes into payload[cap]. */
void peer_recv(peer_t *p, omv_msg_t *m, float *payload, size_t cap);
/* Registers as a trainer named hostname; *welcome gets the Welcome (fails the test otherwise). */
void peer_hello(peer_t *p, const char *hostname, omv_msg_t *welcome);
/* The next message must be an Error with this code and a reason. */
void expect_error(peer_t *p, omv_refuse_t code);
/* Pulls step into model[param_count], checking shard by shard. */
void pull_model(peer_t *p, uint32_t id, uint64_t step, const omv_jobspec_t *j, float *model);
