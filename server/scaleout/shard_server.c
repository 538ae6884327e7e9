/* A shard server's run of its range: the coordinator's members, start, evaluations and gathers
 * of the range, its side of a cut (freeze, cut, resume with the coordinator's change), and what
 * the run does differently for that (the role's hooks). A backup's held pushes are backup.c's. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "parts.h"
#include "range.h"
#include "shard_server_priv.h"
#include "util.h"

static void part_cut_check(omv_run_t *r);

void omv_shard_server_adopt(omv_run_t *r, omv_member_t *m, uint32_t slot, uint32_t group)
{
    if (slot >= r->n_slots || group >= omv_groups_max(r->groups) ||
        omv_groups_join(r->groups, slot, group) < 0) {
        omv_log_error("the coordinator puts worker %u in slot %u, group %u, which does not fit",
                      omv_members_id(r->env.members, m), slot, group);
        m->state = OMV_MEMBER_DEAD;
        return;
    }
    m->slot = slot;
    omv_run_assign_slices(r);
    omv_log_info("worker %u (%s): group %u, slot %u", omv_members_id(r->env.members, m), m->host,
                 group, slot);
}

void omv_shard_server_start(omv_run_t *r)
{
    if (r->state == OMV_JOB_WAITING)
        omv_run_start(r, " (the coordinator started it)");
}

/* An evaluation's gather: the range to the evaluator, as Params whose step is the evaluation's
 * id. */
static void send_to_evaluator(omv_run_t *r, uint64_t eval_id, uint32_t evaluator)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    omv_member_t *m = omv_members_get(r->env.members, evaluator);
    uint32_t off = r->shards->offsets[r->lo];
    uint32_t count = r->shards->offsets[r->hi] - off;
    if (m == NULL || m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_EVALUATOR) {
        omv_log_warn("evaluation %llu: worker %u is not the job's evaluator here",
                     (unsigned long long)eval_id, evaluator);
        return;
    }
    if (m->peer.len == 0) { /* told of it, not attached yet: sent when it does */
        ss->eval_pending.id = eval_id;
        ss->eval_pending.to = evaluator;
        return;
    }
    ss->eval_pending.id = 0;
    if (omv_shardset_gather(r->shards, 0) < 0) {
        omv_log_error("cannot gather shards [%u, %u) for the evaluator", r->lo, r->hi);
        return;
    }
    omv_msg_t msg = {.type = OMV_MSG_PARAMS};
    msg.u.params = (omv_params_t){.step = eval_id,
                                  .shard = r->lo,
                                  .offset = off,
                                  .count = count,
                                  .batch = 1,
                                  .wire = OMV_WIRE_FP32};
    int e = omv_router_send(r->env.router, &m->peer, &msg, r->shards->gather_params + off);
    if (e < 0) {
        omv_log_warn("cannot send shards [%u, %u) to evaluator %u: %s", r->lo, r->hi, evaluator,
                     omv_strerror(e));
        return;
    }
    r->stats.evals_sent_total++;
    r->stats.bytes_out_total += (uint64_t)count * sizeof(float);
}

void omv_shard_server_evaluator_attached(omv_run_t *r, omv_member_t *m)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if (ss->eval_pending.id && ss->eval_pending.to == omv_members_id(r->env.members, m))
        send_to_evaluator(r, ss->eval_pending.id, ss->eval_pending.to);
}

/* This server's range to the coordinator (params_only: the parameters alone, else with the
 * optimizer's state), now. */
static void gather_range(omv_run_t *r, uint64_t gather_id, int final, int params_only)
{
    uint32_t off = r->shards->offsets[r->lo];
    uint32_t count = r->shards->offsets[r->hi] - off;
    uint32_t arrays = params_only ? 1 : omv_range_arrays(r);
    float *buf = malloc(((size_t)arrays * count + 1) * sizeof(float));
    if (buf == NULL || omv_shardset_gather(r->shards, 1) < 0) {
        omv_log_error("cannot gather shards [%u, %u) for the coordinator", r->lo, r->hi);
        free(buf);
        return;
    }
    if (params_only)
        memcpy(buf, r->shards->gather_params + off, (size_t)count * sizeof(float));
    else
        omv_range_pack(r, buf, off, count);
    omv_msg_t msg;
    omv_server_msg_t *u = omv_range_gathered_msg(r, &msg, gather_id);
    u->final = final;
    u->params_only = params_only;
    u->count = arrays * count;
    u->adam_steps = r->shards->gather_steps[r->lo];
    int e = omv_router_up_send(r->env.router, &msg, buf);
    if (e < 0)
        omv_log_error("cannot send shards [%u, %u) to the coordinator: %s", r->lo, r->hi,
                      omv_strerror(e));
    free(buf);
}

