/* libFuzzer: multipart/form-data bodies (server/multipart, the audio
 * uploads) on arbitrary bytes: every part found lies inside the body and is
 * named (nothing is read past the input; ASan checks). The first byte picks
 * the Content-Type's shape. */
#include <stdint.h>
#include <stdlib.h>
#include "server/multipart.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const CT[] = {"multipart/form-data; boundary=XyZ", "multipart/form-data; boundary=\"a b\"",
                                     "multipart/form-data; charset=utf-8; boundary=-", "text/plain"};
    if (!size) return 0;
    const char *ct = CT[data[0] % 4];
    const char *body = (const char *)data + 1, *err = NULL;
    size_t n = size - 1;
    srv_form *f = malloc(sizeof *f);
    if (!f) return 0;
    if (srv_multipart_parse(ct, body, n, f, &err) == 0) {
        for (int i = 0; i < f->n; i++) {
            const srv_part *p = &f->parts[i];
            if (!p->name || p->data < body || p->data + p->len > body + n) __builtin_trap();
        }
    } else if (!err) {
        __builtin_trap();
    }
    free(f);
    return 0;
}
