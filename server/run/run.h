/* One job's run: everything that lives as long as the job and no longer (its model in shards,
 * compute groups and clocks, the update rule, pulls, pushes and applies, evaluation,
 * checkpoints, the optimizer's daemon side, the timeline), made whole by omv_run_new and freed
 * whole by omv_run_destroy. Loading the next job is destroy + new. */
#pragma once

#include <stdint.h>

#include "eval.h"
#include "groups.h"
#include "job.h"
#include "members.h"
#include "model.h"
#include "reconfig.h"
#include "refusals.h"
#include "router.h"
#include "run_checkpoint.h"
#include "servers.h"
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

/* A shard server's part of a job (omnivored --role shard): it holds shards [first, last) of the
 * coordinator's layout, and is told by the coordinator who the members are, when the job
 * starts, and when it is over. */
typedef struct {
    uint32_t server_id; /* its id at the coordinator */
    uint32_t first, last;
    uint32_t train_count; /* the coordinator's training images */
    int backup;           /* the range's backup: takes pushes, serves nothing */
} omv_run_part_t;

/* What a run works with that outlives it: borrowed, from the daemon. */
typedef struct {
    omv_router_t *router;
    omv_members_t *members;
    omv_refusals_t *refusals;
    const char *state_dir;       /* checkpoints go under it unless the job says */
    const char *checkpoint_root; /* another folder a job's checkpoints may go to ("": none) */
    int once;                    /* the workers exit when the job ends (omnivored --once) */
    omv_servers_t *servers;      /* a coordinator's shard servers (NULL: none) */
    const omv_run_part_t *part;  /* a shard server's part of the job (NULL: the whole job) */
    int degraded; /* made again after a failover: takes the servers there are (at least its
                   * ranges'), not waiting for backups */
} omv_run_env_t;

/* How a requested stop ends, once a checkpoint of whole steps is written (or too late). */
typedef enum {
    OMV_RUN_STOP_NONE,
    OMV_RUN_STOP_JOB,  /* `omnivorectl stop`: the job ends, stopped */
    OMV_RUN_STOP_EXIT, /* the daemon exits: the job goes on after a restart */
} omv_run_stop_t;

/* A backup's push that came before its step could be taken (its group had not applied the
 * step before, which the primary had when it sent the parameters): it waits, in order. */
typedef struct {
    uint32_t worker_id;
    int64_t since_ms;
    omv_push_t push;
    omv_payload_t payload;
} omv_run_held_t;
/* How a range's part of a checkpoint's cut came to the coordinator. */
enum {
    OMV_RUN_PART_NONE = 0, /* not yet */
    OMV_RUN_PART_WRITTEN,  /* its server wrote it */
    OMV_RUN_PART_CAME,     /* its range came instead: the coordinator writes it */
    OMV_RUN_PART_WRONG,    /* its server wrote another checkpoint's: the checkpoint fails */
};

#define OMV_RUN_HELD_MAX 1024
#define OMV_RUN_HELD_MAX_MS 10000 /* a push waiting longer: the backup missed one */
/* The held pushes' bytes, at most: four steps of the range from every slot (a member is a step
 * ahead of its group at most), and never less than this. */
#define OMV_RUN_HELD_MIN_BYTES (64u << 20)

