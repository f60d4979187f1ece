/* backend/fused: the fused operations of backend.h as sequences of plain operations, in the order a model
 * issues them. A backend without the entry gets these (osp_be_*); a backend with it gives the same numbers,
 * bitwise, in fewer launches. */
#include "backend/backend.h"

void osp_fused_add_rmsnorm(const osp_backend *be, osp_be_session *s, osp_dbuf *y, osp_dbuf *x, const osp_dbuf *t,
                           const osp_dbuf *w, int64_t n, int64_t d, float eps, int add_one) {
    be->add(s, x, t, n * d);
    be->rmsnorm(s, y, x, w, n, d, eps, add_one);
}

void osp_fused_rope_qk(const osp_backend *be, osp_be_session *s, const osp_rope_qk_args *a) {
    const int64_t N = (int64_t)a->B * a->T;
    if (a->q_norm) be->rmsnorm(s, a->q, a->q, a->q_norm, N * a->q_heads, a->D, a->eps, a->add_one);
    be->rope(s, a->q, a->B, a->T, a->q_heads, a->D, a->inv_freq, a->pos);
    if (a->k) {
        if (a->k_norm) be->rmsnorm(s, a->k, a->k, a->k_norm, N * a->k_heads, a->D, a->eps, a->add_one);
        be->rope(s, a->k, a->B, a->T, a->k_heads, a->D, a->inv_freq, a->pos);
    }
    if (a->kv) be->kv_write(s, a->kv, a->layer, a->rows, a->B, a->k, a->v, a->T);
    if (a->attn) be->attention(s, a->attn);
}

void osp_fused_gate_up_act(const osp_backend *be, osp_be_session *s, osp_act act, const osp_weight *gate,
                           const osp_weight *up, const osp_dbuf *x, int64_t n, osp_dbuf *y, osp_dbuf *u) {
    const osp_weight *ws[] = {gate, up};
    osp_dbuf *ys[] = {y, u};
    be->matmul(s, ws, 2, x, n, ys);
    be->act_mul(s, act, y, y, u, n, gate->rows, gate->rows);
}
