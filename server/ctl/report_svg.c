/* The training report's picture: a hand-written, self-contained SVG of three panels over one
 * time axis: training and test loss, test accuracy, and the groups / momentum / learning-rate
 * timeline as step plots, with the optimizer's probes shaded in every panel. */
#include <locale.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#define WIDTH 960
#define HEIGHT 840
#define PLOT_L 90.0
#define PLOT_R 930.0

#define COLOR_TRAIN "#1f77b4"
#define COLOR_TEST_LOSS "#ff7f0e"
#define COLOR_ACCURACY "#2ca02c"
#define COLOR_GROUPS "#9467bd"
#define COLOR_MOMENTUM "#8c564b"
#define COLOR_LR "#d62728"

/* A panel's plot area and the values it spans (exponents of ten when log). */
typedef struct {
    double top, height;
    double lo, hi;
    int log;
    int has_data;
    double pad; /* pixels kept free at the top and bottom, so a level on the edge shows */
} panel_t;

/* The time axis: seconds from lo to hi, labelled in units of div seconds. */
typedef struct {
    double lo, hi, div;
    const char *unit;
} xaxis_t;

/* The configuration from w on, for the step plots; probes ran in [probe_from, probe_to). */
typedef struct {
    double w, groups, momentum, learning_rate;
    int probing;
    double probe_from, probe_to;
} cfg_t;

/* ---- text ---- */

/* A number with `decimals` digits after the point (-1: %g), with a '.' whatever the locale. */
static void num(omv_strbuf_t *out, double v, int decimals)
{
    char b[48];
    if (decimals < 0)
        snprintf(b, sizeof(b), "%.6g", v);
    else
        snprintf(b, sizeof(b), "%.*f", decimals, v);
    const char *dp = localeconv()->decimal_point;
    char *at = dp && strcmp(dp, ".") != 0 ? strstr(b, dp) : NULL;
    if (at) {
        size_t dl = strlen(dp);
        *at = '.';
        memmove(at + 1, at + dl, strlen(at + dl) + 1);
    }
    omv_strbuf_append(out, b, strlen(b));
}

/* Text for XML content or attributes: markup characters escaped, control characters and bytes
 * that are not UTF-8 replaced by '?'. */
static void xml_text(omv_strbuf_t *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char c = *p;
        if (c == '&') {
            omv_strbuf_append(out, "&amp;", 5);
        } else if (c == '<') {
            omv_strbuf_append(out, "&lt;", 4);
        } else if (c == '>') {
            omv_strbuf_append(out, "&gt;", 4);
        } else if (c == '"') {
            omv_strbuf_append(out, "&quot;", 6);
        } else if (c == '\'') {
            omv_strbuf_append(out, "&apos;", 6);
        } else if (c < 0x20 || c == 0x7F) {
            omv_strbuf_append(out, "?", 1);
        } else if (c < 0x80) {
            omv_strbuf_append(out, (const char *)p, 1);
        } else {
            int n = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
            int ok = n > 0;
            for (int i = 1; ok && i < n; i++)
                ok = (p[i] & 0xC0) == 0x80;
            if (ok) {
                omv_strbuf_append(out, (const char *)p, (size_t)n);
                p += n;
                continue;
            }
            omv_strbuf_append(out, "?", 1);
        }
        p++;
    }
}

static void text_at(omv_strbuf_t *out, double x, double y, const char *cls, const char *anchor,
                    const char *s)
{
    omv_strbuf_append(out, "<text x=\"", 9);
    num(out, x, 1);
    omv_strbuf_append(out, "\" y=\"", 5);
    num(out, y, 1);
    omv_strbuf_printf(out, "\"%s%s%s text-anchor=\"%s\">", cls ? " class=\"" : "", cls ? cls : "",
                      cls ? "\"" : "", anchor);
    xml_text(out, s);
    omv_strbuf_append(out, "</text>\n", 8);
}

