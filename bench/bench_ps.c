/* bench_ps: push+pull round trips through the real omnivored, next to a raw ZeroMQ echo of the
 * same bytes in the same run, its ceiling (issue 4). Prints a table, then all figures as one
 * JSON object on the last line.
 *
 * Run it after `meson setup build && ninja -C build`, from anywhere:
 *   build/bench/bench_ps                        # 4k 1m 16m 64m x 1 2 8 workers x tcp ipc
 *   build/bench/bench_ps --quick                # short windows, one repeat: a smoke run
 *   build/bench/bench_ps --sizes 1m --workers 1,8 --transports tcp --seconds 2 --repeats 5
 *   build/bench/bench_ps --quick --sizes 1m --workers 1,2 --servers 0,1,2   # shard servers
 *   meson test -C build --benchmark ps -v       # the full run through meson (about 4 min)
 *   meson test -C build --benchmark ps -v --test-args=--quick
 * To profile the daemon, attach to the pid each case prints on stderr while it runs:
 *   build/bench/bench_ps --sizes 1m --workers 1 --transports tcp --seconds 4 --repeats 2 &
 *   perf record -g -p <omnivored pid> -- sleep 10     (or strace -c -f -p <pid>)
 * Options: --sizes LIST (4k, 1m, 16m, 64m: KiB or MiB of float32 parameters), --workers LIST,
 *   --transports tcp,ipc, --servers LIST (shard servers the model is spread over, 0 to 8;
 *   default 0: the daemon holds it), --seconds S (one measured window, default 0.6),
 *   --repeats R (measured windows per server, default 5), --shards N (the job's [cluster]
 *   shards, default 2; with servers max(N, servers)),
 *   --daemon PATH (default $OMNIVORED, else ../server/omnivored next to this binary),
 *   --keep (keep the temporary folder: job files, data files, daemon logs).
 *
 * Per case (model size x workers x servers x transport) it starts one omnivored on a generated job
 * (an MLP `layers = A B` with A*B+B parameters, tiny IDX files of 1xA images, one group per worker,
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
 * With servers N > 0 the job says `[cluster] servers = N` and the case starts N shard servers
 * first (`omnivored --role shard --coordinator EP --endpoint EP`, each its own process with its
 * own control socket and state folder, on the case's transport), then the daemon as their
 * coordinator. A fake worker says Hello until it is welcomed into the job (the coordinator
 * welcomes it idle until its servers are in, then says Stop with reconnect), opens one DEALER
 * per server named in the Welcome and attaches to each (Attach with the Welcome's token until
 * the server answers with a heartbeat). A round trip then pushes each shard to the server that
 * holds it, pulls step + 1 from every server, and reports the step to the coordinator (which
 * counts steps from reports); each server sends the Params of its own shards. The raw side has
 * N echo servers too, each echoing the frames of one server's shards, so that its ceiling
 * spreads over as many processes as the ps side.
 *
 * Figures: GB/s = bytes moved both ways (2 x model bytes per round trip, 1 GB = 1e9 bytes) over
 * the window's wall time, all workers together; updates/s = round trips per second across
 * workers (with one worker per group, each push is one group step applied); latency = one round
 * trip, p50 and p99 over every round trip of the measured windows. GB/s and updates/s are the
 * median over windows. The daemon's group clocks and refusal counters are read back over its
 * control socket at the end of each case to check that every push was applied and none refused;
 * with servers, the coordinator's (our reports) and every shard server's over its own control
 * socket (its clocks advance only when it applied a step of its shards). */
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
#define MAX_SERVERS 8          /* shard servers in one case, each its own process */
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
    int servers[MAX_LIST]; /* shard servers per case; 0: the daemon holds the model */
    int n_servers;
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
    int servers; /* 0: the daemon holds the model */
    int shards;  /* the job's [cluster] shards: max(--shards, servers) */
    const char *transport;
    mode_result_t mode[2];
    int verified; /* the servers' clocks match our pushes and they refused nothing */
    int ok;
    char error[256];
} case_result_t;

struct case_run;

typedef struct {
    struct case_run *c;
    int index;
    void *ctx;
    void *ps;                /* the daemon, or with shard servers the coordinator */
    void *data[MAX_SERVERS]; /* [n_links] where pushes and pulls go; data[0] is ps without
                              * shard servers */
    void *echo[MAX_SERVERS]; /* [n_links] one echo server per data link */
    uint32_t worker_id;
    uint32_t batch; /* images per step, as the params say: what our step report counts */
    uint64_t step;  /* the step whose parameters we hold; the next push is for it */
    uint64_t rts;   /* round trips in this window */
    double t_end;
    float *lat[2]; /* [LAT_CAP] us */
    size_t n_lat[2];
    int failed;
    char error[256];
    pthread_t thread;
    uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
} worker_t;

