/* What a checkpoint holds, as the daemon reads and writes it (checkpoint.h) and as a manifest
 * names its parts (checkpoint_parts.h): the types both build on. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint_io.h"
#include "optimizer.h"

#define OMV_CHECKPOINT_FORMAT 1
#define OMV_CHECKPOINT_MAX_GROUPS 1024
#define OMV_CHECKPOINT_MAX_PARAMS (1ull << 32)

typedef struct {
    double epoch, wall_s, accuracy, loss;
} omv_checkpoint_eval_t;

/* A phase the optimizer ran, for the summary. */
typedef struct {
    uint32_t phase, groups;
    double momentum, learning_rate;
    double epoch; /* when it began */
} omv_checkpoint_phase_t;

#define OMV_CHECKPOINT_MAX_PHASES 65536

/* The optimizer's part: an optional section, absent from checkpoints of jobs without the
 * optimizer and from those written before it existed (they read with present = 0). */
typedef struct {
    uint32_t present;
    omv_opt_saved_t state;
    uint64_t probe_images_total;
    double probe_seconds_total;
    uint32_t n_phases;
    omv_checkpoint_phase_t *phases; /* [n_phases] */
} omv_checkpoint_opt_t;

/* One range of a manifest's model: a file of its own beside the manifest (checkpoint_parts.h). */
typedef struct {
    uint32_t first, last;   /* shards [first, last) */
    uint64_t offset, count; /* parameters [offset, offset + count) */
    uint32_t crc;           /* the part file's CRC-32, as its trailer holds it */
    uint64_t bytes;         /* the part file's size */
} omv_checkpoint_part_ref_t;

#define OMV_CHECKPOINT_MAX_PARTS 4096

typedef struct {
    uint64_t seq; /* increases with every checkpoint of a run */
    char job_name[64];
    uint32_t finished; /* the job was done when this was written */
    uint64_t images_total, steps_total;
    double train_s; /* seconds of training before this checkpoint */
    uint32_t n_groups;
    uint64_t *clocks; /* [n_groups] steps each group completed */
    uint64_t param_count;
    float *params;       /* [param_count] */
    float *velocity;     /* [param_count] momentum (Adam: m) */
    float *second;       /* [param_count] Adam's second moment; NULL for SGD (optional section) */
    uint64_t adam_steps; /* Adam's updates applied (with second) */
    double learning_rate, momentum, weight_decay; /* the update rule in force */
    omv_checkpoint_eval_t *history;               /* [n_history] */
    uint32_t n_history;
    char *job_text;           /* the job file as it was (NUL-terminated); may be NULL */
    char *members;            /* one line per live worker: "id host pid group"; may be NULL */
    char *model_text;         /* the model definition the job ran (optional section); may be NULL */
    omv_checkpoint_opt_t opt; /* written when opt.present */
    /* A manifest: the model is in n_parts files beside it (written without params, velocity and
     * second; read with them filled from the parts). adam: the parts hold second moments. */
    uint32_t n_parts;
    omv_checkpoint_part_ref_t *parts; /* [n_parts], by offset */
    uint32_t adam;
} omv_checkpoint_t;
