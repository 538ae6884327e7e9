/* protobuf-c <-> our message structs. Decoding runs in a per-thread arena so that the hot path
 * (pull, params, push) allocates nothing on the heap and nothing leaks on a malformed message. */
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "omnivore.pb-c.h"
#include "util.h"

/* Big enough for the largest valid envelope unpacked (a Welcome with four long paths). */
#define ARENA_SIZE (256 * 1024)

typedef struct {
    size_t used;
    _Alignas(16) unsigned char mem[ARENA_SIZE];
} arena_t;

static _Thread_local arena_t arena;

static void *arena_alloc(void *data, size_t size)
{
    arena_t *a = data;
    size = (size + 15) & ~(size_t)15;
    if (size > ARENA_SIZE - a->used)
        return NULL;
    void *p = a->mem + a->used;
    a->used += size;
    return p;
}

static void arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* released all at once when the next decode starts */
}

static const char *const refuse_names[] = {
    "none", "malformed", "version", "unknown_worker", "shape", "not_finite",
    "step", "full",      "role",    "norm",           "auth",
};

static const char *const server_op_names[] = {
    "assign", "member", "start", "gather", "end",       "gathered",   "stats",
    "freeze", "frozen", "cut",   "resume", "drop_part", "need_range", "range"};

const char *omv_server_op_name(omv_server_op_t op)
{
    if ((unsigned)op < OMV_ARRAY_SIZE(server_op_names))
        return server_op_names[op];
    return "unknown";
}

const char *omv_refuse_name(omv_refuse_t code)
{
    if ((unsigned)code < OMV_ARRAY_SIZE(refuse_names))
        return refuse_names[code];
    return "unknown";
}

static const char *const msg_names[] = {
    "none",        "hello", "welcome", "pull",  "params", "push",   "heartbeat", "eval_request",
    "eval_result", "error", "stop",    "leave", "attach", "report", "server",
};

const char *omv_msg_name(omv_msg_type_t type)
{
    if ((unsigned)type < OMV_ARRAY_SIZE(msg_names))
        return msg_names[type];
    return "unknown";
}

uint32_t omv_wire_payload_count(const omv_msg_t *msg)
{
    switch (msg->type) {
    case OMV_MSG_PARAMS:
        return msg->u.params.wire == OMV_WIRE_SHM ? 0 : msg->u.params.count;
    case OMV_MSG_PUSH:
        return msg->u.push.wire == OMV_WIRE_SHM ? 0 : msg->u.push.count;
    case OMV_MSG_EVAL_REQUEST:
        return msg->u.eval_request.count;
    case OMV_MSG_SERVER:
        return msg->u.server.count;
    default:
        return 0;
    }
}

size_t omv_wire_payload_bytes(const omv_msg_t *msg)
{
    uint32_t wire = msg->type == OMV_MSG_PARAMS ? msg->u.params.wire
                    : msg->type == OMV_MSG_PUSH ? msg->u.push.wire
                                                : OMV_WIRE_FP32;
    return omv_wire_value_bytes(wire, omv_wire_payload_count(msg));
}

/* The protobuf-c messages one envelope points to while it is packed: its body, and beside a
 * welcome its job. They live on the encoder's stack, so packing allocates nothing. */
typedef struct {
    union {
        Omnivore__Hello hello;
        Omnivore__Welcome welcome;
        Omnivore__Pull pull;
        Omnivore__Params params;
        Omnivore__Push push;
        Omnivore__Heartbeat heartbeat;
        Omnivore__EvalRequest eval_request;
        Omnivore__EvalResult eval_result;
        Omnivore__Error error;
        Omnivore__Stop stop;
        Omnivore__Leave leave;
        Omnivore__Attach attach;
        Omnivore__Report report;
        Omnivore__Server server;
    } u;
    Omnivore__JobSpec job;
    Omnivore__ServerInfo infos[2 * OMV_WIRE_MAX_SERVERS];
    Omnivore__ServerInfo *info_ptrs[2 * OMV_WIRE_MAX_SERVERS];
} bodies_t;

