/* What the suites of a model over shard servers share (servers_util.h): starting and
 * stopping the coordinator and the shard servers, their logs, the job trained on one daemon
 * and on servers, and the final checkpoints compared. */
#include "servers_util.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cluster_util.h"
#include "control.h"
#include "peer_util.h"
#include "strbuf.h"
#include "util.h"

/* The most shard servers train_on_servers starts. */
#define MAX_PROCS 8

void read_file(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* A shell line run before shard servers start, in a mount namespace of their own (as root:
 * a folder of the coordinator's that they do not share with it); NULL: none. */
const char *shard_mounts;
int shard_mounts_for; /* the one shard server it is for */
/* The one shard server (-1: none) whose config allows no checkpoint folder of the job's: it can
 * neither read a checkpoint nor write a part there. */
int shard_confined = -1;

/* Shard server i: its own endpoint, control socket, folder and log. */
pid_t start_shard(int i)
{
    char ep[700], ctl[700], dir[700], log[700];
    snprintf(ep, sizeof(ep), "ipc://%s/shard%d.sock", test_dir, i);
    snprintf(ctl, sizeof(ctl), "%s/shard%d.ctl", test_dir, i);
    snprintf(dir, sizeof(dir), "%s/shard%d", test_dir, i);
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
    /* A coordinator that answers every heartbeat is never silent for 2 s. */
    char conf[700];
    snprintf(conf, sizeof(conf), "%s/shard%d.conf", test_dir, i);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    /* The coordinator's checkpoint folders are in the test's: parts may be written there. */
    fprintf(f, "[daemon]\ncoordinator_timeout_s = 2\n");
    if (i != shard_confined)
        fprintf(f, "[security]\ncheckpoint_root = %s\n", test_dir);
    fclose(f);
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--config",
                    conf,
                    "--role",
                    "shard",
                    "--coordinator",
                    endpoint,
                    "--endpoint",
                    ep,
                    "--control",
                    ctl,
                    "--state-dir",
                    dir,
                    NULL};
    if (shard_mounts == NULL || i != shard_mounts_for)
        return spawn_logged(argv, log);
    char line[2048];
    snprintf(line, sizeof(line), "%s && exec \"$0\" \"$@\"", shard_mounts);
    char *wrapped[24] = {"/usr/bin/unshare", "-m", "/bin/sh", "-c", line};
    for (int k = 0; argv[k] && k < 18; k++)
        wrapped[5 + k] = argv[k];
    return spawn_logged(wrapped, log);
}

/* Stops shard server i (pid) and reads its log into text[cap]. */
void stop_shard(pid_t pid, int i, char *text, size_t cap)
{
    char log[700];
    kill(pid, SIGTERM);
    expect_exit_0(pid, "omnivored (shard server)");
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
    read_file(log, text, cap);
}

/* What the next coordinators' config file says (NULL: they have none). */
const char *coordinator_conf;

/* The coordinator, with the job, its state in state (a folder of the test's) and its log. */
pid_t start_coordinator(const char *state)
{
    char dir[700], log[700], conf[700];
    snprintf(dir, sizeof(dir), "%s/%s", test_dir, state);
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    snprintf(conf, sizeof(conf), "%s/coordinator.conf", test_dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(coordinator_conf ? coordinator_conf : "", f);
    fclose(f);
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--config",
                    conf,
                    "--once",
                    "--job",
                    job_path,
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    dir,
                    NULL};
    return start_daemon_logged(argv, log);
}

/* The newest finished checkpoint in state's checkpoint folder of the job. */
void read_final(const char *state, omv_checkpoint_t *ck)
{
    char dir[800], best[300] = "", path[1200], err[OMV_CHECKPOINT_ERR_MAX];
    snprintf(dir, sizeof(dir), "%s/%s/checkpoints/blobs", test_dir, state);
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "no checkpoint folder %s", dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, "checkpoint-", 11) == 0 && strcmp(e->d_name, best) > 0 &&
            strlen(e->d_name) == strlen("checkpoint-00000000.omv") && strstr(e->d_name, ".omv"))
            omv_strlcpy(best, e->d_name, sizeof(best)); /* a manifest or a whole one, no part */
    closedir(d);
    ck_assert_msg(best[0], "no checkpoint in %s", dir);
    snprintf(path, sizeof(path), "%s/%s", dir, best);
    ck_assert_msg(omv_checkpoint_read(ck, path, err) == 0, "%s", err);
    if (!ck->finished)
        dump_logs(2);
    ck_assert_msg(ck->finished, "%s is not the finished job's checkpoint", path);
}

void same_model(const omv_checkpoint_t *a, const omv_checkpoint_t *b)
{
    ck_assert_uint_eq(a->param_count, b->param_count);
    ck_assert_uint_eq(a->steps_total, b->steps_total);
    ck_assert_uint_eq(a->images_total, b->images_total);
    size_t bytes = a->param_count * sizeof(float);
    ck_assert_msg(memcmp(a->params, b->params, bytes) == 0, "the parameters differ");
    ck_assert_msg(memcmp(a->velocity, b->velocity, bytes) == 0, "the momentum differs");
}

