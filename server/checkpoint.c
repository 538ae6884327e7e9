/* Checkpoint files. Layout (little-endian, as the machines that write and read them):
 *   "OMVCKPT\n", u32 format, u32 sections;
 *   sections: u32 tag, u32 zero, u64 length, length bytes;
 *   trailer: u64 bytes before the trailer, u32 CRC-32 of those bytes, "OEND".
 * Unknown section tags are skipped, so later versions can add sections without a new format.
 * The optimizer's section (tag 8) is optional; its fields are only ever appended to (its first
 * u32 counts the layout's revisions), so a reader takes the fields it knows and skips the rest.
 * Adam's section (tag 9, optional: jobs with Adam or AdamW write it) is u64 steps then
 * param_count floats of second moments; checkpoints without it read as SGD's. The model
 * definition's text (tag 10, optional, for export) is the last section. */
#define OMV_LOG_TAG "checkpoint"
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "util.h"

#define MAGIC "OMVCKPT\n"
#define END_MAGIC "OEND"
#define TRAILER_BYTES 16
#define HEADER_BYTES 16

enum {
    TAG_META = 1,
    TAG_CLOCKS = 2,
    TAG_PARAMS = 3,
    TAG_VELOCITY = 4,
    TAG_HISTORY = 5,
    TAG_JOB_TEXT = 6,
    TAG_MEMBERS = 7,
    TAG_OPTIMIZER = 8,
    TAG_ADAM = 9,
    TAG_MODEL_TEXT = 10,
    TAG_LAST_ = TAG_MODEL_TEXT,
};

/* The optimizer section: u32 layout (1); u32 phase, running, groups, phase_steps_done,
 * groups_he; f64 momentum, learning rate, lr_ref; u64 probes, divergences, probe images;
 * f64 probe seconds; u32 phases; then per phase u32 phase, groups, f64 momentum, learning
 * rate, epoch. */
#define OPT_LAYOUT 1
#define OPT_FIXED_BYTES (4 + 5 * 4 + 3 * 8 + 3 * 8 + 8 + 4)
#define OPT_PHASE_BYTES (2 * 4 + 3 * 8)

/* ---- writing ---- */

typedef struct {
    int fd;
    uLong crc;
    uint64_t bytes;
    int err;
} writer_t;

static void put(writer_t *w, const void *data, size_t len)
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

static void put_u32(writer_t *w, uint32_t v)
{
    put(w, &v, sizeof(v));
}

static void put_u64(writer_t *w, uint64_t v)
{
    put(w, &v, sizeof(v));
}

static void put_f64(writer_t *w, double v)
{
    put(w, &v, sizeof(v));
}

static void section(writer_t *w, uint32_t tag, uint64_t len)
{
    put_u32(w, tag);
    put_u32(w, 0);
    put_u64(w, len);
}

#define META_BYTES (8 + 4 + 4 + 8 + 8 + 8 + 8 + 8 * 3 + 4 + 64)

static void write_optimizer(writer_t *w, const omv_checkpoint_opt_t *o)
{
    const omv_opt_saved_t *st = &o->state;
    section(w, TAG_OPTIMIZER, OPT_FIXED_BYTES + (uint64_t)o->n_phases * OPT_PHASE_BYTES);
    put_u32(w, OPT_LAYOUT);
    put_u32(w, st->phase);
    put_u32(w, st->running);
    put_u32(w, st->groups);
    put_u32(w, st->phase_steps_done);
    put_u32(w, st->groups_he);
    put_f64(w, st->momentum);
    put_f64(w, st->lr);
    put_f64(w, st->lr_ref);
    put_u64(w, st->probes_total);
    put_u64(w, st->divergences_total);
    put_u64(w, o->probe_images_total);
    put_f64(w, o->probe_seconds_total);
    put_u32(w, o->n_phases);
    for (uint32_t i = 0; i < o->n_phases; i++) {
        put_u32(w, o->phases[i].phase);
        put_u32(w, o->phases[i].groups);
        put_f64(w, o->phases[i].momentum);
        put_f64(w, o->phases[i].learning_rate);
        put_f64(w, o->phases[i].epoch);
    }
}

