/* The training report: reading the daemon's history, the CSV and the SVG (well-formed, one
 * polyline per series with one vertex per point, empty panels, escaping), writing the files,
 * and the daemon's timeline behind it (a point per interval, bounded, the changes, its JSON). */
#include <check.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "timeline.h"
#include "report.h"
#include "testutil.h"

/* ---- helpers ---- */

static int count_text(const char *s, const char *text)
{
    int n = 0;
    for (const char *p = strstr(s, text); p; p = strstr(p + 1, text))
        n++;
    return n;
}

static int has_text(const char *s, const char *text)
{
    return strstr(s, text) != NULL;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Line `index` (from 0) of text into out[cap]. */
static void line_of(const char *text, int index, char *out, size_t cap)
{
    const char *p = text;
    for (int i = 0; i < index && p; i++) {
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    ck_assert_ptr_nonnull(p);
    size_t n = strcspn(p, "\n");
    ck_assert_uint_lt(n, cap);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* Field `index` of a CSV line without quotes into out[cap]; returns the number of fields. */
static int csv_field(const char *line, int index, char *out, size_t cap)
{
    int n = 0;
    out[0] = '\0';
    for (const char *p = line;; n++) {
        size_t len = strcspn(p, ",");
        if (n == index) {
            ck_assert_uint_lt(len, cap);
            memcpy(out, p, len);
            out[len] = '\0';
        }
        if (p[len] == '\0')
            return n + 1;
        p += len + 1;
    }
}

/* A small XML check: starts with <svg, ends with </svg>, every tag closed in order, every '&'
 * an entity, no '<' inside an attribute. Returns the number of elements. */
static int check_xml(const char *s)
{
    ck_assert_msg(strncmp(s, "<svg", 4) == 0, "does not start with <svg: %.40s", s);
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == ' '))
        len--;
    ck_assert_msg(len >= 6 && strncmp(s + len - 6, "</svg>", 6) == 0, "does not end with </svg>");
    char stack[64][32];
    int depth = 0, elements = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '&') {
            ck_assert_msg(strncmp(p, "&amp;", 5) == 0 || strncmp(p, "&lt;", 4) == 0 ||
                              strncmp(p, "&gt;", 4) == 0 || strncmp(p, "&quot;", 6) == 0 ||
                              strncmp(p, "&apos;", 6) == 0,
                          "a bare '&': %.30s", p);
            continue;
        }
        if (*p != '<')
            continue;
        const char *end = strchr(p, '>');
        ck_assert_msg(end != NULL, "tag not closed: %.30s", p);
        int quoted = 0;
        for (const char *q = p + 1; q < end; q++) {
            ck_assert_msg(*q != '<', "'<' inside a tag: %.40s", p);
            quoted ^= *q == '"';
        }
        ck_assert_msg(!quoted, "unbalanced quotes: %.60s", p);
        char name[32];
        int closing = p[1] == '/';
        size_t n = strcspn(p + 1 + closing, " \t\n/>");
        ck_assert_uint_lt(n, sizeof(name));
        ck_assert_uint_gt(n, 0);
        memcpy(name, p + 1 + closing, n);
        name[n] = '\0';
        if (closing) {
            ck_assert_msg(depth > 0, "</%s> without an opening tag", name);
            depth--;
            ck_assert_msg(strcmp(stack[depth], name) == 0, "</%s> closes <%s>", name, stack[depth]);
        } else if (end[-1] != '/') {
            ck_assert_int_lt(depth, 64);
            strcpy(stack[depth++], name);
            elements++;
        } else {
            elements++;
        }
        p = end;
    }
    ck_assert_msg(depth == 0, "<%s> not closed", depth ? stack[depth - 1] : "");
    return elements;
}

