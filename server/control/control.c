/* Control socket server and client over AF_UNIX stream sockets. */
#define _GNU_SOURCE
#define OMV_LOG_TAG "control"
#include "control.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* How long a client may take to send its line, and to read its answer. */
#define IDLE_MS 2000
#define WRITE_MS 5000

typedef enum { CONN_FREE, CONN_READING, CONN_WAITING, CONN_WRITING } conn_state_t;

/* One client: its line as it comes, then its answer as it goes. */
typedef struct {
    int fd;
    conn_state_t state;
    int64_t deadline_ms; /* when a reading or writing client is given up */
    struct ucred cred;   /* who connected (SO_PEERCRED) */
    size_t len;
    char line[OMV_CONTROL_LINE_MAX];
    omv_strbuf_t out;
    size_t out_off;
} conn_t;

struct omv_control {
    int fd;
    int serving;                            /* the connection being served; -1 outside a handler */
    int deferred[OMV_CONTROL_MAX_DEFERRED]; /* connections waiting for an answer; -1: free */
    conn_t conns[OMV_CONTROL_MAX_CONNS];
    uint64_t refused_total, timeouts_total;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static int make_addr(struct sockaddr_un *addr, const char *path)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr->sun_path))
        return -ENAMETOOLONG;
    memcpy(addr->sun_path, path, strlen(path) + 1);
    return 0;
}

/* A socket file that nobody answers on is left over from a daemon that died: replace it. */
static int bind_listen(int fd, const struct sockaddr_un *addr)
{
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
        if (connect(probe, (const struct sockaddr *)addr, sizeof(*addr)) == 0) {
            close(probe);
            errno = EADDRINUSE;
            return -1;
        }
        close(probe);
    }
    unlink(addr->sun_path);
    mode_t old = umask(0117);
    int r = bind(fd, (const struct sockaddr *)addr, sizeof(*addr));
    umask(old);
    if (r != 0 || listen(fd, 64) != 0)
        return -1;
    return 0;
}

omv_control_t *omv_control_new(const char *path)
{
    struct sockaddr_un addr;
    int r = make_addr(&addr, path);
    if (r < 0) {
        errno = -r;
        return NULL;
    }
    omv_control_t *self = calloc(1, sizeof(*self));
    if (self == NULL)
        return NULL;
    memcpy(self->path, addr.sun_path, sizeof(self->path));
    self->serving = -1;
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++)
        self->deferred[i] = -1;
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++) {
        self->conns[i].fd = -1;
        omv_strbuf_init(&self->conns[i].out);
    }
    self->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (self->fd < 0 || bind_listen(self->fd, &addr) < 0) {
        int e = errno;
        if (self->fd >= 0)
            close(self->fd);
        free(self);
        errno = e;
        return NULL;
    }
    return self;
}

static void conn_close(omv_control_t *self, int i)
{
    conn_t *c = &self->conns[i];
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = CONN_FREE;
    c->len = 0;
    c->out_off = 0;
    omv_strbuf_clear(&c->out);
    if (self->serving == i)
        self->serving = -1;
}

/* Writes what the socket takes now; closes the connection once all is written or the client is
 * gone. */
static void conn_flush(omv_control_t *self, int i)
{
    conn_t *c = &self->conns[i];
    while (c->out_off < c->out.len) {
        ssize_t w = send(c->fd, omv_strbuf_str(&c->out) + c->out_off, c->out.len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w <= 0)
            break;
        c->out_off += (size_t)w;
    }
    conn_close(self, i);
}

/* Queues an answer ("ok\n" and body, or "error: " and body) and starts writing it. */
static void conn_answer(omv_control_t *self, int i, int r, const char *body)
{
    conn_t *c = &self->conns[i];
    omv_strbuf_clear(&c->out);
    if (r < 0)
        omv_strbuf_printf(&c->out, "error: %s\n", body);
    else
        omv_strbuf_printf(&c->out, "ok\n%s", body);
    c->state = CONN_WRITING;
    c->out_off = 0;
    c->deadline_ms = omv_time_ms() + WRITE_MS;
    conn_flush(self, i);
}

