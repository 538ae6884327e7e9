/* The daemon's jobs: the queue of submitted jobs (each parsed once, with the text it was
 * parsed from), the ring of finished ones for `omnivorectl jobs`, and STATE_DIR/jobs.queue,
 * which lets the queue and the job that was running outlive a restart. Knows nothing of runs:
 * the daemon says what runs and how it ended. */
#pragma once

#include <stdint.h>

#include "caller.h"
#include "job.h"

#define OMV_JOBS_MAX_QUEUE 32
#define OMV_JOBS_MAX_FINISHED 32
#define OMV_JOBS_SETS_MAX 2048

typedef struct {
    uint64_t id;
    omv_job_t *job; /* parsed, with the submitter's overrides, validated */
    char *text;     /* the job file as it was read at submit */
    char path[OMV_JOB_PATH_MAX];
    char sets[OMV_JOBS_SETS_MAX]; /* the overrides, tab-separated (kept in jobs.queue) */
    double submitted_s;
} omv_queued_job_t;

/* How a job ended. state is a run's omv_job_state_t (run.h), kept as a number here. */
typedef struct {
    uint64_t id;
    char name[64];
    char path[OMV_JOB_PATH_MAX];
    int state;
    double accuracy, epochs, wall_s, end_s;
    char reason[160];
} omv_finished_job_t;

/* Fields are for reading. */
typedef struct {
    char state_dir[OMV_JOB_PATH_MAX]; /* empty: nothing outlives a restart */
    int once;                         /* one job only: jobs.queue is neither read nor written */
    omv_queued_job_t queue[OMV_JOBS_MAX_QUEUE];
    uint32_t n_queue;
    omv_finished_job_t finished[OMV_JOBS_MAX_FINISHED]; /* a ring */
    uint32_t n_finished_total;
    uint64_t submitted_total;
    /* The job that runs now, as jobs.queue lists it while it is not over. */
    int current;
    uint64_t current_id;
    char current_path[OMV_JOB_PATH_MAX];
    char current_sets[OMV_JOBS_SETS_MAX];
    int dirty; /* jobs.queue is to be written again */
} omv_jobs_t;

/* Returns NULL with errno set. Caller owns; omv_jobs_destroy. */
omv_jobs_t *omv_jobs_new(const char *state_dir, int once);
void omv_jobs_destroy(omv_jobs_t **self_p);

/* Reads path once and parses it with the overrides sets[n_sets] (SECTION.KEY=VALUE), checking
 * it as a run would; on behalf of caller (NULL: the daemon itself), only files the caller could
 * read are read, and a refusal says nothing of the file's contents. Returns 0 with *ret_job and
 * *ret_text (the caller's: free), or a negative errno with the reason in
 * err[OMV_CONFIG_ERR_MAX]. */
int omv_jobs_parse(const omv_caller_t *caller, const char *path, char *const *sets, int n_sets,
                   omv_job_t **ret_job, char **ret_text, char *err);

/* Joins overrides into one tab-separated string. Returns 0 or -E2BIG. */
int omv_jobs_join_sets(char *const *sets, int n_sets, char out[OMV_JOBS_SETS_MAX]);

/* Queues a parsed job (job and text taken); id 0 takes the next one. Returns the id, or -EAGAIN
 * when the queue is full (job and text are freed). */
int64_t omv_jobs_add(omv_jobs_t *self, omv_job_t *job, char *text, const char *path,
                     const char *sets, uint64_t id);

/* Takes the first queued job into *ret (omv_jobs_entry_fini). Returns 1, or 0 when none. */
int omv_jobs_pop(omv_jobs_t *self, omv_queued_job_t *ret);
void omv_jobs_entry_fini(omv_queued_job_t *q);

/* Drops the queued job with id or name `what`. Returns 1 with its id and name, 0 if none. */
int omv_jobs_drop(omv_jobs_t *self, const char *what, uint64_t *ret_id, char ret_name[64]);

/* Whether `what` (an id or a name) names the job id, name. */
int omv_jobs_matches(uint64_t id, const char *name, const char *what);

/* The job that now runs (for jobs.queue), or none (id 0). */
void omv_jobs_set_current(omv_jobs_t *self, uint64_t id, const char *path, const char *sets);
/* The current job ended: it goes to the ring and leaves jobs.queue. */
void omv_jobs_record(omv_jobs_t *self, const omv_finished_job_t *f);
/* The i-th finished job, newest first (i < the ring's fill). */
const omv_finished_job_t *omv_jobs_finished(const omv_jobs_t *self, uint32_t i);
uint32_t omv_jobs_n_finished(const omv_jobs_t *self);

/* Writes jobs.queue when something changed. */
void omv_jobs_save(omv_jobs_t *self);
/* Queues the jobs jobs.queue lists (a job interrupted by a restart first, then the queued ones,
 * with their ids and overrides), from the last run of the daemon. */
void omv_jobs_restore(omv_jobs_t *self);
