/* MLX affine quantization (model-spec §2.6), code packing (§2.2) and the
 * safetensors writer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"
#include "model/st_write.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"

static const int BITS[] = {2, 3, 4, 5, 6, 8};
static const int GROUPS[] = {32, 64, 128};

static uint64_t rng_state = 0x1234567887654321ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
/* bf16-representable value, uniform in [lo, hi). */
static float rnd_bf16(float lo, float hi) {
    float u = (float)(rng_u32() >> 8) / 16777216.0f;
    return osp_bf16_to_f32(osp_f32_to_bf16(lo + (hi - lo) * u));
}

static void test_round_away(void **state) {
    (void)state;
    static const float half[][2] = {{0.5f, 1}, {1.5f, 2}, {2.5f, 3}, {-0.5f, -1}, {-2.5f, -3},
                                    {0.49999997f, 0}, {-0.49999997f, -0}, {6.5f, 7},
                                    {8388607.5f, 8388608.0f}, {1e30f, 1e30f}};
    for (size_t i = 0; i < sizeof half / sizeof half[0]; i++)
        assert_true(osp_round_away(half[i][0]) == half[i][1]);
    for (int i = 0; i < 200000; i++) {
        float v = rnd_bf16(-300.0f, 300.0f) + (float)(rng_u32() % 4) * 0.25f;
        uint32_t r = rng_u32();
        if (r & 1) v = (float)((int)v) + ((r & 2) ? 0.5f : -0.5f); /* exact halves */
        assert_true(osp_round_away(v) == roundf(v));
    }
    assert_true(isnan(osp_round_away(NAN)));
    assert_true(osp_round_away(-INFINITY) == -INFINITY);
}

static void test_check_args(void **state) {
    (void)state;
    float x[256] = {0};
    uint8_t codes[256];
    uint16_t s[8], b[8];
    for (int bits = 0; bits <= 9; bits++) {
        int ok = bits >= 2 && bits <= 8 && bits != 7;
        assert_int_equal(osp_quantize_row(x, 64, bits, 64, codes, s, b),
                         ok ? OSP_OK : OSP_ERR_INVALID);
    }
    assert_true(strstr(osp_last_error(), "bits") != NULL);
    assert_int_equal(osp_quantize_row(x, 64, 4, 16, codes, s, b), OSP_ERR_INVALID);
    assert_int_equal(osp_quantize_row(x, 96, 4, 64, codes, s, b), OSP_ERR_INVALID);
    assert_int_equal(osp_quantize_row(x, 0, 4, 64, codes, s, b), OSP_ERR_INVALID);
    assert_int_equal(osp_quantize_row(x, 256, 8, 128, codes, s, b), OSP_OK);
}

/* Pack random codes of every width and read them back with osp_q_code,
 * including lengths that end mid-byte. */
static void test_pack_roundtrip(void **state) {
    (void)state;
    uint8_t codes[1000], packed[1000];
    for (size_t bi = 0; bi < 6; bi++) {
        int bits = BITS[bi];
        for (int n = 1; n <= 300; n += 7) {
            for (int k = 0; k < n; k++) codes[k] = (uint8_t)(rng_u32() & ((1u << bits) - 1));
            size_t nb = ((size_t)n * bits + 7) / 8;
            memset(packed, 0xEE, sizeof packed);
            osp_pack_codes(codes, n, bits, packed);
            for (int k = 0; k < n; k++)
                assert_int_equal(osp_q_code(packed, bits, k), codes[k]);
            assert_int_equal(packed[nb], 0xEE); /* wrote nothing past the end */
            if ((n * bits) % 8) /* unused high bits of the last byte are zero */
                assert_int_equal(packed[nb - 1] >> ((n * bits) % 8), 0);
        }
    }
    /* §2.2: 4-bit code 8w+j is (word[w] >> 4j) & 0xF, words little-endian. */
    uint8_t c4[16];
    for (int k = 0; k < 16; k++) c4[k] = (uint8_t)k;
    osp_pack_codes(c4, 16, 4, packed);
    uint32_t w0, w1;
    memcpy(&w0, packed, 4);
    memcpy(&w1, packed + 4, 4);
    assert_int_equal(w0, 0x76543210u);
    assert_int_equal(w1, 0xFEDCBA98u);
    /* 3-bit: 8 codes in 3 bytes, LSB first. */
    uint8_t c3[8] = {1, 2, 3, 4, 5, 6, 7, 0};
    osp_pack_codes(c3, 8, 3, packed);
    uint32_t stream = 0;
    for (int k = 0; k < 8; k++) stream |= (uint32_t)c3[k] << (3 * k);
    assert_int_equal(packed[0], stream & 0xFF);
    assert_int_equal(packed[1], (stream >> 8) & 0xFF);
    assert_int_equal(packed[2], (stream >> 16) & 0xFF);
}

