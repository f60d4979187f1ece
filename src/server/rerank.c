/* server/rerank: POST /v1/rerank (and /rerank, /v1/reranking, /reranking)
 * with the --rerank-model reranker (model/rerank.h), beside a chat model or
 * alone; the shape llama-server, Jina and Cohere share.
 *
 * The body: query (a non-empty string), documents (a non-empty list, at
 * most 2048, of strings or {"text": string} objects), top_n (an integer
 * >= 1: the best n; more than the documents: all), return_documents (a
 * boolean, default false: each result carries {"text"}), instruction (the
 * task, the kind's default when absent), model (any name, echoed). Any
 * other field, a wrong type, or a pair over the context is a 400 naming the
 * field.
 *
 * The answer: {"object": "list", "model", "results": [{"index",
 * "relevance_score", "document"?}], "usage": {"prompt_tokens",
 * "total_tokens"}}, results by score, the highest first (ties: the
 * documents' order). A request's pairs run together as rows of one forward
 * (up to --parallel at a time); requests take turns on the reranker (a
 * mutex), in the device's production precision as chat. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "model/rerank.h"
#include "server/server_internal.h"

#define MAX_DOCS 2048

typedef struct srv_rerank {
    osp_model *model;
    osp_tokenizer *tok;
    osp_reranker *r;
    char name[256];     /* the id answered when a request names none */
    pthread_mutex_t mu; /* one request on the reranker at a time */
} srv_rerank;

int srv_rerank_setup(srv *s) {
    const osp_serve_config *c = &s->cfg;
    if (!c->rerank_model) return 0;
    srv_rerank *e = calloc(1, sizeof *e);
    if (!e) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    pthread_mutex_init(&e->mu, NULL);
    s->rerank = e;
    osp_model_params mp = {.device = (osp_device)c->device, .place = 1};
    if (osp_model_load_params(c->rerank_model, &mp, &e->model) != OSP_OK) return -1;
    const osp_model_info *in = osp_model_get_info(e->model);
    int ctx = c->ctx > 0 ? c->ctx : 8192;
    if (osp_tokenizer_load(in->dir, &e->tok) != OSP_OK ||
        osp_rerank_open(e->model, e->tok, c->parallel > 0 ? c->parallel : 4, ctx, &e->r) != OSP_OK)
        return -1;
    osp_rerank_set_fast(e->r, 1);
    srv_model_name(c->rerank_model, e->name, sizeof e->name);
    OSP_LOG(1, "osprey serve: reranker %s (%s, %s, context %d) on /v1/rerank", c->rerank_model, in->architecture,
            osp_rerank_kind_name(e->r), osp_rerank_ctx(e->r));
    return 0;
}

void srv_rerank_teardown(srv *s) {
    srv_rerank *e = s->rerank;
    if (!e) return;
    osp_rerank_free(e->r);
    osp_tokenizer_free(e->tok);
    osp_model_free(e->model);
    pthread_mutex_destroy(&e->mu);
    free(e);
    s->rerank = NULL;
}

static int bad(srv *s, srv_req *c, const char *param, const char *msg) {
    return srv_send_json(s, c, 400, srv_error_json(400, msg, param));
}

/* document i's text, or NULL when it is neither a string nor {"text": string} */
static const json_t *doc_text(const json_t *d) {
    if (json_is_string(d)) return d;
    if (!json_is_object(d) || json_object_size(d) != 1) return NULL;
    const json_t *t = json_object_get(d, "text");
    return json_is_string(t) ? t : NULL;
}

