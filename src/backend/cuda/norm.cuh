// backend/cuda/norm.cuh: the RMS norm's arithmetic, shared by the norm kernels (rows.cu) and the norm +
// RoPE launch (rope_kv.cu).
#pragma once
#include "common.cuh"

// the block's sum of v in a fixed tree order
static __device__ float block_sum(float v, float *sh) {
    v = warp_sum(v);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

// One block per row. x += t first when t is given (the residual add fused
// with the next norm); float4 accesses when d allows, several in flight.
// Rows of up to NORM_VEC * 4 * blockDim floats keep their values (and the
// norm's weight, loaded before the previous kernel ends) in registers.
#define NORM_VEC 4
// one row (the block's): yr = rmsnorm(xr (+= tr)) * w; every norm kernel's arithmetic. nth: the threads
// that take part (the block's first; the others add zeros to the block's sum, which changes nothing), so
// that a block of another size computes a norm launch's numbers bitwise

__device__ __forceinline__ void rms_row_nt(float *yr, float *xr, const float *tr, const float *w, int64_t d, float eps,
                                           int add_one, float *sh, int nth) {
    const bool on = (int)threadIdx.x < nth;
    const int tid = on ? (int)threadIdx.x : 0;
    const bool vec = (d & 3) == 0 && d <= (int64_t)NORM_VEC * 4 * nth;
    float4 wv[NORM_VEC];
    if (vec) {
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int64_t i = tid + (int64_t)k * nth;
            wv[k] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (on && w && i < d / 4) {
                wv[k] = ld4(w + 4 * i);
                if (add_one) wv[k].x += 1.0f, wv[k].y += 1.0f, wv[k].z += 1.0f, wv[k].w += 1.0f;
            }
        }
    }
    pdl_wait();
    pdl_trigger();
    float ss = 0.0f;
    if (vec) {
        float4 xv[NORM_VEC];
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int64_t i = tid + (int64_t)k * nth;
            xv[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (on && i < d / 4) {
                xv[k] = ld4(xr + 4 * i);
                if (tr) {
                    const float4 u = ld4(tr + 4 * i);
                    xv[k].x = __fadd_rn(xv[k].x, u.x), xv[k].y = __fadd_rn(xv[k].y, u.y);
                    xv[k].z = __fadd_rn(xv[k].z, u.z), xv[k].w = __fadd_rn(xv[k].w, u.w);
                    reinterpret_cast<float4 *>(xr)[i] = xv[k];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) { // the same order as the loop below: a thread's elements in index order
            ss = __fmaf_rn(xv[k].x, xv[k].x, ss), ss = __fmaf_rn(xv[k].y, xv[k].y, ss);
            ss = __fmaf_rn(xv[k].z, xv[k].z, ss), ss = __fmaf_rn(xv[k].w, xv[k].w, ss);
        }
        ss = block_sum(ss, sh);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int64_t i = tid + (int64_t)k * nth;
            if (on && i < d / 4) {
                const float4 o = make_float4(xv[k].x * inv * wv[k].x, xv[k].y * inv * wv[k].y,
                                             xv[k].z * inv * wv[k].z, xv[k].w * inv * wv[k].w);
                reinterpret_cast<float4 *>(yr)[i] = o;
            }
        }
        return;
    }
    if ((d & 3) == 0) {
        const int64_t d4 = d / 4;
        for (int64_t i = tid; on && i < d4; i += nth) {
            float4 v = ld4(xr + 4 * i);
            if (tr) {
                const float4 u = ld4(tr + 4 * i);
                v.x = __fadd_rn(v.x, u.x), v.y = __fadd_rn(v.y, u.y), v.z = __fadd_rn(v.z, u.z), v.w = __fadd_rn(v.w, u.w);
                reinterpret_cast<float4 *>(xr)[i] = v;
            }
            ss = __fmaf_rn(v.x, v.x, ss), ss = __fmaf_rn(v.y, v.y, ss), ss = __fmaf_rn(v.z, v.z, ss), ss = __fmaf_rn(v.w, v.w, ss);
        }
    } else {
        for (int64_t i = tid; on && i < d; i += nth) {
            float v = xr[i];
            if (tr) v = __fadd_rn(v, tr[i]), xr[i] = v;
            ss = __fmaf_rn(v, v, ss);
        }
    }
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = tid; on && i < d; i += nth) {
        float m = w ? (add_one ? 1.0f + w[i] : w[i]) : 1.0f;
        yr[i] = xr[i] * inv * m;
    }
}

__device__ __forceinline__ void rms_row(float *yr, float *xr, const float *tr, const float *w, int64_t d, float eps,
                                        int add_one, float *sh) {
    rms_row_nt(yr, xr, tr, w, d, eps, add_one, sh, (int)blockDim.x);
}

// threads of a norm's block for rows of d (the block sum's order depends on it)
static inline int norm_threads(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : 64; }
