/* engine/spec: speculative decoding (see spec.h). */
#include "engine/spec.h"
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"

#define CATCH_UP 4 /* a draft row this many tokens behind catches up with the others (a chunk per lag) */

struct osp_spec {
    osp_spec_params p;
    const osp_model *draft;
    osp_session *ds;       /* the draft's session: the target's rows */
    int32_t V, n_rows, ctx, max_tok;
    int32_t *K;            /* [rows] tokens to draft next round */
    int32_t *dpos;         /* [rows] tokens of the row's history the draft's KV holds */
    osp_sampler **dsamp;   /* [rows] the draft's sampler (the row's parameters), made at first use */
    int32_t *drafts;       /* [rows, draft_max] */
    int32_t *nd;           /* [rows] drafted this round */
    int32_t *kc;           /* [rows] the most this round may draft (batch index) */
    float *q;              /* [rows, draft_max, V] the draft's distributions (sampling rows) */
    float *logits;         /* [rows, draft_max + 1, V] the target's */
    float *dlogits;        /* [rows, V] the draft's */
    int32_t *ids;          /* [rows, draft_max + 1] */
    int32_t *keep;         /* [session rows] */
    int32_t *hbuf;         /* history + drafts, for the draft's processors [ctx + draft_max + 1] */
    int32_t *drows, *dfeed;/* [rows] */
};

osp_spec_params osp_spec_defaults(void) {
    osp_spec_params p = {.draft_max = 4, .draft_min = 1, .ngram = 0, .ngram_max = 4, .max_tokens = 8};
    return p;
}

void osp_spec_free(osp_spec *sp) {
    if (!sp) return;
    if (sp->dsamp)
        for (int32_t i = 0; i < sp->n_rows; i++) osp_sampler_free(sp->dsamp[i]);
    osp_session_free(sp->ds);
    free(sp->K), free(sp->kc), free(sp->dpos), free(sp->dsamp), free(sp->drafts), free(sp->nd), free(sp->q);
    free(sp->logits), free(sp->dlogits), free(sp->ids), free(sp->keep), free(sp->hbuf), free(sp->drows), free(sp->dfeed);
    free(sp);
}

osp_status osp_spec_check_tokenizers(const osp_tokenizer *a, const osp_tokenizer *b) {
    const osp_tokenizer_info *ia = osp_tokenizer_get_info(a), *ib = osp_tokenizer_get_info(b);
    if (ia->vocab_size != ib->vocab_size)
        return osp_err(OSP_ERR_INVALID, "the draft model's tokenizer has %d tokens, the model's %d: a draft must share "
                       "the model's tokenizer", ib->vocab_size, ia->vocab_size);
    for (int32_t id = 0; id < ia->vocab_size; id++) {
        size_t la = 0, lb = 0;
        const char *ta = osp_tokenizer_token_text(a, id, &la), *tb = osp_tokenizer_token_text(b, id, &lb);
        if (!ta != !tb || la != lb || (ta && memcmp(ta, tb, la)) ||
            osp_tokenizer_is_special(a, id) != osp_tokenizer_is_special(b, id))
            return osp_err(OSP_ERR_INVALID, "the draft model's tokenizer differs from the model's (token %d): a draft "
                           "must share the model's tokenizer", id);
    }
    return OSP_OK;
}

osp_status osp_spec_load_draft(const char *path, int device, const osp_tokenizer *tok, osp_model **out) {
    *out = NULL;
    osp_model_params mp = {.device = (osp_device)device, .place = 1};
    OSP_TRY(osp_model_load_params(path, &mp, out));
    osp_tokenizer *dt = NULL;
    osp_status rc = osp_tokenizer_load(osp_model_get_info(*out)->dir, &dt);
    if (rc != OSP_OK) rc = osp_err(OSP_ERR_INVALID, "the draft model %s has no tokenizer: a draft must share the model's", path);
    else if (tok) rc = osp_spec_check_tokenizers(tok, dt);
    osp_tokenizer_free(dt);
    if (rc != OSP_OK) {
        osp_model_free(*out);
        *out = NULL;
    }
    return rc;
}

