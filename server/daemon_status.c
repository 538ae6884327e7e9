/* omnivored's control commands: status, workers, groups, metrics, summary, history (its reply
 * is in daemon_timeline.c), checkpoint, shutdown, help (jobs, submit and stop are in
 * daemon_jobs.c). */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_priv.h"
#include "kv.h"
#include "log.h"
#include "notify.h"
#include "util.h"


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

static double images_per_second(const omv_daemon_t *d)
{
    double s = omv_daemon_train_seconds(d);
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
    omv_kv_double(&kv, "uptime_seconds", omv_time_s() - d->created_s, 1);
    omv_kv_str(&kv, "endpoint", d->cfg.endpoint);
    omv_kv_str(&kv, "log_level", d->cfg.log_level);
    omv_kv_int(&kv, "reloads_total", (int64_t)d->reloads_total);
    omv_kv_int(&kv, "reloads_failed_total", (int64_t)d->reloads_failed_total);
    int idle = 0;
    for (uint32_t i = 0; i < d->n_members; i++)
        idle += d->members[i].state == MEMBER_IDLE;
    omv_kv_int(&kv, "jobs_queued", d->n_queue);
    omv_kv_int(&kv, "jobs_submitted_total", (int64_t)d->jobs_submitted_total);
    omv_kv_int(&kv, "workers_waiting", idle);
    omv_kv_section(&kv, "job");
    omv_kv_int(&kv, "id", (int64_t)d->job_id);
    omv_kv_str(&kv, "name", d->job.name);
    omv_kv_str(&kv, "file", d->job_path);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    if (d->opt) {
        omv_strbuf_t line;
        omv_strbuf_init(&line);
        omv_optimizer_describe(d->opt, &line);
        omv_kv_str(&kv, "optimizer", omv_strbuf_str(&line));
        omv_strbuf_fini(&line);
        omv_kv_int(&kv, "probe_images_total", (int64_t)d->probe_images_total);
        omv_kv_double(&kv, "probe_seconds_total", omv_daemon_opt_probe_seconds(d), 2);
    } else {
        omv_kv_str(&kv, "optimizer", "off");
    }
    if (d->state == JOB_FAILED || d->state == JOB_STOPPED)
        omv_kv_str(&kv, "reason", d->fail_reason);
    omv_kv_double(&kv, "epoch", omv_daemon_epoch(d), 3);
    omv_kv_int(&kv, "epochs", d->job.epochs);
    uint64_t step = omv_groups_min_clock(d->groups);
    omv_kv_int(&kv, "step", step == UINT64_MAX ? 0 : (int64_t)step);
    /* The clock a group will have at the end if every group keeps its full batch. */
    uint64_t per_group_step = (uint64_t)d->job.batch_size * (uint64_t)d->job.groups;
    omv_kv_int(&kv, "total_steps",
               per_group_step ? (int64_t)(d->target_images / per_group_step) : 0);
    omv_kv_int(&kv, "target_images", (int64_t)d->target_images);
    omv_kv_int(&kv, "images_total", (int64_t)d->images_total);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 1);
    omv_kv_double(&kv, "loss", d->last_loss, 4);
    omv_kv_double(&kv, "test_accuracy", d->n_history ? d->history[d->n_history - 1].accuracy : NAN, 4);
    omv_kv_double(&kv, "wall_seconds", omv_daemon_wall_seconds(d), 2);
    omv_kv_section(&kv, "cluster");
    omv_kv_int(&kv, "workers_expected", d->job.workers);
    omv_kv_int(&kv, "workers_registered", (int64_t)d->joins_total);
    omv_kv_int(&kv, "workers_alive", omv_daemon_live_trainers(d));
    omv_kv_int(&kv, "joins_total", (int64_t)d->joins_total);
    omv_kv_int(&kv, "rejoins_total", (int64_t)d->rejoins_total);
    omv_kv_int(&kv, "leaves_total", (int64_t)d->leaves_total);
    omv_kv_int(&kv, "deaths_total", (int64_t)d->deaths_total);
    omv_kv_int(&kv, "evaluator_alive", d->evaluator != 0);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_int(&kv, "groups_now", omv_groups_count(d->groups));
    omv_kv_int(&kv, "staleness", d->job.staleness);
    omv_kv_int(&kv, "shards", d->n_shards);
    omv_kv_int(&kv, "staleness_max_observed", (int64_t)d->staleness_max_observed);
    omv_kv_int(&kv, "late_gradients_total", (int64_t)d->late_total);
    omv_strbuf_t clocks;
    omv_strbuf_init(&clocks);
    omv_strbuf_append(&clocks, json ? "[" : "", json ? 1 : 0);
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++)
        omv_strbuf_printf(&clocks, "%s%llu", g ? (json ? "," : " ") : "",
                          (unsigned long long)omv_groups_clock(d->groups, g));
    omv_strbuf_append(&clocks, json ? "]" : "", json ? 1 : 0);
    omv_kv_raw(&kv, "group_clocks", omv_strbuf_str(&clocks));
    omv_strbuf_fini(&clocks);
    omv_kv_int(&kv, "regroups_total", (int64_t)d->regroups_total);
    omv_kv_int(&kv, "regroup_pending", d->reconfig.pending ? d->reconfig.groups : 0);
    /* Exactly once, checked: each group step applies each shard once, and each recorded
     * gradient is summed once (or refused as not finite). */
    omv_kv_section(&kv, "shards");
    omv_kv_int(&kv, "steps_total", (int64_t)d->steps_total);
    omv_kv_int(&kv, "pushes_recorded_total", (int64_t)d->pushes_recorded_total);
    uint64_t summed_all = 0;
    for (uint32_t s = 0; s < d->n_shards && d->threads; s++) {
        uint64_t applies = 0, summed = 0, snaps = 0, serves = 0;
        if (d->threads[s]) {
            omv_shard_thread_counts(d->threads[s], &applies, &summed);
            omv_shard_thread_stats(d->threads[s], &snaps, &serves);
        }
        summed_all += summed;
        char key[64];
        snprintf(key, sizeof(key), "shard_%u_applied_total", s);
        omv_kv_int(&kv, key, (int64_t)applies);
        snprintf(key, sizeof(key), "shard_%u_summed_total", s);
        omv_kv_int(&kv, key, (int64_t)summed);
        snprintf(key, sizeof(key), "shard_%u_snapshots_total", s);
        omv_kv_int(&kv, key, (int64_t)snaps);
        snprintf(key, sizeof(key), "shard_%u_pulls_served_total", s);
        omv_kv_int(&kv, key, (int64_t)serves);
        snprintf(key, sizeof(key), "shard_%u_threaded", s);
        omv_kv_int(&kv, key, d->threads[s] ? omv_shard_thread_threaded(d->threads[s]) : 0);
    }
    omv_kv_int(&kv, "summed_total", (int64_t)summed_all);
    omv_kv_section(&kv, "checkpoint");
    omv_kv_str(&kv, "dir", d->ckpt_enabled ? d->ckpt_dir : "(off)");
    omv_kv_str(&kv, "last_path", d->ckpt_last_path);
    omv_kv_int(&kv, "written_total", (int64_t)d->ckpt_written_total);
    omv_kv_int(&kv, "failed_total", (int64_t)d->ckpt_failed_total);
    omv_kv_double(&kv, "last_write_ms", d->ckpt_last_ms, 1);
    omv_kv_str(&kv, "resumed_from", d->ckpt_resumed_from);
    omv_kv_double(&kv, "resumed_epoch", d->ckpt_resumed_from[0] ? d->ckpt_resumed_epoch : NAN, 3);
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
        if (!m->used || m->state == MEMBER_DONE) /* records of finished jobs */
            continue;
        char name[32];
        snprintf(name, sizeof(name), "worker %u", i + 1);
        omv_kv_section(&kv, name);
        omv_kv_str(&kv, "role", m->role == OMV_ROLE_TRAINER ? "trainer" : "evaluator");
        omv_kv_str(&kv, "host", m->host);
        omv_kv_str(&kv, "name", m->name);
        omv_kv_int(&kv, "pid", m->pid);
        omv_kv_str(&kv, "state", omv_daemon_member_state(m));
        int group = m->role == OMV_ROLE_TRAINER && m->state == MEMBER_ALIVE
                        ? omv_groups_of(d->groups, m->slot)
                        : -1;
        omv_kv_int(&kv, "group", group);
        omv_kv_int(&kv, "step", m->served ? (int64_t)m->served_step : -1);
        omv_kv_int(&kv, "steps", (int64_t)m->steps);
        omv_kv_int(&kv, "images", (int64_t)m->images);
        /* Its images over its time in this job. */
        double in_job_s = (double)(now - m->joined_ms) / 1000.0;
        omv_kv_double(&kv, "images_per_second",
                      in_job_s > 0 && m->state == MEMBER_ALIVE ? (double)m->images / in_job_s : 0,
                      1);
        omv_kv_double(&kv, "compute_ms", m->last_compute_ms, 1);
        omv_kv_int(&kv, "slice_begin", m->slice_begin);
        omv_kv_int(&kv, "slice_count", m->slice_count);
        omv_kv_int(&kv, "previous_id", m->previous_id);
        omv_kv_int(&kv, "last_seen_ms", now - m->last_seen_ms);
    }
    omv_kv_end(&kv);
}

