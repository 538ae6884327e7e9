/* Helpers for the integration tests: a job on generated data in a temporary folder, and the
 * real omnivored, omnivore-worker and omnivorectl processes started and queried. */
#include "cluster_util.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "control.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

char test_dir[512];
const char *model_section = "layers = 64 32 4";
char job_path[600], sock_path[600], endpoint[600];

const char *bin(const char *env)
{
    const char *p = getenv(env);
    ck_assert_msg(p != NULL, "%s is not set (run through meson test)", env);
    return p;
}

/* A job on generated 8x8 images of 4 classes. extra is appended to the [cluster] section. */
void write_job(int workers, int epochs, const char *cluster_extra)
{
    char images[700], labels[700], timages[700], tlabels[700];
    snprintf(images, sizeof(images), "%s/train-images.gz", test_dir);
    snprintf(labels, sizeof(labels), "%s/train-labels.gz", test_dir);
    snprintf(timages, sizeof(timages), "%s/test-images", test_dir);
    snprintf(tlabels, sizeof(tlabels), "%s/test-labels", test_dir);
    ck_assert_int_eq(omv_test_make_blobs(images, labels, 4096, 8, 8, 4, 1, 1), 0);
    ck_assert_int_eq(omv_test_make_blobs(timages, tlabels, 512, 8, 8, 4, 2, 0), 0);
    snprintf(job_path, sizeof(job_path), "%s/job.ini", test_dir);
    FILE *f = fopen(job_path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "[job]\nname = blobs\nepochs = %d\nseed = 7\n"
            "[model]\n%s\n"
            "[data]\ntrain_images = train-images.gz\ntrain_labels = train-labels.gz\n"
            "test_images = test-images\ntest_labels = test-labels\n"
            "[train]\nbatch_size = 32\nlearning_rate = 0.05\nmomentum = 0.9\n"
            "[cluster]\nworkers = %d\nworker_timeout_s = 1.5\n%s\n"
            "[eval]\nevery_epochs = 1\nbatch_size = 128\nprogress_interval_s = 0.5\n",
            epochs, model_section, workers, cluster_extra);
    fclose(f);
    snprintf(sock_path, sizeof(sock_path), "%s/control.sock", test_dir);
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", test_dir);
}

void setup(void)
{
    omv_test_tmpdir(test_dir, sizeof(test_dir));
}

void teardown(void)
{
    if (getenv("OMV_TEST_KEEP")) /* =1: the test's folder stays, for its logs */
        fprintf(stderr, "kept %s\n", test_dir);
    else
        omv_test_rmdir(test_dir);
}

pid_t spawn(char *const argv[])
{
    return spawn_logged(argv, NULL);
}

pid_t spawn_logged(char *const argv[], const char *log)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0644) : -1;
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        /* OMV_TEST_VALGRIND=1 runs the daemon and the workers under valgrind (errors exit 99). */
        if (getenv("OMV_TEST_VALGRIND") && strcmp(getenv("OMV_TEST_VALGRIND"), "1") == 0) {
            char *vargv[64] = {"valgrind", "-q", "--error-exitcode=99", "--leak-check=full",
                               "--errors-for-leak-kinds=definite"};
            int n = 5;
            for (int i = 0; argv[i] && n < 63; i++)
                vargv[n++] = argv[i];
            vargv[n] = NULL;
            execvp("valgrind", vargv);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

pid_t start_daemon(void)
{
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--once",
                    "--job",
                    job_path,
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

pid_t start_daemon_argv(char *const argv[])
{
    return start_daemon_logged(argv, NULL);
}

pid_t start_daemon_logged(char *const argv[], const char *log)
{
    pid_t pid = spawn_logged(argv, log);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 20000;
    while (omv_control_request(sock_path, "status", &body, 1000) != 0) {
        ck_assert_msg(omv_time_ms() < deadline, "omnivored did not answer on its socket");
        ck_assert_int_eq(waitpid(pid, NULL, WNOHANG), 0);
        sleep_ms(10);
    }
    omv_strbuf_fini(&body);
    return pid;
}

pid_t start_worker(const char *role)
{
    return start_worker_slow(role, "0");
}

pid_t start_evaluator(void)
{
    pid_t pid = start_worker("evaluator");
    wait_status("evaluator_alive", 1, 30000);
    return pid;
}

pid_t start_worker_slow(const char *role, const char *delay_ms)
{
    char *argv[] = {(char *)bin("OMNIVORE_WORKER"),
                    "--server",
                    endpoint,
                    "--role",
                    (char *)role,
                    "--log-level",
                    "warn",
                    "--step-delay-ms",
                    (char *)delay_ms,
                    "--server-timeout",
                    "2",
                    "--name",
                    "test-worker",
                    NULL};
    return spawn(argv);
}

double status_field(const char *key)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int r = omv_control_request(sock_path, "status", &body, 5000);
    ck_assert_msg(r == 0, "status failed: %s", omv_strerror(r));
    double v = field(omv_strbuf_str(&body), key);
    omv_strbuf_fini(&body);
    return v;
}

double wait_status(const char *key, double at_least, int timeout_ms)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + timeout_ms;
    for (;;) {
        int r = omv_control_request(sock_path, "status", &body, 5000);
        ck_assert_msg(r == 0, "status failed: %s", omv_strerror(r));
        double v = field(omv_strbuf_str(&body), key);
        if (v >= at_least) {
            omv_strbuf_fini(&body);
            return v;
        }
        ck_assert_msg(omv_time_ms() < deadline, "%s did not reach %g within %d ms:\n%s", key,
                      at_least, timeout_ms, omv_strbuf_str(&body));
        sleep_ms(20);
    }
}

