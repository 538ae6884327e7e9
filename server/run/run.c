/* One job's run: its making and freeing, pulls, pushes and applies, evaluation, checkpoints,
 * changes between steps, and the job's lifecycle from waiting to done. */
#define OMV_LOG_TAG "daemon"
#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "parts.h"
#include "range.h"
#include "log.h"
#include "safetensors.h"
#include "util.h"

const char *const omv_run_state_names[] = {"waiting", "running", "finishing", "done",
                                           "failed",  "stopped", "idle"};

static void finish_stop(omv_run_t *r);
static void request_eval(omv_run_t *r);
static void record_early(omv_run_t *r);
static void cut_checkpoint(omv_run_t *r);
static void part_cut_check(omv_run_t *r);
static void part_finished(omv_run_t *r);
static void admit_joins(omv_run_t *r);
static void failover_done(omv_run_t *r);
static uint32_t make_change(omv_run_t *r, const omv_reconfig_t *rc, uint64_t clock, int live,
                            int *ret_regrouped);
static void failover_abandon(omv_run_t *r, const char *why);
static void cut_resume(omv_run_t *r);
static void failover_settle(omv_run_t *r);

/* A coordinator whose job's model is on shard servers. */
static int remote(const omv_run_t *r)
{
    return r->job.servers > 0 && !r->is_part;
}

/* The shards this run holds: all of them, or a shard server's part. */
static uint32_t shard_lo(const omv_run_t *r)
{
    return r->is_part ? r->part.first : 0;
}

static uint32_t shard_hi(const omv_run_t *r)
{
    return r->is_part ? r->part.last : r->shards->n_shards;
}

/* ---- reading ---- */

double omv_run_epoch(const omv_run_t *r)
{
    return r->train_count ? (double)r->images_total / (double)r->train_count : 0.0;
}

double omv_run_train_seconds(const omv_run_t *r)
{
    if (r->start_s == 0)
        return r->train_s_before;
    double end = r->train_end_s > 0 ? r->train_end_s : omv_time_s();
    return r->train_s_before + (end - r->start_s);
}

double omv_run_wall_seconds(const omv_run_t *r)
{
    if (r->start_s == 0)
        return r->train_s_before;
    return r->train_s_before + (r->end_s > 0 ? r->end_s : omv_time_s()) - r->start_s;
}

double omv_run_images_per_second(const omv_run_t *r)
{
    double s = omv_run_train_seconds(r);
    return s > 0 ? (double)r->images_total / s : 0.0;
}

int omv_run_live_trainers(const omv_run_t *r)
{
    return omv_members_live_trainers(r->env.members);
}

int64_t omv_run_worker_timeout_ms(const omv_run_t *r)
{
    return (int64_t)(r->job.worker_timeout_s * 1000);
}

/* The update rule for the next update: the one in force, with the learning rate where the
 * job's schedule has it now. */
static omv_sgd_t current_rule(const omv_run_t *r)
{
    omv_sgd_t u = r->sgd;
    u.learning_rate =
        (float)(u.learning_rate * omv_job_lr_factor(&r->job, omv_run_epoch(r), r->steps_total));
    return u;
}

static omv_timeline_now_t timeline_now(const omv_run_t *r)
{
    return (omv_timeline_now_t){
        .train_s = omv_run_train_seconds(r),
        .epoch = omv_run_epoch(r),
        .steps_total = r->steps_total,
        .images_total = r->images_total,
        .images_seen = r->images_total + omv_tuner_probe_images(r->tuner),
        .groups = omv_groups_count(r->groups),
        .momentum = r->sgd.momentum,
        .learning_rate = current_rule(r).learning_rate,
        .probing = omv_tuner_probing(r->tuner),
    };
}

/* ---- the optimizer ---- */

static void tuner_poll(omv_run_t *r)
{
    if (r->state != OMV_JOB_RUNNING)
        return;
    omv_reconfig_t rc;
    if (omv_tuner_poll(r->tuner, omv_time_s(), &r->reconfig, &r->sgd, &rc))
        omv_reconfig_merge(&r->reconfig, &rc);
}

/* The live trainers changed: the optimizer caps g by them and runs again what they disturbed. */
static void tuner_membership(omv_run_t *r)
{
    if (!omv_tuner_active(r->tuner) || r->state != OMV_JOB_RUNNING)
        return;
    omv_tuner_membership(r->tuner, omv_run_live_trainers(r), omv_time_s());
    tuner_poll(r);
}

/* ---- groups' events ---- */

static void serve_early(omv_run_t *r, uint32_t group, uint32_t s);

/* shard counts from the run's first (the groups know only the shards the run holds). */
static void on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    omv_run_t *r = ctx;
    if (remote(r))
        return; /* its groups count reports: the servers apply */
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_APPLY, .group = group, .sgd = current_rule(r)};
    omv_shardset_send(r->shards, shard_lo(r) + shard, &cmd, NULL, NULL);
    serve_early(r, group, shard_lo(r) + shard);
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    omv_run_t *r = ctx;
    (void)clock; /* the optimizer reads it from the groups, as every other reader does */
    uint64_t images = r->group_images[group];
    double loss = r->group_loss_n[group] ? r->group_loss_sum[group] / r->group_loss_n[group] : NAN;
    /* A probe's steps are thrown away when the optimizer restores its snapshot: they do not
     * count as training. */
    if (omv_tuner_probing(r->tuner))
        omv_tuner_count_probe_images(r->tuner, images);
    else if (!r->part_probing)
        r->images_total += images;
    r->group_images[group] = 0;
    r->group_loss_sum[group] = 0;
    r->group_loss_n[group] = 0;
    r->steps_total++;
    if (omv_tuner_active(r->tuner)) {
        omv_tuner_observe(r->tuner, group, omv_groups_clock(r->groups, group), loss, images,
                          omv_time_s());
        tuner_poll(r);
    }
}

static void on_retire(void *ctx, uint32_t group)
{
    omv_run_t *r = ctx;
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_DISCARD, .group = group};
    omv_shardset_send_all(r->shards, &cmd, NULL);
    r->group_images[group] = 0;
    omv_log_warn("group %u has no live workers left", group);
}

/* ---- membership ---- */

/* Divides the training set among the live trainers in order of id. While the job waits for its
 * workers the plan is for all of them, so that nobody's slice changes when the last one comes. */
static void assign_slices(omv_run_t *r)
{
    uint32_t live = (uint32_t)omv_run_live_trainers(r);
    uint32_t parts = r->state == OMV_JOB_WAITING && live < (uint32_t)r->job.workers
                         ? (uint32_t)r->job.workers
                         : live;
    omv_members_assign_slices(r->env.members, r->train_count, parts);
}

/* The group a newcomer joins: the one with the fewest live members, the lowest on ties. */
static uint32_t pick_group(const omv_run_t *r)
{
    uint32_t best = 0;
    for (uint32_t g = 1; g < omv_groups_count(r->groups); g++)
        if (omv_groups_live(r->groups, g) < omv_groups_live(r->groups, best))
            best = g;
    return best;
}

static int free_slot(const omv_run_t *r)
{
    for (uint32_t s = 0; s < r->n_slots; s++)
        if (omv_groups_of(r->groups, s) < 0)
            return (int)s;
    return -1;
}

/* Tells the job's shard servers that trainer m joined (state OMV_SERVER_MEMBER_ALIVE, with
 * its slot and group), left or died, or that m is the job's evaluator. */
static void tell_member(omv_run_t *r, const omv_member_t *m, uint32_t state)
{
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = OMV_SERVER_MEMBER;
    u->worker_id = omv_members_id(r->env.members, m);
    if (m->role == OMV_ROLE_TRAINER) {
        u->slot = m->slot;
        u->group = (uint32_t)omv_groups_of(r->groups, m->slot);
    }
    u->state = state;
    u->token = m->attach_token;
    omv_strlcpy(u->host, m->host, sizeof(u->host));
    omv_strlcpy(u->key, m->key, sizeof(u->key));
    omv_servers_send_run(r->env.servers, r->env.router, r->id, &msg);
}

/* Sends op (START, END) to the job's shard servers. */
static void tell_servers(omv_run_t *r, omv_server_op_t op)
{
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    msg.u.server.op = op;
    omv_servers_send_run(r->env.servers, r->env.router, r->id, &msg);
}

void omv_run_member_gone(omv_run_t *r, omv_member_t *m, omv_member_state_t why)
{
    omv_member_state_t was = m->state;
    m->state = why;
    m->parked = 0;
    if (m->shm_on && omv_shardset_sync(r->shards) == 0)
        omv_members_shm_release(m); /* else kept: a shard may still write into it */
    if (m->view_token && !remote(r) && r->shards) {
        omv_shard_cmd_t forget = {.type = OMV_SHARD_CMD_FORGET,
                                  .worker_id = omv_members_id(r->env.members, m)};
        omv_shardset_send_all(r->shards, &forget, NULL);
        m->view_token = 0;
    }
    if (was != OMV_MEMBER_ALIVE)
        return; /* idle: in no job */
    if (m->role == OMV_ROLE_TRAINER) {
        omv_groups_leave(r->groups, m->slot);
        assign_slices(r);
        tuner_membership(r);
        if (m->join_pending) {
            m->join_pending = 0;
            r->joins_pending--;
            return; /* never in a group */
        }
        if (remote(r)) {
            free(m->early);
            m->early = NULL;
            m->n_early = 0;
            tell_member(r, m,
                        why == OMV_MEMBER_LEFT ? OMV_SERVER_MEMBER_LEFT : OMV_SERVER_MEMBER_DEAD);
            record_early(r); /* its group may have moved on without it */
        }
    } else if (r->eval.evaluator == omv_members_id(r->env.members, m)) {
        omv_eval_lost(&r->eval);
        if (remote(r) && m->attach_token)
            tell_member(r, m,
                        why == OMV_MEMBER_LEFT ? OMV_SERVER_MEMBER_LEFT : OMV_SERVER_MEMBER_DEAD);
    }
}

/* ---- evaluation ---- */

/* Asks the job's shard servers for their ranges (final: once the job's last step is in);
 * omv_run_gathered puts them in the shards and goes on with the evaluation. */
/* Room for the servers' ranges. Returns 0 or -ENOMEM (logged). */
static int fetch_buffers(omv_run_t *r)
{
    size_t n = r->layout.param_count ? r->layout.param_count : 1;
    if (r->fetch_params == NULL) {
        r->fetch_params = malloc(n * sizeof(float));
        r->fetch_velocity = malloc(n * sizeof(float));
        if (r->shards->adam)
            r->fetch_second = malloc(n * sizeof(float));
    }
    if (r->fetch_params == NULL || r->fetch_velocity == NULL ||
        (r->shards->adam && r->fetch_second == NULL)) {
        omv_log_error("no memory to gather the model from the shard servers");
        return -ENOMEM;
    }
    return 0;
}

/* The model on shard servers: whether they send the evaluator their ranges themselves (it
 * attached to them), or there is no evaluator. */
static int evals_direct(const omv_run_t *r)
{
    if (r->eval.evaluator == 0)
        return 1;
    const omv_member_t *m = omv_members_get(r->env.members, r->eval.evaluator);
    return m && m->attach_token && r->n_servers > 0;
}

/* Whether the coordinator's shards hold the model: it is not on servers, or a gather of it
 * came (and the final model is not in the servers' parts). */
static int model_here(const omv_run_t *r)
{
    return !remote(r) || r->fetch_fresh || (r->fetched_final && !r->final_in_parts);
}

/* Whether the final model is where the job's end needs it: checkpoints off, or in. */
static int final_model_in(const omv_run_t *r)
{
    return !remote(r) || !r->ckpt.enabled || r->fetched_final;
}

static void fetch_model(omv_run_t *r, int final)
{
    if (r->cut_phase != 0 || (r->fetch_left > 0 && (r->fetch_final || !final)))
        return; /* one is under way already, or the cut brings the model */
    if (fetch_buffers(r) < 0)
        return;
    r->fetch_id++;
    r->fetch_left = r->n_servers;
    r->fetch_final = final;
    /* An evaluation needs the parameters alone: the momentum (and Adam's moments) stay on the
     * servers, a half (a third) of the bytes. The final model comes whole, for its checkpoint. */
    r->fetch_params_only = !final;
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    msg.u.server.op = OMV_SERVER_GATHER;
    msg.u.server.gather_id = r->fetch_id;
    msg.u.server.final = final;
    msg.u.server.params_only = !final;
    /* The final model for its checkpoint alone (its evaluation went to the evaluator): each
     * server writes its range as a part, as at a checkpoint's cut, and the manifest names them. */
    if (final)
        r->cut_parts = evals_direct(r) && r->ckpt.enabled && omv_run_parts_wanted(r);
    if (final && r->cut_parts) {
        r->cut_seq = r->ckpt.seq + 1;
        memset(r->parts_how, 0, sizeof(r->parts_how));
        omv_strlcpy(msg.u.server.part_dir, r->ckpt.dir, sizeof(msg.u.server.part_dir));
        msg.u.server.part_seq = r->cut_seq;
    }
    omv_servers_send_run(r->env.servers, r->env.router, r->id, &msg);
}

static void request_eval(omv_run_t *r)
{
    omv_eval_t *ev = &r->eval;
    if (ev->evaluator == 0)
        return;
    if (ev->busy) {
        ev->wanted = 1;
        return;
    }
    omv_member_t *m = omv_members_get(r->env.members, ev->evaluator);
    int final = r->state == OMV_JOB_FINISHING;
    if (!model_here(r) && evals_direct(r)) {
        /* The servers send the evaluator their ranges themselves (the final one's once their
         * last step is in): the coordinator sees no parameters. During a cut the model comes
         * here anyway (fetched() asks again). */
        if (r->cut_phase != 0) {
            ev->wanted = 1;
            return;
        }
        if (omv_eval_send(ev, r->env.router, &m->peer, NULL, 0, omv_run_epoch(r),
                          omv_run_train_seconds(r), final)) {
            omv_msg_t msg = {.type = OMV_MSG_SERVER};
            msg.u.server.op = OMV_SERVER_GATHER;
            msg.u.server.gather_id = ev->id;
            msg.u.server.final = final;
            msg.u.server.params_only = 1;
            msg.u.server.worker_id = ev->evaluator;
            omv_servers_send_run(r->env.servers, r->env.router, r->id, &msg);
            r->direct_evals_total++;
        }
        return;
    }
    if (!model_here(r)) {
        ev->wanted = 1; /* once the servers' ranges are in */
        fetch_model(r, final);
        return;
    }
    r->fetch_fresh = 0;
    if (omv_shardset_gather(r->shards, 0) < 0)
        return;
    omv_eval_send(ev, r->env.router, &m->peer, r->shards->gather_params,
                  (uint32_t)r->layout.param_count, omv_run_epoch(r), omv_run_train_seconds(r),
                  r->state == OMV_JOB_FINISHING);
}

void omv_run_eval_result(omv_run_t *r, omv_member_t *m, const omv_eval_result_t *e)
{
    omv_eval_t *ev = &r->eval;
    if (omv_eval_result(ev, e) < 0) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, m->host,
                         "evaluation result that was not asked for");
        return;
    }
    double acc = (double)e->correct / e->total; /* checked: total > 0 */
    omv_log_info("eval: epoch %.2f test_accuracy %.4f test_loss %.4f (%u images)", ev->epoch, acc,
                 e->loss, e->total);
    if (r->state == OMV_JOB_FINISHING) {
        r->final_eval = ev->final_sent;
        if (ev->final_sent && final_model_in(r))
            omv_run_finish(r, OMV_JOB_DONE, "job done");
        else if (!ev->final_sent)
            request_eval(r); /* else done once the final model is in its parts */
    } else if (r->job.stop_at_accuracy > 0 && acc >= r->job.stop_at_accuracy &&
               r->state == OMV_JOB_RUNNING) {
        omv_log_info("test accuracy %.4f reached [job] stop_at_accuracy = %g after %.1f s", acc,
                     r->job.stop_at_accuracy, ev->wall_s);
        r->train_end_s = omv_time_s();
        r->final_eval = 1;
        omv_run_finish(r, OMV_JOB_DONE, "reached stop_at_accuracy");
    } else if (ev->wanted) {
        request_eval(r);
    }
}

