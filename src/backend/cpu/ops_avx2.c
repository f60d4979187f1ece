/* AVX2 + FMA + F16C kernels, tested against ops_scalar.c.
 *
 * The plan of ops_avx512.c with 8-lane vectors and 16 registers:
 *  - 4/8-bit codes, n < GB_MIN_N: MLX form s*sum(x*q) + b*sum(x) streamed
 *    from the packed rows, 4 rows a step, group sums of x made once per
 *    call (several tokens: once per token over L2-sized row blocks).
 *  - other weights, n < GB_MIN_N: 4 rows x up to 2 tokens, weights
 *    converted to f32 on the fly and each used for every token.
 *  - larger n (prefill): a 16-row x 128-column tile of W is converted
 *    once to f32, transposed so rows lie along the lanes, and reused by up
 *    to 256 tokens; the micro-kernel keeps 6 tokens x 16 rows in 12
 *    registers and broadcasts x.
 * AVX2 has no masked 16-bit loads, so partial vectors of f16/bf16 and
 * packed codes near the end of a row are assembled with scalar loads:
 * nothing reads past a row (a tensor may end at the end of the file).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "backend/ops.h"

#define OSP_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- loads */

static const int32_t MASK_TAB[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* Lanes [0, left) set; left is clamped to 8. */
static inline __m256i tail_mask(int64_t left) {
    return _mm256_loadu_si256((const __m256i *)(MASK_TAB + 8 - (left < 8 ? left : 8)));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 elements from element i of a dense f32/f16/bf16 array. */
OSP_INLINE __m256 ld_dense(const void *base, osp_dtype dt, int64_t i) {
    const unsigned char *b = base;
    if (dt == OSP_DT_BF16) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    if (dt == OSP_DT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i)));
    return _mm256_loadu_ps((const float *)(b + 4 * i));
}

/* The first cnt (< 8) of those elements, the rest zero; touches only them. */
static __m256 ld_dense_part(const void *base, osp_dtype dt, int64_t i, int64_t cnt) {
    float t[8] = {0};
    for (int64_t j = 0; j < cnt; j++) t[j] = osp_load_float(base, dt, i + j);
    return _mm256_loadu_ps(t);
}

/* Scales/biases (dtype known at run time), 8 groups at a time. */
static __m256 ld_any(const void *base, osp_dtype dt, int64_t i, int64_t cnt) {
    if (cnt < 8) return ld_dense_part(base, dt, i, cnt);
    switch (dt) {
    case OSP_DT_BF16: return ld_dense(base, OSP_DT_BF16, i);
    case OSP_DT_F16: return ld_dense(base, OSP_DT_F16, i);
    default: return ld_dense(base, OSP_DT_F32, i);
    }
}

/* --------------------------------------------------------- packed codes */

/* Codes c..c+7 (c % 8 == 0) of a packed row of rowb bytes, as floats.
 * The 8 codes are `bits` whole bytes; codes 0-3 sit in their first 32
 * bits and codes 4-7 in the 32 bits from bit 4*bits, so two dword windows
 * and per-lane shifts unpack any width 2..8. Near the row end the bytes
 * are gathered one by one, never past it. */
OSP_INLINE __m256 codes8(const unsigned char *row, int64_t rowb, int bits, int64_t c) {
    const int64_t o = c * bits / 8;
    uint64_t v = 0;
    if (o + 8 <= rowb) memcpy(&v, row + o, 8);
    else
        for (int i = 0; i < bits; i++) v |= (uint64_t)row[o + i] << (8 * i);
    int32_t lo = (int32_t)(uint32_t)v, hi = (int32_t)(uint32_t)(v >> (4 * bits));
    __m256i q = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
    __m256i sh = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 0, bits, 2 * bits, 3 * bits);
    q = _mm256_and_si256(_mm256_srlv_epi32(q, sh), _mm256_set1_epi32((1 << bits) - 1));
    return _mm256_cvtepi32_ps(q);
}

/* Rows r..r+3 clamped to r1-1: a partial quad reads valid rows and its
 * extra results are dropped. */
static inline void quad_rows(int64_t r, int64_t r1, int64_t rr[4]) {
    for (int i = 0; i < 4; i++) rr[i] = r + i < r1 ? r + i : r1 - 1;
}

/* ------------------------------------------- small n: rows x few tokens */

#define MT_T 2 /* tokens per pass (16 registers: 4 rows x 2 tokens) */

