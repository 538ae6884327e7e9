/* Single-process reference: the worker's MLP engine and the daemon's SGD update in one loop,
 * no network. What omnivore's distributed run is measured against. Prints a table, then all
 * figures as one JSON object on the last line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "dataset.h"
#include "net.h"
#include "rng.h"
#include "shard.h"
#include "util.h"

#define FMNIST "/usr/share/datasets/fashion-mnist/"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 400;
    char err[OMV_CONFIG_ERR_MAX];
    omv_dataset_t data;
    if (omv_dataset_load(&data, FMNIST "train-images-idx3-ubyte.gz",
                         FMNIST "train-labels-idx1-ubyte.gz", 0, 0, err) < 0) {
        fprintf(stderr, "bench_local: %s (install dataset-fashion-mnist)\n", err);
        return 1;
    }
    const uint32_t widths[] = {784, 256, 10};
    const uint32_t batches[] = {32, 64, 256};
    omv_blas_set_threads(1);
    printf("%-8s %-8s %12s %10s\n", "model", "batch", "images/s", "ms/step");
    char json[2048];
    size_t jl = (size_t)snprintf(json, sizeof(json), "{\"threads\":1,\"cases\":[");
    for (size_t bi = 0; bi < OMV_ARRAY_SIZE(batches); bi++) {
        uint32_t b = batches[bi];
        omv_model_layout_t layout;
        omv_model_layout(&layout, widths, 3);
        omv_net_t *mlp = omv_net_new(&layout, b);
        const omv_model_layout_t *l = omv_net_layout(mlp);
        float *params = malloc(l->param_count * sizeof(float));
        float *grad = malloc(l->param_count * sizeof(float));
        float *x = malloc((size_t)b * 784 * sizeof(float));
        uint8_t *y = malloc(b);
        omv_model_init(l, params, 1);
        omv_shard_t shard;
        omv_shard_init(&shard, params, 0, (uint32_t)l->param_count, 1);
        omv_sgd_t sgd = {.learning_rate = 0.01f, .momentum = 0.9f};
        omv_rng_t rng;
        omv_rng_init(&rng, 3);
        /* 5 repeats of `steps` steps after a warm-up; the median repeat counts. */
        double rates[5];
        for (int rep = -1; rep < 5; rep++) {
            double t0 = omv_time_s();
            for (int s = 0; s < steps; s++) {
                for (uint32_t i = 0; i < b; i++) {
                    uint32_t k = omv_rng_below(&rng, data.count);
                    for (uint32_t p = 0; p < 784; p++)
                        x[i * 784 + p] = data.pixels[(size_t)k * 784 + p] * (1.0f / 255.0f);
                    y[i] = data.labels[k];
                }
                omv_net_train_step(mlp, params, x, y, b, grad);
                omv_shard_accumulate(&shard, 0, grad);
                omv_shard_apply(&shard, 0, 1, &sgd);
            }
            if (rep >= 0)
                rates[rep] = (double)steps * b / (omv_time_s() - t0);
        }
        qsort(rates, 5, sizeof(double), cmp_double);
        printf("%-8s %-8u %12.0f %10.3f\n", "mlp", b, rates[2], 1000.0 * b / rates[2]);
        jl += (size_t)snprintf(
            json + jl, sizeof(json) - jl,
            "%s{\"model\":\"mlp-784-256-10\",\"batch\":%u,\"images_per_second\":%.0f}",
            bi ? "," : "", b, rates[2]);
        omv_shard_fini(&shard);
        free(params);
        free(grad);
        free(x);
        free(y);
        omv_net_destroy(&mlp);
    }
    snprintf(json + jl, sizeof(json) - jl, "]}");
    printf("%s\n", json);
    omv_dataset_fini(&data);
    return 0;
}
