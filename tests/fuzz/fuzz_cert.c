/* libFuzzer: the CURVE certificate reader (allow-list files, --key, --server-key). */
#include <stddef.h>
#include <stdint.h>

#include "cert.h"
#include "config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    omv_cert_t c;
    char err[OMV_CONFIG_ERR_MAX];
    omv_cert_read(fuzz_file(0, data, size), &c, err);
    return 0;
}
