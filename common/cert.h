/* CURVE certificates in ZeroMQ's text form (what CZMQ's zcert writes): a public one (NAME.key,
 * to share) and a secret one (NAME.key_secret, mode 0600), keys in Z85, and the roles its holder
 * may take as metadata. Reading and writing only; making keys is the transport's. */
#pragma once

#include <stddef.h>

#define OMV_CERT_KEY_LEN 40 /* Z85 of 32 bytes */

enum {
    OMV_CERT_TRAINER = 1 << 0,
    OMV_CERT_EVALUATOR = 1 << 1,
    OMV_CERT_SHARD = 1 << 2, /* a shard server (omnivored --role shard) */
};

typedef struct {
    char public_key[OMV_CERT_KEY_LEN + 1];
    char secret_key[OMV_CERT_KEY_LEN + 1]; /* "" in a public certificate */
    unsigned roles;                        /* OMV_CERT_*; 0: none listed */
} omv_cert_t;

/* Reads the certificate at path. Returns 0, or a negative errno with the reason (naming the
 * file, never quoting it) in err[OMV_CONFIG_ERR_MAX]. */
int omv_cert_read(const char *path, omv_cert_t *ret, char *err);

/* Parses "trainer", "evaluator" or both, comma-separated, into OMV_CERT_* bits. Returns the
 * bits, or -EINVAL. */
int omv_cert_parse_roles(const char *text);

/* Writes dir/NAME.key (public key and roles, mode 0644) and dir/NAME.key_secret (both keys,
 * 0600); neither may exist. Returns 0 or a negative errno with the reason in err. */
int omv_cert_write(const char *dir, const char *name, const omv_cert_t *cert, char *err);

/* Where the certificate named by path is: a relative path is one of systemd's LoadCredential=
 * when $CREDENTIALS_DIRECTORY is set, else path itself. Writes out[cap]. */
void omv_cert_path(const char *path, char *out, size_t cap);

/* Whether s is a Z85 key: 40 characters of ZeroMQ's Z85 alphabet. */
int omv_cert_key_valid(const char *s);
