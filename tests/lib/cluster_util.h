/* Helpers for the integration tests (see cluster_util.c). */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#include "strbuf.h"

extern char test_dir[512];
extern char job_path[600], sock_path[600], endpoint[600];
/* The [model] section of the next write_job: an MLP unless a test says otherwise. */
extern const char *model_section;

const char *bin(const char *env);
void write_job(int workers, int epochs, const char *cluster_extra);
void setup(void);
void teardown(void);
pid_t spawn(char *const argv[]);
/* spawn with its stdout and stderr appended to log (NULL: the test's own). */
pid_t spawn_logged(char *const argv[], const char *log);
void sleep_ms(int ms);
pid_t start_daemon(void);
/* omnivored with these arguments (argv[0] its path); returns once its control socket at
 * sock_path answers. */
pid_t start_daemon_argv(char *const argv[]);
/* start_daemon_argv with its output appended to log (NULL: the test's own). */
pid_t start_daemon_logged(char *const argv[], const char *log);
pid_t start_worker(const char *role);
/* An evaluator, once the daemon has it (status evaluator_alive): a short job whose trainers
 * came first can otherwise end before it registers, done without a final test accuracy. */
pid_t start_evaluator(void);
/* A worker that adds delay_ms ("N" or "MIN-MAX") to every step, and takes a daemon silent
 * for 2 s for gone. */
pid_t start_worker_slow(const char *role, const char *delay_ms);
/* A line of /proc/PID/status ("VmRSS", "VmHWM") in KiB (fails the test when absent). */
long proc_kib(pid_t pid, const char *key);
/* A number from the daemon's status. */
double status_field(const char *key);
/* Polls status until key >= at_least (fails the test after timeout_ms); returns the value. */
double wait_status(const char *key, double at_least, int timeout_ms);
/* A key:value body's text value into out[cap]. Returns 0 or -1 when absent. */
int text_field(const char *body, const char *key, char *out, size_t cap);
double field(const char *body, const char *key);
int has_text(const char *body, const char *text);
double json_number(const char *json, const char *key);
int run_ctl(char *out, size_t cap, const char *extra);
/* Runs the real `ENV omnivorectl ARGS` (env may be NULL) and returns its exit status; stdout and
 * stderr land in out. */
int run_omnivorectl(char *out, size_t cap, const char *env, const char *args);
/* The same with --socket sock_path before args. */
int ctl_sock(char *out, size_t cap, const char *args);
/* SIGTERM to each worker, and each must exit 0 (they leave, or stop waiting for a daemon). */
void stop_workers(const pid_t *pids, int n);
/* Waits for pid and fails the test unless it exited with status 0; what names it. */
void expect_exit_0(pid_t pid, const char *what);
/* A control request that must succeed; the reply lands in body. */
void control(const char *line, omv_strbuf_t *body);
/* `shutdown` over the control socket, and the daemon pid must exit 0. */
void shutdown_daemon(pid_t d);
/* Polls status until the job is done (fails on "failed" or after timeout_ms); body keeps the
 * last status; returns its test_accuracy. */
double wait_done(omv_strbuf_t *body, int timeout_ms);

/* The job's model: conv, batch norm and fc layers (mixed.model in the test's folder). */
void use_mixed_model(void);