/* Whether live trainer m is in group g now (those joining with the next step included). */
static int member_in_group(const omv_daemon_t *d, const member_t *m, uint32_t g)
{
    return m->used && m->role == OMV_ROLE_TRAINER && m->state == MEMBER_ALIVE &&
           omv_groups_of(d->groups, m->slot) == (int)g;
}

static void reply_groups(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    uint64_t min_clock = omv_groups_min_clock(d->groups);
    omv_strbuf_t ids;
    omv_strbuf_init(&ids);
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++) {
        char name[32];
        snprintf(name, sizeof(name), "group %u", g);
        omv_kv_section(&kv, name);
        uint64_t clock = omv_groups_clock(d->groups, g);
        omv_kv_int(&kv, "id", g);
        omv_kv_int(&kv, "clock", (int64_t)clock);
        /* Steps ahead of the slowest live group: what the staleness bound limits. */
        omv_kv_int(&kv, "ahead_steps",
                   min_clock == UINT64_MAX || clock < min_clock ? 0 : (int64_t)(clock - min_clock));
        omv_kv_int(&kv, "live_members", omv_groups_live(d->groups, g));
        omv_strbuf_clear(&ids);
        omv_strbuf_append(&ids, json ? "[" : "", json ? 1 : 0);
        int n = 0;
        for (uint32_t i = 0; i < d->n_members; i++)
            if (member_in_group(d, &d->members[i], g))
                omv_strbuf_printf(&ids, "%s%u", n++ ? (json ? "," : " ") : "", i + 1);
        omv_strbuf_append(&ids, json ? "]" : "", json ? 1 : 0);
        /* Worker ids as `omnivorectl workers` numbers them; members joining with the next
         * step are listed here before live_members counts them. */
        omv_kv_raw(&kv, "workers", omv_strbuf_str(&ids));
        omv_kv_int(&kv, "images_this_step", d->group_images ? (int64_t)d->group_images[g] : 0);
    }
    omv_strbuf_fini(&ids);
    omv_kv_end(&kv);
}

