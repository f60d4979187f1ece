// backend/cuda/kernels: the CUDA backend's kernels (see kernels.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "kernels.h"

#define WARP 32

static inline int launch_status() { return (int)cudaGetLastError(); }

static inline unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// round to nearest even; NaN stays NaN (tensor.h's osp_f32_to_bf16)
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
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

// ---- matmul: a warp per weight row, tokens in tiles of TT held in registers ----

#define MM_WARPS 4
#define MM_TT 8

__device__ __forceinline__ float weight_at(const osp_cu_weight &w, const unsigned char *row, int64_t r, int64_t c,
                                           int64_t ng) {
    if (!w.qbits) return load_float(row, w.dtype, c);
    int64_t g = c / w.group;
    float s = load_float(w.scales, w.sdtype, r * ng + g), b = load_float(w.biases, w.sdtype, r * ng + g);
    return s * (float)q_code(row, w.qbits, c) + b;
}

__global__ void mm_kernel(osp_cu_weight w, const float *__restrict__ x, int64_t n, float *__restrict__ y,
                          int64_t ldy) {
    const int lane = threadIdx.x % WARP;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + threadIdx.x / WARP;
    if (r >= w.rows) return;
    const int64_t cols = w.cols, ng = w.qbits ? cols / w.group : 0;
    const int64_t row_bytes = w.qbits ? cols * w.qbits / 8 : cols * (w.dtype == 0 ? 4 : 2);
    const unsigned char *row = (const unsigned char *)w.data + r * row_bytes;
    for (int64_t t0 = 0; t0 < n; t0 += MM_TT) {
        float acc[MM_TT];
#pragma unroll
        for (int t = 0; t < MM_TT; t++) acc[t] = 0.0f;
        const int nt = n - t0 < MM_TT ? (int)(n - t0) : MM_TT;
        for (int64_t c = lane; c < cols; c += WARP) {
            float wv = weight_at(w, row, r, c, ng);
#pragma unroll
            for (int t = 0; t < MM_TT; t++)
                if (t < nt) acc[t] = __fmaf_rn(wv, x[(t0 + t) * cols + c], acc[t]);
        }
#pragma unroll
        for (int t = 0; t < MM_TT; t++) {
            float s = warp_sum(acc[t]);
            if (lane == 0 && t < nt) y[(t0 + t) * ldy + r] = s;
        }
    }
}

// ---- matvec: a warp per weight row streaming 16-byte chunks; up to MV_TT tokens share each chunk ----
//
// Each lane owns the chunks lane, lane + 32, ... of the row and accumulates
// them in that order, then the warp sums its lanes in a fixed tree: the same
// order for every token whatever the number of tokens in the call (batch
// invariance). Quantized chunks: s * sum(code * x) + b * sum(x) per group.

#define MV_WARPS 8
#define MV_TT 8

template <int KIND> struct mv_chunk; // KIND: 0 f32, 1 f16, 2 bf16, 4 q4, 8 q8

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }

// dot of a 16-byte weight chunk (holding E values) with x[c0 .. c0 + E)
template <int KIND> __device__ __forceinline__ float chunk_dot(uint4 w, const float *x, float s, float b);

// Explicit roundings (fma / mul / add intrinsics, never contracted
// differently per instantiation): a token's sum is the same whichever tile
// width NT the call was compiled for.
#define FMA __fmaf_rn
#define MUL __fmul_rn
#define ADD __fadd_rn

template <> __device__ __forceinline__ float chunk_dot<0>(uint4 w, const float *x, float, float) {
    float4 a = ld4(x);
    return FMA(__uint_as_float(w.w), a.w,
               FMA(__uint_as_float(w.z), a.z, FMA(__uint_as_float(w.y), a.y, MUL(__uint_as_float(w.x), a.x))));
}

__device__ __forceinline__ float dot2_bf16(uint32_t u, float x0, float x1, float acc) {
    return FMA(__uint_as_float(u & 0xffff0000u), x1, FMA(__uint_as_float(u << 16), x0, acc));
}

template <> __device__ __forceinline__ float chunk_dot<2>(uint4 w, const float *x, float, float) {
    float4 a = ld4(x), c = ld4(x + 4);
    float d = dot2_bf16(w.x, a.x, a.y, 0.0f);
    d = dot2_bf16(w.y, a.z, a.w, d);
    d = dot2_bf16(w.z, c.x, c.y, d);
    return dot2_bf16(w.w, c.z, c.w, d);
}

