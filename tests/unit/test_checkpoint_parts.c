/* A checkpoint as a manifest and its parts (a job over shard servers): the model comes back bit
 * for bit from the parts, a part that is missing, damaged or another one makes its manifest
 * unusable with the part named, the newest whole manifest is then used, and pruning takes the
 * parts with their manifests. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checkpoint_parts.h"
#include "rng.h"
#include "testutil.h"

#define PARAMS 1000
#define MAX_SPLIT 4

static char dir[4096];

static void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
}

static void teardown(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char p[4400];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.')
            unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* The whole model of checkpoint seq: values no two seqs share. */
typedef struct {
    float params[PARAMS], velocity[PARAMS], second[PARAMS];
} model_t;

static void fill_model(model_t *m, uint64_t seq)
{
    omv_rng_t rng;
    omv_rng_init(&rng, 1000 + seq);
    for (int i = 0; i < PARAMS; i++) {
        m->params[i] = (float)omv_rng_uniform(&rng) - 0.5f;
        m->velocity[i] = (float)omv_rng_uniform(&rng) * 1e-3f;
        m->second[i] = (float)omv_rng_uniform(&rng) * 1e-6f;
    }
}

/* Shards of the split: [0, 3), [3, 5), [5, 9) over offsets 0, 300, 420, 1000. */
static const uint32_t shard_at[MAX_SPLIT] = {0, 3, 5, 9};
static const uint64_t offset_at[MAX_SPLIT] = {0, 300, 420, PARAMS};

static const char *part_path(uint64_t seq, int k)
{
    static char path[4400];
    char name[128];
    omv_checkpoint_part_name(seq, shard_at[k], shard_at[k + 1], name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return path;
}

static const char *manifest_path(uint64_t seq)
{
    static char path[4400];
    snprintf(path, sizeof(path), "%s/checkpoint-%08" PRIu64 ".omv", dir, seq);
    return path;
}

/* Writes checkpoint seq as 3 parts (as 3 servers would) and its manifest (as the coordinator
 * does, last). */
static void write_manifest(uint64_t seq, int adam)
{
    model_t m;
    fill_model(&m, seq);
    omv_checkpoint_part_ref_t refs[MAX_SPLIT - 1];
    char err[OMV_CHECKPOINT_ERR_MAX];
    for (int k = 0; k < MAX_SPLIT - 1; k++) {
        uint64_t off = offset_at[k], n = offset_at[k + 1] - off;
        omv_checkpoint_part_t p = {
            .seq = seq,
            .job_name = "parts-job",
            .param_count = PARAMS,
            .ref = {.first = shard_at[k], .last = shard_at[k + 1], .offset = off, .count = n},
            .params = m.params + off,
            .velocity = m.velocity + off,
            .second = adam ? m.second + off : NULL,
            .adam_steps = 17,
        };
        ck_assert_msg(omv_checkpoint_write_part(&p, dir, &refs[k], err) == 0, "%s", err);
        ck_assert_uint_eq(refs[k].first, shard_at[k]);
        ck_assert_uint_gt(refs[k].bytes, n * 8);
    }
    uint64_t clocks[2] = {seq * 10, seq * 10 + 1};
    omv_checkpoint_t c = {
        .seq = seq,
        .images_total = seq * 640,
        .steps_total = seq * 10,
        .n_groups = 2,
        .clocks = clocks,
        .param_count = PARAMS,
        .learning_rate = 0.05,
        .momentum = 0.9,
        .n_parts = MAX_SPLIT - 1,
        .parts = refs,
        .adam = (uint32_t)adam,
        .adam_steps = 17,
        .job_text = "[job]\nname = parts-job\n",
    };
    snprintf(c.job_name, sizeof(c.job_name), "parts-job");
    ck_assert_msg(omv_checkpoint_write(&c, dir, NULL, 0, err) == 0, "%s", err);
}

/* Reads checkpoint seq back: it must be the model written. */
static void assert_reads_whole(uint64_t seq, int adam)
{
    omv_checkpoint_t got;
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_msg(omv_checkpoint_read(&got, manifest_path(seq), err) == 0, "%s", err);
    model_t want;
    fill_model(&want, seq);
    ck_assert_uint_eq(got.seq, seq);
    ck_assert_uint_eq(got.param_count, PARAMS);
    ck_assert_uint_eq(got.n_parts, MAX_SPLIT - 1);
    ck_assert_uint_eq(got.images_total, seq * 640);
    ck_assert_uint_eq(got.clocks[1], seq * 10 + 1);
    ck_assert_int_eq(memcmp(got.params, want.params, sizeof(want.params)), 0);
    ck_assert_int_eq(memcmp(got.velocity, want.velocity, sizeof(want.velocity)), 0);
    if (adam) {
        ck_assert_ptr_nonnull(got.second);
        ck_assert_int_eq(memcmp(got.second, want.second, sizeof(want.second)), 0);
        ck_assert_uint_eq(got.adam_steps, 17);
    } else {
        ck_assert_ptr_null(got.second);
    }
    omv_checkpoint_fini(&got);
}

/* Reading checkpoint seq fails with -EINVAL, and the reason names the manifest and wants. */
static void assert_read_fails(uint64_t seq, const char *wants)
{
    omv_checkpoint_t got;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&got, manifest_path(seq), err);
    ck_assert_int_eq(r, -EINVAL);
    ck_assert_msg(strstr(err, manifest_path(seq)) != NULL, "the manifest is not named: %s", err);
    ck_assert_msg(strstr(err, wants) != NULL, "'%s' not in: %s", wants, err);
}

