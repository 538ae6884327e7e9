/* omnivored's control commands: status, workers, summary, checkpoint, shutdown, help. */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon_priv.h"
#include "kv.h"
#include "log.h"
#include "util.h"


static void history_json(const omv_daemon_t *d, omv_strbuf_t *out)
{
    omv_strbuf_append(out, "[", 1);
    for (size_t i = 0; i < d->n_history; i++) {
        const eval_point_t *h = &d->history[i];
        omv_strbuf_printf(out,
                          "%s{\"epoch\":%.4f,\"wall_seconds\":%.3f,\"test_accuracy\":%.4f,"
                          "\"test_loss\":%.4f}",
                          i ? "," : "", h->epoch, h->wall_s, h->accuracy, h->loss);
    }
    omv_strbuf_append(out, "]", 1);
}

static double images_per_second(const omv_daemon_t *d)
{
    double s = omv_daemon_train_seconds(d);
    return s > 0 ? (double)d->images_total / s : 0.0;
}

static void reply_status(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    omv_kv_section(&kv, "daemon");
    omv_kv_str(&kv, "version", OMV_VERSION);
    omv_kv_int(&kv, "protocol_version", OMV_PROTOCOL_VERSION);
    omv_kv_int(&kv, "pid", getpid());
    omv_kv_double(&kv, "uptime_seconds", omv_time_s() - d->created_s, 1);
    omv_kv_str(&kv, "endpoint", d->cfg.endpoint);
    omv_kv_section(&kv, "job");
    omv_kv_str(&kv, "name", d->job.name);
    omv_kv_str(&kv, "file", d->job_path);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    if (d->state == JOB_FAILED)
        omv_kv_str(&kv, "reason", d->fail_reason);
    omv_kv_double(&kv, "epoch", omv_daemon_epoch(d), 3);
    omv_kv_int(&kv, "epochs", d->job.epochs);
    uint64_t step = omv_groups_min_clock(d->groups);
    omv_kv_int(&kv, "step", step == UINT64_MAX ? 0 : (int64_t)step);
    /* The clock a group will have at the end if every group keeps its full batch. */
    uint64_t per_group_step = (uint64_t)d->job.batch_size * (uint64_t)d->job.groups;
    omv_kv_int(&kv, "total_steps", (int64_t)(d->target_images / per_group_step));
    omv_kv_int(&kv, "target_images", (int64_t)d->target_images);
    omv_kv_int(&kv, "images_total", (int64_t)d->images_total);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 1);
    omv_kv_double(&kv, "loss", d->last_loss, 4);
    omv_kv_double(&kv, "test_accuracy", d->n_history ? d->history[d->n_history - 1].accuracy : NAN, 4);
    omv_kv_double(&kv, "wall_seconds", omv_daemon_wall_seconds(d), 2);
    omv_kv_section(&kv, "cluster");
    omv_kv_int(&kv, "workers_expected", d->job.workers);
    omv_kv_int(&kv, "workers_registered", (int64_t)d->joins_total);
    omv_kv_int(&kv, "workers_alive", omv_daemon_live_trainers(d));
    omv_kv_int(&kv, "joins_total", (int64_t)d->joins_total);
    omv_kv_int(&kv, "rejoins_total", (int64_t)d->rejoins_total);
    omv_kv_int(&kv, "leaves_total", (int64_t)d->leaves_total);
    omv_kv_int(&kv, "deaths_total", (int64_t)d->deaths_total);
    omv_kv_int(&kv, "evaluator_alive", d->evaluator != 0);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_int(&kv, "staleness", d->job.staleness);
    omv_kv_int(&kv, "shards", d->n_shards);
    omv_kv_int(&kv, "staleness_max_observed", (int64_t)d->staleness_max_observed);
    omv_kv_int(&kv, "late_gradients_total", (int64_t)d->late_total);
    omv_strbuf_t clocks;
    omv_strbuf_init(&clocks);
    omv_strbuf_append(&clocks, json ? "[" : "", json ? 1 : 0);
    for (uint32_t g = 0; g < omv_groups_count(d->groups); g++)
        omv_strbuf_printf(&clocks, "%s%llu", g ? (json ? "," : " ") : "",
                          (unsigned long long)omv_groups_clock(d->groups, g));
    omv_strbuf_append(&clocks, json ? "]" : "", json ? 1 : 0);
    omv_kv_raw(&kv, "group_clocks", omv_strbuf_str(&clocks));
    omv_strbuf_fini(&clocks);
    omv_kv_section(&kv, "checkpoint");
    omv_kv_str(&kv, "dir", d->ckpt_enabled ? d->ckpt_dir : "(off)");
    omv_kv_str(&kv, "last_path", d->ckpt_last_path);
    omv_kv_int(&kv, "written_total", (int64_t)d->ckpt_written_total);
    omv_kv_int(&kv, "failed_total", (int64_t)d->ckpt_failed_total);
    omv_kv_double(&kv, "last_write_ms", d->ckpt_last_ms, 1);
    omv_kv_str(&kv, "resumed_from", d->ckpt_resumed_from);
    omv_kv_section(&kv, "refusals");
    char key[64];
    uint64_t total = 0;
    for (int i = 1; i < OMV_REFUSE_COUNT_; i++) {
        snprintf(key, sizeof(key), "refused_%s_total", omv_refuse_name((omv_refuse_t)i));
        omv_kv_int(&kv, key, (int64_t)d->refused[i]);
        total += d->refused[i];
    }
    omv_kv_int(&kv, "refused_total", (int64_t)total);
    omv_kv_end(&kv);
}

