/* Trainers on the daemon's own host: the daemon offers each one, in its Welcome, shared
 * segments for its parameters and gradients (common/shm.h), hands them over on an abstract
 * unix socket to the worker that shows its token, and watches the connection: when it closes,
 * the worker's process is gone (SIGKILL included) and the member is declared dead at once, its
 * segments freed. Workers that cannot reach the socket (another host or network namespace)
 * keep tcp. */
#pragma once

#include <poll.h>
#include <stdint.h>

#include "members.h"
#include "wire.h"

typedef struct omv_daemon omv_daemon_t;

typedef struct {
    int fd; /* the listening socket; -1: shared memory is off */
    char name[OMV_WIRE_SHM_NAME_MAX];
    uint64_t attached_total, refused_total, gone_total;
} omv_local_t;

/* Opens the socket (logs and leaves shared memory off when it cannot). */
void omv_local_open(omv_local_t *self);
void omv_local_close(omv_local_t *self);

/* Puts the socket and a fresh token for m into its Welcome (nothing when shared memory is off). */
void omv_local_offer(omv_local_t *self, omv_member_t *m, omv_welcome_t *w);

/* Answers the workers that connected (call when the socket is readable). */
void omv_local_accept(omv_daemon_t *d);

/* The connections of the members with segments, for the event loop's poll: fds[cap] and who[cap]
 * (their member index) get them. Returns how many. */
int omv_local_pollfds(const omv_daemon_t *d, struct pollfd *fds, uint32_t *who, int cap);

/* Member i's connection closed or broke: its process is gone (declared dead, segments freed). */
void omv_local_gone(omv_daemon_t *d, uint32_t i);
