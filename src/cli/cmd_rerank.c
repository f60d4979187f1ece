/* osprey rerank: the relevance of documents to a query (model/rerank.h), as
 * JSON lines {"index", "relevance_score"}, the most relevant first (the
 * order of /v1/rerank's results; ties keep the documents' order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"
#include "core/core.h"
#include "model/rerank.h"
#include "osprey.h"
#include "text/tokenizer.h"

static int usage(void) {
    fprintf(stderr, "usage: osprey rerank --model M --query Q [--instruction I] [--batch N] [--fast] [-t THREADS]\n"
                    "                     [--device cpu|cuda|auto] DOC...\n"
                    "  one JSON line per document, the most relevant first: {\"index\": i, \"relevance_score\": s}\n"
                    "  --instruction I: the task (the model's default otherwise)\n"
                    "  --batch N: documents run together as rows of one forward (default 8)\n"
                    "  --fast: the production path (as the server) instead of reference precision\n");
    return 2;
}

static const float *g_scores;

static int by_score(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_scores[i] != g_scores[j]) return g_scores[i] > g_scores[j] ? -1 : 1;
    return i - j;
}

int osp_cmd_rerank(int argc, char **argv) {
    const char *model = NULL, *query = NULL, *instruction = NULL;
    const char **docs = calloc((size_t)argc, sizeof *docs);
    int n = 0, device = OSP_DEVICE_AUTO, threads = 0, batch = 8, fast = 0, rc = 1;
    if (!docs) return 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int dv = osp_cli_device_flag("rerank", f, v, &device);
        if (dv < 0) return free(docs), 2;
        if (dv) {
            i++;
            continue;
        }
        if (!strcmp(f, "--fast")) fast = 1;
        else if (f[0] != '-' || !f[1]) docs[n++] = f;
        else if (!v) return free(docs), usage();
        else if (!strcmp(f, "--model") || !strcmp(f, "-m")) model = v, i++;
        else if (!strcmp(f, "--query") || !strcmp(f, "-q")) query = v, i++;
        else if (!strcmp(f, "--instruction")) instruction = v, i++;
        else if (!strcmp(f, "--batch")) batch = atoi(v), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) threads = atoi(v), i++;
        else return free(docs), usage();
    }
    if (!model || !query || !n || batch < 1) return free(docs), usage();
    if (threads) osp_set_threads(threads);

    osp_model *m = NULL;
    osp_tokenizer *tok = NULL;
    osp_reranker *r = NULL;
    int32_t **ids = calloc((size_t)n, sizeof *ids), *len = calloc((size_t)n, sizeof *len), maxlen = 0;
    float *scores = calloc((size_t)n, sizeof *scores);
    int *order = calloc((size_t)n, sizeof *order);
    osp_model_params p = {.device = (osp_device)device, .place = 1};
    if (!ids || !len || !scores || !order) goto done;
    if (osp_model_load_params(model, &p, &m) != OSP_OK ||
        osp_tokenizer_load(osp_model_get_info(m)->dir, &tok) != OSP_OK ||
        osp_rerank_open(m, tok, n < batch ? n : batch, 0, &r) != OSP_OK) {
        rc = osp_cli_fail("rerank");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (osp_rerank_tokens(r, instruction, query, strlen(query), docs[i], strlen(docs[i]), &ids[i], &len[i]) !=
            OSP_OK) {
            rc = osp_cli_fail("rerank");
            goto done;
        }
        maxlen = len[i] > maxlen ? len[i] : maxlen;
    }
    if (maxlen > osp_rerank_ctx(r)) {
        fprintf(stderr, "osprey rerank: a pair has %d tokens: the context is %d\n", maxlen, osp_rerank_ctx(r));
        goto done;
    }
    osp_rerank_set_fast(r, fast);
    if (osp_rerank_score(r, (const int32_t *const *)ids, len, n, scores) != OSP_OK) {
        rc = osp_cli_fail("rerank");
        goto done;
    }
    for (int i = 0; i < n; i++) order[i] = i;
    g_scores = scores;
    qsort(order, (size_t)n, sizeof *order, by_score);
    for (int i = 0; i < n; i++) printf("{\"index\": %d, \"relevance_score\": %.9g}\n", order[i], scores[order[i]]);
    rc = 0;
done:
    for (int i = 0; ids && i < n; i++) osp_free(ids[i]);
    free(ids), free(len), free(scores), free(order), free(docs);
    osp_rerank_free(r);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return rc;
}
