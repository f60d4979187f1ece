/* libFuzzer: the HTTP request-head checks (server/head) on arbitrary bytes:
 * an accepted head must end inside the input and be followed by what its
 * framing says (nothing is read past the input; ASan checks). */
#include <stdint.h>
#include "server/head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    srv_head h;
    int rc = srv_head_check((const char *)data, size, 32 * 1024, 8 * 1024, &h);
    if (rc > 0 && (h.head_len == 0 || h.head_len > size)) __builtin_trap();
    if (rc > 0 && h.chunked && h.content_length >= 0) __builtin_trap();
    if (rc < 0 && (h.status < 400 || h.status > 599)) __builtin_trap();
    return 0;
}
