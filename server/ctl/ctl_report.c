/* omnivorectl report: fetches the daemon's history and writes the training report's files (the
 * report itself, CSV and SVG, is report.c's); run --report writes them the same way. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "control.h"
#include "ctl.h"
#include "report.h"
#include "util.h"

int omv_ctl_write_report(const char *sock, const char *dir, const char *base, int json, int quiet)
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
        omv_ctl_explain_unreachable(sock, r);
        rc = 3;
    } else if (omv_report_parse(&rep, omv_strbuf_str(&body), err, sizeof(err)) < 0) {
        fprintf(stderr,
                "omnivorectl: the daemon's history cannot be read: %s (is omnivored as "
                "new as omnivorectl?)\n",
                err);
        rc = 1;
    } else {
        if (base == NULL)
            omv_report_default_base(rep.job, name, sizeof(name));
        else
            omv_strlcpy(name, base, sizeof(name));
        if (omv_report_write(&rep, dir ? dir : ".", name, csv, svg, sizeof(csv), err, sizeof(err)) <
            0) {
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

int omv_ctl_report(const char *sock, int argc, char **argv, int json)
{
    const char *dir = ".", *base = NULL;
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"name", required_argument, NULL, 'N'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
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
            omv_ctl_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "omnivorectl report: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (base && (*base == '\0' || strchr(base, '/'))) {
        fprintf(stderr,
                "omnivorectl report: --name '%s' is a file name without folders (give "
                "the folder with --out)\n",
                base);
        return 2;
    }
    return omv_ctl_write_report(sock, dir, base, json, 0);
}
