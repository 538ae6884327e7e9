/* The Omnivore optimizer's entry points: its parameters and construction, the group steps
 * it observes (where a phase ends or diverges), the commands it hands out, and changes of
 * membership. The search, the current run, saved state and the decision log have files of
 * their own (optimizer_search.c, optimizer_run.c, optimizer_saved.c,
 * optimizer_decisions.c). */
#include "optimizer_priv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void omv_optimizer_params_init(omv_optimizer_params_t *params, uint32_t workers)
{
    static const double lrs[] = {0.1, 0.01, 0.001, 0.0001};
    static const double ms[] = {0.0, 0.3, 0.6, 0.9};
    memset(params, 0, sizeof(*params));
    params->workers = workers;
    params->groups = OMV_OPT_TUNE;
    params->momentum = -1.0;
    params->lr = -1.0;
    memcpy(params->lr_grid, lrs, sizeof(lrs));
    params->n_lr_grid = 4;
    memcpy(params->momentum_grid, ms, sizeof(ms));
    params->n_momentum_grid = 4;
    params->cold_momentum = 0.9;
    params->phase_steps = 2000;
    params->probe_steps = 0;
    params->later_probe_steps = 0;
    params->first_grid_cold_lr = true;
    params->probe_max_s = 0.0;
    params->warmup_steps = 1;
    params->diverge_factor = 2.0;
    params->diverge_window = 3;
    params->phase_diverge_window = 16;
    params->he_gain = 0.10;
    params->tie_rel = 0.01;
    params->tie_z = 2.0;
}

/* Sorts a grid ascending; returns whether every value is in [lo, hi) and distinct. */
static bool sort_grid(double *v, uint32_t n, double lo, double hi, bool lo_open)
{
    if (n == 0 || n > OMV_OPT_GRID_MAX)
        return false;
    qsort(v, n, sizeof(*v), omv_opt_cmp_double);
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || v[i] < lo || (lo_open && v[i] == lo) || v[i] >= hi)
            return false;
        if (i > 0 && v[i] == v[i - 1])
            return false;
    }
    return true;
}

static bool validate(omv_optimizer_params_t *p)
{
    if (p->workers == 0)
        return false;
    if (p->groups != OMV_OPT_TUNE &&
        (p->groups < 1 || (uint32_t)p->groups > p->workers || p->workers % (uint32_t)p->groups))
        return false;
    if (!(p->momentum < 0.0) && !(p->momentum >= 0.0 && p->momentum < 1.0))
        return false;
    if (!(p->lr < 0.0) && !(p->lr > 0.0 && isfinite(p->lr)))
        return false;
    if (!sort_grid(p->lr_grid, p->n_lr_grid, 0.0, INFINITY, true) ||
        !sort_grid(p->momentum_grid, p->n_momentum_grid, 0.0, 1.0, false))
        return false;
    if (!(p->cold_momentum >= 0.0 && p->cold_momentum < 1.0))
        return false;
    if (p->phase_steps == 0 || p->warmup_steps == 0 || p->diverge_window == 0 ||
        p->phase_diverge_window == 0)
        return false;
    if (p->probe_steps == 0) {
        p->probe_steps = p->phase_steps / 80;
        if (p->probe_steps < p->warmup_steps + 3)
            p->probe_steps = p->warmup_steps + 3;
    }
    /* Timing needs at least one step after the warm-up. */
    if (p->probe_steps <= p->warmup_steps)
        return false;
    if (p->later_probe_steps != 0 && p->later_probe_steps <= p->warmup_steps)
        return false;
    if (!(p->probe_max_s >= 0.0 && isfinite(p->probe_max_s)))
        return false;
    if (!(p->diverge_factor > 1.0 && isfinite(p->diverge_factor)))
        return false;
    if (!(p->he_gain >= 0.0 && p->he_gain < 1.0) || !(p->tie_rel >= 0.0 && p->tie_rel < 1.0) ||
        !(p->tie_z >= 0.0 && p->tie_z < 100.0))
        return false;
    return true;
}

