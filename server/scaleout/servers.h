/* The shard servers that registered with this daemon (omnivored --role shard): their records,
 * by id, kept as long as the daemon runs; which run holds which, and the messages to them. A
 * job with [cluster] servers = N takes N free ones and spreads its model over them. Knows
 * nothing of runs beyond their ids. */
#pragma once

#include <stdint.h>

#include "router.h"
#include "wire.h"

typedef struct {
    int used, alive;
    omv_peer_t peer;
    char host[64];
    char endpoint[OMV_WIRE_ENDPOINT_MAX]; /* where workers reach it */
    char public_key[41];                  /* its CURVE key for workers ("": none) */
    uint32_t pid;
    int64_t joined_ms, last_seen_ms;
    uint64_t run_id;      /* the run it holds a part of (0: none) */
    uint32_t first, last; /* its shards in that run: [first, last) */
    int backup;           /* it holds them as their backup (the primary serves them) */
    uint64_t bytes_out;   /* sent to it: assignments */
    uint64_t bytes_in;    /* from it: gathered ranges */
    uint64_t gathers;     /* ranges it sent */
    uint64_t range_bytes; /* of its ranges sent to it (0: it made each itself) */
    uint32_t range_crc;   /* CRC-32 of the range its last ASSIGN asked it to make */
    /* What it last said of its part (STATS), and per second since the report before. */
    omv_server_msg_t stats;
    int64_t stats_ms;
    double in_per_s, out_per_s, applies_per_s, pushes_per_s;
} omv_server_t;

/* Ids are index + 1. */
typedef struct {
    omv_server_t rec[OMV_WIRE_MAX_SERVERS];
    uint32_t n; /* records used or used once */
    uint64_t registered_total, lost_total;
    uint64_t failovers_total; /* runs that went on from their ranges' holders, nothing lost */
} omv_servers_t;

static inline uint32_t omv_servers_id(const omv_servers_t *self, const omv_server_t *s)
{
    return (uint32_t)(s - self->rec) + 1;
}

/* Registers (or registers again: same endpoint) a shard server. Returns its record, or NULL
 * when every record is taken by a live server. */
omv_server_t *omv_servers_register(omv_servers_t *self, const omv_peer_t *peer,
                                   const omv_hello_t *h);
/* The live server with id that registered from peer, or NULL. */
omv_server_t *omv_servers_find(omv_servers_t *self, const omv_peer_t *peer, uint32_t id);
/* Live servers that hold no run's range. */
uint32_t omv_servers_free(const omv_servers_t *self);
/* Sends msg (payload as omv_wire_payload_count says) to server s. Returns 0 or -errno. */
int omv_servers_send(omv_servers_t *self, omv_router_t *router, omv_server_t *s,
                     const omv_msg_t *msg, const void *payload);
/* Sends msg to every live server that holds a part of run_id. */
void omv_servers_send_run(omv_servers_t *self, omv_router_t *router, uint64_t run_id,
                          const omv_msg_t *msg);
/* Takes a server's STATS (its counters), and works out its rates. */
void omv_servers_stats(omv_server_t *s, const omv_server_msg_t *st);
/* The run is over: its servers are free again. */
void omv_servers_release(omv_servers_t *self, uint64_t run_id);
