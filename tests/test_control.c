/* The control socket: requests answered at once, and answers deferred until the daemon has
 * them (a checkpoint being written) without holding up anything else. Real sockets, with the
 * client in a child process. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control.h"
#include "strbuf.h"
#include "testutil.h"

static char dir[512], path[600];
static omv_control_t *ctl;
static int deferred_id = -1;

static void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/control.sock", dir);
    ctl = omv_control_new(path);
    ck_assert_ptr_nonnull(ctl);
    deferred_id = -1;
}

static void teardown(void)
{
    omv_control_destroy(&ctl);
    omv_test_rmdir(dir);
}

/* "now" is answered at once; "later" is deferred. */
static int handler(void *c, int argc, char **argv, omv_strbuf_t *reply)
{
    (void)c, (void)argc;
    if (strcmp(argv[0], "later") == 0) {
        deferred_id = omv_control_defer(ctl);
        if (deferred_id < 0) {
            omv_strbuf_printf(reply, "too many waiting");
            return deferred_id;
        }
        return OMV_CONTROL_DEFERRED;
    }
    omv_strbuf_printf(reply, "answered now\n");
    return 0;
}

/* A child that sends line and exits 0 when the reply is `want` (status r), else 1. */
static pid_t client(const char *line, int r_want, const char *want)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Not the parent's sockets: a deferred client's connection must close when the parent
         * closes it, not stay open in every child forked since. */
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        omv_strbuf_t body;
        omv_strbuf_init(&body);
        int r = omv_control_request(path, line, &body, 5000);
        int ok = r == r_want && strcmp(omv_strbuf_str(&body), want) == 0;
        if (!ok)
            fprintf(stderr, "client '%s': %d '%s'\n", line, r, omv_strbuf_str(&body));
        _exit(ok ? 0 : 1);
    }
    return pid;
}

/* Serves the next client that connects (waits up to 5 s for it). */
static void serve_one(void)
{
    struct pollfd p = {omv_control_fd(ctl), POLLIN, 0};
    ck_assert_int_eq(poll(&p, 1, 5000), 1);
    omv_control_serve(ctl, handler, NULL);
}

static int exit_status(pid_t pid)
{
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_deferred_answer)
{
    pid_t waiting = client("later", 0, "checkpoint written\n");
    serve_one();
    ck_assert_int_ge(deferred_id, 0);
    /* Others are served while it waits. */
    pid_t quick = client("now", 0, "answered now\n");
    serve_one();
    ck_assert_int_eq(exit_status(quick), 0);
    omv_control_answer(ctl, deferred_id, 0, "checkpoint written\n");
    ck_assert_int_eq(exit_status(waiting), 0);
    /* Answering twice, or an id that never waited, does nothing. */
    omv_control_answer(ctl, deferred_id, 0, "again");
    omv_control_answer(ctl, OMV_CONTROL_MAX_DEFERRED, 0, "out of range");
}
END_TEST

START_TEST(test_deferred_error_and_shutdown)
{
    pid_t failed = client("later", -EREMOTEIO, "checkpoint failed");
    serve_one();
    omv_control_answer(ctl, deferred_id, -EIO, "checkpoint failed");
    ck_assert_int_eq(exit_status(failed), 0);
    /* One still waiting when the daemon goes is told so. */
    pid_t left = client("later", -EREMOTEIO, "the daemon is shutting down");
    serve_one();
    omv_control_destroy(&ctl);
    ck_assert_int_eq(exit_status(left), 0);
}
END_TEST

START_TEST(test_deferred_bounded)
{
    /* No more than OMV_CONTROL_MAX_DEFERRED wait at once; the next is answered with an error. */
    pid_t pids[OMV_CONTROL_MAX_DEFERRED];
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++) {
        pids[i] = client("later", 0, "done\n");
        serve_one();
        ck_assert_int_eq(deferred_id, i);
    }
    pid_t refused = client("later", -EREMOTEIO, "too many waiting");
    serve_one();
    ck_assert_int_eq(exit_status(refused), 0);
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++) {
        omv_control_answer(ctl, i, 0, "done\n");
        ck_assert_int_eq(exit_status(pids[i]), 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("control");
    TCase *tc = tcase_create("defer");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_deferred_answer);
    tcase_add_test(tc, test_deferred_error_and_shutdown);
    tcase_add_test(tc, test_deferred_bounded);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
