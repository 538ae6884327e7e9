/* Input helpers for the harnesses. */
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *fuzz_text(const uint8_t *data, size_t size)
{
    static char *buf;
    static size_t cap;
    if (size + 1 > cap) {
        free(buf);
        cap = size + 1;
        buf = malloc(cap);
        if (buf == NULL)
            abort();
    }
    memcpy(buf, data, size);
    buf[size] = '\0';
    return buf;
}

const char *fuzz_file(int which, const uint8_t *data, size_t size)
{
    static char paths[2][64];
    if (paths[which][0] == '\0') {
        snprintf(paths[which], sizeof(paths[which]), "/tmp/omv-fuzz-%d-%d.XXXXXX", (int)getpid(),
                 which);
        int fd = mkstemp(paths[which]);
        if (fd < 0)
            abort();
        close(fd);
    }
    FILE *f = fopen(paths[which], "wb");
    if (f == NULL || (size && fwrite(data, 1, size, f) != size))
        abort();
    fclose(f);
    return paths[which];
}
