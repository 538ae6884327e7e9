/* A shard server's range: its state packed for the wire and its CRC-32, and the range as a job
 * begins: the coordinator sends the job and the range's CRC-32, not the range, and the server
 * makes the range itself the way the coordinator made the model (the job's seed, [model] init,
 * or the checkpoint it resumed, read from the storage they share). Only a range that comes out
 * otherwise (a file the server cannot read, another build) is sent, and the server starts the
 * job once it has it. So a job's parameters pass the coordinator neither at its start nor when
 * it goes back to a checkpoint. */
#define OMV_LOG_TAG "run"
#include "range.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint.h"
#include "coord_priv.h"
#include "log.h"
#include "shard_server_priv.h"
#include "util.h"

/* How many whole-model arrays a range travels as: parameters and momentum, and with Adam its
 * second moments. */
uint32_t omv_range_arrays(const omv_run_t *r)
{
    return r->shards->adam ? 3 : 2;
}

/* The gathered state's arrays: parameters, momentum, second moments. */
static void state_of(const omv_run_t *r, const float *src[3])
{
    src[0] = r->shards->gather_params;
    src[1] = r->shards->gather_velocity;
    src[2] = r->shards->gather_second;
}

void omv_range_pack(const omv_run_t *r, float *buf, uint32_t off, uint32_t count)
{
    const float *src[3];
    state_of(r, src);
    for (uint32_t a = 0; a < omv_range_arrays(r); a++)
        memcpy(buf + (size_t)a * count, src[a] + off, count * sizeof(float));
}

int omv_range_crc(omv_run_t *r, uint32_t first, uint32_t last, uint32_t *ret)
{
    int e = omv_shardset_gather(r->shards, 1);
    if (e < 0)
        return e;
    uint32_t off = r->shards->offsets[first], count = r->shards->offsets[last] - off;
    const float *src[3];
    state_of(r, src);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint32_t a = 0; a < omv_range_arrays(r); a++) {
        const unsigned char *p = (const unsigned char *)(src[a] + off);
        size_t left = (size_t)count * sizeof(float);
        while (left > 0) { /* crc32() takes an unsigned int of bytes at a time */
            uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
            crc = crc32(crc, p, chunk);
            p += chunk;
            left -= chunk;
        }
    }
    *ret = (uint32_t)crc;
    return 0;
}

omv_server_msg_t *omv_range_gathered_msg(const omv_run_t *r, omv_msg_t *msg, uint64_t id)
{
    const omv_shard_server_t *ss = omv_shard_server(r);
    *msg = (omv_msg_t){.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg->u.server;
    u->op = OMV_SERVER_GATHERED;
    u->server_id = ss->server_id;
    u->first_shard = r->lo;
    u->last_shard = r->hi;
    u->gather_id = id;
    u->images = r->stats.images_total;
    u->steps = r->stats.steps_total;
    u->n_groups = omv_groups_count(r->groups);
    for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
        u->clocks[g] = omv_groups_clock(r->groups, g);
    return u;
}

/* The words of the job that lead an ASSIGN's payload. */
static size_t job_words(void)
{
    return (sizeof(omv_job_t) + 3) / 4;
}

/* ASSIGN's or RANGE's fields for server s: its range, the clocks and counters. */
static omv_server_msg_t *range_msg(omv_run_t *r, omv_server_t *s, omv_msg_t *msg,
                                   omv_server_op_t op)
{
    omv_coord_t *co = omv_coord(r);
    *msg = (omv_msg_t){.type = OMV_MSG_SERVER};
    omv_server_msg_t *u = &msg->u.server;
    u->op = op;
    u->server_id = omv_servers_id(co->servers, s);
    u->first_shard = s->first;
    u->last_shard = s->last;
    u->train_count = r->plan.train_count;
    u->n_groups = omv_groups_count(r->groups);
    for (uint32_t g = 0; g < u->n_groups && g < OMV_WIRE_MAX_CLOCKS; g++)
        u->clocks[g] = omv_groups_clock(r->groups, g);
    u->images = r->stats.images_total;
    u->steps = r->stats.steps_total;
    u->adam_steps = r->shards->gather_steps[0];
    u->gather_id = r->id;
    u->backup = s->backup;
    return u;
}

int omv_range_assign(omv_run_t *r, omv_server_t *s)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t crc;
    int e = omv_range_crc(r, s->first, s->last, &crc);
    if (e < 0)
        return e;
    omv_msg_t msg;
    omv_server_msg_t *u = range_msg(r, s, &msg, OMV_SERVER_ASSIGN);
    u->job_bytes = (uint32_t)sizeof(omv_job_t);
    u->count = (uint32_t)job_words();
    u->make_range = 1;
    u->range_crc = s->range_crc = crc;
    /* The model here is the checkpoint the run resumed, or made as the job starts. */
    if (r->ckpt.resumed_seq != 0 && strlen(r->ckpt.dir) < sizeof(u->part_dir)) {
        omv_strlcpy(u->part_dir, r->ckpt.dir, sizeof(u->part_dir));
        u->part_seq = r->ckpt.resumed_seq;
    }
    float *buf = calloc(job_words(), sizeof(float));
    if (buf == NULL)
        return -ENOMEM;
    memcpy(buf, &r->job, sizeof(omv_job_t));
    e = omv_servers_send(co->servers, r->env.router, s, &msg, buf);
    free(buf);
    return e;
}

