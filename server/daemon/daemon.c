/* omnivored's event loop: the poll set and dispatch, one cron table of periodic tasks, and one
 * state machine for the way out. It owns the process's state (config, sockets, members, the
 * job queue, the current run); everything else is done by the modules it calls. */
#define OMV_LOG_TAG "daemon"
#include "daemon.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allow.h"
#include "cert.h"
#include "commands.h"
#include "daemon_config.h"
#include "daemon_priv.h"
#include "log.h"
#include "messages.h"
#include "notify.h"
#include "uplink.h"
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
    omv_strlcpy(d->reload.config_path, config_path ? config_path : "",
                sizeof(d->reload.config_path));
    omv_strlcpy(d->reload.cli_log_level, cli_log_level ? cli_log_level : "",
                sizeof(d->reload.cli_log_level));
}

/* ---- periodic work: Redis's serverCron with run_with_period ---- */

static void cron_members(omv_daemon_t *d)
{
    if (d->shard_role)
        omv_uplink_cron(d->uplink); /* the coordinator declares workers dead; we keep in touch */
    else
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
        omv_daemon_config_reload(&d->reload, &d->cfg, why, sizeof(why));
        omv_notify_reloaded();
    }
}

static void cron_control(omv_daemon_t *d)
{
    omv_control_expire(d->control); /* a client that says nothing is let go */
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
    {"expire silent members", EXPIRE_PERIOD_MS, cron_members},
    {"the run's periodic work", 100, cron_run},
    {"reload on SIGHUP", 100, cron_reload},
    {"control clients past their time", 100, cron_control},
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

/* ---- CURVE ---- */

static int loopback(const char *endpoint)
{
    return strncmp(endpoint, "tcp://127.", 10) == 0 ||
           strncmp(endpoint, "tcp://localhost:", 16) == 0 ||
           strncmp(endpoint, "tcp://[::1]:", 12) == 0;
}

/* ZAP: a key connects when the allow-list folder has it. */
static int admit(void *ctx, const char *key)
{
    omv_daemon_t *d = ctx;
    unsigned roles;
    int r = omv_allow_find(d->allow_dir, key, &roles);
    if (r == 1)
        return 1;
    char why[OMV_WIRE_REASON_MAX];
    snprintf(why, sizeof(why), "key %.8s... is not in the allow-list folder %s%s%s", key,
             d->allow_dir, r < 0 ? ": " : "", r < 0 ? omv_strerror(r) : "");
    omv_refusals_count(&d->refusals, OMV_REFUSE_AUTH, "a CURVE handshake", why);
    return 0;
}

/* Decides on CURVE and reads the daemon's key into secret[cap]. Returns 0 (d->curve says
 * whether it is on, and *ret is filled when it is) or a negative errno after logging what to
 * do. */
static int setup_curve(omv_daemon_t *d, omv_router_curve_t *ret, char *secret, size_t cap)
{
    const omv_daemon_config_t *cfg = &d->cfg;
    int tcp = strncmp(cfg->endpoint, "tcp://", 6) == 0;
    if (strcmp(cfg->curve, "yes") != 0 && strcmp(cfg->curve, "no") != 0 &&
        strcmp(cfg->curve, "auto") != 0) {
        omv_log_error("[security] curve = '%s' is not yes, no or auto", cfg->curve);
        return -EINVAL;
    }
    d->curve = strcmp(cfg->curve, "yes") == 0 || (strcmp(cfg->curve, "auto") == 0 && tcp);
    if (!d->curve) {
        if (tcp && !loopback(cfg->endpoint))
            omv_log_warn("[security] curve = no on %s: anyone who reaches it can join and "
                         "steer training",
                         cfg->endpoint);
        return 0;
    }
    char path[OMV_JOB_PATH_MAX + 256], err[OMV_CONFIG_ERR_MAX] = "";
    omv_cert_t cert = {.secret_key = ""};
    omv_cert_path(cfg->secret_key, path, sizeof(path));
    omv_cert_path(cfg->allow_dir, d->allow_dir, sizeof(d->allow_dir));
    omv_strlcpy(d->secret_key_path, path, sizeof(d->secret_key_path));
    omv_cert_path(cfg->coordinator_key, d->coordinator_key, sizeof(d->coordinator_key));
    if (omv_cert_read(path, &cert, err) < 0 || cert.secret_key[0] == '\0') {
        omv_log_error("CURVE is on for %s but the daemon's secret key cannot be used (%s%s); "
                      "make one with omnivorectl keygen daemon DIR and set [security] "
                      "secret_key, or set [security] curve = no on a closed network",
                      cfg->endpoint, err[0] ? err : path, err[0] ? "" : ": no secret-key");
        return -EACCES;
    }
    int r = omv_allow_check(d->allow_dir);
    if (r < 0) {
        omv_log_error("CURVE is on but the allow-list folder %s cannot be read: %s", d->allow_dir,
                      omv_strerror(r));
        return r;
    }
    omv_strlcpy(secret, cert.secret_key, cap);
    memset(&cert, 0, sizeof(cert));
    *ret = (omv_router_curve_t){secret, admit, d};
    return 0;
}

/* ---- life ---- */

/* Without a job at start and without a configured limit, frames are held to this. */
#define DEFAULT_MAX_MESSAGE (64 << 20)
/* With a start job, frames may be as large as its messages, and at least this: the jobs
 * submitted after it (a CNN after the MLP example, 3.5 MB) fit without a restart. */
#define MIN_MAX_MESSAGE (16 << 20)

/* The worker endpoint's frame limit: the configured one, else what the start job's messages
 * need (at least MIN_MAX_MESSAGE), else the default. */
static int64_t max_message(const omv_daemon_config_t *cfg, const omv_job_t *job)
{
    if (cfg->max_message_bytes > 0)
        return cfg->max_message_bytes;
    int64_t need = job ? omv_run_message_bytes(job) : -EINVAL;
    return need <= 0 ? DEFAULT_MAX_MESSAGE : need > MIN_MAX_MESSAGE ? need : MIN_MAX_MESSAGE;
}

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
    d->admin_gid = (gid_t)-1;
    if (cfg->admin_group[0]) {
        struct group *g = getgrnam(cfg->admin_group);
        if (g == NULL) {
            omv_log_error("[security] admin_group '%s' is not a group on this machine",
                          cfg->admin_group);
            free(d);
            errno = EINVAL;
            return NULL;
        }
        d->admin_gid = g->gr_gid;
    }
    d->shard_role = strcmp(cfg->role, "shard") == 0;
    if (!d->shard_role && strcmp(cfg->role, "coordinator") != 0) {
        omv_log_error("[daemon] role = '%s' is not coordinator or shard", cfg->role);
        free(d);
        errno = EINVAL;
        return NULL;
    }
    if (d->shard_role && job != NULL) {
        omv_log_error("a shard server takes its jobs from the coordinator: no --job");
        free(d);
        errno = EINVAL;
        return NULL;
    }
    d->members = omv_members_new(OMV_MEMBERS_MAX);
    d->jobs = omv_jobs_new(cfg->state_dir, cfg->once);
    int r = -ENOMEM;
    if (d->members == NULL || d->jobs == NULL)
        goto fail;
    omv_router_curve_t curve;
    char secret[OMV_CERT_KEY_LEN + 1];
    r = setup_curve(d, &curve, secret, sizeof(secret));
    if (r < 0)
        goto fail;
    d->router = omv_router_new(cfg->endpoint, max_message(cfg, job), d->curve ? &curve : NULL);
    memset(secret, 0, sizeof(secret));
    if (d->router == NULL) {
        r = -errno;
        omv_log_error("cannot bind worker endpoint '%s': %s", cfg->endpoint, omv_strerror(r));
        goto fail;
    }
    omv_refusals_init(&d->refusals, d->router);
    if (d->shard_role) {
        omv_uplink_env_t up = {.router = d->router,
                               .members = d->members,
                               .refusals = &d->refusals,
                               .backup_refusals = &d->backup_refusals,
                               .cfg = &d->cfg,
                               .curve = d->curve,
                               .secret_key = d->secret_key_path,
                               .coordinator_key = d->coordinator_key,
                               .run = &d->run};
        d->uplink = omv_uplink_new(&up);
        r = d->uplink ? 0 : -errno;
        if (r < 0)
            goto fail;
    } else {
        omv_local_open(&d->local);
    }
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
    omv_uplink_destroy(&d->uplink);
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
    omv_run_view_t v;
    omv_run_view(d->run, &v);
    return v.exit_ready;
}

