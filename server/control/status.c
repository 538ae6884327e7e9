/* Read-only formatters: status, workers, groups, summary, jobs, history, optimizer, metrics. */
#define OMV_LOG_TAG "daemon"
#include "status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kv.h"
#include "notify.h"
#include "util.h"

/* What the formatters read: a view of the run, or of an idle one with nothing in it when no job
 * is loaded. */
static omv_run_view_t view_of(const omv_daemon_t *d)
{
    omv_run_view_t v;
    omv_run_view(d->run, &v);
    return v;
}

static uint32_t n_shards(const omv_run_view_t *v)
{
    return v->shards ? v->shards->n_shards : 0;
}

static void section_daemon(const omv_daemon_t *d, omv_kv_t *kv)
{
    omv_kv_section(kv, "daemon");
    omv_kv_str(kv, "version", OMV_VERSION);
    omv_kv_int(kv, "protocol_version", OMV_PROTOCOL_VERSION);
    omv_kv_int(kv, "pid", getpid());
    omv_kv_double(kv, "uptime_seconds", omv_time_s() - d->created_s, 1);
    omv_kv_str(kv, "endpoint", d->cfg.endpoint);
    omv_kv_str(kv, "log_level", d->cfg.log_level);
    omv_kv_int(kv, "reloads_total", (int64_t)d->reload.reloads_total);
    uint64_t refused, timeouts;
    omv_control_counts(d->control, &refused, &timeouts);
    omv_kv_int(kv, "control_refused_total", (int64_t)refused);
    omv_kv_int(kv, "control_timeouts_total", (int64_t)timeouts);
    omv_kv_int(kv, "reloads_failed_total", (int64_t)d->reload.reloads_failed_total);
    omv_kv_int(kv, "jobs_queued", d->jobs->n_queue);
    omv_kv_int(kv, "jobs_submitted_total", (int64_t)d->jobs->submitted_total);
    omv_kv_int(kv, "workers_waiting", omv_members_idle(d->members));
}

static void section_job(const omv_run_view_t *v, omv_kv_t *kv)
{
    omv_kv_section(kv, "job");
    omv_kv_int(kv, "id", (int64_t)v->id);
    omv_kv_str(kv, "name", v->job->name);
    omv_kv_str(kv, "file", v->path);
    omv_kv_str(kv, "state", omv_run_state_names[v->state]);
    if (omv_tuner_active(v->tuner)) {
        omv_strbuf_t line;
        omv_strbuf_init(&line);
        omv_tuner_describe(v->tuner, &line);
        omv_kv_str(kv, "optimizer", omv_strbuf_str(&line));
        omv_strbuf_fini(&line);
        omv_kv_int(kv, "probe_images_total", (int64_t)omv_tuner_probe_images(v->tuner));
        omv_kv_double(kv, "probe_seconds_total", omv_tuner_probe_seconds(v->tuner, omv_time_s()),
                      2);
    } else {
        omv_kv_str(kv, "optimizer", "off");
    }
    if (v->state == OMV_JOB_FAILED || v->state == OMV_JOB_STOPPED)
        omv_kv_str(kv, "reason", v->fail_reason);
    omv_kv_double(kv, "epoch", v->epoch, 3);
    omv_kv_int(kv, "epochs", v->job->epochs);
    uint64_t step = omv_groups_min_clock(v->groups);
    omv_kv_int(kv, "step", step == UINT64_MAX ? 0 : (int64_t)step);
    /* The clock a group will have at the end if every group keeps its full batch. */
    uint64_t per_group_step = (uint64_t)v->job->batch_size * (uint64_t)v->job->groups;
    omv_kv_int(kv, "total_steps",
               per_group_step ? (int64_t)(v->plan->target_images / per_group_step) : 0);
    omv_kv_int(kv, "target_images", (int64_t)v->plan->target_images);
    omv_kv_int(kv, "images_total", (int64_t)v->stats->images_total);
    omv_kv_double(kv, "images_per_second", v->images_per_second, 1);
    omv_kv_double(kv, "loss", v->last_loss, 4);
    omv_kv_double(kv, "test_accuracy", omv_eval_last_accuracy(v->eval), 4);
    omv_kv_double(kv, "wall_seconds", v->wall_seconds, 2);
}

