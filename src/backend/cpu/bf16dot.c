/* backend/cpu/bf16dot: the bf16 production path on AVX512-BF16's VDPBF16PS
 * (the DOT engine of bf16t.h, for CPUs without AMX), its packing, and the
 * AVX-512 dequantization of 8-bit rows both engines use (compiled with
 * -mavx512bf16; called only where osp_bf16t_has says the CPU has it).
 *
 * An output (row, token) is one vector of 16 lane sums over the row's
 * 32-column steps, then the lanes' tree: the same operations whatever block
 * it is computed in, so the kernel's blocking (4 rows x 6 tokens, the
 * weights' rows in panels that stay in L2 while every token reads them,
 * long rows in passes with the sums held between them) is free to change
 * without changing a bit. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "backend/cpu/bf16t.h"
#include "backend/q8act.h"

int osp_bf16t_dot_built(void) { return 1; }

/* the lanes' tree: (l, l + 8), then + 4, + 2, + 1 (bf16t.h) */
static inline float tree16(__m512 a) {
    const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    const __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

#define DOT_R 4 /* rows a block */
#define DOT_N 6 /* tokens a block: 24 sums, 4 weight vectors and one activation in registers */
#define DOT_KC 2048     /* long rows: columns a pass (the block's 6 tokens of it stay in L1) */
#define DOT_TS 48       /* long rows: tokens whose sums are held between passes (a verification pass of 8
                         * speculating rows fits: with 24, a 32-40-token pass read a 65,536-column weight twice) */
#define DOT_PROW 64     /* long rows: rows a panel */

/* R rows from W (stride K) by N tokens from X (stride K), columns [c0, c1):
 * the sums start at zero (first) or from sp, and end in y[t * ldy + r]
 * through the tree (last) or back in sp (a sum's operations are the same
 * whether or not it is held between passes) */
static inline __attribute__((always_inline)) void blk(const uint16_t *W, const uint16_t *X, int64_t K, int64_t c0,
                                                      int64_t c1, int R, int N, __m512 *sp, int first, int last,
                                                      float *y, int64_t ldy) {
    __m512 acc[DOT_R][DOT_N];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) acc[r][t] = first ? _mm512_setzero_ps() : sp[r * DOT_N + t];
    for (int64_t c = c0; c < c1; c += OSP_BF16T_COLS) {
        __m512bh w[DOT_R];
        for (int r = 0; r < R; r++) w[r] = (__m512bh)_mm512_loadu_si512(W + r * K + c);
        for (int t = 0; t < N; t++) {
            const __m512bh x = (__m512bh)_mm512_loadu_si512(X + t * K + c);
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[r], x);
        }
    }
    if (last) {
        for (int t = 0; t < N; t++)
            for (int r = 0; r < R; r++) y[t * ldy + r] = tree16(acc[r][t]);
    } else
        for (int r = 0; r < R; r++)
            for (int t = 0; t < N; t++) sp[r * DOT_N + t] = acc[r][t];
}

typedef void (*blk_fn)(const uint16_t *, const uint16_t *, int64_t, int64_t, int64_t, __m512 *, int, int, float *,
                       int64_t);
#define BLK(R, N)                                                                                                 \
    static void blk_##R##_##N(const uint16_t *W, const uint16_t *X, int64_t K, int64_t c0, int64_t c1, __m512 *sp, \
                              int first, int last, float *y, int64_t ldy) {                                       \
        blk(W, X, K, c0, c1, R, N, sp, first, last, y, ldy);                                                      \
    }
BLK(4, 1) BLK(4, 2) BLK(4, 3) BLK(4, 4) BLK(4, 5) BLK(4, 6)
BLK(1, 1) BLK(1, 2) BLK(1, 3) BLK(1, 4) BLK(1, 5) BLK(1, 6)
static const blk_fn BLK4[DOT_N + 1] = {NULL, blk_4_1, blk_4_2, blk_4_3, blk_4_4, blk_4_5, blk_4_6};
static const blk_fn BLK1[DOT_N + 1] = {NULL, blk_1_1, blk_1_2, blk_1_3, blk_1_4, blk_1_5, blk_1_6};

