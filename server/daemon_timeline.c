/* The job's training timeline, for `history` and `omnivorectl report`: a point about once a
 * second of training (loss, throughput, configuration), halved in resolution when it grows long,
 * and the exact moments the groups, momentum or learning rate changed. */
#define OMV_LOG_TAG "daemon"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_priv.h"
#include "kv.h"
#include "log.h"
#include "util.h"

void omv_daemon_timeline_reset(omv_daemon_t *d)
{
    timeline_t *tl = &d->timeline;
    free(tl->points);
    free(tl->changes);
    memset(tl, 0, sizeof(*tl));
}

/* Images trained on so far, probes included: what throughput counts. */
static uint64_t images_seen(const omv_daemon_t *d)
{
    return d->images_total + d->probe_images_total;
}

static void out_of_memory(timeline_t *tl, const char *what)
{
    if (!tl->failed)
        omv_log_warn("out of memory for the training timeline; %s are dropped from now on", what);
    tl->failed = 1;
}

/* Grows *array (of size elements) to hold one more, doubling up to max. Returns 0 or -1. */
static int reserve(void **array, size_t *cap, size_t n, size_t size, size_t max)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : 64;
    if (want > max)
        want = max;
    if (want <= n)
        return -1;
    void *p = realloc(*array, want * size);
    if (p == NULL)
        return -1;
    *array = p;
    *cap = want;
    return 0;
}

/* Halves the resolution: each pair of neighbours becomes one point covering both, so the
 * timeline stays bounded however long the job runs. */
static void thin(timeline_t *tl)
{
    size_t n = 0;
    for (size_t i = 0; i + 1 < tl->n_points; i += 2) {
        const timeline_point_t *a = &tl->points[i];
        timeline_point_t m = tl->points[i + 1];
        double span = a->span_s + m.span_s;
        m.images_per_s = span > 0 ? (a->images_per_s * a->span_s + m.images_per_s * m.span_s) / span
                                  : m.images_per_s;
        m.span_s = span;
        m.loss_sum += a->loss_sum;
        m.loss_n += a->loss_n;
        m.probing |= a->probing;
        tl->points[n++] = m;
    }
    if (tl->n_points % 2)
        tl->points[n++] = tl->points[tl->n_points - 1];
    tl->n_points = n;
    tl->interval_s *= 2;
}

static void add_point(omv_daemon_t *d)
{
    timeline_t *tl = &d->timeline;
    if (reserve((void **)&tl->points, &tl->cap_points, tl->n_points, sizeof(*tl->points),
                OMV_TIMELINE_MAX_POINTS) < 0) {
        out_of_memory(tl, "training points");
        return;
    }
    double t = omv_daemon_train_seconds(d);
    uint64_t seen = images_seen(d);
    double span = t - tl->last_s;
    timeline_point_t *p = &tl->points[tl->n_points++];
    *p = (timeline_point_t){
        .wall_s = t,
        .span_s = span,
        .epoch = omv_daemon_epoch(d),
        .steps_total = d->steps_total,
        .images_total = d->images_total,
        .loss_sum = tl->loss_sum,
        .loss_n = tl->loss_n,
        .images_per_s = span > 0 ? (double)(seen - tl->last_images) / span : 0.0,
        .groups = omv_groups_count(d->groups),
        .momentum = d->sgd.momentum,
        .learning_rate = d->sgd.learning_rate,
        .probing = tl->probed || omv_daemon_opt_probing(d),
    };
    tl->last_s = t;
    tl->last_images = seen;
    tl->loss_sum = 0;
    tl->loss_n = 0;
    tl->probed = 0;
    if (tl->n_points >= OMV_TIMELINE_MAX_POINTS)
        thin(tl);
}

void omv_daemon_timeline_start(omv_daemon_t *d)
{
    timeline_t *tl = &d->timeline;
    tl->interval_s = OMV_TIMELINE_INTERVAL_S;
    tl->last_s = omv_daemon_train_seconds(d);
    tl->last_images = images_seen(d);
    omv_daemon_timeline_config(d, "start");
}

void omv_daemon_timeline_loss(omv_daemon_t *d, double loss)
{
    d->timeline.loss_sum += loss;
    d->timeline.loss_n++;
}

void omv_daemon_timeline_tick(omv_daemon_t *d)
{
    timeline_t *tl = &d->timeline;
    if (d->state != JOB_RUNNING || tl->interval_s <= 0)
        return;
    tl->probed |= omv_daemon_opt_probing(d);
    if (omv_daemon_train_seconds(d) - tl->last_s >= tl->interval_s)
        add_point(d);
}

