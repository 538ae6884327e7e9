/* Training-step throughput of the gradient engine for the example MLP and CNN: images/s (median
 * of repeats after a warm-up), GFLOP/s achieved in the GEMM-shaped layers, and that as a fraction
 * of a cblas_sgemm peak measured in the same run with the same thread count. Per layer too.
 * Thread use is compared both ways: BLAS threads on the whole batch, and the batch split across
 * threads (one engine each, one BLAS thread each). Prints a table, then all figures as one JSON
 * object on the last line.
 *   bench_net [--reps N] [--rep-seconds S] [--batches 64,256] [--threads 1,2] [--models mlp,cnn]
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "config.h"
#include "model.h"
#include "net.h"
#include "rng.h"
#include "strbuf.h"
#include "util.h"

/* The models of examples/fashion-mlp.ini and examples/fashion-cnn.model. */
static const char *const mlp_text = "input 784\nfc 256\nrelu\nfc 10\n";
static const char *const cnn_text = "input 1x28x28\nconv 32 5x5 pad 2\nrelu\nmaxpool 2\n"
                                    "conv 64 5x5 pad 2\nrelu\nmaxpool 2\nflatten\nfc 256\n"
                                    "relu\nfc 10\n";

#define MAX_REPS 31

static int reps = 7;
static double rep_seconds = 0.5;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* GEMM flops of one layer's training step: forward, weight gradient and (unless it is the
 * first layer) input gradient, each 2 * rows * k * n. */
static double layer_flops(const omv_model_layer_t *l, uint32_t batch, int first)
{
    double rows;
    if (l->kind == OMV_LAYER_FC)
        rows = batch;
    else if (l->kind == OMV_LAYER_CONV)
        rows = (double)batch * l->out.h * l->out.w;
    else
        return 0.0;
    return 2.0 * rows * l->fan_in * l->units * (first ? 2 : 3);
}

/* Median GFLOP/s of square SGEMMs of size n with the current BLAS threads. */
static double sgemm_peak(int n)
{
    size_t len = (size_t)n * n;
    float *a = malloc(len * sizeof(float)), *b = malloc(len * sizeof(float));
    float *c = malloc(len * sizeof(float));
    for (size_t i = 0; i < len; i++)
        a[i] = b[i] = (float)(i % 13) * 0.01f, c[i] = 0.0f;
    double rates[MAX_REPS];
    for (int r = -2; r < reps; r++) {
        double t0 = omv_time_s();
        omv_blas_gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = omv_time_s() - t0;
        if (r >= 0)
            rates[r] = 2.0 * n * n * (double)n / dt / 1e9;
    }
    free(a), free(b), free(c);
    return median(rates, reps);
}

/* One engine and its inputs: a whole batch, or one thread's part of it. */
typedef struct {
    omv_net_t *net;
    const omv_model_layout_t *layout;
    float *params; /* shared, read-only during the step */
    float *grad;   /* [param_count] this part's gradient */
    float *x;
    uint8_t *y;
    uint32_t batch;
    float loss;
    pthread_barrier_t *start, *done;
    volatile int *quit;
} part_t;

static int make_part(part_t *p, const omv_model_layout_t *l, float *params, uint32_t batch,
                     uint64_t seed)
{
    memset(p, 0, sizeof(*p));
    p->layout = l;
    p->params = params;
    p->batch = batch;
    p->net = omv_net_new(l, batch);
    p->grad = malloc(l->param_count * sizeof(float));
    p->x = malloc((size_t)batch * l->inputs * sizeof(float));
    p->y = malloc(batch);
    if (!p->net || !p->grad || !p->x || !p->y)
        return -ENOMEM;
    omv_rng_t rng;
    omv_rng_init(&rng, seed);
    for (size_t i = 0; i < (size_t)batch * l->inputs; i++)
        p->x[i] = (float)omv_rng_uniform(&rng);
    for (uint32_t i = 0; i < batch; i++)
        p->y[i] = (uint8_t)omv_rng_below(&rng, l->classes);
    return 0;
}

static void free_part(part_t *p)
{
    omv_net_destroy(&p->net);
    free(p->grad), free(p->x), free(p->y);
}

static void *part_thread(void *arg)
{
    part_t *p = arg;
    for (;;) {
        pthread_barrier_wait(p->start);
        if (*p->quit)
            return NULL;
        p->loss = omv_net_train_step(p->net, p->params, p->x, p->y, p->batch, p->grad);
        pthread_barrier_wait(p->done);
    }
}

/* SGD with momentum, as the daemon applies it and torch.optim.SGD does. */
static void sgd(float *params, float *vel, const float *grad, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        vel[i] = 0.9f * vel[i] + grad[i];
        params[i] -= 0.01f * vel[i];
    }
}

typedef struct {
    const char *model;
    uint32_t batch;
    int threads;
    const char *mode;
    double images_per_second, gflops, fraction;
    double layer_gflops[OMV_MODEL_MAX_LAYERS], layer_ms[OMV_MODEL_MAX_LAYERS];
} result_t;

