/* One job's run: everything that lives as long as the job and no longer (its model in shards,
 * compute groups and clocks, the update rule, pulls, pushes and applies, evaluation,
 * checkpoints, the optimizer's daemon side, the timeline), made whole by omv_run_new and freed
 * whole by omv_run_destroy. Loading the next job is destroy + new. A run is one daemon's, or
 * takes a role (scaleout/): the coordinator's of a model on shard servers, or a shard server's
 * of its range. The type is opaque: readers take a view (omv_run_view). */
#pragma once

#include <stdint.h>

#include "eval.h"
#include "groups.h"
#include "job.h"
#include "members.h"
#include "refusals.h"
#include "router.h"
#include "run_checkpoint.h"
#include "shardset.h"
#include "timeline.h"
#include "tuner.h"

/* A job's life; states from OMV_JOB_DONE on are over. */
typedef enum {
    OMV_JOB_WAITING,
    OMV_JOB_RUNNING,
    OMV_JOB_FINISHING,
    OMV_JOB_DONE,
    OMV_JOB_FAILED,
    OMV_JOB_STOPPED, /* `omnivorectl stop`: checkpointed, a resubmission resumes it */
    OMV_JOB_IDLE,    /* not a run's state: the daemon has no run */
    OMV_JOB_STATE_COUNT_
} omv_job_state_t;
extern const char *const omv_run_state_names[];
#define OMV_JOB_OVER(state) ((state) >= OMV_JOB_DONE)

typedef struct omv_run omv_run_t;

/* Which model a run holds: the whole of it (one daemon), none (a coordinator: the shard servers
 * hold it), or a range of its shards (a shard server). */
typedef enum {
    OMV_RUN_WHOLE,
    OMV_RUN_COORDINATOR,
    OMV_RUN_SERVER,
} omv_run_kind_t;

/* A role's table of what it does differently (run_priv.h; scaleout/ defines them). */
typedef struct omv_run_role omv_run_role_t;

/* What a run works with that outlives it: borrowed, from the daemon. */
typedef struct {
    omv_router_t *router;
    omv_members_t *members;
    omv_refusals_t *refusals;
    const char *state_dir;       /* checkpoints go under it unless the job says */
    const char *checkpoint_root; /* another folder a job's checkpoints may go to ("": none) */
    int once;                    /* the workers exit when the job ends (omnivored --once) */
    const omv_run_role_t *role;  /* NULL: one daemon holds the whole model */
    const void *role_arg;        /* what the role is made from (its header says), borrowed */
} omv_run_env_t;

/* How a requested stop ends, once a checkpoint of whole steps is written (or too late). */
typedef enum {
    OMV_RUN_STOP_NONE,
    OMV_RUN_STOP_JOB,  /* `omnivorectl stop`: the job ends, stopped */
    OMV_RUN_STOP_EXIT, /* the daemon exits: the job goes on after a restart */
} omv_run_stop_t;

/* What a job trains on, fixed when its run is made. */
typedef struct {
    uint32_t train_count;   /* images in the training set the job uses */
    uint32_t worker_batch;  /* images per worker per step: the group's batch over its members */
    uint64_t target_images; /* epochs x train_count: the job trains until it has seen these */
} omv_run_plan_t;

/* When things happened (omv_time_s; 0: not yet). */
typedef struct {
    double load_s, first_hello_s, start_s, train_end_s, end_s;
    double train_s_before; /* training seconds before a resume */
} omv_run_times_t;

/* The run's counters, for status and metrics. */
typedef struct {
    uint64_t images_total, steps_total;
    uint64_t late_total;             /* steps under way at the end, or past a failover's cut */
    uint64_t staleness_max_observed; /* the largest step gap a served pull had to another group */
    uint64_t regroups_total;
    uint64_t pushes_recorded_total;           /* gradients recorded in the groups' bookkeeping */
    uint64_t bytes_in_total, bytes_out_total; /* gradients taken, parameters sent (sockets) */
    uint64_t evals_sent_total;     /* a shard server: its range sent to the evaluator itself */
    uint64_t direct_evals_total;   /* a coordinator: evaluations the servers sent the evaluator */
    uint64_t serves_total;         /* steps' parameters sent to members */
    uint64_t inplace_serves_total; /* shards a local member read in the model segment */
    uint64_t inplace_raced_total;  /* their gradients refused: the shard changed meanwhile */
} omv_run_stats_t;

