/* Integration tests of a model spread over shard servers (omnivored --role shard): the
 * coordinator, the shard servers, trainers and an evaluator as real processes on ipc endpoints
 * in a temporary folder, training generated data. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cluster_util.h"
#include "control.h"
#include "peer_util.h"
#include "rng.h"
#include "safetensors.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

#define MAX_PROCS 8

static void read_file(const char *path, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* Shard server i: its own endpoint, control socket, folder and log. */
/* A shell line run before shard servers start, in a mount namespace of their own (as root:
 * a folder of the coordinator's that they do not share with it); NULL: none. */
static const char *shard_mounts;
static int shard_mounts_for; /* the one shard server it is for */
/* The one shard server (-1: none) whose config allows no checkpoint folder of the job's: it can
 * neither read a checkpoint nor write a part there. */
static int shard_confined = -1;

static pid_t start_shard(int i)
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
static void stop_shard(pid_t pid, int i, char *text, size_t cap)
{
    char log[700];
    kill(pid, SIGTERM);
    expect_exit_0(pid, "omnivored (shard server)");
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
    read_file(log, text, cap);
}

/* What the next coordinators' config file says (NULL: they have none). */
static const char *coordinator_conf;

/* The coordinator, with the job, its state in state (a folder of the test's) and its log. */
static pid_t start_coordinator(const char *state)
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

static void dump_logs(int n);

/* The newest finished checkpoint in state's checkpoint folder of the job. */
static void read_final(const char *state, omv_checkpoint_t *ck)
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

static void same_model(const omv_checkpoint_t *a, const omv_checkpoint_t *b)
{
    ck_assert_uint_eq(a->param_count, b->param_count);
    ck_assert_uint_eq(a->steps_total, b->steps_total);
    ck_assert_uint_eq(a->images_total, b->images_total);
    size_t bytes = a->param_count * sizeof(float);
    ck_assert_msg(memcmp(a->params, b->params, bytes) == 0, "the parameters differ");
    ck_assert_msg(memcmp(a->velocity, b->velocity, bytes) == 0, "the momentum differs");
}

/* The job as it is written, on one daemon: its final checkpoint in state "one". */
static double train_on_one(omv_checkpoint_t *ck)
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
static void dump_logs(int n)
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
static double wait_done_or_dump(omv_strbuf_t *body, int n)
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
static const char *server_section(const char *listing, int i)
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
static void check_gathers(const char *listing, int n, double evals, double direct)
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
static double train_on_servers(int n, omv_checkpoint_t *ck, int checkpoints)
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

START_TEST(test_servers_bit_identical)
{
    /* A synchronous group computes the same thing whoever holds the shards: with the model on
     * 2 shard servers the same seed gives the same parameters, momentum, steps and images, bit
     * for bit, and the same test accuracy, as with the daemon holding it. A model of conv,
     * batch norm (its running statistics ride in the last shard, which goes as bf16) and fc
     * layers in 4 shards, int8 gradients (error feedback) and int8 parameter changes on the wire:
     * every other test over servers runs bf16. */
    use_mixed_model();
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 4\nwire = int8");
    omv_checkpoint_t one, spread;
    double acc_one = train_on_one(&one);
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 4\nservers = 2\nwire = int8");
    double acc_spread = train_on_servers(2, &spread, 0);
    same_model(&one, &spread);
    ck_assert_msg(acc_one == acc_spread, "accuracy %f on one daemon, %f on servers", acc_one,
                  acc_spread);
    ck_assert_msg(acc_one > 0.9, "accuracy %f", acc_one);
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
}
END_TEST

START_TEST(test_servers_init_file)
{
    /* [model] init over servers: each server makes its range from the file itself, as the
     * coordinator made the model, so none of it is sent; and the job ends with the model one
     * daemon trains from the same file, bit for bit. */
    uint32_t widths[] = {64, 32, 4};
    omv_model_layout_t l;
    ck_assert_int_eq(omv_model_layout(&l, widths, 3), 0);
    float *w = malloc(l.param_count * sizeof(float));
    ck_assert_ptr_nonnull(w);
    omv_rng_t rng;
    omv_rng_init(&rng, 99);
    for (size_t i = 0; i < l.param_count; i++)
        w[i] = 0.3f * ((float)omv_rng_uniform(&rng) - 0.5f);
    static char section[900];
    char path[800], err[OMV_SAFETENSORS_ERR_MAX];
    snprintf(path, sizeof(path), "%s/start.safetensors", test_dir);
    ck_assert_msg(omv_safetensors_write(path, &l, w, NULL, NULL, 0, 0, err) == 0, "%s", err);
    free(w);
    snprintf(section, sizeof(section), "layers = 64 32 4\ninit = %s", path);
    model_section = section;
    const char *sync = "groups = 1\nstaleness = none\nshards = 4";
    char cluster[256];
    write_job(2, 2, sync);
    omv_checkpoint_t one, spread;
    train_on_one(&one);
    snprintf(cluster, sizeof(cluster), "%s\nservers = 2", sync);
    write_job(2, 2, cluster);
    train_on_servers(2, &spread, 0); /* no range sent either (check_gathers) */
    same_model(&one, &spread);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/shard%d.log", test_dir, i);
        read_file(path, text, sizeof(text));
        ck_assert_msg(has_text(text, ") made from [model] init here"), "shard %d: %s", i, text);
    }
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
}
END_TEST

/* Copies file src to dst. */
static void copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    ck_assert_msg(in && out, "cannot copy %s to %s", src, dst);
    char buf[65536];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), in)) > 0;)
        ck_assert_uint_eq(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Copies checkpoint seq of the servers' run (its manifest and its 2 parts) into folder to;
 * part_copy[cap] gets the path of the copy of part k (0 or 1, in shard order). */
static void copy_manifest(int seq, const char *to, int k, char *part_copy, size_t cap)
{
    char from[900], a[1400], b[1400], prefix[64], names[2][256];
    snprintf(from, sizeof(from), "%s/servers/checkpoints/blobs", test_dir);
    snprintf(a, sizeof(a), "%s/checkpoint-%08d.omv", from, seq);
    snprintf(b, sizeof(b), "%s/checkpoint-%08d.omv", to, seq);
    copy_file(a, b);
    snprintf(prefix, sizeof(prefix), "checkpoint-%08d.shards-", seq);
    int n = 0;
    DIR *d = opendir(from);
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && n < 2)
            omv_strlcpy(names[n++], e->d_name, sizeof(names[0]));
    closedir(d);
    ck_assert_msg(n == 2, "checkpoint %d has %d parts in %s", seq, n, from);
    qsort(names, 2, sizeof(names[0]), cmp_name); /* "shards-0-" first */
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof(a), "%s/%s", from, names[i]);
        snprintf(b, sizeof(b), "%s/%s", to, names[i]);
        copy_file(a, b);
        if (i == k)
            omv_strlcpy(part_copy, b, cap);
    }
}

/* Flips a byte in the middle of file path. */
static void flip_middle(const char *path)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long at = ftell(f) / 2;
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

