/* Every SIMD kernel against its scalar twin (ops_scalar.c) on random
 * shapes, with a tolerance relative to the magnitude of the summed terms
 * (the order of summation differs; nothing else may).
 *
 * Weight buffers are malloc'ed at exactly their size, so AddressSanitizer
 * flags a kernel that reads past the last row (an mmapped tensor can end
 * at the end of the file). Outputs are surrounded by NaN sentinels that
 * must survive. Variants the CPU lacks are skipped.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/ops.h"

/* ------------------------------------------------------------------ rng */

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return rng_s;
}

static float rng_unit(void) { return (float)(rng_next() >> 40) / 16777216.0f; }
static float rng_range(float lo, float hi) { return lo + (hi - lo) * rng_unit(); }
static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

/* ------------------------------------------------------------- variants */

static int fast_ops(const osp_ops *out[2]) {
    int k = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c") && osp_ops_avx2())
        out[k++] = osp_ops_avx2();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        osp_ops_avx512())
        out[k++] = osp_ops_avx512();
    if (k == 0) fprintf(stderr, "test_kernels: no SIMD variant on this CPU, nothing compared\n");
    return k;
}

/* -------------------------------------------------------------- weights */

/* A weight plus the malloc'ed blocks behind it. `off` shifts every
 * pointer off alignment while the block still ends exactly at the data. */
typedef struct tw {
    osp_weight w;
    void *blk[3];
} tw;

static void *exact_alloc(size_t n, int off, void **blk) {
    unsigned char *p = malloc(n + (size_t)off);
    assert_non_null(p);
    *blk = p;
    return p + off;
}

static void store_float(void *p, osp_dtype dt, int64_t i, float v) {
    unsigned char *b = p;
    uint16_t h;
    switch (dt) {
    case OSP_DT_BF16: h = osp_f32_to_bf16(v); memcpy(b + 2 * i, &h, 2); break;
    case OSP_DT_F16: h = osp_f32_to_f16(v); memcpy(b + 2 * i, &h, 2); break;
    default: memcpy(b + 4 * i, &v, 4); break;
    }
}

static void tw_dense(tw *t, osp_dtype dt, int64_t rows, int64_t cols, int off) {
    memset(t, 0, sizeof *t);
    t->w.dtype = dt;
    t->w.rows = rows;
    t->w.cols = cols;
    size_t es = osp_dtype_size(dt);
    void *d = exact_alloc((size_t)(rows * cols) * es, off, &t->blk[0]);
    for (int64_t i = 0; i < rows * cols; i++) store_float(d, dt, i, rng_range(-1.0f, 1.0f));
    t->w.data = d;
}

static void tw_quant(tw *t, int bits, int group, osp_dtype sdt, int64_t rows, int64_t cols,
                     int off) {
    memset(t, 0, sizeof *t);
    t->w.dtype = OSP_DT_U32;
    t->w.rows = rows;
    t->w.cols = cols;
    t->w.qbits = bits;
    t->w.group = group;
    t->w.sdtype = sdt;
    size_t nb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * cols / group);
    unsigned char *d = exact_alloc(nb, off, &t->blk[0]);
    for (size_t i = 0; i < nb; i++) d[i] = (unsigned char)rng_next(); /* any bits are codes */
    void *s = exact_alloc(ng * osp_dtype_size(sdt), off, &t->blk[1]);
    void *b = exact_alloc(ng * osp_dtype_size(sdt), off, &t->blk[2]);
    for (size_t i = 0; i < ng; i++) {
        float sc = rng_range(0.005f, 0.1f);
        store_float(s, sdt, (int64_t)i, rng_next() & 1 ? sc : -sc);
        store_float(b, sdt, (int64_t)i, rng_range(-0.5f, 0.5f));
    }
    t->w.data = d;
    t->w.scales = s;
    t->w.biases = b;
}

static void tw_free(tw *t) {
    for (int i = 0; i < 3; i++) free(t->blk[i]);
}

