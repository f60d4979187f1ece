/* AVX-512 (F/BW/VL/DQ) kernels of kvq.h, tested against the scalar
 * reference in kvq.c (tests/test_kvq.c). f32 arithmetic only.
 *
 * Codes are centred, c' = c - C with C = 2^(bits-1), and the bias folded
 * to b' = b + C*s, so the products stay small and the code and bias terms
 * do not cancel: s*c + b = s*c' + b'.
 *
 * Codes become floats without a dequantized copy:
 *  - 8-bit: 16 codes a step, vpmovsxbd after flipping the top bit (c ^ 0x80
 *    read as int8 is c - 128), vcvtdq2ps.
 *  - 4-bit, scores, whole 128-code blocks: a 64-byte load holds codes
 *    8l..8l+7 in dword l (nibble k = code 8l+k); vpermps(v >> 4k, table)
 *    maps nibble k of all 16 lanes to its centred float (vpermps reads
 *    only the low 4 index bits). q is permuted once per call to match:
 *    position h + 16k + l of the block at h holds q[h + 8l + k].
 *  - 4-bit, elsewhere (wsum, and the last D % 128 values of scores): 32
 *    codes a step, one byte a lane (vpmovzxbd), low nibbles through the
 *    table as they are, high ones after a shift: position m + t of the
 *    chunk at m holds value m + 2t, position m + 16 + t value m + 2t + 1.
 *    In wsum the table holds the row's weighted values (q4_block).
 *
 * scores: rows go 16 at a time. Per row, one vector accumulates
 * s_g * sum(q*c') over the groups (a 128-code block's lanes carry their
 * own group's scale); the 16 row vectors are then summed across lanes
 * together by a transposing tree (reduce16) that treats every lane alike,
 * and the bias terms sum_g b'_g * sum_g(q), formed for the 16 rows at once
 * (bias_rows), are added. A row's score is thus the same operations on
 * the same data whatever n is and wherever the row sits (rows past n in
 * the last block are zeros, never read).
 *
 * wsum: sums go in three levels so rounding grows with 32 + n/256 terms,
 * not n: a block of 16 rows is summed in registers (from zero, rows in
 * order), blocks into superblock sums of 256 rows (stack), superblocks
 * into o. Registers hold up to 256 values of a block (passes over D).
 * Per row: 4-bit P += T[c], the row's table T[c] = (c-8)*(p*s) + p*b';
 * 8-bit P = fma(c', p*s, P), the block's sum_r p*b' added once after. The
 * order depends on n and on where the call starts only through these
 * fixed boundaries: rows split over calls at multiples of 256 give the
 * same bits as one call.
 *
 * Scales and biases of a 16-row block are converted once (prep_block) to
 * stack buffers: sb = s or p*s, bb = b' or p*b'. All loads of cache rows
 * are exact-sized or masked. Stack use: about 25 KB per call.
 *
 * 16-bit rows (bf16 values, no scales) take the same shapes without the
 * factoring: see scores16 and wsum16.
 */
#include <immintrin.h>
#include <stdint.h>
#include "backend/kvq.h"
#include "core/core.h"

#define KVQ_INLINE static inline __attribute__((always_inline))
#define BLK 16                       /* rows per block */
#define MAX_G (OSP_KVQ_MAX_D / 32)   /* groups per row */

/* Lanes [0, left) of 16 (none when left <= 0). */
static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
}

/* bf16 is the top half of an f32: widen and shift. */
KVQ_INLINE __m512 ld_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* ------------------------------------------------------------ layout */

/* x[D] into the 4-bit chunk order xp from value m0 on (module comment). */
static void q4_permute(const float *x, int m0, int D, float *xp) {
    for (int m = m0; m < D; m += 32)
        for (int t = 0; t < 16; t++) xp[m + t] = x[m + 2 * t], xp[m + 16 + t] = x[m + 2 * t + 1];
}

static void q4_unpermute(const float *xp, int D, float *x) {
    for (int m = 0; m < D; m += 32)
        for (int t = 0; t < 16; t++) x[m + 2 * t] = xp[m + t], x[m + 2 * t + 1] = xp[m + 16 + t];
}

