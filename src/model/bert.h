/* model/bert: BERT and XLM-RoBERTa encoders (BertModel, XLMRobertaModel) as an architecture table (model/bert.c),
 * and the cross-encoder head of XLMRobertaForSequenceClassification (bge-reranker-v2-m3's).
 *
 * An encoder gives hidden states only (transformers' last_hidden_state, osp_forward_rows_hidden_lens); it embeds
 * through model/embed.h like any embedder (pooling from the folder's sentence-transformers files). A cross-encoder
 * scores a (query, document) pair from the state of its first token: out_proj(tanh(dense(h))), one logit
 * (num_labels 1), computed on the host from the classifier's weights in the file mapping, in double.
 */
#ifndef OSP_BERT_H
#define OSP_BERT_H

#include <stdint.h>
#include "core/core.h"
#include "osprey.h"
#include "text/tokenizer.h"

/* The pair as XLM-R's tokenizer encodes it for a cross-encoder: <s> query </s></s> document </s> (its
 * RobertaProcessing's pair template), the document's tail dropped to fit max_len tokens, then the query's
 * (transformers' longest_first truncation). *ids from osp_malloc (osp_free it), *n its length. */
osp_status osp_bert_pair_ids(const osp_tokenizer *tok, const char *query, const char *doc, int32_t max_len,
                             int32_t **ids, int32_t *n);

/* The relevance logits of n encoded pairs (ids[i] of len[i] tokens, at most the session's context) on a
 * sequence-classification checkpoint's session (osp_embed_session_new): scores[n]. OSP_ERR_UNSUPPORTED for a
 * model without a one-label classifier. */
osp_status osp_bert_pair_scores(osp_session *s, const int32_t *const *ids, const int32_t *len, int32_t n,
                                float *scores);

#endif
