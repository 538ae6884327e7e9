/* Job files: the declarative table of every key, and validation of the whole job. */
#include "job.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "wire.h"
#include "util.h"

#define FIELD(f) offsetof(omv_job_t, f)
#define STR(f) OMV_CONFIG_STRING, FIELD(f), sizeof(((omv_job_t *)0)->f)
#define INT(f) OMV_CONFIG_INT, FIELD(f), 0
#define DBL(f) OMV_CONFIG_DOUBLE, FIELD(f), 0
#define BOOL(f) OMV_CONFIG_BOOL, FIELD(f), 0

#define FMNIST "/usr/share/datasets/fashion-mnist/"

const omv_config_entry_t omv_job_table[] = {
    {"job", "name", STR(name), "job", 0, 0, 0, "a name for logs and status"},
    {"job", "epochs", INT(epochs), "3", 1, 10000, 0, "passes over the training set"},
    {"job", "seed", INT(seed), "42", 0, 9.0e15, 0, "seed for initialisation and shuffles"},
    {"job", "stop_at_accuracy", DBL(stop_at_accuracy), "0", 0, 1, 0,
     "end the job, done, at the first evaluation with at least this test accuracy (0: train "
     "all epochs)"},
    {"model", "layers", STR(layers_text), NULL, 0, 0, 0,
     "MLP widths, input first, e.g. 784 256 10 (ReLU between, softmax cross-entropy at the end); "
     "empty when definition is set"},
    {"model", "definition", STR(definition), NULL, 0, 0, 0,
     "a model definition file, one layer per line (relative to the job file); empty when "
     "layers is set"},
    {"model", "init", STR(init), "", 0, 0, 0,
     "start from these weights, a safetensors file as omnivorectl export writes (relative to "
     "the job file; empty: random initialisation from the seed); a tensor missing or of "
     "another shape is refused by name"},
    {"data", "train_images", STR(train_images), FMNIST "train-images-idx3-ubyte.gz", 0, 0, 0,
     "IDX images, raw or gzipped"},
    {"data", "train_labels", STR(train_labels), FMNIST "train-labels-idx1-ubyte.gz", 0, 0, 0,
     "IDX labels"},
    {"data", "test_images", STR(test_images), FMNIST "t10k-images-idx3-ubyte.gz", 0, 0, 0,
     "IDX test images"},
    {"data", "test_labels", STR(test_labels), FMNIST "t10k-labels-idx1-ubyte.gz", 0, 0, 0,
     "IDX test labels"},
    {"data", "train_limit", INT(train_limit), "0", 0, 1e9, 0,
     "use only the first N training images (0: all)"},
    {"data", "augment_pad", INT(augment_pad), "0", 0, 16, 0,
     "training only: pad each image with this many zero pixels on every side and crop it back "
     "at a random place, drawn anew every pass from the seed (0: off; 4 is usual for 28x28)"},
    {"data", "augment_flip", BOOL(augment_flip), "no", 0, 1, 0,
     "training only: flip half the images left to right, drawn anew every pass"},
    {"data", "format", STR(data_format), "idx", 0, 0, 0,
     "idx (images and labels files, raw or gzipped) or cifar10 (binary batches: train_images "
     "and test_images list them, comma-separated; the labels keys are unused)"},
    {"data", "scale", DBL(scale), "0.00392156862745098", 1e-9, 1e9, 0,
     "each pixel byte is multiplied by this (default 1/255)"},
    {"data", "mean", STR(mean_text), "", 0, 0, 0,
     "then this is subtracted: one value, or one per input channel (empty: 0)"},
    {"data", "std", STR(std_text), "", 0, 0, 0,
     "then divided by this: one value, or one per input channel (empty: 1)"},
    {"train", "batch_size", INT(batch_size), "64", 1, 65536, 0,
     "images per step of a compute group, split among its workers as evenly as it goes (the "
     "update weighs each by its images)"},
    {"train", "learning_rate", DBL(learning_rate), "0.01", 0, 100, 0, "SGD step size"},
    {"train", "momentum", DBL(momentum), "0.9", 0, 0.999, 0, "SGD momentum"},
    {"train", "weight_decay", DBL(weight_decay), "0", 0, 1, 0,
     "L2 penalty added to gradients (adamw: decoupled, the weights shrink by learning_rate x "
     "weight_decay each update)"},
    {"train", "optimizer", STR(update_name), "sgd", 0, 0, 0,
     "the update rule the daemon applies: sgd (with momentum), adam, or adamw (as PyTorch's)"},
    {"train", "beta1", DBL(beta1), "0.9", 0, 0.999999, 0,
     "adam, adamw: decay of the first moment (the optimizer tunes it as momentum)"},
    {"train", "beta2", DBL(beta2), "0.999", 0, 0.999999, 0,
     "adam, adamw: decay of the second moment"},
    {"train", "epsilon", DBL(epsilon), "1e-8", 1e-12, 1, 0,
     "adam, adamw: added to the root of the second moment"},
    {"train", "schedule", STR(schedule_name), "constant", 0, 0, 0,
     "the learning rate over the job: constant, step (times step_factor every step_epochs) or "
     "cosine (down to 0 at the last epoch)"},
    {"train", "warmup_steps", INT(warmup_steps), "0", 0, 1e9, 0,
     "the learning rate rises linearly over the first N updates (0: none)"},
    {"train", "step_epochs", DBL(step_epochs), "10", 0.001, 1e6, 0,
     "schedule = step: epochs between drops"},
    {"train", "step_factor", DBL(step_factor), "0.1", 0, 1, 0,
     "schedule = step: what each drop multiplies the learning rate by"},
    {"train", "gradient_norm_bound", DBL(gradient_norm_bound), "100", 0, 1e12, 0,
     "a pushed gradient whose norm is over this many times the largest its shard accepted lately "
     "is refused and the step goes on without it (0: no bound)"},
    {"train", "gradient_norm_warmup", INT(gradient_norm_warmup), "10", 0, 1000000000, 0,
     "gradients each shard accepts to learn their norms before the bound applies"},
    {"cluster", "workers", INT(workers), "2", 1, 1024, 0, "trainer processes the job waits for"},
    {"cluster", "groups", INT(groups), "1", 1, 1024, 0,
     "compute groups: synchronous inside, asynchronous across"},
    {"cluster", "staleness", INT(staleness), "none", 0, 1e6, OMV_CONFIG_NONE_IS_NEG,
     "bound s across groups (0: lock-step; none or -1: no bound)"},
    {"cluster", "shards", INT(shards), "2", 1, 256, 0, "parameter shards on the daemon"},
    {"cluster", "servers", INT(servers), "0", 0, 16, 0,
     "shard servers (omnivored --role shard) the model is spread over; 0: the daemon holds it"},
    {"cluster", "replicas", INT(replicas), "1", 1, 2, 0,
     "copies of each server's range: 2 puts a backup of each on another shard server (the job "
     "waits for servers x replicas of them), which workers push to as well, so that a server "
     "that dies loses no step; 1: none (a dead server's job goes back to its last checkpoint)"},
    {"cluster", "split", STR(split_name), "even", 0, 0, 0,
     "how a group's batch is shared among its members: even (as evenly as it goes), or speed "
     "(in proportion to each member's measured images/s, so a slower one does not hold its "
     "group back)"},
    {"cluster", "wire", STR(wire_name), "bf16", 0, 0, 0,
     "how parameters and gradients travel: bf16 (half the bytes, rounded to nearest even; the "
     "daemon keeps and updates fp32), fp32 (exact), or int8 (gradients as int8 with a scale "
     "per 64 values, about a quarter of the bytes, the rounding error carried into the worker's "
     "next gradient; parameters as int8 changes to a copy each worker keeps, which the server "
     "keeps too (4 bytes a parameter a worker), so the rounding goes with the next change)"},
    {"cluster", "worker_timeout_s", DBL(worker_timeout_s), "10", 0.1, 3600, 0,
     "a worker silent this long is declared dead (a trainer computing a step sends a heartbeat "
     "between its layers, once a second at most: keep this above a second and the longest "
     "layer)"},
    {"cluster", "progress_timeout_s", DBL(progress_timeout_s), "60", 0.1, 86400, 0,
     "a trainer of a running job that pushes no gradient this long (and waits for no other "
     "group) is declared dead: heartbeats alone do not hold a place in a group (keep this "
     "above the longest step)"},
    {"cluster", "start_timeout_s", DBL(start_timeout_s), "60", 0.1, 86400, 0,
     "start with the workers that came (at least one) when not all came within this long"},
    {"eval", "every_epochs", DBL(eval_every_epochs), "0.5", 0, 1000, 0,
     "evaluate on the test set this often (0: only at the end)"},
    {"eval", "batch_size", INT(eval_batch_size), "1000", 1, 65536, 0, "images per eval batch"},
    {"eval", "progress_interval_s", DBL(progress_interval_s), "2", 0.1, 3600, 0,
     "seconds between progress lines"},
    {"optimizer", "enabled", BOOL(optimizer), "no", 0, 1, 0,
     "let the daemon choose compute groups, momentum and learning rate while it trains"},
    {"optimizer", "tune_groups", BOOL(tune_groups), "yes", 0, 1, 0,
     "tune the number of groups (no: keep [cluster] groups)"},
    {"optimizer", "tune_momentum", BOOL(tune_momentum), "yes", 0, 1, 0,
     "tune momentum (no: keep [train] momentum)"},
    {"optimizer", "tune_learning_rate", BOOL(tune_learning_rate), "yes", 0, 1, 0,
     "tune the learning rate (no: keep [train] learning_rate)"},
    {"optimizer", "phase_steps", INT(phase_steps), "1000", 10, 1e9, 0,
     "steps of the slowest group in a phase; the search runs again after each"},
    {"optimizer", "probe_steps", INT(probe_steps), "0", 0, 1e9, 0,
     "steps of the slowest group per probe (0: phase_steps / 80, about 10% of a phase)"},
    {"optimizer", "later_probe_steps", INT(later_probe_steps), "0", 0, 1e9, 0,
     "per probe of later searches (0: probe_steps)"},
    {"optimizer", "first_grid_cold_lr", BOOL(first_grid_cold_lr), "yes", 0, 1, 0,
     "the first search's grids probe only the cold start's learning rate (no: a tenth too)"},
    {"checkpoint", "dir", STR(checkpoint_dir), "", 0, 0, 0,
     "where checkpoints go, in the daemon's state folder (relative: to it) or its [security] "
     "checkpoint_root (empty: STATE_DIR/checkpoints/JOB_NAME)"},
    {"checkpoint", "every_s", DBL(checkpoint_every_s), "60", 0, 1e7, 0,
     "write a checkpoint this often while training (0: not by time)"},
    {"checkpoint", "every_steps", INT(checkpoint_every_steps), "0", 0, 1e12, 0,
     "also write one every N steps of the slowest group (0: not by steps)"},
    {"checkpoint", "keep", INT(checkpoint_keep), "3", 1, 1000, 0,
     "checkpoints kept; older ones are deleted"},
    {"checkpoint", "resume", BOOL(checkpoint_resume), "yes", 0, 1, 0,
     "resume from the newest valid checkpoint of this job at start"},
};
const size_t omv_job_table_len = OMV_ARRAY_SIZE(omv_job_table);

