/* Shared segments between omnivored and a trainer on its host: the daemon writes a pull's
 * parameters straight into the worker's params segment and reads its gradients from its grads
 * segment, with only the envelopes on a socket (wire OMV_WIRE_SHM). While the job has one
 * compute group, nothing is written at all: the worker reads the daemon's own parameters in the
 * model segment, which no update touches until every member of the group has pushed the shard
 * it read (an envelope's `shared`). The segments are memfds: they have no name anywhere, so nothing
 * outlives the last process that maps them (a SIGKILLed worker leaves nothing behind), and they
 * reach the worker only through an abstract unix socket of the daemon's (SCM_RIGHTS). Abstract
 * sockets belong to a network namespace: a worker in another one (another host, as far as it can
 * tell) cannot connect and keeps tcp. The connection stays open while the worker lives: the daemon
 * sees it close when the worker's process goes, however it goes.
 *
 * The connection (SOCK_SEQPACKET: one record a message) also carries the envelopes of the
 * values the segments hold: the worker's Pull and shared-memory Push (and its Leave, which
 * so comes before the close), and the daemon's
 * shared-memory Params, which a shard's thread sends itself. That takes the ZeroMQ I/O threads
 * and the event loop's hop out of each step's path (about 0.1 ms a round trip on loopback).
 * Everything else (heartbeats, errors, stops) keeps the worker's ZeroMQ socket. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "wire.h"

/* What a worker sends first on the connection. */
typedef struct {
    uint32_t worker_id;
    uint32_t pad;
    uint64_t token;
} omv_shm_hello_t;

/* What the daemon answers, with OMV_SHM_FDS memfds of `bytes` each: the worker's params and
 * grads segments, then the job's model segment (omv_shm_create_model: the daemon's parameters
 * themselves, which the worker can map only to read). */
#define OMV_SHM_FDS 3
typedef struct {
    uint64_t bytes;
} omv_shm_answer_t;

/* A worker's mappings of them. */
typedef struct {
    float *params, *grads;
    const float *model;
} omv_shm_maps_t;

/* Daemon: listens on a fresh abstract socket; name[OMV_WIRE_SHM_NAME_MAX] gets its name as a
 * Welcome carries it (without the leading NUL). Returns a nonblocking fd or a negative errno. */
int omv_shm_listen(char *name);

/* Daemon: makes a shared segment of bytes; *ret_map gets the daemon's mapping. Returns its fd or
 * a negative errno. */
int omv_shm_create(size_t bytes, const char *what, void **ret_map);

/* Daemon: makes the model segment, where a job's parameters live: our mapping (*ret_map) is
 * writable, and every mapping made from the fd after this is read-only (sealed with
 * F_SEAL_FUTURE_WRITE; nor can its size change), so that a worker on this host reads the
 * parameters where they are and can never write them. Returns its fd or a negative errno. */
int omv_shm_create_model(size_t bytes, void **ret_map);

/* Daemon: sends the answer and the fds (params, grads, model) on conn. Returns 0 or a negative
 * errno. */
int omv_shm_send(int conn, const int fds[OMV_SHM_FDS], size_t bytes);

/* Worker: connects to the daemon's socket name, says who it is and receives its segments,
 * mapped into *ret (bytes each, which must be want; the model read-only). Waits up to
 * timeout_ms. Returns the connection (keep it open while the segments are used) or a negative
 * errno, with the reason in why[OMV_WIRE_REASON_MAX]. */
int omv_shm_attach(const char *name, const omv_shm_hello_t *hello, size_t want, int timeout_ms,
                   omv_shm_maps_t *ret, char *why);

/* An envelope on the connection: at most this many bytes, and no values after it. */
#define OMV_SHM_ENVELOPE_MAX 1024

/* Sends an envelope encoded already (omv_wire_encode) as one record, without waiting: a full
 * connection gives -EAGAIN and the caller sends it the other way. Returns 0 or a negative
 * errno. */
int omv_shm_send_raw(int conn, const void *env, size_t len);

/* A shard this large (256 Ki parameters, 1 MiB of fp32) is worth waking the daemon for: its
 * work a step (checking a gradient, the update, the serves) outweighs a wake-up and a switch
 * to it. The daemon gives such a shard a thread of its own (server/shard_thread.h), and a
 * worker sends its gradient at once rather than holding it for the step's last push, so that
 * the daemon takes it in while backward goes on (the CNN example's 803k-parameter fc shard:
 * held, 2 workers trained 7-10% slower). */
#define OMV_SHM_WAKE_PARAMS (256u * 1024u)

/* Envelopes held back to go together, in one system call (so that the daemon wakes once for
 * a step's pull and pushes, not once for each). */
#define OMV_SHM_BATCH_BYTES (16 << 10)
#define OMV_SHM_BATCH_MAX 64
typedef struct {
    uint8_t buf[OMV_SHM_BATCH_BYTES];
    uint32_t len[OMV_SHM_BATCH_MAX];
    uint32_t n, used;
} omv_shm_batch_t;

/* Adds msg to b. Returns 0, or -ENOSPC when b is full (flush it first). */
int omv_shm_batch_add(omv_shm_batch_t *b, const omv_msg_t *msg);
/* Sends what b holds, one record each, without waiting. Returns how many went (b keeps the
 * rest, in order), or a negative errno when none did. */
int omv_shm_batch_flush(int conn, omv_shm_batch_t *b);

/* Receives the next envelope, without waiting. Returns 0, -EAGAIN (none yet), -ECONNRESET (the
 * other side closed it), -EPROTO with the reason in why[OMV_WIRE_REASON_MAX] (too large,
 * undecodable, or announcing values, which never come this way), or another negative errno. */
int omv_shm_recv_msg(int conn, omv_msg_t *ret, char *why);

/* Unmaps a segment of bytes (NULL: nothing). */
void omv_shm_unmap(void *map, size_t bytes);
