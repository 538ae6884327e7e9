/* The frame every checkpoint file shares: the checksumming writer, the atomic write, and reading
 * a file back with its frame checked. */
#define OMV_LOG_TAG "checkpoint"
#include "checkpoint_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "util.h"

#define END_MAGIC "OEND"

/* ---- writing ---- */

void omv_ckio_put(omv_ckio_writer_t *w, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (w->err)
        return;
    size_t left = len;
    while (left > 0) {
        size_t chunk = left > (1u << 30) ? (1u << 30) : left;
        ssize_t n = write(w->fd, p, chunk);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            w->err = -errno;
            return;
        }
        w->crc = crc32(w->crc, p, (uInt)n);
        p += n;
        left -= (size_t)n;
    }
    w->bytes += len;
}

void omv_ckio_put_u32(omv_ckio_writer_t *w, uint32_t v)
{
    omv_ckio_put(w, &v, sizeof(v));
}

void omv_ckio_put_u64(omv_ckio_writer_t *w, uint64_t v)
{
    omv_ckio_put(w, &v, sizeof(v));
}

void omv_ckio_put_f64(omv_ckio_writer_t *w, double v)
{
    omv_ckio_put(w, &v, sizeof(v));
}

void omv_ckio_section(omv_ckio_writer_t *w, uint32_t tag, uint64_t len)
{
    omv_ckio_put_u32(w, tag);
    omv_ckio_put_u32(w, 0);
    omv_ckio_put_u64(w, len);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int r = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return r;
}

/* mkdir that accepts an existing folder, but not an existing file. */
static int make_dir(const char *path)
{
    if (mkdir(path, 0750) == 0)
        return 0;
    if (errno != EEXIST)
        return -errno;
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int omv_ckio_mkdirs(const char *dir)
{
    char path[4096];
    if (omv_strlcpy(path, dir, sizeof(path)) < 0)
        return -ENAMETOOLONG;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int r = make_dir(path);
        if (r < 0)
            return r;
        *p = '/';
    }
    return make_dir(path);
}

/* Creates tmp afresh: never through a link someone left in its place, never into a file that
 * exists (a leftover regular file of ours from a crash is replaced). Returns the fd or a
 * negative errno with the reason in err. */
static int open_tmp(const char *tmp, char *err)
{
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        if (fd >= 0)
            return fd;
        int r = -errno;
        struct stat st;
        if (r == -EEXIST && tries == 0 && lstat(tmp, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_nlink == 1 && unlink(tmp) == 0)
            continue;
        if (r == -EEXIST || r == -ELOOP)
            snprintf(err, OMV_CHECKPOINT_ERR_MAX,
                     "refused to write %s: it exists and is not a file of ours (a link?); not "
                     "written through it",
                     tmp);
        else
            snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot create %s: %s", tmp, omv_strerror(r));
        return r;
    }
    snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot create %s: it keeps coming back", tmp);
    return -EEXIST;
}

int omv_ckio_write(const char *dir, const char *name, omv_ckio_body_fn body, const void *ctx,
                   char *ret_path, size_t cap, uint32_t *ret_crc, uint64_t *ret_bytes, char *err)
{
    char path[4096], tmp[4200];
    int r = omv_ckio_mkdirs(dir);
    if (r < 0) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot create checkpoint folder %s: %s", dir,
                 omv_strerror(r));
        return r;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    omv_ckio_writer_t w = {.fd = open_tmp(tmp, err), .crc = crc32(0L, Z_NULL, 0)};
    if (w.fd < 0)
        return w.fd;
    body(&w, ctx);
    uint64_t before = w.bytes;
    uint32_t crc = (uint32_t)w.crc;
    omv_ckio_put_u64(&w, before);
    omv_ckio_put_u32(&w, crc);
    omv_ckio_put(&w, END_MAGIC, 4);
    r = w.err;
    if (r == 0 && fsync(w.fd) < 0)
        r = -errno;
    if (close(w.fd) < 0 && r == 0)
        r = -errno;
    if (r == 0 && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot write %s: %s", path, omv_strerror(r));
        unlink(tmp);
        return r;
    }
    r = fsync_dir(dir);
    if (r < 0) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "wrote %s but cannot sync its folder: %s", path,
                 omv_strerror(r));
        return r;
    }
    if (ret_path)
        omv_strlcpy(ret_path, path, cap);
    if (ret_crc)
        *ret_crc = crc;
    if (ret_bytes)
        *ret_bytes = w.bytes;
    return 0;
}

