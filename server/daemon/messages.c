/* Messages from workers: registration, leaving, heartbeats, and routing the rest to the run. */
#define OMV_LOG_TAG "daemon"
#include "messages.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "allow.h"
#include "cert.h"
#include "local.h"
#include "log.h"
#include "uplink.h"
#include "coordinator.h"
#include "range.h"
#include "shm.h"
#include "util.h"

/* Messages handled per drain before the loop looks at its other sockets. */
#define DRAIN_MAX 1024
/* Envelopes read from one local worker's connection per turn. */
#define LOCAL_DRAIN_MAX 64
/* Without a job, idle workers are held to the default worker_timeout_s. */
#define IDLE_TIMEOUT_MS 10000

static void send_to(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg)
{
    int r = omv_router_send(d->router, peer, msg, NULL);
    if (r < 0)
        omv_log_debug("cannot send %s: %s", omv_msg_name(msg->type), omv_strerror(r));
}

/* Whether trainers may join the current job (one whose model goes to shard servers waits for
 * them first). */
static int job_open(const omv_daemon_t *d)
{
    omv_job_state_t state = d->run ? omv_run_state(d->run) : OMV_JOB_IDLE;
    return d->run && !OMV_JOB_OVER(state) && state != OMV_JOB_FINISHING &&
           !omv_coord_wants_servers(d->run);
}

/* With CURVE, the key the peer connected with must still be in the allow-list folder, and allow
 * the role it asks for. Returns 1 when it does. */
static int key_fits(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h, const char *who)
{
    if (!d->curve)
        return 1;
    unsigned roles = 0;
    int r = omv_allow_find(d->allow_dir, peer->key, &roles);
    unsigned want = h->role == OMV_ROLE_EVALUATOR ? OMV_CERT_EVALUATOR
                    : h->role == OMV_ROLE_SHARD   ? OMV_CERT_SHARD
                                                  : OMV_CERT_TRAINER;
    static const char *const role_names[] = {"trainer", "evaluator", "shard"};
    if (r == 1 && (roles & want))
        return 1;
    char why[OMV_WIRE_REASON_MAX];
    if (r == 1)
        snprintf(why, sizeof(why),
                 "key %.8s... may not take the role %s (its certificate in %s "
                 "lists roles = \"%s%s%s\")",
                 peer->key, role_names[h->role], d->allow_dir,
                 (roles & OMV_CERT_TRAINER) ? "trainer" : "",
                 roles == (OMV_CERT_TRAINER | OMV_CERT_EVALUATOR) ? "," : "",
                 (roles & OMV_CERT_EVALUATOR) ? "evaluator" : "");
    else
        snprintf(why, sizeof(why), "key %.8s... is no longer in the allow-list folder %s",
                 peer->key, d->allow_dir);
    omv_refusals_add(&d->refusals, peer, OMV_REFUSE_AUTH, who, why);
    return 0;
}

/* Checks a Hello before any record is made. Returns 1 when it may register. */
static int hello_fits(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h,
                      const char *who)
{
    char why[OMV_WIRE_REASON_MAX];
    if (h->protocol_version != OMV_PROTOCOL_VERSION) {
        snprintf(why, sizeof(why),
                 "protocol version %u is not supported: this daemon speaks version %d",
                 h->protocol_version, OMV_PROTOCOL_VERSION);
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_VERSION, who, why);
        return 0;
    }
    if (!key_fits(d, peer, h, who))
        return 0;
    omv_job_state_t state = d->run ? omv_run_state(d->run) : OMV_JOB_IDLE;
    int over = d->run == NULL || OMV_JOB_OVER(state) || state == OMV_JOB_FINISHING;
    if (over && d->cfg.once) {
        /* Nothing to do for it: tell it so rather than leave it waiting. */
        omv_msg_t s = {.type = OMV_MSG_STOP};
        snprintf(s.u.stop.reason, sizeof(s.u.stop.reason), "job '%s' is %s",
                 d->run ? omv_run_job(d->run)->name : "", omv_run_state_names[state]);
        send_to(d, peer, &s);
        return 0;
    }
    omv_refuse_t code;
    if (job_open(d) && !omv_run_may_join(d->run, h->role, why, sizeof(why), &code)) {
        omv_refusals_add(&d->refusals, peer, code, who, why);
        return 0;
    }
    return 1;
}

/* A shard server registers: it gets an id, and the job that waits for servers takes it. */
/* A shard server is gone, and with it the part of a run it held. */
static void lose_server(omv_daemon_t *d, omv_server_t *s)
{
    s->alive = 0;
    d->servers.lost_total++;
    if (d->run)
        omv_coord_server_lost(d->run, s);
    s->run_id = 0;
}