/* Sum of |terms| of y[t, r]: the scale the error of any summation order
 * is proportional to. Quantized: |s|*sum|x q| + |b|*sum|x| per group. */
static double term_magnitude(const osp_weight *w, const float *xt, int64_t r) {
    double m = 0.0;
    if (!w->qbits) {
        const unsigned char *row =
            (const unsigned char *)w->data + r * w->cols * (int64_t)osp_dtype_size(w->dtype);
        for (int64_t c = 0; c < w->cols; c++) m += fabs(xt[c] * osp_load_float(row, w->dtype, c));
        return m;
    }
    int64_t ng = w->cols / w->group;
    const unsigned char *row = (const unsigned char *)w->data + r * w->cols * w->qbits / 8;
    for (int64_t g = 0; g < ng; g++) {
        double sq = 0.0, sx = 0.0;
        for (int64_t j = 0; j < w->group; j++) {
            int64_t k = g * w->group + j;
            sq += fabs(xt[k] * (double)osp_q_code(row, w->qbits, k));
            sx += fabs(xt[k]);
        }
        m += fabs(osp_load_float(w->scales, w->sdtype, r * ng + g)) * sq +
             fabs(osp_load_float(w->biases, w->sdtype, r * ng + g)) * sx;
    }
    return m;
}

/* --------------------------------------------------------------- matmul */

static int n_matmul_cases;

static void check_matmul(const osp_ops *ops, const osp_weight *w, int64_t n, int64_t r0,
                         int64_t r1, int64_t ldy, const char *what) {
    int64_t cols = w->cols, nr = r1 - r0;
    float *x = malloc((size_t)(n * cols + 1) * sizeof(float));
    assert_non_null(x);
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_range(-1.0f, 1.0f);
    /* exactly the span the kernel may write: ASan catches a stray store */
    int64_t ny = n > 0 && nr > 0 ? (n - 1) * ldy + nr : 1;
    float *ref = malloc((size_t)ny * sizeof(float)), *got = malloc((size_t)ny * sizeof(float));
    assert_non_null(ref);
    assert_non_null(got);
    for (int64_t i = 0; i < ny; i++) ref[i] = got[i] = NAN;
    osp_ops_scalar()->matmul(w, x, n, ref, ldy, r0, r1);
    ops->matmul(w, x, n, got, ldy, r0, r1);
    for (int64_t i = 0; i < ny && n > 0 && nr > 0; i++) {
        int64_t t = i / ldy, j = i % ldy;
        if (j >= nr) {
            if (!isnan(got[i]))
                fail_msg("%s %s: wrote y[%lld] outside rows (ldy %lld)", ops->name, what,
                         (long long)i, (long long)ldy);
            continue;
        }
        double tol = 1e-5 * term_magnitude(w, x + t * cols, r0 + j) + 1e-6;
        if (!(fabs((double)got[i] - (double)ref[i]) <= tol))
            fail_msg("%s %s: n=%lld rows[%lld,%lld) cols=%lld: y[t=%lld,r=%lld] = %.9g, "
                     "scalar %.9g (tol %.3g)",
                     ops->name, what, (long long)n, (long long)r0, (long long)r1,
                     (long long)cols, (long long)t, (long long)(r0 + j), got[i], ref[i], tol);
    }
    if (n == 0 || nr == 0)
        for (int64_t i = 0; i < ny; i++)
            if (!isnan(got[i])) fail_msg("%s %s: wrote y with nothing to do", ops->name, what);
    free(x);
    free(ref);
    free(got);
    n_matmul_cases++;
}

/* A random row range [r0, r1) as the thread pool makes them: r0 on a
 * 16-row boundary; sometimes the whole matrix. */
static void random_range(int64_t rows, int64_t *r0, int64_t *r1) {
    if (rng_next() % 3 == 0) {
        *r0 = 0;
        *r1 = rows;
        return;
    }
    *r0 = 16 * rng_int(0, (rows - 1) / 16);
    *r1 = rng_int(*r0 + 1, rows);
}