/* The number of vertices of the polyline of series id; -1 when there is none (and never two). */
static int polyline_points(const char *svg, const char *id)
{
    char pat[96];
    snprintf(pat, sizeof(pat), "<polyline id=\"series-%s\"", id);
    const char *p = strstr(svg, pat);
    if (p == NULL)
        return -1;
    ck_assert_msg(strstr(p + 1, pat) == NULL, "two polylines for %s", id);
    p = strstr(p, " points=\"");
    ck_assert_ptr_nonnull(p);
    p += 9;
    int n = 0;
    while (*p != '"') {
        double x, y;
        int used = 0;
        ck_assert_msg(sscanf(p, "%lf,%lf %n", &x, &y, &used) == 2 && used > 0,
                      "bad vertex in %s: %.30s", id, p);
        ck_assert(x >= 0 && x <= 960 && y >= 0 && y <= 840);
        p += used;
        n++;
    }
    return n;
}

static omv_report_train_t train_point(double wall, double loss, double groups, double momentum,
                                      double lr, int probing)
{
    return (omv_report_train_t){wall, wall / 10, wall * 10, wall * 640, loss,
                                640,  groups,    momentum,  lr,         probing};
}

/* A known history: 6 training points (one without a loss), 3 evaluations, 4 changes. */
static omv_report_train_t g_train[6];
static omv_report_eval_t g_eval[3];
static omv_report_change_t g_config[4];

static void known(omv_report_t *r)
{
    omv_report_init(r);
    snprintf(r->job, sizeof(r->job), "blobs");
    snprintf(r->state, sizeof(r->state), "done");
    r->test_accuracy = 0.9375;
    r->wall_s = 6;
    g_train[0] = train_point(1, 2.25, 1, 0.9, 0.01, 0);
    g_train[1] = train_point(2, 1.5, 1, 0.9, 0.01, 1);
    g_train[2] = train_point(3, NAN, 2, 0.6, 0.1, 1);
    g_train[3] = train_point(4, 0.75, 2, 0.3, 0.1, 0);
    g_train[4] = train_point(5, 0.5, 2, 0.3, 0.01, 0);
    g_train[5] = train_point(6, 0.123456789, 2, 0.3, 0.01, 0);
    g_train[5].step = 1234567;
    g_eval[0] = (omv_report_eval_t){2.5, 0.25, 0.5, 1.2};
    g_eval[1] = (omv_report_eval_t){4.5, 0.45, 0.875, 0.6};
    g_eval[2] = (omv_report_eval_t){6, 0.6, 0.9375, 0.4};
    g_config[0] = (omv_report_change_t){0, 0, 0, 1, 0.9, 0.01, 0, "start"};
    g_config[1] = (omv_report_change_t){1.5, 0.15, 15, 2, 0.6, 0.1, 1, "optimizer"};
    g_config[2] = (omv_report_change_t){3.5, 0.35, 35, 2, 0.3, 0.1, 0, "optimizer"};
    g_config[3] = (omv_report_change_t){4.5, 0.45, 45, 2, 0.3, 0.01, 0, "regroup, by \"hand\""};
    r->train = g_train;
    r->n_train = 6;
    r->eval = g_eval;
    r->n_eval = 3;
    r->config = g_config;
    r->n_config = 4;
}

/* ---- CSV ---- */

