/* The optimizer's state machine driven by a simulated cluster: a synthetic loss model of (lr,
 * momentum, g, model state) and a synthetic time per step of g; checks the commands it issues
 * and the decisions it records. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "tuner.h"
#include "testutil.h"

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

static void sim_apply(sim_t *s, const omv_opt_cmd_t *c)
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

static void sim_poll(sim_t *s)
{
    omv_opt_cmd_t c;
    if (omv_optimizer_poll(s->opt, s->now, &c) == 1)
        sim_apply(s, &c);
    else
        ck_assert_uint_eq(c.flags, 0);
}

static void sim_init(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t)
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

/* One group step: the group that finishes first reports it. */
static void sim_step(sim_t *s)
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

static int count_flag(const sim_t *s, unsigned flag)
{
    int n = 0;
    for (int i = 0; i < s->n_cmds; i++)
        n += (s->cmds[i].flags & flag) != 0;
    return n;
}

/* Runs until `phases` phases have begun (DONE_SEARCH or a phase record without a command). */
static void sim_until_phase(sim_t *s, uint32_t phase)
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

static void sim_fini(sim_t *s)
{
    omv_optimizer_destroy(&s->opt);
    ck_assert_ptr_null(s->opt);
}

/* The probes issued: commands with SET but not DONE_SEARCH, of index in [from, to) (to < 0:
 * up to the last). */
typedef struct {
    uint32_t g;
    double m, lr;
} cfg_t;

static int probes_in(const sim_t *s, int from, int to, cfg_t *out, int cap)
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

static int probes(const sim_t *s, int from, cfg_t *out, int cap)
{
    return probes_in(s, from, -1, out, cap);
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b));
}

static void assert_cfg(cfg_t c, uint32_t g, double m, double lr)
{
    ck_assert_msg(c.g == g && near(c.m, m) && near(c.lr, lr),
                  "got g=%u m=%g lr=%g, wanted g=%u m=%g lr=%g", c.g, c.m, c.lr, g, m, lr);
}

/* The index of the first command with DONE_SEARCH at or after from, or -1. */
static int phase_cmd(const sim_t *s, int from)
{
    for (int i = from; i < s->n_cmds; i++)
        if (s->cmds[i].flags & OMV_OPT_CMD_DONE_SEARCH)
            return i;
    return -1;
}

static omv_optimizer_params_t params(uint32_t workers)
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

static void decisions(const sim_t *s, omv_strbuf_t *sb)
{
    omv_strbuf_init(sb);
    omv_optimizer_decisions(s->opt, sb);
    ck_assert(!sb->failed);
}

/* ---- loss and time models ---- */

/* Progress per step by learning rate (best at 0.01), the total momentum m + (1 - 1/g) best at
 * 0.8; lr 0.1 explodes. */
static double f_basic(double lr, double m, uint32_t g, double loss)
{
    if (lr >= 0.1)
        return 1.5;
    double q_lr = lr >= 0.01 ? 1.0 : lr >= 0.001 ? 0.5 : 0.2;
    double mu = m + (1.0 - 1.0 / g);
    double q_m = 1.0 - fabs(mu - 0.8);
    return 1.0 - 0.02 * q_lr * q_m;
}

static double t_flat(uint32_t g)
{
    (void)g;
    return 1.0;
}

/* s/iter = t(g) / g: 1 at g = 1, 0.6 at 2 (40% better), 0.57 at 4 (5%). */
static double t_knee2(uint32_t g)
{
    return g == 1 ? 1.0 : g == 2 ? 1.2 : g == 4 ? 2.28 : 8.0;
}

/* Scales perfectly up to 8 groups. */
static double t_linear(uint32_t g)
{
    (void)g;
    return 1.0;
}

/* ---- tests ---- */

START_TEST(test_cold_start_lr)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_basic, t_flat);
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_optimizer_describe(s.opt, &line);
    ck_assert_str_eq(line.data, "phase 1, g=1, momentum=0.9, lr=0.0001, state=probing (cold 1/4)");
    omv_strbuf_clear(&line);
    sim_until_phase(&s, 1);
    cfg_t c[32];
    int n = probes(&s, 0, c, 32);
    ck_assert_int_ge(n, 4);
    /* Cold start: g = 1, momentum 0.9, the grid from the smallest learning rate up. */
    assert_cfg(c[0], 1, 0.9, 0.0001);
    assert_cfg(c[1], 1, 0.9, 0.001);
    assert_cfg(c[2], 1, 0.9, 0.01);
    assert_cfg(c[3], 1, 0.9, 0.1);
    ck_assert_uint_eq(s.cmds[0].flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    omv_optimizer_describe(s.opt, &line);
    ck_assert_str_eq(line.data, "phase 1, g=1, momentum=0.9, lr=0.01, state=running");
    omv_strbuf_fini(&line);
    /* lr 0.01 wins: the grid probes {0.001, 0.01}. */
    for (int i = 4; i < n; i++)
        ck_assert(near(c[i].lr, 0.001) || near(c[i].lr, 0.01));
    omv_strbuf_t sb;
    decisions(&s, &sb);
    const char *cold = strstr(sb.data, "\"event\":\"choose\",");
    ck_assert_ptr_nonnull(cold);
    ck_assert_ptr_nonnull(strstr(cold, "\"stage\":\"cold\",\"g\":1,\"momentum\":0.9,\"lr\":0.01,"));
    /* lr 0.1 diverged (its loss tripled past 2x its start) and has no score. */
    ck_assert_ptr_nonnull(strstr(sb.data, "\"lr\":0.1,\"outcome\":\"diverged\",\"reused\":false,"
                                          "\"score\":null"));
    omv_strbuf_fini(&sb);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups, 1);
    ck_assert(near(st.lr, 0.01));
    ck_assert(near(st.momentum, 0.9)); /* 0.1 from the best total momentum 0.8, 0.6 is 0.2 */
    sim_fini(&s);
}
END_TEST

/* Which g values the timing stage tried. */
static int timing_gs(const sim_t *s, uint32_t *out, int cap)
{
    cfg_t c[64];
    int n = probes(s, 0, c, 64), k = 0;
    for (int i = 0; i < n && k < cap; i++)
        if (c[i].g > 1)
            out[k++] = c[i].g;
    return k;
}

START_TEST(test_groups_grow_while_faster)
{
    omv_optimizer_params_t p = params(8);
    sim_t s;
    sim_init(&s, &p, f_basic, t_knee2);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups_he, 2);
    /* Timing runs at 2 (40% faster: kept) and 4 (5%: stop); never 8. */
    cfg_t c[64];
    int n = probes(&s, 0, c, 64);
    assert_cfg(c[4], 2, 0.0, 0.01);
    assert_cfg(c[5], 4, 0.0, 0.01);
    for (int i = 6; i < n; i++)
        ck_assert_uint_eq(c[i].g, 2);
    ck_assert_uint_eq(st.groups, 2);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"stage\":\"timing\",\"g\":2,\"s_per_iter\":0.6,"
                                          "\"reason\":\"g=4: 0.57 s/iter against 0.6 at g=2, "
                                          "less than 10% better\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"grow\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"from\":1,\"to\":2,\"s_per_iter\":0.6,\"reason\":"
                                          "\"0.6 s/iter against 1 at g=1: at least 10% better\""));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* Perfect scaling: up to N = 8 and no further. */
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups_he, 8);
    uint32_t gs[16];
    int k = timing_gs(&s, gs, 16);
    ck_assert_int_ge(k, 3);
    ck_assert_uint_eq(gs[0], 2);
    ck_assert_uint_eq(gs[1], 4);
    ck_assert_uint_eq(gs[2], 8);
    sim_fini(&s);
}
END_TEST

