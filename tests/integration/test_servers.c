/* Integration tests of a model spread over shard servers (omnivored --role shard): the
 * coordinator, the shard servers, trainers and an evaluator as real processes on ipc endpoints
 * in a temporary folder, training generated data. These: the same model as on one daemon,
 * over wires, groups, CURVE and a late evaluator, and what the servers gather and send.
 * Helpers: tests/lib/servers_util.c. */
#include <check.h>
#include <fcntl.h>
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
#include "servers_util.h"
#include "strbuf.h"
#include "testutil.h"
#include "util.h"

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

static Suite *servers_suite(void)
{
    Suite *s = suite_create("servers");
    TCase *tc = tcase_create("servers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    ADD_TEST(tc, test_servers_bit_identical);
    ADD_TEST(tc, test_servers_evaluator_attaches_late);
    ADD_TEST(tc, test_servers_three_fp32);
    ADD_TEST(tc, test_servers_async_groups);
    ADD_TEST(tc, test_servers_over_curve);
    ADD_TEST(tc, test_worker_at_shard_server_refused);
    ADD_TEST(tc, test_servers_init_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(servers_suite());
}