static void write_body(writer_t *w, const omv_checkpoint_t *c)
{
    size_t job_len = c->job_text ? strlen(c->job_text) : 0;
    size_t members_len = c->members ? strlen(c->members) : 0;
    put(w, MAGIC, 8);
    put_u32(w, OMV_CHECKPOINT_FORMAT);
    put_u32(w, 7 + (c->opt.present != 0) + (c->second != NULL) + (c->model_text != NULL));

    section(w, TAG_META, META_BYTES);
    put_u64(w, c->seq);
    put_u32(w, c->finished);
    put_u32(w, c->n_groups);
    put_u64(w, c->images_total);
    put_u64(w, c->steps_total);
    put_f64(w, c->train_s);
    put_u64(w, c->param_count);
    put_f64(w, c->learning_rate);
    put_f64(w, c->momentum);
    put_f64(w, c->weight_decay);
    put_u32(w, c->n_history);
    char name[64] = {0};
    omv_strlcpy(name, c->job_name, sizeof(name));
    put(w, name, sizeof(name));

    section(w, TAG_CLOCKS, (uint64_t)c->n_groups * 8);
    put(w, c->clocks, (size_t)c->n_groups * 8);
    section(w, TAG_PARAMS, c->param_count * 4);
    put(w, c->params, c->param_count * 4);
    section(w, TAG_VELOCITY, c->param_count * 4);
    put(w, c->velocity, c->param_count * 4);
    section(w, TAG_HISTORY, (uint64_t)c->n_history * 32);
    for (uint32_t i = 0; i < c->n_history; i++) {
        put_f64(w, c->history[i].epoch);
        put_f64(w, c->history[i].wall_s);
        put_f64(w, c->history[i].accuracy);
        put_f64(w, c->history[i].loss);
    }
    section(w, TAG_JOB_TEXT, job_len);
    put(w, c->job_text ? c->job_text : "", job_len);
    section(w, TAG_MEMBERS, members_len);
    put(w, c->members ? c->members : "", members_len);
    if (c->opt.present)
        write_optimizer(w, &c->opt);
    if (c->second) {
        section(w, TAG_ADAM, 8 + c->param_count * 4);
        put_u64(w, c->adam_steps);
        put(w, c->second, c->param_count * 4);
    }
    if (c->model_text) {
        size_t model_len = strlen(c->model_text);
        section(w, TAG_MODEL_TEXT, model_len);
        put(w, c->model_text, model_len);
    }

    uint64_t body = w->bytes;
    uint32_t crc = (uint32_t)w->crc;
    put_u64(w, body);
    put_u32(w, crc);
    put(w, END_MAGIC, 4);
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

int omv_checkpoint_mkdirs(const char *dir)
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

int omv_checkpoint_write(const omv_checkpoint_t *self, const char *dir, char *ret_path, size_t cap,
                         char *err)
{
    char path[4096], tmp[4200];
    int r = omv_checkpoint_mkdirs(dir);
    if (r < 0) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX, "cannot create checkpoint folder %s: %s", dir,
                 omv_strerror(r));
        return r;
    }
    snprintf(path, sizeof(path), "%s/checkpoint-%08" PRIu64 ".omv", dir, self->seq);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    writer_t w = {.fd = open_tmp(tmp, err), .crc = crc32(0L, Z_NULL, 0)};
    if (w.fd < 0)
        return w.fd;
    write_body(&w, self);
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
    return 0;
}

/* ---- reading ---- */

typedef struct {
    const unsigned char *p, *end;
} reader_t;

static int get(reader_t *rd, void *out, size_t len)
{
    if ((size_t)(rd->end - rd->p) < len)
        return -EINVAL;
    memcpy(out, rd->p, len);
    rd->p += len;
    return 0;
}

