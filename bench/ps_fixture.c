/* bench_ps's fixtures: child processes (the daemon under test, the raw echo server), the
 * daemon's control socket, and the generated job and data files. */
#include "ps_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "util.h"

/* ---- children ---- */

pid_t bench_spawn(char *const argv[], const char *log_path)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

int bench_stop(pid_t pid, int timeout_ms)
{
    if (pid <= 0)
        return 0;
    kill(pid, SIGTERM);
    int64_t deadline = omv_time_ms() + timeout_ms;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR)
            return 0;
        if (omv_time_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int bench_alive(pid_t pid)
{
    int status;
    return waitpid(pid, &status, WNOHANG) == 0;
}

int bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = -EADDRNOTAVAIL;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* ---- the raw echo server ---- */

static volatile sig_atomic_t echo_stop;

static void on_echo_signal(int sig)
{
    (void)sig;
    echo_stop = 1;
}

int bench_echo_main(const char *endpoint, int ready_fd)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_echo_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
    /* A signal that lands while libzmq handles a peer's connect or disconnect does not interrupt
     * the wait that follows; a receive timeout makes sure the flag is seen within 100 ms. */
    int timeout_ms = 100;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
    if (zmq_bind(s, endpoint) != 0) {
        fprintf(stderr, "bench_ps echo: cannot bind %s: %s\n", endpoint, zmq_strerror(errno));
        zmq_close(s);
        zmq_ctx_term(ctx);
        return 1;
    }
    if (write(ready_fd, "r", 1) != 1)
        return 1;
    close(ready_fd);
    zmq_msg_t f;
    zmq_msg_init(&f);
    while (!echo_stop) {
        int more = 1;
        while (more && !echo_stop) {
            if (zmq_msg_recv(&f, s, 0) < 0) {
                if (errno == EINTR || errno == EAGAIN)
                    continue;
                echo_stop = 1;
                break;
            }
            more = zmq_msg_more(&f);
            zmq_msg_send(&f, s, more ? ZMQ_SNDMORE : 0);
        }
    }
    zmq_msg_close(&f);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 0;
}

/* ---- the daemon's control socket ---- */

int bench_control(const char *path, const char *command, omv_strbuf_t *out)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    if (omv_strlcpy(a.sun_path, path, sizeof(a.sun_path)) < 0)
        return -ENAMETOOLONG;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int r = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        r = -errno;
        goto out;
    }
    char req[256];
    int len = snprintf(req, sizeof(req), "%s\n", command);
    if (len < 0 || (size_t)len >= sizeof(req) || send(fd, req, (size_t)len, MSG_NOSIGNAL) != len) {
        r = -EIO;
        goto out;
    }
    char buf[4096];
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0) {
            r = -ETIMEDOUT;
            goto out;
        }
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        omv_strbuf_append(out, buf, (size_t)n);
    }
    if (strncmp(omv_strbuf_str(out), "ok\n", 3) != 0)
        r = -EPROTO;
out:
    close(fd);
    return r;
}

long long bench_json_int(const char *text, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(text, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

long long bench_json_array_sum(const char *text, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":[", key);
    const char *p = strstr(text, pat);
    if (p == NULL)
        return -1;
    p += strlen(pat);
    long long sum = 0;
    while (*p && *p != ']') {
        char *end;
        sum += strtoll(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p != ']')
            return -1;
    }
    return sum;
}

/* ---- generated job and data ---- */

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

int bench_write_idx(const char *images, const char *labels, uint32_t count, uint32_t cols)
{
    uint8_t head[16] = {0, 0, 8, 3};
    be32(head + 4, count);
    be32(head + 8, 1);
    be32(head + 12, cols);
    uint8_t lhead[8] = {0, 0, 8, 1};
    be32(lhead + 4, count);
    size_t n = (size_t)count * cols;
    uint8_t *px = calloc(n > count ? n : count, 1);
    if (px == NULL)
        return -ENOMEM;
    int ok = 0;
    FILE *f = fopen(images, "wb");
    if (f) {
        ok = fwrite(head, 1, 16, f) == 16 && fwrite(px, 1, n, f) == n;
        ok = fclose(f) == 0 && ok;
    }
    f = ok ? fopen(labels, "wb") : NULL;
    if (f) {
        ok = fwrite(lhead, 1, 8, f) == 8 && fwrite(px, 1, count, f) == count;
        ok = fclose(f) == 0 && ok;
    } else {
        ok = 0;
    }
    free(px);
    return ok ? 0 : -EIO;
}

int bench_write_job(const char *path, const bench_job_t *job)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -errno;
    fprintf(f,
            "; generated by bench_ps\n"
            "[job]\nname = %s\nepochs = 10000\nseed = 1\n"
            "[model]\nlayers = %u %u\n"
            "[data]\ntrain_images = %s\ntrain_labels = %s\ntest_images = %s\ntest_labels = %s\n"
            "[train]\nbatch_size = 1\nlearning_rate = 0.01\nmomentum = 0.9\nweight_decay = 0\n"
            "[cluster]\nworkers = %d\ngroups = %d\nstaleness = none\nshards = %d\nwire = fp32\n"
            "servers = %d\nworker_timeout_s = 3600\n"
            "[eval]\nevery_epochs = 0\nprogress_interval_s = 3600\n"
            "[checkpoint]\nevery_s = 0\nresume = no\n",
            job->name, job->in, job->out, job->images, job->labels, job->images, job->labels,
            job->workers, job->workers, job->shards, job->servers);
    return fclose(f) == 0 ? 0 : -EIO;
}

void bench_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            bench_remove_dir(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}
