/* The CUDA backend's operations against scalar references computed here in
 * double precision, on random data: matmul for every kind of weight (the
 * chunked kernels and the generic one), the production path's GEMM, the
 * row operations, and batch invariance (a token's result is bitwise the
 * same whatever number of tokens shares the call), the head's ids out
 * (the device's argmax against the host's), routed experts on the device
 * (against the host's routing, alone and among others, graphs), the two attention kernels, and graph
 * captures beside another thread's copies. Skipped (exit 77) on a
 * machine without a CUDA device or a build without the backend. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "backend/backend.h"
#include "core/core.h"
#include "core/options.h"
#include "kv/kv.h"
#include "osprey.h"
#include "tensor/tensor.h"

static const osp_backend *be;
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float uniform(void) { return (float)((next_u32() & 0xffffff) / 16777216.0 * 2.0 - 1.0); }

typedef struct host_weight {
    osp_weight w;
    void *data, *scales, *biases;
    void *owned; /* the placement */
} host_weight;

static void put_scalar(void *p, osp_dtype t, int64_t i, float v) {
    if (t == OSP_DT_BF16) ((uint16_t *)p)[i] = osp_f32_to_bf16(v);
    else if (t == OSP_DT_F16) ((uint16_t *)p)[i] = osp_f32_to_f16(v);
    else ((float *)p)[i] = v;
}

/* A random weight: dense of dtype dt (bits 0), or MLX affine with bits/group and scales of sdt. */
static void make_weight(host_weight *h, int64_t rows, int64_t cols, osp_dtype dt, int bits, int group, osp_dtype sdt) {
    memset(h, 0, sizeof *h);
    osp_weight *w = &h->w;
    w->rows = rows, w->cols = cols;
    if (!bits) {
        w->dtype = dt;
        size_t es = osp_dtype_size(dt);
        h->data = malloc((size_t)(rows * cols) * es);
        for (int64_t i = 0; i < rows * cols; i++) put_scalar(h->data, dt, i, uniform());
    } else {
        w->dtype = OSP_DT_U32, w->qbits = bits, w->group = group, w->sdtype = sdt;
        size_t nb = (size_t)(rows * cols * bits / 8), ng = (size_t)(rows * (cols / group));
        h->data = malloc(nb);
        for (size_t i = 0; i < nb; i++) ((unsigned char *)h->data)[i] = (unsigned char)next_u32();
        h->scales = malloc(ng * osp_dtype_size(sdt));
        h->biases = malloc(ng * osp_dtype_size(sdt));
        for (size_t i = 0; i < ng; i++) {
            put_scalar(h->scales, sdt, (int64_t)i, uniform() * 0.1f);
            put_scalar(h->biases, sdt, (int64_t)i, uniform() * 0.5f);
        }
        w->scales = h->scales, w->biases = h->biases;
    }
    w->data = h->data;
    osp_weight *ws[] = {w};
    assert_int_equal(be->place(ws, 1, NULL, 0, NULL, 0, &h->owned), OSP_OK);
}

static void free_weight(host_weight *h) {
    be->unplace(h->owned);
    free(h->data), free(h->scales), free(h->biases);
}

static osp_dbuf *upload(const float *x, int64_t n) {
    osp_dbuf *d = be->alloc((size_t)n);
    assert_non_null(d);
    be->write(d, x, n);
    return d;
}

/* y = x · Wᵀ on the device for n tokens of a chunk of B rows of T tokens */
static void device_matmul(osp_be_session *s, host_weight *h, const float *x, int64_t n, int32_t B, int32_t T,
                          float *y) {
    osp_dbuf *dx = upload(x, n * h->w.cols), *dy = be->alloc((size_t)(n * h->w.rows));
    assert_non_null(dy);
    const osp_weight *ws[] = {&h->w};
    osp_dbuf *ys[] = {dy};
    be->begin_chunk(s, B, T);
    be->matmul(s, ws, 1, dx, n, ys);
    if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
    be->read(y, dy, n * h->w.rows);
    be->free(dx), be->free(dy);
}

/* |got - ref| within tol of sum |w x| (the size of the terms summed) */
static void check_matmul(host_weight *h, const float *x, int64_t n, const float *y, double tol, const char *what) {
    int64_t R = h->w.rows, C = h->w.cols;
    float *row = malloc(sizeof(float) * (size_t)C);
    for (int64_t r = 0; r < R; r++) {
        osp_weight_row_f32(&h->w, r, row);
        for (int64_t t = 0; t < n; t++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < C; c++) {
                ref += (double)row[c] * x[t * C + c];
                mag += fabs((double)row[c] * x[t * C + c]);
            }
            double got = y[t * R + r];
            if (!(fabs(got - ref) <= tol * mag + 1e-30))
                fail_msg("%s: row %lld token %lld: %.9g vs %.9g (|terms| %.3g)", what, (long long)r, (long long)t, got,
                         ref, mag);
        }
    }
    free(row);
}

typedef struct wkind {
    const char *name;
    osp_dtype dt;
    int bits, group;
    osp_dtype sdt;
    int64_t cols;
} wkind;

static const wkind KINDS[] = {
    {"f32", OSP_DT_F32, 0, 0, 0, 260},         {"f16", OSP_DT_F16, 0, 0, 0, 520},
    {"bf16", OSP_DT_BF16, 0, 0, 0, 2056},      {"bf16 odd", OSP_DT_BF16, 0, 0, 0, 100}, /* generic kernel */
    {"q4 g64", 0, 4, 64, OSP_DT_BF16, 1024},    {"q4 g32 f16", 0, 4, 32, OSP_DT_F16, 544},
    {"q4 g128 f32", 0, 4, 128, OSP_DT_F32, 384}, {"q8 g64", 0, 8, 64, OSP_DT_BF16, 960},
    {"q8 g32", 0, 8, 32, OSP_DT_BF16, 96},      {"q2 g64", 0, 2, 64, OSP_DT_BF16, 256},
    {"q3 g64", 0, 3, 64, OSP_DT_BF16, 192},     {"q5 g32", 0, 5, 32, OSP_DT_BF16, 160},
    {"q6 g64", 0, 6, 64, OSP_DT_BF16, 320},
};

static void test_matmul(void **state) {
    (void)state;
    osp_be_session *s;
    assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
    const int64_t ns[] = {1, 2, 3, 5, 8, 9, 17};
    for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
        const wkind *K = &KINDS[k];
        host_weight h;
        make_weight(&h, 45, K->cols, K->dt, K->bits, K->group, K->sdt);
        int64_t C = K->cols, R = h.w.rows, nmax = 17;
        float *x = malloc(sizeof(float) * (size_t)(nmax * C)), *y = malloc(sizeof(float) * (size_t)(nmax * R)),
              *y1 = malloc(sizeof(float) * (size_t)R);
        for (int64_t i = 0; i < nmax * C; i++) x[i] = uniform();
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
            int64_t n = ns[j];
            device_matmul(s, &h, x, n, (int32_t)n, 1, y); /* a decode step of n rows */
            char what[64];
            snprintf(what, sizeof what, "%s, %lld tokens", K->name, (long long)n);
            check_matmul(&h, x, n, y, 1e-5, what);
            for (int64_t t = 0; t < n; t++) { /* each token as alone */
                device_matmul(s, &h, x + t * C, 1, 1, 1, y1);
                if (memcmp(y1, y + t * R, sizeof(float) * (size_t)R) != 0)
                    fail_msg("%s: token %lld differs alone and among %lld", K->name, (long long)t, (long long)n);
            }
        }
        free(x), free(y), free(y1);
        free_weight(&h);
    }
    be->session_free(s);
}

/* The production prefill: bf16 operands on the tensor cores (cuBLAS), f32
 * accumulation: within bf16 rounding of the activations and weights. */
static void test_gemm(void **state) {
    (void)state;
    osp_be_session *s;
    assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
    be->set_fast(s, 1);
    const wkind *ks[] = {&KINDS[2], &KINDS[4], &KINDS[7], &KINDS[0]};
    for (size_t k = 0; k < sizeof ks / sizeof *ks; k++) {
        host_weight h;
        make_weight(&h, 70, ks[k]->cols, ks[k]->dt, ks[k]->bits, ks[k]->group, ks[k]->sdt);
        int64_t n = 40, C = h.w.cols;
        float *x = malloc(sizeof(float) * (size_t)(n * C)), *y = malloc(sizeof(float) * (size_t)(n * h.w.rows));
        for (int64_t i = 0; i < n * C; i++) x[i] = uniform();
        device_matmul(s, &h, x, n, 1, (int32_t)n, y);
        char what[64];
        snprintf(what, sizeof what, "GEMM %s", ks[k]->name);
        check_matmul(&h, x, n, y, 8e-3, what); /* two bf16 roundings of each term: 2^-8 of |terms| at most */
        free(x), free(y);
        free_weight(&h);
    }
    be->session_free(s);
}

