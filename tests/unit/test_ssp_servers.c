/* Stale synchronous parallel over several shard servers, as a property: each server keeps the
 * groups' clocks for its own range (a groups object of its own, as a shard server's run does);
 * workers pull from and push to each server on its own, in a random order and at skewed
 * speeds; the coordinator's word of a death reaches each server at a moment of its own, and a
 * worker comes back only at a cut (every server between steps, at the same clocks). Checked at
 * every read from a server: nothing of its range older than the bound allows is missing; after
 * every event: a group's clocks on two servers are never more than one step apart; at the end:
 * every (group, step, range) update was applied exactly once, on its server. A failure names
 * the variant, the seed and the event. */
#include <check.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "groups.h"
#include "rng.h"
#include "testutil.h"

enum {
    MAX_SERVERS = 4,
    SHARDS_PER = 2, /* each server's range */
    MAX_SHARDS = MAX_SERVERS * SHARDS_PER,
    MAX_WORKERS = 12,
    MAX_GROUPS = 4,
    MAX_STEPS = 80,
    MAX_EVENTS = 400000,
    MAX_DELAY = 3000, /* events before a death reaches a server, at most */
};

typedef enum { W_OFF, W_READ, W_PUSH } wstate_t;

typedef struct {
    wstate_t state;
    uint32_t group;
    uint64_t step;
    uint32_t read_mask;            /* W_READ: servers that served it step's range */
    uint32_t order[MAX_SHARDS];    /* W_PUSH: the shards in the order it pushes them */
    uint32_t next;                 /* W_PUSH: how many it pushed */
    uint32_t weight;               /* 1: ten times slower than 10 */
    int64_t leave_at[MAX_SERVERS]; /* dead: the event its death reaches server k (-1: it has) */
    bool dead;
} sim_worker_t;

typedef struct {
    const char *name;
    uint32_t servers, groups, per_group;
    int64_t staleness;       /* what the servers' groups objects enforce */
    int64_t check_staleness; /* what the reads are checked against (normally the same) */
    uint64_t target;
    bool deaths;
} sim_cfg_t;

struct sim;
typedef struct {
    struct sim *sim;
    uint32_t k;
} server_ctx_t;

typedef struct sim {
    sim_cfg_t cfg;
    uint64_t seed, event;
    omv_rng_t rng;
    omv_groups_t *gs[MAX_SERVERS];
    server_ctx_t ctx[MAX_SERVERS];
    sim_worker_t w[MAX_WORKERS];
    uint32_t n_workers;
    uint8_t applied[MAX_GROUPS][MAX_STEPS + 1][MAX_SHARDS];
    uint32_t violations;
    char first[512];
    /* What the run exercised. */
    uint64_t reads, pushes, deaths, rejoins, bound_waits, skewed, max_spread;
} sim_t;

__attribute__((format(printf, 2, 3))) static void violation(sim_t *sim, const char *fmt, ...)
{
    if (sim->violations++ > 0)
        return;
    int n =
        snprintf(sim->first, sizeof(sim->first), "variant %s seed %llu event %llu: ", sim->cfg.name,
                 (unsigned long long)sim->seed, (unsigned long long)sim->event);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim->first + n, sizeof(sim->first) - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Server k applies a shard of its range: the group's step there is its clock. */
static void on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    server_ctx_t *c = ctx;
    sim_t *sim = c->sim;
    uint64_t step = omv_groups_clock(sim->gs[c->k], group);
    uint32_t global = c->k * SHARDS_PER + shard;
    if (step > MAX_STEPS) {
        violation(sim, "server %u applied g%u step %llu, past the target", c->k, group,
                  (unsigned long long)step);
        return;
    }
    if (++sim->applied[group][step][global] > 1)
        violation(sim, "server %u applied (g%u, step %llu, shard %u) twice", c->k, group,
                  (unsigned long long)step, global);
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    (void)ctx;
    (void)group;
    (void)clock;
}

