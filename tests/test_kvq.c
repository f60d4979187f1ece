/* Quantized KV-cache kernels (backend/kvq.h): the AVX-512 variant against
 * the scalar reference, batch invariance (a row's score does not depend on
 * the other rows; wsum is bitwise the same when its rows are split over
 * calls at multiples of 256), and the quantizer's MLX rules (model-spec
 * §2.6). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/kvq.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2 - 1; } /* [-1, 1) */
static float bf16(float x) { return osp_bf16_to_f32(osp_f32_to_bf16(x)); }

/* n rows of D bf16-representable values; groups vary in spread and offset
 * (zero-centred, shifted, all positive, all negative, some exact zeros). */
static void fill_rows(float *x, int64_t n, int D, int group) {
    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < D / group; g++) {
            float spread = 0.05f + 3.0f * (float)(rnd() % 1000) / 1000.0f, off = 0;
            switch (rnd() % 4) {
            case 1: off = spread * frand(); break;
            case 2: off = 2 * spread; break;
            case 3: off = -2 * spread; break;
            }
            for (int i = 0; i < group; i++) {
                float v = off + spread * frand();
                if (rnd() % 16 == 0 && off == 0) v = 0;
                x[j * D + g * group + i] = bf16(v);
            }
        }
}

typedef struct kvbuf {
    int64_t n;
    int D, bits, group;
    uint8_t *codes;
    uint16_t *scales, *biases;
    float *deq; /* osp_kvq_dequantize of the planes */
} kvbuf;

static void kv_make(kvbuf *kv, int64_t n, int D, int bits, int group) {
    kv->n = n, kv->D = D, kv->bits = bits, kv->group = group;
    float *x = malloc(sizeof(float) * n * D);
    fill_rows(x, n, D, group);
    /* exact-sized planes, so ASan sees any read past the last row */
    kv->codes = malloc(osp_kvq_code_bytes(D, bits) * n);
    /* 16-bit rows have no scales or biases: zero planes, never read by the
     * kernels, so tol_unit adds nothing for them */
    kv->scales = calloc((size_t)(n * (D / group)), sizeof(uint16_t));
    kv->biases = calloc((size_t)(n * (D / group)), sizeof(uint16_t));
    kv->deq = malloc(sizeof(float) * n * D);
    osp_kvq_quantize(x, n, D, bits, group, kv->codes, kv->scales, kv->biases);
    osp_kvq_dequantize(kv->codes, kv->scales, kv->biases, n, D, bits, group, kv->deq);
    free(x);
}

static void kv_free(kvbuf *kv) { free(kv->codes), free(kv->scales), free(kv->biases), free(kv->deq); }

static const uint8_t *row_codes(const kvbuf *kv, int64_t j) {
    return kv->codes + j * (int64_t)osp_kvq_code_bytes(kv->D, kv->bits);
}
static const uint16_t *row_s(const kvbuf *kv, int64_t j) { return kv->scales + j * (kv->D / kv->group); }
static const uint16_t *row_b(const kvbuf *kv, int64_t j) { return kv->biases + j * (kv->D / kv->group); }

/* |deq| of value i of row j plus one quantization step: the tolerance's
 * unit (the kernels' factored sums are exact to a fraction of s, not of
 * deq, which can be 0). */
static double tol_unit(const kvbuf *kv, int64_t j, int i) {
    return fabs(kv->deq[j * kv->D + i]) + fabs(osp_bf16_to_f32(row_s(kv, j)[i / kv->group]));
}

static void scores(const osp_kvq_ops *ops, const kvbuf *kv, const float *q, int64_t j0, int64_t n,
                   float *out) {
    ops->scores(q, kv->D, kv->bits, kv->group, row_codes(kv, j0), row_s(kv, j0), row_b(kv, j0), n, out);
}
static void wsum(const osp_kvq_ops *ops, const kvbuf *kv, float *o, const float *p, int64_t j0,
                 int64_t n) {
    ops->wsum(o, p + j0, n, kv->D, kv->bits, kv->group, row_codes(kv, j0), row_s(kv, j0), row_b(kv, j0));
}