/* The groups' clocks, space-separated (a JSON array with json). */
static void clocks_list(const omv_run_view_t *v, int json, omv_kv_t *kv)
{
    omv_strbuf_t clocks;
    omv_strbuf_init(&clocks);
    omv_strbuf_append(&clocks, json ? "[" : "", json ? 1 : 0);
    for (uint32_t g = 0; g < omv_groups_count(v->groups); g++)
        omv_strbuf_printf(&clocks, "%s%llu", g ? (json ? "," : " ") : "",
                          (unsigned long long)omv_groups_clock(v->groups, g));
    omv_strbuf_append(&clocks, json ? "]" : "", json ? 1 : 0);
    omv_kv_raw(kv, "group_clocks", omv_strbuf_str(&clocks));
    omv_strbuf_fini(&clocks);
}

static void section_cluster(const omv_daemon_t *d, const omv_run_view_t *v, int json, omv_kv_t *kv)
{
    const omv_members_t *ms = d->members;
    omv_kv_section(kv, "cluster");
    omv_kv_int(kv, "workers_expected", v->job->workers);
    omv_kv_int(kv, "workers_registered", (int64_t)ms->joins_total);
    omv_kv_int(kv, "workers_alive", omv_members_live_trainers(ms));
    omv_kv_int(kv, "joins_total", (int64_t)ms->joins_total);
    omv_kv_int(kv, "rejoins_total", (int64_t)ms->rejoins_total);
    omv_kv_int(kv, "leaves_total", (int64_t)ms->leaves_total);
    omv_kv_int(kv, "deaths_total", (int64_t)ms->deaths_total);
    /* Trainers on this host that use shared memory now, and the segments' history. */
    omv_kv_int(kv, "shm_workers", omv_members_shm_in_use(d->members));
    omv_kv_int(kv, "shm_attached_total", (int64_t)d->local.attached_total);
    omv_kv_int(kv, "shm_gone_total", (int64_t)d->local.gone_total);
    omv_kv_int(kv, "shm_refused_total", (int64_t)d->local.refused_total);
    omv_kv_int(kv, "shm_inplace_serves_total", (int64_t)v->stats->inplace_serves_total);
    omv_kv_int(kv, "shm_inplace_raced_total", (int64_t)v->stats->inplace_raced_total);
    omv_kv_int(kv, "evaluator_alive", v->eval->evaluator != 0);
    omv_kv_int(kv, "evaluations_total", (int64_t)v->eval->n_history);
    /* The model on shard servers: evaluations whose model the servers sent the evaluator. */
    omv_kv_int(kv, "evaluations_direct_total", (int64_t)v->stats->direct_evals_total);
    omv_kv_int(kv, "groups", v->job->groups);
    omv_kv_int(kv, "groups_now", omv_groups_count(v->groups));
    omv_kv_int(kv, "staleness", v->job->staleness);
    omv_kv_int(kv, "shards", n_shards(v));
    omv_kv_str(kv, "wire", v->job->wire_name[0] ? v->job->wire_name : "fp32");
    omv_kv_int(kv, "staleness_max_observed", (int64_t)v->stats->staleness_max_observed);
    omv_kv_int(kv, "late_gradients_total", (int64_t)v->stats->late_total);
    clocks_list(v, json, kv);
    omv_kv_int(kv, "regroups_total", (int64_t)v->stats->regroups_total);
    omv_kv_int(kv, "regroup_pending", v->regroup_pending);
}

/* Exactly once, checked: each group step applies each shard once, and each recorded gradient
 * is summed once (or refused as not finite). */