/* ---- scales ---- */

static double nice_step(double range, int n)
{
    double raw = range / n;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static double px(const xaxis_t *x, double w)
{
    double f = (w - x->lo) / (x->hi - x->lo);
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    return PLOT_L + f * (PLOT_R - PLOT_L);
}

/* A value's height in the panel (clamped to it). */
static double py(const panel_t *p, double v)
{
    double t = p->log ? log10(v) : v;
    double f = (t - p->lo) / (p->hi - p->lo);
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    return p->top + p->pad + (p->height - 2 * p->pad) * (1 - f);
}

/* Whether v can be drawn in p. */
static int drawable(const panel_t *p, double v)
{
    return isfinite(v) && (!p->log || v > 0);
}

/* Rounds [lo, hi] out to ticks of a nice step (about n of them). */
static void linear_range(panel_t *p, double lo, double hi, int n)
{
    if (!(hi > lo)) {
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.5 : 0.5;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step(hi - lo, n);
    p->lo = floor(lo / step + 1e-9) * step;
    p->hi = ceil(hi / step - 1e-9) * step;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- drawing ---- */

static void point(omv_strbuf_t *out, double x, double y)
{
    num(out, x, 1);
    omv_strbuf_append(out, ",", 1);
    num(out, y, 1);
    omv_strbuf_append(out, " ", 1);
}

static void frame(omv_strbuf_t *out, const panel_t *p, const char *title)
{
    omv_strbuf_append(out, "<rect class=\"frame\" x=\"", 23);
    num(out, PLOT_L, 1);
    omv_strbuf_append(out, "\" y=\"", 5);
    num(out, p->top, 1);
    omv_strbuf_append(out, "\" width=\"", 9);
    num(out, PLOT_R - PLOT_L, 1);
    omv_strbuf_append(out, "\" height=\"", 10);
    num(out, p->height, 1);
    omv_strbuf_append(out, "\"/>\n", 4);
    text_at(out, PLOT_L, p->top - 7, "ptitle", "start", title);
    if (!p->has_data)
        text_at(out, (PLOT_L + PLOT_R) / 2, p->top + p->height / 2 + 5, "empty", "middle",
                "no data yet");
}

static void hline(omv_strbuf_t *out, double y)
{
    omv_strbuf_append(out, "<line class=\"grid\" x1=\"", 23);
    num(out, PLOT_L, 1);
    omv_strbuf_append(out, "\" x2=\"", 6);
    num(out, PLOT_R, 1);
    omv_strbuf_append(out, "\" y1=\"", 6);
    num(out, y, 1);
    omv_strbuf_append(out, "\" y2=\"", 6);
    num(out, y, 1);
    omv_strbuf_append(out, "\"/>\n", 4);
}

/* Grid lines and labels on the value axis: a linear one (labels with `decimals`, -1: %g) or
 * powers of ten. */
static void y_ticks(omv_strbuf_t *out, const panel_t *p, int n, int decimals)
{
    if (!p->has_data)
        return;
    omv_strbuf_t label;
    omv_strbuf_init(&label);
    double step = p->log ? ceil((p->hi - p->lo) / n) : nice_step(p->hi - p->lo, n);
    if (decimals == 0)
        step = fmax(1, round(step)); /* whole numbers: no tick between them */
    if (!(step > 0))
        step = 1;
    for (double t = p->lo; t <= p->hi + step * 1e-6; t += step) {
        double v = p->log ? pow(10, t) : round(t / step) * step;
        double y = py(p, v);
        hline(out, y);
        omv_strbuf_clear(&label);
        num(&label, v == 0 ? 0 : v, decimals);
        text_at(out, PLOT_L - 6, y + 4, NULL, "end", omv_strbuf_str(&label));
    }
    omv_strbuf_fini(&label);
}

/* Vertical grid lines at the time ticks; labels under the last panel only. */
static void x_ticks(omv_strbuf_t *out, const xaxis_t *x, const panel_t *p, int labels)
{
    double span = (x->hi - x->lo) / x->div;
    double step = nice_step(span, 8);
    omv_strbuf_t label;
    omv_strbuf_init(&label);
    for (double t = ceil(x->lo / x->div / step - 1e-9) * step; t <= x->hi / x->div + step * 1e-6;
         t += step) {
        double xx = px(x, t * x->div);
        omv_strbuf_append(out, "<line class=\"grid\" x1=\"", 23);
        num(out, xx, 1);
        omv_strbuf_append(out, "\" x2=\"", 6);
        num(out, xx, 1);
        omv_strbuf_append(out, "\" y1=\"", 6);
        num(out, p->top, 1);
        omv_strbuf_append(out, "\" y2=\"", 6);
        num(out, p->top + p->height, 1);
        omv_strbuf_append(out, "\"/>\n", 4);
        if (labels) {
            omv_strbuf_clear(&label);
            double v = round(t / step) * step;
            num(&label, v == 0 ? 0 : v, -1); /* not "-0" */
            text_at(out, xx, p->top + p->height + 15, NULL, "middle", omv_strbuf_str(&label));
        }
    }
    omv_strbuf_fini(&label);
}

static void probes(omv_strbuf_t *out, const xaxis_t *x, const panel_t *p, const cfg_t *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!c[i].probing)
            continue;
        /* Neighbouring probes make one band. */
        double a = c[i].probe_from, b = c[i].probe_to;
        while (i + 1 < n && c[i + 1].probing && c[i + 1].probe_from <= b + 1e-9) {
            i++;
            b = fmax(b, c[i].probe_to);
        }
        double xa = px(x, a), xb = px(x, b);
        omv_strbuf_append(out, "<rect class=\"probe\" x=\"", 23);
        num(out, xa, 1);
        omv_strbuf_append(out, "\" y=\"", 5);
        num(out, p->top, 1);
        omv_strbuf_append(out, "\" width=\"", 9);
        num(out, xb - xa > 0.5 ? xb - xa : 0.5, 1);
        omv_strbuf_append(out, "\" height=\"", 10);
        num(out, p->height, 1);
        omv_strbuf_append(out, "\"/>\n", 4);
    }
}

/* A series of (wall_s, value) pairs at stride bytes from each other: one polyline of its
 * drawable points, and dots when `dots` (or when there is one point). Returns the points drawn.
 */
static size_t series(omv_strbuf_t *out, const char *id, const char *color, const char *extra,
                     const xaxis_t *x, const panel_t *p, const double *wall, const double *value,
                     size_t n, size_t stride, int dots, const char *what)
{
    size_t drawn = 0;
#define AT(ptr, i) (*(const double *)((const char *)(ptr) + (i)*stride))
    for (size_t i = 0; i < n; i++)
        drawn += isfinite(AT(wall, i)) && drawable(p, AT(value, i));
    if (drawn == 0)
        return 0;
    omv_strbuf_printf(out, "<polyline id=\"series-%s\" stroke=\"%s\"%s points=\"", id, color,
                      extra);
    for (size_t i = 0; i < n; i++)
        if (isfinite(AT(wall, i)) && drawable(p, AT(value, i)))
            point(out, px(x, AT(wall, i)), py(p, AT(value, i)));
    omv_strbuf_append(out, "\"/>\n", 4);
    if (dots || drawn == 1) {
        omv_strbuf_printf(out, "<g id=\"dots-%s\" fill=\"%s\">\n", id, color);
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(AT(wall, i)) || !drawable(p, AT(value, i)))
                continue;
            omv_strbuf_append(out, "<circle cx=\"", 12);
            num(out, px(x, AT(wall, i)), 1);
            omv_strbuf_append(out, "\" cy=\"", 6);
            num(out, py(p, AT(value, i)), 1);
            omv_strbuf_printf(out, "\" r=\"3\"><title>%s ", what);
            num(out, AT(value, i), 4);
            omv_strbuf_append(out, " at ", 4);
            num(out, AT(wall, i), 1);
            omv_strbuf_append(out, " s</title></circle>\n", 20);
        }
        omv_strbuf_append(out, "</g>\n", 5);
    }
