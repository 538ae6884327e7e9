/* The matrix products of convolutions: the engine's own kernels (AVX-512 or AVX2, chosen from
 * the CPU at run time) where the shape suits them, the BLAS module's GEMM otherwise. All
 * matrices row-major. */
#pragma once

#include <stdbool.h>

typedef enum {
    OMV_GEMM_BLAS,   /* the BLAS module for every product */
    OMV_GEMM_AVX2,   /* our kernels, 8 floats a vector */
    OMV_GEMM_AVX512, /* our kernels, 16 floats a vector */
} omv_gemm_kernels_t;

/* c[m][n] = bias (each row; NULL: none) + beta * c + a[m][k] * b[k][n], beta 0 or 1 (with a
 * bias, beta must be 0). */
void omv_gemm_nn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 const float *bias, float *c, int ldc);

/* c[m][n] = beta * c + a^T * b for a[k][m] and b[k][n]; beta 0 or 1. */
void omv_gemm_tn(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc);

/* c[m][n] = bias (each row; NULL: none) + beta * c + a[m][k] * b[n][k]^T, beta 0 or 1 (with a
 * bias, beta must be 0): a fully connected layer's forward against its [out][in] weights. */
void omv_gemm_nt(int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 const float *bias, float *c, int ldc);

/* Whether our kernels take products of n columns (omv_gemm_nn, omv_gemm_tn) or lower c
 * channels: n a whole number of vectors and kernels in use. */
bool omv_gemm_fits(int n);

/* A convolution's geometry for lowering: input h x w x c (channels-last), output oh x ow,
 * kernel kh x kw, stride and zero padding. */
typedef struct {
    int h, w, c, oh, ow, kh, kw, stride, pad;
} omv_lower_shape_t;

/* col[(n, oy, ox)][(ky, kx, c)] = in[n][oy * stride - pad + ky][ox * stride - pad + kx][c], zero
 * outside, for batch images. Returns 0, or -ENOTSUP where our kernels do not take the shape (c
 * not a whole number of vectors): the caller lowers it itself. */
int omv_gemm_im2col(const float *in, float *col, int batch, const omv_lower_shape_t *s);

/* The adjoint: din[batch][h][w][c] = 0, then every col entry added back where it came from.
 * Returns 0 or -ENOTSUP as omv_gemm_im2col. */
int omv_gemm_col2im(const float *col, float *din, int batch, const omv_lower_shape_t *s);

/* The best kernels this CPU runs (the first call decides; later calls return the same). */
omv_gemm_kernels_t omv_gemm_best(void);

/* Chooses the kernels (for tests and benchmarks: the default is omv_gemm_best). Returns 0, or
 * -ENOTSUP when the CPU or the build lacks them (the choice is then unchanged). Not thread-safe:
 * call before any net runs. */
int omv_gemm_use(omv_gemm_kernels_t kernels);

/* The kernels in use now. */
omv_gemm_kernels_t omv_gemm_current(void);
const char *omv_gemm_name(omv_gemm_kernels_t kernels);
