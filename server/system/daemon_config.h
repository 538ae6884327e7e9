/* omnivored's configuration file: the settings, the table of its keys, and reading it again
 * while the daemon runs. */
#pragma once

#include <stddef.h>
#include <stdint.h>

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

/* Reloading: the file omnivored was started with, the --log-level that keeps precedence over
 * it, and how reloads went, for status. */
typedef struct {
    char config_path[OMV_JOB_PATH_MAX]; /* "": started without --config */
    char cli_log_level[16];             /* "": none given */
    uint64_t reloads_total, reloads_failed_total;
} omv_daemon_reload_t;

/* Re-reads the config file omnivored was started with and applies what may change while running
 * (log_level; a --log-level flag keeps precedence). A broken file changes nothing. Returns 0 or a
 * negative errno; why[cap] says what was applied, or what was wrong (also logged, and counted in
 * status). */
int omv_daemon_config_reload(omv_daemon_reload_t *self, omv_daemon_config_t *cfg, char *why,
                             size_t cap);
