// backend/cuda/kv.cuh: a head vector's RoPE rotation and the KV cache's slots, values and store (kv/kv.h's
// block layout), shared by the RoPE and store launches (rope_kv.cu) and attention (attention.cu).
#pragma once
#include "common.cuh"

// RoPE's rotation of pair (i, i + D/2) of one head vector at position p: every RoPE kernel's arithmetic
__device__ __forceinline__ void rope_rot(float *v, int32_t pair, int32_t half, int32_t p, const float *inv) {
    const float a = __fmul_rn((float)p, inv[pair]);
    const float c = cosf(a), s = sinf(a);
    const float a1 = v[pair], a2 = v[pair + half];
    v[pair] = __fmaf_rn(a1, c, -__fmul_rn(a2, s));
    v[pair + half] = __fmaf_rn(a2, c, __fmul_rn(a1, s));
}

__device__ __forceinline__ int32_t kv_slot(const osp_cu_kvlayer &L, int32_t p) { return L.sliding ? p % L.ring : p; }

// value d of K (which 0) or V (1) of (row, head h, slot)
__device__ __forceinline__ float kv_value(const osp_cu_kvlayer &L, const osp_cu_kvrow &R, int which, int32_t h,
                                          int32_t slot, int32_t d) {
    const int64_t H = L.n_kv_heads, cap = R.cap, D = L.head_dim;
    if (L.bits == 0) return ((const float *)R.mem)[((which * H + h) * cap + slot) * D + d];
    const unsigned char *base = R.mem + (int64_t)which * H * cap * L.slot_bytes;
    const int64_t i = (int64_t)h * cap + slot;
    const unsigned char *codes = base + i * L.cb;
    if (L.bits == 16) return bf16_to_f32(((const uint16_t *)codes)[d]);
    const uint16_t *scales = (const uint16_t *)(base + H * cap * L.cb) + i * L.ng;
    const uint16_t *biases = (const uint16_t *)(base + H * cap * L.cb) + H * cap * L.ng + i * L.ng;
    int c = L.bits == 8 ? codes[d] : (codes[d >> 1] >> ((d & 1) * 4)) & 0xF;
    int g = d / L.group;
    return bf16_to_f32(scales[g]) * (float)c + bf16_to_f32(biases[g]);
}

// MLX's rule for one group (tensor/quant.c's osp_quantize_group, op for op)
static __device__ void quantize_group(const float *x, int group, int bits, uint8_t *codes, float *scale_out,
                               float *bias_out) {
    const float n_bins = (float)((1 << bits) - 1);
    float w_max = 0.0f, w_min = INFINITY;
    for (int i = 0; i < group; i++) {
        w_max = x[i] > w_max ? x[i] : w_max;
        w_min = x[i] < w_min ? x[i] : w_min;
    }
    float scale = __fdiv_rn(w_max - w_min, n_bins);
    if (!(scale > 1e-7f)) scale = 1e-7f;
    int side = fabsf(w_min) > fabsf(w_max);
    if (!side) scale = -scale;
    float edge = side ? w_min : w_max;
    float v0 = __fdiv_rn(edge, scale), q0 = v0;
    if (v0 > -8388608.0f && v0 < 8388608.0f) { // round half away from zero
        float t = (float)(int32_t)v0, f = v0 - t;
        if (f >= 0.5f) t += 1.0f;
        else if (f <= -0.5f) t -= 1.0f;
        q0 = t;
    }
    float bias = 0.0f;
    if (q0 != 0.0f) {
        scale = __fdiv_rn(edge, q0);
        bias = edge;
    }
    for (int i = 0; i < group; i++) {
        float v = __fdiv_rn(x[i] - bias, scale);
        v = v > 0.0f ? v : 0.0f;
        v = v < n_bins ? v : n_bins;
        int32_t t = (int32_t)v;
        t += (v - (float)t) >= 0.5f;
        codes[i] = (uint8_t)t;
    }
    *scale_out = scale;
    *bias_out = bias;
}

// Store head vector x (D floats the block can read) as head h of K (which 0) or V (1) at a row's slot: f32
// and bf16 by the block's threads, quantized by thread 0 (exactness over speed: a KV vector is small).
// Every store of the cache (kv_write_kernel, norm_rope_kernel's) is this one.
static __device__ void kv_store(const osp_cu_kvlayer &L, const osp_cu_kvrow &R, int32_t slot, int64_t h, int which,
                         const float *x) {
    const int64_t H = L.n_kv_heads, D = L.head_dim, cap = R.cap;
    if (L.bits == 0) {
        float *dst = (float *)R.mem + ((which * H + h) * cap + slot) * D;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = x[d];
        return;
    }
    unsigned char *base = R.mem + (int64_t)which * H * cap * L.slot_bytes;
    const int64_t vi = (int64_t)h * cap + slot;
    unsigned char *codes = base + vi * L.cb;
    if (L.bits == 16) {
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ((uint16_t *)codes)[d] = f32_to_bf16(x[d]);
        return;
    }
    if (threadIdx.x != 0) return;
    uint16_t *scales = (uint16_t *)(base + H * cap * L.cb) + vi * L.ng;
    uint16_t *biases = (uint16_t *)(base + H * cap * L.cb) + H * cap * L.ng + vi * L.ng;
    uint8_t q[128];
    for (int64_t g = 0; g < L.ng; g++) {
        float s, b;
        quantize_group(x + g * L.group, L.group, L.bits, q, &s, &b);
        unsigned char *o = codes + g * L.group * L.bits / 8;
        if (L.bits == 8)
            for (int j = 0; j < L.group; j++) o[j] = q[j];
        else
            for (int j = 0; j + 1 < L.group; j += 2) o[j / 2] = (uint8_t)((q[j] & 0xF) | (q[j + 1] << 4));
        scales[g] = f32_to_bf16(s);
        biases[g] = f32_to_bf16(b);
    }
}