START_TEST(test_servers_checkpoint_is_a_cut)
{
    /* Checkpoints while training on 2 servers are consistent cuts: every range at the same
     * step, with the clocks and counters of that step. Each server writes its range as a part
     * and the coordinator a manifest of them. The job trains to the same model as on one
     * daemon with them (a cut holds steps back, it changes nothing), and one daemon that
     * resumes from the first of them ends with that model too, bit for bit: a checkpoint whose
     * ranges were a step apart would not. The second is there too, with a part damaged: the
     * resume names the part, leaves that manifest, and takes the first. */
    model_section = "layers = 64 32 4";
    const char *sync = "groups = 1\nstaleness = none\nshards = 4\nwire = fp32";
    char cluster[256];
    write_job(2, 3, sync);
    /* The evaluations are counted: the evaluator runs at the trainers' priority. At its nice 19
     * on a 2-core machine the trainers keep busy, one can wait for the CPU past the next one's
     * epoch, and the two become one (as they should: it takes only what training leaves). */
    setenv("OMNIVORE_NICE", "0", 1);
    omv_checkpoint_t one, spread, resumed;
    train_on_one(&one);
    snprintf(cluster, sizeof(cluster), "%s\nservers = 2\n[checkpoint]\nevery_steps = 64\nkeep = 20",
             sync);
    write_job(2, 3, cluster);
    train_on_servers(2, &spread, 1);
    same_model(&one, &spread);
    /* Checkpoints every 64 steps fall on the evaluations (every epoch: 128 steps): the cut
     * waits for none of them and drops none. */
    ck_assert_msg(spread.n_history == one.n_history && one.n_history == 3,
                  "%u evaluations over servers, %u on one daemon", spread.n_history, one.n_history);
    /* The first checkpoint, written while training, resumed by one daemon. */
    char first[900], dir[900], to[1000];
    snprintf(first, sizeof(first), "%s/servers/checkpoints/blobs/checkpoint-00000001.omv",
             test_dir);
    omv_checkpoint_t mid;
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_msg(omv_checkpoint_read(&mid, first, err) == 0, "%s", err);
    ck_assert_msg(!mid.finished && mid.steps_total >= 64 && mid.steps_total < spread.steps_total,
                  "the first checkpoint is at step %llu of %llu",
                  (unsigned long long)mid.steps_total, (unsigned long long)spread.steps_total);
    ck_assert_uint_eq(mid.n_groups, 1);
    ck_assert(mid.clocks[0] == mid.steps_total);
    ck_assert(mid.images_total == mid.steps_total * 32);
    ck_assert_msg(mid.n_parts == 2, "checkpoint 1 has %u parts", mid.n_parts);
    omv_checkpoint_fini(&mid);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        snprintf(to, sizeof(to), "%s/shard%d.log", test_dir, i);
        read_file(to, text, sizeof(text));
        ck_assert_msg(has_text(text, "checkpoint 1: shards [") && has_text(text, "as a part"),
                      "shard %d wrote no part of checkpoint 1: %s", i, text);
    }
    const char *parts[] = {"resume", "resume/checkpoints", "resume/checkpoints/blobs"};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof(dir), "%s/%s", test_dir, parts[i]);
        ck_assert_int_eq(mkdir(dir, 0755), 0);
    }
    char damaged[1100];
    copy_manifest(1, dir, 0, damaged, sizeof(damaged));
    copy_manifest(2, dir, 1, damaged, sizeof(damaged));
    flip_middle(damaged);
    write_job(2, 3, sync);
    pid_t d = start_coordinator("resume");
    setenv("OMNIVORE_SHM", "0", 1);
    pid_t w[2] = {start_worker("trainer"), start_worker("trainer")};
    unsetenv("OMNIVORE_SHM");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 120000;
    char state[32] = "";
    while (strcmp(state, "done") != 0) {
        ck_assert_msg(omv_time_ms() < deadline && strcmp(state, "failed") != 0, "resume: %s",
                      omv_strbuf_str(&body));
        sleep_ms(50);
        control("status", &body);
        text_field(omv_strbuf_str(&body), "state", state, sizeof(state));
    }
    omv_strbuf_fini(&body);
    stop_workers(w, 2);
    shutdown_daemon(d);
    snprintf(to, sizeof(to), "%s/coordinator.log", test_dir);
    read_file(to, text, sizeof(text));
    ck_assert_msg(has_text(text, "checkpoint-00000002.omv: the manifest is incomplete: its part "
                                 "2 of 2 (shards [") &&
                      has_text(text, damaged) && has_text(text, "checksum mismatch"),
                  "the damaged part is not named: %s", text);
    char from[1200];
    snprintf(from, sizeof(from), "resumed from %s/checkpoint-00000001.omv:", dir);
    ck_assert_msg(has_text(text, from), "not '%s': %s", from, text);
    read_final("resume", &resumed);
    same_model(&one, &resumed);
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
    omv_checkpoint_fini(&resumed);
    unsetenv("OMNIVORE_NICE");
}
END_TEST

/* The folder of the servers' run's checkpoints, made before its servers start. */
static const char *servers_ckpt_dir(void)
{
    static char dir[800];
    const char *parts[] = {"servers", "servers/checkpoints", "servers/checkpoints/blobs"};
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof(dir), "%s/%s", test_dir, parts[i]);
        mkdir(dir, 0755);
    }
    return dir;
}

START_TEST(test_servers_parts_not_shared)
{
    /* A checkpoint's parts where the folder is not what it should be (as root: each shard
     * server in a mount namespace of its own). A server that cannot write its part sends its
     * range, and the coordinator writes that part itself: the manifest is whole. A server
     * that writes its part where the coordinator cannot see it (a folder that is not shared
     * storage) fails that checkpoint with the reason, and from then on the coordinator takes
     * every range and writes whole checkpoints: the job still ends with one daemon's model. */
    if (geteuid() != 0 || system("unshare -m true 2>/dev/null") != 0) {
        fprintf(stderr, "test_servers_parts_not_shared: skipped (needs root and unshare -m)\n");
        return;
    }
    model_section = "layers = 64 32 4";
    const char *sync = "groups = 1\nstaleness = none\nshards = 4\nwire = fp32";
    char cluster[256], line[1200], text[65536], path[1200];
    write_job(2, 2, sync);
    omv_checkpoint_t one, spread, ck;
    train_on_one(&one);
    snprintf(cluster, sizeof(cluster), "%s\nservers = 2\n[checkpoint]\nevery_steps = 40\nkeep = 20",
             sync);
    write_job(2, 2, cluster);
    /* Read-only for the first server: it sends its range, and the coordinator writes that
     * part. */
    snprintf(line, sizeof(line), "mount --bind -o ro '%s' '%s'", servers_ckpt_dir(),
             servers_ckpt_dir());
    shard_mounts = line;
    shard_mounts_for = 0;
    train_on_servers(2, &spread, 1);
    same_model(&one, &spread);
    omv_checkpoint_fini(&spread);
    snprintf(path, sizeof(path), "%s/checkpoint-00000001.omv", servers_ckpt_dir());
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_msg(omv_checkpoint_read(&ck, path, err) == 0, "%s", err);
    ck_assert_uint_eq(ck.n_parts, 2);
    omv_checkpoint_fini(&ck);
    snprintf(path, sizeof(path), "%s/shard0.log", test_dir);
    read_file(path, text, sizeof(text));
    ck_assert_msg(has_text(text, "the range goes to the coordinator instead"), "%s", text);
    snprintf(path, sizeof(path), "%s/coordinator.log", test_dir);
    read_file(path, text, sizeof(text));
    ck_assert_msg(has_text(text, "checkpoint 1: 2 parts, 1 of them written by their servers"), "%s",
                  text);
    /* A folder of its own for the second server: the first checkpoint fails, the rest are
     * whole. */
    char rm[1000];
    snprintf(rm, sizeof(rm), "rm -rf '%s/servers' '%s/coordinator.log'", test_dir, test_dir);
    ck_assert_int_eq(system(rm), 0);
    snprintf(line, sizeof(line), "mount -t tmpfs none '%s'", servers_ckpt_dir());
    shard_mounts_for = 1;
    train_on_servers(2, &spread, 1);
    shard_mounts = NULL;
    same_model(&one, &spread);
    read_file(path, text, sizeof(text));
    ck_assert_msg(has_text(text, "which the coordinator cannot see: the checkpoint folder is not "
                                 "storage the coordinator and the servers share") &&
                      has_text(text, "from now on the servers send their ranges"),
                  "%s", text);
    /* The part the second server wrote on its own storage, which no checkpoint names, is
     * removed at the coordinator's word; the first server's, in the shared folder, is not. */
    snprintf(path, sizeof(path), "%s/shard1.log", test_dir);
    read_file(path, text, sizeof(text));
    ck_assert_msg(has_text(text, "checkpoint 1's part of shards [") &&
                      has_text(text, "the coordinator cannot see this folder"),
                  "%s", text);
    snprintf(path, sizeof(path), "%s/shard0.log", test_dir);
    read_file(path, text, sizeof(text));
    ck_assert_msg(!has_text(text, "the coordinator cannot see this folder"), "%s", text);
    snprintf(path, sizeof(path), "%s/checkpoint-00000002.omv", servers_ckpt_dir());
    ck_assert_msg(omv_checkpoint_read(&ck, path, err) == 0, "%s", err);
    ck_assert_uint_eq(ck.n_parts, 0);
    ck_assert(!ck.finished);
    omv_checkpoint_fini(&ck);
    omv_checkpoint_fini(&spread);
    /* No checkpoint while training: the final model's parts are the first, and the second
     * server's is where the coordinator cannot see it. The coordinator finds so as they come,
     * takes the ranges instead and writes the final checkpoint whole. */
    ck_assert_int_eq(system(rm), 0);
    snprintf(cluster, sizeof(cluster), "%s\nservers = 2", sync);
    write_job(2, 2, cluster);
    shard_mounts = line;
    train_on_servers(2, &spread, 1);
    shard_mounts = NULL;
    same_model(&one, &spread);
    snprintf(path, sizeof(path), "%s/coordinator.log", test_dir);
    read_file(path, text, sizeof(text));
    ck_assert_msg(has_text(text, "which the coordinator cannot see") &&
                      has_text(text, "from now on the servers send their ranges"),
                  "%s", text);
    snprintf(path, sizeof(path), "%s/checkpoint-00000001.omv", servers_ckpt_dir());
    ck_assert_msg(omv_checkpoint_read(&ck, path, err) == 0, "%s", err);
    ck_assert_uint_eq(ck.n_parts, 0);
    ck_assert(ck.finished);
    omv_checkpoint_fini(&ck);
    omv_checkpoint_fini(&spread);
    omv_checkpoint_fini(&one);
}
END_TEST