START_TEST(test_csv_rows_and_fields)
{
    omv_report_t r;
    known(&r);
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_report_csv(&r, &out);
    const char *csv = omv_strbuf_str(&out);
    ck_assert_int_eq(count_lines(csv), 1 + 6 + 3 + 4);
    char line[512], f[128];
    line_of(csv, 0, line, sizeof(line));
    ck_assert_str_eq(line, "kind,wall_s,epoch,step,images,train_loss,images_per_s,test_loss,"
                           "test_accuracy,groups,momentum,learning_rate,probing,cause");
    /* In order of time; at equal times the change comes before the evaluation. */
    const char *kinds[] = {"config", "train",  "config", "train", "eval",  "train", "config",
                           "train",  "config", "eval",   "train", "train", "eval"};
    double last = -1;
    for (int i = 0; i < 13; i++) {
        line_of(csv, i + 1, line, sizeof(line));
        ck_assert_msg(csv_field(line, 0, f, sizeof(f)) == 14 || i == 8, "%s", line);
        ck_assert_msg(strcmp(f, kinds[i]) == 0, "row %d is %s, not %s", i + 1, f, kinds[i]);
        csv_field(line, 1, f, sizeof(f));
        ck_assert_msg(atof(f) >= last, "out of order: %s", line);
        last = atof(f);
    }
    /* A training row: integers without a point, others with six digits; a probe flag. */
    line_of(csv, 2, line, sizeof(line));
    ck_assert_str_eq(line, "train,1,0.1,10,640,2.25,640,,,1,0.9,0.01,0,");
    line_of(csv, 4, line, sizeof(line));
    ck_assert_str_eq(line, "train,2,0.2,20,1280,1.5,640,,,1,0.9,0.01,1,");
    /* No loss in the interval: an empty field, not "nan". */
    line_of(csv, 6, line, sizeof(line));
    ck_assert_str_eq(line, "train,3,0.3,30,1920,,640,,,2,0.6,0.1,1,");
    line_of(csv, 12, line, sizeof(line));
    ck_assert_str_eq(line, "train,6,0.6,1234567,3840,0.123457,640,,,2,0.3,0.01,0,");
    /* Evaluations fill only their own columns. */
    line_of(csv, 5, line, sizeof(line));
    ck_assert_str_eq(line, "eval,2.5,0.25,,,,,1.2,0.5,,,,,");
    /* A change, and a cause that needs quotes. */
    line_of(csv, 3, line, sizeof(line));
    ck_assert_str_eq(line, "config,1.5,0.15,15,,,,,,2,0.6,0.1,1,optimizer");
    line_of(csv, 9, line, sizeof(line));
    ck_assert_str_eq(line, "config,4.5,0.45,45,,,,,,2,0.3,0.01,0,\"regroup, by \"\"hand\"\"\"");
    ck_assert(!strstr(csv, "nan") && !strstr(csv, "inf"));
    omv_strbuf_fini(&out);
}
END_TEST

START_TEST(test_csv_empty_and_locale)
{
    omv_report_t r;
    omv_report_init(&r);
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_report_csv(&r, &out);
    ck_assert_int_eq(count_lines(omv_strbuf_str(&out)), 1);
    /* A locale whose decimal point is a comma must not leak into the file. */
    const char *locales[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "nl_NL.UTF-8"};
    const char *got = NULL;
    for (size_t i = 0; i < sizeof(locales) / sizeof(locales[0]) && !got; i++)
        got = setlocale(LC_NUMERIC, locales[i]);
    if (got == NULL) {
        printf("test_csv_empty_and_locale: no locale with a decimal comma is installed; the "
               "locale part is not checked\n");
    } else {
        known(&r);
        omv_strbuf_clear(&out);
        omv_report_csv(&r, &out);
        char line[512];
        line_of(omv_strbuf_str(&out), 2, line, sizeof(line));
        ck_assert_str_eq(line, "train,1,0.1,10,640,2.25,640,,,1,0.9,0.01,0,");
        omv_strbuf_clear(&out);
        omv_report_svg(&r, &out);
        ck_assert_int_eq(polyline_points(omv_strbuf_str(&out), "train_loss"), 5);
        omv_report_t back;
        omv_report_init(&back);
        char err[128];
        ck_assert_int_eq(omv_report_parse(&back, "{\"wall_seconds\":1.5}", err, sizeof(err)), 0);
        ck_assert(back.wall_s == 1.5);
        setlocale(LC_NUMERIC, "C");
    }
    omv_strbuf_fini(&out);
}
END_TEST

/* ---- SVG ---- */

