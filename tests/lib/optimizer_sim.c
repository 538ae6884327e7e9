/* A simulated cluster for the optimizer's suites: it applies the optimizer's commands to a
 * synthetic model, reports group steps at synthetic times, and records what it was told
 * (optimizer_sim.h). */
#include "optimizer_sim.h"

#include <check.h>
#include <math.h>
#include <string.h>

void sim_apply(sim_t *s, const omv_opt_cmd_t *c)
{
    ck_assert_int_lt(s->n_cmds, MAX_CMDS);
    s->cmds[s->n_cmds++] = *c;
    ck_assert_msg(!((c->flags & OMV_OPT_CMD_SNAPSHOT) && (c->flags & OMV_OPT_CMD_RESTORE)),
                  "snapshot and restore together");
    if (c->flags & OMV_OPT_CMD_SNAPSHOT) {
        s->snap_loss = s->loss;
        s->have_snap = true;
    }
    if (c->flags & OMV_OPT_CMD_RESTORE) {
        ck_assert_msg(s->have_snap, "restore before any snapshot");
        s->loss = s->snap_loss;
    }
    if (c->flags & OMV_OPT_CMD_SET) {
        ck_assert_uint_ge(c->groups, 1);
        ck_assert_uint_le(c->groups, 64);
        s->g = c->groups;
        s->momentum = c->momentum;
        s->lr = c->lr;
    }
    s->gen = c->gen;
    for (uint32_t k = 0; k < s->g; k++)
        s->next_done[k] = s->now + s->step_time(s->g) + s->warmup_extra_s;
}

void sim_poll(sim_t *s)
{
    omv_opt_cmd_t c;
    if (omv_optimizer_poll(s->opt, s->now, &c) == 1)
        sim_apply(s, &c);
    else
        ck_assert_uint_eq(c.flags, 0);
}

void sim_init(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t)
{
    memset(s, 0, sizeof(*s));
    s->opt = omv_optimizer_new(p);
    ck_assert_ptr_nonnull(s->opt);
    s->factor = f;
    s->step_time = t;
    s->loss = 2.3;
    s->g = p->groups > 0 ? (uint32_t)p->groups : 1;
    s->momentum = p->momentum;
    s->lr = p->lr;
    s->now = 100.0;
    for (uint32_t k = 0; k < s->g; k++)
        s->next_done[k] = s->now + t(s->g);
    sim_poll(s);
}

/* A simulation that takes up saved state with the model (loss) it was saved with. */
void sim_init_restored(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t,
                       const omv_opt_saved_t *saved, double loss)
{
    memset(s, 0, sizeof(*s));
    s->opt = omv_optimizer_new(p);
    ck_assert_ptr_nonnull(s->opt);
    ck_assert_int_eq(omv_optimizer_restore(s->opt, saved, 100.0), 0);
    s->factor = f;
    s->step_time = t;
    s->loss = loss;
    s->g = 1;
    s->now = 100.0;
    s->next_done[0] = s->now + t(1);
    sim_poll(s);
}

/* One group step: the group that finishes first reports it. */
void sim_step(sim_t *s)
{
    uint32_t k = 0;
    for (uint32_t i = 1; i < s->g; i++)
        if (s->next_done[i] < s->next_done[k])
            k = i;
    s->now = s->next_done[k];
    s->next_done[k] = s->now + s->step_time(s->g);
    /* A fixed pseudo-random sequence in [-1, 1): the same noise in every run of the test. */
    double u = (double)((s->n_steps * 2654435761u) % 1000u) / 500.0 - 1.0;
    omv_opt_obs_t o = {s->now, s->gen, k, ++s->n_steps, s->loss * (1.0 + s->noise * u), 64};
    s->loss *= s->factor(s->lr, s->momentum, s->g, s->loss);
    ck_assert_int_ge(omv_optimizer_observe(s->opt, &o), 0);
    sim_poll(s);
}

void sim_members(sim_t *s, uint32_t live)
{
    ck_assert_int_eq(omv_optimizer_set_workers(s->opt, live, s->now), 1);
    sim_poll(s);
}

int count_flag(const sim_t *s, unsigned flag)
{
    int n = 0;
    for (int i = 0; i < s->n_cmds; i++)
        n += (s->cmds[i].flags & flag) != 0;
    return n;
}

