/* A checkpoint of a job over shard servers as one consistent cut in parts: at the cut each
 * server writes its range as a part file into the job's checkpoint folder (storage the
 * coordinator and every server share, as for torch.distributed.checkpoint), and the coordinator
 * writes the manifest naming every part last. A server that cannot write its part sends its
 * range, and the coordinator writes that part itself; a part the coordinator cannot see (a
 * folder that is not shared) turns parts off for the run: from then on every range comes to
 * the coordinator. */
#pragma once

#include "run.h"
#include "servers.h"

/* The coordinator: whether this checkpoint's cut asks the servers for parts. */
int omv_parts_wanted(const omv_run_t *self);

/* A shard server: writes the cut's range as its checkpoint's part in the cut's folder and tells
 * the coordinator (GATHERED with the part). Returns 0, or a negative errno (logged): the range
 * is to go to the coordinator instead. */
int omv_parts_send(omv_run_t *self, uint64_t gather_id);

/* A shard server: the coordinator cannot see the part it wrote for checkpoint seq (DROP_PART):
 * it is removed, if it is the last one written here. */
void omv_parts_drop(omv_run_t *self, uint64_t seq);

/* The coordinator: server s's GATHERED g names its part; records it for the manifest (a part
 * for another checkpoint or range is logged and left out, which fails the checkpoint). */
void omv_parts_take(omv_run_t *self, const omv_server_t *s, const omv_server_msg_t *g);

/* The coordinator: server s's range came in the gather's arrays in place of a part. */
void omv_parts_came(omv_run_t *self, const omv_server_t *s);

/* The coordinator: whether the cut's model is not here: a range was written as a part by its
 * server (or did not come at all). */
int omv_parts_remote(const omv_run_t *self);

/* The coordinator: a cut asked for parts is given up (the job ends, a failover): its checkpoint
 * number is not used again. */
void omv_parts_abandon(omv_run_t *self);

/* The coordinator: whether it sees every part its server wrote for this cut (the final
 * model's, before it counts as in). One it cannot see turns parts off, as at a manifest, and
 * the servers remove theirs; the caller then gathers the ranges instead. */
int omv_parts_seen(omv_run_t *self);

/* The coordinator: writes the parts whose ranges came here, checks that it sees every part,
 * and writes the manifest from view v (the run's state, without the model). Returns 0 or a
 * negative errno (logged, counted as a failed checkpoint). */
int omv_parts_write(omv_run_t *self, omv_run_ckpt_view_t *v);