/* The fields are for reading (status, commands); the run changes them. */
typedef struct {
    omv_run_env_t env;
    uint64_t id; /* 1, 2, ... in the order jobs were submitted */
    omv_job_t job;
    char path[OMV_JOB_PATH_MAX];
    char *text; /* the job file as submitted, kept in checkpoints */
    omv_job_state_t state;
    char fail_reason[256];

    /* The model. */
    omv_model_layout_t layout;
    omv_shardset_t *shards;
    omv_groups_t *groups;
    omv_sgd_t sgd;
    uint32_t n_slots, max_groups;

    /* The schedule. */
    uint32_t train_count;   /* images in the training set the job uses */
    uint32_t worker_batch;  /* images per worker per step: the group's batch over its members */
    uint64_t target_images; /* epochs x train_count: the job trains until it has seen these */
    double load_s, first_hello_s, start_s, train_end_s, end_s;
    double train_s_before; /* training seconds before a resume */
    uint64_t images_total, steps_total, late_total;
    uint64_t *group_images; /* [max_groups] images of the group's current step */
    double *group_loss_sum; /* [max_groups] losses of the group's current step */
    uint32_t *group_loss_n;
    uint64_t *group_planned; /* [max_groups] split = speed: 1 + the step its shares are for */
    double loss_sum;         /* since the last progress line */
    uint64_t loss_n;
    double last_loss;
    double last_line_s;
    uint64_t last_line_images;
    uint64_t staleness_max_observed; /* the largest step gap a served pull had to another group */
    uint64_t regroups_total;
    uint64_t pushes_recorded_total;           /* gradients recorded in the groups' bookkeeping */
    uint64_t bytes_in_total, bytes_out_total; /* gradients taken, parameters sent (sockets) */
    uint64_t evals_sent_total;   /* a shard server: its range sent to the evaluator itself */
    uint64_t eval_pending;       /* a shard server: the evaluation to send the evaluator once it */
    uint32_t eval_pending_to;    /* attaches (0: none), and the evaluator's id */
    uint64_t direct_evals_total; /* a coordinator: evaluations the servers sent the evaluator */
    uint64_t serves_total;       /* steps' parameters sent to members */
    uint64_t inplace_serves_total; /* shards a local member read in the model segment */
    uint64_t inplace_raced_total;  /* their gradients refused: the shard changed meanwhile */
    omv_reconfig_t reconfig;       /* applied when every group is between steps */

    omv_eval_t eval;
    omv_run_ckpt_t ckpt;
    int ckpt_forced;    /* asked for by hand: written even while a probe runs (its base) */
    omv_tuner_t *tuner; /* when the job's [optimizer] is on */
    omv_timeline_t timeline;

    omv_run_stop_t stopping;
    double stop_deadline_s;
    int exit_ready; /* OMV_RUN_STOP_EXIT: the last checkpoint is written (or given up on) */
    int recorded;   /* its end is in the finished jobs */
    /* On a shard server: its part (is_part), and a final gather waiting for the last step. */
    int is_part;
    omv_run_part_t part;
    int part_gather_wanted;
    uint64_t part_gather_id;
    char final_part_dir[OMV_WIRE_PATH_MAX]; /* the final gather's part folder ("": none) */
    uint64_t final_part_seq;
    uint64_t final_eval_id; /* the final evaluation, to send the evaluator at the last step */
    uint32_t final_eval_to; /* (0: none) */
    /* A shard server that could not make its range: it asked for it, and a START waits. */
    int range_owed, start_owed;
    /* On a coordinator whose job has [cluster] servers: the servers that hold the model (in the
     * order of their shards), and a gather of the model from them under way. */
    uint32_t n_servers;
    uint32_t server_ids[OMV_WIRE_MAX_SERVERS];
    /* [cluster] replicas = 2: each range's backup (0: none), and how many the run waits for;
     * a failover (a server of the run is gone, every range still held somewhere) is a cut of
     * the ranges' holders at the steps applied, written as a checkpoint the run is made again
     * from, over the servers left. */
    uint32_t backup_ids[OMV_WIRE_MAX_SERVERS];
    uint32_t n_backups, backups_wanted;
    int failover; /* 1: a primary is gone (its backup holds its range), 2: only a backup, 3: a
                   * free server comes to keep a backup */
    int64_t failover_ms, failover_quiet_ms;
    int64_t failover_settle_ms; /* how long the reports must stand still before the cut */
    uint64_t failover_sig;
    uint32_t holder_ids[OMV_WIRE_MAX_SERVERS];
    uint64_t fetch_id;
    uint32_t fetch_left;
    int fetch_final;       /* the gather is of the final model (the job's last step is in) */
    int fetch_params_only; /* the gather is an evaluation's: the parameters alone */
    int fetched_final;     /* the shards hold the servers' final model */
    int fetch_fresh;       /* the shards hold what the servers sent last: evaluate it */
    float *fetch_params, *fetch_velocity, *fetch_second; /* [param_count] what they sent */
    uint64_t fetch_adam_steps;
    /* A consistent cut across the servers (a checkpoint): 0 none, 1 freezing (waiting for every
     * server's begun steps), 2 cutting (for their ranges), 3 the ranges are in (waiting for
     * the reports of the steps in it). cut_clocks[max_groups]: the cut's step per group; on a
     * shard server, the steps it may begin while frozen. */
    int cut_phase;
    int cut_ranges; /* the servers send their ranges (a checkpoint); else only their steps */
    uint32_t joins_pending; /* trainers waiting for a cut to join */
    uint32_t cut_left;
    uint64_t cut_id;
    uint64_t *cut_clocks;
    int frozen, cut_set, cut_sent, cut_no_ranges; /* a shard server's side of it */
    int failover_cut;     /* a failover's cut: pushes at or past it are left out */
    int part_probing;     /* the coordinator's optimizer probes: steps here are not training's */
    omv_run_held_t *held; /* a backup's pushes waiting for their step [OMV_RUN_HELD_MAX] */
    uint32_t n_held;
    size_t held_bytes; /* their payloads' */
    int part_broken;   /* a shard server's part no longer is the coordinator's (a backup that lost
                        * track, a change that does not fit): it is dropped and the coordinator
                        * told */
    /* A backup at a cut: pushes for the cut's steps and later wait until the coordinator's
     * orders at the cut are carried out here too. */
    int backup_cut_on;
    uint32_t backup_cut_n;
    uint64_t backup_cut[OMV_WIRE_MAX_CLOCKS];
    /* A server of the job is gone and no replica holds its shards: the daemon makes the run
     * again from its last checkpoint (omv_schedule_poll), why says why. */
    int rewind, rewind_degraded; /* degraded: with the servers left, not waiting for more */
    char rewind_reason[256];
    uint64_t freeze_id;
    /* How a done job ended: with an evaluation of its final model (the final request answered,
     * or the one that reached stop_at_accuracy), and its final checkpoint 1 written, -1 failed,
     * 0 not tried (checkpoints off). */
    int final_eval, final_ckpt;
    int final_in_parts; /* a coordinator: the final model came as the servers' parts, not here */
    /* A checkpoint's cut over shard servers in parts (run_parts.h): on the coordinator, the
     * checkpoint the parts are for, each range's part by its first shard and how it came
     * (OMV_RUN_PART_*), and whether the servers write parts at all; on a server, the folder and
     * checkpoint of the cut's part. */
    int cut_parts, parts_off;
    uint64_t cut_seq;
    uint8_t parts_how[OMV_WIRE_MAX_SHARDS];
    omv_checkpoint_part_ref_t parts[OMV_WIRE_MAX_SHARDS];
    char cut_part_dir[OMV_WIRE_PATH_MAX];
    uint64_t part_written_seq; /* a server: the last part it wrote (0: none), and where */
    char part_written_path[OMV_WIRE_PATH_MAX + 128];
} omv_run_t;

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
double omv_run_result_accuracy(const omv_run_t *r);

