/* A long-running omnivored with a job queue, with real processes: it starts with no job, its
 * workers register and wait, jobs come through `omnivorectl submit`, run one after another with
 * the same workers, and `omnivorectl stop` ends one with a checkpoint that a resubmission
 * resumes. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cluster_util.h"
#include "control.h"
#include "jobs.h"
#include "strbuf.h"
#include "util.h"

static pid_t start_idle_daemon(void)
{
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    test_dir,
                    "--log-level",
                    "warn",
                    NULL};
    return start_daemon_argv(argv);
}

/* An idle daemon with two trainers (delay_ms per step) and an evaluator registered and
 * waiting; w gets their pids. */
static pid_t start_waiting_cluster(pid_t w[3], const char *delay_ms)
{
    pid_t d = start_idle_daemon();
    w[0] = start_worker_slow("trainer", delay_ms);
    w[1] = start_worker_slow("trainer", delay_ms);
    w[2] = start_worker("evaluator");
    wait_status("workers_waiting", 3, 20000);
    return d;
}

/* `omnivorectl submit JOB SETS` must succeed; its reply lands in out. */
static void submit(const char *sets, char *out, size_t cap)
{
    char args[1200];
    snprintf(args, sizeof(args), "submit %s %s", job_path, sets);
    ck_assert_int_eq(ctl_sock(out, cap, args), 0);
}

/* Polls `jobs` until key (in the section that holds it first) reads want. */
static void wait_jobs_text(const char *key, const char *want, int timeout_ms, char *out, size_t cap)
{
    int64_t deadline = omv_time_ms() + timeout_ms;
    for (;;) {
        ck_assert_int_eq(ctl_sock(out, cap, "jobs"), 0);
        char v[128] = "";
        if (text_field(out, key, v, sizeof(v)) == 0 && strcmp(v, want) == 0)
            return;
        ck_assert_msg(omv_time_ms() < deadline, "jobs: %s did not become '%s' within %d ms:\n%s",
                      key, want, timeout_ms, out);
        sleep_ms(50);
    }
}

/* The worker ids `workers` lists, as one string ("1 2 3"). */
static void worker_ids(char *ids, size_t cap)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("workers", &body);
    ids[0] = '\0';
    for (const char *p = omv_strbuf_str(&body); (p = strstr(p, "# worker ")) != NULL; p += 9) {
        char one[16];
        snprintf(one, sizeof(one), "%s%d", ids[0] ? " " : "", atoi(p + 9));
        strncat(ids, one, cap - strlen(ids) - 1);
    }
    omv_strbuf_fini(&body);
}

static void no_bad(void *ctx, const char *path, const char *reason)
{
    (void)ctx;
    ck_abort_msg("%s: %s", path, reason);
}