/* Each group's current step, as its members push it: [max_groups] each. */
typedef struct {
    uint64_t *images;  /* images of the step */
    double *loss_sum;  /* losses of the step */
    uint32_t *loss_n;  /* how many */
    uint64_t *planned; /* split = speed: 1 + the step its shares are for */
} omv_run_sums_t;

/* How a done job ended: with an evaluation of its final model (the final request answered, or
 * the one that reached stop_at_accuracy), and its final checkpoint 1 written, -1 failed, 0 not
 * tried (checkpoints off). */
typedef struct {
    int eval, ckpt;
} omv_run_final_t;

/* A server of the job is gone and no replica holds its shards (or a failover's cut is written):
 * the daemon makes the run again from its last checkpoint (omv_schedule_poll); reason says why,
 * and degraded makes it with the servers left, not waiting for more. */
typedef struct {
    int wanted, degraded;
    char reason[256];
} omv_run_rewind_t;

/* A shard server's range, for its status. */
typedef struct {
    uint32_t first, last; /* shards [first, last) */
    int backup;           /* it keeps the range's copy: takes pushes, serves nothing */
    uint32_t held_pushes; /* a backup's pushes waiting for their step */
    size_t held_bytes;
} omv_run_range_view_t;

/* A read-only look at a run, for status, metrics, commands and the schedule: valid until the
 * loop's next turn (the pointers are the run's own). */
typedef struct {
    uint64_t id; /* 1, 2, ... in the order jobs were submitted */
    const char *path;
    const char *text; /* the job file as submitted */
    const omv_job_t *job;
    omv_job_state_t state;
    const char *fail_reason; /* why it failed or stopped */
    const omv_run_plan_t *plan;
    const omv_run_times_t *times;
    const omv_run_stats_t *stats;
    const omv_run_sums_t *sums;
    double last_loss;
    uint32_t regroup_pending; /* the groups a pending regroup asks for; 0: none */
    const omv_groups_t *groups;
    const omv_shardset_t *shards;
    const omv_eval_t *eval;
    const omv_run_ckpt_t *ckpt;
    omv_tuner_t *tuner; /* NULL: the optimizer is off */
    const omv_timeline_t *timeline;
    omv_run_final_t final;
    omv_run_stop_t stopping;
    int exit_ready; /* OMV_RUN_STOP_EXIT: the last checkpoint is written (or given up on) */
    const omv_run_rewind_t *rewind;
    int holding;                /* a failover holds every trainer until its cut is in */
    omv_run_range_view_t range; /* a shard server's */
    double epoch, train_seconds, wall_seconds, images_per_second;
    double result_accuracy; /* omv_run_result_accuracy */
} omv_run_view_t;

/* Fills *ret with a look at self; with self NULL (no job loaded), at an idle run with nothing
 * in it (state OMV_JOB_IDLE, every count 0). */
void omv_run_view(const omv_run_t *self, omv_run_view_t *ret);
/* The few fields the daemon looks at most: the run's id, its job's state, the job. */
uint64_t omv_run_id(const omv_run_t *self);
omv_job_state_t omv_run_state(const omv_run_t *self);
const omv_job_t *omv_run_job(const omv_run_t *self);

/* Checks what a run would check without making one: the data set's shape against the model,
 * and that every worker gets a batch. Returns 0, with the images it trains on and each worker's
 * batch in *ret_train_count and *ret_worker_batch (either may be NULL), or -EINVAL with the
 * reason in err[OMV_CONFIG_ERR_MAX]. */
int omv_run_check_job(const omv_job_t *job, uint32_t *ret_train_count, uint32_t *ret_worker_batch,
                      char *err);

/* The largest frame a worker of job sends (a whole model's gradient and an envelope), or
 * -EINVAL when its model does not parse. */
int64_t omv_run_message_bytes(const omv_job_t *job);

/* The job's test accuracy as its result: the last evaluation, but NaN for a done job whose
 * final model was never evaluated (an older value is no result). */