static Omnivore__Hello *encode_hello(const omv_hello_t *h, Omnivore__Hello *out)
{
    *out = (Omnivore__Hello)OMNIVORE__HELLO__INIT;
    out->protocol_version = h->protocol_version;
    out->role = (Omnivore__Role)h->role;
    out->hostname = (char *)h->hostname;
    out->pid = h->pid;
    out->threads = h->threads;
    out->previous_worker_id = h->previous_worker_id;
    out->name = (char *)h->name;
    out->endpoint = (char *)h->endpoint;
    out->public_key = (char *)h->public_key;
    return out;
}

/* The job points into j: j must outlive the packing. */
static void encode_jobspec(const omv_jobspec_t *j, Omnivore__JobSpec *out)
{
    *out = (Omnivore__JobSpec)OMNIVORE__JOB_SPEC__INIT;
    out->name = (char *)j->name;
    out->n_layers = j->n_layers;
    out->layers = (uint32_t *)j->layers;
    out->model = (char *)j->model;
    out->data_format = (char *)j->data_format;
    out->scale = j->scale;
    out->n_mean = j->n_mean;
    out->mean = (float *)j->mean;
    out->n_std = j->n_std;
    out->std = (float *)j->std;
    out->augment_pad = j->augment_pad;
    out->augment_flip = j->augment_flip != 0;
    out->train_images = (char *)j->train_images;
    out->train_labels = (char *)j->train_labels;
    out->test_images = (char *)j->test_images;
    out->test_labels = (char *)j->test_labels;
    out->batch_size = j->batch_size;
    out->seed = j->seed;
    out->slice_begin = j->slice_begin;
    out->slice_count = j->slice_count;
    out->steps_per_epoch = j->steps_per_epoch;
    out->total_steps = j->total_steps;
    out->param_count = j->param_count;
    out->n_shard_offsets = j->n_shards + 1;
    out->shard_offsets = (uint32_t *)j->shard_offsets;
    out->eval_batch_size = j->eval_batch_size;
    out->wire = j->wire;
}

/* An idle worker's welcome carries no job. */
static size_t encode_infos(const omv_server_info_t *in, uint32_t n, Omnivore__ServerInfo *infos,
                           Omnivore__ServerInfo **ptrs)
{
    n = n < OMV_WIRE_MAX_SERVERS ? n : OMV_WIRE_MAX_SERVERS;
    for (uint32_t i = 0; i < n; i++) {
        Omnivore__ServerInfo *s = &infos[i];
        *s = (Omnivore__ServerInfo)OMNIVORE__SERVER_INFO__INIT;
        s->endpoint = (char *)in[i].endpoint;
        s->public_key = (char *)in[i].public_key;
        s->first_shard = in[i].first_shard;
        s->last_shard = in[i].last_shard;
        ptrs[i] = s;
    }
    return n;
}

static void encode_servers(const omv_welcome_t *w, Omnivore__Welcome *out, bodies_t *b)
{
    out->n_servers = encode_infos(w->servers, w->n_servers, b->infos, b->info_ptrs);
    out->servers = out->n_servers ? b->info_ptrs : NULL;
    out->n_backups = encode_infos(w->backups, w->n_backups, b->infos + OMV_WIRE_MAX_SERVERS,
                                  b->info_ptrs + OMV_WIRE_MAX_SERVERS);
    out->backups = out->n_backups ? b->info_ptrs + OMV_WIRE_MAX_SERVERS : NULL;
    out->attach_token = w->attach_token;
}

static Omnivore__Welcome *encode_welcome(const omv_welcome_t *w, Omnivore__Welcome *out,
                                         Omnivore__JobSpec *job)
{
    *out = (Omnivore__Welcome)OMNIVORE__WELCOME__INIT;
    out->protocol_version = w->protocol_version;
    out->worker_id = w->worker_id;
    out->group = w->group;
    out->start_step = w->start_step;
    out->idle = w->idle != 0;
    out->shm_socket = (char *)w->shm_socket;
    out->shm_token = w->shm_token;
    if (!w->idle) {
        encode_jobspec(&w->job, job);
        out->job = job;
    }
    return out;
}

