/* One worker's life: connect, register, receive the job, then train (pull, compute, push) or
 * evaluate snapshots, until the daemon says stop. */
#pragma once

#include <signal.h>

#include "wire.h"

typedef struct {
    const char *endpoint; /* borrowed */
    omv_role_t role;
    int threads;          /* BLAS threads */
    int hello_timeout_ms; /* how long to wait for the daemon's Welcome */
    int heartbeat_ms;     /* heartbeat period while waiting */
} omv_session_config_t;

/* Runs the session to its end. Returns 0 when the daemon stopped us (job over), -EINTR when
 * *stop became nonzero (a signal), or a negative errno after logging what went wrong. */
int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop);
