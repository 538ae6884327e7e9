/* omnivored's event loop: registration, pulls and pushes, groups, evaluation, status. */
#define OMV_LOG_TAG "daemon"
#include "daemon.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "dataset.h"
#include "groups.h"
#include "kv.h"
#include "log.h"
#include "model.h"
#include "router.h"
#include "shard.h"
#include "strbuf.h"
#include "util.h"
#include "wire.h"

#define FIELD(f) offsetof(omv_daemon_config_t, f)
#define STR(f) OMV_CONFIG_STRING, FIELD(f), sizeof(((omv_daemon_config_t *)0)->f)

const omv_config_entry_t omv_daemon_table[] = {
    {"daemon", "endpoint", STR(endpoint), "tcp://*:5555", 0, 0, 0,
     "where workers connect: tcp://ADDR:PORT or ipc://PATH"},
    {"daemon", "control", STR(control), "/run/omnivore/control.sock", 0, 0, 0,
     "control socket for omnivorectl"},
    {"daemon", "job", STR(job), "", 0, 0, 0, "job file to run at start"},
    {"daemon", "log_level", STR(log_level), "info", 0, 0, OMV_CONFIG_RUNTIME,
     "error, warn, info or debug"},
};
const size_t omv_daemon_table_len = OMV_ARRAY_SIZE(omv_daemon_table);

#define CRON_MS 100
#define MAX_EVALUATORS 4
#define REFUSALS_LOGGED 10

typedef enum { JOB_WAITING, JOB_RUNNING, JOB_FINISHING, JOB_DONE, JOB_FAILED } job_state_t;
static const char *const state_names[] = {"waiting", "running", "finishing", "done", "failed"};

typedef struct {
    int used, alive;
    omv_peer_t peer;
    omv_role_t role;
    uint32_t slot;  /* trainers: slot and slice index */
    char host[64];
    uint32_t pid;
    int64_t last_seen_ms;
    uint64_t steps; /* steps pushed */
    int parked;     /* a pull is waiting */
    uint64_t parked_step;
} member_t;

typedef struct {
    double epoch, wall_s, accuracy, loss;
} eval_point_t;

struct omv_daemon {
    omv_daemon_config_t cfg;
    omv_job_t job;
    char job_path[OMV_JOB_PATH_MAX];
    omv_router_t *router;
    omv_control_t *control;
    int shutdown;

    /* The model. */
    omv_model_layout_t layout;
    float *params; /* [param_count], split among the shards */
    uint32_t n_shards;
    uint32_t shard_offsets[OMV_WIRE_MAX_SHARDS + 1];
    omv_shard_t *shards;
    float *scratch; /* [largest shard] for gradients whose payload is misaligned */
    omv_sgd_t sgd;
    omv_groups_t *groups;

    /* Members: trainers take ids 1..workers, evaluators after; id = index + 1. */
    member_t *members;
    uint32_t n_members_max, n_members, n_trainers;

    /* The job's schedule. */
    job_state_t state;
    uint32_t slice_count, steps_per_epoch, total_steps;
    uint32_t worker_batch; /* images per worker per step: the group's batch over its members */
    uint64_t epoch_images; /* images in one epoch across all slices */
    double created_s, start_s, train_end_s, end_s;
    uint64_t images_total, steps_total;
    uint64_t *group_images; /* [groups] images of the group's current step */
    double loss_sum;        /* since the last progress line */
    uint64_t loss_n;
    double last_loss;
    double last_line_s;
    uint64_t last_line_images;
    char fail_reason[256];

    /* Evaluation. */
    uint32_t evaluator; /* member index + 1 of the live evaluator; 0 none */
    int eval_busy, eval_wanted, eval_final_sent;
    uint64_t eval_id;
    double eval_epoch, eval_wall_s;
    double next_eval_epoch;
    eval_point_t *history;
    size_t n_history, cap_history;

    uint64_t refused[OMV_REFUSE_COUNT_];
    int64_t last_cron_ms;
};

static double now_s(void)
{
    return omv_time_s();
}

static double epoch_now(const omv_daemon_t *d)
{
    return d->epoch_images ? (double)d->images_total / (double)d->epoch_images : 0.0;
}

static double since_start(const omv_daemon_t *d)
{
    return d->start_s > 0 ? now_s() - d->start_s : 0.0;
}

/* ---- sending ---- */

static void send_to(omv_daemon_t *d, member_t *m, const omv_peer_t *peer, const omv_msg_t *msg,
                    const float *payload)
{
    int r = omv_router_send(d->router, peer, msg, payload);
    if (r < 0 && m != NULL)
        omv_log_debug("cannot send %s to worker %u: %s", omv_msg_name(msg->type),
                      (unsigned)(m - d->members) + 1, omv_strerror(r));
}

static void refuse(omv_daemon_t *d, const omv_peer_t *peer, omv_refuse_t code, const char *who,
                   const char *reason)
{
    uint64_t n = ++d->refused[code];
    if (n <= REFUSALS_LOGGED)
        omv_log_warn("refused %s from %s: %s%s", omv_refuse_name(code), who, reason,
                     n == REFUSALS_LOGGED ? " (further refusals of this kind are only counted)"
                                          : "");
    omv_msg_t e;
    omv_wire_error(&e, code, "%s", reason);
    send_to(d, NULL, peer, &e, NULL);
}

