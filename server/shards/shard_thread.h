/* A shard's thread: it owns the shard's parameters, momentum and pending sums while it runs,
 * and does everything that touches them (checking and adding gradients, applying updates,
 * answering pulls with a snapshot that ZeroMQ sends without copying), on commands from the
 * event loop over an inproc pipe. Commands to one shard run in the order they were sent, so an
 * update is always applied before a later pull of the same shard is answered. */
#pragma once

#include <stdint.h>

#include "router.h"
#include "shard.h"
#include "shm.h"

typedef struct omv_shard_thread omv_shard_thread_t;

/* Shards smaller than this are better off without a thread (common/shm.h): their work a step
 * (about 0.1 ms for the MLP example's 201k-parameter layer: two gradients checked, the update,
 * two serves) is no more than waking a thread and switching to it, and on a host whose cores
 * the trainers keep busy the switch also takes one from them (the MLP, 2 workers on 2 cores:
 * 1.1x the images/s without its thread). The CNN example's 803k-parameter shard keeps one. */
#define OMV_SHARD_THREAD_MIN_PARAMS OMV_SHM_WAKE_PARAMS

/* Commands (the event loop sends them with omv_shard_thread_*). */
typedef enum {
    OMV_SHARD_CMD_PUSH = 1, /* extra: the peer; payload: the gradient */
    OMV_SHARD_CMD_APPLY,
    OMV_SHARD_CMD_DISCARD,
    OMV_SHARD_CMD_SERVE,   /* extra: the peer */
    OMV_SHARD_CMD_GATHER,  /* copy parameters (and optimizer state) out, then acknowledge */
    OMV_SHARD_CMD_RESTORE, /* copy parameters and optimizer state in, then acknowledge */
    OMV_SHARD_CMD_QUIT,
    OMV_SHARD_CMD_FORGET, /* the worker is gone: its view goes */
} omv_shard_cmd_type_t;

/* Worker ids whose views (below) a shard keeps: the daemon's members (server/members.h). */
#define OMV_SHARD_VIEWS_MAX 1024

typedef struct {
    uint32_t type;
    uint32_t group;
    uint64_t step;
    uint32_t worker_id;
    uint32_t slice_begin, slice_count, batch; /* SERVE: what the Params message says */
    uint32_t wire;                            /* SERVE: how to send the parameters; PUSH: how
                                               * the gradient is stored (OMV_WIRE_*) */
    /* SERVE with wire OMV_WIRE_INT8: the change from the worker's view of the shard, which the
     * shard keeps for it (common/q8.h), when that is view; else the whole shard as fp32, which
     * begins view. */
    uint64_t view;
    float weight;         /* PUSH: what the gradient counts for in its
                           * group's mean (0 or 1: as it is) */
    omv_sgd_t sgd;        /* APPLY; PUSH with solo */
    float norm_bound;     /* PUSH: refuse a gradient whose norm is over this x the shard's
                           * running norm (0: no bound) */
    uint32_t norm_warmup; /* PUSH: gradients the shard accepts first, to learn its norm */
    uint32_t solo;        /* PUSH: the group has this one member, so its
                           * gradient is applied at once (the APPLY that
                           * follows finds nothing left to do) */
    float *params_dst, *velocity_dst;       /* GATHER: whole-model arrays (velocity may be
                                             * NULL); the shard writes its range */
    const float *params_src, *velocity_src; /* RESTORE: whole-model arrays it reads its
                                             * range from */
    float *shm_dst;    /* SERVE with wire OMV_WIRE_SHM: the worker's params segment (whole
                        * model), where the shard writes its range */
    uint32_t shm_send; /* SERVE with shm_dst: the envelope goes on shm_conn, the worker's
                        * connection (server/local.h), by this thread; when that fails
                        * (full), through the event loop as without */
    int shm_conn;
    uint32_t shm_inplace;      /* SERVE with shm_dst: nothing is copied; the worker reads the
                                * parameters in the model segment (the envelope says shared) */
    const float *shm_src;      /* PUSH with wire OMV_WIRE_SHM: the worker's grads segment */
    float *second_dst;         /* GATHER: Adam's second moments, whole-model
                                * (NULL: not wanted, or the shard has none) */
    const float *second_src;   /* RESTORE: the same, read */
    uint64_t *steps_dst;       /* GATHER: [shards] Adam's steps, at the shard's
                                * index (may be NULL) */
    const uint64_t *steps_src; /* RESTORE: the same, read */
} omv_shard_cmd_t;

