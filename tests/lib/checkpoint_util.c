/* Helpers for the checkpoint file's suites (checkpoint_util.h): a temporary folder, files
 * read, written and damaged by hand, files built byte by byte with a correct checksum, and
 * checkpoints made in memory and compared field by field. */
#include "checkpoint_util.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rng.h"
#include "testutil.h"
#include "util.h"

char dir[4096];

/* ---- files and folders ---- */

/* Removes dir and everything below it. */
static void rmtree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[4096];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            rmtree(sub);
        }
        if (d)
            closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
}

void teardown(void)
{
    rmtree(dir);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The names in folder, sorted and joined by spaces, so a test can say what must be there. */
const char *listing(const char *folder)
{
    static char out[4096];
    char *names[64];
    size_t n = 0;
    out[0] = '\0';
    DIR *d = opendir(folder);
    ck_assert_msg(d != NULL, "cannot list %s", folder);
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n; i++) {
        size_t used = strlen(out);
        snprintf(out + used, sizeof(out) - used, "%s%s", i ? " " : "", names[i]);
        free(names[i]);
    }
    return out;
}

unsigned char *slurp(const char *path, size_t *ret_len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(len ? (size_t)len : 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *ret_len = (size_t)len;
    return buf;
}

void spill(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

void put_text(const char *folder, const char *name, const char *text)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", folder, name);
    spill(path, text, strlen(text));
}

void copy_file(const char *from, const char *to)
{
    size_t len;
    unsigned char *buf = slurp(from, &len);
    spill(to, buf, len);
    free(buf);
}

void flip_byte(const char *path, size_t at)
{
    size_t len;
    unsigned char *buf = slurp(path, &len);
    ck_assert_uint_lt(at, len);
    buf[at] ^= 0xFF;
    spill(path, buf, len);
    free(buf);
}

void truncate_to(const char *path, size_t len)
{
    ck_assert_int_eq(truncate(path, (off_t)len), 0);
}

size_t file_size(const char *path)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (size_t)st.st_size;
}

const char *ckpt_path(const char *folder, uint64_t seq)
{
    static char path[4200];
    snprintf(path, sizeof(path), "%s/checkpoint-%08" PRIu64 ".omv", folder, seq);
    return path;
}

/* ---- building files by hand, with a correct checksum ---- */

void b_put(bytes_t *b, const void *p, size_t len)
{
    if (b->len + len > b->cap) {
        b->cap = (b->len + len) * 2;
        b->data = realloc(b->data, b->cap);
        ck_assert_ptr_nonnull(b->data);
    }
    if (len)
        memcpy(b->data + b->len, p, len);
    b->len += len;
}

void b_u32(bytes_t *b, uint32_t v)
{
    b_put(b, &v, 4);
}

void b_u64(bytes_t *b, uint64_t v)
{
    b_put(b, &v, 8);
}

void b_f64(bytes_t *b, double v)
{
    b_put(b, &v, 8);
}

void b_header(bytes_t *b, uint32_t format, uint32_t sections)
{
    b_put(b, "OMVCKPT\n", 8);
    b_u32(b, format);
    b_u32(b, sections);
}

void b_section(bytes_t *b, uint32_t tag, const void *data, uint64_t len)
{
    b_u32(b, tag);
    b_u32(b, 0);
    b_u64(b, len);
    b_put(b, data, (size_t)len);
}

/* A meta section as the reader expects it (140 bytes). */
void b_meta(bytes_t *b, uint64_t seq, uint32_t n_groups, uint64_t param_count, uint32_t n_history)
{
    bytes_t m = {0};
    char name[64] = "crafted";
    b_u64(&m, seq);
    b_u32(&m, 0); /* finished */
    b_u32(&m, n_groups);
    b_u64(&m, 0); /* images */
    b_u64(&m, 0); /* steps */
    b_f64(&m, 0.0);
    b_u64(&m, param_count);
    b_f64(&m, 0.1);
    b_f64(&m, 0.9);
    b_f64(&m, 0.0);
    b_u32(&m, n_history);
    b_put(&m, name, sizeof(name));
    ck_assert_uint_eq(m.len, META_BYTES);
    b_section(b, TAG_META, m.data, m.len);
    free(m.data);
}

