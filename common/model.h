/* The model, shared by daemon and workers: a network defined one layer per line, checked so the
 * shapes chain, its parameters laid out in one flat float vector, their initialisation, and how
 * the vector splits into shards. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "job.h"

#define OMV_MODEL_MAX_PARAMS (1u << 30)
#define OMV_MODEL_MAX_LAYERS 64
#define OMV_MODEL_NAME_MAX 16 /* save/add names, with the NUL */
/* Floats one image may occupy in any layer's activations: bounds what a definition can make a
 * worker allocate before a single image is read. */
#define OMV_MODEL_MAX_ACTIVATION (1u << 24)
#define OMV_MODEL_MAX_DIM 65536u
/* Shards a model splits into at most (the wire carries as many: OMV_WIRE_MAX_SHARDS). */
#define OMV_MODEL_MAX_SHARDS 256

typedef enum {
    OMV_LAYER_FC,   /* fully connected; takes any input shape as a flat vector */
    OMV_LAYER_CONV, /* 2-D convolution with kernel, stride and zero padding */
    OMV_LAYER_MAXPOOL,
    OMV_LAYER_AVGPOOL,
    OMV_LAYER_RELU,
    OMV_LAYER_DROPOUT, /* training only */
    OMV_LAYER_FLATTEN,
    OMV_LAYER_GLOBALAVGPOOL, /* the mean over height and width: C x 1 x 1 */
    OMV_LAYER_BATCHNORM,     /* per channel (2-D) or per value of a vector (1-D) */
    OMV_LAYER_SAVE,          /* names its input for a later add; passes it on */
    OMV_LAYER_ADD,           /* adds a saved output (through a 1x1 projection if shapes differ) */
} omv_layer_kind_t;

/* Channels x height x width of one image; a vector of n values is n x 1 x 1. Workers keep
 * activations channels-last: [batch][h][w][c]. */
typedef struct {
    uint32_t c, h, w;
} omv_shape_t;

typedef struct {
    omv_layer_kind_t kind;
    omv_shape_t in, out;
    uint32_t units;           /* fc: outputs; conv: output channels */
    uint32_t kh, kw;          /* conv and pooling window */
    uint32_t stride, pad;     /* conv and pooling; pooling has no padding */
    float rate;               /* dropout: probability of dropping a value */
    int line;                 /* line in the definition, for messages */
    uint32_t fan_in;          /* inputs that reach one output (fc, conv) */
    size_t w_offset, w_count; /* fc: [out][in]; conv: [out_c][kh][kw][in_c] */
    size_t b_offset, b_count; /* [units] */
    /* batchnorm: weight (gamma) and bias (beta) are w and b, [c] each; s is the state that
     * gradients do not train, running mean [c] then running variance [c]. */
    size_t s_offset, s_count;
    char name[OMV_MODEL_NAME_MAX]; /* save, add: the name they share */
    uint32_t ref;                  /* add: the index of its save layer */
    omv_shape_t skip;              /* add: the saved shape; when it is not `in`, w and b are a
                                    * 1x1 projection [in.c][skip.c] with stride proj_stride */
    uint32_t proj_stride;
} omv_model_layer_t;

typedef struct {
    uint32_t n_layers;
    omv_model_layer_t layers[OMV_MODEL_MAX_LAYERS];
    omv_shape_t input;
    size_t param_count;       /* trained parameters, then state (state_offset on) */
    size_t state_offset;      /* where the values gradients do not train begin (batch norm's running
                               * statistics); param_count when there are none */
    uint32_t inputs, classes; /* floats per input image; outputs of the last layer */
} omv_model_layout_t;

/* Lays out an MLP of widths[n] (input first): fc layers with ReLU between them. Returns 0, or
 * -EINVAL when n < 2, a width is 0 or the model has more than OMV_MODEL_MAX_PARAMS parameters. */
int omv_model_layout(omv_model_layout_t *ret, const uint32_t *widths, uint32_t n);

/* Parses a model definition, one layer per line ('#' starts a comment):
 *   input 1x28x28      (or: input 784)     first line: one image's channels x height x width
 *   conv 32 5x5 [stride S] [pad P]         S defaults to 1, P to 0; "5" means 5x5
 *   maxpool 2 [stride S]  / avgpool 2x2    S defaults to the window
 *   relu / flatten / dropout 0.5
 *   globalavgpool                          the mean of each channel over height and width
 *   batchnorm                              normalises each channel (or each value of a vector)
 *   save NAME  ...  add NAME               a residual connection: add puts the output saved at
 *                                          `save NAME` back onto its input; a 1x1 projection
 *                                          (with a stride) matches a shape that differs
 *   fc 256                                 the last layer is fc: its outputs are the classes
 *   softmax                                optional last line: the loss (always softmax
 *                                          cross-entropy)
 * Shapes must chain. name names the text in messages. On failure returns -EINVAL and writes
 * "name:line: reason" into err[OMV_CONFIG_ERR_MAX]. */
int omv_model_parse(omv_model_layout_t *ret, const char *text, const char *name, char *err);

/* Writes the definition text of an MLP of widths[n] into buf[cap]. Returns 0 or -ENOSPC. */
int omv_model_mlp_text(const uint32_t *widths, uint32_t n, char *buf, size_t cap);

/* Weights from a normal distribution with std sqrt(2 / fan_in) (He) for layers followed by a
 * ReLU, sqrt(1 / fan_in) (Glorot/LeCun by fan-in) for the others; zero biases; batch norm's
 * weight 1, bias 0, running mean 0 and variance 1; from seed. params has param_count floats. */
void omv_model_init(const omv_model_layout_t *self, float *params, uint64_t seed);

/* Writes the summary table (layer, output shape, parameters, total) into buf[cap], one line per
 * layer, each ending in '\n'. */
void omv_model_summary(const omv_model_layout_t *self, char *buf, size_t cap);

/* The name of a layer kind as the definition spells it. */
const char *omv_model_layer_name(omv_layer_kind_t kind);

/* Floats in one image of a shape. */
static inline size_t omv_shape_size(omv_shape_t s)
{
    return (size_t)s.c * s.h * s.w;
}

/* Splits count parameters into n_shards near-equal contiguous ranges; offsets has n_shards + 1
 * entries. A tensor may span shards. */
void omv_model_shard_offsets(size_t count, uint32_t n_shards, uint32_t *offsets);

/* Splits the model's parameters into about n_shards shards along its layers, so that a worker
 * can send a shard's gradient as soon as backward has finished the layers in it, and begin a
 * layer's forward as soon as its shards have come: small layers share a shard, a large one is
 * cut between rows of its weights into shards of about param_count / n_shards. Writes the
 * offsets (room for OMV_MODEL_MAX_SHARDS + 1) and returns how many shards there are (at most
 * OMV_MODEL_MAX_SHARDS, and never more than parameters). */
uint32_t omv_model_shard_layout(const omv_model_layout_t *self, uint32_t n_shards,
                                uint32_t *offsets);

/* Spreads n_shards shards (offsets as omv_model_shard_layout writes them) over n holders
 * (1 <= n <= n_shards) in order, each about the same parameters and at least a shard: holder i
 * gets shards [i ? ends[i - 1] : 0, ends[i]), ending at the shard boundary nearest to where the
 * first (i + 1) / n of the parameters end. With more holders than shards (refuse that), the
 * last ones get empty ranges at the end. */
void omv_model_shard_ranges(const uint32_t *offsets, uint32_t n_shards, uint32_t n, uint32_t *ends);
