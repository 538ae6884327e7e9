/* The training report of `omnivorectl report`: a job's history, as omnivored's `history --json`
 * gives it, written as a CSV table and a self-contained SVG picture (loss, test accuracy, and
 * the groups, momentum and learning-rate timeline with the optimizer's probes shaded). */
#pragma once

#include <stddef.h>

#include "strbuf.h"

/* The most points of one kind a history may hold (the daemon keeps a few thousand). */
#define OMV_REPORT_MAX_POINTS (1u << 20)

/* Every number is NaN where the history did not give it (empty in the CSV). */
typedef struct {
    double wall_s; /* training seconds since the job started */
    double epoch, step, images;
    double train_loss;   /* mean over the interval before wall_s */
    double images_per_s; /* over the same interval, probes included */
    double groups, momentum, learning_rate;
    int probing; /* a probe ran in the interval */
} omv_report_train_t;

typedef struct {
    double wall_s, epoch, test_accuracy, test_loss;
} omv_report_eval_t;

/* The configuration from wall_s on. */
typedef struct {
    double wall_s, epoch, step, groups, momentum, learning_rate;
    int probing;
    char cause[32]; /* "start", "regroup", "optimizer" */
} omv_report_change_t;

/* A phase the optimizer ran (from `epoch` on). */
typedef struct {
    double phase, groups, momentum, learning_rate, epoch;
} omv_report_phase_t;

typedef struct {
    char job[256];
    char state[32];
    double test_accuracy; /* the last evaluation's; NaN when there was none */
    double wall_s;        /* training seconds so far */
    omv_report_train_t *train;
    size_t n_train;
    omv_report_eval_t *eval;
    size_t n_eval;
    omv_report_change_t *config;
    size_t n_config;
    omv_report_phase_t *phases;
    size_t n_phases;
} omv_report_t;

/* An empty report (no points, numbers NaN). The caller embeds it; omv_report_fini frees what
 * omv_report_parse allocated. A caller may instead point the arrays at its own memory (and
 * then not call fini). */
void omv_report_init(omv_report_t *self);
void omv_report_fini(omv_report_t *self);

/* Reads `history --json` into self (initialised or finished). Unknown keys are skipped. Returns
 * 0, or -EPROTO (not that JSON; the reason in err[cap]) or -ENOMEM; self is then empty. */
int omv_report_parse(omv_report_t *self, const char *json, char *err, size_t cap);

/* Appends the CSV: a header row, then one row per point in order of wall_s (kind train, eval
 * or config). Numbers are locale-independent; what does not apply is empty. */
void omv_report_csv(const omv_report_t *self, omv_strbuf_t *out);

/* Appends the SVG: three panels over the same time axis. A panel without data says so. */
void omv_report_svg(const omv_report_t *self, omv_strbuf_t *out);

/* The default base name of the files: omnivore-report-JOB, with characters that do not belong
 * in a file name replaced by '_'. */
void omv_report_default_base(const char *job, char *out, size_t cap);

/* Writes DIR/BASE.csv and DIR/BASE.svg (DIR is made when missing; each file is written beside
 * and renamed, so a reader never sees half of one). Their paths go to ret_csv[cap] and
 * ret_svg[cap]. Returns 0 or a negative errno with what failed in err[errcap]. */
int omv_report_write(const omv_report_t *self, const char *dir, const char *base, char *ret_csv,
                     char *ret_svg, size_t cap, char *err, size_t errcap);
