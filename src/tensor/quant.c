/* MLX affine quantization; the rules are in quant.h and model-spec §2.6. */
#include <math.h>
#include <string.h>
#include "quant.h"
#include "tensor.h"

osp_status osp_quant_check(int64_t n, int bits, int group) {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return osp_err(OSP_ERR_INVALID, "quantize: bits must be 2, 3, 4, 5, 6 or 8 (got %d)",
                       bits);
    if (group != 32 && group != 64 && group != 128)
        return osp_err(OSP_ERR_INVALID, "quantize: group size must be 32, 64 or 128 (got %d)",
                       group);
    if (n <= 0 || n % group != 0)
        return osp_err(OSP_ERR_INVALID,
                       "quantize: row length %lld is not a positive multiple of group %d",
                       (long long)n, group);
    return OSP_OK;
}

void osp_quantize_group(const float *x, int group, int bits, uint8_t *codes,
                        float *scale_out, float *bias_out) {
    const float n_bins = (float)((1 << bits) - 1);
    /* The GPU kernels start the max accumulator at 0 and the min at the
     * dtype's largest finite value (any start >= max x gives the same).
     * Four accumulators: min/max are exact, so the order is free. */
    float mx[4] = {0, 0, 0, 0}, mn[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int i = 0; i < group; i += 4)
        for (int l = 0; l < 4; l++) {
            mx[l] = x[i + l] > mx[l] ? x[i + l] : mx[l];
            mn[l] = x[i + l] < mn[l] ? x[i + l] : mn[l];
        }
    float w_max = mx[0], w_min = mn[0];
    for (int l = 1; l < 4; l++) {
        w_max = mx[l] > w_max ? mx[l] : w_max;
        w_min = mn[l] < w_min ? mn[l] : w_min;
    }
    float scale = (w_max - w_min) / n_bins;
    if (!(scale > 1e-7f)) scale = 1e-7f;
    int side = fabsf(w_min) > fabsf(w_max);
    if (!side) scale = -scale;
    float edge = side ? w_min : w_max;
    float q0 = osp_round_away(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
    }
    for (int i = 0; i < group; i++) {
        /* min(round(v), n_bins), also clamped at 0 (never needed for finite
         * input). Rounding is monotone and fixes 0 and n_bins, so clamping
         * v first is the same; it keeps the conversion in range and maps
         * NaN to 0. For v >= 0, round-half-away is trunc + (frac >= 0.5),
         * branch-free. */
        float v = (x[i] - bias) / scale;
        v = v > 0.0f ? v : 0.0f;
        v = v < n_bins ? v : n_bins;
        int32_t t = (int32_t)v;
        t += (v - (float)t) >= 0.5f;
        codes[i] = (uint8_t)t;
    }
    *scale_out = scale;
    *bias_out = bias;
}

void osp_pack_codes(const uint8_t *codes, int64_t n, int bits, uint8_t *out) {
    if (bits == 8) {
        memcpy(out, codes, (size_t)n);
        return;
    }
    if (bits == 4) {
        for (int64_t k = 0; k + 1 < n; k += 2)
            out[k / 2] = (uint8_t)((codes[k] & 0xF) | (codes[k + 1] << 4));
        if (n & 1) out[n / 2] = codes[n - 1] & 0xF;
        return;
    }
    /* General widths straddle bytes: shift codes through a bit buffer. */
    const uint32_t mask = (1u << bits) - 1u;
    uint32_t acc = 0;
    int nacc = 0;
    int64_t o = 0;
    for (int64_t k = 0; k < n; k++) {
        acc |= (codes[k] & mask) << nacc;
        nacc += bits;
        while (nacc >= 8) {
            out[o++] = (uint8_t)acc;
            acc >>= 8;
            nacc -= 8;
        }
    }
    if (nacc > 0) out[o] = (uint8_t)acc;
}

osp_status osp_quantize_row(const float *x, int64_t n, int bits, int group,
                            uint8_t *codes_out, uint16_t *scales_bf16,
                            uint16_t *biases_bf16) {
    OSP_TRY(osp_quant_check(n, bits, group));
    uint8_t codes[128];
    /* A group of 32·k codes packs into whole bytes, so groups pack
     * independently. */
    const int64_t group_bytes = (int64_t)group * bits / 8;
    for (int64_t g = 0; g < n / group; g++) {
        float s, b;
        osp_quantize_group(x + g * group, group, bits, codes, &s, &b);
        osp_pack_codes(codes, group, bits, codes_out + g * group_bytes);
        scales_bf16[g] = osp_f32_to_bf16(s);
        biases_bf16[g] = osp_f32_to_bf16(b);
    }
    return OSP_OK;
}
