/* Training-step throughput of the gradient engine for the example MLP and CNN: images/s (median
 * of repeats after a warm-up), GFLOP/s achieved in the GEMM-shaped layers, and that as a fraction
 * of a cblas_sgemm peak measured in the same run with the same thread count. Per layer too.
 * Thread use is compared both ways: BLAS threads on the whole batch (blas), and the engine's
 * batch split across threads, each with its own buffers and one BLAS thread (split). Prints a
 * table, then all figures as one JSON object on the last line. bench_net [--reps N] [--rep-seconds
 * S] [--batches 64,256] [--threads 1,2] [--models mlp,cnn,resnet] [--kernels blas|avx2|avx512]
 * (--kernels: which of the engine's product kernels run, worker/gemm.h; default the best the
 * CPU has).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "config.h"
#include "gemm.h"
#include "model.h"
#include "net.h"
#include "rng.h"
#include "strbuf.h"
#include "util.h"

/* The models of examples/fashion-mlp.ini, examples/fashion-cnn.model and
 * examples/fashion-resnet.model. */
static const char *const mlp_text = "input 784\nfc 256\nrelu\nfc 10\n";
static const char *const cnn_text = "input 1x28x28\nconv 32 5x5 pad 2\nrelu\nmaxpool 2\n"
                                    "conv 64 5x5 pad 2\nrelu\nmaxpool 2\nflatten\nfc 256\n"
                                    "relu\nfc 10\n";
static const char *const resnet_text =
    "input 1x28x28\nconv 16 3x3 pad 1\nbatchnorm\nrelu\nsave a\nconv 16 3x3 pad 1\nbatchnorm\n"
    "relu\nconv 16 3x3 pad 1\nbatchnorm\nadd a\nrelu\nmaxpool 2\nsave b\n"
    "conv 32 3x3 stride 2 pad 1\nbatchnorm\nrelu\nconv 32 3x3 pad 1\nbatchnorm\nadd b\nrelu\n"
    "save c\nconv 32 3x3 pad 1\nbatchnorm\nrelu\nconv 32 3x3 pad 1\nbatchnorm\nadd c\nrelu\n"
    "globalavgpool\nfc 10\n";

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
    else if (l->kind == OMV_LAYER_CONV || (l->kind == OMV_LAYER_ADD && l->w_count))
        rows = (double)batch * l->out.h * l->out.w; /* an add: its 1x1 projection */
    else
        return 0.0;
    return 2.0 * rows * l->fan_in * l->out.c * (first ? 2 : 3);
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

/* Runs one case: the engine on `threads` threads splitting the batch (split, BLAS on one
 * thread), or one engine with `threads` BLAS threads (blas). */
