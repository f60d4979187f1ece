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

static void attn_task(void *p, int64_t task) {
    const osp_attn_args *a = p;
    const osp_ops *ops = a->ops;
    const osp_kv_layer *L = &a->kv->layers[a->layer];
    int32_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    int32_t b = (int32_t)(task / Hq), h = (int32_t)(task % Hq), hk = h / (Hq / Hkv);
    int32_t row = a->rows[b], pos0 = a->kv->pos[row];
    float *sc = a->scores + task * a->score_stride;
    for (int32_t t = 0; t < a->T; t++) {
        int64_t r = (int64_t)b * a->T + t;
        const float *q = a->q + r * Hq * D + (int64_t)h * D;
        int32_t p = pos0 + t;
        int32_t lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        int32_t n = p - lo + 1;
        int32_t cend = p < pos0 ? p + 1 : pos0; /* cached positions are [lo, cend) */
        cached_scores(a, L, row, hk, q, lo, cend, sc);
        int32_t j0 = cend > lo ? cend : lo; /* this chunk's own positions [j0, p] */
        ops->scores(sc + (j0 - lo), q, a->k + ((int64_t)b * a->T + (j0 - pos0)) * Hkv * D + (int64_t)hk * D, p - j0 + 1,
                    (int64_t)Hkv * D, D);
        for (int32_t i = 0; i < n; i++) {
            float v = sc[i] * a->scale;
            sc[i] = a->softcap > 0 ? a->softcap * tanhf(v / a->softcap) : v;
        }
        ops->softmax(sc, n);
        float *o = a->out + r * Hq * D + (int64_t)h * D;
        memset(o, 0, sizeof(float) * D);
        cached_values(a, L, row, hk, sc, lo, cend, o);
        for (int32_t j = cend > lo ? cend : lo; j <= p; j++)
            ops->axpy(o, sc[j - lo], a->v + ((int64_t)b * a->T + (j - pos0)) * Hkv * D + (int64_t)hk * D, D);
    }
}

void osp_attention(const osp_attn_args *a) {
    osp_parallel_for((int64_t)a->nb * a->n_heads, attn_task, (void *)a);
}
