/* Pushes: a gradient checked against the job, the groups and the shard's range, counted, and
 * handed to its shard's executor; and the groups' events as their steps are applied. */
#define OMV_LOG_TAG "daemon"
#include <math.h>
#include <stdio.h>

#include "log.h"
#include "run_priv.h"
#include "util.h"

/* A gradient of a shard the member read in place: the parameters must not have changed while
 * it computed from them. With one group nothing changes a shard before its members pushed it;
 * were that ever broken (a restore, an update of another group), the gradient was computed from
 * a mix of two versions and is refused. Returns 1 when it may go on, else 0 with why. */
static int read_in_place_held(omv_run_t *r, omv_member_t *m, uint32_t s, char *why)
{
    uint64_t bit = 1ull << (s % 64);
    if (!(m->inplace_sent[s / 64] & bit))
        return 1;
    m->inplace_sent[s / 64] &= ~bit;
    uint32_t writes = r->shards->writes[s] - m->inplace_writes[s];
    if (writes == 0)
        return 1;
    r->stats.inplace_raced_total++;
    snprintf(why, OMV_WIRE_REASON_MAX,
             "shard %u's parameters changed %u times while it computed from them in shared "
             "memory",
             s, writes);
    return 0;
}

/* Checks a push against the job's state, the groups and the shard's range. Returns 1 when it
 * fits; else it was refused (or dropped as late) and 0. */
static int push_fits(omv_run_t *r, omv_member_t *m, const omv_push_t *p, const char *who)
{
    char why[OMV_WIRE_REASON_MAX];
    if (m->role != OMV_ROLE_TRAINER) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_ROLE, who,
                         "an evaluator does not push");
        return 0;
    }
    if (r->state == OMV_JOB_FINISHING || r->state == OMV_JOB_DONE) {
        /* Steps that were under way when the job reached its end: not an error, not applied. */
        r->stats.late_total++;
        return 0;
    }
    if (r->state != OMV_JOB_RUNNING) {
        snprintf(why, sizeof(why), "gradient while the job is %s", omv_run_state_names[r->state]);
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, who, why);
        return 0;
    }
    if (omv_run_remote(r) || p->shard < r->lo || p->shard >= r->hi) {
        snprintf(why, sizeof(why), "shard %u is not on this %s (it holds shards [%u, %u))",
                 p->shard, omv_run_is_server(r) ? "shard server" : "daemon", r->lo,
                 omv_run_remote(r) ? 0 : r->hi);
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return 0;
    }
    int g = omv_groups_of(r->groups, m->slot);
    if (r->freeze.drop_late && g >= 0 && p->step >= r->freeze.at[g]) {
        r->stats.late_total++; /* past a failover's cut: the coordinator leaves it out too */
        return 0;
    }
    omv_refuse_t code = omv_groups_check_push(r->groups, m->slot, p->step, p->shard - r->lo, why);
    if (code != OMV_REFUSE_NONE) {
        omv_refusals_add(r->env.refusals, &m->peer, code, who, why);
        return 0;
    }
    if (p->wire == OMV_WIRE_SHM && !m->shm_on) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_MALFORMED, who,
                         "a gradient in shared memory from a worker that has no segment");
        return 0;
    }
    if (!read_in_place_held(r, m, p->shard, why)) {
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_STEP, who, why);
        return 0;
    }
    const omv_shard_t *sh = &r->shards->shards[p->shard];
    if (p->offset != sh->offset || p->count != sh->count) {
        snprintf(why, sizeof(why), "shard %u holds [%u, +%u) but the gradient is [%u, +%u)",
                 p->shard, sh->offset, sh->count, p->offset, p->count);
        omv_refusals_add(r->env.refusals, &m->peer, OMV_REFUSE_SHAPE, who, why);
        return 0;
    }
    return 1;
}

/* The step's figures come with shard 0's push: the worker's, its group's and the job's. */
void omv_run_count_step(omv_run_t *r, omv_member_t *m, uint32_t group, const omv_push_t *p)
{
    m->steps++;
    m->last_compute_ms = p->compute_ms;
    /* Its speed, measured only on batches of at least half the even share: a step's fixed
     * costs make a small batch look slow per image, and a member given few images for being
     * slow would look slower still, down to one image. */
    uint32_t live = omv_groups_live(r->groups, group);
    uint64_t even = (uint64_t)r->job.batch_size / (live ? live : 1);
    if (p->samples > 0 && 2 * (uint64_t)p->samples >= even && p->compute_ms > 0 &&
        isfinite(p->compute_ms)) {
        double x = (double)p->compute_ms / p->samples;
        m->ms_per_image = m->ms_per_image > 0 ? 0.8 * m->ms_per_image + 0.2 * x : x;
    }
    if (!isfinite(p->loss))
        return;
    m->images += p->samples;
    r->sums.images[group] += p->samples;
    r->sums.loss_sum[group] += p->loss;
    r->sums.loss_n[group]++;
    r->line.loss_sum += p->loss;
    r->line.loss_n++;
    r->line.last_loss = p->loss;
    omv_timeline_loss(&r->timeline, p->loss);
}

