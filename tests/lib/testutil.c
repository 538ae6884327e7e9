/* Test helpers: temporary folders and generated IDX files. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "rng.h"

void omv_test_tmpdir(char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(out, cap, "%s/omv-test.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(out) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int write_file(const char *path, const uint8_t *head, size_t head_len, const uint8_t *data,
                      size_t len, int gz)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (f == NULL)
            return -EIO;
        int ok = gzwrite(f, head, (unsigned)head_len) == (int)head_len &&
                 (len == 0 || gzwrite(f, data, (unsigned)len) == (int)len);
        gzclose(f);
        return ok ? 0 : -EIO;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -errno;
    int ok = fwrite(head, 1, head_len, f) == head_len && fwrite(data, 1, len, f) == len;
    fclose(f);
    return ok ? 0 : -EIO;
}

int omv_test_write_cifar(const char *path, const uint8_t *pixels, const uint8_t *labels,
                         uint32_t count, int gz)
{
    size_t rec = 1 + 3072;
    uint8_t *buf = malloc(count * rec + 1);
    if (buf == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < count; i++) {
        buf[i * rec] = labels[i];
        memcpy(buf + i * rec + 1, pixels + (size_t)i * 3072, 3072);
    }
    int r = write_file(path, buf, count * rec, NULL, 0, gz);
    free(buf);
    return r;
}

int omv_test_write_idx(const char *images_path, const char *labels_path, const uint8_t *pixels,
                       const uint8_t *labels, uint32_t count, uint32_t rows, uint32_t cols, int gz)
{
    uint8_t head[16] = {0, 0, 8, 3};
    be32(head + 4, count);
    be32(head + 8, rows);
    be32(head + 12, cols);
    int r = write_file(images_path, head, 16, pixels, (size_t)count * rows * cols, gz);
    if (r < 0)
        return r;
    uint8_t lhead[8] = {0, 0, 8, 1};
    be32(lhead + 4, count);
    return write_file(labels_path, lhead, 8, labels, count, gz);
}

int omv_test_make_blobs(const char *images_path, const char *labels_path, uint32_t count,
                        uint32_t rows, uint32_t cols, uint32_t classes, uint64_t seed, int gz)
{
    size_t size = (size_t)rows * cols;
    uint8_t *px = malloc((size_t)count * size);
    uint8_t *lb = malloc(count);
    if (px == NULL || lb == NULL) {
        free(px);
        free(lb);
        return -ENOMEM;
    }
    omv_rng_t rng;
    omv_rng_init(&rng, seed);
    size_t block = size / classes;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t c = omv_rng_below(&rng, classes);
        lb[i] = (uint8_t)c;
        for (size_t k = 0; k < size; k++) {
            int bright = k / block == c;
            int v = (bright ? 160 : 40) + (int)(omv_rng_normal(&rng) * 40.0);
            px[i * size + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    int r = omv_test_write_idx(images_path, labels_path, px, lb, count, rows, cols, gz);
    free(px);
    free(lb);
    return r;
}

void omv_test_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        /* Linux says EISDIR for a folder (POSIX allows EPERM). */
        if (unlink(path) != 0 && (errno == EISDIR || errno == EPERM))
            omv_test_rmdir(path);
    }
    closedir(d);
    rmdir(dir);
}

int omv_test_run(Suite *suite)
{
    SRunner *sr = srunner_create(suite);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}
