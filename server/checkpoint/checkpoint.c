/* Checkpoint files. Layout (little-endian, as the machines that write and read them):
 *   "OMVCKPT\n", u32 format, u32 sections;
 *   sections: u32 tag, u32 zero, u64 length, length bytes;
 *   trailer: u64 bytes before the trailer, u32 CRC-32 of those bytes, "OEND".
 * Unknown section tags are skipped, so later versions can add sections without a new format.
 * The optimizer's section (tag 8) is optional; its fields are only ever appended to (its first
 * u32 counts the layout's revisions), so a reader takes the fields it knows and skips the rest.
 * Adam's section (tag 9, optional: jobs with Adam or AdamW write it) is u64 steps then
 * param_count floats of second moments; checkpoints without it read as SGD's. The model
 * definition's text (tag 10, optional, for export) is the last section. A manifest (a job over
 * shard servers) has, in place of the parameters, the momentum and Adam's section, the parts'
 * section (tag 11) naming the files that hold them (checkpoint_parts.h). */
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

#include "checkpoint_io.h"
#include "checkpoint_parts.h"
#include "util.h"

#define MAGIC "OMVCKPT\n"

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
    TAG_PARTS = 11,
    TAG_LAST_ = TAG_PARTS,
};

/* The optimizer section: u32 layout (1); u32 phase, running, groups, phase_steps_done,
 * groups_he; f64 momentum, learning rate, lr_ref; u64 probes, divergences, probe images;
 * f64 probe seconds; u32 phases; then per phase u32 phase, groups, f64 momentum, learning
 * rate, epoch. */
#define OPT_LAYOUT 1
#define OPT_FIXED_BYTES (4 + 5 * 4 + 3 * 8 + 3 * 8 + 8 + 4)
#define OPT_PHASE_BYTES (2 * 4 + 3 * 8)

/* ---- writing ---- */

#define META_BYTES (8 + 4 + 4 + 8 + 8 + 8 + 8 + 8 * 3 + 4 + 64)

static void write_optimizer(omv_ckio_writer_t *w, const omv_checkpoint_opt_t *o)
{
    const omv_opt_saved_t *st = &o->state;
    omv_ckio_section(w, TAG_OPTIMIZER, OPT_FIXED_BYTES + (uint64_t)o->n_phases * OPT_PHASE_BYTES);
    omv_ckio_put_u32(w, OPT_LAYOUT);
    omv_ckio_put_u32(w, st->phase);
    omv_ckio_put_u32(w, st->running);
    omv_ckio_put_u32(w, st->groups);
    omv_ckio_put_u32(w, st->phase_steps_done);
    omv_ckio_put_u32(w, st->groups_he);
    omv_ckio_put_f64(w, st->momentum);
    omv_ckio_put_f64(w, st->lr);
    omv_ckio_put_f64(w, st->lr_ref);
    omv_ckio_put_u64(w, st->probes_total);
    omv_ckio_put_u64(w, st->divergences_total);
    omv_ckio_put_u64(w, o->probe_images_total);
    omv_ckio_put_f64(w, o->probe_seconds_total);
    omv_ckio_put_u32(w, o->n_phases);
    for (uint32_t i = 0; i < o->n_phases; i++) {
        omv_ckio_put_u32(w, o->phases[i].phase);
        omv_ckio_put_u32(w, o->phases[i].groups);
        omv_ckio_put_f64(w, o->phases[i].momentum);
        omv_ckio_put_f64(w, o->phases[i].learning_rate);
        omv_ckio_put_f64(w, o->phases[i].epoch);
    }
}