/* rows [p0, p1) x tokens [s0, s1), columns [c0, c1) */
static void run(const uint16_t *W, const uint16_t *xp, int64_t K, int64_t p0, int64_t p1, int64_t s0, int64_t s1,
                int64_t c0, int64_t c1, __m512 *sp, float *y, int64_t ldy, int64_t r0) {
    const int first = c0 == 0, last = c1 == K;
    /* token blocks of sizes within one of each other (8 tokens: 4 + 4, not 6 + 2) */
    const int64_t nb = (s1 - s0 + DOT_N - 1) / DOT_N;
    for (int64_t i = 0; i < nb; i++) {
        const int64_t t0 = s0 + i * (s1 - s0) / nb;
        const int N = (int)(s0 + (i + 1) * (s1 - s0) / nb - t0);
        const uint16_t *X = xp + t0 * K;
        float *yt = y + t0 * ldy - r0;
        __m512 *st = sp ? sp + i * DOT_PROW * DOT_N : NULL;
        int64_t r = p0;
        for (; r + DOT_R <= p1; r += DOT_R)
            BLK4[N](W + r * K, X, K, c0, c1, st ? st + (r - p0) * DOT_N : NULL, first, last, yt + r, ldy);
        for (; r < p1; r++) BLK1[N](W + r * K, X, K, c0, c1, st ? st + (r - p0) * DOT_N : NULL, first, last, yt + r, ldy);
    }
}

void osp_bf16t_dot_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0,
                      int64_t r1) {
    const int64_t K = w->cols;
    const uint16_t *W = w->data;
    if (K <= DOT_KC || n < 2 * DOT_N) {
        /* a panel of rows (about 256 KB) stays in L2 while every token block reads it */
        int64_t prow = (256 << 10) / (K * (int64_t)sizeof(uint16_t));
        prow = prow < DOT_R ? DOT_R : prow / DOT_R * DOT_R;
        for (int64_t p0 = r0; p0 < r1; p0 += prow)
            run(W, xp, K, p0, p0 + prow < r1 ? p0 + prow : r1, 0, n, 0, K, NULL, y, ldy, r0);
        return;
    }
    /* long rows, many tokens: passes of DOT_KC columns, so a token block's activations stay in L1 while a
     * panel's rows stream from L2; the sums of DOT_TS tokens x a panel are held here between passes
     * (measured on Zen 5, one core, 2048 x 8192 by 512 tokens: 0.67 -> 0.79-0.83 of VDPBF16PS's peak; 256 x
     * 65,536 by 16-40 tokens: 0.36-0.45 -> 0.45-0.59). 192 KB of stack. */
    __m512 sp[DOT_TS / DOT_N * DOT_PROW * DOT_N] __attribute__((aligned(64)));
    for (int64_t p0 = r0; p0 < r1; p0 += DOT_PROW) {
        const int64_t p1 = p0 + DOT_PROW < r1 ? p0 + DOT_PROW : r1;
        for (int64_t s0 = 0; s0 < n; s0 += DOT_TS) {
            const int64_t s1 = s0 + DOT_TS < n ? s0 + DOT_TS : n;
            for (int64_t c0 = 0; c0 < K; c0 += DOT_KC)
                run(W, xp, K, p0, p1, s0, s1, c0, c0 + DOT_KC < K ? c0 + DOT_KC : K, sp, y, ldy, r0);
        }
    }
}

void osp_bf16t_dot_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = j0; j < j1; j++) {
            const float *r = x + t * cols + j * OSP_BF16T_COLS;
            _mm512_storeu_si512(xp + t * cols + j * OSP_BF16T_COLS,
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r + 16), _mm512_loadu_ps(r)));
        }
}

/* VDPBF16PS's definition for one lane: the odd pair's product added, then the even one's, each sum rounded
 * to nearest even, denormal inputs and results flushed (bf16t.c's twin does the same over whole rows) */
static float flush(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&f, &u, 4);
    return f;
}

static float widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return flush(f);
}

static int probe(void) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int it = 0; it < 256; it++) {
        uint16_t a[32], b[32];
        float acc[16], out[16];
        for (int i = 0; i < 32; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            /* magnitudes from 2^-9 to 2^6, both signs, now and then a denormal */
            a[i] = (uint16_t)((s & 0x8000) | (0x3b00 + (s >> 16) % 0x780));
            b[i] = (uint16_t)(((s >> 32) & 0x8000) | (0x3b00 + (s >> 40) % 0x780));
            if ((s >> 60) == 0) b[i] = (uint16_t)(s >> 48 & 0x807f);
        }
        for (int l = 0; l < 16; l++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            acc[l] = ((float)(int32_t)(s >> 40) - 8388608.0f) * (l & 1 ? 1e-6f : 1e-3f);
        }
        _mm512_storeu_ps(out, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a),
                                               (__m512bh)_mm512_loadu_si512(b)));
        for (int l = 0; l < 16; l++) {
            float r = flush(flush(acc[l]) + widen(a[2 * l + 1]) * widen(b[2 * l + 1]));
            r = flush(r + widen(a[2 * l]) * widen(b[2 * l]));
            if (memcmp(&r, &out[l], 4)) return 0;
        }
    }
    return 1;
}

int osp_bf16t_dot_exact(void) {
    static int exact = -1;
    if (exact < 0) exact = probe();
    return exact;
}

