/* omnivored's event loop: membership (registration, leaving, death, rejoining), pulls and
 * pushes, groups, evaluation, the job's lifecycle and its periodic work. */
#define OMV_LOG_TAG "daemon"
#include "daemon.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon_priv.h"
#include "dataset.h"
#include "log.h"
#include "notify.h"
#include "util.h"

#define FIELD(f) offsetof(omv_daemon_config_t, f)
#define STR(f) OMV_CONFIG_STRING, FIELD(f), sizeof(((omv_daemon_config_t *)0)->f)

const omv_config_entry_t omv_daemon_table[] = {
    {"daemon", "endpoint", STR(endpoint), "tcp://*:5555", 0, 0, 0,
     "where workers connect: tcp://ADDR:PORT or ipc://PATH"},
    {"daemon", "control", STR(control), "/run/omnivore/control.sock", 0, 0, 0,
     "control socket for omnivorectl"},
    {"daemon", "job", STR(job), "", 0, 0, 0,
     "job file to run at start (empty: start idle and wait for omnivorectl submit)"},
    {"daemon", "log_level", STR(log_level), "info", 0, 0, OMV_CONFIG_RUNTIME,
     "error, warn, info or debug"},
    {"daemon", "state_dir", STR(state_dir), "/var/lib/omnivore", 0, 0, 0,
     "state folder: checkpoints go to STATE_DIR/checkpoints/JOB_NAME unless the job says"},
};
const size_t omv_daemon_table_len = OMV_ARRAY_SIZE(omv_daemon_table);

const char *const omv_daemon_state_names[] = {"waiting", "running", "finishing", "done",
                                              "failed",  "stopped", "idle"};

#define CRON_MS 100
#define REFUSALS_LOGGED 10
/* How long the daemon waits on its way out for groups to finish applying a step, so that the
 * last checkpoint holds whole steps. */
#define EXIT_SETTLE_MS 2000

static void reload(omv_daemon_t *d);

static double now_s(void)
{
    return omv_time_s();
}

double omv_daemon_epoch(const omv_daemon_t *d)
{
    return d->train_count ? (double)d->images_total / (double)d->train_count : 0.0;
}

/* Seconds of training so far, across restarts. */
double omv_daemon_train_seconds(const omv_daemon_t *d)
{
    if (d->start_s == 0)
        return d->train_s_before;
    double end = d->train_end_s > 0 ? d->train_end_s : now_s();
    return d->train_s_before + (end - d->start_s);
}

double omv_daemon_wall_seconds(const omv_daemon_t *d)
{
    if (d->start_s == 0)
        return d->train_s_before;
    return d->train_s_before + (d->end_s > 0 ? d->end_s : now_s()) - d->start_s;
}

int omv_daemon_live_trainers(const omv_daemon_t *d)
{
    int n = 0;
    for (uint32_t i = 0; i < d->n_members; i++)
        n += d->members[i].state == MEMBER_ALIVE && d->members[i].role == OMV_ROLE_TRAINER;
    return n;
}

const char *omv_daemon_member_state(const member_t *m)
{
    static const char *const names[] = {"alive", "dead", "left", "idle", "done"};
    return names[m->state];
}

static uint32_t member_id(const omv_daemon_t *d, const member_t *m)
{
    return (uint32_t)(m - d->members) + 1;
}

/* ---- sending ---- */

static void send_to(omv_daemon_t *d, member_t *m, const omv_peer_t *peer, const omv_msg_t *msg,
                    const float *payload)
{
    int r = omv_router_send(d->router, peer, msg, payload);
    if (r < 0 && m != NULL)
        omv_log_debug("cannot send %s to worker %u: %s", omv_msg_name(msg->type),
                      member_id(d, m), omv_strerror(r));
}

void omv_daemon_refuse(omv_daemon_t *d, const omv_peer_t *peer, omv_refuse_t code, const char *who,
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
    uint32_t group = (uint32_t)omv_groups_of(d->groups, m->slot);
    /* The staleness this read has: how far the slowest other live group is behind it. */
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++) {
        uint64_t c = omv_groups_clock(d->groups, g);
        if (g != group && omv_groups_live(d->groups, g) > 0 && c < step &&
            step - c > d->staleness_max_observed)
            d->staleness_max_observed = step - c;
    }
    /* The group's batch is the job's, whoever is in it: its live members share it. */
    m->served = 1;
    m->served_step = step;
    uint32_t live = omv_groups_live(d->groups, group);
    uint32_t batch = (uint32_t)d->job.batch_size / (live ? live : 1);
    /* Each shard's thread answers with a snapshot of its part, sent without a copy; commands
     * to a shard run in order, so every update applied so far is in it. */
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_SERVE, .group = group, .step = step,
                           .worker_id = member_id(d, m), .slice_begin = m->slice_begin,
                           .slice_count = m->slice_count, .batch = batch ? batch : 1};
    for (uint32_t s = 0; s < d->n_shards; s++)
        omv_shard_thread_send(d->threads[s], &cmd, &m->peer, NULL);
}

/* ---- groups' events ---- */

static void on_apply(void *ctx, uint32_t group, uint32_t shard, uint32_t contributors)
{
    omv_daemon_t *d = ctx;
    (void)contributors; /* the shard's thread counts the gradients it summed */
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_APPLY, .group = group, .sgd = d->sgd};
    omv_shard_thread_send(d->threads[shard], &cmd, NULL, NULL);
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    omv_daemon_t *d = ctx;
    (void)clock;
    uint64_t images = d->group_images[group];
    double loss = d->group_loss_n[group] ? d->group_loss_sum[group] / d->group_loss_n[group] : NAN;
    /* A probe's steps are thrown away when the optimizer restores its snapshot: they do not
     * count as training. */
    if (omv_daemon_opt_probing(d))
        d->probe_images_total += images;
    else
        d->images_total += images;
    d->group_images[group] = 0;
    d->group_loss_sum[group] = 0;
    d->group_loss_n[group] = 0;
    d->steps_total++;
    omv_daemon_opt_step(d, group, loss, images);
}

static void on_retire(void *ctx, uint32_t group)
{
    omv_daemon_t *d = ctx;
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_DISCARD, .group = group};
    for (uint32_t s = 0; s < d->n_shards; s++)
        omv_shard_thread_send(d->threads[s], &cmd, NULL, NULL);
    d->group_images[group] = 0;
    omv_log_warn("group %u has no live workers left", group);
}