/* bits 16 (bf16 rows) ignores the group: its "group" 16 only shapes the
 * test data (fill_rows) and sizes the unused planes */
static const int BITS[] = {4, 8, 16}, GROUPS[] = {32, 64, 128};
static const int DIMS[] = {64, 128, 256, 32, 96, 192, 320, 512, 1024, 16, 48, 80};
#define N_BITS (sizeof BITS / sizeof *BITS)
static int group_of(int bits, size_t g) { return bits == 16 ? (g == 0 ? 16 : 0) : GROUPS[g]; }
static const int64_t NS[] = {1, 2, 17, 300};

/* ------------------------------------------------ fast vs reference */

/* same_rows: every row a copy of row 0 and p uniform, where rounding
 * errors of a running sum all lean the same way. */
static void check_case(const osp_kvq_ops *fast, int bits, int group, int D, int64_t n, int same_rows) {
    kvbuf kv;
    kv_make(&kv, n, D, bits, group);
    if (same_rows) {
        const int64_t rb = (int64_t)osp_kvq_code_bytes(D, bits), G = D / group;
        for (int64_t j = 1; j < n; j++) {
            memcpy(kv.codes + j * rb, kv.codes, rb);
            memcpy(kv.scales + j * G, kv.scales, sizeof(uint16_t) * G);
            memcpy(kv.biases + j * G, kv.biases, sizeof(uint16_t) * G);
            memcpy(kv.deq + j * D, kv.deq, sizeof(float) * D);
        }
    }
    float *q = malloc(sizeof(float) * D), *p = malloc(sizeof(float) * n);
    float *sa = malloc(sizeof(float) * n), *sb = malloc(sizeof(float) * n);
    float *oa = malloc(sizeof(float) * D), *ob = malloc(sizeof(float) * D);
    for (int i = 0; i < D; i++) q[i] = frand() * (i % 5 == 0 ? 3.0f : 1.0f) + 0.2f;
    for (int64_t j = 0; j < n; j++) p[j] = (same_rows ? 1.0f : (float)rnd() / 4294967296.0f) / (float)n;
    for (int i = 0; i < D; i++) oa[i] = ob[i] = same_rows ? 0.0f : 0.1f * frand();

    scores(osp_kvq_ops_scalar(), &kv, q, 0, n, sa);
    scores(fast, &kv, q, 0, n, sb);
    for (int64_t j = 0; j < n; j++) {
        double mag = 0;
        for (int i = 0; i < D; i++) mag += fabs((double)q[i]) * tol_unit(&kv, j, i);
        if (fabs((double)sa[j] - sb[j]) > 1e-5 * mag + 1e-30)
            fail_msg("scores bits %d group %d D %d n %ld row %ld: %s %.9g vs scalar %.9g (mag %g)", bits,
                     group, D, (long)n, (long)j, fast->name, sb[j], sa[j], mag);
    }

    wsum(osp_kvq_ops_scalar(), &kv, oa, p, 0, n);
    float *o0 = malloc(sizeof(float) * D);
    memcpy(o0, ob, sizeof(float) * D);
    wsum(fast, &kv, ob, p, 0, n);
    for (int i = 0; i < D; i++) {
        double mag = fabs(o0[i]);
        for (int64_t j = 0; j < n; j++) mag += fabs((double)p[j]) * tol_unit(&kv, j, i);
        if (fabs((double)oa[i] - ob[i]) > 1e-5 * mag + 1e-30)
            fail_msg("wsum bits %d group %d D %d n %ld i %d: %s %.9g vs scalar %.9g (mag %g)", bits, group, D,
                     (long)n, i, fast->name, ob[i], oa[i], mag);
    }
    free(o0), free(q), free(p), free(sa), free(sb), free(oa), free(ob);
    kv_free(&kv);
}

static const osp_kvq_ops *fast_or_skip(void) {
    const osp_kvq_ops *fast = osp_kvq_ops_avx512();
    if (!fast) skip();
    return fast;
}

