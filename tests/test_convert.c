/* osprey convert (model/convert.h) on the goldens.
 *
 * - Layout: a bf16 golden converted with -q --q-bits N --q-group-size 32
 *   has its -qN twin's tensors (names, dtypes, shapes) and config keys.
 *   One known difference: gemma4-e's per_layer_input_gate [8, 64] is
 *   dense in the twins, while mlx_lm's default predicate (a Linear whose
 *   input width is a multiple of the group size) quantizes it; convert
 *   follows mlx_lm, and the test names that module rather than skipping
 *   anything else.
 * - Codes: every quantized tensor equals tensor/quant.c's mx.quantize rule
 *   (osp_quantize_row) applied to the source's bf16 values, bit for bit.
 *   The twins' scales and biases are the same numbers (MLX's rule rounded
 *   to bf16) except in groups whose q0 is exactly half-way, which the
 *   twins' tool rounded to even (checked to be exactly that); their codes
 *   were chosen with the rounded scale and bias (goldens README), so some
 *   codes differ: counted and printed, and bounded (one step at most).
 * - Logits: the converted model, at reference precision, against the bf16
 *   golden's reference logits, per-position KL(ref || ours). These random
 *   models have no margins, so quantization alone costs far more than the
 *   goldens' 1e-3 fast-path tier (the twins' own reference logits sit at
 *   KL 5e-2 from bf16 for llama3-q4). The bound is the twin's: the copy's
 *   mean KL <= 1.5 x, and its worst position <= 2 x, the twin's KL to the
 *   bf16 reference, scaled by the ratio of the copy's squared weight error
 *   to the twin's (measured here from the weights: ~1.00 at 4 bits, ~1.7-1.8
 *   at 8 bits, where mx.quantize's codes, picked with the unrounded scale,
 *   are a step off the rounded scale's best code in ~19% of the weights).
 *   KL is second order in a small logit perturbation, itself linear in the
 *   weights' error; the 1.5 and 2 leave room for the noise of 40 positions
 *   of one random model. Figures printed.
 * - A pure dtype conversion (f32) keeps every value and the logits within
 *   the goldens' reference tolerance; sharded output loads and gives the
 *   same logits bitwise; an already-quantized input, a non-empty OUT and
 *   bad options are refused; a cancelled convert leaves nothing behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "golden.h"
#include "model/convert.h"
#include "model/safetensors.h"
#include "osprey.h"
#include "tensor/quant.h"

static char tmp[256];

static int setup(void **st) {
    (void)st;
    return test_tmpdir_make(tmp, sizeof tmp, "convert");
}

static int teardown(void **st) {
    (void)st;
    return test_tmpdir_remove(tmp);
}

static void convert_q(const char *golden, int bits, const char *out) {
    char in[256];
    snprintf(in, sizeof in, "data/goldens/%s", golden);
    osp_convert_opts o = {.quantize = 1, .bits = bits, .group = 32, .dtype = -1};
    osp_convert_result r;
    if (osp_convert(in, out, &o, &r) != OSP_OK) fail_msg("convert %s: %s", golden, osp_last_error());
    assert_true(r.n_quantized > 0);
}

static int known_difference(const char *golden, const char *name) {
    return !strncmp(golden, "gemma4-e", 8) && strstr(name, ".per_layer_input_gate.");
}

/* The twin's tensors and config keys, name by name. */
static void check_layout(const char *golden, int bits, const char *out) {
    char twin[256];
    snprintf(twin, sizeof twin, "data/goldens/%s-q%d", golden, bits);
    osp_st *a, *b;
    assert_int_equal(osp_st_open_dir(out, &a), OSP_OK);
    assert_int_equal(osp_st_open_dir(twin, &b), OSP_OK);
    int same = 0, known = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const osp_st_tensor *x = &a->tensors[i], *y = osp_st_find(b, x->name);
        if (known_difference(golden, x->name)) {
            known++;
            continue;
        }
        if (!y) fail_msg("%s: %s is not in the twin", golden, x->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++) assert_int_equal(x->shape[d], y->shape[d]);
        same++;
    }
    for (int i = 0; i < b->n_tensors; i++)
        if (!osp_st_find(a, b->tensors[i].name) && !known_difference(golden, b->tensors[i].name))
            fail_msg("%s: the twin's %s is missing", golden, b->tensors[i].name);
    printf("  %-12s q%d: %d tensors as the twin's%s\n", golden, bits, same,
           known ? " (per_layer_input_gate quantized: mlx_lm's predicate; dense in the twin)" : "");
    if (!strcmp(golden, "gemma4-e")) assert_true(known > 0); /* the difference is real, not a silent skip */

    char p[600];
    snprintf(p, sizeof p, "%s/config.json", out);
    json_t *ca = json_load_file(p, 0, NULL);
    snprintf(p, sizeof p, "%s/config.json", twin);
    json_t *cb = json_load_file(p, 0, NULL);
    assert_non_null(ca);
    assert_non_null(cb);
    const char *k;
    json_t *v;
    json_object_foreach(cb, k, v) {
        json_t *w = json_object_get(ca, k);
        if (!w) fail_msg("%s: config key %s missing", golden, k);
        if (!json_equal(v, w)) fail_msg("%s: config key %s differs from the twin's", golden, k);
    }
    json_object_foreach(ca, k, v) if (!json_object_get(cb, k)) fail_msg("%s: extra config key %s", golden, k);
    json_decref(ca);
    json_decref(cb);
    osp_st_close(a);
    osp_st_close(b);
}

