/* Stale synchronous parallel, as a property: seeded simulations of compute groups whose workers
 * run at skewed speeds, leave and join (also half-way through a step), and make bad pushes,
 * checking at every model read that no update older than the staleness bound allows is missing,
 * that each update is applied once, and that the run never stalls. A failure names the variant,
 * the seed and the event. */
#include <check.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "rng.h"
#include "testutil.h"

enum { MAX_SHARDS = 8, MAX_WORKERS = 16, MAX_EVENTS = 400000 };

/* OMV_SSP_TRACE=1 prints every event to stderr, to follow a failure by hand: with CK_FORK=no
 * and CK_RUN_CASE=property (or membership_mid_step) the runs follow each other in the order of
 * the loop index, each starting at "0: w0 joins". */
static int trace = -1;

__attribute__((format(printf, 1, 2))) static void trace_line(const char *fmt, ...)
{
    if (trace < 0)
        trace = getenv("OMV_SSP_TRACE") != NULL;
    if (!trace)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* W_JOIN: joined while part of the group's step was applied (join returned 1). It is in the
 * group but not a member of that step: it waits, pushing nothing, and becomes W_WAIT when the
 * group's next step starts, whether the step completes or its last member leaves. */
typedef enum { W_OFF, W_JOIN, W_WAIT, W_PUSH } wstate_t;

typedef struct {
    wstate_t state;
    uint32_t group;             /* while not W_OFF */
    uint32_t home;              /* the group it first joins and returns to */
    uint64_t step;              /* W_JOIN: its first step, the group's clock + 1; W_WAIT: the
                                   step to begin; W_PUSH: the step being pushed */
    uint32_t next;              /* W_PUSH: how many of order[] were pushed */
    uint32_t order[MAX_SHARDS]; /* the order it pushes the shards of this step in */
    uint64_t push_step;         /* the step pushed_mask is about */
    uint32_t pushed_mask;       /* shards pushed for push_step since it (re)joined */
    uint32_t weight;            /* relative speed: 1 is 10x slower than 10 */
    bool rejoined;              /* left and joined again at least once */
    bool late;                  /* its last join returned 1 */
    uint32_t read_mask;         /* W_WAIT: shards of step read early (early_reads) */
} sim_worker_t;

typedef struct {
    const char *name;
    uint32_t groups, per_group, shards;
    int64_t staleness;       /* what the groups object enforces */
    int64_t check_staleness; /* what the reads are checked against (normally the same) */
    uint64_t target;         /* steps every group runs */
    bool churn;              /* members leave and join during the first part of the run */
    bool mid_step_churn;     /* ... at any moment; otherwise a worker joins a live group, and a
                                group's last member leaves, only while no shard of the group's
                                step is applied yet (so join always returns 0, and a group that
                                empties keeps its clock) */
    bool bad_pushes;         /* duplicates, wrong steps and pushes from departed workers */
    bool early_reads;        /* as the daemon answers a pull for the next step: shard by shard,
                                each as soon as the group's current step has it applied
                                (omv_groups_may_read_next), the rest once the step is done */
} sim_cfg_t;

/* The properties checked; each violation is counted and the first of each kind kept. */
enum {
    V_OWN,    /* (a) a read misses an update of its own group from an earlier step */
    V_BOUND,  /* (b) a read misses another live group's update older than step - s - 1 */
    V_TWICE,  /* (c) an update (group, step, shard) was applied more than once */
    V_LATE,   /* a push was accepted for an update already applied: its gradient is lost */
    V_GATHER, /* a shard was applied before every live member of the step pushed it, or with
                 pushes of another step gathered */
    V_SETTLE, /* every live member pushed a shard and it was not applied */
    V_REFUSE, /* a good push was refused or a bad one accepted, or a refusal changed state */
    V_STALL,  /* live workers left with work and none of them may act */
    V_TARGET, /* a group with members did not reach the target step */
    V_CLOCK,  /* clocks or member counts disagree with the workers' own view */
    V_COUNT
};
static const char *const v_names[V_COUNT] = {
    "(a) own-group update missing at read",
    "(b) staleness bound broken at read",
    "(c) update applied twice",
    "push accepted after its update was applied",
    "applied without the step's pushes",
    "step not settled",
    "refusal",
    "stall (deadlock)",
    "target not reached",
    "clock/membership",
};

typedef struct {
    sim_cfg_t cfg;
    uint64_t seed;
    omv_rng_t rng;
    omv_groups_t *gs;
    sim_worker_t w[MAX_WORKERS];
    uint32_t n_workers;
    uint64_t event;
    uint64_t steps;        /* target + 1: the second index of the per-step arrays */
    uint8_t *started;      /* [group][step]: some member read the model for it */
    uint8_t *abandoned;    /* [group][step]: the group retired during it; what was not applied
                              never will be (unless the step is begun again) */
    uint8_t *applied;      /* [group][step][shard]: times applied */
    uint64_t *pend_step;   /* [group][shard]: step of the pushes gathered since the last apply */
    uint32_t *pend_pushes; /* [group][shard]: pushes gathered since the last apply */
    uint64_t n_events_cb;  /* callbacks fired, to see that refusals change nothing */
    uint32_t v_count[V_COUNT];
    char v_first[V_COUNT][320];
    /* How much the run exercised, so that a run which tested nothing fails. */
    uint64_t reads, pushes, reads_after_rejoin, bound_waits, leaves, joins, retires, jumps;
    uint64_t refusals;
    uint64_t late_joins;        /* joins that returned 1 */
    uint64_t late_reads;        /* reads by workers whose last join returned 1: they took part */
    uint64_t mid_apply_retires; /* groups emptied with part of their step applied */
    uint64_t reads_after_mid_apply;   /* reads of the step such a group moved on to */
    uint64_t resumed_at[MAX_WORKERS]; /* [group]: the clock it moved on to then (>= 1; 0: never) */
    uint64_t max_spread;              /* largest clock difference seen between live groups */
    uint64_t early_reads;             /* shards read before the group's step was done */
} sim_t;

__attribute__((format(printf, 3, 4))) static void violation(sim_t *sim, int kind, const char *fmt,
                                                            ...)
{
    if (sim->v_count[kind]++ > 0)
        return;
    char *out = sim->v_first[kind];
    int n =
        snprintf(out, sizeof(sim->v_first[kind]), "event %llu: ", (unsigned long long)sim->event);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, sizeof(sim->v_first[kind]) - (size_t)n, fmt, ap);
    va_end(ap);
}

static uint8_t *applied_at(const sim_t *sim, uint32_t g, uint64_t step, uint32_t sh)
{
    return &sim->applied[((size_t)g * sim->steps + step) * sim->cfg.shards + sh];
}

static size_t gs_index(const sim_t *sim, uint32_t g, uint64_t step)
{
    return (size_t)g * sim->steps + step;
}

/* ---- the groups' events ---- */

static bool is_member(const sim_worker_t *x);

static void on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    sim_t *sim = ctx;
    sim->n_events_cb++;
    uint64_t step = omv_groups_clock(sim->gs, group);
    trace_line("  apply g%u step %llu shard %u", group, (unsigned long long)step, shard);
    if (step >= sim->steps) {
        violation(sim, V_CLOCK, "group %u applied shard %u of step %llu past the target", group,
                  shard, (unsigned long long)step);
        return;
    }
    uint8_t *a = applied_at(sim, group, step, shard);
    if (++*a > 1)
        violation(sim, V_TWICE, "group %u step %llu shard %u applied %u times", group,
                  (unsigned long long)step, shard, *a);
    size_t p = (size_t)group * sim->cfg.shards + shard;
    if (sim->pend_pushes[p] > 0 && sim->pend_step[p] != step)
        violation(sim, V_GATHER, "group %u shard %u applied as step %llu with pushes of step %llu",
                  group, shard, (unsigned long long)step, (unsigned long long)sim->pend_step[p]);
    sim->pend_pushes[p] = 0;
    /* An update is due only when every live member of the step has pushed the shard (a leaver
     * is W_OFF by now, a newcomer W_JOIN): one applied earlier would miss a gradient. */
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *x = &sim->w[i];
        if (is_member(x) && x->group == group &&
            !(x->push_step == step && (x->pushed_mask >> shard & 1u)))
            violation(sim, V_GATHER,
                      "group %u step %llu shard %u applied before worker %u pushed it", group,
                      (unsigned long long)step, shard, i);
    }
}

