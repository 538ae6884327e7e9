/* Who is on the other end of a control connection (SO_PEERCRED), and what that caller may do:
 * change the daemon, or have it read a file on their behalf. */
#pragma once

#include <sys/types.h>

typedef struct {
    uid_t uid;
    gid_t gid;
    pid_t pid;
} omv_caller_t;

/* Whether the caller is root, the daemon's own user, or a member (primary or supplementary) of
 * admin_gid ((gid_t)-1: no admin group). */
int omv_caller_may_change(const omv_caller_t *self, gid_t admin_gid);

/* Whether the caller could read path themselves: every folder on the way searchable and the
 * file readable by their uid and groups (root reads anything). Returns 0, or -EACCES with a
 * reason in err[OMV_CONFIG_ERR_MAX] that says the same for a file that is missing and one that
 * may not be read, so that the answer tells nothing about a file the caller cannot see. */
int omv_caller_check_read(void *caller, const char *path, char *err);