/* Quantize rows for every bits × group, unpack with osp_q_code, compare
 * with the unpacked codes, and bound the dequantization error. */
static void test_quant_roundtrip(void **state) {
    (void)state;
    enum { N = 3 * 128 * 2 };
    float x[N];
    uint8_t packed[N], codes[128];
    uint16_t sc[N / 32], bs[N / 32];
    for (size_t bi = 0; bi < 6; bi++) {
        for (size_t gi = 0; gi < 3; gi++) {
            int bits = BITS[bi], g = GROUPS[gi];
            const float n_bins = (float)((1 << bits) - 1);
            for (int trial = 0; trial < 40; trial++) {
                /* Mix of ranges: symmetric, all-positive, all-negative, tiny. */
                float lo = -1.0f, hi = 1.0f;
                switch (trial % 5) {
                case 1: lo = 0.1f; hi = 3.0f; break;
                case 2: lo = -2.0f; hi = -0.5f; break;
                case 3: lo = -0.02f; hi = 0.05f; break;
                case 4: lo = -1e-6f; hi = 1e-6f; break;
                }
                for (int i = 0; i < N; i++) x[i] = rnd_bf16(lo, hi);
                assert_int_equal(osp_quantize_row(x, N, bits, g, packed, sc, bs), OSP_OK);
                for (int gr = 0; gr < N / g; gr++) {
                    float s, b;
                    osp_quantize_group(x + gr * g, g, bits, codes, &s, &b);
                    assert_int_equal(sc[gr], osp_f32_to_bf16(s));
                    assert_int_equal(bs[gr], osp_f32_to_bf16(b));
                    for (int j = 0; j < g; j++) {
                        int64_t k = (int64_t)gr * g + j;
                        uint32_t q = osp_q_code(packed, bits, k);
                        assert_int_equal(q, codes[j]);
                        assert_true(q <= (uint32_t)n_bins);
                        /* Within half a step, except where a group's far
                         * end needed code n_bins+1 and was clamped: the
                         * q0 adjustment can shrink |s| by up to 1/n_bins. */
                        double err = fabs((double)s * q + b - x[k]);
                        double tol = fabs(s) * (q == (uint32_t)n_bins ? 1.0 : 0.5) * (1 + 1e-5) +
                                     fabs(x[k]) * 1e-6 + 1e-12;
                        assert_true(err <= tol);
                        /* Stored bf16 scale and bias: within one step. */
                        float sd = osp_bf16_to_f32(sc[gr]), bd = osp_bf16_to_f32(bs[gr]);
                        double err16 = fabs((double)sd * q + bd - x[k]);
                        assert_true(err16 <= fabs(s) * (1.0 + n_bins / 256.0) + fabs(b) / 256.0 +
                                                 1e-12);
                    }
                }
            }
        }
    }
}

/* A group that straddles 0: 0.0 maps to code -q0 and s·(-q0) + b is 0 up
 * to f32 rounding of s = edge/q0 (exactly 0 in real arithmetic). */
