/* omnivore-worker: connects to omnivored, trains (or evaluates) until the job is over. */
#define OMV_LOG_TAG "worker"
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cert.h"
#include "config.h"
#include "log.h"
#include "session.h"
#include "util.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: omnivore-worker --server ENDPOINT [options]\n"
            "Computes gradients for omnivored (or evaluates its model on the test set).\n\n"
            "  -s, --server ENDPOINT   the daemon's worker endpoint, e.g. tcp://head:5555\n"
            "                          (default: $OMNIVORE_SERVER)\n"
            "  -r, --role ROLE         trainer (default) or evaluator\n"
            "  -t, --threads N         threads that split each batch (default 1)\n"
            "      --hello-timeout S   seconds to keep trying to register at start (default 30)\n"
            "      --server-timeout S  a daemon silent this long while we wait is taken for\n"
            "                          gone, and we register again (default 10)\n"
            "      --retry S           after losing the daemon, keep trying to reach it this\n"
            "                          long, with backoff (default 300; 0: forever)\n"
            "  -n, --name NAME         what `omnivorectl workers` calls this worker (the\n"
            "                          systemd unit passes its instance, e.g. worker@3)\n"
            "      --step-delay-ms MIN[-MAX]  add a random MIN..MAX ms to every step, to emulate\n"
            "                          a slower device in experiments and tests (default 0)\n"
            "      --slowdown X        take X times the compute time of every step (X >= 1),\n"
            "                          as a device X times slower would (default 1)\n"
            "      --no-overlap        pull, compute, then push, one after another (by default\n"
            "                          a shard's gradient goes out as soon as backward has it,\n"
            "                          a layer begins as soon as its shards have come, and the\n"
            "                          next step's pull goes before this step's pushes);\n"
            "                          OMNIVORE_OVERLAP=0 in the environment does the same\n"
            "      --nice N            run at nice value N, -20 to 19 (default: 19 for an\n"
            "                          evaluator, so that evaluations take only the time the\n"
            "                          trainers and the daemon leave on a shared host, and\n"
            "                          unchanged for a trainer); OMNIVORE_NICE does the same\n"
            "      --no-shm            use the socket even on the daemon's host (by default a\n"
            "                          trainer there exchanges parameters and gradients with it\n"
            "                          through shared memory); OMNIVORE_SHM=0 does the same\n"
            "      --spin-us N         waiting for its parameters from a daemon on this host,\n"
            "                          poll the shared-memory connection this many\n"
            "                          microseconds, yielding the CPU between tries, before\n"
            "                          sleeping (default 300; 0: sleep at once);\n"
            "                          OMNIVORE_SPIN_US does the same\n"
            "  -k, --key FILE          this worker's secret certificate (omnivorectl keygen;\n"
            "                          default $OMNIVORE_KEY): CURVE, with --server-key\n"
            "      --server-key FILE   the daemon's public certificate ($OMNIVORE_SERVER_KEY);\n"
            "                          relative paths are taken from $CREDENTIALS_DIRECTORY\n"
            "  -l, --log-level LEVEL   error, warn, info (default) or debug\n"
            "  -h, --help              this text\n"
            "  -V, --version           the version and protocol version\n");
}

/* Whether arg is a whole number in [lo, hi], into *ret. */
static int long_in(const char *arg, long lo, long hi, long *ret)
{
    char *end;
    *ret = strtol(arg, &end, 10);
    return end != arg && *end == '\0' && *ret >= lo && *ret <= hi;
}

/* --spin-us (or OMNIVORE_SPIN_US): microseconds, 0 to 100000. Returns -1 to go on, or the exit
 * status 2. */
static int parse_spin(const char *arg, omv_session_config_t *cfg)
{
    long v;
    if (!long_in(arg, 0, 100000, &v)) {
        omv_log_fatal("--spin-us: '%s' is not a number of microseconds from 0 to 100000", arg);
        return 2;
    }
    cfg->spin_us = (int)v;
    return -1;
}

/* --role: trainer, or evaluator (also "eval"). Returns -1 to go on, or the exit status 2. */
static int parse_role(const char *arg, omv_session_config_t *cfg)
{
    if (strcmp(arg, "trainer") == 0) {
        cfg->role = OMV_ROLE_TRAINER;
    } else if (strcmp(arg, "evaluator") == 0 || strcmp(arg, "eval") == 0) {
        cfg->role = OMV_ROLE_EVALUATOR;
    } else {
        omv_log_fatal("--role: '%s' is not trainer or evaluator", arg);
        return 2;
    }
    return -1;
}

