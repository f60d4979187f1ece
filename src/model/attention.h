/* model/attention: causal (optionally windowed) attention of a chunk of
 * new tokens against each row's cached past, shared by every architecture.
 *
 * Keys and values of positions before the chunk come from the KV cache
 * (storage layer kv->layers[layer], f32 or affine-quantized planes read
 * as stored); those of the chunk itself come from the chunk buffers, so
 * attention runs before the chunk is stored and a sliding ring never
 * needs more than its window. Batch row i is KV row rows[i]; each query
 * sees exactly its own row's positions [lo, p], so rows at different
 * positions need no padding and a row's numbers never depend on the
 * other rows of the batch.
 */
#ifndef OSP_ATTENTION_H
#define OSP_ATTENTION_H

#include "backend/ops.h"
#include "kv/kv.h"

typedef struct osp_attn_args {
    const osp_ops *ops;
    const osp_kv *kv;
    int32_t layer;               /* storage layer (a donor for shared KV) */
    const int32_t *rows;         /* [nb] KV rows of the batch */
    int32_t nb;
    int32_t T;                   /* new tokens per row */
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;                 /* multiplies q·k */
    float softcap;               /* 0 = none */
    int32_t window;              /* 0 = full causal; else a query sees itself and window-1 earlier */
    const float *q;              /* [nb*T, n_heads*D] */
    const float *k, *v;          /* [nb*T, n_kv_heads*D]: this chunk */
    float *out;                  /* [nb*T, n_heads*D] */
    float *scores;               /* [nb*n_heads, score_stride] scratch */
    int64_t score_stride;        /* >= max positions a query can see */
} osp_attn_args;

/* Runs on the thread pool, one task per (row, KV head) or per part of a KV
 * head's query heads. */
void osp_attention(const osp_attn_args *a);

#endif
