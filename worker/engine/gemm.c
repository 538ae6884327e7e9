/* Chooses between the engine's GEMM kernels and the BLAS module for each product: the kernels
 * need n to be a multiple of their vector width and a CPU that runs them (checked once, from
 * CPUID, so that under valgrind, which hides AVX-512, the AVX2 ones run). */
#include "gemm.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "blas.h"
#include "gemm_kernels.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static omv_gemm_kernels_t best = OMV_GEMM_BLAS, current = OMV_GEMM_BLAS;

static bool cpu_runs(omv_gemm_kernels_t k)
{
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    __builtin_cpu_init();
    if (k == OMV_GEMM_AVX512)
        return __builtin_cpu_supports("avx512f");
    if (k == OMV_GEMM_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return k == OMV_GEMM_BLAS;
}

static void detect(void)
{
    best = cpu_runs(OMV_GEMM_AVX512) ? OMV_GEMM_AVX512
           : cpu_runs(OMV_GEMM_AVX2) ? OMV_GEMM_AVX2
                                     : OMV_GEMM_BLAS;
    current = best;
}

omv_gemm_kernels_t omv_gemm_best(void)
{
    pthread_once(&once, detect);
    return best;
}

int omv_gemm_use(omv_gemm_kernels_t kernels)
{
    pthread_once(&once, detect);
    if (!cpu_runs(kernels))
        return -ENOTSUP;
    current = kernels;
    return 0;
}

omv_gemm_kernels_t omv_gemm_current(void)
{
    pthread_once(&once, detect);
    return current;
}

const char *omv_gemm_name(omv_gemm_kernels_t kernels)
{
    switch (kernels) {
    case OMV_GEMM_AVX512:
        return "avx512";
    case OMV_GEMM_AVX2:
        return "avx2";
    case OMV_GEMM_BLAS:
        break;
    }
    return "blas";
}

/* Our kernels for n columns, or BLAS when n does not fill whole vectors. */
static omv_gemm_kernels_t pick(int n)
{
    omv_gemm_kernels_t k = omv_gemm_current();
    if (k == OMV_GEMM_AVX512 && n % 16 != 0)
        k = OMV_GEMM_AVX2;
    if (k == OMV_GEMM_AVX2 && n % 8 != 0)
        k = OMV_GEMM_BLAS;
    return k;
}

void omv_gemm_nn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 const float *bias, float *c, int ldc)
{
    switch (pick(n)) {
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    case OMV_GEMM_AVX512:
        omv_gemm_kernel_nn_avx512(m, n, k, a, lda, b, ldb, c, ldc, bias, beta != 0.0f);
        return;
    case OMV_GEMM_AVX2:
        omv_gemm_kernel_nn_avx2(m, n, k, a, lda, b, ldb, c, ldc, bias, beta != 0.0f);
        return;
#endif
    default:
        break;
    }
    if (bias != NULL) {
        for (int r = 0; r < m; r++)
            memcpy(c + (size_t)r * ldc, bias, (size_t)n * sizeof(float));
        beta = 1.0f;
    }
    omv_blas_gemm(false, false, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

void omv_gemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 const float *bias, float *c, int ldc)
{
    switch (omv_gemm_current()) {
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    case OMV_GEMM_AVX512:
        omv_gemm_kernel_nt_avx512(m, n, k, a, lda, b, ldb, c, ldc, bias, beta != 0.0f);
        return;
    case OMV_GEMM_AVX2:
        omv_gemm_kernel_nt_avx2(m, n, k, a, lda, b, ldb, c, ldc, bias, beta != 0.0f);
        return;
#endif
    default:
        break;
    }
    if (bias != NULL) {
        for (int r = 0; r < m; r++)
            memcpy(c + (size_t)r * ldc, bias, (size_t)n * sizeof(float));
        beta = 1.0f;
    }
    omv_blas_gemm(false, true, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

bool omv_gemm_fits(int n)
{
    return pick(n) != OMV_GEMM_BLAS;
}

void omv_gemm_tn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc)
{
    switch (pick(n)) {
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    case OMV_GEMM_AVX512:
        omv_gemm_kernel_tn_avx512(m, n, k, a, lda, b, ldb, c, ldc, beta != 0.0f);
        return;
    case OMV_GEMM_AVX2:
        omv_gemm_kernel_tn_avx2(m, n, k, a, lda, b, ldb, c, ldc, beta != 0.0f);
        return;
#endif
    default:
        break;
    }
    omv_blas_gemm(true, false, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

int omv_gemm_im2col(const float *in, float *col, int batch, const omv_lower_shape_t *s)
{
    switch (pick(s->c)) {
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    case OMV_GEMM_AVX512:
        omv_lower_kernel_im2col_avx512(in, col, batch, s);
        return 0;
    case OMV_GEMM_AVX2:
        omv_lower_kernel_im2col_avx2(in, col, batch, s);
        return 0;
#endif
    default:
        return -ENOTSUP;
    }
}

int omv_gemm_col2im(const float *col, float *din, int batch, const omv_lower_shape_t *s)
{
    switch (pick(s->c)) {
#if defined(__x86_64__) && defined(OMV_GEMM_X86)
    case OMV_GEMM_AVX512:
        omv_lower_kernel_col2im_avx512(col, din, batch, s);
        return 0;
    case OMV_GEMM_AVX2:
        omv_lower_kernel_col2im_avx2(col, din, batch, s);
        return 0;
#endif
    default:
        return -ENOTSUP;
    }
}
