/* The allow-list folder of public certificates. */
#include "allow.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cert.h"
#include "config.h"

int omv_allow_check(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -errno;
    closedir(d);
    return 0;
}

int omv_allow_find(const char *dir, const char *public_key, unsigned *ret_roles)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -errno;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 4, ".key") != 0 || de->d_name[0] == '.')
            continue;
        char path[4352], err[OMV_CONFIG_ERR_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        omv_cert_t c;
        if (omv_cert_read(path, &c, err) == 0 && strcmp(c.public_key, public_key) == 0) {
            *ret_roles = c.roles;
            found = 1;
        }
    }
    closedir(d);
    return found;
}
