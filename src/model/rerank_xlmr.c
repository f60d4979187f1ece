/* model/rerank_xlmr: the cross-encoder kind of reranker (rerank_kind.h):
 * XLMRobertaForSequenceClassification with one label (bge-reranker-v2-m3),
 * whose pair encoding and relevance logit are model/bert.c's
 * (osp_bert_pair_ids: <s> query </s></s> document </s>; osp_bert_pair_scores:
 * the classifier on the first token's state). The score is the logit's
 * sigmoid, in double: what sentence-transformers' CrossEncoder gives for
 * one label, in [0, 1] as the other kinds' scores. It takes no instruction.
 * A pair is not truncated: one over the context is refused, as every
 * kind's is (rerank.c).
 *
 * Recognised: an encoder (arch.h's encoder) with a one-label classifier. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "bert.h"
#include "model.h"
#include "rerank_kind.h"

static int matches(const osp_model *m, const osp_tokenizer *tok, char *why, size_t cap) {
    (void)tok;
    int ok = m->cfg.arch->encoder && m->cfg.n_labels == 1;
    if (!ok) snprintf(why, cap, "a cross-encoder is an XLMRobertaForSequenceClassification with one label");
    return ok;
}

static osp_status open_state(osp_reranker *r) {
    (void)r;
    return OSP_OK;
}

static void close_state(osp_reranker *r) { (void)r; }

static osp_status tokens(const osp_reranker *r, const char *instruction, const char *query, size_t query_len,
                         const char *doc, size_t doc_len, int32_t **ids, int32_t *n) {
    if (instruction) return osp_err(OSP_ERR_INVALID, "this reranker (a cross-encoder) takes no instruction");
    char *q = malloc(query_len + 1), *d = malloc(doc_len + 1);
    osp_status rc = q && d ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc == OSP_OK) {
        memcpy(q, query, query_len), q[query_len] = 0;
        memcpy(d, doc, doc_len), d[doc_len] = 0;
        rc = osp_bert_pair_ids(r->tok, q, d, INT32_MAX, ids, n); /* (no truncation: rerank.c refuses what is over) */
    }
    free(q), free(d);
    return rc;
}

static osp_status score(osp_reranker *r, const int32_t *const *ids, const int32_t *len, int32_t n, float *scores) {
    OSP_TRY(osp_bert_pair_scores(r->s, ids, len, n, scores));
    for (int32_t i = 0; i < n; i++) scores[i] = (float)(1.0 / (1.0 + exp(-(double)scores[i])));
    return OSP_OK;
}

const osp_rerank_kind osp_rerank_xlmr = {.name = "xlmr-cross-encoder", .matches = matches, .open = open_state,
                                         .close = close_state, .tokens = tokens, .score = score};