/* Appends the trailer to body b and writes the file. */
void b_seal_to(bytes_t *b, const char *path)
{
    uint64_t body = b->len;
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b->data, (uInt)b->len);
    b_u64(b, body);
    b_u32(b, crc);
    b_put(b, "OEND", 4);
    spill(path, b->data, b->len);
    free(b->data);
    memset(b, 0, sizeof(*b));
}

/* The body of an existing file (everything before the trailer), to add sections to. */
bytes_t body_of(const char *path)
{
    size_t len;
    unsigned char *buf = slurp(path, &len);
    ck_assert_uint_gt(len, HEADER_BYTES + TRAILER_BYTES);
    bytes_t b = {buf, len - TRAILER_BYTES, len};
    return b;
}

/* Offset of the header of section tag in a file's bytes. */
size_t section_at(const unsigned char *buf, size_t len, uint32_t tag)
{
    size_t at = HEADER_BYTES, body = len - TRAILER_BYTES;
    while (at + SECTION_BYTES <= body) {
        uint32_t t;
        uint64_t slen;
        memcpy(&t, buf + at, 4);
        memcpy(&slen, buf + at + 8, 8);
        if (t == tag)
            return at;
        at += SECTION_BYTES + (size_t)slen;
    }
    ck_abort_msg("no section %u", tag);
    return 0;
}

/* ---- checkpoints in memory ---- */

/* Random bits that are never a NaN, so that bit equality is the only fair comparison and
 * infinities, zeros of both signs and subnormals all occur. */
static float any_float(omv_rng_t *rng)
{
    uint32_t bits = (uint32_t)omv_rng_next(rng);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
        bits &= ~0x007fffffu; /* NaN becomes an infinity */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static char *dup_or_die(const char *s)
{
    char *d = strdup(s);
    ck_assert_ptr_nonnull(d);
    return d;
}

/* A checkpoint whose arrays are malloc'd (release with omv_checkpoint_fini). Values above 2^32
 * where the field is 64 bits wide, so a 32-bit slip would show. */
void make(omv_checkpoint_t *c, uint64_t seq, uint64_t param_count, uint32_t n_groups,
          uint32_t n_history, uint64_t seed)
{
    omv_rng_t rng;
    omv_rng_init(&rng, seed);
    memset(c, 0, sizeof(*c));
    c->seq = seq;
    snprintf(c->job_name, sizeof(c->job_name), "job-%" PRIu64, seed);
    c->finished = (uint32_t)(seed & 1);
    c->images_total = (UINT64_C(1) << 40) + seed * 7 + 3;
    c->steps_total = (UINT64_C(1) << 33) + seed;
    c->train_s = 12345.678901234 + (double)seed;
    c->n_groups = n_groups;
    c->clocks = malloc((n_groups ? n_groups : 1) * sizeof(uint64_t));
    ck_assert_ptr_nonnull(c->clocks);
    for (uint32_t g = 0; g < n_groups; g++)
        c->clocks[g] = (UINT64_C(1) << 32) + omv_rng_next(&rng) % (UINT64_C(1) << 40);
    if (n_groups)
        c->clocks[0] = UINT64_MAX - 1;
    c->param_count = param_count;
    c->params = malloc((param_count ? param_count : 1) * sizeof(float));
    c->velocity = malloc((param_count ? param_count : 1) * sizeof(float));
    ck_assert_ptr_nonnull(c->params);
    ck_assert_ptr_nonnull(c->velocity);
    for (uint64_t i = 0; i < param_count; i++) {
        c->params[i] = any_float(&rng);
        c->velocity[i] = any_float(&rng);
    }
    /* Adam's state: second moments and its step count. */
    c->second = malloc((param_count ? param_count : 1) * sizeof(float));
    ck_assert_ptr_nonnull(c->second);
    for (uint64_t i = 0; i < param_count; i++)
        c->second[i] = (float)omv_rng_uniform(&rng);
    c->adam_steps = (UINT64_C(1) << 36) + seed;
    const float special[] = {-0.0f, FLT_MIN, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, 1.0f / 3.0f};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(special) && i < param_count; i++)
        c->params[i] = special[i];
    c->learning_rate = 0.1 / 3.0;
    c->momentum = 0.9;
    c->weight_decay = 5e-324; /* the smallest subnormal double */
    c->n_history = n_history;
    if (n_history) {
        c->history = calloc(n_history, sizeof(*c->history));
        ck_assert_ptr_nonnull(c->history);
        for (uint32_t i = 0; i < n_history; i++)
            c->history[i] = (omv_checkpoint_eval_t){0.5 * (i + 1), 1e-3 * i + 1e9,
                                                    omv_rng_uniform(&rng), i ? 1e300 * i : -0.0};
    }
    c->job_text = dup_or_die("# a job\n[model]\nlayers = 784 100 10\n\n[train]\nepochs = 3\n");
    c->members = dup_or_die("1 host-a 1234 0\n2 h\xc3\xb6st-b 99 1\n");
    c->model_text = dup_or_die("input 784\nfc 100\nrelu\nfc 10\n");
    /* The optimizer in phase 3, with the phases before it. */
    omv_checkpoint_opt_t *o = &c->opt;
    o->present = 1;
    o->state = (omv_opt_saved_t){.phase = 3,
                                 .running = (uint32_t)(seed & 1),
                                 .groups = 4,
                                 .momentum = 0.3,
                                 .lr = 0.1 / 3.0,
                                 .phase_steps_done = 4000000000u,
                                 .lr_ref = 1e-300,
                                 .groups_he = 8,
                                 .probes_total = (UINT64_C(1) << 35) + seed,
                                 .divergences_total = (UINT64_C(1) << 34) + 1};
    o->probe_images_total = (UINT64_C(1) << 41) + 9;
    o->probe_seconds_total = 1234.5678 + (double)seed;
    o->n_phases = 3;
    o->phases = calloc(3, sizeof(*o->phases));
    ck_assert_ptr_nonnull(o->phases);
    for (uint32_t i = 0; i < 3; i++)
        o->phases[i] = (omv_checkpoint_phase_t){i + 1, 1u << i, 0.3 * i, 0.1 / (i + 1),
                                                omv_rng_uniform(&rng) * 10.0};
}

