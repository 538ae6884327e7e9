/* What omnivored.service's sandbox hides or makes read-only, in words: a hint to add to an error
 * about a path the daemon could not open or write, so that the message names the unit's setting
 * and the fix instead of a bare "Permission denied". */
#pragma once

#include <stddef.h>

/* A hint for err (a negative errno) on path, when the unit's sandbox may be the cause: EROFS
 * (ProtectSystem=strict: ReadWritePaths= in a drop-in), or EACCES/ENOENT on a path under /home,
 * /root or /run/user while running under systemd (ProtectHome=). Writes "" or text that starts
 * with "; " into buf[cap] and returns buf. */
const char *omv_sandbox_hint(const char *path, int err, char *buf, size_t cap);

/* Appends omv_sandbox_hint's text to a message err[cap] of the form "PATH: cannot open...: REASON"
 * (as common/ writes them for job, model and data files) when REASON is one the sandbox causes. */
void omv_sandbox_explain_open(char *err, size_t cap);
