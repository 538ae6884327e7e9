/* The shard server's side of the daemon (omnivored --role shard): its link to the coordinator
 * (registration, heartbeats, the coordinator's orders: the job and its range, members, start,
 * gathers, the end), and workers attaching to it. The run does the rest, on the shards of its
 * part. */
#pragma once

#include "daemon_priv.h"

/* Connects to the coordinator ([daemon] coordinator; CURVE with [security] coordinator_key
 * when the daemon uses CURVE). Returns 0 or a negative errno after logging why. */
int omv_part_setup(omv_daemon_t *d);
/* Handles what the coordinator sent. */
void omv_part_drain(omv_daemon_t *d);
/* Registers (again) with the coordinator, heartbeats, and notices a coordinator gone quiet. */
void omv_part_cron(omv_daemon_t *d);
/* A worker attaches: the coordinator must have told us of it, with this token (and key). */
void omv_part_attach(omv_daemon_t *d, const omv_peer_t *peer, const omv_attach_t *a);
/* A backup whose coordinator's orders wait for a cut's steps: gives them once it has them. */
void omv_part_poll(omv_daemon_t *d);