/* y[t*ldy + i] = W[r+i] . x[t] for 4 rows and NT tokens, weights
 * converted to f32 on the fly (quantized: s*q+b) and used NT times.
 * This is the n == 1 path for dense and uncommon quantized weights, and
 * the small-batch path. */
OSP_INLINE void mt_rows(const osp_weight *w, int64_t r, int64_t r1, const float *x, float *y,
                        int64_t ldy, const int NT, const osp_dtype fmt) {
    const int64_t cols = w->cols;
    int64_t rr[4];
    quad_rows(r, r1, rr);
    __m256 acc[4][MT_T], xv[MT_T];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
    if (fmt != OSP_DT_U32) {
        const int64_t es = fmt == OSP_DT_F32 ? 4 : 2, rs = cols * es;
        const unsigned char *row[4];
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rs;
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + t * cols + c);
            for (int i = 0; i < 4; i++) {
                /* with 4 rows in flight the hardware prefetcher alone
                 * leaves DRAM bandwidth unused */
                if (((c * es) & 63) == 0)
                    _mm_prefetch((const char *)row[i] + c * es + 512, _MM_HINT_T0);
                __m256 wv = ld_dense(row[i], fmt, c);
                for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
            }
        }
        if (c < cols) {
            const __m256i m = tail_mask(cols - c);
            for (int t = 0; t < NT; t++) xv[t] = _mm256_maskload_ps(x + t * cols + c, m);
            for (int i = 0; i < 4; i++) {
                __m256 wv = ld_dense_part(row[i], fmt, c, cols - c);
                for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
            }
        }
    } else {
        const int bits = w->qbits;
        const int64_t G = w->group, ng = cols / G, rb = cols * bits / 8;
        const unsigned char *row[4];
        float sb[4][8] __attribute__((aligned(32))), bb[4][8] __attribute__((aligned(32)));
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rb;
        for (int64_t g0 = 0; g0 < ng; g0 += 8) {
            const int64_t cnt = ng - g0 < 8 ? ng - g0 : 8;
            for (int i = 0; i < 4; i++) {
                _mm256_store_ps(sb[i], ld_any(w->scales, w->sdtype, rr[i] * ng + g0, cnt));
                _mm256_store_ps(bb[i], ld_any(w->biases, w->sdtype, rr[i] * ng + g0, cnt));
            }
            for (int64_t g = 0; g < cnt; g++) {
                for (int64_t c = (g0 + g) * G; c < (g0 + g + 1) * G; c += 8) {
                    for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x + t * cols + c);
                    for (int i = 0; i < 4; i++) {
                        __m256 wv = _mm256_fmadd_ps(codes8(row[i], rb, bits, c),
                                                    _mm256_broadcast_ss(&sb[i][g]),
                                                    _mm256_broadcast_ss(&bb[i][g]));
                        for (int t = 0; t < NT; t++)
                            acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++)
        for (int t = 0; t < NT; t++) y[t * ldy + i] = hsum(acc[i][t]);
}

OSP_INLINE void mt_all(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, const osp_dtype fmt) {
    for (int64_t t = 0; t < n; t += MT_T) {
        const float *xt = x + t * w->cols;
        for (int64_t r = r0; r < r1; r += 4) {
            float *yt = y + t * ldy + (r - r0);
            if (n - t == 1) mt_rows(w, r, r1, xt, yt, ldy, 1, fmt);
            else mt_rows(w, r, r1, xt, yt, ldy, 2, fmt);
        }
    }
}

static void mt_any(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    if (w->qbits) mt_all(w, x, n, y, ldy, r0, r1, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) mt_all(w, x, n, y, ldy, r0, r1, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) mt_all(w, x, n, y, ldy, r0, r1, OSP_DT_F16);
    else mt_all(w, x, n, y, ldy, r0, r1, OSP_DT_F32);
}

/* ------------------------------------- n == 1, 4- and 8-bit, MLX form */

/* Columns of x whose group sums are made per pass (on the stack); longer
 * rows take several passes that add into y. */
#define MV_CHUNK 8192

static void group_sums(const float *x, int64_t ng, int group, float *sx) {
    for (int64_t g = 0; g < ng; g++) {
        __m256 s = _mm256_setzero_ps();
        for (int j = 0; j < group; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + g * group + j));
        sx[g] = hsum(s);
    }
}

/* Codes of one group of 4 rows dotted with x. 4-bit, 16 codes (8 bytes)
 * a step: byte j holds code 2j in its low nibble and 2j+1 in its high one,
 * so the codes split into even and odd vectors and x is split the same
 * way once for the 4 rows. 8-bit: 8 codes a step. */
OSP_INLINE void q_group(const unsigned char *const p[4], const float *x, int64_t k0, __m256 vg[4],
                        const int G, const int BITS) {
    const __m256i lo4 = _mm256_set1_epi32(0xF);
    for (int i = 0; i < 4; i++) vg[i] = _mm256_setzero_ps();
    if (BITS == 4) {
        for (int j = 0; j < G; j += 16) {
            __m256 xa = _mm256_loadu_ps(x + k0 + j), xb = _mm256_loadu_ps(x + k0 + j + 8);
            __m256 xe = _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xa, xb, 0x88)), 0xD8));
            __m256 xo = _mm256_castpd_ps(
                _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(xa, xb, 0xDD)), 0xD8));
            for (int i = 0; i < 4; i++) {
                __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + (k0 + j) / 2)));
                vg[i] = _mm256_fmadd_ps(xe, _mm256_cvtepi32_ps(_mm256_and_si256(d, lo4)), vg[i]);
                vg[i] = _mm256_fmadd_ps(xo, _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), vg[i]);
            }
        }
    } else {
        for (int j = 0; j < G; j += 8) {
            __m256 xv = _mm256_loadu_ps(x + k0 + j);
            for (int i = 0; i < 4; i++) {
                __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p[i] + k0 + j)));
                vg[i] = _mm256_fmadd_ps(xv, _mm256_cvtepi32_ps(d), vg[i]);
            }
        }
    }
}

