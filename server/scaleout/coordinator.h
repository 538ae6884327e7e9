/* The coordinator's side of a job whose model is on shard servers ([cluster] servers = N): the
 * run's role (omv_coord_role, chosen when the daemon makes the run), the servers the job takes,
 * and what servers and trainers send the coordinator about it. Each function does nothing for a
 * run whose model is not on servers (a step report is refused). */
#pragma once

#include "run.h"
#include "servers.h"

/* What a coordinator's run is made from (env.role_arg). */
typedef struct {
    omv_servers_t *servers; /* the daemon's shard servers, borrowed */
    int degraded; /* made again after a failover: takes the servers there are (at least its
                   * ranges'), not waiting for backups */
} omv_coord_arg_t;

extern const omv_run_role_t omv_coord_role;

/* Whether the job waits for shard servers before it takes workers. */
int omv_coord_wants_servers(const omv_run_t *self);
/* Takes server s (free, alive) for the job; once it has all it waits for, assigns their
 * ranges and sends them the job. Returns 1 when the job has all its servers now. */
int omv_coord_add_server(omv_run_t *self, omv_server_t *s);
/* A free shard server is there and a range of the running job has no backup: the servers are
 * cut and the run made again from the cut with it. Returns whether that began. */
int omv_coord_take_backup(omv_run_t *self);
/* A worker's report of a step whose gradients went to the shard servers. */
void omv_coord_report(omv_run_t *self, omv_member_t *m, const omv_step_report_t *rep);
/* A server's range of the model, asked for by a gather or a cut. */
void omv_coord_gathered(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *g,
                        const float *payload, size_t bytes);
/* A server's begun steps for the cut under way. */
void omv_coord_frozen(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *f);
/* A server of the job is gone: a failover when every range is still held, else back to the
 * last checkpoint (rewind), or failed when the job writes none. */
void omv_coord_server_lost(omv_run_t *self, omv_server_t *s);