#undef AT
    return drawn;
}

/* A step plot of one configuration value: level from each entry's w to the next change, and
 * on to the end of the axis. Consecutive equal values make one step. */
static void steps(omv_strbuf_t *out, const char *id, const char *color, const xaxis_t *x,
                  const panel_t *p, const cfg_t *c, size_t n, size_t offset)
{
    double prev = NAN;
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        double v = *(const double *)((const char *)&c[i] + offset);
        if (!drawable(p, v) || (any && v == prev))
            continue;
        if (!any)
            omv_strbuf_printf(out, "<polyline id=\"series-%s\" stroke=\"%s\" points=\"", id, color);
        else
            point(out, px(x, c[i].w), py(p, prev));
        point(out, px(x, c[i].w), py(p, v));
        prev = v;
        any = 1;
    }
    if (any) {
        point(out, px(x, x->hi), py(p, prev));
        omv_strbuf_append(out, "\"/>\n", 4);
    }
}

/* The configuration over time: the changes the daemon recorded, and before the first of them
 * (or when there are none) what the training points carried. Caller frees. */
static cfg_t *config_timeline(const omv_report_t *r, double end, size_t *ret_n)
{
    cfg_t *c = malloc((r->n_train + r->n_config + 1) * sizeof(*c));
    if (c == NULL)
        return NULL;
    size_t n = 0;
    double first = r->n_config ? r->config[0].wall_s : INFINITY;
    double prev = 0;
    for (size_t i = 0; i < r->n_train; i++) {
        const omv_report_train_t *t = &r->train[i];
        if (!(t->wall_s < first))
            break;
        c[n++] = (cfg_t){t->wall_s,  t->groups, t->momentum, t->learning_rate,
                         t->probing, prev,      t->wall_s};
        prev = t->wall_s;
    }
    for (size_t i = 0; i < r->n_config; i++) {
        const omv_report_change_t *k = &r->config[i];
        double next = i + 1 < r->n_config ? r->config[i + 1].wall_s : end;
        c[n++] = (cfg_t){k->wall_s,  k->groups, k->momentum, k->learning_rate,
                         k->probing, k->wall_s, next};
    }
    *ret_n = n;
    return c;
}