int omv_job_parse_layers(const char *text, uint32_t *ret_widths, size_t cap)
{
    uint32_t widths[OMV_JOB_MAX_LAYERS];
    size_t n = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (*p == '\0')
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 1 << 20 || n == cap || n == OMV_JOB_MAX_LAYERS)
            return -EINVAL;
        widths[n++] = (uint32_t)v;
        p = end;
        if (*p != '\0' && *p != ' ' && *p != ',' && *p != '\t')
            return -EINVAL;
    }
    memcpy(ret_widths, widths, n * sizeof(uint32_t));
    return (int)n;
}

/* Makes a relative path relative to the job file's folder. */
static int resolve(char *path, size_t cap, const char *job_path)
{
    if (path[0] == '/' || path[0] == '\0')
        return 0;
    const char *slash = strrchr(job_path, '/');
    if (slash == NULL)
        return 0;
    char joined[OMV_JOB_PATH_MAX * 2];
    snprintf(joined, sizeof(joined), "%.*s/%s", (int)(slash - job_path), job_path, path);
    return omv_strlcpy(path, joined, cap);
}

/* Reads a model definition file into buf[cap]. */
static int read_definition(const char *path, char *buf, size_t cap, char *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open the model definition: %s", path,
                 strerror(e));
        return -e;
    }
    size_t len = fread(buf, 1, cap, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot read the model definition", path);
        return -EIO;
    }
    if (len == cap) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: model definition longer than %zu bytes", path,
                 cap - 1);
        return -EFBIG;
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len) != NULL) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: model definition is not text", path);
        return -EINVAL;
    }
    return 0;
}

