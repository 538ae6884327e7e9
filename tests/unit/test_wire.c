/* The wire module: every message type survives encode/decode with all its fields, and the
 * decoder answers malformed, truncated, oversized and fuzzed bytes with -EPROTO and a reason. */
#include <check.h>
#include <math.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rng.h"
#include "bf16.h"
#include "shm.h"
#include "wire.h"
#include "testutil.h"
#include "util.h"

#define BUF_CAP 16384

static void make_welcome(omv_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    m->type = OMV_MSG_WELCOME;
    omv_welcome_t *w = &m->u.welcome;
    w->protocol_version = OMV_PROTOCOL_VERSION;
    w->worker_id = 17;
    w->group = 3;
    w->start_step = 0x1234567899ULL;
    omv_jobspec_t *j = &w->job;
    strcpy(j->name, "fashion-mlp");
    j->n_layers = 4;
    j->layers[0] = 784, j->layers[1] = 256, j->layers[2] = 128, j->layers[3] = 10;
    strcpy(j->train_images, "/data/train-images-idx3-ubyte.gz");
    strcpy(j->train_labels, "/data/train-labels-idx1-ubyte.gz");
    strcpy(j->test_images, "/data/t10k-images-idx3-ubyte");
    strcpy(j->test_labels, "/data/t10k-labels-idx1-ubyte");
    j->batch_size = 32;
    j->seed = 0x0123456789abcdefULL;
    j->slice_begin = 30000;
    j->slice_count = 29999;
    j->steps_per_epoch = 937;
    j->total_steps = 2811;
    j->param_count = 235146;
    j->n_shards = 3;
    j->shard_offsets[0] = 0, j->shard_offsets[1] = 78382, j->shard_offsets[2] = 156764;
    j->shard_offsets[3] = 235146;
    j->eval_batch_size = 1000;
    strcpy(j->model, "input 1x28x28\nconv 32 5x5 pad 2\nrelu\nfc 10\n");
    strcpy(j->data_format, "cifar10");
    j->scale = 0.5f;
    j->n_mean = 3, j->mean[0] = 0.1f, j->mean[1] = 0.2f, j->mean[2] = 0.3f;
    j->n_std = 1, j->std[0] = 0.25f;
    j->augment_pad = 4, j->augment_flip = 1;
}

/* One message of each type but welcome, every field set; 64-bit fields go above 32 bits. */
#define BIG 0x1234567890ULL
static const omv_msg_t samples[] = {
    {.type = OMV_MSG_HELLO,
     .u.hello = {OMV_PROTOCOL_VERSION, OMV_ROLE_EVALUATOR, "node7", 42, 16, 12, "worker@3"}},
    {.type = OMV_MSG_PULL, .u.pull = {9, BIG, BIG + 7}},
    {.type = OMV_MSG_PARAMS,
     .u.params = {BIG + 1, 2, 1000, 500, 4, 30000, 15000, 21, OMV_WIRE_INT8, 0, BIG + 8, 3}},
    {.type = OMV_MSG_PUSH, .u.push = {5, BIG + 2, 1, 64, 32, 2.25f, 128, 12.5f, OMV_WIRE_BF16}},
    {.type = OMV_MSG_HEARTBEAT, .u.heartbeat = {77}},
    {.type = OMV_MSG_EVAL_REQUEST, .u.eval_request = {BIG + 3, 235146}},
    {.type = OMV_MSG_EVAL_RESULT, .u.eval_result = {3, BIG + 4, 8812, 10000, 0.375f}},
    {.type = OMV_MSG_ERROR, .u.error = {OMV_REFUSE_NOT_FINITE, "gradient of shard 2 has NaN"}},
    {.type = OMV_MSG_STOP, .u.stop = {"job finished", 0}},
    {.type = OMV_MSG_STOP, .u.stop = {"daemon is shutting down", 1}},
    {.type = OMV_MSG_LEAVE, .u.leave = {6, "stopped by signal"}},
};
enum { N_SAMPLES = sizeof(samples) / sizeof(samples[0]) };

static size_t encode_ok(const omv_msg_t *m, uint8_t *buf)
{
    size_t len = 0;
    ck_assert_int_eq(omv_wire_encode(m, buf, BUF_CAP, &len), 0);
    ck_assert_uint_gt(len, 0);
    return len;
}

/* Encodes and decodes m; the decoded message lands in out. */
static void round_trip(const omv_msg_t *m, omv_msg_t *out)
{
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX] = "";
    size_t len = encode_ok(m, buf);
    memset(out, 0x5a, sizeof(*out));
    ck_assert_msg(omv_wire_decode(buf, len, out, why) == 0, "decode failed: %s", why);
    ck_assert_int_eq(out->type, m->type);
}

static int decode_refused(const uint8_t *buf, size_t len)
{
    omv_msg_t m;
    char why[OMV_WIRE_REASON_MAX] = "";
    int r = omv_wire_decode(buf, len, &m, why);
    ck_assert_msg(r == 0 || r == -EPROTO, "decode of %zu bytes returned %d", len, r);
    if (r == -EPROTO)
        ck_assert_msg(why[0] != '\0', "-EPROTO without a reason for %zu bytes", len);
    return r == -EPROTO;
}

START_TEST(test_welcome_round_trip)
{
    omv_msg_t m, d;
    make_welcome(&m);
    round_trip(&m, &d);
    const omv_welcome_t *a = &m.u.welcome, *b = &d.u.welcome;
    ck_assert_uint_eq(b->protocol_version, a->protocol_version);
    ck_assert_uint_eq(b->worker_id, 17);
    ck_assert_uint_eq(b->group, 3);
    ck_assert(b->start_step == 0x1234567899ULL);
    ck_assert_str_eq(b->job.name, a->job.name);
    ck_assert_uint_eq(b->job.n_layers, 4);
    ck_assert_mem_eq(b->job.layers, a->job.layers, 4 * sizeof(uint32_t));
    ck_assert_str_eq(b->job.train_images, a->job.train_images);
    ck_assert_str_eq(b->job.train_labels, a->job.train_labels);
    ck_assert_str_eq(b->job.test_images, a->job.test_images);
    ck_assert_str_eq(b->job.test_labels, a->job.test_labels);
    ck_assert_str_eq(b->job.model, a->job.model);
    ck_assert_str_eq(b->job.data_format, "cifar10");
    ck_assert_float_eq(b->job.scale, 0.5f);
    ck_assert_uint_eq(b->job.n_mean, 3);
    ck_assert_mem_eq(b->job.mean, a->job.mean, 3 * sizeof(float));
    ck_assert_uint_eq(b->job.n_std, 1);
    ck_assert_float_eq(b->job.std[0], 0.25f);
    ck_assert_uint_eq(b->job.augment_pad, 4);
    ck_assert_uint_eq(b->job.augment_flip, 1);
    ck_assert_uint_eq(b->job.batch_size, 32);
    ck_assert(b->job.seed == 0x0123456789abcdefULL);
    ck_assert_uint_eq(b->job.slice_begin, 30000);
    ck_assert_uint_eq(b->job.slice_count, 29999);
    ck_assert_uint_eq(b->job.steps_per_epoch, 937);
    ck_assert_uint_eq(b->job.total_steps, 2811);
    ck_assert_uint_eq(b->job.param_count, 235146);
    ck_assert_uint_eq(b->job.n_shards, 3);
    ck_assert_mem_eq(b->job.shard_offsets, a->job.shard_offsets, 4 * sizeof(uint32_t));
    ck_assert_uint_eq(b->job.eval_batch_size, 1000);
}
END_TEST

