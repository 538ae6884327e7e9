/* omnivorectl run: a one-machine cluster for one job. It starts omnivored (--once, in a fresh
 * run folder), the job's trainers and an evaluator, waits for the job to end, prints its summary
 * (after writing the report, when asked to), then stops them all in order. */
#include <errno.h>
#include <getopt.h>
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

#include "cert.h"
#include "config.h"
#include "control.h"
#include "ctl.h"
#include "job.h"
#include "util.h"

/* The daemon, up to the 1024 workers a job may have, and the evaluator. */
#define MAX_CHILDREN 1100

/* What run's command line asked for. */
typedef struct {
    const char *job_path, *workers_arg, *threads, *report_dir;
    const char *sets[OMV_CTL_MAX_SETS];
    int n_sets;
    int json;
    int curve; /* --curve: CURVE with keys made for this run */
} run_args_t;

typedef struct {
    pid_t pid;
    const char *what;
    int done;
    int status;
} child_t;

/* One run's processes and where they meet: the run folder holds the daemon's sockets and its
 * checkpoints. kids[0] is the daemon. */
typedef struct {
    char dir[PATH_MAX];
    char endpoint[PATH_MAX + 16], sock[PATH_MAX + 16];
    char daemon_bin[PATH_MAX], worker_bin[PATH_MAX];
    char keys[PATH_MAX + 8];                          /* --curve: the run's keys */
    int curve;                                        /* they were made */
    char conf[PATH_MAX + 16];                         /* the daemon's config, when it needs one */
    char ckpt_dir[PATH_MAX], ckpt_set[PATH_MAX + 32]; /* the job's [checkpoint] dir, absolute */
    child_t kids[MAX_CHILDREN];
    int n_kids;
} cluster_t;

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

/* Starts argv[0] (found on PATH when it has no slash) as a child; returns its pid. */
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

/* Marks every child that has ended as done and, unless quiet, says how one ended badly. */
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

/* Reads run's command line into a. Returns -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, run_args_t *a)
{
    static const struct option opts[] = {
        {"workers", required_argument, NULL, 'w'},
        {"threads", required_argument, NULL, 't'},
        {"set", required_argument, NULL, 'S'},
        {"json", no_argument, NULL, 'j'},
        {"report", required_argument, NULL, 'R'},
        {"curve", no_argument, NULL, 'C'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "w:t:j", opts, NULL)) != -1) {
        if (c == 'w') {
            a->workers_arg = optarg;
        } else if (c == 't') {
            a->threads = optarg;
        } else if (c == 'S' && a->n_sets < OMV_CTL_MAX_SETS) {
            a->sets[a->n_sets++] = optarg;
        } else if (c == 'j') {
            a->json = 1;
        } else if (c == 'R') {
            a->report_dir = optarg;
        } else if (c == 'C') {
            a->curve = 1;
        } else {
            omv_ctl_usage(stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "omnivorectl run: give exactly one job file\n");
        return 2;
    }
    a->job_path = argv[optind];
    return -1;
}

/* Loads the job with the command line's overrides and checks it here first, so that a broken
 * file is reported before anything starts. Returns 0 or the exit status 2. */
static int load_job(const run_args_t *a, omv_job_t *job)
{
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_job_load(job, a->job_path, err) < 0) {
        fprintf(stderr, "omnivorectl: %s\n", err);
        return 2;
    }
    if (a->workers_arg && omv_config_set(omv_job_table, omv_job_table_len, job, "cluster",
                                         "workers", a->workers_arg, err) < 0) {
        fprintf(stderr, "omnivorectl: --workers: %s\n", err);
        return 2;
    }
    for (int i = 0; i < a->n_sets; i++) {
        if (omv_config_set_arg(omv_job_table, omv_job_table_len, job, a->sets[i], err) < 0) {
            fprintf(stderr, "omnivorectl: --set: %s\n", err);
            return 2;
        }
    }
    if (omv_job_validate(job, a->job_path, err) < 0) {
        fprintf(stderr, "omnivorectl: %s\n", err);
        return 2;
    }
    return 0;
}

/* Makes the run folder (under $TMPDIR, else /tmp), names the sockets in it and finds the
 * binaries to start. Returns 0 or the exit status 1. */
static int prepare(cluster_t *cl)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(cl->dir, sizeof(cl->dir), "%s/omnivore-run.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(cl->dir) == NULL) {
        fprintf(stderr, "omnivorectl: cannot make a run folder in %s: %s\n", cl->dir,
                strerror(errno));
        return 1;
    }
    snprintf(cl->endpoint, sizeof(cl->endpoint), "ipc://%s/workers.sock", cl->dir);
    snprintf(cl->sock, sizeof(cl->sock), "%s/control.sock", cl->dir);
    find_binary("omnivored", "server", cl->daemon_bin, sizeof(cl->daemon_bin));
    find_binary("omnivore-worker", "worker", cl->worker_bin, sizeof(cl->worker_bin));
    return 0;
}

