/* libFuzzer: the HTTP request-head checks (server/head) on arbitrary bytes:
 * an accepted head must end inside the input and be followed by what its
 * framing says (nothing is read past the input; ASan checks); and every
 * accepted head must parse into a request (server/conn: method, path,
 * fields whose names and values hold no line breaks). */
#include <stdint.h>
#include <string.h>
#include "server/conn.h"
#include "server/head.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    srv_head h;
    int rc = srv_head_check((const char *)data, size, 32 * 1024, 8 * 1024, &h);
    if (rc > 0 && (h.head_len == 0 || h.head_len > size)) __builtin_trap();
    if (rc > 0 && h.chunked && h.content_length >= 0) __builtin_trap();
    if (rc < 0 && (h.status < 400 || h.status > 599)) __builtin_trap();
    if (rc > 0) {
        srv_req q;
        memset(&q, 0, sizeof q);
        if (!srv_req_parse_head(&q, (const char *)data, h.head_len)) {
            if (!q.method || !q.path || q.n_hdr < 0) __builtin_trap();
            for (int i = 0; i < q.n_hdr; i++)
                if (strpbrk(q.hname[i], "\r\n:") || strpbrk(q.hval[i], "\r\n")) __builtin_trap();
            if (q.http10 && q.n_hdr == 0 && !q.client_close) __builtin_trap(); /* HTTP/1.0 closes unless asked */
        }
        srv_req_clear(&q);
    }
    return 0;
}
