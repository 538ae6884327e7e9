/* The shard set: laying out the shards, their executors, their replies, whole-model copies. */
#define OMV_LOG_TAG "daemon"
#include "shardset.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "shm.h"
#include "util.h"

/* How long a whole-model copy waits for a shard's acknowledgement. */
#define ACK_TIMEOUT_MS 10000
/* How long the set waits at the end for ZeroMQ to let go of parameters on their way out. */
#define IN_FLIGHT_WAIT_MS 2000

static int start_executors(omv_shardset_t *self)
{
    /* A small shard's work takes less time than waking a thread (shard_thread.h): the event
     * loop's thread runs it. */
    for (uint32_t s = 0; s < self->n_shards; s++) {
        int own = self->shards[s].count >= OMV_SHARD_THREAD_MIN_PARAMS;
        self->threads[s] = omv_shard_thread_new(self->router, &self->shards[s], s, own);
        if (self->threads[s] == NULL) {
            int r = -errno;
            omv_log_error("cannot start the thread of shard %u: %s", s, omv_strerror(r));
            return r;
        }
        self->threaded += (uint32_t)own;
    }
    return 0;
}

/* The model segment's size: the parameters (a byte at least, as a mapping needs). */
static size_t model_bytes(const omv_shardset_t *self)
{
    return (self->param_count ? self->param_count : 1) * sizeof(float);
}

omv_shardset_t *omv_shardset_new(omv_router_t *router, omv_refusals_t *refusals,
                                 const omv_model_layout_t *layout, uint32_t n_shards,
                                 uint32_t max_groups, uint64_t seed, int adam)
{
    omv_shardset_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->model_fd = -1;
    self->router = router;
    self->refusals = refusals;
    size_t n = layout->param_count;
    self->param_count = n;
    _Static_assert(OMV_MODEL_MAX_SHARDS == OMV_WIRE_MAX_SHARDS, "a model's shards fit the wire");
    self->n_shards = omv_model_shard_layout(layout, n_shards, self->offsets);
    /* The parameters live in the model segment that local workers read them from; where
     * no memfd can be made, in our own memory (local workers then get copies). */
    void *map = NULL;
    self->model_fd = omv_shm_create_model(model_bytes(self), &map);
    self->params = self->model_fd >= 0 ? map : malloc(n * sizeof(float));
    if (self->model_fd < 0)
        omv_log_warn("no model segment (%s): workers on this host get copies of the parameters",
                     omv_strerror(self->model_fd));
    self->shards = calloc(self->n_shards, sizeof(omv_shard_t));
    self->threads = calloc(self->n_shards, sizeof(*self->threads));
    self->gather_params = malloc(n * sizeof(float));
    self->gather_velocity = malloc(n * sizeof(float));
    self->adam = adam;
    if (adam)
        self->gather_second = malloc(n * sizeof(float));
    int r = -ENOMEM;
    if (!self->params || !self->shards || !self->threads || !self->gather_params ||
        !self->gather_velocity || (adam && !self->gather_second))
        goto fail;
    omv_model_init(layout, self->params, seed);
    for (uint32_t s = 0; s < self->n_shards; s++) {
        uint32_t off = self->offsets[s];
        r = omv_shard_init(&self->shards[s], self->params + off, off, self->offsets[s + 1] - off,
                           max_groups);
        if (r == 0)
            omv_shard_set_state(&self->shards[s], layout->state_offset);
        if (r == 0 && adam)
            r = omv_shard_use_adam(&self->shards[s]);
        if (r < 0)
            goto fail;
    }
    r = start_executors(self);
    if (r < 0)
        goto fail;
    return self;
fail:
    omv_shardset_destroy(&self);
    errno = -r;
    return NULL;
}

/* Whether ZeroMQ still holds a snapshot of some shard's parameters (on its way to a worker). */
static int snapshots_in_flight(const omv_shardset_t *self)
{
    for (uint32_t s = 0; s < self->n_shards; s++)
        if (self->threads[s] && omv_shard_thread_in_flight(self->threads[s]))
            return 1;
    return 0;
}