START_TEST(test_svg_series)
{
    omv_report_t r;
    known(&r);
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_report_svg(&r, &out);
    const char *svg = omv_strbuf_str(&out);
    ck_assert_int_gt(check_xml(svg), 50);
    /* One vertex per point that has the value. */
    ck_assert_int_eq(polyline_points(svg, "train_loss"), 5);
    ck_assert_int_eq(polyline_points(svg, "test_loss"), 3);
    ck_assert_int_eq(polyline_points(svg, "test_accuracy"), 3);
    ck_assert_int_eq(count_text(svg, "<circle"), 3 + 3 + 2 /* the legend's */);
    /* Step plots: two vertices per level (its start and where it ends). Groups: 1 then 2;
     * momentum 0.9, 0.6, 0.3; learning rate 0.01, 0.1, 0.01. */
    ck_assert_int_eq(polyline_points(svg, "groups"), 4);
    ck_assert_int_eq(polyline_points(svg, "momentum"), 6);
    ck_assert_int_eq(polyline_points(svg, "learning_rate"), 6);
    ck_assert_int_eq(count_text(svg, "<polyline"), 6);
    /* The probe (changes 1 to 2) shaded in each of the five panels, and in the legend. */
    ck_assert_int_eq(count_text(svg, "<rect class=\"probe\""), 5 + 1);
    ck_assert_int_eq(count_text(svg, "no data yet"), 0);
    ck_assert_msg(has_text(svg, "final test accuracy 0.9375"), "no final accuracy in the title");
    ck_assert(has_text(svg, "learning rate (log scale)"));
    ck_assert(has_text(svg, ">0.01</text>") && has_text(svg, ">0.1</text>"));
    ck_assert(has_text(svg, "training time (s)"));
    ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));

    /* Without changes, the configuration comes from the training points. */
    r.n_config = 0;
    omv_strbuf_clear(&out);
    omv_report_svg(&r, &out);
    svg = omv_strbuf_str(&out);
    check_xml(svg);
    ck_assert_int_eq(polyline_points(svg, "groups"), 4);
    ck_assert_int_eq(polyline_points(svg, "momentum"), 6);
    ck_assert_int_eq(polyline_points(svg, "learning_rate"), 6);
    ck_assert_int_eq(count_text(svg, "<rect class=\"probe\""), 5 + 1);

    /* A long job is labelled in hours. */
    for (int i = 0; i < 6; i++)
        g_train[i].wall_s *= 7200;
    for (int i = 0; i < 3; i++)
        g_eval[i].wall_s *= 7200;
    r.wall_s *= 7200;
    omv_strbuf_clear(&out);
    omv_report_svg(&r, &out);
    ck_assert(has_text(omv_strbuf_str(&out), "training time (h)"));
    omv_strbuf_fini(&out);
}
END_TEST

START_TEST(test_svg_no_data)
{
    /* Nothing yet: five panels that say so, no line, nothing divided by zero. */
    omv_report_t r;
    omv_report_init(&r);
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_report_svg(&r, &out);
    const char *svg = omv_strbuf_str(&out);
    check_xml(svg);
    ck_assert_int_eq(count_text(svg, "no data yet"), 5);
    ck_assert_int_eq(count_text(svg, "<polyline"), 0);
    ck_assert(has_text(svg, "final test accuracy (none yet)"));
    ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));

    /* One point of each: drawn as a dot, the axes still sensible. */
    omv_report_train_t t = train_point(0, 1.0, 1, 0.9, 0.01, 0);
    omv_report_eval_t e = {0, 0, 0.5, 1.0};
    r.train = &t;
    r.n_train = 1;
    r.eval = &e;
    r.n_eval = 1;
    omv_strbuf_clear(&out);
    omv_report_svg(&r, &out);
    svg = omv_strbuf_str(&out);
    check_xml(svg);
    ck_assert_int_eq(count_text(svg, "no data yet"), 0);
    ck_assert_int_eq(polyline_points(svg, "train_loss"), 1);
    ck_assert_int_eq(polyline_points(svg, "test_accuracy"), 1);
    ck_assert_int_eq(polyline_points(svg, "groups"), 2);
    ck_assert_int_eq(count_text(svg, "<g id=\"dots-train_loss\""), 1);
    ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));

    /* Values that cannot be drawn (NaN, infinite, a learning rate of 0 on a log axis). */
    t.train_loss = INFINITY;
    t.learning_rate = 0;
    e.wall_s = NAN;
    e.test_accuracy = NAN;
    e.test_loss = NAN;
    omv_strbuf_clear(&out);
    omv_report_svg(&r, &out);
    svg = omv_strbuf_str(&out);
    check_xml(svg);
    ck_assert_int_eq(count_text(svg, "no data yet"), 3); /* loss, accuracy, learning rate */
    ck_assert(!strstr(svg, "nan") && !strstr(svg, "inf"));
    omv_strbuf_fini(&out);
}
END_TEST

