/* Job files and the declarative config table: values and defaults, relative data paths, errors
 * that name file, line and key, cross-key rules, and command-line overrides. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "job.h"
#include "wire.h"
#include "testutil.h"

static char dir[256];
static char path[512];

/* One folder per test case, made and removed outside the forked tests so that a failing test
 * leaves nothing behind; every test writes the files it reads. */
static void setup(void)
{
    omv_test_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/test.job", dir);
}

static void teardown(void)
{
    omv_test_rmdir(dir);
}

static void write_job(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    fclose(f);
}

/* Loads text as a job file (NULL: the file as it is) and expects a refusal whose message holds
 * each of the words. */
static void assert_refused(const char *text, const char *words[])
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    if (text != NULL)
        write_job(text);
    memset(&job, 0, sizeof(job));
    job.epochs = 777;
    ck_assert_int_lt(omv_job_load(&job, path, err), 0);
    for (int i = 0; words[i]; i++)
        ck_assert_msg(strstr(err, words[i]) != NULL, "error '%s' does not hold '%s'", err,
                      words[i]);
    ck_assert_int_eq(job.epochs, 777); /* the job is written only on success */
}

/* "path:line:" for the job file. */
static const char *at(int line)
{
    static char buf[600];
    snprintf(buf, sizeof(buf), "%s:%d:", path, line);
    return buf;
}