__device__ __forceinline__ float dot2_f16(uint32_t u, float x0, float x1, float acc) {
    __half2 h = *reinterpret_cast<__half2 *>(&u);
    float2 f = __half22float2(h);
    return FMA(f.y, x1, FMA(f.x, x0, acc));
}

template <> __device__ __forceinline__ float chunk_dot<1>(uint4 w, const float *x, float, float) {
    float4 a = ld4(x), c = ld4(x + 4);
    float d = dot2_f16(w.x, a.x, a.y, 0.0f);
    d = dot2_f16(w.y, a.z, a.w, d);
    d = dot2_f16(w.z, c.x, c.y, d);
    return dot2_f16(w.w, c.z, c.w, d);
}

// 8 codes of `bits` in u (LSB first) against x[0..8): cx += code * x, sx += x
__device__ __forceinline__ void q4_word(uint32_t u, const float *x, float &cx, float &sx) {
    float4 a = ld4(x), c = ld4(x + 4);
    const float v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        cx = FMA((float)((u >> (4 * k)) & 15u), v[k], cx);
        sx = ADD(sx, v[k]);
    }
}

template <> __device__ __forceinline__ float chunk_dot<4>(uint4 w, const float *x, float s, float b) {
    float cx = 0.0f, sx = 0.0f;
    q4_word(w.x, x, cx, sx);
    q4_word(w.y, x + 8, cx, sx);
    q4_word(w.z, x + 16, cx, sx);
    q4_word(w.w, x + 24, cx, sx);
    return FMA(b, sx, MUL(s, cx));
}

__device__ __forceinline__ void q8_word(uint32_t u, const float *x, float &cx, float &sx) {
    float4 a = ld4(x);
    const float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        cx = FMA((float)((u >> (8 * k)) & 255u), v[k], cx);
        sx = ADD(sx, v[k]);
    }
}

template <> __device__ __forceinline__ float chunk_dot<8>(uint4 w, const float *x, float s, float b) {
    float cx = 0.0f, sx = 0.0f;
    q8_word(w.x, x, cx, sx);
    q8_word(w.y, x + 4, cx, sx);
    q8_word(w.z, x + 8, cx, sx);
    q8_word(w.w, x + 12, cx, sx);
    return FMA(b, sx, MUL(s, cx));
}

template <int KIND> struct kind_traits {
    static const int E = KIND == 0 ? 4 : KIND == 1 || KIND == 2 ? 8 : KIND == 4 ? 32 : 16; // values per chunk
};

__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

template <int KIND, int NT>
__global__ void __launch_bounds__(MV_WARPS * WARP) mv_kernel(osp_cu_weight w, const float *__restrict__ x, int64_t n,
                                                             float *__restrict__ y, int64_t ldy) {
    constexpr int E = kind_traits<KIND>::E;
    const int lane = threadIdx.x % WARP;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + threadIdx.x / WARP;
    if (r >= w.rows) return;
    const int64_t cols = w.cols, nch = cols / E;
    const int64_t row_bytes = KIND == 4 ? cols / 2 : KIND == 8 ? cols : cols * (KIND == 0 ? 4 : 2);
    const uint4 *row = (const uint4 *)((const unsigned char *)w.data + r * row_bytes);
    const int64_t ng = KIND >= 4 ? cols / w.group : 0;
    for (int64_t t0 = 0; t0 < n; t0 += NT) {
        const int nt = n - t0 < NT ? (int)(n - t0) : NT;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        int64_t c = lane;
        // four chunks in flight per lane, then the remainder
        for (; c + 3 * WARP < nch; c += 4 * WARP) {
            uint4 wv[4];
            float sc[4], bi[4];
#pragma unroll
            for (int k = 0; k < 4; k++) wv[k] = ld_stream(row + c + k * WARP);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                sc[k] = bi[k] = 0.0f;
                if (KIND >= 4) {
                    int64_t g = (c + k * WARP) * E / w.group;
                    sc[k] = load_float(w.scales, w.sdtype, r * ng + g);
                    bi[k] = load_float(w.biases, w.sdtype, r * ng + g);
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < nt) acc[t] = ADD(acc[t], chunk_dot<KIND>(wv[k], x + (t0 + t) * cols + (c + k * WARP) * E, sc[k], bi[k]));
        }
        for (; c < nch; c += WARP) {
            uint4 wv = ld_stream(row + c);
            float sc = 0.0f, bi = 0.0f;
            if (KIND >= 4) {
                int64_t g = c * E / w.group;
                sc = load_float(w.scales, w.sdtype, r * ng + g);
                bi = load_float(w.biases, w.sdtype, r * ng + g);
            }
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] = ADD(acc[t], chunk_dot<KIND>(wv, x + (t0 + t) * cols + c * E, sc, bi));
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float sum = warp_sum(acc[t]);
            if (lane == 0 && t < nt) y[(t0 + t) * ldy + r] = sum;
        }
    }
}