static void test_matmul_dense(void **state) {
    (void)state;
    const osp_ops *fast[2];
    int nf = fast_ops(fast);
    const osp_dtype dts[] = {OSP_DT_F32, OSP_DT_F16, OSP_DT_BF16};
    const int64_t colss[] = {1, 7, 16, 33, 100, 257, 300};
    const int64_t ns[] = {1, 2, 3, 5, 8, 17};
    char what[96];
    for (int f = 0; f < nf; f++)
        for (int d = 0; d < 3; d++)
            for (int ci = 0; ci < 7; ci++)
                for (int ni = 0; ni < 6; ni++) {
                    int64_t rows = rng_int(1, 70), r0, r1, cols = colss[ci];
                    random_range(rows, &r0, &r1);
                    int64_t ldy = (r1 - r0) + rng_int(0, 3);
                    tw t;
                    tw_dense(&t, dts[d], rows, cols, (int)rng_int(0, 3));
                    snprintf(what, sizeof what, "dense %s", osp_dtype_name(dts[d]));
                    check_matmul(fast[f], &t.w, ns[ni], r0, r1, ldy, what);
                    tw_free(&t);
                }
    /* many tokens (several token blocks) and a long row (several K tiles) */
    for (int f = 0; f < nf; f++)
        for (int d = 0; d < 3; d++) {
            tw t;
            tw_dense(&t, dts[d], 70, 1000, 2);
            check_matmul(fast[f], &t.w, 300, 16, 70, 55, "dense large");
            check_matmul(fast[f], &t.w, 1, 0, 70, 70, "dense large matvec");
            check_matmul(fast[f], &t.w, 4, 32, 32, 7, "dense empty range");
            check_matmul(fast[f], &t.w, 0, 0, 70, 70, "dense no tokens");
            tw_free(&t);
        }
    /* long rows (x beyond L1: rows read in groups), with a column tail and a
     * row tail; a row's value may not depend on the range it was computed in */
    for (int f = 0; f < nf; f++)
        for (int d = 0; d < 3; d++)
            for (int64_t cols = 4096; cols <= 4113; cols += 17) {
                tw t;
                tw_dense(&t, dts[d], 37, cols, 1);
                check_matmul(fast[f], &t.w, 1, 0, 37, 37, "dense long matvec");
                check_matmul(fast[f], &t.w, 1, 16, 35, 19, "dense long matvec range");
                float *x = malloc(sizeof(float) * cols), all[37], part[37];
                assert_non_null(x);
                for (int64_t i = 0; i < cols; i++) x[i] = rng_range(-1.0f, 1.0f);
                fast[f]->matmul(&t.w, x, 1, all, 37, 0, 37);
                for (int64_t r0 = 0; r0 < 37; r0 += 16) {
                    int64_t r1 = r0 + 3 < 37 ? r0 + 3 : 37;
                    fast[f]->matmul(&t.w, x, 1, part, 37, r0, r1);
                    for (int64_t r = r0; r < r1; r++)
                        if (memcmp(&part[r - r0], &all[r], sizeof(float)))
                            fail_msg("%s long matvec: row %lld differs with range [%lld,%lld)", fast[f]->name,
                                     (long long)r, (long long)r0, (long long)r1);
                }
                free(x);
                tw_free(&t);
            }
}

