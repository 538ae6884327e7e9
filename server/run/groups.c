/* Compute groups: membership, clocks, arrival of gradients, staleness. */
#include "groups.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t clock;          /* steps completed: the step being gathered now */
    uint32_t live;           /* live members */
    uint32_t joining;        /* members that start with the next step */
    uint32_t shards_applied; /* shards of the current step already applied */
    uint32_t *arrived;       /* [n_shards] pushes from live members this step */
    uint8_t *applied;        /* [n_shards] */
} group_t;

struct omv_groups {
    uint32_t n_slots, n_groups, n_shards;
    uint32_t max_groups; /* groups that exist; the first n_groups are in use */
    int64_t staleness;
    omv_groups_events_t ev;
    int32_t *slot_group; /* [n_slots], -1 empty */
    uint8_t *joining;    /* [n_slots] joined mid-step: a member from the group's next step */
    uint8_t *pushed;     /* [n_slots][n_shards] this step */
    group_t *groups;     /* [max_groups] */
};

omv_groups_t *omv_groups_new(uint32_t n_slots, uint32_t n_groups, uint32_t n_shards,
                             int64_t staleness, const omv_groups_events_t *events)
{
    if (n_slots == 0 || n_groups == 0 || n_shards == 0) {
        errno = EINVAL;
        return NULL;
    }
    omv_groups_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->n_slots = n_slots;
    self->n_groups = n_groups;
    self->max_groups = n_slots > n_groups ? n_slots : n_groups;
    self->n_shards = n_shards;
    self->staleness = staleness;
    self->ev = *events;
    self->slot_group = malloc(n_slots * sizeof(int32_t));
    self->pushed = calloc((size_t)n_slots * n_shards, 1);
    self->joining = calloc(n_slots, 1);
    self->groups = calloc(self->max_groups, sizeof(group_t));
    if (!self->slot_group || !self->pushed || !self->joining || !self->groups)
        goto fail;
    for (uint32_t i = 0; i < n_slots; i++)
        self->slot_group[i] = -1;
    for (uint32_t g = 0; g < self->max_groups; g++) {
        group_t *gr = &self->groups[g];
        gr->arrived = calloc(n_shards, sizeof(uint32_t));
        gr->applied = calloc(n_shards, 1);
        if (!gr->arrived || !gr->applied)
            goto fail;
    }
    return self;
fail:
    omv_groups_destroy(&self);
    errno = ENOMEM;
    return NULL;
}

void omv_groups_destroy(omv_groups_t **self_p)
{
    omv_groups_t *self = *self_p;
    if (self == NULL)
        return;
    for (uint32_t g = 0; self->groups && g < self->max_groups; g++) {
        free(self->groups[g].arrived);
        free(self->groups[g].applied);
    }
    free(self->groups);
    free(self->pushed);
    free(self->joining);
    free(self->slot_group);
    free(self);
    *self_p = NULL;
}

int omv_groups_join(omv_groups_t *self, uint32_t slot, uint32_t group)
{
    if (slot >= self->n_slots || group >= self->n_groups || self->slot_group[slot] >= 0)
        return -EINVAL;
    group_t *gr = &self->groups[group];
    if (gr->live == 0) {
        /* A group that lost every member fell behind while it was empty; it comes back at the
         * slowest live group's clock, so the bound holds for everyone from the first step. */
        uint64_t floor = omv_groups_min_clock(self);
        if (floor != UINT64_MAX && gr->clock < floor)
            gr->clock = floor;
    }
    self->slot_group[slot] = (int32_t)group;
    memset(self->pushed + (size_t)slot * self->n_shards, 0, self->n_shards);
    if (gr->shards_applied > 0) {
        /* Part of this step is applied already: a gradient from the newcomer could go into no
         * update. It is a member from the next step on. */
        self->joining[slot] = 1;
        gr->joining++;
        return 1;
    }
    gr->live++;
    return 0;
}

void omv_groups_set_clock(omv_groups_t *self, uint32_t group, uint64_t clock)
{
    if (group < self->n_groups && self->groups[group].live == 0)
        self->groups[group].clock = clock;
}

/* Starts the group's next step: clears arrivals and every member's pushed flags. */
static void next_step(omv_groups_t *self, uint32_t group)
{
    group_t *gr = &self->groups[group];
    gr->clock++;
    gr->shards_applied = 0;
    memset(gr->arrived, 0, self->n_shards * sizeof(uint32_t));
    memset(gr->applied, 0, self->n_shards);
    for (uint32_t s = 0; s < self->n_slots; s++) {
        if (self->slot_group[s] != (int32_t)group)
            continue;
        memset(self->pushed + (size_t)s * self->n_shards, 0, self->n_shards);
        if (self->joining[s]) {
            self->joining[s] = 0;
            gr->joining--;
            gr->live++;
        }
    }
}

