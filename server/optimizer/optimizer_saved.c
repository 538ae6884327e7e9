/* The optimizer's durable state: what a checkpoint keeps of it (omv_optimizer_save) and
 * taking it up again in a restarted daemon (omv_optimizer_restore). */
#include "optimizer_priv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void omv_optimizer_save(const omv_optimizer_t *self, omv_opt_saved_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->groups_he = self->g_he;
    ret->probes_total = self->probes_total;
    ret->divergences_total = self->divergences_total;
    if (self->state == OMV_OPT_STATE_RUNNING) {
        ret->phase = self->phase;
        ret->running = 1;
        ret->phase_steps_done = self->p.phase_steps - self->budget + omv_opt_run_slowest(self);
        ret->lr_ref = self->phase_lr;
    } else if (self->state == OMV_OPT_STATE_PROBING && self->phase > 1) {
        /* The search restarts: what matters is the phase before it and the search's lr_ref. */
        ret->phase = self->phase - 1;
        ret->lr_ref = self->lr_ref;
    } else {
        return; /* nothing decided yet: a cold start */
    }
    ret->groups = self->phase_g;
    ret->momentum = self->phase_m;
    ret->lr = self->phase_lr;
}

static bool pow2_divisor(uint32_t g, uint32_t n)
{
    return g >= 1 && (g & (g - 1)) == 0 && n % g == 0;
}

int omv_optimizer_restore(omv_optimizer_t *self, const omv_opt_saved_t *saved, double now_s)
{
    if (self->state == OMV_OPT_STATE_FIXED)
        return 0;
    if (self->state != OMV_OPT_STATE_IDLE || self->gen != 0)
        return -EINVAL;
    const omv_optimizer_params_t *p = &self->p;
    uint32_t g = self->tune_g ? saved->groups : (uint32_t)p->groups;
    double m = self->tune_m ? saved->momentum : p->momentum;
    double lr = self->tune_lr ? saved->lr : p->lr;
    double lr_ref = self->tune_lr ? saved->lr_ref : p->lr;
    uint32_t g_he = self->tune_g ? saved->groups_he : (uint32_t)p->groups;
    if (saved->phase > 0 &&
        ((self->tune_g && !pow2_divisor(g, p->workers)) ||
         (self->tune_g && g_he != 0 && !pow2_divisor(g_he, p->workers)) || !(m >= 0.0 && m < 1.0) ||
         !(lr > 0.0 && isfinite(lr)) || !(lr_ref > 0.0 && isfinite(lr_ref))))
        return -EINVAL;
    self->probes_total = saved->probes_total;
    self->divergences_total = saved->divergences_total;
    char reason[240];
    if (saved->phase == 0) {
        omv_opt_rec_begin(self, "resume", now_s);
        omv_opt_json_str(&self->log, "state", "cold");
        omv_opt_json_str(&self->log, "reason", "no phase had begun: a cold start");
        omv_opt_rec_end(self);
        return 0; /* the first poll starts cold */
    }
    self->phase = saved->phase;
    self->phase_g = g;
    self->phase_m = m;
    self->phase_lr = lr;
    self->g_he = g_he ? g_he : omv_opt_allowed_g(self, 1);
    if (!saved->running) {
        self->next_lr_ref = lr_ref;
        omv_opt_rec_begin(self, "resume", now_s);
        omv_opt_json_str(&self->log, "state", "search");
        omv_opt_rec_config(self, g, m, lr);
        omv_opt_json_num(&self->log, "lr_ref", lr_ref);
        snprintf(reason, sizeof(reason),
                 "checkpoint written during the search after phase %u: it runs again from the "
                 "checkpoint's model (probes are not kept)",
                 saved->phase);
        omv_opt_json_str(&self->log, "reason", reason);
        omv_opt_rec_end(self);
        omv_opt_begin_search(self, false, now_s);
        return 0;
    }
    uint32_t done =
        saved->phase_steps_done < p->phase_steps ? saved->phase_steps_done : p->phase_steps - 1;
    uint32_t left = p->phase_steps - done;
    g = omv_opt_allowed_g(self, g);
    omv_opt_rec_begin(self, "resume", now_s);
    omv_opt_json_str(&self->log, "state", "phase");
    omv_opt_rec_config(self, g, m, lr);
    omv_strbuf_printf(&self->log, ",\"steps_left\":%u", left);
    snprintf(reason, sizeof(reason),
             "checkpoint written during phase %u: it goes on for its %u steps left, from the "
             "checkpoint's model",
             saved->phase, left);
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_end(self);
    self->state = OMV_OPT_STATE_RUNNING;
    /* The model resumed from is the phase's rollback point. */
    self->base_phase = true;
    self->watch = true;
    omv_opt_issue(self, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_DONE_SEARCH, g, m, lr,
                  now_s, left);
    return 0;
}
