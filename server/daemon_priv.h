/* The daemon's state, shared by its parts: the event loop and membership (daemon.c), control
 * replies (daemon_status.c) and checkpoints (daemon_checkpoint.c). Not for other modules. */
#pragma once

#include <stdint.h>

#include "checkpoint.h"
#include "control.h"
#include "daemon.h"
#include "groups.h"
#include "model.h"
#include "optimizer.h"
#include "router.h"
#include "shard.h"
#include "shard_thread.h"
#include "strbuf.h"
#include "wire.h"

#define OMV_DAEMON_MAX_EVALUATORS 4

/* A job's life; states from JOB_DONE on are over. JOB_IDLE: no job was ever loaded. */
typedef enum {
    JOB_WAITING,
    JOB_RUNNING,
    JOB_FINISHING,
    JOB_DONE,
    JOB_FAILED,
    JOB_STOPPED, /* `omnivorectl stop`: checkpointed, a resubmission resumes it */
    JOB_IDLE,
    JOB_STATE_COUNT_
} job_state_t;
extern const char *const omv_daemon_state_names[];
#define OMV_JOB_OVER(state) ((state) >= JOB_DONE)

/* MEMBER_IDLE: registered while there is no job to run (it waits for the next one);
 * MEMBER_DONE: a record of a finished job, whose worker was told to register again. */
typedef enum { MEMBER_ALIVE, MEMBER_DEAD, MEMBER_LEFT, MEMBER_IDLE, MEMBER_DONE } member_state_t;

/* Member records are the daemon's, not a job's: workers stay registered between jobs. */
#define OMV_DAEMON_MAX_MEMBERS 1024
/* Jobs waiting to run, and finished jobs remembered for `omnivorectl jobs`. */
#define OMV_DAEMON_MAX_QUEUE 32
#define OMV_DAEMON_MAX_FINISHED 32

typedef struct {
    int used;
    member_state_t state;
    omv_peer_t peer;
    omv_peer_t job_peer; /* the peer it had in the previous job (it keeps its id between jobs);
                          * what that connection still sends is dropped */
    omv_role_t role;
    uint32_t slot; /* trainers: their slot in the groups */
    char host[64];
    char name[64]; /* the worker's --name; may be empty */
    uint32_t pid;
    uint32_t previous_id; /* the id it had before it rejoined; 0 for a first registration */
    int64_t joined_ms, last_seen_ms;
    uint64_t steps;  /* steps pushed */
    uint64_t images; /* images pushed */
    float last_compute_ms;
    uint32_t slice_begin, slice_count; /* its part of the training set now */
    int parked;                        /* a pull is waiting */
    uint64_t parked_step;
    int served;                        /* it was sent parameters at least once */
    uint64_t served_step;              /* the step it was last sent parameters for */
} member_t;

typedef struct {
    double epoch, wall_s, accuracy, loss;
} eval_point_t;

/* Changes made between steps, when nothing is in flight (regroup by hand, the optimizer). */
typedef struct {
    int pending;
    uint32_t groups;  /* 0: keep */
    int set_sgd;      /* use sgd from the next update on */
    omv_sgd_t sgd;
    int snapshot;     /* save parameters and momentum as the probe base */
    int restore;      /* put the probe base back (before anything else) */
    uint64_t opt_gen; /* the optimizer's command this carries out (0: none) */
} omv_reconfig_t;

/* A configuration the optimizer ran a phase with, for the summary. */
typedef struct {
    uint32_t phase, groups;
    double momentum, learning_rate;
    double epoch; /* when it started */
} opt_phase_t;

#define OMV_DAEMON_MAX_PHASES 64

/* The training timeline for reports (daemon_timeline.c): a point about once a second of
 * training, halved in resolution whenever it reaches OMV_TIMELINE_MAX_POINTS. */
#define OMV_TIMELINE_MAX_POINTS 4096
#define OMV_TIMELINE_MAX_CHANGES 4096
#define OMV_TIMELINE_INTERVAL_S 1.0

