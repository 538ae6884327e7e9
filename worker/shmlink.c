/* A trainer's shared-memory link with a daemon on its host, and the decision of what goes that
 * way rather than over the daemon's socket. */
#define OMV_LOG_TAG "worker"
#include "shmlink.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

void omv_shmlink_init(omv_shmlink_t *self, const omv_session_config_t *cfg)
{
    *self = (omv_shmlink_t){.cfg = cfg, .conn = -1};
}

void omv_shmlink_fini(omv_shmlink_t *self)
{
    omv_shmlink_detach(self);
    free(self->held);
    self->held = NULL;
}

void omv_shmlink_detach(omv_shmlink_t *self)
{
    omv_shm_unmap(self->maps.params, self->bytes);
    omv_shm_unmap(self->maps.grads, self->bytes);
    omv_shm_unmap((void *)self->maps.model, self->bytes);
    if (self->conn >= 0)
        close(self->conn);
    self->conn = -1;
    self->on = 0;
    if (self->held) /* what the last registration held back is its own */
        self->held->n = self->held->used = 0;
    self->maps = (omv_shm_maps_t){NULL, NULL, NULL};
    self->bytes = 0;
}

void omv_shmlink_attach(omv_shmlink_t *self, const omv_welcome_t *w, uint32_t worker_id)
{
    omv_shmlink_detach(self);
    const omv_session_config_t *cfg = self->cfg;
    if (cfg->role != OMV_ROLE_TRAINER || w->idle || w->shm_socket[0] == '\0' || cfg->no_shm)
        return;
    char why[OMV_WIRE_REASON_MAX];
    omv_shm_hello_t h = {.worker_id = worker_id, .token = w->shm_token};
    size_t bytes = (size_t)w->job.param_count * sizeof(float);
    omv_shm_maps_t maps;
    int c = omv_shm_attach(w->shm_socket, &h, bytes, 2000, &maps, why);
    if (c < 0) {
        if (!self->warned)
            omv_log_info("no shared memory with the daemon (%s): parameters and gradients "
                         "travel over %s",
                         why, cfg->endpoint);
        self->warned = 1;
        return;
    }
    self->conn = c;
    if (self->held == NULL)
        self->held = calloc(1, sizeof(*self->held));
    self->on = self->held != NULL; /* without it, every envelope keeps the socket */
    self->maps = maps;
    self->bytes = bytes;
    omv_log_info("worker %u: parameters and gradients go through shared memory with the daemon",
                 worker_id);
}

/* The connection is closed or broken (err): envelopes go over the socket, and the daemon, which
 * closed it or sees it closed, sends parameters that way too. Said once. */
static void lost(omv_shmlink_t *self, int err, uint32_t worker_id)
{
    self->on = 0;
    if (!self->warned)
        omv_log_warn("worker %u: the shared-memory connection with the daemon is gone (%s): "
                     "parameters and gradients travel over %s",
                     worker_id, omv_strerror(err), self->cfg->endpoint);
    self->warned = 1;
}

/* Whether m, for the daemon, goes on the connection: a pull, a push whose values are in the
 * segment (omv_shmlink_push_wire said so for its step), or our Leave (there it comes before the
 * connection closes as we exit; over the socket the daemon could see the close first and take
 * us for dead). */
static int goes_here(const omv_shmlink_t *self, const omv_msg_t *m)
{
    return self->on && (m->type == OMV_MSG_PULL || m->type == OMV_MSG_LEAVE ||
                        (m->type == OMV_MSG_PUSH && m->u.push.wire == OMV_WIRE_SHM));
}

/* The daemon wakes once or twice a step for what is held, not for each envelope while we
 * compute (on 2 cores, each wake-up takes a core from a trainer). */
int omv_shmlink_hold(omv_shmlink_t *self, const omv_msg_t *m, omv_link_t *daemon,
                     uint32_t worker_id)
{
    if (!goes_here(self, m))
        return 0;
    if (omv_shm_batch_add(self->held, m) == -ENOSPC) {
        omv_shmlink_flush(self, daemon, worker_id);
        omv_shm_batch_add(self->held, m);
    }
    if (m->type == OMV_MSG_LEAVE ||
        (m->type == OMV_MSG_PUSH && m->u.push.count >= OMV_SHM_WAKE_PARAMS))
        omv_shmlink_flush(self, daemon, worker_id);
    return 1;
}

