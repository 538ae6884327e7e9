/* The daemon's checkpoints: what goes into one, when it is written, and resuming from one. */
#define OMV_LOG_TAG "checkpoint"
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "log.h"
#include "util.h"

static char *members_text(const omv_daemon_t *d)
{
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    for (uint32_t i = 0; i < d->n_members; i++) {
        const member_t *m = &d->members[i];
        if (m->state != MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER)
            continue;
        omv_strbuf_printf(&b, "%u %s %u %d\n", i + 1, m->host, m->pid,
                          omv_groups_of(d->groups, m->slot));
    }
    char *s = strdup(omv_strbuf_str(&b));
    omv_strbuf_fini(&b);
    return s;
}

int omv_daemon_checkpoint(omv_daemon_t *d, int finished)
{
    double t0 = omv_time_s();
    size_t n = d->layout.param_count;
    uint32_t groups = omv_groups_count(d->groups);
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    c.seq = ++d->ckpt_seq;
    omv_strlcpy(c.job_name, d->job.name, sizeof(c.job_name));
    c.finished = (uint32_t)finished;
    c.images_total = d->images_total;
    c.steps_total = d->steps_total;
    c.train_s = omv_daemon_train_seconds(d);
    c.n_groups = groups;
    c.param_count = n;
    c.params = d->gather_params;
    c.learning_rate = d->sgd.learning_rate;
    c.momentum = d->sgd.momentum;
    c.weight_decay = d->sgd.weight_decay;
    c.job_text = d->job_text;
    c.n_history = (uint32_t)d->n_history;
    int r = -ENOMEM;
    c.clocks = malloc(groups * sizeof(uint64_t));
    c.velocity = d->gather_velocity;
    c.history = calloc(d->n_history ? d->n_history : 1, sizeof(*c.history));
    c.members = members_text(d);
    char err[OMV_CHECKPOINT_ERR_MAX] = "out of memory";
    if (!c.clocks || !c.history || !c.members || omv_daemon_opt_save(d, &c.opt) < 0)
        goto out;
    if ((omv_daemon_opt_probing(d) || (d->reconfig.pending && d->reconfig.restore)) &&
        d->probe_params != NULL) {
        /* The shards hold a probe's model, which is thrown away (or one the optimizer is about
         * to replace with the base): the base is the model to keep, where the search runs again
         * from or the phase starts. */
        c.params = d->probe_params;
        c.velocity = d->probe_velocity;
    } else {
        r = omv_daemon_gather(d, 1);
        if (r < 0) {
            snprintf(err, sizeof(err), "cannot gather the model from the shard threads: %s",
                     omv_strerror(r));
            goto out;
        }
    }
    for (uint32_t g = 0; g < groups; g++)
        c.clocks[g] = omv_groups_clock(d->groups, g);
    for (size_t i = 0; i < d->n_history; i++)
        c.history[i] = (omv_checkpoint_eval_t){d->history[i].epoch, d->history[i].wall_s,
                                               d->history[i].accuracy, d->history[i].loss};
    r = omv_checkpoint_write(&c, d->ckpt_dir, d->ckpt_last_path, sizeof(d->ckpt_last_path), err);
out:
    d->ckpt_due = 0;
    d->ckpt_last_s = omv_time_s();
    uint64_t step = omv_groups_min_clock(d->groups);
    d->ckpt_last_step = step == UINT64_MAX ? 0 : step;
    if (r < 0) {
        d->ckpt_failed_total++;
        omv_log_error("checkpoint %" PRIu64 " failed: %s", c.seq, err);
    } else {
        d->ckpt_written_total++;
        d->ckpt_last_ms = (omv_time_s() - t0) * 1000.0;
        int removed = omv_checkpoint_prune(d->ckpt_dir, (unsigned)d->job.checkpoint_keep);
        omv_log_info("checkpoint %s written in %.0f ms (epoch %.2f, %" PRIu64 " images)%s",
                     d->ckpt_last_path, d->ckpt_last_ms, omv_daemon_epoch(d), d->images_total,
                     removed > 0 ? "; older ones pruned" : "");
    }
    /* Borrowed, not ours to free. */
    c.params = NULL;
    c.velocity = NULL;
    c.job_text = NULL;
    omv_checkpoint_fini(&c);
    return r;
}