/* ---- metrics: Prometheus text exposition format 0.0.4 ---- */

static void metric_head(omv_strbuf_t *out, const char *name, const char *type, const char *help)
{
    omv_strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A sample value: Prometheus spells the special values NaN, +Inf and -Inf. */
static void metric_value(omv_strbuf_t *out, double v)
{
    if (isnan(v))
        omv_strbuf_printf(out, " NaN\n");
    else if (isinf(v))
        omv_strbuf_printf(out, " %sInf\n", v > 0 ? "+" : "-");
    else if (v == (double)(int64_t)v && fabs(v) < 9e15)
        omv_strbuf_printf(out, " %lld\n", (long long)v);
    else
        omv_strbuf_printf(out, " %.6g\n", v);
}

static void metric(omv_strbuf_t *out, const char *name, const char *type, const char *help,
                   double v)
{
    metric_head(out, name, type, help);
    omv_strbuf_printf(out, "%s", name);
    metric_value(out, v);
}

/* A label value with \, " and newlines escaped as the format asks. */
static void label_value(omv_strbuf_t *out, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            omv_strbuf_printf(out, "\\%c", *v);
        else if (*v == '\n')
            omv_strbuf_printf(out, "\\n");
        else
            omv_strbuf_append(out, v, 1);
    }
}

