/* The shard servers' records and the messages to them. */
#define OMV_LOG_TAG "daemon"
#include "servers.h"

#include <string.h>

#include "log.h"
#include "util.h"

omv_server_t *omv_servers_register(omv_servers_t *self, const omv_peer_t *peer,
                                   const omv_hello_t *h)
{
    int index = -1;
    for (uint32_t i = 0; i < OMV_WIRE_MAX_SERVERS && index < 0; i++)
        if (self->rec[i].used && strcmp(self->rec[i].endpoint, h->endpoint) == 0)
            index = (int)i; /* the same server again (it restarted) */
    for (uint32_t i = 0; i < OMV_WIRE_MAX_SERVERS && index < 0; i++)
        if (!self->rec[i].used || !self->rec[i].alive)
            index = (int)i;
    if (index < 0)
        return NULL;
    omv_server_t *s = &self->rec[index];
    if (s->used && s->alive && s->run_id != 0)
        return NULL; /* a live one holds a part of a run: the endpoint is taken */
    memset(s, 0, sizeof(*s));
    s->used = s->alive = 1;
    s->peer = *peer;
    omv_strlcpy(s->host, h->hostname, sizeof(s->host));
    omv_strlcpy(s->endpoint, h->endpoint, sizeof(s->endpoint));
    omv_strlcpy(s->public_key, h->public_key, sizeof(s->public_key));
    s->pid = h->pid;
    s->joined_ms = s->last_seen_ms = omv_time_ms();
    if ((uint32_t)index + 1 > self->n)
        self->n = (uint32_t)index + 1;
    self->registered_total++;
    return s;
}

omv_server_t *omv_servers_find(omv_servers_t *self, const omv_peer_t *peer, uint32_t id)
{
    if (id == 0 || id > self->n)
        return NULL;
    omv_server_t *s = &self->rec[id - 1];
    if (!s->used || !s->alive || s->peer.len != peer->len ||
        memcmp(s->peer.id, peer->id, peer->len) != 0)
        return NULL;
    return s;
}

uint32_t omv_servers_free(const omv_servers_t *self)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < self->n; i++)
        n += self->rec[i].used && self->rec[i].alive && self->rec[i].run_id == 0;
    return n;
}

int omv_servers_send(omv_servers_t *self, omv_router_t *router, omv_server_t *s,
                     const omv_msg_t *msg, const void *payload)
{
    int r = omv_router_send(router, &s->peer, msg, payload);
    if (r < 0)
        omv_log_warn("cannot send %s to shard server %u (%s): %s", omv_msg_name(msg->type),
                     omv_servers_id(self, s), s->endpoint, omv_strerror(r));
    else
        s->bytes_out += omv_wire_payload_bytes(msg);
    return r;
}

void omv_servers_send_run(omv_servers_t *self, omv_router_t *router, uint64_t run_id,
                          const omv_msg_t *msg)
{
    for (uint32_t i = 0; i < self->n; i++)
        if (self->rec[i].alive && self->rec[i].run_id == run_id)
            omv_servers_send(self, router, &self->rec[i], msg, NULL);
}

void omv_servers_stats(omv_server_t *s, const omv_server_msg_t *st)
{
    int64_t now = omv_time_ms();
    double dt = s->stats_ms ? (double)(now - s->stats_ms) / 1000.0 : 0;
    const omv_server_msg_t *o = &s->stats;
    if (dt > 0 && st->bytes_in >= o->bytes_in && st->bytes_out >= o->bytes_out &&
        st->steps >= o->steps && st->pushes >= o->pushes) {
        s->in_per_s = (double)(st->bytes_in - o->bytes_in) / dt;
        s->out_per_s = (double)(st->bytes_out - o->bytes_out) / dt;
        s->applies_per_s = (double)(st->steps - o->steps) / dt;
        s->pushes_per_s = (double)(st->pushes - o->pushes) / dt;
    } else {
        s->in_per_s = s->out_per_s = s->applies_per_s = s->pushes_per_s = 0;
    }
    s->stats = *st;
    s->stats_ms = now;
}

void omv_servers_release(omv_servers_t *self, uint64_t run_id)
{
    for (uint32_t i = 0; i < self->n; i++)
        if (self->rec[i].run_id == run_id)
            self->rec[i].run_id = 0;
}
