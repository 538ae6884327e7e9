/* Integration tests with a hostile peer on the worker endpoint: floods and oversized frames are
 * refused with the daemon's memory bounded, and strings from peers cannot forge lines. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "cert.h"
#include "cluster_util.h"
#include "config.h"
#include "control.h"
#include "peer_util.h"
#include "shm.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"
#include "wire.h"

/* Two 32 MB frames from a stranger: the connection is dropped before either is buffered (the
 * frame limit comes from the job's small model), and the daemon goes on answering. */
START_TEST(test_oversized_frames)
{
    write_job(1, 2, "groups = 1");
    pid_t d = start_daemon();
    long before = proc_kib(d, "VmHWM");
    size_t big = 32u << 20;
    char *junk = calloc(1, big);
    ck_assert_ptr_nonnull(junk);
    for (int i = 0; i < 2; i++) {
        peer_t p;
        peer_open(&p);
        peer_send_raw(&p, junk, big, NULL, 0);
        /* A legitimate Hello on another connection is still answered, after the junk. */
        peer_t q;
        peer_open(&q);
        omv_msg_t m = {.type = OMV_MSG_HELLO};
        m.u.hello.protocol_version = OMV_PROTOCOL_VERSION + 1;
        peer_send(&q, &m, NULL, 0);
        expect_error(&q, OMV_REFUSE_VERSION);
        peer_close(&q);
        peer_close(&p);
    }
    free(junk);
    long after = proc_kib(d, "VmHWM");
    ck_assert_msg(after - before < 20 * 1024, "peak RSS grew from %ld to %ld KiB", before, after);
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    shutdown_daemon(d);
}
END_TEST

/* A flood of bad messages whose answers are never read: every one is refused and counted, the
 * answers the peer does not read are dropped, and memory stays flat. */
