/* The shard server's link to its coordinator, and workers attaching. */
#define OMV_LOG_TAG "shard"
#include "uplink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cert.h"
#include "log.h"
#include "range.h"
#include "util.h"

/* Hello again this often until the coordinator answers; heartbeats this often after. */
#define HELLO_MS 2000
#define HEARTBEAT_MS 1000

static void up_send(omv_daemon_t *d, const omv_msg_t *msg)
{
    int r = omv_router_up_send(d->router, msg, NULL);
    if (r < 0)
        omv_log_debug("cannot send %s to the coordinator: %s", omv_msg_name(msg->type),
                      omv_strerror(r));
    d->up_sent_ms = omv_time_ms();
}

/* The coordinator's public certificate, and ours, for CURVE on the upstream link. */
static int upstream_keys(omv_daemon_t *d, omv_upstream_curve_t *c, char *server, char *pub,
                         char *sec)
{
    char err[OMV_CONFIG_ERR_MAX] = "";
    omv_cert_t theirs = {.secret_key = ""}, ours = {.secret_key = ""};
    if (omv_cert_read(d->coordinator_key, &theirs, err) < 0 ||
        omv_cert_read(d->secret_key_path, &ours, err) < 0 || ours.secret_key[0] == '\0') {
        omv_log_error("CURVE to the coordinator needs its public certificate ([security] "
                      "coordinator_key) and ours ([security] secret_key): %s",
                      err[0] ? err : "no secret key");
        return -EACCES;
    }
    omv_strlcpy(server, theirs.public_key, OMV_CERT_KEY_LEN + 1);
    omv_strlcpy(pub, ours.public_key, OMV_CERT_KEY_LEN + 1);
    omv_strlcpy(sec, ours.secret_key, OMV_CERT_KEY_LEN + 1);
    memset(&ours, 0, sizeof(ours));
    *c = (omv_upstream_curve_t){server, pub, sec};
    return 0;
}

int omv_part_setup(omv_daemon_t *d)
{
    const omv_daemon_config_t *cfg = &d->cfg;
    if (cfg->coordinator[0] == '\0') {
        omv_log_error("role shard needs the coordinator's endpoint: --coordinator tcp://HEAD:PORT "
                      "([daemon] coordinator)");
        return -EINVAL;
    }
    const char *adv = cfg->advertise[0] ? cfg->advertise : cfg->endpoint;
    if (strstr(adv, "://*") || strstr(adv, "://0.0.0.0")) {
        omv_log_error("workers cannot connect to %s: give the endpoint they should use with "
                      "--advertise tcp://HOST:PORT ([daemon] advertise)",
                      adv);
        return -EINVAL;
    }
    omv_strlcpy(d->advertise, adv, sizeof(d->advertise));
    /* A backup's refusals are its primary's to answer; they are counted all the same. */
    omv_refusals_init(&d->backup_refusals, d->router);
    d->backup_refusals.quiet = 1;
    omv_upstream_curve_t c;
    char server[OMV_CERT_KEY_LEN + 1], pub[OMV_CERT_KEY_LEN + 1], sec[OMV_CERT_KEY_LEN + 1];
    int curve = d->curve || strncmp(cfg->coordinator, "tcp://", 6) == 0;
    if (strcmp(cfg->curve, "no") == 0)
        curve = 0;
    int r = curve ? upstream_keys(d, &c, server, pub, sec) : 0;
    if (r == 0)
        r = omv_router_upstream(d->router, cfg->coordinator, curve ? &c : NULL);
    memset(sec, 0, sizeof(sec));
    if (r < 0) {
        omv_log_error("cannot connect to the coordinator at %s: %s", cfg->coordinator,
                      omv_strerror(r));
        return r;
    }
    omv_strlcpy(d->public_key, curve ? pub : "", sizeof(d->public_key));
    omv_log_info("shard server: coordinator %s, workers reach us at %s%s", cfg->coordinator,
                 d->advertise, curve ? " (CURVE)" : "");
    return 0;
}

static void hello(omv_daemon_t *d)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    omv_hello_t *h = &m.u.hello;
    h->protocol_version = OMV_PROTOCOL_VERSION;
    h->role = OMV_ROLE_SHARD;
    h->pid = (uint32_t)getpid();
    if (gethostname(h->hostname, sizeof(h->hostname)) != 0)
        omv_strlcpy(h->hostname, "unknown", sizeof(h->hostname));
    h->hostname[sizeof(h->hostname) - 1] = '\0';
    omv_strlcpy(h->endpoint, d->advertise, sizeof(h->endpoint));
    omv_strlcpy(h->public_key, d->public_key, sizeof(h->public_key));
    up_send(d, &m);
    d->up_hello_ms = omv_time_ms();
}