/* Makes the run of job (copied; path names it in logs, text is copied for checkpoints): model,
 * shards and their executors, groups, checkpoints, resuming from the newest. Returns NULL with
 * errno set after logging why. Caller owns; omv_run_destroy. */
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

/* ---- the model on shard servers: a coordinator's side ---- */

/* Whether the job waits for shard servers before it takes workers. */
int omv_run_wants_servers(const omv_run_t *self);
/* Takes server s (free, alive) for the job; once it has all it waits for, assigns their
 * ranges and sends them the job. Returns 1 when the job has all its servers now. */
int omv_run_add_server(omv_run_t *self, omv_server_t *s);
/* A free shard server is there and a range of the running job has no backup: the servers are
 * cut and the run made again from the cut with it. Returns whether that began. */
int omv_run_take_backup(omv_run_t *self);
/* A worker's report of a step whose gradients went to the shard servers. */
void omv_run_report(omv_run_t *self, omv_member_t *m, const omv_step_report_t *rep);
/* A server's range of the model, asked for by a gather. */
void omv_run_gathered(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *g,
                      const float *payload, size_t bytes);
/* A server's begun steps for the cut under way. */
void omv_run_frozen(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *f);
/* A server of the job is gone: with no replica of its shards, the run asks to be made again
 * from its last checkpoint (rewind), or fails when it writes none. */
