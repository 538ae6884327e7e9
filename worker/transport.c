/* The worker's links to the daemon and to shard servers: sending, waiting with heartbeats, and
 * registering. */
#define OMV_LOG_TAG "worker"
#include "transport.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

void omv_transport_init(omv_transport_t *self, const omv_session_config_t *cfg,
                        volatile sig_atomic_t *stop)
{
    memset(self, 0, sizeof(*self));
    self->cfg = cfg;
    self->stop = stop;
    omv_shmlink_init(&self->shm, cfg);
}

static void servers_close(omv_transport_t *t, int flush)
{
    for (uint32_t i = 0; i < t->n_servers + t->n_backups; i++)
        if (flush)
            omv_link_destroy(&t->links[1 + i]);
        else
            omv_link_abandon(&t->links[1 + i]);
    t->n_servers = t->n_backups = 0;
    memset(t->shard_backup, 0, sizeof(t->shard_backup));
    t->backup_warned = 0;
}

void omv_transport_fini(omv_transport_t *self)
{
    omv_shmlink_fini(&self->shm);
    servers_close(self, 1);
    omv_link_destroy(&self->link);
}

/* Sends what waits for the shared-memory link: nothing we wait for can come before it, nor may
 * anything we send over a socket overtake it. */
static void flush_held(omv_transport_t *t)
{
    omv_shmlink_flush(&t->shm, t->link, t->worker_id);
}

/* Sends m on link: to the daemon, the shared-memory link takes what goes its way (it decides);
 * anything else goes at once on the socket, after what it held. */
static int send_on(omv_transport_t *t, omv_link_t *link, const omv_msg_t *m, const void *payload)
{
    if (link == t->link && omv_shmlink_hold(&t->shm, m, t->link, t->worker_id))
        return 0;
    flush_held(t);
    int r = omv_link_send(link, m, payload);
    if (r < 0)
        omv_log_error("cannot send %s: %s", omv_msg_name(m->type), omv_strerror(r));
    if (link == t->link)
        t->last_sent_ms = omv_time_ms(); /* heartbeats are the daemon's */
    return r;
}

int omv_transport_send(omv_transport_t *self, const omv_msg_t *m, const void *payload)
{
    return send_on(self, self->link, m, payload);
}

int omv_transport_send_server(omv_transport_t *self, uint32_t i, const omv_msg_t *m,
                              const void *payload)
{
    return send_on(self, self->links[1 + i], m, payload);
}

int omv_transport_push(omv_transport_t *self, uint32_t shard, const omv_msg_t *m,
                       const void *values)
{
    if (self->shard_backup[shard]) {
        int r = omv_link_send(self->links[self->shard_backup[shard]], m, values);
        if (r == -EAGAIN && !self->backup_warned)
            omv_log_warn("worker %u: the backup of shard %u is not connected: its gradients are "
                         "dropped until the coordinator fails over",
                         self->worker_id, shard);
        self->backup_warned |= r == -EAGAIN;
        if (r < 0 && r != -EAGAIN) {
            omv_log_error("cannot send %s to a backup: %s", omv_msg_name(m->type), omv_strerror(r));
            return r;
        }
    }
    omv_link_t *to = self->n_servers ? self->links[1 + self->shard_server[shard]] : self->link;
    return send_on(self, to, m, values);
}

void omv_transport_leave(omv_transport_t *self, const char *reason)
{
    if (self->worker_id == 0 || self->link == NULL)
        return;
    omv_msg_t m = {.type = OMV_MSG_LEAVE};
    m.u.leave.worker_id = self->worker_id;
    omv_strlcpy(m.u.leave.reason, reason, sizeof(m.u.leave.reason));
    omv_transport_send(self, &m, NULL);
}

void omv_transport_heartbeat(omv_transport_t *self)
{
    /* What the shared-memory link took counts as much as what went on the socket. */
    int64_t sent = self->last_sent_ms > self->shm.sent_ms ? self->last_sent_ms : self->shm.sent_ms;
    if (self->worker_id != 0 && omv_time_ms() - sent >= self->cfg->heartbeat_ms) {
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = self->worker_id;
        omv_transport_send(self, &hb, NULL);
    }
}

void omv_transport_tick(void *ctx)
{
    omv_transport_heartbeat(ctx);
}

/* Waits up to wait ms for a message from the daemon (on its socket, or on the shared-memory
 * link) or a shard server; t->from says which link. */