START_TEST(test_unread_flood)
{
    write_job(1, 2, "groups = 1");
    pid_t d = start_daemon();
    long before = proc_kib(d, "VmRSS");
    peer_t p;
    peer_open(&p);
    int hwm = 100;
    zmq_setsockopt(p.sock, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    enum { FLOOD = 200000 };
    for (int i = 0; i < FLOOD; i++)
        peer_send_raw(&p, "\xff\xfe not an envelope, and nobody reads the answer", 48, NULL, 0);
    wait_status("refused_malformed_total", FLOOD, 60000);
    ck_assert_msg(status_field("refusals_unanswered_total") > 0, "every answer was queued");
    long after = proc_kib(d, "VmRSS");
    ck_assert_msg(after - before < 20 * 1024, "RSS grew from %ld to %ld KiB", before, after);
    peer_close(&p);
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    shutdown_daemon(d);
}
END_TEST

/* Pushes grad[param_count] as step's gradient, every shard as fp32. */
static void push_grad(peer_t *p, uint32_t id, uint64_t step, const omv_jobspec_t *j,
                      const float *grad)
{
    for (uint32_t s = 0; s < j->n_shards; s++) {
        uint32_t off = j->shard_offsets[s], cnt = j->shard_offsets[s + 1] - off;
        omv_msg_t push = {.type = OMV_MSG_PUSH};
        push.u.push = (omv_push_t){id, step, s, off, cnt, 1.0f, 32, 1.0f, OMV_WIRE_FP32};
        peer_send(p, &push, grad + off, cnt);
    }
}

/* A registered trainer that pushes 3e38 in every element (finite, so no NaN check catches it)
 * after some ordinary steps: each shard refuses it as far outside the norms it has been
 * receiving, and the step goes on without it, leaving the model as it was. */
START_TEST(test_huge_gradient_refused)
{
    write_job(1, 2, "groups = 1\nshards = 3\nwire = fp32");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    peer_hello(&p, "stranger", &w);
    const omv_jobspec_t *j = &w.u.welcome.job;
    uint32_t id = w.u.welcome.worker_id;
    size_t n = j->param_count;
    float *model = calloc(n, sizeof(float)), *after = calloc(n, sizeof(float));
    float *grad = calloc(n, sizeof(float));
    uint64_t step = 0;
    /* The job's default bound learns from the first 10 gradients of each shard. */
    for (; step <= 12; step++) {
        pull_model(&p, id, step, j, model);
        for (size_t i = 0; i < n; i++)
            grad[i] = (step == 12 ? 3e38f : 1e-3f) * (i % 2 ? 1.0f : -1.0f);
        push_grad(&p, id, step, j, grad);
        for (uint32_t s = 0; step == 12 && s < j->n_shards; s++)
            expect_error(&p, OMV_REFUSE_NORM);
    }
    pull_model(&p, id, step, j, after);
    ck_assert_int_eq(memcmp(model, after, n * sizeof(float)), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(after[i]) < 100.0f, "parameter %zu is %g", i, (double)after[i]);
    ck_assert_int_eq((int)status_field("refused_norm_total"), (int)j->n_shards);
    peer_close(&p);
    free(model);
    free(after);
    free(grad);
    shutdown_daemon(d);
}
END_TEST

/* Pulls step of a job of wire int8 naming view, and checks every shard came whole (fp32,
 * beginning a view other than the one named) or, with whole 0, as the next change to view;
 * model gets the values (changes added to it). Returns the view the answers name. */
static uint64_t pull_view(peer_t *p, uint32_t id, uint64_t step, const omv_jobspec_t *j,
                          uint64_t view, uint32_t seq, int whole, float *model)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){id, step, view};
    peer_send(p, &m, NULL, 0);
    static float part[1 << 16];
    uint64_t named = 0;
    for (uint32_t n = 0; n < j->n_shards; n++) {
        peer_recv(p, &m, part, sizeof(part) / sizeof(part[0]));
        ck_assert_int_eq(m.type, OMV_MSG_PARAMS);
        const omv_params_t *q = &m.u.params;
        ck_assert_int_eq(q->step, step);
        ck_assert_msg(q->wire == (whole ? OMV_WIRE_FP32 : OMV_WIRE_INT8),
                      "step %llu shard %u came with wire %u", (unsigned long long)step, q->shard,
                      q->wire);
        ck_assert_msg(whole ? q->view != 0 && q->view != view && q->view_seq == 0
                            : q->view == view && q->view_seq == seq,
                      "shard %u: view %llx change %u, named %llx", q->shard,
                      (unsigned long long)q->view, q->view_seq, (unsigned long long)view);
        ck_assert(named == 0 || named == q->view);
        named = q->view;
        if (whole)
            memcpy(model + q->offset, part, q->count * sizeof(float));
        else
            omv_q8_add(model + q->offset, part, q->count);
    }
    return named;
}

/* Pushes step's gradient (small, fp32) for every shard. */
static void push_small(peer_t *p, uint32_t id, uint64_t step, const omv_jobspec_t *j, float *grad)
{
    for (size_t i = 0; i < j->param_count; i++)
        grad[i] = 1e-2f * (float)((i * 7 + step) % 5) - 2e-2f;
    push_grad(p, id, step, j, grad);
}

/* With wire int8 a pull names the view of the parameters the worker holds. A peer that names
 * another (forged, or one the daemon has moved on from) is sent whole shards, beginning a new
 * view, and never a change against values it does not hold; the daemon refuses nothing and
 * goes on. The changes to a view track the daemon's parameters to within their rounding. */
