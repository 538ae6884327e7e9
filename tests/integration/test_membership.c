/* Integration tests of membership and restarts with real processes: workers joining, leaving,
 * dying and rejoining during training; the staleness bound under random worker speeds; the
 * daemon killed with SIGKILL and restarted from its checkpoints. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"
#include "control.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

START_TEST(test_join_leave_die_rejoin)
{
    /* Slow enough steps (2 ms) that the job lasts while workers come and go. */
    write_job(2, 40, "groups = 1");
    pid_t d = start_daemon();
    pid_t w1 = start_worker_slow("trainer", "2");
    pid_t w2 = start_worker_slow("trainer", "2");
    pid_t ev = start_worker("evaluator");
    wait_status("step", 20, 30000);

    /* A third worker joins the running job and gets a third of the data. */
    pid_t w3 = start_worker_slow("trainer", "2");
    wait_status("workers_alive", 3, 10000);
    double step = status_field("step");
    wait_status("step", step + 20, 10000);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("workers", &body);
    const char *s = omv_strbuf_str(&body);
    ck_assert_msg(has_text(s, "name:test-worker"), "the workers' --name is not shown: %s", s);
    ck_assert_msg(has_text(s, "slice_begin:0\nslice_count:1365") &&
                      has_text(s, "slice_begin:1365\nslice_count:1365") &&
                      has_text(s, "slice_begin:2730\nslice_count:1366"),
                  "the 4096 images are not split in three: %s", s);
    /* The group's batch of 32 splits as evenly as it goes: 11, 11 and 10 images a step. */
    int elevens = 0, tens = 0;
    for (const char *p = s; (p = strstr(p, "\nbatch:")) != NULL; p++) {
        elevens += strncmp(p, "\nbatch:11\n", 10) == 0;
        tens += strncmp(p, "\nbatch:10\n", 10) == 0;
    }
    ck_assert_msg(elevens == 2 && tens == 1, "the batch is not split 11/11/10: %s", s);

    /* A checkpoint on request lands on disk, where status says. */
    control("checkpoint", &body);
    char path[1024] = "";
    ck_assert_int_eq(text_field(omv_strbuf_str(&body), "path", path, sizeof(path)), 0);
    ck_assert_msg(strstr(path, "/checkpoints/blobs/checkpoint-") != NULL, "%s", path);
    ck_assert_int_eq(access(path, R_OK), 0);
    ck_assert(status_field("written_total") >= 1);

    /* SIGTERM: it says goodbye and its group does not wait for a timeout. */
    kill(w3, SIGTERM);
    expect_exit_0(w3, "the leaving worker");
    wait_status("leaves_total", 1, 1000);
    ck_assert_int_eq(status_field("workers_alive"), 2);
    ck_assert_int_eq(status_field("deaths_total"), 0);
    control("workers", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "state:left"), "%s", omv_strbuf_str(&body));

    /* A worker that stops answering is declared dead; its group goes on without it. */
    kill(w1, SIGSTOP);
    wait_status("deaths_total", 1, 10000);
    step = status_field("step");
    wait_status("step", step + 20, 10000);
    control("workers", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "slice_begin:0\nslice_count:4096"),
                  "the survivor does not have all the data: %s", omv_strbuf_str(&body));

    /* It comes back: the daemon refuses the dead worker's messages, and it registers again. */
    kill(w1, SIGCONT);
    wait_status("rejoins_total", 1, 15000);
    ck_assert_int_eq(status_field("workers_alive"), 2);
    ck_assert(status_field("refused_unknown_worker_total") >= 1);

    /* The job finishes, accurately, and everyone still there exits cleanly. */
    wait_done(&body, 120000);
    ck_assert_msg(field(omv_strbuf_str(&body), "test_accuracy") > 0.95, "%s",
                  omv_strbuf_str(&body));
    ck_assert_msg(field(omv_strbuf_str(&body), "epoch") >= 40.0, "%s", omv_strbuf_str(&body));
    expect_exit_0(w1, "the rejoined worker");
    expect_exit_0(w2, "a worker");
    expect_exit_0(ev, "the evaluator");
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

/* Four groups, workers of random and unequal speeds; returns the largest staleness the daemon
 * served. */
