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
    run_tuned("groups = 2", "tune_groups = no\ntune_learning_rate = no", json, sizeof(json),
              status, sizeof(status));
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

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("tuning");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_optimizer_tunes_a_live_run);
    tcase_add_test(tc, test_optimizer_keeps_what_the_job_fixes);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
