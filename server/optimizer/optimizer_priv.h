/* The optimizer's own state, shared by its files (optimizer.c, optimizer_search.c,
 * optimizer_run.c, optimizer_saved.c, optimizer_decisions.c) and included by no other. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optimizer.h"
#include "strbuf.h"

typedef enum { OMV_OPT_STAGE_COLD, OMV_OPT_STAGE_TIMING, OMV_OPT_STAGE_GRID } omv_opt_stage_t;
typedef enum {
    OMV_OPT_OUT_PENDING,
    OMV_OPT_OUT_OK,
    OMV_OPT_OUT_DIVERGED,
    OMV_OPT_OUT_TIMEOUT,
    OMV_OPT_OUT_SKIPPED
} omv_opt_outcome_t;

/* One configuration of the current search: probed, pending or skipped. */
typedef struct {
    omv_opt_stage_t stage;
    uint32_t g;
    double momentum, lr;
    omv_opt_outcome_t out;
    bool probed; /* a run was made for it (or reused); false: chosen without comparison */
    double score, spi;
    double se; /* standard error of score: the spread of the losses it averages */
} omv_opt_run_t;

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
    omv_opt_stage_t stage;
    bool first;          /* the first search (cold start, timing) */
    bool snap;           /* the probe base is this search's (taken, or the rolled-back phase's) */
    double lr_ref;       /* the grid probes lr_ref and lr_ref / 10 */
    double next_lr_ref;  /* lr_ref of the next search: the phase's lr, a tenth after divergence */
    uint32_t g_he;       /* g for hardware efficiency; 0 until measured */
    uint32_t g_search;   /* g of the current grid */
    uint32_t g_cur;      /* timing: largest g accepted so far */
    double spi_cur;      /* its seconds per iteration */
    omv_opt_run_t *runs; /* [cap_runs] the search's configurations, in probe order */
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

/* optimizer_decisions.c: the decision log. A record is rec_begin, fields (rec_config, json_num,
 * json_str, rec_candidates or the caller's own), then rec_end; see there for each record's
 * fields. */
extern const char *const omv_opt_stage_names[];   /* [omv_opt_stage_t] */
extern const char *const omv_opt_outcome_names[]; /* [omv_opt_outcome_t] */
void omv_opt_json_num(omv_strbuf_t *sb, const char *key, double v);
void omv_opt_json_str(omv_strbuf_t *sb, const char *key, const char *v);
void omv_opt_rec_begin(omv_optimizer_t *self, const char *event, double now_s);
void omv_opt_rec_config(omv_optimizer_t *self, uint32_t g, double momentum, double lr);
void omv_opt_rec_end(omv_optimizer_t *self);
void omv_opt_rec_candidates(omv_optimizer_t *self);

/* optimizer_run.c: the current run (probe or phase), and omv_opt_issue, which starts one with a
 * command for the daemon. */
void omv_opt_run_reset(omv_optimizer_t *self, double now_s, uint32_t budget);
double omv_opt_ring_mean(const omv_optimizer_t *self, uint64_t k);
double omv_opt_ring_se(const omv_optimizer_t *self, uint64_t k);
double omv_opt_run_spi(const omv_optimizer_t *self);
double omv_opt_run_images_per_s(const omv_optimizer_t *self);
uint32_t omv_opt_run_slowest(const omv_optimizer_t *self);
uint32_t omv_opt_run_window(const omv_optimizer_t *self);
bool omv_opt_run_diverged(const omv_optimizer_t *self, double loss, char *reason, size_t cap);
void omv_opt_issue(omv_optimizer_t *self, unsigned flags, uint32_t g, double momentum, double lr,
                   double now_s, uint32_t budget);

/* optimizer_search.c: the search, the g it may pick, and the qsort comparison of doubles
 * (ascending) that it and the grids' validation use. */
int omv_opt_cmp_double(const void *a, const void *b);
uint32_t omv_opt_allowed_g(const omv_optimizer_t *self, uint32_t want);
void omv_opt_begin_search(omv_optimizer_t *self, bool base, double now_s);
void omv_opt_end_run(omv_optimizer_t *self, omv_opt_outcome_t out, const char *reason,
                     double now_s);
void omv_opt_start_grid(omv_optimizer_t *self, double now_s);
void omv_opt_timing_next(omv_optimizer_t *self, double now_s);
void omv_opt_issue_run(omv_optimizer_t *self, size_t i, double now_s);
