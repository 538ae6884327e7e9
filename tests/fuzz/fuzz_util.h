/* Shared by the libFuzzer harnesses: an input as a NUL-terminated string, or as a file. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* A copy of data[size] with a NUL after it (the harness's buffer, reused). */
char *fuzz_text(const uint8_t *data, size_t size);

/* Writes data[size] to the harness's own temporary file (made once, rewritten each time) and
 * returns its path; which says which of a harness's files (0 or 1). */
const char *fuzz_file(int which, const uint8_t *data, size_t size);
