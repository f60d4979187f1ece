/* AVX-512 (F/BW/VL/DQ) kernels, tested against ops_scalar.c: ops_vec.h over
 * vec_avx512.h (16-lane vectors, 32 registers, masked loads), and what only
 * this tier has:
 *  - 4-bit decode: x permuted once per call to match how nibbles come out
 *    of a 64-byte load, the codes turned into floats by vpermps (q4_rows);
 *  - dense decode one row at a time (one sequential stream), long rows
 *    several side by side (mv_dense), and matmul_each's dense rows with
 *    the same operations per token (dense_each).
 * Stack use stays under ~40 KB per call.
 */
#include "backend/cpu/vec_avx512.h"
#include "backend/cpu/ops_vec.h"

#define PF_Q4 256 /* prefetch distance of 4-bit rows */

/* 4-bit: a 64-byte load holds codes 8l..8l+7 in dword l, nibble k being
 * code 8l+k. Shifting by 4k and a vpermps from the table 0..15 (which
 * reads only the low 4 index bits) turns nibble k of all 16 lanes into
 * floats in two instructions, so x is permuted to match:
 * xp[b + 16k + l] = x[b + 8l + k] for each 128-column block b. */
static void q4_permute_x(const float *x, int64_t cw, float *xp) {
    const __m512i idx = _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104,
                                          112, 120);
    for (int64_t b = 0; b < cw; b += 128)
        for (int k = 0; k < 8; k++)
            _mm512_storeu_ps(xp + b + 16 * k,
                             _mm512_i32gather_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(k)), x + b, 4));
}

/* 4 rows over columns [c0, c0+cw) (cw % 128 == 0). Per 128-column block:
 * vg = sum_k x_k * q_k, then acc += s * vg with s spread per lane (lane l
 * is column 8l, group 8l/G). The bias terms b * sum(x) go into the same
 * accumulator, lanes over groups instead of columns: only the total
 * matters. */
OSP_INLINE void q4_rows(const osp_weight *w, int64_t r, int64_t r1, const float *xp,
                        const float *sx, int64_t c0, int64_t cw, float *out, int accum,
                        const int G) {
    const int64_t ng = w->cols / G, rbytes = w->cols / 2, gb = c0 / G, cnt = cw / G;
    const __m512 tab = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lane_g = _mm512_srli_epi32(
        _mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120),
        G == 32 ? 5 : G == 64 ? 6 : 7);
    int64_t rr[4];
    quad_rows(r, r1, rr);
    const unsigned char *p[4];
    __m512 acc[4], sv[4];
    for (int i = 0; i < 4; i++) {
        p[i] = (const unsigned char *)w->data + rr[i] * rbytes + c0 / 2;
        acc[i] = _mm512_setzero_ps();
    }
    for (int64_t gc = 0; gc < cnt; gc += 16) {
        const __mmask16 m = v_tail(cnt - gc);
        const __m512 sxv = _mm512_maskz_loadu_ps(m, sx + gc);
        for (int i = 0; i < 4; i++) {
            int64_t o = rr[i] * ng + gb + gc;
            sv[i] = ld_any(w->scales, w->sdtype, o, cnt - gc);
            acc[i] = _mm512_fmadd_ps(ld_any(w->biases, w->sdtype, o, cnt - gc), sxv, acc[i]);
        }
        const int64_t nblk = (cnt - gc < 16 ? cnt - gc : 16) * G / 128;
        for (int64_t b = 0; b < nblk; b++) {
            const int64_t cx = gc * G + b * 128;
            const float *xb = xp + cx;
            const __m512i sidx = _mm512_add_epi32(lane_g, _mm512_set1_epi32((int)(b * 128 / G)));
            for (int i = 0; i < 4; i++) {
                _mm_prefetch((const char *)p[i] + cx / 2 + PF_Q4, _MM_HINT_T0);
                __m512i v = _mm512_loadu_si512(p[i] + cx / 2);
                __m512 vg = _mm512_mul_ps(_mm512_permutexvar_ps(v, tab), _mm512_loadu_ps(xb));
                for (int k = 1; k < 8; k++)
                    vg = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * k), tab),
                                         _mm512_loadu_ps(xb + 16 * k), vg);
                acc[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(sidx, sv[i]), vg, acc[i]);
            }
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++) {
        float v = _mm512_reduce_add_ps(acc[i]);
        out[i] = accum ? out[i] + v : v;
    }
}

