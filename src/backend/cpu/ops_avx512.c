/* AVX-512 (F/BW/VL/DQ) kernels, tested against ops_scalar.c.
 *
 * Only f32 arithmetic (no BF16/VNNI/FP16 dot instructions), so results
 * differ from the scalar twin by summation order alone.
 *
 * matmul picks one of three shapes by n (tokens):
 *  - n == 1 and 4/8-bit codes (the decode hot path): MLX form
 *    s*sum(x*q) + b*sum(x) streamed from the packed rows, 4 rows a step.
 *    Group sums of x (and for 4-bit a permuted copy of x that matches how
 *    nibbles come out of a 64-byte load) are made once per call, on the
 *    stack, 8192 columns at a time.
 *  - n < GB_MIN_N (decode of dense weights, other code widths, small
 *    batches): 4 rows x up to 4 tokens, weights converted to f32 on the
 *    fly and each used for every token; W is read once per 4 tokens.
 *  - larger n (prefill): a 64-row x 128-column tile of W is converted
 *    once to f32 (dequantized), transposed so rows lie along the lanes,
 *    and reused by up to 256 tokens; the micro-kernel keeps 6 tokens x 64
 *    rows in 24 registers and broadcasts x.
 * Every load of weight bytes is exact-sized or masked: the last row of a
 * tensor may end at the end of the mmapped file. Stack use stays under
 * ~40 KB per call.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "backend/ops.h"

#define OSP_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- loads */

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* bf16 is the top half of an f32: widen and shift. */
OSP_INLINE __m512 ld_bf16(const void *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

OSP_INLINE __m512 ld_f16(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* 16 elements from element i of a dense f32/f16/bf16 array; lanes outside
 * m are zero and their memory is not touched. With m all-ones the masked
 * load costs the same as a plain one. */
OSP_INLINE __m512 ld_dense(const void *base, osp_dtype dt, int64_t i, __mmask16 m) {
    const unsigned char *b = base;
    if (dt == OSP_DT_BF16) return ld_bf16(b + 2 * i, m);
    if (dt == OSP_DT_F16) return ld_f16(b + 2 * i, m);
    return _mm512_maskz_loadu_ps(m, b + 4 * i);
}

/* Scales/biases: dtype known only at run time, read 16 groups at a time. */
static __m512 ld_any(const void *base, osp_dtype dt, int64_t i, __mmask16 m) {
    switch (dt) {
    case OSP_DT_BF16: return ld_dense(base, OSP_DT_BF16, i, m);
    case OSP_DT_F16: return ld_dense(base, OSP_DT_F16, i, m);
    default: return ld_dense(base, OSP_DT_F32, i, m);
    }
}

/* --------------------------------------------------------- packed codes */

/* Unpacks 16 consecutive codes of any width 2..8 bits: their 2*bits bytes
 * are loaded exactly (masked), copied to each 128-bit lane, and every
 * lane picks its code's two bytes (pshufb), shifts and masks. */
typedef struct qunpack {
    __m512i idx, shift, mask;
    __mmask16 bytes;
    int bits;
} qunpack;

static void qunpack_init(qunpack *u, int bits) {
    uint8_t idx[64];
    int32_t sh[16];
    memset(u, 0, sizeof *u);
    if (!bits) return;
    for (int i = 0; i < 16; i++) {
        int bit = i * bits, o = bit >> 3;
        idx[4 * i] = (uint8_t)o;
        idx[4 * i + 1] = o + 1 < 16 ? (uint8_t)(o + 1) : 0x80;
        idx[4 * i + 2] = idx[4 * i + 3] = 0x80;
        sh[i] = bit & 7;
    }
    u->idx = _mm512_loadu_si512(idx);
    u->shift = _mm512_loadu_si512(sh);
    u->mask = _mm512_set1_epi32((1 << bits) - 1);
    u->bytes = (__mmask16)((1u << (2 * bits)) - 1u);
    u->bits = bits;
}

/* Codes c..c+15 of a packed row (c % 16 == 0) as floats. */
OSP_INLINE __m512 codes16(const unsigned char *row, const qunpack *u, int64_t c) {
    __m128i b = _mm_maskz_loadu_epi8(u->bytes, row + c * u->bits / 8);
    __m512i v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(b), u->idx);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, u->shift), u->mask));
}

