/* backend/kvq: attention kernels over an affine-quantized KV cache.
 *
 * Layout. A head's K (or V) cache is three planes of n consecutive rows
 * (one row per position), each row D values quantized along head_dim with
 * the MLX rules (model-spec §2.6, §4.1):
 *   codes   uint8_t  [n][D*bits/8]   LSB-first bitstream (§2.2, what
 *                                    osp_pack_codes writes): 4-bit byte k
 *                                    holds code 2k (low nibble) and 2k+1
 *                                    (high nibble); 8-bit one code a byte
 *   scales  uint16_t [n][D/group]    bf16
 *   biases  uint16_t [n][D/group]    bf16
 * Value i of row j is s*c + b with (s, b) of group i/group.
 *
 * bits = 16 is the unquantized 16-bit cache: codes holds the values
 * themselves as bf16 [n][D] (round to nearest even from f32), there are no
 * scales or biases (those pointers are not read; group is ignored), and
 * the kernels compute exactly what they would on the widened f32 values.
 * The caller
 * owns the planes (the KV pool); no alignment is required, and every
 * load stays inside the rows it was given (masked where it is partial).
 *
 * Kernels (single-threaded; callers split heads and rows):
 *   scores: logits of a query against n K rows, computed on the codes
 *           per group as s*sum(q*c) + b*sum(q).
 *   wsum:   o += p . V over n V rows, as sum_j (p_j s_jg) c_ji + p_j b_jg.
 * The AVX-512 variant centres the codes on C = 2^(bits-1) (c - C, bias
 * b + C*s) so the two terms do not cancel (8-bit biases are about -128 s);
 * the scalar reference dequantizes each value and sums in double.
 *
 * Determinism (both variants). scores[j] depends only on q and row j: the
 * same instructions in the same order whatever n is and wherever the row
 * sits in the call (rows are reduced 16 at a time by a tree that treats
 * every lane alike). wsum sums rows in a fixed hierarchy (blocks of 16
 * rows, superblocks of 256, counted from the call's first row, then into
 * o), so its rounding grows with about 32 + n/256 terms rather than n; the
 * order depends on n only through where the last block ends, and rows
 * split over consecutive calls at multiples of 256 give bitwise the same
 * o as one call. The scalar reference sums each call in double and rounds
 * once.
 *
 * Accuracy: the AVX-512 kernels accumulate in f32 and agree with the
 * scalar reference within about 1e-6 of sum_i |q_i| (|deq_i| + |s|)
 * (scores), or of sum_j |p_j| (|deq_ji| + |s_j|) (wsum, for thousands of
 * rows too): tested at 1e-5.
 */
#ifndef OSP_KVQ_H
#define OSP_KVQ_H

#include <stddef.h>
#include <stdint.h>

/* Largest head_dim the kernels take (their per-call stack buffers). */
#define OSP_KVQ_MAX_D 2048

/* 1 iff bits is 4 or 8, group 32, 64 or 128, and 0 < D <= OSP_KVQ_MAX_D
 * with D % group == 0; or bits is 16 and 0 < D <= OSP_KVQ_MAX_D with
 * D % 16 == 0 (any group). Every other function requires it. */
int osp_kvq_supported(int D, int bits, int group);

/* Bytes of codes per row: D*bits/8 (2*D for bits 16). */
size_t osp_kvq_code_bytes(int D, int bits);

/* Quantize n rows x[n][D] (f32; bf16-representable input reproduces
 * mx.quantize exactly) into codes [n][D*bits/8], scales [n][D/group],
 * biases [n][D/group] (osp_quantize_row per row). */
void osp_kvq_quantize(const float *x, int64_t n, int D, int bits, int group, uint8_t *codes,
                      uint16_t *scales, uint16_t *biases);

/* x[n][D] = s*c + b, rounded once to f32 (reference helper, for tests
 * and code that needs f32 rows; kernels never materialize rows). */
void osp_kvq_dequantize(const uint8_t *codes, const uint16_t *scales, const uint16_t *biases,
                        int64_t n, int D, int bits, int group, float *x);

typedef struct osp_kvq_ops {
    const char *name;
    /* scores[j] = sum_i q[i] * (s_jg * c_ji + b_jg) for j < n: attention
     * logits of q[D] against n quantized K rows (unscaled). */
    void (*scores)(const float *q, int D, int bits, int group, const uint8_t *codes,
                   const uint16_t *scales, const uint16_t *biases, int64_t n, float *scores);
    /* o[i] += sum_j p[j] * (s_jg * c_ji + b_jg) for i < D: the
     * probability-weighted sum of n quantized V rows, p[n], o[D]. */
    void (*wsum)(float *o, const float *p, int64_t n, int D, int bits, int group,
                 const uint8_t *codes, const uint16_t *scales, const uint16_t *biases);
} osp_kvq_ops;

/* The reference: each value dequantized as above, products summed in
 * double. Slow; what the fast variant is tested against. */
const osp_kvq_ops *osp_kvq_ops_scalar(void);
/* AVX-512 (F+BW+VL+DQ) variant, or NULL when not compiled in or this CPU
 * lacks it. */
const osp_kvq_ops *osp_kvq_ops_avx512(void);
/* The best variant for this CPU, chosen once (thread-safe). OSP_ISA=scalar
 * (or avx2, which has no variant here) in the environment forces the
 * reference. */
const osp_kvq_ops *osp_kvq_ops_get(void);

#endif
