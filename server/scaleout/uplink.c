/* The shard server's link up to its coordinator (registration, heartbeats, the coordinator's
 * orders: the job and its range, members, start, gathers, cuts, the end), and workers
 * attaching. */
#define OMV_LOG_TAG "shard"
#include "uplink.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cert.h"
#include "log.h"
#include "parts.h"
#include "range.h"
#include "shard_server_priv.h"
#include "util.h"

/* Hello again this often until the coordinator answers; heartbeats this often after. */
#define HELLO_MS 2000
#define HEARTBEAT_MS 1000

/* A coordinator's order a backup keeps for later. */
#define DEFER_MAX 64
typedef struct {
    omv_server_msg_t msg;
    void *payload;
    size_t bytes;
} deferred_t;

struct omv_uplink {
    omv_uplink_env_t env;
    uint32_t server_id; /* its id at the coordinator; 0: not registered */
    int64_t heard_ms, sent_ms, hello_ms;
    char advertise[256]; /* where its workers connect */
    char public_key[41]; /* its CURVE public key ("": none) */
    /* A backup's coordinator's orders that wait for a cut's steps (omv_uplink_poll). */
    struct {
        int on;
        uint64_t clocks[OMV_WIRE_MAX_CLOCKS];
        uint32_t n_groups;
        deferred_t q[DEFER_MAX];
        uint32_t n;
    } defer;
};

static void up_send(omv_uplink_t *up, const omv_msg_t *msg)
{
    int r = omv_router_up_send(up->env.router, msg, NULL);
    if (r < 0)
        omv_log_debug("cannot send %s to the coordinator: %s", omv_msg_name(msg->type),
                      omv_strerror(r));
    up->sent_ms = omv_time_ms();
}

