/* The network: layers in a row, softmax cross-entropy on the last one's outputs. With several
 * threads the batch is split: each thread runs its own copy of the layers (own buffers) on its
 * lane of the images, and the lanes' gradients are summed; BLAS then runs one thread per call.
 * The threads sleep on a condition variable between steps (no spinning against BLAS). */
#include "net.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"
#include "rng.h"
#include "util.h"

#define MAX_THREADS 64

enum { JOB_TRAIN, JOB_EVAL };

/* One thread's copy of the network and its share of the step. */
typedef struct {
    omv_net_t *net;
    omv_layer_t layers[OMV_MODEL_MAX_LAYERS];
    float *prob; /* [lane_batch][classes] */
    float *grad; /* [param_count] this lane's gradient; lane 0 of one lane: NULL (writes the
                    caller's directly) */
    omv_rng_t rng;
    uint32_t begin, count; /* this step's images */
    double loss_sum;
    uint32_t correct;
    pthread_t tid;
    bool started;
} lane_t;

struct omv_net {
    omv_model_layout_t layout;
    uint32_t max_batch, n_lanes;
    lane_t *lanes;
    double *seconds; /* [n_layers] or NULL: lane 0's per-layer time, for benchmarks */
    /* The step the lanes run, set by the caller before it wakes them. */
    int job;
    const float *params, *x;
    const uint8_t *labels;
    float *grad;
    const omv_net_hooks_t *hooks; /* lane 0's, with one lane; else NULL */
    void (*tick)(void *ctx);      /* omv_net_set_tick: lane 0 calls it between layers */
    void *tick_ctx;
    /* Step hand-off: gen counts steps started; pending counts lanes still running. */
    pthread_mutex_t mu;
    pthread_cond_t go, finished;
    uint64_t gen;
    uint32_t pending;
    bool quit, sync_ready;
};

static void *lane_main(void *arg);

/* Whether layer i's input is a saved output: the save's, through views (flatten) of it. */
static bool reads_saved(const omv_model_layout_t *layout, uint32_t i)
{
    while (i-- > 0) {
        omv_layer_kind_t k = layout->layers[i].kind;
        if (k == OMV_LAYER_SAVE)
            return true;
        if (k != OMV_LAYER_FLATTEN)
            return false;
    }
    return false;
}

static int lane_init(lane_t *p, omv_net_t *net, uint32_t max_batch, bool own_grad)
{
    const omv_model_layout_t *layout = &net->layout;
    p->net = net;
    int ok = 1;
    for (uint32_t i = 0; i < layout->n_layers; i++) {
        omv_layer_t *l = &p->layers[i];
        /* A ReLU after a layer works in that layer's buffers: half the memory traffic. The
         * network's input is the caller's, so a first ReLU keeps its own, and so does one
         * whose input is a saved output (an add reads it later). */
        bool in_place =
            i > 0 && layout->layers[i].kind == OMV_LAYER_RELU && !reads_saved(layout, i);
        ok &= omv_layer_init(l, &layout->layers[i], max_batch, in_place) == 0;
        if ((l->spec.kind == OMV_LAYER_FLATTEN || in_place) && i > 0)
            l->dout = p->layers[i - 1].dout;
        if (l->spec.kind == OMV_LAYER_ADD)
            l->skip = &p->layers[l->spec.ref];
    }
    size_t probs = (size_t)max_batch * layout->classes;
    p->prob = malloc(probs * sizeof(float));
    ok &= p->prob != NULL;
    if (p->prob)
        memset(p->prob, 0, probs * sizeof(float));
    if (own_grad) {
        p->grad = malloc(layout->param_count * sizeof(float));
        ok &= p->grad != NULL;
        if (p->grad)
            memset(p->grad, 0, layout->param_count * sizeof(float));
    }
    return ok ? 0 : -ENOMEM;
}

static void lane_fini(lane_t *p)
{
    for (uint32_t i = 0; i < OMV_MODEL_MAX_LAYERS; i++)
        omv_layer_fini(&p->layers[i]);
    free(p->prob);
    free(p->grad);
}

