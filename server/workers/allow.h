/* The allow-list folder: one public certificate per admitted key (NAME.key, as omnivorectl
 * keygen writes them), each naming the roles its holder may take. Read afresh at every look-up,
 * so that a key removed from the folder is refused at its next handshake or registration. */
#pragma once

/* Looks for public_key (Z85) among dir's *.key certificates. Returns 1 with its roles
 * (OMV_CERT_* bits) in *ret_roles, 0 when no certificate there has it, or a negative errno
 * when the folder cannot be read. Unreadable or malformed certificates are skipped. */
int omv_allow_find(const char *dir, const char *public_key, unsigned *ret_roles);

/* Checks that dir can be read; returns 0 or a negative errno. */
int omv_allow_check(const char *dir);