/* Runs one case: `split` threads each with batch / split images and one BLAS thread, or one
 * engine with `threads` BLAS threads when split is 1. */
static int run_case(const omv_model_layout_t *l, uint32_t batch, int threads, int split,
                    result_t *res)
{
    size_t n = l->param_count;
    float *params = malloc(n * sizeof(float)), *vel = calloc(n, sizeof(float));
    part_t parts[8];
    pthread_t tids[8];
    pthread_barrier_t start, done;
    volatile int quit = 0;
    int r = 0;
    omv_model_init(l, params, 1);
    omv_blas_set_threads(split > 1 ? 1 : threads);
    for (int i = 0; i < split; i++) {
        r |= make_part(&parts[i], l, params, batch / (uint32_t)split, 7 + (uint64_t)i);
        parts[i].start = &start, parts[i].done = &done, parts[i].quit = &quit;
    }
    if (r < 0 || params == NULL || vel == NULL) {
        fprintf(stderr, "bench_net: out of memory\n");
        exit(1);
    }
    pthread_barrier_init(&start, NULL, (unsigned)split);
    pthread_barrier_init(&done, NULL, (unsigned)split);
    for (int i = 1; i < split; i++)
        pthread_create(&tids[i], NULL, part_thread, &parts[i]);

    /* One step: every part's gradient, their mean, the update. The calling thread is part 0. */
#define STEP()                                                                                     \
    do {                                                                                           \
        if (split > 1)                                                                             \
            pthread_barrier_wait(&start);                                                          \
        omv_net_train_step(parts[0].net, params, parts[0].x, parts[0].y, parts[0].batch,          \
                           parts[0].grad);                                                         \
        if (split > 1) {                                                                           \
            pthread_barrier_wait(&done);                                                           \
            for (int p_ = 1; p_ < split; p_++)                                                     \
                for (size_t i_ = 0; i_ < n; i_++)                                                  \
                    parts[0].grad[i_] += parts[p_].grad[i_];                                       \
            for (size_t i_ = 0; i_ < n; i_++)                                                      \
                parts[0].grad[i_] *= 1.0f / (float)split;                                          \
        }                                                                                          \
        sgd(params, vel, parts[0].grad, n);                                                        \
    } while (0)

    /* Warm-up, which also sizes a repeat to about rep_seconds. */
    double t0 = omv_time_s();
    int warm = 0;
    while (warm < 3 || omv_time_s() - t0 < 0.3) {
        STEP();
        warm++;
    }
    double per_step = (omv_time_s() - t0) / warm;
    int steps = (int)(rep_seconds / per_step);
    steps = steps < 2 ? 2 : steps;
    double rates[MAX_REPS];
    for (int rep = 0; rep < reps; rep++) {
        t0 = omv_time_s();
        for (int s = 0; s < steps; s++)
            STEP();
        rates[rep] = (double)steps * batch / (omv_time_s() - t0);
    }
    res->images_per_second = median(rates, reps);
    double flops = 0.0;
    for (uint32_t i = 0; i < l->n_layers; i++)
        flops += layer_flops(&l->layers[i], batch, i == 0);
    res->gflops = flops * res->images_per_second / batch / 1e9;

    /* Per layer, from the whole-batch engine only (a split step's layers overlap in time). */
    if (split == 1) {
        double secs[OMV_MODEL_MAX_LAYERS] = {0};
        omv_net_profile(parts[0].net, secs);
        for (int s = 0; s < steps; s++)
            STEP();
        omv_net_profile(parts[0].net, NULL);
        for (uint32_t i = 0; i < l->n_layers; i++) {
            res->layer_ms[i] = 1000.0 * secs[i] / steps;
            double f = layer_flops(&l->layers[i], batch, i == 0);
            res->layer_gflops[i] = f > 0 ? f / (secs[i] / steps) / 1e9 : 0.0;
        }
    }
#undef STEP
    quit = 1;
    if (split > 1)
        pthread_barrier_wait(&start);
    for (int i = 1; i < split; i++)
        pthread_join(tids[i], NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&done);
    for (int i = 0; i < split; i++)
        free_part(&parts[i]);
    free(params), free(vel);
    return 0;
}

/* "64,256" into v[cap]; returns the count. */
static int parse_list(const char *s, int *v, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        v[n++] = atoi(s);
        s = strchr(s, ',');
        if (s == NULL)
            break;
        s++;
    }
    return n;
}

