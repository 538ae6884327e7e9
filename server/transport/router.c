/* ROUTER side of the wire, over libzmq. */
#include "router.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "util.h"

static void drain(void *sock);

_Static_assert(sizeof(zmq_msg_t) <= sizeof(omv_payload_t), "omv_payload_t is too small");

struct omv_pipe {
    void *sock;
};

struct omv_router {
    void *ctx;
    void *sock;
    void *zap;     /* REP for ZAP requests (CURVE only) */
    void *monitor; /* PAIR: the router's failed handshakes (CURVE only) */
    uint64_t handshakes_failed;
    omv_router_curve_t curve;
    zmq_msg_t payload;
    int has_payload;
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
    omv_pipe_t *pipes[OMV_PIPE_MAX]; /* loop ends, polled with the router */
    int n_pipes, pipes_made;
    int64_t max_message_bytes;
    void *up; /* DEALER to the coordinator (a shard server's), or NULL */
    zmq_msg_t up_payload;
    int up_has_payload;
    uint8_t up_buf[OMV_WIRE_MAX_ENVELOPE];
};

int omv_router_keypair(char *ret_public, char *ret_secret)
{
    if (!zmq_has("curve"))
        return -ENOTSUP;
    return zmq_curve_keypair(ret_public, ret_secret) == 0 ? 0 : -errno;
}

