/* bench_ps: push+pull round trips through the real omnivored, next to a raw ZeroMQ echo of the
 * same bytes in the same run, its ceiling (issue 4). Prints a table, then all figures as one
 * JSON object on the last line.
 *
 * Run it after `meson setup build && ninja -C build`, from anywhere:
 *   build/bench/bench_ps                        # 4k 1m 16m 64m x 1 2 8 workers x tcp ipc
 *   build/bench/bench_ps --quick                # short windows, one repeat: a smoke run
 *   build/bench/bench_ps --sizes 1m --workers 1,8 --transports tcp --seconds 2 --repeats 5
 *   meson test -C build --benchmark ps -v       # the full run through meson (about 4 min)
 *   meson test -C build --benchmark ps -v --test-args=--quick
 * To profile the daemon, attach to the pid each case prints on stderr while it runs:
 *   build/bench/bench_ps --sizes 1m --workers 1 --transports tcp --seconds 4 --repeats 2 &
 *   perf record -g -p <omnivored pid> -- sleep 10     (or strace -c -f -p <pid>)
 * Options: --sizes LIST (4k, 1m, 16m, 64m: KiB or MiB of float32 parameters), --workers LIST,
 *   --transports tcp,ipc, --seconds S (one measured window, default 0.6), --repeats R
 *   (measured windows per server, default 5), --shards N (the daemon's [cluster] shards,
 *   default 2),
 *   --daemon PATH (default $OMNIVORED, else ../server/omnivored next to this binary),
 *   --keep (keep the temporary folder: job files, data files, daemon logs).
 *
 * Per case (model size x workers x transport) it starts one omnivored on a generated job (an MLP
 * `layers = A B` with A*B+B parameters, tiny IDX files of 1xA images, one group per worker,
 * staleness none, a job far longer than the bench, worker_timeout_s at its maximum) and one raw
 * echo server (this binary re-executed with --echo-server: a ROUTER that sends every frame it
 * receives back, zero-copy). N fake workers, each a thread with its own ZeroMQ context (as a
 * worker process has), speak the wire protocol through common/wire: Hello -> Welcome, Pull(0),
 * then round trips of Push(step) per shard with a zero gradient + Pull(step+1) -> Params per
 * shard. An echo round trip sends the same frames (envelope + payload per shard) and waits for
 * them to come back. Both servers stay up for the whole case; measured windows of the two
 * alternate (raw, ps, ps, raw, ...) after one warm-up window each, so drift on this shared
 * machine hits both alike. Fake workers send payloads zero-copy from one zeroed buffer and
 * receive them with zmq_msg_recv without copying, so the client side costs as little as it can,
 * the same in both modes.
 *
 * Figures: GB/s = bytes moved both ways (2 x model bytes per round trip, 1 GB = 1e9 bytes) over
 * the window's wall time, all workers together; updates/s = round trips per second across
 * workers (with one worker per group, each push is one group step applied); latency = one round
 * trip, p50 and p99 over every round trip of the measured windows. GB/s and updates/s are the
 * median over windows. The daemon's group clocks and refusal counters are read back over its
 * control socket at the end of each case to check that every push was applied and none refused. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "ps_fixture.h"
#include "strbuf.h"
#include "util.h"
#include "wire.h"

#define MAX_LIST 8
#define MAX_WORKERS 64
#define LAT_CAP (1u << 18)     /* latency samples kept per worker per mode */
#define IMAGES 512             /* images in the generated training set */
#define RECV_TIMEOUT_MS 60000  /* one reply; a 64 MiB round trip with 8 workers takes ~1 s */
#define START_TIMEOUT_MS 30000 /* daemon and echo start, handshake */
#define STOP_TIMEOUT_MS 10000  /* SIGTERM to exit, then SIGKILL */
#define GOAL_RATIO 0.8         /* 1 MiB: ps at least this much of the raw echo */
#define GOAL_GBPS (2.0 * 1.8)  /* 1 MiB: twice ps-lite's 1.8 GB/s on this machine kind */
#define GOAL_SMALL_US 200.0    /* 4 KiB: round trip under this */

enum { MODE_RAW = 0, MODE_PS = 1 };
static const char *const mode_names[] = {"raw", "ps"};

typedef struct {
    size_t bytes;     /* model bytes */
    uint32_t in, out; /* layers = in out: in*out + out parameters */
    char label[16];   /* 4KiB, 1MiB, ... */
} size_spec_t;

typedef struct {
    /* Options. */
    size_spec_t sizes[MAX_LIST];
    int n_sizes;
    int workers[MAX_LIST];
    int n_workers;
    const char *transports[MAX_LIST];
    int n_transports;
    double seconds;
    int repeats;
    int shards;
    int quick, keep;
    char daemon[PATH_MAX];
    char self_exe[PATH_MAX];
    char dir[256];
    /* Buffers made once. */
    float *zeros; /* [largest model] the gradient every fake worker pushes */
} bench_t;

typedef struct {
    double gbps, ups; /* median over windows */
    double p50_us, p99_us;
    uint64_t round_trips;
    size_t samples;
} mode_result_t;

typedef struct {
    const size_spec_t *size;
    int workers;
    const char *transport;
    mode_result_t mode[2];
    int verified; /* the daemon's clocks match our pushes and it refused nothing */
    int ok;
    char error[256];
} case_result_t;

struct case_run;