/* Workers of an unfinished job, and idle ones, wait for a daemon to come back (a restart
 * resumes from the checkpoint just written). */
static void say_goodbye(omv_daemon_t *d)
{
    const char *why = "daemon is shutting down";
    if (d->run && !OMV_JOB_OVER(omv_run_state(d->run)))
        omv_members_stop_all(d->members, d->router, OMV_MEMBER_ALIVE, OMV_MEMBER_ALIVE, why, 1);
    omv_members_stop_all(d->members, d->router, OMV_MEMBER_IDLE, OMV_MEMBER_IDLE, why, 1);
    /* Shard servers drop their runs now and register again when the coordinator is back
     * (a restart resumes the job from its last checkpoint and assigns the parts anew). */
    omv_msg_t stop = {.type = OMV_MSG_STOP};
    omv_strlcpy(stop.u.stop.reason, why, sizeof(stop.u.stop.reason));
    stop.u.stop.reconnect = 1;
    for (uint32_t i = 0; i < d->servers.n; i++)
        if (d->servers.rec[i].alive)
            omv_servers_send(&d->servers, d->router, &d->servers.rec[i], &stop, NULL);
}

/* Polls fds and the router without waiting until something comes or spin_until_s, yielding
 * the CPU between tries. Returns as omv_router_poll (0: nothing came). */
