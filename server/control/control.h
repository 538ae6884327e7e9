/* The control socket: a Unix stream socket where a client writes one request line and reads
 * the reply until the daemon closes the connection. The reply's first line is "ok" or
 * "error: <what to do>"; the rest is the body (key:value sections, or JSON with --json). */
#pragma once

#include <poll.h>
#include <stdint.h>
#include <sys/types.h>

#include "strbuf.h"

#define OMV_CONTROL_LINE_MAX 4096
#define OMV_CONTROL_MAX_ARGS 40
/* Clients connected at once; one more is answered "too many" and closed. A client has 2 s to
 * send its line and 5 s to read its answer. */
#define OMV_CONTROL_MAX_CONNS 32
/* The most sockets omv_control_pollfds returns. */
#define OMV_CONTROL_POLL_MAX (1 + OMV_CONTROL_MAX_CONNS)

typedef struct omv_control omv_control_t;

/* Handles one request (argv words); writes the body into reply. Returns 0 for "ok" or a
 * negative errno with the error text in reply. */
typedef int (*omv_control_handler_fn)(void *ctx, int argc, char **argv, omv_strbuf_t *reply);

/* Binds and listens at path (mode 0660); a stale socket left by a dead daemon is replaced, a
 * live one is refused with -EADDRINUSE. Returns NULL with errno set. */
omv_control_t *omv_control_new(const char *path);
/* Closes and unlinks the socket. */
void omv_control_destroy(omv_control_t **self_p);

/* The sockets to poll, into fds[cap] (events set): the listening one and every client that is
 * sending its line (POLLIN) or reading its answer (POLLOUT). Returns how many. */
int omv_control_pollfds(const omv_control_t *self, struct pollfd *fds, int cap);

/* Handles what poll found on fds[nfds] (from omv_control_pollfds, revents set) without ever
 * waiting: accepts clients, reads their lines, answers a whole line through fn (unless fn
 * deferred it with omv_control_defer and returned OMV_CONTROL_DEFERRED) and writes answers as
 * the clients take them. A slow or idle client holds up nobody. */
void omv_control_serve(omv_control_t *self, const struct pollfd *fds, int nfds,
                       omv_control_handler_fn fn, void *ctx);

/* Gives up clients past their time (call periodically): one that sent no line is told so. */
void omv_control_expire(omv_control_t *self);

/* Clients refused for being too many, and clients given up for being slow, so far. */
void omv_control_counts(const omv_control_t *self, uint64_t *ret_refused, uint64_t *ret_timeouts);

/* From inside a handler: who the client being served is (SO_PEERCRED). Returns 0, or -ENOENT
 * outside a handler. */
int omv_control_caller(const omv_control_t *self, uid_t *ret_uid, gid_t *ret_gid, pid_t *ret_pid);

/* A handler returns this after omv_control_defer: it answers later. */
#define OMV_CONTROL_DEFERRED 1
/* Connections whose answers wait at once; a handler past this many answers at once. */
#define OMV_CONTROL_MAX_DEFERRED 16

/* From inside a handler: keeps the client being served open, to be answered later with
 * omv_control_answer. Returns its id (>= 0), or -EBUSY when too many wait already. */
int omv_control_defer(omv_control_t *self);

/* Answers deferred client id as a handler would have (r: 0 or a negative errno with the error
 * text in body) and closes it. An id that is not waiting is ignored. */
void omv_control_answer(omv_control_t *self, int id, int r, const char *body);

/* Client: sends line to the daemon at path and reads the whole reply into body (status line
 * removed). Returns 0 for ok, -EREMOTEIO for an error reply (its text in body), or a negative
 * errno when the daemon cannot be reached (-ENOENT, -ECONNREFUSED, -ETIMEDOUT). */
int omv_control_request(const char *path, const char *line, omv_strbuf_t *body, int timeout_ms);
