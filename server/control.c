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

struct omv_control {
    int fd;
    int serving;                            /* the client being served; -1 outside a handler */
    int deferred[OMV_CONTROL_MAX_DEFERRED]; /* clients waiting for an answer; -1: free */
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
    self->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (self->fd < 0)
        goto fail;
    /* A socket file that nobody answers on is left over from a daemon that died: replace it. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
        if (connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
            close(probe);
            errno = EADDRINUSE;
            goto fail;
        }
        close(probe);
    }
    unlink(path);
    mode_t old = umask(0117);
    r = bind(self->fd, (struct sockaddr *)&addr, sizeof(addr));
    umask(old);
    if (r != 0 || listen(self->fd, 16) != 0)
        goto fail;
    return self;
fail : {
    int e = errno;
    if (self->fd >= 0)
        close(self->fd);
    free(self);
    errno = e;
    return NULL;
}
}

void omv_control_destroy(omv_control_t **self_p)
{
    omv_control_t *self = *self_p;
    if (self == NULL)
        return;
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++)
        omv_control_answer(self, i, -ESHUTDOWN, "the daemon is shutting down");
    close(self->fd);
    unlink(self->path);
    free(self);
    *self_p = NULL;
}

int omv_control_fd(const omv_control_t *self)
{
    return self->fd;
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

int omv_control_defer(omv_control_t *self)
{
    for (int i = 0; i < OMV_CONTROL_MAX_DEFERRED; i++) {
        if (self->deferred[i] < 0 && self->serving >= 0) {
            /* The answer may come after the 1 s send timeout would matter: no harm, it is
             * written in one go when it comes. */
            self->deferred[i] = self->serving;
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
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    if (r < 0)
        omv_strbuf_printf(&out, "error: %s\n", body);
    else
        omv_strbuf_printf(&out, "ok\n%s", body);
    write_all(self->deferred[id], omv_strbuf_str(&out), out.len);
    close(self->deferred[id]);
    self->deferred[id] = -1;
    omv_strbuf_fini(&out);
}

void omv_control_serve(omv_control_t *self, omv_control_handler_fn fn, void *ctx)
{
    int fd = accept4(self->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    /* A client gets one second to send its line, so a stuck one cannot stall the daemon. */
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    char line[OMV_CONTROL_LINE_MAX];
    size_t len = 0;
    int complete = 0;
    while (len < sizeof(line) - 1) {
        ssize_t n = recv(fd, line + len, sizeof(line) - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (memchr(line, '\n', len)) {
            complete = 1;
            break;
        }
    }
    line[len] = '\0';
    omv_strbuf_t reply, out;
    omv_strbuf_init(&reply);
    omv_strbuf_init(&out);
    char *nl = strchr(line, '\n');
    if (nl)
        *nl = '\0';
    if (!complete && len == sizeof(line) - 1) {
        omv_strbuf_printf(&out, "error: request longer than %d bytes\n", OMV_CONTROL_LINE_MAX - 1);
    } else {
        char *argv[OMV_CONTROL_MAX_ARGS + 1];
        int argc = 0;
        char *save = NULL;
        for (char *tok = strtok_r(line, " \t\r", &save); tok && argc < OMV_CONTROL_MAX_ARGS;
             tok = strtok_r(NULL, " \t\r", &save))
            argv[argc++] = tok;
        argv[argc] = NULL;
        if (argc == 0) {
            omv_strbuf_printf(&out, "error: empty request; try 'help'\n");
        } else {
            self->serving = fd;
            int r = fn(ctx, argc, argv, &reply);
            self->serving = -1;
            if (r == OMV_CONTROL_DEFERRED) {
                omv_strbuf_fini(&reply);
                omv_strbuf_fini(&out);
                return;
            }
            if (r < 0)
                omv_strbuf_printf(&out, "error: %s\n", omv_strbuf_str(&reply));
            else
                omv_strbuf_printf(&out, "ok\n%s", omv_strbuf_str(&reply));
        }
    }
    write_all(fd, omv_strbuf_str(&out), out.len);
    close(fd);
    omv_strbuf_fini(&reply);
    omv_strbuf_fini(&out);
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