static void write_body(omv_ckio_writer_t *w, const omv_checkpoint_t *c)
{
    size_t job_len = c->job_text ? strlen(c->job_text) : 0;
    size_t members_len = c->members ? strlen(c->members) : 0;
    omv_ckio_put(w, MAGIC, 8);
    omv_ckio_put_u32(w, OMV_CHECKPOINT_FORMAT);
    /* A manifest (parts) has its parts' section in place of the model's two or three. */
    uint32_t model = c->n_parts ? 1 : 2 + (c->second != NULL);
    omv_ckio_put_u32(w, 5 + model + (c->opt.present != 0) + (c->model_text != NULL));

    omv_ckio_section(w, TAG_META, META_BYTES);
    omv_ckio_put_u64(w, c->seq);
    omv_ckio_put_u32(w, c->finished);
    omv_ckio_put_u32(w, c->n_groups);
    omv_ckio_put_u64(w, c->images_total);
    omv_ckio_put_u64(w, c->steps_total);
    omv_ckio_put_f64(w, c->train_s);
    omv_ckio_put_u64(w, c->param_count);
    omv_ckio_put_f64(w, c->learning_rate);
    omv_ckio_put_f64(w, c->momentum);
    omv_ckio_put_f64(w, c->weight_decay);
    omv_ckio_put_u32(w, c->n_history);
    char name[64] = {0};
    omv_strlcpy(name, c->job_name, sizeof(name));
    omv_ckio_put(w, name, sizeof(name));

    omv_ckio_section(w, TAG_CLOCKS, (uint64_t)c->n_groups * 8);
    omv_ckio_put(w, c->clocks, (size_t)c->n_groups * 8);
    if (c->n_parts) {
        omv_checkpoint_parts_write_section(w, c, TAG_PARTS);
    } else {
        omv_ckio_section(w, TAG_PARAMS, c->param_count * 4);
        omv_ckio_put(w, c->params, c->param_count * 4);
        omv_ckio_section(w, TAG_VELOCITY, c->param_count * 4);
        omv_ckio_put(w, c->velocity, c->param_count * 4);
    }
    omv_ckio_section(w, TAG_HISTORY, (uint64_t)c->n_history * 32);
    for (uint32_t i = 0; i < c->n_history; i++) {
        omv_ckio_put_f64(w, c->history[i].epoch);
        omv_ckio_put_f64(w, c->history[i].wall_s);
        omv_ckio_put_f64(w, c->history[i].accuracy);
        omv_ckio_put_f64(w, c->history[i].loss);
    }
    omv_ckio_section(w, TAG_JOB_TEXT, job_len);
    omv_ckio_put(w, c->job_text ? c->job_text : "", job_len);
    omv_ckio_section(w, TAG_MEMBERS, members_len);
    omv_ckio_put(w, c->members ? c->members : "", members_len);
    if (c->opt.present)
        write_optimizer(w, &c->opt);
    if (c->second && !c->n_parts) {
        omv_ckio_section(w, TAG_ADAM, 8 + c->param_count * 4);
        omv_ckio_put_u64(w, c->adam_steps);
        omv_ckio_put(w, c->second, c->param_count * 4);
    }
    if (c->model_text) {
        size_t model_len = strlen(c->model_text);
        omv_ckio_section(w, TAG_MODEL_TEXT, model_len);
        omv_ckio_put(w, c->model_text, model_len);
    }
}

int omv_checkpoint_mkdirs(const char *dir)
{
    return omv_ckio_mkdirs(dir);
}

static void write_body_fn(omv_ckio_writer_t *w, const void *ctx)
{
    write_body(w, ctx);
}

void omv_checkpoint_name(uint64_t seq, char *out, size_t cap)
{
    snprintf(out, cap, "checkpoint-%08" PRIu64 ".omv", seq);
}

int omv_checkpoint_write(const omv_checkpoint_t *self, const char *dir, char *ret_path, size_t cap,
                         char *err)
{
    char name[64];
    omv_checkpoint_name(self->seq, name, sizeof(name));
    return omv_ckio_write(dir, name, write_body_fn, self, ret_path, cap, NULL, NULL, err);
}

/* ---- reading ---- */

