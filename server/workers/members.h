/* The daemon's member records: every worker that registered (trainers and evaluators), by id,
 * kept between jobs so that a worker keeps its id; lookup by id and peer, counts, and how the
 * training set is divided among the live trainers. Knows nothing of groups or jobs. */
#pragma once

#include <stdint.h>

#include "router.h"
#include "wire.h"

/* OMV_MEMBER_IDLE: registered while there is no job to run (it waits for the next one);
 * OMV_MEMBER_DONE: a record of a finished job, whose worker was told to register again. */
typedef enum {
    OMV_MEMBER_ALIVE,
    OMV_MEMBER_DEAD,
    OMV_MEMBER_LEFT,
    OMV_MEMBER_IDLE,
    OMV_MEMBER_DONE
} omv_member_state_t;

#define OMV_MEMBERS_MAX 1024
/* Step reports a member may be ahead of its group at the daemon (shard servers). */
#define OMV_MEMBER_EARLY_MAX 256

typedef struct {
    int used;
    omv_member_state_t state;
    omv_peer_t peer;
    omv_peer_t job_peer; /* the peer it had in the previous job (it keeps its id between jobs);
                          * what that connection still sends is dropped */
    omv_role_t role;
    uint32_t slot; /* trainers: their slot in the run's groups */
    char host[64];
    char name[64]; /* the worker's --name; may be empty */
    char key[41];  /* the CURVE key it registered with ("" without): its id is bound to it */
    uint32_t pid;
    uint32_t previous_id; /* the id it had before it rejoined; 0 for a first registration */
    int64_t joined_ms, last_seen_ms;
    int64_t last_push_ms; /* when it last pushed a gradient; 0: never */
    int64_t served_ms;    /* when it was last sent the first shard of a step */
    uint64_t steps;       /* steps pushed */
    uint64_t images;      /* images pushed */
    float last_compute_ms;
    uint32_t slice_begin, slice_count; /* its part of the training set now */
    int parked;                        /* a pull is waiting */
    uint64_t parked_step;
    /* Shards of parked_step sent already: a pull that waits for its group's current step is
     * answered shard by shard as each shard of that step is applied. */
    uint32_t sent_n;
    uint64_t sent[(OMV_WIRE_MAX_SHARDS + 63) / 64];
    uint32_t batch;        /* images it was given for the step it was last sent */
    uint32_t planned;      /* [cluster] split = speed: its share of its group's batch */
    float weight;          /* what its gradient counts for in its group's mean, set with batch */
    double ms_per_image;   /* its compute time per image, averaged over recent steps */
    int served;            /* it was sent parameters at least once */
    uint64_t served_step;  /* the step it was last sent parameters for */
    uint64_t regroup_step; /* a shard server regrouped at a cut before its pull came: for this */
    /* A trainer on the daemon's host: its shared segments (common/shm.h), while shm_on. */
    uint64_t shm_token;    /* what its Welcome offered; 0: nothing offered */
    uint64_t attach_token; /* the model on shard servers: what its Attach to them carries */
    /* Job wire int8 over sockets: the view of the parameters the shards keep for it (common/
     * q8.h), and whether its pull under way starts a new one (the shards send them whole). */
    uint64_t view_token;
    int view_new;
    int join_pending; /* a trainer that joins a job on shard servers at the next cut */
    int join_rejoin;
    /* Its reports of steps after its group's current one, which came before the other members'
     * reports of the current step: they travel on other connections than the gradients, which
     * the servers gate, and a worker's connection to the daemon may lag its others by many
     * steps on a loaded host. A ring, oldest at early_head. */
    omv_step_report_t *early; /* [OMV_MEMBER_EARLY_MAX] once needed; freed with the record */
    uint32_t early_head, n_early;
    int shm_on;
    int shm_conn;  /* the connection it got them on: it closes when the worker's process goes */
    int shm_model; /* it maps the model segment (common/shm.h): parameters can be read in place */
    int inplace;   /* this pull's parameters are read in place (fixed when its first shard goes) */
    uint64_t inplace_sent[(OMV_WIRE_MAX_SHARDS + 63) / 64]; /* shards read in place, not pushed */
    uint32_t inplace_writes[OMV_WIRE_MAX_SHARDS]; /* the shard's writes when it was sent */
    float *shm_params, *shm_grads;
    size_t shm_bytes;
} omv_member_t;

/* A slot no group has: what a member holds until it is put in one. */
#define OMV_MEMBER_NO_SLOT UINT32_MAX

/* Ids are index + 1. Ids are not reused while never-used records remain, so a late message from
 * a dead worker cannot pass for another. The fields are for reading; change records through the
 * functions below or as the owner of a record (the run, for a trainer in its job). */
typedef struct {
    omv_member_t *records; /* [max] */
    uint32_t max, n;       /* n: records in use or used once (the highest id) */
    uint64_t joins_total, leaves_total, deaths_total, rejoins_total;
} omv_members_t;

/* Returns NULL with errno set. Caller owns; omv_members_destroy. */
omv_members_t *omv_members_new(uint32_t max);
void omv_members_destroy(omv_members_t **self_p);

static inline uint32_t omv_members_id(const omv_members_t *self, const omv_member_t *m)
{
    return (uint32_t)(m - self->records) + 1;
}

/* The record with id, or NULL when there is none such. */
omv_member_t *omv_members_get(omv_members_t *self, uint32_t id);

/* The live (or idle) member with id that registered from peer, or NULL. */
omv_member_t *omv_members_find(omv_members_t *self, const omv_peer_t *peer, uint32_t id);

/* Whether id is the record of a finished job's worker at peer: it was told to register again,
 * and what it sent before it heard is dropped without a word. */
int omv_members_from_finished_job(const omv_members_t *self, const omv_peer_t *peer, uint32_t id);

/* Makes the record for a Hello from peer: the worker's own record when it registers again
 * between jobs (it keeps its id), else a never-used one, else the oldest of a member that is
 * gone. The record is ALIVE, or IDLE when idle is set. *ret_rejoin says whether it rejoins
 * after a fault (it names an id it had, but not between jobs). Returns NULL when every record
 * is taken. */
omv_member_t *omv_members_register(omv_members_t *self, const omv_peer_t *peer,
                                   const omv_hello_t *h, int idle, int *ret_rejoin);

/* A shard server's record of the coordinator's trainer id (told by the coordinator): alive,
 * with no peer until the worker attaches. Returns NULL when id is out of range. */
omv_member_t *omv_members_adopt(omv_members_t *self, uint32_t id, const char *host, const char *key,
                                uint64_t attach_token);

/* Unmaps a member's shared segments and closes their connection. Whoever calls it makes sure
 * that no shard has a command in flight that points into them (omv_shardset_sync). */
void omv_members_shm_release(omv_member_t *m);

/* Live trainers, members that wait for a job, and members with shared segments now. */
int omv_members_live_trainers(const omv_members_t *self);
int omv_members_idle(const omv_members_t *self);
uint32_t omv_members_shm_in_use(const omv_members_t *self);

/* Divides train_count images among the live trainers in order of id, as if there were `among`
 * of them (among >= live trainers; 0: nothing changes). */
void omv_members_assign_slices(omv_members_t *self, uint32_t train_count, uint32_t among);

/* Sends Stop (reconnect: register again) to every member in state `from` and moves it to
 * `to` (to == from: sends only). */
void omv_members_stop_all(omv_members_t *self, omv_router_t *router, omv_member_state_t from,
                          omv_member_state_t to, const char *reason, int reconnect);

const char *omv_members_state_name(const omv_member_t *m);