/* The twins' scale and bias where they differ from mx.quantize's: the
 * group's q0 = edge / scale is exactly half-way and the twins' tool
 * rounded it to even (the CPU's rint; mx.quantize's GPU kernels, which
 * quant.c follows, round half away from zero). Steps 1-5 of model-spec
 * §2.6 with the other rounding. */
static int twin_tie(const float *x, int bits, uint16_t s2, uint16_t b2) {
    float n_bins = (float)((1 << bits) - 1), mx = 0, mn = INFINITY;
    for (int i = 0; i < 32; i++) mx = fmaxf(mx, x[i]), mn = fminf(mn, x[i]);
    float s = (mx - mn) / n_bins;
    if (!(s > 1e-7f)) s = 1e-7f;
    int side = fabsf(mn) > fabsf(mx);
    if (!side) s = -s;
    float edge = side ? mn : mx, v = edge / s;
    if (fabsf(v - truncf(v)) != 0.5f) return 0; /* not a tie: a real difference */
    float q0 = rintf(v);
    return q0 != 0 && s2 == osp_f32_to_bf16(edge / q0) && b2 == osp_f32_to_bf16(edge);
}

/* Codes, scales and biases against osp_quantize_row on the bf16 source;
 * scales and biases against the twin's; codes that differ from the twin's
 * counted. */
/* Returns sum (w - deq_ours)^2 / sum (w - deq_twin)^2 over every module
 * either quantizes (a module dense in the twin adds nothing to its sum). */