/* Applies every shard that has all live members' gradients; advances the clock when all are. */
static void settle(omv_groups_t *self, uint32_t group)
{
    group_t *gr = &self->groups[group];
    if (gr->live == 0)
        return;
    for (uint32_t sh = 0; sh < self->n_shards; sh++) {
        if (!gr->applied[sh] && gr->arrived[sh] >= gr->live) {
            gr->applied[sh] = 1;
            gr->shards_applied++;
            if (self->ev.apply)
                self->ev.apply(self->ev.ctx, group, sh);
        }
    }
    if (gr->shards_applied == self->n_shards) {
        next_step(self, group);
        if (self->ev.advance)
            self->ev.advance(self->ev.ctx, group, gr->clock);
    }
}

void omv_groups_leave(omv_groups_t *self, uint32_t slot)
{
    if (slot >= self->n_slots || self->slot_group[slot] < 0)
        return;
    uint32_t group = (uint32_t)self->slot_group[slot];
    group_t *gr = &self->groups[group];
    self->slot_group[slot] = -1;
    if (self->joining[slot]) {
        self->joining[slot] = 0;
        gr->joining--;
        return;
    }
    gr->live--;
    /* Its gradients already summed this step stay in the sums; it is no longer waited for. */
    for (uint32_t sh = 0; sh < self->n_shards; sh++)
        if (self->pushed[(size_t)slot * self->n_shards + sh] && !gr->applied[sh])
            gr->arrived[sh]--;
    if (gr->live == 0) {
        if (self->ev.retire)
            self->ev.retire(self->ev.ctx, group);
        if (gr->shards_applied > 0) {
            /* Part of the step is in the model: the step counts as done, so that nobody applies
             * those shards again. Members waiting to join start with the next step. */
            next_step(self, group);
        } else {
            /* Nothing of the step is in the model: a worker joining later starts it afresh. */
            memset(gr->arrived, 0, self->n_shards * sizeof(uint32_t));
        }
        return;
    }
    settle(self, group);
}

omv_refuse_t omv_groups_check_push(const omv_groups_t *self, uint32_t slot, uint64_t step,
                                   uint32_t shard, char *why)
{
    if (slot >= self->n_slots || self->slot_group[slot] < 0) {
        snprintf(why, OMV_WIRE_REASON_MAX, "slot %u has no live worker", slot);
        return OMV_REFUSE_UNKNOWN_WORKER;
    }
    if (shard >= self->n_shards) {
        snprintf(why, OMV_WIRE_REASON_MAX, "shard %u does not exist (%u shards)", shard,
                 self->n_shards);
        return OMV_REFUSE_SHAPE;
    }
    uint32_t group = (uint32_t)self->slot_group[slot];
    const group_t *gr = &self->groups[group];
    if (self->joining[slot]) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "slot %u joins group %u with step %llu, which has not started (group at step "
                 "%llu)",
                 slot, group, (unsigned long long)gr->clock + 1, (unsigned long long)gr->clock);
        return OMV_REFUSE_STEP;
    }
    if (step != gr->clock) {
        snprintf(why, OMV_WIRE_REASON_MAX, "gradient for step %llu but group %u is at step %llu",
                 (unsigned long long)step, group, (unsigned long long)gr->clock);
        return OMV_REFUSE_STEP;
    }
    if (self->pushed[(size_t)slot * self->n_shards + shard]) {
        snprintf(why, OMV_WIRE_REASON_MAX, "shard %u of step %llu was already pushed", shard,
                 (unsigned long long)step);
        return OMV_REFUSE_STEP;
    }
    return OMV_REFUSE_NONE;
}

void omv_groups_record_push(omv_groups_t *self, uint32_t slot, uint32_t shard)
{
    uint32_t group = (uint32_t)self->slot_group[slot];
    group_t *gr = &self->groups[group];
    self->pushed[(size_t)slot * self->n_shards + shard] = 1;
    gr->arrived[shard]++;
    settle(self, group);
}

