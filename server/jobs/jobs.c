/* The daemon's jobs: the queue, the finished ring and STATE_DIR/jobs.queue. */
#define OMV_LOG_TAG "omnivored"
#include "jobs.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "log.h"
#include "run.h"
#include "sandbox.h"
#include "util.h"

omv_jobs_t *omv_jobs_new(const char *state_dir, int once)
{
    omv_jobs_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    omv_strlcpy(self->state_dir, state_dir, sizeof(self->state_dir));
    self->once = once;
    return self;
}

void omv_jobs_entry_fini(omv_queued_job_t *q)
{
    free(q->job);
    free(q->text);
    q->job = NULL;
    q->text = NULL;
}

void omv_jobs_destroy(omv_jobs_t **self_p)
{
    omv_jobs_t *self = *self_p;
    if (self == NULL)
        return;
    for (uint32_t i = 0; i < self->n_queue; i++)
        omv_jobs_entry_fini(&self->queue[i]);
    free(self);
    *self_p = NULL;
}

int omv_jobs_parse(const omv_caller_t *caller, const char *path, char *const *sets, int n_sets,
                   omv_job_t **ret_job, char **ret_text, char *err)
{
    char *text = NULL;
    omv_job_t *job = malloc(sizeof(*job));
    if (job == NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "out of memory");
        return -ENOMEM;
    }
    omv_job_path_check_fn check = caller ? omv_caller_check_read : NULL;
    void *who = (void *)(uintptr_t)caller;
    int r = check ? check(who, path, err) : 0;
    if (r >= 0)
        r = omv_job_read(path, &text, err);
    if (r >= 0)
        r = omv_job_load_text_checked(job, path, text, check, who, err);
    for (int i = 0; r >= 0 && i < n_sets; i++)
        r = omv_config_set_arg(omv_job_table, omv_job_table_len, job, sets[i], err);
    if (r >= 0 && check)
        r = omv_job_check_paths(job, check, who, err); /* the overrides may name others */
    if (r >= 0)
        r = omv_job_validate(job, path, err);
    if (r >= 0)
        r = omv_run_check_job(job, NULL, NULL, err);
    if (r < 0) {
        omv_sandbox_explain_open(err, OMV_CONFIG_ERR_MAX);
        free(job);
        free(text);
        return r;
    }
    *ret_job = job;
    *ret_text = text;
    return 0;
}

int omv_jobs_join_sets(char *const *sets, int n_sets, char out[OMV_JOBS_SETS_MAX])
{
    out[0] = '\0';
    for (int i = 0; i < n_sets; i++) {
        size_t at = strlen(out);
        if (snprintf(out + at, OMV_JOBS_SETS_MAX - at, "%s%s", i > 0 ? "\t" : "", sets[i]) >=
            (int)(OMV_JOBS_SETS_MAX - at))
            return -E2BIG;
    }
    return 0;
}

int64_t omv_jobs_add(omv_jobs_t *self, omv_job_t *job, char *text, const char *path,
                     const char *sets, uint64_t id)
{
    if (self->n_queue == OMV_JOBS_MAX_QUEUE) {
        free(job);
        free(text);
        return -EAGAIN;
    }
    omv_queued_job_t *q = &self->queue[self->n_queue++];
    memset(q, 0, sizeof(*q));
    q->id = id ? id : ++self->submitted_total;
    if (q->id > self->submitted_total)
        self->submitted_total = q->id;
    q->job = job;
    q->text = text;
    omv_strlcpy(q->path, path, sizeof(q->path));
    omv_strlcpy(q->sets, sets, sizeof(q->sets));
    q->submitted_s = omv_time_s();
    self->dirty = 1;
    return (int64_t)q->id;
}

int omv_jobs_pop(omv_jobs_t *self, omv_queued_job_t *ret)
{
    if (self->n_queue == 0)
        return 0;
    *ret = self->queue[0];
    memmove(&self->queue[0], &self->queue[1], (self->n_queue - 1) * sizeof(self->queue[0]));
    self->n_queue--;
    self->dirty = 1;
    return 1;
}

int omv_jobs_matches(uint64_t id, const char *name, const char *what)
{
    char *end = NULL;
    unsigned long long n = strtoull(what, &end, 10);
    if (*what != '\0' && *end == '\0')
        return n == id;
    return strcmp(name, what) == 0;
}

int omv_jobs_drop(omv_jobs_t *self, const char *what, uint64_t *ret_id, char ret_name[64])
{
    for (uint32_t i = 0; i < self->n_queue; i++) {
        omv_queued_job_t *q = &self->queue[i];
        if (!omv_jobs_matches(q->id, q->job->name, what))
            continue;
        *ret_id = q->id;
        omv_strlcpy(ret_name, q->job->name, 64);
        omv_jobs_entry_fini(q);
        memmove(q, q + 1, (self->n_queue - i - 1) * sizeof(*q));
        self->n_queue--;
        self->dirty = 1;
        return 1;
    }
    return 0;
}