static void on_retire(void *ctx, uint32_t group)
{
    server_ctx_t *c = ctx;
    violation(c->sim, "server %u retired g%u: the run never empties a group", c->k, group);
}

static uint32_t live_in(const sim_t *sim, uint32_t g)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < sim->n_workers; i++)
        n += sim->w[i].state != W_OFF && sim->w[i].group == g;
    return n;
}

/* A read of step from server k by a member of g: every update of k's range that the bound
 * promises is there. */
static void check_read(sim_t *sim, uint32_t k, uint32_t g, uint64_t step)
{
    for (uint32_t h = 0; h < sim->cfg.groups; h++) {
        int64_t bound = sim->cfg.check_staleness;
        uint64_t below = h == g                   ? step
                         : bound < 0              ? 0
                         : step > (uint64_t)bound ? step - (uint64_t)bound
                                                  : 0;
        if (h != g && omv_groups_live(sim->gs[k], h) == 0)
            continue;
        for (uint64_t t = 0; t < below; t++)
            for (uint32_t s = 0; s < SHARDS_PER; s++)
                if (sim->applied[h][t][k * SHARDS_PER + s] != 1)
                    violation(sim,
                              "g%u read step %llu from server %u without (g%u, step %llu, "
                              "shard %u) applied (%u times)",
                              g, (unsigned long long)step, k, h, (unsigned long long)t,
                              k * SHARDS_PER + s, sim->applied[h][t][k * SHARDS_PER + s]);
    }
}

/* Worker i reads its step's range from one server that may serve it; once it has every range
 * it pushes, shard by shard, in an order of its own. Returns whether it could act. */
static bool do_read(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    uint32_t ready[MAX_SERVERS], n = 0;
    for (uint32_t k = 0; k < sim->cfg.servers; k++)
        if (!(w->read_mask >> k & 1u) && omv_groups_may_begin(sim->gs[k], w->group, w->step))
            ready[n++] = k;
    if (n == 0)
        return false;
    uint32_t k = ready[omv_rng_below(&sim->rng, n)];
    check_read(sim, k, w->group, w->step);
    w->read_mask |= 1u << k;
    sim->reads++;
    if (w->read_mask != (1u << sim->cfg.servers) - 1)
        return true;
    w->state = W_PUSH;
    w->next = 0;
    for (uint32_t s = 0; s < sim->cfg.servers * SHARDS_PER; s++)
        w->order[s] = s;
    omv_rng_shuffle(&sim->rng, w->order, sim->cfg.servers * SHARDS_PER);
    return true;
}

static void do_push(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    uint32_t shard = w->order[w->next++], k = shard / SHARDS_PER;
    char why[OMV_WIRE_REASON_MAX];
    omv_refuse_t r = omv_groups_check_push(sim->gs[k], i, w->step, shard % SHARDS_PER, why);
    if (r != OMV_REFUSE_NONE) {
        violation(sim, "server %u refused w%u's push of step %llu shard %u: %s", k, i,
                  (unsigned long long)w->step, shard, why);
        return;
    }
    omv_groups_record_push(sim->gs[k], i, shard % SHARDS_PER);
    sim->pushes++;
    if (w->next < sim->cfg.servers * SHARDS_PER)
        return;
    w->state = W_READ;
    w->step++;
    w->read_mask = 0;
    if (w->step == sim->cfg.target)
        w->state = W_OFF; /* done: it stays in its group (the servers keep it) */
}

/* Worker i dies (a member of a group with others left): each server hears of it later. */
static void do_death(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    w->state = W_OFF;
    w->dead = true;
    for (uint32_t k = 0; k < sim->cfg.servers; k++)
        w->leave_at[k] = (int64_t)(sim->event + 1 + omv_rng_below(&sim->rng, MAX_DELAY));
    sim->deaths++;
}