/* Parses "0.49, 0.48 0.45" into v: none, one, or one per channel of the model's input. */
static int parse_floats(const char *text, const char *key, float *v, uint32_t *ret_n,
                        uint32_t channels, const char *path, char *err)
{
    uint32_t n = 0;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (*p == '\0')
            break;
        char *end;
        double x = strtod(p, &end);
        if (end == p || n == 16 || !(x > -1e9 && x < 1e9)) {
            snprintf(err, OMV_CONFIG_ERR_MAX,
                     "%s: [data] %s: '%s' is not a list of up to 16 "
                     "numbers",
                     path, key, text);
            return -EINVAL;
        }
        v[n++] = (float)x;
        p = end;
    }
    if (n > 1 && n != channels) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [data] %s: %u values for a model input of %u "
                 "channels (give one, or one per channel)",
                 path, key, n, channels);
        return -EINVAL;
    }
    *ret_n = n;
    return 0;
}

/* Fills model_text, model_name and layers from [model] and checks the model. */
static int validate_model(omv_job_t *job, const char *path, int layers_line, char *err)
{
    int has_layers = job->layers_text[strspn(job->layers_text, " \t")] != '\0';
    char at[OMV_JOB_PATH_MAX + 16];
    if (layers_line > 0)
        snprintf(at, sizeof(at), "%s:%d", path, layers_line);
    else
        snprintf(at, sizeof(at), "%s", path);
    if (!has_layers && job->definition[0] == '\0') {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [model] layers: missing (or set definition to a model file)", path);
        return -EINVAL;
    }
    if (has_layers && job->definition[0] != '\0') {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [model] definition: set either layers (an MLP) or definition, not both",
                 path);
        return -EINVAL;
    }
    omv_model_layout_t *m = malloc(sizeof(*m));
    if (m == NULL)
        return -ENOMEM;
    int r = 0;
    if (has_layers) {
        int n = omv_job_parse_layers(job->layers_text, job->layers, OMV_JOB_MAX_LAYERS);
        if (n < 2) {
            snprintf(err, OMV_CONFIG_ERR_MAX,
                     "%s: [model] layers: '%s' must be 2 to %d positive widths, input first", at,
                     job->layers_text, OMV_JOB_MAX_LAYERS);
            r = -EINVAL;
            goto out;
        }
        job->n_layers = (uint32_t)n;
        if (job->layers[n - 1] < 2) {
            snprintf(err, OMV_CONFIG_ERR_MAX,
                     "%s: [model] layers: the output needs at least 2 classes", at);
            r = -EINVAL;
            goto out;
        }
        omv_model_mlp_text(job->layers, job->n_layers, job->model_text, sizeof(job->model_text));
        snprintf(job->model_name, sizeof(job->model_name), "%s: [model] layers", path);
    } else {
        r = read_definition(job->definition, job->model_text, sizeof(job->model_text), err);
        if (r < 0)
            goto out;
        omv_strlcpy(job->model_name, job->definition, sizeof(job->model_name));
    }
    r = omv_model_parse(m, job->model_text, job->model_name, err);
    if (r < 0)
        goto out;
    if (!has_layers) {
        job->layers[0] = m->inputs;
        job->layers[1] = m->classes;
        job->n_layers = 2;
    }
    r = parse_floats(job->mean_text, "mean", job->mean, &job->n_mean, m->input.c, path, err);
    if (r == 0)
        r = parse_floats(job->std_text, "std", job->std, &job->n_std, m->input.c, path, err);
    for (uint32_t i = 0; r == 0 && i < job->n_std; i++) {
        if (!(job->std[i] > 0.0f)) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [data] std: values must be positive", path);
            r = -EINVAL;
        }
    }
    job->wire = strcmp(job->wire_name, "bf16") == 0   ? OMV_WIRE_BF16
                : strcmp(job->wire_name, "int8") == 0 ? OMV_WIRE_INT8
                : strcmp(job->wire_name, "fp32") == 0 ? OMV_WIRE_FP32
                                                      : -1;
    if (r == 0 && job->wire < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [cluster] wire: '%s' is not fp32, bf16 or int8",
                 path, job->wire_name);
        r = -EINVAL;
    }
    if (r == 0 && strcmp(job->split_name, "even") != 0 && strcmp(job->split_name, "speed") != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [cluster] split: '%s' is not even or speed", path,
                 job->split_name);
        r = -EINVAL;
    }
    job->split_by_speed = strcmp(job->split_name, "speed") == 0;
    if (r == 0 && strcmp(job->data_format, "idx") != 0 &&
        strcmp(job->data_format, "cifar10") != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [data] format: '%s' is not idx or cifar10", path,
                 job->data_format);
        r = -EINVAL;
    }
