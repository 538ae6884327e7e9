/* Integration tests of a model over shard servers (see test_servers.c): checkpoints as
 * consistent cuts and their parts, a coordinator that restarts from one, and the changes
 * made at a cut (a trainer that joins, a regroup, the optimizer's), down to a job that ends
 * during a cut. Helpers: tests/lib/servers_util.c. */
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
#include "servers_util.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

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

static Suite *servers_cuts_suite(void)
{
    Suite *s = suite_create("servers_cuts");
    TCase *tc = tcase_create("servers_cuts");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    ADD_TEST(tc, test_servers_checkpoint_is_a_cut);
    ADD_TEST(tc, test_servers_parts_not_shared);
    ADD_TEST(tc, test_servers_trainer_dies);
    ADD_TEST(tc, test_coordinator_restart_resumes);
    ADD_TEST(tc, test_servers_end_during_cut);
    ADD_TEST(tc, test_servers_regroup);
    ADD_TEST(tc, test_servers_optimizer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(servers_cuts_suite());
}
