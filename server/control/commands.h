/* The control socket's commands: a declarative table (name, arguments, flags, help, handler)
 * that the request dispatcher and the help text both come from. */
#pragma once

#include "daemon_priv.h"
#include "strbuf.h"

/* The control socket's handler (ctx: the daemon). Returns 0, OMV_CONTROL_DEFERRED or a negative
 * errno with the error in reply. */
int omv_commands_dispatch(void *ctx, int argc, char **argv, omv_strbuf_t *reply);

/* From the loop: answers deferred requests whose answer is ready (a checkpoint written). */
void omv_commands_poll(omv_daemon_t *d);

/* Answers every deferred request with an error (the daemon is going). */
void omv_commands_abandon(omv_daemon_t *d);