static void section_shards(const omv_run_view_t *v, omv_kv_t *kv)
{
    omv_kv_section(kv, "shards");
    omv_kv_int(kv, "steps_total", (int64_t)v->stats->steps_total);
    omv_kv_int(kv, "pushes_recorded_total", (int64_t)v->stats->pushes_recorded_total);
    uint64_t summed_all = 0;
    omv_shard_views_t views = {0};
    for (uint32_t s = 0; s < n_shards(v); s++) {
        const omv_shard_thread_t *t = v->shards->threads[s];
        uint64_t applies, summed, snaps, serves;
        omv_shard_thread_counts(t, &applies, &summed);
        omv_shard_thread_stats(t, &snaps, &serves);
        omv_shard_views_t sv;
        omv_shard_thread_views(t, &sv);
        views.views += sv.views;
        views.bytes += sv.bytes;
        views.changes += sv.changes;
        views.wholes += sv.wholes;
        summed_all += summed;
        char key[64];
        snprintf(key, sizeof(key), "shard_%u_applied_total", s);
        omv_kv_int(kv, key, (int64_t)applies);
        snprintf(key, sizeof(key), "shard_%u_summed_total", s);
        omv_kv_int(kv, key, (int64_t)summed);
        snprintf(key, sizeof(key), "shard_%u_snapshots_total", s);
        omv_kv_int(kv, key, (int64_t)snaps);
        snprintf(key, sizeof(key), "shard_%u_pulls_served_total", s);
        omv_kv_int(kv, key, (int64_t)serves);
        snprintf(key, sizeof(key), "shard_%u_threaded", s);
        omv_kv_int(kv, key, omv_shard_thread_threaded(t));
    }
    omv_kv_int(kv, "summed_total", (int64_t)summed_all);
    /* Wire int8: the workers' views of the parameters kept here, and how pulls were answered. */
    omv_kv_int(kv, "views", (int64_t)views.views);
    omv_kv_int(kv, "view_bytes", (int64_t)views.bytes);
    omv_kv_int(kv, "served_as_changes_total", (int64_t)views.changes);
    omv_kv_int(kv, "served_whole_total", (int64_t)views.wholes);
}

static void section_checkpoint(const omv_run_view_t *v, omv_kv_t *kv)
{
    const omv_run_ckpt_t *c = v->ckpt;
    omv_kv_section(kv, "checkpoint");
    omv_kv_str(kv, "dir", c->enabled ? c->dir : "(off)");
    omv_kv_str(kv, "last_path", c->last_path);
    omv_kv_int(kv, "written_total", (int64_t)c->written_total);
    omv_kv_int(kv, "failed_total", (int64_t)c->failed_total);
    omv_kv_double(kv, "last_write_ms", c->last_ms, 1);
    omv_kv_str(kv, "resumed_from", c->resumed_from);
    omv_kv_double(kv, "resumed_epoch", c->resumed_from[0] ? c->resumed_epoch : NAN, 3);
}

static void section_refusals(const omv_daemon_t *d, omv_kv_t *kv)
{
    omv_kv_section(kv, "refusals");
    char key[64];
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++) {
        snprintf(key, sizeof(key), "refused_%s_total", omv_refuse_name((omv_refuse_t)i));
        omv_kv_int(kv, key, (int64_t)d->refusals.counts[i]);
    }
    omv_kv_int(
        kv, "refused_total",
        (int64_t)(omv_refusals_total(&d->refusals) + omv_refusals_total(&d->backup_refusals)));
    omv_kv_str(kv, "refused_last", d->refusals.last);
    /* A shard server's refusals as a backup (not answered: its primary answers), in
     * refused_total too. */
    omv_kv_int(kv, "backup_refused_total", (int64_t)omv_refusals_total(&d->backup_refusals));
    omv_kv_str(kv, "backup_refused_last", d->backup_refusals.last);
    omv_kv_int(kv, "refusals_unanswered_total", (int64_t)d->refusals.unanswered);
    omv_kv_int(kv, "handshakes_failed_total", (int64_t)omv_router_handshakes_failed(d->router));
}

