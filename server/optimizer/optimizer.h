/* The Omnivore optimizer: picks the number of compute groups, momentum and learning rate at
 * runtime from the stream of completed group steps (DESIGN.md, "What it is", point 3). A pure,
 * deterministic state machine: no I/O, clocks or threads; time and losses are its inputs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

/* Upper bound on each grid's length. */
#define OMV_OPT_GRID_MAX 8
/* A value of omv_optimizer_params_t.groups: the optimizer tunes g. */
#define OMV_OPT_TUNE (-1)

/* Construction parameters. Fill with omv_optimizer_params_init, then override.
 *
 * Units: every budget counts steps of the slowest group, that is a run (probe or phase) ends once
 * every one of its g groups has completed that many steps in it. Steps rather than seconds
 * because a probe's score is then the loss after a fixed number of updates per group, which is
 * what statistical efficiency compares, and because the choice does not depend on timing jitter
 * (replaying the same losses gives the same decisions). Seconds enter only through the hardware
 * efficiency measurement, and through probe_max_s, a safety cap for a group that stalls. */
typedef struct {
    /* N >= 1: the trainers the groups are made of, as planned. The live count may change while
     * the job runs (omv_optimizer_set_workers): g never exceeds it. */
    uint32_t workers;
    /* Fixed values, or tuned: g = OMV_OPT_TUNE, momentum < 0, lr < 0. A fixed g must divide N; a
     * tuned g is a power of two that divides N (1, 2, 4, ... <= N), so every group has the same
     * number of members. */
    int32_t groups;
    double momentum; /* fixed: [0, 1) */
    double lr;       /* fixed: > 0 */
    /* Cold-start learning rates (default 0.1, 0.01, 0.001, 0.0001); any order, each > 0. */
    double lr_grid[OMV_OPT_GRID_MAX];
    uint32_t n_lr_grid;
    /* Momentum values probed for each candidate g (default 0, 0.3, 0.6, 0.9); each in [0, 1). */
    double momentum_grid[OMV_OPT_GRID_MAX];
    uint32_t n_momentum_grid;
    double cold_momentum; /* the cold start's momentum when momentum is tuned (0.9) */
    uint32_t phase_steps; /* steps of the slowest group per phase (2000) */
    /* Steps of the slowest group per probe; 0: phase_steps / 80 (at least warmup_steps + 3), so
     * that a full grid of 8 probes costs about 10% of a phase. */
    uint32_t probe_steps;
    /* Probes of later searches (phase 2 on): steps of the slowest group; 0: probe_steps. Shorter
     * probes cost less but are noisier and, right after a change of g, still see its transient:
     * halving them (the default once) made the MLP's later searches drop the learning rate on
     * that transient and stall below 0.88 (see the time-to-accuracy experiment). */
    uint32_t later_probe_steps;
    /* The first search's grids probe only the cold start's learning rate, not also a tenth of
     * it (true): the cold start compared the two from the same snapshot moments before, at the
     * most aggressive momentum, and the schedule's drop is for later searches. */
    bool first_grid_cold_lr;
    double probe_max_s; /* s: a probe also ends this long after it was issued; 0: no cap (0) */
    /* Each group's first warmup_steps steps of a run are left out of its timing (>= 1; 1). */
    uint32_t warmup_steps;
    /* A run diverges when a loss is NaN or infinite, or when the mean of its last w losses
     * exceeds diverge_factor x the mean of its first w losses, w = diverge_window for probes
     * (2.0, 3) and phase_diverge_window for phases (16: a phase has thousands of windows, and a
     * short one would now and then cross the line by chance alone). */
    double diverge_factor;
    uint32_t diverge_window;
    uint32_t phase_diverge_window;
    /* Groups double while seconds per iteration fall by at least he_gain (0.10). */
    double he_gain;
    /* Scores within tie_rel x |best| of the best tie (0.01); ties go to the larger learning
     * rate, then the larger momentum. For the learning rate, scores within tie_z (2; 0: off)
     * standard errors of their difference from the best tie too (a score's standard error is
     * the spread of the losses it averages): a learning rate drops only on a difference the
     * probes can resolve. */
    double tie_rel;
    double tie_z;
} omv_optimizer_params_t;

