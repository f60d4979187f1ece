/* tensor/quant: MLX affine quantization (mx.quantize, GPU semantics).
 *
 * A row of n values is cut into n/group consecutive groups. Each group
 * gets one scale s and one bias b and codes q in [0, 2^bits-1] so that
 * w ≈ s·q + b (model-spec §2.6, bit-exact with the Metal/CUDA kernels when
 * the input values are bf16-representable):
 *   w_max = max(0, max x), w_min = min x (the GPU accumulator starts at 0);
 *   s = max((w_max-w_min)/n_bins, 1e-7); negated unless |w_min| > |w_max|;
 *   edge = the endpoint with the larger magnitude; q0 = round(edge/s);
 *   if q0 != 0: s = edge/q0, b = edge (0.0 becomes exactly representable),
 *   else b = 0; q = min(round((x-b)/s), n_bins) with the unrounded f32 s, b.
 * round is half-away-from-zero; all arithmetic is f32 with IEEE division.
 * Scales can be negative. Stored s, b are the f32 values rounded to bf16
 * (RNE), so dequantization sees the rounded ones.
 *
 * Packing (§2.2): codes of one row form a little-endian LSB-first
 * bitstream: code k occupies stream bits [k·bits, (k+1)·bits), stream bit
 * t being bit t%8 of byte t/8. osp_q_code (tensor.h) reads it back. A row
 * of n codes takes n·bits/8 bytes, which for n a multiple of 32 is whole
 * u32 words (the MLX `.weight` layout [out, in·bits/32]).
 */
#ifndef OSP_QUANT_H
#define OSP_QUANT_H

#include <stdint.h>
#include "core/core.h"

/* OSP_OK iff bits ∈ {2,3,4,5,6,8}, group ∈ {32,64,128} and n > 0 is a
 * multiple of group; else OSP_ERR_INVALID with a message. */
osp_status osp_quant_check(int64_t n, int bits, int group);

/* Quantize one group x[group]: codes[group] unpacked (one byte each),
 * *scale and *bias the unrounded f32 values. No argument checks: bits and
 * group must pass osp_quant_check (group a multiple of 4 at least). NaN
 * inputs give unspecified (but in-range) codes. */
void osp_quantize_group(const float *x, int group, int bits, uint8_t *codes,
                        float *scale, float *bias);

/* Pack n codes (each < 2^bits) into out[ceil(n·bits/8)] bytes (§2.2).
 * Bits beyond the last code in the final byte are zero. */
void osp_pack_codes(const uint8_t *codes, int64_t n, int bits, uint8_t *out);

/* Quantize a row x[n]: codes_out[n·bits/8] packed bytes,
 * scales_bf16[n/group], biases_bf16[n/group]. */
osp_status osp_quantize_row(const float *x, int64_t n, int bits, int group,
                            uint8_t *codes_out, uint16_t *scales_bf16,
                            uint16_t *biases_bf16);

/* Half-away-from-zero rounding (Metal/CUDA `round`, C roundf), written
 * so it needs no libm call and vectorizes. */
static inline float osp_round_away(float v) {
    if (!(v > -8388608.0f && v < 8388608.0f)) return v; /* integral, inf, NaN */
    float t = (float)(int32_t)v; /* trunc, exact below 2^23 */
    float f = v - t;             /* exact */
    if (f >= 0.5f) t += 1.0f;
    else if (f <= -0.5f) t -= 1.0f;
    return t;
}

#endif
