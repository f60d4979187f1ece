/* server/rerank: POST /v1/rerank (and /rerank, /v1/reranking, /reranking)
 * with the --rerank-model reranker (model/rerank.h), beside a chat model or
 * alone; the shape llama-server, Jina and Cohere share.
 *
 * The body and the answer are rerank_req.c's: query, documents (strings or
 * {"text"} objects), top_n, return_documents, instruction, model; results
 * by score, the highest first. A pair over the context is a 400 naming
 * documents. A request's pairs run together as rows of one forward
 * (up to --parallel at a time), with the pairs of the requests waiting when
 * it starts (server/seqbatch.h), in the device's production precision as
 * chat. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "model/rerank.h"
#include "server/rerank_req.h"
#include "server/seqbatch.h"
#include "server/server_internal.h"

typedef struct srv_rerank {
    osp_model *model;
    osp_tokenizer *tok;
    osp_reranker *r;
    char name[256];     /* the id answered when a request names none */
    srv_seqbatch batch; /* the requests' pairs, batched across requests, on the reranker */
    int batch_init;
} srv_rerank;

static osp_status rerank_rows(void *ctx, const int32_t *const *ids, const int32_t *len, int32_t n, float *out) {
    return osp_rerank_score(((srv_rerank *)ctx)->r, ids, len, n, out);
}

int srv_rerank_setup(srv *s) {
    const osp_serve_config *c = &s->cfg;
    if (!c->rerank_model) return 0;
    srv_rerank *e = calloc(1, sizeof *e);
    if (!e) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    s->rerank = e;
    osp_model_params mp = {.device = (osp_device)c->device, .place = 1};
    if (osp_model_load_params(c->rerank_model, &mp, &e->model) != OSP_OK) return -1;
    const osp_model_info *in = osp_model_get_info(e->model);
    int ctx = c->ctx > 0 ? c->ctx : 8192;
    if (osp_tokenizer_load(in->dir, &e->tok) != OSP_OK ||
        osp_rerank_open(e->model, e->tok, c->parallel > 0 ? c->parallel : 4, ctx, &e->r) != OSP_OK)
        return -1;
    osp_rerank_set_fast(e->r, 1);
    srv_seqbatch_init(&e->batch, rerank_rows, e, 1);
    e->batch_init = 1;
    srv_model_name(c->rerank_model, e->name, sizeof e->name);
    OSP_LOG(1, "osprey serve: reranker %s (%s, %s, context %d; %s) on /v1/rerank", c->rerank_model,
            in->architecture, osp_rerank_kind_name(e->r), osp_rerank_ctx(e->r), in->device);
    return 0;
}

void srv_rerank_teardown(srv *s) {
    srv_rerank *e = s->rerank;
    if (!e) return;
    osp_rerank_free(e->r);
    osp_tokenizer_free(e->tok);
    osp_model_free(e->model);
    if (e->batch_init) srv_seqbatch_destroy(&e->batch);
    free(e);
    s->rerank = NULL;
}

int srv_rerank_respond(srv *s, srv_req *c, const json_t *body) {
    srv_rerank *e = s->rerank;
    srv_rerank_req q;
    const char *param = "";
    char m[400];
    if (srv_rerank_parse(body, &q, &param, m, sizeof m)) return srv_send_json(s, c, 400, srv_error_json(400, m, param));
    if (q.instruction && !osp_rerank_takes_instruction(e->r)) {
        snprintf(m, sizeof m, "this reranker (%s) takes no instruction", osp_rerank_kind_name(e->r));
        return srv_send_json(s, c, 400, srv_error_json(400, m, "instruction"));
    }
    int32_t n = q.n, **ids = calloc((size_t)n, sizeof *ids), *len = calloc((size_t)n, sizeof *len);
    float *scores = malloc(sizeof(float) * (size_t)n);
    int64_t tokens = 0;
    int rc = 0;
    if (!ids || !len || !scores) {
        rc = srv_send_error(s, c, 500, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        const json_t *t = srv_rerank_doc_text(json_array_get(q.docs, (size_t)i));
        if (osp_rerank_tokens(e->r, q.instruction, q.query, q.query_len, json_string_value(t), json_string_length(t),
                              &ids[i], &len[i]) != OSP_OK) {
            snprintf(m, sizeof m, "documents[%d]: %s", i, osp_last_error());
            rc = srv_send_json(s, c, 400, srv_error_json(400, m, "documents"));
            goto done;
        }
        if (len[i] > osp_rerank_ctx(e->r)) {
            snprintf(m, sizeof m, "documents[%d] with the query has %d tokens, more than the context of %d", i, len[i],
                     osp_rerank_ctx(e->r));
            rc = srv_send_json(s, c, 400, srv_error_json(400, m, "documents"));
            goto done;
        }
        tokens += len[i];
    }
    atomic_fetch_add(&s->active, 1);
    osp_status st = srv_seqbatch_run(&e->batch, (const int32_t *const *)ids, len, n, scores);
    atomic_fetch_sub(&s->active, 1);
    const json_t *model = json_object_get(body, "model");
    json_t *o = st == OSP_OK ? srv_rerank_answer(&q, scores, json_is_string(model) ? json_string_value(model) : e->name,
                                                 tokens)
                             : NULL;
    if (st != OSP_OK) rc = srv_send_error(s, c, 500, osp_last_error());
    else if (!o) rc = srv_send_error(s, c, 500, "out of memory");
    else rc = srv_send_json(s, c, 200, o);
done:
    for (int32_t i = 0; ids && i < n; i++) osp_free(ids[i]);
    free(ids), free(len), free(scores);
    return rc;
}