static const char *text_or_empty(const char *s)
{
    return s ? s : "";
}

/* Every field of got is bit-identical to want. */
void assert_same(const omv_checkpoint_t *got, const omv_checkpoint_t *want)
{
    ck_assert_uint_eq(got->seq, want->seq);
    ck_assert_str_eq(got->job_name, want->job_name);
    ck_assert_uint_eq(got->finished, want->finished);
    ck_assert_uint_eq(got->images_total, want->images_total);
    ck_assert_uint_eq(got->steps_total, want->steps_total);
    ck_assert_mem_eq(&got->train_s, &want->train_s, sizeof(double));
    ck_assert_uint_eq(got->n_groups, want->n_groups);
    ck_assert_mem_eq(got->clocks, want->clocks, want->n_groups * sizeof(uint64_t));
    ck_assert_uint_eq(got->param_count, want->param_count);
    /* ck_assert_mem_eq formats both buffers for its message, which is slow for megabytes. */
    ck_assert_msg(memcmp(got->params, want->params, want->param_count * sizeof(float)) == 0,
                  "parameters differ");
    ck_assert_msg(memcmp(got->velocity, want->velocity, want->param_count * sizeof(float)) == 0,
                  "momentum differs");
    ck_assert_int_eq(got->second != NULL, want->second != NULL);
    if (want->second) {
        ck_assert_msg(memcmp(got->second, want->second, want->param_count * sizeof(float)) == 0,
                      "Adam's second moments differ");
        ck_assert_uint_eq(got->adam_steps, want->adam_steps);
    }
    ck_assert_mem_eq(&got->learning_rate, &want->learning_rate, sizeof(double));
    ck_assert_mem_eq(&got->momentum, &want->momentum, sizeof(double));
    ck_assert_mem_eq(&got->weight_decay, &want->weight_decay, sizeof(double));
    ck_assert_uint_eq(got->n_history, want->n_history);
    if (want->n_history)
        ck_assert_mem_eq(got->history, want->history, want->n_history * sizeof(*want->history));
    /* A missing text is written as empty; either reading of it is the same to the daemon. */
    ck_assert_str_eq(text_or_empty(got->job_text), text_or_empty(want->job_text));
    ck_assert_str_eq(text_or_empty(got->members), text_or_empty(want->members));
    ck_assert_str_eq(text_or_empty(got->model_text), text_or_empty(want->model_text));
    ck_assert_uint_eq(got->opt.present, want->opt.present);
    if (!want->opt.present)
        return;
    const omv_opt_saved_t *a = &got->opt.state, *b = &want->opt.state;
    ck_assert_uint_eq(a->phase, b->phase);
    ck_assert_uint_eq(a->running, b->running);
    ck_assert_uint_eq(a->groups, b->groups);
    ck_assert_mem_eq(&a->momentum, &b->momentum, sizeof(double));
    ck_assert_mem_eq(&a->lr, &b->lr, sizeof(double));
    ck_assert_uint_eq(a->phase_steps_done, b->phase_steps_done);
    ck_assert_mem_eq(&a->lr_ref, &b->lr_ref, sizeof(double));
    ck_assert_uint_eq(a->groups_he, b->groups_he);
    ck_assert_uint_eq(a->probes_total, b->probes_total);
    ck_assert_uint_eq(a->divergences_total, b->divergences_total);
    ck_assert_uint_eq(got->opt.probe_images_total, want->opt.probe_images_total);
    ck_assert_mem_eq(&got->opt.probe_seconds_total, &want->opt.probe_seconds_total, sizeof(double));
    ck_assert_uint_eq(got->opt.n_phases, want->opt.n_phases);
    for (uint32_t i = 0; i < want->opt.n_phases; i++) {
        const omv_checkpoint_phase_t *x = &got->opt.phases[i], *y = &want->opt.phases[i];
        ck_assert_uint_eq(x->phase, y->phase);
        ck_assert_uint_eq(x->groups, y->groups);
        ck_assert_mem_eq(&x->momentum, &y->momentum, sizeof(double));
        ck_assert_mem_eq(&x->learning_rate, &y->learning_rate, sizeof(double));
        ck_assert_mem_eq(&x->epoch, &y->epoch, sizeof(double));
    }
}

