/* Prometheus text exposition format 0.0.4 for the daemon and its current job. */
#define OMV_LOG_TAG "daemon"
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"
#include "util.h"

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

static void job_metrics(const omv_daemon_t *d, const omv_run_view_t *v, omv_strbuf_t *out)
{
    metric_head(out, "omnivore_info", "gauge", "Build and job of this daemon (always 1).");
    omv_strbuf_printf(out, "omnivore_info{version=\"%s\",protocol=\"%d\",job_name=\"", OMV_VERSION,
                      OMV_PROTOCOL_VERSION);
    label_value(out, v->job->name);
    omv_strbuf_printf(out, "\"} 1\n");
    metric_head(out, "omnivore_job_state", "gauge",
                "The job's state: 1 for the current one, 0 for the others.");
    for (int s = OMV_JOB_WAITING; s < OMV_JOB_STATE_COUNT_; s++)
        omv_strbuf_printf(out, "omnivore_job_state{state=\"%s\"} %d\n", omv_run_state_names[s],
                          (int)v->state == s);
    metric(out, "omnivore_uptime_seconds", "gauge", "Seconds since the daemon started.",
           omv_time_s() - d->created_s);
    metric(out, "omnivore_train_seconds", "gauge", "Seconds the job has spent training.",
           v->train_seconds);
    metric(out, "omnivore_epoch", "gauge", "Epochs of training data seen (fractional).", v->epoch);
    metric(out, "omnivore_epochs_target", "gauge", "Epochs the job trains for.",
           (double)v->job->epochs);
    uint64_t step = omv_groups_min_clock(v->groups);
    metric(out, "omnivore_step", "gauge", "Steps completed by the slowest live group.",
           step == UINT64_MAX ? 0.0 : (double)step);
    metric(out, "omnivore_images_total", "counter", "Training images whose gradients were applied.",
           (double)v->stats->images_total);
    metric(out, "omnivore_images_per_second", "gauge",
           "Training throughput over the job's training time.", v->images_per_second);
    metric(out, "omnivore_train_loss", "gauge",
           "Training loss of the last gradient pushed (NaN before one).",
           v->stats->images_total ? v->last_loss : NAN);
    metric(out, "omnivore_test_accuracy_ratio", "gauge",
           "Test accuracy of the last evaluation, 0 to 1 (NaN before one).",
           omv_eval_last_accuracy(v->eval));
    metric(out, "omnivore_evaluations_total", "counter",
           "Evaluations of the model on the test set.", (double)v->eval->n_history);
}

static void member_metrics(const omv_daemon_t *d, const omv_run_view_t *v, omv_strbuf_t *out)
{
    const omv_members_t *ms = d->members;
    metric(out, "omnivore_workers_expected", "gauge", "Trainers the job asks for.",
           (double)v->job->workers);
    metric(out, "omnivore_workers_alive", "gauge", "Trainers registered and alive now.",
           (double)omv_members_live_trainers(ms));
    metric(out, "omnivore_worker_joins_total", "counter", "Worker registrations.",
           (double)ms->joins_total);
    metric(out, "omnivore_worker_rejoins_total", "counter",
           "Registrations of workers the daemon had declared dead or gone.",
           (double)ms->rejoins_total);
    metric(out, "omnivore_worker_leaves_total", "counter", "Workers that said goodbye.",
           (double)ms->leaves_total);
    metric(out, "omnivore_worker_deaths_total", "counter",
           "Workers declared dead after worker_timeout_s of silence.", (double)ms->deaths_total);
    metric_head(out, "omnivore_gradients_refused_total", "counter",
                "Messages refused without touching the model, by reason.");
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++)
        omv_strbuf_printf(out, "omnivore_gradients_refused_total{reason=\"%s\"} %llu\n",
                          omv_refuse_name((omv_refuse_t)i),
                          (unsigned long long)d->refusals.counts[i]);
    metric(out, "omnivore_late_gradients_total", "counter",
           "Gradients that arrived for a step already done.", (double)v->stats->late_total);
}

static void group_metrics(const omv_run_view_t *v, omv_strbuf_t *out)
{
    metric(out, "omnivore_checkpoints_written_total", "counter", "Checkpoints written.",
           (double)v->ckpt->written_total);
    metric(out, "omnivore_checkpoints_failed_total", "counter", "Checkpoint writes that failed.",
           (double)v->ckpt->failed_total);
    metric(out, "omnivore_checkpoint_last_write_seconds", "gauge",
           "How long the last checkpoint took to write.", v->ckpt->last_ms / 1000.0);
    metric(out, "omnivore_groups", "gauge", "Compute groups.", (double)omv_groups_count(v->groups));
    metric(out, "omnivore_staleness_bound_steps", "gauge",
           "The job's staleness bound (-1: no bound).", (double)v->job->staleness);
    metric(out, "omnivore_staleness_max_observed_steps", "gauge",
           "The largest step gap a served pull had to another group.",
           (double)v->stats->staleness_max_observed);
    metric_head(out, "omnivore_group_clock_steps", "gauge", "Steps each compute group completed.");
    for (uint32_t g = 0; g < omv_groups_count(v->groups); g++)
        omv_strbuf_printf(out, "omnivore_group_clock_steps{group=\"%u\"} %llu\n", g,
                          (unsigned long long)omv_groups_clock(v->groups, g));
    metric_head(out, "omnivore_group_live_members", "gauge", "Live members of each compute group.");
    for (uint32_t g = 0; g < omv_groups_count(v->groups); g++)
        omv_strbuf_printf(out, "omnivore_group_live_members{group=\"%u\"} %u\n", g,
                          omv_groups_live(v->groups, g));
}

/* One sample per shard server of a coordinator, labelled by its id and endpoint. */
static void server_metric(const omv_daemon_t *d, omv_strbuf_t *out, const char *name,
                          const char *type, const char *help, int what)
{
    metric_head(out, name, type, help);
    for (uint32_t i = 0; i < d->servers.n; i++) {
        const omv_server_t *s = &d->servers.rec[i];
        if (!s->used)
            continue;
        omv_strbuf_printf(out, "%s{server=\"%u\",endpoint=\"", name, i + 1);
        label_value(out, s->endpoint);
        omv_strbuf_printf(out, "\"}");
        double v = what == 0   ? s->alive
                   : what == 1 ? (double)s->stats.bytes_in
                   : what == 2 ? (double)s->stats.bytes_out
                               : (double)s->stats.steps;
        metric_value(out, v);
    }
}

static void server_metrics(const omv_daemon_t *d, omv_strbuf_t *out)
{
    if (d->servers.n == 0)
        return;
    server_metric(d, out, "omnivore_server_up", "gauge", "Whether the shard server is alive.", 0);
    server_metric(d, out, "omnivore_server_bytes_in_total", "counter",
                  "Gradient bytes the shard server took from workers in the current job.", 1);
    server_metric(d, out, "omnivore_server_bytes_out_total", "counter",
                  "Parameter bytes the shard server sent workers in the current job.", 2);
    server_metric(d, out, "omnivore_server_steps_applied_total", "counter",
                  "Group steps the shard server applied on its shards in the current job.", 3);
}

void omv_status_metrics(const omv_daemon_t *d, omv_strbuf_t *out)
{
    omv_run_view_t v;
    omv_run_view(d->run, &v); /* an idle run's with no job loaded */
    job_metrics(d, &v, out);
    member_metrics(d, &v, out);
    group_metrics(&v, out);
    server_metrics(d, out);
}
