/* AVX-512 helpers outside the per-ISA tables, compiled with -mavx512f:
 * the weighted sum of rows (attention's p·V) and the sampler's candidate
 * scan (compress-store of the indices passing a threshold). */
#include <immintrin.h>
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

int32_t osp_select_ge_avx512(int32_t *idx, const float *x, int32_t n, float thr) {
    const __m512 t = _mm512_set1_ps(thr);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i iv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), t, _CMP_GE_OQ);
        _mm512_mask_compressstoreu_epi32(idx + c, m, iv);
        c += __builtin_popcount(m);
        iv = _mm512_add_epi32(iv, step);
    }
    for (; i < n; i++)
        if (x[i] >= thr) idx[c++] = i;
    return c;
}
