/* model/whisper: decoder rows (beams) against single-row decoding, row
 * copies, and bad input refused with a message (the tiny golden checkpoint
 * and broken copies of its folder). The numbers themselves are checked by
 * the cli_logits_whisper_* golden tests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "golden_cmp.h"
#include "model/safetensors.h"
#include "model/st_write.h"
#include "model/whisper.h"
#include "tensor/quant.h"

#define WG "data/goldens/whisper"

static float *golden_mel(void) {
    osp_st *st;
    assert_int_equal(osp_st_open_file(WG "/golden.safetensors", &st), OSP_OK);
    const osp_st_tensor *t = osp_st_find(st, "mel80");
    assert_non_null(t);
    float *mel = malloc(t->nbytes);
    memcpy(mel, t->data, t->nbytes);
    osp_st_close(st);
    return mel;
}

static void test_rows(void **state) {
    (void)state;
    osp_whisper *m;
    assert_int_equal(osp_whisper_load(WG, &m), OSP_OK);
    const int32_t V = osp_whisper_get_config(m)->vocab;
    float *mel = golden_mel();
    osp_whisper_state *one, *many;
    assert_int_equal(osp_whisper_state_new(m, &one), OSP_OK);
    assert_int_equal(osp_whisper_state_new_rows(m, 3, &many), OSP_OK);
    assert_int_equal(osp_whisper_encode(one, mel), OSP_OK);
    assert_int_equal(osp_whisper_encode(many, mel), OSP_OK);
    const int32_t a[] = {50258, 50259, 50359, 50363, 400, 370, 452};
    const int32_t b[] = {50258, 50259, 50359, 50363, 1029, 406};
    float *ref_a = malloc(sizeof(float) * 7 * V), *ref_b = malloc(sizeof(float) * 6 * V);
    assert_int_equal(osp_whisper_decode(one, a, 7, ref_a, NULL), OSP_OK);
    assert_int_equal(osp_whisper_truncate(one, 0), OSP_OK);
    assert_int_equal(osp_whisper_decode(one, b, 6, ref_b, NULL), OSP_OK);
    /* the prompt on row 0, copied to rows 1 and 2; then rows step together */
    float *lg = malloc(sizeof(float) * 3 * V);
    assert_int_equal(osp_whisper_decode(many, a, 4, NULL, lg), OSP_OK);
    assert_int_equal(osp_whisper_copy_row(many, 2, 0), OSP_OK);
    assert_int_equal(osp_whisper_copy_row(many, 1, 0), OSP_OK);
    assert_int_equal(osp_whisper_row_pos(many, 2), 4);
    int32_t rows[3] = {2, 0, 1}, ids[3] = {a[4], b[4], b[4]};
    assert_int_equal(osp_whisper_decode_rows(many, rows, 3, ids, lg), OSP_OK);
    assert_true(golden_max_diff(lg, ref_a + 4 * V, V) < 1e-4);
    assert_true(golden_max_diff(lg + V, ref_b + 4 * V, V) < 1e-4);
    assert_true(golden_max_diff(lg + 2 * V, ref_b + 4 * V, V) < 1e-4);
    int32_t rows2[2] = {0, 2}, ids2[2] = {b[5], a[5]};
    assert_int_equal(osp_whisper_decode_rows(many, rows2, 2, ids2, lg), OSP_OK);
    assert_true(golden_max_diff(lg, ref_b + 5 * V, V) < 1e-4);
    assert_true(golden_max_diff(lg + V, ref_a + 5 * V, V) < 1e-4);
    /* and a different row's logits really differ (the test can fail) */
    assert_true(golden_max_diff(lg, lg + V, V) > 1e-3);
    /* bad calls */
    int32_t dup[2] = {1, 1};
    assert_int_equal(osp_whisper_decode_rows(many, dup, 2, ids, lg), OSP_ERR_INVALID);
    int32_t bad_id = V;
    assert_int_equal(osp_whisper_decode(one, &bad_id, 1, NULL, lg), OSP_ERR_RANGE);
    assert_int_equal(osp_whisper_copy_row(many, 3, 0), OSP_ERR_RANGE);
    assert_int_equal(osp_whisper_truncate(one, 100), OSP_ERR_RANGE);
    int32_t *longseq = calloc(449, sizeof(int32_t));
    assert_int_equal(osp_whisper_truncate(one, 0), OSP_OK);
    assert_int_equal(osp_whisper_decode(one, longseq, 449, NULL, lg), OSP_ERR_RANGE);
    free(longseq);
    osp_whisper_state *fresh;
    assert_int_equal(osp_whisper_state_new(m, &fresh), OSP_OK);
    assert_int_equal(osp_whisper_decode(fresh, a, 1, NULL, lg), OSP_ERR_INVALID); /* nothing encoded */
    osp_whisper_state_free(fresh);
    assert_int_equal(osp_whisper_state_new_rows(m, 0, &fresh), OSP_ERR_INVALID);
    free(lg);
    free(ref_a);
    free(ref_b);
    free(mel);
    osp_whisper_state_free(one);
    osp_whisper_state_free(many);
    osp_whisper_free(m);
}

