/* Integration tests of the operator's tools with real processes: omnivorectl's groups, metrics
 * and watch commands against a training daemon, the errors that tell a person what to do, the
 * sd_notify messages omnivored sends systemd, and the training report. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"
#include "control.h"
#include "notify.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif

static int count_text(const char *s, const char *text)
{
    int n = 0;
    for (const char *p = strstr(s, text); p; p = strstr(p + 1, text))
        n++;
    return n;
}

/* Checks Prometheus text format 0.0.4: every line is a HELP or TYPE comment or a sample
 * `name{labels} value`; a sample's family has its HELP and TYPE before it; counters end in
 * _total. Returns the number of samples. */
static int check_exposition(const char *text)
{
    regex_t sample, label, help, type;
    ck_assert_int_eq(
        regcomp(&sample, "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{([^}]*)\\})? ([^ ]+)$", REG_EXTENDED), 0);
    ck_assert_int_eq(
        regcomp(&label, "^[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\"$", REG_EXTENDED), 0);
    ck_assert_int_eq(regcomp(&help, "^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$", REG_EXTENDED), 0);
    ck_assert_int_eq(
        regcomp(&type, "^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)$", REG_EXTENDED), 0);
    char helped[128] = "", typed[128] = "", kind[16] = "";
    int samples = 0;
    char *copy = strdup(text), *save = NULL;
    ck_assert_msg(text[0] && text[strlen(text) - 1] == '\n', "no final newline");
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        regmatch_t m[5];
        if (regexec(&help, line, 2, m, 0) == 0) {
            snprintf(helped, sizeof(helped), "%.*s", (int)(m[1].rm_eo - m[1].rm_so),
                     line + m[1].rm_so);
            typed[0] = '\0';
            continue;
        }
        if (regexec(&type, line, 3, m, 0) == 0) {
            snprintf(typed, sizeof(typed), "%.*s", (int)(m[1].rm_eo - m[1].rm_so),
                     line + m[1].rm_so);
            snprintf(kind, sizeof(kind), "%.*s", (int)(m[2].rm_eo - m[2].rm_so), line + m[2].rm_so);
            ck_assert_msg(strcmp(typed, helped) == 0, "TYPE without its HELP: %s", line);
            ck_assert_msg(strncmp(typed, "omnivore_", 9) == 0, "not omnivore_*: %s", line);
            size_t n = strlen(typed);
            int total = n > 6 && strcmp(typed + n - 6, "_total") == 0;
            ck_assert_msg(strcmp(kind, "counter") != 0 || total, "counter not _total: %s", line);
            continue;
        }
        ck_assert_msg(line[0] != '#', "a comment that is not HELP or TYPE: %s", line);
        ck_assert_msg(regexec(&sample, line, 5, m, 0) == 0, "not `name{labels} value`: %s", line);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
        ck_assert_msg(typed[0] && strcmp(name, typed) == 0, "sample before its HELP/TYPE: %s",
                      line);
        if (m[3].rm_so >= 0) {
            /* Label pairs, split at commas outside quotes. */
            char labels[512];
            snprintf(labels, sizeof(labels), "%.*s", (int)(m[3].rm_eo - m[3].rm_so),
                     line + m[3].rm_so);
            char *p = labels;
            while (*p) {
                char *q = p;
                int quoted = 0;
                for (; *q && (quoted || *q != ','); q++) {
                    if (*q == '\\' && q[1])
                        q++;
                    else if (*q == '"')
                        quoted = !quoted;
                }
                char end = *q;
                *q = '\0';
                ck_assert_msg(regexec(&label, p, 0, NULL, 0) == 0, "bad label '%s' in: %s", p,
                              line);
                p = end ? q + 1 : q;
            }
        }
        const char *v = line + m[4].rm_so;
        char *endp;
        double value = strtod(v, &endp);
        ck_assert_msg(endp == line + m[4].rm_eo, "value is not a number: %s", line);
        ck_assert_msg(!isnan(value) || strcmp(v, "NaN") == 0, "NaN spelled '%s'", v);
        samples++;
    }
    free(copy);
    regfree(&sample);
    regfree(&label);
    regfree(&help);
    regfree(&type);
    return samples;
}

