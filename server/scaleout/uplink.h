/* The shard server's side of the daemon (omnivored --role shard): its link up to the coordinator
 * (registration, heartbeats, the coordinator's orders: the job and its range, members, start,
 * gathers, cuts, the end), and workers attaching to it. The run of the range does the rest
 * (shard_server.h). */
#pragma once

#include "daemon_config.h"
#include "members.h"
#include "refusals.h"
#include "router.h"
#include "run.h"

typedef struct omv_uplink omv_uplink_t;

/* What the link works with: borrowed from the daemon, which outlives it. */
typedef struct {
    omv_router_t *router;
    omv_members_t *members;
    omv_refusals_t *refusals;        /* a primary's refusals, answered */
    omv_refusals_t *backup_refusals; /* a backup's: counted, not answered (its primary answers) */
    const omv_daemon_config_t *cfg;  /* coordinator, advertise, endpoint, curve, timeouts */
    int curve;                       /* the worker endpoint uses CURVE */
    const char *secret_key;          /* our secret certificate's path */
    const char *coordinator_key;     /* the coordinator's public certificate's path */
    omv_run_t **run; /* where the daemon keeps its run: the link makes the range's run there on
                      * the coordinator's ASSIGN, and drops it */
} omv_uplink_env_t;

/* Connects to the coordinator ([daemon] coordinator; CURVE with [security] coordinator_key
 * when the daemon uses CURVE). Returns NULL with errno set after logging why. Caller owns;
 * omv_uplink_destroy. */
omv_uplink_t *omv_uplink_new(const omv_uplink_env_t *env);
void omv_uplink_destroy(omv_uplink_t **self_p);
/* Handles what the coordinator sent. */
void omv_uplink_drain(omv_uplink_t *self);
/* Registers (again) with the coordinator, heartbeats, and notices a coordinator gone quiet. */
void omv_uplink_cron(omv_uplink_t *self);
/* A worker attaches: the coordinator must have told us of it, with this token (and key). */
void omv_uplink_attach(omv_uplink_t *self, const omv_peer_t *peer, const omv_attach_t *a);
/* A backup whose coordinator's orders wait for a cut's steps gives them once it has them; a
 * range that can no longer be trusted is dropped and the coordinator told. */
void omv_uplink_poll(omv_uplink_t *self);
/* Our id at the coordinator (0: not registered), and where our workers connect. */
uint32_t omv_uplink_server_id(const omv_uplink_t *self);
const char *omv_uplink_advertise(const omv_uplink_t *self);