void write_ok(const omv_checkpoint_t *c, const char *folder)
{
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    char path[4200] = "";
    int r = omv_checkpoint_write(c, folder, path, sizeof(path), err);
    ck_assert_msg(r == 0, "write: %d %s", r, err);
    ck_assert_str_eq(path, ckpt_path(folder, c->seq));
}

/* Writes a small checkpoint numbered seq into folder. */
void write_seq(const char *folder, uint64_t seq)
{
    omv_checkpoint_t c;
    make(&c, seq, 64, 2, 2, seq);
    write_ok(&c, folder);
    omv_checkpoint_fini(&c);
}

/* ---- the optimizer's section ---- */

/* A file whose optimizer section is body[len] (the rest as make() writes it). */
void write_with_optimizer_section(const char *path, const void *body, size_t len)
{
    omv_checkpoint_t c;
    make(&c, 1, 4, 2, 0, 3);
    free(c.opt.phases);
    memset(&c.opt, 0, sizeof(c.opt));
    write_ok(&c, dir);
    omv_checkpoint_fini(&c);
    bytes_t b = body_of(path);
    b_section(&b, TAG_OPTIMIZER, body, len);
    b_seal_to(&b, path);
}

/* The fixed part of an optimizer section as layout 1 writes it, for n phases. */
void b_opt_fixed(bytes_t *b, uint32_t layout, uint32_t running, uint32_t n)
{
    b_u32(b, layout);
    b_u32(b, 2);       /* phase */
    b_u32(b, running); /* running */
    b_u32(b, 4);       /* groups */
    b_u32(b, 17);      /* steps done */
    b_u32(b, 4);       /* g for speed */
    b_f64(b, 0.6);
    b_f64(b, 0.01);
    b_f64(b, 0.01);
    b_u64(b, 12);
    b_u64(b, 0);
    b_u64(b, 4096);
    b_f64(b, 1.5);
    b_u32(b, n);
}