/* --server-timeout (opt 'T', more than 0) or --retry (opt 'R', 0 is forever): seconds, up to a
 * million. Returns -1 to go on, or the exit status 2. */
static int parse_seconds(int opt, const char *arg, omv_session_config_t *cfg)
{
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end != '\0' || v < 0 || v > 1e6 || (opt == 'T' && v <= 0)) {
        omv_log_fatal("--%s: '%s' is not a number of seconds",
                      opt == 'T' ? "server-timeout" : "retry", arg);
        return 2;
    }
    if (opt == 'T')
        cfg->server_timeout_ms = (int)(v * 1000);
    else
        cfg->retry_ms = (int)(v * 1000);
    return -1;
}

/* --step-delay-ms: MS, or MIN-MAX, from 0 to 60000. Returns -1 to go on, or the exit status 2. */
static int parse_step_delay(const char *arg, omv_session_config_t *cfg)
{
    int lo = 0, hi = -1, n = 0;
    if (sscanf(arg, "%d-%d%n", &lo, &hi, &n) != 2 || arg[n] != '\0') {
        hi = -1;
        if (sscanf(arg, "%d%n", &lo, &n) == 1 && arg[n] == '\0')
            hi = lo;
    }
    if (lo < 0 || hi < lo || hi > 60000) {
        omv_log_fatal("--step-delay-ms: '%s' is not MS or MIN-MAX (0 to 60000)", arg);
        return 2;
    }
    cfg->delay_min_ms = lo;
    cfg->delay_max_ms = hi;
    return -1;
}

/* Takes one option (getopt's opt and its argument) into cfg. Returns -1 to go on, or the exit
 * status: 0 after --help or --version, 2 for a bad option or value. */
static int parse_option(int opt, const char *arg, omv_session_config_t *cfg)
{
    switch (opt) {
    case 's':
        cfg->endpoint = arg;
        return -1;
    case 'r':
        return parse_role(arg, cfg);
    case 't':
        cfg->threads = atoi(arg);
        if (cfg->threads < 1 || cfg->threads > 256) {
            omv_log_fatal("--threads: '%s' is not in [1, 256]", arg);
            return 2;
        }
        return -1;
    case 'H':
        cfg->hello_timeout_ms = (int)(atof(arg) * 1000);
        if (cfg->hello_timeout_ms <= 0) {
            omv_log_fatal("--hello-timeout: '%s' is not positive", arg);
            return 2;
        }
        return -1;
    case 'T':
    case 'R':
        return parse_seconds(opt, arg, cfg);
    case 'n':
        if (strlen(arg) >= 64) {
            omv_log_fatal("--name: '%s' is longer than 63 bytes", arg);
            return 2;
        }
        cfg->name = arg;
        return -1;
    case 'D':
        return parse_step_delay(arg, cfg);
    case 'X':
        cfg->slowdown = atof(arg);
        if (!(cfg->slowdown >= 1.0 && cfg->slowdown <= 1000.0)) {
            omv_log_fatal("--slowdown: '%s' is not in [1, 1000]", arg);
            return 2;
        }
        return -1;
    case 'O':
        cfg->no_overlap = 1;
        return -1;
    case 'M':
        cfg->no_shm = 1;
        return -1;
    case 'P':
        return parse_spin(arg, cfg);
    case 'l':
        if (omv_log_set_level_name(arg) < 0) {
            omv_log_fatal("--log-level: '%s' is not error, warn, info or debug", arg);
            return 2;
        }
        return -1;
    case 'h':
        usage(stdout);
        return 0;
    case 'V':
        printf("omnivore-worker %s (protocol %d)\n", OMV_VERSION, OMV_PROTOCOL_VERSION);
        return 0;
    default:
        usage(stderr);
        return 2;
    }
}

static const char *key_path, *server_key_path;
/* --nice (or OMNIVORE_NICE); NULL: the role's default. */
static const char *nice_arg;

/* Sets this worker's nice value: nice_arg's, or 19 for an evaluator (a trainer's is left as it
 * is). Done before the session starts a thread: on Linux the nice value is a thread's, and the
 * threads it starts take it from it. Returns -1 to go on, or the exit status 2 for a bad value. */
