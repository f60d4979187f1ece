/* BERT and XLM-RoBERTa encoders (model/bert.c) and XLM-R's cross-encoder head (model/bert.h), issue 40.
 *
 * For each folder of data/bert (bert-tiny: BertModel, mean pooling, a WordPiece tokenizer; xlmr-tiny:
 * XLMRobertaModel, CLS pooling, a Unigram tokenizer; xlmr-reranker-tiny: XLMRobertaForSequenceClassification),
 * against golden.safetensors when present (transformers and sentence-transformers, make_golden.py, on the device)
 * and numpy_golden.safetensors (an f64 numpy forward, numpy_golden.py, independent of both):
 * - the tokenizer's ids of the folder's texts (or pairs) are the golden's input_ids_i;
 * - every input alone: last_hidden_state at every position;
 * - the inputs batched as rows padded on the right (the encoder attends to each row's own length only): the
 *   pooled, normalized embeddings, or the cross-encoder's scores;
 * all at 2e-5 · max(1, |ref|). A few ids are checked by hand (the numpy golden takes osprey's ids). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "golden_cmp.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/embed.h"
#include "model/safetensors.h"
#include "osprey.h"
#include "text/tokenizer.h"

#define N_IN 4
#define MAXH 128

/* the texts of make_golden.py, in its order; a reranker's are (query, document) pairs */
static const char *const EMBED_TEXTS[N_IN] = {"The cat sat on the mat.", "hi", "Ｈello, wörld! 中国 running ﬁ cats",
                                              "the the the the the the the the the the cat"};
static const char *const PAIRS[N_IN][2] = {{"what sat on the mat?", "The cat sat on the mat."},
                                           {"hi", "hello"},
                                           {"where is the cat", "running cats sat in the hall"},
                                           {"the", "the the the the the the the the"}};

