/* Damaged checkpoint files: a flipped byte, a cut, another format, sections missing, too
 * long or repeated are caught and named, and nothing leaks. Helpers:
 * tests/lib/checkpoint_util.c. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checkpoint_util.h"
#include "rng.h"
#include "testutil.h"
#include "util.h"

/* Reading path must fail with want_r and an error that names the file and contains what. */
static void assert_read_fails(const char *path, int want_r, const char *what)
{
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&c, path, err);
    if (r == 0)
        omv_checkpoint_fini(&c);
    ck_assert_msg(r == want_r, "%s: read returned %d, want %d (%s)", path, r, want_r, err);
    ck_assert_msg(strstr(err, path) != NULL, "the error does not name the file: %s", err);
    ck_assert_msg(what == NULL || strstr(err, what) != NULL, "the error does not say '%s': %s",
                  what, err);
    ck_assert_ptr_null(c.params); /* ret is written only on success */
    ck_assert_ptr_null(c.clocks);
}

/* ---- damage ---- */

START_TEST(test_flipped_byte_in_each_region)
{
    write_seq(dir, 1);
    char good[4200], path[4200];
    snprintf(good, sizeof(good), "%s/good", dir);
    snprintf(path, sizeof(path), "%s", ckpt_path(dir, 1));
    copy_file(path, good);
    size_t len;
    unsigned char *buf = slurp(good, &len);
    size_t clocks = section_at(buf, len, TAG_CLOCKS);
    size_t params = section_at(buf, len, TAG_PARAMS);
    size_t members = section_at(buf, len, TAG_MEMBERS);
    free(buf);
    const struct {
        const char *region;
        size_t at;
        int r;
        const char *what;
    } cases[] = {
        {"magic", 0, -EINVAL, "not an omnivore checkpoint"},
        {"magic end", 7, -EINVAL, "not an omnivore checkpoint"},
        {"format version", 8, -ENOTSUP, "format"},
        {"format version high byte", 11, -ENOTSUP, "format"},
        {"section count", 12, -EINVAL, "checksum"},
        {"meta section tag", HEADER_BYTES, -EINVAL, "checksum"},
        {"clocks section length", clocks + 8, -EINVAL, "checksum"},
        {"clocks", clocks + SECTION_BYTES + 3, -EINVAL, "checksum"},
        {"parameters section length", params + 9, -EINVAL, "checksum"},
        {"parameters", params + SECTION_BYTES + 17, -EINVAL, "checksum"},
        {"last body byte", len - TRAILER_BYTES - 1, -EINVAL, "checksum"},
        {"members section tag", members, -EINVAL, "checksum"},
        {"trailer length", len - TRAILER_BYTES, -EINVAL, "truncated"},
        {"trailer length high byte", len - TRAILER_BYTES + 7, -EINVAL, "truncated"},
        {"trailer CRC", len - 8, -EINVAL, "checksum"},
        {"trailer CRC high byte", len - 5, -EINVAL, "checksum"},
        {"end magic", len - 1, -EINVAL, "truncated"},
    };
    for (size_t i = 0; i < OMV_ARRAY_SIZE(cases); i++) {
        copy_file(good, path);
        flip_byte(path, cases[i].at);
        omv_checkpoint_t c;
        memset(&c, 0, sizeof(c));
        char err[OMV_CHECKPOINT_ERR_MAX] = "";
        int r = omv_checkpoint_read(&c, path, err);
        if (r == 0)
            omv_checkpoint_fini(&c);
        ck_assert_msg(r == cases[i].r, "%s (byte %zu): read returned %d, want %d: %s",
                      cases[i].region, cases[i].at, r, cases[i].r, err);
        ck_assert_msg(strstr(err, path) && strstr(err, cases[i].what),
                      "%s: the error should name the file and say '%s': %s", cases[i].region,
                      cases[i].what, err);
    }
    /* And the undamaged copy still reads. */
    omv_checkpoint_t c;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    ck_assert_int_eq(omv_checkpoint_read(&c, good, err), 0);
    omv_checkpoint_fini(&c);
}
END_TEST

