/* The worker's session: registration through the transport (worker/transport.h), then the
 * trainer loop or the evaluator loop, and the engine and data they compute on. */
#define OMV_LOG_TAG "worker"
#include "session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bf16.h"
#include "blas.h"
#include "dataset.h"
#include "log.h"
#include "net.h"
#include "q8.h"
#include "rng.h"
#include "transport.h"
#include "util.h"

typedef struct omv_session omv_session_t;

/* What a job computes on in this worker: the engine built from its model, its data (a training
 * slice, or the test set) in a seeded order, and the buffers for the parameters and a batch.
 * Built once for a job, again when the daemon runs another. */
typedef struct {
    int prepared; /* built for the session's job */
    omv_model_layout_t layout;
    omv_net_t *net;
    omv_dataset_norm_t norm;
    omv_dataset_t data;
    uint32_t slice_begin, slice_count; /* the slice in data */
    uint32_t *order;                   /* [data.count] this pass's permutation */
    uint64_t epoch;                    /* passes over our slice */
    uint32_t cursor;                   /* next position in order */
    float *params;                     /* [param_count] */
    float *x;                          /* [batch][inputs] */
    uint8_t *y;                        /* [batch] */
    uint8_t *got; /* [n_shards] which shards of the parameters awaited arrived */
} omv_workload_t;

/* Wire int8: the worker's parameters are its view of the model (common/q8.h). */
typedef struct {
    /* The view we hold from each link's daemon or server (0: none, so its next Params come
     * whole), and the changes each shard had since its view began. */
    uint64_t view[1 + 2 * OMV_WIRE_MAX_SERVERS];
    uint32_t *seq;                    /* [n_shards] */
    uint64_t changes_got, wholes_got; /* shards that came as a change, and whole to start one */
    uint8_t *grad8;                   /* one shard's gradient as it travels */
    float *residual;                  /* [param_count] what rounding to int8 has not sent yet */
} omv_trainer_int8_t;

/* Where a trainer's steps go, summed for the log at the end: computing, waiting for a step's
 * first parameters (the group's other members and the apply), for the rest of them during
 * forward, and sending gradients (s). */
typedef struct {
    uint64_t steps;
    double compute_s, begin_s, need_s, send_s;
} omv_trainer_times_t;

typedef struct {
    float *grad;      /* [param_count] */
    uint16_t *grad16; /* [param_count] the gradient as bf16 travels */
    omv_trainer_int8_t int8;
    uint8_t *pushed;      /* [n_shards] which shards of the step went out */
    const float *p;       /* where this step's parameters are: a segment or the workload's */
    float *g;             /* and its gradient */
    uint32_t have;        /* shards of the pull that arrived */
    uint64_t asked, step; /* the step asked for, and the one the daemon gave */
    uint32_t batch;       /* images to compute this step (from the daemon) */
    int pulled;           /* the next step's pull went out */
    int hook_err;         /* what went wrong inside the engine's hooks */
    double hook_s;        /* time spent in the hooks this step (not computing), s */
    omv_trainer_times_t times;
    omv_rng_t delay_rng; /* the emulated slower device's delays */
} omv_trainer_t;

struct omv_session {
    const omv_session_config_t *cfg; /* borrowed */
    volatile sig_atomic_t *stop;     /* borrowed: nonzero when a signal asks us to stop */
    omv_transport_t tp;              /* the links to the daemon and the shard servers */
    /* What the last Welcome said. */
    int idle; /* registered with a daemon that has no job now */
    omv_jobspec_t job;
    uint32_t group; /* the compute group, as the daemon's Params say from step to step */
    uint64_t start_step;
    omv_workload_t work; /* the engine and data, built for job */
    omv_trainer_t tr;    /* a trainer's step and its buffers */
};

