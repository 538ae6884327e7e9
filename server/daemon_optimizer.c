/* The daemon's side of the optimizer: feeding it each group step, carrying out its commands
 * between steps (regroup, momentum and learning rate, the probe snapshot), and its decisions
 * file. The procedure itself is in optimizer.c. */
#define OMV_LOG_TAG "optimizer"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "kv.h"
#include "log.h"
#include "util.h"

int omv_daemon_opt_start(omv_daemon_t *d)
{
    const omv_job_t *j = &d->job;
    if (!j->optimizer || d->opt != NULL)
        return 0;
    omv_optimizer_params_t p;
    omv_optimizer_params_init(&p, (uint32_t)j->workers);
    p.groups = j->tune_groups ? OMV_OPT_TUNE : (int32_t)j->groups;
    p.momentum = j->tune_momentum ? -1.0 : j->momentum;
    p.lr = j->tune_learning_rate ? -1.0 : j->learning_rate;
    p.phase_steps = (uint32_t)j->phase_steps;
    p.probe_steps = (uint32_t)j->probe_steps;
    p.later_probe_steps = (uint32_t)j->later_probe_steps;
    p.first_grid_cold_lr = j->first_grid_cold_lr != 0;
    d->opt = omv_optimizer_new(&p);
    if (d->opt == NULL) {
        int r = -errno;
        omv_log_error("cannot start the optimizer: %s (check [optimizer] and [cluster] groups: a "
                      "fixed number of groups must divide the workers)",
                      omv_strerror(r));
        return r;
    }
    if (d->ckpt_enabled) {
        /* Appended to: a resumed job's decisions follow those made before the restart. */
        snprintf(d->decisions_path, sizeof(d->decisions_path), "%s/decisions.jsonl", d->ckpt_dir);
        d->decisions = fopen(d->decisions_path, "a");
        if (d->decisions == NULL)
            omv_log_warn("cannot write %s: %s; decisions are only in status", d->decisions_path,
                         omv_strerror(-errno));
    }
    int live = omv_daemon_live_trainers(d);
    if (live > 0)
        omv_optimizer_set_workers(d->opt, (uint32_t)live, omv_time_s());
    if (d->opt_resume) {
        d->opt_resume = 0;
        int r = omv_optimizer_restore(d->opt, &d->opt_saved, omv_time_s());
        if (r < 0)
            omv_log_warn("the checkpoint's optimizer state (phase %u, g=%u) does not fit this "
                         "job; the optimizer starts cold",
                         d->opt_saved.phase, d->opt_saved.groups);
        else if (d->opt_saved.phase > 0)
            omv_log_info("optimizer resumed: phase %u %s (g=%u, momentum %g, lr %g)",
                         d->opt_saved.phase,
                         d->opt_saved.running ? "goes on" : "is over: its search runs again",
                         d->opt_saved.groups, d->opt_saved.momentum, d->opt_saved.lr);
    }
    omv_log_info("optimizer on: it tunes%s%s%s; phases of %lld steps; decisions in %s",
                 j->tune_groups ? " groups" : "", j->tune_momentum ? " momentum" : "",
                 j->tune_learning_rate ? " learning-rate" : "", (long long)j->phase_steps,
                 d->decisions ? d->decisions_path : "status only");
    omv_daemon_opt_poll(d);
    return 0;
}

void omv_daemon_opt_reset(omv_daemon_t *d)
{
    if (d->decisions) {
        fclose(d->decisions);
        d->decisions = NULL;
    }
    omv_optimizer_destroy(&d->opt);
    d->decisions_path[0] = '\0';
    d->opt_cursor = 0;
    d->opt_gen = 0;
    d->opt_cmd_flags = 0;
    d->opt_in_probe = 0;
    d->opt_resume = 0;
    memset(&d->opt_saved, 0, sizeof(d->opt_saved));
    d->probe_images_total = 0;
    d->probe_seconds_total = 0.0;
    d->opt_search_since = 0.0;
    d->n_phases = 0;
    /* A change still waiting for the optimizer would save or restore a base that is gone. */
    d->reconfig.snapshot = d->reconfig.restore = 0;
    d->reconfig.opt_gen = 0;
    /* The next job's model may have another size. */
    free(d->probe_params);
    free(d->probe_velocity);
    d->probe_params = d->probe_velocity = NULL;
}

int omv_daemon_opt_probing(const omv_daemon_t *d)
{
    return d->opt != NULL && d->opt_in_probe;
}

/* Keeps the time spent searching: from when the optimizer leaves a phase (or starts) until the
 * next phase's command is carried out. */
static void track_search(omv_daemon_t *d)
{
    omv_opt_status_t st;
    omv_optimizer_status(d->opt, &st);
    int searching = st.state == OMV_OPT_STATE_PROBING || d->opt_in_probe;
    double now = omv_time_s();
    if (searching && d->opt_search_since == 0.0) {
        d->opt_search_since = now;
    } else if (!searching && d->opt_search_since != 0.0) {
        d->probe_seconds_total += now - d->opt_search_since;
        d->opt_search_since = 0.0;
    }
}