static double check_codes(const char *golden, int bits, const char *out) {
    char in[256], twin[256], n[512];
    snprintf(in, sizeof in, "data/goldens/%s", golden);
    snprintf(twin, sizeof twin, "data/goldens/%s-q%d", golden, bits);
    osp_st *a, *s, *t;
    assert_int_equal(osp_st_open_dir(out, &a), OSP_OK);
    assert_int_equal(osp_st_open_dir(in, &s), OSP_OK);
    assert_int_equal(osp_st_open_dir(twin, &t), OSP_OK);
    int64_t n_codes = 0, diff_codes = 0, n_mods = 0, tie_groups = 0;
    double err_ours = 0, err_twin = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const osp_st_tensor *q = &a->tensors[i];
        size_t len = strlen(q->name);
        if (q->dtype != OSP_DT_U32 || len < 8 || strcmp(q->name + len - 7, ".weight")) continue;
        snprintf(n, sizeof n, "%.*s.scales", (int)(len - 7), q->name);
        const osp_st_tensor *sc = osp_st_find(a, n);
        snprintf(n, sizeof n, "%.*s.biases", (int)(len - 7), q->name);
        const osp_st_tensor *bi = osp_st_find(a, n);
        const osp_st_tensor *src = osp_st_find(s, q->name);
        assert_non_null(sc);
        assert_non_null(bi);
        assert_non_null(src);
        assert_int_equal(src->dtype, OSP_DT_BF16);
        int64_t cols = src->shape[src->ndim - 1], rows = src->numel / cols, ng = cols / 32;
        int64_t rb = cols * bits / 8;
        uint8_t *codes = malloc(rb);
        uint16_t *ss = malloc(ng * 2), *bb = malloc(ng * 2);
        float *x = malloc(cols * 4);
        const osp_st_tensor *tq = osp_st_find(t, q->name);
        snprintf(n, sizeof n, "%.*s.scales", (int)(len - 7), q->name);
        const osp_st_tensor *ts = osp_st_find(t, n);
        snprintf(n, sizeof n, "%.*s.biases", (int)(len - 7), q->name);
        const osp_st_tensor *tb = osp_st_find(t, n);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) x[c] = osp_load_float(src->data, src->dtype, r * cols + c);
            assert_int_equal(osp_quantize_row(x, cols, bits, 32, codes, ss, bb), OSP_OK);
            const unsigned char *qa = (const unsigned char *)q->data + r * rb;
            if (memcmp(qa, codes, rb) || memcmp((const char *)sc->data + r * ng * 2, ss, ng * 2) ||
                memcmp((const char *)bi->data + r * ng * 2, bb, ng * 2))
                fail_msg("%s q%d: %s row %lld differs from osp_quantize_row", golden, bits, q->name, (long long)r);
            for (int64_t c = 0; c < cols; c++) {
                const unsigned char *qa = (const unsigned char *)q->data + r * rb;
                double d = x[c] - (osp_bf16_to_f32(ss[c / 32]) * (float)osp_q_code(qa, bits, c) +
                                   osp_bf16_to_f32(bb[c / 32]));
                err_ours += d * d;
            }
            if (known_difference(golden, q->name)) continue; /* dense in the twin */
            for (int64_t c = 0; c < cols; c++) {
                const unsigned char *qt = (const unsigned char *)tq->data + r * rb;
                float s2 = osp_load_float(ts->data, OSP_DT_BF16, r * ng + c / 32),
                      b2 = osp_load_float(tb->data, OSP_DT_BF16, r * ng + c / 32);
                double d = x[c] - (s2 * (float)osp_q_code(qt, bits, c) + b2);
                err_twin += d * d;
            }
            const unsigned char *qt = (const unsigned char *)tq->data + r * rb;
            for (int64_t gi = 0; gi < ng; gi++) {
                uint16_t s2, b2;
                memcpy(&s2, (const char *)ts->data + (r * ng + gi) * 2, 2);
                memcpy(&b2, (const char *)tb->data + (r * ng + gi) * 2, 2);
                if (s2 != ss[gi] || b2 != bb[gi]) {
                    if (!twin_tie(x + gi * 32, bits, s2, b2))
                        fail_msg("%s q%d: %s row %lld group %lld: scale/bias differ from the twin's, not at a tie",
                                 golden, bits, q->name, (long long)r, (long long)gi);
                    tie_groups++;
                    continue;
                }
                for (int64_t c = gi * 32; c < gi * 32 + 32; c++) {
                    int ca = (int)osp_q_code(qa, bits, c), ct = (int)osp_q_code(qt, bits, c);
                    n_codes++;
                    if (ca != ct) {
                        diff_codes++;
                        if (abs(ca - ct) > 1)
                            fail_msg("%s: %s code %lld: %d vs the twin's %d", golden, q->name,
                                     (long long)(r * cols + c), ca, ct);
                    }
                }
            }
        }
        n_mods++;
        free(codes);
        free(ss);
        free(bb);
        free(x);
    }
    printf("  %-12s q%d: %lld modules bit-exact with osp_quantize_row; vs the twin: %lld groups with a half-way q0 "
           "rounded to even there, and in the others %lld of %lld codes (%.3f%%) differ (rounded-scale codes), by one "
           "step\n",
           golden, bits, (long long)n_mods, (long long)tie_groups, (long long)diff_codes, (long long)n_codes,
           100.0 * diff_codes / n_codes);
    printf("  %-12s q%d: squared weight error of the copy / the twin's: %.3f\n", golden, bits, err_ours / err_twin);
    assert_true(n_mods > 0);
    osp_st_close(a);
    osp_st_close(s);
    osp_st_close(t);
    return err_ours / err_twin;
}

