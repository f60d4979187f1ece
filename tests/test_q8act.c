/* The int8-activation decode path: VNNI kernel against its scalar twin, and
 * the scalar twin against the exact f32 product within the int8 rounding. */
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

static void run_case(int bits, int group, int64_t cols, int64_t rows, osp_dtype sdt) {
    int64_t ng = cols / group, rb = cols * bits / 8;
    unsigned char *codes = malloc(rows * rb);
    uint16_t *sc = malloc(rows * ng * 2), *bi = malloc(rows * ng * 2);
    for (int64_t i = 0; i < rows * rb; i++) codes[i] = (unsigned char)rnd();
    for (int64_t i = 0; i < rows * ng; i++) {
        float s = 0.01f + 0.02f * frand(), b = -0.1f * frand() - s * (1 << (bits - 1));
        sc[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(s) : osp_f32_to_bf16(s);
        bi[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(b) : osp_f32_to_bf16(b);
    }
    osp_weight w = {.dtype = OSP_DT_U32, .rows = rows, .cols = cols, .data = codes, .qbits = bits, .group = group,
                    .sdtype = sdt, .scales = sc, .biases = bi};
    float *x = malloc(cols * 4), *ya = malloc(rows * 4), *yb = malloc(rows * 4), *yf = malloc(rows * 4);
    for (int64_t i = 0; i < cols; i++) x[i] = frand() * (i % 7 == 0 ? 4 : 1);
    void *mem = aligned_alloc(64, (osp_q8act_bytes(cols) + 63) & ~(size_t)63);
    osp_q8act a;
    assert_true(osp_q8act_supported(&w));
    osp_q8act_prepare(&a, x, &w, mem);
    osp_q8act_matvec_ref(&w, &a, ya, 0, rows);
    osp_q8act_matvec_fast()(&w, &a, yb, 0, rows);
    osp_ops_scalar()->matmul(&w, x, 1, yf, rows, 0, rows);
    float *row = malloc(cols * 4);
    for (int64_t r = 0; r < rows; r++) {
        osp_weight_row_f32(&w, r, row);
        double mag = 0, mag_q = 0;
        for (int64_t c = 0; c < cols; c++) {
            mag += fabs(x[c] * row[c]);
            mag_q += fabs(row[c]) * a.d[c / 32] * 0.5; /* int8 rounding bound */
        }
        if (fabs(ya[r] - yb[r]) > 1e-5 * mag + 1e-6)
            fail_msg("bits %d group %d cols %ld row %ld: vnni %g vs ref %g", bits, group, (long)cols, (long)r, yb[r], ya[r]);
        if (fabs(ya[r] - yf[r]) > mag_q + 1e-5 * mag)
            fail_msg("bits %d group %d cols %ld row %ld: int8 path %g vs f32 %g (bound %g)", bits, group, (long)cols,
                     (long)r, ya[r], yf[r], mag_q);
    }
    free(row), free(codes), free(sc), free(bi), free(x), free(ya), free(yb), free(yf), free(mem);
}

static void test_all(void **st) {
    (void)st;
    const int bits[] = {4, 8}, groups[] = {32, 64, 128};
    const int64_t cols[] = {128, 256, 384, 640, 704, 2048};
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int c = 0; c < 6; c++) {
                if (cols[c] % groups[g]) continue;
                run_case(bits[b], groups[g], cols[c], 37, OSP_DT_BF16);
                run_case(bits[b], groups[g], cols[c], 5, OSP_DT_F16);
            }
    run_case(4, 32, 96, 9, OSP_DT_BF16); /* a chunk with a tail only */
    run_case(8, 32, 32, 9, OSP_DT_BF16);
}

/* ---- several activations at once (continuous batching) ---- */

#define MM_N 33 /* activations per case: the largest batch checked */

typedef struct mm_case {
    osp_weight w;
    unsigned char *codes;
    uint16_t *sc, *bi;
    float *x;        /* [MM_N, cols] */
    void *mem;       /* the prepared activations' scratch */
    osp_q8act *acts; /* [MM_N] */
} mm_case;

static void mm_case_init(mm_case *c, int bits, int group, int64_t cols, int64_t rows, osp_dtype sdt) {
    int64_t ng = cols / group, rb = cols * bits / 8;
    c->codes = malloc(rows * rb);
    c->sc = malloc(rows * ng * 2), c->bi = malloc(rows * ng * 2);
    for (int64_t i = 0; i < rows * rb; i++) c->codes[i] = (unsigned char)rnd();
    for (int64_t i = 0; i < rows * ng; i++) {
        float s = 0.01f + 0.02f * frand(), b = -0.1f * frand() - s * (1 << (bits - 1));
        c->sc[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(s) : osp_f32_to_bf16(s);
        c->bi[i] = sdt == OSP_DT_F16 ? osp_f32_to_f16(b) : osp_f32_to_bf16(b);
    }
    c->w = (osp_weight){.dtype = OSP_DT_U32, .rows = rows, .cols = cols, .data = c->codes, .qbits = bits,
                        .group = group, .sdtype = sdt, .scales = c->sc, .biases = c->bi};
    assert_true(osp_q8act_supported(&c->w));
    size_t stride = (osp_q8act_bytes(cols) + 63) & ~(size_t)63;
    c->x = malloc(MM_N * cols * 4);
    c->mem = aligned_alloc(64, MM_N * stride);
    c->acts = malloc(MM_N * sizeof *c->acts);
    for (int t = 0; t < MM_N; t++) {
        float amp = t == 5 ? 0.0f : 1.0f + (float)(t % 4) * 3; /* one all-zero activation: d = 0 */
        for (int64_t i = 0; i < cols; i++) c->x[t * cols + i] = amp * frand() * (i % 7 == t % 7 ? 4 : 1);
        osp_q8act_prepare(&c->acts[t], c->x + t * cols, &c->w, (char *)c->mem + t * stride);
    }
}

static void mm_case_free(mm_case *c) {
    free(c->codes), free(c->sc), free(c->bi), free(c->x), free(c->mem), free(c->acts);
}

/* matmul(acts[0..n), rows [r0, r1)) against one matvec per activation, bitwise,
 * with a row stride wider than the range so stray writes show. */
static void mm_check(const mm_case *c, osp_q8act_mm_fn mm, osp_q8act_fn mv, const char *tier, int64_t n, int64_t r0,
                     int64_t r1) {
    int64_t m = r1 - r0, ldy = m + 3;
    float *y = malloc(n * ldy * 4), *yv = malloc(m * 4);
    memset(y, 0x7f, n * ldy * 4);
    mm(&c->w, c->acts, n, y, ldy, r0, r1);
    for (int64_t t = 0; t < n; t++) {
        mv(&c->w, &c->acts[t], yv, r0, r1);
        if (memcmp(y + t * ldy, yv, m * 4)) {
            int64_t r = 0;
            while (!memcmp(y + t * ldy + r, yv + r, 4)) r++;
            fail_msg("%s: bits %d group %d cols %ld rows [%ld, %ld) n %ld: act %ld row %ld: matmul %a vs matvec %a", tier,
                     c->w.qbits, c->w.group, (long)c->w.cols, (long)r0, (long)r1, (long)n, (long)t, (long)(r0 + r),
                     y[t * ldy + r], yv[r]);
        }
        for (int64_t k = m; k < ldy; k++) {
            uint32_t u;
            memcpy(&u, y + t * ldy + k, 4);
            if (u != 0x7f7f7f7fu) fail_msg("%s: n %ld: wrote past the row range of act %ld", tier, (long)n, (long)t);
        }
    }
    free(y), free(yv);
}

static void test_matmul_batch_invariant(void **st) {
    (void)st;
    const int vnni = osp_q8act_matmul_fast() == osp_q8act_matmul_vnni;
    if (!vnni) print_message("no AVX-512 VNNI: checking the scalar tier only\n");
    assert_true(vnni == (osp_q8act_matvec_fast() == osp_q8act_matvec_vnni));
    const int groups[] = {32, 64, 128};
    /* 96, 160: a chunk with a tail; 704, 2560: a partial superblock of 16 groups */
    const int64_t cols[] = {96, 160, 640, 704, 2048, 2560};
    int64_t ns[18];
    for (int i = 0; i < 17; i++) ns[i] = i + 1;
    ns[17] = MM_N;
    for (int bits = 4; bits <= 8; bits += 4)
        for (int g = 0; g < 3; g++)
            for (int ci = 0; ci < 6; ci++) {
                if (cols[ci] % groups[g]) continue;
                const int64_t rows = 23;
                mm_case c;
                mm_case_init(&c, bits, groups[g], cols[ci], rows, ci % 2 ? OSP_DT_F16 : OSP_DT_BF16);
                for (int k = 0; k < 18; k++) {
                    /* the full (odd) range, and random subranges: odd and even starts and lengths */
                    int64_t r0 = k % 3 ? (int64_t)(rnd() % 8) : 0;
                    int64_t r1 = k % 3 ? r0 + 1 + (int64_t)(rnd() % (rows - r0)) : rows;
                    if (vnni) mm_check(&c, osp_q8act_matmul_vnni, osp_q8act_matvec_vnni, "vnni", ns[k], r0, r1);
                    mm_check(&c, osp_q8act_matmul_ref, osp_q8act_matvec_ref, "ref", ns[k], r0, r1);
                }
                mm_case_free(&c);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_all), cmocka_unit_test(test_matmul_batch_invariant)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