static const float *g_sort_scores;
static int by_score(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_sort_scores[i] != g_sort_scores[j]) return g_sort_scores[i] > g_sort_scores[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static json_t *answer(srv_rerank *e, const json_t *body, const json_t *docs, const float *scores, int32_t n,
                      int32_t top, int with_docs, int64_t tokens) {
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
    if (!order) return NULL;
    for (int32_t i = 0; i < n; i++) order[i] = i;
    g_sort_scores = scores; /* (the caller holds the reranker's mutex: one sort at a time) */
    qsort(order, (size_t)n, sizeof *order, by_score);
    json_t *res = json_array();
    for (int32_t k = 0; res && k < top; k++) {
        int32_t i = order[k];
        json_t *r = json_pack("{s:i, s:f}", "index", (json_int_t)i, "relevance_score", (double)scores[i]);
        if (r && with_docs) json_object_set_new(r, "document", json_pack("{s:O}", "text", doc_text(json_array_get(docs, (size_t)i))));
        if (!r || json_array_append_new(res, r)) {
            json_decref(res);
            res = NULL;
        }
    }
    free(order);
    const json_t *model = json_object_get(body, "model");
    return res ? json_pack("{s:s, s:s, s:o, s:{s:I, s:I}}", "object", "list", "model",
                           json_is_string(model) ? json_string_value(model) : e->name, "results", res, "usage",
                           "prompt_tokens", (json_int_t)tokens, "total_tokens", (json_int_t)tokens)
               : NULL;
}

int srv_rerank_respond(srv *s, srv_req *c, const json_t *body) {
    srv_rerank *e = s->rerank;
    const char *key;
    json_t *v;
    char m[400];
    json_object_foreach((json_t *)body, key, v) {
        if (!strcmp(key, "query") || !strcmp(key, "documents") || !strcmp(key, "top_n") ||
            !strcmp(key, "return_documents"))
            continue;
        if (!strcmp(key, "model") || !strcmp(key, "instruction")) {
            snprintf(m, sizeof m, "%s must be a string", key);
            if (!json_is_string(v) && !json_is_null(v)) return bad(s, c, key, m);
            continue;
        }
        snprintf(m, sizeof m, "unknown field '%.200s'", key);
        return bad(s, c, key, m);
    }
    const json_t *q = json_object_get(body, "query"), *docs = json_object_get(body, "documents"),
                 *top = json_object_get(body, "top_n"), *rd = json_object_get(body, "return_documents"),
                 *ins = json_object_get(body, "instruction");
    if (!q) return bad(s, c, "query", "query is required");
    if (!json_is_string(q) || !json_string_length(q)) return bad(s, c, "query", "query must be a non-empty string");
    if (!docs) return bad(s, c, "documents", "documents is required");
    if (!json_is_array(docs)) return bad(s, c, "documents", "documents must be a list of strings");
    size_t nd = json_array_size(docs);
    if (!nd) return bad(s, c, "documents", "documents must not be an empty list");
    if (nd > MAX_DOCS) {
        snprintf(m, sizeof m, "documents has %zu items: at most %d", nd, MAX_DOCS);
        return bad(s, c, "documents", m);
    }
    for (size_t i = 0; i < nd; i++)
        if (!doc_text(json_array_get(docs, i))) {
            snprintf(m, sizeof m, "documents[%zu] must be a string or an object {\"text\": string} (not a %s)", i,
                     srv_json_type(json_array_get(docs, i)));
            return bad(s, c, "documents", m);
        }
    int32_t n = (int32_t)nd, top_n = n;
    if (top && !json_is_null(top)) {
        if (!json_is_integer(top) || json_integer_value(top) < 1)
            return bad(s, c, "top_n", "top_n must be an integer of at least 1");
        if (json_integer_value(top) < n) top_n = (int32_t)json_integer_value(top);
    }
    if (rd && !json_is_null(rd) && !json_is_boolean(rd))
        return bad(s, c, "return_documents", "return_documents must be a boolean");
    int32_t **ids = calloc((size_t)n, sizeof *ids), *len = calloc((size_t)n, sizeof *len);
    float *scores = malloc(sizeof(float) * (size_t)n);
    int64_t tokens = 0;
    int rc = 0;
    if (!ids || !len || !scores) {
        rc = srv_send_error(s, c, 500, "out of memory");
        goto done;
    }
    const char *qs = json_string_value(q), *is = json_is_string(ins) ? json_string_value(ins) : NULL;
    for (int32_t i = 0; i < n; i++) {
        const json_t *t = doc_text(json_array_get(docs, (size_t)i));
        if (osp_rerank_tokens(e->r, is, qs, json_string_length(q), json_string_value(t), json_string_length(t), &ids[i],
                              &len[i]) != OSP_OK) {
            snprintf(m, sizeof m, "documents[%d]: %s", i, osp_last_error());
            rc = bad(s, c, "documents", m);
            goto done;
        }
        if (len[i] > osp_rerank_ctx(e->r)) {
            snprintf(m, sizeof m, "documents[%d] with the query has %d tokens, more than the context of %d", i, len[i],
                     osp_rerank_ctx(e->r));
            rc = bad(s, c, "documents", m);
            goto done;
        }
        tokens += len[i];
    }
    atomic_fetch_add(&s->active, 1);
    pthread_mutex_lock(&e->mu);
    osp_status st = osp_rerank_score(e->r, (const int32_t *const *)ids, len, n, scores);
    json_t *o = st == OSP_OK ? answer(e, body, docs, scores, n, top_n, json_is_true(rd), tokens) : NULL;
    pthread_mutex_unlock(&e->mu);
    atomic_fetch_sub(&s->active, 1);
    if (st != OSP_OK) rc = srv_send_error(s, c, 500, osp_last_error());
    else if (!o) rc = srv_send_error(s, c, 500, "out of memory");
    else rc = srv_send_json(s, c, 200, o);
done:
    for (int32_t i = 0; ids && i < n; i++) osp_free(ids[i]);
    free(ids), free(len), free(scores);
    return rc;
}