START_TEST(test_truncated)
{
    write_seq(dir, 1);
    char good[4200], path[4200];
    snprintf(good, sizeof(good), "%s/good", dir);
    snprintf(path, sizeof(path), "%s", ckpt_path(dir, 1));
    copy_file(path, good);
    size_t size = file_size(good);
    const size_t lengths[] = {0,        10,       HEADER_BYTES + TRAILER_BYTES - 1,
                              size / 2, size - 8, size - TRAILER_BYTES,
                              size - 1};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(lengths); i++) {
        copy_file(good, path);
        truncate_to(path, lengths[i]);
        assert_read_fails(path, -EINVAL, NULL);
    }
    /* The cut-off trailer is what gives a partly written file away. */
    copy_file(good, path);
    truncate_to(path, size / 2);
    assert_read_fails(path, -EINVAL, "truncated");
    /* Bytes after the trailer (an append, a copy gone wrong) are damage too. */
    copy_file(good, path);
    size_t len;
    unsigned char *buf = slurp(path, &len);
    bytes_t b = {buf, len, len};
    b_put(&b, "extra", 5);
    spill(path, b.data, b.len);
    free(b.data);
    assert_read_fails(path, -EINVAL, NULL);
}
END_TEST

START_TEST(test_not_a_checkpoint)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/checkpoint-00000001.omv", dir);
    spill(path, "[model]\nlayers = 784 10\n# not a checkpoint, just some text\n", 58);
    assert_read_fails(path, -EINVAL, "not an omnivore checkpoint");

    unsigned char noise[4096];
    omv_rng_t rng;
    omv_rng_init(&rng, 3);
    for (size_t i = 0; i < sizeof(noise); i++)
        noise[i] = (unsigned char)omv_rng_next(&rng);
    spill(path, noise, sizeof(noise));
    assert_read_fails(path, -EINVAL, NULL);

    /* The right magic and format and nothing else. */
    bytes_t b = {0};
    b_header(&b, OMV_CHECKPOINT_FORMAT, 7);
    b_put(&b, "OEND0000000000000", 16);
    spill(path, b.data, b.len);
    free(b.data);
    memset(&b, 0, sizeof(b));
    assert_read_fails(path, -EINVAL, NULL);

    /* A well-formed file with no sections at all. */
    b_header(&b, OMV_CHECKPOINT_FORMAT, 0);
    b_seal_to(&b, path);
    assert_read_fails(path, -EINVAL, "missing");

    char missing[4200];
    snprintf(missing, sizeof(missing), "%s/checkpoint-00000002.omv", dir);
    assert_read_fails(missing, -ENOENT, NULL);
}
END_TEST

START_TEST(test_other_format_version)
{
    /* A file from a later daemon, intact, is refused as another format, not as corrupt. */
    char path[4200];
    snprintf(path, sizeof(path), "%s", ckpt_path(dir, 1));
    bytes_t b = {0};
    b_header(&b, OMV_CHECKPOINT_FORMAT + 1, 0);
    b_seal_to(&b, path);
    char want[64];
    snprintf(want, sizeof(want), "format %d", OMV_CHECKPOINT_FORMAT + 1);
    assert_read_fails(path, -ENOTSUP, want);
}
END_TEST

