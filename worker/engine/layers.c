/* Forward and backward of each layer kind. Convolutions are lowered as Omnivore does on CPUs
 * (im2col into one matrix, one GEMM), a cache-sized chunk of images at a time; the products run
 * in worker/gemm.c. Batch norm works on channels-last rows, so per-channel statistics are loops
 * over contiguous channels. */
#include "layers.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"

/* Allocates and touches count elements, so the step never pays for first-touch page faults. */
static void *alloc_touched(size_t count, size_t size)
{
    void *p = malloc(count * size);
    if (p != NULL)
        memset(p, 0, count * size);
    return p;
}

/* Images of a convolution lowered at a time: their lowered rows fill about this many floats
 * (512 KiB), so that the lowered block stays in the core's cache from im2col through the GEMMs
 * that read it, rather than going to memory and back for the whole batch. */
#define CONV_CHUNK_FLOATS (128u * 1024u)

static uint32_t conv_chunk(const omv_model_layer_t *s, uint32_t max_batch)
{
    size_t per_image = (size_t)s->out.h * s->out.w * s->fan_in;
    size_t n = per_image ? CONV_CHUNK_FLOATS / per_image : max_batch;
    return n < 1 ? 1 : n > max_batch ? max_batch : (uint32_t)n;
}

/* An add's projection: a 1x1 convolution from the saved shape to the add's input shape, whose
 * weights are the add's. Its dout is the add's (set as the add is made). */
static int init_projection(omv_layer_t *self, uint32_t max_batch)
{
    const omv_model_layer_t *a = &self->spec;
    omv_model_layer_t conv = {.kind = OMV_LAYER_CONV,
                              .in = a->skip,
                              .out = a->in,
                              .units = a->in.c,
                              .kh = 1,
                              .kw = 1,
                              .stride = a->proj_stride,
                              .fan_in = a->skip.c,
                              .w_offset = a->w_offset,
                              .w_count = a->w_count,
                              .b_offset = a->b_offset,
                              .b_count = a->b_count,
                              .line = a->line};
    self->proj = calloc(1, sizeof(*self->proj));
    if (self->proj == NULL || omv_layer_init(self->proj, &conv, max_batch, false) < 0)
        return -ENOMEM;
    free(self->proj->dout);
    self->proj->dout = self->dout;
    return 0;
}

int omv_layer_init(omv_layer_t *self, const omv_model_layer_t *spec, uint32_t max_batch,
                   bool in_place)
{
    memset(self, 0, sizeof(*self));
    self->spec = *spec;
    self->max_batch = max_batch;
    self->in_size = omv_shape_size(spec->in);
    self->out_size = omv_shape_size(spec->out);
    size_t outs = (size_t)max_batch * self->out_size;
    if (spec->kind == OMV_LAYER_FLATTEN)
        return 0; /* a view: out and dout are its neighbours' (set by the net) */
    if (spec->kind == OMV_LAYER_SAVE) {
        /* Its output is its input (a view); the gradient is its own, plus what add sends. */
        self->dout = alloc_touched(outs, sizeof(float));
        self->dres = alloc_touched(outs, sizeof(float));
        return self->dout && self->dres ? 0 : -ENOMEM;
    }
    if (spec->kind == OMV_LAYER_RELU && in_place)
        return 0; /* works in its input's buffers (set by the net) */
    self->owns_out = true;
    self->out = alloc_touched(outs, sizeof(float));
    self->dout = alloc_touched(outs, sizeof(float));
    int ok = self->out != NULL && self->dout != NULL;
    if (spec->kind == OMV_LAYER_CONV) {
        self->chunk = conv_chunk(spec, max_batch);
        size_t rows = (size_t)self->chunk * spec->out.h * spec->out.w;
        self->col = alloc_touched(rows * spec->fan_in, sizeof(float));
        self->wt = alloc_touched((size_t)spec->fan_in * spec->units, sizeof(float));
        ok &= self->col != NULL && self->wt != NULL;
    } else if (spec->kind == OMV_LAYER_DROPOUT) {
        self->mask = alloc_touched(outs, sizeof(float));
        ok &= self->mask != NULL;
    } else if (spec->kind == OMV_LAYER_MAXPOOL) {
        self->arg = alloc_touched(outs, sizeof(uint32_t));
        ok &= self->arg != NULL;
    } else if (spec->kind == OMV_LAYER_BATCHNORM) {
        self->stats = alloc_touched(OMV_LAYER_BN_STATS * (size_t)spec->in.c, sizeof(float));
        self->acc = alloc_touched(2 * (size_t)spec->in.c, sizeof(double));
        ok &= self->stats != NULL && self->acc != NULL;
    } else if (spec->kind == OMV_LAYER_ADD && spec->w_count > 0) {
        ok &= init_projection(self, max_batch) == 0;
    }
    return ok ? 0 : -ENOMEM;
}