static int spin_poll(omv_daemon_t *d, struct pollfd *fds, int nfds, int *router_ready,
                     int *pipes_ready)
{
    for (;;) {
        int r = omv_router_poll(d->router, fds, nfds, router_ready, pipes_ready, 0);
        if (r != 0 || omv_time_s() >= d->spin_until_s)
            return r;
        sched_yield();
    }
}

/* One turn: waits for the sockets (at most until the next cron task), handles what came. After
 * an envelope from a trainer on this host, the wait begins with a poll of up to [daemon]
 * spin_us: the rest of its group's step (the other members' pushes, its next pull) is then
 * taken in without a wake-up, which costs about 0.1 ms on a virtual machine; on 2 cores and 2
 * trainers, 2 workers train 7% faster (85.5k -> 91.6k images/s, 4 interleaved rounds). */
static int turn(omv_daemon_t *d, int64_t wait)
{
    struct pollfd fds[OMV_ROUTER_FDS_MAX];
    uint32_t who[OMV_MEMBERS_MAX];
    int nfds = omv_control_pollfds(d->control, fds, OMV_CONTROL_POLL_MAX);
    int local = -1; /* where the shared-memory socket is in fds */
    if (d->local.fd >= 0) {
        local = nfds++;
        fds[local] = (struct pollfd){d->local.fd, POLLIN, 0};
    }
    /* Then each local worker's connection: its envelopes come there (server/local.h). */
    int conns = nfds;
    int n_conns = omv_local_pollfds(d, fds + conns, who, OMV_ROUTER_FDS_MAX - conns);
    nfds += n_conns;
    int router_ready = 0, pipes_ready = 0, r = 0;
    if (n_conns > 0 && wait > 0 && omv_time_s() < d->spin_until_s)
        r = spin_poll(d, fds, nfds, &router_ready, &pipes_ready);
    if (r == 0)
        r = omv_router_poll(d->router, fds, nfds, &router_ready, &pipes_ready,
                            wait > 0 ? (int)wait : 0);
    for (int k = 0; r > 0 && k < n_conns; k++)
        if (fds[conns + k].revents != 0)
            d->spin_until_s = omv_time_s() + (double)d->cfg.spin_us * 1e-6;
    if (r < 0 && r != -EINTR) {
        omv_log_error("poll failed: %s", omv_strerror(r));
        return r;
    }
    if (r > 0 && pipes_ready && d->run)
        omv_run_drain_shards(d->run);
    if (r > 0 && n_conns > 0)
        omv_messages_drain_local(d, fds + conns, who, n_conns);
    if (r > 0 && router_ready) {
        omv_messages_drain(d);
        if (d->shard_role)
            omv_uplink_drain(d->uplink);
        if (d->run)
            omv_run_progress(d->run);
    }
    if (r > 0 && d->shard_role)
        omv_uplink_poll(d->uplink); /* a backup's orders that waited for a cut's steps */
    if (r > 0)
        omv_control_serve(d->control, fds, local >= 0 ? local : conns, omv_commands_dispatch, d);
    if (r > 0 && local >= 0 && (fds[local].revents & POLLIN))
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
