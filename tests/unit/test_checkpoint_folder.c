/* The checkpoint folder: the newest usable checkpoint is found, old ones are pruned, and the
 * folder is made as needed or its problem named. Helpers: tests/lib/checkpoint_util.c. */
#define _GNU_SOURCE /* unshare(CLONE_NEWNS), for a read-only mount of our own */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "checkpoint.h"
#include "checkpoint_util.h"
#include "run_checkpoint.h"
#include "testutil.h"
#include "util.h"

/* ---- the folder ---- */

/* What the bad-checkpoint callback was told. */
typedef struct {
    int calls;
    char paths[8][4200];
    char reasons[8][OMV_CHECKPOINT_ERR_MAX];
} bad_log_t;

static void on_bad(void *ctx, const char *path, const char *reason)
{
    bad_log_t *log = ctx;
    if (log->calls < 8) {
        snprintf(log->paths[log->calls], sizeof(log->paths[0]), "%s", path);
        snprintf(log->reasons[log->calls], sizeof(log->reasons[0]), "%s", reason);
    }
    log->calls++;
}

/* Loads the latest checkpoint of folder; returns the result and, on 1, its seq. */
static int load(const char *folder, bad_log_t *log, uint64_t *ret_seq)
{
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    char path[4200] = "";
    memset(log, 0, sizeof(*log));
    int r = omv_checkpoint_load_latest(&c, folder, path, sizeof(path), on_bad, log);
    if (r == 1) {
        /* It is intact, and the file named is the one handed back. */
        omv_checkpoint_t want;
        make(&want, c.seq, 64, 2, 2, c.seq);
        assert_same(&c, &want);
        omv_checkpoint_fini(&want);
        uint64_t seq = c.seq;
        omv_checkpoint_fini(&c);
        ck_assert_msg(strcmp(path, ckpt_path(folder, seq)) == 0,
                      "loaded %s, which holds checkpoint %" PRIu64, path, seq);
        *ret_seq = seq;
    } else {
        ck_assert_ptr_null(c.params);
    }
    return r;
}

START_TEST(test_load_latest_takes_newest)
{
    for (uint64_t s = 1; s <= 3; s++)
        write_seq(dir, s);
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 3);
    ck_assert_int_eq(log.calls, 0);
}
END_TEST

START_TEST(test_load_latest_skips_corrupt)
{
    for (uint64_t s = 1; s <= 3; s++)
        write_seq(dir, s);
    char third[4200];
    snprintf(third, sizeof(third), "%s", ckpt_path(dir, 3));
    flip_byte(third, file_size(third) / 2);
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 2);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.paths[0], third);
    ck_assert_msg(strstr(log.reasons[0], "checksum") != NULL, "reason: %s", log.reasons[0]);

    /* A truncated newest one is passed over the same way. */
    truncate_to(ckpt_path(dir, 2), 100);
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 1);
    ck_assert_int_eq(log.calls, 2);
    ck_assert_str_eq(log.paths[0], third);
    ck_assert_str_eq(log.paths[1], ckpt_path(dir, 2));
    ck_assert_msg(strstr(log.reasons[1], "truncated") != NULL, "reason: %s", log.reasons[1]);
}
END_TEST

START_TEST(test_load_latest_all_corrupt)
{
    for (uint64_t s = 1; s <= 3; s++) {
        write_seq(dir, s);
        flip_byte(ckpt_path(dir, s), 40);
    }
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 0);
    ck_assert_int_eq(log.calls, 3);
    for (int i = 0; i < 3; i++) { /* newest first */
        ck_assert_str_eq(log.paths[i], ckpt_path(dir, (uint64_t)(3 - i)));
        ck_assert_msg(log.reasons[i][0] != '\0', "no reason for %s", log.paths[i]);
    }
    /* The callback is optional. */
    omv_checkpoint_t c;
    char path[4200];
    ck_assert_int_eq(omv_checkpoint_load_latest(&c, dir, path, sizeof(path), NULL, NULL), 0);
}
END_TEST

