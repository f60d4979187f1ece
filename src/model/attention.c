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
        for (int32_t j = lo; j <= p; j++) {
            const float *kp = j >= pos0 ? a->k + ((int64_t)b * a->T + (j - pos0)) * Hkv * D + (int64_t)hk * D
                                        : osp_kv_at(L, L->k, b, hk, j);
            float s = ops->dot(q, kp, D) * a->scale;
            if (a->softcap > 0) s = a->softcap * tanhf(s / a->softcap);
            sc[j - lo] = s;
        }
        ops->softmax(sc, n);
        float *o = a->out + row * Hq * D + (int64_t)h * D;
        memset(o, 0, sizeof(float) * D);
        for (int32_t j = lo; j <= p; j++) {
            const float *vp = j >= pos0 ? a->v + ((int64_t)b * a->T + (j - pos0)) * Hkv * D + (int64_t)hk * D
                                        : osp_kv_at(L, L->v, b, hk, j);
            ops->axpy(o, sc[j - lo], vp, D);
        }
    }
}

void osp_attention(const osp_attn_args *a) {
    osp_parallel_for((int64_t)a->kv->n_rows * a->n_heads, attn_task, (void *)a);
}
