/* A job's evaluations: the evaluator it sends the model to, the request in flight, when the
 * next one is due, and the history of results. It decides nothing about the job; the run asks
 * it to send and tells it what came back. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "router.h"
#include "wire.h"

typedef struct {
    double epoch, wall_s, accuracy, loss;
} omv_eval_point_t;

/* Fields are for reading; change them through the functions below. */
typedef struct {
    uint32_t evaluator; /* member id of the live evaluator; 0: none */
    int busy;           /* a request is in flight */
    int wanted;         /* another is due once it is answered */
    int final_sent;     /* the request in flight is the job's final one */
    int64_t sent_ms;
    uint64_t id;               /* of the last request */
    double epoch, wall_s;      /* where the job stood when the request in flight was sent */
    double next_epoch;         /* when the next periodic one is due */
    omv_eval_point_t *history; /* [n_history], oldest first */
    size_t n_history, cap_history;
} omv_eval_t;

void omv_eval_init(omv_eval_t *self, double first_epoch);
void omv_eval_fini(omv_eval_t *self);

/* Sends params[count] to the evaluator at peer (the run gathered them), recording where the job
 * stands; final marks the job's last one. Without an evaluator nothing happens; with one busy,
 * another is wanted once it answers. Returns 1 when a request went out, else 0. */
int omv_eval_send(omv_eval_t *self, omv_router_t *router, const omv_peer_t *peer,
                  const float *params, uint32_t count, double epoch, double wall_s, int final);

/* Checks a result: 0 when it answers the request in flight (which is then over and its point
 * added to the history), -EPROTO when nobody asked for it. */
int omv_eval_result(omv_eval_t *self, const omv_eval_result_t *e);

/* Adds a point (also from a checkpoint). Returns 0 or -ENOMEM (logged; the point is dropped). */
int omv_eval_add(omv_eval_t *self, double epoch, double wall_s, double accuracy, double loss);

/* The evaluator is gone: nothing is in flight any more. */
void omv_eval_lost(omv_eval_t *self);

/* The last result's accuracy and loss (NaN before any). */
double omv_eval_last_accuracy(const omv_eval_t *self);
double omv_eval_last_loss(const omv_eval_t *self);
