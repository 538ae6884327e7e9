/* The optimizer's daemon side: commands into changes, the decisions file, phases, search time. */
#define OMV_LOG_TAG "optimizer"
#include "tuner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

struct omv_tuner {
    omv_optimizer_params_t params;
    int tune_groups, tune_momentum, tune_lr;
    long long phase_steps;
    omv_optimizer_t *opt; /* from omv_tuner_start on */
    uint64_t gen;         /* the generation of the last command carried out */
    size_t cursor;        /* decisions already written to the decisions file */
    FILE *decisions;      /* CKPT_DIR/decisions.jsonl */
    char decisions_path[OMV_JOB_PATH_MAX + 32];
    uint64_t probe_images_total; /* images of probes: thrown away, not counted as training */
    double probe_seconds_total;  /* s of searches that ended (probes, their barriers) */
    double search_since;         /* when the search under way began (0: none) */
    unsigned cmd_flags;          /* the last command asked for (OMV_OPT_CMD_*) */
    int in_probe;                /* the shards hold a probe's model (a PROBE command applied) */
    int resume;                  /* saved came from a checkpoint: the optimizer takes it up */
    omv_opt_saved_t saved;
    omv_phase_t phases[OMV_TUNER_MAX_PHASES];
    uint32_t n_phases;
};

omv_tuner_t *omv_tuner_new(const omv_job_t *j, const char *ckpt_dir)
{
    omv_tuner_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    omv_optimizer_params_t *p = &self->params;
    omv_optimizer_params_init(p, (uint32_t)j->workers);
    p->groups = j->tune_groups ? OMV_OPT_TUNE : (int32_t)j->groups;
    /* Adam's beta1 is the momentum knob (it plays the part of SGD's momentum). */
    double momentum = j->update == OMV_JOB_UPDATE_SGD ? j->momentum : j->beta1;
    p->momentum = j->tune_momentum ? -1.0 : momentum;
    p->lr = j->tune_learning_rate ? -1.0 : j->learning_rate;
    p->phase_steps = (uint32_t)j->phase_steps;
    p->probe_steps = (uint32_t)j->probe_steps;
    p->later_probe_steps = (uint32_t)j->later_probe_steps;
    p->first_grid_cold_lr = j->first_grid_cold_lr != 0;
    /* Adam's step is about the learning rate per parameter whatever the gradient's scale, and
     * its rates sit a decade below SGD's (1e-3 where SGD takes 1e-2): its grid is SGD's / 10. */
    for (uint32_t i = 0; j->update != OMV_JOB_UPDATE_SGD && i < p->n_lr_grid; i++)
        p->lr_grid[i] /= 10.0;
    self->tune_groups = j->tune_groups;
    self->tune_momentum = j->tune_momentum;
    self->tune_lr = j->tune_learning_rate;
    self->phase_steps = (long long)j->phase_steps;
    if (ckpt_dir != NULL)
        snprintf(self->decisions_path, sizeof(self->decisions_path), "%s/decisions.jsonl",
                 ckpt_dir);
    return self;
}

const omv_optimizer_params_t *omv_tuner_params(const omv_tuner_t *self)
{
    return &self->params;
}

void omv_tuner_destroy(omv_tuner_t **self_p)
{
    omv_tuner_t *self = *self_p;
    if (self == NULL)
        return;
    if (self->decisions)
        fclose(self->decisions);
    omv_optimizer_destroy(&self->opt);
    free(self);
    *self_p = NULL;
}

static void take_up_saved(omv_tuner_t *self, double now)
{
    self->resume = 0;
    const omv_opt_saved_t *s = &self->saved;
    if (omv_optimizer_restore(self->opt, s, now) < 0)
        omv_log_warn("the checkpoint's optimizer state (phase %u, g=%u) does not fit this "
                     "job; the optimizer starts cold",
                     s->phase, s->groups);
    else if (s->phase > 0)
        omv_log_info("optimizer resumed: phase %u %s (g=%u, momentum %g, lr %g)", s->phase,
                     s->running ? "goes on" : "is over: its search runs again", s->groups,
                     s->momentum, s->lr);
}