/* Centred 4-bit codes as floats: nibble n -> n - 8. */
#define TAB16 _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)

/* 32 4-bit codes (16 bytes), one byte a lane: vpermps reads the low 4
 * bits of each index, so the low nibbles need no mask. */
KVQ_INLINE __m512i q4_32(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
KVQ_INLINE __m512 q4_lo(__m512i x, __m512 tab) { return _mm512_permutexvar_ps(x, tab); }
KVQ_INLINE __m512 q4_hi(__m512i x, __m512 tab) { return _mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), tab); }

/* Scores' 128-code blocks: values [0, D128) in nibble-major order. */
static void q4_permute_blocks(const float *x, int D128, float *xp) {
    for (int h = 0; h < D128; h += 128)
        for (int k = 0; k < 8; k++)
            for (int l = 0; l < 16; l++) xp[h + 16 * k + l] = x[h + 8 * l + k];
}

/* Nibble k of the 16 dwords of a 64-byte load, centred, as floats. */
KVQ_INLINE __m512 nib16(__m512i v, int k, __m512 tab) {
    return _mm512_permutexvar_ps(k ? _mm512_srli_epi32(v, 4 * k) : v, tab);
}

/* The scale of each lane of a 128-code block (lane l holds values 8l..8l+7)
 * from the block's first group's scale at v[0]. */
KVQ_INLINE __m512 lanes16(const float *v, const int GROUP) {
    if (GROUP == 128) return _mm512_set1_ps(v[0]);
    if (GROUP == 64)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                     _mm512_maskz_loadu_ps(0x3, v));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_maskz_loadu_ps(0xF, v));
}

/* 16 8-bit codes, centred (c ^ 0x80 read as int8 is c - 128), as floats. */
KVQ_INLINE __m512 q8_16(const uint8_t *p) {
    __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_set1_epi8((char)0x80));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}

/* ------------------------------------------------- scales and biases */

/* Rows j0..j0+nr-1: sb[r*G+g] = s, bb[r*G+g] = b + C*s, each times p[j0+r]
 * if p is given. Lane-wise the same operations on both paths, so a row's
 * values do not depend on its place in the block. */
static void prep_block(const uint16_t *scales, const uint16_t *biases, const float *p, int64_t j0,
                       int nr, int G, float C, float *sb, float *bb) {
    const __m512 cv = _mm512_set1_ps(C);
    if (G <= 16 && (G & (G - 1)) == 0) { /* 16/G rows per vector */
        const int total = nr * G;
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i lg = _mm512_set1_epi32(__builtin_ctz((unsigned)G));
        const __m512 pv = p ? _mm512_maskz_loadu_ps(tail_mask(nr), p + j0) : _mm512_setzero_ps();
        for (int c = 0; c < total; c += 16) {
            const __mmask16 m = tail_mask(total - c);
            __m512 s = ld_bf16(scales + j0 * G + c, m);
            __m512 b = _mm512_fmadd_ps(s, cv, ld_bf16(biases + j0 * G + c, m));
            if (p) {
                __m512i row = _mm512_srlv_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(c)), lg);
                __m512 pe = _mm512_permutexvar_ps(row, pv);
                s = _mm512_mul_ps(pe, s);
                b = _mm512_mul_ps(pe, b);
            }
            _mm512_storeu_ps(sb + c, s);
            _mm512_storeu_ps(bb + c, b);
        }
        return;
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < G; c += 16) {
            const __mmask16 m = tail_mask(G - c);
            const int64_t o = (j0 + r) * G + c;
            __m512 s = ld_bf16(scales + o, m);
            __m512 b = _mm512_fmadd_ps(s, cv, ld_bf16(biases + o, m));
            if (p) {
                __m512 pe = _mm512_set1_ps(p[j0 + r]);
                s = _mm512_mul_ps(pe, s);
                b = _mm512_mul_ps(pe, b);
            }
            _mm512_mask_storeu_ps(sb + r * G + c, m, s);
            _mm512_mask_storeu_ps(bb + r * G + c, m, b);
        }
}