void omv_control_destroy(omv_control_t **self_p)
{
    omv_control_t *self = *self_p;
    if (self == NULL)
        return;
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++)
        omv_control_answer(self, i, -ESHUTDOWN, "the daemon is shutting down");
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++) {
        conn_close(self, i);
        omv_strbuf_fini(&self->conns[i].out);
    }
    close(self->fd);
    unlink(self->path);
    free(self);
    *self_p = NULL;
}

int omv_control_pollfds(const omv_control_t *self, struct pollfd *fds, int cap)
{
    int n = 0;
    if (n < cap)
        fds[n++] = (struct pollfd){self->fd, POLLIN, 0};
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS && n < cap; i++) {
        const conn_t *c = &self->conns[i];
        if (c->state == CONN_READING)
            fds[n++] = (struct pollfd){c->fd, POLLIN, 0};
        else if (c->state == CONN_WRITING)
            fds[n++] = (struct pollfd){c->fd, POLLOUT, 0};
    }
    return n;
}

int omv_control_defer(omv_control_t *self)
{
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++) {
        if (self->deferred[i] < 0 && self->serving >= 0) {
            self->deferred[i] = self->serving;
            self->conns[self->serving].state = CONN_WAITING;
            self->serving = -1;
            return i;
        }
    }
    return -EBUSY;
}

void omv_control_answer(omv_control_t *self, int id, int r, const char *body)
{
    if (id < 0 || id >= OMV_CONTROL_MAX_DEFERRED || self->deferred[id] < 0)
        return;
    int i = self->deferred[id];
    self->deferred[id] = -1;
    conn_answer(self, i, r, body);
}

int omv_control_caller(const omv_control_t *self, uid_t *ret_uid, gid_t *ret_gid, pid_t *ret_pid)
{
    if (self->serving < 0)
        return -ENOENT;
    const struct ucred *cr = &self->conns[self->serving].cred;
    *ret_uid = cr->uid;
    *ret_gid = cr->gid;
    *ret_pid = cr->pid;
    return 0;
}

