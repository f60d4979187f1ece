/* The encoder-decoder operations of osp_backend (model/whisper.c's: linear,
 * layernorm, gelu, im2col, pack_kv, full attention and scores, the row
 * caches) and the bidirectional encoders' attention (model/llama.c's
 * EmbeddingGemma) against scalar references computed here in double precision, on
 * random data, on the device osp_backend_get picks: the CPU here,
 * OSP_DEVICE=cuda on a GPU (scripts/test-gpu.sh). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "backend/backend.h"
#include "core/core.h"
#include "tensor/tensor.h"

static const osp_backend *be;
static osp_be_session *S;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(((rng >> 16) & 0xffffff) / 16777216.0 * 2.0 - 1.0);
}

static float *rnd(int64_t n, float a) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = uniform() * a;
    return p;
}

static osp_dbuf *up(const float *x, int64_t n) {
    osp_dbuf *d = be->alloc((size_t)n);
    assert_non_null(d);
    be->write(d, x, n);
    return d;
}

static float *down(const osp_dbuf *d, int64_t n) {
    assert_int_equal(be->status(S), OSP_OK);
    float *h = malloc(sizeof(float) * (size_t)n);
    be->read(h, d, n);
    return h;
}

static void near(const char *what, int64_t i, double got, double ref, double tol) {
    if (!(fabs(got - ref) <= tol * (1 + fabs(ref)))) fail_msg("%s at %lld: %.8g vs %.8g", what, (long long)i, got, ref);
}

/* dense f32 and bf16, and 4-bit MLX: 70 tokens x 100 rows (past a 64-tile both ways), with and without a bias */
static void test_linear(void **state) {
    (void)state;
    enum { N = 70, R = 100, C = 128 };
    for (int kind = 0; kind < 3; kind++) {
        osp_weight w;
        memset(&w, 0, sizeof w);
        w.rows = R, w.cols = C;
        void *data, *sc = NULL, *bi = NULL;
        if (kind < 2) {
            w.dtype = kind ? OSP_DT_BF16 : OSP_DT_F32;
            data = malloc(osp_dtype_size(w.dtype) * R * C);
            for (int i = 0; i < R * C; i++) {
                float v = uniform();
                if (kind) ((uint16_t *)data)[i] = osp_f32_to_bf16(v);
                else ((float *)data)[i] = v;
            }
        } else {
            w.dtype = OSP_DT_U32, w.qbits = 4, w.group = 32, w.sdtype = OSP_DT_F32;
            data = malloc(R * C / 2);
            for (int i = 0; i < R * C / 2; i++) ((unsigned char *)data)[i] = (unsigned char)(uniform() * 255);
            sc = rnd(R * C / 32, 0.1f), bi = rnd(R * C / 32, 0.5f);
            w.scales = sc, w.biases = bi;
        }
        w.data = data;
        void *owned = NULL;
        osp_weight *ws[] = {&w};
        if (be->needs_place) assert_int_equal(be->place(ws, 1, NULL, 0, NULL, 0, &owned), OSP_OK);
        float *x = rnd(N * C, 1), *b = rnd(R, 1), row[C];
        osp_dbuf *dx = up(x, N * C), *db = up(b, R), *dy = be->alloc(N * R);
        for (int withb = 0; withb < 2; withb++) {
            be->begin_chunk(S, 1, N);
            be->linear(S, &w, dx, N, withb ? db : NULL, dy);
            float *y = down(dy, N * R);
            for (int r = 0; r < R; r++) {
                osp_weight_row_f32(&w, r, row);
                for (int t = 0; t < N; t++) {
                    double ref = withb ? b[r] : 0;
                    for (int c = 0; c < C; c++) ref += (double)x[t * C + c] * row[c];
                    near("linear", t * R + r, y[t * R + r], ref, 1e-4);
                }
            }
            free(y);
        }
        be->free(dx), be->free(db), be->free(dy);
        if (owned) be->unplace(owned);
        free(x), free(b), free(data), free(sc), free(bi);
    }
}

