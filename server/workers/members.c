/* Member records: registration, lookup, counts and data slices. */
#define OMV_LOG_TAG "daemon"
#include "members.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "shm.h"
#include "util.h"

omv_members_t *omv_members_new(uint32_t max)
{
    omv_members_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->max = max;
    self->records = calloc(max, sizeof(omv_member_t));
    if (self->records == NULL) {
        free(self);
        errno = ENOMEM;
        return NULL;
    }
    return self;
}

void omv_members_destroy(omv_members_t **self_p)
{
    omv_members_t *self = *self_p;
    if (self == NULL)
        return;
    for (uint32_t i = 0; i < self->n; i++) {
        omv_members_shm_release(&self->records[i]);
        free(self->records[i].early);
    }
    free(self->records);
    free(self);
    *self_p = NULL;
}

void omv_members_shm_release(omv_member_t *m)
{
    if (!m->shm_on)
        return;
    omv_shm_unmap(m->shm_params, m->shm_bytes);
    omv_shm_unmap(m->shm_grads, m->shm_bytes);
    close(m->shm_conn);
    m->shm_on = 0;
    m->shm_model = m->inplace = 0;
    memset(m->inplace_sent, 0, sizeof(m->inplace_sent));
    m->shm_params = m->shm_grads = NULL;
    m->shm_bytes = 0;
}

omv_member_t *omv_members_get(omv_members_t *self, uint32_t id)
{
    return id == 0 || id > self->n ? NULL : &self->records[id - 1];
}

static int same_peer(const omv_peer_t *a, const omv_peer_t *b)
{
    return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

omv_member_t *omv_members_find(omv_members_t *self, const omv_peer_t *peer, uint32_t id)
{
    omv_member_t *m = omv_members_get(self, id);
    if (m == NULL || !m->used || (m->state != OMV_MEMBER_ALIVE && m->state != OMV_MEMBER_IDLE) ||
        !same_peer(&m->peer, peer))
        return NULL;
    return m;
}

int omv_members_from_finished_job(const omv_members_t *self, const omv_peer_t *peer, uint32_t id)
{
    if (id == 0 || id > self->n)
        return 0;
    const omv_member_t *m = &self->records[id - 1];
    if (!m->used)
        return 0;
    if (m->state == OMV_MEMBER_DONE)
        return same_peer(&m->peer, peer);
    return m->job_peer.len > 0 && same_peer(&m->job_peer, peer);
}

/* A record for a newcomer: a never-used one, else the oldest record of a member that is gone. */
static int free_record(const omv_members_t *self)
{
    for (uint32_t i = 0; i < self->max; i++)
        if (!self->records[i].used)
            return (int)i;
    int best = -1;
    for (uint32_t i = 0; i < self->max; i++)
        if (self->records[i].state != OMV_MEMBER_ALIVE &&
            (best < 0 || self->records[i].last_seen_ms < self->records[best].last_seen_ms))
            best = (int)i;
    return best;
}

omv_member_t *omv_members_register(omv_members_t *self, const omv_peer_t *peer,
                                   const omv_hello_t *h, int idle, int *ret_rejoin)
{
    /* A worker that registers again because a job ended or began is not rejoining after a
     * fault, and it keeps its id. */
    uint32_t prev = h->previous_worker_id;
    const omv_member_t *old = prev != 0 && prev <= self->n ? &self->records[prev - 1] : NULL;
    int between_jobs = old && (old->state == OMV_MEMBER_DONE || old->state == OMV_MEMBER_IDLE) &&
                       old->pid == h->pid && strcmp(old->host, h->hostname) == 0 &&
                       strcmp(old->key, peer->key) == 0;
    int index = between_jobs ? (int)prev - 1 : free_record(self);
    if (index < 0)
        return NULL;
    omv_member_t *m = &self->records[index];
    omv_peer_t job_peer = between_jobs ? old->peer : (omv_peer_t){0};
    omv_members_shm_release(m);
    free(m->early);
    memset(m, 0, sizeof(*m));
    m->job_peer = job_peer;
    m->used = 1;
    m->state = idle ? OMV_MEMBER_IDLE : OMV_MEMBER_ALIVE;
    m->peer = *peer;
    m->role = h->role;
    m->pid = h->pid;
    m->previous_id = h->previous_worker_id;
    omv_strlcpy(m->host, h->hostname, sizeof(m->host));
    omv_strlcpy(m->name, h->name, sizeof(m->name));
    omv_strlcpy(m->key, peer->key, sizeof(m->key));
    m->joined_ms = m->last_seen_ms = omv_time_ms();
    if ((uint32_t)index + 1 > self->n)
        self->n = (uint32_t)index + 1;
    *ret_rejoin = prev != 0 && !between_jobs;
    return m;
}

omv_member_t *omv_members_adopt(omv_members_t *self, uint32_t id, const char *host, const char *key,
                                uint64_t attach_token)
{
    if (id == 0 || id > self->max)
        return NULL;
    for (uint32_t k = self->n; k + 1 < id; k++)
        self->records[k].state = OMV_MEMBER_DONE; /* ids the coordinator gave others */
    omv_member_t *m = &self->records[id - 1];
    free(m->early);
    memset(m, 0, sizeof(*m));
    m->used = 1;
    m->state = OMV_MEMBER_ALIVE;
    m->role = OMV_ROLE_TRAINER;
    omv_strlcpy(m->host, host, sizeof(m->host));
    omv_strlcpy(m->key, key, sizeof(m->key));
    m->attach_token = attach_token;
    m->joined_ms = m->last_seen_ms = omv_time_ms();
    if (id > self->n)
        self->n = id;
    return m;
}

int omv_members_live_trainers(const omv_members_t *self)
{
    int n = 0;
    for (uint32_t i = 0; i < self->n; i++)
        n +=
            self->records[i].state == OMV_MEMBER_ALIVE && self->records[i].role == OMV_ROLE_TRAINER;
    return n;
}

int omv_members_idle(const omv_members_t *self)
{
    int n = 0;
    for (uint32_t i = 0; i < self->n; i++)
        n += self->records[i].state == OMV_MEMBER_IDLE;
    return n;
}

uint32_t omv_members_shm_in_use(const omv_members_t *self)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < self->n; i++)
        n += self->records[i].shm_on != 0;
    return n;
}