void omv_layer_fini(omv_layer_t *self)
{
    if (self->owns_out || self->spec.kind == OMV_LAYER_SAVE)
        free(self->dout);
    if (self->owns_out)
        free(self->out);
    if (self->proj) {
        self->proj->dout = NULL; /* the add's, freed above */
        omv_layer_fini(self->proj);
        free(self->proj);
    }
    free(self->col);
    free(self->wt);
    free(self->mask);
    free(self->arg);
    free(self->dres);
    free(self->stats);
    free(self->acc);
    memset(self, 0, sizeof(*self));
}

/* ---- fully connected ---- */

/* db[c] (+)= sum over rows of d[n][c]: added when acc, else written. */
static void sum_rows_to(float *restrict db, const float *restrict d, size_t n, uint32_t c, bool acc)
{
    if (!acc)
        memset(db, 0, c * sizeof(float));
    for (size_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < c; j++)
            db[j] += d[r * c + j];
}

static void sum_rows(float *db, const float *d, size_t n, uint32_t c)
{
    sum_rows_to(db, d, n, c, false);
}

void omv_layer_fc_forward_units(omv_layer_t *self, const float *params, const float *in,
                                uint32_t batch, uint32_t u0, uint32_t u1)
{
    const omv_model_layer_t *s = &self->spec;
    int k = (int)s->fan_in, n = (int)s->units;
    /* out[batch][u0..u1) = bias + in[batch][fan_in] * W[u0..u1)[fan_in]^T */
    omv_gemm_nt((int)batch, (int)(u1 - u0), k, in, k, params + s->w_offset + (size_t)u0 * k, k,
                0.0f, params + s->b_offset + u0, self->out + u0, n);
}

void omv_layer_fc_backward_units(omv_layer_t *self, const float *in, uint32_t batch, float *grad,
                                 uint32_t u0, uint32_t u1)
{
    const omv_model_layer_t *s = &self->spec;
    int k = (int)s->fan_in, n = (int)s->units;
    /* dW[u0..u1)[fan_in] = dout^T[u0..u1)[batch] * in[batch][fan_in] */
    omv_gemm_tn((int)(u1 - u0), k, (int)batch, self->dout + u0, n, in, k, 0.0f,
                grad + s->w_offset + (size_t)u0 * k, k);
}

void omv_layer_fc_backward_bias(omv_layer_t *self, uint32_t batch, float *grad)
{
    sum_rows(grad + self->spec.b_offset, self->dout, batch, self->spec.units);
}

void omv_layer_fc_backward_input(omv_layer_t *self, const float *params, float *din, uint32_t batch)
{
    const omv_model_layer_t *s = &self->spec;
    int k = (int)s->fan_in, n = (int)s->units;
    /* din[batch][fan_in] = dout[batch][units] * W[units][fan_in] */
    omv_gemm_nn((int)batch, k, n, self->dout, n, params + s->w_offset, k, 0.0f, NULL, din, k);
}

bool omv_layer_fc_split_exact(const omv_layer_t *self)
{
    /* The engine's kernels compute each output from its own row and column alone, in the same
     * order whatever the part of the product asked for; a BLAS need not. */
    return self->spec.kind == OMV_LAYER_FC && omv_gemm_current() != OMV_GEMM_BLAS &&
           omv_gemm_fits((int)self->spec.fan_in);
}

static void fc_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch)
{
    omv_layer_fc_forward_units(self, params, in, batch, 0, self->spec.units);
}

static void fc_backward(omv_layer_t *self, const float *params, const float *in, float *din,
                        uint32_t batch, float *grad)
{
    omv_layer_fc_backward_units(self, in, batch, grad, 0, self->spec.units);
    omv_layer_fc_backward_bias(self, batch, grad);
    if (din != NULL)
        omv_layer_fc_backward_input(self, params, din, batch);
}

/* ---- convolution ---- */

/* The kernel columns [ret_k0, ret_k1) that land inside the input for an output column whose
 * window starts at input column x0 (which may be negative: padding). */
static void valid_range(long x0, uint32_t k, uint32_t width, uint32_t *ret_k0, uint32_t *ret_k1)
{
    long lo = x0 < 0 ? -x0 : 0;
    long hi = x0 + (long)k > (long)width ? (long)width - x0 : (long)k;
    if (hi < lo)
        hi = lo;
    *ret_k0 = (uint32_t)lo;
    *ret_k1 = (uint32_t)hi;
}