typedef struct {
    struct case_run *c;
    int index;
    void *ctx, *ps, *echo;
    uint32_t worker_id;
    uint64_t step; /* the step whose parameters we hold; the next push is for it */
    uint64_t rts;  /* round trips in this window */
    double t_end;
    float *lat[2]; /* [LAT_CAP] us */
    size_t n_lat[2];
    int failed;
    char error[256];
    pthread_t thread;
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
} worker_t;

typedef struct case_run {
    bench_t *b;
    const size_spec_t *size;
    int n_workers;
    uint32_t n_shards;
    uint32_t shard_offsets[OMV_WIRE_MAX_SHARDS + 1];
    worker_t *w;
    pthread_barrier_t start, end;
    int mode, record, quit;
    uint64_t min_iters;
    atomic_int stop;
} case_run_t;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static double now_s(void)
{
    return omv_time_s();
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !interrupted)
        ;
}

static void make_endpoint(const bench_t *b, const char *transport, const char *name, char *out,
                          size_t cap)
{
    if (strcmp(transport, "tcp") == 0)
        snprintf(out, cap, "tcp://127.0.0.1:%d", bench_free_port());
    else
        snprintf(out, cap, "ipc://%s/%s", b->dir, name);
}

/* ---- one fake worker's side of the wire ---- */

static int fail(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(worker_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof(w->error), fmt, ap);
    va_end(ap);
    w->failed = 1;
    return -EPROTO;
}

static int send_msg(worker_t *w, void *sock, const omv_msg_t *m, const float *payload)
{
    size_t len;
    int r = omv_wire_encode(m, w->buf, sizeof(w->buf), &len);
    if (r < 0)
        return fail(w, "cannot encode %s: %s", omv_msg_name(m->type), omv_strerror(r));
    uint32_t count = omv_wire_payload_count(m);
    if (zmq_send(sock, w->buf, len, count ? ZMQ_SNDMORE : 0) < 0)
        return fail(w, "send: %s", zmq_strerror(errno));
    if (count) {
        /* Zero-copy from the shared zero buffer, which never changes. */
        zmq_msg_t msg;
        zmq_msg_init_data(&msg, (void *)payload, (size_t)count * sizeof(float), NULL, NULL);
        if (zmq_msg_send(&msg, sock, 0) < 0) {
            zmq_msg_close(&msg);
            return fail(w, "send: %s", zmq_strerror(errno));
        }
    }
    return 0;
}

static int wait_in(worker_t *w, void *sock, int timeout_ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    for (;;) {
        int n = zmq_poll(&it, 1, timeout_ms);
        if (n > 0)
            return 0;
        if (n == 0)
            return fail(w, "no answer within %d ms", timeout_ms);
        if (errno != EINTR)
            return fail(w, "poll: %s", zmq_strerror(errno));
        if (interrupted)
            return fail(w, "interrupted");
    }
}

static int rcvmore(void *sock)
{
    int more = 0;
    size_t sz = sizeof(more);
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &sz);
    return more;
}

/* Receives one message from the daemon: its envelope decoded into m and, when it announces a
 * payload, the payload's size checked and the payload dropped. */
static int recv_msg(worker_t *w, omv_msg_t *m, int timeout_ms)
{
    if (wait_in(w, w->ps, timeout_ms) < 0)
        return -ETIMEDOUT;
    int len = zmq_recv(w->ps, w->buf, sizeof(w->buf), 0);
    if (len < 0)
        return fail(w, "receive: %s", zmq_strerror(errno));
    char why[OMV_WIRE_REASON_MAX];
    if ((size_t)len > sizeof(w->buf) || omv_wire_decode(w->buf, (size_t)len, m, why) < 0)
        return fail(w, "malformed message from the daemon (%d bytes)", len);
    size_t want = (size_t)omv_wire_payload_count(m) * sizeof(float), got = 0;
    while (rcvmore(w->ps)) {
        zmq_msg_t p;
        zmq_msg_init(&p);
        if (zmq_msg_recv(&p, w->ps, 0) < 0) {
            zmq_msg_close(&p);
            return fail(w, "receive: %s", zmq_strerror(errno));
        }
        got += zmq_msg_size(&p);
        zmq_msg_close(&p);
    }
    if (got != want)
        return fail(w, "%s carries %zu bytes, announces %zu", omv_msg_name(m->type), got, want);
    if (m->type == OMV_MSG_ERROR)
        return fail(w, "daemon refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                    m->u.error.reason);
    if (m->type == OMV_MSG_STOP)
        return fail(w, "daemon says stop: \"%s\"", m->u.stop.reason);
    return 0;
}

/* Waits for every shard of the parameters of `step`. */
static int recv_params(worker_t *w, uint64_t step)
{
    const case_run_t *c = w->c;
    for (uint32_t have = 0; have < c->n_shards; have++) {
        omv_msg_t m;
        if (recv_msg(w, &m, RECV_TIMEOUT_MS) < 0)
            return -EPROTO;
        const omv_params_t *p = &m.u.params;
        if (m.type != OMV_MSG_PARAMS || p->step != step || p->shard >= c->n_shards ||
            p->offset != c->shard_offsets[p->shard] ||
            p->count != c->shard_offsets[p->shard + 1] - p->offset)
            return fail(w, "expected params of step %llu, got %s (step %llu shard %u)",
                        (unsigned long long)step, omv_msg_name(m.type), (unsigned long long)p->step,
                        p->shard);
    }
    return 0;
}

static void push_msg(const worker_t *w, uint32_t shard, omv_msg_t *m)
{
    const case_run_t *c = w->c;
    uint32_t off = c->shard_offsets[shard];
    m->type = OMV_MSG_PUSH;
    m->u.push =
        (omv_push_t){w->worker_id, w->step, shard, off,          c->shard_offsets[shard + 1] - off,
                     0.0f,         1,       0.0f,  OMV_WIRE_FP32};
}

/* One push of the whole model (a zero gradient for w->step) and one pull of the whole model
 * (the parameters of w->step + 1, which the daemon sends once our push is applied). */
static int ps_round_trip(worker_t *w)
{
    const case_run_t *c = w->c;
    omv_msg_t m;
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        push_msg(w, sh, &m);
        if (send_msg(w, w->ps, &m, c->b->zeros + c->shard_offsets[sh]) < 0)
            return -EPROTO;
    }
    m.type = OMV_MSG_PULL;
    m.u.pull = (omv_pull_t){w->worker_id, w->step + 1};
    if (send_msg(w, w->ps, &m, NULL) < 0)
        return -EPROTO;
    w->step++;
    return recv_params(w, w->step);
}