/* ------------------------------------------------------------ scores */

/* out lane i = sum of the 16 lanes of v[i]; the tree is the same for
 * every i (and float addition commutes), so lanes never mix. */
KVQ_INLINE __m512 reduce16(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* lanes 0+2, 1+3 of each 4, two sources */
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* each 128-bit lane: 4 sources, 4-lane sums */
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
}

/* Bias terms of 16 rows: lane r = sum_g bb[r*G+g] * qsum[g] (0 for rows
 * past nr), summed pairwise (g0+g1)+(g2+g3)... by the same tree for every
 * row. */
static __m512 bias_rows(const float *bb, const float *qsum, int G, int nr) {
    if (G <= 16 && (G & (G - 1)) == 0) { /* 16/G rows per vector */
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        const __m512 qs = _mm512_permutexvar_ps(_mm512_and_si512(lane, _mm512_set1_epi32(G - 1)),
                                                _mm512_maskz_loadu_ps(tail_mask(G), qsum));
        __m512 v[16];
        for (int m = 0; m < G; m++)
            v[m] = _mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(nr * G - 16 * m), bb + 16 * m), qs);
        for (int len = G; len > 1; len /= 2)
            for (int m = 0; m < len / 2; m++)
                v[m] = _mm512_add_ps(_mm512_permutex2var_ps(v[2 * m], even, v[2 * m + 1]),
                                     _mm512_permutex2var_ps(v[2 * m], odd, v[2 * m + 1]));
        return v[0];
    }
    float t[16] = {0};
    for (int r = 0; r < nr; r++) {
        __m512 a = _mm512_setzero_ps();
        for (int g = 0; g < G; g += 16) {
            const __mmask16 m = tail_mask(G - g);
            a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bb + r * G + g), _mm512_maskz_loadu_ps(m, qsum + g),
                                a);
        }
        t[r] = _mm512_reduce_add_ps(a);
    }
    return _mm512_loadu_ps(t);
}

/* s * sum(q*c') of one row, as lanes to be summed. x is q, permuted for
 * 4-bit: 128-code blocks below D128, 32-code chunks from there. */
/* q's 16 values from offset o: from registers when the caller holds them
 * (xv), else from memory; the same values either way. */
#define LDX(o) (xv ? xv[(o) / 16] : _mm512_loadu_ps(x + (o)))

KVQ_INLINE __m512 row_score(const uint8_t *row, const float *x, const __m512 *xv, const float *sr, int G, int D128,
                            const int BITS, const int GROUP) {
    const __m512 tab = TAB16;
    __m512 acc = _mm512_setzero_ps();
    int g = 0;
    if (BITS == 4)
        for (int h = 0; h < D128; h += 128, g += 128 / GROUP) {
            const __m512i v = _mm512_loadu_si512(row + h / 2);
            __m512 a0 = _mm512_mul_ps(nib16(v, 0, tab), LDX(h));
            __m512 a1 = _mm512_mul_ps(nib16(v, 1, tab), LDX(h + 16));
            for (int k = 2; k < 8; k += 2) {
                a0 = _mm512_fmadd_ps(nib16(v, k, tab), LDX(h + 16 * k), a0);
                a1 = _mm512_fmadd_ps(nib16(v, k + 1, tab), LDX(h + 16 * k + 16), a1);
            }
            acc = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), lanes16(sr + g, GROUP), acc);
        }
    for (; g < G; g++) { /* per group, two chains */
        const uint8_t *c = row + g * GROUP * BITS / 8;
        const int xg = g * GROUP;
        __m512 a0, a1;
        if (BITS == 4) {
            __m512i v = q4_32(c);
            a0 = _mm512_mul_ps(q4_lo(v, tab), LDX(xg));
            a1 = _mm512_mul_ps(q4_hi(v, tab), LDX(xg + 16));
            for (int i = 32; i < GROUP; i += 32) {
                v = q4_32(c + i / 2);
                a0 = _mm512_fmadd_ps(q4_lo(v, tab), LDX(xg + i), a0);
                a1 = _mm512_fmadd_ps(q4_hi(v, tab), LDX(xg + i + 16), a1);
            }
        } else {
            a0 = _mm512_mul_ps(q8_16(c), LDX(xg));
            a1 = _mm512_mul_ps(q8_16(c + 16), LDX(xg + 16));
            for (int i = 32; i < GROUP; i += 32) {
                a0 = _mm512_fmadd_ps(q8_16(c + i), LDX(xg + i), a0);
                a1 = _mm512_fmadd_ps(q8_16(c + i + 16), LDX(xg + i + 16), a1);
            }
        }
        acc = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(sr[g]), acc);
    }
    return acc;
}