static void reply_workers(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, json);
    int64_t now = omv_time_ms();
    for (uint32_t i = 0; i < d->n_members; i++) {
        const member_t *m = &d->members[i];
        if (!m->used)
            continue;
        char name[32];
        snprintf(name, sizeof(name), "worker %u", i + 1);
        omv_kv_section(&kv, name);
        omv_kv_str(&kv, "role", m->role == OMV_ROLE_TRAINER ? "trainer" : "evaluator");
        omv_kv_str(&kv, "host", m->host);
        omv_kv_int(&kv, "pid", m->pid);
        omv_kv_str(&kv, "state", omv_daemon_member_state(m));
        int group = m->role == OMV_ROLE_TRAINER && m->state == MEMBER_ALIVE
                        ? omv_groups_of(d->groups, m->slot)
                        : -1;
        omv_kv_int(&kv, "group", group);
        omv_kv_int(&kv, "steps", (int64_t)m->steps);
        omv_kv_int(&kv, "images", (int64_t)m->images);
        omv_kv_double(&kv, "compute_ms", m->last_compute_ms, 1);
        omv_kv_int(&kv, "slice_begin", m->slice_begin);
        omv_kv_int(&kv, "slice_count", m->slice_count);
        omv_kv_int(&kv, "previous_id", m->previous_id);
        omv_kv_int(&kv, "last_seen_ms", now - m->last_seen_ms);
    }
    omv_kv_end(&kv);
}