/* A folder with this config.json (and no weights unless linked after). */
static void make_dir(char *dir, const char *config) {
    strcpy(dir, "/tmp/osp_wbadXXXXXX");
    assert_non_null(mkdtemp(dir));
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(config, f);
    fclose(f);
}

static void rm_dir(const char *dir) {
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static void test_bad_folders(void **state) {
    (void)state;
    osp_whisper *m = NULL;
    assert_int_equal(osp_whisper_load("/nonexistent/whisper", &m), OSP_ERR_IO);
    assert_null(m);
    char dir[32];
    make_dir(dir, "{\"model_type\": \"whisper\", \"d_model\": 32}");
    assert_true(osp_whisper_detect(dir));
    assert_int_equal(osp_whisper_load(dir, &m), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "Whisper dimensions"));
    rm_dir(dir);
    make_dir(dir, "{\"model_type\": \"whisper\", \"activation_function\": \"relu\"}");
    assert_int_equal(osp_whisper_load(dir, &m), OSP_ERR_UNSUPPORTED);
    rm_dir(dir);
    make_dir(dir, "not json");
    assert_false(osp_whisper_detect(dir));
    assert_int_equal(osp_whisper_load(dir, &m), OSP_ERR_FORMAT);
    rm_dir(dir);
    /* the golden config with one more layer than the weights hold */
    FILE *f = fopen(WG "/config.json", "r");
    char cfg[4096];
    size_t n = fread(cfg, 1, sizeof cfg - 1, f);
    fclose(f);
    cfg[n] = 0;
    char *at = strstr(cfg, "\"decoder_layers\": 2");
    assert_non_null(at);
    at[18] = '3';
    make_dir(dir, cfg);
    char p[128], target[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_non_null(realpath(WG "/model.safetensors", target));
    assert_int_equal(symlink(target, p), 0);
    assert_int_equal(osp_whisper_load(dir, &m), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "model.decoder.layers.2"));
    rm_dir(dir);
    assert_false(osp_whisper_detect("data/goldens/qwen2"));
}


/* ---- the MLX layout: one random model written both ways ---- */

#define TD 32    /* d_model */
#define TF 128   /* ffn = 4 d (MLX's fixed ratio) */
#define TV 512   /* vocab */
#define TG 32    /* quantization group */

typedef struct twriter {
    osp_st_writer *hf, *mx;
    void *bufs[512];
    int nb;
    uint64_t rng;
    int quant; /* the MLX copy's linear layers and embedding 8-bit; the HF copy gets their dequantized values */
} twriter;

static void *keep(twriter *w, size_t n) {
    void *p = calloc(1, n);
    w->bufs[w->nb++] = p;
    return p;
}

static float rnd(twriter *w) {
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return (float)((double)((w->rng * 0x2545f4914f6cdd1dull) >> 40) / 16777216.0 - 0.5) * 0.5f;
}

/* a vector: kind 0 random, 1 ones */
static void put_vec(twriter *w, const char *hf, const char *mx, int64_t n, int kind) {
    float *v = keep(w, sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) v[i] = kind ? 1.0f + 0.1f * rnd(w) : 0.1f * rnd(w);
    int64_t sh[1] = {n};
    assert_int_equal(osp_st_writer_add(w->hf, hf, OSP_DT_F32, 1, sh, v, sizeof(float) * n), OSP_OK);
    assert_int_equal(osp_st_writer_add(w->mx, mx, OSP_DT_F32, 1, sh, v, sizeof(float) * n), OSP_OK);
}