START_TEST(test_warmup_left_out_of_timing)
{
    /* Every run's first step costs 30 s more; with it counted g = 2's 10-step runs would look
     * slower than g = 1's. */
    omv_optimizer_params_t p = params(8);
    sim_t s;
    sim_init(&s, &p, f_basic, t_knee2);
    s.warmup_extra_s = 30.0;
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups_he, 2);
    sim_fini(&s);
}
END_TEST

START_TEST(test_snapshot_restore_order)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_basic, t_flat);
    sim_until_phase(&s, 2);
    int first_phase = phase_cmd(&s, 0);
    ck_assert_int_gt(first_phase, 0);
    /* One snapshot, then every probe and the phase restore it. */
    ck_assert_uint_eq(s.cmds[0].flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    for (int i = 1; i < first_phase; i++)
        ck_assert_uint_eq(s.cmds[i].flags,
                          OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert_uint_eq(s.cmds[first_phase].flags,
                      OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_DONE_SEARCH);
    /* The next search snapshots the model the phase trained, then restores it likewise. */
    ck_assert_uint_eq(s.cmds[first_phase + 1].flags,
                      OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    int second = phase_cmd(&s, first_phase + 1);
    ck_assert_int_gt(second, first_phase + 1);
    for (int i = first_phase + 2; i < second; i++)
        ck_assert_uint_eq(s.cmds[i].flags,
                          OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert_int_eq(count_flag(&s, OMV_OPT_CMD_SNAPSHOT), 2);
    /* Grid order: learning rate rising, momentum rising within it; of the 8 configurations the
     * two with momentum 0.9 are cold-start probes (same g, momentum, lr and snapshot), whose
     * results are reused rather than run again. */
    cfg_t c[32];
    int n = probes_in(&s, 4, first_phase, c, 32);
    const double ms[] = {0.0, 0.3, 0.6, 0.9};
    ck_assert_int_eq(n, 6);
    for (int i = 0; i < 3; i++) {
        assert_cfg(c[i], 1, ms[i], 0.001);
        assert_cfg(c[3 + i], 1, ms[i], 0.01);
    }
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"stage\":\"grid\",\"g\":1,\"momentum\":0.9,\"lr\":0.01,"
                                          "\"outcome\":\"ok\",\"reused\":true"));
    omv_strbuf_fini(&sb);
    /* Gens rise by one per command. */
    for (int i = 0; i < s.n_cmds; i++)
        ck_assert_uint_eq(s.cmds[i].gen, (uint64_t)i + 1);
    sim_fini(&s);
}
END_TEST

/* Configurations whose loss turns NaN at once: lr 0.001 with momentum 0.6. */
static double f_nan(double lr, double m, uint32_t g, double loss)
{
    if (near(lr, 0.001) && near(m, 0.6))
        return NAN;
    return f_basic(lr, m, g, loss);
}

/* A finite blow-up: lr 0.01 with momentum 0.3 grows the loss 20% a step (past twice the mean
 * of its first three losses by the seventh). */
static double f_grow(double lr, double m, uint32_t g, double loss)
{
    if (near(lr, 0.01) && near(m, 0.3))
        return 1.2;
    return f_basic(lr, m, g, loss);
}

START_TEST(test_nan_prunes_more_aggressive)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_nan, t_flat);
    sim_until_phase(&s, 1);
    cfg_t c[32];
    int n = probes(&s, 4, c, 32);
    /* (0.001, 0.6) diverged: (0.001, 0.9), (0.01, 0.6), (0.01, 0.9) are skipped. */
    ck_assert_int_eq(n, 5);
    assert_cfg(c[0], 1, 0.0, 0.001);
    assert_cfg(c[1], 1, 0.3, 0.001);
    assert_cfg(c[2], 1, 0.6, 0.001);
    assert_cfg(c[3], 1, 0.0, 0.01);
    assert_cfg(c[4], 1, 0.3, 0.01);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"skip\",\"t_s\":"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"g\":1,\"momentum\":0.9,\"lr\":0.01,\"reason\":"
                                          "\"at least as aggressive as lr 0.001 momentum 0.6, "
                                          "which diverged\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"reason\":\"loss nan is not finite\""));
    omv_strbuf_fini(&sb);
    /* The NaN probe stopped after its first step. */
    sim_fini(&s);
}
END_TEST

START_TEST(test_growing_loss_prunes)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_grow, t_flat);
    sim_until_phase(&s, 1);
    cfg_t c[32];
    int n = probes(&s, 4, c, 32);
    /* (0.001, 0.9) is reused from the cold start; (0.01, 0.3) diverged, so (0.01, 0.6) and
     * (0.01, 0.9) are skipped (the latter though its cold-start probe went well: the rule is
     * the rule). */
    ck_assert_int_eq(n, 5);
    for (int i = 0; i < 3; i++)
        ck_assert(near(c[i].lr, 0.001));
    assert_cfg(c[3], 1, 0.0, 0.01);
    assert_cfg(c[4], 1, 0.3, 0.01);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "> 2 x the first 3's"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"momentum\":0.6,\"lr\":0.01,\"reason\":\"at least"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);
}
END_TEST

/* Every configuration makes the same progress. */
static double f_same(double lr, double m, uint32_t g, double loss)
{
    return 0.99;
}

/* lr 0.01 with momentum 0.3 about 15% better than the rest, which are equal. */
static double f_one_best(double lr, double m, uint32_t g, double loss)
{
    return near(lr, 0.01) && near(m, 0.3) ? 0.97 : 0.99;
}

START_TEST(test_ties)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_same, t_flat);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    /* Cold start tie: lr 0.1; grid tie: lr 0.1, then momentum 0.9. */
    ck_assert(near(st.lr, 0.1));
    ck_assert(near(st.momentum, 0.9));
    sim_fini(&s);

    sim_init(&s, &p, f_one_best, t_flat);
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    /* Cold start ties at 0.1; the grid's (0.01, 0.3) beats every tie. */
    ck_assert(near(st.lr, 0.01));
    ck_assert(near(st.momentum, 0.3));
    sim_fini(&s);

    /* With a 50% tolerance the 15% better one ties with the rest: the largest lr and momentum
     * win. */
    p.tie_rel = 0.5;
    sim_init(&s, &p, f_one_best, t_flat);
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    ck_assert(near(st.lr, 0.1));
    ck_assert(near(st.momentum, 0.9));
    sim_fini(&s);
}
END_TEST

/* Minibatch noise: a configuration better by less than the probes can resolve ties with the
 * rest, and the larger learning rate stays (a drop is for good); the same difference with
 * little noise wins. */
