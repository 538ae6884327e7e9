/* A shard's thread: the command loop, and the snapshots that answer pulls without copies. */
#define OMV_LOG_TAG "shard"
#include "shard_thread.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "log.h"
#include "q8.h"
#include "shm.h"
#include "util.h"
#include "wire.h"

/* Snapshots in flight at once: one per version being sent; more than this and a pull is
 * answered with a copy of its own. */
#define MAX_SNAPSHOTS 16

typedef struct {
    void *data;       /* [count] floats, or bf16 values in the first half (room for either) */
    atomic_int refs;  /* messages that still use it (released by ZeroMQ's I/O thread) */
    uint64_t version; /* the shard's version it holds */
    uint32_t wire;    /* OMV_WIRE_*: how data holds it */
} snapshot_t;

/* A view's last change, as sent: the view holds a reference, and so does each message that
 * carries it until ZeroMQ lets go of it (on whichever thread); the last frees it. */
typedef struct {
    atomic_int refs;
    unsigned char bytes[];
} change_t;

/* Job wire int8: the parameters as a worker holds them (its view, common/q8.h), which the
 * changes it is sent are taken against. The members of a synchronous group are sent the same
 * versions, so their views are equal: they share one, which the first of them to be served a
 * version changes, keeping the change's bytes for the others. A view's lineage names its values:
 * a hash of the version it began at and of each version it was changed to since. */
typedef struct view {
    struct view *next;
    uint32_t refs;          /* readers that hold it */
    uint64_t lineage, from; /* its values now, and before its last change (0: none) */
    change_t *change;       /* that last change: [omv_q8_bytes(count)] bytes */
    float values[];
} view_t;

/* A worker's view as its Params name it. */
typedef struct {
    uint64_t id;      /* the Params' view (0: none) */
    uint32_t seq;     /* changes sent since it began */
    uint64_t lineage; /* the values the worker holds: v's, or v's before its last change */
    view_t *v;
} reader_t;

/* Writes the shard's parameters into dst as wire asks. */
static void export_params(const omv_shard_t *sh, void *dst, uint32_t wire)
{
    if (wire == OMV_WIRE_BF16)
        omv_bf16_from_f32(dst, sh->params, sh->count);
    else
        memcpy(dst, sh->params, sh->count * sizeof(float));
}

struct omv_shard_thread {
    pthread_t thread;
    int started;
    omv_pipe_t *loop_end, *mine;
    omv_shard_t *shard;
    uint32_t index;
    uint32_t *counted; /* [n_groups] finite gradients in the group's pending sum */
    uint8_t *done;     /* [n_groups] the group's step was applied by a solo push already */
    uint64_t version;  /* updates applied */
    snapshot_t snaps[MAX_SNAPSHOTS];
    int n_snaps;
    float *scratch;         /* [count] for a gradient whose bytes are not float-aligned */
    double norm_peak;       /* the largest gradient norm accepted lately (decays slowly) */
    uint64_t norms_learned; /* nonzero norms that went into it */
    float last_norm;        /* of the gradient refused last, for the reply */
    atomic_uint_fast64_t snapshots_made, serves;
    /* Pulls answered with a copy of their own, and those copies freed by release_copy (on
     * whichever thread closes the last message that holds one). */
    atomic_uint_fast64_t copies_made, copies_freed;
    atomic_uint_fast64_t applies, summed; /* APPLY commands run; gradients added to sums */
    reader_t *readers; /* [OMV_SHARD_VIEWS_MAX + 1] by worker id, once one is needed */
    view_t *views;     /* every view a reader holds */
    atomic_uint_fast64_t n_views, changes_sent, wholes_sent;
    atomic_uint_fast64_t change_buffers; /* made because the last was still on its way out */
    uint8_t extra[sizeof(((omv_peer_t *)0)->id) + OMV_WIRE_MAX_ENVELOPE];
};

static void release_snapshot(void *data, void *hint)
{
    (void)data;
    snapshot_t *s = hint;
    atomic_fetch_sub_explicit(&s->refs, 1, memory_order_release);
}

/* A copy belongs to the one message that carries it: ZeroMQ calls this when it lets go of the
 * message, and without it the copy would never be freed (zmq_msg_init_data leaves data that has
 * no release function to the caller). The count is the last thing it touches of self, so once
 * omv_shard_thread_in_flight has seen every copy freed, self may go. */
static void release_copy(void *data, void *hint)
{
    omv_shard_thread_t *self = hint;
    free(data);
    atomic_fetch_add_explicit(&self->copies_freed, 1, memory_order_release);
}

/* Makes payload of copy[bytes] (malloc'd, filled), which release_copy frees when ZeroMQ is done
 * with it; on failure copy is freed here. Returns 0 or a negative errno. */
