/* A checkpoint of a job over shard servers in parts: a server writes its range as a part file,
 * the coordinator records each part and writes the manifest last. */
#define OMV_LOG_TAG "run"
#include "parts.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_parts.h"
#include "coord_priv.h"
#include "log.h"
#include "range.h"
#include "shard_server_priv.h"
#include "util.h"

/* settle_part: the coordinator cannot see a part its server wrote. */
#define NOT_SHARED (-EREMOTE)

int omv_parts_wanted(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    return !co->parts.off && r->ckpt.dir[0] == '/' && strlen(r->ckpt.dir) < OMV_WIRE_PATH_MAX;
}

/* Server s's range as this cut's part, come as how (OMV_PART_*). */
static void record_part(omv_run_t *r, const omv_server_t *s, int how, uint32_t crc, uint64_t bytes)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t off = r->shards->offsets[s->first];
    co->parts.ref[s->first] = (omv_checkpoint_part_ref_t){
        .first = s->first,
        .last = s->last,
        .offset = off,
        .count = r->shards->offsets[s->last] - off,
        .crc = crc,
        .bytes = bytes,
    };
    co->parts.how[s->first] = (uint8_t)how;
}

void omv_parts_take(omv_run_t *r, const omv_server_t *s, const omv_server_msg_t *g)
{
    omv_coord_t *co = omv_coord(r);
    int wrong = g->part_seq != co->parts.seq;
    if (wrong)
        omv_log_error("shard server %u wrote a part of checkpoint %" PRIu64
                      ", but this cut is for checkpoint %" PRIu64 ": the checkpoint fails",
                      omv_servers_id(co->servers, s), g->part_seq, co->parts.seq);
    record_part(r, s, wrong ? OMV_PART_WRONG : OMV_PART_WRITTEN, g->part_crc, g->part_bytes);
}

void omv_parts_came(omv_run_t *r, const omv_server_t *s)
{
    record_part(r, s, OMV_PART_CAME, 0, 0);
}

int omv_parts_remote(const omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    if (!co->parts.on)
        return 0;
    /* The model is here only when every range came here. */
    for (uint32_t at = 0; at < r->shards->n_shards; at = co->parts.ref[at].last)
        if (co->parts.how[at] != OMV_PART_CAME || co->parts.ref[at].last <= at)
            return 1;
    return 0;
}

void omv_parts_abandon(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    /* Servers may have written parts named after the cut's checkpoint: it is not used again,
     * so that no later file of that name is taken with them. */
    if (co->parts.on && omv_coord_cut_clocks_set(co) && r->ckpt.seq < co->parts.seq)
        r->ckpt.seq = co->parts.seq;
    co->parts.on = 0;
}

/* Part ref's file in the checkpoint folder, written here when its range came here; checked to
 * be where the coordinator sees it when a server wrote it. Returns 0 or -errno with err set. */
static int settle_part(omv_run_t *r, omv_checkpoint_part_ref_t *ref, int how, char *err)
{
    omv_coord_t *co = omv_coord(r);
    if (how == OMV_PART_CAME) {
        const omv_shardset_t *sh = r->shards;
        omv_checkpoint_part_t p = {
            .seq = co->parts.seq,
            .job_name = r->job.name,
            .param_count = r->layout.param_count,
            .ref = *ref,
            .params = co->gather.params + ref->offset,
            .velocity = co->gather.velocity + ref->offset,
            .second = sh->adam ? co->gather.second + ref->offset : NULL,
            .adam_steps = co->gather.adam_steps,
        };
        return omv_checkpoint_write_part(&p, r->ckpt.dir, ref, err);
    }
    if (how == OMV_PART_WRONG) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "the part of shards [%u, %u) is another checkpoint's",
                 ref->first, ref->last);
        return -EIO;
    }
    char name[128], path[OMV_JOB_PATH_MAX + 160];
    omv_checkpoint_part_name(co->parts.seq, ref->first, ref->last, name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", r->ckpt.dir, name);
    struct stat st;
    int seen = stat(path, &st) == 0;
    if (seen && (uint64_t)st.st_size == ref->bytes)
        return 0;
    snprintf(err, OMV_CHECKPOINT_ERR_MAX,
             "its server wrote the part of shards [%u, %u) as %s, which the coordinator %s: the "
             "checkpoint folder is not storage the coordinator and the servers share",
             ref->first, ref->last, path, seen ? "sees with another size" : "cannot see");
    return seen ? -EIO : NOT_SHARED;
}

