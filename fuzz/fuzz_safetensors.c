/* libFuzzer: the safetensors header parser (model/safetensors) on arbitrary
 * bytes: every accepted tensor must lie inside the buffer (ASan checks the
 * reads below). */
#include <stdint.h>
#include <string.h>
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_st *st;
    if (osp_st_open_mem(data, size, "fuzz", &st) != OSP_OK) return 0;
    volatile unsigned char sink = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const osp_st_tensor *t = &st->tensors[i];
        if (t->nbytes) sink ^= ((const unsigned char *)t->data)[0] ^ ((const unsigned char *)t->data)[t->nbytes - 1];
        if (osp_st_find(st, t->name) != t) __builtin_trap();
    }
    (void)sink;
    osp_st_close(st);
    return 0;
}