static void send_stop(omv_daemon_t *d, member_t *m, const char *reason)
{
    omv_msg_t s = {.type = OMV_MSG_STOP};
    omv_strlcpy(s.u.stop.reason, reason, sizeof(s.u.stop.reason));
    send_to(d, m, &m->peer, &s, NULL);
}

static void send_params(omv_daemon_t *d, member_t *m, uint64_t step)
{
    omv_msg_t p = {.type = OMV_MSG_PARAMS};
    for (uint32_t s = 0; s < d->n_shards; s++) {
        const omv_shard_t *sh = &d->shards[s];
        p.u.params = (omv_params_t){step, s, sh->offset, sh->count,
                                    (uint32_t)omv_groups_of(d->groups, m->slot)};
        send_to(d, m, &m->peer, &p, sh->params);
    }
}

/* ---- groups' events ---- */

static void on_apply(void *ctx, uint32_t group, uint32_t shard, uint32_t contributors)
{
    omv_daemon_t *d = ctx;
    omv_shard_apply(&d->shards[shard], group, contributors, &d->sgd);
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    omv_daemon_t *d = ctx;
    (void)clock;
    d->images_total += d->group_images[group];
    d->group_images[group] = 0;
    d->steps_total++;
}

static void on_retire(void *ctx, uint32_t group)
{
    omv_daemon_t *d = ctx;
    for (uint32_t s = 0; s < d->n_shards; s++)
        omv_shard_discard(&d->shards[s], group);
    d->group_images[group] = 0;
    omv_log_warn("group %u has no live workers left", group);
}

/* ---- evaluation ---- */

static void request_eval(omv_daemon_t *d)
{
    if (d->evaluator == 0)
        return;
    if (d->eval_busy) {
        d->eval_wanted = 1;
        return;
    }
    member_t *ev = &d->members[d->evaluator - 1];
    omv_msg_t m = {.type = OMV_MSG_EVAL_REQUEST};
    m.u.eval_request.eval_id = ++d->eval_id;
    m.u.eval_request.count = (uint32_t)d->layout.param_count;
    send_to(d, ev, &ev->peer, &m, d->params);
    d->eval_busy = 1;
    d->eval_wanted = 0;
    d->eval_epoch = epoch_now(d);
    d->eval_wall_s = since_start(d);
    if (d->state == JOB_FINISHING)
        d->eval_final_sent = 1;
}

static void history_add(omv_daemon_t *d, double accuracy, double loss)
{
    if (d->n_history == d->cap_history) {
        size_t cap = d->cap_history ? d->cap_history * 2 : 64;
        eval_point_t *h = realloc(d->history, cap * sizeof(*h));
        if (h == NULL) {
            omv_log_warn("out of memory for the evaluation history; this point is not kept");
            return;
        }
        d->history = h;
        d->cap_history = cap;
    }
    d->history[d->n_history++] = (eval_point_t){d->eval_epoch, d->eval_wall_s, accuracy, loss};
}

/* ---- job lifecycle ---- */

static void finish(omv_daemon_t *d, job_state_t state, const char *why)
{
    d->state = state;
    d->end_s = now_s();
    if (d->train_end_s == 0)
        d->train_end_s = d->end_s;
    for (uint32_t i = 0; i < d->n_members; i++)
        if (d->members[i].alive)
            send_stop(d, &d->members[i], why);
    if (state == JOB_DONE) {
        double acc = d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
        double train_s = d->train_end_s - d->start_s;
        omv_log_info("job '%s' done: test_accuracy %.4f, %.2f epochs, %.1f s, %.0f images/s",
                     d->job.name, acc, epoch_now(d), d->end_s - d->start_s,
                     train_s > 0 ? (double)d->images_total / train_s : 0.0);
    } else {
        omv_strlcpy(d->fail_reason, why, sizeof(d->fail_reason));
        omv_log_error("job '%s' failed: %s", d->job.name, why);
    }
}

static int live_trainers(const omv_daemon_t *d)
{
    int n = 0;
    for (uint32_t i = 0; i < d->n_members; i++)
        n += d->members[i].alive && d->members[i].role == OMV_ROLE_TRAINER;
    return n;
}

/* Moves the job along after anything changed: parked pulls, evaluations, the end. */
static void progress(omv_daemon_t *d)
{
    if (d->state == JOB_RUNNING) {
        if (live_trainers(d) == 0) {
            finish(d, JOB_FAILED, "every trainer is gone");
            return;
        }
        if (omv_groups_min_clock(d->groups) >= d->total_steps) {
            d->state = JOB_FINISHING;
            d->train_end_s = now_s();
            omv_log_info("training finished after %.1f s; final evaluation",
                         d->train_end_s - d->start_s);
            request_eval(d);
        } else if (d->job.eval_every_epochs > 0 && epoch_now(d) >= d->next_eval_epoch) {
            while (d->next_eval_epoch <= epoch_now(d))
                d->next_eval_epoch += d->job.eval_every_epochs;
            request_eval(d);
        }
    }
    if (d->state == JOB_FINISHING && d->evaluator == 0) {
        omv_log_warn("no evaluator is connected: the job ends without a final test accuracy");
        finish(d, JOB_DONE, "job done");
        return;
    }
    if (d->state != JOB_RUNNING)
        return;
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (!m->alive || !m->parked || m->parked_step >= d->total_steps)
            continue;
        int g = omv_groups_of(d->groups, m->slot);
        if (g >= 0 && omv_groups_may_begin(d->groups, (uint32_t)g, m->parked_step)) {
            m->parked = 0;
            send_params(d, m, m->parked_step);
        }
    }
}

