/* omnivored's event loop: the poll set and dispatch, one cron table of periodic tasks, and one
 * state machine for the way out. It owns the process's state (config, sockets, members, the
 * job queue, the current run); everything else is done by the modules it calls. */
#define OMV_LOG_TAG "daemon"
#include "daemon.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "daemon_config.h"
#include "daemon_priv.h"
#include "log.h"
#include "messages.h"
#include "notify.h"
#include "schedule.h"
#include "status.h"
#include "util.h"

/* How long the daemon waits on its way out for groups to finish applying a step, so that the
 * last checkpoint holds whole steps. */
#define EXIT_SETTLE_S 2.0

/* ---- reloading ---- */

void omv_daemon_set_reload(omv_daemon_t *d, volatile sig_atomic_t *flag, const char *config_path,
                           const char *cli_log_level)
{
    d->reload_flag = flag;
    omv_strlcpy(d->config_path, config_path ? config_path : "", sizeof(d->config_path));
    omv_strlcpy(d->cli_log_level, cli_log_level ? cli_log_level : "", sizeof(d->cli_log_level));
}

/* ---- periodic work: Redis's serverCron with run_with_period ---- */

static void cron_members(omv_daemon_t *d)
{
    omv_messages_expire(d);
}

static void cron_run(omv_daemon_t *d)
{
    if (d->run) {
        omv_run_cron(d->run);
        omv_run_progress(d->run);
    }
}

static void cron_reload(omv_daemon_t *d)
{
    if (d->reload_flag && *d->reload_flag) {
        *d->reload_flag = 0;
        char why[OMV_CONFIG_ERR_MAX + 128];
        omv_notify_reloading();
        omv_daemon_config_reload(d, why, sizeof(why));
        omv_notify_reloaded();
    }
}

static void cron_local(omv_daemon_t *d)
{
    omv_local_watch(d); /* a local worker's process that is gone is dead at once */
}

static void cron_notify(omv_daemon_t *d)
{
    omv_status_notify(d); /* systemd's STATUS= line (rate-limited in notify.c) */
}

typedef struct {
    const char *name;
    int period_ms;
    void (*fn)(omv_daemon_t *d);
} cron_task_t;

/* In this order, each when its period has passed. */
static const cron_task_t cron_tasks[] = {
    {"expire silent members", 100, cron_members}, {"workers on this host", 100, cron_local},
    {"the run's periodic work", 100, cron_run},   {"reload on SIGHUP", 100, cron_reload},
    {"systemd status", 100, cron_notify},
};

#define CRON_TASKS OMV_ARRAY_SIZE(cron_tasks)

/* Runs the tasks that are due; returns ms until the next one is. */
static int64_t cron(omv_daemon_t *d, int64_t *last_ms)
{
    int64_t now = omv_time_ms(), wait = INT64_MAX;
    for (size_t i = 0; i < CRON_TASKS; i++) {
        if (now - last_ms[i] >= cron_tasks[i].period_ms) {
            last_ms[i] = now;
            cron_tasks[i].fn(d);
        }
        int64_t left = last_ms[i] + cron_tasks[i].period_ms - now;
        wait = left < wait ? left : wait;
    }
    return wait;
}

/* ---- life ---- */

omv_daemon_t *omv_daemon_new(const omv_daemon_config_t *cfg, const omv_job_t *job,
                             const char *job_path, const char *job_text)
{
    omv_daemon_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->cfg = *cfg;
    d->created_s = omv_time_s();
    d->local.fd = -1;
    for (int i = 0; i < OMV_DAEMON_MAX_PENDING; i++)
        d->pending[i].id = -1;
    d->members = omv_members_new(OMV_MEMBERS_MAX);
    d->jobs = omv_jobs_new(cfg->state_dir, cfg->once);
    int r = -ENOMEM;
    if (d->members == NULL || d->jobs == NULL)
        goto fail;
    d->router = omv_router_new(cfg->endpoint);
    if (d->router == NULL) {
        r = -errno;
        omv_log_error("cannot bind worker endpoint '%s': %s", cfg->endpoint, omv_strerror(r));
        goto fail;
    }
    omv_refusals_init(&d->refusals, d->router);
    omv_local_open(&d->local);
    d->control = omv_control_new(cfg->control);
    if (d->control == NULL) {
        r = -errno;
        omv_log_error("cannot listen on control socket '%s': %s%s", cfg->control, omv_strerror(r),
                      r == -EADDRINUSE ? " (another omnivored runs there)" : "");
        goto fail;
    }
    omv_jobs_restore(d->jobs);
    if (job != NULL) {
        omv_queued_job_t q = {.id = ++d->jobs->submitted_total};
        q.job = malloc(sizeof(*q.job));
        q.text = strdup(job_text ? job_text : "");
        omv_strlcpy(q.path, job_path, sizeof(q.path));
        if (q.job == NULL || q.text == NULL) {
            omv_jobs_entry_fini(&q);
            goto fail;
        }
        *q.job = *job;
        r = omv_schedule_load(d, &q, 0);
        if (r < 0)
            goto fail;
    }
    omv_log_info("listening for workers on %s, control on %s%s", cfg->endpoint, cfg->control,
                 job ? "" : "; no job: submit one with omnivorectl submit JOB.ini");
    return d;
fail:
    omv_daemon_destroy(&d);
    errno = -r;
    return NULL;
}

