/* The coordinator's role in a job whose model is on shard servers ([cluster] servers = N): the
 * servers it takes and the ranges it gives them, the members it tells them of, the trainers'
 * step reports (the servers apply the steps), the cuts that checkpoints, joins and changes are
 * made at, and what the run does differently for all that (the role's hooks). */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_priv.h"
#include "log.h"
#include "parts.h"
#include "range.h"
#include "util.h"

/* Tells the job's shard servers that trainer m joined (state OMV_SERVER_MEMBER_ALIVE, with
 * its slot and group), left or died, or that m is the job's evaluator. */
static void tell_member(omv_run_t *r, const omv_member_t *m, uint32_t state)
{
    omv_coord_t *co = omv_coord(r);
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
    omv_servers_send_run(co->servers, r->env.router, r->id, &msg);
}

/* Sends op (START, END) to the job's shard servers. */
static void tell_servers(omv_run_t *r, omv_server_op_t op)
{
    omv_coord_t *co = omv_coord(r);
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    msg.u.server.op = op;
    omv_servers_send_run(co->servers, r->env.router, r->id, &msg);
}

/* The model is on shard servers: the Welcome names them, and they learn of the newcomer. */
static void offer_servers(omv_run_t *r, omv_member_t *m, omv_welcome_t *w)
{
    omv_coord_t *co = omv_coord(r);
    int trainer = m->role == OMV_ROLE_TRAINER;
    uint64_t token = omv_random_token(m);
    m->attach_token = token;
    w->attach_token = token;
    w->n_servers = co->n_servers;
    for (uint32_t i = 0; i < co->n_servers; i++) {
        const omv_server_t *s = &co->servers->rec[co->server_ids[i] - 1];
        omv_server_info_t *o = &w->servers[i];
        omv_strlcpy(o->endpoint, s->endpoint, sizeof(o->endpoint));
        omv_strlcpy(o->public_key, s->public_key, sizeof(o->public_key));
        o->first_shard = s->first;
        o->last_shard = s->last;
    }
    w->n_backups = 0;
    for (uint32_t i = 0; trainer && i < co->n_servers; i++) { /* an evaluator only reads */
        if (co->backup_ids[i] == 0)
            continue;
        const omv_server_t *s = &co->servers->rec[co->backup_ids[i] - 1];
        omv_server_info_t *o = &w->backups[w->n_backups++];
        omv_strlcpy(o->endpoint, s->endpoint, sizeof(o->endpoint));
        omv_strlcpy(o->public_key, s->public_key, sizeof(o->public_key));
        o->first_shard = s->first;
        o->last_shard = s->last;
    }
    tell_member(r, m, trainer ? OMV_SERVER_MEMBER_ALIVE : OMV_SERVER_MEMBER_EVALUATOR);
}