osp_status osp_spec_new(const osp_spec_params *p, const osp_model *draft, osp_session *target, osp_spec **out) {
    *out = NULL;
    if (p->draft_max < 1 || p->draft_max > 64 || p->draft_min < 1 || p->draft_min > p->draft_max)
        return osp_err(OSP_ERR_INVALID, "draft tokens: need 1 <= min <= max <= 64 (got %d..%d)", p->draft_min,
                       p->draft_max);
    if (!draft && !p->ngram) return osp_err(OSP_ERR_INVALID, "speculation needs a draft model or n-gram drafting");
    if (osp_session_set_exact_tokens(target, 0) != 0)
        return osp_err(OSP_ERR_UNSUPPORTED, "speculative decoding is not available on this device (its chunks of "
                       "drafted tokens cannot be computed exactly as decode steps)");
    int32_t V = osp_model_get_info(osp_session_model(target))->vocab;
    if (draft && osp_model_get_info(draft)->vocab != V)
        return osp_err(OSP_ERR_INVALID, "the draft model's vocabulary has %d entries, the model's %d",
                       osp_model_get_info(draft)->vocab, V);
    osp_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return osp_err(OSP_ERR_NOMEM, "out of memory");
    sp->p = *p;
    if (sp->p.ngram_max < 1) sp->p.ngram_max = 4;
    sp->draft = draft;
    sp->V = V;
    sp->n_rows = osp_session_rows(target);
    sp->ctx = osp_session_max_ctx(target);
    int32_t R = sp->n_rows, Km = p->draft_max;
    sp->K = malloc(sizeof(int32_t) * R), sp->dpos = calloc((size_t)R, sizeof(int32_t));
    sp->kc = malloc(sizeof(int32_t) * R);
    sp->dsamp = calloc((size_t)R, sizeof *sp->dsamp);
    sp->drafts = malloc(sizeof(int32_t) * R * Km), sp->nd = calloc((size_t)R, sizeof(int32_t));
    sp->logits = malloc(sizeof(float) * (size_t)R * (Km + 1) * V);
    sp->ids = malloc(sizeof(int32_t) * R * (Km + 1)), sp->keep = calloc((size_t)R, sizeof(int32_t));
    size_t nhb = (size_t)sp->ctx + Km + 2; /* a history + drafts, or a catch-up chunk's ids */
    if (nhb < (size_t)R * CATCH_UP) nhb = (size_t)R * CATCH_UP;
    sp->hbuf = malloc(sizeof(int32_t) * nhb);
    sp->drows = malloc(sizeof(int32_t) * R), sp->dfeed = malloc(sizeof(int32_t) * R);
    int ok = sp->K && sp->kc && sp->dpos && sp->dsamp && sp->drafts && sp->nd && sp->logits && sp->ids && sp->keep && sp->hbuf &&
             sp->drows && sp->dfeed;
    if (ok && draft) {
        sp->q = malloc(sizeof(float) * (size_t)R * Km * V);
        sp->dlogits = malloc(sizeof(float) * (size_t)R * V);
        ok = sp->q && sp->dlogits;
    }
    if (!ok) {
        osp_spec_free(sp);
        return osp_err(OSP_ERR_NOMEM, "out of memory for speculative decoding");
    }
    for (int32_t i = 0; i < R; i++) sp->K[i] = Km;
    if (draft) {
        sp->max_tok = 512;
        osp_session_opts o = {.n_rows = R, .max_ctx = sp->ctx, .spare = Km + 1, .max_tokens = sp->max_tok};
        osp_status rc = osp_session_new_opts(draft, &o, &sp->ds);
        if (rc != OSP_OK) {
            osp_spec_free(sp);
            return rc;
        }
        osp_session_set_fast(sp->ds, 1);
    }
    *out = sp;
    return OSP_OK;
}

