/* Changes between steps: what is pending, when it may happen, and regrouping. */
#define OMV_LOG_TAG "daemon"
#include "reconfig.h"

#include <errno.h>
#include <stdlib.h>

#include "log.h"
#include "util.h"

void omv_reconfig_merge(omv_reconfig_t *self, const omv_reconfig_t *rc)
{
    if (rc->groups)
        self->groups = rc->groups;
    if (rc->set_sgd) {
        self->set_sgd = 1;
        self->sgd = rc->sgd;
    }
    self->snapshot |= rc->snapshot;
    self->restore |= rc->restore;
    if (rc->opt_gen)
        self->opt_gen = rc->opt_gen;
    self->pending = 1;
}

static int live_trainer(const omv_member_t *m)
{
    return m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER;
}

int omv_reconfig_group_begun(const omv_groups_t *groups, const omv_members_t *members, uint32_t g)
{
    uint64_t clock = omv_groups_clock(groups, g);
    for (uint32_t i = 0; i < members->n; i++) {
        const omv_member_t *m = &members->records[i];
        if (live_trainer(m) && m->served && m->served_step == clock &&
            omv_groups_of(groups, m->slot) == (int)g)
            return 1;
    }
    return 0;
}

int omv_reconfig_ready(const omv_groups_t *groups, const omv_members_t *members,
                       uint64_t *ret_clock, int *ret_live)
{
    if (!omv_groups_idle(groups))
        return 0;
    uint64_t clock = 0;
    int live = 0;
    for (uint32_t i = 0; i < members->n; i++) {
        const omv_member_t *m = &members->records[i];
        if (!live_trainer(m))
            continue;
        int g = omv_groups_of(groups, m->slot);
        if (g < 0 || !m->parked || m->parked_step != omv_groups_clock(groups, (uint32_t)g) ||
            omv_reconfig_group_begun(groups, members, (uint32_t)g))
            return 0; /* still computing, or its group is not done */
        uint64_t c = omv_groups_clock(groups, (uint32_t)g);
        clock = c > clock ? c : clock;
        live++;
    }
    *ret_clock = clock;
    *ret_live = live;
    return 1;
}

int omv_reconfig_regroup(omv_groups_t *groups, const omv_members_t *members, uint32_t n_slots,
                         uint32_t g, uint64_t clock, int live)
{
    if (live > 0 && g > (uint32_t)live)
        g = (uint32_t)live;
    int32_t *group_of = malloc(n_slots * sizeof(int32_t));
    if (group_of == NULL) {
        omv_log_error("regroup to %u groups: out of memory", g);
        return -ENOMEM;
    }
    for (uint32_t s = 0; s < n_slots; s++)
        group_of[s] = -1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < members->n; i++) {
        const omv_member_t *m = &members->records[i];
        if (live_trainer(m))
            group_of[m->slot] = (int32_t)(k++ % g);
    }
    uint32_t before = omv_groups_count(groups);
    int r = omv_groups_regroup(groups, g, group_of, clock);
    free(group_of);
    if (r < 0) {
        omv_log_error("regroup to %u groups failed: %s", g, omv_strerror(r));
        return r;
    }
    omv_log_info("regrouped: %u groups (was %u) of %d workers, from step %llu", g, before, live,
                 (unsigned long long)clock);
    return 0;
}
