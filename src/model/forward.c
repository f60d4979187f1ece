/* model/forward: osp_forward_rows, for every architecture: the checks of a
 * call (rows, positions, token ids), KV reservation, and the split into
 * chunks of at most the session's max_tok tokens, each run by the
 * architecture's forward_chunk (arch.h).
 *
 * Input ids [B, T]; row b continues at its own position kv->pos[b]. All
 * math is the backend's; reference precision is f32 throughout. */
#include <string.h>
#include "core/threadpool.h"
#include "model.h"

/* out_ids: the last chunk's head also takes each row's greedy token (see
 * osp_forward_rows_ids); NULL for plain logits. */
static osp_status forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                               int all_logits, float *logits, int32_t *out_ids, const uint8_t *need) {
    const osp_config *c = &s->m->cfg;
    osp_kv *kv = s->kv;
    if (n_tok <= 0) return osp_err(OSP_ERR_INVALID, "forward needs at least one token per row");
    if (nb <= 0 || nb > kv->n_rows) return osp_err(OSP_ERR_INVALID, "forward of %d rows in a session of %d", nb, kv->n_rows);
    for (int32_t b = 0; b < nb; b++) {
        int32_t r = rows[b];
        if (r < 0 || r >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "row %d is not in the session", r);
        for (int32_t j = 0; j < b; j++)
            if (rows[j] == r) return osp_err(OSP_ERR_INVALID, "row %d listed twice", r);
        if ((int64_t)kv->pos[r] + n_tok > kv->max_ctx)
            return osp_err(OSP_ERR_RANGE, "row %d: %d + %d tokens exceed the context of %d", r, kv->pos[r], n_tok,
                           kv->max_ctx);
        for (int32_t t = 0; t < n_tok; t++) {
            int32_t id = ids[(int64_t)b * n_tok + t];
            if (id < 0 || id >= c->vocab)
                return osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", id, c->vocab - 1);
        }
    }
    for (int32_t b = 0; b < nb; b++) OSP_TRY(osp_kv_reserve(kv, rows[b], kv->pos[rows[b]] + n_tok));
    s->rows = rows;
    s->nb = nb;
    int32_t step = s->sc.max_tok / nb;
    for (int32_t t0 = 0; t0 < n_tok; t0 += step) {
        int32_t T = n_tok - t0 < step ? n_tok - t0 : step;
        for (int32_t b = 0; b < nb; b++)
            memcpy(s->sc.ids + (int64_t)b * T, ids + (int64_t)b * n_tok + t0, sizeof(int32_t) * T);
        int last = t0 + T >= n_tok;
        float *dst = all_logits ? logits + (int64_t)t0 * c->vocab : logits;
        if (!all_logits && !last) dst = NULL; /* only the last chunk's logits are wanted */
        for (int32_t b = 0; b < nb; b++) s->sc.bpos[b] = kv->pos[rows[b]];
        s->head_ids = last ? out_ids : NULL;
        s->head_need = need;
        s->be->begin_chunk(s->bs, nb, T);
        osp_status rc = c->arch->forward_chunk(s, s->sc.ids, T, all_logits, dst, n_tok);
        s->head_ids = NULL, s->head_need = NULL;
        OSP_TRY(rc);
        OSP_TRY(s->be->status(s->bs));
    }
    return OSP_OK;
}

osp_status osp_forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                            int all_logits, float *logits) {
    return forward_rows(s, rows, nb, ids, n_tok, all_logits, logits, NULL, NULL);
}

osp_status osp_forward_rows_ids(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                                const uint8_t *need_logits, float *logits, int32_t *next) {
    if (!logits || !next) return osp_err(OSP_ERR_INVALID, "forward with ids out needs a logits area and the ids' room");
    return forward_rows(s, rows, nb, ids, n_tok, 0, logits, next, need_logits);
}

osp_status osp_forward(osp_session *s, const int32_t *ids, int32_t n_tok, int all_logits, float *logits) {
    return osp_forward_rows(s, s->all_rows, s->kv->n_rows, ids, n_tok, all_logits, logits);
}

osp_status osp_set_threads(int n) {
    osp_threads_init(n);
    return OSP_OK;
}