void omv_status_status(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    section_daemon(d, &kv);
    section_job(v, &kv);
    section_cluster(d, v, json, &kv);
    section_shards(v, &kv);
    section_checkpoint(v, &kv);
    section_refusals(d, &kv);
    omv_kv_end(&kv);
}

static void worker_section(const omv_run_view_t *v, const omv_member_t *m, uint32_t id, int64_t now,
                           omv_kv_t *kv)
{
    char name[32];
    snprintf(name, sizeof(name), "worker %u", id);
    omv_kv_section(kv, name);
    omv_kv_str(kv, "role", m->role == OMV_ROLE_TRAINER ? "trainer" : "evaluator");
    omv_kv_str(kv, "host", m->host);
    omv_kv_str(kv, "name", m->name);
    omv_kv_int(kv, "pid", m->pid);
    omv_kv_str(kv, "state", omv_members_state_name(m));
    int group = m->role == OMV_ROLE_TRAINER && m->state == OMV_MEMBER_ALIVE
                    ? omv_groups_of(v->groups, m->slot)
                    : -1;
    omv_kv_int(kv, "group", group);
    omv_kv_int(kv, "step", m->served ? (int64_t)m->served_step : -1);
    omv_kv_int(kv, "batch", m->batch); /* images it was given for that step */
    omv_kv_str(kv, "transport", m->shm_on ? "shm" : "tcp");
    omv_kv_int(kv, "steps", (int64_t)m->steps);
    omv_kv_int(kv, "images", (int64_t)m->images);
    /* Its images over its time in this job. */
    double in_job_s = (double)(now - m->joined_ms) / 1000.0;
    omv_kv_double(kv, "images_per_second",
                  in_job_s > 0 && m->state == OMV_MEMBER_ALIVE ? (double)m->images / in_job_s : 0,
                  1);
    omv_kv_double(kv, "compute_ms", m->last_compute_ms, 1);
    omv_kv_int(kv, "slice_begin", m->slice_begin);
    omv_kv_int(kv, "slice_count", m->slice_count);
    omv_kv_int(kv, "previous_id", m->previous_id);
    omv_kv_int(kv, "last_seen_ms", now - m->last_seen_ms);
}

void omv_status_workers(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    int64_t now = omv_time_ms();
    const omv_run_view_t view = view_of(d);
    for (uint32_t i = 0; i < d->members->n; i++) {
        const omv_member_t *m = &d->members->records[i];
        if (m->used && m->state != OMV_MEMBER_DONE) /* not records of finished jobs */
            worker_section(&view, m, i + 1, now, &kv);
    }
    omv_kv_end(&kv);
}

static void server_section(const omv_daemon_t *d, const omv_server_t *s, uint32_t id, int64_t now,
                           omv_kv_t *kv)
{
    char name[32];
    snprintf(name, sizeof(name), "server %u", id);
    omv_kv_section(kv, name);
    omv_kv_str(kv, "host", s->host);
    omv_kv_int(kv, "pid", s->pid);
    omv_kv_str(kv, "endpoint", s->endpoint);
    omv_kv_str(kv, "state", s->alive ? "alive" : "gone");
    omv_kv_str(kv, "curve", s->public_key[0] ? "yes" : "no");
    const omv_run_view_t view = view_of(d);
    int holds = s->run_id != 0 && d->run && view.id == s->run_id;
    omv_kv_str(kv, "role", !holds ? "free" : s->backup ? "backup" : "primary");
    omv_kv_int(kv, "job", holds ? (int64_t)s->run_id : 0);
    omv_kv_int(kv, "first_shard", holds ? s->first : 0);
    omv_kv_int(kv, "last_shard", holds ? s->last : 0);
    uint32_t lo = holds ? view.shards->offsets[s->first] : 0;
    uint32_t hi = holds ? view.shards->offsets[s->last] : 0;
    omv_kv_int(kv, "parameters", hi - lo);
    omv_kv_int(kv, "steps_applied", (int64_t)s->stats.steps);
    omv_kv_int(kv, "gradients_total", (int64_t)s->stats.pushes);
    omv_kv_int(kv, "serves_total", (int64_t)s->stats.pulls);
    omv_kv_int(kv, "bytes_in_total", (int64_t)s->stats.bytes_in);
    omv_kv_int(kv, "bytes_out_total", (int64_t)s->stats.bytes_out);
    omv_kv_double(kv, "bytes_in_per_second", s->in_per_s, 0);
    omv_kv_double(kv, "bytes_out_per_second", s->out_per_s, 0);
    omv_kv_double(kv, "applies_per_second", s->applies_per_s, 1);
    omv_kv_double(kv, "gradients_per_second", s->pushes_per_s, 1);
    omv_kv_int(kv, "gathers_total", (int64_t)s->gathers);
    /* What those gathers brought the coordinator: an evaluation's the parameters alone, the
     * final model's and a checkpoint's the optimizer's state too. */
    omv_kv_int(kv, "gathered_bytes_total", (int64_t)s->bytes_in);
    /* The model's bytes the coordinator sent it: none where it made its ranges itself. */
    omv_kv_int(kv, "range_bytes_sent_total", (int64_t)s->range_bytes);
    omv_kv_int(kv, "last_seen_ms", now - s->last_seen_ms);
}