/* ---- message handlers ---- */

static void on_hello(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h)
{
    char who[128];
    snprintf(who, sizeof(who), "\"%s\" pid %u", h->hostname, h->pid);
    if (h->protocol_version != OMV_PROTOCOL_VERSION) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why),
                 "protocol version %u is not supported: this daemon speaks version %d",
                 h->protocol_version, OMV_PROTOCOL_VERSION);
        refuse(d, peer, OMV_REFUSE_VERSION, who, why);
        return;
    }
    uint32_t index;
    if (h->role == OMV_ROLE_TRAINER) {
        if (d->state != JOB_WAITING || d->n_trainers == (uint32_t)d->job.workers) {
            char why[OMV_WIRE_REASON_MAX];
            snprintf(why, sizeof(why), "job '%s' already has its %lld workers", d->job.name,
                     (long long)d->job.workers);
            refuse(d, peer, OMV_REFUSE_FULL, who, why);
            return;
        }
        index = d->n_trainers;
    } else {
        if (d->evaluator != 0) {
            refuse(d, peer, OMV_REFUSE_ROLE, who, "an evaluator is already connected");
            return;
        }
        /* Evaluator slots follow the trainer slots. */
        index = (uint32_t)d->job.workers;
        while (index < d->n_members_max && d->members[index].used)
            index++;
        if (index == d->n_members_max) {
            refuse(d, peer, OMV_REFUSE_FULL, who, "no evaluator slot is left");
            return;
        }
    }
    member_t *m = &d->members[index];
    memset(m, 0, sizeof(*m));
    m->used = m->alive = 1;
    m->peer = *peer;
    m->role = h->role;
    m->pid = h->pid;
    omv_strlcpy(m->host, h->hostname, sizeof(m->host));
    m->last_seen_ms = omv_time_ms();
    if (index + 1 > d->n_members)
        d->n_members = index + 1;

    omv_msg_t w = {.type = OMV_MSG_WELCOME};
    omv_welcome_t *wl = &w.u.welcome;
    omv_jobspec_t *j = &wl->job;
    wl->protocol_version = OMV_PROTOCOL_VERSION;
    wl->worker_id = index + 1;
    omv_strlcpy(j->name, d->job.name, sizeof(j->name));
    j->n_layers = d->job.n_layers;
    memcpy(j->layers, d->job.layers, sizeof(j->layers));
    omv_strlcpy(j->model, d->job.model_text, sizeof(j->model));
    omv_strlcpy(j->data_format, d->job.data_format, sizeof(j->data_format));
    j->scale = (float)d->job.scale;
    j->n_mean = d->job.n_mean, j->n_std = d->job.n_std;
    memcpy(j->mean, d->job.mean, sizeof(j->mean));
    memcpy(j->std, d->job.std, sizeof(j->std));
    omv_strlcpy(j->train_images, d->job.train_images, sizeof(j->train_images));
    omv_strlcpy(j->train_labels, d->job.train_labels, sizeof(j->train_labels));
    omv_strlcpy(j->test_images, d->job.test_images, sizeof(j->test_images));
    omv_strlcpy(j->test_labels, d->job.test_labels, sizeof(j->test_labels));
    j->batch_size = d->worker_batch;
    j->seed = (uint64_t)d->job.seed;
    j->steps_per_epoch = d->steps_per_epoch;
    j->total_steps = d->total_steps;
    j->param_count = (uint32_t)d->layout.param_count;
    j->n_shards = d->n_shards;
    memcpy(j->shard_offsets, d->shard_offsets, (d->n_shards + 1) * sizeof(uint32_t));
    j->eval_batch_size = (uint32_t)d->job.eval_batch_size;
    if (h->role == OMV_ROLE_TRAINER) {
        m->slot = index;
        uint32_t group = index % (uint32_t)d->job.groups;
        omv_groups_join(d->groups, index, group);
        wl->group = group;
        j->slice_begin = index * d->slice_count;
        j->slice_count = d->slice_count;
        d->n_trainers++;
        omv_log_info("worker %u (%s) registered: group %u, images [%u, %u) (%u of %lld)",
                     index + 1, who, group, j->slice_begin, j->slice_begin + j->slice_count,
                     d->n_trainers, (long long)d->job.workers);
    } else {
        d->evaluator = index + 1;
        omv_log_info("evaluator %u (%s) registered", index + 1, who);
    }
    send_to(d, m, peer, &w, NULL);
    if (d->state == JOB_WAITING && d->n_trainers == (uint32_t)d->job.workers) {
        d->state = JOB_RUNNING;
        d->start_s = d->last_line_s = now_s();
        omv_log_info("job '%s' running: %lld workers in %lld groups, staleness %s, %u steps",
                     d->job.name, (long long)d->job.workers, (long long)d->job.groups,
                     d->job.staleness < 0 ? "none" : "bounded", d->total_steps);
    }
    if (h->role == OMV_ROLE_EVALUATOR && d->state == JOB_FINISHING && !d->eval_busy)
        request_eval(d);
}

