/* AVX2 tier of backend/q8act: the matmul on repacked 4-bit weights for CPUs
 * without AVX-512 VNNI. Compiled with -mavx2 -mfma -mf16c; used only when
 * cpuid reports AVX2 and not the VNNI tier. Bitwise its scalar twin
 * (osp_q8act_matmul_ref) and so the VNNI kernel: a block's int32 sums are
 * the same exact integers, made here by vpmaddubsw (u8 codes x s8
 * activations, pairs added into s16: at most 2 x 15 x 128, no saturation)
 * and vpmaddwd by ones (pairs of those into int32), and the f32 steps per
 * (row, token) are the reference's, in its order.
 *
 * A tile's 64-byte vector holds 16 rows' 4-byte lanes: rows 0-7 in its
 * first 32 bytes, rows 8-15 in its second, each half one ymm. */
#include <immintrin.h>
#include <string.h>
#include "backend/q8act.h"

#define MAX_A 8

static inline __m256 load_h8(const unsigned char *p, const int f16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 rows' 4-product sums of the u8 codes with the s8 quad broadcast to every lane */
static inline __m256i dot4(__m256i codes, int32_t quad, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, _mm256_set1_epi32(quad)), ones);
}

/* One tile of 16 rows (two halves of 8), tokens [0, A) of one panel. */
static inline __attribute__((always_inline)) void tile_kernel(const int A, const int f16, const unsigned char *tile,
                                                              int64_t ng, int64_t bpg, size_t seg,
                                                              const osp_q8act *p, float *y, int64_t ldy,
                                                              int64_t rows) {
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256 c8 = _mm256_set1_ps(8.0f);
    for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
        __m256 acc[MAX_A], ga[MAX_A];
        for (int a = 0; a < A; a++) acc[a] = ga[a] = _mm256_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const unsigned char *sg = tile + g * seg;
            for (int64_t j = 0; j < bpg; j++) {
                const unsigned char *q = sg + 64 + j * 256 + 32 * h;
                _mm_prefetch((const char *)q + 2048, _MM_HINT_T0);
                _mm_prefetch((const char *)q + 2048 + 128, _MM_HINT_T0);
                const int64_t blk = g * bpg + j;
                const int32_t *xq = p->xq + blk * 8 * A;
                const float *d = p->d + blk * A;
                __m256i lo[4], hi[4];
                for (int i = 0; i < 4; i++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * i));
                    lo[i] = _mm256_and_si256(v, nib);
                    hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                }
                for (int a = 0; a < A; a++) {
                    __m256i s0 = dot4(lo[0], xq[0 * A + a], ones), s1 = dot4(hi[0], xq[1 * A + a], ones);
                    for (int i = 1; i < 4; i++) {
                        s0 = _mm256_add_epi32(s0, dot4(lo[i], xq[(2 * i) * A + a], ones));
                        s1 = _mm256_add_epi32(s1, dot4(hi[i], xq[(2 * i + 1) * A + a], ones));
                    }
                    ga[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), _mm256_set1_ps(d[a]), ga[a]);
                }
            }
            const __m256 s = load_h8(sg + 16 * h, f16), sb = _mm256_fmadd_ps(s, c8, load_h8(sg + 32 + 16 * h, f16));
            const float *gs = p->gsum + g * A, *kg = p->kg + g * A;
            for (int a = 0; a < A; a++) {
                acc[a] = _mm256_fmadd_ps(_mm256_add_ps(ga[a], _mm256_set1_ps(kg[a])), s, acc[a]);
                acc[a] = _mm256_fmadd_ps(sb, _mm256_set1_ps(gs[a]), acc[a]);
                ga[a] = _mm256_setzero_ps();
            }
        }
        const int64_t left = rows - 8 * h;
        if (left <= 0) break;
        for (int a = 0; a < A; a++) {
            if (left >= 8) {
                _mm256_storeu_ps(y + a * ldy + 8 * h, acc[a]);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, acc[a]);
                memcpy(y + a * ldy + 8 * h, tmp, sizeof(float) * (size_t)left);
            }
        }
    }
}

/* One token: both halves at once, four independent chains a block (the
 * halves one after the other left too little work in flight). The same
 * integers and f32 steps as tile_kernel. */
static void tile_one(const int f16, const unsigned char *tile, int64_t ng, int64_t bpg, size_t seg,
                     const osp_q8act *p, float *y, int64_t rows) {
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256 c8 = _mm256_set1_ps(8.0f);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, ga[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < ng; g++) {
        const unsigned char *sg = tile + g * seg;
        for (int64_t j = 0; j < bpg; j++) {
            const unsigned char *q = sg + 64 + j * 256;
            _mm_prefetch((const char *)q + 2048, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 2048 + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 2048 + 128, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 2048 + 192, _MM_HINT_T0);
            const int64_t blk = g * bpg + j;
            const int32_t *xq = p->xq + blk * 8;
            __m256i s[2][2];
            for (int h = 0; h < 2; h++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * h));
                s[h][0] = dot4(_mm256_and_si256(v, nib), xq[0], ones);
                s[h][1] = dot4(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), xq[1], ones);
            }
            for (int i = 1; i < 4; i++)
                for (int h = 0; h < 2; h++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * i + 32 * h));
                    s[h][0] = _mm256_add_epi32(s[h][0], dot4(_mm256_and_si256(v, nib), xq[2 * i], ones));
                    s[h][1] = _mm256_add_epi32(s[h][1], dot4(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), xq[2 * i + 1], ones));
                }
            const __m256 d = _mm256_set1_ps(p->d[blk]);
            for (int h = 0; h < 2; h++)
                ga[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s[h][0], s[h][1])), d, ga[h]);
        }
        for (int h = 0; h < 2; h++) {
            const __m256 sc = load_h8(sg + 16 * h, f16), sb = _mm256_fmadd_ps(sc, c8, load_h8(sg + 32 + 16 * h, f16));
            acc[h] = _mm256_fmadd_ps(_mm256_add_ps(ga[h], _mm256_set1_ps(p->kg[g])), sc, acc[h]);
            acc[h] = _mm256_fmadd_ps(sb, _mm256_set1_ps(p->gsum[g]), acc[h]);
            ga[h] = _mm256_setzero_ps();
        }
    }
    float out[16];
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
    memcpy(y, out, sizeof(float) * (size_t)(rows < 16 ? rows : 16));
}

#define TILE(F, A)                                                                                                 \
    static void tile_##F##_##A(const unsigned char *tile, int64_t ng, int64_t bpg, size_t seg, const osp_q8act *acts, \
                               float *y, int64_t ldy, int64_t rows) {                                              \
        if (A == 1) tile_one(F, tile, ng, bpg, seg, acts, y, rows);                                                \
        else tile_kernel(A, F, tile, ng, bpg, seg, acts, y, ldy, rows);                                            \
    }
#define TILES(F) TILE(F, 1) TILE(F, 2) TILE(F, 3) TILE(F, 4) TILE(F, 5) TILE(F, 6) TILE(F, 7) TILE(F, 8)
TILES(0)
TILES(1)
static const osp_q8act_tile_fn tiles[2][MAX_A + 1] = {
    {NULL, tile_0_1, tile_0_2, tile_0_3, tile_0_4, tile_0_5, tile_0_6, tile_0_7, tile_0_8},
    {NULL, tile_1_1, tile_1_2, tile_1_3, tile_1_4, tile_1_5, tile_1_6, tile_1_7, tile_1_8}};

void osp_q8act_matmul_avx2(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1) {
    osp_q8act_walk(w, acts, n, y, ldy, r0, r1, tiles);
}
