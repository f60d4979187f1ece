/* The attention kernels (scores, weighted sum) and the sampler's scan
 * against their scalar twins. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include "backend/ops.h"

static void test_wsum(void **st) {
    (void)st;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) skip();
    uint64_t r = 99;
    const int64_t dims[] = {1, 15, 16, 17, 64, 80, 128, 200, 256, 512};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (int64_t n = 0; n <= 37; n += 6) {
            int64_t dim = dims[di], stride = dim + (n % 3);
            float *w = malloc(sizeof(float) * (n + 1)), *rows = malloc(sizeof(float) * (n * stride + 1));
            float *a = malloc(sizeof(float) * dim), *b = malloc(sizeof(float) * dim);
            for (int64_t i = 0; i < n; i++) w[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 16777216.0f;
            for (int64_t i = 0; i < n * stride; i++)
                rows[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 8388608.0f - 1;
            for (int64_t d = 0; d < dim; d++) a[d] = b[d] = (float)d * 0.01f;
            osp_ops_scalar()->wsum(a, w, rows, n, stride, dim);
            osp_wsum_avx512(b, w, rows, n, stride, dim);
            for (int64_t d = 0; d < dim; d++) {
                double mag = fabs(d * 0.01);
                for (int64_t j = 0; j < n; j++) mag += fabs(w[j] * rows[j * stride + d]);
                if (fabs(a[d] - b[d]) > 1e-5 * mag + 1e-7) fail_msg("dim %ld n %ld d %ld: %g vs %g", (long)dim, (long)n, (long)d, b[d], a[d]);
            }
            free(w), free(rows), free(a), free(b);
        }
}

static void test_scores(void **st) {
    (void)st;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) skip();
    uint64_t r = 5;
    const int64_t dims[] = {1, 15, 16, 17, 64, 80, 128, 200, 256, 512};
    const int64_t ns[] = {0, 1, 15, 16, 17, 33, 48, 100};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int64_t dim = dims[di], n = ns[ni], stride = dim * (1 + (int64_t)(ni % 3)); /* GQA heads interleave */
            float *q = malloc(sizeof(float) * dim), *rows = malloc(sizeof(float) * (n * stride + 1));
            float *a = malloc(sizeof(float) * (n + 1)), *b = malloc(sizeof(float) * (n + 1));
            for (int64_t i = 0; i < dim; i++) q[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 8388608.0f - 1;
            for (int64_t i = 0; i < n * stride; i++)
                rows[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 8388608.0f - 1;
            osp_ops_scalar()->scores(a, q, rows, n, stride, dim);
            osp_scores_avx512(b, q, rows, n, stride, dim);
            for (int64_t j = 0; j < n; j++) {
                double mag = 0;
                for (int64_t d = 0; d < dim; d++) mag += fabs(q[d] * rows[j * stride + d]);
                if (fabs(a[j] - b[j]) > 1e-5 * mag + 1e-7)
                    fail_msg("dim %ld n %ld row %ld: %g vs %g", (long)dim, (long)n, (long)j, b[j], a[j]);
            }
            free(q), free(rows), free(a), free(b);
        }
}

static void test_select_ge(void **st) {
    (void)st;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) skip();
    uint64_t r = 7;
    for (int32_t n = 0; n < 300; n += 7) {
        float *x = malloc(sizeof(float) * (n + 1));
        int32_t *a = malloc(sizeof(int32_t) * (n + 16)), *b = malloc(sizeof(int32_t) * (n + 16));
        for (int32_t i = 0; i < n; i++) x[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 16777216.0f;
        if (n > 3) x[2] = NAN, x[3] = 0.5f; /* NaN never passes; equality passes */
        int32_t ca = osp_ops_scalar()->select_ge(a, x, n, 0.5f), cb = osp_select_ge_avx512(b, x, n, 0.5f);
        assert_int_equal(ca, cb);
        assert_memory_equal(a, b, sizeof(int32_t) * ca);
        free(x), free(a), free(b);
    }
}

static void test_argmax(void **st) {
    (void)st;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) skip();
    uint64_t r = 11;
    for (int32_t n = 0; n < 300; n += 7) {
        float *x = malloc(sizeof(float) * (n + 1));
        for (int32_t i = 0; i < n; i++) x[i] = (float)((r = r * 6364136223846793005ull + 1) >> 40) / 16777216.0f;
        if (n > 20) x[3] = NAN, x[n - 1] = x[n / 2] = 2.0f; /* NaN skipped; the first of equal maxima */
        assert_int_equal(osp_ops_scalar()->argmax(x, n), osp_argmax_avx512(x, n));
        if (n > 20) assert_int_equal(osp_argmax_avx512(x, n), n / 2);
        for (int32_t i = 0; i < n; i++) x[i] = NAN; /* nothing to choose: 0 */
        assert_int_equal(osp_argmax_avx512(x, n), 0);
        assert_int_equal(osp_ops_scalar()->argmax(x, n), 0);
        free(x);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_wsum), cmocka_unit_test(test_scores), cmocka_unit_test(test_select_ge),
                                       cmocka_unit_test(test_argmax)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