static void on_pull(omv_daemon_t *d, member_t *m, const omv_pull_t *p)
{
    if (m->role != OMV_ROLE_TRAINER) {
        refuse(d, &m->peer, OMV_REFUSE_ROLE, m->host, "an evaluator does not pull");
        return;
    }
    if (d->state == JOB_DONE || d->state == JOB_FAILED) {
        send_stop(d, m, d->state == JOB_DONE ? "job done" : d->fail_reason);
        return;
    }
    int g = omv_groups_of(d->groups, m->slot);
    uint64_t clock = g >= 0 ? omv_groups_clock(d->groups, (uint32_t)g) : 0;
    if (m->parked || p->step < clock || p->step > d->total_steps) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "pull for step %llu but group %d is at step %llu%s",
                 (unsigned long long)p->step, g, (unsigned long long)clock,
                 m->parked ? " and a pull is already waiting" : "");
        refuse(d, &m->peer, OMV_REFUSE_STEP, m->host, why);
        return;
    }
    m->parked = 1;
    m->parked_step = p->step;
}

static void on_push(omv_daemon_t *d, member_t *m, const omv_push_t *p, const void *payload)
{
    char why[OMV_WIRE_REASON_MAX];
    char who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", (unsigned)(m - d->members) + 1, m->host);
    if (m->role != OMV_ROLE_TRAINER) {
        refuse(d, &m->peer, OMV_REFUSE_ROLE, who, "an evaluator does not push");
        return;
    }
    if (d->state != JOB_RUNNING) {
        snprintf(why, sizeof(why), "gradient while the job is %s", state_names[d->state]);
        refuse(d, &m->peer, OMV_REFUSE_STEP, who, why);
        return;
    }
    omv_refuse_t code = omv_groups_check_push(d->groups, m->slot, p->step, p->shard, why);
    if (code != OMV_REFUSE_NONE) {
        refuse(d, &m->peer, code, who, why);
        return;
    }
    omv_shard_t *sh = &d->shards[p->shard];
    if (p->offset != sh->offset || p->count != sh->count) {
        snprintf(why, sizeof(why), "shard %u holds [%u, +%u) but the gradient is [%u, +%u)",
                 p->shard, sh->offset, sh->count, p->offset, p->count);
        refuse(d, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return;
    }
    const float *grad = payload;
    if (((uintptr_t)payload & (sizeof(float) - 1)) != 0) {
        memcpy(d->scratch, payload, (size_t)sh->count * sizeof(float));
        grad = d->scratch;
    }
    int finite = omv_all_finite(grad, sh->count) && isfinite(p->loss);
    if (!finite) {
        snprintf(why, sizeof(why), "gradient of step %llu shard %u has NaN or Inf values; "
                 "dropped, the model is unchanged", (unsigned long long)p->step, p->shard);
        refuse(d, &m->peer, OMV_REFUSE_NOT_FINITE, who, why);
    } else {
        omv_shard_accumulate(sh, (uint32_t)omv_groups_of(d->groups, m->slot), grad);
    }
    if (p->shard == 0) {
        m->steps++;
        if (finite) {
            d->group_images[omv_groups_of(d->groups, m->slot)] += p->samples;
            d->loss_sum += p->loss;
            d->loss_n++;
            d->last_loss = p->loss;
        }
    }
    omv_groups_record_push(d->groups, m->slot, p->shard, finite);
}

static void on_eval_result(omv_daemon_t *d, member_t *m, const omv_eval_result_t *e)
{
    if (!d->eval_busy || e->eval_id != d->eval_id || e->total == 0 || e->correct > e->total) {
        refuse(d, &m->peer, OMV_REFUSE_STEP, m->host, "evaluation result that was not asked for");
        return;
    }
    d->eval_busy = 0;
    double acc = (double)e->correct / e->total;
    history_add(d, acc, e->loss);
    omv_log_info("eval: epoch %.2f test_accuracy %.4f test_loss %.4f (%u images)", d->eval_epoch,
                 acc, e->loss, e->total);
    if (d->state == JOB_FINISHING) {
        if (d->eval_final_sent)
            finish(d, JOB_DONE, "job done");
        else
            request_eval(d);
    } else if (d->eval_wanted) {
        request_eval(d);
    }
}

static member_t *find_member(omv_daemon_t *d, const omv_peer_t *peer, uint32_t id)
{
    if (id == 0 || id > d->n_members)
        return NULL;
    member_t *m = &d->members[id - 1];
    if (!m->used || !m->alive || m->peer.len != peer->len ||
        memcmp(m->peer.id, peer->id, peer->len) != 0)
        return NULL;
    return m;
}

static void on_message(omv_daemon_t *d, const omv_peer_t *peer, const omv_msg_t *msg)
{
    uint32_t id;
    switch (msg->type) {
    case OMV_MSG_HELLO:
        on_hello(d, peer, &msg->u.hello);
        return;
    case OMV_MSG_PULL:
        id = msg->u.pull.worker_id;
        break;
    case OMV_MSG_PUSH:
        id = msg->u.push.worker_id;
        break;
    case OMV_MSG_HEARTBEAT:
        id = msg->u.heartbeat.worker_id;
        break;
    case OMV_MSG_EVAL_RESULT:
        id = msg->u.eval_result.worker_id;
        break;
    default: {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "a worker may not send %s", omv_msg_name(msg->type));
        refuse(d, peer, OMV_REFUSE_MALFORMED, "a peer", why);
        return;
    }
    }
    member_t *m = find_member(d, peer, id);
    if (m == NULL) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "%s from worker id %u, which is not registered from this peer"
                 " (or was declared dead)", omv_msg_name(msg->type), id);
        refuse(d, peer, OMV_REFUSE_UNKNOWN_WORKER, "a peer", why);
        return;
    }
    m->last_seen_ms = omv_time_ms();
    size_t len;
    const void *payload = omv_router_payload(d->router, &len);
    switch (msg->type) {
    case OMV_MSG_PULL:
        on_pull(d, m, &msg->u.pull);
        break;
    case OMV_MSG_PUSH:
        on_push(d, m, &msg->u.push, payload);
        break;
    case OMV_MSG_EVAL_RESULT:
        on_eval_result(d, m, &msg->u.eval_result);
        break;
    default:
        break;
    }
}

