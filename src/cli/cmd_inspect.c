#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "core/fs.h"
#include "osprey.h"

int osp_cmd_inspect(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : osp_cli_default_model();
    if (!path || !strcmp(path, "-h") || !strcmp(path, "--help")) {
        fprintf(stderr, "usage: osprey inspect MODEL\n");
        return 2;
    }
    osp_model *m;
    osp_model_params mp = {.device = OSP_DEVICE_AUTO, .place = 0}; /* bind only: nothing is copied */
    if (osp_model_load_params(path, &mp, &m) != OSP_OK) return osp_cli_fail("inspect");
    const osp_model_info *in = osp_model_get_info(m);
    printf("model:            %s\n", path);
    printf("architecture:     %s (model_type %s)\n", in->architecture, in->model_type);
    printf("layers:           %d (%d sliding, window %d)\n", in->n_layers, in->n_sliding_layers, in->sliding_window);
    printf("hidden:           %d, heads %d, kv heads %d, head_dim %d, intermediate %d\n", in->hidden, in->n_heads,
           in->n_kv_heads, in->head_dim, in->intermediate);
    printf("vocab:            %d, max context %d\n", in->vocab, in->max_ctx);
    printf("parameters:       %lld (%.3f B)\n", (long long)in->n_params, in->n_params / 1e9);
    if (in->quant_bits)
        printf("weights:          MLX affine %d-bit, group %d (scales %s)\n", in->quant_bits, in->quant_group, in->dtype);
    else
        printf("weights:          %s\n", in->dtype);
    printf("weight bytes:     %lld (%.2f GiB); streamed per decode step %lld\n", (long long)in->weight_bytes,
           in->weight_bytes / 1073741824.0, (long long)in->decode_bytes);
    printf("kv bytes/token:   %lld (f32, full-attention layers)\n", (long long)in->kv_bytes_per_token);
    if (!in->has_head) printf("head:             none: an embedding model (osprey embed, serve --embedding-model)\n");
    if (in->n_sliding_layers)
        printf("kv sliding:       %lld bytes per sequence, fixed (f32, window %d)\n", (long long)in->kv_bytes_sliding,
               in->sliding_window);
    if (in->n_kv_shared_layers)
        printf("kv shared:        %d layers reuse an earlier layer's KV (no cache of their own)\n",
               in->n_kv_shared_layers);
    /* the artifact identity: what the prefix cache's files are keyed by (memoised in the cache folder) */
    char cache[4096], id[65];
    int have_cache = osp_cache_dir(cache, sizeof cache) && osp_mkdirs(cache) == 0;
    if (osp_model_identity(m, have_cache ? cache : NULL, id) == OSP_OK) printf("identity:         %s\n", id);
    else printf("identity:         (%s)\n", osp_last_error());
    osp_model_free(m);
    return 0;
}