START_TEST(test_servers_three_fp32)
{
    /* An MLP over 3 servers (fp32), against one daemon: the same, bit for bit. */
    model_section = "layers = 64 32 4";
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 3\nwire = fp32");
    omv_checkpoint_t one, spread;
    train_on_one(&one);
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 3\nwire = fp32\nservers = 3");
    train_on_servers(3, &spread, 0);
    same_model(&one, &spread);
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
}
END_TEST

START_TEST(test_servers_async_groups)
{
    /* Two asynchronous groups over 2 servers: each server bounds its own clocks, so the job
     * trains to the same accuracy as on one daemon, and counts exactly its images. */
    model_section = "layers = 64 32 4";
    write_job(2, 4, "groups = 2\nstaleness = 1\nservers = 2");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, 2);
    double images = field(omv_strbuf_str(&body), "images_total");
    omv_strbuf_fini(&body);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    ck_assert_msg(images >= 4 * 4096 && images <= 4 * 4096 + 2 * 32, "images %f", images);
    stop_workers(w, 3);
    shutdown_daemon(d);
    for (int i = 0; i < 2; i++) {
        kill(s[i], SIGTERM);
        expect_exit_0(s[i], "omnivored (shard server)");
    }
}
END_TEST

/* omnivorectl keygen [--roles ROLES] NAME DIR. */
static void keygen(const char *roles, const char *name, const char *dir)
{
    char cmd[1200], out[4096];
    snprintf(cmd, sizeof(cmd), "keygen %s%s %s %s", roles ? "--roles " : "", roles ? roles : "",
             name, dir);
    ck_assert_msg(run_omnivorectl(out, sizeof(out), NULL, cmd) == 0, "%s", out);
}

START_TEST(test_servers_over_curve)
{
    /* Over tcp with CURVE everywhere: the coordinator admits the shard servers by their keys
     * (role shard) and the workers by theirs; each shard server admits the workers by its own
     * allow-list, takes the attach only from the key the worker registered with, and is
     * reached with the public key the coordinator passed on. */
    char keys[700], allow[700], conf[3][800], ep[3][64], cmd[1200];
    snprintf(keys, sizeof(keys), "%s/keys", test_dir);
    snprintf(allow, sizeof(allow), "%s/allow", test_dir);
    ck_assert_int_eq(mkdir(keys, 0700), 0);
    ck_assert_int_eq(mkdir(allow, 0700), 0);
    keygen(NULL, "daemon", keys);
    keygen("trainer", "t1", keys);
    keygen("trainer", "t2", keys);
    keygen("evaluator", "ev", keys);
    keygen("shard", "s0", keys);
    keygen("shard", "s1", keys);
    const char *admitted[] = {"t1", "t2", "ev", "s0", "s1"};
    for (int i = 0; i < 5; i++) {
        char a[1000], b[1000];
        snprintf(a, sizeof(a), "%s/%s.key", keys, admitted[i]);
        snprintf(b, sizeof(b), "%s/%s.key", allow, admitted[i]);
        copy_file(a, b);
    }
    int port = 20000 + (int)(getpid() % 20000);
    for (int i = 0; i < 3; i++)
        snprintf(ep[i], sizeof(ep[i]), "tcp://127.0.0.1:%d", port + i);
    /* conf[0] the coordinator's; conf[1], conf[2] the servers'. */
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "%s/omnivored-%d.conf", test_dir, i);
        omv_strlcpy(conf[i], cmd, sizeof(conf[i]));
        FILE *f = fopen(conf[i], "w");
        ck_assert_ptr_nonnull(f);
        if (i == 0)
            fprintf(f,
                    "[security]\ncurve = yes\nsecret_key = %s/daemon.key_secret\n"
                    "allow_dir = %s\n",
                    keys, allow);
        else
            fprintf(f,
                    "[daemon]\nrole = shard\ncoordinator = %s\n[security]\ncurve = yes\n"
                    "secret_key = %s/s%d.key_secret\nallow_dir = %s\n"
                    "coordinator_key = %s/daemon.key\n",
                    ep[0], keys, i - 1, allow, keys);
        fclose(f);
    }
    model_section = "layers = 64 32 4";
    write_job(2, 3, "groups = 1\nstaleness = none\nservers = 2");
    omv_strlcpy(endpoint, ep[0], sizeof(endpoint));
    char dir[800], log[800];
    snprintf(dir, sizeof(dir), "%s/coord", test_dir);
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    char *cargv[] = {(char *)bin("OMNIVORED"),
                     "--once",
                     "--job",
                     job_path,
                     "--config",
                     conf[0],
                     "--endpoint",
                     endpoint,
                     "--control",
                     sock_path,
                     "--state-dir",
                     dir,
                     NULL};
    pid_t d = spawn_logged(cargv, log);
    pid_t s[2];
    for (int i = 0; i < 2; i++) {
        char ctl[800], sdir[800];
        snprintf(ctl, sizeof(ctl), "%s/shard%d.ctl", test_dir, i);
        snprintf(sdir, sizeof(sdir), "%s/shard%d", test_dir, i);
        snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
        char *sargv[] = {(char *)bin("OMNIVORED"),
                         "--config",
                         conf[1 + i],
                         "--endpoint",
                         ep[1 + i],
                         "--control",
                         ctl,
                         "--state-dir",
                         sdir,
                         NULL};
        s[i] = spawn_logged(sargv, log);
    }
    pid_t w[3];
    const char *who[3] = {"t1", "t2", "ev"};
    for (int i = 0; i < 3; i++) {
        char key[800], server_key[800];
        snprintf(key, sizeof(key), "%s/%s.key_secret", keys, who[i]);
        snprintf(server_key, sizeof(server_key), "%s/daemon.key", keys);
        snprintf(log, sizeof(log), "%s/worker%d.log", test_dir, i);
        char *wargv[] = {(char *)bin("OMNIVORE_WORKER"),
                         "--server",
                         endpoint,
                         "--role",
                         i == 2 ? "evaluator" : "trainer",
                         "--key",
                         key,
                         "--server-key",
                         server_key,
                         NULL};
        w[i] = spawn_logged(wargv, log);
    }
    int64_t deadline = omv_time_ms() + 20000;
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    while (omv_control_request(sock_path, "status", &body, 1000) != 0) {
        ck_assert_msg(omv_time_ms() < deadline, "the coordinator did not answer");
        sleep_ms(20);
    }
    double acc = wait_done_or_dump(&body, 2);
    omv_strbuf_fini(&body);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "(CURVE)") && has_text(text, "training finished"), "%s", text);
    }
}
END_TEST

START_TEST(test_servers_trainer_dies)
{
    /* A trainer killed mid-run: the coordinator declares it dead and tells the servers, whose
     * groups stop waiting for it and whose slices go to the one left; a new trainer joins the
     * running job at a cut (every server takes it at the same step); the job ends done, with
     * every image of its epochs counted. */
    model_section = "layers = 64 32 4";
    write_job(2, 30, "groups = 1\nstaleness = none\nservers = 2");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    wait_status("steps_total", 100, 60000);
    kill(w[1], SIGKILL);
    waitpid(w[1], NULL, 0);
    /* Its replacement joins the running job: at the next cut, on every server at once. */
    wait_status("deaths_total", 1, 20000);
    pid_t again = start_worker("trainer");
    wait_status("joins_total", 3, 20000);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, 2);
    double images = field(omv_strbuf_str(&body), "images_total");
    ck_assert_msg(field(omv_strbuf_str(&body), "deaths_total") == 1, "%s", omv_strbuf_str(&body));
    ck_assert_msg(field(omv_strbuf_str(&body), "workers_alive") == 2, "%s", omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    ck_assert_msg(images >= 30 * 4096 && images <= 30 * 4096 + 32, "images %f", images);
    pid_t left[3] = {w[0], w[2], again};
    stop_workers(left, 3);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "died") && has_text(text, "training finished"), "%s", text);
        ck_assert_msg(has_text(text, "worker 4 ("), "the newcomer: %s", text);
    }
}
END_TEST

