/* omnivored's jobs: a long-running daemon takes jobs submitted over the control socket, runs
 * them one at a time in the order they came, keeps its workers registered between them, and
 * remembers how the last ones ended. Control commands: submit, stop, jobs. */
#define OMV_LOG_TAG "omnivored"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_priv.h"
#include "job.h"
#include "kv.h"
#include "log.h"
#include "util.h"

/* How long `stop` waits for a checkpoint of whole steps before it stops without one. */
#define STOP_SETTLE_S 10.0

static double last_accuracy(const omv_daemon_t *d)
{
    return d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
}

/* Puts the current job's end in the ring of finished jobs, once. */
static void record_end(omv_daemon_t *d)
{
    if (!d->has_job || !OMV_JOB_OVER(d->state) || d->job_recorded)
        return;
    d->job_recorded = 1;
    d->queue_dirty = 1;
    finished_job_t *f = &d->finished[d->n_finished_total++ % OMV_DAEMON_MAX_FINISHED];
    memset(f, 0, sizeof(*f));
    f->id = d->job_id;
    omv_strlcpy(f->name, d->job.name, sizeof(f->name));
    omv_strlcpy(f->path, d->job_path, sizeof(f->path));
    f->state = d->state;
    f->accuracy = last_accuracy(d);
    f->epochs = omv_daemon_epoch(d);
    f->wall_s = omv_daemon_wall_seconds(d);
    f->end_s = omv_time_s();
    omv_strlcpy(f->reason, d->state == JOB_DONE ? "" : d->fail_reason, sizeof(f->reason));
}

static void record_unloadable(omv_daemon_t *d, const queued_job_t *q, const char *why)
{
    finished_job_t *f = &d->finished[d->n_finished_total++ % OMV_DAEMON_MAX_FINISHED];
    memset(f, 0, sizeof(*f));
    f->id = q->id;
    omv_strlcpy(f->name, q->job->name, sizeof(f->name));
    omv_strlcpy(f->path, q->path, sizeof(f->path));
    f->state = JOB_FAILED;
    f->accuracy = NAN;
    f->end_s = omv_time_s();
    omv_strlcpy(f->reason, why, sizeof(f->reason));
}

/* Loads the first queued job that loads; the current job (over) is unloaded. */
static void start_next(omv_daemon_t *d)
{
    while (d->n_queue > 0) {
        queued_job_t q = d->queue[0];
        memmove(&d->queue[0], &d->queue[1], (d->n_queue - 1) * sizeof(d->queue[0]));
        d->n_queue--;
        omv_log_info("starting job %llu '%s' (%s); %u more queued", (unsigned long long)q.id,
                     q.job->name, q.path, d->n_queue);
        int r = omv_daemon_load_job(d, q.job, q.path, q.id);
        d->queue_dirty = 1;
        if (r == 0) {
            d->job_submitted = 1;
            memcpy(d->job_sets, q.sets, sizeof(d->job_sets));
        } else {
            char why[160];
            snprintf(why, sizeof(why), "could not be loaded: %s (see the daemon's log)",
                     omv_strerror(r));
            omv_log_error("job %llu '%s' %s", (unsigned long long)q.id, q.job->name, why);
            record_unloadable(d, &q, why);
        }
        free(q.job);
        if (r == 0)
            return;
    }
}

static void queue_path(const omv_daemon_t *d, char *path, size_t cap)
{
    snprintf(path, cap, "%s/jobs.queue", d->cfg.state_dir);
}

static void write_entry(FILE *f, uint64_t id, const char *path, const char *sets)
{
    fprintf(f, "%llu\t%s%s%s\n", (unsigned long long)id, path, sets[0] ? "\t" : "", sets);
}

/* Writes STATE_DIR/jobs.queue (tmp file, then rename): a submitted job that is not over, then
 * the queue. Without anything to keep, the file goes. */
static void save_queue(omv_daemon_t *d)
{
    d->queue_dirty = 0;
    if (d->cfg.state_dir[0] == '\0' || d->cfg.once)
        return;
    char path[OMV_JOB_PATH_MAX + 16], tmp[OMV_JOB_PATH_MAX + 32];
    queue_path(d, path, sizeof(path));
    int current = d->has_job && d->job_submitted && !OMV_JOB_OVER(d->state);
    if (!current && d->n_queue == 0) {
        if (unlink(path) < 0 && errno != ENOENT)
            omv_log_warn("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        omv_log_warn("cannot write %s: %s; the queue will not outlive a restart", tmp,
                     strerror(errno));
        return;
    }
    fprintf(f, "# omnivored's jobs, restored when it starts again: the job that was running,\n"
               "# then the queue. One per line: ID<TAB>FILE[<TAB>SECTION.KEY=VALUE]...\n");
    if (current)
        write_entry(f, d->job_id, d->job_path, d->job_sets);
    for (uint32_t i = 0; i < d->n_queue; i++)
        write_entry(f, d->queue[i].id, d->queue[i].path, d->queue[i].sets);
    int bad = ferror(f) | (fflush(f) != 0) | (fsync(fileno(f)) != 0);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) < 0) {
        omv_log_warn("cannot write %s: %s; the queue will not outlive a restart", path,
                     strerror(errno));
        unlink(tmp);
    }
}