static void reply_metrics(omv_daemon_t *d, omv_strbuf_t *out)
{
    metric_head(out, "omnivore_info", "gauge", "Build and job of this daemon (always 1).");
    omv_strbuf_printf(out, "omnivore_info{version=\"%s\",protocol=\"%d\",job_name=\"",
                      OMV_VERSION, OMV_PROTOCOL_VERSION);
    label_value(out, d->job.name);
    omv_strbuf_printf(out, "\"} 1\n");
    metric_head(out, "omnivore_job_state", "gauge",
                "The job's state: 1 for the current one, 0 for the others.");
    for (int s = JOB_WAITING; s < JOB_STATE_COUNT_; s++)
        omv_strbuf_printf(out, "omnivore_job_state{state=\"%s\"} %d\n",
                          omv_daemon_state_names[s], (int)d->state == s);
    metric(out, "omnivore_uptime_seconds", "gauge", "Seconds since the daemon started.",
           omv_time_s() - d->created_s);
    metric(out, "omnivore_train_seconds", "gauge", "Seconds the job has spent training.",
           omv_daemon_train_seconds(d));
    metric(out, "omnivore_epoch", "gauge", "Epochs of training data seen (fractional).",
           omv_daemon_epoch(d));
    metric(out, "omnivore_epochs_target", "gauge", "Epochs the job trains for.",
           (double)d->job.epochs);
    uint64_t step = omv_groups_min_clock(d->groups);
    metric(out, "omnivore_step", "gauge", "Steps completed by the slowest live group.",
           step == UINT64_MAX ? 0.0 : (double)step);
    metric(out, "omnivore_images_total", "counter", "Training images whose gradients were applied.",
           (double)d->images_total);
    metric(out, "omnivore_images_per_second", "gauge",
           "Training throughput over the job's training time.", images_per_second(d));
    metric(out, "omnivore_train_loss", "gauge",
           "Training loss of the last gradient pushed (NaN before one).",
           d->images_total ? d->last_loss : NAN);
    metric(out, "omnivore_test_accuracy_ratio", "gauge",
           "Test accuracy of the last evaluation, 0 to 1 (NaN before one).",
           d->n_history ? d->history[d->n_history - 1].accuracy : NAN);
    metric(out, "omnivore_evaluations_total", "counter",
           "Evaluations of the model on the test set.", (double)d->n_history);
    metric(out, "omnivore_workers_expected", "gauge", "Trainers the job asks for.",
           (double)d->job.workers);
    metric(out, "omnivore_workers_alive", "gauge", "Trainers registered and alive now.",
           (double)omv_daemon_live_trainers(d));
    metric(out, "omnivore_worker_joins_total", "counter", "Worker registrations.",
           (double)d->joins_total);
    metric(out, "omnivore_worker_rejoins_total", "counter",
           "Registrations of workers the daemon had declared dead or gone.",
           (double)d->rejoins_total);
    metric(out, "omnivore_worker_leaves_total", "counter", "Workers that said goodbye.",
           (double)d->leaves_total);
    metric(out, "omnivore_worker_deaths_total", "counter",
           "Workers declared dead after worker_timeout_s of silence.", (double)d->deaths_total);
    metric_head(out, "omnivore_gradients_refused_total", "counter",
                "Messages refused without touching the model, by reason.");
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++)
        omv_strbuf_printf(out, "omnivore_gradients_refused_total{reason=\"%s\"} %llu\n",
                          omv_refuse_name((omv_refuse_t)i), (unsigned long long)d->refused[i]);
    metric(out, "omnivore_late_gradients_total", "counter",
           "Gradients that arrived for a step already done.", (double)d->late_total);
    metric(out, "omnivore_checkpoints_written_total", "counter", "Checkpoints written.",
           (double)d->ckpt_written_total);
    metric(out, "omnivore_checkpoints_failed_total", "counter", "Checkpoint writes that failed.",
           (double)d->ckpt_failed_total);
    metric(out, "omnivore_checkpoint_last_write_seconds", "gauge",
           "How long the last checkpoint took to write.", d->ckpt_last_ms / 1000.0);
    metric(out, "omnivore_groups", "gauge", "Compute groups.", (double)omv_groups_count(d->groups));
    metric(out, "omnivore_staleness_bound_steps", "gauge",
           "The job's staleness bound (-1: no bound).", (double)d->job.staleness);
    metric(out, "omnivore_staleness_max_observed_steps", "gauge",
           "The largest step gap a served pull had to another group.",
           (double)d->staleness_max_observed);
    metric_head(out, "omnivore_group_clock_steps", "gauge", "Steps each compute group completed.");
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++)
        omv_strbuf_printf(out, "omnivore_group_clock_steps{group=\"%u\"} %llu\n", g,
                          (unsigned long long)omv_groups_clock(d->groups, g));
    metric_head(out, "omnivore_group_live_members", "gauge", "Live members of each compute group.");
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++)
        omv_strbuf_printf(out, "omnivore_group_live_members{group=\"%u\"} %u\n", g,
                          omv_groups_live(d->groups, g));
}

