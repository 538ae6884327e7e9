/* The job's life: starting once its workers are there, the progress of a running job (the end
 * of training, evaluations and checkpoints as they come due, a requested stop), evaluation
 * results, the end, and the periodic work. */
#define OMV_LOG_TAG "daemon"
#include <math.h>
#include <stdio.h>

#include "log.h"
#include "run_priv.h"
#include "util.h"

static void finish_stop(omv_run_t *r);

/* Whether the final model is where the job's end needs it (a role may hold it elsewhere). */
static int final_model_in(omv_run_t *r)
{
    return r->role == NULL || r->role->final_model == NULL || r->role->final_model(r, 0);
}

void omv_run_start(omv_run_t *r, const char *why)
{
    r->state = OMV_JOB_RUNNING;
    r->times.start_s = r->line.last_s = omv_time_s();
    r->ckpt.last_s = r->times.start_s;
    r->ckpt.last_step = omv_groups_min_clock(r->groups);
    omv_run_assign_slices(r);
    omv_timeline_now_t now = omv_run_timeline_now(r);
    omv_timeline_start(&r->timeline, &now);
    if (r->tuner && omv_tuner_start(r->tuner, omv_run_live_trainers(r), omv_time_s()) < 0) {
        omv_run_finish(r, OMV_JOB_FAILED, "the optimizer cannot start (see the log)");
        return;
    }
    omv_run_tuner_poll(r);
    if (r->role && r->role->started)
        r->role->started(r);
    omv_log_info("job '%s' running%s: %d workers in %lld groups, staleness %s, until %llu "
                 "images (%.2f epochs) are done",
                 r->job.name, why, omv_run_live_trainers(r), (long long)r->job.groups,
                 r->job.staleness < 0 ? "none" : "bounded",
                 (unsigned long long)r->plan.target_images, (double)r->job.epochs);
}

void omv_run_joined(omv_run_t *r)
{
    if (r->state == OMV_JOB_WAITING && omv_run_live_trainers(r) >= (int)r->job.workers)
        omv_run_start(r, "");
}