/* The cut is in: the trainers that waited join at its step, on every server alike. */
static void admit_joins(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    for (uint32_t i = 0; i < r->env.members->n && co->joins_pending > 0; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (!m->join_pending)
            continue;
        m->join_pending = 0;
        co->joins_pending--;
        if (m->state != OMV_MEMBER_ALIVE)
            continue; /* gone meanwhile */
        omv_msg_t w = {.type = OMV_MSG_WELCOME};
        w.u.welcome.protocol_version = OMV_PROTOCOL_VERSION;
        w.u.welcome.worker_id = i + 1;
        omv_run_fill_jobspec(r, &w.u.welcome.job);
        char who[96];
        snprintf(who, sizeof(who), "\"%s\" pid %u", m->host, m->pid);
        omv_run_join_trainer(r, m, m->join_rejoin, who, &w.u.welcome);
        int e = omv_router_send(r->env.router, &m->peer, &w, NULL);
        if (e < 0)
            omv_log_warn("cannot welcome worker %u: %s", i + 1, omv_strerror(e));
    }
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
    omv_run_count_step(r, m, group, &p);
    r->stats.pushes_recorded_total++;
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

void omv_coord_report(omv_run_t *r, omv_member_t *m, const omv_step_report_t *rep)
{
    omv_coord_t *co = omv_coord(r);
    char why[OMV_WIRE_REASON_MAX], who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", omv_members_id(r->env.members, m), m->host);
    if (!omv_run_remote(r) || m->role != OMV_ROLE_TRAINER) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, who,
                         "a step report, but the daemon holds the model: push to it");
        return;
    }
    if (r->state == OMV_JOB_FINISHING || r->state == OMV_JOB_DONE ||
        r->stats.images_total >= r->plan.target_images) {
        r->stats.late_total++; /* a step begun as the job reached its images: not applied */
        return;
    }
    int fg = omv_groups_of(r->groups, m->slot);
    if (co->failover.phase == OMV_FAILOVER_PRIMARY && omv_coord_cut_clocks_set(co) && fg >= 0 &&
        rep->step >= co->cut.clocks[fg]) {
        r->stats.late_total++; /* past the failover's cut: the holders keep it out too */
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

void omv_coord_gathered(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *g,
                        const float *payload, size_t bytes)
{
    if (!omv_run_remote(r))
        return;
    omv_coord_t *co = omv_coord(r);
    if (s->run_id != r->id || g->gather_id != co->gather.id || co->gather.left == 0)
        return; /* an older gather's answer */
    uint32_t arrays;
    size_t want = omv_coord_gather_want(r, s, g, &arrays);
    if (g->first_shard != s->first || g->last_shard != s->last || bytes != want ||
        (want > 0 && !g->params_only != !co->gather.params_only)) {
        omv_log_error("shard server %u sent shards [%u, %u) in %zu bytes; it holds [%u, %u) "
                      "(%zu bytes): ignored",
                      omv_servers_id(co->servers, s), g->first_shard, g->last_shard, bytes,
                      s->first, s->last, want);
        return;
    }
    for (uint32_t k = 0;
         co->failover.phase != OMV_FAILOVER_NONE && co->cut.phase == OMV_CUT_CUTTING &&
         k < g->n_groups && k < omv_groups_count(r->groups);
         k++)
        if (omv_groups_live(r->groups, k) > 0 && g->clocks[k] != co->cut.clocks[k]) {
            omv_log_error("failover: shard server %u holds group %u at step %llu, the cut is at "
                          "%llu: the ranges disagree",
                          omv_servers_id(co->servers, s), k, (unsigned long long)g->clocks[k],
                          (unsigned long long)co->cut.clocks[k]);
            omv_coord_failover_abandon(r, "the holders' ranges disagree at the failover's cut");
            return;
        }
    omv_coord_gather_take(r, s, g, payload, bytes);
}

/* The model on shard servers: a checkpoint, a join or a change (regroup, the optimizer's) is
 * made at a consistent cut. The servers stop beginning steps and say which they began; each
 * then finishes the most any began and (for a checkpoint) sends its range; once the reports of
 * those steps are in too, the daemon writes the checkpoint as one daemon would, takes the
 * newcomers, makes the change everywhere, and the servers go on. A checkpoint waits for the
 * optimizer's probe to end: the servers' shards then hold the model to keep. */
static int cut_checkpoint(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    int ckpt = r->ckpt.due && r->ckpt.enabled && !omv_tuner_probing(r->tuner);
    if ((!ckpt && co->joins_pending == 0 && !r->reconfig.pending &&
         co->failover.phase == OMV_FAILOVER_NONE) ||
        r->state != OMV_JOB_RUNNING)
        return 1;
    if (co->cut.phase == OMV_CUT_NONE && (!ckpt || omv_coord_gather_buffers(r) == 0)) {
        omv_coord_begin_cut(r, ckpt,
                            ckpt && co->failover.phase == OMV_FAILOVER_NONE && omv_parts_wanted(r));
        omv_coord_send_cut_op(r, OMV_SERVER_FREEZE);
        return 1;
    }
    if (co->cut.phase != OMV_CUT_IN || !omv_coord_cut_caught_up(r))
        return 1;
    if (co->failover.phase != OMV_FAILOVER_NONE) {
        omv_coord_failover_done(r);
        return 1;
    }
    if (co->cut.ranges && r->ckpt.due && r->ckpt.enabled)
        omv_run_write_checkpoint(r); /* from the cut's model (phase 3) */
    admit_joins(r);
    co->cut.phase = OMV_CUT_NONE;
    omv_coord_cut_resume(r);
    int here = co->cut.ranges && !omv_parts_remote(r);
    co->parts.on = 0;
    /* An evaluation that waited takes the cut's model when it is here; otherwise (the model in
     * the servers' parts, or a cut without ranges) it gathers it now. */
    co->gather.fresh = here;
    if (r->eval.wanted) {
        r->eval.wanted = 0;
        omv_run_request_eval(r);
    }
    return 1;
}

int omv_coord_wants_servers(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    return omv_run_remote(r) &&
           (co->n_servers < (uint32_t)r->job.servers || co->n_backups < co->backups_wanted);
}

/* [cluster] replicas = 2: backup i holds server i's range, on another host where it can. */
static void assign_backups(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t ids[OMV_WIRE_MAX_SERVERS], n = co->n_backups;
    memcpy(ids, co->backup_ids, sizeof(ids));
    memset(co->backup_ids, 0, sizeof(co->backup_ids));
    for (uint32_t i = 0; i < n; i++) {
        const omv_server_t *p = &co->servers->rec[co->server_ids[i] - 1];
        uint32_t pick = n;
        for (uint32_t k = 0; k < n && pick == n; k++)
            if (ids[k] && strcmp(co->servers->rec[ids[k] - 1].host, p->host) != 0)
                pick = k;
        for (uint32_t k = 0; k < n && pick == n; k++)
            if (ids[k])
                pick = k;
        omv_server_t *b = &co->servers->rec[ids[pick] - 1];
        if (strcmp(b->host, p->host) == 0)
            omv_log_warn("job '%s': the backup of shards [%u, %u) is on the primary's host %s",
                         r->job.name, p->first, p->last, p->host);
        b->first = p->first;
        b->last = p->last;
        b->backup = 1;
        co->backup_ids[i] = ids[pick];
        ids[pick] = 0;
    }
}

/* Spreads the shards over the servers in order, each about the same bytes (at least a shard
 * each). */
static void assign_ranges(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t ends[OMV_WIRE_MAX_SERVERS], at = 0;
    omv_model_shard_ranges(r->shards->offsets, r->shards->n_shards, co->n_servers, ends);
    for (uint32_t i = 0; i < co->n_servers; i++) {
        omv_server_t *s = &co->servers->rec[co->server_ids[i] - 1];
        s->first = at;
        s->last = at = ends[i];
    }
}

int omv_coord_add_server(omv_run_t *r, omv_server_t *s)
{
    omv_coord_t *co = omv_coord(r);
    if (!omv_coord_wants_servers(r) || s->run_id != 0)
        return 0;
    s->run_id = r->id;
    s->backup = 0;
    uint32_t id = omv_servers_id(co->servers, s);
    if (co->n_servers < (uint32_t)r->job.servers)
        co->server_ids[co->n_servers++] = id;
    else
        co->backup_ids[co->n_backups++] = id;
    omv_log_info("job '%s': shard server %u (%s at %s) taken, %u of %lld%s", r->job.name, id,
                 s->host, s->endpoint, co->n_servers + co->n_backups,
                 (long long)r->job.servers + co->backups_wanted,
                 co->n_servers + co->n_backups > (uint32_t)r->job.servers ? " (a backup)" : "");
    if (omv_coord_wants_servers(r))
        return 0;
    assign_ranges(r);
    assign_backups(r);
    for (uint32_t i = 0; i < co->n_servers + co->n_backups; i++) {
        uint32_t sid = i < co->n_servers ? co->server_ids[i] : co->backup_ids[i - co->n_servers];
        omv_server_t *o = &co->servers->rec[sid - 1];
        omv_log_info("shard server %u (%s): shards [%u, %u), parameters [%u, %u)%s", sid,
                     o->endpoint, o->first, o->last, r->shards->offsets[o->first],
                     r->shards->offsets[o->last], o->backup ? ", as their backup" : "");
        if (omv_range_assign(r, o) < 0) {
            omv_run_finish(r, OMV_JOB_FAILED, "cannot send the job to a shard server");
            return 0;
        }
    }
    return 1;
}

/* ---- the role's hooks ---- */

static int coord_init(omv_run_t *r, const void *arg)
{
    const omv_coord_arg_t *a = arg;
    omv_coord_t *co = calloc(1, sizeof(*co));
    if (co == NULL)
        return -ENOMEM;
    co->servers = a->servers;
    co->degraded = a->degraded;
    r->role_state = co;
    return 0;
}

static int coord_ready(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    co->cut.clocks = calloc(r->max_groups, sizeof(uint64_t));
    if (co->cut.clocks == NULL)
        return -ENOMEM;
    if (r->job.replicas > 1) {
        /* After a failover: the backups the servers left can give. */
        uint32_t n = (uint32_t)r->job.servers, free = omv_servers_free(co->servers);
        co->backups_wanted = !co->degraded ? n : free > n ? (free - n < n ? free - n : n) : 0;
    }
    return 0;
}

static void coord_fini(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (co == NULL)
        return;
    if (!OMV_JOB_OVER(r->state))
        tell_servers(r, OMV_SERVER_END);
    omv_servers_release(co->servers, r->id);
    free(co->gather.params);
    free(co->gather.velocity);
    free(co->gather.second);
    free(co->cut.clocks);
    free(co);
    r->role_state = NULL;
}

/* A trainer joins a running job at the next cut: every server must take it at the same step. */
static int coord_join(omv_run_t *r, omv_member_t *m, int rejoin, const char *who)
{
    if (r->state != OMV_JOB_RUNNING)
        return 0;
    m->join_pending = 1;
    m->join_rejoin = rejoin;
    m->slot = OMV_MEMBER_NO_SLOT;
    omv_coord(r)->joins_pending++;
    omv_log_info("worker %u (%s) joins the job at the next step boundary of its servers",
                 omv_members_id(r->env.members, m), who);
    omv_run_checkpoint_if_due(r);
    return 1;
}

static void coord_member_gone(omv_run_t *r, omv_member_t *m, omv_member_state_t why)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t state = why == OMV_MEMBER_LEFT ? OMV_SERVER_MEMBER_LEFT : OMV_SERVER_MEMBER_DEAD;
    if (m->role != OMV_ROLE_TRAINER) {
        if (m->attach_token)
            tell_member(r, m, state);
        return;
    }
    if (m->join_pending) {
        m->join_pending = 0;
        co->joins_pending--;
        return; /* never in a group */
    }
    free(m->early);
    m->early = NULL;
    m->n_early = 0;
    tell_member(r, m, state);
    record_early(r); /* its group may have moved on without it */
}