static void test_matmul_quant(void **state) {
    (void)state;
    const osp_ops *fast[2];
    int nf = fast_ops(fast);
    const int bitss[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    const osp_dtype sdts[] = {OSP_DT_BF16, OSP_DT_F16, OSP_DT_F32};
    const int64_t ns[] = {1, 2, 5, 8, 17};
    const int64_t ngs[] = {1, 2, 3, 17, 20};
    char what[96];
    for (int f = 0; f < nf; f++)
        for (int b = 0; b < 6; b++)
            for (int g = 0; g < 3; g++)
                for (int s = 0; s < 3; s++)
                    for (int ni = 0; ni < 5; ni++) {
                        int64_t rows = rng_int(1, 70), r0, r1;
                        int64_t cols = groups[g] * ngs[rng_int(0, 4)];
                        random_range(rows, &r0, &r1);
                        int64_t ldy = (r1 - r0) + rng_int(0, 3);
                        tw t;
                        tw_quant(&t, bitss[b], groups[g], sdts[s], rows, cols, (int)rng_int(0, 3));
                        snprintf(what, sizeof what, "q%d g%d %s", bitss[b], groups[g],
                                 osp_dtype_name(sdts[s]));
                        check_matmul(fast[f], &t.w, ns[ni], r0, r1, ldy, what);
                        /* the last rows end exactly at the buffers' ends */
                        check_matmul(fast[f], &t.w, 1, 0, rows, rows, what);
                        tw_free(&t);
                    }
    /* rows that are whole 128-column blocks (the 4-bit decode layout),
     * rows longer than one pass of prepared x, and a full token block */
    const int64_t long_cols[] = {32 * 70, 128 * 5, 8192 + 384};
    for (int f = 0; f < nf; f++)
        for (int b = 0; b < 6; b++)
            for (int g = 0; g < 3; g++)
                for (int l = 0; l < 3; l++) {
                    tw t;
                    int64_t rows = rng_int(17, 40);
                    int64_t cols = long_cols[l] / groups[g] * groups[g];
                    tw_quant(&t, bitss[b], groups[g], sdts[(b + g + l) % 3], rows, cols, 1);
                    snprintf(what, sizeof what, "q%d g%d cols %lld", bitss[b], groups[g],
                             (long long)cols);
                    check_matmul(fast[f], &t.w, 1, 0, rows, rows, what);
                    check_matmul(fast[f], &t.w, 1, 16, rows, rows, what);
                    if (l == 0) check_matmul(fast[f], &t.w, 260, 16, rows, 25, what);
                    tw_free(&t);
                }
    print_message("%d matmul cases compared\n", n_matmul_cases);
}

/* matmul_each: each of n tokens bitwise what matmul gives it alone, for every kind the table takes (8-bit
 * ones), the last rows ending at the buffers' ends, rows longer than one prepared pass, 0 for other kinds */
static void test_matmul_each(void **state) {
    (void)state;
    const osp_ops *fast[2];
    int nf = fast_ops(fast);
    const int groups[] = {32, 64, 128};
    const int64_t ns[] = {1, 2, 3, 8, 9, 13};
    const int64_t cols_of[] = {64, 128 * 3, 8192 + 512};
    int checked = 0;
    for (int f = 0; f < nf; f++) {
        if (!fast[f]->matmul_each) continue;
        for (int g = 0; g < 3; g++)
            for (int ci = 0; ci < 3; ci++) {
                const int64_t rows = rng_int(1, 40), cols = cols_of[ci] < groups[g] ? groups[g] : cols_of[ci] / groups[g] * groups[g];
                int64_t r0, r1;
                random_range(rows, &r0, &r1);
                tw t;
                tw_quant(&t, 8, groups[g], (g + ci) % 2 ? OSP_DT_F16 : OSP_DT_BF16, rows, cols, 1);
                for (int ni = 0; ni < 6; ni++) {
                    const int64_t n = ns[ni], m = r1 - r0, ldy = m + 2;
                    float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * ldy)),
                          *y1 = malloc(sizeof(float) * (size_t)(m + 1));
                    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_range(-2, 2);
                    for (int64_t i = 0; i < n * ldy; i++) y[i] = 777.0f;
                    assert_int_equal(fast[f]->matmul_each(&t.w, x, n, y, ldy, r0, r1), 1);
                    for (int64_t k = 0; k < n; k++) {
                        fast[f]->matmul(&t.w, x + k * cols, 1, y1, m, r0, r1);
                        if (memcmp(y1, y + k * ldy, sizeof(float) * (size_t)m))
                            fail_msg("%s matmul_each q8 g%d cols %lld rows [%lld, %lld) n %lld: token %lld differs "
                                     "from alone", fast[f]->name, groups[g], (long long)cols, (long long)r0,
                                     (long long)r1, (long long)n, (long long)k);
                        for (int64_t e = m; e < ldy; e++)
                            if (y[k * ldy + e] != 777.0f) fail_msg("%s matmul_each: wrote past its rows", fast[f]->name);
                    }
                    free(x), free(y), free(y1);
                    checked++;
                }
                tw_free(&t);
            }
        /* dense rows: short (4 accumulators) and long (2) */
        const osp_dtype dts[] = {OSP_DT_BF16, OSP_DT_F16, OSP_DT_F32};
        const int64_t dcols[] = {16 * 37, 4096 + 48};
        for (int d = 0; d < 3; d++)
            for (int ci = 0; ci < 2; ci++) {
                const int64_t rows = rng_int(1, 30), cols = dcols[ci];
                int64_t r0, r1;
                random_range(rows, &r0, &r1);
                tw t;
                tw_dense(&t, dts[d], rows, cols, 1);
                for (int ni = 0; ni < 6; ni++) {
                    const int64_t n = ns[ni], m = r1 - r0, ldy = m + 1;
                    float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * ldy)),
                          *y1 = malloc(sizeof(float) * (size_t)(m + 1));
                    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_range(-2, 2);
                    const int took = fast[f]->matmul_each(&t.w, x, n, y, ldy, r0, r1);
                    assert_int_equal(took, 1);
                    for (int64_t k = 0; k < n && took; k++) {
                        fast[f]->matmul(&t.w, x + k * cols, 1, y1, m, r0, r1);
                        if (memcmp(y1, y + k * ldy, sizeof(float) * (size_t)m))
                            fail_msg("%s matmul_each %s cols %lld n %lld: token %lld differs from alone",
                                     fast[f]->name, osp_dtype_name(dts[d]), (long long)cols, (long long)n,
                                     (long long)k);
                    }
                    free(x), free(y), free(y1);
                    checked++;
                }
                tw_free(&t);
            }
        tw t;
        tw_quant(&t, 4, 64, OSP_DT_BF16, 20, 256, 0);
        float x[256] = {0}, y[20];
        assert_int_equal(fast[f]->matmul_each(&t.w, x, 1, y, 20, 0, 20), 0); /* not its kind */
        tw_free(&t);
    }
    print_message("%d matmul_each cases compared\n", checked);
}