/* The same frames to the echo server, and back. */
static int echo_round_trip(worker_t *w)
{
    const case_run_t *c = w->c;
    omv_msg_t m;
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        push_msg(w, sh, &m);
        if (send_msg(w, w->echo, &m, c->b->zeros + c->shard_offsets[sh]) < 0)
            return -EPROTO;
    }
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        if (wait_in(w, w->echo, RECV_TIMEOUT_MS) < 0)
            return -ETIMEDOUT;
        size_t got = 0;
        int frames = 0;
        do {
            zmq_msg_t p;
            zmq_msg_init(&p);
            if (zmq_msg_recv(&p, w->echo, 0) < 0) {
                zmq_msg_close(&p);
                return fail(w, "echo receive: %s", zmq_strerror(errno));
            }
            got += frames++ ? zmq_msg_size(&p) : 0;
            zmq_msg_close(&p);
        } while (rcvmore(w->echo));
        size_t want = (size_t)(c->shard_offsets[sh + 1] - c->shard_offsets[sh]) * sizeof(float);
        if (frames != 2 || got != want)
            return fail(w, "echo sent %d frames, %zu payload bytes; expected 2, %zu", frames, got,
                        want);
    }
    return 0;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    case_run_t *c = w->c;
    for (;;) {
        pthread_barrier_wait(&c->start);
        if (c->quit)
            break;
        int mode = c->mode;
        w->rts = 0;
        while (!w->failed && !interrupted && (w->rts < c->min_iters || !atomic_load(&c->stop))) {
            double t0 = now_s();
            int r = mode == MODE_PS ? ps_round_trip(w) : echo_round_trip(w);
            if (r < 0)
                break;
            double us = (now_s() - t0) * 1e6;
            if (c->record && w->n_lat[mode] < LAT_CAP)
                w->lat[mode][w->n_lat[mode]++] = (float)us;
            w->rts++;
        }
        w->t_end = now_s();
        pthread_barrier_wait(&c->end);
    }
    return NULL;
}

/* ---- one case ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    if (n == 0)
        return NAN;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Pools every worker's latency samples of a mode in scratch; p50 and p99 of the pool. */
static void percentiles(case_run_t *c, int mode, float *scratch, mode_result_t *out)
{
    size_t n = 0;
    for (int i = 0; i < c->n_workers; i++) {
        memcpy(scratch + n, c->w[i].lat[mode], c->w[i].n_lat[mode] * sizeof(float));
        n += c->w[i].n_lat[mode];
    }
    out->samples = n;
    if (n == 0) {
        out->p50_us = out->p99_us = NAN;
        return;
    }
    qsort(scratch, n, sizeof(float), cmp_float);
    out->p50_us = scratch[(size_t)(0.50 * (double)(n - 1) + 0.5)];
    out->p99_us = scratch[(size_t)(0.99 * (double)(n - 1) + 0.5)];
}

/* Runs one window of `mode` on every worker; returns its wall time and round trips. */
static int run_window(case_run_t *c, int mode, int record, double seconds, double *ret_s,
                      uint64_t *ret_rts)
{
    c->mode = mode;
    c->record = record;
    atomic_store(&c->stop, 0);
    pthread_barrier_wait(&c->start);
    double t0 = now_s();
    sleep_s(seconds);
    atomic_store(&c->stop, 1);
    pthread_barrier_wait(&c->end);
    double t1 = t0;
    uint64_t rts = 0;
    for (int i = 0; i < c->n_workers; i++) {
        if (c->w[i].failed)
            return -EPROTO;
        t1 = c->w[i].t_end > t1 ? c->w[i].t_end : t1;
        rts += c->w[i].rts;
    }
    *ret_s = t1 - t0;
    *ret_rts = rts;
    return interrupted ? -EINTR : 0;
}

static void print_log_tail(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[512];
    fprintf(stderr, "--- %s ---\n", path);
    while (fgets(line, sizeof(line), f))
        fputs(line, stderr);
    fclose(f);
}

static void close_worker(worker_t *w)
{
    if (w->ps)
        zmq_close(w->ps);
    if (w->echo)
        zmq_close(w->echo);
    if (w->ctx)
        zmq_ctx_term(w->ctx);
    w->ps = w->echo = w->ctx = NULL;
}

