/* The control commands: their table, the dispatcher, and the handlers that change things. */
#define OMV_LOG_TAG "daemon"
#include "commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_config.h"
#include "kv.h"
#include "log.h"
#include "notify.h"
#include "run_checkpoint.h"
#include "schedule.h"
#include "status.h"
#include "util.h"

/* How long `checkpoint` waits for the groups to hold whole steps before it answers that the
 * checkpoint will be written later. */
#define CHECKPOINT_WAIT_MS 5000
/* How long `stop` waits for a checkpoint of whole steps before it stops without one. */
#define STOP_SETTLE_S 10.0

enum {
    NEEDS_JOB = 1 << 0, /* answered only when a job is loaded */
    NO_JSON = 1 << 1,   /* has no JSON form */
    CHANGES = 1 << 2,   /* changes the daemon: root, its user or [security] admin_group only */
};

typedef int (*handler_fn)(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply);

typedef struct {
    const char *name;
    const char *args; /* for the help text; NULL: none */
    int max_args;     /* words after the name; -1: any number */
    unsigned flags;
    handler_fn handler;
} command_t;

/* The client being served (SO_PEERCRED); an unknown one has no rights. */
/* A look at run (its pointers hold until the loop's next turn). */
static omv_run_view_t view_of(const omv_run_t *run)
{
    omv_run_view_t v;
    omv_run_view(run, &v);
    return v;
}

static omv_caller_t caller_of(const omv_daemon_t *d)
{
    omv_caller_t c = {(uid_t)-1, (gid_t)-1, 0};
    omv_control_caller(d->control, &c.uid, &c.gid, &c.pid);
    return c;
}

static int cmd_status(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_status(d, reply, json);
    return 0;
}

static int cmd_workers(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_workers(d, reply, json);
    return 0;
}

static int cmd_servers(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_servers(d, reply, json);
    return 0;
}

static int cmd_groups(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_groups(d, reply, json);
    return 0;
}

static int cmd_metrics(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv, (void)json;
    omv_status_metrics(d, reply);
    return 0;
}

static int cmd_summary(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_summary(d, reply, json);
    return 0;
}

static int cmd_history(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_history(d, reply, json);
    return 0;
}

static int cmd_optimizer(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_optimizer(d, reply, json);
    return 0;
}

static int cmd_jobs(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_status_jobs(d, reply, json);
    return 0;
}

static int cmd_regroup(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    char *end = NULL;
    long g = argc > 1 ? strtol(argv[1], &end, 10) : 0;
    if (argc < 2 || *end != '\0' || g < 1) {
        omv_strbuf_printf(reply, "regroup takes the number of groups, e.g. 'regroup 2'");
        return -EINVAL;
    }
    char why[256];
    int r = omv_run_request_regroup(d->run, (uint32_t)g, why, sizeof(why));
    if (r < 0) {
        omv_strbuf_printf(reply, "%s", why);
        return r;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "regroup");
    omv_kv_int(&kv, "groups_now", omv_groups_count(view_of(d->run).groups));
    omv_kv_int(&kv, "groups_requested", (int64_t)g);
    omv_kv_str(&kv, "when", "at the next step boundary of every group");
    omv_kv_end(&kv);
    return 0;
}

static void checkpoint_reply(const omv_run_t *run, int json, omv_strbuf_t *reply)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "checkpoint");
    omv_kv_str(&kv, "path", view_of(run).ckpt->last_path);
    omv_kv_double(&kv, "write_ms", view_of(run).ckpt->last_ms, 1);
    omv_kv_end(&kv);
}

/* The answer to a `checkpoint` request, once its checkpoint was written or failed. Returns 0 or
 * -EIO, or 1 while it is not ready. */
static int checkpoint_answer(const omv_run_t *run, uint64_t written, uint64_t failed, int json,
                             omv_strbuf_t *reply)
{
    const omv_run_ckpt_t *ck = view_of(run).ckpt;
    if (ck->failed_total != failed) {
        omv_strbuf_printf(reply, "checkpoint failed (see the daemon's log)");
        return -EIO;
    }
    if (ck->written_total == written && !ck->due) {
        /* Given up on (a stop that could not wait): nothing will be written for it. */
        omv_strbuf_printf(reply, "no checkpoint of whole steps could be written (see status)");
        return -EAGAIN;
    }
    if (ck->written_total == written)
        return 1;
    checkpoint_reply(run, json, reply);
    return 0;
}