omv_net_t *omv_net_new_threads(const omv_model_layout_t *layout, uint32_t max_batch,
                               uint32_t threads)
{
    if (max_batch == 0 || layout->n_layers == 0 || layout->n_layers > OMV_MODEL_MAX_LAYERS ||
        threads == 0 || threads > MAX_THREADS) {
        errno = EINVAL;
        return NULL;
    }
    omv_net_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    self->layout = *layout;
    self->max_batch = max_batch;
    /* No lane without an image to work on. */
    self->n_lanes = threads < max_batch ? threads : max_batch;
    self->lanes = calloc(self->n_lanes, sizeof(lane_t));
    int ok = self->lanes != NULL;
    uint32_t lane_batch = (max_batch + self->n_lanes - 1) / self->n_lanes;
    for (uint32_t i = 0; ok && i < self->n_lanes; i++) {
        ok &= lane_init(&self->lanes[i], self, lane_batch, self->n_lanes > 1) == 0;
        omv_rng_init(&self->lanes[i].rng, 1 + i);
    }
    if (ok && self->n_lanes > 1) {
        ok &= pthread_mutex_init(&self->mu, NULL) == 0;
        ok &= pthread_cond_init(&self->go, NULL) == 0;
        ok &= pthread_cond_init(&self->finished, NULL) == 0;
        self->sync_ready = ok;
        for (uint32_t i = 1; ok && i < self->n_lanes; i++) {
            ok &= pthread_create(&self->lanes[i].tid, NULL, lane_main, &self->lanes[i]) == 0;
            self->lanes[i].started = ok;
        }
    }
    if (!ok) {
        omv_net_destroy(&self);
        errno = ENOMEM;
        return NULL;
    }
    return self;
}

omv_net_t *omv_net_new(const omv_model_layout_t *layout, uint32_t max_batch)
{
    return omv_net_new_threads(layout, max_batch, 1);
}

void omv_net_destroy(omv_net_t **self_p)
{
    omv_net_t *self = *self_p;
    if (self == NULL)
        return;
    if (self->sync_ready) {
        pthread_mutex_lock(&self->mu);
        self->quit = true;
        pthread_cond_broadcast(&self->go);
        pthread_mutex_unlock(&self->mu);
        for (uint32_t i = 1; i < self->n_lanes; i++)
            if (self->lanes[i].started)
                pthread_join(self->lanes[i].tid, NULL);
        pthread_cond_destroy(&self->finished);
        pthread_cond_destroy(&self->go);
        pthread_mutex_destroy(&self->mu);
    }
    for (uint32_t i = 0; self->lanes && i < self->n_lanes; i++)
        lane_fini(&self->lanes[i]);
    free(self->lanes);
    free(self);
    *self_p = NULL;
}

const omv_model_layout_t *omv_net_layout(const omv_net_t *self)
{
    return &self->layout;
}

uint32_t omv_net_threads(const omv_net_t *self)
{
    return self->n_lanes;
}

void omv_net_seed(omv_net_t *self, uint64_t seed)
{
    for (uint32_t i = 0; i < self->n_lanes; i++)
        omv_rng_init(&self->lanes[i].rng, seed + i * 0x9e3779b97f4a7c15ULL);
}

void omv_net_profile(omv_net_t *self, double *seconds)
{
    self->seconds = seconds;
}

const float *omv_net_output(const omv_net_t *self, uint32_t i)
{
    return self->lanes[0].layers[i].out;
}

/* Where fully connected layer l's pieces begin, in units, as the hooks' cuts that fall between
 * rows of its weights cut it: starts[0] = 0 < ... < starts[n] = units (room for
 * MAX_PIECES + 1). Returns n: 1 when it is whole (not cut, or not exactly in pieces). */
#define MAX_PIECES 64

static uint32_t fc_pieces(const omv_layer_t *l, const omv_net_hooks_t *hooks, uint32_t *starts)
{
    const omv_model_layer_t *spec = &l->spec;
    uint32_t n = 0;
    starts[0] = 0;
    if (hooks->cuts != NULL && spec->fan_in > 0 && omv_layer_fc_split_exact(l))
        for (uint32_t c = 0; c < hooks->n_cuts && n + 1 < MAX_PIECES; c++) {
            size_t at = hooks->cuts[c];
            if (at <= spec->w_offset || at >= spec->w_offset + spec->w_count ||
                (at - spec->w_offset) % spec->fan_in != 0)
                continue;
            starts[++n] = (uint32_t)((at - spec->w_offset) / spec->fan_in);
        }
    starts[++n] = spec->units;
    return n;
}