/* ---- checkpoints ---- */

/* Writes a checkpoint now. Returns 0 or a negative errno (logged, counted). */
static int write_checkpoint(omv_run_t *r)
{
    omv_run_ckpt_view_t v = {
        .job = &r->job,
        .job_text = r->text,
        .finished = r->state == OMV_JOB_DONE,
        .images_total = r->images_total,
        .steps_total = r->steps_total,
        .train_s = omv_run_train_seconds(r),
        .epoch = omv_run_epoch(r),
        .groups = r->groups,
        .members = r->env.members,
        .sgd = r->sgd,
        .param_count = r->layout.param_count,
        .eval = &r->eval,
        .tuner = r->tuner,
    };
    r->ckpt_forced = 0;
    if (remote(r) && !r->fetched_final && r->cut_phase != 3) {
        r->ckpt.due = 0;
        r->ckpt.failed_total++;
        omv_log_warn("no checkpoint: the model is on shard servers and no cut of it is in");
        return -ENOTSUP;
    }
    if (remote(r) && (r->cut_phase == 3 || r->final_in_parts) && omv_run_parts_remote(r))
        return omv_run_parts_write(r, &v); /* the servers wrote the model: a manifest of it */
    if ((omv_tuner_probing(r->tuner) || (r->reconfig.pending && r->reconfig.restore)) &&
        omv_shardset_has_probe_base(r->shards)) {
        /* The shards hold a probe's model, which is thrown away (or one the optimizer is about
         * to replace with the base): the base is the model to keep, where the search runs again
         * from or the phase starts. */
        v.params = r->shards->probe_params;
        v.velocity = r->shards->probe_velocity;
        v.second = r->shards->probe_second;
        v.adam_steps = r->shards->probe_steps[0];
    } else {
        int e = omv_shardset_gather(r->shards, 1);
        if (e < 0) {
            uint64_t step = omv_groups_min_clock(r->groups);
            r->ckpt.due = 0;
            r->ckpt.failed_total++;
            r->ckpt.last_s = omv_time_s();
            r->ckpt.last_step = step == UINT64_MAX ? 0 : step; /* not again at once */
            omv_log_error("checkpoint failed: cannot gather the model from the shard threads: %s",
                          omv_strerror(e));
            return e;
        }
        v.params = r->shards->gather_params;
        v.velocity = r->shards->gather_velocity;
        v.second = r->shards->gather_second;
        v.adam_steps = r->shards->gather_steps[0];
    }
    return omv_run_ckpt_write(&r->ckpt, &v);
}

/* Whether the reports of every step in the cut are in (none can be beyond it: the servers
 * hold the next steps back). */
static int cut_caught_up(const omv_run_t *r)
{
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        if (omv_groups_live(r->groups, g) > 0 && omv_groups_clock(r->groups, g) < r->cut_clocks[g])
            return 0;
    return 1;
}

static void send_cut_op(omv_run_t *r, omv_server_op_t op)
{
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = op;
    u->gather_id = r->cut_id;
    /* Only training's end resumes this way (cut_resume sends a cut's counters): each server
     * keeps its own and ends its part when its own last step is in. */
    u->final = op == OMV_SERVER_RESUME;
    if (op == OMV_SERVER_CUT) {
        u->n_groups = omv_groups_count(r->groups);
        for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
            u->clocks[g] = r->cut_clocks[g];
        u->no_ranges = !r->cut_ranges;
        if (r->cut_parts) {
            omv_strlcpy(u->part_dir, r->ckpt.dir, sizeof(u->part_dir));
            u->part_seq = r->cut_seq;
        }
    }
    omv_servers_send_run(r->env.servers, r->env.router, r->id, &msg);
}

/* The pending change happens at the cut: here, and in RESUME (u, with each slot's group in
 * group_of[n_slots]) on every server, all at the same step boundary. As try_reconfig, after a
 * restore every group starts again at a common clock. The probe base is the servers': their
 * shards save and restore their own. */
static void cut_reconfig(omv_run_t *r, omv_server_msg_t *u, int32_t *group_of)
{
    omv_reconfig_t rc = r->reconfig;
    memset(&r->reconfig, 0, sizeof(r->reconfig));
    uint64_t clock = 0;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        if (omv_groups_live(r->groups, g) > 0 && omv_groups_clock(r->groups, g) > clock)
            clock = omv_groups_clock(r->groups, g);
    int regrouped;
    make_change(r, &rc, clock, omv_run_live_trainers(r), &regrouped);
    if (regrouped) {
        u->reconfig |= OMV_SERVER_RECONFIG_REGROUP;
        u->n_groups = omv_groups_count(r->groups);
        for (uint32_t k = 0; k < u->n_groups && k < OMV_WIRE_MAX_CLOCKS; k++)
            u->clocks[k] = clock;
        for (uint32_t slot = 0; slot < r->n_slots; slot++)
            group_of[slot] = omv_groups_of(r->groups, slot);
        u->count = r->n_slots;
    }
    u->reconfig |= rc.set_sgd ? OMV_SERVER_RECONFIG_SGD : 0;
    u->learning_rate = r->sgd.learning_rate;
    u->momentum = r->sgd.momentum;
    u->weight_decay = r->sgd.weight_decay;
    u->reconfig |= (rc.snapshot ? OMV_SERVER_RECONFIG_SNAPSHOT : 0) |
                   (rc.restore ? OMV_SERVER_RECONFIG_RESTORE : 0);
}

/* The servers go on from the cut, with the pending change if any. */
static void cut_resume(omv_run_t *r)
{
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = OMV_SERVER_RESUME;
    u->gather_id = r->cut_id;
    /* The cut's counters: every step in it is reported (a server's may differ by a probe's). */
    u->images = r->images_total;
    u->steps = r->steps_total;
    int32_t *group_of = NULL;
    if (r->reconfig.pending) {
        group_of = calloc(r->n_slots + 1, sizeof(int32_t));
        if (group_of)
            cut_reconfig(r, u, group_of);
        else
            omv_log_error("the change asked for waits: out of memory");
    }
    /* A probe's steps are not training's: the servers count them as this daemon does. */
    u->reconfig |= omv_tuner_probing(r->tuner) ? OMV_SERVER_RECONFIG_PROBING : 0;
    for (uint32_t i = 0; i < r->env.servers->n; i++) {
        omv_server_t *s = &r->env.servers->rec[i];
        if (s->alive && s->run_id == r->id &&
            omv_servers_send(r->env.servers, r->env.router, s, &msg, group_of) < 0)
            omv_log_warn("cannot send resume to shard server %u", i + 1);
    }
    free(group_of);
}

/* The model on shard servers: a checkpoint, a join or a change (regroup, the optimizer's) is
 * made at a consistent cut. The servers stop beginning steps and say which they began; each
 * then finishes the most any began and (for a checkpoint) sends its range; once the reports of
 * those steps are in too, the daemon writes the checkpoint as one daemon would, takes the
 * newcomers, makes the change everywhere, and the servers go on. A checkpoint waits for the
 * optimizer's probe to end: the servers' shards then hold the model to keep. */
static void cut_checkpoint(omv_run_t *r)
{
    int ckpt = r->ckpt.due && r->ckpt.enabled && !omv_tuner_probing(r->tuner);
    if ((!ckpt && r->joins_pending == 0 && !r->reconfig.pending && !r->failover) ||
        r->state != OMV_JOB_RUNNING)
        return;
    if (r->cut_phase == 0 && (!ckpt || fetch_buffers(r) == 0)) {
        r->cut_phase = 1;
        r->cut_ranges = ckpt;
        r->cut_parts = ckpt && !r->failover && omv_run_parts_wanted(r);
        r->cut_seq = r->ckpt.seq + 1;
        memset(r->parts_how, 0, sizeof(r->parts_how));
        r->cut_id = ++r->fetch_id;
        r->cut_left = r->n_servers;
        r->fetch_left = 0; /* a gather under way is dropped: the cut brings the model */
        memset(r->cut_clocks, 0, r->max_groups * sizeof(uint64_t));
        send_cut_op(r, OMV_SERVER_FREEZE);
        return;
    }
    if (r->cut_phase != 3 || !cut_caught_up(r))
        return;
    if (r->failover) {
        failover_done(r);
        return;
    }
    if (r->cut_ranges && r->ckpt.due && r->ckpt.enabled)
        write_checkpoint(r); /* from the cut's model (phase 3) */
    admit_joins(r);
    r->cut_phase = 0;
    cut_resume(r);
    int here = r->cut_ranges && !omv_run_parts_remote(r);
    r->cut_parts = 0;
    /* An evaluation that waited takes the cut's model when it is here; otherwise (the model in
     * the servers' parts, or a cut without ranges) it gathers it now. */
    r->fetch_fresh = here;
    if (r->eval.wanted) {
        r->eval.wanted = 0;
        request_eval(r);
    }
}

/* Writes a due checkpoint when no group is half-way through applying a step. During a probe the
 * shards hold a probe's model: wait for the phase, not to stall a probe (its timing counts),
 * unless one was asked for by hand, which takes the search's base instead. */
static void checkpoint_if_due(omv_run_t *r)
{
    if (remote(r)) {
        cut_checkpoint(r);
        return;
    }
    if (r->ckpt.due && r->ckpt.enabled && omv_groups_settled(r->groups) &&
        (!omv_tuner_probing(r->tuner) || r->ckpt_forced))
        write_checkpoint(r);
}

int omv_run_request_checkpoint(omv_run_t *r, char *why, size_t cap)
{
    if (!r->ckpt.enabled) {
        snprintf(why, cap,
                 "checkpoints are off: the daemon cannot write to '%s'; set [daemon] state_dir or "
                 "the job's [checkpoint] dir",
                 r->ckpt.dir);
        return -EINVAL;
    }
    if (r->state == OMV_JOB_WAITING) {
        snprintf(why, cap, "job '%s' has not started: nothing to checkpoint yet", r->job.name);
        return -EAGAIN;
    }
    r->ckpt.due = 1;
    r->ckpt_forced = 1;
    checkpoint_if_due(r);
    return 0;
}

/* ---- changes between steps ---- */

int omv_run_request_regroup(omv_run_t *r, uint32_t g, char *why, size_t cap)
{
    uint32_t live = (uint32_t)omv_run_live_trainers(r);
    if (r->state != OMV_JOB_RUNNING && r->state != OMV_JOB_WAITING) {
        snprintf(why, cap, "job '%s' is %s: nothing to regroup", r->job.name,
                 omv_run_state_names[r->state]);
        return -EAGAIN;
    }
    uint32_t most = live > 0 ? live : (uint32_t)r->job.workers;
    if (g < 1 || g > most || g > omv_groups_max(r->groups)) {
        snprintf(why, cap, "%u groups for %u workers: give 1 to %u", g, live, most);
        return -EINVAL;
    }
    omv_reconfig_t rc = {.groups = g};
    omv_reconfig_merge(&r->reconfig, &rc);
    omv_log_info("regroup to %u groups requested (now %u); it happens between steps", g,
                 omv_groups_count(r->groups));
    return 0;
}

/* Saves or restores the probe base as the pending change asks, restore first. */
static void probe_base(omv_run_t *r, const omv_reconfig_t *rc)
{
    if (rc->restore) {
        int e = omv_shardset_probe_base(r->shards, 1);
        if (e < 0)
            omv_log_error("cannot restore the probe base: %s", omv_strerror(e));
    }
    if (rc->snapshot) {
        int e = omv_shardset_probe_base(r->shards, 0);
        if (e < 0)
            omv_log_error("cannot save the probe base: %s", omv_strerror(e));
    }
}

/* The change rc at clock, with live trainers, on this daemon's groups and rule (the probe base
 * is the caller's): regroups (after a restore too, so that every group starts again from the
 * same model at a common clock, which keeps the bound), sets the rule, and tells the optimizer
 * and the timeline. Returns the groups asked for (0: none) and in *ret_regrouped whether the
 * regroup was made. */
static uint32_t make_change(omv_run_t *r, const omv_reconfig_t *rc, uint64_t clock, int live,
                            int *ret_regrouped)
{
    uint32_t g = rc->groups ? rc->groups : rc->restore ? omv_groups_count(r->groups) : 0;
    *ret_regrouped =
        g && omv_reconfig_regroup(r->groups, r->env.members, r->n_slots, g, clock, live) == 0;
    r->regroups_total += (uint64_t)*ret_regrouped;
    if (rc->set_sgd) {
        r->sgd = rc->sgd;
        omv_log_info("momentum %g, learning rate %g from step %llu", r->sgd.momentum,
                     r->sgd.learning_rate, (unsigned long long)clock);
    }
    omv_tuner_applied(r->tuner, rc->opt_gen, omv_run_epoch(r), omv_time_s());
    omv_timeline_now_t now = timeline_now(r);
    omv_timeline_config(&r->timeline, &now, rc->opt_gen ? "optimizer" : "regroup");
    return g;
}

/* Carries out the pending change if every group is between steps: nothing is in flight, and a
 * restored model is what every next step reads. Returns whether pulls may be served. */
static int try_reconfig(omv_run_t *r)
{
    uint64_t clock;
    int live;
    if (!omv_reconfig_ready(r->groups, r->env.members, &clock, &live))
        return 0;
    omv_reconfig_t rc = r->reconfig;
    memset(&r->reconfig, 0, sizeof(r->reconfig));
    probe_base(r, &rc);
    int regrouped;
    uint32_t g = make_change(r, &rc, clock, live, &regrouped);
    /* Everyone waits for the common clock: their next pull is for it. */
    for (uint32_t i = 0; i < r->env.members->n && g; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER)
            m->parked_step = clock;
    }
    return 1;
}

/* ---- pulls ---- */

/* The most members of one group that split = speed plans for; a larger group splits evenly. */
#define PLAN_MAX_MEMBERS 256

/* Shares of b among n members of speeds s[] (images/s): in proportion, at least one each,
 * rounded by largest remainder so that they add up to b. */
static void proportional(const double *s, uint32_t n, uint32_t b, uint32_t *ret)
{
    double total = 0, want[PLAN_MAX_MEMBERS];
    for (uint32_t i = 0; i < n; i++)
        total += s[i];
    uint32_t given = 0;
    for (uint32_t i = 0; i < n; i++) {
        want[i] = (double)b * s[i] / total;
        ret[i] = want[i] < 1.0 ? 1u : (uint32_t)want[i];
        given += ret[i];
    }
    while (given != b) {
        /* One image at a time to (from) the member furthest below (above) its share. */
        uint32_t best = 0;
        double best_gap = 0;
        for (uint32_t i = 0; i < n; i++) {
            double gap = given < b ? want[i] - ret[i] : ret[i] - want[i];
            if ((given < b || ret[i] > 1) && (best_gap == 0 || gap > best_gap)) {
                best = i;
                best_gap = gap == 0 ? 1e-300 : gap;
            }
        }
        if (given < b) {
            ret[best]++, given++;
        } else {
            ret[best]--, given--;
        }
    }
}

/* [cluster] split = speed: shares the group's batch among its live members in proportion to
 * their measured images/s, once per step. A plan that moves no member by more than an image or
 * 5% stays, so workers do not re-seek their data every step for noise. Members without a
 * measure yet, or a group whose members are changing, get the even split. */