START_TEST(test_manifest_roundtrip)
{
    write_manifest(3, 0);
    assert_reads_whole(3, 0);
    write_manifest(4, 1);
    assert_reads_whole(4, 1);
}
END_TEST

static void flip(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

START_TEST(test_damaged_part_names_it)
{
    write_manifest(5, 1);
    flip(part_path(5, 1), 300); /* a parameter of the second part */
    assert_read_fails(5, part_path(5, 1));
    assert_read_fails(5, "checksum mismatch");
    assert_read_fails(5, "part 2 of 3 (shards [3, 5))");
}
END_TEST

START_TEST(test_missing_part_names_it)
{
    write_manifest(6, 0);
    ck_assert_int_eq(unlink(part_path(6, 2)), 0);
    assert_read_fails(6, part_path(6, 2));
    assert_read_fails(6, "No such file");
}
END_TEST

START_TEST(test_range_reads_only_its_parts)
{
    /* A shard server reads the range it holds: the parts that hold any of it (read and
     * checked), none of the others (here one is gone and one damaged), the rest zero. */
    write_manifest(7, 1);
    ck_assert_int_eq(unlink(part_path(7, 0)), 0);
    flip(part_path(7, 2), 300);
    omv_checkpoint_t got;
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_msg(omv_checkpoint_read_range(&got, manifest_path(7), 310, 420, err) == 0, "%s", err);
    model_t want;
    fill_model(&want, 7);
    for (int i = 0; i < PARAMS; i++) {
        int in = i >= 300 && i < 420; /* part 1: [300, 420) */
        ck_assert_msg(got.params[i] == (in ? want.params[i] : 0.0f) &&
                          got.velocity[i] == (in ? want.velocity[i] : 0.0f) &&
                          got.second[i] == (in ? want.second[i] : 0.0f),
                      "parameter %d", i);
    }
    omv_checkpoint_fini(&got);
    /* A range that reaches into a damaged or missing part fails, naming it. */
    ck_assert_int_eq(omv_checkpoint_read_range(&got, manifest_path(7), 419, 421, err), -EINVAL);
    ck_assert_msg(strstr(err, part_path(7, 2)) && strstr(err, "checksum mismatch"), "%s", err);
    ck_assert_int_eq(omv_checkpoint_read_range(&got, manifest_path(7), 0, 1, err), -EINVAL);
    ck_assert_msg(strstr(err, part_path(7, 0)) != NULL, "%s", err);
}
END_TEST

/* A part written again (another run, the same name) or put in place from another checkpoint:
 * whole in itself, but not the one the manifest names. */
START_TEST(test_other_part_is_refused)
{
    write_manifest(7, 0);
    write_manifest(8, 0);
    char other[4400];
    snprintf(other, sizeof(other), "%s", part_path(7, 0));
    ck_assert_int_eq(rename(other, part_path(8, 0)), 0);
    assert_read_fails(8, "written again since, or another one"); /* its CRC is 7's */
    /* The same size and name but other values: its CRC gives it away. */
    write_manifest(9, 0);
    model_t m;
    fill_model(&m, 99);
    omv_checkpoint_part_t p = {
        .seq = 9,
        .job_name = "parts-job",
        .param_count = PARAMS,
        .ref = {.first = 0, .last = 3, .offset = 0, .count = 300},
        .params = m.params,
        .velocity = m.velocity,
    };
    omv_checkpoint_part_ref_t ref;
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_int_eq(omv_checkpoint_write_part(&p, dir, &ref, err), 0);
    assert_read_fails(9, "written again since, or another one");
}
END_TEST

/* A part cut short (as a crash or a full disk on shared storage leaves it), or empty: named,
 * and nothing past its end is read (valgrind's suite setup would see it). */
START_TEST(test_short_part_names_it)
{
    const long keep[] = {0, 10, 31, 200};
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        uint64_t seq = 30 + i;
        write_manifest(seq, 0);
        ck_assert_int_eq(truncate(part_path(seq, 1), keep[i]), 0);
        assert_read_fails(seq, part_path(seq, 1));
        assert_read_fails(seq, "bytes, where the manifest names");
    }
}
END_TEST