void omv_daemon_timeline_end(omv_daemon_t *d)
{
    timeline_t *tl = &d->timeline;
    if (tl->interval_s <= 0)
        return; /* the job never started */
    const timeline_point_t *last = tl->n_points ? &tl->points[tl->n_points - 1] : NULL;
    if (last == NULL || last->steps_total != d->steps_total || tl->last_images != images_seen(d) ||
        tl->loss_n > 0)
        add_point(d);
}

void omv_daemon_timeline_config(omv_daemon_t *d, const char *cause)
{
    timeline_t *tl = &d->timeline;
    timeline_change_t c = {
        .wall_s = omv_daemon_train_seconds(d),
        .epoch = omv_daemon_epoch(d),
        .steps_total = d->steps_total,
        .groups = omv_groups_count(d->groups),
        .momentum = d->sgd.momentum,
        .learning_rate = d->sgd.learning_rate,
        .probing = omv_daemon_opt_probing(d),
        .cause = cause,
    };
    tl->probed |= c.probing;
    if (tl->n_changes > 0) {
        const timeline_change_t *l = &tl->changes[tl->n_changes - 1];
        if (l->groups == c.groups && l->momentum == c.momentum &&
            l->learning_rate == c.learning_rate && l->probing == c.probing)
            return;
    }
    if (tl->n_changes >= OMV_TIMELINE_MAX_CHANGES) {
        /* Let go of the older half; the points still carry the configuration of that time. */
        size_t half = tl->n_changes / 2;
        memmove(tl->changes, tl->changes + half, (tl->n_changes - half) * sizeof(*tl->changes));
        tl->n_changes -= half;
        tl->changes_dropped += half;
    }
    if (reserve((void **)&tl->changes, &tl->cap_changes, tl->n_changes, sizeof(*tl->changes),
                OMV_TIMELINE_MAX_CHANGES) < 0) {
        out_of_memory(tl, "configuration changes");
        return;
    }
    tl->changes[tl->n_changes++] = c;
}

/* ---- the `history` reply ---- */

/* A JSON number with `decimals` digits after the point (-1: six significant digits), or null
 * for NaN and infinities. */
static void json_num(omv_strbuf_t *out, const char *key, double v, int decimals)
{
    omv_strbuf_printf(out, ",\"%s\":", key);
    if (!isfinite(v))
        omv_strbuf_append(out, "null", 4);
    else if (decimals < 0)
        omv_strbuf_printf(out, "%.6g", v);
    else
        omv_strbuf_printf(out, "%.*f", decimals, v);
}

static double point_loss(const timeline_point_t *p)
{
    return p->loss_n ? p->loss_sum / (double)p->loss_n : NAN;
}

static void history_json(omv_daemon_t *d, omv_strbuf_t *out)
{
    const timeline_t *tl = &d->timeline;
    omv_strbuf_append(out, "{\"job\":", 7);
    omv_strbuf_json_string(out, d->job.name);
    omv_strbuf_printf(out, ",\"state\":\"%s\"", omv_daemon_state_names[d->state]);
    json_num(out, "test_accuracy", d->n_history ? d->history[d->n_history - 1].accuracy : NAN, 4);
    json_num(out, "wall_seconds", omv_daemon_train_seconds(d), 3);
    json_num(out, "epoch", omv_daemon_epoch(d), 4);
    json_num(out, "interval_seconds", tl->interval_s, -1);
    omv_strbuf_printf(out, ",\"changes_dropped_total\":%llu,\"train\":[",
                      (unsigned long long)tl->changes_dropped);
    for (size_t i = 0; i < tl->n_points; i++) {
        const timeline_point_t *p = &tl->points[i];
        omv_strbuf_printf(out, "%s{\"wall_seconds\":%.3f", i ? "," : "", p->wall_s);
        json_num(out, "epoch", p->epoch, 4);
        omv_strbuf_printf(out, ",\"step\":%llu,\"images\":%llu", (unsigned long long)p->steps_total,
                          (unsigned long long)p->images_total);
        json_num(out, "train_loss", point_loss(p), -1);
        json_num(out, "images_per_second", p->images_per_s, 1);
        omv_strbuf_printf(out, ",\"groups\":%u", p->groups);
        json_num(out, "momentum", p->momentum, -1);
        json_num(out, "learning_rate", p->learning_rate, -1);
        omv_strbuf_printf(out, ",\"probing\":%s}", p->probing ? "true" : "false");
    }
    omv_strbuf_append(out, "],\"eval\":[", 10);
    for (size_t i = 0; i < d->n_history; i++) {
        const eval_point_t *h = &d->history[i];
        omv_strbuf_printf(out, "%s{\"wall_seconds\":%.3f", i ? "," : "", h->wall_s);
        json_num(out, "epoch", h->epoch, 4);
        json_num(out, "test_accuracy", h->accuracy, -1);
        json_num(out, "test_loss", h->loss, -1);
        omv_strbuf_append(out, "}", 1);
    }
    omv_strbuf_append(out, "],\"config\":[", 12);
    for (size_t i = 0; i < tl->n_changes; i++) {
        const timeline_change_t *c = &tl->changes[i];
        omv_strbuf_printf(out, "%s{\"wall_seconds\":%.3f", i ? "," : "", c->wall_s);
        json_num(out, "epoch", c->epoch, 4);
        omv_strbuf_printf(out, ",\"step\":%llu,\"groups\":%u", (unsigned long long)c->steps_total,
                          c->groups);
        json_num(out, "momentum", c->momentum, -1);
        json_num(out, "learning_rate", c->learning_rate, -1);
        omv_strbuf_printf(out, ",\"probing\":%s,\"cause\":\"%s\"}", c->probing ? "true" : "false",
                          c->cause);
    }
    omv_strbuf_append(out, "],\"phases\":[", 12);
    for (uint32_t i = 0; i < d->n_phases; i++) {
        const opt_phase_t *ph = &d->phases[i];
        omv_strbuf_printf(out, "%s{\"phase\":%u,\"groups\":%u", i ? "," : "", ph->phase,
                          ph->groups);
        json_num(out, "momentum", ph->momentum, -1);
        json_num(out, "learning_rate", ph->learning_rate, -1);
        json_num(out, "epoch", ph->epoch, 4);
        omv_strbuf_append(out, "}", 1);
    }
    omv_strbuf_append(out, "]}\n", 3);
}

