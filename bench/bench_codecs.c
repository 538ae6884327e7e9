/* The wire's codecs, which run on every value of every step (workers' pushes, servers'
 * answers): ns per value and GB/s of fp32 read, median of repeats, for bf16 both ways and int8
 * (a gradient with its residual, a view's change, and adding a change). Prints a table, then
 * every figure as one JSON object on the last line. bench_codecs [--values N] [--reps R]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "q8.h"
#include "util.h"

enum { BF16_FROM, BF16_TO, Q8_ENCODE, Q8_DELTA, Q8_ADD, N_CODECS };
static const char *const names[N_CODECS] = {"bf16_from_f32", "bf16_to_f32", "q8_encode",
                                            "q8_encode_delta", "q8_add"};

typedef struct {
    size_t n;
    float *src, *residual, *view, *out;
    uint16_t *half;
    void *q;
} bufs_t;

static void run_codec(int c, bufs_t *b)
{
    switch (c) {
    case BF16_FROM:
        omv_bf16_from_f32(b->half, b->src, b->n);
        break;
    case BF16_TO:
        omv_bf16_to_f32(b->out, b->half, b->n);
        break;
    case Q8_ENCODE:
        omv_q8_encode(b->q, b->src, b->residual, b->n);
        break;
    case Q8_DELTA:
        omv_q8_encode_delta(b->q, b->src, b->view, b->n);
        break;
    default:
        omv_q8_add(b->out, b->q, b->n);
        break;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t n = 1u << 20;
    int reps = 21;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--values") == 0)
            n = strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
    }
    if (n == 0 || reps <= 0 || reps > 1000) {
        fprintf(stderr, "usage: bench_codecs [--values N] [--reps 1..1000]\n");
        return 2;
    }
    bufs_t b = {n,
                malloc(n * sizeof(float)),
                calloc(n, sizeof(float)),
                calloc(n, sizeof(float)),
                calloc(n, sizeof(float)),
                malloc(n * sizeof(uint16_t)),
                malloc(omv_q8_bytes(n))};
    double *t = malloc((size_t)reps * sizeof(double));
    if (!b.src || !b.residual || !b.view || !b.out || !b.half || !b.q || !t) {
        fprintf(stderr, "bench_codecs: out of memory\n");
        return 1;
    }
    uint64_t seed = 1;
    for (size_t i = 0; i < n; i++) { /* gradient-like: mostly small, a few large */
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)(seed >> 40) / (float)(1u << 24) - 0.5f;
        b.src[i] = (i % 97 == 0 ? 1.0f : 0.01f) * u;
    }
    printf("# %zu values, median of %d\n%-16s %10s %10s\n", n, reps, "codec", "ns/value",
           "GB/s fp32");
    char json[1024];
    size_t len = (size_t)snprintf(json, sizeof(json), "{\"values\":%zu", n);
    for (int c = 0; c < N_CODECS; c++) {
        run_codec(c, &b); /* warm: pages touched, the clone picked */
        for (int r = 0; r < reps; r++) {
            double t0 = omv_time_s();
            run_codec(c, &b);
            t[r] = omv_time_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        double ns = t[reps / 2] * 1e9 / (double)n, gbs = 4.0 / ns;
        printf("%-16s %10.3f %10.2f\n", names[c], ns, gbs);
        if (len < sizeof(json))
            len +=
                (size_t)snprintf(json + len, sizeof(json) - len, ",\"%s_ns\":%.4f", names[c], ns);
    }
    printf("%s}\n", json);
    free(t);
    free(b.src);
    free(b.residual);
    free(b.view);
    free(b.out);
    free(b.half);
    free(b.q);
    return 0;
}