static float bf16_round(float v) { return osp_bf16_to_f32(osp_f32_to_bf16(v)); }

/* |got - ref| within tol of sum |w x| with the weights and the inputs rounded to bf16 (the tensor-core kernel's
 * operands; its sums are f32) */
static void check_matmul_bf16(host_weight *h, const float *x, int64_t n, const float *y, double tol,
                              const char *what) {
    int64_t R = h->w.rows, C = h->w.cols;
    float *row = malloc(sizeof(float) * (size_t)C);
    for (int64_t r = 0; r < R; r++) {
        osp_weight_row_f32(&h->w, r, row);
        for (int64_t c = 0; c < C; c++) row[c] = bf16_round(row[c]);
        for (int64_t t = 0; t < n; t++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < C; c++) {
                double term = (double)row[c] * bf16_round(x[t * C + c]);
                ref += term, mag += fabs(term);
            }
            double got = y[t * R + r];
            if (!(fabs(got - ref) <= tol * mag + 1e-30))
                fail_msg("%s: row %lld token %lld: %.9g vs %.9g (|terms| %.3g)", what, (long long)r, (long long)t, got,
                         ref, mag);
        }
    }
    free(row);
}

/* The production decode: bf16 and 4/8-bit weights on the tensor cores (osp_cu_matmul_tc_multi) for decode steps
 * of 1 to 70 rows (one and several token tiles, one and several passes, partial row tiles; blocks of 8 and of 16
 * warps: the bf16 and q8 wide weights take 16), against the
 * bf16-rounded reference; a token's result bitwise the same alone and among n, and a weight's the same alone
 * and fused with another in one launch. Other kinds fall back to the f32 kernels (f16 here: 1e-5). */
static void test_tc(void **state) {
    (void)state;
    osp_be_session *s;
    assert_int_equal(be->session_new(128, 4096, &s), OSP_OK);
    be->set_fast(s, 1);
    const wkind TK[] = {
        {"bf16", OSP_DT_BF16, 0, 0, 0, 2056},         {"bf16 small", OSP_DT_BF16, 0, 0, 0, 40},
        {"q4 g64", 0, 4, 64, OSP_DT_BF16, 1024},      {"q4 g32 f16", 0, 4, 32, OSP_DT_F16, 544},
        {"q4 g128 f32", 0, 4, 128, OSP_DT_F32, 4096}, {"q8 g64", 0, 8, 64, OSP_DT_BF16, 960},
        {"q8 g32", 0, 8, 32, OSP_DT_BF16, 96},        {"q4 g64 wide", 0, 4, 64, OSP_DT_BF16, 8192},
        {"bf16 wide", OSP_DT_BF16, 0, 0, 0, 4096},    {"q8 g64 wide", 0, 8, 64, OSP_DT_BF16, 8192},
        {"f16 (f32 kernel)", OSP_DT_F16, 0, 0, 0, 520},
        {"bf16 2048 (split, staged)", OSP_DT_BF16, 0, 0, 0, 2048}, /* few tiles: split-K, staged */
    };
    const int64_t ns[] = {1, 2, 7, 8, 9, 33, 64, 70};
    const int64_t nmax = 70;
    for (size_t k = 0; k < sizeof TK / sizeof *TK; k++) {
        const wkind *K = &TK[k];
        for (int64_t R = 45; R <= 70; R += 25) {
            host_weight h, h2;
            make_weight(&h, R, K->cols, K->dt, K->bits, K->group, K->sdt);
            make_weight(&h2, 19, K->cols, K->dt, K->bits, K->group, K->sdt);
            int64_t C = K->cols;
            float *x = malloc(sizeof(float) * (size_t)(nmax * C)), *y = malloc(sizeof(float) * (size_t)(nmax * R)),
                  *y1 = malloc(sizeof(float) * (size_t)R);
            for (int64_t i = 0; i < nmax * C; i++) x[i] = uniform();
            for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
                int64_t n = ns[j];
                for (int64_t i = 0; i < n * R; i++) y[i] = NAN; /* every output written */
                device_matmul(s, &h, x, n, (int32_t)n, 1, y);
                char what[96];
                snprintf(what, sizeof what, "tensor cores, %s, %lld rows, %lld tokens", K->name, (long long)R,
                         (long long)n);
                if (K->dt == OSP_DT_F16) check_matmul(&h, x, n, y, 1e-5, what);
                else check_matmul_bf16(&h, x, n, y, 1e-4, what);
                for (int64_t t = 0; t < n; t += n > 9 ? 7 : 1) { /* tokens as alone */
                    device_matmul(s, &h, x + t * C, 1, 1, 1, y1);
                    if (memcmp(y1, y + t * R, sizeof(float) * (size_t)R) != 0)
                        fail_msg("%s: token %lld differs alone and among %lld", what, (long long)t, (long long)n);
                }
            }
            { /* two weights in one launch: each as alone */
                int64_t n = 9, R2 = h2.w.rows;
                osp_dbuf *dx = upload(x, n * C), *da = be->alloc((size_t)(n * R)), *db = be->alloc((size_t)(n * R2));
                const osp_weight *ws[] = {&h.w, &h2.w};
                osp_dbuf *ys[] = {da, db};
                be->begin_chunk(s, (int32_t)n, 1);
                be->matmul(s, ws, 2, dx, n, ys);
                if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                float *ya = malloc(sizeof(float) * (size_t)(n * R)), *yb = malloc(sizeof(float) * (size_t)(n * R2)),
                      *y2 = malloc(sizeof(float) * (size_t)(n * R2));
                be->read(ya, da, n * R), be->read(yb, db, n * R2);
                device_matmul(s, &h, x, n, (int32_t)n, 1, y);
                device_matmul(s, &h2, x, n, (int32_t)n, 1, y2);
                if (memcmp(ya, y, sizeof(float) * (size_t)(n * R)) || memcmp(yb, y2, sizeof(float) * (size_t)(n * R2)))
                    fail_msg("%s: fused launch differs from the weights alone", K->name);
                free(ya), free(yb), free(y2);
                be->free(dx), be->free(da), be->free(db);
            }
            free(x), free(y), free(y1);
            free_weight(&h), free_weight(&h2);
        }
    }
    /* tall weights: more row tiles than a wave of blocks, so the few-token kernel's blocks take several tiles each
     * (and load the next tile's first steps while they reduce the current one's) */
    const wkind TALL[] = {{"bf16 tall", OSP_DT_BF16, 0, 0, 0, 136},
                          {"q4 g64 tall", 0, 4, 64, OSP_DT_BF16, 256},
                          {"q8 g32 tall", 0, 8, 32, OSP_DT_BF16, 160}};
    const int64_t tn[] = {1, 3, 9};
    for (size_t k = 0; k < sizeof TALL / sizeof *TALL; k++) {
        const wkind *K = &TALL[k];
        const int64_t R = 16 * 1100 + 5, C = K->cols, nt = 9;
        host_weight h;
        make_weight(&h, R, C, K->dt, K->bits, K->group, K->sdt);
        float *x = malloc(sizeof(float) * (size_t)(nt * C)), *y = malloc(sizeof(float) * (size_t)(nt * R)),
              *y1 = malloc(sizeof(float) * (size_t)R);
        for (int64_t i = 0; i < nt * C; i++) x[i] = uniform();
        for (size_t j = 0; j < sizeof tn / sizeof *tn; j++) {
            const int64_t n = tn[j];
            for (int64_t i = 0; i < n * R; i++) y[i] = NAN;
            device_matmul(s, &h, x, n, (int32_t)n, 1, y);
            char what[96];
            snprintf(what, sizeof what, "tensor cores, %s, %lld rows, %lld tokens", K->name, (long long)R,
                     (long long)n);
            check_matmul_bf16(&h, x, n, y, 1e-4, what);
            for (int64_t t = 0; t < n; t++) {
                device_matmul(s, &h, x + t * C, 1, 1, 1, y1);
                if (memcmp(y1, y + t * R, sizeof(float) * (size_t)R) != 0)
                    fail_msg("%s: token %lld differs alone and among %lld", what, (long long)t, (long long)n);
            }
        }
        free(x), free(y), free(y1);
        free_weight(&h);
    }
    be->session_free(s);
}

