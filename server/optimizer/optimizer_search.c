/* The optimizer's search for the next phase's configuration: the cold start over learning
 * rates, the hardware-efficiency timing over g, the momentum x learning-rate grid from one
 * snapshot, and the choice that starts the phase (optimizer.h, steps 1 to 6). */
#include "optimizer_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int omv_opt_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The largest g allowed up to want: a tuned g is a power of two that divides N and is at most
 * the live trainers; a fixed one is the job's, capped by the live trainers. */
uint32_t omv_opt_allowed_g(const omv_optimizer_t *self, uint32_t want)
{
    uint32_t most = want < self->g_max ? want : self->g_max;
    if (!self->tune_g)
        return (uint32_t)self->p.groups < self->g_max ? (uint32_t)self->p.groups : self->g_max;
    uint32_t g = 1;
    while ((uint64_t)g * 2 <= most && self->p.workers % (g * 2) == 0)
        g *= 2;
    return g;
}

static void next_probe(omv_optimizer_t *self, double now_s);

static omv_opt_run_t *add_run(omv_optimizer_t *self, omv_opt_stage_t stage, uint32_t g,
                              double momentum, double lr)
{
    if (self->n_runs == self->cap_runs) {
        /* Only membership changes restart parts of a search and get here. */
        size_t cap = self->cap_runs * 2;
        omv_opt_run_t *runs = realloc(self->runs, cap * sizeof(*runs));
        if (runs == NULL)
            abort();
        self->runs = runs;
        double *scratch = realloc(self->scratch, cap * sizeof(*scratch));
        if (scratch == NULL)
            abort();
        self->scratch = scratch;
        self->cap_runs = cap;
    }
    omv_opt_run_t *r = &self->runs[self->n_runs++];
    *r = (omv_opt_run_t){stage, g, momentum, lr, OMV_OPT_OUT_PENDING, false, NAN, NAN, NAN};
    return r;
}

static void start_stage(omv_optimizer_t *self, omv_opt_stage_t stage)
{
    self->stage = stage;
    self->stage_begin = self->n_runs;
}

/* Steps of the slowest group a probe at g runs for (see later_probe_steps). */
static uint32_t probe_budget(const omv_optimizer_t *self, uint32_t g)
{
    (void)g;
    if (!self->first && self->p.later_probe_steps)
        return self->p.later_probe_steps;
    return self->p.probe_steps;
}

/* Issues the run for runs[i]: the first run of a search takes the snapshot, every later one
 * starts from it. */
void omv_opt_issue_run(omv_optimizer_t *self, size_t i, double now_s)
{
    const omv_opt_run_t *r = &self->runs[i];
    unsigned flags = OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE |
                     (self->snap ? OMV_OPT_CMD_RESTORE : OMV_OPT_CMD_SNAPSHOT);
    self->snap = true;
    self->cur = i;
    self->probes_total++;
    omv_opt_issue(self, flags, r->g, r->momentum, r->lr, now_s, probe_budget(self, r->g));
}

static void rec_probe(omv_optimizer_t *self, const omv_opt_run_t *r, double now_s, bool reused,
                      const char *reason)
{
    omv_opt_rec_begin(self, "probe", now_s);
    omv_opt_json_str(&self->log, "stage", omv_opt_stage_names[r->stage]);
    omv_opt_rec_config(self, r->g, r->momentum, r->lr);
    omv_opt_json_str(&self->log, "outcome", omv_opt_outcome_names[r->out]);
    omv_strbuf_printf(&self->log, ",\"reused\":%s", reused ? "true" : "false");
    omv_opt_json_num(&self->log, "score", r->score);
    omv_opt_json_num(&self->log, "score_se", r->se);
    if (!reused) {
        omv_opt_json_num(&self->log, "first_loss", self->first_loss);
        omv_strbuf_printf(&self->log, ",\"steps\":%u,\"observations\":%llu",
                          omv_opt_run_slowest(self), (unsigned long long)self->n_obs);
        omv_opt_json_num(&self->log, "seconds", now_s - self->run_start_s);
        omv_opt_json_num(&self->log, "images_per_s", omv_opt_run_images_per_s(self));
    }
    omv_opt_json_num(&self->log, "s_per_iter", r->spi);
    if (reason)
        omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_end(self);
}

/* A configuration diverged: skips every pending one of the same g that is at least as
 * aggressive, that is whose learning rate and momentum are both at least its own. */
