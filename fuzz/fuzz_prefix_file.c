/* libFuzzer: the prefix cache's file reader (kv/prefix_file.c) on arbitrary
 * bytes: the header check, the token index and a full load into a small
 * cache of every layer kind (full f32, a sliding ring, 8-bit planes, a
 * layer sharing another's KV). Whatever the bytes, a file is either
 * rejected or loads into blocks of exactly the sizes its layout gives (ASan
 * checks the copies). The namespace is the one a file must carry. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kv/prefix.h"
#include "kv/prefix_file.h"

static osp_kv *like;
static char ns[65], path[128];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!like) {
        osp_kv_spec specs[4] = {{2, 32, 0, -1, 0, 0}, {2, 32, 8, -1, 16, 0}, {1, 64, 0, -1, 8, 32}, {2, 32, 0, 0, 0, 0}};
        if (osp_kv_new(1, 4, specs, 64, 2, NULL, &like) != OSP_OK) abort();
        osp_prefix_namespace("fuzz", like, "fuzz", ns);
        snprintf(path, sizeof path, "/tmp/osp_fuzz_pcf_%ld.kvc", (long)getpid());
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    int32_t *tokens = NULL, n = 0;
    int64_t fsize = 0;
    if (osp_pcf_read_head(path, ns, &tokens, &n, &fsize) == OSP_OK) {
        osp_kv *kv = NULL;
        if (osp_pcf_load(path, ns, tokens, n, like, &kv) == OSP_OK) {
            if (kv->pos[0] != n) __builtin_trap();
            osp_kv_free(kv);
        }
        free(tokens);
    }
    unlink(path);
    return 0;
}