void omv_shmlink_flush(omv_shmlink_t *self, omv_link_t *daemon, uint32_t worker_id)
{
    omv_shm_batch_t *b = self->held;
    if (b == NULL || b->n == 0)
        return;
    int r = self->on ? omv_shm_batch_flush(self->conn, b) : -ENOTCONN;
    if (r >= 0)
        self->sent_ms = omv_time_ms();
    if (r < 0 && r != -EAGAIN && self->on)
        lost(self, r, worker_id);
    /* The envelopes the connection did not take carry no values (omv_shm_batch_add takes no
     * other), so their bytes are what the socket would carry for them: they go as they are. */
    for (uint32_t i = 0, at = 0; i < b->n; at += b->len[i++])
        omv_link_send_raw(daemon, b->buf + at, b->len[i]);
    b->n = b->used = 0;
}

int omv_shmlink_recv(omv_shmlink_t *self, omv_msg_t *m, char *why, uint32_t worker_id)
{
    int r = omv_shm_recv_msg(self->conn, m, why);
    if (r == 0 && (m->type != OMV_MSG_PARAMS || m->u.params.wire != OMV_WIRE_SHM)) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "%s on the shared-memory connection: only shared-memory parameters come that "
                 "way",
                 omv_msg_name(m->type));
        return -EPROTO;
    }
    if (r == 0 || r == -EPROTO || r == -EAGAIN || r == -EINTR)
        return r;
    lost(self, r, worker_id);
    return -EAGAIN;
}

/* A trainer waits for its parameters about 0.3 ms a step (the daemon's update and the group's
 * slowest member); asleep, it would wake through the scheduler and, on a virtual machine, an
 * idle vCPU's exit, about 0.1 ms more each way. While it polls its core is taken by nobody else
 * who needs it: sched_yield lets the daemon and the other trainers run there. */
int omv_shmlink_spin(omv_shmlink_t *self, omv_msg_t *m, char *why, uint32_t worker_id)
{
    double until = omv_time_s() + self->cfg->spin_us * 1e-6;
    for (;;) {
        int r = omv_shmlink_recv(self, m, why, worker_id);
        if (r != -EAGAIN || !self->on || omv_time_s() >= until)
            return r;
        sched_yield();
    }
}

int omv_shmlink_step(omv_shmlink_t *self, const omv_params_t *p, int first, uint32_t worker_id)
{
    int shm = p->wire == OMV_WIRE_SHM;
    if (!first && (shm != self->step_shm || (shm && (int)p->shared != self->step_shared))) {
        omv_log_error("daemon sent a step's parameters partly through shared memory, or partly "
                      "in place");
        return -EPROTO;
    }
    if (shm && (self->maps.params == NULL || (p->shared && !self->maps.model))) {
        omv_log_error("daemon sent parameters through shared memory we do not have");
        return -EPROTO;
    }
    if (!first)
        return 0;
    if (!shm && self->step_shm && !self->warned) {
        omv_log_warn("worker %u: the daemon no longer uses our shared memory: parameters and "
                     "gradients travel over %s",
                     worker_id, self->cfg->endpoint);
        self->warned = 1;
    }
    int changed = shm != self->step_shm;
    self->step_shm = shm;
    self->step_shared = shm && p->shared;
    if (self->step_shared && !self->shared_said)
        omv_log_info("worker %u: reads the parameters in place, in the daemon's own segment "
                     "(one group: nothing is copied)",
                     worker_id);
    self->shared_said |= self->step_shared;
    return changed;
}

const float *omv_shmlink_params(const omv_shmlink_t *self, const float *own)
{
    return self->step_shared ? self->maps.model : self->step_shm ? self->maps.params : own;
}

float *omv_shmlink_grads(const omv_shmlink_t *self, float *own)
{
    return self->step_shm ? self->maps.grads : own;
}

uint32_t omv_shmlink_push_wire(const omv_shmlink_t *self, uint32_t wire)
{
    return self->step_shm ? OMV_WIRE_SHM : wire;
}