static void test_zero_representable(void **state) {
    (void)state;
    float x[64];
    uint8_t codes[64];
    for (int trial = 0; trial < 2000; trial++) {
        int bits = BITS[trial % 6];
        const float n_bins = (float)((1 << bits) - 1);
        for (int i = 0; i < 64; i++) x[i] = rnd_bf16(-1.0f - trial % 7, 1.0f + trial % 3);
        x[trial % 64] = 0.0f;
        float s, b;
        osp_quantize_group(x, 64, bits, codes, &s, &b);
        /* Recompute q0 from the first steps of §2.6. */
        float w_max = 0, w_min = x[0];
        for (int i = 0; i < 64; i++) {
            w_max = fmaxf(w_max, x[i]);
            w_min = fminf(w_min, x[i]);
        }
        float s0 = fmaxf((w_max - w_min) / n_bins, 1e-7f);
        int side = fabsf(w_min) > fabsf(w_max);
        if (!side) s0 = -s0;
        float edge = side ? w_min : w_max;
        float q0 = roundf(edge / s0);
        assert_true(q0 != 0.0f);
        assert_true(b == edge);
        assert_true(s == edge / q0);
        int qz = codes[trial % 64];
        assert_int_equal(qz, (int)-q0);
        assert_true(fabs((double)s * qz + b) <= fabs(edge) * 1e-6);
        /* bf16 bias is exact: edge is one of the (bf16) inputs. */
        assert_true(osp_bf16_to_f32(osp_f32_to_bf16(b)) == b);
    }
}

/* When |w_max| >= |w_min| the scale is negative and the bias is w_max;
 * all-negative groups use w_max = 0 (the GPU accumulator starts at 0). */
static void test_negative_scale(void **state) {
    (void)state;
    float x[32];
    uint8_t codes[32];
    float s, b;
    for (int i = 0; i < 32; i++) x[i] = (float)(i % 9) * 0.25f - 0.5f; /* [-0.5, 1.5] */
    osp_quantize_group(x, 32, 4, codes, &s, &b);
    assert_true(s < 0.0f);
    assert_true(b == 1.5f);
    for (int i = 0; i < 32; i++)
        if (x[i] == 1.5f) assert_int_equal(codes[i], 0);
    /* Ties go to the max side too: |w_min| == |w_max|. */
    for (int i = 0; i < 32; i++) x[i] = i % 2 ? 1.0f : -1.0f;
    osp_quantize_group(x, 32, 4, codes, &s, &b);
    assert_true(s < 0.0f && b == 1.0f);
    /* All-negative: w_max = 0, side true, scale positive, bias = w_min. */
    for (int i = 0; i < 32; i++) x[i] = -1.0f - (float)i / 32.0f;
    osp_quantize_group(x, 32, 4, codes, &s, &b);
    assert_true(s > 0.0f);
    assert_true(b == x[31]);
    assert_int_equal(codes[31], 0);
    /* All zeros: scale = -1e-7 (clamped, then negated), bias 0, codes 0. */
    memset(x, 0, sizeof x);
    osp_quantize_group(x, 32, 8, codes, &s, &b);
    assert_true(s == -1e-7f && b == 0.0f);
    for (int i = 0; i < 32; i++) assert_int_equal(codes[i], 0);
}

/* Half-away-from-zero on exact halves (the CPU path's rint would differ).
 * bits 2 (n_bins 3), x = {-3, 0, -0.5, -2.5, -1.5, 0...}:
 *   w_max = 0, w_min = -3, scale = 3/3 = 1; |w_min| > |w_max| so side,
 *   scale stays +1; edge = -3, q0 = round(-3/1) = -3 ≠ 0, so
 *   scale = -3/-3 = 1, bias = -3. Codes = round(x + 3):
 *   -3 → 0, 0 → 3, -0.5 → round(2.5) = 3 (rint: 2), -2.5 → round(0.5) = 1
 *   (rint: 0), -1.5 → round(1.5) = 2. */
