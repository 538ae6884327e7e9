/* The engine's matrix products (worker/gemm.c): every kernel set this CPU runs (BLAS,
 * AVX2, AVX-512) against a product in double written here, over shapes that leave partial
 * tiles in every direction, padded leading dimensions, and each of bias, overwrite and add. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm.h"
#include "rng.h"
#include "testutil.h"

static const int ms[] = {1, 5, 12, 13, 31};
static const int ns[] = {8, 16, 24, 40, 48, 64, 80, 144, 7};
static const int ks[] = {0, 1, 3, 16, 145};

static void fill(float *v, size_t n, omv_rng_t *rng)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)omv_rng_normal(rng);
}

/* |got - want| within float rounding of a k-term sum of products of normals. */
static void check_close(const float *got, const double *want, int m, int n, int ldc, int k,
                        const char *what)
{
    double tol = 1e-5 * (4.0 + sqrt((double)k) * 4.0);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            ck_assert_msg(fabs(got[i * ldc + j] - want[i * n + j]) <= tol,
                          "%s: c[%d][%d] = %g, want %g", what, i, j, (double)got[i * ldc + j],
                          want[i * n + j]);
}

enum { NN, TN, NT };

/* c[i][j] in double: bias or c or 0, plus the k products of one kind. */
static double reference(int kind, int mode, int i, int j, int k, const float *a, int lda,
                        const float *b, int ldb, const float *c, int ldc, const float *bias)
{
    double s = mode == 1 ? c[i * ldc + j] : mode == 2 ? bias[j] : 0.0;
    for (int p = 0; p < k; p++) {
        double x = kind == TN ? a[p * lda + i] : a[i * lda + p];
        s += x * (kind == NT ? b[j * ldb + p] : b[p * ldb + j]);
    }
    return s;
}

/* Runs every case of one product kind on the kernels in use: c = a b, a^T b or a b^T; mode 0
 * overwrites c, 1 adds to it, 2 starts from a bias. */
static void check_case(int kind, int m, int n, int k, int mode, omv_rng_t *rng)
{
    int lda = (kind == TN ? m : k) + 3, ldb = (kind == NT ? k : n) + 5, ldc = n + 2;
    size_t a_n = (size_t)(kind == TN ? k : m) * lda + 1;
    size_t b_n = (size_t)(kind == NT ? n : k) * ldb + 1;
    float *a = malloc(a_n * sizeof(float)), *b = malloc(b_n * sizeof(float));
    float *c = malloc((size_t)m * ldc * sizeof(float)), *bias = malloc((size_t)n * sizeof(float));
    double *want = malloc((size_t)m * n * sizeof(double));
    fill(a, a_n, rng), fill(b, b_n, rng), fill(bias, (size_t)n, rng);
    fill(c, (size_t)m * ldc, rng);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            want[i * n + j] = reference(kind, mode, i, j, k, a, lda, b, ldb, c, ldc, bias);
    /* The padding between rows of c must survive. */
    for (int i = 0; i < m; i++)
        c[i * ldc + n] = c[i * ldc + n + 1] = 99.0f;
    float beta = mode == 1 ? 1.0f : 0.0f;
    const float *with_bias = mode == 2 ? bias : NULL;
    if (kind == TN)
        omv_gemm_tn(m, n, k, a, lda, b, ldb, beta, c, ldc);
    else if (kind == NT)
        omv_gemm_nt(m, n, k, a, lda, b, ldb, beta, with_bias, c, ldc);
    else
        omv_gemm_nn(m, n, k, a, lda, b, ldb, beta, with_bias, c, ldc);
    char what[96];
    snprintf(what, sizeof(what), "%s %s m %d n %d k %d mode %d", omv_gemm_name(omv_gemm_current()),
             kind == TN   ? "tn"
             : kind == NT ? "nt"
                          : "nn",
             m, n, k, mode);
    check_close(c, want, m, n, ldc, k, what);
    for (int i = 0; i < m; i++)
        ck_assert_msg(c[i * ldc + n] == 99.0f && c[i * ldc + n + 1] == 99.0f,
                      "%s: wrote past row %d", what, i);
    free(a), free(b), free(c), free(bias), free(want);
}

static void check_all(int kind)
{
    omv_rng_t rng;
    omv_rng_init(&rng, 5 + (uint64_t)kind);
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); mi++)
        for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++)
            for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++)
                for (int mode = 0; mode < 3; mode++)
                    if (kind != TN || mode != 2)
                        check_case(kind, ms[mi], ns[ni], ks[ki], mode, &rng);
}

static const omv_gemm_kernels_t kernels[] = {OMV_GEMM_BLAS, OMV_GEMM_AVX2, OMV_GEMM_AVX512};

START_TEST(test_products_match_double)
{
    omv_gemm_kernels_t k = kernels[_i];
    if (omv_gemm_use(k) < 0) {
        fprintf(stderr, "test_gemm: this CPU or build has no %s kernels: skipped\n",
                omv_gemm_name(k));
        return;
    }
    ck_assert_int_eq(omv_gemm_current(), k);
    check_all(NN);
    check_all(TN);
    check_all(NT);
}
END_TEST

START_TEST(test_best_is_runnable)
{
    /* The default is the best the CPU has, and choosing it again works; BLAS always runs. */
    omv_gemm_kernels_t best = omv_gemm_best();
    ck_assert_int_eq(omv_gemm_current(), best);
    ck_assert_int_eq(omv_gemm_use(best), 0);
    ck_assert_int_eq(omv_gemm_use(OMV_GEMM_BLAS), 0);
    ck_assert_int_eq(omv_gemm_current(), OMV_GEMM_BLAS);
    if (best != OMV_GEMM_AVX512)
        ck_assert_int_eq(omv_gemm_use(OMV_GEMM_AVX512), -ENOTSUP);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("products");
    tcase_add_loop_test(tc, test_products_match_double, 0, 3);
    tcase_add_test(tc, test_best_is_runnable);
    suite_add_tcase(s, tc);
    return omv_test_run(s);
}