static void coord_started(omv_run_t *r)
{
    tell_servers(r, OMV_SERVER_START);
}

static int coord_finishing(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (co->cut.phase != OMV_CUT_NONE) {
        /* The final model comes by a final gather; the servers stop holding steps back. */
        omv_coord_send_cut_op(r, OMV_SERVER_RESUME);
        omv_parts_abandon(r);
        co->cut.phase = OMV_CUT_NONE;
    }
    co->gather.fresh = 0; /* what came before is not the final model */
    return 0;
}

static int coord_ended(omv_run_t *r)
{
    tell_servers(r, OMV_SERVER_END);
    omv_servers_release(omv_coord(r)->servers, r->id);
    return 0;
}

/* The final model is where the job's end needs it: checkpoints off, or in. */
static int coord_final_model(omv_run_t *r, int fetch)
{
    if (!r->ckpt.enabled || omv_coord(r)->gather.fetched_final)
        return 1;
    if (fetch)
        omv_coord_fetch(r, 1);
    return 0;
}

static int coord_evaluate(omv_run_t *r, omv_member_t *m, int final)
{
    omv_coord_t *co = omv_coord(r);
    omv_eval_t *ev = &r->eval;
    if (!omv_coord_model_here(r) && omv_coord_evals_direct(r)) {
        /* The servers send the evaluator their ranges themselves (the final one's once their
         * last step is in): the coordinator sees no parameters. During a cut the model comes
         * here anyway (the gather asks again). */
        if (co->cut.phase != OMV_CUT_NONE) {
            ev->wanted = 1;
            return 1;
        }
        if (omv_eval_send(ev, r->env.router, &m->peer, NULL, 0, omv_run_epoch(r),
                          omv_run_train_seconds(r), final)) {
            omv_msg_t msg = {.type = OMV_MSG_SERVER};
            msg.u.server.op = OMV_SERVER_GATHER;
            msg.u.server.gather_id = ev->id;
            msg.u.server.final = final;
            msg.u.server.params_only = 1;
            msg.u.server.worker_id = ev->evaluator;
            omv_servers_send_run(co->servers, r->env.router, r->id, &msg);
            r->stats.direct_evals_total++;
        }
        return 1;
    }
    if (!omv_coord_model_here(r)) {
        ev->wanted = 1; /* once the servers' ranges are in */
        omv_coord_fetch(r, final);
        return 1;
    }
    co->gather.fresh = 0;
    return 0; /* the model is here: the run sends it */
}

