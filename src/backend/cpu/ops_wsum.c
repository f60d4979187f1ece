/* AVX-512 helpers outside the per-ISA tables, compiled with -mavx512f:
 * attention's scores (q·K rows) and weighted sum of rows (p·V), and the
 * sampler's candidate scan (compress-store of the indices passing a
 * threshold). */
#include <immintrin.h>
#include <math.h>
#include "backend/ops.h"

void osp_wsum_avx512(float *y, const float *w, const float *rows, int64_t n, int64_t stride, int64_t dim) {
    int64_t d0 = 0;
    for (; d0 + 64 <= dim; d0 += 64) { /* 4 accumulators of 16 */
        __m512 a0 = _mm512_loadu_ps(y + d0), a1 = _mm512_loadu_ps(y + d0 + 16);
        __m512 a2 = _mm512_loadu_ps(y + d0 + 32), a3 = _mm512_loadu_ps(y + d0 + 48);
        for (int64_t j = 0; j < n; j++) {
            const float *r = rows + j * stride + d0;
            __m512 wj = _mm512_set1_ps(w[j]);
            a0 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r), a0);
            a1 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 16), a1);
            a2 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 32), a2);
            a3 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(y + d0, a0), _mm512_storeu_ps(y + d0 + 16, a1);
        _mm512_storeu_ps(y + d0 + 32, a2), _mm512_storeu_ps(y + d0 + 48, a3);
    }
    for (; d0 < dim; d0 += 16) { /* tails, masked */
        __mmask16 m = dim - d0 >= 16 ? 0xffff : (__mmask16)((1u << (dim - d0)) - 1);
        __m512 a = _mm512_maskz_loadu_ps(m, y + d0);
        for (int64_t j = 0; j < n; j++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_maskz_loadu_ps(m, rows + j * stride + d0), a);
        _mm512_mask_storeu_ps(y + d0, m, a);
    }
}

/* The 16-lane partial sums of one row's dot product. */
static inline __m512 row_dot(const float *q, const float *r, int64_t dim) {
    __m512 a = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 16 <= dim; d += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(r + d), a);
    if (d < dim) {
        __mmask16 m = (__mmask16)((1u << (dim - d)) - 1);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), _mm512_maskz_loadu_ps(m, r + d), a);
    }
    return a;
}

/* row_dot for dim = 16 NV with q in registers (bitwise row_dot). */
static inline __attribute__((always_inline)) __m512 row_dot_reg(const __m512 *qv, const float *r, const int NV) {
    __m512 a = _mm512_setzero_ps();
    for (int i = 0; i < NV; i++) a = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(r + 16 * i), a);
    return a;
}

/* Two vectors of k entities x (16 / k) partial lanes each -> one of 2k
 * entities x (8 / k) lanes: lane pairs (i, i + 8 / k) within each
 * entity's run are added. */
static inline __m512 fold(__m512 x, __m512 y, __m512i lo, __m512i hi) {
    return _mm512_add_ps(_mm512_permutex2var_ps(x, lo, y), _mm512_permutex2var_ps(x, hi, y));
}

/* Rows r .. r + 3 through the first two fold levels. */
static inline __attribute__((always_inline)) __m512 quad_reg(const __m512 *qv, const float *r, int64_t stride,
                                                             const __m512i *lo, const __m512i *hi, const int NV) {
    __m512 a = fold(row_dot_reg(qv, r, NV), row_dot_reg(qv, r + stride, NV), lo[0], hi[0]);
    __m512 b = fold(row_dot_reg(qv, r + 2 * stride, NV), row_dot_reg(qv, r + 3 * stride, NV), lo[0], hi[0]);
    return fold(a, b, lo[1], hi[1]);
}

/* 16 rows from r: the fold tree of osp_scores_avx512, evaluated depth first
 * (few live registers). */