START_TEST(test_coordinator_restart_resumes)
{
    /* The coordinator stops mid-run (SIGTERM): its last checkpoint is a cut, its servers drop
     * their parts and its workers wait. Started again, it resumes that checkpoint, assigns the
     * parts anew to the servers that register again, takes the workers back, and the job ends
     * done with every image of its epochs counted once. */
    model_section = "layers = 64 32 4";
    write_job(2, 60, "groups = 1\nstaleness = none\nservers = 2\n[checkpoint]\nevery_steps = 200");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[2] = {start_worker("trainer"), start_worker("trainer")};
    wait_status("steps_total", 500, 60000);
    kill(d, SIGTERM);
    expect_exit_0(d, "omnivored (coordinator, stopped)");
    d = start_coordinator("servers");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done_or_dump(&body, 2);
    double images = field(omv_strbuf_str(&body), "images_total");
    char resumed[512] = "";
    text_field(omv_strbuf_str(&body), "resumed_from", resumed, sizeof(resumed));
    omv_strbuf_fini(&body);
    ck_assert_msg(resumed[0] != '\0', "the job did not resume a checkpoint");
    ck_assert_msg(images >= 60 * 4096 && images <= 60 * 4096 + 32, "images %f", images);
    stop_workers(w, 2);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "the coordinator stops") &&
                          has_text(text, "training finished"),
                      "shard %d: %s", i, text);
    }
}
END_TEST

/* Waits up to 30 s for the job to be in state; returns its status in body. */
static void wait_state(const char *want, omv_strbuf_t *body)
{
    int64_t deadline = omv_time_ms() + 30000;
    char state[32] = "";
    while (strcmp(state, want) != 0) {
        if (omv_time_ms() > deadline) {
            dump_logs(2);
            ck_abort_msg("the job is not %s: %s", want, omv_strbuf_str(body));
        }
        sleep_ms(100);
        if (omv_control_request(sock_path, "status", body, 2000) == 0)
            text_field(omv_strbuf_str(body), "state", state, sizeof(state));
    }
}

START_TEST(test_server_lost_fails_job)
{
    /* With no replica and no checkpoint to go back to, a shard server that goes silent mid-run
     * ends the job, failed, with a reason that names the server, its shards and why nothing
     * can be saved; the coordinator stays up to say so. */
    model_section = "layers = 64 32 4";
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    write_job(2, 200, "groups = 1\nstaleness = none\nservers = 2\n[checkpoint]\nevery_s = 0");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[2] = {start_worker("trainer"), start_worker("trainer")};
    wait_status("steps_total", 50, 60000);
    /* `omnivorectl servers`: both primaries, their shards in order, their traffic (each says
     * every second). */
    omv_strbuf_t srv;
    omv_strbuf_init(&srv);
    int64_t until = omv_time_ms() + 10000; /* rates need two reports */
    do {
        sleep_ms(200);
        control("servers", &srv);
    } while (!(field(omv_strbuf_str(&srv), "applies_per_second") > 0) && omv_time_ms() < until);
    const char *t = omv_strbuf_str(&srv);
    const char *two = strstr(t, "# server 2");
    ck_assert_msg(two != NULL && has_text(t, "# server 1\n"), "%s", t);
    ck_assert_msg(field(t, "first_shard") == 0 &&
                      field(two, "first_shard") == field(t, "last_shard"),
                  "%s", t);
    ck_assert_msg(field(two, "last_shard") == 2, "%s", t);
    ck_assert_msg(field(t, "bytes_in_total") > 0 && field(two, "bytes_out_total") > 0, "%s", t);
    ck_assert_msg(field(t, "applies_per_second") > 0 && field(t, "steps_applied") >= 50, "%s", t);
    ck_assert_msg(has_text(t, "\nrole:primary\n") && has_text(two, "\nstate:alive\n"), "%s", t);
    omv_strbuf_fini(&srv);
    kill(s[1], SIGKILL);
    waitpid(s[1], NULL, 0);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_state("failed", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "shard1.sock") &&
                      has_text(omv_strbuf_str(&body), "no replica") &&
                      has_text(omv_strbuf_str(&body), "no checkpoint to go back to"),
                  "reason: %s", omv_strbuf_str(&body));
    omv_strbuf_fini(&body);
    stop_workers(w, 2);
    shutdown_daemon(d);
    char text[65536];
    stop_shard(s[0], 0, text, sizeof(text));
    ck_assert_msg(!has_text(text, "no word from the coordinator"), "%s", text);
    coordinator_conf = NULL;
}
END_TEST

/* The images of the checkpoint the coordinator's log last says it resumed. */
static double resumed_images(void)
{
    static char text[1 << 18];
    char log[700];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    const char *at = NULL;
    for (const char *p = text; (p = strstr(p, "resumed from ")) != NULL; p++)
        at = p;
    ck_assert_msg(at != NULL, "the coordinator resumed nothing: %s", text);
    const char *n = strstr(at, " images");
    ck_assert_ptr_nonnull(n);
    while (n > at && n[-1] != ' ')
        n--;
    return atof(n);
}

START_TEST(test_server_lost_goes_back)
{
    /* Replication off: a shard server SIGKILLed mid-run and started again (as systemd's
     * Restart= would) registers as a new process. The coordinator takes the part it held for
     * lost, sends its workers and the other server back to the job's last checkpoint (a cut),
     * and goes on once it has two servers again. The job ends done, at most one checkpoint
     * interval of steps is trained again, and every image of its epochs is counted once.
     * No parameters pass the coordinator on the way: each server makes its range from the
     * checkpoint's parts itself, except the one started again where its config allows no
     * checkpoint folder of the job's, which asks for its range and gets it. */
    model_section = "layers = 64 32 4";
    write_job(2, 30, "groups = 1\nstaleness = none\nservers = 2\n[checkpoint]\nevery_steps = 100");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    double at_kill = wait_status("images_total", 250 * 32, 60000);
    kill(s[1], SIGKILL);
    waitpid(s[1], NULL, 0);
    shard_confined = 1;
    s[1] = start_shard(1);
    shard_confined = -1;
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, 2);
    double images = field(omv_strbuf_str(&body), "images_total");
    control("servers", &body);
    double sent[2];
    for (int i = 0; i < 2; i++)
        sent[i] = field(server_section(omv_strbuf_str(&body), i), "range_bytes_sent_total");
    /* 64x32 + 32 + 32x4 + 4 parameters and their momentum, 4 bytes each, over 2 servers. */
    ck_assert_msg(sent[0] == 0 && sent[1] > 0 && sent[1] < 2 * 2212 * 4,
                  "the coordinator sent ranges of %.0f and %.0f bytes", sent[0], sent[1]);
    omv_strbuf_fini(&body);
    double back_to = resumed_images();
    ck_assert_msg(back_to >= 100 * 32 && at_kill - back_to <= 100 * 32 + 2 * 32,
                  "killed at %.0f images, went back to %.0f", at_kill, back_to);
    ck_assert_msg(images >= 30 * 4096 && images <= 30 * 4096 + 32, "images %f", images);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char log[700], text[65536];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(has_text(text, "registers again as pid") &&
                      has_text(text, "goes back to its last checkpoint") &&
                      has_text(text, "could not make shards ["),
                  "%s", text);
    for (int i = 0; i < 2; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "training finished"), "shard %d: %s", i, text);
        ck_assert_msg(has_text(text, ") made from the seed here"), "shard %d: %s", i, text);
        ck_assert_msg(i == 1 || has_text(text, ") made from the checkpoint here"), "shard %d: %s",
                      i, text);
        ck_assert_msg(i == 0 || (has_text(text, "asking the coordinator for them") &&
                                 has_text(text, ") came from the coordinator")),
                      "shard %d: %s", i, text);
    }
}
END_TEST

/* Counts the lines of shard server i's log that hold text. */
static int shard_log_count(int i, const char *text)
{
    static char log_text[1 << 18];
    char log[700];
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, i);
    read_file(log, log_text, sizeof(log_text));
    int n = 0;
    for (const char *p = log_text; (p = strstr(p, text)) != NULL; p++)
        n++;
    return n;
}

/* Shard server i refused nothing (a backup's refusals, which it does not answer, too), and
 * the last part it held finished; with synchronous groups (exact), with the job's images: the
 * steps it applied since the last cut or assignment counted once. A backup a few steps behind
 * its primary when the job ends drops its part there (the job's model is its primaries'): with
 * may_stop, that passes too, short of the job's images and never past them, and the function
 * returns 0; else 1. */