START_TEST(test_escaping)
{
    omv_report_t r;
    known(&r);
    snprintf(r.job, sizeof(r.job), "a<b&c \"d\" \x01 \xff");
    snprintf(r.state, sizeof(r.state), "<done>");
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_report_svg(&r, &out);
    const char *svg = omv_strbuf_str(&out);
    check_xml(svg);
    ck_assert_msg(has_text(svg, "a&lt;b&amp;c &quot;d&quot; ? ?"), "job name not escaped");
    ck_assert(!has_text(svg, "a<b"));
    ck_assert(has_text(svg, "&lt;done&gt;"));
    char base[300];
    omv_report_default_base("a<b&c", base, sizeof(base));
    ck_assert_str_eq(base, "omnivore-report-a_b_c");
    omv_report_default_base("../x y", base, sizeof(base));
    ck_assert_str_eq(base, "omnivore-report-.._x_y");
    omv_strbuf_fini(&out);
}
END_TEST

/* ---- reading the daemon's JSON ---- */

START_TEST(test_parse)
{
    const char *json =
        "{\"job\":\"a\\u003cb\\\"c\",\"state\":\"running\",\"test_accuracy\":null,"
        "\"wall_seconds\":12.5,\"future_key\":{\"x\":[1,2,{\"y\":null}]},"
        "\"train\":[{\"wall_seconds\":1.0,\"epoch\":0.1,\"step\":10,\"images\":640,"
        "\"train_loss\":null,\"images_per_second\":640.5,\"groups\":2,\"momentum\":0.3,"
        "\"learning_rate\":1e-3,\"probing\":true,\"new\":\"x\"},{\"wall_seconds\":2}],"
        "\"eval\":[],"
        "\"config\":[{\"wall_seconds\":0,\"groups\":1,\"cause\":\"start\",\"probing\":false}],"
        "\"phases\":[{\"phase\":1,\"groups\":2,\"momentum\":0.3,\"learning_rate\":0.01,"
        "\"epoch\":0.5}]}\n";
    omv_report_t r;
    omv_report_init(&r);
    char err[256] = "";
    ck_assert_int_eq(omv_report_parse(&r, json, err, sizeof(err)), 0);
    ck_assert_str_eq(r.job, "a<b\"c");
    ck_assert_str_eq(r.state, "running");
    ck_assert(isnan(r.test_accuracy));
    ck_assert(r.wall_s == 12.5);
    ck_assert_uint_eq(r.n_train, 2);
    ck_assert(r.train[0].wall_s == 1.0 && r.train[0].step == 10 && r.train[0].images == 640);
    ck_assert(isnan(r.train[0].train_loss));
    ck_assert(r.train[0].images_per_s == 640.5 && r.train[0].learning_rate == 1e-3);
    ck_assert_int_eq(r.train[0].probing, 1);
    /* Keys a point does not have are NaN (empty in the CSV). */
    ck_assert(r.train[1].wall_s == 2 && isnan(r.train[1].epoch) && isnan(r.train[1].groups));
    ck_assert_int_eq(r.train[1].probing, 0);
    ck_assert_uint_eq(r.n_eval, 0);
    ck_assert_uint_eq(r.n_config, 1);
    ck_assert_str_eq(r.config[0].cause, "start");
    ck_assert(isnan(r.config[0].momentum));
    ck_assert_uint_eq(r.n_phases, 1);
    ck_assert(r.phases[0].epoch == 0.5);

    /* What is not that JSON is refused with a reason, and leaves the report empty. */
    const char *bad[] = {"",
                         "[]",
                         "{\"train\":[{\"wall_seconds\":}]}",
                         "{\"train\":{}}",
                         "{\"job\":\"x\"",
                         "{\"job\":\"x\"} trailing",
                         "{\"a\":tru}",
                         "{\"train\":[{\"wall_seconds\":1,}]}",
                         "{\"job\":\"\\q\"}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(omv_report_parse(&r, bad[i], err, sizeof(err)) == -EPROTO, "%s", bad[i]);
        ck_assert_msg(err[0] != '\0', "no reason for %s", bad[i]);
        ck_assert_uint_eq(r.n_train, 0);
        ck_assert_ptr_null(r.train);
    }
    /* Nesting is bounded. */
    char deep[200] = "{\"x\":";
    for (int i = 0; i < 60; i++)
        strcat(deep, "[");
    ck_assert_int_eq(omv_report_parse(&r, deep, err, sizeof(err)), -EPROTO);
    omv_report_fini(&r);
}
END_TEST

