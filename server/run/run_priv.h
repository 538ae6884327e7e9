/* Inside one job's run: its state, the role table that scaleout/ fills in, and what the run's
 * files (and its roles) call of each other. Only server/run/ and server/scaleout/ include it. */
#pragma once

#include "model.h"
#include "reconfig.h"
#include "run.h"

/* The progress line: what was pushed since the last one. */
typedef struct {
    double loss_sum;
    uint64_t loss_n;
    double last_loss;
    double last_s; /* when the last line was written */
    uint64_t last_images;
} omv_run_line_t;

/* A requested stop, which ends once a checkpoint of whole steps is written (or too late). */
typedef struct {
    omv_run_stop_t how;
    double deadline_s;
    int exit_ready; /* OMV_RUN_STOP_EXIT: the last checkpoint is written (or given up on) */
} omv_run_stopping_t;

/* A cut's hold on the steps (a shard server's, set by its role): while on, no step at or past
 * at[g] begins in group g; with drop_late (a failover's cut) pushes for them are late, left
 * out as the coordinator leaves them out. */
typedef struct {
    int on, drop_late;
    uint64_t *at; /* [max_groups] */
} omv_run_freeze_t;

/* What a run does that one daemon's does not, for the run of a role (scaleout/ defines them:
 * the coordinator's, whose model is on shard servers, and the shard server's, of its range).
 * Each hook's contract is the run's call of it; a NULL hook does what one daemon does. */
struct omv_run_role {
    omv_run_kind_t kind;
    /* Makes the role's state (role_state) from arg before the model is made; may set the run's
     * shards (lo, hi), backup and plan.train_count. Returns 0 or a negative errno (logged). */
    int (*init)(omv_run_t *r, const void *arg);
    /* The model and its checkpoint are in. Returns 0 or a negative errno (logged). */
    int (*ready)(omv_run_t *r);
    /* Frees the role's state: the run is going. */
    void (*fini)(omv_run_t *r);
    /* Trainer m asks to join the job: 1 when it waits (the role welcomes it later). */
    int (*join)(omv_run_t *r, omv_member_t *m, int rejoin, const char *who);
    /* Adds what the role's workers need to m's Welcome. */
    void (*welcome)(omv_run_t *r, omv_member_t *m, omv_welcome_t *w);
    /* A live member of the job is gone, after the run's own bookkeeping. */
    void (*member_gone)(omv_run_t *r, omv_member_t *m, omv_member_state_t why);
    /* A push the role keeps for later: 1 when it took it. */
    int (*push)(omv_run_t *r, omv_member_t *m, const omv_push_t *p);
    /* The job started. */
    void (*started)(omv_run_t *r);
    /* Training reached its images: 1 when the role ends the training itself (no final
     * evaluation from this run). */
    int (*finishing)(omv_run_t *r);
    /* The job ended (its state and timeline set): 1 when its workers are not this run's to
     * tell. */
    int (*ended)(omv_run_t *r);
    /* The first thing omv_run_progress does. */
    void (*progress)(omv_run_t *r);
    /* Whether the final model is where the job's end needs it; if not and fetch, asks for it. */
    int (*final_model)(omv_run_t *r, int fetch);
    /* An evaluation is due (final: the job's last): 1 when the role took it. */
    int (*evaluate)(omv_run_t *r, omv_member_t *evaluator, int final);
    /* A checkpoint may be due: 1 when the role takes it over (writes it at a cut). */
    int (*checkpoint_due)(omv_run_t *r);
    /* A checkpoint from view v: 1 when the role wrote it (or could not), *ret its result. */
    int (*save)(omv_run_t *r, omv_run_ckpt_view_t *v, int *ret);
    /* Periodic work, after the run's. */
    void (*cron)(omv_run_t *r);
    /* The role's fields of a view. */
    void (*view)(const omv_run_t *r, omv_run_view_t *v);
};

struct omv_run {
    omv_run_env_t env;
    const omv_run_role_t *role; /* NULL: one daemon holds the whole model */
    void *role_state;           /* the role's own, made and freed by it */
    uint64_t id;                /* 1, 2, ... in the order jobs were submitted */
    omv_job_t job;
    char path[OMV_JOB_PATH_MAX];
    char *text; /* the job file as submitted, kept in checkpoints */
    omv_job_state_t state;
    char fail_reason[256];

    /* The model: its layout, its shards (this run holds [lo, hi) of them), the groups and the
     * update rule. */
    omv_model_layout_t layout;
    omv_shardset_t *shards;
    uint32_t lo, hi;
    omv_groups_t *groups;
    omv_sgd_t sgd;
    uint32_t n_slots, max_groups;

    omv_run_plan_t plan;
    omv_run_times_t times;
    omv_run_stats_t stats;
    omv_run_sums_t sums;
    omv_run_line_t line;
    omv_reconfig_t reconfig; /* applied when every group is between steps */
    omv_eval_t eval;
    omv_run_ckpt_t ckpt;
    omv_tuner_t *tuner; /* when the job's [optimizer] is on */
    omv_timeline_t timeline;
    omv_run_stopping_t stop;
    int recorded; /* its end is in the finished jobs */
    omv_run_final_t final;
    omv_run_freeze_t freeze;
    int backup;  /* a shard server's backup of its range: takes pushes, serves nothing */
    int probing; /* the coordinator's optimizer probes: steps here are not training's */
    omv_run_rewind_t rewind;
};

