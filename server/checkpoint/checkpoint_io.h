/* The frame every checkpoint file shares (a header, sections, a trailer with the length and a
 * CRC-32): a writer that checksums what it writes, the atomic write (tmp, fsync, rename, fsync
 * of the folder), and reading a whole file back with its frame checked. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Room for a reason a checkpoint file could not be written or read. */
#define OMV_CHECKPOINT_ERR_MAX 512

#define OMV_CKIO_TRAILER_BYTES 16
#define OMV_CKIO_HEADER_BYTES 16

typedef struct {
    int fd;
    unsigned long crc;
    uint64_t bytes;
    int err;
} omv_ckio_writer_t;

void omv_ckio_put(omv_ckio_writer_t *w, const void *data, size_t len);
void omv_ckio_put_u32(omv_ckio_writer_t *w, uint32_t v);
void omv_ckio_put_u64(omv_ckio_writer_t *w, uint64_t v);
void omv_ckio_put_f64(omv_ckio_writer_t *w, double v);
/* A section's header: tag, a zero word, the length of what follows. */
void omv_ckio_section(omv_ckio_writer_t *w, uint32_t tag, uint64_t len);

/* Writes a file's header and sections (magic and format first); the trailer is the writer's. */
typedef void (*omv_ckio_body_fn)(omv_ckio_writer_t *w, const void *ctx);

/* Writes DIR/NAME from body and the trailer: into NAME.tmp (created afresh, never through a
 * link), fsync, rename, fsync of the folder (created as needed), so a crash leaves the old file
 * or the new one. ret_path[cap], ret_crc and ret_bytes (each optional) get the path, the
 * trailer's CRC-32 and the file's size. Returns 0 or a negative errno with the reason in
 * err[OMV_CHECKPOINT_ERR_MAX]. */
int omv_ckio_write(const char *dir, const char *name, omv_ckio_body_fn body, const void *ctx,
                   char *ret_path, size_t cap, uint32_t *ret_crc, uint64_t *ret_bytes, char *err);

typedef struct {
    const unsigned char *p, *end;
} omv_ckio_reader_t;

/* Each returns 0 (or the value) and sets *bad when fewer bytes are left than asked for. */
int omv_ckio_get(omv_ckio_reader_t *rd, void *out, size_t len);
uint32_t omv_ckio_get_u32(omv_ckio_reader_t *rd, int *bad);
uint64_t omv_ckio_get_u64(omv_ckio_reader_t *rd, int *bad);
double omv_ckio_get_f64(omv_ckio_reader_t *rd, int *bad);

/* Says what is wrong (printf-style, into err[OMV_CHECKPOINT_ERR_MAX]) and returns -EINVAL. */
int omv_ckio_corrupt(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reads all of path into *ret_buf (malloc'd) and *ret_len. Returns 0 or a negative errno with
 * the reason in err. */
int omv_ckio_read_file(const char *path, unsigned char **ret_buf, size_t *ret_len, char *err);

/* Checks the frame: magic[8] and format at the start, the trailer's length and CRC-32 at the
 * end; what names the kind of file in errors. Returns the bytes before the trailer, or -EINVAL
 * (damaged) or -ENOTSUP (another format) with the reason in err. *ret_crc (optional) gets the
 * trailer's CRC. */
int64_t omv_ckio_check_frame(const unsigned char *buf, size_t len, const char *path,
                             const char *magic, uint32_t format, const char *what,
                             uint32_t *ret_crc, char *err);

/* Creates dir and its parents (mode 0750) as needed. Returns 0 or a negative errno. */
int omv_ckio_mkdirs(const char *dir);