static void legend(omv_strbuf_t *out, double y)
{
    static const struct {
        const char *label, *color, *dash;
        int dot, shade;
    } items[] = {
        {"training loss", COLOR_TRAIN, "", 0, 0},
        {"test loss", COLOR_TEST_LOSS, " stroke-dasharray=\"4 3\"", 1, 0},
        {"test accuracy", COLOR_ACCURACY, "", 1, 0},
        {"compute groups", COLOR_GROUPS, "", 0, 0},
        {"momentum", COLOR_MOMENTUM, "", 0, 0},
        {"learning rate", COLOR_LR, "", 0, 0},
        {"optimizer probe", NULL, "", 0, 1},
    };
    double x = PLOT_L;
    omv_strbuf_append(out, "<g id=\"legend\">\n", 16);
    for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++) {
        if (items[i].shade) {
            omv_strbuf_append(out, "<rect class=\"probe\" x=\"", 23);
            num(out, x, 1);
            omv_strbuf_append(out, "\" y=\"", 5);
            num(out, y - 9, 1);
            omv_strbuf_append(out, "\" width=\"22\" height=\"12\"/>\n", 27);
        } else {
            omv_strbuf_append(out, "<line x1=\"", 10);
            num(out, x, 1);
            omv_strbuf_append(out, "\" x2=\"", 6);
            num(out, x + 22, 1);
            omv_strbuf_append(out, "\" y1=\"", 6);
            num(out, y - 3, 1);
            omv_strbuf_append(out, "\" y2=\"", 6);
            num(out, y - 3, 1);
            omv_strbuf_printf(out, "\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", items[i].color,
                              items[i].dash);
            if (items[i].dot) {
                omv_strbuf_append(out, "<circle cx=\"", 12);
                num(out, x + 11, 1);
                omv_strbuf_append(out, "\" cy=\"", 6);
                num(out, y - 3, 1);
                omv_strbuf_printf(out, "\" r=\"3\" fill=\"%s\"/>\n", items[i].color);
            }
        }
        text_at(out, x + 26, y + 1, NULL, "start", items[i].label);
        x += 26 + 6.3 * (double)strlen(items[i].label) + 18; /* about 6 px a letter */
    }
    omv_strbuf_append(out, "</g>\n", 5);
}

