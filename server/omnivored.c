/* omnivored: the parameter-server daemon. Reads its config (and a job, if one is named), binds
 * the worker endpoint and the control socket, and runs jobs one after another (the boot job,
 * then those submitted with omnivorectl submit) until it is told to stop. */
#define OMV_LOG_TAG "omnivored"
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "log.h"
#include "notify.h"
#include "sandbox.h"
#include "util.h"
#include "wire.h"

static volatile sig_atomic_t stop_flag, reload_flag;

static void on_hup(int sig)
{
    (void)sig;
    reload_flag = 1;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: omnivored [--config FILE] [options]\n"
            "The omnivore parameter-server daemon.\n\n"
            "  -c, --config FILE      daemon config (INI, [daemon] section; see "
            "deploy/omnivored.conf)\n"
            "  -e, --endpoint EP      worker endpoint to bind (tcp://*:5555, ipc:///path)\n"
            "  -s, --control PATH     control socket path\n"
            "  -j, --job FILE         job file to run at start (without one: wait for\n"
            "                         omnivorectl submit)\n"
            "      --once             run the --job only: refuse submissions, and tell the\n"
            "                         workers to exit when it ends (omnivorectl run uses it)\n"
            "  -d, --state-dir DIR    state folder (checkpoints under DIR/checkpoints/JOB)\n"
            "      --curve yes|no|auto  CURVE on the worker endpoint ([security] curve)\n"
            "      --role shard       hold shards of the coordinator's jobs ([daemon] role)\n"
            "      --coordinator EP   role shard: the coordinator's worker endpoint\n"
            "      --advertise EP     role shard: the endpoint its workers are told\n"
            "  -w, --workers N        override the job's [cluster] workers\n"
            "      --set S.K=V        override any job key, e.g. --set train.learning_rate=0.05\n"
            "  -l, --log-level LEVEL  error, warn, info or debug\n"
            "  -h, --help             this text\n"
            "  -V, --version          the version\n");
}

static int has_set(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--set") == 0 || strncmp(argv[i], "--set=", 6) == 0)
            return 1;
    return 0;
}

static const struct option opts[] = {
    {"config", required_argument, NULL, 'c'},
    {"endpoint", required_argument, NULL, 'e'},
    {"control", required_argument, NULL, 's'},
    {"job", required_argument, NULL, 'j'},
    {"workers", required_argument, NULL, 'w'},
    {"set", required_argument, NULL, 'S'},
    {"log-level", required_argument, NULL, 'l'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"state-dir", required_argument, NULL, 'd'},
    {"once", no_argument, NULL, 'O'},
    {"curve", required_argument, NULL, 'C'},
    {"role", required_argument, NULL, 'R'},
    {"coordinator", required_argument, NULL, 'K'},
    {"advertise", required_argument, NULL, 'A'},
    {NULL, 0, NULL, 0},
};
#define SHORT_OPTS "c:e:s:j:w:l:d:hVO"

/* What the command line said besides the daemon's config. */
typedef struct {
    const char *workers, *config_path, *cli_log_level;
} cli_t;

/* First pass: the config file, so that flags override it; --help and --version. Returns -1 to
 * go on, else the exit status. */
static int read_config_file(int argc, char **argv, omv_daemon_config_t *cfg)
{
    char err[OMV_CONFIG_ERR_MAX];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, SHORT_OPTS, opts, NULL)) != -1) {
        if (c == 'c' &&
            omv_config_load(omv_daemon_table, omv_daemon_table_len, optarg, cfg, NULL, err) < 0) {
            omv_log_fatal("%s", err);
            return 2;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c == 'V') {
            printf("omnivored %s (protocol %d)\n", OMV_VERSION, OMV_PROTOCOL_VERSION);
            return 0;
        } else if (c == '?') {
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

/* Second pass: flags over the file. Returns -1 to go on, else the exit status. */
static int read_flags(int argc, char **argv, omv_daemon_config_t *cfg, cli_t *cli)
{
    char err[OMV_CONFIG_ERR_MAX];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, SHORT_OPTS, opts, NULL)) != -1) {
        const char *key = c == 'e'   ? "endpoint"
                          : c == 's' ? "control"
                          : c == 'j' ? "job"
                          : c == 'l' ? "log_level"
                          : c == 'd' ? "state_dir"
                                     : NULL;
        if (c == 'C')
            key = "curve";
        else if (c == 'R')
            key = "role";
        else if (c == 'K')
            key = "coordinator";
        else if (c == 'A')
            key = "advertise";
        if (key && omv_config_set(omv_daemon_table, omv_daemon_table_len, cfg,
                                  c == 'C' ? "security" : "daemon", key, optarg, err) < 0) {
            omv_log_fatal("%s", err);
            return 2;
        }
        if (c == 'w')
            cli->workers = optarg;
        else if (c == 'c')
            cli->config_path = optarg;
        else if (c == 'l')
            cli->cli_log_level = optarg;
        else if (c == 'O')
            cfg->once = 1;
    }
    if (omv_log_set_level_name(cfg->log_level) < 0) {
        omv_log_fatal("log level '%s' is not error, warn, info or debug", cfg->log_level);
        return 2;
    }
    return -1;
}

