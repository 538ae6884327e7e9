/* A job's evaluations: requests, results and their history. */
#define OMV_LOG_TAG "daemon"
#include "eval.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

void omv_eval_init(omv_eval_t *self, double first_epoch)
{
    memset(self, 0, sizeof(*self));
    self->next_epoch = first_epoch;
}

void omv_eval_fini(omv_eval_t *self)
{
    free(self->history);
    memset(self, 0, sizeof(*self));
}

int omv_eval_send(omv_eval_t *self, omv_router_t *router, const omv_peer_t *peer,
                  const float *params, uint32_t count, double epoch, double wall_s, int final)
{
    if (self->evaluator == 0)
        return 0;
    if (self->busy) {
        self->wanted = 1;
        return 0;
    }
    omv_msg_t m = {.type = OMV_MSG_EVAL_REQUEST};
    m.u.eval_request.eval_id = ++self->id;
    m.u.eval_request.count = count;
    int r = omv_router_send(router, peer, &m, params);
    if (r < 0)
        omv_log_debug("cannot send the model to evaluator %u: %s", self->evaluator,
                      omv_strerror(r));
    self->busy = 1;
    self->wanted = 0;
    self->sent_ms = omv_time_ms();
    self->epoch = epoch;
    self->wall_s = wall_s;
    if (final)
        self->final_sent = 1;
    return 1;
}

int omv_eval_add(omv_eval_t *self, double epoch, double wall_s, double accuracy, double loss)
{
    if (self->n_history == self->cap_history) {
        size_t cap = self->cap_history ? self->cap_history * 2 : 64;
        omv_eval_point_t *h = realloc(self->history, cap * sizeof(*h));
        if (h == NULL) {
            omv_log_warn("out of memory for the evaluation history; this point is not kept");
            return -ENOMEM;
        }
        self->history = h;
        self->cap_history = cap;
    }
    self->history[self->n_history++] = (omv_eval_point_t){epoch, wall_s, accuracy, loss};
    return 0;
}

int omv_eval_result(omv_eval_t *self, const omv_eval_result_t *e)
{
    if (!self->busy || e->eval_id != self->id || e->total == 0 || e->correct > e->total)
        return -EPROTO;
    self->busy = 0;
    omv_eval_add(self, self->epoch, self->wall_s, (double)e->correct / e->total, e->loss);
    return 0;
}

void omv_eval_lost(omv_eval_t *self)
{
    self->evaluator = 0;
    self->busy = 0;
    self->final_sent = 0;
}

double omv_eval_last_accuracy(const omv_eval_t *self)
{
    return self->n_history ? self->history[self->n_history - 1].accuracy : NAN;
}

double omv_eval_last_loss(const omv_eval_t *self)
{
    return self->n_history ? self->history[self->n_history - 1].loss : NAN;
}
