/* kv/: the KV cache of a batch of rows (one row = one sequence).
 *
 * Every row owns its storage, one block per (layer, row), allocated on
 * first use (by the backend's osp_kv_mem, in its memory) and grown in steps
 * of OSP_KV_STEP positions. This module keeps rows, positions, the budget
 * and the row operations; the backend reads and writes the blocks. Inside a block,
 * K then V, each [Hkv, cap, D]: f32 values, or (bits = 4|8) the affine-
 * quantized planes codes [Hkv, cap, D·bits/8], scales and biases
 * [Hkv, cap, D/group] bf16 (MLX's rules, backend/kvq.h), or (bits = 16)
 * bf16 values [Hkv, cap, D] read through the same accessors (the codes
 * plane; no scales or biases).
 *
 * Positions: row b holds pos[b] tokens. A full-attention layer keeps
 * position p at slot p. A sliding layer is a ring of `ring` = window +
 * spare slots, position p at slot p % ring: it never holds more than the
 * window plus the spare slots that speculative rollback needs. A layer
 * that shares another layer's KV (Gemma 4 E-series) has no storage and
 * reads its donor's.
 *
 * Rows are independent: each writes at its own positions, and attention
 * bounds each query by its own row's positions, so rows of different
 * lengths share a batch without left padding (the "mask" of causal,
 * window and padding is the per-row range [lo, p]). Row operations
 * (merge, filter, extract, trim, rollback) move or copy whole row blocks
 * and never convert between formats.
 */
#ifndef OSP_KV_H
#define OSP_KV_H

#include <stdint.h>
#include "backend/backend.h"
#include "core/core.h"

#define OSP_KV_STEP 256 /* full layers grow by this many positions */

typedef struct osp_kv_spec {
    int32_t n_kv_heads, head_dim;
    int32_t window;     /* 0 = full attention */
    int32_t share_from; /* donor layer index, or -1 */
    int32_t bits;       /* 0 = f32; 4 or 8 = affine-quantized; 16 = bf16 */
    int32_t group;      /* quantization group along head_dim (4/8 bits) */
} osp_kv_spec;

typedef struct osp_kv_layer {
    int sliding;
    int32_t window;  /* attention window (0 = full) */
    int32_t ring;    /* sliding: slots per row (window + spare); full: 0 */
    int32_t n_kv_heads, head_dim;
    int32_t donor;   /* layer whose storage this is (itself unless shared) */
    int32_t bits, group;
    int64_t slot_bytes; /* bytes per (head, slot) of one of K or V */
    int64_t cb, ng;     /* quantized: code bytes and groups per head vector */
    int32_t *cap;       /* [rows] slots allocated */
    unsigned char **mem; /* [rows] the row's block, NULL until used; all NULL for a sharing layer */
} osp_kv_layer;

typedef struct osp_kv {
    int32_t n_rows, n_layers, max_ctx, spare;
    int32_t *pos;            /* [rows] positions cached per row */
    int32_t *round;          /* [rows] position at round_begin, -1 outside a round */
    int64_t bytes;           /* allocated now */
    int64_t budget;          /* 0 = unlimited */
    osp_kv_spec *specs;      /* [n_layers] as created */
    const osp_kv_mem *mem;   /* where the blocks live (the backend's memory) */
    osp_kv_layer *layers;    /* [n_layers] */
} osp_kv;

/* spare: extra ring slots of sliding layers, the most tokens a speculative
 * round may roll back. mem: the backend's block allocator (NULL = host
 * memory). Nothing is allocated until rows are used. */
osp_status osp_kv_new(int32_t n_rows, int32_t n_layers, const osp_kv_spec *specs, int32_t max_ctx, int32_t spare,
                      const osp_kv_mem *mem, osp_kv **out);
void osp_kv_free(osp_kv *kv);
/* Forget a row and give its memory back. */
void osp_kv_reset_row(osp_kv *kv, int32_t row);
size_t osp_kv_bytes(const osp_kv *kv);
/* Bytes one row needs to hold n positions (what osp_kv_reserve allocates). */
int64_t osp_kv_row_bytes(const osp_kv *kv, int32_t n);
/* Make room for positions [0, n) of a row (grows blocks, keeping contents);
 * OSP_ERR_NOMEM when memory or the budget runs out (nothing lost). */
