/* Integration tests of a model over shard servers (see test_servers.c): a shard server lost
 * with no replica (the job fails, or goes back to its last checkpoint), failover to backups
 * (replicas = 2), and backups lost or flooded. Helpers: tests/lib/servers_util.c. */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "cluster_util.h"
#include "control.h"
#include "peer_util.h"
#include "servers_util.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

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

static Suite *servers_failover_suite(void)
{
    Suite *s = suite_create("servers_failover");
    TCase *tc = tcase_create("servers_failover");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    ADD_TEST(tc, test_server_lost_fails_job);
    ADD_TEST(tc, test_server_lost_goes_back);
    ADD_TEST(tc, test_servers_failover);
    ADD_TEST(tc, test_servers_failover_parts_not_shared);
    ADD_TEST(tc, test_servers_failover_slow_steps);
    ADD_TEST(tc, test_servers_backup_lost_with_churn);
    ADD_TEST(tc, test_servers_backup_flooded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(servers_failover_suite());
}
