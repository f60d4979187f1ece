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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_all)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