/* ---- membership ---- */

/* Divides the training set among the live trainers in order of id. While the job waits for its
 * workers the plan is for all of them, so that nobody's slice changes when the last one comes. */
static void assign_slices(omv_daemon_t *d)
{
    uint32_t live = (uint32_t)omv_daemon_live_trainers(d);
    uint32_t parts = d->state == JOB_WAITING && live < (uint32_t)d->job.workers
                         ? (uint32_t)d->job.workers
                         : live;
    if (parts == 0)
        return;
    uint32_t i = 0;
    for (uint32_t k = 0; k < d->n_members; k++) {
        member_t *m = &d->members[k];
        if (m->state != MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER)
            continue;
        uint32_t begin = (uint32_t)((uint64_t)d->train_count * i / parts);
        uint32_t end = (uint32_t)((uint64_t)d->train_count * (i + 1) / parts);
        m->slice_begin = begin;
        m->slice_count = end - begin;
        i++;
    }
}

/* The group a newcomer joins: the one with the fewest live members, the lowest on ties. */
static uint32_t pick_group(const omv_daemon_t *d)
{
    uint32_t best = 0;
    for (uint32_t g = 1; g < omv_groups_count(d->groups); g++)
        if (omv_groups_live(d->groups, g) < omv_groups_live(d->groups, best))
            best = g;
    return best;
}

static int free_slot(const omv_daemon_t *d)
{
    for (uint32_t s = 0; s < d->n_slots; s++)
        if (omv_groups_of(d->groups, s) < 0)
            return (int)s;
    return -1;
}

/* A record for a newcomer: a never-used one, else the oldest record of a member that is gone. */
static int free_record(const omv_daemon_t *d)
{
    for (uint32_t i = 0; i < d->n_members_max; i++)
        if (!d->members[i].used)
            return (int)i;
    int best = -1;
    for (uint32_t i = 0; i < d->n_members_max; i++)
        if (d->members[i].state != MEMBER_ALIVE &&
            (best < 0 || d->members[i].last_seen_ms < d->members[best].last_seen_ms))
            best = (int)i;
    return best;
}

/* Takes a member out: its group stops waiting for it and its data goes to the others. */
static void remove_member(omv_daemon_t *d, member_t *m, member_state_t why)
{
    uint32_t id = member_id(d, m);
    member_state_t was = m->state;
    m->state = why;
    m->parked = 0;
    if (was != MEMBER_ALIVE)
        return; /* idle: in no job */
    if (m->role == OMV_ROLE_TRAINER) {
        omv_groups_leave(d->groups, m->slot);
        assign_slices(d);
        omv_daemon_opt_membership(d);
    } else if (d->evaluator == id) {
        d->evaluator = 0;
        d->eval_busy = 0;
        d->eval_final_sent = 0;
    }
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
    if (omv_daemon_gather(d, 0) < 0)
        return;
    omv_msg_t m = {.type = OMV_MSG_EVAL_REQUEST};
    m.u.eval_request.eval_id = ++d->eval_id;
    m.u.eval_request.count = (uint32_t)d->layout.param_count;
    send_to(d, ev, &ev->peer, &m, d->gather_params);
    d->eval_busy = 1;
    d->eval_wanted = 0;
    d->eval_sent_ms = omv_time_ms();
    d->eval_epoch = omv_daemon_epoch(d);
    d->eval_wall_s = omv_daemon_train_seconds(d);
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

static void start_job(omv_daemon_t *d, const char *why)
{
    d->state = JOB_RUNNING;
    d->start_s = d->last_line_s = now_s();
    d->ckpt_last_s = d->start_s;
    d->ckpt_last_step = omv_groups_min_clock(d->groups);
    assign_slices(d);
    omv_daemon_timeline_start(d);
    if (omv_daemon_opt_start(d) < 0) {
        omv_daemon_finish(d, JOB_FAILED, "the optimizer cannot start (see the log)");
        return;
    }
    omv_log_info("job '%s' running%s: %d workers in %lld groups, staleness %s, until %llu "
                 "images (%.2f epochs) are done",
                 d->job.name, why, omv_daemon_live_trainers(d), (long long)d->job.groups,
                 d->job.staleness < 0 ? "none" : "bounded",
                 (unsigned long long)d->target_images, (double)d->job.epochs);
}

void omv_daemon_finish(omv_daemon_t *d, job_state_t state, const char *why)
{
    d->state = state;
    d->end_s = now_s();
    if (d->train_end_s == 0)
        d->train_end_s = d->end_s;
    omv_daemon_timeline_end(d);
    /* The workers exit (--once), or stay and register again for whatever comes next. */
    omv_msg_t again = {.type = OMV_MSG_STOP};
    snprintf(again.u.stop.reason, sizeof(again.u.stop.reason),
             "job '%s' is %s: register again for the next job", d->job.name,
             omv_daemon_state_names[state]);
    again.u.stop.reconnect = 1;
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (m->state != MEMBER_ALIVE)
            continue;
        if (d->cfg.once) {
            send_stop(d, m, why);
        } else {
            send_to(d, m, &m->peer, &again, NULL);
            m->state = MEMBER_DONE;
        }
    }
    if (!d->cfg.once)
        d->evaluator = 0;
    if (state == JOB_DONE) {
        double acc = d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
        double train_s = omv_daemon_train_seconds(d);
        omv_log_info("job '%s' done: test_accuracy %.4f, %.2f epochs, %.1f s, %.0f images/s",
                     d->job.name, acc, omv_daemon_epoch(d), omv_daemon_wall_seconds(d),
                     train_s > 0 ? (double)d->images_total / train_s : 0.0);
        if (d->ckpt_enabled)
            omv_daemon_checkpoint(d, 1);
    } else if (state == JOB_STOPPED) {
        omv_strlcpy(d->fail_reason, why, sizeof(d->fail_reason));
        omv_log_info("job '%s' stopped at epoch %.2f: %s", d->job.name, omv_daemon_epoch(d),
                     why);
    } else {
        omv_strlcpy(d->fail_reason, why, sizeof(d->fail_reason));
        omv_log_error("job '%s' failed: %s", d->job.name, why);
    }
}