void omv_shardset_destroy(omv_shardset_t **self_p)
{
    omv_shardset_t *self = *self_p;
    if (self == NULL)
        return;
    /* Executors end first; parameters still on their way out through ZeroMQ point into their
     * snapshots, which are freed once ZeroMQ lets go (it sends or drops them at once). */
    for (uint32_t s = 0; self->threads && s < self->n_shards; s++)
        omv_shard_thread_stop(self->threads[s]);
    omv_router_drop_pipes(self->router);
    int leak = 0;
    if (self->threads) {
        int64_t deadline = omv_time_ms() + IN_FLIGHT_WAIT_MS;
        while (snapshots_in_flight(self) && omv_time_ms() < deadline) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        leak = snapshots_in_flight(self);
        if (leak)
            omv_log_warn("ZeroMQ still holds parameters after %d s; their buffers are left "
                         "allocated",
                         IN_FLIGHT_WAIT_MS / 1000);
        for (uint32_t s = 0; s < self->n_shards && !leak; s++)
            omv_shard_thread_destroy(&self->threads[s]);
    }
    for (uint32_t s = 0; self->shards && s < self->n_shards; s++)
        omv_shard_fini(&self->shards[s]);
    free(self->threads);
    free(self->shards);
    if (self->model_fd >= 0) {
        omv_shm_unmap(self->params, model_bytes(self));
        close(self->model_fd);
    } else {
        free(self->params);
    }
    free(self->gather_params);
    free(self->gather_velocity);
    free(self->gather_second);
    free(self->probe_params);
    free(self->probe_velocity);
    free(self->probe_second);
    free(self);
    *self_p = NULL;
}

/* Every command to a shard goes through here: those that change its parameters are counted
 * (writes), in the order the shard runs them. */
static int send_to(omv_shardset_t *self, uint32_t s, const omv_shard_cmd_t *cmd,
                   const omv_peer_t *peer, omv_payload_t *payload)
{
    if (cmd->type == OMV_SHARD_CMD_APPLY || cmd->type == OMV_SHARD_CMD_RESTORE ||
        (cmd->type == OMV_SHARD_CMD_PUSH && cmd->solo))
        self->writes[s]++;
    return omv_shard_thread_send(self->threads[s], cmd, peer, payload);
}

int omv_shardset_send(omv_shardset_t *self, uint32_t s, const omv_shard_cmd_t *cmd,
                      const omv_peer_t *peer, omv_payload_t *payload)
{
    return send_to(self, s, cmd, peer, payload);
}

void omv_shardset_send_all(omv_shardset_t *self, const omv_shard_cmd_t *cmd, const omv_peer_t *peer)
{
    for (uint32_t s = 0; s < self->n_shards; s++)
        send_to(self, s, cmd, peer, NULL);
}

static void on_not_finite(omv_shardset_t *self, const omv_shard_reply_t *rep,
                          const omv_peer_t *peer)
{
    char who[64], why[OMV_WIRE_REASON_MAX];
    snprintf(who, sizeof(who), "worker %u", rep->worker_id);
    snprintf(why, sizeof(why),
             "gradient of step %llu shard %u has NaN or Inf values; dropped, the model is "
             "unchanged",
             (unsigned long long)rep->step, rep->shard);
    omv_refusals_add(self->refusals, peer, OMV_REFUSE_NOT_FINITE, who, why);
}

static void on_norm(omv_shardset_t *self, const omv_shard_reply_t *rep, const omv_peer_t *peer)
{
    char who[64], why[OMV_WIRE_REASON_MAX];
    snprintf(who, sizeof(who), "worker %u", rep->worker_id);
    snprintf(why, sizeof(why),
             "gradient of step %llu shard %u has norm %g, far over the largest (%g) this shard "
             "has accepted lately ([train] gradient_norm_bound); dropped, the model is unchanged",
             (unsigned long long)rep->step, rep->shard, (double)rep->norm, (double)rep->typical);
    omv_refusals_add(self->refusals, peer, OMV_REFUSE_NORM, who, why);
}

/* Handles one reply; OUT's payload is sent on (taken). Counts an acknowledgement in *acks. */
static void on_reply(omv_shardset_t *self, const omv_shard_reply_t *rep, size_t extra_len,
                     omv_payload_t *payload, int has_payload, int *acks)
{
    omv_peer_t peer = {.len = 0};
    size_t peer_len =
        rep->peer_len <= extra_len && rep->peer_len <= sizeof(peer.id) ? rep->peer_len : 0;
    memcpy(peer.id, self->pipe_extra, peer_len);
    peer.len = peer_len;
    switch (rep->type) {
    case OMV_SHARD_REPLY_OUT: {
        int r = omv_router_send_raw(self->router, &peer, self->pipe_extra + peer_len,
                                    extra_len - peer_len, has_payload ? payload : NULL);
        if (r < 0)
            omv_log_debug("cannot send parameters to worker %u: %s", rep->worker_id,
                          omv_strerror(r));
        return;
    }
    case OMV_SHARD_REPLY_NOT_FINITE:
        on_not_finite(self, rep, &peer);
        break;
    case OMV_SHARD_REPLY_NORM:
        on_norm(self, rep, &peer);
        break;
    case OMV_SHARD_REPLY_ACK:
        if (acks)
            (*acks)--;
        break;
    default:
        break;
    }
    if (has_payload)
        omv_payload_close(payload);
}