static void test_fast_vs_scalar(void **st) {
    (void)st;
    const osp_kvq_ops *fast = fast_or_skip();
    for (size_t b = 0; b < N_BITS; b++)
        for (size_t g = 0; g < 3; g++)
            for (size_t d = 0; d < sizeof DIMS / sizeof *DIMS; d++) {
                int group = group_of(BITS[b], g);
                if (!group || DIMS[d] % group || !osp_kvq_supported(DIMS[d], BITS[b], group)) continue;
                for (size_t k = 0; k < sizeof NS / sizeof *NS; k++)
                    check_case(fast, BITS[b], group, DIMS[d], NS[k], 0);
            }
    /* long contexts: wsum's rounding must not grow with n (a plain running
     * sum of 6000 equal rows is off by ~4e-5) */
    check_case(fast, 4, 64, 128, 6000, 0);
    check_case(fast, 8, 64, 256, 6000, 0);
    check_case(fast, 4, 32, 128, 6000, 1);
    check_case(fast, 8, 128, 256, 6000, 1);
    check_case(fast, 16, 16, 128, 6000, 0);
    check_case(fast, 16, 16, 256, 6000, 1);
}

/* ------------------------------------------------- batch invariance */

static void check_invariance(const osp_kvq_ops *ops, int bits, int group, int D) {
    const int64_t n = 600;
    kvbuf kv;
    kv_make(&kv, n, D, bits, group);
    float *q = malloc(sizeof(float) * D), *p = malloc(sizeof(float) * n);
    float *all = malloc(sizeof(float) * n), *part = malloc(sizeof(float) * n);
    for (int i = 0; i < D; i++) q[i] = frand();
    for (int64_t j = 0; j < n; j++) p[j] = (float)rnd() / 4294967296.0f / 60.0f;

    /* scores: all rows at once == each row alone == any window */
    scores(ops, &kv, q, 0, n, all);
    for (int64_t j = 0; j < n; j++) {
        float one;
        scores(ops, &kv, q, j, 1, &one);
        if (memcmp(&one, &all[j], sizeof one))
            fail_msg("%s bits %d group %d D %d: row %ld alone %.9g, among %ld rows %.9g", ops->name, bits,
                     group, D, (long)j, one, (long)n, all[j]);
    }
    const int64_t win[][2] = {{0, 17}, {5, 40}, {3, 597}, {150, 300}, {599, 1}};
    for (size_t w = 0; w < sizeof win / sizeof *win; w++) {
        scores(ops, &kv, q, win[w][0], win[w][1], part);
        assert_memory_equal(part, all + win[w][0], sizeof(float) * win[w][1]);
    }

    /* wsum: the same call twice gives the same bits */
    float *o1 = calloc(D, sizeof(float)), *o2 = calloc(D, sizeof(float)), *o3 = calloc(D, sizeof(float));
    wsum(ops, &kv, o1, p, 0, n);
    wsum(ops, &kv, o2, p, 0, n);
    assert_memory_equal(o1, o2, sizeof(float) * D);
    /* the AVX-512 variant sums in blocks of 16 and 256 rows from the call's
     * start: splits over calls at multiples of 256 rows give the same bits */
    if (strcmp(ops->name, "scalar") != 0) {
        const int64_t cuts[][4] = {{256, 512, 600, 600}, {0, 256, 256, 600}, {512, 600, 600, 600}};
        for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
            memset(o3, 0, sizeof(float) * D);
            int64_t j = 0;
            for (int k = 0; k < 4; k++) {
                wsum(ops, &kv, o3, p, j, cuts[c][k] - j);
                j = cuts[c][k];
            }
            if (memcmp(o1, o3, sizeof(float) * D))
                fail_msg("%s bits %d group %d D %d: wsum split %ld/%ld/%ld differs from one call", ops->name,
                         bits, group, D, (long)cuts[c][0], (long)cuts[c][1], (long)cuts[c][2]);
        }
    }
    free(o1), free(o2), free(o3), free(q), free(p), free(all), free(part);
    kv_free(&kv);
}

