/* The worker's session: registration (and registering again when the daemon goes away), then
 * the trainer loop or the evaluator loop. */
#define OMV_LOG_TAG "worker"
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bf16.h"
#include "blas.h"
#include "dataset.h"
#include "link.h"
#include "log.h"
#include "net.h"
#include "rng.h"
#include "shmlink.h"
#include "util.h"

typedef struct {
    const omv_session_config_t *cfg;
    volatile sig_atomic_t *stop;
    omv_link_t *link;
    /* The model on shard servers: a link to each (links[0] is the daemon's), which holds
     * which shard, and the link the last message came from. */
    omv_link_t *links[1 + 2 * OMV_WIRE_MAX_SERVERS];
    uint32_t n_servers, n_backups; /* the backups' links follow the servers' */
    uint8_t shard_server[OMV_WIRE_MAX_SHARDS];
    uint8_t shard_backup[OMV_WIRE_MAX_SHARDS]; /* 1 + the index of its backup's link; 0: none */
    int backup_warned;                         /* said once that a backup is not connected */
    omv_link_t *from;
    uint32_t worker_id;   /* 0 while not registered */
    uint32_t previous_id; /* the id we had before the daemon went away */
    uint32_t group;
    uint64_t start_step;
    omv_jobspec_t job;
    int idle;     /* registered with a daemon that has no job now */
    int prepared; /* the engine and buffers below are built for job */
    omv_model_layout_t layout;
    omv_net_t *net;
    omv_dataset_norm_t norm;
    omv_dataset_t data;
    uint32_t slice_begin, slice_count; /* the slice in data */
    float *params;                     /* [param_count] */
    float *grad;                       /* [param_count] */
    omv_shmlink_t shm;                 /* shared memory with the daemon, when it is on this host */
    const float *p;                    /* where this step's parameters are: a segment or ours */
    float *g;                          /* and its gradient */
    uint16_t *grad16;                  /* [param_count] the gradient as bf16 travels */
    uint8_t *grad8;  /* [wire int8] one shard's gradient as it travels (common/q8.h) */
    float *residual; /* [wire int8: param_count] what rounding to int8 has not sent yet */
    /* Wire int8: params is our view of the model (common/q8.h); the view we hold from each
     * link's daemon or server (0: none, so its next Params come whole), and the changes each
     * shard had since its view began. */
    uint64_t view[1 + 2 * OMV_WIRE_MAX_SERVERS];
    uint32_t *view_seq;               /* [n_shards] */
    uint64_t changes_got, wholes_got; /* shards that came as a change, and whole to start one */
    float *x;                         /* [batch][inputs] */
    uint8_t *y;                       /* [batch] */
    uint32_t *order;                  /* [data.count] this epoch's permutation */
    uint8_t *got;                     /* [n_shards] which shards of the pull arrived */
    uint8_t *pushed;                  /* [n_shards] which shards of the step went out */
    uint32_t have;                    /* shards of the pull that arrived */
    uint64_t asked, step;             /* the step asked for, and the one the daemon gave */
    int pulled;                       /* the next step's pull went out */
    int hook_err;                     /* what went wrong inside the engine's hooks */
    double hook_s;                    /* time spent in the hooks this step (not computing) */
    /* Where a trainer's steps go, summed for the log at the end: computing, waiting for a
     * step's first parameters (the group's other members and the apply), for the rest of them
     * during forward, and sending gradients. */
    uint64_t timed_steps;
    double compute_s, begin_s, need_s, send_s;
    uint32_t batch;  /* images to compute this step (from the daemon) */
    uint64_t epoch;  /* passes over our slice */
    uint32_t cursor; /* next position in order */
    int64_t last_sent_ms, last_recv_ms;
    omv_rng_t delay_rng;
} session_t;

/* wait_msg's outcomes besides a message (0) and errors (< 0). */
enum {
    WAIT_DONE = 1, /* the daemon says the job is over */
    WAIT_LOST = 2, /* the daemon went away or no longer knows us: register again */
};

/* Sends what waits for the shared-memory link: nothing we wait for can come before it, nor may
 * anything we send over a socket overtake it. */
static void flush_local(session_t *s)
{
    omv_shmlink_flush(&s->shm, s->link, s->worker_id);
}

/* Sends m on link: to the daemon, the shared-memory link takes what goes its way (it decides);
 * anything else goes at once on the socket, after what it held. */
static int send_on(session_t *s, omv_link_t *link, const omv_msg_t *m, const void *payload)
{
    if (link == s->link && omv_shmlink_hold(&s->shm, m, s->link, s->worker_id))
        return 0;
    flush_local(s); /* what was held goes first */
    int r = omv_link_send(link, m, payload);
    if (r < 0)
        omv_log_error("cannot send %s: %s", omv_msg_name(m->type), omv_strerror(r));
    if (link == s->link)
        s->last_sent_ms = omv_time_ms(); /* heartbeats are the daemon's */
    return r;
}

static int send_msg(session_t *s, const omv_msg_t *m, const void *payload)
{
    return send_on(s, s->link, m, payload);
}

/* Waits up to wait ms for a message from the daemon (on its socket, or on the shared-memory
 * connection) or a shard server; s->from says which link. */
static int recv_any(session_t *s, omv_msg_t *m, int wait, char *why)
{
    flush_local(s); /* nothing we wait for can come before what we asked for */
    if (s->n_servers == 0) {
        s->from = s->link;
        if (!s->shm.on)
            return omv_link_recv(s->link, m, wait, why);
        if (wait > 0 && s->cfg->spin_us > 0) {
            int r = omv_shmlink_spin(&s->shm, m, why, s->worker_id);
            if (r != -EAGAIN || !s->shm.on)
                return r;
        }
        int i = omv_link_poll_fd(&s->link, 1, s->shm.conn, wait);
        if (i < 0)
            return i;
        return i == 1 ? omv_shmlink_recv(&s->shm, m, why, s->worker_id)
                      : omv_link_recv(s->link, m, 0, why);
    }
    s->links[0] = s->link;
    int i = omv_link_poll(s->links, 1 + (int)(s->n_servers + s->n_backups), wait);
    if (i < 0)
        return i;
    s->from = s->links[i];
    return omv_link_recv(s->from, m, 0, why);
}

static void send_heartbeat_if_due(session_t *s)
{
    /* What the shared-memory link took counts as much as what went on the socket. */
    int64_t sent = s->last_sent_ms > s->shm.sent_ms ? s->last_sent_ms : s->shm.sent_ms;
    if (s->worker_id != 0 && omv_time_ms() - sent >= s->cfg->heartbeat_ms) {
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = s->worker_id;
        send_msg(s, &hb, NULL);
    }
}