/* The boot job: its file read once, parsed from that text, with --workers and --set applied.
 * Returns -1 to go on, else the exit status. */
static int load_boot_job(int argc, char **argv, const omv_daemon_config_t *cfg, const cli_t *cli,
                         omv_job_t *job, char **ret_text)
{
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_job_read(cfg->job, ret_text, err) < 0 ||
        omv_job_load_text(job, cfg->job, *ret_text, err) < 0) {
        omv_sandbox_explain_open(err, sizeof(err));
        omv_log_fatal("%s", err);
        return 2;
    }
    if (cli->workers && omv_config_set(omv_job_table, omv_job_table_len, job, "cluster", "workers",
                                       cli->workers, err) < 0) {
        omv_log_fatal("--workers: %s", err);
        return 2;
    }
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, SHORT_OPTS, opts, NULL)) != -1) {
        if (c == 'S' &&
            omv_config_set_arg(omv_job_table, omv_job_table_len, job, optarg, err) < 0) {
            omv_log_fatal("--set: %s", err);
            return 2;
        }
    }
    if (omv_job_validate(job, cfg->job, err) < 0) {
        omv_sandbox_explain_open(err, sizeof(err));
        omv_log_fatal("%s", err);
        return 2;
    }
    return -1;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* systemctl reload sends SIGHUP (ExecReload): the loop re-reads the config file. */
    struct sigaction hup;
    memset(&hup, 0, sizeof(hup));
    hup.sa_handler = on_hup;
    sigaction(SIGHUP, &hup, NULL);
}

/* Checks that the flags fit together. Returns -1 to go on, else the exit status. */
static int check_flags(int argc, char **argv, const omv_daemon_config_t *cfg, const cli_t *cli)
{
    int have_job = cfg->job[0] != '\0';
    if (!have_job && cfg->once) {
        omv_log_fatal("--once runs one job: give --job FILE or set [daemon] job");
        return 2;
    }
    if (!have_job && (cli->workers || has_set(argc, argv))) {
        omv_log_fatal("--workers and --set change the job, but there is none: give "
                      "--job FILE");
        return 2;
    }
    return -1;
}

static int serve(const omv_daemon_config_t *cfg, const cli_t *cli, const omv_job_t *job,
                 const char *text)
{
    omv_daemon_t *d = omv_daemon_new(cfg, job, cfg->job, text);
    if (d == NULL)
        return 1;
    /* Both sockets are bound and the control socket answers from here on. */
    char ready[512];
    if (job)
        snprintf(ready, sizeof(ready), "waiting: job %s, %lld workers on %s", job->name,
                 (long long)job->workers, cfg->endpoint);
    else
        snprintf(ready, sizeof(ready), "idle: no job; workers on %s", cfg->endpoint);
    omv_notify_ready(ready);
    omv_daemon_set_reload(d, &reload_flag, cli->config_path, cli->cli_log_level);
    int r = omv_daemon_run(d, &stop_flag);
    omv_notify_stopping();
    omv_daemon_destroy(&d);
    return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    omv_log_set_ident("omnivored");
    omv_keep_memory_resident();
    static omv_daemon_config_t cfg;
    static omv_job_t job;
    cli_t cli = {0};
    char *text = NULL;
    omv_config_defaults(omv_daemon_table, omv_daemon_table_len, &cfg);
    int rc = read_config_file(argc, argv, &cfg);
    if (rc < 0)
        rc = read_flags(argc, argv, &cfg, &cli);
    if (rc < 0)
        rc = check_flags(argc, argv, &cfg, &cli);
    int have_job = cfg.job[0] != '\0';
    if (rc < 0 && have_job)
        rc = load_boot_job(argc, argv, &cfg, &cli, &job, &text);
    if (rc < 0) {
        install_signals();
        rc = serve(&cfg, &cli, have_job ? &job : NULL, text);
    }
    free(text);
    return rc;
}
