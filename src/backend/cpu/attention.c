/* backend/cpu/attention: causal (optionally windowed) attention of a chunk
 * of new tokens against each row's cached past, on the thread pool.
 *
 * Keys and values of positions before the chunk come from the KV cache
 * (storage layer kv->layers[layer], f32, bf16 or affine-quantized planes
 * read as stored); those of the chunk itself come from the chunk buffers,
 * so attention runs before the chunk is stored and a sliding ring never
 * needs more than its window. Batch row i is KV row rows[i]; each query
 * sees exactly its own row's positions [lo, p], so rows at different
 * positions need no padding and a row's numbers never depend on the other
 * rows of the batch. */
#include <math.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/kvq.h"
#include "core/threadpool.h"
#include "kv/kv.h"

/* The chunk's arrays, as host pointers, and the kernels. */
typedef struct attn_view {
    const osp_attn_args *a;
    const osp_ops *ops;
    const float *q, *k, *v;
    float *out, *scores;
} attn_view;

/* scores[j - lo] = q · K[j] for cached positions j in [lo, end), in runs of
 * consecutive ring slots. */
static void cached_scores(const attn_view *w, const osp_kv_layer *L, int32_t row, int32_t hk, const float *q,
                          int32_t lo, int32_t end, float *sc) {
    int32_t D = w->a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot; /* a ring wraps */
        if (L->bits) {
            osp_kv_qrows k = osp_kv_q(L, row, 0, hk, slot);
            osp_kvq_ops_get()->scores(q, D, L->bits, L->group, k.codes, k.scales, k.biases, run, sc + (j - lo));
        } else {
            w->ops->scores(sc + (j - lo), q, osp_kv_f32(L, row, 0, hk, slot), run, D, D);
        }
        j += run;
    }
}

/* o += sum_j p[j - lo] V[j] over cached positions [lo, end). */
static void cached_values(const attn_view *w, const osp_kv_layer *L, int32_t row, int32_t hk, const float *p,
                          int32_t lo, int32_t end, float *o) {
    int32_t D = w->a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot;
        if (L->bits) {
            osp_kv_qrows v = osp_kv_q(L, row, 1, hk, slot);
            osp_kvq_ops_get()->wsum(o, p + (j - lo), run, D, L->bits, L->group, v.codes, v.scales, v.biases);
        } else {
            w->ops->wsum(o, p + (j - lo), osp_kv_f32(L, row, 1, hk, slot), run, D, D);
        }
        j += run;
    }
}

/* x *= s, vectorized (the per-element softcap test in the same loop kept it
 * scalar: 7% of a 4K-token prefill); each product as the scalar one. */
__attribute__((optimize("tree-vectorize"))) static void scale_in_place(float *x, int32_t n, float s) {
    for (int32_t i = 0; i < n; i++) x[i] *= s;
}

/* Positions per block: the query heads of one KV head take turns on a
 * block of K (then of V) while it is in L1, so a long cache is read from
 * memory once per KV head instead of once per query head. */
static int32_t block_positions(int32_t D) { return D >= 256 ? 16 : 4096 / D; }

typedef struct attn_job {
    attn_view w;
    int32_t n_sub; /* tasks per (row, KV head): its query heads split into n_sub runs */
} attn_job;

static void attn_task(void *p, int64_t task) {
    const attn_job *job = p;
    const attn_view *w = &job->w;
    const osp_attn_args *a = w->a;
    const osp_ops *ops = w->ops;
    const osp_kv_layer *L = &a->kv->layers[a->layer];
    int32_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim, G = Hq / Hkv, ns = job->n_sub;
    int32_t b = (int32_t)(task / ((int64_t)Hkv * ns)), hk = (int32_t)(task / ns % Hkv), sub = (int32_t)(task % ns);
    int32_t h0 = hk * G + sub * G / ns, h1 = hk * G + (sub + 1) * G / ns; /* query heads [h0, h1) */
    int32_t row = a->rows[b], pos0 = a->kv->pos[row], blk = block_positions(D);
    for (int32_t t = 0; t < a->T; t++) {
        int64_t r = (int64_t)b * a->T + t;
        int32_t p = pos0 + t;
        int32_t lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        int32_t n = p - lo + 1;
        int32_t cend = a->chunk_stored ? p : pos0; /* cached positions are [lo, cend) */
        int32_t j0 = cend > lo ? cend : lo;     /* this chunk's own positions [j0, p] */
        const float *kc = w->k + ((int64_t)b * a->T + (j0 - pos0)) * Hkv * D + (int64_t)hk * D;
        const float *vc = w->v + ((int64_t)b * a->T + (j0 - pos0)) * Hkv * D + (int64_t)hk * D;
        for (int32_t jb = lo; jb < cend; jb += blk) {
            int32_t je = jb + blk < cend ? jb + blk : cend;
            for (int32_t h = h0; h < h1; h++) {
                float *sc = w->scores + ((int64_t)b * Hq + h) * a->score_stride;
                cached_scores(w, L, row, hk, w->q + r * Hq * D + (int64_t)h * D, jb, je, sc + (jb - lo));
            }
        }
        for (int32_t h = h0; h < h1; h++) {
            float *sc = w->scores + ((int64_t)b * Hq + h) * a->score_stride;
            ops->scores(sc + (j0 - lo), w->q + r * Hq * D + (int64_t)h * D, kc, p - j0 + 1, (int64_t)Hkv * D, D);
            const float scale = a->scale, cap = a->softcap;
            if (cap > 0)
                for (int32_t i = 0; i < n; i++) sc[i] = cap * tanhf(sc[i] * scale / cap);
            else
                scale_in_place(sc, n, scale);
            ops->softmax(sc, n);
            memset(w->out + r * Hq * D + (int64_t)h * D, 0, sizeof(float) * D);
        }
        for (int32_t jb = lo; jb < cend; jb += blk) {
            int32_t je = jb + blk < cend ? jb + blk : cend;
            for (int32_t h = h0; h < h1; h++) {
                const float *sc = w->scores + ((int64_t)b * Hq + h) * a->score_stride;
                cached_values(w, L, row, hk, sc + (jb - lo), jb, je, w->out + r * Hq * D + (int64_t)h * D);
            }
        }
        for (int32_t h = h0; h < h1; h++) {
            const float *sc = w->scores + ((int64_t)b * Hq + h) * a->score_stride;
            float *o = w->out + r * Hq * D + (int64_t)h * D;
            ops->wsum(o, sc + (j0 - lo), vc, p - j0 + 1, (int64_t)Hkv * D, D);
        }
    }
}

/* One task per (row, KV head) when that gives every thread a few; else the
 * query heads of a KV head are split further (Gemma 4's single global KV
 * head). A head's numbers do not depend on the split. */
void osp_cpu_attention(osp_be_session *s, const osp_attn_args *a) {
    int32_t G = a->n_heads / a->n_kv_heads, ns = 1, want = 4 * osp_threads_count();
    while (ns < G && (int64_t)a->nb * a->n_kv_heads * ns < want) ns *= 2;
    if (ns > G) ns = G;
    attn_job job = {{a, s->ops, (const float *)a->q, (const float *)a->k, (const float *)a->v, (float *)a->out,
                     (float *)a->scores},
                    ns};
    osp_parallel_for((int64_t)a->nb * a->n_kv_heads * ns, attn_task, &job);
}