/* Defaults as documented above, for N workers, everything tuned. */
void omv_optimizer_params_init(omv_optimizer_params_t *params, uint32_t workers);

/* What the daemon must do now. flags is 0 (nothing) or an OR of:
 * - SNAPSHOT: copy every shard's parameters and momentum buffers into the probe base (memory).
 * - RESTORE: copy the probe base back into the shards' parameters and momentum buffers.
 * - SET: use groups, momentum and lr from the next step on.
 * - DONE_SEARCH: a phase begins. The probe base is then the phase's starting model: keep it
 *   until the next SNAPSHOT (a phase that diverges RESTOREs it).
 * - PROBE: the command starts a probe. Until a command without PROBE is applied, the shards hold
 *   a probe's model, which is thrown away: no evaluations or checkpoints of it (a checkpoint
 *   takes the probe base instead), and its images are not training.
 * Apply in that order (SNAPSHOT or RESTORE first, then SET), with no group half-way through a
 * step: stop answering pulls, let the steps in flight complete, apply, then resume. SNAPSHOT and
 * RESTORE never come together. Steps that began after the command was applied are tagged with
 * its gen in their observations. */
enum {
    OMV_OPT_CMD_SNAPSHOT = 1u << 0,
    OMV_OPT_CMD_RESTORE = 1u << 1,
    OMV_OPT_CMD_SET = 1u << 2,
    OMV_OPT_CMD_DONE_SEARCH = 1u << 3,
    OMV_OPT_CMD_PROBE = 1u << 4,
};

typedef struct {
    unsigned flags;
    uint64_t gen;    /* the configuration generation this command starts (1, 2, ...) */
    uint32_t groups; /* with SET: g, a divisor of N */
    double momentum; /* with SET */
    double lr;       /* with SET */
} omv_opt_cmd_t;

/* One completed group step (all of its shards applied). */
typedef struct {
    double now_s;    /* s, monotonic, when the step completed; never decreasing */
    uint64_t gen;    /* gen of the last command applied before the step began (0: none yet) */
    uint32_t group;  /* < the g in effect */
    uint64_t clock;  /* the group's clock after the step (informational: not used) */
    double loss;     /* mean training loss of the step's batch; NaN or Inf allowed */
    uint32_t images; /* images in the step */
} omv_opt_obs_t;

typedef enum {
    OMV_OPT_STATE_FIXED,   /* everything fixed by the job: the optimizer never acts */
    OMV_OPT_STATE_IDLE,    /* waiting for the first poll */
    OMV_OPT_STATE_PROBING, /* a search: probes run from the snapshot */
    OMV_OPT_STATE_RUNNING, /* a phase with the chosen configuration */
} omv_opt_state_t;

typedef struct {
    omv_opt_state_t state;
    uint32_t phase;  /* the phase that runs or that the running search is for (1, 2, ...) */
    uint64_t gen;    /* gen of the latest command */
    uint32_t groups; /* the configuration of the latest SET (the job's values before any) */
    double momentum;
    double lr;
    uint32_t groups_he;         /* g chosen for hardware efficiency (0: not measured yet) */
    uint32_t groups_max;        /* the live trainers: no g above it */
    uint64_t probes_total;      /* probes run (re-runs included, reused results not) */
    uint64_t divergences_total; /* phases that diverged and were rolled back */
} omv_opt_status_t;

