/* The per-instruction-set GEMM kernels of worker/gemm_kernels.c, for worker/gemm.c only: it
 * checks the shapes they need (n a multiple of the vector width) and the CPU before calling. */
#pragma once

#include "gemm.h"

/* c[m][n] = (bias[n] on every row, else c when acc, else 0) + a[m][k] * b[k][n], row-major;
 * n is a multiple of the vector width. */
void omv_gemm_kernel_nn_avx512(int m, int n, int k, const float *a, int lda, const float *b,
                               int ldb, float *c, int ldc, const float *bias, int acc);
void omv_gemm_kernel_nn_avx2(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                             float *c, int ldc, const float *bias, int acc);

/* c[m][n] = (c when acc, else 0) + a^T * b for a[k][m] and b[k][n], row-major; n is a multiple
 * of the vector width. */
void omv_gemm_kernel_tn_avx512(int m, int n, int k, const float *a, int lda, const float *b,
                               int ldb, float *c, int ldc, int acc);
void omv_gemm_kernel_tn_avx2(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                             float *c, int ldc, int acc);

/* c[m][n] = (bias[n] on every row, else c when acc, else 0) + a[m][k] * b[n][k]^T, any k. */
void omv_gemm_kernel_nt_avx512(int m, int n, int k, const float *a, int lda, const float *b,
                               int ldb, float *c, int ldc, const float *bias, int acc);
void omv_gemm_kernel_nt_avx2(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                             float *c, int ldc, const float *bias, int acc);

/* omv_gemm_im2col and omv_gemm_col2im for c a multiple of the vector width. */
/* col[(n, oy, ox)][(ky, kx, c)] = in[n][oy * stride - pad + ky][ox * stride - pad + kx][c], zero
 * outside; and its adjoint: din = 0, then every col entry added back where it came from. */
void omv_lower_kernel_im2col_avx512(const float *in, float *col, int batch,
                                    const omv_lower_shape_t *s);
void omv_lower_kernel_im2col_avx2(const float *in, float *col, int batch,
                                  const omv_lower_shape_t *s);
void omv_lower_kernel_col2im_avx512(const float *col, float *din, int batch,
                                    const omv_lower_shape_t *s);
void omv_lower_kernel_col2im_avx2(const float *col, float *din, int batch,
                                  const omv_lower_shape_t *s);
