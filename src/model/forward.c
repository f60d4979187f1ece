/* model/forward: osp_forward_rows, for every architecture: the checks of a
 * call (rows, positions, token ids), KV reservation, and the split into
 * chunks of at most the session's max_tok tokens, each run by the
 * architecture's forward_chunk (arch.h).
 *
 * Input ids [B, T]; row b continues at its own position kv->pos[b]. All
 * math is the backend's; reference precision is f32 throughout. An encoder
 * (arch.h's encoder) runs each row whole instead, without the KV cache. */
#include <stdlib.h>
#include <string.h>
#include "core/options.h"
#include "core/threadpool.h"
#include "model.h"

/* out_ids: the last chunk's head also takes each row's greedy token (see
 * osp_forward_rows_ids); NULL for plain logits. defer: its head may defer
 * them (a chain's step); ids NULL: a chain's step fed with the ids of the
 * step before it, where they are (arch prev_ids, backend embed_prev). */
/* hidden (osp_forward_rows_hidden): no head; after each chunk the rows' wanted positions (hpos[b], or every one
 * when hpos is NULL) of the final normed hidden states go to hout, [nb, H] or [nb, n_tok, H]. */
typedef struct hidden_out {
    const int32_t *pos;
    float *out;
} hidden_out;

static osp_status read_hidden(osp_session *s, const hidden_out *h, int32_t nb, int32_t t0, int32_t T, int32_t n_tok) {
    const int64_t H = s->m->cfg.hidden;
    OSP_TRY(s->be->status(s->bs));
    for (int32_t b = 0; b < nb; b++) {
        if (!h->pos) { /* the chunk's positions of row b: contiguous in xn and in out */
            s->be->read(h->out + ((int64_t)b * n_tok + t0) * H, osp_dbuf_at(s->sc.xn, (int64_t)b * T * H), T * H);
        } else if (h->pos[b] >= t0 && h->pos[b] < t0 + T) {
            s->be->read(h->out + (int64_t)b * H, osp_dbuf_at(s->sc.xn, ((int64_t)b * T + h->pos[b] - t0) * H), H);
        }
    }
    return OSP_OK;
}

/* An encoder's call (arch.h's encoder): each row's n_tok tokens are one chunk, as many rows a chunk as fit the
 * session's max_tok; no KV cache is reserved, read or written, and no position advances. */
static osp_status encoder_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                               const int32_t *lens, const hidden_out *hid) {
    const int64_t H = s->m->cfg.hidden;
    if (!hid) return osp_err(OSP_ERR_UNSUPPORTED, "%s: an encoder gives hidden states only", s->m->dir);
    if (n_tok > s->sc.max_tok)
        return osp_err(OSP_ERR_RANGE, "an encoder runs an input whole: %d tokens are more than this session's %d",
                       n_tok, s->sc.max_tok);
    int32_t per = s->sc.max_tok / n_tok;
    for (int32_t b0 = 0; b0 < nb; b0 += per) {
        int32_t g = nb - b0 < per ? nb - b0 : per;
        memcpy(s->sc.ids, ids + (int64_t)b0 * n_tok, sizeof(int32_t) * (size_t)g * (size_t)n_tok);
        for (int32_t b = 0; b < g; b++) s->sc.bpos[b] = 0;
        s->rows = rows + b0;
        s->nb = g;
        s->lens = lens ? lens + b0 : NULL;
        s->hidden = 1;
        s->be->begin_chunk(s->bs, g, n_tok);
        osp_status rc = s->m->cfg.arch->forward_chunk(s, s->sc.ids, n_tok, 0, NULL, n_tok);
        s->hidden = 0, s->lens = NULL;
        OSP_TRY(rc);
        OSP_TRY(s->be->status(s->bs));
        hidden_out h = {hid->pos ? hid->pos + b0 : NULL, hid->out + (int64_t)b0 * (hid->pos ? 1 : n_tok) * H};
        OSP_TRY(read_hidden(s, &h, g, 0, n_tok, n_tok));
    }
    return OSP_OK;
}

