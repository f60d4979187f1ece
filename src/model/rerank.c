/* model/rerank: the kinds' list and the calls every kind shares (rerank.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "embed.h"
#include "rerank_kind.h"

/* tried in order; a new kind is a file and a line here */
static const osp_rerank_kind *const KINDS[] = {&osp_rerank_qwen3, &osp_rerank_xlmr};
#define N_KINDS (sizeof KINDS / sizeof *KINDS)

osp_status osp_rerank_open(const osp_model *m, const osp_tokenizer *tok, int32_t rows, int32_t ctx, osp_reranker **out) {
    *out = NULL;
    const osp_model_info *in = osp_model_get_info(m);
    if (rows < 1) return osp_err(OSP_ERR_INVALID, "a reranker needs at least one row");
    if (ctx < 1 || (in->max_ctx > 0 && ctx > in->max_ctx)) ctx = in->max_ctx > 0 ? in->max_ctx : 8192;
    char why[N_KINDS][300], all[N_KINDS * 310] = "";
    const osp_rerank_kind *k = NULL;
    for (size_t i = 0; i < N_KINDS && !k; i++) {
        why[i][0] = 0;
        if (KINDS[i]->matches(m, tok, why[i], sizeof why[i])) k = KINDS[i];
    }
    if (!k) {
        size_t used = 0;
        for (size_t i = 0; i < N_KINDS; i++)
            used += (size_t)snprintf(all + used, sizeof all - used, "%s%s", i ? "; " : "", why[i]);
        return osp_err(OSP_ERR_UNSUPPORTED, "%s is not a reranker osprey runs: %s", in->dir, all);
    }
    osp_reranker *r = calloc(1, sizeof *r);
    if (!r) return osp_err(OSP_ERR_NOMEM, "out of memory");
    *r = (osp_reranker){.kind = k, .m = m, .tok = tok, .rows = rows, .ctx = ctx};
    osp_status rc = osp_embed_session_new(m, rows, ctx, &r->s);
    if (rc == OSP_OK) rc = k->open(r);
    if (rc != OSP_OK) {
        osp_session_free(r->s);
        free(r);
        return rc;
    }
    *out = r;
    return OSP_OK;
}

void osp_rerank_free(osp_reranker *r) {
    if (!r) return;
    r->kind->close(r);
    osp_session_free(r->s);
    free(r);
}

const char *osp_rerank_kind_name(const osp_reranker *r) { return r->kind->name; }
int osp_rerank_takes_instruction(const osp_reranker *r) { return r->kind->instruction; }
int32_t osp_rerank_ctx(const osp_reranker *r) { return r->ctx; }
void osp_rerank_set_fast(osp_reranker *r, int fast) { osp_session_set_fast(r->s, fast); }

osp_status osp_rerank_tokens(const osp_reranker *r, const char *instruction, const char *query, size_t query_len,
                             const char *doc, size_t doc_len, int32_t **ids, int32_t *n) {
    *ids = NULL, *n = 0;
    return r->kind->tokens(r, instruction, query, query_len, doc, doc_len, ids, n);
}

osp_status osp_rerank_score(osp_reranker *r, const int32_t *const *ids, const int32_t *len, int32_t n, float *scores) {
    for (int32_t i = 0; i < n; i++)
        if (len[i] < 1 || len[i] > r->ctx)
            return osp_err(OSP_ERR_RANGE, "pair %d has %d tokens: between 1 and %d (the context) are allowed", i,
                           len[i], r->ctx);
    return n ? r->kind->score(r, ids, len, n, scores) : OSP_OK;
}
