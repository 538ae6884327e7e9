/* omnivorectl: talks to omnivored over its control socket; `run` starts a whole one-machine
 * cluster (a daemon, trainers and an evaluator) for a job and reports its result; `report`
 * writes a job's training report (report.c). */
#define OMV_LOG_TAG "omnivorectl"
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "control.h"
#include "job.h"
#include "log.h"
#include "report.h"
#include "strbuf.h"
#include "util.h"

#define DEFAULT_SOCKET "/run/omnivore/control.sock"
#define MAX_CHILDREN 1100
#define MAX_SETS 32

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: omnivorectl [--socket PATH] COMMAND [--json]\n"
            "       omnivorectl [--socket PATH] watch [--interval S] [--count N] [COMMAND]\n"
            "       omnivorectl [--socket PATH] report [--out DIR] [--name BASE] [--json]\n"
            "       omnivorectl [--socket PATH] submit JOB.ini [--workers N] [--set S.K=V]...\n"
            "       omnivorectl run JOB.ini [--workers N] [--threads T] [--set S.K=V]...\n"
            "                   [--report DIR] [--json]\n\n"
            "Commands for a running omnivored:\n"
            "  status      daemon, job progress, cluster and refusal counters\n"
            "  workers     every registered worker\n"
            "  groups      every compute group: clock, live members and their worker ids\n"
            "  metrics     every counter and gauge in Prometheus text format (no --json)\n"
            "  watch       repeat status (or COMMAND) every S seconds (default 2), in place on a\n"
            "              terminal; until Ctrl-C, or N times with --count\n"
            "  summary     the job's result and evaluation history\n"
            "  history     the training timeline: loss and images/s about every second, every\n"
            "              evaluation, each change of groups, momentum or learning rate, phases\n"
            "  report      write the training report: BASE.csv (every point) and BASE.svg (loss,\n"
            "              test accuracy, groups/momentum/learning rate over time, probes shaded)\n"
            "              into DIR (default: here; BASE default: omnivore-report-JOB)\n"
            "  checkpoint  write a checkpoint now and print its path\n"
            "  optimizer   the optimizer's state, the configuration of each phase, its decisions\n"
            "  regroup G   use G compute groups from the next step boundary (1 to the workers)\n"
            "  jobs        the current job, the queue, and how the last jobs ended\n"
            "  submit JOB  queue a job file (run now if nothing runs); the daemon reads the file,\n"
            "              so it must be readable by the daemon's user; --workers and --set as\n"
            "              for run. A job that has checkpoints resumes from the newest\n"
            "  stop [ID|NAME]  stop the current job (after a checkpoint: submitting it again\n"
            "              resumes it) or drop a queued one; the next queued job starts\n"
            "  shutdown    stop the daemon: it checkpoints a running job first, and its workers\n"
            "              wait for it to come back (with --retry, in omnivore-worker)\n"
            "  help        this text\n\n"
            "  run JOB     start omnivored, N trainers and an evaluator on this machine, train the\n"
            "              job, print its summary and stop them all (default N: the job's workers)\n"
            "              --report DIR: write the training report there before they stop\n\n"
            "Options:\n"
            "  -s, --socket PATH   control socket (default $OMNIVORE_SOCKET or " DEFAULT_SOCKET ")\n"
            "  -j, --json          JSON for programs (run: the summary as the last line)\n"
            "  -i, --interval S    watch: seconds between refreshes (default 2)\n"
            "  -n, --count N       watch: stop after N refreshes\n"
            "  -w, --workers N     run: trainer processes\n"
            "  -t, --threads T     run: threads per worker (default 1)\n"
            "      --set S.K=V     run: override a job key, e.g. --set train.learning_rate=0.05\n"
            "  -o, --out DIR       report: folder for the files (made when missing)\n"
            "  -N, --name BASE     report: file name without .csv / .svg\n"
            "      --report DIR    run: write the training report into DIR at the end\n"
            "  -h, --help          this text\n\n"
            "Exit status: 0 ok, 1 the daemon answered with an error or the job failed,\n"
            "2 bad usage, 3 the daemon cannot be reached (no socket, no permission, no answer).\n");
}

