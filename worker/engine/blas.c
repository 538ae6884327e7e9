/* OpenBLAS through CBLAS. */
#include "blas.h"

#include <cblas.h>

void omv_blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void omv_blas_set_threads(int threads)
{
    openblas_set_num_threads(threads);
}

const char *omv_blas_info(void)
{
    return openblas_get_config();
}
