/* bench_ps's fixtures: child processes (the daemon under test, the raw echo server), the
 * daemon's control socket, and the generated job and data files. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

#include "strbuf.h"

/* Forks and execs argv (argv[0] a path) with stdout and stderr to log_path. The child gets
 * SIGTERM when this process dies, so no run of the bench leaves a daemon behind, whatever
 * kills it. Call it while this process has no other threads. Returns the pid or -errno. */
pid_t bench_spawn(char *const argv[], const char *log_path);

/* SIGTERM, then up to timeout_ms for the child to exit, then SIGKILL. Returns its exit status
 * (0 for a clean exit, 128 + N for signal N) or -1 when it had to be killed. pid <= 0: 0. */
int bench_stop(pid_t pid, int timeout_ms);

/* Whether the child pid is still running (it is reaped when it is not). */
int bench_alive(pid_t pid);

/* A loopback TCP port that was free a moment ago, or -errno. */
int bench_free_port(void);

/* The raw echo server's main: binds a ROUTER on endpoint, writes one byte to ready_fd once bound,
 * then sends every frame it receives back to its sender, zero-copy, until SIGTERM or SIGINT.
 * Returns the process's exit code. */
int bench_echo_main(const char *endpoint, int ready_fd);

/* Sends command (a control line without its newline, e.g. "status --json") to the daemon's
 * control socket at path; appends the raw reply ("ok\n" and the JSON) to out. Returns 0, -EPROTO
 * for a reply that is not ok, or -errno. */
int bench_control(const char *path, const char *command, omv_strbuf_t *out);

/* The integer after "key": in a JSON text, or -1. */
long long bench_json_int(const char *text, const char *key);

/* The sum of the integers in the array after "key":[...] in a JSON text, or -1. */
long long bench_json_array_sum(const char *text, const char *key);

/* IDX files of count blank 1 x cols images, all labelled 0. Returns 0 or -errno. */
int bench_write_idx(const char *images, const char *labels, uint32_t count, uint32_t cols);

typedef struct {
    const char *name;
    uint32_t in, out;            /* [model] layers = in out: in * out + out parameters */
    const char *images, *labels; /* used for training and test data alike */
    int workers;                 /* each its own group */
    int shards;
    int servers; /* [cluster] servers: shard servers the model is spread over; 0: none */
} bench_job_t;

/* A job file that the bench never finishes: one group per worker, no staleness bound, the most
 * epochs the job table allows, no evaluation before the end, no progress lines, workers declared
 * dead only after the longest timeout allowed. Returns 0 or -errno. */
int bench_write_job(const char *path, const bench_job_t *job);

/* Removes the folder dir and what is in it, subfolders too (the shard servers' state). */
void bench_remove_dir(const char *dir);