/* a linear weight [rows, cols] (module paths without ".weight") */
static void put_linear(twriter *w, const char *hf, const char *mx, int64_t rows, int64_t cols) {
    char n1[160], n2[160];
    float *v = keep(w, sizeof(float) * rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) v[i] = rnd(w) / sqrtf((float)cols);
    int64_t sh[2] = {rows, cols};
    snprintf(n1, sizeof n1, "%s.weight", hf);
    snprintf(n2, sizeof n2, "%s.weight", mx);
    if (!w->quant) {
        assert_int_equal(osp_st_writer_add(w->hf, n1, OSP_DT_F32, 2, sh, v, sizeof(float) * rows * cols), OSP_OK);
        assert_int_equal(osp_st_writer_add(w->mx, n2, OSP_DT_F32, 2, sh, v, sizeof(float) * rows * cols), OSP_OK);
        return;
    }
    uint8_t *codes = keep(w, rows * cols);
    uint16_t *sc = keep(w, 2 * rows * cols / TG), *bi = keep(w, 2 * rows * cols / TG);
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(osp_quantize_row(v + r * cols, cols, 8, TG, codes + r * cols, sc + r * cols / TG,
                                          bi + r * cols / TG), OSP_OK);
    osp_weight q = {.dtype = OSP_DT_U32, .rows = rows, .cols = cols, .data = codes, .qbits = 8, .group = TG,
                    .sdtype = OSP_DT_BF16, .scales = sc, .biases = bi};
    for (int64_t r = 0; r < rows; r++) osp_weight_row_f32(&q, r, v + r * cols); /* the HF copy: dequantized */
    assert_int_equal(osp_st_writer_add(w->hf, n1, OSP_DT_F32, 2, sh, v, sizeof(float) * rows * cols), OSP_OK);
    int64_t qs[2] = {rows, cols / 4}, ss[2] = {rows, cols / TG};
    assert_int_equal(osp_st_writer_add(w->mx, n2, OSP_DT_U32, 2, qs, codes, rows * cols), OSP_OK);
    snprintf(n2, sizeof n2, "%s.scales", mx);
    assert_int_equal(osp_st_writer_add(w->mx, n2, OSP_DT_BF16, 2, ss, sc, 2 * rows * cols / TG), OSP_OK);
    snprintf(n2, sizeof n2, "%s.biases", mx);
    assert_int_equal(osp_st_writer_add(w->mx, n2, OSP_DT_BF16, 2, ss, bi, 2 * rows * cols / TG), OSP_OK);
}

static void put_ln(twriter *w, const char *hf, const char *mx) {
    char a[160], b[160];
    snprintf(a, sizeof a, "%s.weight", hf);
    snprintf(b, sizeof b, "%s.weight", mx);
    put_vec(w, a, b, TD, 1);
    snprintf(a, sizeof a, "%s.bias", hf);
    snprintf(b, sizeof b, "%s.bias", mx);
    put_vec(w, a, b, TD, 0);
}

static void put_attn(twriter *w, const char *hf, const char *mx) {
    static const char *H[] = {"q_proj", "k_proj", "v_proj", "out_proj"}, *M[] = {"query", "key", "value", "out"};
    char a[160], b[160];
    for (int i = 0; i < 4; i++) {
        snprintf(a, sizeof a, "%s.%s", hf, H[i]);
        snprintf(b, sizeof b, "%s.%s", mx, M[i]);
        put_linear(w, a, b, TD, TD);
        if (i == 1) continue;
        snprintf(a, sizeof a, "%s.%s.bias", hf, H[i]);
        snprintf(b, sizeof b, "%s.%s.bias", mx, M[i]);
        put_vec(w, a, b, TD, 0);
    }
}

