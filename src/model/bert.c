/* model/bert: BERT and XLM-RoBERTa encoders as an architecture table (arch.h's encoder).
 *
 * The body, as transformers' modeling_bert.py / modeling_xlm_roberta.py compute it:
 *   x = word[id] + type[0] + position[p]   (BERT: p = t; XLM-R: p = padding_idx + the count of non-padding tokens
 *                                          up to t, padding_idx itself for a padding token: transformers'
 *                                          create_position_ids_from_input_ids)
 *   x = LayerNorm(x)
 *   per layer (post-LN):  a = attention(x) (biases on q, k, v; every query sees the row's lens[b] tokens)
 *                         x = LayerNorm(dense(a) + x)
 *                         x = LayerNorm(dense(gelu(dense(x))) + x)   (the exact, erf GELU)
 * last_hidden_state = x (no final norm). Weights as Hugging Face saves them, with or without the "bert." /
 * "roberta." prefix (the head's "classifier." never has one).
 *
 * It runs on the backend's encoder operations (linear with bias, layernorm, gelu, pack_kv + full_attention), the
 * ones Whisper's encoder uses. A call's rows each run whole (model/forward.c's encoder path): no KV cache. An
 * input is at most the position table's length and the backend's full-attention bound (BERT_MAX_KEYS).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "bert.h"
#include "core/json_get.h"
#include "embed.h"
#include "model.h"

/* keys of one backend full_attention call, at most (backend/cpu/encdec.c's ATT_FULL_KEYS, a Whisper window) */
#define BERT_MAX_KEYS 1500
#define BERT_MAX_HD 256

/* ---- config ---- */

static osp_status configure(const json_t *tc, const char *path, osp_config *c, int xlmr) {
    const char *act = osp_json_str(tc, "hidden_act");
    if (act && strcmp(act, "gelu") != 0)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported for an encoder (gelu)", path, act);
    const char *pe = osp_json_str(tc, "position_embedding_type");
    if (pe && strcmp(pe, "absolute") != 0)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: position_embedding_type '%s' is not supported (absolute)", path, pe);
    if (json_is_true(json_object_get(tc, "is_decoder")))
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: is_decoder: a causal BERT is not supported", path);
    c->eps = (float)osp_json_num(tc, "layer_norm_eps", 1e-12);
    c->n_pos_embed = osp_json_int(tc, "max_position_embeddings", 512);
    c->type_vocab = osp_json_int(tc, "type_vocab_size", 2);
    c->pad_id = osp_json_int(tc, "pad_token_id", xlmr ? 1 : 0);
    c->pos_from_pad = xlmr;
    c->max_pos = c->n_pos_embed - (xlmr ? c->pad_id + 1 : 0);
    if (c->type_vocab < 1 || c->pad_id < 0 || c->pad_id >= c->vocab || c->max_pos < 1)
        return osp_err(OSP_ERR_FORMAT, "%s: type_vocab_size %d, pad_token_id %d and max_position_embeddings %d do not "
                       "make an encoder", path, c->type_vocab, c->pad_id, c->n_pos_embed);
    if (c->max_pos > BERT_MAX_KEYS) c->max_pos = BERT_MAX_KEYS; /* an input attends in one full_attention call */
    if (c->n_kv_heads != c->n_heads || (int64_t)c->head_dim * c->n_heads != c->hidden || c->head_dim > BERT_MAX_HD)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: an encoder needs hidden_size = heads x head size (at most %d)", path,
                       BERT_MAX_HD);
    c->tie_embeddings = 0;
    c->no_head = 1;
    return OSP_OK;
}

static osp_status configure_bert(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root;
    return configure(tc, path, c, 0);
}

static osp_status configure_xlmr(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    (void)root;
    return configure(tc, path, c, 1);
}

/* XLMRobertaForSequenceClassification: the labels are id2label's (transformers' num_labels); only one (a
 * relevance logit) is run */