static void promote_joiners(sim_t *sim, uint32_t g);

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    sim_t *sim = ctx;
    sim->n_events_cb++;
    trace_line("  advance g%u to %llu", group, (unsigned long long)clock);
    if (clock != omv_groups_clock(sim->gs, group))
        violation(sim, V_CLOCK, "group %u advanced to %llu but its clock is %llu", group,
                  (unsigned long long)clock, (unsigned long long)omv_groups_clock(sim->gs, group));
    promote_joiners(sim, group);
    for (uint32_t sh = 0; sh < sim->cfg.shards && clock >= 1 && clock <= sim->steps; sh++)
        if (*applied_at(sim, group, clock - 1, sh) == 0)
            violation(sim, V_CLOCK, "group %u advanced to %llu without shard %u of step %llu",
                      group, (unsigned long long)clock, sh, (unsigned long long)(clock - 1));
    if (clock > sim->cfg.target)
        violation(sim, V_CLOCK, "group %u advanced to %llu, past the target %llu", group,
                  (unsigned long long)clock, (unsigned long long)sim->cfg.target);
}

static void on_retire(void *ctx, uint32_t group)
{
    sim_t *sim = ctx;
    sim->n_events_cb++;
    sim->retires++;
    trace_line("  retire g%u at %llu", group, (unsigned long long)omv_groups_clock(sim->gs, group));
    uint64_t c = omv_groups_clock(sim->gs, group);
    if (c < sim->steps && sim->started[gs_index(sim, group, c)])
        sim->abandoned[gs_index(sim, group, c)] = 1;
    /* The daemon discards the pending sums: those pushes will be in no update. */
    for (uint32_t sh = 0; sh < sim->cfg.shards; sh++)
        sim->pend_pushes[(size_t)group * sim->cfg.shards + sh] = 0;
}

/* ---- the workers' view ---- */

/* A member of its group's current step: waited for, and counted by omv_groups_live. */
static bool is_member(const sim_worker_t *x)
{
    return x->state == W_WAIT || x->state == W_PUSH;
}

static uint32_t live_members(const sim_t *sim, uint32_t g)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < sim->n_workers; i++)
        n += is_member(&sim->w[i]) && sim->w[i].group == g;
    return n;
}

/* The group's next step has started: its newcomers are members from now on. A newcomer whose
 * first step is not the new clock stays W_JOIN, and check_state reports it. */
static void promote_joiners(sim_t *sim, uint32_t g)
{
    uint64_t c = omv_groups_clock(sim->gs, g);
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        sim_worker_t *x = &sim->w[i];
        if (x->state == W_JOIN && x->group == g && x->step == c) {
            trace_line("  w%u is a member of g%u from step %llu", i, g, (unsigned long long)c);
            x->state = W_WAIT;
        }
    }
}

static bool done(const sim_t *sim, const sim_worker_t *w)
{
    return w->state == W_WAIT && w->step >= sim->cfg.target;
}

/* With early reads: how many shards w may read now, before its group's step is done, into
 * ks[] (its group's current step has them applied, and the bound allows its step). */
static uint32_t early_shards(const sim_t *sim, const sim_worker_t *w, uint32_t *ks)
{
    uint32_t n = 0;
    if (!sim->cfg.early_reads || w->state != W_WAIT || done(sim, w) ||
        !omv_groups_may_read_next(sim->gs, w->group, w->step))
        return 0;
    for (uint32_t k = 0; k < sim->cfg.shards; k++)
        if (!(w->read_mask >> k & 1u) && omv_groups_shard_applied(sim->gs, w->group, k))
            ks[n++] = k;
    return n;
}

static bool may_act(const sim_t *sim, const sim_worker_t *w)
{
    uint32_t ks[MAX_SHARDS];
    if (w->state == W_PUSH)
        return true;
    return w->state == W_WAIT && !done(sim, w) &&
           (omv_groups_may_begin(sim->gs, w->group, w->step) || early_shards(sim, w, ks) > 0);
}

/* Is step `below` or anything older of group h still to be applied? Describes what into why. */
static bool missing_upto(const sim_t *sim, uint32_t h, uint64_t below, char *why, size_t cap)
{
    for (uint64_t u = 0; u <= below && u < sim->steps; u++) {
        if (!sim->started[gs_index(sim, h, u)] || sim->abandoned[gs_index(sim, h, u)])
            continue;
        for (uint32_t sh = 0; sh < sim->cfg.shards; sh++) {
            if (*applied_at(sim, h, u, sh) == 0) {
                snprintf(why, cap, "group %u step %llu shard %u not applied", h,
                         (unsigned long long)u, sh);
                return true;
            }
        }
    }
    /* A worker of the group (a member, or a newcomer waiting for its first step) that has still
     * to do step u <= below will add an update the read lacks. */
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *x = &sim->w[i];
        if (x->state != W_OFF && x->group == h && x->step <= below) {
            snprintf(why, cap, "worker %u of group %u has step %llu still to do", i, h,
                     (unsigned long long)x->step);
            return true;
        }
    }
    return false;
}

/* Is shard sh of step `below` or anything older of group h still to be applied? As
 * missing_upto, for one shard: a worker that pushed sh of step `below` owes it nothing more. */
static bool missing_shard_upto(const sim_t *sim, uint32_t h, uint64_t below, uint32_t sh, char *why,
                               size_t cap)
{
    for (uint64_t u = 0; u <= below && u < sim->steps; u++) {
        if (sim->started[gs_index(sim, h, u)] && !sim->abandoned[gs_index(sim, h, u)] &&
            *applied_at(sim, h, u, sh) == 0) {
            snprintf(why, cap, "group %u step %llu shard %u not applied", h, (unsigned long long)u,
                     sh);
            return true;
        }
    }
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *x = &sim->w[i];
        bool owes = x->state != W_OFF && x->group == h && x->step <= below;
        if (owes && x->state == W_PUSH && x->step == below && (x->pushed_mask >> sh & 1u))
            owes = false;
        if (owes) {
            snprintf(why, cap, "worker %u of group %u has step %llu still to do", i, h,
                     (unsigned long long)x->step);
            return true;
        }
    }
    return false;
}

/* Worker i reads one shard of its step early (early_reads): the same guarantee, for that shard,
 * at that moment. */
static void do_early_read(sim_t *sim, uint32_t i, const uint32_t *ks, uint32_t n)
{
    sim_worker_t *w = &sim->w[i];
    uint32_t g = w->group, k = ks[omv_rng_below(&sim->rng, n)];
    uint64_t t = w->step;
    char why[160];
    trace_line("%llu: w%u early read g%u step %llu shard %u", (unsigned long long)sim->event, i, g,
               (unsigned long long)t, k);
    sim->early_reads++;
    if (t == 0 || missing_shard_upto(sim, g, t - 1, k, why, sizeof(why)))
        violation(sim, V_OWN, "worker %u of group %u read shard %u of step %llu early: %s", i, g, k,
                  (unsigned long long)t, t == 0 ? "no step before it" : why);
    int64_t s = sim->cfg.check_staleness;
    if (s >= 0 && t >= (uint64_t)s + 1)
        for (uint32_t h = 0; h < sim->cfg.groups; h++)
            if (h != g && live_members(sim, h) > 0 &&
                missing_shard_upto(sim, h, t - (uint64_t)s - 1, k, why, sizeof(why)))
                violation(sim, V_BOUND,
                          "worker %u of group %u read shard %u of step %llu early (s=%lld): %s", i,
                          g, k, (unsigned long long)t, (long long)s, why);
    w->read_mask |= 1u << k;
}

