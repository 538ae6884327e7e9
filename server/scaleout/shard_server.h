/* The shard server's role in a job (omnivored --role shard): the run of the range of shards the
 * coordinator gave it, as its primary (it serves the range's pulls and applies its updates) or
 * as its backup (it takes the same pushes and serves nothing). The coordinator tells it who the
 * members are, when the job starts, each cut, and when the job is over (uplink.c). */
#pragma once

#include "run.h"

/* What a shard server's run is made from (env.role_arg): its range of the coordinator's
 * layout. */
typedef struct {
    uint32_t server_id;   /* its id at the coordinator */
    uint32_t first, last; /* shards [first, last) */
    uint32_t train_count; /* the coordinator's training images */
    int backup;           /* the range's backup: takes pushes, serves nothing */
} omv_shard_server_arg_t;

extern const omv_run_role_t omv_shard_server_role;

/* The coordinator put trainer m in slot and group. */
void omv_shard_server_adopt(omv_run_t *self, omv_member_t *m, uint32_t slot, uint32_t group);
/* The coordinator started the job (once the range is here). */
void omv_shard_server_start(omv_run_t *self);
/* The evaluator m attached: an evaluation that waited for it goes out. */
void omv_shard_server_evaluator_attached(omv_run_t *self, omv_member_t *m);
/* The coordinator's GATHER u asks for this server's range: now, or (final) once the job's last
 * step is in; an evaluation's (params_only, worker_id: the evaluator's member id) goes to the
 * evaluator, the final model with a part_dir into a checkpoint's part (the coordinator is told
 * where), the rest to the coordinator. */
void omv_shard_server_gather(omv_run_t *self, const omv_server_msg_t *u);
/* A cut: begin no more steps and say which each group has begun (FREEZE); finish the steps
 * up to the cut's and send the range, or only say so (CUT); go on, with the coordinator's
 * change if it makes one: a regroup, the update rule, the probe base (RESUME). */
void omv_shard_server_freeze(omv_run_t *self, uint64_t id);
void omv_shard_server_cut(omv_run_t *self, const omv_server_msg_t *cut);
void omv_shard_server_resume(omv_run_t *self, const omv_server_msg_t *u, const void *payload,
                             size_t bytes);
/* A failover's cut: begin nothing more, apply the steps up to the cut's clocks (every member
 * reported them), and write the range as checkpoint part_seq's part in part_dir, or send it (no
 * part_dir, or one it cannot write). */
void omv_shard_server_failover_cut(omv_run_t *self, const omv_server_msg_t *cut);
/* Whether every live group here has applied the steps before clocks[n], none half-way. */
int omv_shard_server_caught_up(const omv_run_t *self, const uint64_t *clocks, uint32_t n);
/* A backup at a cut (clocks[n]; NULL: the cut's orders are carried out): pushes from the cut's
 * steps on wait (backup.c). */
void omv_shard_server_backup_cut(omv_run_t *self, const uint64_t *clocks, uint32_t n);
/* Whether the range can no longer be trusted (a backup that lost track of its primary, a change
 * that does not fit): the server drops it and tells the coordinator. */
int omv_shard_server_broken(const omv_run_t *self);