static int copy_payload(omv_shard_thread_t *self, void *copy, size_t bytes, omv_payload_t *payload)
{
    if (copy == NULL)
        return -ENOMEM;
    int r = omv_payload_init_shared(payload, copy, bytes, release_copy, self);
    if (r < 0)
        free(copy); /* ZeroMQ took nothing, so it will never call release_copy */
    else
        atomic_fetch_add_explicit(&self->copies_made, 1, memory_order_relaxed);
    return r;
}

static change_t *change_new(size_t count)
{
    change_t *c = malloc(sizeof(*c) + omv_q8_bytes(count ? count : 1));
    if (c)
        atomic_init(&c->refs, 1);
    return c;
}

static void change_release(change_t *c)
{
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        free(c);
}

static void release_change(void *data, void *hint)
{
    (void)data;
    change_release(hint);
}

/* A snapshot of the current version as wire stores it: the one already made, or a free one
 * refreshed. NULL when all are in flight. */
static snapshot_t *current_snapshot(omv_shard_thread_t *self, uint32_t wire)
{
    snapshot_t *free_one = NULL;
    for (int i = 0; i < self->n_snaps; i++) {
        snapshot_t *s = &self->snaps[i];
        int refs = atomic_load_explicit(&s->refs, memory_order_acquire);
        if (s->version == self->version && s->wire == wire && s->data != NULL)
            return s;
        if (refs == 0 && free_one == NULL)
            free_one = s;
    }
    if (free_one == NULL && self->n_snaps < MAX_SNAPSHOTS) {
        free_one = &self->snaps[self->n_snaps];
        free_one->data = malloc((self->shard->count ? self->shard->count : 1) * sizeof(float));
        if (free_one->data == NULL)
            return NULL;
        atomic_init(&free_one->refs, 0);
        self->n_snaps++;
    }
    if (free_one == NULL)
        return NULL;
    export_params(self->shard, free_one->data, wire);
    free_one->version = self->version;
    free_one->wire = wire;
    atomic_fetch_add_explicit(&self->snapshots_made, 1, memory_order_relaxed);
    return free_one;
}

static void reply(omv_shard_thread_t *self, uint32_t type, const omv_shard_cmd_t *cmd,
                  const void *peer, size_t peer_len, const void *env, size_t env_len,
                  omv_payload_t *payload)
{
    omv_shard_reply_t rep = {
        type,      self->index,        cmd->group,      cmd->worker_id,
        cmd->step, (uint32_t)peer_len, self->last_norm, (float)self->norm_peak};
    if (peer_len)
        memcpy(self->extra, peer, peer_len);
    if (env_len)
        memcpy(self->extra + peer_len, env, env_len);
    int r = omv_pipe_send(self->mine, &rep, sizeof(rep), self->extra, peer_len + env_len, payload);
    if (r < 0)
        omv_log_error("shard %u cannot reply: %s", self->index, omv_strerror(r));
}

/* Adds a checked gradient to its group's sum, or applies it at once for a group of one: grad
 * (fp32), or g16 (bf16, widened as it goes: exactly what its fp32 widening would do). */
static void add_gradient(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const float *grad,
                         const void *g16)
{
    omv_shard_t *sh = self->shard;
    if (cmd->solo) {
        /* A group of one: the update straight from the gradient, one pass fewer. */
        if (g16)
            omv_shard_apply_one_bf16(sh, g16, &cmd->sgd);
        else
            omv_shard_apply_one(sh, grad, &cmd->sgd);
        self->done[cmd->group] = 1;
        self->version++;
        atomic_fetch_add_explicit(&self->summed, 1, memory_order_relaxed);
        return;
    }
    int r = g16 ? omv_shard_accumulate_bf16(sh, cmd->group, g16)
                : omv_shard_accumulate(sh, cmd->group, grad);
    if (r == 0) {
        self->counted[cmd->group]++;
        atomic_fetch_add_explicit(&self->summed, 1, memory_order_relaxed);
    } else {
        omv_log_error("shard %u: no memory for group %u's sum; a gradient is dropped", self->index,
                      cmd->group);
    }
}

/* The gradient as fp32 in scratch (or in place when it already is one, aligned), weighted when
 * its member computed more or fewer images than the group's mean share. */