/* One MV_CHUNK pass of the 4-bit decode: x permuted once for all rows. */
OSP_INLINE void q4_pass(const osp_weight *w, const float *x, const float *sx, int64_t c0, int64_t cw, float *y,
                        int64_t r0, int64_t r1, const int G) {
    float xp[MV_CHUNK] __attribute__((aligned(64)));
    q4_permute_x(x, cw, xp);
    for (int64_t r = r0; r < r1; r += 4) q4_rows(w, r, r1, xp, sx, c0, cw, y + r - r0, c0 > 0, G);
}

/* Whether mv_q_fast handles w: 4- or 8-bit codes in groups of 32/64/128
 * (4-bit rows in whole 128-column blocks). */
static int mv_q_ok(const osp_weight *w) {
    if (w->qbits == 4 && w->cols % 128 != 0) return 0;
    return (w->qbits == 4 || w->qbits == 8) && (w->group == 32 || w->group == 64 || w->group == 128);
}

/* n == 1, dense rows: one row at a time with four accumulators, so the
 * weights are one sequential stream (rows are contiguous) that the hardware
 * prefetcher follows; x stays in L1/L2. Four rows interleaved (mt_rows)
 * make four streams, read here about 20% slower; software prefetch on top
 * of the sequential stream made it slower still (measured). Long rows:
 * mv_long_t below. */
OSP_INLINE void mv_dense_t(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const osp_dtype fmt) {
    const int64_t cols = w->cols, es = fmt == OSP_DT_F32 ? 4 : 2, rs = cols * es;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * rs;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t c = 0;
        for (; c + 64 <= cols; c += 64) {
            a0 = _mm512_fmadd_ps(v_ld_w(row, fmt, c), _mm512_loadu_ps(x + c), a0);
            a1 = _mm512_fmadd_ps(v_ld_w(row, fmt, c + 16), _mm512_loadu_ps(x + c + 16), a1);
            a2 = _mm512_fmadd_ps(v_ld_w(row, fmt, c + 32), _mm512_loadu_ps(x + c + 32), a2);
            a3 = _mm512_fmadd_ps(v_ld_w(row, fmt, c + 48), _mm512_loadu_ps(x + c + 48), a3);
        }
        for (; c < cols; c += 16) {
            const __mmask16 m = v_tail(cols - c);
            a0 = _mm512_fmadd_ps(v_ld_wm(row, fmt, c, m), _mm512_maskz_loadu_ps(m, x + c), a0);
        }
        y[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

/* n == 1, dense rows of MV_LONG_COLS columns or more: x (f32, 16 KiB and
 * up) no longer stays in L1 beside the weight stream, and reloading it from
 * L2 for every row cost a third of the read rate (docs/NOTES.md). MV_GROUP rows are read side by side, so each x
 * load serves all of them. Every row has its own two accumulators, so a
 * row's sum does not depend on which rows share its group. */
#define MV_LONG_COLS 4096
#define MV_GROUP 8

OSP_INLINE void mv_rows_t(const unsigned char *w0, int64_t rs, const float *x, int64_t cols, float *y,
                          const int nr, const osp_dtype fmt) {
    __m512 a[MV_GROUP][2];
    for (int i = 0; i < nr; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + c), x1 = _mm512_loadu_ps(x + c + 16);
        for (int i = 0; i < nr; i++) {
            a[i][0] = _mm512_fmadd_ps(v_ld_w(w0 + i * rs, fmt, c), x0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(v_ld_w(w0 + i * rs, fmt, c + 16), x1, a[i][1]);
        }
    }
    for (; c < cols; c += 16) {
        const __mmask16 m = v_tail(cols - c);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, x + c);
        for (int i = 0; i < nr; i++) a[i][0] = _mm512_fmadd_ps(v_ld_wm(w0 + i * rs, fmt, c, m), x0, a[i][0]);
    }
    for (int i = 0; i < nr; i++) y[i] = _mm512_reduce_add_ps(_mm512_add_ps(a[i][0], a[i][1]));
}

OSP_INLINE void mv_long_t(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const osp_dtype fmt) {
    const int64_t cols = w->cols, rs = cols * (fmt == OSP_DT_F32 ? 4 : 2);
    const unsigned char *base = w->data;
    int64_t r = r0;
    for (; r + MV_GROUP <= r1; r += MV_GROUP) mv_rows_t(base + r * rs, rs, x, cols, y + (r - r0), MV_GROUP, fmt);
    for (; r < r1; r++) mv_rows_t(base + r * rs, rs, x, cols, y + (r - r0), 1, fmt);
}

static void mv_dense(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const int lng = w->cols >= MV_LONG_COLS;
    if (w->dtype == OSP_DT_BF16) lng ? mv_long_t(w, x, y, r0, r1, OSP_DT_BF16) : mv_dense_t(w, x, y, r0, r1, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) lng ? mv_long_t(w, x, y, r0, r1, OSP_DT_F16) : mv_dense_t(w, x, y, r0, r1, OSP_DT_F16);
    else lng ? mv_long_t(w, x, y, r0, r1, OSP_DT_F32) : mv_dense_t(w, x, y, r0, r1, OSP_DT_F32);
}

/* mv_dense_t's and mv_rows_t's operations for NT tokens of one row at a
 * time: the row converted once, each token's sums exactly the one-token
 * kernel's (4 accumulators over 64-column steps for short rows, 2 over
 * 32-column steps for long ones). */
OSP_INLINE void dense_row_each(const unsigned char *row, const float *x, int64_t cols, float *out, int64_t ldy,
                               const osp_dtype fmt, const int NT) {
    if (cols < MV_LONG_COLS) {
        __m512 a[4][4];
        for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = a[t][2] = a[t][3] = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 64 <= cols; c += 64) {
            const __m512 w0 = v_ld_w(row, fmt, c), w1 = v_ld_w(row, fmt, c + 16),
                         w2 = v_ld_w(row, fmt, c + 32), w3 = v_ld_w(row, fmt, c + 48);
            for (int t = 0; t < NT; t++) {
                const float *xt = x + t * cols;
                a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt + c), a[t][0]);
                a[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + c + 16), a[t][1]);
                a[t][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xt + c + 32), a[t][2]);
                a[t][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xt + c + 48), a[t][3]);
            }
        }
        for (; c < cols; c += 16) {
            const __mmask16 m = v_tail(cols - c);
            const __m512 w0 = v_ld_wm(row, fmt, c, m);
            for (int t = 0; t < NT; t++) a[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + t * cols + c), a[t][0]);
        }
        for (int t = 0; t < NT; t++)
            out[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])));
        return;
    }
    __m512 a[4][2];
    for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        const __m512 w0 = v_ld_w(row, fmt, c), w1 = v_ld_w(row, fmt, c + 16);
        for (int t = 0; t < NT; t++) {
            a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * cols + c), a[t][0]);
            a[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * cols + c + 16), a[t][1]);
        }
    }
    for (; c < cols; c += 16) {
        const __mmask16 m = v_tail(cols - c);
        const __m512 w0 = v_ld_wm(row, fmt, c, m);
        for (int t = 0; t < NT; t++) a[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + t * cols + c), a[t][0]);
    }
    for (int t = 0; t < NT; t++) out[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(a[t][0], a[t][1]));
}