static int coord_save(omv_run_t *r, omv_run_ckpt_view_t *v, int *ret)
{
    omv_coord_t *co = omv_coord(r);
    if (!co->gather.fetched_final && co->cut.phase != OMV_CUT_IN) {
        r->ckpt.due = 0;
        r->ckpt.failed_total++;
        omv_log_warn("no checkpoint: the model is on shard servers and no cut of it is in");
        *ret = -ENOTSUP;
        return 1;
    }
    if ((co->cut.phase == OMV_CUT_IN || co->gather.final_in_parts) && omv_parts_remote(r)) {
        *ret = omv_parts_write(r, v); /* the servers wrote the model: a manifest of it */
        return 1;
    }
    return 0; /* the cut's model is here: the run writes it */
}

static void coord_cron(omv_run_t *r)
{
    omv_coord_failover_settle(r);
    omv_coord_take_backup(r); /* a free server that came while a cut was under way */
}

static void coord_view(const omv_run_t *r, omv_run_view_t *v)
{
    v->holding = omv_coord(r)->failover.phase != OMV_FAILOVER_NONE;
}

const omv_run_role_t omv_coord_role = {
    .kind = OMV_RUN_COORDINATOR,
    .init = coord_init,
    .ready = coord_ready,
    .fini = coord_fini,
    .join = coord_join,
    .welcome = offer_servers,
    .member_gone = coord_member_gone,
    .started = coord_started,
    .finishing = coord_finishing,
    .ended = coord_ended,
    .final_model = coord_final_model,
    .evaluate = coord_evaluate,
    .checkpoint_due = cut_checkpoint,
    .save = coord_save,
    .cron = coord_cron,
    .view = coord_view,
};