static const float *as_weighted_f32(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd,
                                    const void *data, size_t len)
{
    omv_shard_t *sh = self->shard;
    const float *grad = data;
    if (cmd->wire == OMV_WIRE_BF16) {
        omv_bf16_to_f32(self->scratch, data, sh->count);
        grad = self->scratch;
    } else if (cmd->wire == OMV_WIRE_INT8) {
        omv_q8_decode(self->scratch, data, sh->count);
        grad = self->scratch;
    } else if (((uintptr_t)data & (sizeof(float) - 1)) != 0) {
        memcpy(self->scratch, data, len);
        grad = self->scratch;
    }
    if (cmd->weight != 0.0f && cmd->weight != 1.0f) {
        if (grad != self->scratch)
            memcpy(self->scratch, grad, len);
        for (uint32_t i = 0; i < sh->count; i++)
            self->scratch[i] *= cmd->weight;
        grad = self->scratch;
    }
    return grad;
}

/* Each accepted gradient's norm counts for this much less per accepted gradient after it: a
 * peak halves over about 7000 of them. */
#define NORM_PEAK_DECAY 0.9999

/* Whether a finite gradient's norm is within the bound of the largest the shard has accepted
 * lately. A peak rather than a mean: near convergence typical gradients shrink by orders of
 * magnitude and one hard example is a hundred times the mean, which is training, not an
 * attack; what ruins a model is far beyond anything the job ever sent. Zero gradients teach
 * nothing and are not counted. */
static int norm_ok(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, float norm)
{
    if (self->norms_learned >= cmd->norm_warmup &&
        !((double)norm <= (double)cmd->norm_bound * self->norm_peak)) {
        self->last_norm = norm;
        return 0;
    }
    if (norm > 0.0f) {
        self->norm_peak *= NORM_PEAK_DECAY;
        if ((double)norm > self->norm_peak)
            self->norm_peak = (double)norm;
        self->norms_learned++;
    }
    return 1;
}

/* norm_ok for grad (or g16 as bf16): the trained values only, the state (batch norm's running
 * statistics) is no gradient. */
static int norm_fits(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const float *grad,
                     const void *g16)
{
    uint32_t n = self->shard->trained;
    if (cmd->norm_bound <= 0.0f || n == 0)
        return 1;
    return norm_ok(self, cmd, sqrtf(g16 ? omv_bf16_sum_squares(g16, n) : omv_sum_squares(grad, n)));
}

/* Adds a gradient (grad, or g16 as bf16) that is finite and within the norm bound; refuses
 * the others, with a reply that names why. */
static void check_and_add(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                          size_t peer_len, const float *grad, const void *g16)
{
    omv_shard_t *sh = self->shard;
    int finite = g16 ? omv_bf16_all_finite(g16, sh->count) : omv_all_finite(grad, sh->count);
    if (!finite)
        reply(self, OMV_SHARD_REPLY_NOT_FINITE, cmd, peer, peer_len, NULL, 0, NULL);
    else if (!norm_fits(self, cmd, grad, g16))
        reply(self, OMV_SHARD_REPLY_NORM, cmd, peer, peer_len, NULL, 0, NULL);
    else
        add_gradient(self, cmd, grad, g16);
}

static void on_push(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                    size_t peer_len, omv_payload_t *payload)
{
    omv_shard_t *sh = self->shard;
    size_t len;
    const void *data = omv_payload_data(payload, &len);
    if (len != omv_wire_value_bytes(cmd->wire, sh->count) || cmd->group >= sh->n_groups) {
        /* The event loop checked the shape; this would be our bug, not the worker's. */
        omv_log_error("shard %u: a gradient of %zu bytes for group %u does not fit", self->index,
                      len, cmd->group);
        omv_payload_close(payload);
        return;
    }
    /* A bf16 gradient of an even split is checked and added straight from its bytes; the rest
     * become fp32 first. */
    int direct = cmd->wire == OMV_WIRE_BF16 && (cmd->weight == 0.0f || cmd->weight == 1.0f);
    const float *grad = direct ? NULL : as_weighted_f32(self, cmd, data, len);
    check_and_add(self, cmd, peer, peer_len, grad, direct ? data : NULL);
    omv_payload_close(payload);
}

/* A gradient in the worker's shared segment. A worker writes it again only after it has the
 * next step's parameters, which come after this is done (commands to a shard run in order); one
 * that writes it sooner could change it between the checks and the sum, so the shard copies it
 * first (one copy of its part, against the socket's three). */
