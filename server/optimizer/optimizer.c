/* The Omnivore optimizer's state machine: cold start, hardware-efficiency search over g, the
 * momentum x learning-rate grid from one snapshot, phases, their rollback when one diverges,
 * membership changes, resuming from saved state, and the decision log.
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
#include "optimizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { STAGE_COLD, STAGE_TIMING, STAGE_GRID } stage_t;
typedef enum { OUT_PENDING, OUT_OK, OUT_DIVERGED, OUT_TIMEOUT, OUT_SKIPPED } outcome_t;

static const char *const stage_names[] = {"cold", "timing", "grid"};
static const char *const outcome_names[] = {"pending", "ok", "diverged", "timeout", "skipped"};

/* One configuration of the current search: probed, pending or skipped. */
typedef struct {
    stage_t stage;
    uint32_t g;
    double momentum, lr;
    outcome_t out;
    bool probed; /* a run was made for it (or reused); false: chosen without comparison */
    double score, spi;
    double se; /* standard error of score: the spread of the losses it averages */
} run_t;

struct omv_optimizer {
    omv_optimizer_params_t p; /* validated; grids sorted ascending */
    bool tune_g, tune_m, tune_lr;

    omv_opt_state_t state;
    uint32_t phase;
    uint64_t gen;
    uint32_t g; /* the configuration in effect (latest SET) */
    double momentum, lr;
    uint32_t g_max; /* live trainers: no g above it */

    /* The last phase that began: the search's choice (its g before any cap by membership). */
    uint32_t phase_g;
    double phase_m, phase_lr;
    bool base_phase; /* the probe base holds the running phase's starting model */
    bool watch;      /* the running phase is checked for divergence */

    /* The search. */
    stage_t stage;
    bool first;         /* the first search (cold start, timing) */
    bool snap;          /* the probe base is this search's (taken, or the rolled-back phase's) */
    double lr_ref;      /* the grid probes lr_ref and lr_ref / 10 */
    double next_lr_ref; /* lr_ref of the next search: the phase's lr, a tenth after divergence */
    uint32_t g_he;      /* g for hardware efficiency; 0 until measured */
    uint32_t g_search;  /* g of the current grid */
    uint32_t g_cur;     /* timing: largest g accepted so far */
    double spi_cur;     /* its seconds per iteration */
    run_t *runs;        /* [cap_runs] the search's configurations, in probe order */
    size_t n_runs, cap_runs, stage_begin, cur;
    double *scratch; /* [cap_runs] */

    /* The current run (probe or phase). */
    uint32_t budget; /* steps of the slowest group */
    double run_start_s;
    uint32_t *steps; /* [N] steps per group (g <= N always) */
    uint32_t n_reached, n_warm;
    double t0, t_last;
    uint64_t timed, timed_images;
    double *ring; /* [ring_cap] latest losses */
    size_t ring_cap;
    uint64_t n_obs;
    double first_loss;
    double ref_sum; /* the first window's losses: the divergence reference */
    uint32_t ref_n;

    uint64_t probes_total, divergences_total;

