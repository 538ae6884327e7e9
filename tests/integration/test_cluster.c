/* Integration tests with real processes: omnivored, omnivore-worker and omnivorectl on ipc
 * endpoints in a temporary folder, training generated data, under faults and bad input. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "checkpoint.h"
#include "cluster_util.h"
#include "control.h"
#include "peer_util.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"
#include "wire.h"

static void check_trained(const char *extra)
{
    static char json[65536];
    int rc = run_ctl(json, sizeof(json), extra);
    ck_assert_msg(rc == 0, "omnivorectl run exited %d; last line: %s", rc, json);
    ck_assert_msg(has_text(json, "\"state\":\"done\""), "not done: %s", json);
    double loss = json_number(json, "test_loss");
    double acc = json_number(json, "test_accuracy");
    ck_assert_msg(loss < 0.25, "test loss %f is not below 0.25: %s", loss, json);
    ck_assert_msg(acc > 0.95, "test accuracy %f is not above 0.95: %s", acc, json);
    /* The job trains until 4 epochs of images are done; asynchronous groups may each finish
     * the step they were in: at most one batch of 32 per group (2 here) past it. */
    double images = json_number(json, "images_total");
    ck_assert_msg(images >= 4 * 4096 && images <= 4 * 4096 + 2 * 32, "images: %s", json);
    ck_assert_msg(has_text(json, "\"history\":[{\"epoch\":1.0"), "history: %s", json);
    ck_assert_msg(json_number(json, "images_per_second") > 0, "images/s: %s", json);
}

/* The log of the last `omnivorectl run` (the daemon's and the workers'), into log[cap]. */
static void read_run_log(char *log, size_t cap)
{
    char log_path[700];
    snprintf(log_path, sizeof(log_path), "%s/run.log", test_dir);
    FILE *f = fopen(log_path, "r");
    ck_assert_ptr_nonnull(f);
    size_t len = fread(log, 1, cap - 1, f);
    fclose(f);
    log[len] = '\0';
}

START_TEST(test_train_sync)
{
    write_job(2, 4, "groups = 1\nstaleness = none");
    check_trained("");
}
END_TEST

START_TEST(test_train_bf16)
{
    /* Parameters and gradients travel as bf16 (the daemon keeps fp32): the job trains as well,
     * over a model in several shards, with nothing refused. */
    write_job(2, 4, "groups = 1\nstaleness = none\nwire = bf16\nshards = 3");
    check_trained("");
    char log[65536];
    read_run_log(log, sizeof(log));
    ck_assert_msg(has_text(log, "parameters and gradients travel as bf16"), "%s", log);
    ck_assert_msg(!has_text(log, "refused"), "a refusal in the log: %s", log);
}
END_TEST

/* Each trainer's count of parameter shards that came as int8 changes and whole, from the log's
 * summaries (one a trainer), into changes[]/wholes[] (n of them). Returns how many it found. */
static int view_counts(const char *log, unsigned long long *changes, unsigned long long *wholes,
                       int n)
{
    int found = 0;
    for (const char *at = log; found < n && (at = strstr(at, "shards of parameters came as"));
         at++) {
        const char *line = at;
        while (line > log && line[-1] != '\n')
            line--;
        const char *colon = strstr(line, "worker: worker ");
        ck_assert_ptr_nonnull(colon);
        ck_assert_int_eq(sscanf(strchr(colon + 15, ':') + 1,
                                " %llu shards of parameters came as "
                                "int8 changes to our view of them, %llu whole",
                                &changes[found], &wholes[found]),
                         2);
        found++;
    }
    return found;
}