static int set_nice(const omv_session_config_t *cfg)
{
    int n = 19;
    if (nice_arg != NULL && nice_arg[0]) {
        long v;
        if (!long_in(nice_arg, -20, 19, &v)) {
            omv_log_fatal("--nice: '%s' is not a nice value from -20 to 19", nice_arg);
            return 2;
        }
        n = (int)v;
    } else if (cfg->role != OMV_ROLE_EVALUATOR) {
        return -1;
    }
    /* Threads the libraries started as they loaded (OpenBLAS's pool) are set one by one. */
    int r = setpriority(PRIO_PROCESS, 0, n) < 0 ? -errno : 0;
    DIR *dir = opendir("/proc/self/task");
    struct dirent *e;
    while (r == 0 && dir != NULL && (e = readdir(dir)) != NULL) {
        int tid = atoi(e->d_name);
        if (tid > 0 && setpriority(PRIO_PROCESS, (id_t)tid, n) < 0 && errno != ESRCH)
            r = -errno;
    }
    if (dir != NULL)
        closedir(dir);
    if (r < 0)
        omv_log_warn("cannot set nice value %d (%s): running at %d", n, omv_strerror(r),
                     getpriority(PRIO_PROCESS, 0));
    else if (n != 0)
        omv_log_info("nice value %d", n);
    return -1;
}

/* Reads the certificates of --key and --server-key (both or neither) into keys. Returns -1 to go
 * on, or the exit status 2. */
static int load_keys(omv_cert_t *mine, omv_cert_t *server, omv_link_curve_t *keys,
                     omv_session_config_t *cfg)
{
    if ((key_path == NULL || !key_path[0]) && (server_key_path == NULL || !server_key_path[0]))
        return -1;
    if (key_path == NULL || !key_path[0] || server_key_path == NULL || !server_key_path[0]) {
        fprintf(stderr, "omnivore-worker: CURVE needs both --key (ours) and --server-key (the "
                        "daemon's)\n");
        return 2;
    }
    char path[4096], err[OMV_CONFIG_ERR_MAX];
    omv_cert_path(key_path, path, sizeof(path));
    if (omv_cert_read(path, mine, err) < 0 || mine->secret_key[0] == '\0') {
        fprintf(stderr, "omnivore-worker: --key: %s\n",
                mine->secret_key[0] ? err : "not a secret certificate (NAME.key_secret)");
        return 2;
    }
    omv_cert_path(server_key_path, path, sizeof(path));
    if (omv_cert_read(path, server, err) < 0) {
        fprintf(stderr, "omnivore-worker: --server-key: %s\n", err);
        return 2;
    }
    *keys = (omv_link_curve_t){server->public_key, mine->public_key, mine->secret_key};
    cfg->curve = keys;
    return -1;
}

/* Reads the command line into cfg (which holds the defaults). Returns -1 to go on, or the
 * exit status. */
static int parse_args(int argc, char **argv, omv_session_config_t *cfg)
{
    static const struct option opts[] = {
        {"server", required_argument, NULL, 's'},
        {"role", required_argument, NULL, 'r'},
        {"threads", required_argument, NULL, 't'},
        {"hello-timeout", required_argument, NULL, 'H'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"server-timeout", required_argument, NULL, 'T'},
        {"retry", required_argument, NULL, 'R'},
        {"step-delay-ms", required_argument, NULL, 'D'},
        {"slowdown", required_argument, NULL, 'X'},
        {"name", required_argument, NULL, 'n'},
        {"no-overlap", no_argument, NULL, 'O'},
        {"no-shm", no_argument, NULL, 'M'},
        {"spin-us", required_argument, NULL, 'P'},
        {"nice", required_argument, NULL, 'N'},
        {"version", no_argument, NULL, 'V'},
        {"key", required_argument, NULL, 'k'},
        {"server-key", required_argument, NULL, 'K'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "s:r:t:l:n:k:hV", opts, NULL)) != -1) {
        if (c == 'N') {
            nice_arg = optarg;
            continue;
        }
        if (c == 'k' || c == 'K') {
            *(c == 'k' ? &key_path : &server_key_path) = optarg;
            continue;
        }
        int rc = parse_option(c, optarg, cfg);
        if (rc >= 0)
            return rc;
    }
    if (cfg->endpoint == NULL || cfg->endpoint[0] == '\0') {
        omv_log_fatal("no server: give --server ENDPOINT or set OMNIVORE_SERVER");
        return 2;
    }
    return -1;
}