START_TEST(test_missing_or_overlong_section)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s", ckpt_path(dir, 1));
    uint64_t clocks[2] = {1, 2};
    float params[4] = {1, 2, 3, 4};

    /* No momentum section. */
    bytes_t b = {0};
    b_header(&b, OMV_CHECKPOINT_FORMAT, 3);
    b_meta(&b, 1, 2, 4, 0);
    b_section(&b, TAG_CLOCKS, clocks, sizeof(clocks));
    b_section(&b, TAG_PARAMS, params, sizeof(params));
    b_seal_to(&b, path);
    assert_read_fails(path, -EINVAL, "missing");

    /* A section whose length runs past the body, with a checksum that agrees. */
    b_header(&b, OMV_CHECKPOINT_FORMAT, 4);
    b_meta(&b, 1, 2, 4, 0);
    b_section(&b, TAG_CLOCKS, clocks, sizeof(clocks));
    b_section(&b, TAG_PARAMS, params, sizeof(params));
    b_u32(&b, TAG_VELOCITY);
    b_u32(&b, 0);
    b_u64(&b, 1000);
    b_put(&b, params, sizeof(params));
    b_seal_to(&b, path);
    assert_read_fails(path, -EINVAL, "past the end");

    /* Parameters that do not match the count in the meta section. */
    b_header(&b, OMV_CHECKPOINT_FORMAT, 4);
    b_meta(&b, 1, 2, 5, 0);
    b_section(&b, TAG_CLOCKS, clocks, sizeof(clocks));
    b_section(&b, TAG_PARAMS, params, sizeof(params));
    b_section(&b, TAG_VELOCITY, params, sizeof(params));
    b_seal_to(&b, path);
    assert_read_fails(path, -EINVAL, NULL);

    /* More groups than any daemon has. */
    b_header(&b, OMV_CHECKPOINT_FORMAT, 4);
    b_meta(&b, 1, OMV_CHECKPOINT_MAX_GROUPS + 1, 4, 0);
    b_seal_to(&b, path);
    assert_read_fails(path, -EINVAL, NULL);
}
END_TEST

/* The checksum catches accidents; a file that is wrong on purpose (or written by a buggy tool)
 * has a good checksum, and the sizes it states must still agree with the arrays handed back. */
START_TEST(test_param_count_overflow)
{
    /* param_count * 4 wraps to 0 in 64 bits, so empty parameter sections "match" it. */
    char path[4200];
    snprintf(path, sizeof(path), "%s", ckpt_path(dir, 1));
    uint64_t clocks[1] = {1};
    bytes_t b = {0};
    b_header(&b, OMV_CHECKPOINT_FORMAT, 4);
    b_meta(&b, 1, 1, UINT64_C(1) << 62, 0);
    b_section(&b, TAG_CLOCKS, clocks, sizeof(clocks));
    b_section(&b, TAG_PARAMS, NULL, 0);
    b_section(&b, TAG_VELOCITY, NULL, 0);
    b_seal_to(&b, path);
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&c, path, err);
    uint64_t count = c.param_count;
    if (r == 0)
        omv_checkpoint_fini(&c); /* never touch the arrays: they are shorter than stated */
    ck_assert_msg(r == -EINVAL,
                  "a file claiming %" PRIu64 " parameters with empty parameter sections was "
                  "accepted (read returned %d)",
                  count, r);
    ck_assert_msg(strstr(err, path) != NULL, "the error does not name the file: %s", err);
}
END_TEST

START_TEST(test_second_meta_section)
{
    /* A meta section after the arrays must not change the sizes the arrays were read with. */
    omv_checkpoint_t want;
    make(&want, 1, 4, 2, 1, 1);
    write_ok(&want, dir);
    omv_checkpoint_fini(&want);
    bytes_t b = body_of(ckpt_path(dir, 1));
    b_meta(&b, 1, OMV_CHECKPOINT_MAX_GROUPS, UINT64_C(1) << 20, 1000);
    b_seal_to(&b, ckpt_path(dir, 1));
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&c, ckpt_path(dir, 1), err);
    uint64_t count = c.param_count;
    uint32_t groups = c.n_groups, history = c.n_history;
    if (r == 0)
        omv_checkpoint_fini(&c); /* never touch the arrays: they may be shorter than stated */
    ck_assert_msg(r < 0 || (count == 4 && groups == 2 && history == 1),
                  "read returned %d with %" PRIu64 " parameters, %u groups and %u evaluations "
                  "stated, but the arrays hold 4, 2 and 1",
                  r, count, groups, history);
}
END_TEST