/* The ZAP handler's socket (RFC 27), in the router's context, and CURVE as the server. */
static int setup_curve(omv_router_t *self, const omv_router_curve_t *curve)
{
    if (!zmq_has("curve"))
        return -ENOTSUP;
    self->curve = *curve;
    self->zap = zmq_socket(self->ctx, ZMQ_REP);
    int linger = 0, server = 1;
    if (self->zap == NULL)
        return -errno;
    zmq_setsockopt(self->zap, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(self->zap, "inproc://zeromq.zap.01") != 0 ||
        zmq_setsockopt(self->sock, ZMQ_CURVE_SERVER, &server, sizeof(server)) != 0 ||
        zmq_setsockopt(self->sock, ZMQ_CURVE_SECRETKEY, curve->secret_key, 41) != 0)
        return -errno;
    /* Peers without CURVE, or that speak nonsense, fail before ZAP is asked: counted here
     * (refused keys are counted by the one who refuses them). */
    if (zmq_socket_monitor(self->sock, "inproc://omv-router-monitor",
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0)
        return -errno;
    self->monitor = zmq_socket(self->ctx, ZMQ_PAIR);
    if (self->monitor == NULL)
        return -errno;
    zmq_setsockopt(self->monitor, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_connect(self->monitor, "inproc://omv-router-monitor") != 0)
        return -errno;
    return 0;
}

static void read_monitor(omv_router_t *self)
{
    uint8_t ev[6];
    while (zmq_recv(self->monitor, ev, sizeof(ev), ZMQ_DONTWAIT) >= 0) {
        drain(self->monitor);
        self->handshakes_failed++;
    }
}

uint64_t omv_router_handshakes_failed(const omv_router_t *self)
{
    return self->handshakes_failed;
}

/* Answers one ZAP request: 200 for a key the daemon admits (its Z85 form becomes the
 * connection's User-Id), 400 for the rest. */
static void serve_zap(omv_router_t *self)
{
    char frames[7][64];
    size_t lens[7] = {0};
    int n = 0;
    for (int more = 1; more && n < 7; n++) {
        int got = zmq_recv(self->zap, frames[n], sizeof(frames[n]) - 1, ZMQ_DONTWAIT);
        if (got < 0)
            return;
        lens[n] = (size_t)got > sizeof(frames[n]) - 1 ? sizeof(frames[n]) - 1 : (size_t)got;
        frames[n][lens[n]] = '\0';
        more = 0;
        size_t sz = sizeof(more);
        zmq_getsockopt(self->zap, ZMQ_RCVMORE, &more, &sz);
    }
    drain(self->zap);
    char key[41] = "";
    int ok = n == 7 && strcmp(frames[5], "CURVE") == 0 && lens[6] == 32 &&
             zmq_z85_encode(key, (const uint8_t *)frames[6], 32) != NULL &&
             self->curve.auth(self->curve.ctx, key);
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not admitted";
    zmq_send(self->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(self->zap, frames[1], n > 1 ? lens[1] : 0, ZMQ_SNDMORE);
    zmq_send(self->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(self->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(self->zap, ok ? key : "", ok ? strlen(key) : 0, ZMQ_SNDMORE);
    zmq_send(self->zap, "", 0, 0);
}

omv_router_t *omv_router_new(const char *endpoint, int64_t max_message_bytes,
                             const omv_router_curve_t *curve)
{
    omv_router_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->ctx = zmq_ctx_new();
    if (self->ctx == NULL)
        goto fail;
    self->sock = zmq_socket(self->ctx, ZMQ_ROUTER);
    if (self->sock == NULL)
        goto fail;
    int linger = 1000, hwm = OMV_ROUTER_HWM, mandatory = 1;
    zmq_setsockopt(self->sock, ZMQ_LINGER, &linger, sizeof(linger));
    /* Bounded queues per peer: a peer that never reads its answers loses them rather than
     * growing the daemon without limit, and one that sends faster than the loop reads is slowed
     * by its own socket. */
    zmq_setsockopt(self->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(self->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    /* A frame over the limit drops the connection before it is buffered (set before bind:
     * libzmq copies the options into the listener). */
    if (max_message_bytes > 0)
        zmq_setsockopt(self->sock, ZMQ_MAXMSGSIZE, &max_message_bytes, sizeof(max_message_bytes));
    self->max_message_bytes = max_message_bytes;
    /* Report sends to peers that are gone instead of dropping them silently. */
    zmq_setsockopt(self->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
    if (curve != NULL) {
        int r = setup_curve(self, curve);
        if (r < 0) {
            errno = -r;
            goto fail;
        }
    }
    if (zmq_bind(self->sock, endpoint) != 0)
        goto fail;
    zmq_msg_init(&self->payload);
    zmq_msg_init(&self->up_payload);
    return self;
fail : {
    int e = errno;
    if (self->monitor)
        zmq_close(self->monitor);
    if (self->zap)
        zmq_close(self->zap);
    if (self->sock)
        zmq_close(self->sock);
    if (self->ctx)
        zmq_ctx_term(self->ctx);
    free(self);
    errno = e;
    return NULL;
}
}

int64_t omv_router_max_message(const omv_router_t *self)
{
    return self->max_message_bytes;
}

void omv_router_destroy(omv_router_t **self_p)
{
    omv_router_t *self = *self_p;
    if (self == NULL)
        return;
    /* The threads' ends must be closed by now (their owners destroy them after the threads
     * end), or the context would wait for them forever. */
    for (int i = 0; i < self->n_pipes; i++)
        omv_pipe_destroy(&self->pipes[i]);
    zmq_msg_close(&self->payload);
    zmq_msg_close(&self->up_payload);
    if (self->up)
        zmq_close(self->up);
    if (self->monitor)
        zmq_close(self->monitor);
    if (self->zap)
        zmq_close(self->zap);
    zmq_close(self->sock);
    zmq_ctx_term(self->ctx);
    free(self);
    *self_p = NULL;
}

int omv_router_poll(omv_router_t *self, struct pollfd *fds, int nfds, int *ret_router,
                    int *ret_pipes, int timeout_ms)
{
    zmq_pollitem_t items[OMV_ROUTER_FDS_MAX + 3 + OMV_PIPE_MAX];
    if (nfds > OMV_ROUTER_FDS_MAX)
        return -EINVAL;
    items[0] = (zmq_pollitem_t){self->sock, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < nfds; i++) {
        short ev = (short)(((fds[i].events & POLLIN) ? ZMQ_POLLIN : 0) |
                           ((fds[i].events & POLLOUT) ? ZMQ_POLLOUT : 0));
        items[i + 1] = (zmq_pollitem_t){NULL, fds[i].fd, ev, 0};
    }
    for (int i = 0; i < self->n_pipes; i++)
        items[1 + nfds + i] = (zmq_pollitem_t){self->pipes[i]->sock, 0, ZMQ_POLLIN, 0};
    int n_items = 1 + nfds + self->n_pipes;
    if (self->zap)
        items[n_items++] = (zmq_pollitem_t){self->zap, 0, ZMQ_POLLIN, 0};
    if (self->monitor)
        items[n_items++] = (zmq_pollitem_t){self->monitor, 0, ZMQ_POLLIN, 0};
    int up_at = n_items;
    if (self->up)
        items[n_items++] = (zmq_pollitem_t){self->up, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(items, n_items, timeout_ms);
    if (n < 0)
        return -errno;
    /* Handshakes wait on the answer: given at once, before anything else. */
    if (self->monitor && (items[up_at - 1].revents & ZMQ_POLLIN))
        read_monitor(self);
    if (self->zap && (items[up_at - 1 - (self->monitor != NULL)].revents & ZMQ_POLLIN))
        serve_zap(self);
    /* The coordinator's messages are read with the workers'. */
    *ret_router =
        (items[0].revents & ZMQ_POLLIN) != 0 || (self->up && (items[up_at].revents & ZMQ_POLLIN));
    for (int i = 0; i < nfds; i++) {
        short re = items[i + 1].revents;
        fds[i].revents =
            (short)(((re & ZMQ_POLLIN) ? POLLIN : 0) | ((re & ZMQ_POLLOUT) ? POLLOUT : 0) |
                    ((re & ZMQ_POLLERR) ? POLLERR : 0));
    }
    int pipes = 0;
    for (int i = 0; i < self->n_pipes; i++)
        pipes |= (items[1 + nfds + i].revents & ZMQ_POLLIN) != 0;
    if (ret_pipes)
        *ret_pipes = pipes;
    return n;
}

static int more(void *sock)
{
    int m = 0;
    size_t sz = sizeof(m);
    zmq_getsockopt(sock, ZMQ_RCVMORE, &m, &sz);
    return m;
}

static void drain(void *sock)
{
    while (more(sock)) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
    }
}

/* Receives the envelope frame into buf (its whole length returned, even past buf); with CURVE,
 * the key the connection was admitted with comes with it (ZAP's User-Id: the routing id frame,
 * made here, carries none). */
static int recv_envelope(omv_router_t *self, omv_peer_t *peer)
{
    if (self->zap == NULL) {
        int len = zmq_recv(self->sock, self->buf, sizeof(self->buf), 0);
        return len < 0 ? -errno : len;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, self->sock, 0) < 0) {
        int e = -errno;
        zmq_msg_close(&m);
        return e;
    }
    size_t len = zmq_msg_size(&m);
    memcpy(self->buf, zmq_msg_data(&m), len < sizeof(self->buf) ? len : sizeof(self->buf));
    const char *user = zmq_msg_gets(&m, "User-Id");
    omv_strlcpy(peer->key, user ? user : "", sizeof(peer->key));
    zmq_msg_close(&m);
    return len > INT32_MAX ? INT32_MAX : (int)len;
}

int omv_router_recv(omv_router_t *self, omv_peer_t *ret_peer, omv_msg_t *ret, char *why)
{
    self->has_payload = 0;
    int n = zmq_recv(self->sock, ret_peer->id, sizeof(ret_peer->id), ZMQ_DONTWAIT);
    if (n < 0)
        return -errno;
    ret_peer->len = (size_t)n > sizeof(ret_peer->id) ? sizeof(ret_peer->id) : (size_t)n;
    ret_peer->key[0] = '\0';
    if (!more(self->sock)) {
        snprintf(why, OMV_WIRE_REASON_MAX, "empty message");
        return -EPROTO;
    }
    int len = recv_envelope(self, ret_peer);
    if (len < 0)
        return len;
    if ((size_t)len > sizeof(self->buf)) {
        drain(self->sock);
        snprintf(why, OMV_WIRE_REASON_MAX, "envelope of %d bytes is over the %zu-byte limit", len,
                 sizeof(self->buf));
        return -EPROTO;
    }
    int r = omv_wire_decode(self->buf, (size_t)len, ret, why);
    if (r < 0) {
        drain(self->sock);
        return r;
    }
    uint32_t count = omv_wire_payload_count(ret);
    if (more(self->sock)) {
        zmq_msg_close(&self->payload);
        zmq_msg_init(&self->payload);
        if (zmq_msg_recv(&self->payload, self->sock, 0) < 0)
            return -errno;
        self->has_payload = 1;
        if (more(self->sock)) {
            drain(self->sock);
            snprintf(why, OMV_WIRE_REASON_MAX, "%s has more than two frames",
                     omv_msg_name(ret->type));
            return -EPROTO;
        }
    }
    size_t have = self->has_payload ? zmq_msg_size(&self->payload) : 0;
    if (have != omv_wire_payload_bytes(ret)) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "%s announces %u values (%zu bytes) but carries %zu bytes",
                 omv_msg_name(ret->type), count, omv_wire_payload_bytes(ret), have);
        return -EPROTO;
    }
    return 0;
}

const void *omv_router_payload(const omv_router_t *self, size_t *ret_len)
{
    if (!self->has_payload) {
        *ret_len = 0;
        return NULL;
    }
    *ret_len = zmq_msg_size((zmq_msg_t *)&self->payload);
    return zmq_msg_data((zmq_msg_t *)&self->payload);
}

int omv_router_send(omv_router_t *self, const omv_peer_t *peer, const omv_msg_t *msg,
                    const float *payload)
{
    size_t len;
    int r = omv_wire_encode(msg, self->buf, sizeof(self->buf), &len);
    if (r < 0)
        return r;
    uint32_t count = omv_wire_payload_count(msg);
    if (zmq_send(self->sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        return -errno;
    if (zmq_send(self->sock, self->buf, len, (count ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return -errno;
    if (count && zmq_send(self->sock, payload, omv_wire_payload_bytes(msg), ZMQ_DONTWAIT) < 0)
        return -errno;
    return 0;
}

/* ---- the upstream link ---- */

int omv_router_upstream(omv_router_t *self, const char *endpoint, const omv_upstream_curve_t *curve)
{
    if (self->up)
        return -EALREADY;
    self->up = zmq_socket(self->ctx, ZMQ_DEALER);
    if (self->up == NULL)
        return -errno;
    int linger = 1000, hwm = OMV_ROUTER_HWM;
    zmq_setsockopt(self->up, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(self->up, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(self->up, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (curve && (!zmq_has("curve") ||
                  zmq_setsockopt(self->up, ZMQ_CURVE_SERVERKEY, curve->server_key, 41) != 0 ||
                  zmq_setsockopt(self->up, ZMQ_CURVE_PUBLICKEY, curve->public_key, 41) != 0 ||
                  zmq_setsockopt(self->up, ZMQ_CURVE_SECRETKEY, curve->secret_key, 41) != 0)) {
        int e = zmq_has("curve") ? -errno : -ENOTSUP;
        zmq_close(self->up);
        self->up = NULL;
        return e;
    }
    if (zmq_connect(self->up, endpoint) != 0) {
        int e = -errno;
        zmq_close(self->up);
        self->up = NULL;
        return e;
    }
    return 0;
}

int omv_router_up_send(omv_router_t *self, const omv_msg_t *msg, const void *payload)
{
    size_t len;
    int r = omv_wire_encode(msg, self->up_buf, sizeof(self->up_buf), &len);
    if (r < 0)
        return r;
    size_t bytes = omv_wire_payload_bytes(msg);
    if (zmq_send(self->up, self->up_buf, len, (bytes ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        return -errno;
    if (bytes && zmq_send(self->up, payload, bytes, ZMQ_DONTWAIT) < 0)
        return -errno;
    return 0;
}

int omv_router_up_recv(omv_router_t *self, omv_msg_t *ret, char *why)
{
    self->up_has_payload = 0;
    if (self->up == NULL)
        return -EAGAIN;
    int len = zmq_recv(self->up, self->up_buf, sizeof(self->up_buf), ZMQ_DONTWAIT);
    if (len < 0)
        return -errno;
    int r =
        (size_t)len > sizeof(self->up_buf)
            ? (snprintf(why, OMV_WIRE_REASON_MAX, "envelope of %d bytes is too long", len), -EPROTO)
            : omv_wire_decode(self->up_buf, (size_t)len, ret, why);
    if (r == 0 && more(self->up)) {
        zmq_msg_close(&self->up_payload);
        zmq_msg_init(&self->up_payload);
        if (zmq_msg_recv(&self->up_payload, self->up, 0) < 0)
            return -errno;
        self->up_has_payload = 1;
    }
    size_t have = self->up_has_payload ? zmq_msg_size(&self->up_payload) : 0;
    if (r == 0 && have != omv_wire_payload_bytes(ret)) {
        snprintf(why, OMV_WIRE_REASON_MAX, "%s announces %zu bytes but carries %zu",
                 omv_msg_name(ret->type), omv_wire_payload_bytes(ret), have);
        r = -EPROTO;
    }
    drain(self->up);
    return r;
}

const void *omv_router_up_payload(const omv_router_t *self, size_t *ret_len)
{
    *ret_len = self->up_has_payload ? zmq_msg_size((zmq_msg_t *)&self->up_payload) : 0;
    return self->up_has_payload ? zmq_msg_data((zmq_msg_t *)&self->up_payload) : NULL;
}

/* ---- payloads ---- */

static zmq_msg_t *as_msg(omv_payload_t *p)
{
    return (zmq_msg_t *)(void *)p->opaque;
}

int omv_payload_init_shared(omv_payload_t *self, void *data, size_t len,
                            void (*release)(void *data, void *hint), void *hint)
{
    return zmq_msg_init_data(as_msg(self), data, len, release, hint) == 0 ? 0 : -errno;
}

void *omv_payload_data(omv_payload_t *self, size_t *ret_len)
{
    *ret_len = zmq_msg_size(as_msg(self));
    return zmq_msg_data(as_msg(self));
}

void omv_payload_close(omv_payload_t *self)
{
    zmq_msg_close(as_msg(self));
}

void omv_router_take_payload(omv_router_t *self, omv_payload_t *ret)
{
    zmq_msg_init(as_msg(ret));
    if (self->has_payload)
        zmq_msg_move(as_msg(ret), &self->payload);
    self->has_payload = 0;
}

int omv_router_send_raw(omv_router_t *self, const omv_peer_t *peer, const void *env, size_t len,
                        omv_payload_t *payload)
{
    int r = 0;
    if (zmq_send(self->sock, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(self->sock, env, len, (payload ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0)
        r = -errno;
    /* A message the router refuses (the peer is gone) is dropped, and its payload released. */
    if (payload) {
        if (r == 0 && zmq_msg_send(as_msg(payload), self->sock, ZMQ_DONTWAIT) < 0)
            r = -errno;
        zmq_msg_close(as_msg(payload));
    }
    return r;
}

/* ---- pipes ---- */

int omv_router_pipe(omv_router_t *self, omv_pipe_t **ret_loop_end, omv_pipe_t **ret_thread_end)
{
    if (self->n_pipes == OMV_PIPE_MAX)
        return -ENOSPC;
    char name[64];
    snprintf(name, sizeof(name), "inproc://omv-pipe-%d", self->pipes_made++);
    omv_pipe_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    int r = -ENOMEM;
    if (a == NULL || b == NULL)
        goto fail;
    a->sock = zmq_socket(self->ctx, ZMQ_PAIR);
    b->sock = zmq_socket(self->ctx, ZMQ_PAIR);
    if (a->sock == NULL || b->sock == NULL)
        goto fail_errno;
    int hwm = 0, linger = 0;
    zmq_setsockopt(a->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(a->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(b->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(b->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(a->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(b->sock, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(a->sock, name) != 0 || zmq_connect(b->sock, name) != 0)
        goto fail_errno;
    self->pipes[self->n_pipes++] = a;
    *ret_loop_end = a;
    *ret_thread_end = b;
    return 0;
fail_errno:
    r = -errno;
fail:
    if (a && a->sock)
        zmq_close(a->sock);
    if (b && b->sock)
        zmq_close(b->sock);
    free(a);
    free(b);
    return r;
}

void omv_router_drop_pipes(omv_router_t *self)
{
    for (int i = 0; i < self->n_pipes; i++)
        omv_pipe_destroy(&self->pipes[i]);
    self->n_pipes = 0;
}

void omv_pipe_destroy(omv_pipe_t **self_p)
{
    omv_pipe_t *self = *self_p;
    if (self == NULL)
        return;
    zmq_close(self->sock);
    free(self);
    *self_p = NULL;
}

int omv_pipe_send(omv_pipe_t *self, const void *cmd, size_t len, const void *extra,
                  size_t extra_len, omv_payload_t *payload)
{
    int r = 0;
    if (zmq_send(self->sock, cmd, len, ZMQ_SNDMORE) < 0 ||
        zmq_send(self->sock, extra, extra_len, payload ? ZMQ_SNDMORE : 0) < 0)
        r = -errno;
    if (payload) {
        if (r == 0 && zmq_msg_send(as_msg(payload), self->sock, 0) < 0)
            r = -errno;
        zmq_msg_close(as_msg(payload));
    }
    return r;
}

int omv_pipe_recv(omv_pipe_t *self, void *cmd, size_t cap, size_t *ret_len, void *extra,
                  size_t extra_cap, size_t *ret_extra_len, omv_payload_t *ret_payload,
                  int *ret_has_payload, int timeout_ms)
{
    if (timeout_ms >= 0) {
        zmq_pollitem_t it = {self->sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, timeout_ms);
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EAGAIN;
    }
    int n = zmq_recv(self->sock, cmd, cap, 0);
    if (n < 0)
        return -errno;
    *ret_len = (size_t)n;
    *ret_extra_len = 0;
    *ret_has_payload = 0;
    if (more(self->sock)) {
        n = zmq_recv(self->sock, extra, extra_cap, 0);
        if (n < 0)
            return -errno;
        *ret_extra_len = (size_t)n > extra_cap ? extra_cap : (size_t)n;
    }
    if (more(self->sock)) {
        zmq_msg_init(as_msg(ret_payload));
        if (zmq_msg_recv(as_msg(ret_payload), self->sock, 0) < 0) {
            int e = -errno;
            zmq_msg_close(as_msg(ret_payload));
            return e;
        }
        *ret_has_payload = 1;
    }
    drain(self->sock);
    return 0;
}