template <int KIND>
static void mv_launch(osp_cu_stream st, const osp_cu_weight *w, const float *x, int64_t n, float *y, int64_t ldy) {
    unsigned g = blocks_for(w->rows, MV_WARPS);
    if (n == 1) mv_kernel<KIND, 1><<<g, MV_WARPS * WARP, 0, st>>>(*w, x, n, y, ldy);
    else if (n == 2) mv_kernel<KIND, 2><<<g, MV_WARPS * WARP, 0, st>>>(*w, x, n, y, ldy);
    else if (n <= 4) mv_kernel<KIND, 4><<<g, MV_WARPS * WARP, 0, st>>>(*w, x, n, y, ldy);
    else mv_kernel<KIND, MV_TT><<<g, MV_WARPS * WARP, 0, st>>>(*w, x, n, y, ldy);
}

// the chunked kernels' layout: 16-byte aligned rows of whole chunks, groups of whole chunks
static int mv_kind(const osp_cu_weight *w) {
    if (((uintptr_t)w->data & 15) != 0) return -1;
    if (!w->qbits) {
        int e = w->dtype == 0 ? 4 : 8;
        return w->cols % e == 0 ? w->dtype : -1;
    }
    int e = w->qbits == 4 ? 32 : w->qbits == 8 ? 16 : 0;
    if (!e || w->cols % e || w->group % e) return -1;
    return w->qbits;
}

extern "C" int osp_cu_matmul(osp_cu_stream st, const osp_cu_weight *w, const float *x, int64_t n, float *y,
                             int64_t ldy) {
    if (n <= 0 || w->rows <= 0) return 0;
    // A token's result must not depend on n: the kernel is chosen by the weight alone.
    switch (mv_kind(w)) {
    case 0: mv_launch<0>(st, w, x, n, y, ldy); break;
    case 1: mv_launch<1>(st, w, x, n, y, ldy); break;
    case 2: mv_launch<2>(st, w, x, n, y, ldy); break;
    case 4: mv_launch<4>(st, w, x, n, y, ldy); break;
    case 8: mv_launch<8>(st, w, x, n, y, ldy); break;
    default: mm_kernel<<<blocks_for(w->rows, MM_WARPS), MM_WARPS * WARP, 0, st>>>(*w, x, n, y, ldy);
    }
    return launch_status();
}

// ---- the read-bandwidth probe: every byte of the buffer read once ----

__global__ void read_kernel(const uint4 *__restrict__ p, int64_t n, unsigned *out) {
    uint32_t acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride), c = ld_stream(p + i + 2 * stride),
              d = ld_stream(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = ld_stream(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) atomicAdd(out, 1u); // keeps the loads; practically never taken
}

extern "C" int osp_cu_read_probe(osp_cu_stream st, const void *buf, int64_t bytes, unsigned *sink, int sms) {
    read_kernel<<<(unsigned)(sms * 8), 256, 0, st>>>((const uint4 *)buf, bytes / 16, sink);
    return launch_status();
}

// ---- row operations ----

#define NORM_THREADS 256