/* Per-position KL of the model in `dir` (reference precision) to ref. */
static void model_kl(const char *dir, const golden *g, const float *ref, double *mean, double *worst,
                     float **logits_out) {
    osp_model *m;
    if (osp_model_load(dir, &m) != OSP_OK) fail_msg("%s: %s", dir, osp_last_error());
    osp_session *s;
    assert_int_equal(osp_session_new(m, 1, g->T, &s), OSP_OK);
    float *out = malloc(sizeof(float) * g->T * g->vocab);
    assert_int_equal(osp_forward(s, g->ids, g->T, 1, out), OSP_OK);
    *mean = *worst = 0;
    for (int32_t t = 0; t < g->T; t++) {
        double k = golden_kl(ref + (int64_t)t * g->vocab, out + (int64_t)t * g->vocab, g->vocab);
        *mean += k / g->T;
        *worst = fmax(*worst, k);
    }
    osp_session_free(s);
    osp_model_free(m);
    if (logits_out) *logits_out = out;
    else free(out);
}

static double logits_kl(const golden *g, const float *ref, const float *got, double *worst) {
    double mean = 0;
    *worst = 0;
    for (int32_t t = 0; t < g->T; t++) {
        double k = golden_kl(ref + (int64_t)t * g->vocab, got + (int64_t)t * g->vocab, g->vocab);
        mean += k / g->T;
        *worst = fmax(*worst, k);
    }
    return mean;
}

static void check_logits(const char *golden_name, int bits, const char *out, double err_ratio) {
    char in[256], twin[256];
    snprintf(in, sizeof in, "data/goldens/%s", golden_name);
    snprintf(twin, sizeof twin, "data/goldens/%s-q%d", golden_name, bits);
    golden g, gt;
    assert_int_equal(golden_load(in, &g), 0);
    assert_int_equal(golden_load(twin, &gt), 0);
    assert_int_equal(g.T, gt.T);
    assert_memory_equal(g.ids, gt.ids, sizeof(int32_t) * g.T);
    double mean, worst, tw_worst, ct_worst;
    float *ours;
    model_kl(out, &g, g.logits, &mean, &worst, &ours);
    double tw_mean = logits_kl(&g, g.logits, gt.logits, &tw_worst);
    double ct_mean = logits_kl(&gt, gt.logits, ours, &ct_worst);
    printf("  %-12s q%d: KL(bf16 ref || converted) mean %.2e max %.2e; twin's ref vs bf16 ref: mean %.2e max %.2e; "
           "converted vs twin's ref: mean %.2e max %.2e\n",
           golden_name, bits, mean, worst, tw_mean, tw_worst, ct_mean, ct_worst);
    /* The twin's KL, scaled by the copy's weight error relative to the twin's (KL is second order in
       a small perturbation of the logits, which is linear in the weights' error), with room for the
       sampling noise of 40 positions of one random model. */
    assert_true(mean <= 1.5 * err_ratio * tw_mean);
    assert_true(worst <= 2.0 * err_ratio * tw_worst);
    free(ours);
    golden_free(&g);
    golden_free(&gt);
}