int omv_range_send(omv_run_t *r, omv_server_t *s, const omv_server_msg_t *u, char *why, size_t cap)
{
    omv_coord_t *co = omv_coord(r);
    uint32_t id = omv_servers_id(co->servers, s), crc;
    if (s->run_id != r->id || u->gather_id != r->id)
        return 0; /* for a run made again since */
    if (omv_range_crc(r, s->first, s->last, &crc) < 0 || crc != s->range_crc) {
        snprintf(why, cap,
                 "shard server %u asks for shards [%u, %u), which have moved on here since "
                 "they were assigned",
                 id, s->first, s->last);
        return -ESTALE;
    }
    uint32_t off = r->shards->offsets[s->first], count = r->shards->offsets[s->last] - off;
    size_t words = (size_t)omv_range_arrays(r) * count;
    float *buf = malloc(words * sizeof(float));
    if (buf == NULL) {
        snprintf(why, cap, "out of memory for shard server %u's range", id);
        return -ENOMEM;
    }
    omv_range_pack(r, buf, off, count);
    omv_msg_t msg;
    omv_server_msg_t *m = range_msg(r, s, &msg, OMV_SERVER_RANGE);
    m->count = (uint32_t)words;
    if (omv_servers_send(co->servers, r->env.router, s, &msg, buf) == 0) {
        s->range_bytes += words * sizeof(float);
        omv_log_info("shard server %u could not make shards [%u, %u) itself: sent them (%zu "
                     "bytes)",
                     id, s->first, s->last, words * sizeof(float));
    }
    free(buf);
    return 0;
}

static int range_load(omv_run_t *r, const float *params, const float *velocity, const float *second,
                      uint64_t adam_steps, size_t count)
{
    uint32_t off = r->shards->offsets[r->lo];
    if (count != r->shards->offsets[r->hi] - off || (second != NULL) != r->shards->adam)
        return -EINVAL;
    /* The whole-model arrays the restore reads: only this server's range is used. */
    int e = omv_shardset_gather(r->shards, 1);
    if (e < 0)
        return e;
    memcpy(r->shards->gather_params + off, params, count * sizeof(float));
    memcpy(r->shards->gather_velocity + off, velocity, count * sizeof(float));
    if (second)
        memcpy(r->shards->gather_second + off, second, count * sizeof(float));
    uint64_t steps[OMV_WIRE_MAX_SHARDS];
    for (uint32_t i = 0; i < r->shards->n_shards; i++)
        steps[i] = adam_steps;
    return omv_shardset_restore(r->shards, r->shards->gather_params, r->shards->gather_velocity,
                                second ? r->shards->gather_second : NULL, second ? steps : NULL);
}