void omv_run_push(omv_run_t *r, omv_member_t *m, const omv_push_t *p)
{
    if (r->role && r->role->push && r->role->push(r, m, p))
        return; /* a backup's, for a step it has not applied yet */
    omv_run_push_with(r, m, p, NULL);
}

void omv_run_push_with(omv_run_t *r, omv_member_t *m, const omv_push_t *p, omv_payload_t *held)
{
    char who[96];
    snprintf(who, sizeof(who), "worker %u \"%s\"", omv_members_id(r->env.members, m), m->host);
    if (!push_fits(r, m, p, who)) {
        if (held)
            omv_payload_close(held);
        return;
    }
    uint32_t group = (uint32_t)omv_groups_of(r->groups, m->slot);
    m->last_push_ms = omv_time_ms();
    /* A backup serves nothing: the step's batch and weight are fixed by its first push, as
     * its primary fixed them when it sent the step (the same members, the same split). */
    if (r->backup && (!m->served || m->served_step != p->step)) {
        omv_run_begin_serve(r, m, group, p->step);
        if (p->samples > 0 && p->samples <= r->job.batch_size && p->samples != m->batch) {
            m->batch = p->samples; /* what the worker computed, as its primary asked */
            m->weight = omv_run_push_weight(r, m, group);
        }
    }
    r->stats.bytes_in_total += omv_wire_value_bytes(p->wire, p->count);
    /* The shard's executor checks the values and adds them; a gradient with NaN or Inf comes
     * back as a refusal and stays out of the sum. The step goes on either way. */
    omv_payload_t payload, *pl = &payload;
    if (p->wire == OMV_WIRE_SHM)
        pl = NULL; /* the values are in its segment */
    else if (held)
        pl = held;
    else
        omv_router_take_payload(r->env.router, &payload);
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_PUSH,
                           .group = group,
                           .step = p->step,
                           .worker_id = omv_members_id(r->env.members, m),
                           .sgd = omv_run_current_rule(r),
                           .solo = omv_groups_live(r->groups, group) == 1,
                           .wire = p->wire,
                           .weight = m->weight,
                           .shm_src = p->wire == OMV_WIRE_SHM ? m->shm_grads : NULL,
                           .norm_bound = (float)r->job.gradient_norm_bound,
                           .norm_warmup = (uint32_t)r->job.gradient_norm_warmup};
    omv_shardset_send(r->shards, p->shard, &cmd, &m->peer, pl);
    /* A shard server counts the step with its first shard (the worker sends it last to it). */
    if (p->shard == r->lo)
        omv_run_count_step(r, m, group, p);
    r->stats.pushes_recorded_total++;
    omv_groups_record_push(r->groups, m->slot, p->shard - r->lo);
}

/* shard counts from the run's first (the groups know only the shards the run holds). */
static void on_apply(void *ctx, uint32_t group, uint32_t shard)
{
    omv_run_t *r = ctx;
    if (omv_run_remote(r))
        return; /* its groups count reports: the servers apply */
    omv_shard_cmd_t cmd = {
        .type = OMV_SHARD_CMD_APPLY, .group = group, .sgd = omv_run_current_rule(r)};
    omv_shardset_send(r->shards, r->lo + shard, &cmd, NULL, NULL);
    omv_run_serve_early(r, group, r->lo + shard);
}

static void on_advance(void *ctx, uint32_t group, uint64_t clock)
{
    omv_run_t *r = ctx;
    (void)clock; /* the optimizer reads it from the groups, as every other reader does */
    uint64_t images = r->sums.images[group];
    double loss = r->sums.loss_n[group] ? r->sums.loss_sum[group] / r->sums.loss_n[group] : NAN;
    /* A probe's steps are thrown away when the optimizer restores its snapshot: they do not
     * count as training. */
    if (omv_tuner_probing(r->tuner))
        omv_tuner_count_probe_images(r->tuner, images);
    else if (!r->probing)
        r->stats.images_total += images;
    r->sums.images[group] = 0;
    r->sums.loss_sum[group] = 0;
    r->sums.loss_n[group] = 0;
    r->stats.steps_total++;
    if (omv_tuner_active(r->tuner)) {
        omv_tuner_observe(r->tuner, group, omv_groups_clock(r->groups, group), loss, images,
                          omv_time_s());
        omv_run_tuner_poll(r);
    }
}

static void on_retire(void *ctx, uint32_t group)
{
    omv_run_t *r = ctx;
    omv_shard_cmd_t cmd = {.type = OMV_SHARD_CMD_DISCARD, .group = group};
    omv_shardset_send_all(r->shards, &cmd, NULL);
    r->sums.images[group] = 0;
    omv_log_warn("group %u has no live workers left", group);
}

omv_groups_events_t omv_run_group_events(omv_run_t *r)
{
    return (omv_groups_events_t){on_apply, on_advance, on_retire, r};
}