double omv_run_result_accuracy(const omv_run_t *self);

/* Makes the run of job (copied; path names it in logs, text is copied for checkpoints): model,
 * shards and their executors, groups, checkpoints, resuming from the newest; with env's role.
 * Returns NULL with errno set after logging why. Caller owns; omv_run_destroy. */
omv_run_t *omv_run_new(const omv_run_env_t *env, const omv_job_t *job, const char *path,
                       const char *text, uint64_t id);
/* Frees the run whole; members still in it are marked done (they register again). */
void omv_run_destroy(omv_run_t **self_p);

/* ---- from the workers ---- */

/* Whether a trainer (evaluator) could join now; if not, why[cap] says why and *ret_code is the
 * refusal to answer with. */
int omv_run_may_join(const omv_run_t *self, omv_role_t role, char *why, size_t cap,
                     omv_refuse_t *ret_code);
/* m registered into the job: puts it in a group (trainers) and fills the Welcome's job, group
 * and first step. The job starts when its workers are all there. Returns 1 when the Welcome
 * is not to be sent now: a trainer joining a running job on shard servers joins at the next
 * cut, and the run sends its Welcome then. */
int omv_run_join(omv_run_t *self, omv_member_t *m, int rejoin, const char *who, omv_welcome_t *w);
/* The Welcome went out: a waiting job starts once its workers are all there. */
void omv_run_joined(omv_run_t *self);
void omv_run_pull(omv_run_t *self, omv_member_t *m, const omv_pull_t *p);
void omv_run_push(omv_run_t *self, omv_member_t *m, const omv_push_t *p);
void omv_run_eval_result(omv_run_t *self, omv_member_t *m, const omv_eval_result_t *e);
/* A live member of the job is gone (why: OMV_MEMBER_LEFT or OMV_MEMBER_DEAD). */
void omv_run_member_gone(omv_run_t *self, omv_member_t *m, omv_member_state_t why);

/* ---- from the loop ---- */

/* Handles what the shard executors sent back. */
void omv_run_drain_shards(omv_run_t *self);
/* Moves the job along after anything changed: parked pulls, evaluations, checkpoints, a
 * requested stop, the end. */
void omv_run_progress(omv_run_t *self);
/* Periodic work: the start timeout, a silent evaluator, checkpoints by time, the progress line,
 * the timeline, the optimizer. */
void omv_run_cron(omv_run_t *self);
/* How long a trainer may be silent before it is declared dead (ms). */
int64_t omv_run_worker_timeout_ms(const omv_run_t *self);
/* The shards, for the shared memory the daemon hands its local workers (their segment, their
 * size, and waiting until no shard still writes into a member's). */
omv_shardset_t *omv_run_shards(omv_run_t *self);
/* The daemon recorded the run's end in its finished jobs: returns whether it had already. */
int omv_run_mark_recorded(omv_run_t *self);

/* ---- from the commands ---- */

/* Asks for g compute groups, between steps. Returns 0, or -EINVAL/-EAGAIN with why[cap]. */
int omv_run_request_regroup(omv_run_t *self, uint32_t g, char *why, size_t cap);
/* Asks for a checkpoint as soon as the groups hold whole steps. Returns 0, or -EINVAL/-EAGAIN
 * with why[cap]. */
int omv_run_request_checkpoint(omv_run_t *self, char *why, size_t cap);
/* Stops the run once a checkpoint of whole steps is written, or after settle_s without one. */
void omv_run_stop(omv_run_t *self, omv_run_stop_t how, double settle_s);
/* Ends the job now (state OMV_JOB_DONE, OMV_JOB_FAILED or OMV_JOB_STOPPED) and tells its
 * workers. */
void omv_run_finish(omv_run_t *self, omv_job_state_t state, const char *why);

/* ---- reading ---- */

double omv_run_epoch(const omv_run_t *self);
/* Seconds of training so far, across restarts. */
double omv_run_train_seconds(const omv_run_t *self);
double omv_run_wall_seconds(const omv_run_t *self);
double omv_run_images_per_second(const omv_run_t *self);
int omv_run_live_trainers(const omv_run_t *self);