static int open_worker(worker_t *w, const char *ps_ep, const char *echo_ep)
{
    w->ctx = zmq_ctx_new();
    if (w->ctx == NULL)
        return fail(w, "zmq_ctx_new: %s", zmq_strerror(errno));
    w->ps = zmq_socket(w->ctx, ZMQ_DEALER);
    w->echo = zmq_socket(w->ctx, ZMQ_DEALER);
    if (w->ps == NULL || w->echo == NULL)
        return fail(w, "zmq_socket: %s", zmq_strerror(errno));
    int zero = 0;
    void *socks[2] = {w->ps, w->echo};
    for (int i = 0; i < 2; i++) {
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(socks[i], ZMQ_SNDHWM, &zero, sizeof(zero));
        zmq_setsockopt(socks[i], ZMQ_RCVHWM, &zero, sizeof(zero));
    }
    if (zmq_connect(w->ps, ps_ep) != 0 || zmq_connect(w->echo, echo_ep) != 0)
        return fail(w, "connect: %s", zmq_strerror(errno));
    return 0;
}

/* Hello -> Welcome, checked against the job we wrote. */
static int handshake(worker_t *w, pid_t daemon)
{
    case_run_t *c = w->c;
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    m.u.hello.role = OMV_ROLE_TRAINER;
    snprintf(m.u.hello.hostname, sizeof(m.u.hello.hostname), "bench_ps-%d", w->index);
    m.u.hello.pid = (uint32_t)getpid();
    m.u.hello.threads = 1;
    if (send_msg(w, w->ps, &m, NULL) < 0)
        return -EPROTO;
    double deadline = now_s() + START_TIMEOUT_MS / 1000.0;
    zmq_pollitem_t it = {w->ps, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, 100) <= 0) {
        if (interrupted)
            return fail(w, "interrupted");
        if (!bench_alive(daemon))
            return fail(w, "omnivored exited before it welcomed us");
        if (now_s() > deadline)
            return fail(w, "no welcome from omnivored within %d ms", START_TIMEOUT_MS);
    }
    if (recv_msg(w, &m, 0) < 0)
        return -EPROTO;
    const omv_jobspec_t *j = &m.u.welcome.job;
    if (m.type != OMV_MSG_WELCOME)
        return fail(w, "expected welcome, got %s", omv_msg_name(m.type));
    if (m.u.welcome.protocol_version != OMV_PROTOCOL_VERSION)
        return fail(w, "daemon speaks protocol %u, bench_ps %d", m.u.welcome.protocol_version,
                    OMV_PROTOCOL_VERSION);
    if ((size_t)j->param_count * sizeof(float) != c->size->bytes)
        return fail(w, "daemon's model has %u parameters, expected %zu", j->param_count,
                    c->size->bytes / sizeof(float));
    w->worker_id = m.u.welcome.worker_id;
    c->n_shards = j->n_shards;
    memcpy(c->shard_offsets, j->shard_offsets, (j->n_shards + 1) * sizeof(uint32_t));
    return 0;
}