/* Rows r..r+3 clamped to r1-1: a partial quad reads valid rows and its
 * extra results are dropped. */
static inline void quad_rows(int64_t r, int64_t r1, int64_t rr[4]) {
    for (int i = 0; i < 4; i++) rr[i] = r + i < r1 ? r + i : r1 - 1;
}

/* Software prefetch distance (bytes ahead in each row) for the streaming
 * kernels: with 4 rows in flight the hardware prefetcher alone leaves
 * DRAM bandwidth unused. */
#define PF_DENSE 512 /* dense rows */
#define PF_Q4 256    /* 4-bit rows */
#define PF_Q8 2048   /* 8-bit rows, one at a time */

/* ------------------------------------------- small n: rows x few tokens */

#define MT_T 4 /* tokens per pass */

/* y[t*ldy + i] = W[r+i] . x[t] for 4 rows and NT tokens, weights
 * converted to f32 on the fly (quantized: s*q+b) and used NT times.
 * This is the n == 1 path for dense and uncommon quantized weights, and
 * the small-batch path: W is read once per MT_T tokens. */
OSP_INLINE void mt_rows(const osp_weight *w, const qunpack *u, int64_t r, int64_t r1,
                        const float *x, float *y, int64_t ldy, const int NT, const osp_dtype fmt) {
    const int64_t cols = w->cols;
    int64_t rr[4];
    quad_rows(r, r1, rr);
    __m512 acc[4][MT_T], xv[MT_T];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm512_setzero_ps();
    if (fmt != OSP_DT_U32) {
        const int64_t es = fmt == OSP_DT_F32 ? 4 : 2, rs = cols * es;
        const unsigned char *row[4];
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rs;
        for (int64_t c = 0; c < cols; c += 16) {
            const __mmask16 m = tail_mask(cols - c);
            for (int t = 0; t < NT; t++) xv[t] = _mm512_maskz_loadu_ps(m, x + t * cols + c);
            for (int i = 0; i < 4; i++) {
                if (fmt == OSP_DT_F32 || (c & 16) == 0) /* once per line */
                    _mm_prefetch((const char *)row[i] + c * es + PF_DENSE, _MM_HINT_T0);
                __m512 wv = ld_dense(row[i], fmt, c, m);
                for (int t = 0; t < NT; t++) acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
            }
        }
    } else {
        const int64_t G = w->group, ng = cols / G, rb = cols * u->bits / 8;
        const unsigned char *row[4];
        float sb[4][16] __attribute__((aligned(64))), bb[4][16] __attribute__((aligned(64)));
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rb;
        for (int64_t g0 = 0; g0 < ng; g0 += 16) {
            const __mmask16 m = tail_mask(ng - g0);
            const int64_t cnt = ng - g0 < 16 ? ng - g0 : 16;
            for (int i = 0; i < 4; i++) {
                _mm512_store_ps(sb[i], ld_any(w->scales, w->sdtype, rr[i] * ng + g0, m));
                _mm512_store_ps(bb[i], ld_any(w->biases, w->sdtype, rr[i] * ng + g0, m));
            }
            for (int64_t g = 0; g < cnt; g++) {
                for (int64_t c = (g0 + g) * G; c < (g0 + g + 1) * G; c += 16) {
                    for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_ps(x + t * cols + c);
                    for (int i = 0; i < 4; i++) {
                        __m512 wv = _mm512_fmadd_ps(codes16(row[i], u, c), _mm512_set1_ps(sb[i][g]),
                                                    _mm512_set1_ps(bb[i][g]));
                        for (int t = 0; t < NT; t++)
                            acc[i][t] = _mm512_fmadd_ps(wv, xv[t], acc[i][t]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++)
        for (int t = 0; t < NT; t++) y[t * ldy + i] = _mm512_reduce_add_ps(acc[i][t]);
}

OSP_INLINE void mt_all(const osp_weight *w, const qunpack *u, const float *x, int64_t n,
                       float *y, int64_t ldy, int64_t r0, int64_t r1, const osp_dtype fmt) {
    for (int64_t t = 0; t < n; t += MT_T) {
        const float *xt = x + t * w->cols;
        for (int64_t r = r0; r < r1; r += 4) {
            float *yt = y + t * ldy + (r - r0);
            switch (n - t < MT_T ? n - t : MT_T) {
            case 1: mt_rows(w, u, r, r1, xt, yt, ldy, 1, fmt); break;
            case 2: mt_rows(w, u, r, r1, xt, yt, ldy, 2, fmt); break;
            case 3: mt_rows(w, u, r, r1, xt, yt, ldy, 3, fmt); break;
            default: mt_rows(w, u, r, r1, xt, yt, ldy, 4, fmt); break;
            }
        }
    }
}

static void mt_any(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    qunpack u;
    qunpack_init(&u, w->qbits);
    if (w->qbits) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_F16);
    else mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_F32);
}

/* ------------------------------------- n == 1, 4- and 8-bit, MLX form */

/* Columns of x prepared per pass (permuted x and group sums, on the
 * stack); longer rows take several passes that add into y. */
#define MV_CHUNK 8192

static void group_sums(const float *x, int64_t ng, int group, float *sx) {
    for (int64_t g = 0; g < ng; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int j = 0; j < group; j += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * group + j));
        sx[g] = _mm512_reduce_add_ps(s);
    }
}

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
        const __mmask16 m = tail_mask(cnt - gc);
        const __m512 sxv = _mm512_maskz_loadu_ps(m, sx + gc);
        for (int i = 0; i < 4; i++) {
            int64_t o = rr[i] * ng + gb + gc;
            sv[i] = ld_any(w->scales, w->sdtype, o, m);
            acc[i] = _mm512_fmadd_ps(ld_any(w->biases, w->sdtype, o, m), sxv, acc[i]);
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

/* 8-bit: per group, vg = sum x*q (16 codes a step), acc += s * vg with s
 * broadcast from memory; bias terms as for 4-bit. One row at a time: the
 * rows follow each other in memory, so the kernel reads one sequential
 * stream (4 rows side by side were 4 streams a row apart, which the
 * prefetchers followed worse; figures in docs/NOTES.md, "CPU kernels'
 * measured choices"). A row's operations are the same either way
 * (bitwise). Dense rows carry half the arithmetic a byte and gained
 * nothing from it.
 * NT tokens (xs apart, their group sums sx MV_CHUNK / 32 apart, outputs ldy
 * apart) share the row's conversion; each token's operations are those it
 * gets alone (NT = 1: the n == 1 kernel), so batched rows stay bitwise. */
OSP_INLINE void q8_row_each(const osp_weight *w, int64_t r, const float *x, int64_t xs, const float *sx, int64_t c0,
                            int64_t cw, float *out, int64_t ldy, int accum, const int G, const int NT) {
    const int64_t ng = w->cols / G, gb = c0 / G, cnt = cw / G;
    const unsigned char *p = (const unsigned char *)w->data + r * w->cols + c0;
    __m512 acc[8], vg[8];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    float sb[16] __attribute__((aligned(64)));
    for (int64_t gc = 0; gc < cnt; gc += 16) {
        const __mmask16 m = tail_mask(cnt - gc);
        const int64_t gn = cnt - gc < 16 ? cnt - gc : 16;
        const int64_t o = r * ng + gb + gc;
        _mm512_store_ps(sb, ld_any(w->scales, w->sdtype, o, m));
        const __m512 bv = ld_any(w->biases, w->sdtype, o, m);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps(m, sx + t * (MV_CHUNK / 32) + gc), acc[t]);
        for (int64_t g = 0; g < gn; g++) {
            const int64_t k0 = (gc + g) * G;
            for (int t = 0; t < NT; t++) vg[t] = _mm512_setzero_ps();
            for (int j = 0; j < G; j += 16) {
                if (((k0 + j) & 63) == 0) _mm_prefetch((const char *)p + k0 + j + PF_Q8, _MM_HINT_T0);
                const __m512 d = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + k0 + j))));
                for (int t = 0; t < NT; t++) vg[t] = _mm512_fmadd_ps(_mm512_loadu_ps(x + t * xs + k0 + j), d, vg[t]);
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(sb[g]), vg[t], acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        const float v = _mm512_reduce_add_ps(acc[t]);
        out[t * ldy] = accum ? out[t * ldy] + v : v;
    }
}