/* Layer i's forward: its parameters asked for first (piece by piece, the last first, for a
 * fully connected layer the hooks' cuts fall in). */
static void layer_forward(lane_t *p, uint32_t i, const float *in, uint32_t batch, bool train)
{
    omv_net_t *net = p->net;
    const omv_net_hooks_t *hooks = p == &net->lanes[0] ? net->hooks : NULL;
    omv_layer_t *l = &p->layers[i];
    const omv_model_layer_t *spec = &l->spec;
    uint32_t starts[MAX_PIECES + 1], n = 1;
    if (hooks && spec->w_count + spec->b_count > 0) {
        n = spec->kind == OMV_LAYER_FC ? fc_pieces(l, hooks, starts) : 1;
        size_t lo = spec->w_count ? spec->w_offset : spec->b_offset;
        size_t hi = spec->b_count ? spec->b_offset + spec->b_count : spec->w_offset + spec->w_count;
        if (n == 1)
            hooks->need(hooks->ctx, lo, hi);
        else /* the biases (the last piece's shard, which comes first) */
            hooks->need(hooks->ctx, spec->b_offset, spec->b_offset + spec->b_count);
    }
    if (n == 1) {
        omv_layer_forward(l, net->params, in, batch, train, &p->rng);
        return;
    }
    for (uint32_t k = n; k-- > 0;) {
        hooks->need(hooks->ctx, spec->w_offset + (size_t)starts[k] * spec->fan_in,
                    spec->w_offset + (size_t)starts[k + 1] * spec->fan_in);
        omv_layer_fc_forward_units(l, net->params, in, batch, starts[k], starts[k + 1]);
    }
}

/* Layer i's backward, and the hooks told what became final: in pieces, the last first, for a
 * fully connected layer the hooks' cuts fall in (its biases' gradient first, its input's last);
 * else the whole layer. */
static void layer_backward(lane_t *p, uint32_t i, const float *in, float *din, float *grad,
                           bool early)
{
    omv_net_t *net = p->net;
    const omv_net_hooks_t *hooks = p == &net->lanes[0] ? net->hooks : NULL;
    omv_layer_t *l = &p->layers[i];
    const omv_model_layer_t *spec = &l->spec;
    bool has = spec->w_count + spec->b_count > 0;
    uint32_t starts[MAX_PIECES + 1];
    uint32_t n = hooks && early && spec->kind == OMV_LAYER_FC ? fc_pieces(l, hooks, starts) : 1;
    if (n == 1) {
        omv_layer_backward(l, net->params, in, din, p->count, grad);
        if (hooks && early && has)
            hooks->ready(hooks->ctx, spec->w_offset);
        return;
    }
    omv_layer_fc_backward_bias(l, p->count, grad);
    for (uint32_t k = n; k-- > 0;) {
        omv_layer_fc_backward_units(l, in, p->count, grad, starts[k], starts[k + 1]);
        hooks->ready(hooks->ctx, spec->w_offset + (size_t)starts[k] * spec->fan_in);
    }
    if (din != NULL)
        omv_layer_fc_backward_input(l, net->params, din, p->count);
}