static void plan_group(omv_run_t *r, uint32_t group, uint64_t step)
{
    r->group_planned[group] = step + 1;
    omv_member_t *in[PLAN_MAX_MEMBERS];
    double speed[PLAN_MAX_MEMBERS];
    uint32_t n = 0, old_total = 0, share[PLAN_MAX_MEMBERS];
    for (uint32_t i = 0; i < r->env.members->n && n < PLAN_MAX_MEMBERS; i++) {
        omv_member_t *o = &r->env.members->records[i];
        if (o->state == OMV_MEMBER_ALIVE && o->role == OMV_ROLE_TRAINER &&
            omv_groups_of(r->groups, o->slot) == (int)group) {
            speed[n] = o->ms_per_image > 0 ? 1.0 / o->ms_per_image : 0;
            old_total += o->planned;
            in[n++] = o;
        }
    }
    int measured = n == omv_groups_live(r->groups, group) && n > 0;
    for (uint32_t i = 0; i < n; i++)
        measured &= speed[i] > 0;
    uint32_t b = (uint32_t)r->job.batch_size;
    if (!measured || b < n) {
        for (uint32_t i = 0; i < n; i++)
            in[i]->planned = 0; /* the even split */
        return;
    }
    proportional(speed, n, b, share);
    int moved = old_total != b;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t old = in[i]->planned, d = share[i] > old ? share[i] - old : old - share[i];
        moved |= d > 1 && d * 20 > old;
    }
    for (uint32_t i = 0; i < n && moved; i++)
        in[i]->planned = share[i];
}

/* The group's batch is the job's, whoever is in it: its live members share it as evenly as it
 * goes, the first in order of id taking one more (64 over 3: 22, 21, 21); or, with split =
 * speed, as plan_group says. */
static uint32_t member_batch(omv_run_t *r, omv_member_t *m, uint32_t group, uint64_t step)
{
    if (r->job.split_by_speed) {
        if (r->group_planned[group] != step + 1)
            plan_group(r, group, step);
        if (m->planned > 0)
            return m->planned;
    }
    uint32_t live = omv_groups_live(r->groups, group), rank = 0;
    if (live == 0)
        live = 1;
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        const omv_member_t *o = &r->env.members->records[i];
        if (o == m)
            break;
        rank += o->state == OMV_MEMBER_ALIVE && o->role == OMV_ROLE_TRAINER &&
                omv_groups_of(r->groups, o->slot) == (int)group;
    }
    uint32_t b = (uint32_t)r->job.batch_size;
    return b / live + (rank % live < b % live ? 1 : 0);
}

/* What a member's gradient counts for in its group's mean: the images it computed over the
 * group's mean share, so that the update is the mean weighted by images; exactly 1 when the
 * batch splits evenly (the update is then the plain mean, bit for bit). */
static float push_weight(const omv_run_t *r, const omv_member_t *m, uint32_t group)
{
    uint64_t live = omv_groups_live(r->groups, group);
    uint64_t share = (uint64_t)m->batch * live, b = (uint64_t)r->job.batch_size;
    return m->batch == 0 || live == 0 || share == b ? 1.0f : (float)((double)share / (double)b);
}

/* Fixes what the member's step is made of when its first shard is sent: its batch, its
 * gradient's weight, and the staleness the read has (how far the slowest other live group is
 * behind it). */
static void begin_serve(omv_run_t *r, omv_member_t *m, uint32_t group, uint64_t step)
{
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++) {
        uint64_t c = omv_groups_clock(r->groups, g);
        if (g != group && omv_groups_live(r->groups, g) > 0 && c < step &&
            step - c > r->staleness_max_observed)
            r->staleness_max_observed = step - c;
    }
    m->served = 1;
    m->served_step = step;
    m->served_ms = omv_time_ms();
    /* With one group, a shard is written only once every member pushed it: a local member
     * can read the parameters where they are, in the model segment, for the whole step. */
    m->inplace = m->shm_on && m->shm_model && omv_groups_count(r->groups) == 1;
    m->batch = member_batch(r, m, group, step);
    m->weight = push_weight(r, m, group);
}

/* Sends shard s of the member's parked step, once. The shard's executor answers with a
 * snapshot of its part, sent without a copy; commands to a shard run in order, so every update
 * sent to it so far is in the snapshot. Returns 1 when every shard has been sent: the pull is
 * answered. */
static int serve_shard(omv_run_t *r, omv_member_t *m, uint32_t group, uint32_t s)
{
    uint64_t bit = 1ull << (s % 64);
    if (m->sent[s / 64] & bit)
        return m->sent_n == shard_hi(r) - shard_lo(r);
    if (m->sent_n == 0) {
        begin_serve(r, m, group, m->parked_step);
        r->serves_total++;
    }
    /* With wire int8 a worker that reads over a socket is sent changes to its view, and the
     * whole shard when that view begins. */
    int change = r->job.wire == OMV_WIRE_INT8 && !m->shm_on;
    uint32_t wire = m->shm_on ? OMV_WIRE_SHM
                    : change  ? (m->view_new ? OMV_WIRE_FP32 : OMV_WIRE_INT8)
                              : omv_wire_of_params(r->job.wire);
    r->bytes_out_total += omv_wire_value_bytes(wire, r->shards->shards[s].count);
    /* A worker on this host with its segments gets the values written into them. */
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_SERVE,
                           .group = group,
                           .step = m->parked_step,
                           .worker_id = omv_members_id(r->env.members, m),
                           .slice_begin = m->slice_begin,
                           .slice_count = m->slice_count,
                           .batch = m->batch ? m->batch : 1,
                           .wire = change ? OMV_WIRE_INT8 : wire,
                           .view = m->view_token,
                           .shm_dst = m->shm_on ? m->shm_params : NULL,
                           .shm_send = (uint32_t)m->shm_on,
                           .shm_conn = m->shm_on ? m->shm_conn : -1,
                           .shm_inplace = (uint32_t)m->inplace};
    if (cmd.shm_inplace) {
        r->inplace_serves_total++;
        m->inplace_sent[s / 64] |= bit;
        m->inplace_writes[s] = r->shards->writes[s];
    }
    omv_shardset_send(r->shards, s, &cmd, &m->peer, NULL);
    m->sent[s / 64] |= bit;
    m->sent_n++;
    return m->sent_n == shard_hi(r) - shard_lo(r);
}

/* Answers the member's parked pull with every shard not sent yet. */
static void send_params(omv_run_t *r, omv_member_t *m)
{
    uint32_t group = (uint32_t)omv_groups_of(r->groups, m->slot);
    for (uint32_t s = shard_lo(r); s < shard_hi(r); s++)
        serve_shard(r, m, group, s);
    m->parked = 0;
}

/* Shard s of group's current step was just applied: the members of the group that already
 * asked for the next step get that shard of it now, while the rest of the step is still on its
 * way in (pushes and pulls overlap, shard by shard, in both directions of every link). What
 * they read is what they would read after the whole step, bit for bit. Not while a change
 * waits for a step boundary, nor when the bound or a joining member says wait. */
static void serve_early(omv_run_t *r, uint32_t group, uint32_t s)
{
    /* Once the job has its images no step begins: the one that reached them was the last. A
     * backup serves nothing. */
    if (r->part.backup || r->state != OMV_JOB_RUNNING || r->reconfig.pending ||
        r->images_total >= r->target_images)
        return;
    uint64_t next = omv_groups_clock(r->groups, group) + 1;
    if (!omv_groups_may_read_next(r->groups, group, next) ||
        (r->frozen && next >= r->cut_clocks[group]))
        return;
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER && m->parked &&
            m->parked_step == next && omv_groups_of(r->groups, m->slot) == (int)group &&
            serve_shard(r, m, group, s))
            m->parked = 0;
    }
}

/* Answers the parked pulls the groups and the bound allow. With a change pending, only groups
 * that began their step may finish it; the others wait for the change. */
static void serve_parked(omv_run_t *r)
{
    if (remote(r) || r->part.backup || r->images_total >= r->target_images)
        return; /* the job's end: no step begins */
    int holding = r->reconfig.pending && !try_reconfig(r);
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state != OMV_MEMBER_ALIVE || !m->parked)
            continue;
        int g = omv_groups_of(r->groups, m->slot);
        if (holding && (g < 0 || !omv_reconfig_group_begun(r->groups, r->env.members, (uint32_t)g)))
            continue;
        if (r->frozen && g >= 0 && m->parked_step >= r->cut_clocks[g])
            continue; /* a cut: no step begins past it */
        if (g >= 0 && omv_groups_may_begin(r->groups, (uint32_t)g, m->parked_step)) {
            send_params(r, m);
        }
    }
}

void omv_run_pull(omv_run_t *r, omv_member_t *m, const omv_pull_t *p)
{
    if (m->role != OMV_ROLE_TRAINER || remote(r) || r->part.backup) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, m->host,
                         remote(r)        ? "the model is on the shard servers: pull from them"
                         : r->part.backup ? "a backup serves no pulls: pull from the primary"
                                          : "an evaluator does not pull");
        return;
    }
    int g = omv_groups_of(r->groups, m->slot);
    uint64_t clock = g >= 0 ? omv_groups_clock(r->groups, (uint32_t)g) : 0;
    omv_pull_t asked = *p;
    if (m->regroup_step > 0 && !m->parked && p->step < m->regroup_step)
        asked.step = m->regroup_step; /* sent before a regroup at a cut: for its common clock */
    m->regroup_step = 0;
    p = &asked;
    if (m->parked || p->step < clock || p->step > clock + 1) {
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "pull for step %llu but group %d is at step %llu%s",
                 (unsigned long long)p->step, g, (unsigned long long)clock,
                 m->parked ? " and a pull is already waiting" : "");
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, m->host, why);
        return;
    }
    /* Wire int8: the shards send changes to the view the worker names, when it is the one
     * they keep for it; any other starts a new view, which they send whole. */
    m->view_new = p->view == 0 || p->view != m->view_token;
    if (r->job.wire == OMV_WIRE_INT8 && m->view_new)
        m->view_token = omv_random_token(m);
    /* Answered by omv_run_progress once the group and the bound allow; at the end, Stop does. */
    m->parked = 1;
    m->parked_step = p->step;
    m->sent_n = 0;
    memset(m->sent, 0, sizeof(m->sent));
    /* Asked for the next step while the current one is applied: what is applied already goes
     * out now, the rest as it is applied. */
    if (g >= 0 && p->step == clock + 1)
        for (uint32_t s = shard_lo(r); s < shard_hi(r) && m->parked; s++)
            if (omv_groups_shard_applied(r->groups, (uint32_t)g, s - shard_lo(r)))
                serve_early(r, (uint32_t)g, s);
}

/* ---- pushes ---- */

/* A gradient of a shard the member read in place: the parameters must not have changed while
 * it computed from them. With one group nothing changes a shard before its members pushed it;
 * were that ever broken (a restore, an update of another group), the gradient was computed from
 * a mix of two versions and is refused. Returns 1 when it may go on, else 0 with why. */
static int read_in_place_held(omv_run_t *r, omv_member_t *m, uint32_t s, char *why)
{
    uint64_t bit = 1ull << (s % 64);
    if (!(m->inplace_sent[s / 64] & bit))
        return 1;
    m->inplace_sent[s / 64] &= ~bit;
    uint32_t writes = r->shards->writes[s] - m->inplace_writes[s];
    if (writes == 0)
        return 1;
    r->inplace_raced_total++;
    snprintf(why, OMV_WIRE_REASON_MAX,
             "shard %u's parameters changed %u times while it computed from them in shared "
             "memory",
             s, writes);
    return 0;
}

/* Checks a push against the job's state, the groups and the shard's range. Returns 1 when it
 * fits; else it was refused (or dropped as late) and 0. */
static int push_fits(omv_run_t *r, omv_member_t *m, const omv_push_t *p, const char *who)
{
    char why[OMV_WIRE_REASON_MAX];
    if (m->role != OMV_ROLE_TRAINER) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, who,
                         "an evaluator does not push");
        return 0;
    }
    if (r->state == OMV_JOB_FINISHING || r->state == OMV_JOB_DONE) {
        /* Steps that were under way when the job reached its end: not an error, not applied. */
        r->late_total++;
        return 0;
    }
    if (r->state != OMV_JOB_RUNNING) {
        snprintf(why, sizeof(why), "gradient while the job is %s", omv_run_state_names[r->state]);
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, who, why);
        return 0;
    }
    if (remote(r) || p->shard < shard_lo(r) || p->shard >= shard_hi(r)) {
        snprintf(why, sizeof(why), "shard %u is not on this %s (it holds shards [%u, %u))",
                 p->shard, r->is_part ? "shard server" : "daemon", shard_lo(r),
                 remote(r) ? 0 : shard_hi(r));
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return 0;
    }
    int g = omv_groups_of(r->groups, m->slot);
    if (r->is_part && r->failover_cut && g >= 0 && p->step >= r->cut_clocks[g]) {
        r->late_total++; /* past a failover's cut: the coordinator leaves it out too */
        return 0;
    }
    omv_refuse_t code =
        omv_groups_check_push(r->groups, m->slot, p->step, p->shard - shard_lo(r), why);
    if (code != OMV_REFUSE_NONE) {
        omv_refusals_add(r->env.refusals, &m->peer, code, who, why);
        return 0;
    }
    if (p->wire == OMV_WIRE_SHM && !m->shm_on) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_MALFORMED, who,
                         "a gradient in shared memory from a worker that has no segment");
        return 0;
    }
    if (!read_in_place_held(r, m, p->shard, why)) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, who, why);
        return 0;
    }
    const omv_shard_t *sh = &r->shards->shards[p->shard];
    if (p->offset != sh->offset || p->count != sh->count) {
        snprintf(why, sizeof(why), "shard %u holds [%u, +%u) but the gradient is [%u, +%u)",
                 p->shard, sh->offset, sh->count, p->offset, p->count);
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return 0;
    }
    return 1;
}

/* The step's figures come with shard 0's push: the worker's, its group's and the job's. */
static void count_step(omv_run_t *r, omv_member_t *m, uint32_t group, const omv_push_t *p)
{
    m->steps++;
    m->last_compute_ms = p->compute_ms;
    /* Its speed, measured only on batches of at least half the even share: a step's fixed
     * costs make a small batch look slow per image, and a member given few images for being
     * slow would look slower still, down to one image. */
    uint32_t live = omv_groups_live(r->groups, group);
    uint64_t even = (uint64_t)r->job.batch_size / (live ? live : 1);
    if (p->samples > 0 && 2 * (uint64_t)p->samples >= even && p->compute_ms > 0 &&
        isfinite(p->compute_ms)) {
        double x = (double)p->compute_ms / p->samples;
        m->ms_per_image = m->ms_per_image > 0 ? 0.8 * m->ms_per_image + 0.2 * x : x;
    }
    if (!isfinite(p->loss))
        return;
    m->images += p->samples;
    r->group_images[group] += p->samples;
    r->group_loss_sum[group] += p->loss;
    r->group_loss_n[group]++;
    r->loss_sum += p->loss;
    r->loss_n++;
    r->last_loss = p->loss;
    omv_timeline_loss(&r->timeline, p->loss);
}

/* Takes a push whose payload is in *held (NULL: the router's last message). */
static void push_with(omv_run_t *r, omv_member_t *m, const omv_push_t *p, omv_payload_t *held);

/* Whether a backup at a cut must keep group g's push for step back until the cut's orders. */
static int backup_beyond_cut(const omv_run_t *r, int g, uint64_t step)
{
    return r->backup_cut_on && g >= 0 && (uint32_t)g < r->backup_cut_n && step >= r->backup_cut[g];
}

void omv_run_backup_cut(omv_run_t *r, const uint64_t *clocks, uint32_t n)
{
    r->backup_cut_on = clocks != NULL;
    r->backup_cut_n = n < OMV_WIRE_MAX_CLOCKS ? n : OMV_WIRE_MAX_CLOCKS;
    for (uint32_t g = 0; clocks && g < r->backup_cut_n; g++)
        r->backup_cut[g] = clocks[g];
}

/* A backup takes its pushes from the workers, as its primary does, but it may see a worker's
 * push for the next step before another's for this one (they come over different links): such
 * a push, and every later one of the same worker, waits for its step. Returns whether it was
 * kept. */
