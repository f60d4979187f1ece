/* Embeddings (model/embed.h, issue 40).
 *
 * The reference here is the golden-verified Qwen3 body: tests/data/goldens/
 * qwen3's weights written twice into a temporary folder,
 * - as an embedder: the bare model's names (no "model.", no lm_head), as
 *   Qwen3-Embedding is saved;
 * - as a causal LM with an untied lm_head = [I_hidden; 0]: its logits'
 *   first `hidden` values are the final normed hidden state, exactly (each a
 *   sum of one product by 1 and products by 0).
 * - The embedder loads without a head, refuses logits, and its hidden
 *   states (osp_forward_rows_hidden, every position and chosen ones) are the
 *   reference's logits' first columns.
 * - osp_embed_run (last token, normalized) of inputs of several lengths,
 *   batched as padded rows and one at a time, is the normalized reference
 *   state at each input's last position.
 * - Pooling, normalization, Matryoshka truncation and the allowed widths;
 *   the sentence-transformers files; base64; the tokenizer keeps its post-
 *   processor's <|endoftext|> under Qwen3-Embedding's tokenizer_config.
 * - data/embed/qwen3-embedding-tiny/golden.safetensors, when present (made
 *   by data/embed/make_golden.py with transformers on the device), and
 *   numpy_golden.safetensors (an f64 numpy forward, numpy_golden.py): the
 *   tokenizer's ids, hidden states, embeddings and Matryoshka widths at
 *   2e-5 · max(1, |ref|). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/base64.h"
#include "golden_cmp.h"
#include "model/embed.h"
#include "model/safetensors.h"
#include "model/st_write.h"
#include "osprey.h"
#include "text/tokenizer.h"

#define GOLD "data/goldens/qwen3"
static char g_emb[256], g_ref[256];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* the embedder (bare names) and the reference (model. names + identity head) folders */
static int make_folders(void **state) {
    (void)state;
    snprintf(g_emb, sizeof g_emb, "/tmp/osp_test_embed_%d_emb", (int)getpid());
    snprintf(g_ref, sizeof g_ref, "/tmp/osp_test_embed_%d_ref", (int)getpid());
    mkdir(g_emb, 0755), mkdir(g_ref, 0755);
    osp_st *st;
    if (osp_st_open_file(GOLD "/model.safetensors", &st) != OSP_OK) return -1;
    osp_st_writer *we = osp_st_writer_new(), *wr = osp_st_writer_new();
    int64_t V = 512, H = 64;
    uint16_t *head = calloc((size_t)(V * H), sizeof *head);
    for (int64_t i = 0; i < H; i++) head[i * H + i] = 0x3f80; /* bf16 1.0 */
    for (int i = 0; i < st->n_tensors; i++) {
        const osp_st_tensor *t = &st->tensors[i];
        const char *bare = strncmp(t->name, "model.", 6) ? t->name : t->name + 6;
        if (osp_st_writer_add(we, bare, t->dtype, t->ndim, t->shape, t->data, t->nbytes) != OSP_OK ||
            osp_st_writer_add(wr, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) != OSP_OK)
            return -1;
    }
    int64_t hs[2] = {V, H};
    char p[512];
    if (osp_st_writer_add(wr, "lm_head.weight", OSP_DT_BF16, 2, hs, head, sizeof *head * (size_t)(V * H)) != OSP_OK)
        return -1;
    snprintf(p, sizeof p, "%s/model.safetensors", g_emb);
    if (osp_st_writer_write(we, p, NULL, NULL) != OSP_OK) return -1;
    snprintf(p, sizeof p, "%s/model.safetensors", g_ref);
    if (osp_st_writer_write(wr, p, NULL, NULL) != OSP_OK) return -1;
    osp_st_writer_free(we), osp_st_writer_free(wr), osp_st_close(st), free(head);
    json_t *cfg = json_load_file(GOLD "/config.json", 0, NULL);
    if (!cfg) return -1;
    snprintf(p, sizeof p, "%s/config.json", g_emb);
    json_dump_file(cfg, p, 0);
    json_object_set_new(cfg, "tie_word_embeddings", json_false());
    snprintf(p, sizeof p, "%s/config.json", g_ref);
    json_dump_file(cfg, p, 0);
    json_decref(cfg);
    return 0;
}

static int remove_folders(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", g_emb, g_ref);
    return system(cmd) == 0 ? 0 : -1;
}