/* The largest finite value of a strided series, and whether there was one. */
static int range_of(const double *v, size_t n, size_t stride, double *lo, double *hi)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        double x = *(const double *)((const char *)v + i * stride);
        if (!isfinite(x))
            continue;
        if (!any || x < *lo)
            *lo = x;
        if (!any || x > *hi)
            *hi = x;
        any = 1;
    }
    return any;
}

/* Everything one picture is drawn from: the report's lists (never NULL, so that a member's
 * address can be taken for a strided series), the time axis, the configuration over time and
 * the scales of the five panels. */
typedef struct {
    const omv_report_t *r;
    const omv_report_train_t *tr;
    const omv_report_eval_t *ev;
    const omv_report_change_t *ch;
    xaxis_t x;
    const cfg_t *cf;
    size_t n_cfg;
    panel_t loss, acc, groups, mom, lr;
    int loss_cut;     /* some losses lie above loss.hi and are drawn at its top */
    double final_acc; /* the job's last test accuracy, NaN when there was none */
} picture_t;

/* The time axis: from 0 (or earlier points) to the last thing that happened, in seconds,
 * minutes or hours by how long that was. */
static xaxis_t time_axis(const picture_t *pic)
{
    const omv_report_t *r = pic->r;
    xaxis_t x = {0, 0, 1, "s"};
    double lo = 0, hi = 0;
    if (range_of(&pic->tr->wall_s, r->n_train, sizeof(*pic->tr), &lo, &hi))
        x.lo = fmin(x.lo, lo), x.hi = fmax(x.hi, hi);
    if (range_of(&pic->ev->wall_s, r->n_eval, sizeof(*pic->ev), &lo, &hi))
        x.lo = fmin(x.lo, lo), x.hi = fmax(x.hi, hi);
    if (range_of(&pic->ch->wall_s, r->n_config, sizeof(*pic->ch), &lo, &hi))
        x.lo = fmin(x.lo, lo), x.hi = fmax(x.hi, hi);
    if (isfinite(r->wall_s))
        x.hi = fmax(x.hi, r->wall_s);
    if (!(x.hi > x.lo))
        x.hi = x.lo + 1;
    if (x.hi - x.lo >= 2 * 3600)
        x.div = 3600, x.unit = "h";
    else if (x.hi - x.lo >= 300)
        x.div = 60, x.unit = "min";
    return x;
}

/* Panel (a): losses, with rare spikes (a probe's learning rate too high) cut off at the top
 * rather than flattening everything else. */