static void test_half_away(void **state) {
    (void)state;
    float x[32] = {-3.0f, 0.0f, -0.5f, -2.5f, -1.5f};
    uint8_t codes[32];
    float s, b;
    osp_quantize_group(x, 32, 2, codes, &s, &b);
    assert_true(s == 1.0f && b == -3.0f);
    assert_int_equal(codes[0], 0);
    assert_int_equal(codes[1], 3);
    assert_int_equal(codes[2], 3);
    assert_int_equal(codes[3], 1);
    assert_int_equal(codes[4], 2);
    for (int i = 5; i < 32; i++) assert_int_equal(codes[i], 3);
}

/* Hand-computed, 4 bits (n_bins 15), group 32,
 * x = {-1.5, 0.75, 0.1f, 0, 0, ...}; f32 arithmetic throughout:
 *  1. w_max = max(0, 0.75) = 0.75, w_min = -1.5.
 *  2. scale = 2.25/15 = 0.15f (0.150000006).
 *  3. |-1.5| > |0.75|: side, scale stays positive.
 *  4. edge = -1.5; -1.5/0.15f = -9.9999996 → f32 -10.0 (ulp there 9.5e-7);
 *     q0 = -10.
 *  5. q0 ≠ 0: scale = -1.5/-10 = 0.15f, bias = -1.5.
 *  6. codes = round((x + 1.5)/0.15f):
 *     -1.5 → 0;
 *     0.75 → 2.25/0.15f = 14.99999940 → f32 14.999999 → 15 (= n_bins);
 *     0.1f → (1.6000000015 → f32 1.6f)/0.15f = 10.6667 → 11;
 *     0    → 1.5/0.15f → 10.0 → 10.
 *  bf16: scale 0x3E19999A rounds up to 0x3E1A (0.150390625); bias -1.5 is
 *  0xBFC0. Packed: byte0 = 0 | 15<<4 = 0xF0, byte1 = 11 | 10<<4 = 0xAB,
 *  then 0xAA for the remaining pairs of zeros (code 10 each). */
static void test_hand_example(void **state) {
    (void)state;
    float x[32] = {-1.5f, 0.75f, 0.1f};
    uint8_t packed[16];
    uint16_t sc, bs;
    assert_int_equal(osp_quantize_row(x, 32, 4, 32, packed, &sc, &bs), OSP_OK);
    assert_int_equal(sc, 0x3E1A);
    assert_int_equal(bs, 0xBFC0);
    assert_int_equal(packed[0], 0xF0);
    assert_int_equal(packed[1], 0xAB);
    for (int i = 2; i < 16; i++) assert_int_equal(packed[i], 0xAA);
    uint8_t codes[32];
    float s, b;
    osp_quantize_group(x, 32, 4, codes, &s, &b);
    assert_true(s == 0.15f && b == -1.5f);
}

/* ---------- safetensors writer ---------- */

typedef struct fill_log {
    int calls;
    int64_t next_row[8];
} fill_log;

/* Tensor i, element e (as bytes): (i*31 + byte index) & 0xFF. */
static osp_status fill_pattern(void *ctx, int64_t index, int64_t row0, int64_t nrows, void *buf,
                               size_t nbytes) {
    fill_log *log = ctx;
    log->calls++;
    assert_int_equal(row0, log->next_row[index]); /* in order, no gaps */
    log->next_row[index] = row0 + nrows;
    size_t row_bytes = nbytes / (size_t)nrows;
    for (size_t k = 0; k < nbytes; k++)
        ((uint8_t *)buf)[k] = (uint8_t)(index * 31 + (size_t)row0 * row_bytes + k);
    return OSP_OK;
}

static osp_status fill_fail(void *ctx, int64_t index, int64_t row0, int64_t nrows, void *buf,
                            size_t nbytes) {
    return osp_err(OSP_ERR_INTERNAL, "fill refused tensor %lld", (long long)index);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)len + 1);
    *n = fread(d, 1, (size_t)len, f);
    fclose(f);
    return d;
}