OSP_INLINE void q8_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                        const int G) {
    float sx[8 * (MV_CHUNK / 32)];
    const int64_t C = w->cols;
    for (int64_t c0 = 0; c0 < C; c0 += MV_CHUNK) {
        const int64_t cw = C - c0 < MV_CHUNK ? C - c0 : MV_CHUNK;
        for (int64_t t0 = 0; t0 < n; t0 += 8) {
            const int nt = n - t0 < 8 ? (int)(n - t0) : 8;
            for (int t = 0; t < nt; t++) group_sums(x + (t0 + t) * C + c0, cw / G, G, sx + t * (MV_CHUNK / 32));
            const float *xt = x + t0 * C + c0;
            for (int64_t r = r0; r < r1; r++) {
                float *o = y + t0 * ldy + (r - r0);
                switch (nt) {
                case 1: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 1); break;
                case 2: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 2); break;
                case 3: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 3); break;
                case 4: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 4); break;
                case 5: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 5); break;
                case 6: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 6); break;
                case 7: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 7); break;
                default: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 8); break;
                }
            }
        }
    }
}

OSP_INLINE void mv_q(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                     const int G, const int BITS) {
    float xp[MV_CHUNK] __attribute__((aligned(64)));
    float sx[MV_CHUNK / 32];
    for (int64_t c0 = 0; c0 < w->cols; c0 += MV_CHUNK) {
        const int64_t cw = w->cols - c0 < MV_CHUNK ? w->cols - c0 : MV_CHUNK;
        group_sums(x + c0, cw / G, G, sx);
        if (BITS == 4) q4_permute_x(x + c0, cw, xp);
        if (BITS == 4)
            for (int64_t r = r0; r < r1; r += 4) q4_rows(w, r, r1, xp, sx, c0, cw, y + r - r0, c0 > 0, G);
        else
            for (int64_t r = r0; r < r1; r++) q8_row_each(w, r, x + c0, 0, sx, c0, cw, y + r - r0, 0, c0 > 0, G, 1);
    }
}