static uint32_t get_u32(reader_t *rd, int *bad)
{
    uint32_t v = 0;
    *bad |= get(rd, &v, sizeof(v));
    return v;
}

static uint64_t get_u64(reader_t *rd, int *bad)
{
    uint64_t v = 0;
    *bad |= get(rd, &v, sizeof(v));
    return v;
}

static double get_f64(reader_t *rd, int *bad)
{
    double v = 0;
    *bad |= get(rd, &v, sizeof(v));
    return v;
}

/* Reads the optimizer section s into o (allocating its phases). Returns 0 or -EINVAL. */
static int read_optimizer(reader_t *s, omv_checkpoint_opt_t *o)
{
    int bad = 0;
    uint64_t len = (uint64_t)(s->end - s->p);
    if (len < OPT_FIXED_BYTES)
        return -EINVAL;
    omv_opt_saved_t *st = &o->state;
    uint32_t layout = get_u32(s, &bad);
    st->phase = get_u32(s, &bad);
    st->running = get_u32(s, &bad);
    st->groups = get_u32(s, &bad);
    st->phase_steps_done = get_u32(s, &bad);
    st->groups_he = get_u32(s, &bad);
    st->momentum = get_f64(s, &bad);
    st->lr = get_f64(s, &bad);
    st->lr_ref = get_f64(s, &bad);
    st->probes_total = get_u64(s, &bad);
    st->divergences_total = get_u64(s, &bad);
    o->probe_images_total = get_u64(s, &bad);
    o->probe_seconds_total = get_f64(s, &bad);
    uint32_t n = get_u32(s, &bad);
    if (bad || layout < 1 || st->running > 1 || n > OMV_CHECKPOINT_MAX_PHASES ||
        (uint64_t)n * OPT_PHASE_BYTES > (uint64_t)(s->end - s->p))
        return -EINVAL;
    free(o->phases);
    o->phases = calloc(n ? n : 1, sizeof(*o->phases));
    if (o->phases == NULL)
        return -ENOMEM;
    o->n_phases = n;
    for (uint32_t i = 0; i < n; i++) {
        o->phases[i].phase = get_u32(s, &bad);
        o->phases[i].groups = get_u32(s, &bad);
        o->phases[i].momentum = get_f64(s, &bad);
        o->phases[i].learning_rate = get_f64(s, &bad);
        o->phases[i].epoch = get_f64(s, &bad);
    }
    /* A later layout's fields follow: not ours to read. */
    o->present = 1;
    return bad ? -EINVAL : 0;
}

/* Says what is wrong (printf-style, into err[OMV_CHECKPOINT_ERR_MAX]) and returns -EINVAL: the
 * reader stops at the first damage it finds. */
static int corrupt(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, OMV_CHECKPOINT_ERR_MAX, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static char *dup_text(const unsigned char *p, uint64_t len)
{
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, p, len);
        s[len] = '\0';
    }
    return s;
}

static int read_file(const char *path, unsigned char **ret_buf, size_t *ret_len, char *err)
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

/* Checks the frame around the sections: the magic and format version at the start, the
 * trailer's length and CRC-32 at the end. Returns the bytes before the trailer, or -EINVAL
 * (damaged) or -ENOTSUP (another format) with the reason in err. */