/* The host of a tcp:// endpoint (tcp://[SOURCE;]HOST:PORT, HOST possibly in brackets) into
 * host[cap]. Returns 0, or -1 when there is no host to look up (another transport, a form for
 * ZeroMQ to judge). */
static int endpoint_host(const char *endpoint, char *host, size_t cap)
{
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return -1;
    const char *h = endpoint + 6, *semi = strchr(h, ';');
    if (semi)
        h = semi + 1;
    const char *end = h[0] == '[' ? strchr(h, ']') : strrchr(h, ':');
    if (h[0] == '[')
        h++;
    size_t n = end ? (size_t)(end - h) : strlen(h);
    if (n == 0 || n >= cap)
        return -1;
    memcpy(host, h, n);
    host[n] = '\0';
    return 0;
}

/* Looks up the daemon's host before anything else: a name that does not exist (worker.conf left
 * at its example) is a mistake that restarting will not fix, and must not read as "is omnivored
 * running?". A resolver that does not answer yet is waited for up to the hello timeout. Returns
 * -1 to go on, else the exit status: 2 for a name that does not resolve, 1 for a resolver that
 * did not answer. */
static int resolve_server(const omv_session_config_t *cfg)
{
    char host[256];
    if (endpoint_host(cfg->endpoint, host, sizeof(host)) < 0)
        return -1;
    int64_t deadline = omv_time_ms() + cfg->hello_timeout_ms;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    for (;;) {
        int e = getaddrinfo(host, NULL, &hints, &res);
        if (e == 0) {
            freeaddrinfo(res);
            return -1;
        }
        int lasting = e == EAI_NONAME || e == EAI_FAIL;
        if (lasting || omv_time_ms() >= deadline || stop_flag) {
            omv_log_fatal("cannot resolve '%s' (server %s): %s; set OMNIVORE_SERVER (worker.conf) "
                          "or --server to the head node's address, e.g. tcp://192.0.2.10:5555, "
                          "or tcp://127.0.0.1:5555 on the head node itself",
                          host, cfg->endpoint, gai_strerror(e));
            return lasting ? 2 : 1;
        }
        struct timespec ts = {0, 500 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int main(int argc, char **argv)
{
    omv_log_set_ident("omnivore-worker");
    omv_keep_memory_resident();
    omv_session_config_t cfg = {
        .endpoint = getenv("OMNIVORE_SERVER"),
        .role = OMV_ROLE_TRAINER,
        .threads = 1,
        .hello_timeout_ms = 30000,
        .heartbeat_ms = 1000,
        .server_timeout_ms = 10000,
        .retry_ms = 300000,
        /* OMNIVORE_OVERLAP=0 is --no-overlap for workers that others start (omnivorectl run). */
        .no_overlap = getenv("OMNIVORE_OVERLAP") && strcmp(getenv("OMNIVORE_OVERLAP"), "0") == 0,
        .no_shm = getenv("OMNIVORE_SHM") && strcmp(getenv("OMNIVORE_SHM"), "0") == 0,
    };
    key_path = getenv("OMNIVORE_KEY");
    server_key_path = getenv("OMNIVORE_SERVER_KEY");
    nice_arg = getenv("OMNIVORE_NICE");
    cfg.spin_us = 300;
    const char *spin = getenv("OMNIVORE_SPIN_US");
    int rc = spin && spin[0] ? parse_spin(spin, &cfg) : -1;
    if (rc >= 0)
        return rc;
    rc = parse_args(argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    rc = set_nice(&cfg);
    if (rc >= 0)
        return rc;
    static omv_cert_t mine, server;
    static omv_link_curve_t keys;
    mine.secret_key[0] = '\0';
    rc = load_keys(&mine, &server, &keys, &cfg);
    if (rc >= 0)
        return rc;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    rc = resolve_server(&cfg);
    if (rc >= 0)
        return rc;

    int r = omv_session_run(&cfg, &stop_flag);
    if (r == -EINTR) {
        omv_log_info("stopped by signal");
        return 0;
    }
    return r < 0 ? 1 : 0;
}
