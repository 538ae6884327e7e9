/* A simulated cluster for the optimizer's suites: a synthetic loss model of (lr, momentum, g,
 * model state) and a synthetic time per step of g drive a real omv_optimizer_t; every command
 * it issues is applied and kept for the tests to check (optimizer_sim.c). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "optimizer.h"
#include "strbuf.h"

#define MAX_CMDS 1024

/* Per-step loss factor: the model's loss L becomes L x factor (NaN: the model is lost). */
typedef double (*factor_fn)(double lr, double momentum, uint32_t g, double loss);
/* Seconds one step of one group takes with g groups. */
typedef double (*time_fn)(uint32_t g);

typedef struct {
    omv_optimizer_t *opt;
    factor_fn factor;
    time_fn step_time;
    double warmup_extra_s; /* added to every group's first step after a command */
    double now;
    /* What the daemon applied. */
    uint64_t gen;
    uint32_t g;
    double momentum, lr;
    double loss, snap_loss;
    bool have_snap;
    double next_done[64]; /* s: when each group's step completes */
    omv_opt_cmd_t cmds[MAX_CMDS];
    int n_cmds;
    uint64_t n_steps;
    double noise; /* each reported loss is off by up to this fraction (minibatch noise) */
} sim_t;

/* A configuration: groups, momentum and learning rate. */
typedef struct {
    uint32_t g;
    double m, lr;
} cfg_t;

/* Applies a command as the daemon would (and keeps it in cmds). */
void sim_apply(sim_t *s, const omv_opt_cmd_t *c);
/* Polls the optimizer and applies what it answers. */
void sim_poll(sim_t *s);
/* A new optimizer with params p on a model of loss 2.3, and its first poll. */
void sim_init(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t);
/* A simulation that takes up saved state with the model (loss) it was saved with. */
void sim_init_restored(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t,
                       const omv_opt_saved_t *saved, double loss);
/* One group step: the group that finishes first reports it. */
void sim_step(sim_t *s);
/* The live trainers become live, which must queue a command; it is applied. */
void sim_members(sim_t *s, uint32_t live);
/* The commands with flag among their flags. */
int count_flag(const sim_t *s, unsigned flag);
/* Runs until `phases` phases have begun (DONE_SEARCH or a phase record without a command). */
void sim_until_phase(sim_t *s, uint32_t phase);
void sim_fini(sim_t *s);

/* The probes issued: commands with SET but not DONE_SEARCH, of index in [from, to) (to < 0:
 * up to the last). */
int probes_in(const sim_t *s, int from, int to, cfg_t *out, int cap);
int probes(const sim_t *s, int from, cfg_t *out, int cap);
/* The configuration of the phase that begins with command index i. */
cfg_t cmd_cfg(const sim_t *s, int i);
bool near(double a, double b);
void assert_cfg(cfg_t c, uint32_t g, double m, double lr);
/* The index of the first command with DONE_SEARCH at or after from, or -1. */
int phase_cmd(const sim_t *s, int from);
/* The defaults for the given workers with short phases and probes, both learning rates in
 * every grid. */
omv_optimizer_params_t params(uint32_t workers);
/* The decisions so far as a JSON array, in sb (initialised here; the caller finalises it). */
void decisions(const sim_t *s, omv_strbuf_t *sb);

/* Loss models (factor_fn). */
/* Progress per step by learning rate (best at 0.01), the total momentum m + (1 - 1/g) best at
 * 0.8; lr 0.1 explodes. */
double f_basic(double lr, double m, uint32_t g, double loss);
/* Configurations whose loss turns NaN at once: lr 0.001 with momentum 0.6. */
double f_nan(double lr, double m, uint32_t g, double loss);
/* The best learning rate falls with the loss: lr 0.1 when L > 1, 0.01 down to 0.3, then 0.001;
 * a larger one makes no progress. */
double f_schedule(double lr, double m, uint32_t g, double loss);

/* Time models (time_fn). */
double t_flat(uint32_t g);
/* s/iter = t(g) / g: 1 at g = 1, 0.6 at 2 (40% better), 0.57 at 4 (5%). */
double t_knee2(uint32_t g);
/* Scales perfectly up to 8 groups. */
double t_linear(uint32_t g);