    bool has_cmd;
    omv_opt_cmd_t cmd;
    omv_strbuf_t log; /* JSON lines */
};

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts a grid ascending; returns whether every value is in [lo, hi) and distinct. */
static bool sort_grid(double *v, uint32_t n, double lo, double hi, bool lo_open)
{
    if (n == 0 || n > OMV_OPT_GRID_MAX)
        return false;
    qsort(v, n, sizeof(*v), cmp_double);
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

/* The largest g allowed up to want: a tuned g is a power of two that divides N and is at most
 * the live trainers; a fixed one is the job's, capped by the live trainers. */
static uint32_t allowed_g(const omv_optimizer_t *self, uint32_t want)
{
    uint32_t most = want < self->g_max ? want : self->g_max;
    if (!self->tune_g)
        return (uint32_t)self->p.groups < self->g_max ? (uint32_t)self->p.groups : self->g_max;
    uint32_t g = 1;
    while ((uint64_t)g * 2 <= most && self->p.workers % (g * 2) == 0)
        g *= 2;
    return g;
}

/* ---- decision records ---- */

static void json_num(omv_strbuf_t *sb, const char *key, double v)
{
    if (isfinite(v))
        omv_strbuf_printf(sb, ",\"%s\":%.6g", key, v);
    else
        omv_strbuf_printf(sb, ",\"%s\":null", key);
}

static void json_str(omv_strbuf_t *sb, const char *key, const char *v)
{
    omv_strbuf_printf(sb, ",\"%s\":", key);
    omv_strbuf_json_string(sb, v);
}

static void rec_begin(omv_optimizer_t *self, const char *event, double now_s)
{
    omv_strbuf_printf(&self->log, "{\"event\":\"%s\"", event);
    /* Ten digits: monotonic seconds run to five before the point. */
    if (isfinite(now_s))
        omv_strbuf_printf(&self->log, ",\"t_s\":%.10g", now_s);
    else
        omv_strbuf_printf(&self->log, ",\"t_s\":null");
    omv_strbuf_printf(&self->log, ",\"phase\":%u", self->phase);
}

static void rec_config(omv_optimizer_t *self, uint32_t g, double momentum, double lr)
{
    omv_strbuf_printf(&self->log, ",\"g\":%u", g);
    json_num(&self->log, "momentum", momentum);
    json_num(&self->log, "lr", lr);
}

static void rec_end(omv_optimizer_t *self)
{
    omv_strbuf_append(&self->log, "}\n", 2);
}

/* The stage's configurations, as a "candidates" array. */
static void rec_candidates(omv_optimizer_t *self)
{
    omv_strbuf_t *sb = &self->log;
    omv_strbuf_append(sb, ",\"candidates\":[", 15);
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const run_t *r = &self->runs[i];
        omv_strbuf_printf(sb, "%s{\"g\":%u", i > self->stage_begin ? "," : "", r->g);
        json_num(sb, "momentum", r->momentum);
        json_num(sb, "lr", r->lr);
        json_str(sb, "outcome",
                 r->probed || r->out == OUT_SKIPPED ? outcome_names[r->out] : "not probed");
        json_num(sb, "score", r->score);
        json_num(sb, "score_se", r->se);
        json_num(sb, "s_per_iter", r->spi);
        omv_strbuf_append(sb, "}", 1);
    }
    omv_strbuf_append(sb, "]", 1);
}

/* ---- the current run ---- */

static void reset_run(omv_optimizer_t *self, double now_s, uint32_t budget)
{
    self->budget = budget;
    self->run_start_s = now_s;
    memset(self->steps, 0, sizeof(*self->steps) * self->p.workers);
    self->n_reached = self->n_warm = 0;
    self->t0 = self->t_last = 0.0;
    self->timed = self->timed_images = 0;
    self->n_obs = 0;
    self->first_loss = NAN;
    self->ref_sum = 0.0;
    self->ref_n = 0;
}

/* Mean of the newest k losses. */
static double ring_mean(const omv_optimizer_t *self, uint64_t k)
{
    if (k > self->n_obs)
        k = self->n_obs;
    if (k > self->ring_cap)
        k = self->ring_cap;
    if (k == 0)
        return NAN;
    double sum = 0.0;
    for (uint64_t i = 0; i < k; i++)
        sum += self->ring[(self->n_obs - 1 - i) % self->ring_cap];
    return sum / (double)k;
}

/* The standard error of ring_mean(self, k): the sample deviation of those losses over sqrt(k).
 * Neighbouring losses are not independent (they share a trend), which only makes it larger. */
static double ring_se(const omv_optimizer_t *self, uint64_t k)
{
    if (k > self->n_obs)
        k = self->n_obs;
    if (k > self->ring_cap)
        k = self->ring_cap;
    if (k < 2)
        return NAN;
    double mean = ring_mean(self, k), ss = 0.0;
    for (uint64_t i = 0; i < k; i++) {
        double dv = self->ring[(self->n_obs - 1 - i) % self->ring_cap] - mean;
        ss += dv * dv;
    }
    return sqrt(ss / (double)(k - 1) / (double)k);
}

/* Seconds per iteration (one group step) of the whole system, after every group's warm-up. */
static double run_spi(const omv_optimizer_t *self)
{
    return self->timed > 0 ? (self->t_last - self->t0) / (double)self->timed : NAN;
}

static double run_images_per_s(const omv_optimizer_t *self)
{
    double dt = self->t_last - self->t0;
    return self->timed > 0 && dt > 0.0 ? (double)self->timed_images / dt : NAN;
}

