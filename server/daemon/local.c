/* Shared segments for the trainers on this host (see local.h). */
#define _GNU_SOURCE
#define OMV_LOG_TAG "daemon"
#include "local.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon_priv.h"
#include "log.h"
#include "shm.h"
#include "util.h"

/* How long a connected worker has to say who it is. */
#define HELLO_WAIT_MS 50
/* Connections answered per call, before the loop looks at its other sockets. */
#define ACCEPT_MAX 16

void omv_local_open(omv_local_t *self)
{
    memset(self, 0, sizeof(*self));
    self->fd = omv_shm_listen(self->name);
    if (self->fd < 0) {
        omv_log_warn("no shared memory for workers on this host (%s): they use the socket",
                     omv_strerror(self->fd));
        self->fd = -1;
        self->name[0] = '\0';
    }
}

void omv_local_close(omv_local_t *self)
{
    if (self->fd >= 0)
        close(self->fd);
    self->fd = -1;
}

void omv_local_offer(omv_local_t *self, omv_member_t *m, omv_welcome_t *w)
{
    if (self->fd < 0 || m->role != OMV_ROLE_TRAINER)
        return;
    uint64_t token = omv_random_token(m);
    m->shm_token = token;
    omv_strlcpy(w->shm_socket, self->name, sizeof(w->shm_socket));
    w->shm_token = token;
}

/* Frees m's segments once no shard can still be writing into them. */
static void release(omv_daemon_t *d, omv_member_t *m)
{
    if (m->shm_on && (d->run == NULL || omv_shardset_sync(omv_run_shards(d->run)) == 0))
        omv_members_shm_release(m);
}

/* The member a hello names, when its token is the one offered. */
static omv_member_t *claimant(omv_daemon_t *d, const omv_shm_hello_t *h)
{
    omv_member_t *m = omv_members_get(d->members, h->worker_id);
    if (m == NULL || m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER ||
        m->shm_token == 0 || h->token != m->shm_token || d->run == NULL)
        return NULL;
    return m;
}

/* Makes m's segments and sends them on conn. Returns 0 (conn is m's now) or a negative errno. */
static int hand_over(omv_daemon_t *d, omv_member_t *m, int conn)
{
    size_t bytes = omv_run_shards(d->run)->param_count * sizeof(float);
    void *pm = NULL, *gm = NULL;
    int pf = omv_shm_create(bytes, "omnivore-params", &pm);
    int gf = pf < 0 ? pf : omv_shm_create(bytes, "omnivore-grads", &gm);
    /* Without a model segment (none could be made) the third is the params segment again,
     * and every step's parameters are copies. */
    int model = omv_run_shards(d->run)->model_fd;
    int fds[OMV_SHM_FDS] = {pf, gf, model >= 0 ? model : pf};
    int r = gf < 0 ? gf : omv_shm_send(conn, fds, bytes);
    if (pf >= 0)
        close(pf);
    if (gf >= 0)
        close(gf);
    if (r < 0) {
        omv_shm_unmap(pm, bytes);
        omv_shm_unmap(gm, bytes);
        return r;
    }
    m->shm_on = 1;
    m->shm_conn = conn;
    m->shm_params = pm;
    m->shm_grads = gm;
    m->shm_bytes = bytes;
    m->shm_model = model >= 0;
    m->shm_token = 0; /* used */
    return 0;
}

/* One connection: a hello with the worker's id and token, then its segments. */
static void attach(omv_daemon_t *d, int conn)
{
    omv_shm_hello_t h;
    struct pollfd p = {conn, POLLIN, 0};
    ssize_t n = poll(&p, 1, HELLO_WAIT_MS) == 1 ? recv(conn, &h, sizeof(h), MSG_DONTWAIT) : -1;
    omv_member_t *m = n == (ssize_t)sizeof(h) ? claimant(d, &h) : NULL;
    if (m == NULL) {
        d->local.refused_total++;
        omv_log_warn("refused a request for shared memory: %s",
                     n != (ssize_t)sizeof(h) ? "it did not say who it is"
                                             : "no registered worker has that id and token");
        close(conn);
        return;
    }
    release(d, m);
    int r = hand_over(d, m, conn);
    if (r < 0) {
        omv_log_warn("worker %u: cannot share memory (%s): it uses the socket", h.worker_id,
                     omv_strerror(r));
        close(conn);
        return;
    }
    d->local.attached_total++;
    omv_log_info("worker %u is on this host: its parameters and gradients go through shared "
                 "memory (2 x %zu bytes, and the model's own %s)",
                 h.worker_id, m->shm_bytes, m->shm_model ? "read-only" : "not shared: copies");
}

void omv_local_accept(omv_daemon_t *d)
{
    for (int i = 0; i < ACCEPT_MAX && d->local.fd >= 0; i++) {
        int conn = accept4(d->local.fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            return;
        attach(d, conn);
    }
}

void omv_local_gone(omv_daemon_t *d, uint32_t i)
{
    omv_member_t *m = &d->members->records[i];
    d->local.gone_total++;
    if (m->state == OMV_MEMBER_ALIVE && d->run && !OMV_JOB_OVER(omv_run_state(d->run))) {
        omv_log_warn("worker %u (\"%s\" pid %u) is gone: its process closed its shared "
                     "memory: declared dead",
                     i + 1, m->host, m->pid);
        d->members->deaths_total++;
        omv_run_member_gone(d->run, m, OMV_MEMBER_DEAD);
    }
    release(d, m);
}

int omv_local_pollfds(const omv_daemon_t *d, struct pollfd *fds, uint32_t *who, int cap)
{
    int n = 0;
    for (uint32_t i = 0; i < d->members->n && n < cap; i++)
        if (d->members->records[i].shm_on) {
            fds[n] = (struct pollfd){d->members->records[i].shm_conn, POLLIN, 0};
            who[n++] = i;
        }
    return n;
}