typedef struct {
    double wall_s;         /* training seconds since the job started (as eval points count) */
    double span_s;         /* training seconds the point covers */
    double epoch;
    uint64_t steps_total, images_total;
    double loss_sum;       /* training losses pushed in the interval, probes included */
    uint64_t loss_n;
    double images_per_s;   /* every image trained on in the interval, probes included */
    uint32_t groups;
    double momentum, learning_rate;
    int probing;           /* a probe ran at some time in the interval */
} timeline_point_t;

/* The configuration from wall_s on: recorded when it changes, so a step plot is exact. */
typedef struct {
    double wall_s, epoch;
    uint64_t steps_total;
    uint32_t groups;
    double momentum, learning_rate;
    int probing;
    const char *cause; /* static text: "start", "regroup", "optimizer" */
} timeline_change_t;

typedef struct {
    timeline_point_t *points; /* [cap_points] */
    size_t n_points, cap_points;
    timeline_change_t *changes; /* [cap_changes] */
    size_t n_changes, cap_changes;
    uint64_t changes_dropped; /* the oldest changes, let go of when the list was full */
    double interval_s;        /* training seconds between points; doubles with each thinning */
    double last_s;            /* train seconds at the last point */
    uint64_t last_images;     /* images trained on (probes included) at the last point */
    double loss_sum;          /* since the last point */
    uint64_t loss_n;
    int probed;               /* a probe ran since the last point */
    int failed;               /* out of memory once: logged, points are dropped */
} timeline_t;


/* A submitted job waiting its turn. */
#define OMV_DAEMON_SETS_MAX 2048

typedef struct {
    uint64_t id;
    omv_job_t *job; /* parsed, with the submitter's overrides, validated */
    char path[OMV_JOB_PATH_MAX];
    char sets[OMV_DAEMON_SETS_MAX]; /* the overrides, tab-separated (kept in jobs.queue) */
    double submitted_s;
} queued_job_t;

/* How a job ended, for `omnivorectl jobs`. */
typedef struct {
    uint64_t id;
    char name[64];
    char path[OMV_JOB_PATH_MAX];
    job_state_t state;
    double accuracy, epochs, wall_s, end_s;
    char reason[160];
} finished_job_t;

/* Everything in struct omv_daemon belongs to the current job and is zeroed when the next one
 * is loaded, except the fields omv_daemon_unload_job (daemon.c) keeps: the config, sockets,
 * member records, the queue and the daemon's lifetime counters. */
struct omv_daemon {
    omv_daemon_config_t cfg;
    int has_job; /* a job is loaded (it may be over) */
    uint64_t job_id; /* 1, 2, ... in the order jobs were loaded or submitted */
    omv_job_t job;
    char job_path[OMV_JOB_PATH_MAX];
    char *job_text; /* the job file as read at start, kept in checkpoints */
    omv_router_t *router;
    omv_control_t *control;
    int shutdown;

    /* The model. */
    omv_model_layout_t layout;
    float *params; /* [param_count], split among the shards */
    uint32_t n_shards;
    uint32_t shard_offsets[OMV_WIRE_MAX_SHARDS + 1];
    omv_shard_t *shards;         /* each owned by its thread once the threads run */
    omv_shard_thread_t **threads; /* [n_shards] */
    float *gather_params;         /* [param_count] a consistent copy, for evals and checkpoints */
    float *gather_velocity;       /* [param_count] */
    float *probe_params, *probe_velocity; /* [param_count] the optimizer's probe base, made when
                                           * first saved */
    uint8_t pipe_extra[sizeof(((omv_peer_t *)0)->id) + OMV_WIRE_MAX_ENVELOPE];
    omv_sgd_t sgd;
    omv_groups_t *groups;

    /* Members: id = index + 1. Trainers and evaluators share the table; ids are not reused
     * while free records remain, so a late message from a dead worker cannot pass for another. */
    member_t *members;
    uint32_t n_members_max, n_members, n_slots;
    uint64_t joins_total, leaves_total, deaths_total, rejoins_total;

