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

typedef enum { JOB_WAITING, JOB_RUNNING, JOB_FINISHING, JOB_DONE, JOB_FAILED } job_state_t;
extern const char *const omv_daemon_state_names[];

typedef enum { MEMBER_ALIVE, MEMBER_DEAD, MEMBER_LEFT } member_state_t;

typedef struct {
    int used;
    member_state_t state;
    omv_peer_t peer;
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

struct omv_daemon {
    omv_daemon_config_t cfg;
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
    double created_s, first_hello_s, start_s, train_end_s, end_s;
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
    uint64_t ckpt_written_total, ckpt_failed_total;
    double ckpt_last_ms; /* how long the last write took */

    /* Reloading on SIGHUP. */
    volatile sig_atomic_t *reload_flag;
    char config_path[OMV_JOB_PATH_MAX];
    char cli_log_level[16];
    uint64_t reloads_total, reloads_failed_total;

    uint64_t refused[OMV_REFUSE_COUNT_];
    int64_t last_cron_ms;
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

/* daemon_status.c: sends systemd a one-line STATUS= (state, epoch, step, images/s, workers);
 * rate-limited in notify.c, so it may be called from every cron tick. */
void omv_daemon_notify_status(omv_daemon_t *d);