static int64_t check_frame(const unsigned char *buf, size_t len, const char *path, char *err)
{
    if (len < HEADER_BYTES + TRAILER_BYTES || memcmp(buf, MAGIC, 8) != 0)
        return corrupt(err, "%s: not an omnivore checkpoint (%zu bytes, no magic)", path, len);
    uint32_t format;
    memcpy(&format, buf + 8, 4);
    if (format != OMV_CHECKPOINT_FORMAT) {
        snprintf(err, OMV_CHECKPOINT_ERR_MAX,
                 "%s: checkpoint format %u, this daemon reads format %d", path, format,
                 OMV_CHECKPOINT_FORMAT);
        return -ENOTSUP;
    }
    const unsigned char *trailer = buf + len - TRAILER_BYTES;
    uint64_t body;
    uint32_t crc;
    memcpy(&body, trailer, 8);
    memcpy(&crc, trailer + 8, 4);
    if (memcmp(trailer + 12, END_MAGIC, 4) != 0 || body != len - TRAILER_BYTES)
        return corrupt(err,
                       "%s: truncated (%zu bytes, the trailer is missing or names another length)",
                       path, len);
    /* crc32() takes an unsigned int of bytes at a time. */
    uLong actual = crc32(0L, Z_NULL, 0);
    for (size_t at = 0; at < body;) {
        size_t chunk = body - at > (1u << 30) ? (1u << 30) : body - at;
        actual = crc32(actual, buf + at, (uInt)chunk);
        at += chunk;
    }
    if ((uint32_t)actual != crc)
        return corrupt(err,
                       "%s: checksum mismatch (stored %08x, computed %08x): the file is corrupt",
                       path, crc, (uint32_t)actual);
    return (int64_t)body;
}

/* The meta section: counters, sizes and the update rule, checked against the limits before any
 * array they size is allocated. Returns 0 or -EINVAL. */
static int read_meta(reader_t *s, omv_checkpoint_t *c)
{
    int bad = 0;
    c->seq = get_u64(s, &bad);
    c->finished = get_u32(s, &bad);
    c->n_groups = get_u32(s, &bad);
    c->images_total = get_u64(s, &bad);
    c->steps_total = get_u64(s, &bad);
    c->train_s = get_f64(s, &bad);
    c->param_count = get_u64(s, &bad);
    c->learning_rate = get_f64(s, &bad);
    c->momentum = get_f64(s, &bad);
    c->weight_decay = get_f64(s, &bad);
    c->n_history = get_u32(s, &bad);
    bad |= get(s, c->job_name, sizeof(c->job_name));
    c->job_name[sizeof(c->job_name) - 1] = '\0';
    if (bad || c->n_groups == 0 || c->n_groups > OMV_CHECKPOINT_MAX_GROUPS ||
        c->param_count > OMV_CHECKPOINT_MAX_PARAMS || c->n_history > (1u << 24))
        return -EINVAL;
    return 0;
}

/* The parameters or the momentum (tag says which): param_count floats, so after the meta
 * section. */
static int read_floats(reader_t *s, uint32_t tag, int have_meta, omv_checkpoint_t *c,
                       const char *path, char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    if (!have_meta || slen != c->param_count * 4)
        return corrupt(err, "%s: %s section of %" PRIu64 " bytes for %" PRIu64 " parameters", path,
                       tag == TAG_PARAMS ? "parameter" : "momentum", slen, c->param_count);
    float **dst = tag == TAG_PARAMS ? &c->params : &c->velocity;
    if (*dst == NULL)
        *dst = malloc(slen ? slen : 1);
    if (*dst == NULL)
        return corrupt(err, "%s: no memory for %" PRIu64 " bytes", path, slen);
    memcpy(*dst, s->p, slen);
    return 0;
}

/* The evaluation history: n_history points of four doubles, so after the meta section. */
static int read_history(reader_t *s, int have_meta, omv_checkpoint_t *c, const char *path,
                        char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    if (!have_meta || slen != (uint64_t)c->n_history * 32)
        return corrupt(err, "%s: history section of %" PRIu64 " bytes for %u points", path, slen,
                       c->n_history);
    c->history = calloc(c->n_history ? c->n_history : 1, sizeof(*c->history));
    if (c->history == NULL)
        return corrupt(err, "%s: no memory", path);
    int bad = 0;
    for (uint32_t i = 0; i < c->n_history; i++) {
        c->history[i].epoch = get_f64(s, &bad);
        c->history[i].wall_s = get_f64(s, &bad);
        c->history[i].accuracy = get_f64(s, &bad);
        c->history[i].loss = get_f64(s, &bad);
    }
    return 0;
}

/* Reads one section (its bytes in s) into c. seen has a bit for every known section read so
 * far: the sizes in meta must come before the sections they size. Sections of a later version
 * are skipped. Returns 0 or -EINVAL with the reason in err. */
