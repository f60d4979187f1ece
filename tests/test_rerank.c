/* Reranking (model/rerank.h, issue 40).
 *
 * - data/rerank/qwen3-reranker-tiny's goldens, whichever are present:
 *   golden.safetensors (transformers, the model card's code: make_golden.py
 *   on the device) and numpy_golden.safetensors (an f64 numpy forward,
 *   numpy_golden.py): each pair of pairs.json's token ids exactly, its last
 *   position's final normed state and its score at 2e-5 · max(1, |ref|),
 *   the pairs batched as rows and one at a time;
 * - a model that is not a reranker (no head; no yes/no tokens) is refused
 *   saying what is looked for; a pair over the context is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "golden_cmp.h"
#include "model/embed.h"
#include "model/rerank.h"
#include "model/safetensors.h"
#include "osprey.h"
#include "text/tokenizer.h"

#define TINY "data/rerank/qwen3-reranker-tiny"
#define MAXP 16

typedef struct pairs {
    int n;
    int32_t *ids[MAXP], len[MAXP];
} pairs;

static void pairs_tokens(const osp_reranker *r, pairs *p) {
    json_error_t je;
    json_t *j = json_load_file("data/rerank/pairs.json", 0, &je);
    assert_non_null(j);
    p->n = (int)json_array_size(j);
    assert_true(p->n > 0 && p->n <= MAXP);
    for (int i = 0; i < p->n; i++) {
        json_t *e = json_array_get(j, (size_t)i);
        const char *q = json_string_value(json_object_get(e, "query")), *d = json_string_value(json_object_get(e, "document"));
        const char *ins = json_string_value(json_object_get(e, "instruction"));
        assert_int_equal(osp_rerank_tokens(r, ins, q, strlen(q), d, strlen(d), &p->ids[i], &p->len[i]), OSP_OK);
    }
    json_decref(j);
}

static void check_golden(const char *file) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", TINY, file);
    osp_st *g;
    if (osp_st_open_file(path, &g) != OSP_OK) {
        printf("no %s yet (make_golden.py): skipped\n", path);
        return;
    }
    osp_model *m;
    osp_tokenizer *tok;
    osp_reranker *r, *r1;
    assert_int_equal(osp_model_load(TINY, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(TINY, &tok), OSP_OK);
    assert_int_equal(osp_rerank_open(m, tok, 3, 512, &r), OSP_OK);
    assert_int_equal(osp_rerank_open(m, tok, 1, 512, &r1), OSP_OK);
    assert_string_equal(osp_rerank_kind_name(r), "qwen3-reranker");
    pairs p;
    pairs_tokens(r, &p);
    const int64_t H = osp_model_get_info(m)->hidden;
    /* the ids, and each last position's state (the embedder's last-token state) */
    osp_session *s;
    osp_status st = osp_embed_session_new(m, 2, 512, &s);
    if (st != OSP_OK) printf("%s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    osp_embed_config last = {.pooling = OSP_POOLING_LAST, .hidden = (int32_t)H, .dims = (int32_t)H};
    float *h = malloc(sizeof(float) * (size_t)(p.n * H));
    assert_int_equal(osp_embed_run(s, &last, (const int32_t *const *)p.ids, p.len, p.n, h), OSP_OK);
    double worst = 0;
    for (int i = 0; i < p.n; i++) {
        const osp_st_tensor *t = golden_find_i(g, "input_ids_%d", i);
        assert_non_null(t);
        assert_int_equal(t->numel, p.len[i]);
        assert_memory_equal(t->data, p.ids[i], t->nbytes);
        t = golden_find_i(g, "hidden_last_%d", i);
        assert_non_null(t);
        assert_int_equal(t->numel, H);
        worst = fmax(worst, golden_worst_rel(h + i * H, t->data, H));
    }
    printf("%s: last states, max |diff| / max(1, |ref|) %.3g\n", file, worst);
    assert_true(worst <= 2e-5);
    /* the scores, batched (3 rows for 5 pairs: a full group and a short one) and alone */
    const osp_st_tensor *ts = osp_st_find(g, "score");
    assert_non_null(ts);
    assert_int_equal(ts->numel, p.n);
    float sb[MAXP], s1[MAXP];
    assert_int_equal(osp_rerank_score(r, (const int32_t *const *)p.ids, p.len, p.n, sb), OSP_OK);
    for (int i = 0; i < p.n; i++)
        assert_int_equal(osp_rerank_score(r1, (const int32_t *const *)&p.ids[i], &p.len[i], 1, &s1[i]), OSP_OK);
    worst = 0;
    for (int i = 0; i < p.n; i++) {
        float ref = ((const float *)ts->data)[i];
        worst = fmax(worst, fmax(golden_rel(sb[i], ref), golden_rel(s1[i], ref)));
        printf("  pair %d: %.9g (alone %.9g), reference %.9g\n", i, sb[i], s1[i], ref);
    }
    printf("%s: scores, max |diff| %.3g\n", file, worst);
    assert_true(worst <= 2e-5);
    for (int i = 0; i < p.n; i++) osp_free(p.ids[i]);
    free(h);
    osp_session_free(s);
    osp_rerank_free(r1);
    osp_rerank_free(r);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    osp_st_close(g);
}