/* ids checked by hand against the folders' vocabularies (tests/data/bert/make_tokenizers.py) */
static void test_ids_by_hand(void **state) {
    (void)state;
    static const struct {
        const char *dir, *text;
        int32_t n, ids[24];
    } CASES[] = {
        /* BertNormalizer: lowercase, accents stripped (ö -> o), CJK padded; "Ｈello" and "ﬁ" are one [UNK] each;
         * WordPiece: wo ##r ##ld, run ##ning, cat ##s */
        {"data/bert/bert-tiny", "Ｈello, wörld! 中国 running ﬁ cats", 15,
         {2, 1, 11, 16, 17, 18, 12, 22, 23, 19, 20, 1, 6, 21, 3}},
        {"data/bert/bert-tiny", "The cat sat on the mat.", 9, {2, 5, 6, 7, 8, 5, 9, 10, 3}},
        /* Precompiled: Ｈ -> H, ö -> o, ﬁ -> fi; Viterbi: ▁ H e llo , ▁w o r ld ! ▁ <unk: 中国 fused> ▁run ning ▁ f i
         * ▁cat s */
        {"data/bert/xlmr-tiny", "Ｈello, wörld! 中国 running ﬁ cats", 21,
         {0, 4, 60, 38, 17, 11, 24, 48, 51, 26, 12, 4, 3, 21, 22, 4, 39, 42, 6, 52, 2}},
        /* ▁T he (no ▁The), ▁cat (not ▁ca t) */
        {"data/bert/xlmr-tiny", "The cat sat on the mat.", 10, {0, 18, 19, 6, 7, 8, 5, 9, 10, 2}},
        /* the ideographic space -> " ", spaces squeezed, each ö its own cluster (the shorter key wins) */
        {"data/bert/xlmr-tiny", "\u00f6\u00f6x\u3000  hi", 7, {0, 4, 48, 48, 57, 14, 2}},
    };
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        osp_tokenizer *tok;
        assert_int_equal(osp_tokenizer_load(CASES[c].dir, &tok), OSP_OK);
        int32_t *ids;
        size_t n;
        assert_int_equal(osp_tokenizer_encode_alloc(tok, CASES[c].text, strlen(CASES[c].text), 1, &ids, &n), OSP_OK);
        assert_int_equal(n, CASES[c].n);
        assert_memory_equal(ids, CASES[c].ids, sizeof(int32_t) * n);
        osp_free(ids);
        osp_tokenizer_free(tok);
    }
    /* WordPiece's decoder: the prefix dropped, a space before other pieces, cleanup's " ." -> "." */
    osp_tokenizer *wp;
    assert_int_equal(osp_tokenizer_load("data/bert/bert-tiny", &wp), OSP_OK);
    static const int32_t cats[] = {2, 5, 6, 21, 10, 3};
    char *text;
    assert_int_equal(osp_tokenizer_decode(wp, cats, 6, OSP_DECODE_SKIP_SPECIAL, &text, NULL), OSP_OK);
    assert_string_equal(text, "the cats.");
    osp_free(text);
    osp_tokenizer_free(wp);
    /* Unigram's byte fallback: an unknown character is its bytes' <0xNN> pieces when they all exist, else unk */
    static const char *const UNI[2] = {
        "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\",\"prepend_scheme\":\"always\"},"
        "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":[[\"<unk>\",0],"
        "[\"\u2581\",-1],[\"a\",-1],[\"<0xC3>\",-5],[\"<0xA9>\",-5]]}}",
        "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\",\"prepend_scheme\":\"always\"},"
        "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":[[\"<unk>\",0],"
        "[\"\u2581\",-1],[\"a\",-1],[\"<0xC3>\",-5]]}}"};
    static const int32_t want[2][4] = {{1, 2, 3, 4}, {1, 2, 0, -1}};
    for (int k = 0; k < 2; k++) {
        osp_tokenizer *u;
        assert_int_equal(osp_tokenizer_load_json(UNI[k], strlen(UNI[k]), NULL, 0, "unigram", &u), OSP_OK);
        int32_t *ids;
        size_t n;
        assert_int_equal(osp_tokenizer_encode_alloc(u, "a\u00e9", 3, 0, &ids, &n), OSP_OK);
        assert_int_equal(n, k ? 3 : 4);
        assert_memory_equal(ids, want[k], sizeof(int32_t) * n);
        osp_free(ids);
        osp_tokenizer_free(u);
    }
    /* the cross-encoder's pair, and its truncation (longest first: the document, then both) */
    osp_tokenizer *tok;
    assert_int_equal(osp_tokenizer_load("data/bert/xlmr-reranker-tiny", &tok), OSP_OK);
    int32_t *ids, n;
    assert_int_equal(osp_bert_pair_ids(tok, "hi", "hello", 64, &ids, &n), OSP_OK);
    static const int32_t pair[] = {0, 14, 2, 2, 15, 2};
    assert_int_equal(n, 6);
    assert_memory_equal(ids, pair, sizeof pair);
    osp_free(ids);
    assert_int_equal(osp_bert_pair_ids(tok, "hi hi", "the the the the", 8, &ids, &n), OSP_OK);
    static const int32_t cut[] = {0, 14, 14, 2, 2, 5, 5, 2};
    assert_int_equal(n, 8);
    assert_memory_equal(ids, cut, sizeof cut);
    osp_free(ids);
    osp_tokenizer_free(tok);
}

/* ids of input i as the folder's tokenizer gives them (a pair as the cross-encoder encodes it) */
static void encode(const osp_tokenizer *tok, int pairs, int i, int32_t **ids, int32_t *n) {
    if (pairs) {
        assert_int_equal(osp_bert_pair_ids(tok, PAIRS[i][0], PAIRS[i][1], 64, ids, n), OSP_OK);
        return;
    }
    size_t k;
    assert_int_equal(osp_tokenizer_encode_alloc(tok, EMBED_TEXTS[i], strlen(EMBED_TEXTS[i]), 1, ids, &k), OSP_OK);
    *n = (int32_t)k;
}

static const float *tensor(const osp_st *g, const char *fmt, int i, int64_t numel) {
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    const osp_st_tensor *t = osp_st_find(g, name);
    assert_non_null(t);
    assert_int_equal(t->numel, numel);
    return t->data;
}

/* returns 0 when the golden file is absent */
static int check(const char *dir, const char *golden, int pairs) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, golden);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    fclose(f);
    osp_st *g;
    osp_model *m;
    osp_tokenizer *tok;
    assert_int_equal(osp_st_open_file(p, &g), OSP_OK);
    assert_int_equal(osp_model_load(dir, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(dir, &tok), OSP_OK);
    const int64_t H = osp_model_get_info(m)->hidden;
    assert_true(H <= MAXH);
    int32_t *ids[N_IN], len[N_IN];
    for (int i = 0; i < N_IN; i++) {
        encode(tok, pairs, i, &ids[i], &len[i]);
        const float *r = tensor(g, "input_ids_%d", i, len[i]);
        assert_memory_equal(r, ids[i], sizeof(int32_t) * (size_t)len[i]);
        /* alone: every position */
        osp_session *s;
        assert_int_equal(osp_embed_session_new(m, 1, len[i], &s), OSP_OK);
        float *h = malloc(sizeof(float) * (size_t)(len[i] * H));
        int32_t row = 0;
        assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids[i], len[i], NULL, h), OSP_OK);
        r = tensor(g, "hidden_%d", i, len[i] * H);
        double worst = 0;
        worst = golden_worst_rel(h, r, len[i] * H);
        printf("%s %s input %d (%d tokens): hidden states, max |diff| / max(1, |ref|) %.3g\n", dir, golden, i,
               len[i], worst);
        assert_true(worst <= 2e-5);
        free(h);
        osp_session_free(s);
    }
    /* batched: three rows at a time, padded on the right to the longest */
    osp_session *s;
    assert_int_equal(osp_embed_session_new(m, 3, 64, &s), OSP_OK);
    double worst = 0;
    if (pairs) {
        float sc[N_IN];
        assert_int_equal(osp_bert_pair_scores(s, (const int32_t *const *)ids, len, N_IN, sc), OSP_OK);
        const float *r = tensor(g, "score", 0, N_IN);
        worst = golden_worst_rel(sc, r, N_IN);
        printf("%s %s: scores %.6f %.6f %.6f %.6f, max |diff| %.3g\n", dir, golden, sc[0], sc[1], sc[2], sc[3], worst);
    } else {
        osp_embed_config c;
        float out[N_IN * MAXH];
        assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
        assert_int_equal(osp_embed_run(s, &c, (const int32_t *const *)ids, len, N_IN, out), OSP_OK);
        const float *r = tensor(g, "embedding", 0, N_IN * H);
        const osp_st_tensor *st = osp_st_find(g, "st_embedding"); /* sentence-transformers' own, when made */
        for (int i = 0; i < N_IN; i++) {
            osp_embed_finish(&c, out + i * H, (int32_t)H);
            worst = fmax(worst, golden_worst_rel(out + i * H, r + i * H, H));
            if (st) worst = fmax(worst, golden_worst_rel(out + i * H, (const float *)st->data + i * H, H));
        }
        printf("%s %s: embeddings (%s pooling), max |diff| %.3g\n", dir, golden, osp_pooling_name(c.pooling), worst);
    }
    assert_true(worst <= 2e-5);
    osp_session_free(s);
    for (int i = 0; i < N_IN; i++) osp_free(ids[i]);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    osp_st_close(g);
    return 1;
}