START_TEST(test_train_int8)
{
    /* Gradients travel as int8 with error feedback, parameters as int8 changes to each worker's
     * view, over the socket (not shared memory, which carries fp32): the job trains as well,
     * with nothing refused. Each worker is sent each of the 3 shards whole once, to begin its
     * view, and changes from then on; the two members of the group are sent the same versions,
     * so they share one view of each shard on the daemon, which makes each change once. */
    write_job(2, 4, "groups = 1\nstaleness = none\nwire = int8\nshards = 3");
    setenv("OMNIVORE_SHM", "0", 1);
    static char json[65536];
    int rc = run_ctl(json, sizeof(json), "");
    unsetenv("OMNIVORE_SHM");
    ck_assert_msg(rc == 0 && has_text(json, "\"state\":\"done\""), "%d: %s", rc, json);
    ck_assert_msg(json_number(json, "test_accuracy") > 0.95, "%s", json);
    static char log[1 << 20];
    read_run_log(log, sizeof(log));
    ck_assert_msg(has_text(log, "gradients travel as int8"), "%s", log);
    ck_assert_msg(has_text(log, "parameters as int8 changes"), "%s", log);
    ck_assert_msg(!has_text(log, "go through shared memory"), "%s", log);
    ck_assert_msg(!has_text(log, "refused"), "a refusal in the log: %s", log);
    ck_assert_msg(!has_text(log, "registering again"), "%s", log);
    unsigned long long changes[2], wholes[2];
    ck_assert_int_eq(view_counts(log, changes, wholes, 2), 2);
    unsigned long long steps = (unsigned long long)json_number(json, "images_total") / 32;
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(wholes[i] == 3, "worker %d: %llu whole: %s", i, wholes[i], log);
        /* Each shard a step, the first step's whole; the step under way at the end may be
         * sent too. */
        ck_assert_msg(changes[i] + 3 >= 3 * steps && changes[i] + 3 <= 3 * steps + 3,
                      "worker %d: %llu changes in %llu steps", i, changes[i], steps);
    }
    /* The daemon sent what the workers took, and keeps one view of each shard for the group. */
    const char *end = strstr(log, "shards were sent as");
    ck_assert_msg(end != NULL, "%s", log);
    unsigned long long sent, whole, views, buffers;
    ck_assert_int_eq(sscanf(end,
                            "shards were sent as %llu int8 changes and %llu whole; %llu views "
                            "of shards are kept for the workers (%*f MB); %llu change buffers",
                            &sent, &whole, &views, &buffers),
                     4);
    /* A change is sent from its view's buffer to both members: a buffer of its own only when
     * the last was still on its way out (in a synchronous group, hardly ever). */
    ck_assert_msg(buffers <= sent / 4, "%llu change buffers for %llu changes", buffers, sent);
    ck_assert_msg(sent >= changes[0] + changes[1] && sent <= changes[0] + changes[1] + 6,
                  "sent %llu, taken %llu + %llu", sent, changes[0], changes[1]);
    ck_assert_uint_eq(whole, 6);
    ck_assert_msg(views == 3, "%llu views kept for one group over 3 shards", views);
}
END_TEST

START_TEST(test_train_int8_groups)
{
    /* Two asynchronous groups are sent different versions: their members' views part after
     * the first step (a whole shard to begin each one's own), and the job trains as well. */
    write_job(2, 4, "groups = 2\nstaleness = 2\nwire = int8\nshards = 3");
    setenv("OMNIVORE_SHM", "0", 1);
    check_trained("");
    unsetenv("OMNIVORE_SHM");
    static char log[1 << 20];
    read_run_log(log, sizeof(log));
    ck_assert_msg(!has_text(log, "refused"), "a refusal in the log: %s", log);
    ck_assert_msg(!has_text(log, "registering again"), "%s", log);
    unsigned long long changes[2], wholes[2];
    ck_assert_int_eq(view_counts(log, changes, wholes, 2), 2);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(wholes[i] >= 3 && wholes[i] <= 6 && changes[i] > 100,
                      "worker %d: %llu changes, %llu whole: %s", i, changes[i], wholes[i], log);
}
END_TEST

START_TEST(test_train_uneven)
{
    /* Three workers share a group's batch of 32 as 11, 11 and 10 images, and the update is the
     * mean weighted by images: the job trains as the even ones do. */
    write_job(3, 4, "groups = 1\nstaleness = none");
    check_trained("");
}
END_TEST

START_TEST(test_train_cnn)
{
    /* A model definition file travels to the workers; the daemon prints its summary. */
    char model[700];
    snprintf(model, sizeof(model), "%s/blobs.model", test_dir);
    FILE *f = fopen(model, "w");
    ck_assert_ptr_nonnull(f);
    fputs("input 1x8x8\nconv 8 3x3 pad 1\nrelu\nmaxpool 2\nflatten\nfc 4\nsoftmax\n", f);
    fclose(f);
    model_section = "definition = blobs.model";
    write_job(2, 4, "groups = 1\nstaleness = none");
    model_section = "layers = 64 32 4";
    check_trained("");
    char log[16384];
    read_run_log(log, sizeof(log));
    ck_assert_msg(has_text(log, "conv 8 3x3 s1 p1") && has_text(log, "8x8x8") &&
                      has_text(log, "total"),
                  "no model summary in the log: %s", log);
}
END_TEST

/* Trains the current job with `omnivorectl run` (its workers with OMNIVORE_OVERLAP=overlap and
 * OMNIVORE_SHM=shm) and reads the final checkpoint its summary names into *ck. */
static void same_model(const omv_checkpoint_t *a, const omv_checkpoint_t *b, const char *what)
{
    ck_assert_uint_eq(a->param_count, b->param_count);
    ck_assert_uint_eq(a->steps_total, b->steps_total);
    ck_assert_uint_eq(a->images_total, b->images_total);
    size_t bytes = a->param_count * sizeof(float);
    ck_assert_msg(memcmp(a->params, b->params, bytes) == 0, "the parameters differ %s", what);
    ck_assert_msg(memcmp(a->velocity, b->velocity, bytes) == 0, "the momentum differs %s", what);
}

