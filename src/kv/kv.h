/* kv/: the KV cache of a batch of rows.
 *
 * Layout per layer: K and V are [B, Hkv, cap, D] f32. Full-attention
 * layers hold cap = max_ctx positions, position p at slot p. Sliding
 * layers are ring buffers of cap = window slots, position p at slot
 * p % window: they never hold more than the window. Each row b has its
 * own position count pos[b] (tokens already in the cache), so rows
 * advance independently.
 */
#ifndef OSP_KV_H
#define OSP_KV_H

#include <stdint.h>
#include "core/core.h"

typedef struct osp_kv_layer {
    int sliding;
    int32_t cap;     /* slots per (row, head) */
    float *k, *v;    /* [B, Hkv, cap, D] */
} osp_kv_layer;

typedef struct osp_kv {
    int32_t n_rows, n_layers, n_kv_heads, head_dim, max_ctx;
    int32_t *pos;            /* [B] positions already cached per row */
    osp_kv_layer *layers;    /* [n_layers] */
} osp_kv;

/* layer_sliding[i] != 0 makes layer i a ring of `window` slots. */
osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, int32_t n_kv_heads, int32_t head_dim,
                      int32_t max_ctx, const uint8_t *layer_sliding, int32_t window, osp_kv **out);
void osp_kv_free(osp_kv *kv);
void osp_kv_reset_row(osp_kv *kv, int32_t row);
size_t osp_kv_bytes(const osp_kv *kv);

static inline int32_t osp_kv_slot(const osp_kv_layer *l, int32_t p) {
    return l->sliding ? p % l->cap : p;
}

/* Pointer to K (or V) of (row b, kv head h, position p). */
static inline float *osp_kv_at(const osp_kv *kv, const osp_kv_layer *l, float *base, int32_t b,
                               int32_t h, int32_t p) {
    return base + (((int64_t)b * kv->n_kv_heads + h) * l->cap + osp_kv_slot(l, p)) * kv->head_dim;
}

#endif
