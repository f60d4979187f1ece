/* model/rerank_qwen3: Qwen3-Reranker, a causal LM (with its lm_head) asked
 * whether a document meets a query, scored by its answer's first token.
 *
 * The prompt is the model card's: a chat of a system turn (judge whether
 * the Document meets the requirements ...; "yes" or "no"), a user turn
 * "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" and an
 * assistant turn opened with an empty think block. Its three parts are
 * tokenized apart, as the card's code does: the prefix and the suffix
 * without the post-processor's tokens, the middle with them (Qwen3's adds
 * none).
 *
 * The score is P(yes) = softmax(l_no, l_yes)[1], the logits of the tokens
 * "yes" and "no" (ids read from the tokenizer) at the last position. Only
 * those two logits are computed: the final normed hidden state there (the
 * embedder's last-token state, osp_embed_run) dotted with the two rows of
 * the head, read once at open, in double; the final soft-cap applies where
 * the model has one. Rows are padded on the right: attention is causal, so
 * a pair's last position never sees its padding.
 *
 * Recognised: a model with an lm_head that gives hidden states, whose
 * tokenizer has single tokens "yes", "no", "<|im_start|>" and "<|im_end|>"
 * (the caller says the model is a reranker: --rerank-model). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "embed.h"
#include "model.h"
#include "rerank_kind.h"

static const char PREFIX[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n";
static const char SUFFIX[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
static const char DEFAULT_INSTRUCTION[] = "Given a web search query, retrieve relevant passages that answer the query";

typedef struct qwen3_state {
    int32_t yes, no;
    double *w;   /* [2][hidden]: the head's rows of yes and no */
    int32_t *prefix, *suffix;
    size_t n_prefix, n_suffix;
    float *h;    /* [rows][hidden] scratch: last-position states */
} qwen3_state;

static int32_t tok_id(const osp_tokenizer *t, const char *s) { return osp_tokenizer_token_id(t, s, strlen(s)); }

static int matches(const osp_model *m, const osp_tokenizer *tok, char *why, size_t cap) {
    const char *need[] = {"yes", "no", "<|im_start|>", "<|im_end|>"};
    int ok = osp_model_get_info(m)->has_head && m->cfg.arch->hidden;
    for (size_t i = 0; i < sizeof need / sizeof *need && ok; i++) ok = tok_id(tok, need[i]) >= 0;
    if (!ok)
        snprintf(why, cap, "a Qwen3-Reranker is a causal LM with an lm_head whose tokenizer has the tokens yes, no, "
                 "<|im_start|> and <|im_end|>");
    return ok;
}

static void close_state(osp_reranker *r) {
    qwen3_state *q = r->state;
    if (!q) return;
    osp_free(q->prefix), osp_free(q->suffix);
    free(q->w), free(q->h), free(q);
    r->state = NULL;
}

static osp_status open_state(osp_reranker *r) {
    const osp_model *m = r->m;
    const int64_t H = m->cfg.hidden;
    qwen3_state *q = calloc(1, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "out of memory");
    r->state = q;
    q->yes = tok_id(r->tok, "yes"), q->no = tok_id(r->tok, "no");
    if (q->yes >= m->cfg.vocab || q->no >= m->cfg.vocab)
        return close_state(r), osp_err(OSP_ERR_FORMAT, "%s: the tokens yes and no are outside the head's %d rows",
                                       m->dir, m->cfg.vocab);
    q->w = malloc(sizeof(double) * 2 * (size_t)H);
    q->h = malloc(sizeof(float) * (size_t)r->rows * (size_t)H);
    float *rows = malloc(sizeof(float) * 2 * (size_t)H);
    osp_dbuf *d = m->be->alloc(2 * (size_t)H);
    osp_status rc = q->w && q->h && rows && d ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc == OSP_OK) { /* the head's rows as the backend keeps them (dequantized where quantized) */
        int32_t ids[2] = {q->yes, q->no};
        r->s->be->embed(r->s->bs, &m->head, 1.0f, ids, 2, d);
        rc = r->s->be->status(r->s->bs);
        if (rc == OSP_OK) r->s->be->read(rows, d, 2 * H);
        for (int64_t j = 0; rc == OSP_OK && j < 2 * H; j++) q->w[j] = rows[j];
    }
    if (d) m->be->free(d);
    free(rows);
    if (rc == OSP_OK) rc = osp_tokenizer_encode_alloc(r->tok, PREFIX, strlen(PREFIX), 0, &q->prefix, &q->n_prefix);
    if (rc == OSP_OK) rc = osp_tokenizer_encode_alloc(r->tok, SUFFIX, strlen(SUFFIX), 0, &q->suffix, &q->n_suffix);
    if (rc != OSP_OK) close_state(r);
    return rc;
}

static osp_status tokens(const osp_reranker *r, const char *instruction, const char *query, size_t query_len,
                         const char *doc, size_t doc_len, int32_t **ids, int32_t *n) {
    const qwen3_state *q = r->state;
    if (!instruction) instruction = DEFAULT_INSTRUCTION;
    size_t il = strlen(instruction), cap = il + query_len + doc_len + 64, k = 0;
    char *text = malloc(cap);
    if (!text) return osp_err(OSP_ERR_NOMEM, "out of memory");
    int used = snprintf(text, cap, "<Instruct>: %s\n<Query>: ", instruction);
    memcpy(text + used, query, query_len), used += (int)query_len;
    used += snprintf(text + used, cap - (size_t)used, "\n<Document>: ");
    memcpy(text + used, doc, doc_len), used += (int)doc_len;
    int32_t *mid = NULL;
    osp_status rc = osp_tokenizer_encode_alloc(r->tok, text, (size_t)used, 1, &mid, &k);
    free(text);
    if (rc != OSP_OK) return rc;
    size_t total = q->n_prefix + k + q->n_suffix;
    *ids = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * total);
    if (!*ids) {
        osp_free(mid);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    memcpy(*ids, q->prefix, sizeof(int32_t) * q->n_prefix);
    memcpy(*ids + q->n_prefix, mid, sizeof(int32_t) * k);
    memcpy(*ids + q->n_prefix + k, q->suffix, sizeof(int32_t) * q->n_suffix);
    osp_free(mid);
    *n = (int32_t)total;
    return OSP_OK;
}

static osp_status score(osp_reranker *r, const int32_t *const *ids, const int32_t *len, int32_t n, float *scores) {
    qwen3_state *q = r->state;
    const int64_t H = r->m->cfg.hidden;
    const double cap = r->m->cfg.final_softcap;
    osp_embed_config last = {.pooling = OSP_POOLING_LAST, .hidden = (int32_t)H, .dims = (int32_t)H};
    for (int32_t i0 = 0; i0 < n; i0 += r->rows) {
        int32_t nb = n - i0 < r->rows ? n - i0 : r->rows;
        OSP_TRY(osp_embed_run(r->s, &last, ids + i0, len + i0, nb, q->h));
        for (int32_t b = 0; b < nb; b++) {
            const float *h = q->h + (int64_t)b * H;
            double ly = 0, ln = 0;
            for (int64_t j = 0; j < H; j++) ly += h[j] * q->w[j], ln += h[j] * q->w[H + j];
            if (cap > 0) ly = cap * tanh(ly / cap), ln = cap * tanh(ln / cap);
            scores[i0 + b] = (float)(1.0 / (1.0 + exp(ln - ly)));
        }
    }
    return OSP_OK;
}

const osp_rerank_kind osp_rerank_qwen3 = {.name = "qwen3-reranker", .instruction = 1, .matches = matches, .open = open_state,
                                          .close = close_state, .tokens = tokens, .score = score};