static void on_push_shm(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                        size_t peer_len)
{
    omv_shard_t *sh = self->shard;
    if (cmd->shm_src == NULL || cmd->group >= sh->n_groups)
        return;
    const float *src = cmd->shm_src + sh->offset;
    if (cmd->weight != 0.0f && cmd->weight != 1.0f) {
        memcpy(self->scratch, src, sh->count * sizeof(float));
        omv_shard_cmd_t fp32 = *cmd;
        fp32.wire = OMV_WIRE_FP32;
        const float *grad = as_weighted_f32(self, &fp32, self->scratch, sh->count * sizeof(float));
        check_and_add(self, cmd, peer, peer_len, grad, NULL);
        return;
    }
    /* One pass takes the copy, makes the checks and sums. The group's first gradient of the
     * step goes straight into its sum, over what is stale in it; a later one goes into scratch
     * as the sum so far plus it, which becomes the sum when it passes (the two buffers swap),
     * so that a refused one leaves the sum as it was. */
    float *sum = cmd->solo ? NULL : omv_shard_sum(sh, cmd->group), squares;
    if (!cmd->solo && sum == NULL) {
        omv_log_error("shard %u: no memory for group %u's sum; a gradient is dropped", self->index,
                      cmd->group);
        return;
    }
    int first = sum && omv_shard_sum_empty(sh, cmd->group);
    int finite = sum && !first ? omv_take_checked_onto(self->scratch, sum, src, sh->count,
                                                       sh->trained, &squares)
                               : omv_take_checked(first ? sum : self->scratch, src, sh->count,
                                                  sh->trained, first, &squares);
    int fits = finite &&
               (cmd->norm_bound <= 0.0f || sh->trained == 0 || norm_ok(self, cmd, sqrtf(squares)));
    if (!fits) {
        reply(self, finite ? OMV_SHARD_REPLY_NORM : OMV_SHARD_REPLY_NOT_FINITE, cmd, peer, peer_len,
              NULL, 0, NULL);
        return;
    }
    if (sum == NULL) {
        add_gradient(self, cmd, self->scratch, NULL); /* a group of one: applied at once */
        return;
    }
    if (first) {
        omv_shard_sum_filled(sh, cmd->group);
    } else {
        omv_shard_swap_sum(sh, cmd->group, self->scratch);
        self->scratch = sum;
    }
    self->counted[cmd->group]++;
    atomic_fetch_add_explicit(&self->summed, 1, memory_order_relaxed);
}

/* Parameters into the worker's shared segment (or, read in place, nowhere); only the envelope
 * goes out. */
static void serve_shm(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                      size_t peer_len, const uint8_t *env, size_t env_len)
{
    omv_shard_t *sh = self->shard;
    if (!cmd->shm_inplace)
        memcpy(cmd->shm_dst + sh->offset, sh->params, sh->count * sizeof(float));
    atomic_fetch_add_explicit(&self->serves, 1, memory_order_relaxed);
    if (cmd->shm_send && omv_shm_send_raw(cmd->shm_conn, env, env_len) == 0)
        return;
    reply(self, OMV_SHARD_REPLY_OUT, cmd, peer, peer_len, env, env_len, NULL);
}