out:
    free(m);
    return r;
}

/* resolve() for each path of a comma-separated list. */
static int resolve_list(char *list, size_t cap, const char *job_path)
{
    char out[OMV_JOB_PATH_MAX] = "", item[OMV_JOB_PATH_MAX];
    const char *p = list;
    size_t at = 0;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ",");
        while (len > 0 && p[len - 1] == ' ')
            len--;
        if (len == 0)
            break;
        if (len >= sizeof(item))
            return -ENAMETOOLONG;
        memcpy(item, p, len);
        item[len] = '\0';
        p += len;
        if (resolve(item, sizeof(item), job_path) < 0)
            return -ENAMETOOLONG;
        int w = snprintf(out + at, sizeof(out) - at, "%s%s", at ? "," : "", item);
        if (w < 0 || (size_t)w >= sizeof(out) - at)
            return -ENAMETOOLONG;
        at += (size_t)w;
        while (*p == ' ')
            p++;
    }
    return omv_strlcpy(list, out, cap);
}

/* Index of name in names[n], or -1. */
static int pick(const char *name, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

/* The update rule and the schedule: names, and the optimizer's claim on the learning rate. */
static int validate_train(omv_job_t *job, const char *path, char *err)
{
    static const char *const updates[] = {"sgd", "adam", "adamw"};
    static const char *const schedules[] = {"constant", "step", "cosine"};
    job->update = pick(job->update_name, updates, 3);
    if (job->update < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [train] optimizer: '%s' is not sgd, adam or adamw",
                 path, job->update_name);
        return -EINVAL;
    }
    job->schedule = pick(job->schedule_name, schedules, 3);
    if (job->schedule < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [train] schedule: '%s' is not constant, step or cosine", path,
                 job->schedule_name);
        return -EINVAL;
    }
    if (job->optimizer && job->tune_learning_rate &&
        (job->schedule != OMV_JOB_SCHEDULE_CONSTANT || job->warmup_steps > 0)) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [train] %s: the optimizer ([optimizer] enabled) owns the learning rate; "
                 "set schedule = constant and warmup_steps = 0, or [optimizer] "
                 "tune_learning_rate = no",
                 path, job->warmup_steps > 0 ? "warmup_steps" : "schedule");
        return -EINVAL;
    }
    return 0;
}

