/* Failover, the coordinator's side: a shard server of the run is gone and every range is still
 * held (by its primary or its backup), or a free server comes to keep a backup: the ranges'
 * holders are cut at the steps every member reported, the cut is written as a checkpoint, and
 * the run is made again from it over the servers there are. Without a replica, the run goes
 * back to its last checkpoint. */
#define OMV_LOG_TAG "daemon"
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coord_priv.h"
#include "log.h"
#include "parts.h"
#include "util.h"

/* How long the reports must stand still before a failover's cut, so that every step that can
 * still end (its parameters all sent before the server went) has ended, and its pushes are
 * all in at the holders before they are cut: 500 ms, and twice the slowest live trainer's
 * measured step on top (a step under way when the server went ends within one, however slow
 * the trainer); before any trainer has a measured step, as long as a worker may be silent. A
 * cut sooner would leave such a step out, to be trained again, or, where its pushes reached a
 * holder before the cut and its report the coordinator after, find the holders' ranges at
 * other steps than the cut and go back to the last checkpoint. Made again at every look (a
 * trainer that dies meanwhile no longer counts); at most 10 minutes. */
#define FAILOVER_SETTLE_MS 500
#define FAILOVER_SETTLE_MAX_MS 600000
/* A failover's cut that is not in this long after its settle is given up on. */
#define FAILOVER_DEADLINE_MS 30000
/* A free server up this long may be taken as a backup: one that keeps dying is not, over and
 * over. */
#define BACKUP_SETTLE_MS 2000

/* A failover's CUT, to each range's holder (its primary, or its backup). */
static void send_failover_op(omv_run_t *r, omv_server_op_t op)
{
    omv_coord_t *co = omv_coord(r);
    for (uint32_t i = 0; i < co->n_servers; i++) {
        omv_server_t *s = &co->servers->rec[co->failover.holder_ids[i] - 1];
        omv_msg_t msg = {.type = OMV_MSG_SERVER};
        omv_server_msg_t *u = &msg.u.server;
        u->op = op;
        u->gather_id = co->cut.id;
        u->failover = 1;
        u->first_shard = s->first;
        u->last_shard = s->last;
        if (op == OMV_SERVER_CUT) {
            u->n_groups = omv_groups_count(r->groups);
            for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
                u->clocks[g] = co->cut.clocks[g];
        }
        if (op == OMV_SERVER_CUT && co->parts.on) {
            omv_strlcpy(u->part_dir, r->ckpt.dir, sizeof(u->part_dir));
            u->part_seq = co->parts.seq;
        }
        if (omv_servers_send(co->servers, r->env.router, s, &msg, NULL) < 0)
            omv_log_warn("cannot send %s to shard server %u", omv_server_op_name(op),
                         co->failover.holder_ids[i]);
    }
}

static int64_t failover_settle_ms(const omv_run_t *r, double *ret_slowest_ms)
{
    double slowest = 0.0;
    for (uint32_t i = 0; i < r->env.members->n; i++) {
        const omv_member_t *m = &r->env.members->records[i];
        int g = m->state == OMV_MEMBER_ALIVE && m->role == OMV_ROLE_TRAINER
                    ? omv_groups_of(r->groups, m->slot)
                    : -1;
        if (g < 0)
            continue;
        /* Its share of its group's batch: the servers, not the coordinator, send its steps. */
        uint32_t live = omv_groups_live(r->groups, (uint32_t)g);
        double share = m->batch ? m->batch : (double)r->job.batch_size / (live ? live : 1);
        double ms = m->ms_per_image * share;
        ms = (double)m->last_compute_ms > ms ? (double)m->last_compute_ms : ms;
        slowest = isfinite(ms) && ms > slowest ? ms : slowest;
    }
    *ret_slowest_ms = slowest;
    double settle = slowest > 0 ? FAILOVER_SETTLE_MS + 2.0 * slowest
                                : FAILOVER_SETTLE_MS + r->job.worker_timeout_s * 1000.0;
    return settle < FAILOVER_SETTLE_MAX_MS ? (int64_t)settle : FAILOVER_SETTLE_MAX_MS;
}

/* A server of the run is gone and every range is still held (by its primary or its backup):
 * once the steps under way have settled (failover_settle), the holders are cut at the steps
 * every member reported (a begun step whose parameters the gone server never sent can never
 * end), and once the cut is in it is written as a checkpoint and the run is made again from it
 * over the servers left (failover_done). Returns whether the failover began. */