void omv_status_servers(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    if (d->shard_role) {
        omv_kv_section(&kv, "shard server");
        omv_kv_str(&kv, "coordinator", d->cfg.coordinator);
        const omv_run_view_t view = view_of(d);
        omv_kv_str(&kv, "advertise", omv_uplink_advertise(d->uplink));
        omv_kv_int(&kv, "server_id", omv_uplink_server_id(d->uplink));
        omv_kv_str(&kv, "registered", omv_uplink_server_id(d->uplink) ? "yes" : "no");
        omv_kv_int(&kv, "job", (int64_t)view.id);
        omv_kv_int(&kv, "first_shard", view.range.first);
        omv_kv_int(&kv, "last_shard", view.range.last);
        omv_kv_str(&kv, "role", !d->run ? "free" : view.range.backup ? "backup" : "primary");
        omv_kv_int(&kv, "bytes_in_total", (int64_t)view.stats->bytes_in_total);
        omv_kv_int(&kv, "bytes_out_total", (int64_t)view.stats->bytes_out_total);
        /* A backup's pushes that came before their step, waiting for it (bounded: past the
         * bound it drops its part, and the coordinator goes on without it). */
        omv_kv_int(&kv, "held_pushes", view.range.held_pushes);
        omv_kv_int(&kv, "held_bytes", (int64_t)view.range.held_bytes);
    }
    if (!d->shard_role) {
        omv_kv_section(&kv, "servers");
        omv_kv_int(&kv, "registered_total", (int64_t)d->servers.registered_total);
        omv_kv_int(&kv, "lost_total", (int64_t)d->servers.lost_total);
        omv_kv_int(&kv, "failovers_total", (int64_t)d->servers.failovers_total);
    }
    int64_t now = omv_time_ms();
    for (uint32_t i = 0; !d->shard_role && i < d->servers.n; i++)
        if (d->servers.rec[i].used)
            server_section(d, &d->servers.rec[i], i + 1, now, &kv);
    omv_kv_end(&kv);
}

/* Whether live trainer m is in group g now (those joining with the next step included). */
static int member_in_group(const omv_run_view_t *v, const omv_member_t *m, uint32_t g)
{
    return m->used && m->role == OMV_ROLE_TRAINER && m->state == OMV_MEMBER_ALIVE &&
           omv_groups_of(v->groups, m->slot) == (int)g;
}