/* Worker i reads the model for its step: the moment the guarantee is about. */
static void do_read(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    uint32_t g = w->group;
    uint64_t t = w->step;
    char why[160];
    trace_line("%llu: w%u read g%u step %llu", (unsigned long long)sim->event, i, g,
               (unsigned long long)t);
    sim->reads++;
    sim->reads_after_rejoin += w->rejoined;
    sim->late_reads += w->late;
    sim->reads_after_mid_apply += t > 0 && sim->resumed_at[g] == t;
    sim->started[gs_index(sim, g, t)] = 1;
    sim->abandoned[gs_index(sim, g, t)] = 0; /* begun again after a retire: due again */
    if (t > 0 && missing_upto(sim, g, t - 1, why, sizeof(why)))
        violation(sim, V_OWN, "worker %u of group %u read step %llu: %s", i, g,
                  (unsigned long long)t, why);
    int64_t s = sim->cfg.check_staleness;
    if (s >= 0 && t >= (uint64_t)s + 1) {
        uint64_t below = t - (uint64_t)s - 1;
        for (uint32_t h = 0; h < sim->cfg.groups; h++) {
            if (h != g && live_members(sim, h) > 0 && missing_upto(sim, h, below, why, sizeof(why)))
                violation(sim, V_BOUND, "worker %u of group %u read step %llu (s=%lld): %s", i, g,
                          (unsigned long long)t, (long long)s, why);
        }
    }
    for (uint32_t k = 0; k < sim->cfg.shards; k++)
        w->order[k] = k;
    omv_rng_shuffle(&sim->rng, w->order, sim->cfg.shards);
    w->state = W_PUSH;
    w->next = 0;
    w->push_step = t;
    w->pushed_mask = 0;
    w->read_mask = 0;
}

/* A push that must be refused with `want` and change nothing. */
static void bad_push(sim_t *sim, uint32_t slot, uint64_t step, uint32_t shard, omv_refuse_t want,
                     const char *what)
{
    char why[OMV_WIRE_REASON_MAX] = "";
    uint64_t cb = sim->n_events_cb;
    uint64_t clocks[MAX_WORKERS];
    for (uint32_t g = 0; g < sim->cfg.groups; g++)
        clocks[g] = omv_groups_clock(sim->gs, g);
    omv_refuse_t r = omv_groups_check_push(sim->gs, slot, step, shard, why);
    sim->refusals++;
    if (r != want)
        violation(sim, V_REFUSE, "%s (slot %u step %llu shard %u): verdict %d, expected %d", what,
                  slot, (unsigned long long)step, shard, (int)r, (int)want);
    else if (why[0] == '\0')
        violation(sim, V_REFUSE, "%s refused without a reason", what);
    if (r == OMV_REFUSE_NONE)
        omv_groups_record_push(sim->gs, slot, shard); /* as the daemon would */
    bool same = sim->n_events_cb == cb;
    for (uint32_t g = 0; g < sim->cfg.groups; g++)
        same = same && clocks[g] == omv_groups_clock(sim->gs, g);
    if (!same)
        violation(sim, V_REFUSE, "%s changed the groups' state", what);
}

/* Now and then, before a good push, the worker sends a duplicate or a push for a wrong step. */
static void maybe_bad_push(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    if (!sim->cfg.bad_pushes || omv_rng_below(&sim->rng, 8) != 0)
        return;
    uint32_t kind = omv_rng_below(&sim->rng, 3);
    if (kind == 0 && w->next > 0) {
        uint32_t sh = w->order[omv_rng_below(&sim->rng, w->next)];
        bad_push(sim, i, w->step, sh, OMV_REFUSE_STEP, "duplicate push");
    } else if (kind == 1 || w->step == 0) {
        uint64_t ahead = w->step + 1 + omv_rng_below(&sim->rng, 3);
        bad_push(sim, i, ahead, w->order[w->next], OMV_REFUSE_STEP, "push for a later step");
    } else {
        uint64_t behind =
            w->step - 1 - omv_rng_below(&sim->rng, (uint32_t)(w->step < 3 ? w->step : 3));
        bad_push(sim, i, behind, w->order[w->next], OMV_REFUSE_STEP, "push for an older step");
    }
}

static void do_push(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    maybe_bad_push(sim, i);
    uint32_t g = w->group, sh = w->order[w->next];
    char why[OMV_WIRE_REASON_MAX] = "";
    omv_refuse_t r = omv_groups_check_push(sim->gs, i, w->step, sh, why);
    trace_line("%llu: w%u push g%u step %llu shard %u: %d", (unsigned long long)sim->event, i, g,
               (unsigned long long)w->step, sh, (int)r);
    sim->pushes++;
    if (r != OMV_REFUSE_NONE) {
        violation(sim, V_REFUSE, "worker %u of group %u: push of step %llu shard %u refused: %s", i,
                  g, (unsigned long long)w->step, sh, why);
    } else {
        if (*applied_at(sim, g, w->step, sh) > 0) {
            violation(sim, V_LATE,
                      "worker %u of group %u: push of step %llu shard %u accepted "
                      "after that shard was applied",
                      i, g, (unsigned long long)w->step, sh);
        } else {
            size_t p = (size_t)g * sim->cfg.shards + sh;
            sim->pend_step[p] = w->step;
            sim->pend_pushes[p]++;
        }
        w->pushed_mask |= 1u << sh;
        omv_groups_record_push(sim->gs, i, sh);
    }
    if (++w->next == sim->cfg.shards) {
        w->state = W_WAIT;
        w->step++;
    }
}

/* Whether any shard of group g's current step is applied already. */
static bool step_under_way(const sim_t *sim, uint32_t g)
{
    uint64_t c = omv_groups_clock(sim->gs, g);
    for (uint32_t sh = 0; c < sim->steps && sh < sim->cfg.shards; sh++)
        if (*applied_at(sim, g, c, sh) > 0)
            return true;
    return false;
}

static void do_leave(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    uint32_t g = w->group;
    bool last = is_member(w) && live_members(sim, g) == 1;
    bool under_way = step_under_way(sim, g);
    uint64_t old = omv_groups_clock(sim->gs, g);
    w->state = W_OFF;
    sim->leaves++;
    omv_groups_leave(sim->gs, i);
    uint64_t c = omv_groups_clock(sim->gs, g);
    trace_line("%llu: w%u leaves g%u%s: clock %llu -> %llu", (unsigned long long)sim->event, i, g,
               last ? " (last)" : "", (unsigned long long)old, (unsigned long long)c);
    if (last) {
        /* The documented rule: a group emptied half-way through applying a step counts it done,
         * so that no shard of it is applied twice; one emptied before any shard keeps its clock,
         * and the step starts afresh. (Otherwise the clock moves only through advance.) */
        uint64_t want = under_way ? old + 1 : old;
        if (c != want)
            violation(sim, V_CLOCK, "group %u emptied %s at %llu, clock now %llu, expected %llu", g,
                      under_way ? "mid-apply" : "before any apply", (unsigned long long)old,
                      (unsigned long long)c, (unsigned long long)want);
        if (under_way) {
            sim->mid_apply_retires++;
            sim->resumed_at[g] = c;
        }
        promote_joiners(sim, g);
    }
    if (sim->cfg.bad_pushes)
        bad_push(sim, i, c, 0, OMV_REFUSE_UNKNOWN_WORKER, "push from a departed worker");
}

