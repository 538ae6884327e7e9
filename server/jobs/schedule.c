/* Which job runs: loading, moving on to the next queued job, recording ends. */
#define OMV_LOG_TAG "omnivored"
#include "schedule.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "coordinator.h"
#include "log.h"
#include "util.h"

int omv_schedule_load(omv_daemon_t *d, omv_queued_job_t *q, int submitted)
{
    omv_run_destroy(&d->run);
    /* A job whose model goes to shard servers: its run is the coordinator's. */
    omv_coord_arg_t coord = {&d->servers, d->load_degraded};
    omv_run_env_t env = {.router = d->router,
                         .members = d->members,
                         .refusals = &d->refusals,
                         .state_dir = d->cfg.state_dir,
                         .checkpoint_root = d->cfg.checkpoint_root,
                         .once = d->cfg.once,
                         .role = q->job->servers > 0 ? &omv_coord_role : NULL,
                         .role_arg = &coord};
    d->load_degraded = 0;
    d->run = omv_run_new(&env, q->job, q->path, q->text, q->id);
    int r = d->run ? 0 : -errno;
    /* Shard servers that registered already and hold nothing. */
    for (uint32_t i = 0; r == 0 && i < d->servers.n && omv_coord_wants_servers(d->run); i++)
        if (d->servers.rec[i].alive && d->servers.rec[i].run_id == 0)
            omv_coord_add_server(d->run, &d->servers.rec[i]);
    if (r == 0) {
        omv_jobs_set_current(d->jobs, submitted ? q->id : 0, q->path, q->sets);
        /* Workers that waited for a job register again, into this one. */
        char why[OMV_WIRE_REASON_MAX];
        snprintf(why, sizeof(why), "job '%s' is starting: register again", q->job->name);
        omv_members_stop_all(d->members, d->router, OMV_MEMBER_IDLE, OMV_MEMBER_DONE, why, 1);
    }
    omv_jobs_entry_fini(q);
    return r;
}

static void record(omv_jobs_t *jobs, const omv_run_t *run)
{
    omv_run_view_t v;
    omv_run_view(run, &v);
    omv_finished_job_t f = {
        .id = v.id,
        .state = v.state,
        .accuracy = omv_run_result_accuracy(run),
        .epochs = omv_run_epoch(run),
        .wall_s = omv_run_wall_seconds(run),
        .end_s = omv_time_s(),
    };
    omv_strlcpy(f.name, v.job->name, sizeof(f.name));
    omv_strlcpy(f.path, v.path, sizeof(f.path));
    omv_strlcpy(f.reason, v.state == OMV_JOB_DONE ? "" : v.fail_reason, sizeof(f.reason));
    omv_jobs_record(jobs, &f);
}

static void record_unloadable(omv_jobs_t *jobs, uint64_t id, const char *name, const char *path,
                              const char *why)
{
    omv_finished_job_t f = {
        .id = id, .state = OMV_JOB_FAILED, .accuracy = NAN, .end_s = omv_time_s()};
    omv_strlcpy(f.name, name, sizeof(f.name));
    omv_strlcpy(f.path, path, sizeof(f.path));
    omv_strlcpy(f.reason, why, sizeof(f.reason));
    omv_jobs_record(jobs, &f);
}

/* Loads the first queued job that loads; the current job (over) is unloaded. */
static void start_next(omv_daemon_t *d)
{
    omv_queued_job_t q;
    while (omv_jobs_pop(d->jobs, &q)) {
        omv_log_info("starting job %llu '%s' (%s); %u more queued", (unsigned long long)q.id,
                     q.job->name, q.path, d->jobs->n_queue);
        uint64_t id = q.id;
        char name[64], path[OMV_JOB_PATH_MAX];
        omv_strlcpy(name, q.job->name, sizeof(name));
        omv_strlcpy(path, q.path, sizeof(path));
        int r = omv_schedule_load(d, &q, 1);
        if (r == 0)
            return;
        char why[160];
        snprintf(why, sizeof(why), "could not be loaded: %s (see the daemon's log)",
                 omv_strerror(r));
        omv_log_error("job %llu '%s' %s", (unsigned long long)id, name, why);
        record_unloadable(d->jobs, id, name, path, why);
    }
}

/* The run lost a shard server with no replica: it is made again from its last checkpoint, and
 * its workers register again into the new run, which waits for its servers. */
static void rewind_run(omv_daemon_t *d)
{
    omv_run_view_t v;
    omv_run_view(d->run, &v);
    omv_queued_job_t q = {.id = v.id};
    q.job = malloc(sizeof(*q.job));
    q.text = strdup(v.text ? v.text : "");
    if (q.job == NULL || q.text == NULL) {
        omv_jobs_entry_fini(&q);
        omv_run_finish(d->run, OMV_JOB_FAILED, v.rewind->reason);
        return;
    }
    *q.job = *v.job;
    omv_strlcpy(q.path, v.path, sizeof(q.path));
    int submitted = d->jobs->current && d->jobs->current_id == v.id;
    omv_strlcpy(q.sets, submitted ? d->jobs->current_sets : "", sizeof(q.sets));
    char why[OMV_WIRE_REASON_MAX];
    snprintf(why, sizeof(why),
             "job '%s' goes on from %s, over its shard servers anew: register again", v.job->name,
             v.rewind->degraded ? "a cut of now" : "its last checkpoint");
    omv_members_stop_all(d->members, d->router, OMV_MEMBER_ALIVE, OMV_MEMBER_DONE, why, 1);
    uint64_t id = q.id;
    char name[64];
    omv_strlcpy(name, v.job->name, sizeof(name));
    d->load_degraded = v.rewind->degraded;
    int r = omv_schedule_load(d, &q, submitted);
    if (r < 0) {
        char fail[160];
        snprintf(fail, sizeof(fail),
                 "could not go back to its last checkpoint: %s (see the daemon's log)",
                 omv_strerror(r));
        omv_log_error("job %llu '%s' %s", (unsigned long long)id, name, fail);
        record_unloadable(d->jobs, id, name, q.path, fail);
    }
}

void omv_schedule_poll(omv_daemon_t *d)
{
    omv_run_view_t v;
    if (d->run)
        omv_run_view(d->run, &v);
    if (d->run && v.rewind->wanted && !OMV_JOB_OVER(v.state))
        rewind_run(d);
    omv_run_t *run = d->run;
    if (run && OMV_JOB_OVER(omv_run_state(run)) && !omv_run_mark_recorded(run))
        record(d->jobs, run);
    if ((run == NULL || OMV_JOB_OVER(omv_run_state(run))) && d->jobs->n_queue > 0 && !d->cfg.once)
        start_next(d);
    omv_jobs_save(d->jobs);
}