/* The whole file at path (the caller frees it). */
static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Replaces `from` with `to` in the job file, atomically (a new file renamed over it). */
static void edit_job_file(const char *from, const char *to)
{
    char *text = read_file(job_path);
    char *at = strstr(text, from);
    ck_assert_ptr_nonnull(at);
    char tmp[700];
    snprintf(tmp, sizeof(tmp), "%s.new", job_path);
    FILE *f = fopen(tmp, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(rename(tmp, job_path), 0);
    free(text);
}

START_TEST(test_queue_runs_jobs_with_the_same_workers)
{
    write_job(2, 2, "");
    pid_t d = start_idle_daemon();
    char out[16384];
    /* No job yet: status says so, and job-only commands say what to do. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "status"), 0);
    ck_assert_msg(has_text(out, "\nstate:idle\n"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "summary"), 1);
    ck_assert_msg(has_text(out, "no job is loaded; submit one"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop"), 1);
    ck_assert_msg(has_text(out, "no job is running"), "%s", out);

    pid_t w1 = start_worker("trainer"), w2 = start_worker("trainer");
    pid_t ev = start_worker("evaluator");
    wait_status("workers_waiting", 3, 20000);
    char ids_before[64];
    worker_ids(ids_before, sizeof(ids_before));
    ck_assert_msg(has_text(ids_before, " ") && strlen(ids_before) >= 5, "%s", ids_before);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "workers"), 0);
    ck_assert_msg(has_text(out, "state:idle") && !has_text(out, "state:alive"), "%s", out);

    /* Two jobs: the first runs now, the second waits its turn. The first is long enough (20
     * epochs, about a second) that the engine cannot finish it before the second is submitted. */
    char args[1200];
    submit("--set job.name=first --set job.epochs=20", out, sizeof(out));
    ck_assert_msg(has_text(out, "\nname:first\n") && has_text(out, "\nstate:waiting\n"), "%s", out);
    submit("--set job.name=second --set job.epochs=1", out, sizeof(out));
    ck_assert_msg(has_text(out, "\nstate:queued\nposition:1\n"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "jobs"), 0);
    ck_assert_msg(has_text(out, "# queued_2\nposition:1\nname:second\n"), "%s", out);
    /* The file is read once, at submit: editing it while the job waits changes nothing. */
    char *original = read_file(job_path);
    ck_assert_ptr_nonnull(strstr(original, "learning_rate = 0.05\n"));
    edit_job_file("learning_rate = 0.05\n", "learning_rate = 0.5\n");

    wait_jobs_text("finished_total", "2", 60000, out, sizeof(out));
    /* Newest first; both done, with a real accuracy (4 well separated classes). */
    const char *f2 = strstr(out, "# finished_2\n"), *f1 = strstr(out, "# finished_1\n");
    ck_assert_msg(f2 && f1 && f2 < f1, "%s", out);
    ck_assert_msg(has_text(f2, "name:second\nfile:") && has_text(f1, "name:first\nfile:"), "%s",
                  out);
    char state[32];
    ck_assert_int_eq(text_field(f2 - 1, "state", state, sizeof(state)), 0);
    ck_assert_str_eq(state, "done");
    ck_assert_int_eq(text_field(f1 - 1, "state", state, sizeof(state)), 0);
    ck_assert_str_eq(state, "done");
    ck_assert_msg(field(f1 - 1, "test_accuracy") > 0.9 && field(f2 - 1, "test_accuracy") > 0.9,
                  "%s", out);
    ck_assert_msg(fabs(field(f1 - 1, "epochs") - 20.0) < 0.1 &&
                      fabs(field(f2 - 1, "epochs") - 1.0) < 0.1,
                  "%s", out);

    /* The same processes, with the same ids, wait for the next job. */
    wait_status("workers_waiting", 3, 20000);
    ck_assert_int_eq(kill(w1, 0) + kill(w2, 0) + kill(ev, 0), 0);
    char ids_after[64];
    worker_ids(ids_after, sizeof(ids_after));
    ck_assert_str_eq(ids_after, ids_before);
    ck_assert_int_eq(status_field("rejoins_total"), 0);
    ck_assert_int_eq(status_field("refused_total"), 0);
    /* The second job ran with the text it was submitted with, and its checkpoint keeps it. */
    char dir[700];
    snprintf(dir, sizeof(dir), "%s/checkpoints/second", test_dir);
    omv_checkpoint_t c;
    char path[800];
    ck_assert_int_eq(omv_checkpoint_load_latest(&c, dir, path, sizeof(path), no_bad, NULL), 1);
    ck_assert_ptr_nonnull(c.job_text);
    ck_assert_str_eq(c.job_text, original);
    omv_checkpoint_fini(&c);
    free(original);

    /* Bad submissions are refused with the reason, and change nothing. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "submit /nonexistent/job.ini"), 2);
    ck_assert_msg(has_text(out, "/nonexistent/job.ini: No such file"), "%s", out);
    snprintf(args, sizeof(args), "submit %s --set data.train_images=%s", job_path, job_path);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 1);
    ck_assert_msg(has_text(out, "job refused:") && has_text(out, "job.ini: not an IDX image"), "%s",
                  out);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int r = omv_control_request(sock_path, "submit job.ini", &body, 5000);
    ck_assert_int_eq(r, -EREMOTEIO);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "absolute path"), "%s", omv_strbuf_str(&body));
    /* A checkpoint folder the daemon cannot write is refused at submit, naming it, not found
     * out at the first checkpoint. */
    snprintf(args, sizeof(args), "submit %s --set checkpoint.dir=%s/ckpt", job_path, job_path);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 1);
    char want[800];
    snprintf(want, sizeof(want), "job refused: the daemon cannot write checkpoints to '%s/ckpt'",
             job_path);
    ck_assert_msg(has_text(out, want), "%s", out);
    ck_assert_int_eq(status_field("jobs_submitted_total"), 2);

    shutdown_daemon(d);
    /* The workers were told to wait for a daemon to come back: stop them. */
    stop_workers((pid_t[]){w1, w2, ev}, 3);
    omv_strbuf_fini(&body);
}
END_TEST

