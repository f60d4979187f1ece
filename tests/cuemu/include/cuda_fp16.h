// tests/cuemu: the half-precision type and the conversions the kernels use.
#pragma once
#include <stdint.h>
#include <string.h>
#include "cuda_runtime.h"

struct __half {
    uint16_t x;
};
struct alignas(4) __half2 {
    __half x, y;
};

static inline float __half2float(__half h) {
    const uint32_t s = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13); // inf, NaN
    else if (e) u = s | ((e + 112u) << 23) | (m << 13);
    else if (!m) u = s;
    else { // subnormal: m · 2^-24, exact in f32
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= s;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __half __ushort_as_half(unsigned short v) { return __half{v}; }
static inline float2 __half22float2(__half2 h) {
    float2 r;
    r.x = __half2float(h.x), r.y = __half2float(h.y);
    return r;
}