static double run_groups(const char *staleness)
{
    char extra[128];
    snprintf(extra, sizeof(extra), "groups = 4\nstaleness = %s", staleness);
    write_job(4, 8, extra);
    /* A fresh start: the job of the same name before is done, and would be resumed as done. */
    char ckpt[700];
    snprintf(ckpt, sizeof(ckpt), "%s/checkpoints", test_dir);
    omv_test_rmdir(ckpt);
    pid_t d = start_daemon();
    pid_t w[4] = {start_worker_slow("trainer", "0-4"), start_worker_slow("trainer", "0-4"),
                  start_worker_slow("trainer", "1-6"), start_worker_slow("trainer", "6-12")};
    wait_status("images_total", 8 * 4096, 120000);
    double seen = status_field("staleness_max_observed");
    ck_assert_int_eq(status_field("refused_total"), 0);
    for (int i = 0; i < 4; i++)
        expect_exit_0(w[i], "a worker");
    shutdown_daemon(d);
    return seen;
}

START_TEST(test_staleness_bound_holds)
{
    /* With bound 1, no read is more than one step ahead of the slowest group... */
    double bounded = run_groups("1");
    ck_assert_msg(bounded <= 1, "a pull was served %g steps ahead of another group", bounded);
    ck_assert_msg(bounded == 1, "the workers never drifted apart: the test shows nothing");
    /* ...while without a bound the fast groups run far ahead of the slow one. */
    double unbounded = run_groups("none");
    ck_assert_msg(unbounded > 5, "without a bound the groups stayed within %g steps", unbounded);
}
END_TEST

/* ---- the daemon killed and restarted ---- */

#define FMNIST "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"