/* col[(n, oy, ox)][(ky, kx, c)] = in[n][oy*s - pad + ky][ox*s - pad + kx][c], zero outside. In
 * channels-last order the kx run of one ky is contiguous in both, so it is one copy. */
static void im2col(const omv_model_layer_t *s, const float *in, float *col, uint32_t batch)
{
    uint32_t c = s->in.c, h = s->in.h, w = s->in.w;
    size_t row_len = s->fan_in, kxc = (size_t)s->kw * c;
    for (uint32_t n = 0; n < batch; n++) {
        const float *img = in + (size_t)n * h * w * c;
        for (uint32_t oy = 0; oy < s->out.h; oy++) {
            long y0 = (long)oy * s->stride - s->pad;
            for (uint32_t ox = 0; ox < s->out.w; ox++) {
                long x0 = (long)ox * s->stride - s->pad;
                uint32_t k0, k1;
                valid_range(x0, s->kw, w, &k0, &k1);
                for (uint32_t ky = 0; ky < s->kh; ky++) {
                    float *dst = col + ky * kxc;
                    long y = y0 + ky;
                    if (y < 0 || y >= (long)h || k0 == k1) {
                        memset(dst, 0, kxc * sizeof(float));
                        continue;
                    }
                    if (k0 > 0)
                        memset(dst, 0, (size_t)k0 * c * sizeof(float));
                    memcpy(dst + (size_t)k0 * c, img + ((size_t)y * w + (size_t)(x0 + k0)) * c,
                           (size_t)(k1 - k0) * c * sizeof(float));
                    if (k1 < s->kw)
                        memset(dst + (size_t)k1 * c, 0, (size_t)(s->kw - k1) * c * sizeof(float));
                }
                col += row_len;
            }
        }
    }
}

/* The adjoint of im2col: din = 0, then every col entry is added back where it came from. */
static void col2im(const omv_model_layer_t *s, const float *col, float *din, uint32_t batch)
{
    uint32_t c = s->in.c, h = s->in.h, w = s->in.w;
    size_t row_len = s->fan_in, kxc = (size_t)s->kw * c;
    memset(din, 0, (size_t)batch * h * w * c * sizeof(float));
    for (uint32_t n = 0; n < batch; n++) {
        float *img = din + (size_t)n * h * w * c;
        for (uint32_t oy = 0; oy < s->out.h; oy++) {
            long y0 = (long)oy * s->stride - s->pad;
            for (uint32_t ox = 0; ox < s->out.w; ox++) {
                long x0 = (long)ox * s->stride - s->pad;
                uint32_t k0, k1;
                valid_range(x0, s->kw, w, &k0, &k1);
                for (uint32_t ky = 0; ky < s->kh; ky++) {
                    long y = y0 + ky;
                    if (y < 0 || y >= (long)h || k0 == k1)
                        continue;
                    const float *src = col + ky * kxc + (size_t)k0 * c;
                    float *dst = img + ((size_t)y * w + (size_t)(x0 + k0)) * c;
                    size_t len = (size_t)(k1 - k0) * c;
                    for (size_t i = 0; i < len; i++)
                        dst[i] += src[i];
                }
                col += row_len;
            }
        }
    }
}

/* dst[cols][rows] = src[rows][cols]^T: the weights [out_c][k] as the right-hand side of the
 * forward product ([k][out_c], rows of output channels as the output has), and back. */
static void transpose(float *restrict dst, const float *restrict src, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < cols; i++)
            dst[i * rows + r] = src[r * cols + i];
}

static omv_lower_shape_t lower_shape(const omv_model_layer_t *s)
{
    return (omv_lower_shape_t){.h = (int)s->in.h,
                               .w = (int)s->in.w,
                               .c = (int)s->in.c,
                               .oh = (int)s->out.h,
                               .ow = (int)s->out.w,
                               .kh = (int)s->kh,
                               .kw = (int)s->kw,
                               .stride = (int)s->stride,
                               .pad = (int)s->pad};
}

/* The lowering of count images: our vector kernels where the channels fill whole vectors. */
static void lower(const omv_model_layer_t *s, const float *in, float *col, uint32_t count)
{
    omv_lower_shape_t shape = lower_shape(s);
    if (omv_gemm_im2col(in, col, (int)count, &shape) < 0)
        im2col(s, in, col, count);
}

