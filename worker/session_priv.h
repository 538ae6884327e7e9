/* Inside the worker's session: the state its files share (transport, workload, trainer,
 * evaluator, session). Each part is a struct that its own file owns. */
#pragma once

#include <signal.h>
#include <stdint.h>

#include "session.h"
#include "trainer.h"
#include "transport.h"
#include "wire.h"
#include "workload.h"

struct omv_session {
    const omv_session_config_t *cfg; /* borrowed */
    volatile sig_atomic_t *stop;     /* borrowed: nonzero when a signal asks us to stop */
    omv_transport_t tp;              /* the links to the daemon and the shard servers */
    /* What the last Welcome said. */
    int idle; /* registered with a daemon that has no job now */
    omv_jobspec_t job;
    uint32_t group; /* the compute group, as the daemon's Params say from step to step */
    uint64_t start_step;
    omv_workload_t work; /* the engine and data, built for job */
    omv_trainer_t tr;    /* a trainer's step and its buffers */
};