static void do_join(sim_t *sim, uint32_t i, uint32_t g)
{
    sim_worker_t *w = &sim->w[i];
    bool empty = live_members(sim, g) == 0;
    bool under_way = !empty && step_under_way(sim, g);
    uint64_t old = omv_groups_clock(sim->gs, g), floor = UINT64_MAX;
    for (uint32_t h = 0; h < sim->cfg.groups; h++)
        if (h != g && live_members(sim, h) > 0 && omv_groups_clock(sim->gs, h) < floor)
            floor = omv_groups_clock(sim->gs, h);
    int rc = omv_groups_join(sim->gs, i, g);
    /* The documented rule: 1 when part of a live group's step is applied already (an empty
     * group has nothing of its step applied: it starts it afresh or moved on), 0 otherwise. */
    int want_rc = under_way ? 1 : 0;
    if (rc != want_rc)
        violation(sim, V_CLOCK, "worker %u joined group %u (%s, step %s): %d, expected %d", i, g,
                  empty ? "empty" : "live", under_way ? "under way" : "not begun", rc, want_rc);
    if (rc < 0)
        return;
    uint64_t c = omv_groups_clock(sim->gs, g);
    trace_line("%llu: w%u joins g%u (%s%s): clock %llu -> %llu", (unsigned long long)sim->event, i,
               g, empty ? "empty" : "live", rc == 1 ? ", from the next step" : "",
               (unsigned long long)old, (unsigned long long)c);
    /* The documented rule: an empty group comes back at the slowest live clock if behind it. */
    uint64_t want = empty && floor != UINT64_MAX && old < floor ? floor : old;
    if (c != want)
        violation(sim, V_CLOCK, "group %u (%s) rejoined at %llu, expected %llu", g,
                  empty ? "empty" : "live", (unsigned long long)c, (unsigned long long)want);
    sim->jumps += c != old;
    sim->joins++;
    w->group = g;
    w->rejoined = true;
    w->late = rc == 1;
    w->pushed_mask = 0;
    w->read_mask = 0;
    if (rc == 0) {
        w->state = W_WAIT;
        w->step = c; /* the daemon tells a joining worker its group's clock */
    } else {
        /* Its first step is the group's next: a gradient for this one could go into no update. */
        sim->late_joins++;
        w->state = W_JOIN;
        w->step = c + 1;
        if (sim->cfg.bad_pushes) {
            uint32_t sh = omv_rng_below(&sim->rng, sim->cfg.shards);
            bad_push(sim, i, c, sh, OMV_REFUSE_STEP, "newcomer's push for the step under way");
            bad_push(sim, i, c + 1, sh, OMV_REFUSE_STEP, "newcomer's push before its first step");
        }
    }
    w->push_step = w->step;
}

static bool may_join(sim_t *sim, uint32_t g)
{
    return sim->cfg.mid_step_churn || live_members(sim, g) == 0 || !step_under_way(sim, g);
}

static bool may_leave(sim_t *sim, uint32_t i)
{
    uint32_t g = sim->w[i].group;
    return sim->cfg.mid_step_churn || !is_member(&sim->w[i]) || live_members(sim, g) > 1 ||
           !step_under_way(sim, g);
}

static void check_state(sim_t *sim);

/* Mid-step variants seek the moments the membership rules are about, which churn at random
 * moments seldom meets (a shard is applied only once every member pushed it, so a step is
 * half-applied briefly). Their churn picks a group half-way through applying a step, if there is
 * one, and either moves a worker of another group (or one that is off) into it, so that it joins
 * with the next step, or restarts the step's members (their host went down and came back: they
 * leave, emptying the group mid-apply, and join it again at once, the moment a step applied in
 * part could be redone; its newcomers stay). Returns false, doing nothing, when no group is
 * half-way. */
static bool seek_mid_step(sim_t *sim)
{
    uint32_t cand[MAX_WORKERS], n = 0;
    for (uint32_t h = 0; h < sim->cfg.groups; h++)
        if (live_members(sim, h) > 0 && step_under_way(sim, h))
            cand[n++] = h;
    if (n == 0)
        return false;
    uint32_t g = cand[omv_rng_below(&sim->rng, n)];
    uint32_t pick[MAX_WORKERS], m = 0;
    for (uint32_t j = 0; j < sim->n_workers; j++)
        if (sim->w[j].state == W_OFF || sim->w[j].group != g)
            pick[m++] = j;
    if (m > 0 && omv_rng_below(&sim->rng, 2) == 0) {
        uint32_t j = pick[omv_rng_below(&sim->rng, m)];
        if (sim->w[j].state != W_OFF) {
            do_leave(sim, j);
            check_state(sim);
        }
        do_join(sim, j, g);
        return true;
    }
    m = 0;
    for (uint32_t j = 0; j < sim->n_workers; j++)
        if (is_member(&sim->w[j]) && sim->w[j].group == g)
            pick[m++] = j;
    trace_line("%llu: the members of g%u restart", (unsigned long long)sim->event, g);
    for (uint32_t k = 0; k < m; k++) {
        do_leave(sim, pick[k]);
        check_state(sim);
    }
    for (uint32_t k = 0; k < m; k++) {
        do_join(sim, pick[k], g);
        check_state(sim);
    }
    return true;
}

/* Invariants after every event: membership and clocks as the workers see them, and no shard
 * that every member of the step pushed still waiting. */
static void check_state(sim_t *sim)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t g = 0; g < sim->cfg.groups; g++) {
        uint32_t live = live_members(sim, g);
        if (live != omv_groups_live(sim->gs, g))
            violation(sim, V_CLOCK, "group %u has %u live members, the groups object says %u", g,
                      live, omv_groups_live(sim->gs, g));
        if (live == 0)
            continue;
        uint64_t c = omv_groups_clock(sim->gs, g);
        lo = c < lo ? c : lo;
        hi = c > hi ? c : hi;
        if (c >= sim->cfg.target)
            continue;
        for (uint32_t sh = 0; sh < sim->cfg.shards; sh++) {
            bool all = true;
            for (uint32_t i = 0; i < sim->n_workers && all; i++) {
                const sim_worker_t *x = &sim->w[i];
                if (is_member(x) && x->group == g)
                    all = x->push_step == c && (x->pushed_mask >> sh & 1u);
            }
            if (all && *applied_at(sim, g, c, sh) == 0)
                violation(sim, V_SETTLE,
                          "group %u step %llu shard %u: all %u live members pushed "
                          "it, not applied",
                          g, (unsigned long long)c, sh, live);
        }
    }
    if (lo != UINT64_MAX && hi - lo > sim->max_spread)
        sim->max_spread = hi - lo;
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *x = &sim->w[i];
        int want_group = x->state == W_OFF ? -1 : (int)x->group;
        if (omv_groups_of(sim->gs, i) != want_group)
            violation(sim, V_CLOCK, "slot %u: the groups object says group %d, the worker %d", i,
                      omv_groups_of(sim->gs, i), want_group);
        if (x->state == W_OFF)
            continue;
        uint64_t c = omv_groups_clock(sim->gs, x->group);
        bool ok = x->state == W_JOIN ? x->step == c + 1
                                     : x->step == c || (x->state == W_WAIT && x->step == c + 1);
        if (!ok)
            violation(sim, V_CLOCK, "worker %u at step %llu (%s) but group %u at %llu", i,
                      (unsigned long long)x->step,
                      x->state == W_JOIN   ? "joining"
                      : x->state == W_WAIT ? "waiting"
                                           : "pushing",
                      x->group, (unsigned long long)c);
    }
}

static void describe(const sim_t *sim, char *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t g = 0; g < sim->cfg.groups && n < cap; g++)
        n += (size_t)snprintf(out + n, cap - n, " g%u@%llu/%u", g,
                              (unsigned long long)omv_groups_clock(sim->gs, g),
                              omv_groups_live(sim->gs, g));
    for (uint32_t i = 0; i < sim->n_workers && n < cap; i++) {
        const sim_worker_t *x = &sim->w[i];
        n += (size_t)snprintf(out + n, cap - n, " w%u:%s", i,
                              x->state == W_OFF    ? "off"
                              : x->state == W_JOIN ? "join"
                              : x->state == W_WAIT ? "wait"
                                                   : "push");
        if (x->state != W_OFF && n < cap)
            n += (size_t)snprintf(out + n, cap - n, "(g%u,%llu)", x->group,
                                  (unsigned long long)x->step);
    }
}