static osp_status forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                               int all_logits, float *logits, int32_t *out_ids, const uint8_t *need, int defer,
                               const hidden_out *hid, const int32_t *lens) {
    const osp_config *c = &s->m->cfg;
    osp_kv *kv = s->kv;
    if (!hid && c->no_head)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s has no lm_head: it is an embedding model (osprey embed, "
                       "osprey serve --embedding-model)", s->m->dir);
    if (hid && !c->arch->hidden)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: this architecture does not give hidden states", s->m->dir);
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
        for (int32_t t = 0; ids && t < n_tok; t++) {
            int32_t id = ids[(int64_t)b * n_tok + t];
            if (id < 0 || id >= c->vocab)
                return osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", id, c->vocab - 1);
        }
    }
    for (int32_t b = 0; lens && b < nb; b++)
        if (lens[b] < 1 || lens[b] > n_tok)
            return osp_err(OSP_ERR_RANGE, "row %d: length %d is not within the call's %d tokens", b, lens[b], n_tok);
    if (c->arch->encoder || c->bidirectional) return encoder_rows(s, rows, nb, ids, n_tok, lens, hid);
    for (int32_t b = 0; b < nb; b++) OSP_TRY(osp_kv_reserve(kv, rows[b], kv->pos[rows[b]] + n_tok));
    s->rows = rows;
    s->nb = nb;
    int32_t step = s->sc.max_tok / nb;
    for (int32_t t0 = 0; t0 < n_tok; t0 += step) {
        int32_t T = n_tok - t0 < step ? n_tok - t0 : step;
        for (int32_t b = 0; ids && b < nb; b++)
            memcpy(s->sc.ids + (int64_t)b * T, ids + (int64_t)b * n_tok + t0, sizeof(int32_t) * T);
        int last = t0 + T >= n_tok;
        float *dst = all_logits ? logits + (int64_t)t0 * c->vocab : logits;
        if ((!all_logits && !last) || hid) dst = NULL; /* only the last chunk's logits are wanted */
        for (int32_t b = 0; b < nb; b++) s->sc.bpos[b] = kv->pos[rows[b]];
        s->head_ids = last ? out_ids : NULL;
        s->head_need = need;
        s->head_defer = defer;
        s->hidden = hid != NULL;
        s->be->begin_chunk(s->bs, nb, T);
        osp_status rc = c->arch->forward_chunk(s, ids ? s->sc.ids : NULL, T, all_logits, dst, n_tok);
        s->head_ids = NULL, s->head_need = NULL, s->head_defer = 0, s->hidden = 0;
        OSP_TRY(rc);
        OSP_TRY(s->be->status(s->bs));
        if (hid) OSP_TRY(read_hidden(s, hid, nb, t0, T, n_tok));
    }
    return OSP_OK;
}

#define NO_CHAIN(s)                                                                                              \
    if ((s)->chain) return osp_err(OSP_ERR_INVALID, "a chain of greedy steps is in flight: end it first")

osp_status osp_forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                            int all_logits, float *logits) {
    NO_CHAIN(s);
    if (!ids) return osp_err(OSP_ERR_INVALID, "forward without token ids");
    return forward_rows(s, rows, nb, ids, n_tok, all_logits, logits, NULL, NULL, 0, NULL, NULL);
}

osp_status osp_forward_rows_ids(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                                const uint8_t *need_logits, float *logits, int32_t *next) {
    NO_CHAIN(s);
    if (!logits || !next || !ids)
        return osp_err(OSP_ERR_INVALID, "forward with ids out needs token ids, a logits area and the ids' room");
    return forward_rows(s, rows, nb, ids, n_tok, 0, logits, next, need_logits, 0, NULL, NULL);
}

osp_status osp_forward_rows_hidden(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                                   const int32_t *pos, float *out) {
    return osp_forward_rows_hidden_lens(s, rows, nb, ids, n_tok, NULL, pos, out);
}

