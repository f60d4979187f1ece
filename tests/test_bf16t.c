/* The bf16 weights' production path (backend/cpu/bf16t.h), each engine this
 * CPU has: the AVX512-BF16 packing bitwise the scalar one's; the kernel
 * against its scalar twin, for 1..40 tokens, row ranges that start and end
 * anywhere on 16-row boundaries and a weight's last rows: AMX's tiles within
 * a few ulps of the terms' sum (the hardware's rounding inside a step is its
 * own), the DOT engine bitwise (VDPBF16PS's definition, where the CPU follows it; else within ulps too); a token's outputs
 * the same alone and among any number (batch invariance); 8-bit weights'
 * dequantization bitwise its twin; repacked 4-bit tiles' dequantization
 * (the twin against s * c + b from the MLX layout, the AVX-512 form
 * bitwise the twin) and their product on each engine; and both twins against the f64 product
 * of the bf16 operands. An engine the CPU lacks is skipped; the twins'
 * checks run everywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/bf16t.h"
#include "backend/q8act.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2 - 1; }

static float bf16f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct wcase {
    osp_weight w;
    uint16_t *data;
    float *x;
} wcase;

static void make(wcase *c, int64_t rows, int64_t cols, int64_t n) {
    memset(c, 0, sizeof *c);
    c->data = malloc(sizeof(uint16_t) * rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) {
        float f = frand() * 0.5f;
        uint32_t u;
        memcpy(&u, &f, 4);
        c->data[i] = (uint16_t)(u >> 16);
    }
    c->x = malloc(sizeof(float) * n * cols);
    for (int64_t i = 0; i < n * cols; i++) c->x[i] = frand() * 3;
    c->w.dtype = OSP_DT_BF16, c->w.rows = rows, c->w.cols = cols, c->w.data = c->data;
}

static void drop(wcase *c) { free(c->data), free(c->x); }

/* the scalar twin against the f64 sum of the same bf16 products */
static void twin(osp_bf16t_kind k) {
    wcase c;
    const int64_t R = 40, C = 96, n = 5;
    make(&c, R, C, n);
    uint16_t *xp = malloc(osp_bf16t_packed_bytes(n, C));
    float *y = malloc(sizeof(float) * n * R);
    osp_bf16t_pack(k, c.x, n, C, xp);
    osp_bf16t_ref(k, &c.w, xp, n, y, R, 0, R);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = 0; r < R; r++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < C; k++) {
                uint32_t u;
                memcpy(&u, &c.x[t * C + k], 4);
                u += 0x7fffu + ((u >> 16) & 1); /* (no denormals or NaN here) */
                double p = (double)bf16f((uint16_t)(u >> 16)) * bf16f(c.data[r * C + k]);
                s += p, a += fabs(p);
            }
            if (fabs(y[t * R + r] - s) > 1e-6 * a + 1e-30)
                fail_msg("%s twin: token %ld row %ld: %g vs %g", osp_bf16t_name(k), (long)t, (long)r, y[t * R + r], s);
        }
    assert_true(osp_bf16t_fits(&c.w));
    free(xp), free(y);
    drop(&c);
}

static void test_twin(void **state) {
    (void)state;
    twin(OSP_BF16T_AMX);
    twin(OSP_BF16T_DOT);
}

