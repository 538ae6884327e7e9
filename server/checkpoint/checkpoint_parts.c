/* Part files and the manifest's parts section. A part file (little-endian, framed as every
 * checkpoint file: checkpoint_io.h):
 *   "OMVPART\n", u32 format, u32 sections;
 *   meta (tag 1): u64 seq, param_count, offset, count; u32 first, last, adam, zero;
 *     u64 adam_steps; char job[64];
 *   parameters (3), momentum (4), Adam's second moments (9, with adam): count floats each.
 * The manifest's parts section: u32 n_parts, adam; u64 adam_steps; per part u32 first, last;
 * u64 offset, count; u32 crc, zero; u64 bytes. */
#define OMV_LOG_TAG "checkpoint"
#include "checkpoint_parts.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define PART_MAGIC "OMVPART\n"
#define PART_FORMAT 1
#define PART_META_BYTES (4 * 8 + 4 * 4 + 8 + 64)
#define REF_BYTES (2 * 4 + 2 * 8 + 2 * 4 + 8)
#define PARTS_HEAD_BYTES (2 * 4 + 8)

enum { PTAG_META = 1, PTAG_PARAMS = 3, PTAG_VELOCITY = 4, PTAG_SECOND = 9 };

/* The size of a part file of count parameters: it is exact, so a manifest names no more. */
static uint64_t part_bytes(uint64_t count, uint32_t adam)
{
    return OMV_CKIO_HEADER_BYTES + 16 + PART_META_BYTES + (2 + (uint64_t)adam) * (16 + count * 4) +
           OMV_CKIO_TRAILER_BYTES;
}

void omv_checkpoint_part_name(uint64_t seq, uint32_t first, uint32_t last, char *out, size_t cap)
{
    snprintf(out, cap, "checkpoint-%08" PRIu64 ".shards-%u-%u.part", seq, first, last);
}

/* ---- writing ---- */

static void write_part_body(omv_ckio_writer_t *w, const void *ctx)
{
    const omv_checkpoint_part_t *p = ctx;
    uint64_t n = p->ref.count;
    omv_ckio_put(w, PART_MAGIC, 8);
    omv_ckio_put_u32(w, PART_FORMAT);
    omv_ckio_put_u32(w, 3 + (p->second != NULL));
    omv_ckio_section(w, PTAG_META, PART_META_BYTES);
    omv_ckio_put_u64(w, p->seq);
    omv_ckio_put_u64(w, p->param_count);
    omv_ckio_put_u64(w, p->ref.offset);
    omv_ckio_put_u64(w, n);
    omv_ckio_put_u32(w, p->ref.first);
    omv_ckio_put_u32(w, p->ref.last);
    omv_ckio_put_u32(w, p->second != NULL);
    omv_ckio_put_u32(w, 0);
    omv_ckio_put_u64(w, p->adam_steps);
    char name[64] = {0};
    omv_strlcpy(name, p->job_name ? p->job_name : "", sizeof(name));
    omv_ckio_put(w, name, sizeof(name));
    omv_ckio_section(w, PTAG_PARAMS, n * 4);
    omv_ckio_put(w, p->params, n * 4);
    omv_ckio_section(w, PTAG_VELOCITY, n * 4);
    omv_ckio_put(w, p->velocity, n * 4);
    if (p->second) {
        omv_ckio_section(w, PTAG_SECOND, n * 4);
        omv_ckio_put(w, p->second, n * 4);
    }
}

int omv_checkpoint_write_part(const omv_checkpoint_part_t *p, const char *dir,
                              omv_checkpoint_part_ref_t *ret, char *err)
{
    char name[128];
    omv_checkpoint_part_name(p->seq, p->ref.first, p->ref.last, name, sizeof(name));
    *ret = p->ref;
    return omv_ckio_write(dir, name, write_part_body, p, NULL, 0, &ret->crc, &ret->bytes, err);
}

void omv_checkpoint_parts_write_section(omv_ckio_writer_t *w, const omv_checkpoint_t *c,
                                        uint32_t tag)
{
    omv_ckio_section(w, tag, PARTS_HEAD_BYTES + (uint64_t)c->n_parts * REF_BYTES);
    omv_ckio_put_u32(w, c->n_parts);
    omv_ckio_put_u32(w, c->adam != 0);
    omv_ckio_put_u64(w, c->adam_steps);
    for (uint32_t i = 0; i < c->n_parts; i++) {
        const omv_checkpoint_part_ref_t *p = &c->parts[i];
        omv_ckio_put_u32(w, p->first);
        omv_ckio_put_u32(w, p->last);
        omv_ckio_put_u64(w, p->offset);
        omv_ckio_put_u64(w, p->count);
        omv_ckio_put_u32(w, p->crc);
        omv_ckio_put_u32(w, 0);
        omv_ckio_put_u64(w, p->bytes);
    }
}