/* A server that registers at the endpoint of one holding a part of a run restarted (systemd's
 * Restart=) or dropped its part: the part it held is gone. */
static void server_restarted(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h)
{
    for (uint32_t i = 0; i < d->servers.n; i++) {
        omv_server_t *s = &d->servers.rec[i];
        if (!s->used || !s->alive || s->run_id == 0 || strcmp(s->endpoint, h->endpoint) != 0)
            continue;
        if (s->pid == h->pid && s->peer.len == peer->len &&
            memcmp(s->peer.id, peer->id, peer->len) == 0)
            continue; /* the same process's hello again (sent while we were away) */
        omv_log_warn("shard server %u (%s) registers again as pid %u (was %u): the part it held "
                     "is gone",
                     i + 1, s->endpoint, h->pid, s->pid);
        lose_server(d, s);
    }
}

static void on_server_hello(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h,
                            const char *who)
{
    if (h->endpoint[0] == '\0') {
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_MALFORMED, who,
                         "a shard server's hello must name the endpoint its workers use");
        return;
    }
    server_restarted(d, peer, h);
    omv_server_t *s = omv_servers_register(&d->servers, peer, h);
    if (s == NULL) {
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_FULL, who,
                         "no shard server record is free (or one at this endpoint holds a job)");
        return;
    }
    omv_msg_t w = {.type = OMV_MSG_WELCOME};
    w.u.welcome.protocol_version = OMV_PROTOCOL_VERSION;
    w.u.welcome.worker_id = omv_servers_id(&d->servers, s);
    w.u.welcome.idle = 1;
    send_to(d, peer, &w);
    omv_log_info("shard server %u (%s) registered: workers reach it at %s", w.u.welcome.worker_id,
                 who, s->endpoint);
    if (d->run && !omv_coord_wants_servers(d->run)) {
        omv_coord_take_backup(d->run);
    } else if (d->run && omv_coord_add_server(d->run, s)) {
        /* The job has its servers: the trainers that waited register again, into it. */
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "job '%s' has its shard servers: register again",
                 omv_run_job(d->run)->name);
        omv_members_stop_all(d->members, d->router, OMV_MEMBER_IDLE, OMV_MEMBER_DONE, why, 1);
    }
}

static void on_hello(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h)
{
    char who[128];
    snprintf(who, sizeof(who), "\"%s\" pid %u", h->hostname, h->pid);
    if (d->shard_role) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why),
                 "this is a shard server: register with the coordinator at %s, which names us",
                 d->cfg.coordinator);
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_ROLE, who, why);
        return;
    }
    if (h->role == OMV_ROLE_SHARD) {
        if (h->protocol_version == OMV_PROTOCOL_VERSION && key_fits(d, peer, h, who))
            on_server_hello(d, peer, h, who);
        else if (h->protocol_version != OMV_PROTOCOL_VERSION)
            hello_fits(d, peer, h, who); /* refused, with the reason */
        return;
    }
    if (!hello_fits(d, peer, h, who))
        return;
    /* A long-running daemon without a job keeps it until a job comes (Stop with reconnect). */
    int idle = !job_open(d);
    int rejoin;
    omv_member_t *m = omv_members_register(d->members, peer, h, idle, &rejoin);
    if (m == NULL) {
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_FULL, who, "no member record is free");
        return;
    }
    omv_msg_t w = {.type = OMV_MSG_WELCOME};
    w.u.welcome.protocol_version = OMV_PROTOCOL_VERSION;
    w.u.welcome.worker_id = omv_members_id(d->members, m);
    if (idle) {
        w.u.welcome.idle = 1;
        omv_log_info("%s %u (%s) registered; no job to run: it waits for the next one",
                     h->role == OMV_ROLE_TRAINER ? "worker" : "evaluator", w.u.welcome.worker_id,
                     who);
        send_to(d, peer, &w);
        return;
    }
    if (omv_run_join(d->run, m, rejoin, who, &w.u.welcome))
        return;                     /* welcomed at the next cut */
    if (w.u.welcome.n_servers == 0) /* the servers hold the model: nothing to share here */
        omv_local_offer(&d->local, m, &w.u.welcome);
    send_to(d, peer, &w);
    omv_run_joined(d->run);
}