void omv_daemon_checkpoint_if_due(omv_daemon_t *d)
{
    /* During a probe the shards hold a probe's model: wait for the phase, not to stall a probe
     * (its timing counts). One asked for now takes the search's base instead. */
    if (d->ckpt_due && d->ckpt_enabled && omv_groups_settled(d->groups) &&
        !omv_daemon_opt_probing(d))
        omv_daemon_checkpoint(d, d->state == JOB_DONE);
}

static void report_bad(void *ctx, const char *path, const char *reason)
{
    (void)ctx;
    (void)path;
    omv_log_warn("skipping checkpoint: %s", reason);
}

int omv_daemon_resume(omv_daemon_t *d)
{
    if (!d->job.checkpoint_resume)
        return 0;
    omv_checkpoint_t c;
    char path[sizeof(d->ckpt_resumed_from)];
    int r = omv_checkpoint_load_latest(&c, d->ckpt_dir, path, sizeof(path), report_bad, d);
    if (r < 0) {
        omv_log_error("cannot read checkpoint folder %s: %s", d->ckpt_dir, omv_strerror(r));
        return r;
    }
    if (r == 0) {
        omv_log_info("no checkpoint to resume in %s: starting from scratch", d->ckpt_dir);
        return 0;
    }
    if (c.param_count != d->layout.param_count || c.n_groups > omv_groups_max(d->groups)) {
        omv_log_error("%s was written for a model of %" PRIu64 " parameters in %u groups, but "
                      "job '%s' has %zu parameters and room for %u groups: move the folder %s "
                      "away, or set [checkpoint] resume = no to start from scratch",
                      path, c.param_count, c.n_groups, d->job.name, d->layout.param_count,
                      omv_groups_max(d->groups), d->ckpt_dir);
        omv_checkpoint_fini(&c);
        return -EINVAL;
    }
    /* A run that was regrouped goes on with the groups it had. */
    omv_groups_set_count(d->groups, c.n_groups);
    uint32_t groups = c.n_groups;
    memcpy(d->params, c.params, c.param_count * sizeof(float));
    for (uint32_t s = 0; s < d->n_shards; s++)
        memcpy(d->shards[s].velocity, c.velocity + d->shards[s].offset,
               d->shards[s].count * sizeof(float));
    for (uint32_t g = 0; g < groups; g++)
        omv_groups_set_clock(d->groups, g, c.clocks[g]);
    d->images_total = c.images_total;
    d->steps_total = c.steps_total;
    d->train_s_before = c.train_s;
    d->ckpt_seq = c.seq;
    for (uint32_t i = 0; i < c.n_history; i++) {
        d->eval_epoch = c.history[i].epoch;
        d->eval_wall_s = c.history[i].wall_s;
        eval_point_t *h = realloc(d->history, (d->n_history + 1) * sizeof(*h));
        if (h == NULL)
            break;
        d->history = h;
        d->cap_history = d->n_history + 1;
        d->history[d->n_history++] =
            (eval_point_t){c.history[i].epoch, c.history[i].wall_s, c.history[i].accuracy,
                           c.history[i].loss};
    }
    omv_daemon_opt_load(d, &c.opt);
    if (c.finished) {
        d->state = JOB_DONE;
        d->start_s = d->end_s = d->train_end_s = omv_time_s();
    }
    omv_strlcpy(d->ckpt_resumed_from, path, sizeof(d->ckpt_resumed_from));
    d->ckpt_resumed_epoch = omv_daemon_epoch(d);
    omv_strlcpy(d->ckpt_last_path, path, sizeof(d->ckpt_last_path));
    omv_log_info("resumed from %s: epoch %.2f, %" PRIu64 " images, %u evaluations%s", path,
                 omv_daemon_epoch(d), c.images_total, c.n_history,
                 c.finished ? "; the job was already done" : "");
    omv_checkpoint_fini(&c);
    return 1;
}