/* The job as it is written, on one daemon: its final checkpoint in state "one". */
double train_on_one(omv_checkpoint_t *ck)
{
    pid_t d = start_coordinator("one");
    /* The socket, as to the servers: shared memory would carry fp32 whatever the wire. */
    setenv("OMNIVORE_SHM", "0", 1);
    pid_t w[3];
    w[2] = start_evaluator();
    w[0] = start_worker("trainer");
    w[1] = start_worker("trainer");
    unsetenv("OMNIVORE_SHM");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done(&body, 120000);
    omv_strbuf_fini(&body);
    stop_workers(w, 3);
    shutdown_daemon(d);
    read_final("one", ck);
    return acc;
}

/* Prints the processes' logs (on stderr, for a failing test's record). */
void dump_logs(int n)
{
    static char text[1 << 18], kept[1 << 18];
    char log[700];
    for (int i = -1; i < n; i++) {
        if (i < 0)
            snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
        else
            snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
        read_file(log, text, sizeof(text));
        /* Without the progress lines (two a second): a job stuck for the deadline would fill
         * the tail with them and hide how it got stuck. */
        size_t len = 0;
        for (char *line = text, *next; *line; line = next) {
            next = strchr(line, '\n');
            next = next ? next + 1 : line + strlen(line);
            if (strstr(line, "daemon: epoch ") == NULL || strstr(line, "daemon: epoch ") > next) {
                memcpy(kept + len, line, (size_t)(next - line));
                len += (size_t)(next - line);
            }
        }
        kept[len] = '\0';
        fprintf(stderr, "==== %s\n%s\n", log, len > 12000 ? kept + len - 12000 : kept);
    }
}

/* Waits up to 2 minutes for the job to be done; else prints the logs of the coordinator and
 * the n servers, and fails. Returns the test accuracy. */
double wait_done_or_dump(omv_strbuf_t *body, int n)
{
    int64_t deadline = omv_time_ms() + 120000;
    for (;;) {
        char state[32] = "";
        if (omv_control_request(sock_path, "status", body, 5000) == 0)
            text_field(omv_strbuf_str(body), "state", state, sizeof(state));
        if (strcmp(state, "done") == 0)
            return field(omv_strbuf_str(body), "test_accuracy");
        if (strcmp(state, "failed") == 0 || omv_time_ms() > deadline) {
            dump_logs(n);
            ck_abort_msg("the job is %s: %s", state, omv_strbuf_str(body));
        }
        sleep_ms(50);
    }
}

/* Shard server i's section of a `servers` listing. */
const char *server_section(const char *listing, int i)
{
    char sock[32];
    snprintf(sock, sizeof(sock), "/shard%d.sock\n", i);
    const char *at = strstr(listing, sock);
    ck_assert_msg(at != NULL, "no shard server %d in %s", i, listing);
    return at;
}

/* The parameters each of the n servers holds in the running job. */
static void server_ranges(int n, double *params)
{
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    for (int64_t until = omv_time_ms() + 30000;; sleep_ms(20)) {
        control("servers", &body);
        int all = 1;
        for (int i = 0; i < n; i++) {
            params[i] = field(server_section(omv_strbuf_str(&body), i), "parameters");
            all &= params[i] > 0;
        }
        if (all)
            break;
        ck_assert_msg(omv_time_ms() < until, "the servers hold no ranges: %s",
                      omv_strbuf_str(&body));
    }
    omv_strbuf_fini(&body);
}

/* What the coordinator gathered from each of the n servers (the `servers` listing). The job
 * evaluated evals times, the final one among them, direct of them sent by the servers. */
void check_gathers(const char *listing, int n, double evals, double direct)
{
    ck_assert_msg(evals >= 2, "the job evaluated %.0f times: no periodic evaluation", evals);
    /* The servers send the evaluator the model of every evaluation themselves, the final one
     * too (once their last step is in), and write the final model into their parts of the final
     * checkpoint: the coordinator gathers no parameters at all, only each part's name and
     * checksum (a gather of no bytes from each server), and sends none. */
    ck_assert_msg(direct == evals,
                  "%.0f of %.0f evaluations went from the servers to the evaluator", direct, evals);
    for (int i = 0; i < n; i++) {
        const char *at = server_section(listing, i);
        double gathers = field(at, "gathers_total"), bytes = field(at, "gathered_bytes_total");
        ck_assert_msg(gathers == 1 && bytes == 0,
                      "shard server %d: %.0f gathers of %.0f bytes in all; 1 of none was "
                      "expected (the final model's part)",
                      i, gathers, bytes);
        /* Nor did the coordinator send any: each server made its range from the seed. */
        double sent = field(at, "range_bytes_sent_total");
        ck_assert_msg(sent == 0, "shard server %d: was sent %.0f bytes of its range", i, sent);
    }
}

/* The same job with its model on n shard servers; their logs are checked for their ranges, and
 * (where the job writes no checkpoints) what the coordinator gathered from them. */
