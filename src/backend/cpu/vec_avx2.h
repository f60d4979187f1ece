/* backend/cpu/vec_avx2: the ISA's part of the vector layer that
 * ops_vec.h is written over (what differs beyond the width; ops_vec.h maps
 * the rest through V_MM), for
 * AVX2 + FMA + F16C: 8 f32 lanes, 16 registers, masks as vectors.
 *
 * AVX2 has no masked 16-bit loads, so partial vectors of f16/bf16 and
 * packed codes near the end of a row are assembled with scalar loads:
 * nothing reads past a row (a tensor may end at the end of the file).
 * Included by ops_avx2.c alone (compiled with -mavx2 -mfma -mf16c).
 */
#ifndef OSP_VEC_AVX2_H
#define OSP_VEC_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "backend/ops.h"

#define OSP_INLINE static inline __attribute__((always_inline))

#define V_LANES 8
#define V_ALIGN 32
#define V_REG "x"      /* asm constraint that names a vector register */
#define V_MT_T 2       /* mt_rows' tokens per pass (4 rows x 2 tokens fill 16 registers) */
#define V_Q8_T 4       /* tokens sharing one 8-bit row's conversion (q8_row_each) */
#define V_GB_RV 2      /* vectors of rows in a GEMM tile */
#define V_EXP_CHAINS 1 /* sumexp's accumulators */
#define V_OPS_NAME "avx2"
#define V_OPS_GET osp_ops_avx2

typedef __m256 vf;
typedef __m256d vd;
#define V_MM(name) _mm256_##name /* the intrinsic of that name at this width */
typedef __m256i vmask; /* a lane is in when its sign bit is set */

OSP_INLINE vf v_bcast(const float *p) { return _mm256_broadcast_ss(p); }
OSP_INLINE vf v_abs(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
OSP_INLINE vf v_round(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

OSP_INLINE float v_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

OSP_INLINE float v_hmax(vf v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 2^n for integral n in [-75, 65] (valid exponent field). */
OSP_INLINE __m256 v_pow2i(__m256i n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

/* p * 2^n for integral n in [-150, 129], in two halves so that each power is
 * a valid exponent: underflows through denormals to 0, overflows to inf. */
OSP_INLINE vf v_ldexp(vf p, vf n) {
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    return _mm256_mul_ps(_mm256_mul_ps(p, v_pow2i(n1)), v_pow2i(_mm256_sub_epi32(ni, n1)));
}

/* ----------------------------------------------------------------- masks */

static const int32_t V_MASK_TAB[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

/* Lanes [0, left) set; left is clamped to 8. */
OSP_INLINE vmask v_tail(int64_t left) {
    return _mm256_loadu_si256((const __m256i *)(V_MASK_TAB + 8 - (left < 8 ? left : 8)));
}

/* Lanes outside m are zero (loads: their memory is not touched). */
OSP_INLINE vf v_ld_m(const float *p, vmask m) { return _mm256_maskload_ps(p, m); }
OSP_INLINE void v_st_m(float *p, vmask m, vf a) { _mm256_maskstore_ps(p, m, a); }
OSP_INLINE vf v_keep(vf a, vmask m) { return _mm256_and_ps(a, _mm256_castsi256_ps(m)); }
/* lanes outside m are fill */
OSP_INLINE vf v_ld_m_or(vf fill, const float *p, vmask m) {
    return _mm256_blendv_ps(fill, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
OSP_INLINE vmask v_lt(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
OSP_INLINE vmask v_ge(vf a, vf b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }
/* b where m, else a */
OSP_INLINE vf v_blend(vmask m, vf a, vf b) { return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(m)); }

/* ---------------------------------------------------------- weight loads */

/* 8 elements from element i of a dense f32/f16/bf16 array (bf16 is the top
 * half of an f32: widen and shift). */
OSP_INLINE vf v_ld_w(const void *base, osp_dtype dt, int64_t i) {
    const unsigned char *b = base;
    if (dt == OSP_DT_BF16) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    if (dt == OSP_DT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i)));
    return _mm256_loadu_ps((const float *)(b + 4 * i));
}

/* The first min(left, 8) of those elements, the rest zero; touches only them. */
OSP_INLINE vf v_ld_w_n(const void *base, osp_dtype dt, int64_t i, int64_t left) {
    if (left >= 8) return v_ld_w(base, dt, i);
    float t[8] = {0};
    for (int64_t j = 0; j < left; j++) t[j] = osp_load_float(base, dt, i + j);
    return _mm256_loadu_ps(t);
}

/* 8 bytes from p, widened to f32. */
OSP_INLINE vf v_u8(const unsigned char *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* --------------------------------------------------------- packed codes */

typedef struct qunpack {
    int bits;
} qunpack;

static inline void qunpack_init(qunpack *u, int bits) { u->bits = bits; }

/* Codes c..c+7 (c % 8 == 0) of a packed row of rowb bytes, as floats.
 * The 8 codes are `bits` whole bytes; codes 0-3 sit in their first 32
 * bits and codes 4-7 in the 32 bits from bit 4*bits, so two dword windows
 * and per-lane shifts unpack any width 2..8. Near the row end the bytes
 * are gathered one by one, never past it. */
OSP_INLINE vf v_codes(const unsigned char *row, int64_t rowb, const qunpack *u, int64_t c) {
    const int bits = u->bits;
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

/* The last stage of ops_vec.h's v_transpose: u[e] and u[4+e] hold, in
 * 128-bit half b, column 4b+e of rows 0..3 and 4..7. */
OSP_INLINE void v_transpose_blocks(const vf u[8], vf r[8]) {
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

#endif