/* The engine's tick between layers: a step longer than the daemon's worker timeout must not
 * look like a dead worker (one layer at most goes by between two chances to send). */
static void heartbeat_tick(void *ctx)
{
    send_heartbeat_if_due(ctx);
}

/* Waits for the next message that is not a heartbeat: sends heartbeats while waiting, notices a
 * daemon that has gone quiet, and handles Error and Stop. Returns 0 with a message, WAIT_DONE,
 * WAIT_LOST, or a negative errno (-ETIMEDOUT at deadline_ms when it is > 0). */
static int wait_msg(session_t *s, omv_msg_t *m, int64_t deadline_ms)
{
    char why[OMV_WIRE_REASON_MAX];
    int64_t since = omv_time_ms();
    for (;;) {
        if (*s->stop)
            return -EINTR;
        int64_t now = omv_time_ms();
        if (deadline_ms > 0 && now >= deadline_ms)
            return -ETIMEDOUT;
        int64_t heard = s->last_recv_ms > since ? s->last_recv_ms : since;
        if (s->worker_id != 0 && now - heard > s->cfg->server_timeout_ms) {
            omv_log_warn("no word from the daemon for %.1f s: registering again",
                         (double)(now - heard) / 1000.0);
            return WAIT_LOST;
        }
        int wait = s->cfg->heartbeat_ms;
        if (deadline_ms > 0 && deadline_ms - now < wait)
            wait = (int)(deadline_ms - now);
        int r = recv_any(s, m, wait, why);
        if (r == -EAGAIN || r == -EINTR) {
            send_heartbeat_if_due(s);
            continue;
        }
        if (r == -EPROTO) {
            omv_log_warn("ignoring a malformed message from the daemon: %s", why);
            continue;
        }
        if (r < 0)
            return r;
        s->last_recv_ms = omv_time_ms();
        switch (m->type) {
        case OMV_MSG_HEARTBEAT:
            continue;
        case OMV_MSG_STOP:
            if (m->u.stop.reconnect) {
                omv_log_info("daemon says \"%s\": registering again", m->u.stop.reason);
                return WAIT_LOST;
            }
            omv_log_info("daemon says stop: \"%s\"", m->u.stop.reason);
            return WAIT_DONE;
        case OMV_MSG_ERROR:
            switch (m->u.error.code) {
            case OMV_REFUSE_NOT_FINITE:
            case OMV_REFUSE_NORM:
                /* The daemon dropped our gradient; the model is intact and the step goes on. */
                omv_log_warn("daemon refused a gradient: \"%s\"", m->u.error.reason);
                continue;
            case OMV_REFUSE_UNKNOWN_WORKER:
            case OMV_REFUSE_STEP:
                /* It declared us dead, restarted, or moved on without us: join again. */
                omv_log_warn("daemon refused us (%s): \"%s\"; registering again",
                             omv_refuse_name(m->u.error.code), m->u.error.reason);
                return WAIT_LOST;
            default:
                omv_log_error("daemon refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                              m->u.error.reason);
                return -EPROTO;
            }
        default:
            return 0;
        }
    }
}

static void release_engine(session_t *s);

/* Whether spec b is the job the engine was built for (a daemon restart resumes the same one). */
static int same_job(const omv_jobspec_t *a, const omv_jobspec_t *b)
{
    return strcmp(a->name, b->name) == 0 && a->param_count == b->param_count &&
           a->batch_size == b->batch_size && a->seed == b->seed &&
           a->eval_batch_size == b->eval_batch_size && strcmp(a->model, b->model) == 0 &&
           a->n_layers == b->n_layers &&
           memcmp(a->layers, b->layers, a->n_layers * sizeof(a->layers[0])) == 0 &&
           strcmp(a->data_format, b->data_format) == 0 &&
           strcmp(a->train_images, b->train_images) == 0 &&
           strcmp(a->train_labels, b->train_labels) == 0 &&
           strcmp(a->test_images, b->test_images) == 0 &&
           strcmp(a->test_labels, b->test_labels) == 0 && a->scale == b->scale &&
           a->n_mean == b->n_mean && a->n_std == b->n_std &&
           memcmp(a->mean, b->mean, a->n_mean * sizeof(a->mean[0])) == 0 &&
           memcmp(a->std, b->std, a->n_std * sizeof(a->std[0])) == 0 &&
           a->n_shards == b->n_shards && a->wire == b->wire &&
           memcmp(a->shard_offsets, b->shard_offsets, (a->n_shards + 1) * sizeof(uint32_t)) == 0;
}

static void servers_close(session_t *s, int flush)
{
    for (uint32_t i = 0; i < s->n_servers + s->n_backups; i++)
        if (flush)
            omv_link_destroy(&s->links[1 + i]);
        else
            omv_link_abandon(&s->links[1 + i]);
    s->n_servers = s->n_backups = 0;
    memset(s->shard_backup, 0, sizeof(s->shard_backup));
    memset(s->view, 0, sizeof(s->view)); /* new links: their servers send whole shards first */
    s->backup_warned = 0;
}

/* Attaches to a shard server: Attach until it answers (the daemon may not have told it of us
 * yet), for up to 10 s. Returns 0, or -ETIMEDOUT / -EPROTO after logging why. */
static int attach_one(session_t *s, omv_link_t *link, const char *endpoint, uint64_t token)
{
    int64_t deadline = omv_time_ms() + 10000;
    char why[OMV_WIRE_REASON_MAX] = "no answer";
    while (omv_time_ms() < deadline && !*s->stop) {
        omv_msg_t m = {.type = OMV_MSG_ATTACH};
        m.u.attach = (omv_attach_t){s->worker_id, token};
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
static int open_server(session_t *s, const omv_server_info_t *v, uint32_t i, uint64_t token,
                       int backup)
{
    omv_link_curve_t c = {v->public_key, s->cfg->curve ? s->cfg->curve->public_key : NULL,
                          s->cfg->curve ? s->cfg->curve->secret_key : NULL};
    if (v->public_key[0] && s->cfg->curve == NULL) {
        omv_log_error("shard server %s takes CURVE connections: give this worker its keys",
                      v->endpoint);
        return -EPROTO;
    }
    /* A backup that is gone must not hold our gradients back: it is dropped, and the
     * coordinator fails over. */
    const omv_link_curve_t *cc = v->public_key[0] ? &c : NULL;
    s->links[1 + i] = backup ? omv_link_new_lossy(v->endpoint, cc) : omv_link_new(v->endpoint, cc);
    if (s->links[1 + i] == NULL) {
        int e = -errno;
        omv_log_error("cannot connect to shard server %s: %s", v->endpoint, omv_strerror(e));
        return e;
    }
    return attach_one(s, s->links[1 + i], v->endpoint, token);
}

/* The model is on shard servers: a link to each (and to each backup), attached, and which
 * holds which shard. */
static int servers_open(session_t *s, const omv_welcome_t *w)
{
    servers_close(s, 0);
    if (w->n_servers == 0)
        return 0;
    if (w->servers[w->n_servers - 1].last_shard != w->job.n_shards) {
        omv_log_error("the daemon's shard servers hold %u shards, the job has %u",
                      w->servers[w->n_servers - 1].last_shard, w->job.n_shards);
        return -EPROTO;
    }
    for (uint32_t i = 0; i < w->n_servers; i++) {
        const omv_server_info_t *v = &w->servers[i];
        s->n_servers = i + 1;
        for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
            s->shard_server[sh] = (uint8_t)i;
        int r = open_server(s, v, i, w->attach_token, 0);
        if (r < 0)
            return r;
    }
    for (uint32_t k = 0; k < w->n_backups; k++) {
        const omv_server_info_t *v = &w->backups[k];
        s->n_backups = k + 1;
        for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
            s->shard_backup[sh] = (uint8_t)(1 + s->n_servers + k);
        int r = open_server(s, v, s->n_servers + k, w->attach_token, 1);
        if (r < 0) {
            /* Not fatal: the backup misses our gradients and the coordinator replaces it. */
            omv_log_warn("worker %u: no backup at %s: its shards go to their primary only",
                         s->worker_id, v->endpoint);
            for (uint32_t sh = v->first_shard; sh < v->last_shard; sh++)
                s->shard_backup[sh] = 0;
        }
    }
    omv_log_info("worker %u: the model is on %u shard servers%s; %s them", s->worker_id,
                 s->n_servers, s->n_backups ? ", with a backup of each" : "",
                 s->cfg->role == OMV_ROLE_TRAINER ? "pulling from and pushing to"
                                                  : "evaluating what comes from");
    return 0;
}

/* One registration attempt: Hello, then wait up to wait_ms for the Welcome. Returns 0,
 * -ETIMEDOUT (no answer), WAIT_DONE (nothing to do: the job is over) or another negative errno
 * (refused: do not try again). */
static int handshake(session_t *s, int wait_ms)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    m.u.hello.role = s->cfg->role;
    m.u.hello.pid = (uint32_t)getpid();
    m.u.hello.threads = (uint32_t)s->cfg->threads;
    m.u.hello.previous_worker_id = s->previous_id;
    if (s->cfg->name)
        omv_strlcpy(m.u.hello.name, s->cfg->name, sizeof(m.u.hello.name));
    if (gethostname(m.u.hello.hostname, sizeof(m.u.hello.hostname)) != 0)
        omv_strlcpy(m.u.hello.hostname, "unknown", sizeof(m.u.hello.hostname));
    m.u.hello.hostname[sizeof(m.u.hello.hostname) - 1] = '\0';
    s->worker_id = 0;
    int r = send_msg(s, &m, NULL);
    if (r < 0)
        return r;
    r = wait_msg(s, &m, omv_time_ms() + wait_ms);
    if (r == WAIT_LOST)
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
    s->worker_id = m.u.welcome.worker_id;
    s->idle = m.u.welcome.idle;
    if (s->idle)
        return 0;
    s->group = m.u.welcome.group;
    s->start_step = m.u.welcome.start_step;
    if (s->prepared && !same_job(&s->job, &m.u.welcome.job)) {
        /* A daemon that runs jobs one after another: the next one may have another model or
         * other data, so the engine is built again from the new spec. */
        omv_log_info("the daemon runs job '%s' now (was '%s'): building its model",
                     m.u.welcome.job.name, s->job.name);
        release_engine(s);
    }
    s->job = m.u.welcome.job;
    omv_shmlink_attach(&s->shm, &m.u.welcome, s->worker_id);
    return servers_open(s, &m.u.welcome);
}

/* Registered while the daemon has no job: heartbeats until it says a job starts (Stop with
 * reconnect: register again to get it) or that we are not needed (Stop). */
static int idle(session_t *s)
{
    omv_log_info("registered as worker %u; the daemon has no job yet: waiting for one",
                 s->worker_id);
    for (;;) {
        omv_msg_t m;
        int r = wait_msg(s, &m, 0);
        if (r != 0)
            return r;
        omv_log_warn("ignoring %s while there is no job", omv_msg_name(m.type));
    }
}

/* Registers, trying again with backoff until deadline_ms (0: forever). Returns 0, WAIT_DONE, or
 * a negative errno. */
static int register_with_backoff(session_t *s, int64_t deadline_ms)
{
    int delay_ms = 100;
    for (int attempt = 0;; attempt++) {
        if (s->link == NULL) {
            s->link = omv_link_new(s->cfg->endpoint, s->cfg->curve);
            if (s->link == NULL) {
                int e = -errno;
                omv_log_error("cannot connect to '%s': %s", s->cfg->endpoint, omv_strerror(e));
                return e;
            }
        }
        int64_t now = omv_time_ms();
        int wait = attempt == 0 ? 2000 : 1000 + delay_ms;
        if (deadline_ms > 0 && deadline_ms - now < wait)
            wait = (int)(deadline_ms - now) > 1 ? (int)(deadline_ms - now) : 1;
        int r = handshake(s, wait);
        if (r != -ETIMEDOUT)
            return r;
        if (deadline_ms > 0 && omv_time_ms() >= deadline_ms) {
            omv_log_error("no answer from the daemon at %s: is omnivored running?",
                          s->cfg->endpoint);
            return -ETIMEDOUT;
        }
        if (attempt == 0 || attempt % 10 == 0)
            omv_log_warn("no answer from the daemon at %s yet; trying again", s->cfg->endpoint);
        /* A fresh socket each time: nothing stale queued for a daemon that is gone. */
        omv_link_abandon(&s->link);
        struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && !*s->stop)
            ;
        if (*s->stop)
            return -EINTR;
        delay_ms = delay_ms * 2 > 5000 ? 5000 : delay_ms * 2;
    }
}

static void release_engine(session_t *s)
{
    free(s->got);
    free(s->pushed);
    free(s->order);
    free(s->y);
    free(s->x);
    free(s->grad);
    free(s->grad16);
    free(s->grad8);
    free(s->residual);
    free(s->view_seq);
    free(s->params);
    s->got = NULL;
    s->pushed = NULL;
    s->order = NULL;
    s->y = NULL;
    s->x = NULL;
    s->grad = NULL;
    s->grad16 = NULL;
    s->grad8 = NULL;
    s->residual = NULL;
    s->view_seq = NULL;
    s->params = NULL;
    omv_dataset_fini(&s->data);
    omv_net_destroy(&s->net);
    s->prepared = 0;
    s->slice_count = 0;
}

/* Loads [begin, begin + count) of the training set (or the whole test set for an evaluator) and
 * checks it against the model. */
static int load_data(session_t *s, uint32_t begin, uint32_t count)
{
    const omv_jobspec_t *j = &s->job;
    char err[OMV_CONFIG_ERR_MAX];
    omv_dataset_fini(&s->data);
    const char *format = j->data_format[0] ? j->data_format : "idx";
    int r;
    if (s->cfg->role == OMV_ROLE_TRAINER)
        r = omv_dataset_open(&s->data, format, j->train_images, j->train_labels, begin, count, err);
    else
        r = omv_dataset_open(&s->data, format, j->test_images, j->test_labels, 0, 0, err);
    if (r < 0) {
        omv_log_error("%s", err);
        return r;
    }
    const omv_shape_t *in = &s->layout.input;
    if (s->data.channels * s->data.rows * s->data.cols != s->layout.inputs ||
        (in->h * in->w > 1 && s->data.channels != in->c)) {
        omv_log_error("images are %ux%ux%u but the model takes %ux%ux%u", s->data.channels,
                      s->data.rows, s->data.cols, in->c, in->h, in->w);
        return -EINVAL;
    }
    if ((j->n_mean > 1 && j->n_mean != s->data.channels) ||
        (j->n_std > 1 && j->n_std != s->data.channels)) {
        omv_log_error("job normalises %u/%u channels but images have %u", j->n_mean, j->n_std,
                      s->data.channels);
        return -EINVAL;
    }
    if (s->data.max_label >= s->layout.classes) {
        omv_log_error("labels go up to %u but the model has %u classes", s->data.max_label,
                      s->layout.classes);
        return -EINVAL;
    }
    free(s->order);
    s->order = malloc(((size_t)s->data.count ? s->data.count : 1) * sizeof(uint32_t));
    if (s->order == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->data.count; i++)
        s->order[i] = i;
    s->slice_begin = begin;
    s->slice_count = s->data.count;
    s->cursor = s->data.count; /* shuffle before the first batch */
    return 0;
}

/* Checks the job against itself and the data; allocates every buffer the loop needs. */
static int prepare(session_t *s, uint32_t batch)
{
    omv_jobspec_t *j = &s->job;
    char err[OMV_CONFIG_ERR_MAX];
    int r = j->model[0] ? omv_model_parse(&s->layout, j->model, "job's model", err)
                        : omv_model_layout(&s->layout, j->layers, j->n_layers);
    if (r < 0 || s->layout.param_count != j->param_count) {
        omv_log_error("job's model (%u parameters) does not lay out: %s", j->param_count,
                      r < 0 && j->model[0] ? err : "wrong parameter count");
        return -EPROTO;
    }
    s->norm.scale = j->scale;
    s->norm.n_mean = j->n_mean, s->norm.n_std = j->n_std;
    memcpy(s->norm.mean, j->mean, sizeof(s->norm.mean));
    memcpy(s->norm.std, j->std, sizeof(s->norm.std));
    int trainer = s->cfg->role == OMV_ROLE_TRAINER; /* evaluation sees the images as they are */
    s->norm.augment_pad = trainer ? j->augment_pad : 0;
    s->norm.augment_flip = trainer ? j->augment_flip : 0;
    r = load_data(s, j->slice_begin, j->slice_count);
    if (r < 0)
        return r;
    send_heartbeat_if_due(s); /* a large model takes a while to make */
    s->net = omv_net_new_threads(&s->layout, batch, (uint32_t)s->cfg->threads);
    if (s->net != NULL) {
        omv_net_seed(s->net, j->seed ^ ((uint64_t)s->worker_id << 40));
        omv_net_set_tick(s->net, heartbeat_tick, s);
    }
    send_heartbeat_if_due(s);
    s->params = malloc(j->param_count * sizeof(float));
    if (trainer) { /* an evaluator computes no gradient */
        s->grad = malloc(j->param_count * sizeof(float));
        s->grad16 = malloc(j->param_count * sizeof(uint16_t));
    }
    send_heartbeat_if_due(s);
    if (j->wire == OMV_WIRE_INT8 && trainer) {
        uint32_t most = 0;
        for (uint32_t sh = 0; sh < j->n_shards; sh++)
            if (j->shard_offsets[sh + 1] - j->shard_offsets[sh] > most)
                most = j->shard_offsets[sh + 1] - j->shard_offsets[sh];
        s->grad8 = malloc(omv_q8_bytes(most));
        s->residual = calloc(j->param_count, sizeof(float));
        s->view_seq = calloc(j->n_shards, sizeof(uint32_t));
    }
    s->x = malloc((size_t)batch * s->layout.inputs * sizeof(float));
    s->y = malloc(batch);
    s->got = calloc(j->n_shards, 1);
    s->pushed = calloc(j->n_shards, 1);
    if (!s->net || !s->params || (trainer && (!s->grad || !s->grad16)) || !s->x || !s->y ||
        !s->got || !s->pushed ||
        (j->wire == OMV_WIRE_INT8 && trainer && (!s->grad8 || !s->residual || !s->view_seq))) {
        omv_log_error("out of memory for a model of %u parameters, batch %u", j->param_count,
                      batch);
        return -ENOMEM;
    }
    s->prepared = 1;
    return 0;
}

/* Gathers images idx[0..n) of the slice into rows [row, row + n) of x (normalised,
 * channels-last) and y. */
static void gather_rows(session_t *s, uint32_t row, const uint32_t *idx, uint32_t n)
{
    omv_dataset_gather(&s->data, &s->norm, idx, n, s->x + (size_t)row * s->layout.inputs,
                       s->y + row);
}

static void gather(session_t *s, const uint32_t *idx, uint32_t n)
{
    gather_rows(s, 0, idx, n);
}

/* Shuffles for pass s->epoch, from the identity: a pass's order depends only on the seed, the
 * pass and the slice, so a worker can seek to any step. */
static void reshuffle(session_t *s)
{
    for (uint32_t i = 0; i < s->data.count; i++)
        s->order[i] = i;
    omv_rng_t rng;
    omv_rng_init(&rng, s->job.seed ^ (s->epoch * 0x9e3779b97f4a7c15ULL) ^
                           ((uint64_t)s->slice_begin << 32));
    omv_rng_shuffle(&rng, s->order, s->data.count);
    s->norm.augment_seed = omv_rng_next(&rng); /* this pass's crops and flips */
    s->epoch++;
    s->cursor = 0;
}

/* Puts the data position where step `step` of an uninterrupted run would find it: pass
 * step / steps_per_pass, in that pass's order. So a worker that (re)joins at step t, after a
 * daemon restart say, goes on with the same images it would have had. */
static void seek_step(session_t *s, uint64_t step, uint32_t batch)
{
    uint32_t n = s->data.count;
    uint64_t per_pass = n >= batch ? n / batch : 0;
    if (per_pass == 0) {
        s->epoch = 0;
        s->cursor = n; /* cycled through from a fresh shuffle */
        return;
    }
    s->epoch = step / per_pass;
    reshuffle(s); /* shuffles for pass s->epoch, then counts it */
    s->cursor = (uint32_t)((step % per_pass) * batch);
}

/* The next batch of our slice: passes over it in a seeded random order, reshuffled each pass
 * (the tail shorter than a batch waits for the next pass). A slice smaller than a batch is
 * cycled through. */
static void next_batch(session_t *s, uint32_t batch)
{
    uint32_t n = s->data.count;
    if (n >= batch) {
        if (n - s->cursor < batch)
            reshuffle(s);
        gather(s, s->order + s->cursor, batch);
        s->cursor += batch;
        return;
    }
    for (uint32_t done = 0; done < batch;) {
        if (s->cursor >= n)
            reshuffle(s);
        uint32_t take = batch - done < n - s->cursor ? batch - done : n - s->cursor;
        gather_rows(s, done, s->order + s->cursor, take);
        s->cursor += take;
        done += take;
    }
}

/* Asks for the parameters of step: from the daemon, or from every shard server. */
static int send_pull(session_t *s, uint64_t step)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull.worker_id = s->worker_id;
    m.u.pull.step = step;
    m.u.pull.view = s->view[0];
    if (s->n_servers == 0)
        return send_msg(s, &m, NULL);
    for (uint32_t i = 0; i < s->n_servers; i++) {
        m.u.pull.view = s->view[1 + i];
        int r = send_on(s, s->links[1 + i], &m, NULL);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Where this step's parameters are read and its gradient written, as the shared-memory link
 * takes the way the daemon sent shard p (worker/shmlink.h). Returns 0 or -EPROTO. */
static int take_way(session_t *s, const omv_params_t *p)
{
    int r = omv_shmlink_step(&s->shm, p, s->have == 0, s->worker_id);
    if (r < 0 || s->have > 0)
        return r < 0 ? r : 0;
    /* What int8 rounding kept back belongs to the socket's gradients: shared memory carries
     * fp32, and a residual many steps old would come back as noise. At most a step's rounding
     * is dropped. */
    if (r == 1 && s->residual)
        memset(s->residual, 0, s->job.param_count * sizeof(float));
    if (p->wire == OMV_WIRE_SHM) /* params is not kept up to date meanwhile: a view begins again */
        memset(s->view, 0, sizeof(s->view));
    s->p = omv_shmlink_params(&s->shm, s->params);
    s->g = omv_shmlink_grads(&s->shm, s->grad);
    return 0;
}

/* The link a message came from, as an index of links (0: the daemon's). */
static uint32_t from_index(const session_t *s)
{
    for (uint32_t i = 1; i < 1 + s->n_servers + s->n_backups; i++)
        if (s->links[i] == s->from)
            return i;
    return 0;
}

/* Checks that Params p (fp32 or int8, with a view: wire int8) fit our view of its shard: a
 * whole shard begins a view, a change must be the next one to the view we hold. Returns 0, or
 * WAIT_LOST after logging why (register again: the next Welcome begins every view anew). */
static int take_view(session_t *s, const omv_params_t *p)
{
    uint64_t *view = &s->view[from_index(s)];
    if (s->view_seq == NULL) {
        omv_log_error("daemon sent parameters as changes to a view, to a worker of a job whose "
                      "wire is not int8");
        return -EPROTO;
    }
    if (p->wire == OMV_WIRE_FP32) {
        *view = p->view;
        s->view_seq[p->shard] = 0;
        s->wholes_got++;
        return 0;
    }
    if (p->view != *view || p->view_seq != s->view_seq[p->shard] + 1) {
        omv_log_error("worker %u: shard %u came as change %u to view %016llx, but we hold change "
                      "%u to view %016llx: registering again, to start from the whole model",
                      s->worker_id, p->shard, p->view_seq, (unsigned long long)p->view,
                      s->view_seq[p->shard], (unsigned long long)*view);
        *view = 0;
        return WAIT_LOST;
    }
    s->view_seq[p->shard] = p->view_seq;
    s->changes_got++;
    return 0;
}

/* Takes one shard of the parameters asked for into params. The first fixes the step and the
 * batch (begin_step keeps it in s->batch); the others must agree. Returns 0 or -EPROTO. */
static int take_params(session_t *s, const omv_params_t *p)
{
    const omv_jobspec_t *j = &s->job;
    if (s->have == 0)
        s->step = p->step;
    if (p->step != s->step || p->step < s->asked || p->shard >= j->n_shards || s->got[p->shard] ||
        p->offset != j->shard_offsets[p->shard] ||
        p->count != j->shard_offsets[p->shard + 1] - p->offset) {
        omv_log_error("daemon sent parameters that do not fit: step %llu shard %u offset %u "
                      "count %u (asked for step %llu)",
                      (unsigned long long)p->step, p->shard, p->offset, p->count,
                      (unsigned long long)s->asked);
        return -EPROTO;
    }
    /* Shard servers each learn of a member change on their own: the step's batch, slice and
     * group are the ones shard 0's server says (begin_step), whatever the others said. */
    int one_voice = s->n_servers == 0;
    if (p->batch == 0 || p->batch > j->batch_size ||
        (one_voice && s->have > 0 && p->batch != s->batch)) {
        omv_log_error("daemon asks for a batch of %u images; this worker takes 1 to %u, the "
                      "same for every shard of a step",
                      p->batch, j->batch_size);
        return -EPROTO;
    }
    int r = take_way(s, p);
    if (r < 0)
        return r;
    size_t len = 0;
    const void *data = p->wire == OMV_WIRE_SHM ? NULL : omv_link_payload(s->from, &len);
    if (p->view) {
        r = take_view(s, p);
        if (r != 0)
            return r;
    }
    if (p->wire == OMV_WIRE_BF16)
        omv_bf16_to_f32(s->params + p->offset, data, p->count);
    else if (p->wire == OMV_WIRE_FP32)
        memcpy(s->params + p->offset, data, len);
    else if (p->wire == OMV_WIRE_INT8)
        omv_q8_add(s->params + p->offset, data, p->count);
    s->got[p->shard] = 1;
    s->have++;
    return 0;
}

/* Waits for the next shard of the pull under way. Returns 0, WAIT_DONE, WAIT_LOST or a
 * negative errno; *ret (may be NULL) gets the Params. */
static int recv_shard(session_t *s, omv_params_t *ret)
{
    for (;;) {
        omv_msg_t m;
        int r = wait_msg(s, &m, 0);
        if (r != 0)
            return r;
        if (m.type != OMV_MSG_PARAMS) {
            omv_log_warn("ignoring %s while waiting for parameters", omv_msg_name(m.type));
            continue;
        }
        r = take_params(s, &m.u.params);
        if (r == 0 && ret)
            *ret = m.u.params;
        return r;
    }
}

/* Receives shards until params[from, to) hold the step's values. Returns as recv_shard. */
static int await_params(session_t *s, size_t from, size_t to)
{
    const omv_jobspec_t *j = &s->job;
    for (uint32_t sh = 0; from < to && sh < j->n_shards && j->shard_offsets[sh] < to; sh++)
        while (j->shard_offsets[sh + 1] > from && !s->got[sh]) {
            int r = recv_shard(s, NULL);
            if (r != 0)
                return r;
        }
    return 0;
}

/* Waits for the first shard of the parameters asked for step *step_p. The daemon's answer names
 * the step to compute, which may be later than asked (after a regroup, every group starts at a
 * common clock): *step_p gets it. A changed data slice, batch or group in it takes effect for
 * this step; the other shards follow (await_params). Returns 0, WAIT_DONE, WAIT_LOST or a
 * negative errno. */
static int begin_step(session_t *s, uint64_t *step_p)
{
    uint32_t group = s->group;
    s->asked = *step_p;
    s->have = 0;
    memset(s->got, 0, s->job.n_shards);
    memset(s->pushed, 0, s->job.n_shards);
    s->pulled = 0;
    omv_params_t p;
    int r = recv_shard(s, &p);
    while (r == 0 && s->n_servers > 0 && !s->got[0])
        r = recv_shard(s, &p); /* shard 0's server says what the step is made of */
    if (r != 0)
        return r;
    uint64_t step = p.step;
    s->group = p.group;
    uint32_t slice_begin = s->slice_begin, slice_count = s->slice_count;
    if (p.slice_count > 0) {
        slice_begin = p.slice_begin;
        slice_count = p.slice_count;
    }
    if (p.batch != s->batch && s->batch != 0)
        omv_log_info("worker %u: %u images a step now (the group's members changed)", s->worker_id,
                     p.batch);
    int reseek = p.batch != s->batch;
    s->batch = p.batch;
    if (slice_begin != s->slice_begin || slice_count != s->slice_count) {
        omv_log_info("worker %u: data slice is now images [%u, %u)", s->worker_id, slice_begin,
                     slice_begin + slice_count);
        r = load_data(s, slice_begin, slice_count);
        if (r < 0)
            return r;
        reseek = 1;
    }
    if (s->group != group)
        omv_log_info("worker %u: now in group %u from step %llu", s->worker_id, s->group,
                     (unsigned long long)step);
    if (reseek || step != s->asked)
        seek_step(s, step, s->batch);
    *step_p = step;
    return 0;
}

/* Sleeps seconds, as a slower device would compute (unless a signal asks to stop), with a
 * heartbeat when one is due, as a real step's layers send them (heartbeat_tick). */
static void sleep_s(session_t *s, double seconds)
{
    double until = omv_time_s() + seconds;
    for (double left = seconds; left > 0 && !*s->stop; left = until - omv_time_s()) {
        double slice = left < 0.1 ? left : 0.1;
        struct timespec ts = {0, (long)(slice * 1e9)};
        nanosleep(&ts, NULL);
        send_heartbeat_if_due(s);
    }
}

/* Sleeps a random time in [delay_min_ms, delay_max_ms]. */
static void slow_down(session_t *s)
{
    uint32_t span = (uint32_t)(s->cfg->delay_max_ms - s->cfg->delay_min_ms) + 1;
    uint32_t ms = (uint32_t)s->cfg->delay_min_ms + (uint32_t)(omv_rng_next(&s->delay_rng) % span);
    sleep_s(s, ms / 1000.0);
}

/* Pushes shard sh of the step's gradient, as the job's wire asks; loss and ms go with it (the
 * daemon reads them from shard 0's). */
static int push_shard(session_t *s, uint32_t sh, float loss, float ms)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t off = j->shard_offsets[sh], count = j->shard_offsets[sh + 1] - off;
    omv_msg_t m = {.type = OMV_MSG_PUSH};
    uint32_t wire = omv_shmlink_push_wire(&s->shm, j->wire);
    /* Batch norm's running statistics (the last shard's tail) are values, not gradients: one
     * int8 step of a block could make a small variance 0. Their shard goes as bf16. */
    if (wire == OMV_WIRE_INT8 && off + count > s->layout.state_offset)
        wire = OMV_WIRE_BF16;
    m.u.push = (omv_push_t){s->worker_id, s->step, sh, off, count, loss, s->batch, ms, wire};
    const void *values = s->g + off; /* in the segment already when the wire is shm */
    if (wire == OMV_WIRE_BF16) {
        omv_bf16_from_f32(s->grad16 + off, s->g + off, count);
        values = s->grad16 + off;
    } else if (wire == OMV_WIRE_INT8) {
        /* What rounding loses goes out with the next step's gradient (error feedback). */
        omv_q8_encode(s->grad8, s->g + off, s->residual + off, count);
        values = s->grad8;
    }
    s->pushed[sh] = 1;
    /* To the range's backup first: it has every gradient its primary applies. */
    if (s->shard_backup[sh]) {
        int r = omv_link_send(s->links[s->shard_backup[sh]], &m, values);
        if (r == -EAGAIN && !s->backup_warned)
            omv_log_warn("worker %u: the backup of shard %u is not connected: its gradients are "
                         "dropped until the coordinator fails over",
                         s->worker_id, sh);
        s->backup_warned |= r == -EAGAIN;
        if (r < 0 && r != -EAGAIN) {
            omv_log_error("cannot send %s to a backup: %s", omv_msg_name(m.type), omv_strerror(r));
            return r;
        }
    }
    return send_on(s, s->n_servers ? s->links[1 + s->shard_server[sh]] : s->link, &m, values);
}

/* With the model on shard servers, the daemon gets the step's figures on their own. */
static int report_step(session_t *s, float loss, float ms)
{
    if (s->n_servers == 0)
        return 0;
    omv_msg_t m = {.type = OMV_MSG_REPORT};
    m.u.report = (omv_step_report_t){s->worker_id, s->step, loss, s->batch, ms};
    return send_msg(s, &m, NULL);
}

/* Pushes, last first, every shard not pushed yet that starts at or after from, but shard 0:
 * it carries the step's loss and time, and goes last (push_rest). */
static int push_from(session_t *s, size_t from)
{
    for (uint32_t sh = s->job.n_shards; sh-- > 1;)
        if (!s->pushed[sh] && s->job.shard_offsets[sh] >= from) {
            int r = push_shard(s, sh, 0.0f, 0.0f);
            if (r < 0)
                return r;
        }
    return 0;
}

/* Pushes every shard not pushed yet, shard 0 last; then the step's report, if any. */
static int push_rest(session_t *s, float loss, float ms)
{
    int r = push_from(s, 0);
    r = r < 0 ? r : push_shard(s, 0, loss, ms);
    return r < 0 ? r : report_step(s, loss, ms);
}

/* The engine's hooks (worker/net.h): a layer waits only for its own shards, and a shard's
 * gradient goes out as soon as backward has finished it. The next step's pull goes before the
 * first push: the daemon answers it shard by shard as it applies this step's, so what we read
 * is unchanged (every shard comes once this step's update, ours in it, is applied). */
static void hook_need(void *ctx, size_t from, size_t to)
{
    session_t *s = ctx;
    double t0 = omv_time_s();
    if (s->hook_err == 0)
        s->hook_err = await_params(s, from, to);
    s->hook_s += omv_time_s() - t0;
    s->need_s += omv_time_s() - t0;
}

/* Asks for the next step's parameters, once a step. */
static int pull_next(session_t *s)
{
    if (s->pulled)
        return 0;
    s->pulled = 1;
    return send_pull(s, s->step + 1);
}

static void hook_ready(void *ctx, size_t from)
{
    session_t *s = ctx;
    double t0 = omv_time_s();
    if (s->hook_err == 0 && s->have == s->job.n_shards) {
        s->hook_err = pull_next(s);
        if (s->hook_err == 0)
            s->hook_err = push_from(s, from);
    }
    s->hook_s += omv_time_s() - t0;
    s->send_s += omv_time_s() - t0;
}

/* One step with communication overlapping it. Returns 0, WAIT_* or a negative errno. */
static int overlapped_step(session_t *s)
{
    /* A layer cut by shards is computed shard by shard, as they come. */
    const omv_net_hooks_t hooks = {hook_need, hook_ready, s, s->job.shard_offsets,
                                   s->job.n_shards + 1};
    s->hook_err = 0;
    s->hook_s = 0.0;
    double t0 = omv_time_s();
    float loss = omv_net_train_step_hooked(s->net, s->p, s->x, s->y, s->batch, s->g, &hooks);
    if (s->hook_err != 0)
        return s->hook_err;
    /* What the step took to compute, without waiting for shards and sending gradients. */
    float ms = (float)((omv_time_s() - t0 - s->hook_s) * 1000.0);
    double t1 = omv_time_s();
    int r = pull_next(s);
    r = r < 0 ? r : push_rest(s, loss, ms);
    s->send_s += omv_time_s() - t1;
    s->compute_s += ms / 1000.0;
    s->timed_steps++;
    return r;
}

/* One step in the serial order: every shard, compute, every push, then the next pull. */
static int serial_step(session_t *s)
{
    int r = await_params(s, 0, s->job.param_count);
    if (r != 0)
        return r;
    double t0 = omv_time_s();
    float loss = omv_net_train_step(s->net, s->p, s->x, s->y, s->batch, s->g);
    if (s->cfg->slowdown > 1.0)
        sleep_s(s, (s->cfg->slowdown - 1.0) * (omv_time_s() - t0));
    if (s->cfg->delay_max_ms > 0)
        slow_down(s);
    float ms = (float)((omv_time_s() - t0) * 1000.0);
    r = push_rest(s, loss, ms);
    return r < 0 ? r : pull_next(s);
}

/* Where the steps went since the last summary (overlapped steps only: the serial order is for
 * emulated slow devices). */
static void log_step_times(session_t *s)
{
    if (s->timed_steps == 0)
        return;
    double n = (double)s->timed_steps;
    omv_log_info("worker %u: %llu steps; per step %.2f ms computing, %.2f ms waiting for the "
                 "step's first parameters, %.2f ms for the rest of them, %.2f ms sending "
                 "gradients",
                 s->worker_id, (unsigned long long)s->timed_steps, s->compute_s * 1e3 / n,
                 s->begin_s * 1e3 / n, s->need_s * 1e3 / n, s->send_s * 1e3 / n);
    s->timed_steps = 0;
    s->compute_s = s->begin_s = s->need_s = s->send_s = 0.0;
}

static int train(session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t batch = j->batch_size;
    if (batch == 0 || batch > 65536 || j->slice_count == 0) {
        omv_log_error("job gives a batch of %u images and a slice of %u", batch, j->slice_count);
        return -EPROTO;
    }
    int r = 0;
    if (!s->prepared)
        r = prepare(s, batch);
    else if (j->slice_begin != s->slice_begin || j->slice_count != s->slice_count)
        r = load_data(s, j->slice_begin, j->slice_count);
    if (r < 0)
        return r;
    /* Every Welcome starts from the daemon's model as it is now (a restart may have gone back
     * to a checkpoint): what int8 rounding kept back from before is dropped. */
    if (s->residual)
        memset(s->residual, 0, j->param_count * sizeof(float));
    memset(s->view, 0, sizeof(s->view)); /* and so is our view of it: it comes whole first */
    s->batch = 0;                        /* the first Params says, and the data position follows */
    omv_log_info("worker %u in group %u from step %llu: images [%u, %u), at most %u a step",
                 s->worker_id, s->group, (unsigned long long)s->start_step, s->slice_begin,
                 s->slice_begin + s->slice_count, batch);
    /* A slower device is emulated after the compute: its pushes wait for the delay. */
    int overlap = !s->cfg->no_overlap && s->cfg->slowdown <= 1.0 && s->cfg->delay_max_ms <= 0;
    r = send_pull(s, s->start_step);
    for (uint64_t step = s->start_step; r == 0; step++) {
        double t0 = omv_time_s();
        r = begin_step(s, &step);
        s->begin_s += omv_time_s() - t0;
        if (r != 0)
            break;
        next_batch(s, s->batch);
        r = overlap ? overlapped_step(s) : serial_step(s);
    }
    log_step_times(s);
    if (s->changes_got + s->wholes_got > 0)
        omv_log_info("worker %u: %llu shards of parameters came as int8 changes to our view of "
                     "them, %llu whole (fp32) to begin a view",
                     s->worker_id, (unsigned long long)s->changes_got,
                     (unsigned long long)s->wholes_got);
    s->changes_got = s->wholes_got = 0;
    return r;
}

/* Evaluates params on the test set and sends the result for evaluation eval_id. */
static int evaluate_model(session_t *s, uint64_t eval_id, uint32_t batch)
{
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t at = 0; at < s->data.count; at += batch) {
        uint32_t n = s->data.count - at < batch ? s->data.count - at : batch;
        uint32_t c;
        double l;
        gather(s, s->order + at, n);
        omv_net_evaluate(s->net, s->params, s->x, s->y, n, &c, &l);
        correct += c;
        loss += l;
        /* A long evaluation must not look like a dead evaluator. */
        send_heartbeat_if_due(s);
    }
    omv_msg_t res = {.type = OMV_MSG_EVAL_RESULT};
    res.u.eval_result = (omv_eval_result_t){s->worker_id, eval_id, correct, s->data.count,
                                            (float)(loss / s->data.count)};
    return send_msg(s, &res, NULL);
}

