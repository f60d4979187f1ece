/* backend/q8act: the production decode path for MLX 4- and 8-bit weights.
 *
 * The activation x[cols] is quantized once per matmul to int8 in blocks of
 * 32 (d_b = max|x| / 127), so a weight row's dot product becomes integer
 * u8 x s8 sums (AVX-512 VNNI vpdpbusd) scaled per block and group:
 *
 *   y = sum_b d_b s_g(b) (sum_{j in b} xq_j q_j - c sum_{j in b} xq_j)
 *     + sum_g (b_g + c s_g) sum_{j in g} x_j,        c = 2^(bits-1)
 *
 * Centring the codes by c keeps the two terms from cancelling (8-bit
 * biases are about -128 s). The group sums of x are exact f32. This is
 * the goldens' second tier ("production fast path"); its KL against the
 * references is measured in tests/test_fast_path.c and documented in the
 * README. Prefill (many tokens) keeps the f32 path.
 *
 * Layout of the prepared activation, per chunk of codes (128 codes for
 * 4-bit: one 64-byte load holds them as low/high nibbles; 64 for 8-bit):
 *   xs   int8 [n_chunks * 128 | 64]: 4-bit: for each chunk the 64 even-index
 *        values then the 64 odd-index ones (so nibble k of the load meets
 *        its activation); 8-bit: natural order. Zero-padded.
 *   dl   f32 [n_chunks * 16]: d_b of the block each int32 lane belongs to
 *   nxs  i32 [n_chunks * 16]: -c * (sum of the xq a lane multiplies)
 */
#ifndef OSP_Q8ACT_H
#define OSP_Q8ACT_H

#include <stdint.h>
#include "tensor/tensor.h"

typedef struct osp_q8act {
    int64_t cols;
    int bits;        /* 4 or 8: which layout xs has */
    int group;       /* group size the gsum entries are for */
    int64_t n_chunks;
    int8_t *xq;      /* [cols] natural order (scalar reference) */
    float *d;        /* [cols / 32] block scales */
    float *gsum;     /* [cols / group] exact sums of x */
    int8_t *xs;      /* SIMD layout, see above */
    float *dl;
    int32_t *nxs;
} osp_q8act;

/* Bytes of scratch a prepared activation of `cols` needs (any bits/group). */
size_t osp_q8act_bytes(int64_t cols);
/* Can this weight use the path? 4 or 8 bits, bf16/f16 scales, cols a
 * multiple of 32 (partial chunks are padded). */
int osp_q8act_supported(const osp_weight *w);
/* Quantize x[cols] for weights of w's bits and group, into `mem`
 * (osp_q8act_bytes(cols) bytes, 64-byte aligned). */
void osp_q8act_prepare(osp_q8act *a, const float *x, const osp_weight *w, void *mem);
/* Scalar reference: y[r - r0] for rows [r0, r1). */
void osp_q8act_matvec_ref(const osp_weight *w, const osp_q8act *a, float *y, int64_t r0, int64_t r1);
/* AVX-512 VNNI version (NULL-safe: see osp_q8act_matvec_fast()). */
void osp_q8act_matvec_vnni(const osp_weight *w, const osp_q8act *a, float *y, int64_t r0, int64_t r1);

typedef void (*osp_q8act_fn)(const osp_weight *w, const osp_q8act *a, float *y, int64_t r0, int64_t r1);
/* The best implementation for this CPU (VNNI, else the scalar reference). */
osp_q8act_fn osp_q8act_matvec_fast(void);

/* n prepared activations (continuous batching: one per user) through rows
 * [r0, r1): y[t * ldy + (r - r0)] for t < n. Each chunk of codes is read and
 * unpacked once for all n. Batch invariant: activation t's outputs are
 * bitwise those of the matvec of the same tier on acts[t] alone, whatever
 * the other activations and n are. */
void osp_q8act_matmul_ref(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                          int64_t r1);
/* AVX-512 VNNI version: bitwise osp_q8act_matvec_vnni per activation. */
void osp_q8act_matmul_vnni(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1);

typedef void (*osp_q8act_mm_fn)(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy,
                                int64_t r0, int64_t r1);
/* The best implementation for this CPU, the same tier as
 * osp_q8act_matvec_fast() (so each row matches it bitwise). */
osp_q8act_mm_fn osp_q8act_matmul_fast(void);

#endif