void omv_members_assign_slices(omv_members_t *self, uint32_t train_count, uint32_t among)
{
    if (among == 0)
        return;
    uint32_t i = 0;
    for (uint32_t k = 0; k < self->n; k++) {
        omv_member_t *m = &self->records[k];
        if (m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER)
            continue;
        uint32_t begin = (uint32_t)((uint64_t)train_count * i / among);
        uint32_t end = (uint32_t)((uint64_t)train_count * (i + 1) / among);
        m->slice_begin = begin;
        m->slice_count = end - begin;
        i++;
    }
}

void omv_members_stop_all(omv_members_t *self, omv_router_t *router, omv_member_state_t from,
                          omv_member_state_t to, const char *reason, int reconnect)
{
    omv_msg_t s = {.type = OMV_MSG_STOP};
    omv_strlcpy(s.u.stop.reason, reason, sizeof(s.u.stop.reason));
    s.u.stop.reconnect = reconnect;
    for (uint32_t i = 0; i < self->n; i++) {
        omv_member_t *m = &self->records[i];
        if (!m->used || m->state != from)
            continue;
        int r = omv_router_send(router, &m->peer, &s, NULL);
        if (r < 0)
            omv_log_debug("cannot send Stop to worker %u: %s", i + 1, omv_strerror(r));
        m->state = to;
    }
}

const char *omv_members_state_name(const omv_member_t *m)
{
    static const char *const names[] = {"alive", "dead", "left", "idle", "done"};
    return names[m->state];
}