void osp_spec_reset_row(osp_spec *sp, int32_t row) {
    if (row < 0 || row >= sp->n_rows) return;
    sp->K[row] = sp->p.draft_max;
    sp->dpos[row] = 0;
    osp_sampler_free(sp->dsamp[row]);
    sp->dsamp[row] = NULL;
    if (sp->ds) osp_session_reset_row(sp->ds, row);
}

int32_t osp_ngram_draft(const int32_t *hist, int64_t nh, int32_t ngram_max, int32_t k, int32_t *out) {
    for (int32_t n = ngram_max; n >= 1; n--) {
        if (nh < (int64_t)n + 1) continue;
        const int32_t *tail = hist + nh - n;
        for (int64_t s = nh - n - 1; s >= 0; s--) { /* the latest earlier occurrence */
            if (hist[s] != tail[0] || memcmp(hist + s, tail, sizeof(int32_t) * (size_t)n)) continue;
            int32_t m = 0;
            for (int64_t j = s + n; j < nh && m < k; j++) out[m++] = hist[j];
            if (m > 0) return m;
        }
    }
    return 0;
}

/* The draft's next token for row i from its logits; q_i its distribution
 * (sampling rows). hist: the row's history + the drafts so far. */
static int32_t draft_pick(osp_spec *sp, int32_t row, osp_stream *st, float *dl, const int32_t *hist, int64_t nh,
                          float *q_i) {
    osp_sampler *ds = sp->dsamp[row];
    if (osp_stream_greedy(st)) return osp_sampler_sample(ds, dl, hist, nh, NULL);
    if (osp_sampler_dist(ds, dl, hist, nh, q_i, NULL) != 0) return -1;
    return osp_sampler_draw(ds, q_i);
}

/* The draft's first token for row i (batch index) from its logits dl. */
static void draft_first(osp_spec *sp, int32_t i, int32_t row, osp_stream *st, float *dl, int *n_act) {
    int32_t Km = sp->p.draft_max, V = sp->V, nh;
    const int32_t *h = osp_stream_tokens(st, &nh);
    memcpy(sp->hbuf, h, sizeof(int32_t) * (size_t)nh);
    int32_t d = draft_pick(sp, row, st, dl, sp->hbuf, nh, sp->q + ((int64_t)i * Km) * V);
    if (d < 0) {
        sp->nd[i] = 0;
        return;
    }
    sp->drafts[i * Km] = d;
    sp->nd[i] = 1;
    (*n_act)++;
}