static Omnivore__Params *encode_params(const omv_params_t *p, Omnivore__Params *out)
{
    *out = (Omnivore__Params)OMNIVORE__PARAMS__INIT;
    out->step = p->step;
    out->shard = p->shard;
    out->offset = p->offset;
    out->count = p->count;
    out->group = p->group;
    out->slice_begin = p->slice_begin;
    out->slice_count = p->slice_count;
    out->batch = p->batch;
    out->wire = p->wire;
    out->shared = p->shared;
    out->view = p->view;
    out->view_seq = p->view_seq;
    return out;
}

static Omnivore__Push *encode_push(const omv_push_t *p, Omnivore__Push *out)
{
    *out = (Omnivore__Push)OMNIVORE__PUSH__INIT;
    out->worker_id = p->worker_id;
    out->step = p->step;
    out->shard = p->shard;
    out->offset = p->offset;
    out->count = p->count;
    out->loss = p->loss;
    out->samples = p->samples;
    out->compute_ms = p->compute_ms;
    out->wire = p->wire;
    return out;
}

static Omnivore__EvalResult *encode_eval_result(const omv_eval_result_t *e,
                                                Omnivore__EvalResult *out)
{
    *out = (Omnivore__EvalResult)OMNIVORE__EVAL_RESULT__INIT;
    out->worker_id = e->worker_id;
    out->eval_id = e->eval_id;
    out->correct = e->correct;
    out->total = e->total;
    out->loss = e->loss;
    return out;
}

static Omnivore__Report *encode_report(const omv_step_report_t *p, Omnivore__Report *out)
{
    *out = (Omnivore__Report)OMNIVORE__REPORT__INIT;
    out->worker_id = p->worker_id;
    out->step = p->step;
    out->loss = p->loss;
    out->samples = p->samples;
    out->compute_ms = p->compute_ms;
    return out;
}

static Omnivore__Server *encode_server(const omv_server_msg_t *m, Omnivore__Server *out)
{
    *out = (Omnivore__Server)OMNIVORE__SERVER__INIT;
    out->op = (Omnivore__ServerOp)m->op;
    out->server_id = m->server_id;
    out->first_shard = m->first_shard;
    out->last_shard = m->last_shard;
    out->train_count = m->train_count;
    out->n_groups = m->n_groups;
    out->n_clocks = m->n_groups < OMV_WIRE_MAX_CLOCKS ? m->n_groups : OMV_WIRE_MAX_CLOCKS;
    out->clocks = (uint64_t *)m->clocks;
    out->job_bytes = m->job_bytes;
    out->worker_id = m->worker_id;
    out->slot = m->slot;
    out->group = m->group;
    out->state = m->state;
    out->host = (char *)m->host;
    out->key = (char *)m->key;
    out->token = m->token;
    out->gather_id = m->gather_id;
    out->final = m->final != 0;
    out->params_only = m->params_only != 0;
    out->count = m->count;
    out->images = m->images;
    out->steps = m->steps;
    out->pushes = m->pushes;
    out->pulls = m->pulls;
    out->bytes_in = m->bytes_in;
    out->bytes_out = m->bytes_out;
    out->adam_steps = m->adam_steps;
    out->reconfig = m->reconfig;
    out->learning_rate = m->learning_rate;
    out->momentum = m->momentum;
    out->weight_decay = m->weight_decay;
    out->no_ranges = m->no_ranges != 0;
    out->backup = m->backup != 0;
    out->failover = m->failover != 0;
    out->part_dir = (char *)m->part_dir;
    out->part_seq = m->part_seq;
    out->part = m->part != 0;
    out->part_crc = m->part_crc;
    out->part_bytes = m->part_bytes;
    out->make_range = m->make_range != 0;
    out->range_crc = m->range_crc;
    return out;
}

/* Points env at msg's body, converted into b (which borrows msg's strings and arrays). Returns
 * 0, or -EINVAL for a type that has no body. */