static int start_failover(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (!r->ckpt.enabled || !r->job.checkpoint_resume || r->state != OMV_JOB_RUNNING ||
        omv_tuner_probing(r->tuner))
        return 0; /* nowhere to write it or resume it, or the servers hold a probe's model */
    for (uint32_t i = 0; i < co->n_servers; i++) {
        const omv_server_t *p = &co->servers->rec[co->server_ids[i] - 1];
        const omv_server_t *b = co->backup_ids[i] ? &co->servers->rec[co->backup_ids[i] - 1] : NULL;
        co->failover.holder_ids[i] = p->alive        ? co->server_ids[i]
                                     : b && b->alive ? co->backup_ids[i]
                                                     : 0;
        if (co->failover.holder_ids[i] == 0 || omv_coord_gather_buffers(r) < 0)
            return 0;
    }
    /* Only a backup is gone: every primary can finish its begun steps, as at any cut. */
    int primaries = 1;
    for (uint32_t i = 0; i < co->n_servers; i++)
        primaries &= co->failover.holder_ids[i] == co->server_ids[i];
    co->failover.phase = primaries ? OMV_FAILOVER_BACKUP : OMV_FAILOVER_PRIMARY;
    co->failover.ms = co->failover.quiet_ms = omv_time_ms();
    double slowest_ms = 0.0;
    co->failover.settle_ms = failover_settle_ms(r, &slowest_ms);
    co->failover.sig = UINT64_MAX;
    co->servers->failovers_total++;
    omv_parts_abandon(r); /* a cut under way is given up */
    /* The holders write the cut as a checkpoint's parts, which the run made again reads. */
    omv_coord_begin_cut(r, 1, omv_parts_wanted(r));
    for (uint32_t i = 0; i < co->n_servers; i++)
        if (co->failover.holder_ids[i] != co->server_ids[i])
            omv_log_warn("job '%s': shards [%u, %u) go on from their backup, shard server %u",
                         r->job.name, co->servers->rec[co->failover.holder_ids[i] - 1].first,
                         co->servers->rec[co->failover.holder_ids[i] - 1].last,
                         co->failover.holder_ids[i]);
    if (primaries)
        omv_coord_send_cut_op(r, OMV_SERVER_FREEZE);
    else
        omv_log_warn("job '%s': failover: the holders are cut once no step has been reported for "
                     "%lld ms (the slowest trainer's step takes %.0f ms)",
                     r->job.name, (long long)co->failover.settle_ms, slowest_ms);
    return 1;
}

/* A failover that cannot end: back to the last checkpoint (or failed), as without replicas. */
void omv_coord_failover_abandon(omv_run_t *r, const char *why)
{
    omv_coord_t *co = omv_coord(r);
    co->failover.phase = OMV_FAILOVER_NONE;
    co->cut.phase = OMV_CUT_NONE;
    if (!r->job.checkpoint_resume ||
        (r->job.checkpoint_every_s <= 0 && r->job.checkpoint_every_steps <= 0)) {
        char fail[256];
        snprintf(fail, sizeof(fail), "%s, and the job writes no checkpoint to go back to", why);
        omv_run_finish(r, OMV_JOB_FAILED, fail);
        return;
    }
    omv_log_warn("job '%s': %s: it goes back to its last checkpoint", r->job.name, why);
    omv_strlcpy(r->rewind.reason, why, sizeof(r->rewind.reason));
    r->rewind.wanted = 1;
}

/* A failover waits for the reports to stand still; then the holders cut at the clocks. */
void omv_coord_failover_settle(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (co->failover.phase != OMV_FAILOVER_NONE &&
        omv_time_ms() - co->failover.ms > FAILOVER_DEADLINE_MS + co->failover.settle_ms) {
        char why[128];
        snprintf(why, sizeof(why), "the failover's cut did not come in within %lld s",
                 (long long)((FAILOVER_DEADLINE_MS + co->failover.settle_ms) / 1000));
        omv_coord_failover_abandon(r, why);
        return;
    }
    if (co->failover.phase != OMV_FAILOVER_PRIMARY || co->cut.phase != OMV_CUT_FREEZING)
        return;
    uint64_t sig = r->stats.pushes_recorded_total;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        sig = sig * 31 + omv_groups_clock(r->groups, g);
    int64_t now = omv_time_ms();
    if (sig != co->failover.sig) {
        co->failover.sig = sig;
        co->failover.quiet_ms = now;
        return;
    }
    double slowest_ms;
    co->failover.settle_ms = failover_settle_ms(r, &slowest_ms);
    if (now - co->failover.quiet_ms < co->failover.settle_ms)
        return;
    for (uint32_t g = 0; g < r->max_groups; g++)
        co->cut.clocks[g] = g < omv_groups_count(r->groups) ? omv_groups_clock(r->groups, g) : 0;
    co->cut.phase = OMV_CUT_CUTTING;
    co->gather.left = co->n_servers;
    co->gather.final = 0;
    co->gather.params_only = 0;
    send_failover_op(r, OMV_SERVER_CUT);
}