/* Steps of the run's slowest group. */
static uint32_t run_slowest(const omv_optimizer_t *self)
{
    uint32_t slowest = UINT32_MAX;
    for (uint32_t k = 0; k < self->g && k < self->p.workers; k++)
        slowest = self->steps[k] < slowest ? self->steps[k] : slowest;
    return slowest == UINT32_MAX ? 0 : slowest;
}

/* The divergence window of the current run. */
static uint32_t run_window(const omv_optimizer_t *self)
{
    return self->state == OMV_OPT_STATE_RUNNING ? self->p.phase_diverge_window
                                                : self->p.diverge_window;
}

/* Whether the run diverged with this newest loss (already in the ring): a loss that is not
 * finite, or the mean of the latest window above diverge_factor x the mean of the first. */
static bool run_diverged(const omv_optimizer_t *self, double loss, char *reason, size_t cap)
{
    uint32_t w = run_window(self);
    if (!isfinite(loss)) {
        snprintf(reason, cap, "loss %g is not finite", loss);
        return true;
    }
    if (self->n_obs <= w || self->ref_n == 0)
        return false;
    double first = self->ref_sum / self->ref_n, recent = ring_mean(self, w);
    if (recent <= self->p.diverge_factor * first)
        return false;
    snprintf(reason, cap, "mean of the last %u losses %.4g > %g x the first %u's %.4g", w, recent,
             self->p.diverge_factor, w, first);
    return true;
}

/* Starts configuration generation gen + 1 with the given flags (SET always among them). A
 * command that was not polled yet is replaced, keeping what it asked of the probe base: a
 * SNAPSHOT still to be taken makes a RESTORE needless (the base is the model as it is). */
static void issue(omv_optimizer_t *self, unsigned flags, uint32_t g, double momentum, double lr,
                  double now_s, uint32_t budget)
{
    if (self->has_cmd) {
        unsigned keep = OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_RESTORE;
        if (!(flags & OMV_OPT_CMD_PROBE))
            keep |= OMV_OPT_CMD_DONE_SEARCH;
        flags |= self->cmd.flags & keep;
        if (flags & OMV_OPT_CMD_SNAPSHOT)
            flags &= ~(unsigned)OMV_OPT_CMD_RESTORE;
    }
    self->gen++;
    self->cmd = (omv_opt_cmd_t){flags, self->gen, g, momentum, lr};
    self->has_cmd = true;
    if (flags & OMV_OPT_CMD_SET) {
        self->g = g;
        self->momentum = momentum;
        self->lr = lr;
    }
    reset_run(self, now_s, budget);
}

/* ---- the search ---- */

static void next_probe(omv_optimizer_t *self, double now_s);
static void start_grid(omv_optimizer_t *self, double now_s);

static run_t *add_run(omv_optimizer_t *self, stage_t stage, uint32_t g, double momentum, double lr)
{
    if (self->n_runs == self->cap_runs) {
        /* Only membership changes restart parts of a search and get here. */
        size_t cap = self->cap_runs * 2;
        run_t *runs = realloc(self->runs, cap * sizeof(*runs));
        if (runs == NULL)
            abort();
        self->runs = runs;
        double *scratch = realloc(self->scratch, cap * sizeof(*scratch));
        if (scratch == NULL)
            abort();
        self->scratch = scratch;
        self->cap_runs = cap;
    }
    run_t *r = &self->runs[self->n_runs++];
    *r = (run_t){stage, g, momentum, lr, OUT_PENDING, false, NAN, NAN, NAN};
    return r;
}

static void start_stage(omv_optimizer_t *self, stage_t stage)
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
static void issue_run(omv_optimizer_t *self, size_t i, double now_s)
{
    const run_t *r = &self->runs[i];
    unsigned flags = OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE |
                     (self->snap ? OMV_OPT_CMD_RESTORE : OMV_OPT_CMD_SNAPSHOT);
    self->snap = true;
    self->cur = i;
    self->probes_total++;
    issue(self, flags, r->g, r->momentum, r->lr, now_s, probe_budget(self, r->g));
}

