/* The training timeline: points, thinning, configuration changes and the `history` reply. */
#define OMV_LOG_TAG "daemon"
#include "timeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "log.h"

void omv_timeline_init(omv_timeline_t *self)
{
    memset(self, 0, sizeof(*self));
}

void omv_timeline_fini(omv_timeline_t *self)
{
    free(self->points);
    free(self->changes);
    memset(self, 0, sizeof(*self));
}

static void out_of_memory(omv_timeline_t *tl, const char *what)
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
static void thin(omv_timeline_t *tl)
{
    size_t n = 0;
    for (size_t i = 0; i + 1 < tl->n_points; i += 2) {
        const omv_timeline_point_t *a = &tl->points[i];
        omv_timeline_point_t m = tl->points[i + 1];
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

static void add_point(omv_timeline_t *tl, const omv_timeline_now_t *now)
{
    if (reserve((void **)&tl->points, &tl->cap_points, tl->n_points, sizeof(*tl->points),
                OMV_TIMELINE_MAX_POINTS) < 0) {
        out_of_memory(tl, "training points");
        return;
    }
    double span = now->train_s - tl->last_s;
    omv_timeline_point_t *p = &tl->points[tl->n_points++];
    *p = (omv_timeline_point_t){
        .wall_s = now->train_s,
        .span_s = span,
        .epoch = now->epoch,
        .steps_total = now->steps_total,
        .images_total = now->images_total,
        .loss_sum = tl->loss_sum,
        .loss_n = tl->loss_n,
        .images_per_s = span > 0 ? (double)(now->images_seen - tl->last_images) / span : 0.0,
        .groups = now->groups,
        .momentum = now->momentum,
        .learning_rate = now->learning_rate,
        .probing = tl->probed || now->probing,
    };
    tl->last_s = now->train_s;
    tl->last_images = now->images_seen;
    tl->loss_sum = 0;
    tl->loss_n = 0;
    tl->probed = 0;
    if (tl->n_points >= OMV_TIMELINE_MAX_POINTS)
        thin(tl);
}

void omv_timeline_start(omv_timeline_t *self, const omv_timeline_now_t *now)
{
    self->interval_s = OMV_TIMELINE_INTERVAL_S;
    self->last_s = now->train_s;
    self->last_images = now->images_seen;
    omv_timeline_config(self, now, "start");
}

void omv_timeline_loss(omv_timeline_t *self, double loss)
{
    self->loss_sum += loss;
    self->loss_n++;
}

void omv_timeline_tick(omv_timeline_t *self, const omv_timeline_now_t *now)
{
    if (self->interval_s <= 0)
        return;
    self->probed |= now->probing;
    if (now->train_s - self->last_s >= self->interval_s)
        add_point(self, now);
}

void omv_timeline_end(omv_timeline_t *self, const omv_timeline_now_t *now)
{
    if (self->interval_s <= 0)
        return; /* the job never started */
    const omv_timeline_point_t *last = self->n_points ? &self->points[self->n_points - 1] : NULL;
    if (last == NULL || last->steps_total != now->steps_total ||
        self->last_images != now->images_seen || self->loss_n > 0)
        add_point(self, now);
}

void omv_timeline_config(omv_timeline_t *self, const omv_timeline_now_t *now, const char *cause)
{
    omv_timeline_change_t c = {
        .wall_s = now->train_s,
        .epoch = now->epoch,
        .steps_total = now->steps_total,
        .groups = now->groups,
        .momentum = now->momentum,
        .learning_rate = now->learning_rate,
        .probing = now->probing,
        .cause = cause,
    };
    self->probed |= c.probing;
    if (self->n_changes > 0) {
        const omv_timeline_change_t *l = &self->changes[self->n_changes - 1];
        if (l->groups == c.groups && l->momentum == c.momentum &&
            l->learning_rate == c.learning_rate && l->probing == c.probing)
            return;
    }
    if (self->n_changes >= OMV_TIMELINE_MAX_CHANGES) {
        /* Let go of the older half; the points still carry the configuration of that time. */
        size_t half = self->n_changes / 2;
        memmove(self->changes, self->changes + half,
                (self->n_changes - half) * sizeof(*self->changes));
        self->n_changes -= half;
        self->changes_dropped += half;
    }
    if (reserve((void **)&self->changes, &self->cap_changes, self->n_changes,
                sizeof(*self->changes), OMV_TIMELINE_MAX_CHANGES) < 0) {
        out_of_memory(self, "configuration changes");
        return;
    }
    self->changes[self->n_changes++] = c;
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

static double point_loss(const omv_timeline_point_t *p)
{
    return p->loss_n ? p->loss_sum / (double)p->loss_n : NAN;
}

static void points_json(const omv_timeline_t *tl, omv_strbuf_t *out)
{
    for (size_t i = 0; i < tl->n_points; i++) {
        const omv_timeline_point_t *p = &tl->points[i];
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
}

static void evals_json(const omv_eval_t *ev, omv_strbuf_t *out)
{
    for (size_t i = 0; i < ev->n_history; i++) {
        const omv_eval_point_t *h = &ev->history[i];
        omv_strbuf_printf(out, "%s{\"wall_seconds\":%.3f", i ? "," : "", h->wall_s);
        json_num(out, "epoch", h->epoch, 4);
        json_num(out, "test_accuracy", h->accuracy, -1);
        json_num(out, "test_loss", h->loss, -1);
        omv_strbuf_append(out, "}", 1);
    }
}

static void changes_json(const omv_timeline_t *tl, omv_strbuf_t *out)
{
    for (size_t i = 0; i < tl->n_changes; i++) {
        const omv_timeline_change_t *c = &tl->changes[i];
        omv_strbuf_printf(out, "%s{\"wall_seconds\":%.3f", i ? "," : "", c->wall_s);
        json_num(out, "epoch", c->epoch, 4);
        omv_strbuf_printf(out, ",\"step\":%llu,\"groups\":%u", (unsigned long long)c->steps_total,
                          c->groups);
        json_num(out, "momentum", c->momentum, -1);
        json_num(out, "learning_rate", c->learning_rate, -1);
        omv_strbuf_printf(out, ",\"probing\":%s,\"cause\":\"%s\"}", c->probing ? "true" : "false",
                          c->cause);
    }
}

static void history_json(const omv_timeline_t *tl, const omv_timeline_head_t *head,
                         omv_strbuf_t *out)
{
    omv_strbuf_append(out, "{\"job\":", 7);
    omv_strbuf_json_string(out, head->job);
    omv_strbuf_printf(out, ",\"state\":\"%s\"", head->state);
    json_num(out, "test_accuracy", head->test_accuracy, 4);
    json_num(out, "wall_seconds", head->train_s, 3);
    json_num(out, "epoch", head->epoch, 4);
    json_num(out, "interval_seconds", tl->interval_s, -1);
    omv_strbuf_printf(out, ",\"changes_dropped_total\":%llu,\"train\":[",
                      (unsigned long long)tl->changes_dropped);
    points_json(tl, out);
    omv_strbuf_append(out, "],\"eval\":[", 10);
    evals_json(head->eval, out);
    omv_strbuf_append(out, "],\"config\":[", 12);
    changes_json(tl, out);
    omv_strbuf_append(out, "],\"phases\":", 11);
    omv_tuner_phases_json(head->tuner, out);
    omv_strbuf_append(out, "}\n", 2);
}

static void history_lines(const omv_timeline_t *tl, const omv_eval_t *ev, omv_kv_t *kv)
{
    char key[32], val[256];
    omv_kv_section(kv, "train");
    for (size_t i = 0; i < tl->n_points; i++) {
        const omv_timeline_point_t *p = &tl->points[i];
        snprintf(key, sizeof(key), "train_%zu", i + 1);
        snprintf(val, sizeof(val),
                 "wall_seconds=%.1f epoch=%.3f step=%llu images=%llu train_loss=%.4f "
                 "images_per_second=%.0f groups=%u momentum=%g learning_rate=%g probing=%d",
                 p->wall_s, p->epoch, (unsigned long long)p->steps_total,
                 (unsigned long long)p->images_total, point_loss(p), p->images_per_s, p->groups,
                 p->momentum, p->learning_rate, p->probing);
        omv_kv_str(kv, key, val);
    }
    omv_kv_section(kv, "eval");
    for (size_t i = 0; i < ev->n_history; i++) {
        const omv_eval_point_t *h = &ev->history[i];
        snprintf(key, sizeof(key), "eval_%zu", i + 1);
        snprintf(val, sizeof(val), "wall_seconds=%.1f epoch=%.3f test_accuracy=%.4f test_loss=%.4f",
                 h->wall_s, h->epoch, h->accuracy, h->loss);
        omv_kv_str(kv, key, val);
    }
    omv_kv_section(kv, "config");
    for (size_t i = 0; i < tl->n_changes; i++) {
        const omv_timeline_change_t *c = &tl->changes[i];
        snprintf(key, sizeof(key), "change_%zu", i + 1);
        snprintf(val, sizeof(val),
                 "wall_seconds=%.1f epoch=%.3f step=%llu groups=%u momentum=%g learning_rate=%g "
                 "probing=%d cause=%s",
                 c->wall_s, c->epoch, (unsigned long long)c->steps_total, c->groups, c->momentum,
                 c->learning_rate, c->probing, c->cause);
        omv_kv_str(kv, key, val);
    }
}

void omv_timeline_report(const omv_timeline_t *self, const omv_timeline_head_t *head,
                         omv_strbuf_t *out, int json)
{
    if (json) {
        history_json(self, head, out);
        return;
    }
    const omv_phase_t *phases;
    uint32_t n_phases = omv_tuner_phases(head->tuner, &phases);
    omv_kv_t kv;
    omv_kv_begin(&kv, out, 0);
    omv_kv_section(&kv, "history");
    omv_kv_str(&kv, "job", head->job);
    omv_kv_str(&kv, "state", head->state);
    omv_kv_double(&kv, "test_accuracy", head->test_accuracy, 4);
    omv_kv_double(&kv, "wall_seconds", head->train_s, 1);
    omv_kv_double(&kv, "interval_seconds", self->interval_s, 1);
    omv_kv_int(&kv, "train_points", (int64_t)self->n_points);
    omv_kv_int(&kv, "eval_points", (int64_t)head->eval->n_history);
    omv_kv_int(&kv, "config_changes", (int64_t)self->n_changes);
    omv_kv_int(&kv, "changes_dropped_total", (int64_t)self->changes_dropped);
    omv_kv_int(&kv, "phases", n_phases);
    history_lines(self, head->eval, &kv);
    omv_kv_section(&kv, "phases");
    omv_tuner_phases_kv(head->tuner, &kv);
    omv_kv_end(&kv);
}