static int encode_body(const omv_msg_t *msg, Omnivore__Envelope *env, bodies_t *b)
{
    switch (msg->type) {
    case OMV_MSG_HELLO:
        env->hello = encode_hello(&msg->u.hello, &b->u.hello);
        return 0;
    case OMV_MSG_WELCOME:
        env->welcome = encode_welcome(&msg->u.welcome, &b->u.welcome, &b->job);
        encode_servers(&msg->u.welcome, env->welcome, b);
        return 0;
    case OMV_MSG_ATTACH:
        b->u.attach = (Omnivore__Attach)OMNIVORE__ATTACH__INIT;
        b->u.attach.worker_id = msg->u.attach.worker_id;
        b->u.attach.token = msg->u.attach.token;
        env->attach = &b->u.attach;
        return 0;
    case OMV_MSG_REPORT:
        env->report = encode_report(&msg->u.report, &b->u.report);
        return 0;
    case OMV_MSG_SERVER:
        env->server = encode_server(&msg->u.server, &b->u.server);
        return 0;
    case OMV_MSG_PULL:
        b->u.pull = (Omnivore__Pull)OMNIVORE__PULL__INIT;
        b->u.pull.worker_id = msg->u.pull.worker_id;
        b->u.pull.step = msg->u.pull.step;
        b->u.pull.view = msg->u.pull.view;
        env->pull = &b->u.pull;
        return 0;
    case OMV_MSG_PARAMS:
        env->params = encode_params(&msg->u.params, &b->u.params);
        return 0;
    case OMV_MSG_PUSH:
        env->push = encode_push(&msg->u.push, &b->u.push);
        return 0;
    case OMV_MSG_HEARTBEAT:
        b->u.heartbeat = (Omnivore__Heartbeat)OMNIVORE__HEARTBEAT__INIT;
        b->u.heartbeat.worker_id = msg->u.heartbeat.worker_id;
        env->heartbeat = &b->u.heartbeat;
        return 0;
    case OMV_MSG_EVAL_REQUEST:
        b->u.eval_request = (Omnivore__EvalRequest)OMNIVORE__EVAL_REQUEST__INIT;
        b->u.eval_request.eval_id = msg->u.eval_request.eval_id;
        b->u.eval_request.count = msg->u.eval_request.count;
        env->eval_request = &b->u.eval_request;
        return 0;
    case OMV_MSG_EVAL_RESULT:
        env->eval_result = encode_eval_result(&msg->u.eval_result, &b->u.eval_result);
        return 0;
    case OMV_MSG_ERROR:
        b->u.error = (Omnivore__Error)OMNIVORE__ERROR__INIT;
        b->u.error.code = (Omnivore__ErrorCode)msg->u.error.code;
        b->u.error.reason = (char *)msg->u.error.reason;
        env->error = &b->u.error;
        return 0;
    case OMV_MSG_STOP:
        b->u.stop = (Omnivore__Stop)OMNIVORE__STOP__INIT;
        b->u.stop.reason = (char *)msg->u.stop.reason;
        b->u.stop.reconnect = msg->u.stop.reconnect != 0;
        env->stop = &b->u.stop;
        return 0;
    case OMV_MSG_LEAVE:
        b->u.leave = (Omnivore__Leave)OMNIVORE__LEAVE__INIT;
        b->u.leave.worker_id = msg->u.leave.worker_id;
        b->u.leave.reason = (char *)msg->u.leave.reason;
        env->leave = &b->u.leave;
        return 0;
    default:
        return -EINVAL;
    }
}

int omv_wire_encode(const omv_msg_t *msg, uint8_t *buf, size_t cap, size_t *ret_len)
{
    Omnivore__Envelope env = OMNIVORE__ENVELOPE__INIT;
    bodies_t bodies;
    int r = encode_body(msg, &env, &bodies);
    if (r < 0)
        return r;
    /* Our type numbers are the envelope's oneof field numbers. */
    env.body_case = (Omnivore__Envelope__BodyCase)msg->type;
    size_t need = omnivore__envelope__get_packed_size(&env);
    if (need > cap)
        return -EMSGSIZE;
    *ret_len = omnivore__envelope__pack(&env, buf);
    return 0;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (why)                                                                                   \
            snprintf(why, OMV_WIRE_REASON_MAX, __VA_ARGS__);                                       \
        return -EPROTO;                                                                            \
    } while (0)

static int copy_str(char *dst, size_t cap, const char *src, const char *what, char *why)
{
    if (omv_strlcpy(dst, src ? src : "", cap) < 0)
        FAIL("%s longer than %zu bytes", what, cap - 1);
    return 0;
}