static void rec_probe(omv_optimizer_t *self, const run_t *r, double now_s, bool reused,
                      const char *reason)
{
    rec_begin(self, "probe", now_s);
    json_str(&self->log, "stage", stage_names[r->stage]);
    rec_config(self, r->g, r->momentum, r->lr);
    json_str(&self->log, "outcome", outcome_names[r->out]);
    omv_strbuf_printf(&self->log, ",\"reused\":%s", reused ? "true" : "false");
    json_num(&self->log, "score", r->score);
    json_num(&self->log, "score_se", r->se);
    if (!reused) {
        json_num(&self->log, "first_loss", self->first_loss);
        omv_strbuf_printf(&self->log, ",\"steps\":%u,\"observations\":%llu", run_slowest(self),
                          (unsigned long long)self->n_obs);
        json_num(&self->log, "seconds", now_s - self->run_start_s);
        json_num(&self->log, "images_per_s", run_images_per_s(self));
    }
    json_num(&self->log, "s_per_iter", r->spi);
    if (reason)
        json_str(&self->log, "reason", reason);
    rec_end(self);
}

/* A configuration diverged: skips every pending one of the same g that is at least as
 * aggressive, that is whose learning rate and momentum are both at least its own. */
static void prune(omv_optimizer_t *self, const run_t *bad, double now_s)
{
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        run_t *r = &self->runs[i];
        if (r->out != OUT_PENDING || r->g != bad->g || r->lr < bad->lr ||
            r->momentum < bad->momentum)
            continue;
        r->out = OUT_SKIPPED;
        rec_begin(self, "skip", now_s);
        rec_config(self, r->g, r->momentum, r->lr);
        omv_strbuf_printf(&self->log,
                          ",\"reason\":\"at least as aggressive as lr %g momentum %g, which "
                          "diverged\"",
                          bad->lr, bad->momentum);
        rec_end(self);
    }
}

/* Whether a and b score the same: within tie_rel x |the lower|, or (noise 1) within tie_z
 * standard errors of their difference. */
static bool tied(const omv_optimizer_t *self, const run_t *lo, const run_t *r, bool noise)
{
    double limit = lo->score + self->p.tie_rel * fabs(lo->score);
    if (noise && self->p.tie_z > 0 && isfinite(lo->se) && isfinite(r->se)) {
        double n = lo->score + self->p.tie_z * sqrt(lo->se * lo->se + r->se * r->se);
        if (n > limit)
            limit = n;
    }
    return r->score <= limit;
}

static bool scored(const run_t *r)
{
    return (r->out == OUT_OK || r->out == OUT_TIMEOUT) && isfinite(r->score);
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
        const run_t *r = &self->runs[i];
        if (scored(r) && r->lr > lr && tied(self, &self->runs[b], r, true))
            lr = r->lr;
    }
    long lb = -1;
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const run_t *r = &self->runs[i];
        if (scored(r) && r->lr == lr && (lb < 0 || r->score < self->runs[lb].score))
            lb = (long)i;
    }
    long pick = -1;
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const run_t *r = &self->runs[i];
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
    rec_begin(self, "phase", now_s);
    rec_config(self, g, momentum, lr);
    omv_strbuf_printf(&self->log, ",\"restore\":%s", restore ? "true" : "false");
    json_str(&self->log, "reason", reason);
    rec_end(self);
    self->state = OMV_OPT_STATE_RUNNING;
    self->phase_g = g;
    self->phase_m = momentum;
    self->phase_lr = lr;
    /* The base the search restored is where this phase starts: its rollback point. */
    self->base_phase = restore;
    self->watch = true;
    if (flags)
        issue(self, flags, g, momentum, lr, now_s, self->p.phase_steps);
    else
        reset_run(self, now_s, self->p.phase_steps);
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
    const run_t *first = &self->runs[self->stage_begin];
    rec_begin(self, "choose", now_s);
    json_str(&self->log, "stage", "cold");
    rec_config(self, first->g, first->momentum, self->lr_ref);
    json_str(&self->log, "reason", reason);
    rec_candidates(self);
    rec_end(self);
    if (self->tune_g && allowed_g(self, UINT32_MAX) > 1) {
        /* The timing stage. */
        start_stage(self, STAGE_TIMING);
        self->g_cur = 1;
        size_t n = 0;
        for (size_t i = 0; i < self->n_runs; i++)
            if (self->runs[i].g == 1 && isfinite(self->runs[i].spi))
                self->scratch[n++] = self->runs[i].spi;
        qsort(self->scratch, n, sizeof(double), cmp_double);
        self->spi_cur = n == 0 ? NAN : self->scratch[n / 2];
        next_probe(self, now_s);
        return;
    }
    self->g_he = self->g_search = allowed_g(self, 1);
    start_grid(self, now_s);
}

