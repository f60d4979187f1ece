#include <math.h>
#include <string.h>
#include "attention.h"
#include "backend/kvq.h"
#include "core/threadpool.h"

/* scores[j - lo] = q · K[j] for cached positions j in [lo, end), in runs of
 * consecutive ring slots. */
static void cached_scores(const osp_attn_args *a, const osp_kv_layer *L, int32_t row, int32_t hk, const float *q,
                          int32_t lo, int32_t end, float *sc) {
    int32_t D = a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot; /* a ring wraps */
        if (L->bits) {
            osp_kv_qrows k = osp_kv_q(L, row, 0, hk, slot);
            osp_kvq_ops_get()->scores(q, D, L->bits, L->group, k.codes, k.scales, k.biases, run, sc + (j - lo));
        } else {
            a->ops->scores(sc + (j - lo), q, osp_kv_f32(L, row, 0, hk, slot), run, D, D);
        }
        j += run;
    }
}

/* o += sum_j p[j - lo] V[j] over cached positions [lo, end). */
static void cached_values(const osp_attn_args *a, const osp_kv_layer *L, int32_t row, int32_t hk, const float *p,
                          int32_t lo, int32_t end, float *o) {
    int32_t D = a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot;
        if (L->bits) {
            osp_kv_qrows v = osp_kv_q(L, row, 1, hk, slot);
            osp_kvq_ops_get()->wsum(o, p + (j - lo), run, D, L->bits, L->group, v.codes, v.scales, v.biases);
        } else {
            a->ops->wsum(o, p + (j - lo), osp_kv_f32(L, row, 1, hk, slot), run, D, D);
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
    const osp_attn_args *a;
    int32_t n_sub; /* tasks per (row, KV head): its query heads split into n_sub runs */
} attn_job;

static void attn_task(void *p, int64_t task) {
    const attn_job *job = p;
    const osp_attn_args *a = job->a;
    const osp_ops *ops = a->ops;
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
        int32_t cend = p < pos0 ? p + 1 : pos0; /* cached positions are [lo, cend) */
        int32_t j0 = cend > lo ? cend : lo;     /* this chunk's own positions [j0, p] */
        const float *kc = a->k + ((int64_t)b * a->T + (j0 - pos0)) * Hkv * D + (int64_t)hk * D;
        const float *vc = a->v + ((int64_t)b * a->T + (j0 - pos0)) * Hkv * D + (int64_t)hk * D;
        for (int32_t jb = lo; jb < cend; jb += blk) {
            int32_t je = jb + blk < cend ? jb + blk : cend;
            for (int32_t h = h0; h < h1; h++) {
                float *sc = a->scores + ((int64_t)b * Hq + h) * a->score_stride;
                cached_scores(a, L, row, hk, a->q + r * Hq * D + (int64_t)h * D, jb, je, sc + (jb - lo));
            }
        }
        for (int32_t h = h0; h < h1; h++) {
            float *sc = a->scores + ((int64_t)b * Hq + h) * a->score_stride;
            ops->scores(sc + (j0 - lo), a->q + r * Hq * D + (int64_t)h * D, kc, p - j0 + 1, (int64_t)Hkv * D, D);
            const float scale = a->scale, cap = a->softcap;
            if (cap > 0)
                for (int32_t i = 0; i < n; i++) sc[i] = cap * tanhf(sc[i] * scale / cap);
            else
                scale_in_place(sc, n, scale);
            ops->softmax(sc, n);
            memset(a->out + r * Hq * D + (int64_t)h * D, 0, sizeof(float) * D);
        }
        for (int32_t jb = lo; jb < cend; jb += blk) {
            int32_t je = jb + blk < cend ? jb + blk : cend;
            for (int32_t h = h0; h < h1; h++) {
                const float *sc = a->scores + ((int64_t)b * Hq + h) * a->score_stride;
                cached_values(a, L, row, hk, sc + (jb - lo), jb, je, a->out + r * Hq * D + (int64_t)h * D);
            }
        }
        for (int32_t h = h0; h < h1; h++) {
            const float *sc = a->scores + ((int64_t)b * Hq + h) * a->score_stride;
            float *o = a->out + r * Hq * D + (int64_t)h * D;
            ops->wsum(o, sc + (j0 - lo), vc, p - j0 + 1, (int64_t)Hkv * D, D);
        }
    }
}

/* One task per (row, KV head) when that gives every thread a few; else the
 * query heads of a KV head are split further (Gemma 4's single global KV
 * head). A head's numbers do not depend on the split. */
void osp_attention(const osp_attn_args *a) {
    int32_t G = a->n_heads / a->n_kv_heads, ns = 1, want = 4 * osp_threads_count();
    while (ns < G && (int64_t)a->nb * a->n_kv_heads * ns < want) ns *= 2;
    if (ns > G) ns = G;
    attn_job job = {a, ns};
    osp_parallel_for((int64_t)a->nb * a->n_kv_heads * ns, attn_task, &job);
}
