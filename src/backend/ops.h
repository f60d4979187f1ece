/* backend/: the ops table. One table per backend/ISA, chosen once at
 * start-up (osp_ops_get); the model code calls kernels only through it.
 *
 * CPU variants: "scalar" (the reference every fast kernel is tested
 * against), "avx2" (AVX2+FMA+F16C) and "avx512" (F+BW+VL+DQ). All
 * activations are f32; weights are read in their stored format.
 * Kernels are single-threaded: callers split work (rows of W, heads)
 * across the thread pool.
 */
#ifndef OSP_OPS_H
#define OSP_OPS_H

#include <stdint.h>
#include "tensor/tensor.h"

typedef struct osp_ops {
    const char *name;

    /* y[t*ldy + (r - r0)] = sum_c x[t*w->cols + c] * W[r, c]
     * for t in [0, n), r in [r0, r1). Dense f32/f16/bf16 or MLX-quantized
     * W (bits 2,3,4,5,6,8; group 32/64/128), computed on the stored codes.
     * r0 is a multiple of 16 unless r0 == r1 or r1 == rows (callers split
     * on 16-row boundaries). */
    void (*matmul)(const osp_weight *w, const float *x, int64_t n, float *y,
                   int64_t ldy, int64_t r0, int64_t r1);
    /* The same for n tokens, each bitwise what matmul gives it with n == 1
     * (the rows of a batched decode step), reading W once for all of them.
     * Returns 0 (nothing written) for a weight kind it has no such kernel
     * for; NULL in tables without any: the caller then runs each token
     * through matmul alone. */
    int (*matmul_each)(const osp_weight *w, const float *x, int64_t n, float *y,
                       int64_t ldy, int64_t r0, int64_t r1);

    float (*dot)(const float *a, const float *b, int64_t n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    /* y = x * rsqrt(mean(x^2) + eps) * (w ? (add_one ? 1 + w : w) : 1) */
    void (*rmsnorm)(float *y, const float *x, const float *w, int64_t n,
                    float eps, int add_one);
    /* In-place softmax over n values (max-subtracted, f32 sum). */
    void (*softmax)(float *x, int64_t n);
    /* *mx = max of x[0..n); returns sum_i exp(x[i] - *mx) (f32): the
     * softmax's normalizer, without writing anything. */
    float (*sumexp)(const float *x, int64_t n, float *mx);
    /* y[i] = act(g[i]) * u[i]; act = SiLU or GELU (tanh approximation). */
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
    void (*gelu_tanh_mul)(float *y, const float *g, const float *u, int64_t n);
    /* x = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), in place: the exact GELU
     * (Whisper's). The scalar table calls erff; the vector ones compute Phi
     * through erfc (OSP_GELU_ERF_P below), within ~1e-6 of it relative. */
    void (*gelu_erf)(float *x, int64_t n);
    /* x = cap * tanh(x / cap) */
    void (*softcap)(float *x, int64_t n, float cap);
    /* y[d] += sum_j w[j] * rows[j * stride + d] for d < dim, j < n
     * (attention's probability-weighted sum of V rows). */
    void (*wsum)(float *y, const float *w, const float *rows, int64_t n, int64_t stride, int64_t dim);
    /* y[j] = sum_d q[d] * rows[j * stride + d] for j < n, d < dim
     * (attention's scores of one query against cached K rows). */
    void (*scores)(float *y, const float *q, const float *rows, int64_t n, int64_t stride, int64_t dim);
    /* Indices i < n with x[i] >= thr, in increasing order, into idx; returns
     * their count (the sampler's candidate scan). */
    int32_t (*select_ge)(int32_t *idx, const float *x, int32_t n, float thr);
    /* The first index of the largest of x[0..n), NaN never chosen; 0 when
     * n <= 0 or every value is NaN (greedy decoding). */
    int32_t (*argmax)(const float *x, int32_t n);
} osp_ops;

/* The vector GELU's Phi: for z = min(|x| / sqrt 2, 10) and t = 2 / (2 + z),
 * erfc(z) = t exp(-z^2) exp(P(t)) with z^2 = x^2 / 2 kept exact (two floats),
 * P the degree-10 polynomial below (fitted to
 * ln(erfc(z) / t) + z^2 on t in [1/6, 1], |error| < 1e-8); Phi = 1 - erfc/2
 * for x >= 0, erfc/2 below (no cancellation for x << 0). */
#define OSP_GELU_ERF_P {-1.2655780417e+00f, 1.0018182174e+00f, 3.5320147950e-01f, 2.3292450461e-01f, -7.3614372324e-01f, 1.7205866867e+00f, -3.6302095271e+00f, 4.3149716486e+00f, -2.8369157651e+00f, 9.9025782795e-01f, -1.4491330531e-01f}

/* Vectorized wsum (AVX-512F), used by every x86 table on CPUs that have it. */
void osp_wsum_avx512(float *y, const float *w, const float *rows, int64_t n, int64_t stride, int64_t dim);
void osp_scores_avx512(float *y, const float *q, const float *rows, int64_t n, int64_t stride, int64_t dim);
int32_t osp_select_ge_avx512(int32_t *idx, const float *x, int32_t n, float thr);
int32_t osp_argmax_avx512(const float *x, int32_t n);

const osp_ops *osp_ops_scalar(void);
const osp_ops *osp_ops_avx2(void);   /* NULL when not compiled in */
const osp_ops *osp_ops_avx512(void); /* NULL when not compiled in */

/* The best table this CPU supports (cpuid, once). OSP_ISA=scalar|avx2|avx512
 * in the environment forces a variant (for tests and comparisons). */
const osp_ops *osp_ops_get(void);

#endif
