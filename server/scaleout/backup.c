/* A backup of a range: it takes the same pushes as the range's primary, from the workers, but
 * may see a worker's push for the next step before another's for this one (they come over
 * different links): such a push, and every later one of the same worker, waits for its step;
 * and at a cut, pushes of the cut's steps wait for the coordinator's orders at it. */
#define OMV_LOG_TAG "daemon"
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "shard_server_priv.h"
#include "util.h"

/* Whether a backup at a cut must keep group g's push for step back until the cut's orders. */
static int backup_beyond_cut(const omv_run_t *r, int g, uint64_t step)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    return ss->held.cut_on && g >= 0 && (uint32_t)g < ss->held.cut_n && step >= ss->held.cut[g];
}

void omv_shard_server_backup_cut(omv_run_t *r, const uint64_t *clocks, uint32_t n)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    ss->held.cut_on = clocks != NULL;
    ss->held.cut_n = n < OMV_WIRE_MAX_CLOCKS ? n : OMV_WIRE_MAX_CLOCKS;
    for (uint32_t g = 0; clocks && g < ss->held.cut_n; g++)
        ss->held.cut[g] = clocks[g];
}

/* A push that waits for its step is kept, in order. Returns whether it was kept. */
int omv_backup_hold(omv_run_t *r, omv_member_t *m, const omv_push_t *p)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    /* Only a push that fits a shard of the range may wait: any other is refused now (by
     * push_fits, as the primary refuses it), not kept to fill the backup's memory. */
    const omv_shard_t *sh =
        p->shard >= r->lo && p->shard < r->hi ? &r->shards->shards[p->shard] : NULL;
    if (sh == NULL || p->offset != sh->offset || p->count != sh->count || p->wire == OMV_WIRE_SHM)
        return 0;
    int g = omv_groups_of(r->groups, m->slot);
    uint32_t id = omv_members_id(r->env.members, m);
    int behind = 0;
    for (uint32_t i = 0; i < ss->held.n && !behind; i++)
        behind = ss->held.q[i].worker_id == id;
    if (!behind && r->state != OMV_JOB_WAITING && !backup_beyond_cut(r, g, p->step) &&
        (g < 0 || p->step <= omv_groups_clock(r->groups, (uint32_t)g)))
        return 0;
    if (ss->held.q == NULL)
        ss->held.q = calloc(OMV_HELD_MAX, sizeof(omv_held_push_t));
    if (ss->held.q == NULL || ss->held.n == OMV_HELD_MAX) {
        if (!ss->broken)
            omv_log_error("backup of shards [%u, %u): %u pushes wait for their steps, the most "
                          "it keeps: it no longer follows its primary",
                          r->lo, r->hi, ss->held.n);
        ss->broken = 1;
        return 1;
    }
    omv_held_push_t *h = &ss->held.q[ss->held.n];
    omv_router_take_payload(r->env.router, &h->payload);
    size_t len = 0,
           range = (size_t)(r->shards->offsets[r->hi] - r->shards->offsets[r->lo]) * sizeof(float);
    omv_payload_data(&h->payload, &len);
    size_t cap = 4 * range * (r->n_slots ? r->n_slots : 1);
    if (cap < OMV_HELD_MIN_BYTES)
        cap = OMV_HELD_MIN_BYTES;
    if (ss->held.bytes + len > cap) {
        omv_payload_close(&h->payload);
        if (!ss->broken)
            omv_log_error("backup of shards [%u, %u): %zu bytes of pushes wait for their steps, "
                          "the most it keeps: it no longer follows its primary",
                          r->lo, r->hi, ss->held.bytes + len);
        ss->broken = 1;
        return 1;
    }
    ss->held.n++;
    ss->held.bytes += len;
    h->since_ms = omv_time_ms();
    h->worker_id = id;
    h->push = *p;
    return 1;
}

/* A held push leaves the queue (taken, or its worker gone): its bytes no longer count. */
static void held_out(omv_run_t *r, omv_held_push_t *h)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    size_t len = 0;
    omv_payload_data(&h->payload, &len);
    ss->held.bytes -= len < ss->held.bytes ? len : ss->held.bytes;
}

/* The held pushes whose steps have come, in the order they came. */
void omv_backup_release(omv_run_t *r)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    uint32_t blocked[OMV_HELD_MAX], n_blocked = 0, kept = 0;
    for (uint32_t i = 0; i < ss->held.n; i++) {
        omv_held_push_t h = ss->held.q[i];
        omv_member_t *m = omv_members_get(r->env.members, h.worker_id);
        int g = m && m->state == OMV_MEMBER_ALIVE ? omv_groups_of(r->groups, m->slot) : -1;
        int wait = 0;
        for (uint32_t k = 0; k < n_blocked && !wait; k++)
            wait = blocked[k] == h.worker_id;
        if (!wait && g >= 0 &&
            (r->state == OMV_JOB_WAITING || backup_beyond_cut(r, g, h.push.step) ||
             h.push.step > omv_groups_clock(r->groups, (uint32_t)g)))
            wait = 1;
        if (!wait || g < 0)
            held_out(r, &h);
        if (g < 0) {
            omv_payload_close(&h.payload); /* gone meanwhile */
        } else if (wait) {
            blocked[n_blocked++] = h.worker_id;
            ss->held.q[kept++] = h;
            if (!ss->broken && omv_time_ms() - h.since_ms > OMV_HELD_MAX_MS) {
                omv_log_error("backup of shards [%u, %u): a push of step %llu has waited %d s "
                              "for its step (one it missed?): it no longer follows its primary",
                              r->lo, r->hi, (unsigned long long)h.push.step,
                              OMV_HELD_MAX_MS / 1000);
                ss->broken = 1;
            }
        } else {
            omv_run_push_with(r, m, &h.push, &h.payload);
        }
    }
    ss->held.n = kept;
}

void omv_backup_fini(omv_run_t *r)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    for (uint32_t i = 0; i < ss->held.n; i++)
        omv_payload_close(&ss->held.q[i].payload);
    ss->held.bytes = 0;
    free(ss->held.q);
    ss->held.q = NULL;
    ss->held.n = 0;
}