static void train_to_checkpoint(const char *overlap, const char *shm, omv_checkpoint_t *ck)
{
    static char json[65536];
    setenv("OMNIVORE_OVERLAP", overlap, 1);
    setenv("OMNIVORE_SHM", shm, 1);
    int rc = run_ctl(json, sizeof(json), "");
    unsetenv("OMNIVORE_OVERLAP");
    unsetenv("OMNIVORE_SHM");
    char log[65536];
    read_run_log(log, sizeof(log));
    int shared = has_text(log, "go through shared memory with the daemon");
    ck_assert_msg(shared == (strcmp(shm, "1") == 0), "shared memory %s: %s",
                  shared ? "used" : "not used", log);
    /* Every job here has one group: a local worker reads the daemon's parameters in place. */
    ck_assert_msg(has_text(log, "reads the parameters in place") == shared,
                  "parameters in shared memory, yet not read in place: %s", log);
    ck_assert_msg(rc == 0 && has_text(json, "\"state\":\"done\""), "run: %d %s", rc, json);
    const char *at = strstr(json, "\"checkpoint\":\"");
    ck_assert_msg(at != NULL, "no checkpoint in the summary: %s", json);
    char path[1024], err[OMV_CHECKPOINT_ERR_MAX];
    at += strlen("\"checkpoint\":\"");
    size_t n = strcspn(at, "\"");
    ck_assert(n < sizeof(path));
    memcpy(path, at, n);
    path[n] = '\0';
    ck_assert_msg(omv_checkpoint_read(ck, path, err) == 0, "%s", err);
    ck_assert_msg(ck->finished, "%s is not the finished job's checkpoint", path);
}

START_TEST(test_overlap_bit_identical)
{
    /* Overlap (a shard's gradient pushed as soon as backward has it, a layer begun as soon as
     * its shards came, the next pull sent before this step's pushes and answered shard by shard
     * as the daemon applies them) changes when bytes move, never what is computed: in a
     * synchronous group the same seed gives the same parameters and momentum, bit for bit, as
     * the serial order. A model of conv, batch norm (its running statistics are state, pulled
     * and pushed with the rest) and fc layers in 4 shards along its layers. */
    use_mixed_model();
    /* bf16 on the socket: serial and overlapped. */
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 4");
    omv_checkpoint_t serial, overlapped, shared;
    train_to_checkpoint("0", "0", &serial);
    train_to_checkpoint("1", "0", &overlapped);
    same_model(&serial, &overlapped, "with overlap (bf16)");
    omv_checkpoint_fini(&serial);
    omv_checkpoint_fini(&overlapped);
    /* fp32, the same model: overlapped on the socket, and in shared memory, where the workers
     * compute from the daemon's own parameters in place (batch norm's state among them). */
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 4\nwire = fp32");
    train_to_checkpoint("1", "0", &overlapped);
    train_to_checkpoint("1", "1", &shared);
    same_model(&overlapped, &shared, "read in place (conv, batch norm, fc)");
    omv_checkpoint_fini(&overlapped);
    omv_checkpoint_fini(&shared);
    /* fp32: serial on the socket, overlapped on the socket, overlapped in shared memory (which
     * carries fp32 whatever the wire). */
    write_job(2, 2, "groups = 1\nstaleness = none\nshards = 4\nwire = fp32");
    model_section = "layers = 64 32 4";
    train_to_checkpoint("0", "0", &serial);
    train_to_checkpoint("1", "0", &overlapped);
    train_to_checkpoint("1", "1", &shared);
    same_model(&serial, &overlapped, "with overlap (fp32)");
    same_model(&serial, &shared, "in shared memory");
    omv_checkpoint_fini(&serial);
    omv_checkpoint_fini(&overlapped);
    omv_checkpoint_fini(&shared);
}
END_TEST