/* A few-token bf16 launch of one weight whose 16-row tile is too large to stage whole (8,192 columns: 256 KB)
 * in enough row tiles to need no split-K (the down projection of a Llama-1B shape): the register kernel; each
 * token bitwise as in a launch of 9 (the many-token kernel), all within the bound of the bf16-rounded reference;
 * a partial last row tile. */
static void test_tc_long_rows(void **state) {
    (void)state;
    osp_be_session *s;
    assert_int_equal(be->session_new(128, 8192, &s), OSP_OK);
    be->set_fast(s, 1);
    const int64_t R = 16 * 67 + 5, C = 8192, N = 9;
    host_weight h;
    make_weight(&h, R, C, OSP_DT_BF16, 0, 0, 0);
    float *x = malloc(sizeof(float) * (size_t)(N * C)), *y9 = malloc(sizeof(float) * (size_t)(N * R)),
          *y = malloc(sizeof(float) * (size_t)(N * R));
    for (int64_t i = 0; i < N * C; i++) x[i] = uniform();
    device_matmul(s, &h, x, N, (int32_t)N, 1, y9);
    check_matmul_bf16(&h, x, N, y9, 1e-4, "bf16 8192 columns, 9 tokens");
    const int64_t ns[] = {1, 3, 8};
    for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
        for (int64_t i = 0; i < ns[j] * R; i++) y[i] = NAN;
        device_matmul(s, &h, x, ns[j], (int32_t)ns[j], 1, y);
        if (memcmp(y, y9, sizeof(float) * (size_t)(ns[j] * R)))
            fail_msg("bf16 8192 columns: %lld tokens differ from the same tokens among 9", (long long)ns[j]);
    }
    free(x), free(y9), free(y);
    free_weight(&h);
    be->session_free(s);
}

static void test_rows(void **state) {
    (void)state;
    osp_be_session *s;
    assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
    enum { N = 6, Dm = 300 };
    float x[N * Dm], w[Dm], g[N * Dm], u[N * Dm], y[N * Dm];
    for (int i = 0; i < N * Dm; i++) x[i] = uniform() * 3, g[i] = uniform() * 4, u[i] = uniform();
    for (int i = 0; i < Dm; i++) w[i] = uniform();
    osp_dbuf *dx = upload(x, N * Dm), *dw = upload(w, Dm), *dg = upload(g, N * Dm), *du = upload(u, N * Dm);
    osp_dbuf *dy = be->alloc(N * Dm);
    for (int add_one = 0; add_one < 2; add_one++) {
        be->begin_chunk(s, N, 1);
        be->rmsnorm(s, dy, dx, dw, N, Dm, 1e-6f, add_one);
        assert_int_equal(be->status(s), OSP_OK);
        be->read(y, dy, N * Dm);
        for (int r = 0; r < N; r++) {
            double ss = 0;
            for (int j = 0; j < Dm; j++) ss += (double)x[r * Dm + j] * x[r * Dm + j];
            double inv = 1.0 / sqrt(ss / Dm + 1e-6);
            for (int j = 0; j < Dm; j++) {
                double ref = x[r * Dm + j] * inv * (add_one ? 1.0 + w[j] : w[j]);
                if (fabs(y[r * Dm + j] - ref) > 1e-5 * (1 + fabs(ref))) fail_msg("rmsnorm %d %d: %g vs %g", r, j, y[r * Dm + j], ref);
            }
        }
    }
    for (int act = 0; act < 2; act++) {
        be->begin_chunk(s, N, 1);
        be->act_mul(s, act ? OSP_ACT_GELU_TANH : OSP_ACT_SILU, dy, dg, du, N, Dm, Dm);
        assert_int_equal(be->status(s), OSP_OK);
        be->read(y, dy, N * Dm);
        for (int i = 0; i < N * Dm; i++) {
            double gv = g[i], a = act ? 0.5 * gv * (1 + tanh(sqrt(2 / M_PI) * (gv + 0.044715 * gv * gv * gv)))
                                      : gv / (1 + exp(-gv));
            double ref = a * u[i];
            if (fabs(y[i] - ref) > 1e-5 * (1 + fabs(ref))) fail_msg("act %d at %d: %g vs %g", act, i, y[i], ref);
        }
    }
    /* RoPE: 2 rows x 3 tokens x 2 heads of D = 8, rows at positions 5 and 40 */
    {
        enum { B = 2, T = 3, Hh = 2, Dh = 8 };
        float q[B * T * Hh * Dh], inv[Dh / 2], out[B * T * Hh * Dh];
        int32_t pos[B] = {5, 40};
        for (int i = 0; i < B * T * Hh * Dh; i++) q[i] = uniform();
        for (int i = 0; i < Dh / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / Dh);
        osp_dbuf *dq = upload(q, B * T * Hh * Dh), *di = upload(inv, Dh / 2);
        be->begin_chunk(s, B, T);
        be->rope(s, dq, B, T, Hh, Dh, di, pos);
        assert_int_equal(be->status(s), OSP_OK);
        be->read(out, dq, B * T * Hh * Dh);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int hh = 0; hh < Hh; hh++)
                    for (int i = 0; i < Dh / 2; i++) {
                        const float *v = q + ((b * T + t) * Hh + hh) * Dh;
                        const float *o = out + ((b * T + t) * Hh + hh) * Dh;
                        double a = (double)(float)((float)(pos[b] + t) * inv[i]);
                        double r1 = v[i] * cos(a) - v[i + Dh / 2] * sin(a), r2 = v[i + Dh / 2] * cos(a) + v[i] * sin(a);
                        if (fabs(o[i] - r1) > 1e-5 || fabs(o[i + Dh / 2] - r2) > 1e-5)
                            fail_msg("rope b%d t%d h%d i%d: %g %g vs %g %g", b, t, hh, i, o[i], o[i + Dh / 2], r1, r2);
                    }
        be->free(dq), be->free(di);
    }
    be->free(dx), be->free(dw), be->free(dg), be->free(du), be->free(dy);
    be->session_free(s);
}

static void test_bandwidth_probe(void **state) {
    (void)state;
    double g = be->bw_trial(0);
    printf("# device read bandwidth, one trial: %.0f GB/s\n", g);
    if (strstr(be->name, "emulator")) assert_true(g > 0); /* tests/cuemu: the probe runs, its figure means nothing */
    else assert_true(g > 10);                             /* any GPU reads faster than this */
    be->bw_trial(1);
}

/* The host's greedy rule (ops->argmax, the sampler's): the first largest non-NaN value, 0 when all are NaN. */
static int32_t host_argmax(const float *x, int64_t n) {
    int64_t b = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b])) b = i;
    return b < 0 ? 0 : (int32_t)b;
}

/* Ids out: the head's argmax on the device against the host's on the same logits (those of a step that brought
 * every row back), and a masked step's wanted rows bitwise equal, over decode steps run eagerly, captured and
 * replayed as graphs (a staged rope makes the step one). The weight has NaN rows (never chosen), equal rows (ties:
 * the lower index), and rows that dominate for inputs of one sign; with a soft-cap, large logits saturate to
 * exactly the cap (ties again). */
