/* BLAS behind one file: the GEMM the engine needs and the thread count of the BLAS pool.
 * A second backend (cuBLAS) is one more file with these functions. */
#pragma once

#include <stdbool.h>

/* C[m][n] = alpha * op(A) * op(B) + beta * C, all row-major; op transposes when ta / tb. */
void omv_blas_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc);

/* Sets the BLAS pool's thread count (one pool per process: we run no other). */
void omv_blas_set_threads(int threads);

/* The backend's own description, e.g. OpenBLAS's build configuration. */
const char *omv_blas_info(void);
