/* AVX-512 weighted sum of rows (attention's p·V), compiled with -mavx512f.
 * Keeps y in registers for head sizes up to 256 and walks the rows once. */
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