static void test_rows(void **state) {
    (void)state;
    enum { N = 5, Dm = 2100 }; /* (a GPU's LayerNorm holds 2048 of a row in registers: past them too) */
    float *x = rnd(N * Dm, 3), *w = rnd(Dm, 1), *b = rnd(Dm, 1);
    for (int i = 0; i < Dm; i++) x[i] += 10; /* a row far from zero mean */
    osp_dbuf *dx = up(x, N * Dm), *dw = up(w, Dm), *db = up(b, Dm), *dy = be->alloc(N * Dm);
    be->begin_chunk(S, 1, N);
    be->layernorm(S, dy, dx, dw, db, N, Dm, 1e-5f);
    float *y = down(dy, N * Dm);
    for (int r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int j = 0; j < Dm; j++) m += x[r * Dm + j];
        m /= Dm;
        for (int j = 0; j < Dm; j++) v += (x[r * Dm + j] - m) * (x[r * Dm + j] - m);
        double inv = 1 / sqrt(v / Dm + 1e-5);
        for (int j = 0; j < Dm; j++) near("layernorm", r * Dm + j, y[r * Dm + j], (x[r * Dm + j] - m) * inv * w[j] + b[j], 1e-5);
    }
    free(y);
    be->gelu(S, dx, N * Dm);
    y = down(dx, N * Dm);
    for (int i = 0; i < N * Dm; i++) near("gelu", i, y[i], 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))), 1e-6);
    free(y), free(x), free(w), free(b);
    be->free(dx), be->free(dw), be->free(db), be->free(dy);
}

/* conv1's (channel-major input, stride 1) and conv2's (frame-major, stride 2) columns, in both orders */
static void test_im2col(void **state) {
    (void)state;
    enum { C = 5, T = 11 };
    float *x = rnd(C * T, 1);
    osp_dbuf *dx = up(x, C * T), *dc = be->alloc(T * C * 3);
    for (int v = 0; v < 4; v++) {
        const int stride = v & 1 ? 2 : 1, km = v >> 1, chm = stride == 1;
        const int64_t to = stride == 1 ? T : (T + 1) / 2;
        osp_im2col_args a = {.col = dc, .x = dx, .C = C, .t_in = T, .t_out = to, .ld_c = chm ? T : 1,
                             .ld_f = chm ? 1 : C, .k = 3, .stride = stride, .pad = 1, .k_major = km};
        be->im2col(S, &a);
        float *col = down(dc, to * C * 3);
        for (int64_t t = 0; t < to; t++)
            for (int ci = 0; ci < C; ci++)
                for (int j = 0; j < 3; j++) {
                    int64_t src = stride * t + j - 1, at = km ? t * C * 3 + j * C + ci : (t * C + ci) * 3 + j;
                    float ref = src >= 0 && src < T ? x[chm ? ci * T + src : src * C + ci] : 0;
                    if (col[at] != ref) fail_msg("im2col variant %d at %lld: %g vs %g", v, (long long)at, col[at], ref);
                }
        free(col);
    }
    free(x);
    be->free(dx), be->free(dc);
}

static void softmax_d(double *p, int64_t n) {
    double mx = p[0], s = 0;
    for (int64_t j = 1; j < n; j++) mx = p[j] > mx ? p[j] : mx;
    for (int64_t j = 0; j < n; j++) s += p[j] = exp(p[j] - mx);
    for (int64_t j = 0; j < n; j++) p[j] /= s;
}

/* one query's attention over `keys` rows of K and V (row stride ld; the head's columns from col), in double:
 * ref[hd]; scores[keys] (may be NULL) gets the scores before the softmax */
static void attn_ref(const float *q, const float *K, const float *V, int64_t keys, int64_t ld, int64_t col, int hd,
                     double *ref, double *scores) {
    double p[512];
    assert_true(keys <= 512);
    for (int64_t j = 0; j < keys; j++) {
        p[j] = 0;
        for (int e = 0; e < hd; e++) p[j] += (double)q[e] * K[j * ld + col + e];
        if (scores) scores[j] = p[j];
    }
    softmax_d(p, keys);
    for (int e = 0; e < hd; e++) {
        ref[e] = 0;
        for (int64_t j = 0; j < keys; j++) ref[e] += p[j] * V[j * ld + col + e];
    }
}