static void test_st_writer(void **state) {
    (void)state;
    char path[] = "/tmp/osp_test_stw_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);

    uint16_t dense[3 * 5];
    for (int i = 0; i < 15; i++) dense[i] = osp_f32_to_bf16((float)i);
    float scalar = 2.5f;
    osp_st_writer *w = osp_st_writer_new();
    assert_non_null(w);
    assert_int_equal(osp_st_writer_set_meta(w, "format", "mlx"), OSP_OK);
    int64_t s0[2] = {3, 5}, s1[2] = {1000, 3}, s2[1] = {7}, s3[2] = {0, 4};
    assert_int_equal(osp_st_writer_add(w, "a.weight", OSP_DT_BF16, 2, s0, dense, sizeof dense),
                     OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "b.weight", OSP_DT_U32, 2, s1, NULL, 1000 * 3 * 4),
                     OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "c.bias", OSP_DT_U8, 1, s2, NULL, 7), OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "empty", OSP_DT_F32, 2, s3, NULL, 0), OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "scalar", OSP_DT_F32, 0, NULL, &scalar, 4), OSP_OK);
    /* Refusals. */
    assert_int_equal(osp_st_writer_add(w, "a.weight", OSP_DT_BF16, 2, s0, dense, sizeof dense),
                     OSP_ERR_INVALID);
    assert_true(strstr(osp_last_error(), "duplicate") != NULL);
    assert_int_equal(osp_st_writer_add(w, "x", OSP_DT_BF16, 2, s0, dense, 29), OSP_ERR_INVALID);
    assert_int_equal(osp_st_writer_add(w, "__metadata__", OSP_DT_U8, 1, s2, NULL, 7),
                     OSP_ERR_INVALID);
    assert_int_equal(osp_st_writer_add(w, "", OSP_DT_U8, 1, s2, NULL, 7), OSP_ERR_INVALID);
    assert_int_equal(osp_st_writer_count(w), 5);
    assert_int_equal(osp_st_writer_data_bytes(w), 30 + 12000 + 7 + 4);

    /* Streamed tensors without a callback, and a failing callback: error,
     * no file left behind. */
    assert_int_equal(osp_st_writer_write(w, path, NULL, NULL), OSP_ERR_INVALID);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(osp_st_writer_write(w, path, fill_fail, NULL), OSP_ERR_INTERNAL);
    assert_true(strstr(osp_last_error(), "refused") != NULL);
    assert_int_equal(access(path, F_OK), -1);

    osp_st_writer_set_chunk_bytes(w, 1000); /* 83 rows of b per chunk */
    fill_log log = {0};
    assert_int_equal(osp_st_writer_write(w, path, fill_pattern, &log), OSP_OK);
    assert_int_equal(log.next_row[1], 1000);
    assert_int_equal(log.next_row[2], 7);
    assert_int_equal(log.calls, (1000 + 82) / 83 + 1);

    size_t n;
    uint8_t *d = read_all(path, &n);
    assert_non_null(d);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)d[i] << (8 * i);
    assert_int_equal(hlen % 8, 0);
    assert_int_equal(n, 8 + hlen + 30 + 12000 + 7 + 4);
    json_error_t je;
    json_t *h = json_loadb((const char *)d + 8, hlen, 0, &je);
    assert_non_null(h);
    assert_string_equal(json_string_value(json_object_get(json_object_get(h, "__metadata__"),
                                                          "format")),
                        "mlx");
    assert_int_equal(json_object_size(h), 6);
    static const struct {
        const char *name, *dtype;
        int ndim;
        int64_t shape[2], begin, end;
    } want[] = {{"a.weight", "BF16", 2, {3, 5}, 0, 30},
                {"b.weight", "U32", 2, {1000, 3}, 30, 12030},
                {"c.bias", "U8", 1, {7}, 12030, 12037},
                {"empty", "F32", 2, {0, 4}, 12037, 12037},
                {"scalar", "F32", 0, {0}, 12037, 12041}};
    const uint8_t *data = d + 8 + hlen;
    for (int t = 0; t < 5; t++) {
        json_t *e = json_object_get(h, want[t].name);
        assert_non_null(e);
        assert_string_equal(json_string_value(json_object_get(e, "dtype")), want[t].dtype);
        json_t *shape = json_object_get(e, "shape");
        assert_int_equal(json_array_size(shape), want[t].ndim);
        for (int k = 0; k < want[t].ndim; k++)
            assert_int_equal(json_integer_value(json_array_get(shape, k)), want[t].shape[k]);
        json_t *off = json_object_get(e, "data_offsets");
        assert_int_equal(json_integer_value(json_array_get(off, 0)), want[t].begin);
        assert_int_equal(json_integer_value(json_array_get(off, 1)), want[t].end);
        if (t == 1 || t == 2)
            for (int64_t k = 0; k < want[t].end - want[t].begin; k++)
                assert_int_equal(data[want[t].begin + k], (uint8_t)(t * 31 + k));
    }
    assert_memory_equal(data, dense, sizeof dense);
    assert_memory_equal(data + 12037, &scalar, 4);
    json_decref(h);
    free(d);
    osp_st_writer_free(w);
    remove(path);
}