static void test_invariance(void **st) {
    (void)st;
    const osp_kvq_ops *variants[] = {osp_kvq_ops_scalar(), osp_kvq_ops_avx512()};
    for (int v = 0; v < 2; v++) {
        if (!variants[v]) continue;
        for (size_t b = 0; b < N_BITS; b++)
            for (size_t g = 0; g < 3; g++)
                for (size_t d = 0; d < sizeof DIMS / sizeof *DIMS; d++) {
                    int group = group_of(BITS[b], g);
                    if (group && DIMS[d] % group == 0 && osp_kvq_supported(DIMS[d], BITS[b], group))
                        check_invariance(variants[v], BITS[b], group, DIMS[d]);
                }
    }
}

static void test_dispatch(void **st) {
    (void)st;
    const osp_kvq_ops *ops = osp_kvq_ops_get();
    assert_non_null(ops);
    assert_ptr_equal(ops, osp_kvq_ops_get());
    const char *isa = getenv("OSP_ISA");
    if (isa && !strcmp(isa, "scalar")) assert_ptr_equal(ops, osp_kvq_ops_scalar());
    else if (!isa && osp_kvq_ops_avx512()) assert_ptr_equal(ops, osp_kvq_ops_avx512());
    assert_true(osp_kvq_supported(128, 4, 64));
    assert_false(osp_kvq_supported(128, 6, 64));
    assert_false(osp_kvq_supported(96, 4, 64));
    assert_false(osp_kvq_supported(OSP_KVQ_MAX_D + 128, 8, 128));
    assert_int_equal(osp_kvq_code_bytes(128, 4), 64);
    assert_int_equal(osp_kvq_code_bytes(128, 8), 128);
    assert_true(osp_kvq_supported(16, 16, 0));
    assert_false(osp_kvq_supported(24, 16, 0));
    assert_int_equal(osp_kvq_code_bytes(128, 16), 256);
}