static void kernel(osp_bf16t_kind k) {
    /* (4160 columns: long rows, passes of 2048 + 2048 + 64 for 12 tokens or more; 53 tokens: two blocks of held sums) */
    const int64_t shapes[][2] = {{16, 32}, {45, 64}, {70, 256}, {128, 96}, {33, 2048}, {300, 512}, {70, 4160}};
    const int64_t ns[] = {1, 2, 7, 15, 16, 17, 31, 32, 33, 40, 53};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1], nmax = 53;
        wcase c;
        make(&c, R, C, nmax);
        c.x[3] = NAN, c.x[C + 5] = INFINITY, c.x[2 * C + 7] = 1e-40f, c.x[2 * C + 8] = -1e-40f; /* NaN, inf, denormals */
        uint16_t *xp = malloc(osp_bf16t_packed_bytes(nmax, C)), *xq = malloc(osp_bf16t_packed_bytes(nmax, C));
        float *y = malloc(sizeof(float) * nmax * R), *yr = malloc(sizeof(float) * nmax * R),
              *y1 = malloc(sizeof(float) * R);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            const int64_t n = ns[ni];
            osp_bf16t_pack(k, c.x, n, C, xp);
            memset(xq, 0xa5, osp_bf16t_packed_bytes(n, C));
            osp_bf16t_pack_fast(k, c.x, n, C, xq, 0, C / 32 / 2);
            osp_bf16t_pack_fast(k, c.x, n, C, xq, C / 32 / 2, C / 32);
            if (memcmp(xp, xq, osp_bf16t_packed_used(k, n, C)))
                fail_msg("%s pack: %ld x %ld: the AVX512-BF16 packing differs", osp_bf16t_name(k), (long)n, (long)C);
            /* whole rows, then ranges that start on 16-row boundaries */
            for (int64_t r0 = 0; r0 < R; r0 += 48) {
                int64_t r1 = r0 + 48 < R ? r0 + 48 : R;
                if (r0 == 0) r1 = R;
                for (int64_t i = 0; i < n * R; i++) y[i] = yr[i] = -7;
                osp_bf16t_mm(k, &c.w, xp, n, y, R, r0, r1);
                osp_bf16t_ref(k, &c.w, xp, n, yr, R, r0, r1);
                for (int64_t t = 0; t < n; t++)
                    for (int64_t r = 0; r < r1 - r0; r++) {
                        float a = y[t * R + r], b = yr[t * R + r];
                        /* AMX rounds inside a tile step in its own way (measured: neither the definition's
                         * sequential order nor a pair or 32-column sum rounded once): within a few units in the
                         * last place of the terms' magnitude; VDPBF16PS, where it follows its definition (probed: Zen 5 does), bitwise */
                        double mag = 0;
                        for (int64_t q = 0; q < C; q++) mag += fabs((double)bf16f(c.data[(r0 + r) * C + q]) * c.x[t * C + q]);
                        const double tol = k == OSP_BF16T_AMX || !osp_bf16t_dot_exact() ? 4e-7 * mag : 0;
                        if (isnan(a) != isnan(b) || (!isnan(a) && fabs((double)a - b) > tol))
                            fail_msg("%s %ld x %ld, %ld tokens, rows %ld..%ld: token %ld row %ld: %.9g vs twin %.9g",
                                     osp_bf16t_name(k), (long)R, (long)C, (long)n, (long)r0, (long)r1, (long)t,
                                     (long)(r0 + r), a, b);
                    }
            }
            /* each token as alone */
            osp_bf16t_mm(k, &c.w, xp, n, y, R, 0, R);
            for (int64_t t = 0; t < n; t += n > 9 ? 7 : 1) {
                uint16_t *x1 = malloc(osp_bf16t_packed_bytes(1, C));
                osp_bf16t_pack_fast(k, c.x + t * C, 1, C, x1, 0, C / 32);
                osp_bf16t_mm(k, &c.w, x1, 1, y1, R, 0, R);
                if (memcmp(y1, y + t * R, sizeof(float) * R)) {
                    int nan_eq = 1;
                    for (int64_t r = 0; r < R; r++)
                        if (!(isnan(y1[r]) && isnan(y[t * R + r])) && memcmp(&y1[r], &y[t * R + r], 4)) nan_eq = 0;
                    if (!nan_eq)
                        fail_msg("%s %ld x %ld: token %ld differs alone and among %ld", osp_bf16t_name(k), (long)R,
                                 (long)C, (long)t, (long)n);
                }
                free(x1);
            }
        }
        free(xp), free(xq), free(y), free(yr), free(y1);
        drop(&c);
    }
}

static void test_amx(void **state) {
    (void)state;
    if (!osp_bf16t_has(OSP_BF16T_AMX)) skip();
    kernel(OSP_BF16T_AMX);
}

static void test_dot(void **state) {
    (void)state;
    if (!osp_bf16t_has(OSP_BF16T_DOT)) skip();
    if (!osp_bf16t_dot_exact())
        printf("  (this CPU's VDPBF16PS rounds within a pair its own way: the kernel is held to its twin within ulps)\n");
    kernel(OSP_BF16T_DOT);
}

/* 8-bit weights (prefill chunks): the AVX-512 dequantization is bitwise the scalar twin's (s * c + b as one
 * fma, rounded to bf16), so each engine's product equals its bf16 kernel on the twin's dequantized rows */
