/* Changes made between steps, when nothing is in flight: regrouping (by hand or for the
 * optimizer), new SGD settings, and saving or restoring the optimizer's probe base. This module
 * keeps what is pending and decides when it may happen; the run carries it out. */
#pragma once

#include <stdint.h>

#include "groups.h"
#include "members.h"
#include "shard.h"

typedef struct {
    int pending;
    uint32_t groups; /* 0: keep */
    int set_sgd;     /* use sgd from the next update on */
    omv_sgd_t sgd;
    int snapshot;     /* save parameters and momentum as the probe base */
    int restore;      /* put the probe base back (before anything else) */
    uint64_t opt_gen; /* the optimizer's command this carries out (0: none) */
} omv_reconfig_t;

/* Merges rc into the pending change (*self). */
void omv_reconfig_merge(omv_reconfig_t *self, const omv_reconfig_t *rc);

/* Whether some member of group g was sent the parameters of the group's current step: the
 * group began it, and all its members must be able to finish it. */
int omv_reconfig_group_begun(const omv_groups_t *groups, const omv_members_t *members, uint32_t g);

/* Whether a change may happen now: every live trainer waits for its next step and no group is
 * mid-step, so no gradient can be lost or counted twice. On 1, *ret_clock is the largest clock
 * of the trainers' groups and *ret_live their number. */
int omv_reconfig_ready(const omv_groups_t *groups, const omv_members_t *members,
                       uint64_t *ret_clock, int *ret_live);

/* Regroups the live trainers round-robin into g groups (at most live) that all start at clock.
 * Returns 0 or a negative errno (logged). */
int omv_reconfig_regroup(omv_groups_t *groups, const omv_members_t *members, uint32_t n_slots,
                         uint32_t g, uint64_t clock, int live);