// the block's sum of v in a fixed tree order
__device__ float block_sum(float v, float *sh) {
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

__device__ float block_max(float v, float *sh) {
    v = warp_max(v);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        v = warp_max(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int64_t d, float eps, int add_one) {
    __shared__ float sh[32];
    const float *xr = x + blockIdx.x * d;
    float *yr = y + blockIdx.x * d;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float m = w ? (add_one ? 1.0f + w[i] : w[i]) : 1.0f;
        yr[i] = xr[i] * inv * m;
    }
}

extern "C" int osp_cu_rmsnorm(osp_cu_stream st, float *y, const float *x, const float *w, int64_t n, int64_t d,
                              float eps, int add_one) {
    if (n <= 0) return 0;
    int th = d >= 256 ? 256 : d >= 128 ? 128 : 64;
    for (int64_t r0 = 0; r0 < n; r0 += 65535) {
        int64_t k = n - r0 < 65535 ? n - r0 : 65535;
        rmsnorm_kernel<<<(unsigned)k, th, 0, st>>>(y + r0 * d, x + r0 * d, w, d, eps, add_one);
    }
    return launch_status();
}

__global__ void add_kernel(float *y, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void add_bias_kernel(float *y, const float *b, int64_t n, int64_t d) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] += b[i % d];
}

__global__ void scale_kernel(float *y, float a, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= a;
}

__global__ void mul_vec_kernel(float *y, const float *v, float a, int64_t n, int64_t d) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] = y[i] * v[i % d] * a;
}

__global__ void act_mul_kernel(int act, float *y, const float *g, const float *u, int64_t n, int64_t d,
                               int64_t ld_u) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    int64_t r = i / d, j = i % d;
    float gv = g[i], uv = u[r * ld_u + j];
    if (act == 0) {
        y[i] = gv / (1.0f + expf(-gv)) * uv;
    } else {
        const float k = 0.7978845608028654f; // sqrt(2/pi)
        y[i] = 0.5f * gv * (1.0f + tanhf(k * (gv + 0.044715f * gv * gv * gv))) * uv;
    }
}

__global__ void softcap_kernel(float *x, int64_t n, float cap) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

#define EW 256

extern "C" int osp_cu_add(osp_cu_stream st, float *y, const float *x, int64_t n) {
    if (n > 0) add_kernel<<<blocks_for(n, EW), EW, 0, st>>>(y, x, n);
    return launch_status();
}

extern "C" int osp_cu_add_bias(osp_cu_stream st, float *y, const float *b, int64_t n, int64_t d) {
    if (n * d > 0) add_bias_kernel<<<blocks_for(n * d, EW), EW, 0, st>>>(y, b, n, d);
    return launch_status();
}

extern "C" int osp_cu_scale(osp_cu_stream st, float *y, float a, int64_t n) {
    if (n > 0) scale_kernel<<<blocks_for(n, EW), EW, 0, st>>>(y, a, n);
    return launch_status();
}

extern "C" int osp_cu_mul_vec(osp_cu_stream st, float *y, const float *v, float a, int64_t n, int64_t d) {
    if (n * d > 0) mul_vec_kernel<<<blocks_for(n * d, EW), EW, 0, st>>>(y, v, a, n, d);
    return launch_status();
}

extern "C" int osp_cu_act_mul(osp_cu_stream st, int act, float *y, const float *g, const float *u, int64_t n,
                              int64_t d, int64_t ld_u) {
    if (n * d > 0) act_mul_kernel<<<blocks_for(n * d, EW), EW, 0, st>>>(act, y, g, u, n, d, ld_u);
    return launch_status();
}

extern "C" int osp_cu_softcap(osp_cu_stream st, float *x, int64_t n, float cap) {
    if (n > 0) softcap_kernel<<<blocks_for(n, EW), EW, 0, st>>>(x, n, cap);
    return launch_status();
}

// one thread per (row, head, pair)
__global__ void rope_kernel(float *x, int32_t T, int64_t heads, int32_t D, const float *inv, const int32_t *pos,
                            int64_t total) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int32_t h2 = D / 2;
    int64_t pair = i % h2, vec = i / h2; // vec = row * heads + head
    int64_t row = vec / heads;
    int32_t b = (int32_t)(row / T), t = (int32_t)(row % T);
    float a = (float)(pos[b] + t) * inv[pair];
    float c = cosf(a), s = sinf(a);
    float *v = x + vec * D;
    float x1 = v[pair], x2 = v[pair + h2];
    v[pair] = x1 * c - x2 * s;
    v[pair + h2] = x2 * c + x1 * s;
}