/* --curve: throwaway keys for the daemon, the trainers and the evaluator in RUN/keys (which is
 * also the daemon's allow-list folder: its *.key files name each key's role). Returns 0 or the
 * exit status 1. */
static int make_keys(cluster_t *cl)
{
    static const struct {
        const char *name;
        unsigned roles;
    } certs[] = {{"daemon", 0}, {"trainer", OMV_CERT_TRAINER}, {"evaluator", OMV_CERT_EVALUATOR}};
    char err[OMV_CONFIG_ERR_MAX];
    snprintf(cl->keys, sizeof(cl->keys), "%s/keys", cl->dir);
    if (mkdir(cl->keys, 0700) != 0) {
        fprintf(stderr, "omnivorectl: cannot make %s: %s\n", cl->keys, strerror(errno));
        return 1;
    }
    cl->curve = 1;
    for (size_t i = 0; i < sizeof(certs) / sizeof(certs[0]); i++) {
        if (omv_ctl_make_cert(cl->keys, certs[i].name, certs[i].roles, err) < 0) {
            fprintf(stderr, "omnivorectl: --curve: %s\n", err);
            return 1;
        }
    }
    return 0;
}

/* The daemon's config for the run: CURVE with the run's keys, and the job's own [checkpoint]
 * dir as a folder it may write (the daemon is ours: a job that names a folder is the caller's
 * wish, not a stranger's), made absolute as it was meant from here. Returns 0 or 1. */
static int write_config(cluster_t *cl, const omv_job_t *job)
{
    if (job->checkpoint_dir[0]) {
        char cwd[PATH_MAX] = ".";
        if (job->checkpoint_dir[0] != '/' && getcwd(cwd, sizeof(cwd)) == NULL)
            return 1;
        if (job->checkpoint_dir[0] == '/')
            omv_strlcpy(cl->ckpt_dir, job->checkpoint_dir, sizeof(cl->ckpt_dir));
        else
            snprintf(cl->ckpt_dir, sizeof(cl->ckpt_dir), "%s/%s", cwd, job->checkpoint_dir);
        snprintf(cl->ckpt_set, sizeof(cl->ckpt_set), "checkpoint.dir=%s", cl->ckpt_dir);
    }
    if (!cl->curve && !cl->ckpt_dir[0])
        return 0;
    snprintf(cl->conf, sizeof(cl->conf), "%s/omnivored.conf", cl->dir);
    FILE *f = fopen(cl->conf, "w");
    if (f == NULL) {
        fprintf(stderr, "omnivorectl: cannot write %s: %s\n", cl->conf, strerror(errno));
        return 1;
    }
    fprintf(f, "[security]\ncheckpoint_root = %s\n", cl->ckpt_dir);
    if (cl->curve)
        fprintf(f, "curve = yes\nsecret_key = %s/daemon.key_secret\nallow_dir = %s\n", cl->keys,
                cl->keys);
    fclose(f);
    return 0;
}

/* Starts omnivored for the job, with the command line's overrides. */
static void start_daemon(cluster_t *cl, const run_args_t *a, int n_workers)
{
    char nworkers[16];
    snprintf(nworkers, sizeof(nworkers), "%d", n_workers);
    char *argv[20 + 2 * OMV_CTL_MAX_SETS];
    int k = 0;
    argv[k++] = cl->daemon_bin;
    argv[k++] = "--once"; /* the workers exit with the job, and nothing else is queued */
    argv[k++] = "--job";
    argv[k++] = (char *)a->job_path;
    argv[k++] = "--endpoint";
    argv[k++] = cl->endpoint;
    argv[k++] = "--control";
    argv[k++] = cl->sock;
    argv[k++] = "--workers";
    argv[k++] = nworkers;
    argv[k++] = "--state-dir";
    argv[k++] = cl->dir;
    if (cl->conf[0]) {
        argv[k++] = "--config";
        argv[k++] = cl->conf;
    }
    for (int i = 0; i < a->n_sets; i++) {
        argv[k++] = "--set";
        argv[k++] = (char *)a->sets[i];
    }
    if (cl->ckpt_set[0]) {
        argv[k++] = "--set";
        argv[k++] = cl->ckpt_set;
    }
    argv[k] = NULL;
    cl->kids[cl->n_kids++] = (child_t){spawn(argv), "omnivored", 0, 0};
}

/* Waits (30 s at most) until the daemon answers on its control socket. Returns 0, or -1 when it
 * ended, did not answer or we were interrupted (said on stderr). */