/* 20 queries (a block of 16 and 4 alone) over 150 keys, 3 heads of 8 */
static void test_full_attention(void **state) {
    (void)state;
    enum { N = 20, Sk = 150, H = 3, Hd = 8, LD = H * Hd };
    float *q = rnd(N * LD, 1), *k = rnd(Sk * LD, 1), *v = rnd(Sk * LD, 1);
    osp_dbuf *dq = up(q, N * LD), *dk = up(k, Sk * LD), *dv = up(v, Sk * LD);
    osp_dbuf *kh = be->alloc(Sk * LD), *vt = be->alloc(Sk * LD), *dout = be->alloc(N * LD), *dsc = be->alloc(N * Sk);
    be->begin_chunk(S, 1, N);
    be->pack_kv(S, kh, vt, dk, dv, Sk, LD, H, Hd);
    osp_full_attn_args a = {.q = dq, .kh = kh, .vt = vt, .out = dout, .n = N, .S = Sk, .ld = LD, .heads = H, .hd = Hd};
    be->full_attention(S, &a);
    be->full_scores(S, dsc, dq, kh, N, Sk, LD, 2, Hd);
    float *out = down(dout, N * LD), *sc = down(dsc, N * Sk);
    double p[Sk], ref[Hd];
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N; i++) {
            attn_ref(q + i * LD + h * Hd, k, v, Sk, LD, h * Hd, Hd, ref, p);
            if (h == 2)
                for (int j = 0; j < Sk; j++) near("full_scores", i * Sk + j, sc[i * Sk + j], p[j], 1e-5);
            for (int e = 0; e < Hd; e++) near("full_attention", i * LD + h * Hd + e, out[i * LD + h * Hd + e], ref[e], 1e-5);
        }
    free(q), free(k), free(v), free(out), free(sc);
    be->free(dq), be->free(dk), be->free(dv), be->free(kh), be->free(vt), be->free(dout), be->free(dsc);
}

/* The production path (set_fast; on a GPU the tensor-core kernel, bf16 operands): 150 queries (past a block of
 * 128) over 300 keys (past two splits of 128, the last tile part-filled), heads of 16 and 64, as a decoder's rows
 * (fixed splits) and as a whole window (one pass), within bf16's error of the double reference; and on a GPU one
 * query alone gives its row of the 150 bitwise (batch invariance). */
static void test_full_attention_fast(void **state) {
    (void)state;
    enum { N = 150, Sk = 300, H = 2 };
    be->set_fast(S, 1);
    for (int variant = 0; variant < 2; variant++) {
        const int Hd = variant ? 64 : 16, LD = H * Hd;
        float *q = rnd(N * LD, 0.5f), *k = rnd(Sk * LD, 0.5f), *v = rnd(Sk * LD, 1);
        osp_dbuf *dq = up(q, N * LD), *dk = up(k, Sk * LD), *dv = up(v, Sk * LD);
        osp_dbuf *kh = be->alloc(Sk * LD), *vt = be->alloc(Sk * LD), *dout = be->alloc(N * LD);
        osp_dbuf *dw = be->alloc(N * LD), *d1 = be->alloc(LD);
        be->begin_chunk(S, 1, N);
        be->pack_kv(S, kh, vt, dk, dv, Sk, LD, H, Hd);
        osp_full_attn_args a = {.q = dq, .kh = kh, .vt = vt, .out = dout, .n = N, .S = Sk, .ld = LD, .heads = H, .hd = Hd};
        be->full_attention(S, &a);
        osp_full_attn_args aw = a;
        aw.out = dw, aw.whole = 1;
        be->full_attention(S, &aw);
        osp_full_attn_args a1 = a;
        a1.q = osp_dbuf_at(dq, 137 * LD), a1.out = d1, a1.n = 1;
        be->full_attention(S, &a1);
        /* K and V as rows, where the backend reads them so: bitwise the packed call's numbers, split and whole */
        osp_dbuf *dr = be->alloc(N * LD), *drw = be->alloc(N * LD);
        osp_full_attn_args ar = a, arw = aw;
        ar.kh = dk, ar.vt = dv, ar.out = dr, arw.kh = dk, arw.vt = dv, arw.out = drw;
        const int rows = be->full_attention_rows && be->full_attention_rows(S, &ar);
        if (rows) assert_true(be->full_attention_rows(S, &arw));
        float *out = down(dout, N * LD), *whole = down(dw, N * LD), *one = down(d1, LD);
        if (rows) {
            float *r = down(dr, N * LD), *rw = down(drw, N * LD);
            assert_memory_equal(r, out, sizeof(float) * N * LD);
            assert_memory_equal(rw, whole, sizeof(float) * N * LD);
            free(r), free(rw);
        }
        /* (the GPU can read them as rows) */
        if (!strncmp(be->name, "cuda", 4)) assert_true(rows);
        be->free(dr), be->free(drw);
        /* (the GPU's kernel promises it; the CPU's full attention takes queries 16 at a time, another order) */
        if (!strncmp(be->name, "cuda", 4)) assert_memory_equal(one, out + 137 * LD, sizeof(float) * LD);
        double ref[64];
        for (int h = 0; h < H; h++)
            for (int i = 0; i < N; i++) {
                attn_ref(q + i * LD + h * Hd, k, v, Sk, LD, h * Hd, Hd, ref, NULL);
                for (int e = 0; e < Hd; e++) {
                    const int64_t at = i * LD + h * Hd + e;
                    if (!(fabs(out[at] - ref[e]) <= 1e-2) || !(fabs(whole[at] - ref[e]) <= 1e-2))
                        fail_msg("fast full_attention (hd %d) at %lld: %.6g (whole %.6g) vs %.6g", Hd, (long long)at,
                                 out[at], whole[at], ref[e]);
                }
            }
        free(q), free(k), free(v), free(out), free(whole), free(one);
        be->free(dq), be->free(dk), be->free(dv), be->free(kh), be->free(vt), be->free(dout), be->free(dw);
        be->free(d1);
    }
    be->set_fast(S, 0);
}