static const struct {
    const char *golden;
    int bits;
} PAIRS[] = {{"llama3", 4}, {"qwen3", 8}, {"gemma3", 4}, {"gemma4-e", 4}, {"gemma4-e", 8}, {"gemma4-dense", 4}};
#define N_PAIRS (sizeof PAIRS / sizeof *PAIRS)

static void test_twins(void **state) {
    (void)state;
    for (size_t i = 0; i < N_PAIRS; i++) {
        char out[512];
        snprintf(out, sizeof out, "%s/%s-q%d", tmp, PAIRS[i].golden, PAIRS[i].bits);
        convert_q(PAIRS[i].golden, PAIRS[i].bits, out);
        check_layout(PAIRS[i].golden, PAIRS[i].bits, out);
        double ratio = check_codes(PAIRS[i].golden, PAIRS[i].bits, out);
        check_logits(PAIRS[i].golden, PAIRS[i].bits, out, ratio);
    }
}

/* MoE (no twin): experts split into switch_glu, the router 8-bit group 64
 * as a per-module override; it loads and runs. */
static void test_moe(void **state) {
    (void)state;
    char out[512], p[600];
    snprintf(out, sizeof out, "%s/moe-q4", tmp);
    convert_q("gemma4-moe", 4, out);
    osp_st *a;
    assert_int_equal(osp_st_open_dir(out, &a), OSP_OK);
    const osp_st_tensor *gp = osp_st_find(a, "model.layers.0.experts.switch_glu.gate_proj.weight");
    assert_non_null(gp);
    assert_int_equal(gp->dtype, OSP_DT_U32);
    assert_int_equal(gp->ndim, 3);
    assert_null(osp_st_find(a, "model.layers.0.experts.gate_up_proj"));
    const osp_st_tensor *rs = osp_st_find(a, "model.layers.0.router.proj.scales");
    assert_non_null(rs);
    assert_int_equal(rs->shape[1], 64 / 64);
    osp_st_close(a);
    snprintf(p, sizeof p, "%s/config.json", out);
    json_t *c = json_load_file(p, 0, NULL);
    json_t *ov = json_object_get(json_object_get(c, "quantization"), "model.layers.0.router.proj");
    assert_int_equal(json_integer_value(json_object_get(ov, "bits")), 8);
    assert_int_equal(json_integer_value(json_object_get(ov, "group_size")), 64);
    json_decref(c);
    golden g;
    assert_int_equal(golden_load("data/goldens/gemma4-moe", &g), 0);
    double mean, worst;
    model_kl(out, &g, g.logits, &mean, &worst, NULL);
    printf("  gemma4-moe   q4: KL(bf16 ref || converted) mean %.2e max %.2e (no twin)\n", mean, worst);
    assert_true(isfinite(mean) && mean < 1.0);
    golden_free(&g);
}

/* --dtype f32 without -q: every value kept, logits within the goldens'
 * reference tolerance; sharded output gives the same logits bitwise. */
