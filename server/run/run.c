/* Making and freeing a run: the job checked, the model laid out in shards, the groups, its
 * checkpoints (resuming from the newest), the optimizer, and the role it plays. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "log.h"
#include "run_priv.h"
#include "safetensors.h"
#include "util.h"

/* [model] init must read into the model, so that a job that cannot start is refused when it is
 * submitted. */
static int check_init(const omv_job_t *j, const omv_model_layout_t *layout, char *err)
{
    float *w = malloc((layout->param_count ? layout->param_count : 1) * sizeof(float));
    char why[OMV_SAFETENSORS_ERR_MAX];
    int r = w ? omv_safetensors_read(j->init, layout, w, why) : -ENOMEM;
    free(w);
    if (r < 0)
        snprintf(err, OMV_CONFIG_ERR_MAX, "[model] init: %s", r == -ENOMEM ? "no memory" : why);
    return r;
}

/* The most a member is given: a group's batch splits as evenly as it goes. */
static uint32_t worker_batch_of(const omv_job_t *j)
{
    uint32_t per_group = (uint32_t)(j->workers / j->groups);
    return (uint32_t)((j->batch_size + per_group - 1) / per_group);
}

int omv_run_check_job(const omv_job_t *j, uint32_t *ret_train_count, uint32_t *ret_worker_batch,
                      char *err)
{
    uint32_t count, channels, rows, cols;
    if (omv_dataset_probe_format(j->data_format, j->train_images, &count, &channels, &rows, &cols,
                                 err) < 0)
        return -EINVAL;
    if (channels * rows * cols != j->layers[0]) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: images are %ux%ux%u = %u values but the model takes %u inputs",
                 j->train_images, channels, rows, cols, channels * rows * cols, j->layers[0]);
        return -EINVAL;
    }
    if (j->train_limit > 0 && (uint64_t)j->train_limit < count)
        count = (uint32_t)j->train_limit;
    uint32_t worker_batch = worker_batch_of(j);
    if (count / (uint32_t)j->workers < worker_batch) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: %u images split over %lld workers leave fewer than a batch of %u per "
                 "worker",
                 j->train_images, count, (long long)j->workers, worker_batch);
        return -EINVAL;
    }
    omv_model_layout_t layout;
    if (omv_model_parse(&layout, j->model_text, j->model_name, err) < 0)
        return -EINVAL;
    if (j->init[0] && check_init(j, &layout, err) < 0)
        return -EINVAL;
    if (ret_train_count)
        *ret_train_count = count;
    if (ret_worker_batch)
        *ret_worker_batch = worker_batch;
    return 0;
}

int64_t omv_run_message_bytes(const omv_job_t *job)
{
    omv_model_layout_t layout;
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_model_parse(&layout, job->model_text, job->model_name, err) < 0)
        return -EINVAL;
    return (int64_t)layout.param_count * (int64_t)sizeof(float) + OMV_WIRE_MAX_ENVELOPE;
}

/* A job whose gradients would be cut off by the worker endpoint's frame limit cannot train. */
static int check_message_limit(const omv_run_t *r)
{
    int64_t limit = omv_router_max_message(r->env.router);
    int64_t need = (int64_t)r->layout.param_count * (int64_t)sizeof(float) + OMV_WIRE_MAX_ENVELOPE;
    if (limit <= 0 || need <= limit)
        return 0;
    omv_log_error("job '%s': its model's messages (%lld bytes) are over the worker endpoint's "
                  "limit of %lld bytes: raise [security] max_message_bytes and restart omnivored",
                  r->job.name, (long long)need, (long long)limit);
    return -EMSGSIZE;
}

static void log_model(const omv_run_t *r)
{
    char table[4096];
    omv_model_summary(&r->layout, table, sizeof(table));
    for (char *line = table, *eol; (eol = strchr(line, '\n')) != NULL; line = eol + 1)
        omv_log_info("model: %.*s", (int)(eol - line), line);
}

/* Takes up a checkpoint of this job: model, momentum, clocks, counters, evaluations and the
 * optimizer's state. */
static int resume(omv_run_t *r, const omv_checkpoint_t *c)
{
    /* A run that was regrouped goes on with the groups it had. */
    omv_groups_set_count(r->groups, c->n_groups);
    int e = omv_run_restore_state(r, c);
    if (e < 0)
        return e;
    for (uint32_t g = 0; g < c->n_groups; g++)
        omv_groups_set_clock(r->groups, g, c->clocks[g]);
    r->stats.images_total = c->images_total;
    r->line.last_images = c->images_total; /* the first progress line's images/s counts from here */
    r->stats.steps_total = c->steps_total;
    r->times.train_s_before = c->train_s;
    for (uint32_t i = 0; i < c->n_history; i++)
        if (omv_eval_add(&r->eval, c->history[i].epoch, c->history[i].wall_s,
                         c->history[i].accuracy, c->history[i].loss) < 0)
            break;
    omv_tuner_load(r->tuner, &c->opt);
    if (c->finished) {
        /* Its final checkpoint, written after its final evaluation (if it had one). */
        r->final.eval = c->n_history > 0;
        r->final.ckpt = 1;
        r->state = OMV_JOB_DONE;
        r->times.start_s = r->times.end_s = r->times.train_end_s = omv_time_s();
    }
    r->ckpt.resumed_epoch = omv_run_epoch(r);
    omv_log_info("resumed from %s: epoch %.2f, %llu images, %u evaluations%s", r->ckpt.resumed_from,
                 omv_run_epoch(r), (unsigned long long)c->images_total, c->n_history,
                 c->finished ? "; the job was already done" : "");
    return 0;
}

