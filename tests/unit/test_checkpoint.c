/* Checkpoint files written and read back: every field comes back bit for bit, the write
 * replaces a file whole and only in its own folder, and the optimizer's section is read
 * in each of its layouts. Helpers: tests/lib/checkpoint_util.c. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checkpoint_util.h"
#include "run_checkpoint.h"
#include "testutil.h"
#include "util.h"

/* ---- writing and reading back ---- */

START_TEST(test_roundtrip_every_field)
{
    omv_checkpoint_t want, got;
    make(&want, 42, 1000, 3, 5, 7);
    memset(want.job_name, 'n', sizeof(want.job_name) - 1); /* the longest name that fits */
    want.job_name[sizeof(want.job_name) - 1] = '\0';
    write_ok(&want, dir);
    ck_assert_str_eq(listing(dir), "checkpoint-00000042.omv");

    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&got, ckpt_path(dir, 42), err);
    ck_assert_msg(r == 0, "read: %d %s", r, err);
    assert_same(&got, &want);
    omv_checkpoint_fini(&got);
    ck_assert_ptr_null(got.params); /* fini leaves a zeroed struct */
    ck_assert_uint_eq(got.param_count, 0);
    omv_checkpoint_fini(&want);
}
END_TEST

START_TEST(test_roundtrip_large)
{
    /* A million parameters, the most groups, and a sequence number past 2^32. */
    omv_checkpoint_t want, got;
    uint64_t seq = (UINT64_C(1) << 32) + 5;
    make(&want, seq, UINT64_C(1) << 20, OMV_CHECKPOINT_MAX_GROUPS, 3, 11);
    write_ok(&want, dir);
    ck_assert_str_eq(listing(dir), "checkpoint-4294967301.omv");
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&got, ckpt_path(dir, seq), err);
    ck_assert_msg(r == 0, "read: %d %s", r, err);
    assert_same(&got, &want);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&want);
}
END_TEST

START_TEST(test_roundtrip_without_optional_parts)
{
    /* No job text, no members, no evaluations yet, no optimizer, no Adam state (SGD's, as every
     * checkpoint before Adam was); ret_path may be left out. */
    omv_checkpoint_t want, got;
    make(&want, 1, 5, 1, 0, 2);
    free(want.second);
    want.second = NULL;
    free(want.model_text);
    want.model_text = NULL;
    free(want.job_text);
    free(want.members);
    want.job_text = want.members = NULL;
    free(want.opt.phases);
    memset(&want.opt, 0, sizeof(want.opt));
    ck_assert_ptr_null(want.history);
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    ck_assert_int_eq(omv_checkpoint_write(&want, dir, NULL, 0, err), 0);
    ck_assert_str_eq(listing(dir), "checkpoint-00000001.omv");
    int r = omv_checkpoint_read(&got, ckpt_path(dir, 1), err);
    ck_assert_msg(r == 0, "read: %d %s", r, err);
    assert_same(&got, &want);
    ck_assert_uint_eq(got.n_history, 0);
    ck_assert_ptr_null(got.second);
    ck_assert_uint_eq(got.adam_steps, 0);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&want);
}
END_TEST

START_TEST(test_write_replaces_and_clears_tmp)
{
    /* A crash may leave a half-written temporary file and the same number may be written again
     * after a restart: the new write wins and no temporary file remains. */
    write_seq(dir, 7);
    put_text(dir, "checkpoint-00000007.omv.tmp", "half a checkpoi");
    omv_checkpoint_t want, got;
    make(&want, 7, 100, 4, 1, 99);
    write_ok(&want, dir);
    ck_assert_str_eq(listing(dir), "checkpoint-00000007.omv");
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    ck_assert_int_eq(omv_checkpoint_read(&got, ckpt_path(dir, 7), err), 0);
    assert_same(&got, &want);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&want);
}
END_TEST

START_TEST(test_tmp_link_not_followed)
{
    /* Someone who may write the checkpoint folder leaves a link where the next temporary file
     * goes: the write is refused, naming the path, and the file the link names is untouched. */
    char victim[700], link[700];
    snprintf(victim, sizeof(victim), "%s/victim", dir);
    put_text(dir, "victim", "precious");
    snprintf(link, sizeof(link), "%s.tmp", ckpt_path(dir, 3));
    ck_assert_int_eq(symlink(victim, link), 0);
    omv_checkpoint_t c;
    make(&c, 3, 64, 2, 2, 3);
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    ck_assert_int_lt(omv_checkpoint_write(&c, dir, NULL, 0, err), 0);
    ck_assert_msg(strstr(err, link) && strstr(err, "refused"), "%s", err);
    FILE *f = fopen(victim, "r");
    char got[32] = "";
    ck_assert_ptr_nonnull(fgets(got, sizeof(got), f));
    fclose(f);
    ck_assert_str_eq(got, "precious");
    omv_checkpoint_fini(&c);
}
END_TEST

/* Whether path exists. */
static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