/* the golden's input_ids [40] */
static int32_t *golden_ids(int32_t *T) {
    osp_st *st;
    assert_int_equal(osp_st_open_file(GOLD "/golden.safetensors", &st), OSP_OK);
    const osp_st_tensor *t = osp_st_find(st, "input_ids");
    assert_non_null(t);
    *T = (int32_t)t->numel;
    int32_t *ids = malloc(t->nbytes);
    memcpy(ids, t->data, t->nbytes);
    osp_st_close(st);
    return ids;
}

/* the reference's final normed hidden states [T, H]: its logits' first H columns */
static float *ref_hidden(const int32_t *ids, int32_t T, int64_t H) {
    osp_model *m;
    osp_session *s;
    assert_int_equal(osp_model_load(g_ref, &m), OSP_OK);
    int32_t V = osp_model_get_info(m)->vocab;
    assert_int_equal(osp_session_new(m, 1, T, &s), OSP_OK);
    float *logits = malloc(sizeof(float) * (size_t)T * V), *h = malloc(sizeof(float) * (size_t)(T * H));
    assert_int_equal(osp_forward(s, ids, T, 1, logits), OSP_OK);
    for (int32_t t = 0; t < T; t++) memcpy(h + t * H, logits + (int64_t)t * V, sizeof(float) * (size_t)H);
    free(logits);
    osp_session_free(s);
    osp_model_free(m);
    return h;
}

static void test_no_head(void **state) {
    (void)state;
    osp_model *m;
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    assert_int_equal(osp_model_get_info(m)->has_head, 0);
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, 8, &s), OSP_OK);
    int32_t ids[2] = {1, 2};
    float logits[2 * 512];
    assert_int_equal(osp_forward(s, ids, 2, 0, logits), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "embedding model"));
    osp_session_free(s);
    osp_model_free(m);
    osp_model *r;
    assert_int_equal(osp_model_load(g_ref, &r), OSP_OK);
    assert_int_equal(osp_model_get_info(r)->has_head, 1);
    osp_model_free(r);
}

static void test_hidden_is_reference(void **state) {
    (void)state;
    int32_t T;
    int32_t *ids = golden_ids(&T);
    const int64_t H = 64;
    float *ref = ref_hidden(ids, T, H);
    osp_model *m;
    osp_session *s;
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    float *h = malloc(sizeof(float) * (size_t)(T * H));
    int32_t row = 0;
    /* the reference's own chunking (one chunk): the same bits */
    assert_int_equal(osp_session_new(m, 1, T, &s), OSP_OK);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, T, NULL, h), OSP_OK);
    double d = golden_max_diff(h, ref, T * H);
    printf("hidden states vs the reference's identity head: max |diff| %.3g\n", d);
    assert_true(d == 0);
    osp_session_free(s);
    /* a small step, so the call is chunked: every chunk's states are read (matmuls of other sizes: rounding) */
    osp_session_opts o = {.n_rows = 2, .max_ctx = T, .max_tokens = 16};
    assert_int_equal(osp_session_new_opts(m, &o, &s), OSP_OK);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, T, NULL, h), OSP_OK);
    d = golden_max_diff(h, ref, T * H);
    printf("chunked by 16: max |diff| %.3g\n", d);
    assert_true(d <= 1e-5);
    /* chosen positions, two rows of one call */
    osp_session_reset_row(s, 0);
    int32_t rows[2] = {0, 1}, pos[2] = {T - 1, 3}, *two = malloc(sizeof(int32_t) * 2 * (size_t)T);
    memcpy(two, ids, sizeof(int32_t) * (size_t)T), memcpy(two + T, ids, sizeof(int32_t) * (size_t)T);
    float hp[2 * 64];
    assert_int_equal(osp_forward_rows_hidden(s, rows, 2, two, T, pos, hp), OSP_OK);
    printf("chosen positions: max |diff| %.3g, %.3g\n", golden_max_diff(hp, ref + (T - 1) * H, H),
           golden_max_diff(hp + H, ref + 3 * H, H));
    assert_true(golden_max_diff(hp, ref + (T - 1) * H, H) <= 1e-5 && golden_max_diff(hp + H, ref + 3 * H, H) <= 1e-5);
    pos[1] = T;
    assert_int_equal(osp_forward_rows_hidden(s, rows, 2, two, T, pos, hp), OSP_ERR_RANGE);
    free(two), free(h), free(ref), free(ids);
    osp_session_free(s);
    osp_model_free(m);
}