double omv_daemon_opt_probe_seconds(const omv_daemon_t *d)
{
    double s = d->probe_seconds_total;
    if (d->opt_search_since != 0.0)
        s += omv_time_s() - d->opt_search_since;
    return s;
}

void omv_daemon_opt_membership(omv_daemon_t *d)
{
    if (d->opt == NULL || d->state != JOB_RUNNING)
        return;
    int live = omv_daemon_live_trainers(d);
    if (live <= 0)
        return; /* the job fails */
    if (omv_optimizer_set_workers(d->opt, (uint32_t)live, omv_time_s()) > 0)
        omv_log_info("%d live trainers: the optimizer regroups (see its decisions)", live);
    omv_daemon_opt_poll(d);
}

int omv_daemon_opt_save(const omv_daemon_t *d, omv_checkpoint_opt_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (d->opt == NULL)
        return 0;
    ret->phases = calloc(d->n_phases ? d->n_phases : 1, sizeof(*ret->phases));
    if (ret->phases == NULL)
        return -ENOMEM;
    ret->present = 1;
    omv_optimizer_save(d->opt, &ret->state);
    ret->probe_images_total = d->probe_images_total;
    ret->probe_seconds_total = omv_daemon_opt_probe_seconds(d);
    ret->n_phases = d->n_phases;
    for (uint32_t i = 0; i < d->n_phases; i++)
        ret->phases[i] =
            (omv_checkpoint_phase_t){d->phases[i].phase, d->phases[i].groups, d->phases[i].momentum,
                                     d->phases[i].learning_rate, d->phases[i].epoch};
    return 0;
}

void omv_daemon_opt_load(omv_daemon_t *d, const omv_checkpoint_opt_t *o)
{
    if (!o->present)
        return;
    d->opt_saved = o->state;
    d->opt_resume = 1;
    d->probe_images_total = o->probe_images_total;
    d->probe_seconds_total = o->probe_seconds_total;
    d->n_phases = 0;
    for (uint32_t i = 0; i < o->n_phases && d->n_phases < OMV_DAEMON_MAX_PHASES; i++)
        d->phases[d->n_phases++] =
            (opt_phase_t){o->phases[i].phase, o->phases[i].groups, o->phases[i].momentum,
                          o->phases[i].learning_rate, o->phases[i].epoch};
}

/* Appends the decisions made since the last call to the decisions file. */
static void write_decisions(omv_daemon_t *d)
{
    if (d->decisions == NULL)
        return;
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    omv_optimizer_decisions_since(d->opt, &d->opt_cursor, &b);
    if (omv_strbuf_str(&b)[0] != '\0') {
        fputs(omv_strbuf_str(&b), d->decisions);
        fflush(d->decisions);
    }
    omv_strbuf_fini(&b);
}

void omv_daemon_opt_poll(omv_daemon_t *d)
{
    if (d->opt == NULL || d->state != JOB_RUNNING)
        return;
    omv_opt_cmd_t cmd;
    if (omv_optimizer_poll(d->opt, omv_time_s(), &cmd) == 1 && cmd.flags) {
        omv_reconfig_t rc = {.opt_gen = cmd.gen};
        rc.snapshot = (cmd.flags & OMV_OPT_CMD_SNAPSHOT) != 0;
        rc.restore = (cmd.flags & OMV_OPT_CMD_RESTORE) != 0;
        /* A snapshot still waiting to be taken is the base this restore would bring back (a
         * probe run again before the first one began): restoring first would bring back an
         * older search's base. */
        if (rc.restore && d->reconfig.pending && d->reconfig.snapshot)
            rc.restore = 0;
        d->opt_cmd_flags = cmd.flags;
        if (cmd.flags & OMV_OPT_CMD_SET) {
            rc.groups = cmd.groups;
            rc.set_sgd = 1;
            rc.sgd = (omv_sgd_t){(float)cmd.lr, (float)cmd.momentum, d->sgd.weight_decay};
        }
        omv_daemon_request_reconfig(d, &rc);
    }
    track_search(d);
    write_decisions(d);
}

void omv_daemon_opt_applied(omv_daemon_t *d, uint64_t gen)
{
    if (d->opt == NULL || gen == 0)
        return;
    d->opt_gen = gen;
    /* The latest command asked for decides what the shards hold now. */
    d->opt_in_probe = (d->opt_cmd_flags & OMV_OPT_CMD_PROBE) != 0;
    track_search(d);
    omv_opt_status_t st;
    omv_optimizer_status(d->opt, &st);
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_optimizer_describe(d->opt, &line);
    omv_log_info("%s", omv_strbuf_str(&line));
    omv_strbuf_fini(&line);
    if (st.state == OMV_OPT_STATE_RUNNING &&
        (d->n_phases == 0 || d->phases[d->n_phases - 1].phase != st.phase) &&
        d->n_phases < OMV_DAEMON_MAX_PHASES)
        d->phases[d->n_phases++] =
            (opt_phase_t){st.phase, st.groups, st.momentum, st.lr, omv_daemon_epoch(d)};
}

