/* What a job computes on in this worker: the engine built from its model, its data (a training
 * slice, or the test set) in a seeded order, and the buffers for the parameters and a batch.
 * Built once for a job, again when the daemon runs another. */
#pragma once

#include <stdint.h>

#include "dataset.h"
#include "net.h"
#include "wire.h"

typedef struct omv_session omv_session_t;

typedef struct {
    int prepared; /* built for the session's job */
    omv_model_layout_t layout;
    omv_net_t *net;
    omv_dataset_norm_t norm;
    omv_dataset_t data;
    uint32_t slice_begin, slice_count; /* the slice in data */
    uint32_t *order;                   /* [data.count] this pass's permutation */
    uint64_t epoch;                    /* passes over our slice */
    uint32_t cursor;                   /* next position in order */
    float *params;                     /* [param_count] */
    float *x;                          /* [batch][inputs] */
    uint8_t *y;                        /* [batch] */
    uint8_t *got; /* [n_shards] which shards of the parameters awaited arrived */
} omv_workload_t;

/* Whether spec b is the job spec a describes (a daemon restart resumes the same one). */
int omv_workload_same_job(const omv_jobspec_t *a, const omv_jobspec_t *b);

/* Checks s's job against itself and its data; builds the engine for batches of up to batch
 * images and allocates the buffers, sending heartbeats meanwhile. Returns 0 or a negative
 * errno after logging why. */
int omv_workload_prepare(omv_session_t *s, uint32_t batch);
/* Loads [begin, begin + count) of the training set (or the whole test set for an evaluator) and
 * checks it against the model. Returns 0 or a negative errno after logging why. */
int omv_workload_load(omv_session_t *s, uint32_t begin, uint32_t count);
/* Frees what omv_workload_prepare made; the workload is not prepared after. */
void omv_workload_release(omv_workload_t *self);

/* Gathers images idx[0..n) of the slice into the first n rows of x and y. */
void omv_workload_gather(omv_workload_t *self, const uint32_t *idx, uint32_t n);
/* Puts the data position where step `step` of an uninterrupted run would find it, for batches
 * of batch images and the job's seed. */
void omv_workload_seek(omv_workload_t *self, uint64_t seed, uint64_t step, uint32_t batch);
/* Gathers the next batch of our slice into x and y. */
void omv_workload_next_batch(omv_workload_t *self, uint64_t seed, uint32_t batch);
