/* A checkpoint of a job over shard servers in parts: a server writes its range, the coordinator
 * records each part and writes the manifest last. */
#define OMV_LOG_TAG "run"
#include "parts.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_parts.h"
#include "log.h"
#include "util.h"

/* settle_part: the coordinator cannot see a part its server wrote. */
#define NOT_SHARED (-EREMOTE)

omv_server_msg_t *omv_run_gathered_msg(const omv_run_t *r, omv_msg_t *msg, uint64_t id)
{
    *msg = (omv_msg_t){.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg->u.server;
    u->op = OMV_SERVER_GATHERED;
    u->server_id = r->part.server_id;
    u->first_shard = r->part.first;
    u->last_shard = r->part.last;
    u->gather_id = id;
    u->images = r->images_total;
    u->steps = r->steps_total;
    u->n_groups = omv_groups_count(r->groups);
    for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
        u->clocks[g] = omv_groups_clock(r->groups, g);
    return u;
}

int omv_run_parts_wanted(const omv_run_t *r)
{
    return !r->parts_off && r->ckpt.dir[0] == '/' && strlen(r->ckpt.dir) < OMV_WIRE_PATH_MAX;
}

int omv_run_parts_send(omv_run_t *r, uint64_t gather_id)
{
    uint32_t first = r->part.first, last = r->part.last;
    uint32_t off = r->shards->offsets[first], count = r->shards->offsets[last] - off;
    char why[1024];
    /* Where this server may write, as for a daemon's own checkpoints. */
    int e = omv_run_ckpt_confined(r->cut_part_dir, r->env.state_dir, r->env.checkpoint_root, why,
                                  sizeof(why));
    if (e < 0) {
        omv_log_warn("checkpoint %" PRIu64 ": shards [%u, %u) go to the coordinator, not into a "
                     "part: %s (allow it with [security] checkpoint_root)",
                     r->cut_seq, first, last, why);
        return e;
    }
    e = omv_shardset_gather(r->shards, 1);
    if (e < 0) {
        omv_log_error("cannot gather shards [%u, %u) for checkpoint %" PRIu64 "'s part: %s", first,
                      last, r->cut_seq, omv_strerror(e));
        return e;
    }
    const omv_shardset_t *sh = r->shards;
    omv_checkpoint_part_t p = {
        .seq = r->cut_seq,
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
    e = omv_checkpoint_write_part(&p, r->cut_part_dir, &ref, err);
    if (e < 0) {
        omv_log_warn("cannot write shards [%u, %u) as checkpoint %" PRIu64 "'s part: %s; the "
                     "range goes to the coordinator instead",
                     first, last, r->cut_seq, err);
        return e;
    }
    omv_log_info("checkpoint %" PRIu64 ": shards [%u, %u) written as a part in %.0f ms (%" PRIu64
                 " bytes)",
                 r->cut_seq, first, last, (omv_time_s() - t0) * 1000.0, ref.bytes);
    char name[128];
    omv_checkpoint_part_name(r->cut_seq, first, last, name, sizeof(name));
    snprintf(r->part_written_path, sizeof(r->part_written_path), "%s/%s", r->cut_part_dir, name);
    r->part_written_seq = r->cut_seq;
    omv_msg_t msg;
    omv_server_msg_t *u = omv_run_gathered_msg(r, &msg, gather_id);
    u->part = 1;
    u->part_seq = r->cut_seq;
    u->part_crc = ref.crc;
    u->part_bytes = ref.bytes;
    u->adam_steps = p.adam_steps;
    e = omv_router_up_send(r->env.router, &msg, NULL);
    if (e < 0)
        omv_log_error("cannot tell the coordinator of checkpoint %" PRIu64 "'s part: %s",
                      r->cut_seq, omv_strerror(e));
    return 0; /* written: the coordinator hears of it, or the cut is given up */
}

void omv_run_parts_drop(omv_run_t *r, uint64_t seq)
{
    if (seq == 0 || seq != r->part_written_seq)
        return;
    r->part_written_seq = 0;
    if (unlink(r->part_written_path) < 0 && errno != ENOENT) {
        omv_log_warn("cannot remove %s, which the coordinator cannot see: %s", r->part_written_path,
                     strerror(errno));
        return;
    }
    omv_log_warn("removed %s, checkpoint %" PRIu64 "'s part of shards [%u, %u): the coordinator "
                 "cannot see this folder",
                 r->part_written_path, seq, r->part.first, r->part.last);
}

/* Server s's range as this cut's part, come as how (OMV_RUN_PART_*). */
static void record_part(omv_run_t *r, const omv_server_t *s, int how, uint32_t crc, uint64_t bytes)
{
    uint32_t off = r->shards->offsets[s->first];
    r->parts[s->first] = (omv_checkpoint_part_ref_t){
        .first = s->first,
        .last = s->last,
        .offset = off,
        .count = r->shards->offsets[s->last] - off,
        .crc = crc,
        .bytes = bytes,
    };
    r->parts_how[s->first] = (uint8_t)how;
}

void omv_run_parts_take(omv_run_t *r, const omv_server_t *s, const omv_server_msg_t *g)
{
    int wrong = g->part_seq != r->cut_seq;
    if (wrong)
        omv_log_error("shard server %u wrote a part of checkpoint %" PRIu64
                      ", but this cut is for checkpoint %" PRIu64 ": the checkpoint fails",
                      omv_servers_id(r->env.servers, s), g->part_seq, r->cut_seq);
    record_part(r, s, wrong ? OMV_RUN_PART_WRONG : OMV_RUN_PART_WRITTEN, g->part_crc,
                g->part_bytes);
}

void omv_run_parts_came(omv_run_t *r, const omv_server_t *s)
{
    record_part(r, s, OMV_RUN_PART_CAME, 0, 0);
}

int omv_run_parts_remote(const omv_run_t *r)
{
    if (!r->cut_parts)
        return 0;
    /* The model is here only when every range came here. */
    for (uint32_t at = 0; at < r->shards->n_shards; at = r->parts[at].last)
        if (r->parts_how[at] != OMV_RUN_PART_CAME || r->parts[at].last <= at)
            return 1;
    return 0;
}

void omv_run_parts_abandon(omv_run_t *r)
{
    /* Servers may have written parts named after the cut's checkpoint: it is not used again,
     * so that no later file of that name is taken with them. */
    if (r->cut_parts && r->cut_phase >= 2 && r->ckpt.seq < r->cut_seq)
        r->ckpt.seq = r->cut_seq;
    r->cut_parts = 0;
}

/* Part ref's file in the checkpoint folder, written here when its range came here; checked to
 * be where the coordinator sees it when a server wrote it. Returns 0 or -errno with err set. */
static int settle_part(omv_run_t *r, omv_checkpoint_part_ref_t *ref, int how, char *err)
{
    if (how == OMV_RUN_PART_CAME) {
        const omv_shardset_t *sh = r->shards;
        omv_checkpoint_part_t p = {
            .seq = r->cut_seq,
            .job_name = r->job.name,
            .param_count = r->layout.param_count,
            .ref = *ref,
            .params = r->fetch_params + ref->offset,
            .velocity = r->fetch_velocity + ref->offset,
            .second = sh->adam ? r->fetch_second + ref->offset : NULL,
            .adam_steps = r->fetch_adam_steps,
        };
        return omv_checkpoint_write_part(&p, r->ckpt.dir, ref, err);
    }
    if (how == OMV_RUN_PART_WRONG) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "the part of shards [%u, %u) is another checkpoint's",
                 ref->first, ref->last);
        return -EIO;
    }
    char name[128], path[OMV_JOB_PATH_MAX + 160];
    omv_checkpoint_part_name(r->cut_seq, ref->first, ref->last, name, sizeof(name));
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
    for (uint32_t i = 0; i < r->n_servers; i++) {
        /* A failover's cut is written by the ranges' holders, a backup among them. */
        uint32_t id = r->failover ? r->holder_ids[i] : r->server_ids[i];
        omv_server_t *s = &r->env.servers->rec[id - 1];
        if (s->first >= OMV_WIRE_MAX_SHARDS || r->parts_how[s->first] != OMV_RUN_PART_WRITTEN)
            continue;
        char name[128], path[OMV_JOB_PATH_MAX + 160];
        omv_checkpoint_part_name(r->cut_seq, s->first, s->last, name, sizeof(name));
        snprintf(path, sizeof(path), "%s/%s", r->ckpt.dir, name);
        struct stat st;
        if (stat(path, &st) == 0)
            continue;
        omv_msg_t msg = {.type = OMV_MSG_SERVER};
        msg.u.server.op = OMV_SERVER_DROP_PART;
        msg.u.server.part_seq = r->cut_seq;
        if (omv_servers_send(r->env.servers, r->env.router, s, &msg, NULL) < 0)
            omv_log_warn("cannot tell shard server %u to remove its part", id);
    }
}