/* Marks a checkpoint due; answers when it is written (without holding up the loop). */
static int cmd_checkpoint(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    omv_run_t *run = d->run;
    const omv_run_ckpt_t *ck = view_of(run).ckpt;
    uint64_t written = ck->written_total, failed = ck->failed_total;
    char why[256];
    int r = omv_run_request_checkpoint(run, why, sizeof(why));
    if (r < 0) {
        omv_strbuf_printf(reply, "%s", why);
        return r;
    }
    r = checkpoint_answer(run, written, failed, json, reply);
    if (r != 1)
        return r;
    for (int i = 0; i < OMV_DAEMON_MAX_PENDING; i++) {
        omv_pending_ckpt_t *p = &d->pending[i];
        if (p->id >= 0)
            continue;
        int id = omv_control_defer(d->control);
        if (id < 0)
            break;
        *p = (omv_pending_ckpt_t){
            id, omv_run_id(run), written, failed, omv_time_ms() + CHECKPOINT_WAIT_MS, json};
        return OMV_CONTROL_DEFERRED;
    }
    omv_strbuf_printf(reply, "a group is applying a step; the checkpoint will be written when it "
                             "is done (see status)\n");
    return 0;
}

void omv_commands_poll(omv_daemon_t *d)
{
    for (int i = 0; i < OMV_DAEMON_MAX_PENDING; i++) {
        omv_pending_ckpt_t *p = &d->pending[i];
        if (p->id < 0)
            continue;
        omv_strbuf_t body;
        omv_strbuf_init(&body);
        int r = 1;
        if (d->run == NULL || omv_run_id(d->run) != p->run_id) {
            omv_strbuf_printf(&body, "the job ended before its checkpoint was written");
            r = -ENOENT;
        } else {
            r = checkpoint_answer(d->run, p->written, p->failed, p->json, &body);
        }
        if (r == 1 && omv_time_ms() >= p->deadline_ms) {
            omv_strbuf_printf(&body, "a group is applying a step; the checkpoint will be written "
                                     "when it is done (see status)\n");
            r = 0;
        }
        if (r != 1) {
            omv_control_answer(d->control, p->id, r, omv_strbuf_str(&body));
            p->id = -1;
        }
        omv_strbuf_fini(&body);
    }
}

void omv_commands_abandon(omv_daemon_t *d)
{
    for (int i = 0; i < OMV_DAEMON_MAX_PENDING; i++) {
        if (d->pending[i].id >= 0)
            omv_control_answer(d->control, d->pending[i].id, -ESHUTDOWN,
                               "the daemon is shutting down");
        d->pending[i].id = -1;
    }
}

static void submit_reply(const omv_daemon_t *d, uint64_t id, const char *name, const char *path,
                         uint32_t position, int json, omv_strbuf_t *reply)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "submit");
    omv_kv_int(&kv, "id", (int64_t)id);
    omv_kv_str(&kv, "name", name);
    omv_kv_str(&kv, "file", path);
    if (position == 0) {
        int loaded = d->run && omv_run_id(d->run) == id;
        omv_kv_str(&kv, "state", loaded ? omv_run_state_names[omv_run_state(d->run)] : "failed");
        if (!loaded)
            omv_kv_str(&kv, "reason", "could not be loaded (see the daemon's log)");
    } else {
        omv_kv_str(&kv, "state", "queued");
        omv_kv_int(&kv, "position", position);
    }
    omv_kv_end(&kv);
}