/* A Welcome without means and stds (an IDX job) decodes to none of either; fuzzing found the
 * decoder copying from protobuf-c's NULL array for it, which UBSan reports. */
START_TEST(test_welcome_without_std)
{
    omv_msg_t m, d;
    make_welcome(&m);
    m.u.welcome.job.n_mean = 0;
    m.u.welcome.job.n_std = 0;
    round_trip(&m, &d);
    ck_assert_uint_eq(d.u.welcome.job.n_mean, 0);
    ck_assert_uint_eq(d.u.welcome.job.n_std, 0);
    ck_assert_uint_eq(d.u.welcome.job.n_shards, 3);
}
END_TEST

/* Strings from a peer that a person reads are stored with their control characters escaped: a
 * newline in a hostname cannot start a forged line in a log or a key:value reply. */
START_TEST(test_peer_strings_escaped)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO}, d;
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    strcpy(m.u.hello.hostname, "evil\nworkers_alive:99\r\x1b[2J");
    strcpy(m.u.hello.name, "back\\slash\t");
    round_trip(&m, &d);
    ck_assert_str_eq(d.u.hello.hostname, "evil\\x0aworkers_alive:99\\x0d\\x1b[2J");
    ck_assert_str_eq(d.u.hello.name, "back\\\\slash\\x09");
    omv_msg_t l = {.type = OMV_MSG_LEAVE};
    memset(l.u.leave.reason, '\n', sizeof(l.u.leave.reason) - 1);
    round_trip(&l, &d);
    /* Cut where the next escape would not fit, never half-way through one. */
    ck_assert_uint_eq(strlen(d.u.leave.reason), (OMV_WIRE_REASON_MAX - 1) / 4 * 4);
    ck_assert(strncmp(d.u.leave.reason, "\\x0a\\x0a", 8) == 0);
}
END_TEST

START_TEST(test_other_messages_round_trip)
{
    omv_msg_t d[N_SAMPLES];
    for (int i = 0; i < N_SAMPLES; i++)
        round_trip(&samples[i], &d[i]);
    ck_assert_uint_eq(d[0].u.hello.protocol_version, OMV_PROTOCOL_VERSION);
    ck_assert_int_eq(d[0].u.hello.role, OMV_ROLE_EVALUATOR);
    ck_assert_str_eq(d[0].u.hello.hostname, "node7");
    ck_assert_uint_eq(d[0].u.hello.pid, 42);
    ck_assert_uint_eq(d[0].u.hello.threads, 16);
    ck_assert_uint_eq(d[0].u.hello.previous_worker_id, 12);
    ck_assert_str_eq(d[0].u.hello.name, "worker@3");
    ck_assert_uint_eq(d[1].u.pull.worker_id, 9);
    ck_assert(d[1].u.pull.step == BIG);
    ck_assert(d[1].u.pull.view == BIG + 7);
    ck_assert(d[2].u.params.step == BIG + 1);
    ck_assert_uint_eq(d[2].u.params.shard, 2);
    ck_assert_uint_eq(d[2].u.params.offset, 1000);
    ck_assert_uint_eq(d[2].u.params.count, 500);
    ck_assert_uint_eq(d[2].u.params.group, 4);
    ck_assert_uint_eq(d[2].u.params.slice_begin, 30000);
    ck_assert_uint_eq(d[2].u.params.slice_count, 15000);
    ck_assert_uint_eq(d[2].u.params.batch, 21);
    ck_assert_uint_eq(d[2].u.params.wire, OMV_WIRE_INT8);
    ck_assert(d[2].u.params.view == BIG + 8);
    ck_assert_uint_eq(d[2].u.params.view_seq, 3);
    ck_assert_uint_eq(d[3].u.push.worker_id, 5);
    ck_assert(d[3].u.push.step == BIG + 2);
    ck_assert_uint_eq(d[3].u.push.shard, 1);
    ck_assert_uint_eq(d[3].u.push.offset, 64);
    ck_assert_uint_eq(d[3].u.push.count, 32);
    ck_assert_float_eq(d[3].u.push.loss, 2.25f);
    ck_assert_uint_eq(d[3].u.push.samples, 128);
    ck_assert_float_eq(d[3].u.push.compute_ms, 12.5f);
    ck_assert_uint_eq(d[3].u.push.wire, OMV_WIRE_BF16);
    ck_assert_uint_eq(d[4].u.heartbeat.worker_id, 77);
    ck_assert(d[5].u.eval_request.eval_id == BIG + 3);
    ck_assert_uint_eq(d[5].u.eval_request.count, 235146);
    ck_assert_uint_eq(d[6].u.eval_result.worker_id, 3);
    ck_assert(d[6].u.eval_result.eval_id == BIG + 4);
    ck_assert_uint_eq(d[6].u.eval_result.correct, 8812);
    ck_assert_uint_eq(d[6].u.eval_result.total, 10000);
    ck_assert_float_eq(d[6].u.eval_result.loss, 0.375f);
    ck_assert_int_eq(d[7].u.error.code, OMV_REFUSE_NOT_FINITE);
    ck_assert_str_eq(d[7].u.error.reason, "gradient of shard 2 has NaN");
    ck_assert_str_eq(d[8].u.stop.reason, "job finished");
    ck_assert_int_eq(d[8].u.stop.reconnect, 0);
    ck_assert_str_eq(d[9].u.stop.reason, "daemon is shutting down");
    ck_assert_int_eq(d[9].u.stop.reconnect, 1);
    ck_assert_uint_eq(d[10].u.leave.worker_id, 6);
    ck_assert_str_eq(d[10].u.leave.reason, "stopped by signal");
    /* The constructor formats its reason. */
    omv_wire_error(&d[0], OMV_REFUSE_SHAPE, "shard %u of %d", 7u, 3);
    round_trip(&d[0], &d[1]);
    ck_assert_int_eq(d[1].u.error.code, OMV_REFUSE_SHAPE);
    ck_assert_str_eq(d[1].u.error.reason, "shard 7 of 3");
}
END_TEST

START_TEST(test_payload_count)
{
    const uint32_t want[N_SAMPLES] = {0, 0, 500, 32, 0, 235146, 0, 0, 0, 0, 0};
    for (int i = 0; i < N_SAMPLES; i++)
        ck_assert_uint_eq(omv_wire_payload_count(&samples[i]), want[i]);
    omv_msg_t m;
    make_welcome(&m);
    ck_assert_uint_eq(omv_wire_payload_count(&m), 0);
    /* Bytes: int8 values a byte and a float per block, bf16 ones two, fp32 ones four
     * (evaluations always travel as fp32). */
    const size_t bytes[N_SAMPLES] = {0, 0, 500 + 8 * 4, 64, 0, 235146 * 4, 0, 0, 0, 0, 0};
    for (int i = 0; i < N_SAMPLES; i++)
        ck_assert_uint_eq(omv_wire_payload_bytes(&samples[i]), bytes[i]);
    omv_msg_t push = samples[3];
    push.u.push.wire = OMV_WIRE_FP32;
    ck_assert_uint_eq(omv_wire_payload_bytes(&push), 128);
    /* int8: a byte a value and a float per block of them. */
    push.u.push.wire = OMV_WIRE_INT8;
    ck_assert_uint_eq(omv_wire_payload_bytes(&push), 32 + 4);
    push.u.push.count = 8 * OMV_Q8_BLOCK + 1;
    ck_assert_uint_eq(omv_wire_payload_bytes(&push), 8 * OMV_Q8_BLOCK + 1 + 9 * 4);
}
END_TEST