static int check_shard_counts_or_stop(int i, double images, int exact, int may_stop)
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

static void check_shard_counts(int i, double images, int exact)
{
    check_shard_counts_or_stop(i, images, exact, 0);
}

START_TEST(test_servers_end_during_cut)
{
    /* A checkpoint at every step: the job's end lands while a cut is under way. The coordinator
     * then lets the servers go on from it without the cut's counters, and each ends its part
     * once its own last step is in. It told them to resume from the cut's counters of none (0
     * images, 0 steps): a server not yet at its last step trained on and never counted its
     * images to the end, and the job hung finishing, waiting for its final range. */
    model_section = "layers = 64 32 4";
    write_job(2, 4,
              "groups = 1\nstaleness = none\nservers = 2\n[checkpoint]\nevery_steps = 1\n"
              "keep = 2");
    for (int round = 0; round < 3; round++) {
        char dir[700];
        snprintf(dir, sizeof(dir), "%s/servers", test_dir);
        omv_test_rmdir(dir); /* each round a job of its own, from scratch */
        pid_t d = start_coordinator("servers");
        pid_t s[2] = {start_shard(0), start_shard(1)};
        pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
        omv_strbuf_t body;
        omv_strbuf_init(&body);
        wait_done_or_dump(&body, 2);
        double images = field(omv_strbuf_str(&body), "images_total");
        omv_strbuf_fini(&body);
        ck_assert_msg(images >= 4 * 4096 && images <= 4 * 4096 + 32, "images %f", images);
        stop_workers(w, 3);
        shutdown_daemon(d);
        char text[65536];
        for (int i = 0; i < 2; i++) {
            stop_shard(s[i], i, text, sizeof(text));
            ck_assert_msg(shard_log_count(i, "training finished after") == round + 1,
                          "round %d, shard %d: %s", round, i, text);
        }
    }
}
END_TEST

START_TEST(test_servers_regroup)
{
    /* `omnivorectl regroup 2` on a job over 2 shard servers: the change is made at a cut, on
     * the coordinator and on both servers at the same step, and the job ends done with two
     * groups, every image counted once and nothing refused anywhere. */
    model_section = "layers = 64 32 4";
    write_job(2, 40, "groups = 1\nstaleness = 2\nservers = 2");
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    wait_status("steps_total", 200, 60000);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("regroup 2", &body);
    wait_status("regroups_total", 1, 20000);
    double acc = wait_done_or_dump(&body, 2);
    const char *t = omv_strbuf_str(&body);
    double images = field(t, "images_total");
    ck_assert_msg(field(t, "groups_now") == 2, "%s", t);
    ck_assert_msg(images >= 40 * 4096 && images <= 40 * 4096 + 32, "images %f", images);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    omv_strbuf_fini(&body);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(shard_log_count(i, "regrouped: 2 groups, from step") == 1, "shard %d", i);
        check_shard_counts(i, images, 0);
    }
    stop_workers(w, 3);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++)
        stop_shard(s[i], i, text, sizeof(text));
}
END_TEST

START_TEST(test_servers_optimizer)
{
    /* The optimizer on a job over 2 shard servers: it probes, chooses and runs phases; each
     * change (groups, momentum, learning rate, the probe base saved and put back) is made at a
     * cut on every server. The job ends done with every image counted once, and each server
     * made as many regroups as the coordinator. */
    model_section = "layers = 64 32 4";
    write_job(4, 40, "groups = 1\nservers = 2");
    FILE *f = fopen(job_path, "a");
    ck_assert_ptr_nonnull(f);
    fputs("[optimizer]\nenabled = yes\nphase_steps = 160\nprobe_steps = 6\n", f);
    fclose(f);
    pid_t d = start_coordinator("servers");
    pid_t s[2] = {start_shard(0), start_shard(1)};
    pid_t w[5];
    for (int i = 0; i < 4; i++)
        w[i] = start_worker_slow("trainer", "0-2");
    w[4] = start_worker("evaluator");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, 2);
    const char *t = omv_strbuf_str(&body);
    double images = field(t, "images_total"), regroups = field(t, "regroups_total");
    ck_assert_msg(images >= 40 * 4096 && images <= 40 * 4096 + 32, "images %f", images);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    ck_assert_msg(regroups >= 2, "%s", t);
    static char json[1 << 20];
    control("summary --json", &body);
    omv_strlcpy(json, omv_strbuf_str(&body), sizeof(json));
    ck_assert_msg(has_text(json, "\"event\":\"probe\"") && has_text(json, "\"event\":\"choose\""),
                  "%s", json);
    omv_strbuf_fini(&body);
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(shard_log_count(i, "regrouped: ") == (int)regroups, "shard %d: %d of %.0f", i,
                      shard_log_count(i, "regrouped: "), regroups);
        ck_assert_msg(shard_log_count(i, "(the coordinator's)") > 0, "shard %d", i);
        check_shard_counts(i, images, 0);
    }
    stop_workers(w, 5);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++)
        stop_shard(s[i], i, text, sizeof(text));
}
END_TEST

/* The shard server (0 to n - 1) that `omnivorectl servers` says holds role for the range that
 * starts at shard first, or -1. */
static int holder_of(const char *role, int first, int n)
{
    omv_strbuf_t srv;
    omv_strbuf_init(&srv);
    control("servers", &srv);
    char want[32];
    snprintf(want, sizeof(want), "\nrole:%s\n", role);
    int found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        char sock[32];
        snprintf(sock, sizeof(sock), "/shard%d.sock\n", i);
        const char *at = strstr(omv_strbuf_str(&srv), sock);
        const char *next = at ? strstr(at, "# server") : NULL;
        const char *r = at ? strstr(at, want) : NULL;
        const char *shard = at ? strstr(at, "\nfirst_shard:") : NULL;
        if (r && (next == NULL || r < next) && shard && atoi(shard + 13) == first)
            found = i;
    }
    omv_strbuf_fini(&srv);
    return found;
}

/* SIGKILLs the shard server (of 4, s) that holds role for the range that starts at shard first;
 * returns which it was. */
static int kill_holder(const char *role, int first, pid_t s[4])
{
    int victim = holder_of(role, first, 4);
    ck_assert_msg(victim >= 0, "no %s of shard %d", role, first);
    kill(s[victim], SIGKILL);
    waitpid(s[victim], NULL, 0);
    return victim;
}

/* A job of epochs over 2 ranges x 2 copies (no periodic checkpoints): the coordinator (*d),
 * 4 shard servers (s) and 2 trainers and an evaluator (w). */
static void start_replicated(int epochs, pid_t *d, pid_t s[4], pid_t w[3])
{
    write_job(2, epochs,
              "groups = 1\nstaleness = none\nservers = 2\nreplicas = 2\n"
              "[checkpoint]\nevery_s = 0");
    *d = start_coordinator("servers");
    for (int i = 0; i < 4; i++)
        s[i] = start_shard(i);
    w[0] = start_worker("trainer");
    w[1] = start_worker("trainer");
    w[2] = start_worker("evaluator");
}