/* 4 rows over columns [c0, c0+cw): per group acc += s * sum(x*q); the
 * bias terms b * sum(x) go into the same accumulator (lanes over groups
 * instead of columns: only the total matters). Scales are widened 8
 * groups at a time into sb and broadcast from memory. */
OSP_INLINE void q_rows(const osp_weight *w, int64_t r, int64_t r1, const float *x,
                       const float *sx, int64_t c0, int64_t cw, float *out, int accum,
                       const int G, const int BITS) {
    const int64_t ng = w->cols / G, rb = w->cols * BITS / 8, gb = c0 / G, cnt = cw / G;
    int64_t rr[4];
    quad_rows(r, r1, rr);
    const unsigned char *p[4];
    __m256 acc[4], vg[4];
    float sb[4][8] __attribute__((aligned(32)));
    for (int i = 0; i < 4; i++) {
        p[i] = (const unsigned char *)w->data + rr[i] * rb + c0 * BITS / 8;
        acc[i] = _mm256_setzero_ps();
    }
    for (int64_t gc = 0; gc < cnt; gc += 8) {
        const int64_t gn = cnt - gc < 8 ? cnt - gc : 8;
        const __m256 sxv = _mm256_maskload_ps(sx + gc, tail_mask(gn));
        for (int i = 0; i < 4; i++) {
            int64_t o = rr[i] * ng + gb + gc;
            _mm256_store_ps(sb[i], ld_any(w->scales, w->sdtype, o, gn));
            acc[i] = _mm256_fmadd_ps(ld_any(w->biases, w->sdtype, o, gn), sxv, acc[i]);
        }
        for (int64_t g = 0; g < gn; g++) {
            q_group(p, x, (gc + g) * G, vg, G, BITS);
            for (int i = 0; i < 4; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb[i][g]), vg[i], acc[i]);
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++) {
        float v = hsum(acc[i]);
        out[i] = accum ? out[i] + v : v;
    }
}

/* 8-bit, one row at a time: one sequential stream with a prefetch 2 KB
 * ahead (ops_avx512.c's q8_row_each says why); the same operations as
 * q_rows for that row. NT (<= 4: the 16 registers) tokens share the row's
 * conversion, each token's operations those it gets alone (NT = 1: the
 * n == 1 kernel). */