static void test_head_ids(void **state) {
    (void)state;
    enum { H = 64, V = 40000 + 77 };
    host_weight h;
    memset(&h, 0, sizeof h);
    h.w.rows = V, h.w.cols = H, h.w.dtype = OSP_DT_F32;
    float *wd = malloc(sizeof(float) * (size_t)V * H);
    h.data = wd;
    h.w.data = wd;
    for (int64_t i = 0; i < (int64_t)V * H; i++) wd[i] = uniform();
    for (int j = 0; j < H; j++) {
        wd[0 * H + j] = wd[7 * H + j] = NAN;
        wd[100 * H + j] = wd[200 * H + j] = 1.0f;
        wd[300 * H + j] = wd[400 * H + j] = -1.0f;
        wd[(int64_t)(V - 1) * H + j] = wd[(int64_t)(V - 5) * H + j]; /* a tie in the tail */
    }
    osp_weight *ws[] = {&h.w};
    assert_int_equal(be->place(ws, 1, NULL, 0, NULL, 0, &h.owned), OSP_OK);
    float nw[H], inv[4];
    for (int j = 0; j < H; j++) nw[j] = 1.0f + 0.1f * uniform();
    for (int i = 0; i < 4; i++) inv[i] = powf(10000.0f, -0.5f * i);
    osp_dbuf *dn = upload(nw, H), *di = upload(inv, 4);
    const int32_t Bs[] = {1, 5, 70};
    for (size_t bi = 0; bi < sizeof Bs / sizeof *Bs; bi++) {
        const int32_t B = Bs[bi];
        osp_be_session *s;
        assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
        float *x = malloc(sizeof(float) * B * H), *full = malloc(sizeof(float) * (size_t)B * V),
              *part = malloc(sizeof(float) * (size_t)B * V);
        int32_t *ids = malloc(sizeof(int32_t) * B), *ids2 = malloc(sizeof(int32_t) * B), *pos = malloc(sizeof(int32_t) * B);
        uint8_t *all = malloc((size_t)B), *need = malloc((size_t)B);
        osp_dbuf *dx = be->alloc((size_t)B * H), *xn = be->alloc((size_t)B * H), *hl = be->alloc((size_t)B * H),
                 *dr = be->alloc((size_t)B * 8);
        memset(all, 1, (size_t)B);
        for (int cap = 0; cap < 2; cap++)
            for (int it = 0; it < 6; it++) {
                for (int32_t b = 0; b < B; b++) { /* rows of one sign (the dominant rows win) or mixed */
                    int kind = (b + it) % 3;
                    for (int j = 0; j < H; j++) {
                        float u = uniform();
                        x[b * H + j] = kind == 0 ? u : kind == 1 ? 0.5f + 0.5f * fabsf(u) : -0.5f - 0.5f * fabsf(u);
                    }
                    pos[b] = it + b;
                    need[b] = (b * 7 + it) % 3 == 0;
                }
                be->write(dx, x, (int64_t)B * H);
                osp_head_args a = {.x = dx, .norm = dn, .w = &h.w, .B = B, .T = 1, .hidden = H, .vocab = V,
                                   .ld_rows = 1, .eps = 1e-6f, .softcap = cap ? 2.0f : 0.0f, .xn = xn, .hlast = hl};
                for (int pass = 0; pass < 2; pass++) {
                    a.logits = pass ? part : full, a.ids = pass ? ids2 : ids;
                    a.need = pass ? (it % 3 == 2 ? NULL : need) : all;
                    be->begin_chunk(s, B, 1);
                    be->rope(s, dr, B, 1, 1, 8, di, pos); /* staged positions: the step can become a graph */
                    be->head(s, &a);
                    if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                }
                for (int32_t b = 0; b < B; b++) {
                    const float *l = full + (int64_t)b * V;
                    int32_t want = host_argmax(l, V);
                    if (ids[b] != want || ids2[b] != want)
                        fail_msg("B %d cap %d step %d row %d: device %d / %d, host %d (%g vs %g)", B, cap, it, b,
                                 ids[b], ids2[b], want, l[ids[b]], l[want]);
                    if (it % 3 != 2 && need[b] && memcmp(l, part + (int64_t)b * V, sizeof(float) * V))
                        fail_msg("B %d cap %d step %d row %d: the wanted logits differ", B, cap, it, b);
                }
            }
        be->free(dx), be->free(xn), be->free(hl), be->free(dr);
        free(x), free(full), free(part), free(ids), free(ids2), free(pos), free(all), free(need);
        be->session_free(s);
    }
    be->free(dn), be->free(di);
    be->unplace(h.owned);
    free(wd);
}

/* A step fed with the previous head's ids where they are (embed_prev, osp_forward_rows_chain's way): every kind
 * of weight's rows, with and without a scale, bitwise the host's (osp_weight_row_f32, then the scale, as the host's
 * embed); the ids of a head that defers them (defer_ids) come with ids_wait. The head's weight is an identity and
 * its input one-hot, so its greedy tokens are the chosen ones. */
static void test_embed_prev(void **state) {
    (void)state;
    enum { V = 300, B = 3 };
    host_weight hw;
    memset(&hw, 0, sizeof hw);
    hw.w.rows = V, hw.w.cols = V, hw.w.dtype = OSP_DT_F32;
    float *id = calloc((size_t)V * V, sizeof(float)), *x = malloc(sizeof(float) * B * V), ones[V];
    for (int i = 0; i < V; i++) id[(int64_t)i * V + i] = 1.0f, ones[i] = 1.0f;
    hw.data = id, hw.w.data = id;
    osp_weight *ws[] = {&hw.w};
    assert_int_equal(be->place(ws, 1, NULL, 0, NULL, 0, &hw.owned), OSP_OK);
    osp_dbuf *dn = upload(ones, V), *dx = be->alloc((size_t)B * V), *xn = be->alloc((size_t)B * V),
             *hl = be->alloc((size_t)B * V);
    float *lg = malloc(sizeof(float) * B * V);
    osp_be_session *s;
    assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
    assert_non_null(be->embed_prev);
    for (size_t k = 0; k < sizeof KINDS / sizeof *KINDS; k++) {
        const wkind *kd = &KINDS[k];
        host_weight e;
        osp_weight unplaced = {0};
        assert_int_equal(be->can_embed_prev(&unplaced), 0);
        make_weight(&e, V, kd->cols, kd->dt, kd->bits, kd->group, kd->sdt);
        assert_int_equal(be->can_embed_prev(&e.w), 1);
        const int64_t H = kd->cols;
        osp_dbuf *de = be->alloc((size_t)(B * H));
        float *got = malloc(sizeof(float) * B * H), *want = malloc(sizeof(float) * H);
        for (int round = 0; round < 3; round++) {
            int32_t t[B], ids[B];
            memset(x, 0, sizeof(float) * B * V);
            for (int b = 0; b < B; b++) t[b] = (int32_t)(next_u32() % V), x[b * V + t[b]] = 1.0f;
            be->write(dx, x, B * V);
            osp_head_args a = {.x = dx, .norm = dn, .w = &hw.w, .B = B, .T = 1, .hidden = V, .vocab = V, .ld_rows = 1,
                               .eps = 1e-6f, .logits = lg, .ids = ids, .defer_ids = round != 1, .xn = xn, .hlast = hl};
            be->begin_chunk(s, B, 1);
            be->head(s, &a);
            if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
            if (be->ids_wait(s) != OSP_OK) fail_msg("%s", osp_last_error());
            for (int b = 0; b < B; b++) assert_int_equal(ids[b], t[b]);
            const float sc = round == 2 ? 45.254833995939045f : 1.0f; /* (sqrt(2048) in f32, Gemma's kind) */
            be->begin_chunk(s, B, 1);
            be->embed_prev(s, &e.w, sc, B, de);
            if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
            be->read(got, de, B * H);
            for (int b = 0; b < B; b++) {
                osp_weight_row_f32(&e.w, t[b], want);
                for (int64_t j = 0; sc != 1.0f && j < H; j++) want[j] *= sc;
                if (memcmp(want, got + b * H, sizeof(float) * H))
                    fail_msg("%s, round %d: row %d (id %d) differs from the host's", kd->name, round, b, t[b]);
            }
        }
        be->free(de);
        free(got), free(want);
        free_weight(&e);
    }
    be->session_free(s);
    be->free(dn), be->free(dx), be->free(xn), be->free(hl);
    be->unplace(hw.owned);
    free(id), free(x), free(lg);
}

/* rope_qk: q's and k's head norms fused into their RoPE launch, bitwise the
 * plain operations (a session made with OSP_CUDA_FUSE=0: backend/fused.c's
 * sequence), as the models call it (Gemma 4 with v's weightless norm after,
 * a KV-sharing layer's q alone, Qwen 3, Llama), with weights, add_one and
 * partial RoPE. */
