// tests/cuemu: the device side of the CUDA emulator (C++): the vector types, the built-in variables, the intrinsics
// the kernels use, and cudaLaunchKernelEx. A kernel runs as one fiber a thread (tests/cuemu/cuemu.cpp).
#pragma once
#include "cuda_runtime_api.h"
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
// static shared memory: one instance, which each block in turn has to itself (blocks run one at a time)
#define __shared__ static
// dynamic shared memory: the block's own buffer of the launch's size
#define OSP_DYN_SHARED(T, name) T *const name = (T *)osp_cuemu::dyn_smem()

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

typedef struct cudaLaunchConfig_t {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

namespace osp_cuemu {
struct thread_state;
void *dyn_smem();
void sync_block();
void sync_warp(unsigned mask);
uint64_t shfl_bits(unsigned mask, uint64_t v, int src); // the value lane src gave (src < 0: the caller's own)
extern int cur_lane; // the running thread's lane (cuemu.cpp sets it as it switches threads)
static inline int lane() { return cur_lane; }
void mma_m16n8k16_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c); // fma.rn.bf16x2: a * b + c per half, rounded once
void cp_async(void *smem, const void *gmem, int bytes);
void cp_async_commit();
void cp_async_wait(int n);
void check_align(const void *p, size_t a, const char *what);
static inline void touch(const void *) {}
void check_range(const void *p, uint64_t n, const char *what); // a bulk copy's global range (cuemu.cpp)
void mbar_init(uint64_t *bar, unsigned count);        // mbarrier.init (one arrival)
void mbar_expect_tx(uint64_t *bar, uint32_t bytes);   // mbarrier.arrive.expect_tx
void bulk_copy(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar); // cp.async.bulk, completing on bar
void mbar_wait(uint64_t *bar, uint32_t parity);       // block-wide: every thread waits at the same point
static inline uint4 ld_global16(const void *p) {
    check_align(p, 16, "a 16-byte global load");
    return *(const uint4 *)p;
}
// a launch: validated, then run block by block (or recorded, when its stream is being captured)
cudaError_t launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t st, std::function<void()> body);
} // namespace osp_cuemu

// the built-in variables: the running thread's (the emulator sets threadIdx as it switches threads)
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

template <typename... E, typename... A>
static inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t *c, void (*k)(E...), A &&...args) {
    // the arguments converted to the parameters' types once, at the launch (a captured launch keeps them)
    auto t = std::make_shared<std::tuple<std::decay_t<E>...>>(std::forward<A>(args)...);
    return osp_cuemu::launch((const void *)k, c->gridDim, c->blockDim, c->dynamicSmemBytes, c->stream,
                             [k, t]() { std::apply(k, *t); });
}
template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *fn, enum cudaFuncAttribute a, int v) {
    return cudaFuncSetAttribute((const void *)fn, a, v);
}

static inline void __syncthreads() { osp_cuemu::sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { osp_cuemu::sync_warp(mask); }
static inline void __threadfence() {}

template <typename T> static inline T osp_cuemu_shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffled value");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = osp_cuemu::shfl_bits(mask, b, src);
    memcpy(&v, &b, sizeof v);
    return v;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int l = osp_cuemu::lane();
    return osp_cuemu_shfl(mask, v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    const int l = osp_cuemu::lane(), s = l ^ m;
    return osp_cuemu_shfl(mask, v, s / width == l / width && s < 32 ? s : -1);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const int l = osp_cuemu::lane();
    return osp_cuemu_shfl(mask, v, (l & (width - 1)) + (int)d < width ? l + (int)d : -1);
}

static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
// (the emulator is compiled with -ffp-contract=off: no product is fused into a sum unless written so)
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)x | (uint64_t)y << 32;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
template <typename T> static inline T __ldg(const T *p) {
    osp_cuemu::check_align(p, alignof(T), "__ldg");
    return *p;
}
template <typename T> static inline T __ldcg(const T *p) {
    osp_cuemu::check_align(p, alignof(T), "__ldcg");
    return *p;
}
static inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }

// atomics: the emulator runs one thread at a time
template <typename T> static inline T atomicAdd(T *p, T v) {
    const T o = *p;
    *p = o + v;
    return o;
}
static inline unsigned atomicAdd(unsigned *p, int v) { return atomicAdd(p, (unsigned)v); }

// the device's integer min and max
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
static inline long max(long a, long b) { return a > b ? a : b; }