/* Moves the job along after anything changed: parked pulls, evaluations, checkpoints, the end. */
static void progress(omv_daemon_t *d)
{
    if (d->state == JOB_RUNNING) {
        if (omv_daemon_live_trainers(d) == 0) {
            omv_daemon_finish(d, JOB_FAILED, "every trainer is gone");
            return;
        }
        if (d->images_total >= d->target_images && omv_groups_settled(d->groups)) {
            d->state = JOB_FINISHING;
            d->train_end_s = now_s();
            omv_log_info("training finished after %.1f s; final evaluation",
                         omv_daemon_train_seconds(d));
            request_eval(d);
        } else if (d->job.eval_every_epochs > 0 && omv_daemon_epoch(d) >= d->next_eval_epoch &&
                   !omv_daemon_opt_probing(d)) {
            while (d->next_eval_epoch <= omv_daemon_epoch(d))
                d->next_eval_epoch += d->job.eval_every_epochs;
            request_eval(d);
        }
    }
    if (d->state == JOB_FINISHING && d->evaluator == 0) {
        omv_log_warn("no evaluator is connected: the job ends without a final test accuracy");
        omv_daemon_finish(d, JOB_DONE, "job done");
        return;
    }
    if (d->state == JOB_RUNNING && d->ckpt_enabled && d->job.checkpoint_every_steps > 0) {
        /* Checked as steps complete, not by the clock, so no more than the interval is lost. */
        uint64_t step = omv_groups_min_clock(d->groups);
        if (step != UINT64_MAX &&
            step >= d->ckpt_last_step + (uint64_t)d->job.checkpoint_every_steps)
            d->ckpt_due = 1;
    }
    omv_daemon_checkpoint_if_due(d);
    if (d->stop_requested && !d->ckpt_due && d->state == JOB_RUNNING) {
        /* `omnivorectl stop`: at once, so that no step goes past the checkpoint. */
        omv_daemon_finish(d, JOB_STOPPED, "stopped by omnivorectl stop");
        return;
    }
    if (d->state != JOB_RUNNING)
        return;
    /* With a change pending, only groups that began their step may finish it; the others wait
     * for the change. */
    int holding = d->reconfig.pending && !omv_daemon_try_reconfig(d);
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (m->state != MEMBER_ALIVE || !m->parked)
            continue;
        int g = omv_groups_of(d->groups, m->slot);
        if (holding && (g < 0 || !omv_daemon_group_begun(d, (uint32_t)g)))
            continue;
        if (g >= 0 && omv_groups_may_begin(d->groups, (uint32_t)g, m->parked_step)) {
            m->parked = 0;
            send_params(d, m, m->parked_step);
        }
    }
}

/* ---- message handlers ---- */

static void fill_jobspec(const omv_daemon_t *d, omv_jobspec_t *j)
{
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
    j->batch_size = (uint32_t)d->job.batch_size; /* the most a worker is given per step */
    j->seed = (uint64_t)d->job.seed;
    j->param_count = (uint32_t)d->layout.param_count;
    j->n_shards = d->n_shards;
    memcpy(j->shard_offsets, d->shard_offsets, (d->n_shards + 1) * sizeof(uint32_t));
    j->eval_batch_size = (uint32_t)d->job.eval_batch_size;
}

static void on_hello(omv_daemon_t *d, const omv_peer_t *peer, const omv_hello_t *h)
{
    char who[128];
    snprintf(who, sizeof(who), "\"%s\" pid %u", h->hostname, h->pid);
    if (h->protocol_version != OMV_PROTOCOL_VERSION) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why),
                 "protocol version %u is not supported: this daemon speaks version %d",
                 h->protocol_version, OMV_PROTOCOL_VERSION);
        omv_daemon_refuse(d, peer, OMV_REFUSE_VERSION, who, why);
        return;
    }
    int no_job = !d->has_job || OMV_JOB_OVER(d->state) || d->state == JOB_FINISHING;
    if (no_job && d->cfg.once) {
        /* Nothing to do for it: tell it so rather than leave it waiting. */
        omv_msg_t s = {.type = OMV_MSG_STOP};
        snprintf(s.u.stop.reason, sizeof(s.u.stop.reason), "job '%s' is %s", d->job.name,
                 omv_daemon_state_names[d->state]);
        send_to(d, NULL, peer, &s, NULL);
        return;
    }
    int slot = -1;
    if (no_job) {
        /* A long-running daemon keeps it until a job comes (Stop with reconnect then). */
    } else if (h->role == OMV_ROLE_TRAINER) {
        slot = free_slot(d);
        if (slot < 0) {
            char why[OMV_WIRE_REASON_MAX];
            snprintf(why, sizeof(why), "job '%s' has no room for another worker (%u slots)",
                     d->job.name, d->n_slots);
            omv_daemon_refuse(d, peer, OMV_REFUSE_FULL, who, why);
            return;
        }
    } else if (d->evaluator != 0) {
        omv_daemon_refuse(d, peer, OMV_REFUSE_ROLE, who, "an evaluator is already connected");
        return;
    }
    /* A worker that registers again because a job ended or began is not rejoining after a
     * fault, and it keeps its id. */
    uint32_t prev = h->previous_worker_id;
    const member_t *old = prev != 0 && prev <= d->n_members ? &d->members[prev - 1] : NULL;
    int between_jobs = old && (old->state == MEMBER_DONE || old->state == MEMBER_IDLE) &&
                       old->pid == h->pid && strcmp(old->host, h->hostname) == 0;
    int rejoin = prev != 0 && !between_jobs;
    int index = between_jobs ? (int)prev - 1 : free_record(d);
    if (index < 0) {
        omv_daemon_refuse(d, peer, OMV_REFUSE_FULL, who, "no member record is free");
        return;
    }
    member_t *m = &d->members[index];
    omv_peer_t job_peer = between_jobs ? old->peer : (omv_peer_t){0};
    memset(m, 0, sizeof(*m));
    m->job_peer = job_peer;
    m->used = 1;
    m->state = no_job ? MEMBER_IDLE : MEMBER_ALIVE;
    m->peer = *peer;
    m->role = h->role;
    m->pid = h->pid;
    m->previous_id = h->previous_worker_id;
    omv_strlcpy(m->host, h->hostname, sizeof(m->host));
    omv_strlcpy(m->name, h->name, sizeof(m->name));
    m->joined_ms = m->last_seen_ms = omv_time_ms();
    if ((uint32_t)index + 1 > d->n_members)
        d->n_members = (uint32_t)index + 1;

    omv_msg_t w = {.type = OMV_MSG_WELCOME};
    omv_welcome_t *wl = &w.u.welcome;
    wl->protocol_version = OMV_PROTOCOL_VERSION;
    wl->worker_id = (uint32_t)index + 1;
    if (no_job) {
        wl->idle = 1;
        omv_log_info("%s %d (%s) registered; no job to run: it waits for the next one",
                     h->role == OMV_ROLE_TRAINER ? "worker" : "evaluator", index + 1, who);
        send_to(d, m, peer, &w, NULL);
        return;
    }
    if (d->first_hello_s == 0)
        d->first_hello_s = now_s();
    fill_jobspec(d, &wl->job);
    if (h->role == OMV_ROLE_TRAINER) {
        uint32_t group = pick_group(d);
        m->slot = (uint32_t)slot;
        int next = omv_groups_join(d->groups, m->slot, group);
        assign_slices(d);
        omv_daemon_opt_membership(d);
        wl->group = group;
        wl->start_step = omv_groups_clock(d->groups, group) + (next > 0 ? 1 : 0);
        wl->job.slice_begin = m->slice_begin;
        wl->job.slice_count = m->slice_count;
        wl->job.steps_per_epoch = d->worker_batch ? m->slice_count / d->worker_batch : 0;
        d->joins_total++;
        if (rejoin)
            d->rejoins_total++;
        omv_log_info("worker %d (%s) %s: group %u from step %llu, images [%u, %u); %d alive",
                     index + 1, who, rejoin ? "rejoined" : "registered", group,
                     (unsigned long long)wl->start_step, m->slice_begin,
                     m->slice_begin + m->slice_count, omv_daemon_live_trainers(d));
    } else {
        d->evaluator = (uint32_t)index + 1;
        omv_log_info("evaluator %d (%s) registered", index + 1, who);
    }
    send_to(d, m, peer, &w, NULL);
    if (d->state == JOB_WAITING &&
        omv_daemon_live_trainers(d) >= (int)d->job.workers)
        start_job(d, "");
}