static int backup_hold(omv_run_t *r, omv_member_t *m, const omv_push_t *p)
{
    /* Only a push that fits a shard of the range may wait: any other is refused now (by
     * push_fits, as the primary refuses it), not kept to fill the backup's memory. */
    const omv_shard_t *sh =
        p->shard >= shard_lo(r) && p->shard < shard_hi(r) ? &r->shards->shards[p->shard] : NULL;
    if (sh == NULL || p->offset != sh->offset || p->count != sh->count || p->wire == OMV_WIRE_SHM)
        return 0;
    int g = omv_groups_of(r->groups, m->slot);
    uint32_t id = omv_members_id(r->env.members, m);
    int behind = 0;
    for (uint32_t i = 0; i < r->n_held && !behind; i++)
        behind = r->held[i].worker_id == id;
    if (!behind && r->state != OMV_JOB_WAITING && !backup_beyond_cut(r, g, p->step) &&
        (g < 0 || p->step <= omv_groups_clock(r->groups, (uint32_t)g)))
        return 0;
    if (r->held == NULL)
        r->held = calloc(OMV_RUN_HELD_MAX, sizeof(omv_run_held_t));
    if (r->held == NULL || r->n_held == OMV_RUN_HELD_MAX) {
        if (!r->part_broken)
            omv_log_error("backup of shards [%u, %u): %u pushes wait for their steps, the most "
                          "it keeps: it no longer follows its primary",
                          r->part.first, r->part.last, r->n_held);
        r->part_broken = 1;
        return 1;
    }
    omv_run_held_t *h = &r->held[r->n_held];
    omv_router_take_payload(r->env.router, &h->payload);
    size_t len = 0,
           range = (size_t)(r->shards->offsets[r->part.last] - r->shards->offsets[r->part.first]) *
                   sizeof(float);
    omv_payload_data(&h->payload, &len);
    size_t cap = 4 * range * (r->n_slots ? r->n_slots : 1);
    if (cap < OMV_RUN_HELD_MIN_BYTES)
        cap = OMV_RUN_HELD_MIN_BYTES;
    if (r->held_bytes + len > cap) {
        omv_payload_close(&h->payload);
        if (!r->part_broken)
            omv_log_error("backup of shards [%u, %u): %zu bytes of pushes wait for their steps, "
                          "the most it keeps: it no longer follows its primary",
                          r->part.first, r->part.last, r->held_bytes + len);
        r->part_broken = 1;
        return 1;
    }
    r->n_held++;
    r->held_bytes += len;
    h->since_ms = omv_time_ms();
    h->worker_id = id;
    h->push = *p;
    return 1;
}

/* A held push leaves the queue (taken, or its worker gone): its bytes no longer count. */
static void held_out(omv_run_t *r, omv_run_held_t *h)
{
    size_t len = 0;
    omv_payload_data(&h->payload, &len);
    r->held_bytes -= len < r->held_bytes ? len : r->held_bytes;
}

/* The held pushes whose steps have come, in the order they came. */
static void backup_release(omv_run_t *r)
{
    uint32_t blocked[OMV_RUN_HELD_MAX], n_blocked = 0, kept = 0;
    for (uint32_t i = 0; i < r->n_held; i++) {
        omv_run_held_t h = r->held[i];
        omv_member_t *m = omv_members_get(r->env.members, h.worker_id);
        int g = m && m->state == OMV_MEMBER_ALIVE ? omv_groups_of(r->groups, m->slot) : -1;
        int wait = 0;
        for (uint32_t k = 0; k < n_blocked && !wait; k++)
            wait = blocked[k] == h.worker_id;
        if (!wait && g >= 0 &&
            (r->state == OMV_JOB_WAITING || backup_beyond_cut(r, g, h.push.step) ||
             h.push.step > omv_groups_clock(r->groups, (uint32_t)g)))
            wait = 1;
        if (!wait || g < 0)
            held_out(r, &h);
        if (g < 0) {
            omv_payload_close(&h.payload); /* gone meanwhile */
        } else if (wait) {
            blocked[n_blocked++] = h.worker_id;
            r->held[kept++] = h;
            if (!r->part_broken && omv_time_ms() - h.since_ms > OMV_RUN_HELD_MAX_MS) {
                omv_log_error("backup of shards [%u, %u): a push of step %llu has waited %d s "
                              "for its step (one it missed?): it no longer follows its primary",
                              r->part.first, r->part.last, (unsigned long long)h.push.step,
                              OMV_RUN_HELD_MAX_MS / 1000);
                r->part_broken = 1;
            }
        } else {
            push_with(r, m, &h.push, &h.payload);
        }
    }
    r->n_held = kept;
}

void omv_run_push(omv_run_t *r, omv_member_t *m, const omv_push_t *p)
{
    if (r->part.backup && backup_hold(r, m, p))
        return;
    push_with(r, m, p, NULL);
}

static void push_with(omv_run_t *r, omv_member_t *m, const omv_push_t *p, omv_payload_t *held)
{
    char who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", omv_members_id(r->env.members, m), m->host);
    if (!push_fits(r, m, p, who)) {
        if (held)
            omv_payload_close(held);
        return;
    }
    uint32_t group = (uint32_t)omv_groups_of(r->groups, m->slot);
    m->last_push_ms = omv_time_ms();
    /* A backup serves nothing: the step's batch and weight are fixed by its first push, as
     * its primary fixed them when it sent the step (the same members, the same split). */
    if (r->part.backup && (!m->served || m->served_step != p->step)) {
        begin_serve(r, m, group, p->step);
        if (p->samples > 0 && p->samples <= r->job.batch_size && p->samples != m->batch) {
            m->batch = p->samples; /* what the worker computed, as its primary asked */
            m->weight = push_weight(r, m, group);
        }
    }
    r->bytes_in_total += omv_wire_value_bytes(p->wire, p->count);
    /* The shard's executor checks the values and adds them; a gradient with NaN or Inf comes
     * back as a refusal and stays out of the sum. The step goes on either way. */
    omv_payload_t payload, *pl = &payload;
    if (p->wire == OMV_WIRE_SHM)
        pl = NULL; /* the values are in its segment */
    else if (held)
        pl = held;
    else
        omv_router_take_payload(r->env.router, &payload);
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_PUSH,
                           .group = group,
                           .step = p->step,
                           .worker_id = omv_members_id(r->env.members, m),
                           .sgd = current_rule(r),
                           .solo = omv_groups_live(r->groups, group) == 1,
                           .wire = p->wire,
                           .weight = m->weight,
                           .shm_src = p->wire == OMV_WIRE_SHM ? m->shm_grads : NULL,
                           .norm_bound = (float)r->job.gradient_norm_bound,
                           .norm_warmup = (uint32_t)r->job.gradient_norm_warmup};
    omv_shardset_send(r->shards, p->shard, &cmd, &m->peer, pl);
    /* A shard server counts the step with its first shard (the worker sends it last to it). */
    if (p->shard == shard_lo(r))
        count_step(r, m, group, p);
    r->pushes_recorded_total++;
    omv_groups_record_push(r->groups, m->slot, p->shard - shard_lo(r));
}

/* ---- the job's lifecycle ---- */

static void start(omv_run_t *r, const char *why)
{
    r->state = OMV_JOB_RUNNING;
    r->start_s = r->last_line_s = omv_time_s();
    r->ckpt.last_s = r->start_s;
    r->ckpt.last_step = omv_groups_min_clock(r->groups);
    assign_slices(r);
    omv_timeline_now_t now = timeline_now(r);
    omv_timeline_start(&r->timeline, &now);
    if (r->tuner && omv_tuner_start(r->tuner, omv_run_live_trainers(r), omv_time_s()) < 0) {
        omv_run_finish(r, OMV_JOB_FAILED, "the optimizer cannot start (see the log)");
        return;
    }
    tuner_poll(r);
    if (remote(r))
        tell_servers(r, OMV_SERVER_START);
    omv_log_info("job '%s' running%s: %d workers in %lld groups, staleness %s, until %llu "
                 "images (%.2f epochs) are done",
                 r->job.name, why, omv_run_live_trainers(r), (long long)r->job.groups,
                 r->job.staleness < 0 ? "none" : "bounded", (unsigned long long)r->target_images,
                 (double)r->job.epochs);
}

/* Wire int8: how the parameters went to the workers over sockets, and the views kept for it. */
static void log_views(const omv_run_t *r)
{
    if (r->job.wire != OMV_WIRE_INT8 || remote(r) || r->shards == NULL)
        return;
    omv_shard_views_t all = {0};
    for (uint32_t s = shard_lo(r); s < shard_hi(r); s++) {
        omv_shard_views_t v;
        omv_shard_thread_views(r->shards->threads[s], &v);
        all.views += v.views;
        all.bytes += v.bytes;
        all.changes += v.changes;
        all.wholes += v.wholes;
        all.buffers += v.buffers;
    }
    /* A change goes out from its view's buffer, shared by the messages that carry it: another
     * buffer is made only when the last change is still on its way out as the next is made. */
    if (all.changes + all.wholes > 0)
        omv_log_info("job '%s': shards were sent as %llu int8 changes and %llu whole; %llu views "
                     "of shards are kept for the workers (%.1f MB); %llu change buffers were made "
                     "beside the views' own",
                     r->job.name, (unsigned long long)all.changes, (unsigned long long)all.wholes,
                     (unsigned long long)all.views, (double)all.bytes / 1e6,
                     (unsigned long long)all.buffers);
}

static void log_end(omv_run_t *r, omv_job_state_t state, const char *why)
{
    log_views(r);
    if (state == OMV_JOB_DONE) {
        double train_s = omv_run_train_seconds(r);
        omv_log_info("job '%s' done: test_accuracy %.4f, %.2f epochs, %.1f s, %.0f images/s",
                     r->job.name, omv_run_result_accuracy(r), omv_run_epoch(r),
                     omv_run_wall_seconds(r),
                     train_s > 0 ? (double)r->images_total / train_s : 0.0);
        return;
    }
    omv_strlcpy(r->fail_reason, why, sizeof(r->fail_reason));
    if (state == OMV_JOB_STOPPED)
        omv_log_info("job '%s' stopped at epoch %.2f: %s", r->job.name, omv_run_epoch(r), why);
    else
        omv_log_error("job '%s' failed: %s", r->job.name, why);
}

void omv_run_finish(omv_run_t *r, omv_job_state_t state, const char *why)
{
    r->state = state;
    r->end_s = omv_time_s();
    if (r->train_end_s == 0)
        r->train_end_s = r->end_s;
    omv_timeline_now_t now = timeline_now(r);
    omv_timeline_end(&r->timeline, &now);
    if (r->is_part) {
        log_end(r, state, why);
        return; /* the coordinator tells the workers */
    }
    if (remote(r)) {
        tell_servers(r, OMV_SERVER_END);
        omv_servers_release(r->env.servers, r->id);
    }
    /* The workers exit (--once), or stay and register again for whatever comes next. */
    if (r->env.once) {
        omv_members_stop_all(r->env.members, r->env.router, OMV_MEMBER_ALIVE, OMV_MEMBER_ALIVE, why,
                             0);
    } else {
        char again[OMV_WIRE_REASON_MAX];
        snprintf(again, sizeof(again), "job '%s' is %s: register again for the next job",
                 r->job.name, omv_run_state_names[state]);
        omv_members_stop_all(r->env.members, r->env.router, OMV_MEMBER_ALIVE, OMV_MEMBER_DONE,
                             again, 1);
        omv_eval_lost(&r->eval); /* it registers again too: nothing of it is in flight */
    }
    log_end(r, state, why);
    if (state == OMV_JOB_DONE && r->ckpt.enabled)
        r->final_ckpt = write_checkpoint(r) < 0 ? -1 : 1;
}

double omv_run_result_accuracy(const omv_run_t *r)
{
    if (r->state == OMV_JOB_DONE && !r->final_eval)
        return NAN;
    return omv_eval_last_accuracy(&r->eval);
}

/* Training reached its images: the final evaluation, then done. */
static void finishing(omv_run_t *r)
{
    r->state = OMV_JOB_FINISHING;
    r->train_end_s = omv_time_s();
    if (r->is_part) {
        omv_log_info("training finished after %.1f s: %llu steps, %llu images in this part",
                     omv_run_train_seconds(r), (unsigned long long)r->steps_total,
                     (unsigned long long)r->images_total);
        part_finished(r);
        return;
    }
    omv_log_info("training finished after %.1f s; final evaluation", omv_run_train_seconds(r));
    if (remote(r) && r->cut_phase != 0) {
        /* The final model comes by a final gather; the servers stop holding steps back. */
        send_cut_op(r, OMV_SERVER_RESUME);
        omv_run_parts_abandon(r);
        r->cut_phase = 0;
    }
    r->fetch_fresh = 0; /* what came before is not the final model */
    request_eval(r);
}

/* The end of training, evaluations as they come due, and checkpoints by steps. */
static void progress_running(omv_run_t *r)
{
    if (omv_run_live_trainers(r) == 0) {
        omv_run_finish(r, OMV_JOB_FAILED, "every trainer is gone");
        return;
    }
    if (r->images_total >= r->target_images && omv_groups_settled(r->groups)) {
        finishing(r);
    } else if (r->job.eval_every_epochs > 0 && omv_run_epoch(r) >= r->eval.next_epoch &&
               !omv_tuner_probing(r->tuner)) {
        while (r->eval.next_epoch <= omv_run_epoch(r))
            r->eval.next_epoch += r->job.eval_every_epochs;
        request_eval(r);
    }
    if (r->state == OMV_JOB_RUNNING && r->ckpt.enabled && r->job.checkpoint_every_steps > 0) {
        /* Checked as steps complete, not by the clock, so no more than the interval is lost. */
        uint64_t step = omv_groups_min_clock(r->groups);
        if (step != UINT64_MAX &&
            step >= r->ckpt.last_step + (uint64_t)r->job.checkpoint_every_steps)
            r->ckpt.due = 1;
    }
}

void omv_run_progress(omv_run_t *r)
{
    if (r->n_held > 0)
        backup_release(r);
    if (r->is_part)
        part_cut_check(r);
    if (r->state == OMV_JOB_RUNNING)
        progress_running(r);
    if (r->state == OMV_JOB_FINISHING && !final_model_in(r)) {
        fetch_model(r, 1); /* the final model, for its checkpoint */
        return;
    }
    if (r->state == OMV_JOB_FINISHING && r->final_eval) {
        omv_run_finish(r, OMV_JOB_DONE, "job done"); /* its evaluation came before its model */
        return;
    }
    if (r->state == OMV_JOB_FINISHING && r->eval.evaluator == 0 && !r->is_part) {
        omv_log_warn("no evaluator is connected: the job ends without a final test accuracy");
        omv_run_finish(r, OMV_JOB_DONE, "job done");
        return;
    }
    checkpoint_if_due(r);
    finish_stop(r);
    if (r->state == OMV_JOB_RUNNING)
        serve_parked(r);
}

void omv_run_stop(omv_run_t *r, omv_run_stop_t how, double settle_s)
{
    /* The daemon's way out is never turned back into a job's stop. */
    if (r->stopping == how || r->stopping == OMV_RUN_STOP_EXIT)
        return;
    r->stopping = how;
    r->stop_deadline_s = omv_time_s() + settle_s;
    if (r->state == OMV_JOB_RUNNING && r->ckpt.enabled)
        r->ckpt.due = 1;
    finish_stop(r);
}

/* A requested stop ends once its checkpoint is written, or when it is late without one. */
static void finish_stop(omv_run_t *r)
{
    if (r->stopping == OMV_RUN_STOP_NONE || r->exit_ready)
        return;
    if (r->stopping == OMV_RUN_STOP_JOB && OMV_JOB_OVER(r->state))
        return;
    checkpoint_if_due(r);
    int late = omv_time_s() > r->stop_deadline_s;
    if (r->ckpt.due && !late)
        return;
    if (r->stopping == OMV_RUN_STOP_EXIT) {
        if (r->ckpt.due)
            omv_log_warn("a group is still half-way through a step; the last checkpoint stays %s",
                         r->ckpt.last_path[0] ? r->ckpt.last_path : "(none)");
        r->exit_ready = 1;
        return;
    }
    if (r->ckpt.due)
        omv_log_warn("job '%s': no checkpoint of whole steps in time for stop; stopping without "
                     "one (the last is %s)",
                     r->job.name, r->ckpt.last_path[0] ? r->ckpt.last_path : "none");
    r->ckpt.due = 0;
    r->ckpt_forced = 0;
    omv_run_finish(r, OMV_JOB_STOPPED, "stopped by omnivorectl stop");
}