omv_optimizer_t *omv_optimizer_new(const omv_optimizer_params_t *params)
{
    omv_optimizer_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->p = *params;
    omv_optimizer_params_t *p = &self->p;
    if (!validate(p)) {
        free(self);
        errno = EINVAL;
        return NULL;
    }
    self->tune_g = p->groups == OMV_OPT_TUNE;
    self->tune_m = p->momentum < 0.0;
    self->tune_lr = p->lr < 0.0;
    self->g_max = p->workers;
    uint32_t n_pow = 0; /* powers of two dividing N, 1 included */
    for (uint64_t g = 1; g <= p->workers && p->workers % g == 0; g *= 2)
        n_pow++;
    /* Cold start, one timing run per power of two (plus one at g = 1), and a grid of at most
     * 2 x |momentum grid| per g the halving visits; more only when membership changes restart
     * parts of a search (the table then grows). */
    self->cap_runs = p->n_lr_grid + n_pow + 1 + (size_t)n_pow * 2 * p->n_momentum_grid;
    size_t ring = (size_t)p->probe_steps * p->workers * 4;
    if (ring > ((size_t)1 << 20))
        ring = (size_t)1 << 20;
    if (ring < 64)
        ring = 64;
    if (ring < p->diverge_window)
        ring = p->diverge_window;
    if (ring < p->phase_diverge_window)
        ring = p->phase_diverge_window;
    self->ring_cap = ring;
    self->runs = calloc(self->cap_runs, sizeof(*self->runs));
    self->scratch = calloc(self->cap_runs, sizeof(*self->scratch));
    self->steps = calloc(p->workers, sizeof(*self->steps));
    self->ring = calloc(self->ring_cap, sizeof(*self->ring));
    omv_strbuf_init(&self->log);
    if (!self->runs || !self->scratch || !self->steps || !self->ring) {
        omv_optimizer_destroy(&self);
        errno = ENOMEM;
        return NULL;
    }
    self->g = self->tune_g ? 0 : (uint32_t)p->groups;
    self->momentum = self->tune_m ? NAN : p->momentum;
    self->lr = self->tune_lr ? NAN : p->lr;
    self->state =
        (self->tune_g || self->tune_m || self->tune_lr) ? OMV_OPT_STATE_IDLE : OMV_OPT_STATE_FIXED;
    return self;
}

void omv_optimizer_destroy(omv_optimizer_t **self_p)
{
    if (self_p == NULL || *self_p == NULL)
        return;
    omv_optimizer_t *self = *self_p;
    omv_strbuf_fini(&self->log);
    free(self->ring);
    free(self->steps);
    free(self->scratch);
    free(self->runs);
    free(self);
    *self_p = NULL;
}

/* The running phase diverged: put its starting model back and search again with a tenth of its
 * learning rate, or, when there is no starting model to go back to or nothing the optimizer may
 * change, say so and go on. */
static void phase_diverged(omv_optimizer_t *self, const char *why, double now_s)
{
    bool can = self->base_phase && (self->tune_lr || self->tune_m);
    double next = self->tune_lr ? self->phase_lr / 10.0 : self->p.lr;
    char reason[320];
    if (can)
        snprintf(reason, sizeof(reason),
                 "%s: back to the phase's starting model, and a search from it with lr_ref %g", why,
                 next);
    else
        snprintf(reason, sizeof(reason), "%s; the phase goes on: %s", why,
                 !self->base_phase ? "no starting model to go back to (nothing was probed)"
                                   : "the job fixes momentum and learning rate");
    omv_opt_rec_begin(self, "diverge", now_s);
    omv_opt_rec_config(self, self->g, self->momentum, self->lr);
    omv_opt_json_num(&self->log, "loss", omv_opt_ring_mean(self, omv_opt_run_window(self)));
    omv_strbuf_printf(&self->log, ",\"steps\":%u,\"restore\":%s", omv_opt_run_slowest(self),
                      can ? "true" : "false");
    omv_opt_json_num(&self->log, "lr_ref", can ? next : NAN);
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_end(self);
    if (!can) {
        self->watch = false;
        return;
    }
    self->divergences_total++;
    self->next_lr_ref = next;
    omv_opt_begin_search(self, true, now_s);
}