int main(int argc, char **argv)
{
    int batches[4] = {64, 256}, n_batches = 2, threads[4] = {1, 2}, n_threads = 2;
    int want_mlp = 1, want_cnn = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rep-seconds") == 0)
            rep_seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--batches") == 0)
            n_batches = parse_list(argv[i + 1], batches, 4);
        else if (strcmp(argv[i], "--threads") == 0)
            n_threads = parse_list(argv[i + 1], threads, 4);
        else if (strcmp(argv[i], "--models") == 0) {
            want_mlp = strstr(argv[i + 1], "mlp") != NULL;
            want_cnn = strstr(argv[i + 1], "cnn") != NULL;
        } else {
            fprintf(stderr, "bench_net: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    const char *env = getenv("OPENBLAS_CORETYPE");
    printf("# bench_net: OPENBLAS_CORETYPE=%s, %d repeats of ~%.1f s, median\n", env ? env : "",
           reps, rep_seconds);
    printf("# blas: %s\n", omv_blas_info());

    omv_strbuf_t json;
    omv_strbuf_init(&json);
    omv_strbuf_printf(&json, "{\"openblas_coretype\":");
    omv_strbuf_json_string(&json, env ? env : "");
    omv_strbuf_printf(&json, ",\"sgemm_peak_gflops\":{");
    double peak[5] = {0};
    for (int t = 0; t < n_threads; t++) {
        omv_blas_set_threads(threads[t]);
        int k = threads[t] < 5 ? threads[t] : 4;
        peak[k] = sgemm_peak(1024);
        printf("sgemm 1024^3, %d thread%s: %.1f GFLOP/s\n", threads[t], threads[t] > 1 ? "s" : "",
               peak[k]);
        omv_strbuf_printf(&json, "%s\"%d\":%.2f", t ? "," : "", threads[t], peak[k]);
    }
    omv_strbuf_printf(&json, "},\"cases\":[");

    printf("\n%-5s %6s %7s %-6s %10s %9s %8s\n", "model", "batch", "threads", "mode", "images/s",
           "GFLOP/s", "of peak");
    const char *names[2] = {"mlp", "cnn"};
    const char *texts[2] = {mlp_text, cnn_text};
    int first_case = 1;
    for (int m = 0; m < 2; m++) {
        if ((m == 0 && !want_mlp) || (m == 1 && !want_cnn))
            continue;
        omv_model_layout_t l;
        char err[OMV_CONFIG_ERR_MAX];
        if (omv_model_parse(&l, texts[m], names[m], err) < 0) {
            fprintf(stderr, "bench_net: %s\n", err);
            return 1;
        }
        for (int b = 0; b < n_batches; b++) {
            for (int t = 0; t < n_threads; t++) {
                for (int split = 1; split <= threads[t]; split += threads[t] > 1 ? threads[t] - 1 : 1) {
                    if (split > 1 && (uint32_t)batches[b] % (uint32_t)split != 0)
                        continue;
                    result_t res = {names[m], (uint32_t)batches[b], threads[t],
                                    split > 1 ? "split" : "blas", 0, 0, 0, {0}, {0}};
                    run_case(&l, (uint32_t)batches[b], threads[t], split, &res);
                    int k = threads[t] < 5 ? threads[t] : 4;
                    res.fraction = res.gflops / peak[k];
                    printf("%-5s %6u %7d %-6s %10.0f %9.1f %7.0f%%\n", res.model, res.batch,
                           res.threads, res.mode, res.images_per_second, res.gflops,
                           100.0 * res.fraction);
                    omv_strbuf_printf(&json,
                                      "%s{\"model\":\"%s\",\"batch\":%u,\"threads\":%d,"
                                      "\"mode\":\"%s\",\"images_per_second\":%.1f,"
                                      "\"gflops\":%.2f,\"peak_fraction\":%.3f,\"layers\":[",
                                      first_case ? "" : ",", res.model, res.batch, res.threads,
                                      res.mode, res.images_per_second, res.gflops, res.fraction);
                    first_case = 0;
                    for (uint32_t i = 0; split == 1 && i < l.n_layers; i++) {
                        const omv_model_layer_t *x = &l.layers[i];
                        const char *kind = omv_model_layer_name(x->kind);
                        if (res.layer_gflops[i] > 0)
                            printf("        layer %-2u %-8s %8.2f ms %9.1f GFLOP/s %5.0f%% of peak\n",
                                   i + 1, kind, res.layer_ms[i], res.layer_gflops[i],
                                   100.0 * res.layer_gflops[i] / peak[k]);
                        else
                            printf("        layer %-2u %-8s %8.2f ms\n", i + 1, kind,
                                   res.layer_ms[i]);
                        omv_strbuf_printf(&json,
                                          "%s{\"layer\":%u,\"kind\":\"%s\",\"ms\":%.3f,"
                                          "\"gflops\":%.2f,\"peak_fraction\":%.3f}",
                                          i ? "," : "", i + 1, kind, res.layer_ms[i],
                                          res.layer_gflops[i], res.layer_gflops[i] / peak[k]);
                    }
                    omv_strbuf_printf(&json, "]}");
                }
            }
        }
    }
    omv_strbuf_printf(&json, "]}");
    printf("%s\n", omv_strbuf_str(&json));
    omv_strbuf_fini(&json);
    return 0;
}