static void unlower(const omv_model_layer_t *s, const float *col, float *din, uint32_t count)
{
    omv_lower_shape_t shape = lower_shape(s);
    if (omv_gemm_col2im(col, din, (int)count, &shape) < 0)
        col2im(s, col, din, count);
}

static void conv_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch)
{
    const omv_model_layer_t *s = &self->spec;
    int k = (int)s->fan_in, n = (int)s->units;
    size_t per_image = (size_t)s->out.h * s->out.w;
    transpose(self->wt, params + s->w_offset, s->units, s->fan_in);
    for (uint32_t i = 0; i < batch; i += self->chunk) {
        uint32_t count = batch - i < self->chunk ? batch - i : self->chunk;
        lower(s, in + (size_t)i * self->in_size, self->col, count);
        /* out[rows][out_c] = bias + col[rows][k] * wt[k][out_c] */
        omv_gemm_nn((int)(count * per_image), n, k, self->col, k, self->wt, n, 0.0f,
                    params + s->b_offset, self->out + (size_t)i * self->out_size, n);
    }
}

/* By chunks from the last: the last chunk's lowered input is still in col from forward. */
static void conv_backward(omv_layer_t *self, const float *params, const float *in, float *din,
                          uint32_t batch, float *grad)
{
    const omv_model_layer_t *s = &self->spec;
    int k = (int)s->fan_in, n = (int)s->units;
    size_t per_image = (size_t)s->out.h * s->out.w;
    /* Where our kernels take out_c columns and not k (a first layer's k = kh * kw), the weight
     * gradient is made transposed in wt (free in backward) and turned at the end. */
    bool flip = !omv_gemm_fits(k) && omv_gemm_fits(n);
    uint32_t last = (batch - 1) / self->chunk * self->chunk;
    for (uint32_t end = batch; end > 0;) {
        uint32_t i = (end - 1) / self->chunk * self->chunk, count = end - i;
        int rows = (int)(count * per_image);
        end = i;
        const float *dout = self->dout + (size_t)i * self->out_size;
        /* The bias gradient by chunks too, while its part of dout is in cache. */
        sum_rows_to(grad + s->b_offset, dout, (size_t)rows, s->units, i != last);
        if (i != last)
            lower(s, in + (size_t)i * self->in_size, self->col, count);
        /* dW[out_c][k] (+)= dout^T[out_c][rows] * col[rows][k], or flipped
         * dWt[k][out_c] (+)= col^T[k][rows] * dout[rows][out_c] */
        float beta = i == last ? 0.0f : 1.0f;
        if (flip)
            omv_gemm_tn(k, n, rows, self->col, k, dout, n, beta, self->wt, n);
        else
            omv_gemm_tn(n, k, rows, dout, n, self->col, k, beta, grad + s->w_offset, k);
        if (din == NULL)
            continue;
        /* The lowered input is no longer needed: its buffer takes its gradient,
         * dcol[rows][k] = dout[rows][out_c] * W[out_c][k]. */
        omv_gemm_nn(rows, k, n, dout, n, params + s->w_offset, k, 0.0f, NULL, self->col, k);
        unlower(s, self->col, din + (size_t)i * self->in_size, count);
    }
    if (flip)
        transpose(grad + s->w_offset, self->wt, s->fan_in, s->units);
}

/* ---- pooling ---- */

/* One window position of max pooling over c channels. Selects instead of branches, and
 * pointers that do not alias, so that the channel loop vectorises. */
static void window_max(float *restrict out, uint32_t *restrict arg, const float *restrict src,
                       uint32_t at, uint32_t c)
{
    for (uint32_t j = 0; j < c; j++) {
        float v = src[j], o = out[j];
        uint32_t take = 0u - (uint32_t)(v > o); /* all ones where src wins */
        out[j] = v > o ? v : o;
        arg[j] = (arg[j] & ~take) | ((at + j) & take);
    }
}

static void maxpool_forward(omv_layer_t *self, const float *in, uint32_t batch)
{
    const omv_model_layer_t *s = &self->spec;
    uint32_t c = s->in.c, h = s->in.h, w = s->in.w;
    float *out = self->out;
    uint32_t *arg = self->arg;
    for (uint32_t n = 0; n < batch; n++) {
        size_t base = (size_t)n * h * w * c;
        for (uint32_t oy = 0; oy < s->out.h; oy++) {
            for (uint32_t ox = 0; ox < s->out.w; ox++) {
                for (uint32_t j = 0; j < c; j++)
                    out[j] = -FLT_MAX;
                for (uint32_t ky = 0; ky < s->kh; ky++) {
                    for (uint32_t kx = 0; kx < s->kw; kx++) {
                        size_t at =
                            base +
                            (((size_t)oy * s->stride + ky) * w + (size_t)ox * s->stride + kx) * c;
                        window_max(out, arg, in + at, (uint32_t)(at - base), c);
                    }
                }
                out += c;
                arg += c;
            }
        }
    }
}