static void timing_choose(omv_optimizer_t *self, const char *reason, double now_s)
{
    self->g_he = self->g_search = self->g_cur;
    rec_begin(self, "choose", now_s);
    json_str(&self->log, "stage", "timing");
    omv_strbuf_printf(&self->log, ",\"g\":%u", self->g_cur);
    json_num(&self->log, "s_per_iter", self->spi_cur);
    json_str(&self->log, "reason", reason);
    rec_candidates(self);
    rec_end(self);
    start_grid(self, now_s);
}

/* The timing stage: a run at g = 1 when the cold start measured none, then g doubles while
 * seconds per iteration fall by he_gain or more. Runs use the chosen learning rate and the least
 * aggressive momentum (0, or the fixed one): only their time counts. */
static void timing_next(omv_optimizer_t *self, double now_s)
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
    add_run(self, STAGE_TIMING, g, m, self->lr_ref);
    issue_run(self, self->n_runs - 1, now_s);
}

static void timing_done(omv_optimizer_t *self, const run_t *r, double now_s)
{
    char reason[160];
    if (!isfinite(self->spi_cur)) { /* the run at g = 1 */
        self->spi_cur = r->spi;
        if (!isfinite(r->spi)) {
            timing_choose(self, "could not time g=1", now_s);
            return;
        }
        timing_next(self, now_s);
        return;
    }
    if (isfinite(r->spi) && r->spi <= (1.0 - self->p.he_gain) * self->spi_cur) {
        rec_begin(self, "grow", now_s);
        omv_strbuf_printf(&self->log, ",\"from\":%u,\"to\":%u", self->g_cur, r->g);
        json_num(&self->log, "s_per_iter", r->spi);
        snprintf(reason, sizeof(reason), "%.4g s/iter against %.4g at g=%u: at least %g%% better",
                 r->spi, self->spi_cur, self->g_cur, self->p.he_gain * 100.0);
        json_str(&self->log, "reason", reason);
        rec_end(self);
        self->g_cur = r->g;
        self->spi_cur = r->spi;
        timing_next(self, now_s);
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
    const run_t *z = &self->runs[b];
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        const run_t *r = &self->runs[i];
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
    rec_begin(self, "choose", now_s);
    json_str(&self->log, "stage", "grid");
    rec_config(self, self->g_search, m, lr);
    json_num(&self->log, "score", b < 0 ? NAN : self->runs[b].score);
    json_str(&self->log, "reason", reason);
    rec_candidates(self);
    rec_end(self);
    if (self->tune_g && self->tune_m && m == 0.0 && self->g_search > 1 &&
        zero_clearly_best(self, b)) {
        rec_begin(self, "halve", now_s);
        omv_strbuf_printf(&self->log, ",\"from\":%u,\"to\":%u", self->g_search, self->g_search / 2);
        json_str(&self->log, "reason",
                 "best momentum is 0: asynchrony already supplies too much momentum");
        rec_end(self);
        self->g_search /= 2;
        start_grid(self, now_s);
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
static void start_grid(omv_optimizer_t *self, double now_s)
{
    start_stage(self, STAGE_GRID);
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
                add_run(self, STAGE_GRID, self->g_search, self->p.momentum_grid[k], lrs[i]);
        else
            add_run(self, STAGE_GRID, self->g_search, self->p.momentum, lrs[i]);
    }
    if (self->n_runs - self->stage_begin == 1) {
        self->runs[self->stage_begin].out = OUT_OK;
        grid_done(self, now_s);
        return;
    }
    next_probe(self, now_s);
}

static void start_cold(omv_optimizer_t *self, double now_s)
{
    start_stage(self, STAGE_COLD);
    uint32_t g = allowed_g(self, 1);
    double m = self->tune_m ? self->p.cold_momentum : self->p.momentum;
    for (uint32_t i = 0; i < self->p.n_lr_grid; i++)
        add_run(self, STAGE_COLD, g, m, self->p.lr_grid[i]);
    if (self->p.n_lr_grid == 1) {
        self->runs[self->stage_begin].out = OUT_OK;
        cold_done(self, now_s);
        return;
    }
    next_probe(self, now_s);
}

/* An earlier scored run of this search with the same configuration (cold and grid runs
 * compare the same thing from the same snapshot), or NULL. */
static const run_t *find_same(const omv_optimizer_t *self, const run_t *r)
{
    for (const run_t *q = self->runs; q < r; q++)
        if (q->probed && q->stage != STAGE_TIMING && q->g == r->g && q->lr == r->lr &&
            q->momentum == r->momentum && q->out != OUT_SKIPPED && q->out != OUT_PENDING)
            return q;
    return NULL;
}

/* Issues the next pending run of the stage, or ends the stage. */
static void next_probe(omv_optimizer_t *self, double now_s)
{
    if (self->stage == STAGE_TIMING) {
        timing_next(self, now_s);
        return;
    }
    for (size_t i = self->stage_begin; i < self->n_runs; i++) {
        run_t *r = &self->runs[i];
        if (r->out != OUT_PENDING)
            continue;
        const run_t *same = find_same(self, r);
        if (same) {
            r->out = same->out;
            r->score = same->score;
            r->se = same->se;
            r->spi = same->spi;
            r->probed = true;
            rec_probe(self, r, now_s, true, NULL);
            if (r->out == OUT_DIVERGED)
                prune(self, r, now_s);
            continue;
        }
        issue_run(self, i, now_s);
        return;
    }
    if (self->stage == STAGE_COLD)
        cold_done(self, now_s);
    else
        grid_done(self, now_s);
}

/* The current run ended (budget reached, diverged or timed out). */
static void end_run(omv_optimizer_t *self, outcome_t out, const char *reason, double now_s)
{
    run_t *r = &self->runs[self->cur];
    r->out = out;
    r->probed = true;
    r->score = out == OUT_DIVERGED ? NAN : ring_mean(self, (self->n_obs + 1) / 2);
    r->se = out == OUT_DIVERGED ? NAN : ring_se(self, (self->n_obs + 1) / 2);
    r->spi = run_spi(self);
    rec_probe(self, r, now_s, false, reason);
    if (r->stage == STAGE_TIMING) {
        timing_done(self, r, now_s);
        return;
    }
    if (out == OUT_DIVERGED)
        prune(self, r, now_s);
    next_probe(self, now_s);
}

/* Begins the search for the next phase. base: the probe base already holds the model the
 * search is to start from (a diverged phase's start), so its first probe restores it. */
static void begin_search(omv_optimizer_t *self, bool base, double now_s)
{
    bool first = self->phase == 0;
    self->state = OMV_OPT_STATE_PROBING;
    self->first = first;
    self->snap = base;
    self->n_runs = self->stage_begin = 0;
    self->phase++;
    if (first) {
        const omv_optimizer_params_t *p = &self->p;
        rec_begin(self, "start", now_s);
        omv_strbuf_printf(&self->log, ",\"workers\":%u", p->workers);
        if (self->tune_g)
            omv_strbuf_printf(&self->log, ",\"g\":\"tune\"");
        else
            omv_strbuf_printf(&self->log, ",\"g\":%d", p->groups);
        if (self->tune_m)
            omv_strbuf_printf(&self->log, ",\"momentum\":\"tune\"");
        else
            json_num(&self->log, "momentum", p->momentum);
        if (self->tune_lr)
            omv_strbuf_printf(&self->log, ",\"lr\":\"tune\"");
        else
            json_num(&self->log, "lr", p->lr);
        omv_strbuf_printf(&self->log, ",\"phase_steps\":%u,\"probe_steps\":%u", p->phase_steps,
                          p->probe_steps);
        rec_end(self);
    }
    if (!first) {
        /* The schedule: the learning rate stays or drops tenfold. */
        self->lr_ref = self->tune_lr ? self->next_lr_ref : self->p.lr;
        self->g_search = allowed_g(self, self->g_he ? self->g_he : 1);
        start_grid(self, now_s);
        return;
    }
    if (self->tune_lr) {
        start_cold(self, now_s);
        return;
    }
    self->lr_ref = self->p.lr;
    if (self->tune_g && allowed_g(self, UINT32_MAX) > 1) {
        start_stage(self, STAGE_TIMING);
        self->g_cur = 1;
        self->spi_cur = NAN;
        timing_next(self, now_s);
        return;
    }
    self->g_he = self->g_search = allowed_g(self, 1);
    start_grid(self, now_s);
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
    rec_begin(self, "diverge", now_s);
    rec_config(self, self->g, self->momentum, self->lr);
    json_num(&self->log, "loss", ring_mean(self, run_window(self)));
    omv_strbuf_printf(&self->log, ",\"steps\":%u,\"restore\":%s", run_slowest(self),
                      can ? "true" : "false");
    json_num(&self->log, "lr_ref", can ? next : NAN);
    json_str(&self->log, "reason", reason);
    rec_end(self);
    if (!can) {
        self->watch = false;
        return;
    }
    self->divergences_total++;
    self->next_lr_ref = next;
    begin_search(self, true, now_s);
}

static void check_time_cap(omv_optimizer_t *self, double now_s)
{
    if (self->state == OMV_OPT_STATE_PROBING && !self->has_cmd && self->p.probe_max_s > 0.0 &&
        now_s - self->run_start_s >= self->p.probe_max_s)
        end_run(self, OUT_TIMEOUT, "probe_max_s reached", now_s);
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
    if (self->ref_n < run_window(self)) {
        self->ref_sum += obs->loss;
        self->ref_n++;
    }

    char reason[200] = "";
    if (self->state == OMV_OPT_STATE_RUNNING) {
        if (self->watch && run_diverged(self, obs->loss, reason, sizeof(reason))) {
            phase_diverged(self, reason, obs->now_s);
            return 0;
        }
        if (self->n_reached == self->g) {
            rec_begin(self, "phase_end", obs->now_s);
            json_num(&self->log, "loss", ring_mean(self, (self->n_obs + 1) / 2));
            json_num(&self->log, "s_per_iter", run_spi(self));
            rec_end(self);
            self->next_lr_ref = self->phase_lr;
            begin_search(self, false, obs->now_s);
        }
        return 0;
    }
    if (self->stage != STAGE_TIMING && run_diverged(self, obs->loss, reason, sizeof(reason))) {
        end_run(self, OUT_DIVERGED, reason, obs->now_s);
        return 0;
    }
    if (self->n_reached == self->g)
        end_run(self, OUT_OK, NULL, obs->now_s);
    else
        check_time_cap(self, obs->now_s);
    return 0;
}

int omv_optimizer_poll(omv_optimizer_t *self, double now_s, omv_opt_cmd_t *ret_cmd)
{
    if (self->state == OMV_OPT_STATE_IDLE)
        begin_search(self, false, now_s);
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
    rec_begin(self, "membership", now_s);
    omv_strbuf_printf(&self->log, ",\"workers\":%u,\"from\":%u,\"g_max\":%u", live, before,
                      allowed_g(self, UINT32_MAX));
    if (self->state == OMV_OPT_STATE_RUNNING) {
        /* The phase goes on with the steps it has left, regrouped (which also rebalances the
         * groups: one may have lost its last member), its g capped by the live workers. */
        uint32_t g = allowed_g(self, self->phase_g), done = run_slowest(self);
        uint32_t left = self->budget > done ? self->budget - done : 1;
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): phase %u goes on at g=%u for its %u steps left", live,
                 before, self->phase, g, left);
        omv_strbuf_printf(&self->log, ",\"g\":%u", g);
        json_str(&self->log, "reason", reason);
        rec_end(self);
        bool watch = self->watch;
        issue(self, OMV_OPT_CMD_SET, g, self->phase_m, self->phase_lr, now_s, left);
        self->watch = watch;
        return 1;
    }
    /* A search: the probe in flight is discarded (its steps ran on other hardware) and run
     * again from the snapshot, unless its g is no longer allowed. */
    run_t *r = &self->runs[self->cur];
    omv_strbuf_t *sb = &self->log;
    uint32_t g_next = self->stage == STAGE_TIMING
                          ? 1
                          : allowed_g(self, self->stage == STAGE_GRID ? self->g_search : r->g);
    omv_strbuf_printf(sb, ",\"g\":%u,\"discarded\":{\"stage\":\"%s\",\"g\":%u", g_next,
                      stage_names[r->stage], r->g);
    json_num(sb, "momentum", r->momentum);
    json_num(sb, "lr", r->lr);
    omv_strbuf_printf(sb, ",\"steps\":%u,\"observations\":%llu}", run_slowest(self),
                      (unsigned long long)self->n_obs);
    if (self->stage == STAGE_TIMING) {
        /* Every timing so far was of the old hardware: time again from g = 1. */
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): the probe in flight is discarded and the timing "
                 "starts again at g=1",
                 live, before);
        json_str(sb, "reason", reason);
        rec_end(self);
        r->out = OUT_SKIPPED;
        self->g_cur = 1;
        self->spi_cur = NAN;
        timing_next(self, now_s);
        return 1;
    }
    if (self->stage == STAGE_GRID && self->g_search > allowed_g(self, self->g_search)) {
        uint32_t g = allowed_g(self, self->g_search);
        snprintf(reason, sizeof(reason),
                 "%u live workers (were %u): the probe in flight is discarded and the grid "
                 "starts again at g=%u",
                 live, before, g);
        json_str(sb, "reason", reason);
        rec_end(self);
        r->out = OUT_SKIPPED;
        self->g_search = g;
        start_grid(self, now_s);
        return 1;
    }
    snprintf(reason, sizeof(reason),
             "%u live workers (were %u): the probe in flight is discarded and runs again", live,
             before);
    json_str(sb, "reason", reason);
    rec_end(self);
    /* A cold start's g (1, or the job's) may be capped now. */
    for (size_t i = self->stage_begin; i < self->n_runs; i++)
        self->runs[i].g = allowed_g(self, self->runs[i].g);
    issue_run(self, self->cur, now_s);
    return 1;
}

