/* The run's checkpoints: when one is written and what goes in it (the model, or a probe's base
 * while the optimizer searches), and putting a checkpoint's or [model] init's state into the
 * shards. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"
#include "run_priv.h"
#include "safetensors.h"
#include "util.h"

/* Writes a checkpoint now. Returns 0 or a negative errno (logged, counted). */
int omv_run_write_checkpoint(omv_run_t *r)
{
    omv_run_ckpt_view_t v = {
        .job = &r->job,
        .job_text = r->text,
        .finished = r->state == OMV_JOB_DONE,
        .images_total = r->stats.images_total,
        .steps_total = r->stats.steps_total,
        .train_s = omv_run_train_seconds(r),
        .epoch = omv_run_epoch(r),
        .groups = r->groups,
        .members = r->env.members,
        .sgd = r->sgd,
        .param_count = r->layout.param_count,
        .eval = &r->eval,
        .tuner = r->tuner,
    };
    r->ckpt.forced = 0;
    int e;
    if (r->role && r->role->save && r->role->save(r, &v, &e))
        return e; /* the model is on shard servers */
    if ((omv_tuner_probing(r->tuner) || (r->reconfig.pending && r->reconfig.restore)) &&
        omv_shardset_has_probe_base(r->shards)) {
        /* The shards hold a probe's model, which is thrown away (or one the optimizer is about
         * to replace with the base): the base is the model to keep, where the search runs again
         * from or the phase starts. */
        v.params = r->shards->probe_params;
        v.velocity = r->shards->probe_velocity;
        v.second = r->shards->probe_second;
        v.adam_steps = r->shards->probe_steps[0];
    } else {
        e = omv_shardset_gather(r->shards, 1);
        if (e < 0) {
            uint64_t step = omv_groups_min_clock(r->groups);
            r->ckpt.due = 0;
            r->ckpt.failed_total++;
            r->ckpt.last_s = omv_time_s();
            r->ckpt.last_step = step == UINT64_MAX ? 0 : step; /* not again at once */
            omv_log_error("checkpoint failed: cannot gather the model from the shard threads: %s",
                          omv_strerror(e));
            return e;
        }
        v.params = r->shards->gather_params;
        v.velocity = r->shards->gather_velocity;
        v.second = r->shards->gather_second;
        v.adam_steps = r->shards->gather_steps[0];
    }
    return omv_run_ckpt_write(&r->ckpt, &v);
}

/* Writes a due checkpoint when no group is half-way through applying a step. During a probe the
 * shards hold a probe's model: wait for the phase, not to stall a probe (its timing counts),
 * unless one was asked for by hand, which takes the search's base instead. */
void omv_run_checkpoint_if_due(omv_run_t *r)
{
    if (r->role && r->role->checkpoint_due && r->role->checkpoint_due(r))
        return; /* the role writes it at a cut of its servers */
    if (r->ckpt.due && r->ckpt.enabled && omv_groups_settled(r->groups) &&
        (!omv_tuner_probing(r->tuner) || r->ckpt.forced))
        omv_run_write_checkpoint(r);
}

int omv_run_request_checkpoint(omv_run_t *r, char *why, size_t cap)
{
    if (!r->ckpt.enabled) {
        snprintf(why, cap,
                 "checkpoints are off: the daemon cannot write to '%s'; set [daemon] state_dir or "
                 "the job's [checkpoint] dir",
                 r->ckpt.dir);
        return -EINVAL;
    }
    if (r->state == OMV_JOB_WAITING) {
        snprintf(why, cap, "job '%s' has not started: nothing to checkpoint yet", r->job.name);
        return -EAGAIN;
    }
    r->ckpt.due = 1;
    r->ckpt.forced = 1;
    omv_run_checkpoint_if_due(r);
    return 0;
}

/* Puts a checkpoint's model and optimizer state into the shards. State written by another
 * update rule (SGD's momentum for Adam, or Adam's moments for SGD) does not carry over: that
 * part starts afresh. */
int omv_run_restore_state(omv_run_t *r, const omv_checkpoint_t *c)
{
    int adam = r->shards->adam;
    if (adam != (c->second != NULL)) {
        omv_log_warn("%s holds %s state and the job trains with %s: the parameters carry over, "
                     "the optimizer state starts afresh",
                     r->ckpt.resumed_from, c->second ? "Adam's" : "SGD's", r->job.update_name);
        return omv_shardset_restore(r->shards, c->params, NULL, NULL, NULL);
    }
    uint64_t steps[OMV_WIRE_MAX_SHARDS]; /* one count for every shard */
    for (uint32_t s = 0; s < r->shards->n_shards; s++)
        steps[s] = c->adam_steps;
    return omv_shardset_restore(r->shards, c->params, c->velocity, c->second, adam ? steps : NULL);
}

/* [model] init: the job starts from a safetensors file's weights (its optimizer state fresh).
 * A checkpoint to resume from comes after and wins. Returns 0 or -EINVAL (logged). */
int omv_run_load_init(omv_run_t *r, const char *path)
{
    char err[OMV_SAFETENSORS_ERR_MAX];
    float *w = malloc(r->layout.param_count * sizeof(float));
    int e = w ? omv_safetensors_read(path, &r->layout, w, err) : -ENOMEM;
    if (e == 0)
        e = omv_shardset_restore(r->shards, w, NULL, NULL, NULL);
    else
        omv_log_error("[model] init: %s", w ? err : "out of memory");
    free(w);
    if (e == 0)
        omv_log_info("model initialised from %s", path);
    return e < 0 ? -EINVAL : 0;
}