START_TEST(test_checkpoint_dir_confined)
{
    /* A job's [checkpoint] dir stays in the state folder (or the daemon's checkpoint_root):
     * neither "..", nor an absolute path elsewhere, nor a link inside leads out. */
    char state[700], other[700], outside[700], root[700];
    snprintf(state, sizeof(state), "%s/state", dir);
    snprintf(other, sizeof(other), "%s/other", dir);
    snprintf(root, sizeof(root), "%s/root", dir);
    ck_assert_int_eq(mkdir(state, 0750), 0);
    ck_assert_int_eq(mkdir(other, 0750), 0);
    static omv_job_t job;
    memset(&job, 0, sizeof(job));
    strcpy(job.name, "j");
    omv_run_ckpt_t ck;
    const char *refused[] = {"../other/x", "", "", "sneaky/x"};
    snprintf(outside, sizeof(outside), "%s/../other/y", state);
    refused[1] = outside;
    refused[2] = other;
    snprintf(outside, sizeof(outside), "%s/sneaky", state);
    ck_assert_int_eq(symlink(other, outside), 0);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        snprintf(job.checkpoint_dir, sizeof(job.checkpoint_dir), "%s", refused[i]);
        ck_assert_msg(omv_run_ckpt_init(&ck, &job, state, NULL) == -EPERM, "%s", refused[i]);
        ck_assert(!ck.enabled);
    }
    char made[800];
    snprintf(made, sizeof(made), "%s/x", other);
    ck_assert_msg(!exists(made), "a folder was made outside: %s", made);
    snprintf(made, sizeof(made), "%s/y", other);
    ck_assert_msg(!exists(made), "a folder was made outside: %s", made);
    /* Inside: relative to the state folder, the default, and under a configured root. */
    strcpy(job.checkpoint_dir, "mine/ckpt");
    ck_assert_int_eq(omv_run_ckpt_init(&ck, &job, state, NULL), 0);
    ck_assert(ck.enabled);
    snprintf(made, sizeof(made), "%s/mine/ckpt", state);
    ck_assert_str_eq(ck.dir, made);
    job.checkpoint_dir[0] = '\0';
    ck_assert_int_eq(omv_run_ckpt_init(&ck, &job, state, NULL), 0);
    snprintf(made, sizeof(made), "%s/checkpoints/j", state);
    ck_assert_str_eq(ck.dir, made);
    snprintf(job.checkpoint_dir, sizeof(job.checkpoint_dir), "%s/a", root);
    ck_assert_int_eq(omv_run_ckpt_init(&ck, &job, state, NULL), -EPERM);
    ck_assert_int_eq(omv_run_ckpt_init(&ck, &job, state, root), 0);
    ck_assert(ck.enabled && exists(job.checkpoint_dir));
}
END_TEST

START_TEST(test_find_numbers_after_unusable_ones)
{
    /* A resume that had to pass over damaged checkpoints numbers the next one after them all,
     * so that pruning keeps what it writes and not the damaged ones. */
    char state[700];
    snprintf(state, sizeof(state), "%s/state", dir);
    ck_assert_int_eq(mkdir(state, 0750), 0);
    static omv_job_t job;
    memset(&job, 0, sizeof(job));
    strcpy(job.name, "j");
    job.checkpoint_resume = 1;
    omv_run_ckpt_t ck;
    ck_assert_int_eq(omv_run_ckpt_init(&ck, &job, state, NULL), 0);
    for (uint64_t s = 1; s <= 3; s++)
        write_seq(ck.dir, s);
    flip_byte(ckpt_path(ck.dir, 2), 40);
    flip_byte(ckpt_path(ck.dir, 3), 40);
    omv_checkpoint_t c;
    ck_assert_int_eq(omv_run_ckpt_find(&ck, &job, 64, 4, &c), 1);
    ck_assert_uint_eq(c.seq, 1);
    ck_assert_uint_eq(ck.seq, 3);
    omv_checkpoint_fini(&c);
}
END_TEST

START_TEST(test_unknown_section_is_skipped)
{
    /* A later version may add sections without a new format number. */
    omv_checkpoint_t want, got;
    make(&want, 3, 10, 2, 2, 5);
    write_ok(&want, dir);
    bytes_t b = body_of(ckpt_path(dir, 3));
    b_section(&b, 99, "from the future", 15);
    b_seal_to(&b, ckpt_path(dir, 3));
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&got, ckpt_path(dir, 3), err);
    ck_assert_msg(r == 0, "read: %d %s", r, err);
    assert_same(&got, &want);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&want);
}
END_TEST

START_TEST(test_failed_write_keeps_previous)
{
    /* A write that fails part-way (here: the file size limit, as a full disk would) leaves the
     * checkpoint of the same number as it was and no temporary file behind. */
    omv_checkpoint_t old, big, got;
    make(&old, 5, 64, 2, 1, 3);
    write_ok(&old, dir);
    make(&big, 5, 100000, 2, 1, 4);
    struct rlimit was, small;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
    small = was;
    small.rlim_cur = 64 * 1024;
    void (*handler)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    char path[4200] = "untouched";
    int r = omv_checkpoint_write(&big, dir, path, sizeof(path), err);
    setrlimit(RLIMIT_FSIZE, &was);
    signal(SIGXFSZ, handler);
    ck_assert_int_eq(r, -EFBIG);
    ck_assert_msg(strstr(err, ckpt_path(dir, 5)) != NULL, "the error does not name the file: %s",
                  err);
    ck_assert_str_eq(path, "untouched");
    ck_assert_str_eq(listing(dir), "checkpoint-00000005.omv");
    ck_assert_int_eq(omv_checkpoint_read(&got, ckpt_path(dir, 5), err), 0);
    assert_same(&got, &old);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&big);
    omv_checkpoint_fini(&old);
}
END_TEST