void omv_daemon_notify_status(omv_daemon_t *d)
{
    char line[200];
    uint64_t step = omv_groups_min_clock(d->groups);
    snprintf(line, sizeof(line), "%s: epoch %.2f/%lld, step %llu, %.0f images/s, %d/%lld workers",
             omv_daemon_state_names[d->state], omv_daemon_epoch(d), (long long)d->job.epochs,
             step == UINT64_MAX ? 0ULL : (unsigned long long)step, images_per_second(d),
             omv_daemon_live_trainers(d), (long long)d->job.workers);
    omv_notify_status(line);
}

static void reply_summary(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    double acc = d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
    double loss = d->n_history ? d->history[d->n_history - 1].loss : NAN;
    if (json) {
        omv_strbuf_append(out, "{\"job\":", 7);
        omv_strbuf_json_string(out, d->job.name);
        omv_strbuf_printf(out, ",\"state\":\"%s\"", omv_daemon_state_names[d->state]);
        if (isfinite(acc))
            omv_strbuf_printf(out, ",\"test_accuracy\":%.4f,\"test_loss\":%.4f", acc, loss);
        else
            omv_strbuf_printf(out, ",\"test_accuracy\":null,\"test_loss\":null");
        omv_strbuf_printf(out,
                          ",\"epochs\":%.3f,\"wall_seconds\":%.3f,\"images_per_second\":%.1f,"
                          "\"images_total\":%llu,\"workers\":%lld,\"groups\":%lld,"
                          "\"staleness\":%lld,\"batch_size\":%lld,\"learning_rate\":%g,"
                          "\"momentum\":%g,\"workers_alive\":%d,\"joins_total\":%llu,"
                          "\"deaths_total\":%llu,\"leaves_total\":%llu,\"checkpoint\":",

                          omv_daemon_epoch(d), omv_daemon_wall_seconds(d), images_per_second(d),
                          (unsigned long long)d->images_total, (long long)d->job.workers,
                          (long long)d->job.groups, (long long)d->job.staleness,
                          (long long)d->job.batch_size, d->job.learning_rate, d->job.momentum,
                          omv_daemon_live_trainers(d), (unsigned long long)d->joins_total,
                          (unsigned long long)d->deaths_total,
                          (unsigned long long)d->leaves_total);
        omv_strbuf_json_string(out, d->ckpt_last_path);
        omv_strbuf_append(out, ",\"resumed_from\":", 16);
        omv_strbuf_json_string(out, d->ckpt_resumed_from);
        if (d->opt) {
            omv_strbuf_t opt;
            omv_strbuf_init(&opt);
            omv_daemon_opt_report(d, &opt, 1);
            const char *o = omv_strbuf_str(&opt);
            omv_strbuf_append(out, ",\"optimizer\":", 13);
            omv_strbuf_append(out, o, strlen(o) - (strlen(o) && o[strlen(o) - 1] == '\n'));
            omv_strbuf_fini(&opt);
        }
        omv_strbuf_append(out, ",\"history\":", 11);
        history_json(d, out);
        omv_strbuf_append(out, "}\n", 2);
        return;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "summary");
    omv_kv_str(&kv, "job", d->job.name);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    omv_kv_double(&kv, "test_accuracy", acc, 4);
    omv_kv_double(&kv, "test_loss", loss, 4);
    omv_kv_double(&kv, "epochs", omv_daemon_epoch(d), 2);
    omv_kv_double(&kv, "wall_seconds", omv_daemon_wall_seconds(d), 1);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 0);
    omv_kv_int(&kv, "workers", d->job.workers);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_str(&kv, "checkpoint", d->ckpt_last_path);
    if (d->ckpt_resumed_from[0])
        omv_kv_str(&kv, "resumed_from", d->ckpt_resumed_from);
    if (d->opt) {
        omv_kv_int(&kv, "probe_images_total", (int64_t)d->probe_images_total);
        omv_kv_double(&kv, "probe_seconds_total", omv_daemon_opt_probe_seconds(d), 1);
        omv_kv_section(&kv, "phases");
        for (uint32_t i = 0; i < d->n_phases; i++) {
            char key[32], val[160];
            snprintf(key, sizeof(key), "phase_%u", d->phases[i].phase);
            snprintf(val, sizeof(val), "groups=%u momentum=%g learning_rate=%g from_epoch=%.2f",
                     d->phases[i].groups, d->phases[i].momentum, d->phases[i].learning_rate,
                     d->phases[i].epoch);
            omv_kv_str(&kv, key, val);
        }
    }
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