static void scale_loss(picture_t *pic)
{
    const omv_report_t *r = pic->r;
    pic->loss = (panel_t){110, 200, 0, 1, 0, 0, 0};
    size_t n_loss = 0;
    double *all = malloc((r->n_train + r->n_eval + 1) * sizeof(double));
    for (size_t i = 0; all && i < r->n_train; i++)
        if (isfinite(pic->tr[i].train_loss))
            all[n_loss++] = pic->tr[i].train_loss;
    for (size_t i = 0; all && i < r->n_eval; i++)
        if (isfinite(pic->ev[i].test_loss))
            all[n_loss++] = pic->ev[i].test_loss;
    if (n_loss > 0) {
        qsort(all, n_loss, sizeof(double), cmp_double);
        double top = all[n_loss - 1], p90 = all[(size_t)((double)(n_loss - 1) * 0.9)];
        linear_range(&pic->loss, fmin(0, all[0]), p90 > 0 && top > 4 * p90 ? 4 * p90 : top, 4);
        pic->loss_cut = top > pic->loss.hi;
        pic->loss.has_data = 1;
    }
    free(all);
}

/* Panel (b): test accuracy, in tenths around what was reached. */
static void scale_accuracy(picture_t *pic)
{
    pic->acc = (panel_t){350, 150, 0, 1, 0, 0, 0};
    double lo = 0, hi = 0;
    if (range_of(&pic->ev->test_accuracy, pic->r->n_eval, sizeof(*pic->ev), &lo, &hi)) {
        pic->acc.lo = fmax(0, floor(lo * 10 - 1e-9) / 10);
        pic->acc.hi = fmin(1, ceil(hi * 10 + 1e-9) / 10);
        if (!(pic->acc.hi > pic->acc.lo))
            pic->acc.lo = fmax(0, pic->acc.hi - 0.1);
        pic->acc.has_data = 1;
    }
}

/* Panel (c): three lanes, for the groups, the momentum and (on a log scale, whole powers of
 * ten) the learning rate. */
static void scale_config(picture_t *pic)
{
    const cfg_t *cf = pic->cf;
    size_t n = pic->n_cfg;
    pic->groups = (panel_t){540, 60, 0, 1, 0, 0, 6};
    pic->mom = (panel_t){624, 60, 0, 1, 0, 0, 6};
    pic->lr = (panel_t){708, 80, -3, -1, 1, 0, 6};
    double lo = 0, hi = 0;
    if (range_of(&cf->groups, n, sizeof(*cf), &lo, &hi)) {
        pic->groups.hi = fmax(1, ceil(hi));
        pic->groups.has_data = 1;
    }
    if (range_of(&cf->momentum, n, sizeof(*cf), &lo, &hi)) {
        pic->mom.lo = fmin(0, floor(lo));
        pic->mom.hi = fmax(1, ceil(hi));
        pic->mom.has_data = 1;
    }
    panel_t *lr = &pic->lr;
    int any_lr = 0;
    for (size_t i = 0; i < n; i++) {
        double v = cf[i].learning_rate;
        if (!(isfinite(v) && v > 0))
            continue;
        double e = log10(v);
        lr->lo = any_lr ? fmin(lr->lo, floor(e + 1e-9)) : floor(e + 1e-9);
        lr->hi = any_lr ? fmax(lr->hi, ceil(e - 1e-9)) : ceil(e - 1e-9);
        any_lr = 1;
    }
    if (any_lr && lr->hi <= lr->lo)
        lr->lo -= 1, lr->hi += 1;
    lr->has_data = any_lr;
}

/* The document's opening: size, title element, style sheet and white background. */
static void document_head(omv_strbuf_t *out, const char *job)
{
    omv_strbuf_printf(out,
                      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                      "viewBox=\"0 0 %d %d\">\n",
                      WIDTH, HEIGHT, WIDTH, HEIGHT);
    omv_strbuf_append(out, "<title>omnivore training report: ", 33);
    xml_text(out, job);
    omv_strbuf_append(out, "</title>\n", 9);
    omv_strbuf_printf(out,
                      "<style>\n"
                      "text{font-family:sans-serif;font-size:11px;fill:#333}\n"
                      ".title{font-size:18px;font-weight:bold;fill:#111}\n"
                      ".sub{font-size:12px;fill:#555}\n"
                      ".ptitle{font-size:12px;font-weight:bold}\n"
                      ".empty{font-size:14px;fill:#999}\n"
                      ".frame{fill:none;stroke:#999}\n"
                      ".grid{stroke:#e8e8e8}\n"
                      ".probe{fill:#f5a623;fill-opacity:0.22}\n"
                      "polyline{fill:none;stroke-width:1.6;stroke-linejoin:round}\n"
                      "</style>\n"
                      "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
                      WIDTH, HEIGHT);
}

