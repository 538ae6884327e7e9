/* The wire format: our message structs <-> protobuf-c envelopes. protobuf-c lives behind this
 * file only. A ZeroMQ message is one envelope frame and, for parameters, gradients and eval
 * snapshots, one frame of `count` raw little-endian values as the message's wire says (float32,
 * bf16 or int8 blocks; none in shared memory). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "q8.h"

/* Bump when a message changes meaning; Hello and Welcome carry it, a mismatch is refused. */
#define OMV_PROTOCOL_VERSION 9

/* An envelope larger than this is refused before it is parsed; payloads travel in frame 2. */
#define OMV_WIRE_MAX_ENVELOPE (64 * 1024)
#define OMV_WIRE_MAX_SHARDS 256
#define OMV_WIRE_MAX_AUGMENT_PAD 16
#define OMV_WIRE_REASON_MAX 256

/* How parameters and gradients travel ([cluster] wire): the daemon keeps fp32 either way.
 * OMV_WIRE_SHM (Params and Push only): the fp32 values are in the worker's shared segments
 * (common/shm.h) at the message's offset, and no payload frame follows. OMV_WIRE_INT8
 * (common/q8.h): int8 values with a scale per block: a gradient, or a change to the worker's
 * view of a shard (Params; a job with that wire starts each view with fp32). */
enum { OMV_WIRE_FP32 = 0, OMV_WIRE_BF16 = 1, OMV_WIRE_SHM = 2, OMV_WIRE_INT8 = 3 };

/* Bytes count values take on wire (none in shared memory). */
static inline size_t omv_wire_value_bytes(uint32_t wire, size_t count)
{
    return wire == OMV_WIRE_SHM    ? 0
           : wire == OMV_WIRE_INT8 ? omv_q8_bytes(count)
           : wire == OMV_WIRE_BF16 ? count * 2
                                   : count * 4;
}

/* How a job of [cluster] wire sends whole parameters: int8 starts each worker's view with
 * exact ones, then sends changes (OMV_WIRE_INT8). */
static inline uint32_t omv_wire_of_params(uint32_t job_wire)
{
    return job_wire == OMV_WIRE_INT8 ? OMV_WIRE_FP32 : job_wire;
}
/* The name of a daemon's shared-memory socket (abstract, so per network namespace). */
#define OMV_WIRE_SHM_NAME_MAX 96

typedef enum {
    OMV_MSG_NONE = 0,
    OMV_MSG_HELLO,
    OMV_MSG_WELCOME,
    OMV_MSG_PULL,
    OMV_MSG_PARAMS,
    OMV_MSG_PUSH,
    OMV_MSG_HEARTBEAT,
    OMV_MSG_EVAL_REQUEST,
    OMV_MSG_EVAL_RESULT,
    OMV_MSG_ERROR,
    OMV_MSG_STOP,
    OMV_MSG_LEAVE,
    OMV_MSG_ATTACH,
    OMV_MSG_REPORT,
    OMV_MSG_SERVER,
} omv_msg_type_t;

typedef enum {
    OMV_ROLE_TRAINER = 0,
    OMV_ROLE_EVALUATOR = 1,
    OMV_ROLE_SHARD = 2, /* a shard server (omnivored --role shard) */
} omv_role_t;

/* Shard servers a job's model may be spread over, and the groups a coordinator tells them of. */
#define OMV_WIRE_MAX_SERVERS 16
#define OMV_WIRE_MAX_CLOCKS 2304
#define OMV_WIRE_ENDPOINT_MAX 256
#define OMV_WIRE_PATH_MAX 1024 /* a folder named to a peer (a checkpoint's parts) */

/* Refusal reasons; the same numbers as ErrorCode in omnivore.proto. */
typedef enum {
    OMV_REFUSE_NONE = 0,
    OMV_REFUSE_MALFORMED,
    OMV_REFUSE_VERSION,
    OMV_REFUSE_UNKNOWN_WORKER,
    OMV_REFUSE_SHAPE,
    OMV_REFUSE_NOT_FINITE,
    OMV_REFUSE_STEP,
    OMV_REFUSE_FULL,
    OMV_REFUSE_ROLE,
    OMV_REFUSE_NORM,  /* a gradient far larger than its shard has been receiving */
    OMV_REFUSE_AUTH,  /* a key not (or no longer) admitted, or not for the role it asks */
    OMV_REFUSE_COUNT_ /* number of reasons */
} omv_refuse_t;

/* Names a refusal reason for logs and status keys ("malformed", "not_finite", ...). */
const char *omv_refuse_name(omv_refuse_t code);

typedef struct {
    uint32_t protocol_version;
    omv_role_t role;
    char hostname[64];
    uint32_t pid;
    uint32_t threads;
    uint32_t previous_worker_id;
    char name[64]; /* may be empty */
    /* A shard server: where workers reach it, and its CURVE public key ("": none). */
    char endpoint[OMV_WIRE_ENDPOINT_MAX];
    char public_key[41];
} omv_hello_t;