static void test_embed_run(void **state) {
    (void)state;
    int32_t T;
    int32_t *ids = golden_ids(&T);
    const int64_t H = 64;
    float *ref = ref_hidden(ids, T, H); /* causal: a prefix's states are the whole sequence's first ones */
    osp_model *m;
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    osp_embed_config c;
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK); /* no modules.json: the default */
    assert_int_equal(c.pooling, OSP_POOLING_LAST);
    assert_true(c.normalize && c.matryoshka && c.dims == H);
    enum { N = 5 };
    int32_t len[N] = {T, 17, 5, 1, 29};
    const int32_t *in[N] = {ids, ids, ids, ids, ids};
    float out1[N * 64], outb[N * 64];
    for (int rows = 1; rows <= 3; rows += 2) { /* one at a time; three at a time (padded rows, then two) */
        osp_session *s;
        assert_int_equal(osp_embed_session_new(m, rows, T, &s), OSP_OK);
        assert_int_equal(osp_embed_run(s, &c, in, len, N, rows == 1 ? out1 : outb), OSP_OK);
        for (int32_t r = 0; r < rows; r++) assert_int_equal(osp_session_row_pos(s, r), 0);
        osp_session_free(s);
    }
    for (int i = 0; i < N; i++) {
        float want[64];
        memcpy(want, ref + (len[i] - 1) * H, sizeof want);
        osp_embed_finish(&c, want, (int32_t)H);
        osp_embed_finish(&c, out1 + i * H, (int32_t)H);
        osp_embed_finish(&c, outb + i * H, (int32_t)H);
        double d1 = golden_max_diff(out1 + i * H, want, H), db = golden_max_diff(outb + i * H, want, H);
        printf("input of %d tokens: alone %.3g, batched %.3g from the normalized reference\n", len[i], d1, db);
        assert_true(d1 <= 1e-5 && db <= 1e-5);
    }
    /* too long for the session */
    osp_session *s;
    assert_int_equal(osp_embed_session_new(m, 2, 8, &s), OSP_OK);
    assert_int_equal(osp_embed_run(s, &c, in, len, 2, outb), OSP_ERR_RANGE);
    osp_session_free(s);
    osp_model_free(m);
    free(ref), free(ids);
}

static void test_pool_finish(void **state) {
    (void)state;
    float h[3 * 2] = {1, 2, 3, 4, 5, 12}, v[2];
    osp_embed_pool(OSP_POOLING_MEAN, h, 3, 2, v);
    assert_float_equal(v[0], 3, 0), assert_float_equal(v[1], 6, 0);
    osp_embed_pool(OSP_POOLING_LAST, h + 4, 1, 2, v);
    assert_float_equal(v[0], 5, 0), assert_float_equal(v[1], 12, 0);
    osp_embed_config c = {.normalize = 1, .dims = 3, .matryoshka = 1};
    float x[3] = {3, 4, 12};
    osp_embed_finish(&c, x, 3);
    assert_float_equal(x[0], 3 / 13.0, 1e-7), assert_float_equal(x[2], 12 / 13.0, 1e-7);
    float y[3] = {3, 4, 12};
    osp_embed_finish(&c, y, 2); /* Matryoshka: the first 2, renormalized */
    assert_float_equal(y[0], 0.6, 1e-7), assert_float_equal(y[1], 0.8, 1e-7);
    c.normalize = 0;
    float z[3] = {3, 4, 12};
    osp_embed_finish(&c, z, 3); /* unnormalized model, full width: untouched */
    assert_float_equal(z[0], 3, 0);
    osp_embed_finish(&c, z, 2); /* a Matryoshka width is renormalized anyway */
    assert_float_equal(z[1], 0.8, 1e-7);
    float zero[2] = {0, 0};
    c.normalize = 1;
    osp_embed_finish(&c, zero, 2); /* no NaN from a zero vector */
    assert_float_equal(zero[0], 0, 0);
}