static osp_status configure_xlmr_cls(const json_t *root, const json_t *tc, const char *path, osp_config *c) {
    OSP_TRY(configure_xlmr(root, tc, path, c));
    json_t *labels = json_object_get(tc, "id2label");
    c->n_labels = json_is_object(labels) ? (int32_t)json_object_size(labels) : osp_json_int(tc, "num_labels", 2);
    if (c->n_labels != 1)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: a classifier of %d labels is not supported (a cross-encoder's one "
                       "relevance logit)", path, c->n_labels);
    return OSP_OK;
}

/* ---- weights ---- */

static osp_status layout(const osp_config *c, osp_model *m, const osp_tnames *nm, osp_tvisit visit, void *ctx) {
    const int64_t H = c->hidden, I = c->intermediate;
    const char *p = nm->prefix;
    const int G = OSP_TF_GATHERED, Z = OSP_TF_ZERO_MEAN;
#define M(field) (m ? &m->field : NULL)
#define W(field) (L ? &L->field : NULL)
    OSP_TRY(osp_tlinear(visit, ctx, M(embed), c->vocab, H, G, "%sembeddings.word_embeddings", p));
    OSP_TRY(osp_tlinear(visit, ctx, M(pos_embed), c->n_pos_embed, H, G, "%sembeddings.position_embeddings", p));
    OSP_TRY(osp_tlinear(visit, ctx, M(type_embed), c->type_vocab, H, G, "%sembeddings.token_type_embeddings", p));
    OSP_TRY(osp_tvec(visit, ctx, M(embed_norm), H, 0, "%sembeddings.LayerNorm.weight", p));
    OSP_TRY(osp_tvec(visit, ctx, M(embed_norm_b), H, Z, "%sembeddings.LayerNorm.bias", p));
    for (int i = 0; i < c->n_layers; i++) {
        osp_layer *L = m ? &m->layers[i] : NULL;
        if (L) L->intermediate = (int32_t)I, L->layer_scalar = 1.0f;
        char b[96];
        snprintf(b, sizeof b, "%sencoder.layer.%d.", p, i);
        OSP_TRY(osp_tlinear(visit, ctx, W(wq), H, H, 0, "%sattention.self.query", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bq), H, Z, "%sattention.self.query.bias", b));
        OSP_TRY(osp_tlinear(visit, ctx, W(wk), H, H, 0, "%sattention.self.key", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bk), H, Z, "%sattention.self.key.bias", b));
        OSP_TRY(osp_tlinear(visit, ctx, W(wv), H, H, 0, "%sattention.self.value", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bv), H, Z, "%sattention.self.value.bias", b));
        OSP_TRY(osp_tlinear(visit, ctx, W(wo), H, H, 0, "%sattention.output.dense", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bo), H, Z, "%sattention.output.dense.bias", b));
        OSP_TRY(osp_tvec(visit, ctx, W(post_attn_norm), H, 0, "%sattention.output.LayerNorm.weight", b));
        OSP_TRY(osp_tvec(visit, ctx, W(post_attn_norm_b), H, Z, "%sattention.output.LayerNorm.bias", b));
        OSP_TRY(osp_tlinear(visit, ctx, W(wu), I, H, 0, "%sintermediate.dense", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bu), I, Z, "%sintermediate.dense.bias", b));
        OSP_TRY(osp_tlinear(visit, ctx, W(wd), H, I, 0, "%soutput.dense", b));
        OSP_TRY(osp_tvec(visit, ctx, W(bd), H, Z, "%soutput.dense.bias", b));
        OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm), H, 0, "%soutput.LayerNorm.weight", b));
        OSP_TRY(osp_tvec(visit, ctx, W(post_mlp_norm_b), H, Z, "%soutput.LayerNorm.bias", b));
    }
    if (c->n_labels) { /* read on the host (osp_bert_pair_scores): gathered, so they stay in the mapping */
        OSP_TRY(osp_tlinear(visit, ctx, M(cls_dense), H, H, G, "classifier.dense"));
        OSP_TRY(osp_tvec(visit, ctx, M(cls_dense_b), H, Z, "classifier.dense.bias"));
        OSP_TRY(osp_tlinear(visit, ctx, M(cls_out), c->n_labels, H, G, "classifier.out_proj"));
        OSP_TRY(osp_tvec(visit, ctx, M(cls_out_b), c->n_labels, Z, "classifier.out_proj.bias"));
    }
