/* A consistent cut across the shard servers, the coordinator's side: the servers stop
 * beginning steps and say which they began (FREEZE, FROZEN); each finishes the most any began
 * and sends (or writes) its range or only says so (CUT, GATHERED); once the reports of those
 * steps are in too, the coordinator does what the cut was for (coordinator.c, failover.c) and
 * the servers go on, with the change if one was made (RESUME). */
#define OMV_LOG_TAG "daemon"
#include <stdlib.h>
#include <string.h>

#include "coord_priv.h"
#include "log.h"
#include "util.h"

/* Whether the reports of every step in the cut are in (none can be beyond it: the servers
 * hold the next steps back). */
int omv_coord_cut_caught_up(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        if (omv_groups_live(r->groups, g) > 0 && omv_groups_clock(r->groups, g) < co->cut.clocks[g])
            return 0;
    return 1;
}

void omv_coord_send_cut_op(omv_run_t *r, omv_server_op_t op)
{
    omv_coord_t *co = omv_coord(r);
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = op;
    u->gather_id = co->cut.id;
    /* Only training's end resumes this way (omv_coord_cut_resume sends a cut's counters): each
     * server keeps its own and ends its run when its own last step is in. */
    u->final = op == OMV_SERVER_RESUME;
    if (op == OMV_SERVER_CUT) {
        u->n_groups = omv_groups_count(r->groups);
        for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
            u->clocks[g] = co->cut.clocks[g];
        u->no_ranges = !co->cut.ranges;
        if (co->parts.on) {
            omv_strlcpy(u->part_dir, r->ckpt.dir, sizeof(u->part_dir));
            u->part_seq = co->parts.seq;
        }
    }
    omv_servers_send_run(co->servers, r->env.router, r->id, &msg);
}

/* The pending change happens at the cut: here, and in RESUME (u, with each slot's group in
 * group_of[n_slots]) on every server, all at the same step boundary. As omv_run_try_reconfig, after
 * a restore every group starts again at a common clock. The probe base is the servers': their
 * shards save and restore their own. */
static void cut_reconfig(omv_run_t *r, omv_server_msg_t *u, int32_t *group_of)
{
    omv_reconfig_t rc = r->reconfig;
    memset(&r->reconfig, 0, sizeof(r->reconfig));
    uint64_t clock = 0;
    for (uint32_t g = 0; g < omv_groups_count(r->groups); g++)
        if (omv_groups_live(r->groups, g) > 0 && omv_groups_clock(r->groups, g) > clock)
            clock = omv_groups_clock(r->groups, g);
    int regrouped;
    omv_run_make_change(r, &rc, clock, omv_run_live_trainers(r), &regrouped);
    if (regrouped) {
        u->reconfig |= OMV_SERVER_RECONFIG_REGROUP;
        u->n_groups = omv_groups_count(r->groups);
        for (uint32_t k = 0; k < u->n_groups && k < OMV_WIRE_MAX_CLOCKS; k++)
            u->clocks[k] = clock;
        for (uint32_t slot = 0; slot < r->n_slots; slot++)
            group_of[slot] = omv_groups_of(r->groups, slot);
        u->count = r->n_slots;
    }
    u->reconfig |= rc.set_sgd ? OMV_SERVER_RECONFIG_SGD : 0;
    u->learning_rate = r->sgd.learning_rate;
    u->momentum = r->sgd.momentum;
    u->weight_decay = r->sgd.weight_decay;
    u->reconfig |= (rc.snapshot ? OMV_SERVER_RECONFIG_SNAPSHOT : 0) |
                   (rc.restore ? OMV_SERVER_RECONFIG_RESTORE : 0);
}

/* The servers go on from the cut, with the pending change if any. */
void omv_coord_cut_resume(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg.u.server;
    u->op = OMV_SERVER_RESUME;
    u->gather_id = co->cut.id;
    /* The cut's counters: every step in it is reported (a server's may differ by a probe's). */
    u->images = r->stats.images_total;
    u->steps = r->stats.steps_total;
    int32_t *group_of = NULL;
    if (r->reconfig.pending) {
        group_of = calloc(r->n_slots + 1, sizeof(int32_t));
        if (group_of)
            cut_reconfig(r, u, group_of);
        else
            omv_log_error("the change asked for waits: out of memory");
    }
    /* A probe's steps are not training's: the servers count them as this daemon does. */
    u->reconfig |= omv_tuner_probing(r->tuner) ? OMV_SERVER_RECONFIG_PROBING : 0;
    for (uint32_t i = 0; i < co->servers->n; i++) {
        omv_server_t *s = &co->servers->rec[i];
        if (s->alive && s->run_id == r->id &&
            omv_servers_send(co->servers, r->env.router, s, &msg, group_of) < 0)
            omv_log_warn("cannot send resume to shard server %u", i + 1);
    }
    free(group_of);
}

void omv_coord_frozen(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *f)
{
    if (!omv_run_remote(r))
        return;
    omv_coord_t *co = omv_coord(r);
    if (co->cut.phase != OMV_CUT_FREEZING || f->gather_id != co->cut.id || s->run_id != r->id)
        return;
    for (uint32_t g = 0; g < f->n_groups && g < r->max_groups; g++)
        if (f->clocks[g] > co->cut.clocks[g])
            co->cut.clocks[g] = f->clocks[g];
    if (--co->cut.left > 0)
        return;
    /* The most steps any server saw begun (in a failover: applied): each finishes those, and
     * sends its range. */
    co->cut.phase = OMV_CUT_CUTTING;
    co->gather.left = co->n_servers;
    co->gather.final = 0;
    co->gather.params_only = 0;
    omv_coord_send_cut_op(r, OMV_SERVER_CUT);
}

void omv_coord_begin_cut(omv_run_t *r, int ranges, int parts)
{
    omv_coord_t *co = omv_coord(r);
    co->cut.phase = OMV_CUT_FREEZING;
    co->cut.ranges = ranges;
    co->parts.on = parts;
    co->parts.seq = r->ckpt.seq + 1;
    memset(co->parts.how, 0, sizeof(co->parts.how));
    co->cut.id = ++co->gather.id;
    co->cut.left = co->n_servers;
    co->gather.left = 0; /* a gather under way is dropped: the cut brings the model */
    memset(co->cut.clocks, 0, r->max_groups * sizeof(uint64_t));
}