static void q8(osp_bf16t_kind k, int64_t R, int64_t C) {
    const int64_t G = 64, ng = C / G, n = 20;
    uint8_t *codes = malloc(R * C);
    uint16_t *sc = malloc(sizeof(uint16_t) * R * ng), *bi = malloc(sizeof(uint16_t) * R * ng);
    for (int64_t i = 0; i < R * C; i++) codes[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < R * ng; i++) {
        float s = 0.01f + 0.02f * (frand() + 1), b = frand();
        uint32_t u, v;
        memcpy(&u, &s, 4), memcpy(&v, &b, 4);
        sc[i] = (uint16_t)(u >> 16), bi[i] = (uint16_t)(v >> 16);
    }
    osp_weight q;
    memset(&q, 0, sizeof q);
    q.qbits = 8, q.group = G, q.sdtype = OSP_DT_BF16, q.rows = R, q.cols = C, q.data = codes, q.scales = sc, q.biases = bi;
    assert_true(osp_q8t_fits(&q));
    uint16_t *deq = malloc(sizeof(uint16_t) * R * C), *dq = malloc(sizeof(uint16_t) * osp_bf16t_dq_elems(C));
    for (int64_t r = 0; r < R; r++) osp_q8t_row_ref(&q, r, deq + r * C);
    osp_weight d;
    memset(&d, 0, sizeof d);
    d.dtype = OSP_DT_BF16, d.rows = R, d.cols = C, d.data = deq;
    float *x = malloc(sizeof(float) * n * C), *y = malloc(sizeof(float) * n * R), *yd = malloc(sizeof(float) * n * R);
    for (int64_t i = 0; i < n * C; i++) x[i] = frand() * 2;
    uint16_t *xp = malloc(osp_bf16t_packed_bytes(n, C)), *row = malloc(sizeof(uint16_t) * C);
    for (int64_t r = 0; r < R; r++) {
        osp_q8t_row_fast(&q, r, row);
        if (memcmp(row, deq + r * C, sizeof(uint16_t) * C)) fail_msg("q8 row %ld: the AVX-512 dequantization differs", (long)r);
    }
    free(row);
    osp_bf16t_pack(k, x, n, C, xp);
    for (int64_t r0 = 0; r0 < R; r0 += 16) {
        osp_q8t_mm(k, &q, xp, n, y, R, r0, R, dq);
        osp_bf16t_mm(k, &d, xp, n, yd, R, r0, R);
        for (int64_t t = 0; t < n; t++)
            if (memcmp(y + t * R, yd + t * R, sizeof(float) * (size_t)(R - r0)))
                fail_msg("%s q8, rows %ld..: token %ld differs from the twin's dequantization", osp_bf16t_name(k),
                         (long)r0, (long)t);
    }
    free(codes), free(sc), free(bi), free(deq), free(dq), free(x), free(y), free(yd), free(xp);
}

static void test_q8(void **state) {
    (void)state;
    int any = 0;
    for (osp_bf16t_kind k = OSP_BF16T_AMX; k <= OSP_BF16T_DOT; k++)
        if (osp_bf16t_has(k)) q8(k, 45, 256), q8(k, 300, 4096), any = 1; /* (4096: more than one group of rows) */
    if (!any) skip();
}

/* f32 -> bf16, round to nearest even (the test's own: finite values only) */
static uint16_t rne16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* 4-bit weights (prefill chunks on AMX): the repacked tiles dequantized by the twin equal s * c + b (one fma,
 * rounded to bf16) computed from the MLX layout, the AVX-512 form bitwise the twin, and each engine's product
 * the bf16 kernel's on those rows; rows past the weight's end come out zero. bf16 and f16 scales. */
