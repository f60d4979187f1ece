/* model/session: sessions (rows of sequences on a KV cache) and the
 * activation scratch of their forward calls. */
#include <stdlib.h>
#include <string.h>
#include "model.h"

#define OSP_MAX_CHUNK 512

static void scratch_free(const osp_model *m, osp_scratch *s) {
    const osp_backend *be = m->be;
    osp_dbuf *v[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->tmp, s->g, s->u, s->scores, s->hlast};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i]) be->free(v[i]);
    if (s->extra && m->cfg.arch->scratch_free) m->cfg.arch->scratch_free(m, s->extra);
    free(s->ids);
    free(s->bpos);
    memset(s, 0, sizeof *s);
}

static size_t at_least1(size_t n) { return n ? n : 1; }

/* Activation buffers for forward calls of up to max_tok tokens in all
 * (B rows, max_tok / B each), sized by the widest layer (Gemma 4 varies
 * head sizes and MLP widths per layer), in the backend's memory. *cols =
 * the widest matmul input (for the backend's own preparation). */
static osp_status scratch_new(const osp_model *m, int32_t B, int32_t max_tok, int32_t max_ctx, osp_scratch *s,
                              int64_t *cols) {
    const osp_backend *be = m->be;
    const osp_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->max_tok = max_tok;
    size_t N = (size_t)max_tok, H = c->hidden, Q = 0, KV = 0, I = 0;
    for (int i = 0; i < c->n_layers; i++) {
        size_t q = (size_t)c->n_heads * c->layer_head_dim[i], kv = (size_t)c->layer_kv_heads[i] * c->layer_head_dim[i];
        Q = q > Q ? q : Q;
        KV = kv > KV ? kv : KV;
        I = (size_t)m->layers[i].intermediate > I ? (size_t)m->layers[i].intermediate : I;
    }
    int64_t xi = 0, xc = 0;
    if (c->arch->scratch_new) {
        osp_status rc = c->arch->scratch_new(m, max_tok, &s->extra, &xi, &xc);
        if (rc != OSP_OK) return rc;
    }
    if ((size_t)xi > I) I = (size_t)xi;
    size_t HQ = H > Q ? H : Q;
    *cols = (int64_t)HQ;
    if ((int64_t)I > *cols) *cols = (int64_t)I;
    if (xc > *cols) *cols = xc;
    int ok = 1;
#define D(field, count) (ok &= (s->field = be->alloc(at_least1(count))) != NULL)
#define HOST(field, count) (ok &= (s->field = malloc(at_least1(count) * sizeof *s->field)) != NULL)
    D(x, N * H), D(xn, N * H), D(q, N * Q), D(k, N * KV), D(v, N * KV), D(att, N * HQ), D(tmp, N * HQ);
    D(g, N * I), D(u, N * I), D(scores, (size_t)B * c->n_heads * ((size_t)max_ctx + max_tok));
    D(hlast, (size_t)B * H);
    HOST(ids, N), HOST(bpos, (size_t)B);
#undef D
#undef HOST
    if (!ok) {
        scratch_free(m, s);
        return osp_err(OSP_ERR_NOMEM, "out of memory allocating activations");
    }
    return OSP_OK;
}

osp_status osp_session_new_opts(const osp_model *m, const osp_session_opts *o, osp_session **out) {
    *out = NULL;
    const osp_config *c = &m->cfg;
    int32_t n_rows = o->n_rows, max_ctx = o->max_ctx;
    if (n_rows <= 0) return osp_err(OSP_ERR_INVALID, "a session needs at least one row");
    if (max_ctx <= 0 || max_ctx > c->max_pos) max_ctx = c->max_pos;
    if (m->be->needs_place && !m->placed)
        return osp_err(OSP_ERR_INVALID, "%s: a session on %s needs the model loaded with its weights placed", m->dir,
                       m->be->name);
    osp_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->m = m;
    s->be = m->be;
    osp_kv_spec *specs = calloc((size_t)c->n_layers, sizeof *specs);
    s->all_rows = malloc(sizeof(int32_t) * (size_t)n_rows);
    if (!specs || !s->all_rows) {
        free(specs);
        free(s->all_rows);
        free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int32_t b = 0; b < n_rows; b++) s->all_rows[b] = b;
    for (int i = 0; i < c->n_layers; i++) {
        int32_t bits = o->layer_kv_bits ? o->layer_kv_bits[i] : o->kv_bits;
        int32_t group = o->layer_kv_group && o->layer_kv_group[i] ? o->layer_kv_group[i] : o->kv_group;
        specs[i] = (osp_kv_spec){c->layer_kv_heads[i], c->layer_head_dim[i], c->layer_sliding[i] ? c->sliding_window : 0,
                                 c->layer_kv_donor[i], bits, bits && bits != 16 ? (group ? group : 64) : 0};
    }
    osp_status rc = osp_kv_new(n_rows, c->n_layers, specs, max_ctx, o->spare, m->be->kv_mem, &s->kv);
    free(specs);
    if (rc == OSP_OK) s->kv->budget = o->kv_budget;
    int32_t N = o->max_tokens > 0 ? o->max_tokens : (max_ctx < OSP_MAX_CHUNK ? max_ctx : OSP_MAX_CHUNK);
    if (N < n_rows) N = n_rows;
    int64_t cols = 0;
    if (rc == OSP_OK) rc = scratch_new(m, n_rows, N, max_ctx, &s->sc, &cols);
    if (rc == OSP_OK) rc = m->be->session_new(N, cols, &s->bs);
    if (rc != OSP_OK) {
        osp_session_free(s);
        return rc;
    }
    *out = s;
    return OSP_OK;
}