int text_field(const char *body, const char *key, char *out, size_t cap)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\n%s:", key);
    const char *p = strstr(body, pat);
    if (p == NULL && strncmp(body, pat + 1, strlen(pat + 1)) == 0)
        p = body - 1;
    if (p == NULL)
        return -1;
    p += strlen(pat);
    size_t n = strcspn(p, "\n");
    if (n >= cap)
        n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* Reads "key:value" from a status-style body as a number; NaN when absent. */
double field(const char *body, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\n%s:", key);
    const char *p = strstr(body, pat);
    if (p == NULL && strncmp(body, pat + 1, strlen(pat + 1)) == 0)
        p = body - 1;
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

int has_text(const char *body, const char *text)
{
    return strstr(body, text) != NULL;
}

double json_number(const char *json, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* Runs `omnivorectl run JOB --json extra...` and returns its last stdout line in out. */
int run_ctl(char *out, size_t cap, const char *extra)
{
    char cmd[2048];
    /* TMPDIR: the run folder (with its checkpoints) goes into the test's folder. */
    snprintf(cmd, sizeof(cmd), "TMPDIR=%s %s run %s --json %s 2>%s/run.log", test_dir,
             bin("OMNIVORECTL"), job_path, extra, test_dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char line[65536];
    out[0] = '\0';
    while (fgets(line, sizeof(line), p))
        omv_strlcpy(out, line, cap);
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int run_omnivorectl(char *out, size_t cap, const char *env, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s %s %s 2>&1", env ? env : "", bin("OMNIVORECTL"), args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int ctl_sock(char *out, size_t cap, const char *args)
{
    char a[1536];
    snprintf(a, sizeof(a), "--socket %s %s", sock_path, args);
    return run_omnivorectl(out, cap, NULL, a);
}

void stop_workers(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGTERM);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof(what), "worker %d of %d", i + 1, n);
        expect_exit_0(pids[i], what);
    }
}

void expect_exit_0(pid_t pid, const char *what)
{
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s ended with status %d", what,
                  status);
}

void control(const char *line, omv_strbuf_t *body)
{
    int r = omv_control_request(sock_path, line, body, 5000);
    ck_assert_msg(r == 0, "'%s' failed (%s): %s", line, omv_strerror(r), omv_strbuf_str(body));
}

void shutdown_daemon(pid_t d)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("shutdown", &body);
    omv_strbuf_fini(&body);
    expect_exit_0(d, "omnivored");
}

double wait_done(omv_strbuf_t *body, int timeout_ms)
{
    int64_t deadline = omv_time_ms() + timeout_ms;
    for (;;) {
        control("status", body);
        char state[32] = "";
        text_field(omv_strbuf_str(body), "state", state, sizeof(state));
        if (strcmp(state, "done") == 0)
            return field(omv_strbuf_str(body), "test_accuracy");
        ck_assert_msg(strcmp(state, "failed") != 0, "job failed: %s", omv_strbuf_str(body));
        ck_assert_msg(omv_time_ms() < deadline, "job did not finish within %d ms: %s", timeout_ms,
                      omv_strbuf_str(body));
        sleep_ms(50);
    }
}

/* A line of /proc/PID/status ("VmRSS", "VmHWM") in KiB. */
long proc_kib(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, k) == 0 && line[k] == ':')
            v = strtol(line + k + 1, NULL, 10);
    fclose(f);
    ck_assert_int_ge(v, 0);
    return v;
}

void use_mixed_model(void)
{
    char model[700];
    snprintf(model, sizeof(model), "%s/mixed.model", test_dir);
    FILE *f = fopen(model, "w");
    ck_assert_ptr_nonnull(f);
    fputs("input 1x8x8\nconv 8 3x3 pad 1\nbatchnorm\nrelu\nmaxpool 2\nflatten\nfc 16\nrelu\nfc 4\n",
          f);
    fclose(f);
    model_section = "definition = mixed.model";
}