static void maxpool_backward(omv_layer_t *self, float *din, uint32_t batch)
{
    size_t in_size = self->in_size, out_size = self->out_size;
    memset(din, 0, (size_t)batch * in_size * sizeof(float));
    for (uint32_t n = 0; n < batch; n++) {
        float *img = din + (size_t)n * in_size;
        const float *d = self->dout + (size_t)n * out_size;
        const uint32_t *arg = self->arg + (size_t)n * out_size;
        for (size_t i = 0; i < out_size; i++)
            img[arg[i]] += d[i];
    }
}

/* Average pooling forward (din == NULL) or backward: both walk the same windows. */
static void avgpool_walk(omv_layer_t *self, const float *in, float *din, uint32_t batch)
{
    const omv_model_layer_t *s = &self->spec;
    uint32_t c = s->in.c, h = s->in.h, w = s->in.w;
    float scale = 1.0f / (float)(s->kh * s->kw);
    if (din != NULL)
        memset(din, 0, (size_t)batch * h * w * c * sizeof(float));
    for (uint32_t n = 0; n < batch; n++) {
        size_t base = (size_t)n * h * w * c;
        for (uint32_t oy = 0; oy < s->out.h; oy++) {
            for (uint32_t ox = 0; ox < s->out.w; ox++) {
                size_t o = (((size_t)n * s->out.h + oy) * s->out.w + ox) * c;
                float *out = self->out + o;
                const float *d = self->dout + o;
                if (din == NULL)
                    memset(out, 0, c * sizeof(float));
                for (uint32_t ky = 0; ky < s->kh; ky++) {
                    for (uint32_t kx = 0; kx < s->kw; kx++) {
                        size_t at =
                            base +
                            (((size_t)oy * s->stride + ky) * w + (size_t)ox * s->stride + kx) * c;
                        if (din == NULL) {
                            for (uint32_t j = 0; j < c; j++)
                                out[j] += in[at + j] * scale;
                        } else {
                            for (uint32_t j = 0; j < c; j++)
                                din[at + j] += d[j] * scale;
                        }
                    }
                }
            }
        }
    }
}

/* ---- element-wise ---- */

/* max(v, 0) over v[len] in place: one pointer, so the vectoriser needs no overlap check (it
 * would fail for in == out and fall back to scalar code). */
static void relu_in_place(float *restrict v, size_t len)
{
    for (size_t i = 0; i < len; i++)
        v[i] = v[i] > 0.0f ? v[i] : 0.0f;
}