static void test_dims(void **state) {
    (void)state;
    osp_embed_config c = {.dims = 64, .matryoshka = 1};
    assert_int_equal(osp_embed_check_dims(&c, 64), OSP_OK);
    assert_int_equal(osp_embed_check_dims(&c, 32), OSP_OK);
    assert_int_equal(osp_embed_check_dims(&c, 0), OSP_ERR_INVALID);
    assert_int_equal(osp_embed_check_dims(&c, 65), OSP_ERR_INVALID);
    c.mrl_dims[0] = 16, c.mrl_dims[1] = 32, c.n_mrl_dims = 2;
    assert_int_equal(osp_embed_check_dims(&c, 16), OSP_OK);
    assert_int_equal(osp_embed_check_dims(&c, 20), OSP_ERR_INVALID);
    assert_non_null(strstr(osp_last_error(), "16, 32"));
    c.matryoshka = 0;
    assert_int_equal(osp_embed_check_dims(&c, 32), OSP_ERR_INVALID);
    assert_int_equal(osp_embed_check_dims(&c, 64), OSP_OK);
}

/* the folder's sentence-transformers files, and config.json's Matryoshka keys */
/* a Dense module (2_Dense: config.json, model.safetensors) after cls pooling: tanh(W h + b), 64 -> 8 */
static void dense_module(osp_model *m, osp_embed_config *c) {
    char p[600];
    snprintf(p, sizeof p, "%s/2_Dense", g_emb);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/2_Dense/config.json", g_emb);
    write_text(p, "{\"in_features\": 64, \"out_features\": 8, \"bias\": true, \"activation_function\": "
                  "\"torch.nn.modules.activation.Tanh\"}");
    float w[8 * 64], b[8];
    for (int i = 0; i < 8 * 64; i++) w[i] = (float)((i * 37) % 11 - 5) * 0.05f;
    for (int i = 0; i < 8; i++) b[i] = 0.1f * (float)i - 0.3f;
    osp_st_writer *sw = osp_st_writer_new();
    int64_t ws[2] = {8, 64}, bs[1] = {8};
    assert_int_equal(osp_st_writer_add(sw, "linear.weight", OSP_DT_F32, 2, ws, w, sizeof w), OSP_OK);
    assert_int_equal(osp_st_writer_add(sw, "linear.bias", OSP_DT_F32, 1, bs, b, sizeof b), OSP_OK);
    snprintf(p, sizeof p, "%s/2_Dense/model.safetensors", g_emb);
    assert_int_equal(osp_st_writer_write(sw, p, NULL, NULL), OSP_OK);
    osp_st_writer_free(sw);
    assert_int_equal(osp_embed_config_load(m, c), OSP_OK);
    assert_true(c->n_dense == 1 && c->dims == 8 && c->hidden == 64 && c->pooling == OSP_POOLING_CLS);
    /* osp_embed_run's vector: the state at position 0 through the module, as computed here in double */
    int32_t ids[5] = {3, 30, 300, 7, 9}, len = 5, row = 0, pos = 0, *pi = ids;
    float h[64], out[8];
    osp_session *s;
    assert_int_equal(osp_embed_session_new(m, 1, 16, &s), OSP_OK);
    assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids, len, &pos, h), OSP_OK);
    osp_session_reset_row(s, 0);
    assert_int_equal(osp_embed_run(s, c, (const int32_t *const *)&pi, &len, 1, out), OSP_OK);
    for (int r = 0; r < 8; r++) {
        double acc = b[r];
        for (int j = 0; j < 64; j++) acc += (double)w[r * 64 + j] * h[j];
        assert_true(fabs(out[r] - tanh(acc)) < 1e-6);
    }
    osp_session_free(s);
    osp_embed_config_free(c);
    /* an activation not run; a width that does not follow */
    snprintf(p, sizeof p, "%s/2_Dense/config.json", g_emb);
    write_text(p, "{\"in_features\": 64, \"out_features\": 8, \"activation_function\": \"torch.nn.modules.activation.ReLU\"}");
    assert_int_equal(osp_embed_config_load(m, c), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "ReLU"));
    write_text(p, "{\"in_features\": 32, \"out_features\": 8, \"bias\": false}");
    assert_int_equal(osp_embed_config_load(m, c), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "in_features"));
}

