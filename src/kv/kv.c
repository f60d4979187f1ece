#include <stdlib.h>
#include <string.h>
#include "kv.h"

osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, const osp_kv_spec *specs, int32_t max_ctx,
                      osp_kv **out) {
    *out = NULL;
    if (n_rows <= 0 || max_ctx <= 0) return osp_err(OSP_ERR_INVALID, "KV cache needs rows > 0 and context > 0");
    osp_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_err(OSP_ERR_NOMEM, "out of memory");
    kv->n_rows = n_rows;
    kv->n_layers = n_layers;
    kv->max_ctx = max_ctx;
    kv->pos = calloc((size_t)n_rows, sizeof *kv->pos);
    kv->layers = calloc((size_t)n_layers, sizeof *kv->layers);
    if (!kv->pos || !kv->layers) goto oom;
    for (int i = 0; i < n_layers; i++) {
        osp_kv_layer *l = &kv->layers[i];
        const osp_kv_spec *s = &specs[i];
        l->n_kv_heads = s->n_kv_heads;
        l->head_dim = s->head_dim;
        l->sliding = s->window > 0 && s->window < max_ctx;
        l->cap = l->sliding ? s->window : max_ctx;
        l->donor = i;
        if (s->share_from >= 0 && s->share_from < i) {
            l->donor = s->share_from;
            continue;
        }
        size_t n = (size_t)n_rows * l->n_kv_heads * l->cap * l->head_dim * sizeof(float);
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
    for (int i = 0; i < kv->n_layers; i++) {
        const osp_kv_layer *l = &kv->layers[i];
        if (l->k) t += 2 * (size_t)kv->n_rows * l->n_kv_heads * l->cap * l->head_dim * sizeof(float);
    }
    return t;
}

void osp_kv_write(osp_kv *kv, int32_t layer, const float *k, const float *v, int32_t T) {
    osp_kv_layer *L = &kv->layers[layer];
    int32_t Hkv = L->n_kv_heads, D = L->head_dim;
    for (int32_t b = 0; b < kv->n_rows; b++) {
        int32_t pos0 = kv->pos[b];
        int32_t t0 = L->sliding && T > L->cap ? T - L->cap : 0; /* older ones would be overwritten anyway */
        for (int32_t t = t0; t < T; t++)
            for (int32_t h = 0; h < Hkv; h++) {
                int64_t src = ((int64_t)b * T + t) * Hkv * D + (int64_t)h * D;
                memcpy(osp_kv_at(L, L->k, b, h, pos0 + t), k + src, sizeof(float) * D);
                memcpy(osp_kv_at(L, L->v, b, h, pos0 + t), v + src, sizeof(float) * D);
            }
    }
}