#undef M
#undef W
    return OSP_OK;
}

/* ---- forward ---- */

typedef struct bert_scratch {
    osp_dbuf *kh, *vt; /* [heads][S][hd], [heads][hd][S]: one row's K and V packed, S <= max_tok */
    osp_dbuf *e;       /* [max_tok, hidden] the type, then the position, embeddings */
    int32_t *pos;      /* [max_tok] host: position ids */
    int32_t *types;    /* [max_tok] host: token types (all 0) */
} bert_scratch;

static void scratch_free(const osp_model *m, void *extra) {
    bert_scratch *x = extra;
    if (!x) return;
    osp_dbuf *v[] = {x->kh, x->vt, x->e};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i]) m->be->free(v[i]);
    osp_free(x->pos);
    osp_free(x->types);
    osp_free(x);
}

static osp_status scratch_new(const osp_model *m, int32_t max_tok, void **extra, int64_t *inter, int64_t *cols) {
    (void)inter, (void)cols;
    const size_t N = (size_t)max_tok, H = (size_t)m->cfg.hidden;
    bert_scratch *x = osp_malloc(OSP_POOL_MISC, sizeof *x);
    if (!x) return osp_err(OSP_ERR_NOMEM, "out of memory");
    x->kh = m->be->alloc(N * H);
    x->vt = m->be->alloc(N * H);
    x->e = m->be->alloc(N * H);
    x->pos = osp_malloc(OSP_POOL_MISC, N * sizeof(int32_t));
    x->types = osp_malloc(OSP_POOL_MISC, N * sizeof(int32_t));
    *extra = x;
    if (!x->kh || !x->vt || !x->e || !x->pos || !x->types) {
        scratch_free(m, x);
        *extra = NULL;
        return osp_err(OSP_ERR_NOMEM, "out of memory allocating an encoder's activations");
    }
    memset(x->types, 0, N * sizeof(int32_t));
    return OSP_OK;
}

/* position ids of the chunk's rows (ids [B, T]) */
static void positions(const osp_config *c, const int32_t *ids, int32_t B, int32_t T, int32_t *pos) {
    for (int32_t b = 0; b < B; b++) {
        int32_t seen = 0;
        for (int32_t t = 0; t < T; t++) {
            int32_t id = ids[(int64_t)b * T + t];
            if (!c->pos_from_pad) pos[(int64_t)b * T + t] = t;
            else pos[(int64_t)b * T + t] = id == c->pad_id ? c->pad_id : c->pad_id + ++seen;
        }
    }
}

static void attention(osp_session *s, const osp_layer *L, int32_t B, int32_t T) {
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    bert_scratch *x = sc->extra;
    const int64_t N = (int64_t)B * T, H = c->hidden, hd = c->head_dim;
    be->linear(bs, &L->wq, sc->x, N, L->bq, sc->q);
    be->linear(bs, &L->wk, sc->x, N, L->bk, sc->k);
    be->linear(bs, &L->wv, sc->x, N, L->bv, sc->v);
    be->scale(bs, sc->q, 1.0f / sqrtf((float)hd), N * H);
    for (int32_t b = 0; b < B; b++) {
        const int64_t S = s->lens ? s->lens[b] : T, at = (int64_t)b * T * H;
        osp_full_attn_args a = {.q = osp_dbuf_at(sc->q, at), .kh = osp_dbuf_at(sc->k, at), .vt = osp_dbuf_at(sc->v, at),
                                .out = osp_dbuf_at(sc->att, at), .n = T, .S = S, .ld = H, .heads = c->n_heads,
                                .hd = (int32_t)hd, .whole = 1};
        if (be->full_attention_rows && be->full_attention_rows(bs, &a)) continue; /* no packed copy */
        be->pack_kv(bs, x->kh, x->vt, a.kh, a.vt, S, H, c->n_heads, (int32_t)hd);
        a.kh = x->kh, a.vt = x->vt;
        be->full_attention(bs, &a);
    }
}

