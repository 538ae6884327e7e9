/* A trainer's loop: pull, compute, push, step after step, with the communication overlapping
 * the compute through the engine's hooks. */
#define OMV_LOG_TAG "worker"
#include "trainer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bf16.h"
#include "log.h"
#include "q8.h"
#include "session_priv.h"
#include "util.h"

void omv_trainer_init(omv_trainer_t *self)
{
    memset(self, 0, sizeof(*self));
    omv_rng_init(&self->delay_rng, (uint64_t)getpid() * 0x9e3779b97f4a7c15ULL);
}

void omv_trainer_release(omv_trainer_t *self)
{
    free(self->pushed);
    free(self->grad);
    free(self->grad16);
    free(self->int8.grad8);
    free(self->int8.residual);
    free(self->int8.seq);
    self->pushed = NULL;
    self->grad = NULL;
    self->grad16 = NULL;
    self->int8.grad8 = NULL;
    self->int8.residual = NULL;
    self->int8.seq = NULL;
}

/* The buffers a gradient needs beside the workload's: made with it, once a job. */
static int alloc_buffers(omv_session_t *s)
{
    omv_trainer_t *t = &s->tr;
    const omv_jobspec_t *j = &s->job;
    t->grad = malloc(j->param_count * sizeof(float));
    t->grad16 = malloc(j->param_count * sizeof(uint16_t));
    omv_transport_heartbeat(&s->tp);
    int int8 = j->wire == OMV_WIRE_INT8;
    if (int8) {
        uint32_t most = 0;
        for (uint32_t sh = 0; sh < j->n_shards; sh++)
            if (j->shard_offsets[sh + 1] - j->shard_offsets[sh] > most)
                most = j->shard_offsets[sh + 1] - j->shard_offsets[sh];
        t->int8.grad8 = malloc(omv_q8_bytes(most));
        t->int8.residual = calloc(j->param_count, sizeof(float));
        t->int8.seq = calloc(j->n_shards, sizeof(uint32_t));
    }
    t->pushed = calloc(j->n_shards, 1);
    if (!t->grad || !t->grad16 || !t->pushed ||
        (int8 && (!t->int8.grad8 || !t->int8.residual || !t->int8.seq))) {
        omv_log_error("out of memory for a model of %u parameters, batch %u", j->param_count,
                      j->batch_size);
        return -ENOMEM;
    }
    return 0;
}

/* Asks for the parameters of step: from the daemon, or from every shard server. */
static int send_pull(omv_session_t *s, uint64_t step)
{
    const uint64_t *view = s->tr.int8.view;
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull.worker_id = s->tp.worker_id;
    m.u.pull.step = step;
    m.u.pull.view = view[0];
    if (s->tp.n_servers == 0)
        return omv_transport_send(&s->tp, &m, NULL);
    for (uint32_t i = 0; i < s->tp.n_servers; i++) {
        m.u.pull.view = view[1 + i];
        int r = omv_transport_send_server(&s->tp, i, &m, NULL);
        if (r < 0)
            return r;
    }
    return 0;
}

/* Where this step's parameters are read and its gradient written, as the shared-memory link
 * takes the way the daemon sent shard p (worker/shmlink.h). Returns 0 or -EPROTO. */
static int take_way(omv_session_t *s, const omv_params_t *p)
{
    omv_trainer_t *t = &s->tr;
    int r = omv_shmlink_step(&s->tp.shm, p, t->have == 0, s->tp.worker_id);
    if (r < 0 || t->have > 0)
        return r < 0 ? r : 0;
    /* What int8 rounding kept back belongs to the socket's gradients: shared memory carries
     * fp32, and a residual many steps old would come back as noise. At most a step's rounding
     * is dropped. */
    if (r == 1 && t->int8.residual)
        memset(t->int8.residual, 0, s->job.param_count * sizeof(float));
    if (p->wire == OMV_WIRE_SHM) /* params is not kept up to date meanwhile: a view begins again */
        memset(t->int8.view, 0, sizeof(t->int8.view));
    t->p = omv_shmlink_params(&s->tp.shm, s->work.params);
    t->g = omv_shmlink_grads(&s->tp.shm, t->grad);
    return 0;
}

/* Checks that Params p (fp32 or int8, with a view: wire int8) fit our view of its shard: a
 * whole shard begins a view, a change must be the next one to the view we hold. Returns 0, or
 * OMV_WAIT_LOST after logging why (register again: the next Welcome begins every view anew). */