/* ---- the optimizer's section ---- */

START_TEST(test_optimizer_section_is_optional)
{
    /* Written without it (a job without the optimizer), and crafted as writers before it made
     * them: both read, with present = 0. */
    omv_checkpoint_t want, got;
    make(&want, 1, 4, 2, 0, 3);
    free(want.opt.phases);
    memset(&want.opt, 0, sizeof(want.opt));
    free(want.second); /* an SGD job's, without its model text */
    want.second = NULL;
    free(want.model_text);
    want.model_text = NULL;
    write_ok(&want, dir);
    size_t len;
    unsigned char *buf = slurp(ckpt_path(dir, 1), &len);
    uint32_t sections;
    memcpy(&sections, buf + 12, 4);
    ck_assert_uint_eq(sections, 7);
    free(buf);
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    ck_assert_int_eq(omv_checkpoint_read(&got, ckpt_path(dir, 1), err), 0);
    ck_assert_uint_eq(got.opt.present, 0);
    ck_assert_ptr_null(got.opt.phases);
    omv_checkpoint_fini(&got);
    omv_checkpoint_fini(&want);

    uint64_t clocks[2] = {5, 6};
    float params[4] = {1, 2, 3, 4};
    bytes_t b = {0};
    b_header(&b, OMV_CHECKPOINT_FORMAT, 7);
    b_meta(&b, 2, 2, 4, 0);
    b_section(&b, TAG_CLOCKS, clocks, sizeof(clocks));
    b_section(&b, TAG_PARAMS, params, sizeof(params));
    b_section(&b, TAG_VELOCITY, params, sizeof(params));
    b_section(&b, TAG_HISTORY, NULL, 0);
    b_section(&b, TAG_JOB, "[job]\n", 6);
    b_section(&b, TAG_MEMBERS, NULL, 0);
    b_seal_to(&b, ckpt_path(dir, 2));
    ck_assert_int_eq(omv_checkpoint_read(&got, ckpt_path(dir, 2), err), 0);
    ck_assert_uint_eq(got.opt.present, 0);
    ck_assert_uint_eq(got.clocks[1], 6);
    ck_assert_ptr_null(got.second); /* written before Adam: SGD's state */
    omv_checkpoint_fini(&got);
}
END_TEST

START_TEST(test_optimizer_section_later_layout)
{
    /* A later layout appends fields after the phases: this reader takes what it knows. */
    bytes_t o = {0};
    b_opt_fixed(&o, 2, 1, 1);
    ck_assert_uint_eq(o.len, OPT_FIXED_BYTES);
    b_u32(&o, 1);
    b_u32(&o, 4);
    b_f64(&o, 0.6);
    b_f64(&o, 0.01);
    b_f64(&o, 0.25);
    ck_assert_uint_eq(o.len, OPT_FIXED_BYTES + OPT_PHASE_BYTES);
    b_put(&o, "a later field", 13);
    write_with_optimizer_section(ckpt_path(dir, 1), o.data, o.len);
    free(o.data);
    omv_checkpoint_t got;
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    int r = omv_checkpoint_read(&got, ckpt_path(dir, 1), err);
    ck_assert_msg(r == 0, "read: %d %s", r, err);
    ck_assert_uint_eq(got.opt.present, 1);
    ck_assert_uint_eq(got.opt.state.phase, 2);
    ck_assert_uint_eq(got.opt.state.running, 1);
    ck_assert_uint_eq(got.opt.state.phase_steps_done, 17);
    ck_assert(got.opt.state.momentum == 0.6);
    ck_assert_uint_eq(got.opt.probe_images_total, 4096);
    ck_assert(got.opt.probe_seconds_total == 1.5);
    ck_assert_uint_eq(got.opt.n_phases, 1);
    ck_assert(got.opt.phases[0].epoch == 0.25);
    omv_checkpoint_fini(&got);
}
END_TEST

static Suite *checkpoint_suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("roundtrip");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip_every_field);
    tcase_add_test(tc, test_roundtrip_large);
    tcase_add_test(tc, test_roundtrip_without_optional_parts);
    tcase_add_test(tc, test_write_replaces_and_clears_tmp);
    tcase_add_test(tc, test_tmp_link_not_followed);
    tcase_add_test(tc, test_checkpoint_dir_confined);
    tcase_add_test(tc, test_find_numbers_after_unusable_ones);
    tcase_add_test(tc, test_unknown_section_is_skipped);
    tcase_add_test(tc, test_failed_write_keeps_previous);
    tcase_add_test(tc, test_optimizer_section_is_optional);
    tcase_add_test(tc, test_optimizer_section_later_layout);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(checkpoint_suite());
}