/* DD: head_dim known at compile time (64, 128; q then stays in registers),
 * or 0. */
KVQ_INLINE void scores_impl(const float *q, int D, const uint8_t *codes, const uint16_t *scales,
                            const uint16_t *biases, int64_t n, float *out, const int BITS,
                            const int GROUP, const int DD0) {
    const int DD = DD0 % GROUP == 0 ? DD0 : 0; /* a head_dim the group does not divide: not supported */
    if (DD) D = DD;
    const int G = D / GROUP;
    const int64_t rb = (int64_t)D * BITS / 8;
    float qp[OSP_KVQ_MAX_D] __attribute__((aligned(64)));
    float qsum[MAX_G], sb[BLK * MAX_G], bb[BLK * MAX_G];
    __m512 accv[BLK];
    const int D128 = BITS == 4 ? D / 128 * 128 : 0;
    if (BITS == 4) q4_permute_blocks(q, D128, qp), q4_permute(q, D128, D, qp);
    for (int g = 0; g < G; g++) { /* group sums of q, one fixed order */
        __m512 s = _mm512_loadu_ps(q + g * GROUP);
        for (int i = 16; i < GROUP; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(q + g * GROUP + i));
        qsum[g] = _mm512_reduce_add_ps(s);
    }
    const float *x = BITS == 4 ? qp : q;
    __m512 xr[DD ? DD / 16 : 1];
    for (int i = 0; i < DD / 16; i++) xr[i] = _mm512_loadu_ps(x + 16 * i);
    for (int64_t j0 = 0; j0 < n; j0 += BLK) {
        const int nr = n - j0 < BLK ? (int)(n - j0) : BLK;
        prep_block(scales, biases, NULL, j0, nr, G, (float)(1 << (BITS - 1)), sb, bb);
        for (int r = 0; r < nr; r++)
            accv[r] = row_score(codes + (j0 + r) * rb, x, DD ? xr : NULL, sb + r * G, G, D128, BITS, GROUP);
        for (int r = nr; r < BLK; r++) accv[r] = _mm512_setzero_ps();
        __m512 v = _mm512_add_ps(reduce16(accv), bias_rows(bb, qsum, G, nr));
        _mm512_mask_storeu_ps(out + j0, tail_mask(nr), v);
    }
}

/* -------------------------------------------------------------- wsum */

#define SUPER 256 /* rows per superblock */

/* A block's sums P (16 values a vector) into the superblock sums sa:
 * sa = P on its first block, else sa + P. */
KVQ_INLINE void flush(float *sa, const __m512 *P, int nv, int first) {
    for (int i = 0; i < nv; i++)
        _mm512_store_ps(sa + 16 * i, first ? P[i] : _mm512_add_ps(_mm512_load_ps(sa + 16 * i), P[i]));
}

/* 8-bit, values [o0, o0 + 16*NU), rows j0..j0+nr-1: P = sum_r c'*(p*s), in
 * row order, then the block's bias sums pbs[g] = sum_r p*b' once. */