static void check_folder(const char *dir, int pairs) {
    check(dir, "golden.safetensors", pairs); /* transformers (make_golden.py, on the device) */
    assert_true(check(dir, "numpy_golden.safetensors", pairs)); /* always there */
}

static void test_bert(void **state) {
    (void)state;
    check_folder("data/bert/bert-tiny", 0);
}

static void test_xlmr(void **state) {
    (void)state;
    check_folder("data/bert/xlmr-tiny", 0);
}

static void test_reranker(void **state) {
    (void)state;
    check_folder("data/bert/xlmr-reranker-tiny", 1);
}

/* an encoder gives no logits, and an input longer than its positions is refused */
static void test_refusals(void **state) {
    (void)state;
    osp_model *m;
    osp_session *s;
    assert_int_equal(osp_model_load("data/bert/xlmr-tiny", &m), OSP_OK);
    assert_int_equal(osp_model_get_info(m)->has_head, 0);
    assert_int_equal(osp_model_get_info(m)->max_ctx, 64); /* 66 positions from padding_idx 1 + 1 */
    assert_int_equal(osp_session_new(m, 1, 0, &s), OSP_OK);
    int32_t ids[65] = {0}, row = 0;
    float logits[64];
    assert_int_not_equal(osp_forward_rows(s, &row, 1, ids, 3, 0, logits), OSP_OK);
    float *h = malloc(sizeof(float) * 65 * MAXH);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, 65, NULL, h), OSP_ERR_RANGE);
    free(h);
    float sc;
    const int32_t *pi[1] = {ids};
    int32_t pl[1] = {3};
    assert_int_equal(osp_bert_pair_scores(s, pi, pl, 1, &sc), OSP_ERR_UNSUPPORTED); /* no classifier */
    osp_session_free(s);
    osp_model_free(m);
    /* an encoder without sentence-transformers files has no pooling to guess */
    osp_embed_config c;
    assert_int_equal(osp_model_load("data/bert/xlmr-reranker-tiny", &m), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "modules.json"));
    osp_model_free(m);
}

/* configs an encoder refuses, each naming what it does not run */
static void test_config_refusals(void **state) {
    (void)state;
    static const struct {
        const char *extra, *needle;
        osp_status want;
    } CASES[] = {
        {"\"hidden_act\": \"relu\"", "hidden_act 'relu'", OSP_ERR_UNSUPPORTED},
        {"\"position_embedding_type\": \"relative_key\"", "relative_key", OSP_ERR_UNSUPPORTED},
        {"\"is_decoder\": true", "is_decoder", OSP_ERR_UNSUPPORTED},
        {"\"num_attention_heads\": 5", "heads x head size", OSP_ERR_UNSUPPORTED},
        {"\"pad_token_id\": 64", "pad_token_id 64", OSP_ERR_FORMAT},
        {"\"architectures\": [\"XLMRobertaForSequenceClassification\"], \"id2label\": {\"0\": \"a\", \"1\": \"b\"}",
         "2 labels", OSP_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"XLMRobertaModel\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 64,"
                 " \"max_position_embeddings\": 66, %s}",
                 CASES[i].extra);
        json_t *root = json_loads(text, 0, NULL); /* a repeated key: the last wins */
        assert_non_null(root);
        osp_config c;
        osp_status st = osp_config_parse(root, "config.json", &c);
        osp_config_free(&c);
        json_decref(root);
        if (st != CASES[i].want || !strstr(osp_last_error(), CASES[i].needle))
            fail_msg("%s: status %d, '%s'", CASES[i].extra, st, osp_last_error());
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ids_by_hand), cmocka_unit_test(test_bert), cmocka_unit_test(test_xlmr),
                                       cmocka_unit_test(test_reranker), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_config_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