/* ---- durable state ---- */

void omv_optimizer_save(const omv_optimizer_t *self, omv_opt_saved_t *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->groups_he = self->g_he;
    ret->probes_total = self->probes_total;
    ret->divergences_total = self->divergences_total;
    if (self->state == OMV_OPT_STATE_RUNNING) {
        ret->phase = self->phase;
        ret->running = 1;
        ret->phase_steps_done = self->p.phase_steps - self->budget + run_slowest(self);
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
        rec_begin(self, "resume", now_s);
        json_str(&self->log, "state", "cold");
        json_str(&self->log, "reason", "no phase had begun: a cold start");
        rec_end(self);
        return 0; /* the first poll starts cold */
    }
    self->phase = saved->phase;
    self->phase_g = g;
    self->phase_m = m;
    self->phase_lr = lr;
    self->g_he = g_he ? g_he : allowed_g(self, 1);
    if (!saved->running) {
        self->next_lr_ref = lr_ref;
        rec_begin(self, "resume", now_s);
        json_str(&self->log, "state", "search");
        rec_config(self, g, m, lr);
        json_num(&self->log, "lr_ref", lr_ref);
        snprintf(reason, sizeof(reason),
                 "checkpoint written during the search after phase %u: it runs again from the "
                 "checkpoint's model (probes are not kept)",
                 saved->phase);
        json_str(&self->log, "reason", reason);
        rec_end(self);
        begin_search(self, false, now_s);
        return 0;
    }
    uint32_t done =
        saved->phase_steps_done < p->phase_steps ? saved->phase_steps_done : p->phase_steps - 1;
    uint32_t left = p->phase_steps - done;
    g = allowed_g(self, g);
    rec_begin(self, "resume", now_s);
    json_str(&self->log, "state", "phase");
    rec_config(self, g, m, lr);
    omv_strbuf_printf(&self->log, ",\"steps_left\":%u", left);
    snprintf(reason, sizeof(reason),
             "checkpoint written during phase %u: it goes on for its %u steps left, from the "
             "checkpoint's model",
             saved->phase, left);
    json_str(&self->log, "reason", reason);
    rec_end(self);
    self->state = OMV_OPT_STATE_RUNNING;
    /* The model resumed from is the phase's rollback point. */
    self->base_phase = true;
    self->watch = true;
    issue(self, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_DONE_SEARCH, g, m, lr, now_s,
          left);
    return 0;
}

/* ---- reports ---- */

void omv_optimizer_describe(const omv_optimizer_t *self, omv_strbuf_t *out)
{
    static const char *const names[] = {"fixed", "idle", "probing", "running"};
    omv_strbuf_printf(out, "phase %u, g=%u, momentum=%g, lr=%g, state=%s", self->phase, self->g,
                      self->momentum, self->lr, names[self->state]);
    if (self->state == OMV_OPT_STATE_PROBING)
        omv_strbuf_printf(out, " (%s %zu/%zu)", stage_names[self->stage],
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