/* A part whose file is whole and the size and CRC the manifest names, but which says it is
 * another checkpoint's (or another job's, or another range's): refused by what it says. */
START_TEST(test_part_of_another_job_is_refused)
{
    model_t m;
    fill_model(&m, 40);
    omv_checkpoint_part_t p = {
        .seq = 40,
        .job_name = "another-job",
        .param_count = PARAMS,
        .ref = {.first = 0, .last = 9, .offset = 0, .count = PARAMS},
        .params = m.params,
        .velocity = m.velocity,
    };
    omv_checkpoint_part_ref_t ref;
    char err[OMV_CHECKPOINT_ERR_MAX];
    ck_assert_int_eq(omv_checkpoint_write_part(&p, dir, &ref, err), 0);
    uint64_t clocks[1] = {1};
    omv_checkpoint_t c = {.seq = 40, .n_groups = 1, .clocks = clocks, .param_count = PARAMS};
    snprintf(c.job_name, sizeof(c.job_name), "parts-job");
    c.n_parts = 1;
    c.parts = &ref;
    ck_assert_int_eq(omv_checkpoint_write(&c, dir, NULL, 0, err), 0);
    assert_read_fails(40, "is another part: checkpoint 40 of job 'another-job'");
}
END_TEST

typedef struct {
    int calls;
    char reasons[4][OMV_CHECKPOINT_ERR_MAX];
} bad_log_t;

static void on_bad(void *ctx, const char *path, const char *reason)
{
    (void)path;
    bad_log_t *log = ctx;
    if (log->calls < 4)
        snprintf(log->reasons[log->calls], sizeof(log->reasons[0]), "%s", reason);
    log->calls++;
}

/* A resume takes the newest whole manifest: a damaged part sends it to the one before, and the
 * log says which part was wrong. */
START_TEST(test_load_latest_skips_incomplete_manifest)
{
    write_manifest(1, 0);
    write_manifest(2, 0);
    flip(part_path(2, 0), 200);
    omv_checkpoint_t c;
    char path[4400];
    bad_log_t log = {0};
    ck_assert_int_eq(omv_checkpoint_load_latest(&c, dir, path, sizeof(path), on_bad, &log), 1);
    ck_assert_uint_eq(c.seq, 1);
    ck_assert_str_eq(path, manifest_path(1));
    omv_checkpoint_fini(&c);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_msg(strstr(log.reasons[0], part_path(2, 0)) != NULL, "%s", log.reasons[0]);
    assert_reads_whole(1, 0);
}
END_TEST

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Pruning removes the parts of the manifests it removes and parts whose manifest was never
 * written, and keeps those of the manifests kept and of a checkpoint newer than them all (its
 * manifest is still to come). */