static int read_section(reader_t *s, uint32_t tag, uint32_t seen, omv_checkpoint_t *c,
                        const char *path, char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    int have_meta = (seen & (1u << TAG_META)) != 0;
    switch (tag) {
    case TAG_META:
        if (read_meta(s, c) < 0)
            return corrupt(err, "%s: the meta section is malformed", path);
        return 0;
    case TAG_CLOCKS:
        if (!have_meta || slen != (uint64_t)c->n_groups * 8)
            return corrupt(err, "%s: clocks section of %" PRIu64 " bytes for %u groups", path, slen,
                           c->n_groups);
        c->clocks = malloc(slen);
        if (c->clocks == NULL)
            return corrupt(err, "%s: no memory", path);
        memcpy(c->clocks, s->p, slen);
        return 0;
    case TAG_PARAMS:
    case TAG_VELOCITY:
        return read_floats(s, tag, have_meta, c, path, err);
    case TAG_HISTORY:
        return read_history(s, have_meta, c, path, err);
    case TAG_JOB_TEXT:
        free(c->job_text);
        c->job_text = dup_text(s->p, slen);
        return 0;
    case TAG_MEMBERS:
        free(c->members);
        c->members = dup_text(s->p, slen);
        return 0;
    case TAG_MODEL_TEXT:
        free(c->model_text);
        c->model_text = dup_text(s->p, slen);
        return c->model_text ? 0 : corrupt(err, "%s: no memory", path);
    case TAG_ADAM: {
        int bad_steps = 0;
        if (!have_meta || slen != 8 + c->param_count * 4)
            return corrupt(err,
                           "%s: Adam's section of %" PRIu64 " bytes for %" PRIu64 " parameters",
                           path, slen, c->param_count);
        c->adam_steps = get_u64(s, &bad_steps);
        c->second = malloc(slen - 8 ? slen - 8 : 1);
        if (c->second == NULL)
            return corrupt(err, "%s: no memory", path);
        memcpy(c->second, s->p, slen - 8);
        return 0;
    }
    case TAG_OPTIMIZER: {
        int ro = read_optimizer(s, &c->opt);
        if (ro == -ENOMEM)
            return corrupt(err, "%s: no memory", path);
        if (ro < 0)
            return corrupt(err, "%s: the optimizer section (%" PRIu64 " bytes) is malformed", path,
                           slen);
        return 0;
    }
    default:
        return 0; /* a later version's section */
    }
}

/* Reads the sections between the header and the trailer into c, each known one at most once,
 * and checks that the required ones were there. Returns 0 or -EINVAL with the reason in err. */
static int read_sections(const unsigned char *p, const unsigned char *end, omv_checkpoint_t *c,
                         const char *path, char *err)
{
    static const uint32_t required =
        1u << TAG_META | 1u << TAG_CLOCKS | 1u << TAG_PARAMS | 1u << TAG_VELOCITY;
    reader_t rd = {p, end};
    uint32_t seen = 0; /* bit per known tag: each may appear once */
    while (rd.p < rd.end) {
        int bad = 0;
        uint32_t tag = get_u32(&rd, &bad);
        (void)get_u32(&rd, &bad);
        uint64_t slen = get_u64(&rd, &bad);
        if (bad || slen > (uint64_t)(rd.end - rd.p))
            return corrupt(err, "%s: section %u runs past the end of the file", path, tag);
        reader_t s = {rd.p, rd.p + slen};
        rd.p += slen;
        if (tag >= TAG_META && tag <= TAG_LAST_) {
            if (seen & (1u << tag))
                return corrupt(err, "%s: section %u appears twice", path, tag);
            seen |= 1u << tag;
        }
        int r = read_section(&s, tag, seen, c, path, err);
        if (r < 0)
            return r;
    }
    if ((seen & required) != required)
        return corrupt(err, "%s: a required section is missing", path);
    if (c->n_history && c->history == NULL)
        return corrupt(err, "%s: the history section is missing", path);
    return 0;
}