static void on_leave(omv_daemon_t *d, omv_member_t *m, const omv_leave_t *l)
{
    omv_log_info("worker %u (\"%s\" pid %u) left: \"%s\"", omv_members_id(d->members, m), m->host,
                 m->pid, l->reason);
    d->members->leaves_total++;
    if (d->run)
        omv_run_member_gone(d->run, m, OMV_MEMBER_LEFT);
    else
        m->state = OMV_MEMBER_LEFT;
}

/* The worker id a message names; 0 for a Hello, -1 for a message no worker may send. */
static int64_t message_worker(const omv_msg_t *msg)
{
    switch (msg->type) {
    case OMV_MSG_HELLO:
        return 0;
    case OMV_MSG_PULL:
        return msg->u.pull.worker_id;
    case OMV_MSG_PUSH:
        return msg->u.push.worker_id;
    case OMV_MSG_HEARTBEAT:
        return msg->u.heartbeat.worker_id;
    case OMV_MSG_EVAL_RESULT:
        return msg->u.eval_result.worker_id;
    case OMV_MSG_LEAVE:
        return msg->u.leave.worker_id;
    case OMV_MSG_ATTACH:
        return msg->u.attach.worker_id;
    case OMV_MSG_REPORT:
        return msg->u.report.worker_id;
    case OMV_MSG_SERVER:
        return msg->u.server.server_id;
    default:
        return -1;
    }
}

/* The member a message comes from, or NULL when it was refused or dropped. */
static omv_member_t *sender(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg,
                            uint32_t id)
{
    omv_member_t *m = omv_members_find(d->members, peer, id);
    char why[OMV_WIRE_REASON_MAX];
    if (m == NULL) {
        if (msg->type == OMV_MSG_LEAVE || omv_members_from_finished_job(d->members, peer, id))
            return NULL; /* gone already */
        snprintf(why, sizeof(why),
                 "%s from worker id %u, which is not registered from this peer (or was declared "
                 "dead): register again",
                 omv_msg_name(msg->type), id);
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_UNKNOWN_WORKER, "a peer", why);
        return NULL;
    }
    m->last_seen_ms = omv_time_ms();
    if (m->state == OMV_MEMBER_IDLE && msg->type != OMV_MSG_HEARTBEAT &&
        msg->type != OMV_MSG_LEAVE) {
        omv_log_debug("dropped %s from idle worker %u", omv_msg_name(msg->type), id);
        return NULL;
    }
    return m;
}

/* A shard server's heartbeat or answer. Returns 1 when msg came from one (handled). */
static int from_server(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg, uint32_t id)
{
    if (d->shard_role || (msg->type != OMV_MSG_HEARTBEAT && msg->type != OMV_MSG_SERVER))
        return 0;
    omv_server_t *s = omv_servers_find(&d->servers, peer, id);
    if (s == NULL)
        return 0;
    s->last_seen_ms = omv_time_ms();
    if (msg->type == OMV_MSG_HEARTBEAT) {
        send_to(d, peer, msg);
    } else if (msg->u.server.op == OMV_SERVER_STATS &&
               msg->u.server.state == OMV_SERVER_STATS_DROPPED) {
        omv_log_warn("shard server %u (%s) dropped its part: it is taken for gone", id,
                     s->endpoint);
        if (s->run_id != 0)
            lose_server(d, s);
        s->alive = 1; /* it stays registered, free, and is not taken again at once */
        s->joined_ms = omv_time_ms();
    } else if (msg->u.server.op == OMV_SERVER_STATS) {
        /* Its heartbeat: answered, so that it knows the coordinator is alive too. */
        omv_servers_stats(s, &msg->u.server);
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = id;
        send_to(d, peer, &hb);
    } else if (msg->u.server.op == OMV_SERVER_FROZEN && d->run) {
        omv_coord_frozen(d->run, s, &msg->u.server);
    } else if (msg->u.server.op == OMV_SERVER_NEED_RANGE && d->run) {
        char why[OMV_WIRE_REASON_MAX];
        if (omv_range_send(d->run, s, &msg->u.server, why, sizeof(why)) < 0)
            omv_run_finish(d->run, OMV_JOB_FAILED, why);
    } else if (msg->u.server.op == OMV_SERVER_GATHERED && d->run) {
        size_t bytes;
        const void *payload = omv_router_payload(d->router, &bytes);
        omv_coord_gathered(d->run, s, &msg->u.server, payload, bytes);
    }
    return 1;
}

