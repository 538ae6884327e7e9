/* Compute groups and consistency: which worker slot belongs to which group, each group's clock,
 * which gradients of the current step have arrived, and the staleness bound across groups.
 * Pure bookkeeping: the daemon applies updates when told to through the callbacks. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"

typedef struct {
    /* A shard of the group's step has all live members' pushes: apply it. This object counts
     * arrivals only; how many gradients the sum holds (a push that was not finite is recorded
     * too) is for whoever summed them to know. */
    void (*apply)(void *ctx, uint32_t group, uint32_t shard);
    /* Every shard of the group's step was applied; the group's clock is now `clock`. */
    void (*advance)(void *ctx, uint32_t group, uint64_t clock);
    /* The group lost its last live member: its pending sums are to be discarded. */
    void (*retire)(void *ctx, uint32_t group);
    void *ctx;
} omv_groups_events_t;

typedef struct omv_groups omv_groups_t;

/* n_slots worker slots, n_groups groups in use (room for as many as slots, for regrouping),
 * n_shards shards; staleness s >= 0 or -1 for no bound.
 * Returns NULL with errno set. Caller owns; release with omv_groups_destroy. */
omv_groups_t *omv_groups_new(uint32_t n_slots, uint32_t n_groups, uint32_t n_shards,
                             int64_t staleness, const omv_groups_events_t *events);
void omv_groups_destroy(omv_groups_t **self_p);

/* Puts a live worker in slot into group. A group with no live members starts again at the
 * smallest clock among live groups when its own is older. Returns 0 when the worker is a member
 * of the group's current step, 1 when some of that step is applied already and it is a member
 * from the next step on (its first step is clock + 1), or -EINVAL (slot taken or out of range).
 * A group whose last live member leaves half-way through applying a step counts that step as
 * done, so no shard of it is applied twice. */
int omv_groups_join(omv_groups_t *self, uint32_t slot, uint32_t group);

/* Sets the clock of a group that has no live members (resuming from a checkpoint). */
void omv_groups_set_clock(omv_groups_t *self, uint32_t group, uint64_t clock);

/* The worker in slot is gone: its group stops waiting for it (which may complete shards). */
void omv_groups_leave(omv_groups_t *self, uint32_t slot);

/* Checks a push of shard for step from slot without recording it: OMV_REFUSE_NONE when it fits,
 * OMV_REFUSE_STEP (wrong step or already pushed), OMV_REFUSE_UNKNOWN_WORKER (not a live member),
 * OMV_REFUSE_SHAPE (no such shard). why[OMV_WIRE_REASON_MAX] gets the reason. */
omv_refuse_t omv_groups_check_push(const omv_groups_t *self, uint32_t slot, uint64_t step,
                                   uint32_t shard, char *why);

/* Records a checked push (every accepted one, a gradient that was not finite too, so that the
 * step can complete). May fire apply and advance. */
void omv_groups_record_push(omv_groups_t *self, uint32_t slot, uint32_t shard);

/* Whether a member of group may begin step now: its group has finished step - 1 and, under a
 * bound s, every other live group has finished step - s - 1. */
bool omv_groups_may_begin(const omv_groups_t *self, uint32_t group, uint64_t step);
/* Whether group, at step - 1 now, may be sent the shards of step `step` one by one as each
 * shard of its current step is applied: every other live group is within the bound of step (as
 * for omv_groups_may_begin) and nobody waits to join the group with the next step (their
 * arrival changes how its batch splits). */
bool omv_groups_may_read_next(const omv_groups_t *self, uint32_t group, uint64_t step);
/* Whether shard of group's current step has been applied. */
bool omv_groups_shard_applied(const omv_groups_t *self, uint32_t group, uint32_t shard);

/* Whether every live member is between steps: no group has a push of its current step, a
 * shard half-applied, or a member waiting to join. Regrouping needs this. */
bool omv_groups_idle(const omv_groups_t *self);

/* Regroups between steps (omv_groups_idle must hold): n_groups groups are in use, the live
 * worker in slot s moves to group_of[s] (n_slots entries; ignored for empty slots), and every
 * group starts at clock. Returns 0, -EBUSY (not idle) or -EINVAL. */
int omv_groups_regroup(omv_groups_t *self, uint32_t n_groups, const int32_t *group_of,
                       uint64_t clock);

/* Sets how many groups are in use while no group has members (resuming a checkpoint written
 * after a regroup). Returns 0, -EBUSY or -EINVAL. */
int omv_groups_set_count(omv_groups_t *self, uint32_t n_groups);

/* The queries below take NULL (a daemon with no job): no groups, nothing in flight. */

/* How many groups there can be (room was made for one per slot). */
uint32_t omv_groups_max(const omv_groups_t *self);

uint64_t omv_groups_clock(const omv_groups_t *self, uint32_t group);
/* Live members, not counting those that join with the next step. */
uint32_t omv_groups_live(const omv_groups_t *self, uint32_t group);
/* The group of a slot, or -1 when the slot is empty. */
int omv_groups_of(const omv_groups_t *self, uint32_t slot);
uint32_t omv_groups_count(const omv_groups_t *self);
/* Whether no group is half-way through applying a step (some shards applied, others not): the
 * model then holds whole steps only, as a checkpoint must. */
bool omv_groups_settled(const omv_groups_t *self);

/* The smallest clock among groups with live members (UINT64_MAX when none). */
uint64_t omv_groups_min_clock(const omv_groups_t *self);