/* The job is over, or the coordinator is gone: the part goes, and so do its members. */
static void drop_part(omv_daemon_t *d, const char *why)
{
    if (d->run == NULL)
        return;
    omv_log_info("job '%s': %s; dropping shards [%u, %u)", d->run->job.name, why,
                 d->run->part.first, d->run->part.last);
    if (!OMV_JOB_OVER(d->run->state))
        omv_run_finish(d->run, OMV_JOB_STOPPED, why);
    omv_run_destroy(&d->run);
    for (uint32_t i = 0; i < d->members->n; i++)
        d->members->records[i].state = OMV_MEMBER_DONE;
    for (uint32_t i = 0; i < d->n_deferred; i++)
        free(d->deferred[i].payload);
    d->n_deferred = 0;
    d->defer_on = 0;
}

void omv_part_cron(omv_daemon_t *d)
{
    int64_t now = omv_time_ms();
    /* A coordinator silent this long is taken for gone: the part of its job is dropped. */
    if (d->server_id != 0 &&
        now - d->up_heard_ms > (int64_t)(d->cfg.coordinator_timeout_s * 1000)) {
        omv_log_warn("no word from the coordinator for %.0f s: registering again",
                     (double)(now - d->up_heard_ms) / 1000.0);
        drop_part(d, "the coordinator went quiet");
        d->server_id = 0;
    }
    if (d->server_id == 0 && now - d->up_hello_ms >= HELLO_MS) {
        hello(d);
    } else if (d->server_id != 0 && now - d->up_sent_ms >= HEARTBEAT_MS) {
        /* Our counters, which are our heartbeat too. */
        omv_msg_t st = {.type = OMV_MSG_SERVER};
        omv_server_msg_t *u = &st.u.server;
        u->op = OMV_SERVER_STATS;
        u->server_id = d->server_id;
        if (d->run) {
            u->first_shard = d->run->part.first;
            u->last_shard = d->run->part.last;
            u->images = d->run->images_total;
            u->steps = d->run->steps_total;
            u->pushes = d->run->pushes_recorded_total;
            u->pulls = d->run->serves_total;
            u->bytes_in = d->run->bytes_in_total;
            u->bytes_out = d->run->bytes_out_total;
        }
        up_send(d, &st);
    }
}

/* The range ASSIGN a asked for did not come out: the coordinator sends it (RANGE). */
static void ask_range(omv_daemon_t *d, const omv_server_msg_t *a)
{
    omv_msg_t m = {.type = OMV_MSG_SERVER};
    m.u.server.op = OMV_SERVER_NEED_RANGE;
    m.u.server.server_id = d->server_id;
    m.u.server.first_shard = a->first_shard;
    m.u.server.last_shard = a->last_shard;
    m.u.server.gather_id = a->gather_id;
    up_send(d, &m);
}

/* ASSIGN: the job as the coordinator parsed it; the range's parameters and momentum are made
 * here and checked (range.c), or asked for. */
static void on_assign(omv_daemon_t *d, const omv_server_msg_t *a, const void *payload, size_t bytes)
{
    size_t job_words = (sizeof(omv_job_t) + 3) / 4;
    if (a->job_bytes != sizeof(omv_job_t) || bytes != job_words * 4 || !a->make_range) {
        omv_log_error("the coordinator's job is %u bytes in %zu, ours %zu%s (another build of "
                      "omnivored?): refused",
                      a->job_bytes, bytes, sizeof(omv_job_t),
                      a->make_range ? "" : ", with the range");
        return;
    }
    drop_part(d, "the coordinator assigns another");
    omv_job_t job;
    memcpy(&job, payload, sizeof(job));
    job.name[sizeof(job.name) - 1] = '\0';
    job.model_text[sizeof(job.model_text) - 1] = '\0';
    job.init[sizeof(job.init) - 1] = '\0';
    omv_run_part_t part = {d->server_id, a->first_shard, a->last_shard, a->train_count, a->backup};
    omv_run_env_t env = {.router = d->router,
                         .members = d->members,
                         .refusals = a->backup ? &d->backup_refusals : &d->refusals, /* above */
                         .state_dir = d->cfg.state_dir,
                         .checkpoint_root = d->cfg.checkpoint_root,
                         .part = &part};
    d->run = omv_run_new(&env, &job, "(from the coordinator)", "", a->gather_id);
    if (d->run == NULL)
        return;
    if (omv_run_part_make(d->run, a, job.init) < 0)
        ask_range(d, a);
    omv_groups_set_count(d->run->groups, a->n_groups);
    for (uint32_t g = 0; g < a->n_groups; g++)
        omv_groups_set_clock(d->run->groups, g, a->clocks[g]);
    d->run->images_total = a->images;
    d->run->steps_total = a->steps;
}