static int take_view(omv_session_t *s, const omv_params_t *p)
{
    omv_trainer_int8_t *q = &s->tr.int8;
    uint64_t *view = &q->view[omv_transport_from(&s->tp)];
    if (q->seq == NULL) {
        omv_log_error("daemon sent parameters as changes to a view, to a worker of a job whose "
                      "wire is not int8");
        return -EPROTO;
    }
    if (p->wire == OMV_WIRE_FP32) {
        *view = p->view;
        q->seq[p->shard] = 0;
        q->wholes_got++;
        return 0;
    }
    if (p->view != *view || p->view_seq != q->seq[p->shard] + 1) {
        omv_log_error("worker %u: shard %u came as change %u to view %016llx, but we hold change "
                      "%u to view %016llx: registering again, to start from the whole model",
                      s->tp.worker_id, p->shard, p->view_seq, (unsigned long long)p->view,
                      q->seq[p->shard], (unsigned long long)*view);
        *view = 0;
        return OMV_WAIT_LOST;
    }
    q->seq[p->shard] = p->view_seq;
    q->changes_got++;
    return 0;
}

/* Checks that Params p fit the pull under way: the first fixes the step and the batch
 * (begin_step keeps it in t->batch); the others must agree. Returns 0 or -EPROTO. */
static int check_params(omv_session_t *s, const omv_params_t *p)
{
    omv_trainer_t *t = &s->tr;
    const omv_jobspec_t *j = &s->job;
    if (p->step != t->step || p->step < t->asked || p->shard >= j->n_shards ||
        s->work.got[p->shard] || p->offset != j->shard_offsets[p->shard] ||
        p->count != j->shard_offsets[p->shard + 1] - p->offset) {
        omv_log_error("daemon sent parameters that do not fit: step %llu shard %u offset %u "
                      "count %u (asked for step %llu)",
                      (unsigned long long)p->step, p->shard, p->offset, p->count,
                      (unsigned long long)t->asked);
        return -EPROTO;
    }
    /* Shard servers each learn of a member change on their own: the step's batch, slice and
     * group are the ones shard 0's server says (begin_step), whatever the others said. */
    int one_voice = s->tp.n_servers == 0;
    if (p->batch == 0 || p->batch > j->batch_size ||
        (one_voice && t->have > 0 && p->batch != t->batch)) {
        omv_log_error("daemon asks for a batch of %u images; this worker takes 1 to %u, the "
                      "same for every shard of a step",
                      p->batch, j->batch_size);
        return -EPROTO;
    }
    return 0;
}

/* Takes one shard of the parameters asked for into params. Returns 0, OMV_WAIT_LOST or
 * -EPROTO. */
static int take_params(omv_session_t *s, const omv_params_t *p)
{
    omv_trainer_t *t = &s->tr;
    float *params = s->work.params;
    if (t->have == 0)
        t->step = p->step;
    int r = check_params(s, p);
    r = r < 0 ? r : take_way(s, p);
    if (r < 0)
        return r;
    size_t len = 0;
    const void *data = p->wire == OMV_WIRE_SHM ? NULL : omv_transport_payload(&s->tp, &len);
    if (p->view) {
        r = take_view(s, p);
        if (r != 0)
            return r;
    }
    if (p->wire == OMV_WIRE_BF16)
        omv_bf16_to_f32(params + p->offset, data, p->count);
    else if (p->wire == OMV_WIRE_FP32)
        memcpy(params + p->offset, data, len);
    else if (p->wire == OMV_WIRE_INT8)
        omv_q8_add(params + p->offset, data, p->count);
    s->work.got[p->shard] = 1;
    t->have++;
    return 0;
}

/* Waits for the next shard of the pull under way. Returns 0, OMV_WAIT_DONE, OMV_WAIT_LOST or a
 * negative errno; *ret (may be NULL) gets the Params. */
static int recv_shard(omv_session_t *s, omv_params_t *ret)
{
    for (;;) {
        omv_msg_t m;
        int r = omv_transport_wait(&s->tp, &m, 0);
        if (r != 0)
            return r;
        if (m.type != OMV_MSG_PARAMS) {
            omv_log_warn("ignoring %s while waiting for parameters", omv_msg_name(m.type));
            continue;
        }
        r = take_params(s, &m.u.params);
        if (r == 0 && ret)
            *ret = m.u.params;
        return r;
    }
}

/* Receives shards until params[from, to) hold the step's values. Returns as recv_shard. */
static int await_params(omv_session_t *s, size_t from, size_t to)
{
    const omv_jobspec_t *j = &s->job;
    for (uint32_t sh = 0; from < to && sh < j->n_shards && j->shard_offsets[sh] < to; sh++)
        while (j->shard_offsets[sh + 1] > from && !s->work.got[sh]) {
            int r = recv_shard(s, NULL);
            if (r != 0)
                return r;
        }
    return 0;
}