KVQ_INLINE void q8_block(float *sa, int o0, const uint8_t *codes, int64_t rb, int64_t j0, int nr,
                         const float *sb, const float *pbs, int G, int first, const int NU,
                         const int GROUP) {
    __m512 P[16];
    for (int u = 0; u < NU; u++) P[u] = _mm512_setzero_ps();
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = codes + (j0 + r) * rb + o0;
        const float *w = sb + r * G + o0 / GROUP;
        for (int u = 0; u < NU; u++)
            P[u] = _mm512_fmadd_ps(q8_16(row + 16 * u), _mm512_set1_ps(w[16 * u / GROUP]), P[u]);
    }
    for (int u = 0; u < NU; u++) P[u] = _mm512_add_ps(P[u], _mm512_set1_ps(pbs[(o0 + 16 * u) / GROUP]));
    flush(sa + o0, P, NU, first);
}

/* 4-bit, NC 32-code chunks from o0 (permuted order). Per row and group a
 * 16-entry table T[c] = (c-8)*(p*s) + p*b', one fma, so 16 codes cost a
 * lookup and an add: P += T[c] in row order. */
KVQ_INLINE void q4_block(float *sa, int o0, const uint8_t *codes, int64_t rb, int64_t j0, int nr,
                         const float *sb, const float *bb, int G, int first, const int NC,
                         const int GROUP) {
    __m512 P[16];
    for (int i = 0; i < 2 * NC; i++) P[i] = _mm512_setzero_ps();
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = codes + (j0 + r) * rb + o0 / 2;
        const float *w = sb + r * G + o0 / GROUP, *pb = bb + r * G + o0 / GROUP;
        for (int m = 0; m < NC; m++) {
            const int g = 32 * m / GROUP;
            const __m512 tab = _mm512_fmadd_ps(TAB16, _mm512_set1_ps(w[g]), _mm512_set1_ps(pb[g]));
            const __m512i v = q4_32(row + 16 * m);
            P[2 * m] = _mm512_add_ps(P[2 * m], q4_lo(v, tab));
            P[2 * m + 1] = _mm512_add_ps(P[2 * m + 1], q4_hi(v, tab));
        }
    }
    flush(sa + o0, P, 2 * NC, first);
}

KVQ_INLINE void wsum_impl(float *o, const float *p, int64_t n, int D, const uint8_t *codes,
                          const uint16_t *scales, const uint16_t *biases, const int BITS,
                          const int GROUP) {
    const int G = D / GROUP;
    const int64_t rb = (int64_t)D * BITS / 8;
    float ob[OSP_KVQ_MAX_D] __attribute__((aligned(64))), sa[OSP_KVQ_MAX_D] __attribute__((aligned(64)));
    float sb[BLK * MAX_G], bb[BLK * MAX_G], pbs[MAX_G];
    if (n <= 0) return;
    if (BITS == 4) q4_permute(o, 0, D, ob);
    else for (int i = 0; i < D; i += 16) _mm512_store_ps(ob + i, _mm512_loadu_ps(o + i));
    for (int64_t j0 = 0; j0 < n; j0 += BLK) {
        const int nr = n - j0 < BLK ? (int)(n - j0) : BLK, first = j0 % SUPER == 0;
        prep_block(scales, biases, p, j0, nr, G, (float)(1 << (BITS - 1)), sb, bb);
        if (BITS == 8) /* bias sums of the block, rows in order */
            for (int c = 0; c < G; c += 16) {
                const __mmask16 m = tail_mask(G - c);
                __m512 v = _mm512_maskz_loadu_ps(m, bb + c);
                for (int r = 1; r < nr; r++) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bb + r * G + c));
                _mm512_mask_storeu_ps(pbs + c, m, v);
            }
        /* passes of 256 values (16 registers), then 128, 64, 32 */
        for (int h = 0; h < D;) {
            const int w = D - h >= 256 ? 256 : D - h >= 128 ? 128 : D - h >= 64 ? 64 : 32;
#define PASS(NV)                                                                      \
    (BITS == 8 ? q8_block(sa, h, codes, rb, j0, nr, sb, pbs, G, first, NV, GROUP)      \
               : q4_block(sa, h, codes, rb, j0, nr, sb, bb, G, first, NV / 2, GROUP))
            switch (w) {
            case 256: PASS(16); break;
            case 128: PASS(8); break;
            case 64: PASS(4); break;
            default: PASS(2); break;
            }
#undef PASS
            h += w;
        }
        if ((j0 + nr) % SUPER == 0 || j0 + nr == n) /* superblock done: into o */
            for (int i = 0; i < D; i += 16)
                _mm512_store_ps(ob + i, _mm512_add_ps(_mm512_load_ps(ob + i), _mm512_load_ps(sa + i)));
    }
    if (BITS == 4) q4_unpermute(ob, D, o);
    else for (int i = 0; i < D; i += 16) _mm512_storeu_ps(o + i, _mm512_load_ps(ob + i));
}