OSP_INLINE void q8_row_each(const osp_weight *w, int64_t r, const float *x, int64_t xs, const float *sx, int64_t c0,
                            int64_t cw, float *out, int64_t ldy, int accum, const int G, const int NT) {
    const int64_t ng = w->cols / G, gb = c0 / G, cnt = cw / G;
    const unsigned char *p = (const unsigned char *)w->data + r * w->cols + c0;
    __m256 acc[4], vg[4];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    float sb[8] __attribute__((aligned(32)));
    for (int64_t gc = 0; gc < cnt; gc += 8) {
        const int64_t gn = cnt - gc < 8 ? cnt - gc : 8;
        const int64_t o = r * ng + gb + gc;
        _mm256_store_ps(sb, ld_any(w->scales, w->sdtype, o, gn));
        const __m256 bv = ld_any(w->biases, w->sdtype, o, gn);
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(bv, _mm256_maskload_ps(sx + t * (MV_CHUNK / 32) + gc, tail_mask(gn)), acc[t]);
        for (int64_t g = 0; g < gn; g++) {
            const int64_t k0 = (gc + g) * G;
            for (int t = 0; t < NT; t++) vg[t] = _mm256_setzero_ps();
            for (int j = 0; j < G; j += 8) {
                if (((k0 + j) & 63) == 0) _mm_prefetch((const char *)p + k0 + j + 2048, _MM_HINT_T0);
                const __m256 d = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + k0 + j))));
                for (int t = 0; t < NT; t++) vg[t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * xs + k0 + j), d, vg[t]);
            }
            for (int t = 0; t < NT; t++) acc[t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sb[g]), vg[t], acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        const float v = hsum(acc[t]);
        out[t * ldy] = accum ? out[t * ldy] + v : v;
    }
}

OSP_INLINE void q8_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                        const int G) {
    float sx[4 * (MV_CHUNK / 32)];
    const int64_t C = w->cols;
    for (int64_t c0 = 0; c0 < C; c0 += MV_CHUNK) {
        const int64_t cw = C - c0 < MV_CHUNK ? C - c0 : MV_CHUNK;
        for (int64_t t0 = 0; t0 < n; t0 += 4) {
            const int nt = n - t0 < 4 ? (int)(n - t0) : 4;
            for (int t = 0; t < nt; t++) group_sums(x + (t0 + t) * C + c0, cw / G, G, sx + t * (MV_CHUNK / 32));
            const float *xt = x + t0 * C + c0;
            for (int64_t r = r0; r < r1; r++) {
                float *o = y + t0 * ldy + (r - r0);
                switch (nt) {
                case 1: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 1); break;
                case 2: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 2); break;
                case 3: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 3); break;
                default: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 4); break;
                }
            }
        }
    }
}

OSP_INLINE void mv_q(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1,
                     const int G, const int BITS) {
    float sx[MV_CHUNK / 32];
    for (int64_t c0 = 0; c0 < w->cols; c0 += MV_CHUNK) {
        const int64_t cw = w->cols - c0 < MV_CHUNK ? w->cols - c0 : MV_CHUNK;
        group_sums(x + c0, cw / G, G, sx);
        if (BITS == 8)
            for (int64_t r = r0; r < r1; r++) q8_row_each(w, r, x + c0, 0, sx, c0, cw, y + r - r0, 0, c0 > 0, G, 1);
        else
            for (int64_t r = r0; r < r1; r += 4) q_rows(w, r, r1, x + c0, sx, c0, cw, y + r - r0, c0 > 0, G, BITS);
    }
}

/* Whether mv_q_fast handles w: 4- or 8-bit codes in groups of 32/64/128. */
static int mv_q_ok(const osp_weight *w) {
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

#define GB_ROWS 16  /* rows per W tile: 2 vectors of lanes */
#define GB_K 128    /* columns per W tile (a multiple of every group size) */
#define GB_KB 512   /* columns of x per L2 block (a multiple of GB_K) */
#define GB_TOK 256  /* tokens sharing one converted tile */
#define GB_T 6      /* tokens per micro-kernel */
#define GB_MIN_N 16 /* below this the small-n kernels win */
#define MV_ROWS 64  /* rows per block when a few tokens reuse the matvec */

/* In-register 8x8 transpose: r[i][j] -> r[j][i]. */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4q+e], 128-bit half b: column 4b+e of rows 4q..4q+3 */
    for (int q = 0; q < 2; q++) {
        __m256d a0 = _mm256_castps_pd(t[4 * q]), a1 = _mm256_castps_pd(t[4 * q + 1]);
        __m256d a2 = _mm256_castps_pd(t[4 * q + 2]), a3 = _mm256_castps_pd(t[4 * q + 3]);
        u[4 * q] = _mm256_castpd_ps(_mm256_unpacklo_pd(a0, a2));
        u[4 * q + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a0, a2));
        u[4 * q + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(a1, a3));
        u[4 * q + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(a1, a3));
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

