#include <stdlib.h>
#include <string.h>
#include "kv.h"

osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                      int32_t max_ctx, const uint8_t *layer_sliding, int32_t window, osp_kv **out) {
    *out = NULL;
    if (n_rows <= 0 || max_ctx <= 0) return osp_err(OSP_ERR_INVALID, "KV cache needs rows > 0 and context > 0");
    osp_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_err(OSP_ERR_NOMEM, "out of memory");
    kv->n_rows = n_rows;
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->max_ctx = max_ctx;
    kv->pos = calloc((size_t)n_rows, sizeof *kv->pos);
    kv->layers = calloc((size_t)n_layers, sizeof *kv->layers);
    if (!kv->pos || !kv->layers) goto oom;
    for (int i = 0; i < n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        l->sliding = layer_sliding && layer_sliding[i] && window > 0 && window < max_ctx;
        l->cap = l->sliding ? window : max_ctx;
        size_t n = (size_t)n_rows * n_kv_heads * l->cap * head_dim * sizeof(float);
        l->k = osp_calloc(OSP_POOL_KV, n);
        l->v = osp_calloc(OSP_POOL_KV, n);
        if (!l->k || !l->v) goto oom;
    }
    *out = kv;
    return OSP_OK;
oom:
    osp_kv_free(kv);
    return osp_err(OSP_ERR_NOMEM, "out of memory allocating the KV cache (%d rows x %d positions)",
                   n_rows, max_ctx);
}

void osp_kv_free(osp_kv *kv) {
    if (!kv) return;
    if (kv->layers)
        for (int i = 0; i < kv->n_layers; i++) {
            osp_free(kv->layers[i].k);
            osp_free(kv->layers[i].v);
        }
    free(kv->layers);
    free(kv->pos);
    free(kv);
}

void osp_kv_reset_row(osp_kv *kv, int32_t row) {
    if (row >= 0 && row < kv->n_rows) kv->pos[row] = 0;
}

size_t osp_kv_bytes(const osp_kv *kv) {
    size_t t = 0;
    for (int i = 0; i < kv->n_layers; i++)
        t += 2 * (size_t)kv->n_rows * kv->n_kv_heads * kv->layers[i].cap * kv->head_dim * sizeof(float);
    return t;
}