/* The final model, once the last step is in: as a part file where the coordinator asked for
 * one (the range to the coordinator if it cannot be written), else to the coordinator. */
static void gather_final(omv_run_t *r, uint64_t gather_id)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    ss->final_gather.wanted = 0;
    if (ss->final_gather.dir[0] != '\0') {
        omv_strlcpy(ss->cut.dir, ss->final_gather.dir, sizeof(ss->cut.dir));
        ss->cut.seq = ss->final_gather.seq;
        ss->final_gather.dir[0] = '\0';
        if (omv_parts_send(r, gather_id) == 0)
            return;
    }
    gather_range(r, gather_id, 1, 0);
}

/* What waited for the last step: the final evaluation's range, the final model. */
static void part_finished(omv_run_t *r)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if (ss->final_eval.to != 0) {
        uint32_t to = ss->final_eval.to;
        ss->final_eval.to = 0;
        send_to_evaluator(r, ss->final_eval.id, to);
    }
    if (ss->final_gather.wanted)
        gather_final(r, ss->final_gather.id);
}

void omv_shard_server_gather(omv_run_t *r, const omv_server_msg_t *u)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if (u->worker_id != 0 && u->params_only) {
        if (!u->final || r->state >= OMV_JOB_FINISHING) {
            send_to_evaluator(r, u->gather_id, u->worker_id);
        } else {
            ss->final_eval.id = u->gather_id; /* once the last step is in */
            ss->final_eval.to = u->worker_id;
        }
        return;
    }
    if (!u->final) {
        gather_range(r, u->gather_id, 0, u->params_only);
        return;
    }
    omv_strlcpy(ss->final_gather.dir, u->part_dir, sizeof(ss->final_gather.dir));
    ss->final_gather.seq = u->part_seq;
    ss->final_gather.wanted = 1;
    ss->final_gather.id = u->gather_id;
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

void omv_shard_server_freeze(omv_run_t *r, uint64_t id)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    r->freeze.on = 1;
    ss->cut.set = ss->cut.sent = 0;
    ss->cut.id = id;
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = OMV_SERVER_FROZEN;
    u->server_id = ss->server_id;
    u->gather_id = id;
    u->n_groups = omv_groups_count(r->groups);
    for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
        u->clocks[g] = r->freeze.at[g] = begun(r, g);
    int e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot answer the coordinator's freeze: %s", omv_strerror(e));
}

void omv_shard_server_cut(omv_run_t *r, const omv_server_msg_t *cut)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if (!r->freeze.on || cut->gather_id != ss->cut.id)
        return;
    ss->cut.no_ranges = cut->no_ranges;
    omv_strlcpy(ss->cut.dir, cut->no_ranges ? "" : cut->part_dir, sizeof(ss->cut.dir));
    ss->cut.seq = cut->part_seq;
    for (uint32_t g = 0; g < cut->n_groups && g < r->max_groups; g++)
        r->freeze.at[g] = cut->clocks[g];
    ss->cut.set = 1;
    omv_run_serve_parked(r); /* the steps up to the cut's may begin */
    part_cut_check(r);
}

void omv_shard_server_failover_cut(omv_run_t *r, const omv_server_msg_t *cut)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    r->freeze.on = 1;
    r->freeze.drop_late = 1;
    ss->cut.id = cut->gather_id;
    ss->cut.set = 1;
    ss->cut.sent = 0;
    ss->cut.no_ranges = 0;
    omv_strlcpy(ss->cut.dir, cut->part_dir, sizeof(ss->cut.dir));
    ss->cut.seq = cut->part_seq;
    for (uint32_t g = 0; g < r->max_groups; g++)
        r->freeze.at[g] = g < cut->n_groups ? cut->clocks[g] : 0;
    omv_log_warn("failover: cutting shards [%u, %u) at the steps every member reported%s", r->lo,
                 r->hi, r->backup ? " (this backup holds them now)" : "");
    part_cut_check(r);
}

int omv_shard_server_caught_up(const omv_run_t *r, const uint64_t *clocks, uint32_t n)
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
    omv_shard_server_t *ss = omv_shard_server(r);
    if (!r->freeze.on || !ss->cut.set || ss->cut.sent ||
        !omv_shard_server_caught_up(r, r->freeze.at, omv_groups_count(r->groups)))
        return;
    ss->cut.sent = 1;
    if (!ss->cut.no_ranges) {
        /* A checkpoint's: the range as a part file, or (when it cannot be) to the coordinator. */
        if (ss->cut.dir[0] == '\0' || omv_parts_send(r, ss->cut.id) < 0)
            gather_range(r, ss->cut.id, 0, 0);
        return;
    }
    omv_msg_t msg;
    omv_range_gathered_msg(r, &msg, ss->cut.id);
    int e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot tell the coordinator the cut's steps are in: %s", omv_strerror(e));
}