START_TEST(test_stop_checkpoints_and_resubmit_resumes)
{
    write_job(2, 400, "");
    pid_t w[3];
    pid_t d = start_waiting_cluster(w, "2");
    char out[16384], args[1200];
    submit("--set job.name=long --set checkpoint.every_s=0", out, sizeof(out));
    snprintf(args, sizeof(args), "submit %s --set job.name=next --set job.epochs=1", job_path);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 0);
    /* Drop a queued job by id, then queue it again. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop 2"), 0);
    ck_assert_msg(has_text(out, "state:dropped from the queue"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop 2"), 1);
    ck_assert_msg(has_text(out, "no job '2' is running or queued"), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 0);

    double epoch = wait_status("epoch", 0.5, 60000);
    /* Each training worker says where it is and how fast it goes. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "workers"), 0);
    int trainers = 0;
    for (const char *p = out; (p = strstr(p, "\nrole:trainer\n")) != NULL; p++, trainers++) {
        ck_assert_msg(field(p, "step") >= 1 && field(p, "images_per_second") > 0, "%s", out);
        char st[16];
        ck_assert_int_eq(text_field(p, "state", st, sizeof(st)), 0);
        ck_assert_str_eq(st, "alive");
    }
    ck_assert_int_eq(trainers, 2);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop long"), 0);
    ck_assert_msg(has_text(out, "# stop\nid:1\nname:long\n"), "%s", out);
    /* It ends once a checkpoint holds whole steps; the next job starts. */
    wait_jobs_text("finished_total", "1", 30000, out, sizeof(out));
    const char *f = strstr(out, "# finished_1\n");
    ck_assert_ptr_nonnull(f);
    char state[32];
    ck_assert_int_eq(text_field(f - 1, "state", state, sizeof(state)), 0);
    ck_assert_str_eq(state, "stopped");
    double stopped_at = field(f - 1, "epochs");
    ck_assert_msg(stopped_at >= epoch, "stopped at epoch %g, before %g", stopped_at, epoch);
    ck_assert_msg(has_text(out, "reason:stopped by omnivorectl stop"), "%s", out);
    char ckpt[1024];
    snprintf(ckpt, sizeof(ckpt), "%s/checkpoints/long/checkpoint-00000001.omv", test_dir);
    ck_assert_msg(access(ckpt, R_OK) == 0, "no checkpoint at %s", ckpt);

    /* Submitting it again resumes where it stopped (after 'next', which is queued first). */
    submit("--set job.name=long --set checkpoint.every_s=0", out, sizeof(out));
    wait_jobs_text("name", "long", 60000, out, sizeof(out)); /* the current job comes first */
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "resumed_from:") &&
                      has_text(omv_strbuf_str(&body), "checkpoint-00000001.omv"),
                  "%s", omv_strbuf_str(&body));
    /* Exactly where it stopped: no step went past the checkpoint (both printed to 0.001). */
    ck_assert_msg(fabs(field(omv_strbuf_str(&body), "resumed_epoch") - stopped_at) < 0.0011,
                  "stopped at %.3f:\n%s", stopped_at, omv_strbuf_str(&body));
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop"), 0);
    wait_jobs_text("finished_total", "3", 30000, out, sizeof(out));
    ck_assert_int_eq(status_field("workers_alive"), 0);

    shutdown_daemon(d);
    stop_workers(w, 3);
    omv_strbuf_fini(&body);
}
END_TEST

/* `systemctl restart omnivored` with a submitted job running and another queued: the new daemon
 * resumes the first from its checkpoint and keeps the second queued, with the same ids. */