static void prune(omv_optimizer_t *self, const omv_opt_run_t *bad, double now_s)
{
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        omv_opt_run_t *r = &self->runs[i];
        if (r->out != OMV_OPT_OUT_PENDING || r->g != bad->g || r->lr < bad->lr ||
            r->momentum < bad->momentum)
            continue;
        r->out = OMV_OPT_OUT_SKIPPED;
        omv_opt_rec_begin(self, "skip", now_s);
        omv_opt_rec_config(self, r->g, r->momentum, r->lr);
        omv_strbuf_printf(&self->log,
                          ",\"reason\":\"at least as aggressive as lr %g momentum %g, which "
                          "diverged\"",
                          bad->lr, bad->momentum);
        omv_opt_rec_end(self);
    }
}

/* Whether a and b score the same: within tie_rel x |the lower|, or (noise 1) within tie_z
 * standard errors of their difference. */
static bool tied(const omv_optimizer_t *self, const omv_opt_run_t *lo, const omv_opt_run_t *r,
                 bool noise)
{
    double limit = lo->score + self->p.tie_rel * fabs(lo->score);
    if (noise && self->p.tie_z > 0 && isfinite(lo->se) && isfinite(r->se)) {
        double n = lo->score + self->p.tie_z * sqrt(lo->se * lo->se + r->se * r->se);
        if (n > limit)
            limit = n;
    }
    return r->score <= limit;
}

static bool scored(const omv_opt_run_t *r)
{
    return (r->out == OMV_OPT_OUT_OK || r->out == OMV_OPT_OUT_TIMEOUT) && isfinite(r->score);
}

/* The best of the stage's scored configurations, in two steps.
 * 1. The learning rate: the largest among configurations whose score ties with the lowest,
 *    where a tie is within tie_rel x |best| or within tie_z standard errors of the difference.
 *    At a low loss the minibatches' noise is as large as the differences between
 *    configurations, and a learning rate once dropped never comes back: it drops only on a
 *    difference the probes can resolve.
 * 2. Among that learning rate's configurations: the lowest score, where scores within tie_rel
 *    tie and the larger momentum wins (the noise rule is not used here: it would favour the
 *    most aggressive momentum, which short probes cannot show to be unstable).
 * Returns its index, or -1 when none was scored. */
static long choose(const omv_optimizer_t *self)
{
    long b = -1;
    for (size_t i = self->stage_begin; i < self->n_runs; i++)
        if (scored(&self->runs[i]) && (b < 0 || self->runs[i].score < self->runs[b].score))
            b = (long)i;
    if (b < 0)
        return -1;
    double lr = self->runs[b].lr;
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const omv_opt_run_t *r = &self->runs[i];
        if (scored(r) && r->lr > lr && tied(self, &self->runs[b], r, true))
            lr = r->lr;
    }
    long lb = -1;
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const omv_opt_run_t *r = &self->runs[i];
        if (scored(r) && r->lr == lr && (lb < 0 || r->score < self->runs[lb].score))
            lb = (long)i;
    }
    long pick = -1;
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const omv_opt_run_t *r = &self->runs[i];
        if (!scored(r) || r->lr != lr || !tied(self, &self->runs[lb], r, false))
            continue;
        if (pick < 0 || r->momentum > self->runs[pick].momentum)
            pick = (long)i;
    }
    return pick;
}

static void start_phase(omv_optimizer_t *self, uint32_t g, double momentum, double lr,
                        const char *reason, double now_s)
{
    bool restore = self->snap;
    unsigned flags = 0;
    if (restore)
        flags |= OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_DONE_SEARCH;
    if (restore || self->gen == 0 || g != self->g || momentum != self->momentum || lr != self->lr)
        flags |= OMV_OPT_CMD_SET;
    omv_opt_rec_begin(self, "phase", now_s);
    omv_opt_rec_config(self, g, momentum, lr);
    omv_strbuf_printf(&self->log, ",\"restore\":%s", restore ? "true" : "false");
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_end(self);
    self->state = OMV_OPT_STATE_RUNNING;
    self->phase_g = g;
    self->phase_m = momentum;
    self->phase_lr = lr;
    /* The base the search restored is where this phase starts: its rollback point. */
    self->base_phase = restore;
    self->watch = true;
    if (flags)
        omv_opt_issue(self, flags, g, momentum, lr, now_s, self->p.phase_steps);
    else
        omv_opt_run_reset(self, now_s, self->p.phase_steps);
}