/* Title: the job and its final accuracy; below it, how far it got; then the legend. */
static void titles(omv_strbuf_t *out, const picture_t *pic)
{
    const omv_report_t *r = pic->r;
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_strbuf_append(&line, "omnivore training report: ", 26);
    omv_strbuf_append(&line, r->job, strlen(r->job));
    omv_strbuf_append(&line, " - final test accuracy ", 23);
    if (isfinite(pic->final_acc))
        num(&line, pic->final_acc, 4);
    else
        omv_strbuf_append(&line, "(none yet)", 10);
    text_at(out, PLOT_L, 30, "title", "start", omv_strbuf_str(&line));
    omv_strbuf_clear(&line);
    double epochs = r->n_train ? pic->tr[r->n_train - 1].epoch : NAN;
    if (r->n_eval && (!isfinite(epochs) || pic->ev[r->n_eval - 1].epoch > epochs))
        epochs = pic->ev[r->n_eval - 1].epoch;
    omv_strbuf_printf(&line, "state %s  |  ", r->state[0] ? r->state : "unknown");
    num(&line, pic->x.hi, 1);
    omv_strbuf_append(&line, " s of training  |  ", 19);
    if (isfinite(epochs)) {
        num(&line, epochs, 2);
        omv_strbuf_append(&line, " epochs  |  ", 12);
    }
    omv_strbuf_printf(&line, "%zu training point%s, %zu evaluation%s, %zu configuration%s",
                      r->n_train, r->n_train == 1 ? "" : "s", r->n_eval, r->n_eval == 1 ? "" : "s",
                      r->n_config, r->n_config == 1 ? "" : "s");
    text_at(out, PLOT_L, 50, "sub", "start", omv_strbuf_str(&line));
    omv_strbuf_fini(&line);
    legend(out, 78);
}

/* What lies under every panel's data: the probes' bands and the time grid, with the time
 * labels under the last panel. */
static void backgrounds(omv_strbuf_t *out, const picture_t *pic)
{
    const panel_t *panels[] = {&pic->loss, &pic->acc, &pic->groups, &pic->mom, &pic->lr};
    for (size_t i = 0; i < sizeof(panels) / sizeof(panels[0]); i++) {
        probes(out, &pic->x, panels[i], pic->cf, pic->n_cfg);
        x_ticks(out, &pic->x, panels[i], panels[i] == &pic->lr);
    }
}

/* Panel (a): training loss as a line, test loss dashed with a dot per evaluation. */
static void draw_loss(omv_strbuf_t *out, const picture_t *pic)
{
    const panel_t *loss = &pic->loss;
    omv_strbuf_t line;
    omv_strbuf_init(&line);
    omv_strbuf_append(&line, "training loss (mean per interval) and test loss", 47);
    if (pic->loss_cut) {
        omv_strbuf_append(&line, "  (values above ", 16);
        num(&line, loss->hi, -1);
        omv_strbuf_append(&line, " drawn at the top)", 18);
    }
    frame(out, loss, omv_strbuf_str(&line));
    omv_strbuf_fini(&line);
    y_ticks(out, loss, 4, -1);
    series(out, "train_loss", COLOR_TRAIN, "", &pic->x, loss, &pic->tr->wall_s,
           &pic->tr->train_loss, pic->r->n_train, sizeof(*pic->tr), 0, "training loss");
    series(out, "test_loss", COLOR_TEST_LOSS, " stroke-dasharray=\"4 3\"", &pic->x, loss,
           &pic->ev->wall_s, &pic->ev->test_loss, pic->r->n_eval, sizeof(*pic->ev), 1, "test loss");
}