/* ---- files ---- */

START_TEST(test_write_files)
{
    char dir[512], sub[600], csv[700], svg[700], err[256];
    omv_test_tmpdir(dir, sizeof(dir));
    snprintf(sub, sizeof(sub), "%s/reports/today", dir);
    omv_report_t r;
    known(&r);
    ck_assert_int_eq(omv_report_write(&r, sub, "run1", csv, svg, sizeof(csv), err, sizeof(err)), 0);
    char want[700];
    snprintf(want, sizeof(want), "%s/run1.csv", sub);
    ck_assert_str_eq(csv, want);
    snprintf(want, sizeof(want), "%s/run1.svg", sub);
    ck_assert_str_eq(svg, want);
    struct stat st;
    ck_assert_int_eq(stat(csv, &st), 0);
    ck_assert_int_gt(st.st_size, 100);
    ck_assert_int_eq(stat(svg, &st), 0);
    ck_assert_int_gt(st.st_size, 1000);
    snprintf(want, sizeof(want), "%s/run1.svg.tmp", sub);
    ck_assert_int_ne(stat(want, &st), 0);
    ck_assert_int_eq(omv_report_write(&r, sub, "a/b", csv, svg, sizeof(csv), err, sizeof(err)),
                     -EINVAL);
    /* A folder that cannot be made: the error says which. */
    char file[700];
    snprintf(file, sizeof(file), "%s", csv);
    snprintf(sub, sizeof(sub), "%s/x", file);
    ck_assert_int_lt(omv_report_write(&r, sub, "b", csv, svg, sizeof(csv), err, sizeof(err)), 0);
    ck_assert_msg(strstr(err, "cannot make the folder") != NULL, "%s", err);
    omv_test_rmdir(dir);
}
END_TEST

/* ---- the daemon's timeline ---- */

/* Just what the timeline is fed, at `t` seconds of training. */
typedef struct {
    double t;
    uint64_t images_total, steps_total;
    float momentum, learning_rate;
    omv_timeline_t tl;
} fake_run_t;

static fake_run_t *fake_run(void)
{
    fake_run_t *d = calloc(1, sizeof(*d));
    ck_assert_ptr_nonnull(d);
    d->learning_rate = 0.01f;
    d->momentum = 0.9f;
    omv_timeline_init(&d->tl);
    return d;
}

static omv_timeline_now_t now_of(const fake_run_t *d)
{
    return (omv_timeline_now_t){.train_s = d->t,
                                .epoch = (double)d->images_total / 1000.0,
                                .steps_total = d->steps_total,
                                .images_total = d->images_total,
                                .images_seen = d->images_total,
                                .groups = 1,
                                .momentum = d->momentum,
                                .learning_rate = d->learning_rate};
}

static void at(fake_run_t *d, double t)
{
    d->t = t;
}

static void tick(fake_run_t *d)
{
    omv_timeline_now_t n = now_of(d);
    omv_timeline_tick(&d->tl, &n);
}