int omv_daemon_on_control(void *ctx, int argc, char **argv, omv_strbuf_t *reply)
{
    omv_daemon_t *d = ctx;
    int json = 0;
    /* systemd's STATUS= line is refreshed from the cron (omv_daemon_notify_status); a request
     * refreshes it too, so that it is current whenever someone looks (rate-limited). */
    omv_daemon_notify_status(d);
    const char *number = NULL; /* regroup's argument */
    if (strcmp(argv[0], "submit") == 0 || strcmp(argv[0], "stop") == 0 ||
        strcmp(argv[0], "jobs") == 0) {
        int n = 0;
        for (int i = 0; i < argc; i++) {
            if (i > 0 && strcmp(argv[i], "--json") == 0)
                json = 1;
            else
                argv[n++] = argv[i];
        }
        return omv_daemon_jobs_control(d, n, argv, json, reply);
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[0], "regroup") == 0 && number == NULL) {
            number = argv[i];
        } else {
            omv_strbuf_printf(reply, "'%s' takes no argument '%s'", argv[0], argv[i]);
            return -EINVAL;
        }
    }
    int needs_job = strcmp(argv[0], "groups") == 0 || strcmp(argv[0], "regroup") == 0 ||
                    strcmp(argv[0], "summary") == 0 || strcmp(argv[0], "checkpoint") == 0 ||
                    strcmp(argv[0], "history") == 0;
    if (needs_job && !d->has_job) {
        omv_strbuf_printf(reply, "no job is loaded; submit one with 'omnivorectl submit "
                                 "JOB.ini'");
        return -ENOENT;
    }
    if (strcmp(argv[0], "status") == 0) {
        reply_status(d, reply, json);
    } else if (strcmp(argv[0], "workers") == 0) {
        reply_workers(d, reply, json);
    } else if (strcmp(argv[0], "groups") == 0) {
        reply_groups(d, reply, json);
    } else if (strcmp(argv[0], "metrics") == 0) {
        if (json) {
            omv_strbuf_printf(reply, "metrics are Prometheus text only; drop --json");
            return -EINVAL;
        }
        reply_metrics(d, reply);
    } else if (strcmp(argv[0], "optimizer") == 0) {
        omv_daemon_opt_report(d, reply, json);
    } else if (strcmp(argv[0], "regroup") == 0) {
        char *end = NULL;
        long g = number ? strtol(number, &end, 10) : 0;
        if (number == NULL || *end != '\0' || g < 1) {
            omv_strbuf_printf(reply, "regroup takes the number of groups, e.g. 'regroup 2'");
            return -EINVAL;
        }
        char why[256];
        int r = omv_daemon_request_regroup(d, (uint32_t)g, why, sizeof(why));
        if (r < 0) {
            omv_strbuf_printf(reply, "%s", why);
            return r;
        }
        omv_kv_t kv;
        omv_kv_begin(&kv, reply, json);
        omv_kv_section(&kv, "regroup");
        omv_kv_int(&kv, "groups_now", omv_groups_count(d->groups));
        omv_kv_int(&kv, "groups_requested", (int64_t)g);
        omv_kv_str(&kv, "when", "at the next step boundary of every group");
        omv_kv_end(&kv);
    } else if (strcmp(argv[0], "summary") == 0) {
        reply_summary(d, reply, json);
    } else if (strcmp(argv[0], "history") == 0) {
        omv_daemon_timeline_report(d, reply, json);
    } else if (strcmp(argv[0], "checkpoint") == 0) {
        if (!d->ckpt_enabled) {
            omv_strbuf_printf(reply, "checkpoints are off: the daemon cannot write to '%s'; set "
                                     "[daemon] state_dir or the job's [checkpoint] dir",
                              d->ckpt_dir);
            return -EINVAL;
        }
        if (d->state == JOB_WAITING) {
            omv_strbuf_printf(reply, "job '%s' has not started: nothing to checkpoint yet",
                              d->job.name);
            return -EAGAIN;
        }
        if (omv_daemon_settle(d, 1000) < 0) {
            d->ckpt_due = 1;
            omv_strbuf_printf(reply, "a group is applying a step; the checkpoint will be written "
                                     "when it is done (see status)\n");
            return 0;
        }
        int r = omv_daemon_checkpoint(d, d->state == JOB_DONE);
        if (r < 0) {
            omv_strbuf_printf(reply, "checkpoint failed: %s (see the daemon's log)",
                              omv_strerror(r));
            return r;
        }
        omv_kv_t kv;
        omv_kv_begin(&kv, reply, json);
        omv_kv_section(&kv, "checkpoint");
        omv_kv_str(&kv, "path", d->ckpt_last_path);
        omv_kv_double(&kv, "write_ms", d->ckpt_last_ms, 1);
        omv_kv_end(&kv);
    } else if (strcmp(argv[0], "shutdown") == 0) {
        omv_log_info("shutdown requested over the control socket");
        d->shutdown = 1;
        omv_notify_stopping();
        omv_strbuf_printf(reply, "shutting down\n");
    } else if (strcmp(argv[0], "help") == 0) {
        omv_strbuf_printf(reply, "commands: status, workers, groups, metrics, summary, "
                                 "history, checkpoint, optimizer, regroup G, jobs, submit PATH "
                                 "[S.K=V ...], stop [ID|NAME], shutdown, help (--json for JSON, "
                                 "but not metrics)\n");
    } else {
        omv_strbuf_printf(reply, "unknown command '%s'; try 'help'", argv[0]);
        return -EINVAL;
    }
    return 0;
}

