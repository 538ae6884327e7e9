/* libFuzzer: the wire decoder, on any envelope bytes a peer may send. */
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static omv_msg_t msg;
    char why[OMV_WIRE_REASON_MAX];
    if (omv_wire_decode(data, size, &msg, why) == 0) {
        /* What decodes must encode again. */
        static uint8_t buf[OMV_WIRE_MAX_ENVELOPE];
        size_t len;
        omv_wire_encode(&msg, buf, sizeof(buf), &len);
    }
    return 0;
}
