/* A job's model as the daemon holds it: the parameters split into shards, each run by its
 * shard thread (or inline on the event loop's thread when small) from the moment the set is
 * made, the replies the threads send back, and whole-model copies in and out of them
 * (evaluations, checkpoints, resuming, the optimizer's probe base). Every command to a shard
 * goes through the shard's one executor, threaded or not. */
#pragma once

#include <stdint.h>

#include "model.h"
#include "refusals.h"
#include "router.h"
#include "shard.h"
#include "shard_thread.h"
#include "wire.h"

/* Fields are for reading (status); change them only through the functions below. */
typedef struct {
    omv_router_t *router;     /* borrowed */
    omv_refusals_t *refusals; /* borrowed: non-finite gradients are refused through it */
    size_t param_count;
    uint32_t n_shards;
    uint32_t offsets[OMV_WIRE_MAX_SHARDS + 1];
    float *params;                              /* [param_count], split among the shards: in
                                                 * the model segment (common/shm.h) */
    int model_fd;                               /* the model segment; -1: params is ours */
    uint32_t writes[OMV_WIRE_MAX_SHARDS];       /* commands sent so far that change each
                                                 * shard's parameters (updates, restores) */
    omv_shard_t *shards;                        /* [n_shards], each owned by its executor */
    omv_shard_thread_t **threads;               /* [n_shards] */
    uint32_t threaded;                          /* shards with a thread of their own */
    int adam;                                   /* the shards keep Adam's second moments */
    float *gather_params, *gather_velocity;     /* [param_count]: what omv_shardset_gather fills */
    float *gather_second;                       /* [param_count] with adam, else NULL */
    uint64_t gather_steps[OMV_WIRE_MAX_SHARDS]; /* [n_shards] Adam's steps */
    float *probe_params, *probe_velocity;       /* [param_count] the probe base, made when first
                                                 * saved */
    float *probe_second;                        /* [param_count] with adam */
    uint64_t probe_steps[OMV_WIRE_MAX_SHARDS];
    uint8_t pipe_extra[sizeof(((omv_peer_t *)0)->id) + OMV_WIRE_MAX_ENVELOPE];
} omv_shardset_t;

/* Lays out layout's parameters in n_shards shards (fewer when the model is smaller), with room
 * for max_groups pending sums each and, with adam, Adam's second moments, initialised from seed,
 * and starts their executors. Returns NULL with errno set after logging why. Caller owns;
 * omv_shardset_destroy. */
omv_shardset_t *omv_shardset_new(omv_router_t *router, omv_refusals_t *refusals,
                                 const omv_model_layout_t *layout, uint32_t n_shards,
                                 uint32_t max_groups, uint64_t seed, int adam);

/* Stops the executors and frees the set once ZeroMQ no longer holds parameters on their way
 * out (waits up to 2 s; after that the snapshots are left allocated, and logged). */
void omv_shardset_destroy(omv_shardset_t **self_p);

/* Sends cmd to shard s (peer and payload as omv_shard_thread_send takes them). */
int omv_shardset_send(omv_shardset_t *self, uint32_t s, const omv_shard_cmd_t *cmd,
                      const omv_peer_t *peer, omv_payload_t *payload);
/* Sends cmd to every shard. */
void omv_shardset_send_all(omv_shardset_t *self, const omv_shard_cmd_t *cmd,
                           const omv_peer_t *peer);

/* Handles what the executors sent back: parameters to forward, refusals. */
void omv_shardset_drain(omv_shardset_t *self);

/* Copies the model (and the optimizer state, when velocity is set: momentum, and with adam the
 * second moments and steps) into gather_params (gather_velocity, gather_second, gather_steps):
 * every update sent so far is in it. Returns 0 or a negative errno. */
int omv_shardset_gather(omv_shardset_t *self, int velocity);

/* Returns once every command sent so far has run on every shard (nothing in flight points
 * into memory about to be freed). Returns 0 or a negative errno. */
int omv_shardset_sync(omv_shardset_t *self);

/* Puts params back into the shards, and the optimizer state that is not NULL: velocity and
 * second [param_count], steps [n_shards]. Returns 0 or -errno. */
int omv_shardset_restore(omv_shardset_t *self, const float *params, const float *velocity,
                         const float *second, const uint64_t *steps);

/* Saves the model and its optimizer state as the probe base (restore 0) or puts them back (1).
 * Returns 0, -ENOENT (no base to restore) or a negative errno. */
int omv_shardset_probe_base(omv_shardset_t *self, int restore);

/* Whether a probe base was saved. */
int omv_shardset_has_probe_base(const omv_shardset_t *self);