/* Runs one simulation to the end; the caller asserts on sim's counters. */
static void sim_run(sim_t *sim, const sim_cfg_t *cfg, uint64_t seed)
{
    memset(sim, 0, sizeof(*sim));
    sim->cfg = *cfg;
    sim->seed = seed;
    sim->n_workers = cfg->groups * cfg->per_group;
    ck_assert_uint_le(sim->n_workers, MAX_WORKERS);
    ck_assert_uint_le(cfg->shards, MAX_SHARDS);
    sim->steps = cfg->target + 1;
    size_t n_gs = (size_t)cfg->groups * sim->steps;
    sim->started = calloc(n_gs, 1);
    sim->abandoned = calloc(n_gs, 1);
    sim->applied = calloc(n_gs * cfg->shards, 1);
    sim->pend_step = calloc((size_t)cfg->groups * cfg->shards, sizeof(uint64_t));
    sim->pend_pushes = calloc((size_t)cfg->groups * cfg->shards, sizeof(uint32_t));
    ck_assert(sim->started && sim->abandoned && sim->applied && sim->pend_step && sim->pend_pushes);
    omv_rng_init(&sim->rng, seed);
    omv_groups_events_t ev = {on_apply, on_advance, on_retire, sim};
    sim->gs = omv_groups_new(sim->n_workers, cfg->groups, cfg->shards, cfg->staleness, &ev);
    ck_assert_ptr_nonnull(sim->gs);

    /* Skewed speeds: one group entirely 10x slower, and a third of the others' workers too. */
    uint32_t slow_group = omv_rng_below(&sim->rng, cfg->groups);
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        sim_worker_t *w = &sim->w[i];
        w->home = i % cfg->groups;
        bool slow = w->home == slow_group || omv_rng_below(&sim->rng, 3) == 0;
        w->weight = slow ? 1 : 10;
        do_join(sim, i, w->home);
        w->rejoined = false;
    }
    sim->joins = 0;

    /* Members come and go during the first half of the expected run; twice as often where they
     * seek the mid-step moments, so that every seed meets them. */
    uint64_t churn_until =
        cfg->churn ? (uint64_t)sim->n_workers * cfg->target * (cfg->shards + 1) / 2 : 0;
    uint32_t acting[MAX_WORKERS];
    for (sim->event = 0; sim->event < MAX_EVENTS; sim->event++) {
        if (sim->event < churn_until &&
            omv_rng_below(&sim->rng, cfg->mid_step_churn ? 32 : 64) == 0) {
            uint32_t i = omv_rng_below(&sim->rng, sim->n_workers);
            uint32_t g = omv_rng_below(&sim->rng, 4) == 0 ? omv_rng_below(&sim->rng, cfg->groups)
                                                          : sim->w[i].home;
            bool sought = cfg->mid_step_churn && seek_mid_step(sim);
            if (!sought && sim->w[i].state != W_OFF && may_leave(sim, i))
                do_leave(sim, i);
            else if (!sought && sim->w[i].state == W_OFF && may_join(sim, g))
                do_join(sim, i, g);
            check_state(sim);
            continue;
        }
        if (sim->event >= churn_until) {
            for (uint32_t i = 0; i < sim->n_workers; i++) {
                if (sim->w[i].state == W_OFF && may_join(sim, sim->w[i].home)) {
                    do_join(sim, i, sim->w[i].home);
                    check_state(sim);
                }
            }
        }
        uint32_t n = 0, total = 0, waiting = 0, off = 0;
        for (uint32_t i = 0; i < sim->n_workers; i++) {
            const sim_worker_t *w = &sim->w[i];
            off += w->state == W_OFF;
            if (may_act(sim, w)) {
                acting[n++] = i;
                total += w->weight;
            } else if (w->state == W_JOIN) {
                waiting++; /* for its group's step to complete */
            } else if (w->state == W_WAIT && !done(sim, w)) {
                waiting++;
                /* Waiting although its own group is ready: the bound holds it back. */
                sim->bound_waits += omv_groups_clock(sim->gs, w->group) == w->step;
            }
        }
        if (n == 0) {
            if (waiting > 0) {
                char state[1024];
                describe(sim, state, sizeof(state));
                violation(sim, V_STALL, "%u workers wait, none may act:%s", waiting, state);
                break;
            }
            if (off > 0)
                continue; /* everyone left: only a join can happen, and it will */
            break;        /* every worker reached the target */
        }
        uint32_t pick = omv_rng_below(&sim->rng, total), k = 0;
        while (pick >= sim->w[acting[k]].weight)
            pick -= sim->w[acting[k++]].weight;
        uint32_t i = acting[k], ks[MAX_SHARDS];
        if (sim->w[i].state == W_WAIT &&
            omv_groups_may_begin(sim->gs, sim->w[i].group, sim->w[i].step))
            do_read(sim, i);
        else if (sim->w[i].state == W_WAIT)
            do_early_read(sim, i, ks, early_shards(sim, &sim->w[i], ks));
        else
            do_push(sim, i);
        check_state(sim);
    }
    if (sim->event == MAX_EVENTS)
        violation(sim, V_STALL, "no end after %d events", MAX_EVENTS);
    for (uint32_t g = 0; g < cfg->groups; g++)
        if (omv_groups_live(sim->gs, g) > 0 && omv_groups_clock(sim->gs, g) != cfg->target)
            violation(sim, V_TARGET, "group %u ended at step %llu of %llu", g,
                      (unsigned long long)omv_groups_clock(sim->gs, g),
                      (unsigned long long)cfg->target);
    omv_groups_destroy(&sim->gs);
    free(sim->started);
    free(sim->abandoned);
    free(sim->applied);
    free(sim->pend_step);
    free(sim->pend_pushes);
}

/* Every violation, one line per kind, with the variant and seed to reproduce it. */
static uint32_t report(const sim_t *sim, char *out, size_t cap)
{
    uint32_t total = 0;
    size_t n = (size_t)snprintf(
        out, cap,
        "variant %s seed %llu (%llu events, %llu reads, %llu pushes, %llu leaves, %llu joins, "
        "%llu retires, %llu clock jumps, %llu bad pushes, %llu joins mid-step with %llu reads "
        "after, %llu groups emptied mid-apply with %llu reads after):",
        sim->cfg.name, (unsigned long long)sim->seed, (unsigned long long)sim->event,
        (unsigned long long)sim->reads, (unsigned long long)sim->pushes,
        (unsigned long long)sim->leaves, (unsigned long long)sim->joins,
        (unsigned long long)sim->retires, (unsigned long long)sim->jumps,
        (unsigned long long)sim->refusals, (unsigned long long)sim->late_joins,
        (unsigned long long)sim->late_reads, (unsigned long long)sim->mid_apply_retires,
        (unsigned long long)sim->reads_after_mid_apply);
    for (int k = 0; k < V_COUNT; k++) {
        total += sim->v_count[k];
        if (sim->v_count[k] > 0 && n < cap)
            n += (size_t)snprintf(out + n, cap - n, "\n  %s: %u times; first at %s", v_names[k],
                                  sim->v_count[k], sim->v_first[k]);
    }
    return total;
}

/* ---- the variants ---- */

static const uint64_t seeds[] = {1, 2, 3, 0x5eed, 20261130};
enum { N_SEEDS = sizeof(seeds) / sizeof(seeds[0]) };

