// backend/cuda/kernels_encdec: the encoder-decoder operations' kernels
// (model/whisper.c through backend/cuda/encdec.c; see kernels.h). f32
// arithmetic (LayerNorm's statistics in double, as on the CPU); a row's
// numbers never depend on how many rows share the call.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "kernels.h"
#include "launch.cuh"

#define EW 256   // threads of the element-wise kernels
#define AT 128   // threads of the attention kernels
#define FQ 4     // queries per block of the full attention

static inline int launch_status() { return (int)cudaGetLastError(); }
static inline unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

// a launch without programmatic dependent launch
template <typename... K, typename... A>
static void launch(void (*k)(K...), dim3 grid, dim3 block, size_t shm, osp_cu_stream st, A &&...args) {
    osp_cu_launch(k, grid, block, shm, (cudaStream_t)st, 0, std::forward<A>(args)...);
}

__device__ __forceinline__ float wsum32(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float wmax32(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// block-wide reductions (blockDim a multiple of 32, at most 1024); every thread gets the result
__device__ float bsum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = wsum32(v);
    __syncthreads();
    if (!lane) sh[w] = v;
    __syncthreads();
    float r = 0.0f;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}

__device__ float bmax(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = wmax32(v);
    __syncthreads();
    if (!lane) sh[w] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int i = 0; i < nw; i++) r = fmaxf(r, sh[i]);
    return r;
}

__device__ double bsumd(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (!lane) sh[w] = v;
    __syncthreads();
    double r = 0.0;
    for (int i = 0; i < nw; i++) r += sh[i];
    return r;
}

// ---- LayerNorm: a block per row ----

__global__ void layernorm_kernel(float *y, const float *x, const float *w, const float *b, int64_t d, float eps) {
    __shared__ double sh[32];
    const float *xr = x + blockIdx.x * d;
    float *yr = y + blockIdx.x * d;
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
    const double mean = bsumd(s, sh) / (double)d;
    double v = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        const double c = xr[i] - mean;
        v += c * c;
    }
    const double var = bsumd(v, sh);
    const float inv = (float)(1.0 / sqrt(var / (double)d + (double)eps));
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        yr[i] = __fadd_rn(__fmul_rn(__fmul_rn((float)(xr[i] - mean), inv), w[i]), b[i]);
}

extern "C" int osp_cu_layernorm(osp_cu_stream st, float *y, const float *x, const float *w, const float *b, int64_t n,
                                int64_t d, float eps) {
    for (int64_t r0 = 0; r0 < n; r0 += 65535) {
        int64_t k = n - r0 < 65535 ? n - r0 : 65535;
        launch(layernorm_kernel, (unsigned)k, 128, 0, st, y + r0 * d, x + r0 * d, w, b, d, eps);
    }
    return launch_status();
}

// ---- the exact GELU ----

__global__ void gelu_kernel(float *x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    x[i] = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, erff(__fmul_rn(v, (float)M_SQRT1_2))));
}

extern "C" int osp_cu_gelu(osp_cu_stream st, float *x, int64_t n) {
    if (n > 0) launch(gelu_kernel, blocks_for(n, EW), EW, 0, st, x, n);
    return launch_status();
}

// ---- im2col: a thread per column element ----

__global__ void im2col_kernel(float *col, const float *x, int64_t C, int64_t t_in, int64_t t_out, int64_t ld_c,
                              int64_t ld_f, int k, int stride, int pad, int k_major) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, w = C * k;
    if (i >= t_out * w) return;
    const int64_t t = i / w, r = i % w;
    const int64_t ci = k_major ? r % C : r / k, j = k_major ? r / C : r % k;
    const int64_t src = (int64_t)stride * t + j - pad;
    col[i] = src >= 0 && src < t_in ? x[ci * ld_c + src * ld_f] : 0.0f;
}