/* ---- reading ---- */

int omv_checkpoint_parts_read_section(omv_ckio_reader_t *s, omv_checkpoint_t *c, const char *path,
                                      char *err)
{
    int bad = 0;
    uint64_t slen = (uint64_t)(s->end - s->p);
    uint32_t n = omv_ckio_get_u32(s, &bad);
    c->adam = omv_ckio_get_u32(s, &bad);
    c->adam_steps = omv_ckio_get_u64(s, &bad);
    if (bad || n == 0 || n > OMV_CHECKPOINT_MAX_PARTS || c->adam > 1 ||
        slen != PARTS_HEAD_BYTES + (uint64_t)n * REF_BYTES)
        return omv_ckio_corrupt(err, "%s: parts section of %" PRIu64 " bytes for %u parts", path,
                                slen, n);
    c->parts = calloc(n, sizeof(*c->parts));
    if (c->parts == NULL)
        return omv_ckio_corrupt(err, "%s: no memory", path);
    c->n_parts = n;
    uint64_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        omv_checkpoint_part_ref_t *p = &c->parts[i];
        p->first = omv_ckio_get_u32(s, &bad);
        p->last = omv_ckio_get_u32(s, &bad);
        p->offset = omv_ckio_get_u64(s, &bad);
        p->count = omv_ckio_get_u64(s, &bad);
        p->crc = omv_ckio_get_u32(s, &bad);
        (void)omv_ckio_get_u32(s, &bad);
        p->bytes = omv_ckio_get_u64(s, &bad);
        /* In order, each shard and each parameter once, the whole model. */
        if (bad || p->first >= p->last || (i > 0 && p->first != c->parts[i - 1].last) ||
            (i == 0 && p->first != 0) || p->offset != at || p->count > c->param_count - at)
            return omv_ckio_corrupt(err,
                                    "%s: part %u (shards [%u, %u), parameters %" PRIu64
                                    " + %" PRIu64 ") does not follow the one before it",
                                    path, i, p->first, p->last, p->offset, p->count);
        if (p->bytes != part_bytes(p->count, c->adam))
            return omv_ckio_corrupt(err,
                                    "%s: part %u names a file of %" PRIu64 " bytes; one of %" PRIu64
                                    " parameters has %" PRIu64,
                                    path, i, p->bytes, p->count, part_bytes(p->count, c->adam));
        at += p->count;
    }
    if (at != c->param_count)
        return omv_ckio_corrupt(err, "%s: the parts hold %" PRIu64 " of %" PRIu64 " parameters",
                                path, at, c->param_count);
    return 0;
}

/* The part's meta section against what the manifest says of it. */
static int check_part_meta(omv_ckio_reader_t *s, const omv_checkpoint_t *c,
                           const omv_checkpoint_part_ref_t *ref, const char *path, char *err)
{
    int bad = 0;
    uint64_t seq = omv_ckio_get_u64(s, &bad), param_count = omv_ckio_get_u64(s, &bad);
    uint64_t offset = omv_ckio_get_u64(s, &bad), count = omv_ckio_get_u64(s, &bad);
    uint32_t first = omv_ckio_get_u32(s, &bad), last = omv_ckio_get_u32(s, &bad);
    uint32_t adam = omv_ckio_get_u32(s, &bad);
    (void)omv_ckio_get_u32(s, &bad);
    (void)omv_ckio_get_u64(s, &bad);
    char job[64];
    bad |= omv_ckio_get(s, job, sizeof(job));
    job[sizeof(job) - 1] = '\0';
    if (bad)
        return omv_ckio_corrupt(err, "%s: the meta section is malformed", path);
    if (seq != c->seq || param_count != c->param_count || offset != ref->offset ||
        count != ref->count || first != ref->first || last != ref->last || adam != c->adam ||
        strcmp(job, c->job_name) != 0)
        return omv_ckio_corrupt(err,
                                "%s is another part: checkpoint %" PRIu64
                                " of job '%s', shards [%u, %u), where the manifest names "
                                "checkpoint %" PRIu64 " of '%s', shards [%u, %u)",
                                path, seq, job, first, last, c->seq, c->job_name, ref->first,
                                ref->last);
    return 0;
}