/* Whether every other live group is within the bound of group's step. */
static bool others_within_bound(const omv_groups_t *self, uint32_t group, uint64_t step)
{
    if (self->staleness < 0)
        return true;
    for (uint32_t h = 0; h < self->n_groups; h++) {
        if (h == group || self->groups[h].live == 0)
            continue;
        /* h must have finished step - s - 1, i.e. its clock is at least step - s. */
        if (self->groups[h].clock + (uint64_t)self->staleness < step)
            return false;
    }
    return true;
}

bool omv_groups_may_begin(const omv_groups_t *self, uint32_t group, uint64_t step)
{
    return group < self->n_groups && self->groups[group].clock == step &&
           others_within_bound(self, group, step);
}

bool omv_groups_shard_applied(const omv_groups_t *self, uint32_t group, uint32_t shard)
{
    return group < self->n_groups && shard < self->n_shards && self->groups[group].applied[shard];
}

bool omv_groups_may_read_next(const omv_groups_t *self, uint32_t group, uint64_t step)
{
    if (group >= self->n_groups)
        return false;
    const group_t *gr = &self->groups[group];
    return gr->live > 0 && gr->joining == 0 && gr->clock + 1 == step &&
           others_within_bound(self, group, step);
}

bool omv_groups_idle(const omv_groups_t *self)
{
    if (self == NULL)
        return true;
    for (uint32_t g = 0; g < self->n_groups; g++) {
        const group_t *gr = &self->groups[g];
        if (gr->joining > 0 || gr->shards_applied > 0)
            return false;
        for (uint32_t sh = 0; gr->live > 0 && sh < self->n_shards; sh++)
            if (gr->arrived[sh] > 0)
                return false;
    }
    return true;
}

int omv_groups_regroup(omv_groups_t *self, uint32_t n_groups, const int32_t *group_of,
                       uint64_t clock)
{
    if (n_groups == 0 || n_groups > self->max_groups)
        return -EINVAL;
    if (!omv_groups_idle(self))
        return -EBUSY;
    for (uint32_t s = 0; s < self->n_slots; s++)
        if (self->slot_group[s] >= 0 && (group_of[s] < 0 || (uint32_t)group_of[s] >= n_groups))
            return -EINVAL;
    self->n_groups = n_groups;
    for (uint32_t g = 0; g < self->max_groups; g++) {
        group_t *gr = &self->groups[g];
        gr->live = 0;
        gr->joining = 0;
        gr->clock = clock;
        gr->shards_applied = 0;
        memset(gr->arrived, 0, self->n_shards * sizeof(uint32_t));
        memset(gr->applied, 0, self->n_shards);
    }
    for (uint32_t s = 0; s < self->n_slots; s++) {
        if (self->slot_group[s] < 0)
            continue;
        self->slot_group[s] = group_of[s];
        self->joining[s] = 0;
        self->groups[group_of[s]].live++;
        memset(self->pushed + (size_t)s * self->n_shards, 0, self->n_shards);
    }
    return 0;
}

int omv_groups_set_count(omv_groups_t *self, uint32_t n_groups)
{
    if (n_groups == 0 || n_groups > self->max_groups)
        return -EINVAL;
    for (uint32_t g = 0; g < self->max_groups; g++)
        if (self->groups[g].live > 0 || self->groups[g].joining > 0)
            return -EBUSY;
    self->n_groups = n_groups;
    return 0;
}

uint32_t omv_groups_max(const omv_groups_t *self)
{
    if (self == NULL)
        return 0;
    return self->max_groups;
}

uint64_t omv_groups_clock(const omv_groups_t *self, uint32_t group)
{
    return self->groups[group].clock;
}

uint32_t omv_groups_live(const omv_groups_t *self, uint32_t group)
{
    return self->groups[group].live;
}

int omv_groups_of(const omv_groups_t *self, uint32_t slot)
{
    if (self == NULL)
        return -1;
    return slot < self->n_slots ? self->slot_group[slot] : -1;
}

uint32_t omv_groups_count(const omv_groups_t *self)
{
    if (self == NULL)
        return 0;
    return self->n_groups;
}

bool omv_groups_settled(const omv_groups_t *self)
{
    if (self == NULL)
        return true;
    for (uint32_t g = 0; g < self->n_groups; g++)
        if (self->groups[g].live > 0 && self->groups[g].shards_applied > 0)
            return false;
    return true;
}

uint64_t omv_groups_min_clock(const omv_groups_t *self)
{
    if (self == NULL)
        return UINT64_MAX;
    uint64_t m = UINT64_MAX;
    for (uint32_t g = 0; g < self->n_groups; g++)
        if (self->groups[g].live > 0 && self->groups[g].clock < m)
            m = self->groups[g].clock;
    return m;
}