/* A quantized tensor through the writer reads back via osp_weight_row_f32. */
static void test_st_quantized_tensor(void **state) {
    (void)state;
    enum { ROWS = 5, COLS = 192, G = 64, BITS_ = 6 };
    float x[ROWS][COLS];
    uint8_t codes[ROWS][COLS * BITS_ / 8];
    uint16_t sc[ROWS][COLS / G], bs[ROWS][COLS / G];
    for (int r = 0; r < ROWS; r++) {
        for (int c = 0; c < COLS; c++) x[r][c] = rnd_bf16(-0.1f, 0.1f);
        assert_int_equal(osp_quantize_row(x[r], COLS, BITS_, G, codes[r], sc[r], bs[r]), OSP_OK);
    }
    char path[] = "/tmp/osp_test_stq_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    osp_st_writer *w = osp_st_writer_new();
    int64_t sw[2] = {ROWS, COLS * BITS_ / 32}, ss[2] = {ROWS, COLS / G};
    assert_int_equal(osp_st_writer_add(w, "l.weight", OSP_DT_U32, 2, sw, codes, sizeof codes),
                     OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "l.scales", OSP_DT_BF16, 2, ss, sc, sizeof sc), OSP_OK);
    assert_int_equal(osp_st_writer_add(w, "l.biases", OSP_DT_BF16, 2, ss, bs, sizeof bs), OSP_OK);
    assert_int_equal(osp_st_writer_write(w, path, NULL, NULL), OSP_OK);
    osp_st_writer_free(w);
    size_t n;
    uint8_t *d = read_all(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)d[i] << (8 * i);
    const uint8_t *data = d + 8 + hlen;
    osp_weight wt = {.dtype = OSP_DT_U32, .rows = ROWS, .cols = COLS, .data = data,
                     .qbits = BITS_, .group = G, .sdtype = OSP_DT_BF16,
                     .scales = data + sizeof codes, .biases = data + sizeof codes + sizeof sc};
    float row[COLS];
    for (int r = 0; r < ROWS; r++) {
        osp_weight_row_f32(&wt, r, row);
        for (int c = 0; c < COLS; c++) {
            float s = osp_bf16_to_f32(sc[r][c / G]), b = osp_bf16_to_f32(bs[r][c / G]);
            assert_true(row[c] == s * (float)osp_q_code(codes[r], BITS_, c) + b);
            assert_true(fabsf(row[c] - x[r][c]) <= 1.1f * fabsf(s) + 1e-6f);
        }
    }
    free(d);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_away),
        cmocka_unit_test(test_check_args),
        cmocka_unit_test(test_pack_roundtrip),
        cmocka_unit_test(test_quant_roundtrip),
        cmocka_unit_test(test_zero_representable),
        cmocka_unit_test(test_negative_scale),
        cmocka_unit_test(test_half_away),
        cmocka_unit_test(test_hand_example),
        cmocka_unit_test(test_st_writer),
        cmocka_unit_test(test_st_quantized_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