/* Whether mv_q_fast handles w: 4- or 8-bit codes in groups of 32/64/128
 * (4-bit rows in whole 128-column blocks). */
static int mv_q_ok(const osp_weight *w) {
    if (w->qbits == 4 && w->cols % 128 != 0) return 0;
    return (w->qbits == 4 || w->qbits == 8) &&
           (w->group == 32 || w->group == 64 || w->group == 128);
}

static void mv_q_fast(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    switch (w->qbits * 1000 + w->group) {
    case 4032: mv_q(w, x, y, r0, r1, 32, 4); break;
    case 4064: mv_q(w, x, y, r0, r1, 64, 4); break;
    case 4128: mv_q(w, x, y, r0, r1, 128, 4); break;
    case 8032: mv_q(w, x, y, r0, r1, 32, 8); break;
    case 8064: mv_q(w, x, y, r0, r1, 64, 8); break;
    default: mv_q(w, x, y, r0, r1, 128, 8); break;
    }
}

/* -------------------------------------------------- large n: tiled GEMM */

#define GB_ROWS 64  /* rows per W tile: 4 vectors of lanes */
#define GB_K 128    /* columns per W tile (a multiple of every group size) */
#define GB_KB 512   /* columns of x per L2 block (a multiple of GB_K) */
#define GB_TOK 256  /* tokens sharing one converted tile */
#define GB_T 6      /* tokens per micro-kernel */
#define GB_MIN_N 16 /* below this the small-n kernel wins */

/* In-register 16x16 transpose: r[i][j] -> r[j][i]. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4q+e], 128-bit block b: column 4b+e of rows 4q..4q+3 */
    for (int q = 0; q < 4; q++) {
        __m512d a0 = _mm512_castps_pd(t[4 * q]), a1 = _mm512_castps_pd(t[4 * q + 1]);
        __m512d a2 = _mm512_castps_pd(t[4 * q + 2]), a3 = _mm512_castps_pd(t[4 * q + 3]);
        u[4 * q] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    /* 4x4 transpose of 128-bit blocks across u[e], u[4+e], u[8+e], u[12+e] */
    for (int e = 0; e < 4; e++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44);
        __m512 v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        __m512 v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xEE);
        r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* 16 weights of row r from column c (c % 16 == 0 when quantized). */