/* Copies the part's arrays (sections after its meta) into c at the part's offset. */
static int read_part_arrays(omv_ckio_reader_t *rd, omv_checkpoint_t *c,
                            const omv_checkpoint_part_ref_t *ref, const char *path, char *err)
{
    uint32_t seen = 0, want = 1u << PTAG_PARAMS | 1u << PTAG_VELOCITY;
    want |= c->adam ? 1u << PTAG_SECOND : 0;
    while (rd->p < rd->end) {
        int bad = 0;
        uint32_t tag = omv_ckio_get_u32(rd, &bad);
        (void)omv_ckio_get_u32(rd, &bad);
        uint64_t slen = omv_ckio_get_u64(rd, &bad);
        if (bad || slen > (uint64_t)(rd->end - rd->p))
            return omv_ckio_corrupt(err, "%s: section %u runs past the end of the file", path, tag);
        float *dst = tag == PTAG_PARAMS     ? c->params
                     : tag == PTAG_VELOCITY ? c->velocity
                     : tag == PTAG_SECOND   ? c->second
                                            : NULL;
        if (dst && ((seen & (1u << tag)) || slen != ref->count * 4))
            return omv_ckio_corrupt(
                err, "%s: section %u of %" PRIu64 " bytes for %" PRIu64 " parameters (or twice)",
                path, tag, slen, ref->count);
        if (dst) {
            memcpy(dst + ref->offset, rd->p, slen);
            seen |= 1u << tag;
        }
        rd->p += slen;
    }
    if ((seen & want) != want)
        return omv_ckio_corrupt(err, "%s: a required section is missing", path);
    return 0;
}

/* Reads one part into c, checked against ref. */
static int load_part(omv_checkpoint_t *c, const omv_checkpoint_part_ref_t *ref, const char *path,
                     char *err)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int r = omv_ckio_read_file(path, &buf, &len, err);
    if (r < 0)
        return r == -ENOMEM ? r : -EINVAL;
    uint32_t crc = 0;
    int64_t body =
        omv_ckio_check_frame(buf, len, path, PART_MAGIC, PART_FORMAT, "checkpoint part", &crc, err);
    if (body >= 0 && (len != ref->bytes || crc != ref->crc))
        body = omv_ckio_corrupt(err,
                                "%s: %zu bytes with CRC-32 %08x, where the manifest names %" PRIu64
                                " bytes with %08x: written again since, or another one",
                                path, len, crc, ref->bytes, ref->crc);
    if (body < 0) {
        free(buf);
        return -EINVAL;
    }
    /* The frame is whole: body covers the header at least. */
    omv_ckio_reader_t rd = {buf + OMV_CKIO_HEADER_BYTES, buf + body};
    int bad = 0;
    uint32_t tag = omv_ckio_get_u32(&rd, &bad);
    (void)omv_ckio_get_u32(&rd, &bad);
    uint64_t slen = omv_ckio_get_u64(&rd, &bad);
    if (bad || tag != PTAG_META || slen != PART_META_BYTES || slen > (uint64_t)(rd.end - rd.p)) {
        r = omv_ckio_corrupt(err, "%s: no meta section first", path);
    } else {
        omv_ckio_reader_t meta = {rd.p, rd.p + slen};
        rd.p += slen;
        r = check_part_meta(&meta, c, ref, path, err);
        if (r == 0)
            r = read_part_arrays(&rd, c, ref, path, err);
    }
    free(buf);
    return r == -ENOMEM ? r : r < 0 ? -EINVAL : 0;
}

/* path's folder into dir[cap] ("." for a bare name). */
static void folder_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        omv_strlcpy(dir, ".", cap);
        return;
    }
    size_t n = (size_t)(slash - path);
    if (n >= cap)
        n = cap - 1;
    memcpy(dir, path, n ? n : 1);
    dir[n ? n : 1] = '\0';
}

/* Part k of manifest c, in folder dir: its path into part[cap]. */
static void part_path(const omv_checkpoint_t *c, uint32_t k, const char *dir, char *part,
                      size_t cap)
{
    char name[128];
    omv_checkpoint_part_name(c->seq, c->parts[k].first, c->parts[k].last, name, sizeof(name));
    snprintf(part, cap, "%s/%s", dir, name);
}