START_TEST(test_valid_job)
{
    write_job("; a comment\n"
              "[job]\n"
              "name = tiny\n"
              "epochs = 7\n"
              "[model]\n"
              "layers = 784, 128 10\n"
              "[data]\n"
              "train_images = /abs/train-images.gz\n"
              "[train]\n"
              "batch_size = 96\n"
              "learning_rate = 0.125\n"
              "weight_decay = 0.0005\n"
              "[cluster]\n"
              "workers = 6\n"
              "groups = 2\n"
              "staleness = 3\n"
              "shards = 4\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_str_eq(job.name, "tiny");
    ck_assert_int_eq(job.epochs, 7);
    ck_assert_uint_eq(job.n_layers, 3);
    ck_assert_uint_eq(job.layers[0], 784);
    ck_assert_uint_eq(job.layers[1], 128);
    ck_assert_uint_eq(job.layers[2], 10);
    ck_assert_str_eq(job.train_images, "/abs/train-images.gz");
    ck_assert_int_eq(job.batch_size, 96);
    ck_assert_double_eq(job.learning_rate, 0.125);
    ck_assert_double_eq_tol(job.weight_decay, 0.0005, 1e-12);
    ck_assert_int_eq(job.workers, 6);
    ck_assert_int_eq(job.groups, 2);
    ck_assert_int_eq(job.staleness, 3);
    ck_assert_int_eq(job.shards, 4);
    /* Defaults for keys the file leaves out. */
    ck_assert_int_eq(job.seed, 42);
    ck_assert_double_eq_tol(job.momentum, 0.9, 1e-12);
    ck_assert_double_eq_tol(job.worker_timeout_s, 10.0, 1e-12);
    ck_assert_int_eq(job.train_limit, 0);
    ck_assert_int_eq(job.eval_batch_size, 1000);
    ck_assert_double_eq_tol(job.eval_every_epochs, 0.5, 1e-12);
    ck_assert_str_eq(job.test_labels,
                     "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
}
END_TEST

START_TEST(test_minimal_job_defaults)
{
    write_job("[model]\nlayers = 4 2\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_str_eq(job.name, "job");
    ck_assert_int_eq(job.epochs, 3);
    ck_assert_int_eq(job.batch_size, 64);
    ck_assert_double_eq_tol(job.learning_rate, 0.01, 1e-12);
    ck_assert_int_eq(job.workers, 2);
    ck_assert_int_eq(job.groups, 1);
    ck_assert_int_eq(job.staleness, -1); /* default "none" */
    ck_assert_int_eq(job.shards, 2);
    ck_assert_int_eq(job.wire, OMV_WIRE_BF16);
    write_job("[model]\nlayers = 4 2\n[cluster]\nwire = int8\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.wire, OMV_WIRE_INT8);
}
END_TEST

START_TEST(test_relative_paths)
{
    write_job("[model]\nlayers = 4 2\n"
              "[data]\n"
              "train_images = data/train.gz\n"
              "train_labels = ../labels.gz\n"
              "test_images = /srv/test.gz\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "", want[700];
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    snprintf(want, sizeof(want), "%s/data/train.gz", dir);
    ck_assert_str_eq(job.train_images, want);
    snprintf(want, sizeof(want), "%s/../labels.gz", dir);
    ck_assert_str_eq(job.train_labels, want);
    ck_assert_str_eq(job.test_images, "/srv/test.gz");
}
END_TEST

/* A job file naming train_images as a path of `len` bytes; the path lands in out. */
static void write_long_path_job(char *out, size_t len)
{
    char text[600];
    memset(out, 'p', len);
    out[0] = '/';
    out[len] = '\0';
    snprintf(text, sizeof(text), "[model]\nlayers = 4 2\n[data]\ntrain_images = %s\n[job]\n", out);
    write_job(text);
}

START_TEST(test_long_lines)
{
    /* inih reads lines of up to 198 characters: a path that fits loads exactly as written... */
    char long_path[400];
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    write_long_path_job(long_path, 180);
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_str_eq(job.train_images, long_path);
    /* ...and a longer line is refused with its own number, never loaded cut short or reported
     * as a syntax error on a line the file does not have. */
    write_long_path_job(long_path, 300);
    const char *words[] = {at(4), "longer", NULL};
    assert_refused(NULL, words);
}
END_TEST

START_TEST(test_unknown_key)
{
    const char *words[] = {at(4), "learning_rat", "unknown key", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\nlearning_rat = 0.1\n", words);
    const char *words2[] = {at(2), "[nosuch] layers", NULL};
    assert_refused("[nosuch]\nlayers = 4 2\n", words2);
}
END_TEST

START_TEST(test_duplicate_key)
{
    const char *words[] = {at(5), "epochs", "duplicate", "line 4", NULL};
    assert_refused("[model]\nlayers = 4 2\n[job]\nepochs = 2\nepochs = 3\n", words);
}
END_TEST

START_TEST(test_bad_values)
{
    const char *words[] = {at(4), "epochs", "three", NULL};
    assert_refused("[model]\nlayers = 4 2\n[job]\nepochs = three\n", words);
    const char *words2[] = {at(2), "learning_rate", "1.5x", NULL};
    assert_refused("[train]\nlearning_rate = 1.5x\n[model]\nlayers = 4 2\n", words2);
    const char *words3[] = {at(4), "epochs", "out of range", NULL};
    assert_refused("[model]\nlayers = 4 2\n[job]\nepochs = 0\n", words3);
    const char *words4[] = {at(2), "momentum", "out of range", NULL};
    assert_refused("[train]\nmomentum = 1.0\n[model]\nlayers = 4 2\n", words4);
    const char *words5[] = {at(2), "staleness", NULL};
    assert_refused("[cluster]\nstaleness = -2\n[model]\nlayers = 4 2\n", words5);
    const char *words6[] = {path, "[cluster] wire", "'int4'", "fp32, bf16 or int8", NULL};
    assert_refused("[cluster]\nwire = int4\n[model]\nlayers = 4 2\n", words6);
}
END_TEST

START_TEST(test_bad_layers)
{
    const char *words[] = {at(3), "layers", "784 x 10", NULL};
    assert_refused("[job]\n[model]\nlayers = 784 x 10\n", words);
    const char *words2[] = {at(2), "layers", NULL};
    assert_refused("[model]\nlayers = 784\n", words2);
    const char *words3[] = {path, "layers", "2 classes", NULL};
    assert_refused("[model]\nlayers = 784 1\n", words3);
    const char *words4[] = {path, "[model] layers", "missing", NULL};
    assert_refused("[job]\nname = x\n", words4);
}
END_TEST

/* Writes a model definition file next to the job. */
static void write_model(const char *name, const char *text)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    fclose(f);
}

START_TEST(test_definition_file)
{
    write_model("net.model", "input 1x8x8\nconv 4 3x3 pad 1\nrelu\nmaxpool 2\nfc 5\n");
    write_job("[model]\ndefinition = net.model\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    /* Relative to the job file's folder, read whole, with its input size and classes. */
    char want[600];
    snprintf(want, sizeof(want), "%s/net.model", dir);
    ck_assert_str_eq(job.definition, want);
    ck_assert_ptr_nonnull(strstr(job.model_text, "maxpool 2"));
    ck_assert_uint_eq(job.n_layers, 2);
    ck_assert_uint_eq(job.layers[0], 64);
    ck_assert_uint_eq(job.layers[1], 5);

    /* The MLP form becomes the same kind of text. */
    write_job("[model]\nlayers = 6 4 3\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_str_eq(job.model_text, "input 6\nfc 4\nrelu\nfc 3\n");
}
END_TEST

START_TEST(test_bad_definition)
{
    /* A definition error names the definition file and its line. */
    write_model("bad.model", "input 1x8x8\nconv 4 9x9\nfc 5\n");
    char where[600];
    snprintf(where, sizeof(where), "%s/bad.model:2:", dir);
    const char *words[] = {where, "does not fit", NULL};
    assert_refused("[model]\ndefinition = bad.model\n", words);
    const char *words2[] = {"nosuch.model", "cannot open", NULL};
    assert_refused("[model]\ndefinition = nosuch.model\n", words2);
    const char *words3[] = {path, "not both", NULL};
    write_model("ok.model", "input 4\nfc 2\n");
    assert_refused("[model]\nlayers = 4 2\ndefinition = ok.model\n", words3);
}
END_TEST

START_TEST(test_data_format_and_normalisation)
{
    write_model("rgb.model", "input 3x4x4\nfc 10\n");
    write_job("[model]\ndefinition = rgb.model\n[data]\nformat = cifar10\n"
              "train_images = a.bin, b.bin\ntest_images = /abs/test_batch.bin\n"
              "mean = 0.49, 0.48, 0.45\nstd = 0.25\nscale = 0.5\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX];
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    char want[1200];
    snprintf(want, sizeof(want), "%s/a.bin,%s/b.bin", dir, dir);
    ck_assert_str_eq(job.train_images, want);
    ck_assert_str_eq(job.test_images, "/abs/test_batch.bin");
    ck_assert_str_eq(job.data_format, "cifar10");
    ck_assert_uint_eq(job.n_mean, 3);
    ck_assert_float_eq_tol(job.mean[2], 0.45f, 1e-7f);
    ck_assert_uint_eq(job.n_std, 1);
    ck_assert_float_eq_tol(job.std[0], 0.25f, 1e-7f);
    ck_assert_double_eq(job.scale, 0.5);

    const char *words[] = {path, "[data] mean", "2 values for a model input of 3 channels", NULL};
    assert_refused("[model]\ndefinition = rgb.model\n[data]\nmean = 0.5 0.5\n", words);
    const char *words2[] = {path, "[data] std", "positive", NULL};
    assert_refused("[model]\nlayers = 4 2\n[data]\nstd = 0\n", words2);
    const char *words3[] = {path, "[data] format", "'png'", NULL};
    assert_refused("[model]\nlayers = 4 2\n[data]\nformat = png\n", words3);
    const char *words4[] = {path, "[data] mean", "not a list", NULL};
    assert_refused("[model]\nlayers = 4 2\n[data]\nmean = half\n", words4);
}
END_TEST

START_TEST(test_syntax_error)
{
    const char *words[] = {at(4), "syntax", NULL};
    assert_refused("[model]\nlayers = 4 2\n\nthis line has no equals sign\n", words);
    const char *words2[] = {at(3), NULL};
    assert_refused("[model]\nlayers = 4 2\n[job\n", words2);
    /* The first problem in the file is the one reported, whatever its kind. */
    const char *words3[] = {at(3), "syntax", NULL};
    assert_refused("[model]\nlayers = 4 2\nno equals sign\n[job]\nnosuch = 1\n", words3);
}
END_TEST

START_TEST(test_cluster_rules)
{
    const char *words[] = {path, "groups", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nworkers = 2\ngroups = 3\n", words);
    const char *words2[] = {path, "groups", "evenly", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nworkers = 3\ngroups = 2\n", words2);
    const char *words3[] = {path, "batch_size", "each of the 2 workers", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\nbatch_size = 1\n"
                   "[cluster]\nworkers = 4\ngroups = 2\n",
                   words3);
    /* The same numbers that split evenly load, and so does a batch that splits unevenly (2 and
     * 1 images: the update weighs each member by its images). */
    write_job("[model]\nlayers = 4 2\n[train]\nbatch_size = 4\n"
              "[cluster]\nworkers = 4\ngroups = 2\n");
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    write_job("[model]\nlayers = 4 2\n[train]\nbatch_size = 3\n"
              "[cluster]\nworkers = 4\ngroups = 2\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    /* Shard servers: at least a shard each, and not yet with split = speed; the optimizer's
     * changes are made at cuts, so it runs with them. */
    const char *words4[] = {path, "shards", "servers", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nservers = 3\nshards = 2\n", words4);
    const char *words5[] = {path, "servers = 2", "split = speed", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nservers = 2\nsplit = speed\n", words5);
    write_job("[model]\nlayers = 4 2\n[cluster]\nservers = 2\n[optimizer]\nenabled = yes\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    /* Replicas are of servers' ranges, and every copy needs a server of its own. */
    const char *words6[] = {path, "replicas = 2", "servers", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nreplicas = 2\n", words6);
    const char *words7[] = {path, "replicas = 2", "at most 16", NULL};
    assert_refused("[model]\nlayers = 4 2\n[cluster]\nservers = 9\nshards = 9\nreplicas = 2\n",
                   words7);
    write_job("[model]\nlayers = 4 2\n[cluster]\nservers = 2\nreplicas = 2\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.replicas, 2);
}
END_TEST

START_TEST(test_staleness)
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    write_job("[model]\nlayers = 4 2\n[cluster]\nstaleness = none\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.staleness, -1);
    write_job("[model]\nlayers = 4 2\n[cluster]\nstaleness = 0\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.staleness, 0);
}
END_TEST

START_TEST(test_missing_file)
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "", missing[600];
    snprintf(missing, sizeof(missing), "%s/missing.job", dir);
    ck_assert_int_eq(omv_job_load(&job, missing, err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, missing));
}
END_TEST

START_TEST(test_set_arg)
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    write_job("[model]\nlayers = 4 2\n[train]\nlearning_rate = 0.1\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    const omv_config_entry_t *t = omv_job_table;
    size_t n = omv_job_table_len;
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "train.learning_rate=0.5", err), 0);
    ck_assert_double_eq(job.learning_rate, 0.5);
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "cluster.staleness=none", err), 0);
    ck_assert_int_eq(job.staleness, -1);
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "job.name=renamed", err), 0);
    ck_assert_str_eq(job.name, "renamed");

    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "nodot=1", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "nodot"));
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "train.learning_rate", err), -EINVAL);
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "train.nosuch=1", err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "nosuch"));
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "train.learning_rate=fast", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "learning_rate"));
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "train.batch_size=0", err), -EINVAL);
    ck_assert_double_eq(job.learning_rate, 0.5); /* refusals leave values alone */
    ck_assert_int_eq(job.batch_size, 64);

    /* An override that breaks a cross-key rule is caught by validate. */
    ck_assert_int_eq(omv_config_set_arg(t, n, &job, "cluster.groups=3", err), 0);
    ck_assert_int_eq(omv_job_validate(&job, path, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "groups"));
}
END_TEST