#define VARIANT(name_, g_, k_, sh_, s_, target_, churn_, mid_, bad_)                               \
    {                                                                                              \
        .name = name_, .groups = g_, .per_group = k_, .shards = sh_, .staleness = s_,              \
        .check_staleness = s_, .target = target_, .churn = churn_, .mid_step_churn = mid_,         \
        .bad_pushes = bad_                                                                         \
    }

/* Groups x workers per group x shards, bound, target step. Churn here happens only while no
 * shard of the group's step is applied, so every join returns 0 and no group is emptied
 * mid-apply: these runs say whether the bound holds without the mid-step rules. */
static const sim_cfg_t variants[] = {
    VARIANT("lock-step", 4, 3, 3, 0, 120, false, false, false),
    VARIANT("s=1", 4, 3, 3, 1, 120, false, false, false),
    VARIANT("s=3", 4, 3, 3, 3, 120, false, false, false),
    VARIANT("async", 4, 3, 3, -1, 120, false, false, false),
    VARIANT("bad-pushes s=1", 3, 3, 4, 1, 100, false, false, true),
    VARIANT("churn s=0", 4, 3, 3, 0, 120, true, false, true),
    VARIANT("churn s=1", 4, 2, 3, 1, 120, true, false, true),
    VARIANT("churn s=3", 4, 3, 2, 3, 120, true, false, true),
    VARIANT("churn async", 4, 2, 3, -1, 120, true, false, true),
    VARIANT("churn single-member s=1", 4, 1, 3, 1, 120, true, false, true),
};
enum { N_VARIANTS = sizeof(variants) / sizeof(variants[0]) };

/* The same with members leaving and joining at any moment, seeking the moments the mid-step
 * rules are about: a newcomer joins with the next step, an emptied group counts the step done. */
static const sim_cfg_t mid_step_variants[] = {
    VARIANT("mid-step churn s=0", 4, 3, 3, 0, 120, true, true, true),
    VARIANT("mid-step churn s=3", 4, 3, 2, 3, 120, true, true, true),
    VARIANT("mid-step churn single-member s=1", 4, 1, 3, 1, 120, true, true, true),
};
enum { N_MID_STEP = sizeof(mid_step_variants) / sizeof(mid_step_variants[0]) };

/* Runs a variant and asserts that nothing was violated and that the run exercised what the
 * variant is about: a run that exercised nothing proves nothing. */
static void check_variant(const sim_cfg_t *cfg, uint64_t seed)
{
    static sim_t sim;
    sim_run(&sim, cfg, seed);
    char msg[4096];
    uint32_t bad = report(&sim, msg, sizeof(msg));
    ck_assert_msg(bad == 0, "%s", msg);
    uint64_t min_reads = cfg->churn ? cfg->target : (uint64_t)sim.n_workers * cfg->target;
    ck_assert_msg(sim.reads >= min_reads, "%s only %llu reads", msg, (unsigned long long)sim.reads);
    if (cfg->staleness >= 0)
        ck_assert_msg(sim.bound_waits > 0, "%s the bound never held anyone back", msg);
    else
        ck_assert_msg(sim.max_spread > 3, "%s groups never drifted apart (spread %llu)", msg,
                      (unsigned long long)sim.max_spread);
    /* Without churn no group can run more than s + 1 ahead. (With it, a group that was empty
     * keeps its clock when it comes back ahead of the others, and waits for them: allowed.) */
    if (cfg->staleness >= 0 && !cfg->churn)
        ck_assert_msg(sim.max_spread <= (uint64_t)cfg->staleness + 1,
                      "%s live clocks %llu apart under bound %lld", msg,
                      (unsigned long long)sim.max_spread, (long long)cfg->staleness);
    if (cfg->churn)
        ck_assert_msg(sim.leaves > 0 && sim.joins > 0 && sim.retires > 0 &&
                          sim.reads_after_rejoin > 0,
                      "%s churn did not happen (%llu leaves, %llu joins, %llu retires)", msg,
                      (unsigned long long)sim.leaves, (unsigned long long)sim.joins,
                      (unsigned long long)sim.retires);
    if (cfg->bad_pushes)
        ck_assert_msg(sim.refusals > 0, "%s no bad push was tried", msg);
    /* Churn at any moment must reach the two moments the membership rules are about: a worker
     * joining a half-applied step and then taking part, and a group emptied mid-apply that is
     * read again at the step it moved on to. Without it, none of that can happen. */
    if (cfg->mid_step_churn)
        ck_assert_msg(sim.late_reads > 0 && sim.reads_after_mid_apply > 0,
                      "%s the mid-step moments did not happen", msg);
    else
        ck_assert_msg(sim.late_joins == 0 && sim.mid_apply_retires == 0,
                      "%s churn happened mid-step in a variant that avoids it", msg);
}

/* _i runs over variants x seeds. */
START_TEST(test_property)
{
    check_variant(&variants[_i / N_SEEDS], seeds[_i % N_SEEDS]);
}
END_TEST

/* _i runs over mid_step_variants x seeds. */
START_TEST(test_property_mid_step_churn)
{
    check_variant(&mid_step_variants[_i / N_SEEDS], seeds[_i % N_SEEDS]);
}
END_TEST

/* _i runs over (variants, then mid_step_variants) x seeds, answering pulls shard by shard as
 * the daemon does: a shard of the next step is read as soon as the group's current step has it
 * applied, and every such read keeps the guarantees, for that shard, at that moment. */
START_TEST(test_property_early_reads)
{
    uint32_t v = (uint32_t)_i / N_SEEDS;
    sim_cfg_t cfg = v < N_VARIANTS ? variants[v] : mid_step_variants[v - N_VARIANTS];
    cfg.early_reads = true;
    static sim_t sim;
    sim_run(&sim, &cfg, seeds[_i % N_SEEDS]);
    char msg[4096];
    ck_assert_msg(report(&sim, msg, sizeof(msg)) == 0, "early reads: %s", msg);
    uint64_t min_reads = cfg.churn ? cfg.target : (uint64_t)sim.n_workers * cfg.target;
    ck_assert_msg(sim.reads >= min_reads, "%s only %llu reads", msg, (unsigned long long)sim.reads);
    /* A worker alone in its group pushes every shard before it waits for the next step, so its
     * step is done by then: early reads are for groups of several. */
    if (cfg.per_group > 1)
        ck_assert_msg(sim.early_reads > 0, "%s no shard was read early", msg);
}
END_TEST

/* The checker itself can fail: groups enforcing s=3 checked against s=1 must be caught. */
START_TEST(test_checker_catches_a_looser_bound)
{
    sim_cfg_t cfg = VARIANT("s=3 checked as s=1", 4, 2, 2, 3, 80, false, false, false);
    cfg.check_staleness = 1;
    static sim_t sim;
    sim_run(&sim, &cfg, seeds[_i]);
    ck_assert_msg(sim.v_count[V_BOUND] > 0, "seed %llu: a bound of 3 passed a check for 1",
                  (unsigned long long)seeds[_i]);
    ck_assert_uint_eq(sim.v_count[V_OWN], 0);
    ck_assert_uint_eq(sim.v_count[V_TWICE], 0);
}
END_TEST

/* The rejoin rule the property relies on, step by step: a group that was empty comes back at
 * the slowest live clock, and from then on the others wait for it within the bound. */
