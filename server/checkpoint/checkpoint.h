/* Checkpoints on disk: the daemon's training state (parameters, momentum, group clocks,
 * counters, evaluation history, the job file and optimizer state) in one checksummed, versioned
 * file, written atomically; and finding the newest valid one in a folder. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint_format.h"

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