/* Says why the daemon at sock cannot be reached, and what to do about it. */
static void explain_unreachable(const char *sock, int r)
{
    if (r == -ENOENT || r == -ENOTDIR) {
        fprintf(stderr, "omnivorectl: is omnivored running? socket %s not found (set --socket or "
                        "$OMNIVORE_SOCKET)\n", sock);
    } else if (r == -EACCES || r == -EPERM) {
        /* The socket is 0660 in a 0750 folder: its group (or the folder's, when the folder
         * itself is what we may not enter) grants access. */
        struct stat st;
        char dir[PATH_MAX];
        omv_strlcpy(dir, sock, sizeof(dir));
        int have = stat(sock, &st) == 0 || stat(dirname(dir), &st) == 0;
        struct group *g = have ? getgrgid(st.st_gid) : NULL;
        if (g)
            fprintf(stderr, "omnivorectl: permission denied on %s: join the group '%s' (sudo "
                            "usermod -aG %s $USER, then log in again) or run as root\n", sock,
                    g->gr_name, g->gr_name);
        else
            fprintf(stderr, "omnivorectl: permission denied on %s: join the group that owns it "
                            "(usually 'omnivore') or run as root\n", sock);
    } else if (r == -ECONNREFUSED) {
        fprintf(stderr, "omnivorectl: nothing answers on %s: omnivored has stopped or died "
                        "(journalctl -u omnivored; systemctl start omnivored)\n", sock);
    } else if (r == -ETIMEDOUT) {
        fprintf(stderr, "omnivorectl: omnivored at %s did not answer in time; it may be "
                        "overloaded or stuck (journalctl -u omnivored)\n", sock);
    } else {
        fprintf(stderr, "omnivorectl: cannot reach omnivored at %s: %s (is omnivored running? "
                        "set --socket or $OMNIVORE_SOCKET)\n", sock, omv_strerror(r));
    }
}

static int request(const char *sock, const char *line, omv_strbuf_t *body)
{
    int r = omv_control_request(sock, line, body, 10000);
    if (r == -EREMOTEIO) {
        fprintf(stderr, "omnivorectl: %s\n", omv_strbuf_str(body));
        return 1;
    }
    if (r < 0) {
        explain_unreachable(sock, r);
        return 3;
    }
    return 0;
}

/* ---- submit: a job for a running daemon ---- */

static int cmd_submit(const char *sock, int argc, char **argv, int json)
{
    const char *workers_arg = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    static const struct option opts[] = {
        {"workers", required_argument, NULL, 'w'},
        {"set", required_argument, NULL, 'S'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "w:j", opts, NULL)) != -1) {
        if (c == 'w') {
            workers_arg = optarg;
        } else if (c == 'S' && n_sets < MAX_SETS) {
            sets[n_sets++] = optarg;
        } else if (c == 'j') {
            json = 1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "omnivorectl submit: give exactly one job file\n");
        return 2;
    }
    /* The daemon reads the file itself: give it a path that does not depend on our folder. */
    char path[PATH_MAX];
    if (realpath(argv[optind], path) == NULL) {
        fprintf(stderr, "omnivorectl: %s: %s\n", argv[optind], strerror(errno));
        return 2;
    }
    omv_strbuf_t line, body;
    omv_strbuf_init(&line);
    omv_strbuf_init(&body);
    int rc = 2;
    if (strpbrk(path, " \t\r\n")) {
        fprintf(stderr, "omnivorectl: %s: the control protocol cannot carry a path with spaces; "
                        "move or link the job file\n", path);
        goto out;
    }
    omv_strbuf_printf(&line, "submit %s", path);
    if (workers_arg)
        omv_strbuf_printf(&line, " cluster.workers=%s", workers_arg);
    for (int i = 0; i < n_sets; i++) {
        if (strpbrk(sets[i], " \t\r\n") || strchr(sets[i], '=') == NULL) {
            fprintf(stderr, "omnivorectl: --set '%s': give SECTION.KEY=VALUE without spaces\n",
                    sets[i]);
            goto out;
        }
        omv_strbuf_printf(&line, " %s", sets[i]);
    }
    if (json)
        omv_strbuf_printf(&line, " --json");
    rc = request(sock, omv_strbuf_str(&line), &body);
    if (rc == 0)
        fputs(omv_strbuf_str(&body), stdout);
out:
    omv_strbuf_fini(&line);
    omv_strbuf_fini(&body);
    return rc;
}

/* ---- report: the training report's files ---- */

/* Fetches the daemon's history and writes DIR/BASE.csv and DIR/BASE.svg (base NULL: the
 * default for the job). The paths go to stdout (JSON with json), or to stderr when quiet.
 * Returns an exit status. */