    /* The job's schedule. */
    job_state_t state;
    uint32_t train_count;  /* images in the training set the job uses */
    uint32_t worker_batch; /* images per worker per step: the group's batch over its members */
    uint64_t target_images; /* epochs x train_count: the job trains until it has seen these */
    double created_s; /* the daemon's start (kept across jobs) */
    double load_s, first_hello_s, start_s, train_end_s, end_s;
    double train_s_before; /* training seconds before a resume */
    uint64_t images_total, steps_total, late_total;
    uint64_t *group_images; /* [groups] images of the group's current step */
    double loss_sum;        /* since the last progress line */
    uint64_t loss_n;
    double last_loss;
    double last_line_s;
    uint64_t last_line_images;
    uint64_t staleness_max_observed; /* the largest step gap a served pull had to another group */
    omv_reconfig_t reconfig;         /* applied when every group is between steps */

    /* The optimizer (issue 5), when the job turns it on. */
    omv_optimizer_t *opt;
    uint64_t opt_gen;   /* the generation of the last command carried out */
    size_t opt_cursor;  /* decisions already written to the decisions file */
    FILE *decisions;    /* CKPT_DIR/decisions.jsonl */
    char decisions_path[OMV_JOB_PATH_MAX + 32];
    double *group_loss_sum; /* [max groups] losses of the group's current step */
    uint32_t *group_loss_n;
    uint64_t probe_images_total; /* images of probes: thrown away, not counted as training */
    double probe_seconds_total;  /* s of searches that ended (probes, their barriers) */
    double opt_search_since;     /* when the search under way began (0: none) */
    unsigned opt_cmd_flags;      /* the last command asked for (OMV_OPT_CMD_*) */
    int opt_in_probe;            /* the shards hold a probe's model (a PROBE command applied) */
    int opt_resume;              /* opt_saved came from a checkpoint: the optimizer takes it up */
    omv_opt_saved_t opt_saved;
    opt_phase_t phases[OMV_DAEMON_MAX_PHASES];
    uint32_t n_phases;
    uint64_t regroups_total;
    uint64_t pushes_recorded_total;  /* gradients recorded in the groups' bookkeeping, all shards */
    char fail_reason[256];

    /* Evaluation. */
    uint32_t evaluator; /* member id of the live evaluator; 0 none */
    int eval_busy, eval_wanted, eval_final_sent;
    int64_t eval_sent_ms;
    uint64_t eval_id;
    double eval_epoch, eval_wall_s;
    double next_eval_epoch;
    eval_point_t *history;
    size_t n_history, cap_history;

    /* Checkpoints. */
    char ckpt_dir[OMV_JOB_PATH_MAX];
    int ckpt_enabled, ckpt_due;
    uint64_t ckpt_seq;
    double ckpt_last_s;
    uint64_t ckpt_last_step;
    char ckpt_last_path[OMV_JOB_PATH_MAX + 64];
    char ckpt_resumed_from[OMV_JOB_PATH_MAX + 64];
    double ckpt_resumed_epoch; /* where the job stood in it */
    uint64_t ckpt_written_total, ckpt_failed_total;
    double ckpt_last_ms; /* how long the last write took */

    /* Reloading on SIGHUP. */
    volatile sig_atomic_t *reload_flag;
    char config_path[OMV_JOB_PATH_MAX];
    char cli_log_level[16];
    uint64_t reloads_total, reloads_failed_total;

    uint64_t refused[OMV_REFUSE_COUNT_];
    int64_t last_cron_ms;

    /* Jobs (daemon_jobs.c). */
    queued_job_t queue[OMV_DAEMON_MAX_QUEUE];
    uint32_t n_queue;
    finished_job_t finished[OMV_DAEMON_MAX_FINISHED]; /* a ring */
    uint32_t n_finished_total;
    uint64_t jobs_loaded_total, jobs_submitted_total;
    int job_recorded;       /* the current job's end is in finished[] */
    int job_submitted;      /* the current job came from the queue (not the boot job) */
    char job_sets[OMV_DAEMON_SETS_MAX]; /* its overrides, for jobs.queue */
    int queue_dirty;        /* jobs.queue is to be written again */
    int stop_requested;     /* `omnivorectl stop`: end once the checkpoint is written */
    double stop_requested_s;

    timeline_t timeline; /* per job: omv_daemon_timeline_reset */
};