static int wait_for_daemon(cluster_t *cl, omv_strbuf_t *body)
{
    int64_t deadline = omv_time_ms() + 30000;
    for (;;) {
        reap(cl->kids, cl->n_kids, 0);
        if (cl->kids[0].done) {
            fprintf(stderr, "omnivorectl: omnivored did not start (see its message above)\n");
            return -1;
        }
        if (omv_control_request(cl->sock, "status", body, 1000) == 0)
            return 0;
        if (omv_ctl_interrupted() || omv_time_ms() > deadline) {
            fprintf(stderr, "omnivorectl: omnivored did not answer on %s\n", cl->sock);
            return -1;
        }
        sleep_ms(20);
    }
}

/* Starts the evaluator (evaluator 1) or n_workers trainers, with threads threads each. */
static void start_workers(cluster_t *cl, int evaluator, int n_workers, const char *threads)
{
    char key[PATH_MAX + 32], server_key[PATH_MAX + 32];
    char *argv[] = {cl->worker_bin, "--server", cl->endpoint, "--threads", (char *)threads,
                    NULL,           NULL,       NULL,         NULL,        NULL,
                    NULL,           NULL,       NULL};
    int k = 5;
    if (cl->curve) {
        snprintf(key, sizeof(key), "%s/%s.key_secret", cl->keys,
                 evaluator ? "evaluator" : "trainer");
        snprintf(server_key, sizeof(server_key), "%s/daemon.key", cl->keys);
        argv[k++] = "--key";
        argv[k++] = key;
        argv[k++] = "--server-key";
        argv[k++] = server_key;
    }
    if (evaluator) {
        argv[k++] = "--role";
        argv[k++] = "evaluator";
        cl->kids[cl->n_kids++] = (child_t){spawn(argv), "omnivore-worker (evaluator)", 0, 0};
        return;
    }
    for (int i = 0; i < n_workers && cl->n_kids < MAX_CHILDREN - 1; i++)
        cl->kids[cl->n_kids++] = (child_t){spawn(argv), "omnivore-worker", 0, 0};
}

/* Waits up to 10 s for the evaluator to register: a small job can end within a second of its
 * trainers starting, and its final model must be evaluated. */
static void wait_for_evaluator(cluster_t *cl, omv_strbuf_t *body)
{
    char alive[16] = "";
    for (int i = 0; i < 500 && !omv_ctl_interrupted(); i++) {
        if (omv_control_request(cl->sock, "status", body, 5000) == 0 &&
            field(omv_strbuf_str(body), "evaluator_alive", alive, sizeof(alive)) == 0 &&
            strcmp(alive, "1") == 0)
            return;
        sleep_ms(20);
    }
    fprintf(stderr, "omnivorectl: the evaluator has not registered after 10 s; starting the "
                    "trainers anyway\n");
}

/* Asks the daemon for the job's state until it is done, failed or stopped (copied into
 * state[cap]), or until we are interrupted. Returns 0, or -1 when the daemon ended first. */
static int wait_for_job(cluster_t *cl, omv_strbuf_t *body, char *state, size_t cap)
{
    while (!omv_ctl_interrupted()) {
        sleep_ms(250);
        reap(cl->kids, cl->n_kids, 0);
        if (cl->kids[0].done) {
            fprintf(stderr, "omnivorectl: omnivored ended before the job did\n");
            return -1;
        }
        if (omv_control_request(cl->sock, "status", body, 5000) == 0 &&
            field(omv_strbuf_str(body), "state", state, cap) == 0 &&
            (strcmp(state, "done") == 0 || strcmp(state, "failed") == 0 ||
             strcmp(state, "stopped") == 0))
            return 0;
    }
    return 0;
}

/* Whether a done job ended with its final model both evaluated and checkpointed (or
 * checkpoints off); says on stderr what is missing. A job without its result is no success. */
static int honest_end(cluster_t *cl)
{
    omv_strbuf_t s;
    omv_strbuf_init(&s);
    char ckpt[32] = "", eval[32] = "", why[512] = "";
    int ok = omv_ctl_request(cl->sock, "summary", &s) == 0;
    if (ok) {
        field(omv_strbuf_str(&s), "final_checkpoint", ckpt, sizeof(ckpt));
        field(omv_strbuf_str(&s), "final_evaluation", eval, sizeof(eval));
        field(omv_strbuf_str(&s), "checkpoint_error", why, sizeof(why));
    }
    if (strcmp(ckpt, "failed") == 0) {
        fprintf(stderr, "omnivorectl: the job's final checkpoint failed: %s\n", why);
        ok = 0;
    }
    if (strcmp(eval, "missing") == 0) {
        fprintf(stderr, "omnivorectl: the job's final model was not evaluated (the evaluator "
                        "was lost): it has no final test accuracy\n");
        ok = 0;
    }
    omv_strbuf_fini(&s);
    return ok;
}

