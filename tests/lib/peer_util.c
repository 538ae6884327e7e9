/* A hand-driven peer speaking the wire protocol over a DEALER socket, for the tests that play
 * a broken or hostile worker. */
#include "peer_util.h"

#include <check.h>
#include <string.h>
#include <zmq.h>

#include "cluster_util.h"
#include "util.h"

void peer_open(peer_t *p)
{
    p->ctx = zmq_ctx_new();
    p->sock = zmq_socket(p->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_connect(p->sock, endpoint), 0);
}

void peer_open_curve(peer_t *p, const char *server_key, const char *public_key,
                     const char *secret_key)
{
    p->ctx = zmq_ctx_new();
    p->sock = zmq_socket(p->ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(p->sock, ZMQ_LINGER, &linger, sizeof(linger));
    ck_assert_int_eq(zmq_setsockopt(p->sock, ZMQ_CURVE_SERVERKEY, server_key, 41), 0);
    ck_assert_int_eq(zmq_setsockopt(p->sock, ZMQ_CURVE_PUBLICKEY, public_key, 41), 0);
    ck_assert_int_eq(zmq_setsockopt(p->sock, ZMQ_CURVE_SECRETKEY, secret_key, 41), 0);
    ck_assert_int_eq(zmq_connect(p->sock, endpoint), 0);
}

int peer_answers(peer_t *p, int timeout_ms)
{
    zmq_pollitem_t it = {p->sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, timeout_ms) == 1;
}

void peer_close(peer_t *p)
{
    zmq_close(p->sock);
    zmq_ctx_term(p->ctx);
}

void peer_send_raw(peer_t *p, const void *a, size_t alen, const void *b, size_t blen)
{
    ck_assert_int_ge(zmq_send(p->sock, a, alen, b ? ZMQ_SNDMORE : 0), 0);
    if (b)
        ck_assert_int_ge(zmq_send(p->sock, b, blen, 0), 0);
}

void peer_send(peer_t *p, const omv_msg_t *m, const float *payload, size_t count)
{
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
    size_t len;
    ck_assert_int_eq(omv_wire_encode(m, buf, sizeof(buf), &len), 0);
    peer_send_raw(p, buf, len, payload, count * sizeof(float));
}

/* Receives one message (within 5 s); the payload, if any, goes into payload[cap]. */
void peer_recv(peer_t *p, omv_msg_t *m, float *payload, size_t cap)
{
    zmq_pollitem_t it = {p->sock, 0, ZMQ_POLLIN, 0};
    ck_assert_msg(zmq_poll(&it, 1, 5000) == 1, "no answer from the daemon");
    static uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
    int n = zmq_recv(p->sock, buf, sizeof(buf), 0);
    ck_assert_int_ge(n, 0);
    ck_assert_int_eq(omv_wire_decode(buf, (size_t)n, m, NULL), 0);
    int more = 0;
    size_t sz = sizeof(more);
    zmq_getsockopt(p->sock, ZMQ_RCVMORE, &more, &sz);
    if (more) {
        int got = zmq_recv(p->sock, payload, cap * sizeof(float), 0);
        ck_assert_int_eq(got, (int)omv_wire_payload_bytes(m));
    }
}

void expect_error(peer_t *p, omv_refuse_t code)
{
    omv_msg_t m;
    peer_recv(p, &m, NULL, 0);
    ck_assert_msg(m.type == OMV_MSG_ERROR, "expected an error, got %s", omv_msg_name(m.type));
    ck_assert_msg(m.u.error.code == code, "expected %s, got %s (\"%s\")", omv_refuse_name(code),
                  omv_refuse_name(m.u.error.code), m.u.error.reason);
    ck_assert(strlen(m.u.error.reason) > 0);
}

/* Pulls step into model[param_count], checking shard by shard. Shards answer in any order (each
 * has its own thread); each must answer exactly once, where the job says it lies. */
void pull_model(peer_t *p, uint32_t id, uint64_t step, const omv_jobspec_t *j, float *model)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){id, step, 0};
    peer_send(p, &m, NULL, 0);
    static float part[1 << 16];
    uint8_t got[OMV_WIRE_MAX_SHARDS] = {0};
    for (uint32_t n = 0; n < j->n_shards; n++) {
        peer_recv(p, &m, part, sizeof(part) / sizeof(part[0]));
        ck_assert_int_eq(m.type, OMV_MSG_PARAMS);
        ck_assert_int_eq(m.u.params.step, step);
        uint32_t s = m.u.params.shard;
        ck_assert_uint_lt(s, j->n_shards);
        ck_assert_msg(!got[s], "shard %u answered twice", s);
        got[s] = 1;
        ck_assert_int_eq(m.u.params.offset, j->shard_offsets[s]);
        ck_assert_int_eq(m.u.params.count, j->shard_offsets[s + 1] - j->shard_offsets[s]);
        memcpy(model + j->shard_offsets[s], part, m.u.params.count * sizeof(float));
    }
}

void peer_hello(peer_t *p, const char *hostname, omv_msg_t *welcome)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    omv_strlcpy(m.u.hello.hostname, hostname, sizeof(m.u.hello.hostname));
    peer_send(p, &m, NULL, 0);
    peer_recv(p, welcome, NULL, 0);
    ck_assert_int_eq(welcome->type, OMV_MSG_WELCOME);
}