static int write_report(const char *sock, const char *dir, const char *base, int json, int quiet)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    omv_report_t rep;
    omv_report_init(&rep);
    /* A long job's history is a few hundred kilobytes: more time than a status needs. */
    int r = omv_control_request(sock, "history --json", &body, 30000);
    int rc = 0;
    char err[512], name[300], csv[4200], svg[4200];
    if (r == -EREMOTEIO) {
        fprintf(stderr, "omnivorectl: %s\n", omv_strbuf_str(&body));
        rc = 1;
    } else if (r < 0) {
        explain_unreachable(sock, r);
        rc = 3;
    } else if (omv_report_parse(&rep, omv_strbuf_str(&body), err, sizeof(err)) < 0) {
        fprintf(stderr, "omnivorectl: the daemon's history cannot be read: %s (is omnivored as "
                        "new as omnivorectl?)\n", err);
        rc = 1;
    } else {
        if (base == NULL)
            omv_report_default_base(rep.job, name, sizeof(name));
        else
            omv_strlcpy(name, base, sizeof(name));
        if (omv_report_write(&rep, dir ? dir : ".", name, csv, svg, sizeof(csv), err,
                             sizeof(err)) < 0) {
            fprintf(stderr, "omnivorectl: report: %s\n", err);
            rc = 1;
        } else if (quiet) {
            fprintf(stderr, "omnivorectl: training report in %s and %s\n", csv, svg);
        } else if (json) {
            omv_strbuf_clear(&body);
            omv_strbuf_append(&body, "{\"csv\":", 7);
            omv_strbuf_json_string(&body, csv);
            omv_strbuf_append(&body, ",\"svg\":", 7);
            omv_strbuf_json_string(&body, svg);
            printf("%s}\n", omv_strbuf_str(&body));
        } else {
            printf("%s\n%s\n", csv, svg);
        }
    }
    omv_report_fini(&rep);
    omv_strbuf_fini(&body);
    return rc;
}

static int cmd_report(const char *sock, int argc, char **argv, int json)
{
    const char *dir = ".", *base = NULL;
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'}, {"name", required_argument, NULL, 'N'},
        {"json", no_argument, NULL, 'j'},      {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:N:j", opts, NULL)) != -1) {
        if (c == 'o') {
            dir = optarg;
        } else if (c == 'N') {
            base = optarg;
        } else if (c == 'j') {
            json = 1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "omnivorectl report: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (base && (*base == '\0' || strchr(base, '/'))) {
        fprintf(stderr, "omnivorectl report: --name '%s' is a file name without folders (give "
                        "the folder with --out)\n", base);
        return 2;
    }
    return write_report(sock, dir, base, json, 0);
}

/* ---- run: a one-machine cluster ---- */

typedef struct {
    pid_t pid;
    const char *what;
    int done;
    int status;
} child_t;

/* Finds a sibling binary: beside us, in the build tree's other folder, or on PATH. */
static void find_binary(const char *name, const char *folder, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *dir = dirname(self);
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof(cand), "%s/%s", dir, name);
        if (access(cand, X_OK) == 0) {
            omv_strlcpy(out, cand, cap);
            return;
        }
        snprintf(cand, sizeof(cand), "%s/../%s/%s", dir, folder, name);
        if (access(cand, X_OK) == 0) {
            omv_strlcpy(out, cand, cap);
            return;
        }
    }
    omv_strlcpy(out, name, cap); /* execvp searches PATH */
}

static pid_t spawn(char **argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_IGN); /* we shut the cluster down in order on Ctrl-C */
        execvp(argv[0], argv);
        fprintf(stderr, "omnivorectl: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static void reap(child_t *kids, int n, int quiet)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < n; i++) {
            if (kids[i].pid != pid)
                continue;
            kids[i].done = 1;
            kids[i].status = status;
            if (!quiet && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                if (WIFSIGNALED(status))
                    fprintf(stderr, "omnivorectl: %s (pid %d) was killed by signal %d\n",
                            kids[i].what, pid, WTERMSIG(status));
                else
                    fprintf(stderr, "omnivorectl: %s (pid %d) exited with status %d\n",
                            kids[i].what, pid, WEXITSTATUS(status));
            }
        }
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The value of "key:" in a key:value body, copied into out. */
static int field(const char *body, const char *key, char *out, size_t cap)
{
    size_t k = strlen(key);
    for (const char *p = body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, key, k) == 0 && p[k] == ':') {
            const char *v = p + k + 1;
            size_t n = strcspn(v, "\n");
            if (n >= cap)
                n = cap - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
    }
    return -ENOENT;
}