/* A worker that exits with the daemon's parameters unread resets its connection; its Leave,
 * sent just before, still comes first, and then the end (the kernel tells the reset before the
 * records queued ahead of it). */
START_TEST(test_shm_leave_before_reset)
{
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    static omv_shm_batch_t b;
    omv_msg_t leave = {.type = OMV_MSG_LEAVE};
    leave.u.leave.worker_id = 7;
    omv_strlcpy(leave.u.leave.reason, "stopped by signal", sizeof(leave.u.leave.reason));
    ck_assert_int_eq(omv_shm_batch_add(&b, &leave), 0);
    ck_assert_int_eq(omv_shm_batch_flush(sv[0], &b), 1);
    /* The daemon's answer, which the worker never reads. */
    omv_msg_t params = {.type = OMV_MSG_PARAMS};
    params.u.params.wire = OMV_WIRE_SHM;
    ck_assert_int_eq(omv_shm_batch_add(&b, &params), 0);
    ck_assert_int_eq(omv_shm_batch_flush(sv[1], &b), 1);
    close(sv[0]);
    omv_msg_t got;
    char why[OMV_WIRE_REASON_MAX] = "";
    ck_assert_int_eq(omv_shm_recv_msg(sv[1], &got, why), 0);
    ck_assert_int_eq(got.type, OMV_MSG_LEAVE);
    ck_assert_uint_eq(got.u.leave.worker_id, 7);
    ck_assert_str_eq(got.u.leave.reason, "stopped by signal");
    ck_assert_int_eq(omv_shm_recv_msg(sv[1], &got, why), -ECONNRESET);
    close(sv[1]);
}
END_TEST

START_TEST(test_shm_wire)
{
    /* Values in shared memory: no payload frame, for parameters and gradients alike; a
     * Welcome's offer of segments comes through whole. */
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX];
    omv_msg_t d, m = samples[2];
    m.u.params.wire = OMV_WIRE_SHM;
    m.u.params.view = m.u.params.view_seq = 0;
    ck_assert_uint_eq(omv_wire_payload_count(&m), 0);
    ck_assert_uint_eq(omv_wire_payload_bytes(&m), 0);
    size_t len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.params.wire, OMV_WIRE_SHM);
    ck_assert_uint_eq(d.u.params.count, m.u.params.count);
    m = samples[3];
    m.u.push.wire = OMV_WIRE_SHM;
    ck_assert_uint_eq(omv_wire_payload_count(&m), 0);
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.push.wire, OMV_WIRE_SHM);
    make_welcome(&m);
    omv_strlcpy(m.u.welcome.shm_socket, "omnivore-shm-42-00ff", sizeof(m.u.welcome.shm_socket));
    m.u.welcome.shm_token = 0x0123456789abcdefULL;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_str_eq(d.u.welcome.shm_socket, "omnivore-shm-42-00ff");
    ck_assert(d.u.welcome.shm_token == 0x0123456789abcdefULL);
    make_welcome(&m);
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_str_eq(d.u.welcome.shm_socket, ""); /* none offered */
}
END_TEST

START_TEST(test_unknown_wire_refused)
{
    /* A wire the decoder does not know is refused with a reason, for every carrier. */
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX];
    omv_msg_t d, m = samples[2];
    m.u.params.wire = 5;
    size_t len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "wire 5") != NULL, "%s", why);
    m = samples[3];
    m.u.push.wire = 7;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "wire 7") != NULL, "%s", why);
    make_welcome(&m);
    m.u.welcome.job.wire = OMV_WIRE_SHM; /* how a worker's values travel, not a job's setting */
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "wire 2") != NULL, "%s", why);
    make_welcome(&m);
    m.u.welcome.job.wire = OMV_WIRE_BF16;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.welcome.job.wire, OMV_WIRE_BF16);
    /* int8 is a job's wire and a gradient's, and parameters' as a change to a view. */
    make_welcome(&m);
    m.u.welcome.job.wire = OMV_WIRE_INT8;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.welcome.job.wire, OMV_WIRE_INT8);
    m = samples[3];
    m.u.push.wire = OMV_WIRE_INT8;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.push.wire, OMV_WIRE_INT8);
    make_welcome(&m);
    m.u.welcome.job.wire = 4;
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "wire 4") != NULL, "%s", why);
    ck_assert_uint_eq(omv_wire_of_params(OMV_WIRE_INT8), OMV_WIRE_FP32);
    ck_assert_uint_eq(omv_wire_of_params(OMV_WIRE_FP32), OMV_WIRE_FP32);
}
END_TEST

START_TEST(test_params_views_refused)
{
    /* Parameters as a change need the view and the change's number; a whole shard that begins a
     * view is fp32 and change 0; nothing else names a view. Each is refused with why. */
    static const struct {
        uint32_t wire;
        uint64_t view;
        uint32_t seq;
        int ok;
    } cases[] = {
        {OMV_WIRE_INT8, 5, 1, 1}, {OMV_WIRE_FP32, 5, 0, 1}, {OMV_WIRE_BF16, 0, 0, 1},
        {OMV_WIRE_INT8, 0, 1, 0}, {OMV_WIRE_INT8, 5, 0, 0}, {OMV_WIRE_FP32, 5, 2, 0},
        {OMV_WIRE_BF16, 5, 0, 0}, {OMV_WIRE_FP32, 0, 1, 0},
    };
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        omv_msg_t d, m = samples[2];
        m.u.params.wire = cases[i].wire;
        m.u.params.view = cases[i].view;
        m.u.params.view_seq = cases[i].seq;
        size_t len = encode_ok(&m, buf);
        int r = omv_wire_decode(buf, len, &d, why);
        ck_assert_msg(r == (cases[i].ok ? 0 : -EPROTO), "case %zu: %d (%s)", i, r, why);
        if (!cases[i].ok)
            ck_assert_msg(strstr(why, "view") != NULL, "case %zu: %s", i, why);
    }
}
END_TEST