static void on_pull(omv_daemon_t *d, member_t *m, const omv_pull_t *p)
{
    if (m->role != OMV_ROLE_TRAINER) {
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_ROLE, m->host, "an evaluator does not pull");
        return;
    }
    int g = omv_groups_of(d->groups, m->slot);
    uint64_t clock = g >= 0 ? omv_groups_clock(d->groups, (uint32_t)g) : 0;
    if (m->parked || p->step < clock || p->step > clock + 1) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "pull for step %llu but group %d is at step %llu%s",
                 (unsigned long long)p->step, g, (unsigned long long)clock,
                 m->parked ? " and a pull is already waiting" : "");
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_STEP, m->host, why);
        return;
    }
    /* Answered by progress() once the group and the bound allow; at the end, Stop answers. */
    m->parked = 1;
    m->parked_step = p->step;
}

static void on_push(omv_daemon_t *d, member_t *m, const omv_push_t *p)
{
    char why[OMV_WIRE_REASON_MAX];
    char who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", member_id(d, m), m->host);
    if (m->role != OMV_ROLE_TRAINER) {
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_ROLE, who, "an evaluator does not push");
        return;
    }
    if (d->state == JOB_FINISHING || d->state == JOB_DONE) {
        /* Steps that were under way when the job reached its end: not an error, not applied. */
        d->late_total++;
        return;
    }
    if (d->state != JOB_RUNNING) {
        snprintf(why, sizeof(why), "gradient while the job is %s",
                 omv_daemon_state_names[d->state]);
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_STEP, who, why);
        return;
    }
    omv_refuse_t code = omv_groups_check_push(d->groups, m->slot, p->step, p->shard, why);
    if (code != OMV_REFUSE_NONE) {
        omv_daemon_refuse(d, &m->peer, code, who, why);
        return;
    }
    omv_shard_t *sh = &d->shards[p->shard];
    if (p->offset != sh->offset || p->count != sh->count) {
        snprintf(why, sizeof(why), "shard %u holds [%u, +%u) but the gradient is [%u, +%u)",
                 p->shard, sh->offset, sh->count, p->offset, p->count);
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return;
    }
    uint32_t group = (uint32_t)omv_groups_of(d->groups, m->slot);
    /* The shard's thread checks the values and adds them; a gradient with NaN or Inf comes
     * back as a refusal and stays out of the sum. The step goes on either way. */
    omv_payload_t payload;
    omv_router_take_payload(d->router, &payload);
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_PUSH, .group = group, .step = p->step,
                           .worker_id = member_id(d, m), .sgd = d->sgd,
                           .solo = omv_groups_live(d->groups, group) == 1};
    omv_shard_thread_send(d->threads[p->shard], &cmd, &m->peer, &payload);
    int finite = isfinite(p->loss);
    if (p->shard == 0) {
        m->steps++;
        m->last_compute_ms = p->compute_ms;
        if (finite) {
            m->images += p->samples;
            d->group_images[group] += p->samples;
            d->group_loss_sum[group] += p->loss;
            d->group_loss_n[group]++;
            d->loss_sum += p->loss;
            d->loss_n++;
            d->last_loss = p->loss;
            omv_daemon_timeline_loss(d, p->loss);
        }
    }
    d->pushes_recorded_total++;
    omv_groups_record_push(d->groups, m->slot, p->shard, true);
}

static void on_eval_result(omv_daemon_t *d, member_t *m, const omv_eval_result_t *e)
{
    if (!d->eval_busy || e->eval_id != d->eval_id || e->total == 0 || e->correct > e->total) {
        omv_daemon_refuse(d, &m->peer, OMV_REFUSE_STEP, m->host, "evaluation result that was not asked for");
        return;
    }
    d->eval_busy = 0;
    double acc = (double)e->correct / e->total;
    history_add(d, acc, e->loss);
    omv_log_info("eval: epoch %.2f test_accuracy %.4f test_loss %.4f (%u images)", d->eval_epoch,
                 acc, e->loss, e->total);
    if (d->state == JOB_FINISHING) {
        if (d->eval_final_sent)
            omv_daemon_finish(d, JOB_DONE, "job done");
        else
            request_eval(d);
    } else if (d->job.stop_at_accuracy > 0 && acc >= d->job.stop_at_accuracy &&
               d->state == JOB_RUNNING) {
        omv_log_info("test accuracy %.4f reached [job] stop_at_accuracy = %g after %.1f s",
                     acc, d->job.stop_at_accuracy, d->eval_wall_s);
        d->train_end_s = now_s();
        omv_daemon_finish(d, JOB_DONE, "reached stop_at_accuracy");
    } else if (d->eval_wanted) {
        request_eval(d);
    }
}