/* Checkpoints: the folder, and resuming from the newest when there is one. */
static int setup_checkpoints(omv_run_t *r)
{
    omv_checkpoint_t c;
    int e = omv_run_ckpt_find(&r->ckpt, &r->job, r->layout.param_count, r->max_groups, &c);
    if (e == 1) {
        e = resume(r, &c);
        omv_checkpoint_fini(&c);
    }
    if (r->eval.n_history)
        r->eval.next_epoch =
            r->eval.history[r->eval.n_history - 1].epoch + r->job.eval_every_epochs;
    return e < 0 ? e : 0;
}

/* The model, its shards, the groups and the per-group sums. */
static int setup_model(omv_run_t *r)
{
    char err[OMV_CONFIG_ERR_MAX];
    const omv_job_t *j = &r->job;
    /* A shard server reads no data: the coordinator checked it. */
    int e = 0;
    if (omv_run_is_server(r)) /* its training images are the coordinator's (the role's) */
        r->plan.worker_batch = worker_batch_of(j);
    else
        e = omv_run_check_job(j, &r->plan.train_count, &r->plan.worker_batch, err);
    if (e == 0)
        e = omv_model_parse(&r->layout, j->model_text, j->model_name, err);
    if (e < 0) {
        omv_log_error("%s", err);
        return -EINVAL;
    }
    e = check_message_limit(r);
    if (e < 0)
        return e;
    r->plan.target_images = (uint64_t)r->plan.train_count * (uint64_t)j->epochs;
    log_model(r);
    /* Room for workers that join beyond the planned ones, and for replacements; and for as
     * many groups as there are slots: regrouping may use them. */
    r->n_slots = (uint32_t)j->workers * 2 + 16;
    r->max_groups = r->n_slots > (uint32_t)j->groups ? r->n_slots : (uint32_t)j->groups;
    r->sums.images = calloc(r->max_groups, sizeof(uint64_t));
    r->sums.loss_sum = calloc(r->max_groups, sizeof(double));
    r->sums.loss_n = calloc(r->max_groups, sizeof(uint32_t));
    r->sums.planned = calloc(r->max_groups, sizeof(uint64_t));
    r->freeze.at = calloc(r->max_groups, sizeof(uint64_t));
    if (!r->sums.images || !r->sums.loss_sum || !r->sums.loss_n || !r->sums.planned ||
        !r->freeze.at)
        return -ENOMEM;
    r->shards = omv_shardset_new(r->env.router, r->env.refusals, &r->layout, (uint32_t)j->shards,
                                 r->max_groups, (uint64_t)j->seed, j->update != OMV_JOB_UPDATE_SGD);
    if (r->shards == NULL)
        return -errno;
    if (!omv_run_is_server(r)) { /* a shard server holds the range its role set */
        r->lo = 0;
        r->hi = r->shards->n_shards;
    }
    /* A shard server makes its range from [model] init when the coordinator asks it to. */
    if (j->init[0] && !omv_run_is_server(r) && omv_run_load_init(r, j->init) < 0)
        return -EINVAL;
    if (omv_run_remote(r) && r->shards->n_shards < (uint32_t)j->servers) {
        omv_log_error("job '%s': the model splits into only %u shards along its layers, fewer "
                      "than [cluster] servers = %lld: give fewer servers",
                      j->name, r->shards->n_shards, (long long)j->servers);
        return -EINVAL;
    }
    if (omv_run_is_server(r) && (r->lo >= r->hi || r->hi > r->shards->n_shards)) {
        omv_log_error("the coordinator assigns shards [%u, %u) of %u", r->lo, r->hi,
                      r->shards->n_shards);
        return -EINVAL;
    }
    omv_groups_events_t ev = omv_run_group_events(r);
    /* A coordinator with shard servers counts one report per member and step; a shard server
     * the shards it holds. */
    uint32_t counted = omv_run_remote(r) ? 1 : r->hi - r->lo;
    r->groups = omv_groups_new(r->n_slots, (uint32_t)j->groups, counted, j->staleness, &ev);
    if (r->groups == NULL)
        return -ENOMEM;
    r->sgd = (omv_sgd_t){
        .learning_rate = (float)j->learning_rate,
        .momentum = (float)(j->update == OMV_UPDATE_SGD ? j->momentum : j->beta1),
        .weight_decay = (float)j->weight_decay,
        .kind = j->update == OMV_JOB_UPDATE_ADAMW  ? OMV_UPDATE_ADAMW
                : j->update == OMV_JOB_UPDATE_ADAM ? OMV_UPDATE_ADAM
                                                   : OMV_UPDATE_SGD,
        .beta2 = j->beta2,
        .epsilon = (float)j->epsilon,
    };
    omv_log_info("job '%s': model %s (%zu parameters in %u shards), %u training images, "
                 "%u per worker step; %s",
                 j->name, j->layers_text[0] ? j->layers_text : j->definition, r->layout.param_count,
                 r->shards->n_shards, r->plan.train_count, r->plan.worker_batch,
                 j->wire == OMV_WIRE_INT8
                     ? "gradients travel as int8 (a scale per 64 values, error feedback), "
                       "parameters as int8 changes to each worker's copy"
                 : j->wire == OMV_WIRE_BF16 ? "parameters and gradients travel as bf16"
                                            : "parameters and gradients travel as fp32");
    int bn = r->layout.state_offset < r->layout.param_count;
    omv_log_info("update rule %s: learning rate %g (schedule %s, warmup %lld updates), %s %g, "
                 "weight decay %g%s",
                 j->update_name, j->learning_rate, j->schedule_name, (long long)j->warmup_steps,
                 j->update == OMV_JOB_UPDATE_SGD ? "momentum" : "beta1", (double)r->sgd.momentum,
                 j->weight_decay, bn ? "; batch norm statistics: each group's mean" : "");
    return 0;
}