static void cold_done(omv_optimizer_t *self, double now_s)
{
    long b = choose(self);
    const char *reason;
    if (b < 0) {
        self->lr_ref = self->p.lr_grid[0];
        reason = "every learning rate diverged: the smallest";
    } else {
        self->lr_ref = self->runs[b].lr;
        reason = self->n_runs - self->stage_begin == 1 ? "the only learning rate"
                                                       : "lowest score (ties: larger lr)";
    }
    const omv_opt_run_t *first = &self->runs[self->stage_begin];
    omv_opt_rec_begin(self, "choose", now_s);
    omv_opt_json_str(&self->log, "stage", "cold");
    omv_opt_rec_config(self, first->g, first->momentum, self->lr_ref);
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_candidates(self);
    omv_opt_rec_end(self);
    if (self->tune_g && omv_opt_allowed_g(self, UINT32_MAX) > 1) {
        /* The timing stage. */
        start_stage(self, OMV_OPT_STAGE_TIMING);
        self->g_cur = 1;
        size_t n = 0;
        for (size_t i = 0; i < self->n_runs; i++)
            if (self->runs[i].g == 1 && isfinite(self->runs[i].spi))
                self->scratch[n++] = self->runs[i].spi;
        qsort(self->scratch, n, sizeof(double), omv_opt_cmp_double);
        self->spi_cur = n == 0 ? NAN : self->scratch[n / 2];
        next_probe(self, now_s);
        return;
    }
    self->g_he = self->g_search = omv_opt_allowed_g(self, 1);
    omv_opt_start_grid(self, now_s);
}

static void timing_choose(omv_optimizer_t *self, const char *reason, double now_s)
{
    self->g_he = self->g_search = self->g_cur;
    omv_opt_rec_begin(self, "choose", now_s);
    omv_opt_json_str(&self->log, "stage", "timing");
    omv_strbuf_printf(&self->log, ",\"g\":%u", self->g_cur);
    omv_opt_json_num(&self->log, "s_per_iter", self->spi_cur);
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_candidates(self);
    omv_opt_rec_end(self);
    omv_opt_start_grid(self, now_s);
}

/* The timing stage: a run at g = 1 when the cold start measured none, then g doubles while
 * seconds per iteration fall by he_gain or more. Runs use the chosen learning rate and the least
 * aggressive momentum (0, or the fixed one): only their time counts. */
void omv_opt_timing_next(omv_optimizer_t *self, double now_s)
{
    double m = self->tune_m ? 0.0 : self->p.momentum;
    uint32_t g = isfinite(self->spi_cur) ? self->g_cur * 2 : 1;
    if (g > self->g_max || self->p.workers % g != 0) {
        timing_choose(self,
                      g > self->g_max && self->p.workers % g == 0
                          ? "no larger g: the live workers are fewer"
                          : "no larger g divides the workers",
                      now_s);
        return;
    }
    add_run(self, OMV_OPT_STAGE_TIMING, g, m, self->lr_ref);
    omv_opt_issue_run(self, self->n_runs - 1, now_s);
}

static void timing_done(omv_optimizer_t *self, const omv_opt_run_t *r, double now_s)
{
    char reason[160];
    if (!isfinite(self->spi_cur)) { /* the run at g = 1 */
        self->spi_cur = r->spi;
        if (!isfinite(r->spi)) {
            timing_choose(self, "could not time g=1", now_s);
            return;
        }
        omv_opt_timing_next(self, now_s);
        return;
    }
    if (isfinite(r->spi) && r->spi <= (1.0 - self->p.he_gain) * self->spi_cur) {
        omv_opt_rec_begin(self, "grow", now_s);
        omv_strbuf_printf(&self->log, ",\"from\":%u,\"to\":%u", self->g_cur, r->g);
        omv_opt_json_num(&self->log, "s_per_iter", r->spi);
        snprintf(reason, sizeof(reason), "%.4g s/iter against %.4g at g=%u: at least %g%% better",
                 r->spi, self->spi_cur, self->g_cur, self->p.he_gain * 100.0);
        omv_opt_json_str(&self->log, "reason", reason);
        omv_opt_rec_end(self);
        self->g_cur = r->g;
        self->spi_cur = r->spi;
        omv_opt_timing_next(self, now_s);
        return;
    }
    snprintf(reason, sizeof(reason),
             "g=%u: %.4g s/iter against %.4g at g=%u, less than %g%% better", r->g, r->spi,
             self->spi_cur, self->g_cur, self->p.he_gain * 100.0);
    timing_choose(self, reason, now_s);
}

/* Whether momentum 0 (run b) beats every larger momentum at its learning rate by more than the
 * probes' noise (tie_z standard errors of the difference): halving g is a big step (it costs
 * speed for the rest of the phase), not one to take on a minibatch's luck. */