static void on_leave(omv_daemon_t *d, member_t *m, const omv_leave_t *l)
{
    omv_log_info("worker %u (\"%s\" pid %u) left: \"%s\"", member_id(d, m), m->host, m->pid,
                 l->reason);
    d->leaves_total++;
    remove_member(d, m, MEMBER_LEFT);
}

static member_t *find_member(omv_daemon_t *d, const omv_peer_t *peer, uint32_t id)
{
    if (id == 0 || id > d->n_members)
        return NULL;
    member_t *m = &d->members[id - 1];
    if (!m->used || (m->state != MEMBER_ALIVE && m->state != MEMBER_IDLE) ||
        m->peer.len != peer->len || memcmp(m->peer.id, peer->id, peer->len) != 0)
        return NULL;
    return m;
}

/* Whether id is the record of a finished job's worker at peer: it was told to register again,
 * and what it sent before it heard is dropped without a word. */
static int from_finished_job(const omv_daemon_t *d, const omv_peer_t *peer, uint32_t id)
{
    if (id == 0 || id > d->n_members)
        return 0;
    const member_t *m = &d->members[id - 1];
    if (!m->used)
        return 0;
    if (m->state == MEMBER_DONE)
        return m->peer.len == peer->len && memcmp(m->peer.id, peer->id, peer->len) == 0;
    return m->job_peer.len == peer->len && m->job_peer.len > 0 &&
           memcmp(m->job_peer.id, peer->id, peer->len) == 0;
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
    case OMV_MSG_LEAVE:
        id = msg->u.leave.worker_id;
        break;
    default: {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "a worker may not send %s", omv_msg_name(msg->type));
        omv_daemon_refuse(d, peer, OMV_REFUSE_MALFORMED, "a peer", why);
        return;
    }
    }
    member_t *m = find_member(d, peer, id);
    if (m == NULL) {
        if (msg->type == OMV_MSG_LEAVE || from_finished_job(d, peer, id))
            return; /* gone already */
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "%s from worker id %u, which is not registered from this peer"
                 " (or was declared dead): register again", omv_msg_name(msg->type), id);
        omv_daemon_refuse(d, peer, OMV_REFUSE_UNKNOWN_WORKER, "a peer", why);
        return;
    }
    m->last_seen_ms = omv_time_ms();
    if (m->state == MEMBER_IDLE && msg->type != OMV_MSG_HEARTBEAT &&
        msg->type != OMV_MSG_LEAVE) {
        omv_log_debug("dropped %s from idle worker %u", omv_msg_name(msg->type), id);
        return;
    }
    switch (msg->type) {
    case OMV_MSG_PULL:
        on_pull(d, m, &msg->u.pull);
        break;
    case OMV_MSG_PUSH:
        on_push(d, m, &msg->u.push);
        break;
    case OMV_MSG_EVAL_RESULT:
        on_eval_result(d, m, &msg->u.eval_result);
        break;
    case OMV_MSG_LEAVE:
        on_leave(d, m, &msg->u.leave);
        break;
    case OMV_MSG_HEARTBEAT: {
        /* Answered, so that a waiting worker knows the daemon is alive. */
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = id;
        send_to(d, m, &m->peer, &hb, NULL);
        break;
    }
    default:
        break;
    }
}

/* ---- periodic work ---- */

static void cron(omv_daemon_t *d)
{
    int64_t now = omv_time_ms();
    /* Without a job, idle workers are held to the default worker_timeout_s. */
    int64_t timeout = (int64_t)((d->has_job ? d->job.worker_timeout_s : 10.0) * 1000);
    {
        int job_on = d->has_job && !OMV_JOB_OVER(d->state);
        for (uint32_t i = 0; i < d->n_members; i++) {
            member_t *m = &d->members[i];
            if (!((m->state == MEMBER_ALIVE && job_on) || m->state == MEMBER_IDLE) ||
                now - m->last_seen_ms <= timeout)
                continue;
            omv_log_warn("worker %u (\"%s\" pid %u) silent for %.1f s: declared dead", i + 1,
                         m->host, m->pid, (double)(now - m->last_seen_ms) / 1000.0);
            d->deaths_total++;
            remove_member(d, m, MEMBER_DEAD);
        }
    }
    double t = now_s();
    if (d->state == JOB_WAITING && d->first_hello_s > 0 && omv_daemon_live_trainers(d) > 0 &&
        t - d->first_hello_s >= d->job.start_timeout_s) {
        char why[128];
        snprintf(why, sizeof(why), " with %d of %lld workers after %.0f s",
                 omv_daemon_live_trainers(d), (long long)d->job.workers, d->job.start_timeout_s);
        start_job(d, why);
    }
    /* An evaluator that takes far longer than anyone should is not waited for forever. */
    if (d->eval_busy && now - d->eval_sent_ms > 10 * timeout + 60000) {
        omv_log_warn("evaluator %u did not answer within %.0f s; evaluating without it",
                     d->evaluator, (double)(now - d->eval_sent_ms) / 1000.0);
        member_t *ev = &d->members[d->evaluator - 1];
        d->deaths_total++;
        remove_member(d, ev, MEMBER_DEAD);
    }
    if (d->state == JOB_RUNNING && d->ckpt_enabled && d->job.checkpoint_every_s > 0 &&
        t - d->ckpt_last_s >= d->job.checkpoint_every_s)
        d->ckpt_due = 1;
    if (d->state == JOB_RUNNING && t - d->last_line_s >= d->job.progress_interval_s) {
        double rate = (double)(d->images_total - d->last_line_images) / (t - d->last_line_s);
        double loss = d->loss_n ? d->loss_sum / (double)d->loss_n : NAN;
        char acc[32] = "-";
        if (d->n_history)
            snprintf(acc, sizeof(acc), "%.4f", d->history[d->n_history - 1].accuracy);
        omv_log_info("epoch %.2f/%lld step %llu loss %.4f images/s %.0f test_accuracy %s "
                     "workers %d",
                     omv_daemon_epoch(d), (long long)d->job.epochs,
                     (unsigned long long)omv_groups_min_clock(d->groups), loss, rate, acc,
                     omv_daemon_live_trainers(d));
        d->last_line_s = t;
        d->last_line_images = d->images_total;
        d->loss_sum = 0;
        d->loss_n = 0;
    }
    omv_daemon_timeline_tick(d);
    omv_daemon_opt_poll(d);
    if (d->reload_flag && *d->reload_flag) {
        *d->reload_flag = 0;
        reload(d);
    }
    omv_daemon_notify_status(d); /* systemd's STATUS= line (rate-limited) */
}