static int omv_workload_same_job(const omv_jobspec_t *a, const omv_jobspec_t *b)
{
    return strcmp(a->name, b->name) == 0 && a->param_count == b->param_count &&
           a->batch_size == b->batch_size && a->seed == b->seed &&
           a->eval_batch_size == b->eval_batch_size && strcmp(a->model, b->model) == 0 &&
           a->n_layers == b->n_layers &&
           memcmp(a->layers, b->layers, a->n_layers * sizeof(a->layers[0])) == 0 &&
           strcmp(a->data_format, b->data_format) == 0 &&
           strcmp(a->train_images, b->train_images) == 0 &&
           strcmp(a->train_labels, b->train_labels) == 0 &&
           strcmp(a->test_images, b->test_images) == 0 &&
           strcmp(a->test_labels, b->test_labels) == 0 && a->scale == b->scale &&
           a->n_mean == b->n_mean && a->n_std == b->n_std &&
           memcmp(a->mean, b->mean, a->n_mean * sizeof(a->mean[0])) == 0 &&
           memcmp(a->std, b->std, a->n_std * sizeof(a->std[0])) == 0 &&
           a->n_shards == b->n_shards && a->wire == b->wire &&
           memcmp(a->shard_offsets, b->shard_offsets, (a->n_shards + 1) * sizeof(uint32_t)) == 0;
}

static void omv_workload_release(omv_workload_t *self)
{
    free(self->got);
    free(self->order);
    free(self->y);
    free(self->x);
    free(self->params);
    self->got = NULL;
    self->order = NULL;
    self->y = NULL;
    self->x = NULL;
    self->params = NULL;
    omv_dataset_fini(&self->data);
    omv_net_destroy(&self->net);
    self->prepared = 0;
    self->slice_count = 0;
}

/* Checks the data as loaded against the model and the job's normalisation. */
static int check_data(const omv_workload_t *w, const omv_jobspec_t *j)
{
    const omv_shape_t *in = &w->layout.input;
    const omv_dataset_t *d = &w->data;
    if (d->channels * d->rows * d->cols != w->layout.inputs ||
        (in->h * in->w > 1 && d->channels != in->c)) {
        omv_log_error("images are %ux%ux%u but the model takes %ux%ux%u", d->channels, d->rows,
                      d->cols, in->c, in->h, in->w);
        return -EINVAL;
    }
    if ((j->n_mean > 1 && j->n_mean != d->channels) || (j->n_std > 1 && j->n_std != d->channels)) {
        omv_log_error("job normalises %u/%u channels but images have %u", j->n_mean, j->n_std,
                      d->channels);
        return -EINVAL;
    }
    if (d->max_label >= w->layout.classes) {
        omv_log_error("labels go up to %u but the model has %u classes", d->max_label,
                      w->layout.classes);
        return -EINVAL;
    }
    return 0;
}

static int omv_workload_load(omv_session_t *s, uint32_t begin, uint32_t count)
{
    omv_workload_t *w = &s->work;
    const omv_jobspec_t *j = &s->job;
    char err[OMV_CONFIG_ERR_MAX];
    omv_dataset_fini(&w->data);
    const char *format = j->data_format[0] ? j->data_format : "idx";
    int r;
    if (s->cfg->role == OMV_ROLE_TRAINER)
        r = omv_dataset_open(&w->data, format, j->train_images, j->train_labels, begin, count, err);
    else
        r = omv_dataset_open(&w->data, format, j->test_images, j->test_labels, 0, 0, err);
    if (r < 0) {
        omv_log_error("%s", err);
        return r;
    }
    r = check_data(w, j);
    if (r < 0)
        return r;
    free(w->order);
    w->order = malloc(((size_t)w->data.count ? w->data.count : 1) * sizeof(uint32_t));
    if (w->order == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < w->data.count; i++)
        w->order[i] = i;
    w->slice_begin = begin;
    w->slice_count = w->data.count;
    w->cursor = w->data.count; /* shuffle before the first batch */
    return 0;
}