void omv_messages_dispatch(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg)
{
    int64_t id = message_worker(msg);
    if (id >= 0 && from_server(d, peer, msg, (uint32_t)id))
        return;
    if (d->shard_role && msg->type == OMV_MSG_ATTACH) {
        omv_uplink_attach(d->uplink, peer, &msg->u.attach);
        return;
    }
    if (msg->type == OMV_MSG_SERVER || msg->type == OMV_MSG_ATTACH ||
        (d->shard_role && (msg->type == OMV_MSG_REPORT || msg->type == OMV_MSG_EVAL_RESULT))) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "%s is not for this %s", omv_msg_name(msg->type),
                 d->shard_role ? "shard server" : "daemon (from this peer)");
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_MALFORMED, "a peer", why);
        return;
    }
    if (id < 0) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "a worker may not send %s", omv_msg_name(msg->type));
        omv_refusals_add(&d->refusals, peer, OMV_REFUSE_MALFORMED, "a peer", why);
        return;
    }
    if (msg->type == OMV_MSG_HELLO) {
        on_hello(d, peer, &msg->u.hello);
        return;
    }
    omv_member_t *m = sender(d, peer, msg, (uint32_t)id);
    if (m == NULL)
        return;
    if (msg->type == OMV_MSG_LEAVE) {
        on_leave(d, m, &msg->u.leave);
    } else if (msg->type == OMV_MSG_HEARTBEAT) {
        /* Answered, so that a waiting worker knows the daemon is alive. */
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = (uint32_t)id;
        send_to(d, &m->peer, &hb);
    } else if (d->run == NULL) {
        /* An alive member always belongs to a run. */
    } else if (msg->type == OMV_MSG_PULL) {
        omv_run_pull(d->run, m, &msg->u.pull);
    } else if (msg->type == OMV_MSG_PUSH) {
        omv_run_push(d->run, m, &msg->u.push);
    } else if (msg->type == OMV_MSG_REPORT) {
        omv_coord_report(d->run, m, &msg->u.report);
    } else {
        omv_run_eval_result(d->run, m, &msg->u.eval_result);
    }
}

void omv_messages_drain(omv_daemon_t *d)
{
    for (int n = 0; n < DRAIN_MAX; n++) {
        omv_peer_t peer;
        omv_msg_t msg;
        char why[OMV_WIRE_REASON_MAX];
        int r = omv_router_recv(d->router, &peer, &msg, why);
        if (r == -EAGAIN || r == -EINTR)
            break;
        if (r == -EPROTO) {
            omv_refusals_add(&d->refusals, &peer, OMV_REFUSE_MALFORMED, "a peer", why);
            continue;
        }
        if (r < 0) {
            omv_log_error("receive failed: %s", omv_strerror(r));
            break;
        }
        omv_messages_dispatch(d, &peer, &msg);
    }
}

/* What member i may send on its connection: its own pulls, pushes whose values are in its
 * segment, and its Leave. Returns 1, or 0 with the reason in why. */
static int allowed(uint32_t i, const omv_msg_t *msg, char *why)
{
    uint32_t id = msg->type == OMV_MSG_PULL    ? msg->u.pull.worker_id
                  : msg->type == OMV_MSG_PUSH  ? msg->u.push.worker_id
                  : msg->type == OMV_MSG_LEAVE ? msg->u.leave.worker_id
                                               : 0;
    if (id == i + 1 && (msg->type != OMV_MSG_PUSH || msg->u.push.wire == OMV_WIRE_SHM))
        return 1;
    snprintf(why, OMV_WIRE_REASON_MAX,
             "%s%s for worker id %u on the shared-memory connection of worker %u: only its own "
             "pulls, shared-memory pushes and leave go that way",
             omv_msg_name(msg->type),
             msg->type == OMV_MSG_PUSH && msg->u.push.wire != OMV_WIRE_SHM ? " with values" : "",
             id, i + 1);
    return 0;
}

/* Handles what member i sent on its connection, a bounded number of envelopes. */
static void drain_local(omv_daemon_t *d, uint32_t i)
{
    for (int k = 0; k < LOCAL_DRAIN_MAX; k++) {
        omv_member_t *m = &d->members->records[i];
        if (!m->shm_on)
            return;
        omv_msg_t msg;
        char why[OMV_WIRE_REASON_MAX];
        int r = omv_shm_recv_msg(m->shm_conn, &msg, why);
        if (r == -EAGAIN || r == -EINTR)
            return;
        if (r == -EPROTO || (r == 0 && !allowed(i, &msg, why))) {
            omv_refusals_add(&d->refusals, &m->peer, OMV_REFUSE_MALFORMED, "a local worker", why);
            continue;
        }
        if (r < 0) { /* closed, or broken: its process is gone or cannot use it */
            omv_local_gone(d, i);
            return;
        }
        omv_messages_dispatch(d, &m->peer, &msg);
    }
}