void omv_run_server_lost(omv_run_t *self, omv_server_t *s);

/* ---- a shard server's side ---- */

/* The coordinator put trainer m in slot and group. */
void omv_run_adopt(omv_run_t *self, omv_member_t *m, uint32_t slot, uint32_t group);
/* The coordinator started the job. */
void omv_run_part_start(omv_run_t *self);
/* The evaluator m attached: an evaluation that waited for it goes out. */
void omv_run_evaluator_attached(omv_run_t *self, omv_member_t *m);
/* The coordinator's GATHER u asks for this server's range: now, or (final) once the job's last
 * step is in; an evaluation's (params_only, worker_id: the evaluator's member id) goes to the
 * evaluator, the final model with a part_dir into a part file (the coordinator is told where),
 * the rest to the coordinator. */
void omv_run_part_gather(omv_run_t *self, const omv_server_msg_t *u);
/* A shard server: the coordinator cannot see the part it wrote for checkpoint seq (DROP_PART):
 * it is removed, if it is the last one written here (parts.c). */
void omv_run_parts_drop(omv_run_t *self, uint64_t seq);
/* A cut: begin no more steps and say which each group has begun (FREEZE); finish the steps
 * up to the cut's and send the range, or only say so (CUT); go on, with the coordinator's
 * change if it makes one: a regroup, the update rule, the probe base (RESUME). */
void omv_run_part_freeze(omv_run_t *self, uint64_t id);
void omv_run_part_cut(omv_run_t *self, const omv_server_msg_t *cut);
void omv_run_part_resume(omv_run_t *self, const omv_server_msg_t *u, const void *payload,
                         size_t bytes);
/* A backup at a cut (clocks[n]; NULL: the cut's orders are carried out): pushes from the cut's
 * steps on wait. */
void omv_run_backup_cut(omv_run_t *self, const uint64_t *clocks, uint32_t n);
/* A failover's cut: begin nothing more, apply the steps up to the cut's clocks (every member
 * reported them), and write the range as part part_seq in part_dir, or send it (no part_dir, or
 * one it cannot write). */
void omv_run_part_failover_cut(omv_run_t *self, const omv_server_msg_t *cut);
/* Whether every live group here has applied the steps before clocks[n], none half-way. */
int omv_run_part_caught_up(const omv_run_t *self, const uint64_t *clocks, uint32_t n);

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

/* ---- from the commands ---- */

/* Asks for g compute groups, between steps. Returns 0, or -EINVAL/-EAGAIN with why[cap]. */
int omv_run_request_regroup(omv_run_t *self, uint32_t g, char *why, size_t cap);
/* Asks for a checkpoint as soon as the groups hold whole steps. Returns 0, or -EINVAL/-EAGAIN
 * with why[cap]. */
int omv_run_request_checkpoint(omv_run_t *self, char *why, size_t cap);
/* Stops the run once a checkpoint of whole steps is written, or after settle_s without one. */
void omv_run_stop(omv_run_t *self, omv_run_stop_t how, double settle_s);
/* Ends the job now (state OMV_JOB_DONE, OMV_JOB_FAILED or OMV_JOB_STOPPED) and tells its workers.
 */
void omv_run_finish(omv_run_t *self, omv_job_state_t state, const char *why);

/* ---- reading ---- */

double omv_run_epoch(const omv_run_t *self);
/* Seconds of training so far, across restarts. */
double omv_run_train_seconds(const omv_run_t *self);
double omv_run_wall_seconds(const omv_run_t *self);
double omv_run_images_per_second(const omv_run_t *self);
int omv_run_live_trainers(const omv_run_t *self);