static void run_case(bench_t *b, worker_t *workers, float *scratch, const size_spec_t *sz,
                     int n_workers, const char *transport, case_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->size = sz;
    res->workers = n_workers;
    res->transport = transport;
    case_run_t c;
    memset(&c, 0, sizeof(c));
    c.b = b;
    c.size = sz;
    c.n_workers = n_workers;
    c.w = workers;
    /* A window also lasts until every worker made this many round trips: 64 MiB x 8 workers
     * takes seconds per round trip, so one is enough there. */
    c.min_iters = b->quick || sz->bytes >= (16u << 20) ? 1 : 2;
    pid_t daemon = -1, echo = -1;
    int threads = 0, barriers = 0;

    char job[512], images[512], labels[512], ctl[512], dlog[512], elog[512];
    char ps_ep[600], echo_ep[600];
    snprintf(images, sizeof(images), "%s/images-%s.idx", b->dir, sz->label);
    snprintf(labels, sizeof(labels), "%s/labels-%s.idx", b->dir, sz->label);
    snprintf(job, sizeof(job), "%s/job-%s-x%d.ini", b->dir, sz->label, n_workers);
    snprintf(ctl, sizeof(ctl), "%s/control.sock", b->dir);
    snprintf(dlog, sizeof(dlog), "%s/omnivored-%s-x%d-%s.log", b->dir, sz->label, n_workers,
             transport);
    snprintf(elog, sizeof(elog), "%s/echo-%s-x%d-%s.log", b->dir, sz->label, n_workers, transport);
    make_endpoint(b, transport, "ps.sock", ps_ep, sizeof(ps_ep));
    make_endpoint(b, transport, "echo.sock", echo_ep, sizeof(echo_ep));
    char name[64];
    snprintf(name, sizeof(name), "bench-ps-%s-x%d", sz->label, n_workers);
    bench_job_t jf = {name, sz->in, sz->out, images, labels, n_workers, b->shards, 0};
    if (bench_write_idx(images, labels, IMAGES, sz->in) < 0 || bench_write_job(job, &jf) < 0) {
        snprintf(res->error, sizeof(res->error), "cannot write the job files in %s", b->dir);
        return;
    }

    /* The echo server tells us through a pipe when it is bound. */
    int ready[2];
    if (pipe(ready) != 0) {
        snprintf(res->error, sizeof(res->error), "pipe: %s", strerror(errno));
        return;
    }
    char fd_arg[16];
    snprintf(fd_arg, sizeof(fd_arg), "%d", ready[1]);
    char *eargv[] = {b->self_exe, "--echo-server", echo_ep, fd_arg, NULL};
    echo = bench_spawn(eargv, elog);
    close(ready[1]);
    char *dargv[] = {b->daemon,     "--once",    "--job",   job,           "--endpoint",
                     ps_ep,         "--control", ctl,       "--state-dir", b->dir,
                     "--log-level", "warn",      "--curve", "no", /* as the raw echo */
                     NULL};
    daemon = bench_spawn(dargv, dlog);
    if (echo < 0 || daemon < 0) {
        snprintf(res->error, sizeof(res->error), "cannot start a child: %s",
                 strerror(-(echo < 0 ? echo : daemon)));
        close(ready[0]);
        goto out;
    }
    struct pollfd pr = {ready[0], POLLIN, 0};
    char byte;
    if (poll(&pr, 1, START_TIMEOUT_MS) <= 0 || read(ready[0], &byte, 1) != 1) {
        close(ready[0]);
        snprintf(res->error, sizeof(res->error), "the echo server did not start on %s", echo_ep);
        print_log_tail(elog);
        goto out;
    }
    close(ready[0]);
    fprintf(stderr, "bench_ps: %s x%d %s: omnivored pid %d on %s, echo pid %d on %s\n", sz->label,
            n_workers, transport, (int)daemon, ps_ep, (int)echo, echo_ep);

    for (int i = 0; i < n_workers; i++) {
        worker_t *w = &workers[i];
        w->c = &c;
        w->index = i;
        w->failed = 0;
        w->step = 0;
        w->n_lat[0] = w->n_lat[1] = 0;
        if (open_worker(w, ps_ep, echo_ep) < 0 || handshake(w, daemon) < 0) {
            snprintf(res->error, sizeof(res->error), "worker %d: %s", i, w->error);
            print_log_tail(dlog);
            goto out;
        }
    }
    /* The job runs once every worker is registered: pull step 0 for all. */
    for (int i = 0; i < n_workers; i++) {
        worker_t *w = &workers[i];
        omv_msg_t m = {.type = OMV_MSG_PULL};
        m.u.pull = (omv_pull_t){w->worker_id, 0};
        if (send_msg(w, w->ps, &m, NULL) < 0 || recv_params(w, 0) < 0) {
            snprintf(res->error, sizeof(res->error), "worker %d: %s", i, w->error);
            print_log_tail(dlog);
            goto out;
        }
    }

    pthread_barrier_init(&c.start, NULL, (unsigned)n_workers + 1);
    pthread_barrier_init(&c.end, NULL, (unsigned)n_workers + 1);
    barriers = 1;
    for (; threads < n_workers; threads++) {
        if (pthread_create(&workers[threads].thread, NULL, worker_main, &workers[threads]) != 0) {
            snprintf(res->error, sizeof(res->error), "pthread_create failed");
            goto out;
        }
    }
    /* Warm-up windows (both servers touch their buffers), then alternating measured ones. */
    double gbps[2][64], ups[2][64];
    int nw[2] = {0, 0};
    double win_s;
    uint64_t rts;
    double bytes_rt = 2.0 * (double)sz->bytes;
    int r = 0;
    for (int mode = 0; mode < 2 && r == 0; mode++)
        r = run_window(&c, mode, 0, b->seconds / 2, &win_s, &rts);
    for (int rep = 0; rep < b->repeats && r == 0; rep++) {
        for (int k = 0; k < 2 && r == 0; k++) {
            int mode = (rep % 2 == 0) == (k == 0) ? MODE_RAW : MODE_PS;
            r = run_window(&c, mode, 1, b->seconds, &win_s, &rts);
            if (r == 0 && nw[mode] < 64) {
                gbps[mode][nw[mode]] = bytes_rt * (double)rts / win_s / 1e9;
                ups[mode][nw[mode]] = (double)rts / win_s;
                nw[mode]++;
                res->mode[mode].round_trips += rts;
            }
        }
    }
    if (r < 0) {
        for (int i = 0; i < n_workers; i++)
            if (workers[i].failed) {
                snprintf(res->error, sizeof(res->error), "worker %d: %s", i, workers[i].error);
                break;
            }
        if (res->error[0] == '\0')
            snprintf(res->error, sizeof(res->error), "interrupted");
        if (interrupted == 0)
            print_log_tail(dlog);
        goto out;
    }
    for (int mode = 0; mode < 2; mode++) {
        res->mode[mode].gbps = median(gbps[mode], nw[mode]);
        res->mode[mode].ups = median(ups[mode], nw[mode]);
        percentiles(&c, mode, scratch, &res->mode[mode]);
    }

    /* Every push we made was applied (group clocks = our steps) and nothing was refused. */
    omv_strbuf_t st;
    omv_strbuf_init(&st);
    long long steps = 0;
    for (int i = 0; i < n_workers; i++)
        steps += (long long)workers[i].step;
    int cr = bench_control(ctl, "status --json", &st);
    long long clocks = cr == 0 ? bench_json_array_sum(omv_strbuf_str(&st), "group_clocks") : -1;
    long long refused = cr == 0 ? bench_json_int(omv_strbuf_str(&st), "refused_total") : -1;
    res->verified = clocks == steps && refused == 0;
    if (!res->verified)
        fprintf(stderr,
                "bench_ps: %s x%d %s: daemon reports group clocks summing to %lld and %lld "
                "refusals; we pushed %lld steps (control: %s)\n",
                sz->label, n_workers, transport, clocks, refused, steps,
                cr == 0 ? "ok" : omv_strerror(cr));
    omv_strbuf_fini(&st);
    res->ok = 1;

out:
    if (threads > 0) {
        c.quit = 1;
        pthread_barrier_wait(&c.start);
        for (int i = 0; i < threads; i++)
            pthread_join(workers[i].thread, NULL);
    }
    if (barriers) {
        pthread_barrier_destroy(&c.start);
        pthread_barrier_destroy(&c.end);
    }
    for (int i = 0; i < n_workers; i++)
        close_worker(&workers[i]);
    int ds = bench_stop(daemon, STOP_TIMEOUT_MS), es = bench_stop(echo, STOP_TIMEOUT_MS);
    if (ds != 0 && daemon > 0) {
        fprintf(stderr, "bench_ps: omnivored %s (status %d)\n",
                ds < 0 ? "did not stop within 10 s of SIGTERM and was killed" : "exited badly", ds);
        print_log_tail(dlog);
    }
    if (es != 0 && echo > 0)
        fprintf(stderr, "bench_ps: the echo server exited with status %d\n", es);
}