static void deliver_deaths(sim_t *sim)
{
    for (uint32_t i = 0; i < sim->n_workers; i++)
        for (uint32_t k = 0; sim->w[i].dead && k < sim->cfg.servers; k++)
            if (sim->w[i].leave_at[k] >= 0 && (uint64_t)sim->w[i].leave_at[k] <= sim->event) {
                omv_groups_leave(sim->gs[k], i);
                sim->w[i].leave_at[k] = -1;
            }
}

/* A dead worker whose death every server heard of joins its group again at a cut: every server
 * between steps, each group at the same clock everywhere (the coordinator's freeze and cut). */
static void maybe_rejoin(sim_t *sim, uint32_t i)
{
    sim_worker_t *w = &sim->w[i];
    for (uint32_t k = 0; k < sim->cfg.servers; k++)
        if (w->leave_at[k] >= 0 || !omv_groups_idle(sim->gs[k]))
            return;
    uint64_t clock = omv_groups_clock(sim->gs[0], w->group);
    for (uint32_t k = 1; k < sim->cfg.servers; k++)
        for (uint32_t g = 0; g < sim->cfg.groups; g++)
            if (omv_groups_clock(sim->gs[k], g) != omv_groups_clock(sim->gs[0], g))
                return;
    if (clock >= sim->cfg.target)
        return;
    for (uint32_t k = 0; k < sim->cfg.servers; k++) {
        int rc = omv_groups_join(sim->gs[k], i, w->group);
        if (rc != 0)
            violation(sim, "server %u: w%u's join at a cut returned %d", k, i, rc);
    }
    w->dead = false;
    w->state = W_READ;
    w->step = clock;
    w->read_mask = 0;
    sim->rejoins++;
}

/* A group's clocks on the servers: never more than one apart (no member pushes step t + 1
 * anywhere before every server has finished t). */
static void check_clocks(sim_t *sim)
{
    for (uint32_t g = 0; g < sim->cfg.groups; g++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t k = 0; k < sim->cfg.servers; k++) {
            uint64_t c = omv_groups_clock(sim->gs[k], g);
            lo = c < lo ? c : lo;
            hi = c > hi ? c : hi;
        }
        if (hi - lo > 1)
            violation(sim, "g%u is at steps %llu to %llu on the servers", g, (unsigned long long)lo,
                      (unsigned long long)hi);
        sim->skewed += hi != lo;
    }
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t g = 0; g < sim->cfg.groups; g++) {
        uint64_t c = omv_groups_clock(sim->gs[0], g);
        lo = c < lo ? c : lo;
        hi = c > hi ? c : hi;
    }
    sim->max_spread = hi - lo > sim->max_spread ? hi - lo : sim->max_spread;
}

/* One weighted-random step of a worker that may act; false when none may. */
static bool act(sim_t *sim)
{
    uint32_t acting[MAX_WORKERS], n = 0, total = 0;
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *w = &sim->w[i];
        bool can = w->state == W_PUSH;
        for (uint32_t k = 0; !can && w->state == W_READ && k < sim->cfg.servers; k++)
            can = !(w->read_mask >> k & 1u) && omv_groups_may_begin(sim->gs[k], w->group, w->step);
        if (can) {
            acting[n++] = i;
            total += w->weight;
        } else if (w->state == W_READ) {
            sim->bound_waits += omv_groups_clock(sim->gs[0], w->group) >= w->step;
        }
    }
    if (n == 0)
        return false;
    uint32_t pick = omv_rng_below(&sim->rng, total), j = 0;
    while (pick >= sim->w[acting[j]].weight)
        pick -= sim->w[acting[j++]].weight;
    uint32_t i = acting[j];
    if (sim->w[i].state == W_READ)
        do_read(sim, i);
    else
        do_push(sim, i);
    return true;
}

static bool any_pending(const sim_t *sim)
{
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        const sim_worker_t *w = &sim->w[i];
        if (w->state != W_OFF)
            return true;
        for (uint32_t k = 0; w->dead && k < sim->cfg.servers; k++)
            if (w->leave_at[k] >= 0)
                return true; /* a death still to reach a server */
    }
    return false;
}