OSP_INLINE __m512 ld_weights(const osp_weight *w, const qunpack *u, int64_t r, int64_t c,
                             __mmask16 m, const osp_dtype fmt) {
    if (fmt != OSP_DT_U32) {
        const int64_t es = fmt == OSP_DT_F32 ? 4 : 2;
        return ld_dense((const unsigned char *)w->data + r * w->cols * es, fmt, c, m);
    }
    const unsigned char *row = (const unsigned char *)w->data + r * w->cols * u->bits / 8;
    int64_t gi = r * (w->cols / w->group) + c / w->group;
    __m512 s = _mm512_set1_ps(osp_load_float(w->scales, w->sdtype, gi));
    __m512 b = _mm512_set1_ps(osp_load_float(w->biases, w->sdtype, gi));
    return _mm512_fmadd_ps(codes16(row, u, c), s, b);
}

/* wt[c*GB_ROWS + i] = W[rb+i, kc+c] as f32, for i < nr (rows up to the
 * next multiple of 16 are zero) and c < kw. */
OSP_INLINE void convert_tile(const osp_weight *w, const qunpack *u, int64_t rb, int nr,
                             int64_t kc, int64_t kw, float *wt, const osp_dtype fmt) {
    for (int rg = 0; rg * 16 < nr; rg++) {
        for (int64_t c = 0; c < kw; c += 16) {
            const __mmask16 m = tail_mask(kw - c);
            __m512 v[16];
            for (int i = 0; i < 16; i++)
                v[i] = rg * 16 + i < nr ? ld_weights(w, u, rb + rg * 16 + i, kc + c, m, fmt)
                                        : _mm512_setzero_ps();
            transpose16(v);
            for (int j = 0; j < 16; j++) _mm512_store_ps(wt + (c + j) * GB_ROWS + rg * 16, v[j]);
        }
    }
}

static void convert_tile_any(const osp_weight *w, const qunpack *u, int64_t rb, int nr,
                             int64_t kc, int64_t kw, float *wt) {
    if (w->qbits) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_F16);
    else convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_F32);
}

/* y[t*ldy + i] (+)= sum_c x[t*xs + c] * wt[c*GB_ROWS + i] for T tokens and
 * RV*16 rows (stores limited to nr rows). Per column: RV loads of W, T
 * broadcasts of x, T*RV FMAs. */
OSP_INLINE void micro(const float *wt, const float *x, int64_t xs, int64_t kw, float *y,
                      int64_t ldy, int nr, int accum, const int T, const int RV) {
    __m512 acc[GB_T][4];
    const float *xp[GB_T];
    for (int t = 0; t < T; t++) {
        xp[t] = x + t * xs;
        for (int v = 0; v < RV; v++) acc[t][v] = _mm512_setzero_ps();
    }
    for (int64_t c = 0; c < kw; c++) {
        __m512 wv[4];
        for (int v = 0; v < RV; v++) {
            wv[v] = _mm512_load_ps(wt + c * GB_ROWS + 16 * v);
            /* keep W in registers: GCC would otherwise fold a reload of W
             * into every FMA and run out of load slots */
            __asm__("" : "+v"(wv[v]));
        }
        for (int t = 0; t < T; t++) {
            __m512 xb = _mm512_set1_ps(xp[t][c]);
            for (int v = 0; v < RV; v++) acc[t][v] = _mm512_fmadd_ps(wv[v], xb, acc[t][v]);
        }
    }
    for (int t = 0; t < T; t++) {
        for (int v = 0; v < RV; v++) {
            __mmask16 m = tail_mask(nr - 16 * v);
            float *yp = y + t * ldy + 16 * v;
            __m512 a = acc[t][v];
            if (accum) a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m, yp));
            _mm512_mask_storeu_ps(yp, m, a);
        }
    }
}

