/* libFuzzer: request-body decoding (server/body) on arbitrary bytes. The
 * first byte picks the framing (chunked or a Content-Length) and the limit;
 * the rest is fed whole, then one byte at a time: both must decode the same
 * body, use the same bytes and end the same way, never writing past the
 * input's size nor decoding past the limit (ASan checks the rest). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/body.h"

static size_t run(const char *in, size_t n, int chunked, size_t limit, size_t step, char *out, size_t *out_len,
                  srv_body *b) {
    srv_body_init(b, chunked, chunked ? 0 : limit / 2, limit);
    size_t used = 0;
    *out_len = 0;
    while (used < n && !b->done && !b->status) {
        size_t k = step && n - used > step ? step : n - used, got = 0;
        size_t u = srv_body_feed(b, in + used, k, out + *out_len, &got);
        if (u > k || got > u) __builtin_trap();
        *out_len += got;
        used += u;
        if (u < k) break;
    }
    return used;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    int chunked = data[0] & 1;
    size_t limit = (size_t)(data[0] >> 1) * 3;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    char *a = malloc(n + 1), *b = malloc(n + 1);
    srv_body ba, bb;
    size_t la, lb;
    size_t ua = run(in, n, chunked, limit, 0, a, &la, &ba);
    size_t ub = run(in, n, chunked, limit, 1, b, &lb, &bb);
    if (ua != ub || la != lb || memcmp(a, b, la) || ba.done != bb.done || ba.status != bb.status) __builtin_trap();
    if (la > limit || ba.total != la || (ba.done && ba.status)) __builtin_trap();
    if (ba.status && ba.status != 400 && ba.status != 413) __builtin_trap();
    free(a);
    free(b);
    return 0;
}