/* Wire int8: how the parameters went to the workers over sockets, and the views kept for it. */
static void log_views(const omv_run_t *r)
{
    if (r->job.wire != OMV_WIRE_INT8 || omv_run_remote(r) || r->shards == NULL)
        return;
    omv_shard_views_t all = {0};
    for (uint32_t s = r->lo; s < r->hi; s++) {
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
                     train_s > 0 ? (double)r->stats.images_total / train_s : 0.0);
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
    r->times.end_s = omv_time_s();
    if (r->times.train_end_s == 0)
        r->times.train_end_s = r->times.end_s;
    omv_timeline_now_t now = omv_run_timeline_now(r);
    omv_timeline_end(&r->timeline, &now);
    if (r->role && r->role->ended && r->role->ended(r)) {
        log_end(r, state, why);
        return; /* its workers are told by the coordinator */
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
        r->final.ckpt = omv_run_write_checkpoint(r) < 0 ? -1 : 1;
}

/* Training reached its images: the final evaluation, then done. */
static void finishing(omv_run_t *r)
{
    r->state = OMV_JOB_FINISHING;
    r->times.train_end_s = omv_time_s();
    if (r->role && r->role->finishing && r->role->finishing(r))
        return; /* a shard server's: the coordinator evaluates */
    omv_log_info("training finished after %.1f s; final evaluation", omv_run_train_seconds(r));
    omv_run_request_eval(r);
}

/* The end of training, evaluations as they come due, and checkpoints by steps. */
static void progress_running(omv_run_t *r)
{
    if (omv_run_live_trainers(r) == 0) {
        omv_run_finish(r, OMV_JOB_FAILED, "every trainer is gone");
        return;
    }
    if (r->stats.images_total >= r->plan.target_images && omv_groups_settled(r->groups)) {
        finishing(r);
    } else if (r->job.eval_every_epochs > 0 && omv_run_epoch(r) >= r->eval.next_epoch &&
               !omv_tuner_probing(r->tuner)) {
        while (r->eval.next_epoch <= omv_run_epoch(r))
            r->eval.next_epoch += r->job.eval_every_epochs;
        omv_run_request_eval(r);
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
    if (r->role && r->role->progress)
        r->role->progress(r);
    if (r->state == OMV_JOB_RUNNING)
        progress_running(r);
    if (r->state == OMV_JOB_FINISHING && r->role && r->role->final_model &&
        !r->role->final_model(r, 1))
        return; /* asked for the final model, for its checkpoint */
    if (r->state == OMV_JOB_FINISHING && r->final.eval) {
        omv_run_finish(r, OMV_JOB_DONE, "job done"); /* its evaluation came before its model */
        return;
    }
    if (r->state == OMV_JOB_FINISHING && r->eval.evaluator == 0 && !omv_run_is_server(r)) {
        omv_log_warn("no evaluator is connected: the job ends without a final test accuracy");
        omv_run_finish(r, OMV_JOB_DONE, "job done");
        return;
    }
    omv_run_checkpoint_if_due(r);
    finish_stop(r);
    if (r->state == OMV_JOB_RUNNING)
        omv_run_serve_parked(r);
}

void omv_run_stop(omv_run_t *r, omv_run_stop_t how, double settle_s)
{
    /* The daemon's way out is never turned back into a job's stop. */
    if (r->stop.how == how || r->stop.how == OMV_RUN_STOP_EXIT)
        return;
    r->stop.how = how;
    r->stop.deadline_s = omv_time_s() + settle_s;
    if (r->state == OMV_JOB_RUNNING && r->ckpt.enabled)
        r->ckpt.due = 1;
    finish_stop(r);
}

/* A requested stop ends once its checkpoint is written, or when it is late without one. */
static void finish_stop(omv_run_t *r)
{
    if (r->stop.how == OMV_RUN_STOP_NONE || r->stop.exit_ready)
        return;
    if (r->stop.how == OMV_RUN_STOP_JOB && OMV_JOB_OVER(r->state))
        return;
    omv_run_checkpoint_if_due(r);
    int late = omv_time_s() > r->stop.deadline_s;
    if (r->ckpt.due && !late)
        return;
    if (r->stop.how == OMV_RUN_STOP_EXIT) {
        if (r->ckpt.due)
            omv_log_warn("a group is still half-way through a step; the last checkpoint stays %s",
                         r->ckpt.last_path[0] ? r->ckpt.last_path : "(none)");
        r->stop.exit_ready = 1;
        return;
    }
    if (r->ckpt.due)
        omv_log_warn("job '%s': no checkpoint of whole steps in time for stop; stopping without "
                     "one (the last is %s)",
                     r->job.name, r->ckpt.last_path[0] ? r->ckpt.last_path : "none");
    r->ckpt.due = 0;
    r->ckpt.forced = 0;
    omv_run_finish(r, OMV_JOB_STOPPED, "stopped by omnivorectl stop");
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
        r->final.eval = ev->final_sent;
        if (ev->final_sent && final_model_in(r))
            omv_run_finish(r, OMV_JOB_DONE, "job done");
        else if (!ev->final_sent)
            omv_run_request_eval(r); /* else done once the final model is in its parts */
    } else if (r->job.stop_at_accuracy > 0 && acc >= r->job.stop_at_accuracy &&
               r->state == OMV_JOB_RUNNING) {
        omv_log_info("test accuracy %.4f reached [job] stop_at_accuracy = %g after %.1f s", acc,
                     r->job.stop_at_accuracy, ev->wall_s);
        r->times.train_end_s = omv_time_s();
        r->final.eval = 1;
        omv_run_finish(r, OMV_JOB_DONE, "reached stop_at_accuracy");
    } else if (ev->wanted) {
        omv_run_request_eval(r);
    }
}

static void progress_line(omv_run_t *r, double t)
{
    double rate = (double)(r->stats.images_total - r->line.last_images) / (t - r->line.last_s);
    double loss = r->line.loss_n ? r->line.loss_sum / (double)r->line.loss_n : NAN;
    char acc[32] = "-";
    if (r->eval.n_history)
        snprintf(acc, sizeof(acc), "%.4f", omv_eval_last_accuracy(&r->eval));
    omv_log_info("epoch %.2f/%lld step %llu loss %.4f images/s %.0f test_accuracy %s workers %d",
                 omv_run_epoch(r), (long long)r->job.epochs,
                 (unsigned long long)omv_groups_min_clock(r->groups), loss, rate, acc,
                 omv_run_live_trainers(r));
    r->line.last_s = t;
    r->line.last_images = r->stats.images_total;
    r->line.loss_sum = 0;
    r->line.loss_n = 0;
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
    if (r->state == OMV_JOB_WAITING && r->times.first_hello_s > 0 && omv_run_live_trainers(r) > 0 &&
        t - r->times.first_hello_s >= r->job.start_timeout_s) {
        char why[128];
        snprintf(why, sizeof(why), " with %d of %lld workers after %.0f s",
                 omv_run_live_trainers(r), (long long)r->job.workers, r->job.start_timeout_s);
        omv_run_start(r, why);
    }
    check_evaluator(r, omv_time_ms());
    if (r->state != OMV_JOB_RUNNING)
        return;
    if (r->ckpt.enabled && r->job.checkpoint_every_s > 0 &&
        t - r->ckpt.last_s >= r->job.checkpoint_every_s)
        r->ckpt.due = 1;
    if (t - r->line.last_s >= r->job.progress_interval_s)
        progress_line(r, t);
    omv_timeline_now_t now = omv_run_timeline_now(r);
    omv_timeline_tick(&r->timeline, &now);
    omv_run_tuner_poll(r);
    if (r->role && r->role->cron)
        r->role->cron(r);
}