static inline __attribute__((always_inline)) __m512 block_reg(const __m512 *qv, const float *r, int64_t stride,
                                                              const __m512i *lo, const __m512i *hi, const int NV) {
    __m512 a = fold(quad_reg(qv, r, stride, lo, hi, NV), quad_reg(qv, r + 4 * stride, stride, lo, hi, NV), lo[2], hi[2]);
    __m512 b = fold(quad_reg(qv, r + 8 * stride, stride, lo, hi, NV), quad_reg(qv, r + 12 * stride, stride, lo, hi, NV),
                    lo[2], hi[2]);
    return fold(a, b, lo[3], hi[3]);
}

/* 16 rows at a time: their 16 partial-sum vectors fold into one vector of
 * 16 scores in four levels (15 folds) instead of 16 horizontal sums. */
void osp_scores_avx512(float *y, const float *q, const float *rows, int64_t n, int64_t stride, int64_t dim) {
    /* level k (run length r = 16 >> k within each input): output entity e
     * takes lanes [e r', e r' + r') of x for e < half, ..., r' = r / 2 */
    static const int32_t L[4][2][16] = {
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
         {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
         {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
        {{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
         {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}},
        {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
         {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}}};
    __m512i lo[4], hi[4];
    for (int k = 0; k < 4; k++) lo[k] = _mm512_loadu_si512(L[k][0]), hi[k] = _mm512_loadu_si512(L[k][1]);
    int64_t j = 0;
    if (dim == 64 || dim == 128 || dim == 256) { /* q held in registers; the same operations in the same
                                                   * order (decode at 3K positions +22-29% at head_dim 64,
                                                   * gemma-3-1b at 2K +5-6%; measured alternating per step) */
        const int nv = (int)(dim / 16);
        __m512 qv[16];
        for (int i = 0; i < nv; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
        for (; j + 16 <= n; j += 16) {
            const float *r = rows + j * stride;
            __m512 v = nv == 4 ? block_reg(qv, r, stride, lo, hi, 4)
                     : nv == 8 ? block_reg(qv, r, stride, lo, hi, 8)
                               : block_reg(qv, r, stride, lo, hi, 16);
            _mm512_storeu_ps(y + j, v);
        }
    }
    for (; j + 16 <= n; j += 16) {
        __m512 v[16];
        for (int i = 0; i < 16; i++) v[i] = row_dot(q, rows + (j + i) * stride, dim);
        for (int k = 0, cnt = 16; k < 4; k++, cnt /= 2)
            for (int i = 0; i < cnt / 2; i++) v[i] = fold(v[2 * i], v[2 * i + 1], lo[k], hi[k]);
        _mm512_storeu_ps(y + j, v[0]);
    }
    for (; j < n; j++) y[j] = _mm512_reduce_add_ps(row_dot(q, rows + j * stride, dim));
}

int32_t osp_select_ge_avx512(int32_t *idx, const float *x, int32_t n, float thr) {
    const __m512 t = _mm512_set1_ps(thr);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), t, _CMP_GE_OQ);
        if (m) { /* compress in a register, then a masked store: the
                    memory form of vpcompressd is microcoded (slow on Zen 4) */
            int k = __builtin_popcount(m);
            _mm512_mask_storeu_epi32(idx + c, (__mmask16)((1u << k) - 1), _mm512_maskz_compress_epi32(m, iv));
            c += k;
        }
        iv = _mm512_add_epi32(iv, step);
    }
    for (; i < n; i++)
        if (x[i] >= thr) idx[c++] = i;
    return c;
}

/* Two passes: the maximum (NaN lanes never taken), then its first index. */
int32_t osp_argmax_avx512(const float *x, int32_t n) {
    if (n <= 0) return 0;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int any = 0;
    for (int32_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __mmask16 ord = _mm512_mask_cmp_ps_mask(m, v, v, _CMP_ORD_Q);
        any |= ord != 0;
        mx = _mm512_mask_max_ps(mx, ord, mx, v);
    }
    if (!any) return 0;
    const __m512 best = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    for (int32_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __mmask16 eq = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), best, _CMP_EQ_OQ);
        if (eq) return i + __builtin_ctz(eq);
    }
    return 0;
}
