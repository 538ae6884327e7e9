/* A run's checkpoints: the folder, writing one from a view of the run, finding one to resume. */
#define OMV_LOG_TAG "checkpoint"
#include "run_checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "sandbox.h"
#include "strbuf.h"
#include "util.h"

/* Whether path names a folder inside root (lexically, and after following the links of the part
 * that exists already), so that neither ".." nor a link leads a job's checkpoints out. */
static int inside(const char *path, const char *root)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (n == 0 || strncmp(path, root, n) != 0 || (path[n] != '/' && path[n] != '\0'))
        return 0;
    char real_root[PATH_MAX], probe[PATH_MAX], real[PATH_MAX];
    if (realpath(root, real_root) == NULL)
        return 1; /* made below, by us: nothing in it can lead out yet */
    if (omv_strlcpy(probe, path, sizeof(probe)) < 0)
        return 0;
    /* The deepest folder of path that exists, resolved. */
    while (realpath(probe, real) == NULL) {
        char *slash = strrchr(probe, '/');
        if (slash == NULL || slash == probe)
            return 0;
        *slash = '\0';
    }
    size_t m = strlen(real_root);
    return strncmp(real, real_root, m) == 0 && (real[m] == '/' || real[m] == '\0' || m == 1);
}

static int has_dotdot(const char *path)
{
    for (const char *p = path; (p = strstr(p, "..")) != NULL; p += 2)
        if ((p == path || p[-1] == '/') && (p[2] == '/' || p[2] == '\0'))
            return 1;
    return 0;
}

void omv_run_ckpt_dir(const omv_job_t *job, const char *state_dir, char *out, size_t cap)
{
    const char *d = job->checkpoint_dir;
    out[0] = '\0';
    if (d[0] == '/')
        omv_strlcpy(out, d, cap);
    else if (d[0] && state_dir[0])
        snprintf(out, cap, "%s/%s", state_dir, d);
    else if (state_dir[0])
        snprintf(out, cap, "%s/checkpoints/%s", state_dir, job->name);
}

int omv_run_ckpt_check_dir(const char *dir, char *why, size_t cap)
{
    int r = omv_checkpoint_mkdirs(dir);
    if (r == 0) {
        /* A file made and removed: the one test that sees mounts, owners and ACLs alike. */
        char probe[OMV_JOB_PATH_MAX + 32];
        snprintf(probe, sizeof(probe), "%s/.omnivore-write-check-XXXXXX", dir);
        int fd = mkstemp(probe);
        r = fd < 0 ? -errno : 0;
        if (fd >= 0) {
            close(fd);
            unlink(probe);
        }
    }
    if (r == 0)
        return 0;
    char hint[512];
    omv_sandbox_hint(dir, r, hint, sizeof(hint));
    if (hint[0] == '\0' && (r == -EACCES || r == -EPERM))
        snprintf(hint, sizeof(hint),
                 "; give the folder to the daemon's user (chown omnivore), or choose another");
    snprintf(why, cap, "the daemon cannot write checkpoints to '%s': %s%s", dir, omv_strerror(r),
             hint);
    return r;
}

int omv_run_ckpt_confined(const char *dir, const char *state_dir, const char *root, char *why,
                          size_t cap)
{
    root = root ? root : "";
    if (!has_dotdot(dir) &&
        ((state_dir[0] && inside(dir, state_dir)) || (root[0] && inside(dir, root))))
        return 0;
    snprintf(why, cap,
             "checkpoint folder '%s' is outside the state folder '%s'%s%s%s (a job may not write "
             "elsewhere; the daemon's [security] checkpoint_root allows another folder)",
             dir, state_dir, root[0] ? " and '" : "", root, root[0] ? "'" : "");
    return -EPERM;
}

/* The folder for the job's checkpoints (omv_run_ckpt_dir); it must lie in the state folder or
 * in root (may be ""). */
static int choose_dir(omv_run_ckpt_t *self, const omv_job_t *job, const char *state_dir,
                      const char *root)
{
    omv_run_ckpt_dir(job, state_dir, self->dir, sizeof(self->dir));
    char why[1024];
    if (self->dir[0] == '\0' ||
        omv_run_ckpt_confined(self->dir, state_dir, root, why, sizeof(why)) == 0)
        return 0;
    omv_log_error("job '%s': %s: refused", job->name, why);
    self->dir[0] = '\0';
    return -EPERM;
}

int omv_run_ckpt_init(omv_run_ckpt_t *self, const omv_job_t *job, const char *state_dir,
                      const char *root)
{
    memset(self, 0, sizeof(*self));
    int r = choose_dir(self, job, state_dir, root ? root : "");
    if (r < 0 || self->dir[0] == '\0')
        return r;
    char why[1024];
    if (omv_run_ckpt_check_dir(self->dir, why, sizeof(why)) < 0)
        omv_log_error("checkpoints are off for job '%s': %s", job->name, why);
    else
        self->enabled = 1;
    return 0;
}

static char *members_text(const omv_members_t *members, const omv_groups_t *groups)
{
    omv_strbuf_t b;
    omv_strbuf_init(&b);
    for (uint32_t i = 0; i < members->n; i++) {
        const omv_member_t *m = &members->records[i];
        if (m->state != OMV_MEMBER_ALIVE || m->role != OMV_ROLE_TRAINER)
            continue;
        omv_strbuf_printf(&b, "%u %s %u %d\n", i + 1, m->host, m->pid,
                          omv_groups_of(groups, m->slot));
    }
    char *s = strdup(omv_strbuf_str(&b));
    omv_strbuf_fini(&b);
    return s;
}