/* The coordinator's change at the cut, as omv_run_try_reconfig makes it on one daemon. */
static void part_reconfig(omv_run_t *r, const omv_server_msg_t *u, const int32_t *group_of,
                          size_t words)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if ((u->reconfig & OMV_SERVER_RECONFIG_REGROUP) &&
        (words != r->n_slots || u->n_groups == 0 || u->n_groups > omv_groups_max(r->groups))) {
        omv_log_error("the coordinator regroups into %u groups over %zu slots (we have %u "
                      "slots): the part is dropped",
                      u->n_groups, words, r->n_slots);
        ss->broken = 1; /* nothing of the change is made */
        return;
    }
    if (u->reconfig & OMV_SERVER_RECONFIG_RESTORE)
        omv_run_probe_base(r, &(omv_reconfig_t){.restore = 1});
    if (u->reconfig & OMV_SERVER_RECONFIG_SNAPSHOT)
        omv_run_probe_base(r, &(omv_reconfig_t){.snapshot = 1});
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
        ss->broken = 1;
        return;
    }
    r->stats.regroups_total++;
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

void omv_shard_server_resume(omv_run_t *r, const omv_server_msg_t *u, const void *payload,
                             size_t bytes)
{
    if (u->reconfig)
        part_reconfig(r, u, payload, bytes / sizeof(int32_t));
    r->probing = (u->reconfig & OMV_SERVER_RECONFIG_PROBING) != 0;
    if (!u->final) { /* the cut's counters; training's end abandons its cut, and has none */
        r->stats.images_total = u->images;
        r->stats.steps_total = u->steps;
    }
    r->freeze.on = 0;
    if (r->state == OMV_JOB_RUNNING)
        omv_run_serve_parked(r);
}

/* ---- the role's hooks ---- */

static int server_init(omv_run_t *r, const void *arg)
{
    const omv_shard_server_arg_t *a = arg;
    omv_shard_server_t *ss = calloc(1, sizeof(*ss));
    if (ss == NULL)
        return -ENOMEM;
    ss->server_id = a->server_id;
    r->role_state = ss;
    r->lo = a->first;
    r->hi = a->last;
    r->plan.train_count = a->train_count;
    r->backup = a->backup;
    return 0;
}

static int server_ready(omv_run_t *r)
{
    omv_log_info("job %llu '%s' from the coordinator: shards [%u, %u) of %u on this server",
                 (unsigned long long)r->id, r->job.name, r->lo, r->hi, r->shards->n_shards);
    return 0;
}

static void server_fini(omv_run_t *r)
{
    if (r->role_state == NULL)
        return;
    omv_backup_fini(r);
    free(r->role_state);
    r->role_state = NULL;
}

static int server_push(omv_run_t *r, omv_member_t *m, const omv_push_t *p)
{
    return r->backup && omv_backup_hold(r, m, p);
}

static void server_progress(omv_run_t *r)
{
    if (omv_shard_server(r)->held.n > 0)
        omv_backup_release(r);
    part_cut_check(r);
}

static int server_finishing(omv_run_t *r)
{
    omv_log_info("training finished after %.1f s: %llu steps, %llu images in this range",
                 omv_run_train_seconds(r), (unsigned long long)r->stats.steps_total,
                 (unsigned long long)r->stats.images_total);
    part_finished(r);
    return 1; /* the coordinator evaluates */
}

static int server_ended(omv_run_t *r)
{
    return 1; /* the coordinator tells the workers */
}

static void server_view(const omv_run_t *r, omv_run_view_t *v)
{
    const omv_shard_server_t *ss = omv_shard_server(r);
    v->range = (omv_run_range_view_t){
        .first = r->lo,
        .last = r->hi,
        .backup = r->backup,
        .held_pushes = ss->held.n,
        .held_bytes = ss->held.bytes,
    };
}

int omv_shard_server_broken(const omv_run_t *r)
{
    return omv_shard_server(r)->broken;
}

const omv_run_role_t omv_shard_server_role = {
    .kind = OMV_RUN_SERVER,
    .init = server_init,
    .ready = server_ready,
    .fini = server_fini,
    .push = server_push,
    .progress = server_progress,
    .finishing = server_finishing,
    .ended = server_ended,
    .view = server_view,
};