/* Checks submit's words before the file is read. Returns 0 or a negative errno with reply. */
static int submit_fits(const omv_daemon_t *d, int argc, char **argv, omv_strbuf_t *reply)
{
    if (d->stopping_ms) {
        omv_strbuf_printf(reply, "the daemon is shutting down: submit to the next one");
        return -ESHUTDOWN;
    }
    if (d->cfg.once) {
        omv_strbuf_printf(reply, "this daemon runs one job only (omnivored --once, as "
                                 "omnivorectl run starts it); start omnivored without --once to "
                                 "queue jobs");
        return -EPERM;
    }
    if (argc < 2) {
        omv_strbuf_printf(reply, "submit takes a job file, e.g. 'submit /etc/omnivore/job.ini "
                                 "train.learning_rate=0.05'");
        return -EINVAL;
    }
    if (argv[1][0] != '/') {
        omv_strbuf_printf(reply,
                          "submit needs an absolute path ('%s' is relative to what?); "
                          "omnivorectl submit makes it absolute",
                          argv[1]);
        return -EINVAL;
    }
    if (d->jobs->n_queue == OMV_JOBS_MAX_QUEUE) {
        omv_strbuf_printf(reply, "the queue is full (%d jobs); wait, or drop one with 'stop ID'",
                          OMV_JOBS_MAX_QUEUE);
        return -EAGAIN;
    }
    return 0;
}

/* Whether the daemon may write the job's checkpoints, checked at submit rather than found out
 * at the first checkpoint. Returns 0 or -EINVAL with reply. */
static int checkpoints_fit(const omv_daemon_t *d, const omv_job_t *job, omv_strbuf_t *reply)
{
    char dir[OMV_JOB_PATH_MAX], why[1024];
    omv_run_ckpt_dir(job, d->cfg.state_dir, dir, sizeof(dir));
    /* Writable first: under the sandbox its fix (ReadWritePaths=) is the one to name first. */
    if (dir[0] == '\0' || (omv_run_ckpt_check_dir(dir, why, sizeof(why)) == 0 &&
                           omv_run_ckpt_confined(dir, d->cfg.state_dir, d->cfg.checkpoint_root, why,
                                                 sizeof(why)) == 0))
        return 0;
    omv_log_warn("refused a submitted job: %s", why);
    omv_strbuf_printf(reply, "job refused: %s", why);
    return -EINVAL;
}

/* submit PATH [SECTION.KEY=VALUE ...]: the file is read and checked once, here. */
static int cmd_submit(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    int r = submit_fits(d, argc, argv, reply);
    if (r < 0)
        return r;
    const char *path = argv[1];
    char sets[OMV_JOBS_SETS_MAX], err[OMV_CONFIG_ERR_MAX];
    if (omv_jobs_join_sets(argv + 2, argc - 2, sets) < 0) {
        omv_strbuf_printf(reply, "job refused: overrides longer than %d bytes",
                          OMV_JOBS_SETS_MAX - 1);
        return -EINVAL;
    }
    omv_job_t *job;
    char *text;
    omv_caller_t who = caller_of(d);
    if (omv_jobs_parse(&who, path, argv + 2, argc - 2, &job, &text, err) < 0) {
        omv_log_warn("refused a submitted job: %s", err);
        omv_strbuf_printf(reply, "job refused: %s", err);
        return -EINVAL;
    }
    if (checkpoints_fit(d, job, reply) < 0) {
        free(job);
        free(text);
        return -EINVAL;
    }
    char name[64];
    omv_strlcpy(name, job->name, sizeof(name));
    uint64_t id = (uint64_t)omv_jobs_add(d->jobs, job, text, path, sets, 0);
    int ahead = d->run && !OMV_JOB_OVER(omv_run_state(d->run));
    omv_log_info("job %llu '%s' submitted (%s)%s", (unsigned long long)id, name, path,
                 ahead ? "; it waits for the current job" : "");
    uint32_t position = d->jobs->n_queue;
    if (!ahead) {
        omv_schedule_poll(d); /* records the job that is over, then loads this one */
        position = 0;
    }
    submit_reply(d, id, name, path, position, json, reply);
    return 0;
}

