/* The control socket: a Unix stream socket where a client writes one request line and reads
 * the reply until the daemon closes the connection. The reply's first line is "ok" or
 * "error: <what to do>"; the rest is the body (key:value sections, or JSON with --json). */
#pragma once

#include "strbuf.h"

#define OMV_CONTROL_LINE_MAX 4096
#define OMV_CONTROL_MAX_ARGS 40

typedef struct omv_control omv_control_t;

/* Handles one request (argv words); writes the body into reply. Returns 0 for "ok" or a
 * negative errno with the error text in reply. */
typedef int (*omv_control_handler_fn)(void *ctx, int argc, char **argv, omv_strbuf_t *reply);

/* Binds and listens at path (mode 0660); a stale socket left by a dead daemon is replaced, a
 * live one is refused with -EADDRINUSE. Returns NULL with errno set. */
omv_control_t *omv_control_new(const char *path);
/* Closes and unlinks the socket. */
void omv_control_destroy(omv_control_t **self_p);
int omv_control_fd(const omv_control_t *self);

/* Accepts one waiting client, reads its line (within 1 s), answers through fn and closes;
 * unless fn deferred the answer (omv_control_defer) and returned OMV_CONTROL_DEFERRED. */
void omv_control_serve(omv_control_t *self, omv_control_handler_fn fn, void *ctx);

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