static bool zero_clearly_best(const omv_optimizer_t *self, long b)
{
    const omv_opt_run_t *z = &self->runs[b];
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const omv_opt_run_t *r = &self->runs[i];
        if (scored(r) && r->lr == z->lr && r->momentum > 0.0 && tied(self, z, r, true))
            return false;
    }
    return true;
}

static void grid_done(omv_optimizer_t *self, double now_s)
{
    size_t n = self->n_runs - self->stage_begin;
    long b = n == 1 ? (long)self->stage_begin : choose(self);
    const char *reason = n == 1 ? "the only configuration"
                                : "lowest score (ties: larger lr, "
                                  "then larger momentum)";
    double m, lr;
    if (b < 0) {
        /* Every probe diverged: the least aggressive configuration. */
        m = self->runs[self->stage_begin].momentum;
        lr = self->runs[self->stage_begin].lr;
        reason = "every probe diverged: the least aggressive";
    } else {
        m = self->runs[b].momentum;
        lr = self->runs[b].lr;
    }
    omv_opt_rec_begin(self, "choose", now_s);
    omv_opt_json_str(&self->log, "stage", "grid");
    omv_opt_rec_config(self, self->g_search, m, lr);
    omv_opt_json_num(&self->log, "score", b < 0 ? NAN : self->runs[b].score);
    omv_opt_json_str(&self->log, "reason", reason);
    omv_opt_rec_candidates(self);
    omv_opt_rec_end(self);
    if (self->tune_g && self->tune_m && m == 0.0 && self->g_search > 1 &&
        zero_clearly_best(self, b)) {
        omv_opt_rec_begin(self, "halve", now_s);
        omv_strbuf_printf(&self->log, ",\"from\":%u,\"to\":%u", self->g_search, self->g_search / 2);
        omv_opt_json_str(&self->log, "reason",
                         "best momentum is 0: asynchrony already supplies too much momentum");
        omv_opt_rec_end(self);
        self->g_search /= 2;
        omv_opt_start_grid(self, now_s);
        return;
    }
    start_phase(self, self->g_search, m, lr,
                self->snap ? "search done: continue from the snapshot, probe work discarded"
                           : "nothing to probe",
                now_s);
}

/* The grid for g_search: learning rates {lr_ref / 10, lr_ref} (or the fixed one; in the first
 * search with first_grid_cold_lr only lr_ref) x the momentum grid (or the fixed one), in order
 * of rising learning rate, then momentum, so that a configuration is probed after every one
 * less aggressive than it. */
void omv_opt_start_grid(omv_optimizer_t *self, double now_s)
{
    start_stage(self, OMV_OPT_STAGE_GRID);
    double lrs[2];
    uint32_t n_lr = 0;
    if (self->tune_lr) {
        if (!(self->first && self->p.first_grid_cold_lr))
            lrs[n_lr++] = self->lr_ref / 10.0;
        lrs[n_lr++] = self->lr_ref;
    } else {
        lrs[n_lr++] = self->p.lr;
    }
    for (uint32_t i = 0; i < n_lr; i++) {
        if (self->tune_m)
            for (uint32_t k = 0; k < self->p.n_momentum_grid; k++)
                add_run(self, OMV_OPT_STAGE_GRID, self->g_search, self->p.momentum_grid[k], lrs[i]);
        else
            add_run(self, OMV_OPT_STAGE_GRID, self->g_search, self->p.momentum, lrs[i]);
    }
    if (self->n_runs - self->stage_begin == 1) {
        self->runs[self->stage_begin].out = OMV_OPT_OUT_OK;
        grid_done(self, now_s);
        return;
    }
    next_probe(self, now_s);
}

static void start_cold(omv_optimizer_t *self, double now_s)
{
    start_stage(self, OMV_OPT_STAGE_COLD);
    uint32_t g = omv_opt_allowed_g(self, 1);
    double m = self->tune_m ? self->p.cold_momentum : self->p.momentum;
    for (uint32_t i = 0; i < self->p.n_lr_grid; i++)
        add_run(self, OMV_OPT_STAGE_COLD, g, m, self->p.lr_grid[i]);
    if (self->p.n_lr_grid == 1) {
        self->runs[self->stage_begin].out = OMV_OPT_OUT_OK;
        cold_done(self, now_s);
        return;
    }
    next_probe(self, now_s);
}

/* An earlier scored run of this search with the same configuration (cold and grid runs
 * compare the same thing from the same snapshot), or NULL. */
