// backend/cuda/mma.cuh: bf16 rounding and the tensor cores' mma.sync m16n8k16 (bf16 operands, f32 accumulation),
// shared by the kernel files (matmul_tc.cu, ...) and kernels_encdec.cu (the emulator, tests/cuemu, supplies its
// own mma and rounding).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// round to nearest even; NaN stays NaN (tensor.h's osp_f32_to_bf16)
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// two floats as a bf16 pair (round to nearest even), lo in the low half
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
#ifdef OSP_CUEMU
    return (uint32_t)f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16;
#else
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// c += a · b for one m16n8k16 tile (fragments as the PTX ISA lays them out: lane = 4g + t holds
// a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9];
// b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1])
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#ifdef OSP_CUEMU
    osp_cuemu::mma_m16n8k16_bf16(c, a0, a1, a2, a3, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