START_TEST(test_load_latest_empty_or_missing)
{
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 0);
    ck_assert_int_eq(log.calls, 0);
    char missing[4200];
    snprintf(missing, sizeof(missing), "%s/not/there", dir);
    ck_assert_int_eq(load(missing, &log, &seq), 0);
    ck_assert_int_eq(log.calls, 0);
    /* A folder that is a file cannot be read: that is an error, not "no checkpoint". */
    char file[4200];
    snprintf(file, sizeof(file), "%s/file", dir);
    spill(file, "x", 1);
    ck_assert_int_lt(load(file, &log, &seq), 0);
}
END_TEST

START_TEST(test_load_latest_ignores_other_names)
{
    write_seq(dir, 1);
    write_seq(dir, 2);
    /* Intact checkpoints under names that are not ours, newer than the real ones. */
    char other[4200];
    const char *names[] = {"checkpoint-abc.omv",          "notes.txt",
                           "checkpoint-00000004.omv.tmp", "checkpoint-00000005.omv.bak",
                           "checkpoint-00000006.om",      "checkpoint-00000007"};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(names); i++) {
        snprintf(other, sizeof(other), "%s/%s", dir, names[i]);
        copy_file(ckpt_path(dir, 1), other);
    }
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 2);
    ck_assert_int_eq(log.calls, 0);
}
END_TEST

START_TEST(test_load_latest_ignores_signed_names)
{
    /* strtoull-style parsing reads "-1" as 2^64-1 and "+9" as 9: a file named so would be taken
     * for the newest checkpoint, resumed from, and kept by prune in place of a real one. */
    write_seq(dir, 1);
    write_seq(dir, 2);
    char other[4200];
    const char *names[] = {"checkpoint--1.omv", "checkpoint-+9.omv", "checkpoint- 9.omv"};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(names); i++) {
        snprintf(other, sizeof(other), "%s/%s", dir, names[i]);
        copy_file(ckpt_path(dir, 1), other);
    }
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_msg(seq == 2 && log.calls == 0,
                  "resumed from checkpoint %" PRIu64 " (%d reported bad), not from 2", seq,
                  log.calls);
    ck_assert_int_eq(omv_checkpoint_prune(dir, 1), 1);
    ck_assert_str_eq(listing(dir), "checkpoint- 9.omv checkpoint-+9.omv checkpoint--1.omv "
                                   "checkpoint-00000002.omv");
}
END_TEST

START_TEST(test_load_latest_numeric_order)
{
    /* Past eight digits the names no longer sort as text: 100000000 is newer than 99999999. */
    write_seq(dir, 99999999);
    write_seq(dir, 100000000);
    write_seq(dir, 9);
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 100000000);
    ck_assert_int_eq(omv_checkpoint_prune(dir, 2), 1);
    ck_assert_str_eq(listing(dir), "checkpoint-100000000.omv checkpoint-99999999.omv");
}
END_TEST

START_TEST(test_load_latest_skips_unreadable_entry)
{
    /* A folder under a checkpoint's name is reported and passed over. */
    write_seq(dir, 1);
    char sub[4200];
    snprintf(sub, sizeof(sub), "%s", ckpt_path(dir, 2));
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 1);
    ck_assert_int_eq(log.calls, 1);
    ck_assert_str_eq(log.paths[0], sub);
    ck_assert_msg(strstr(log.reasons[0], sub) != NULL, "reason: %s", log.reasons[0]);
}
END_TEST

/* ---- pruning ---- */

START_TEST(test_prune_keeps_newest)
{
    for (uint64_t s = 1; s <= 5; s++)
        write_seq(dir, s);
    put_text(dir, "notes.txt", "mine\n");
    put_text(dir, "checkpoint-abc.omv", "not a checkpoint name\n");
    ck_assert_int_eq(omv_checkpoint_prune(dir, 2), 3);
    ck_assert_str_eq(listing(dir), "checkpoint-00000004.omv checkpoint-00000005.omv "
                                   "checkpoint-abc.omv notes.txt");
    /* Nothing more to do, and keeping more than there are removes nothing. */
    ck_assert_int_eq(omv_checkpoint_prune(dir, 2), 0);
    ck_assert_int_eq(omv_checkpoint_prune(dir, 10), 0);
    ck_assert_str_eq(listing(dir), "checkpoint-00000004.omv checkpoint-00000005.omv "
                                   "checkpoint-abc.omv notes.txt");
    bad_log_t log;
    uint64_t seq = 0;
    ck_assert_int_eq(load(dir, &log, &seq), 1);
    ck_assert_uint_eq(seq, 5);
}
END_TEST