/* ---- joining ---- */

int omv_run_may_join(const omv_run_t *r, omv_role_t role, char *why, size_t cap,
                     omv_refuse_t *ret_code)
{

    if (role == OMV_ROLE_TRAINER && free_slot(r) < 0) {
        snprintf(why, cap, "job '%s' has no room for another worker (%u slots)", r->job.name,
                 r->n_slots);
        *ret_code = OMV_REFUSE_FULL;
        return 0;
    }
    if (role != OMV_ROLE_TRAINER && r->eval.evaluator != 0) {
        snprintf(why, cap, "an evaluator is already connected");
        *ret_code = OMV_REFUSE_ROLE;
        return 0;
    }
    return 1;
}

static void fill_jobspec(const omv_run_t *r, omv_jobspec_t *j)
{
    const omv_job_t *job = &r->job;
    omv_strlcpy(j->name, job->name, sizeof(j->name));
    j->n_layers = job->n_layers;
    memcpy(j->layers, job->layers, sizeof(j->layers));
    omv_strlcpy(j->model, job->model_text, sizeof(j->model));
    omv_strlcpy(j->data_format, job->data_format, sizeof(j->data_format));
    j->scale = (float)job->scale;
    j->n_mean = job->n_mean, j->n_std = job->n_std;
    memcpy(j->mean, job->mean, sizeof(j->mean));
    memcpy(j->std, job->std, sizeof(j->std));
    j->augment_pad = (uint32_t)job->augment_pad;
    j->augment_flip = (uint32_t)job->augment_flip;
    omv_strlcpy(j->train_images, job->train_images, sizeof(j->train_images));
    omv_strlcpy(j->train_labels, job->train_labels, sizeof(j->train_labels));
    omv_strlcpy(j->test_images, job->test_images, sizeof(j->test_images));
    omv_strlcpy(j->test_labels, job->test_labels, sizeof(j->test_labels));
    j->batch_size = (uint32_t)job->batch_size; /* the most a worker is given per step */
    j->seed = (uint64_t)job->seed;
    j->param_count = (uint32_t)r->layout.param_count;
    j->n_shards = r->shards->n_shards;
    memcpy(j->shard_offsets, r->shards->offsets, (r->shards->n_shards + 1) * sizeof(uint32_t));
    j->eval_batch_size = (uint32_t)job->eval_batch_size;
    j->wire = (uint32_t)job->wire;
}

/* The model is on shard servers: the Welcome names them, and they learn of the newcomer. */
static void offer_servers(omv_run_t *r, omv_member_t *m, omv_welcome_t *w)
{
    int trainer = m->role == OMV_ROLE_TRAINER;
    uint64_t token = omv_random_token(m);
    m->attach_token = token;
    w->attach_token = token;
    w->n_servers = r->n_servers;
    for (uint32_t i = 0; i < r->n_servers; i++) {
        const omv_server_t *s = &r->env.servers->rec[r->server_ids[i] - 1];
        omv_server_info_t *o = &w->servers[i];
        omv_strlcpy(o->endpoint, s->endpoint, sizeof(o->endpoint));
        omv_strlcpy(o->public_key, s->public_key, sizeof(o->public_key));
        o->first_shard = s->first;
        o->last_shard = s->last;
    }
    w->n_backups = 0;
    for (uint32_t i = 0; trainer && i < r->n_servers; i++) { /* an evaluator only reads */
        if (r->backup_ids[i] == 0)
            continue;
        const omv_server_t *s = &r->env.servers->rec[r->backup_ids[i] - 1];
        omv_server_info_t *o = &w->backups[w->n_backups++];
        omv_strlcpy(o->endpoint, s->endpoint, sizeof(o->endpoint));
        omv_strlcpy(o->public_key, s->public_key, sizeof(o->public_key));
        o->first_shard = s->first;
        o->last_shard = s->last;
    }
    tell_member(r, m, trainer ? OMV_SERVER_MEMBER_ALIVE : OMV_SERVER_MEMBER_EVALUATOR);
}

static void join_trainer(omv_run_t *r, omv_member_t *m, int rejoin, const char *who,
                         omv_welcome_t *w)
{
    uint32_t group = pick_group(r);
    m->slot = (uint32_t)free_slot(r);
    int next = omv_groups_join(r->groups, m->slot, group);
    assign_slices(r);
    tuner_membership(r);
    w->group = group;
    w->start_step = omv_groups_clock(r->groups, group) + (next > 0 ? 1 : 0);
    w->job.slice_begin = m->slice_begin;
    w->job.slice_count = m->slice_count;
    w->job.steps_per_epoch = r->worker_batch ? m->slice_count / r->worker_batch : 0;
    if (remote(r))
        offer_servers(r, m, w);
    r->env.members->joins_total++;
    if (rejoin)
        r->env.members->rejoins_total++;
    omv_log_info("worker %u (%s) %s: group %u from step %llu, images [%u, %u); %d alive",
                 omv_members_id(r->env.members, m), who, rejoin ? "rejoined" : "registered", group,
                 (unsigned long long)w->start_step, m->slice_begin, m->slice_begin + m->slice_count,
                 omv_run_live_trainers(r));
}

int omv_run_join(omv_run_t *r, omv_member_t *m, int rejoin, const char *who, omv_welcome_t *w)
{
    if (r->first_hello_s == 0)
        r->first_hello_s = omv_time_s();
    fill_jobspec(r, &w->job);
    if (m->role == OMV_ROLE_TRAINER && remote(r) && r->state == OMV_JOB_RUNNING) {
        /* Every server must take it at the same step: the next cut's. */
        m->join_pending = 1;
        m->join_rejoin = rejoin;
        m->slot = OMV_MEMBER_NO_SLOT;
        r->joins_pending++;
        omv_log_info("worker %u (%s) joins the job at the next step boundary of its servers",
                     omv_members_id(r->env.members, m), who);
        checkpoint_if_due(r);
        return 1;
    }
    if (m->role == OMV_ROLE_TRAINER) {
        join_trainer(r, m, rejoin, who, w);
    } else {
        r->eval.evaluator = omv_members_id(r->env.members, m);
        m->attach_token = 0;
        if (remote(r))
            offer_servers(r, m, w); /* it reads the ranges from them (request_eval) */
        omv_log_info("evaluator %u (%s) registered%s", r->eval.evaluator, who,
                     remote(r) ? ": the shard servers send it the model to evaluate" : "");
    }
    return 0;
}

/* The cut is in: the trainers that waited join at its step, on every server alike. */
static void admit_joins(omv_run_t *r)
{
    for (uint32_t i = 0; i < r->env.members->n && r->joins_pending > 0; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (!m->join_pending)
            continue;
        m->join_pending = 0;
        r->joins_pending--;
        if (m->state != OMV_MEMBER_ALIVE)
            continue; /* gone meanwhile */
        omv_msg_t w = {.type = OMV_MSG_WELCOME};
        w.u.welcome.protocol_version = OMV_PROTOCOL_VERSION;
        w.u.welcome.worker_id = i + 1;
        fill_jobspec(r, &w.u.welcome.job);
        char who[96];
        snprintf(who, sizeof(who), "\"%s\" pid %u", m->host, m->pid);
        join_trainer(r, m, m->join_rejoin, who, &w.u.welcome);
        int e = omv_router_send(r->env.router, &m->peer, &w, NULL);
        if (e < 0)
            omv_log_warn("cannot welcome worker %u: %s", i + 1, omv_strerror(e));
    }
}

void omv_run_joined(omv_run_t *r)
{
    if (r->state == OMV_JOB_WAITING && omv_run_live_trainers(r) >= (int)r->job.workers)
        start(r, "");
}

/* ---- periodic work ---- */

static void progress_line(omv_run_t *r, double t)
{
    double rate = (double)(r->images_total - r->last_line_images) / (t - r->last_line_s);
    double loss = r->loss_n ? r->loss_sum / (double)r->loss_n : NAN;
    char acc[32] = "-";
    if (r->eval.n_history)
        snprintf(acc, sizeof(acc), "%.4f", omv_eval_last_accuracy(&r->eval));
    omv_log_info("epoch %.2f/%lld step %llu loss %.4f images/s %.0f test_accuracy %s workers %d",
                 omv_run_epoch(r), (long long)r->job.epochs,
                 (unsigned long long)omv_groups_min_clock(r->groups), loss, rate, acc,
                 omv_run_live_trainers(r));
    r->last_line_s = t;
    r->last_line_images = r->images_total;
    r->loss_sum = 0;
    r->loss_n = 0;
}

/* An evaluator that takes far longer than anyone should is not waited for forever. */
static void check_evaluator(omv_run_t *r, int64_t now_ms)
{
    int64_t timeout = omv_run_worker_timeout_ms(r);
    if (!r->eval.busy || now_ms - r->eval.sent_ms <= 10 * timeout + 60000)
        return;
    omv_member_t *ev = omv_members_get(r->env.members, r->eval.evaluator);
    if (ev == NULL || ev->state != OMV_MEMBER_ALIVE) {
        omv_eval_lost(&r->eval); /* gone already: nobody to wait for */
        return;
    }
    omv_log_warn("evaluator %u did not answer within %.0f s; evaluating without it",
                 r->eval.evaluator, (double)(now_ms - r->eval.sent_ms) / 1000.0);
    r->env.members->deaths_total++;
    omv_run_member_gone(r, ev, OMV_MEMBER_DEAD);
}

void omv_run_cron(omv_run_t *r)
{
    double t = omv_time_s();
    if (r->state == OMV_JOB_WAITING && r->first_hello_s > 0 && omv_run_live_trainers(r) > 0 &&
        t - r->first_hello_s >= r->job.start_timeout_s) {
        char why[128];
        snprintf(why, sizeof(why), " with %d of %lld workers after %.0f s",
                 omv_run_live_trainers(r), (long long)r->job.workers, r->job.start_timeout_s);
        start(r, why);
    }
    check_evaluator(r, omv_time_ms());
    if (r->state != OMV_JOB_RUNNING)
        return;
    if (r->ckpt.enabled && r->job.checkpoint_every_s > 0 &&
        t - r->ckpt.last_s >= r->job.checkpoint_every_s)
        r->ckpt.due = 1;
    if (t - r->last_line_s >= r->job.progress_interval_s)
        progress_line(r, t);
    omv_timeline_now_t now = timeline_now(r);
    omv_timeline_tick(&r->timeline, &now);
    tuner_poll(r);
    failover_settle(r);
    omv_run_take_backup(r); /* a free server that came while a cut was under way */
}

/* ---- making and freeing ---- */

/* [model] init must read into the model, so that a job that cannot start is refused when it is
 * submitted. */
static int check_init(const omv_job_t *j, const omv_model_layout_t *layout, char *err)
{
    float *w = malloc((layout->param_count ? layout->param_count : 1) * sizeof(float));
    char why[OMV_SAFETENSORS_ERR_MAX];
    int r = w ? omv_safetensors_read(j->init, layout, w, why) : -ENOMEM;
    free(w);
    if (r < 0)
        snprintf(err, OMV_CONFIG_ERR_MAX, "[model] init: %s", r == -ENOMEM ? "no memory" : why);
    return r;
}

/* The most a member is given: a group's batch splits as evenly as it goes. */
static uint32_t worker_batch_of(const omv_job_t *j)
{
    uint32_t per_group = (uint32_t)(j->workers / j->groups);
    return (uint32_t)((j->batch_size + per_group - 1) / per_group);
}

int omv_run_check_job(const omv_job_t *j, uint32_t *ret_train_count, uint32_t *ret_worker_batch,
                      char *err)
{
    uint32_t count, channels, rows, cols;
    if (omv_dataset_probe_format(j->data_format, j->train_images, &count, &channels, &rows, &cols,
                                 err) < 0)
        return -EINVAL;
    if (channels * rows * cols != j->layers[0]) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: images are %ux%ux%u = %u values but the model takes %u inputs",
                 j->train_images, channels, rows, cols, channels * rows * cols, j->layers[0]);
        return -EINVAL;
    }
    if (j->train_limit > 0 && (uint64_t)j->train_limit < count)
        count = (uint32_t)j->train_limit;
    uint32_t worker_batch = worker_batch_of(j);
    if (count / (uint32_t)j->workers < worker_batch) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: %u images split over %lld workers leave fewer than a batch of %u per "
                 "worker",
                 j->train_images, count, (long long)j->workers, worker_batch);
        return -EINVAL;
    }
    omv_model_layout_t layout;
    if (omv_model_parse(&layout, j->model_text, j->model_name, err) < 0)
        return -EINVAL;
    if (j->init[0] && check_init(j, &layout, err) < 0)
        return -EINVAL;
    if (ret_train_count)
        *ret_train_count = count;
    if (ret_worker_batch)
        *ret_worker_batch = worker_batch;
    return 0;
}

int64_t omv_run_message_bytes(const omv_job_t *job)
{
    omv_model_layout_t layout;
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_model_parse(&layout, job->model_text, job->model_name, err) < 0)
        return -EINVAL;
    return (int64_t)layout.param_count * (int64_t)sizeof(float) + OMV_WIRE_MAX_ENVELOPE;
}

/* A job whose gradients would be cut off by the worker endpoint's frame limit cannot train. */
static int check_message_limit(const omv_run_t *r)
{
    int64_t limit = omv_router_max_message(r->env.router);
    int64_t need = (int64_t)r->layout.param_count * (int64_t)sizeof(float) + OMV_WIRE_MAX_ENVELOPE;
    if (limit <= 0 || need <= limit)
        return 0;
    omv_log_error("job '%s': its model's messages (%lld bytes) are over the worker endpoint's "
                  "limit of %lld bytes: raise [security] max_message_bytes and restart omnivored",
                  r->job.name, (long long)need, (long long)limit);
    return -EMSGSIZE;
}

static void log_model(const omv_run_t *r)
{
    char table[4096];
    omv_model_summary(&r->layout, table, sizeof(table));
    for (char *line = table, *eol; (eol = strchr(line, '\n')) != NULL; line = eol + 1)
        omv_log_info("model: %.*s", (int)(eol - line), line);
}

/* Takes up a checkpoint of this job: model, momentum, clocks, counters, evaluations and the
 * optimizer's part. */
static int resume(omv_run_t *r, const omv_checkpoint_t *c)
{
    /* A run that was regrouped goes on with the groups it had. */
    omv_groups_set_count(r->groups, c->n_groups);
    int e = omv_run_restore_state(r, c);
    if (e < 0)
        return e;
    for (uint32_t g = 0; g < c->n_groups; g++)
        omv_groups_set_clock(r->groups, g, c->clocks[g]);
    r->images_total = c->images_total;
    r->last_line_images = c->images_total; /* the first progress line's images/s counts from here */
    r->steps_total = c->steps_total;
    r->train_s_before = c->train_s;
    for (uint32_t i = 0; i < c->n_history; i++)
        if (omv_eval_add(&r->eval, c->history[i].epoch, c->history[i].wall_s,
                         c->history[i].accuracy, c->history[i].loss) < 0)
            break;
    omv_tuner_load(r->tuner, &c->opt);
    if (c->finished) {
        /* Its final checkpoint, written after its final evaluation (if it had one). */
        r->final_eval = c->n_history > 0;
        r->final_ckpt = 1;
        r->state = OMV_JOB_DONE;
        r->start_s = r->end_s = r->train_end_s = omv_time_s();
    }
    r->ckpt.resumed_epoch = omv_run_epoch(r);
    omv_log_info("resumed from %s: epoch %.2f, %llu images, %u evaluations%s", r->ckpt.resumed_from,
                 omv_run_epoch(r), (unsigned long long)c->images_total, c->n_history,
                 c->finished ? "; the job was already done" : "");
    return 0;
}