void omv_daemon_opt_step(omv_daemon_t *d, uint32_t group, double loss, uint64_t images)
{
    if (d->opt == NULL)
        return;
    omv_opt_obs_t o = {omv_time_s(), d->opt_gen, group, omv_groups_clock(d->groups, group), loss,
                       (uint32_t)images};
    omv_optimizer_observe(d->opt, &o);
    omv_daemon_opt_poll(d);
}

void omv_daemon_opt_report(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    if (d->opt == NULL) {
        if (json)
            omv_strbuf_printf(out, "{\"enabled\":false}\n");
        else
            omv_strbuf_printf(out, "# optimizer\nenabled:no\n");
        return;
    }
    omv_opt_status_t st;
    omv_optimizer_status(d->opt, &st);
    static const char *const states[] = {"fixed", "idle", "probing", "running"};
    double probe_s = omv_daemon_opt_probe_seconds(d), train_s = omv_daemon_train_seconds(d);
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_optimizer_describe(d->opt, &line);
    if (json) {
        omv_strbuf_printf(out,
                          "{\"enabled\":true,\"state\":\"%s\",\"phase\":%u,\"groups\":%u,"
                          "\"momentum\":%g,\"learning_rate\":%g,\"groups_for_speed\":%u,"
                          "\"groups_max\":%u,\"probes\":%llu,\"divergences\":%llu,"
                          "\"probe_images\":%llu,\"probe_seconds\":%.3f,\"now\":",
                          states[st.state], st.phase, st.groups, st.momentum, st.lr, st.groups_he,
                          st.groups_max, (unsigned long long)st.probes_total,
                          (unsigned long long)st.divergences_total,
                          (unsigned long long)d->probe_images_total, probe_s);
        omv_strbuf_json_string(out, omv_strbuf_str(&line));
        omv_strbuf_append(out, ",\"phases\":[", 11);
        for (uint32_t i = 0; i < d->n_phases; i++)
            omv_strbuf_printf(out,
                              "%s{\"phase\":%u,\"groups\":%u,\"momentum\":%g,\"learning_rate\":%g,"
                              "\"epoch\":%.3f}",
                              i ? "," : "", d->phases[i].phase, d->phases[i].groups,
                              d->phases[i].momentum, d->phases[i].learning_rate,
                              d->phases[i].epoch);
        omv_strbuf_append(out, "],\"decisions\":", 14);
        omv_optimizer_decisions(d->opt, out);
        omv_strbuf_append(out, "}\n", 2);
    } else {
        omv_kv_t kv;
        omv_kv_begin(&kv, out, 0);
        omv_kv_section(&kv, "optimizer");
        omv_kv_str(&kv, "enabled", "yes");
        omv_kv_str(&kv, "state", states[st.state]);
        omv_kv_str(&kv, "now", omv_strbuf_str(&line));
        omv_kv_int(&kv, "phase", st.phase);
        omv_kv_int(&kv, "groups", st.groups);
        omv_kv_double(&kv, "momentum", st.momentum, 3);
        omv_kv_double(&kv, "learning_rate", st.lr, 6);
        omv_kv_int(&kv, "groups_for_speed", st.groups_he);
        omv_kv_int(&kv, "groups_max", st.groups_max);
        omv_kv_int(&kv, "probes_total", (int64_t)st.probes_total);
        omv_kv_int(&kv, "divergences_total", (int64_t)st.divergences_total);
        omv_kv_int(&kv, "probe_images_total", (int64_t)d->probe_images_total);
        omv_kv_double(&kv, "probe_seconds_total", probe_s, 2);
        omv_kv_double(&kv, "probe_fraction", train_s > 0 ? probe_s / train_s : 0.0, 3);
        omv_kv_str(&kv, "decisions_file", d->decisions ? d->decisions_path : "");
        omv_kv_section(&kv, "phases");
        for (uint32_t i = 0; i < d->n_phases; i++) {
            char key[32], val[160];
            snprintf(key, sizeof(key), "phase_%u", d->phases[i].phase);
            snprintf(val, sizeof(val), "groups=%u momentum=%g learning_rate=%g from_epoch=%.2f",
                     d->phases[i].groups, d->phases[i].momentum, d->phases[i].learning_rate,
                     d->phases[i].epoch);
            omv_kv_str(&kv, key, val);
        }
        omv_kv_end(&kv);
    }
    omv_strbuf_fini(&line);
}