static void test_st_files(void **state) {
    (void)state;
    char p[600];
    osp_model *m;
    osp_embed_config c;
    snprintf(p, sizeof p, "%s/1_Pooling", g_emb);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/modules.json", g_emb);
    write_text(p, "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": \"sentence_transformers.models.Transformer\"},"
                  " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}]");
    snprintf(p, sizeof p, "%s/1_Pooling/config.json", g_emb);
    write_text(p, "{\"word_embedding_dimension\": 64, \"pooling_mode_mean_tokens\": true, \"pooling_mode_lasttoken\": false}");
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    assert_int_equal(c.pooling, OSP_POOLING_MEAN);
    assert_int_equal(c.normalize, 0); /* no Normalize module */
    write_text(p, "{\"pooling_mode_max_tokens\": true}");
    assert_int_equal(osp_embed_config_load(m, &c), OSP_ERR_UNSUPPORTED);
    write_text(p, "{\"pooling_mode_cls_token\": true}");
    snprintf(p, sizeof p, "%s/modules.json", g_emb);
    write_text(p, "[{\"type\": \"sentence_transformers.models.Transformer\", \"path\": \"\"},"
                  " {\"type\": \"sentence_transformers.models.Pooling\", \"path\": \"1_Pooling\"},"
                  " {\"type\": \"sentence_transformers.models.Normalize\", \"path\": \"2_Normalize\"}]");
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    assert_int_equal(c.pooling, OSP_POOLING_CLS);
    assert_int_equal(c.normalize, 1);
    write_text(p, "[{\"type\": \"sentence_transformers.models.Transformer\", \"path\": \"\"},"
                  " {\"type\": \"sentence_transformers.models.Pooling\", \"path\": \"1_Pooling\"},"
                  " {\"type\": \"sentence_transformers.models.Dense\", \"path\": \"2_Dense\"}]");
    assert_int_equal(osp_embed_config_load(m, &c), OSP_ERR_FORMAT); /* no 2_Dense folder */
    assert_non_null(strstr(osp_last_error(), "2_Dense"));
    dense_module(m, &c);
    osp_model_free(m);
    unlink(p);
    /* config.json: is_matryoshka false wins over the architecture's default; matryoshka_dimensions lists widths */
    snprintf(p, sizeof p, "%s/config.json", g_emb);
    json_t *cfg = json_load_file(p, 0, NULL);
    json_object_set_new(cfg, "is_matryoshka", json_false());
    json_dump_file(cfg, p, 0);
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    assert_int_equal(c.matryoshka, 0);
    osp_model_free(m);
    json_object_del(cfg, "is_matryoshka");
    json_object_set_new(cfg, "matryoshka_dimensions", json_pack("[i, i]", 16, 32));
    json_dump_file(cfg, p, 0);
    assert_int_equal(osp_model_load(g_emb, &m), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    assert_true(c.matryoshka && c.n_mrl_dims == 2 && c.mrl_dims[1] == 32);
    osp_model_free(m);
    json_object_del(cfg, "matryoshka_dimensions");
    json_dump_file(cfg, p, 0);
    json_decref(cfg);
}

/* Qwen3-Embedding's trap: its tokenizer_config.json states add_bos_token false (and eos_token <|im_end|>); the
 * post-processor's <|endoftext|> after the text must stay. A stated add_eos_token rebuilds that side. */
static void test_post_processor_kept(void **state) {
    (void)state;
    FILE *f = fopen("data/embed/tokenizer.json", "rb");
    assert_non_null(f);
    static char json[1 << 16];
    size_t n = fread(json, 1, sizeof json, f);
    fclose(f);
    static const struct {
        const char *config;
        int32_t last; /* the id after "hi" (104, 105), or -1: none */
    } C[] = {{"{\"add_bos_token\": false, \"bos_token\": null, \"eos_token\": \"<|im_end|>\", \"pad_token\": \"<|endoftext|>\"}", 261},
             {"{\"add_bos_token\": false, \"add_eos_token\": false}", -1},
             {"{\"add_eos_token\": true, \"eos_token\": \"x\"}", 120},
             {NULL, 261}};
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
        osp_tokenizer *t;
        assert_int_equal(osp_tokenizer_load_json(json, n, C[i].config, C[i].config ? strlen(C[i].config) : 0, "embed",
                                                 &t), OSP_OK);
        int32_t ids[8];
        size_t k;
        assert_int_equal(osp_tokenizer_encode(t, "hi", 2, 1, ids, 8, &k), OSP_OK);
        assert_int_equal(k, C[i].last < 0 ? 2 : 3);
        assert_int_equal(ids[0], 104);
        if (C[i].last >= 0) assert_int_equal(ids[2], C[i].last);
        osp_tokenizer_free(t);
    }
}