static void relu_forward(omv_layer_t *self, const float *in, uint32_t batch)
{
    size_t len = (size_t)batch * self->out_size;
    if (!self->owns_out) {
        self->out = (float *)in; /* in place: the input's buffer becomes the output */
        relu_in_place(self->out, len);
        return;
    }
    float *restrict out = self->out;
    for (size_t i = 0; i < len; i++)
        out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

/* d = out > 0 ? d : 0; d is the layer's own dout (in place: din) or copied into din. */
static void relu_mask(float *restrict din, const float *restrict d, const float *restrict out,
                      size_t len)
{
    for (size_t i = 0; i < len; i++)
        din[i] = out[i] > 0.0f ? d[i] : 0.0f;
}

static void relu_mask_in_place(float *restrict d, const float *restrict out, size_t len)
{
    for (size_t i = 0; i < len; i++)
        d[i] = out[i] > 0.0f ? d[i] : 0.0f;
}

/* The mask is read from the output: in place, the input is gone, and out > 0 iff in > 0. */
static void relu_backward(omv_layer_t *self, float *din, uint32_t batch)
{
    size_t len = (size_t)batch * self->out_size;
    if (din == self->dout)
        relu_mask_in_place(din, self->out, len);
    else
        relu_mask(din, self->dout, self->out, len);
}

static void dropout_forward(omv_layer_t *self, const float *in, uint32_t batch, bool train,
                            omv_rng_t *rng)
{
    size_t len = (size_t)batch * self->out_size;
    if (!train || self->spec.rate == 0.0f) {
        memcpy(self->out, in, len * sizeof(float));
        if (train)
            for (size_t i = 0; i < len; i++)
                self->mask[i] = 1.0f;
        return;
    }
    /* Inverted dropout: kept values are scaled so that evaluation needs no rescaling. The
     * threshold compares 32 random bits at a time. */
    float keep = 1.0f / (1.0f - self->spec.rate);
    uint32_t threshold = (uint32_t)((double)self->spec.rate * 4294967296.0);
    for (size_t i = 0; i < len; i++) {
        uint32_t bits = (uint32_t)(omv_rng_next(rng) >> 32);
        self->mask[i] = bits >= threshold ? keep : 0.0f;
        self->out[i] = in[i] * self->mask[i];
    }
}

static void dropout_backward(omv_layer_t *self, float *din, uint32_t batch)
{
    size_t len = (size_t)batch * self->out_size;
    for (size_t i = 0; i < len; i++)
        din[i] = self->dout[i] * self->mask[i];
}

/* ---- global average pooling ---- */

/* out[n][c] = the mean of in[n][.][.][c] over height and width. */
static void gap_forward(omv_layer_t *self, const float *in, uint32_t batch)
{
    uint32_t c = self->spec.in.c;
    size_t hw = (size_t)self->spec.in.h * self->spec.in.w;
    float scale = 1.0f / (float)hw;
    for (uint32_t n = 0; n < batch; n++) {
        float *restrict out = self->out + (size_t)n * c;
        const float *img = in + (size_t)n * hw * c;
        memset(out, 0, c * sizeof(float));
        for (size_t p = 0; p < hw; p++)
            for (uint32_t j = 0; j < c; j++)
                out[j] += img[p * c + j];
        for (uint32_t j = 0; j < c; j++)
            out[j] *= scale;
    }
}

static void gap_backward(omv_layer_t *self, float *din, uint32_t batch)
{
    uint32_t c = self->spec.in.c;
    size_t hw = (size_t)self->spec.in.h * self->spec.in.w;
    float scale = 1.0f / (float)hw;
    for (uint32_t n = 0; n < batch; n++) {
        const float *d = self->dout + (size_t)n * c;
        float *restrict img = din + (size_t)n * hw * c;
        for (size_t p = 0; p < hw; p++)
            for (uint32_t j = 0; j < c; j++)
                img[p * c + j] = d[j] * scale;
    }
}

/* ---- batch normalisation ---- */

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1 /* PyTorch's: running = (1 - m) running + m batch */

/* Rows summed in float before the sum goes into double: short enough that float loses nothing
 * that matters, long enough that the double adds cost nothing. */
#define BN_BLOCK 64

/* stats: [BN_STATS][c] */
enum { BN_MEAN, BN_VAR, BN_INV, BN_SCALE, BN_SHIFT, BN_SUM1, BN_SUM2, BN_STATS };
_Static_assert(BN_STATS == OMV_LAYER_BN_STATS, "layers.h sizes the stats");

/* acc[0][j] += sum over rows of u[r][j], acc[1][j] += sum of u * v, where u = a - ka and
 * v = b - kb, in float per block of rows and in double across blocks (s1, s2: [c] scratch). */
static void bn_sums(double *acc, const float *a, const float *ka, const float *b, const float *kb,
                    size_t rows, uint32_t c, float *restrict s1, float *restrict s2)
{
    memset(acc, 0, 2 * c * sizeof(double));
    for (size_t r0 = 0; r0 < rows; r0 += BN_BLOCK) {
        size_t r1 = rows - r0 < BN_BLOCK ? rows : r0 + BN_BLOCK;
        memset(s1, 0, c * sizeof(float));
        memset(s2, 0, c * sizeof(float));
        for (size_t r = r0; r < r1; r++) {
            const float *restrict ar = a + r * c, *restrict br = b + r * c;
            for (uint32_t j = 0; j < c; j++) {
                float u = ar[j] - ka[j];
                s1[j] += u;
                s2[j] += u * (br[j] - kb[j]);
            }
        }
        for (uint32_t j = 0; j < c; j++) {
            acc[j] += s1[j];
            acc[c + j] += s2[j];
        }
    }
}

/* The batch's mean and (biased) variance per channel over rows[n][c]: one pass of sums of the
 * values shifted by the first row's (close to the mean, so the squares do not cancel). */
static void bn_moments(float *stats, const float *x, size_t rows, uint32_t c, double *acc)
{
    float *mean = stats + BN_MEAN * c, *var = stats + BN_VAR * c, *shift = stats + BN_SHIFT * c;
    memcpy(shift, x, c * sizeof(float));
    bn_sums(acc, x, shift, x, shift, rows, c, stats + BN_SUM1 * c, stats + BN_SUM2 * c);
    for (uint32_t j = 0; j < c; j++) {
        double m = acc[j] / (double)rows, v = acc[c + j] / (double)rows - m * m;
        mean[j] = (float)(shift[j] + m);
        var[j] = (float)(v > 0.0 ? v : 0.0);
    }
}

/* out = in * scale + shift per channel, over rows[n][c]. */
static void scale_shift(float *restrict out, const float *restrict in, const float *restrict scale,
                        const float *restrict shift, size_t rows, uint32_t c)
{
    for (size_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < c; j++)
            out[r * c + j] = in[r * c + j] * scale[j] + shift[j];
}

/* Training normalises by the batch's statistics (kept for backward); evaluation by the running
 * ones in params. y = weight * (x - mean) / sqrt(var + eps) + bias = x * scale + shift. */
static void bn_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch,
                       bool train)
{
    const omv_model_layer_t *s = &self->spec;
    uint32_t c = s->in.c;
    size_t rows = (size_t)batch * s->in.h * s->in.w;
    float *st = self->stats, *mean = st + BN_MEAN * c, *var = st + BN_VAR * c;
    float *inv = st + BN_INV * c, *scale = st + BN_SCALE * c, *shift = st + BN_SHIFT * c;
    if (train) {
        bn_moments(st, in, rows, c, self->acc);
    } else {
        memcpy(mean, params + s->s_offset, c * sizeof(float));
        memcpy(var, params + s->s_offset + c, c * sizeof(float));
    }
    const float *g = params + s->w_offset, *b = params + s->b_offset;
    for (uint32_t j = 0; j < c; j++) {
        inv[j] = 1.0f / sqrtf(var[j] + BN_EPS);
        scale[j] = g[j] * inv[j];
        shift[j] = b[j] - mean[j] * scale[j];
    }
    scale_shift(self->out, in, scale, shift, rows, c);
}

