/* What a job computes on in this worker: its engine, its data in a seeded order, and the
 * buffers for the parameters and a batch. */
#define OMV_LOG_TAG "worker"
#include "workload.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rng.h"
#include "session_priv.h"

int omv_workload_same_job(const omv_jobspec_t *a, const omv_jobspec_t *b)
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

void omv_workload_release(omv_workload_t *self)
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

int omv_workload_load(omv_session_t *s, uint32_t begin, uint32_t count)
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

int omv_workload_prepare(omv_session_t *s, uint32_t batch)
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

void omv_workload_gather(omv_workload_t *self, const uint32_t *idx, uint32_t n)
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
void omv_workload_seek(omv_workload_t *self, uint64_t seed, uint64_t step, uint32_t batch)
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
void omv_workload_next_batch(omv_workload_t *self, uint64_t seed, uint32_t batch)
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