/* Parts are off: every part a server wrote for this cut that the coordinator cannot see is on
 * that server's own storage, which no checkpoint will name: the server removes it. */
static void drop_unseen(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    for (uint32_t i = 0; i < co->n_servers; i++) {
        /* A failover's cut is written by the ranges' holders, a backup among them. */
        uint32_t id = co->failover.phase != OMV_FAILOVER_NONE ? co->failover.holder_ids[i]
                                                              : co->server_ids[i];
        omv_server_t *s = &co->servers->rec[id - 1];
        if (s->first >= OMV_WIRE_MAX_SHARDS || co->parts.how[s->first] != OMV_PART_WRITTEN)
            continue;
        char name[128], path[OMV_JOB_PATH_MAX + 160];
        omv_checkpoint_part_name(co->parts.seq, s->first, s->last, name, sizeof(name));
        snprintf(path, sizeof(path), "%s/%s", r->ckpt.dir, name);
        struct stat st;
        if (stat(path, &st) == 0)
            continue;
        omv_msg_t msg = {.type = OMV_MSG_SERVER};
        msg.u.server.op = OMV_SERVER_DROP_PART;
        msg.u.server.part_seq = co->parts.seq;
        if (omv_servers_send(co->servers, r->env.router, s, &msg, NULL) < 0)
            omv_log_warn("cannot tell shard server %u to remove its part", id);
    }
}

/* A part the coordinator cannot see (err says which): parts are off for the run, and the servers
 * remove the parts it cannot see. */
static void turn_off(omv_run_t *r, const char *err)
{
    omv_coord_t *co = omv_coord(r);
    co->parts.off = 1;
    drop_unseen(r);
    omv_log_warn("job '%s': %s; from now on the servers send their ranges to the coordinator, "
                 "which writes every checkpoint itself",
                 r->job.name, err);
}

int omv_parts_seen(omv_run_t *r)
{
    omv_coord_t *co = omv_coord(r);
    for (uint32_t at = 0; at < r->shards->n_shards && co->parts.ref[at].last > at;
         at = co->parts.ref[at].last) {
        if (co->parts.how[at] != OMV_PART_WRITTEN)
            continue;
        omv_checkpoint_part_ref_t ref = co->parts.ref[at];
        char err[OMV_CHECKPOINT_ERR_MAX];
        if (settle_part(r, &ref, OMV_PART_WRITTEN, err) == 0)
            continue;
        turn_off(r, err);
        return 0;
    }
    return 1;
}

int omv_parts_write(omv_run_t *r, omv_run_ckpt_view_t *v)
{
    omv_coord_t *co = omv_coord(r);
    omv_checkpoint_part_ref_t refs[OMV_WIRE_MAX_SHARDS];
    uint32_t n = 0, n_servers = 0;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int e = r->ckpt.seq + 1 == co->parts.seq ? 0 : -ESTALE;
    if (e < 0)
        snprintf(err, sizeof(err), "its parts are for checkpoint %" PRIu64 ", the next is %" PRIu64,
                 co->parts.seq, r->ckpt.seq + 1);
    for (uint32_t at = 0; e == 0 && at < r->shards->n_shards; at = refs[n++].last) {
        if (co->parts.how[at] == OMV_PART_NONE) {
            snprintf(err, sizeof(err), "no part of the range from shard %u came", at);
            e = -EIO;
            break;
        }
        refs[n] = co->parts.ref[at];
        n_servers += co->parts.how[at] == OMV_PART_WRITTEN;
        e = settle_part(r, &refs[n], co->parts.how[at], err);
    }
    int again = e == NOT_SHARED && !co->parts.off;
    if (again)
        turn_off(r, err);
    if (e < 0) {
        r->ckpt.seq =
            co->parts.seq > r->ckpt.seq ? co->parts.seq : r->ckpt.seq; /* not that one again */
        r->ckpt.failed_total++;
        snprintf(r->ckpt.last_error, sizeof(r->ckpt.last_error), "checkpoint %" PRIu64 ": %s",
                 co->parts.seq, err);
        omv_log_error("checkpoint %" PRIu64 " failed: %s", co->parts.seq, err);
        r->ckpt.due = again;
        if (!again) {
            uint64_t step = omv_groups_min_clock(r->groups);
            r->ckpt.last_s = omv_time_s();
            r->ckpt.last_step = step == UINT64_MAX ? 0 : step; /* not again at once */
        }
        return e;
    }
    v->n_parts = n;
    v->parts = refs;
    v->adam = r->shards->adam;
    v->adam_steps = co->gather.adam_steps;
    omv_log_info("checkpoint %" PRIu64 ": %u parts, %u of them written by their servers",
                 co->parts.seq, n, n_servers);
    return omv_run_ckpt_write(&r->ckpt, v);
}