/* ---------------------------------------------------------- elementwise */

static const int64_t EW_N[] = {0, 1, 15, 16, 17, 1000};

/* Mostly moderate values, some at +-100 and some tiny. */
static void fill_values(float *v, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t k = rng_next() % 16;
        if (k == 0) v[i] = 100.0f;
        else if (k == 1) v[i] = -100.0f;
        else if (k == 2) v[i] = rng_range(-1e-4f, 1e-4f);
        else v[i] = rng_range(-scale, scale);
    }
}

static void expect_close(const osp_ops *ops, const char *what, int64_t n, int64_t i, float got,
                         float ref, double tol) {
    if (!(fabs((double)got - (double)ref) <= tol))
        fail_msg("%s %s n=%lld: [%lld] = %.9g, scalar %.9g (tol %.3g)", ops->name, what,
                 (long long)n, (long long)i, got, ref, tol);
}

/* n + 1 floats; the extra one is a sentinel a kernel must not write. */
static float *vec(int64_t n) {
    float *p = malloc((size_t)(n + 1) * sizeof(float));
    assert_non_null(p);
    p[n] = 12345.0f;
    return p;
}

static void expect_sentinel(const osp_ops *ops, const char *what, const float *p, int64_t n) {
    if (p[n] != 12345.0f) fail_msg("%s %s n=%lld: wrote past the end", ops->name, what, (long long)n);
}

