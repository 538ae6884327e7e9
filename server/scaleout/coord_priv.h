/* Inside the coordinator's role: the state of a run whose model is on shard servers (the
 * servers that hold it, gathers of it, the consistent cut, a failover, a checkpoint's parts),
 * and what the coordinator's files call of each other. Its public side is coordinator.h. */
#pragma once

#include "checkpoint.h"
#include "coordinator.h"
#include "run_priv.h"

/* A consistent cut across the servers (a checkpoint, a join, a change, a failover). */
typedef enum {
    OMV_CUT_NONE,
    OMV_CUT_FREEZING, /* waiting for every server's begun steps (FROZEN) */
    OMV_CUT_CUTTING,  /* the cut's clocks are set: waiting for the servers' ranges (GATHERED) */
    OMV_CUT_IN,       /* the ranges are in: waiting for the reports of the steps in the cut */
} omv_cut_phase_t;

/* Why the run is cut to be made again over other servers. */
typedef enum {
    OMV_FAILOVER_NONE,
    OMV_FAILOVER_PRIMARY,    /* a primary is gone: its backup holds its range */
    OMV_FAILOVER_BACKUP,     /* only a backup is gone: every primary holds its range */
    OMV_FAILOVER_NEW_BACKUP, /* a free server comes to keep a range's backup */
} omv_failover_phase_t;

/* How a range's part of a checkpoint's cut came to the coordinator. */
typedef enum {
    OMV_PART_NONE,    /* not yet */
    OMV_PART_WRITTEN, /* its server wrote it */
    OMV_PART_CAME,    /* its range came instead: the coordinator writes it */
    OMV_PART_WRONG,   /* its server wrote another checkpoint's: the checkpoint fails */
} omv_part_how_t;

/* A gather of the model from the servers, into the coordinator's shards. */
typedef struct {
    uint64_t id;        /* the last gather's or cut's id (they share the sequence) */
    uint32_t left;      /* servers whose range has not come yet (0: none under way) */
    int final;          /* the gather is of the final model (the job's last step is in) */
    int params_only;    /* the gather is an evaluation's: the parameters alone */
    int fetched_final;  /* the shards hold the servers' final model */
    int fresh;          /* the shards hold what the servers sent last: evaluate it */
    int final_in_parts; /* the final model came as the servers' parts, not here */
    float *params, *velocity, *second; /* [param_count] what they sent */
    uint64_t adam_steps;
} omv_coord_gather_t;

typedef struct {
    omv_cut_phase_t phase;
    int ranges;       /* the servers send their ranges (a checkpoint); else only their steps */
    uint32_t left;    /* servers whose FROZEN has not come */
    uint64_t id;      /* its gather id */
    uint64_t *clocks; /* [max_groups] the cut's step per group */
} omv_coord_cut_t;

/* A failover: a server of the run is gone, every range still held somewhere; the ranges'
 * holders are cut at the steps applied, written as a checkpoint the run is made again from,
 * over the servers left. */
typedef struct {
    omv_failover_phase_t phase;
    int64_t ms, quiet_ms; /* when it began; when the reports last moved */
    int64_t settle_ms;    /* how long the reports must stand still before the cut */
    uint64_t sig;         /* the reports' signature at the last look */
    uint32_t holder_ids[OMV_WIRE_MAX_SERVERS];
} omv_coord_failover_t;

/* A checkpoint's cut in parts (parts.c): the checkpoint the parts are for, each range's part
 * by its first shard and how it came, and whether the servers write parts at all. */
typedef struct {
    int on;  /* this cut asks the servers for parts */
    int off; /* parts are off for the run: a server wrote one the coordinator cannot see */
    uint64_t seq;
    uint8_t how[OMV_WIRE_MAX_SHARDS]; /* omv_part_how_t */
    omv_checkpoint_part_ref_t ref[OMV_WIRE_MAX_SHARDS];
} omv_coord_parts_t;

typedef struct {
    omv_servers_t *servers; /* the daemon's, borrowed */
    int degraded;
    /* The servers that hold the model (in the order of their shards); with [cluster]
     * replicas = 2 each range's backup (0: none), and how many the run waits for. */
    uint32_t n_servers, server_ids[OMV_WIRE_MAX_SERVERS];
    uint32_t backup_ids[OMV_WIRE_MAX_SERVERS];
    uint32_t n_backups, backups_wanted;
    uint32_t joins_pending; /* trainers waiting for a cut to join */
    omv_coord_gather_t gather;
    omv_coord_cut_t cut;
    omv_coord_failover_t failover;
    omv_coord_parts_t parts;
} omv_coord_t;

static inline omv_coord_t *omv_coord(const omv_run_t *r)
{
    return r->role_state;
}

/* Whether the cut's clocks are set (it is cutting, or its ranges are in). */
static inline int omv_coord_cut_clocks_set(const omv_coord_t *co)
{
    return co->cut.phase == OMV_CUT_CUTTING || co->cut.phase == OMV_CUT_IN;
}

/* ---- gathers (gather.c) ---- */

/* Room for the servers' ranges. Returns 0 or -ENOMEM (logged). */
int omv_coord_gather_buffers(omv_run_t *r);
/* Whether the servers send the evaluator their ranges themselves (it attached to them), or
 * there is no evaluator. */
int omv_coord_evals_direct(const omv_run_t *r);
/* Whether the coordinator's shards hold the model: a gather of it came (and the final model is
 * not in the servers' parts). */
int omv_coord_model_here(const omv_run_t *r);
/* Asks the servers for their ranges (final: once the job's last step is in); they come to
 * omv_coord_gathered. */
void omv_coord_fetch(omv_run_t *r, int final);
/* The arrays server s's GATHERED g is to bring: 1 (the parameters alone), or the range's state
 * (omv_range_arrays); and its bytes (0: its steps alone, or its range in a part). */
size_t omv_coord_gather_want(const omv_run_t *r, const omv_server_t *s, const omv_server_msg_t *g,
                             uint32_t *ret_arrays);
/* Server s's range of gather g, checked against omv_coord_gather_want: into the gather's
 * arrays (or as a checkpoint's part), and the run goes on once every server's is in. */
void omv_coord_gather_take(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *g,
                           const float *payload, size_t bytes);

/* ---- the cut (cut.c) ---- */

/* Begins a cut (ranges: the servers send or write their ranges, a checkpoint's; parts: as a
 * checkpoint's parts): its id, its clocks from zero; a gather under way is dropped, the cut
 * brings the model. The caller sends FREEZE (or, in a failover, CUT once the reports settle). */
void omv_coord_begin_cut(omv_run_t *r, int ranges, int parts);
/* Whether the reports of every step in the cut are in. */
int omv_coord_cut_caught_up(const omv_run_t *r);
/* Sends op (FREEZE, CUT, RESUME) of the cut to the job's servers. */
void omv_coord_send_cut_op(omv_run_t *r, omv_server_op_t op);
/* The servers go on from the cut, with the pending change if any. */
void omv_coord_cut_resume(omv_run_t *r);

/* ---- failover (failover.c) ---- */

/* The failover cannot end: back to the last checkpoint (or failed). */
void omv_coord_failover_abandon(omv_run_t *r, const char *why);
/* Periodic: a failover waits for the reports to stand still, then cuts the holders. */
void omv_coord_failover_settle(omv_run_t *r);
/* The failover's cut is in: a checkpoint of it, and the run made again from it. */
void omv_coord_failover_done(omv_run_t *r);
