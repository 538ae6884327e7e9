/* The worker's session: handshake, then the trainer loop or the evaluator loop. */
#define OMV_LOG_TAG "worker"
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "dataset.h"
#include "link.h"
#include "log.h"
#include "net.h"
#include "rng.h"
#include "util.h"

typedef struct {
    const omv_session_config_t *cfg;
    volatile sig_atomic_t *stop;
    omv_link_t *link;
    uint32_t worker_id;
    uint32_t group;
    omv_jobspec_t job;
    omv_model_layout_t layout;
    omv_net_t *net;
    omv_dataset_t data;
    omv_dataset_norm_t norm;
    float *params; /* [param_count] */
    float *grad;   /* [param_count] */
    float *x;      /* [batch][inputs] */
    uint8_t *y;    /* [batch] */
    uint32_t *order; /* [slice_count] this epoch's permutation */
    uint8_t *got;    /* [n_shards] which shards of the pull arrived */
    int64_t last_sent_ms;
} session_t;

enum { WAIT_DONE = 1 };

static int send_msg(session_t *s, const omv_msg_t *m, const float *payload);

/* Tells the daemon we are alive when nothing else was sent for a heartbeat period. */
static void heartbeat_if_due(session_t *s)
{
    if (s->worker_id != 0 && omv_time_ms() - s->last_sent_ms >= s->cfg->heartbeat_ms) {
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = s->worker_id;
        send_msg(s, &hb, NULL);
    }
}

static int send_msg(session_t *s, const omv_msg_t *m, const float *payload)
{
    int r = omv_link_send(s->link, m, payload);
    if (r < 0)
        omv_log_error("cannot send %s: %s", omv_msg_name(m->type), omv_strerror(r));
    s->last_sent_ms = omv_time_ms();
    return r;
}

/* Waits for the next message that is not a heartbeat concern: sends heartbeats while waiting and
 * handles Error and Stop. Returns 0 with a message, WAIT_DONE on Stop, or a negative errno. */
static int wait_msg(session_t *s, omv_msg_t *m, int64_t deadline_ms)
{
    char why[OMV_WIRE_REASON_MAX];
    for (;;) {
        if (*s->stop)
            return -EINTR;
        int64_t now = omv_time_ms();
        if (deadline_ms > 0 && now >= deadline_ms)
            return -ETIMEDOUT;
        int wait = s->cfg->heartbeat_ms;
        if (deadline_ms > 0 && deadline_ms - now < wait)
            wait = (int)(deadline_ms - now);
        int r = omv_link_recv(s->link, m, wait, why);
        if (r == -EAGAIN || r == -EINTR) {
            if (s->worker_id != 0 && omv_time_ms() - s->last_sent_ms >= s->cfg->heartbeat_ms) {
                omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
                hb.u.heartbeat.worker_id = s->worker_id;
                send_msg(s, &hb, NULL);
            }
            continue;
        }
        if (r == -EPROTO) {
            omv_log_warn("ignoring a malformed message from the daemon: %s", why);
            continue;
        }
        if (r < 0)
            return r;
        if (m->type == OMV_MSG_STOP) {
            omv_log_info("daemon says stop: \"%s\"", m->u.stop.reason);
            return WAIT_DONE;
        }
        if (m->type == OMV_MSG_ERROR) {
            if (m->u.error.code == OMV_REFUSE_NOT_FINITE) {
                /* The daemon dropped our gradient; the model is intact and the step goes on. */
                omv_log_warn("daemon refused a gradient: \"%s\"", m->u.error.reason);
                continue;
            }
            omv_log_error("daemon refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                          m->u.error.reason);
            return -EPROTO;
        }
        return 0;
    }
}

static int handshake(session_t *s)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    m.u.hello.role = s->cfg->role;
    m.u.hello.pid = (uint32_t)getpid();
    m.u.hello.threads = (uint32_t)s->cfg->threads;
    if (gethostname(m.u.hello.hostname, sizeof(m.u.hello.hostname)) != 0)
        omv_strlcpy(m.u.hello.hostname, "unknown", sizeof(m.u.hello.hostname));
    m.u.hello.hostname[sizeof(m.u.hello.hostname) - 1] = '\0';
    int r = send_msg(s, &m, NULL);
    if (r < 0)
        return r;
    r = wait_msg(s, &m, omv_time_ms() + s->cfg->hello_timeout_ms);
    if (r == -ETIMEDOUT) {
        omv_log_error("no answer from the daemon at %s within %d ms: is omnivored running?",
                      s->cfg->endpoint, s->cfg->hello_timeout_ms);
        return r;
    }
    if (r != 0)
        return r < 0 ? r : -ECONNRESET;
    if (m.type != OMV_MSG_WELCOME) {
        omv_log_error("expected welcome from the daemon, got %s", omv_msg_name(m.type));
        return -EPROTO;
    }
    if (m.u.welcome.protocol_version != OMV_PROTOCOL_VERSION) {
        omv_log_error("daemon speaks protocol version %u, this worker speaks %d: upgrade one of them",
                      m.u.welcome.protocol_version, OMV_PROTOCOL_VERSION);
        return -EPROTO;
    }
    s->worker_id = m.u.welcome.worker_id;
    s->group = m.u.welcome.group;
    s->job = m.u.welcome.job;
    return 0;
}