/* What one daemon or a coordinator has beside the model: its checkpoints' folder, the optimizer,
 * and the checkpoint it resumes from. */
static int setup_job(omv_run_t *r)
{
    int e = omv_run_ckpt_init(&r->ckpt, &r->job, r->env.state_dir, r->env.checkpoint_root);
    if (e < 0)
        return e;
    if (r->job.optimizer) {
        /* Its decisions file goes beside the checkpoints. The coordinator's decides for the
         * shard servers, and tells them at each cut. */
        r->tuner = omv_tuner_new(&r->job, r->ckpt.enabled ? r->ckpt.dir : NULL);
        if (r->tuner == NULL)
            return -ENOMEM;
    }
    return setup_checkpoints(r);
}

omv_run_t *omv_run_new(const omv_run_env_t *env, const omv_job_t *job, const char *path,
                       const char *text, uint64_t id)
{
    omv_run_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->env = *env;
    r->id = id;
    r->job = *job;
    r->role = env->role;
    r->state = OMV_JOB_WAITING;
    r->times.load_s = omv_time_s();
    omv_strlcpy(r->path, path, sizeof(r->path));
    omv_eval_init(&r->eval, job->eval_every_epochs);
    omv_timeline_init(&r->timeline);
    int e = -ENOMEM;
    r->text = strdup(text ? text : "");
    if (r->text == NULL)
        goto fail;
    if (r->role && r->role->init && (e = r->role->init(r, env->role_arg)) < 0)
        goto fail;
    e = setup_model(r);
    /* A shard server's coordinator checkpoints, evaluates and tunes. */
    if (e == 0 && !omv_run_is_server(r))
        e = setup_job(r);
    if (e == 0 && r->role && r->role->ready)
        e = r->role->ready(r);
    if (e < 0)
        goto fail;
    if (!omv_run_is_server(r))
        omv_log_info("job %llu '%s' loaded from %s; %u of %u shards have a thread",
                     (unsigned long long)id, r->job.name, path, r->shards->threaded,
                     r->shards->n_shards);
    return r;
fail:
    omv_run_destroy(&r);
    errno = e < 0 ? -e : ENOMEM;
    return NULL;
}

void omv_run_destroy(omv_run_t **self_p)
{
    omv_run_t *r = *self_p;
    if (r == NULL)
        return;
    /* Its workers (told at the end of the job) register again; records stay for their ids. */
    for (uint32_t i = 0; i < r->env.members->n; i++)
        if (r->env.members->records[i].state == OMV_MEMBER_ALIVE)
            r->env.members->records[i].state = OMV_MEMBER_DONE;
    if (r->role && r->role->fini)
        r->role->fini(r);
    free(r->freeze.at);
    omv_shardset_destroy(&r->shards);
    /* Segments are the size of this job's model: the next job's workers get their own. */
    for (uint32_t i = 0; i < r->env.members->n; i++)
        omv_members_shm_release(&r->env.members->records[i]);
    omv_groups_destroy(&r->groups);
    omv_tuner_destroy(&r->tuner);
    omv_timeline_fini(&r->timeline);
    omv_eval_fini(&r->eval);
    free(r->sums.images);
    free(r->sums.loss_sum);
    free(r->sums.loss_n);
    free(r->sums.planned);
    free(r->text);
    free(r);
    *self_p = NULL;
}

void omv_run_drain_shards(omv_run_t *r)
{
    omv_shardset_drain(r->shards);
}
