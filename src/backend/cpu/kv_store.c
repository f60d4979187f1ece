/* backend/cpu/kv_store: a chunk's K/V into the cache's blocks (kv/kv.h):
 * f32 copied, bf16 rounded to nearest even, 4/8-bit quantized by MLX's
 * rules (backend/kvq.h). */
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/kvq.h"
#include "kv/kv.h"
#include "tensor/quant.h"

static void put(osp_kv_layer *L, int32_t row, int32_t h, int32_t slot, const float *k, const float *v) {
    if (!L->bits) {
        memcpy(osp_kv_f32(L, row, 0, h, slot), k, sizeof(float) * L->head_dim);
        memcpy(osp_kv_f32(L, row, 1, h, slot), v, sizeof(float) * L->head_dim);
        return;
    }
    for (int which = 0; which < 2; which++) {
        osp_kv_qrows q = osp_kv_q(L, row, which, h, slot);
        if (L->bits == 16) {
            osp_kvq_quantize(which ? v : k, 1, L->head_dim, 16, 0, q.codes, NULL, NULL);
            continue;
        }
        osp_quantize_row(which ? v : k, L->head_dim, L->bits, L->group, q.codes, q.scales, q.biases);
    }
}

void osp_cpu_kv_write(osp_be_session *s, osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                      const osp_dbuf *kb, const osp_dbuf *vb, int32_t T) {
    (void)s;
    const float *k = (const float *)kb, *v = (const float *)vb;
    osp_kv_layer *L = &kv->layers[layer];
    int32_t Hkv = L->n_kv_heads, D = L->head_dim;
    for (int32_t i = 0; i < nb; i++) {
        int32_t b = rows[i], pos0 = kv->pos[b];
        int32_t t0 = L->sliding && T > L->ring ? T - L->ring : 0; /* older ones would be overwritten anyway */
        for (int32_t t = t0; t < T; t++)
            for (int32_t h = 0; h < Hkv; h++) {
                int64_t src = ((int64_t)i * T + t) * Hkv * D + (int64_t)h * D;
                put(L, b, h, osp_kv_slot(L, pos0 + t), k + src, v + src);
            }
    }
}

