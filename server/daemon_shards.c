/* The daemon's side of the shard threads: their replies (parameters to send on, gradients
 * refused as not finite), and copying the model out of them or into them (evaluations,
 * checkpoints, the optimizer's probe base). */
#define OMV_LOG_TAG "daemon"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "log.h"
#include "util.h"

/* Handles one reply; OUT's payload is sent on (taken). Counts an acknowledgement in *acks. */
static void on_shard_reply(omv_daemon_t *d, const omv_shard_reply_t *rep, size_t extra_len,
                           omv_payload_t *payload, int has_payload, int *acks)
{
    omv_peer_t peer = {.len = 0};
    size_t peer_len = rep->peer_len <= extra_len && rep->peer_len <= sizeof(peer.id)
                          ? rep->peer_len
                          : 0;
    memcpy(peer.id, d->pipe_extra, peer_len);
    peer.len = peer_len;
    switch (rep->type) {
    case OMV_SHARD_REPLY_OUT: {
        int r = omv_router_send_raw(d->router, &peer, d->pipe_extra + peer_len,
                                    extra_len - peer_len, has_payload ? payload : NULL);
        if (r < 0)
            omv_log_debug("cannot send parameters to worker %u: %s", rep->worker_id,
                          omv_strerror(r));
        return;
    }
    case OMV_SHARD_REPLY_NOT_FINITE: {
        char who[64], why[OMV_WIRE_REASON_MAX];
        snprintf(who, sizeof(who), "worker %u", rep->worker_id);
        snprintf(why, sizeof(why), "gradient of step %llu shard %u has NaN or Inf values; "
                 "dropped, the model is unchanged", (unsigned long long)rep->step, rep->shard);
        omv_daemon_refuse(d, &peer, OMV_REFUSE_NOT_FINITE, who, why);
        break;
    }
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
static int drain_pipe(omv_daemon_t *d, uint32_t s, int timeout_ms, int *acks)
{
    for (int n = 0;; n++) {
        omv_shard_reply_t rep;
        size_t len, extra_len;
        omv_payload_t payload;
        int has_payload;
        int r = omv_pipe_recv(omv_shard_thread_pipe(d->threads[s]), &rep, sizeof(rep), &len,
                              d->pipe_extra, sizeof(d->pipe_extra), &extra_len, &payload,
                              &has_payload, n == 0 ? timeout_ms : 0);
        if (r < 0)
            return r == -EAGAIN ? 0 : r;
        if (len != sizeof(rep)) {
            if (has_payload)
                omv_payload_close(&payload);
            continue;
        }
        on_shard_reply(d, &rep, extra_len, &payload, has_payload, acks);
        if (acks && *acks == 0)
            return 0;
    }
}

void omv_daemon_drain_pipes(omv_daemon_t *d)
{
    for (uint32_t s = 0; s < d->n_shards; s++)
        drain_pipe(d, s, 0, NULL);
}

/* Sends cmd to every shard (or does it here before the threads start) and waits for all the
 * acknowledgements. */
static int to_all_shards(omv_daemon_t *d, const omv_shard_cmd_t *cmd)
{
    for (uint32_t s = 0; s < d->n_shards; s++) {
        omv_shard_t *sh = &d->shards[s];
        if (d->threads == NULL || d->threads[s] == NULL) {
            if (cmd->params_dst)
                memcpy(cmd->params_dst + sh->offset, sh->params, sh->count * sizeof(float));
            if (cmd->velocity_dst)
                memcpy(cmd->velocity_dst + sh->offset, sh->velocity, sh->count * sizeof(float));
            if (cmd->params_src)
                memcpy(sh->params, cmd->params_src + sh->offset, sh->count * sizeof(float));
            if (cmd->velocity_src)
                memcpy(sh->velocity, cmd->velocity_src + sh->offset, sh->count * sizeof(float));
            continue;
        }
        int r = omv_shard_thread_send(d->threads[s], cmd, NULL, NULL);
        if (r < 0)
            return r;
    }
    for (uint32_t s = 0; d->threads && s < d->n_shards; s++) {
        if (d->threads[s] == NULL)
            continue;
        /* Replies queued before the acknowledgement are handled on the way. */
        int acks = 1;
        int64_t deadline = omv_time_ms() + 10000;
        while (acks > 0) {
            int r = drain_pipe(d, s, 100, &acks);
            if (r < 0)
                return r;
            if (acks > 0 && omv_time_ms() > deadline) {
                omv_log_error("shard %u did not answer within 10 s", s);
                return -ETIMEDOUT;
            }
        }
    }
    return 0;
}

int omv_daemon_gather(omv_daemon_t *d, int velocity)
{
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_GATHER, .params_dst = d->gather_params,
                           .velocity_dst = velocity ? d->gather_velocity : NULL};
    return to_all_shards(d, &cmd);
}

/* Saves the model and its momentum as the probe base (snapshot) or puts them back (restore). */
int omv_daemon_probe_base(omv_daemon_t *d, int restore)
{
    size_t n = d->layout.param_count;
    if (d->probe_params == NULL) {
        if (restore)
            return -ENOENT;
        d->probe_params = malloc(n * sizeof(float));
        d->probe_velocity = malloc(n * sizeof(float));
        if (d->probe_params == NULL || d->probe_velocity == NULL) {
            free(d->probe_params);
            free(d->probe_velocity);
            d->probe_params = d->probe_velocity = NULL;
            return -ENOMEM;
        }
    }
    omv_shard_cmd_t cmd = {.type = restore ? OMV_SHARD_CMD_RESTORE : OMV_SHARD_CMD_GATHER};
    if (restore) {
        cmd.params_src = d->probe_params;
        cmd.velocity_src = d->probe_velocity;
    } else {
        cmd.params_dst = d->probe_params;
        cmd.velocity_dst = d->probe_velocity;
    }
    return to_all_shards(d, &cmd);
}

