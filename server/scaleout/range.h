/* A shard server's range as a job begins (or begins again from a checkpoint): the coordinator
 * sends the job and the range's CRC-32, not the range, and the server makes the range itself
 * the way the coordinator made the model (the job's seed, [model] init, or the checkpoint it
 * resumed, read from the storage they share). Only a range that comes out otherwise (a file the
 * server cannot read, another build) is sent, and the server starts the job once it has it. So
 * a job's parameters pass the coordinator neither at its start nor when it goes back to a
 * checkpoint. Here too: putting a checkpoint's, an init file's or a range's state into the
 * shards, which the coordinator's run does as well. */
#pragma once

#include "run.h"

/* Puts checkpoint c's model and optimizer state into the shards (state of another update rule
 * starts afresh). Returns 0 or -errno. */
int omv_run_restore_state(omv_run_t *self, const omv_checkpoint_t *c);
/* [model] init: the model's weights from the safetensors file at path (optimizer state fresh).
 * Returns 0 or -EINVAL (logged). */
int omv_run_load_init(omv_run_t *self, const char *path);

/* Puts the coordinator's parameters, momentum and (Adam) second moments of this part's range
 * (count floats each; second NULL for SGD) in its shards. Returns 0 or -errno. */
int omv_run_part_load(omv_run_t *self, const float *params, const float *velocity,
                      const float *second, uint64_t adam_steps, size_t count);

/* How many whole-model arrays a range travels as: parameters and momentum, and with Adam its
 * second moments. */
uint32_t omv_run_state_arrays(const omv_run_t *self);
/* Copies [off, off + count) of the shards' gathered state into buf, array after array. */
void omv_run_pack_range(const omv_run_t *self, float *buf, uint32_t off, uint32_t count);

/* The coordinator: CRC-32 of server range [first, last)'s parameters, momentum and (Adam) second
 * moments as the shards hold them, array after array; gathers them first. Returns 0 with the
 * CRC in *ret, or -errno. */
int omv_run_range_crc(omv_run_t *self, uint32_t first, uint32_t last, uint32_t *ret);

/* The coordinator: sends server s its part of the run (the job, its range, the clocks and
 * counters) and what the range must come out as. Returns 0 or -errno (logged). */
int omv_run_send_assign(omv_run_t *self, omv_server_t *s);

/* The coordinator: server s could not make its range (NEED_RANGE u): it is sent. Returns 0, or
 * -errno with why[cap] saying why it cannot be (the model here has moved on since the ASSIGN):
 * the run is to fail. */
int omv_run_send_range(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *u, char *why,
                       size_t cap);

/* A shard server, after ASSIGN a (make_range): makes the range from checkpoint a->part_seq in
 * a->part_dir, or from the job's init (the path init, "" for the seed), and checks it against
 * a->range_crc. Returns 0, or -errno with the reason logged: the range is to be asked for
 * (NEED_RANGE), and the job waits for it. */
int omv_run_part_make(omv_run_t *self, const omv_server_msg_t *a, const char *init);

/* A shard server: the coordinator's RANGE (payload: parameters, momentum and second moments of
 * the range, bytes in all) for this run. Returns 0 or -EINVAL (logged). */
int omv_run_part_take_range(omv_run_t *self, const omv_server_msg_t *u, const void *payload,
                            size_t bytes);
