/* libFuzzer: the checkpoint reader. */
#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    omv_checkpoint_t c;
    char err[OMV_CHECKPOINT_ERR_MAX];
    if (omv_checkpoint_read(&c, fuzz_file(0, data, size), err) == 0)
        omv_checkpoint_fini(&c);
    return 0;
}