/* 8 weights of row r from column c, cnt of them valid (c % 8 == 0 and
 * cnt == 8 when quantized). */
OSP_INLINE __m256 ld_weights(const osp_weight *w, int64_t r, int64_t c, int64_t cnt,
                             const osp_dtype fmt) {
    if (fmt != OSP_DT_U32) {
        const unsigned char *row =
            (const unsigned char *)w->data + r * w->cols * (fmt == OSP_DT_F32 ? 4 : 2);
        return cnt >= 8 ? ld_dense(row, fmt, c) : ld_dense_part(row, fmt, c, cnt);
    }
    const int64_t rb = w->cols * w->qbits / 8;
    int64_t gi = r * (w->cols / w->group) + c / w->group;
    __m256 s = _mm256_set1_ps(osp_load_float(w->scales, w->sdtype, gi));
    __m256 b = _mm256_set1_ps(osp_load_float(w->biases, w->sdtype, gi));
    return _mm256_fmadd_ps(codes8((const unsigned char *)w->data + r * rb, rb, w->qbits, c), s, b);
}

/* wt[c*GB_ROWS + i] = W[rb+i, kc+c] as f32, for i < nr (rows up to the
 * next multiple of 8 are zero) and c < kw. */
OSP_INLINE void convert_tile(const osp_weight *w, int64_t rb, int nr, int64_t kc, int64_t kw,
                             float *wt, const osp_dtype fmt) {
    for (int rg = 0; rg * 8 < nr; rg++) {
        for (int64_t c = 0; c < kw; c += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = rg * 8 + i < nr ? ld_weights(w, rb + rg * 8 + i, kc + c, kw - c, fmt)
                                       : _mm256_setzero_ps();
            transpose8(v);
            for (int j = 0; j < 8; j++) _mm256_store_ps(wt + (c + j) * GB_ROWS + rg * 8, v[j]);
        }
    }
}

static void convert_tile_any(const osp_weight *w, int64_t rb, int nr, int64_t kc, int64_t kw,
                             float *wt) {
    if (w->qbits) convert_tile(w, rb, nr, kc, kw, wt, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) convert_tile(w, rb, nr, kc, kw, wt, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) convert_tile(w, rb, nr, kc, kw, wt, OSP_DT_F16);
    else convert_tile(w, rb, nr, kc, kw, wt, OSP_DT_F32);
}

/* y[t*ldy + i] (+)= sum_c x[t*xs + c] * wt[c*GB_ROWS + i] for T tokens and
 * RV*8 rows (stores limited to nr rows). */
OSP_INLINE void micro(const float *wt, const float *x, int64_t xs, int64_t kw, float *y,
                      int64_t ldy, int nr, int accum, const int T, const int RV) {
    __m256 acc[GB_T][2];
    const float *xp[GB_T];
    for (int t = 0; t < T; t++) {
        xp[t] = x + t * xs;
        for (int v = 0; v < RV; v++) acc[t][v] = _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < kw; c++) {
        __m256 wv[2];
        for (int v = 0; v < RV; v++) {
            wv[v] = _mm256_load_ps(wt + c * GB_ROWS + 8 * v);
            /* keep W in registers: GCC would otherwise fold a reload of W
             * into every FMA and run out of load slots */
            __asm__("" : "+x"(wv[v]));
        }
        for (int t = 0; t < T; t++) {
            __m256 xb = _mm256_broadcast_ss(xp[t] + c);
            for (int v = 0; v < RV; v++) acc[t][v] = _mm256_fmadd_ps(wv[v], xb, acc[t][v]);
        }
    }
    for (int t = 0; t < T; t++) {
        for (int v = 0; v < RV; v++) {
            __m256i m = tail_mask(nr - 8 * v);
            float *yp = y + t * ldy + 8 * v;
            __m256 a = acc[t][v];
            if (accum) a = _mm256_add_ps(a, _mm256_maskload_ps(yp, m));
            _mm256_maskstore_ps(yp, m, a);
        }
    }
}

#define MICRO_CASE(T, RV)                                                      \
    case (T) * 4 + (RV): micro(wt, x, xs, kw, y, ldy, nr, accum, T, RV); break;

