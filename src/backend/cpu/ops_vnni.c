/* AVX-512 VNNI tier of backend/q8act: activation quantization and the
 * matmul on repacked 4-bit weights. Compiled with -mavx512vnni; used only
 * when cpuid reports it. Both are bitwise their scalar twins in q8act.c:
 * the int32 block sums are exact, and the f32 operations per (row, token)
 * are the same ones in the same order.
 *
 * A tile of 16 rows meets A <= 8 tokens. Per block of 32 columns its codes
 * are loaded (4 x 64 bytes) and split into nibbles once, then each token
 * adds 8 vpdpbusd with a broadcast quad of its int8 activations into two
 * int32 chains (16 rows in the lanes), one cvt, one mul and one fma. */
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "backend/q8act.h"


void osp_q8act_prepare_avx512(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1) {
    const int64_t group = a->group, W = a->width, bpg = group / 32;
    float k = 0; /* k_g, accumulated over the group's blocks (as the scalar twin) */
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = g0 * bpg; b < g1 * bpg; b++) {
        __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        int32_t quads[8];
        _mm_storeu_si128((__m128i *)quads, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(quads + 4), _mm512_cvtepi32_epi8(q1));
        for (int i = 0; i < 8; i++) a->xq[(b * 8 + i) * W + slot] = quads[i];
        a->d[b * W + slot] = d;
        k = fmaf((float)(-8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))), d, k);
        if ((b + 1) % bpg == 0) a->kg[b / bpg * W + slot] = k, k = 0;
    }
    for (int64_t g = g0; g < g1; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t i = 0; i < group; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * group + i));
        float pl[16];
        _mm512_storeu_ps(pl, s);
        for (int h = 8; h >= 1; h /= 2)
            for (int l = 0; l < h; l++) pl[l] += pl[l + h];
        a->gsum[g * W + slot] = pl[0];
    }
}