/* A shard server as workers see it: it holds shards [first_shard, last_shard). */
typedef struct {
    char endpoint[OMV_WIRE_ENDPOINT_MAX];
    char public_key[41];
    uint32_t first_shard, last_shard;
} omv_server_info_t;

typedef struct {
    char name[64];
    uint32_t layers[OMV_JOB_MAX_LAYERS];
    uint32_t n_layers;
    char model[OMV_JOB_MODEL_TEXT_MAX]; /* definition text; "" means: layers are MLP widths */
    char data_format[16];               /* "idx" (or "") or "cifar10" */
    float scale;                        /* 0: 1/255 */
    float mean[16], std[16];
    uint32_t n_mean, n_std;
    uint32_t augment_pad;  /* training: random crop after zero padding by this many pixels */
    uint32_t augment_flip; /* training: flip half the images left to right */
    char train_images[OMV_JOB_PATH_MAX];
    char train_labels[OMV_JOB_PATH_MAX];
    char test_images[OMV_JOB_PATH_MAX];
    char test_labels[OMV_JOB_PATH_MAX];
    uint32_t batch_size;
    uint64_t seed;
    uint32_t slice_begin, slice_count;
    uint32_t steps_per_epoch, total_steps;
    uint32_t param_count;
    uint32_t shard_offsets[OMV_WIRE_MAX_SHARDS + 1];
    uint32_t n_shards;
    uint32_t eval_batch_size;
    uint32_t wire; /* OMV_WIRE_*: how parameters and gradients travel */
} omv_jobspec_t;

typedef struct {
    uint32_t protocol_version;
    uint32_t worker_id;
    uint32_t group;
    omv_jobspec_t job; /* unset when idle */
    uint64_t start_step;
    int idle; /* registered, but the daemon has no job now */
    /* Where a trainer on the daemon's host (and network namespace) can ask for shared
     * segments (common/shm.h), and the token that proves it is this worker; empty: none. */
    char shm_socket[OMV_WIRE_SHM_NAME_MAX];
    uint64_t shm_token;
    /* The model on shard servers: every shard is on exactly one of them, in order; the worker
     * attaches to each with attach_token, and reports its steps to the coordinator. */
    omv_server_info_t servers[OMV_WIRE_MAX_SERVERS];
    uint32_t n_servers; /* 0: the daemon holds the model */
    uint64_t attach_token;
    /* Backups of servers' ranges (each range one of the servers'): pushed to as well. */
    omv_server_info_t backups[OMV_WIRE_MAX_SERVERS];
    uint32_t n_backups;
} omv_welcome_t;

typedef struct {
    uint32_t worker_id;
    uint64_t token;
} omv_attach_t;

typedef struct {
    uint32_t worker_id;
    uint64_t step;
    float loss;
    uint32_t samples;
    float compute_ms;
} omv_step_report_t;

/* Coordinator <-> shard server (proto's ServerOp). */
typedef enum {
    OMV_SERVER_ASSIGN = 0,
    OMV_SERVER_MEMBER,
    OMV_SERVER_START,
    OMV_SERVER_GATHER,
    OMV_SERVER_END,
    OMV_SERVER_GATHERED,
    OMV_SERVER_STATS,
    OMV_SERVER_FREEZE,
    OMV_SERVER_FROZEN,
    OMV_SERVER_CUT,
    OMV_SERVER_RESUME,
    OMV_SERVER_DROP_PART,
    OMV_SERVER_NEED_RANGE,
    OMV_SERVER_RANGE,
    OMV_SERVER_OP_COUNT_
} omv_server_op_t;

/* SERVER_RESUME's reconfig: what changes at the cut. */
enum {
    OMV_SERVER_RECONFIG_REGROUP = 1,
    OMV_SERVER_RECONFIG_SGD = 2,
    OMV_SERVER_RECONFIG_SNAPSHOT = 4,
    OMV_SERVER_RECONFIG_RESTORE = 8,
    OMV_SERVER_RECONFIG_PROBING = 16, /* from the cut on, steps are the optimizer's probe's */
};

/* SERVER_STATS's state: the server dropped its part (the coordinator takes it for lost). */
enum { OMV_SERVER_STATS_DROPPED = 1 };

/* SERVER_MEMBER's state: a trainer that joined, left or died, or the job's evaluator (it
 * attaches, and evaluations' GATHERs name it). */
enum {
    OMV_SERVER_MEMBER_ALIVE = 0,
    OMV_SERVER_MEMBER_LEFT = 1,
    OMV_SERVER_MEMBER_DEAD = 2,
    OMV_SERVER_MEMBER_EVALUATOR = 3,
};