/* Handles the replies waiting on shard s's pipe, waiting up to timeout_ms for the first. */
static int drain_pipe(omv_shardset_t *self, uint32_t s, int timeout_ms, int *acks)
{
    for (int n = 0;; n++) {
        omv_shard_reply_t rep;
        size_t len, extra_len;
        omv_payload_t payload;
        int has_payload;
        int r = omv_pipe_recv(omv_shard_thread_pipe(self->threads[s]), &rep, sizeof(rep), &len,
                              self->pipe_extra, sizeof(self->pipe_extra), &extra_len, &payload,
                              &has_payload, n == 0 ? timeout_ms : 0);
        if (r < 0)
            return r == -EAGAIN ? 0 : r;
        if (len != sizeof(rep)) {
            if (has_payload)
                omv_payload_close(&payload);
            continue;
        }
        on_reply(self, &rep, extra_len, &payload, has_payload, acks);
        if (acks && *acks == 0)
            return 0;
    }
}

void omv_shardset_drain(omv_shardset_t *self)
{
    for (uint32_t s = 0; s < self->n_shards; s++)
        drain_pipe(self, s, 0, NULL);
}

/* Sends cmd (GATHER or RESTORE) to every shard and waits for all the acknowledgements. */
static int to_all_shards(omv_shardset_t *self, const omv_shard_cmd_t *cmd)
{
    for (uint32_t s = 0; s < self->n_shards; s++) {
        int r = send_to(self, s, cmd, NULL, NULL);
        if (r < 0)
            return r;
    }
    for (uint32_t s = 0; s < self->n_shards; s++) {
        /* Replies queued before the acknowledgement are handled on the way. */
        int acks = 1;
        int64_t deadline = omv_time_ms() + ACK_TIMEOUT_MS;
        while (acks > 0) {
            int r = drain_pipe(self, s, 100, &acks);
            if (r < 0)
                return r;
            if (acks > 0 && omv_time_ms() > deadline) {
                omv_log_error("shard %u did not answer within %d s", s, ACK_TIMEOUT_MS / 1000);
                return -ETIMEDOUT;
            }
        }
    }
    return 0;
}

int omv_shardset_gather(omv_shardset_t *self, int velocity)
{
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_GATHER, .params_dst = self->gather_params};
    if (velocity) {
        cmd.velocity_dst = self->gather_velocity;
        cmd.second_dst = self->gather_second;
        cmd.steps_dst = self->gather_steps;
    }
    return to_all_shards(self, &cmd);
}

int omv_shardset_sync(omv_shardset_t *self)
{
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_GATHER}; /* copies nothing, acknowledges */
    return to_all_shards(self, &cmd);
}

int omv_shardset_restore(omv_shardset_t *self, const float *params, const float *velocity,
                         const float *second, const uint64_t *steps)
{
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_RESTORE,
                           .params_src = params,
                           .velocity_src = velocity,
                           .second_src = second,
                           .steps_src = steps};
    return to_all_shards(self, &cmd);
}

/* Makes the arrays of the probe base. Returns 0 or -ENOMEM (none made). */
static int make_probe_base(omv_shardset_t *self)
{
    size_t n = self->param_count;
    self->probe_params = malloc(n * sizeof(float));
    self->probe_velocity = malloc(n * sizeof(float));
    if (self->adam)
        self->probe_second = malloc(n * sizeof(float));
    if (self->probe_params == NULL || self->probe_velocity == NULL ||
        (self->adam && self->probe_second == NULL)) {
        free(self->probe_params);
        free(self->probe_velocity);
        free(self->probe_second);
        self->probe_params = self->probe_velocity = self->probe_second = NULL;
        return -ENOMEM;
    }
    return 0;
}

int omv_shardset_probe_base(omv_shardset_t *self, int restore)
{
    if (self->probe_params == NULL) {
        if (restore)
            return -ENOENT;
        int r = make_probe_base(self);
        if (r < 0)
            return r;
    }
    if (restore)
        return omv_shardset_restore(self, self->probe_params, self->probe_velocity,
                                    self->probe_second, self->probe_steps);
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_GATHER,
                           .params_dst = self->probe_params,
                           .velocity_dst = self->probe_velocity,
                           .second_dst = self->probe_second,
                           .steps_dst = self->probe_steps};
    return to_all_shards(self, &cmd);
}

int omv_shardset_has_probe_base(const omv_shardset_t *self)
{
    return self->probe_params != NULL;
}
