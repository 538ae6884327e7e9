/* omnivorectl: talks to omnivored over its control socket. main() reads the options before the
 * command and finds it in one of two tables: the commands with a module of their own here (run,
 * watch, report, submit, help), and the daemon's own, which go to it as one line. */
#define OMV_LOG_TAG "omnivorectl"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "log.h"
#include "strbuf.h"
#include "util.h"

static int cmd_help(const char *sock, int argc, char **argv, int json)
{
    (void)sock;
    (void)argc;
    (void)argv;
    (void)json;
    omv_ctl_usage(stdout);
    return 0;
}

/* Commands that do more than forward a line. */
static const struct {
    const char *name;
    omv_ctl_command_fn fn;
} local_commands[] = {
    {"run", omv_ctl_run},       {"watch", omv_ctl_watch},   {"report", omv_ctl_report},
    {"help", cmd_help},         {"submit", omv_ctl_submit}, {"keygen", omv_ctl_keygen},
    {"export", omv_ctl_export},
};

/* What a daemon command takes besides --json. */
typedef enum {
    ARG_NONE,
    ARG_GROUPS, /* required: a number of groups, at most five digits */
    ARG_JOB,    /* optional: a job's id or name, shorter than 64 bytes, not starting blank */
} arg_kind_t;

/* The daemon's own commands, sent as "NAME [ARG] [--json]". */
static const struct {
    const char *name;
    arg_kind_t arg;
} daemon_commands[] = {
    {"status", ARG_NONE},     {"workers", ARG_NONE},  {"groups", ARG_NONE},
    {"metrics", ARG_NONE},    {"summary", ARG_NONE},  {"history", ARG_NONE},
    {"checkpoint", ARG_NONE}, {"shutdown", ARG_NONE}, {"regroup", ARG_GROUPS},
    {"optimizer", ARG_NONE},  {"jobs", ARG_NONE},     {"stop", ARG_JOB},
    {"reload", ARG_NONE},     {"servers", ARG_NONE},
};

static int takes(arg_kind_t kind, const char *word)
{
    if (kind == ARG_GROUPS)
        return strspn(word, "0123456789") == strlen(word) && strlen(word) < 6;
    if (kind == ARG_JOB)
        return strlen(word) < 64 && strspn(word, " \t") == 0;
    return 0;
}

/* Sends a daemon command (argv[0], the rest its argument and --json) and prints the reply's
 * body. Returns the exit status. */
static int forward(const char *sock, const char *cmd, arg_kind_t kind, int argc, char **argv,
                   int json)
{
    const char *arg = NULL;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--json") == 0 || strcmp(argv[a], "-j") == 0) {
            json = 1;
        } else if (arg == NULL && takes(kind, argv[a])) {
            arg = argv[a];
        } else {
            fprintf(stderr, "omnivorectl: %s takes no argument '%s'\n", cmd, argv[a]);
            return 2;
        }
    }
    if (kind == ARG_GROUPS && arg == NULL) {
        fprintf(stderr, "omnivorectl: regroup takes the number of groups, e.g. regroup 2\n");
        return 2;
    }
    char line[128];
    snprintf(line, sizeof(line), "%s%s%s%s", cmd, arg ? " " : "", arg ? arg : "",
             json ? " --json" : "");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int rc = omv_ctl_request(sock, line, &body);
    if (rc == 0)
        fputs(omv_strbuf_str(&body), stdout);
    omv_strbuf_fini(&body);
    return rc;
}

/* Reads the options before the command into sock and json. Returns -1 to go on with the command
 * at argv[*ret_at], or the exit status. */
static int global_options(int argc, char **argv, const char **sock, int *json, int *ret_at)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if ((strcmp(argv[i], "--socket") == 0 || strcmp(argv[i], "-s") == 0) && i + 1 < argc) {
            *sock = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "-j") == 0) {
            *json = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            omv_ctl_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "omnivorectl: unknown option '%s'\n", argv[i]);
            omv_ctl_usage(stderr);
            return 2;
        }
    }
    if (i == argc) {
        omv_ctl_usage(stderr);
        return 2;
    }
    *ret_at = i;
    return -1;
}

int main(int argc, char **argv)
{
    omv_log_set_ident("omnivorectl");
    const char *sock = getenv("OMNIVORE_SOCKET");
    if (sock == NULL || *sock == '\0')
        sock = OMV_CTL_DEFAULT_SOCKET;
    int json = 0, i = 0;
    int rc = global_options(argc, argv, &sock, &json, &i);
    if (rc >= 0)
        return rc;
    const char *cmd = argv[i];
    for (size_t k = 0; k < OMV_ARRAY_SIZE(local_commands); k++)
        if (strcmp(cmd, local_commands[k].name) == 0)
            return local_commands[k].fn(sock, argc - i, argv + i, json);
    for (size_t k = 0; k < OMV_ARRAY_SIZE(daemon_commands); k++)
        if (strcmp(cmd, daemon_commands[k].name) == 0)
            return forward(sock, cmd, daemon_commands[k].arg, argc - i, argv + i, json);
    fprintf(stderr, "omnivorectl: unknown command '%s'; see omnivorectl --help\n", cmd);
    return 2;
}