void omv_status_groups(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    uint64_t min_clock = omv_groups_min_clock(v->groups);
    omv_strbuf_t ids;
    omv_strbuf_init(&ids);
    for (uint32_t g = 0; g < omv_groups_count(v->groups); g++) {
        char name[32];
        snprintf(name, sizeof(name), "group %u", g);
        omv_kv_section(&kv, name);
        uint64_t clock = omv_groups_clock(v->groups, g);
        omv_kv_int(&kv, "id", g);
        omv_kv_int(&kv, "clock", (int64_t)clock);
        /* Steps ahead of the slowest live group: what the staleness bound limits. */
        omv_kv_int(&kv, "ahead_steps",
                   min_clock == UINT64_MAX || clock < min_clock ? 0 : (int64_t)(clock - min_clock));
        omv_kv_int(&kv, "live_members", omv_groups_live(v->groups, g));
        omv_strbuf_clear(&ids);
        omv_strbuf_append(&ids, json ? "[" : "", json ? 1 : 0);
        int n = 0;
        for (uint32_t i = 0; i < d->members->n; i++)
            if (member_in_group(v, &d->members->records[i], g))
                omv_strbuf_printf(&ids, "%s%u", n++ ? (json ? "," : " ") : "", i + 1);
        omv_strbuf_append(&ids, json ? "]" : "", json ? 1 : 0);
        /* Worker ids as `omnivorectl workers` numbers them; members joining with the next
         * step are listed here before live_members counts them. */
        omv_kv_raw(&kv, "workers", omv_strbuf_str(&ids));
        omv_kv_int(&kv, "images_this_step", v->sums->images ? (int64_t)v->sums->images[g] : 0);
    }
    omv_strbuf_fini(&ids);
    omv_kv_end(&kv);
}

void omv_status_notify(const omv_daemon_t *d)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    char line[200], workers[64];
    uint64_t step = omv_groups_min_clock(v->groups);
    /* Once a job is over its trainers are idle, waiting for the next: say so, not "0/2". */
    if (!OMV_JOB_OVER(v->state))
        snprintf(workers, sizeof(workers), "%d/%lld workers", omv_members_live_trainers(d->members),
                 (long long)v->job->workers);
    else
        snprintf(workers, sizeof(workers), "%d workers idle", omv_members_idle(d->members));
    snprintf(line, sizeof(line), "%s: epoch %.2f/%lld, step %llu, %.0f images/s, %s",
             omv_run_state_names[v->state], v->epoch, (long long)v->job->epochs,
             step == UINT64_MAX ? 0ULL : (unsigned long long)step, v->images_per_second, workers);
    omv_notify_status(line);
}

void omv_status_history(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    omv_timeline_head_t head = {
        .job = v->job->name,
        .state = omv_run_state_names[v->state],
        .test_accuracy = omv_eval_last_accuracy(v->eval),
        .train_s = v->train_seconds,
        .epoch = v->epoch,
        .eval = v->eval,
        .tuner = v->tuner,
    };
    omv_timeline_report(v->timeline, &head, out, json);
}

void omv_status_optimizer(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    omv_tuner_report(v->tuner, v->train_seconds, omv_time_s(), out, json);
}

static void history_json(const omv_eval_t *ev, omv_strbuf_t *out)
{
    omv_strbuf_append(out, "[", 1);
    for (size_t i = 0; i < ev->n_history; i++) {
        const omv_eval_point_t *h = &ev->history[i];
        omv_strbuf_printf(out,
                          "%s{\"epoch\":%.4f,\"wall_seconds\":%.3f,\"test_accuracy\":%.4f,"
                          "\"test_loss\":%.4f}",
                          i ? "," : "", h->epoch, h->wall_s, h->accuracy, h->loss);
    }
    omv_strbuf_append(out, "]", 1);
}

/* How a done job's end went: its final checkpoint and evaluation ("" for a job not done). */
static const char *final_checkpoint(const omv_run_view_t *v)
{
    if (v->state != OMV_JOB_DONE)
        return "";
    return v->final.ckpt > 0 ? "written" : v->final.ckpt < 0 ? "failed" : "off";
}

static const char *final_evaluation(const omv_run_view_t *v)
{
    return v->state != OMV_JOB_DONE ? "" : v->final.eval ? "done" : "missing";
}

/* The checkpoint that holds the job's result: none when a done job's final one failed (an
 * older one is not its result). */