/* ---- options, output ---- */

static int parse_size(const char *s, size_spec_t *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    size_t unit = (*end == 'k' || *end == 'K') ? 1024 : (*end == 'm' || *end == 'M') ? 1 << 20 : 0;
    if (v <= 0 || unit == 0 || end[1] != '\0' || (size_t)v * unit > ((size_t)1 << 30))
        return -EINVAL;
    out->bytes = (size_t)v * unit;
    size_t p = out->bytes / sizeof(float);
    /* layers = A B with B (A + 1) = p: B the largest power of two with B * B <= p dividing p. */
    uint32_t bw = 1;
    while ((size_t)bw * 2 * bw * 2 <= p && p % (bw * 2) == 0)
        bw *= 2;
    if (p % bw != 0 || p / bw < 2 || p / bw - 1 > 65536)
        return -EINVAL;
    out->out = bw;
    out->in = (uint32_t)(p / bw - 1);
    snprintf(out->label, sizeof(out->label), "%ld%s", v, unit == 1024 ? "KiB" : "MiB");
    return 0;
}

static int split(char *s, char **items, int cap)
{
    int n = 0;
    for (char *save = NULL, *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == cap)
            return -EINVAL;
        items[n++] = t;
    }
    return n;
}

static void usage(FILE *f)
{
    fprintf(f, "Usage: bench_ps [--quick] [--sizes 4k,1m,16m,64m] [--workers 1,2,8] "
               "[--transports tcp,ipc]\n"
               "                [--seconds S] [--repeats R] [--shards N] [--daemon PATH] "
               "[--keep]\n");
}

static int parse_args(bench_t *b, int argc, char **argv)
{
    char sizes[256] = "4k,1m,16m,64m", workers[256] = "1,2,8", transports[256] = "tcp,ipc";
    double seconds = -1;
    int repeats = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            b->quick = 1;
        } else if (strcmp(a, "--keep") == 0) {
            b->keep = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (v == NULL) {
            fprintf(stderr, "bench_ps: unknown option or missing value: '%s'\n", a);
            return -EINVAL;
        } else if (strcmp(a, "--sizes") == 0) {
            omv_strlcpy(sizes, v, sizeof(sizes)), i++;
        } else if (strcmp(a, "--workers") == 0) {
            omv_strlcpy(workers, v, sizeof(workers)), i++;
        } else if (strcmp(a, "--transports") == 0) {
            omv_strlcpy(transports, v, sizeof(transports)), i++;
        } else if (strcmp(a, "--seconds") == 0) {
            seconds = atof(v), i++;
        } else if (strcmp(a, "--repeats") == 0) {
            repeats = atoi(v), i++;
        } else if (strcmp(a, "--shards") == 0) {
            b->shards = atoi(v), i++;
        } else if (strcmp(a, "--daemon") == 0) {
            omv_strlcpy(b->daemon, v, sizeof(b->daemon)), i++;
        } else {
            fprintf(stderr, "bench_ps: unknown option '%s'\n", a);
            return -EINVAL;
        }
    }
    b->seconds = seconds > 0 ? seconds : b->quick ? 0.3 : 0.6;
    b->repeats = repeats > 0 ? repeats : b->quick ? 1 : 5;
    if (b->repeats > 32 || b->shards < 1 || b->shards > OMV_WIRE_MAX_SHARDS) {
        fprintf(stderr, "bench_ps: --repeats goes up to 32, --shards from 1 to %d\n",
                OMV_WIRE_MAX_SHARDS);
        return -EINVAL;
    }
    char *items[MAX_LIST];
    int n = split(sizes, items, MAX_LIST);
    for (int i = 0; i < n; i++)
        if (parse_size(items[i], &b->sizes[b->n_sizes++]) < 0) {
            fprintf(stderr,
                    "bench_ps: size '%s' is not like 4k or 16m (a power-of-two count of "
                    "float32 parameters up to 1 GiB)\n",
                    items[i]);
            return -EINVAL;
        }
    n = split(workers, items, MAX_LIST);
    for (int i = 0; i < n; i++) {
        int w = atoi(items[i]);
        if (w < 1 || w > MAX_WORKERS || IMAGES / w < 1) {
            fprintf(stderr, "bench_ps: workers '%s' is not in [1, %d]\n", items[i], MAX_WORKERS);
            return -EINVAL;
        }
        b->workers[b->n_workers++] = w;
    }
    static char transport_buf[256];
    omv_strlcpy(transport_buf, transports, sizeof(transport_buf));
    n = split(transport_buf, items, MAX_LIST);
    for (int i = 0; i < n; i++) {
        if (strcmp(items[i], "tcp") != 0 && strcmp(items[i], "ipc") != 0) {
            fprintf(stderr, "bench_ps: transport '%s' is not tcp or ipc\n", items[i]);
            return -EINVAL;
        }
        b->transports[b->n_transports++] = items[i];
    }
    if (b->n_sizes <= 0 || b->n_workers <= 0 || b->n_transports <= 0) {
        usage(stderr);
        return -EINVAL;
    }
    return 0;
}

