/* Gemma 4 checkpoint layouts: the MLX form of the MoE golden (config nested
 * under text_config of Gemma4ForConditionalGeneration, weights under
 * language_model.model., experts as switch_glu gate/up/down, 4-bit
 * quantized) must compute what the Hugging Face form (fused gate_up_proj)
 * computes with the same, dequantized, expert weights. */
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
#include "model/safetensors.h"
#include "model/st_write.h"
#include "golden.h"
#include "osprey.h"
#include "tensor/quant.h"

static char tmp[256];
static void *keep[512];
static int n_keep;

static void *keepm(size_t n) {
    assert_true(n_keep < (int)(sizeof keep / sizeof *keep));
    return keep[n_keep++] = calloc(1, n);
}

/* Quantize rows of a [R, C] float slice: codes/scales/biases appended at
 * row offset r0 of the stacked outputs; the dequantized values go to deq. */
static void quant_rows(const float *x, int64_t R, int64_t C, int64_t r0, uint8_t *codes, uint16_t *sc, uint16_t *bi,
                       float *deq) {
    for (int64_t r = 0; r < R; r++) {
        int64_t rr = r0 + r;
        assert_int_equal(osp_quantize_row(x + r * C, C, 4, 32, codes + rr * C / 2, sc + rr * C / 32, bi + rr * C / 32),
                         OSP_OK);
        for (int64_t c = 0; c < C; c++)
            deq[r * C + c] = osp_bf16_to_f32(sc[rr * C / 32 + c / 32]) * osp_q_code(codes + rr * C / 2, 4, c) +
                             osp_bf16_to_f32(bi[rr * C / 32 + c / 32]);
    }
}

static void test_mlx_moe(void **state) {
    (void)state;
    osp_st *src;
    assert_int_equal(osp_st_open_file("data/goldens/gemma4-moe/model.safetensors", &src), OSP_OK);
    json_t *tc = json_load_file("data/goldens/gemma4-moe/config.json", 0, NULL);
    assert_non_null(tc);
    int64_t E = json_integer_value(json_object_get(tc, "num_experts"));
    int64_t I = json_integer_value(json_object_get(tc, "moe_intermediate_size"));
    int64_t H = json_integer_value(json_object_get(tc, "hidden_size"));
    osp_st_writer *wm = osp_st_writer_new(), *wh = osp_st_writer_new();
    char name[300];
    for (int i = 0; i < src->n_tensors; i++) {
        const osp_st_tensor *t = &src->tensors[i];
        const char *rest = t->name + strlen("model.");
        const char *gu = strstr(t->name, "experts.gate_up_proj"), *dn = strstr(t->name, "experts.down_proj");
        if (!gu && !dn) {
            snprintf(name, sizeof name, "language_model.model.%s", rest);
            assert_int_equal(osp_st_writer_add(wm, name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), OSP_OK);
            assert_int_equal(osp_st_writer_add(wh, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), OSP_OK);
            continue;
        }
        int64_t R = t->shape[1], C = t->shape[2], n = E * R * C;
        float *x = keepm(n * 4), *deq = keepm(n * 4);
        for (int64_t j = 0; j < n; j++) x[j] = osp_load_float(t->data, t->dtype, j);
        char pre[200];
        snprintf(pre, sizeof pre, "language_model.model.%.*s", (int)((gu ? gu : dn) - t->name) - 6, rest);
        const char *parts[2] = {gu ? "gate_proj" : "down_proj", "up_proj"};
        int64_t rows = gu ? I : H;
        for (int p = 0; p < (gu ? 2 : 1); p++) {
            uint8_t *codes = keepm(E * rows * C / 2);
            uint16_t *sc = keepm(E * rows * C / 32 * 2), *bi = keepm(E * rows * C / 32 * 2);
            for (int64_t e = 0; e < E; e++) {
                int64_t off = (e * R + p * rows) * C; /* gate: first I rows of each expert, up: the next I */
                quant_rows(x + off, rows, C, e * rows, codes, sc, bi, deq + off);
            }
            int64_t sh[3] = {E, rows, C / 8}, ss[3] = {E, rows, C / 32};
            snprintf(name, sizeof name, "%sexperts.switch_glu.%s.weight", pre, parts[p]);
            assert_int_equal(osp_st_writer_add(wm, name, OSP_DT_U32, 3, sh, codes, E * rows * C / 2), OSP_OK);
            snprintf(name, sizeof name, "%sexperts.switch_glu.%s.scales", pre, parts[p]);
            assert_int_equal(osp_st_writer_add(wm, name, OSP_DT_BF16, 3, ss, sc, E * rows * C / 16), OSP_OK);
            snprintf(name, sizeof name, "%sexperts.switch_glu.%s.biases", pre, parts[p]);
            assert_int_equal(osp_st_writer_add(wm, name, OSP_DT_BF16, 3, ss, bi, E * rows * C / 16), OSP_OK);
        }
        assert_int_equal(osp_st_writer_add(wh, t->name, OSP_DT_F32, 3, t->shape, deq, n * 4), OSP_OK);
    }
    char dm[300], dh[300], p[400];
    snprintf(dm, sizeof dm, "%s/mlx", tmp);
    snprintf(dh, sizeof dh, "%s/hf", tmp);
    mkdir(dm, 0755);
    mkdir(dh, 0755);
    snprintf(p, sizeof p, "%s/config.json", dh);
    assert_int_equal(json_dump_file(tc, p, 0), 0);
    json_t *root = json_pack("{s:[s], s:s, s:O, s:{s:i, s:i}}", "architectures", "Gemma4ForConditionalGeneration",
                             "model_type", "gemma4", "text_config", tc, "quantization", "group_size", 32, "bits", 4);
    snprintf(p, sizeof p, "%s/config.json", dm);
    assert_int_equal(json_dump_file(root, p, 0), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dm);
    assert_int_equal(osp_st_writer_write(wm, p, NULL, NULL), OSP_OK);
    snprintf(p, sizeof p, "%s/model.safetensors", dh);
    assert_int_equal(osp_st_writer_write(wh, p, NULL, NULL), OSP_OK);

    double r = models_rel_diff(dm, dh, 20, 53);
    if (r < 0) fail_msg("%s", osp_last_error());
    if (!(r <= 1e-4)) fail_msg("MLX vs HF layout: max error %g of the largest logit", r);
    osp_st_writer_free(wm);
    osp_st_writer_free(wh);
    json_decref(root);
    json_decref(tc);
    osp_st_close(src);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
}

static int setup(void **s) {
    (void)s;
    return test_tmpdir_make(tmp, sizeof tmp, "g4");
}

static int teardown(void **s) {
    (void)s;
    return test_tmpdir_remove(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mlx_moe)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
