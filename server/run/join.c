/* Joining and leaving: who may join, the group and slice a trainer gets, its Welcome, and what
 * a member's going takes with it. */
#define OMV_LOG_TAG "daemon"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "run_priv.h"
#include "util.h"

/* Divides the training set among the live trainers in order of id. While the job waits for its
 * workers the plan is for all of them, so that nobody's slice changes when the last one comes. */
void omv_run_assign_slices(omv_run_t *r)
{
    uint32_t live = (uint32_t)omv_run_live_trainers(r);
    uint32_t among = r->state == OMV_JOB_WAITING && live < (uint32_t)r->job.workers
                         ? (uint32_t)r->job.workers
                         : live;
    omv_members_assign_slices(r->env.members, r->plan.train_count, among);
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

void omv_run_member_gone(omv_run_t *r, omv_member_t *m, omv_member_state_t why)
{
    omv_member_state_t was = m->state;
    m->state = why;
    m->parked = 0;
    if (m->shm_on && omv_shardset_sync(r->shards) == 0)
        omv_members_shm_release(m); /* else kept: a shard may still write into it */
    if (m->view_token && !omv_run_remote(r) && r->shards) {
        omv_shard_cmd_t forget = {.type = OMV_SHARD_CMD_FORGET,
                                  .worker_id = omv_members_id(r->env.members, m)};
        omv_shardset_send_all(r->shards, &forget, NULL);
        m->view_token = 0;
    }
    if (was != OMV_MEMBER_ALIVE)
        return; /* idle: in no job */
    if (m->role == OMV_ROLE_TRAINER) {
        omv_groups_leave(r->groups, m->slot);
        omv_run_assign_slices(r);
        omv_run_tuner_membership(r);
    } else if (r->eval.evaluator == omv_members_id(r->env.members, m)) {
        omv_eval_lost(&r->eval);
    } else {
        return;
    }
    if (r->role && r->role->member_gone)
        r->role->member_gone(r, m, why);
}

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

void omv_run_fill_jobspec(const omv_run_t *r, omv_jobspec_t *j)
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

void omv_run_join_trainer(omv_run_t *r, omv_member_t *m, int rejoin, const char *who,
                          omv_welcome_t *w)
{
    uint32_t group = pick_group(r);
    m->slot = (uint32_t)free_slot(r);
    int next = omv_groups_join(r->groups, m->slot, group);
    omv_run_assign_slices(r);
    omv_run_tuner_membership(r);
    w->group = group;
    w->start_step = omv_groups_clock(r->groups, group) + (next > 0 ? 1 : 0);
    w->job.slice_begin = m->slice_begin;
    w->job.slice_count = m->slice_count;
    w->job.steps_per_epoch = r->plan.worker_batch ? m->slice_count / r->plan.worker_batch : 0;
    if (r->role && r->role->welcome)
        r->role->welcome(r, m, w);
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
    if (r->times.first_hello_s == 0)
        r->times.first_hello_s = omv_time_s();
    omv_run_fill_jobspec(r, &w->job);
    /* On shard servers, a trainer joins a running job at the next cut: every server must take
     * it at the same step. */
    if (m->role == OMV_ROLE_TRAINER && r->role && r->role->join && r->role->join(r, m, rejoin, who))
        return 1;
    if (m->role == OMV_ROLE_TRAINER) {
        omv_run_join_trainer(r, m, rejoin, who, w);
    } else {
        r->eval.evaluator = omv_members_id(r->env.members, m);
        m->attach_token = 0;
        if (r->role && r->role->welcome)
            r->role->welcome(r, m, w); /* it reads the ranges from the servers */
        omv_log_info("evaluator %u (%s) registered%s", r->eval.evaluator, who,
                     omv_run_remote(r) ? ": the shard servers send it the model to evaluate" : "");
    }
    return 0;
}
