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
#include "model/safetensors.h"
#include "model/whisper.h"

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

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
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
    assert_true(maxdiff(lg, ref_a + 4 * V, V) < 1e-4);
    assert_true(maxdiff(lg + V, ref_b + 4 * V, V) < 1e-4);
    assert_true(maxdiff(lg + 2 * V, ref_b + 4 * V, V) < 1e-4);
    int32_t rows2[2] = {0, 2}, ids2[2] = {b[5], a[5]};
    assert_int_equal(osp_whisper_decode_rows(many, rows2, 2, ids2, lg), OSP_OK);
    assert_true(maxdiff(lg, ref_b + 5 * V, V) < 1e-4);
    assert_true(maxdiff(lg + V, ref_a + 5 * V, V) < 1e-4);
    /* and a different row's logits really differ (the test can fail) */
    assert_true(maxdiff(lg, lg + V, V) > 1e-3);
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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rows), cmocka_unit_test(test_bad_folders)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