static int stop_queued(omv_daemon_t *d, const char *what, int json, omv_strbuf_t *reply)
{
    uint64_t id;
    char name[64];
    if (!omv_jobs_drop(d->jobs, what, &id, name)) {
        omv_strbuf_printf(reply, "no job '%s' is running or queued; see 'jobs'", what);
        return -ENOENT;
    }
    omv_log_info("job %llu '%s' dropped from the queue", (unsigned long long)id, name);
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "stop");
    omv_kv_int(&kv, "id", (int64_t)id);
    omv_kv_str(&kv, "name", name);
    omv_kv_str(&kv, "state", "dropped from the queue");
    omv_kv_end(&kv);
    return 0;
}

/* stop [ID|NAME]: the current job (checkpointed first) or a queued one (dropped). */
static int cmd_stop(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    if (d->stopping_ms) {
        omv_strbuf_printf(reply, "the daemon is shutting down: the job is checkpointed and goes "
                                 "on when it starts again");
        return -ESHUTDOWN;
    }
    omv_run_t *run = d->run;
    omv_run_view_t v = run ? view_of(run) : (omv_run_view_t){0};
    const char *what = argc > 1 ? argv[1] : NULL;
    if (what != NULL && !(run && omv_jobs_matches(v.id, v.job->name, what)))
        return stop_queued(d, what, json, reply);
    if (run == NULL || OMV_JOB_OVER(v.state)) {
        omv_strbuf_printf(reply, "no job is running%s%s%s", run ? " (job '" : "",
                          run ? v.job->name : "", run ? "' is over)" : "");
        return -ENOENT;
    }
    const char *how = "already stopping";
    if (v.stopping != OMV_RUN_STOP_JOB) {
        how = v.state == OMV_JOB_RUNNING && v.ckpt->enabled
                  ? "stopping once a checkpoint of whole steps is written; submitting the job "
                    "again resumes from there"
                  : "stopped";
        omv_run_stop(run, OMV_RUN_STOP_JOB, STOP_SETTLE_S);
        v = view_of(run); /* it may have stopped at once */
    }
    omv_log_info("stop requested for job %llu '%s': %s", (unsigned long long)v.id, v.job->name,
                 how);
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "stop");
    omv_kv_int(&kv, "id", (int64_t)v.id);
    omv_kv_str(&kv, "name", v.job->name);
    omv_kv_str(&kv, "state", omv_run_state_names[v.state]);
    omv_kv_str(&kv, "how", how);
    omv_kv_end(&kv);
    return 0;
}

static int cmd_shutdown(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv, (void)json;
    omv_log_info("shutdown requested over the control socket");
    d->shutdown = 1;
    omv_notify_stopping();
    omv_strbuf_printf(reply, "shutting down\n");
    return 0;
}

/* reload: what SIGHUP does, answered once it is done (systemctl reload runs omnivorectl reload,
 * so it returns after the new configuration applies, and fails with the reason when the file is
 * broken). */
static int cmd_reload(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)argc, (void)argv;
    char why[OMV_CONFIG_ERR_MAX + 128];
    int r = omv_daemon_config_reload(&d->reload, &d->cfg, why, sizeof(why));
    if (r < 0) {
        omv_strbuf_printf(reply, "%s", why);
        return r;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "reload");
    omv_kv_str(&kv, "config", d->reload.config_path);
    omv_kv_str(&kv, "log_level", d->cfg.log_level);
    omv_kv_int(&kv, "reloads_total", (int64_t)d->reload.reloads_total);
    omv_kv_end(&kv);
    return 0;
}

static int cmd_help(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply);

static const command_t commands[] = {
    {"status", NULL, 0, 0, cmd_status},
    {"workers", NULL, 0, 0, cmd_workers},
    {"servers", NULL, 0, 0, cmd_servers},
    {"groups", NULL, 0, NEEDS_JOB, cmd_groups},
    {"metrics", NULL, 0, NO_JSON, cmd_metrics},
    {"summary", NULL, 0, NEEDS_JOB, cmd_summary},
    {"history", NULL, 0, NEEDS_JOB, cmd_history},
    {"checkpoint", NULL, 0, NEEDS_JOB | CHANGES, cmd_checkpoint},
    {"optimizer", NULL, 0, 0, cmd_optimizer},
    {"regroup", "G", 1, NEEDS_JOB | CHANGES, cmd_regroup},
    {"jobs", NULL, 0, 0, cmd_jobs},
    {"submit", "PATH [S.K=V ...]", -1, CHANGES, cmd_submit},
    {"stop", "[ID|NAME]", 1, CHANGES, cmd_stop},
    {"reload", NULL, 0, CHANGES, cmd_reload},
    {"shutdown", NULL, 0, CHANGES, cmd_shutdown},
    {"help", NULL, 0, 0, cmd_help},
};

