/* core/hash: SHA-256 (OpenSSL's libcrypto), for the prefix cache's
 * checksums and the model's artifact identity. */
#ifndef OSP_HASH_H
#define OSP_HASH_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"

typedef struct osp_sha256 osp_sha256;

/* NULL when out of memory. */
osp_sha256 *osp_sha256_new(void);
void osp_sha256_add(osp_sha256 *h, const void *p, size_t n);
/* The digest (32 bytes); the context is freed. */
void osp_sha256_end(osp_sha256 *h, unsigned char out[32]);
/* Lower-case hex of n bytes into out (2n + 1 bytes). */
void osp_hex(const unsigned char *p, size_t n, char *out);
/* SHA-256 of a file's contents, as hex (65 bytes); *bytes = its size. */
osp_status osp_sha256_file(const char *path, char out[65], int64_t *bytes);

#endif