int omv_tuner_start(omv_tuner_t *self, int live, double now)
{
    if (self->opt != NULL)
        return 0;
    self->opt = omv_optimizer_new(&self->params);
    if (self->opt == NULL) {
        int r = -errno;
        omv_log_error("cannot start the optimizer: %s (check [optimizer] and [cluster] groups: a "
                      "fixed number of groups must divide the workers)",
                      omv_strerror(r));
        return r;
    }
    if (self->decisions_path[0]) {
        /* Appended to: a resumed job's decisions follow those made before the restart. */
        self->decisions = fopen(self->decisions_path, "a");
        if (self->decisions == NULL)
            omv_log_warn("cannot write %s: %s; decisions are only in status", self->decisions_path,
                         omv_strerror(-errno));
    }
    if (live > 0)
        omv_optimizer_set_workers(self->opt, (uint32_t)live, now);
    if (self->resume)
        take_up_saved(self, now);
    omv_log_info("optimizer on: it tunes%s%s%s; phases of %lld steps; decisions in %s",
                 self->tune_groups ? " groups" : "", self->tune_momentum ? " momentum" : "",
                 self->tune_lr ? " learning-rate" : "", self->phase_steps,
                 self->decisions ? self->decisions_path : "status only");
    return 0;
}

int omv_tuner_active(const omv_tuner_t *self)
{
    return self != NULL && self->opt != NULL;
}

int omv_tuner_probing(const omv_tuner_t *self)
{
    return omv_tuner_active(self) && self->in_probe;
}

/* Keeps the time spent searching: from when the optimizer leaves a phase (or starts) until the
 * next phase's command is carried out. */
static void track_search(omv_tuner_t *self, double now)
{
    omv_opt_status_t st;
    omv_optimizer_status(self->opt, &st);
    int searching = st.state == OMV_OPT_STATE_PROBING || self->in_probe;
    if (searching && self->search_since == 0.0) {
        self->search_since = now;
    } else if (!searching && self->search_since != 0.0) {
        self->probe_seconds_total += now - self->search_since;
        self->search_since = 0.0;
    }
}

/* Appends the decisions made since the last call to the decisions file. */
static void write_decisions(omv_tuner_t *self)
{
    if (self->decisions == NULL)
        return;
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    omv_optimizer_decisions_since(self->opt, &self->cursor, &b);
    if (omv_strbuf_str(&b)[0] != '\0') {
        fputs(omv_strbuf_str(&b), self->decisions);
        fflush(self->decisions);
    }
    omv_strbuf_fini(&b);
}

int omv_tuner_poll(omv_tuner_t *self, double now, const omv_reconfig_t *pending,
                   const omv_sgd_t *rule, omv_reconfig_t *ret)
{
    if (!omv_tuner_active(self))
        return 0;
    omv_opt_cmd_t cmd;
    int asked = 0;
    if (omv_optimizer_poll(self->opt, now, &cmd) == 1 && cmd.flags) {
        omv_reconfig_t rc = {.opt_gen = cmd.gen};
        rc.snapshot = (cmd.flags & OMV_OPT_CMD_SNAPSHOT) != 0;
        rc.restore = (cmd.flags & OMV_OPT_CMD_RESTORE) != 0;
        /* A snapshot still waiting to be taken is the base this restore would bring back (a
         * probe run again before the first one began): restoring first would bring back an
         * older search's base. */
        if (rc.restore && pending->pending && pending->snapshot)
            rc.restore = 0;
        self->cmd_flags = cmd.flags;
        if (cmd.flags & OMV_OPT_CMD_SET) {
            rc.groups = cmd.groups;
            rc.set_sgd = 1;
            rc.sgd = *rule;
            rc.sgd.learning_rate = (float)cmd.lr;
            rc.sgd.momentum = (float)cmd.momentum;
        }
        *ret = rc;
        asked = 1;
    }
    track_search(self, now);
    write_decisions(self);
    return asked;
}