/* Trains the job on the cluster: the daemon, then (once it answers) the workers; waits for the
 * end and prints the summary, after the report when one was asked for. Returns the exit
 * status. */
static int train(cluster_t *cl, const run_args_t *a, const omv_job_t *job, omv_strbuf_t *body)
{
    int n_workers = (int)job->workers;
    start_daemon(cl, a, n_workers);
    if (wait_for_daemon(cl, body) < 0)
        return 1;
    start_workers(cl, 1, 0, a->threads);
    wait_for_evaluator(cl, body);
    start_workers(cl, 0, n_workers, a->threads);
    fprintf(stderr, "omnivorectl: running '%s' with %d workers and an evaluator (run folder %s)\n",
            job->name, n_workers, cl->dir);
    char state[32] = "";
    if (wait_for_job(cl, body, state, sizeof(state)) < 0)
        return 1;
    if (omv_ctl_interrupted()) {
        fprintf(stderr, "omnivorectl: interrupted; stopping the cluster\n");
        return 130;
    }
    int rc = strcmp(state, "done") == 0 ? 0 : 1;
    if (rc == 0 && !honest_end(cl))
        rc = 1;
    if (a->report_dir && omv_ctl_write_report(cl->sock, a->report_dir, NULL, 0, 1) != 0)
        rc = 1;
    if (omv_ctl_request(cl->sock, a->json ? "summary --json" : "summary", body) == 0)
        fputs(omv_strbuf_str(body), stdout);
    fflush(stdout);
    return rc;
}

static void signal_running(cluster_t *cl, int sig)
{
    for (int i = 0; i < cl->n_kids; i++)
        if (!cl->kids[i].done)
            kill(cl->kids[i].pid, sig);
}

/* Stops whatever still runs: asks the daemon to shut down, gives everyone 2 s to stop on their
 * own (workers whose daemon went away mid-job wait for it to come back), then asks them with
 * SIGTERM, then after 10 s makes them. */
static void stop_cluster(cluster_t *cl, omv_strbuf_t *body)
{
    omv_strbuf_clear(body);
    if (!cl->kids[0].done)
        omv_control_request(cl->sock, "shutdown", body, 5000);
    int64_t asked = omv_time_ms() + 2000;
    int64_t deadline = omv_time_ms() + 10000;
    for (;;) {
        reap(cl->kids, cl->n_kids, 1);
        int left = 0;
        for (int i = 0; i < cl->n_kids; i++)
            left += !cl->kids[i].done;
        if (left == 0)
            break;
        if (asked > 0 && omv_time_ms() > asked) {
            signal_running(cl, SIGTERM);
            asked = 0;
        }
        if (omv_time_ms() > deadline)
            signal_running(cl, SIGKILL);
        sleep_ms(20);
    }
}

/* Removes the sockets and the run folder; the folder stays when it holds checkpoints (the
 * summary names the last one). */
static void remove_run_folder(const cluster_t *cl, const char *job_name)
{
    unlink(cl->sock);
    char path[PATH_MAX + 32];
    if (cl->curve) {
        static const char *const files[] = {"daemon.key",    "daemon.key_secret",
                                            "trainer.key",   "trainer.key_secret",
                                            "evaluator.key", "evaluator.key_secret"};
        for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
            snprintf(path, sizeof(path), "%s/%s", cl->keys, files[i]);
            unlink(path);
        }
        rmdir(cl->keys);
    }
    if (cl->conf[0])
        unlink(cl->conf);
    snprintf(path, sizeof(path), "%s/workers.sock", cl->dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/checkpoints/%s", cl->dir, job_name);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/checkpoints", cl->dir);
    rmdir(path);
    rmdir(cl->dir);
}

int omv_ctl_run(const char *sock, int argc, char **argv, int json)
{
    (void)sock; /* the daemon we start has its socket in the run folder */
    run_args_t a = {.threads = "1", .json = json};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    omv_job_t job;
    rc = load_job(&a, &job);
    if (rc != 0)
        return rc;
    /* Static: a thousand children are more than a stack frame should hold. */
    static cluster_t cl;
    memset(&cl, 0, sizeof(cl));
    if (prepare(&cl) != 0 || (a.curve && make_keys(&cl) != 0) || write_config(&cl, &job) != 0) {
        remove_run_folder(&cl, job.name);
        return 1;
    }
    omv_ctl_catch_interrupts();
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    rc = train(&cl, &a, &job, &body);
    stop_cluster(&cl, &body);
    omv_strbuf_fini(&body);
    remove_run_folder(&cl, job.name);
    return rc;
}