/* --daemon, else $OMNIVORED, else ../server/omnivored next to this binary in the build tree. */
static int find_daemon(bench_t *b)
{
    ssize_t n = readlink("/proc/self/exe", b->self_exe, sizeof(b->self_exe) - 1);
    if (n <= 0)
        return -errno;
    b->self_exe[n] = '\0';
    if (b->daemon[0] == '\0') {
        const char *env = getenv("OMNIVORED");
        if (env && *env) {
            omv_strlcpy(b->daemon, env, sizeof(b->daemon));
        } else {
            char dir[PATH_MAX];
            omv_strlcpy(dir, b->self_exe, sizeof(dir));
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = '\0';
            snprintf(b->daemon, sizeof(b->daemon), "%s/../server/omnivored", dir);
        }
    }
    if (access(b->daemon, X_OK) != 0) {
        fprintf(stderr,
                "bench_ps: cannot run omnivored at '%s' (build it, or give --daemon PATH "
                "or OMNIVORED)\n",
                b->daemon);
        return -ENOENT;
    }
    return 0;
}

static void json_mode(omv_strbuf_t *j, const char *name, const mode_result_t *m)
{
    omv_strbuf_printf(j,
                      "\"%s\":{\"gbps\":%.4f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
                      "\"updates_per_s\":%.1f,\"round_trips\":%llu,\"latency_samples\":%zu}",
                      name, m->gbps, m->p50_us, m->p99_us, m->ups,
                      (unsigned long long)m->round_trips, m->samples);
}