static void sim_run(sim_t *sim, const sim_cfg_t *cfg, uint64_t seed)
{
    memset(sim, 0, sizeof(*sim));
    sim->cfg = *cfg;
    sim->seed = seed;
    sim->n_workers = cfg->groups * cfg->per_group;
    ck_assert(sim->n_workers <= MAX_WORKERS && cfg->servers <= MAX_SERVERS &&
              cfg->groups <= MAX_GROUPS && cfg->target <= MAX_STEPS);
    omv_rng_init(&sim->rng, seed);
    for (uint32_t k = 0; k < cfg->servers; k++) {
        sim->ctx[k] = (server_ctx_t){sim, k};
        omv_groups_events_t ev = {on_apply, on_advance, on_retire, &sim->ctx[k]};
        sim->gs[k] = omv_groups_new(sim->n_workers, cfg->groups, SHARDS_PER, cfg->staleness, &ev);
        ck_assert_ptr_nonnull(sim->gs[k]);
    }
    /* Skewed speeds: one group ten times slower, and a third of the other workers too. */
    uint32_t slow = omv_rng_below(&sim->rng, cfg->groups);
    for (uint32_t i = 0; i < sim->n_workers; i++) {
        sim_worker_t *w = &sim->w[i];
        w->group = i % cfg->groups;
        w->weight = w->group == slow || omv_rng_below(&sim->rng, 3) == 0 ? 1 : 10;
        w->state = W_READ;
        for (uint32_t k = 0; k < cfg->servers; k++)
            ck_assert_int_eq(omv_groups_join(sim->gs[k], i, w->group), 0);
    }
    for (sim->event = 0; sim->event < MAX_EVENTS && sim->violations == 0; sim->event++) {
        deliver_deaths(sim);
        uint32_t i = omv_rng_below(&sim->rng, sim->n_workers);
        sim_worker_t *w = &sim->w[i];
        if (cfg->deaths && !w->dead && w->state != W_OFF && live_in(sim, w->group) > 1 &&
            omv_rng_below(&sim->rng, 400) == 0)
            do_death(sim, i);
        else if (w->dead && omv_rng_below(&sim->rng, 8) == 0)
            maybe_rejoin(sim, i);
        else if (!act(sim) && !any_pending(sim))
            break;
        check_clocks(sim);
    }
    if (sim->event == MAX_EVENTS)
        violation(sim, "no end after %d events", MAX_EVENTS);
    /* Every update of every step, once, on its server (no group ever empties). */
    for (uint32_t g = 0; g < cfg->groups; g++) {
        for (uint32_t k = 0; k < cfg->servers; k++)
            if (omv_groups_clock(sim->gs[k], g) != cfg->target)
                violation(sim, "g%u ended at step %llu of %llu on server %u", g,
                          (unsigned long long)omv_groups_clock(sim->gs[k], g),
                          (unsigned long long)cfg->target, k);
        for (uint64_t t = 0; t < cfg->target; t++)
            for (uint32_t s = 0; s < cfg->servers * SHARDS_PER; s++)
                if (sim->applied[g][t][s] != 1)
                    violation(sim, "(g%u, step %llu, shard %u) applied %u times", g,
                              (unsigned long long)t, s, sim->applied[g][t][s]);
    }
    for (uint32_t k = 0; k < cfg->servers; k++)
        omv_groups_destroy(&sim->gs[k]);
}

static const uint64_t seeds[] = {1, 2, 3, 0x5eed, 20261202};
enum { N_SEEDS = sizeof(seeds) / sizeof(seeds[0]) };

#define VARIANT(name_, servers_, g_, k_, s_, target_, deaths_)                                     \
    {                                                                                              \
        .name = name_, .servers = servers_, .groups = g_, .per_group = k_, .staleness = s_,        \
        .check_staleness = s_, .target = target_, .deaths = deaths_                                \
    }