START_TEST(test_train_resnet_adamw_export_init)
{
    /* A residual network with batch norm, trained with AdamW over bf16: its running statistics
     * travel with the gradients and the daemon's average is what evaluation uses, so the test
     * accuracy is that of a trained network. Its checkpoint exports, and a job started from the
     * export ([model] init) is trained from its first step. */
    char model[700];
    snprintf(model, sizeof(model), "%s/res.model", test_dir);
    FILE *f = fopen(model, "w");
    ck_assert_ptr_nonnull(f);
    fputs("input 1x8x8\nconv 8 3x3 pad 1\nbatchnorm\nrelu\nsave a\nconv 8 3x3 pad 1\n"
          "batchnorm\nadd a\nrelu\nsave b\nconv 16 3x3 stride 2 pad 1\nbatchnorm\nadd b\nrelu\n"
          "globalavgpool\nfc 4\n",
          f);
    fclose(f);
    model_section = "definition = res.model";
    write_job(2, 4, "groups = 1\nstaleness = none\nwire = bf16\nshards = 3");
    model_section = "layers = 64 32 4";
    static char json[65536], out[8192];
    int rc = run_ctl(json, sizeof(json),
                     "--set train.optimizer=adamw --set train.learning_rate=0.01 "
                     "--set train.weight_decay=0.01");
    ck_assert_msg(rc == 0 && has_text(json, "\"state\":\"done\""), "rc %d: %s", rc, json);
    ck_assert_msg(json_number(json, "test_accuracy") > 0.95, "%s", json);
    char ckpt[1024];
    const char *at = strstr(json, "\"checkpoint\":\"");
    ck_assert_ptr_nonnull(at);
    at += strlen("\"checkpoint\":\"");
    size_t len = strcspn(at, "\"");
    ck_assert_uint_lt(len, sizeof(ckpt));
    memcpy(ckpt, at, len);
    ckpt[len] = '\0';
    char args[2400];
    snprintf(args, sizeof(args), "export %s --out %s/res.safetensors", ckpt, test_dir);
    ck_assert_msg(run_omnivorectl(out, sizeof(out), NULL, args) == 0, "%s: %s", args, out);
    /* One epoch from the export with a rate too small to learn much: trained all along. */
    snprintf(args, sizeof(args),
             "--set model.init=%s/res.safetensors --set job.epochs=1 "
             "--set train.learning_rate=0.00001 --set eval.every_epochs=0.25",
             test_dir);
    ck_assert_int_eq(run_ctl(json, sizeof(json), args), 0);
    const char *first = strstr(json, "\"history\":[{\"epoch\":0.25");
    ck_assert_msg(first != NULL, "%s", json);
    ck_assert_msg(json_number(first, "test_accuracy") > 0.95, "%s", json);
}
END_TEST

START_TEST(test_train_groups_lockstep)
{
    write_job(2, 4, "groups = 2\nstaleness = 0");
    check_trained("");
}
END_TEST

START_TEST(test_train_groups_unbounded)
{
    write_job(2, 4, "groups = 1\nstaleness = none");
    /* Overrides on the command line reach the daemon too. */
    check_trained("--set cluster.groups=2 --set cluster.staleness=none");
}
END_TEST

/* Whether one of pid's threads is ZeroMQ's (the last threads a worker starts). */
static int zmq_started(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_msg(dir != NULL, "no %s", path);
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(dir)) != NULL) {
        char comm_path[300], comm[32] = "";
        snprintf(comm_path, sizeof(comm_path), "%s/%s/comm", path, e->d_name);
        FILE *f = fopen(comm_path, "r");
        if (f == NULL)
            continue;
        found = fgets(comm, sizeof(comm), f) != NULL && strncmp(comm, "ZMQbg", 5) == 0;
        fclose(f);
    }
    closedir(dir);
    return found;
}

/* The nice value in a /proc stat file (field 19; the name before it may hold spaces). */
static int stat_nice(const char *stat_path)
{
    char line[1024];
    FILE *f = fopen(stat_path, "r");
    if (f == NULL)
        return INT_MIN; /* a thread that just ended */
    size_t len = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[len] = '\0';
    const char *p = strrchr(line, ')');
    ck_assert_ptr_nonnull(p);
    /* After ") ": field 3 (the state), then 4 to 19. */
    p += 2;
    for (int field = 3; field < 19 && *p; field++) {
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
    }
    return (int)strtol(p, NULL, 10);
}

/* The nice value of every thread of pid, each into nice[cap], once ZeroMQ's threads are there
 * (fails after 10 s without them). Returns how many were read. */
static int thread_nices(pid_t pid, int *nice, int cap)
{
    int64_t deadline = omv_time_ms() + 10000;
    while (!zmq_started(pid)) {
        ck_assert_msg(omv_time_ms() < deadline, "pid %d started no ZeroMQ thread", (int)pid);
        sleep_ms(10);
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    ck_assert_msg(dir != NULL, "no %s", path);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL && n < cap) {
        char stat_path[300];
        snprintf(stat_path, sizeof(stat_path), "%s/%s/stat", path, e->d_name);
        int v = e->d_name[0] == '.' ? INT_MIN : stat_nice(stat_path);
        if (v != INT_MIN)
            nice[n++] = v;
    }
    closedir(dir);
    return n;
}

/* An evaluator takes only the CPU the trainers leave: every thread of it (ZeroMQ's own too) at
 * nice 19, a trainer at ours; and --nice sets a trainer's. */
