/* omnivorectl's commands and what they share: the help text, a request to the daemon that says
 * why it cannot be reached, and the flag that Ctrl-C sets for the commands that wait. Every
 * command returns the process's exit status (0 ok, 1 the daemon refused or the job failed,
 * 2 bad usage, 3 the daemon cannot be reached; run: 130 when interrupted). */
#pragma once

#include <stdio.h>

#include "strbuf.h"

#define OMV_CTL_DEFAULT_SOCKET "/run/omnivore/control.sock"
/* The most --set options one command takes (more is bad usage). */
#define OMV_CTL_MAX_SETS 32

/* A command: sock is the daemon's control socket (run makes its own); argv[0] is the
 * command's name; json is 1 when --json came before it. */
typedef int (*omv_ctl_command_fn)(const char *sock, int argc, char **argv, int json);

/* ctl_common.c */

/* Writes the help text to out. */
void omv_ctl_usage(FILE *out);

/* Says on stderr why the daemon at sock cannot be reached (r: the negative errno of
 * omv_control_request) and what to do about it. */
void omv_ctl_explain_unreachable(const char *sock, int r);

/* Sends line to the daemon at sock and reads the reply's body into body. An error reply or an
 * unreachable daemon is said on stderr. Returns the exit status: 0, 1 (the daemon answered with
 * an error) or 3 (it cannot be reached). */
int omv_ctl_request(const char *sock, const char *line, omv_strbuf_t *body);

/* SIGINT and SIGTERM set the interrupted flag from now on, and cut a sleep short (no
 * SA_RESTART). */
void omv_ctl_catch_interrupts(void);
int omv_ctl_interrupted(void);

/* ctl_submit.c: submit JOB.ini [--workers N] [--set S.K=V]... [--json] */
int omv_ctl_submit(const char *sock, int argc, char **argv, int json);

/* ctl_report.c: report [--out DIR] [--name BASE] [--json] */
int omv_ctl_report(const char *sock, int argc, char **argv, int json);

/* Fetches the daemon's history and writes DIR/BASE.csv and DIR/BASE.svg (dir NULL: here; base
 * NULL: the default for the job). The paths go to stdout (JSON with json), or to stderr when
 * quiet. Returns the exit status. */
int omv_ctl_write_report(const char *sock, const char *dir, const char *base, int json, int quiet);

/* ctl_run.c: run JOB.ini [--workers N] [--threads T] [--set S.K=V]... [--report DIR] [--json];
 * starts its own daemon, so sock is not used. */
int omv_ctl_run(const char *sock, int argc, char **argv, int json);

/* ctl_keygen.c: keygen [--roles trainer,evaluator] NAME [DIR]: writes DIR/NAME.key and
 * DIR/NAME.key_secret (the name "daemon" takes no roles). */
int omv_ctl_keygen(const char *sock, int argc, char **argv, int json);
/* Makes a key pair and writes it as dir/name.key(_secret) with roles (OMV_CERT_*). Returns 0
 * or a negative errno with the reason in err[OMV_CONFIG_ERR_MAX]. */
int omv_ctl_make_cert(const char *dir, const char *name, unsigned roles, char *err);
/* ctl_export.c: export CHECKPOINT|JOB.ini --out FILE [--state-dir DIR]; reads files only. */
int omv_ctl_export(const char *sock, int argc, char **argv, int json);

/* ctl_watch.c: watch [--interval S] [--count N] [COMMAND] [--json] */
int omv_ctl_watch(const char *sock, int argc, char **argv, int json);