/* Checks the job against itself and the data; allocates every buffer the loop needs. */
static int prepare(session_t *s, uint32_t batch)
{
    omv_jobspec_t *j = &s->job;
    char err[OMV_CONFIG_ERR_MAX];
    int r = j->model[0] ? omv_model_parse(&s->layout, j->model, "job's model", err)
                        : omv_model_layout(&s->layout, j->layers, j->n_layers);
    if (r < 0 || s->layout.param_count != j->param_count) {
        omv_log_error("job's model (%u parameters) does not lay out: %s", j->param_count,
                      r < 0 && j->model[0] ? err : "wrong parameter count");
        return -EPROTO;
    }
    const char *format = j->data_format[0] ? j->data_format : "idx";
    if (s->cfg->role == OMV_ROLE_TRAINER)
        r = omv_dataset_open(&s->data, format, j->train_images, j->train_labels, j->slice_begin,
                             j->slice_count, err);
    else
        r = omv_dataset_open(&s->data, format, j->test_images, j->test_labels, 0, 0, err);
    if (r < 0) {
        omv_log_error("%s", err);
        return r;
    }
    const omv_shape_t *in = &s->layout.input;
    if (s->data.channels * s->data.rows * s->data.cols != s->layout.inputs ||
        (in->h * in->w > 1 && s->data.channels != in->c)) {
        omv_log_error("images are %ux%ux%u but the model takes %ux%ux%u", s->data.channels,
                      s->data.rows, s->data.cols, in->c, in->h, in->w);
        return -EINVAL;
    }
    if ((j->n_mean > 1 && j->n_mean != s->data.channels) ||
        (j->n_std > 1 && j->n_std != s->data.channels)) {
        omv_log_error("job normalises %u/%u channels but images have %u", j->n_mean, j->n_std,
                      s->data.channels);
        return -EINVAL;
    }
    s->norm.scale = j->scale;
    s->norm.n_mean = j->n_mean, s->norm.n_std = j->n_std;
    memcpy(s->norm.mean, j->mean, sizeof(s->norm.mean));
    memcpy(s->norm.std, j->std, sizeof(s->norm.std));
    if (s->data.max_label >= s->layout.classes) {
        omv_log_error("labels go up to %u but the model has %u classes", s->data.max_label,
                      s->layout.classes);
        return -EINVAL;
    }
    s->net = omv_net_new_threads(&s->layout, batch, (uint32_t)s->cfg->threads);
    if (s->net != NULL)
        omv_net_seed(s->net, j->seed ^ ((uint64_t)s->worker_id << 40));
    s->params = malloc(j->param_count * sizeof(float));
    s->grad = malloc(j->param_count * sizeof(float));
    s->x = malloc((size_t)batch * s->layout.inputs * sizeof(float));
    s->y = malloc(batch);
    s->order = malloc((size_t)s->data.count * sizeof(uint32_t));
    s->got = calloc(j->n_shards, 1);
    if (!s->net || !s->params || !s->grad || !s->x || !s->y || !s->order || !s->got) {
        omv_log_error("out of memory for a model of %u parameters, batch %u", j->param_count,
                      batch);
        return -ENOMEM;
    }
    return 0;
}

/* Gathers images idx[0..n) of the slice into x (normalised, channels-last) and y. */
static void gather(session_t *s, const uint32_t *idx, uint32_t n)
{
    omv_dataset_gather(&s->data, &s->norm, idx, n, s->x, s->y);
}

/* Pulls every shard of the parameters for `step`. Returns 0, WAIT_DONE or a negative errno. */
static int pull(session_t *s, uint64_t step)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull.worker_id = s->worker_id;
    m.u.pull.step = step;
    int r = send_msg(s, &m, NULL);
    if (r < 0)
        return r;
    const omv_jobspec_t *j = &s->job;
    memset(s->got, 0, j->n_shards);
    for (uint32_t have = 0; have < j->n_shards;) {
        r = wait_msg(s, &m, 0);
        if (r != 0)
            return r;
        if (m.type != OMV_MSG_PARAMS) {
            omv_log_warn("ignoring %s while waiting for parameters", omv_msg_name(m.type));
            continue;
        }
        const omv_params_t *p = &m.u.params;
        if (p->step != step || p->shard >= j->n_shards || s->got[p->shard] ||
            p->offset != j->shard_offsets[p->shard] ||
            p->count != j->shard_offsets[p->shard + 1] - p->offset) {
            omv_log_error("daemon sent parameters that do not fit: step %llu shard %u offset %u "
                          "count %u (expected step %llu)",
                          (unsigned long long)p->step, p->shard, p->offset, p->count,
                          (unsigned long long)step);
            return -EPROTO;
        }
        size_t len;
        const void *data = omv_link_payload(s->link, &len);
        memcpy(s->params + p->offset, data, len);
        s->got[p->shard] = 1;
        s->group = p->group;
        have++;
    }
    return 0;
}

