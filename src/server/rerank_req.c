/* server/rerank_req: the /v1/rerank body and answer (rerank_req.h). */
#include "rerank_req.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "string";
    case JSON_INTEGER: case JSON_REAL: return "number";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

const json_t *srv_rerank_doc_text(const json_t *d) {
    if (json_is_string(d)) return d;
    if (!json_is_object(d) || json_object_size(d) != 1) return NULL;
    const json_t *t = json_object_get(d, "text");
    return json_is_string(t) ? t : NULL;
}

#define FAIL(field, ...) return *param = (field), snprintf(msg, cap, __VA_ARGS__), 400

int srv_rerank_parse(const json_t *body, srv_rerank_req *q, const char **param, char *msg, size_t cap) {
    memset(q, 0, sizeof *q);
    if (!json_is_object(body)) FAIL("", "the body must be a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (!strcmp(key, "query") || !strcmp(key, "documents") || !strcmp(key, "top_n") ||
            !strcmp(key, "return_documents"))
            continue;
        if (!strcmp(key, "model") || !strcmp(key, "instruction")) {
            if (!json_is_string(v) && !json_is_null(v)) FAIL(key, "%s must be a string", key);
            continue;
        }
        FAIL(key, "unknown field '%.200s'", key);
    }
    const json_t *qy = json_object_get(body, "query"), *docs = json_object_get(body, "documents"),
                 *top = json_object_get(body, "top_n"), *rd = json_object_get(body, "return_documents"),
                 *ins = json_object_get(body, "instruction");
    if (!qy) FAIL("query", "query is required");
    if (!json_is_string(qy) || !json_string_length(qy)) FAIL("query", "query must be a non-empty string");
    if (!docs) FAIL("documents", "documents is required");
    if (!json_is_array(docs)) FAIL("documents", "documents must be a list of strings");
    size_t nd = json_array_size(docs);
    if (!nd) FAIL("documents", "documents must not be an empty list");
    if (nd > SRV_RERANK_MAX_DOCS) FAIL("documents", "documents has %zu items: at most %d", nd, SRV_RERANK_MAX_DOCS);
    for (size_t i = 0; i < nd; i++)
        if (!srv_rerank_doc_text(json_array_get(docs, i)))
            FAIL("documents", "documents[%zu] must be a string or an object {\"text\": string} (not a %s)", i,
                 type_name(json_array_get(docs, i)));
    q->n = q->top_n = (int32_t)nd;
    if (top && !json_is_null(top)) {
        if (!json_is_integer(top) || json_integer_value(top) < 1) FAIL("top_n", "top_n must be an integer of at least 1");
        if (json_integer_value(top) < q->n) q->top_n = (int32_t)json_integer_value(top);
    }
    if (rd && !json_is_null(rd) && !json_is_boolean(rd)) FAIL("return_documents", "return_documents must be a boolean");
    q->query = json_string_value(qy), q->query_len = json_string_length(qy);
    q->instruction = json_is_string(ins) ? json_string_value(ins) : NULL;
    q->docs = docs;
    q->with_docs = json_is_true(rd);
    return 0;
}

/* order[0..n) by score, the highest first, ties by index (a stable merge sort; tmp [n]) */
static void order_by_score(int32_t *order, int32_t *tmp, int32_t n, const float *s) {
    for (int32_t w = 1; w < n; w *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * w) {
            int32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = s[order[j]] > s[order[i]] ? order[j++] : order[i++];
            while (i < mid) tmp[k++] = order[i++];
            while (j < hi) tmp[k++] = order[j++];
        }
        memcpy(order, tmp, sizeof(int32_t) * (size_t)n);
    }
}

json_t *srv_rerank_answer(const srv_rerank_req *q, const float *scores, const char *model, int64_t tokens) {
    int32_t *order = malloc(sizeof(int32_t) * 2 * (size_t)q->n);
    json_t *res = order ? json_array() : NULL;
    if (!res) return free(order), NULL;
    for (int32_t i = 0; i < q->n; i++) order[i] = i;
    order_by_score(order, order + q->n, q->n, scores);
    for (int32_t k = 0; res && k < q->top_n; k++) {
        int32_t i = order[k];
        json_t *r = json_pack("{s:i, s:f}", "index", (json_int_t)i, "relevance_score", (double)scores[i]);
        if (r && q->with_docs)
            json_object_set_new(r, "document",
                                json_pack("{s:O}", "text", srv_rerank_doc_text(json_array_get(q->docs, (size_t)i))));
        if (!r || json_array_append_new(res, r)) json_decref(res), res = NULL;
    }
    free(order);
    return res ? json_pack("{s:s, s:s, s:o, s:{s:I, s:I}}", "object", "list", "model", model, "results", res, "usage",
                           "prompt_tokens", (json_int_t)tokens, "total_tokens", (json_int_t)tokens)
               : NULL;
}
