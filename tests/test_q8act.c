/* The int8-activation path for 4-bit weights (backend/q8act.h): the
 * AVX-512 tier against its scalar twin, bitwise (activation quantization,
 * and the matmul on the repacked layout against the reference on the MLX
 * layout, for any number of tokens and any row range), and the scalar twin
 * against the exact f32 product within the int8 rounding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/ops.h"
#include "backend/q8act.h"

static uint64_t rs = 0x1234567887654321ull;
static uint32_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2 - 1; }

#define MM_N 33 /* activations per case: the largest batch checked */

typedef struct mm_case {
    osp_weight w;
    unsigned char *codes;
    uint16_t *sc, *bi;
    void *packed;
    float *x;        /* [MM_N, cols] */
    void *mem;       /* the prepared activations' scratch */
    osp_q8act *acts; /* [MM_N] */
    float *yref;     /* [MM_N, rows] */
} mm_case;

static void mm_case_init(mm_case *c, int group, int64_t cols, int64_t rows, osp_dtype sdt) {
    int64_t ng = cols / group, rb = cols / 2;
    c->codes = malloc(rows * rb);
    c->sc = malloc(rows * ng * 2), c->bi = malloc(rows * ng * 2);
    for (int64_t i = 0; i < rows * rb; i++) c->codes[i] = (unsigned char)rnd();
    for (int64_t i = 0; i < rows * ng; i++) {
        float s = 0.01f + 0.02f * frand(), b = -0.1f * frand() - s * 8;
        if (i % 11 == 3) s = -s; /* negative scales exist (mx.quantize) */
        c->sc[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(s) : osp_f32_to_bf16(s);
        c->bi[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(b) : osp_f32_to_bf16(b);
    }
    c->w = (osp_weight){.dtype = OSP_DT_U32, .rows = rows, .cols = cols, .data = c->codes, .qbits = 4,
                        .group = group, .sdtype = sdt, .scales = c->sc, .biases = c->bi};
    assert_true(osp_q8act_supported(&c->w));
    size_t pb = osp_q4pack_bytes(&c->w);
    c->packed = aligned_alloc(64, (pb + 63) & ~(size_t)63);
    int64_t tiles = (rows + 15) / 16;
    osp_q4pack(&c->w, c->packed, 0, tiles / 2); /* in two ranges, as the loader's tasks do */
    osp_q4pack(&c->w, c->packed, tiles / 2, tiles);
    /* the layout byte by byte (q8act.h): per tile and group, 16 scales, 16 biases, then for every 8 columns
     * k.. a vector whose bytes 4l + j hold row l's codes k + j (low nibble) and k + 4 + j (high) */
    const int64_t seg = 64 + 8 * (int64_t)group;
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t g = 0; g < ng; g++) {
            const unsigned char *sg = (const unsigned char *)c->packed + (t * ng + g) * seg;
            for (int l = 0; l < 16; l++) {
                const int64_t r = t * 16 + l;
                uint16_t sc, bi;
                memcpy(&sc, sg + 2 * l, 2), memcpy(&bi, sg + 32 + 2 * l, 2);
                assert_int_equal(sc, r < rows ? c->sc[r * ng + g] : 0);
                assert_int_equal(bi, r < rows ? c->bi[r * ng + g] : 0);
                for (int64_t v = 0; v < group / 8; v++)
                    for (int j = 0; j < 4; j++) {
                        const int64_t k = g * group + v * 8 + j;
                        unsigned lo = 0, hi = 0;
                        if (r < rows) {
                            lo = (c->codes[r * rb + k / 2] >> (4 * (k & 1))) & 15u;
                            hi = (c->codes[r * rb + (k + 4) / 2] >> (4 * ((k + 4) & 1))) & 15u;
                        }
                        assert_int_equal(sg[64 + v * 64 + 4 * l + j], lo | hi << 4);
                    }
            }
        }
    c->w.packed = c->packed;
    size_t stride = (osp_q8act_bytes(cols) + 63) & ~(size_t)63;
    int np = (MM_N + 7) / 8;
    c->x = malloc(MM_N * cols * 4);
    c->mem = aligned_alloc(64, np * stride);
    c->acts = malloc(np * sizeof *c->acts);
    void *mem2 = aligned_alloc(64, stride), *mem3 = aligned_alloc(64, stride);
    for (int t = 0; t < MM_N; t++) {
        float amp = t == 5 ? 0.0f : 1.0f + (float)(t % 4) * 3; /* one all-zero activation: d = 0 */
        for (int64_t i = 0; i < cols; i++) c->x[t * cols + i] = amp * frand() * (i % 7 == t % 7 ? 4 : 1);
        if (t == 7) c->x[t * cols + 3] = 1e4f; /* one block dominated by an outlier */
    }
    /* The panels of a matmul over all MM_N tokens; mm_check builds its own
     * for other token ranges. The dispatched preparation is bitwise the
     * scalar one. */
    for (int p = 0; p < np; p++) {
        int width = MM_N - 8 * p < 8 ? MM_N - 8 * p : 8;
        osp_q8act r, h;
        const int64_t ng = cols / group, mid = ng / 3;
        osp_q8act_init(&c->acts[p], cols, group, width, (char *)c->mem + p * stride);
        osp_q8act_init(&r, cols, group, width, mem2);
        osp_q8act_init(&h, cols, group, width, mem3);
        for (int sl = 0; sl < width; sl++) {
            const float *x = c->x + (8 * p + sl) * cols;
            osp_q8act_prepare(&c->acts[p], sl, x);
            osp_q8act_prepare_ref(&r, sl, x, 0, ng);
            /* in two group ranges, the later one first (as threads may) */
            osp_q8act_prepare_groups(&h, sl, x, mid, ng);
            osp_q8act_prepare_groups(&h, sl, x, 0, mid);
        }
        const osp_q8act *got[2] = {&c->acts[p], &h};
        for (int k = 0; k < 2; k++) {
            assert_memory_equal(got[k]->xq, r.xq, cols * width);
            assert_memory_equal(got[k]->d, r.d, cols / 32 * width * 4);
            assert_memory_equal(got[k]->kg, r.kg, cols / group * width * 4);
            assert_memory_equal(got[k]->gsum, r.gsum, cols / group * width * 4);
        }
    }
    free(mem2);
    free(mem3);
    c->yref = malloc(MM_N * rows * 4);
    osp_q8act_matmul_ref(&c->w, c->acts, MM_N, c->yref, rows, 0, rows);
}

static void mm_case_free(mm_case *c) {
    free(c->codes), free(c->sc), free(c->bi), free(c->packed), free(c->x), free(c->mem), free(c->acts), free(c->yref);
}

/* The reference against the exact f32 product: the int8 rounding bound. */
static void check_accuracy(const mm_case *c) {
    const osp_weight *w = &c->w;
    float *row = malloc(w->cols * 4), *yf = malloc(w->rows * 4);
    for (int t = 0; t < MM_N; t += 4) {
        const float *x = c->x + t * w->cols;
        osp_ops_scalar()->matmul(w, x, 1, yf, w->rows, 0, w->rows);
        for (int64_t r = 0; r < w->rows; r++) {
            osp_weight_row_f32(w, r, row);
            double mag = 0, mag_q = 0;
            for (int64_t k = 0; k < w->cols; k++) {
                mag += fabs(x[k] * row[k]);
                mag_q += fabs(row[k]) * c->acts[t / 8].d[k / 32 * c->acts[t / 8].width + t % 8] * 0.5;
            }
            float got = c->yref[t * w->rows + r];
            if (fabs(got - yf[r]) > mag_q + 1e-5 * mag)
                fail_msg("group %d cols %ld row %ld act %d: int8 path %g vs f32 %g (bound %g)", w->group,
                         (long)w->cols, (long)r, t, got, yf[r], mag_q);
        }
    }
    free(row), free(yf);
}

/* matmul(tokens [t0, t0 + n), rows [r0, r1)) against the reference, bitwise,
 * with a row stride wider than the range so stray writes show. */
static void mm_check(const mm_case *c, osp_q8act_mm_fn mm, const char *tier, int64_t t0, int64_t n, int64_t r0,
                     int64_t r1) {
    int64_t m = r1 - r0, ldy = m + 3, R = c->w.rows, C = c->w.cols;
    /* panels for tokens [t0, t0 + n): groups of 8 and a narrower last one */
    size_t stride = (osp_q8act_bytes(C) + 63) & ~(size_t)63;
    int np = (int)((n + 7) / 8);
    char *mem = aligned_alloc(64, np * stride);
    osp_q8act *acts = malloc(np * sizeof *acts);
    for (int p = 0; p < np; p++) {
        int width = n - 8 * p < 8 ? (int)(n - 8 * p) : 8;
        osp_q8act_init(&acts[p], C, c->w.group, width, mem + p * stride);
        for (int sl = 0; sl < width; sl++) osp_q8act_prepare(&acts[p], sl, c->x + (t0 + 8 * p + sl) * C);
    }
    float *y = malloc(n * ldy * 4);
    memset(y, 0x7f, n * ldy * 4);
    mm(&c->w, acts, n, y, ldy, r0, r1);
    for (int64_t t = 0; t < n; t++) {
        const float *want = c->yref + (t0 + t) * R + r0;
        if (memcmp(y + t * ldy, want, m * 4)) {
            int64_t r = 0;
            while (!memcmp(y + t * ldy + r, want + r, 4)) r++;
            fail_msg("%s: group %d cols %ld rows [%ld, %ld) n %ld: act %ld row %ld: %a vs reference %a", tier,
                     c->w.group, (long)c->w.cols, (long)r0, (long)r1, (long)n, (long)(t0 + t), (long)(r0 + r),
                     y[t * ldy + r], want[r]);
        }
        for (int64_t k = m; k < ldy; k++) {
            uint32_t u;
            memcpy(&u, y + t * ldy + k, 4);
            if (u != 0x7f7f7f7fu) fail_msg("%s: n %ld: wrote past the row range of act %ld", tier, (long)n, (long)t);
        }
    }
    free(y), free(mem), free(acts);
}

static int have_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* The dispatched kernel (VNNI, or AVX2), and the AVX2 one wherever the CPU has AVX2. */
static void test_matmul(void **st) {
    (void)st;
    osp_q8act_mm_fn fast = osp_q8act_matmul_fast();
    const int avx2 = have_avx2();
    if (!fast) print_message("no AVX2: checking the scalar tier only\n");
    const int groups[] = {32, 64, 128};
    const int64_t cols[] = {128, 384, 640, 2048};
    const int64_t rows[] = {23, 16, 37, 5};
    for (int g = 0; g < 3; g++)
        for (int ci = 0; ci < 4; ci++) {
            if (cols[ci] % groups[g]) continue;
            mm_case c;
            mm_case_init(&c, groups[g], cols[ci], rows[ci], ci % 2 ? OSP_DT_F16 : OSP_DT_BF16);
            check_accuracy(&c);
            for (int k = 0; k < 20; k++) {
                /* every count of tokens 1..17 and the whole batch; the full range and
                 * tile-aligned subranges with ragged ends; tokens from any offset */
                int64_t n = k < 17 ? k + 1 : MM_N, t0 = (int64_t)(rnd() % (MM_N - n + 1));
                int64_t R = c.w.rows, r0 = k % 3 && R > 16 ? 16 : 0;
                int64_t r1 = k % 3 ? r0 + 1 + (int64_t)(rnd() % (R - r0)) : R;
                if (fast) mm_check(&c, fast, "fast", t0, n, r0, r1);
                if (avx2) mm_check(&c, osp_q8act_matmul_avx2, "avx2", t0, n, r0, r1);
                if (k % 5 == 0) mm_check(&c, osp_q8act_matmul_ref, "ref", t0, n, r0, r1);
            }
            mm_case_free(&c);
        }
}

/* Odd-sized checkpoints: a 16-row tile that is mostly padding, and a group
 * of 128 over 128 columns (one group per row). */
static void test_edges(void **st) {
    (void)st;
    osp_q8act_mm_fn fast = osp_q8act_matmul_fast();
    const int avx2 = have_avx2();
    mm_case c;
    mm_case_init(&c, 128, 128, 1, OSP_DT_BF16);
    if (fast) mm_check(&c, fast, "fast", 0, MM_N, 0, 1);
    if (avx2) mm_check(&c, osp_q8act_matmul_avx2, "avx2", 0, MM_N, 0, 1);
    mm_case_free(&c);
    mm_case_init(&c, 32, 32, 17, OSP_DT_F16);
    if (fast) mm_check(&c, fast, "fast", 3, 9, 16, 17);
    if (avx2) mm_check(&c, osp_q8act_matmul_avx2, "avx2", 3, 9, 16, 17);
    if (avx2) mm_check(&c, osp_q8act_matmul_avx2, "avx2", 0, MM_N, 0, 17);
    check_accuracy(&c);
    mm_case_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matmul), cmocka_unit_test(test_edges)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