START_TEST(test_evaluator_nice)
{
    write_job(1, 200, "groups = 1");
    pid_t d = start_daemon();
    pid_t w = start_worker("trainer");
    pid_t e = start_worker("evaluator");
    ck_assert_double_ge(wait_status("step", 5, 30000), 5);
    ck_assert_double_eq(wait_status("evaluator_alive", 1, 10000), 1);
    int ours = getpriority(PRIO_PROCESS, 0), nices[64];
    int n = thread_nices(e, nices, 64);
    ck_assert_msg(n >= 2, "the evaluator has %d threads; ZeroMQ's are missing", n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(nices[i] == 19, "evaluator thread %d of %d at nice %d, not 19", i + 1, n,
                      nices[i]);
    n = thread_nices(w, nices, 64);
    for (int i = 0; i < n; i++)
        ck_assert_msg(nices[i] == ours, "trainer thread %d at nice %d, not ours (%d)", i + 1,
                      nices[i], ours);
    stop_workers((pid_t[]){w, e}, 2);
    shutdown_daemon(d);

    /* With no daemon to answer, it keeps saying hello: long enough to look. */
    char *argv[] = {(char *)bin("OMNIVORE_WORKER"),
                    "--server",
                    endpoint,
                    "--nice",
                    "7",
                    "--log-level",
                    "error",
                    NULL};
    w = spawn(argv);
    n = thread_nices(w, nices, 64);
    /* Below ours takes privilege; without it the worker warns and keeps ours. */
    int want = ours <= 7 || geteuid() == 0 ? 7 : ours;
    for (int i = 0; i < n; i++)
        ck_assert_msg(nices[i] == want, "--nice 7: trainer thread %d of %d at nice %d, not %d",
                      i + 1, n, nices[i], want);
    stop_workers(&w, 1);
}
END_TEST

START_TEST(test_broken_job_file)
{
    write_job(2, 4, "groups = 1\nbogus_key = 3");
    static char out[4096];
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s run %s 2>&1", bin("OMNIVORECTL"), job_path);
    FILE *p = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    ck_assert_int_eq(WEXITSTATUS(status), 2);
    ck_assert_msg(has_text(out, "job.ini:20: [cluster] bogus_key: unknown key"), "got: %s", out);
}
END_TEST

START_TEST(test_long_step_not_dead)
{
    /* A trainer sends a heartbeat between its layers when one is due: a step longer than
     * worker_timeout_s (3 s here; 15 layers of 1536 at 2048 images take several seconds, each
     * layer well under one) is not a dead worker, and the job trains to its end. */
    model_section = "layers = 64 1536 1536 1536 1536 1536 1536 1536 1536 1536 1536 1536 1536 "
                    "1536 1536 4";
    write_job(1, 1, "groups = 1\nstaleness = none\n[data]\ntrain_limit = 4096");
    static char json[65536];
    int rc = run_ctl(json, sizeof(json),
                     "--workers 1 --set train.batch_size=2048 --set cluster.worker_timeout_s=3");
    static char log[1 << 16];
    read_run_log(log, sizeof(log));
    const char *dead = strstr(log, "declared dead");
    ck_assert_msg(dead == NULL, "%.250s", dead == NULL ? "" : dead - log > 150 ? dead - 150 : log);
    ck_assert_msg(rc == 0 && has_text(json, "\"state\":\"done\""), "%.2000s", json);
    double images = json_number(json, "images_total");
    ck_assert_msg(images == 4096, "images: %s", json);
    /* It shows something only where a step outlasts the timeout: the trainer's own figure. */
    const char *per = strstr(log, "steps; per step ");
    ck_assert_msg(per != NULL, "no step figures in the log");
    double step_ms = atof(per + strlen("steps; per step "));
    if (step_ms <= 3000)
        fprintf(stderr,
                "test_long_step_not_dead: a step computed in %.0f ms, no longer than the "
                "timeout: a larger model is needed on this machine\n",
                step_ms);
    model_section = "layers = 64 32 4";
}
END_TEST

START_TEST(test_worker_killed)
{
    write_job(2, 200, "groups = 1");
    pid_t d = start_daemon();
    pid_t w1 = start_worker("trainer");
    pid_t w2 = start_worker("trainer");
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    int64_t deadline = omv_time_ms() + 30000;
    for (;;) {
        ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 5000), 0);
        if (field(omv_strbuf_str(&body), "step") >= 20)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "training did not start: %s",
                      omv_strbuf_str(&body));
        sleep_ms(20);
    }
    kill(w1, SIGKILL);
    waitpid(w1, NULL, 0);
    /* The daemon answers at once, and declares the worker dead within its timeout. */
    ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 2000), 0);
    double step_at_kill = field(omv_strbuf_str(&body), "step");
    deadline = omv_time_ms() + 15000;
    for (;;) {
        ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 2000), 0);
        if (field(omv_strbuf_str(&body), "workers_alive") == 1)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "dead worker not noticed: %s",
                      omv_strbuf_str(&body));
        sleep_ms(50);
    }
    /* The survivor's group no longer waits for the dead one: steps go on. */
    deadline = omv_time_ms() + 15000;
    for (;;) {
        ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 2000), 0);
        if (field(omv_strbuf_str(&body), "step") > step_at_kill + 20)
            break;
        ck_assert_msg(omv_time_ms() < deadline, "training stalled: %s", omv_strbuf_str(&body));
        sleep_ms(50);
    }
    ck_assert_int_eq(omv_control_request(sock_path, "workers", &body, 2000), 0);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "state:dead"), "%s", omv_strbuf_str(&body));
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    ck_assert_int_eq(omv_control_request(sock_path, "shutdown", &body, 2000), 0);
    int status;
    ck_assert_int_eq(waitpid(d, &status, 0), d);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The job was not over: the survivor waits for a daemon to come back rather than exit. */
    sleep_ms(300);
    ck_assert_int_eq(waitpid(w2, &status, WNOHANG), 0);
    /* SIGTERM ends it cleanly. */
    kill(w2, SIGTERM);
    ck_assert_int_eq(waitpid(w2, &status, 0), w2);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    omv_strbuf_fini(&body);
}
END_TEST