/* ---- reloading ---- */

void omv_daemon_set_reload(omv_daemon_t *d, volatile sig_atomic_t *flag, const char *config_path,
                           const char *cli_log_level)
{
    d->reload_flag = flag;
    omv_strlcpy(d->config_path, config_path ? config_path : "", sizeof(d->config_path));
    omv_strlcpy(d->cli_log_level, cli_log_level ? cli_log_level : "", sizeof(d->cli_log_level));
}

/* Re-reads the config file and applies what may change while running; a broken file changes
 * nothing and says why. */
static void reload(omv_daemon_t *d)
{
    if (d->config_path[0] == '\0') {
        omv_log_warn("SIGHUP: omnivored was started without --config: nothing to reload");
        return;
    }
    omv_daemon_config_t cfg;
    char err[OMV_CONFIG_ERR_MAX];
    memset(&cfg, 0, sizeof(cfg));
    omv_config_defaults(omv_daemon_table, omv_daemon_table_len, &cfg);
    if (omv_config_load(omv_daemon_table, omv_daemon_table_len, d->config_path, &cfg, NULL,
                        err) < 0) {
        d->reloads_failed_total++;
        omv_log_error("reload: %s; the running configuration stays", err);
        return;
    }
    if (d->cli_log_level[0])
        omv_strlcpy(cfg.log_level, d->cli_log_level, sizeof(cfg.log_level));
    if (omv_log_set_level_name(cfg.log_level) < 0) {
        d->reloads_failed_total++;
        omv_log_error("reload: %s: log_level '%s' is not error, warn, info or debug; the running "
                      "configuration stays", d->config_path, cfg.log_level);
        return;
    }
    omv_strlcpy(d->cfg.log_level, cfg.log_level, sizeof(d->cfg.log_level));
    d->reloads_total++;
    /* Logged at warn so that it shows whatever the level now is. */
    omv_log_warn("reloaded %s: log_level %s (endpoint, control, job and state_dir apply at the "
                 "next start)", d->config_path, d->cfg.log_level);
}

/* ---- life ---- */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        omv_strbuf_append(&b, chunk, n);
    fclose(f);
    char *s = strdup(omv_strbuf_str(&b));
    omv_strbuf_fini(&b);
    return s;
}

/* The training set's image count (after train_limit) once its shape is checked against the
 * model; 0 with the reason in err. */
static uint32_t check_data(const omv_job_t *j, char *err)
{
    uint32_t count, channels, rows, cols;
    if (omv_dataset_probe_format(j->data_format, j->train_images, &count, &channels, &rows,
                                 &cols, err) < 0)
        return 0;
    if (channels * rows * cols != j->layers[0]) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: images are %ux%ux%u = %u values but the model takes %u inputs",
                 j->train_images, channels, rows, cols, channels * rows * cols, j->layers[0]);
        return 0;
    }
    if (j->train_limit > 0 && (uint64_t)j->train_limit < count)
        count = (uint32_t)j->train_limit;
    uint32_t worker_batch = (uint32_t)(j->batch_size / (j->workers / j->groups));
    if (count / (uint32_t)j->workers < worker_batch) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: %u images split over %lld workers leave fewer than a batch of %u per "
                 "worker", j->train_images, count, (long long)j->workers, worker_batch);
        return 0;
    }
    return count;
}

int omv_daemon_check_job(const omv_job_t *job, char *err)
{
    if (check_data(job, err) == 0)
        return -EINVAL;
    omv_model_layout_t layout;
    return omv_model_parse(&layout, job->model_text, job->model_name, err) < 0 ? -EINVAL : 0;
}

static int setup_job(omv_daemon_t *d)
{
    char err[OMV_CONFIG_ERR_MAX];
    const omv_job_t *j = &d->job;
    uint32_t count = check_data(j, err);
    if (count == 0) {
        omv_log_error("%s", err);
        return -EINVAL;
    }
    d->train_count = count;
    d->worker_batch = (uint32_t)(j->batch_size / (j->workers / j->groups));
    d->target_images = (uint64_t)count * (uint64_t)j->epochs;

    int r = omv_model_parse(&d->layout, j->model_text, j->model_name, err);
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
    /* Room for workers that join beyond the planned ones, and for replacements. */
    d->n_slots = (uint32_t)j->workers * 2 + 16;
    d->params = malloc(d->layout.param_count * sizeof(float));
    d->shards = calloc(d->n_shards, sizeof(omv_shard_t));
    /* Room for as many groups as there are slots: regrouping may use them. */
    uint32_t max_groups = d->n_slots > (uint32_t)j->groups ? d->n_slots : (uint32_t)j->groups;
    d->group_images = calloc(max_groups, sizeof(uint64_t));
    d->group_loss_sum = calloc(max_groups, sizeof(double));
    d->group_loss_n = calloc(max_groups, sizeof(uint32_t));
    if (!d->group_loss_sum || !d->group_loss_n)
        return -ENOMEM;
    d->threads = calloc(d->n_shards, sizeof(*d->threads));
    d->gather_params = malloc(d->layout.param_count * sizeof(float));
    d->gather_velocity = malloc(d->layout.param_count * sizeof(float));
    if (!d->params || !d->shards || !d->group_images || !d->threads ||
        !d->gather_params || !d->gather_velocity)
        return -ENOMEM;
    omv_model_init(&d->layout, d->params, (uint64_t)j->seed);
    for (uint32_t s = 0; s < d->n_shards; s++) {
        uint32_t off = d->shard_offsets[s];
        r = omv_shard_init(&d->shards[s], d->params + off, off, d->shard_offsets[s + 1] - off,
                           max_groups);
        if (r < 0)
            return r;
    }
    omv_groups_events_t ev = {on_apply, on_advance, on_retire, d};
    d->groups = omv_groups_new(d->n_slots, (uint32_t)j->groups, d->n_shards, j->staleness, &ev);
    if (d->groups == NULL)
        return -ENOMEM;
    d->sgd = (omv_sgd_t){(float)j->learning_rate, (float)j->momentum, (float)j->weight_decay};
    d->next_eval_epoch = j->eval_every_epochs;
    omv_log_info("job '%s': model %s (%zu parameters in %u shards), %u training images, "
                 "%u per worker step",
                 j->name, j->layers_text[0] ? j->layers_text : j->definition, d->layout.param_count, d->n_shards, d->train_count,
                 d->worker_batch);

    if (j->checkpoint_dir[0])
        omv_strlcpy(d->ckpt_dir, j->checkpoint_dir, sizeof(d->ckpt_dir));
    else if (d->cfg.state_dir[0])
        snprintf(d->ckpt_dir, sizeof(d->ckpt_dir), "%s/checkpoints/%s", d->cfg.state_dir,
                 j->name);
    if (d->ckpt_dir[0]) {
        r = omv_checkpoint_mkdirs(d->ckpt_dir);
        if (r < 0) {
            omv_log_warn("checkpoints are off: cannot create %s: %s (set [daemon] state_dir or "
                         "[checkpoint] dir to a folder this user may write)",
                         d->ckpt_dir, omv_strerror(r));
        } else {
            d->ckpt_enabled = 1;
            r = omv_daemon_resume(d);
            if (r < 0)
                return r;
        }
    }
    if (d->n_history)
        d->next_eval_epoch = d->history[d->n_history - 1].epoch + j->eval_every_epochs;
    return 0;
}

