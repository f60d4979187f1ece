/* model/rerank_kind: what a kind of reranker implements (model/rerank.h).
 * One file per kind fills an osp_rerank_kind; rerank.c lists them. */
#ifndef OSP_RERANK_KIND_H
#define OSP_RERANK_KIND_H

#include "rerank.h"

struct osp_reranker {
    const struct osp_rerank_kind *kind;
    const osp_model *m;
    const osp_tokenizer *tok;
    osp_session *s; /* the reranker's own: rows pairs of up to ctx tokens */
    int32_t rows, ctx;
    void *state;    /* the kind's (open/close) */
};

typedef struct osp_rerank_kind {
    const char *name; /* for the log: "qwen3-reranker" */
    int instruction;  /* takes an instruction (the task) */
    /* 1 when m and tok are of this kind; else 0 and what it looks for in why */
    int (*matches)(const osp_model *m, const osp_tokenizer *tok, char *why, size_t cap);
    /* its state in r->state (r's model, tokenizer and session are set); close frees it */
    osp_status (*open)(osp_reranker *r);
    void (*close)(osp_reranker *r);
    /* osp_rerank_tokens */
    osp_status (*tokens)(const osp_reranker *r, const char *instruction, const char *query, size_t query_len,
                         const char *doc, size_t doc_len, int32_t **ids, int32_t *n);
    /* osp_rerank_score, lengths already checked */
    osp_status (*score)(osp_reranker *r, const int32_t *const *ids, const int32_t *len, int32_t n, float *scores);
} osp_rerank_kind;

extern const osp_rerank_kind osp_rerank_qwen3;
extern const osp_rerank_kind osp_rerank_xlmr;

#endif
