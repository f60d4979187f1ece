/* kv/: the KV cache of a batch of rows.
 *
 * Layout per layer: K and V are [B, Hkv, cap, D] f32, with Hkv and D per
 * layer (Gemma 4 mixes head sizes). Full-attention layers hold cap =
 * max_ctx positions, position p at slot p. Sliding layers are ring
 * buffers of cap = window slots, position p at slot p % window: they
 * never hold more than the window. A layer that shares another layer's
 * KV (Gemma 4 E-series) allocates nothing and points at its donor. Each
 * row b has its own position count pos[b] (tokens already in the cache),
 * so rows advance independently.
 */
#ifndef OSP_KV_H
#define OSP_KV_H

#include <stdint.h>
#include "core/core.h"

typedef struct osp_kv_spec {
    int32_t n_kv_heads, head_dim;
    int32_t window;     /* 0 = full attention */
    int32_t share_from; /* donor layer index, or -1 */
} osp_kv_spec;

typedef struct osp_kv_layer {
    int sliding;
    int32_t cap;     /* slots per (row, head) */
    int32_t n_kv_heads, head_dim;
    int32_t donor;   /* layer whose storage this is (itself unless shared) */
    float *k, *v;    /* [B, Hkv, cap, D]; NULL for a sharing layer */
} osp_kv_layer;

typedef struct osp_kv {
    int32_t n_rows, n_layers, max_ctx;
    int32_t *pos;            /* [B] positions already cached per row */
    osp_kv_layer *layers;    /* [n_layers] */
} osp_kv;

osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, const osp_kv_spec *specs, int32_t max_ctx,
                      osp_kv **out);
void osp_kv_free(osp_kv *kv);
void osp_kv_reset_row(osp_kv *kv, int32_t row);
size_t osp_kv_bytes(const osp_kv *kv);
/* Store a chunk's K/V ([B, T, Hkv, D]) of storage layer `layer` at each
 * row's positions pos[b] .. pos[b]+T-1 (positions do not advance here). */
void osp_kv_write(osp_kv *kv, int32_t layer, const float *k, const float *v, int32_t T);

static inline int32_t osp_kv_slot(const osp_kv_layer *l, int32_t p) {
    return l->sliding ? p % l->cap : p;
}

/* Pointer to K (or V) of (row b, kv head h, position p) in storage layer l. */
static inline float *osp_kv_at(const osp_kv_layer *l, float *base, int32_t b, int32_t h, int32_t p) {
    return base + (((int64_t)b * l->n_kv_heads + h) * l->cap + osp_kv_slot(l, p)) * l->head_dim;
}

#endif