static int cmd_help(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    (void)d, (void)argc, (void)argv, (void)json;
    omv_strbuf_printf(reply, "commands: ");
    for (size_t i = 0; i < OMV_ARRAY_SIZE(commands); i++)
        omv_strbuf_printf(reply, "%s%s%s%s", i ? ", " : "", commands[i].name,
                          commands[i].args ? " " : "", commands[i].args ? commands[i].args : "");
    omv_strbuf_printf(reply, " (--json for JSON, but not metrics)\n");
    return 0;
}

/* Takes --json out of argv (after the name); returns whether it was there. */
static int take_json(int *argc, char **argv)
{
    int json = 0, n = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else
            argv[n++] = argv[i];
    }
    *argc = n;
    return json;
}

/* A changing command is for root, the daemon's user and the admin group; each one is logged
 * with who asked. */
static int may_change(const omv_daemon_t *d, const command_t *c, omv_strbuf_t *reply)
{
    omv_caller_t who = caller_of(d);
    if (!omv_caller_may_change(&who, d->admin_gid)) {
        omv_log_warn("control: refused '%s' from uid %u (pid %d): read-only caller", c->name,
                     (unsigned)who.uid, (int)who.pid);
        omv_strbuf_printf(reply,
                          "'%s' changes the daemon: only root, the daemon's user or the group "
                          "[security] admin_group%s%s%s may; uid %u may only read",
                          c->name, d->cfg.admin_group[0] ? " ('" : "", d->cfg.admin_group,
                          d->cfg.admin_group[0] ? "')" : "", (unsigned)who.uid);
        return 0;
    }
    omv_log_info("control: '%s' from uid %u (pid %d)", c->name, (unsigned)who.uid, (int)who.pid);
    return 1;
}

/* Checks the words and flags against the command's entry. Returns 0 or -errno with reply. */
static int command_fits(const omv_daemon_t *d, const command_t *c, int argc, char **argv, int json,
                        omv_strbuf_t *reply)
{
    if (c->max_args >= 0 && argc - 1 > c->max_args) {
        if (c->handler == cmd_stop)
            omv_strbuf_printf(reply, "stop takes at most one job (an id or a name)");
        else
            omv_strbuf_printf(reply, "'%s' takes no argument '%s'", c->name, argv[c->max_args + 1]);
        return -EINVAL;
    }
    if ((c->flags & NO_JSON) && json) {
        omv_strbuf_printf(reply, "%s are Prometheus text only; drop --json", c->name);
        return -EINVAL;
    }
    if ((c->flags & CHANGES) && !may_change(d, c, reply))
        return -EPERM;
    if ((c->flags & NEEDS_JOB) && d->run == NULL) {
        omv_strbuf_printf(reply, "no job is loaded; submit one with 'omnivorectl submit "
                                 "JOB.ini'");
        return -ENOENT;
    }
    return 0;
}

int omv_commands_dispatch(void *ctx, int argc, char **argv, omv_strbuf_t *reply)
{
    omv_daemon_t *d = ctx;
    /* systemd's STATUS= line is refreshed from the cron; a request refreshes it too, so that it
     * is current whenever someone looks (rate-limited). */
    omv_status_notify(d);
    for (size_t i = 0; i < OMV_ARRAY_SIZE(commands); i++) {
        const command_t *c = &commands[i];
        if (strcmp(argv[0], c->name) != 0)
            continue;
        int json = take_json(&argc, argv);
        int r = command_fits(d, c, argc, argv, json, reply);
        return r < 0 ? r : c->handler(d, argc, argv, json, reply);
    }
    omv_strbuf_printf(reply, "unknown command '%s'; try 'help'", argv[0]);
    return -EINVAL;
}