/* A string a person reads (a hostname, a name, a reason): stored with its control characters
 * escaped, so that a newline from a peer cannot forge lines in logs and key:value replies; an
 * escaped string longer than dst is cut. */
static int copy_text(char *dst, size_t cap, const char *src, const char *what, char *why)
{
    if (src != NULL && strlen(src) >= cap)
        FAIL("%s longer than %zu bytes", what, cap - 1);
    omv_str_escape(dst, src ? src : "", cap);
    return 0;
}

/* protobuf-c leaves an empty repeated field NULL, and memcpy from NULL is undefined even for
 * no bytes (found by fuzzing: every Welcome without `std`). */
static void copy_floats(float *dst, const float *src, size_t n)
{
    if (n > 0)
        memcpy(dst, src, n * sizeof(float));
}

static void copy_u32(uint32_t *dst, const uint32_t *src, size_t n)
{
    if (n > 0)
        memcpy(dst, src, n * sizeof(uint32_t));
}

static int decode_jobspec(const Omnivore__JobSpec *j, omv_jobspec_t *out, char *why)
{
    if (j == NULL)
        FAIL("welcome without a job");
    if (j->n_layers < 2 || j->n_layers > OMV_JOB_MAX_LAYERS)
        FAIL("job has %zu layers, expected 2 to %d", j->n_layers, OMV_JOB_MAX_LAYERS);
    if (j->n_shard_offsets < 2 || j->n_shard_offsets > OMV_WIRE_MAX_SHARDS + 1)
        FAIL("job has %zu shard offsets, expected 2 to %d", j->n_shard_offsets,
             OMV_WIRE_MAX_SHARDS + 1);
    if (copy_str(out->name, sizeof(out->name), j->name, "job name", why) < 0 ||
        copy_str(out->train_images, OMV_JOB_PATH_MAX, j->train_images, "path", why) < 0 ||
        copy_str(out->train_labels, OMV_JOB_PATH_MAX, j->train_labels, "path", why) < 0 ||
        copy_str(out->test_images, OMV_JOB_PATH_MAX, j->test_images, "path", why) < 0 ||
        copy_str(out->test_labels, OMV_JOB_PATH_MAX, j->test_labels, "path", why) < 0 ||
        copy_str(out->model, sizeof(out->model), j->model, "model definition", why) < 0 ||
        copy_str(out->data_format, sizeof(out->data_format), j->data_format, "data format", why) <
            0)
        return -EPROTO;
    out->n_layers = (uint32_t)j->n_layers;
    copy_u32(out->layers, j->layers, j->n_layers);
    if (j->n_mean > 16 || j->n_std > 16)
        FAIL("job has %zu means and %zu stds, at most 16 each", j->n_mean, j->n_std);
    out->scale = j->scale;
    out->n_mean = (uint32_t)j->n_mean;
    copy_floats(out->mean, j->mean, j->n_mean);
    out->n_std = (uint32_t)j->n_std;
    copy_floats(out->std, j->std, j->n_std);
    if (j->augment_pad > OMV_WIRE_MAX_AUGMENT_PAD)
        FAIL("augment_pad %u is over %d", j->augment_pad, OMV_WIRE_MAX_AUGMENT_PAD);
    out->augment_pad = j->augment_pad;
    out->augment_flip = j->augment_flip;
    out->n_shards = (uint32_t)j->n_shard_offsets - 1;
    copy_u32(out->shard_offsets, j->shard_offsets, j->n_shard_offsets);
    for (uint32_t i = 0; i < out->n_shards; i++)
        if (out->shard_offsets[i] > out->shard_offsets[i + 1])
            FAIL("shard offsets are not ascending");
    if (out->shard_offsets[0] != 0 || out->shard_offsets[out->n_shards] != j->param_count)
        FAIL("shard offsets do not cover the %u parameters", j->param_count);
    out->batch_size = j->batch_size;
    out->seed = j->seed;
    out->slice_begin = j->slice_begin;
    out->slice_count = j->slice_count;
    out->steps_per_epoch = j->steps_per_epoch;
    out->total_steps = j->total_steps;
    out->param_count = j->param_count;
    out->eval_batch_size = j->eval_batch_size;
    if (j->wire > OMV_WIRE_INT8 || j->wire == OMV_WIRE_SHM)
        FAIL("job's wire %u is not fp32 (0), bf16 (1) or int8 (3)", j->wire);
    out->wire = j->wire;
    return 0;
}