START_TEST(test_repeated_sections_do_not_leak)
{
    /* Each array section given twice: whatever the reader makes of it, it frees what it
     * allocated (valgrind's leak check is what fails here). */
    omv_checkpoint_t want;
    make(&want, 1, 4, 2, 2, 1);
    write_ok(&want, dir);
    omv_checkpoint_fini(&want);
    size_t len;
    unsigned char *buf = slurp(ckpt_path(dir, 1), &len);
    bytes_t b = body_of(ckpt_path(dir, 1));
    const uint32_t tags[] = {TAG_CLOCKS, TAG_PARAMS,  TAG_VELOCITY, TAG_HISTORY,
                             TAG_JOB,    TAG_MEMBERS, TAG_OPTIMIZER};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(tags); i++) {
        size_t at = section_at(buf, len, tags[i]);
        uint64_t slen;
        memcpy(&slen, buf + at + 8, 8);
        b_put(&b, buf + at, SECTION_BYTES + (size_t)slen);
    }
    free(buf);
    b_seal_to(&b, ckpt_path(dir, 1));
    omv_checkpoint_t c;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    if (omv_checkpoint_read(&c, ckpt_path(dir, 1), err) == 0)
        omv_checkpoint_fini(&c);
}
END_TEST

/* ---- the optimizer's section ---- */

START_TEST(test_optimizer_section_malformed)
{
    /* Shorter than its fixed part. */
    bytes_t o = {0};
    b_opt_fixed(&o, 1, 0, 0);
    write_with_optimizer_section(ckpt_path(dir, 1), o.data, o.len - 1);
    assert_read_fails(ckpt_path(dir, 1), -EINVAL, "optimizer section");
    /* More phases than it holds. */
    free(o.data);
    memset(&o, 0, sizeof(o));
    b_opt_fixed(&o, 1, 0, 2);
    b_put(&o, "\0\0\0\0\0\0\0\0", 8);
    write_with_optimizer_section(ckpt_path(dir, 1), o.data, o.len);
    assert_read_fails(ckpt_path(dir, 1), -EINVAL, "optimizer section");
    /* A phase count past any job's, and a state that is neither running nor searching. */
    free(o.data);
    memset(&o, 0, sizeof(o));
    b_opt_fixed(&o, 1, 0, OMV_CHECKPOINT_MAX_PHASES + 1);
    write_with_optimizer_section(ckpt_path(dir, 1), o.data, o.len);
    assert_read_fails(ckpt_path(dir, 1), -EINVAL, "optimizer section");
    free(o.data);
    memset(&o, 0, sizeof(o));
    b_opt_fixed(&o, 1, 2, 0);
    write_with_optimizer_section(ckpt_path(dir, 1), o.data, o.len);
    assert_read_fails(ckpt_path(dir, 1), -EINVAL, "optimizer section");
    free(o.data);
    /* Twice. */
    omv_checkpoint_t c;
    make(&c, 1, 4, 2, 0, 3);
    write_ok(&c, dir);
    omv_checkpoint_fini(&c);
    size_t len;
    unsigned char *buf = slurp(ckpt_path(dir, 1), &len);
    size_t at = section_at(buf, len, TAG_OPTIMIZER);
    uint64_t slen;
    memcpy(&slen, buf + at + 8, 8);
    bytes_t b = body_of(ckpt_path(dir, 1));
    b_put(&b, buf + at, 16 + (size_t)slen);
    free(buf);
    b_seal_to(&b, ckpt_path(dir, 1));
    assert_read_fails(ckpt_path(dir, 1), -EINVAL, "twice");
}
END_TEST

static Suite *checkpoint_damage_suite(void)
{
    Suite *s = suite_create("checkpoint_damage");
    TCase *tc = tcase_create("damage");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_flipped_byte_in_each_region);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_not_a_checkpoint);
    tcase_add_test(tc, test_other_format_version);
    tcase_add_test(tc, test_missing_or_overlong_section);
    tcase_add_test(tc, test_param_count_overflow);
    tcase_add_test(tc, test_second_meta_section);
    tcase_add_test(tc, test_repeated_sections_do_not_leak);
    tcase_add_test(tc, test_optimizer_section_malformed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(checkpoint_damage_suite());
}