/* The daemon's resident memory in kB, its open files, and its mappings of workers' shared
 * segments (the model's own segment, the job's, is not one of them). */
static void daemon_usage(pid_t d, long *rss_kb, int *fds, int *segments)
{
    char path[64], line[512];
    *rss_kb = proc_kib(d, "VmRSS");
    FILE *f;
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)d);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    *segments = 0;
    while (fgets(line, sizeof(line), f))
        *segments +=
            strstr(line, "memfd:omnivore") != NULL && strstr(line, "memfd:omnivore-model") == NULL;
    fclose(f);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)d);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(fscanf(p, "%d", fds), 1);
    pclose(p);
}

START_TEST(test_shm_sigkill_leaves_nothing)
{
    /* Workers on the daemon's host get shared segments; one killed with SIGKILL is declared
     * dead at once (its connection closes with its process) and leaves nothing behind: after
     * 100 such deaths beside a worker that stays, the daemon has the stayer's two segments
     * mapped and no more, no file more open, no more memory than after the first few (a model
     * of 2 x 140 KB segments: a leak would show as 28 MB), and the job goes on. */
    model_section = "layers = 64 512 4";
    write_job(1, 10000, "groups = 1");
    model_section = "layers = 64 32 4";
    pid_t d = start_daemon();
    pid_t stayer = start_worker("trainer");
    wait_status("step", 1, 20000); /* training, through its segments */
    long rss0 = 0;
    int fds0 = 0, seg0 = 0;
    for (int i = 0; i < 100; i++) {
        pid_t w = start_worker("trainer");
        wait_status("shm_attached_total", i + 2, 20000);
        kill(w, SIGKILL);
        ck_assert_int_eq(waitpid(w, NULL, 0), w);
        wait_status("shm_gone_total", i + 1, 5000);
        if (i == 4)
            daemon_usage(d, &rss0, &fds0, &seg0);
    }
    ck_assert_int_eq(seg0, 2);
    long rss;
    int fds, seg;
    daemon_usage(d, &rss, &fds, &seg);
    ck_assert_msg(seg == 2, "%d shared segments mapped after 100 deaths (the stayer's 2)", seg);
    ck_assert_msg(fds == fds0, "%d open files after 100 deaths, %d after 5", fds, fds0);
    ck_assert_msg(rss < rss0 + 8192, "resident %ld kB after 100 deaths, %ld kB after 5", rss, rss0);
    ck_assert_int_eq((int)status_field("shm_workers"), 1);
    ck_assert_int_ge((int)status_field("deaths_total"), 100);
    /* The job lives on. */
    wait_status("step", status_field("step") + 20, 20000);
    stop_workers(&stayer, 1);
    shutdown_daemon(d);
}
END_TEST