/* row r's codes, s * c + b as one fma per weight, rounded to bf16 (cvtne2ps2bf16: round to nearest even) */
void osp_q8t_row_fast(const osp_weight *w, int64_t r, uint16_t *out) {
    const uint8_t *codes = (const uint8_t *)w->data + r * w->cols;
    const int64_t G = w->group, ng = w->cols / G;
    for (int64_t g = 0; g < ng; g++) {
        const __m512 s = _mm512_set1_ps(osp_load_float(w->scales, w->sdtype, r * ng + g)),
                     b = _mm512_set1_ps(osp_load_float(w->biases, w->sdtype, r * ng + g));
        for (int64_t k = 0; k < G; k += 32) {
            const uint8_t *c = codes + g * G + k;
            __m512 lo = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c))), b);
            __m512 hi =
                _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c + 16)))), b);
            _mm512_storeu_si512(out + g * G + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* The repacked 4-bit tile (q8act.h) to bf16 rows: a block's 4 vectors (one dword of 8 codes per row and
 * vector) transposed 4 x 4 in each 128-bit lane so that a lane holds one row's 32 codes, the nibbles split
 * and interleaved back to column order; then each code looks its value up in the row's table of the group's
 * 16 values (s * c + b for c = 0..15, computed as the twin computes it). */
void osp_q4t_tile_fast(const osp_weight *w, int64_t tile, uint16_t *out, int64_t ld) {
    const int64_t G = w->group, ng = w->cols / G, bpg = G / 32;
    const size_t seg = 64 + (size_t)G * 8;
    const unsigned char *tp = (const unsigned char *)w->packed + (size_t)tile * (size_t)ng * seg;
    const int f16 = w->sdtype == OSP_DT_F16;
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    /* a row's 32 codes (lane i of a, then of c) as one 256-bit half: rows 4 i + k of lanes 0, 1 in x, 2, 3 in y */
    const __m512i pick_x = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), pick_y = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m256i tab[16];
    for (int64_t g = 0; g < ng; g++) {
        const unsigned char *sg = tp + (size_t)g * seg;
        float s[16], b[16];
        const __m256i hs = _mm256_loadu_si256((const __m256i *)sg), hb = _mm256_loadu_si256((const __m256i *)(sg + 32));
        if (f16) {
            _mm512_storeu_ps(s, _mm512_cvtph_ps(hs));
            _mm512_storeu_ps(b, _mm512_cvtph_ps(hb));
        } else {
            _mm512_storeu_si512(s, _mm512_slli_epi32(_mm512_cvtepu16_epi32(hs), 16));
            _mm512_storeu_si512(b, _mm512_slli_epi32(_mm512_cvtepu16_epi32(hb), 16));
        }
        for (int l = 0; l < 16; l++)
            tab[l] = (__m256i)_mm512_cvtneps_pbh(_mm512_fmadd_ps(_mm512_set1_ps(s[l]), codes, _mm512_set1_ps(b[l])));
        for (int64_t j = 0; j < bpg; j++) {
            const unsigned char *q = sg + 64 + j * 256;
            const __m512i v0 = _mm512_loadu_si512(q), v1 = _mm512_loadu_si512(q + 64), v2 = _mm512_loadu_si512(q + 128),
                          v3 = _mm512_loadu_si512(q + 192);
            const __m512i t0 = _mm512_unpacklo_epi32(v0, v1), t1 = _mm512_unpackhi_epi32(v0, v1),
                          t2 = _mm512_unpacklo_epi32(v2, v3), t3 = _mm512_unpackhi_epi32(v2, v3);
            /* rr[k], lane i: row 4 i + k's dwords of vectors 0..3 */
            const __m512i rr[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                                   _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
            for (int k = 0; k < 4; k++) {
                const __m512i lo = _mm512_and_si512(rr[k], nib), hi = _mm512_and_si512(_mm512_srli_epi16(rr[k], 4), nib);
                /* lane i: the row's codes 0..15 (a) and 16..31 (c) as bytes in column order */
                const __m512i a = _mm512_unpacklo_epi32(lo, hi), c = _mm512_unpackhi_epi32(lo, hi);
                const __m512i x = _mm512_permutex2var_epi64(a, pick_x, c), y = _mm512_permutex2var_epi64(a, pick_y, c);
                const __m256i h[4] = {_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1),
                                      _mm512_castsi512_si256(y), _mm512_extracti64x4_epi64(y, 1)};
                for (int i = 0; i < 4; i++) {
                    const int l = 4 * i + k;
                    const __m512i v = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(h[i]), _mm512_castsi256_si512(tab[l]));
                    _mm512_storeu_si512(out + l * ld + g * G + j * 32, v);
                }
            }
        }
    }
}