START_TEST(test_noise_ties)
{
    omv_optimizer_params_t p = params(1);
    omv_opt_status_t st;
    sim_t s;
    /* About 16% better over a probe; the reported losses off by up to 1%: it wins. */
    sim_init(&s, &p, f_one_best, t_flat);
    s.noise = 0.01;
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    ck_assert_msg(near(st.lr, 0.01) && near(st.momentum, 0.3), "lr %g m %g", st.lr, st.momentum);
    sim_fini(&s);
    /* Off by up to 60%: the probes cannot tell, so lr 0.1 stays. */
    sim_init(&s, &p, f_one_best, t_flat);
    s.noise = 0.6;
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    ck_assert_msg(near(st.lr, 0.1), "lr %g m %g", st.lr, st.momentum);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"score_se\":"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);
    /* Without the noise rule (tie_z 0) the same noisy scores decide by themselves: here the
     * (truly better) lr 0.01 wins on a difference the probes could not resolve. */
    p.tie_z = 0;
    sim_init(&s, &p, f_one_best, t_flat);
    s.noise = 0.6;
    sim_until_phase(&s, 1);
    omv_optimizer_status(s.opt, &st);
    ck_assert_msg(near(st.lr, 0.01), "lr %g m %g", st.lr, st.momentum);
    sim_fini(&s);
}
END_TEST

/* Momentum 0 a little better than the others (0.3% a step). */
static double f_zero_slight(double lr, double m, uint32_t g, double loss)
{
    return m == 0.0 ? 0.99 : 0.993;
}

/* g is halved when momentum 0 is best beyond the probes' noise, not when noise made it win. */
START_TEST(test_noisy_momentum_zero_keeps_g)
{
    omv_optimizer_params_t p = params(4);
    for (int noisy = 0; noisy < 2; noisy++) {
        sim_t s;
        sim_init(&s, &p, f_zero_slight, t_linear);
        s.noise = noisy ? 0.6 : 0.0;
        sim_until_phase(&s, 1);
        omv_strbuf_t sb;
        decisions(&s, &sb);
        int halved = strstr(sb.data, "\"event\":\"halve\"") != NULL;
        if (getenv("OMV_TEST_DUMP"))
            fprintf(stderr, "%s\n", sb.data);
        ck_assert_msg(halved == !noisy, "noise %g: halved %d", s.noise, halved);
        omv_strbuf_fini(&sb);
        sim_fini(&s);
    }
}
END_TEST

/* Asynchrony's implicit momentum 1 - 1/g: total momentum best at 0.8, lr 0.01 best. */
START_TEST(test_momentum_zero_halves_g)
{
    omv_optimizer_params_t p = params(4);
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups_he, 4);
    /* At g = 4 (implicit 0.75) momentum 0 wins; at g = 2 (0.5) momentum 0.3. */
    ck_assert_uint_eq(st.groups, 2);
    ck_assert(near(st.momentum, 0.3));
    cfg_t c[64];
    int n = probes(&s, 0, c, 64), at4 = 0, at2 = 0;
    for (int i = 0; i < n; i++) {
        at4 += c[i].g == 4;
        at2 += c[i].g == 2;
    }
    ck_assert_int_eq(at4, 1 + 8); /* the timing run, then the grid */
    ck_assert_int_eq(at2, 1 + 8);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"halve\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"from\":4,\"to\":2"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);
}
END_TEST

/* The best learning rate falls with the loss: lr 0.1 when L > 1, 0.01 down to 0.3, then 0.001;
 * a larger one makes no progress. */
static double f_schedule(double lr, double m, uint32_t g, double loss)
{
    double best = loss > 1.0 ? 0.1 : loss > 0.3 ? 0.01 : 0.001;
    if (lr > best * 1.5)
        return 1.0;
    return 1.0 - 0.01 * (lr / best) * (1.0 - fabs(m - 0.6));
}

START_TEST(test_phase_lr_stays_or_drops_tenfold)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    sim_init(&s, &p, f_schedule, t_flat);
    sim_until_phase(&s, 12);
    double prev = NAN;
    int drops = 0, phases = 0, from = 0;
    for (int i = phase_cmd(&s, 0); i >= 0; i = phase_cmd(&s, i + 1)) {
        double lr = s.cmds[i].lr;
        if (isfinite(prev)) {
            ck_assert_msg(near(lr, prev) || near(lr, prev / 10.0), "lr %g after %g", lr, prev);
            drops += near(lr, prev / 10.0);
            /* The search before this phase probed only prev and prev / 10. */
            cfg_t c[32];
            int n = probes_in(&s, from, i, c, 32);
            for (int k = 0; k < n; k++)
                ck_assert(near(c[k].lr, prev) || near(c[k].lr, prev / 10.0));
            ck_assert_uint_eq(s.cmds[from].flags,
                              OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
        }
        prev = lr;
        from = i + 1;
        phases++;
    }
    ck_assert_int_ge(phases, 12);
    ck_assert_int_ge(drops, 2);
    ck_assert(near(prev, 0.001));
    sim_fini(&s);
}
END_TEST

START_TEST(test_fixed_groups)
{
    omv_optimizer_params_t p = params(4);
    p.groups = 2;
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 2);
    for (int i = 0; i < s.n_cmds; i++)
        if (s.cmds[i].flags & OMV_OPT_CMD_SET)
            ck_assert_uint_eq(s.cmds[i].groups, 2);
    /* No halving though momentum 0.3 is best at g = 2 ... and momentum 0 at g = 4 would be. */
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_null(strstr(sb.data, "\"stage\":\"timing\""));
    ck_assert_ptr_null(strstr(sb.data, "\"event\":\"halve\""));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* Fixed at 4, where momentum 0 wins: still no halving. */
    p.groups = 4;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups, 4);
    ck_assert(near(st.momentum, 0.0));
    sim_fini(&s);
}
END_TEST

START_TEST(test_fixed_lr)
{
    omv_optimizer_params_t p = params(1);
    p.lr = 0.05;
    sim_t s;
    sim_init(&s, &p, f_basic, t_flat);
    sim_until_phase(&s, 3);
    cfg_t c[64];
    int n = probes(&s, 0, c, 64);
    /* No cold start: four momentum probes per search, all at the fixed lr. */
    ck_assert_int_eq(n, 3 * 4);
    for (int i = 0; i < n; i++) {
        ck_assert(near(c[i].lr, 0.05));
        ck_assert(near(c[i].m, p.momentum_grid[i % 4]));
    }
    sim_fini(&s);
}
END_TEST

START_TEST(test_fixed_momentum)
{
    omv_optimizer_params_t p = params(4);
    p.momentum = 0.0;
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 2);
    for (int i = 0; i < s.n_cmds; i++)
        if (s.cmds[i].flags & OMV_OPT_CMD_SET)
            ck_assert(near(s.cmds[i].momentum, 0.0));
    /* g grows to 4 and stays: momentum 0 was not chosen, so no halving. */
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups, 4);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_null(strstr(sb.data, "\"event\":\"halve\""));
    omv_strbuf_fini(&sb);
    sim_fini(&s);
}
END_TEST

START_TEST(test_all_fixed)
{
    omv_optimizer_params_t p = params(4);
    p.groups = 2;
    p.momentum = 0.9;
    p.lr = 0.01;
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    for (int i = 0; i < 1000; i++) {
        omv_opt_obs_t o = {s.now + i, 0, (uint32_t)(i % 2), (uint64_t)i, 1.0, 64};
        ck_assert_int_eq(omv_optimizer_observe(s.opt, &o), 1);
        sim_poll(&s);
    }
    ck_assert_int_eq(s.n_cmds, 0);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_FIXED);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_str_eq(sb.data, "[]");
    omv_strbuf_fini(&sb);
    omv_strbuf_init(&sb);
    omv_optimizer_describe(s.opt, &sb);
    ck_assert_str_eq(sb.data, "phase 0, g=2, momentum=0.9, lr=0.01, state=fixed");
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* Fixed momentum and lr, N = 1: nothing to search; one SET, no snapshot, ever. */
    p = params(1);
    p.momentum = 0.5;
    p.lr = 0.02;
    sim_init(&s, &p, f_basic, t_flat);
    sim_until_phase(&s, 3);
    ck_assert_int_eq(s.n_cmds, 1);
    ck_assert_uint_eq(s.cmds[0].flags, OMV_OPT_CMD_SET);
    sim_fini(&s);
}
END_TEST