/* Bidirectional attention (osp_bidir_attn_args) against a double reference: rows of their own lengths (the padding's
 * K and V large, so that a key of it seen anywhere shows), query heads sharing KV heads, full and windowed (a
 * padded query past its row's window sees nothing: zeros), with and without a soft-cap; then one long row whose
 * scores need more than 48 KiB of a GPU block's shared memory, and EmbeddingGemma-300M's shapes. */
static void bidir_case(int32_t nb, int32_t T, const int32_t *len, int32_t Hq, int32_t Hkv, int32_t D, int32_t radius,
                       float scale, float softcap) {
    const int64_t ldq = (int64_t)Hq * D, ldk = (int64_t)Hkv * D, N = (int64_t)nb * T;
    float *q = rnd(N * ldq, 1), *k = rnd(N * ldk, 1), *v = rnd(N * ldk, 1);
    for (int32_t b = 0; b < nb; b++)
        for (int64_t t = len ? len[b] : T; t < T; t++)
            for (int64_t c = 0; c < ldk; c++) k[(b * T + t) * ldk + c] = 50, v[(b * T + t) * ldk + c] = 1e4f;
    osp_dbuf *dq = up(q, N * ldq), *dk = up(k, N * ldk), *dv = up(v, N * ldk), *dout = be->alloc((size_t)(N * ldq));
    be->begin_chunk(S, nb, T);
    osp_bidir_attn_args a = {.q = dq, .k = dk, .v = dv, .out = dout, .len = len, .nb = nb, .T = T, .n_heads = Hq,
                             .n_kv_heads = Hkv, .head_dim = D, .radius = radius, .scale = scale, .softcap = softcap};
    be->bidir_attention(S, &a);
    float *out = down(dout, N * ldq);
    double *p = malloc(sizeof(double) * (size_t)T), *ref = malloc(sizeof(double) * (size_t)D);
    for (int32_t b = 0; b < nb; b++)
        for (int32_t h = 0; h < Hq; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t L = len ? len[b] : T, hk = h / (Hq / Hkv);
                int64_t lo = 0, hi = L;
                if (radius) lo = t - radius + 1 > 0 ? t - radius + 1 : 0, hi = t + radius < L ? t + radius : L;
                const float *qr = q + (b * T + t) * ldq + h * D;
                for (int64_t j = lo; j < hi; j++) {
                    double x = 0;
                    for (int e = 0; e < D; e++) x += (double)qr[e] * k[(b * T + j) * ldk + hk * D + e];
                    x *= scale;
                    p[j - lo] = softcap > 0 ? softcap * tanh(x / softcap) : x;
                }
                if (hi > lo) softmax_d(p, hi - lo);
                for (int e = 0; e < D; e++) {
                    ref[e] = 0;
                    for (int64_t j = lo; j < hi; j++) ref[e] += p[j - lo] * v[(b * T + j) * ldk + hk * D + e];
                    near("bidir_attention", (b * T + t) * ldq + h * D + e, out[(b * T + t) * ldq + h * D + e], ref[e],
                         1e-5);
                }
            }
    free(q), free(k), free(v), free(out), free(p), free(ref);
    be->free(dq), be->free(dk), be->free(dv), be->free(dout);
}

