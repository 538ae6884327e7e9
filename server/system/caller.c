/* Control callers' rights, from their credentials and the files' permission bits. */
#include "caller.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "util.h"

#define MAX_GROUPS 256

/* Whether the caller's uid has gid among its groups. */
static int in_group(const omv_caller_t *self, gid_t gid)
{
    if (self->gid == gid)
        return 1;
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (getpwuid_r(self->uid, &pw, buf, sizeof(buf), &found) != 0 || found == NULL)
        return 0;
    gid_t groups[MAX_GROUPS];
    int n = MAX_GROUPS;
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &n) < 0)
        n = MAX_GROUPS; /* the first MAX_GROUPS are filled */
    for (int i = 0; i < n; i++)
        if (groups[i] == gid)
            return 1;
    return 0;
}

int omv_caller_may_change(const omv_caller_t *self, gid_t admin_gid)
{
    if (self->uid == 0 || self->uid == geteuid())
        return 1;
    return admin_gid != (gid_t)-1 && in_group(self, admin_gid);
}

/* Whether the permission bits of st give the caller `want` (4 read, 1 search). */
static int allows(const omv_caller_t *self, const struct stat *st, unsigned want)
{
    if (st->st_uid == self->uid)
        return ((st->st_mode >> 6) & want) == want;
    if (in_group(self, st->st_gid))
        return ((st->st_mode >> 3) & want) == want;
    return (st->st_mode & want) == want;
}

int omv_caller_check_read(void *ctx, const char *path, char *err)
{
    const omv_caller_t *self = ctx;
    if (self->uid == 0)
        return 0;
    char p[4096];
    struct stat st;
    int ok = path[0] == '/' && omv_strlcpy(p, path, sizeof(p)) == 0;
    /* Each folder from the root down must be searchable, then the file readable. */
    for (char *slash = p + 1; ok && (slash = strchr(slash, '/')) != NULL; slash++) {
        *slash = '\0';
        ok = stat(p, &st) == 0 && allows(self, &st, 1);
        *slash = '/';
    }
    ok = ok && stat(p, &st) == 0 && allows(self, &st, 4);
    if (ok)
        return 0;
    snprintf(err, OMV_CONFIG_ERR_MAX,
             "%s: uid %u cannot read it (it is missing, or uid %u may not read it); the daemon "
             "reads only what the caller could",
             path, (unsigned)self->uid, (unsigned)self->uid);
    return -EACCES;
}