static void write_fashion_job(const char *name)
{
    snprintf(job_path, sizeof(job_path), "%s/%s.ini", test_dir, name);
    FILE *f = fopen(job_path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "[job]\nname = %s\nepochs = 3\nseed = 11\n"
            "[model]\nlayers = 784 64 10\n"
            "[data]\ntrain_limit = 12000\n"
            "[train]\nbatch_size = 64\nlearning_rate = 0.05\nmomentum = 0.9\n"
            "[cluster]\nworkers = 2\nworker_timeout_s = 5\n"
            "[eval]\nevery_epochs = 0\n"
            "[checkpoint]\nevery_s = 0\nevery_steps = 40\nkeep = 3\n",
            name);
    fclose(f);
    snprintf(sock_path, sizeof(sock_path), "%s/control.sock", test_dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", test_dir);
}

static double wait_job(void)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done(&body, 120000);
    omv_strbuf_fini(&body);
    return acc;
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

START_TEST(test_daemon_killed_and_restarted)
{
    if (access(FMNIST, R_OK) != 0) {
        fprintf(stderr, "skipped: %s is missing (install dataset-fashion-mnist)\n", FMNIST);
        return;
    }
    /* The reference: the same job, uninterrupted. */
    write_fashion_job("reference");
    pid_t d = start_daemon();
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    double reference = wait_job();
    for (int i = 0; i < 3; i++)
        expect_exit_0(w[i], "a worker");
    shutdown_daemon(d);

    /* The same job, with the daemon killed half-way. */
    write_fashion_job("restarted");
    d = start_daemon();
    w[0] = start_worker_slow("trainer", "3");
    w[1] = start_worker_slow("trainer", "3");
    w[2] = start_worker("evaluator");
    wait_status("step", 250, 60000);
    kill(d, SIGKILL);
    ck_assert_int_eq(waitpid(d, NULL, 0), d);
    double step_at_kill = 250; /* at least; a few more may have been done */

    d = start_daemon();
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("status", &body);
    char resumed[1024] = "";
    text_field(omv_strbuf_str(&body), "resumed_from", resumed, sizeof(resumed));
    ck_assert_msg(strstr(resumed, "/checkpoints/restarted/checkpoint-") != NULL,
                  "did not resume: %s", omv_strbuf_str(&body));
    /* It lost at most one checkpoint interval (40 steps). */
    double clock = field(omv_strbuf_str(&body), "group_clocks");
    ck_assert_msg(clock >= step_at_kill - 40, "resumed at step %g, killed after %g", clock,
                  step_at_kill);
    /* The workers find the new daemon on their own and finish the job. */
    double restarted = wait_job();
    for (int i = 0; i < 3; i++)
        expect_exit_0(w[i], "a worker");
    control("summary --json", &body);
    ck_assert_msg(json_number(omv_strbuf_str(&body), "epochs") >= 3.0, "%s", omv_strbuf_str(&body));
    /* Synchronous training resumes exactly: the checkpoint holds whole steps with their
     * momentum, and the workers seek their data to the resumed step. So the accuracy is the
     * uninterrupted run's, not merely within the point the issue allows. */
    fprintf(stderr, "test_accuracy: uninterrupted %.4f, killed and restarted %.4f\n", reference,
            restarted);
    ck_assert_msg(fabs(restarted - reference) < 1e-4,
                  "accuracy %.4f after a restart, %.4f uninterrupted", restarted, reference);
    char last[1024] = "";
    control("status", &body);
    text_field(omv_strbuf_str(&body), "last_path", last, sizeof(last));
    shutdown_daemon(d);

    /* The newest checkpoint (the final one) is corrupt: the daemon says so by name and resumes
     * from the one before. */
    flip_byte(last, 1000);
    d = start_daemon();
    control("status", &body);
    char now[1024] = "";
    text_field(omv_strbuf_str(&body), "resumed_from", now, sizeof(now));
    ck_assert_msg(now[0] != '\0' && strcmp(now, last) != 0, "resumed from %s (corrupt: %s)", now,
                  last);
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

/* Regrouping a live run, by hand through omnivorectl: 1 -> 2 -> 4 -> 1 groups of 4 workers.
 * Every group step applies each shard exactly once and every gradient is summed exactly once:
 * the shard threads' own counts agree with the groups' bookkeeping. */
/* The batch of the worker whose pid is pid, from a `workers` reply (-1: not there). */
static int batch_of(const char *workers, pid_t pid)
{
    for (const char *p = workers; (p = strstr(p, "# worker ")) != NULL; p++) {
        char v[32];
        if (text_field(p, "pid", v, sizeof(v)) == 0 && atoi(v) == (int)pid &&
            text_field(p, "batch", v, sizeof(v)) == 0)
            return atoi(v);
    }
    return -1;
}

START_TEST(test_split_by_speed)
{
    /* split = speed: a worker ten times slower (12 ms a step against 1) gets a small share of
     * the group's 32 images, the fast one the rest, so the group's step takes less than the
     * slow one alone would need for half; the even split gives each 16. */
    write_job(2, 400, "groups = 1\nsplit = speed");
    pid_t d = start_daemon();
    pid_t fast = start_worker_slow("trainer", "1");
    pid_t slow = start_worker_slow("trainer", "12");
    pid_t ev = start_worker("evaluator");
    wait_status("step", 40, 60000);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int b_fast = 0, b_slow = 0;
    for (int tries = 0; tries < 100; tries++) { /* the estimates settle over a few steps */
        control("workers", &body);
        b_fast = batch_of(omv_strbuf_str(&body), fast);
        b_slow = batch_of(omv_strbuf_str(&body), slow);
        if (b_slow > 0 && b_slow <= 8)
            break;
        sleep_ms(100);
    }
    ck_assert_msg(b_fast + b_slow == 32 && b_slow >= 1 && b_slow <= 8, "fast %d, slow %d: %s",
                  b_fast, b_slow, omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    shutdown_daemon(d);
    stop_workers((pid_t[]){fast, slow, ev}, 3);
}
END_TEST

START_TEST(test_regroup_live)
{
    write_job(4, 40, "groups = 1\nshards = 3");
    pid_t d = start_daemon();
    pid_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = start_worker_slow("trainer", "1-3");
    pid_t ev = start_worker("evaluator");
    static char out[8192];
    const int plan[] = {2, 4, 1};
    double regroups = 0;
    for (int k = 0; k < 3; k++) {
        wait_status("step", status_field("step") + 15, 30000);
        char args[32];
        snprintf(args, sizeof(args), "regroup %d", plan[k]);
        int rc = ctl_sock(out, sizeof(out), args);
        ck_assert_msg(rc == 0, "omnivorectl %s: %d: %s", args, rc, out);
        regroups = wait_status("regroups_total", regroups + 1, 20000);
        ck_assert_int_eq(status_field("groups_now"), plan[k]);
        ck_assert_int_eq(ctl_sock(out, sizeof(out), "groups"), 0);
        char want[64];
        snprintf(want, sizeof(want), "# group %d", plan[k] - 1);
        ck_assert_msg(has_text(out, want), "groups after regroup %d: %s", plan[k], out);
    }
    /* A regroup out of range is refused with the reason, and changes nothing. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "regroup 9"), 1);
    ck_assert_msg(has_text(out, "give 1 to 4"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "regroup"), 2);

    double acc = wait_job();
    ck_assert_msg(acc > 0.95, "test accuracy %.4f", acc);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("status", &body);
    const char *s = omv_strbuf_str(&body);
    double steps = field(s, "steps_total"), pushes = field(s, "pushes_recorded_total");
    ck_assert_msg(steps > 100, "%s", s);
    for (int sh = 0; sh < 3; sh++) {
        char key[64];
        snprintf(key, sizeof(key), "shard_%d_applied_total", sh);
        ck_assert_msg(field(s, key) == steps, "%s != steps_total %g:\n%s", key, steps, s);
    }
    ck_assert_msg(field(s, "summed_total") == pushes, "summed %g of %g recorded gradients:\n%s",
                  field(s, "summed_total"), pushes, s);
    ck_assert_int_eq(field(s, "refused_total"), 0);
    for (int i = 0; i < 4; i++)
        expect_exit_0(w[i], "a worker");
    expect_exit_0(ev, "the evaluator");
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

/* `systemctl restart omnivored` in the middle of a job: SIGTERM writes a checkpoint, the workers
 * wait, and the new daemon carries on from where the old one stopped. */
START_TEST(test_daemon_sigterm_mid_job)
{
    write_job(2, 30, "groups = 1");
    pid_t d = start_daemon();
    pid_t w1 = start_worker_slow("trainer", "2");
    pid_t w2 = start_worker_slow("trainer", "2");
    pid_t ev = start_worker("evaluator");
    wait_status("step", 40, 30000);
    kill(d, SIGTERM);
    expect_exit_0(d, "omnivored after SIGTERM");
    double step_at_stop = 40;

    /* The checkpoint is on disk, and the workers are waiting, not gone. */
    char path[700];
    snprintf(path, sizeof(path), "%s/checkpoints/blobs", test_dir);
    DIR *dp = opendir(path);
    ck_assert_msg(dp != NULL, "no checkpoint folder %s", path);
    int files = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL)
        files += strncmp(de->d_name, "checkpoint-", 11) == 0;
    closedir(dp);
    ck_assert_int_ge(files, 1);
    sleep_ms(300);
    ck_assert_int_eq(waitpid(w1, NULL, WNOHANG), 0);
    ck_assert_int_eq(waitpid(w2, NULL, WNOHANG), 0);

    d = start_daemon();
    ck_assert_msg(status_field("group_clocks") >= step_at_stop,
                  "resumed behind the step it stopped at");
    double acc = wait_job();
    ck_assert_msg(acc > 0.95, "test accuracy %.4f", acc);
    ck_assert_int_eq(status_field("rejoins_total"), 2);
    expect_exit_0(w1, "a worker");
    expect_exit_0(w2, "a worker");
    expect_exit_0(ev, "the evaluator");
    shutdown_daemon(d);
}
END_TEST

START_TEST(test_example_survives_a_killed_worker)
{
    if (access(FMNIST, R_OK) != 0) {
        fprintf(stderr, "skipped: %s is missing (install dataset-fashion-mnist)\n", FMNIST);
        return;
    }
    /* The MLP example as users run it, but a worker is declared dead after 2 s, not 10. */
    char example[1024];
    snprintf(example, sizeof(example), "%s/examples/fashion-mlp.ini", getenv("OMV_SOURCE_ROOT"));
    snprintf(sock_path, sizeof(sock_path), "%s/control.sock", test_dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", test_dir);
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--once",
                    "--job",
                    example,
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    test_dir,
                    "--log-level",
                    "warn",
                    "--set",
                    "cluster.worker_timeout_s=2",
                    NULL};
    pid_t d = start_daemon_argv(argv);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    pid_t victim = start_worker("trainer");
    pid_t w = start_worker("trainer");
    pid_t ev = start_worker("evaluator");
    /* SIGKILL one worker after the first epoch: its partner takes the whole group batch and
     * all the data, and the job reaches the example's accuracy (0.855 uninterrupted). */
    wait_status("epoch", 1.0, 120000);
    kill(victim, SIGKILL);
    ck_assert_int_eq(waitpid(victim, NULL, 0), victim);
    double acc = wait_job();
    fprintf(stderr, "fashion-mlp with a worker killed at epoch 1: test_accuracy %.4f\n", acc);
    ck_assert_int_eq(status_field("deaths_total"), 1);
    ck_assert_msg(acc >= 0.85, "test accuracy %.4f with a worker killed, below 0.85", acc);
    expect_exit_0(w, "the surviving worker");
    expect_exit_0(ev, "the evaluator");
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("membership");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_join_leave_die_rejoin);
    tcase_add_test(tc, test_staleness_bound_holds);
    tcase_add_test(tc, test_daemon_killed_and_restarted);
    tcase_add_test(tc, test_daemon_sigterm_mid_job);
    tcase_add_test(tc, test_regroup_live);
    tcase_add_test(tc, test_split_by_speed);
    tcase_add_test(tc, test_example_survives_a_killed_worker);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