START_TEST(test_servers_failover)
{
    /* [cluster] replicas = 2: each of the 2 ranges has a backup on another shard server, which
     * the workers push to as well. The primary of the second range is SIGKILLed mid-run. The
     * coordinator cuts the ranges' holders (the other primary, and the dead one's backup) at
     * the steps every worker reported, writes that cut as a checkpoint, and makes the run
     * again from it over the 3 servers left; nothing is trained twice or lost. A replacement
     * server that registers then (and stays up 2 s) is made the backup of the range that lost
     * its own, at another cut. The job, which writes no periodic checkpoints, ends with the model
     * one daemon gives without any failure, bit for bit. */
    model_section = "layers = 64 32 4";
    write_job(2, 100, "groups = 1\nstaleness = none");
    omv_checkpoint_t one, spread;
    train_on_one(&one);
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    pid_t d, s[4], w[3];
    start_replicated(100, &d, s, w);
    wait_status("steps_total", 300, 60000);
    int victim = holder_of("primary", 1, 4);
    ck_assert_msg(victim >= 0, "no primary of shard 1");
    double at_kill = wait_status("images_total", 0, 1000);
    kill(s[victim], SIGKILL);
    waitpid(s[victim], NULL, 0);
    /* Once the job goes on over the 3 left, a replacement registers: it is made the backup of
     * the range that has none, at another cut. */
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    for (int64_t until = omv_time_ms() + 30000; omv_time_ms() < until;) {
        control("servers", &body);
        if (field(omv_strbuf_str(&body), "failovers_total") == 1)
            break;
        sleep_ms(50);
    }
    wait_status("steps_total", at_kill / 32 + 50, 30000);
    double back_to = resumed_images();
    s[victim] = start_shard(victim);
    wait_done_or_dump(&body, 4);
    omv_strbuf_fini(&body);
    ck_assert_msg(back_to >= at_kill, "killed at %.0f images, went back to %.0f", at_kill, back_to);
    omv_strbuf_t srv;
    omv_strbuf_init(&srv);
    control("servers", &srv);
    ck_assert_msg(field(omv_strbuf_str(&srv), "failovers_total") == 1, "%s", omv_strbuf_str(&srv));
    /* The failover's cut and the new backup's are checkpoints in parts, each server making its
     * range from them: no parameters came to the coordinator or left it, through it all. */
    for (int i = 0; i < 4; i++) {
        const char *at = server_section(omv_strbuf_str(&srv), i);
        ck_assert_msg(field(at, "gathered_bytes_total") == 0 &&
                          field(at, "range_bytes_sent_total") == 0,
                      "shard server %d: %s", i, omv_strbuf_str(&srv));
    }
    omv_strbuf_fini(&srv);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char log[700], text[65536];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(has_text(text, "go on from their backup") &&
                      has_text(text, "failover: the ranges' holders were cut at step") &&
                      has_text(text, "a new backup: the servers were cut at step") &&
                      has_text(text, "checkpoint 1: 2 parts, 2 of them written by their servers") &&
                      has_text(text, "checkpoint 2: 2 parts, 2 of them written by their servers"),
                  "%s", text + (strlen(text) > 3000 ? strlen(text) - 3000 : 0));
    for (int i = 0; i < 4; i++)
        stop_shard(s[i], i, text, sizeof(text));
    read_final("servers", &spread);
    same_model(&one, &spread);
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
    coordinator_conf = NULL;
}
END_TEST

START_TEST(test_servers_failover_parts_not_shared)
{
    /* A failover whose holders cannot all write the cut where the coordinator sees it (as root:
     * one shard server in a mount namespace with a folder of its own over the checkpoints'):
     * the coordinator finds that holder's part missing, cuts the holders again at the same
     * steps with their ranges sent to it, and writes the cut whole; the server that cannot read
     * that checkpoint then asks for its range. Nothing is lost: the job goes on from the step
     * the primary died at and ends with one daemon's model, bit for bit. */
    if (geteuid() != 0 || system("unshare -m true 2>/dev/null") != 0) {
        fprintf(stderr, "test_servers_failover_parts_not_shared: skipped (needs root and "
                        "unshare -m)\n");
        return;
    }
    model_section = "layers = 64 32 4";
    write_job(2, 30, "groups = 1\nstaleness = none");
    omv_checkpoint_t one, spread;
    train_on_one(&one);
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    char line[1200];
    snprintf(line, sizeof(line), "mount -t tmpfs none '%s'", servers_ckpt_dir());
    shard_mounts = line;
    shard_mounts_for = 3;
    pid_t d, s[4], w[3];
    start_replicated(30, &d, s, w);
    shard_mounts = NULL;
    wait_status("steps_total", 300, 60000);
    /* Kill a primary such that the server with a folder of its own holds a range after. */
    int p0 = holder_of("primary", 0, 4), p1 = holder_of("primary", 1, 4);
    int victim = p1; /* server 3 is the primary of range 0 or the backup of range 1 */
    if (p1 == 3 || holder_of("backup", 0, 4) == 3)
        victim = p0;
    ck_assert_msg(victim >= 0 && victim != 3, "primaries %d and %d", p0, p1);
    double at_kill = wait_status("images_total", 0, 1000);
    kill(s[victim], SIGKILL);
    waitpid(s[victim], NULL, 0);
    s[victim] = 0;
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done_or_dump(&body, 4);
    omv_strbuf_fini(&body);
    double back_to = resumed_images();
    ck_assert_msg(back_to >= at_kill, "killed at %.0f images, went back to %.0f", at_kill, back_to);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char log[700], text[65536];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(
        has_text(text, "which the coordinator cannot see") &&
            has_text(text, "failover: the cut again, its ranges sent to the coordinator") &&
            has_text(text, "failover: the ranges' holders were cut at step") &&
            has_text(text, "could not make shards ["),
        "%s", text + (strlen(text) > 4000 ? strlen(text) - 4000 : 0));
    for (int i = 0; i < 4; i++)
        if (s[i] > 0)
            stop_shard(s[i], i, text, sizeof(text));
    snprintf(log, sizeof(log), "%s/shard3.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(has_text(text, "asking the coordinator for them") &&
                      has_text(text, ") came from the coordinator"),
                  "%s", text);
    read_final("servers", &spread);
    same_model(&one, &spread);
    omv_checkpoint_fini(&one);
    omv_checkpoint_fini(&spread);
    coordinator_conf = NULL;
}
END_TEST

START_TEST(test_servers_failover_slow_steps)
{
    /* Trainers whose step takes 3 s, longer than the coordinator takes to find a SIGKILLed
     * primary gone (server_timeout_s = 2): the primary is killed just as a step begins, so that
     * step is still being computed when the failover starts. The coordinator waits for the
     * reports to stand still twice the slowest step and more (it says how long), so the step
     * under way ends and is in the cut: the holders are cut one step past the kill (with a
     * fixed 500 ms they were cut at the kill's step, and the step was thrown away to be
     * trained again), and every image is counted once. */
    model_section = "layers = 64 32 4";
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    write_job(2, 1,
              "groups = 1\nstaleness = none\nservers = 2\nreplicas = 2\n"
              "[checkpoint]\nevery_s = 0\n[data]\ntrain_limit = 160");
    pid_t d = start_coordinator("servers"), s[4], w[2];
    for (int i = 0; i < 4; i++)
        s[i] = start_shard(i);
    for (int i = 0; i < 2; i++)
        w[i] = start_worker_slow("trainer", "3000");
    double steps = wait_status("steps_total", 1, 60000);
    double now = steps;
    for (int64_t until = omv_time_ms() + 10000; now == steps && omv_time_ms() < until; sleep_ms(20))
        now = status_field("steps_total");
    ck_assert_msg(now > steps, "no step in 10 s");
    sleep_ms(300); /* the step's parameters are all out: it is under way */
    int victim = kill_holder("primary", 1, s);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done_or_dump(&body, 4);
    double images = field(omv_strbuf_str(&body), "images_total");
    omv_strbuf_fini(&body);
    ck_assert_msg(images == 160, "images %.0f", images);
    stop_workers(w, 2);
    shutdown_daemon(d);
    static char text[65536];
    char log[700];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    size_t len = strlen(text);
    const char *tail = len > 3000 ? text + len - 3000 : text;
    const char *wait = strstr(text, "no step has been reported for ");
    ck_assert_msg(wait != NULL, "%s", tail);
    ck_assert_msg(atof(wait + 30) >= 6500, "%.300s", wait);
    char cut[96];
    snprintf(cut, sizeof(cut), "the ranges' holders were cut at step %.0f ", now + 1);
    ck_assert_msg(has_text(text, cut), "killed at step %.0f: %s", now, tail);
    for (int i = 0; i < 4; i++)
        if (i != victim)
            stop_shard(s[i], i, text, sizeof(text));
    coordinator_conf = NULL;
}
END_TEST