START_TEST(test_decisions_json)
{
    omv_optimizer_params_t p = params(8);
    sim_t s;
    sim_init(&s, &p, f_nan, t_knee2);
    sim_until_phase(&s, 2);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    const char *j = sb.data;
    ck_assert_uint_eq(strlen(j), sb.len); /* no NUL inside */
    ck_assert_ptr_nonnull(
        strstr(j, "[{\"event\":\"start\",\"t_s\":100,\"phase\":1,\"workers\":8,"
                  "\"g\":\"tune\",\"momentum\":\"tune\",\"lr\":\"tune\",\"phase_steps\":200,"
                  "\"probe_steps\":10},"));
    ck_assert_int_eq(j[0], '[');
    ck_assert_int_eq(j[sb.len - 1], ']');
    for (const char *w = j; (w = strstr(w, "\"event\":\"choose\"")) != NULL; w++) {
        const char *end = strchr(w, '}');
        ck_assert_ptr_nonnull(strstr(w, "\"candidates\":[{"));
        ck_assert_ptr_nonnull(end);
    }
    const char *need[] = {"\"event\":\"probe\"",     "\"event\":\"skip\"", "\"event\":\"phase\"",
                          "\"event\":\"phase_end\"", "\"event\":\"grow\"", "\"stage\":\"cold\"",
                          "\"stage\":\"timing\"",    "\"stage\":\"grid\"", "\"score\":",
                          "\"s_per_iter\":",         "\"reason\":"};
    for (size_t i = 0; i < sizeof(need) / sizeof(*need); i++)
        ck_assert_msg(strstr(j, need[i]) != NULL, "no %s", need[i]);
    /* Valid JSON numbers only, balanced brackets outside strings. */
    ck_assert_ptr_null(strstr(j, ":nan"));
    ck_assert_ptr_null(strstr(j, ":inf"));
    ck_assert_ptr_null(strstr(j, ":-nan"));
    int depth = 0;
    bool in_str = false;
    for (const char *q = j; *q; q++) {
        if (in_str) {
            if (*q == '\\')
                q++;
            else if (*q == '"')
                in_str = false;
            continue;
        }
        if (*q == '"')
            in_str = true;
        else if (*q == '[' || *q == '{')
            depth++;
        else if (*q == ']' || *q == '}')
            ck_assert_int_ge(--depth, 0);
    }
    ck_assert_int_eq(depth, 0);
    ck_assert(!in_str);
    /* The lines hold the same records as the array. */
    omv_strbuf_t lines;
    omv_strbuf_init(&lines);
    size_t cursor = 0;
    omv_optimizer_decisions_since(s.opt, &cursor, &lines);
    size_t n_lines = 0, n_commas = 0;
    for (const char *q = lines.data; *q; q++)
        n_lines += *q == '\n';
    for (const char *q = j; (q = strstr(q, "},{\"event\"")) != NULL; q++)
        n_commas++;
    ck_assert_uint_eq(n_lines, n_commas + 1);
    omv_strbuf_clear(&lines);
    omv_optimizer_decisions_since(s.opt, &cursor, &lines);
    ck_assert_uint_eq(lines.len, 0);
    sim_step(&s);
    omv_strbuf_fini(&lines);
    omv_strbuf_fini(&sb);

    omv_strbuf_init(&sb);
    omv_optimizer_describe(s.opt, &sb);
    ck_assert_msg(strncmp(sb.data, "phase 2, g=2, momentum=", 23) == 0, "%s", sb.data);
    ck_assert_ptr_nonnull(strstr(sb.data, "state=running"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* Times keep their milliseconds however long the machine has been up. */
    omv_optimizer_t *o = omv_optimizer_new(&p);
    omv_opt_cmd_t c;
    ck_assert_int_eq(omv_optimizer_poll(o, 12345.678, &c), 1);
    omv_strbuf_init(&sb);
    omv_optimizer_decisions(o, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"t_s\":12345.678,"));
    omv_strbuf_fini(&sb);
    omv_optimizer_destroy(&o);
}
END_TEST

START_TEST(test_stale_and_bad_observations)
{
    omv_optimizer_params_t p = params(2);
    p.groups = 2;
    p.probe_max_s = 50.0;
    omv_optimizer_t *o = omv_optimizer_new(&p);
    ck_assert_ptr_nonnull(o);
    omv_opt_cmd_t c;
    omv_opt_obs_t ob = {1.0, 0, 0, 1, 2.0, 64};
    ck_assert_int_eq(omv_optimizer_observe(o, &ob), 1); /* before the first poll */
    ck_assert_int_eq(omv_optimizer_poll(o, 1.0, &c), 1);
    ck_assert_uint_eq(c.gen, 1);
    ck_assert_uint_eq(c.groups, 2);
    ck_assert_int_eq(omv_optimizer_poll(o, 1.0, &c), 0); /* returned once */
    ck_assert_int_eq(omv_optimizer_observe(o, &ob), 1);  /* gen 0: an older configuration */
    ob.gen = 1;
    ob.group = 2;
    ck_assert_int_eq(omv_optimizer_observe(o, &ob), -EINVAL);
    ob.group = 0;
    ob.now_s = NAN;
    ck_assert_int_eq(omv_optimizer_observe(o, &ob), -EINVAL);
    /* Group 1 stalls: only group 0 reports; the probe ends at probe_max_s, from poll. */
    for (int i = 0; i < 20; i++) {
        ob.now_s = 2.0 + i;
        ck_assert_int_eq(omv_optimizer_observe(o, &ob), 0);
        ck_assert_int_eq(omv_optimizer_poll(o, ob.now_s, &c), 0);
    }
    ck_assert_int_eq(omv_optimizer_poll(o, 51.0, &c), 1);
    ck_assert_uint_eq(c.flags, OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert_uint_eq(c.gen, 2);
    omv_strbuf_t sb;
    omv_strbuf_init(&sb);
    omv_optimizer_decisions(o, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"outcome\":\"timeout\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"reason\":\"probe_max_s reached\""));
    omv_strbuf_fini(&sb);
    omv_optimizer_destroy(&o);
    omv_optimizer_destroy(&o); /* NULL is fine */
}
END_TEST

START_TEST(test_params_rejected)
{
    omv_optimizer_params_t p;
    omv_optimizer_params_init(&p, 0);
    errno = 0;
    ck_assert_ptr_null(omv_optimizer_new(&p));
    ck_assert_int_eq(errno, EINVAL);
    omv_optimizer_params_init(&p, 6);
    p.groups = 4; /* does not divide 6 */
    ck_assert_ptr_null(omv_optimizer_new(&p));
    p.groups = 3; /* a fixed g need not be a power of two */
    omv_optimizer_t *o = omv_optimizer_new(&p);
    ck_assert_ptr_nonnull(o);
    omv_optimizer_destroy(&o);
    omv_optimizer_params_init(&p, 6);
    p.momentum = 1.0;
    ck_assert_ptr_null(omv_optimizer_new(&p));
    omv_optimizer_params_init(&p, 6);
    p.lr_grid[1] = 0.0;
    ck_assert_ptr_null(omv_optimizer_new(&p));
    omv_optimizer_params_init(&p, 6);
    p.momentum_grid[2] = p.momentum_grid[1]; /* duplicate */
    ck_assert_ptr_null(omv_optimizer_new(&p));
    omv_optimizer_params_init(&p, 6);
    p.probe_steps = 1; /* nothing left after the warm-up step */
    ck_assert_ptr_null(omv_optimizer_new(&p));
    omv_optimizer_params_init(&p, 6);
    p.diverge_factor = NAN;
    ck_assert_ptr_null(omv_optimizer_new(&p));
}
END_TEST

/* ---- defaults that keep probes short ---- */

/* The decisions of phase `phase` (from its first record to the next phase's), in out. */
static void phase_records(const char *all, uint32_t phase, char *out, size_t cap)
{
    char key[32], next[32];
    snprintf(key, sizeof(key), "\"phase\":%u,", phase);
    snprintf(next, sizeof(next), "\"phase\":%u,", phase + 1);
    const char *a = strstr(all, key);
    ck_assert_msg(a != NULL, "no records of phase %u", phase);
    const char *b = strstr(a, next);
    size_t n = b ? (size_t)(b - a) : strlen(a);
    ck_assert_uint_lt(n, cap);
    memcpy(out, a, n);
    out[n] = '\0';
}

START_TEST(test_first_grid_cold_lr_and_short_later_probes)
{
    omv_optimizer_params_t p;
    omv_optimizer_params_init(&p, 4);
    p.phase_steps = 200;
    p.probe_steps = 10;
    p.later_probe_steps = 5;
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 2);
    int first_phase = phase_cmd(&s, 0);
    cfg_t c[64];
    /* The first search's grids probe the cold start's lr only: 4 cold, timing at 2 and 4, four
     * momenta at g = 4, halving, four at g = 2 (where 0.3 wins). */
    int n = probes_in(&s, 0, first_phase, c, 64);
    ck_assert_int_eq(n, 4 + 2 + 4 + 4);
    for (int i = 6; i < n; i++)
        ck_assert(near(c[i].lr, 0.01));
    ck_assert_uint_eq(s.cmds[first_phase].groups, 2);
    ck_assert(near(s.cmds[first_phase].momentum, 0.3));
    /* The second search probes both lrs, for later_probe_steps. */
    int second = phase_cmd(&s, first_phase + 1);
    n = probes_in(&s, first_phase + 1, second, c, 64);
    int tenth = 0;
    for (int i = 0; i < n; i++)
        tenth += near(c[i].lr, 0.001);
    ck_assert_int_ge(tenth, 1);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    static char recs[1 << 16];
    phase_records(sb.data, 1, recs, sizeof(recs));
    ck_assert_ptr_nonnull(strstr(recs, "\"stage\":\"grid\",\"g\":4,\"momentum\":0,\"lr\":0.01,"
                                       "\"outcome\":\"ok\",\"reused\":false,\"score\":"));
    ck_assert_ptr_nonnull(strstr(recs, "\"steps\":10,"));
    phase_records(sb.data, 2, recs, sizeof(recs));
    ck_assert_ptr_nonnull(strstr(recs, "\"event\":\"probe\""));
    ck_assert_ptr_null(strstr(recs, "\"steps\":10,"));
    ck_assert_ptr_nonnull(strstr(recs, "\"steps\":5,"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* By default a later probe is as long as a first one. */
    omv_optimizer_params_init(&p, 1);
    p.phase_steps = 200;
    p.probe_steps = 10;
    sim_init(&s, &p, f_basic, t_flat);
    sim_until_phase(&s, 2);
    decisions(&s, &sb);
    phase_records(sb.data, 2, recs, sizeof(recs));
    ck_assert_ptr_nonnull(strstr(recs, "\"steps\":10,"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);
}
END_TEST

/* ---- durable state ---- */

/* A simulation that takes up saved state with the model (loss) it was saved with. */
static void sim_init_restored(sim_t *s, const omv_optimizer_params_t *p, factor_fn f, time_fn t,
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

/* The configuration of the phase that begins with command index i. */
static cfg_t cmd_cfg(const sim_t *s, int i)
{
    return (cfg_t){s->cmds[i].groups, s->cmds[i].momentum, s->cmds[i].lr};
}

START_TEST(test_save_restore_mid_phase)
{
    /* Uninterrupted: phases 1 to 4 with the lr schedule at work. */
    omv_optimizer_params_t p = params(1);
    sim_t a, b;
    sim_init(&a, &p, f_schedule, t_flat);
    sim_until_phase(&a, 3);
    for (int i = 0; i < 70; i++)
        sim_step(&a);
    omv_opt_status_t st;
    omv_optimizer_status(a.opt, &st);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_RUNNING);
    ck_assert_uint_eq(st.phase, 3);
    omv_opt_saved_t saved;
    omv_optimizer_save(a.opt, &saved);
    ck_assert_uint_eq(saved.phase, 3);
    ck_assert_uint_eq(saved.running, 1);
    ck_assert_uint_eq(saved.phase_steps_done, 70);
    ck_assert_uint_eq(saved.groups, 1);
    ck_assert(near(saved.lr, st.lr));
    ck_assert(near(saved.momentum, st.momentum));
    ck_assert_uint_gt(saved.probes_total, 8);
    double loss = a.loss;
    int a_mark = a.n_cmds;
    sim_until_phase(&a, 5);

    /* Restarted from the state saved 70 steps into phase 3: it goes on with phase 3, from the
     * saved model, for the 130 steps left, then searches and chooses as the uninterrupted run
     * did (no cold start). */
    sim_init_restored(&b, &p, f_schedule, t_flat, &saved, loss);
    ck_assert_uint_eq(b.cmds[0].flags,
                      OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_DONE_SEARCH);
    assert_cfg(cmd_cfg(&b, 0), 1, saved.momentum, saved.lr);
    omv_optimizer_status(b.opt, &st);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_RUNNING);
    ck_assert_uint_eq(st.phase, 3);
    ck_assert_uint_eq(st.probes_total, saved.probes_total);
    for (int i = 0; i < 129; i++)
        sim_step(&b);
    ck_assert_int_eq(b.n_cmds, 1); /* not over yet */
    sim_step(&b);
    ck_assert_int_eq(b.n_cmds, 2); /* the next search's snapshot */
    ck_assert_uint_eq(b.cmds[1].flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    sim_until_phase(&b, 5);
    int pa = phase_cmd(&a, a_mark), pb = phase_cmd(&b, 1);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_ge(pa, 0);
        ck_assert_int_ge(pb, 0);
        cfg_t ca = cmd_cfg(&a, pa);
        assert_cfg(cmd_cfg(&b, pb), ca.g, ca.m, ca.lr);
        pa = phase_cmd(&a, pa + 1);
        pb = phase_cmd(&b, pb + 1);
    }
    omv_strbuf_t sb;
    decisions(&b, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "[{\"event\":\"resume\",\"t_s\":100,\"phase\":3,"
                                          "\"state\":\"phase\",\"g\":1,"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"steps_left\":130,"));
    ck_assert_ptr_null(strstr(sb.data, "\"stage\":\"cold\""));
    ck_assert_ptr_null(strstr(sb.data, "\"event\":\"start\""));
    omv_strbuf_fini(&sb);
    sim_fini(&a);
    sim_fini(&b);
}
END_TEST

START_TEST(test_save_restore_mid_search)
{
    omv_optimizer_params_t p = params(1);
    sim_t a, b;
    sim_init(&a, &p, f_schedule, t_flat);
    sim_until_phase(&a, 2);
    /* Into the search after phase 2: its snapshot is the model the search starts from, which is
     * what a checkpoint taken now holds. */
    while (count_flag(&a, OMV_OPT_CMD_SNAPSHOT) < 3 || a.n_cmds < phase_cmd(&a, 0) + 4)
        sim_step(&a);
    omv_opt_status_t st;
    omv_optimizer_status(a.opt, &st);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_PROBING);
    ck_assert_uint_eq(st.phase, 3);
    omv_opt_saved_t saved;
    omv_optimizer_save(a.opt, &saved);
    ck_assert_uint_eq(saved.phase, 2);
    ck_assert_uint_eq(saved.running, 0);
    int p2 = phase_cmd(&a, phase_cmd(&a, 0) + 1);
    ck_assert(near(saved.lr, a.cmds[p2].lr));
    ck_assert(near(saved.lr_ref, a.cmds[p2].lr));
    double base = a.snap_loss;
    sim_until_phase(&a, 3);

    /* The search runs again from its start and makes the same choice. */
    sim_init_restored(&b, &p, f_schedule, t_flat, &saved, base);
    ck_assert_uint_eq(b.cmds[0].flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert(near(b.cmds[0].lr, saved.lr_ref / 10.0));
    sim_until_phase(&b, 3);
    cfg_t ca = cmd_cfg(&a, phase_cmd(&a, p2 + 1)), cb = cmd_cfg(&b, phase_cmd(&b, 0));
    assert_cfg(cb, ca.g, ca.m, ca.lr);
    omv_strbuf_t sb;
    decisions(&b, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "[{\"event\":\"resume\",\"t_s\":100,\"phase\":2,"
                                          "\"state\":\"search\","));
    omv_strbuf_fini(&sb);
    sim_fini(&a);
    sim_fini(&b);

    /* Saved during the first search: nothing was decided, so it starts cold. */
    sim_init(&a, &p, f_schedule, t_flat);
    for (int i = 0; i < 15; i++)
        sim_step(&a);
    omv_optimizer_save(a.opt, &saved);
    ck_assert_uint_eq(saved.phase, 0);
    sim_init_restored(&b, &p, f_schedule, t_flat, &saved, 2.3);
    assert_cfg(cmd_cfg(&b, 0), 1, 0.9, 0.0001);
    decisions(&b, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"resume\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"state\":\"cold\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"start\""));
    omv_strbuf_fini(&sb);
    sim_fini(&a);
    sim_fini(&b);
}
END_TEST