int omv_coord_take_backup(omv_run_t *r)
{
    if (!omv_run_remote(r))
        return 0;
    omv_coord_t *co = omv_coord(r);
    if (r->job.replicas < 2 || r->state != OMV_JOB_RUNNING ||
        co->failover.phase != OMV_FAILOVER_NONE || r->rewind.wanted ||
        co->cut.phase != OMV_CUT_NONE || co->n_backups >= (uint32_t)r->job.servers)
        return 0;
    int settled = 0;
    for (uint32_t i = 0; i < co->servers->n; i++) {
        const omv_server_t *s = &co->servers->rec[i];
        settled |= s->used && s->alive && s->run_id == 0 &&
                   omv_time_ms() - s->joined_ms >= BACKUP_SETTLE_MS;
    }
    if (!settled || !start_failover(r))
        return 0;
    /* Every primary is there: an ordinary cut, made again with the newcomer as a backup. */
    co->failover.phase = OMV_FAILOVER_NEW_BACKUP;
    co->servers->failovers_total--;
    omv_log_info("job '%s': a free shard server can keep a backup (%u of %lld ranges have one): "
                 "the run is cut and made again with it",
                 r->job.name, co->n_backups, (long long)r->job.servers);
    return 1;
}

/* The failover's cut is in: a checkpoint of it, and the run made again from it. */
void omv_coord_failover_done(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    r->ckpt.forced = 1;
    int parts_off = co->parts.off;
    int e = omv_run_write_checkpoint(r);
    if (e < 0 && co->parts.off && !parts_off) {
        /* The holders wrote parts where the coordinator cannot see them: the same cut again,
         * its ranges sent here (the holders are frozen at it), not a step lost. */
        omv_log_warn("job '%s': failover: the cut again, its ranges sent to the coordinator",
                     r->job.name);
        co->parts.on = 0;
        co->cut.phase = OMV_CUT_CUTTING;
        co->cut.id = ++co->gather.id;
        co->gather.left = co->n_servers;
        co->gather.final = 0;
        co->gather.params_only = 0;
        send_failover_op(r, OMV_SERVER_CUT);
        return;
    }
    co->cut.phase = OMV_CUT_NONE;
    if (e < 0 && co->failover.phase == OMV_FAILOVER_NEW_BACKUP) {
        /* Not worth going back for a backup: the servers go on as they were. */
        omv_log_warn("job '%s': the cut for a new backup could not be written: going on "
                     "without it",
                     r->job.name);
        co->failover.phase = OMV_FAILOVER_NONE;
        omv_coord_cut_resume(r);
        return;
    }
    uint64_t steps = 0;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        steps = co->cut.clocks[g] > steps ? co->cut.clocks[g] : steps;
    snprintf(r->rewind.reason, sizeof(r->rewind.reason), "%s at step %llu in %lld ms%s",
             co->failover.phase == OMV_FAILOVER_NEW_BACKUP
                 ? "a new backup: the servers were cut"
                 : "failover: the ranges' holders were cut",
             (unsigned long long)steps, (long long)(omv_time_ms() - co->failover.ms),
             e < 0 ? "; its checkpoint failed: the last one is used" : "");
    omv_log_warn("job '%s': %s; it goes on from there over the servers left", r->job.name,
                 r->rewind.reason);
    r->rewind.wanted = 1;
    r->rewind.degraded = 1;
}

void omv_coord_server_lost(omv_run_t *r, omv_server_t *s)
{
    if (!omv_run_remote(r))
        return;
    omv_coord_t *co = omv_coord(r);
    if (s->run_id != r->id || OMV_JOB_OVER(r->state) || r->rewind.wanted)
        return;
    char why[256];
    int n = snprintf(why, sizeof(why), "shard server %u (%s) is gone with shards [%u, %u)%s",
                     omv_servers_id(co->servers, s), s->endpoint, s->first, s->last,
                     s->backup ? " (their backup)" : "");
    if (r->job.replicas > 1) {
        /* A second loss during a failover: again, from what is still held. */
        omv_log_warn("job '%s': %s%s", r->job.name, why,
                     co->failover.phase != OMV_FAILOVER_NONE ? " (during a failover)" : "");
        co->failover.phase = OMV_FAILOVER_NONE;
        co->cut.phase = OMV_CUT_NONE;
        if (start_failover(r))
            return;
    }
    /* No failover (or a holder of it is gone too): back to the last checkpoint. */
    co->failover.phase = OMV_FAILOVER_NONE;
    co->cut.phase = OMV_CUT_NONE;
    n += snprintf(why + n, sizeof(why) - (size_t)n, ", which have no replica left");
    if (!r->ckpt.enabled || !r->job.checkpoint_resume ||
        (r->job.checkpoint_every_s <= 0 && r->job.checkpoint_every_steps <= 0)) {
        snprintf(why + n, sizeof(why) - (size_t)n,
                 ", and the job writes no checkpoint to go back to");
        omv_run_finish(r, OMV_JOB_FAILED, why);
        return;
    }
    /* The daemon makes the run again from its last checkpoint (a cut of every server's range),
     * which waits for as many servers as before: the one that comes back, or another. */
    omv_log_warn("job '%s': %s; it goes back to its last checkpoint and waits for %lld servers",
                 r->job.name, why, (long long)(r->job.servers * r->job.replicas));
    omv_strlcpy(r->rewind.reason, why, sizeof(r->rewind.reason));
    r->rewind.wanted = 1;
}