static void reply_summary(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    double acc = d->n_history ? d->history[d->n_history - 1].accuracy : NAN;
    double loss = d->n_history ? d->history[d->n_history - 1].loss : NAN;
    if (json) {
        omv_strbuf_append(out, "{\"job\":", 7);
        omv_strbuf_json_string(out, d->job.name);
        omv_strbuf_printf(out, ",\"state\":\"%s\"", omv_daemon_state_names[d->state]);
        if (isfinite(acc))
            omv_strbuf_printf(out, ",\"test_accuracy\":%.4f,\"test_loss\":%.4f", acc, loss);
        else
            omv_strbuf_printf(out, ",\"test_accuracy\":null,\"test_loss\":null");
        omv_strbuf_printf(out,
                          ",\"epochs\":%.3f,\"wall_seconds\":%.3f,\"images_per_second\":%.1f,"
                          "\"images_total\":%llu,\"workers\":%lld,\"groups\":%lld,"
                          "\"staleness\":%lld,\"batch_size\":%lld,\"learning_rate\":%g,"
                          "\"momentum\":%g,\"workers_alive\":%d,\"joins_total\":%llu,"
                          "\"deaths_total\":%llu,\"leaves_total\":%llu,\"checkpoint\":",

                          omv_daemon_epoch(d), omv_daemon_wall_seconds(d), images_per_second(d),
                          (unsigned long long)d->images_total, (long long)d->job.workers,
                          (long long)d->job.groups, (long long)d->job.staleness,
                          (long long)d->job.batch_size, d->job.learning_rate, d->job.momentum,
                          omv_daemon_live_trainers(d), (unsigned long long)d->joins_total,
                          (unsigned long long)d->deaths_total,
                          (unsigned long long)d->leaves_total);
        omv_strbuf_json_string(out, d->ckpt_last_path);
        omv_strbuf_append(out, ",\"resumed_from\":", 16);
        omv_strbuf_json_string(out, d->ckpt_resumed_from);
        omv_strbuf_append(out, ",\"history\":", 11);
        history_json(d, out);
        omv_strbuf_append(out, "}\n", 2);
        return;
    }
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "summary");
    omv_kv_str(&kv, "job", d->job.name);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    omv_kv_double(&kv, "test_accuracy", acc, 4);
    omv_kv_double(&kv, "test_loss", loss, 4);
    omv_kv_double(&kv, "epochs", omv_daemon_epoch(d), 2);
    omv_kv_double(&kv, "wall_seconds", omv_daemon_wall_seconds(d), 1);
    omv_kv_double(&kv, "images_per_second", images_per_second(d), 0);
    omv_kv_int(&kv, "workers", d->job.workers);
    omv_kv_int(&kv, "groups", d->job.groups);
    omv_kv_str(&kv, "checkpoint", d->ckpt_last_path);
    if (d->ckpt_resumed_from[0])
        omv_kv_str(&kv, "resumed_from", d->ckpt_resumed_from);
    omv_kv_section(&kv, "history");
    for (size_t i = 0; i < d->n_history; i++) {
        char key[32], val[128];
        snprintf(key, sizeof(key), "eval_%zu", i + 1);
        snprintf(val, sizeof(val), "epoch=%.2f wall_seconds=%.1f test_accuracy=%.4f",
                 d->history[i].epoch, d->history[i].wall_s, d->history[i].accuracy);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_end(&kv);
}

int omv_daemon_on_control(void *ctx, int argc, char **argv, omv_strbuf_t *reply)
{
    omv_daemon_t *d = ctx;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            omv_strbuf_printf(reply, "'%s' takes no argument '%s'", argv[0], argv[i]);
            return -EINVAL;
        }
    }
    if (strcmp(argv[0], "status") == 0) {
        reply_status(d, reply, json);
    } else if (strcmp(argv[0], "workers") == 0) {
        reply_workers(d, reply, json);
    } else if (strcmp(argv[0], "summary") == 0) {
        reply_summary(d, reply, json);
    } else if (strcmp(argv[0], "checkpoint") == 0) {
        if (!d->ckpt_enabled) {
            omv_strbuf_printf(reply, "checkpoints are off: the daemon cannot write to '%s'; set "
                                     "[daemon] state_dir or the job's [checkpoint] dir",
                              d->ckpt_dir);
            return -EINVAL;
        }
        if (d->state == JOB_WAITING) {
            omv_strbuf_printf(reply, "job '%s' has not started: nothing to checkpoint yet",
                              d->job.name);
            return -EAGAIN;
        }
        if (omv_daemon_settle(d, 1000) < 0) {
            d->ckpt_due = 1;
            omv_strbuf_printf(reply, "a group is applying a step; the checkpoint will be written "
                                     "when it is done (see status)\n");
            return 0;
        }
        int r = omv_daemon_checkpoint(d, d->state == JOB_DONE);
        if (r < 0) {
            omv_strbuf_printf(reply, "checkpoint failed: %s (see the daemon's log)",
                              omv_strerror(r));
            return r;
        }
        omv_kv_t kv;
        omv_kv_begin(&kv, reply, json);
        omv_kv_section(&kv, "checkpoint");
        omv_kv_str(&kv, "path", d->ckpt_last_path);
        omv_kv_double(&kv, "write_ms", d->ckpt_last_ms, 1);
        omv_kv_end(&kv);
    } else if (strcmp(argv[0], "shutdown") == 0) {
        omv_log_info("shutdown requested over the control socket");
        d->shutdown = 1;
        omv_strbuf_printf(reply, "shutting down\n");
    } else if (strcmp(argv[0], "help") == 0) {
        omv_strbuf_printf(reply, "commands: status, workers, summary, checkpoint, shutdown, "
                                 "help (--json for JSON)\n");
    } else {
        omv_strbuf_printf(reply, "unknown command '%s'; try 'help'", argv[0]);
        return -EINVAL;
    }
    return 0;
}