/* Takes what the step's first Params p say the step is made of: its batch, data slice and
 * group, in effect from this step. Returns 0 or a negative errno. */
static int take_step_shape(omv_session_t *s, const omv_params_t *p)
{
    omv_trainer_t *t = &s->tr;
    omv_workload_t *w = &s->work;
    uint32_t group = s->group;
    s->group = p->group;
    uint32_t slice_begin = w->slice_begin, slice_count = w->slice_count;
    if (p->slice_count > 0) {
        slice_begin = p->slice_begin;
        slice_count = p->slice_count;
    }
    if (p->batch != t->batch && t->batch != 0)
        omv_log_info("worker %u: %u images a step now (the group's members changed)",
                     s->tp.worker_id, p->batch);
    int reseek = p->batch != t->batch;
    t->batch = p->batch;
    if (slice_begin != w->slice_begin || slice_count != w->slice_count) {
        omv_log_info("worker %u: data slice is now images [%u, %u)", s->tp.worker_id, slice_begin,
                     slice_begin + slice_count);
        int r = omv_workload_load(s, slice_begin, slice_count);
        if (r < 0)
            return r;
        reseek = 1;
    }
    if (s->group != group)
        omv_log_info("worker %u: now in group %u from step %llu", s->tp.worker_id, s->group,
                     (unsigned long long)p->step);
    if (reseek || p->step != t->asked)
        omv_workload_seek(w, s->job.seed, p->step, t->batch);
    return 0;
}

/* Waits for the first shard of the parameters asked for step *step_p. The daemon's answer names
 * the step to compute, which may be later than asked (after a regroup, every group starts at a
 * common clock): *step_p gets it. A changed data slice, batch or group in it takes effect for
 * this step; the other shards follow (await_params). Returns 0, OMV_WAIT_DONE, OMV_WAIT_LOST or
 * a negative errno. */
static int begin_step(omv_session_t *s, uint64_t *step_p)
{
    omv_trainer_t *t = &s->tr;
    t->asked = *step_p;
    t->have = 0;
    memset(s->work.got, 0, s->job.n_shards);
    memset(t->pushed, 0, s->job.n_shards);
    t->pulled = 0;
    omv_params_t p;
    int r = recv_shard(s, &p);
    while (r == 0 && s->tp.n_servers > 0 && !s->work.got[0])
        r = recv_shard(s, &p); /* shard 0's server says what the step is made of */
    if (r != 0)
        return r;
    r = take_step_shape(s, &p);
    if (r < 0)
        return r;
    *step_p = p.step;
    return 0;
}

/* Sleeps seconds, as a slower device would compute (unless a signal asks to stop), with a
 * heartbeat when one is due, as a real step's layers send them (omv_transport_tick). */
static void sleep_s(omv_session_t *s, double seconds)
{
    double until = omv_time_s() + seconds;
    for (double left = seconds; left > 0 && !*s->stop; left = until - omv_time_s()) {
        double slice = left < 0.1 ? left : 0.1;
        struct timespec ts = {0, (long)(slice * 1e9)};
        nanosleep(&ts, NULL);
        omv_transport_heartbeat(&s->tp);
    }
}

/* Sleeps a random time in [delay_min_ms, delay_max_ms]. */
static void slow_down(omv_session_t *s)
{
    uint32_t span = (uint32_t)(s->cfg->delay_max_ms - s->cfg->delay_min_ms) + 1;
    uint32_t ms =
        (uint32_t)s->cfg->delay_min_ms + (uint32_t)(omv_rng_next(&s->tr.delay_rng) % span);
    sleep_s(s, ms / 1000.0);
}

/* Pushes shard sh of the step's gradient, as the job's wire asks; loss and ms go with it (the
 * daemon reads them from shard 0's). */
static int push_shard(omv_session_t *s, uint32_t sh, float loss, float ms)
{
    omv_trainer_t *t = &s->tr;
    const omv_jobspec_t *j = &s->job;
    uint32_t off = j->shard_offsets[sh], count = j->shard_offsets[sh + 1] - off;
    omv_msg_t m = {.type = OMV_MSG_PUSH};
    uint32_t wire = omv_shmlink_push_wire(&s->tp.shm, j->wire);
    /* Batch norm's running statistics (the last shard's tail) are values, not gradients: one
     * int8 step of a block could make a small variance 0. Their shard goes as bf16. */
    if (wire == OMV_WIRE_INT8 && off + count > s->work.layout.state_offset)
        wire = OMV_WIRE_BF16;
    m.u.push = (omv_push_t){s->tp.worker_id, t->step, sh, off, count, loss, t->batch, ms, wire};
    const void *values = t->g + off; /* in the segment already when the wire is shm */
    if (wire == OMV_WIRE_BF16) {
        omv_bf16_from_f32(t->grad16 + off, t->g + off, count);
        values = t->grad16 + off;
    } else if (wire == OMV_WIRE_INT8) {
        /* What rounding loses goes out with the next step's gradient (error feedback). */
        omv_q8_encode(t->int8.grad8, t->g + off, t->int8.residual + off, count);
        values = t->int8.grad8;
    }
    t->pushed[sh] = 1;
    return omv_transport_push(&s->tp, sh, &m, values);
}