static uint64_t lineage_next(uint64_t lineage, uint64_t version)
{
    uint64_t z = lineage ^ (version + 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z ? z : 1;
}

/* The reader lets go of its view; the last one frees it. */
static void drop_view(omv_shard_thread_t *self, reader_t *rd)
{
    view_t *v = rd->v;
    rd->v = NULL;
    rd->id = 0;
    if (v == NULL || --v->refs > 0)
        return;
    for (view_t **p = &self->views; *p; p = &(*p)->next)
        if (*p == v) {
            *p = v->next;
            break;
        }
    change_release(v->change);
    free(v);
    atomic_fetch_sub_explicit(&self->n_views, 1, memory_order_relaxed);
}

static void forget_view(omv_shard_thread_t *self, uint32_t worker_id)
{
    if (self->readers && worker_id <= OMV_SHARD_VIEWS_MAX)
        drop_view(self, &self->readers[worker_id]);
}

/* A view that begins with the parameters as they are: one another reader began at this
 * version and has not changed yet, or a new one. NULL when there is no memory for it. */
static view_t *begin_view(omv_shard_thread_t *self, uint64_t lineage)
{
    const omv_shard_t *sh = self->shard;
    for (view_t *v = self->views; v; v = v->next)
        if (v->lineage == lineage && v->from == 0) {
            v->refs++;
            return v;
        }
    view_t *v = malloc(sizeof(*v) + (sh->count ? sh->count : 1) * sizeof(float));
    change_t *change = v ? change_new(sh->count) : NULL;
    if (change == NULL) {
        free(v);
        return NULL;
    }
    *v = (view_t){self->views, 1, lineage, 0, change};
    memcpy(v->values, sh->params, sh->count * sizeof(float));
    self->views = v;
    atomic_fetch_add_explicit(&self->n_views, 1, memory_order_relaxed);
    return v;
}

/* A change of view v to the parameters as they are, into its buffer: a new buffer when messages
 * still carry the last one (a reference besides the view's). Returns 0 or -ENOMEM. */
static int make_change(omv_shard_thread_t *self, view_t *v)
{
    const omv_shard_t *sh = self->shard;
    if (atomic_load_explicit(&v->change->refs, memory_order_acquire) > 1) {
        change_t *c = change_new(sh->count);
        if (c == NULL)
            return -ENOMEM;
        change_release(v->change);
        v->change = c;
        atomic_fetch_add_explicit(&self->change_buffers, 1, memory_order_relaxed);
    }
    omv_q8_encode_delta(v->change->bytes, sh->params, v->values, sh->count);
    return 0;
}

/* The view the worker's next Params come from: the change from its view to the parameters as
 * they are (its group's first member to ask makes it; the others send its bytes), or, to begin
 * a view (a new one named, or its view changed by a member that was sent another version: it
 * left the group), the whole shard. Sets the message's wire and view. Returns the view, or NULL
 * (-ENOMEM or -EINVAL in *err). */
static view_t *next_view(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, omv_params_t *p,
                         int *err)
{
    *err = -EINVAL;
    if (cmd->worker_id == 0 || cmd->worker_id > OMV_SHARD_VIEWS_MAX)
        return NULL;
    *err = -ENOMEM;
    if (self->readers == NULL) /* a job of another wire never needs them */
        self->readers = calloc(OMV_SHARD_VIEWS_MAX + 1, sizeof(reader_t));
    if (self->readers == NULL)
        return NULL;
    reader_t *rd = &self->readers[cmd->worker_id];
    view_t *v = rd->id == cmd->view ? rd->v : NULL;
    uint64_t target = v ? lineage_next(rd->lineage, self->version) : 0;
    if (v && v->lineage == rd->lineage) {
        if (make_change(self, v) < 0)
            return NULL;
        v->from = rd->lineage;
        v->lineage = target;
    } else if (!(v && v->from == rd->lineage && v->lineage == target)) {
        drop_view(self, rd);
        target = lineage_next(0, self->version);
        v = begin_view(self, target);
        if (v == NULL)
            return NULL;
        *rd = (reader_t){cmd->view, 0, target, v};
        p->wire = OMV_WIRE_FP32;
        p->view = rd->id;
        p->view_seq = 0;
        atomic_fetch_add_explicit(&self->wholes_sent, 1, memory_order_relaxed);
        return v;
    }
    rd->lineage = target;
    rd->seq++;
    p->wire = OMV_WIRE_INT8;
    p->view = rd->id;
    p->view_seq = rd->seq;
    atomic_fetch_add_explicit(&self->changes_sent, 1, memory_order_relaxed);
    return v;
}

/* The payload of Params from view v: its change's bytes, without a copy; or (a view's
 * beginning) its values whole, in a copy of their own. Returns 0 or -ENOMEM. */
static int view_payload(omv_shard_thread_t *self, const view_t *v, uint32_t wire,
                        omv_payload_t *payload)
{
    const omv_shard_t *sh = self->shard;
    if (wire == OMV_WIRE_INT8) {
        change_t *c = v->change;
        atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
        int r =
            omv_payload_init_shared(payload, c->bytes, omv_q8_bytes(sh->count), release_change, c);
        if (r < 0)
            change_release(c);
        return r;
    }
    float *copy = malloc((sh->count ? sh->count : 1) * sizeof(float));
    if (copy)
        memcpy(copy, v->values, sh->count * sizeof(float));
    return copy_payload(self, copy, sh->count * sizeof(float), payload);
}

/* Answers a pull of a job of wire int8 with the change from the worker's view, or the whole
 * shard to begin one (next_view). */
static void serve_change(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, omv_msg_t *m,
                         const uint8_t *peer, size_t peer_len)
{
    int r;
    view_t *v = next_view(self, cmd, &m->u.params, &r);
    uint8_t env[1024];
    size_t env_len;
    omv_payload_t payload;
    if (v != NULL)
        r = omv_wire_encode(m, env, sizeof(env), &env_len);
    if (v != NULL && r == 0)
        r = view_payload(self, v, m->u.params.wire, &payload);
    if (v == NULL || r < 0) {
        omv_log_error("shard %u cannot answer worker %u's pull: %s", self->index, cmd->worker_id,
                      omv_strerror(r));
        return;
    }
    atomic_fetch_add_explicit(&self->serves, 1, memory_order_relaxed);
    reply(self, OMV_SHARD_REPLY_OUT, cmd, peer, peer_len, env, env_len, &payload);
}

static void on_serve(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                     size_t peer_len)
{
    omv_shard_t *sh = self->shard;
    omv_msg_t m = {.type = OMV_MSG_PARAMS};
    m.u.params = (omv_params_t){
        cmd->step,        self->index, sh->offset, sh->count,        cmd->group, cmd->slice_begin,
        cmd->slice_count, cmd->batch,  cmd->wire,  cmd->shm_inplace, 0,          0};
    if (cmd->wire == OMV_WIRE_INT8) {
        serve_change(self, cmd, &m, peer, peer_len);
        return;
    }
    size_t bytes = omv_wire_value_bytes(cmd->wire, sh->count);
    uint8_t env[1024];
    size_t env_len;
    if (omv_wire_encode(&m, env, sizeof(env), &env_len) < 0) {
        omv_log_error("shard %u cannot encode parameters", self->index);
        return;
    }
    if (cmd->wire == OMV_WIRE_SHM) {
        if (cmd->shm_dst)
            serve_shm(self, cmd, peer, peer_len, env, env_len);
        return;
    }
    omv_payload_t payload;
    snapshot_t *s = current_snapshot(self, cmd->wire);
    int r;
    if (s != NULL) {
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
        r = omv_payload_init_shared(&payload, s->data, bytes, release_snapshot, s);
        if (r < 0)
            atomic_fetch_sub_explicit(&s->refs, 1, memory_order_relaxed);
    } else {
        /* Every snapshot is still on its way out: this pull gets a copy of its own, which
         * release_copy frees when ZeroMQ is done with it. */
        float *copy = malloc((sh->count ? sh->count : 1) * sizeof(float));
        if (copy != NULL)
            export_params(sh, copy, cmd->wire);
        r = copy_payload(self, copy, bytes, &payload);
    }
    if (r < 0) {
        omv_log_error("shard %u cannot answer a pull: %s", self->index, omv_strerror(r));
        return;
    }
    atomic_fetch_add_explicit(&self->serves, 1, memory_order_relaxed);
    reply(self, OMV_SHARD_REPLY_OUT, cmd, peer, peer_len, env, env_len, &payload);
}

/* Copies the shard's range of the model and its optimizer state into the whole-model arrays the
 * command names. */
static void gather(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd)
{
    const omv_shard_t *sh = self->shard;
    size_t bytes = sh->count * sizeof(float);
    if (cmd->params_dst)
        memcpy(cmd->params_dst + sh->offset, sh->params, bytes);
    if (cmd->velocity_dst)
        memcpy(cmd->velocity_dst + sh->offset, sh->velocity, bytes);
    if (cmd->second_dst && sh->second)
        memcpy(cmd->second_dst + sh->offset, sh->second, bytes);
    if (cmd->steps_dst)
        cmd->steps_dst[self->index] = sh->steps;
}

/* The other way: the shard's range from the whole-model arrays the command names. */
static void restore(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd)
{
    omv_shard_t *sh = self->shard;
    size_t bytes = sh->count * sizeof(float);
    if (cmd->params_src)
        memcpy(sh->params, cmd->params_src + sh->offset, bytes);
    if (cmd->velocity_src)
        memcpy(sh->velocity, cmd->velocity_src + sh->offset, bytes);
    if (cmd->second_src && sh->second)
        memcpy(sh->second, cmd->second_src + sh->offset, bytes);
    if (cmd->steps_src)
        sh->steps = cmd->steps_src[self->index];
}

/* Runs one command (the payload, if any, is taken). Returns 1 for QUIT, else 0. */
static int handle(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd, const uint8_t *peer,
                  size_t peer_len, omv_payload_t *payload)
{
    omv_shard_t *sh = self->shard;
    switch (cmd->type) {
    case OMV_SHARD_CMD_PUSH:
        if (cmd->wire == OMV_WIRE_SHM) {
            on_push_shm(self, cmd, peer, peer_len);
        } else if (payload) {
            on_push(self, cmd, peer, peer_len, payload);
            payload = NULL;
        }
        break;
    case OMV_SHARD_CMD_APPLY:
        atomic_fetch_add_explicit(&self->applies, 1, memory_order_relaxed);
        if (cmd->group < sh->n_groups && self->done[cmd->group]) {
            self->done[cmd->group] = 0; /* applied when its only gradient came */
        } else if (cmd->group < sh->n_groups) {
            omv_shard_apply(sh, cmd->group, self->counted[cmd->group], &cmd->sgd);
            if (self->counted[cmd->group] > 0)
                self->version++;
            self->counted[cmd->group] = 0;
        }
        break;
    case OMV_SHARD_CMD_DISCARD:
        if (cmd->group < sh->n_groups) {
            self->done[cmd->group] = 0;
            omv_shard_discard(sh, cmd->group);
            self->counted[cmd->group] = 0;
        }
        break;
    case OMV_SHARD_CMD_SERVE:
        on_serve(self, cmd, peer, peer_len);
        break;
    case OMV_SHARD_CMD_GATHER:
        gather(self, cmd);
        reply(self, OMV_SHARD_REPLY_ACK, cmd, NULL, 0, NULL, 0, NULL);
        break;
    case OMV_SHARD_CMD_FORGET:
        forget_view(self, cmd->worker_id);
        break;
    case OMV_SHARD_CMD_RESTORE:
        restore(self, cmd);
        self->version++; /* snapshots of the old parameters must not answer pulls */
        reply(self, OMV_SHARD_REPLY_ACK, cmd, NULL, 0, NULL, 0, NULL);
        break;
    default:
        break;
    }
    if (payload)
        omv_payload_close(payload);
    return cmd->type == OMV_SHARD_CMD_QUIT;
}

static void *run(void *arg)
{
    omv_shard_thread_t *self = arg;
    uint8_t peer[sizeof(((omv_peer_t *)0)->id)];
    /* The ready signal (as CZMQ's zsock_signal): an empty message, which no reply is. It cannot
     * fail while the router, whose context the pipe lives in, does; were it to fail anyway, the
     * receive below fails the same way and the thread ends. */
    int r = omv_pipe_send(self->mine, NULL, 0, NULL, 0, NULL);
    if (r < 0)
        omv_log_error("shard %u cannot signal that it is ready: %s", self->index, omv_strerror(r));
    for (;;) {
        omv_shard_cmd_t cmd;
        size_t len, peer_len;
        omv_payload_t payload;
        int has_payload;
        r = omv_pipe_recv(self->mine, &cmd, sizeof(cmd), &len, peer, sizeof(peer), &peer_len,
                          &payload, &has_payload, -1);
        if (r == -EINTR)
            continue;
        if (r < 0) {
            omv_log_error("shard %u: pipe failed: %s", self->index, omv_strerror(r));
            break;
        }
        if (len != sizeof(cmd)) {
            if (has_payload)
                omv_payload_close(&payload);
            continue;
        }
        if (handle(self, &cmd, peer, peer_len, has_payload ? &payload : NULL))
            break;
    }
    return NULL;
}

/* Waits for the thread's ready signal on the loop end, so that the constructor returns with the
 * thread in its loop (CZMQ's zactor does the same) and nothing else ever sees the signal.
 * Returns 0 or a negative errno. */
static int wait_ready(omv_shard_thread_t *self)
{
    for (;;) {
        uint8_t cmd[sizeof(omv_shard_reply_t)], extra[1];
        size_t len, extra_len;
        omv_payload_t payload;
        int has_payload;
        int r = omv_pipe_recv(self->loop_end, cmd, sizeof(cmd), &len, extra, sizeof(extra),
                              &extra_len, &payload, &has_payload, -1);
        if (r == -EINTR)
            continue;
        if (r < 0)
            return r;
        if (has_payload)
            omv_payload_close(&payload);
        /* The thread has had no command yet, so its first message is the signal. */
        return len == 0 ? 0 : -EPROTO;
    }
}

omv_shard_thread_t *omv_shard_thread_new(omv_router_t *router, omv_shard_t *shard, uint32_t index,
                                         int threaded)
{
    omv_shard_thread_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->shard = shard;
    self->index = index;
    self->counted = calloc(shard->n_groups ? shard->n_groups : 1, sizeof(uint32_t));
    self->done = calloc(shard->n_groups ? shard->n_groups : 1, 1);
    self->scratch = malloc((shard->count ? shard->count : 1) * sizeof(float));
    atomic_init(&self->snapshots_made, 0);
    atomic_init(&self->serves, 0);
    atomic_init(&self->copies_made, 0);
    atomic_init(&self->copies_freed, 0);
    atomic_init(&self->applies, 0);
    atomic_init(&self->summed, 0);
    atomic_init(&self->n_views, 0);
    atomic_init(&self->changes_sent, 0);
    atomic_init(&self->wholes_sent, 0);
    int r = -ENOMEM;
    if (self->counted == NULL || self->done == NULL || self->scratch == NULL)
        goto fail;
    r = omv_router_pipe(router, &self->loop_end, &self->mine);
    if (r < 0)
        goto fail;
    if (!threaded)
        return self; /* commands run on the sender's thread; replies still go through the pipe */
    r = -pthread_create(&self->thread, NULL, run, self);
    if (r < 0)
        goto fail;
    self->started = 1;
    r = wait_ready(self);
    if (r < 0) {
        /* The caller logs the failure; the thread is told to end and joined first. */
        omv_shard_thread_stop(self);
        goto fail;
    }
    return self;
fail:
    /* The loop end stays with the router, which closes it. */
    omv_pipe_destroy(&self->mine);
    free(self->counted);
    free(self->done);
    free(self->scratch);
    free(self->readers);
    free(self);
    errno = -r;
    return NULL;
}

void omv_shard_thread_stop(omv_shard_thread_t *self)
{
    if (self == NULL)
        return;
    if (!self->started) {
        omv_pipe_destroy(&self->mine);
        return;
    }
    omv_shard_cmd_t quit = {.type = OMV_SHARD_CMD_QUIT};
    omv_shard_thread_send(self, &quit, NULL, NULL);
    pthread_join(self->thread, NULL);
    self->started = 0;
    omv_pipe_destroy(&self->mine);
}

void omv_shard_thread_destroy(omv_shard_thread_t **self_p)
{
    omv_shard_thread_t *self = *self_p;
    if (self == NULL)
        return;
    omv_shard_thread_stop(self);
    for (int i = 0; i < self->n_snaps; i++)
        free(self->snaps[i].data);
    for (uint32_t id = 0; self->readers && id <= OMV_SHARD_VIEWS_MAX; id++)
        drop_view(self, &self->readers[id]);
    free(self->readers);
    free(self->counted);
    free(self->done);
    free(self->scratch);
    free(self);
    *self_p = NULL;
}

int omv_shard_thread_in_flight(const omv_shard_thread_t *self)
{
    omv_shard_thread_t *me = (omv_shard_thread_t *)self;
    for (int i = 0; i < self->n_snaps; i++)
        if (atomic_load_explicit(&me->snaps[i].refs, memory_order_acquire) != 0)
            return 1;
    /* A copy's release function counts in self, so a copy in flight keeps self alive too. */
    uint64_t made, freed;
    omv_shard_thread_copies(self, &made, &freed);
    return made != freed;
}

omv_pipe_t *omv_shard_thread_pipe(omv_shard_thread_t *self)
{
    return self->loop_end;
}

int omv_shard_thread_send(omv_shard_thread_t *self, const omv_shard_cmd_t *cmd,
                          const omv_peer_t *peer, omv_payload_t *payload)
{
    if (!self->started) {
        if (self->mine == NULL) {
            if (payload)
                omv_payload_close(payload);
            return -EPIPE;
        }
        handle(self, cmd, peer ? peer->id : NULL, peer ? peer->len : 0, payload);
        return 0;
    }
    return omv_pipe_send(self->loop_end, cmd, sizeof(*cmd), peer ? peer->id : NULL,
                         peer ? peer->len : 0, payload);
}

void omv_shard_thread_counts(const omv_shard_thread_t *self, uint64_t *ret_applies,
                             uint64_t *ret_summed)
{
    omv_shard_thread_t *me = (omv_shard_thread_t *)self;
    *ret_applies = atomic_load_explicit(&me->applies, memory_order_relaxed);
    *ret_summed = atomic_load_explicit(&me->summed, memory_order_relaxed);
}

void omv_shard_thread_views(const omv_shard_thread_t *self, omv_shard_views_t *ret)
{
    omv_shard_thread_t *me = (omv_shard_thread_t *)self;
    ret->views = atomic_load_explicit(&me->n_views, memory_order_relaxed);
    ret->bytes =
        ret->views * (self->shard->count * sizeof(float) + omv_q8_bytes(self->shard->count));
    ret->changes = atomic_load_explicit(&me->changes_sent, memory_order_relaxed);
    ret->wholes = atomic_load_explicit(&me->wholes_sent, memory_order_relaxed);
    ret->buffers = atomic_load_explicit(&me->change_buffers, memory_order_relaxed);
}

void omv_shard_thread_stats(const omv_shard_thread_t *self, uint64_t *ret_snapshots,
                            uint64_t *ret_serves)
{
    *ret_snapshots =
        atomic_load_explicit(&((omv_shard_thread_t *)self)->snapshots_made, memory_order_relaxed);
    *ret_serves = atomic_load_explicit(&((omv_shard_thread_t *)self)->serves, memory_order_relaxed);
}

int omv_shard_thread_threaded(const omv_shard_thread_t *self)
{
    return self->started;
}

void omv_shard_thread_copies(const omv_shard_thread_t *self, uint64_t *ret_made,
                             uint64_t *ret_freed)
{
    omv_shard_thread_t *me = (omv_shard_thread_t *)self;
    /* Freed first: a copy is counted made before the message that carries it is sent, so every
     * copy whose release this load sees is counted in the load of made after it, and freed
     * never runs ahead of made. */
    uint64_t freed = atomic_load_explicit(&me->copies_freed, memory_order_acquire);
    *ret_made = atomic_load_explicit(&me->copies_made, memory_order_relaxed);
    *ret_freed = freed;
}