static void micro_any(const float *wt, const float *x, int64_t xs, int64_t kw, float *y,
                      int64_t ldy, int nt, int nr, int accum) {
    switch (nt * 4 + (nr + 7) / 8) {
        MICRO_CASE(1, 1) MICRO_CASE(1, 2) MICRO_CASE(2, 1) MICRO_CASE(2, 2)
        MICRO_CASE(3, 1) MICRO_CASE(3, 2) MICRO_CASE(4, 1) MICRO_CASE(4, 2)
        MICRO_CASE(5, 1) MICRO_CASE(5, 2) MICRO_CASE(6, 1) MICRO_CASE(6, 2)
    default: break;
    }
}

/* Blocked for the caches: a slice of x (GB_TOK tokens x GB_KB columns)
 * stays in L2 while every row tile of the range passes over it, each
 * converted tile (L1) serving all GB_TOK tokens. */
static void gemm(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                 int64_t r0, int64_t r1) {
    float wt[GB_K * GB_ROWS] __attribute__((aligned(32)));
    const int64_t cols = w->cols;
    for (int64_t tb = 0; tb < n; tb += GB_TOK) {
        const int64_t te = tb + GB_TOK < n ? tb + GB_TOK : n;
        for (int64_t kb = 0; kb < cols; kb += GB_KB) {
            const int64_t ke = kb + GB_KB < cols ? kb + GB_KB : cols;
            for (int64_t rb = r0; rb < r1; rb += GB_ROWS) {
                const int nr = (int)(r1 - rb < GB_ROWS ? r1 - rb : GB_ROWS);
                for (int64_t kc = kb; kc < ke; kc += GB_K) {
                    const int64_t kw = ke - kc < GB_K ? ke - kc : GB_K;
                    convert_tile_any(w, rb, nr, kc, kw, wt);
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

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    if (n <= 0 || r1 <= r0) return;
    if (w->cols <= 0) {
        for (int64_t t = 0; t < n; t++) memset(y + t * ldy, 0, (size_t)(r1 - r0) * sizeof(float));
        return;
    }
    if (n == 1 && mv_q_ok(w)) {
        mv_q_fast(w, x, y, r0, r1);
        return;
    }
    if (n < GB_MIN_N && mv_q_ok(w)) {
        /* Unpacking codes in order costs more than re-reading them: run
         * the 4/8-bit matvec per token over row blocks that stay in L2. */
        for (int64_t rb = r0; rb < r1; rb += MV_ROWS) {
            int64_t re = rb + MV_ROWS < r1 ? rb + MV_ROWS : r1;
            for (int64_t t = 0; t < n; t++)
                mv_q_fast(w, x + t * w->cols, y + t * ldy + (rb - r0), rb, re);
        }
        return;
    }
    if (n < GB_MIN_N) mt_any(w, x, n, y, ldy, r0, r1);
    else gemm(w, x, n, y, ldy, r0, r1);
}

/* Every token as the one-token kernel gives it: 8-bit weights of mv_q's
 * kinds (q8_row_each), and dense rows (mt_rows, whose tokens' sums are
 * independent: two tokens a pass share a row's conversion). */
static int matmul_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    if (w->cols <= 0 || (w->qbits && (w->qbits != 8 || !mv_q_ok(w)))) return 0;
    if (n <= 0 || r1 <= r0) return 1;
    if (!w->qbits) {
        mt_any(w, x, n, y, ldy, r0, r1);
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
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s0);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 r = _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}

static void rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps, int add_one) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i < n; i += 8) {
        __m256 a = _mm256_maskload_ps(x + i, tail_mask(n - i));
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    float ss = hsum(_mm256_add_ps(s0, s1));
    const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    const __m256 one = _mm256_set1_ps(1.0f);
    for (i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv);
        if (w) {
            __m256 wv = _mm256_maskload_ps(w + i, m);
            v = _mm256_mul_ps(v, add_one ? _mm256_add_ps(one, wv) : wv);
        }
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* 2^n for integral n in [-75, 65] (valid exponent field). */
static inline __m256 pow2i(__m256i n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

/* e^x, Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial.
 * 2^n is applied in two halves so n may run from -150 to 129: the result
 * underflows through denormals to 0 and overflows to inf like expf. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(89.0f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(n1)), pow2i(_mm256_sub_epi32(ni, n1)));
}

/* 1 / (1 + e^-x); saturates cleanly to 0 and 1. */
static inline __m256 sigmoid256(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/* tanh: odd Taylor series to z^17 below |z| = 0.5 (error < 1e-8), else
 * 1 - 2/(e^2|z| + 1), which has no cancellation there and tends to 1. */
static inline __m256 tanh256(__m256 z) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, z);
    __m256 z2 = _mm256_mul_ps(z, z);
    __m256 p = _mm256_set1_ps(5.90027440946e-4f);
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-1.45583438705e-3f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(3.59212803657e-3f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-8.86323552990e-3f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(2.18694885362e-2f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-5.39682539683e-2f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(1.33333333333e-1f));
    p = _mm256_fmadd_ps(p, z2, _mm256_set1_ps(-3.33333333333e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(z, z2), p, z);
    __m256 e = exp256(_mm256_add_ps(a, a));
    __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    big = _mm256_or_ps(big, _mm256_and_ps(z, sign));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
}

static float sumexp(const float *x, int64_t n, float *mx_out) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx = ninf;
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m)));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float mxs = _mm_cvtss_f32(h);
    const __m256 mv = _mm256_set1_ps(mxs);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), mv));
        sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
    }
    *mx_out = mxs;
    return hsum(sum);
}