/* Panel (b): test accuracy, its last value written beside the line's end. */
static void draw_accuracy(omv_strbuf_t *out, const picture_t *pic)
{
    const panel_t *acc = &pic->acc;
    frame(out, acc, "test accuracy");
    y_ticks(out, acc, 4, 2);
    if (series(out, "test_accuracy", COLOR_ACCURACY, "", &pic->x, acc, &pic->ev->wall_s,
               &pic->ev->test_accuracy, pic->r->n_eval, sizeof(*pic->ev), 1, "test accuracy") > 0 &&
        isfinite(pic->final_acc)) {
        omv_strbuf_t label;
        omv_strbuf_init(&label);
        num(&label, pic->final_acc, 4);
        double ly = py(acc, pic->final_acc);
        text_at(out, PLOT_R - 4, ly < acc->top + 14 ? ly + 16 : ly - 8, "ptitle", "end",
                omv_strbuf_str(&label));
        omv_strbuf_fini(&label);
    }
}

/* Panel (c): the configuration's three step plots, and the time axis's title under them. */
static void draw_config(omv_strbuf_t *out, const picture_t *pic)
{
    const xaxis_t *x = &pic->x;
    frame(out, &pic->groups, "compute groups");
    y_ticks(out, &pic->groups, 2, 0);
    frame(out, &pic->mom, "momentum");
    y_ticks(out, &pic->mom, 2, -1);
    frame(out, &pic->lr, "learning rate (log scale)");
    y_ticks(out, &pic->lr, 2, -1);
    steps(out, "groups", COLOR_GROUPS, x, &pic->groups, pic->cf, pic->n_cfg,
          offsetof(cfg_t, groups));
    steps(out, "momentum", COLOR_MOMENTUM, x, &pic->mom, pic->cf, pic->n_cfg,
          offsetof(cfg_t, momentum));
    steps(out, "learning_rate", COLOR_LR, x, &pic->lr, pic->cf, pic->n_cfg,
          offsetof(cfg_t, learning_rate));
    omv_strbuf_t label;
    omv_strbuf_init(&label);
    omv_strbuf_printf(&label, "training time (%s)", x->unit);
    text_at(out, (PLOT_L + PLOT_R) / 2, pic->lr.top + pic->lr.height + 36, "ptitle", "middle",
            omv_strbuf_str(&label));
    omv_strbuf_fini(&label);
}

void omv_report_svg(const omv_report_t *r, omv_strbuf_t *out)
{
    /* Empty lists still have an address to take members' addresses from. */
    static const omv_report_train_t no_train;
    static const omv_report_eval_t no_eval;
    static const omv_report_change_t no_change;
    static const cfg_t no_cfg;
    picture_t pic = {
        .r = r,
        .tr = r->train ? r->train : &no_train,
        .ev = r->eval ? r->eval : &no_eval,
        .ch = r->config ? r->config : &no_change,
    };
    pic.x = time_axis(&pic);
    cfg_t *cfg = config_timeline(r, pic.x.hi, &pic.n_cfg);
    pic.cf = cfg ? cfg : &no_cfg; /* out of memory: drawn as no data */
    scale_loss(&pic);
    scale_accuracy(&pic);
    scale_config(&pic);
    pic.final_acc = r->test_accuracy;
    if (!isfinite(pic.final_acc) && r->n_eval)
        pic.final_acc = pic.ev[r->n_eval - 1].test_accuracy;

    document_head(out, r->job);
    titles(out, &pic);
    backgrounds(out, &pic);
    draw_loss(out, &pic);
    draw_accuracy(out, &pic);
    draw_config(out, &pic);
    omv_strbuf_append(out, "</svg>\n", 7);
    free(cfg);
}