START_TEST(test_restore_rejects_what_does_not_fit)
{
    omv_optimizer_params_t p = params(4);
    omv_opt_saved_t saved = {.phase = 2,
                             .running = 1,
                             .groups = 3,
                             .momentum = 0.3,
                             .lr = 0.01,
                             .lr_ref = 0.01,
                             .groups_he = 4};
    omv_optimizer_t *o = omv_optimizer_new(&p);
    ck_assert_ptr_nonnull(o);
    /* g = 3 is no power of two dividing 4. */
    ck_assert_int_eq(omv_optimizer_restore(o, &saved, 1.0), -EINVAL);
    saved.groups = 2;
    saved.lr = NAN;
    ck_assert_int_eq(omv_optimizer_restore(o, &saved, 1.0), -EINVAL);
    saved.lr = 0.01;
    saved.momentum = 1.0;
    ck_assert_int_eq(omv_optimizer_restore(o, &saved, 1.0), -EINVAL);
    /* Refused: the optimizer is as new and starts cold. */
    omv_opt_cmd_t c;
    ck_assert_int_eq(omv_optimizer_poll(o, 1.0, &c), 1);
    ck_assert(near(c.lr, 0.0001));
    /* Too late once it has begun. */
    saved.momentum = 0.3;
    ck_assert_int_eq(omv_optimizer_restore(o, &saved, 1.0), -EINVAL);
    omv_optimizer_destroy(&o);

    /* What the job fixes wins over the saved value: lr fixed at 0.05. */
    p.lr = 0.05;
    o = omv_optimizer_new(&p);
    ck_assert_int_eq(omv_optimizer_restore(o, &saved, 1.0), 0);
    ck_assert_int_eq(omv_optimizer_poll(o, 1.0, &c), 1);
    ck_assert(near(c.lr, 0.05));
    ck_assert_uint_eq(c.groups, 2);
    ck_assert(near(c.momentum, 0.3));
    omv_optimizer_destroy(&o);
}
END_TEST