static void check_time_cap(omv_optimizer_t *self, double now_s)
{
    if (self->state == OMV_OPT_STATE_PROBING && !self->has_cmd && self->p.probe_max_s > 0.0 &&
        now_s - self->run_start_s >= self->p.probe_max_s)
        omv_opt_end_run(self, OMV_OPT_OUT_TIMEOUT, "probe_max_s reached", now_s);
}

int omv_optimizer_observe(omv_optimizer_t *self, const omv_opt_obs_t *obs)
{
    if (!isfinite(obs->now_s))
        return -EINVAL;
    if (self->state == OMV_OPT_STATE_FIXED || self->state == OMV_OPT_STATE_IDLE ||
        obs->gen != self->gen || self->has_cmd)
        return 1;
    if (obs->group >= self->g)
        return -EINVAL;
    uint32_t s = ++self->steps[obs->group];
    if (s == self->budget)
        self->n_reached++;
    if (self->n_warm < self->g) {
        if (s == self->p.warmup_steps && ++self->n_warm == self->g)
            self->t0 = obs->now_s;
    } else {
        self->timed++;
        self->timed_images += obs->images;
        self->t_last = obs->now_s;
    }
    self->ring[self->n_obs % self->ring_cap] = obs->loss;
    if (self->n_obs++ == 0)
        self->first_loss = obs->loss;
    if (self->ref_n < omv_opt_run_window(self)) {
        self->ref_sum += obs->loss;
        self->ref_n++;
    }

    char reason[200] = "";
    if (self->state == OMV_OPT_STATE_RUNNING) {
        if (self->watch && omv_opt_run_diverged(self, obs->loss, reason, sizeof(reason))) {
            phase_diverged(self, reason, obs->now_s);
            return 0;
        }
        if (self->n_reached == self->g) {
            omv_opt_rec_begin(self, "phase_end", obs->now_s);
            omv_opt_json_num(&self->log, "loss", omv_opt_ring_mean(self, (self->n_obs + 1) / 2));
            omv_opt_json_num(&self->log, "s_per_iter", omv_opt_run_spi(self));
            omv_opt_rec_end(self);
            self->next_lr_ref = self->phase_lr;
            omv_opt_begin_search(self, false, obs->now_s);
        }
        return 0;
    }
    if (self->stage != OMV_OPT_STAGE_TIMING &&
        omv_opt_run_diverged(self, obs->loss, reason, sizeof(reason))) {
        omv_opt_end_run(self, OMV_OPT_OUT_DIVERGED, reason, obs->now_s);
        return 0;
    }
    if (self->n_reached == self->g)
        omv_opt_end_run(self, OMV_OPT_OUT_OK, NULL, obs->now_s);
    else
        check_time_cap(self, obs->now_s);
    return 0;
}

int omv_optimizer_poll(omv_optimizer_t *self, double now_s, omv_opt_cmd_t *ret_cmd)
{
    if (self->state == OMV_OPT_STATE_IDLE)
        omv_opt_begin_search(self, false, now_s);
    check_time_cap(self, now_s);
    if (!self->has_cmd) {
        memset(ret_cmd, 0, sizeof(*ret_cmd));
        return 0;
    }
    *ret_cmd = self->cmd;
    self->has_cmd = false;
    return 1;
}

void omv_optimizer_status(const omv_optimizer_t *self, omv_opt_status_t *ret_status)
{
    *ret_status = (omv_opt_status_t){self->state,        self->phase,
                                     self->gen,          self->g,
                                     self->momentum,     self->lr,
                                     self->g_he,         self->g_max,
                                     self->probes_total, self->divergences_total};
}

/* ---- membership ---- */