START_TEST(test_rejoin_at_slowest_clock)
{
    omv_groups_events_t ev = {0};
    omv_groups_t *g = omv_groups_new(3, 3, 1, 1, &ev);
    ck_assert_ptr_nonnull(g);
    for (uint32_t i = 0; i < 3; i++)
        ck_assert_int_eq(omv_groups_join(g, i, i), 0);
    omv_groups_leave(g, 2); /* group 2 empties at clock 0 */
    char why[OMV_WIRE_REASON_MAX];
    for (uint64_t step = 0; step < 6; step++) {
        for (uint32_t i = 0; i < 2; i++) {
            if (step == 5 && i == 1)
                continue; /* group 1 stays at 5, group 0 goes to 6 */
            ck_assert(omv_groups_may_begin(g, i, step));
            ck_assert_int_eq(omv_groups_check_push(g, i, step, 0, why), OMV_REFUSE_NONE);
            omv_groups_record_push(g, i, 0);
        }
    }
    ck_assert_uint_eq(omv_groups_clock(g, 0), 6);
    ck_assert_uint_eq(omv_groups_clock(g, 1), 5);
    ck_assert_uint_eq(omv_groups_clock(g, 2), 0);
    ck_assert_int_eq(omv_groups_join(g, 2, 2), 0);
    ck_assert_uint_eq(omv_groups_clock(g, 2), 5); /* the slowest live clock, not 0 nor 6 */
    ck_assert(omv_groups_may_begin(g, 2, 5));
    ck_assert(omv_groups_may_begin(g, 0, 6)); /* 6 - 1 - 1 = 4: done by everyone */
    ck_assert_int_eq(omv_groups_check_push(g, 0, 6, 0, why), OMV_REFUSE_NONE);
    omv_groups_record_push(g, 0, 0);
    ck_assert(!omv_groups_may_begin(g, 0, 7)); /* groups 1 and 2 have not finished 5 */
    ck_assert_int_eq(omv_groups_check_push(g, 2, 5, 0, why), OMV_REFUSE_NONE);
    omv_groups_record_push(g, 2, 0);
    ck_assert(!omv_groups_may_begin(g, 0, 7)); /* group 1 has not */
    ck_assert_int_eq(omv_groups_check_push(g, 1, 5, 0, why), OMV_REFUSE_NONE);
    omv_groups_record_push(g, 1, 0);
    ck_assert(omv_groups_may_begin(g, 0, 7));
    /* Group 0 alone runs on; group 2, empty again at 6, comes back at group 0's 9. */
    omv_groups_leave(g, 1);
    omv_groups_leave(g, 2);
    for (uint64_t step = 7; step < 9; step++) {
        ck_assert(omv_groups_may_begin(g, 0, step));
        ck_assert_int_eq(omv_groups_check_push(g, 0, step, 0, why), OMV_REFUSE_NONE);
        omv_groups_record_push(g, 0, 0);
    }
    ck_assert_int_eq(omv_groups_join(g, 2, 2), 0);
    ck_assert_uint_eq(omv_groups_clock(g, 2), 9);
    ck_assert(omv_groups_may_begin(g, 2, 9));
    omv_groups_destroy(&g);
}
END_TEST

/* ---- the mid-step membership rules, step by step ---- */

/* What the groups object fired: applies per [group][step][shard], advances and retires. Steps
 * come from the groups' own clock. rec_accepted counts the pushes accepted per
 * [group][step][shard]; rec_gathered is what it was when the shard was applied, so a push
 * accepted after its update shows as a difference. */
static omv_groups_t *rec_gs;
static uint32_t rec_applies[1][4][2], rec_advances, rec_retires;
static uint32_t rec_accepted[1][4][2], rec_gathered[1][4][2];

static void rec_on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    (void)ctx;
    uint64_t step = omv_groups_clock(rec_gs, group);
    ck_assert_uint_eq(group, 0);
    ck_assert_uint_lt(step, 4);
    rec_applies[group][step][shard]++;
    rec_gathered[group][step][shard] = rec_accepted[group][step][shard];
}

static void rec_on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    (void)ctx;
    (void)group;
    (void)clock;
    rec_advances++;
}

static void rec_on_retire(void *ctx, uint32_t group)
{
    (void)ctx;
    (void)group;
    rec_retires++;
}

/* One group of two shards, bound 0. */
static omv_groups_t *rec_make(uint32_t slots)
{
    omv_groups_events_t ev = {rec_on_apply, rec_on_advance, rec_on_retire, NULL};
    memset(rec_applies, 0, sizeof(rec_applies));
    memset(rec_accepted, 0, sizeof(rec_accepted));
    memset(rec_gathered, 0, sizeof(rec_gathered));
    rec_advances = rec_retires = 0;
    rec_gs = omv_groups_new(slots, 1, 2, 0, &ev);
    ck_assert_ptr_nonnull(rec_gs);
    return rec_gs;
}

/* Checks a push; records it when accepted. Returns the verdict. */
static omv_refuse_t rec_push(omv_groups_t *g, uint32_t slot, uint64_t step, uint32_t shard)
{
    char why[OMV_WIRE_REASON_MAX] = "";
    omv_refuse_t r = omv_groups_check_push(g, slot, step, shard, why);
    if (r == OMV_REFUSE_NONE) {
        ck_assert_uint_lt(step, 4);
        rec_accepted[omv_groups_of(g, slot)][step][shard]++; /* before it can fire apply */
        omv_groups_record_push(g, slot, shard);
    } else {
        ck_assert_msg(why[0] != '\0', "refused without a reason");
    }
    return r;
}

/* Found by the property (it was a bug): a group whose last member leaves after shard 0 of step 0
 * was applied, and not shard 1, counts step 0 done (clock 1, retire and no advance), so a worker
 * that joins it again begins step 1 and shard 0 of step 0 is never applied a second time. */
START_TEST(test_emptied_mid_apply_counts_the_step)
{
    omv_groups_t *g = rec_make(1);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0);
    ck_assert_int_eq(rec_push(g, 0, 0, 0), OMV_REFUSE_NONE); /* shard 0 of step 0 is applied */
    ck_assert_uint_eq(rec_applies[0][0][0], 1);
    ck_assert(!omv_groups_settled(g));
    omv_groups_leave(g, 0); /* before it pushed shard 1: the group retires */
    ck_assert_uint_eq(rec_retires, 1);
    ck_assert_uint_eq(rec_advances, 0);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    ck_assert_uint_eq(omv_groups_live(g, 0), 0);
    ck_assert(omv_groups_settled(g));
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0); /* nothing of step 1 applied: a member now */
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    ck_assert(!omv_groups_may_begin(g, 0, 0));
    ck_assert(omv_groups_may_begin(g, 0, 1));
    ck_assert_int_eq(rec_push(g, 0, 0, 0), OMV_REFUSE_STEP); /* step 0 is done */
    ck_assert_int_eq(rec_push(g, 0, 0, 1), OMV_REFUSE_STEP);
    ck_assert_int_eq(rec_push(g, 0, 1, 0), OMV_REFUSE_NONE);
    ck_assert_int_eq(rec_push(g, 0, 1, 1), OMV_REFUSE_NONE);
    uint64_t clock = omv_groups_clock(g, 0);
    omv_groups_destroy(&g); /* before the asserts, so that a failure leaks nothing */
    ck_assert_uint_eq(clock, 2);
    ck_assert_uint_eq(rec_advances, 1);
    ck_assert_msg(rec_applies[0][0][0] == 1, "shard 0 of step 0 applied %u times",
                  rec_applies[0][0][0]);
    ck_assert_uint_eq(rec_applies[0][0][1], 0); /* retired with the step: never applied */
    ck_assert_uint_eq(rec_applies[0][1][0], 1);
    ck_assert_uint_eq(rec_applies[0][1][1], 1);
}
END_TEST

/* The other half of the rule: a group emptied before any shard of its step was applied keeps its
 * clock, and the step starts afresh, with the gradients pushed before forgotten. */