int omv_daemon_load_job(omv_daemon_t *d, const omv_job_t *job, const char *path, uint64_t id)
{
    omv_daemon_unload_job(d);
    d->has_job = 1;
    d->job_id = id;
    d->job = *job;
    d->state = JOB_WAITING;
    omv_strlcpy(d->job_path, path, sizeof(d->job_path));
    d->job_text = read_text(path);
    d->load_s = now_s();
    int r = setup_job(d);
    if (r < 0)
        goto fail;
    /* A small shard's work takes less time than waking a thread (about 100 us here): the event
     * loop's thread owns it. */
    uint32_t threaded = 0;
    for (uint32_t s = 0; s < d->n_shards; s++) {
        int own = d->shards[s].count >= OMV_SHARD_THREAD_MIN_PARAMS;
        threaded += own;
        d->threads[s] = omv_shard_thread_new(d->router, &d->shards[s], s, own);
        if (d->threads[s] == NULL) {
            r = -errno;
            omv_log_error("cannot start the thread of shard %u: %s", s, omv_strerror(r));
            goto fail;
        }
    }
    omv_log_info("job %llu '%s' loaded from %s; %u of %u shards have a thread",
                 (unsigned long long)id, d->job.name, path, threaded, d->n_shards);
    /* Workers that waited for a job register again, into this one. */
    omv_msg_t again = {.type = OMV_MSG_STOP};
    snprintf(again.u.stop.reason, sizeof(again.u.stop.reason),
             "job '%s' is starting: register again", d->job.name);
    again.u.stop.reconnect = 1;
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (m->state == MEMBER_IDLE) {
            send_to(d, m, &m->peer, &again, NULL);
            m->state = MEMBER_DONE;
        }
    }
    return 0;
fail:
    omv_daemon_unload_job(d);
    return r;
}

/* Whether ZeroMQ still holds a snapshot of some shard's parameters (on its way to a worker). */
static int snapshots_in_flight(const omv_daemon_t *d)
{
    for (uint32_t s = 0; d->threads && s < d->n_shards; s++)
        if (d->threads[s] && omv_shard_thread_in_flight(d->threads[s]))
            return 1;
    return 0;
}