START_TEST(test_q8_views_agree)
{
    /* A server's view and a worker's, fed the same changes, stay equal bit for bit; each is
     * within one change's rounding of the parameters (half a step of its block's scale), so
     * what rounding lost goes with the next change and never adds up. Parameters move by small
     * steps with a large one now and then (a restore), from any alignment of the bytes. */
    enum { N = 7 * OMV_Q8_BLOCK + 5, STEPS = 200 };
    static float params[N], server[N], worker[N];
    static unsigned char raw[1 + 8 * 4 + N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++)
        params[i] = server[i] = worker[i] = 0.1f * (float)(i % 13) - 0.6f;
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            float u = (float)(seed >> 40) / (float)(1u << 24) - 0.5f;
            params[i] += (t % 50 == 49 ? 2.0f : 1e-3f) * u;
        }
        omv_q8_encode_delta(raw + 1, params, server, N);
        omv_q8_add(worker, raw + 1, N);
        ck_assert(memcmp(server, worker, sizeof(server)) == 0);
        for (int i = 0; i < N; i++) {
            float scale;
            memcpy(&scale, raw + 1 + 4 * (i / OMV_Q8_BLOCK), sizeof(scale));
            ck_assert_msg(fabsf(worker[i] - params[i]) <= scale / 2 * 1.001f + 1e-6f,
                          "step %d value %d: view %g, parameter %g, scale %g", t, i, worker[i],
                          params[i], scale);
        }
    }
    /* With no change the view comes closer still: what is left of the rounding goes. */
    float before = 0.0f, after = 0.0f;
    for (int i = 0; i < N; i++)
        before = fmaxf(before, fabsf(worker[i] - params[i]));
    omv_q8_encode_delta(raw + 1, params, server, N);
    omv_q8_add(worker, raw + 1, N);
    ck_assert(memcmp(server, worker, sizeof(server)) == 0);
    for (int i = 0; i < N; i++)
        after = fmaxf(after, fabsf(worker[i] - params[i]));
    ck_assert_msg(before > 0.0f && after < before / 50.0f, "%g then %g", before, after);
}
END_TEST

START_TEST(test_q8_by_hand)
{
    /* One block of 4: the scale is max |v| / 127 = 2.54 / 127 = 0.02; 1.0 / 0.02 = 50,
     * -0.03 / 0.02 = -1.5 rounds to even, -2, 0.0101 to 1 (0.505), 2.54 to 127. */
    const float v[4] = {1.0f, -0.03f, 0.0101f, 2.54f};
    unsigned char buf[4 + 4];
    float residual[4] = {0}, back[4];
    omv_q8_encode(buf, v, residual, 4);
    float scale;
    memcpy(&scale, buf, sizeof(scale));
    ck_assert_float_eq_tol(scale, 0.02f, 1e-8f);
    const int8_t *q = (const int8_t *)(buf + 4);
    ck_assert_int_eq(q[0], 50);
    ck_assert_int_eq(q[1], -2);
    ck_assert_int_eq(q[2], 1);
    ck_assert_int_eq(q[3], 127);
    omv_q8_decode(back, buf, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert(back[i] == (float)q[i] * scale);
        /* what was lost is kept: sent + kept = the value */
        ck_assert_float_eq_tol(back[i] + residual[i], v[i], 1e-6f);
        ck_assert(fabsf(residual[i]) <= scale / 2 * 1.0001f);
    }
    /* The residual goes out with the next gradient: -0.03 left 0.01 behind, so a second -0.03
     * becomes -0.02 = -1 unit (scale 0.02 again, as 2.54 stays the largest). */
    omv_q8_encode(buf, v, residual, 4);
    ck_assert_int_eq(q[1], -1);
    /* Zeros: a zero scale, zero values, nothing kept. */
    const float zero[3] = {0};
    float kept[3] = {0}, got[3] = {1, 1, 1};
    unsigned char zbuf[4 + 3];
    omv_q8_encode(zbuf, zero, kept, 3);
    omv_q8_decode(got, zbuf, 3);
    for (int i = 0; i < 3; i++)
        ck_assert(got[i] == 0.0f && kept[i] == 0.0f);
    /* Values too small for a scale (127 / max would overflow): nothing sent, all of it kept. */
    const float tiny[3] = {1e-38f, -2e-38f, 0.0f};
    omv_q8_encode(zbuf, tiny, kept, 3);
    omv_q8_decode(got, zbuf, 3);
    for (int i = 0; i < 3; i++)
        ck_assert(got[i] == 0.0f && kept[i] == tiny[i]);
    /* Nearest, ties to even: 0.5 and 1.5 units go to 0 and 2, just under half a unit down. */
    const float ties[4] = {127.0f, 0.5f, 1.5f, 0.49999997f};
    unsigned char tbuf[4 + 4];
    omv_q8_encode(tbuf, ties, NULL, 4);
    const int8_t *tq = (const int8_t *)(tbuf + 4);
    ck_assert_int_eq(tq[0], 127);
    ck_assert_int_eq(tq[1], 0);
    ck_assert_int_eq(tq[2], 2);
    ck_assert_int_eq(tq[3], 0);
    /* The largest magnitude may be negative; -0 and a subnormal are small values as any. */
    const float neg[4] = {0.3f, -3.81f, -0.0f, 1e-40f};
    omv_q8_encode(tbuf, neg, NULL, 4);
    memcpy(&scale, tbuf, sizeof(scale));
    ck_assert_float_eq_tol(scale, 0.03f, 1e-8f);
    ck_assert_int_eq(tq[0], 10);
    ck_assert_int_eq(tq[1], -127);
    ck_assert_int_eq(tq[2], 0);
    ck_assert_int_eq(tq[3], 0);
}
END_TEST

START_TEST(test_q8_error_feedback)
{
    /* Over many steps nothing is lost for good: the sum of what was sent plus what is kept
     * equals the sum of the gradients (to float rounding), block by block and across a short
     * last block, from any alignment of the bytes. And each value is within half a unit of its
     * block's scale of what it stood for. */
    enum { N = 11 * OMV_Q8_BLOCK - 3, STEPS = 50 };
    static float grad[N], sent_sum[N], grad_sum[N], residual[N], back[N];
    static unsigned char raw[1 + 4 * 11 + N];
    uint64_t seed = 7;
    for (int t = 0; t < STEPS; t++) {
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            /* mostly small, a few large: the case where int8 without feedback loses most */
            float u = (float)(seed >> 40) / (float)(1u << 24) - 0.5f;
            grad[i] = (i % 97 == 0) ? 40.0f * u : 0.01f * u;
            grad_sum[i] += grad[i];
        }
        float before[N];
        for (int i = 0; i < N; i++)
            before[i] = grad[i] + residual[i];
        omv_q8_encode(raw + 1, grad, residual, N);
        omv_q8_decode(back, raw + 1, N);
        for (int i = 0; i < N; i++) {
            float scale;
            memcpy(&scale, raw + 1 + 4 * (i / OMV_Q8_BLOCK), sizeof(scale));
            ck_assert(fabsf(back[i] - before[i]) <= scale / 2 * 1.001f + 1e-12f);
            sent_sum[i] += back[i];
        }
    }
    for (int i = 0; i < N; i++)
        ck_assert_msg(fabsf(sent_sum[i] + residual[i] - grad_sum[i]) <=
                          1e-4f * (1 + fabsf(grad_sum[i])),
                      "value %d: sent %g + kept %g, the gradients summed to %g", i, sent_sum[i],
                      residual[i], grad_sum[i]);
    ck_assert_uint_eq(omv_q8_bytes(N), N + 11 * 4);
}
END_TEST