/* Servers, groups x workers per group, bound, target, deaths. */
static const sim_cfg_t variants[] = {
    VARIANT("2 servers lock-step", 2, 3, 3, 0, 60, false),
    VARIANT("3 servers s=1", 3, 3, 3, 1, 60, false),
    VARIANT("4 servers s=3", 4, 4, 2, 3, 60, false),
    VARIANT("3 servers async", 3, 3, 3, -1, 60, false),
    VARIANT("3 servers s=0 deaths", 3, 3, 3, 0, 60, true),
    VARIANT("2 servers s=1 deaths", 2, 4, 3, 1, 60, true),
    VARIANT("4 servers async deaths", 4, 3, 3, -1, 60, true),
};
enum { N_VARIANTS = sizeof(variants) / sizeof(variants[0]) };

/* _i runs over variants x seeds. */
START_TEST(test_property_over_servers)
{
    const sim_cfg_t *cfg = &variants[_i / N_SEEDS];
    static sim_t sim;
    sim_run(&sim, cfg, seeds[_i % N_SEEDS]);
    ck_assert_msg(sim.violations == 0, "%u violations; the first: %s", sim.violations, sim.first);
    char what[256];
    snprintf(what, sizeof(what),
             "variant %s seed %llu: %llu reads, %llu pushes, %llu deaths, %llu rejoins, %llu "
             "bound waits, %llu skewed moments, spread %llu",
             cfg->name, (unsigned long long)seeds[_i % N_SEEDS], (unsigned long long)sim.reads,
             (unsigned long long)sim.pushes, (unsigned long long)sim.deaths,
             (unsigned long long)sim.rejoins, (unsigned long long)sim.bound_waits,
             (unsigned long long)sim.skewed, (unsigned long long)sim.max_spread);
    /* A run that exercised nothing proves nothing: the servers' clocks did drift apart, the
     * bound held workers back (or, without one, the groups drifted), deaths happened. */
    /* Every member read every step from every server; with deaths, at least one per group. */
    uint64_t reads = (uint64_t)cfg->target * cfg->servers;
    if (cfg->deaths)
        ck_assert_msg(sim.reads >= reads * cfg->groups, "%s", what);
    else
        ck_assert_msg(sim.reads == reads * sim.n_workers, "%s", what);
    ck_assert_msg(sim.skewed > 0, "%s: the servers never disagreed", what);
    if (cfg->staleness >= 0)
        ck_assert_msg(sim.bound_waits > 0, "%s: the bound held nobody back", what);
    else
        ck_assert_msg(sim.max_spread > 3, "%s: the groups never drifted apart", what);
    if (cfg->staleness >= 0 && !cfg->deaths)
        ck_assert_msg(sim.max_spread <= (uint64_t)cfg->staleness + 1, "%s: over the bound", what);
    if (cfg->deaths)
        ck_assert_msg(sim.deaths > 0 && sim.rejoins > 0, "%s", what);
}
END_TEST

/* The checker can fail: servers whose groups objects allow s = 3 while the reads are checked
 * against s = 1 are caught. */
START_TEST(test_checker_catches_a_looser_bound)
{
    static sim_t sim;
    sim_cfg_t cfg = VARIANT("s=3 checked as s=1", 3, 3, 3, 3, 60, false);
    cfg.check_staleness = 1;
    sim_run(&sim, &cfg, 7);
    ck_assert_msg(sim.violations > 0 && strstr(sim.first, "without"),
                  "a looser bound went unseen (%u violations)", sim.violations);
}
END_TEST

static Suite *ssp_servers_suite(void)
{
    Suite *s = suite_create("ssp_servers");
    TCase *tc = tcase_create("property");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_property_over_servers, 0, N_VARIANTS * N_SEEDS);
    tcase_add_test(tc, test_checker_catches_a_looser_bound);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return omv_test_run(ssp_servers_suite());
}