static void test_norm_rope(void **state) {
    (void)state;
    enum { B = 3, T = 5, HQ = 4, HK = 2, DH = 64, NQ = B * T * HQ * DH, NK = B * T * HK * DH };
    const int32_t pos[B] = {0, 17, 300};
    static float q[NQ], k[NK], v[NK], out[2][4][3][NQ]; /* [fuse][order][q, k, v] */
    float inv[DH / 2], wq[DH], wk[DH];
    for (int i = 0; i < DH / 2; i++) inv[i] = i < DH / 2 - 4 ? powf(10000.0f, -2.0f * i / DH) : 0.0f;
    for (int i = 0; i < DH; i++) wq[i] = 1.0f + 0.3f * uniform(), wk[i] = 0.2f * uniform();
    for (int i = 0; i < NQ; i++) q[i] = 3.0f * uniform();
    for (int i = 0; i < NK; i++) k[i] = uniform(), v[i] = uniform();
    osp_dbuf *di = upload(inv, DH / 2), *dwq = upload(wq, DH), *dwk = upload(wk, DH);
    for (int fuse = 0; fuse < 2; fuse++) {
        if (!fuse) osp_options_set("OSP_CUDA_FUSE", "0");
        osp_be_session *s;
        assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
        osp_options_set("OSP_CUDA_FUSE", NULL);
        for (int order = 0; order < 4; order++)
            for (int it = 0; it < 2; it++) { /* twice: nothing held leaks from one chunk into the next */
                osp_dbuf *dq = upload(q, NQ), *dk = upload(k, NK), *dv = upload(v, NK);
                be->begin_chunk(s, B, T);
                osp_rope_qk_args r = {.q = dq, .k = dk, .q_heads = HQ, .k_heads = HK, .B = B, .T = T, .D = DH,
                                      .inv_freq = di, .pos = pos, .q_norm = dwq, .k_norm = dwk, .eps = 1e-6f};
                if (order == 0) { /* Gemma 4 */
                    osp_be_rope_qk(be, s, &r);
                    be->rmsnorm(s, dv, dv, NULL, (int64_t)B * T * HK, DH, 1e-6f, 0);
                } else if (order == 1) { /* q alone (a layer reading another's K/V) */
                    r.k = NULL, r.k_norm = NULL, r.add_one = 1;
                    osp_be_rope_qk(be, s, &r);
                } else if (order == 2) { /* both norms, 1 + w */
                    r.add_one = 1;
                    osp_be_rope_qk(be, s, &r);
                } else { /* no norms; a norm of v last */
                    r.q_norm = r.k_norm = NULL;
                    osp_be_rope_qk(be, s, &r);
                    be->rmsnorm(s, dv, dv, dwk, (int64_t)B * T * HK, DH, 1e-6f, 0);
                }
                if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                be->read(out[fuse][order][0], dq, NQ);
                be->read(out[fuse][order][1], dk, NK);
                be->read(out[fuse][order][2], dv, NK);
                be->free(dq), be->free(dk), be->free(dv);
            }
        be->session_free(s);
    }
    for (int order = 0; order < 4; order++)
        for (int t = 0; t < 3; t++)
            if (memcmp(out[0][order][t], out[1][order][t], sizeof(float) * (t ? NK : NQ)))
                fail_msg("order %d tensor %d: fused and separate launches differ", order, t);
    be->free(di), be->free(dwq), be->free(dwk);
}

/* Routed experts in production precision: the device path (routing,
 * grouping, the grouped matmuls and the combine on the GPU) against the
 * host path (OSP_CUDA_MOE=host: routing on the host), a token's numbers
 * bitwise the same alone and among others, and the same in a captured
 * graph as eager. */
enum { ME = 12, MK = 3, MH = 256, MI = 128, MN = 9, MV = 64 };

typedef struct moe_fix {
    host_weight gate[ME], up[ME], down[ME], router, head;
    osp_weight gw[ME], uw[ME], dw[ME];
    osp_dbuf *x, *x2, *out, *normed, *probs, *moe_x, *moe_acc, *g, *u, *rs, *pes, *hn, *xn, *hl, *dr, *inv;
    int32_t top_idx[MN * MK], rows[MN * MK];
    float top_w[MN * MK], row_w[MN * MK];
} moe_fix;

static osp_moe_args moe_args(moe_fix *f, int64_t N) {
    osp_moe_args a = {.x = f->x, .x2 = f->x2, .out = f->out, .n = N, .hidden = MH, .n_experts = ME, .top_k = MK,
                      .inter = MI, .eps = 1e-6f, .scale = 0.0625f, .router_scale = f->rs, .per_expert_scale = f->pes,
                      .router = &f->router.w, .gate = f->gw, .up = f->uw, .down = f->dw, .act = OSP_ACT_GELU_TANH,
                      .normed = f->normed, .probs = f->probs, .moe_x = f->moe_x, .moe_acc = f->moe_acc, .g = f->g,
                      .u = f->u, .top_idx = f->top_idx, .rows = f->rows, .top_w = f->top_w, .row_w = f->row_w};
    return a;
}

/* one chunk of N rows of one token: the experts of x, x2 into out (host); with a head (graphs: a step
 * ends at its head) when logits is not NULL */
static void moe_step(osp_be_session *s, moe_fix *f, int64_t N, const float *x, const float *x2, float *out,
                     float *logits) {
    be->write(f->x, x, N * MH), be->write(f->x2, x2, N * MH);
    osp_moe_args a = moe_args(f, N);
    be->begin_chunk(s, (int32_t)N, 1);
    if (logits) {
        int32_t pos[MN];
        for (int i = 0; i < MN; i++) pos[i] = 3 + i;
        be->rope(s, f->dr, (int32_t)N, 1, 1, 8, f->inv, pos); /* staged data: the step can become a graph */
    }
    be->moe(s, &a);
    if (logits) {
        osp_head_args h = {.x = f->out, .norm = f->hn, .w = &f->head.w, .B = (int32_t)N, .T = 1, .hidden = MH,
                           .vocab = MV, .ld_rows = 1, .eps = 1e-6f, .logits = logits, .xn = f->xn, .hlast = f->hl};
        be->head(s, &h);
    }
    if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
    be->read(out, f->out, N * MH);
}

static void test_moe(void **state) {
    (void)state;
    for (int kind = 0; kind < 2; kind++) { /* 4-bit experts, then bf16 */
        moe_fix *f = calloc(1, sizeof *f);
        for (int e = 0; e < ME; e++) {
            if (kind == 0) {
                make_weight(&f->gate[e], MI, MH, 0, 4, 64, OSP_DT_BF16);
                make_weight(&f->up[e], MI, MH, 0, 4, 64, OSP_DT_BF16);
                make_weight(&f->down[e], MH, MI, 0, 4, 64, OSP_DT_BF16);
            } else {
                make_weight(&f->gate[e], MI, MH, OSP_DT_BF16, 0, 0, 0);
                make_weight(&f->up[e], MI, MH, OSP_DT_BF16, 0, 0, 0);
                make_weight(&f->down[e], MH, MI, OSP_DT_BF16, 0, 0, 0);
            }
            f->gw[e] = f->gate[e].w, f->uw[e] = f->up[e].w, f->dw[e] = f->down[e].w;
        }
        make_weight(&f->router, ME, MH, OSP_DT_BF16, 0, 0, 0);
        make_weight(&f->head, MV, MH, OSP_DT_F32, 0, 0, 0);
        float rs[MH], pes[ME], hn[MH], inv[4];
        for (int j = 0; j < MH; j++) rs[j] = 1.0f + 0.5f * uniform(), hn[j] = 1.0f + 0.1f * uniform();
        for (int e = 0; e < ME; e++) pes[e] = 1.0f + 0.25f * uniform();
        for (int i = 0; i < 4; i++) inv[i] = powf(10000.0f, -0.5f * i);
        f->rs = upload(rs, MH), f->pes = upload(pes, ME), f->hn = upload(hn, MH), f->inv = upload(inv, 4);
        osp_dbuf **bufs[] = {&f->x, &f->x2, &f->out, &f->normed, &f->xn, &f->hl};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) assert_non_null(*bufs[i] = be->alloc(MN * MH));
        assert_non_null(f->probs = be->alloc(MN * ME));
        assert_non_null(f->moe_x = be->alloc(MN * MK * MH));
        assert_non_null(f->moe_acc = be->alloc(MN * MK * MH));
        assert_non_null(f->g = be->alloc(MN * MK * MI));
        assert_non_null(f->u = be->alloc(MN * MK * MI));
        assert_non_null(f->dr = be->alloc(MN * 8));
        float x[MN * MH], x2[MN * MH], dev[MN * MH], host[MN * MH], one[MH];
        for (int i = 0; i < MN * MH; i++) x[i] = uniform(), x2[i] = uniform();

        osp_be_session *s;
        assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
        be->set_fast(s, 1);
        const int64_t Ns[] = {1, 4, MN};
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
            const int64_t N = Ns[ni];
            moe_step(s, f, N, x, x2, dev, NULL);
            osp_options_set("OSP_CUDA_MOE", "host");
            moe_step(s, f, N, x, x2, host, NULL);
            osp_options_set("OSP_CUDA_MOE", NULL);
            for (int64_t i = 0; i < N; i++) {
                double mx = 0;
                for (int j = 0; j < MH; j++) mx = fmax(mx, fabs(host[i * MH + j]));
                for (int j = 0; j < MH; j++)
                    if (!(fabs(dev[i * MH + j] - host[i * MH + j]) <= 1e-5 * fmax(1.0, mx)))
                        fail_msg("kind %d N %lld token %lld col %d: device %.9g, host %.9g", kind, (long long)N,
                                 (long long)i, j, dev[i * MH + j], host[i * MH + j]);
            }
            for (int64_t i = 0; i < N; i++) { /* each token alone: the same bits */
                moe_step(s, f, 1, x + i * MH, x2 + i * MH, one, NULL);
                if (memcmp(one, dev + i * MH, sizeof one))
                    fail_msg("kind %d N %lld token %lld: alone and among others differ", kind, (long long)N,
                             (long long)i);
            }
        }
        be->session_free(s); /* (the host path turned its graphs off) */
        assert_int_equal(be->session_new(64, 4096, &s), OSP_OK);
        be->set_fast(s, 1);
        /* graphs: the same steps replayed as eagerly (a session without graphs) */
        osp_options_set("OSP_CUDA_GRAPHS", "0");
        osp_be_session *s0;
        assert_int_equal(be->session_new(64, 4096, &s0), OSP_OK);
        osp_options_set("OSP_CUDA_GRAPHS", NULL);
        be->set_fast(s0, 1);
        float lg[MN * MV], lg0[MN * MV], out0[MN * MH];
        for (int it = 0; it < 5; it++) {
            for (int i = 0; i < 4 * MH; i++) x[i] = uniform(), x2[i] = uniform();
            moe_step(s, f, 4, x, x2, dev, lg);
            moe_step(s0, f, 4, x, x2, out0, lg0);
            if (memcmp(dev, out0, sizeof(float) * 4 * MH) || memcmp(lg, lg0, sizeof(float) * 4 * MV))
                fail_msg("kind %d step %d: the graph's experts differ from the eager run's", kind, it);
        }
        be->session_free(s0);
        be->session_free(s);
        for (int e = 0; e < ME; e++) free_weight(&f->gate[e]), free_weight(&f->up[e]), free_weight(&f->down[e]);
        free_weight(&f->router), free_weight(&f->head);
        osp_dbuf *all[] = {f->x, f->x2, f->out, f->normed, f->xn, f->hl, f->probs, f->moe_x, f->moe_acc, f->g,
                           f->u, f->dr, f->rs, f->pes, f->hn, f->inv};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) be->free(all[i]);
        free(f);
    }
}

