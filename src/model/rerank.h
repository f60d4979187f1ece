/* model/rerank: a model as a reranker (issue 40): the relevance of
 * documents to a query, one score in [0, 1] per (query, document) pair.
 *
 * A reranker is a kind (rerank_kind.h): a table of how a loaded model and
 * its tokenizer are recognised, how a pair becomes token ids, and how rows
 * of pairs become scores. osp_rerank_open tries the kinds of rerank.c's
 * list in order and takes the first that recognises the model; nothing
 * outside a kind's own file names a model. Kinds: Qwen3-Reranker
 * (rerank_qwen3.c: P(yes) of the "yes" and "no" logits at the last
 * position of its prompt) and the XLM-R cross-encoder (rerank_xlmr.c: the
 * sigmoid of its classifier's logit).
 *
 * The reranker owns its session (rows pairs at once, each of up to ctx
 * tokens); the model and tokenizer are the caller's and must outlive it.
 * Many pairs run as rows of one forward pass, as the embedder's inputs do
 * (model/embed.h). */
#ifndef OSP_RERANK_H
#define OSP_RERANK_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "osprey.h"
#include "text/tokenizer.h"

typedef struct osp_reranker osp_reranker;

/* The first kind recognising m (with its tokenizer tok); a session of rows rows of up to ctx tokens (the model's
 * context at most). OSP_ERR_UNSUPPORTED, saying what each kind looks for, when none does. */
osp_status osp_rerank_open(const osp_model *m, const osp_tokenizer *tok, int32_t rows, int32_t ctx, osp_reranker **out);
void osp_rerank_free(osp_reranker *r);

const char *osp_rerank_kind_name(const osp_reranker *r);
/* 1 when the kind takes an instruction (osp_rerank_tokens refuses one otherwise) */
int osp_rerank_takes_instruction(const osp_reranker *r);
int32_t osp_rerank_ctx(const osp_reranker *r);
/* production precision (the server's), as osp_session_set_fast */
void osp_rerank_set_fast(osp_reranker *r, int fast);

/* One pair's token ids (osp_malloc'd, *n of them): the kind's prompt around the query and the document.
 * instruction: the task, or NULL for the kind's default. OSP_ERR_INVALID for text the tokenizer refuses. */
osp_status osp_rerank_tokens(const osp_reranker *r, const char *instruction, const char *query, size_t query_len,
                             const char *doc, size_t doc_len, int32_t **ids, int32_t *n);

/* The scores of n pairs' token ids (ids[i] of len[i] >= 1 tokens, each at most the context) into scores [n],
 * up to the session's rows at a time. */
osp_status osp_rerank_score(osp_reranker *r, const int32_t *const *ids, const int32_t *len, int32_t n, float *scores);

#endif