static void config(fake_run_t *d, const char *cause)
{
    omv_timeline_now_t n = now_of(d);
    omv_timeline_config(&d->tl, &n, cause);
}

static void end(fake_run_t *d)
{
    omv_timeline_now_t n = now_of(d);
    omv_timeline_end(&d->tl, &n);
}

static void start(fake_run_t *d)
{
    omv_timeline_now_t n = now_of(d);
    omv_timeline_start(&d->tl, &n);
}

static void free_run(fake_run_t *d)
{
    omv_timeline_fini(&d->tl);
    free(d);
}

START_TEST(test_timeline)
{
    fake_run_t *d = fake_run();
    start(d);
    ck_assert_uint_eq(d->tl.n_changes, 1);
    /* Ten seconds of training ticked every 0.1 s: a point a second, with the interval's loss
     * and images. */
    for (int i = 1; i <= 100; i++) {
        at(d, i / 10.0); /* whole seconds exactly */
        d->images_total += 64;
        d->steps_total++;
        omv_timeline_loss(&d->tl, 2.0);
        omv_timeline_loss(&d->tl, 1.0);
        if (i == 55) {
            d->learning_rate = 0.001f;
            config(d, "regroup");
            config(d, "regroup"); /* nothing changed since */
        }
        tick(d);
    }
    const omv_timeline_t *tl = &d->tl;
    ck_assert_uint_eq(tl->n_points, 10);
    ck_assert_uint_eq(tl->n_changes, 2);
    ck_assert_str_eq(tl->changes[1].cause, "regroup");
    ck_assert(fabs(tl->changes[1].wall_s - 5.5) < 1e-6);
    for (size_t i = 0; i < tl->n_points; i++) {
        ck_assert(fabs(tl->points[i].wall_s - (double)(i + 1)) < 1e-6);
        ck_assert_uint_eq(tl->points[i].loss_n, 20);
        ck_assert(fabs(tl->points[i].loss_sum / 20 - 1.5) < 1e-9);
        ck_assert(fabs(tl->points[i].images_per_s - 640) < 1e-6);
    }
    ck_assert(tl->points[4].learning_rate > 0.009 && tl->points[5].learning_rate < 0.002);
    /* The end adds the last bit, once. */
    at(d, 10.5);
    d->images_total += 32;
    end(d);
    end(d);
    ck_assert_uint_eq(tl->n_points, 11);
    ck_assert(fabs(tl->points[10].images_per_s - 64) < 1e-6);
    ck_assert_uint_eq(tl->points[10].loss_n, 0);

    /* Its JSON is what the report reads. */
    omv_eval_t ev;
    omv_eval_init(&ev, 0.5);
    ck_assert_int_eq(omv_eval_add(&ev, 0.5, 10.5, 0.875, 0.25), 0);
    omv_timeline_head_t head = {"fake", "running", 0.875, d->t, 0.5, &ev, NULL};
    omv_strbuf_t out;
    omv_strbuf_init(&out);
    omv_timeline_report(&d->tl, &head, &out, 1);
    omv_report_t r;
    omv_report_init(&r);
    char err[256];
    ck_assert_msg(omv_report_parse(&r, omv_strbuf_str(&out), err, sizeof(err)) == 0, "%s: %s", err,
                  omv_strbuf_str(&out));
    ck_assert_str_eq(r.job, "fake");
    ck_assert_str_eq(r.state, "running");
    ck_assert(r.test_accuracy == 0.875);
    ck_assert_uint_eq(r.n_train, 11);
    ck_assert_uint_eq(r.n_eval, 1);
    ck_assert_uint_eq(r.n_config, 2);
    ck_assert(r.train[0].train_loss == 1.5 && r.train[0].step == 10 && r.train[0].images == 640);
    ck_assert(isnan(r.train[10].train_loss));
    ck_assert(r.train[0].momentum == 0.9 && r.train[0].groups == 1);
    ck_assert(r.eval[0].test_accuracy == 0.875 && r.eval[0].wall_s == 10.5);
    ck_assert_str_eq(r.config[1].cause, "regroup");
    ck_assert(r.config[1].learning_rate == 0.001);
    omv_report_fini(&r);
    /* And the people's form has a line per point. */
    omv_strbuf_clear(&out);
    omv_timeline_report(&d->tl, &head, &out, 0);
    ck_assert_msg(has_text(omv_strbuf_str(&out), "\ntrain_points:11\n") &&
                      has_text(omv_strbuf_str(&out), "\ntrain_11:wall_seconds=10.5 ") &&
                      has_text(omv_strbuf_str(&out), "\nchange_2:wall_seconds=5.5 "),
                  "%s", omv_strbuf_str(&out));
    omv_strbuf_fini(&out);
    omv_eval_fini(&ev);

    /* Reset empties it for the next job. */
    omv_timeline_fini(&d->tl);
    ck_assert_uint_eq(tl->n_points, 0);
    ck_assert_ptr_null(tl->points);
    end(d); /* never started: nothing */
    ck_assert_uint_eq(tl->n_points, 0);
    free_run(d);
}
END_TEST