/* Replies, from the thread to the event loop. */
typedef enum {
    OMV_SHARD_REPLY_OUT = 1,    /* extra: peer bytes then an encoded envelope; payload: params */
    OMV_SHARD_REPLY_NOT_FINITE, /* a gradient had NaN or Inf: dropped; extra: the peer */
    OMV_SHARD_REPLY_ACK,        /* GATHER or RESTORE is done */
    OMV_SHARD_REPLY_NORM,       /* a gradient's norm was out of bounds: dropped; extra: peer */
} omv_shard_reply_type_t;

typedef struct {
    uint32_t type;
    uint32_t shard;
    uint32_t group;
    uint32_t worker_id;
    uint64_t step;
    uint32_t peer_len;   /* OUT, NOT_FINITE, NORM: how many bytes of extra are the peer's id */
    float norm, typical; /* NORM: the gradient's norm, and the shard's running norm */
} omv_shard_reply_t;

/* Starts the thread for shard `index` and returns once the thread has signalled that it is in
 * its loop; the shard is the thread's until omv_shard_thread_stop. With threaded 0 there is no
 * thread: commands run at once on the sender's thread (for small shards, where waking a thread
 * costs more than the work), and replies still come through the pipe, so the caller sees no
 * difference. Returns NULL with errno set. */
omv_shard_thread_t *omv_shard_thread_new(omv_router_t *router, omv_shard_t *shard, uint32_t index,
                                         int threaded);

/* Whether the shard has a thread of its own. */
int omv_shard_thread_threaded(const omv_shard_thread_t *self);
/* Tells the thread to quit and joins it; the shard is the caller's again. */
void omv_shard_thread_stop(omv_shard_thread_t *self);
/* Whether ZeroMQ holds one of the thread's snapshots or copies (parameters on their way to a
 * worker). */
int omv_shard_thread_in_flight(const omv_shard_thread_t *self);
/* Frees what is left; call once ZeroMQ holds no snapshot or copy (omv_shard_thread_in_flight,
 * or after omv_router_destroy), since their release functions still use self. */
void omv_shard_thread_destroy(omv_shard_thread_t **self_p);

/* The event loop's end of the thread's pipe (replies arrive there). */
omv_pipe_t *omv_shard_thread_pipe(omv_shard_thread_t *self);

/* Sends a command; peer (PUSH, SERVE) and payload (PUSH: taken) as the command needs. Returns
 * 0 or a negative errno. */
int omv_shard_thread_send(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd,
                          const omv_peer_t *peer, omv_payload_t *payload);

/* How many updates the shard applied (one per group step) and how many gradients it added to
 * sums (NaN/Inf ones are not): the daemon's bookkeeping must agree, exactly once each. */
void omv_shard_thread_counts(const omv_shard_thread_t *self, uint64_t *ret_applies,
                             uint64_t *ret_summed);

/* How many snapshots of the parameters the thread made (one per version that was pulled) and
 * how many pulls they answered, for status. */
/* The views of the parameters a shard keeps for workers (job wire int8), and how it answered
 * their pulls. */
typedef struct {
    uint64_t views, bytes;    /* held now */
    uint64_t changes, wholes; /* pulls answered with a change, and with the whole shard */
    uint64_t buffers;         /* change buffers made since their view's first (one still out) */
} omv_shard_views_t;
void omv_shard_thread_views(const omv_shard_thread_t *self, omv_shard_views_t *ret);

void omv_shard_thread_stats(const omv_shard_thread_t *self, uint64_t *ret_snapshots,
                            uint64_t *ret_serves);

/* How many pulls were answered with a copy of their own because every snapshot was still in
 * flight, and how many of those copies have been freed since (each when ZeroMQ lets go of the
 * message that carries it, on whichever thread that is). Once no message holds a copy the two
 * are equal; freed never exceeds made. Safe to call from any thread while self lives. */
void omv_shard_thread_copies(const omv_shard_thread_t *self, uint64_t *ret_made,
                             uint64_t *ret_freed);