/* The value of a sample line that starts with `prefix ` (name and labels); NaN when absent. */
static double sample(const char *text, const char *prefix)
{
    char pat[256];
    snprintf(pat, sizeof(pat), "\n%s ", prefix);
    const char *p = strstr(text, pat);
    return p ? strtod(p + strlen(pat), NULL) : NAN;
}

static void stop_all(pid_t d, pid_t *w, int n)
{
    /* The daemon first (the job is not over: it checkpoints and tells the workers to wait for
     * it), then the waiting workers, which a signal ends. */
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    ck_assert_int_eq(omv_control_request(sock_path, "shutdown", &body, 5000), 0);
    omv_strbuf_fini(&body);
    int status;
    ck_assert_int_eq(waitpid(d, &status, 0), d);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "omnivored: status %d", status);
    for (int i = 0; i < n; i++) {
        kill(w[i], SIGTERM);
        waitpid(w[i], NULL, 0);
    }
}

START_TEST(test_groups_metrics_watch)
{
    /* Two groups of one worker each, slow enough (3 ms a step) to be watched while they run. */
    write_job(2, 200, "groups = 2\nstaleness = 2");
    pid_t d = start_daemon();
    pid_t w[2] = {start_worker_slow("trainer", "3"), start_worker_slow("trainer", "3")};
    wait_status("step", 5, 30000);
    static char out[65536];

    /* groups: each group's clock, its one live member and that member's id. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "groups"), 0);
    ck_assert_msg(has_text(out, "# group 0\nid:0\nclock:") && has_text(out, "# group 1\nid:1\n"),
                  "%s", out);
    ck_assert_msg(count_text(out, "live_members:1\n") == 2, "%s", out);
    ck_assert_msg((has_text(out, "workers:1\n") && has_text(out, "workers:2\n")), "%s", out);
    ck_assert_msg(field(out, "clock") >= 5, "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "groups --json"), 0);
    ck_assert_msg(has_text(out, "{\"group 0\":{\"id\":0,\"clock\":") &&
                      has_text(out, "\"live_members\":1,\"workers\":["),
                  "%s", out);

    /* metrics: the exposition format, and the values status gives. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "metrics"), 0);
    ck_assert_int_ge(check_exposition(out), 30);
    ck_assert_msg(strncmp(out, "# HELP omnivore_", 16) == 0, "%.200s", out);
    ck_assert_int_eq(sample(out, "omnivore_job_state{state=\"running\"}"), 1);
    ck_assert_int_eq(sample(out, "omnivore_job_state{state=\"done\"}"), 0);
    ck_assert_int_eq(sample(out, "omnivore_workers_alive"), 2);
    ck_assert_int_eq(sample(out, "omnivore_worker_joins_total"), 2);
    ck_assert_int_eq(sample(out, "omnivore_gradients_refused_total{reason=\"step\"}"), 0);
    ck_assert_int_eq(sample(out, "omnivore_staleness_bound_steps"), 2);
    ck_assert(sample(out, "omnivore_staleness_max_observed_steps") <= 2);
    ck_assert(sample(out, "omnivore_images_total") >= 5 * 32);
    ck_assert(sample(out, "omnivore_group_clock_steps{group=\"0\"}") >= 5);
    ck_assert(sample(out, "omnivore_group_clock_steps{group=\"1\"}") >= 5);
    ck_assert(isfinite(sample(out, "omnivore_train_loss")));
    ck_assert(has_text(out, "\nomnivore_info{version=\""));
    ck_assert(has_text(out, "job_name=\"blobs\"} 1\n"));
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "metrics --json"), 1);
    ck_assert_msg(has_text(out, "drop --json"), "%s", out);

    /* watch, not on a terminal: the reply repeated, with no escape codes. */
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "watch --interval 0.1 --count 3"), 0);
    ck_assert_msg(count_text(out, "# watch\ncommand:status\n") == 3, "%s", out);
    ck_assert_msg(count_text(out, "# job\n") == 3 && !has_text(out, "\033["), "%s", out);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "watch -i 0.1 -n 2 groups"), 0);
    ck_assert_msg(count_text(out, "# group 1\n") == 2, "%s", out);
    /* On a terminal (script(1) gives it one), each refresh clears the screen first. */
    if (system("command -v script >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "script -qec '%s --socket %s watch -i 0.1 -n 2' /dev/null",
                 bin("OMNIVORECTL"), sock_path);
        FILE *p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        ck_assert_int_eq(pclose(p), 0);
        ck_assert_msg(count_text(out, "\033[H\033[2J# watch\r\ncommand:status") == 2, "%s", out);
        ck_assert_msg(has_text(out, "Ctrl-C to quit"), "%s", out);
    } else {
        printf("test_groups_metrics_watch: no script(1): watch on a terminal not checked\n");
    }
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "watch --interval 0"), 2);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "watch checkpoint"), 2);

    /* watch until Ctrl-C: SIGINT ends it at once, with status 0. */
    char log[700];
    snprintf(log, sizeof(log), "%s/watch.out", test_dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        execl(bin("OMNIVORECTL"), "omnivorectl", "--socket", sock_path, "watch", "--interval", "60",
              (char *)NULL);
        _exit(127);
    }
    int64_t deadline = omv_time_ms() + 10000;
    for (;;) {
        FILE *f = fopen(log, "r");
        size_t n = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
        out[n] = '\0';
        if (f)
            fclose(f);
        if (has_text(out, "# refusals\n"))
            break;
        ck_assert_msg(omv_time_ms() < deadline, "watch printed nothing: %s", out);
        sleep_ms(20);
    }
    int64_t t0 = omv_time_ms();
    kill(pid, SIGINT);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "watch: status %d", status);
    ck_assert_int_lt(omv_time_ms() - t0, 2000);

    /* The socket from the environment, as the unit's users set it. */
    char env[700];
    snprintf(env, sizeof(env), "OMNIVORE_SOCKET=%s", sock_path);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), env, "status"), 0);
    ck_assert_msg(has_text(out, "state:running"), "%s", out);

    stop_all(d, w, 2);
}
END_TEST

