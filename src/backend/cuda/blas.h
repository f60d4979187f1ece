/* backend/cuda/blas: cuBLAS opened at run time (see blas.c). */
#ifndef OSP_CUDA_BLAS_H
#define OSP_CUDA_BLAS_H

#include <stdint.h>

/* A cuBLAS handle on `stream` (a cudaStream_t), or NULL (with a one-time
 * note on stderr) when cuBLAS cannot be opened. */
void *osp_cublas_new(void *stream);
void osp_cublas_free(void *h);
/* y[t * ldy + r] = sum_c x[t, c] * w[r, c] with bf16 w [rows, cols] and
 * x [n, cols], f32 accumulation and output (no TF32). 0 = fine, else a
 * cublasStatus_t. */
int osp_cublas_gemm_bf16(void *h, int64_t rows, int64_t n, int64_t cols, const void *w, const void *x, float *y,
                         int64_t ldy);

#endif