static const omv_opt_run_t *find_same(const omv_optimizer_t *self, const omv_opt_run_t *r)
{
    for (const omv_opt_run_t *q = self->runs; q < r; q++)
        if (q->probed && q->stage != OMV_OPT_STAGE_TIMING && q->g == r->g && q->lr == r->lr &&
            q->momentum == r->momentum && q->out != OMV_OPT_OUT_SKIPPED &&
            q->out != OMV_OPT_OUT_PENDING)
            return q;
    return NULL;
}

/* Issues the next pending run of the stage, or ends the stage. */
static void next_probe(omv_optimizer_t *self, double now_s)
{
    if (self->stage == OMV_OPT_STAGE_TIMING) {
        omv_opt_timing_next(self, now_s);
        return;
    }
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        omv_opt_run_t *r = &self->runs[i];
        if (r->out != OMV_OPT_OUT_PENDING)
            continue;
        const omv_opt_run_t *same = find_same(self, r);
        if (same) {
            r->out = same->out;
            r->score = same->score;
            r->se = same->se;
            r->spi = same->spi;
            r->probed = true;
            rec_probe(self, r, now_s, true, NULL);
            if (r->out == OMV_OPT_OUT_DIVERGED)
                prune(self, r, now_s);
            continue;
        }
        omv_opt_issue_run(self, i, now_s);
        return;
    }
    if (self->stage == OMV_OPT_STAGE_COLD)
        cold_done(self, now_s);
    else
        grid_done(self, now_s);
}

/* The current run ended (budget reached, diverged or timed out). */
void omv_opt_end_run(omv_optimizer_t *self, omv_opt_outcome_t out, const char *reason, double now_s)
{
    omv_opt_run_t *r = &self->runs[self->cur];
    r->out = out;
    r->probed = true;
    r->score = out == OMV_OPT_OUT_DIVERGED ? NAN : omv_opt_ring_mean(self, (self->n_obs + 1) / 2);
    r->se = out == OMV_OPT_OUT_DIVERGED ? NAN : omv_opt_ring_se(self, (self->n_obs + 1) / 2);
    r->spi = omv_opt_run_spi(self);
    rec_probe(self, r, now_s, false, reason);
    if (r->stage == OMV_OPT_STAGE_TIMING) {
        timing_done(self, r, now_s);
        return;
    }
    if (out == OMV_OPT_OUT_DIVERGED)
        prune(self, r, now_s);
    next_probe(self, now_s);
}

/* Begins the search for the next phase. base: the probe base already holds the model the
 * search is to start from (a diverged phase's start), so its first probe restores it. */
void omv_opt_begin_search(omv_optimizer_t *self, bool base, double now_s)
{
    bool first = self->phase == 0;
    self->state = OMV_OPT_STATE_PROBING;
    self->first = first;
    self->snap = base;
    self->n_runs = self->stage_begin = 0;
    self->phase++;
    if (first) {
        const omv_optimizer_params_t *p = &self->p;
        omv_opt_rec_begin(self, "start", now_s);
        omv_strbuf_printf(&self->log, ",\"workers\":%u", p->workers);
        if (self->tune_g)
            omv_strbuf_printf(&self->log, ",\"g\":\"tune\"");
        else
            omv_strbuf_printf(&self->log, ",\"g\":%d", p->groups);
        if (self->tune_m)
            omv_strbuf_printf(&self->log, ",\"momentum\":\"tune\"");
        else
            omv_opt_json_num(&self->log, "momentum", p->momentum);
        if (self->tune_lr)
            omv_strbuf_printf(&self->log, ",\"lr\":\"tune\"");
        else
            omv_opt_json_num(&self->log, "lr", p->lr);
        omv_strbuf_printf(&self->log, ",\"phase_steps\":%u,\"probe_steps\":%u", p->phase_steps,
                          p->probe_steps);
        omv_opt_rec_end(self);
    }
    if (!first) {
        /* The schedule: the learning rate stays or drops tenfold. */
        self->lr_ref = self->tune_lr ? self->next_lr_ref : self->p.lr;
        self->g_search = omv_opt_allowed_g(self, self->g_he ? self->g_he : 1);
        omv_opt_start_grid(self, now_s);
        return;
    }
    if (self->tune_lr) {
        start_cold(self, now_s);
        return;
    }
    self->lr_ref = self->p.lr;
    if (self->tune_g && omv_opt_allowed_g(self, UINT32_MAX) > 1) {
        start_stage(self, OMV_OPT_STAGE_TIMING);
        self->g_cur = 1;
        self->spi_cur = NAN;
        omv_opt_timing_next(self, now_s);
        return;
    }
    self->g_he = self->g_search = omv_opt_allowed_g(self, 1);
    omv_opt_start_grid(self, now_s);
}