/* out = d * p + x * q + k per channel, over rows[n][c]. */
static void bn_input_gradient(float *restrict out, const float *restrict d, const float *restrict x,
                              const float *restrict p, const float *restrict q,
                              const float *restrict k, size_t rows, uint32_t c)
{
    for (size_t r = 0; r < rows; r++)
        for (uint32_t j = 0; j < c; j++)
            out[r * c + j] = d[r * c + j] * p[j] + x[r * c + j] * q[j] + k[j];
}

/* With xhat = (x - mean) inv over the R rows: dweight = sum dy xhat, dbias = sum dy, and
 * dx = weight inv (dy - dbias / R - xhat dweight / R), which is dy p + x q + k per channel; the
 * normalised input is computed again from the input rather than kept. The running statistics
 * move towards the batch's (unbiased variance). */
static void bn_backward(omv_layer_t *self, const float *params, const float *in, float *din,
                        uint32_t batch, float *grad)
{
    const omv_model_layer_t *s = &self->spec;
    uint32_t c = s->in.c;
    size_t rows = (size_t)batch * s->in.h * s->in.w;
    float *st = self->stats, *mean = st + BN_MEAN * c, *var = st + BN_VAR * c;
    float *inv = st + BN_INV * c;
    float *dg = grad + s->w_offset, *db = grad + s->b_offset;
    /* Sums of dy and of dy (x - mean): zeros stand in for dy's shift. */
    float *zero = st + BN_SHIFT * c;
    memset(zero, 0, c * sizeof(float));
    bn_sums(self->acc, self->dout, zero, in, mean, rows, c, st + BN_SUM1 * c, st + BN_SUM2 * c);
    for (uint32_t j = 0; j < c; j++) {
        db[j] = (float)self->acc[j];
        dg[j] = (float)(self->acc[c + j] * inv[j]);
    }
    const float *run = params + s->s_offset;
    float *new_run = grad + s->s_offset;
    double unbias = rows > 1 ? (double)rows / (double)(rows - 1) : 1.0;
    for (uint32_t j = 0; j < c; j++) {
        new_run[j] = (float)((1.0 - BN_MOMENTUM) * run[j] + BN_MOMENTUM * mean[j]);
        new_run[c + j] = (float)((1.0 - BN_MOMENTUM) * run[c + j] + BN_MOMENTUM * unbias * var[j]);
    }
    if (din == NULL)
        return;
    const float *g = params + s->w_offset;
    float *p = st + BN_SCALE * c, *q = st + BN_SUM1 * c, *k = st + BN_SUM2 * c;
    float inv_r = 1.0f / (float)rows;
    for (uint32_t j = 0; j < c; j++) {
        p[j] = g[j] * inv[j];
        q[j] = -p[j] * inv[j] * dg[j] * inv_r;
        k[j] = -p[j] * db[j] * inv_r - q[j] * mean[j];
    }
    bn_input_gradient(din, self->dout, in, p, q, k, rows, c);
}