START_TEST(test_prune_takes_the_parts)
{
    for (uint64_t s = 1; s <= 4; s++)
        write_manifest(s, 0);
    ck_assert_int_eq(unlink(manifest_path(3)), 0); /* 3's manifest never came */
    write_manifest(5, 0);
    ck_assert_int_eq(unlink(manifest_path(5)), 0);             /* 5's is still to come */
    ck_assert_int_eq(omv_checkpoint_prune(dir, 2), 1 + 2 * 3); /* 1; the parts of 1 and 3 */
    for (int k = 0; k < MAX_SPLIT - 1; k++) {
        ck_assert(!exists(part_path(1, k)));
        ck_assert(exists(part_path(2, k)));
        ck_assert(!exists(part_path(3, k)));
        ck_assert(exists(part_path(4, k)));
        ck_assert(exists(part_path(5, k)));
    }
    assert_reads_whole(2, 0);
    assert_reads_whole(4, 0);
}
END_TEST

/* A part file's size as the layout pins it: header, meta section (120 bytes), parameters and
 * momentum sections, trailer. */
static uint64_t part_file_bytes(uint64_t count)
{
    return 16 + (16 + 120) + 2 * (16 + count * 4) + 16;
}

/* A manifest whose parts leave a gap, overlap, do not reach the end, or name a file of another
 * size than their parameters take is refused as such (before anything of that size is
 * allocated). */
START_TEST(test_manifest_parts_must_tile)
{
    const struct {
        uint64_t off1, n1;
        uint32_t first1;
        const char *wants;
    } cases[] = {
        {301, 699, 3, "does not follow"},  {299, 701, 3, "does not follow"},
        {300, 600, 3, "hold 900 of 1000"}, {300, 700, 4, "does not follow"},
        {300, 700, 3, "names a file of"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        omv_checkpoint_part_ref_t refs[2] = {
            {.first = 0, .last = 3, .offset = 0, .count = 300, .bytes = part_file_bytes(300)},
            {.first = cases[i].first1,
             .last = 9,
             .offset = cases[i].off1,
             .count = cases[i].n1,
             .bytes = part_file_bytes(cases[i].n1)},
        };
        uint64_t clocks[1] = {1};
        omv_checkpoint_t c = {.seq = 20 + i, .n_groups = 1, .clocks = clocks};
        c.param_count = PARAMS;
        c.n_parts = 2;
        c.parts = refs;
        if (i == 4)
            refs[1].bytes = 1ull << 40; /* a model of a terabyte, by its word */
        char err[OMV_CHECKPOINT_ERR_MAX];
        ck_assert_int_eq(omv_checkpoint_write(&c, dir, NULL, 0, err), 0);
        assert_read_fails(20 + i, cases[i].wants);
    }
}
END_TEST

static Suite *parts_suite(void)
{
    Suite *s = suite_create("checkpoint_parts");
    TCase *tc = tcase_create("parts");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_manifest_roundtrip);
    tcase_add_test(tc, test_damaged_part_names_it);
    tcase_add_test(tc, test_missing_part_names_it);
    tcase_add_test(tc, test_range_reads_only_its_parts);
    tcase_add_test(tc, test_other_part_is_refused);
    tcase_add_test(tc, test_short_part_names_it);
    tcase_add_test(tc, test_part_of_another_job_is_refused);
    tcase_add_test(tc, test_load_latest_skips_incomplete_manifest);
    tcase_add_test(tc, test_prune_takes_the_parts);
    tcase_add_test(tc, test_manifest_parts_must_tile);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(parts_suite());
}