extern "C" int osp_cu_rope(osp_cu_stream st, float *x, int32_t B, int32_t T, int64_t heads, int32_t D,
                           const float *inv, const int32_t *pos) {
    int64_t total = (int64_t)B * T * heads * (D / 2);
    if (total > 0) rope_kernel<<<blocks_for(total, EW), EW, 0, st>>>(x, T, heads, D, inv, pos, total);
    return launch_status();
}

__global__ void gather_kernel(float *dst, const float *src, const int32_t *rows, int64_t n, int64_t H) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * H) dst[i] = src[(int64_t)rows[i / H] * H + i % H];
}

__global__ void scatter_axpy_kernel(float *out, const float *acc, const int32_t *rows, const float *w, int64_t n,
                                    int64_t H) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * H) return;
    int64_t r = i / H, j = i % H;
    out[(int64_t)rows[r] * H + j] += w[r] * acc[i];
}

extern "C" int osp_cu_gather(osp_cu_stream st, float *dst, const float *src, const int32_t *rows, int64_t n,
                             int64_t H) {
    if (n * H > 0) gather_kernel<<<blocks_for(n * H, EW), EW, 0, st>>>(dst, src, rows, n, H);
    return launch_status();
}

extern "C" int osp_cu_scatter_axpy(osp_cu_stream st, float *out, const float *acc, const int32_t *rows,
                                   const float *w, int64_t n, int64_t H) {
    if (n * H > 0) scatter_axpy_kernel<<<blocks_for(n * H, EW), EW, 0, st>>>(out, acc, rows, w, n, H);
    return launch_status();
}