static const char *result_checkpoint(const omv_run_view_t *v)
{
    return v->state == OMV_JOB_DONE && v->final.ckpt < 0 ? "" : v->ckpt->last_path;
}

static void summary_json(const omv_daemon_t *d, const omv_run_view_t *v, omv_strbuf_t *out)
{
    double acc = v->result_accuracy;
    double loss = isfinite(acc) ? omv_eval_last_loss(v->eval) : NAN;
    const omv_members_t *ms = d->members;
    omv_strbuf_append(out, "{\"job\":", 7);
    omv_strbuf_json_string(out, v->job->name);
    omv_strbuf_printf(out, ",\"state\":\"%s\"", omv_run_state_names[v->state]);
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
                      v->epoch, v->wall_seconds, v->images_per_second,
                      (unsigned long long)v->stats->images_total, (long long)v->job->workers,
                      (long long)v->job->groups, (long long)v->job->staleness,
                      (long long)v->job->batch_size, v->job->learning_rate, v->job->momentum,
                      omv_members_live_trainers(ms), (unsigned long long)ms->joins_total,
                      (unsigned long long)ms->deaths_total, (unsigned long long)ms->leaves_total);
    omv_strbuf_json_string(out, result_checkpoint(v));
    omv_strbuf_printf(out, ",\"final_checkpoint\":\"%s\",\"final_evaluation\":\"%s\"",
                      final_checkpoint(v), final_evaluation(v));
    if (v->state == OMV_JOB_DONE && v->final.ckpt < 0) {
        omv_strbuf_append(out, ",\"checkpoint_error\":", 20);
        omv_strbuf_json_string(out, v->ckpt->last_error);
    }
    omv_strbuf_append(out, ",\"resumed_from\":", 16);
    omv_strbuf_json_string(out, v->ckpt->resumed_from);
    if (omv_tuner_active(v->tuner)) {
        omv_strbuf_t opt;
        omv_strbuf_init(&opt);
        omv_tuner_report(v->tuner, v->train_seconds, omv_time_s(), &opt, 1);
        const char *o = omv_strbuf_str(&opt);
        omv_strbuf_append(out, ",\"optimizer\":", 13);
        omv_strbuf_append(out, o, strlen(o) - (strlen(o) && o[strlen(o) - 1] == '\n'));
        omv_strbuf_fini(&opt);
    }
    omv_strbuf_append(out, ",\"history\":", 11);
    history_json(v->eval, out);
    omv_strbuf_append(out, "}\n", 2);
}