/* The coordinator's public certificate, and ours, for CURVE on the upstream link. */
static int upstream_keys(omv_uplink_t *up, omv_upstream_curve_t *c, char *server, char *pub,
                         char *sec)
{
    char err[OMV_CONFIG_ERR_MAX] = "";
    omv_cert_t theirs = {.secret_key = ""}, ours = {.secret_key = ""};
    if (omv_cert_read(up->env.coordinator_key, &theirs, err) < 0 ||
        omv_cert_read(up->env.secret_key, &ours, err) < 0 || ours.secret_key[0] == '\0') {
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

static int setup(omv_uplink_t *up)
{
    const omv_daemon_config_t *cfg = up->env.cfg;
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
    omv_strlcpy(up->advertise, adv, sizeof(up->advertise));
    /* A backup's refusals are its primary's to answer; they are counted all the same. */
    omv_refusals_init(up->env.backup_refusals, up->env.router);
    up->env.backup_refusals->quiet = 1;
    omv_upstream_curve_t c;
    char server[OMV_CERT_KEY_LEN + 1], pub[OMV_CERT_KEY_LEN + 1], sec[OMV_CERT_KEY_LEN + 1];
    int curve = up->env.curve || strncmp(cfg->coordinator, "tcp://", 6) == 0;
    if (strcmp(cfg->curve, "no") == 0)
        curve = 0;
    int r = curve ? upstream_keys(up, &c, server, pub, sec) : 0;
    if (r == 0)
        r = omv_router_upstream(up->env.router, cfg->coordinator, curve ? &c : NULL);
    memset(sec, 0, sizeof(sec));
    if (r < 0) {
        omv_log_error("cannot connect to the coordinator at %s: %s", cfg->coordinator,
                      omv_strerror(r));
        return r;
    }
    omv_strlcpy(up->public_key, curve ? pub : "", sizeof(up->public_key));
    omv_log_info("shard server: coordinator %s, workers reach us at %s%s", cfg->coordinator,
                 up->advertise, curve ? " (CURVE)" : "");
    return 0;
}

static void hello(omv_uplink_t *up)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    omv_hello_t *h = &m.u.hello;
    h->protocol_version = OMV_PROTOCOL_VERSION;
    h->role = OMV_ROLE_SHARD;
    h->pid = (uint32_t)getpid();
    if (gethostname(h->hostname, sizeof(h->hostname)) != 0)
        omv_strlcpy(h->hostname, "unknown", sizeof(h->hostname));
    h->hostname[sizeof(h->hostname) - 1] = '\0';
    omv_strlcpy(h->endpoint, up->advertise, sizeof(h->endpoint));
    omv_strlcpy(h->public_key, up->public_key, sizeof(h->public_key));
    up_send(up, &m);
    up->hello_ms = omv_time_ms();
}

/* The job is over, or the coordinator is gone: its run goes, and so do its members. */
static void drop_run(omv_uplink_t *up, const char *why)
{
    if (*up->env.run == NULL)
        return;
    omv_log_info("job '%s': %s; dropping shards [%u, %u)", (*up->env.run)->job.name, why,
                 (*up->env.run)->lo, (*up->env.run)->hi);
    if (!OMV_JOB_OVER((*up->env.run)->state))
        omv_run_finish(*up->env.run, OMV_JOB_STOPPED, why);
    omv_run_destroy(up->env.run);
    for (uint32_t i = 0; i < up->env.members->n; i++)
        up->env.members->records[i].state = OMV_MEMBER_DONE;
    for (uint32_t i = 0; i < up->defer.n; i++)
        free(up->defer.q[i].payload);
    up->defer.n = 0;
    up->defer.on = 0;
}

void omv_uplink_cron(omv_uplink_t *up)
{
    int64_t now = omv_time_ms();
    /* A coordinator silent this long is taken for gone: the run of its job is dropped. */
    if (up->server_id != 0 &&
        now - up->heard_ms > (int64_t)(up->env.cfg->coordinator_timeout_s * 1000)) {
        omv_log_warn("no word from the coordinator for %.0f s: registering again",
                     (double)(now - up->heard_ms) / 1000.0);
        drop_run(up, "the coordinator went quiet");
        up->server_id = 0;
    }
    if (up->server_id == 0 && now - up->hello_ms >= HELLO_MS) {
        hello(up);
    } else if (up->server_id != 0 && now - up->sent_ms >= HEARTBEAT_MS) {
        /* Our counters, which are our heartbeat too. */
        omv_msg_t st = {.type = OMV_MSG_SERVER};
        omv_server_msg_t *u = &st.u.server;
        u->op = OMV_SERVER_STATS;
        u->server_id = up->server_id;
        if (*up->env.run) {
            u->first_shard = (*up->env.run)->lo;
            u->last_shard = (*up->env.run)->hi;
            u->images = (*up->env.run)->stats.images_total;
            u->steps = (*up->env.run)->stats.steps_total;
            u->pushes = (*up->env.run)->stats.pushes_recorded_total;
            u->pulls = (*up->env.run)->stats.serves_total;
            u->bytes_in = (*up->env.run)->stats.bytes_in_total;
            u->bytes_out = (*up->env.run)->stats.bytes_out_total;
        }
        up_send(up, &st);
    }
}

/* The range ASSIGN a asked for did not come out: the coordinator sends it (RANGE). */
static void ask_range(omv_uplink_t *up, const omv_server_msg_t *a)
{
    omv_msg_t m = {.type = OMV_MSG_SERVER};
    m.u.server.op = OMV_SERVER_NEED_RANGE;
    m.u.server.server_id = up->server_id;
    m.u.server.first_shard = a->first_shard;
    m.u.server.last_shard = a->last_shard;
    m.u.server.gather_id = a->gather_id;
    up_send(up, &m);
}

/* ASSIGN: the job as the coordinator parsed it; the range's parameters and momentum are made
 * here and checked (range.c), or asked for. */
static void on_assign(omv_uplink_t *up, const omv_server_msg_t *a, const void *payload,
                      size_t bytes)
{
    size_t job_words = (sizeof(omv_job_t) + 3) / 4;
    if (a->job_bytes != sizeof(omv_job_t) || bytes != job_words * 4 || !a->make_range) {
        omv_log_error("the coordinator's job is %u bytes in %zu, ours %zu%s (another build of "
                      "omnivored?): refused",
                      a->job_bytes, bytes, sizeof(omv_job_t),
                      a->make_range ? "" : ", with the range");
        return;
    }
    drop_run(up, "the coordinator assigns another");
    omv_job_t job;
    memcpy(&job, payload, sizeof(job));
    job.name[sizeof(job.name) - 1] = '\0';
    job.model_text[sizeof(job.model_text) - 1] = '\0';
    job.init[sizeof(job.init) - 1] = '\0';
    omv_shard_server_arg_t range = {up->server_id, a->first_shard, a->last_shard, a->train_count,
                                    a->backup};
    omv_run_env_t env = {.router = up->env.router,
                         .members = up->env.members,
                         .refusals =
                             a->backup ? up->env.backup_refusals : up->env.refusals, /* above */
                         .state_dir = up->env.cfg->state_dir,
                         .checkpoint_root = up->env.cfg->checkpoint_root,
                         .role = &omv_shard_server_role,
                         .role_arg = &range};
    *up->env.run = omv_run_new(&env, &job, "(from the coordinator)", "", a->gather_id);
    if (*up->env.run == NULL)
        return;
    if (omv_range_make(*up->env.run, a, job.init) < 0)
        ask_range(up, a);
    omv_groups_set_count((*up->env.run)->groups, a->n_groups);
    for (uint32_t g = 0; g < a->n_groups; g++)
        omv_groups_set_clock((*up->env.run)->groups, g, a->clocks[g]);
    (*up->env.run)->stats.images_total = a->images;
    (*up->env.run)->stats.steps_total = a->steps;
}

static void on_member(omv_uplink_t *up, const omv_server_msg_t *u)
{
    if (*up->env.run == NULL)
        return;
    if (u->state == OMV_SERVER_MEMBER_ALIVE || u->state == OMV_SERVER_MEMBER_EVALUATOR) {
        omv_member_t *m =
            omv_members_adopt(up->env.members, u->worker_id, u->host, u->key, u->token);
        if (m && u->state == OMV_SERVER_MEMBER_EVALUATOR) {
            m->role = OMV_ROLE_EVALUATOR; /* in no group: it attaches and is sent evaluations */
            omv_log_info("evaluator %u (%s): the coordinator's evaluations come from here",
                         u->worker_id, m->host);
        } else if (m) {
            omv_shard_server_adopt(*up->env.run, m, u->slot, u->group);
        }
        return;
    }
    omv_member_t *m = omv_members_get(up->env.members, u->worker_id);
    if (m && m->state == OMV_MEMBER_ALIVE) {
        omv_log_info("worker %u (%s) %s", u->worker_id, m->host,
                     u->state == OMV_SERVER_MEMBER_LEFT ? "left" : "died");
        omv_run_member_gone(*up->env.run, m,
                            u->state == OMV_SERVER_MEMBER_LEFT ? OMV_MEMBER_LEFT : OMV_MEMBER_DEAD);
    }
}

/* A backup at a cut: what the coordinator says next waits for the cut's steps. */
static void backup_cut(omv_uplink_t *up, const omv_server_msg_t *u)
{
    up->defer.on = 1;
    up->defer.n_groups = u->n_groups < OMV_WIRE_MAX_CLOCKS ? u->n_groups : OMV_WIRE_MAX_CLOCKS;
    memcpy(up->defer.clocks, u->clocks, up->defer.n_groups * sizeof(uint64_t));
    omv_shard_server_backup_cut(*up->env.run, up->defer.clocks, up->defer.n_groups);
}

/* A backup keeps up with its primary from the workers' pushes alone, which may come later than
 * the coordinator's orders: what the coordinator says at a cut (a newcomer, a change) waits
 * until the backup has the cut's steps too. */
static int backup_defers(omv_uplink_t *up, const omv_server_msg_t *u, const void *payload,
                         size_t bytes)
{
    if (*up->env.run == NULL || !(*up->env.run)->backup || !up->defer.on || u->failover)
        return 0;
    if (u->op == OMV_SERVER_MEMBER && u->state != OMV_SERVER_MEMBER_ALIVE)
        return 0; /* a death may be what the cut's steps wait for */
    if (u->op != OMV_SERVER_MEMBER && u->op != OMV_SERVER_RESUME && u->op != OMV_SERVER_CUT)
        return 0;
    void *copy = bytes ? malloc(bytes) : NULL;
    if (up->defer.n == DEFER_MAX || (bytes && copy == NULL)) {
        free(copy);
        omv_log_error("backup of shards [%u, %u): more orders wait for the cut than it keeps; "
                      "it no longer follows its primary",
                      (*up->env.run)->lo, (*up->env.run)->hi);
        omv_shard_server(*up->env.run)->broken = 1;
        return 1;
    }
    if (bytes)
        memcpy(copy, payload, bytes);
    up->defer.q[up->defer.n++] = (deferred_t){*u, copy, bytes};
    return 1;
}

static void on_server(omv_uplink_t *up, const omv_server_msg_t *u, const void *payload,
                      size_t bytes)
{
    if (backup_defers(up, u, payload, bytes))
        return;
    int backup = *up->env.run && (*up->env.run)->backup;
    switch (u->op) {
    case OMV_SERVER_ASSIGN:
        on_assign(up, u, payload, bytes);
        break;
    case OMV_SERVER_MEMBER:
        on_member(up, u);
        break;
    case OMV_SERVER_START:
        if (*up->env.run && omv_shard_server(*up->env.run)->range_owed)
            omv_shard_server(*up->env.run)->start_owed = 1; /* once the range is here */
        else if (*up->env.run)
            omv_shard_server_start(*up->env.run);
        break;
    case OMV_SERVER_RANGE:
        if (*up->env.run && omv_range_take(*up->env.run, u, payload, bytes) == 0 &&
            omv_shard_server(*up->env.run)->start_owed)
            omv_shard_server_start(*up->env.run);
        break;
    case OMV_SERVER_GATHER:
        if (*up->env.run && !backup)
            omv_shard_server_gather(*up->env.run, u);
        break;
    case OMV_SERVER_END:
        drop_run(up, "the job is over");
        break;
    case OMV_SERVER_DROP_PART:
        if (*up->env.run)
            omv_parts_drop(*up->env.run, u->part_seq);
        break;
    case OMV_SERVER_FREEZE:
        if (*up->env.run && !backup)
            omv_shard_server_freeze(*up->env.run, u->gather_id);
        break;
    case OMV_SERVER_CUT:
        if (*up->env.run && u->failover) {
            /* What waited for an earlier cut is for a run the coordinator makes again. */
            for (uint32_t i = 0; i < up->defer.n; i++)
                free(up->defer.q[i].payload);
            up->defer.n = 0;
            up->defer.on = 0;
            omv_shard_server_backup_cut(*up->env.run, NULL, 0);
            omv_shard_server_failover_cut(*up->env.run, u);
        } else if (*up->env.run && backup)
            backup_cut(up, u);
        else if (*up->env.run)
            omv_shard_server_cut(*up->env.run, u);
        break;
    case OMV_SERVER_RESUME:
        if (*up->env.run)
            omv_shard_server_resume(*up->env.run, u, payload, bytes);
        break;
    default:
        omv_log_warn("ignoring %s from the coordinator", omv_server_op_name(u->op));
    }
}

/* The range can no longer be trusted (a backup that lost track of its primary, a change that
 * does not fit): it goes, and the coordinator is told, which fails over or goes back. */
static void range_broken(omv_uplink_t *up)
{
    omv_msg_t m = {.type = OMV_MSG_SERVER};
    m.u.server.op = OMV_SERVER_STATS;
    m.u.server.server_id = up->server_id;
    m.u.server.state = OMV_SERVER_STATS_DROPPED;
    drop_run(up, "this server can no longer hold its range as the coordinator has it");
    up_send(up, &m);
}

void omv_uplink_poll(omv_uplink_t *up)
{
    if (*up->env.run && omv_shard_server_broken(*up->env.run)) {
        range_broken(up);
        return;
    }
    if (!up->defer.on || *up->env.run == NULL ||
        !omv_shard_server_caught_up(*up->env.run, up->defer.clocks, up->defer.n_groups))
        return;
    /* The cut's steps are in: what waited for them, in order, up to the next cut. Each is off
     * the queue before it is carried out (a replayed CUT defers what follows again). */
    up->defer.on = 0;
    while (up->defer.n > 0 && !up->defer.on && *up->env.run) {
        deferred_t q = up->defer.q[0];
        memmove(up->defer.q, up->defer.q + 1, --up->defer.n * sizeof(up->defer.q[0]));
        on_server(up, &q.msg, q.payload, q.bytes);
        free(q.payload);
    }
    if (!up->defer.on && *up->env.run) {
        omv_shard_server_backup_cut(*up->env.run, NULL,
                                    0); /* the held pushes of the cut's steps may go */
        omv_run_progress(*up->env.run);
    }
}

static void on_up_message(omv_uplink_t *up, const omv_msg_t *m)
{
    switch (m->type) {
    case OMV_MSG_WELCOME:
        up->server_id = m->u.welcome.worker_id;
        omv_log_info("registered with the coordinator %s as shard server %u",
                     up->env.cfg->coordinator, up->server_id);
        break;
    case OMV_MSG_HEARTBEAT:
        break;
    case OMV_MSG_STOP:
        omv_log_info("the coordinator says \"%s\"", m->u.stop.reason);
        drop_run(up, "the coordinator stops");
        up->server_id = 0;
        break;
    case OMV_MSG_ERROR:
        omv_log_error("the coordinator refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                      m->u.error.reason);
        break;
    case OMV_MSG_SERVER: {
        size_t bytes;
        const void *payload = omv_router_up_payload(up->env.router, &bytes);
        on_server(up, &m->u.server, payload, bytes);
        break;
    }
    default:
        omv_log_warn("ignoring %s from the coordinator", omv_msg_name(m->type));
    }
}

void omv_uplink_drain(omv_uplink_t *up)
{
    for (int n = 0; n < 256; n++) {
        omv_msg_t m;
        char why[OMV_WIRE_REASON_MAX];
        int r = omv_router_up_recv(up->env.router, &m, why);
        if (r == -EAGAIN || r == -EINTR)
            break;
        if (r < 0) {
            omv_log_warn("from the coordinator: %s", r == -EPROTO ? why : omv_strerror(r));
            continue;
        }
        up->heard_ms = omv_time_ms();
        on_up_message(up, &m);
    }
}

void omv_uplink_attach(omv_uplink_t *up, const omv_peer_t *peer, const omv_attach_t *a)
{
    omv_member_t *m = omv_members_get(up->env.members, a->worker_id);
    omv_msg_t reply;
    if (*up->env.run == NULL || m == NULL || !m->used || m->state != OMV_MEMBER_ALIVE ||
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
    int r = omv_router_send(up->env.router, peer, &reply, NULL);
    if (r < 0)
        omv_log_debug("cannot answer an attach: %s", omv_strerror(r));
    if (reply.type == OMV_MSG_HEARTBEAT && m->role == OMV_ROLE_EVALUATOR)
        omv_shard_server_evaluator_attached(*up->env.run, m);
}

omv_uplink_t *omv_uplink_new(const omv_uplink_env_t *env)
{
    omv_uplink_t *up = calloc(1, sizeof(*up));
    if (up == NULL)
        return NULL;
    up->env = *env;
    int r = setup(up);
    if (r < 0) {
        free(up);
        errno = -r;
        return NULL;
    }
    return up;
}

void omv_uplink_destroy(omv_uplink_t **self_p)
{
    omv_uplink_t *up = *self_p;
    if (up == NULL)
        return;
    for (uint32_t i = 0; i < up->defer.n; i++)
        free(up->defer.q[i].payload);
    free(up);
    *self_p = NULL;
}

uint32_t omv_uplink_server_id(const omv_uplink_t *up)
{
    return up->server_id;
}

const char *omv_uplink_advertise(const omv_uplink_t *up)
{
    return up->advertise;
}
