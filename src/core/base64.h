/* core/base64: RFC 4648 base64 (the standard alphabet, '=' padding). */
#ifndef OSP_BASE64_H
#define OSP_BASE64_H

#include <stddef.h>

/* The encoding of n bytes as a NUL-terminated buffer from osp_malloc (free with osp_free); NULL when out of
 * memory. */
char *osp_base64_encode(const void *data, size_t n);

#endif