static int run_case(const omv_model_layout_t *l, uint32_t batch, int threads, int split,
                    result_t *res)
{
    size_t n = l->param_count;
    float *params = malloc(n * sizeof(float)), *vel = calloc(n, sizeof(float));
    float *grad = malloc(n * sizeof(float));
    float *x = malloc((size_t)batch * l->inputs * sizeof(float));
    uint8_t *y = malloc(batch);
    omv_blas_set_threads(split ? 1 : threads);
    omv_net_t *net = omv_net_new_threads(l, batch, split ? (uint32_t)threads : 1);
    if (!params || !vel || !grad || !x || !y || !net) {
        fprintf(stderr, "bench_net: out of memory\n");
        exit(1);
    }
    omv_model_init(l, params, 1);
    omv_rng_t rng;
    omv_rng_init(&rng, 7);
    for (size_t i = 0; i < (size_t)batch * l->inputs; i++)
        x[i] = (float)omv_rng_uniform(&rng);
    for (uint32_t i = 0; i < batch; i++)
        y[i] = (uint8_t)omv_rng_below(&rng, l->classes);

    /* Warm-up, which also sizes a repeat to about rep_seconds. */
    double t0 = omv_time_s();
    int warm = 0;
    while (warm < 3 || omv_time_s() - t0 < 0.3) {
        omv_net_train_step(net, params, x, y, batch, grad);
        sgd(params, vel, grad, n);
        warm++;
    }
    double per_step = (omv_time_s() - t0) / warm;
    int steps = (int)(rep_seconds / per_step);
    steps = steps < 2 ? 2 : steps;
    double rates[MAX_REPS];
    for (int rep = 0; rep < reps; rep++) {
        t0 = omv_time_s();
        for (int s = 0; s < steps; s++) {
            omv_net_train_step(net, params, x, y, batch, grad);
            sgd(params, vel, grad, n);
        }
        rates[rep] = (double)steps * batch / (omv_time_s() - t0);
    }
    res->images_per_second = median(rates, reps);
    double flops = 0.0;
    for (uint32_t i = 0; i < l->n_layers; i++)
        flops += layer_flops(&l->layers[i], batch, i == 0);
    res->gflops = flops * res->images_per_second / batch / 1e9;

    /* Per layer: the first thread's part, while the others run theirs at the same time; its
     * rate counts the whole batch. */
    double secs[OMV_MODEL_MAX_LAYERS] = {0};
    omv_net_profile(net, secs);
    for (int s = 0; s < steps; s++)
        omv_net_train_step(net, params, x, y, batch, grad);
    omv_net_profile(net, NULL);
    for (uint32_t i = 0; i < l->n_layers; i++) {
        res->layer_ms[i] = 1000.0 * secs[i] / steps;
        double f = layer_flops(&l->layers[i], batch, i == 0);
        res->layer_gflops[i] = f > 0 && secs[i] > 0 ? f / (secs[i] / steps) / 1e9 : 0.0;
    }
    omv_net_destroy(&net);
    free(params), free(vel), free(grad), free(x), free(y);
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
    int want[3] = {1, 1, 0};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rep-seconds") == 0)
            rep_seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--batches") == 0)
            n_batches = parse_list(argv[i + 1], batches, 4);
        else if (strcmp(argv[i], "--threads") == 0)
            n_threads = parse_list(argv[i + 1], threads, 4);
        else if (strcmp(argv[i], "--kernels") == 0) {
            int k = strcmp(argv[i + 1], "avx512") == 0 ? OMV_GEMM_AVX512
                    : strcmp(argv[i + 1], "avx2") == 0 ? OMV_GEMM_AVX2
                                                       : OMV_GEMM_BLAS;
            if (omv_gemm_use((omv_gemm_kernels_t)k) < 0) {
                fprintf(stderr, "bench_net: no %s kernels on this CPU or build\n", argv[i + 1]);
                return 2;
            }
        } else if (strcmp(argv[i], "--models") == 0) {
            want[0] = strstr(argv[i + 1], "mlp") != NULL;
            want[1] = strstr(argv[i + 1], "cnn") != NULL;
            want[2] = strstr(argv[i + 1], "resnet") != NULL;
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
    /* The convolutions and fully connected layers run in our kernels where they fit
     * (worker/gemm.h): the SGEMM peak below is BLAS's, so a layer may pass 100% of it. */
    printf("# engine kernels: %s\n", omv_gemm_name(omv_gemm_current()));

    omv_strbuf_t json;
    omv_strbuf_init(&json);
    omv_strbuf_printf(&json, "{\"openblas_coretype\":");
    omv_strbuf_json_string(&json, env ? env : "");
    omv_strbuf_printf(&json, ",\"engine_kernels\":\"%s\",\"sgemm_peak_gflops\":{",
                      omv_gemm_name(omv_gemm_current()));
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

    printf("\n%-6s %6s %7s %-6s %10s %9s %8s\n", "model", "batch", "threads", "mode", "images/s",
           "GFLOP/s", "of peak");
    const char *names[3] = {"mlp", "cnn", "resnet"};
    const char *texts[3] = {mlp_text, cnn_text, resnet_text};
    int first_case = 1;
    for (int m = 0; m < 3; m++) {
        if (!want[m])
            continue;
        omv_model_layout_t l;
        char err[OMV_CONFIG_ERR_MAX];
        if (omv_model_parse(&l, texts[m], names[m], err) < 0) {
            fprintf(stderr, "bench_net: %s\n", err);
            return 1;
        }
        for (int b = 0; b < n_batches; b++) {
            for (int t = 0; t < n_threads; t++) {
                /* One thread: both modes are the same. */
                for (int split = 0; split <= (threads[t] > 1); split++) {
                    result_t res = {names[m],   (uint32_t)batches[b],
                                    threads[t], split ? "split" : "blas",
                                    0,          0,
                                    0,          {0},
                                    {0}};
                    run_case(&l, (uint32_t)batches[b], threads[t], split, &res);
                    int k = threads[t] < 5 ? threads[t] : 4;
                    res.fraction = res.gflops / peak[k];
                    printf("%-6s %6u %7d %-6s %10.0f %9.1f %7.0f%%\n", res.model, res.batch,
                           res.threads, res.mode, res.images_per_second, res.gflops,
                           100.0 * res.fraction);
                    omv_strbuf_printf(&json,
                                      "%s{\"model\":\"%s\",\"batch\":%u,\"threads\":%d,"
                                      "\"mode\":\"%s\",\"images_per_second\":%.1f,"
                                      "\"gflops\":%.2f,\"peak_fraction\":%.3f,\"layers\":[",
                                      first_case ? "" : ",", res.model, res.batch, res.threads,
                                      res.mode, res.images_per_second, res.gflops, res.fraction);
                    first_case = 0;
                    for (uint32_t i = 0; i < l.n_layers; i++) {
                        const omv_model_layer_t *x = &l.layers[i];
                        const char *kind = omv_model_layer_name(x->kind);
                        if (res.layer_gflops[i] > 0)
                            printf(
                                "        layer %-2u %-8s %8.2f ms %9.1f GFLOP/s %5.0f%% of peak\n",
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