static void test_bidir_attention(void **state) {
    (void)state;
    if (!be->bidir_attention) fail_msg("%s has no bidirectional attention", be->name);
    const int32_t lens[3] = {21, 13, 4};
    bidir_case(3, 21, lens, 4, 2, 8, 0, 0.3f, 0.0f);
    bidir_case(3, 21, lens, 4, 2, 8, 5, 0.3f, 0.0f);
    bidir_case(3, 21, lens, 4, 2, 8, 5, 0.9f, 2.0f);
    bidir_case(3, 21, lens, 4, 4, 16, 1, 0.5f, 0.0f);
    bidir_case(2, 7, NULL, 2, 1, 8, 3, 0.4f, 0.0f);
    const int32_t one[1] = {3090};
    bidir_case(1, 3100, one, 1, 1, 8, 0, 0.2f, 0.0f);
    /* EmbeddingGemma-300M's heads (3 query heads of 256 on one KV head) and sliding radius, two rows */
    const int32_t two[2] = {600, 390};
    bidir_case(2, 600, two, 3, 1, 256, 257, 0.0625f, 0.0f);
}

/* 2 rows of a 12-position cache: row 1 filled to 6 by a chunk, then a step of both rows (row 0 at 0) */
static void test_rows_attention(void **state) {
    (void)state;
    enum { CTX = 12, H = 2, Hd = 8, LD = H * Hd, R = 2 };
    float *kc = calloc(R * CTX * LD, sizeof(float)), *vc = calloc(R * CTX * LD, sizeof(float));
    osp_dbuf *dkc = up(kc, R * CTX * LD), *dvc = up(vc, R * CTX * LD), *dout = be->alloc(7 * LD);
    int32_t rows1[7] = {1, 1, 1, 1, 1, 1, 1}, pos1[7] = {0, 1, 2, 3, 4, 5, 6};
    int32_t rows2[2] = {1, 0}, pos2[2] = {7, 0};
    const int32_t *rows[2] = {rows1, rows2}, *pos[2] = {pos1, pos2};
    const int n[2] = {7, 2};
    for (int step = 0; step < 2; step++) {
        float *q = rnd(n[step] * LD, 1), *k = rnd(n[step] * LD, 1), *v = rnd(n[step] * LD, 1);
        for (int i = 0; i < n[step]; i++) { /* the host mirror */
            memcpy(kc + (rows[step][i] * CTX + pos[step][i]) * LD, k + i * LD, sizeof(float) * LD);
            memcpy(vc + (rows[step][i] * CTX + pos[step][i]) * LD, v + i * LD, sizeof(float) * LD);
        }
        osp_dbuf *dq = up(q, n[step] * LD), *dk = up(k, n[step] * LD), *dv = up(v, n[step] * LD);
        be->begin_chunk(S, step ? 2 : 1, step ? 1 : 7);
        be->rows_store(S, dkc, dvc, dk, dv, rows[step], pos[step], n[step], CTX, LD);
        osp_rows_attn_args a = {.q = dq, .k = dkc, .v = dvc, .out = dout, .row = rows[step], .pos = pos[step],
                                .n = n[step], .ctx = CTX, .ld = LD, .heads = H, .hd = Hd};
        be->rows_attention(S, &a);
        float *out = down(dout, n[step] * LD);
        double ref[Hd];
        for (int i = 0; i < n[step]; i++)
            for (int h = 0; h < H; h++) {
                const float *K = kc + rows[step][i] * CTX * LD, *V = vc + rows[step][i] * CTX * LD;
                attn_ref(q + i * LD + h * Hd, K, V, pos[step][i] + 1, LD, h * Hd, Hd, ref, NULL);
                for (int e = 0; e < Hd; e++)
                    near("rows_attention", i * LD + h * Hd + e, out[i * LD + h * Hd + e], ref[e], 1e-5);
            }
        free(q), free(k), free(v), free(out);
        be->free(dq), be->free(dk), be->free(dv);
    }
    /* copying a row is the backend's copy over the cache planes */
    be->copy(S, osp_dbuf_at(dkc, 0), osp_dbuf_at(dkc, CTX * LD), 8 * LD);
    float *got = down(dkc, R * CTX * LD);
    for (int i = 0; i < 8 * LD; i++)
        if (got[i] != kc[CTX * LD + i]) fail_msg("row copy at %d", i);
    free(got), free(kc), free(vc);
    be->free(dkc), be->free(dvc), be->free(dout);
}

int main(void) {
    be = osp_backend_get(OSP_DEVICE_AUTO);
    if (!be || be->session_new(64, 1024, &S) != OSP_OK) {
        fprintf(stderr, "no backend: %s\n", osp_last_error());
        return 1;
    }
    printf("backend: %s\n", be->name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_im2col),
        cmocka_unit_test(test_full_attention),
        cmocka_unit_test(test_full_attention_fast),
        cmocka_unit_test(test_rows_attention),
        cmocka_unit_test(test_bidir_attention),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    be->session_free(S);
    return rc;
}