void omv_daemon_unload_job(omv_daemon_t *d)
{
    if (!d->has_job)
        return;
    /* Its workers (told at the end of the job) register again; records stay for their ids. */
    for (uint32_t i = 0; i < d->n_members; i++)
        if (d->members[i].state == MEMBER_ALIVE)
            d->members[i].state = MEMBER_DONE;
    /* Threads end first; parameters still on their way out through ZeroMQ point into their
     * snapshots, which are freed once ZeroMQ lets go (it sends or drops them at once). */
    for (uint32_t s = 0; d->threads && s < d->n_shards; s++)
        omv_shard_thread_stop(d->threads[s]);
    if (d->router)
        omv_router_drop_pipes(d->router);
    int64_t deadline = omv_time_ms() + 2000;
    while (snapshots_in_flight(d) && omv_time_ms() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    int leak = snapshots_in_flight(d);
    if (leak)
        omv_log_warn("job '%s': ZeroMQ still holds parameters after 2 s; their buffers are "
                     "left allocated", d->job.name);
    for (uint32_t s = 0; d->threads && s < d->n_shards; s++)
        if (!leak)
            omv_shard_thread_destroy(&d->threads[s]);
    free(d->threads);
    omv_groups_destroy(&d->groups);
    for (uint32_t s = 0; d->shards && s < d->n_shards; s++)
        omv_shard_fini(&d->shards[s]);
    free(d->shards);
    free(d->params);
    free(d->gather_params);
    free(d->gather_velocity);
    free(d->group_loss_sum);
    free(d->group_loss_n);
    free(d->group_images);
    omv_daemon_opt_reset(d); /* the probe base too */
    omv_daemon_timeline_reset(d);
    free(d->history);
    free(d->job_text);

    /* What outlives a job; everything else starts from zero with the next one. */
    omv_daemon_t *keep = malloc(sizeof(*keep));
    if (keep == NULL)
        abort(); /* nothing sensible to do with half a daemon */
    memcpy(keep, d, sizeof(*keep));
    memset(d, 0, sizeof(*d));
    d->cfg = keep->cfg;
    d->router = keep->router;
    d->control = keep->control;
    d->shutdown = keep->shutdown;
    d->members = keep->members;
    d->n_members_max = keep->n_members_max;
    d->n_members = keep->n_members;
    d->joins_total = keep->joins_total;
    d->leaves_total = keep->leaves_total;
    d->deaths_total = keep->deaths_total;
    d->rejoins_total = keep->rejoins_total;
    d->created_s = keep->created_s;
    d->reload_flag = keep->reload_flag;
    memcpy(d->config_path, keep->config_path, sizeof(d->config_path));
    memcpy(d->cli_log_level, keep->cli_log_level, sizeof(d->cli_log_level));
    d->reloads_total = keep->reloads_total;
    d->reloads_failed_total = keep->reloads_failed_total;
    memcpy(d->refused, keep->refused, sizeof(d->refused));
    d->last_cron_ms = keep->last_cron_ms;
    memcpy(d->queue, keep->queue, sizeof(d->queue));
    d->n_queue = keep->n_queue;
    d->queue_dirty = keep->queue_dirty;
    memcpy(d->finished, keep->finished, sizeof(d->finished));
    d->n_finished_total = keep->n_finished_total;
    d->jobs_loaded_total = keep->jobs_loaded_total;
    d->jobs_submitted_total = keep->jobs_submitted_total;
    free(keep);
    d->state = JOB_IDLE;
}

omv_daemon_t *omv_daemon_new(const omv_daemon_config_t *cfg, const omv_job_t *job,
                             const char *job_path)
{
    omv_daemon_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->cfg = *cfg;
    d->state = JOB_IDLE;
    d->created_s = now_s();
    d->n_members_max = OMV_DAEMON_MAX_MEMBERS;
    d->members = calloc(d->n_members_max, sizeof(member_t));
    int r = -ENOMEM;
    if (d->members == NULL)
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
    if (!cfg->once)
        omv_daemon_jobs_restore(d);
    if (job != NULL) {
        r = omv_daemon_load_job(d, job, job_path, ++d->jobs_submitted_total);
        if (r < 0)
            goto fail;
    }
    omv_log_info("listening for workers on %s, control on %s%s", cfg->endpoint, cfg->control,
                 job ? "" : "; no job: submit one with omnivorectl submit JOB.ini");
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
    omv_daemon_unload_job(d);
    omv_router_destroy(&d->router);
    omv_daemon_jobs_free(d);
    free(d->members);
    free(d);
    *self_p = NULL;
}

/* Receives and handles what is queued (bounded, so the control socket is never starved). */
static void drain(omv_daemon_t *d)
{
    for (int n = 0; n < 1024; n++) {
        omv_peer_t peer;
        omv_msg_t msg;
        char why[OMV_WIRE_REASON_MAX];
        int rr = omv_router_recv(d->router, &peer, &msg, why);
        if (rr == -EAGAIN || rr == -EINTR)
            break;
        if (rr == -EPROTO) {
            omv_daemon_refuse(d, &peer, OMV_REFUSE_MALFORMED, "a peer", why);
            continue;
        }
        if (rr < 0) {
            omv_log_error("receive failed: %s", omv_strerror(rr));
            break;
        }
        on_message(d, &peer, &msg);
    }
}

int omv_daemon_settle(omv_daemon_t *d, int timeout_ms)
{
    int64_t deadline = omv_time_ms() + timeout_ms;
    while (!omv_groups_settled(d->groups)) {
        if (omv_time_ms() >= deadline)
            return -ETIMEDOUT;
        short revents[1];
        int ready = 0, pipes = 0;
        omv_router_poll(d->router, NULL, 0, revents, &ready, &pipes, 10);
        if (pipes)
            omv_daemon_drain_pipes(d);
        if (ready) {
            drain(d);
            progress(d);
        }
    }
    return 0;
}

int omv_daemon_run(omv_daemon_t *d, volatile sig_atomic_t *stop)
{
    int fds[1] = {omv_control_fd(d->control)};
    d->last_cron_ms = omv_time_ms();
    int64_t stopping_ms = 0;
    for (;;) {
        if ((*stop || d->shutdown) && stopping_ms == 0) {
            stopping_ms = omv_time_ms();
            omv_notify_stopping();
            if (d->state == JOB_RUNNING && d->ckpt_enabled)
                d->ckpt_due = 1;
        }
        if (stopping_ms) {
            /* On the way out: write the last checkpoint once the groups hold whole steps, but
             * do not wait on the workers for long. */
            omv_daemon_checkpoint_if_due(d);
            if (!d->ckpt_due)
                break;
            if (omv_time_ms() - stopping_ms > EXIT_SETTLE_MS) {
                omv_log_warn("a group is still half-way through a step; the last checkpoint "
                             "stays %s", d->ckpt_last_path[0] ? d->ckpt_last_path : "(none)");
                break;
            }
        }
        short revents[1];
        int router_ready = 0, pipes_ready = 0;
        int64_t wait = d->last_cron_ms + CRON_MS - omv_time_ms();
        if (stopping_ms && wait > 10)
            wait = 10;
        int r = omv_router_poll(d->router, fds, 1, revents, &router_ready, &pipes_ready,
                                wait > 0 ? (int)wait : 0);
        if (r < 0 && r != -EINTR) {
            omv_log_error("poll failed: %s", omv_strerror(r));
            return r;
        }
        if (r > 0 && pipes_ready)
            omv_daemon_drain_pipes(d);
        if (r > 0 && router_ready) {
            drain(d);
            progress(d);
        }
        if (r > 0 && (revents[0] & POLLIN))
            omv_control_serve(d->control, omv_daemon_on_control, d);
        if (omv_time_ms() - d->last_cron_ms >= CRON_MS) {
            d->last_cron_ms = omv_time_ms();
            cron(d);
            progress(d);
        }
        if (!stopping_ms)
            omv_daemon_jobs_poll(d);
        omv_notify_watchdog();
    }
    /* Workers of an unfinished job, and idle ones, wait for a daemon to come back (a restart
     * resumes from the checkpoint just written). */
    omv_msg_t s = {.type = OMV_MSG_STOP};
    omv_strlcpy(s.u.stop.reason, "daemon is shutting down", sizeof(s.u.stop.reason));
    s.u.stop.reconnect = 1;
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if ((m->state == MEMBER_ALIVE && !OMV_JOB_OVER(d->state)) || m->state == MEMBER_IDLE)
            send_to(d, m, &m->peer, &s, NULL);
    }
    omv_log_info("stopped");
    return 0;
}
