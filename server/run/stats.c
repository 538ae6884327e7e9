/* Reading a run: its figures, the update rule in force, and the view that status, metrics,
 * commands and the schedule take of it. */
#define OMV_LOG_TAG "daemon"
#include <math.h>

#include "run_priv.h"
#include "util.h"

const char *const omv_run_state_names[] = {"waiting", "running", "finishing", "done",
                                           "failed",  "stopped", "idle"};

double omv_run_epoch(const omv_run_t *r)
{
    return r->plan.train_count ? (double)r->stats.images_total / (double)r->plan.train_count : 0.0;
}

double omv_run_train_seconds(const omv_run_t *r)
{
    if (r->times.start_s == 0)
        return r->times.train_s_before;
    double end = r->times.train_end_s > 0 ? r->times.train_end_s : omv_time_s();
    return r->times.train_s_before + (end - r->times.start_s);
}

double omv_run_wall_seconds(const omv_run_t *r)
{
    if (r->times.start_s == 0)
        return r->times.train_s_before;
    return r->times.train_s_before + (r->times.end_s > 0 ? r->times.end_s : omv_time_s()) -
           r->times.start_s;
}

double omv_run_images_per_second(const omv_run_t *r)
{
    double s = omv_run_train_seconds(r);
    return s > 0 ? (double)r->stats.images_total / s : 0.0;
}

int omv_run_live_trainers(const omv_run_t *r)
{
    return omv_members_live_trainers(r->env.members);
}

int64_t omv_run_worker_timeout_ms(const omv_run_t *r)
{
    return (int64_t)(r->job.worker_timeout_s * 1000);
}

double omv_run_result_accuracy(const omv_run_t *r)
{
    if (r->state == OMV_JOB_DONE && !r->final.eval)
        return NAN;
    return omv_eval_last_accuracy(&r->eval);
}

/* The update rule for the next update: the one in force, with the learning rate where the
 * job's schedule has it now. */
omv_sgd_t omv_run_current_rule(const omv_run_t *r)
{
    omv_sgd_t u = r->sgd;
    u.learning_rate = (float)(u.learning_rate *
                              omv_job_lr_factor(&r->job, omv_run_epoch(r), r->stats.steps_total));
    return u;
}

omv_timeline_now_t omv_run_timeline_now(const omv_run_t *r)
{
    return (omv_timeline_now_t){
        .train_s = omv_run_train_seconds(r),
        .epoch = omv_run_epoch(r),
        .steps_total = r->stats.steps_total,
        .images_total = r->stats.images_total,
        .images_seen = r->stats.images_total + omv_tuner_probe_images(r->tuner),
        .groups = omv_groups_count(r->groups),
        .momentum = r->sgd.momentum,
        .learning_rate = omv_run_current_rule(r).learning_rate,
        .probing = omv_tuner_probing(r->tuner),
    };
}

uint64_t omv_run_id(const omv_run_t *r)
{
    return r->id;
}

omv_job_state_t omv_run_state(const omv_run_t *r)
{
    return r->state;
}

const omv_job_t *omv_run_job(const omv_run_t *r)
{
    return &r->job;
}

omv_shardset_t *omv_run_shards(omv_run_t *r)
{
    return r->shards;
}

int omv_run_mark_recorded(omv_run_t *r)
{
    int was = r->recorded;
    r->recorded = 1;
    return was;
}

void omv_run_view(const omv_run_t *r, omv_run_view_t *ret)
{
    static const omv_run_t idle = {.state = OMV_JOB_IDLE};
    if (r == NULL)
        r = &idle;
    *ret = (omv_run_view_t){
        .id = r->id,
        .path = r->path,
        .text = r->text,
        .job = &r->job,
        .state = r->state,
        .fail_reason = r->fail_reason,
        .plan = &r->plan,
        .times = &r->times,
        .stats = &r->stats,
        .sums = &r->sums,
        .last_loss = r->line.last_loss,
        .regroup_pending = r->reconfig.pending ? r->reconfig.groups : 0,
        .groups = r->groups,
        .shards = r->shards,
        .eval = &r->eval,
        .ckpt = &r->ckpt,
        .tuner = r->tuner,
        .timeline = &r->timeline,
        .final = r->final,
        .stopping = r->stop.how,
        .exit_ready = r->stop.exit_ready,
        .rewind = &r->rewind,
        .epoch = omv_run_epoch(r),
        .train_seconds = omv_run_train_seconds(r),
        .wall_seconds = omv_run_wall_seconds(r),
        .images_per_second = omv_run_images_per_second(r),
        .result_accuracy = omv_run_result_accuracy(r),
    };
    if (r->role && r->role->view)
        r->role->view(r, ret);
}
