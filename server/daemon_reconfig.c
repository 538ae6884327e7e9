/* Changes made between steps, when nothing is in flight: regrouping (by hand or for the
 * optimizer), new SGD settings, and saving or restoring the optimizer's probe base. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "log.h"
#include "util.h"

int omv_daemon_request_regroup(omv_daemon_t *d, uint32_t g, char *why, size_t cap)
{
    uint32_t live = (uint32_t)omv_daemon_live_trainers(d);
    if (d->state != JOB_RUNNING && d->state != JOB_WAITING) {
        snprintf(why, cap, "job '%s' is %s: nothing to regroup", d->job.name,
                 omv_daemon_state_names[d->state]);
        return -EAGAIN;
    }
    uint32_t most = live > 0 ? live : (uint32_t)d->job.workers;
    if (g < 1 || g > most || g > omv_groups_max(d->groups)) {
        snprintf(why, cap, "%u groups for %u workers: give 1 to %u", g, live, most);
        return -EINVAL;
    }
    omv_reconfig_t rc = {.groups = g};
    omv_daemon_request_reconfig(d, &rc);
    omv_log_info("regroup to %u groups requested (now %u); it happens between steps", g,
                 omv_groups_count(d->groups));
    return 0;
}

void omv_daemon_request_reconfig(omv_daemon_t *d, const omv_reconfig_t *rc)
{
    omv_reconfig_t *p = &d->reconfig;
    if (rc->groups)
        p->groups = rc->groups;
    if (rc->set_sgd) {
        p->set_sgd = 1;
        p->sgd = rc->sgd;
    }
    p->snapshot |= rc->snapshot;
    p->restore |= rc->restore;
    if (rc->opt_gen)
        p->opt_gen = rc->opt_gen;
    p->pending = 1;
}

/* Regroups the live trainers round-robin into g groups that all start at clock. */
static void regroup_now(omv_daemon_t *d, uint32_t g, uint64_t clock, int live)
{
    if (live > 0 && g > (uint32_t)live)
        g = (uint32_t)live;
    int32_t *group_of = malloc(d->n_slots * sizeof(int32_t));
    if (group_of == NULL) {
        omv_log_error("regroup to %u groups: out of memory", g);
        return;
    }
    for (uint32_t s = 0; s < d->n_slots; s++)
        group_of[s] = -1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < d->n_members; i++) {
        member_t *m = &d->members[i];
        if (m->state == MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER)
            group_of[m->slot] = (int32_t)(k++ % g);
    }
    uint32_t before = omv_groups_count(d->groups);
    int r = omv_groups_regroup(d->groups, g, group_of, clock);
    free(group_of);
    if (r < 0) {
        omv_log_error("regroup to %u groups failed: %s", g, omv_strerror(r));
        return;
    }
    d->regroups_total++;
    omv_log_info("regrouped: %u groups (was %u) of %d workers, from step %llu", g, before, live,
                 (unsigned long long)clock);
}

/* Whether some member of group g was sent the parameters of the group's current step: the
 * group began it, and all its members must be able to finish it. */
int omv_daemon_group_begun(const omv_daemon_t *d, uint32_t g)
{
    uint64_t clock = omv_groups_clock(d->groups, g);
    for (uint32_t i = 0; i < d->n_members; i++) {
        const member_t *m = &d->members[i];
        if (m->state == MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER && m->served &&
            m->served_step == clock && omv_groups_of(d->groups, m->slot) == (int)g)
            return 1;
    }
    return 0;
}

/* Applies the pending change when every live trainer waits for its next step and no group is
 * mid-step: nothing is in flight, so no gradient can be lost or counted twice, and a restored
 * model is what every next step reads. Returns whether pulls may be served. */
int omv_daemon_try_reconfig(omv_daemon_t *d)
{
    if (!omv_groups_idle(d->groups))
        return 0;
    uint64_t clock = 0;
    int live = 0;
    for (uint32_t i = 0; i < d->n_members; i++) {
        const member_t *m = &d->members[i];
        if (m->state != MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER)
            continue;
        int g = omv_groups_of(d->groups, m->slot);
        if (g < 0 || !m->parked || m->parked_step != omv_groups_clock(d->groups, (uint32_t)g) ||
            omv_daemon_group_begun(d, (uint32_t)g))
            return 0; /* still computing, or its group is not done */
        uint64_t c = omv_groups_clock(d->groups, (uint32_t)g);
        clock = c > clock ? c : clock;
        live++;
    }
    omv_reconfig_t rc = d->reconfig;
    memset(&d->reconfig, 0, sizeof(d->reconfig));
    if (rc.restore) {
        int r = omv_daemon_probe_base(d, 1);
        if (r < 0)
            omv_log_error("cannot restore the probe base: %s", omv_strerror(r));
    }
    if (rc.snapshot) {
        int r = omv_daemon_probe_base(d, 0);
        if (r < 0)
            omv_log_error("cannot save the probe base: %s", omv_strerror(r));
    }
    if (rc.groups)
        regroup_now(d, rc.groups, clock, live);
    else if (rc.restore)
        /* Every group starts again from the same model: a common clock keeps the bound. */
        regroup_now(d, omv_groups_count(d->groups), clock, live);
    if (rc.set_sgd) {
        d->sgd = rc.sgd;
        omv_log_info("momentum %g, learning rate %g from step %llu", d->sgd.momentum,
                     d->sgd.learning_rate, (unsigned long long)clock);
    }
    omv_daemon_opt_applied(d, rc.opt_gen);
    omv_daemon_timeline_config(d, rc.opt_gen ? "optimizer" : "regroup");
    /* Everyone waits for the common clock: their next pull is for it. */
    for (uint32_t i = 0; i < d->n_members; i++)
        if (d->members[i].state == MEMBER_ALIVE && d->members[i].role == OMV_ROLE_TRAINER &&
            (rc.groups || rc.restore))
            d->members[i].parked_step = clock;
    return 1;
}

