/* Mixed-precision MLX checkpoints: per-module quantization overrides in
 * config.json (every bit width 2..8, groups 32/64/128, `false` = dense),
 * quantized embedding and untied head, written with unaligned tensor
 * offsets. The logits must equal those of the same model stored densely
 * as the dequantized f32 weights (w = scale * q + bias). */
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
#include "model/safetensors.h"
#include "model/st_write.h"
#include "golden.h"
#include "osprey.h"
#include "tensor/quant.h"

static char tmp[256];

typedef struct qt { void *codes, *scales, *biases, *deq; } qt;

/* Quantize the bf16 matrix t[rows, cols] and produce its dequantized f32 twin. */
static void quantize(const osp_st_tensor *t, int bits, int group, qt *q) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    q->codes = calloc(1, rows * cols * bits / 8);
    q->scales = malloc(rows * cols / group * 2);
    q->biases = malloc(rows * cols / group * 2);
    q->deq = malloc(rows * cols * 4);
    float *row = malloc(cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = osp_load_float(t->data, t->dtype, r * cols + c);
        assert_int_equal(osp_quantize_row(row, cols, bits, group, (uint8_t *)q->codes + r * cols * bits / 8,
                                          (uint16_t *)q->scales + r * cols / group,
                                          (uint16_t *)q->biases + r * cols / group),
                         OSP_OK);
    }
    osp_weight w = {.dtype = OSP_DT_U32, .rows = rows, .cols = cols, .data = q->codes, .qbits = bits,
                    .group = group, .sdtype = OSP_DT_BF16, .scales = q->scales, .biases = q->biases};
    for (int64_t r = 0; r < rows; r++) osp_weight_row_f32(&w, r, (float *)q->deq + r * cols);
    free(row);
}

/* Rewrite a safetensors file with its header one byte longer (a trailing
 * space), so that every tensor sits at an odd file offset. */
static void misalign(const char *path) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n + 1);
    assert_int_equal(fread(b, 1, n, f), n);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    memmove(b + 8 + hl + 1, b + 8 + hl, n - 8 - hl);
    b[8 + hl] = ' ';
    hl++;
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
    f = fopen(path, "wb");
    assert_int_equal(fwrite(b, 1, n + 1, f), n + 1);
    fclose(f);
    free(b);
}

static void test_mixed(void **state) {
    (void)state;
    osp_st *src;
    assert_int_equal(osp_st_open_file("data/goldens/llama3/model.safetensors", &src), OSP_OK);
    json_t *cfg = json_load_file("data/goldens/llama3/config.json", 0, NULL);
    assert_non_null(cfg);
    json_t *quant = json_pack("{s:i, s:i}", "group_size", 64, "bits", 4);
    static const int BITS[] = {2, 3, 4, 5, 6, 8};
    static const int GROUPS[] = {32, 64, 128};
    osp_st_writer *wq = osp_st_writer_new(), *wd = osp_st_writer_new();
    qt *qs = calloc(src->n_tensors, sizeof *qs);
    int k = 0;
    for (int i = 0; i < src->n_tensors; i++) {
        const osp_st_tensor *t = &src->tensors[i];
        size_t l = strlen(t->name);
        int is_matrix = t->ndim == 2 && l > 7 && !strcmp(t->name + l - 7, ".weight");
        char mod[256];
        snprintf(mod, sizeof mod, "%.*s", (int)(l - 7), t->name);
        int bits = BITS[k % 6], group = GROUPS[(k / 6) % 3];
        if (is_matrix && t->shape[1] % group) group = 32;
        int dense = is_matrix && k % 7 == 5; /* some modules stay bf16 through `false` */
        if (!is_matrix || dense) {
            if (dense) json_object_set_new(quant, mod, json_false());
            assert_int_equal(osp_st_writer_add(wq, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), OSP_OK);
            assert_int_equal(osp_st_writer_add(wd, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes), OSP_OK);
            k += is_matrix;
            continue;
        }
        k++;
        if (bits != 4 || group != 64)
            json_object_set_new(quant, mod, json_pack("{s:i, s:i}", "group_size", group, "bits", bits));
        quantize(t, bits, group, &qs[i]);
        int64_t rows = t->shape[0], cols = t->shape[1];
        int64_t sc[2] = {rows, cols * bits / 32}, ss[2] = {rows, cols / group};
        char n[300];
        assert_int_equal(osp_st_writer_add(wq, t->name, OSP_DT_U32, 2, sc, qs[i].codes, rows * cols * bits / 8), OSP_OK);
        snprintf(n, sizeof n, "%s.scales", mod);
        assert_int_equal(osp_st_writer_add(wq, n, OSP_DT_BF16, 2, ss, qs[i].scales, rows * cols / group * 2), OSP_OK);
        snprintf(n, sizeof n, "%s.biases", mod);
        assert_int_equal(osp_st_writer_add(wq, n, OSP_DT_BF16, 2, ss, qs[i].biases, rows * cols / group * 2), OSP_OK);
        assert_int_equal(osp_st_writer_add(wd, t->name, OSP_DT_F32, 2, t->shape, qs[i].deq, rows * cols * 4), OSP_OK);
    }
    char dq[300], dd[300], p[400];
    snprintf(dq, sizeof dq, "%s/q", tmp);
    snprintf(dd, sizeof dd, "%s/d", tmp);
    mkdir(dq, 0755);
    mkdir(dd, 0755);
    snprintf(p, sizeof p, "%s/config.json", dd);
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    json_object_set(cfg, "quantization", quant);
    snprintf(p, sizeof p, "%s/config.json", dq);
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dq);
    assert_int_equal(osp_st_writer_write(wq, p, NULL, NULL), OSP_OK);
    misalign(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dd);
    assert_int_equal(osp_st_writer_write(wd, p, NULL, NULL), OSP_OK);

    double r = models_rel_diff(dq, dd, 24, 37);
    if (r < 0) fail_msg("%s", osp_last_error());
    if (!(r <= 1e-4)) fail_msg("mixed vs dequantized dense: max error %g of the largest logit", r);
    for (int i = 0; i < src->n_tensors; i++) free(qs[i].codes), free(qs[i].scales), free(qs[i].biases), free(qs[i].deq);
    free(qs);
    osp_st_writer_free(wq);
    osp_st_writer_free(wd);
    json_decref(quant);
    json_decref(cfg);
    osp_st_close(src);
}

static int setup(void **s) {
    (void)s;
    return test_tmpdir_make(tmp, sizeof tmp, "mixed");
}

static int teardown(void **s) {
    (void)s;
    return test_tmpdir_remove(tmp);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mixed)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