/* The fused launches of a few-token step (the default) against every launch on its own (OSP_CUDA_FUSE=0),
 * bitwise: a decode step's k and v stored by the launch that rotates k, or rotated and stored by attention (f32,
 * bf16, 8-bit and 4-bit KV; a full layer and a sliding one; rows of 5 to 600 positions: one split and several),
 * plus a verification chunk of exact tokens; gate and up with their activation in one launch. */
/* fuse 1: every launch on its own (OSP_CUDA_FUSE=0); 2: the default */
static osp_be_session *fuse_session(int fuse) {
    if (fuse == 1) osp_options_set("OSP_CUDA_FUSE", "0");
    osp_be_session *s;
    assert_int_equal(be->session_new(64, 8192, &s), OSP_OK);
    osp_options_set("OSP_CUDA_FUSE", NULL);
    be->set_fast(s, 1);
    return s;
}

/* gate_up_act (the MLP's gate and up with their activation): by default one launch for a few tokens
 * (osp_cu_matmul_tc_pair: a tile's rows are 8 gate rows and the same 8 up rows, y = act(gate) * up written
 * once), the same numbers as the two weights' launch and act_mul; up's output (the scratch u) is then never
 * written. Where that launch would split the columns (few rows), the pair is not taken: the same launches as
 * without. bf16, 4-bit and 8-bit weights, both activations, 1 to 8 tokens. */
static void test_fuse_pair(void **state) {
    (void)state;
    const wkind PK[] = {
        {"bf16", OSP_DT_BF16, 0, 0, 0, 256},
        {"q4 g64", 0, 4, 64, OSP_DT_BF16, 512},
        {"q8 g64", 0, 8, 64, OSP_DT_BF16, 256},
    };
    const int64_t Rs[] = {2200, 72}; /* one split (the pair), several (not: long rows) */
    const int64_t ns[] = {1, 3, 8};
    osp_be_session *s1 = fuse_session(1), *s2 = fuse_session(2);
    for (size_t k = 0; k < sizeof PK / sizeof *PK; k++)
        for (size_t ri = 0; ri < sizeof Rs / sizeof *Rs; ri++) {
            const wkind *K = &PK[k];
            /* (several splits need 64 steps of 4 chunks a row at least: 2048 bf16 columns, 4096 8-bit, 8192 4-bit) */
            const int64_t R = Rs[ri], C = ri == 0 ? K->cols : 2048 * (K->bits == 4 ? 4 : K->bits == 8 ? 2 : 1), nmax = 8;
            host_weight hg, hu;
            make_weight(&hg, R, C, K->dt, K->bits, K->group, K->sdt);
            make_weight(&hu, R, C, K->dt, K->bits, K->group, K->sdt);
            const int paired = ri == 0;
            float *x = malloc(sizeof(float) * (size_t)(nmax * C)), *nan = malloc(sizeof(float) * (size_t)(nmax * R));
            float *y[2], *go[2];
            for (int f = 0; f < 2; f++)
                y[f] = malloc(sizeof(float) * (size_t)(nmax * R)), go[f] = malloc(sizeof(float) * (size_t)(nmax * R));
            for (int64_t i = 0; i < nmax * C; i++) x[i] = uniform();
            for (int64_t i = 0; i < nmax * R; i++) nan[i] = NAN;
            for (int act = 0; act < 2; act++)
                for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
                    const int64_t n = ns[j];
                    for (int f = 0; f < 2; f++) {
                        osp_be_session *s = f ? s2 : s1;
                        osp_dbuf *dx = upload(x, n * C), *dg = upload(nan, n * R), *du = upload(nan, n * R),
                                 *dy = be->alloc((size_t)(n * R));
                        assert_non_null(dy);
                        be->begin_chunk(s, (int32_t)n, 1);
                        osp_be_gate_up_act(be, s, act ? OSP_ACT_GELU_TANH : OSP_ACT_SILU, &hg.w, &hu.w, dx, n, dy, du);
                        if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                        be->read(y[f], dy, n * R), be->read(go[f], du, n * R);
                        be->free(dx), be->free(dg), be->free(du), be->free(dy);
                    }
                    if (memcmp(y[0], y[1], sizeof(float) * (size_t)(n * R)))
                        fail_msg("%s, %lld rows, act %d, %lld tokens: the paired launch differs from its two", K->name,
                                 (long long)R, act, (long long)n);
                    for (int64_t i = 0; i < n * R; i++)
                        if (isnan(go[0][i]) || isnan(go[1][i]) != paired)
                            fail_msg("%s, %lld rows, %lld tokens: up's output %s", K->name, (long long)R,
                                     (long long)n, isnan(go[0][i]) ? "unwritten without the pair" :
                                     paired ? "written (the pair did not run)" : "unwritten (the pair ran)");
                }
            for (int f = 0; f < 2; f++) free(y[f]), free(go[f]);
            free(x), free(nan);
            free_weight(&hg), free_weight(&hu);
        }
    be->session_free(s1), be->session_free(s2);
}

enum { FB = 3, FHQ = 6, FHK = 2, FD = 64, FL = 2 }; /* 3 query heads a KV head: an odd G */

/* a layer's cache of a row, as bytes on the host */
static unsigned char *kv_bytes(const osp_kv *kv, int layer, int32_t row, size_t *n) {
    const osp_kv_layer *l = &kv->layers[layer];
    *n = (size_t)2 * (size_t)l->n_kv_heads * (size_t)l->cap[row] * (size_t)l->slot_bytes;
    unsigned char *h = malloc(*n);
    if (kv->mem) kv->mem->to_host(h, l->mem[row], *n);
    else memcpy(h, l->mem[row], *n);
    return h;
}