static void put_block(twriter *w, const char *hf, const char *mx, int cross) {
    char a[160], b[160];
    snprintf(a, sizeof a, "%s.self_attn", hf);
    snprintf(b, sizeof b, "%s.attn", mx);
    put_attn(w, a, b);
    snprintf(a, sizeof a, "%s.self_attn_layer_norm", hf);
    snprintf(b, sizeof b, "%s.attn_ln", mx);
    put_ln(w, a, b);
    if (cross) {
        snprintf(a, sizeof a, "%s.encoder_attn", hf);
        snprintf(b, sizeof b, "%s.cross_attn", mx);
        put_attn(w, a, b);
        snprintf(a, sizeof a, "%s.encoder_attn_layer_norm", hf);
        snprintf(b, sizeof b, "%s.cross_attn_ln", mx);
        put_ln(w, a, b);
    }
    snprintf(a, sizeof a, "%s.final_layer_norm", hf);
    snprintf(b, sizeof b, "%s.mlp_ln", mx);
    put_ln(w, a, b);
    snprintf(a, sizeof a, "%s.fc1", hf);
    snprintf(b, sizeof b, "%s.mlp1", mx);
    put_linear(w, a, b, TF, TD);
    snprintf(a, sizeof a, "%s.fc1.bias", hf);
    snprintf(b, sizeof b, "%s.mlp1.bias", mx);
    put_vec(w, a, b, TF, 0);
    snprintf(a, sizeof a, "%s.fc2", hf);
    snprintf(b, sizeof b, "%s.mlp2", mx);
    put_linear(w, a, b, TD, TF);
    snprintf(a, sizeof a, "%s.fc2.bias", hf);
    snprintf(b, sizeof b, "%s.mlp2.bias", mx);
    put_vec(w, a, b, TD, 0);
}