/* Accepts every waiting client there is room for; one past the limit is told so and closed. */
static void accept_all(omv_control_t *self)
{
    for (;;) {
        int fd = accept4(self->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return;
        int i = 0;
        while (i < OMV_CONTROL_MAX_CONNS && self->conns[i].state != CONN_FREE)
            i++;
        if (i == OMV_CONTROL_MAX_CONNS) {
            static const char busy[] = "error: too many control connections at once; try again\n";
            ssize_t w = send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            close(fd);
            self->refused_total++;
            continue;
        }
        conn_t *c = &self->conns[i];
        socklen_t len = sizeof(c->cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) != 0)
            c->cred = (struct ucred){.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
        c->fd = fd;
        c->state = CONN_READING;
        c->len = 0;
        c->deadline_ms = omv_time_ms() + IDLE_MS;
    }
}

/* Splits the line into words and answers it through fn (or leaves it deferred). */
static void handle_line(omv_control_t *self, int i, omv_control_handler_fn fn, void *ctx)
{
    conn_t *c = &self->conns[i];
    char *argv[OMV_CONTROL_MAX_ARGS + 1];
    int argc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(c->line, " \t\r", &save); tok && argc < OMV_CONTROL_MAX_ARGS;
         tok = strtok_r(NULL, " \t\r", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;
    if (argc == 0) {
        conn_answer(self, i, -EINVAL, "empty request; try 'help'");
        return;
    }
    omv_strbuf_t reply;
    omv_strbuf_init(&reply);
    self->serving = i;
    int r = fn(ctx, argc, argv, &reply);
    self->serving = -1;
    if (r != OMV_CONTROL_DEFERRED || c->state != CONN_WAITING)
        conn_answer(self, i, r == OMV_CONTROL_DEFERRED ? 0 : r, omv_strbuf_str(&reply));
    omv_strbuf_fini(&reply);
}

/* Reads what a client has sent; a whole line is answered. */
static void conn_read(omv_control_t *self, int i, omv_control_handler_fn fn, void *ctx)
{
    conn_t *c = &self->conns[i];
    ssize_t n = recv(c->fd, c->line + c->len, sizeof(c->line) - 1 - c->len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(self, i); /* gone before it asked anything */
        return;
    }
    c->len += (size_t)n;
    c->line[c->len] = '\0';
    char *nl = memchr(c->line, '\n', c->len);
    if (nl) {
        *nl = '\0';
        handle_line(self, i, fn, ctx);
    } else if (c->len == sizeof(c->line) - 1) {
        char why[64];
        snprintf(why, sizeof(why), "request longer than %d bytes", OMV_CONTROL_LINE_MAX - 1);
        conn_answer(self, i, -EINVAL, why);
    }
}

void omv_control_serve(omv_control_t *self, const struct pollfd *fds, int nfds,
                       omv_control_handler_fn fn, void *ctx)
{
    for (int k = 0; k < nfds; k++) {
        if (fds[k].revents == 0)
            continue;
        if (fds[k].fd == self->fd) {
            accept_all(self);
            continue;
        }
        for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++) {
            conn_t *c = &self->conns[i];
            if (c->fd != fds[k].fd)
                continue;
            if (c->state == CONN_READING)
                conn_read(self, i, fn, ctx);
            else if (c->state == CONN_WRITING)
                conn_flush(self, i);
            break;
        }
    }
}

void omv_control_expire(omv_control_t *self)
{
    int64_t now = omv_time_ms();
    for (int i = 0; i < OMV_CONTROL_MAX_CONNS; i++) {
        conn_t *c = &self->conns[i];
        if ((c->state != CONN_READING && c->state != CONN_WRITING) || now < c->deadline_ms)
            continue;
        self->timeouts_total++;
        if (c->state == CONN_READING) {
            char why[64];
            snprintf(why, sizeof(why), "no request line within %d ms", IDLE_MS);
            conn_answer(self, i, -ETIMEDOUT, why);
            if (self->conns[i].state == CONN_WRITING)
                self->conns[i].deadline_ms = now; /* one try, no more waiting for it */
        } else {
            conn_close(self, i);
        }
    }
}

void omv_control_counts(const omv_control_t *self, uint64_t *ret_refused, uint64_t *ret_timeouts)
{
    *ret_refused = self->refused_total;
    *ret_timeouts = self->timeouts_total;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

int omv_control_request(const char *path, const char *line, omv_strbuf_t *body, int timeout_ms)
{
    struct sockaddr_un addr;
    int r = make_addr(&addr, path);
    if (r < 0)
        return r;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        r = -errno;
        close(fd);
        return r;
    }
    omv_strbuf_t raw;
    omv_strbuf_init(&raw);
    write_all(fd, line, strlen(line));
    write_all(fd, "\n", 1);
    int64_t deadline = omv_time_ms() + timeout_ms;
    char buf[4096];
    r = 0;
    for (;;) {
        int64_t left = deadline - omv_time_ms();
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, (int)left) == 0) {
            r = -ETIMEDOUT;
            break;
        }
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        omv_strbuf_append(&raw, buf, (size_t)n);
    }
    close(fd);
    if (r == 0) {
        const char *text = omv_strbuf_str(&raw);
        const char *nl = strchr(text, '\n');
        omv_strbuf_clear(body);
        if (strncmp(text, "ok\n", 3) == 0) {
            omv_strbuf_append(body, text + 3, raw.len - 3);
        } else if (strncmp(text, "error: ", 7) == 0) {
            omv_strbuf_append(body, text + 7, nl ? (size_t)(nl - text - 7) : raw.len - 7);
            r = -EREMOTEIO;
        } else {
            r = -EPROTO;
        }
    }
    omv_strbuf_fini(&raw);
    return r;
}