/* Reads the optimizer section s into o (allocating its phases). Returns 0 or -EINVAL. */
static int read_optimizer(omv_ckio_reader_t *s, omv_checkpoint_opt_t *o)
{
    int bad = 0;
    uint64_t len = (uint64_t)(s->end - s->p);
    if (len < OPT_FIXED_BYTES)
        return -EINVAL;
    omv_opt_saved_t *st = &o->state;
    uint32_t layout = omv_ckio_get_u32(s, &bad);
    st->phase = omv_ckio_get_u32(s, &bad);
    st->running = omv_ckio_get_u32(s, &bad);
    st->groups = omv_ckio_get_u32(s, &bad);
    st->phase_steps_done = omv_ckio_get_u32(s, &bad);
    st->groups_he = omv_ckio_get_u32(s, &bad);
    st->momentum = omv_ckio_get_f64(s, &bad);
    st->lr = omv_ckio_get_f64(s, &bad);
    st->lr_ref = omv_ckio_get_f64(s, &bad);
    st->probes_total = omv_ckio_get_u64(s, &bad);
    st->divergences_total = omv_ckio_get_u64(s, &bad);
    o->probe_images_total = omv_ckio_get_u64(s, &bad);
    o->probe_seconds_total = omv_ckio_get_f64(s, &bad);
    uint32_t n = omv_ckio_get_u32(s, &bad);
    if (bad || layout < 1 || st->running > 1 || n > OMV_CHECKPOINT_MAX_PHASES ||
        (uint64_t)n * OPT_PHASE_BYTES > (uint64_t)(s->end - s->p))
        return -EINVAL;
    free(o->phases);
    o->phases = calloc(n ? n : 1, sizeof(*o->phases));
    if (o->phases == NULL)
        return -ENOMEM;
    o->n_phases = n;
    for (uint32_t i = 0; i < n; i++) {
        o->phases[i].phase = omv_ckio_get_u32(s, &bad);
        o->phases[i].groups = omv_ckio_get_u32(s, &bad);
        o->phases[i].momentum = omv_ckio_get_f64(s, &bad);
        o->phases[i].learning_rate = omv_ckio_get_f64(s, &bad);
        o->phases[i].epoch = omv_ckio_get_f64(s, &bad);
    }
    /* A later layout's fields follow: not ours to read. */
    o->present = 1;
    return bad ? -EINVAL : 0;
}

/* Says what is wrong (printf-style, into err[OMV_CHECKPOINT_ERR_MAX]) and returns -EINVAL: the
 * reader stops at the first damage it finds. */
static char *dup_text(const unsigned char *p, uint64_t len)
{
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, p, len);
        s[len] = '\0';
    }
    return s;
}

/* The meta section: counters, sizes and the update rule, checked against the limits before any
 * array they size is allocated. Returns 0 or -EINVAL. */
static int read_meta(omv_ckio_reader_t *s, omv_checkpoint_t *c)
{
    int bad = 0;
    c->seq = omv_ckio_get_u64(s, &bad);
    c->finished = omv_ckio_get_u32(s, &bad);
    c->n_groups = omv_ckio_get_u32(s, &bad);
    c->images_total = omv_ckio_get_u64(s, &bad);
    c->steps_total = omv_ckio_get_u64(s, &bad);
    c->train_s = omv_ckio_get_f64(s, &bad);
    c->param_count = omv_ckio_get_u64(s, &bad);
    c->learning_rate = omv_ckio_get_f64(s, &bad);
    c->momentum = omv_ckio_get_f64(s, &bad);
    c->weight_decay = omv_ckio_get_f64(s, &bad);
    c->n_history = omv_ckio_get_u32(s, &bad);
    bad |= omv_ckio_get(s, c->job_name, sizeof(c->job_name));
    c->job_name[sizeof(c->job_name) - 1] = '\0';
    if (bad || c->n_groups == 0 || c->n_groups > OMV_CHECKPOINT_MAX_GROUPS ||
        c->param_count > OMV_CHECKPOINT_MAX_PARAMS || c->n_history > (1u << 24))
        return -EINVAL;
    return 0;
}

/* The parameters or the momentum (tag says which): param_count floats, so after the meta
 * section. */