START_TEST(test_int8_forged_view)
{
    write_job(1, 2, "groups = 1\nshards = 3\nwire = int8");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    peer_hello(&p, "forger", &w);
    const omv_jobspec_t *j = &w.u.welcome.job;
    uint32_t id = w.u.welcome.worker_id;
    size_t n = j->param_count;
    float *view = calloc(n, sizeof(float)), *exact = calloc(n, sizeof(float));
    float *grad = calloc(n, sizeof(float));
    uint64_t v = pull_view(&p, id, 0, j, 0, 0, 1, view);
    push_small(&p, id, 0, j, grad);
    pull_view(&p, id, 1, j, v, 1, 0, view); /* the view it holds: a change */
    push_small(&p, id, 1, j, grad);
    uint64_t v2 = pull_view(&p, id, 2, j, v ^ 0x5a5a, 0, 1, exact); /* forged: whole */
    for (size_t i = 0; i < n; i++) /* one step apart: within a step's size of the update */
        ck_assert_msg(fabsf(view[i] - exact[i]) < 0.1f, "parameter %zu: view %g, daemon %g", i,
                      (double)view[i], (double)exact[i]);
    push_small(&p, id, 2, j, grad);
    uint64_t v3 = pull_view(&p, id, 3, j, v, 0, 1, exact); /* the old view: whole again */
    ck_assert(v3 != v2);
    memcpy(view, exact, n * sizeof(float));
    push_small(&p, id, 3, j, grad);
    pull_view(&p, id, 4, j, v3, 1, 0, view);
    ck_assert_int_eq((int)status_field("refused_malformed_total"), 0);
    ck_assert_int_eq((int)status_field("workers_alive"), 1);
    peer_close(&p);
    free(view);
    free(exact);
    free(grad);
    shutdown_daemon(d);
}
END_TEST

/* Sends m on a local worker's connection as the worker does (omv_shm_batch). Returns how many
 * records went. */
static int local_send(int conn, const omv_msg_t *m)
{
    static omv_shm_batch_t b;
    ck_assert_int_eq(omv_shm_batch_add(&b, m), 0);
    return omv_shm_batch_flush(conn, &b);
}

/* The next envelope on a local worker's connection (within 5 s). */
static void local_recv(int conn, omv_msg_t *m)
{
    struct pollfd pf = {conn, POLLIN, 0};
    ck_assert_msg(poll(&pf, 1, 5000) == 1, "nothing came on the shared-memory connection");
    char why[OMV_WIRE_REASON_MAX] = "";
    int r = omv_shm_recv_msg(conn, m, why);
    ck_assert_msg(r == 0, "shared-memory connection: %s (%s)", omv_strerror(r), why);
}

/* Pulls step over the connection: every shard answers there, its values in the segment. */
static void local_pull(int conn, uint32_t id, uint64_t step, const omv_jobspec_t *j)
{
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){id, step, 0};
    ck_assert_int_eq(local_send(conn, &m), 1);
    uint8_t got[OMV_WIRE_MAX_SHARDS] = {0};
    for (uint32_t n = 0; n < j->n_shards; n++) {
        local_recv(conn, &m);
        ck_assert_int_eq(m.type, OMV_MSG_PARAMS);
        ck_assert_int_eq(m.u.params.wire, OMV_WIRE_SHM);
        ck_assert_msg(m.u.params.shared, "one group, yet shard %u was copied, not read in place",
                      m.u.params.shard);
        ck_assert_int_eq(m.u.params.step, step);
        ck_assert_uint_lt(m.u.params.shard, j->n_shards);
        ck_assert_msg(!got[m.u.params.shard], "shard %u answered twice", m.u.params.shard);
        got[m.u.params.shard] = 1;
    }
}

/* A local worker's shared-memory connection carries only its own pulls, shared-memory pushes
 * and leave: bytes that do not decode, an envelope too large, a push announcing values, another
 * worker's pull and a heartbeat are each refused as malformed, on its socket, and the daemon
 * goes on training it over the connection; a Leave there, then the close, is a leave. */