/* 16-bit rows are the values rounded to bf16 (nearest even), nothing else */
static void test_bf16_rows(void **st) {
    (void)st;
    const float x[16] = {1.0f, -2.5f, 3.14159265f, 1e-30f, -0.0f, 65504.0f, 1.00390625f, 1.01171875f,
                         0.1f, -0.2f, 7.0e10f, -3.3e-5f, 0.5f, 2.0f, 100.0f, -1.0f};
    uint16_t h[16];
    float back[16];
    osp_kvq_quantize(x, 1, 16, 16, 0, (uint8_t *)h, NULL, NULL);
    osp_kvq_dequantize((const uint8_t *)h, NULL, NULL, 1, 16, 16, 0, back);
    for (int i = 0; i < 16; i++) assert_memory_equal(&back[i], &(float){bf16(x[i])}, sizeof(float));
    /* ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    assert_true(back[6] == 1.0f);
    assert_true(back[7] == 1.015625f);
}

/* ------------------------------------------------- quantizer rules */

/* Code i of a row, decoded by hand from the bitstream. */
static int hand_code(const uint8_t *row, int bits, int i) {
    if (bits == 8) return row[i];
    return i % 2 == 0 ? row[i / 2] & 0xF : row[i / 2] >> 4;
}

static void check_rules(int bits, int group, int D) {
    const int64_t n = 64;
    const int G = D / group, nbins = (1 << bits) - 1;
    kvbuf kv;
    kv_make(&kv, n, D, bits, group);
    float *x = malloc(sizeof(float) * n * D);
    fill_rows(x, n, D, group);
    /* Row 0, group 0: all positive. Row 1, group 0: 0.0 and an exactly
     * representable grid: range [-1, 0.875] gives scale 1/8 (4-bit) or
     * 1.875/255 rounded (8-bit); the 4-bit case must put 0.0 exactly. */
    for (int i = 0; i < group; i++) x[i] = bf16(0.5f + 0.25f * (float)(rnd() % 64) / 64.0f);
    for (int i = 0; i < group; i++) x[D + i] = -1.0f + 0.125f * (float)(i % 16);
    x[D + 5] = 0.0f;
    osp_kvq_quantize(x, n, D, bits, group, kv.codes, kv.scales, kv.biases);
    osp_kvq_dequantize(kv.codes, kv.scales, kv.biases, n, D, bits, group, kv.deq);

    for (int64_t j = 0; j < n; j++)
        for (int g = 0; g < G; g++) {
            const float *xg = x + j * D + g * group, *dg = kv.deq + j * D + g * group;
            const uint8_t *row = row_codes(&kv, j);
            float s = osp_bf16_to_f32(kv.scales[j * G + g]), b = osp_bf16_to_f32(kv.biases[j * G + g]);
            /* the unrounded values and unpacked codes from the group quantizer */
            uint8_t codes[128];
            float s32, b32;
            osp_quantize_group(xg, group, bits, codes, &s32, &b32);
            assert_int_equal(osp_f32_to_bf16(s32), kv.scales[j * G + g]);
            assert_int_equal(osp_f32_to_bf16(b32), kv.biases[j * G + g]);
            /* the edge: the larger-magnitude endpoint (w_max on a tie,
             * w_max clamped at 0 from below as the GPU kernels do) */
            float mx = 0, mn = INFINITY;
            int has_zero = 0;
            for (int i = 0; i < group; i++) {
                mx = xg[i] > mx ? xg[i] : mx;
                mn = xg[i] < mn ? xg[i] : mn;
                has_zero |= xg[i] == 0.0f;
            }
            const float edge = fabsf(mn) > fabsf(mx) ? mn : mx;
            if (mn > 0) assert_true(s < 0 && b == mx); /* all positive: negative scale */
            for (int i = 0; i < group; i++) {
                const int c = hand_code(row, bits, g * group + i);
                assert_true(codes[i] <= nbins);
                assert_int_equal(c, codes[i]);
                /* dequantize == s*c + b by hand, rounded once */
                float want = (float)((double)s * c + (double)b);
                if (memcmp(&want, &dg[i], sizeof want)) fail_msg("deq %g vs by hand %g", dg[i], want);
                if (xg[i] == edge) assert_true(dg[i] == edge);
                /* error <= |s|/2, plus what rounding s and b to bf16 moves;
                 * a code clamped at n_bins may be off by up to |s|: s = edge/q0
                 * can shrink the step so the far end lands past n_bins + 1/2 */
                double slack = fabs((double)s - s32) * c + fabs((double)b - b32) + 1e-6 * fabs(xg[i]);
                double bound = (c == nbins ? fabs(s32) : fabs(s32) / 2) + slack + 1e-7;
                if (fabs((double)dg[i] - xg[i]) > bound)
                    fail_msg("bits %d group %d row %ld g %d i %d: x %g deq %g scale %g", bits, group, (long)j,
                             g, i, xg[i], dg[i], s32);
                /* 0.0 is on the f32 grid (to an ulp of the edge) and, with
                 * bf16 scales, within the rounding of s times its code */
                if (xg[i] == 0.0f) {
                    assert_true(fabs((double)s32 * c + b32) <= fabs(edge) * 0x1p-22);
                    assert_true(fabs(dg[i]) <= fabs((double)s - s32) * c + fabs(edge) * 0x1p-22);
                }
            }
            if (j == 1 && g == 0) {
                assert_true(has_zero);
                if (bits == 4) assert_true(s == 0.125f && dg[5] == 0.0f);
            }
        }
    free(x);
    kv_free(&kv);
}

static void test_quantizer_rules(void **st) {
    (void)st;
    for (size_t b = 0; b < 2; b++)
        for (size_t g = 0; g < 3; g++)
            for (int D = 128; D <= 256; D += 128) check_rules(BITS[b], GROUPS[g], D);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_quantizer_rules),
        cmocka_unit_test(test_bf16_rows),
        cmocka_unit_test(test_fast_vs_scalar),
        cmocka_unit_test(test_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