START_TEST(test_q8_non_finite)
{
    /* A NaN or an infinity makes its block's scale NaN (the server refuses what decodes to
     * it) and clears that block's residual, so that it cannot poison the gradients after it;
     * the other blocks go as usual. */
    enum { B = OMV_Q8_BLOCK, N = B + B / 2 };
    static float v[N], residual[N], back[N];
    static unsigned char buf[2 * 4 + N];
    for (int i = 0; i < N; i++) {
        v[i] = 0.5f;
        residual[i] = 0.25f;
    }
    v[10] = INFINITY;
    omv_q8_encode(buf, v, residual, N);
    omv_q8_decode(back, buf, N);
    ck_assert(isnan(back[0]) && isnan(back[B - 1]));
    ck_assert_float_eq_tol(back[B], 0.75f, 1e-6f);
    ck_assert_float_eq_tol(back[N - 1], 0.75f, 1e-6f);
    for (int i = 0; i < B; i++)
        ck_assert(residual[i] == 0.0f);
    v[10] = -INFINITY; /* the sign does not hide it */
    omv_q8_encode(buf, v, NULL, N);
    omv_q8_decode(back, buf, N);
    ck_assert(isnan(back[0]) && !isnan(back[B]));
    v[10] = NAN;
    omv_q8_encode(buf, v, NULL, N);
    omv_q8_decode(back, buf, N);
    ck_assert(isnan(back[10]) && !isnan(back[B]));
}
END_TEST

static uint16_t bf16_of_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof(f));
    uint16_t h;
    omv_bf16_from_f32(&h, &f, 1);
    return h;
}

START_TEST(test_bf16_rounding)
{
    /* By hand: bf16 keeps the high 16 bits; the low 16 decide, to nearest, ties to even. */
    ck_assert_uint_eq(bf16_of_bits(0x3f800000u), 0x3f80); /* 1.0: exact */
    ck_assert_uint_eq(bf16_of_bits(0x3f807fffu), 0x3f80); /* just below half: down */
    ck_assert_uint_eq(bf16_of_bits(0x3f808000u), 0x3f80); /* a tie, kept bit even: down */
    ck_assert_uint_eq(bf16_of_bits(0x3f818000u), 0x3f82); /* a tie, kept bit odd: up */
    ck_assert_uint_eq(bf16_of_bits(0x3f808001u), 0x3f81); /* just above half: up */
    ck_assert_uint_eq(bf16_of_bits(0xbf808001u), 0xbf81); /* negative: the same magnitude */
    ck_assert_uint_eq(bf16_of_bits(0x3fffffffu), 0x4000); /* carry into the exponent */
    ck_assert_uint_eq(bf16_of_bits(0x7f7fffffu), 0x7f80); /* FLT_MAX rounds to infinity */
    ck_assert_uint_eq(bf16_of_bits(0x7f800000u), 0x7f80); /* +inf */
    ck_assert_uint_eq(bf16_of_bits(0xff800000u), 0xff80); /* -inf */
    ck_assert_uint_eq(bf16_of_bits(0x7f800001u), 0x7fc0); /* a NaN stays a (quiet) NaN, */
    ck_assert_uint_eq(bf16_of_bits(0x7fffffffu), 0x7fff); /* never becomes an infinity */
    ck_assert_uint_eq(bf16_of_bits(0x00000001u), 0x0000); /* the smallest denormal: 0 */
    ck_assert_uint_eq(bf16_of_bits(0x80000000u), 0x8000); /* -0 keeps its sign */
    /* 1/3 = 0x3eaaaaab: 0x3eaa, remainder 0xaaab above half: 0x3eab = 0.333984375. */
    float third = 1.0f / 3.0f, back;
    uint16_t h;
    omv_bf16_from_f32(&h, &third, 1);
    ck_assert_uint_eq(h, 0x3eab);
    omv_bf16_to_f32(&back, &h, 1);
    ck_assert(back == 0.333984375f);
}
END_TEST

START_TEST(test_bf16_round_trip)
{
    /* Every bf16 value but NaNs widens and narrows back to itself; widening is exact, from any
     * alignment; a float's error is at most half a unit in the last kept place. */
    enum { N = 65536 };
    static uint16_t all[N], again[N];
    static unsigned char raw[2 * N + 1];
    static float wide[N];
    for (uint32_t i = 0; i < N; i++)
        all[i] = (uint16_t)i;
    memcpy(raw + 1, all, sizeof(all));
    omv_bf16_to_f32(wide, raw + 1, N);
    omv_bf16_from_f32(again, wide, N);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t bits;
        memcpy(&bits, &wide[i], sizeof(bits));
        ck_assert_uint_eq(bits, i << 16);
        int nan = (i & 0x7f80) == 0x7f80 && (i & 0x7f) != 0;
        if (!nan)
            ck_assert_uint_eq(again[i], all[i]);
        else
            ck_assert_uint_eq(again[i], all[i] | 0x40);
    }
    /* Finite exactly when the exponent is not all ones, whatever the alignment. */
    for (uint32_t i = 0; i < N; i++) {
        uint16_t one[2] = {0x3f80, (uint16_t)i};
        int finite = (i & 0x7f80) != 0x7f80;
        ck_assert_int_eq(omv_bf16_all_finite(&one[1], 1), finite);
        ck_assert_int_eq(omv_bf16_all_finite(one, 2), finite);
    }
    ck_assert_int_eq(omv_bf16_all_finite(raw + 1, 0x7f80), 1); /* below the infinities */
    ck_assert_int_eq(omv_bf16_all_finite(raw + 1, 0x7f81), 0);
    for (int k = 1; k < 2000; k++) {
        float x = (float)k * 0.7310586f - 700.0f, y;
        uint16_t h;
        omv_bf16_from_f32(&h, &x, 1);
        omv_bf16_to_f32(&y, &h, 1);
        ck_assert(fabsf(y - x) <= fabsf(x) * (1.0f / 256.0f));
    }
}
END_TEST

START_TEST(test_encode_too_small)
{
    omv_msg_t m;
    uint8_t buf[BUF_CAP];
    size_t len = 0, len2 = 12345;
    make_welcome(&m);
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_encode(&m, buf, len - 1, &len2), -EMSGSIZE);
    ck_assert_uint_eq(len2, 12345); /* not written on failure */
    ck_assert_int_eq(omv_wire_encode(&m, buf, len, &len2), 0);
    ck_assert_uint_eq(len2, len);
    m = (omv_msg_t){.type = OMV_MSG_STOP};
    ck_assert_int_eq(omv_wire_encode(&m, buf, 0, &len2), -EMSGSIZE);
    m.type = OMV_MSG_NONE;
    ck_assert_int_eq(omv_wire_encode(&m, buf, BUF_CAP, &len2), -EINVAL);
}
END_TEST