/* Checkpoint a->part_seq in a->part_dir into the shards, as the coordinator resumed it. */
static int make_from_checkpoint(omv_run_t *r, const omv_server_msg_t *a)
{
    char why[1024], name[64], path[OMV_WIRE_PATH_MAX + 64];
    int e = omv_run_ckpt_confined(a->part_dir, r->env.state_dir, r->env.checkpoint_root, why,
                                  sizeof(why));
    if (e < 0) {
        omv_log_warn("shards [%u, %u): cannot read checkpoint %" PRIu64 ": %s", r->lo, r->hi,
                     a->part_seq, why);
        return e;
    }
    omv_checkpoint_name(a->part_seq, name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", a->part_dir, name);
    omv_checkpoint_t c;
    char err[OMV_CHECKPOINT_ERR_MAX];
    uint64_t lo = r->shards->offsets[r->lo], hi = r->shards->offsets[r->hi];
    e = omv_checkpoint_read_range(&c, path, lo, hi, err); /* only the parts of this range */
    if (e < 0) {
        omv_log_warn("shards [%u, %u): %s", r->lo, r->hi, err);
        return e;
    }
    if (c.param_count != r->layout.param_count) {
        omv_log_warn("shards [%u, %u): %s holds %" PRIu64 " parameters, the job %zu", r->lo, r->hi,
                     path, c.param_count, r->layout.param_count);
        e = -EINVAL;
    } else {
        omv_strlcpy(r->ckpt.resumed_from, path, sizeof(r->ckpt.resumed_from));
        e = omv_run_restore_state(r, &c);
    }
    omv_checkpoint_fini(&c);
    return e;
}

int omv_range_make(omv_run_t *r, const omv_server_msg_t *a, const char *init)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    int e = 0;
    if (a->part_dir[0])
        e = make_from_checkpoint(r, a);
    else if (init[0])
        e = omv_run_load_init(r, init);
    const char *from = a->part_dir[0] ? "the checkpoint" : init[0] ? "[model] init" : "the seed";
    uint32_t crc = 0;
    if (e == 0)
        e = omv_range_crc(r, r->lo, r->hi, &crc);
    if (e == 0 && crc != a->range_crc) {
        omv_log_warn("shards [%u, %u) made from %s are not the coordinator's (CRC-32 %08x, "
                     "not %08x)",
                     r->lo, r->hi, from, crc, a->range_crc);
        e = -EINVAL;
    }
    if (e < 0) {
        omv_log_warn("shards [%u, %u): asking the coordinator for them; the job waits", r->lo,
                     r->hi);
        ss->range_owed = 1;
        return e;
    }
    omv_log_info("shards [%u, %u) made from %s here (CRC-32 %08x, as the coordinator's)", r->lo,
                 r->hi, from, crc);
    return 0;
}

int omv_range_take(omv_run_t *r, const omv_server_msg_t *u, const void *payload, size_t bytes)
{
    omv_shard_server_t *ss = omv_shard_server(r);
    uint32_t off = r->shards->offsets[r->lo];
    size_t count = r->shards->offsets[r->hi] - off;
    if (!ss->range_owed || u->gather_id != r->id || u->first_shard != r->lo ||
        u->last_shard != r->hi || bytes != count * omv_range_arrays(r) * sizeof(float)) {
        omv_log_error("the coordinator's range of %zu bytes for shards [%u, %u) is not the one "
                      "asked for (shards [%u, %u), %zu bytes%s): ignored",
                      bytes, u->first_shard, u->last_shard, r->lo, r->hi,
                      count * omv_range_arrays(r) * sizeof(float),
                      ss->range_owed ? "" : ", none owed");
        return -EINVAL;
    }
    const float *v = payload;
    int e =
        range_load(r, v, v + count, r->shards->adam ? v + 2 * count : NULL, u->adam_steps, count);
    if (e < 0) {
        omv_log_error("cannot take the coordinator's shards [%u, %u): %s", r->lo, r->hi,
                      omv_strerror(e));
        return e;
    }
    ss->range_owed = 0;
    omv_log_info("shards [%u, %u) came from the coordinator", r->lo, r->hi);
    return 0;
}