void omv_tuner_applied(omv_tuner_t *self, uint64_t gen, double epoch, double now)
{
    if (!omv_tuner_active(self) || gen == 0)
        return;
    self->gen = gen;
    /* The latest command asked for decides what the shards hold now. */
    self->in_probe = (self->cmd_flags & OMV_OPT_CMD_PROBE) != 0;
    track_search(self, now);
    omv_opt_status_t st;
    omv_optimizer_status(self->opt, &st);
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_optimizer_describe(self->opt, &line);
    omv_log_info("%s", omv_strbuf_str(&line));
    omv_strbuf_fini(&line);
    if (st.state == OMV_OPT_STATE_RUNNING &&
        (self->n_phases == 0 || self->phases[self->n_phases - 1].phase != st.phase) &&
        self->n_phases < OMV_TUNER_MAX_PHASES)
        self->phases[self->n_phases++] =
            (omv_phase_t){st.phase, st.groups, st.momentum, st.lr, epoch};
}

void omv_tuner_observe(omv_tuner_t *self, uint32_t group, uint64_t clock, double loss,
                       uint64_t images, double now)
{
    if (!omv_tuner_active(self))
        return;
    omv_opt_obs_t o = {now, self->gen, group, clock, loss, (uint32_t)images};
    omv_optimizer_observe(self->opt, &o);
}

void omv_tuner_membership(omv_tuner_t *self, int live, double now)
{
    if (!omv_tuner_active(self) || live <= 0)
        return; /* with no trainer left the job fails */
    if (omv_optimizer_set_workers(self->opt, (uint32_t)live, now) > 0)
        omv_log_info("%d live trainers: the optimizer regroups (see its decisions)", live);
}

void omv_tuner_count_probe_images(omv_tuner_t *self, uint64_t images)
{
    if (self)
        self->probe_images_total += images;
}

uint64_t omv_tuner_probe_images(const omv_tuner_t *self)
{
    return self ? self->probe_images_total : 0;
}

double omv_tuner_probe_seconds(const omv_tuner_t *self, double now)
{
    if (self == NULL)
        return 0.0;
    double s = self->probe_seconds_total;
    if (self->search_since != 0.0)
        s += now - self->search_since;
    return s;
}

int omv_tuner_save(const omv_tuner_t *self, double now, omv_checkpoint_opt_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (!omv_tuner_active(self))
        return 0;
    ret->phases = calloc(self->n_phases ? self->n_phases : 1, sizeof(*ret->phases));
    if (ret->phases == NULL)
        return -ENOMEM;
    ret->present = 1;
    omv_optimizer_save(self->opt, &ret->state);
    ret->probe_images_total = self->probe_images_total;
    ret->probe_seconds_total = omv_tuner_probe_seconds(self, now);
    ret->n_phases = self->n_phases;
    for (uint32_t i = 0; i < self->n_phases; i++) {
        const omv_phase_t *p = &self->phases[i];
        ret->phases[i] =
            (omv_checkpoint_phase_t){p->phase, p->groups, p->momentum, p->learning_rate, p->epoch};
    }
    return 0;
}

void omv_tuner_load(omv_tuner_t *self, const omv_checkpoint_opt_t *o)
{
    if (self == NULL || !o->present)
        return;
    self->saved = o->state;
    self->resume = 1;
    self->probe_images_total = o->probe_images_total;
    self->probe_seconds_total = o->probe_seconds_total;
    self->n_phases = 0;
    for (uint32_t i = 0; i < o->n_phases && self->n_phases < OMV_TUNER_MAX_PHASES; i++) {
        const omv_checkpoint_phase_t *p = &o->phases[i];
        self->phases[self->n_phases++] =
            (omv_phase_t){p->phase, p->groups, p->momentum, p->learning_rate, p->epoch};
    }
}

uint32_t omv_tuner_phases(const omv_tuner_t *self, const omv_phase_t **ret_phases)
{
    *ret_phases = self ? self->phases : NULL;
    return self ? self->n_phases : 0;
}

void omv_tuner_phases_kv(const omv_tuner_t *self, omv_kv_t *kv)
{
    const omv_phase_t *ph;
    uint32_t n = omv_tuner_phases(self, &ph);
    for (uint32_t i = 0; i < n; i++) {
        char key[32], val[160];
        snprintf(key, sizeof(key), "phase_%u", ph[i].phase);
        snprintf(val, sizeof(val), "groups=%u momentum=%g learning_rate=%g from_epoch=%.2f",
                 ph[i].groups, ph[i].momentum, ph[i].learning_rate, ph[i].epoch);
        omv_kv_str(kv, key, val);
    }
}

