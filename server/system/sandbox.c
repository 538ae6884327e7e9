/* Hints that name omnivored.service's sandbox (ProtectSystem=strict, ProtectHome=yes) in errors
 * about paths the daemon cannot open or write. */
#include "sandbox.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const hidden[] = {"/home", "/root", "/run/user"};

/* Whether path is a folder ProtectHome= hides, or lies under one. */
static int under_home(const char *path)
{
    for (size_t i = 0; i < sizeof(hidden) / sizeof(hidden[0]); i++) {
        size_t n = strlen(hidden[i]);
        if (strncmp(path, hidden[i], n) == 0 && (path[n] == '/' || path[n] == '\0'))
            return 1;
    }
    return 0;
}

const char *omv_sandbox_hint(const char *path, int err, char *buf, size_t cap)
{
    buf[0] = '\0';
    /* systemd sets INVOCATION_ID for every service it starts. */
    int unit = getenv("INVOCATION_ID") != NULL;
    if (err == -EROFS)
        snprintf(buf, cap,
                 "; '%s' is on a read-only file system: under omnivored.service "
                 "(ProtectSystem=strict) the daemon may write only to /var/lib/omnivore and "
                 "/run/omnivore; allow another folder with ReadWritePaths=%s in a drop-in "
                 "(systemctl edit omnivored)",
                 path, path);
    else if (unit && (err == -EACCES || err == -ENOENT) && under_home(path))
        snprintf(buf, cap,
                 "; omnivored.service hides /home, /root and /run/user from the daemon "
                 "(ProtectHome=yes): keep jobs, data and checkpoints elsewhere, e.g. in "
                 "/etc/omnivore/jobs and /srv");
    return buf;
}

void omv_sandbox_explain_open(char *err, size_t cap)
{
    const char *colon = strstr(err, ": cannot open");
    if (err[0] != '/' || colon == NULL)
        return;
    /* The reason is strerror's text; these are the errors the sandbox causes. */
    static const int causes[] = {EACCES, ENOENT, EROFS};
    int e = 0;
    for (size_t i = 0; i < sizeof(causes) / sizeof(causes[0]); i++)
        if (strstr(colon, strerror(causes[i])))
            e = -causes[i];
    char path[1024], hint[512];
    size_t n = (size_t)(colon - err);
    if (e == 0 || n >= sizeof(path))
        return;
    memcpy(path, err, n);
    path[n] = '\0';
    omv_sandbox_hint(path, e, hint, sizeof(hint));
    size_t at = strlen(err);
    if (hint[0] && at + 1 < cap)
        snprintf(err + at, cap - at, "%s", hint);
}