osp_status osp_kv_reserve(osp_kv *kv, int32_t row, int32_t n);

/* Storing a chunk's K/V is the backend's (osp_backend.kv_write): for batch
 * row i (kv row rows[i]) the T vectors k[(i*T + t) * Hkv*D ...] go to
 * positions pos[rows[i]] + t, as stored (f32, bf16 rounded to nearest even,
 * or quantized by MLX's rules); positions do not advance there. Rows must
 * be reserved. */

/* Forget the last n positions of a row; OSP_ERR_RANGE when a sliding ring
 * has already overwritten what the shorter row would need. */
osp_status osp_kv_trim(osp_kv *kv, int32_t row, int32_t n);
/* Speculative rounds: begin records every row's position; rollback keeps
 * keep[b] of the tokens each row added since (the rest is trimmed);
 * commit ends the round keeping everything. */
void osp_kv_round_begin(osp_kv *kv);
osp_status osp_kv_rollback(osp_kv *kv, const int32_t *keep);
void osp_kv_commit(osp_kv *kv);

/* Could a row holding P positions go back to position p (0 <= p <= P)?
 * Sliding rings must still hold every position a query at p would see. */
int osp_kv_resumable(const osp_kv *kv, int32_t P, int32_t p);
/* Same layer layout (kinds, rings, heads, formats, sharing, spare): rows
 * can be copied between the two. */
int osp_kv_same_layout(const osp_kv *a, const osp_kv *b);
/* A new one-row cache with positions [0, pos[row]) of `row` (capacity for
 * exactly that many: the prefix cache's entries). */
osp_status osp_kv_snapshot(const osp_kv *kv, int32_t row, osp_kv **out);
/* Row `row` (emptied first) becomes positions [0, n) of src's row sr, which
 * must be resumable at n (osp_kv_resumable); full layers copy n slots. */
osp_status osp_kv_load_row(osp_kv *kv, int32_t row, const osp_kv *src, int32_t sr, int32_t n);
/* A new one-row cache holding a copy of `row` (compact: no spare capacity). */
osp_status osp_kv_extract(const osp_kv *kv, int32_t row, osp_kv **out);
/* A new cache whose rows are the rows of parts[0], then parts[1], ...
 * (copies; all parts must have the same layer specs and context). */
osp_status osp_kv_merge(const osp_kv *const *parts, int32_t n, osp_kv **out);
/* Keep rows keep[0..n) (distinct, in that order) and free the others. */
osp_status osp_kv_filter(osp_kv *kv, const int32_t *keep, int32_t n);

static inline int32_t osp_kv_slot(const osp_kv_layer *l, int32_t p) { return l->sliding ? p % l->ring : p; }

/* f32 layers: K (which = 0) or V (1) of (row b, kv head h, slot). */
static inline float *osp_kv_f32(const osp_kv_layer *l, int32_t b, int which, int32_t h, int32_t slot) {
    return (float *)l->mem[b] + (((int64_t)which * l->n_kv_heads + h) * l->cap[b] + slot) * l->head_dim;
}

/* Quantized layers: the planes of K (0) or V (1) of (row b, head h) from
 * slot on: consecutive slots are consecutive rows of each plane. */
typedef struct osp_kv_qrows {
    unsigned char *codes;
    uint16_t *scales, *biases;
} osp_kv_qrows;

static inline osp_kv_qrows osp_kv_q(const osp_kv_layer *l, int32_t b, int which, int32_t h, int32_t slot) {
    int64_t cap = l->cap[b], H = l->n_kv_heads;
    unsigned char *base = l->mem[b] + (int64_t)which * H * cap * l->slot_bytes;
    int64_t i = (int64_t)h * cap + slot;
    osp_kv_qrows r;
    r.codes = base + i * l->cb;
    r.scales = (uint16_t *)(base + H * cap * l->cb) + i * l->ng;
    r.biases = (uint16_t *)(base + H * cap * l->cb) + H * cap * l->ng + i * l->ng;
    return r;
}

#endif