double train_on_servers(int n, omv_checkpoint_t *ck, int checkpoints)
{
    pid_t d = start_coordinator("servers");
    pid_t s[MAX_PROCS];
    for (int i = 0; i < n; i++)
        s[i] = start_shard(i);
    pid_t w[3];
    w[2] = start_evaluator();
    w[0] = start_worker("trainer");
    w[1] = start_worker("trainer");
    double params[MAX_PROCS];
    server_ranges(n, params);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, n);
    double evals = field(omv_strbuf_str(&body), "evaluations_total");
    double direct = field(omv_strbuf_str(&body), "evaluations_direct_total");
    control("servers", &body);
    if (!checkpoints) /* a checkpoint's cut gathers too */
        check_gathers(omv_strbuf_str(&body), n, evals, direct);
    omv_strbuf_fini(&body);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char log[700], text[65536];
    for (int i = 0; i < n; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "from the coordinator: shards ["), "shard %d: %s", i, text);
        ck_assert_msg(has_text(text, "training finished"), "shard %d: %s", i, text);
        ck_assert_msg(!has_text(text, "no word from the coordinator"), "shard %d: %s", i, text);
    }
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(!has_text(text, "refused"), "the coordinator refused something: %s", text);
    if (!checkpoints) { /* the final checkpoint is the servers' parts, named by a manifest */
        char want[96];
        snprintf(want, sizeof(want), "checkpoint 1: %d parts, %d of them written by their servers",
                 n, n);
        ck_assert_msg(has_text(text, want), "no \"%s\" in: %s", want, text);
    }
    read_final("servers", ck);
    return acc;
}

/* Copies file src to dst. */
void copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    ck_assert_msg(in && out, "cannot copy %s to %s", src, dst);
    char buf[65536];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), in)) > 0;)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

/* The folder of the servers' run's checkpoints, made before its servers start. */
const char *servers_ckpt_dir(void)
{
    static char dir[800];
    const char *parts[] = {"servers", "servers/checkpoints", "servers/checkpoints/blobs"};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof(dir), "%s/%s", test_dir, parts[i]);
        mkdir(dir, 0755);
    }
    return dir;
}

/* Shard server i refused nothing (a backup's refusals, which it does not answer, too), and
 * the last part it held finished; with synchronous groups (exact), with the job's images: the
 * steps it applied since the last cut or assignment counted once. A backup a few steps behind
 * its primary when the job ends drops its part there (the job's model is its primaries'): with
 * may_stop, that passes too, short of the job's images and never past them, and the function
 * returns 0; else 1. */
int check_shard_counts_or_stop(int i, double images, int exact, int may_stop)
{
    char ctl[700];
    snprintf(ctl, sizeof(ctl), "%s/shard%d.ctl", test_dir, i);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    ck_assert_int_eq(omv_control_request(ctl, "status", &body, 5000), 0);
    ck_assert_msg(field(omv_strbuf_str(&body), "refused_total") == 0, "shard %d: %s", i,
                  omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    static char log_text[1 << 18];
    char log[700];
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
    read_file(log, log_text, sizeof(log_text));
    const char *at = NULL, *part = NULL, *stop = NULL;
    for (const char *p = log_text; (p = strstr(p, "training finished after")) != NULL; p++)
        at = p;
    for (const char *p = log_text; (p = strstr(p, "from the coordinator: shards")) != NULL; p++)
        part = p;
    for (const char *p = log_text; (p = strstr(p, "stopped at epoch ")) != NULL; p++)
        stop = p;
    if (may_stop && part && stop && stop > part && (at == NULL || at < part)) {
        double epochs = atof(stop + strlen("stopped at epoch "));
        ck_assert_msg(epochs * 4096 <= images, "shard %d: %.60s (the job: %.0f images)", i, stop,
                      images);
        return 0;
    }
    ck_assert_msg(at != NULL && (part == NULL || at > part), "shard %d finished no part", i);
    if (!exact)
        return 1; /* asynchronous groups: a server may end a step after the job's last */
    const char *n = strstr(at, " steps, ");
    ck_assert_msg(n && atof(n + 8) == images, "shard %d: %.60s (the job: %.0f images)", i, at,
                  images);
    return 1;
}

/* Attaches peer b (connected to a shard server) as worker id with token: Attach until the
 * server has been told of it (a join takes effect at a cut). */
void peer_attach(peer_t *b, uint32_t id, uint64_t token)
{
    for (int64_t until = omv_time_ms() + 20000;;) {
        omv_msg_t m = {.type = OMV_MSG_ATTACH};
        m.u.attach = (omv_attach_t){id, token};
        peer_send(b, &m, NULL, 0);
        if (peer_answers(b, 500)) {
            peer_recv(b, &m, NULL, 0);
            if (m.type == OMV_MSG_HEARTBEAT)
                return;
            ck_assert_msg(m.type == OMV_MSG_ERROR && m.u.error.code == OMV_REFUSE_UNKNOWN_WORKER,
                          "attach: %s", m.type == OMV_MSG_ERROR ? m.u.error.reason : "?");
        }
        ck_assert_msg(omv_time_ms() < until, "the shard server never took worker %u", id);
        sleep_ms(100);
    }
}