/* ---- periodic work ---- */

static void declare_dead(omv_daemon_t *d, member_t *m, double silent_s)
{
    uint32_t id = (uint32_t)(m - d->members) + 1;
    m->alive = 0;
    m->parked = 0;
    omv_log_warn("worker %u (\"%s\" pid %u) silent for %.1f s: declared dead", id, m->host, m->pid,
                 silent_s);
    if (m->role == OMV_ROLE_TRAINER) {
        omv_groups_leave(d->groups, m->slot);
    } else if (d->evaluator == id) {
        d->evaluator = 0;
        d->eval_busy = 0;
        d->eval_final_sent = 0;
    }
}

static void cron(omv_daemon_t *d)
{
    int64_t now = omv_time_ms();
    int64_t timeout = (int64_t)(d->job.worker_timeout_s * 1000);
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (m->alive && now - m->last_seen_ms > timeout && d->state != JOB_DONE &&
            d->state != JOB_FAILED)
            declare_dead(d, m, (double)(now - m->last_seen_ms) / 1000.0);
    }
    double t = now_s();
    if (d->state == JOB_RUNNING && t - d->last_line_s >= d->job.progress_interval_s) {
        double rate = (double)(d->images_total - d->last_line_images) / (t - d->last_line_s);
        double loss = d->loss_n ? d->loss_sum / (double)d->loss_n : NAN;
        char acc[32] = "-";
        if (d->n_history)
            snprintf(acc, sizeof(acc), "%.4f", d->history[d->n_history - 1].accuracy);
        omv_log_info("epoch %.2f/%lld step %llu loss %.4f images/s %.0f test_accuracy %s",
                     epoch_now(d), (long long)d->job.epochs,
                     (unsigned long long)omv_groups_min_clock(d->groups), loss, rate, acc);
        d->last_line_s = t;
        d->last_line_images = d->images_total;
        d->loss_sum = 0;
        d->loss_n = 0;
    }
}

/* ---- control socket ---- */

static void history_json(const omv_daemon_t *d, omv_strbuf_t *out)
{
    omv_strbuf_append(out, "[", 1);
    for (size_t i = 0; i < d->n_history; i++) {
        const eval_point_t *h = &d->history[i];
        omv_strbuf_printf(out,
                          "%s{\"epoch\":%.4f,\"wall_seconds\":%.3f,\"test_accuracy\":%.4f,"
                          "\"test_loss\":%.4f}",
                          i ? "," : "", h->epoch, h->wall_s, h->accuracy, h->loss);
    }
    omv_strbuf_append(out, "]", 1);
}

static double wall_seconds(const omv_daemon_t *d)
{
    if (d->start_s == 0)
        return 0;
    return (d->end_s > 0 ? d->end_s : now_s()) - d->start_s;
}

static double images_per_second(const omv_daemon_t *d)
{
    double end = d->train_end_s > 0 ? d->train_end_s : now_s();
    double s = d->start_s > 0 ? end - d->start_s : 0;
    return s > 0 ? (double)d->images_total / s : 0.0;
}