// ---- the KV cache (kv/kv.h's block layout) ----

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
__device__ void quantize_group(const float *x, int group, int bits, uint8_t *codes, float *scale_out,
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

// a block per (batch row i, token t, head h); thread 0 quantizes (exactness over speed: a KV vector is small)
__global__ void kv_write_kernel(osp_cu_kvlayer L, const osp_cu_kvrow *rows, int32_t T, int32_t t0, const float *k,
                                const float *v) {
    const int32_t i = blockIdx.x, t = t0 + blockIdx.y, h = blockIdx.z;
    const osp_cu_kvrow R = rows[i];
    const int64_t H = L.n_kv_heads, D = L.head_dim, cap = R.cap;
    const int32_t slot = kv_slot(L, R.pos + t);
    const int64_t src = ((int64_t)i * T + t) * H * D + (int64_t)h * D;
    for (int which = 0; which < 2; which++) {
        const float *x = (which ? v : k) + src;
        if (L.bits == 0) {
            float *dst = (float *)R.mem + ((which * H + h) * cap + slot) * D;
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = x[d];
            continue;
        }
        unsigned char *base = R.mem + (int64_t)which * H * cap * L.slot_bytes;
        const int64_t vi = (int64_t)h * cap + slot;
        unsigned char *codes = base + vi * L.cb;
        if (L.bits == 16) {
            for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ((uint16_t *)codes)[d] = f32_to_bf16(x[d]);
            continue;
        }
        if (threadIdx.x != 0) continue;
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
}

extern "C" int osp_cu_kv_write(osp_cu_stream st, const osp_cu_kvlayer *L, const osp_cu_kvrow *rows, int32_t nb,
                               int32_t T, const float *k, const float *v) {
    int32_t t0 = L->sliding && T > L->ring ? T - L->ring : 0; // older ones would be overwritten anyway
    if (nb <= 0 || T - t0 <= 0) return 0;
    dim3 grid((unsigned)nb, (unsigned)(T - t0), (unsigned)L->n_kv_heads);
    kv_write_kernel<<<grid, 64, 0, st>>>(*L, rows, T, t0, k, v);
    return launch_status();
}

// ---- attention: a block per (query, head), online softmax over positions in blocks of ATT_T ----

#define ATT_T 128
#define ATT_MAXD 512

__global__ void attention_kernel(osp_cu_attn a) {
    __shared__ float qs[ATT_MAXD];
    __shared__ float ps[ATT_T];
    __shared__ float sh[32];
    const int64_t row = blockIdx.x; // b * T + t
    const int32_t h = blockIdx.y, b = (int32_t)(row / a.T), t = (int32_t)(row % a.T);
    const osp_cu_kvlayer &L = a.L;
    const int32_t D = L.head_dim, Hq = a.n_heads, Hkv = L.n_kv_heads, hk = h / (Hq / Hkv);
    const osp_cu_kvrow R = a.rows[b];
    const int32_t pos0 = R.pos, p = pos0 + t;
    const int32_t lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    const float *q = a.q + (row * Hq + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[d];
    __syncthreads();
    const int NDT = ATT_MAXD / ATT_T; // output dims per thread
    float acc[NDT];
#pragma unroll
    for (int k = 0; k < NDT; k++) acc[k] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int32_t j0 = lo; j0 <= p; j0 += ATT_T) {
        const int32_t j = j0 + threadIdx.x;
        float s = -INFINITY;
        if (j <= p) {
            float dot = 0.0f;
            if (j < pos0) {
                const int32_t slot = kv_slot(L, j);
                for (int d = 0; d < D; d++) dot += qs[d] * kv_value(L, R, 0, hk, slot, d);
            } else {
                const float *kr = a.k + (((int64_t)b * a.T + (j - pos0)) * Hkv + hk) * D;
                for (int d = 0; d < D; d++) dot += qs[d] * kr[d];
            }
            s = a.softcap > 0 ? a.softcap * tanhf(dot * a.scale / a.softcap) : dot * a.scale;
        }
        const float mb = block_max(s, sh), mn = fmaxf(m, mb);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        const float e = j <= p ? expf(s - mn) : 0.0f;
        ps[threadIdx.x] = e;
        const float bsum = block_sum(e, sh);
        sum = sum * corr + bsum;
        m = mn;
        const int32_t nj = p - j0 + 1 < ATT_T ? p - j0 + 1 : ATT_T;
#pragma unroll
        for (int k = 0; k < NDT; k++) {
            const int d = threadIdx.x + k * ATT_T;
            if (d >= D) continue;
            float o = acc[k] * corr;
            for (int32_t jj = 0; jj < nj; jj++) {
                const int32_t jp = j0 + jj;
                float vv;
                if (jp < pos0) vv = kv_value(L, R, 1, hk, kv_slot(L, jp), d);
                else vv = a.v[(((int64_t)b * a.T + (jp - pos0)) * Hkv + hk) * D + d];
                o += ps[jj] * vv;
            }
            acc[k] = o;
        }
        __syncthreads();
    }
    float *out = a.out + (row * Hq + h) * D;
#pragma unroll
    for (int k = 0; k < NDT; k++) {
        const int d = threadIdx.x + k * ATT_T;
        if (d < D) out[d] = acc[k] / sum;
    }
}

extern "C" int osp_cu_attention(osp_cu_stream st, const osp_cu_attn *a) {
    if (a->L.head_dim > ATT_MAXD) return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)((int64_t)a->nb * a->T), (unsigned)a->n_heads);
    attention_kernel<<<grid, ATT_T, 0, st>>>(*a);
    return launch_status();
}

// ---- conversions for the tensor-core GEMMs (production prefill) ----

__global__ void to_bf16_kernel(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f32_to_bf16(src[i]);
}

extern "C" int osp_cu_to_bf16(osp_cu_stream st, uint16_t *dst, const float *src, int64_t n) {
    if (n > 0) to_bf16_kernel<<<blocks_for(n, EW), EW, 0, st>>>(dst, src, n);
    return launch_status();
}

// one thread per weight element (any dtype or code width), rounded to bf16
__global__ void weight_bf16_kernel(osp_cu_weight w, uint16_t *dst) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w.rows * w.cols) return;
    const int64_t r = i / w.cols, c = i % w.cols, ng = w.qbits ? w.cols / w.group : 0;
    const int64_t row_bytes = w.qbits ? w.cols * w.qbits / 8 : w.cols * (w.dtype == 0 ? 4 : 2);
    dst[i] = f32_to_bf16(weight_at(w, (const unsigned char *)w.data + r * row_bytes, r, c, ng));
}

extern "C" int osp_cu_weight_to_bf16(osp_cu_stream st, const osp_cu_weight *w, uint16_t *dst) {
    int64_t n = w->rows * w->cols;
    if (n > 0) weight_bf16_kernel<<<blocks_for(n, EW), EW, 0, st>>>(*w, dst);
    return launch_status();
}