static int omv_workload_prepare(omv_session_t *s, uint32_t batch)
{
    omv_workload_t *w = &s->work;
    const omv_jobspec_t *j = &s->job;
    char err[OMV_CONFIG_ERR_MAX];
    int r = j->model[0] ? omv_model_parse(&w->layout, j->model, "job's model", err)
                        : omv_model_layout(&w->layout, j->layers, j->n_layers);
    if (r < 0 || w->layout.param_count != j->param_count) {
        omv_log_error("job's model (%u parameters) does not lay out: %s", j->param_count,
                      r < 0 && j->model[0] ? err : "wrong parameter count");
        return -EPROTO;
    }
    w->norm.scale = j->scale;
    w->norm.n_mean = j->n_mean, w->norm.n_std = j->n_std;
    memcpy(w->norm.mean, j->mean, sizeof(w->norm.mean));
    memcpy(w->norm.std, j->std, sizeof(w->norm.std));
    int trainer = s->cfg->role == OMV_ROLE_TRAINER; /* evaluation sees the images as they are */
    w->norm.augment_pad = trainer ? j->augment_pad : 0;
    w->norm.augment_flip = trainer ? j->augment_flip : 0;
    r = omv_workload_load(s, j->slice_begin, j->slice_count);
    if (r < 0)
        return r;
    omv_transport_heartbeat(&s->tp); /* a large model takes a while to make */
    w->net = omv_net_new_threads(&w->layout, batch, (uint32_t)s->cfg->threads);
    if (w->net != NULL) {
        omv_net_seed(w->net, j->seed ^ ((uint64_t)s->tp.worker_id << 40));
        omv_net_set_tick(w->net, omv_transport_tick, &s->tp);
    }
    omv_transport_heartbeat(&s->tp);
    w->params = malloc(j->param_count * sizeof(float));
    w->x = malloc((size_t)batch * w->layout.inputs * sizeof(float));
    w->y = malloc(batch);
    w->got = calloc(j->n_shards, 1);
    if (!w->net || !w->params || !w->x || !w->y || !w->got) {
        omv_log_error("out of memory for a model of %u parameters, batch %u", j->param_count,
                      batch);
        return -ENOMEM;
    }
    w->prepared = 1;
    return 0;
}

/* Gathers images idx[0..n) of the slice into rows [row, row + n) of x (normalised,
 * channels-last) and y. */
static void gather_rows(omv_workload_t *w, uint32_t row, const uint32_t *idx, uint32_t n)
{
    omv_dataset_gather(&w->data, &w->norm, idx, n, w->x + (size_t)row * w->layout.inputs,
                       w->y + row);
}

static void omv_workload_gather(omv_workload_t *self, const uint32_t *idx, uint32_t n)
{
    gather_rows(self, 0, idx, n);
}

/* Shuffles for pass w->epoch, from the identity: a pass's order depends only on the seed, the
 * pass and the slice, so a worker can seek to any step. */
static void reshuffle(omv_workload_t *w, uint64_t seed)
{
    for (uint32_t i = 0; i < w->data.count; i++)
        w->order[i] = i;
    omv_rng_t rng;
    omv_rng_init(&rng,
                 seed ^ (w->epoch * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)w->slice_begin << 32));
    omv_rng_shuffle(&rng, w->order, w->data.count);
    w->norm.augment_seed = omv_rng_next(&rng); /* this pass's crops and flips */
    w->epoch++;
    w->cursor = 0;
}

/* Pass step / steps_per_pass, in that pass's order: so a worker that (re)joins at step t, after
 * a daemon restart say, goes on with the same images it would have had. */
static void omv_workload_seek(omv_workload_t *self, uint64_t seed, uint64_t step, uint32_t batch)
{
    uint32_t n = self->data.count;
    uint64_t per_pass = n >= batch ? n / batch : 0;
    if (per_pass == 0) {
        self->epoch = 0;
        self->cursor = n; /* cycled through from a fresh shuffle */
        return;
    }
    self->epoch = step / per_pass;
    reshuffle(self, seed); /* shuffles for pass epoch, then counts it */
    self->cursor = (uint32_t)((step % per_pass) * batch);
}

/* Passes over the slice in a seeded random order, reshuffled each pass (the tail shorter than a
 * batch waits for the next pass). A slice smaller than a batch is cycled through. */
static void omv_workload_next_batch(omv_workload_t *self, uint64_t seed, uint32_t batch)
{
    uint32_t n = self->data.count;
    if (n >= batch) {
        if (n - self->cursor < batch)
            reshuffle(self, seed);
        gather_rows(self, 0, self->order + self->cursor, batch);
        self->cursor += batch;
        return;
    }
    for (uint32_t done = 0; done < batch;) {
        if (self->cursor >= n)
            reshuffle(self, seed);
        uint32_t take = batch - done < n - self->cursor ? batch - done : n - self->cursor;
        gather_rows(self, done, self->order + self->cursor, take);
        self->cursor += take;
        done += take;
    }
}