static void on_member(omv_daemon_t *d, const omv_server_msg_t *u)
{
    if (d->run == NULL)
        return;
    if (u->state == OMV_SERVER_MEMBER_ALIVE || u->state == OMV_SERVER_MEMBER_EVALUATOR) {
        omv_member_t *m = omv_members_adopt(d->members, u->worker_id, u->host, u->key, u->token);
        if (m && u->state == OMV_SERVER_MEMBER_EVALUATOR) {
            m->role = OMV_ROLE_EVALUATOR; /* in no group: it attaches and is sent evaluations */
            omv_log_info("evaluator %u (%s): the coordinator's evaluations come from here",
                         u->worker_id, m->host);
        } else if (m) {
            omv_run_adopt(d->run, m, u->slot, u->group);
        }
        return;
    }
    omv_member_t *m = omv_members_get(d->members, u->worker_id);
    if (m && m->state == OMV_MEMBER_ALIVE) {
        omv_log_info("worker %u (%s) %s", u->worker_id, m->host,
                     u->state == OMV_SERVER_MEMBER_LEFT ? "left" : "died");
        omv_run_member_gone(d->run, m,
                            u->state == OMV_SERVER_MEMBER_LEFT ? OMV_MEMBER_LEFT : OMV_MEMBER_DEAD);
    }
}

/* A backup at a cut: what the coordinator says next waits for the cut's steps. */
static void backup_cut(omv_daemon_t *d, const omv_server_msg_t *u)
{
    d->defer_on = 1;
    d->defer_n_groups = u->n_groups < OMV_WIRE_MAX_CLOCKS ? u->n_groups : OMV_WIRE_MAX_CLOCKS;
    memcpy(d->defer_clocks, u->clocks, d->defer_n_groups * sizeof(uint64_t));
    omv_run_backup_cut(d->run, d->defer_clocks, d->defer_n_groups);
}

/* A backup keeps up with its primary from the workers' pushes alone, which may come later than
 * the coordinator's orders: what the coordinator says at a cut (a newcomer, a change) waits
 * until the backup has the cut's steps too. */
static int backup_defers(omv_daemon_t *d, const omv_server_msg_t *u, const void *payload,
                         size_t bytes)
{
    if (d->run == NULL || !d->run->part.backup || !d->defer_on || u->failover)
        return 0;
    if (u->op == OMV_SERVER_MEMBER && u->state != OMV_SERVER_MEMBER_ALIVE)
        return 0; /* a death may be what the cut's steps wait for */
    if (u->op != OMV_SERVER_MEMBER && u->op != OMV_SERVER_RESUME && u->op != OMV_SERVER_CUT)
        return 0;
    void *copy = bytes ? malloc(bytes) : NULL;
    if (d->n_deferred == OMV_PART_DEFER_MAX || (bytes && copy == NULL)) {
        free(copy);
        omv_log_error("backup of shards [%u, %u): more orders wait for the cut than it keeps; "
                      "it no longer follows its primary",
                      d->run->part.first, d->run->part.last);
        d->run->part_broken = 1;
        return 1;
    }
    if (bytes)
        memcpy(copy, payload, bytes);
    d->deferred[d->n_deferred++] = (omv_part_deferred_t){*u, copy, bytes};
    return 1;
}

static void on_server(omv_daemon_t *d, const omv_server_msg_t *u, const void *payload, size_t bytes)
{
    if (backup_defers(d, u, payload, bytes))
        return;
    int backup = d->run && d->run->part.backup;
    switch (u->op) {
    case OMV_SERVER_ASSIGN:
        on_assign(d, u, payload, bytes);
        break;
    case OMV_SERVER_MEMBER:
        on_member(d, u);
        break;
    case OMV_SERVER_START:
        if (d->run && d->run->range_owed)
            d->run->start_owed = 1; /* once the range is here */
        else if (d->run)
            omv_run_part_start(d->run);
        break;
    case OMV_SERVER_RANGE:
        if (d->run && omv_run_part_take_range(d->run, u, payload, bytes) == 0 && d->run->start_owed)
            omv_run_part_start(d->run);
        break;
    case OMV_SERVER_GATHER:
        if (d->run && !backup)
            omv_run_part_gather(d->run, u);
        break;
    case OMV_SERVER_END:
        drop_part(d, "the job is over");
        break;
    case OMV_SERVER_DROP_PART:
        if (d->run)
            omv_run_parts_drop(d->run, u->part_seq);
        break;
    case OMV_SERVER_FREEZE:
        if (d->run && !backup)
            omv_run_part_freeze(d->run, u->gather_id);
        break;
    case OMV_SERVER_CUT:
        if (d->run && u->failover) {
            /* What waited for an earlier cut is for a run the coordinator makes again. */
            for (uint32_t i = 0; i < d->n_deferred; i++)
                free(d->deferred[i].payload);
            d->n_deferred = 0;
            d->defer_on = 0;
            omv_run_backup_cut(d->run, NULL, 0);
            omv_run_part_failover_cut(d->run, u);
        } else if (d->run && backup)
            backup_cut(d, u);
        else if (d->run)
            omv_run_part_cut(d->run, u);
        break;
    case OMV_SERVER_RESUME:
        if (d->run)
            omv_run_part_resume(d->run, u, payload, bytes);
        break;
    default:
        omv_log_warn("ignoring %s from the coordinator", omv_server_op_name(u->op));
    }
}