double omv_job_lr_factor(const omv_job_t *job, double epoch, uint64_t steps)
{
    double f = 1.0;
    if (job->warmup_steps > 0 && steps < (uint64_t)job->warmup_steps)
        f = (double)(steps + 1) / (double)job->warmup_steps;
    if (job->schedule == OMV_JOB_SCHEDULE_STEP)
        f *= pow(job->step_factor, floor(epoch / job->step_epochs));
    else if (job->schedule == OMV_JOB_SCHEDULE_COSINE) {
        double x = epoch / (double)job->epochs;
        f *= 0.5 * (1.0 + cos(M_PI * (x < 1.0 ? x : 1.0)));
    }
    return f;
}

/* A model on shard servers: what they cannot do yet is refused by name. */
static int validate_servers(const omv_job_t *job, const char *path, char *err)
{
    const char *what = NULL;
    if (job->servers == 0 && job->replicas > 1) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [cluster] replicas = %lld: replicas are of shard servers' ranges; give "
                 "[cluster] servers",
                 path, (long long)job->replicas);
        return -EINVAL;
    }
    if (job->servers == 0)
        return 0;
    if (job->servers * job->replicas > OMV_WIRE_MAX_SERVERS) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [cluster] servers = %lld with replicas = %lld: %lld shard servers, at most "
                 "%d",
                 path, (long long)job->servers, (long long)job->replicas,
                 (long long)(job->servers * job->replicas), OMV_WIRE_MAX_SERVERS);
        return -EINVAL;
    }
    if (job->shards < job->servers)
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [cluster] shards: %lld shards cannot spread over %lld servers: give at "
                 "least as many shards as servers",
                 path, (long long)job->shards, (long long)job->servers);
    else if (job->split_by_speed)
        what = "[cluster] split = speed";
    if (what)
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [cluster] servers = %lld: not yet with %s", path,
                 (long long)job->servers, what);
    return job->shards < job->servers || what ? -EINVAL : 0;
}