extern "C" int osp_cu_im2col(osp_cu_stream st, float *col, const float *x, int64_t C, int64_t t_in, int64_t t_out,
                             int64_t ld_c, int64_t ld_f, int k, int stride, int pad, int k_major) {
    const int64_t n = t_out * C * k;
    if (n > 0) launch(im2col_kernel, blocks_for(n, EW), EW, 0, st, col, x, C, t_in, t_out, ld_c, ld_f, k, stride, pad, k_major);
    return launch_status();
}

// ---- K/V of a window packed per head: kh [heads][S][hd], vt [heads][hd][S] ----

__global__ void pack_kv_kernel(float *kh, float *vt, const float *k, const float *v, int64_t S, int64_t ld, int hd) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S * ld) return;
    const int64_t j = i / ld, c = i % ld, h = c / hd, e = c % hd;
    kh[(h * S + j) * hd + e] = k[i];
    vt[(h * hd + e) * S + j] = v[i];
}

extern "C" int osp_cu_pack_kv(osp_cu_stream st, float *kh, float *vt, const float *k, const float *v, int64_t S,
                              int64_t ld, int heads, int hd) {
    (void)heads; // ld = heads · hd
    if (S * ld > 0) launch(pack_kv_kernel, blocks_for(S * ld, EW), EW, 0, st, kh, vt, k, v, S, ld, hd);
    return launch_status();
}

// ---- full attention: a block per (FQ queries, head); the FQ rows of S
// scores in shared memory; softmax as the CPU's (max-subtracted, f32 sum,
// normalized), then a warp per output element sums p·Vᵀ row ----

__global__ void __launch_bounds__(AT) full_attn_kernel(const float *q, const float *kh, const float *vt, float *out,
                                                       int64_t n, int64_t S, int64_t ld, int hd) {
    OSP_DYN_SHARED(float, sm);
    __shared__ float red[32];
    float *qs = sm, *sc = sm + FQ * hd; // [FQ][hd], [FQ][S]
    const int64_t h = blockIdx.y, i0 = (int64_t)blockIdx.x * FQ;
    const int nq = n - i0 < FQ ? (int)(n - i0) : FQ;
    const float *K = kh + h * S * hd, *Vt = vt + h * hd * S;
    for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) qs[e] = q[(i0 + e / hd) * ld + h * hd + e % hd];
    __syncthreads();
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
        const float *kr = K + j * hd;
        float acc[FQ];
        for (int r = 0; r < FQ; r++) acc[r] = 0.0f;
        for (int e = 0; e < hd; e++) {
            const float kv = kr[e];
            for (int r = 0; r < FQ; r++) acc[r] = __fmaf_rn(qs[r * hd + e], kv, acc[r]);
        }
        for (int r = 0; r < nq; r++) sc[r * S + j] = acc[r];
    }
    __syncthreads();
    for (int r = 0; r < nq; r++) {
        float *p = sc + r * S;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x) mx = fmaxf(mx, p[j]);
        mx = bmax(mx, red);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
            const float e = expf(p[j] - mx);
            p[j] = e;
            sum += e;
        }
        sum = bsum(sum, red);
        const float inv = 1.0f / sum;
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x) p[j] *= inv;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = wp; o < nq * hd; o += nw) {
        const int r = o / hd, e = o % hd;
        const float *p = sc + r * S, *vr = Vt + (int64_t)e * S;
        float acc = 0.0f;
        for (int64_t j = lane; j < S; j += 32) acc = __fmaf_rn(p[j], vr[j], acc);
        acc = wsum32(acc);
        if (!lane) out[(i0 + r) * ld + h * hd + e] = acc;
    }
}

extern "C" int64_t osp_cu_full_attention_smem(int64_t S, int hd) { return (int64_t)sizeof(float) * FQ * (S + hd); }

extern "C" int osp_cu_full_attention(osp_cu_stream st, const float *q, const float *kh, const float *vt, float *out,
                                     int64_t n, int64_t S, int64_t ld, int heads, int hd) {
    const int64_t smem = osp_cu_full_attention_smem(S, hd);
    if (smem > 48 * 1024) {
        int e = (int)cudaFuncSetAttribute(full_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e) return e;
    }
    if (n > 0) launch(full_attn_kernel, dim3(blocks_for(n, FQ), (unsigned)heads), AT, (size_t)smem, st, q, kh, vt, out, n, S, ld, hd);
    return launch_status();
}

