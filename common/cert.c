/* CURVE certificate files: a line parser for the keys and roles, and a writer. */
#include "cert.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "util.h"

#define CERT_FILE_MAX 8192

static const char z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                ".-:+=^!/*?&<>()[]{}@%$#";

int omv_cert_key_valid(const char *s)
{
    if (strlen(s) != OMV_CERT_KEY_LEN)
        return 0;
    return strspn(s, z85_chars) == OMV_CERT_KEY_LEN;
}

int omv_cert_parse_roles(const char *text)
{
    int roles = 0;
    char buf[128];
    if (omv_strlcpy(buf, text, sizeof(buf)) < 0)
        return -EINVAL;
    char *save = NULL;
    for (char *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save)) {
        if (strcmp(t, "trainer") == 0)
            roles |= OMV_CERT_TRAINER;
        else if (strcmp(t, "evaluator") == 0)
            roles |= OMV_CERT_EVALUATOR;
        else if (strcmp(t, "shard") == 0)
            roles |= OMV_CERT_SHARD;
        else
            return -EINVAL;
    }
    return roles;
}

/* The quoted value of `key = "VALUE"` on line (leading blanks allowed) into out[cap]; 0 when
 * the line is not that key. Returns 1 when found, -EINVAL for a value that does not fit. */
static int quoted(const char *line, const char *key, char *out, size_t cap)
{
    line += strspn(line, " \t");
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0)
        return 0;
    const char *p = line + k;
    p += strspn(p, " \t");
    if (*p++ != '=')
        return 0;
    p += strspn(p, " \t");
    if (*p++ != '"')
        return -EINVAL;
    const char *end = strchr(p, '"');
    if (end == NULL || (size_t)(end - p) >= cap)
        return -EINVAL;
    memcpy(out, p, (size_t)(end - p));
    out[end - p] = '\0';
    return 1;
}

/* Reads one line's key or roles into c. Returns 0 or -EINVAL. */
static int parse_line(const char *line, omv_cert_t *c)
{
    char roles[128];
    int r = quoted(line, "public-key", c->public_key, sizeof(c->public_key));
    if (r == 0)
        r = quoted(line, "secret-key", c->secret_key, sizeof(c->secret_key));
    if (r == 0) {
        r = quoted(line, "roles", roles, sizeof(roles));
        if (r == 1) {
            int bits = omv_cert_parse_roles(roles);
            if (bits < 0)
                return -EINVAL;
            c->roles = (unsigned)bits;
        }
    }
    return r < 0 ? -EINVAL : 0;
}

int omv_cert_read(const char *path, omv_cert_t *ret, char *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open the certificate: %s", path, strerror(e));
        return -e;
    }
    omv_cert_t c;
    memset(&c, 0, sizeof(c));
    char line[512];
    int r = 0, lines = 0;
    while (r == 0 && fgets(line, sizeof(line), f) != NULL && ++lines < CERT_FILE_MAX / 8)
        r = parse_line(line, &c);
    fclose(f);
    if (r == 0 && !omv_cert_key_valid(c.public_key))
        r = -EINVAL;
    if (r == 0 && c.secret_key[0] && !omv_cert_key_valid(c.secret_key))
        r = -EINVAL;
    if (r < 0) {
        snprintf(
            err, OMV_CONFIG_ERR_MAX,
            "%s: not a CURVE certificate (a 40-character Z85 public-key, an optional "
            "secret-key and roles of trainer, evaluator or shard; omnivorectl keygen writes them)",
            path);
        return r;
    }
    *ret = c;
    return 0;
}

static int write_file(const char *path, mode_t mode, const char *text, char *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot create: %s", path, strerror(e));
        return -e;
    }
    size_t n = strlen(text);
    int r = write(fd, text, n) == (ssize_t)n ? 0 : -EIO;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    if (r < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot write: %s", path, strerror(-r));
        unlink(path);
    }
    return r;
}

int omv_cert_write(const char *dir, const char *name, const omv_cert_t *cert, char *err)
{
    char path[4200], text[1024], roles[64] = "";
    static const char *const names[] = {"trainer", "evaluator", "shard"};
    for (unsigned i = 0, n = 0; i < 3; i++)
        if (cert->roles & (1u << i))
            snprintf(roles + strlen(roles), sizeof(roles) - strlen(roles), "%s%s", n++ ? "," : "",
                     names[i]);
    static const char head[] = "#   ZeroMQ CURVE %s Certificate (omnivorectl keygen)\n"
                               "#   %s\n\nmetadata\n    roles = \"%s\"\ncurve\n"
                               "    public-key = \"%s\"\n";
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    snprintf(text, sizeof(text), head, "Public", "Give it to the daemon's allow-list folder.",
             roles, cert->public_key);
    int r = write_file(path, 0644, text, err);
    if (r < 0)
        return r;
    snprintf(path, sizeof(path), "%s/%s.key_secret", dir, name);
    snprintf(text, sizeof(text), head, "**Secret**",
             "DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.", roles,
             cert->public_key);
    size_t at = strlen(text);
    snprintf(text + at, sizeof(text) - at, "    secret-key = \"%s\"\n", cert->secret_key);
    return write_file(path, 0600, text, err);
}

void omv_cert_path(const char *path, char *out, size_t cap)
{
    const char *creds = getenv("CREDENTIALS_DIRECTORY");
    if (path[0] != '/' && creds && creds[0])
        snprintf(out, cap, "%s/%s", creds, path);
    else
        omv_strlcpy(out, path, cap);
}