START_TEST(test_emptied_before_apply_keeps_the_step)
{
    omv_groups_t *g = rec_make(2);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0);
    ck_assert_int_eq(omv_groups_join(g, 1, 0), 0);
    ck_assert_int_eq(rec_push(g, 0, 0, 0), OMV_REFUSE_NONE); /* waits for slot 1 */
    omv_groups_leave(g, 0);
    omv_groups_leave(g, 1);
    ck_assert_uint_eq(rec_retires, 1);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 0);
    ck_assert_int_eq(omv_groups_join(g, 1, 0), 0);
    ck_assert(omv_groups_may_begin(g, 0, 0));
    ck_assert_int_eq(rec_push(g, 1, 0, 1), OMV_REFUSE_NONE);
    /* Slot 0's push of shard 0 went with the retire: it does not stand in for slot 1's. */
    ck_assert_uint_eq(rec_applies[0][0][0], 0);
    ck_assert_uint_eq(rec_applies[0][0][1], 1);
    ck_assert_int_eq(rec_push(g, 1, 0, 0), OMV_REFUSE_NONE);
    uint64_t clock = omv_groups_clock(g, 0);
    omv_groups_destroy(&g);
    ck_assert_uint_eq(clock, 1);
    ck_assert_uint_eq(rec_advances, 1);
    ck_assert_uint_eq(rec_applies[0][0][0], 1);
    ck_assert_uint_eq(rec_applies[0][0][1], 1);
}
END_TEST

/* A newcomer waiting for the next step when the last member leaves mid-apply is a member of the
 * step the group moves on to, and alone completes it. */
START_TEST(test_emptied_mid_apply_keeps_its_newcomer)
{
    omv_groups_t *g = rec_make(2);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0);
    ck_assert_int_eq(rec_push(g, 0, 0, 0), OMV_REFUSE_NONE);
    ck_assert_int_eq(omv_groups_join(g, 1, 0), 1);
    omv_groups_leave(g, 0);
    ck_assert_uint_eq(rec_retires, 1);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    ck_assert_uint_eq(omv_groups_live(g, 0), 1);
    ck_assert_int_eq(omv_groups_of(g, 1), 0);
    ck_assert(omv_groups_may_begin(g, 0, 1));
    ck_assert_int_eq(rec_push(g, 1, 1, 0), OMV_REFUSE_NONE);
    ck_assert_int_eq(rec_push(g, 1, 1, 1), OMV_REFUSE_NONE);
    uint64_t clock = omv_groups_clock(g, 0);
    omv_groups_destroy(&g);
    ck_assert_uint_eq(clock, 2);
    ck_assert_uint_eq(rec_applies[0][0][0], 1);
    ck_assert_uint_eq(rec_applies[0][0][1], 0);
    ck_assert_uint_eq(rec_applies[0][1][0], 1);
    ck_assert_uint_eq(rec_applies[0][1][1], 1);
}
END_TEST

/* Found by the property (it was a bug): a worker that joins a live group after shard 0 of its
 * step was applied is no member of that step (join returns 1). Its pushes are refused as the
 * wrong step until the next step starts, so every accepted gradient goes into exactly one
 * update; it is not waited for, and from the next step on it takes part like everyone. A
 * newcomer that leaves before then is simply removed. */
START_TEST(test_join_mid_step_starts_with_the_next_step)
{
    omv_groups_t *g = rec_make(4);
    ck_assert_int_eq(omv_groups_join(g, 0, 0), 0);
    ck_assert_int_eq(omv_groups_join(g, 1, 0), 0);
    uint32_t accepted[2] = {0, 0};
    accepted[0] += rec_push(g, 0, 0, 0) == OMV_REFUSE_NONE;
    accepted[0] += rec_push(g, 1, 0, 0) == OMV_REFUSE_NONE; /* shard 0 of step 0 is applied */
    ck_assert_uint_eq(rec_applies[0][0][0], 1);
    ck_assert_int_eq(omv_groups_join(g, 2, 0), 1);
    ck_assert_int_eq(omv_groups_join(g, 3, 0), 1);
    ck_assert_uint_eq(omv_groups_clock(g, 0), 0); /* joining a live group leaves its clock */
    ck_assert_uint_eq(omv_groups_live(g, 0), 2);
    ck_assert_int_eq(omv_groups_of(g, 2), 0);
    ck_assert(!omv_groups_may_begin(g, 0, 1)); /* the newcomer's first step is not begun yet */
    /* Early pushes: for the applied shard, the shard still gathered, and the next step. */
    ck_assert_int_eq(rec_push(g, 2, 0, 0), OMV_REFUSE_STEP);
    ck_assert_int_eq(rec_push(g, 2, 0, 1), OMV_REFUSE_STEP);
    ck_assert_int_eq(rec_push(g, 2, 1, 1), OMV_REFUSE_STEP);
    omv_groups_leave(g, 3); /* a newcomer leaving changes nothing for the step */
    ck_assert_int_eq(omv_groups_of(g, 3), -1);
    ck_assert_uint_eq(omv_groups_live(g, 0), 2);
    ck_assert_uint_eq(rec_retires, 0);
    ck_assert_int_eq(rec_push(g, 3, 0, 1), OMV_REFUSE_UNKNOWN_WORKER);
    /* Step 0 completes with its two members; the newcomer is not waited for. */
    accepted[0] += rec_push(g, 0, 0, 1) == OMV_REFUSE_NONE;
    ck_assert_uint_eq(rec_applies[0][0][1], 0);
    accepted[0] += rec_push(g, 1, 0, 1) == OMV_REFUSE_NONE;
    ck_assert_uint_eq(omv_groups_clock(g, 0), 1);
    ck_assert_uint_eq(omv_groups_live(g, 0), 3);
    ck_assert(omv_groups_may_begin(g, 0, 1));
    /* Step 1 waits for the newcomer too. */
    for (uint32_t slot = 0; slot < 3; slot++)
        accepted[1] += rec_push(g, slot, 1, 0) == OMV_REFUSE_NONE;
    for (uint32_t slot = 0; slot < 2; slot++)
        accepted[1] += rec_push(g, slot, 1, 1) == OMV_REFUSE_NONE;
    ck_assert_uint_eq(rec_applies[0][1][1], 0);
    accepted[1] += rec_push(g, 2, 1, 1) == OMV_REFUSE_NONE;
    uint64_t clock = omv_groups_clock(g, 0);
    omv_groups_destroy(&g);
    ck_assert_uint_eq(clock, 2);
    ck_assert_uint_eq(rec_advances, 2);
    for (uint32_t step = 0; step < 2; step++) {
        uint32_t gathered = 0;
        for (uint32_t sh = 0; sh < 2; sh++) {
            ck_assert_uint_eq(rec_applies[0][step][sh], 1);
            gathered += rec_gathered[0][step][sh];
        }
        ck_assert_msg(accepted[step] == gathered,
                      "%u gradients of step %u accepted, %u before their shard was applied",
                      accepted[step], step, gathered);
    }
    ck_assert_uint_eq(accepted[0], 4);
    ck_assert_uint_eq(accepted[1], 6);
    ck_assert_uint_eq(rec_gathered[0][1][0], 3); /* the newcomer's gradient is in step 1 */
}
END_TEST

static Suite *ssp_suite(void)
{
    Suite *s = suite_create("ssp");
    TCase *tc = tcase_create("property");
    tcase_add_loop_test(tc, test_property, 0, N_VARIANTS * N_SEEDS);
    tcase_add_loop_test(tc, test_checker_catches_a_looser_bound, 0, N_SEEDS);
    tcase_add_test(tc, test_rejoin_at_slowest_clock);
    suite_add_tcase(s, tc);
    tc = tcase_create("membership_mid_step");
    tcase_add_test(tc, test_emptied_mid_apply_counts_the_step);
    tcase_add_test(tc, test_emptied_before_apply_keeps_the_step);
    tcase_add_test(tc, test_emptied_mid_apply_keeps_its_newcomer);
    tcase_add_test(tc, test_join_mid_step_starts_with_the_next_step);
    tcase_add_loop_test(tc, test_property_mid_step_churn, 0, N_MID_STEP * N_SEEDS);
    tcase_add_loop_test(tc, test_property_early_reads, 0, (N_VARIANTS + N_MID_STEP) * N_SEEDS);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(ssp_suite());
}
