/* libFuzzer: the model definition parser. */
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "fuzz_util.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static omv_model_layout_t layout;
    char err[OMV_CONFIG_ERR_MAX];
    omv_model_parse(&layout, fuzz_text(data, size), "fuzz.model", err);
    return 0;
}
