/* A checkpoint of a job over shard servers as one consistent cut: each server writes its range
 * as a part file (the parameters, momentum and second moments of shards [first, last)), and the
 * coordinator writes the manifest last: a checkpoint file that names every part with its size
 * and CRC-32 in place of the model. A manifest reads only when every part it names is there,
 * whole and the one it names; otherwise it is not used (the reason names the part). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint_format.h"
#include "checkpoint_io.h"

/* One part to write: its range (ref's first, last, offset, count) of a model of param_count,
 * for checkpoint seq of job_name; the arrays hold the range's count values. */
typedef struct {
    uint64_t seq;
    const char *job_name;
    uint64_t param_count;
    omv_checkpoint_part_ref_t ref;
    const float *params, *velocity, *second; /* second: NULL without Adam */
    uint64_t adam_steps;
} omv_checkpoint_part_t;

/* The part's file name: checkpoint-<seq>.shards-<first>-<last>.part. */
void omv_checkpoint_part_name(uint64_t seq, uint32_t first, uint32_t last, char *out, size_t cap);

/* Writes part p into dir (tmp, fsync, rename, fsync of the folder). ret gets p's range with the
 * file's CRC-32 and size, for the manifest. Returns 0 or a negative errno with the reason in
 * err[OMV_CHECKPOINT_ERR_MAX]. */
int omv_checkpoint_write_part(const omv_checkpoint_part_t *p, const char *dir,
                              omv_checkpoint_part_ref_t *ret, char *err);

/* The manifest's section tag: c's n_parts, adam, adam_steps and parts. */
void omv_checkpoint_parts_write_section(omv_ckio_writer_t *w, const omv_checkpoint_t *c,
                                        uint32_t tag);

/* Reads the parts' section s into c (after its meta section): the parts must cover the model,
 * in order, each shard and parameter once. Returns 0 or -EINVAL with the reason in err. */
int omv_checkpoint_parts_read_section(omv_ckio_reader_t *s, omv_checkpoint_t *c, const char *path,
                                      char *err);

/* Fills c's params, velocity (and second, with adam) from the parts named in manifest c read
 * from path, in path's folder: the parts that hold any of parameters [lo, hi), the rest zero.
 * Returns 0, or -EINVAL (a part missing, damaged or another one) or -ENOMEM with the part and
 * the manifest named in err. */
int omv_checkpoint_parts_load(omv_checkpoint_t *c, const char *path, uint64_t lo, uint64_t hi,
                              char *err);

/* Removes the part files in dir whose checkpoint is not in keep[n_keep] and not newer than
 * newest (a part of a checkpoint still being written is newer), and parts' temporary files.
 * Returns how many files were removed. */
int omv_checkpoint_parts_prune(const char *dir, const uint64_t *keep, size_t n_keep,
                               uint64_t newest);