/* Runs every layer of a lane on its images, then the softmax into prob. */
static void forward(lane_t *p, const float *x, bool train)
{
    omv_net_t *net = p->net;
    double *seconds = p == &net->lanes[0] ? net->seconds : NULL;
    const float *in = x;
    uint32_t n = net->layout.n_layers, batch = p->count;
    for (uint32_t i = 0; i < n; i++) {
        if (p == &net->lanes[0] && net->tick)
            net->tick(net->tick_ctx);
        double t0 = seconds ? omv_time_s() : 0.0;
        layer_forward(p, i, in, batch, train);
        if (seconds)
            seconds[i] += omv_time_s() - t0;
        in = p->layers[i].out;
    }
    /* Softmax per row, shifted by the row maximum for stability. */
    uint32_t c = net->layout.classes;
    for (uint32_t r = 0; r < batch; r++) {
        const float *z = in + (size_t)r * c;
        float *row = p->prob + (size_t)r * c;
        float m = z[0];
        for (uint32_t j = 1; j < c; j++)
            m = z[j] > m ? z[j] : m;
        float sum = 0.0f;
        for (uint32_t j = 0; j < c; j++) {
            row[j] = expf(z[j] - m);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (uint32_t j = 0; j < c; j++)
            row[j] *= inv;
    }
}

static float nll(float p)
{
    return -logf(p > 1e-30f ? p : 1e-30f);
}

/* Forward and backward of a lane: its gradient is that of the loss summed over its images
 * divided by the whole batch, so the lanes' gradients add up to the batch mean's. */
static void part_train(lane_t *p, uint32_t batch)
{
    omv_net_t *net = p->net;
    uint32_t n = net->layout.n_layers, c = net->layout.classes;
    const uint8_t *labels = net->labels + p->begin;
    const float *x = net->x + (size_t)p->begin * net->layout.inputs;
    float *grad = p->grad ? p->grad : net->grad;
    double *seconds = p == &net->lanes[0] ? net->seconds : NULL;
    forward(p, x, true);

    /* dL/dlogits = (p - onehot) / batch */
    float *d = p->layers[n - 1].dout;
    double loss = 0.0;
    float inv_b = 1.0f / (float)batch;
    for (uint32_t r = 0; r < p->count; r++) {
        const float *pr = p->prob + (size_t)r * c;
        float *dr = d + (size_t)r * c;
        loss += nll(pr[labels[r]]);
        for (uint32_t j = 0; j < c; j++)
            dr[j] = pr[j] * inv_b;
        dr[labels[r]] -= inv_b;
    }
    p->loss_sum = loss;
    /* Batch norm's backward reads the running statistics it pulled (the state, at the end of
     * the vector) and writes their update into the gradient's state, layer by layer: the
     * state is needed before backward, and final only at its end (no early ready then). */
    const omv_net_hooks_t *hooks = p == &net->lanes[0] ? net->hooks : NULL;
    bool has_state = net->layout.state_offset < net->layout.param_count;
    if (hooks && has_state)
        hooks->need(hooks->ctx, 0, net->layout.param_count);
    for (uint32_t i = n; i-- > 0;) {
        const float *in = i == 0 ? x : p->layers[i - 1].out;
        float *din = i == 0 ? NULL : p->layers[i - 1].dout;
        if (p == &net->lanes[0] && net->tick)
            net->tick(net->tick_ctx);
        double t0 = seconds ? omv_time_s() : 0.0;
        layer_backward(p, i, in, din, grad, !has_state);
        if (seconds)
            seconds[i] += omv_time_s() - t0;
    }
}

static void lane_eval(lane_t *p)
{
    omv_net_t *net = p->net;
    uint32_t c = net->layout.classes;
    const uint8_t *labels = net->labels + p->begin;
    forward(p, net->x + (size_t)p->begin * net->layout.inputs, false);
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t r = 0; r < p->count; r++) {
        const float *pr = p->prob + (size_t)r * c;
        uint32_t best = 0;
        for (uint32_t j = 1; j < c; j++)
            best = pr[j] > pr[best] ? j : best;
        correct += best == labels[r];
        loss += nll(pr[labels[r]]);
    }
    p->correct = correct;
    p->loss_sum = loss;
}

/* The batch of the step under way: every lane's count summed. */
static uint32_t step_batch(const omv_net_t *net)
{
    uint32_t b = 0;
    for (uint32_t i = 0; i < net->n_lanes; i++)
        b += net->lanes[i].count;
    return b;
}

static void lane_run(lane_t *p)
{
    if (p->count == 0) {
        /* Nothing to do; an empty lane still owes the sum a zero gradient. */
        if (p->grad && p->net->job == JOB_TRAIN)
            memset(p->grad, 0, p->net->layout.param_count * sizeof(float));
        p->loss_sum = 0.0;
        p->correct = 0;
        return;
    }
    if (p->net->job == JOB_TRAIN)
        part_train(p, step_batch(p->net));
    else
        lane_eval(p);
}

static void *lane_main(void *arg)
{
    lane_t *p = arg;
    omv_net_t *net = p->net;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&net->mu);
        while (net->gen == seen && !net->quit)
            pthread_cond_wait(&net->go, &net->mu);
        seen = net->gen;
        bool quit = net->quit;
        pthread_mutex_unlock(&net->mu);
        if (quit)
            return NULL;
        lane_run(p);
        pthread_mutex_lock(&net->mu);
        if (--net->pending == 0)
            pthread_cond_signal(&net->finished);
        pthread_mutex_unlock(&net->mu);
    }
}