static int recv_any(omv_transport_t *t, omv_msg_t *m, int wait, char *why)
{
    flush_held(t);
    if (t->n_servers == 0) {
        t->from = t->link;
        if (!t->shm.on)
            return omv_link_recv(t->link, m, wait, why);
        if (wait > 0 && t->cfg->spin_us > 0) {
            int r = omv_shmlink_spin(&t->shm, m, why, t->worker_id);
            if (r != -EAGAIN || !t->shm.on)
                return r;
        }
        int i = omv_link_poll_fd(&t->link, 1, t->shm.conn, wait);
        if (i < 0)
            return i;
        return i == 1 ? omv_shmlink_recv(&t->shm, m, why, t->worker_id)
                      : omv_link_recv(t->link, m, 0, why);
    }
    t->links[0] = t->link;
    int i = omv_link_poll(t->links, 1 + (int)(t->n_servers + t->n_backups), wait);
    if (i < 0)
        return i;
    t->from = t->links[i];
    return omv_link_recv(t->from, m, 0, why);
}

/* What an Error from the daemon means for us. Returns as omv_transport_wait, or -EAGAIN to go on
 * waiting. */
static int refused(const omv_error_t *e)
{
    switch (e->code) {
    case OMV_REFUSE_NOT_FINITE:
    case OMV_REFUSE_NORM:
        /* The daemon dropped our gradient; the model is intact and the step goes on. */
        omv_log_warn("daemon refused a gradient: \"%s\"", e->reason);
        return -EAGAIN;
    case OMV_REFUSE_UNKNOWN_WORKER:
    case OMV_REFUSE_STEP:
        /* It declared us dead, restarted, or moved on without us: join again. */
        omv_log_warn("daemon refused us (%s): \"%s\"; registering again", omv_refuse_name(e->code),
                     e->reason);
        return OMV_WAIT_LOST;
    default:
        omv_log_error("daemon refused us (%s): \"%s\"", omv_refuse_name(e->code), e->reason);
        return -EPROTO;
    }
}

/* What a message means for the wait: heartbeats and refused gradients go on waiting (-EAGAIN),
 * Stop ends it; anything else is for the caller (0). */
static int handle(const omv_msg_t *m)
{
    switch (m->type) {
    case OMV_MSG_HEARTBEAT:
        return -EAGAIN;
    case OMV_MSG_STOP:
        if (m->u.stop.reconnect) {
            omv_log_info("daemon says \"%s\": registering again", m->u.stop.reason);
            return OMV_WAIT_LOST;
        }
        omv_log_info("daemon says stop: \"%s\"", m->u.stop.reason);
        return OMV_WAIT_DONE;
    case OMV_MSG_ERROR:
        return refused(&m->u.error);
    default:
        return 0;
    }
}

int omv_transport_wait(omv_transport_t *self, omv_msg_t *m, int64_t deadline_ms)
{
    char why[OMV_WIRE_REASON_MAX];
    int64_t since = omv_time_ms();
    for (;;) {
        if (*self->stop)
            return -EINTR;
        int64_t now = omv_time_ms();
        if (deadline_ms > 0 && now >= deadline_ms)
            return -ETIMEDOUT;
        int64_t heard = self->last_recv_ms > since ? self->last_recv_ms : since;
        if (self->worker_id != 0 && now - heard > self->cfg->server_timeout_ms) {
            omv_log_warn("no word from the daemon for %.1f s: registering again",
                         (double)(now - heard) / 1000.0);
            return OMV_WAIT_LOST;
        }
        int wait = self->cfg->heartbeat_ms;
        if (deadline_ms > 0 && deadline_ms - now < wait)
            wait = (int)(deadline_ms - now);
        int r = recv_any(self, m, wait, why);
        if (r == -EAGAIN || r == -EINTR) {
            omv_transport_heartbeat(self);
            continue;
        }
        if (r == -EPROTO) {
            omv_log_warn("ignoring a malformed message from the daemon: %s", why);
            continue;
        }
        if (r < 0)
            return r;
        self->last_recv_ms = omv_time_ms();
        r = handle(m);
        if (r != -EAGAIN)
            return r;
    }
}

uint32_t omv_transport_from(const omv_transport_t *self)
{
    for (uint32_t i = 1; i < 1 + self->n_servers + self->n_backups; i++)
        if (self->links[i] == self->from)
            return i;
    return 0;
}

