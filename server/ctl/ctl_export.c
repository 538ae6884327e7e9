/* omnivorectl export: a checkpoint (or the newest one of a job) as a safetensors file that
 * PyTorch loads into the same network, with the model definition and a training summary in its
 * metadata. It reads files only: no daemon is needed. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ctl.h"
#include "job.h"
#include "model.h"
#include "safetensors.h"
#include "strbuf.h"

#define DEFAULT_STATE_DIR "/var/lib/omnivore"

/* Whether path starts as a checkpoint does. */
static int is_checkpoint(const char *path)
{
    char magic[8] = {0};
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return 0;
    size_t n = fread(magic, 1, sizeof(magic), f);
    fclose(f);
    return n == sizeof(magic) && memcmp(magic, "OMVCKPT\n", 8) == 0;
}

static void say_bad(void *ctx, const char *path, const char *reason)
{
    (void)ctx;
    (void)path;
    fprintf(stderr, "omnivorectl export: skipping %s\n", reason);
}

/* The checkpoint to export and its model's text (*ret_model, the caller's to free): the file
 * itself, or the newest valid one in the job's checkpoint folder. Returns 0 or 1 (said why). */
static int load(const char *arg, const char *state_dir, omv_checkpoint_t *c, char **ret_model)
{
    char err[OMV_CHECKPOINT_ERR_MAX > OMV_CONFIG_ERR_MAX ? OMV_CHECKPOINT_ERR_MAX
                                                         : OMV_CONFIG_ERR_MAX];
    if (is_checkpoint(arg)) {
        if (omv_checkpoint_read(c, arg, err) < 0) {
            fprintf(stderr, "omnivorectl export: %s\n", err);
            return 1;
        }
    } else {
        omv_job_t *job = malloc(sizeof(*job));
        if (job == NULL || omv_job_load(job, arg, err) < 0) {
            fprintf(stderr, "omnivorectl export: %s\n", job ? err : "out of memory");
            free(job);
            return 1;
        }
        char dir[OMV_JOB_PATH_MAX + 256], found[OMV_JOB_PATH_MAX + 320];
        if (job->checkpoint_dir[0])
            snprintf(dir, sizeof(dir), "%s", job->checkpoint_dir);
        else
            snprintf(dir, sizeof(dir), "%s/checkpoints/%s", state_dir, job->name);
        int r = omv_checkpoint_load_latest(c, dir, found, sizeof(found), say_bad, NULL);
        if (r <= 0) {
            fprintf(stderr, "omnivorectl export: no checkpoint of job '%s' in %s%s\n", job->name,
                    dir, job->checkpoint_dir[0] ? "" : " (give --state-dir, or the checkpoint)");
            free(job);
            return 1;
        }
        free(c->model_text);
        c->model_text = strdup(job->model_text);
        free(job);
    }
    if (c->model_text == NULL) {
        fprintf(stderr,
                "omnivorectl export: %s was written before checkpoints kept the model "
                "definition: export it through its job file\n",
                arg);
        return 1;
    }
    *ret_model = c->model_text;
    c->model_text = NULL;
    return 0;
}

/* The training summary for the metadata: a few key:value lines. */
static void summary(const omv_checkpoint_t *c, omv_strbuf_t *b)
{
    omv_strbuf_printf(b,
                      "job:%s\nimages_total:%" PRIu64 "\nsteps_total:%" PRIu64
                      "\ntrain_seconds:%.1f\nfinished:%s\n",
                      c->job_name, c->images_total, c->steps_total, c->train_s,
                      c->finished ? "yes" : "no");
    if (c->n_history) {
        const omv_checkpoint_eval_t *e = &c->history[c->n_history - 1];
        omv_strbuf_printf(b, "epoch:%.2f\ntest_accuracy:%.4f\ntest_loss:%.4f\n", e->epoch,
                          e->accuracy, e->loss);
    }
}

static int export_to(const omv_checkpoint_t *c, const char *model, const char *out)
{
    omv_model_layout_t *l = malloc(sizeof(*l));
    char err[OMV_CONFIG_ERR_MAX > OMV_SAFETENSORS_ERR_MAX ? OMV_CONFIG_ERR_MAX
                                                          : OMV_SAFETENSORS_ERR_MAX];
    int rc = 1;
    if (l == NULL || omv_model_parse(l, model, "the checkpoint's model", err) < 0) {
        fprintf(stderr, "omnivorectl export: %s\n", l ? err : "out of memory");
        goto out;
    }
    if (l->param_count != c->param_count) {
        fprintf(stderr,
                "omnivorectl export: the checkpoint has %" PRIu64 " parameters, its model %zu\n",
                c->param_count, l->param_count);
        goto out;
    }
    omv_strbuf_t sb;
    omv_strbuf_init(&sb);
    summary(c, &sb);
    const char *keys[] = {"format", "omnivore_model", "omnivore_summary"};
    const char *values[] = {"pt", model, omv_strbuf_str(&sb)};
    int r = omv_safetensors_write(out, l, c->params, keys, values, 3, (int64_t)c->steps_total, err);
    omv_strbuf_fini(&sb);
    if (r < 0) {
        fprintf(stderr, "omnivorectl export: %s\n", err);
        goto out;
    }
    printf("%s\n", out);
    rc = 0;
out:
    free(l);
    return rc;
}

int omv_ctl_export(const char *sock, int argc, char **argv, int json)
{
    (void)sock;
    (void)json;
    const char *out = NULL, *state_dir = DEFAULT_STATE_DIR;
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"state-dir", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        if (ch == 'o')
            out = optarg;
        else if (ch == 's')
            state_dir = optarg;
        else
            return 2;
    }
    if (optind + 1 != argc || out == NULL) {
        fprintf(stderr, "omnivorectl export: give one checkpoint or job file and --out FILE\n");
        return 2;
    }
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    char *model = NULL;
    int rc = load(argv[optind], state_dir, &c, &model);
    if (rc == 0)
        rc = export_to(&c, model, out);
    free(model);
    omv_checkpoint_fini(&c);
    return rc;
}