static int cmd_run(int argc, char **argv, int json)
{
    const char *job_path = NULL, *workers_arg = NULL, *threads = "1", *report_dir = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    static const struct option opts[] = {
        {"workers", required_argument, NULL, 'w'}, {"threads", required_argument, NULL, 't'},
        {"set", required_argument, NULL, 'S'},     {"json", no_argument, NULL, 'j'},
        {"report", required_argument, NULL, 'R'},  {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "w:t:j", opts, NULL)) != -1) {
        if (c == 'w') {
            workers_arg = optarg;
        } else if (c == 't') {
            threads = optarg;
        } else if (c == 'S' && n_sets < MAX_SETS) {
            sets[n_sets++] = optarg;
        } else if (c == 'j') {
            json = 1;
        } else if (c == 'R') {
            report_dir = optarg;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "omnivorectl run: give exactly one job file\n");
        return 2;
    }
    job_path = argv[optind];

    /* Check the job here first, so that a broken file is reported before anything starts. */
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_job_load(&job, job_path, err) < 0) {
        fprintf(stderr, "omnivorectl: %s\n", err);
        return 2;
    }
    if (workers_arg && omv_config_set(omv_job_table, omv_job_table_len, &job, "cluster",
                                      "workers", workers_arg, err) < 0) {
        fprintf(stderr, "omnivorectl: --workers: %s\n", err);
        return 2;
    }
    for (int i = 0; i < n_sets; i++) {
        if (omv_config_set_arg(omv_job_table, omv_job_table_len, &job, sets[i], err) < 0) {
            fprintf(stderr, "omnivorectl: --set: %s\n", err);
            return 2;
        }
    }
    if (omv_job_validate(&job, job_path, err) < 0) {
        fprintf(stderr, "omnivorectl: %s\n", err);
        return 2;
    }
    int n_workers = (int)job.workers;

    const char *tmp = getenv("TMPDIR");
    char dir[PATH_MAX], endpoint[PATH_MAX + 16], sock[PATH_MAX + 16], nworkers[16];
    snprintf(dir, sizeof(dir), "%s/omnivore-run.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "omnivorectl: cannot make a run folder in %s: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/workers.sock", dir);
    snprintf(sock, sizeof(sock), "%s/control.sock", dir);
    snprintf(nworkers, sizeof(nworkers), "%d", n_workers);

    char daemon_bin[PATH_MAX], worker_bin[PATH_MAX];
    find_binary("omnivored", "server", daemon_bin, sizeof(daemon_bin));
    find_binary("omnivore-worker", "worker", worker_bin, sizeof(worker_bin));

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    static child_t kids[MAX_CHILDREN];
    int n_kids = 0, rc = 1;
    char *dargv[16 + 2 * MAX_SETS];
    int k = 0;
    dargv[k++] = daemon_bin;
    dargv[k++] = "--once"; /* the workers exit with the job, and nothing else is queued */
    dargv[k++] = "--job";
    dargv[k++] = (char *)job_path;
    dargv[k++] = "--endpoint";
    dargv[k++] = endpoint;
    dargv[k++] = "--control";
    dargv[k++] = sock;
    dargv[k++] = "--workers";
    dargv[k++] = nworkers;
    dargv[k++] = "--state-dir";
    dargv[k++] = dir;
    for (int i = 0; i < n_sets; i++) {
        dargv[k++] = "--set";
        dargv[k++] = (char *)sets[i];
    }
    dargv[k] = NULL;
    kids[n_kids++] = (child_t){spawn(dargv), "omnivored", 0, 0};

    omv_strbuf_t body;
    omv_strbuf_init(&body);
    /* Wait until the daemon answers on its control socket. */
    int64_t deadline = omv_time_ms() + 30000;
    for (;;) {
        reap(kids, n_kids, 0);
        if (kids[0].done) {
            fprintf(stderr, "omnivorectl: omnivored did not start (see its message above)\n");
            goto out;
        }
        if (omv_control_request(sock, "status", &body, 1000) == 0)
            break;
        if (interrupted || omv_time_ms() > deadline) {
            fprintf(stderr, "omnivorectl: omnivored did not answer on %s\n", sock);
            goto out;
        }
        sleep_ms(20);
    }
    char *wargv[] = {worker_bin, "--server", endpoint, "--threads", (char *)threads, NULL, NULL,
                     NULL};
    for (int i = 0; i < n_workers && n_kids < MAX_CHILDREN - 1; i++)
        kids[n_kids++] = (child_t){spawn(wargv), "omnivore-worker", 0, 0};
    wargv[5] = "--role";
    wargv[6] = "evaluator";
    kids[n_kids++] = (child_t){spawn(wargv), "omnivore-worker (evaluator)", 0, 0};
    fprintf(stderr, "omnivorectl: running '%s' with %d workers and an evaluator (run folder %s)\n",
            job.name, n_workers, dir);

    char state[32] = "";
    while (!interrupted) {
        sleep_ms(250);
        reap(kids, n_kids, 0);
        if (kids[0].done) {
            fprintf(stderr, "omnivorectl: omnivored ended before the job did\n");
            goto out;
        }
        if (omv_control_request(sock, "status", &body, 5000) == 0 &&
            field(omv_strbuf_str(&body), "state", state, sizeof(state)) == 0 &&
            (strcmp(state, "done") == 0 || strcmp(state, "failed") == 0 ||
             strcmp(state, "stopped") == 0))
            break;
    }
    if (interrupted) {
        fprintf(stderr, "omnivorectl: interrupted; stopping the cluster\n");
        rc = 130;
    } else {
        rc = strcmp(state, "done") == 0 ? 0 : 1;
        if (report_dir && write_report(sock, report_dir, NULL, 0, 1) != 0)
            rc = 1;
        if (request(sock, json ? "summary --json" : "summary", &body) == 0)
            fputs(omv_strbuf_str(&body), stdout);
        fflush(stdout);
    }
out:
    omv_strbuf_clear(&body);
    if (!kids[0].done)
        omv_control_request(sock, "shutdown", &body, 5000);
    /* Give everyone 2 s to stop on their own (workers whose daemon went away mid-job wait for
     * it to come back), then ask them with SIGTERM, then after 10 s make them. */
    int64_t asked = omv_time_ms() + 2000;
    deadline = omv_time_ms() + 10000;
    for (;;) {
        reap(kids, n_kids, 1);
        int left = 0;
        for (int i = 0; i < n_kids; i++)
            left += !kids[i].done;
        if (left == 0)
            break;
        if (asked > 0 && omv_time_ms() > asked) {
            for (int i = 0; i < n_kids; i++)
                if (!kids[i].done)
                    kill(kids[i].pid, SIGTERM);
            asked = 0;
        }
        if (omv_time_ms() > deadline) {
            for (int i = 0; i < n_kids; i++)
                if (!kids[i].done)
                    kill(kids[i].pid, SIGKILL);
        }
        sleep_ms(20);
    }
    omv_strbuf_fini(&body);
    unlink(sock);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/workers.sock", dir);
    unlink(path);
    /* The run folder stays when it holds checkpoints (the summary names the last one). */
    snprintf(path, sizeof(path), "%s/checkpoints/%s", dir, job.name);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/checkpoints", dir);
    rmdir(path);
    rmdir(dir);
    return rc;
}

