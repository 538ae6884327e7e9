/* libFuzzer: the job file parser (every data or definition file it names is refused unread, so
 * the input cannot make it open /dev/stdin). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "fuzz_util.h"
#include "job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int refuse(void *ctx, const char *path, char *err)
{
    (void)ctx, (void)path, (void)err;
    return -EACCES;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static omv_job_t job;
    char err[OMV_CONFIG_ERR_MAX];
    omv_job_load_text_checked(&job, "fuzz/job.ini", fuzz_text(data, size), refuse, NULL, err);
    return 0;
}