/* Drafts from the draft model for the rows i with sp->nd[i] = -1 (to draft). */
static osp_status draft_model(osp_spec *sp, const int32_t *rows, int32_t nb, osp_stream *const *st) {
    int32_t V = sp->V, Km = sp->p.draft_max;
    int32_t n_act = 0;
    int32_t behind[nb > 0 ? nb : 1];
    for (int32_t i = 0; i < nb; i++) {
        behind[i] = 0;
        if (sp->nd[i] != -1) continue;
        int32_t row = rows[i], nh;
        const int32_t *h = osp_stream_tokens(st[i], &nh);
        if (!sp->dsamp[row]) {
            osp_sampler_params dp = osp_stream_params(st[i])->sampler;
            dp.seed ^= 0x5bd1e995u;
            OSP_TRY(osp_sampler_new(&dp, V, &sp->dsamp[row]));
        }
        if (sp->dpos[row] > nh - 1 || osp_session_row_pos(sp->ds, row) != sp->dpos[row]) { /* out of step: again */
            osp_session_reset_row(sp->ds, row);
            sp->dpos[row] = 0;
        }
        behind[i] = nh - sp->dpos[row];
        if (behind[i] <= CATCH_UP) continue;
        /* far behind (a new row): its own chunks */
        for (int32_t at = sp->dpos[row]; at < nh;) {
            int32_t n = nh - at < sp->max_tok ? nh - at : sp->max_tok;
            OSP_TRY(osp_forward_rows(sp->ds, &row, 1, h + at, n, 0, sp->dlogits));
            at += n;
        }
        sp->dpos[row] = nh;
        draft_first(sp, i, row, st[i], sp->dlogits, &n_act);
    }
    /* rows a token or a few behind (after a round): one chunk for the rows of each lag. Such a chunk runs
     * in exact mode, so each row's numbers are those it would have alone (no row's drafts depend on the
     * others': sampled outputs stay batch invariant), and it is the same small chunk every round (a GPU
     * replays it as a graph). */
    for (int32_t lag = 1; lag <= CATCH_UP; lag++) {
        int32_t n = 0;
        for (int32_t i = 0; i < nb; i++) {
            if (sp->nd[i] != -1 || behind[i] != lag) continue;
            int32_t nh;
            const int32_t *h = osp_stream_tokens(st[i], &nh);
            sp->drows[n] = rows[i];
            memcpy(sp->hbuf + (int64_t)n * lag, h + nh - lag, sizeof(int32_t) * (size_t)lag);
            n++;
        }
        if (!n) continue;
        int exact = lag > 1 && osp_session_set_exact_tokens(sp->ds, 1) == 0;
        osp_status rc = osp_forward_rows(sp->ds, sp->drows, n, sp->hbuf, lag, 0, sp->dlogits);
        if (exact) osp_session_set_exact_tokens(sp->ds, 0);
        OSP_TRY(rc);
        for (int32_t i = 0, k = 0; i < nb && k < n; i++) {
            if (sp->nd[i] != -1 || behind[i] != lag) continue;
            int32_t nh;
            osp_stream_tokens(st[i], &nh);
            sp->dpos[rows[i]] = nh;
            draft_first(sp, i, rows[i], st[i], sp->dlogits + (int64_t)k * V, &n_act);
            k++;
        }
    }
    /* then one token at a time, the drafting rows together */
    for (int32_t step = 1; step < Km && n_act > 0; step++) {
        int32_t n = 0;
        for (int32_t i = 0; i < nb; i++) {
            int32_t row = rows[i];
            if (sp->nd[i] != step || step >= sp->kc[i]) continue;
            sp->drows[n] = row;
            sp->dfeed[n] = sp->drafts[i * Km + step - 1];
            n++;
        }
        if (!n) break;
        OSP_TRY(osp_forward_rows(sp->ds, sp->drows, n, sp->dfeed, 1, 0, sp->dlogits));
        for (int32_t i = 0, k = 0; i < nb && k < n; i++) {
            int32_t row = rows[i];
            if (sp->nd[i] != step || step >= sp->kc[i]) continue;
            int32_t nh;
            const int32_t *h = osp_stream_tokens(st[i], &nh);
            memcpy(sp->hbuf, h, sizeof(int32_t) * (size_t)nh);
            memcpy(sp->hbuf + nh, sp->drafts + i * Km, sizeof(int32_t) * (size_t)step);
            int32_t d = draft_pick(sp, row, st[i], sp->dlogits + (int64_t)k * V, sp->hbuf, nh + step,
                                   sp->q + ((int64_t)i * Km + step) * V);
            k++;
            if (d < 0) continue;
            sp->drafts[i * Km + step] = d;
            sp->nd[i] = step + 1;
        }
    }
    return OSP_OK;
}