void omv_tuner_phases_json(const omv_tuner_t *self, omv_strbuf_t *out)
{
    const omv_phase_t *ph;
    uint32_t n = omv_tuner_phases(self, &ph);
    omv_strbuf_append(out, "[", 1);
    for (uint32_t i = 0; i < n; i++)
        omv_strbuf_printf(out,
                          "%s{\"phase\":%u,\"groups\":%u,\"momentum\":%g,\"learning_rate\":%g,"
                          "\"epoch\":%.4f}",
                          i ? "," : "", ph[i].phase, ph[i].groups, ph[i].momentum,
                          ph[i].learning_rate, ph[i].epoch);
    omv_strbuf_append(out, "]", 1);
}

void omv_tuner_describe(const omv_tuner_t *self, omv_strbuf_t *out)
{
    omv_optimizer_describe(self->opt, out);
}

static const char *const state_names[] = {"fixed", "idle", "probing", "running"};

static void report_json(const omv_tuner_t *self, const omv_opt_status_t *st, double probe_s,
                        const char *now_line, omv_strbuf_t *out)
{
    omv_strbuf_printf(out,
                      "{\"enabled\":true,\"state\":\"%s\",\"phase\":%u,\"groups\":%u,"
                      "\"momentum\":%g,\"learning_rate\":%g,\"groups_for_speed\":%u,"
                      "\"groups_max\":%u,\"probes\":%llu,\"divergences\":%llu,"
                      "\"probe_images\":%llu,\"probe_seconds\":%.3f,\"now\":",
                      state_names[st->state], st->phase, st->groups, st->momentum, st->lr,
                      st->groups_he, st->groups_max, (unsigned long long)st->probes_total,
                      (unsigned long long)st->divergences_total,
                      (unsigned long long)self->probe_images_total, probe_s);
    omv_strbuf_json_string(out, now_line);
    omv_strbuf_append(out, ",\"phases\":", 10);
    omv_tuner_phases_json(self, out);
    omv_strbuf_append(out, ",\"decisions\":", 13);
    omv_optimizer_decisions(self->opt, out);
    omv_strbuf_append(out, "}\n", 2);
}

static void report_text(const omv_tuner_t *self, const omv_opt_status_t *st, double probe_s,
                        double train_s, const char *now_line, omv_strbuf_t *out)
{
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "optimizer");
    omv_kv_str(&kv, "enabled", "yes");
    omv_kv_str(&kv, "state", state_names[st->state]);
    omv_kv_str(&kv, "now", now_line);
    omv_kv_int(&kv, "phase", st->phase);
    omv_kv_int(&kv, "groups", st->groups);
    omv_kv_double(&kv, "momentum", st->momentum, 3);
    omv_kv_double(&kv, "learning_rate", st->lr, 6);
    omv_kv_int(&kv, "groups_for_speed", st->groups_he);
    omv_kv_int(&kv, "groups_max", st->groups_max);
    omv_kv_int(&kv, "probes_total", (int64_t)st->probes_total);
    omv_kv_int(&kv, "divergences_total", (int64_t)st->divergences_total);
    omv_kv_int(&kv, "probe_images_total", (int64_t)self->probe_images_total);
    omv_kv_double(&kv, "probe_seconds_total", probe_s, 2);
    omv_kv_double(&kv, "probe_fraction", train_s > 0 ? probe_s / train_s : 0.0, 3);
    omv_kv_str(&kv, "decisions_file", self->decisions ? self->decisions_path : "");
    omv_kv_section(&kv, "phases");
    omv_tuner_phases_kv(self, &kv);
    omv_kv_end(&kv);
}

void omv_tuner_report(const omv_tuner_t *self, double train_s, double now, omv_strbuf_t *out,
                      int json)
{
    if (!omv_tuner_active(self)) {
        omv_strbuf_printf(out, json ? "{\"enabled\":false}\n" : "# optimizer\nenabled:no\n");
        return;
    }
    omv_opt_status_t st;
    omv_optimizer_status(self->opt, &st);
    double probe_s = omv_tuner_probe_seconds(self, now);
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_optimizer_describe(self->opt, &line);
    if (json)
        report_json(self, &st, probe_s, omv_strbuf_str(&line), out);
    else
        report_text(self, &st, probe_s, train_s, omv_strbuf_str(&line), out);
    omv_strbuf_fini(&line);
}