/* ---- membership ---- */

static void sim_members(sim_t *s, uint32_t live)
{
    ck_assert_int_eq(omv_optimizer_set_workers(s->opt, live, s->now), 1);
    sim_poll(s);
}

START_TEST(test_membership_caps_a_phase)
{
    omv_optimizer_params_t p = params(4);
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups, 2); /* see test_momentum_zero_halves_g */
    for (int i = 0; i < 100; i++)
        sim_step(&s); /* 50 steps of each group */
    double m = st.momentum, lr = st.lr;
    /* Three live: g = 2 is still allowed; the phase is regrouped (rebalanced), same values. */
    int n = s.n_cmds;
    sim_members(&s, 3);
    ck_assert_int_eq(s.n_cmds, n + 1);
    ck_assert_uint_eq(s.cmds[n].flags, OMV_OPT_CMD_SET);
    assert_cfg(cmd_cfg(&s, n), 2, m, lr);
    /* One live: g = 1 for the rest of the phase. */
    sim_members(&s, 1);
    ck_assert_uint_eq(s.cmds[n + 1].flags, OMV_OPT_CMD_SET);
    assert_cfg(cmd_cfg(&s, n + 1), 1, m, lr);
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.groups_max, 1);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_RUNNING);
    /* The phase's 200 steps: 50 done, 150 left at g = 1. */
    for (int i = 0; i < 149; i++)
        sim_step(&s);
    ck_assert_int_eq(s.n_cmds, n + 2);
    sim_step(&s);
    ck_assert_int_eq(s.n_cmds, n + 3);
    /* The next search stays at g = 1. */
    sim_until_phase(&s, 2);
    for (int i = n + 2; i < s.n_cmds; i++)
        ck_assert_uint_eq(s.cmds[i].groups, 1);
    /* Back to four: the phase returns to the g its search chose. */
    omv_optimizer_status(s.opt, &st);
    sim_members(&s, 4);
    ck_assert_uint_eq(s.cmds[s.n_cmds - 1].groups, 1); /* phase 2 was chosen at g = 1 */
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"event\":\"membership\",\"t_s\":"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"workers\":3,\"from\":4,\"g_max\":2,\"g\":2,"
                                          "\"reason\":\"3 live workers (were 4): phase 1 goes "
                                          "on at g=2 for its 150 steps left\""));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"workers\":1,\"from\":3,\"g_max\":1,\"g\":1,"));
    omv_strbuf_fini(&sb);
    ck_assert_int_eq(omv_optimizer_set_workers(s.opt, 4, s.now), 0); /* no change */
    ck_assert_int_eq(omv_optimizer_set_workers(s.opt, 0, s.now), -EINVAL);
    sim_fini(&s);
}
END_TEST