static int read_floats(omv_ckio_reader_t *s, uint32_t tag, int have_meta, omv_checkpoint_t *c,
                       const char *path, char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    if (!have_meta || slen != c->param_count * 4)
        return omv_ckio_corrupt(
            err, "%s: %s section of %" PRIu64 " bytes for %" PRIu64 " parameters", path,
            tag == TAG_PARAMS ? "parameter" : "momentum", slen, c->param_count);
    float **dst = tag == TAG_PARAMS ? &c->params : &c->velocity;
    if (*dst == NULL)
        *dst = malloc(slen ? slen : 1);
    if (*dst == NULL)
        return omv_ckio_corrupt(err, "%s: no memory for %" PRIu64 " bytes", path, slen);
    memcpy(*dst, s->p, slen);
    return 0;
}

/* The evaluation history: n_history points of four doubles, so after the meta section. */
static int read_history(omv_ckio_reader_t *s, int have_meta, omv_checkpoint_t *c, const char *path,
                        char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    if (!have_meta || slen != (uint64_t)c->n_history * 32)
        return omv_ckio_corrupt(err, "%s: history section of %" PRIu64 " bytes for %u points", path,
                                slen, c->n_history);
    c->history = calloc(c->n_history ? c->n_history : 1, sizeof(*c->history));
    if (c->history == NULL)
        return omv_ckio_corrupt(err, "%s: no memory", path);
    int bad = 0;
    for (uint32_t i = 0; i < c->n_history; i++) {
        c->history[i].epoch = omv_ckio_get_f64(s, &bad);
        c->history[i].wall_s = omv_ckio_get_f64(s, &bad);
        c->history[i].accuracy = omv_ckio_get_f64(s, &bad);
        c->history[i].loss = omv_ckio_get_f64(s, &bad);
    }
    return 0;
}

/* Reads one section (its bytes in s) into c. seen has a bit for every known section read so
 * far: the sizes in meta must come before the sections they size. Sections of a later version
 * are skipped. Returns 0 or -EINVAL with the reason in err. */
static int read_section(omv_ckio_reader_t *s, uint32_t tag, uint32_t seen, omv_checkpoint_t *c,
                        const char *path, char *err)
{
    uint64_t slen = (uint64_t)(s->end - s->p);
    int have_meta = (seen & (1u << TAG_META)) != 0;
    switch (tag) {
    case TAG_META:
        if (read_meta(s, c) < 0)
            return omv_ckio_corrupt(err, "%s: the meta section is malformed", path);
        return 0;
    case TAG_CLOCKS:
        if (!have_meta || slen != (uint64_t)c->n_groups * 8)
            return omv_ckio_corrupt(err, "%s: clocks section of %" PRIu64 " bytes for %u groups",
                                    path, slen, c->n_groups);
        c->clocks = malloc(slen);
        if (c->clocks == NULL)
            return omv_ckio_corrupt(err, "%s: no memory", path);
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
        return c->model_text ? 0 : omv_ckio_corrupt(err, "%s: no memory", path);
    case TAG_ADAM: {
        int bad_steps = 0;
        if (!have_meta || slen != 8 + c->param_count * 4)
            return omv_ckio_corrupt(
                err, "%s: Adam's section of %" PRIu64 " bytes for %" PRIu64 " parameters", path,
                slen, c->param_count);
        c->adam_steps = omv_ckio_get_u64(s, &bad_steps);
        c->second = malloc(slen - 8 ? slen - 8 : 1);
        if (c->second == NULL)
            return omv_ckio_corrupt(err, "%s: no memory", path);
        memcpy(c->second, s->p, slen - 8);
        return 0;
    }
    case TAG_OPTIMIZER: {
        int ro = read_optimizer(s, &c->opt);
        if (ro == -ENOMEM)
            return omv_ckio_corrupt(err, "%s: no memory", path);
        if (ro < 0)
            return omv_ckio_corrupt(
                err, "%s: the optimizer section (%" PRIu64 " bytes) is malformed", path, slen);
        return 0;
    }
    case TAG_PARTS:
        if (!have_meta)
            return omv_ckio_corrupt(err, "%s: the parts section comes before the meta section",
                                    path);
        return omv_checkpoint_parts_read_section(s, c, path, err);
    default:
        return 0; /* a later version's section */
    }
}

