/* What the suites of a model over shard servers share (servers_util.c): starting and
 * stopping the coordinator and the shard servers, their logs, the job trained on one daemon
 * and on servers, and the final checkpoints compared. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "checkpoint.h"
#include "peer_util.h"
#include "strbuf.h"

/* OMV_TEST_ONLY=name runs only the test of that name (while working on one). */
#define ADD_TEST(tc, fn)                                                                           \
    do {                                                                                           \
        const char *only = getenv("OMV_TEST_ONLY");                                                \
        if (only == NULL || strcmp(only, #fn) == 0)                                                \
            tcase_add_test(tc, fn);                                                                \
    } while (0)

/* A shell line run before shard servers start, in a mount namespace of their own (as root:
 * a folder of the coordinator's that they do not share with it); NULL: none. */
extern const char *shard_mounts;
extern int shard_mounts_for; /* the one shard server it is for */
/* The one shard server (-1: none) whose config allows no checkpoint folder of the job's: it can
 * neither read a checkpoint nor write a part there. */
extern int shard_confined;
/* What the next coordinators' config file says (NULL: they have none). */
extern const char *coordinator_conf;

/* A file's text into out[cap] ("" when it cannot be read). */
void read_file(const char *path, char *out, size_t cap);
/* Shard server i: its own endpoint, control socket, folder and log. */
pid_t start_shard(int i);
/* Stops shard server i (pid) and reads its log into text[cap]. */
void stop_shard(pid_t pid, int i, char *text, size_t cap);
/* The coordinator, with the job, its state in state (a folder of the test's) and its log. */
pid_t start_coordinator(const char *state);
/* The newest finished checkpoint in state's checkpoint folder of the job. */
void read_final(const char *state, omv_checkpoint_t *ck);
/* a and b hold the same model, bit for bit, after the same steps and images. */
void same_model(const omv_checkpoint_t *a, const omv_checkpoint_t *b);
/* The job as it is written, on one daemon: its final checkpoint in state "one". */
double train_on_one(omv_checkpoint_t *ck);
/* Prints the processes' logs (on stderr, for a failing test's record). */
void dump_logs(int n);
/* Waits up to 2 minutes for the job to be done; else prints the logs of the coordinator and
 * the n servers, and fails. Returns the test accuracy. */
double wait_done_or_dump(omv_strbuf_t *body, int n);
/* Shard server i's section of a `servers` listing. */
const char *server_section(const char *listing, int i);
/* What the coordinator gathered from each of the n servers (the `servers` listing). The job
 * evaluated evals times, the final one among them, direct of them sent by the servers. */
void check_gathers(const char *listing, int n, double evals, double direct);
/* The same job with its model on n shard servers; their logs are checked for their ranges, and
 * (where the job writes no checkpoints) what the coordinator gathered from them. */
double train_on_servers(int n, omv_checkpoint_t *ck, int checkpoints);
/* Copies file src to dst. */
void copy_file(const char *src, const char *dst);
/* The folder of the servers' run's checkpoints, made before its servers start. */
const char *servers_ckpt_dir(void);
/* Shard server i refused nothing (a backup's refusals, which it does not answer, too), and
 * the last part it held finished; with synchronous groups (exact), with the job's images: the
 * steps it applied since the last cut or assignment counted once. A backup a few steps behind
 * its primary when the job ends drops its part there (the job's model is its primaries'): with
 * may_stop, that passes too, short of the job's images and never past them, and the function
 * returns 0; else 1. */
int check_shard_counts_or_stop(int i, double images, int exact, int may_stop);
/* Attaches peer b (connected to a shard server) as worker id with token: Attach until the
 * server has been told of it (a join takes effect at a cut). */
void peer_attach(peer_t *b, uint32_t id, uint64_t token);
