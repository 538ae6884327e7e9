/* One worker's life: connect, register, receive the job, then train (pull, compute, push) or
 * evaluate snapshots, until the daemon says stop. */
#pragma once

#include "link.h"

#include <signal.h>

#include "wire.h"

typedef struct {
    const char *endpoint; /* borrowed */
    const char *name;     /* borrowed; what `omnivorectl workers` shows (NULL: none) */
    omv_role_t role;
    int threads;                    /* BLAS threads */
    int hello_timeout_ms;           /* how long to keep trying to register at first */
    int heartbeat_ms;               /* heartbeat period while waiting */
    int server_timeout_ms;          /* a daemon silent this long while we wait is taken for gone */
    int retry_ms;                   /* how long to keep trying to reach it again (0: forever) */
    int delay_min_ms, delay_max_ms; /* extra time per step, uniform in [min, max]: emulates a
                                     * slower device (experiments and tests); 0: none */
    double slowdown; /* >= 1: each step takes this many times its compute time, as a device
                      * that much slower would (experiments and tests); 0 or 1: none */
    int no_overlap;  /* the serial order: pull, compute, push (measurements and tests) */
    int no_shm;      /* the socket even on the daemon's host (measurements and tests) */
    int spin_us;     /* waiting for a daemon on this host: poll this long before sleeping */
    const omv_link_curve_t *curve; /* borrowed; CURVE keys, NULL: none */
} omv_session_config_t;

/* Runs the session to its end. When the daemon goes away (it restarts, or it declared us dead),
 * the session registers again, with backoff, for up to retry_ms, and carries on with the job.
 * Returns 0 when the daemon stopped us (job over), -EINTR when *stop became nonzero (a signal;
 * a trainer tells the daemon it leaves), or a negative errno after logging what went wrong. */
int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop);