/* A part the coordinator cannot see (err says which): parts are off for the run, and the servers
 * remove the parts it cannot see. */
static void turn_off(omv_run_t *r, const char *err)
{
    r->parts_off = 1;
    drop_unseen(r);
    omv_log_warn("job '%s': %s; from now on the servers send their ranges to the coordinator, "
                 "which writes every checkpoint itself",
                 r->job.name, err);
}

int omv_run_parts_seen(omv_run_t *r)
{
    for (uint32_t at = 0; at < r->shards->n_shards && r->parts[at].last > at;
         at = r->parts[at].last) {
        if (r->parts_how[at] != OMV_RUN_PART_WRITTEN)
            continue;
        omv_checkpoint_part_ref_t ref = r->parts[at];
        char err[OMV_CHECKPOINT_ERR_MAX];
        if (settle_part(r, &ref, OMV_RUN_PART_WRITTEN, err) == 0)
            continue;
        turn_off(r, err);
        return 0;
    }
    return 1;
}

int omv_run_parts_write(omv_run_t *r, omv_run_ckpt_view_t *v)
{
    omv_checkpoint_part_ref_t refs[OMV_WIRE_MAX_SHARDS];
    uint32_t n = 0, n_servers = 0;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int e = r->ckpt.seq + 1 == r->cut_seq ? 0 : -ESTALE;
    if (e < 0)
        snprintf(err, sizeof(err), "its parts are for checkpoint %" PRIu64 ", the next is %" PRIu64,
                 r->cut_seq, r->ckpt.seq + 1);
    for (uint32_t at = 0; e == 0 && at < r->shards->n_shards; at = refs[n++].last) {
        if (r->parts_how[at] == OMV_RUN_PART_NONE) {
            snprintf(err, sizeof(err), "no part of the range from shard %u came", at);
            e = -EIO;
            break;
        }
        refs[n] = r->parts[at];
        n_servers += r->parts_how[at] == OMV_RUN_PART_WRITTEN;
        e = settle_part(r, &refs[n], r->parts_how[at], err);
    }
    int again = e == NOT_SHARED && !r->parts_off;
    if (again)
        turn_off(r, err);
    if (e < 0) {
        r->ckpt.seq = r->cut_seq > r->ckpt.seq ? r->cut_seq : r->ckpt.seq; /* not that one again */
        r->ckpt.failed_total++;
        snprintf(r->ckpt.last_error, sizeof(r->ckpt.last_error), "checkpoint %" PRIu64 ": %s",
                 r->cut_seq, err);
        omv_log_error("checkpoint %" PRIu64 " failed: %s", r->cut_seq, err);
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
    v->adam_steps = r->fetch_adam_steps;
    omv_log_info("checkpoint %" PRIu64 ": %u parts, %u of them written by their servers",
                 r->cut_seq, n, n_servers);
    return omv_run_ckpt_write(&r->ckpt, v);
}