/* The procedure (DESIGN.md point 3), as implemented:
 *
 * 1. Cold start (lr tuned): g = 1 (or the fixed g), momentum cold_momentum (or the fixed one);
 *    one probe per lr_grid value, smallest first. Best score = lr_ref.
 * 2. Hardware efficiency (g tuned, first search only): seconds per iteration (wall time per
 *    completed group step of the whole system, from the moment every group finished its first
 *    warmup_steps steps of the run to its last step) at g = 1 (the cold probes' median, or a
 *    timing run), then timing runs at g = 2, 4, ...: g doubles while it divides N and s/iter falls
 *    by he_gain or more. Timing runs use lr_ref and momentum 0 (or the fixed one); their loss is
 *    not scored. The result, g_he, is kept for later searches (hardware does not change).
 * 3. Grid at g = g_he (or the fixed g): lr {lr_ref / 10, lr_ref} (or the fixed lr; in the first
 *    search only lr_ref when first_grid_cold_lr) x the momentum grid (or the fixed momentum),
 *    probed in order of rising lr, then rising momentum. A configuration identical to one
 *    already run from the same snapshot (a cold probe) reuses its result. A probe diverges on a
 *    non-finite loss or when the mean of its last diverge_window losses exceeds diverge_factor
 *    x the mean of its first diverge_window; it stops at once and every pending configuration
 *    of the same g with lr >= its lr and momentum >= its momentum is skipped. Score: mean loss
 *    of the last half of the probe's observations (all groups). The lowest score wins; scores
 *    within tie_rel x |best| tie, and ties go to the larger lr, then the larger momentum. If
 *    every probe diverged: the least aggressive configuration.
 * 4. g and momentum tuned, the winner's momentum is 0 and g > 1: g halves, step 3 again (same lr
 *    candidates, same snapshot).
 * 5. Phase: RESTORE the snapshot (the probes' work is discarded: every configuration was judged
 *    from that model, and the winner's probe was not necessarily the last one run) + SET the
 *    winner; phase_steps steps of the slowest group.
 * 6. At the phase boundary: SNAPSHOT the current model and search again from step 3 with
 *    lr_ref = the current lr, so the lr only stays or drops tenfold, and g from g_he. Later
 *    searches' probes last later_probe_steps.
 * 7. A phase diverges by the rule of step 3 with phase_diverge_window: it stops, the phase's
 *    starting model (the probe base) is RESTOREd with the first probe of a new search from step
 *    3 whose lr_ref is a tenth of the phase's lr (the fixed lr stays). Without a base (nothing
 *    was probed before the phase) or anything to change, the divergence is recorded only.
 * 8. Membership (omv_optimizer_set_workers): g never exceeds the live trainers; a tuned g stays a
 *    power of two dividing N. A phase goes on, regrouped (a SET of the same configuration, g
 *    capped, which rebalances the groups) with the steps it has left. A probe in flight is
 *    discarded and run again from the snapshot (its timing would not compare); in the timing
 *    stage the timing starts again at g = 1 (the hardware changed); a grid above the cap starts
 *    again at the cap.
 * A search with nothing to compare (everything fixed but g, whose timing is done) issues no
 * probes and no snapshot: the phase just goes on. All three fixed: the optimizer never acts.
 * The first search costs the cold start, the timing runs and one grid per g visited; later ones
 * one grid per g visited (8 probes by default, about 5% of a phase with the default budget). */
typedef struct omv_optimizer omv_optimizer_t;

/* Validates params (copied) and makes an optimizer. Returns NULL with errno EINVAL (a value out
 * of range: a fixed g that does not divide N, a grid value out of range, ...) or ENOMEM. Caller
 * owns; release with omv_optimizer_destroy. Memory is allocated here, apart from the decision
 * log, which grows with every record, and the search's table and per-group counters, which grow
 * when membership changes make a search longer or the groups more. An allocation that fails
 * there aborts (a few hundred bytes: the process could not go on anyway). */
omv_optimizer_t *omv_optimizer_new(const omv_optimizer_params_t *params);
void omv_optimizer_destroy(omv_optimizer_t **self_p);