OSP_INLINE void dense_each_t(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                             int64_t r1, const osp_dtype fmt) {
    const int64_t cols = w->cols, rs = cols * (fmt == OSP_DT_F32 ? 4 : 2);
    for (int64_t t0 = 0; t0 < n; t0 += 4) {
        const int nt = n - t0 < 4 ? (int)(n - t0) : 4;
        for (int64_t r = r0; r < r1; r++) {
            const unsigned char *row = (const unsigned char *)w->data + r * rs;
            float *o = y + t0 * ldy + (r - r0);
            const float *xt = x + t0 * cols;
            switch (nt) {
            case 1: dense_row_each(row, xt, cols, o, ldy, fmt, 1); break;
            case 2: dense_row_each(row, xt, cols, o, ldy, fmt, 2); break;
            case 3: dense_row_each(row, xt, cols, o, ldy, fmt, 3); break;
            default: dense_row_each(row, xt, cols, o, ldy, fmt, 4); break;
            }
        }
    }
}

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (matmul_trivial(w, n, y, ldy, r0, r1)) return;
    if (n == 1 && mv_q_ok(w)) mv_q_fast(w, x, y, r0, r1);
    else if (n == 1 && !w->qbits) mv_dense(w, x, y, r0, r1);
    else if (n < GB_MIN_N) mt_any(w, x, n, y, ldy, r0, r1);
    else gemm(w, x, n, y, ldy, r0, r1);
}

/* dense rows (bf16 where AMX does not take them, f16, f32) */
static void dense_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    if (w->dtype == OSP_DT_BF16) dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_F16);
    else dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_F32);
}