/* With the model on shard servers, the daemon gets the step's figures on their own. */
static int report_step(omv_session_t *s, float loss, float ms)
{
    if (s->tp.n_servers == 0)
        return 0;
    omv_msg_t m = {.type = OMV_MSG_REPORT};
    m.u.report = (omv_step_report_t){s->tp.worker_id, s->tr.step, loss, s->tr.batch, ms};
    return omv_transport_send(&s->tp, &m, NULL);
}

/* Pushes, last first, every shard not pushed yet that starts at or after from, but shard 0:
 * it carries the step's loss and time, and goes last (push_rest). */
static int push_from(omv_session_t *s, size_t from)
{
    for (uint32_t sh = s->job.n_shards; sh-- > 1;)
        if (!s->tr.pushed[sh] && s->job.shard_offsets[sh] >= from) {
            int r = push_shard(s, sh, 0.0f, 0.0f);
            if (r < 0)
                return r;
        }
    return 0;
}

/* Pushes every shard not pushed yet, shard 0 last; then the step's report, if any. */
static int push_rest(omv_session_t *s, float loss, float ms)
{
    int r = push_from(s, 0);
    r = r < 0 ? r : push_shard(s, 0, loss, ms);
    return r < 0 ? r : report_step(s, loss, ms);
}

/* The engine's hooks (worker/engine/net.h): a layer waits only for its own shards, and a shard's
 * gradient goes out as soon as backward has finished it. The next step's pull goes before the
 * first push: the daemon answers it shard by shard as it applies this step's, so what we read
 * is unchanged (every shard comes once this step's update, ours in it, is applied). */
static void hook_need(void *ctx, size_t from, size_t to)
{
    omv_session_t *s = ctx;
    double t0 = omv_time_s();
    if (s->tr.hook_err == 0)
        s->tr.hook_err = await_params(s, from, to);
    s->tr.hook_s += omv_time_s() - t0;
    s->tr.times.need_s += omv_time_s() - t0;
}

/* Asks for the next step's parameters, once a step. */
static int pull_next(omv_session_t *s)
{
    if (s->tr.pulled)
        return 0;
    s->tr.pulled = 1;
    return send_pull(s, s->tr.step + 1);
}

static void hook_ready(void *ctx, size_t from)
{
    omv_session_t *s = ctx;
    double t0 = omv_time_s();
    if (s->tr.hook_err == 0 && s->tr.have == s->job.n_shards) {
        s->tr.hook_err = pull_next(s);
        if (s->tr.hook_err == 0)
            s->tr.hook_err = push_from(s, from);
    }
    s->tr.hook_s += omv_time_s() - t0;
    s->tr.times.send_s += omv_time_s() - t0;
}

/* One step with communication overlapping it. Returns 0, OMV_WAIT_* or a negative errno. */
static int overlapped_step(omv_session_t *s)
{
    omv_trainer_t *t = &s->tr;
    omv_workload_t *w = &s->work;
    /* A layer cut by shards is computed shard by shard, as they come. */
    const omv_net_hooks_t hooks = {hook_need, hook_ready, s, s->job.shard_offsets,
                                   s->job.n_shards + 1};
    t->hook_err = 0;
    t->hook_s = 0.0;
    double t0 = omv_time_s();
    float loss = omv_net_train_step_hooked(w->net, t->p, w->x, w->y, t->batch, t->g, &hooks);
    if (t->hook_err != 0)
        return t->hook_err;
    /* What the step took to compute, without waiting for shards and sending gradients. */
    float ms = (float)((omv_time_s() - t0 - t->hook_s) * 1000.0);
    double t1 = omv_time_s();
    int r = pull_next(s);
    r = r < 0 ? r : push_rest(s, loss, ms);
    t->times.send_s += omv_time_s() - t1;
    t->times.compute_s += ms / 1000.0;
    t->times.steps++;
    return r;
}