static void test_base64(void **state) {
    (void)state;
    static const struct {
        const char *in, *out;
    } T[] = {{"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
             {"foobar", "Zm9vYmFy"}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        char *e = osp_base64_encode(T[i].in, strlen(T[i].in));
        assert_string_equal(e, T[i].out);
        osp_free(e);
    }
    float v[2] = {1.0f, -2.5f}; /* little-endian f32: 00 00 80 3f, 00 00 20 c0 */
    char *e = osp_base64_encode(v, sizeof v);
    assert_string_equal(e, "AACAPwAAIMA=");
    osp_free(e);
}

/* transformers' and sentence-transformers' numbers (make_golden.py's TEXTS, in order) */
#define TINY "data/embed/qwen3-embedding-tiny"
static void check_golden(const char *file) {
    static const char *TEXTS[] = {"the cat sat on the mat", "hi", "in the winter there was snow", "x",
                                  "theretheretherethere in in in"};
    enum { N = 5 };
    osp_st *g;
    char path[256];
    snprintf(path, sizeof path, "%s/%s", TINY, file);
    if (osp_st_open_file(path, &g) != OSP_OK) {
        printf("no %s yet (make_golden.py): skipped\n", path);
        return;
    }
    printf("%s:\n", path);
    osp_model *m;
    osp_tokenizer *tok;
    osp_embed_config c;
    assert_int_equal(osp_model_load(TINY, &m), OSP_OK);
    assert_int_equal(osp_tokenizer_load(TINY, &tok), OSP_OK);
    assert_int_equal(osp_embed_config_load(m, &c), OSP_OK);
    const int64_t H = c.dims;
    int32_t *ids[N], len[N];
    for (int i = 0; i < N; i++) {
        size_t k;
        assert_int_equal(osp_tokenizer_encode_alloc(tok, TEXTS[i], strlen(TEXTS[i]), 1, &ids[i], &k), OSP_OK);
        len[i] = (int32_t)k;
        const osp_st_tensor *t = golden_find_i(g, "input_ids_%d", i);
        assert_non_null(t);
        assert_int_equal(t->numel, len[i]);
        assert_memory_equal(t->data, ids[i], t->nbytes);
        /* hidden states, every position */
        t = golden_find_i(g, "hidden_%d", i);
        assert_non_null(t);
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, len[i], &s), OSP_OK);
        float *h = malloc(sizeof(float) * (size_t)(len[i] * H));
        int32_t row = 0;
        assert_int_equal(osp_forward_rows_hidden(s, &row, 1, ids[i], len[i], NULL, h), OSP_OK);
        const float *ref = t->data;
        double worst = golden_worst_rel(h, ref, len[i] * H);
        printf("%s: hidden states, max |diff| / max(1, |ref|) %.3g\n", TEXTS[i], worst);
        assert_true(worst <= 2e-5);
        free(h);
        osp_session_free(s);
    }
    float out[N * 128];
    assert_true(H <= 128);
    osp_session *s;
    assert_int_equal(osp_embed_session_new(m, 3, 64, &s), OSP_OK);
    const char *keys[] = {"embedding", "st_embedding", "mrl_16", "mrl_32"};
    int32_t widths[] = {(int32_t)H, (int32_t)H, 16, 32};
    for (int k = 0; k < 4; k++) {
        const osp_st_tensor *t = osp_st_find(g, keys[k]);
        if (!t) continue; /* st_embedding: sentence-transformers was not installed */
        assert_int_equal(osp_embed_run(s, &c, (const int32_t *const *)ids, len, N, out), OSP_OK);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            osp_embed_finish(&c, out + i * H, widths[k]);
            worst = fmax(worst, golden_worst_rel(out + i * H, (const float *)t->data + i * widths[k], widths[k]));
        }
        printf("%s: max |diff| %.3g\n", keys[k], worst);
        assert_true(worst <= 2e-5);
    }
    osp_session_free(s);
    for (int i = 0; i < N; i++) osp_free(ids[i]);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    osp_st_close(g);
}

static void test_transformers_golden(void **state) {
    (void)state;
    check_golden("golden.safetensors");       /* transformers (make_golden.py, on the device) */
    check_golden("numpy_golden.safetensors"); /* an f64 numpy forward (numpy_golden.py), independent of both */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_finish), cmocka_unit_test(test_dims),        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_post_processor_kept),
        cmocka_unit_test(test_no_head),     cmocka_unit_test(test_hidden_is_reference),
        cmocka_unit_test(test_embed_run),   cmocka_unit_test(test_st_files),    cmocka_unit_test(test_transformers_golden),
    };
    return cmocka_run_group_tests(tests, make_folders, remove_folders);
}
