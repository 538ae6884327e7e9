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

/* The vectors of one pixel's c = nv * W channels: to (add: added to) dst from src. */
INLINE void pixel_copy(float *dst, const float *src, int nv, int add)
{
    for (int v = 0; v < nv; v++)
        store(dst + v * W, add ? load(dst + v * W) + load(src + v * W) : load(src + v * W));
}

INLINE void pixel_zero(float *dst, int nv)
{
    for (int v = 0; v < nv; v++)
        store(dst + v * W, (vf){0});
}

/* The output columns [ret_lo, ret_hi) whose whole window lies inside the input's width. */
INLINE void inner_columns(const omv_lower_shape_t *s, int *ret_lo, int *ret_hi)
{
    int lo = (s->pad + s->stride - 1) / s->stride;
    int hi = s->w + s->pad - s->kw >= 0 ? (s->w + s->pad - s->kw) / s->stride + 1 : 0;
    hi = hi > s->ow ? s->ow : hi;
    *ret_lo = lo < hi ? lo : hi;
    *ret_hi = hi > *ret_lo ? hi : *ret_lo;
}

/* Output column ox of kernel row ky (input row y, inside): one pixel at a time, the ones past
 * the edges zero (to_col) or skipped. */
INLINE void edge_column(const int NV, int to_col, float *row, float *col, int ox,
                        const omv_lower_shape_t *s)
{
    for (int kx = 0; kx < s->kw; kx++, col += NV * W) {
        int x = ox * s->stride - s->pad + kx;
        if (x >= 0 && x < s->w)
            pixel_copy(to_col ? col : row + (size_t)x * NV * W,
                       to_col ? row + (size_t)x * NV * W : col, NV, !to_col);
        else if (to_col)
            pixel_zero(col, NV);
    }
}

/* One image's lowering (to_col) or its adjoint, by output row and kernel row: the columns
 * whose window is inside copy kw pixels in a row (contiguous on both sides), the few at the
 * edges go pixel by pixel. NV (vectors a pixel) is constant where inlined. */
INLINE void lower_image(const int NV, int to_col, float *img, float *col,
                        const omv_lower_shape_t *s)
{
    size_t row_len = (size_t)s->kh * s->kw * NV * W, span = (size_t)s->kw * NV * W;
    int lo, hi;
    inner_columns(s, &lo, &hi);
    for (int oy = 0; oy < s->oh; oy++)
        for (int ky = 0; ky < s->kh; ky++) {
            int y = oy * s->stride - s->pad + ky;
            float *c0 = col + (size_t)oy * s->ow * row_len + ky * span;
            if (y < 0 || y >= s->h) {
                for (int ox = 0; to_col && ox < s->ow; ox++)
                    pixel_zero(c0 + ox * row_len, s->kw * NV);
                continue;
            }
            float *row = img + (size_t)y * s->w * NV * W;
            for (int ox = 0; ox < lo; ox++)
                edge_column(NV, to_col, row, c0 + ox * row_len, ox, s);
            for (int ox = lo; ox < hi; ox++) {
                float *px = row + (size_t)(ox * s->stride - s->pad) * NV * W,
                      *cp = c0 + ox * row_len;
                pixel_copy(to_col ? cp : px, to_col ? px : cp, s->kw * NV, !to_col);
            }
            for (int ox = hi; ox < s->ow; ox++)
                edge_column(NV, to_col, row, c0 + ox * row_len, ox, s);
        }
}

INLINE void lower(int to_col, float *img, float *col, int batch, const omv_lower_shape_t *s)
{
    int nv = s->c / W;
    size_t img_size = (size_t)s->h * s->w * s->c,
           col_size = (size_t)s->oh * s->ow * s->kh * s->kw * s->c;
    if (!to_col)
        memset(img, 0, (size_t)batch * img_size * sizeof(float));
    for (int n = 0; n < batch; n++, img += img_size, col += col_size) {
        if (nv == 1)
            lower_image(1, to_col, img, col, s);
        else if (nv == 2)
            lower_image(2, to_col, img, col, s);
        else
            lower_image(nv, to_col, img, col, s);
    }
}

void NAME(omv_lower_kernel_im2col)(const float *in, float *col, int batch,
                                   const omv_lower_shape_t *s)
{
    lower(1, (float *)in, col, batch, s);
}

void NAME(omv_lower_kernel_col2im)(const float *col, float *din, int batch,
                                   const omv_lower_shape_t *s)
{
    lower(0, din, (float *)col, batch, s);
}

INLINE float hsum(vf v)
{
    float t = 0.0f;
    for (int e = 0; e < W; e++)
        t += v[e];
    return t;
}

/* c[mr][nr] = (bias, or c when acc, or 0) + a[mr][k] b[nr][k]^T: dot products along k, whole
 * vectors and then the k % W left. Rows past mr (nr) repeat the first and are not stored. */
INLINE void nt_tile(const int MR, const int NR, int mr, int nr, int k, const float *a, int lda,
                    const float *b, int ldb, float *c, int ldc, const float *bias, int acc)
{
    vf s[MAX_MR][MAX_MR];
    const float *ar[MAX_MR], *br[MAX_MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (size_t)(r < mr ? r : 0) * lda;
#pragma GCC unroll 12
        for (int j = 0; j < NR; j++)
            s[r][j] = (vf){0};
    }
#pragma GCC unroll 12
    for (int j = 0; j < NR; j++)
        br[j] = b + (size_t)(j < nr ? j : 0) * ldb;
    int p = 0;
    for (; p + W <= k; p += W) {
        vf bv[MAX_MR];
#pragma GCC unroll 12
        for (int j = 0; j < NR; j++)
            bv[j] = load(br[j] + p);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            vf x = load(ar[r] + p);
#pragma GCC unroll 12
            for (int j = 0; j < NR; j++)
                s[r][j] += x * bv[j];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float t = hsum(s[r][j]);
            for (int q = p; q < k; q++)
                t += ar[r][q] * br[j][q];
            float *cp = c + (size_t)r * ldc + j;
            *cp = t + (bias ? bias[j] : acc ? *cp : 0.0f);
        }
}

void NAME(omv_gemm_kernel_nt)(int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                              float *c, int ldc, const float *bias, int acc)
{
    enum { MR = 4, NR = W == 16 ? 6 : 3 };
    for (int j = 0; j < n; j += NR) {
        int nr = n - j < NR ? n - j : NR;
        const float *bj = b + (size_t)j * ldb, *biasj = bias ? bias + j : NULL;
        for (int i = 0; i < m; i += MR) {
            int mr = m - i < MR ? m - i : MR;
            nt_tile(MR, NR, mr, nr, k, a + (size_t)i * lda, lda, bj, ldb, c + (size_t)i * ldc + j,
                    ldc, biasj, acc);
        }
    }
}
