/* backend/cpu/bidir: attention without a causal mask over each row's own
 * positions (backend.h's osp_bidir_attn_args: a bidirectional encoder's,
 * EmbeddingGemma's), on the thread pool: one task per (row, query head,
 * block of queries). Each query's scores, softmax and weighted sum of V are
 * the ops table's kernels, as the causal attention's. */
#include <string.h>
#include "backend/cpu/cpu.h"
#include "core/threadpool.h"

#define BIDIR_Q 16 /* queries per task */

typedef struct bidir_ctx {
    const osp_ops *ops;
    const osp_bidir_attn_args *a;
    int64_t qblocks;
} bidir_ctx;

static void bidir_task(void *p, int64_t task) {
    const bidir_ctx *c = p;
    const osp_bidir_attn_args *a = c->a;
    const int64_t D = a->head_dim, Hq = a->n_heads, Hkv = a->n_kv_heads, T = a->T;
    const int64_t ldq = Hq * D, ldk = Hkv * D;
    const int64_t qb = task % c->qblocks, h = (task / c->qblocks) % Hq, b = task / c->qblocks / Hq;
    const int64_t hk = h / (Hq / Hkv), len = a->len ? a->len[b] : T;
    const float *q = (const float *)a->q + b * T * ldq, *k = (const float *)a->k + b * T * ldk + hk * D,
                *v = (const float *)a->v + b * T * ldk + hk * D;
    float *out = (float *)a->out + b * T * ldq, sc[OSP_BIDIR_MAX_T];
    for (int64_t t = qb * BIDIR_Q; t < T && t < (qb + 1) * BIDIR_Q; t++) {
        int64_t lo = 0, hi = len;
        if (a->radius > 0) {
            lo = t - a->radius + 1 > 0 ? t - a->radius + 1 : 0;
            hi = t + a->radius < len ? t + a->radius : len;
        }
        float *o = out + t * ldq + h * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        if (hi <= lo) continue;
        c->ops->scores(sc, q + t * ldq + h * D, k + lo * ldk, hi - lo, ldk, D);
        for (int64_t j = 0; j < hi - lo; j++) sc[j] *= a->scale;
        if (a->softcap > 0) c->ops->softcap(sc, hi - lo, a->softcap);
        c->ops->softmax(sc, hi - lo);
        c->ops->wsum(o, sc, v + lo * ldk, hi - lo, ldk, D);
    }
}

void osp_cpu_bidir_attention(osp_be_session *s, const osp_bidir_attn_args *a) {
    bidir_ctx c = {s->ops, a, (a->T + BIDIR_Q - 1) / BIDIR_Q};
    osp_parallel_for((int64_t)a->nb * a->n_heads * c.qblocks, bidir_task, &c);
}
