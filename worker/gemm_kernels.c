/* The engine's own GEMM kernels for the shapes of convolutions: many rows, a few output channels
 * or a short reduction, where OpenBLAS runs far below the machine's peak. This file is compiled
 * once per instruction set (worker/meson.build: OMV_KW floats per vector, OMV_KSUFFIX the name
 * suffix); worker/gemm.c chooses one at run time. Register tiles of MR rows by NV vectors of
 * accumulators, written with GCC's vector extensions so one source serves every width. */
#include "gemm_kernels.h"

#include <immintrin.h>
#include <string.h>

#define W OMV_KW
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define NAME(f) CAT(f, OMV_KSUFFIX)

typedef float vf __attribute__((vector_size(W * sizeof(float))));

/* Accumulator registers a tile may use: 32 vector registers with AVX-512, 16 with AVX2. */
#define ACC (W == 16 ? 24 : 12)
#define MAX_MR 12
#define MAX_NV 4

#define INLINE static inline __attribute__((always_inline))

INLINE vf load(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof(v));
    return v;
}

INLINE void store(float *p, vf v)
{
    memcpy(p, &v, sizeof(v));
}

/* set1 rather than 0 + x, which GCC must compute as an add (for -0) before it broadcasts:
 * this way the broadcast is one load from memory. */
INLINE vf bcast(float x)
{
#if W == 16
    return (vf)_mm512_set1_ps(x);
#else
    return (vf)_mm256_set1_ps(x);
#endif
}

/* Rows of a tile for nv vectors: as many as the accumulators allow, at most cap (c = a b
 * reads each row of a through its own pointer: past 10 rows of one vector GCC spills them). */
INLINE int tile_rows(int nv, int cap)
{
    int mr = ACC / nv;
    return mr > cap ? cap : mr;
}

/* c[mr][nv * W] = (bias, or c when acc, or 0) + a[mr][k] * b[k][nv * W]. MR and NV are
 * constants where this is inlined; mr <= MR rows are real (the others repeat row 0 and are not
 * stored), so one body serves the full tiles and the last. */
INLINE void nn_tile(const int MR, const int NV, int mr, int k, const float *a, int lda,
                    const float *b, int ldb, float *c, int ldc, const float *bias, int acc)
{
    vf s[MAX_MR][MAX_NV];
    const float *ar[MAX_MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (size_t)(r < mr ? r : 0) * lda;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            s[r][v] = bias            ? load(bias + v * W)
                      : acc && r < mr ? load(c + (size_t)r * ldc + v * W)
                                      : (vf){0};
    }
    for (int p = 0; p < k; p++) {
        vf bv[MAX_NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = load(b + (size_t)p * ldb + v * W);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            vf x = bcast(ar[r][p]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                s[r][v] += x * bv[v];
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        if (r < mr)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                store(c + (size_t)r * ldc + v * W, s[r][v]);
}

/* One column panel of nv vectors over all m rows: full tiles, then the rest. */
INLINE void nn_panel(const int NV, int m, int k, const float *a, int lda, const float *b, int ldb,
                     float *c, int ldc, const float *bias, int acc)
{
    const int MR = tile_rows(NV, NV == 1 ? 10 : MAX_MR);
    int i = 0;
    for (; i + MR <= m; i += MR)
        nn_tile(MR, NV, MR, k, a + (size_t)i * lda, lda, b, ldb, c + (size_t)i * ldc, ldc, bias,
                acc);
    if (i < m)
        nn_tile(MR, NV, m - i, k, a + (size_t)i * lda, lda, b, ldb, c + (size_t)i * ldc, ldc, bias,
                acc);
}

void NAME(omv_gemm_kernel_nn)(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                              float *c, int ldc, const float *bias, int acc)
{
    int j = 0;
    for (; j + 4 * W <= n; j += 4 * W)
        nn_panel(4, m, k, a, lda, b + j, ldb, c + j, ldc, bias ? bias + j : NULL, acc);
    switch ((n - j) / W) {
    case 3:
        nn_panel(3, m, k, a, lda, b + j, ldb, c + j, ldc, bias ? bias + j : NULL, acc);
        break;
    case 2:
        nn_panel(2, m, k, a, lda, b + j, ldb, c + j, ldc, bias ? bias + j : NULL, acc);
        break;
    case 1:
        nn_panel(1, m, k, a, lda, b + j, ldb, c + j, ldc, bias ? bias + j : NULL, acc);
        break;
    default:
        break;
    }
}

/* c[mr][nv * W] (+)= sum over the k rows p of a[p][mr]^T b[p][nv * W]: a's row gives the
 * broadcasts, b's row the vectors. Rows of c past mr are computed from a's first column and
 * not stored. */
INLINE void tn_tile(const int MR, const int NV, int mr, int k, const float *a, int lda,
                    const float *b, int ldb, float *c, int ldc, int acc)
{
    vf s[MAX_MR][MAX_NV];
    int col[MAX_MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        col[r] = r < mr ? r : 0;
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            s[r][v] = (vf){0};
    }
    for (int p = 0; p < k; p++) {
        const float *ap = a + (size_t)p * lda, *bp = b + (size_t)p * ldb;
        vf bv[MAX_NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            bv[v] = load(bp + v * W);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            vf x = bcast(ap[col[r]]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                s[r][v] += x * bv[v];
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        if (r < mr)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                float *cp = c + (size_t)r * ldc + v * W;
                store(cp, acc ? load(cp) + s[r][v] : s[r][v]);
            }
}

INLINE void tn_panel(const int NV, int m, int k, const float *a, int lda, const float *b, int ldb,
                     float *c, int ldc, int acc)
{
    const int MR = tile_rows(NV, MAX_MR);
    int i = 0;
    for (; i + MR <= m; i += MR)
        tn_tile(MR, NV, MR, k, a + i, lda, b, ldb, c + (size_t)i * ldc, ldc, acc);
    if (i < m)
        tn_tile(MR, NV, m - i, k, a + i, lda, b, ldb, c + (size_t)i * ldc, ldc, acc);
}

void NAME(omv_gemm_kernel_tn)(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                              float *c, int ldc, int acc)
{
    int j = 0;
    for (; j + 3 * W <= n; j += 3 * W)
        tn_panel(3, m, k, a, lda, b + j, ldb, c + j, ldc, acc);
    switch ((n - j) / W) {
    case 2:
        tn_panel(2, m, k, a, lda, b + j, ldb, c + j, ldc, acc);
        break;
    case 1:
        tn_panel(1, m, k, a, lda, b + j, ldb, c + j, ldc, acc);
        break;
    default:
        break;
    }
}
