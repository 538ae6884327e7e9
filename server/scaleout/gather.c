/* Gathers of the model from its shard servers into the coordinator's shards: for an
 * evaluation the servers cannot send the evaluator themselves, for the final model, and for a
 * cut (cut.c) whose ranges come here. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coord_priv.h"
#include "log.h"
#include "parts.h"
#include "range.h"
#include "util.h"

/* Room for the servers' ranges. Returns 0 or -ENOMEM (logged). */
int omv_coord_gather_buffers(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    size_t n = r->layout.param_count ? r->layout.param_count : 1;
    if (co->gather.params == NULL) {
        co->gather.params = malloc(n * sizeof(float));
        co->gather.velocity = malloc(n * sizeof(float));
        if (r->shards->adam)
            co->gather.second = malloc(n * sizeof(float));
    }
    if (co->gather.params == NULL || co->gather.velocity == NULL ||
        (r->shards->adam && co->gather.second == NULL)) {
        omv_log_error("no memory to gather the model from the shard servers");
        return -ENOMEM;
    }
    return 0;
}

/* The model on shard servers: whether they send the evaluator their ranges themselves (it
 * attached to them), or there is no evaluator. */
int omv_coord_evals_direct(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (r->eval.evaluator == 0)
        return 1;
    const omv_member_t *m = omv_members_get(r->env.members, r->eval.evaluator);
    return m && m->attach_token && co->n_servers > 0;
}

/* Whether the coordinator's shards hold the model: a gather of it came (and the final model is not
 * in the servers' parts). */
int omv_coord_model_here(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    return co->gather.fresh || (co->gather.fetched_final && !co->gather.final_in_parts);
}

void omv_coord_fetch(omv_run_t *r, int final)
{
    omv_coord_t *co = omv_coord(r);
    if (co->cut.phase != OMV_CUT_NONE || (co->gather.left > 0 && (co->gather.final || !final)))
        return; /* one is under way already, or the cut brings the model */
    if (omv_coord_gather_buffers(r) < 0)
        return;
    co->gather.id++;
    co->gather.left = co->n_servers;
    co->gather.final = final;
    /* An evaluation needs the parameters alone: the momentum (and Adam's moments) stay on the
     * servers, a half (a third) of the bytes. The final model comes whole, for its checkpoint. */
    co->gather.params_only = !final;
    omv_msg_t msg = {.type = OMV_MSG_SERVER};
    msg.u.server.op = OMV_SERVER_GATHER;
    msg.u.server.gather_id = co->gather.id;
    msg.u.server.final = final;
    msg.u.server.params_only = !final;
    /* The final model for its checkpoint alone (its evaluation went to the evaluator): each
     * server writes its range as a part, as at a checkpoint's cut, and the manifest names them. */
    if (final)
        co->parts.on = omv_coord_evals_direct(r) && r->ckpt.enabled && omv_parts_wanted(r);
    if (final && co->parts.on) {
        co->parts.seq = r->ckpt.seq + 1;
        memset(co->parts.how, 0, sizeof(co->parts.how));
        omv_strlcpy(msg.u.server.part_dir, r->ckpt.dir, sizeof(msg.u.server.part_dir));
        msg.u.server.part_seq = co->parts.seq;
    }
    omv_servers_send_run(co->servers, r->env.router, r->id, &msg);
}

/* Every server's range is in: into the shards, and on with what waited for it. */
static void fetched(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (co->cut.phase == OMV_CUT_CUTTING && (!co->cut.ranges || omv_parts_remote(r))) {
        /* The cut's steps are in everywhere (and its ranges in their parts, the model staying
         * on the servers): the change or the manifest once reported. */
        co->cut.phase = OMV_CUT_IN;
        omv_run_checkpoint_if_due(r);
        return;
    }
    if (co->gather.final && omv_parts_remote(r)) {
        /* The final model is in the servers' parts, for the manifest: not here. Parts the
         * coordinator cannot see are no checkpoint: the ranges come here instead. */
        if (!omv_parts_seen(r)) {
            omv_coord_fetch(r, 1);
            return;
        }
        co->gather.fetched_final = 1;
        co->gather.final_in_parts = 1;
        omv_run_progress(r);
        return;
    }
    uint64_t steps[OMV_WIRE_MAX_SHARDS];
    for (uint32_t i = 0; i < r->shards->n_shards; i++)
        steps[i] = co->gather.adam_steps;
    int state = !co->gather.params_only; /* an evaluation's gather brings the parameters alone */
    if (omv_shardset_restore(r->shards, co->gather.params, state ? co->gather.velocity : NULL,
                             state && r->shards->adam ? co->gather.second : NULL,
                             state && r->shards->adam ? steps : NULL) < 0) {
        omv_log_error("cannot put the shard servers' model into the daemon's shards");
        return;
    }
    if (co->cut.phase == OMV_CUT_CUTTING) {
        co->cut.phase = OMV_CUT_IN; /* the checkpoint once the reports of its steps are in */
        omv_run_checkpoint_if_due(r);
        return;
    }
    co->gather.fetched_final = co->gather.final;
    co->gather.fresh = 1;
    if (r->eval.wanted) {
        r->eval.wanted = 0;
        omv_run_request_eval(r);
    }
    omv_run_progress(r);
}

size_t omv_coord_gather_want(const omv_run_t *r, const omv_server_t *s, const omv_server_msg_t *g,
                             uint32_t *ret_arrays)
{
    const omv_coord_t *co = omv_coord(r);
    uint32_t count = r->shards->offsets[s->last] - r->shards->offsets[s->first];
    *ret_arrays = co->gather.params_only ? 1 : omv_range_arrays(r);
    int parts = co->parts.on && (co->cut.phase == OMV_CUT_CUTTING || co->gather.final);
    if ((co->cut.phase == OMV_CUT_CUTTING && !co->cut.ranges) || (g->part && parts))
        return 0; /* a cut without ranges, or the range in a part: the server's steps are in */
    return (size_t)*ret_arrays * count * sizeof(float);
}

void omv_coord_gather_take(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *g,
                           const float *payload, size_t bytes)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t off = r->shards->offsets[s->first], count = r->shards->offsets[s->last] - off;
    uint32_t arrays = co->gather.params_only ? 1 : omv_range_arrays(r);
    int parts = co->parts.on && (co->cut.phase == OMV_CUT_CUTTING || co->gather.final);
    float *dst[3] = {co->gather.params, co->gather.velocity, co->gather.second};
    for (uint32_t a = 0; bytes > 0 && a < arrays; a++)
        memcpy(dst[a] + off, payload + (size_t)a * count, count * sizeof(float));
    if (parts && g->part)
        omv_parts_take(r, s, g);
    else if (parts && bytes > 0)
        omv_parts_came(r, s);
    if (s->first == 0)
        co->gather.adam_steps = g->adam_steps;
    s->bytes_in += bytes;
    s->gathers++;
    if (--co->gather.left == 0)
        fetched(r);
}