/* Runs until `phases` phases have begun (DONE_SEARCH or a phase record without a command). */
void sim_until_phase(sim_t *s, uint32_t phase)
{
    for (int i = 0; i < 2000000; i++) {
        omv_opt_status_t st;
        omv_optimizer_status(s->opt, &st);
        if (st.phase >= phase && st.state == OMV_OPT_STATE_RUNNING)
            return;
        sim_step(s);
    }
    ck_abort_msg("phase %u never began", phase);
}

void sim_fini(sim_t *s)
{
    omv_optimizer_destroy(&s->opt);
    ck_assert_ptr_null(s->opt);
}

int probes_in(const sim_t *s, int from, int to, cfg_t *out, int cap)
{
    int n = 0;
    if (to < 0 || to > s->n_cmds)
        to = s->n_cmds;
    for (int i = from; i < to && n < cap; i++) {
        const omv_opt_cmd_t *c = &s->cmds[i];
        if ((c->flags & OMV_OPT_CMD_SET) && !(c->flags & OMV_OPT_CMD_DONE_SEARCH))
            out[n++] = (cfg_t){c->groups, c->momentum, c->lr};
    }
    return n;
}

int probes(const sim_t *s, int from, cfg_t *out, int cap)
{
    return probes_in(s, from, -1, out, cap);
}

/* The configuration of the phase that begins with command index i. */
cfg_t cmd_cfg(const sim_t *s, int i)
{
    return (cfg_t){s->cmds[i].groups, s->cmds[i].momentum, s->cmds[i].lr};
}

bool near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b));
}

void assert_cfg(cfg_t c, uint32_t g, double m, double lr)
{
    ck_assert_msg(c.g == g && near(c.m, m) && near(c.lr, lr),
                  "got g=%u m=%g lr=%g, wanted g=%u m=%g lr=%g", c.g, c.m, c.lr, g, m, lr);
}

/* The index of the first command with DONE_SEARCH at or after from, or -1. */
int phase_cmd(const sim_t *s, int from)
{
    for (int i = from; i < s->n_cmds; i++)
        if (s->cmds[i].flags & OMV_OPT_CMD_DONE_SEARCH)
            return i;
    return -1;
}

omv_optimizer_params_t params(uint32_t workers)
{
    omv_optimizer_params_t p;
    omv_optimizer_params_init(&p, workers);
    p.phase_steps = 200;
    p.probe_steps = 10;
    /* Both learning rates in every grid, so that the grid's rules show in the first search;
     * the default (the cold start's lr only, first search) has its own test. */
    p.first_grid_cold_lr = false;
    return p;
}

void decisions(const sim_t *s, omv_strbuf_t *sb)
{
    omv_strbuf_init(sb);
    omv_optimizer_decisions(s->opt, sb);
    ck_assert(!sb->failed);
}

/* ---- loss and time models ---- */

/* Progress per step by learning rate (best at 0.01), the total momentum m + (1 - 1/g) best at
 * 0.8; lr 0.1 explodes. */
double f_basic(double lr, double m, uint32_t g, double loss)
{
    if (lr >= 0.1)
        return 1.5;
    double q_lr = lr >= 0.01 ? 1.0 : lr >= 0.001 ? 0.5 : 0.2;
    double mu = m + (1.0 - 1.0 / g);
    double q_m = 1.0 - fabs(mu - 0.8);
    return 1.0 - 0.02 * q_lr * q_m;
}

/* Configurations whose loss turns NaN at once: lr 0.001 with momentum 0.6. */
double f_nan(double lr, double m, uint32_t g, double loss)
{
    if (near(lr, 0.001) && near(m, 0.6))
        return NAN;
    return f_basic(lr, m, g, loss);
}

/* The best learning rate falls with the loss: lr 0.1 when L > 1, 0.01 down to 0.3, then 0.001;
 * a larger one makes no progress. */
double f_schedule(double lr, double m, uint32_t g, double loss)
{
    double best = loss > 1.0 ? 0.1 : loss > 0.3 ? 0.01 : 0.001;
    if (lr > best * 1.5)
        return 1.0;
    return 1.0 - 0.01 * (lr / best) * (1.0 - fabs(m - 0.6));
}

double t_flat(uint32_t g)
{
    (void)g;
    return 1.0;
}

/* s/iter = t(g) / g: 1 at g = 1, 0.6 at 2 (40% better), 0.57 at 4 (5%). */
double t_knee2(uint32_t g)
{
    return g == 1 ? 1.0 : g == 2 ? 1.2 : g == 4 ? 2.28 : 8.0;
}

/* Scales perfectly up to 8 groups. */
double t_linear(uint32_t g)
{
    (void)g;
    return 1.0;
}