osp_status osp_session_new(const osp_model *m, int32_t n_rows, int32_t max_ctx, osp_session **out) {
    osp_session_opts o = {.n_rows = n_rows, .max_ctx = max_ctx};
    return osp_session_new_opts(m, &o, out);
}

void osp_session_free(osp_session *s) {
    if (!s) return;
    osp_forward_chain_end(s, 0, NULL, NULL); /* (a step in flight is waited for) */
    free(s->chain_ids);
    free(s->chain_rows);
    osp_kv_free(s->kv);
    scratch_free(s->m, &s->sc);
    if (s->bs) s->be->session_free(s->bs);
    free(s->all_rows);
    free(s);
}

void osp_session_reset_row(osp_session *s, int32_t row) { osp_kv_reset_row(s->kv, row); }

struct osp_kv *osp_session_kv(osp_session *s) { return s->kv; }

/* The matmuls' invariance (the backend's, per placed model) and an f32 KV
 * cache: a chunk attends its own positions in f32 before storing them,
 * while later queries read them back as stored, so with bf16 or quantized
 * KV a row depends on how its tokens were chunked. */
int osp_session_chunk_invariant(const osp_session *s) {
    if (!s->m->chunk_invariant[s->fast][s->chunk_exact]) return 0;
    for (int32_t l = 0; l < s->kv->n_layers; l++)
        if (s->kv->layers[l].bits) return 0;
    return 1;
}
int32_t osp_session_pass_tokens(const osp_session *s) { return s->m->pass_tokens[s->fast] > 0 ? s->m->pass_tokens[s->fast] : 8; }

size_t osp_session_kv_bytes(const osp_session *s) { return osp_kv_bytes(s->kv); }

int64_t osp_session_kv_row_bytes(const osp_session *s, int32_t n_pos) { return osp_kv_row_bytes(s->kv, n_pos); }

int32_t osp_session_rows(const osp_session *s) { return s->kv->n_rows; }

int32_t osp_session_max_ctx(const osp_session *s) { return s->kv->max_ctx; }

int32_t osp_session_row_pos(const osp_session *s, int32_t row) {
    return row >= 0 && row < s->kv->n_rows ? s->kv->pos[row] : -1;
}

osp_status osp_session_trim_row(osp_session *s, int32_t row, int32_t n) { return osp_kv_trim(s->kv, row, n); }

void osp_session_round_begin(osp_session *s) { osp_kv_round_begin(s->kv); }

osp_status osp_session_rollback(osp_session *s, const int32_t *keep) { return osp_kv_rollback(s->kv, keep); }

void osp_session_commit(osp_session *s) { osp_kv_commit(s->kv); }

/* A session around an existing KV cache, with the options of `like`. */
static osp_status wrap_kv(const osp_session *like, osp_kv *kv, osp_session **out) {
    *out = NULL;
    osp_session_opts o = {.n_rows = kv->n_rows, .max_ctx = kv->max_ctx, .max_tokens = like->sc.max_tok};
    osp_session *s;
    osp_status rc = osp_session_new_opts(like->m, &o, &s); /* scratch and row list for kv's rows */
    if (rc != OSP_OK) {
        osp_kv_free(kv);
        return rc;
    }
    osp_kv_free(s->kv);
    s->kv = kv;
    s->be->set_fast(s->bs, like->fast);
    s->fast = like->fast;
    *out = s;
    return OSP_OK;
}

osp_status osp_session_extract_row(const osp_session *s, int32_t row, osp_session **out) {
    *out = NULL;
    osp_kv *kv;
    OSP_TRY(osp_kv_extract(s->kv, row, &kv));
    return wrap_kv(s, kv, out);
}

osp_status osp_session_merge(const osp_session *const *parts, int32_t n, osp_session **out) {
    *out = NULL;
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "merge needs at least one session");
    const osp_kv *kvs[n];
    for (int32_t i = 0; i < n; i++) {
        if (parts[i]->m != parts[0]->m) return osp_err(OSP_ERR_INVALID, "merge: sessions of different models");
        kvs[i] = parts[i]->kv;
    }
    osp_kv *kv;
    OSP_TRY(osp_kv_merge(kvs, n, &kv));
    return wrap_kv(parts[0], kv, out);
}

osp_status osp_session_filter(osp_session *s, const int32_t *keep, int32_t n) {
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "filter must keep at least one row");
    return osp_kv_filter(s->kv, keep, n);
}


const osp_model *osp_session_model(const osp_session *s) { return s->m; }

int osp_session_set_exact_tokens(osp_session *s, int on) {
    if (!s->be->set_exact_tokens) return on ? -1 : 0;
    s->be->set_exact_tokens(s->bs, on);
    s->exact = on != 0;
    return 0;
}

void osp_session_set_chunk_exact(osp_session *s, int on) {
    if (s->be->set_chunk_exact) s->be->set_chunk_exact(s->bs, on);
    s->chunk_exact = on != 0;
}

void osp_session_set_fast(osp_session *s, int fast) {
    s->fast = fast != 0;
    s->be->set_fast(s->bs, s->fast);
}
