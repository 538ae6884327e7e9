/* The optimizer's interface: values the job fixes, parameters it rejects, observations it
 * ignores, the decisions and describe reports, and the learning-rate grid the tuner gives it;
 * with the simulated cluster of tests/lib/optimizer_sim.c. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "optimizer.h"
#include "optimizer_sim.h"
#include "tuner.h"
#include "testutil.h"

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

static Suite *optimizer_api_suite(void)
{
    Suite *s = suite_create("optimizer_api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_fixed_groups);
    tcase_add_test(tc, test_fixed_lr);
    tcase_add_test(tc, test_fixed_momentum);
    tcase_add_test(tc, test_all_fixed);
    tcase_add_test(tc, test_decisions_json);
    tcase_add_test(tc, test_stale_and_bad_observations);
    tcase_add_test(tc, test_params_rejected);
    tcase_add_test(tc, test_adam_lr_grid);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(optimizer_api_suite());
}