static void test_dtype_and_shards(void **state) {
    (void)state;
    char out[512], sh[512];
    snprintf(out, sizeof out, "%s/llama3-f32", tmp);
    osp_convert_opts o = {.dtype = OSP_DT_F32};
    if (osp_convert("data/goldens/llama3", out, &o, NULL) != OSP_OK) fail_msg("%s", osp_last_error());
    osp_st *a, *s;
    assert_int_equal(osp_st_open_dir(out, &a), OSP_OK);
    assert_int_equal(osp_st_open_dir("data/goldens/llama3", &s), OSP_OK);
    assert_int_equal(a->n_tensors, s->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const osp_st_tensor *x = &a->tensors[i], *y = osp_st_find(s, x->name);
        assert_non_null(y);
        assert_int_equal(x->dtype, OSP_DT_F32);
        for (int64_t k = 0; k < x->numel; k++)
            assert_true(osp_load_float(x->data, x->dtype, k) == osp_load_float(y->data, y->dtype, k));
    }
    osp_st_close(a);
    osp_st_close(s);
    golden g;
    assert_int_equal(golden_load("data/goldens/llama3", &g), 0);
    osp_model *m;
    assert_int_equal(osp_model_load(out, &m), OSP_OK);
    osp_session *ss;
    assert_int_equal(osp_session_new(m, 1, g.T, &ss), OSP_OK);
    float *l = malloc(sizeof(float) * g.T * g.vocab);
    assert_int_equal(osp_forward(ss, g.ids, g.T, 1, l), OSP_OK);
    for (int32_t t = 0; t < g.T; t++)
        assert_true(golden_pos_ratio(g.logits + (int64_t)t * g.vocab, l + (int64_t)t * g.vocab, g.vocab) <= 1);
    free(l);
    osp_session_free(ss);
    osp_model_free(m);
    golden_free(&g);

    /* --dtype f16 -q: the weights cast to f16 first (mlx_lm casts, then quantizes), so the codes, scales and
       biases are the rule's on the f16 values, scales and biases stored in f16 */
    snprintf(out, sizeof out, "%s/llama3-f16-q4", tmp);
    osp_convert_opts h = {.quantize = 1, .bits = 4, .group = 32, .dtype = OSP_DT_F16};
    assert_int_equal(osp_convert("data/goldens/llama3", out, &h, NULL), OSP_OK);
    assert_int_equal(osp_st_open_dir(out, &a), OSP_OK);
    assert_int_equal(osp_st_open_dir("data/goldens/llama3", &s), OSP_OK);
    const osp_st_tensor *w = osp_st_find(s, "model.layers.1.mlp.down_proj.weight"),
                        *qc = osp_st_find(a, "model.layers.1.mlp.down_proj.weight"),
                        *qs = osp_st_find(a, "model.layers.1.mlp.down_proj.scales"),
                        *qb = osp_st_find(a, "model.layers.1.mlp.down_proj.biases"),
                        *nw = osp_st_find(a, "model.norm.weight");
    assert_int_equal(qs->dtype, OSP_DT_F16);
    assert_int_equal(qb->dtype, OSP_DT_F16);
    assert_int_equal(nw->dtype, OSP_DT_F16);
    int64_t cols = w->shape[1];
    for (int64_t r = 0; r < w->shape[0]; r++)
        for (int64_t gi = 0; gi < cols / 32; gi++) {
            float x[32], sc, bi;
            uint8_t codes[32], packed[16];
            for (int c = 0; c < 32; c++)
                x[c] = osp_f16_to_f32(osp_f32_to_f16(osp_load_float(w->data, w->dtype, r * cols + gi * 32 + c)));
            osp_quantize_group(x, 32, 4, codes, &sc, &bi);
            osp_pack_codes(codes, 32, 4, packed);
            assert_memory_equal((const char *)qc->data + r * cols / 2 + gi * 16, packed, 16);
            uint16_t hs = osp_f32_to_f16(sc), hb = osp_f32_to_f16(bi);
            assert_memory_equal((const char *)qs->data + (r * cols / 32 + gi) * 2, &hs, 2);
            assert_memory_equal((const char *)qb->data + (r * cols / 32 + gi) * 2, &hb, 2);
        }
    osp_st_close(a);
    osp_st_close(s);
    char cp[600];
    snprintf(cp, sizeof cp, "%s/config.json", out);
    json_t *cj = json_load_file(cp, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(cj, "dtype")), "float16");
    json_decref(cj);
    assert_int_equal(golden_load("data/goldens/llama3-q4", &g), 0);
    double mean, worst;
    model_kl(out, &g, g.logits, &mean, &worst, NULL);
    printf("  llama3 f16 q4: KL(the bf16-scale twin's ref || f16 copy) mean %.2e max %.2e\n", mean, worst);
    assert_true(isfinite(mean));
    golden_free(&g);

    /* q4 in shards of at most 16 KiB, against the same convert in one file */
    snprintf(out, sizeof out, "%s/llama3-one", tmp);
    snprintf(sh, sizeof sh, "%s/llama3-shards", tmp);
    osp_convert_opts q = {.quantize = 1, .bits = 4, .group = 32, .dtype = -1};
    osp_convert_result r1, r2;
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, &r1), OSP_OK);
    q.shard_bytes = 16 << 10;
    assert_int_equal(osp_convert("data/goldens/llama3", sh, &q, &r2), OSP_OK);
    assert_int_equal(r1.n_shards, 1);
    assert_true(r2.n_shards > 2);
    char p[600];
    snprintf(p, sizeof p, "%s/model-00001-of-%05d.safetensors", sh, r2.n_shards);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    snprintf(p, sizeof p, "%s/model.safetensors", sh);
    assert_int_not_equal(stat(p, &sb), 0);
    double d = models_rel_diff(out, sh, 16, 5);
    assert_true(d == 0.0);
}