/* ----------------------------------------------------- 16-bit (bf16) */

/* The same structure on bf16 rows (D % 16 == 0): scores per row in two
 * chains over 16-value steps, 16 rows reduced by reduce16; wsum in blocks
 * of 16 rows (P = fma(p_r, V_r, P), rows in order from zero), superblocks
 * of 256, then into o. */
KVQ_INLINE __m512 ld_row16(const uint8_t *row, int i) {
    return ld_bf16((const uint16_t *)(const void *)row + i, 0xFFFF);
}

/* One row's two chains over D values; qv: q as D/16 vectors. */
KVQ_INLINE __m512 row16(const uint8_t *row, const __m512 *qv, const int D) {
    __m512 a0 = _mm512_mul_ps(ld_row16(row, 0), qv[0]), a1 = _mm512_setzero_ps();
    int i = 16;
    for (; i + 32 <= D; i += 32) {
        a1 = _mm512_fmadd_ps(ld_row16(row, i), qv[i / 16], a1);
        a0 = _mm512_fmadd_ps(ld_row16(row, i + 16), qv[i / 16 + 1], a0);
    }
    if (i < D) a1 = _mm512_fmadd_ps(ld_row16(row, i), qv[i / 16], a1);
    return _mm512_add_ps(a0, a1);
}

/* q in registers when it fits (D up to 256: the common head sizes), read
 * from memory beyond; the same operations either way. */
KVQ_INLINE void scores16_d(const float *q, const int D, const uint8_t *codes, int64_t n, float *out) {
    const int64_t rb = 2 * (int64_t)D;
    __m512 qv[OSP_KVQ_MAX_D / 16], accv[BLK];
    for (int i = 0; i < D / 16; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
    for (int64_t j0 = 0; j0 < n; j0 += BLK) {
        const int nr = n - j0 < BLK ? (int)(n - j0) : BLK;
        for (int r = 0; r < nr; r++) accv[r] = row16(codes + (j0 + r) * rb, qv, D);
        for (int r = nr; r < BLK; r++) accv[r] = _mm512_setzero_ps();
        _mm512_mask_storeu_ps(out + j0, tail_mask(nr), reduce16(accv));
    }
}

/* Specialized for the common head sizes: +15-23% decode at 3K positions with
 * a bf16 cache (measured alternating per step), bitwise the same. */
static void scores16(const float *q, int D, const uint8_t *codes, int64_t n, float *out) {
    switch (D) {
    case 64: scores16_d(q, 64, codes, n, out); break;
    case 128: scores16_d(q, 128, codes, n, out); break;
    case 256: scores16_d(q, 256, codes, n, out); break;
    default: scores16_d(q, D, codes, n, out); break;
    }
}

/* Values [o0, o0 + 16*NU) of rows j0..j0+nr-1 into the superblock sums. */
KVQ_INLINE void b16_block(float *sa, int o0, const uint8_t *codes, int64_t rb, int64_t j0, int nr,
                          const float *p, int first, const int NU) {
    __m512 P[16];
    for (int u = 0; u < NU; u++) P[u] = _mm512_setzero_ps();
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = codes + (j0 + r) * rb;
        const __m512 pv = _mm512_set1_ps(p[j0 + r]);
        for (int u = 0; u < NU; u++) P[u] = _mm512_fmadd_ps(ld_row16(row, o0 + 16 * u), pv, P[u]);
    }
    flush(sa + o0, P, NU, first);
}

