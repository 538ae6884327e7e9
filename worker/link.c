/* DEALER side of the wire, over libzmq. */
#include "link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

struct omv_link {
    void *ctx;
    void *sock;
    zmq_msg_t payload; /* the last payload received */
    int has_payload;
    int lossy; /* omv_link_new_lossy */
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
};

static int set_curve(void *sock, const omv_link_curve_t *c)
{
    if (!zmq_has("curve")) {
        errno = ENOTSUP;
        return -1;
    }
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server_key, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->public_key, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret_key, 41) != 0)
        return -1;
    return 0;
}

static omv_link_t *link_new(const char *endpoint, const omv_link_curve_t *curve, int lossy)
{
    omv_link_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->ctx = zmq_ctx_new();
    if (self->ctx == NULL)
        goto fail;
    self->sock = zmq_socket(self->ctx, ZMQ_DEALER);
    if (self->sock == NULL)
        goto fail;
    /* Flush what we sent for up to 2 s when closing, then give up. */
    int linger = 2000, hwm = 0;
    zmq_setsockopt(self->sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(self->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(self->sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    /* Lossy: nothing waits for a peer that is not connected. */
    self->lossy = lossy;
    zmq_setsockopt(self->sock, ZMQ_IMMEDIATE, &lossy, sizeof(lossy));
    if (curve != NULL && set_curve(self->sock, curve) != 0)
        goto fail;
    if (zmq_connect(self->sock, endpoint) != 0)
        goto fail;
    zmq_msg_init(&self->payload);
    return self;
fail : {
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

omv_link_t *omv_link_new(const char *endpoint, const omv_link_curve_t *curve)
{
    return link_new(endpoint, curve, 0);
}

omv_link_t *omv_link_new_lossy(const char *endpoint, const omv_link_curve_t *curve)
{
    return link_new(endpoint, curve, 1);
}

void omv_link_abandon(omv_link_t **self_p)
{
    if (*self_p) {
        int linger = 0;
        zmq_setsockopt((*self_p)->sock, ZMQ_LINGER, &linger, sizeof(linger));
    }
    omv_link_destroy(self_p);
}

void omv_link_destroy(omv_link_t **self_p)
{
    omv_link_t *self = *self_p;
    if (self == NULL)
        return;
    zmq_msg_close(&self->payload);
    zmq_close(self->sock);
    zmq_ctx_term(self->ctx);
    free(self);
    *self_p = NULL;
}

int omv_link_send(omv_link_t *self, const omv_msg_t *msg, const void *payload)
{
    size_t len;
    int r = omv_wire_encode(msg, self->buf, sizeof(self->buf), &len);
    if (r < 0)
        return r;
    uint32_t count = omv_wire_payload_count(msg);
    int flags = self->lossy ? ZMQ_DONTWAIT : 0;
    if (zmq_send(self->sock, self->buf, len, (count ? ZMQ_SNDMORE : 0) | flags) < 0)
        return -errno;
    if (count && zmq_send(self->sock, payload, omv_wire_payload_bytes(msg), 0) < 0)
        return -errno;
    return 0;
}

int omv_link_send_raw(omv_link_t *self, const void *env, size_t len)
{
    if (zmq_send(self->sock, env, len, self->lossy ? ZMQ_DONTWAIT : 0) < 0)
        return -errno;
    return 0;
}

/* Drops the rest of a multipart message. */
static void drain(omv_link_t *self)
{
    int more = 0;
    size_t sz = sizeof(more);
    zmq_getsockopt(self->sock, ZMQ_RCVMORE, &more, &sz);
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, self->sock, 0);
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
}

int omv_link_poll_fd(omv_link_t *const *links, int n, int fd, int timeout_ms)
{
    zmq_pollitem_t items[2 + OMV_WIRE_MAX_SERVERS];
    if (n < 1 || n > 1 + OMV_WIRE_MAX_SERVERS)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        items[i] = (zmq_pollitem_t){links[i]->sock, 0, ZMQ_POLLIN, 0};
    int n_items = n;
    if (fd >= 0)
        items[n_items++] = (zmq_pollitem_t){NULL, fd, ZMQ_POLLIN, 0};
    int r = zmq_poll(items, n_items, timeout_ms);
    if (r < 0)
        return -errno;
    if (fd >= 0 && (items[n].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
        return n;
    for (int i = 0; i < n && r > 0; i++)
        if (items[i].revents & ZMQ_POLLIN)
            return i;
    return -EAGAIN;
}

int omv_link_poll(omv_link_t *const *links, int n, int timeout_ms)
{
    return omv_link_poll_fd(links, n, -1, timeout_ms);
}

int omv_link_recv(omv_link_t *self, omv_msg_t *ret, int timeout_ms, char *why)
{
    zmq_pollitem_t item = {self->sock, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&item, 1, timeout_ms);
    if (n < 0)
        return -errno;
    if (n == 0)
        return -EAGAIN;
    self->has_payload = 0;
    int len = zmq_recv(self->sock, self->buf, sizeof(self->buf), 0);
    if (len < 0)
        return -errno;
    if ((size_t)len > sizeof(self->buf)) {
        drain(self);
        snprintf(why, OMV_WIRE_REASON_MAX, "envelope of %d bytes is too large", len);
        return -EPROTO;
    }
    int r = omv_wire_decode(self->buf, (size_t)len, ret, why);
    if (r < 0) {
        drain(self);
        return r;
    }
    uint32_t count = omv_wire_payload_count(ret);
    int more = 0;
    size_t sz = sizeof(more);
    zmq_getsockopt(self->sock, ZMQ_RCVMORE, &more, &sz);
    if (count && more) {
        zmq_msg_close(&self->payload);
        zmq_msg_init(&self->payload);
        if (zmq_msg_recv(&self->payload, self->sock, 0) < 0)
            return -errno;
        self->has_payload = 1;
        drain(self);
    } else if (more) {
        drain(self);
    }
    if (count &&
        (!self->has_payload || zmq_msg_size(&self->payload) != omv_wire_payload_bytes(ret))) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "%s announces %u values (%zu bytes) but carries %zu bytes",
                 omv_msg_name(ret->type), count, omv_wire_payload_bytes(ret),
                 self->has_payload ? zmq_msg_size(&self->payload) : 0);
        return -EPROTO;
    }
    return 0;
}

const void *omv_link_payload(const omv_link_t *self, size_t *ret_len)
{
    if (!self->has_payload) {
        *ret_len = 0;
        return NULL;
    }
    *ret_len = zmq_msg_size((zmq_msg_t *)&self->payload);
    return zmq_msg_data((zmq_msg_t *)&self->payload);
}
