/* Changes between steps: regrouping (by hand or for the optimizer), a new update rule, the
 * optimizer's probe base; made once every group is between steps. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "run_priv.h"
#include "util.h"

void omv_run_tuner_poll(omv_run_t *r)
{
    if (r->state != OMV_JOB_RUNNING)
        return;
    omv_reconfig_t rc;
    if (omv_tuner_poll(r->tuner, omv_time_s(), &r->reconfig, &r->sgd, &rc))
        omv_reconfig_merge(&r->reconfig, &rc);
}

/* The live trainers changed: the optimizer caps g by them and runs again what they disturbed. */
void omv_run_tuner_membership(omv_run_t *r)
{
    if (!omv_tuner_active(r->tuner) || r->state != OMV_JOB_RUNNING)
        return;
    omv_tuner_membership(r->tuner, omv_run_live_trainers(r), omv_time_s());
    omv_run_tuner_poll(r);
}

int omv_run_request_regroup(omv_run_t *r, uint32_t g, char *why, size_t cap)
{
    uint32_t live = (uint32_t)omv_run_live_trainers(r);
    if (r->state != OMV_JOB_RUNNING && r->state != OMV_JOB_WAITING) {
        snprintf(why, cap, "job '%s' is %s: nothing to regroup", r->job.name,
                 omv_run_state_names[r->state]);
        return -EAGAIN;
    }
    uint32_t most = live > 0 ? live : (uint32_t)r->job.workers;
    if (g < 1 || g > most || g > omv_groups_max(r->groups)) {
        snprintf(why, cap, "%u groups for %u workers: give 1 to %u", g, live, most);
        return -EINVAL;
    }
    omv_reconfig_t rc = {.groups = g};
    omv_reconfig_merge(&r->reconfig, &rc);
    omv_log_info("regroup to %u groups requested (now %u); it happens between steps", g,
                 omv_groups_count(r->groups));
    return 0;
}

/* Saves or restores the probe base as the pending change asks, restore first. */
void omv_run_probe_base(omv_run_t *r, const omv_reconfig_t *rc)
{
    if (rc->restore) {
        int e = omv_shardset_probe_base(r->shards, 1);
        if (e < 0)
            omv_log_error("cannot restore the probe base: %s", omv_strerror(e));
    }
    if (rc->snapshot) {
        int e = omv_shardset_probe_base(r->shards, 0);
        if (e < 0)
            omv_log_error("cannot save the probe base: %s", omv_strerror(e));
    }
}

/* The change rc at clock, with live trainers, on this daemon's groups and rule (the probe base
 * is the caller's): regroups (after a restore too, so that every group starts again from the
 * same model at a common clock, which keeps the bound), sets the rule, and tells the optimizer
 * and the timeline. Returns the groups asked for (0: none) and in *ret_regrouped whether the
 * regroup was made. */
uint32_t omv_run_make_change(omv_run_t *r, const omv_reconfig_t *rc, uint64_t clock, int live,
                             int *ret_regrouped)
{
    uint32_t g = rc->groups ? rc->groups : rc->restore ? omv_groups_count(r->groups) : 0;
    *ret_regrouped =
        g && omv_reconfig_regroup(r->groups, r->env.members, r->n_slots, g, clock, live) == 0;
    r->stats.regroups_total += (uint64_t)*ret_regrouped;
    if (rc->set_sgd) {
        r->sgd = rc->sgd;
        omv_log_info("momentum %g, learning rate %g from step %llu", r->sgd.momentum,
                     r->sgd.learning_rate, (unsigned long long)clock);
    }
    omv_tuner_applied(r->tuner, rc->opt_gen, omv_run_epoch(r), omv_time_s());
    omv_timeline_now_t now = omv_run_timeline_now(r);
    omv_timeline_config(&r->timeline, &now, rc->opt_gen ? "optimizer" : "regroup");
    return g;
}

/* Carries out the pending change if every group is between steps: nothing is in flight, and a
 * restored model is what every next step reads. Returns whether pulls may be served. */
int omv_run_try_reconfig(omv_run_t *r)
{
    uint64_t clock;
    int live;
    if (!omv_reconfig_ready(r->groups, r->env.members, &clock, &live))
        return 0;
    omv_reconfig_t rc = r->reconfig;
    memset(&r->reconfig, 0, sizeof(r->reconfig));
    omv_run_probe_base(r, &rc);
    int regrouped;
    uint32_t g = omv_run_make_change(r, &rc, clock, live, &regrouped);
    /* Everyone waits for the common clock: their next pull is for it. */
    for (uint32_t i = 0; i < r->env.members->n && g; i++) {
        omv_member_t *m = &r->env.members->records[i];
        if (m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER)
            m->parked_step = clock;
    }
    return 1;
}