START_TEST(test_garbage_refused)
{
    static const uint8_t bad_varint[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                         0xff, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t long_length[] = {0x12, 0x50, 0x08, 0x01}; /* 80-byte welcome, 2 sent */
    static const uint8_t tag_zero[] = {0x00, 0x00, 0x00};
    static const uint8_t unknown_only[] = {0x78, 0x01};         /* field 15, no body */
    static const uint8_t bad_role[] = {0x0a, 0x02, 0x10, 0x07}; /* hello with role 7 */
    ck_assert(decode_refused(bad_varint, sizeof(bad_varint)));
    ck_assert(decode_refused(long_length, sizeof(long_length)));
    ck_assert(decode_refused(tag_zero, sizeof(tag_zero)));
    ck_assert(decode_refused(unknown_only, sizeof(unknown_only)));
    ck_assert(decode_refused(bad_role, sizeof(bad_role)));
    ck_assert(decode_refused(bad_role, 0)); /* an empty envelope: no message at all */

    /* Random bytes: almost never an envelope, never a crash. */
    omv_rng_t rng;
    omv_rng_init(&rng, 7);
    uint8_t buf[512];
    int refused = 0;
    for (int i = 0; i < 2000; i++) {
        size_t len = 1 + omv_rng_below(&rng, sizeof(buf));
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)omv_rng_next(&rng);
        omv_msg_t m;
        int no = decode_refused(buf, len);
        /* why is optional: the same verdict without it. */
        ck_assert_int_eq(omv_wire_decode(buf, len, &m, NULL), no ? -EPROTO : 0);
        refused += no;
    }
    ck_assert_int_gt(refused, 1900);
}
END_TEST

START_TEST(test_prefixes_of_welcome_refused)
{
    omv_msg_t m;
    uint8_t buf[BUF_CAP];
    make_welcome(&m);
    size_t len = encode_ok(&m, buf);
    for (size_t n = 0; n < len; n++) {
        /* Copy so that valgrind sees any read past the prefix. */
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        ck_assert_msg(decode_refused(copy, n), "prefix of %zu/%zu bytes was accepted", n, len);
        free(copy);
    }
}
END_TEST

/* A valid stop followed by an unknown length-delimited field padding it to `total` bytes. */
static void padded_stop(uint8_t *buf, size_t total)
{
    buf[0] = 0x52, buf[1] = 0x00; /* stop {} */
    buf[2] = 0xa2, buf[3] = 0x06; /* field 100, length-delimited */
    size_t body = total - 7;      /* three varint bytes for the length */
    buf[4] = (uint8_t)(0x80 | (body & 0x7f));
    buf[5] = (uint8_t)(0x80 | ((body >> 7) & 0x7f));
    buf[6] = (uint8_t)(body >> 14);
    memset(buf + 7, 'x', body);
}

START_TEST(test_oversized_envelope)
{
    uint8_t *buf = malloc(OMV_WIRE_MAX_ENVELOPE + 1);
    omv_msg_t m;
    char why[OMV_WIRE_REASON_MAX] = "";
    /* At the limit the same construction decodes: the size alone decides. */
    padded_stop(buf, OMV_WIRE_MAX_ENVELOPE);
    ck_assert_int_eq(omv_wire_decode(buf, OMV_WIRE_MAX_ENVELOPE, &m, why), 0);
    ck_assert_int_eq(m.type, OMV_MSG_STOP);
    padded_stop(buf, OMV_WIRE_MAX_ENVELOPE + 1);
    ck_assert_int_eq(omv_wire_decode(buf, OMV_WIRE_MAX_ENVELOPE + 1, &m, why), -EPROTO);
    ck_assert_ptr_nonnull(strstr(why, "limit"));
    free(buf);
}
END_TEST

START_TEST(test_welcome_bad_shards_refused)
{
    static const struct {
        uint32_t at, value, n_layers, n_shards, param_count;
        const char *words;
    } cases[] = {
        {1, 200000, 4, 3, 235146, "ascending"}, /* 0 200000 156764 235146 */
        {3, 235145, 4, 3, 235146, "cover"},     /* one short of param_count */
        {0, 1, 4, 3, 235146, "cover"},
        {0, 0, 1, 3, 235146, "layers"},
        {0, 0, 4, 0, 235146, "shard offsets"},
        {0, 0, 4, 0, 0, "shard offsets"}, /* no shards, even for no parameters */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        omv_msg_t m, d;
        uint8_t buf[BUF_CAP];
        char why[OMV_WIRE_REASON_MAX] = "";
        make_welcome(&m);
        omv_jobspec_t *j = &m.u.welcome.job;
        j->shard_offsets[cases[c].at] = cases[c].value;
        j->n_layers = cases[c].n_layers;
        j->n_shards = cases[c].n_shards;
        j->param_count = cases[c].param_count;
        size_t len = encode_ok(&m, buf);
        ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
        ck_assert_msg(strstr(why, cases[c].words), "case %zu: '%s'", c, why);
    }
}
END_TEST

/* The model on shard servers: a Welcome names every server in shard order, the worker's
 * attach, its step report, and the coordinator's orders to a server with their clocks. */
