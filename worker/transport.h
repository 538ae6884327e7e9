/* The worker's links: the daemon's socket, with the shared-memory link beside it when the
 * daemon is on this host (worker/shmlink.h), and the shard servers' sockets. Sending, waiting
 * for a message (with heartbeats), and the steps of registering with the daemon. */
#pragma once

#include <signal.h>
#include <stdint.h>

#include "link.h"
#include "session.h"
#include "shmlink.h"
#include "wire.h"

/* omv_transport_wait's outcomes besides a message (0) and errors (< 0). */
enum {
    OMV_WAIT_DONE = 1, /* the daemon says the job is over */
    OMV_WAIT_LOST = 2, /* the daemon went away or no longer knows us: register again */
};

typedef struct {
    const omv_session_config_t *cfg; /* borrowed */
    volatile sig_atomic_t *stop;     /* borrowed: nonzero when a signal asks us to stop */
    omv_link_t *link;                /* the daemon's */
    omv_shmlink_t shm;               /* and the shared-memory link beside it */
    /* The model on shard servers: a link to each (links[0] is the daemon's), which holds
     * which shard, and the link the last message came from. */
    omv_link_t *links[1 + 2 * OMV_WIRE_MAX_SERVERS];
    uint32_t n_servers, n_backups; /* the backups' links follow the servers' */
    uint8_t shard_server[OMV_WIRE_MAX_SHARDS];
    uint8_t shard_backup[OMV_WIRE_MAX_SHARDS]; /* 1 + the index of its backup's link; 0: none */
    int backup_warned;                         /* said once that a backup is not connected */
    omv_link_t *from;
    uint32_t worker_id;                 /* 0 while not registered */
    uint32_t previous_id;               /* the id we had before the daemon went away */
    int64_t last_sent_ms, last_recv_ms; /* on the daemon's socket */
} omv_transport_t;

/* Where registering stands: attempts made, and the pause before the next (ms). */
typedef struct {
    int attempt;
    int delay_ms;
} omv_transport_retry_t;

/* Starts with no link; cfg and stop are borrowed. */
void omv_transport_init(omv_transport_t *self, const omv_session_config_t *cfg,
                        volatile sig_atomic_t *stop);
/* Closes every link, flushing what was sent to the daemon and servers. */
void omv_transport_fini(omv_transport_t *self);

/* Makes the link to the daemon when there is none. Returns 0 or a negative errno after logging
 * why. */
int omv_transport_connect(omv_transport_t *self);
/* One registration attempt: Hello, then the Welcome (*ret), for as long as retry says, not past
 * deadline_ms (0: none). Returns 0, -ETIMEDOUT (no answer), OMV_WAIT_DONE (the job is over) or
 * another negative errno (refused: do not try again). */
int omv_transport_hello(omv_transport_t *self, int64_t deadline_ms,
                        const omv_transport_retry_t *retry, omv_welcome_t *ret);
/* Takes the links a Welcome gives: shared memory, and the shard servers (attached). Returns 0,
 * -ETIMEDOUT (a server did not answer: register again) or another negative errno, after logging
 * why. */
int omv_transport_attach(omv_transport_t *self, const omv_welcome_t *w);
/* After an attempt that had no answer: gives up at deadline_ms (-ETIMEDOUT), or drops the link
 * and pauses before the next attempt (0; -EINTR when stopped meanwhile). */
int omv_transport_backoff(omv_transport_t *self, int64_t deadline_ms, omv_transport_retry_t *retry);
/* The daemon is gone or forgot us: drops its link and the servers' (not the shared memory, which
 * the next Welcome replaces), to register again as the worker we were. */
void omv_transport_drop(omv_transport_t *self);

/* Sends m (and its payload, if any) to the daemon. Returns 0 or a negative errno, logged. */
int omv_transport_send(omv_transport_t *self, const omv_msg_t *m, const void *payload);
/* The same to shard server i. */
int omv_transport_send_server(omv_transport_t *self, uint32_t i, const omv_msg_t *m,
                              const void *payload);
/* Sends the push m of shard `shard` with its values: to its range's backup first (it has every
 * gradient its primary applies), then to its server, or to the daemon. */
int omv_transport_push(omv_transport_t *self, uint32_t shard, const omv_msg_t *m,
                       const void *values);
/* Sends our Leave when registered: our group need not wait for our timeout. */
void omv_transport_leave(omv_transport_t *self, const char *reason);
/* Sends a heartbeat when one is due. */
void omv_transport_heartbeat(omv_transport_t *self);
/* The same, as the engine's tick between layers (ctx: the transport): a step longer than the
 * daemon's worker timeout must not look like a dead worker. */
void omv_transport_tick(void *ctx);

/* Waits for the next message that is not a heartbeat: sends heartbeats while waiting, notices a
 * daemon that has gone quiet, and handles Error and Stop. Returns 0 with a message,
 * OMV_WAIT_DONE, OMV_WAIT_LOST, or a negative errno (-ETIMEDOUT at deadline_ms when it is > 0).
 */
int omv_transport_wait(omv_transport_t *self, omv_msg_t *m, int64_t deadline_ms);
/* The link the last message came from, as an index of links (0: the daemon's). */
uint32_t omv_transport_from(const omv_transport_t *self);
/* The last message's payload (NULL when none); *ret_len gets its length. */
const void *omv_transport_payload(const omv_transport_t *self, size_t *ret_len);