/* Reports a completed group step. Returns 0 when it was counted, 1 when it was ignored (its gen
 * is not the latest command's: it ran under an older configuration, or a command is waiting to
 * be polled), -EINVAL when obs is malformed (group out of range, time not finite). May queue a
 * command: call omv_optimizer_poll after every observe. */
int omv_optimizer_observe(omv_optimizer_t *self, const omv_opt_obs_t *obs);

/* Returns 1 and the command to apply now in ret_cmd, or 0 with ret_cmd->flags = 0 when there is
 * none. Call it once before the first step (it answers the first command: SNAPSHOT + SET of the
 * first probe), after every observe, and from the daemon's cron (it enforces probe_max_s). A
 * command is returned once; it must be applied before later observations carry its gen. */
int omv_optimizer_poll(omv_optimizer_t *self, double now_s, omv_opt_cmd_t *ret_cmd);

void omv_optimizer_status(const omv_optimizer_t *self, omv_opt_status_t *ret_status);

/* The live trainers are now `live` (>= 1): see step 8 above. Records a "membership" decision
 * and may queue a command (poll next). Returns 1 when it queued one, 0 when nothing changed
 * (fixed, not started, or the same count), -EINVAL when live is 0. */
int omv_optimizer_set_workers(omv_optimizer_t *self, uint32_t live, double now_s);

/* The optimizer's durable state: what a checkpoint keeps so that a restarted daemon goes on
 * with the phase it was in instead of from a cold start. Only whole phases are kept: a search
 * runs again from the start (a probe's snapshot lives in memory only; a checkpoint written
 * during a search holds the search's base model, so the search repeats from the same model). */
typedef struct {
    uint32_t phase;   /* the last phase that began (0: none; a restart starts cold) */
    uint32_t running; /* 1: that phase was running; 0: the search after it was */
    uint32_t groups;  /* the phase's configuration */
    double momentum;
    double lr;
    uint32_t phase_steps_done; /* steps of its slowest group it had completed (running) */
    double lr_ref;             /* the learning rate the next search is relative to */
    uint32_t groups_he;        /* g for hardware efficiency (0: not measured) */
    uint64_t probes_total, divergences_total;
} omv_opt_saved_t;

/* Fills ret with the durable state (zeroed first). */
void omv_optimizer_save(const omv_optimizer_t *self, omv_opt_saved_t *ret);

/* Takes up a saved state; call it after omv_optimizer_new (and set_workers) and before the
 * first poll. A running phase goes on with the steps it had left (its first command is a
 * SNAPSHOT + SET + DONE_SEARCH: the model it resumes from is its rollback point); a search
 * starts again; phase 0 starts cold. Values the job fixes win over saved ones. Records a
 * "resume" decision. Returns 0, or -EINVAL when saved does not fit these params (a g that is
 * not allowed, a value out of range; the optimizer is then as new) or it was called late. */
int omv_optimizer_restore(omv_optimizer_t *self, const omv_opt_saved_t *saved, double now_s);

/* Appends one human line, e.g. "phase 2, g=4, momentum=0.6, lr=0.01, state=probing (grid
 * 3/8)", without a newline. */
void omv_optimizer_describe(const omv_optimizer_t *self, omv_strbuf_t *out);

/* Appends every decision so far as a JSON array of objects (see optimizer_decisions.c for the
 * records: "event" is "start", "probe", "skip", "choose", "grow", "halve", "phase", "phase_end",
 * "diverge", "membership" or "resume"). */
void omv_optimizer_decisions(const omv_optimizer_t *self, omv_strbuf_t *out);

/* Appends the decisions recorded since *cursor as JSON lines (one object and '\n' each) and
 * advances *cursor; start with *cursor = 0. For a decisions file written as it goes. */
void omv_optimizer_decisions_since(const omv_optimizer_t *self, size_t *cursor, omv_strbuf_t *out);