osp_status osp_forward_rows_hidden_lens(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids,
                                        int32_t n_tok, const int32_t *lens, const int32_t *pos, float *out) {
    NO_CHAIN(s);
    if (!ids || !out) return osp_err(OSP_ERR_INVALID, "forward for hidden states needs token ids and room for them");
    for (int32_t b = 0; pos && b < nb; b++)
        if (pos[b] < 0 || pos[b] >= n_tok)
            return osp_err(OSP_ERR_RANGE, "row %d: position %d is not among the call's %d tokens", b, pos[b], n_tok);
    hidden_out h = {pos, out};
    return forward_rows(s, rows, nb, ids, n_tok, 0, NULL, NULL, NULL, 0, &h, lens);
}

/* ---- chains of greedy steps (osp_forward_rows_chain) ----
 *
 * A chain keeps the step fed with the last ids it gave back in flight: its
 * head defers its ids (a GPU's come back later, osp_backend.ids_wait). Going
 * on, the next step is queued before the in-flight one's ids are waited for,
 * fed with them where they are (ahead), when the architecture and the
 * backend can do that and the chain is on (OSP_CHAIN=0: not); otherwise the
 * ids are waited for first and the next step is fed with them from the host.
 * A step is queued only when every row has room for it and could go back
 * one position afterwards (a sliding ring's spare slot: the caller may stop,
 * and osp_forward_chain_end undoes that step); else the chain waits (lazy)
 * and the next call runs it. The tokens are the same every way. */

enum { CHAIN_NONE, CHAIN_FLIGHT, CHAIN_LAZY };

static int32_t *chain_buf(osp_session *s, int which) {
    return s->chain_ids + (size_t)(s->chain_buf ^ which) * (size_t)s->kv->n_rows;
}

/* a step of the chain may be queued now (room, and a way back) */
static int chain_can_queue(const osp_session *s) {
    for (int32_t b = 0; b < s->chain_nb; b++) {
        int32_t p = s->kv->pos[s->chain_rows[b]];
        if (p + 1 > s->kv->max_ctx || !osp_kv_resumable(s->kv, p + 1, p)) return 0;
    }
    return 1;
}

/* the next step may be fed with the in-flight step's ids where they are */
static int chain_ahead(const osp_session *s) {
    const osp_backend *be = s->be;
    return s->chain_ahead && s->m->cfg.arch->prev_ids && be->ids_wait && be->embed_prev && be->can_embed_prev &&
           be->can_embed_prev(osp_model_embed_rows(s->m));
}

static osp_status chain_wait(osp_session *s) { return s->be->ids_wait ? s->be->ids_wait(s->bs) : OSP_OK; }

/* queue a step of the chain's rows fed with ids (host), or with the in-flight step's (NULL); its ids go to the
 * other buffer, which becomes the in-flight step's */
static osp_status chain_step(osp_session *s, const int32_t *ids, float *logits) {
    osp_status rc = forward_rows(s, s->chain_rows, s->chain_nb, ids, 1, 0, logits, chain_buf(s, 1), NULL, 1, NULL, NULL);
    s->chain_buf ^= 1;
    s->chain = CHAIN_FLIGHT;
    return rc;
}

/* a failure: what is queued is waited for (two steps at most; a wait with none is a no-op), and the chain ends */
static osp_status chain_fail(osp_session *s, osp_status rc) {
    for (int i = 0; i < 2 && s->chain == CHAIN_FLIGHT && s->be->ids_wait; i++) s->be->ids_wait(s->bs);
    s->chain = CHAIN_NONE;
    return rc;
}

