/* A training job as a person writes it: an INI job file (model, data, hyperparameters,
 * consistency, evaluation), parsed and validated into omv_job_t. */
#pragma once

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define OMV_JOB_MAX_LAYERS 16
#define OMV_JOB_PATH_MAX 1024
#define OMV_JOB_MODEL_TEXT_MAX 4096

/* [train] optimizer: the update rule the daemon applies. */
enum { OMV_JOB_UPDATE_SGD, OMV_JOB_UPDATE_ADAM, OMV_JOB_UPDATE_ADAMW };
/* [train] schedule: how the learning rate moves over the job. */
enum { OMV_JOB_SCHEDULE_CONSTANT, OMV_JOB_SCHEDULE_STEP, OMV_JOB_SCHEDULE_COSINE };

typedef struct {
    /* [job] */
    char name[64];
    int64_t epochs;
    double stop_at_accuracy; /* 0: off */
    int64_t seed;
    /* [model]: either layers (an MLP) or definition (a file, one layer per line) */
    char layers_text[256];
    char definition[OMV_JOB_PATH_MAX];
    /* MLP widths, input first, parsed from layers_text; for a definition: its input size and
     * classes (n_layers 2) */
    uint32_t layers[OMV_JOB_MAX_LAYERS];
    uint32_t n_layers;
    /* The model definition text (common/model.h): the definition file's contents, or made from
     * layers; model_name names it in messages. */
    char model_text[OMV_JOB_MODEL_TEXT_MAX];
    char model_name[OMV_JOB_PATH_MAX];
    char init[OMV_JOB_PATH_MAX]; /* a safetensors file to start from (empty: random init) */
    /* [data] */
    char train_images[OMV_JOB_PATH_MAX];
    char train_labels[OMV_JOB_PATH_MAX];
    char test_images[OMV_JOB_PATH_MAX];
    char test_labels[OMV_JOB_PATH_MAX];
    int64_t train_limit;  /* use only the first N training images; 0: all */
    int64_t augment_pad;  /* training: random crop after zero padding by this many pixels */
    int augment_flip;     /* training: flip half the images left to right */
    char data_format[16]; /* idx or cifar10 */
    char wire_name[8];    /* [cluster] wire: fp32, bf16 or int8 */
    int wire;             /* OMV_WIRE_* (wire.h), from wire_name once validated */
    char split_name[8];   /* [cluster] split: even or speed */
    int split_by_speed;   /* from split_name once validated */
    double scale;         /* pixel byte * scale, then per channel - mean, / std */
    char mean_text[256], std_text[256];
    float mean[16], std[16]; /* parsed: 0, 1 or as many as the model's input channels */
    uint32_t n_mean, n_std;
    /* [train] */
    int64_t batch_size; /* per compute group; each of its workers takes an equal part */
    double learning_rate;
    double momentum;
    double weight_decay;
    double gradient_norm_bound;   /* x the shard's running gradient norm; 0: none */
    int64_t gradient_norm_warmup; /* gradients per shard before the bound applies */
    char update_name[8];          /* optimizer: sgd, adam or adamw */
    int update;                   /* OMV_JOB_UPDATE_*, from update_name once validated */
    double beta1, beta2, epsilon; /* Adam's; beta1 is what the optimizer tunes as momentum */
    char schedule_name[16];       /* constant, step or cosine */
    int schedule;                 /* OMV_JOB_SCHEDULE_*, from schedule_name once validated */
    int64_t warmup_steps;         /* the learning rate rises linearly over these updates */
    double step_epochs;           /* step: the rate is multiplied by step_factor this often */
    double step_factor;
    /* [cluster] */
    int64_t workers;
    int64_t groups;
    int64_t staleness; /* -1: no bound */
    int64_t shards;
    int64_t servers;  /* shard servers the model is spread over; 0: the daemon holds it */
    int64_t replicas; /* copies of each server's range (2: a backup on another server) */
    double worker_timeout_s;
    double progress_timeout_s; /* a trainer that pushes nothing this long is dead */
    double start_timeout_s;    /* start with fewer than `workers` after this long */
    /* [eval] */
    double eval_every_epochs; /* 0: only at the end */
    int64_t eval_batch_size;
    double progress_interval_s;
    /* [optimizer] */
    int optimizer; /* tune groups, momentum and learning rate while training */
    int tune_groups, tune_momentum, tune_learning_rate; /* else the job's value is kept */
    int64_t phase_steps;                                /* steps of the slowest group per phase */
    int64_t probe_steps;                                /* per probe; 0: phase_steps / 80 */
    int64_t later_probe_steps; /* per probe of later searches; 0: from probe_steps */
    int first_grid_cold_lr;    /* the first search's grids: the cold start's lr only */
    /* [checkpoint] */
    char checkpoint_dir[OMV_JOB_PATH_MAX]; /* empty: <state_dir>/checkpoints/<name> */
    double checkpoint_every_s;             /* 0: not by time */
    int64_t checkpoint_every_steps;        /* 0: not by steps */
    int64_t checkpoint_keep;
    int checkpoint_resume;
} omv_job_t;

extern const omv_config_entry_t omv_job_table[];
extern const size_t omv_job_table_len;

/* Loads and validates a job file. Relative data paths are taken relative to the job file's
 * folder. On failure returns a negative errno and writes "file:line: [section] key: reason"
 * into err[OMV_CONFIG_ERR_MAX]. */
int omv_job_load(omv_job_t *ret_job, const char *path, char *err);

/* A job file is read once (omv_job_read, at most OMV_JOB_FILE_MAX bytes; *ret_text is the
 * caller's to free) and parsed from that text (omv_job_load_text, as omv_job_load parses path),
 * so the text kept for checkpoints is the one the job ran with. */
#define OMV_JOB_FILE_MAX (1 << 20)
int omv_job_read(const char *path, char **ret_text, char *err);
int omv_job_load_text(omv_job_t *ret_job, const char *path, const char *text, char *err);

/* Asked about every file a job names before any of them is read: returns 0 when path may be
 * read on someone's behalf, else a negative errno with the reason in err[OMV_CONFIG_ERR_MAX]. */
typedef int (*omv_job_path_check_fn)(void *ctx, const char *path, char *err);
/* omv_job_load_text that asks check(ctx, ...) about the data and definition files (each path of
 * a list) first; the first refusal is returned. */
int omv_job_load_text_checked(omv_job_t *ret_job, const char *path, const char *text,
                              omv_job_path_check_fn check, void *ctx, char *err);
/* Asks check about every data and definition file job names (after overrides). */
int omv_job_check_paths(const omv_job_t *job, omv_job_path_check_fn check, void *ctx, char *err);

/* Validates cross-key rules (the model, groups vs workers); also after command-line overrides.
 * Reads the definition file, if the job names one, into model_text and checks that its shapes
 * chain (errors name that file and line). path names the job file in messages. */
int omv_job_validate(omv_job_t *job, const char *path, char *err);

/* The learning rate's factor at `epoch` (fraction of epochs done, 0 at the start) after `steps`
 * updates, as [train] schedule and warmup_steps say: warmup (steps + 1) / warmup_steps, times
 * step_factor^floor(epoch / step_epochs) (step) or (1 + cos(pi * epoch / epochs)) / 2
 * (cosine, down to 0 at the end). 1 for a constant schedule without warmup. */
double omv_job_lr_factor(const omv_job_t *job, double epoch, uint64_t steps);

/* Parses "784 256 10" (spaces or commas) into widths. Returns the count or -EINVAL. */
int omv_job_parse_layers(const char *text, uint32_t *ret_widths, size_t cap);
