/* The worker's session: registration (and registering again when the daemon goes away), then
 * the trainer loop or the evaluator loop. */
#define OMV_LOG_TAG "worker"
#include "session.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "blas.h"
#include "evaluator.h"
#include "log.h"
#include "session_priv.h"
#include "util.h"

/* Frees what was built for the last job. */
static void release_job(omv_session_t *s)
{
    omv_trainer_release(&s->tr);
    omv_workload_release(&s->work);
}

/* One registration attempt, and what its Welcome says. Returns as omv_transport_hello, or as
 * omv_transport_attach. */
static int handshake(omv_session_t *s, int64_t deadline_ms, const omv_transport_retry_t *retry)
{
    omv_welcome_t w;
    int r = omv_transport_hello(&s->tp, deadline_ms, retry, &w);
    if (r != 0)
        return r;
    s->idle = w.idle;
    if (s->idle)
        return 0;
    s->group = w.group;
    s->start_step = w.start_step;
    if (s->work.prepared && !omv_workload_same_job(&s->job, &w.job)) {
        /* A daemon that runs jobs one after another: the next one may have another model or
         * other data, so the engine is built again from the new spec. */
        omv_log_info("the daemon runs job '%s' now (was '%s'): building its model", w.job.name,
                     s->job.name);
        release_job(s);
    }
    s->job = w.job;
    return omv_transport_attach(&s->tp, &w);
}

/* Registers, trying again with backoff until deadline_ms (0: forever). Returns 0,
 * OMV_WAIT_DONE, or a negative errno. */
static int register_with_backoff(omv_session_t *s, int64_t deadline_ms)
{
    omv_transport_retry_t retry = {0, 100};
    for (;;) {
        int r = omv_transport_connect(&s->tp);
        if (r < 0)
            return r;
        r = handshake(s, deadline_ms, &retry);
        if (r != -ETIMEDOUT)
            return r;
        r = omv_transport_backoff(&s->tp, deadline_ms, &retry);
        if (r < 0)
            return r;
    }
}

/* Registered while the daemon has no job: heartbeats until it says a job starts (Stop with
 * reconnect: register again to get it) or that we are not needed (Stop). */
static int idle(omv_session_t *s)
{
    omv_log_info("registered as worker %u; the daemon has no job yet: waiting for one",
                 s->tp.worker_id);
    for (;;) {
        omv_msg_t m;
        int r = omv_transport_wait(&s->tp, &m, 0);
        if (r != 0)
            return r;
        omv_log_warn("ignoring %s while there is no job", omv_msg_name(m.type));
    }
}

int omv_session_run(const omv_session_config_t *cfg, volatile sig_atomic_t *stop)
{
    omv_session_t s;
    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    s.stop = stop;
    omv_transport_init(&s.tp, cfg, stop);
    omv_trainer_init(&s.tr);
    /* The engine splits each batch over cfg->threads threads of its own; BLAS runs one thread
     * per call so that the two pools do not fight (measured: bench/bench_net.c). */
    omv_blas_set_threads(1);
    int64_t deadline = omv_time_ms() + cfg->hello_timeout_ms;
    int r;
    for (;;) {
        r = register_with_backoff(&s, deadline);
        if (r != 0)
            break;
        if (s.idle)
            r = idle(&s);
        else if (cfg->role == OMV_ROLE_TRAINER)
            r = omv_trainer_run(&s);
        else
            r = omv_evaluator_run(&s);
        if (r != OMV_WAIT_LOST)
            break;
        /* The daemon is gone or forgot us: find it again, for up to retry_ms. */
        omv_transport_drop(&s.tp);
        deadline = cfg->retry_ms > 0 ? omv_time_ms() + cfg->retry_ms : 0;
    }
    if (r == -EINTR) /* say goodbye, so that our group does not wait for our timeout */
        omv_transport_leave(&s.tp, "stopped by signal");
    if (r == OMV_WAIT_DONE)
        r = 0;
    release_job(&s);
    omv_transport_fini(&s.tp);
    return r;
}
