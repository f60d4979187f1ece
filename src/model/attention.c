#include <math.h>
#include <string.h>
#include "attention.h"
#include "core/threadpool.h"

static void attn_task(void *p, int64_t task) {
    const osp_attn_args *a = p;
    const osp_ops *ops = a->ops;
    const osp_kv_layer *L = &a->kv->layers[a->layer];
    int32_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim;
    int32_t b = (int32_t)(task / Hq), h = (int32_t)(task % Hq), hk = h / (Hq / Hkv);
    int32_t pos0 = a->kv->pos[b];
    float *sc = a->scores + task * a->score_stride;
    for (int32_t t = 0; t < a->T; t++) {
        int64_t row = (int64_t)b * a->T + t;
        const float *q = a->q + row * Hq * D + (int64_t)h * D;
        int32_t p = pos0 + t;
        int32_t lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        int32_t n = p - lo + 1;
        /* cached positions [lo, pos0): contiguous runs of slots, one matvec each */
        int32_t cend = p < pos0 ? p + 1 : pos0;
        for (int32_t j = lo; j < cend;) {
            int32_t slot = osp_kv_slot(L, j), run = cend - j;
            if (slot + run > L->cap) run = L->cap - slot; /* a ring wraps */
            osp_weight kw = {.dtype = OSP_DT_F32, .rows = run, .cols = D,
                             .data = osp_kv_at(L, L->k, b, hk, j)};
            ops->matmul(&kw, q, 1, sc + (j - lo), run, 0, run);
            j += run;
        }
        for (int32_t j = cend > lo ? cend : lo; j <= p; j++) /* this chunk's own positions */
            sc[j - lo] = ops->dot(q, a->k + ((int64_t)b * a->T + (j - pos0)) * Hkv * D + (int64_t)hk * D, D);
        for (int32_t i = 0; i < n; i++) {
            float v = sc[i] * a->scale;
            sc[i] = a->softcap > 0 ? a->softcap * tanhf(v / a->softcap) : v;
        }
        ops->softmax(sc, n);
        float *o = a->out + row * Hq * D + (int64_t)h * D;
        memset(o, 0, sizeof(float) * D);
        for (int32_t j = lo; j < cend;) { /* cached runs of V slots */
            int32_t slot = osp_kv_slot(L, j), run = cend - j;
            if (slot + run > L->cap) run = L->cap - slot;
            ops->wsum(o, sc + (j - lo), osp_kv_at(L, L->v, b, hk, j), run, D, D);
            j += run;
        }
        for (int32_t j = cend > lo ? cend : lo; j <= p; j++)
            ops->axpy(o, sc[j - lo], a->v + ((int64_t)b * a->T + (j - pos0)) * Hkv * D + (int64_t)hk * D, D);
    }
}

void osp_attention(const osp_attn_args *a) {
    osp_parallel_for((int64_t)a->kv->n_rows * a->n_heads, attn_task, (void *)a);
}