void omv_daemon_timeline_report(omv_daemon_t *d, omv_strbuf_t *out, int json)
{
    if (json) {
        history_json(d, out);
        return;
    }
    const timeline_t *tl = &d->timeline;
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "history");
    omv_kv_str(&kv, "job", d->job.name);
    omv_kv_str(&kv, "state", omv_daemon_state_names[d->state]);
    omv_kv_double(&kv, "test_accuracy", d->n_history ? d->history[d->n_history - 1].accuracy : NAN,
                  4);
    omv_kv_double(&kv, "wall_seconds", omv_daemon_train_seconds(d), 1);
    omv_kv_double(&kv, "interval_seconds", tl->interval_s, 1);
    omv_kv_int(&kv, "train_points", (int64_t)tl->n_points);
    omv_kv_int(&kv, "eval_points", (int64_t)d->n_history);
    omv_kv_int(&kv, "config_changes", (int64_t)tl->n_changes);
    omv_kv_int(&kv, "changes_dropped_total", (int64_t)tl->changes_dropped);
    omv_kv_int(&kv, "phases", d->n_phases);
    char key[32], val[256];
    omv_kv_section(&kv, "train");
    for (size_t i = 0; i < tl->n_points; i++) {
        const timeline_point_t *p = &tl->points[i];
        snprintf(key, sizeof(key), "train_%zu", i + 1);
        snprintf(val, sizeof(val),
                 "wall_seconds=%.1f epoch=%.3f step=%llu images=%llu train_loss=%.4f "
                 "images_per_second=%.0f groups=%u momentum=%g learning_rate=%g probing=%d",
                 p->wall_s, p->epoch, (unsigned long long)p->steps_total,
                 (unsigned long long)p->images_total, point_loss(p), p->images_per_s, p->groups,
                 p->momentum, p->learning_rate, p->probing);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_section(&kv, "eval");
    for (size_t i = 0; i < d->n_history; i++) {
        const eval_point_t *h = &d->history[i];
        snprintf(key, sizeof(key), "eval_%zu", i + 1);
        snprintf(val, sizeof(val),
                 "wall_seconds=%.1f epoch=%.3f test_accuracy=%.4f "
                 "test_loss=%.4f",
                 h->wall_s, h->epoch, h->accuracy, h->loss);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_section(&kv, "config");
    for (size_t i = 0; i < tl->n_changes; i++) {
        const timeline_change_t *c = &tl->changes[i];
        snprintf(key, sizeof(key), "change_%zu", i + 1);
        snprintf(val, sizeof(val),
                 "wall_seconds=%.1f epoch=%.3f step=%llu groups=%u "
                 "momentum=%g learning_rate=%g probing=%d cause=%s",
                 c->wall_s, c->epoch, (unsigned long long)c->steps_total, c->groups, c->momentum,
                 c->learning_rate, c->probing, c->cause);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_section(&kv, "phases");
    for (uint32_t i = 0; i < d->n_phases; i++) {
        snprintf(key, sizeof(key), "phase_%u", d->phases[i].phase);
        snprintf(val, sizeof(val), "groups=%u momentum=%g learning_rate=%g from_epoch=%.2f",
                 d->phases[i].groups, d->phases[i].momentum, d->phases[i].learning_rate,
                 d->phases[i].epoch);
        omv_kv_str(&kv, key, val);
    }
    omv_kv_end(&kv);
}
