/* A trainer's loop: each step's parameters pulled from the daemon or the shard servers, its
 * batch computed with the communication overlapping it (the engine's hooks), its gradient pushed
 * as the job's wire asks; and where the steps' time went. */
#pragma once

#include <stdint.h>

#include "rng.h"
#include "wire.h"

typedef struct omv_session omv_session_t;

/* Wire int8: the worker's parameters are its view of the model (common/q8.h). */
typedef struct {
    /* The view we hold from each link's daemon or server (0: none, so its next Params come
     * whole), and the changes each shard had since its view began. */
    uint64_t view[1 + 2 * OMV_WIRE_MAX_SERVERS];
    uint32_t *seq;                    /* [n_shards] */
    uint64_t changes_got, wholes_got; /* shards that came as a change, and whole to start one */
    uint8_t *grad8;                   /* one shard's gradient as it travels */
    float *residual;                  /* [param_count] what rounding to int8 has not sent yet */
} omv_trainer_int8_t;

/* Where a trainer's steps go, summed for the log at the end: computing, waiting for a step's
 * first parameters (the group's other members and the apply), for the rest of them during
 * forward, and sending gradients (s). */
typedef struct {
    uint64_t steps;
    double compute_s, begin_s, need_s, send_s;
} omv_trainer_times_t;

typedef struct {
    float *grad;      /* [param_count] */
    uint16_t *grad16; /* [param_count] the gradient as bf16 travels */
    omv_trainer_int8_t int8;
    uint8_t *pushed;      /* [n_shards] which shards of the step went out */
    const float *p;       /* where this step's parameters are: a segment or the workload's */
    float *g;             /* and its gradient */
    uint32_t have;        /* shards of the pull that arrived */
    uint64_t asked, step; /* the step asked for, and the one the daemon gave */
    uint32_t batch;       /* images to compute this step (from the daemon) */
    int pulled;           /* the next step's pull went out */
    int hook_err;         /* what went wrong inside the engine's hooks */
    double hook_s;        /* time spent in the hooks this step (not computing), s */
    omv_trainer_times_t times;
    omv_rng_t delay_rng; /* the emulated slower device's delays */
} omv_trainer_t;

/* Seeds the delays (per process). */
void omv_trainer_init(omv_trainer_t *self);
/* Frees the trainer's buffers (made by omv_trainer_run when the workload was not prepared). */
void omv_trainer_release(omv_trainer_t *self);

/* Trains from the Welcome's step until the daemon says stop. Returns OMV_WAIT_DONE,
 * OMV_WAIT_LOST (register again) or a negative errno. */
int omv_trainer_run(omv_session_t *s);