void omv_jobs_set_current(omv_jobs_t *self, uint64_t id, const char *path, const char *sets)
{
    self->current = id != 0;
    self->current_id = id;
    omv_strlcpy(self->current_path, path ? path : "", sizeof(self->current_path));
    omv_strlcpy(self->current_sets, sets ? sets : "", sizeof(self->current_sets));
    self->dirty = 1;
}

void omv_jobs_record(omv_jobs_t *self, const omv_finished_job_t *f)
{
    self->finished[self->n_finished_total++ % OMV_JOBS_MAX_FINISHED] = *f;
    if (self->current && self->current_id == f->id)
        self->current = 0;
    self->dirty = 1;
}

uint32_t omv_jobs_n_finished(const omv_jobs_t *self)
{
    return self->n_finished_total < OMV_JOBS_MAX_FINISHED ? self->n_finished_total
                                                          : OMV_JOBS_MAX_FINISHED;
}

const omv_finished_job_t *omv_jobs_finished(const omv_jobs_t *self, uint32_t i)
{
    return &self->finished[(self->n_finished_total - 1 - i) % OMV_JOBS_MAX_FINISHED];
}

static void queue_path(const omv_jobs_t *self, char *path, size_t cap)
{
    snprintf(path, cap, "%s/jobs.queue", self->state_dir);
}

static void write_entry(FILE *f, uint64_t id, const char *path, const char *sets)
{
    fprintf(f, "%llu\t%s%s%s\n", (unsigned long long)id, path, sets[0] ? "\t" : "", sets);
}

/* Writes the file (tmp file, then rename). Returns 0 or -1 with errno set. */
static int write_queue(const omv_jobs_t *self, const char *path)
{
    char tmp[OMV_JOB_PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "# omnivored's jobs, restored when it starts again: the job that was running,\n"
               "# then the queue. One per line: ID<TAB>FILE[<TAB>SECTION.KEY=VALUE]...\n");
    if (self->current)
        write_entry(f, self->current_id, self->current_path, self->current_sets);
    for (uint32_t i = 0; i < self->n_queue; i++)
        write_entry(f, self->queue[i].id, self->queue[i].path, self->queue[i].sets);
    int bad = ferror(f) | (fflush(f) != 0) | (fsync(fileno(f)) != 0);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

void omv_jobs_save(omv_jobs_t *self)
{
    if (!self->dirty)
        return;
    self->dirty = 0;
    if (self->state_dir[0] == '\0' || self->once)
        return;
    char path[OMV_JOB_PATH_MAX + 16];
    queue_path(self, path, sizeof(path));
    if (!self->current && self->n_queue == 0) {
        if (unlink(path) < 0 && errno != ENOENT)
            omv_log_warn("cannot remove %s: %s", path, strerror(errno));
        return;
    }
    if (write_queue(self, path) < 0)
        omv_log_warn("cannot write %s: %s; the queue will not outlive a restart", path,
                     strerror(errno));
}

/* Queues one line of jobs.queue: ID<TAB>FILE[<TAB>SECTION.KEY=VALUE]... Returns 1 when queued. */
static int restore_line(omv_jobs_t *self, const char *path, char *line)
{
    char *fields[OMV_CONTROL_MAX_ARGS + 2], *save = NULL;
    int nf = 0;
    for (char *t = strtok_r(line, "\t", &save); t && nf < OMV_CONTROL_MAX_ARGS + 2;
         t = strtok_r(NULL, "\t", &save))
        fields[nf++] = t;
    char *end = NULL;
    unsigned long long id = nf >= 2 ? strtoull(fields[0], &end, 10) : 0;
    if (id == 0 || *end != '\0') {
        omv_log_warn("%s: skipping a line that is not ID<TAB>FILE[<TAB>KEY=VALUE]...", path);
        return 0;
    }
    char err[OMV_CONFIG_ERR_MAX], sets[OMV_JOBS_SETS_MAX];
    omv_job_t *job;
    char *text;
    if (omv_jobs_parse(NULL, fields[1], fields + 2, nf - 2, &job, &text, err) < 0) {
        omv_log_error("%s: job %llu cannot be restored: %s", path, id, err);
        return 0;
    }
    omv_jobs_join_sets(fields + 2, nf - 2, sets);
    return omv_jobs_add(self, job, text, fields[1], sets, id) > 0;
}

void omv_jobs_restore(omv_jobs_t *self)
{
    if (self->state_dir[0] == '\0' || self->once)
        return;
    char path[OMV_JOB_PATH_MAX + 16];
    queue_path(self, path, sizeof(path));
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[OMV_JOB_PATH_MAX + OMV_JOBS_SETS_MAX + 32];
    int n = 0;
    while (fgets(line, sizeof(line), f) && self->n_queue < OMV_JOBS_MAX_QUEUE) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] != '#' && line[0] != '\0')
            n += restore_line(self, path, line);
    }
    fclose(f);
    self->dirty = 0;
    if (n)
        omv_log_info("restored %d job%s from %s (the first resumes from its checkpoints)", n,
                     n == 1 ? "" : "s", path);
}