/* ---- reading ---- */

int omv_ckio_get(omv_ckio_reader_t *rd, void *out, size_t len)
{
    if ((size_t)(rd->end - rd->p) < len)
        return -EINVAL;
    memcpy(out, rd->p, len);
    rd->p += len;
    return 0;
}

uint32_t omv_ckio_get_u32(omv_ckio_reader_t *rd, int *bad)
{
    uint32_t v = 0;
    *bad |= omv_ckio_get(rd, &v, sizeof(v));
    return v;
}

uint64_t omv_ckio_get_u64(omv_ckio_reader_t *rd, int *bad)
{
    uint64_t v = 0;
    *bad |= omv_ckio_get(rd, &v, sizeof(v));
    return v;
}

double omv_ckio_get_f64(omv_ckio_reader_t *rd, int *bad)
{
    double v = 0;
    *bad |= omv_ckio_get(rd, &v, sizeof(v));
    return v;
}

int omv_ckio_corrupt(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, OMV_CHECKPOINT_ERR_MAX, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int omv_ckio_read_file(const char *path, unsigned char **ret_buf, size_t *ret_len, char *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int r = -errno;
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot open %s: %s", path, omv_strerror(r));
        return r;
    }
    struct stat st;
    int r = 0;
    unsigned char *buf = NULL;
    if (fstat(fd, &st) < 0) {
        r = -errno;
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot stat %s: %s", path, omv_strerror(r));
        goto out;
    }
    size_t len = (size_t)st.st_size;
    buf = malloc(len ? len : 1);
    if (buf == NULL) {
        r = -ENOMEM;
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "%s: no memory for %zu bytes", path, len);
        goto out;
    }
    for (size_t got = 0; got < len;) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = n < 0 ? -errno : -EIO;
            snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot read %s: %s", path, omv_strerror(r));
            goto out;
        }
        got += (size_t)n;
    }
    *ret_buf = buf;
    *ret_len = len;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return r;
}

int64_t omv_ckio_check_frame(const unsigned char *buf, size_t len, const char *path,
                             const char *magic, uint32_t format, const char *what,
                             uint32_t *ret_crc, char *err)
{
    if (len < OMV_CKIO_HEADER_BYTES + OMV_CKIO_TRAILER_BYTES || memcmp(buf, magic, 8) != 0)
        return omv_ckio_corrupt(err, "%s: not an omnivore %s (%zu bytes, no magic)", path, what,
                                len);
    uint32_t got_format;
    memcpy(&got_format, buf + 8, 4);
    if (got_format != format) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "%s: %s format %u, this daemon reads format %u", path,
                 what, got_format, format);
        return -ENOTSUP;
    }
    const unsigned char *trailer = buf + len - OMV_CKIO_TRAILER_BYTES;
    uint64_t body;
    uint32_t crc;
    memcpy(&body, trailer, 8);
    memcpy(&crc, trailer + 8, 4);
    if (memcmp(trailer + 12, END_MAGIC, 4) != 0 || body != len - OMV_CKIO_TRAILER_BYTES)
        return omv_ckio_corrupt(
            err, "%s: truncated (%zu bytes, the trailer is missing or names another length)", path,
            len);
    /* crc32() takes an unsigned int of bytes at a time. */
    uLong actual = crc32(0L, Z_NULL, 0);
    for (size_t at = 0; at < body;) {
        size_t chunk = body - at > (1u << 30) ? (1u << 30) : body - at;
        actual = crc32(actual, buf + at, (uInt)chunk);
        at += chunk;
    }
    if ((uint32_t)actual != crc)
        return omv_ckio_corrupt(
            err, "%s: checksum mismatch (stored %08x, computed %08x): the file is corrupt", path,
            crc, (uint32_t)actual);
    if (ret_crc)
        *ret_crc = crc;
    return (int64_t)body;
}