/* Every width the loader reads, end to end: qwen3 at 2, 3, 4, 5, 6 and 8
 * bits (group 32) loads, runs, and gets closer to the bf16 reference with
 * every added bit (the straddling 3/5/6-bit packings included). */
static void test_widths(void **state) {
    (void)state;
    static const int widths[] = {2, 3, 4, 5, 6, 8};
    golden g;
    assert_int_equal(golden_load("data/goldens/qwen3", &g), 0);
    double prev = INFINITY;
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
        char out[512];
        snprintf(out, sizeof out, "%s/qwen3-w%d", tmp, widths[i]);
        convert_q("qwen3", widths[i], out);
        double mean, worst;
        model_kl(out, &g, g.logits, &mean, &worst, NULL);
        printf("  qwen3 %d-bit g32: KL mean %.3e max %.3e\n", widths[i], mean, worst);
        assert_true(mean < prev);
        prev = mean;
    }
    golden_free(&g);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    if (d) closedir(d);
    return n;
}

static int cancel_at_5(void *ud, int64_t i, int64_t n, const char *name, uint64_t done, uint64_t total) {
    (void)ud, (void)n, (void)name, (void)done, (void)total;
    return i >= 5;
}

static void test_refusals(void **state) {
    (void)state;
    char out[600], sub[512];
    snprintf(sub, sizeof sub, "%s/refuse", tmp);
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(out, sizeof out, "%s/out", sub);
    osp_convert_opts q = {.quantize = 1, .bits = 4, .group = 32, .dtype = -1};
    /* already quantized */
    assert_int_equal(osp_convert("data/goldens/llama3-q4", out, &q, NULL), OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "already quantized"));
    /* bad bits, bad group */
    q.bits = 7;
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, NULL), OSP_ERR_INVALID);
    q.bits = 4, q.group = 48;
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, NULL), OSP_ERR_INVALID);
    q.group = 32;
    /* missing input */
    assert_int_equal(osp_convert("data/goldens/nope", out, &q, NULL), OSP_ERR_IO);
    assert_non_null(strstr(osp_last_error(), "no such model folder"));
    assert_int_equal(count_entries(sub), 0);
    /* cancelled half way: no OUT, no temporary folder left */
    q.progress = cancel_at_5;
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, NULL), OSP_ERR_INVALID);
    assert_int_equal(count_entries(sub), 0);
    q.progress = NULL;
    /* an empty OUT is fine; a non-empty one is refused */
    assert_int_equal(mkdir(out, 0755), 0);
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, NULL), OSP_OK);
    assert_int_equal(osp_convert("data/goldens/llama3", out, &q, NULL), OSP_ERR_INVALID);
    assert_non_null(strstr(osp_last_error(), "not empty"));
    assert_int_equal(count_entries(sub), 1);
    /* a quantized input converts without -q: codes copied, scales cast */
    snprintf(out, sizeof out, "%s/q4-f32", sub);
    osp_convert_opts c = {.dtype = OSP_DT_F32};
    assert_int_equal(osp_convert("data/goldens/llama3-q4", out, &c, NULL), OSP_OK);
    golden g;
    assert_int_equal(golden_load("data/goldens/llama3-q4", &g), 0);
    double mean, worst;
    model_kl(out, &g, g.logits, &mean, &worst, NULL);
    assert_true(worst < 1e-9); /* the same dequantized weights: the twin's own reference logits */
    golden_free(&g);
}

