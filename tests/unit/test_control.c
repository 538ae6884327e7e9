/* The control socket: requests answered at once, and answers deferred until the daemon has
 * them (a checkpoint being written) without holding up anything else. Real sockets, with the
 * client in a child process. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

static char dir[512], path[600];
static omv_control_t *ctl;
static int deferred_id = -1;
static int handled; /* requests the handler has seen */

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
    handled++;
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

/* One turn of a daemon's loop for the control socket: waits up to timeout_ms for its sockets,
 * handles what came, and gives up clients past their time. */
static void pump(int timeout_ms)
{
    struct pollfd fds[OMV_CONTROL_POLL_MAX];
    int n = omv_control_pollfds(ctl, fds, OMV_CONTROL_POLL_MAX);
    ck_assert_int_ge(poll(fds, (nfds_t)n, timeout_ms), 0);
    omv_control_serve(ctl, fds, n, handler, NULL);
    omv_control_expire(ctl);
}

/* Serves until the handler has seen one more request (5 s at most), and a little more so that
 * an answer given at once is written. */
static void serve_one(void)
{
    int before = handled;
    int64_t deadline = omv_time_ms() + 5000;
    while (handled == before) {
        ck_assert_msg(omv_time_ms() < deadline, "no request came");
        pump(100);
    }
    pump(0);
}

/* A raw client connection, for clients that send little or nothing. */
static int raw_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Pumps the server until fd has something to read (or is closed), then reads it all into
 * out[cap]; fails after 10 s. */
static void raw_read(int fd, char *out, size_t cap)
{
    size_t len = 0;
    int64_t deadline = omv_time_ms() + 10000;
    for (;;) {
        ck_assert_msg(omv_time_ms() < deadline, "no answer: '%.*s'", (int)len, out);
        pump(20);
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 1)
            continue;
        ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    out[len] = '\0';
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

/* A client that sends half a line holds up nobody: another is answered meanwhile, and the first
 * is answered when its line is whole. */
START_TEST(test_slow_client_holds_up_nobody)
{
    int slow = raw_connect();
    ck_assert_int_eq(send(slow, "no", 2, 0), 2);
    pump(50);
    pid_t quick = client("now", 0, "answered now\n");
    serve_one();
    ck_assert_int_eq(exit_status(quick), 0);
    ck_assert_int_eq(send(slow, "w\n", 2, 0), 2);
    char out[256];
    raw_read(slow, out, sizeof(out));
    ck_assert_str_eq(out, "ok\nanswered now\n");
    close(slow);
}
END_TEST

/* Clients that connect and say nothing are bounded: one past the limit is told so, a request
 * still gets through once they are let go after their idle time, and each is told why. */
START_TEST(test_idle_clients_bounded)
{
    int idle[OMV_CONTROL_MAX_CONNS];
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++)
        idle[i] = raw_connect();
    pump(50);
    int extra = raw_connect();
    char out[256];
    raw_read(extra, out, sizeof(out));
    ck_assert_msg(strstr(out, "error: too many control connections") == out, "%s", out);
    close(extra);
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++) {
        raw_read(idle[i], out, sizeof(out));
        ck_assert_msg(strstr(out, "error: no request line within") == out, "%s", out);
        close(idle[i]);
    }
    uint64_t refused, timeouts;
    omv_control_counts(ctl, &refused, &timeouts);
    ck_assert_uint_eq(refused, 1);
    ck_assert_uint_eq(timeouts, OMV_CONTROL_MAX_CONNS);
    pid_t quick = client("now", 0, "answered now\n");
    serve_one();
    ck_assert_int_eq(exit_status(quick), 0);
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
    tcase_add_test(tc, test_slow_client_holds_up_nobody);
    tcase_add_test(tc, test_idle_clients_bounded);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