START_TEST(test_prune_removes_stale_tmp)
{
    write_seq(dir, 1);
    write_seq(dir, 2);
    put_text(dir, "checkpoint-00000003.omv.tmp", "a crash mid-write");
    put_text(dir, "checkpoint-00000001.omv.tmp", "an older one");
    put_text(dir, "other.omv.tmp", "not ours");
    ck_assert_int_eq(omv_checkpoint_prune(dir, 2), 2);
    ck_assert_str_eq(listing(dir), "checkpoint-00000001.omv checkpoint-00000002.omv "
                                   "other.omv.tmp");
}
END_TEST

START_TEST(test_prune_missing_folder)
{
    char missing[4200];
    snprintf(missing, sizeof(missing), "%s/none", dir);
    ck_assert_int_eq(omv_checkpoint_prune(missing, 1), 0);
}
END_TEST

/* ---- the folder itself ---- */

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

START_TEST(test_mkdirs_nested)
{
    char deep[4200], mid[4200];
    snprintf(deep, sizeof(deep), "%s/a/b/c", dir);
    snprintf(mid, sizeof(mid), "%s/a/b", dir);
    ck_assert_int_eq(omv_checkpoint_mkdirs(deep), 0);
    ck_assert(is_dir(mid));
    ck_assert(is_dir(deep));
    ck_assert_int_eq(omv_checkpoint_mkdirs(deep), 0); /* already there */
    ck_assert_int_eq(omv_checkpoint_mkdirs(mid), 0);
    snprintf(deep, sizeof(deep), "%s/a/b/d/", dir); /* a trailing slash */
    ck_assert_int_eq(omv_checkpoint_mkdirs(deep), 0);
    ck_assert(is_dir(deep));
    /* write makes its folder. */
    snprintf(deep, sizeof(deep), "%s/x/y/z", dir);
    omv_checkpoint_t c;
    make(&c, 1, 8, 1, 0, 1);
    write_ok(&c, deep);
    omv_checkpoint_fini(&c);
    ck_assert_str_eq(listing(deep), "checkpoint-00000001.omv");
}
END_TEST

START_TEST(test_mkdirs_on_a_file)
{
    /* A regular file where the folder should be is not a folder. */
    char file[4200];
    snprintf(file, sizeof(file), "%s/file", dir);
    spill(file, "x", 1);
    int r = omv_checkpoint_mkdirs(file);
    ck_assert_msg(r < 0, "mkdirs of the regular file %s returned %d", file, r);
}
END_TEST

/* In a child with a mount namespace of its own: dir bind-mounted read-only over itself, then
 * the check. Writes its message to fd; exits with the check's errno, or 255 when there is no
 * namespace to be had. */
static void check_on_read_only_mount(const char *folder, int fd)
{
    /* "none" where the kernel ignores source and type: valgrind takes NULL for a bad pointer
     * (and the child, still under it, would exit with its error status). */
    if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount(folder, folder, "none", MS_BIND, NULL) < 0 ||
        mount("none", folder, "none", MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)
        _exit(255);
    char why[1024] = "";
    int r = omv_run_ckpt_check_dir(folder, why, sizeof(why));
    ssize_t w = write(fd, why, strlen(why));
    (void)w;
    _exit(-r);
}

