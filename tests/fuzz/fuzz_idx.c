/* libFuzzer: the IDX loader (images and labels, raw or gzipped); the first byte says where the
 * input splits into the two files. */
#include <stddef.h>
#include <stdint.h>

#include "dataset.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t split = 1 + (size - 1) * data[0] / 255;
    const char *images = fuzz_file(0, data + 1, split - 1);
    const char *labels = fuzz_file(1, data + split, size - split);
    omv_dataset_t d;
    char err[OMV_CONFIG_ERR_MAX];
    if (omv_dataset_load(&d, images, labels, 0, 0, err) == 0)
        omv_dataset_fini(&d);
    return 0;
}
