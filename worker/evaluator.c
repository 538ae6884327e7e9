/* An evaluator's loop: snapshots of the model in, their accuracy and loss on the test set out. */
#define OMV_LOG_TAG "worker"
#include "evaluator.h"

#include <errno.h>
#include <string.h>

#include "log.h"
#include "session_priv.h"

/* Evaluates params on the test set and sends the result for evaluation eval_id. */
static int evaluate_model(omv_session_t *s, uint64_t eval_id, uint32_t batch)
{
    omv_workload_t *w = &s->work;
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t at = 0; at < w->data.count; at += batch) {
        uint32_t n = w->data.count - at < batch ? w->data.count - at : batch;
        uint32_t c;
        double l;
        omv_workload_gather(w, w->order + at, n);
        omv_net_evaluate(w->net, w->params, w->x, w->y, n, &c, &l);
        correct += c;
        loss += l;
        /* A long evaluation must not look like a dead evaluator. */
        omv_transport_heartbeat(&s->tp);
    }
    omv_msg_t res = {.type = OMV_MSG_EVAL_RESULT};
    res.u.eval_result = (omv_eval_result_t){s->tp.worker_id, eval_id, correct, w->data.count,
                                            (float)(loss / w->data.count)};
    return omv_transport_send(&s->tp, &res, NULL);
}

/* The evaluation awaited from shard servers: its id, the shards of it in, and whether the
 * coordinator asked for it. */
typedef struct {
    uint64_t want;
    uint32_t have;
    int asked;
} awaited_t;

/* An evaluation's range from a shard server (Params whose step is the evaluation's id): taken
 * into params when it is the evaluation awaited (or a newer one, which the coordinator asked
 * for after the awaited one was given up) and covers whole shards not in yet. Returns 0, or
 * -EPROTO for a range that does not fit the model. */
static int take_range(omv_session_t *s, const omv_params_t *p, awaited_t *a)
{
    const omv_jobspec_t *j = &s->job;
    uint8_t *got = s->work.got;
    uint32_t end = p->shard;
    while (end < j->n_shards && j->shard_offsets[end + 1] <= p->offset + (uint64_t)p->count)
        end++;
    size_t len = 0;
    const void *data = omv_transport_payload(&s->tp, &len);
    if (omv_transport_from(&s->tp) == 0 || p->wire != OMV_WIRE_FP32 || p->shard >= j->n_shards ||
        p->offset != j->shard_offsets[p->shard] || p->count == 0 || end == p->shard ||
        j->shard_offsets[end] != p->offset + (uint64_t)p->count ||
        len != (size_t)p->count * sizeof(float)) {
        omv_log_error("a shard server sent evaluation %llu's parameters [%u, +%u) from shard %u, "
                      "which are not whole shards of the model",
                      (unsigned long long)p->step, p->offset, p->count, p->shard);
        return -EPROTO;
    }
    if (p->step < a->want)
        return 0; /* an evaluation given up */
    if (p->step > a->want) {
        *a = (awaited_t){p->step, 0, 0};
        memset(got, 0, j->n_shards);
    }
    for (uint32_t sh = p->shard; sh < end; sh++)
        if (got[sh])
            return 0; /* twice: the first is kept */
    memset(got + p->shard, 1, end - p->shard);
    memcpy(s->work.params + p->offset, data, len);
    a->have += end - p->shard;
    return 0;
}

/* What an evaluator does with message m. Returns 0 or a negative errno. */
static int take_msg(omv_session_t *s, const omv_msg_t *m, awaited_t *a, uint32_t batch)
{
    const omv_jobspec_t *j = &s->job;
    if (m->type == OMV_MSG_PARAMS)
        return take_range(s, &m->u.params, a);
    if (m->type != OMV_MSG_EVAL_REQUEST) {
        omv_log_warn("evaluator ignores %s", omv_msg_name(m->type));
        return 0;
    }
    const omv_eval_request_t *q = &m->u.eval_request;
    /* With the model on shard servers, the coordinator's request (no parameters) says which
     * evaluation is due, and each server sends its range itself, in either order. */
    if (q->count == 0 && s->tp.n_servers > 0) {
        if (q->eval_id > a->want) {
            a->want = q->eval_id;
            a->have = 0;
            memset(s->work.got, 0, j->n_shards);
        }
        a->asked |= q->eval_id == a->want;
        return 0;
    }
    if (q->count != j->param_count) {
        omv_log_error("eval snapshot has %u parameters, the model %u", q->count, j->param_count);
        return -EPROTO;
    }
    size_t len = 0;
    const void *data = omv_link_payload(s->tp.link, &len);
    memcpy(s->work.params, data, len);
    return evaluate_model(s, q->eval_id, batch);
}

int omv_evaluator_run(omv_session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    uint32_t batch = j->eval_batch_size ? j->eval_batch_size : 1000;
    if (!s->work.prepared) {
        int r = omv_workload_prepare(s, batch);
        if (r < 0)
            return r;
    }
    omv_log_info("evaluator %u: %u test images", s->tp.worker_id, s->work.data.count);
    awaited_t a = {0, 0, 0};
    for (;;) {
        omv_msg_t m;
        int r = omv_transport_wait(&s->tp, &m, 0);
        if (r != 0)
            return r;
        r = take_msg(s, &m, &a, batch);
        if (r == 0 && a.asked && a.have == j->n_shards) {
            a.asked = 0;
            r = evaluate_model(s, a.want, batch);
        }
        if (r < 0)
            return r;
    }
}