typedef struct {
    omv_server_op_t op;
    uint32_t server_id;
    uint32_t first_shard, last_shard;
    uint32_t train_count;
    uint32_t n_groups;
    uint64_t clocks[OMV_WIRE_MAX_CLOCKS];
    uint32_t job_bytes; /* ASSIGN: the omv_job_t leads the payload, padded to 4 bytes */
    uint32_t worker_id, slot, group, state; /* MEMBER; GATHER's worker_id: the evaluator that
                                             * gets the range (as Params, step the gather's
                                             * id), not the coordinator; 0: the coordinator */
    char host[64];
    char key[41];
    uint64_t token;
    uint64_t gather_id;
    int final;
    uint32_t count; /* 4-byte words that follow */
    uint64_t images, steps;
    uint64_t pushes, pulls, bytes_in, bytes_out; /* STATS */
    uint64_t adam_steps;
    uint32_t reconfig; /* RESUME: OMV_SERVER_RECONFIG_* (payload: each slot's group) */
    float learning_rate, momentum, weight_decay;
    int no_ranges; /* CUT: answer GATHERED without the range */
    int backup;    /* ASSIGN: hold the range as its backup */
    int failover;  /* FREEZE, CUT: a failover's cut, at the steps applied */
    /* CUT: write the range as part part_seq in part_dir ("": send it); GATHERED: part, with the
     * part file's CRC-32 and size, in place of the range. */
    char part_dir[OMV_WIRE_PATH_MAX];
    uint64_t part_seq;
    int part;
    uint32_t part_crc;
    uint64_t part_bytes;
    int params_only; /* GATHER, GATHERED: the parameters alone (an evaluation's), no state */
    /* ASSIGN: no range follows the job; the server makes it (from checkpoint part_seq in
     * part_dir, or as the job starts) and checks it against range_crc, or asks NEED_RANGE. */
    int make_range;
    uint32_t range_crc;
} omv_server_msg_t;

typedef struct {
    uint32_t worker_id;
    uint64_t step;
    uint64_t view; /* wire int8: the view it holds from this daemon (0: none) */
} omv_pull_t;

typedef struct {
    uint64_t step;
    uint32_t shard, offset, count; /* count floats follow */
    uint32_t group;
    uint32_t slice_begin, slice_count;
    uint32_t batch;  /* images to compute this step */
    uint32_t wire;   /* OMV_WIRE_*: how the values are stored */
    uint32_t shared; /* wire OMV_WIRE_SHM: in the model segment, not the worker's (common/shm.h) */
    /* Job wire int8: fp32 with view set starts the worker's view of the shard (view_seq 0);
     * OMV_WIRE_INT8 is its view_seq-th change since (common/q8.h). */
    uint64_t view;
    uint32_t view_seq;
} omv_params_t;

typedef struct {
    uint32_t worker_id;
    uint64_t step;
    uint32_t shard, offset, count; /* count floats follow */
    float loss;
    uint32_t samples;
    float compute_ms;
    uint32_t wire; /* OMV_WIRE_*: how the values are stored */
} omv_push_t;

typedef struct {
    uint32_t worker_id;
} omv_heartbeat_t;

typedef struct {
    uint64_t eval_id;
    uint32_t count; /* count floats follow: the whole model */
} omv_eval_request_t;

typedef struct {
    uint32_t worker_id;
    uint64_t eval_id;
    uint32_t correct, total;
    float loss;
} omv_eval_result_t;

typedef struct {
    omv_refuse_t code;
    char reason[OMV_WIRE_REASON_MAX];
} omv_error_t;

typedef struct {
    char reason[OMV_WIRE_REASON_MAX];
    int reconnect; /* the daemon stops, the job does not: reconnect */
} omv_stop_t;

typedef struct {
    uint32_t worker_id;
    char reason[OMV_WIRE_REASON_MAX];
} omv_leave_t;

typedef struct {
    omv_msg_type_t type;
    union {
        omv_hello_t hello;
        omv_welcome_t welcome;
        omv_pull_t pull;
        omv_params_t params;
        omv_push_t push;
        omv_heartbeat_t heartbeat;
        omv_eval_request_t eval_request;
        omv_eval_result_t eval_result;
        omv_error_t error;
        omv_stop_t stop;
        omv_leave_t leave;
        omv_attach_t attach;
        omv_step_report_t report;
        omv_server_msg_t server;
    } u;
} omv_msg_t;

/* Names a message type for logs. */
const char *omv_msg_name(omv_msg_type_t type);
/* Names a coordinator <-> shard server operation for logs. */
const char *omv_server_op_name(omv_server_op_t op);

/* Values that must follow this message in its second frame (0 for none). */
uint32_t omv_wire_payload_count(const omv_msg_t *msg);
/* The payload's size in bytes: its count of values times 4 (fp32) or 2 (bf16). */
size_t omv_wire_payload_bytes(const omv_msg_t *msg);

/* Encodes msg into buf[cap]. Returns 0 and the length in ret_len, -EMSGSIZE when it does not
 * fit, -EINVAL for a message we cannot send (unknown type). Allocates nothing. */
int omv_wire_encode(const omv_msg_t *msg, uint8_t *buf, size_t cap, size_t *ret_len);

/* Decodes len bytes into ret. Returns 0, or -EPROTO with the reason in why[OMV_WIRE_REASON_MAX]
 * (optional) for bytes that are not a well-formed envelope within our limits. Allocates nothing
 * on the heap (protobuf-c works in a per-thread arena). */
int omv_wire_decode(const uint8_t *buf, size_t len, omv_msg_t *ret, char *why);

/* Convenience constructors. */
void omv_wire_error(omv_msg_t *msg, omv_refuse_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
