/* Shared segments over an abstract unix socket (see shm.h). */
#define _GNU_SOURCE
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util.h"

/* An abstract address: sun_path[0] is NUL, the name follows (not NUL-terminated). */
static socklen_t abstract_addr(struct sockaddr_un *a, const char *name)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, sizeof(a->sun_path) - 1);
    memcpy(a->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int omv_shm_listen(char *name)
{
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
        nonce = (uint64_t)omv_time_ms() ^ ((uint64_t)getpid() << 32);
    snprintf(name, OMV_WIRE_SHM_NAME_MAX, "omnivore-shm-%d-%016llx", (int)getpid(),
             (unsigned long long)nonce);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, name);
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 64) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010 /* Linux 5.1 */
#endif

/* A memfd of bytes, mapped writable into *ret_map; seals (F_SEAL_*, 0: none) are added once
 * it is mapped. Returns its fd or a negative errno. */
static int create(size_t bytes, const char *what, int seals, void **ret_map)
{
    int fd = memfd_create(what, MFD_CLOEXEC | (seals ? MFD_ALLOW_SEALING : 0));
    if (fd < 0)
        return -errno;
    void *map = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0)
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED && seals && fcntl(fd, F_ADD_SEALS, seals) != 0) {
        int e = errno;
        munmap(map, bytes);
        map = MAP_FAILED;
        errno = e;
    }
    if (map == MAP_FAILED) {
        int e = -errno;
        close(fd);
        return e;
    }
    *ret_map = map;
    return fd;
}

int omv_shm_create(size_t bytes, const char *what, void **ret_map)
{
    return create(bytes, what, 0, ret_map);
}

int omv_shm_create_model(size_t bytes, void **ret_map)
{
    /* Our mapping stays writable; any made after the seals cannot be, nor the size change. */
    return create(bytes, "omnivore-model",
                  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL, ret_map);
}

