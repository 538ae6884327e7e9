/* A trainer's shared-memory link with a daemon on its host (common/shm.h): the connection that
 * carries envelopes and the segments that hold the values. The one place that decides whether a
 * step, a push and a message go this way or over the daemon's socket. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "link.h"
#include "session.h"
#include "shm.h"
#include "wire.h"

typedef struct {
    const omv_session_config_t *cfg; /* borrowed */
    int conn;                        /* the connection; -1: none */
    int on;                          /* envelopes of shared-memory steps go on conn */
    omv_shm_batch_t *held;           /* envelopes for conn, sent when we next wait */
    int64_t sent_ms;                 /* when conn last took envelopes (ms) */
    omv_shm_maps_t maps;             /* the segments: params, grads, and the model read-only */
    size_t bytes;                    /* of each segment */
    int step_shm;    /* this step's parameters came through the segments (its gradient goes so) */
    int step_shared; /* and are read in the model segment, where the daemon keeps them */
    int shared_said; /* said once that they are */
    int warned;      /* said once that the socket is used instead */
} omv_shmlink_t;

/* Starts with no connection; cfg is borrowed. */
void omv_shmlink_init(omv_shmlink_t *self, const omv_session_config_t *cfg);
/* Closes the connection and unmaps the segments. */
void omv_shmlink_fini(omv_shmlink_t *self);

/* A trainer whose Welcome w offers shared memory asks for its segments; when it cannot have
 * them (the daemon is on another host or network namespace) it says so once and uses the
 * socket. What an earlier registration had is closed first. */
void omv_shmlink_attach(omv_shmlink_t *self, const omv_welcome_t *w, uint32_t worker_id);
/* Closes the connection and unmaps the segments; what was held for them is dropped. */
void omv_shmlink_detach(omv_shmlink_t *self);

/* Takes m, for the daemon, when it goes on the connection: a pull, a push whose values are in
 * the segment, or our Leave. It waits with the others until we next wait for a message
 * (omv_shmlink_flush), or until a push of a large shard (OMV_SHM_WAKE_PARAMS) or the Leave,
 * then they go in one system call. Returns 1 when it took m, 0 when m goes over the socket. */
int omv_shmlink_hold(omv_shmlink_t *self, const omv_msg_t *m, omv_link_t *daemon,
                     uint32_t worker_id);
/* Sends what was held; what the connection does not take (full, or gone) goes over daemon, the
 * daemon's socket, in order, as it was encoded. */
void omv_shmlink_flush(omv_shmlink_t *self, omv_link_t *daemon, uint32_t worker_id);

/* The next envelope on the connection, without waiting: only shared-memory parameters come that
 * way. Returns as omv_link_recv; a broken connection is said once and gives -EAGAIN (the socket
 * carries everything from then on). */
int omv_shmlink_recv(omv_shmlink_t *self, omv_msg_t *m, char *why, uint32_t worker_id);
/* The same, polling for up to cfg->spin_us. Returns as omv_shmlink_recv. */
int omv_shmlink_spin(omv_shmlink_t *self, omv_msg_t *m, char *why, uint32_t worker_id);

/* Takes the way of a step's parameters as the daemon sent shard p (first: the step's first
 * shard): p must agree with the step's other shards and with the segments we have. The first
 * decides for the step: where its parameters are read (omv_shmlink_params), where its gradient
 * is written (omv_shmlink_grads) and its pushes' wire (omv_shmlink_push_wire). Returns 1 when
 * the way changed from the last step's, 0 when it did not, or -EPROTO after logging why. */
int omv_shmlink_step(omv_shmlink_t *self, const omv_params_t *p, int first, uint32_t worker_id);
/* Where this step's parameters are: a segment, or own (the worker's buffer). */
const float *omv_shmlink_params(const omv_shmlink_t *self, const float *own);
/* Where this step's gradient goes: the grads segment, or own. */
float *omv_shmlink_grads(const omv_shmlink_t *self, float *own);
/* The wire of this step's pushes: shared memory, or the job's (wire). */
uint32_t omv_shmlink_push_wire(const omv_shmlink_t *self, uint32_t wire);
