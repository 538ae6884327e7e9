/* The optimizer's search rules, driven by a simulated cluster (tests/lib/optimizer_sim.c):
 * the cold start, the timing of g, the grid's pruning and ties, halving g, the learning-rate
 * schedule, and the probes' lengths. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optimizer.h"
#include "optimizer_sim.h"
#include "testutil.h"

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

static Suite *optimizer_suite(void)
{
    Suite *s = suite_create("optimizer");
    TCase *tc = tcase_create("search");
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
    tcase_add_test(tc, test_first_grid_cold_lr_and_short_later_probes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(optimizer_suite());
}