START_TEST(test_restart_restores_the_queue)
{
    write_job(2, 400, "");
    pid_t w[3];
    pid_t d = start_waiting_cluster(w, "2");
    char out[16384];
    submit("--set job.name=long --set checkpoint.every_s=0", out, sizeof(out));
    submit("--set job.name=after --set job.epochs=1", out, sizeof(out));
    double epoch = wait_status("epoch", 0.3, 60000);
    char queue[700];
    snprintf(queue, sizeof(queue), "%s/jobs.queue", test_dir);
    ck_assert_msg(access(queue, R_OK) == 0, "no %s", queue);

    kill(d, SIGTERM); /* writes a checkpoint; the workers wait for a daemon */
    expect_exit_0(d, "omnivored after SIGTERM");
    d = start_idle_daemon();
    wait_status("epoch", epoch, 30000); /* resumed, not started over */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "jobs"), 0);
    ck_assert_msg(has_text(out, "# current\nid:1\nname:long\n"), "%s", out);
    ck_assert_msg(has_text(out, "# queued_2\nposition:1\nname:after\n"), "%s", out);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "checkpoints/long/checkpoint-"), "%s",
                  omv_strbuf_str(&body));
    /* The overrides came back too: 'after' trains one epoch. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "stop"), 0);
    wait_jobs_text("finished_total", "2", 60000, out, sizeof(out));
    ck_assert_msg(has_text(out, "# finished_2\nname:after\n"), "%s", out);
    ck_assert_msg(fabs(field(strstr(out, "# finished_2\n") - 1, "epochs") - 1.0) < 0.1, "%s", out);
    /* Nothing left to restore. */
    ck_assert_int_eq(access(queue, F_OK), -1);
    shutdown_daemon(d);
    stop_workers(w, 3);
    omv_strbuf_fini(&body);
}
END_TEST

/* [job] stop_at_accuracy: the job ends, done, at the first evaluation that reaches it. */
START_TEST(test_stop_at_accuracy)
{
    write_job(1, 200, "");
    char out[65536];
    int rc = run_ctl(out, sizeof(out), "--set job.stop_at_accuracy=0.9");
    ck_assert_msg(rc == 0, "omnivorectl run exited %d: %s", rc, out);
    double acc = json_number(out, "test_accuracy"), epoch = json_number(out, "epoch");
    ck_assert_msg(acc >= 0.9, "%s", out);
    ck_assert_msg(epoch < 20, "it trained %g of 200 epochs: %s", epoch, out);
    ck_assert_msg(has_text(out, "\"state\":\"done\""), "%s", out);
}
END_TEST

/* Under systemd a job the daemon cannot open under /home is refused with the unit's setting
 * named (ProtectHome= hides it), not a bare "No such file" or "Permission denied". */
START_TEST(test_job_under_home_names_protecthome)
{
    const char *path = "/home/omnivore-test-nobody/job.ini";
    omv_job_t *job = NULL;
    char *text = NULL, err[OMV_CONFIG_ERR_MAX];
    unsetenv("INVOCATION_ID");
    ck_assert_int_lt(omv_jobs_parse(NULL, path, NULL, 0, &job, &text, err), 0);
    ck_assert_msg(has_text(err, "cannot open") && !has_text(err, "ProtectHome"), "%s", err);
    setenv("INVOCATION_ID", "0123456789abcdef", 1); /* as systemd sets it for a service */
    ck_assert_int_lt(omv_jobs_parse(NULL, path, NULL, 0, &job, &text, err), 0);
    unsetenv("INVOCATION_ID");
    ck_assert_msg(has_text(err, "/home/omnivore-test-nobody/job.ini: cannot open") &&
                      has_text(err, "(ProtectHome=yes)") && has_text(err, "/etc/omnivore/jobs"),
                  "%s", err);
}
END_TEST

/* --once (omnivorectl run): no submissions, and the workers exit with the job. */
START_TEST(test_once_refuses_submissions)
{
    write_job(1, 1, "");
    pid_t d = start_daemon();
    char out[4096], args[1200];
    snprintf(args, sizeof(args), "submit %s", job_path);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 1);
    ck_assert_msg(has_text(out, "runs one job only"), "%s", out);
    pid_t w = start_worker("trainer"), ev = start_worker("evaluator");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done(&body, 60000);
    expect_exit_0(w, "trainer");
    expect_exit_0(ev, "evaluator");
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("jobs");
    TCase *tc = tcase_create("queue");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_queue_runs_jobs_with_the_same_workers);
    tcase_add_test(tc, test_stop_checkpoints_and_resubmit_resumes);
    tcase_add_test(tc, test_restart_restores_the_queue);
    tcase_add_test(tc, test_once_refuses_submissions);
    tcase_add_test(tc, test_job_under_home_names_protecthome);
    tcase_add_test(tc, test_stop_at_accuracy);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