static void test_fuse_attention(void **state) {
    (void)state;
    const int32_t lens[FB] = {5, 140, 600}, rows[FB] = {0, 1, 2};
    const int bits[] = {0, 16, 8, 4};
    float inv[FD / 2];
    for (int i = 0; i < FD / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / FD);
    osp_dbuf *di = upload(inv, FD / 2);
    const int64_t NQ = (int64_t)FB * 3 * FHQ * FD, NK = (int64_t)FB * 3 * FHK * FD; /* up to 3 tokens a row */
    float *q = malloc(sizeof(float) * (size_t)NQ), *k = malloc(sizeof(float) * (size_t)NK),
          *v = malloc(sizeof(float) * (size_t)NK), *out[2];
    out[0] = malloc(sizeof(float) * (size_t)NQ), out[1] = malloc(sizeof(float) * (size_t)NQ);
    const int64_t pre = 600 * FHK * FD;
    float *pk = malloc(sizeof(float) * (size_t)pre), *pv = malloc(sizeof(float) * (size_t)pre);
    for (int64_t i = 0; i < pre; i++) pk[i] = uniform(), pv[i] = uniform();
    for (size_t bi = 0; bi < sizeof bits / sizeof *bits; bi++) {
        osp_kv_spec sp[FL] = {{FHK, FD, 0, -1, bits[bi], 32}, {FHK, FD, 100, -1, bits[bi], 32}};
        osp_kv *kv[2];
        osp_be_session *ss[2] = {fuse_session(1), fuse_session(2)};
        for (int f = 0; f < 2; f++) {
            assert_int_equal(osp_kv_new(FB, FL, sp, 700, 4, be->kv_mem, &kv[f]), OSP_OK);
            for (int32_t r = 0; r < FB; r++) {
                assert_int_equal(osp_kv_reserve(kv[f], r, lens[r] + 8), OSP_OK);
                osp_dbuf *dk = upload(pk, (int64_t)lens[r] * FHK * FD), *dv = upload(pv, (int64_t)lens[r] * FHK * FD);
                be->begin_chunk(ss[f], 1, lens[r]);
                for (int li = 0; li < FL; li++) be->kv_write(ss[f], kv[f], li, &rows[r], 1, dk, dv, lens[r]);
                if (be->status(ss[f]) != OSP_OK) fail_msg("%s", osp_last_error());
                be->free(dk), be->free(dv);
                kv[f]->pos[r] = lens[r];
            }
        }
        /* three decode steps, then a chunk of 3 exact tokens */
        for (int step = 0; step < 4; step++) {
            const int32_t T = step < 3 ? 1 : 3;
            const int64_t nq = (int64_t)FB * T * FHQ * FD, nk = (int64_t)FB * T * FHK * FD;
            for (int64_t i = 0; i < nq; i++) q[i] = uniform();
            for (int64_t i = 0; i < nk; i++) k[i] = uniform(), v[i] = uniform();
            for (int li = 0; li < FL; li++) {
                for (int f = 0; f < 2; f++) {
                    osp_be_session *s = ss[f];
                    int32_t pos[FB];
                    for (int b = 0; b < FB; b++) pos[b] = kv[f]->pos[rows[b]];
                    osp_dbuf *dq = upload(q, nq), *dk = upload(k, nk), *dv = upload(v, nk), *dout = be->alloc((size_t)nq);
                    const int64_t stride = 700 + 64;
                    osp_dbuf *dsc = be->alloc((size_t)(FB * T * FHQ * stride));
                    assert_non_null(dout), assert_non_null(dsc);
                    be->set_exact_tokens(s, T > 1);
                    be->begin_chunk(s, FB, T);
                    osp_attn_args a = {.kv = kv[f], .layer = li, .rows = rows, .nb = FB, .T = T, .n_heads = FHQ,
                                       .n_kv_heads = FHK, .head_dim = FD, .scale = 0.125f, .window = li ? 100 : 0,
                                       .q = dq, .k = dk, .v = dv, .out = dout, .scores = dsc, .score_stride = stride,
                                       .chunk_stored = T > 1};
                    osp_rope_qk_args r = {.q = dq, .k = dk, .q_heads = FHQ, .k_heads = FHK, .B = FB, .T = T,
                                          .D = FD, .inv_freq = di, .pos = pos, .kv = kv[f], .layer = li,
                                          .rows = rows, .v = dv, .attn = &a};
                    osp_be_rope_qk(be, s, &r); /* the model's call for these chunks */
                    if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                    be->read(out[f], dout, nq);
                    be->free(dq), be->free(dk), be->free(dv), be->free(dout), be->free(dsc);
                }
                if (memcmp(out[0], out[1], sizeof(float) * (size_t)nq))
                    fail_msg("KV bits %d layer %d step %d: attention differs fused and separate", bits[bi], li, step);
                for (int32_t r = 0; r < FB; r++) {
                    size_t n0, n1;
                    unsigned char *c0 = kv_bytes(kv[0], li, r, &n0), *c1 = kv_bytes(kv[1], li, r, &n1);
                    if (n0 != n1 || memcmp(c0, c1, n0))
                        fail_msg("KV bits %d layer %d step %d row %d: the stored cache differs", bits[bi], li, step, r);
                    free(c0), free(c1);
                }
            }
            for (int f = 0; f < 2; f++)
                for (int b = 0; b < FB; b++) kv[f]->pos[rows[b]] += T;
        }
        for (int f = 0; f < 2; f++) osp_kv_free(kv[f]), be->session_free(ss[f]);
    }
    free(q), free(k), free(v), free(out[0]), free(out[1]), free(pk), free(pv);
    be->free(di);
}

/* The compact attention kernel (cuda_attention 2: in every step) against the split kernel (1) and a host
 * reference in double, f32 cache: head sizes 16 to 512, 1 to 16 query heads a KV head (7: not a power of
 * two), rows of 1 to 5 splits, a full and a sliding layer, two decode steps and a chunk of 3 exact tokens.
 * Both kernels must be within the goldens' bound of the reference, and bitwise the same (every sum is taken
 * in the same order: a step's choice of kernel, by its number of tokens, must not change a row's numbers). */