/* conv weight: HF [out, in, 3], MLX [out, 3, in] with the same values */
static void put_conv(twriter *w, const char *hf, const char *mx, int64_t in) {
    char a[160], b[160];
    float *h = keep(w, sizeof(float) * TD * in * 3), *x = keep(w, sizeof(float) * TD * in * 3);
    for (int64_t o = 0; o < TD; o++)
        for (int64_t c = 0; c < in; c++)
            for (int k = 0; k < 3; k++) h[(o * in + c) * 3 + k] = x[(o * 3 + k) * in + c] = rnd(w) / sqrtf(3.0f * in);
    int64_t sh[3] = {TD, in, 3}, sx[3] = {TD, 3, in};
    snprintf(a, sizeof a, "%s.weight", hf);
    snprintf(b, sizeof b, "%s.weight", mx);
    assert_int_equal(osp_st_writer_add(w->hf, a, OSP_DT_F32, 3, sh, h, sizeof(float) * TD * in * 3), OSP_OK);
    assert_int_equal(osp_st_writer_add(w->mx, b, OSP_DT_F32, 3, sx, x, sizeof(float) * TD * in * 3), OSP_OK);
    snprintf(a, sizeof a, "%s.bias", hf);
    snprintf(b, sizeof b, "%s.bias", mx);
    put_vec(w, a, b, TD, 0);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The two folders; quant: 8-bit MLX linears (and the HF copy dequantized). */
static void write_pair(const char *hf_dir, const char *mx_dir, int quant) {
    twriter w = {osp_st_writer_new(), osp_st_writer_new(), {0}, 0, 0x1234567ull, quant};
    put_conv(&w, "model.encoder.conv1", "encoder.conv1", 80);
    put_conv(&w, "model.encoder.conv2", "encoder.conv2", TD);
    float *pos = keep(&w, sizeof(float) * 1500 * TD);
    osp_whisper_sinusoids(1500, TD, pos); /* what the MLX layout computes, stored in the HF copy */
    int64_t ps[2] = {1500, TD};
    assert_int_equal(osp_st_writer_add(w.hf, "model.encoder.embed_positions.weight", OSP_DT_F32, 2, ps, pos,
                                       sizeof(float) * 1500 * TD), OSP_OK);
    put_block(&w, "model.encoder.layers.0", "encoder.blocks.0", 0);
    put_ln(&w, "model.encoder.layer_norm", "encoder.ln_post");
    put_linear(&w, "model.decoder.embed_tokens", "decoder.token_embedding", TV, TD);
    float *dpos = keep(&w, sizeof(float) * 448 * TD);
    for (int64_t i = 0; i < 448 * TD; i++) dpos[i] = 0.1f * rnd(&w);
    int64_t ds[2] = {448, TD};
    assert_int_equal(osp_st_writer_add(w.hf, "model.decoder.embed_positions.weight", OSP_DT_F32, 2, ds, dpos,
                                       sizeof(float) * 448 * TD), OSP_OK);
    assert_int_equal(osp_st_writer_add(w.mx, "decoder.positional_embedding", OSP_DT_F32, 2, ds, dpos,
                                       sizeof(float) * 448 * TD), OSP_OK);
    put_block(&w, "model.decoder.layers.0", "decoder.blocks.0", 1);
    put_ln(&w, "model.decoder.layer_norm", "decoder.ln");
    char p[128];
    snprintf(p, sizeof p, "%s/model.safetensors", hf_dir);
    assert_int_equal(osp_st_writer_write(w.hf, p, NULL, NULL), OSP_OK);
    snprintf(p, sizeof p, "%s/weights.safetensors", mx_dir);
    assert_int_equal(osp_st_writer_write(w.mx, p, NULL, NULL), OSP_OK);
    osp_st_writer_free(w.hf);
    osp_st_writer_free(w.mx);
    for (int i = 0; i < w.nb; i++) free(w.bufs[i]);
    write_file(hf_dir, "config.json",
               "{\"model_type\": \"whisper\", \"d_model\": 32, \"encoder_layers\": 1, \"decoder_layers\": 1,"
               " \"encoder_attention_heads\": 2, \"decoder_attention_heads\": 2, \"encoder_ffn_dim\": 128,"
               " \"decoder_ffn_dim\": 128, \"num_mel_bins\": 80, \"vocab_size\": 512}");
    write_file(mx_dir, "config.json",
               quant ? "{\"model_type\": \"whisper\", \"n_mels\": 80, \"n_audio_ctx\": 1500, \"n_audio_state\": 32,"
                       " \"n_audio_head\": 2, \"n_audio_layer\": 1, \"n_vocab\": 512, \"n_text_ctx\": 448,"
                       " \"n_text_state\": 32, \"n_text_head\": 2, \"n_text_layer\": 1,"
                       " \"quantization\": {\"group_size\": 32, \"bits\": 8}}"
                     : "{\"model_type\": \"whisper\", \"n_mels\": 80, \"n_audio_ctx\": 1500, \"n_audio_state\": 32,"
                       " \"n_audio_head\": 2, \"n_audio_layer\": 1, \"n_vocab\": 512, \"n_text_ctx\": 448,"
                       " \"n_text_state\": 32, \"n_text_head\": 2, \"n_text_layer\": 1}");
}

static void run_model(const char *dir, const float *mel, float *enc, float *logits) {
    osp_whisper *m;
    if (osp_whisper_load(dir, &m) != OSP_OK) fail_msg("%s", osp_last_error());
    osp_whisper_state *s;
    assert_int_equal(osp_whisper_state_new(m, &s), OSP_OK);
    assert_int_equal(osp_whisper_encode(s, mel), OSP_OK);
    memcpy(enc, osp_whisper_encoder_out(s), sizeof(float) * 1500 * TD);
    const int32_t ids[5] = {1, 7, 300, 42, 511};
    assert_int_equal(osp_whisper_decode(s, ids, 5, logits, NULL), OSP_OK);
    osp_whisper_state_free(s);
    osp_whisper_free(m);
}

static void rm_tree(const char *dir) {
    const char *f[] = {"config.json", "model.safetensors", "weights.safetensors"};
    char p[128];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, f[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void test_mlx_layout(void **state) {
    (void)state;
    float *mel = golden_mel();
    float *e1 = malloc(sizeof(float) * 1500 * TD), *e2 = malloc(sizeof(float) * 1500 * TD);
    float *l1 = malloc(sizeof(float) * 5 * TV), *l2 = malloc(sizeof(float) * 5 * TV);
    for (int quant = 0; quant < 2; quant++) {
        char hf[32] = "/tmp/osp_whfXXXXXX", mx[32] = "/tmp/osp_wmxXXXXXX";
        assert_non_null(mkdtemp(hf));
        assert_non_null(mkdtemp(mx));
        write_pair(hf, mx, quant);
        run_model(hf, mel, e1, l1);
        run_model(mx, mel, e2, l2);
        double de = golden_max_diff(e1, e2, 1500 * TD), dl = golden_max_diff(l1, l2, 5 * TV), ml = 0;
        for (int i = 0; i < 5 * TV; i++) ml = fmax(ml, fabs(l1[i]));
        print_message("%s: encoder_out %.3g, logits %.3g (max |logit| %.3g)\n", quant ? "8-bit" : "f32", de, dl, ml);
        /* the same math, other summation orders (conv columns, codes vs dequantized values) */
        assert_true(de < 2e-5);
        assert_true(dl < 2e-5 * fmax(1, ml));
        assert_true(ml > 0.1); /* not a degenerate model */
        rm_tree(hf);
        rm_tree(mx);
    }
    free(e1);
    free(e2);
    free(l1);
    free(l2);
    free(mel);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows), cmocka_unit_test(test_bad_folders),
                                       cmocka_unit_test(test_mlx_layout)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