START_TEST(test_parse_layers)
{
    uint32_t w[OMV_JOB_MAX_LAYERS];
    ck_assert_int_eq(omv_job_parse_layers("784 256,10", w, OMV_JOB_MAX_LAYERS), 3);
    ck_assert(w[0] == 784 && w[1] == 256 && w[2] == 10);
    ck_assert_int_eq(omv_job_parse_layers("784 0 10", w, OMV_JOB_MAX_LAYERS), -EINVAL);
    ck_assert_int_eq(omv_job_parse_layers("784 -3 10", w, OMV_JOB_MAX_LAYERS), -EINVAL);
    ck_assert_int_eq(omv_job_parse_layers("784 256 10", w, 2), -EINVAL);
}
END_TEST

START_TEST(test_update_rules)
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    write_job("[model]\nlayers = 4 2\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.update, OMV_JOB_UPDATE_SGD);
    write_job("[model]\nlayers = 4 2\n[train]\noptimizer = adamw\nbeta1 = 0.8\nbeta2 = 0.99\n"
              "epsilon = 1e-6\nweight_decay = 0.05\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.update, OMV_JOB_UPDATE_ADAMW);
    ck_assert_double_eq(job.beta1, 0.8);
    ck_assert_double_eq(job.beta2, 0.99);
    ck_assert_double_eq(job.epsilon, 1e-6);
    const char *bad_name[] = {path, "[train] optimizer", "'rmsprop'", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\noptimizer = rmsprop\n", bad_name);
}
END_TEST

START_TEST(test_schedules)
{
    omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX] = "";
    write_job("[job]\nepochs = 10\n[model]\nlayers = 4 2\n[train]\nschedule = step\n"
              "step_epochs = 4\nstep_factor = 0.5\nwarmup_steps = 100\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_int_eq(job.schedule, OMV_JOB_SCHEDULE_STEP);
    /* Warmup: 1/100, 50/100, then full; drops by half at epochs 4 and 8. */
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 0.0, 0), 0.01, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 0.1, 49), 0.5, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 3.99, 5000), 1.0, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 4.0, 5000), 0.5, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 9.0, 9000), 0.25, 1e-12);
    write_job("[job]\nepochs = 10\n[model]\nlayers = 4 2\n[train]\nschedule = cosine\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 0.0, 0), 1.0, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 5.0, 100), 0.5, 1e-12);
    ck_assert_double_eq_tol(omv_job_lr_factor(&job, 10.0, 200), 0.0, 1e-12);
    write_job("[model]\nlayers = 4 2\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
    ck_assert_double_eq(omv_job_lr_factor(&job, 2.5, 12345), 1.0);
    const char *bad[] = {path, "[train] schedule", "'linear'", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\nschedule = linear\n", bad);
    /* The optimizer owns the learning rate: a schedule beside it is refused, and says why. */
    const char *tuned[] = {path, "schedule", "owns the learning rate", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\nschedule = cosine\n[optimizer]\n"
                   "enabled = yes\n",
                   tuned);
    const char *warm[] = {path, "warmup_steps", "owns the learning rate", NULL};
    assert_refused("[model]\nlayers = 4 2\n[train]\nwarmup_steps = 10\n[optimizer]\n"
                   "enabled = yes\n",
                   warm);
    write_job("[model]\nlayers = 4 2\n[train]\nschedule = cosine\n[optimizer]\nenabled = yes\n"
              "tune_learning_rate = no\n");
    ck_assert_msg(omv_job_load(&job, path, err) == 0, "%s", err);
}
END_TEST

static Suite *job_suite(void)
{
    Suite *s = suite_create("job");
    TCase *tc = tcase_create("load");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_valid_job);
    tcase_add_test(tc, test_minimal_job_defaults);
    tcase_add_test(tc, test_relative_paths);
    tcase_add_test(tc, test_long_lines);
    tcase_add_test(tc, test_staleness);
    tcase_add_test(tc, test_set_arg);
    tcase_add_test(tc, test_parse_layers);
    tcase_add_test(tc, test_update_rules);
    tcase_add_test(tc, test_schedules);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_unknown_key);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_bad_layers);
    tcase_add_test(tc, test_syntax_error);
    tcase_add_test(tc, test_definition_file);
    tcase_add_test(tc, test_data_format_and_normalisation);
    tcase_add_test(tc, test_bad_definition);
    tcase_add_test(tc, test_cluster_rules);
    tcase_add_test(tc, test_missing_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(job_suite());
}