/* ---- residual connections ---- */

/* out = in + the saved output (through the projection when the shapes differ). */
static void add_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch)
{
    const float *skip = self->skip->out;
    if (self->proj) {
        omv_layer_forward(self->proj, params, skip, batch, true, NULL);
        skip = self->proj->out;
    }
    size_t len = (size_t)batch * self->out_size;
    float *restrict out = self->out;
    for (size_t i = 0; i < len; i++)
        out[i] = in[i] + skip[i];
}

/* The gradient goes on unchanged to the input, and to the saved output (through the
 * projection, which also takes its weights' gradient). */
static void add_backward(omv_layer_t *self, const float *params, float *din, uint32_t batch,
                         float *grad)
{
    size_t len = (size_t)batch * self->out_size;
    if (self->proj)
        omv_layer_backward(self->proj, params, self->skip->out, self->skip->dres, batch, grad);
    else
        memcpy(self->skip->dres, self->dout, len * sizeof(float));
    if (din != NULL && din != self->dout)
        memcpy(din, self->dout, len * sizeof(float));
}

/* The gradient of a saved output: from the layers after it, and from its add. */
static void save_backward(omv_layer_t *self, float *din, uint32_t batch)
{
    size_t len = (size_t)batch * self->out_size;
    float *restrict d = din;
    for (size_t i = 0; i < len; i++)
        d[i] = self->dout[i] + self->dres[i];
}

void omv_layer_forward(omv_layer_t *self, const float *params, const float *in, uint32_t batch,
                       bool train, omv_rng_t *rng)
{
    switch (self->spec.kind) {
    case OMV_LAYER_FC:
        fc_forward(self, params, in, batch);
        break;
    case OMV_LAYER_CONV:
        conv_forward(self, params, in, batch);
        break;
    case OMV_LAYER_MAXPOOL:
        maxpool_forward(self, in, batch);
        break;
    case OMV_LAYER_AVGPOOL:
        avgpool_walk(self, in, NULL, batch);
        break;
    case OMV_LAYER_RELU:
        relu_forward(self, in, batch);
        break;
    case OMV_LAYER_DROPOUT:
        dropout_forward(self, in, batch, train, rng);
        break;
    case OMV_LAYER_FLATTEN:
    case OMV_LAYER_SAVE:
        /* Channels-last images are already flat: the output is the input. A save's too. */
        self->out = (float *)in;
        break;
    case OMV_LAYER_GLOBALAVGPOOL:
        gap_forward(self, in, batch);
        break;
    case OMV_LAYER_BATCHNORM:
        bn_forward(self, params, in, batch, train);
        break;
    case OMV_LAYER_ADD:
        add_forward(self, params, in, batch);
        break;
    }
}

void omv_layer_backward(omv_layer_t *self, const float *params, const float *in, float *din,
                        uint32_t batch, float *grad)
{
    switch (self->spec.kind) {
    case OMV_LAYER_FC:
        fc_backward(self, params, in, din, batch, grad);
        break;
    case OMV_LAYER_CONV:
        conv_backward(self, params, in, din, batch, grad);
        break;
    case OMV_LAYER_MAXPOOL:
        if (din != NULL)
            maxpool_backward(self, din, batch);
        break;
    case OMV_LAYER_AVGPOOL:
        if (din != NULL)
            avgpool_walk(self, NULL, din, batch);
        break;
    case OMV_LAYER_RELU:
        if (din != NULL)
            relu_backward(self, din, batch);
        break;
    case OMV_LAYER_DROPOUT:
        if (din != NULL)
            dropout_backward(self, din, batch);
        break;
    case OMV_LAYER_FLATTEN:
        /* dout is the previous layer's gradient buffer: nothing to move. */
        break;
    case OMV_LAYER_GLOBALAVGPOOL:
        if (din != NULL)
            gap_backward(self, din, batch);
        break;
    case OMV_LAYER_BATCHNORM:
        bn_backward(self, params, in, din, batch, grad);
        break;
    case OMV_LAYER_ADD:
        add_backward(self, params, din, batch, grad);
        break;
    case OMV_LAYER_SAVE:
        if (din != NULL)
            save_backward(self, din, batch);
        break;
    }
}