static void omv_trainer_init(omv_trainer_t *self)
{
    memset(self, 0, sizeof(*self));
    omv_rng_init(&self->delay_rng, (uint64_t)getpid() * 0x9e3779b97f4a7c15ULL);
}

static void omv_trainer_release(omv_trainer_t *self)
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

static int omv_trainer_run(omv_session_t *s)
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

static int omv_evaluator_run(omv_session_t *s)
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

/* Frees what was built for the last job. */
static void release_job(omv_session_t *s)
{
    omv_trainer_release(&s->tr);
    omv_workload_release(&s->work);
}

/* One registration attempt, and what its Welcome says. Returns as omv_transport_hello, or as
 * omv_transport_attach. */
static int handshake(omv_session_t *s, int64_t deadline_ms, const omv_transport_retry_t *retry)
{
    omv_welcome_t w;
    int r = omv_transport_hello(&s->tp, deadline_ms, retry, &w);
    if (r != 0)
        return r;
    s->idle = w.idle;
    if (s->idle)
        return 0;
    s->group = w.group;
    s->start_step = w.start_step;
    if (s->work.prepared && !omv_workload_same_job(&s->job, &w.job)) {
        /* A daemon that runs jobs one after another: the next one may have another model or
         * other data, so the engine is built again from the new spec. */
        omv_log_info("the daemon runs job '%s' now (was '%s'): building its model", w.job.name,
                     s->job.name);
        release_job(s);
    }
    s->job = w.job;
    return omv_transport_attach(&s->tp, &w);
}

/* Registers, trying again with backoff until deadline_ms (0: forever). Returns 0,
 * OMV_WAIT_DONE, or a negative errno. */
static int register_with_backoff(omv_session_t *s, int64_t deadline_ms)
{
    omv_transport_retry_t retry = {0, 100};
    for (;;) {
        int r = omv_transport_connect(&s->tp);
        if (r < 0)
            return r;
        r = handshake(s, deadline_ms, &retry);
        if (r != -ETIMEDOUT)
            return r;
        r = omv_transport_backoff(&s->tp, deadline_ms, &retry);
        if (r < 0)
            return r;
    }
}

/* Registered while the daemon has no job: heartbeats until it says a job starts (Stop with
 * reconnect: register again to get it) or that we are not needed (Stop). */
static int idle(omv_session_t *s)
{
    omv_log_info("registered as worker %u; the daemon has no job yet: waiting for one",
                 s->tp.worker_id);
    for (;;) {
        omv_msg_t m;
        int r = omv_transport_wait(&s->tp, &m, 0);
        if (r != 0)
            return r;
        omv_log_warn("ignoring %s while there is no job", omv_msg_name(m.type));
    }
}

int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop)
{
    omv_session_t s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    s.stop = stop;
    omv_transport_init(&s.tp, cfg, stop);
    omv_trainer_init(&s.tr);
    /* The engine splits each batch over cfg->threads threads of its own; BLAS runs one thread
     * per call so that the two pools do not fight (measured: bench/bench_net.c). */
    omv_blas_set_threads(1);
    int64_t deadline = omv_time_ms() + cfg->hello_timeout_ms;
    int r;
    for (;;) {
        r = register_with_backoff(&s, deadline);
        if (r != 0)
            break;
        if (s.idle)
            r = idle(&s);
        else if (cfg->role == OMV_ROLE_TRAINER)
            r = omv_trainer_run(&s);
        else
            r = omv_evaluator_run(&s);
        if (r != OMV_WAIT_LOST)
            break;
        /* The daemon is gone or forgot us: find it again, for up to retry_ms. */
        omv_transport_drop(&s.tp);
        deadline = cfg->retry_ms > 0 ? omv_time_ms() + cfg->retry_ms : 0;
    }
    if (r == -EINTR) /* say goodbye, so that our group does not wait for our timeout */
        omv_transport_leave(&s.tp, "stopped by signal");
    if (r == OMV_WAIT_DONE)
        r = 0;
    release_job(&s);
    omv_transport_fini(&s.tp);
    return r;
}