static void test_attn_compact(void **state) {
    (void)state;
    static const struct { int32_t D, hq, hk; } SH[] = {{16, 4, 2}, {64, 32, 8}, {128, 14, 2}, {256, 8, 1}, {512, 16, 1}, {64, 2, 2}};
    enum { NB = 3, NL = 2, MAXP = 640 };
    const int32_t lens[NB] = {5, 140, 600}, rows[NB] = {0, 1, 2};
    for (size_t si = 0; si < sizeof SH / sizeof *SH; si++) {
        const int32_t D = SH[si].D, HQ = SH[si].hq, HK = SH[si].hk, G = HQ / HK;
        /* host copies of every row's K and V (unrotated: this test has no RoPE), [layer][row][pos][HK*D] */
        const size_t per = (size_t)MAXP * HK * D;
        float *Kh = malloc(sizeof(float) * NL * NB * per), *Vh = malloc(sizeof(float) * NL * NB * per);
        float *q = malloc(sizeof(float) * NB * 3 * HQ * D), *out[2], *ref = malloc(sizeof(float) * NB * 3 * HQ * D);
        out[0] = malloc(sizeof(float) * NB * 3 * HQ * D), out[1] = malloc(sizeof(float) * NB * 3 * HQ * D);
        assert_non_null(Kh), assert_non_null(Vh), assert_non_null(q), assert_non_null(ref);
        for (size_t i = 0; i < NL * NB * per; i++) Kh[i] = uniform(), Vh[i] = uniform();
        osp_kv_spec sp[NL] = {{HK, D, 0, -1, 0, 32}, {HK, D, 100, -1, 0, 32}};
        osp_kv *kv[2];
        osp_be_session *ss[2];
        for (int f = 0; f < 2; f++) {
            osp_options_set("cuda_attention", f ? "2" : "1"); /* the compact kernel in every step, or in none */
            assert_int_equal(be->session_new(64, 8192, &ss[f]), OSP_OK);
            osp_options_set("cuda_attention", NULL);
            be->set_fast(ss[f], 1);
            assert_int_equal(osp_kv_new(NB, NL, sp, MAXP, 4, be->kv_mem, &kv[f]), OSP_OK);
            for (int32_t r = 0; r < NB; r++) {
                assert_int_equal(osp_kv_reserve(kv[f], r, lens[r] + 8), OSP_OK);
                be->begin_chunk(ss[f], 1, lens[r]);
                for (int li = 0; li < NL; li++) {
                    const float *src = Kh + ((size_t)li * NB + r) * per, *srv = Vh + ((size_t)li * NB + r) * per;
                    osp_dbuf *dk = upload(src, (int64_t)lens[r] * HK * D), *dv = upload(srv, (int64_t)lens[r] * HK * D);
                    be->kv_write(ss[f], kv[f], li, &rows[r], 1, dk, dv, lens[r]);
                    if (be->status(ss[f]) != OSP_OK) fail_msg("%s", osp_last_error());
                    be->free(dk), be->free(dv);
                }
                kv[f]->pos[r] = lens[r];
            }
        }
        int32_t pos[NB];
        for (int b = 0; b < NB; b++) pos[b] = lens[b];
        for (int step = 0; step < 3; step++) {
            const int32_t T = step < 2 ? 1 : 3;
            const int64_t nq = (int64_t)NB * T * HQ * D, nk = (int64_t)NB * T * HK * D;
            float *k = malloc(sizeof(float) * (size_t)nk), *v = malloc(sizeof(float) * (size_t)nk);
            for (int64_t i = 0; i < nq; i++) q[i] = uniform();
            for (int li = 0; li < NL; li++) {
                /* this step's k and v: the host copies' next positions */
                for (int b = 0; b < NB; b++)
                    for (int32_t t = 0; t < T; t++)
                        for (int64_t e = 0; e < (int64_t)HK * D; e++) {
                            const size_t at = ((size_t)li * NB + b) * per + (size_t)(pos[b] + t) * HK * D + (size_t)e;
                            k[((int64_t)b * T + t) * HK * D + e] = Kh[at], v[((int64_t)b * T + t) * HK * D + e] = Vh[at];
                        }
                for (int f = 0; f < 2; f++) {
                    osp_be_session *s = ss[f];
                    osp_dbuf *dq = upload(q, nq), *dk = upload(k, nk), *dv = upload(v, nk), *dout = be->alloc((size_t)nq);
                    const int64_t stride = MAXP + 64;
                    osp_dbuf *dsc = be->alloc((size_t)(NB * T * HQ * stride));
                    assert_non_null(dout), assert_non_null(dsc);
                    be->set_exact_tokens(s, T > 1);
                    be->begin_chunk(s, NB, T);
                    osp_attn_args a = {.kv = kv[f], .layer = li, .rows = rows, .nb = NB, .T = T, .n_heads = HQ,
                                       .n_kv_heads = HK, .head_dim = D, .scale = 0.125f, .window = li ? 100 : 0,
                                       .q = dq, .k = dk, .v = dv, .out = dout, .scores = dsc, .score_stride = stride,
                                       .chunk_stored = T > 1};
                    be->kv_write(s, kv[f], li, rows, NB, dk, dv, T);
                    be->attention(s, &a);
                    if (be->status(s) != OSP_OK) fail_msg("%s", osp_last_error());
                    be->read(out[f], dout, nq);
                    be->free(dq), be->free(dk), be->free(dv), be->free(dout), be->free(dsc);
                }
                /* the reference: softmax(q k / 8) v over positions [max(0, p - window + 1), p], in double */
                double *w = malloc(sizeof(double) * MAXP);
                for (int b = 0; b < NB; b++)
                    for (int32_t t = 0; t < T; t++)
                        for (int32_t h = 0; h < HQ; h++) {
                            const int32_t p = pos[b] + t, lo = li && p - 99 > 0 ? p - 99 : 0, hk = h / G;
                            const float *qq = q + (((int64_t)b * T + t) * HQ + h) * D;
                            const float *K0 = Kh + ((size_t)li * NB + b) * per, *V0 = Vh + ((size_t)li * NB + b) * per;
                            double m = -INFINITY, l = 0;
                            for (int32_t j = lo; j <= p; j++) {
                                double sc = 0;
                                for (int32_t d = 0; d < D; d++) sc += (double)qq[d] * K0[((size_t)j * HK + hk) * D + d];
                                w[j] = sc * 0.125;
                                if (w[j] > m) m = w[j];
                            }
                            for (int32_t j = lo; j <= p; j++) w[j] = exp(w[j] - m), l += w[j];
                            for (int32_t d = 0; d < D; d++) {
                                double o = 0;
                                for (int32_t j = lo; j <= p; j++) o += w[j] * V0[((size_t)j * HK + hk) * D + d];
                                ref[(((int64_t)b * T + t) * HQ + h) * D + d] = (float)(o / l);
                            }
                        }
                free(w);
                if (memcmp(out[0], out[1], sizeof(float) * (size_t)nq))
                    fail_msg("D %d G %d layer %d step %d: the compact kernel's output differs from the split kernel's", D,
                             G, li, step);
                for (int64_t i = 0; i < nq; i++)
                    for (int f = 0; f < 2; f++) {
                        const double bound = 2e-5 * fmax(1.0, fabs(ref[i]));
                        if (fabs((double)out[f][i] - ref[i]) > bound)
                            fail_msg("D %d G %d layer %d step %d [%lld]: %s kernel %.9g, reference %.9g", D, G, li, step,
                                     (long long)i, f ? "compact" : "split", out[f][i], ref[i]);
                    }
            }
            for (int f = 0; f < 2; f++)
                for (int b = 0; b < NB; b++) kv[f]->pos[rows[b]] += T;
            for (int b = 0; b < NB; b++) pos[b] += T;
            free(k), free(v);
        }
        for (int f = 0; f < 2; f++) osp_kv_free(kv[f]), be->session_free(ss[f]);
        free(Kh), free(Vh), free(q), free(ref), free(out[0]), free(out[1]);
    }
}

/* Another thread's copies while a session captures its decode graphs (a transcription beside a chat, in the
 * server): the sessions' streams are blocking streams, so a legacy-stream copy during a capture would fail
 * both (osp_cu_legacy_lock orders them). A thread writes, reads back and frees device buffers in a loop while
 * fresh sessions of a golden model decode, each capturing its step's graph: every step must succeed and
 * every buffer must come back as written. */
typedef struct copier {
    volatile int stop;
    long rounds, bad;
} copier;

static void *copy_loop(void *p) {
    copier *c = p;
    float host[256], back[256];
    while (!c->stop) {
        osp_dbuf *d = be->alloc(256);
        if (!d) {
            c->bad++;
            break;
        }
        for (int i = 0; i < 256; i++) host[i] = (float)(c->rounds * 256 + i);
        be->write(d, host, 256);
        memset(back, 0, sizeof back);
        be->read(back, d, 256);
        be->free(d);
        if (memcmp(host, back, sizeof host)) c->bad++;
        c->rounds++;
    }
    return NULL;
}

static void test_capture_beside_copies(void **state) {
    (void)state;
    osp_model *m;
    if (osp_model_load("data/goldens/llama3", &m) != OSP_OK) fail_msg("%s", osp_last_error());
    copier c = {0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, copy_loop, &c), 0);
    const int32_t prompt[4] = {1, 2, 3, 4}, row = 0;
    for (int k = 0; k < 6; k++) {
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, 32, &s), OSP_OK);
        osp_session_set_fast(s, 1);
        int32_t next;
        float *lg = malloc(sizeof(float) * 4096 * 4); /* (scratch for the ids-out forward: no row needs logits) */
        assert_non_null(lg);
        if (osp_forward_rows_ids(s, &row, 1, prompt, 4, NULL, lg, &next) != OSP_OK)
            fail_msg("session %d, the prompt beside another thread's copies: %s", k, osp_last_error());
        for (int t = 0; t < 6; t++) /* the second step of one row is captured, later ones replay it */
            if (osp_forward_rows_ids(s, &row, 1, &next, 1, NULL, lg, &next) != OSP_OK)
                fail_msg("session %d, decode step %d beside another thread's copies: %s", k, t, osp_last_error());
        free(lg);
        osp_session_free(s);
    }
    c.stop = 1;
    pthread_join(th, NULL);
    osp_model_free(m);
    if (c.bad) fail_msg("%ld of %ld copies came back wrong beside the captures", c.bad, c.rounds);
    assert_true(c.rounds > 0);
}

int main(void) {
    be = osp_backend_cuda();
    if (!be) {
        printf("test_cuda: skipped: %s\n", osp_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_tc),
        cmocka_unit_test(test_tc_long_rows),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_head_ids),
        cmocka_unit_test(test_embed_prev),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_norm_rope),
        cmocka_unit_test(test_fuse_pair),
        cmocka_unit_test(test_fuse_attention),
        cmocka_unit_test(test_attn_compact),
        cmocka_unit_test(test_capture_beside_copies),
        cmocka_unit_test(test_bandwidth_probe),
    };
    const char *only = getenv("OSP_TEST_ONLY"); /* a test's name (cmocka's filter: * and ? match) */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
