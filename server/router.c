/* ROUTER side of the wire, over libzmq. */
#include "router.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define MAX_FDS 8

struct omv_router {
    void *ctx;
    void *sock;
    zmq_msg_t payload;
    int has_payload;
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
};

omv_router_t *omv_router_new(const char *endpoint)
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
    int linger = 1000, hwm = 0, mandatory = 1;
    zmq_setsockopt(self->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(self->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(self->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    /* Report sends to peers that are gone instead of dropping them silently. */
    zmq_setsockopt(self->sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
    if (zmq_bind(self->sock, endpoint) != 0)
        goto fail;
    zmq_msg_init(&self->payload);
    return self;
fail: {
    int e = errno;
    if (self->sock)
        zmq_close(self->sock);
    if (self->ctx)
        zmq_ctx_term(self->ctx);
    free(self);
    errno = e;
    return NULL;
}
}

void omv_router_destroy(omv_router_t **self_p)
{
    omv_router_t *self = *self_p;
    if (self == NULL)
        return;
    zmq_msg_close(&self->payload);
    zmq_close(self->sock);
    zmq_ctx_term(self->ctx);
    free(self);
    *self_p = NULL;
}

int omv_router_poll(omv_router_t *self, const int *fds, int nfds, short *revents, int *ret_router,
                    int timeout_ms)
{
    zmq_pollitem_t items[MAX_FDS + 1];
    if (nfds > MAX_FDS)
        return -EINVAL;
    items[0] = (zmq_pollitem_t){self->sock, 0, ZMQ_POLLIN, 0};
    for (int i = 0; i < nfds; i++)
        items[i + 1] = (zmq_pollitem_t){NULL, fds[i], ZMQ_POLLIN, 0};
    int n = zmq_poll(items, nfds + 1, timeout_ms);
    if (n < 0)
        return -errno;
    *ret_router = (items[0].revents & ZMQ_POLLIN) != 0;
    for (int i = 0; i < nfds; i++)
        revents[i] = (items[i + 1].revents & ZMQ_POLLIN) ? POLLIN : 0;
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

int omv_router_recv(omv_router_t *self, omv_peer_t *ret_peer, omv_msg_t *ret, char *why)
{
    self->has_payload = 0;
    int n = zmq_recv(self->sock, ret_peer->id, sizeof(ret_peer->id), ZMQ_DONTWAIT);
    if (n < 0)
        return -errno;
    ret_peer->len = (size_t)n > sizeof(ret_peer->id) ? sizeof(ret_peer->id) : (size_t)n;
    if (!more(self->sock)) {
        snprintf(why, OMV_WIRE_REASON_MAX, "empty message");
        return -EPROTO;
    }
    int len = zmq_recv(self->sock, self->buf, sizeof(self->buf), 0);
    if (len < 0)
        return -errno;
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
    if (have != (size_t)count * sizeof(float)) {
        snprintf(why, OMV_WIRE_REASON_MAX, "%s announces %u floats but carries %zu bytes",
                 omv_msg_name(ret->type), count, have);
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
    if (count && zmq_send(self->sock, payload, (size_t)count * sizeof(float), ZMQ_DONTWAIT) < 0)
        return -errno;
    return 0;
}