int omv_job_validate(omv_job_t *job, const char *path, char *err)
{
    int r = validate_model(job, path, 0, err);
    if (r == 0)
        r = validate_train(job, path, err);
    if (r == 0)
        r = validate_servers(job, path, err);
    if (r < 0)
        return r;
    if (job->groups > job->workers) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [cluster] groups: %lld groups need at least as many workers (have %lld)",
                 path, (long long)job->groups, (long long)job->workers);
        return -EINVAL;
    }
    if (job->workers % job->groups != 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [cluster] groups: %lld workers do not split evenly into %lld groups", path,
                 (long long)job->workers, (long long)job->groups);
        return -EINVAL;
    }
    /* A group's batch splits as evenly as it can (64 over 3: 22, 21, 21); each member needs at
     * least one image. */
    int64_t per_group = job->workers / job->groups;
    if (job->batch_size < per_group) {
        snprintf(err, OMV_CONFIG_ERR_MAX,
                 "%s: [train] batch_size: %lld images cannot give each of the %lld workers of a "
                 "group one",
                 path, (long long)job->batch_size, (long long)per_group);
        return -EINVAL;
    }
    return 0;
}

int omv_job_read(const char *path, char **ret_text, char *err)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int r = -errno;
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot open: %s", path, strerror(errno));
        return r;
    }
    char *text = malloc(OMV_JOB_FILE_MAX + 1);
    size_t n = text ? fread(text, 1, OMV_JOB_FILE_MAX + 1, f) : 0;
    int bad = text == NULL ? -ENOMEM : ferror(f) ? -EIO : n > OMV_JOB_FILE_MAX ? -EFBIG : 0;
    fclose(f);
    if (bad < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: cannot read: %s", path,
                 bad == -EFBIG ? "larger than 1 MiB, too large for a job file" : strerror(-bad));
        free(text);
        return bad;
    }
    text[n] = '\0';
    *ret_text = text;
    return 0;
}

