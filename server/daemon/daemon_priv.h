/* The daemon's own state: what lives as long as the process. The job's state is the run's
 * (run.h), reached through `run`. Only the daemon's modules (daemon/, control/, jobs/) include
 * this. */
#pragma once

#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include "control.h"
#include "daemon.h"
#include "jobs.h"
#include "local.h"
#include "members.h"
#include "refusals.h"
#include "router.h"
#include "run.h"
#include "servers.h"
#include "uplink.h"

/* A `checkpoint` request waiting for its checkpoint to be written. */
typedef struct {
    int id;                   /* the control socket's id for the client; -1: free */
    uint64_t run_id;          /* the job it asked about */
    uint64_t written, failed; /* the job's checkpoint counters when it asked */
    int64_t deadline_ms;
    int json; /* the answer's form */
} omv_pending_ckpt_t;

#define OMV_DAEMON_MAX_PENDING 8

struct omv_daemon {
    omv_daemon_config_t cfg;
    omv_router_t *router;
    omv_control_t *control;
    omv_refusals_t refusals;
    omv_members_t *members;
    omv_jobs_t *jobs;
    omv_run_t *run; /* the current job; NULL when none was loaded or it could not be */
    double created_s;
    gid_t admin_gid; /* [security] admin_group; (gid_t)-1: none */
    int curve;       /* CURVE on the worker endpoint: only keys in allow_dir connect */
    char allow_dir[OMV_JOB_PATH_MAX];
    int shutdown;        /* asked for over the control socket */
    int64_t stopping_ms; /* when the way out began (0: running) */
    int64_t expire_ms;   /* the last look for silent peers (omv_messages_expire) */

    /* Reloading on SIGHUP. */
    volatile sig_atomic_t *reload_flag;
    omv_daemon_reload_t reload;

    omv_pending_ckpt_t pending[OMV_DAEMON_MAX_PENDING];

    omv_local_t local; /* shared memory for the trainers on this host */

    omv_servers_t servers; /* a coordinator's shard servers */
    int load_degraded;     /* the next run loaded is one made again after a failover */

    /* A shard server (role shard): its link to the coordinator, and a backup's refusals (not
     * answered: its primary answers them). */
    int shard_role;
    omv_uplink_t *uplink;
    omv_refusals_t backup_refusals;
    double spin_until_s; /* the loop polls rather than sleeps until then ([daemon] spin_us) */
    char secret_key_path[OMV_JOB_PATH_MAX + 256];
    char coordinator_key[OMV_JOB_PATH_MAX + 256];
};