START_TEST(test_check_dir_names_the_folder_and_the_fix)
{
    /* What start and submit check (run_checkpoint.c): a folder the daemon may write passes and
     * is left as it was. */
    char why[1024] = "";
    ck_assert_int_eq(omv_run_ckpt_check_dir(dir, why, sizeof(why)), 0);
    ck_assert_str_eq(listing(dir), "");
    if (geteuid() != 0) {
        /* Not ours to write: the message says how to fix it. */
        ck_assert_int_eq(chmod(dir, 0500), 0);
        int r = omv_run_ckpt_check_dir(dir, why, sizeof(why));
        chmod(dir, 0700);
        ck_assert_int_eq(r, -EACCES);
        ck_assert_msg(strstr(why, dir) && strstr(why, "chown omnivore"), "%s", why);
        return;
    }
    /* An existing folder on a read-only mount, as ProtectSystem=strict makes every folder but
     * the state folder: mkdir passes, a checkpoint would not. The message names the folder and
     * the drop-in that allows it. */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        check_on_read_only_mount(dir, fds[1]);
    }
    close(fds[1]);
    ssize_t n = read(fds[0], why, sizeof(why) - 1);
    close(fds[0]);
    why[n > 0 ? n : 0] = '\0';
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    if (WEXITSTATUS(status) == 255) {
        printf("test_check_dir: no mount namespace here: the read-only case is skipped\n");
        return;
    }
    ck_assert_int_eq(WEXITSTATUS(status), EROFS);
    char want[4200];
    snprintf(want, sizeof(want), "the daemon cannot write checkpoints to '%s'", dir);
    ck_assert_msg(strstr(why, want), "%s", why);
    snprintf(want, sizeof(want), "ReadWritePaths=%s in a drop-in (systemctl edit omnivored)", dir);
    ck_assert_msg(strstr(why, want) && strstr(why, "ProtectSystem=strict"), "%s", why);
}
END_TEST

START_TEST(test_write_where_no_folder_can_be)
{
    char file[4200], below[4200];
    snprintf(file, sizeof(file), "%s/file", dir);
    spill(file, "keep me", 7);
    snprintf(below, sizeof(below), "%s/file/sub/deeper", dir);
    omv_checkpoint_t c;
    make(&c, 1, 8, 1, 0, 1);
    char err[OMV_CHECKPOINT_ERR_MAX] = "";
    char path[4200] = "untouched";
    int r = omv_checkpoint_write(&c, below, path, sizeof(path), err);
    ck_assert_int_eq(r, -ENOTDIR);
    ck_assert_msg(strstr(err, below) != NULL, "the error does not name the folder: %s", err);
    ck_assert_str_eq(path, "untouched");
    /* The file itself as the folder. */
    err[0] = '\0';
    r = omv_checkpoint_write(&c, file, path, sizeof(path), err);
    ck_assert_int_lt(r, 0);
    ck_assert_msg(strstr(err, file) != NULL, "the error does not name the folder: %s", err);
    ck_assert_str_eq(path, "untouched");
    omv_checkpoint_fini(&c);
    ck_assert_str_eq(listing(dir), "file");
    size_t len;
    unsigned char *buf = slurp(file, &len);
    ck_assert_uint_eq(len, 7);
    ck_assert_mem_eq(buf, "keep me", 7);
    free(buf);
}
END_TEST

static Suite *checkpoint_folder_suite(void)
{
    Suite *s = suite_create("checkpoint_folder");
    TCase *tc = tcase_create("folder");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_load_latest_takes_newest);
    tcase_add_test(tc, test_load_latest_skips_corrupt);
    tcase_add_test(tc, test_load_latest_all_corrupt);
    tcase_add_test(tc, test_load_latest_empty_or_missing);
    tcase_add_test(tc, test_load_latest_ignores_other_names);
    tcase_add_test(tc, test_load_latest_ignores_signed_names);
    tcase_add_test(tc, test_load_latest_numeric_order);
    tcase_add_test(tc, test_load_latest_skips_unreadable_entry);
    tcase_add_test(tc, test_prune_keeps_newest);
    tcase_add_test(tc, test_prune_removes_stale_tmp);
    tcase_add_test(tc, test_prune_missing_folder);
    tcase_add_test(tc, test_mkdirs_nested);
    tcase_add_test(tc, test_mkdirs_on_a_file);
    tcase_add_test(tc, test_write_where_no_folder_can_be);
    tcase_add_test(tc, test_check_dir_names_the_folder_and_the_fix);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(checkpoint_folder_suite());
}