START_TEST(test_timeline_bounded)
{
    /* A long job: the points never pass the bound; each thinning halves them and doubles the
     * interval, and merged points keep the totals (images, losses) of what they cover. */
    fake_run_t *d = fake_run();
    start(d);
    double t = 0;
    uint64_t losses = 0;
    for (int i = 0; i < 3 * OMV_TIMELINE_MAX_POINTS; i++) {
        t += 1.0;
        at(d, t);
        d->images_total += 100;
        d->steps_total++;
        omv_timeline_loss(&d->tl, 1.0);
        losses++;
        tick(d);
        ck_assert_uint_lt(d->tl.n_points, OMV_TIMELINE_MAX_POINTS);
    }
    const omv_timeline_t *tl = &d->tl;
    ck_assert(tl->interval_s == 4.0);
    ck_assert_uint_ge(tl->n_points, OMV_TIMELINE_MAX_POINTS / 2);
    double images = 0, last = 0;
    uint64_t n = 0;
    for (size_t i = 0; i < tl->n_points; i++) {
        const omv_timeline_point_t *p = &tl->points[i];
        ck_assert(p->wall_s > last);
        last = p->wall_s;
        images += p->images_per_s * p->span_s;
        n += p->loss_n;
        ck_assert(fabs(p->images_per_s - 100) < 1e-6);
    }
    ck_assert(fabs(images + (double)(d->images_total - tl->last_images) - (double)d->images_total) <
              1e-3);
    ck_assert_uint_eq(n + tl->loss_n, losses);
    ck_assert(fabs(tl->points[tl->n_points - 1].wall_s - tl->last_s) < 1e-9);

    /* Changes are bounded too: the oldest are let go of and counted. */
    for (int i = 0; i < OMV_TIMELINE_MAX_CHANGES + 10; i++) {
        d->momentum = i % 2 ? 0.9f : 0.3f;
        config(d, "optimizer");
    }
    ck_assert_uint_le(tl->n_changes, OMV_TIMELINE_MAX_CHANGES);
    ck_assert_uint_gt(tl->changes_dropped, 0);
    ck_assert_uint_eq(tl->n_changes + tl->changes_dropped, OMV_TIMELINE_MAX_CHANGES + 10 + 1);
    free_run(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("report");
    tcase_add_test(tc, test_csv_rows_and_fields);
    tcase_add_test(tc, test_csv_empty_and_locale);
    tcase_add_test(tc, test_svg_series);
    tcase_add_test(tc, test_svg_no_data);
    tcase_add_test(tc, test_escaping);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_write_files);
    suite_add_tcase(s, tc);
    TCase *tl = tcase_create("timeline");
    tcase_add_test(tl, test_timeline);
    tcase_add_test(tl, test_timeline_bounded);
    suite_add_tcase(s, tl);
    return omv_test_run(s);
}
