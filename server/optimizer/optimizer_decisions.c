/* The optimizer's decision log: the JSON records it writes as it decides, and the reports
 * read from it and from its state (describe, decisions).
 *
 * Decision records (one JSON object each, all with "event", "t_s" and "phase"):
 *   probe   a run from the snapshot: "stage" (cold, timing, grid), "g", "momentum", "lr",
 *           "outcome" (ok, diverged, timeout), "reused" (its result came from an identical run
 *           earlier in the same search), "score" (mean loss of the last half of its steps, null
 *           when diverged), "score_se" (its standard error), "first_loss", "steps" (of its
 *           slowest group), "observations",
 *           "seconds", "s_per_iter", "images_per_s", "reason" (why it diverged or stopped).
 *   skip    a configuration not probed because one no more aggressive diverged: "g", "momentum",
 *           "lr", "reason".
 *   choose  the end of a stage: "stage", the chosen "g", "momentum", "lr", "reason" and
 *           "candidates" (every configuration of the stage with its outcome, score and timing).
 *   grow    a timing run was at least he_gain faster per iteration: "from", "to", "s_per_iter",
 *           "reason".
 *   halve   the best momentum was 0: "from", "to", "reason".
 *   start   the first search begins: "workers", "g", "momentum", "lr" (a number, or "tune"),
 *           "phase_steps", "probe_steps".
 *   phase_end  a phase completed its steps: "loss" (mean of its last half), "s_per_iter".
 *   phase   a phase begins: "g", "momentum", "lr", "restore" (the snapshot was put back),
 *           "reason".
 *   diverge a phase diverged: "g", "momentum", "lr", "loss" (the mean of its latest window),
 *           "steps" (of its slowest group), "restore" (its starting model is put back and a
 *           search follows), "lr_ref" (the next search's), "reason".
 *   membership  the live trainers changed: "workers" (now), "from" (before), "g_max", "g" (in
 *           effect after it), "discarded" (the probe in flight, run again; absent when none),
 *           "reason".
 *   resume  the state was taken up from a checkpoint: "state" (phase, search or cold), "g",
 *           "momentum", "lr", "steps_left" (phase) or "lr_ref" (search), "reason". */
#include "optimizer_priv.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

const char *const omv_opt_stage_names[] = {"cold", "timing", "grid"};
const char *const omv_opt_outcome_names[] = {"pending", "ok", "diverged", "timeout", "skipped"};

void omv_opt_json_num(omv_strbuf_t *sb, const char *key, double v)
{
    if (isfinite(v))
        omv_strbuf_printf(sb, ",\"%s\":%.6g", key, v);
    else
        omv_strbuf_printf(sb, ",\"%s\":null", key);
}

void omv_opt_json_str(omv_strbuf_t *sb, const char *key, const char *v)
{
    omv_strbuf_printf(sb, ",\"%s\":", key);
    omv_strbuf_json_string(sb, v);
}

void omv_opt_rec_begin(omv_optimizer_t *self, const char *event, double now_s)
{
    omv_strbuf_printf(&self->log, "{\"event\":\"%s\"", event);
    /* Ten digits: monotonic seconds run to five before the point. */
    if (isfinite(now_s))
        omv_strbuf_printf(&self->log, ",\"t_s\":%.10g", now_s);
    else
        omv_strbuf_printf(&self->log, ",\"t_s\":null");
    omv_strbuf_printf(&self->log, ",\"phase\":%u", self->phase);
}

void omv_opt_rec_config(omv_optimizer_t *self, uint32_t g, double momentum, double lr)
{
    omv_strbuf_printf(&self->log, ",\"g\":%u", g);
    omv_opt_json_num(&self->log, "momentum", momentum);
    omv_opt_json_num(&self->log, "lr", lr);
}

void omv_opt_rec_end(omv_optimizer_t *self)
{
    omv_strbuf_append(&self->log, "}\n", 2);
}

/* The stage's configurations, as a "candidates" array. */
void omv_opt_rec_candidates(omv_optimizer_t *self)
{
    omv_strbuf_t *sb = &self->log;
    omv_strbuf_append(sb, ",\"candidates\":[", 15);
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const omv_opt_run_t *r = &self->runs[i];
        omv_strbuf_printf(sb, "%s{\"g\":%u", i > self->stage_begin ? "," : "", r->g);
        omv_opt_json_num(sb, "momentum", r->momentum);
        omv_opt_json_num(sb, "lr", r->lr);
        omv_opt_json_str(sb, "outcome",
                         r->probed || r->out == OMV_OPT_OUT_SKIPPED ? omv_opt_outcome_names[r->out]
                                                                    : "not probed");
        omv_opt_json_num(sb, "score", r->score);
        omv_opt_json_num(sb, "score_se", r->se);
        omv_opt_json_num(sb, "s_per_iter", r->spi);
        omv_strbuf_append(sb, "}", 1);
    }
    omv_strbuf_append(sb, "]", 1);
}

void omv_optimizer_describe(const omv_optimizer_t *self, omv_strbuf_t *out)
{
    static const char *const names[] = {"fixed", "idle", "probing", "running"};
    omv_strbuf_printf(out, "phase %u, g=%u, momentum=%g, lr=%g, state=%s", self->phase, self->g,
                      self->momentum, self->lr, names[self->state]);
    if (self->state == OMV_OPT_STATE_PROBING)
        omv_strbuf_printf(out, " (%s %zu/%zu)", omv_opt_stage_names[self->stage],
                          self->cur - self->stage_begin + 1, self->n_runs - self->stage_begin);
}

void omv_optimizer_decisions(const omv_optimizer_t *self, omv_strbuf_t *out)
{
    omv_strbuf_append(out, "[", 1);
    const char *s = omv_strbuf_str(&self->log);
    bool first = true;
    while (*s) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        if (!first)
            omv_strbuf_append(out, ",", 1);
        omv_strbuf_append(out, s, n);
        first = false;
        s += n + (nl ? 1 : 0);
    }
    omv_strbuf_append(out, "]", 1);
}

void omv_optimizer_decisions_since(const omv_optimizer_t *self, size_t *cursor, omv_strbuf_t *out)
{
    if (*cursor > self->log.len)
        *cursor = self->log.len;
    omv_strbuf_append(out, omv_strbuf_str(&self->log) + *cursor, self->log.len - *cursor);
    *cursor = self->log.len;
}