START_TEST(test_servers_round_trip)
{
    omv_msg_t m, d;
    make_welcome(&m);
    omv_welcome_t *w = &m.u.welcome;
    w->n_servers = 2;
    w->attach_token = 0xfeedfacecafebeefULL;
    strcpy(w->servers[0].endpoint, "tcp://10.0.0.2:5556");
    strcpy(w->servers[0].public_key, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
    w->servers[0].first_shard = 0, w->servers[0].last_shard = 1;
    strcpy(w->servers[1].endpoint, "tcp://10.0.0.3:5556");
    w->servers[1].first_shard = 1, w->servers[1].last_shard = 3;
    round_trip(&m, &d);
    ck_assert_uint_eq(d.u.welcome.n_servers, 2);
    ck_assert(d.u.welcome.attach_token == 0xfeedfacecafebeefULL);
    ck_assert_str_eq(d.u.welcome.servers[0].endpoint, "tcp://10.0.0.2:5556");
    ck_assert_str_eq(d.u.welcome.servers[0].public_key, w->servers[0].public_key);
    ck_assert_str_eq(d.u.welcome.servers[1].public_key, "");
    ck_assert_uint_eq(d.u.welcome.servers[1].first_shard, 1);
    ck_assert_uint_eq(d.u.welcome.servers[1].last_shard, 3);

    memset(&m, 0, sizeof(m));
    m.type = OMV_MSG_REPORT;
    m.u.report = (omv_step_report_t){9, 123456789012ULL, 0.25f, 21, 3.5f};
    round_trip(&m, &d);
    ck_assert_uint_eq(d.u.report.worker_id, 9);
    ck_assert(d.u.report.step == 123456789012ULL);
    ck_assert_float_eq(d.u.report.loss, 0.25f);
    ck_assert_uint_eq(d.u.report.samples, 21);
    ck_assert_float_eq(d.u.report.compute_ms, 3.5f);

    memset(&m, 0, sizeof(m));
    m.type = OMV_MSG_ATTACH;
    m.u.attach = (omv_attach_t){4, 77};
    round_trip(&m, &d);
    ck_assert_uint_eq(d.u.attach.worker_id, 4);
    ck_assert(d.u.attach.token == 77);

    memset(&m, 0, sizeof(m));
    m.type = OMV_MSG_SERVER;
    omv_server_msg_t *u = &m.u.server;
    u->op = OMV_SERVER_MEMBER;
    u->server_id = 2, u->first_shard = 1, u->last_shard = 3, u->n_groups = 3;
    u->clocks[0] = 5, u->clocks[1] = 6, u->clocks[2] = 1ULL << 40;
    u->worker_id = 11, u->slot = 4, u->group = 2, u->state = OMV_SERVER_MEMBER_DEAD;
    strcpy(u->host, "node-7");
    strcpy(u->key, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
    u->token = 99, u->gather_id = 12, u->final = 1, u->count = 0;
    u->images = 1ULL << 33, u->steps = 1000;
    u->reconfig = OMV_SERVER_RECONFIG_REGROUP | OMV_SERVER_RECONFIG_RESTORE;
    u->learning_rate = 0.025f, u->momentum = 0.6f, u->weight_decay = 1e-4f, u->no_ranges = 1;
    round_trip(&m, &d);
    const omv_server_msg_t *v = &d.u.server;
    ck_assert_int_eq(v->op, OMV_SERVER_MEMBER);
    ck_assert_uint_eq(v->server_id, 2);
    ck_assert_uint_eq(v->first_shard, 1);
    ck_assert_uint_eq(v->last_shard, 3);
    ck_assert_uint_eq(v->n_groups, 3);
    ck_assert(v->clocks[0] == 5 && v->clocks[1] == 6 && v->clocks[2] == 1ULL << 40);
    ck_assert_uint_eq(v->worker_id, 11);
    ck_assert_uint_eq(v->slot, 4);
    ck_assert_uint_eq(v->group, 2);
    ck_assert_uint_eq(v->state, OMV_SERVER_MEMBER_DEAD);
    ck_assert_str_eq(v->host, "node-7");
    ck_assert_str_eq(v->key, u->key);
    ck_assert(v->token == 99 && v->gather_id == 12 && v->final == 1);
    ck_assert(v->images == 1ULL << 33 && v->steps == 1000);
    ck_assert_uint_eq(v->reconfig, OMV_SERVER_RECONFIG_REGROUP | OMV_SERVER_RECONFIG_RESTORE);
    ck_assert(v->learning_rate == 0.025f && v->momentum == 0.6f && v->weight_decay == 1e-4f);
    ck_assert_int_eq(v->no_ranges, 1);
    ck_assert_str_eq(omv_server_op_name(v->op), "member");

    /* A checkpoint's part: the folder and checkpoint in CUT, the file's CRC and size back. */
    u->op = OMV_SERVER_CUT;
    strcpy(u->part_dir, "/srv/checkpoints/fashion-mlp");
    u->part_seq = 1ULL << 35, u->part = 1, u->part_crc = 0xdeadbeef, u->part_bytes = 1ULL << 34;
    round_trip(&m, &d);
    ck_assert_str_eq(v->part_dir, "/srv/checkpoints/fashion-mlp");
    ck_assert(v->part_seq == 1ULL << 35 && v->part == 1 && v->part_crc == 0xdeadbeef);
    ck_assert(v->part_bytes == 1ULL << 34);
    /* An evaluation's gather: the parameters alone. */
    ck_assert_int_eq(v->params_only, 0);
    u->op = OMV_SERVER_GATHER, u->params_only = 1;
    round_trip(&m, &d);
    ck_assert_int_eq(v->params_only, 1);
    ck_assert_str_eq(omv_server_op_name(v->op), "gather");
    /* A part the coordinator cannot see is removed by its server. */
    u->op = OMV_SERVER_DROP_PART;
    round_trip(&m, &d);
    ck_assert(v->op == OMV_SERVER_DROP_PART && v->part_seq == 1ULL << 35);
    ck_assert_str_eq(omv_server_op_name(v->op), "drop_part");
    /* Only an absolute folder. */
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX] = "";
    strcpy(u->part_dir, "checkpoints/../../etc");
    size_t len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "not an absolute path"), "%s", why);
}
END_TEST

/* Servers that leave a shard out, hold one twice or go past the shards are refused. */
START_TEST(test_servers_refused)
{
    static const uint32_t cases[][4] = {
        {0, 1, 2, 3}, /* a gap: shard 1 is nobody's */
        {0, 2, 1, 3}, /* overlap */
        {1, 2, 2, 3}, /* shard 0 is nobody's */
        {0, 0, 0, 3}, /* an empty range */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        omv_msg_t m, d;
        uint8_t buf[BUF_CAP];
        char why[OMV_WIRE_REASON_MAX] = "";
        make_welcome(&m);
        m.u.welcome.n_servers = 2;
        strcpy(m.u.welcome.servers[0].endpoint, "ipc:///a");
        strcpy(m.u.welcome.servers[1].endpoint, "ipc:///b");
        m.u.welcome.servers[0].first_shard = cases[c][0];
        m.u.welcome.servers[0].last_shard = cases[c][1];
        m.u.welcome.servers[1].first_shard = cases[c][2];
        m.u.welcome.servers[1].last_shard = cases[c][3];
        size_t len = encode_ok(&m, buf);
        ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
        ck_assert_msg(strstr(why, "shard server"), "case %zu: '%s'", c, why);
    }
}
END_TEST

/* Backups travel with the servers, and a backup must hold one server's range exactly. */
START_TEST(test_backups)
{
    omv_msg_t m, d;
    uint8_t buf[BUF_CAP];
    char why[OMV_WIRE_REASON_MAX] = "";
    make_welcome(&m);
    omv_welcome_t *w = &m.u.welcome;
    w->n_servers = 2;
    w->servers[0] = (omv_server_info_t){"ipc:///a", "", 0, 1};
    w->servers[1] = (omv_server_info_t){"ipc:///b", "", 1, 3};
    w->n_backups = 2;
    w->backups[0] = (omv_server_info_t){"ipc:///c", "", 1, 3};
    w->backups[1] = (omv_server_info_t){"ipc:///d", "", 0, 1};
    size_t len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), 0);
    ck_assert_uint_eq(d.u.welcome.n_backups, 2);
    ck_assert_str_eq(d.u.welcome.backups[0].endpoint, "ipc:///c");
    ck_assert(d.u.welcome.backups[0].first_shard == 1 && d.u.welcome.backups[0].last_shard == 3);
    ck_assert(d.u.welcome.backups[1].first_shard == 0 && d.u.welcome.backups[1].last_shard == 1);
    w->backups[1].last_shard = 2; /* shards [0, 2): nobody's range */
    len = encode_ok(&m, buf);
    ck_assert_int_eq(omv_wire_decode(buf, len, &d, why), -EPROTO);
    ck_assert_msg(strstr(why, "backup 1"), "'%s'", why);
}
END_TEST