START_TEST(test_servers_backup_lost_with_churn)
{
    /* replicas = 2 with members coming and going: a trainer is SIGKILLed and its replacement
     * joins at a cut (each backup takes the newcomer once it has the cut's steps, as its
     * primary did at the cut), then a backup is SIGKILLed. Its primaries finish their begun
     * steps at a cut, which is written and gone on from over the 3 servers left. Every image
     * is counted once, nothing is refused anywhere, and every server left applied each
     * gradient once. */
    model_section = "layers = 64 32 4";
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    pid_t d, s[4], w[3];
    start_replicated(120, &d, s, w);
    wait_status("steps_total", 200, 60000);
    kill(w[1], SIGKILL);
    waitpid(w[1], NULL, 0);
    wait_status("deaths_total", 1, 20000);
    w[1] = start_worker("trainer");
    wait_status("joins_total", 3, 20000);
    double steps = wait_status("steps_total", 0, 1000);
    wait_status("steps_total", steps + 200, 60000);
    int victim = kill_holder("backup", 0, s);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    double acc = wait_done_or_dump(&body, 4);
    double images = field(omv_strbuf_str(&body), "images_total");
    omv_strbuf_fini(&body);
    ck_assert_msg(images >= 120 * 4096 && images <= 120 * 4096 + 32, "images %f", images);
    ck_assert_msg(acc > 0.95, "accuracy %f", acc);
    /* The two ranges' primaries finished with every image counted once; the backup left did
     * too, or stopped short of the end with the job. */
    int finished = 0;
    for (int i = 0; i < 4; i++)
        if (i != victim)
            finished += check_shard_counts_or_stop(i, images, 1, 1);
    ck_assert_int_ge(finished, 2);
    stop_workers(w, 3);
    shutdown_daemon(d);
    char log[700], text[65536];
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    size_t len = strlen(text);
    ck_assert_msg(has_text(text, "(their backup)") &&
                      has_text(text, "failover: the ranges' holders were cut at step"),
                  "%s", len > 3000 ? text + len - 3000 : text);
    for (int i = 0; i < 4; i++)
        if (i != victim)
            stop_shard(s[i], i, text, sizeof(text));
    coordinator_conf = NULL;
}
END_TEST

/* Attaches peer b (connected to a shard server) as worker id with token: Attach until the
 * server has been told of it (a join takes effect at a cut). */
static void peer_attach(peer_t *b, uint32_t id, uint64_t token)
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

/* Registers p as an evaluator once the job is on its servers (an evaluator that comes before
 * waits for it, told to register again); *w gets the Welcome naming the servers. */
static void evaluator_hello(peer_t *p, omv_msg_t *w)
{
    for (int64_t until = omv_time_ms() + 20000;;) {
        omv_msg_t m = {.type = OMV_MSG_HELLO};
        m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
        m.u.hello.role = OMV_ROLE_EVALUATOR;
        omv_strlcpy(m.u.hello.hostname, "late-evaluator", sizeof(m.u.hello.hostname));
        peer_send(p, &m, NULL, 0);
        peer_recv(p, w, NULL, 0);
        ck_assert_msg(w->type == OMV_MSG_WELCOME, "evaluator: %s", omv_msg_name(w->type));
        if (!w->u.welcome.idle && w->u.welcome.n_servers > 0)
            return;
        do /* told to register again once the job is there */
            peer_recv(p, &m, NULL, 0);
        while (m.type != OMV_MSG_STOP);
        ck_assert_msg(omv_time_ms() < until, "the job never came to its servers");
    }
}

START_TEST(test_servers_evaluator_attaches_late)
{
    /* The servers send an evaluation's model to the evaluator themselves. One that has not
     * attached when its evaluation is asked for is sent it as soon as it does: here a peer
     * playing the evaluator attaches only once the coordinator's request (no parameters) has
     * come. Each server's range comes whole, as Params whose step is the evaluation's id; the
     * result goes to the coordinator, which counts the evaluation as direct. */
    write_job(2, 4, "groups = 1\nstaleness = none\nservers = 2\nshards = 4");
    pid_t d = start_coordinator("servers"), s[2] = {start_shard(0), start_shard(1)};
    peer_t p;
    peer_open(&p);
    static omv_msg_t w;
    evaluator_hello(&p, &w);
    const omv_welcome_t *wl = &w.u.welcome;
    ck_assert_uint_eq(wl->n_servers, 2);
    ck_assert_uint_eq(wl->n_backups, 0);
    uint32_t id = wl->worker_id;
    /* Steps of 10 ms: the job is still running when the peer attaches. */
    pid_t t[2] = {start_worker_slow("trainer", "10"), start_worker_slow("trainer", "10")};
    omv_msg_t m;
    do { /* the evaluation after epoch 1 */
        omv_msg_t hb = {.type = OMV_MSG_HEARTBEAT};
        hb.u.heartbeat.worker_id = id;
        peer_send(&p, &hb, NULL, 0);
        peer_recv(&p, &m, NULL, 0);
    } while (m.type == OMV_MSG_HEARTBEAT);
    ck_assert_msg(m.type == OMV_MSG_EVAL_REQUEST && m.u.eval_request.count == 0,
                  "%s with %u parameters", omv_msg_name(m.type), m.u.eval_request.count);
    uint64_t eval_id = m.u.eval_request.eval_id;
    float *model = calloc(wl->job.param_count, sizeof(float));
    uint32_t covered = 0;
    peer_t v[2];
    for (uint32_t k = 0; k < 2; k++) {
        char saved[sizeof(endpoint)];
        omv_strlcpy(saved, endpoint, sizeof(saved));
        omv_strlcpy(endpoint, wl->servers[k].endpoint, sizeof(endpoint));
        peer_open(&v[k]);
        omv_strlcpy(endpoint, saved, sizeof(endpoint));
        peer_attach(&v[k], id, wl->attach_token);
        peer_recv(&v[k], &m, model, wl->job.param_count);
        const omv_params_t *q = &m.u.params;
        ck_assert_msg(m.type == OMV_MSG_PARAMS && q->step == eval_id && q->wire == OMV_WIRE_FP32 &&
                          q->shard == wl->servers[k].first_shard &&
                          q->offset == wl->job.shard_offsets[q->shard] &&
                          q->offset + q->count == wl->job.shard_offsets[wl->servers[k].last_shard],
                      "server %u sent %s step %llu shard %u [%u, +%u)", k, omv_msg_name(m.type),
                      (unsigned long long)q->step, q->shard, q->offset, q->count);
        covered += q->count;
    }
    ck_assert_uint_eq(covered, wl->job.param_count);
    m = (omv_msg_t){.type = OMV_MSG_EVAL_RESULT};
    m.u.eval_result = (omv_eval_result_t){id, eval_id, 90, 100, 0.5f};
    peer_send(&p, &m, NULL, 0);
    wait_status("evaluations_direct_total", 1, 10000);
    wait_status("evaluations_total", 1, 10000);
    for (int k = 0; k < 2; k++)
        peer_close(&v[k]);
    peer_close(&p); /* gone: the job ends without a final evaluation */
    free(model);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    wait_done(&body, 120000);
    omv_strbuf_fini(&body);
    stop_workers(t, 2);
    shutdown_daemon(d);
    char text[65536];
    for (int i = 0; i < 2; i++) {
        stop_shard(s[i], i, text, sizeof(text));
        ck_assert_msg(has_text(text, "the coordinator's evaluations come from here"), "%s", text);
    }
}
END_TEST