START_TEST(test_errors_say_what_to_do)
{
    static char out[8192];
    char args[1024];
    /* No daemon: the socket is not there. */
    snprintf(args, sizeof(args), "--socket %s/none.sock status", test_dir);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, args), 3);
    char want[1024];
    snprintf(want, sizeof(want),
             "omnivorectl: is omnivored running? socket %s/none.sock not found (set --socket or "
             "$OMNIVORE_SOCKET)\n",
             test_dir);
    ck_assert_str_eq(out, want);
    snprintf(args, sizeof(args), "--socket %s/none.sock watch", test_dir);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, args), 3);
    ck_assert_str_eq(out, want);
    char env[700];
    snprintf(env, sizeof(env), "OMNIVORE_SOCKET=%s/none.sock", test_dir);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), env, "metrics"), 3);
    ck_assert_str_eq(out, want);

    /* A socket file nobody listens on: the daemon died. */
    char dead[700];
    snprintf(dead, sizeof(dead), "%s/dead.sock", test_dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    omv_strlcpy(addr.sun_path, dead, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    close(fd);
    snprintf(args, sizeof(args), "--socket %s groups", dead);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, args), 3);
    ck_assert_msg(has_text(out, "nothing answers on") && has_text(out, "journalctl -u omnivored"),
                  "%s", out);

    /* A socket we may not write to: the message names the group to join. As root (which
     * permissions do not stop) the client runs as nobody. */
    chmod(dead, 0600);
    snprintf(args, sizeof(args), "--socket %s groups", dead);
    if (geteuid() == 0) {
        chmod(test_dir, 0755);
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "setpriv --reuid=65534 --regid=65534 --clear-groups %s",
                 bin("OMNIVORECTL"));
        char full[2048];
        snprintf(full, sizeof(full), "%s %s 2>&1", cmd, args);
        FILE *p = popen(full, "r");
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        int status = pclose(p);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 3, "status %d: %s", status, out);
    } else {
        chmod(dead, 0);
        ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, args), 3);
    }
    ck_assert_msg(has_text(out, "permission denied on") && has_text(out, "join the group '"), "%s",
                  out);

    /* Usage errors are 2, and --help names every command. */
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, "frobnicate"), 2);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, "--help"), 0);
    const char *cmds[] = {"status",     "workers",  "groups", "metrics", "watch",   "summary",
                          "checkpoint", "shutdown", "run",    "help",    "history", "report",
                          "jobs",       "submit",   "stop",   "reload"};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(cmds); i++) {
        char line[64];
        snprintf(line, sizeof(line), "\n  %s ", cmds[i]);
        ck_assert_msg(has_text(out, line), "--help does not list %s:\n%s", cmds[i], out);
    }
}
END_TEST

