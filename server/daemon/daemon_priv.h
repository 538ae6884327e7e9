/* The daemon's own state: what lives as long as the process. The job's state is the run's
 * (run.h), reached through `run`. Only the daemon's modules (daemon.c, schedule.c, messages.c,
 * commands.c, status.c) include this. */
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

/* A `checkpoint` request waiting for its checkpoint to be written. */
typedef struct {
    int id;                   /* the control socket's id for the client; -1: free */
    uint64_t run_id;          /* the job it asked about */
    uint64_t written, failed; /* the job's checkpoint counters when it asked */
    int64_t deadline_ms;
    int json; /* the answer's form */
} omv_pending_ckpt_t;

#define OMV_DAEMON_MAX_PENDING 8

/* A coordinator's order a backup keeps for later (uplink.c). */
#define OMV_PART_DEFER_MAX 64
typedef struct {
    omv_server_msg_t msg;
    void *payload;
    size_t bytes;
} omv_part_deferred_t;

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

    /* A shard server (role shard): its link to the coordinator. */
    int shard_role;
    uint32_t server_id; /* its id at the coordinator; 0: not registered */
    int64_t up_heard_ms, up_sent_ms, up_hello_ms;
    char advertise[256]; /* where its workers connect */
    char public_key[41]; /* its CURVE public key ("": none) */
    char coordinator_key[OMV_JOB_PATH_MAX + 256];
    /* A backup's part: its refusals (not answered), and the coordinator's orders that wait for
     * a cut's steps (omv_part_poll). */
    omv_refusals_t backup_refusals;
    int defer_on;
    uint64_t defer_clocks[OMV_WIRE_MAX_CLOCKS];
    uint32_t defer_n_groups;
    omv_part_deferred_t deferred[OMV_PART_DEFER_MAX];
    uint32_t n_deferred;
    double spin_until_s; /* the loop polls rather than sleeps until then ([daemon] spin_us) */
    char secret_key_path[OMV_JOB_PATH_MAX + 256];
};