int omv_shm_send(int conn, const int fds[OMV_SHM_FDS], size_t bytes)
{
    omv_shm_answer_t ans = {bytes};
    struct iovec iov = {&ans, sizeof(ans)};
    union {
        char buf[CMSG_SPACE(OMV_SHM_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(OMV_SHM_FDS * sizeof(int));
    memcpy(CMSG_DATA(c), fds, OMV_SHM_FDS * sizeof(int));
    return sendmsg(conn, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(ans) ? 0 : -errno;
}

/* Waits up to timeout_ms for conn to be readable. Returns 0 or -ETIMEDOUT / -errno. */
static int wait_readable(int conn, int timeout_ms)
{
    struct pollfd p = {conn, POLLIN, 0};
    int n = poll(&p, 1, timeout_ms);
    return n > 0 ? 0 : n == 0 ? -ETIMEDOUT : -errno;
}

/* Receives the answer and its fds. Returns 0 or a negative errno. */
static int recv_answer(int conn, omv_shm_answer_t *ans, int *fds)
{
    struct iovec iov = {ans, sizeof(*ans)};
    union {
        char buf[CMSG_SPACE(OMV_SHM_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0)
        return -errno;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (n != (ssize_t)sizeof(*ans) || c == NULL || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(OMV_SHM_FDS * sizeof(int))) {
        if (c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k && i < OMV_SHM_FDS; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                close(fd);
            }
        }
        return n == 0 ? -ECONNRESET : -EPROTO;
    }
    memcpy(fds, CMSG_DATA(c), OMV_SHM_FDS * sizeof(int));
    return 0;
}

int omv_shm_attach(const char *name, const omv_shm_hello_t *hello, size_t want, int timeout_ms,
                   omv_shm_maps_t *ret, char *why)
{
    int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (conn < 0)
        return -errno;
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, name);
    int r = 0, fds[OMV_SHM_FDS] = {-1, -1, -1};
    omv_shm_answer_t ans;
    const char *step = "";
    if (connect(conn, (struct sockaddr *)&a, len) != 0) {
        r = -errno;
        step = "connect";
    } else if (send(conn, hello, sizeof(*hello), MSG_NOSIGNAL) != (ssize_t)sizeof(*hello)) {
        r = -errno;
        step = "send";
    } else if ((r = wait_readable(conn, timeout_ms)) < 0) {
        step = "wait for the answer";
    } else if ((r = recv_answer(conn, &ans, fds)) < 0) {
        step = "receive";
    } else if (ans.bytes != want) {
        r = -EPROTO;
        step = "size";
    }
    void *p = MAP_FAILED, *g = MAP_FAILED, *model = MAP_FAILED;
    if (r == 0) {
        step = "map";
        p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
        g = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
        model = mmap(NULL, want, PROT_READ, MAP_SHARED, fds[2], 0);
        if (p == MAP_FAILED || g == MAP_FAILED || model == MAP_FAILED)
            r = -errno;
    }
    for (int i = 0; i < OMV_SHM_FDS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (r < 0) {
        void *maps[3] = {p, g, model};
        for (int i = 0; i < 3; i++)
            if (maps[i] != MAP_FAILED)
                munmap(maps[i], want);
        close(conn);
        if (r == -EPROTO && strcmp(step, "size") == 0)
            snprintf(why, OMV_WIRE_REASON_MAX, "segments of %llu bytes, the model needs %zu",
                     (unsigned long long)ans.bytes, want);
        else
            snprintf(why, OMV_WIRE_REASON_MAX, "%s: %s", step, omv_strerror(r));
        return r;
    }
    *ret = (omv_shm_maps_t){p, g, model};
    return conn;
}

int omv_shm_send_raw(int conn, const void *env, size_t len)
{
    ssize_t n = send(conn, env, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == (ssize_t)len ? 0 : n < 0 ? -errno : -EMSGSIZE;
}

int omv_shm_batch_add(omv_shm_batch_t *b, const omv_msg_t *msg)
{
    size_t len;
    if (omv_wire_payload_count(msg) != 0)
        return -EINVAL;
    if (b->n == OMV_SHM_BATCH_MAX || b->used + OMV_SHM_ENVELOPE_MAX > sizeof(b->buf))
        return -ENOSPC;
    int r = omv_wire_encode(msg, b->buf + b->used, OMV_SHM_ENVELOPE_MAX, &len);
    if (r < 0)
        return r;
    b->len[b->n++] = (uint32_t)len;
    b->used += (uint32_t)len;
    return 0;
}

int omv_shm_batch_flush(int conn, omv_shm_batch_t *b)
{
    if (b->n == 0)
        return 0;
    struct mmsghdr mm[OMV_SHM_BATCH_MAX];
    struct iovec iov[OMV_SHM_BATCH_MAX];
    size_t at = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        iov[i] = (struct iovec){b->buf + at, b->len[i]};
        mm[i] = (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[i], .msg_iovlen = 1}};
        at += b->len[i];
    }
    int sent = sendmmsg(conn, mm, b->n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0)
        return -errno;
    size_t gone = 0;
    for (int i = 0; i < sent; i++)
        gone += b->len[i];
    memmove(b->buf, b->buf + gone, b->used - gone);
    memmove(b->len, b->len + sent, (b->n - (uint32_t)sent) * sizeof(b->len[0]));
    b->n -= (uint32_t)sent;
    b->used -= (uint32_t)gone;
    return sent;
}

int omv_shm_recv_msg(int conn, omv_msg_t *ret, char *why)
{
    uint8_t buf[OMV_SHM_ENVELOPE_MAX];
    /* MSG_TRUNC: the record's whole length, even when it does not fit (the rest is dropped). */
    ssize_t n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
    /* A peer that closes with records of ours unread resets the connection, and the kernel
     * tells the reset first (once), before the records the peer sent ahead of its close: a
     * worker's Leave, then its exit, would look like a death. Read on: what was sent comes,
     * then the end. */
    if (n < 0 && errno == ECONNRESET)
        n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    if (n == 0)
        return -ECONNRESET;
    if ((size_t)n > sizeof(buf)) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "an envelope of %zd bytes on the shared-memory connection (at most %d)", n,
                 OMV_SHM_ENVELOPE_MAX);
        return -EPROTO;
    }
    int r = omv_wire_decode(buf, (size_t)n, ret, why);
    if (r < 0)
        return r;
    if (omv_wire_payload_count(ret) != 0) {
        snprintf(why, OMV_WIRE_REASON_MAX,
                 "%s on the shared-memory connection announces %u values: only envelopes go "
                 "that way",
                 omv_msg_name(ret->type), omv_wire_payload_count(ret));
        return -EPROTO;
    }
    return 0;
}

void omv_shm_unmap(void *map, size_t bytes)
{
    if (map)
        munmap(map, bytes);
}