/* The part can no longer be trusted (a backup that lost track of its primary, a change that
 * does not fit): it goes, and the coordinator is told, which fails over or goes back. */
static void part_broken(omv_daemon_t *d)
{
    omv_msg_t m = {.type = OMV_MSG_SERVER};
    m.u.server.op = OMV_SERVER_STATS;
    m.u.server.server_id = d->server_id;
    m.u.server.state = OMV_SERVER_STATS_DROPPED;
    drop_part(d, "this server can no longer hold its part as the coordinator has it");
    up_send(d, &m);
}

void omv_part_poll(omv_daemon_t *d)
{
    if (d->run && d->run->part_broken) {
        part_broken(d);
        return;
    }
    if (!d->defer_on || d->run == NULL ||
        !omv_run_part_caught_up(d->run, d->defer_clocks, d->defer_n_groups))
        return;
    /* The cut's steps are in: what waited for them, in order, up to the next cut. Each is off
     * the queue before it is carried out (a replayed CUT defers what follows again). */
    d->defer_on = 0;
    while (d->n_deferred > 0 && !d->defer_on && d->run) {
        omv_part_deferred_t q = d->deferred[0];
        memmove(d->deferred, d->deferred + 1, --d->n_deferred * sizeof(d->deferred[0]));
        on_server(d, &q.msg, q.payload, q.bytes);
        free(q.payload);
    }
    if (!d->defer_on && d->run) {
        omv_run_backup_cut(d->run, NULL, 0); /* the held pushes of the cut's steps may go */
        omv_run_progress(d->run);
    }
}

static void on_up_message(omv_daemon_t *d, const omv_msg_t *m)
{
    switch (m->type) {
    case OMV_MSG_WELCOME:
        d->server_id = m->u.welcome.worker_id;
        omv_log_info("registered with the coordinator %s as shard server %u", d->cfg.coordinator,
                     d->server_id);
        break;
    case OMV_MSG_HEARTBEAT:
        break;
    case OMV_MSG_STOP:
        omv_log_info("the coordinator says \"%s\"", m->u.stop.reason);
        drop_part(d, "the coordinator stops");
        d->server_id = 0;
        break;
    case OMV_MSG_ERROR:
        omv_log_error("the coordinator refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                      m->u.error.reason);
        break;
    case OMV_MSG_SERVER: {
        size_t bytes;
        const void *payload = omv_router_up_payload(d->router, &bytes);
        on_server(d, &m->u.server, payload, bytes);
        break;
    }
    default:
        omv_log_warn("ignoring %s from the coordinator", omv_msg_name(m->type));
    }
}

void omv_part_drain(omv_daemon_t *d)
{
    for (int n = 0; n < 256; n++) {
        omv_msg_t m;
        char why[OMV_WIRE_REASON_MAX];
        int r = omv_router_up_recv(d->router, &m, why);
        if (r == -EAGAIN || r == -EINTR)
            break;
        if (r < 0) {
            omv_log_warn("from the coordinator: %s", r == -EPROTO ? why : omv_strerror(r));
            continue;
        }
        d->up_heard_ms = omv_time_ms();
        on_up_message(d, &m);
    }
}

void omv_part_attach(omv_daemon_t *d, const omv_peer_t *peer, const omv_attach_t *a)
{
    omv_member_t *m = omv_members_get(d->members, a->worker_id);
    omv_msg_t reply;
    if (d->run == NULL || m == NULL || !m->used || m->state != OMV_MEMBER_ALIVE ||
        m->attach_token != a->token || (m->key[0] && strcmp(m->key, peer->key) != 0)) {
        omv_wire_error(&reply, OMV_REFUSE_UNKNOWN_WORKER,
                       "shard server: the coordinator has not told us of worker %u with this "
                       "token (yet)",
                       a->worker_id);
    } else {
        m->peer = *peer;
        m->last_seen_ms = omv_time_ms();
        reply = (omv_msg_t){.type = OMV_MSG_HEARTBEAT};
        reply.u.heartbeat.worker_id = a->worker_id;
    }
    int r = omv_router_send(d->router, peer, &reply, NULL);
    if (r < 0)
        omv_log_debug("cannot answer an attach: %s", omv_strerror(r));
    if (reply.type == OMV_MSG_HEARTBEAT && m->role == OMV_ROLE_EVALUATOR)
        omv_run_evaluator_attached(d->run, m);
}