#define MICRO_CASE(T, RV)                                                      \
    case (T) * 8 + (RV): micro(wt, x, xs, kw, y, ldy, nr, accum, T, RV); break;

static void micro_any(const float *wt, const float *x, int64_t xs, int64_t kw, float *y,
                      int64_t ldy, int nt, int nr, int accum) {
    switch (nt * 8 + (nr + 15) / 16) {
        MICRO_CASE(1, 1) MICRO_CASE(1, 2) MICRO_CASE(1, 3) MICRO_CASE(1, 4)
        MICRO_CASE(2, 1) MICRO_CASE(2, 2) MICRO_CASE(2, 3) MICRO_CASE(2, 4)
        MICRO_CASE(3, 1) MICRO_CASE(3, 2) MICRO_CASE(3, 3) MICRO_CASE(3, 4)
        MICRO_CASE(4, 1) MICRO_CASE(4, 2) MICRO_CASE(4, 3) MICRO_CASE(4, 4)
        MICRO_CASE(5, 1) MICRO_CASE(5, 2) MICRO_CASE(5, 3) MICRO_CASE(5, 4)
        MICRO_CASE(6, 1) MICRO_CASE(6, 2) MICRO_CASE(6, 3) MICRO_CASE(6, 4)
    default: break;
    }
}

/* Blocked for the caches: a slice of x (GB_TOK tokens x GB_KB columns)
 * stays in L2 while every row tile of the range passes over it, each
 * converted tile (L1) serving all GB_TOK tokens. */
static void gemm(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                 int64_t r0, int64_t r1) {
    float wt[GB_K * GB_ROWS] __attribute__((aligned(64)));
    qunpack u;
    qunpack_init(&u, w->qbits);
    const int64_t cols = w->cols;
    for (int64_t tb = 0; tb < n; tb += GB_TOK) {
        const int64_t te = tb + GB_TOK < n ? tb + GB_TOK : n;
        for (int64_t kb = 0; kb < cols; kb += GB_KB) {
            const int64_t ke = kb + GB_KB < cols ? kb + GB_KB : cols;
            for (int64_t rb = r0; rb < r1; rb += GB_ROWS) {
                const int nr = (int)(r1 - rb < GB_ROWS ? r1 - rb : GB_ROWS);
                for (int64_t kc = kb; kc < ke; kc += GB_K) {
                    const int64_t kw = ke - kc < GB_K ? ke - kc : GB_K;
                    convert_tile_any(w, &u, rb, nr, kc, kw, wt);
                    for (int64_t t = tb; t < te; t += GB_T) {
                        int nt = (int)(te - t < GB_T ? te - t : GB_T);
                        micro_any(wt, x + t * cols + kc, cols, kw, y + t * ldy + (rb - r0), ldy,
                                  nt, nr, kc > 0);
                    }
                }
            }
        }
    }
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
            a0 = _mm512_fmadd_ps(ld_dense(row, fmt, c, 0xffff), _mm512_loadu_ps(x + c), a0);
            a1 = _mm512_fmadd_ps(ld_dense(row, fmt, c + 16, 0xffff), _mm512_loadu_ps(x + c + 16), a1);
            a2 = _mm512_fmadd_ps(ld_dense(row, fmt, c + 32, 0xffff), _mm512_loadu_ps(x + c + 32), a2);
            a3 = _mm512_fmadd_ps(ld_dense(row, fmt, c + 48, 0xffff), _mm512_loadu_ps(x + c + 48), a3);
        }
        for (; c < cols; c += 16) {
            const __mmask16 m = tail_mask(cols - c);
            a0 = _mm512_fmadd_ps(ld_dense(row, fmt, c, m), _mm512_maskz_loadu_ps(m, x + c), a0);
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
            a[i][0] = _mm512_fmadd_ps(ld_dense(w0 + i * rs, fmt, c, 0xffff), x0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(ld_dense(w0 + i * rs, fmt, c + 16, 0xffff), x1, a[i][1]);
        }
    }
    for (; c < cols; c += 16) {
        const __mmask16 m = tail_mask(cols - c);
        const __m512 x0 = _mm512_maskz_loadu_ps(m, x + c);
        for (int i = 0; i < nr; i++) a[i][0] = _mm512_fmadd_ps(ld_dense(w0 + i * rs, fmt, c, m), x0, a[i][0]);
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
            const __m512 w0 = ld_dense(row, fmt, c, 0xffff), w1 = ld_dense(row, fmt, c + 16, 0xffff),
                         w2 = ld_dense(row, fmt, c + 32, 0xffff), w3 = ld_dense(row, fmt, c + 48, 0xffff);
            for (int t = 0; t < NT; t++) {
                const float *xt = x + t * cols;
                a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt + c), a[t][0]);
                a[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + c + 16), a[t][1]);
                a[t][2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xt + c + 32), a[t][2]);
                a[t][3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xt + c + 48), a[t][3]);
            }
        }
        for (; c < cols; c += 16) {
            const __mmask16 m = tail_mask(cols - c);
            const __m512 w0 = ld_dense(row, fmt, c, m);
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
        const __m512 w0 = ld_dense(row, fmt, c, 0xffff), w1 = ld_dense(row, fmt, c + 16, 0xffff);
        for (int t = 0; t < NT; t++) {
            a[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * cols + c), a[t][0]);
            a[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * cols + c + 16), a[t][1]);
        }
    }
    for (; c < cols; c += 16) {
        const __mmask16 m = tail_mask(cols - c);
        const __m512 w0 = ld_dense(row, fmt, c, m);
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

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    if (n <= 0 || r1 <= r0) return;
    if (w->cols <= 0) {
        for (int64_t t = 0; t < n; t++) memset(y + t * ldy, 0, (size_t)(r1 - r0) * sizeof(float));
        return;
    }
    if (n == 1 && mv_q_ok(w)) mv_q_fast(w, x, y, r0, r1);
    else if (n == 1 && !w->qbits) mv_dense(w, x, y, r0, r1);
    else if (n < GB_MIN_N) mt_any(w, x, n, y, ldy, r0, r1);
    else gemm(w, x, n, y, ldy, r0, r1);
}

