/* AVX2 + FMA + F16C kernels, tested against ops_scalar.c: ops_vec.h over
 * vec_avx2.h (8-lane vectors, 16 registers), and what only this tier has:
 *  - 4-bit decode: codes split into even and odd vectors (q4_rows);
 *  - n < GB_MIN_N with 4/8-bit codes: the one-token kernel per token over
 *    row blocks that stay in L2 (unpacking codes in order costs more than
 *    re-reading them);
 *  - dense decode and dense matmul_each through mt_rows (4 rows x up to 2
 *    tokens).
 */
#include "backend/cpu/vec_avx2.h"
#include "backend/cpu/ops_vec.h"

#define MV_ROWS 64 /* rows per block when a few tokens reuse the matvec */

/* Codes of one group of 4 rows dotted with x, 16 codes (8 bytes) a step:
 * byte j holds code 2j in its low nibble and 2j+1 in its high one, so the
 * codes split into even and odd vectors and x is split the same way once
 * for the 4 rows. */
OSP_INLINE void q4_group(const unsigned char *const p[4], const float *x, int64_t k0, vf vg[4], const int G) {
    const __m256i lo4 = _mm256_set1_epi32(0xF);
    for (int i = 0; i < 4; i++) vg[i] = v_zero();
    for (int j = 0; j < G; j += 16) {
        __m256 xa = v_ld(x + k0 + j), xb = v_ld(x + k0 + j + 8);
        __m256 xe = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xa, xb, 0x88)), 0xD8));
        __m256 xo = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xa, xb, 0xDD)), 0xD8));
        for (int i = 0; i < 4; i++) {
            __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + (k0 + j) / 2)));
            vg[i] = v_fma(xe, _mm256_cvtepi32_ps(_mm256_and_si256(d, lo4)), vg[i]);
            vg[i] = v_fma(xo, _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), vg[i]);
        }
    }
}

/* 4 rows over columns [c0, c0+cw): per group acc += s * sum(x*q); the
 * bias terms b * sum(x) go into the same accumulator (lanes over groups
 * instead of columns: only the total matters). Scales are widened 8
 * groups at a time into sb and broadcast from memory. */
OSP_INLINE void q4_rows(const osp_weight *w, int64_t r, int64_t r1, const float *x, const float *sx, int64_t c0,
                        int64_t cw, float *out, int accum, const int G) {
    const int64_t ng = w->cols / G, rb = w->cols / 2, gb = c0 / G, cnt = cw / G;
    int64_t rr[4];
    quad_rows(r, r1, rr);
    const unsigned char *p[4];
    vf acc[4], vg[4];
    float sb[4][8] __attribute__((aligned(32)));
    for (int i = 0; i < 4; i++) {
        p[i] = (const unsigned char *)w->data + rr[i] * rb + c0 / 2;
        acc[i] = v_zero();
    }
    for (int64_t gc = 0; gc < cnt; gc += 8) {
        const int64_t gn = cnt - gc < 8 ? cnt - gc : 8;
        const vf sxv = v_ld_m(sx + gc, v_tail(gn));
        for (int i = 0; i < 4; i++) {
            const int64_t o = rr[i] * ng + gb + gc;
            v_sta(sb[i], ld_any(w->scales, w->sdtype, o, gn));
            acc[i] = v_fma(ld_any(w->biases, w->sdtype, o, gn), sxv, acc[i]);
        }
        for (int64_t g = 0; g < gn; g++) {
            q4_group(p, x, (gc + g) * G, vg, G);
            for (int i = 0; i < 4; i++) acc[i] = v_fma(v_bcast(&sb[i][g]), vg[i], acc[i]);
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++) {
        const float v = v_hsum(acc[i]);
        out[i] = accum ? out[i] + v : v;
    }
}

/* One MV_CHUNK pass of the 4-bit decode, 4 rows a step. */
OSP_INLINE void q4_pass(const osp_weight *w, const float *x, const float *sx, int64_t c0, int64_t cw, float *y,
                        int64_t r0, int64_t r1, const int G) {
    for (int64_t r = r0; r < r1; r += 4) q4_rows(w, r, r1, x, sx, c0, cw, y + r - r0, c0 > 0, G);
}

/* Whether mv_q_fast handles w: 4- or 8-bit codes in groups of 32/64/128. */
static int mv_q_ok(const osp_weight *w) {
    return (w->qbits == 4 || w->qbits == 8) && (w->group == 32 || w->group == 64 || w->group == 128);
}

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (matmul_trivial(w, n, y, ldy, r0, r1)) return;
    if (n == 1 && mv_q_ok(w)) mv_q_fast(w, x, y, r0, r1);
    else if (n < GB_MIN_N && mv_q_ok(w))
        for (int64_t rb = r0; rb < r1; rb += MV_ROWS) {
            const int64_t re = rb + MV_ROWS < r1 ? rb + MV_ROWS : r1;
            for (int64_t t = 0; t < n; t++) mv_q_fast(w, x + t * w->cols, y + t * ldy + (rb - r0), rb, re);
        }
    else if (n < GB_MIN_N) mt_any(w, x, n, y, ldy, r0, r1);
    else gemm(w, x, n, y, ldy, r0, r1);
}

/* mt_rows' tokens' sums are independent: two tokens a pass share a row's
 * conversion. */
static void dense_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    mt_any(w, x, n, y, ldy, r0, r1);
}