/* Parses one job with its overrides (tab- or argv-separated); returns NULL with err set. */
static omv_job_t *parse_job(const char *path, char *const *sets, int n_sets, char *err)
{
    omv_job_t *job = malloc(sizeof(*job));
    if (job == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "out of memory");
        return NULL;
    }
    int r = omv_job_load(job, path, err);
    for (int i = 0; r >= 0 && i < n_sets; i++)
        r = omv_config_set_arg(omv_job_table, omv_job_table_len, job, sets[i], err);
    if (r >= 0)
        r = omv_job_validate(job, path, err);
    if (r >= 0)
        r = omv_daemon_check_job(job, err);
    if (r < 0) {
        free(job);
        return NULL;
    }
    return job;
}

void omv_daemon_jobs_restore(omv_daemon_t *d)
{
    if (d->cfg.state_dir[0] == '\0')
        return;
    char path[OMV_JOB_PATH_MAX + 16];
    queue_path(d, path, sizeof(path));
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[OMV_JOB_PATH_MAX + OMV_DAEMON_SETS_MAX + 32];
    int n = 0;
    while (fgets(line, sizeof(line), f) && d->n_queue < OMV_DAEMON_MAX_QUEUE) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *fields[OMV_CONTROL_MAX_ARGS + 2], *save = NULL;
        int nf = 0;
        for (char *t = strtok_r(line, "\t", &save); t && nf < OMV_CONTROL_MAX_ARGS + 2;
             t = strtok_r(NULL, "\t", &save))
            fields[nf++] = t;
        char *end = NULL;
        unsigned long long id = nf >= 2 ? strtoull(fields[0], &end, 10) : 0;
        if (id == 0 || *end != '\0') {
            omv_log_warn("%s: skipping a line that is not ID<TAB>FILE[<TAB>KEY=VALUE]...", path);
            continue;
        }
        char err[OMV_CONFIG_ERR_MAX];
        omv_job_t *job = parse_job(fields[1], fields + 2, nf - 2, err);
        if (job == NULL) {
            omv_log_error("%s: job %llu cannot be restored: %s", path, id, err);
            continue;
        }
        queued_job_t *q = &d->queue[d->n_queue++];
        memset(q, 0, sizeof(*q));
        q->id = id;
        q->job = job;
        omv_strlcpy(q->path, fields[1], sizeof(q->path));
        for (int i = 2; i < nf; i++) {
            size_t at = strlen(q->sets);
            snprintf(q->sets + at, sizeof(q->sets) - at, "%s%s", i > 2 ? "\t" : "", fields[i]);
        }
        q->submitted_s = omv_time_s();
        if (id > d->jobs_submitted_total)
            d->jobs_submitted_total = id;
        n++;
    }
    fclose(f);
    if (n)
        omv_log_info("restored %d job%s from %s (the first resumes from its checkpoints)", n,
                     n == 1 ? "" : "s", path);
}

void omv_daemon_jobs_poll(omv_daemon_t *d)
{
    if (d->has_job && d->stop_requested && !OMV_JOB_OVER(d->state)) {
        int late = omv_time_s() - d->stop_requested_s > STOP_SETTLE_S;
        if (!d->ckpt_due || late) {
            if (d->ckpt_due)
                omv_log_warn("job '%s': no checkpoint of whole steps within %.0f s of stop; "
                             "stopping without one (the last is %s)", d->job.name,
                             STOP_SETTLE_S, d->ckpt_last_path[0] ? d->ckpt_last_path : "none");
            d->ckpt_due = 0;
            omv_daemon_finish(d, JOB_STOPPED, "stopped by omnivorectl stop");
        }
    }
    if (d->has_job && OMV_JOB_OVER(d->state))
        record_end(d);
    if ((!d->has_job || OMV_JOB_OVER(d->state)) && d->n_queue > 0 && !d->cfg.once)
        start_next(d);
    if (d->queue_dirty)
        save_queue(d);
}

void omv_daemon_jobs_free(omv_daemon_t *d)
{
    for (uint32_t i = 0; i < d->n_queue; i++)
        free(d->queue[i].job);
    d->n_queue = 0;
}