/* Whether the run's model is on shard servers (a coordinator's), or the run is a shard
 * server's range of one. */
static inline int omv_run_remote(const omv_run_t *r)
{
    return r->role != NULL && r->role->kind == OMV_RUN_COORDINATOR;
}

static inline int omv_run_is_server(const omv_run_t *r)
{
    return r->role != NULL && r->role->kind == OMV_RUN_SERVER;
}

/* ---- reading (stats.c) ---- */

/* The update rule for the next update: the one in force, with the learning rate where the
 * job's schedule has it now. */
omv_sgd_t omv_run_current_rule(const omv_run_t *r);
omv_timeline_now_t omv_run_timeline_now(const omv_run_t *r);

/* ---- changes between steps (changes.c) ---- */

/* The optimizer's turn: a change it asks for is merged into the pending one. */
void omv_run_tuner_poll(omv_run_t *r);
/* The live trainers changed: the optimizer caps g by them and runs again what they disturbed. */
void omv_run_tuner_membership(omv_run_t *r);
/* Saves or restores the probe base as rc asks, restore first. */
void omv_run_probe_base(omv_run_t *r, const omv_reconfig_t *rc);
/* The change rc at clock, with live trainers, on this run's groups and rule (the probe base is
 * the caller's): regroups (after a restore too, so that every group starts again from the same
 * model at a common clock, which keeps the bound), sets the rule, and tells the optimizer and
 * the timeline. Returns the groups asked for (0: none) and in *ret_regrouped whether the
 * regroup was made. */
uint32_t omv_run_make_change(omv_run_t *r, const omv_reconfig_t *rc, uint64_t clock, int live,
                             int *ret_regrouped);
/* Carries out the pending change if every group is between steps. Returns whether pulls may be
 * served. */
int omv_run_try_reconfig(omv_run_t *r);

/* ---- pulls (serve.c) ---- */

/* Fixes what member m's step of group is made of as its first shard is sent: its batch, its
 * gradient's weight, and the staleness the read has. */
void omv_run_begin_serve(omv_run_t *r, omv_member_t *m, uint32_t group, uint64_t step);
/* What m's gradient counts for in its group's mean (1 when the batch splits evenly). */
float omv_run_push_weight(const omv_run_t *r, const omv_member_t *m, uint32_t group);
/* Shard s of group's current step was just applied: the members that asked for the next step
 * get that shard now. */
void omv_run_serve_early(omv_run_t *r, uint32_t group, uint32_t s);
/* Answers the parked pulls the groups and the bound allow. */
void omv_run_serve_parked(omv_run_t *r);

/* ---- pushes (push.c) ---- */

/* The step's figures (they come with the first shard's push, or a report): the member's, its
 * group's and the job's. */
void omv_run_count_step(omv_run_t *r, omv_member_t *m, uint32_t group, const omv_push_t *p);
/* Takes a push whose payload is in *held (NULL: the router's last message; closed either way). */
void omv_run_push_with(omv_run_t *r, omv_member_t *m, const omv_push_t *p, omv_payload_t *held);
/* The groups' events (an applied shard, an advanced group, a retired one), for omv_groups_new. */
omv_groups_events_t omv_run_group_events(omv_run_t *r);

/* ---- evaluations (evaluate.c) ---- */

/* Sends the evaluator the model to evaluate, now or once it is free. */
void omv_run_request_eval(omv_run_t *r);

/* ---- checkpoints (checkpoints.c) ---- */

/* Writes a checkpoint now. Returns 0 or a negative errno (logged, counted). */
int omv_run_write_checkpoint(omv_run_t *r);
/* Writes a due checkpoint when no group is half-way through a step (the role may take it). */
void omv_run_checkpoint_if_due(omv_run_t *r);
/* Puts checkpoint c's model and optimizer state into the shards (state of another update rule
 * starts afresh). Returns 0 or -errno. */
int omv_run_restore_state(omv_run_t *r, const omv_checkpoint_t *c);
/* [model] init: the model's weights from the safetensors file at path (optimizer state fresh).
 * Returns 0 or -EINVAL (logged). */
int omv_run_load_init(omv_run_t *r, const char *path);

/* ---- joining (join.c) ---- */

/* Divides the training set among the live trainers in order of id. */
void omv_run_assign_slices(omv_run_t *r);
/* The job as its workers take it, into a Welcome. */
void omv_run_fill_jobspec(const omv_run_t *r, omv_jobspec_t *j);
/* Puts trainer m in a group and fills its Welcome w's group, first step and slice. */
void omv_run_join_trainer(omv_run_t *r, omv_member_t *m, int rejoin, const char *who,
                          omv_welcome_t *w);

/* ---- the job's life (lifecycle.c) ---- */

/* The job starts (why: how, for the log). */
void omv_run_start(omv_run_t *r, const char *why);
