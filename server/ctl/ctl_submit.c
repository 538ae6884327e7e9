/* omnivorectl submit: queues a job file on a running daemon, which reads the file itself; the
 * path is made absolute and --workers and --set travel as overrides on the request line. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

int omv_ctl_submit(const char *sock, int argc, char **argv, int json)
{
    const char *workers_arg = NULL;
    const char *sets[OMV_CTL_MAX_SETS];
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
        } else if (c == 'S' && n_sets < OMV_CTL_MAX_SETS) {
            sets[n_sets++] = optarg;
        } else if (c == 'j') {
            json = 1;
        } else {
            omv_ctl_usage(stderr);
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
        fprintf(stderr,
                "omnivorectl: %s: the control protocol cannot carry a path with spaces; "
                "move or link the job file\n",
                path);
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
    rc = omv_ctl_request(sock, omv_strbuf_str(&line), &body);
    if (rc == 0)
        fputs(omv_strbuf_str(&body), stdout);
out:
    omv_strbuf_fini(&line);
    omv_strbuf_fini(&body);
    return rc;
}