/* ---- watch: a command's reply, refreshed ---- */

static int cmd_watch(const char *sock, int argc, char **argv, int json)
{
    double interval = 2.0;
    long count = 0;
    static const struct option opts[] = {
        {"interval", required_argument, NULL, 'i'}, {"count", required_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},           {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "+i:n:j", opts, NULL)) != -1) {
        char *end;
        if (c == 'i') {
            interval = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(interval >= 0.05 && interval <= 86400)) {
                fprintf(stderr, "omnivorectl watch: --interval: '%s' is not a number of seconds "
                                "from 0.05 to 86400\n", optarg);
                return 2;
            }
        } else if (c == 'n') {
            count = strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || count < 1) {
                fprintf(stderr, "omnivorectl watch: --count: '%s' is not a positive number\n",
                        optarg);
                return 2;
            }
        } else if (c == 'j') {
            json = 1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    const char *what = "status";
    if (optind < argc)
        what = argv[optind++];
    static const char *const watchable[] = {"status", "workers", "groups", "metrics", "summary"};
    int ok = 0;
    for (size_t k = 0; k < OMV_ARRAY_SIZE(watchable); k++)
        ok |= strcmp(what, watchable[k]) == 0;
    if (!ok || optind < argc) {
        fprintf(stderr, "omnivorectl watch: %s '%s'; watch status, workers, groups, metrics or "
                        "summary\n", ok ? "unexpected argument" : "cannot watch",
                ok ? argv[optind] : what);
        return 2;
    }
    char line[64];
    snprintf(line, sizeof(line), "%s%s", what, json ? " --json" : "");

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: Ctrl-C cuts the sleep short */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int tty = isatty(STDOUT_FILENO);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int rc = 0, reached = 0;
    for (long n = 0; !interrupted && (count == 0 || n < count); n++) {
        if (n > 0) {
            struct timespec ts = {(time_t)interval,
                                  (long)((interval - (double)(time_t)interval) * 1e9)};
            /* Sleeps the whole interval unless a signal ends it. */
            while (!interrupted && nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
            if (interrupted)
                break;
        }
        char stamp[64];
        time_t now = time(NULL);
        struct tm tm;
        strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
        int r = omv_control_request(sock, line, &body, 10000);
        if (r < 0 && r != -EREMOTEIO && !reached) {
            /* Never reached: there is nothing to watch. */
            explain_unreachable(sock, r);
            rc = 3;
            break;
        }
        reached = 1;
        if (tty)
            fputs("\033[H\033[2J", stdout); /* cursor home, clear the screen */
        else if (n > 0)
            fputc('\n', stdout);
        if (!json)
            printf("# watch\ncommand:%s\nsocket:%s\ntime:%s\ninterval_seconds:%g\n", what, sock,
                   stamp, interval);
        if (r == 0) {
            fputs(omv_strbuf_str(&body), stdout);
        } else {
            /* The daemon went away or refused: say so and keep watching for its return. */
            if (r == -EREMOTEIO)
                printf("error:%s\n", omv_strbuf_str(&body));
            else
                printf("error:omnivored does not answer (%s); still watching\n",
                       omv_strerror(r));
        }
        if (tty && !json)
            printf("\n(every %g s; Ctrl-C to quit)\n", interval);
        fflush(stdout);
    }
    omv_strbuf_fini(&body);
    return rc;
}

int main(int argc, char **argv)
{
    omv_log_set_ident("omnivorectl");
    const char *sock = getenv("OMNIVORE_SOCKET");
    if (sock == NULL || *sock == '\0')
        sock = DEFAULT_SOCKET;
    int json = 0;
    int i = 1;
    /* Options before the command. */
    for (; i < argc && argv[i][0] == '-'; i++) {
        if ((strcmp(argv[i], "--socket") == 0 || strcmp(argv[i], "-s") == 0) && i + 1 < argc) {
            sock = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-j") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "omnivorectl: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i == argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - i, argv + i, json);
    if (strcmp(cmd, "watch") == 0)
        return cmd_watch(sock, argc - i, argv + i, json);
    if (strcmp(cmd, "report") == 0)
        return cmd_report(sock, argc - i, argv + i, json);
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "submit") == 0)
        return cmd_submit(sock, argc - i, argv + i, json);
    static const char *const known[] = {"status",   "workers",    "groups",   "metrics",
                                        "summary",  "history",    "checkpoint", "shutdown",
                                        "regroup",  "optimizer",  "jobs",     "stop"};
    int ok = 0;
    for (size_t k = 0; k < OMV_ARRAY_SIZE(known); k++)
        ok |= strcmp(cmd, known[k]) == 0;
    if (!ok) {
        fprintf(stderr, "omnivorectl: unknown command '%s'; see omnivorectl --help\n", cmd);
        return 2;
    }
    const char *groups = NULL; /* regroup's or stop's argument */
    for (int a = i + 1; a < argc; a++) {
        if (strcmp(argv[a], "--json") == 0 || strcmp(argv[a], "-j") == 0) {
            json = 1;
        } else if (strcmp(cmd, "regroup") == 0 && groups == NULL &&
                   strspn(argv[a], "0123456789") == strlen(argv[a]) && strlen(argv[a]) < 6) {
            groups = argv[a];
        } else if (strcmp(cmd, "stop") == 0 && groups == NULL && strlen(argv[a]) < 64 &&
                   strspn(argv[a], " \t") == 0) {
            groups = argv[a];
        } else {
            fprintf(stderr, "omnivorectl: %s takes no argument '%s'\n", cmd, argv[a]);
            return 2;
        }
    }
    if (strcmp(cmd, "regroup") == 0 && groups == NULL) {
        fprintf(stderr, "omnivorectl: regroup takes the number of groups, e.g. regroup 2\n");
        return 2;
    }
    char line[128];
    snprintf(line, sizeof(line), "%s%s%s%s", cmd, groups ? " " : "", groups ? groups : "",
             json ? " --json" : "");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int rc = request(sock, line, &body);
    if (rc == 0)
        fputs(omv_strbuf_str(&body), stdout);
    omv_strbuf_fini(&body);
    return rc;
}
