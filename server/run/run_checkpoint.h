/* A run's checkpoints: where they go, when one is due, what one holds (built from a const view
 * of the run that the run fills), and finding the one to resume from. The run applies what it
 * resumes; this module never reaches into the run. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "eval.h"
#include "groups.h"
#include "job.h"
#include "members.h"
#include "shard.h"
#include "tuner.h"

/* Fields are for reading (status), and ckpt_due for the run to set. */
typedef struct {
    char dir[OMV_JOB_PATH_MAX];
    int enabled; /* dir exists and may be written */
    int due;     /* one is to be written once the groups hold whole steps */
    int forced;  /* asked for by hand: written even while a probe runs (its base) */
    uint64_t seq;
    double last_s;      /* when the last was written (or tried) */
    uint64_t last_step; /* the slowest group's clock then */
    char last_path[OMV_JOB_PATH_MAX + 64];
    char resumed_from[OMV_JOB_PATH_MAX + 64];
    uint64_t resumed_seq; /* its number (0: none) */
    double resumed_epoch; /* where the job stood in it */
    uint64_t written_total, failed_total;
    double last_ms;                          /* how long the last write took */
    char last_error[OMV_CHECKPOINT_ERR_MAX]; /* why the last write failed; "" after a success */
} omv_run_ckpt_t;

/* What a checkpoint is written from: the run fills it, borrowing everything. */
typedef struct {
    const omv_job_t *job;
    const char *job_text; /* the job file as submitted */
    int finished;
    uint64_t images_total, steps_total;
    double train_s, epoch;
    const omv_groups_t *groups;
    const omv_members_t *members;
    omv_sgd_t sgd;
    size_t param_count;
    const float *params, *velocity; /* [param_count]: the model to keep */
    const float *second;            /* [param_count] Adam's second moments, or NULL */
    uint64_t adam_steps;            /* Adam's updates applied (with second) */
    /* A manifest: the model is in these parts (params, velocity and second are NULL); adam: the
     * parts hold second moments. */
    uint32_t n_parts;
    const omv_checkpoint_part_ref_t *parts;
    int adam;
    const omv_eval_t *eval;
    const omv_tuner_t *tuner; /* may be NULL */
} omv_run_ckpt_view_t;

/* Where a job's checkpoints go: [checkpoint] dir (relative: to state_dir), else
 * STATE_DIR/checkpoints/NAME; "" without either. Writes out[cap]. */
void omv_run_ckpt_dir(const omv_job_t *job, const char *state_dir, char *out, size_t cap);

/* Whether dir lies in state_dir or in root (may be NULL or ""), lexically and through the
 * links that exist already, with no "..": 0, or -EPERM with why[cap] naming both. */
int omv_run_ckpt_confined(const char *dir, const char *state_dir, const char *root, char *why,
                          size_t cap);

/* Creates dir as needed and checks that the daemon may write files in it (a folder that exists
 * but lies on a read-only mount, as ProtectSystem=strict makes everything outside the state
 * folder, passes mkdir and fails at the first checkpoint). Returns 0, or a negative errno with
 * why[cap] naming the folder, the cause and the fix. */
int omv_run_ckpt_check_dir(const char *dir, char *why, size_t cap);

/* Sets where the job's checkpoints go (omv_run_ckpt_dir) and checks the folder
 * (omv_run_ckpt_check_dir): one the daemon cannot write turns checkpoints off, with an error
 * that says what to change. Returns 0, or -EPERM (logged, naming the path) for a folder outside
 * state_dir and outside root (may be NULL or "": no other root), through ".." or a link: the
 * job must not run. */
int omv_run_ckpt_init(omv_run_ckpt_t *self, const omv_job_t *job, const char *state_dir,
                      const char *root);

/* Writes a checkpoint from view now, prunes older ones, and clears due. Returns 0 or a negative
 * errno (logged, counted). */
int omv_run_ckpt_write(omv_run_ckpt_t *self, const omv_run_ckpt_view_t *view);

/* Finds the newest valid checkpoint when the job allows resuming, and checks that it fits a
 * model of param_count parameters with room for max_groups groups. Returns 1 with it in *ret
 * (omv_checkpoint_fini) and resumed_from set, 0 when there is nothing to resume, or a negative
 * errno (a checkpoint for another model: the job must not start, rather than overwrite it). */
int omv_run_ckpt_find(omv_run_ckpt_t *self, const omv_job_t *job, size_t param_count,
                      uint32_t max_groups, omv_checkpoint_t *ret);
