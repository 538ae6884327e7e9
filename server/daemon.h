/* omnivored's core: one event loop that owns the worker endpoint, the control socket, the
 * member records, the job queue and the current job's run (run.h), which owns the model's
 * shards, the compute groups, the job's progress and its evaluation schedule. */
#pragma once

#include <signal.h>

#include "config.h"
#include "job.h"

typedef struct {
    char endpoint[256];         /* worker endpoint to bind */
    char control[108];          /* control socket path */
    char job[OMV_JOB_PATH_MAX]; /* job file to run */
    char log_level[16];
    char state_dir[OMV_JOB_PATH_MAX]; /* checkpoints live under it */
    int64_t max_message_bytes;        /* a frame limit on the worker endpoint; 0: from the job */
    char admin_group[64];             /* its members may change the daemon; "": none */
    char checkpoint_root[OMV_JOB_PATH_MAX]; /* jobs may checkpoint there too; "": none */
    char curve[8];                          /* auto (tcp only), yes or no */
    char secret_key[OMV_JOB_PATH_MAX];      /* the daemon's secret certificate */
    char allow_dir[OMV_JOB_PATH_MAX];       /* public certificates of admitted workers */
    char role[16];                          /* coordinator (the default) or shard */
    char coordinator[256];                  /* role shard: the coordinator's worker endpoint */
    char advertise[256];                    /* role shard: the endpoint workers are told */
    char coordinator_key[OMV_JOB_PATH_MAX]; /* role shard: the coordinator's public certificate */
    double coordinator_timeout_s;           /* role shard: a coordinator this silent is gone */
    double server_timeout_s;                /* a shard server this silent is gone */
    int64_t spin_us; /* after a local trainer's envelope, poll this long before sleeping */
    int once;        /* not a config key (omnivored --once): run the given job only, refuse
                      * submissions, and tell the workers to exit when it ends */
} omv_daemon_config_t;

extern const omv_config_entry_t omv_daemon_table[];
extern const size_t omv_daemon_table_len;

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