/* Checkpoints: the folder, and resuming from the newest when there is one. */
static int setup_checkpoints(omv_run_t *r)
{
    omv_checkpoint_t c;
    int e = omv_run_ckpt_find(&r->ckpt, &r->job, r->layout.param_count, r->max_groups, &c);
    if (e == 1) {
        e = resume(r, &c);
        omv_checkpoint_fini(&c);
    }
    if (r->eval.n_history)
        r->eval.next_epoch =
            r->eval.history[r->eval.n_history - 1].epoch + r->job.eval_every_epochs;
    return e < 0 ? e : 0;
}

/* The model, its shards, the groups and the per-group sums. */
static int setup_model(omv_run_t *r)
{
    char err[OMV_CONFIG_ERR_MAX];
    const omv_job_t *j = &r->job;
    /* A shard server reads no data: the coordinator checked it. */
    int e = r->is_part ? 0 : omv_run_check_job(j, &r->train_count, &r->worker_batch, err);
    if (r->is_part) {
        r->train_count = r->part.train_count;
        r->worker_batch = worker_batch_of(j);
    }
    if (e == 0)
        e = omv_model_parse(&r->layout, j->model_text, j->model_name, err);
    if (e < 0) {
        omv_log_error("%s", err);
        return -EINVAL;
    }
    e = check_message_limit(r);
    if (e < 0)
        return e;
    r->target_images = (uint64_t)r->train_count * (uint64_t)j->epochs;
    log_model(r);
    /* Room for workers that join beyond the planned ones, and for replacements; and for as
     * many groups as there are slots: regrouping may use them. */
    r->n_slots = (uint32_t)j->workers * 2 + 16;
    r->max_groups = r->n_slots > (uint32_t)j->groups ? r->n_slots : (uint32_t)j->groups;
    r->group_images = calloc(r->max_groups, sizeof(uint64_t));
    r->group_loss_sum = calloc(r->max_groups, sizeof(double));
    r->group_loss_n = calloc(r->max_groups, sizeof(uint32_t));
    r->group_planned = calloc(r->max_groups, sizeof(uint64_t));
    r->cut_clocks = calloc(r->max_groups, sizeof(uint64_t));
    if (!r->group_images || !r->group_loss_sum || !r->group_loss_n || !r->group_planned ||
        !r->cut_clocks)
        return -ENOMEM;
    r->shards = omv_shardset_new(r->env.router, r->env.refusals, &r->layout, (uint32_t)j->shards,
                                 r->max_groups, (uint64_t)j->seed, j->update != OMV_JOB_UPDATE_SGD);
    if (r->shards == NULL)
        return -errno;
    /* A shard server makes its range from [model] init when the coordinator asks it to. */
    if (j->init[0] && !r->is_part && omv_run_load_init(r, j->init) < 0)
        return -EINVAL;
    if (remote(r) && r->shards->n_shards < (uint32_t)j->servers) {
        omv_log_error("job '%s': the model splits into only %u shards along its layers, fewer "
                      "than [cluster] servers = %lld: give fewer servers",
                      j->name, r->shards->n_shards, (long long)j->servers);
        return -EINVAL;
    }
    if (r->is_part && (r->part.first >= r->part.last || r->part.last > r->shards->n_shards)) {
        omv_log_error("the coordinator assigns shards [%u, %u) of %u", r->part.first, r->part.last,
                      r->shards->n_shards);
        return -EINVAL;
    }
    omv_groups_events_t ev = {on_apply, on_advance, on_retire, r};
    /* A coordinator with shard servers counts one report per member and step; a shard server
     * the shards it holds. */
    uint32_t counted = remote(r) ? 1 : shard_hi(r) - shard_lo(r);
    r->groups = omv_groups_new(r->n_slots, (uint32_t)j->groups, counted, j->staleness, &ev);
    if (r->groups == NULL)
        return -ENOMEM;
    r->sgd = (omv_sgd_t){
        .learning_rate = (float)j->learning_rate,
        .momentum = (float)(j->update == OMV_UPDATE_SGD ? j->momentum : j->beta1),
        .weight_decay = (float)j->weight_decay,
        .kind = j->update == OMV_JOB_UPDATE_ADAMW  ? OMV_UPDATE_ADAMW
                : j->update == OMV_JOB_UPDATE_ADAM ? OMV_UPDATE_ADAM
                                                   : OMV_UPDATE_SGD,
        .beta2 = j->beta2,
        .epsilon = (float)j->epsilon,
    };
    omv_log_info("job '%s': model %s (%zu parameters in %u shards), %u training images, "
                 "%u per worker step; %s",
                 j->name, j->layers_text[0] ? j->layers_text : j->definition, r->layout.param_count,
                 r->shards->n_shards, r->train_count, r->worker_batch,
                 j->wire == OMV_WIRE_INT8
                     ? "gradients travel as int8 (a scale per 64 values, error feedback), "
                       "parameters as int8 changes to each worker's copy"
                 : j->wire == OMV_WIRE_BF16 ? "parameters and gradients travel as bf16"
                                            : "parameters and gradients travel as fp32");
    int bn = r->layout.state_offset < r->layout.param_count;
    omv_log_info("update rule %s: learning rate %g (schedule %s, warmup %lld updates), %s %g, "
                 "weight decay %g%s",
                 j->update_name, j->learning_rate, j->schedule_name, (long long)j->warmup_steps,
                 j->update == OMV_JOB_UPDATE_SGD ? "momentum" : "beta1", (double)r->sgd.momentum,
                 j->weight_decay, bn ? "; batch norm statistics: each group's mean" : "");
    return 0;
}

omv_run_t *omv_run_new(const omv_run_env_t *env, const omv_job_t *job, const char *path,
                       const char *text, uint64_t id)
{
    omv_run_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->env = *env;
    r->id = id;
    r->job = *job;
    if (env->part) {
        r->is_part = 1;
        r->part = *env->part;
        r->env.part = NULL;
    }
    r->state = OMV_JOB_WAITING;
    r->load_s = omv_time_s();
    omv_strlcpy(r->path, path, sizeof(r->path));
    omv_eval_init(&r->eval, job->eval_every_epochs);
    omv_timeline_init(&r->timeline);
    int e = -ENOMEM;
    r->text = strdup(text ? text : "");
    if (r->text == NULL)
        goto fail;
    e = setup_model(r);
    if (e < 0)
        goto fail;
    if (r->is_part) {
        omv_log_info("job %llu '%s' from the coordinator: shards [%u, %u) of %u on this server",
                     (unsigned long long)id, r->job.name, r->part.first, r->part.last,
                     r->shards->n_shards);
        return r; /* the coordinator checkpoints, evaluates and tunes */
    }
    e = omv_run_ckpt_init(&r->ckpt, &r->job, r->env.state_dir, r->env.checkpoint_root);
    if (e < 0)
        goto fail;
    if (job->optimizer && !r->is_part) {
        /* Its decisions file goes beside the checkpoints. The coordinator's decides for the
         * shard servers, and tells them at each cut. */
        r->tuner = omv_tuner_new(job, r->ckpt.enabled ? r->ckpt.dir : NULL);
        if (r->tuner == NULL)
            goto fail;
    }
    e = setup_checkpoints(r);
    if (e < 0)
        goto fail;
    if (remote(r) && r->job.replicas > 1) {
        /* After a failover: the backups the servers left can give. */
        uint32_t n = (uint32_t)r->job.servers, free = omv_servers_free(r->env.servers);
        r->backups_wanted = !env->degraded ? n : free > n ? (free - n < n ? free - n : n) : 0;
    }
    omv_log_info("job %llu '%s' loaded from %s; %u of %u shards have a thread",
                 (unsigned long long)id, r->job.name, path, r->shards->threaded,
                 r->shards->n_shards);
    return r;
fail:
    omv_run_destroy(&r);
    errno = e < 0 ? -e : ENOMEM;
    return NULL;
}

void omv_run_destroy(omv_run_t **self_p)
{
    omv_run_t *r = *self_p;
    if (r == NULL)
        return;
    /* Its workers (told at the end of the job) register again; records stay for their ids. */
    for (uint32_t i = 0; i < r->env.members->n; i++)
        if (r->env.members->records[i].state == OMV_MEMBER_ALIVE)
            r->env.members->records[i].state = OMV_MEMBER_DONE;
    if (remote(r) && r->env.servers) {
        if (!OMV_JOB_OVER(r->state))
            tell_servers(r, OMV_SERVER_END);
        omv_servers_release(r->env.servers, r->id);
    }
    for (uint32_t i = 0; i < r->n_held; i++)
        omv_payload_close(&r->held[i].payload);
    r->held_bytes = 0;
    free(r->held);
    free(r->fetch_params);
    free(r->fetch_velocity);
    free(r->fetch_second);
    free(r->cut_clocks);
    omv_shardset_destroy(&r->shards);
    /* Segments are the size of this job's model: the next job's workers get their own. */
    for (uint32_t i = 0; i < r->env.members->n; i++)
        omv_members_shm_release(&r->env.members->records[i]);
    omv_groups_destroy(&r->groups);
    omv_tuner_destroy(&r->tuner);
    omv_timeline_fini(&r->timeline);
    omv_eval_fini(&r->eval);
    free(r->group_images);
    free(r->group_loss_sum);
    free(r->group_loss_n);
    free(r->group_planned);
    free(r->text);
    free(r);
    *self_p = NULL;
}

void omv_run_drain_shards(omv_run_t *r)
{
    omv_shardset_drain(r->shards);
}

/* ---- the model on shard servers: the coordinator ---- */

int omv_run_wants_servers(const omv_run_t *r)
{
    return remote(r) &&
           (r->n_servers < (uint32_t)r->job.servers || r->n_backups < r->backups_wanted);
}

/* [cluster] replicas = 2: backup i holds server i's range, on another host where it can. */
static void assign_backups(omv_run_t *r)
{
    uint32_t ids[OMV_WIRE_MAX_SERVERS], n = r->n_backups;
    memcpy(ids, r->backup_ids, sizeof(ids));
    memset(r->backup_ids, 0, sizeof(r->backup_ids));
    for (uint32_t i = 0; i < n; i++) {
        const omv_server_t *p = &r->env.servers->rec[r->server_ids[i] - 1];
        uint32_t pick = n;
        for (uint32_t k = 0; k < n && pick == n; k++)
            if (ids[k] && strcmp(r->env.servers->rec[ids[k] - 1].host, p->host) != 0)
                pick = k;
        for (uint32_t k = 0; k < n && pick == n; k++)
            if (ids[k])
                pick = k;
        omv_server_t *b = &r->env.servers->rec[ids[pick] - 1];
        if (strcmp(b->host, p->host) == 0)
            omv_log_warn("job '%s': the backup of shards [%u, %u) is on the primary's host %s",
                         r->job.name, p->first, p->last, p->host);
        b->first = p->first;
        b->last = p->last;
        b->backup = 1;
        r->backup_ids[i] = ids[pick];
        ids[pick] = 0;
    }
}

/* Spreads the shards over the servers in order, each about the same bytes (at least a shard
 * each). */
static void assign_ranges(omv_run_t *r)
{
    uint32_t ends[OMV_WIRE_MAX_SERVERS], at = 0;
    omv_model_shard_ranges(r->shards->offsets, r->shards->n_shards, r->n_servers, ends);
    for (uint32_t i = 0; i < r->n_servers; i++) {
        omv_server_t *s = &r->env.servers->rec[r->server_ids[i] - 1];
        s->first = at;
        s->last = at = ends[i];
    }
}

int omv_run_add_server(omv_run_t *r, omv_server_t *s)
{
    if (!omv_run_wants_servers(r) || s->run_id != 0)
        return 0;
    s->run_id = r->id;
    s->backup = 0;
    uint32_t id = omv_servers_id(r->env.servers, s);
    if (r->n_servers < (uint32_t)r->job.servers)
        r->server_ids[r->n_servers++] = id;
    else
        r->backup_ids[r->n_backups++] = id;
    omv_log_info("job '%s': shard server %u (%s at %s) taken, %u of %lld%s", r->job.name, id,
                 s->host, s->endpoint, r->n_servers + r->n_backups,
                 (long long)r->job.servers + r->backups_wanted,
                 r->n_servers + r->n_backups > (uint32_t)r->job.servers ? " (a backup)" : "");
    if (omv_run_wants_servers(r))
        return 0;
    assign_ranges(r);
    assign_backups(r);
    for (uint32_t i = 0; i < r->n_servers + r->n_backups; i++) {
        uint32_t sid = i < r->n_servers ? r->server_ids[i] : r->backup_ids[i - r->n_servers];
        omv_server_t *o = &r->env.servers->rec[sid - 1];
        omv_log_info("shard server %u (%s): shards [%u, %u), parameters [%u, %u)%s", sid,
                     o->endpoint, o->first, o->last, r->shards->offsets[o->first],
                     r->shards->offsets[o->last], o->backup ? ", as their backup" : "");
        if (omv_run_send_assign(r, o) < 0) {
            omv_run_finish(r, OMV_JOB_FAILED, "cannot send the job to a shard server");
            return 0;
        }
    }
    return 1;
}

static void record_report(omv_run_t *r, omv_member_t *m, const omv_step_report_t *rep)
{
    uint32_t group = (uint32_t)omv_groups_of(r->groups, m->slot);
    omv_push_t p = {.worker_id = rep->worker_id,
                    .step = rep->step,
                    .loss = rep->loss,
                    .samples = rep->samples,
                    .compute_ms = rep->compute_ms};
    m->last_push_ms = omv_time_ms();
    m->served = 1;
    m->served_step = rep->step;
    count_step(r, m, group, &p);
    r->pushes_recorded_total++;
    omv_groups_record_push(r->groups, m->slot, 0);
}

/* Records the early reports that are due now, as their groups advance. */
static void record_early(omv_run_t *r)
{
    char why[OMV_WIRE_REASON_MAX];
    for (int again = 1; again;) {
        again = 0;
        for (uint32_t i = 0; i < r->env.members->n; i++) {
            omv_member_t *o = &r->env.members->records[i];
            if (o->n_early == 0 || o->state != OMV_MEMBER_ALIVE)
                continue;
            omv_step_report_t e = o->early[o->early_head];
            if (omv_groups_check_push(r->groups, o->slot, e.step, 0, why) != OMV_REFUSE_NONE)
                continue;
            o->early_head = (o->early_head + 1) % OMV_MEMBER_EARLY_MAX;
            o->n_early--;
            record_report(r, o, &e);
            again = 1;
        }
    }
}

void omv_run_report(omv_run_t *r, omv_member_t *m, const omv_step_report_t *rep)
{
    char why[OMV_WIRE_REASON_MAX], who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", omv_members_id(r->env.members, m), m->host);
    if (!remote(r) || m->role != OMV_ROLE_TRAINER) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, who,
                         "a step report, but the daemon holds the model: push to it");
        return;
    }
    if (r->state == OMV_JOB_FINISHING || r->state == OMV_JOB_DONE ||
        r->images_total >= r->target_images) {
        r->late_total++; /* a step begun as the job reached its images: not applied */
        return;
    }
    int fg = omv_groups_of(r->groups, m->slot);
    if (r->failover == 1 && r->cut_phase >= 2 && fg >= 0 && rep->step >= r->cut_clocks[fg]) {
        r->late_total++; /* past the failover's cut: the holders keep it out too */
        return;
    }
    omv_refuse_t code = r->state != OMV_JOB_RUNNING
                            ? OMV_REFUSE_STEP
                            : omv_groups_check_push(r->groups, m->slot, rep->step, 0, why);
    if (r->state != OMV_JOB_RUNNING)
        snprintf(why, sizeof(why), "step report while the job is %s",
                 omv_run_state_names[r->state]);
    int g = omv_groups_of(r->groups, m->slot);
    uint64_t clock = g >= 0 ? omv_groups_clock(r->groups, (uint32_t)g) : 0;
    uint32_t last = (m->early_head + m->n_early + OMV_MEMBER_EARLY_MAX - 1) % OMV_MEMBER_EARLY_MAX;
    if (code == OMV_REFUSE_STEP && m->early == NULL)
        m->early = calloc(OMV_MEMBER_EARLY_MAX, sizeof(*m->early));
    if (code == OMV_REFUSE_STEP && m->early && g >= 0 && rep->step > clock &&
        rep->step <= clock + OMV_MEMBER_EARLY_MAX && m->n_early < OMV_MEMBER_EARLY_MAX &&
        (m->n_early == 0 || rep->step > m->early[last].step)) {
        /* The others' reports of the current step are late: this one waits for them. */
        m->early[(m->early_head + m->n_early++) % OMV_MEMBER_EARLY_MAX] = *rep;
        m->last_push_ms = omv_time_ms();
        return;
    }
    if (code != OMV_REFUSE_NONE) {
        omv_refusals_add(r->env.refusals, &m->peer, code, who, why);
        return;
    }
    record_report(r, m, rep);
    record_early(r);
}