START_TEST(test_welcome_limits)
{
    /* The largest welcome we may send: longest paths, most layers, most shards. */
    omv_msg_t m, d;
    omv_jobspec_t *j = &m.u.welcome.job;
    make_welcome(&m);
    memset(j->train_images, 'a', OMV_JOB_PATH_MAX - 1);
    memset(j->test_labels, 'b', OMV_JOB_PATH_MAX - 1);
    memset(j->model, 'c', OMV_JOB_MODEL_TEXT_MAX - 1);
    j->model[OMV_JOB_MODEL_TEXT_MAX - 1] = '\0';
    j->n_layers = OMV_JOB_MAX_LAYERS;
    for (uint32_t i = 0; i < OMV_JOB_MAX_LAYERS; i++)
        j->layers[i] = 1000 + i;
    j->n_shards = OMV_WIRE_MAX_SHARDS;
    for (uint32_t i = 0; i <= OMV_WIRE_MAX_SHARDS; i++)
        j->shard_offsets[i] = i * 1000;
    j->param_count = OMV_WIRE_MAX_SHARDS * 1000;
    round_trip(&m, &d);
    ck_assert_uint_eq(strlen(d.u.welcome.job.train_images), OMV_JOB_PATH_MAX - 1);
    ck_assert_str_eq(d.u.welcome.job.test_labels, j->test_labels);
    ck_assert_str_eq(d.u.welcome.job.model, j->model);
    ck_assert_mem_eq(d.u.welcome.job.layers, j->layers, sizeof(j->layers));
    ck_assert_uint_eq(d.u.welcome.job.n_shards, OMV_WIRE_MAX_SHARDS);
    ck_assert_mem_eq(d.u.welcome.job.shard_offsets, j->shard_offsets, sizeof(j->shard_offsets));
}
END_TEST

START_TEST(test_long_string_refused)
{
    /* hello { hostname: 100 x 'h' }: longer than the 64-byte field. */
    uint8_t buf[104];
    buf[0] = 0x0a, buf[1] = 102, buf[2] = 0x1a, buf[3] = 100;
    memset(buf + 4, 'h', 100);
    omv_msg_t m;
    char why[OMV_WIRE_REASON_MAX] = "";
    ck_assert_int_eq(omv_wire_decode(buf, sizeof(buf), &m, why), -EPROTO);
    ck_assert_ptr_nonnull(strstr(why, "hostname"));
    /* error { code: 99 }: a code we do not know reads as malformed, not as garbage. */
    static const uint8_t odd_code[] = {0x4a, 0x02, 0x08, 99};
    ck_assert_int_eq(omv_wire_decode(odd_code, sizeof(odd_code), &m, why), 0);
    ck_assert_int_eq(m.u.error.code, OMV_REFUSE_MALFORMED);
}
END_TEST

/* What a decoder that said yes promises: a known type and terminated, in-limit fields. */
static void assert_sane(const omv_msg_t *m)
{
    ck_assert(m->type > OMV_MSG_NONE && m->type <= OMV_MSG_SERVER);
    if (m->type == OMV_MSG_HELLO)
        ck_assert_uint_lt(strnlen(m->u.hello.hostname, 64), 64);
    if (m->type == OMV_MSG_ERROR) {
        ck_assert_uint_lt(strnlen(m->u.error.reason, OMV_WIRE_REASON_MAX), OMV_WIRE_REASON_MAX);
        ck_assert_int_lt(m->u.error.code, OMV_REFUSE_COUNT_);
    }
    if (m->type == OMV_MSG_WELCOME) {
        const omv_jobspec_t *j = &m->u.welcome.job;
        ck_assert(j->n_layers >= 2 && j->n_layers <= OMV_JOB_MAX_LAYERS);
        ck_assert(j->n_shards >= 1 && j->n_shards <= OMV_WIRE_MAX_SHARDS);
        ck_assert_uint_eq(j->shard_offsets[0], 0);
        ck_assert_uint_eq(j->shard_offsets[j->n_shards], j->param_count);
        for (uint32_t i = 0; i < j->n_shards; i++)
            ck_assert_uint_le(j->shard_offsets[i], j->shard_offsets[i + 1]);
        ck_assert_uint_lt(strnlen(j->train_images, OMV_JOB_PATH_MAX), OMV_JOB_PATH_MAX);
    }
}

START_TEST(test_fuzz_decoder)
{
    enum { N_SEEDS = N_SAMPLES + 1 };
    uint8_t seeds[N_SEEDS][BUF_CAP / 4];
    size_t seed_len[N_SEEDS];
    for (int t = 0; t < N_SAMPLES; t++)
        seed_len[t] = encode_ok(&samples[t], seeds[t]);
    omv_msg_t w;
    make_welcome(&w);
    seed_len[N_SAMPLES] = encode_ok(&w, seeds[N_SAMPLES]);

    omv_rng_t rng;
    omv_rng_init(&rng, 20240601);
    uint8_t buf[BUF_CAP / 2];
    int accepted = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        int s = (int)omv_rng_below(&rng, N_SEEDS);
        size_t len = seed_len[s];
        memcpy(buf, seeds[s], len);
        int edits = 1 + (int)omv_rng_below(&rng, 3);
        for (int e = 0; e < edits; e++) {
            size_t at = len ? omv_rng_below(&rng, (uint32_t)len) : 0;
            switch (omv_rng_below(&rng, 4)) {
            case 0: /* flip a bit, or a random set of them */
                if (len)
                    buf[at] ^= (uint8_t)(omv_rng_below(&rng, 2) ? 1u << omv_rng_below(&rng, 8)
                                                                : omv_rng_next(&rng) | 1);
                break;
            case 1: /* insert a byte */
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = (uint8_t)omv_rng_next(&rng);
                len++;
                break;
            case 2: /* delete a byte */
                if (len) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            default: /* truncate */
                len = at;
                break;
            }
        }
        omv_msg_t d;
        char why[OMV_WIRE_REASON_MAX] = "";
        int r = omv_wire_decode(buf, len, &d, why);
        ck_assert_msg(r == 0 || r == -EPROTO, "iteration %d: decode returned %d", it, r);
        if (r == 0) {
            assert_sane(&d);
            accepted++;
        } else {
            ck_assert_msg(why[0] != '\0', "iteration %d: -EPROTO without a reason", it);
            refused++;
        }
    }
    /* Both outcomes occur, so the mutations reach past the first byte. */
    ck_assert_int_gt(accepted, 100);
    ck_assert_int_gt(refused, 100);
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, test_welcome_round_trip);
    tcase_add_test(tc, test_welcome_without_std);
    tcase_add_test(tc, test_peer_strings_escaped);
    tcase_add_test(tc, test_other_messages_round_trip);
    tcase_add_test(tc, test_payload_count);
    tcase_add_test(tc, test_unknown_wire_refused);
    tcase_add_test(tc, test_shm_wire);
    tcase_add_test(tc, test_shm_leave_before_reset);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_bf16_round_trip);
    tcase_add_test(tc, test_q8_by_hand);
    tcase_add_test(tc, test_q8_error_feedback);
    tcase_add_test(tc, test_q8_views_agree);
    tcase_add_test(tc, test_params_views_refused);
    tcase_add_test(tc, test_q8_non_finite);
    tcase_add_test(tc, test_encode_too_small);
    tcase_add_test(tc, test_garbage_refused);
    tcase_add_test(tc, test_prefixes_of_welcome_refused);
    tcase_add_test(tc, test_oversized_envelope);
    tcase_add_test(tc, test_welcome_bad_shards_refused);
    tcase_add_test(tc, test_welcome_limits);
    tcase_add_test(tc, test_backups);
    tcase_add_test(tc, test_servers_round_trip);
    tcase_add_test(tc, test_servers_refused);
    tcase_add_test(tc, test_long_string_refused);
    tcase_add_test(tc, test_fuzz_decoder);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(wire_suite());
}