static void test_dot_axpy(void **state) {
    (void)state;
    const osp_ops *fast[2], *sc = osp_ops_scalar();
    int nf = fast_ops(fast);
    for (int f = 0; f < nf; f++)
        for (int k = 0; k < 6; k++) {
            int64_t n = EW_N[k];
            float *a = vec(n), *b = vec(n), *y0 = vec(n), *y1 = vec(n);
            fill_values(a, n, 3.0f);
            fill_values(b, n, 3.0f);
            double mag = 0.0;
            for (int64_t i = 0; i < n; i++) mag += fabs(a[i] * b[i]);
            expect_close(fast[f], "dot", n, 0, fast[f]->dot(a, b, n), sc->dot(a, b, n),
                         1e-5 * mag + 1e-6);
            for (int64_t i = 0; i < n; i++) y0[i] = y1[i] = b[i];
            sc->axpy(y0, -0.75f, a, n);
            fast[f]->axpy(y1, -0.75f, a, n);
            for (int64_t i = 0; i < n; i++)
                expect_close(fast[f], "axpy", n, i, y1[i], y0[i],
                             1e-6 * (fabs(b[i]) + fabs(0.75 * a[i])) + 1e-7);
            expect_sentinel(fast[f], "axpy", y1, n);
            free(a);
            free(b);
            free(y0);
            free(y1);
        }
}

static void test_rmsnorm(void **state) {
    (void)state;
    const osp_ops *fast[2], *sc = osp_ops_scalar();
    int nf = fast_ops(fast);
    for (int f = 0; f < nf; f++)
        for (int k = 1; k < 6; k++)
            for (int mode = 0; mode < 3; mode++) {
                int64_t n = EW_N[k];
                float *x = vec(n), *w = vec(n), *y0 = vec(n), *y1 = vec(n);
                fill_values(x, n, 3.0f);
                for (int64_t i = 0; i < n; i++) w[i] = rng_range(-2.0f, 2.0f);
                const float *wp = mode == 0 ? NULL : w;
                sc->rmsnorm(y0, x, wp, n, 1e-6f, mode == 2);
                fast[f]->rmsnorm(y1, x, wp, n, 1e-6f, mode == 2);
                for (int64_t i = 0; i < n; i++)
                    expect_close(fast[f], "rmsnorm", n, i, y1[i], y0[i], 1e-5 * fabs(y0[i]) + 1e-6);
                expect_sentinel(fast[f], "rmsnorm", y1, n);
                free(x);
                free(w);
                free(y0);
                free(y1);
            }
}

static void test_softmax(void **state) {
    (void)state;
    const osp_ops *fast[2], *sc = osp_ops_scalar();
    int nf = fast_ops(fast);
    for (int f = 0; f < nf; f++)
        for (int k = 0; k < 6; k++)
            for (int scale = 1; scale <= 30; scale *= 30) {
                int64_t n = EW_N[k];
                float *x0 = vec(n), *x1 = vec(n);
                fill_values(x0, n, (float)scale);
                if (n > 3) x0[n / 2] = -INFINITY; /* a masked attention position */
                memcpy(x1, x0, (size_t)n * sizeof(float));
                /* the normalizer alone (the sampler's), before x is overwritten */
                float m0, m1, s0 = sc->sumexp(x0, n, &m0), s1 = fast[f]->sumexp(x1, n, &m1);
                assert_true(m0 == m1);
                expect_close(fast[f], "sumexp", n, 0, s1, s0, 1e-5 * fabs(s0));
                sc->softmax(x0, n);
                fast[f]->softmax(x1, n);
                for (int64_t i = 0; i < n; i++)
                    expect_close(fast[f], "softmax", n, i, x1[i], x0[i], 1e-5 * fabs(x0[i]) + 1e-7);
                expect_sentinel(fast[f], "softmax", x1, n);
                free(x0);
                free(x1);
            }
}