int omv_checkpoint_read(omv_checkpoint_t *ret, const char *path, char *err)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int r = read_file(path, &buf, &len, err);
    if (r < 0)
        return r;
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    int64_t body = check_frame(buf, len, path, err);
    r = body < 0 ? (int)body : read_sections(buf + HEADER_BYTES, buf + body, &c, path, err);
    if (r == 0) {
        *ret = c;
        memset(&c, 0, sizeof(c));
    }
    omv_checkpoint_fini(&c);
    free(buf);
    return r;
}

void omv_checkpoint_fini(omv_checkpoint_t *self)
{
    free(self->clocks);
    free(self->params);
    free(self->velocity);
    free(self->second);
    free(self->history);
    free(self->job_text);
    free(self->members);
    free(self->model_text);
    free(self->opt.phases);
    memset(self, 0, sizeof(*self));
}

/* ---- the folder ---- */

typedef struct {
    uint64_t seq;
    char name[64];
} entry_t;

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = ((const entry_t *)a)->seq, y = ((const entry_t *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Lists checkpoint-<seq>.omv files, newest first. Returns the count (ret_list malloc'd). */
static int list_dir(const char *dir, entry_t **ret_list)
{
    DIR *dp = opendir(dir);
    if (dp == NULL)
        return errno == ENOENT ? 0 : -errno;
    entry_t *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        /* checkpoint-<digits>.omv and nothing else (no sign, no spaces, no other suffix). */
        const char *p = de->d_name;
        if (strncmp(p, "checkpoint-", 11) != 0 || strlen(p) >= sizeof(list->name))
            continue;
        p += 11;
        size_t digits = strspn(p, "0123456789");
        if (digits == 0 || digits > 19 || strcmp(p + digits, ".omv") != 0)
            continue;
        unsigned long long seq = strtoull(p, NULL, 10);
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            entry_t *l = realloc(list, cap * sizeof(*l));
            if (l == NULL) {
                free(list);
                closedir(dp);
                return -ENOMEM;
            }
            list = l;
        }
        list[n].seq = seq;
        omv_strlcpy(list[n].name, de->d_name, sizeof(list[n].name));
        n++;
    }
    closedir(dp);
    qsort(list, n, sizeof(*list), cmp_desc);
    *ret_list = list;
    return (int)n;
}

int omv_checkpoint_load_latest(omv_checkpoint_t *ret, const char *dir, char *ret_path, size_t cap,
                               omv_checkpoint_bad_fn bad, void *ctx)
{
    entry_t *list = NULL;
    int n = list_dir(dir, &list);
    if (n <= 0)
        return n;
    int r = 0;
    for (int i = 0; i < n; i++) {
        char path[4200], err[OMV_CHECKPOINT_ERR_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, list[i].name);
        if (omv_checkpoint_read(ret, path, err) == 0) {
            omv_strlcpy(ret_path, path, cap);
            r = 1;
            break;
        }
        if (bad)
            bad(ctx, path, err);
    }
    free(list);
    return r;
}

int omv_checkpoint_prune(const char *dir, unsigned keep)
{
    entry_t *list = NULL;
    int n = list_dir(dir, &list);
    if (n < 0)
        return n;
    int removed = 0;
    for (int i = (int)keep; i < n; i++) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, list[i].name);
        if (unlink(path) == 0)
            removed++;
    }
    free(list);
    /* Temporary files left by a crash in the middle of a write. */
    DIR *dp = opendir(dir);
    if (dp) {
        struct dirent *de;
        while ((de = readdir(dp)) != NULL) {
            size_t l = strlen(de->d_name);
            if (strncmp(de->d_name, "checkpoint-", 11) == 0 && l > 8 &&
                strcmp(de->d_name + l - 8, ".omv.tmp") == 0) {
                char path[4200];
                snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
                if (unlink(path) == 0)
                    removed++;
            }
        }
        closedir(dp);
    }
    return removed;
}