/* part_path, and 0, or -EINVAL with the reason in err (naming the manifest at path) unless the
 * file is there with the size the manifest names. */
static int part_there(const omv_checkpoint_t *c, uint32_t k, const char *dir, const char *path,
                      char *part, size_t cap, char *err)
{
    const omv_checkpoint_part_ref_t *ref = &c->parts[k];
    char why[600];
    part_path(c, k, dir, part, cap);
    struct stat st;
    int r = stat(part, &st) < 0 ? -errno : 0;
    if (r == 0 && (uint64_t)st.st_size == ref->bytes)
        return 0;
    if (r < 0)
        snprintf(why, sizeof(why), "%s: %s", part, omv_strerror(r));
    else
        snprintf(why, sizeof(why), "%s: %lld bytes, where the manifest names %" PRIu64, part,
                 (long long)st.st_size, ref->bytes);
    snprintf(err, OMV_CHECKPOINT_ERR_MAX,
             "%s: the manifest is incomplete: its part %u of %u (shards [%u, %u)) cannot be "
             "used: %s",
             path, k + 1, c->n_parts, ref->first, ref->last, why);
    return -EINVAL;
}

/* Whether part k of c holds any of parameters [lo, hi). */
static int part_wanted(const omv_checkpoint_t *c, uint32_t k, uint64_t lo, uint64_t hi)
{
    const omv_checkpoint_part_ref_t *ref = &c->parts[k];
    return ref->offset < hi && (uint64_t)ref->offset + ref->count > lo;
}

int omv_checkpoint_parts_load(omv_checkpoint_t *c, const char *path, uint64_t lo, uint64_t hi,
                              char *err)
{
    char dir[4096], part[4300];
    folder_of(path, dir, sizeof(dir));
    /* Every part is there with its size, which bounds the model's, before the model is
     * allocated. */
    for (uint32_t i = 0; i < c->n_parts; i++)
        if (part_wanted(c, i, lo, hi) && part_there(c, i, dir, path, part, sizeof(part), err) < 0)
            return -EINVAL;
    size_t n = c->param_count ? c->param_count : 1;
    c->params = calloc(n, sizeof(float));
    c->velocity = calloc(n, sizeof(float));
    c->second = c->adam ? calloc(n, sizeof(float)) : NULL;
    if (!c->params || !c->velocity || (c->adam && !c->second))
        return omv_ckio_corrupt(err, "%s: no memory for its %" PRIu64 " parameters", path,
                                c->param_count);
    for (uint32_t i = 0; i < c->n_parts; i++) {
        if (!part_wanted(c, i, lo, hi))
            continue;
        const omv_checkpoint_part_ref_t *ref = &c->parts[i];
        char why[OMV_CHECKPOINT_ERR_MAX];
        part_path(c, i, dir, part, sizeof(part));
        int r = load_part(c, ref, part, why);
        if (r < 0) {
            snprintf(err, OMV_CHECKPOINT_ERR_MAX,
                     "%s: the manifest is incomplete: its part %u of %u (shards [%u, %u)) "
                     "cannot be used: %s",
                     path, i + 1, c->n_parts, ref->first, ref->last, why);
            return r;
        }
    }
    return 0;
}

/* ---- the folder ---- */

/* The seq of a part's file name (or of its temporary file), or -1 for another file. */
static int64_t part_seq(const char *name)
{
    if (strncmp(name, "checkpoint-", 11) != 0)
        return -1;
    const char *p = name + 11;
    size_t digits = strspn(p, "0123456789");
    if (digits == 0 || digits > 18 || strncmp(p + digits, ".shards-", 8) != 0)
        return -1;
    size_t l = strlen(name);
    int part = l > 5 && strcmp(name + l - 5, ".part") == 0;
    int tmp = l > 9 && strcmp(name + l - 9, ".part.tmp") == 0;
    return part || tmp ? (int64_t)strtoull(p, NULL, 10) : -1;
}

int omv_checkpoint_parts_prune(const char *dir, const uint64_t *keep, size_t n_keep,
                               uint64_t newest)
{
    DIR *dp = opendir(dir);
    if (dp == NULL)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        int64_t seq = part_seq(de->d_name);
        if (seq < 0 || (uint64_t)seq > newest)
            continue;
        size_t k = 0;
        while (k < n_keep && keep[k] != (uint64_t)seq)
            k++;
        if (k < n_keep)
            continue;
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (unlink(path) == 0)
            removed++;
    }
    closedir(dp);
    return removed;
}