/* An evaluation's range from a shard server (Params whose step is the evaluation's id): taken
 * into params when it is the evaluation awaited (or a newer one, which the coordinator asked
 * for after the awaited one was given up) and covers whole shards not in yet. Returns 0, or
 * -EPROTO for a range that does not fit the model. */
static int take_range(session_t *s, const omv_params_t *p, uint64_t *want, uint32_t *have,
                      int *asked)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t end = p->shard;
    while (end < j->n_shards && j->shard_offsets[end + 1] <= p->offset + (uint64_t)p->count)
        end++;
    size_t len = 0;
    const void *data = omv_link_payload(s->from, &len);
    if (s->from == s->link || p->wire != OMV_WIRE_FP32 || p->shard >= j->n_shards ||
        p->offset != j->shard_offsets[p->shard] || p->count == 0 || end == p->shard ||
        j->shard_offsets[end] != p->offset + (uint64_t)p->count ||
        len != (size_t)p->count * sizeof(float)) {
        omv_log_error("a shard server sent evaluation %llu's parameters [%u, +%u) from shard %u, "
                      "which are not whole shards of the model",
                      (unsigned long long)p->step, p->offset, p->count, p->shard);
        return -EPROTO;
    }
    if (p->step < *want)
        return 0; /* an evaluation given up */
    if (p->step > *want) {
        *want = p->step;
        *have = 0;
        *asked = 0;
        memset(s->got, 0, j->n_shards);
    }
    for (uint32_t sh = p->shard; sh < end; sh++)
        if (s->got[sh])
            return 0; /* twice: the first is kept */
    memset(s->got + p->shard, 1, end - p->shard);
    memcpy(s->params + p->offset, data, len);
    *have += end - p->shard;
    return 0;
}

