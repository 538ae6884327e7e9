/* A shard server's range of the model: its state packed for the wire and its CRC-32; the range
 * as a job begins (the coordinator sends the job and the range's CRC-32, the server makes the
 * range itself as the coordinator made the model, and only a range that comes out otherwise is
 * sent); and a server's GATHERED message. */
#pragma once

#include "run.h"
#include "servers.h"

/* How many whole-model arrays a range travels as: parameters and momentum, and with Adam its
 * second moments. */
uint32_t omv_range_arrays(const omv_run_t *self);
/* Copies [off, off + count) of the shards' gathered state into buf, array after array. */
void omv_range_pack(const omv_run_t *self, float *buf, uint32_t off, uint32_t count);
/* CRC-32 of range [first, last)'s parameters, momentum and (Adam) second moments as the shards
 * hold them, array after array; gathers them first. Returns 0 with the CRC in *ret, or -errno. */
int omv_range_crc(omv_run_t *self, uint32_t first, uint32_t last, uint32_t *ret);

/* A shard server: this range's GATHERED for gather id in *msg (its range, counters and
 * clocks). Returns its server message. */
omv_server_msg_t *omv_range_gathered_msg(const omv_run_t *self, omv_msg_t *msg, uint64_t id);

/* The coordinator: sends server s its part of the run (the job, its range, the clocks and
 * counters) and what the range must come out as. Returns 0 or -errno (logged). */
int omv_range_assign(omv_run_t *self, omv_server_t *s);
/* The coordinator: server s could not make its range (NEED_RANGE u): it is sent. Returns 0, or
 * -errno with why[cap] saying why it cannot be (the model here has moved on since the ASSIGN):
 * the run is to fail. */
int omv_range_send(omv_run_t *self, omv_server_t *s, const omv_server_msg_t *u, char *why,
                   size_t cap);

/* A shard server, after ASSIGN a (make_range): makes the range from checkpoint a->part_seq in
 * a->part_dir, or from the job's init (the path init, "" for the seed), and checks it against
 * a->range_crc. Returns 0, or -errno with the reason logged: the range is to be asked for
 * (NEED_RANGE), and the job waits for it. */
int omv_range_make(omv_run_t *self, const omv_server_msg_t *a, const char *init);
/* A shard server: the coordinator's RANGE (payload: parameters, momentum and second moments of
 * the range, bytes in all) for this run. Returns 0 or -EINVAL (logged). */
int omv_range_take(omv_run_t *self, const omv_server_msg_t *u, const void *payload, size_t bytes);