/* submit PATH [SECTION.KEY=VALUE ...] */
static int submit(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
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
    const char *path = argv[1];
    if (path[0] != '/') {
        omv_strbuf_printf(reply, "submit needs an absolute path ('%s' is relative to what?); "
                                 "omnivorectl submit makes it absolute", path);
        return -EINVAL;
    }
    if (d->n_queue == OMV_DAEMON_MAX_QUEUE) {
        omv_strbuf_printf(reply, "the queue is full (%d jobs); wait, or drop one with 'stop ID'",
                          OMV_DAEMON_MAX_QUEUE);
        return -EAGAIN;
    }
    char sets[OMV_DAEMON_SETS_MAX] = "";
    for (int i = 2; i < argc; i++) {
        size_t at = strlen(sets);
        if (snprintf(sets + at, sizeof(sets) - at, "%s%s", i > 2 ? "\t" : "", argv[i]) >=
            (int)(sizeof(sets) - at)) {
            omv_strbuf_printf(reply, "job refused: overrides longer than %d bytes",
                              OMV_DAEMON_SETS_MAX - 1);
            return -EINVAL;
        }
    }
    char err[OMV_CONFIG_ERR_MAX];
    omv_job_t *job = parse_job(path, argv + 2, argc - 2, err);
    if (job == NULL) {
        omv_log_warn("refused a submitted job: %s", err);
        omv_strbuf_printf(reply, "job refused: %s", err);
        return -EINVAL;
    }
    queued_job_t *q = &d->queue[d->n_queue++];
    memset(q, 0, sizeof(*q));
    q->id = ++d->jobs_submitted_total;
    q->job = job;
    omv_strlcpy(q->path, path, sizeof(q->path));
    memcpy(q->sets, sets, sizeof(q->sets));
    q->submitted_s = omv_time_s();
    d->queue_dirty = 1;
    uint64_t id = q->id;
    char name[64];
    omv_strlcpy(name, job->name, sizeof(name));
    int ahead = d->has_job && !OMV_JOB_OVER(d->state);
    omv_log_info("job %llu '%s' submitted (%s)%s", (unsigned long long)id, name, path,
                 ahead ? "; it waits for the current job" : "");
    uint32_t position = d->n_queue;
    if (!ahead) {
        record_end(d);
        start_next(d); /* q is gone after this */
        position = 0;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "submit");
    omv_kv_int(&kv, "id", (int64_t)id);
    omv_kv_str(&kv, "name", name);
    omv_kv_str(&kv, "file", path);
    if (position == 0) {
        int loaded = d->has_job && d->job_id == id;
        omv_kv_str(&kv, "state", loaded ? omv_daemon_state_names[d->state] : "failed");
        if (!loaded)
            omv_kv_str(&kv, "reason", "could not be loaded (see the daemon's log)");
    } else {
        omv_kv_str(&kv, "state", "queued");
        omv_kv_int(&kv, "position", position);
    }
    omv_kv_end(&kv);
    return 0;
}

static int matches(uint64_t id, const char *name, const char *what)
{
    char *end = NULL;
    unsigned long long n = strtoull(what, &end, 10);
    if (*what != '\0' && *end == '\0')
        return n == id;
    return strcmp(name, what) == 0;
}

/* stop [ID|NAME]: the current job (checkpointed first) or a queued one (dropped). */
static int stop(omv_daemon_t *d, int argc, char **argv, int json, omv_strbuf_t *reply)
{
    const char *what = argc > 1 ? argv[1] : NULL;
    if (what != NULL && !(d->has_job && matches(d->job_id, d->job.name, what))) {
        for (uint32_t i = 0; i < d->n_queue; i++) {
            queued_job_t *q = &d->queue[i];
            if (!matches(q->id, q->job->name, what))
                continue;
            omv_log_info("job %llu '%s' dropped from the queue", (unsigned long long)q->id,
                         q->job->name);
            omv_kv_t kv;
            omv_kv_begin(&kv, reply, json);
            omv_kv_section(&kv, "stop");
            omv_kv_int(&kv, "id", (int64_t)q->id);
            omv_kv_str(&kv, "name", q->job->name);
            omv_kv_str(&kv, "state", "dropped from the queue");
            omv_kv_end(&kv);
            free(q->job);
            memmove(q, q + 1, (d->n_queue - i - 1) * sizeof(*q));
            d->n_queue--;
            d->queue_dirty = 1;
            return 0;
        }
        omv_strbuf_printf(reply, "no job '%s' is running or queued; see 'jobs'", what);
        return -ENOENT;
    }
    if (!d->has_job || OMV_JOB_OVER(d->state)) {
        omv_strbuf_printf(reply, "no job is running%s%s%s", d->has_job ? " (job '" : "",
                          d->has_job ? d->job.name : "", d->has_job ? "' is over)" : "");
        return -ENOENT;
    }
    uint64_t id = d->job_id;
    char name[64];
    omv_strlcpy(name, d->job.name, sizeof(name));
    const char *how;
    if (d->stop_requested) {
        how = "already stopping";
    } else if (d->state == JOB_RUNNING && d->ckpt_enabled) {
        /* The event loop ends it once the checkpoint is written (omv_daemon_jobs_poll). */
        d->stop_requested = 1;
        d->stop_requested_s = omv_time_s();
        d->ckpt_due = 1;
        how = "stopping once a checkpoint of whole steps is written; submitting the job again "
              "resumes from there";
    } else {
        omv_daemon_finish(d, JOB_STOPPED, "stopped by omnivorectl stop");
        how = "stopped";
    }
    omv_log_info("stop requested for job %llu '%s': %s", (unsigned long long)id, name, how);
    omv_kv_t kv;
    omv_kv_begin(&kv, reply, json);
    omv_kv_section(&kv, "stop");
    omv_kv_int(&kv, "id", (int64_t)id);
    omv_kv_str(&kv, "name", name);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    omv_kv_str(&kv, "how", how);
    omv_kv_end(&kv);
    return 0;
}