void omv_daemon_destroy(omv_daemon_t **self_p)
{
    omv_daemon_t *d = *self_p;
    if (d == NULL)
        return;
    if (d->control)
        omv_commands_abandon(d);
    omv_control_destroy(&d->control);
    omv_run_destroy(&d->run);
    omv_local_close(&d->local);
    omv_router_destroy(&d->router);
    omv_jobs_destroy(&d->jobs);
    omv_members_destroy(&d->members);
    free(d);
    *self_p = NULL;
}

/* ---- the way out ---- */

/* Asked to stop (a signal or the control socket): the run writes its last checkpoint of whole
 * steps, without waiting on the workers for long. Returns whether the loop may end. */
static int stopping(omv_daemon_t *d, volatile sig_atomic_t *stop)
{
    if ((*stop || d->shutdown) && d->stopping_ms == 0) {
        d->stopping_ms = omv_time_ms();
        omv_notify_stopping();
        if (d->run)
            omv_run_stop(d->run, OMV_RUN_STOP_EXIT, EXIT_SETTLE_S);
    }
    if (d->stopping_ms == 0)
        return 0;
    if (d->run == NULL)
        return 1;
    omv_run_progress(d->run);
    return d->run->exit_ready;
}

/* Workers of an unfinished job, and idle ones, wait for a daemon to come back (a restart
 * resumes from the checkpoint just written). */
static void say_goodbye(omv_daemon_t *d)
{
    const char *why = "daemon is shutting down";
    if (d->run && !OMV_JOB_OVER(d->run->state))
        omv_members_stop_all(d->members, d->router, MEMBER_ALIVE, MEMBER_ALIVE, why, 1);
    omv_members_stop_all(d->members, d->router, MEMBER_IDLE, MEMBER_IDLE, why, 1);
}

/* One turn: waits for the sockets (at most until the next cron task), handles what came. */
static int turn(omv_daemon_t *d, int64_t wait)
{
    int fds[2] = {omv_control_fd(d->control), d->local.fd};
    short revents[2] = {0, 0};
    int router_ready = 0, pipes_ready = 0;
    int r = omv_router_poll(d->router, fds, d->local.fd >= 0 ? 2 : 1, revents, &router_ready,
                            &pipes_ready, wait > 0 ? (int)wait : 0);
    if (r < 0 && r != -EINTR) {
        omv_log_error("poll failed: %s", omv_strerror(r));
        return r;
    }
    if (r > 0 && pipes_ready && d->run)
        omv_run_drain_shards(d->run);
    if (r > 0 && router_ready) {
        omv_messages_drain(d);
        if (d->run)
            omv_run_progress(d->run);
    }
    if (r > 0 && (revents[0] & POLLIN))
        omv_control_serve(d->control, omv_commands_dispatch, d);
    if (r > 0 && (revents[1] & POLLIN))
        omv_local_accept(d);
    return 0;
}

int omv_daemon_run(omv_daemon_t *d, volatile sig_atomic_t *stop)
{
    int64_t last_ms[CRON_TASKS];
    for (size_t i = 0; i < CRON_TASKS; i++)
        last_ms[i] = omv_time_ms();
    for (;;) {
        if (stopping(d, stop))
            break;
        int64_t wait = cron(d, last_ms);
        if (d->stopping_ms && wait > 10)
            wait = 10;
        int r = turn(d, wait);
        if (r < 0)
            return r;
        /* Answers first, so a deferred one sees the run it asked about before the next job
         * replaces it. */
        omv_commands_poll(d);
        if (!d->stopping_ms)
            omv_schedule_poll(d);
        omv_notify_watchdog();
    }
    omv_commands_poll(d); /* the last checkpoint may be the one a request waits for */
    say_goodbye(d);
    omv_log_info("stopped");
    return 0;
}