START_TEST(test_servers_backup_flooded)
{
    /* A registered worker floods a backup with pushes for a step far ahead (a bug, or a peer
     * that means harm): a backup keeps a push that comes before its step, but only up to its
     * bound (64 MiB here), then says so and stops following its primary; the coordinator goes
     * on without it, the job ends done with every image counted once, and the backup's memory
     * stayed bounded. A push that fits no shard of its range is refused at once, not kept. */
    model_section = "layers = 64 2048 4"; /* shard 0: 65,536 parameters, 256 KiB a push */
    coordinator_conf = "[daemon]\nserver_timeout_s = 2\n";
    write_job(2, 40,
              "groups = 1\nstaleness = none\nservers = 2\nreplicas = 2\nprogress_timeout_s = 4\n"
              "wire = fp32\n[checkpoint]\nevery_s = 0");
    pid_t d = start_coordinator("servers"), s[4];
    for (int i = 0; i < 4; i++)
        s[i] = start_shard(i);
    pid_t w[3] = {start_worker("trainer"), start_worker("trainer"), start_worker("evaluator")};
    wait_status("steps_total", 100, 60000);
    peer_t p, a, b;
    peer_open(&p);
    static omv_msg_t wm;
    peer_hello(&p, "flood", &wm);
    const omv_welcome_t *wl = &wm.u.welcome;
    const omv_server_info_t *backup = NULL, *primary = NULL;
    for (uint32_t k = 0; k < wl->n_backups; k++)
        if (wl->backups[k].first_shard == 0)
            backup = &wl->backups[k];
    for (uint32_t k = 0; k < wl->n_servers; k++)
        if (wl->servers[k].first_shard == 0)
            primary = &wl->servers[k];
    ck_assert_msg(backup && primary, "no primary or backup of shard 0 in the Welcome");
    int victim = -1;
    for (int i = 0; i < 4; i++) {
        char ep[700];
        snprintf(ep, sizeof(ep), "ipc://%s/shard%d.sock", test_dir, i);
        if (strcmp(ep, backup->endpoint) == 0)
            victim = i;
    }
    ck_assert_msg(victim >= 0, "the backup's endpoint %s is none of ours", backup->endpoint);
    char saved[sizeof(endpoint)];
    omv_strlcpy(saved, endpoint, sizeof(saved));
    omv_strlcpy(endpoint, primary->endpoint, sizeof(endpoint));
    peer_open(&a);
    omv_strlcpy(endpoint, backup->endpoint, sizeof(endpoint));
    peer_open(&b);
    omv_strlcpy(endpoint, saved, sizeof(endpoint));
    uint32_t id = wl->worker_id, count = wl->job.shard_offsets[1];
    peer_attach(&a, id, wl->attach_token);
    peer_attach(&b, id, wl->attach_token);
    float *junk = calloc(wl->job.param_count, sizeof(float));
    /* As a worker does: its first parameters, once it is a member of the group (at a cut). */
    omv_msg_t m = {.type = OMV_MSG_PULL};
    m.u.pull = (omv_pull_t){id, wl->start_step, 0};
    peer_send(&a, &m, NULL, 0);
    do
        peer_recv(&a, &m, junk, wl->job.param_count);
    while (m.type != OMV_MSG_PARAMS);
    long rss0 = proc_kib(s[victim], "VmRSS");
    /* A push that does not fit the shard is refused (a backup answers no refusal: its primary
     * does), not kept. */
    m = (omv_msg_t){.type = OMV_MSG_PUSH};
    m.u.push = (omv_push_t){id, 1000000, 0, 0, count - 1, 1.0f, 32, 1.0f, OMV_WIRE_FP32};
    peer_send(&b, &m, junk, count - 1);
    char ctl[700];
    snprintf(ctl, sizeof(ctl), "%s/shard%d.ctl", test_dir, victim);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    for (int64_t until = omv_time_ms() + 5000;; sleep_ms(50)) {
        ck_assert_int_eq(omv_control_request(ctl, "status", &body, 5000), 0);
        if (field(omv_strbuf_str(&body), "refused_total") == 1)
            break;
        ck_assert_msg(omv_time_ms() < until, "the misshapen push was not refused: %s",
                      omv_strbuf_str(&body));
    }
    /* Refused as a backup (for its step, the first check it fails), and status says whose and
     * why. */
    char why[128];
    snprintf(why, sizeof(why),
             "\nbackup_refused_last:step from worker %u \"flood\": gradient "
             "for step 1000000",
             id);
    ck_assert_msg(field(omv_strbuf_str(&body), "backup_refused_total") == 1 &&
                      has_text(omv_strbuf_str(&body), why),
                  "%s", omv_strbuf_str(&body));
    /* Pushes for a step far ahead, 16 at a time (each batch taken in before the next goes, so
     * that what the backup holds is what it kept, not what its socket queued), until it says it
     * stopped: at its 64 MiB bound, about 256 of them. */
    m.u.push = (omv_push_t){id, 1000000, 0, 0, count, 1.0f, 32, 1.0f, OMV_WIRE_FP32};
    char log[700], text[1 << 16];
    snprintf(log, sizeof(log), "%s/shard%d.log", test_dir, victim);
    const char *said = "bytes of pushes wait for their steps, the most it keeps";
    int sent = 0, stopped = 0;
    double held_max = 0;
    while (!stopped && sent < 1024) {
        for (int i = 0; i < 16; i++)
            peer_send(&b, &m, junk, count);
        sent += 16;
        for (int64_t until = omv_time_ms() + 10000;; sleep_ms(20)) {
            ck_assert_int_eq(omv_control_request(ctl, "servers", &body, 5000), 0);
            double held = field(omv_strbuf_str(&body), "held_bytes");
            held_max = held > held_max ? held : held_max;
            read_file(log, text, sizeof(text));
            stopped = has_text(text, said);
            if (stopped || field(omv_strbuf_str(&body), "held_pushes") == sent)
                break;
            ck_assert_msg(omv_time_ms() < until, "the backup holds not all %d pushes: %s", sent,
                          omv_strbuf_str(&body));
        }
    }
    free(junk);
    ck_assert_msg(stopped, "the backup still follows after %d pushes (%.0f bytes held)", sent,
                  held_max);
    ck_assert_msg(held_max <= 64.0 * 1024 * 1024 && sent * 256.0 * 1024 > 64.0 * 1024 * 1024,
                  "%d pushes, %.0f bytes held at most", sent, held_max);
    long peak = proc_kib(s[victim], "VmHWM");
    ck_assert_msg(peak < rss0 + 100 * 1024, "the backup's peak memory %ld kB, %ld kB before", peak,
                  rss0);
    peer_close(&a);
    peer_close(&b);
    peer_close(&p);
    /* The flooding worker pushes nothing else: declared dead (progress_timeout_s); the job
     * goes on over the 3 servers left. */
    wait_done_or_dump(&body, 4);
    double images = field(omv_strbuf_str(&body), "images_total");
    omv_strbuf_fini(&body);
    ck_assert_msg(images >= 40 * 4096 && images < 40 * 4096 + 64, "images %f", images);
    stop_workers(w, 3);
    shutdown_daemon(d);
    snprintf(log, sizeof(log), "%s/coordinator.log", test_dir);
    read_file(log, text, sizeof(text));
    ck_assert_msg(has_text(text, "failover: the ranges' holders were cut at step"), "%s",
                  strlen(text) > 3000 ? text + strlen(text) - 3000 : text);
    for (int i = 0; i < 4; i++)
        if (i != victim)
            stop_shard(s[i], i, text, sizeof(text));
    kill(s[victim], SIGTERM);
    waitpid(s[victim], NULL, 0);
    coordinator_conf = NULL;
}
END_TEST

START_TEST(test_worker_at_shard_server_refused)
{
    /* A worker pointed at a shard server instead of the coordinator is told where to go. */
    model_section = "layers = 64 32 4";
    write_job(1, 1, "servers = 1");
    pid_t d = start_coordinator("servers");
    pid_t s = start_shard(0);
    char ep[700], log[700], text[16384];
    snprintf(ep, sizeof(ep), "ipc://%s/shard0.sock", test_dir);
    snprintf(log, sizeof(log), "%s/lost-worker.log", test_dir);
    char *argv[] = {(char *)bin("OMNIVORE_WORKER"), "--server", ep, "--hello-timeout", "5", NULL};
    pid_t w = spawn_logged(argv, log);
    int status;
    ck_assert_int_eq(waitpid(w, &status, 0), w);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status %d", status);
    read_file(log, text, sizeof(text));
    ck_assert_msg(has_text(text, "shard server") && has_text(text, "coordinator"), "%s", text);
    kill(s, SIGTERM);
    expect_exit_0(s, "omnivored (shard server)");
    kill(d, SIGTERM);
    waitpid(d, NULL, 0);
}
END_TEST

/* OMV_TEST_ONLY=name runs only the test of that name (while working on one). */
#define ADD_TEST(tc, fn)                                                                           \
    do {                                                                                           \
        const char *only = getenv("OMV_TEST_ONLY");                                                \
        if (only == NULL || strcmp(only, #fn) == 0)                                                \
            tcase_add_test(tc, fn);                                                                \
    } while (0)

static Suite *servers_suite(void)
{
    Suite *s = suite_create("servers");
    TCase *tc = tcase_create("servers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    ADD_TEST(tc, test_servers_bit_identical);
    ADD_TEST(tc, test_servers_evaluator_attaches_late);
    ADD_TEST(tc, test_servers_three_fp32);
    ADD_TEST(tc, test_servers_checkpoint_is_a_cut);
    ADD_TEST(tc, test_servers_parts_not_shared);
    ADD_TEST(tc, test_servers_async_groups);
    ADD_TEST(tc, test_servers_over_curve);
    ADD_TEST(tc, test_servers_trainer_dies);
    ADD_TEST(tc, test_coordinator_restart_resumes);
    ADD_TEST(tc, test_server_lost_fails_job);
    ADD_TEST(tc, test_server_lost_goes_back);
    ADD_TEST(tc, test_servers_end_during_cut);
    ADD_TEST(tc, test_worker_at_shard_server_refused);
    ADD_TEST(tc, test_servers_regroup);
    ADD_TEST(tc, test_servers_optimizer);
    ADD_TEST(tc, test_servers_failover);
    ADD_TEST(tc, test_servers_init_file);
    ADD_TEST(tc, test_servers_failover_parts_not_shared);
    ADD_TEST(tc, test_servers_failover_slow_steps);
    ADD_TEST(tc, test_servers_backup_lost_with_churn);
    ADD_TEST(tc, test_servers_backup_flooded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(servers_suite());
}