static int decode_info(const Omnivore__ServerInfo *s, omv_server_info_t *o, char *why)
{
    if (copy_str(o->endpoint, sizeof(o->endpoint), s->endpoint, "endpoint", why) < 0 ||
        copy_str(o->public_key, sizeof(o->public_key), s->public_key, "public key", why) < 0)
        return -EPROTO;
    o->first_shard = s->first_shard;
    o->last_shard = s->last_shard;
    return 0;
}

/* The servers must hold every shard, in order, each once (checked against the job after);
 * each backup's range is one server's. */
static int decode_servers(const Omnivore__Welcome *w, omv_welcome_t *out, char *why)
{
    if (w->n_servers > OMV_WIRE_MAX_SERVERS || w->n_backups > OMV_WIRE_MAX_SERVERS)
        FAIL("welcome names %zu shard servers and %zu backups, at most %d each", w->n_servers,
             w->n_backups, OMV_WIRE_MAX_SERVERS);
    out->n_servers = (uint32_t)w->n_servers;
    out->attach_token = w->attach_token;
    for (uint32_t i = 0; i < out->n_servers; i++) {
        omv_server_info_t *o = &out->servers[i];
        if (decode_info(w->servers[i], o, why) < 0)
            return -EPROTO;
        uint32_t expect = i == 0 ? 0 : out->servers[i - 1].last_shard;
        if (o->first_shard != expect || o->last_shard <= o->first_shard ||
            o->last_shard > OMV_WIRE_MAX_SHARDS)
            FAIL("shard server %u holds shards [%u, %u): not the next ones after %u", i,
                 o->first_shard, o->last_shard, expect);
    }
    out->n_backups = (uint32_t)w->n_backups;
    for (uint32_t i = 0; i < out->n_backups; i++) {
        omv_server_info_t *o = &out->backups[i];
        if (decode_info(w->backups[i], o, why) < 0)
            return -EPROTO;
        int found = 0;
        for (uint32_t k = 0; k < out->n_servers; k++)
            found |= out->servers[k].first_shard == o->first_shard &&
                     out->servers[k].last_shard == o->last_shard;
        if (!found)
            FAIL("backup %u holds shards [%u, %u): no shard server's range", i, o->first_shard,
                 o->last_shard);
    }
    return 0;
}

static int decode_server(const Omnivore__Server *s, omv_server_msg_t *m, char *why)
{
    if ((unsigned)s->op >= OMV_SERVER_OP_COUNT_)
        FAIL("unknown server op %d", (int)s->op);
    if (s->n_clocks > OMV_WIRE_MAX_CLOCKS || s->n_clocks != s->n_groups)
        FAIL("server message has %zu clocks for %u groups (at most %d)", s->n_clocks, s->n_groups,
             OMV_WIRE_MAX_CLOCKS);
    if (s->last_shard < s->first_shard || s->last_shard > OMV_WIRE_MAX_SHARDS)
        FAIL("server message names shards [%u, %u)", s->first_shard, s->last_shard);
    m->op = (omv_server_op_t)s->op;
    m->server_id = s->server_id;
    m->first_shard = s->first_shard;
    m->last_shard = s->last_shard;
    m->train_count = s->train_count;
    m->n_groups = s->n_groups;
    if (s->n_clocks > 0)
        memcpy(m->clocks, s->clocks, s->n_clocks * sizeof(uint64_t));
    m->job_bytes = s->job_bytes;
    m->worker_id = s->worker_id;
    m->slot = s->slot;
    m->group = s->group;
    m->state = s->state;
    m->token = s->token;
    m->gather_id = s->gather_id;
    m->final = s->final;
    m->params_only = s->params_only;
    m->count = s->count;
    m->images = s->images;
    m->steps = s->steps;
    m->pushes = s->pushes;
    m->pulls = s->pulls;
    m->bytes_in = s->bytes_in;
    m->bytes_out = s->bytes_out;
    m->adam_steps = s->adam_steps;
    m->reconfig = s->reconfig;
    m->learning_rate = s->learning_rate;
    m->momentum = s->momentum;
    m->weight_decay = s->weight_decay;
    m->no_ranges = s->no_ranges;
    m->backup = s->backup;
    m->failover = s->failover;
    m->part_seq = s->part_seq;
    m->part = s->part;
    m->part_crc = s->part_crc;
    m->part_bytes = s->part_bytes;
    m->make_range = s->make_range;
    m->range_crc = s->range_crc;
    if (s->part_dir && s->part_dir[0] != '\0' && s->part_dir[0] != '/') {
        char shown[80];
        omv_str_escape(shown, s->part_dir, sizeof(shown));
        FAIL("server message names part folder '%s', not an absolute path", shown);
    }
    if (copy_text(m->host, sizeof(m->host), s->host, "host", why) < 0 ||
        copy_str(m->part_dir, sizeof(m->part_dir), s->part_dir, "part folder", why) < 0)
        return -EPROTO;
    return copy_str(m->key, sizeof(m->key), s->key, "key", why);
}