START_TEST(test_bad_input)
{
    /* fp32 on the wire: this peer reads the parameters as floats. */
    write_job(1, 2, "groups = 1\nshards = 3\nwire = fp32");
    pid_t d = start_daemon();
    peer_t p;
    peer_open(&p);

    /* Bytes that are no envelope. */
    peer_send_raw(&p, "\xff\xfe garbage", 10, NULL, 0);
    expect_error(&p, OMV_REFUSE_MALFORMED);

    /* Another protocol version. */
    omv_msg_t m = {.type = OMV_MSG_HELLO};
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION + 98;
    omv_strlcpy(m.u.hello.hostname, "test", sizeof(m.u.hello.hostname));
    peer_send(&p, &m, NULL, 0);
    expect_error(&p, OMV_REFUSE_VERSION);

    /* Register properly. */
    m.u.hello.protocol_version = OMV_PROTOCOL_VERSION;
    peer_send(&p, &m, NULL, 0);
    static omv_msg_t w;
    peer_recv(&p, &w, NULL, 0);
    ck_assert_int_eq(w.type, OMV_MSG_WELCOME);
    const omv_jobspec_t *j = &w.u.welcome.job;
    uint32_t id = w.u.welcome.worker_id;
    ck_assert_int_eq(j->n_shards, 3);
    size_t n = j->param_count;
    float *before = calloc(n, sizeof(float)), *after = calloc(n, sizeof(float));
    float *grad = calloc(n, sizeof(float));
    pull_model(&p, id, 0, j, before);

    uint32_t c0 = j->shard_offsets[1] - j->shard_offsets[0];
    omv_msg_t push = {.type = OMV_MSG_PUSH};
    /* A payload shorter than announced. */
    push.u.push = (omv_push_t){id, 0, 0, 0, c0, 1.0f, 32, 1.0f, OMV_WIRE_FP32};
    peer_send_raw(&p, "", 0, NULL, 0);
    expect_error(&p, OMV_REFUSE_MALFORMED);
    {
        uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
        size_t len;
        ck_assert_int_eq(omv_wire_encode(&push, buf, sizeof(buf), &len), 0);
        peer_send_raw(&p, buf, len, grad, (c0 - 1) * sizeof(float));
        expect_error(&p, OMV_REFUSE_MALFORMED);
        /* One that says bf16 but carries fp32's bytes, and a wire nobody knows. */
        push.u.push.wire = OMV_WIRE_BF16;
        ck_assert_int_eq(omv_wire_encode(&push, buf, sizeof(buf), &len), 0);
        peer_send_raw(&p, buf, len, grad, c0 * sizeof(float));
        expect_error(&p, OMV_REFUSE_MALFORMED);
        push.u.push.wire = 5;
        ck_assert_int_eq(omv_wire_encode(&push, buf, sizeof(buf), &len), 0);
        peer_send_raw(&p, buf, len, grad, c0 * sizeof(float));
        expect_error(&p, OMV_REFUSE_MALFORMED);
        push.u.push.wire = OMV_WIRE_FP32;
    }
    /* A gradient of the wrong length for its shard. */
    push.u.push.count = c0 + 1;
    peer_send(&p, &push, grad, c0 + 1);
    expect_error(&p, OMV_REFUSE_SHAPE);
    /* An unknown worker. */
    push.u.push.count = c0;
    push.u.push.worker_id = id + 77;
    peer_send(&p, &push, grad, c0);
    expect_error(&p, OMV_REFUSE_UNKNOWN_WORKER);
    /* A step that is not the one expected. */
    push.u.push.worker_id = id;
    push.u.push.step = 5;
    peer_send(&p, &push, grad, c0);
    expect_error(&p, OMV_REFUSE_STEP);
    /* NaN and Inf: refused, and the step completes without touching the model. */
    push.u.push.step = 0;
    grad[3] = NAN;
    grad[4] = INFINITY;
    peer_send(&p, &push, grad, c0);
    expect_error(&p, OMV_REFUSE_NOT_FINITE);
    /* The same shard again is a duplicate. */
    memset(grad, 0, n * sizeof(float));
    peer_send(&p, &push, grad, c0);
    expect_error(&p, OMV_REFUSE_STEP);
    for (uint32_t s = 1; s < j->n_shards; s++) {
        uint32_t off = j->shard_offsets[s], cnt = j->shard_offsets[s + 1] - off;
        grad[off] = NAN; /* every shard's gradient is poisoned */
        push.u.push = (omv_push_t){id, 0, s, off, cnt, 1.0f, 32, 1.0f, OMV_WIRE_FP32};
        peer_send(&p, &push, grad + off, cnt);
        expect_error(&p, OMV_REFUSE_NOT_FINITE);
    }
    /* Step 0 is complete; step 1's model is exactly step 0's. */
    pull_model(&p, id, 1, j, after);
    ck_assert_int_eq(memcmp(before, after, n * sizeof(float)), 0);

    /* Every refusal was counted, and the daemon is up. */
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    ck_assert_int_eq(omv_control_request(sock_path, "status", &body, 2000), 0);
    const char *s = omv_strbuf_str(&body);
    ck_assert_msg(field(s, "refused_malformed_total") == 5, "%s", s);
    ck_assert_msg(field(s, "refused_version_total") == 1, "%s", s);
    ck_assert_msg(field(s, "refused_shape_total") == 1, "%s", s);
    ck_assert_msg(field(s, "refused_unknown_worker_total") == 1, "%s", s);
    ck_assert_msg(field(s, "refused_step_total") == 2, "%s", s);
    ck_assert_msg(field(s, "refused_not_finite_total") == 3, "%s", s);
    /* The latest refusal, whole: the last shard's NaN. */
    char last[128];
    snprintf(last, sizeof(last),
             "\nrefused_last:not_finite from worker %u: gradient of step 0 "
             "shard %u has NaN or Inf values",
             id, j->n_shards - 1);
    ck_assert_msg(has_text(s, last), "%s", s);
    ck_assert_msg(field(s, "backup_refused_total") == 0, "%s", s);
    ck_assert_int_eq(omv_control_request(sock_path, "status --json", &body, 2000), 0);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "\"refused_not_finite_total\":3"), "%s",
                  omv_strbuf_str(&body));
    ck_assert_int_eq(omv_control_request(sock_path, "nonsense", &body, 2000), -EREMOTEIO);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "unknown command"), "%s", omv_strbuf_str(&body));
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);

    ck_assert_int_eq(omv_control_request(sock_path, "shutdown", &body, 2000), 0);
    /* A worker still connected is told the daemon goes away while the job is not over. */
    peer_recv(&p, &m, NULL, 0);
    ck_assert_int_eq(m.type, OMV_MSG_STOP);
    ck_assert_int_eq(m.u.stop.reconnect, 1);
    int status;
    ck_assert_int_eq(waitpid(d, &status, 0), d);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    omv_strbuf_fini(&body);
    peer_close(&p);
    free(before);
    free(after);
    free(grad);
}
END_TEST

