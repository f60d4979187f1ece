/* server/rerank_req: the /v1/rerank body read and checked, and the results
 * ordered and written (server/rerank.c uses them; pure, so that the fuzzer
 * drives them: fuzz/fuzz_rerank.c). */
#ifndef SRV_RERANK_REQ_H
#define SRV_RERANK_REQ_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_RERANK_MAX_DOCS 2048

typedef struct srv_rerank_req {
    const char *query;       /* the body's (borrowed) */
    size_t query_len;
    const char *instruction; /* or NULL: the kind's default */
    const json_t *docs;      /* the body's list: strings or {"text": string} */
    int32_t n, top_n;        /* documents; results wanted (1..n) */
    int with_docs;           /* return_documents */
} srv_rerank_req;

/* 0, or 400 with the field at fault in *param and a message a client can act on in msg. */
int srv_rerank_parse(const json_t *body, srv_rerank_req *q, const char **param, char *msg, size_t cap);

/* document i's text (a JSON string), or NULL when it is neither a string nor {"text": string} */
const json_t *srv_rerank_doc_text(const json_t *d);

/* The answer: {"object": "list", "model", "results": [{"index", "relevance_score", "document"?}], "usage"}, the
 * top_n highest scores first (ties: the documents' order). NULL when out of memory. */
json_t *srv_rerank_answer(const srv_rerank_req *q, const float *scores, const char *model, int64_t tokens);

#endif