static void softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx = ninf;
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m));
        mx = _mm256_max_ps(mx, v);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const __m256 mv = _mm256_set1_ps(_mm_cvtss_f32(h));
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), mv));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
        sum = _mm256_add_ps(sum, e);
        _mm256_maskstore_ps(x + i, m, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(sum));
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv));
    }
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 gv = _mm256_maskload_ps(g + i, m);
        __m256 r = _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid256(gv)), _mm256_maskload_ps(u + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}

/* 0.5 v (1 + tanh z) == v * sigmoid(2z): same value, no cancellation. */
static void gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) {
    const __m256 k = _mm256_set1_ps(0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_maskload_ps(g + i, m);
        __m256 z = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, v), _mm256_mul_ps(v, v), v));
        __m256 r = _mm256_mul_ps(_mm256_mul_ps(v, sigmoid256(_mm256_add_ps(z, z))),
                                 _mm256_maskload_ps(u + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}

static void gelu_erf(float *x, int64_t n) {
    static const float P[11] = OSP_GELU_ERF_P;
    const __m256 cap = _mm256_set1_ps(14.1421356f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f),
                 one = _mm256_set1_ps(1.0f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = tail_mask(n - i);
        const __m256 v = _mm256_maskload_ps(x + i, m);
        /* |x| up to 10 sqrt 2 (min with the NaN second: a NaN stays NaN) */
        const __m256 a = _mm256_min_ps(cap, _mm256_and_ps(v, absm));
        const __m256 t = _mm256_div_ps(two, _mm256_add_ps(two, _mm256_mul_ps(a, _mm256_set1_ps(0.70710678118654752f))));
        __m256 p = _mm256_set1_ps(P[10]);
        for (int k = 9; k >= 0; k--) p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(P[k]));
        /* z^2 = x^2 / 2 = zz + lo exactly (z itself rounded would cost 3e-6 at z = 7), and e^(p - z^2) as
         * e^-zz e^(p - lo) (the sum p - zz would round at zz's scale) */
        const __m256 hi = _mm256_mul_ps(a, a), zz = _mm256_mul_ps(half, hi),
                     lo = _mm256_mul_ps(half, _mm256_fmsub_ps(a, a, hi));
        const __m256 e = _mm256_mul_ps(exp256(_mm256_sub_ps(_mm256_setzero_ps(), zz)), exp256(_mm256_sub_ps(p, lo)));
        const __m256 hc = _mm256_mul_ps(half, _mm256_mul_ps(t, e));
        const __m256 phi = _mm256_blendv_ps(hc, _mm256_sub_ps(one, hc), _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ));
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(v, phi));
    }
}

static void softcap(float *x, int64_t n, float cap) {
    const __m256 cv = _mm256_set1_ps(cap);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_div_ps(_mm256_maskload_ps(x + i, m), cv);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(cv, tanh256(v)));
    }
}

static const osp_ops OPS = {
    .name = "avx2", .matmul = matmul, .matmul_each = matmul_each, .dot = dot, .axpy = axpy, .rmsnorm = rmsnorm,
    .softmax = softmax, .sumexp = sumexp, .silu_mul = silu_mul, .gelu_tanh_mul = gelu_tanh_mul,
    .gelu_erf = gelu_erf, .softcap = softcap,
};

const osp_ops *osp_ops_avx2(void) { return &OPS; }