int omv_job_load(omv_job_t *ret_job, const char *path, char *err)
{
    char *text;
    int r = omv_job_read(path, &text, err);
    if (r < 0)
        return r;
    r = omv_job_load_text(ret_job, path, text, err);
    free(text);
    return r;
}

/* Calls check on each path of a comma-separated list. */
static int check_list(const char *list, omv_job_path_check_fn check, void *ctx, char *err)
{
    char item[OMV_JOB_PATH_MAX];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof(item)) {
            memcpy(item, p, n);
            item[n] = '\0';
            int r = check(ctx, item, err);
            if (r < 0)
                return r;
        }
        p += n + (p[n] == ',');
    }
    return 0;
}

int omv_job_check_paths(const omv_job_t *job, omv_job_path_check_fn check, void *ctx, char *err)
{
    const char *paths[] = {job->train_images, job->train_labels, job->test_images, job->test_labels,
                           job->definition};
    for (size_t i = 0; i < OMV_ARRAY_SIZE(paths); i++) {
        int r = check_list(paths[i], check, ctx, err);
        if (r < 0)
            return r;
    }
    return 0;
}

/* The line a key was set on in the file, 0 when it was left at its default. */
static int key_line(const int *lines, const char *section, const char *key)
{
    for (size_t i = 0; i < omv_job_table_len; i++)
        if (strcmp(omv_job_table[i].section, section) == 0 &&
            strcmp(omv_job_table[i].key, key) == 0)
            return lines[i];
    return 0;
}

int omv_job_load_text(omv_job_t *ret_job, const char *path, const char *text, char *err)
{
    return omv_job_load_text_checked(ret_job, path, text, NULL, NULL, err);
}

int omv_job_load_text_checked(omv_job_t *ret_job, const char *path, const char *text,
                              omv_job_path_check_fn check, void *ctx, char *err)
{
    omv_job_t job;
    memset(&job, 0, sizeof(job));
    int r = omv_config_defaults(omv_job_table, omv_job_table_len, &job);
    if (r < 0) {
        snprintf(err, OMV_CONFIG_ERR_MAX, "%s: internal error in job defaults", path);
        return r;
    }
    int lines[OMV_ARRAY_SIZE(omv_job_table)];
    r = omv_config_load_text(omv_job_table, omv_job_table_len, path, text, &job, lines, err);
    if (r < 0)
        return r;
    int layers_line = key_line(lines, "model", "layers");
    char *paths[] = {job.train_images, job.train_labels, job.test_images,
                     job.test_labels,  job.definition,   job.init};
    if (strcmp(job.data_format, "cifar10") == 0) {
        r = resolve_list(job.train_images, OMV_JOB_PATH_MAX, path);
        if (r == 0)
            r = resolve_list(job.test_images, OMV_JOB_PATH_MAX, path);
        if (r < 0) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [data]: a path list is too long", path);
            return r;
        }
        paths[0] = paths[2] = NULL; /* done */
    }
    for (size_t i = 0; i < OMV_ARRAY_SIZE(paths); i++) {
        if (paths[i] != NULL && resolve(paths[i], OMV_JOB_PATH_MAX, path) < 0) {
            snprintf(err, OMV_CONFIG_ERR_MAX, "%s: [data]: path '%s' is too long", path, paths[i]);
            return -ENAMETOOLONG;
        }
    }
    if (check != NULL) {
        r = omv_job_check_paths(&job, check, ctx, err);
        if (r < 0)
            return r;
    }
    r = validate_model(&job, path, layers_line, err);
    if (r < 0)
        return r;
    r = omv_job_validate(&job, path, err);
    if (r < 0)
        return r;
    *ret_job = job;
    return 0;
}
