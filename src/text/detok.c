/* Incremental detokenizer: see detok.h. State: the open window of ids
 * (decoded as a continuation unless it starts the text) and the last
 * returned chunk. The window closes when its decoded text is non-empty and
 * final: the decoder reports no open byte-fallback run and no incomplete
 * UTF-8 at its end. An empty text keeps the window open so first-token
 * rules still see the text's first real characters. */
#include <string.h>
#include "text/detok.h"
#include "text/tokenizer_internal.h"

struct osp_detok {
    const osp_tokenizer *t;
    int skip_special;
    int first; /* the window starts the text */
    tk_ivec win;
    tk_buf out;
    tk_decode_scratch *scratch; /* reused by every push: no allocation per token */
};

osp_status osp_detok_new(const osp_tokenizer *t, int skip_special, osp_detok **out) {
    *out = NULL;
    if (!t) return osp_err(OSP_ERR_INVALID, "detok: no tokenizer");
    const char *why = tk_decoder_stream_problem(t);
    if (why) return osp_err(OSP_ERR_UNSUPPORTED, "%s: incremental decoding of %s is not supported", t->name, why);
    osp_detok *d = osp_calloc(OSP_POOL_MISC, sizeof *d);
    if (!d) return osp_err(OSP_ERR_NOMEM, "detok: out of memory");
    d->t = t;
    d->skip_special = skip_special;
    d->first = 1;
    osp_status st = tk_ivec_reserve(&d->win, 16);
    if (st == OSP_OK) st = tk_buf_reserve(&d->out, 256);
    if (st == OSP_OK && !(d->scratch = tk_decode_scratch_new())) st = osp_err(OSP_ERR_NOMEM, "detok: out of memory");
    if (st != OSP_OK) {
        osp_detok_free(d);
        return st;
    }
    *out = d;
    return OSP_OK;
}

void osp_detok_free(osp_detok *d) {
    if (!d) return;
    tk_ivec_free(&d->win);
    tk_buf_free(&d->out);
    tk_decode_scratch_free(d->scratch);
    osp_free(d);
}

void osp_detok_reset(osp_detok *d) {
    d->win.n = 0;
    d->first = 1;
    d->out.n = 0;
}

osp_status osp_detok_push(osp_detok *d, int32_t id, const char **text, size_t *len) {
    const osp_tokenizer *t = d->t;
    *text = "";
    *len = 0;
    if (id < 0 || id >= t->n_vocab)
        return osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", id, t->n_vocab - 1);
    size_t tl;
    if (!osp_tokenizer_token_text(t, id, &tl)) return OSP_OK; /* no token: decode skips it too */
    if (d->skip_special && osp_tokenizer_is_special(t, id)) return OSP_OK;
    OSP_TRY(tk_ivec_push(&d->win, id));
    int pending;
    OSP_TRY(tk_decode_ids_s(t, d->win.p, d->win.n, d->first, &d->out, &pending, d->scratch));
    if (pending || d->out.n == 0) return OSP_OK;
    d->win.n = 0;
    d->first = 0;
    *text = d->out.p;
    *len = d->out.n;
    return OSP_OK;
}

osp_status osp_detok_flush(osp_detok *d, const char **text, size_t *len) {
    *text = "";
    *len = 0;
    if (d->win.n) OSP_TRY(tk_decode_ids_s(d->t, d->win.p, d->win.n, d->first, &d->out, NULL, d->scratch));
    else d->out.n = 0;
    d->win.n = 0;
    d->first = 1;
    if (d->out.n) {
        *text = d->out.p;
        *len = d->out.n;
    }
    return OSP_OK;
}
