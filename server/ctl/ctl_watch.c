/* omnivorectl watch: one of the daemon's replies (status by default), asked for again every
 * interval and shown in place on a terminal, until Ctrl-C or a number of times. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "control.h"
#include "ctl.h"
#include "util.h"

/* What watch's command line asked for. */
typedef struct {
    double interval; /* seconds between requests */
    long count;      /* requests to make; 0: until interrupted */
    const char *what;
    int json;
} watch_args_t;

/* Reads watch's command line into a. Returns -1 to go on, or the exit status. */
static int parse_args(int argc, char **argv, watch_args_t *a)
{
    static const struct option opts[] = {
        {"interval", required_argument, NULL, 'i'},
        {"count", required_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    /* '+': the options end at the command, whose own arguments are refused below. */
    while ((c = getopt_long(argc, argv, "+i:n:j", opts, NULL)) != -1) {
        char *end;
        if (c == 'i') {
            a->interval = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(a->interval >= 0.05 && a->interval <= 86400)) {
                fprintf(stderr,
                        "omnivorectl watch: --interval: '%s' is not a number of seconds "
                        "from 0.05 to 86400\n",
                        optarg);
                return 2;
            }
        } else if (c == 'n') {
            a->count = strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || a->count < 1) {
                fprintf(stderr, "omnivorectl watch: --count: '%s' is not a positive number\n",
                        optarg);
                return 2;
            }
        } else if (c == 'j') {
            a->json = 1;
        } else {
            omv_ctl_usage(stderr);
            return 2;
        }
    }
    if (optind < argc)
        a->what = argv[optind++];
    static const char *const watchable[] = {"status", "workers", "servers",
                                            "groups", "metrics", "summary"};
    int ok = 0;
    for (size_t k = 0; k < OMV_ARRAY_SIZE(watchable); k++)
        ok |= strcmp(a->what, watchable[k]) == 0;
    if (!ok || optind < argc) {
        fprintf(stderr,
                "omnivorectl watch: %s '%s'; watch status, workers, servers, groups, metrics or "
                "summary\n",
                ok ? "unexpected argument" : "cannot watch", ok ? argv[optind] : a->what);
        return 2;
    }
    return -1;
}

/* Sleeps the whole interval unless a signal ends it. Returns 0 when interrupted. */
static int sleep_interval(double interval)
{
    struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
    while (!omv_ctl_interrupted() && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    return !omv_ctl_interrupted();
}

/* Shows one refresh: on a terminal over the last one, else after it; a header (unless json),
 * then the reply, or why there was none (r: omv_control_request's result). */
static void show(const watch_args_t *a, const char *sock, const char *stamp, int r,
                 const omv_strbuf_t *body, int tty, long n)
{
    if (tty)
        fputs("\033[H\033[2J", stdout); /* cursor home, clear the screen */
    else if (n > 0)
        fputc('\n', stdout);
    if (!a->json)
        printf("# watch\ncommand:%s\nsocket:%s\ntime:%s\ninterval_seconds:%g\n", a->what, sock,
               stamp, a->interval);
    if (r == 0) {
        fputs(omv_strbuf_str(body), stdout);
    } else {
        /* The daemon went away or refused: say so and keep watching for its return. */
        if (r == -EREMOTEIO)
            printf("error:%s\n", omv_strbuf_str(body));
        else
            printf("error:omnivored does not answer (%s); still watching\n", omv_strerror(r));
    }
    if (tty && !a->json)
        printf("\n(every %g s; Ctrl-C to quit)\n", a->interval);
    fflush(stdout);
}

int omv_ctl_watch(const char *sock, int argc, char **argv, int json)
{
    watch_args_t a = {2.0, 0, "status", json};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    char line[64];
    snprintf(line, sizeof(line), "%s%s", a.what, a.json ? " --json" : "");

    omv_ctl_catch_interrupts();
    int tty = isatty(STDOUT_FILENO);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    rc = 0;
    int reached = 0;
    for (long n = 0; !omv_ctl_interrupted() && (a.count == 0 || n < a.count); n++) {
        if (n > 0 && !sleep_interval(a.interval))
            break;
        char stamp[64];
        time_t now = time(NULL);
        struct tm tm;
        strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
        int r = omv_control_request(sock, line, &body, 10000);
        if (r < 0 && r != -EREMOTEIO && !reached) {
            /* Never reached: there is nothing to watch. */
            omv_ctl_explain_unreachable(sock, r);
            rc = 3;
            break;
        }
        reached = 1;
        show(&a, sock, stamp, r, &body, tty, n);
    }
    omv_strbuf_fini(&body);
    return rc;
}