/* The processes of one case and where they listen. */
typedef struct {
    pid_t daemon;
    pid_t server[MAX_SERVERS]; /* [n_servers] */
    pid_t echo[MAX_SERVERS];   /* [n_links] */
    char ps_ep[600], ctl[512], dlog[512];
    char server_ctl[MAX_SERVERS][512], server_log[MAX_SERVERS][512];
    char echo_ep[MAX_SERVERS][600];
} children_t;

typedef struct case_run {
    bench_t *b;
    const size_spec_t *size;
    const char *transport;
    int n_workers;
    int n_servers; /* 0: the daemon holds the model */
    int n_links;   /* data links per worker: n_servers, or 1 (the daemon) */
    uint32_t n_shards;
    uint32_t shard_offsets[OMV_WIRE_MAX_SHARDS + 1];
    uint32_t link_first[MAX_SERVERS + 1];    /* link i holds [link_first[i], link_first[i+1]) */
    uint8_t shard_link[OMV_WIRE_MAX_SHARDS]; /* which link holds a shard */
    children_t ch;
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

/* Receives one message from sock (the daemon, the coordinator or a shard server): its envelope
 * decoded into m and, when it announces a payload, the payload's size checked and the payload
 * dropped. Error and Stop are left to the caller. */
static int recv_raw(worker_t *w, void *sock, omv_msg_t *m, int timeout_ms)
{
    if (wait_in(w, sock, timeout_ms) < 0)
        return -ETIMEDOUT;
    int len = zmq_recv(sock, w->buf, sizeof(w->buf), 0);
    if (len < 0)
        return fail(w, "receive: %s", zmq_strerror(errno));
    char why[OMV_WIRE_REASON_MAX];
    if ((size_t)len > sizeof(w->buf) || omv_wire_decode(w->buf, (size_t)len, m, why) < 0)
        return fail(w, "malformed message from the daemon (%d bytes)", len);
    size_t want = (size_t)omv_wire_payload_count(m) * sizeof(float), got = 0;
    while (rcvmore(sock)) {
        zmq_msg_t p;
        zmq_msg_init(&p);
        if (zmq_msg_recv(&p, sock, 0) < 0) {
            zmq_msg_close(&p);
            return fail(w, "receive: %s", zmq_strerror(errno));
        }
        got += zmq_msg_size(&p);
        zmq_msg_close(&p);
    }
    if (got != want)
        return fail(w, "%s carries %zu bytes, announces %zu", omv_msg_name(m->type), got, want);
    return 0;
}

/* recv_raw, with Error and Stop failing the worker. */
static int recv_msg(worker_t *w, void *sock, omv_msg_t *m, int timeout_ms)
{
    int r = recv_raw(w, sock, m, timeout_ms);
    if (r < 0)
        return r;
    if (m->type == OMV_MSG_ERROR)
        return fail(w, "daemon refused us (%s): \"%s\"", omv_refuse_name(m->u.error.code),
                    m->u.error.reason);
    if (m->type == OMV_MSG_STOP)
        return fail(w, "daemon says stop: \"%s\"", m->u.stop.reason);
    return 0;
}

/* Waits for every shard of the parameters of `step`, each from the link that holds it. A
 * heartbeat (a shard server's late answer to an attach we sent again) is skipped. */
static int recv_params(worker_t *w, uint64_t step)
{
    const case_run_t *c = w->c;
    for (int l = 0; l < c->n_links; l++) {
        uint32_t first = c->link_first[l], last = c->link_first[l + 1];
        for (uint32_t have = first; have < last;) {
            omv_msg_t m;
            if (recv_msg(w, w->data[l], &m, RECV_TIMEOUT_MS) < 0)
                return -EPROTO;
            if (m.type == OMV_MSG_HEARTBEAT)
                continue;
            const omv_params_t *p = &m.u.params;
            if (m.type != OMV_MSG_PARAMS || p->step != step || p->shard < first ||
                p->shard >= last || p->offset != c->shard_offsets[p->shard] ||
                p->count != c->shard_offsets[p->shard + 1] - p->offset)
                return fail(w, "expected params of step %llu, got %s (step %llu shard %u)",
                            (unsigned long long)step, omv_msg_name(m.type),
                            (unsigned long long)p->step, p->shard);
            w->batch = p->batch;
            have++;
        }
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

/* Asks every data link for the parameters of step. */
static int send_pulls(worker_t *w, uint64_t step)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){w->worker_id, step, 0};
    for (int l = 0; l < w->c->n_links; l++)
        if (send_msg(w, w->data[l], &m, NULL) < 0)
            return -EPROTO;
    return 0;
}

/* One push of the whole model (a zero gradient for w->step, each shard to the server that holds
 * it) and one pull of the whole model (the parameters of w->step + 1, which each server sends
 * once our push is applied). With shard servers, the coordinator gets the step's report. */
static int ps_round_trip(worker_t *w)
{
    const case_run_t *c = w->c;
    omv_msg_t m;
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        push_msg(w, sh, &m);
        if (send_msg(w, w->data[c->shard_link[sh]], &m, c->b->zeros + c->shard_offsets[sh]) < 0)
            return -EPROTO;
    }
    if (send_pulls(w, w->step + 1) < 0)
        return -EPROTO;
    if (c->n_servers > 0) {
        m.type = OMV_MSG_REPORT;
        m.u.report = (omv_step_report_t){w->worker_id, w->step, 0.0f, w->batch, 0.0f};
        if (send_msg(w, w->ps, &m, NULL) < 0)
            return -EPROTO;
    }
    w->step++;
    return recv_params(w, w->step);
}