/* One step in the serial order: every shard, compute, every push, then the next pull. */
static int serial_step(omv_session_t *s)
{
    omv_trainer_t *t = &s->tr;
    omv_workload_t *w = &s->work;
    int r = await_params(s, 0, s->job.param_count);
    if (r != 0)
        return r;
    double t0 = omv_time_s();
    float loss = omv_net_train_step(w->net, t->p, w->x, w->y, t->batch, t->g);
    if (s->cfg->slowdown > 1.0)
        sleep_s(s, (s->cfg->slowdown - 1.0) * (omv_time_s() - t0));
    if (s->cfg->delay_max_ms > 0)
        slow_down(s);
    float ms = (float)((omv_time_s() - t0) * 1000.0);
    r = push_rest(s, loss, ms);
    return r < 0 ? r : pull_next(s);
}

/* Where the steps went since the last summary (overlapped steps only: the serial order is for
 * emulated slow devices), and how int8 parameters came. */
static void log_summary(omv_session_t *s)
{
    omv_trainer_times_t *tt = &s->tr.times;
    omv_trainer_int8_t *q = &s->tr.int8;
    if (tt->steps > 0) {
        double n = (double)tt->steps;
        omv_log_info("worker %u: %llu steps; per step %.2f ms computing, %.2f ms waiting for the "
                     "step's first parameters, %.2f ms for the rest of them, %.2f ms sending "
                     "gradients",
                     s->tp.worker_id, (unsigned long long)tt->steps, tt->compute_s * 1e3 / n,
                     tt->begin_s * 1e3 / n, tt->need_s * 1e3 / n, tt->send_s * 1e3 / n);
        *tt = (omv_trainer_times_t){0, 0.0, 0.0, 0.0, 0.0};
    }
    if (q->changes_got + q->wholes_got > 0)
        omv_log_info("worker %u: %llu shards of parameters came as int8 changes to our view of "
                     "them, %llu whole (fp32) to begin a view",
                     s->tp.worker_id, (unsigned long long)q->changes_got,
                     (unsigned long long)q->wholes_got);
    q->changes_got = q->wholes_got = 0;
}

/* Builds what the job needs the first time (or takes the Welcome's slice) and starts from the
 * daemon's model as it is now. Returns 0 or a negative errno. */
static int start(omv_session_t *s)
{
    const omv_jobspec_t *j = &s->job;
    omv_workload_t *w = &s->work;
    uint32_t batch = j->batch_size;
    if (batch == 0 || batch > 65536 || j->slice_count == 0) {
        omv_log_error("job gives a batch of %u images and a slice of %u", batch, j->slice_count);
        return -EPROTO;
    }
    int r = 0;
    if (!w->prepared) {
        r = omv_workload_prepare(s, batch);
        r = r < 0 ? r : alloc_buffers(s);
    } else if (j->slice_begin != w->slice_begin || j->slice_count != w->slice_count) {
        r = omv_workload_load(s, j->slice_begin, j->slice_count);
    }
    if (r < 0)
        return r;
    /* Every Welcome starts from the daemon's model as it is now (a restart may have gone back
     * to a checkpoint): what int8 rounding kept back from before is dropped, and so is our view
     * of it (new links, too, send whole shards first): it comes whole first. */
    if (s->tr.int8.residual)
        memset(s->tr.int8.residual, 0, j->param_count * sizeof(float));
    memset(s->tr.int8.view, 0, sizeof(s->tr.int8.view));
    s->tr.batch = 0; /* the first Params says, and the data position follows */
    omv_log_info("worker %u in group %u from step %llu: images [%u, %u), at most %u a step",
                 s->tp.worker_id, s->group, (unsigned long long)s->start_step, w->slice_begin,
                 w->slice_begin + w->slice_count, batch);
    return 0;
}

int omv_trainer_run(omv_session_t *s)
{
    omv_trainer_t *t = &s->tr;
    int r = start(s);
    if (r < 0)
        return r;
    /* A slower device is emulated after the compute: its pushes wait for the delay. */
    const omv_session_config_t *cfg = s->cfg;
    int overlap = !cfg->no_overlap && cfg->slowdown <= 1.0 && cfg->delay_max_ms <= 0;
    r = send_pull(s, s->start_step);
    for (uint64_t step = s->start_step; r == 0; step++) {
        double t0 = omv_time_s();
        r = begin_step(s, &step);
        t->times.begin_s += omv_time_s() - t0;
        if (r != 0)
            break;
        omv_workload_next_batch(&s->work, s->job.seed, t->batch);
        r = overlap ? overlapped_step(s) : serial_step(s);
    }
    log_summary(s);
    return r;
}