/* Fills c from view; arrays it allocates are freed by omv_checkpoint_fini, borrowed ones are
 * put back to NULL by the caller. Returns 0 or -ENOMEM. */
static int fill(omv_checkpoint_t *c, const omv_run_ckpt_view_t *v)
{
    uint32_t groups = omv_groups_count(v->groups);
    omv_strlcpy(c->job_name, v->job->name, sizeof(c->job_name));
    c->finished = (uint32_t)v->finished;
    c->images_total = v->images_total;
    c->steps_total = v->steps_total;
    c->train_s = v->train_s;
    c->n_groups = groups;
    c->param_count = v->param_count;
    c->params = (float *)v->params;
    c->velocity = (float *)v->velocity;
    c->second = (float *)v->second;
    c->adam_steps = v->adam_steps;
    c->n_parts = v->n_parts;
    c->parts = (omv_checkpoint_part_ref_t *)v->parts;
    c->adam = (uint32_t)v->adam;
    c->learning_rate = v->sgd.learning_rate;
    c->momentum = v->sgd.momentum;
    c->weight_decay = v->sgd.weight_decay;
    c->job_text = (char *)v->job_text;
    c->model_text = (char *)v->job->model_text;
    c->n_history = (uint32_t)v->eval->n_history;
    c->clocks = malloc((groups ? groups : 1) * sizeof(uint64_t));
    c->history = calloc(c->n_history ? c->n_history : 1, sizeof(*c->history));
    c->members = members_text(v->members, v->groups);
    if (!c->clocks || !c->history || !c->members ||
        omv_tuner_save(v->tuner, omv_time_s(), &c->opt) < 0)
        return -ENOMEM;
    for (uint32_t g = 0; g < groups; g++)
        c->clocks[g] = omv_groups_clock(v->groups, g);
    for (size_t i = 0; i < v->eval->n_history; i++) {
        const omv_eval_point_t *h = &v->eval->history[i];
        c->history[i] = (omv_checkpoint_eval_t){h->epoch, h->wall_s, h->accuracy, h->loss};
    }
    return 0;
}

int omv_run_ckpt_write(omv_run_ckpt_t *self, const omv_run_ckpt_view_t *view)
{
    double t0 = omv_time_s();
    omv_checkpoint_t c;
    memset(&c, 0, sizeof(c));
    c.seq = ++self->seq;
    char err[OMV_CHECKPOINT_ERR_MAX] = "out of memory";
    int r = fill(&c, view);
    if (r == 0)
        r = omv_checkpoint_write(&c, self->dir, self->last_path, sizeof(self->last_path), err);
    self->due = 0;
    self->last_s = omv_time_s();
    uint64_t step = omv_groups_min_clock(view->groups);
    self->last_step = step == UINT64_MAX ? 0 : step;
    if (r < 0) {
        self->failed_total++;
        omv_strlcpy(self->last_error, err, sizeof(self->last_error));
        omv_log_error("checkpoint %" PRIu64 " failed: %s", c.seq, err);
    } else {
        self->written_total++;
        self->last_error[0] = '\0';
        self->last_ms = (omv_time_s() - t0) * 1000.0;
        int removed = omv_checkpoint_prune(self->dir, (unsigned)view->job->checkpoint_keep);
        omv_log_info("checkpoint %s written in %.0f ms (epoch %.2f, %" PRIu64 " images%s)%s",
                     self->last_path, self->last_ms, view->epoch, view->images_total,
                     view->n_parts ? ", a manifest of its parts" : "",
                     removed > 0 ? "; older ones pruned" : "");
    }
    /* Borrowed, not ours to free. */
    c.params = NULL;
    c.velocity = NULL;
    c.second = NULL;
    c.parts = NULL;
    c.job_text = NULL;
    c.model_text = NULL;
    omv_checkpoint_fini(&c);
    return r;
}

static void report_bad(void *ctx, const char *path, const char *reason)
{
    (void)ctx;
    (void)path;
    omv_log_warn("skipping checkpoint: %s", reason);
}

int omv_run_ckpt_find(omv_run_ckpt_t *self, const omv_job_t *job, size_t param_count,
                      uint32_t max_groups, omv_checkpoint_t *ret)
{
    if (!self->enabled || !job->checkpoint_resume)
        return 0;
    char path[sizeof(self->resumed_from)];
    int r = omv_checkpoint_load_latest(ret, self->dir, path, sizeof(path), report_bad, NULL);
    if (r < 0) {
        omv_log_error("cannot read checkpoint folder %s: %s", self->dir, omv_strerror(r));
        return r;
    }
    if (r == 0) {
        omv_log_info("no checkpoint to resume in %s: starting from scratch", self->dir);
        return 0;
    }
    if (ret->param_count != param_count || ret->n_groups > max_groups) {
        omv_log_error("%s was written for a model of %" PRIu64 " parameters in %u groups, but "
                      "job '%s' has %zu parameters and room for %u groups: move the folder %s "
                      "away, or set [checkpoint] resume = no to start from scratch",
                      path, ret->param_count, ret->n_groups, job->name, param_count, max_groups,
                      self->dir);
        omv_checkpoint_fini(ret);
        return -EINVAL;
    }
    /* Numbered after every file there, the unusable ones too: the next is the newest, and
     * pruning keeps it rather than them. */
    uint64_t newest = omv_checkpoint_newest_seq(self->dir);
    self->seq = newest > ret->seq ? newest : ret->seq;
    omv_strlcpy(self->resumed_from, path, sizeof(self->resumed_from));
    self->resumed_seq = ret->seq;
    omv_strlcpy(self->last_path, path, sizeof(self->last_path));
    return 1;
}