static int evaluate(session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t batch = j->eval_batch_size ? j->eval_batch_size : 1000;
    if (!s->prepared) {
        int r = prepare(s, batch);
        if (r < 0)
            return r;
    }
    omv_log_info("evaluator %u: %u test images", s->worker_id, s->data.count);
    /* With the model on shard servers, the coordinator's request (no parameters) says which
     * evaluation is due, and each server sends its range itself, in either order. */
    uint64_t want = 0;
    uint32_t have = 0;
    int asked = 0;
    for (;;) {
        omv_msg_t m;
        int r = wait_msg(s, &m, 0);
        if (r != 0)
            return r;
        if (m.type == OMV_MSG_PARAMS) {
            r = take_range(s, &m.u.params, &want, &have, &asked);
        } else if (m.type != OMV_MSG_EVAL_REQUEST) {
            omv_log_warn("evaluator ignores %s", omv_msg_name(m.type));
            continue;
        } else if (m.u.eval_request.count == 0 && s->n_servers > 0) {
            if (m.u.eval_request.eval_id > want) {
                want = m.u.eval_request.eval_id;
                have = 0;
                memset(s->got, 0, j->n_shards);
            }
            asked |= m.u.eval_request.eval_id == want;
        } else if (m.u.eval_request.count != j->param_count) {
            omv_log_error("eval snapshot has %u parameters, the model %u", m.u.eval_request.count,
                          j->param_count);
            return -EPROTO;
        } else {
            size_t len = 0;
            const void *data = omv_link_payload(s->link, &len);
            memcpy(s->params, data, len);
            r = evaluate_model(s, m.u.eval_request.eval_id, batch);
        }
        if (r == 0 && asked && have == j->n_shards) {
            asked = 0;
            r = evaluate_model(s, want, batch);
        }
        if (r < 0)
            return r;
    }
}