static void reply_status(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    omv_kv_section(&kv, "daemon");
    omv_kv_str(&kv, "version", OMV_VERSION);
    omv_kv_int(&kv, "protocol_version", OMV_PROTOCOL_VERSION);
    omv_kv_int(&kv, "pid", getpid());
    omv_kv_double(&kv, "uptime_seconds", now_s() - d->created_s, 1);
    omv_kv_str(&kv, "endpoint", d->cfg.endpoint);
    omv_kv_section(&kv, "job");
    omv_kv_str(&kv, "name", d->job.name);
    omv_kv_str(&kv, "file", d->job_path);
    omv_kv_str(&kv, "state", state_names[d->state]);
    if (d->state == JOB_FAILED)
        omv_kv_str(&kv, "reason", d->fail_reason);
    omv_kv_double(&kv, "epoch", epoch_now(d), 3);
    omv_kv_int(&kv, "epochs", d->job.epochs);
    uint64_t step = omv_groups_min_clock(d->groups);
    omv_kv_int(&kv, "step", step == UINT64_MAX ? 0 : (int64_t)step);
    omv_kv_int(&kv, "total_steps", d->total_steps);
    omv_kv_int(&kv, "images_total", (int64_t)d->images_total);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 1);
    omv_kv_double(&kv, "loss", d->last_loss, 4);
    omv_kv_double(&kv, "test_accuracy", d->n_history ? d->history[d->n_history - 1].accuracy : NAN, 4);
    omv_kv_double(&kv, "wall_seconds", wall_seconds(d), 2);
    omv_kv_section(&kv, "cluster");
    omv_kv_int(&kv, "workers_expected", d->job.workers);
    omv_kv_int(&kv, "workers_registered", d->n_trainers);
    omv_kv_int(&kv, "workers_alive", live_trainers(d));
    omv_kv_int(&kv, "evaluator_alive", d->evaluator != 0);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_int(&kv, "staleness", d->job.staleness);
    omv_kv_int(&kv, "shards", d->n_shards);
    omv_strbuf_t clocks;
    omv_strbuf_init(&clocks);
    omv_strbuf_append(&clocks, json ? "[" : "", json ? 1 : 0);
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++)
        omv_strbuf_printf(&clocks, "%s%llu", g ? (json ? "," : " ") : "",
                          (unsigned long long)omv_groups_clock(d->groups, g));
    omv_strbuf_append(&clocks, json ? "]" : "", json ? 1 : 0);
    omv_kv_raw(&kv, "group_clocks", omv_strbuf_str(&clocks));
    omv_strbuf_fini(&clocks);
    omv_kv_section(&kv, "refusals");
    char key[64];
    uint64_t total = 0;
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++) {
        snprintf(key, sizeof(key), "refused_%s_total", omv_refuse_name((omv_refuse_t)i));
        omv_kv_int(&kv, key, (int64_t)d->refused[i]);
        total += d->refused[i];
    }
    omv_kv_int(&kv, "refused_total", (int64_t)total);
    omv_kv_end(&kv);
}

static void reply_workers(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    int64_t now = omv_time_ms();
    for (uint32_t i = 0; i < d->n_members; i++) {
        const member_t *m = &d->members[i];
        if (!m->used)
            continue;
        char name[32];
        snprintf(name, sizeof(name), "worker %u", i + 1);
        omv_kv_section(&kv, name);
        omv_kv_str(&kv, "role", m->role == OMV_ROLE_TRAINER ? "trainer" : "evaluator");
        omv_kv_str(&kv, "host", m->host);
        omv_kv_int(&kv, "pid", m->pid);
        omv_kv_str(&kv, "state", m->alive ? "alive" : "dead");
        omv_kv_int(&kv, "group", m->role == OMV_ROLE_TRAINER ? (int64_t)(m->slot % d->job.groups) : -1);
        omv_kv_int(&kv, "steps", (int64_t)m->steps);
        omv_kv_int(&kv, "last_seen_ms", now - m->last_seen_ms);
    }
    omv_kv_end(&kv);
}

static void reply_summary(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    double acc = d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
    double loss = d->n_history ? d->history[d->n_history - 1].loss : NAN;
    if (json) {
        omv_strbuf_append(out, "{\"job\":", 7);
        omv_strbuf_json_string(out, d->job.name);
        omv_strbuf_printf(out, ",\"state\":\"%s\"", state_names[d->state]);
        if (isfinite(acc))
            omv_strbuf_printf(out, ",\"test_accuracy\":%.4f,\"test_loss\":%.4f", acc, loss);
        else
            omv_strbuf_printf(out, ",\"test_accuracy\":null,\"test_loss\":null");
        omv_strbuf_printf(out,
                          ",\"epochs\":%.3f,\"wall_seconds\":%.3f,\"images_per_second\":%.1f,"
                          "\"images_total\":%llu,\"workers\":%lld,\"groups\":%lld,"
                          "\"staleness\":%lld,\"batch_size\":%lld,\"learning_rate\":%g,"
                          "\"momentum\":%g,\"history\":",
                          epoch_now(d), wall_seconds(d), images_per_second(d),
                          (unsigned long long)d->images_total, (long long)d->job.workers,
                          (long long)d->job.groups, (long long)d->job.staleness,
                          (long long)d->job.batch_size, d->job.learning_rate, d->job.momentum);
        history_json(d, out);
        omv_strbuf_append(out, "}\n", 2);
        return;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "summary");
    omv_kv_str(&kv, "job", d->job.name);
    omv_kv_str(&kv, "state", state_names[d->state]);
    omv_kv_double(&kv, "test_accuracy", acc, 4);
    omv_kv_double(&kv, "test_loss", loss, 4);
    omv_kv_double(&kv, "epochs", epoch_now(d), 2);
    omv_kv_double(&kv, "wall_seconds", wall_seconds(d), 1);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 0);
    omv_kv_int(&kv, "workers", d->job.workers);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_section(&kv, "history");
    for (size_t i = 0; i < d->n_history; i++) {
        char key[32], val[128];
        snprintf(key, sizeof(key), "eval_%zu", i + 1);
        snprintf(val, sizeof(val), "epoch=%.2f wall_seconds=%.1f test_accuracy=%.4f",
                 d->history[i].epoch, d->history[i].wall_s, d->history[i].accuracy);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_end(&kv);
}