/* The same frames to the echo servers (each link's shards to its own), and back. */
static int echo_round_trip(worker_t *w)
{
    const case_run_t *c = w->c;
    omv_msg_t m;
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        push_msg(w, sh, &m);
        if (send_msg(w, w->echo[c->shard_link[sh]], &m, c->b->zeros + c->shard_offsets[sh]) < 0)
            return -EPROTO;
    }
    for (uint32_t sh = 0; sh < c->n_shards; sh++) {
        void *sock = w->echo[c->shard_link[sh]];
        if (wait_in(w, sock, RECV_TIMEOUT_MS) < 0)
            return -ETIMEDOUT;
        size_t got = 0;
        int frames = 0;
        do {
            zmq_msg_t p;
            zmq_msg_init(&p);
            if (zmq_msg_recv(&p, sock, 0) < 0) {
                zmq_msg_close(&p);
                return fail(w, "echo receive: %s", zmq_strerror(errno));
            }
            got += frames++ ? zmq_msg_size(&p) : 0;
            zmq_msg_close(&p);
        } while (rcvmore(sock));
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

static void print_logs(const case_run_t *c)
{
    print_log_tail(c->ch.dlog);
    for (int i = 0; i < c->n_servers; i++)
        print_log_tail(c->ch.server_log[i]);
}

static void close_worker(worker_t *w)
{
    for (int l = 0; l < MAX_SERVERS; l++) {
        if (w->data[l] && w->data[l] != w->ps)
            zmq_close(w->data[l]);
        if (w->echo[l])
            zmq_close(w->echo[l]);
        w->data[l] = w->echo[l] = NULL;
    }
    if (w->ps)
        zmq_close(w->ps);
    if (w->ctx)
        zmq_ctx_term(w->ctx);
    w->ps = w->ctx = NULL;
}

/* A DEALER with no linger and no high-water marks (as the worker's link has), connected. */
static void *open_socket(worker_t *w, const char *endpoint)
{
    void *s = zmq_socket(w->ctx, ZMQ_DEALER);
    if (s == NULL) {
        fail(w, "zmq_socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    if (zmq_connect(s, endpoint) != 0) {
        fail(w, "connect %s: %s", endpoint, zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* The socket to the daemon (or coordinator) and one to each echo server. */
static int open_worker(worker_t *w)
{
    const case_run_t *c = w->c;
    w->ctx = zmq_ctx_new();
    if (w->ctx == NULL)
        return fail(w, "zmq_ctx_new: %s", zmq_strerror(errno));
    w->ps = open_socket(w, c->ch.ps_ep);
    if (w->ps == NULL)
        return -EPROTO;
    for (int l = 0; l < c->n_links; l++) {
        w->echo[l] = open_socket(w, c->ch.echo_ep[l]);
        if (w->echo[l] == NULL)
            return -EPROTO;
    }
    return 0;
}

/* Whether the daemon and every shard server still run; fails w when one does not. */
static int children_alive(worker_t *w)
{
    const case_run_t *c = w->c;
    if (!bench_alive(c->ch.daemon))
        return fail(w, "omnivored exited before it welcomed us");
    for (int i = 0; i < c->n_servers; i++)
        if (!bench_alive(c->ch.server[i]))
            return fail(w, "shard server %d exited", i);
    return 0;
}

/* Waits for the next message from the daemon, checking that the children live. */
static int await_daemon(worker_t *w, omv_msg_t *m, double deadline)
{
    zmq_pollitem_t it = {w->ps, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, 100) <= 0) {
        if (interrupted)
            return fail(w, "interrupted");
        if (children_alive(w) < 0)
            return -EPROTO;
        if (now_s() > deadline)
            return fail(w, "no welcome from omnivored within %d ms", START_TIMEOUT_MS);
    }
    return recv_raw(w, w->ps, m, 0);
}

/* Hello until a Welcome into the job: a coordinator whose job waits for its shard servers
 * welcomes us idle, and tells us to register again (Stop with reconnect) once they are in. */
static int hello_until_welcome(worker_t *w, omv_msg_t *m)
{
    double deadline = now_s() + START_TIMEOUT_MS / 1000.0;
    for (;;) {
        *m = (omv_msg_t){.type = OMV_MSG_HELLO};
        m->u.hello.protocol_version = OMV_PROTOCOL_VERSION;
        m->u.hello.role = OMV_ROLE_TRAINER;
        snprintf(m->u.hello.hostname, sizeof(m->u.hello.hostname), "bench_ps-%d", w->index);
        m->u.hello.pid = (uint32_t)getpid();
        m->u.hello.threads = 1;
        if (send_msg(w, w->ps, m, NULL) < 0)
            return -EPROTO;
        int again = 0;
        while (!again) {
            if (await_daemon(w, m, deadline) < 0)
                return -EPROTO;
            if (m->type == OMV_MSG_WELCOME && !m->u.welcome.idle)
                return 0;
            if (m->type == OMV_MSG_STOP && m->u.stop.reconnect)
                again = 1;
            else if (m->type == OMV_MSG_ERROR || m->type == OMV_MSG_STOP)
                return fail(w, "daemon says %s: \"%s\"", omv_msg_name(m->type),
                            m->type == OMV_MSG_STOP ? m->u.stop.reason : m->u.error.reason);
            /* An idle Welcome or a heartbeat: the Stop that sends us back comes later. */
        }
    }
}

/* Attach to shard server `link` at endpoint until it answers with a heartbeat: the
 * coordinator may not have told it of us yet (an Error that says so: again in 100 ms). */
static int attach_one(worker_t *w, int link, const char *endpoint, uint64_t token)
{
    w->data[link] = open_socket(w, endpoint);
    if (w->data[link] == NULL)
        return -EPROTO;
    double deadline = now_s() + START_TIMEOUT_MS / 1000.0;
    while (now_s() < deadline && !interrupted) {
        omv_msg_t m = {.type = OMV_MSG_ATTACH};
        m.u.attach = (omv_attach_t){w->worker_id, token};
        if (send_msg(w, w->data[link], &m, NULL) < 0)
            return -EPROTO;
        int r = recv_raw(w, w->data[link], &m, 500);
        if (r == 0 && m.type == OMV_MSG_HEARTBEAT)
            return 0;
        if (r == 0 && (m.type != OMV_MSG_ERROR || m.u.error.code != OMV_REFUSE_UNKNOWN_WORKER))
            return fail(w, "shard server %s answers an attach with %s", endpoint,
                        omv_msg_name(m.type));
        if (r < 0 && r != -ETIMEDOUT)
            return r;
        w->failed = 0; /* a timeout here is not the worker's end */
        sleep_s(0.1);
    }
    return fail(w, "shard server %s did not take our attach within %d ms", endpoint,
                START_TIMEOUT_MS);
}

/* Hello -> Welcome, checked against the job we wrote; with shard servers, attached to each. */
static int handshake(worker_t *w)
{
    case_run_t *c = w->c;
    omv_msg_t m;
    if (hello_until_welcome(w, &m) < 0)
        return -EPROTO;
    const omv_welcome_t *wl = &m.u.welcome;
    const omv_jobspec_t *j = &wl->job;
    if (wl->protocol_version != OMV_PROTOCOL_VERSION)
        return fail(w, "daemon speaks protocol %u, bench_ps %d", wl->protocol_version,
                    OMV_PROTOCOL_VERSION);
    if ((size_t)j->param_count * sizeof(float) != c->size->bytes)
        return fail(w, "daemon's model has %u parameters, expected %zu", j->param_count,
                    c->size->bytes / sizeof(float));
    if ((int)wl->n_servers != c->n_servers || j->n_shards == 0 ||
        j->n_shards > OMV_WIRE_MAX_SHARDS ||
        (wl->n_servers > 0 && wl->servers[wl->n_servers - 1].last_shard != j->n_shards))
        return fail(w, "the welcome names %u shard servers for %u shards; expected %d servers",
                    wl->n_servers, j->n_shards, c->n_servers);
    w->worker_id = wl->worker_id;
    c->n_shards = j->n_shards;
    memcpy(c->shard_offsets, j->shard_offsets, (j->n_shards + 1) * sizeof(uint32_t));
    c->link_first[0] = 0;
    c->link_first[c->n_links] = j->n_shards;
    for (uint32_t i = 0; i < wl->n_servers; i++) {
        const omv_server_info_t *v = &wl->servers[i];
        if (v->first_shard != (i ? wl->servers[i - 1].last_shard : 0) ||
            v->last_shard <= v->first_shard)
            return fail(w, "shard server %u holds shards [%u, %u): not the next range", i,
                        v->first_shard, v->last_shard);
        c->link_first[i] = v->first_shard;
    }
    for (int l = 0; l < c->n_links; l++)
        for (uint32_t sh = c->link_first[l]; sh < c->link_first[l + 1]; sh++)
            c->shard_link[sh] = (uint8_t)l;
    if (wl->n_servers == 0)
        w->data[0] = w->ps;
    for (uint32_t i = 0; i < wl->n_servers; i++)
        if (attach_one(w, (int)i, wl->servers[i].endpoint, wl->attach_token) < 0)
            return -EPROTO;
    return 0;
}

/* Shard server i of the case: its own endpoint, control socket, state folder and log. Returns
 * its pid or -errno. */
static pid_t start_server(case_run_t *c, int i, const char *tag)
{
    const bench_t *b = c->b;
    children_t *ch = &c->ch;
    char name[32], ep[600], dir[512];
    snprintf(name, sizeof(name), "shard%d.sock", i);
    make_endpoint(b, c->transport, name, ep, sizeof(ep));
    snprintf(ch->server_ctl[i], sizeof(ch->server_ctl[i]), "%s/shard%d.ctl", b->dir, i);
    snprintf(ch->server_log[i], sizeof(ch->server_log[i]), "%s/shard%d-%s.log", b->dir, i, tag);
    snprintf(dir, sizeof(dir), "%s/shard%d", b->dir, i);
    char *argv[] = {(char *)b->daemon,
                    "--role",
                    "shard",
                    "--coordinator",
                    ch->ps_ep,
                    "--endpoint",
                    ep,
                    "--control",
                    ch->server_ctl[i],
                    "--state-dir",
                    dir,
                    "--log-level",
                    "warn",
                    "--curve",
                    "no",
                    NULL};
    pid_t pid = bench_spawn(argv, ch->server_log[i]);
    ch->server[i] = pid;
    return pid;
}

/* SIGTERM to the daemon first (its servers then let their parts go), then to the servers and
 * the echo servers; what did not exit cleanly is said, with its log. */
static void stop_children(case_run_t *c)
{
    children_t *ch = &c->ch;
    int ds = bench_stop(ch->daemon, STOP_TIMEOUT_MS);
    if (ds != 0 && ch->daemon > 0) {
        fprintf(stderr, "bench_ps: omnivored %s (status %d)\n",
                ds < 0 ? "did not stop within 10 s of SIGTERM and was killed" : "exited badly", ds);
        print_log_tail(ch->dlog);
    }
    for (int i = 0; i < c->n_servers; i++) {
        int ss = bench_stop(ch->server[i], STOP_TIMEOUT_MS);
        if (ss != 0 && ch->server[i] > 0) {
            fprintf(stderr, "bench_ps: shard server %d exited with status %d\n", i, ss);
            print_log_tail(ch->server_log[i]);
        }
    }
    for (int l = 0; l < c->n_links; l++) {
        int es = bench_stop(ch->echo[l], STOP_TIMEOUT_MS);
        if (es != 0 && ch->echo[l] > 0)
            fprintf(stderr, "bench_ps: echo server %d exited with status %d\n", l, es);
    }
}

/* The echo servers (one per data link), the shard servers, then the daemon, with their
 * endpoints and logs in c->ch. Returns 0, or -1 with res->error set. */
static int start_children(case_run_t *c, const char *job, case_result_t *res)
{
    const bench_t *b = c->b;
    children_t *ch = &c->ch;
    char tag[96], log[600];
    snprintf(tag, sizeof(tag), "%s-x%d-s%d-%s", c->size->label, c->n_workers, c->n_servers,
             c->transport);
    make_endpoint(b, c->transport, "ps.sock", ch->ps_ep, sizeof(ch->ps_ep));
    snprintf(ch->ctl, sizeof(ch->ctl), "%s/control.sock", b->dir);
    snprintf(ch->dlog, sizeof(ch->dlog), "%s/omnivored-%s.log", b->dir, tag);
    /* Each echo server tells us through the pipe, one byte, when it is bound. */
    int ready[2];
    if (pipe(ready) != 0) {
        snprintf(res->error, sizeof(res->error), "pipe: %s", strerror(errno));
        return -1;
    }
    char fd_arg[16];
    snprintf(fd_arg, sizeof(fd_arg), "%d", ready[1]);
    int r = 0;
    for (int l = 0; l < c->n_links && r >= 0; l++) {
        char name[32];
        snprintf(name, sizeof(name), "echo%d.sock", l);
        make_endpoint(b, c->transport, name, ch->echo_ep[l], sizeof(ch->echo_ep[l]));
        snprintf(log, sizeof(log), "%s/echo%d-%s.log", b->dir, l, tag);
        char *eargv[] = {(char *)b->self_exe, "--echo-server", ch->echo_ep[l], fd_arg, NULL};
        r = ch->echo[l] = bench_spawn(eargv, log);
    }
    close(ready[1]);
    for (int i = 0; i < c->n_servers && r >= 0; i++)
        r = start_server(c, i, tag);
    char *dargv[] = {(char *)b->daemon,
                     "--once",
                     "--job",
                     (char *)job,
                     "--endpoint",
                     ch->ps_ep,
                     "--control",
                     ch->ctl,
                     "--state-dir",
                     (char *)b->dir,
                     "--log-level",
                     "warn",
                     "--curve",
                     "no", /* as the raw echo */
                     NULL};
    if (r >= 0)
        r = ch->daemon = bench_spawn(dargv, ch->dlog);
    if (r < 0) {
        snprintf(res->error, sizeof(res->error), "cannot start a child: %s", strerror(-r));
        close(ready[0]);
        return -1;
    }
    char bytes[MAX_SERVERS];
    size_t got = 0;
    struct pollfd pr = {ready[0], POLLIN, 0};
    while (got < (size_t)c->n_links && poll(&pr, 1, START_TIMEOUT_MS) > 0) {
        ssize_t n = read(ready[0], bytes, (size_t)c->n_links - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(ready[0]);
    if (got < (size_t)c->n_links) {
        snprintf(res->error, sizeof(res->error), "%zu of %d echo servers started", got, c->n_links);
        return -1;
    }
    fprintf(stderr, "bench_ps: %s: omnivored pid %d on %s, %d shard server(s), %d echo\n", tag,
            (int)ch->daemon, ch->ps_ep, c->n_servers, c->n_links);
    return 0;
}

/* Every worker registered, attached and holding step 0's parameters. */
static int join_workers(case_run_t *c, case_result_t *res)
{
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = &c->w[i];
        w->c = c;
        w->index = i;
        w->failed = 0;
        w->step = 0;
        w->batch = 1;
        w->n_lat[0] = w->n_lat[1] = 0;
        if (open_worker(w) < 0 || handshake(w) < 0) {
            snprintf(res->error, sizeof(res->error), "worker %d: %s", i, w->error);
            print_logs(c);
            return -1;
        }
    }
    /* The job runs once every worker is registered: pull step 0 for all. */
    for (int i = 0; i < c->n_workers; i++) {
        worker_t *w = &c->w[i];
        if (send_pulls(w, 0) < 0 || recv_params(w, 0) < 0) {
            snprintf(res->error, sizeof(res->error), "worker %d: %s", i, w->error);
            print_logs(c);
            return -1;
        }
    }
    return 0;
}

/* Warm-up windows (both servers touch their buffers), then alternating measured ones: the
 * medians and percentiles into res. Returns 0, or -1 with res->error set. */
static int measure(case_run_t *c, float *scratch, case_result_t *res)
{
    const bench_t *b = c->b;
    double gbps[2][64], ups[2][64];
    int nw[2] = {0, 0};
    double win_s;
    uint64_t rts;
    double bytes_rt = 2.0 * (double)c->size->bytes;
    int r = 0;
    for (int mode = 0; mode < 2 && r == 0; mode++)
        r = run_window(c, mode, 0, b->seconds / 2, &win_s, &rts);
    for (int rep = 0; rep < b->repeats && r == 0; rep++) {
        for (int k = 0; k < 2 && r == 0; k++) {
            int mode = (rep % 2 == 0) == (k == 0) ? MODE_RAW : MODE_PS;
            r = run_window(c, mode, 1, b->seconds, &win_s, &rts);
            if (r == 0 && nw[mode] < 64) {
                gbps[mode][nw[mode]] = bytes_rt * (double)rts / win_s / 1e9;
                ups[mode][nw[mode]] = (double)rts / win_s;
                nw[mode]++;
                res->mode[mode].round_trips += rts;
            }
        }
    }
    if (r < 0) {
        for (int i = 0; i < c->n_workers; i++)
            if (c->w[i].failed) {
                snprintf(res->error, sizeof(res->error), "worker %d: %s", i, c->w[i].error);
                break;
            }
        if (res->error[0] == '\0')
            snprintf(res->error, sizeof(res->error), "interrupted");
        if (interrupted == 0)
            print_logs(c);
        return -1;
    }
    for (int mode = 0; mode < 2; mode++) {
        res->mode[mode].gbps = median(gbps[mode], nw[mode]);
        res->mode[mode].ups = median(ups[mode], nw[mode]);
        percentiles(c, mode, scratch, &res->mode[mode]);
    }
    return 0;
}

/* Whether the process behind control socket ctl counts `steps` group steps (its group clocks)
 * and no refusals; what it says goes into clocks and refused (-1: no answer). */
static int counts_match(const char *ctl, long long steps, long long *clocks, long long *refused)
{
    omv_strbuf_t st;
    omv_strbuf_init(&st);
    int cr = bench_control(ctl, "status --json", &st);
    *clocks = cr == 0 ? bench_json_array_sum(omv_strbuf_str(&st), "group_clocks") : -1;
    *refused = cr == 0 ? bench_json_int(omv_strbuf_str(&st), "refused_total") : -1;
    omv_strbuf_fini(&st);
    return *clocks == steps && *refused == 0;
}

/* Every push we made was applied (group clocks = our steps) and nothing was refused: by the
 * daemon, or by the coordinator (which counts our step reports) and by every shard server (each
 * applies its own shards). A coordinator may not have read our last reports yet: asked again
 * for up to a second. */
static void verify(case_run_t *c, case_result_t *res)
{
    long long steps = 0, clocks, refused;
    for (int i = 0; i < c->n_workers; i++)
        steps += (long long)c->w[i].step;
    res->verified = 1;
    for (int i = -1; i < c->n_servers; i++) {
        const char *ctl = i < 0 ? c->ch.ctl : c->ch.server_ctl[i];
        double deadline = now_s() + 1.0;
        int ok;
        while (!(ok = counts_match(ctl, steps, &clocks, &refused)) && refused == 0 &&
               now_s() < deadline)
            sleep_s(0.02);
        if (!ok)
            fprintf(stderr,
                    "bench_ps: %s x%d s%d %s: %s reports group clocks summing to %lld and %lld "
                    "refusals; we pushed %lld steps\n",
                    c->size->label, c->n_workers, c->n_servers, c->transport,
                    i < 0 ? "the daemon" : "a shard server", clocks, refused, steps);
        res->verified = res->verified && ok;
    }
}

static void run_case(bench_t *b, worker_t *workers, float *scratch, const size_spec_t *sz,
                     int n_workers, int n_servers, const char *transport, case_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->size = sz;
    res->workers = n_workers;
    res->servers = n_servers;
    res->shards = b->shards > n_servers ? b->shards : n_servers;
    res->transport = transport;
    case_run_t c;
    memset(&c, 0, sizeof(c));
    c.b = b;
    c.size = sz;
    c.transport = transport;
    c.n_workers = n_workers;
    c.n_servers = n_servers;
    c.n_links = n_servers > 0 ? n_servers : 1;
    c.w = workers;
    /* A window also lasts until every worker made this many round trips: 64 MiB x 8 workers
     * takes seconds per round trip, so one is enough there. */
    c.min_iters = b->quick || sz->bytes >= (16u << 20) ? 1 : 2;
    int threads = 0, barriers = 0;

    char job[512], images[512], labels[512], name[64];
    snprintf(images, sizeof(images), "%s/images-%s.idx", b->dir, sz->label);
    snprintf(labels, sizeof(labels), "%s/labels-%s.idx", b->dir, sz->label);
    snprintf(job, sizeof(job), "%s/job-%s-x%d-s%d.ini", b->dir, sz->label, n_workers, n_servers);
    snprintf(name, sizeof(name), "bench-ps-%s-x%d-s%d", sz->label, n_workers, n_servers);
    bench_job_t jf = {name, sz->in, sz->out, images, labels, n_workers, res->shards, n_servers};
    if (bench_write_idx(images, labels, IMAGES, sz->in) < 0 || bench_write_job(job, &jf) < 0) {
        snprintf(res->error, sizeof(res->error), "cannot write the job files in %s", b->dir);
        return;
    }
    if (start_children(&c, job, res) < 0 || join_workers(&c, res) < 0)
        goto out;
    pthread_barrier_init(&c.start, NULL, (unsigned)n_workers + 1);
    pthread_barrier_init(&c.end, NULL, (unsigned)n_workers + 1);
    barriers = 1;
    for (; threads < n_workers; threads++) {
        if (pthread_create(&workers[threads].thread, NULL, worker_main, &workers[threads]) != 0) {
            snprintf(res->error, sizeof(res->error), "pthread_create failed");
            goto out;
        }
    }
    if (measure(&c, scratch, res) < 0)
        goto out;
    verify(&c, res);
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
    stop_children(&c);
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
               "                [--servers 1,2,4] [--seconds S] [--repeats R] [--shards N] "
               "[--daemon PATH] [--keep]\n");
}

static int parse_args(bench_t *b, int argc, char **argv)
{
    char sizes[256] = "4k,1m,16m,64m", workers[256] = "1,2,8", transports[256] = "tcp,ipc";
    char servers[256] = "0";
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
        } else if (strcmp(a, "--servers") == 0) {
            omv_strlcpy(servers, v, sizeof(servers)), i++;
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
    n = split(servers, items, MAX_LIST);
    for (int i = 0; i < n; i++) {
        char *end;
        long sv = strtol(items[i], &end, 10);
        if (*end != '\0' || sv < 0 || sv > MAX_SERVERS) {
            fprintf(stderr,
                    "bench_ps: servers '%s' is not in [0, %d] (0: the daemon holds the "
                    "model)\n",
                    items[i], MAX_SERVERS);
            return -EINVAL;
        }
        b->servers[b->n_servers++] = (int)sv;
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
    if (b->n_sizes <= 0 || b->n_workers <= 0 || b->n_servers <= 0 || b->n_transports <= 0) {
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
    printf("# max(%d, servers) shard(s); GB = 1e9 bytes, both directions; GB/s and upd/s: median "
           "of %d window(s) of %.2f s; latency: one round trip\n",
           b->shards, b->repeats, b->seconds);
    printf("%-7s %3s %2s %-4s | %8s %9s %9s %9s | %8s %9s %9s %9s | %6s %6s %s\n", "size", "wk",
           "sv", "tr", "raw GB/s", "p50 us", "p99 us", "upd/s", "ps GB/s", "p50 us", "p99 us",
           "upd/s", "ps/raw", "p50x", "check");
    int all_ok = 1;
    for (int i = 0; i < n; i++) {
        const case_result_t *r = &res[i];
        if (!r->ok) {
            all_ok = 0;
            printf("%-7s %3d %2d %-4s | FAILED: %s\n", r->size->label, r->workers, r->servers,
                   r->transport, r->error);
            continue;
        }
        const mode_result_t *rw = &r->mode[MODE_RAW], *ps = &r->mode[MODE_PS];
        printf("%-7s %3d %2d %-4s | %8.3f %9.1f %9.1f %9.0f | %8.3f %9.1f %9.1f %9.0f | %6.2f "
               "%6.2f %s\n",
               r->size->label, r->workers, r->servers, r->transport, rw->gbps, rw->p50_us,
               rw->p99_us, rw->ups, ps->gbps, ps->p50_us, ps->p99_us, ps->ups, ps->gbps / rw->gbps,
               ps->p50_us / rw->p50_us, r->verified ? "ok" : "MISMATCH");
    }
    printf("# sv: shard servers the model is on (0: the daemon holds it), and as many raw echo "
           "servers, each echoing its servers' shards (one for sv 0)\n"
           "# ps/raw: GB/s ratio; p50x: ps p50 latency over raw p50 latency; check: the daemon's "
           "(with sv > 0 the coordinator's and every shard server's) group clocks equal our "
           "pushes, no refusals\n");

    omv_strbuf_t j;
    omv_strbuf_init(&j);
    omv_strbuf_printf(&j,
                      "{\"bench\":\"ps\",\"unit_gb\":1e9,\"shards\":%d,\"seconds\":%.3f,"
                      "\"repeats\":%d,\"quick\":%s,\"goals\":{\"ratio_1mib\":%.2f,"
                      "\"gbps_1mib\":%.2f,\"rt_4kib_us\":%.0f}",
                      b->shards, b->seconds, b->repeats, b->quick ? "true" : "false", GOAL_RATIO,
                      GOAL_GBPS, GOAL_SMALL_US);
    omv_strbuf_append(&j, ",\"servers\":[", 12);
    for (int i = 0; i < b->n_servers; i++)
        omv_strbuf_printf(&j, "%s%d", i ? "," : "", b->servers[i]);
    omv_strbuf_printf(&j, "],\"cpus\":%ld,\"daemon\":", sysconf(_SC_NPROCESSORS_ONLN));
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
                          "\"workers\":%d,\"servers\":%d,\"shards\":%d,\"echo_servers\":%d,"
                          "\"transport\":\"%s\",\"ok\":%s",
                          first ? "" : ",", r->size->label, r->size->bytes, r->size->in,
                          r->size->out, r->workers, r->servers, r->shards,
                          r->servers > 0 ? r->servers : 1, r->transport, r->ok ? "true" : "false");
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
            printf("1MiB x%d s%d %s: ps/raw %.2f (goal %.1f: %s), ps %.3f GB/s (goal %.1f: %s)\n",
                   r->workers, r->servers, r->transport, ps->gbps / rw->gbps, GOAL_RATIO,
                   pass_ratio ? "met" : "MISSED", ps->gbps, GOAL_GBPS,
                   pass_gbps ? "met" : "MISSED");
            omv_strbuf_printf(&j, ",\"goal_ratio_met\":%s,\"goal_gbps_met\":%s",
                              pass_ratio ? "true" : "false", pass_gbps ? "true" : "false");
        }
        if (r->size->bytes == 4096) {
            int pass = ps->p50_us < GOAL_SMALL_US;
            printf("4KiB x%d s%d %s: ps round trip p50 %.1f us, p99 %.1f us (goal p50 < %.0f: "
                   "%s)\n",
                   r->workers, r->servers, r->transport, ps->p50_us, ps->p99_us, GOAL_SMALL_US,
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
    int n_cases = b.n_sizes * b.n_workers * b.n_servers * b.n_transports;
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
            for (int v = 0; v < b.n_servers && !interrupted; v++)
                for (int t = 0; t < b.n_transports && !interrupted; t++) {
                    double t0 = now_s();
                    case_result_t *r = &res[n++];
                    run_case(&b, workers, scratch, &b.sizes[s], b.workers[w], b.servers[v],
                             b.transports[t], r);
                    fprintf(stderr, "bench_ps: [%d/%d] %s x%d s%d %s: %s (%.1f s)\n", n, n_cases,
                            b.sizes[s].label, b.workers[w], b.servers[v], b.transports[t],
                            r->ok ? "done" : r->error, now_s() - t0);
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