const void *omv_transport_payload(const omv_transport_t *self, size_t *ret_len)
{
    return omv_link_payload(self->from, ret_len);
}

/* Attaches to a shard server: Attach until it answers (the daemon may not have told it of us
 * yet), for up to 10 s. Returns 0, or -ETIMEDOUT / -EPROTO after logging why. */
static int attach_one(omv_transport_t *t, omv_link_t *link, const char *endpoint, uint64_t token)
{
    int64_t deadline = omv_time_ms() + 10000;
    char why[OMV_WIRE_REASON_MAX] = "no answer";
    while (omv_time_ms() < deadline && !*t->stop) {
        omv_msg_t m = {.type = OMV_MSG_ATTACH};
        m.u.attach = (omv_attach_t){t->worker_id, token};
        int e = omv_link_send(link, &m, NULL);
        if (e < 0 && e != -EAGAIN) {
            omv_log_error("cannot send %s to %s: %s", omv_msg_name(m.type), endpoint,
                          omv_strerror(e));
            return -EPROTO;
        }
        /* -EAGAIN: a lossy link is not connected yet; again after a pause. */
        int r = e == 0 ? omv_link_recv(link, &m, 500, why) : -EAGAIN;
        if (r == 0 && m.type == OMV_MSG_HEARTBEAT)
            return 0;
        if (r == 0 && m.type == OMV_MSG_ERROR)
            omv_strlcpy(why, m.u.error.reason, sizeof(why));
        if (r == 0 && m.type == OMV_MSG_ERROR && m.u.error.code != OMV_REFUSE_UNKNOWN_WORKER)
            break;
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
    omv_log_error("cannot attach to the shard server at %s: %s", endpoint, why);
    return -ETIMEDOUT;
}

/* A link to shard server v, attached, as links[1 + i]. Returns 0 or a negative errno after
 * logging why. */
static int open_server(omv_transport_t *t, const omv_server_info_t *v, uint32_t i, uint64_t token,
                       int backup)
{
    const omv_link_curve_t *curve = t->cfg->curve;
    omv_link_curve_t c = {v->public_key, curve ? curve->public_key : NULL,
                          curve ? curve->secret_key : NULL};
    if (v->public_key[0] && curve == NULL) {
        omv_log_error("shard server %s takes CURVE connections: give this worker its keys",
                      v->endpoint);
        return -EPROTO;
    }
    /* A backup that is gone must not hold our gradients back: it is dropped, and the
     * coordinator fails over. */
    const omv_link_curve_t *cc = v->public_key[0] ? &c : NULL;
    t->links[1 + i] = backup ? omv_link_new_lossy(v->endpoint, cc) : omv_link_new(v->endpoint, cc);
    if (t->links[1 + i] == NULL) {
        int e = -errno;
        omv_log_error("cannot connect to shard server %s: %s", v->endpoint, omv_strerror(e));
        return e;
    }
    return attach_one(t, t->links[1 + i], v->endpoint, token);
}

/* The model is on shard servers: a link to each (and to each backup), attached, and which
 * holds which shard. */
static int servers_open(omv_transport_t *t, const omv_welcome_t *w)
{
    servers_close(t, 0);
    if (w->n_servers == 0)
        return 0;
    if (w->servers[w->n_servers - 1].last_shard != w->job.n_shards) {
        omv_log_error("the daemon's shard servers hold %u shards, the job has %u",
                      w->servers[w->n_servers - 1].last_shard, w->job.n_shards);
        return -EPROTO;
    }
    for (uint32_t i = 0; i < w->n_servers; i++) {
        const omv_server_info_t *v = &w->servers[i];
        t->n_servers = i + 1;
        for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
            t->shard_server[sh] = (uint8_t)i;
        int r = open_server(t, v, i, w->attach_token, 0);
        if (r < 0)
            return r;
    }
    for (uint32_t k = 0; k < w->n_backups; k++) {
        const omv_server_info_t *v = &w->backups[k];
        t->n_backups = k + 1;
        for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
            t->shard_backup[sh] = (uint8_t)(1 + t->n_servers + k);
        int r = open_server(t, v, t->n_servers + k, w->attach_token, 1);
        if (r < 0) {
            /* Not fatal: the backup misses our gradients and the coordinator replaces it. */
            omv_log_warn("worker %u: no backup at %s: its shards go to their primary only",
                         t->worker_id, v->endpoint);
            for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
                t->shard_backup[sh] = 0;
        }
    }
    omv_log_info("worker %u: the model is on %u shard servers%s; %s them", t->worker_id,
                 t->n_servers, t->n_backups ? ", with a backup of each" : "",
                 t->cfg->role == OMV_ROLE_TRAINER ? "pulling from and pushing to"
                                                  : "evaluating what comes from");
    return 0;
}

int omv_transport_attach(omv_transport_t *self, const omv_welcome_t *w)
{
    omv_shmlink_attach(&self->shm, w, self->worker_id);
    return servers_open(self, w);
}

int omv_transport_connect(omv_transport_t *self)
{
    if (self->link != NULL)
        return 0;
    self->link = omv_link_new(self->cfg->endpoint, self->cfg->curve);
    if (self->link == NULL) {
        int e = -errno;
        omv_log_error("cannot connect to '%s': %s", self->cfg->endpoint, omv_strerror(e));
        return e;
    }
    return 0;
}

static void hello_msg(const omv_transport_t *t, omv_msg_t *m)
{
    const omv_session_config_t *cfg = t->cfg;
    *m = (omv_msg_t){.type = OMV_MSG_HELLO};
    m->u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    m->u.hello.role = cfg->role;
    m->u.hello.pid = (uint32_t)getpid();
    m->u.hello.threads = (uint32_t)cfg->threads;
    m->u.hello.previous_worker_id = t->previous_id;
    if (cfg->name)
        omv_strlcpy(m->u.hello.name, cfg->name, sizeof(m->u.hello.name));
    if (gethostname(m->u.hello.hostname, sizeof(m->u.hello.hostname)) != 0)
        omv_strlcpy(m->u.hello.hostname, "unknown", sizeof(m->u.hello.hostname));
    m->u.hello.hostname[sizeof(m->u.hello.hostname) - 1] = '\0';
}

int omv_transport_hello(omv_transport_t *self, int64_t deadline_ms,
                        const omv_transport_retry_t *retry, omv_welcome_t *ret)
{
    int64_t now = omv_time_ms();
    int wait = retry->attempt == 0 ? 2000 : 1000 + retry->delay_ms;
    if (deadline_ms > 0 && deadline_ms - now < wait)
        wait = (int)(deadline_ms - now) > 1 ? (int)(deadline_ms - now) : 1;
    omv_msg_t m;
    hello_msg(self, &m);
    self->worker_id = 0;
    int r = omv_transport_send(self, &m, NULL);
    if (r < 0)
        return r;
    r = omv_transport_wait(self, &m, omv_time_ms() + wait);
    if (r == OMV_WAIT_LOST)
        return -ETIMEDOUT; /* a daemon on its way out: try again */
    if (r != 0)
        return r;
    if (m.type != OMV_MSG_WELCOME) {
        omv_log_error("expected welcome from the daemon, got %s", omv_msg_name(m.type));
        return -EPROTO;
    }
    if (m.u.welcome.protocol_version != OMV_PROTOCOL_VERSION) {
        omv_log_error(
            "daemon speaks protocol version %u, this worker speaks %d: upgrade one of them",
            m.u.welcome.protocol_version, OMV_PROTOCOL_VERSION);
        return -EPROTO;
    }
    self->worker_id = m.u.welcome.worker_id;
    *ret = m.u.welcome;
    return 0;
}

int omv_transport_backoff(omv_transport_t *self, int64_t deadline_ms, omv_transport_retry_t *retry)
{
    const char *endpoint = self->cfg->endpoint;
    if (deadline_ms > 0 && omv_time_ms() >= deadline_ms) {
        omv_log_error("no answer from the daemon at %s: is omnivored running?", endpoint);
        return -ETIMEDOUT;
    }
    if (retry->attempt == 0 || retry->attempt % 10 == 0)
        omv_log_warn("no answer from the daemon at %s yet; trying again", endpoint);
    /* A fresh socket each time: nothing stale queued for a daemon that is gone. */
    omv_link_abandon(&self->link);
    int delay_ms = retry->delay_ms;
    struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && !*self->stop)
        ;
    if (*self->stop)
        return -EINTR;
    retry->delay_ms = delay_ms * 2 > 5000 ? 5000 : delay_ms * 2;
    retry->attempt++;
    return 0;
}

void omv_transport_drop(omv_transport_t *self)
{
    self->previous_id = self->worker_id;
    self->worker_id = 0;
    servers_close(self, 0);
    omv_link_abandon(&self->link);
}