START_TEST(test_membership_reruns_the_probe)
{
    omv_optimizer_params_t p = params(4);
    sim_t s;
    sim_init(&s, &p, f_basic, t_linear);
    /* The second cold probe, 5 steps in. */
    while (s.n_cmds < 2)
        sim_step(&s);
    for (int i = 0; i < 5; i++)
        sim_step(&s);
    cfg_t was = cmd_cfg(&s, 1);
    sim_members(&s, 3);
    ck_assert_int_eq(s.n_cmds, 3);
    ck_assert_uint_eq(s.cmds[2].flags, OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    assert_cfg(cmd_cfg(&s, 2), was.g, was.m, was.lr);
    /* It runs its whole budget again: the 5 steps before do not count. */
    for (int i = 0; i < 9; i++)
        sim_step(&s);
    ck_assert_int_eq(s.n_cmds, 3);
    sim_step(&s);
    ck_assert_int_eq(s.n_cmds, 4);
    /* On to the timing stage: at g = 2 (3 live) the timing is discarded and starts again at
     * g = 1; g = 4 is never tried. */
    while (s.cmds[s.n_cmds - 1].groups != 2)
        sim_step(&s);
    sim_step(&s);
    int n = s.n_cmds;
    sim_members(&s, 2);
    assert_cfg(cmd_cfg(&s, n), 1, 0.0, s.cmds[n - 1].lr);
    sim_until_phase(&s, 1);
    cfg_t c[64];
    int k = probes(&s, 0, c, 64);
    for (int i = 0; i < k; i++)
        ck_assert_uint_le(c[i].g, 2);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "\"discarded\":{\"stage\":\"cold\",\"g\":1,"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"steps\":5,\"observations\":5}"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"workers\":2,\"from\":3,\"g_max\":2,\"g\":1,"
                                          "\"discarded\":{\"stage\":\"timing\",\"g\":2,"));
    ck_assert_ptr_nonnull(strstr(sb.data, "the timing starts again at g=1"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* A grid above the new cap starts again at it: the grid at g = 4, then 3 live. */
    sim_init(&s, &p, f_basic, t_linear);
    while (!(s.cmds[s.n_cmds - 1].groups == 4 && s.n_cmds > 7))
        sim_step(&s);
    n = s.n_cmds;
    sim_members(&s, 3);
    ck_assert_uint_eq(s.cmds[n].groups, 2);
    ck_assert_uint_eq(s.cmds[n].flags, OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "the grid starts again at g=2"));
    omv_strbuf_fini(&sb);
    sim_until_phase(&s, 1);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_le(st.groups, 2);
    sim_fini(&s);
}
END_TEST

