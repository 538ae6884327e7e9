/* Pulls: which member's step is served when (the groups, the staleness bound, a change or a cut
 * waiting), each member's share of its group's batch, and the shards sent to it. */
#define OMV_LOG_TAG "daemon"
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "run_priv.h"
#include "util.h"

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
    r->sums.planned[group] = step + 1;
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
        if (r->sums.planned[group] != step + 1)
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
float omv_run_push_weight(const omv_run_t *r, const omv_member_t *m, uint32_t group)
{
    uint64_t live = omv_groups_live(r->groups, group);
    uint64_t share = (uint64_t)m->batch * live, b = (uint64_t)r->job.batch_size;
    return m->batch == 0 || live == 0 || share == b ? 1.0f : (float)((double)share / (double)b);
}

/* Fixes what the member's step is made of when its first shard is sent: its batch, its
 * gradient's weight, and the staleness the read has (how far the slowest other live group is
 * behind it). */
void omv_run_begin_serve(omv_run_t *r, omv_member_t *m, uint32_t group, uint64_t step)
{
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++) {
        uint64_t c = omv_groups_clock(r->groups, g);
        if (g != group && omv_groups_live(r->groups, g) > 0 && c < step &&
            step - c > r->stats.staleness_max_observed)
            r->stats.staleness_max_observed = step - c;
    }
    m->served = 1;
    m->served_step = step;
    m->served_ms = omv_time_ms();
    /* With one group, a shard is written only once every member pushed it: a local member
     * can read the parameters where they are, in the model segment, for the whole step. */
    m->inplace = m->shm_on && m->shm_model && omv_groups_count(r->groups) == 1;
    m->batch = member_batch(r, m, group, step);
    m->weight = omv_run_push_weight(r, m, group);
}

/* Sends shard s of the member's parked step, once. The shard's executor answers with a
 * snapshot of its part, sent without a copy; commands to a shard run in order, so every update
 * sent to it so far is in the snapshot. Returns 1 when every shard has been sent: the pull is
 * answered. */
static int serve_shard(omv_run_t *r, omv_member_t *m, uint32_t group, uint32_t s)
{
    uint64_t bit = 1ull << (s % 64);
    if (m->sent[s / 64] & bit)
        return m->sent_n == r->hi - r->lo;
    if (m->sent_n == 0) {
        omv_run_begin_serve(r, m, group, m->parked_step);
        r->stats.serves_total++;
    }
    /* With wire int8 a worker that reads over a socket is sent changes to its view, and the
     * whole shard when that view begins. */
    int change = r->job.wire == OMV_WIRE_INT8 && !m->shm_on;
    uint32_t wire = m->shm_on ? OMV_WIRE_SHM
                    : change  ? (m->view_new ? OMV_WIRE_FP32 : OMV_WIRE_INT8)
                              : omv_wire_of_params(r->job.wire);
    r->stats.bytes_out_total += omv_wire_value_bytes(wire, r->shards->shards[s].count);
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
        r->stats.inplace_serves_total++;
        m->inplace_sent[s / 64] |= bit;
        m->inplace_writes[s] = r->shards->writes[s];
    }
    omv_shardset_send(r->shards, s, &cmd, &m->peer, NULL);
    m->sent[s / 64] |= bit;
    m->sent_n++;
    return m->sent_n == r->hi - r->lo;
}

/* Answers the member's parked pull with every shard not sent yet. */
static void send_params(omv_run_t *r, omv_member_t *m)
{
    uint32_t group = (uint32_t)omv_groups_of(r->groups, m->slot);
    for (uint32_t s = r->lo; s < r->hi; s++)
        serve_shard(r, m, group, s);
    m->parked = 0;
}

/* Shard s of group's current step was just applied: the members of the group that already
 * asked for the next step get that shard of it now, while the rest of the step is still on its
 * way in (pushes and pulls overlap, shard by shard, in both directions of every link). What
 * they read is what they would read after the whole step, bit for bit. Not while a change
 * waits for a step boundary, nor when the bound or a joining member says wait. */
void omv_run_serve_early(omv_run_t *r, uint32_t group, uint32_t s)
{
    /* Once the job has its images no step begins: the one that reached them was the last. A
     * backup serves nothing. */
    if (r->backup || r->state != OMV_JOB_RUNNING || r->reconfig.pending ||
        r->stats.images_total >= r->plan.target_images)
        return;
    uint64_t next = omv_groups_clock(r->groups, group) + 1;
    if (!omv_groups_may_read_next(r->groups, group, next) ||
        (r->freeze.on && next >= r->freeze.at[group]))
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
void omv_run_serve_parked(omv_run_t *r)
{
    if (omv_run_remote(r) || r->backup || r->stats.images_total >= r->plan.target_images)
        return; /* the job's end: no step begins */
    int holding = r->reconfig.pending && !omv_run_try_reconfig(r);
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state != OMV_MEMBER_ALIVE || !m->parked)
            continue;
        int g = omv_groups_of(r->groups, m->slot);
        if (holding && (g < 0 || !omv_reconfig_group_begun(r->groups, r->env.members, (uint32_t)g)))
            continue;
        if (r->freeze.on && g >= 0 && m->parked_step >= r->freeze.at[g])
            continue; /* a cut: no step begins past it */
        if (g >= 0 && omv_groups_may_begin(r->groups, (uint32_t)g, m->parked_step)) {
            send_params(r, m);
        }
    }
}

void omv_run_pull(omv_run_t *r, omv_member_t *m, const omv_pull_t *p)
{
    if (m->role != OMV_ROLE_TRAINER || omv_run_remote(r) || r->backup) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, m->host,
                         omv_run_remote(r) ? "the model is on the shard servers: pull from them"
                         : r->backup       ? "a backup serves no pulls: pull from the primary"
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
        for (uint32_t s = r->lo; s < r->hi && m->parked; s++)
            if (omv_groups_shard_applied(r->groups, (uint32_t)g, s - r->lo))
                omv_run_serve_early(r, (uint32_t)g, s);
}
