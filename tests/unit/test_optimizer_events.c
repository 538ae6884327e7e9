/* The optimizer across what interrupts its plan, with the simulated cluster of
 * tests/lib/optimizer_sim.c: a restart from saved state, a change of membership, and a phase
 * that diverges. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "optimizer.h"
#include "optimizer_sim.h"
#include "testutil.h"

/* ---- durable state ---- */

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

static Suite *optimizer_events_suite(void)
{
    Suite *s = suite_create("optimizer_events");
    TCase *tc = tcase_create("events");
    tcase_add_test(tc, test_save_restore_mid_phase);
    tcase_add_test(tc, test_save_restore_mid_search);
    tcase_add_test(tc, test_restore_rejects_what_does_not_fit);
    tcase_add_test(tc, test_membership_caps_a_phase);
    tcase_add_test(tc, test_membership_reruns_the_probe);
    tcase_add_test(tc, test_membership_before_a_command_is_polled);
    tcase_add_test(tc, test_phase_divergence_rolls_back);
    tcase_add_test(tc, test_noisy_phase_does_not_diverge);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(optimizer_events_suite());
}
