/* A job's training timeline, for `history` and `omnivorectl report`: a point about once a
 * second of training (loss, throughput, configuration), halved in resolution when it grows long,
 * and the exact moments the groups, momentum or learning rate changed. Fed values by the run. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "eval.h"
#include "strbuf.h"
#include "tuner.h"

#define OMV_TIMELINE_MAX_POINTS 4096
#define OMV_TIMELINE_MAX_CHANGES 4096
#define OMV_TIMELINE_INTERVAL_S 1.0

typedef struct {
    double wall_s; /* training seconds since the job started (as eval points count) */
    double span_s; /* training seconds the point covers */
    double epoch;
    uint64_t steps_total, images_total;
    double loss_sum; /* training losses pushed in the interval, probes included */
    uint64_t loss_n;
    double images_per_s; /* every image trained on in the interval, probes included */
    uint32_t groups;
    double momentum, learning_rate;
    int probing; /* a probe ran at some time in the interval */
} omv_timeline_point_t;

/* The configuration from wall_s on: recorded when it changes, so a step plot is exact. */
typedef struct {
    double wall_s, epoch;
    uint64_t steps_total;
    uint32_t groups;
    double momentum, learning_rate;
    int probing;
    const char *cause; /* static text: "start", "regroup", "optimizer" */
} omv_timeline_change_t;

/* Where the job stands now: what each call below is fed. */
typedef struct {
    double train_s, epoch;
    uint64_t steps_total, images_total;
    uint64_t images_seen; /* images trained on, probes included: what throughput counts */
    uint32_t groups;
    double momentum, learning_rate;
    int probing;
} omv_timeline_now_t;

/* Fields are for reading. */
typedef struct {
    omv_timeline_point_t *points; /* [cap_points] */
    size_t n_points, cap_points;
    omv_timeline_change_t *changes; /* [cap_changes] */
    size_t n_changes, cap_changes;
    uint64_t changes_dropped; /* the oldest changes, let go of when the list was full */
    double interval_s;        /* training seconds between points; doubles with each thinning;
                               * 0 until the job starts */
    double last_s;            /* train seconds at the last point */
    uint64_t last_images;     /* images seen at the last point */
    double loss_sum;          /* since the last point */
    uint64_t loss_n;
    int probed; /* a probe ran since the last point */
    int failed; /* out of memory once: logged, points are dropped */
} omv_timeline_t;

/* What the `history` reply says besides the timeline. */
typedef struct {
    const char *job, *state;
    double test_accuracy, train_s, epoch;
    const omv_eval_t *eval;   /* its history */
    const omv_tuner_t *tuner; /* its phases; may be NULL */
} omv_timeline_head_t;

/* An empty timeline; _fini frees it (and leaves it empty, ready for another job). */
void omv_timeline_init(omv_timeline_t *self);
void omv_timeline_fini(omv_timeline_t *self);

/* The job starts (or resumes): records the configuration it starts with. */
void omv_timeline_start(omv_timeline_t *self, const omv_timeline_now_t *now);
/* A worker pushed a finite training loss. */
void omv_timeline_loss(omv_timeline_t *self, double loss);
/* While the job runs (from the cron): adds a point when the interval has passed. */
void omv_timeline_tick(omv_timeline_t *self, const omv_timeline_now_t *now);
/* Training ended: adds a last point unless nothing happened since the last. */
void omv_timeline_end(omv_timeline_t *self, const omv_timeline_now_t *now);
/* After a change was carried out: records the configuration if it differs from the last one
 * recorded. cause is static text. */
void omv_timeline_config(omv_timeline_t *self, const omv_timeline_now_t *now, const char *cause);
/* The `history` command's reply: training points, evaluations, changes and phases. */
void omv_timeline_report(const omv_timeline_t *self, const omv_timeline_head_t *head,
                         omv_strbuf_t *out, int json);