/* Runs `sh -c cmd` with stderr into out[cap] (stdout too); returns its exit status. */
static int run_sh(const char *cmd, char *out, size_t cap)
{
    char full[4096];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    ck_assert_ptr_nonnull(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* What a person deploying trips over, said in the journal where they look: a config mistake
 * that stops omnivored (exit 2, not restarted) is logged at err priority, so that
 * `journalctl -p err` shows it; a worker whose server name does not resolve exits 2 (not
 * restarted every 35 s) saying so, rather than asking whether omnivored is running. */
START_TEST(test_fatal_errors_reach_the_journal)
{
    char conf[700], cmd[2048], out[4096];
    snprintf(conf, sizeof(conf), "%s/omnivored.conf", test_dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[daemon]\nlog_levle = debug\n");
    fclose(f);
    /* JOURNAL_STREAM is how a program learns that its stderr goes to the journal. */
    snprintf(cmd, sizeof(cmd), "JOURNAL_STREAM=8:1 %s --config %s", bin("OMNIVORED"), conf);
    ck_assert_int_eq(run_sh(cmd, out, sizeof(out)), 2);
    ck_assert_msg(strncmp(out, "<3>omnivored: ", 14) == 0 && has_text(out, "log_levle"), "%s", out);
    /* On a terminal: the same words, without the priority. */
    snprintf(cmd, sizeof(cmd), "env -u JOURNAL_STREAM %s --config %s", bin("OMNIVORED"), conf);
    ck_assert_int_eq(run_sh(cmd, out, sizeof(out)), 2);
    ck_assert_msg(strncmp(out, "omnivored: ", 11) == 0 && has_text(out, "log_levle"), "%s", out);

    const char *host = "omnivore-test-head.invalid";
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int e = getaddrinfo(host, NULL, &hints, &res);
    if (e == 0)
        freeaddrinfo(res);
    if (e != EAI_NONAME && e != EAI_FAIL) {
        printf("test_fatal_errors: the resolver does not say '%s' is unknown (%s): the worker's "
               "part is skipped\n",
               host, gai_strerror(e));
        return;
    }
    snprintf(cmd, sizeof(cmd), "JOURNAL_STREAM=8:1 %s --server tcp://%s:5555 --hello-timeout 30",
             bin("OMNIVORE_WORKER"), host);
    ck_assert_int_eq(run_sh(cmd, out, sizeof(out)), 2);
    char want[256];
    snprintf(want, sizeof(want), "<3>omnivore-worker: cannot resolve '%s'", host);
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0 && has_text(out, "OMNIVORE_SERVER") &&
                      !has_text(out, "is omnivored running"),
                  "%s", out);
}
END_TEST

/* Reads a whole file into out[cap]; returns its length or -1. */
static long read_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    return (long)n;
}

/* Checks a report's CSV: a header, training rows in strictly increasing time (at least
 * min_train), evaluations; returns the last evaluation's accuracy. */
static double check_report_csv(const char *csv, int min_train)
{
    const char *header = "kind,wall_s,epoch,step,images,train_loss,images_per_s,test_loss,"
                         "test_accuracy,groups,momentum,learning_rate,probing,cause\n";
    ck_assert_msg(strncmp(csv, header, strlen(header)) == 0, "%.200s", csv);
    int train = 0, evals = 0;
    double last_wall = -1, acc = NAN;
    char *copy = strdup(csv), *save = NULL;
    strtok_r(copy, "\n", &save);
    for (char *line = strtok_r(NULL, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        /* Fields by position; empty ones are kept. */
        char *f[16];
        int n = 0;
        for (char *p = line; n < 16; p++) {
            f[n++] = p;
            p = strchr(p, ',');
            if (p == NULL)
                break;
            *p = '\0';
        }
        ck_assert_int_eq(n, 14);
        if (strcmp(f[0], "train") == 0) {
            double wall = strtod(f[1], NULL);
            ck_assert_msg(wall > last_wall, "training rows out of order at %s", f[1]);
            last_wall = wall;
            ck_assert_msg(f[5][0] != '\0' && isfinite(strtod(f[5], NULL)), "no loss at %s", f[1]);
            ck_assert_msg(strtod(f[9], NULL) >= 1, "no groups at %s", f[1]);
            train++;
        } else if (strcmp(f[0], "eval") == 0) {
            acc = strtod(f[8], NULL);
            evals++;
        } else {
            ck_assert_msg(strcmp(f[0], "config") == 0, "row kind '%s'", f[0]);
        }
    }
    free(copy);
    ck_assert_msg(train >= min_train, "%d training rows:\n%s", train, csv);
    ck_assert_msg(evals >= 1, "no evaluation rows:\n%s", csv);
    return acc;
}

START_TEST(test_report)
{
    /* A short job, slow enough (4 ms a step) to give the timeline a few points. */
    write_job(1, 4, "");
    pid_t d = start_daemon();
    pid_t w[2] = {start_worker_slow("trainer", "4"), start_worker("evaluator")};
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done(&body, 60000);
    control("history", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "# train\ntrain_1:wall_seconds=") &&
                      has_text(omv_strbuf_str(&body), "\nchange_1:") &&
                      has_text(omv_strbuf_str(&body), "cause=start"),
                  "%s", omv_strbuf_str(&body));

    static char out[65536], text[1 << 20];
    char args[1024], csv[800], svg[800];
    snprintf(args, sizeof(args), "report --out %s/rep", test_dir);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 0);
    snprintf(csv, sizeof(csv), "%s/rep/omnivore-report-blobs.csv", test_dir);
    snprintf(svg, sizeof(svg), "%s/rep/omnivore-report-blobs.svg", test_dir);
    char want[2000];
    snprintf(want, sizeof(want), "%s\n%s\n", csv, svg);
    ck_assert_str_eq(out, want);
    ck_assert_int_gt(read_file(csv, text, sizeof(text)), 0);
    /* The last evaluation is the daemon's test accuracy (status gives 4 decimals). */
    double last = check_report_csv(text, 2);
    ck_assert_msg(fabs(last - acc) < 6e-5, "report's last accuracy %g, daemon's %g", last, acc);
    ck_assert_int_gt(read_file(svg, text, sizeof(text)), 0);
    ck_assert_msg(strncmp(text, "<svg ", 5) == 0 && has_text(text, "</svg>\n"), "%.100s", text);
    ck_assert(has_text(text, "<polyline id=\"series-train_loss\""));
    ck_assert(has_text(text, "<polyline id=\"series-test_accuracy\""));
    ck_assert(has_text(text, "omnivore training report: blobs - final test accuracy "));
    ck_assert(!has_text(text, "no data yet"));

    /* Another name, JSON for programs; a name with a folder in it is a usage error. */
    snprintf(args, sizeof(args), "report -o %s/rep -N again --json", test_dir);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), args), 0);
    snprintf(want, sizeof(want), "{\"csv\":\"%s/rep/again.csv\",\"svg\":\"%s/rep/again.svg\"}\n",
             test_dir, test_dir);
    ck_assert_str_eq(out, want);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "report --name a/b"), 2);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "report extra"), 2);
    omv_strbuf_fini(&body);
    for (int i = 0; i < 2; i++)
        expect_exit_0(w[i], "worker");
    shutdown_daemon(d);

    /* run --report: the files are there when run returns, and agree with its summary. */
    write_job(2, 2, "");
    snprintf(args, sizeof(args), "--report %s/run-report", test_dir);
    ck_assert_int_eq(run_ctl(out, sizeof(out), args), 0);
    double run_acc = json_number(out, "test_accuracy");
    ck_assert_msg(isfinite(run_acc), "%s", out);
    snprintf(csv, sizeof(csv), "%s/run-report/omnivore-report-blobs.csv", test_dir);
    snprintf(svg, sizeof(svg), "%s/run-report/omnivore-report-blobs.svg", test_dir);
    ck_assert_int_gt(read_file(csv, text, sizeof(text)), 0);
    last = check_report_csv(text, 1);
    ck_assert_msg(fabs(last - run_acc) < 6e-5, "report's last accuracy %g, run's %g", last,
                  run_acc);
    ck_assert_int_gt(read_file(svg, text, sizeof(text)), 1000);
}
END_TEST

