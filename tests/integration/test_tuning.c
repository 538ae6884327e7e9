/* Integration tests of the optimizer in a live run of real processes: it probes, chooses a
 * configuration per phase, regroups the workers, writes its decisions beside the checkpoints,
 * respects what the job fixes, and no step's update is lost or applied twice on the way. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"
#include "control.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

/* Runs a 4-worker job with the optimizer on (and extra job lines in [optimizer]) to the end;
 * returns the summary JSON in json[cap] and the status text in status[cap]. */
static void run_tuned(const char *cluster, const char *optimizer_extra, char *json, size_t cap,
                      char *status, size_t scap)
{
    write_job(4, 60, cluster);
    FILE *f = fopen(job_path, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[optimizer]\nenabled = yes\nphase_steps = 160\nprobe_steps = 6\n%s\n",
            optimizer_extra);
    fclose(f);
    pid_t d = start_daemon();
    pid_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = start_worker_slow("trainer", "0-2");
    pid_t ev = start_worker("evaluator");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done(&body, 180000);
    omv_strlcpy(status, omv_strbuf_str(&body), scap);
    control("summary --json", &body);
    omv_strlcpy(json, omv_strbuf_str(&body), cap);
    for (int i = 0; i < 4; i++)
        expect_exit_0(w[i], "a worker");
    expect_exit_0(ev, "the evaluator");
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}

/* Every group step applied each shard once, every gradient was summed once. */
static void check_exactly_once(const char *s)
{
    double steps = field(s, "steps_total");
    for (int sh = 0; sh < 2; sh++) {
        char key[64];
        snprintf(key, sizeof(key), "shard_%d_applied_total", sh);
        ck_assert_msg(field(s, key) == steps, "%s != steps_total %g:\n%s", key, steps, s);
    }
    ck_assert_msg(field(s, "summed_total") == field(s, "pushes_recorded_total"), "%s", s);
    ck_assert_int_eq(field(s, "refused_total"), 0);
}

static char json[1 << 20], status[1 << 16];

START_TEST(test_optimizer_tunes_a_live_run)
{
    run_tuned("groups = 1", "", json, sizeof(json), status, sizeof(status));
    ck_assert_msg(json_number(json, "test_accuracy") > 0.95, "%s", json);
    /* It probed, chose, and ran phases; the summary names each phase's configuration. */
    ck_assert_msg(has_text(json, "\"phases\":[{\"phase\":1,"), "no phase in %s", json);
    ck_assert_msg(has_text(json, "\"event\":\"probe\""), "no probe in %s", json);
    ck_assert_msg(has_text(json, "\"event\":\"choose\""), "no choice in %s", json);
    ck_assert_msg(field(status, "regroups_total") >= 2, "%s", status);
    check_exactly_once(status);
    /* Probes are thrown away: their images are counted apart from training's. */
    ck_assert_msg(json_number(json, "probe_images") > 0, "%s", json);
    /* The decisions file beside the checkpoints holds the same decisions, one per line. */
    char path[700];
    snprintf(path, sizeof(path), "%s/checkpoints/blobs/decisions.jsonl", test_dir);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no decisions file %s", path);
    char line[4096];
    int probes = 0, chooses = 0, lines = 0;
    while (fgets(line, sizeof(line), f)) {
        lines++;
        ck_assert_msg(line[0] == '{', "not a JSON line: %s", line);
        probes += strstr(line, "\"event\":\"probe\"") != NULL;
        chooses += strstr(line, "\"event\":\"choose\"") != NULL;
    }
    fclose(f);
    ck_assert_int_ge(probes, 4);
    ck_assert_int_ge(chooses, 1);
}
END_TEST

START_TEST(test_optimizer_keeps_what_the_job_fixes)
{
    /* Groups fixed at 2 ([cluster] groups) and the learning rate fixed ([train]
     * learning_rate = 0.05): only momentum is tuned. */
    run_tuned("groups = 2", "tune_groups = no\ntune_learning_rate = no", json, sizeof(json), status,
              sizeof(status));
    ck_assert_msg(json_number(json, "test_accuracy") > 0.95, "%s", json);
    ck_assert_msg(has_text(json, "\"phases\":[{"), "no phase in %s", json);
    /* Every phase used g = 2 and lr = 0.05. */
    const char *p = strstr(json, "\"phases\":[");
    ck_assert_ptr_nonnull(p);
    const char *end = strchr(p, ']');
    for (const char *q = strstr(p, "\"groups\":"); q && q < end; q = strstr(q + 1, "\"groups\":"))
        ck_assert_msg(strtol(q + 9, NULL, 10) == 2, "a phase changed the groups: %s", p);
    for (const char *q = strstr(p, "\"learning_rate\":"); q && q < end;
         q = strstr(q + 1, "\"learning_rate\":"))
        ck_assert_msg(fabs(strtod(q + 16, NULL) - 0.05) < 1e-9, "lr changed: %s", p);
    ck_assert_int_eq(field(status, "groups_now"), 2);
    check_exactly_once(status);
}
END_TEST