START_TEST(test_membership_before_a_command_is_polled)
{
    omv_optimizer_params_t p = params(4);
    omv_optimizer_t *o = omv_optimizer_new(&p);
    ck_assert_ptr_nonnull(o);
    /* Not started: only noted. */
    ck_assert_int_eq(omv_optimizer_set_workers(o, 3, 0.5), 0);
    omv_opt_status_t st;
    omv_optimizer_status(o, &st);
    ck_assert_uint_eq(st.groups_max, 3);
    omv_opt_cmd_t c;
    ck_assert_int_eq(omv_optimizer_poll(o, 1.0, &c), 1);
    ck_assert_uint_eq(c.flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    /* A worker leaves after the first probe's step; then another before its re-run was polled:
     * the second replaces the first, still a RESTORE (the base was taken). */
    omv_opt_obs_t ob = {1.5, c.gen, 0, 1, 2.0, 64};
    ck_assert_int_eq(omv_optimizer_observe(o, &ob), 0);
    ck_assert_int_eq(omv_optimizer_set_workers(o, 2, 2.0), 1);
    ck_assert_int_eq(omv_optimizer_set_workers(o, 1, 2.0), 1);
    ck_assert_int_eq(omv_optimizer_poll(o, 2.0, &c), 1);
    ck_assert_uint_eq(c.flags, OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert_uint_eq(c.gen, 3);
    ck_assert_int_eq(omv_optimizer_poll(o, 2.0, &c), 0);
    omv_optimizer_destroy(&o);

    /* The next search's SNAPSHOT is still queued when membership changes (the phase's last
     * step was observed, nothing polled since): the replacement keeps the SNAPSHOT, as there is
     * no base of this search to restore yet. */
    p = params(2);
    p.groups = 1;
    o = omv_optimizer_new(&p);
    double now = 1.0;
    uint64_t gen = 0;
    for (int i = 0; i < 100000; i++) {
        if (omv_optimizer_poll(o, now, &c) == 1)
            gen = c.gen;
        omv_optimizer_status(o, &st);
        if (st.state == OMV_OPT_STATE_RUNNING)
            break;
        omv_opt_obs_t step = {now += 1.0, gen, 0, 0, 2.0 - 0.001 * i, 64};
        ck_assert_int_ge(omv_optimizer_observe(o, &step), 0);
    }
    ck_assert_int_eq(st.state, OMV_OPT_STATE_RUNNING);
    for (uint32_t i = 0; i < p.phase_steps; i++) {
        omv_opt_obs_t step = {now += 1.0, gen, 0, 0, 1.0, 64};
        ck_assert_int_eq(omv_optimizer_observe(o, &step), 0);
        if (i + 1 < p.phase_steps)
            ck_assert_int_eq(omv_optimizer_poll(o, now, &c), 0);
    }
    omv_optimizer_status(o, &st);
    ck_assert_int_eq(st.state, OMV_OPT_STATE_PROBING);
    ck_assert_int_eq(omv_optimizer_set_workers(o, 1, now), 1);
    ck_assert_int_eq(omv_optimizer_poll(o, now, &c), 1);
    ck_assert_uint_eq(c.flags, OMV_OPT_CMD_SNAPSHOT | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    omv_optimizer_destroy(&o);
}
END_TEST

/* ---- a phase that diverges ---- */

/* Like f_basic, but once the loss went below 0.5 at a learning rate of 0.01 or more, such a
 * learning rate makes it grow 30% a step: probes from the start never see it, the phase does. */
static bool late_armed;

static double f_late_blowup(double lr, double m, uint32_t g, double loss)
{
    if (lr >= 0.01 && loss < 0.5)
        late_armed = true;
    if (lr >= 0.01 && late_armed)
        return 1.3;
    return f_basic(lr, m, g, loss);
}

START_TEST(test_phase_divergence_rolls_back)
{
    omv_optimizer_params_t p = params(1);
    sim_t s;
    late_armed = false;
    sim_init(&s, &p, f_late_blowup, t_flat);
    sim_until_phase(&s, 1);
    int first = phase_cmd(&s, 0);
    ck_assert(near(s.cmds[first].lr, 0.01));
    double start = s.loss; /* the phase's starting model */
    int n = s.n_cmds;
    for (int i = 0; i < 200 && s.n_cmds == n; i++)
        sim_step(&s);
    /* It diverged before the phase's 200 steps: the next command restores the phase's start. */
    ck_assert_int_eq(s.n_cmds, n + 1);
    ck_assert_uint_eq(s.cmds[n].flags, OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_PROBE);
    ck_assert_msg(s.loss == start, "restored loss %g, phase began at %g", s.loss, start);
    omv_opt_status_t st;
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.divergences_total, 1);
    ck_assert_uint_eq(st.phase, 2);
    /* The search that follows is a tenth lower: lr {0.0001, 0.001}. */
    sim_until_phase(&s, 2);
    cfg_t c[32];
    int k = probes(&s, n, c, 32);
    ck_assert_int_ge(k, 2);
    for (int i = 0; i < k; i++)
        ck_assert(near(c[i].lr, 0.001) || near(c[i].lr, 0.0001));
    int second = phase_cmd(&s, n);
    ck_assert_uint_eq(s.cmds[second].flags,
                      OMV_OPT_CMD_RESTORE | OMV_OPT_CMD_SET | OMV_OPT_CMD_DONE_SEARCH);
    ck_assert(near(s.cmds[second].lr, 0.001));
    /* Phase 2 goes to its end at the lower learning rate. */
    sim_until_phase(&s, 3);
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.divergences_total, 1);
    omv_strbuf_t sb;
    decisions(&s, &sb);
    ck_assert_ptr_nonnull(strstr(sb.data, "{\"event\":\"diverge\",\"t_s\":"));
    ck_assert_ptr_nonnull(strstr(sb.data, "\"restore\":true,\"lr_ref\":0.001,\"reason\":\"mean "
                                          "of the last 16 losses"));
    omv_strbuf_fini(&sb);
    sim_fini(&s);

    /* Nothing to go back to (nothing was probed: momentum and lr fixed, N = 1): recorded once,
     * and the phase goes on. */
    p = params(1);
    p.momentum = 0.9;
    p.lr = 0.01;
    late_armed = false;
    sim_init(&s, &p, f_late_blowup, t_flat);
    sim_until_phase(&s, 2);
    ck_assert_int_eq(s.n_cmds, 1);
    decisions(&s, &sb);
    const char *d = strstr(sb.data, "\"event\":\"diverge\"");
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_nonnull(strstr(d, "\"restore\":false,\"lr_ref\":null"));
    ck_assert_ptr_nonnull(strstr(d, "no starting model to go back to"));
    ck_assert_ptr_null(strstr(d + 1, "\"event\":\"diverge\"")); /* once per phase */
    omv_strbuf_fini(&sb);
    omv_optimizer_status(s.opt, &st);
    ck_assert_uint_eq(st.divergences_total, 0);
    sim_fini(&s);
}
END_TEST

START_TEST(test_noisy_phase_does_not_diverge)
{
    /* A phase's losses around 0.3 after a lucky first one (0.1), with single spikes to 3x:
     * no divergence (a window of one loss, or of three, would see one). */
    omv_optimizer_params_t p = params(1);
    p.lr = 0.01;
    p.phase_steps = 2000;
    omv_optimizer_t *o = omv_optimizer_new(&p);
    ck_assert_ptr_nonnull(o);
    omv_opt_cmd_t c;
    omv_opt_status_t st;
    double now = 1.0;
    uint64_t gen = 0;
    for (int i = 0; i < 1000; i++) {
        if (omv_optimizer_poll(o, now, &c) == 1)
            gen = c.gen;
        omv_optimizer_status(o, &st);
        if (st.state == OMV_OPT_STATE_RUNNING)
            break;
        omv_opt_obs_t ob = {now += 1.0, gen, 0, 0, 2.0 - 0.001 * i, 64};
        ck_assert_int_ge(omv_optimizer_observe(o, &ob), 0);
    }
    ck_assert_int_eq(st.state, OMV_OPT_STATE_RUNNING);
    for (int i = 0; i < 1900; i++) {
        double loss = i == 0 ? 0.1 : (i % 97 == 0 ? 0.9 : 0.3 + 0.05 * sin(i));
        omv_opt_obs_t ob = {now += 1.0, gen, 0, 0, loss, 64};
        ck_assert_int_eq(omv_optimizer_observe(o, &ob), 0);
        ck_assert_int_eq(omv_optimizer_poll(o, now, &c), 0);
    }
    omv_strbuf_t sb;
    omv_strbuf_init(&sb);
    omv_optimizer_decisions(o, &sb);
    ck_assert_ptr_null(strstr(sb.data, "\"event\":\"diverge\""));
    omv_strbuf_fini(&sb);
    omv_optimizer_destroy(&o);
}
END_TEST

/* The learning-rate grid follows the update rule: SGD's for sgd, a decade lower for Adam. */
START_TEST(test_adam_lr_grid)
{
    static omv_job_t j;
    ck_assert_int_eq(omv_config_defaults(omv_job_table, omv_job_table_len, &j), 0);
    j.update = OMV_JOB_UPDATE_SGD;
    omv_tuner_t *sgd = omv_tuner_new(&j, NULL);
    j.update = OMV_JOB_UPDATE_ADAMW;
    omv_tuner_t *adam = omv_tuner_new(&j, NULL);
    ck_assert_ptr_nonnull(sgd);
    ck_assert_ptr_nonnull(adam);
    const omv_optimizer_params_t *s = omv_tuner_params(sgd), *a = omv_tuner_params(adam);
    ck_assert_uint_eq(s->n_lr_grid, 4);
    ck_assert_uint_eq(a->n_lr_grid, 4);
    ck_assert_double_eq(s->lr_grid[0], 0.1);
    ck_assert_double_eq_tol(a->lr_grid[0], 0.01, 1e-12);
    ck_assert_double_eq_tol(a->lr_grid[3], 1e-5, 1e-15);
    omv_tuner_destroy(&sgd);
    omv_tuner_destroy(&adam);
}
END_TEST

static Suite *optimizer_suite(void)
{
    Suite *s = suite_create("optimizer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_cold_start_lr);
    tcase_add_test(tc, test_noise_ties);
    tcase_add_test(tc, test_noisy_momentum_zero_keeps_g);
    tcase_add_test(tc, test_groups_grow_while_faster);
    tcase_add_test(tc, test_warmup_left_out_of_timing);
    tcase_add_test(tc, test_snapshot_restore_order);
    tcase_add_test(tc, test_nan_prunes_more_aggressive);
    tcase_add_test(tc, test_growing_loss_prunes);
    tcase_add_test(tc, test_ties);
    tcase_add_test(tc, test_momentum_zero_halves_g);
    tcase_add_test(tc, test_phase_lr_stays_or_drops_tenfold);
    tcase_add_test(tc, test_fixed_groups);
    tcase_add_test(tc, test_fixed_lr);
    tcase_add_test(tc, test_fixed_momentum);
    tcase_add_test(tc, test_all_fixed);
    tcase_add_test(tc, test_decisions_json);
    tcase_add_test(tc, test_stale_and_bad_observations);
    tcase_add_test(tc, test_params_rejected);
    tcase_add_test(tc, test_first_grid_cold_lr_and_short_later_probes);
    tcase_add_test(tc, test_save_restore_mid_phase);
    tcase_add_test(tc, test_save_restore_mid_search);
    tcase_add_test(tc, test_restore_rejects_what_does_not_fit);
    tcase_add_test(tc, test_membership_caps_a_phase);
    tcase_add_test(tc, test_membership_reruns_the_probe);
    tcase_add_test(tc, test_membership_before_a_command_is_polled);
    tcase_add_test(tc, test_phase_divergence_rolls_back);
    tcase_add_test(tc, test_noisy_phase_does_not_diverge);
    tcase_add_test(tc, test_adam_lr_grid);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(optimizer_suite());
}