/* the cross-encoder kind (model/bert.c's pair and logit): the sigmoid of test_bert's reference logits, batched; no
 * instruction */
static void test_cross_encoder(void **state) {
    (void)state;
    static const char *const PAIRS[4][2] = {{"what sat on the mat?", "The cat sat on the mat."},
                                            {"hi", "hello"},
                                            {"where is the cat", "running cats sat in the hall"},
                                            {"the", "the the the the the the the the"}};
    const char *dir = "data/bert/xlmr-reranker-tiny";
    osp_model *m;
    osp_tokenizer *tok;
    osp_reranker *r;
    osp_st *g;
    assert_int_equal(osp_model_load(dir, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(dir, &tok), OSP_OK);
    assert_int_equal(osp_st_open_file("data/bert/xlmr-reranker-tiny/numpy_golden.safetensors", &g), OSP_OK);
    assert_int_equal(osp_rerank_open(m, tok, 3, 0, &r), OSP_OK);
    assert_string_equal(osp_rerank_kind_name(r), "xlmr-cross-encoder");
    assert_int_equal(osp_rerank_takes_instruction(r), 0);
    int32_t *ids[4], len[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(osp_rerank_tokens(r, NULL, PAIRS[i][0], strlen(PAIRS[i][0]), PAIRS[i][1], strlen(PAIRS[i][1]),
                                           &ids[i], &len[i]), OSP_OK);
    int32_t *x, nx;
    assert_int_equal(osp_rerank_tokens(r, "a task", "q", 1, "d", 1, &x, &nx), OSP_ERR_INVALID);
    float sc[4];
    assert_int_equal(osp_rerank_score(r, (const int32_t *const *)ids, len, 4, sc), OSP_OK);
    const osp_st_tensor *t = osp_st_find(g, "score");
    assert_non_null(t);
    assert_int_equal(t->numel, 4);
    double worst = 0;
    for (int i = 0; i < 4; i++) {
        double ref = 1 / (1 + exp(-(double)((const float *)t->data)[i]));
        worst = fmax(worst, golden_rel(sc[i], ref));
        osp_free(ids[i]);
    }
    printf("xlmr-reranker-tiny: sigmoid scores, max |diff| %.3g\n", worst);
    assert_true(worst <= 2e-5);
    osp_st_close(g);
    osp_rerank_free(r);
    osp_tokenizer_free(tok);
    osp_model_free(m);
}

static void test_goldens(void **state) {
    (void)state;
    check_golden("golden.safetensors");       /* transformers (make_golden.py, on the device) */
    check_golden("numpy_golden.safetensors"); /* an f64 numpy forward (numpy_golden.py) */
}

/* a headless embedder is not a reranker; neither is a model whose tokenizer has no yes/no tokens */
static void test_refused(void **state) {
    (void)state;
    const char *dirs[] = {"data/embed/qwen3-embedding-tiny"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        osp_model *m;
        osp_tokenizer *tok;
        osp_reranker *r = (osp_reranker *)1;
        assert_int_equal(osp_model_load(dirs[i], &m), OSP_OK);
        assert_int_equal(osp_tokenizer_load(dirs[i], &tok), OSP_OK);
        assert_int_equal(osp_rerank_open(m, tok, 2, 64, &r), OSP_ERR_UNSUPPORTED);
        assert_null(r);
        assert_non_null(strstr(osp_last_error(), "not a reranker"));
        assert_non_null(strstr(osp_last_error(), "lm_head"));
        osp_tokenizer_free(tok);
        osp_model_free(m);
    }
}

/* over the context: refused, nothing run */
static void test_context(void **state) {
    (void)state;
    osp_model *m;
    osp_tokenizer *tok;
    osp_reranker *r;
    assert_int_equal(osp_model_load(TINY, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(TINY, &tok), OSP_OK);
    assert_int_equal(osp_rerank_open(m, tok, 2, 64, &r), OSP_OK);
    assert_int_equal(osp_rerank_ctx(r), 64);
    int32_t *ids, n;
    assert_int_equal(osp_rerank_tokens(r, NULL, "q", 1, "d", 1, &ids, &n), OSP_OK);
    assert_true(n > 64); /* the prompt alone is longer */
    float sc = -1;
    assert_int_equal(osp_rerank_score(r, (const int32_t *const *)&ids, &n, 1, &sc), OSP_ERR_RANGE);
    assert_true(sc == -1);
    assert_non_null(strstr(osp_last_error(), "context"));
    osp_free(ids);
    osp_rerank_free(r);
    osp_tokenizer_free(tok);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_goldens), cmocka_unit_test(test_cross_encoder),
                                       cmocka_unit_test(test_refused), cmocka_unit_test(test_context)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