/* The optimizer's report (`optimizer`) as key:value text, in body. */
static void optimizer_report(omv_strbuf_t *body)
{
    omv_strbuf_clear(body);
    int r = omv_control_request(sock_path, "optimizer", body, 5000);
    ck_assert_msg(r == 0, "optimizer: %s", omv_strerror(r));
}

/* The number after "key": in a JSON line, or NAN. */
static double json_after(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof(k), "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

START_TEST(test_optimizer_resumes_after_sigkill)
{
    /* Checkpoints every 20 steps; the daemon is killed once a phase runs and a checkpoint was
     * written during it. */
    write_job(4, 30, "groups = 1");
    FILE *f = fopen(job_path, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[optimizer]\nenabled = yes\nphase_steps = 160\nprobe_steps = 6\n"
               "[checkpoint]\nevery_s = 0\nevery_steps = 20\n");
    fclose(f);
    pid_t d = start_daemon();
    pid_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = start_worker_slow("trainer", "1-3");
    pid_t ev = start_worker("evaluator");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 60000;
    char state[32] = "";
    for (;;) {
        optimizer_report(&body);
        text_field(omv_strbuf_str(&body), "state", state, sizeof(state));
        if (strcmp(state, "running") == 0 && field(omv_strbuf_str(&body), "phase") >= 1)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "no phase began:\n%s", omv_strbuf_str(&body));
        sleep_ms(10);
    }
    double phase = field(omv_strbuf_str(&body), "phase");
    double groups = field(omv_strbuf_str(&body), "groups");
    double momentum = field(omv_strbuf_str(&body), "momentum");
    double lr = field(omv_strbuf_str(&body), "learning_rate");
    double written = status_field("written_total");
    wait_status("written_total", written + 1, 30000);
    kill(d, SIGKILL);
    ck_assert_int_eq(waitpid(d, NULL, 0), d);
    char path[700];
    snprintf(path, sizeof(path), "%s/checkpoints/blobs/decisions.jsonl", test_dir);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[1 << 14];
    int before = 0;
    while (fgets(line, sizeof(line), f))
        before++;
    fclose(f);
    ck_assert_int_ge(before, 10);

    /* Restarted: the workers come back on their own; the optimizer goes on from the phase it
     * was in, with its configuration, instead of a cold start. */
    d = start_daemon();
    wait_done(&body, 180000);
    ck_assert_msg(field(omv_strbuf_str(&body), "test_accuracy") > 0.95, "%s",
                  omv_strbuf_str(&body));
    for (int i = 0; i < 4; i++)
        expect_exit_0(w[i], "a worker");
    expect_exit_0(ev, "the evaluator");

    /* The decisions file was appended to: one start, then a resume of phase >= the one seen. */
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    int lines = 0, starts = 0, resumes = 0;
    char resumed[1 << 14] = "";
    while (fgets(line, sizeof(line), f)) {
        lines++;
        if (lines == 1)
            ck_assert_msg(strncmp(line, "{\"event\":\"start\",", 17) == 0, "%s", line);
        starts += strstr(line, "\"event\":\"start\"") != NULL;
        if (strstr(line, "\"event\":\"resume\"") == NULL)
            continue;
        resumes++;
        omv_strlcpy(resumed, line, sizeof(resumed));
        fprintf(stderr, "phase %g ran g=%g momentum=%g lr=%g when killed; %s", phase, groups,
                momentum, lr, line);
        ck_assert_msg(lines > before - 5, "resume in line %d of %d: %s", lines, before, line);
        ck_assert_msg(strstr(line, "\"state\":\"cold\"") == NULL, "a cold start: %s", line);
        double p = json_after(line, "phase");
        ck_assert_msg(p >= phase, "resumed phase %g, phase %g was running: %s", p, phase, line);
        if (p == phase) {
            ck_assert_msg(json_after(line, "g") == groups &&
                              fabs(json_after(line, "momentum") - momentum) < 1e-3 &&
                              fabs(json_after(line, "lr") - lr) < 1e-6,
                          "phase %g ran g=%g momentum=%g lr=%g; resumed as %s", phase, groups,
                          momentum, lr, line);
        }
    }
    fclose(f);
    ck_assert_int_gt(lines, before);
    ck_assert_int_eq(starts, 1);
    ck_assert_int_eq(resumes, 1);
    /* The phases table came back with the checkpoint: the phase seen running is there as it
     * was, and the phase resumed kept the configuration it had before the kill. */
    optimizer_report(&body);
    char key[32], want[200], got[200] = "";
    snprintf(key, sizeof(key), "phase_%.0f", phase);
    ck_assert_int_eq(text_field(omv_strbuf_str(&body), key, got, sizeof(got)), 0);
    snprintf(want, sizeof(want), "groups=%.0f momentum=%g learning_rate=%g ", groups, momentum, lr);
    ck_assert_msg(strncmp(got, want, strlen(want)) == 0, "%s is %s, was %s", key, got, want);
    snprintf(key, sizeof(key), "phase_%.0f", json_after(resumed, "phase"));
    ck_assert_int_eq(text_field(omv_strbuf_str(&body), key, got, sizeof(got)), 0);
    snprintf(want, sizeof(want), "groups=%.0f momentum=%g learning_rate=%g ",
             json_after(resumed, "g"), json_after(resumed, "momentum"), json_after(resumed, "lr"));
    ck_assert_msg(strncmp(got, want, strlen(want)) == 0, "%s was %s before the kill; resumed %s",
                  key, got, resumed);
    ck_assert(field(omv_strbuf_str(&body), "phase") >= phase);
    omv_strbuf_clear(&body);
    control("optimizer --json", &body);
    ck_assert_msg(!has_text(omv_strbuf_str(&body), "\"stage\":\"cold\""), "%s",
                  omv_strbuf_str(&body));
    ck_assert_msg(has_text(omv_strbuf_str(&body), "\"event\":\"resume\""), "%s",
                  omv_strbuf_str(&body));
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

START_TEST(test_optimizer_follows_membership)
{
    /* A worker dies during the first search: the probe it disturbed runs again, no g exceeds
     * the three left, and the job ends (a probe waiting for a group without members would never
     * end, and probes do not count as training). */
    write_job(4, 30, "groups = 1");
    FILE *f = fopen(job_path, "a");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[optimizer]\nenabled = yes\nphase_steps = 160\nprobe_steps = 6\n");
    fclose(f);
    pid_t d = start_daemon();
    pid_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = start_worker_slow("trainer", "1-3");
    pid_t ev = start_worker("evaluator");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 60000;
    for (;;) {
        optimizer_report(&body);
        if (field(omv_strbuf_str(&body), "probes_total") >= 3)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "no probes:\n%s", omv_strbuf_str(&body));
        sleep_ms(10);
    }
    kill(w[3], SIGKILL);
    ck_assert_int_eq(waitpid(w[3], NULL, 0), w[3]);
    wait_done(&body, 180000);
    ck_assert_msg(field(omv_strbuf_str(&body), "test_accuracy") > 0.9, "%s", omv_strbuf_str(&body));
    ck_assert_int_eq(field(omv_strbuf_str(&body), "deaths_total"), 1);
    ck_assert_msg(field(omv_strbuf_str(&body), "groups_now") <= 2, "%s", omv_strbuf_str(&body));
    for (int i = 0; i < 3; i++)
        expect_exit_0(w[i], "a worker");
    expect_exit_0(ev, "the evaluator");
    omv_strbuf_clear(&body);
    control("optimizer --json", &body);
    const char *j = omv_strbuf_str(&body);
    ck_assert_msg(has_text(j, "\"event\":\"membership\""), "%s", j);
    ck_assert_msg(has_text(j, "\"workers\":3,\"from\":4,\"g_max\":2,"), "%s", j);
    ck_assert_msg(has_text(j, "\"groups_max\":3,"), "%s", j);
    /* After the death, no command asked for more than two groups. */
    const char *m = strstr(j, "\"event\":\"membership\"");
    for (const char *q = strstr(m, "\"g\":"); q; q = strstr(q + 1, "\"g\":"))
        ck_assert_msg(strtol(q + 4, NULL, 10) <= 2, "g above the live workers: %.200s", q);
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("tuning");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_optimizer_tunes_a_live_run);
    tcase_add_test(tc, test_optimizer_keeps_what_the_job_fixes);
    tcase_add_test(tc, test_optimizer_resumes_after_sigkill);
    tcase_add_test(tc, test_optimizer_follows_membership);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