START_TEST(test_daemon_sigterm)
{
    write_job(2, 4, "groups = 1");
    pid_t d = start_daemon();
    kill(d, SIGTERM);
    int status;
    ck_assert_int_eq(waitpid(d, &status, 0), d);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The control socket is gone with it. */
    ck_assert_int_eq(access(sock_path, F_OK), -1);
}
END_TEST

/* systemctl reload: SIGHUP re-reads the config file and applies log_level; a broken file
 * changes nothing and the daemon stays up. */
START_TEST(test_daemon_sighup_reload)
{
    write_job(2, 4, "groups = 1");
    char conf[700];
    snprintf(conf, sizeof(conf), "%s/omnivored.conf", test_dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[daemon]\nlog_level = warn\n");
    fclose(f);
    char *argv[] = {(char *)bin("OMNIVORED"),
                    "--once",
                    "--config",
                    conf,
                    "--job",
                    job_path,
                    "--endpoint",
                    endpoint,
                    "--control",
                    sock_path,
                    "--state-dir",
                    test_dir,
                    NULL};
    pid_t d = start_daemon_argv(argv);
    omv_strbuf_t body;
    omv_strbuf_init(&body);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "log_level:warn"), "%s", omv_strbuf_str(&body));
    f = fopen(conf, "w");
    fprintf(f, "[daemon]\nlog_level = debug\n");
    fclose(f);
    kill(d, SIGHUP);
    wait_status("reloads_total", 1, 5000);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "log_level:debug"), "%s", omv_strbuf_str(&body));
    /* A broken file: refused, counted, and nothing changes. */
    f = fopen(conf, "w");
    fprintf(f, "[daemon]\nlog_level = loud\n");
    fclose(f);
    kill(d, SIGHUP);
    wait_status("reloads_failed_total", 1, 5000);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "log_level:debug"), "%s", omv_strbuf_str(&body));
    /* omnivorectl reload, what systemctl reload runs: it answers once the file is applied (no
     * waiting for a counter), and fails with the reason on a broken file. */
    char out[2048];
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "reload"), 1);
    ck_assert_msg(has_text(out, "log_level 'loud' is not error, warn, info or debug"), "%s", out);
    f = fopen(conf, "w");
    fprintf(f, "[daemon]\nlog_level = info\n");
    fclose(f);
    ck_assert_int_eq(ctl_sock(out, sizeof(out), "reload"), 0);
    ck_assert_msg(has_text(out, "log_level:info\nreloads_total:2\n"), "%s", out);
    control("status", &body);
    ck_assert_msg(has_text(omv_strbuf_str(&body), "log_level:info"), "%s", omv_strbuf_str(&body));
    ck_assert_int_eq(waitpid(d, NULL, WNOHANG), 0);
    shutdown_daemon(d);
    omv_strbuf_fini(&body);
}
END_TEST

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("cluster");
    TCase *tc = tcase_create("processes");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_train_sync);
    tcase_add_test(tc, test_train_cnn);
    tcase_add_test(tc, test_train_resnet_adamw_export_init);
    tcase_add_test(tc, test_train_bf16);
    tcase_add_test(tc, test_train_int8);
    tcase_add_test(tc, test_train_int8_groups);
    tcase_add_test(tc, test_train_uneven);
    tcase_add_test(tc, test_overlap_bit_identical);
    tcase_add_test(tc, test_train_groups_lockstep);
    tcase_add_test(tc, test_train_groups_unbounded);
    tcase_add_test(tc, test_evaluator_nice);
    tcase_add_test(tc, test_broken_job_file);
    tcase_add_test(tc, test_worker_killed);
    tcase_add_test(tc, test_long_step_not_dead);
    tcase_add_test(tc, test_shm_sigkill_leaves_nothing);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_daemon_sigterm);
    tcase_add_test(tc, test_daemon_sighup_reload);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