osp_status osp_spec_step(osp_spec *sp, osp_session *target, const int32_t *rows, int32_t nb, osp_stream *const *st,
                         const int *use, int32_t *next, int *more, osp_status *rc) {
    int32_t V = sp->V, Km = sp->p.draft_max, T = 1;
    int32_t budget = sp->p.max_tokens > 0 ? sp->p.max_tokens / (nb > 0 ? nb : 1) - 1 : Km; /* drafts a row */
    int need_model = 0;
    for (int32_t i = 0; i < nb; i++) {
        int32_t row = rows[i], nh, room = sp->ctx - osp_session_row_pos(target, row) - 1;
        const int32_t *h = osp_stream_tokens(st[i], &nh);
        int32_t k = sp->K[row] < room ? sp->K[row] : room;
        if (k > budget) k = budget;
        sp->kc[i] = k;
        sp->nd[i] = 0;
        rc[i] = OSP_OK;
        more[i] = 0;
        if (!use[i] || k <= 0 || !osp_stream_can_speculate(st[i])) continue;
        if (sp->draft) {
            sp->nd[i] = -1;
            need_model = 1;
        } else {
            sp->nd[i] = osp_ngram_draft(h, nh, sp->p.ngram_max, k, sp->drafts + i * Km);
        }
    }
    if (need_model) OSP_TRY(draft_model(sp, rows, nb, st));
    for (int32_t i = 0; i < nb; i++) {
        int32_t room = sp->ctx - osp_session_row_pos(target, rows[i]) - 1;
        if (sp->nd[i] < 0) sp->nd[i] = 0;
        if (sp->nd[i] > room) sp->nd[i] = room > 0 ? room : 0;
        if (1 + sp->nd[i] > T) T = 1 + sp->nd[i];
    }
    int32_t pos0[nb > 0 ? nb : 1], dend[nb > 0 ? nb : 1];
    for (int32_t i = 0; i < nb; i++) {
        pos0[i] = osp_session_row_pos(target, rows[i]);
        dend[i] = sp->ds ? osp_session_row_pos(sp->ds, rows[i]) : 0;
        sp->ids[i * T] = next[i];
        for (int32_t j = 1; j < T; j++) sp->ids[i * T + j] = j <= sp->nd[i] ? sp->drafts[i * Km + j - 1] : next[i];
    }
    osp_session_round_begin(target);
    if (T > 1) osp_session_set_exact_tokens(target, 1);
    osp_status frc = osp_forward_rows(target, rows, nb, sp->ids, T, T > 1, sp->logits);
    if (T > 1) osp_session_set_exact_tokens(target, 0);
    if (frc != OSP_OK) {
        osp_session_commit(target);
        return frc;
    }
    memset(sp->keep, 0, sizeof(int32_t) * (size_t)sp->n_rows);
    for (int32_t i = 0; i < nb; i++) {
        int32_t row = rows[i], nh_before, n_keep = 0, nd = sp->nd[i];
        osp_stream_tokens(st[i], &nh_before);
        float *lg = sp->logits + (int64_t)i * T * V;
        if (nd > 0)
            more[i] = osp_stream_verify(st[i], lg, sp->drafts + i * Km, nd,
                                        sp->draft && !osp_stream_greedy(st[i]) ? sp->q + (int64_t)i * Km * V : NULL,
                                        pos0[i], &n_keep, &next[i], &rc[i]);
        else {
            more[i] = osp_stream_next(st[i], lg, pos0[i] + 1, &next[i], &rc[i]);
            n_keep = 1;
        }
        sp->keep[row] = n_keep > 0 ? n_keep : 1;
        if (nd > 0) { /* adapt K; trim the draft to what was kept */
            int32_t acc = n_keep - 1;
            sp->K[row] = acc >= nd ? (sp->K[row] + 2 < Km ? sp->K[row] + 2 : Km)
                                   : (acc + 1 > sp->p.draft_min ? acc + 1 : sp->p.draft_min);
            if (sp->ds) {
                int32_t valid = nh_before + (acc < nd - 1 ? acc : nd - 1);
                if (dend[i] > valid && osp_session_trim_row(sp->ds, row, dend[i] - valid) == OSP_OK) sp->dpos[row] = valid;
                else if (dend[i] > valid) osp_session_reset_row(sp->ds, row), sp->dpos[row] = 0;
                else sp->dpos[row] = dend[i];
            }
        }
    }
    return osp_session_rollback(target, sp->keep);
}