osp_status osp_forward_rows_chain(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, float *logits,
                                  int32_t *prev) {
    const osp_kv *kv = s->kv;
    if (!logits) return osp_err(OSP_ERR_INVALID, "a chain of steps needs a logits area");
    if (!s->chain_ids) {
        s->chain_ids = malloc(sizeof(int32_t) * 2 * (size_t)kv->n_rows);
        s->chain_rows = malloc(sizeof(int32_t) * (size_t)kv->n_rows);
        if (!s->chain_ids || !s->chain_rows) return osp_err(OSP_ERR_NOMEM, "out of memory");
        s->chain_ahead = osp_options_get()->chain;
    }
    if (ids) { /* a chain begins */
        NO_CHAIN(s);
        if (nb <= 0 || nb > kv->n_rows) return osp_err(OSP_ERR_INVALID, "a chain of %d rows in a session of %d", nb, kv->n_rows);
        for (int32_t b = 0; b < nb; b++) {
            if (rows[b] < 0 || rows[b] >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "row %d is not in the session", rows[b]);
            if (ids[b] < 0 || ids[b] >= s->m->cfg.vocab)
                return osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", ids[b], s->m->cfg.vocab - 1);
        }
        memcpy(s->chain_rows, rows, sizeof(int32_t) * (size_t)nb);
        memcpy(chain_buf(s, 0), ids, sizeof(int32_t) * (size_t)nb);
        s->chain_nb = nb;
        s->chain = CHAIN_LAZY;
        if (!chain_can_queue(s)) return OSP_OK;
        osp_status rc = chain_step(s, chain_buf(s, 0), logits);
        return rc == OSP_OK ? rc : chain_fail(s, rc);
    }
    if (!s->chain) return osp_err(OSP_ERR_INVALID, "no chain of greedy steps is in flight");
    if (!prev) return osp_err(OSP_ERR_INVALID, "a chain's step gives back ids: no room for them");
    if (nb != s->chain_nb || memcmp(rows, s->chain_rows, sizeof(int32_t) * (size_t)nb))
        return osp_err(OSP_ERR_INVALID, "a chain's steps take the same rows");
    osp_status rc = OSP_OK;
    if (s->chain == CHAIN_LAZY) rc = chain_step(s, chain_buf(s, 0), logits); /* (the range checks are its own) */
    if (rc != OSP_OK) return chain_fail(s, rc);
    const int32_t *done = chain_buf(s, 0); /* the in-flight step's ids, once waited for */
    if (!chain_can_queue(s)) {
        rc = chain_wait(s);
        s->chain = CHAIN_LAZY; /* (its ids are the next step's input: chain_buf 0) */
    } else if (chain_ahead(s)) {
        rc = chain_step(s, NULL, logits);
        osp_status w = chain_wait(s); /* the step before it */
        if (rc == OSP_OK) rc = w;
    } else {
        rc = chain_wait(s);
        if (rc == OSP_OK) rc = chain_step(s, done, logits);
    }
    if (rc != OSP_OK) return chain_fail(s, rc);
    memcpy(prev, done, sizeof(int32_t) * (size_t)nb);
    return OSP_OK;
}

osp_status osp_forward_chain_end(osp_session *s, int keep, float *logits, int32_t *last) {
    osp_status rc = OSP_OK;
    if (s->chain == CHAIN_LAZY && keep) { /* the step fed with the last ids given back runs now */
        if (!logits) return osp_err(OSP_ERR_INVALID, "a chain of steps needs a logits area");
        rc = chain_step(s, chain_buf(s, 0), logits);
        if (rc != OSP_OK) return chain_fail(s, rc);
    }
    if (s->chain == CHAIN_FLIGHT) {
        rc = chain_wait(s);
        if (rc == OSP_OK && keep && last) memcpy(last, chain_buf(s, 0), sizeof(int32_t) * (size_t)s->chain_nb);
        for (int32_t b = 0; !keep && b < s->chain_nb; b++) { /* (chain_can_queue made sure they can) */
            osp_status t = osp_kv_trim(s->kv, s->chain_rows[b], 1);
            if (rc == OSP_OK) rc = t;
        }
    }
    s->chain = CHAIN_NONE;
    return rc;
}

int osp_session_chain_queues(const osp_session *s) { return s->be->ids_wait != NULL; }

int osp_forward_chain_queued(const osp_session *s) { return s->chain == CHAIN_FLIGHT; }

osp_status osp_forward(osp_session *s, const int32_t *ids, int32_t n_tok, int all_logits, float *logits) {
    return osp_forward_rows(s, s->all_rows, s->kv->n_rows, ids, n_tok, all_logits, logits);
}

osp_status osp_set_threads(int n) {
    osp_threads_init(n);
    return OSP_OK;
}
