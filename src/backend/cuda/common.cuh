// backend/cuda/common.cuh: what the backend's kernel files share (kernels.h's operations, one job a file):
// the launch helpers (programmatic dependent launch: pdl_launch, pdl_wait), warp reductions, loads, the
// activation's arithmetic and a weight's value. Helpers are static or inline, so each file has its own copy.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utility>
#include "kernels.h"
#include "launch.cuh"
#include "mma.cuh"

#define WARP 32

static inline int launch_status() { return (int)cudaGetLastError(); }

static inline unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

// a launch without programmatic dependent launch
template <typename... K, typename... A>
static void launch(void (*k)(K...), dim3 grid, dim3 block, size_t shm, osp_cu_stream st, A &&...args) {
    osp_cu_launch(k, grid, block, shm, (cudaStream_t)st, 0, std::forward<A>(args)...);
}

__device__ __forceinline__ float load_float(const void *p, int dt, int64_t i) {
    if (dt == 2) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == 1) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

// code k of an LSB-first bitstream row (tensor.h's osp_q_code)
__device__ __forceinline__ uint32_t q_code(const unsigned char *row, int bits, int64_t k) {
    int64_t bit = k * bits, byte = bit >> 3;
    int sh = (int)(bit & 7);
    uint32_t v = row[byte];
    if (sh + bits > 8) v |= (uint32_t)row[byte + 1] << 8;
    if (sh + bits > 16) v |= (uint32_t)row[byte + 2] << 16;
    return (v >> sh) & ((1u << bits) - 1u);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// act(g) * u, act = SiLU (0) or GELU's tanh form (1): act_mul_kernel's arithmetic, and the gate + up pair's
// epilogue (tc_set's pair); every rounding explicit, so that none is contracted
// differently in one place than in another
__device__ __forceinline__ float act_val(int act, float g, float u) {
    if (act == 0) return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
    const float k = 0.7978845608028654f; // sqrt(2/pi)
    const float c = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
    const float th = tanhf(__fmul_rn(k, __fadd_rn(g, c)));
    return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, th)), u);
}

__device__ __forceinline__ float weight_at(const osp_cu_weight &w, const unsigned char *row, int64_t r, int64_t c,
                                           int64_t ng) {
    if (!w.qbits) return load_float(row, w.dtype, c);
    int64_t g = c / w.group;
    float s = load_float(w.scales, w.sdtype, r * ng + g), b = load_float(w.biases, w.sdtype, r * ng + g);
    return s * (float)q_code(row, w.qbits, c) + b;
}

#define FMA __fmaf_rn
#define MUL __fmul_rn
#define ADD __fadd_rn

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
#ifdef OSP_CUEMU
    return osp_cuemu::ld_global16(p);
#else
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
#endif
}

// weights of one launch at most (mv_set, tc_set)
#define MV_MAXW 4

static inline int same_shape(const osp_cu_weight *a, const osp_cu_weight *b) {
    return a->dtype == b->dtype && a->qbits == b->qbits && a->group == b->group && a->sdtype == b->sdtype &&
           a->cols == b->cols;
}

// Programmatic dependent launch: a matmul may start while the kernel before
// it runs, issue its weights' first loads (never written by a kernel), and
// wait for that kernel's results (griddepcontrol.wait) before it reads its
// input or writes anything; the kernels before a matmul let it start early
// (pdl_trigger). In a kernel launched without it both are no-ops.
#ifdef OSP_CUEMU // (the emulator runs a stream's kernels one after another: nothing to wait for, no cache)
__device__ __forceinline__ void pdl_trigger() {}
__device__ __forceinline__ void pdl_wait() {}
__device__ __forceinline__ void prefetch_l2(const void *p) { osp_cuemu::touch(p); }
#else
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
#endif

static inline int pdl_on() { return osp_cu_pdl_on(); }

// launch with programmatic dependent launch allowed (the kernel begins with pdl_wait)
template <typename... K, typename... A>
static void pdl_launch(void (*k)(K...), dim3 grid, dim3 block, size_t shm, osp_cu_stream st, A &&...args) {
    osp_cu_launch(k, grid, block, shm, (cudaStream_t)st, pdl_on(), std::forward<A>(args)...);
}

// threads of an element-wise launch's block
#define EW 256
