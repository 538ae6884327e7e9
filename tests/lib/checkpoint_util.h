/* Helpers for the checkpoint file's suites (test_checkpoint*.c): the file's layout as the
 * tests pin it, a temporary folder, files built and damaged by hand, and checkpoints made in
 * memory and compared field by field (checkpoint_util.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"

/* The on-disk layout is a contract with files already written, so the tests pin it here rather
 * than borrow the writer's constants: "OMVCKPT\n", u32 format, u32 sections; sections of u32 tag,
 * u32 zero, u64 length; a trailer of u64 body length, u32 CRC-32 of the body, "OEND". */
#define HEADER_BYTES 16
#define SECTION_BYTES 16
#define TRAILER_BYTES 16
#define META_BYTES 140
enum {
    TAG_META = 1,
    TAG_CLOCKS,
    TAG_PARAMS,
    TAG_VELOCITY,
    TAG_HISTORY,
    TAG_JOB,
    TAG_MEMBERS,
    TAG_OPTIMIZER
};
/* The optimizer section's fixed part, before its phases (32 bytes each). */
#define OPT_FIXED_BYTES 84
#define OPT_PHASE_BYTES 32

/* The test's folder (setup makes it, teardown removes it). */
extern char dir[4096];

/* ---- files and folders ---- */

/* The fixture: a fresh temporary folder in dir, removed with everything in it afterwards. */
void setup(void);
void teardown(void);
/* The names in folder, sorted and joined by spaces, so a test can say what must be there. */
const char *listing(const char *folder);
/* A whole file, malloc'd (the caller frees it); its length in ret_len. */
unsigned char *slurp(const char *path, size_t *ret_len);
/* Writes data[len] as path. */
void spill(const char *path, const void *data, size_t len);
/* Writes text as folder/name. */
void put_text(const char *folder, const char *name, const char *text);
void copy_file(const char *from, const char *to);
/* Inverts the byte at offset at of path. */
void flip_byte(const char *path, size_t at);
void truncate_to(const char *path, size_t len);
size_t file_size(const char *path);
/* The path of checkpoint seq in folder (static storage: the next call overwrites it). */
const char *ckpt_path(const char *folder, uint64_t seq);
/* ---- building files by hand, with a correct checksum ---- */

/* Bytes that grow as they are appended to; data is malloc'd (the caller frees it). */
typedef struct {
    unsigned char *data;
    size_t len, cap;
} bytes_t;

void b_put(bytes_t *b, const void *p, size_t len);
void b_u32(bytes_t *b, uint32_t v);
void b_u64(bytes_t *b, uint64_t v);
void b_f64(bytes_t *b, double v);
/* The file's header: magic, format and number of sections. */
void b_header(bytes_t *b, uint32_t format, uint32_t sections);
/* A section: its header (tag, zero, length) and data[len]. */
void b_section(bytes_t *b, uint32_t tag, const void *data, uint64_t len);
/* A meta section as the reader expects it (140 bytes). */
void b_meta(bytes_t *b, uint64_t seq, uint32_t n_groups, uint64_t param_count, uint32_t n_history);
/* Appends the trailer to body b and writes the file. */
void b_seal_to(bytes_t *b, const char *path);
/* The body of an existing file (everything before the trailer), to add sections to. */
bytes_t body_of(const char *path);
/* Offset of the header of section tag in a file's bytes. */
size_t section_at(const unsigned char *buf, size_t len, uint32_t tag);
/* ---- checkpoints in memory ---- */

/* A checkpoint whose arrays are malloc'd (release with omv_checkpoint_fini). Values above 2^32
 * where the field is 64 bits wide, so a 32-bit slip would show. */
void make(omv_checkpoint_t *c, uint64_t seq, uint64_t param_count, uint32_t n_groups,
          uint32_t n_history, uint64_t seed);
/* Every field of got is bit-identical to want. */
void assert_same(const omv_checkpoint_t *got, const omv_checkpoint_t *want);
/* Writes c into folder, which must succeed with the file named after c's seq. */
void write_ok(const omv_checkpoint_t *c, const char *folder);
/* Writes a small checkpoint numbered seq into folder. */
void write_seq(const char *folder, uint64_t seq);
/* ---- the optimizer's section ---- */

/* A file whose optimizer section is body[len] (the rest as make() writes it). */
void write_with_optimizer_section(const char *path, const void *body, size_t len);
/* The fixed part of an optimizer section as layout 1 writes it, for n phases. */
void b_opt_fixed(bytes_t *b, uint32_t layout, uint32_t running, uint32_t n);