/* Splits batch images over the lanes, runs them all (the caller's thread is lane 0) and waits. */
static void run_parts(omv_net_t *self, int job, const float *params, const float *x,
                      const uint8_t *labels, uint32_t batch, float *grad)
{
    self->job = job;
    self->params = params, self->x = x, self->labels = labels, self->grad = grad;
    for (uint32_t i = 0; i < self->n_lanes; i++) {
        lane_t *p = &self->lanes[i];
        p->begin = (uint32_t)((uint64_t)batch * i / self->n_lanes);
        p->count = (uint32_t)((uint64_t)batch * (i + 1) / self->n_lanes) - p->begin;
    }
    if (self->n_lanes > 1) {
        pthread_mutex_lock(&self->mu);
        self->pending = self->n_lanes - 1;
        self->gen++;
        pthread_cond_broadcast(&self->go);
        pthread_mutex_unlock(&self->mu);
    }
    lane_run(&self->lanes[0]);
    if (self->n_lanes > 1) {
        pthread_mutex_lock(&self->mu);
        while (self->pending > 0)
            pthread_cond_wait(&self->finished, &self->mu);
        pthread_mutex_unlock(&self->mu);
    }
}

/* The state (batch norm's running statistics) is each lane's value, not a share of a sum: the
 * summed values become the mean over the lanes that had images (an empty lane wrote zeros). */
static void mean_state(omv_net_t *self, float *grad)
{
    uint32_t used = 0;
    for (uint32_t k = 0; k < self->n_lanes; k++)
        used += self->lanes[k].count > 0;
    float inv = 1.0f / (float)(used ? used : 1);
    for (size_t i = self->layout.state_offset; i < self->layout.param_count; i++)
        grad[i] *= inv;
}

float omv_net_train_step(omv_net_t *self, const float *params, const float *x,
                         const uint8_t *labels, uint32_t batch, float *grad)
{
    return omv_net_train_step_hooked(self, params, x, labels, batch, grad, NULL);
}

void omv_net_set_tick(omv_net_t *self, void (*tick)(void *ctx), void *ctx)
{
    self->tick = tick;
    self->tick_ctx = ctx;
}

float omv_net_train_step_hooked(omv_net_t *self, const float *params, const float *x,
                                const uint8_t *labels, uint32_t batch, float *grad,
                                const omv_net_hooks_t *hooks)
{
    size_t count = self->layout.param_count;
    bool per_layer = hooks && self->n_lanes == 1;
    if (hooks && !per_layer)
        hooks->need(hooks->ctx, 0, count);
    self->hooks = per_layer ? hooks : NULL;
    run_parts(self, JOB_TRAIN, params, x, labels, batch, grad);
    self->hooks = NULL;
    double loss = 0.0;
    for (uint32_t i = 0; i < self->n_lanes; i++)
        loss += self->lanes[i].loss_sum;
    if (self->n_lanes > 1) {
        size_t n = self->layout.param_count;
        memcpy(grad, self->lanes[0].grad, n * sizeof(float));
        for (uint32_t k = 1; k < self->n_lanes; k++) {
            const float *g = self->lanes[k].grad;
            for (size_t i = 0; i < n; i++)
                grad[i] += g[i];
        }
        mean_state(self, grad);
    }
    if (hooks) {
        /* Layers without parameters at either end: the whole vector is read and final. */
        hooks->need(hooks->ctx, 0, count);
        hooks->ready(hooks->ctx, 0);
    }
    return (float)(loss / batch);
}

void omv_net_evaluate(omv_net_t *self, const float *params, const float *x, const uint8_t *labels,
                      uint32_t batch, uint32_t *ret_correct, double *ret_loss_sum)
{
    run_parts(self, JOB_EVAL, params, x, labels, batch, NULL);
    uint32_t correct = 0;
    double loss = 0.0;
    for (uint32_t i = 0; i < self->n_lanes; i++) {
        correct += self->lanes[i].correct;
        loss += self->lanes[i].loss_sum;
    }
    *ret_correct = correct;
    *ret_loss_sum = loss;
}
