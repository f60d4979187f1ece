/* libFuzzer: a /v1/rerank body → its reading (server/rerank_req: a 400
 * naming a field, or a request whose every document has a text and whose
 * top_n is in 1..n) and, when read, the answer for scores drawn from the
 * input's bytes: top_n results, each index once, the highest score first,
 * ties in the documents' order, each with its document when asked. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/rerank_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!body) return 0;
    srv_rerank_req q;
    const char *param = NULL;
    char msg[512] = "";
    if (srv_rerank_parse(body, &q, &param, msg, sizeof msg)) {
        if (!param || !msg[0]) __builtin_trap();
        json_decref(body);
        return 0;
    }
    if (q.n < 1 || q.n > SRV_RERANK_MAX_DOCS || q.top_n < 1 || q.top_n > q.n || !q.query || !q.query_len) __builtin_trap();
    float *scores = malloc(sizeof(float) * (size_t)q.n);
    uint8_t *seen = calloc((size_t)q.n, 1);
    for (int32_t i = 0; i < q.n; i++) {
        if (!srv_rerank_doc_text(json_array_get(q.docs, (size_t)i))) __builtin_trap();
        scores[i] = (float)data[(size_t)i % size] / 255.0f; /* (ties are frequent) */
    }
    json_t *a = srv_rerank_answer(&q, scores, "m", 1);
    const json_t *res = json_object_get(a, "results");
    if (!a || json_array_size(res) != (size_t)q.top_n) __builtin_trap();
    for (size_t k = 0; k < json_array_size(res); k++) {
        const json_t *r = json_array_get(res, k);
        json_int_t i = json_integer_value(json_object_get(r, "index"));
        if (i < 0 || i >= q.n || seen[i]) __builtin_trap();
        seen[i] = 1;
        if (k) {
            json_int_t p = json_integer_value(json_object_get(json_array_get(res, k - 1), "index"));
            if (scores[p] < scores[i] || (scores[p] == scores[i] && p > i)) __builtin_trap();
        }
        const json_t *d = json_object_get(r, "document");
        if (q.with_docs != (d != NULL)) __builtin_trap();
        if (d && !json_equal(json_object_get(d, "text"), srv_rerank_doc_text(json_array_get(q.docs, (size_t)i))))
            __builtin_trap();
    }
    json_decref(a);
    free(scores), free(seen);
    json_decref(body);
    return 0;
}