static osp_status forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                int64_t ld_rows) {
    (void)all_logits, (void)ld_rows;
    const osp_model *m = s->m;
    const osp_backend *be = s->be;
    osp_be_session *bs = s->bs;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    bert_scratch *x = sc->extra;
    const int32_t B = s->nb;
    const int64_t N = (int64_t)B * T, H = c->hidden, I = c->intermediate;
    if (logits || !s->hidden || !ids)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: an encoder gives hidden states only", m->dir);
    positions(c, ids, B, T, x->pos);
    be->embed(bs, &m->embed, 1.0f, ids, N, sc->x);
    be->embed(bs, &m->type_embed, 1.0f, x->types, N, x->e);
    be->add(bs, sc->x, x->e, N * H);
    be->embed(bs, &m->pos_embed, 1.0f, x->pos, N, x->e);
    be->add(bs, sc->x, x->e, N * H);
    be->layernorm(bs, sc->xn, sc->x, m->embed_norm, m->embed_norm_b, N, H, c->eps);
    be->copy(bs, sc->x, sc->xn, N * H);
    for (int li = 0; li < c->n_layers; li++) {
        const osp_layer *L = &m->layers[li];
        attention(s, L, B, T);
        be->linear(bs, &L->wo, sc->att, N, L->bo, sc->tmp);
        be->add(bs, sc->tmp, sc->x, N * H);
        be->layernorm(bs, sc->xn, sc->tmp, L->post_attn_norm, L->post_attn_norm_b, N, H, c->eps);
        be->linear(bs, &L->wu, sc->xn, N, L->bu, sc->g);
        be->gelu(bs, sc->g, N * I);
        be->linear(bs, &L->wd, sc->g, N, L->bd, sc->tmp);
        be->add(bs, sc->tmp, sc->xn, N * H);
        be->layernorm(bs, li + 1 < c->n_layers ? sc->x : sc->xn, sc->tmp, L->post_mlp_norm, L->post_mlp_norm_b, N, H,
                      c->eps);
    }
    if (be->end_chunk) be->end_chunk(bs); /* no head ends this chunk (a GPU may run it as a graph) */
    return OSP_OK; /* the states are in xn, where osp_forward_rows_hidden reads them */
}

/* ---- the tables ---- */

static const char *const PREFIXES[] = {"", "bert.", "roberta.", NULL};

#define BERT_BODY                                                                                                \
    .act_default = "gelu", .own_act = 1, .layout = layout, .scratch_new = scratch_new,                          \
    .scratch_free = scratch_free, .forward_chunk = forward_chunk, .hidden = 1, .encoder = 1, .prefixes = PREFIXES, \
    .probe = "embeddings.word_embeddings.weight"

const osp_arch_ops osp_arch_bert = {
    .name = "bert", .hf_names = (const char *const[]){"BertModel", NULL},
    .model_types = (const char *const[]){"bert", NULL}, .configure = configure_bert, BERT_BODY};
const osp_arch_ops osp_arch_xlmr = {
    .name = "xlm-roberta", .hf_names = (const char *const[]){"XLMRobertaModel", NULL},
    .model_types = (const char *const[]){"xlm-roberta", NULL}, .configure = configure_xlmr, BERT_BODY};
const osp_arch_ops osp_arch_xlmr_cls = {
    .name = "xlm-roberta", .hf_names = (const char *const[]){"XLMRobertaForSequenceClassification", NULL},
    .model_types = (const char *const[]){NULL}, .configure = configure_xlmr_cls, BERT_BODY};