/* Every server's range is in: into the shards, and on with what waited for it. */
static void fetched(omv_run_t *r)
{
    if (r->cut_phase == 2 && (!r->cut_ranges || omv_run_parts_remote(r))) {
        /* The cut's steps are in everywhere (and its ranges in their parts, the model staying
         * on the servers): the change or the manifest once reported. */
        r->cut_phase = 3;
        checkpoint_if_due(r);
        return;
    }
    if (r->fetch_final && omv_run_parts_remote(r)) {
        /* The final model is in the servers' parts, for the manifest: not here. Parts the
         * coordinator cannot see are no checkpoint: the ranges come here instead. */
        if (!omv_run_parts_seen(r)) {
            fetch_model(r, 1);
            return;
        }
        r->fetched_final = 1;
        r->final_in_parts = 1;
        omv_run_progress(r);
        return;
    }
    uint64_t steps[OMV_WIRE_MAX_SHARDS];
    for (uint32_t i = 0; i < r->shards->n_shards; i++)
        steps[i] = r->fetch_adam_steps;
    int state = !r->fetch_params_only; /* an evaluation's gather brings the parameters alone */
    if (omv_shardset_restore(r->shards, r->fetch_params, state ? r->fetch_velocity : NULL,
                             state && r->shards->adam ? r->fetch_second : NULL,
                             state && r->shards->adam ? steps : NULL) < 0) {
        omv_log_error("cannot put the shard servers' model into the daemon's shards");
        return;
    }
    if (r->cut_phase == 2) {
        r->cut_phase = 3; /* the checkpoint once the reports of its steps are in */
        checkpoint_if_due(r);
        return;
    }
    r->fetched_final = r->fetch_final;
    r->fetch_fresh = 1;
    if (r->eval.wanted) {
        r->eval.wanted = 0;
        request_eval(r);
    }
    omv_run_progress(r);
}

void omv_run_gathered(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *g,
                      const float *payload, size_t bytes)
{
    uint32_t off = r->shards->offsets[s->first], count = r->shards->offsets[s->last] - off;
    uint32_t arrays = r->fetch_params_only ? 1 : omv_run_state_arrays(r);
    size_t want = (size_t)arrays * count * sizeof(float);
    if (!remote(r) || s->run_id != r->id || g->gather_id != r->fetch_id || r->fetch_left == 0)
        return; /* an older gather's answer */
    int parts = r->cut_parts && (r->cut_phase == 2 || r->fetch_final);
    if ((r->cut_phase == 2 && !r->cut_ranges) || (g->part && parts))
        want = 0; /* a cut without ranges, or the range in a part: the server's steps are in */
    if (g->first_shard != s->first || g->last_shard != s->last || bytes != want ||
        (want > 0 && !g->params_only != !r->fetch_params_only)) {
        omv_log_error("shard server %u sent shards [%u, %u) in %zu bytes; it holds [%u, %u) "
                      "(%zu bytes): ignored",
                      omv_servers_id(r->env.servers, s), g->first_shard, g->last_shard, bytes,
                      s->first, s->last, want);
        return;
    }
    for (uint32_t k = 0;
         r->failover && r->cut_phase == 2 && k < g->n_groups && k < omv_groups_count(r->groups);
         k++)
        if (omv_groups_live(r->groups, k) > 0 && g->clocks[k] != r->cut_clocks[k]) {
            omv_log_error("failover: shard server %u holds group %u at step %llu, the cut is at "
                          "%llu: the ranges disagree",
                          omv_servers_id(r->env.servers, s), k, (unsigned long long)g->clocks[k],
                          (unsigned long long)r->cut_clocks[k]);
            failover_abandon(r, "the holders' ranges disagree at the failover's cut");
            return;
        }
    float *dst[3] = {r->fetch_params, r->fetch_velocity, r->fetch_second};
    for (uint32_t a = 0; want > 0 && a < arrays; a++)
        memcpy(dst[a] + off, payload + (size_t)a * count, count * sizeof(float));
    if (parts && g->part)
        omv_run_parts_take(r, s, g);
    else if (parts && want > 0)
        omv_run_parts_came(r, s);
    if (s->first == 0)
        r->fetch_adam_steps = g->adam_steps;
    s->bytes_in += bytes;
    s->gathers++;
    if (--r->fetch_left == 0)
        fetched(r);
}

void omv_run_frozen(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *f)
{
    if (!remote(r) || r->cut_phase != 1 || f->gather_id != r->cut_id || s->run_id != r->id)
        return;
    for (uint32_t g = 0; g < f->n_groups && g < r->max_groups; g++)
        if (f->clocks[g] > r->cut_clocks[g])
            r->cut_clocks[g] = f->clocks[g];
    if (--r->cut_left > 0)
        return;
    /* The most steps any server saw begun (in a failover: applied): each finishes those, and
     * sends its range. */
    r->cut_phase = 2;
    r->fetch_left = r->n_servers;
    r->fetch_final = 0;
    r->fetch_params_only = 0;
    send_cut_op(r, OMV_SERVER_CUT);
}

/* A failover's CUT, to each range's holder (its primary, or its backup). */
static void send_failover_op(omv_run_t *r, omv_server_op_t op)
{
    for (uint32_t i = 0; i < r->n_servers; i++) {
        omv_server_t *s = &r->env.servers->rec[r->holder_ids[i] - 1];
        omv_msg_t msg = {.type = OMV_MSG_SERVER};
        omv_server_msg_t *u = &msg.u.server;
        u->op = op;
        u->gather_id = r->cut_id;
        u->failover = 1;
        u->first_shard = s->first;
        u->last_shard = s->last;
        if (op == OMV_SERVER_CUT) {
            u->n_groups = omv_groups_count(r->groups);
            for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
                u->clocks[g] = r->cut_clocks[g];
        }
        if (op == OMV_SERVER_CUT && r->cut_parts) {
            omv_strlcpy(u->part_dir, r->ckpt.dir, sizeof(u->part_dir));
            u->part_seq = r->cut_seq;
        }
        if (omv_servers_send(r->env.servers, r->env.router, s, &msg, NULL) < 0)
            omv_log_warn("cannot send %s to shard server %u", omv_server_op_name(op),
                         r->holder_ids[i]);
    }
}

/* How long the reports must stand still before a failover's cut, so that every step that can
 * still end (its parameters all sent before the server went) has ended, and its pushes are
 * all in at the holders before they are cut: 500 ms, and twice the slowest live trainer's
 * measured step on top (a step under way when the server went ends within one, however slow
 * the trainer); before any trainer has a measured step, as long as a worker may be silent. A
 * cut sooner would leave such a step out, to be trained again, or, where its pushes reached a
 * holder before the cut and its report the coordinator after, find the holders' ranges at
 * other steps than the cut and go back to the last checkpoint. Made again at every look (a
 * trainer that dies meanwhile no longer counts); at most 10 minutes. */
#define FAILOVER_SETTLE_MS 500
#define FAILOVER_SETTLE_MAX_MS 600000

static int64_t failover_settle_ms(const omv_run_t *r, double *ret_slowest_ms)
{
    double slowest = 0.0;
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        const omv_member_t *m = &r->env.members->records[i];
        int g = m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER
                    ? omv_groups_of(r->groups, m->slot)
                    : -1;
        if (g < 0)
            continue;
        /* Its share of its group's batch: the servers, not the coordinator, send its steps. */
        uint32_t live = omv_groups_live(r->groups, (uint32_t)g);
        double share = m->batch ? m->batch : (double)r->job.batch_size / (live ? live : 1);
        double ms = m->ms_per_image * share;
        ms = (double)m->last_compute_ms > ms ? (double)m->last_compute_ms : ms;
        slowest = isfinite(ms) && ms > slowest ? ms : slowest;
    }
    *ret_slowest_ms = slowest;
    double settle = slowest > 0 ? FAILOVER_SETTLE_MS + 2.0 * slowest
                                : FAILOVER_SETTLE_MS + r->job.worker_timeout_s * 1000.0;
    return settle < FAILOVER_SETTLE_MAX_MS ? (int64_t)settle : FAILOVER_SETTLE_MAX_MS;
}

/* A server of the run is gone and every range is still held (by its primary or its backup):
 * once the steps under way have settled (failover_settle), the holders are cut at the steps
 * every member reported (a begun step whose parameters the gone server never sent can never
 * end), and once the cut is in it is written as a checkpoint and the run is made again from it
 * over the servers left (failover_done). Returns whether the failover began. */
static int start_failover(omv_run_t *r)
{
    if (!r->ckpt.enabled || !r->job.checkpoint_resume || r->state != OMV_JOB_RUNNING ||
        omv_tuner_probing(r->tuner))
        return 0; /* nowhere to write it or resume it, or the servers hold a probe's model */
    for (uint32_t i = 0; i < r->n_servers; i++) {
        const omv_server_t *p = &r->env.servers->rec[r->server_ids[i] - 1];
        const omv_server_t *b =
            r->backup_ids[i] ? &r->env.servers->rec[r->backup_ids[i] - 1] : NULL;
        r->holder_ids[i] = p->alive ? r->server_ids[i] : b && b->alive ? r->backup_ids[i] : 0;
        if (r->holder_ids[i] == 0 || fetch_buffers(r) < 0)
            return 0;
    }
    /* Only a backup is gone: every primary can finish its begun steps, as at any cut. */
    int primaries = 1;
    for (uint32_t i = 0; i < r->n_servers; i++)
        primaries &= r->holder_ids[i] == r->server_ids[i];
    r->failover = primaries ? 2 : 1;
    r->failover_ms = r->failover_quiet_ms = omv_time_ms();
    double slowest_ms = 0.0;
    r->failover_settle_ms = failover_settle_ms(r, &slowest_ms);
    r->failover_sig = UINT64_MAX;
    r->env.servers->failovers_total++;
    r->cut_phase = 1;
    r->cut_ranges = 1;
    omv_run_parts_abandon(r); /* a cut under way is given up */
    /* The holders write the cut as a checkpoint's parts, which the run made again reads. */
    r->cut_parts = omv_run_parts_wanted(r);
    r->cut_seq = r->ckpt.seq + 1;
    memset(r->parts_how, 0, sizeof(r->parts_how));
    r->cut_id = ++r->fetch_id;
    r->cut_left = r->n_servers;
    r->fetch_left = 0; /* a gather under way is dropped: the cut brings the model */
    memset(r->cut_clocks, 0, r->max_groups * sizeof(uint64_t));
    for (uint32_t i = 0; i < r->n_servers; i++)
        if (r->holder_ids[i] != r->server_ids[i])
            omv_log_warn("job '%s': shards [%u, %u) go on from their backup, shard server %u",
                         r->job.name, r->env.servers->rec[r->holder_ids[i] - 1].first,
                         r->env.servers->rec[r->holder_ids[i] - 1].last, r->holder_ids[i]);
    if (primaries)
        send_cut_op(r, OMV_SERVER_FREEZE);
    else
        omv_log_warn("job '%s': failover: the holders are cut once no step has been reported for "
                     "%lld ms (the slowest trainer's step takes %.0f ms)",
                     r->job.name, (long long)r->failover_settle_ms, slowest_ms);
    return 1;
}

/* A failover that cannot end: back to the last checkpoint (or failed), as without replicas. */
static void failover_abandon(omv_run_t *r, const char *why)
{
    r->failover = 0;
    r->cut_phase = 0;
    if (!r->job.checkpoint_resume ||
        (r->job.checkpoint_every_s <= 0 && r->job.checkpoint_every_steps <= 0)) {
        char fail[256];
        snprintf(fail, sizeof(fail), "%s, and the job writes no checkpoint to go back to", why);
        omv_run_finish(r, OMV_JOB_FAILED, fail);
        return;
    }
    omv_log_warn("job '%s': %s: it goes back to its last checkpoint", r->job.name, why);
    omv_strlcpy(r->rewind_reason, why, sizeof(r->rewind_reason));
    r->rewind = 1;
}

/* A failover's cut that is not in this long after its settle is given up on. */
#define FAILOVER_DEADLINE_MS 30000

/* A failover waits for the reports to stand still; then the holders cut at the clocks. */
static void failover_settle(omv_run_t *r)
{
    if (r->failover &&
        omv_time_ms() - r->failover_ms > FAILOVER_DEADLINE_MS + r->failover_settle_ms) {
        char why[128];
        snprintf(why, sizeof(why), "the failover's cut did not come in within %lld s",
                 (long long)((FAILOVER_DEADLINE_MS + r->failover_settle_ms) / 1000));
        failover_abandon(r, why);
        return;
    }
    if (r->failover != 1 || r->cut_phase != 1)
        return;
    uint64_t sig = r->pushes_recorded_total;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        sig = sig * 31 + omv_groups_clock(r->groups, g);
    int64_t now = omv_time_ms();
    if (sig != r->failover_sig) {
        r->failover_sig = sig;
        r->failover_quiet_ms = now;
        return;
    }
    double slowest_ms;
    r->failover_settle_ms = failover_settle_ms(r, &slowest_ms);
    if (now - r->failover_quiet_ms < r->failover_settle_ms)
        return;
    for (uint32_t g = 0; g < r->max_groups; g++)
        r->cut_clocks[g] = g < omv_groups_count(r->groups) ? omv_groups_clock(r->groups, g) : 0;
    r->cut_phase = 2;
    r->fetch_left = r->n_servers;
    r->fetch_final = 0;
    r->fetch_params_only = 0;
    send_failover_op(r, OMV_SERVER_CUT);
}

/* A free server up this long may be taken as a backup: one that keeps dying is not, over and
 * over. */
#define BACKUP_SETTLE_MS 2000

int omv_run_take_backup(omv_run_t *r)
{
    if (!remote(r) || r->job.replicas < 2 || r->state != OMV_JOB_RUNNING || r->failover ||
        r->rewind || r->cut_phase != 0 || r->n_backups >= (uint32_t)r->job.servers)
        return 0;
    int settled = 0;
    for (uint32_t i = 0; i < r->env.servers->n; i++) {
        const omv_server_t *s = &r->env.servers->rec[i];
        settled |= s->used && s->alive && s->run_id == 0 &&
                   omv_time_ms() - s->joined_ms >= BACKUP_SETTLE_MS;
    }
    if (!settled || !start_failover(r))
        return 0;
    /* Every primary is there: an ordinary cut, made again with the newcomer as a backup. */
    r->failover = 3;
    r->env.servers->failovers_total--;
    omv_log_info("job '%s': a free shard server can keep a backup (%u of %lld ranges have one): "
                 "the run is cut and made again with it",
                 r->job.name, r->n_backups, (long long)r->job.servers);
    return 1;
}

