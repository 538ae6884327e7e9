/* omnivored's core: one event loop that owns the worker endpoint, the control socket, the
 * member records, the job queue and the current job's run (run.h), which owns the model's
 * shards, the compute groups, the job's progress and its evaluation schedule. */
#pragma once

#include <signal.h>

#include "daemon_config.h"
#include "job.h"

typedef struct omv_daemon omv_daemon_t;

/* Binds the endpoint and the control socket and lays out the job's model (job is copied; its
 * file's text, as it was parsed, is kept for checkpoints). With job NULL the daemon starts idle:
 * workers register and wait, and jobs come with `submit`. Returns NULL with errno set after
 * logging what failed. Caller owns; omv_daemon_destroy. */
omv_daemon_t *omv_daemon_new(const omv_daemon_config_t *cfg, const omv_job_t *job,
                             const char *job_path, const char *job_text);
void omv_daemon_destroy(omv_daemon_t **self_p);

/* SIGHUP: when *flag becomes nonzero, the loop re-reads config_path (may be empty: nothing to
 * reload) and applies the keys that may change at runtime (log_level); cli_log_level (may be
 * NULL) is a --log-level given on the command line, which keeps precedence over the file. */
void omv_daemon_set_reload(omv_daemon_t *self, volatile sig_atomic_t *flag, const char *config_path,
                           const char *cli_log_level);

/* Runs the loop until *stop is set (a signal) or a client asks for shutdown; stops the workers
 * on the way out. Returns 0 or a negative errno. */
int omv_daemon_run(omv_daemon_t *self, volatile sig_atomic_t *stop);
