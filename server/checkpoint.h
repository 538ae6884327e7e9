/* Checkpoints on disk: the daemon's training state (parameters, momentum, group clocks,
 * counters, evaluation history, the job file and optimizer state) in one checksummed, versioned
 * file, written atomically; and finding the newest valid one in a folder. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "optimizer.h"

#define OMV_CHECKPOINT_FORMAT 1
#define OMV_CHECKPOINT_ERR_MAX 512
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

/* Checkpoint seq's file name: checkpoint-<seq>.omv. */
void omv_checkpoint_name(uint64_t seq, char *out, size_t cap);

/* Writes self as DIR/checkpoint-<seq>.omv: into a temporary file, fsync, rename, fsync of the
 * folder, so a crash leaves the old file or the new one, never half of one. ret_path (optional,
 * cap bytes) gets the path. Returns 0 or a negative errno with the reason in
 * err[OMV_CHECKPOINT_ERR_MAX]. */
int omv_checkpoint_write(const omv_checkpoint_t *self, const char *dir, char *ret_path, size_t cap,
                         char *err);

/* Reads and verifies one file (magic, format version, length, CRC-32, sections; a manifest's
 * parts too, each of which must be there, whole, and the one it names). On success the
 * arrays in ret are allocated (release with omv_checkpoint_fini); on failure returns -EINVAL
 * (corrupt or truncated), -ENOTSUP (another format version) or an I/O errno, with the file named
 * in err. */
int omv_checkpoint_read(omv_checkpoint_t *ret, const char *path, char *err);
/* omv_checkpoint_read, where of a manifest only the parts that hold any of parameters [lo, hi)
 * are read (and checked): the model's other parameters and state are zero. */
int omv_checkpoint_read_range(omv_checkpoint_t *ret, const char *path, uint64_t lo, uint64_t hi,
                              char *err);

/* Frees what omv_checkpoint_read allocated and zeroes self. */
void omv_checkpoint_fini(omv_checkpoint_t *self);

/* Called for every checkpoint file that cannot be used, newest first, with the reason. */
typedef void (*omv_checkpoint_bad_fn)(void *ctx, const char *path, const char *reason);

/* Loads the newest checkpoint in dir that reads and verifies, trying older ones when the newest
 * is corrupt (each bad one is reported through bad). Returns 1 with ret filled and its path in
 * ret_path[cap], 0 when the folder has no usable checkpoint (or does not exist), or a negative
 * errno when the folder cannot be read. */
int omv_checkpoint_load_latest(omv_checkpoint_t *ret, const char *dir, char *ret_path, size_t cap,
                               omv_checkpoint_bad_fn bad, void *ctx);

/* The highest number of a checkpoint file in dir, usable or not (0: none). */
uint64_t omv_checkpoint_newest_seq(const char *dir);

/* Deletes all but the newest keep checkpoints in dir (and stale temporary files). Returns how
 * many files were removed, or a negative errno. */
int omv_checkpoint_prune(const char *dir, unsigned keep);

/* Creates dir and its parents (mode 0750) as needed. Returns 0 or a negative errno. */
int omv_checkpoint_mkdirs(const char *dir);