static void reply_jobs(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    char key[64];
    double now = omv_time_s();
    omv_kv_begin(&kv, out, json);
    omv_kv_section(&kv, "daemon");
    omv_kv_int(&kv, "jobs_submitted_total", (int64_t)d->jobs_submitted_total);
    omv_kv_int(&kv, "queued", d->n_queue);
    omv_kv_int(&kv, "finished_total", d->n_finished_total);
    int idle = 0;
    for (uint32_t i = 0; i < d->n_members; i++)
        idle += d->members[i].state == MEMBER_IDLE;
    omv_kv_int(&kv, "workers_waiting", idle);
    omv_kv_int(&kv, "once", d->cfg.once);
    omv_kv_section(&kv, "current");
    if (d->has_job) {
        omv_kv_int(&kv, "id", (int64_t)d->job_id);
        omv_kv_str(&kv, "name", d->job.name);
        omv_kv_str(&kv, "file", d->job_path);
        omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
        omv_kv_double(&kv, "epoch", omv_daemon_epoch(d), 3);
        omv_kv_int(&kv, "epochs", d->job.epochs);
        omv_kv_double(&kv, "test_accuracy", last_accuracy(d), 4);
        omv_kv_double(&kv, "wall_seconds", omv_daemon_wall_seconds(d), 1);
        omv_kv_int(&kv, "workers_alive", omv_daemon_live_trainers(d));
    } else {
        omv_kv_str(&kv, "state", "idle");
    }
    for (uint32_t i = 0; i < d->n_queue; i++) {
        const queued_job_t *q = &d->queue[i];
        snprintf(key, sizeof(key), "queued_%llu", (unsigned long long)q->id);
        omv_kv_section(&kv, key);
        omv_kv_int(&kv, "position", i + 1);
        omv_kv_str(&kv, "name", q->job->name);
        omv_kv_str(&kv, "file", q->path);
        omv_kv_double(&kv, "waiting_seconds", now - q->submitted_s, 1);
    }
    uint32_t n = d->n_finished_total < OMV_DAEMON_MAX_FINISHED ? d->n_finished_total
                                                                : OMV_DAEMON_MAX_FINISHED;
    for (uint32_t k = 0; k < n; k++) { /* newest first */
        const finished_job_t *f =
            &d->finished[(d->n_finished_total - 1 - k) % OMV_DAEMON_MAX_FINISHED];
        snprintf(key, sizeof(key), "finished_%llu", (unsigned long long)f->id);
        omv_kv_section(&kv, key);
        omv_kv_str(&kv, "name", f->name);
        omv_kv_str(&kv, "file", f->path);
        omv_kv_str(&kv, "state", omv_daemon_state_names[f->state]);
        omv_kv_double(&kv, "test_accuracy", f->accuracy, 4);
        omv_kv_double(&kv, "epochs", f->epochs, 3);
        omv_kv_double(&kv, "wall_seconds", f->wall_s, 1);
        omv_kv_double(&kv, "ended_seconds_ago", now - f->end_s, 0);
        if (f->reason[0])
            omv_kv_str(&kv, "reason", f->reason);
    }
    omv_kv_end(&kv);
}

int omv_daemon_jobs_control(omv_daemon_t *d, int argc, char **argv, int json,
                            omv_strbuf_t *reply)
{
    if (strcmp(argv[0], "submit") == 0)
        return submit(d, argc, argv, json, reply);
    if (strcmp(argv[0], "stop") == 0) {
        if (argc > 2) {
            omv_strbuf_printf(reply, "stop takes at most one job (an id or a name)");
            return -EINVAL;
        }
        return stop(d, argc, argv, json, reply);
    }
    if (argc > 1) {
        omv_strbuf_printf(reply, "'jobs' takes no argument '%s'", argv[1]);
        return -EINVAL;
    }
    reply_jobs(d, reply, json);
    return 0;
}
