/* core/base64: encoding (the embeddings route's encoding_format "base64"). */
#include <stdint.h>
#include "base64.h"
#include "core.h"

char *osp_base64_encode(const void *data, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *p = data;
    char *out = osp_malloc(OSP_POOL_MISC, (n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = A[v >> 18], *o++ = A[v >> 12 & 63], *o++ = A[v >> 6 & 63], *o++ = A[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *o++ = A[v >> 18], *o++ = A[v >> 12 & 63], *o++ = '=', *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *o++ = A[v >> 18], *o++ = A[v >> 12 & 63], *o++ = A[v >> 6 & 63], *o++ = '=';
    }
    *o = 0;
    return out;
}