static int on_control(void *ctx, int argc, char **argv, omv_strbuf_t *reply)
{
    omv_daemon_t *d = ctx;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            omv_strbuf_printf(reply, "'%s' takes no argument '%s'", argv[0], argv[i]);
            return -EINVAL;
        }
    }
    if (strcmp(argv[0], "status") == 0) {
        reply_status(d, reply, json);
    } else if (strcmp(argv[0], "workers") == 0) {
        reply_workers(d, reply, json);
    } else if (strcmp(argv[0], "summary") == 0) {
        reply_summary(d, reply, json);
    } else if (strcmp(argv[0], "shutdown") == 0) {
        omv_log_info("shutdown requested over the control socket");
        d->shutdown = 1;
        omv_strbuf_printf(reply, "shutting down\n");
    } else if (strcmp(argv[0], "help") == 0) {
        omv_strbuf_printf(reply, "commands: status, workers, summary, shutdown, help "
                                 "(--json for JSON)\n");
    } else {
        omv_strbuf_printf(reply, "unknown command '%s'; try 'help'", argv[0]);
        return -EINVAL;
    }
    return 0;
}

/* ---- life ---- */

static int setup_job(omv_daemon_t *d)
{
    char err[OMV_CONFIG_ERR_MAX];
    const omv_job_t *j = &d->job;
    uint32_t count, channels, rows, cols;
    int r = omv_dataset_probe_format(j->data_format, j->train_images, &count, &channels, &rows,
                                     &cols, err);
    if (r < 0) {
        omv_log_error("%s", err);
        return r;
    }
    if (channels * rows * cols != j->layers[0]) {
        omv_log_error("%s: images are %ux%ux%u = %u values but the model takes %u inputs",
                      j->train_images, channels, rows, cols, channels * rows * cols,
                      j->layers[0]);
        return -EINVAL;
    }
    if (j->train_limit > 0 && (uint64_t)j->train_limit < count)
        count = (uint32_t)j->train_limit;
    d->slice_count = count / (uint32_t)j->workers;
    d->worker_batch = (uint32_t)(j->batch_size / (j->workers / j->groups));
    d->steps_per_epoch = d->slice_count / d->worker_batch;
    if (d->steps_per_epoch == 0) {
        omv_log_error("%s: %u images split over %lld workers leave fewer than a batch of %u "
                      "per worker", j->train_images, count, (long long)j->workers,
                      d->worker_batch);
        return -EINVAL;
    }
    if ((uint64_t)d->steps_per_epoch * (uint64_t)j->epochs > UINT32_MAX / 2) {
        omv_log_error("job is too long: %u steps per epoch for %lld epochs", d->steps_per_epoch,
                      (long long)j->epochs);
        return -EINVAL;
    }
    d->total_steps = d->steps_per_epoch * (uint32_t)j->epochs;
    d->epoch_images = (uint64_t)d->steps_per_epoch * d->worker_batch * (uint64_t)j->workers;

    r = omv_model_parse(&d->layout, j->model_text, j->model_name, err);
    if (r < 0) {
        omv_log_error("%s", err);
        return r;
    }
    char table[4096];
    omv_model_summary(&d->layout, table, sizeof(table));
    for (char *line = table, *eol; (eol = strchr(line, '\n')) != NULL; line = eol + 1)
        omv_log_info("model: %.*s", (int)(eol - line), line);
    d->n_shards = (uint32_t)j->shards;
    if (d->n_shards > d->layout.param_count)
        d->n_shards = (uint32_t)d->layout.param_count;
    omv_model_shard_offsets(d->layout.param_count, d->n_shards, d->shard_offsets);
    d->params = malloc(d->layout.param_count * sizeof(float));
    d->shards = calloc(d->n_shards, sizeof(omv_shard_t));
    d->group_images = calloc((size_t)j->groups, sizeof(uint64_t));
    d->n_members_max = (uint32_t)j->workers + MAX_EVALUATORS;
    d->members = calloc(d->n_members_max, sizeof(member_t));
    uint32_t largest = 0;
    for (uint32_t s = 0; s < d->n_shards; s++) {
        uint32_t c = d->shard_offsets[s + 1] - d->shard_offsets[s];
        largest = c > largest ? c : largest;
    }
    d->scratch = malloc((size_t)largest * sizeof(float));
    if (!d->params || !d->shards || !d->group_images || !d->members || !d->scratch)
        return -ENOMEM;
    omv_model_init(&d->layout, d->params, (uint64_t)j->seed);
    for (uint32_t s = 0; s < d->n_shards; s++) {
        uint32_t off = d->shard_offsets[s];
        r = omv_shard_init(&d->shards[s], d->params + off, off, d->shard_offsets[s + 1] - off,
                           (uint32_t)j->groups);
        if (r < 0)
            return r;
    }
    omv_groups_events_t ev = {on_apply, on_advance, on_retire, d};
    d->groups = omv_groups_new((uint32_t)j->workers, (uint32_t)j->groups, d->n_shards,
                               j->staleness, &ev);
    if (d->groups == NULL)
        return -ENOMEM;
    d->sgd = (omv_sgd_t){(float)j->learning_rate, (float)j->momentum, (float)j->weight_decay};
    d->next_eval_epoch = j->eval_every_epochs;
    omv_log_info("job '%s': model %s (%zu parameters in %u shards), %u images per worker, "
                 "%u steps per epoch", j->name, j->layers_text[0] ? j->layers_text : j->definition,
                 d->layout.param_count,
                 d->n_shards, d->slice_count, d->steps_per_epoch);
    return 0;
}