int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop)
{
    session_t s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    omv_shmlink_init(&s.shm, cfg);
    s.stop = stop;
    /* The engine splits each batch over cfg->threads threads of its own; BLAS runs one thread
     * per call so that the two pools do not fight (measured: bench/bench_net.c). */
    omv_blas_set_threads(1);
    omv_rng_init(&s.delay_rng, (uint64_t)getpid() * 0x9e3779b97f4a7c15ULL);
    int64_t deadline = omv_time_ms() + cfg->hello_timeout_ms;
    int r;
    for (;;) {
        r = register_with_backoff(&s, deadline);
        if (r != 0)
            break;
        r = s.idle ? idle(&s) : cfg->role == OMV_ROLE_TRAINER ? train(&s) : evaluate(&s);
        if (r != WAIT_LOST)
            break;
        /* The daemon is gone or forgot us: find it again, for up to retry_ms. */
        s.previous_id = s.worker_id;
        s.worker_id = 0;
        servers_close(&s, 0);
        omv_link_abandon(&s.link);
        deadline = cfg->retry_ms > 0 ? omv_time_ms() + cfg->retry_ms : 0;
    }
    if (r == -EINTR && s.worker_id != 0 && s.link != NULL) {
        /* Say goodbye, so that our group does not wait for our timeout. */
        omv_msg_t m = {.type = OMV_MSG_LEAVE};
        m.u.leave.worker_id = s.worker_id;
        omv_strlcpy(m.u.leave.reason, "stopped by signal", sizeof(m.u.leave.reason));
        send_msg(&s, &m, NULL);
    }
    if (r == WAIT_DONE)
        r = 0;
    release_engine(&s);
    omv_shmlink_fini(&s.shm);
    servers_close(&s, 1);
    omv_link_destroy(&s.link);
    return r;
}