double omv_daemon_epoch(const omv_daemon_t *d);
double omv_daemon_train_seconds(const omv_daemon_t *d);
double omv_daemon_wall_seconds(const omv_daemon_t *d);
int omv_daemon_live_trainers(const omv_daemon_t *d);
const char *omv_daemon_member_state(const member_t *m);

/* Asks for g compute groups; the daemon regroups once every group is between steps. Returns 0,
 * or -EINVAL/-EAGAIN with the reason in why[cap]. */
int omv_daemon_request_regroup(omv_daemon_t *d, uint32_t g, char *why, size_t cap);

/* Asks for a change between steps (merged with one already pending). */
void omv_daemon_request_reconfig(omv_daemon_t *d, const omv_reconfig_t *rc);

/* Handles worker messages for up to timeout_ms until no group is half-way through applying a
 * step. Returns 0 or -ETIMEDOUT. */
int omv_daemon_settle(omv_daemon_t *d, int timeout_ms);

/* Copies the model (and the momentum, when velocity is not NULL) out of the shard threads into
 * gather_params (gather_velocity): every update applied so far is in it. Returns 0 or a
 * negative errno. Before the threads start, copies from the shards directly. */
int omv_daemon_gather(omv_daemon_t *d, int velocity);

/* daemon.c */
/* Frees the current job (shard threads, model, groups, optimizer, history) and zeroes its
 * state; member records stay, and any still training are told to register again. */
void omv_daemon_unload_job(omv_daemon_t *d);
/* Makes job (copied; path names it, for logs and checkpoints) the current one and lays it out:
 * model, shards and their threads, groups, checkpoints (resuming from the newest). Idle members
 * are told to register again, into it. Returns 0 or a negative errno after logging why; on
 * failure no job is loaded. */
int omv_daemon_load_job(omv_daemon_t *d, const omv_job_t *job, const char *path, uint64_t id);
/* Checks what loading would check without loading: the data set's shape against the model.
 * Returns 0 or -EINVAL with the reason in err[OMV_CONFIG_ERR_MAX]. */
int omv_daemon_check_job(const omv_job_t *job, char *err);
/* Ends the current job (state: JOB_DONE, JOB_FAILED or JOB_STOPPED) and tells its workers. */
void omv_daemon_finish(omv_daemon_t *d, job_state_t state, const char *why);

/* daemon_jobs.c */
/* The control commands submit, stop and jobs. */
int omv_daemon_jobs_control(omv_daemon_t *d, int argc, char **argv, int json,
                            omv_strbuf_t *reply);
/* From the event loop: records a finished job, starts the next queued one when the current is
 * over, and ends a stopped one once its checkpoint is written. */
void omv_daemon_jobs_poll(omv_daemon_t *d);
/* Frees the queue (at exit). */
void omv_daemon_jobs_free(omv_daemon_t *d);
/* Queues the jobs STATE_DIR/jobs.queue lists (a job interrupted by a restart first, then the
 * queued ones, with their ids and overrides), from the last run of the daemon. */
void omv_daemon_jobs_restore(omv_daemon_t *d);

/* Answers peer with a refusal, logs it (the first few of each kind) and counts it. */
void omv_daemon_refuse(omv_daemon_t *d, const omv_peer_t *peer, omv_refuse_t code,
                       const char *who, const char *reason);

/* daemon_shards.c */
/* Handles what the shard threads sent back (parameters to forward, refusals). */
void omv_daemon_drain_pipes(omv_daemon_t *d);
/* Saves the model and its momentum as the probe base (restore 0) or puts them back (1).
 * Returns 0 or a negative errno. */
int omv_daemon_probe_base(omv_daemon_t *d, int restore);

/* daemon_reconfig.c */
/* Whether some member of group g was sent the parameters of the group's current step. */
int omv_daemon_group_begun(const omv_daemon_t *d, uint32_t g);
/* Carries out the pending change if every group is between steps. Returns whether pulls may be
 * served to everyone. */
int omv_daemon_try_reconfig(omv_daemon_t *d);