/* Dense and 8-bit weights: every token as the one-token kernel gives it. */
static int matmul_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    if (w->cols <= 0 || (w->qbits && (w->qbits != 8 || !mv_q_ok(w)))) return 0;
    if (n <= 0 || r1 <= r0) return 1;
    if (!w->qbits) { /* dense rows (bf16 where AMX does not take them, f16, f32) */
        if (w->dtype == OSP_DT_BF16) dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_BF16);
        else if (w->dtype == OSP_DT_F16) dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_F16);
        else dense_each_t(w, x, n, y, ldy, r0, r1, OSP_DT_F32);
        return 1;
    }
    switch (w->group) {
    case 32: q8_each(w, x, n, y, ldy, r0, r1, 32); break;
    case 64: q8_each(w, x, n, y, ldy, r0, r1, 64); break;
    default: q8_each(w, x, n, y, ldy, r0, r1, 128); break;
    }
    return 1;
}

/* ------------------------------------------------------------ elementwise */

static float dot(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static void rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps, int add_one) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        s0 = _mm512_fmadd_ps(a, a, s0);
        s1 = _mm512_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 16) {
        __m512 a = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        s0 = _mm512_fmadd_ps(a, a, s0);
    }
    float ss = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    const __m512 one = _mm512_set1_ps(1.0f);
    for (i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
        if (w) {
            __m512 wv = _mm512_maskz_loadu_ps(m, w + i);
            v = _mm512_mul_ps(v, add_one ? _mm512_add_ps(one, wv) : wv);
        }
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* e^x, Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial,
 * scaled by 2^n with scalef (which gives inf / denormals / 0 at the ends
 * like expf). ~1 ulp. */
OSP_INLINE __m512 exp512(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* 1 / (1 + e^-x); saturates cleanly to 0 and 1. */
OSP_INLINE __m512 sigmoid512(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* tanh: odd Taylor series to z^17 below |z| = 0.5 (error < 1e-8), else
 * 1 - 2/(e^2|z| + 1), which has no cancellation there and tends to 1. */
OSP_INLINE __m512 tanh512(__m512 z) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 a = _mm512_abs_ps(z);
    __m512 z2 = _mm512_mul_ps(z, z);
    __m512 p = _mm512_set1_ps(5.90027440946e-4f);
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(-1.45583438705e-3f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(3.59212803657e-3f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(-8.86323552990e-3f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(2.18694885362e-2f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(-5.39682539683e-2f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(1.33333333333e-1f));
    p = _mm512_fmadd_ps(p, z2, _mm512_set1_ps(-3.33333333333e-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(z, z2), p, z);
    __m512 e = exp512(_mm512_add_ps(a, a));
    __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    /* copy z's sign onto big */
    big = _mm512_or_ps(big, _mm512_and_ps(z, _mm512_set1_ps(-0.0f)));
    __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(is_small, big, small);
}

static void softmax(float *x, int64_t n) {
    if (n <= 0) return;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - i), x + i));
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv));
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
        _mm512_mask_storeu_ps(x + i, m, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
    }
}

static float sumexp(const float *x, int64_t n, float *mx_out) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16)
        mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - i), x + i));
    const float m = n > 0 ? _mm512_reduce_max_ps(mx) : -INFINITY;
    const __m512 mv = _mm512_set1_ps(m);
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) { /* two chains */
        s0 = _mm512_add_ps(s0, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv)));
        s1 = _mm512_add_ps(s1, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), mv)));
    }
    for (; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv))));
    }
    *mx_out = m;
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid512(gv)), _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* 0.5 v (1 + tanh z) == v * sigmoid(2z): same value, no cancellation. */
static void gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) {
    const __m512 k = _mm512_set1_ps(0.7978845608028654f), c = _mm512_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, g + i);
        __m512 z = _mm512_mul_ps(k, _mm512_fmadd_ps(_mm512_mul_ps(c, v), _mm512_mul_ps(v, v), v));
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(v, sigmoid512(_mm512_add_ps(z, z))),
                                 _mm512_maskz_loadu_ps(m, u + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

static void gelu_erf(float *x, int64_t n) {
    static const float P[11] = OSP_GELU_ERF_P;
    const __m512 cap = _mm512_set1_ps(14.1421356f), two = _mm512_set1_ps(2.0f), half = _mm512_set1_ps(0.5f),
                 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        /* |x| up to 10 sqrt 2 (min with the NaN second: a NaN stays NaN) */
        const __m512 a = _mm512_min_ps(cap, _mm512_abs_ps(v));
        const __m512 t = _mm512_div_ps(two, _mm512_add_ps(two, _mm512_mul_ps(a, _mm512_set1_ps(0.70710678118654752f))));
        __m512 p = _mm512_set1_ps(P[10]);
        for (int k = 9; k >= 0; k--) p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(P[k]));
        /* z^2 = x^2 / 2 = zz + lo exactly (z itself rounded would cost 3e-6 at z = 7), and e^(p - z^2) as
         * e^-zz e^(p - lo) (the sum p - zz would round at zz's scale) */
        const __m512 hi = _mm512_mul_ps(a, a), zz = _mm512_mul_ps(half, hi),
                     lo = _mm512_mul_ps(half, _mm512_fmsub_ps(a, a, hi));
        const __m512 e = _mm512_mul_ps(exp512(_mm512_sub_ps(_mm512_setzero_ps(), zz)), exp512(_mm512_sub_ps(p, lo)));
        const __m512 hc = _mm512_mul_ps(half, _mm512_mul_ps(t, e));
        const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
        const __m512 phi = _mm512_mask_blend_ps(pos, hc, _mm512_sub_ps(one, hc));
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, phi));
    }
}

static void softcap(float *x, int64_t n, float cap) {
    const __m512 cv = _mm512_set1_ps(cap);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), cv);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(cv, tanh512(v)));
    }
}

static const osp_ops OPS = {
    .name = "avx512", .matmul = matmul, .matmul_each = matmul_each, .dot = dot, .axpy = axpy, .rmsnorm = rmsnorm,
    .softmax = softmax, .sumexp = sumexp, .silu_mul = silu_mul, .gelu_tanh_mul = gelu_tanh_mul,
    .gelu_erf = gelu_erf, .softcap = softcap,
};

const osp_ops *osp_ops_avx512(void) { return &OPS; }