omv_daemon_t *omv_daemon_new(const omv_daemon_config_t *cfg, const omv_job_t *job,
                             const char *job_path)
{
    omv_daemon_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->cfg = *cfg;
    d->job = *job;
    omv_strlcpy(d->job_path, job_path, sizeof(d->job_path));
    d->created_s = now_s();
    int r = setup_job(d);
    if (r < 0)
        goto fail;
    d->router = omv_router_new(cfg->endpoint);
    if (d->router == NULL) {
        r = -errno;
        omv_log_error("cannot bind worker endpoint '%s': %s", cfg->endpoint, omv_strerror(r));
        goto fail;
    }
    d->control = omv_control_new(cfg->control);
    if (d->control == NULL) {
        r = -errno;
        omv_log_error("cannot listen on control socket '%s': %s%s", cfg->control,
                      omv_strerror(r), r == -EADDRINUSE ? " (another omnivored runs there)" : "");
        goto fail;
    }
    omv_log_info("listening for workers on %s, control on %s", cfg->endpoint, cfg->control);
    return d;
fail:
    omv_daemon_destroy(&d);
    errno = -r;
    return NULL;
}

void omv_daemon_destroy(omv_daemon_t **self_p)
{
    omv_daemon_t *d = *self_p;
    if (d == NULL)
        return;
    omv_control_destroy(&d->control);
    omv_router_destroy(&d->router);
    omv_groups_destroy(&d->groups);
    for (uint32_t s = 0; d->shards && s < d->n_shards; s++)
        omv_shard_fini(&d->shards[s]);
    free(d->shards);
    free(d->params);
    free(d->scratch);
    free(d->members);
    free(d->group_images);
    free(d->history);
    free(d);
    *self_p = NULL;
}

int omv_daemon_run(omv_daemon_t *d, volatile sig_atomic_t *stop)
{
    int fds[1] = {omv_control_fd(d->control)};
    d->last_cron_ms = omv_time_ms();
    while (!*stop && !d->shutdown) {
        short revents[1];
        int router_ready = 0;
        int64_t wait = d->last_cron_ms + CRON_MS - omv_time_ms();
        int r = omv_router_poll(d->router, fds, 1, revents, &router_ready,
                                wait > 0 ? (int)wait : 0);
        if (r < 0 && r != -EINTR) {
            omv_log_error("poll failed: %s", omv_strerror(r));
            return r;
        }
        if (r > 0 && router_ready) {
            /* Drain what is queued, then move the job along once. */
            for (int n = 0; n < 1024; n++) {
                omv_peer_t peer;
                omv_msg_t msg;
                char why[OMV_WIRE_REASON_MAX];
                int rr = omv_router_recv(d->router, &peer, &msg, why);
                if (rr == -EAGAIN || rr == -EINTR)
                    break;
                if (rr == -EPROTO) {
                    refuse(d, &peer, OMV_REFUSE_MALFORMED, "a peer", why);
                    continue;
                }
                if (rr < 0) {
                    omv_log_error("receive failed: %s", omv_strerror(rr));
                    break;
                }
                on_message(d, &peer, &msg);
            }
            progress(d);
        }
        if (r > 0 && (revents[0] & POLLIN))
            omv_control_serve(d->control, on_control, d);
        if (omv_time_ms() - d->last_cron_ms >= CRON_MS) {
            d->last_cron_ms = omv_time_ms();
            cron(d);
            progress(d);
        }
    }
    if (d->state != JOB_DONE && d->state != JOB_FAILED) {
        for (uint32_t i = 0; i < d->n_members; i++)
            if (d->members[i].alive)
                send_stop(d, &d->members[i], "daemon is shutting down");
    }
    omv_log_info("stopped");
    return 0;
}