/* ---- the cross-encoder ---- */

osp_status osp_bert_pair_ids(const osp_tokenizer *tok, const char *query, const char *doc, int32_t max_len,
                             int32_t **ids, int32_t *n) {
    *ids = NULL, *n = 0;
    const int32_t cls = osp_tokenizer_token_id(tok, "<s>", 3), sep = osp_tokenizer_token_id(tok, "</s>", 4);
    if (cls < 0 || sep < 0) return osp_err(OSP_ERR_UNSUPPORTED, "the tokenizer has no <s> and </s>: not XLM-R's");
    int32_t *q = NULL, *d = NULL;
    size_t nq = 0, nd = 0;
    osp_status rc = osp_tokenizer_encode_alloc(tok, query, strlen(query), 0, &q, &nq);
    if (rc == OSP_OK) rc = osp_tokenizer_encode_alloc(tok, doc, strlen(doc), 0, &d, &nd);
    if (rc == OSP_OK && max_len < 5) rc = osp_err(OSP_ERR_INVALID, "a pair needs room for at least 5 tokens");
    if (rc == OSP_OK) {
        /* longest_first (HF tokenizers): a token off the longer side, the document's when equal, until it fits */
        size_t room = (size_t)max_len - 4;
        while (nq + nd > room) {
            if (nd >= nq) nd--;
            else nq--;
        }
        int32_t *o = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (nq + nd + 4));
        if (!o) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        else {
            size_t k = 0;
            o[k++] = cls;
            for (size_t i = 0; i < nq; i++) o[k++] = q[i];
            o[k++] = sep, o[k++] = sep;
            for (size_t i = 0; i < nd; i++) o[k++] = d[i];
            o[k++] = sep;
            *ids = o, *n = (int32_t)k;
        }
    }
    osp_free(q);
    osp_free(d);
    return rc;
}

osp_status osp_bert_pair_scores(osp_session *s, const int32_t *const *ids, const int32_t *len, int32_t n,
                                float *scores) {
    const osp_model *m = osp_session_model(s);
    const osp_config *c = &m->cfg;
    const int64_t H = c->hidden;
    if (c->n_labels != 1 || !m->cls_dense.data || !m->cls_out.data)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: not a cross-encoder (XLMRobertaForSequenceClassification with one "
                       "label)", m->dir);
    if (m->cls_dense.qbits || m->cls_out.qbits)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: a quantized classifier is not supported", m->dir);
    if (n < 1) return osp_err(OSP_ERR_INVALID, "no pairs to score");
    osp_embed_config ec = {.pooling = OSP_POOLING_CLS, .dims = (int32_t)H};
    float *h = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)(n * H + H + 1));
    double *t = osp_malloc(OSP_POOL_MISC, sizeof(double) * (size_t)H);
    if (!h || !t) {
        osp_free(h);
        osp_free(t);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    float *bd = h + n * H, *bo = bd + H;
    osp_status rc = osp_embed_run(s, &ec, ids, len, n, h);
    if (rc == OSP_OK) {
        m->be->read(bd, m->cls_dense_b, H);
        m->be->read(bo, m->cls_out_b, 1);
    }
    const void *wd = m->cls_dense.data, *wo = m->cls_out.data;
    for (int32_t i = 0; i < n && rc == OSP_OK; i++) {
        const float *x = h + (int64_t)i * H;
        for (int64_t j = 0; j < H; j++) {
            double acc = bd[j];
            for (int64_t k = 0; k < H; k++) acc += (double)osp_load_float(wd, m->cls_dense.dtype, j * H + k) * x[k];
            t[j] = tanh(acc);
        }
        double acc = bo[0];
        for (int64_t j = 0; j < H; j++) acc += (double)osp_load_float(wo, m->cls_out.dtype, j) * t[j];
        scores[i] = (float)acc;
    }
    osp_free(h);
    osp_free(t);
    return rc;
}