/* The bundled model: tokenizer, template and generation config copied
 * (not golden.safetensors: the bf16 model's reference is not the copy's);
 * the 4-bit copy (mlx_lm's default group 64) loads and, teacher-forced on
 * the bf16 model's greedy continuations of the three golden prompts,
 * predicts the same next token at most steps: a trained model's copy
 * agrees with it (what makes it a draft), unlike random weights. */
static void test_fortune(void **state) {
    (void)state;
    char out[512], p[600];
    snprintf(out, sizeof out, "%s/fortune-q4", tmp);
    osp_convert_opts q = {.quantize = 1, .bits = 4, .dtype = -1};
    if (osp_convert("../models/fortune", out, &q, NULL) != OSP_OK) fail_msg("%s", osp_last_error());
    const char *side[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"};
    for (size_t i = 0; i < sizeof side / sizeof *side; i++) {
        struct stat a, b;
        snprintf(p, sizeof p, "%s/%s", out, side[i]);
        assert_int_equal(stat(p, &a), 0);
        snprintf(p, sizeof p, "../models/fortune/%s", side[i]);
        assert_int_equal(stat(p, &b), 0);
        assert_int_equal(a.st_size, b.st_size);
    }
    struct stat sb;
    snprintf(p, sizeof p, "%s/golden.safetensors", out);
    assert_int_not_equal(stat(p, &sb), 0);
    osp_st *g;
    assert_int_equal(osp_st_open_file("../models/fortune/golden.safetensors", &g), OSP_OK);
    osp_model *m;
    if (osp_model_load(out, &m) != OSP_OK) fail_msg("%s", osp_last_error());
    int32_t V = osp_model_get_info(m)->vocab;
    int agree = 0, steps = 0;
    for (int i = 0; i < 3; i++) {
        char k[32];
        int32_t np = 0, ng = 0;
        snprintf(k, sizeof k, "prompt%d_ids", i);
        int32_t *prompt = golden_copy_i32(osp_st_find(g, k), &np);
        snprintf(k, sizeof k, "gen%d_ids", i);
        int32_t *gen = golden_copy_i32(osp_st_find(g, k), &ng);
        assert_non_null(prompt);
        assert_non_null(gen);
        int32_t T = np + ng - 1, *ids = malloc(sizeof(int32_t) * T);
        memcpy(ids, prompt, sizeof(int32_t) * np);
        memcpy(ids + np, gen, sizeof(int32_t) * (ng - 1));
        float *l = malloc(sizeof(float) * T * V);
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, T, &s), OSP_OK);
        assert_int_equal(osp_forward(s, ids, T, 1, l), OSP_OK);
        for (int32_t j = 0; j < ng; j++, steps++) agree += argmax_f(l + (int64_t)(np - 1 + j) * V, V) == gen[j];
        osp_session_free(s);
        free(l);
        free(ids);
        free(prompt);
        free(gen);
    }
    printf("  fortune      q4 (group 64): the copy's argmax equals the bf16 model's greedy token at %d of %d steps\n",
           agree, steps);
    assert_true(agree * 10 >= steps * 7);
    osp_model_free(m);
    osp_st_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_twins),    cmocka_unit_test(test_moe),     cmocka_unit_test(test_widths),
        cmocka_unit_test(test_dtype_and_shards),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_fortune),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
