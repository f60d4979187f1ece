/* backend/cpu/vec_avx512: the ISA's part of the vector layer that
 * ops_vec.h is written over (what differs beyond the width; ops_vec.h maps
 * the rest through V_MM), for
 * AVX-512 F/BW/VL/DQ: 16 f32 lanes, 32 registers, mask registers.
 *
 * Only f32 arithmetic (no BF16/VNNI/FP16 dot instructions). Every partial
 * load is masked and touches only its lanes' memory: the last row of a
 * tensor may end at the end of the mmapped file. Included by ops_avx512.c
 * alone (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
 */
#ifndef OSP_VEC_AVX512_H
#define OSP_VEC_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "backend/ops.h"

#define OSP_INLINE static inline __attribute__((always_inline))

#define V_LANES 16
#define V_ALIGN 64
#define V_REG "v"      /* asm constraint that names a vector register */
#define V_MT_T 4       /* mt_rows' tokens per pass */
#define V_Q8_T 8       /* tokens sharing one 8-bit row's conversion (q8_row_each) */
#define V_GB_RV 4      /* vectors of rows in a GEMM tile */
#define V_EXP_CHAINS 2 /* sumexp's accumulators */
#define V_OPS_NAME "avx512"
#define V_OPS_GET osp_ops_avx512

typedef __m512 vf;
typedef __m512d vd;
#define V_MM(name) _mm512_##name /* the intrinsic of that name at this width */
typedef __mmask16 vmask;

OSP_INLINE vf v_bcast(const float *p) { return _mm512_set1_ps(*p); }
OSP_INLINE vf v_abs(vf a) { return _mm512_abs_ps(a); }
OSP_INLINE vf v_round(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
OSP_INLINE float v_hsum(vf a) { return _mm512_reduce_add_ps(a); }
OSP_INLINE float v_hmax(vf a) { return _mm512_reduce_max_ps(a); }
/* p * 2^n (scalef gives inf / denormals / 0 at the ends like expf) */
OSP_INLINE vf v_ldexp(vf p, vf n) { return _mm512_scalef_ps(p, n); }

/* ----------------------------------------------------------------- masks */

/* Lanes [0, left) set; left is clamped to 16. */
OSP_INLINE vmask v_tail(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* Lanes outside m are zero (loads: their memory is not touched). */
OSP_INLINE vf v_ld_m(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
OSP_INLINE void v_st_m(float *p, vmask m, vf a) { _mm512_mask_storeu_ps(p, m, a); }
OSP_INLINE vf v_keep(vf a, vmask m) { return _mm512_maskz_mov_ps(m, a); }
/* lanes outside m are fill */
OSP_INLINE vf v_ld_m_or(vf fill, const float *p, vmask m) { return _mm512_mask_loadu_ps(fill, m, p); }
OSP_INLINE vmask v_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
OSP_INLINE vmask v_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
/* b where m, else a */
OSP_INLINE vf v_blend(vmask m, vf a, vf b) { return _mm512_mask_blend_ps(m, a, b); }

/* ---------------------------------------------------------- weight loads */

/* 16 elements from element i of a dense f32/f16/bf16 array (bf16 is the
 * top half of an f32: widen and shift); lanes outside m are zero and their
 * memory is not touched. With m all-ones the masked load costs the same as
 * a plain one. */
OSP_INLINE vf v_ld_wm(const void *base, osp_dtype dt, int64_t i, vmask m) {
    const unsigned char *b = base;
    if (dt == OSP_DT_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + 2 * i)), 16));
    if (dt == OSP_DT_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, b + 2 * i));
    return _mm512_maskz_loadu_ps(m, b + 4 * i);
}

OSP_INLINE vf v_ld_w(const void *base, osp_dtype dt, int64_t i) { return v_ld_wm(base, dt, i, 0xffff); }

/* The first min(left, 16) of those elements, the rest zero. */
OSP_INLINE vf v_ld_w_n(const void *base, osp_dtype dt, int64_t i, int64_t left) {
    return v_ld_wm(base, dt, i, v_tail(left));
}

/* 16 bytes from p, widened to f32. */
OSP_INLINE vf v_u8(const unsigned char *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
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

/* Codes c..c+15 of a packed row (c % 16 == 0) as floats; the masked load
 * never passes the row's end, whatever its length (rowb unused). */
OSP_INLINE vf v_codes(const unsigned char *row, int64_t rowb, const qunpack *u, int64_t c) {
    (void)rowb;
    __m128i b = _mm_maskz_loadu_epi8(u->bytes, row + c * u->bits / 8);
    __m512i v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(b), u->idx);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, u->shift), u->mask));
}

/* The last stage of ops_vec.h's v_transpose: a 4x4 transpose of 128-bit
 * blocks across u[e], u[4+e], u[8+e], u[12+e]. */
OSP_INLINE void v_transpose_blocks(const vf u[16], vf r[16]) {
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

#endif