/* The failover's cut is in: a checkpoint of it, and the run made again from it. */
static void failover_done(omv_run_t *r)
{
    r->ckpt_forced = 1;
    int parts_off = r->parts_off;
    int e = write_checkpoint(r);
    if (e < 0 && r->parts_off && !parts_off) {
        /* The holders wrote parts where the coordinator cannot see them: the same cut again,
         * its ranges sent here (the holders are frozen at it), not a step lost. */
        omv_log_warn("job '%s': failover: the cut again, its ranges sent to the coordinator",
                     r->job.name);
        r->cut_parts = 0;
        r->cut_phase = 2;
        r->cut_id = ++r->fetch_id;
        r->fetch_left = r->n_servers;
        r->fetch_final = 0;
        r->fetch_params_only = 0;
        send_failover_op(r, OMV_SERVER_CUT);
        return;
    }
    r->cut_phase = 0;
    if (e < 0 && r->failover == 3) {
        /* Not worth going back for a backup: the servers go on as they were. */
        omv_log_warn("job '%s': the cut for a new backup could not be written: going on "
                     "without it",
                     r->job.name);
        r->failover = 0;
        cut_resume(r);
        return;
    }
    uint64_t steps = 0;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        steps = r->cut_clocks[g] > steps ? r->cut_clocks[g] : steps;
    snprintf(r->rewind_reason, sizeof(r->rewind_reason), "%s at step %llu in %lld ms%s",
             r->failover == 3 ? "a new backup: the servers were cut"
                              : "failover: the ranges' holders were cut",
             (unsigned long long)steps, (long long)(omv_time_ms() - r->failover_ms),
             e < 0 ? "; its checkpoint failed: the last one is used" : "");
    omv_log_warn("job '%s': %s; it goes on from there over the servers left", r->job.name,
                 r->rewind_reason);
    r->rewind = 1;
    r->rewind_degraded = 1;
}

void omv_run_server_lost(omv_run_t *r, omv_server_t *s)
{
    if (!remote(r) || s->run_id != r->id || OMV_JOB_OVER(r->state) || r->rewind)
        return;
    char why[256];
    int n = snprintf(why, sizeof(why), "shard server %u (%s) is gone with shards [%u, %u)%s",
                     omv_servers_id(r->env.servers, s), s->endpoint, s->first, s->last,
                     s->backup ? " (their backup)" : "");
    if (r->job.replicas > 1) {
        /* A second loss during a failover: again, from what is still held. */
        omv_log_warn("job '%s': %s%s", r->job.name, why, r->failover ? " (during a failover)" : "");
        r->failover = 0;
        r->cut_phase = 0;
        if (start_failover(r))
            return;
    }
    /* No failover (or a holder of it is gone too): back to the last checkpoint. */
    r->failover = 0;
    r->cut_phase = 0;
    n += snprintf(why + n, sizeof(why) - (size_t)n, ", which have no replica left");
    if (!r->ckpt.enabled || !r->job.checkpoint_resume ||
        (r->job.checkpoint_every_s <= 0 && r->job.checkpoint_every_steps <= 0)) {
        snprintf(why + n, sizeof(why) - (size_t)n,
                 ", and the job writes no checkpoint to go back to");
        omv_run_finish(r, OMV_JOB_FAILED, why);
        return;
    }
    /* The daemon makes the run again from its last checkpoint (a cut of every server's range),
     * which waits for as many servers as before: the one that comes back, or another. */
    omv_log_warn("job '%s': %s; it goes back to its last checkpoint and waits for %lld servers",
                 r->job.name, why, (long long)(r->job.servers * r->job.replicas));
    omv_strlcpy(r->rewind_reason, why, sizeof(r->rewind_reason));
    r->rewind = 1;
}

/* ---- the model on shard servers: a shard server ---- */

void omv_run_adopt(omv_run_t *r, omv_member_t *m, uint32_t slot, uint32_t group)
{
    if (slot >= r->n_slots || group >= omv_groups_max(r->groups) ||
        omv_groups_join(r->groups, slot, group) < 0) {
        omv_log_error("the coordinator puts worker %u in slot %u, group %u, which does not fit",
                      omv_members_id(r->env.members, m), slot, group);
        m->state = OMV_MEMBER_DEAD;
        return;
    }
    m->slot = slot;
    assign_slices(r);
    omv_log_info("worker %u (%s): group %u, slot %u", omv_members_id(r->env.members, m), m->host,
                 group, slot);
}

void omv_run_part_start(omv_run_t *r)
{
    if (r->state == OMV_JOB_WAITING)
        start(r, " (the coordinator started it)");
}

/* An evaluation's gather: the range to the evaluator, as Params whose step is the evaluation's
 * id. */
static void send_to_evaluator(omv_run_t *r, uint64_t eval_id, uint32_t evaluator)
{
    omv_member_t *m = omv_members_get(r->env.members, evaluator);
    uint32_t off = r->shards->offsets[r->part.first];
    uint32_t count = r->shards->offsets[r->part.last] - off;
    if (m == NULL || m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_EVALUATOR) {
        omv_log_warn("evaluation %llu: worker %u is not the job's evaluator here",
                     (unsigned long long)eval_id, evaluator);
        return;
    }
    if (m->peer.len == 0) { /* told of it, not attached yet: sent when it does */
        r->eval_pending = eval_id;
        r->eval_pending_to = evaluator;
        return;
    }
    r->eval_pending = 0;
    if (omv_shardset_gather(r->shards, 0) < 0) {
        omv_log_error("cannot gather shards [%u, %u) for the evaluator", r->part.first,
                      r->part.last);
        return;
    }
    omv_msg_t msg = {.type = OMV_MSG_PARAMS};
    msg.u.params = (omv_params_t){.step = eval_id,
                                  .shard = r->part.first,
                                  .offset = off,
                                  .count = count,
                                  .batch = 1,
                                  .wire = OMV_WIRE_FP32};
    int e = omv_router_send(r->env.router, &m->peer, &msg, r->shards->gather_params + off);
    if (e < 0) {
        omv_log_warn("cannot send shards [%u, %u) to evaluator %u: %s", r->part.first, r->part.last,
                     evaluator, omv_strerror(e));
        return;
    }
    r->evals_sent_total++;
    r->bytes_out_total += (uint64_t)count * sizeof(float);
}

void omv_run_evaluator_attached(omv_run_t *r, omv_member_t *m)
{
    if (r->eval_pending && r->eval_pending_to == omv_members_id(r->env.members, m))
        send_to_evaluator(r, r->eval_pending, r->eval_pending_to);
}

/* This server's range to the coordinator (params_only: the parameters alone, else with the
 * optimizer's state), now. */
static void gather_range(omv_run_t *r, uint64_t gather_id, int final, int params_only)
{
    uint32_t off = r->shards->offsets[r->part.first];
    uint32_t count = r->shards->offsets[r->part.last] - off;
    uint32_t arrays = params_only ? 1 : omv_run_state_arrays(r);
    float *buf = malloc(((size_t)arrays * count + 1) * sizeof(float));
    if (buf == NULL || omv_shardset_gather(r->shards, 1) < 0) {
        omv_log_error("cannot gather shards [%u, %u) for the coordinator", r->part.first,
                      r->part.last);
        free(buf);
        return;
    }
    if (params_only)
        memcpy(buf, r->shards->gather_params + off, (size_t)count * sizeof(float));
    else
        omv_run_pack_range(r, buf, off, count);
    omv_msg_t msg;
    omv_server_msg_t *u = omv_run_gathered_msg(r, &msg, gather_id);
    u->final = final;
    u->params_only = params_only;
    u->count = arrays * count;
    u->adam_steps = r->shards->gather_steps[r->part.first];
    int e = omv_router_up_send(r->env.router, &msg, buf);
    if (e < 0)
        omv_log_error("cannot send shards [%u, %u) to the coordinator: %s", r->part.first,
                      r->part.last, omv_strerror(e));
    free(buf);
}

/* The final model, once the last step is in: as a part file where the coordinator asked for
 * one (the range to the coordinator if it cannot be written), else to the coordinator. */
static void gather_final(omv_run_t *r, uint64_t gather_id)
{
    r->part_gather_wanted = 0;
    if (r->final_part_dir[0] != '\0') {
        omv_strlcpy(r->cut_part_dir, r->final_part_dir, sizeof(r->cut_part_dir));
        r->cut_seq = r->final_part_seq;
        r->final_part_dir[0] = '\0';
        if (omv_run_parts_send(r, gather_id) == 0)
            return;
    }
    gather_range(r, gather_id, 1, 0);
}

/* What waited for the last step: the final evaluation's range, the final model. */
static void part_finished(omv_run_t *r)
{
    if (r->final_eval_to != 0) {
        uint32_t to = r->final_eval_to;
        r->final_eval_to = 0;
        send_to_evaluator(r, r->final_eval_id, to);
    }
    if (r->part_gather_wanted)
        gather_final(r, r->part_gather_id);
}

void omv_run_part_gather(omv_run_t *r, const omv_server_msg_t *u)
{
    if (u->worker_id != 0 && u->params_only) {
        if (!u->final || r->state >= OMV_JOB_FINISHING) {
            send_to_evaluator(r, u->gather_id, u->worker_id);
        } else {
            r->final_eval_id = u->gather_id; /* once the last step is in */
            r->final_eval_to = u->worker_id;
        }
        return;
    }
    if (!u->final) {
        gather_range(r, u->gather_id, 0, u->params_only);
        return;
    }
    omv_strlcpy(r->final_part_dir, u->part_dir, sizeof(r->final_part_dir));
    r->final_part_seq = u->part_seq;
    r->part_gather_wanted = 1;
    r->part_gather_id = u->gather_id;
    if (r->state >= OMV_JOB_FINISHING)
        gather_final(r, u->gather_id);
}

/* The steps each group has begun here: its clock, or one more when a member was sent some of
 * the next step. */
static uint64_t begun(const omv_run_t *r, uint32_t g)
{
    uint64_t b = omv_groups_clock(r->groups, g);
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        const omv_member_t *m = &r->env.members->records[i];
        if (m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER ||
            omv_groups_of(r->groups, m->slot) != (int)g)
            continue;
        if (m->served && m->served_step + 1 > b)
            b = m->served_step + 1;
        if (m->parked && m->sent_n > 0 && m->parked_step + 1 > b)
            b = m->parked_step + 1;
    }
    return b;
}

void omv_run_part_freeze(omv_run_t *r, uint64_t id)
{
    r->frozen = 1;
    r->cut_set = r->cut_sent = 0;
    r->freeze_id = id;
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = OMV_SERVER_FROZEN;
    u->server_id = r->part.server_id;
    u->gather_id = id;
    u->n_groups = omv_groups_count(r->groups);
    for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
        u->clocks[g] = r->cut_clocks[g] = begun(r, g);
    int e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot answer the coordinator's freeze: %s", omv_strerror(e));
}

void omv_run_part_cut(omv_run_t *r, const omv_server_msg_t *cut)
{
    if (!r->frozen || cut->gather_id != r->freeze_id)
        return;
    r->cut_no_ranges = cut->no_ranges;
    omv_strlcpy(r->cut_part_dir, cut->no_ranges ? "" : cut->part_dir, sizeof(r->cut_part_dir));
    r->cut_seq = cut->part_seq;
    for (uint32_t g = 0; g < cut->n_groups && g < r->max_groups; g++)
        r->cut_clocks[g] = cut->clocks[g];
    r->cut_set = 1;
    serve_parked(r); /* the steps up to the cut's may begin */
    part_cut_check(r);
}

void omv_run_part_failover_cut(omv_run_t *r, const omv_server_msg_t *cut)
{
    r->frozen = 1;
    r->failover_cut = 1;
    r->freeze_id = cut->gather_id;
    r->cut_set = 1;
    r->cut_sent = 0;
    r->cut_no_ranges = 0;
    omv_strlcpy(r->cut_part_dir, cut->part_dir, sizeof(r->cut_part_dir));
    r->cut_seq = cut->part_seq;
    for (uint32_t g = 0; g < r->max_groups; g++)
        r->cut_clocks[g] = g < cut->n_groups ? cut->clocks[g] : 0;
    omv_log_warn("failover: cutting shards [%u, %u) at the steps every member reported%s",
                 r->part.first, r->part.last,
                 r->part.backup ? " (this backup holds them now)" : "");
    part_cut_check(r);
}

int omv_run_part_caught_up(const omv_run_t *r, const uint64_t *clocks, uint32_t n)
{
    for (uint32_t g = 0; r->state < OMV_JOB_FINISHING && g < n && g < omv_groups_count(r->groups);
         g++)
        if (omv_groups_live(r->groups, g) > 0 && omv_groups_clock(r->groups, g) < clocks[g])
            return 0;
    return omv_groups_settled(r->groups);
}

/* A cut's steps are all applied here (or the job's end came first): the range goes to the
 * coordinator, once. */
static void part_cut_check(omv_run_t *r)
{
    if (!r->frozen || !r->cut_set || r->cut_sent ||
        !omv_run_part_caught_up(r, r->cut_clocks, omv_groups_count(r->groups)))
        return;
    r->cut_sent = 1;
    if (!r->cut_no_ranges) {
        /* A checkpoint's: the range as a part file, or (when it cannot be) to the coordinator. */
        if (r->cut_part_dir[0] == '\0' || omv_run_parts_send(r, r->freeze_id) < 0)
            gather_range(r, r->freeze_id, 0, 0);
        return;
    }
    omv_msg_t msg;
    omv_run_gathered_msg(r, &msg, r->freeze_id);
    int e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot tell the coordinator the cut's steps are in: %s", omv_strerror(e));
}

/* The coordinator's change at the cut, as try_reconfig makes it on one daemon. */
static void part_reconfig(omv_run_t *r, const omv_server_msg_t *u, const int32_t *group_of,
                          size_t words)
{
    if ((u->reconfig & OMV_SERVER_RECONFIG_REGROUP) &&
        (words != r->n_slots || u->n_groups == 0 || u->n_groups > omv_groups_max(r->groups))) {
        omv_log_error("the coordinator regroups into %u groups over %zu slots (we have %u "
                      "slots): the part is dropped",
                      u->n_groups, words, r->n_slots);
        r->part_broken = 1; /* nothing of the change is made */
        return;
    }
    if (u->reconfig & OMV_SERVER_RECONFIG_RESTORE)
        probe_base(r, &(omv_reconfig_t){.restore = 1});
    if (u->reconfig & OMV_SERVER_RECONFIG_SNAPSHOT)
        probe_base(r, &(omv_reconfig_t){.snapshot = 1});
    if (u->reconfig & OMV_SERVER_RECONFIG_SGD) {
        r->sgd.learning_rate = u->learning_rate;
        r->sgd.momentum = u->momentum;
        r->sgd.weight_decay = u->weight_decay;
        omv_log_info("momentum %g, learning rate %g (the coordinator's)", r->sgd.momentum,
                     r->sgd.learning_rate);
    }
    if (!(u->reconfig & OMV_SERVER_RECONFIG_REGROUP))
        return;
    uint64_t clock = u->n_groups ? u->clocks[0] : 0;
    if (omv_groups_regroup(r->groups, u->n_groups, group_of, clock) < 0) {
        omv_log_error("the coordinator's regroup into %u groups does not fit: the part is "
                      "dropped",
                      u->n_groups);
        r->part_broken = 1;
        return;
    }
    r->regroups_total++;
    omv_log_info("regrouped: %u groups, from step %llu (the coordinator's)", u->n_groups,
                 (unsigned long long)clock);
    /* Everyone's next step is the common clock; a pull still on its way is taken for it. */
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER) {
            m->parked_step = clock;
            m->regroup_step = m->parked ? 0 : clock;
        }
    }
}

void omv_run_part_resume(omv_run_t *r, const omv_server_msg_t *u, const void *payload, size_t bytes)
{
    if (u->reconfig)
        part_reconfig(r, u, payload, bytes / sizeof(int32_t));
    r->part_probing = (u->reconfig & OMV_SERVER_RECONFIG_PROBING) != 0;
    if (!u->final) { /* the cut's counters; training's end abandons its cut, and has none */
        r->images_total = u->images;
        r->steps_total = u->steps;
    }
    r->frozen = 0;
    if (r->state == OMV_JOB_RUNNING)
        serve_parked(r);
}
