/* Inside the shard server's role: the state of a server's run of its range (a final gather and
 * evaluations waiting for the last step, the range owed by the coordinator, its side of a cut,
 * a backup's held pushes, the last part it wrote), for shard_server.c, backup.c, range.c,
 * parts.c and uplink.c. */
#pragma once

#include "run_priv.h"
#include "shard_server.h"

/* A backup's push that came before its step could be taken (its group had not applied the
 * step before, which the primary had when it sent the parameters): it waits, in order. */
typedef struct {
    uint32_t worker_id;
    int64_t since_ms;
    omv_push_t push;
    omv_payload_t payload;
} omv_held_push_t;

#define OMV_HELD_MAX 1024
#define OMV_HELD_MAX_MS 10000 /* a push waiting longer: the backup missed one */
/* The held pushes' bytes, at most: four steps of the range from every slot (a member is a step
 * ahead of its group at most), and never less than this. */
#define OMV_HELD_MIN_BYTES (64u << 20)

/* A backup's pushes waiting for their step, and a cut's steps it holds back until the
 * coordinator's orders at the cut are carried out here too. */
typedef struct {
    omv_held_push_t *q; /* [OMV_HELD_MAX] once needed */
    uint32_t n;
    size_t bytes; /* their payloads' */
    int cut_on;
    uint32_t cut_n;
    uint64_t cut[OMV_WIRE_MAX_CLOCKS];
} omv_held_t;

/* Something waiting for the job's last step (or the evaluator to attach): its gather id (or
 * the evaluation's), and the evaluator's member id (0: none). */
typedef struct {
    uint64_t id;
    uint32_t to;
} omv_waiting_t;

/* The final model's gather, once the last step is in: into a part in dir ("": to the
 * coordinator). */
typedef struct {
    int wanted;
    uint64_t id;
    char dir[OMV_WIRE_PATH_MAX];
    uint64_t seq;
} omv_final_gather_t;

/* This server's side of a cut (the freeze itself is the run's: r->freeze). */
typedef struct {
    uint64_t id;                 /* the cut's gather id */
    int set, sent;               /* its clocks came (CUT); its range (or its steps) went */
    int no_ranges;               /* only its steps, not the range */
    char dir[OMV_WIRE_PATH_MAX]; /* its part's folder ("": the range to the coordinator) */
    uint64_t seq;                /* its part's checkpoint */
} omv_server_cut_t;

typedef struct {
    uint32_t server_id; /* its id at the coordinator */
    omv_final_gather_t final_gather;
    omv_waiting_t final_eval;   /* the final evaluation, to send the evaluator at the last step */
    omv_waiting_t eval_pending; /* an evaluation for an evaluator that has not attached yet */
    int range_owed, start_owed; /* it could not make its range: asked for it; a START waits */
    omv_server_cut_t cut;
    omv_held_t held;
    int broken;
    /* The last part it wrote (seq 0: none), and where: removed if the coordinator cannot see
     * it. */
    struct {
        uint64_t seq;
        char path[OMV_WIRE_PATH_MAX + 128];
    } written;
} omv_shard_server_t;

static inline omv_shard_server_t *omv_shard_server(const omv_run_t *r)
{
    return r->role_state;
}

/* ---- a backup (backup.c) ---- */

/* Keeps push p of m when its step cannot be taken yet. Returns whether it was kept. */
int omv_backup_hold(omv_run_t *r, omv_member_t *m, const omv_push_t *p);
/* Takes the held pushes whose steps have come, in the order they came. */
void omv_backup_release(omv_run_t *r);
/* Frees what is still held (the run is going). */
void omv_backup_fini(omv_run_t *r);