void omv_messages_drain_local(omv_daemon_t *d, const struct pollfd *fds, const uint32_t *who, int n)
{
    int any = 0;
    for (int k = 0; k < n; k++)
        if (fds[k].revents != 0) {
            drain_local(d, who[k]);
            any = 1;
        }
    if (any && d->run)
        omv_run_progress(d->run);
}

/* A trainer that only sends heartbeats holds its group's step for good: one of a running job
 * that has pushed nothing for the job's progress_timeout_s, since it joined or the job started
 * and while no pull of its waits for another group, is given up as a silent one is. */
static int stalled(const omv_run_t *r, const omv_member_t *m, int64_t now, double *ret_s)
{
    if (r == NULL || omv_run_state(r) != OMV_JOB_RUNNING || m->state != OMV_MEMBER_ALIVE ||
        m->role != OMV_ROLE_TRAINER || m->parked)
        return 0;
    omv_run_view_t v;
    omv_run_view(r, &v);
    if (v.holding)
        return 0; /* a failover holds every trainer until its cut is in */
    /* Since it was last given work: a member served just now (as another's death completes
     * its group's step) has had no time to push. */
    int64_t since = m->last_push_ms > m->joined_ms ? m->last_push_ms : m->joined_ms;
    since = m->served_ms > since ? m->served_ms : since;
    int64_t start = (int64_t)(v.times->start_s * 1000.0);
    since = since > start ? since : start;
    *ret_s = (double)(now - since) / 1000.0;
    return *ret_s > v.job->progress_timeout_s;
}

static void expire_servers(omv_daemon_t *d, int64_t now)
{
    for (uint32_t i = 0; i < d->servers.n; i++) {
        omv_server_t *s = &d->servers.rec[i];
        if (!s->alive || now - s->last_seen_ms <= (int64_t)(d->cfg.server_timeout_s * 1000))
            continue;
        omv_log_warn("shard server %u (%s) silent for %.1f s: declared gone", i + 1, s->endpoint,
                     (double)(now - s->last_seen_ms) / 1000.0);
        lose_server(d, s);
    }
}

/* The daemon's own stall (a checkpoint of a large model written, its model gathered) is not its
 * peers' silence: what they sent meanwhile waits unread. A look that comes over a second late
 * credits every member and server with the time it was late by. */
static void credit_stall(omv_daemon_t *d, int64_t now)
{
    int64_t late = d->expire_ms > 0 ? now - d->expire_ms - EXPIRE_PERIOD_MS : 0;
    d->expire_ms = now;
    if (late < 1000)
        return;
    omv_log_info("the daemon was busy for %.1f s: its peers' silence meanwhile does not count",
                 (double)late / 1000.0);
    for (uint32_t i = 0; i < d->members->n; i++)
        d->members->records[i].last_seen_ms += late;
    for (uint32_t i = 0; i < d->servers.n; i++)
        d->servers.rec[i].last_seen_ms += late;
}

void omv_messages_expire(omv_daemon_t *d)
{
    int64_t now = omv_time_ms();
    credit_stall(d, now);
    expire_servers(d, now);
    int64_t timeout = d->run ? omv_run_worker_timeout_ms(d->run) : IDLE_TIMEOUT_MS;
    int job_on = d->run && !OMV_JOB_OVER(omv_run_state(d->run));
    for (uint32_t i = 0; i < d->members->n; i++) {
        omv_member_t *m = &d->members->records[i];
        double idle_s = 0;
        if (stalled(d->run, m, now, &idle_s)) {
            omv_log_warn("worker %u (\"%s\" pid %u) pushed no gradient for %.1f s (heartbeats "
                         "alone hold no place): declared dead",
                         i + 1, m->host, m->pid, idle_s);
        } else if (!((m->state == OMV_MEMBER_ALIVE && job_on) || m->state == OMV_MEMBER_IDLE) ||
                   now - m->last_seen_ms <= timeout) {
            continue;
        } else {
            omv_log_warn("worker %u (\"%s\" pid %u) silent for %.1f s: declared dead", i + 1,
                         m->host, m->pid, (double)(now - m->last_seen_ms) / 1000.0);
        }
        d->members->deaths_total++;
        if (d->run)
            omv_run_member_gone(d->run, m, OMV_MEMBER_DEAD);
        else
            m->state = OMV_MEMBER_DEAD;
    }
}