START_TEST(test_local_connection_garbage)
{
    write_job(1, 2, "groups = 1\nshards = 3");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    peer_hello(&p, "local", &w);
    const omv_welcome_t *wl = &w.u.welcome;
    ck_assert_msg(wl->shm_socket[0] != '\0', "the daemon offered no shared memory");
    const omv_jobspec_t *j = &wl->job;
    uint32_t id = wl->worker_id;
    size_t n = j->param_count;
    omv_shm_hello_t h = {.worker_id = id, .token = wl->shm_token};
    omv_shm_maps_t maps;
    char why[OMV_WIRE_REASON_MAX] = "";
    int conn = omv_shm_attach(wl->shm_socket, &h, n * sizeof(float), 2000, &maps, why);
    ck_assert_msg(conn >= 0, "attach: %s", why);
    /* The daemon's own parameters can be read, never written. */
    errno = 0;
    ck_assert_msg(mprotect((void *)maps.model, n * sizeof(float), PROT_READ | PROT_WRITE) != 0,
                  "the model segment could be made writable");
    ck_assert_int_eq(errno, EACCES);
    static uint8_t junk[4096];
    memset(junk, 0xa5, sizeof(junk));
    ck_assert_int_eq(send(conn, junk, 37, 0), 37);
    expect_error(&p, OMV_REFUSE_MALFORMED);
    ck_assert_int_eq(send(conn, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
    expect_error(&p, OMV_REFUSE_MALFORMED);
    omv_msg_t m = {.type = OMV_MSG_PUSH};
    m.u.push = (omv_push_t){id, 0, 0, 0, j->shard_offsets[1], 1.0f, 32, 1.0f, OMV_WIRE_FP32};
    uint8_t env[OMV_SHM_ENVELOPE_MAX];
    size_t len;
    ck_assert_int_eq(omv_wire_encode(&m, env, sizeof(env), &len), 0);
    ck_assert_int_eq(send(conn, env, len, 0), (ssize_t)len);
    expect_error(&p, OMV_REFUSE_MALFORMED);
    m = (omv_msg_t){.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){id + 1, 0, 0};
    ck_assert_int_eq(local_send(conn, &m), 1);
    expect_error(&p, OMV_REFUSE_MALFORMED);
    m = (omv_msg_t){.type = OMV_MSG_HEARTBEAT};
    m.u.heartbeat.worker_id = id;
    ck_assert_int_eq(local_send(conn, &m), 1);
    expect_error(&p, OMV_REFUSE_MALFORMED);
    ck_assert_int_eq((int)status_field("refused_malformed_total"), 5);
    /* A step over the connection, the parameters read in place: they move against its
     * gradient. */
    float *before = malloc(n * sizeof(float)), *grads = maps.grads;
    local_pull(conn, id, 0, j);
    memcpy(before, maps.model, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        grads[i] = i % 2 ? 0.01f : -0.01f;
    for (uint32_t sh = j->n_shards; sh-- > 0;) {
        uint32_t off = j->shard_offsets[sh], cnt = j->shard_offsets[sh + 1] - off;
        m = (omv_msg_t){.type = OMV_MSG_PUSH};
        m.u.push = (omv_push_t){id, 0, sh, off, cnt, 1.0f, 32, 1.0f, OMV_WIRE_SHM};
        ck_assert_int_eq(local_send(conn, &m), 1);
    }
    local_pull(conn, id, 1, j);
    const float *after = maps.model;
    for (size_t i = 0; i < n; i++)
        ck_assert_msg((after[i] - before[i]) * grads[i] < 0.0f,
                      "parameter %zu went from %g to %g against a gradient of %g", i,
                      (double)before[i], (double)after[i], (double)grads[i]);
    ck_assert_int_eq((int)status_field("shm_inplace_serves_total"), 2 * (int)j->n_shards);
    ck_assert_int_eq((int)status_field("shm_inplace_raced_total"), 0);
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    /* A Leave there comes before the close that follows it: a leave, not a death. */
    m = (omv_msg_t){.type = OMV_MSG_LEAVE};
    m.u.leave.worker_id = id;
    ck_assert_int_eq(local_send(conn, &m), 1);
    close(conn);
    wait_status("leaves_total", 1, 5000);
    ck_assert_int_eq((int)status_field("deaths_total"), 0);
    ck_assert_int_eq((int)status_field("shm_workers"), 0);
    omv_shm_unmap(maps.params, n * sizeof(float));
    omv_shm_unmap(maps.grads, n * sizeof(float));
    omv_shm_unmap((void *)maps.model, n * sizeof(float));
    free(before);
    peer_close(&p);
    shutdown_daemon(d);
}
END_TEST

/* A registration that only sends heartbeats cannot hold a synchronous job: it is declared dead
 * once it has pushed nothing for [cluster] progress_timeout_s, and the job goes on to the end
 * with the real worker. */
START_TEST(test_heartbeat_only_member_expires)
{
    write_job(2, 2, "groups = 1\nprogress_timeout_s = 2");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    peer_hello(&p, "squatter", &w);
    omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
    hb.u.heartbeat.worker_id = w.u.welcome.worker_id;
    pid_t tr = start_worker("trainer");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 60000;
    for (;;) {
        peer_send(&p, &hb, NULL, 0); /* answers are never read */
        control("status", &body);
        char state[32] = "";
        text_field(omv_strbuf_str(&body), "state", state, sizeof(state));
        if (strcmp(state, "done") == 0)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "the job stalled: %s", omv_strbuf_str(&body));
        sleep_ms(200);
    }
    ck_assert_msg(field(omv_strbuf_str(&body), "deaths_total") >= 1, "%s", omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    expect_exit_0(tr, "trainer");
    peer_close(&p);
    shutdown_daemon(d);
}
END_TEST

/* A hostname with a newline cannot forge a line in `omnivorectl workers`. */
START_TEST(test_hostname_newline)
{
    write_job(2, 2, "groups = 1");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    peer_hello(&p, "evil\nstate:forged\nworkers_alive:99", &w);
    static char out[65536];
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "workers"), 0);
    ck_assert_msg(!has_text(out, "\nstate:forged") && !has_text(out, "\nworkers_alive:99"),
                  "a forged line: %s", out);
    ck_assert_msg(has_text(out, "evil\\x0astate:forged"), "hostname not shown escaped: %s", out);
    peer_close(&p);
    shutdown_daemon(d);
}
END_TEST

/* Sends line to the control socket as uid:gid (no supplementary groups), from a child; the
 * reply's status and body come back through a pipe into out[cap]. */
static int request_as(uid_t uid, gid_t gid, const char *line, char *out, size_t cap)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
            _exit(3);
        omv_strbuf_t body;
        omv_strbuf_init(&body);
        int r = omv_control_request(sock_path, line, &body, 5000);
        dprintf(fds[1], "%d\n%s", r, omv_strbuf_str(&body));
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (len < cap - 1 && (n = read(fds[0], out + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(fds[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the client could not run");
    return atoi(out);
}

/* Who may change the daemon, and what it reads for them: a caller outside the admin group may
 * only read; one inside may submit, but only files they could read themselves, and a refusal
 * quotes nothing of a secret file (its first key, bytes, size or existence). */
START_TEST(test_control_callers)
{
    if (geteuid() != 0) {
        printf("test_control_callers: skipped: needs root to play other users\n");
        return;
    }
    char secret[700], conf[700], job2[700], out[8192];
    snprintf(secret, sizeof(secret), "%s/secret.ini", test_dir);
    FILE *f = fopen(secret, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[job]\nhunter2 = yes\n");
    fclose(f);
    chmod(secret, 0600);
    model_section = "definition = secret.ini";
    write_job(1, 2, "groups = 1");
    snprintf(job2, sizeof(job2), "%s/job2.ini", test_dir);
    ck_assert_int_eq(rename(job_path, job2), 0);
    model_section = "layers = 64 32 4";
    write_job(1, 2, "groups = 1");
    chmod(test_dir, 0755);
    snprintf(conf, sizeof(conf), "%s/omnivored.conf", test_dir);
    f = fopen(conf, "w");
    fprintf(f, "[security]\nadmin_group = nogroup\n");
    fclose(f);
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--config",
                    conf,
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    test_dir,
                    "--log-level",
                    "warn",
                    NULL};
    pid_t d = start_daemon_argv(argv);
    chmod(sock_path, 0666);

    /* uid 54321 is in no group that may change anything: it reads, and is refused the rest. */
    ck_assert_int_eq(request_as(54321, 54321, "status", out, sizeof(out)), 0);
    ck_assert_int_eq(request_as(54321, 54321, "shutdown", out, sizeof(out)), -EREMOTEIO);
    ck_assert_msg(strstr(out, "'shutdown' changes the daemon") && strstr(out, "uid 54321"), "%s",
                  out);
    char line[800];
    snprintf(line, sizeof(line), "submit %s", job_path);
    ck_assert_int_eq(request_as(54321, 54321, line, out, sizeof(out)), -EREMOTEIO);
    ck_assert_msg(strstr(out, "changes the daemon"), "%s", out);

    /* nobody (group nogroup, the admin group) may submit, but not a file it cannot read, nor a
     * job whose definition it cannot read; the refusals say the same for a missing file. */
    const char *secrets[] = {secret, job2};
    for (int i = 0; i < 2; i++) {
        snprintf(line, sizeof(line), "submit %s", secrets[i]);
        ck_assert_int_eq(request_as(65534, 65534, line, out, sizeof(out)), -EREMOTEIO);
        ck_assert_msg(strstr(out, "uid 65534 cannot read it (it is missing, or"), "%s", out);
        ck_assert_msg(!strstr(out, "hunter2") && !strstr(out, "bytes"), "quoted: %s", out);
    }
    snprintf(line, sizeof(line), "submit %s/nothing-here.ini", test_dir);
    ck_assert_int_eq(request_as(65534, 65534, line, out, sizeof(out)), -EREMOTEIO);
    ck_assert_msg(strstr(out, "uid 65534 cannot read it (it is missing, or"), "%s", out);
    snprintf(line, sizeof(line), "submit %s", job_path);
    ck_assert_int_eq(request_as(65534, 65534, line, out, sizeof(out)), 0);
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    shutdown_daemon(d);
}
END_TEST

/* The pid of a child of parent whose command line contains what, or 0. */
static pid_t child_with(pid_t parent, const char *what)
{
    DIR *dir = opendir("/proc");
    ck_assert_ptr_nonnull(dir);
    pid_t found = 0;
    struct dirent *de;
    while (found == 0 && (de = readdir(dir)) != NULL) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char path[64], buf[4096];
        if (pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        int ppid = 0;
        /* pid (comm) state ppid: comm has no spaces here */
        if (fscanf(f, "%*d %*s %*c %d", &ppid) != 1)
            ppid = 0;
        fclose(f);
        if (ppid != parent)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            buf[i] = buf[i] ? buf[i] : ' ';
        buf[n] = '\0';
        if (strstr(buf, what))
            found = pid;
    }
    closedir(dir);
    return found;
}

/* A job whose final checkpoint fails, and whose final model is never evaluated (the evaluator
 * is killed after an earlier evaluation), says both in its summary and shows neither the older
 * accuracy nor an older checkpoint as its result. */
START_TEST(test_honest_summary)
{
    write_job(1, 3, "groups = 1");
    pid_t d = start_daemon();
    /* Where the checkpoints go becomes a file: every write fails, the final one too. */
    char folder[700];
    snprintf(folder, sizeof(folder), "%s/checkpoints/blobs", test_dir);
    ck_assert_int_eq(rmdir(folder), 0);
    FILE *f = fopen(folder, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    pid_t ev = start_worker("evaluator");
    pid_t tr = start_worker_slow("trainer", "15");
    wait_status("evaluations_total", 1, 60000); /* the evaluation after epoch 1 */
    kill(ev, SIGKILL);
    waitpid(ev, NULL, 0);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done(&body, 120000);
    control("summary", &body);
    const char *s = omv_strbuf_str(&body);
    ck_assert_msg(has_text(s, "final_evaluation:missing"), "%s", s);
    ck_assert_msg(has_text(s, "\ntest_accuracy:\n"), "a stale accuracy: %s", s);
    ck_assert_msg(has_text(s, "final_checkpoint:failed") && has_text(s, "\ncheckpoint:\n"), "%s",
                  s);
    ck_assert_msg(has_text(s, "checkpoint_error:cannot create checkpoint folder"), "%s", s);
    ck_assert_msg(has_text(s, "eval_1:epoch=1.00"), "the earlier evaluation is history: %s", s);
    control("summary --json", &body);
    s = omv_strbuf_str(&body);
    ck_assert_msg(has_text(s, "\"test_accuracy\":null") && has_text(s, "\"checkpoint\":\"\""), "%s",
                  s);
    omv_strbuf_fini(&body);
    expect_exit_0(tr, "trainer");
    shutdown_daemon(d);
}
END_TEST

/* omnivorectl run fails when the job's final model was not evaluated. */
START_TEST(test_run_fails_without_final_evaluation)
{
    write_job(1, 2, "groups = 1");
    char log[700];
    snprintf(log, sizeof(log), "%s/run.log", test_dir);
    pid_t ctl = fork();
    ck_assert_int_ge(ctl, 0);
    if (ctl == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(1, 2);
        execl(bin("OMNIVORECTL"), "omnivorectl", "run", job_path, NULL);
        _exit(127);
    }
    pid_t ev = 0;
    int64_t deadline = omv_time_ms() + 30000;
    while ((ev = child_with(ctl, "evaluator")) == 0) {
        ck_assert_msg(omv_time_ms() < deadline, "no evaluator started");
        sleep_ms(5);
    }
    kill(ev, SIGKILL);
    int status;
    ck_assert_int_eq(waitpid(ctl, &status, 0), ctl);
    char out[65536] = "";
    FILE *f = fopen(log, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    fclose(f);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d: %s", status, out);
    ck_assert_msg(has_text(out, "final model was not evaluated"), "%s", out);
    ck_assert_msg(has_text(out, "final_evaluation:missing"), "%s", out);
}
END_TEST

/* Reads dir/name's certificate. */
static omv_cert_t cert_of(const char *dir, const char *name)
{
    char path[800], err[OMV_CONFIG_ERR_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    omv_cert_t c;
    ck_assert_msg(omv_cert_read(path, &c, err) == 0, "%s", err);
    return c;
}

static void hello_as(peer_t *p, omv_role_t role)
{
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    m.u.hello.role = role;
    strcpy(m.u.hello.hostname, "keyed");
    peer_send(p, &m, NULL, 0);
}

/* CURVE with an allow-list folder: a peer without a key and one with a key not in the folder
 * get no answer (the second is counted), a trainer key asking for the evaluator role is
 * refused, and a key removed from the folder is refused at its next registration. */
START_TEST(test_curve_allow_list)
{
    char keys[700], other[700], conf[700], cmd[2200], out[4096];
    snprintf(keys, sizeof(keys), "%s/keys", test_dir);
    snprintf(other, sizeof(other), "%s/other", test_dir);
    ck_assert_int_eq(mkdir(keys, 0700), 0);
    ck_assert_int_eq(mkdir(other, 0700), 0);
    snprintf(cmd, sizeof(cmd), "keygen daemon %s", keys);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, cmd), 0);
    snprintf(cmd, sizeof(cmd), "keygen --roles trainer t1 %s", keys);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, cmd), 0);
    snprintf(cmd, sizeof(cmd), "keygen --roles trainer,evaluator stranger %s", other);
    ck_assert_int_eq(run_omnivorectl(out, sizeof(out), NULL, cmd), 0);
    omv_cert_t d_key = cert_of(keys, "daemon.key"), t1 = cert_of(keys, "t1.key_secret");
    omv_cert_t stranger = cert_of(other, "stranger.key_secret");
    ck_assert_uint_eq(t1.roles, OMV_CERT_TRAINER);
    snprintf(conf, sizeof(conf), "%s/omnivored.conf", test_dir);
    FILE *f = fopen(conf, "w");
    fprintf(f, "[security]\ncurve = yes\nsecret_key = %s/daemon.key_secret\nallow_dir = %s\n", keys,
            keys);
    fclose(f);
    write_job(2, 2, "groups = 1");
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--once",
                    "--job",
                    job_path,
                    "--config",
                    conf,
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    test_dir,
                    "--log-level",
                    "warn",
                    NULL};
    pid_t d = start_daemon_argv(argv);

    peer_t plain, wrong, t;
    peer_open(&plain);
    hello_as(&plain, OMV_ROLE_TRAINER);
    peer_open_curve(&wrong, d_key.public_key, stranger.public_key, stranger.secret_key);
    hello_as(&wrong, OMV_ROLE_TRAINER);
    wait_status("refused_auth_total", 1, 10000);
    wait_status("handshakes_failed_total", 1, 10000); /* the peer without a key */
    ck_assert_msg(!peer_answers(&plain, 300) && !peer_answers(&wrong, 0), "a stranger got in");
    peer_close(&wrong);
    peer_close(&plain);

    peer_open_curve(&t, d_key.public_key, t1.public_key, t1.secret_key);
    hello_as(&t, OMV_ROLE_EVALUATOR);
    expect_error(&t, OMV_REFUSE_AUTH);
    hello_as(&t, OMV_ROLE_TRAINER);
    static omv_msg_t w;
    peer_recv(&t, &w, NULL, 0);
    ck_assert_int_eq(w.type, OMV_MSG_WELCOME);
    snprintf(cmd, sizeof(cmd), "%s/t1.key", keys);
    ck_assert_int_eq(unlink(cmd), 0);
    hello_as(&t, OMV_ROLE_TRAINER); /* registering again, on the same connection */
    expect_error(&t, OMV_REFUSE_AUTH);
    ck_assert_int_ge((int)status_field("refused_auth_total"), 3);
    peer_close(&t);
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    shutdown_daemon(d);
}
END_TEST

/* omnivorectl run --curve: the quickstart over CURVE, with keys it makes and removes. */
START_TEST(test_run_over_curve)
{
    write_job(2, 2, "groups = 1");
    static char json[65536];
    int rc = run_ctl(json, sizeof(json), "--curve");
    ck_assert_msg(rc == 0, "omnivorectl run --curve exited %d: %s", rc, json);
    ck_assert_msg(has_text(json, "\"state\":\"done\"") && json_number(json, "test_accuracy") > 0.9,
                  "%s", json);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("hostile");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_oversized_frames);
    tcase_add_test(tc, test_unread_flood);
    tcase_add_test(tc, test_hostname_newline);
    tcase_add_test(tc, test_heartbeat_only_member_expires);
    tcase_add_test(tc, test_huge_gradient_refused);
    tcase_add_test(tc, test_int8_forged_view);
    tcase_add_test(tc, test_local_connection_garbage);
    tcase_add_test(tc, test_control_callers);
    tcase_add_test(tc, test_honest_summary);
    tcase_add_test(tc, test_run_fails_without_final_evaluation);
    tcase_add_test(tc, test_curve_allow_list);
    tcase_add_test(tc, test_run_over_curve);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