/* daemon_optimizer.c */
/* Starts the optimizer when the job asks for it (at the job's start). Returns 0 or -errno. */
int omv_daemon_opt_start(omv_daemon_t *d);
/* A group finished a step with mean training loss `loss`. */
void omv_daemon_opt_step(omv_daemon_t *d, uint32_t group, double loss, uint64_t images);
/* Asks the optimizer for its next command (also from the cron). */
void omv_daemon_opt_poll(omv_daemon_t *d);
/* The optimizer's command gen was carried out between steps. */
void omv_daemon_opt_applied(omv_daemon_t *d, uint64_t gen);
/* Whether a probe runs (the model is a probe's: no evaluations, checkpoints, or counting). */
int omv_daemon_opt_probing(const omv_daemon_t *d);
/* The live trainers changed (a trainer joined, left or died): the optimizer caps g by them and
 * runs again the probe they disturbed. */
void omv_daemon_opt_membership(omv_daemon_t *d);
/* Releases the job's optimizer state: the optimizer, its decisions file, the phases table, its
 * counters, the probe base and what a resumed checkpoint left for it. For the end of a job (and
 * omv_daemon_destroy); the next job's omv_daemon_opt_start begins afresh. */
void omv_daemon_opt_reset(omv_daemon_t *d);
/* Seconds spent searching so far (probes and their barriers), the search under way included. */
double omv_daemon_opt_probe_seconds(const omv_daemon_t *d);
/* Fills a checkpoint's optimizer part (phases allocated: omv_checkpoint_fini frees them).
 * Returns 0 or -ENOMEM. */
int omv_daemon_opt_save(const omv_daemon_t *d, omv_checkpoint_opt_t *ret);
/* Takes a resumed checkpoint's optimizer part: the phases table and counters now, the state
 * when the optimizer starts. */
void omv_daemon_opt_load(omv_daemon_t *d, const omv_checkpoint_opt_t *o);
/* The optimizer's state and decisions for status, the summary and `omnivorectl optimizer`. */
void omv_daemon_opt_report(omv_daemon_t *d, omv_strbuf_t *out, int json);

/* daemon_status.c: the control socket's commands. */
int omv_daemon_on_control(void *ctx, int argc, char **argv, omv_strbuf_t *reply);

/* daemon_checkpoint.c */
/* Resumes from the newest valid checkpoint in ckpt_dir when the job allows. Returns 1 when it
 * resumed, 0 when there was nothing to resume, or a negative errno (a checkpoint for another
 * model: the daemon does not start, rather than overwrite it). */
int omv_daemon_resume(omv_daemon_t *d);
/* Writes a checkpoint now. Returns 0 or a negative errno (logged, counted). */
int omv_daemon_checkpoint(omv_daemon_t *d, int finished);
/* Writes a due checkpoint when no group is half-way through applying a step. */
void omv_daemon_checkpoint_if_due(omv_daemon_t *d);

/* daemon_timeline.c: the training timeline behind `history` and `omnivorectl report`. */
/* Frees the timeline and makes it empty, ready for the next job (destroy calls it too). */
void omv_daemon_timeline_reset(omv_daemon_t *d);
/* The job starts (or resumes): records the configuration it starts with. */
void omv_daemon_timeline_start(omv_daemon_t *d);
/* A worker pushed a finite training loss. */
void omv_daemon_timeline_loss(omv_daemon_t *d, double loss);
/* From the cron: adds a point when the interval has passed (while the job runs). */
void omv_daemon_timeline_tick(omv_daemon_t *d);
/* Training ended (done or failed): adds a last point unless nothing happened since the last. */
void omv_daemon_timeline_end(omv_daemon_t *d);
/* Between steps, after a change was carried out: records the configuration if it differs from
 * the last one recorded. cause is static text. */
void omv_daemon_timeline_config(omv_daemon_t *d, const char *cause);
/* The `history` command's reply: training points, evaluations, changes and phases. */
void omv_daemon_timeline_report(omv_daemon_t *d, omv_strbuf_t *out, int json);

/* daemon_status.c: sends systemd a one-line STATUS= (state, epoch, step, images/s, workers);
 * rate-limited in notify.c, so it may be called from every cron tick. */
void omv_daemon_notify_status(omv_daemon_t *d);