void omv_status_summary(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    if (json) {
        summary_json(d, v, out);
        return;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "summary");
    omv_kv_str(&kv, "job", v->job->name);
    omv_kv_str(&kv, "state", omv_run_state_names[v->state]);
    double acc = v->result_accuracy;
    omv_kv_double(&kv, "test_accuracy", acc, 4);
    omv_kv_double(&kv, "test_loss", isfinite(acc) ? omv_eval_last_loss(v->eval) : NAN, 4);
    omv_kv_double(&kv, "epochs", v->epoch, 2);
    omv_kv_double(&kv, "wall_seconds", v->wall_seconds, 1);
    omv_kv_double(&kv, "images_per_second", v->images_per_second, 0);
    omv_kv_int(&kv, "workers", v->job->workers);
    omv_kv_int(&kv, "groups", v->job->groups);
    omv_kv_str(&kv, "checkpoint", result_checkpoint(v));
    if (v->state == OMV_JOB_DONE) {
        omv_kv_str(&kv, "final_checkpoint", final_checkpoint(v));
        omv_kv_str(&kv, "final_evaluation", final_evaluation(v));
        if (v->final.ckpt < 0)
            omv_kv_str(&kv, "checkpoint_error", v->ckpt->last_error);
    }
    if (v->ckpt->resumed_from[0])
        omv_kv_str(&kv, "resumed_from", v->ckpt->resumed_from);
    if (omv_tuner_active(v->tuner)) {
        omv_kv_int(&kv, "probe_images_total", (int64_t)omv_tuner_probe_images(v->tuner));
        omv_kv_double(&kv, "probe_seconds_total", omv_tuner_probe_seconds(v->tuner, omv_time_s()),
                      1);
        omv_kv_section(&kv, "phases");
        omv_tuner_phases_kv(v->tuner, &kv);
    }
    omv_kv_section(&kv, "history");
    for (size_t i = 0; i < v->eval->n_history; i++) {
        char key[32], val[128];
        const omv_eval_point_t *h = &v->eval->history[i];
        snprintf(key, sizeof(key), "eval_%zu", i + 1);
        snprintf(val, sizeof(val), "epoch=%.2f wall_seconds=%.1f test_accuracy=%.4f", h->epoch,
                 h->wall_s, h->accuracy);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_end(&kv);
}

static void jobs_current(const omv_daemon_t *d, omv_kv_t *kv)
{
    const omv_run_view_t view = view_of(d), *v = &view;
    omv_kv_section(kv, "current");
    if (d->run == NULL) {
        omv_kv_str(kv, "state", "idle");
        return;
    }
    omv_kv_int(kv, "id", (int64_t)v->id);
    omv_kv_str(kv, "name", v->job->name);
    omv_kv_str(kv, "file", v->path);
    omv_kv_str(kv, "state", omv_run_state_names[v->state]);
    omv_kv_double(kv, "epoch", v->epoch, 3);
    omv_kv_int(kv, "epochs", v->job->epochs);
    omv_kv_double(kv, "test_accuracy", omv_eval_last_accuracy(v->eval), 4);
    omv_kv_double(kv, "wall_seconds", v->wall_seconds, 1);
    omv_kv_int(kv, "workers_alive", omv_members_live_trainers(d->members));
}

static void jobs_finished(const omv_jobs_t *jobs, double now, omv_kv_t *kv)
{
    char key[64];
    for (uint32_t k = 0; k < omv_jobs_n_finished(jobs); k++) {
        const omv_finished_job_t *f = omv_jobs_finished(jobs, k);
        snprintf(key, sizeof(key), "finished_%llu", (unsigned long long)f->id);
        omv_kv_section(kv, key);
        omv_kv_str(kv, "name", f->name);
        omv_kv_str(kv, "file", f->path);
        omv_kv_str(kv, "state", omv_run_state_names[f->state]);
        omv_kv_double(kv, "test_accuracy", f->accuracy, 4);
        omv_kv_double(kv, "epochs", f->epochs, 3);
        omv_kv_double(kv, "wall_seconds", f->wall_s, 1);
        omv_kv_double(kv, "ended_seconds_ago", now - f->end_s, 0);
        if (f->reason[0])
            omv_kv_str(kv, "reason", f->reason);
    }
}

void omv_status_jobs(const omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    const omv_jobs_t *jobs = d->jobs;
    omv_kv_t kv;
    char key[64];
    double now = omv_time_s();
    omv_kv_begin(&kv, out, json);
    omv_kv_section(&kv, "daemon");
    omv_kv_int(&kv, "jobs_submitted_total", (int64_t)jobs->submitted_total);
    omv_kv_int(&kv, "queued", jobs->n_queue);
    omv_kv_int(&kv, "finished_total", jobs->n_finished_total);
    omv_kv_int(&kv, "workers_waiting", omv_members_idle(d->members));
    omv_kv_int(&kv, "once", d->cfg.once);
    jobs_current(d, &kv);
    for (uint32_t i = 0; i < jobs->n_queue; i++) {
        const omv_queued_job_t *q = &jobs->queue[i];
        snprintf(key, sizeof(key), "queued_%llu", (unsigned long long)q->id);
        omv_kv_section(&kv, key);
        omv_kv_int(&kv, "position", i + 1);
        omv_kv_str(&kv, "name", q->job->name);
        omv_kv_str(&kv, "file", q->path);
        omv_kv_double(&kv, "waiting_seconds", now - q->submitted_s, 1);
    }
    jobs_finished(jobs, now, &kv);
    omv_kv_end(&kv);
}
