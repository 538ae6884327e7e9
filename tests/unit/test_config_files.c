/* The shipped config files stay in step with the config tables: deploy/omnivored.conf and the
 * example job set every key the code knows, and nothing else. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "job.h"
#include "model.h"
#include "testutil.h"

static void check_file(const omv_config_entry_t *table, size_t n, void *target, const char *rel)
{
    char path[1024], err[OMV_CONFIG_ERR_MAX];
    const char *src = getenv("OMV_SOURCE_ROOT");
    ck_assert_ptr_nonnull(src);
    snprintf(path, sizeof(path), "%s/%s", src, rel);
    int lines[64];
    ck_assert_uint_le(n, 64);
    ck_assert_int_eq(omv_config_defaults(table, n, target), 0);
    int r = omv_config_load(table, n, path, target, lines, err);
    ck_assert_msg(r == 0, "%s", err);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(lines[i] > 0, "%s does not document [%s] %s", rel, table[i].section,
                      table[i].key);
}

START_TEST(test_daemon_conf)
{
    omv_daemon_config_t cfg;
    check_file(omv_daemon_table, omv_daemon_table_len, &cfg, "deploy/omnivored.conf");
}
END_TEST

START_TEST(test_example_job)
{
    omv_job_t job;
    check_file(omv_job_table, omv_job_table_len, &job, "examples/fashion-mlp.ini");
    char err[OMV_CONFIG_ERR_MAX], path[1024];
    snprintf(path, sizeof(path), "%s/examples/fashion-mlp.ini", getenv("OMV_SOURCE_ROOT"));
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.n_layers, 3);
    ck_assert_int_eq(job.layers[1], 256);
}
END_TEST

/* One of the CNN examples: every key documented, loaded and validated with its model. */
static void check_cnn_example(const char *rel, const omv_job_t *want)
{
    static omv_job_t job;
    check_file(omv_job_table, omv_job_table_len, &job, rel);
    char err[OMV_CONFIG_ERR_MAX], path[1024];
    snprintf(path, sizeof(path), "%s/%s", getenv("OMV_SOURCE_ROOT"), rel);
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    /* The definition names its input size and classes in layers. */
    ck_assert_int_eq(job.n_layers, 2);
    ck_assert_int_eq(job.layers[0], 784);
    ck_assert_int_eq(job.layers[1], 10);
    ck_assert_ptr_nonnull(strstr(job.model_text, "conv 64 5x5 pad 2"));
    ck_assert_int_eq(job.augment_pad, want->augment_pad);
    ck_assert_int_eq(job.augment_flip, want->augment_flip);
    ck_assert_int_eq(strstr(job.model_text, "batchnorm") != NULL, want->augment_flip);
}

START_TEST(test_example_cnn_job)
{
    check_cnn_example("examples/fashion-cnn.ini", &(omv_job_t){.augment_pad = 0});
    /* With batch norm and augmentation. */
    check_cnn_example("examples/fashion-cnn-bn.ini",
                      &(omv_job_t){.augment_pad = 2, .augment_flip = 1});
}
END_TEST

START_TEST(test_example_resnet_job)
{
    omv_job_t job;
    check_file(omv_job_table, omv_job_table_len, &job, "examples/fashion-resnet.ini");
    char err[OMV_CONFIG_ERR_MAX], path[1024];
    snprintf(path, sizeof(path), "%s/examples/fashion-resnet.ini", getenv("OMV_SOURCE_ROOT"));
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    /* Residual blocks with batch norm, augmented, on a cosine schedule. */
    omv_model_layout_t l;
    ck_assert_int_eq(omv_model_parse(&l, job.model_text, job.model_name, err), 0);
    ck_assert_uint_lt(l.state_offset, l.param_count);
    ck_assert_ptr_nonnull(strstr(job.model_text, "add b"));
    ck_assert_int_gt(job.augment_pad, 0);
    ck_assert_int_eq(job.schedule, OMV_JOB_SCHEDULE_COSINE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config_files");
    TCase *tc = tcase_create("shipped");
    tcase_add_test(tc, test_daemon_conf);
    tcase_add_test(tc, test_example_job);
    tcase_add_test(tc, test_example_cnn_job);
    tcase_add_test(tc, test_example_resnet_job);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