/* Prints the table, the goals, and the JSON line; returns whether every case ran. */
static int report(const bench_t *b, const case_result_t *res, int n)
{
    printf("\n# bench_ps: push+pull round trips through omnivored (ps) vs a raw ZeroMQ echo of "
           "the same frames (raw)\n");
    printf("# %d shard(s); GB = 1e9 bytes, both directions; GB/s and upd/s: median of %d "
           "window(s) of %.2f s; latency: one round trip\n",
           b->shards, b->repeats, b->seconds);
    printf("%-7s %3s %-4s | %8s %9s %9s %9s | %8s %9s %9s %9s | %6s %6s %s\n", "size", "wk", "tr",
           "raw GB/s", "p50 us", "p99 us", "upd/s", "ps GB/s", "p50 us", "p99 us", "upd/s",
           "ps/raw", "p50x", "check");
    int all_ok = 1;
    for (int i = 0; i < n; i++) {
        const case_result_t *r = &res[i];
        if (!r->ok) {
            all_ok = 0;
            printf("%-7s %3d %-4s | FAILED: %s\n", r->size->label, r->workers, r->transport,
                   r->error);
            continue;
        }
        const mode_result_t *rw = &r->mode[MODE_RAW], *ps = &r->mode[MODE_PS];
        printf("%-7s %3d %-4s | %8.3f %9.1f %9.1f %9.0f | %8.3f %9.1f %9.1f %9.0f | %6.2f %6.2f "
               "%s\n",
               r->size->label, r->workers, r->transport, rw->gbps, rw->p50_us, rw->p99_us, rw->ups,
               ps->gbps, ps->p50_us, ps->p99_us, ps->ups, ps->gbps / rw->gbps,
               ps->p50_us / rw->p50_us, r->verified ? "ok" : "MISMATCH");
    }
    printf("# ps/raw: GB/s ratio; p50x: ps p50 latency over raw p50 latency; check: the daemon's "
           "group clocks equal our pushes, no refusals\n");

    omv_strbuf_t j;
    omv_strbuf_init(&j);
    omv_strbuf_printf(&j,
                      "{\"bench\":\"ps\",\"unit_gb\":1e9,\"shards\":%d,\"seconds\":%.3f,"
                      "\"repeats\":%d,\"quick\":%s,\"goals\":{\"ratio_1mib\":%.2f,"
                      "\"gbps_1mib\":%.2f,\"rt_4kib_us\":%.0f}",
                      b->shards, b->seconds, b->repeats, b->quick ? "true" : "false", GOAL_RATIO,
                      GOAL_GBPS, GOAL_SMALL_US);
    omv_strbuf_printf(&j, ",\"cpus\":%ld,\"daemon\":", sysconf(_SC_NPROCESSORS_ONLN));
    omv_strbuf_json_string(&j, b->daemon);
    omv_strbuf_append(&j, ",\"cases\":[", 10);
    printf("\n# goals (issue 4): 1 MiB ps >= %.1f x raw and >= %.1f GB/s; 4 KiB round trip "
           "< %.0f us\n",
           GOAL_RATIO, GOAL_GBPS, GOAL_SMALL_US);
    int first = 1;
    for (int i = 0; i < n; i++) {
        const case_result_t *r = &res[i];
        const mode_result_t *rw = &r->mode[MODE_RAW], *ps = &r->mode[MODE_PS];
        omv_strbuf_printf(&j,
                          "%s{\"size\":\"%s\",\"size_bytes\":%zu,\"layers\":[%u,%u],"
                          "\"workers\":%d,\"transport\":\"%s\",\"ok\":%s",
                          first ? "" : ",", r->size->label, r->size->bytes, r->size->in,
                          r->size->out, r->workers, r->transport, r->ok ? "true" : "false");
        first = 0;
        if (!r->ok) {
            omv_strbuf_append(&j, ",\"error\":", 9);
            omv_strbuf_json_string(&j, r->error);
            omv_strbuf_append(&j, "}", 1);
            continue;
        }
        omv_strbuf_append(&j, ",", 1);
        json_mode(&j, mode_names[MODE_RAW], rw);
        omv_strbuf_append(&j, ",", 1);
        json_mode(&j, mode_names[MODE_PS], ps);
        omv_strbuf_printf(&j, ",\"ratio\":%.4f,\"verified\":%s", ps->gbps / rw->gbps,
                          r->verified ? "true" : "false");
        if (r->size->bytes == 1 << 20) {
            int pass_ratio = ps->gbps >= GOAL_RATIO * rw->gbps, pass_gbps = ps->gbps >= GOAL_GBPS;
            printf("1MiB x%d %s: ps/raw %.2f (goal %.1f: %s), ps %.3f GB/s (goal %.1f: %s)\n",
                   r->workers, r->transport, ps->gbps / rw->gbps, GOAL_RATIO,
                   pass_ratio ? "met" : "MISSED", ps->gbps, GOAL_GBPS,
                   pass_gbps ? "met" : "MISSED");
            omv_strbuf_printf(&j, ",\"goal_ratio_met\":%s,\"goal_gbps_met\":%s",
                              pass_ratio ? "true" : "false", pass_gbps ? "true" : "false");
        }
        if (r->size->bytes == 4096) {
            int pass = ps->p50_us < GOAL_SMALL_US;
            printf("4KiB x%d %s: ps round trip p50 %.1f us, p99 %.1f us (goal p50 < %.0f: %s)\n",
                   r->workers, r->transport, ps->p50_us, ps->p99_us, GOAL_SMALL_US,
                   pass ? "met" : "MISSED");
            omv_strbuf_printf(&j, ",\"goal_rt_met\":%s", pass ? "true" : "false");
        }
        omv_strbuf_append(&j, "}", 1);
    }
    omv_strbuf_append(&j, "]}", 2);
    printf("%s\n", omv_strbuf_str(&j));
    fflush(stdout);
    omv_strbuf_fini(&j);
    return all_ok;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--echo-server") == 0)
        return bench_echo_main(argv[2], atoi(argv[3]));
    static bench_t b;
    b.shards = 2;
    if (parse_args(&b, argc, argv) < 0 || find_daemon(&b) < 0)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *tmp = getenv("TMPDIR");
    snprintf(b.dir, sizeof(b.dir), "%s/omv-bench-ps.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(b.dir) == NULL) {
        fprintf(stderr, "bench_ps: mkdtemp %s: %s\n", b.dir, strerror(errno));
        return 1;
    }

    /* Every buffer once: the zero gradient at the largest size, touched so that sends read real
     * pages; latency samples for the most workers; the pool for percentiles. */
    size_t largest = 0;
    int most = 0;
    for (int i = 0; i < b.n_sizes; i++)
        largest = b.sizes[i].bytes > largest ? b.sizes[i].bytes : largest;
    for (int i = 0; i < b.n_workers; i++)
        most = b.workers[i] > most ? b.workers[i] : most;
    int n_cases = b.n_sizes * b.n_workers * b.n_transports;
    b.zeros = malloc(largest);
    worker_t *workers = calloc((size_t)most, sizeof(worker_t));
    float *scratch = malloc((size_t)most * LAT_CAP * sizeof(float));
    case_result_t *res = calloc((size_t)n_cases, sizeof(case_result_t));
    int ok = b.zeros && workers && scratch && res;
    for (int i = 0; ok && i < most; i++) {
        for (int m = 0; m < 2; m++) {
            workers[i].lat[m] = malloc(LAT_CAP * sizeof(float));
            ok = ok && workers[i].lat[m];
        }
    }
    if (!ok) {
        fprintf(stderr, "bench_ps: out of memory\n");
        return 1;
    }
    memset(b.zeros, 0, largest);

    fprintf(stderr, "bench_ps: %d cases, daemon %s, folder %s\n", n_cases, b.daemon, b.dir);
    int n = 0;
    for (int s = 0; s < b.n_sizes && !interrupted; s++)
        for (int w = 0; w < b.n_workers && !interrupted; w++)
            for (int t = 0; t < b.n_transports && !interrupted; t++) {
                double t0 = now_s();
                case_result_t *r = &res[n++];
                run_case(&b, workers, scratch, &b.sizes[s], b.workers[w], b.transports[t], r);
                fprintf(stderr, "bench_ps: [%d/%d] %s x%d %s: %s (%.1f s)\n", n, n_cases,
                        b.sizes[s].label, b.workers[w], b.transports[t], r->ok ? "done" : r->error,
                        now_s() - t0);
            }
    int all_ok = report(&b, res, n) && n == n_cases;
    if (b.keep)
        fprintf(stderr, "bench_ps: kept %s\n", b.dir);
    else
        bench_remove_dir(b.dir);
    for (int i = 0; i < most; i++)
        for (int m = 0; m < 2; m++)
            free(workers[i].lat[m]);
    free(workers);
    free(scratch);
    free(res);
    free(b.zeros);
    return interrupted ? 130 : all_ok ? 0 : 1;
}