static void test_activations(void **state) {
    (void)state;
    const osp_ops *fast[2], *sc = osp_ops_scalar();
    int nf = fast_ops(fast);
    for (int f = 0; f < nf; f++)
        for (int k = 0; k < 6; k++) {
            int64_t n = EW_N[k];
            float *g = vec(n), *u = vec(n), *y0 = vec(n), *y1 = vec(n);
            fill_values(g, n, 8.0f);
            fill_values(u, n, 2.0f);
            /* gate values where the activations bend or saturate */
            for (int64_t i = 0; i < n; i += 7) g[i] = rng_range(-12.0f, 12.0f);
            sc->silu_mul(y0, g, u, n);
            fast[f]->silu_mul(y1, g, u, n);
            for (int64_t i = 0; i < n; i++)
                expect_close(fast[f], "silu_mul", n, i, y1[i], y0[i],
                             1e-5 * fabs(y0[i]) + 1e-6);
            expect_sentinel(fast[f], "silu_mul", y1, n);
            sc->gelu_tanh_mul(y0, g, u, n);
            fast[f]->gelu_tanh_mul(y1, g, u, n);
            /* the scalar 1 + tanh(z) cancels for z << 0: allow its ulp */
            for (int64_t i = 0; i < n; i++)
                expect_close(fast[f], "gelu_tanh_mul", n, i, y1[i], y0[i],
                             1e-5 * fabs(y0[i]) + 1e-7 * (1.0 + fabs(g[i] * u[i])));
            expect_sentinel(fast[f], "gelu_tanh_mul", y1, n);
            /* the exact GELU: against the scalar erff formula (which cancels for x << 0: its ulp of 1 allowed),
             * and against erfc in f64, relative (the vector form has no cancellation) */
            memcpy(y0, g, (size_t)n * sizeof(float));
            memcpy(y1, g, (size_t)n * sizeof(float));
            if (n > 2) y1[1] = y0[1] = NAN;
            sc->gelu_erf(y0, n);
            fast[f]->gelu_erf(y1, n);
            for (int64_t i = 0; i < n; i++) {
                if (i == 1 && n > 2) {
                    if (!isnan(y1[i])) fail_msg("%s gelu_erf: NaN in, %g out", fast[f]->name, y1[i]);
                    continue;
                }
                const double ex = 0.5 * (double)g[i] * erfc(-(double)g[i] / sqrt(2.0));
                expect_close(fast[f], "gelu_erf", n, i, y1[i], y0[i], 2e-6 * fabs(y0[i]) + 1e-7 * fabs(g[i]));
                expect_close(fast[f], "gelu_erf (f64)", n, i, y1[i], (float)ex, 2e-6 * fabs(ex) + 1e-37);
            }
            expect_sentinel(fast[f], "gelu_erf", y1, n);
            const float caps[] = {30.0f, 50.0f, 1.0f};
            for (int c = 0; c < 3; c++) {
                memcpy(y0, g, (size_t)n * sizeof(float));
                memcpy(y1, g, (size_t)n * sizeof(float));
                sc->softcap(y0, n, caps[c]);
                fast[f]->softcap(y1, n, caps[c]);
                for (int64_t i = 0; i < n; i++) {
                    expect_close(fast[f], "softcap", n, i, y1[i], y0[i], 1e-5 * fabs(y0[i]) + 1e-12);
                    if (!isfinite(y1[i])) fail_msg("softcap not finite at %lld", (long long)i);
                }
                expect_sentinel(fast[f], "softcap", y1, n);
            }
            free(g);
            free(u);
            free(y0);
            free(y1);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_dense), cmocka_unit_test(test_matmul_quant),
        cmocka_unit_test(test_matmul_each),
        cmocka_unit_test(test_dot_axpy),     cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_softmax),      cmocka_unit_test(test_activations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