int omv_parts_send(omv_run_t *r, uint64_t gather_id)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    uint32_t first = r->lo, last = r->hi;
    uint32_t off = r->shards->offsets[first], count = r->shards->offsets[last] - off;
    char why[1024];
    /* Where this server may write, as for a daemon's own checkpoints. */
    int e = omv_run_ckpt_confined(ss->cut.dir, r->env.state_dir, r->env.checkpoint_root, why,
                                  sizeof(why));
    if (e < 0) {
        omv_log_warn("checkpoint %" PRIu64 ": shards [%u, %u) go to the coordinator, not into a "
                     "part: %s (allow it with [security] checkpoint_root)",
                     ss->cut.seq, first, last, why);
        return e;
    }
    e = omv_shardset_gather(r->shards, 1);
    if (e < 0) {
        omv_log_error("cannot gather shards [%u, %u) for checkpoint %" PRIu64 "'s part: %s", first,
                      last, ss->cut.seq, omv_strerror(e));
        return e;
    }
    const omv_shardset_t *sh = r->shards;
    omv_checkpoint_part_t p = {
        .seq = ss->cut.seq,
        .job_name = r->job.name,
        .param_count = r->layout.param_count,
        .ref = {.first = first, .last = last, .offset = off, .count = count},
        .params = sh->gather_params + off,
        .velocity = sh->gather_velocity + off,
        .second = sh->adam ? sh->gather_second + off : NULL,
        .adam_steps = sh->gather_steps[first],
    };
    omv_checkpoint_part_ref_t ref;
    char err[OMV_CHECKPOINT_ERR_MAX];
    double t0 = omv_time_s();
    e = omv_checkpoint_write_part(&p, ss->cut.dir, &ref, err);
    if (e < 0) {
        omv_log_warn("cannot write shards [%u, %u) as checkpoint %" PRIu64 "'s part: %s; the "
                     "range goes to the coordinator instead",
                     first, last, ss->cut.seq, err);
        return e;
    }
    omv_log_info("checkpoint %" PRIu64 ": shards [%u, %u) written as a part in %.0f ms (%" PRIu64
                 " bytes)",
                 ss->cut.seq, first, last, (omv_time_s() - t0) * 1000.0, ref.bytes);
    char name[128];
    omv_checkpoint_part_name(ss->cut.seq, first, last, name, sizeof(name));
    snprintf(ss->written.path, sizeof(ss->written.path), "%s/%s", ss->cut.dir, name);
    ss->written.seq = ss->cut.seq;
    omv_msg_t msg;
    omv_server_msg_t *u = omv_range_gathered_msg(r, &msg, gather_id);
    u->part = 1;
    u->part_seq = ss->cut.seq;
    u->part_crc = ref.crc;
    u->part_bytes = ref.bytes;
    u->adam_steps = p.adam_steps;
    e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot tell the coordinator of checkpoint %" PRIu64 "'s part: %s",
                      ss->cut.seq, omv_strerror(e));
    return 0; /* written: the coordinator hears of it, or the cut is given up */
}

void omv_parts_drop(omv_run_t *r, uint64_t seq)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    if (seq == 0 || seq != ss->written.seq)
        return;
    ss->written.seq = 0;
    if (unlink(ss->written.path) < 0 && errno != ENOENT) {
        omv_log_warn("cannot remove %s, which the coordinator cannot see: %s", ss->written.path,
                     strerror(errno));
        return;
    }
    omv_log_warn("removed %s, checkpoint %" PRIu64 "'s part of shards [%u, %u): the coordinator "
                 "cannot see this folder",
                 ss->written.path, seq, r->lo, r->hi);
}