/* Reads datagrams from a notify socket until one contains want (or timeout_ms). */
static int wait_notify(int fd, const char *want, char *got, size_t cap, int timeout_ms)
{
    int64_t deadline = omv_time_ms() + timeout_ms;
    while (omv_time_ms() < deadline) {
        ssize_t n = recv(fd, got, cap - 1, MSG_DONTWAIT);
        if (n > 0) {
            got[n] = '\0';
            if (strstr(got, want))
                return 0;
            continue;
        }
        sleep_ms(10);
    }
    return -1;
}

START_TEST(test_sd_notify)
{
    if (!omv_notify_enabled()) {
        printf("test_sd_notify: skipped: built without libsystemd (-Dsystemd=disabled)\n");
        return;
    }
    /* Stand in for systemd: a datagram socket in $NOTIFY_SOCKET. */
    write_job(1, 200, "");
    char path[700];
    snprintf(path, sizeof(path), "%s/notify.sock", test_dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    omv_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    setenv("WATCHDOG_USEC", "400000", 1); /* WatchdogSec=0.4 */
    pid_t d = start_daemon();
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    char got[1024];
    ck_assert_msg(wait_notify(fd, "READY=1", got, sizeof(got), 5000) == 0, "no READY=1");
    ck_assert_msg(has_text(got, "STATUS=waiting: job blobs, 1 workers on ipc://"), "%s", got);
    /* The loop keeps the watchdog fed while it waits for workers: every 0.2 s, not more. */
    int fed = 0;
    for (int64_t end = omv_time_ms() + 1200; omv_time_ms() < end;) {
        ssize_t n = recv(fd, got, sizeof(got) - 1, MSG_DONTWAIT);
        if (n <= 0) {
            sleep_ms(10);
            continue;
        }
        got[n] = '\0';
        fed += has_text(got, "WATCHDOG=1");
    }
    ck_assert_msg(fed >= 2 && fed <= 12, "%d WATCHDOG=1 in 1.2 s with WatchdogSec=0.4", fed);
    /* A one-line progress once the job runs (the STATUS= line systemctl status shows). */
    pid_t w = start_worker_slow("trainer", "2");
    wait_status("step", 5, 30000);
    ck_assert_msg(wait_notify(fd, "STATUS=running: epoch ", got, sizeof(got), 5000) == 0,
                  "no running STATUS=");
    ck_assert_msg(has_text(got, " images/s, 1/1 workers"), "%s", got);
    stop_all(d, &w, 1);
    ck_assert_msg(wait_notify(fd, "STOPPING=1", got, sizeof(got), 5000) == 0, "no STOPPING=1");
    close(fd);
}
END_TEST

/* Once a job is done its workers stay registered, idle for the next one: systemctl status says
 * so, not "0/1 workers". */
START_TEST(test_sd_notify_done_says_idle)
{
    if (!omv_notify_enabled())
        return;
    write_job(1, 1, "");
    char path[700];
    snprintf(path, sizeof(path), "%s/notify.sock", test_dir);
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    omv_strlcpy(addr.sun_path, path, sizeof(addr.sun_path));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    char *argv[] = {(char *)bin("OMNIVORED"),
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
    pid_t d = start_daemon_argv(argv);
    unsetenv("NOTIFY_SOCKET");
    pid_t w[2] = {start_worker("trainer"), start_worker("evaluator")};
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done(&body, 60000);
    wait_status("workers_waiting", 2, 20000);
    char got[1024];
    ck_assert_msg(wait_notify(fd, ", 2 workers idle", got, sizeof(got), 10000) == 0, "%s", got);
    ck_assert_msg(has_text(got, "STATUS=done: epoch 1.00/1, step "), "%s", got);
    shutdown_daemon(d);
    stop_workers(w, 2);
    close(fd);
    omv_strbuf_fini(&body);
}
END_TEST

START_TEST(test_memory_deny_write_execute)
{
    /* The units set MemoryDenyWriteExecute=yes: no mapping may be writable and executable, none
     * may become executable. The kernel's PR_SET_MDWE enforces the same and is kept by the
     * children and across exec, so a daemon, a trainer and an evaluator train under it here. */
    if (getenv("CK_FORK") && strcmp(getenv("CK_FORK"), "no") == 0) {
        printf("test_memory_deny_write_execute: skipped: without fork it would bind valgrind\n");
        return;
    }
    if (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0) {
        printf("test_memory_deny_write_execute: skipped: the kernel has no PR_SET_MDWE (%s; "
               "Linux 6.3 or later)\n",
               strerror(errno));
        return;
    }
    write_job(1, 2, "");
    pid_t d = start_daemon();
    /* The evaluator first: the trainer starts the job, which may end within milliseconds. */
    pid_t w[2] = {0, start_worker("evaluator")};
    wait_status("evaluator_alive", 1, 20000);
    w[0] = start_worker("trainer");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 60000;
    for (;;) {
        ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 5000), 0);
        char state[32] = "";
        text_field(omv_strbuf_str(&body), "state", state, sizeof(state));
        if (strcmp(state, "done") == 0)
            break;
        ck_assert_msg(strcmp(state, "failed") != 0, "%s", omv_strbuf_str(&body));
        ck_assert_msg(omv_time_ms() < deadline, "not done: %s", omv_strbuf_str(&body));
        sleep_ms(50);
    }
    ck_assert_msg(field(omv_strbuf_str(&body), "test_accuracy") > 0.9, "%s", omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    for (int i = 0; i < 2; i++) {
        int status;
        ck_assert_int_eq(waitpid(w[i], &status, 0), w[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker: status %d", status);
    }
    stop_all(d, NULL, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_groups_metrics_watch);
    tcase_add_test(tc, test_errors_say_what_to_do);
    tcase_add_test(tc, test_fatal_errors_reach_the_journal);
    tcase_add_test(tc, test_sd_notify);
    tcase_add_test(tc, test_sd_notify_done_says_idle);
    tcase_add_test(tc, test_memory_deny_write_execute);
    tcase_add_test(tc, test_report);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