static int train(session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t batch = j->batch_size;
    if (batch == 0 || j->steps_per_epoch == 0 || (uint64_t)j->steps_per_epoch * batch > j->slice_count) {
        omv_log_error("job gives %u steps of %u images per epoch but a slice of %u images",
                      j->steps_per_epoch, batch, j->slice_count);
        return -EPROTO;
    }
    int r = prepare(s, batch);
    if (r < 0)
        return r;
    omv_log_info("worker %u in group %u: images [%u, %u), %u steps of %u", s->worker_id, s->group,
                 j->slice_begin, j->slice_begin + j->slice_count, j->total_steps, batch);
    for (uint32_t i = 0; i < s->data.count; i++)
        s->order[i] = i;
    omv_rng_t rng;
    for (uint64_t step = 0;; step++) {
        r = pull(s, step);
        if (r != 0)
            return r == WAIT_DONE ? 0 : r;
        if (step >= j->total_steps) {
            /* The daemon answers the pull past the last step only with Stop. */
            omv_log_error("daemon sent parameters past the last step");
            return -EPROTO;
        }
        uint64_t in_epoch = step % j->steps_per_epoch;
        if (in_epoch == 0) {
            uint64_t epoch = step / j->steps_per_epoch;
            omv_rng_init(&rng, j->seed ^ (epoch * 0x9e3779b97f4a7c15ULL) ^
                                   ((uint64_t)j->slice_begin << 32));
            omv_rng_shuffle(&rng, s->order, s->data.count);
        }
        gather(s, s->order + in_epoch * batch, batch);
        double t0 = omv_time_s();
        float loss = omv_net_train_step(s->net, s->params, s->x, s->y, batch, s->grad);
        float ms = (float)((omv_time_s() - t0) * 1000.0);
        omv_msg_t m = {.type = OMV_MSG_PUSH};
        for (uint32_t sh = 0; sh < j->n_shards; sh++) {
            uint32_t off = j->shard_offsets[sh];
            m.u.push = (omv_push_t){s->worker_id, step, sh, off, j->shard_offsets[sh + 1] - off,
                                    loss, batch, ms};
            r = send_msg(s, &m, s->grad + off);
            if (r < 0)
                return r;
        }
    }
}

static int evaluate(session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t batch = j->eval_batch_size ? j->eval_batch_size : 1000;
    int r = prepare(s, batch);
    if (r < 0)
        return r;
    omv_log_info("evaluator %u: %u test images", s->worker_id, s->data.count);
    for (uint32_t i = 0; i < s->data.count; i++)
        s->order[i] = i;
    for (;;) {
        omv_msg_t m;
        r = wait_msg(s, &m, 0);
        if (r != 0)
            return r == WAIT_DONE ? 0 : r;
        if (m.type != OMV_MSG_EVAL_REQUEST) {
            omv_log_warn("evaluator ignores %s", omv_msg_name(m.type));
            continue;
        }
        size_t len;
        const void *data = omv_link_payload(s->link, &len);
        if (m.u.eval_request.count != j->param_count) {
            omv_log_error("eval snapshot has %u parameters, the model %u",
                          m.u.eval_request.count, j->param_count);
            return -EPROTO;
        }
        memcpy(s->params, data, len);
        uint32_t correct = 0;
        double loss = 0.0;
        for (uint32_t at = 0; at < s->data.count; at += batch) {
            uint32_t n = s->data.count - at < batch ? s->data.count - at : batch;
            uint32_t c;
            double l;
            /* A large model takes longer over the test set than the daemon waits for silence. */
            heartbeat_if_due(s);
            gather(s, s->order + at, n);
            omv_net_evaluate(s->net, s->params, s->x, s->y, n, &c, &l);
            correct += c;
            loss += l;
        }
        omv_msg_t res = {.type = OMV_MSG_EVAL_RESULT};
        res.u.eval_result = (omv_eval_result_t){s->worker_id, m.u.eval_request.eval_id, correct,
                                                s->data.count, (float)(loss / s->data.count)};
        r = send_msg(s, &res, NULL);
        if (r < 0)
            return r;
    }
}

int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop)
{
    session_t s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    s.stop = stop;
    /* The engine splits each batch over cfg->threads threads of its own; BLAS runs one thread
     * per call so that the two pools do not fight (measured: bench/bench_net.c). */
    omv_blas_set_threads(1);
    s.link = omv_link_new(cfg->endpoint);
    if (s.link == NULL) {
        int e = errno;
        omv_log_error("cannot connect to '%s': %s", cfg->endpoint, omv_strerror(-e));
        return -e;
    }
    int r = handshake(&s);
    if (r == 0)
        r = cfg->role == OMV_ROLE_TRAINER ? train(&s) : evaluate(&s);
    free(s.got);
    free(s.order);
    free(s.y);
    free(s.x);
    free(s.grad);
    free(s.params);
    omv_dataset_fini(&s.data);
    omv_net_destroy(&s.net);
    omv_link_destroy(&s.link);
    return r;
}