/* Reads the sections between the header and the trailer into c, each known one at most once,
 * and checks that the required ones were there. Returns 0 or -EINVAL with the reason in err. */
static int read_sections(const unsigned char *p, const unsigned char *end, omv_checkpoint_t *c,
                         const char *path, char *err)
{
    /* The model: in the file, or (a manifest) in the parts it names. */
    static const uint32_t required = 1u << TAG_META | 1u << TAG_CLOCKS;
    static const uint32_t model = 1u << TAG_PARAMS | 1u << TAG_VELOCITY, parts = 1u << TAG_PARTS;
    omv_ckio_reader_t rd = {p, end};
    uint32_t seen = 0; /* bit per known tag: each may appear once */
    while (rd.p < rd.end) {
        int bad = 0;
        uint32_t tag = omv_ckio_get_u32(&rd, &bad);
        (void)omv_ckio_get_u32(&rd, &bad);
        uint64_t slen = omv_ckio_get_u64(&rd, &bad);
        if (bad || slen > (uint64_t)(rd.end - rd.p))
            return omv_ckio_corrupt(err, "%s: section %u runs past the end of the file", path, tag);
        omv_ckio_reader_t s = {rd.p, rd.p + slen};
        rd.p += slen;
        if (tag >= TAG_META && tag <= TAG_LAST_) {
            if (seen & (1u << tag))
                return omv_ckio_corrupt(err, "%s: section %u appears twice", path, tag);
            seen |= 1u << tag;
        }
        int r = read_section(&s, tag, seen, c, path, err);
        if (r < 0)
            return r;
    }
    if ((seen & required) != required ||
        ((seen & (model | parts)) != model && (seen & (model | parts)) != parts))
        return omv_ckio_corrupt(err, "%s: a required section is missing", path);
    if ((seen & parts) && (seen & (1u << TAG_ADAM)))
        return omv_ckio_corrupt(err, "%s: a manifest with Adam's section of its own", path);
    if (c->n_history && c->history == NULL)
        return omv_ckio_corrupt(err, "%s: the history section is missing", path);
    return 0;
}

int omv_checkpoint_read(omv_checkpoint_t *ret, const char *path, char *err)
{
    return omv_checkpoint_read_range(ret, path, 0, UINT64_MAX, err);
}

int omv_checkpoint_read_range(omv_checkpoint_t *ret, const char *path, uint64_t lo, uint64_t hi,
                              char *err)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int r = omv_ckio_read_file(path, &buf, &len, err);
    if (r < 0)
        return r;
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    int64_t body =
        omv_ckio_check_frame(buf, len, path, MAGIC, OMV_CHECKPOINT_FORMAT, "checkpoint", NULL, err);
    r = body < 0 ? (int)body
                 : read_sections(buf + OMV_CKIO_HEADER_BYTES, buf + body, &c, path, err);
    if (r == 0 && c.n_parts > 0)
        r = omv_checkpoint_parts_load(&c, path, lo, hi, err);
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
    free(self->parts);
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

uint64_t omv_checkpoint_newest_seq(const char *dir)
{
    entry_t *list = NULL;
    int n = list_dir(dir, &list);
    uint64_t seq = n > 0 ? list[0].seq : 0;
    free(list);
    return seq;
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
    /* The parts of the manifests removed, and of manifests never written. */
    uint64_t kept[64], *keep_seqs = keep <= 64 ? kept : malloc(keep * sizeof(uint64_t));
    size_t n_kept = 0;
    for (int i = 0; keep_seqs && i < n && i < (int)keep; i++)
        keep_seqs[n_kept++] = list[i].seq;
    if (keep_seqs && n > 0)
        removed += omv_checkpoint_parts_prune(dir, keep_seqs, n_kept, list[0].seq);
    if (keep_seqs != kept)
        free(keep_seqs);
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
