/* The optimizer's daemon side: it feeds the optimizer (optimizer.c) each group step, turns its
 * commands into changes between steps (regroup, momentum and learning rate, the probe
 * snapshot), writes its decisions file, and keeps the phases it ran and the time its searches
 * took. Fed values by the run; it never reaches into the run. */
#pragma once

#include <stdint.h>
#include <stdio.h>

#include "checkpoint.h"
#include "job.h"
#include "kv.h"
#include "optimizer.h"
#include "reconfig.h"
#include "strbuf.h"

/* A configuration the optimizer ran a phase with, for the summary. */
typedef struct {
    uint32_t phase, groups;
    double momentum, learning_rate;
    double epoch; /* when it started */
} omv_phase_t;

#define OMV_TUNER_MAX_PHASES 64

typedef struct omv_tuner omv_tuner_t;

/* For a job whose [optimizer] is on; the optimizer itself starts with omv_tuner_start. Its
 * decisions go to CKPT_DIR/decisions.jsonl when ckpt_dir is not NULL. Returns NULL with errno
 * set. Caller owns; omv_tuner_destroy. */
omv_tuner_t *omv_tuner_new(const omv_job_t *job, const char *ckpt_dir);
/* The optimizer's parameters as the job set them (its grids among them). */
const omv_optimizer_params_t *omv_tuner_params(const omv_tuner_t *self);
void omv_tuner_destroy(omv_tuner_t **self_p);

/* Starts the optimizer (at the job's start) with `live` trainers, taking up a resumed
 * checkpoint's state if omv_tuner_load gave one. Returns 0 or a negative errno (logged). */
int omv_tuner_start(omv_tuner_t *self, int live, double now);

/* Whether the optimizer runs (started and not failed). NULL is fine: 0. */
int omv_tuner_active(const omv_tuner_t *self);

/* Whether a probe runs: the shards hold a probe's model (no evaluations, checkpoints or
 * counting of its images as training). NULL is fine: 0. */
int omv_tuner_probing(const omv_tuner_t *self);

/* A group finished step `clock` with mean training loss `loss` over `images`. */
void omv_tuner_observe(omv_tuner_t *self, uint32_t group, uint64_t clock, double loss,
                       uint64_t images, double now);

/* Asks the optimizer for its next command (after each step and from the cron). Returns 1 with
 * the change it asks for in *ret (merge it into the pending one), else 0. pending is the change
 * already waiting; the update rule it sets is `rule` with the optimizer's learning rate and
 * momentum (beta1 for Adam and AdamW). */
int omv_tuner_poll(omv_tuner_t *self, double now, const omv_reconfig_t *pending,
                   const omv_sgd_t *rule, omv_reconfig_t *ret);

/* The command gen was carried out between steps, at `epoch`. */
void omv_tuner_applied(omv_tuner_t *self, uint64_t gen, double epoch, double now);

/* The live trainers changed: the optimizer caps g by them and runs again the probe they
 * disturbed. */
void omv_tuner_membership(omv_tuner_t *self, int live, double now);

/* Images of probes (thrown away, not training) and seconds spent searching, the search under
 * way included. */
void omv_tuner_count_probe_images(omv_tuner_t *self, uint64_t images);
uint64_t omv_tuner_probe_images(const omv_tuner_t *self);
double omv_tuner_probe_seconds(const omv_tuner_t *self, double now);

/* Fills a checkpoint's optimizer part (phases allocated: omv_checkpoint_fini frees them);
 * NULL self: absent. Returns 0 or -ENOMEM. */
int omv_tuner_save(const omv_tuner_t *self, double now, omv_checkpoint_opt_t *ret);
/* Takes a resumed checkpoint's optimizer part: the phases and counters now, the optimizer's
 * state when it starts. */
void omv_tuner_load(omv_tuner_t *self, const omv_checkpoint_opt_t *o);

/* The phases run so far. */
uint32_t omv_tuner_phases(const omv_tuner_t *self, const omv_phase_t **ret_phases);

/* The phases as key:value lines (phase_N:groups=... from_epoch=...) in the section open in kv,
 * and as a JSON array. The one formatter of the phases table. */
void omv_tuner_phases_kv(const omv_tuner_t *self, omv_kv_t *kv);
void omv_tuner_phases_json(const omv_tuner_t *self, omv_strbuf_t *out);

/* One line saying what the optimizer does now (for status). */
void omv_tuner_describe(const omv_tuner_t *self, omv_strbuf_t *out);

/* The `optimizer` command's reply (enabled:no for NULL). train_s: the job's training seconds. */
void omv_tuner_report(const omv_tuner_t *self, double train_s, double now, omv_strbuf_t *out,
                      int json);