static void wsum16(float *o, const float *p, int64_t n, int D, const uint8_t *codes) {
    const int64_t rb = 2 * (int64_t)D;
    float sa[OSP_KVQ_MAX_D] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += BLK) {
        const int nr = n - j0 < BLK ? (int)(n - j0) : BLK, first = j0 % SUPER == 0;
        for (int h = 0; h < D;) { /* passes of 256 values (16 registers), then 128, 64, 32, 16 */
            const int w = D - h >= 256 ? 256 : D - h >= 128 ? 128 : D - h >= 64 ? 64 : D - h >= 32 ? 32 : 16;
            switch (w) {
            case 256: b16_block(sa, h, codes, rb, j0, nr, p, first, 16); break;
            case 128: b16_block(sa, h, codes, rb, j0, nr, p, first, 8); break;
            case 64: b16_block(sa, h, codes, rb, j0, nr, p, first, 4); break;
            case 32: b16_block(sa, h, codes, rb, j0, nr, p, first, 2); break;
            default: b16_block(sa, h, codes, rb, j0, nr, p, first, 1); break;
            }
            h += w;
        }
        if ((j0 + nr) % SUPER == 0 || j0 + nr == n) /* superblock done: into o */
            for (int i = 0; i < D; i += 16)
                _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(o + i), _mm512_load_ps(sa + i)));
    }
}

/* ------------------------------------------------------------ tables */

#define KVQ_CASES(F, ...)                                                         \
    switch (bits * 1000 + group) {                                                \
    case 4032: F(__VA_ARGS__, 4, 32); break;                                      \
    case 4064: F(__VA_ARGS__, 4, 64); break;                                      \
    case 4128: F(__VA_ARGS__, 4, 128); break;                                     \
    case 8032: F(__VA_ARGS__, 8, 32); break;                                      \
    case 8064: F(__VA_ARGS__, 8, 64); break;                                      \
    default: F(__VA_ARGS__, 8, 128); break;                                       \
    }

#define SCORES_D0(...) scores_impl(__VA_ARGS__, 0)
#define SCORES_D128(...) scores_impl(__VA_ARGS__, 128)

static void scores_avx512(const float *q, int D, int bits, int group, const uint8_t *codes,
                          const uint16_t *scales, const uint16_t *biases, int64_t n, float *out) {
    OSP_ASSERT(osp_kvq_supported(D, bits, group));
    if (bits == 16) {
        scores16(q, D, codes, n, out);
        return;
    }
    /* q in registers for the common head sizes: decode at 3K positions +7-16%
     * (measured alternating per step), bitwise the same */
    if (D == 128) KVQ_CASES(SCORES_D128, q, D, codes, scales, biases, n, out)
    else if (D == 64) switch (bits * 1000 + group) { /* group 128 cannot divide 64 */
        case 4032: scores_impl(q, D, codes, scales, biases, n, out, 4, 32, 64); break;
        case 4064: scores_impl(q, D, codes, scales, biases, n, out, 4, 64, 64); break;
        case 8032: scores_impl(q, D, codes, scales, biases, n, out, 8, 32, 64); break;
        default: scores_impl(q, D, codes, scales, biases, n, out, 8, 64, 64); break;
        }
    else KVQ_CASES(SCORES_D0, q, D, codes, scales, biases, n, out)
}

static void wsum_avx512(float *o, const float *p, int64_t n, int D, int bits, int group,
                        const uint8_t *codes, const uint16_t *scales, const uint16_t *biases) {
    OSP_ASSERT(osp_kvq_supported(D, bits, group));
    if (bits == 16) {
        wsum16(o, p, n, D, codes);
        return;
    }
    KVQ_CASES(wsum_impl, o, p, n, D, codes, scales, biases)
}

static const osp_kvq_ops AVX512 = {"avx512", scores_avx512, wsum_avx512};

const osp_kvq_ops *osp_kvq_avx512_table(void) { return &AVX512; }
