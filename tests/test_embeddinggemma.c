/* EmbeddingGemma (issue 40): Gemma 3 with bidirectional attention (model/
 * llama.c, backend op bidir_attention), mean pooling, 2_Dense and 3_Dense
 * (model/embed.c).
 *
 * - data/embeddinggemma/embeddinggemma-tiny's goldens, whichever are
 *   present: golden.safetensors (transformers and sentence-transformers:
 *   make_golden.py on the device) and numpy_golden.safetensors (an f64
 *   numpy forward, numpy_golden.py): the tokenizer's ids exactly, every
 *   position's hidden state, the embeddings and Matryoshka widths at
 *   2e-5 · max(1, |ref|), the inputs batched as padded rows (each row sees
 *   only its own positions) and one at a time; the window of 8 (radius 5)
 *   is outgrown by most inputs;
 * - what a bidirectional model refuses (an input longer than a session's
 *   step: it runs whole), and that a call carries nothing to the next
 *   (it runs as an encoder: no cache). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/embed.h"
#include "golden_cmp.h"
#include "model/safetensors.h"
#include "osprey.h"
#include "text/tokenizer.h"

#define TINY "data/embeddinggemma/embeddinggemma-tiny"
enum { N = 6 };
static const char *TEXTS[N] = {"the cat sat on the mat", "hi", "in the winter there was snow", "x",
                               "theretheretherethere in in in",
                               "in the winter there was snow and the cat sat by the fire on the mat, then there was "
                               "more snow"};

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
    osp_embed_config c;
    assert_int_equal(osp_model_load(TINY, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(TINY, &tok), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    assert_true(c.pooling == OSP_POOLING_MEAN && c.normalize && c.n_dense == 2 && c.matryoshka);
    const int64_t H = c.hidden;
    assert_int_equal(c.dims, H);
    int32_t *ids[N], len[N];
    double worst = 0;
    for (int i = 0; i < N; i++) {
        size_t k;
        assert_int_equal(osp_tokenizer_encode_alloc(tok, TEXTS[i], strlen(TEXTS[i]), 1, &ids[i], &k), OSP_OK);
        len[i] = (int32_t)k;
        const osp_st_tensor *t = golden_find_i(g, "input_ids_%d", i);
        assert_non_null(t);
        assert_int_equal(t->numel, len[i]);
        assert_memory_equal(t->data, ids[i], t->nbytes);
        t = golden_find_i(g, "hidden_%d", i);
        assert_non_null(t);
        assert_int_equal(t->numel, len[i] * H);
        osp_session *s;
        assert_int_equal(osp_embed_session_new(m, 1, 128, &s), OSP_OK);
        float *h = malloc(sizeof(float) * (size_t)(len[i] * H));
        int32_t row = 0;
        assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids[i], len[i], NULL, h), OSP_OK);
        worst = fmax(worst, golden_worst_rel(h, t->data, len[i] * H));
        free(h);
        osp_session_free(s);
    }
    printf("%s: hidden states, max |diff| / max(1, |ref|) %.3g\n", file, worst);
    assert_true(worst <= 2e-5);
    /* batched (3 rows, padded to each group's longest) and alone */
    const char *keys[] = {"embedding", "st_embedding", "mrl_16", "mrl_32"};
    int32_t widths[] = {(int32_t)H, (int32_t)H, 16, 32};
    for (int rows = 1; rows <= 3; rows += 2) {
        osp_session *s;
        assert_int_equal(osp_embed_session_new(m, rows, 128, &s), OSP_OK);
        for (int k = 0; k < 4; k++) {
            const osp_st_tensor *t = osp_st_find(g, keys[k]);
            if (!t) continue; /* st_embedding: sentence-transformers was not installed */
            float out[N * 64];
            assert_true(H <= 64);
            assert_int_equal(osp_embed_run(s, &c, (const int32_t *const *)ids, len, N, out), OSP_OK);
            worst = 0;
            for (int i = 0; i < N; i++) {
                osp_embed_finish(&c, out + i * H, widths[k]);
                worst = fmax(worst, golden_worst_rel(out + i * H, (const float *)t->data + i * widths[k], widths[k]));
            }
            printf("%s, %d rows: %s max |diff| %.3g\n", file, rows, keys[k], worst);
            assert_true(worst <= 2e-5);
        }
        osp_session_free(s);
    }
    for (int i = 0; i < N; i++) osp_free(ids[i]);
    osp_embed_config_free(&c);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    osp_st_close(g);
}

static void test_goldens(void **state) {
    (void)state;
    check_golden("golden.safetensors");       /* transformers + sentence-transformers (make_golden.py) */
    check_golden("numpy_golden.safetensors"); /* an f64 numpy forward (numpy_golden.py) */
}

static void test_refused(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(TINY, &m), OSP_OK);
    assert_int_equal(osp_model_get_info(m)->has_head, 0);
    int32_t ids[40], row = 0;
    for (int i = 0; i < 40; i++) ids[i] = 100 + i;
    float h[40 * 64];
    /* a session whose step holds fewer tokens than the input: it would run in chunks */
    osp_session_opts o = {.n_rows = 1, .max_ctx = 64, .max_tokens = 16};
    osp_session *s;
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, 40, NULL, h), OSP_ERR_RANGE);
    assert_non_null(strstr(osp_last_error(), "whole"));
    /* the same call twice: the same states (no cache, no position carried) */
    float h2[8 * 64];
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, 8, NULL, h), OSP_OK);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, 8, NULL, h2), OSP_OK);
    assert_memory_equal(h, h2, sizeof h2);
    osp_session_free(s);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_goldens), cmocka_unit_test(test_refused)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