// ---- one head's scores (before the softmax): a block per query ----

__global__ void full_scores_kernel(float *out, const float *q, const float *kh, int64_t S, int64_t ld, int head,
                                   int hd) {
    const float *qr = q + blockIdx.x * ld + (int64_t)head * hd, *K = kh + (int64_t)head * S * hd;
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
        float acc = 0.0f;
        for (int e = 0; e < hd; e++) acc = __fmaf_rn(qr[e], K[j * hd + e], acc);
        out[blockIdx.x * S + j] = acc;
    }
}

extern "C" int osp_cu_full_scores(osp_cu_stream st, float *out, const float *q, const float *kh, int64_t n, int64_t S,
                                  int64_t ld, int head, int hd) {
    if (n > 0) launch(full_scores_kernel, (unsigned)n, AT, 0, st, out, q, kh, S, ld, head, hd);
    return launch_status();
}

// ---- the decoder's per-row caches [rows][ctx][ld] ----

__global__ void rows_store_kernel(float *kc, float *vc, const float *k, const float *v, const int32_t *row,
                                  const int32_t *pos, int64_t n, int64_t ctx, int64_t ld) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * ld) return;
    const int64_t t = i / ld, c = i % ld, at = ((int64_t)row[t] * ctx + pos[t]) * ld + c;
    kc[at] = k[i];
    vc[at] = v[i];
}

extern "C" int osp_cu_rows_store(osp_cu_stream st, float *kc, float *vc, const float *k, const float *v,
                                 const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld) {
    if (n * ld > 0) launch(rows_store_kernel, blocks_for(n * ld, EW), EW, 0, st, kc, vc, k, v, row, pos, n, ctx, ld);
    return launch_status();
}

// a block per (token, head): the pos + 1 scores in shared memory, softmax, then a thread per output element
__global__ void __launch_bounds__(AT) rows_attn_kernel(const float *q, const float *K, const float *V, float *out,
                                                       const int32_t *row, const int32_t *pos, int64_t ctx,
                                                       int64_t ld, int hd) {
    OSP_DYN_SHARED(float, sm);
    __shared__ float red[32];
    const int64_t i = blockIdx.x, h = blockIdx.y, keys = (int64_t)pos[i] + 1;
    float *qs = sm, *p = sm + hd;
    const int64_t base = (int64_t)row[i] * ctx * ld + h * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) qs[e] = q[i * ld + h * hd + e];
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
        const float *kr = K + base + j * ld;
        float acc = 0.0f;
        for (int e = 0; e < hd; e++) acc = __fmaf_rn(qs[e], kr[e], acc);
        p[j] = acc;
        mx = fmaxf(mx, acc);
    }
    mx = bmax(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
        const float e = expf(p[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = bsum(sum, red);
    const float inv = 1.0f / sum;
    __syncthreads();
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        const float *vc = V + base + e;
        float acc = 0.0f;
        for (int64_t j = 0; j < keys; j++) acc = __fmaf_rn(p[j] * inv, vc[j * ld], acc);
        out[i * ld + h * hd + e] = acc;
    }
}

extern "C" int osp_cu_rows_attention(osp_cu_stream st, const float *q, const float *K, const float *V, float *out,
                                     const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld,
                                     int heads, int hd) {
    const size_t smem = sizeof(float) * (size_t)(ctx + hd);
    if (smem > 48 * 1024) return (int)cudaErrorInvalidValue; // ctx is at most 4096 (the model checks)
    if (n > 0) launch(rows_attn_kernel, dim3((unsigned)n, (unsigned)heads), AT, smem, st, q, K, V, out, row, pos, ctx, ld, hd);
    return launch_status();
}