static void q4(osp_bf16t_kind k, int f16, int64_t R, int64_t C) {
    const int64_t G = 64, ng = C / G, n = 20, tiles = (R + 15) / 16;
    uint8_t *codes = malloc(R * C / 2);
    uint16_t *sc = malloc(sizeof(uint16_t) * R * ng), *bi = malloc(sizeof(uint16_t) * R * ng);
    for (int64_t i = 0; i < R * C / 2; i++) codes[i] = (uint8_t)rnd();
    for (int64_t i = 0; i < R * ng; i++) {
        float s = 0.01f + 0.02f * (frand() + 1), b = frand();
        if (f16) {
            sc[i] = osp_f32_to_f16(s), bi[i] = osp_f32_to_f16(b);
        } else {
            uint32_t u, v;
            memcpy(&u, &s, 4), memcpy(&v, &b, 4);
            sc[i] = (uint16_t)(u >> 16), bi[i] = (uint16_t)(v >> 16);
        }
    }
    osp_weight q;
    memset(&q, 0, sizeof q);
    q.qbits = 4, q.group = G, q.sdtype = f16 ? OSP_DT_F16 : OSP_DT_BF16, q.rows = R, q.cols = C, q.data = codes;
    q.scales = sc, q.biases = bi;
    void *packed = aligned_alloc(64, (osp_q4pack_bytes(&q) + 63) & ~(size_t)63);
    osp_q4pack(&q, packed, 0, tiles);
    q.packed = packed;
    assert_true(osp_q4t_fits(&q));
    /* the MLX layout's rows, dequantized here */
    uint16_t *deq = calloc((size_t)(tiles * 16 * C), sizeof(uint16_t));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            const int code = (codes[r * C / 2 + c / 2] >> (4 * (c & 1))) & 15;
            const float s = osp_load_float(sc, q.sdtype, r * ng + c / G), b = osp_load_float(bi, q.sdtype, r * ng + c / G);
            deq[r * C + c] = rne16(fmaf(s, (float)code, b));
        }
    uint16_t *tr = malloc(sizeof(uint16_t) * 16 * C), *tf = malloc(sizeof(uint16_t) * 16 * C);
    for (int64_t t = 0; t < tiles; t++) {
        osp_q4t_tile_ref(&q, t, tr, C);
        if (memcmp(tr, deq + t * 16 * C, sizeof(uint16_t) * 16 * C))
            fail_msg("q4 tile %ld: the twin's dequantization differs from the MLX layout's", (long)t);
        if (osp_bf16t_has(OSP_BF16T_DOT)) {
            osp_q4t_tile_fast(&q, t, tf, C);
            if (memcmp(tf, tr, sizeof(uint16_t) * 16 * C)) fail_msg("q4 tile %ld: the AVX-512 dequantization differs", (long)t);
        }
    }
    osp_weight d;
    memset(&d, 0, sizeof d);
    d.dtype = OSP_DT_BF16, d.rows = R, d.cols = C, d.data = deq;
    float *x = malloc(sizeof(float) * n * C), *y = malloc(sizeof(float) * n * R), *yd = malloc(sizeof(float) * n * R);
    for (int64_t i = 0; i < n * C; i++) x[i] = frand() * 2;
    uint16_t *xp = malloc(osp_bf16t_packed_bytes(n, C)), *dq = malloc(sizeof(uint16_t) * osp_bf16t_dq_elems(C));
    osp_bf16t_pack(k, x, n, C, xp);
    for (int64_t r0 = 0; r0 < R && osp_bf16t_has(k); r0 += 16)
        for (int64_t r1 = r0 + 1; r1 <= R; r1 += R > 64 ? 29 : 7) {
            osp_q4t_mm(k, &q, xp, n, y, R, r0, r1, dq);
            osp_bf16t_mm(k, &d, xp, n, yd, R, r0, r1);
            for (int64_t t = 0; t < n; t++)
                if (memcmp(y + t * R, yd + t * R, sizeof(float) * (size_t)(r1 - r0)))
                    fail_msg("%s q4, rows %ld..%ld: token %ld differs from the twin's dequantization", osp_bf16t_name(k),
                             (long)r0, (long)r1, (long)t);
        }
    free(codes), free(sc), free(bi), free(packed), free(deq), free(tr), free(tf), free(dq), free(x), free(y), free(yd);
    free(xp);
}

static void test_q4(void **state) {
    (void)state;
    /* the dequantization's twin everywhere, the products on each engine the CPU has; 4096 columns: ranges
     * over more than one group of rows (osp_bf16t_group_rows) */
    for (osp_bf16t_kind k = OSP_BF16T_AMX; k <= OSP_BF16T_DOT; k++)
        for (int f16 = 0; f16 < 2; f16++) q4(k, f16, 45, 256);
    q4(OSP_BF16T_AMX, 0, 300, 4096);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_twin), cmocka_unit_test(test_amx),
                                       cmocka_unit_test(test_dot), cmocka_unit_test(test_q8),
                                       cmocka_unit_test(test_q4)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