static inline __m512 load_h16(const unsigned char *p, const int f16) {
    __m256i h = _mm256_load_si256((const __m256i *)p);
    if (f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define MAX_A 8

/* acc += u8 codes x the s8 quad at p broadcast to every lane. gcc does not
 * fold the broadcast into vpdpbusd's memory operand, and a separate
 * vpbroadcastd per vpdpbusd costs as much again. */
static inline __m512i dp_bcast(__m512i acc, __m512i codes, const int32_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(*p));
    return acc;
}
#ifndef PF_ONE
#define PF_ONE 2048
#endif
#ifndef PF_AHEAD
#define PF_AHEAD 8192
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif

/* One tile of 16 rows, tokens [0, A) of one panel. Fewer than 4 tokens
 * leave too little independent work to hide vpdpbusd's latency, so each
 * block's sum then runs as two chains. */
static inline __attribute__((always_inline)) void tile_kernel(const int A, const int f16, const unsigned char *tile,
                                                              int64_t ng, int64_t bpg, size_t seg,
                                                              const osp_q8act *p, float *y, int64_t ldy,
                                                              __mmask16 m) {
    __m512 acc[MAX_A], ga[MAX_A];
    _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) acc[a] = ga[a] = _mm512_setzero_ps();
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512 c8 = _mm512_set1_ps(8.0f);
    for (int64_t g = 0; g < ng; g++) {
        const unsigned char *sg = tile + g * seg;
        for (int64_t j = 0; j < bpg; j++) {
            const unsigned char *q = sg + 64 + j * 256;
            /* a block's 256 bytes fetched ahead: 8 KB with several tokens, 2 KB with one (docs/NOTES.md) */
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                _mm_prefetch((const char *)q + (A > 1 ? PF_AHEAD : PF_ONE) + 64 * i, PF_HINT);
            const int64_t blk = g * bpg + j;
            const int32_t *xq = p->xq + blk * 8 * A;
            const float *d = p->d + blk * A;
            if (A >= 4) { /* the tokens' chains side by side: A independent vpdpbusd a step (the
                           * int32 sums are exact, so the order changes nothing but speed: +3% at 8
                           * streams, +17% at 16 with 512 positions, measured alternating per step) */
                __m512i ia[MAX_A];
                _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) ia[a] = _mm512_setzero_si512();
                _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                    const __m512i v = _mm512_load_si512((const void *)(q + 64 * i));
                    const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                    _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) ia[a] = dp_bcast(ia[a], lo, &xq[(2 * i) * A + a]);
                    _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) ia[a] = dp_bcast(ia[a], hi, &xq[(2 * i + 1) * A + a]);
                }
                _Pragma("GCC unroll 8") for (int a = 0; a < A; a++)
                    ga[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[a]), _mm512_set1_ps(d[a]), ga[a]);
                continue;
            }
            __m512i lo[4], hi[4];
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                __m512i v = _mm512_load_si512((const void *)(q + 64 * i));
                lo[i] = _mm512_and_si512(v, nib);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            }
            _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) {
                __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
                if (A == 1) { /* four chains */
                    __m512i i2 = _mm512_setzero_si512(), i3 = _mm512_setzero_si512();
                    i0 = dp_bcast(i0, lo[0], &xq[0 * A + a]);
                    i1 = dp_bcast(i1, hi[0], &xq[1 * A + a]);
                    i2 = dp_bcast(i2, lo[1], &xq[2 * A + a]);
                    i3 = dp_bcast(i3, hi[1], &xq[3 * A + a]);
                    i0 = dp_bcast(i0, lo[2], &xq[4 * A + a]);
                    i1 = dp_bcast(i1, hi[2], &xq[5 * A + a]);
                    i2 = dp_bcast(i2, lo[3], &xq[6 * A + a]);
                    i3 = dp_bcast(i3, hi[3], &xq[7 * A + a]);
                    i0 = _mm512_add_epi32(_mm512_add_epi32(i0, i1), _mm512_add_epi32(i2, i3));
                } else if (A < 4) {
                    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                        i0 = dp_bcast(i0, lo[i], &xq[(2 * i) * A + a]);
                        i1 = dp_bcast(i1, hi[i], &xq[(2 * i + 1) * A + a]);
                    }
                    i0 = _mm512_add_epi32(i0, i1);
                } else {
                    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
                        i0 = dp_bcast(i0, lo[i], &xq[(2 * i) * A + a]);
                        i0 = dp_bcast(i0, hi[i], &xq[(2 * i + 1) * A + a]);
                    }
                }
                ga[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(d[a]), ga[a]);
            }
        }
        const __m512 s = load_h16(sg, f16), sb = _mm512_fmadd_ps(s, c8, load_h16(sg + 32, f16));
        const float *gs = p->gsum + g * A, *kg = p->kg + g * A;
        _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) {
            acc[a] = _mm512_fmadd_ps(_mm512_add_ps(ga[a], _mm512_set1_ps(kg[a])), s, acc[a]);
            acc[a] = _mm512_fmadd_ps(sb, _mm512_set1_ps(gs[a]), acc[a]);
            ga[a] = _mm512_setzero_ps();
        }
    }
    _Pragma("GCC unroll 8") for (int a = 0; a < A; a++) _mm512_mask_storeu_ps(y + a * ldy, m, acc[a]);
}

#define TILE(F, A)                                                                                                 \
    static void tile_##F##_##A(const unsigned char *tile, int64_t ng, int64_t bpg, size_t seg, const osp_q8act *acts, \
                               float *y, int64_t ldy, int64_t rows) {                                              \
        tile_kernel(A, F, tile, ng, bpg, seg, acts, y, ldy, (__mmask16)(rows >= 16 ? 0xffff : (1u << rows) - 1)); \
    }
#define TILES(F) TILE(F, 1) TILE(F, 2) TILE(F, 3) TILE(F, 4) TILE(F, 5) TILE(F, 6) TILE(F, 7) TILE(F, 8)
TILES(0)
TILES(1)
static const osp_q8act_tile_fn tiles[2][MAX_A + 1] = {
    {NULL, tile_0_1, tile_0_2, tile_0_3, tile_0_4, tile_0_5, tile_0_6, tile_0_7, tile_0_8},
    {NULL, tile_1_1, tile_1_2, tile_1_3, tile_1_4, tile_1_5, tile_1_6, tile_1_7, tile_1_8}};

void osp_q8act_matmul_vnni(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1) {
    osp_q8act_walk(w, acts, n, y, ldy, r0, r1, tiles);
}