static int decode_params(const Omnivore__Params *p, omv_params_t *out, char *why)
{
    if (p->wire > OMV_WIRE_INT8)
        FAIL("parameters' wire %u is not fp32 (0), bf16 (1), shm (2) or int8 (3)", p->wire);
    if (p->shared > 1 || (p->shared && p->wire != OMV_WIRE_SHM))
        FAIL("parameters' shared is %u with wire %u: only shm (2) parameters are shared", p->shared,
             p->wire);
    if (p->wire == OMV_WIRE_INT8 ? p->view == 0 || p->view_seq == 0
                                 : p->view_seq != 0 || (p->view && p->wire != OMV_WIRE_FP32))
        FAIL("parameters' view %llu, change %u with wire %u: int8 parameters are a change "
             "(> 0) to a view (not 0), which fp32 ones start (change 0)",
             (unsigned long long)p->view, p->view_seq, p->wire);
    *out = (omv_params_t){p->step,        p->shard, p->offset, p->count,  p->group, p->slice_begin,
                          p->slice_count, p->batch, p->wire,   p->shared, p->view,  p->view_seq};
    return 0;
}

static int decode_body(const Omnivore__Envelope *env, omv_msg_t *m, char *why)
{
    switch (env->body_case) {
    case OMNIVORE__ENVELOPE__BODY_HELLO: {
        const Omnivore__Hello *h = env->hello;
        m->u.hello.protocol_version = h->protocol_version;
        if ((unsigned)h->role > OMV_ROLE_SHARD)
            FAIL("unknown role %d", (int)h->role);
        m->u.hello.role = (omv_role_t)h->role;
        m->u.hello.pid = h->pid;
        m->u.hello.threads = h->threads;
        m->u.hello.previous_worker_id = h->previous_worker_id;
        if (copy_text(m->u.hello.name, sizeof(m->u.hello.name), h->name, "name", why) < 0 ||
            copy_str(m->u.hello.endpoint, sizeof(m->u.hello.endpoint), h->endpoint, "endpoint",
                     why) < 0 ||
            copy_str(m->u.hello.public_key, sizeof(m->u.hello.public_key), h->public_key,
                     "public key", why) < 0)
            return -EPROTO;
        return copy_text(m->u.hello.hostname, sizeof(m->u.hello.hostname), h->hostname, "hostname",
                         why);
    }
    case OMNIVORE__ENVELOPE__BODY_WELCOME:
        m->u.welcome.protocol_version = env->welcome->protocol_version;
        m->u.welcome.worker_id = env->welcome->worker_id;
        m->u.welcome.group = env->welcome->group;
        m->u.welcome.start_step = env->welcome->start_step;
        m->u.welcome.idle = env->welcome->idle;
        m->u.welcome.shm_token = env->welcome->shm_token;
        if (copy_str(m->u.welcome.shm_socket, sizeof(m->u.welcome.shm_socket),
                     env->welcome->shm_socket, "shm_socket", why) < 0)
            return -EPROTO;
        if (m->u.welcome.idle)
            return 0;
        if (decode_servers(env->welcome, &m->u.welcome, why) < 0)
            return -EPROTO;
        return decode_jobspec(env->welcome->job, &m->u.welcome.job, why);
    case OMNIVORE__ENVELOPE__BODY_ATTACH:
        m->u.attach.worker_id = env->attach->worker_id;
        m->u.attach.token = env->attach->token;
        return 0;
    case OMNIVORE__ENVELOPE__BODY_REPORT: {
        const Omnivore__Report *p = env->report;
        m->u.report =
            (omv_step_report_t){p->worker_id, p->step, p->loss, p->samples, p->compute_ms};
        return 0;
    }
    case OMNIVORE__ENVELOPE__BODY_SERVER:
        return decode_server(env->server, &m->u.server, why);
    case OMNIVORE__ENVELOPE__BODY_PULL:
        m->u.pull.worker_id = env->pull->worker_id;
        m->u.pull.step = env->pull->step;
        m->u.pull.view = env->pull->view;
        return 0;
    case OMNIVORE__ENVELOPE__BODY_PARAMS:
        return decode_params(env->params, &m->u.params, why);
    case OMNIVORE__ENVELOPE__BODY_PUSH: {
        const Omnivore__Push *p = env->push;
        if (p->wire > OMV_WIRE_INT8)
            FAIL("gradient's wire %u is not fp32 (0), bf16 (1), shm (2) or int8 (3)", p->wire);
        m->u.push = (omv_push_t){p->worker_id, p->step,    p->shard,      p->offset, p->count,
                                 p->loss,      p->samples, p->compute_ms, p->wire};
        return 0;
    }
    case OMNIVORE__ENVELOPE__BODY_HEARTBEAT:
        m->u.heartbeat.worker_id = env->heartbeat->worker_id;
        return 0;
    case OMNIVORE__ENVELOPE__BODY_EVAL_REQUEST:
        m->u.eval_request.eval_id = env->eval_request->eval_id;
        m->u.eval_request.count = env->eval_request->count;
        return 0;
    case OMNIVORE__ENVELOPE__BODY_EVAL_RESULT: {
        const Omnivore__EvalResult *e = env->eval_result;
        m->u.eval_result =
            (omv_eval_result_t){e->worker_id, e->eval_id, e->correct, e->total, e->loss};
        return 0;
    }
    case OMNIVORE__ENVELOPE__BODY_ERROR:
        m->u.error.code = (unsigned)env->error->code < OMV_REFUSE_COUNT_
                              ? (omv_refuse_t)env->error->code
                              : OMV_REFUSE_MALFORMED;
        return copy_text(m->u.error.reason, OMV_WIRE_REASON_MAX, env->error->reason, "reason", why);
    case OMNIVORE__ENVELOPE__BODY_STOP:
        m->u.stop.reconnect = env->stop->reconnect;
        return copy_text(m->u.stop.reason, OMV_WIRE_REASON_MAX, env->stop->reason, "reason", why);
    case OMNIVORE__ENVELOPE__BODY_LEAVE:
        m->u.leave.worker_id = env->leave->worker_id;
        return copy_text(m->u.leave.reason, OMV_WIRE_REASON_MAX, env->leave->reason, "reason", why);
    default:
        FAIL("envelope has no message");
    }
}

int omv_wire_decode(const uint8_t *buf, size_t len, omv_msg_t *ret, char *why)
{
    if (len > OMV_WIRE_MAX_ENVELOPE)
        FAIL("envelope of %zu bytes is over the %d-byte limit", len, OMV_WIRE_MAX_ENVELOPE);
    ProtobufCAllocator alloc = {arena_alloc, arena_free, &arena};
    arena.used = 0;
    Omnivore__Envelope *env = omnivore__envelope__unpack(&alloc, len, buf);
    if (env == NULL)
        FAIL("%zu bytes are not a valid envelope", len);
    memset(ret, 0, offsetof(omv_msg_t, u));
    ret->type = (omv_msg_type_t)env->body_case;
    int r = decode_body(env, ret, why);
    arena.used = 0;
    return r;
}

void omv_wire_error(omv_msg_t *msg, omv_refuse_t code, const char *fmt, ...)
{
    msg->type = OMV_MSG_ERROR;
    msg->u.error.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg->u.error.reason, sizeof(msg->u.error.reason), fmt, ap);
    va_end(ap);
}