int omv_optimizer_set_workers(omv_optimizer_t *self, uint32_t live, double now_s)
{
    if (live == 0)
        return -EINVAL;
    if (live == self->g_max)
        return 0;
    uint32_t before = self->g_max;
    self->g_max = live;
    if (self->state == OMV_OPT_STATE_FIXED || self->state == OMV_OPT_STATE_IDLE)
        return 0;
    char reason[240];
    omv_opt_rec_begin(self, "membership", now_s);
    omv_strbuf_printf(&self->log, ",\"workers\":%u,\"from\":%u,\"g_max\":%u", live, before,
                      omv_opt_allowed_g(self, UINT32_MAX));
    if (self->state == OMV_OPT_STATE_RUNNING) {
        /* The phase goes on with the steps it has left, regrouped (which also rebalances the
         * groups: one may have lost its last member), its g capped by the live workers. */
        uint32_t g = omv_opt_allowed_g(self, self->phase_g), done = omv_opt_run_slowest(self);
        uint32_t left = self->budget > done ? self->budget - done : 1;
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): phase %u goes on at g=%u for its %u steps left", live,
                 before, self->phase, g, left);
        omv_strbuf_printf(&self->log, ",\"g\":%u", g);
        omv_opt_json_str(&self->log, "reason", reason);
        omv_opt_rec_end(self);
        bool watch = self->watch;
        omv_opt_issue(self, OMV_OPT_CMD_SET, g, self->phase_m, self->phase_lr, now_s, left);
        self->watch = watch;
        return 1;
    }
    /* A search: the probe in flight is discarded (its steps ran on other hardware) and run
     * again from the snapshot, unless its g is no longer allowed. */
    omv_opt_run_t *r = &self->runs[self->cur];
    omv_strbuf_t *sb = &self->log;
    uint32_t g_next =
        self->stage == OMV_OPT_STAGE_TIMING
            ? 1
            : omv_opt_allowed_g(self, self->stage == OMV_OPT_STAGE_GRID ? self->g_search : r->g);
    omv_strbuf_printf(sb, ",\"g\":%u,\"discarded\":{\"stage\":\"%s\",\"g\":%u", g_next,
                      omv_opt_stage_names[r->stage], r->g);
    omv_opt_json_num(sb, "momentum", r->momentum);
    omv_opt_json_num(sb, "lr", r->lr);
    omv_strbuf_printf(sb, ",\"steps\":%u,\"observations\":%llu}", omv_opt_run_slowest(self),
                      (unsigned long long)self->n_obs);
    if (self->stage == OMV_OPT_STAGE_TIMING) {
        /* Every timing so far was of the old hardware: time again from g = 1. */
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): the probe in flight is discarded and the timing "
                 "starts again at g=1",
                 live, before);
        omv_opt_json_str(sb, "reason", reason);
        omv_opt_rec_end(self);
        r->out = OMV_OPT_OUT_SKIPPED;
        self->g_cur = 1;
        self->spi_cur = NAN;
        omv_opt_timing_next(self, now_s);
        return 1;
    }
    if (self->stage == OMV_OPT_STAGE_GRID &&
        self->g_search > omv_opt_allowed_g(self, self->g_search)) {
        uint32_t g = omv_opt_allowed_g(self, self->g_search);
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): the probe in flight is discarded and the grid "
                 "starts again at g=%u",
                 live, before, g);
        omv_opt_json_str(sb, "reason", reason);
        omv_opt_rec_end(self);
        r->out = OMV_OPT_OUT_SKIPPED;
        self->g_search = g;
        omv_opt_start_grid(self, now_s);
        return 1;
    }
    snprintf(reason, sizeof(reason),
             "%u live workers (were %u): the probe in flight is discarded and runs again", live,
             before);
    omv_opt_json_str(sb, "reason", reason);
    omv_opt_rec_end(self);
    /* A cold start's g (1, or the job's) may be capped now. */
    for (size_t i = self->stage_begin; i < self->n_runs; i++)
        self->runs[i].g = omv_opt_allowed_g(self, self->runs[i].g);
    omv_opt_issue_run(self, self->cur, now_s);
    return 1;
}
