// backend/cuda/kernels_encdec: the encoder-decoder operations' kernels
// (model/whisper.c through backend/cuda/encdec.c; see kernels.h). f32
// arithmetic (LayerNorm's statistics in double, as on the CPU); a row's
// numbers never depend on how many rows share the call.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "kernels.h"
#include "launch.cuh"
#include "mma.cuh"

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

// a block's softmax of p[0..n) in place, as the CPU's: max-subtracted, f32 sum, normalized (-inf gives 0)
__device__ void block_softmax(float *p, int64_t n, float *red) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, p[j]);
    mx = bmax(mx, red);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = expf(p[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = bsum(sum, red);
    const float inv = 1.0f / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) p[j] *= inv;
}

// ---- LayerNorm ----

#define LN_T 256 // threads a row of the LayerNorm
#define LN_V 8   // values a thread holds (a row of up to LN_T * LN_V in registers; past that, read again)

// the block's sum of v in double (every thread gets it)
__device__ double ln_sum(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (!lane) sh[w] = v;
    __syncthreads();
    double r = 0.0;
    for (int i = 0; i < LN_T / 32; i++) r += sh[i];
    return r;
}

// a block per row, its values loaded at once into registers (a decode step's one-row call is bound by the
// latency of its loads and reductions, not by its bytes); mean and variance summed in double, as the CPU's
__global__ void __launch_bounds__(LN_T) layernorm_kernel(float *y, const float *x, const float *w, const float *b,
                                                         int64_t d, float eps) {
    __shared__ double sh[LN_T / 32];
    const float *xr = x + blockIdx.x * d;
    float *yr = y + blockIdx.x * d;
    float v[LN_V];
#pragma unroll
    for (int k = 0; k < LN_V; k++) {
        const int64_t i = threadIdx.x + (int64_t)LN_T * k;
        v[k] = i < d ? xr[i] : 0.0f;
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < LN_V; k++) s += v[k];
    for (int64_t i = threadIdx.x + (int64_t)LN_T * LN_V; i < d; i += LN_T) s += xr[i];
    const double mean = ln_sum(s, sh) / (double)d;
    double q = 0.0;
#pragma unroll
    for (int k = 0; k < LN_V; k++)
        if (threadIdx.x + (int64_t)LN_T * k < d) {
            const double c = v[k] - mean;
            q += c * c;
        }
    for (int64_t i = threadIdx.x + (int64_t)LN_T * LN_V; i < d; i += LN_T) {
        const double c = xr[i] - mean;
        q += c * c;
    }
    const float inv = (float)(1.0 / sqrt(ln_sum(q, sh) / (double)d + (double)eps));
#pragma unroll
    for (int k = 0; k < LN_V; k++) {
        const int64_t i = threadIdx.x + (int64_t)LN_T * k;
        if (i < d) yr[i] = __fadd_rn(__fmul_rn(__fmul_rn((float)(v[k] - mean), inv), w[i]), b[i]);
    }
    for (int64_t i = threadIdx.x + (int64_t)LN_T * LN_V; i < d; i += LN_T)
        yr[i] = __fadd_rn(__fmul_rn(__fmul_rn((float)(xr[i] - mean), inv), w[i]), b[i]);
}

extern "C" int osp_cu_layernorm(osp_cu_stream st, float *y, const float *x, const float *w, const float *b, int64_t n,
                                int64_t d, float eps) {
    for (int64_t r0 = 0; r0 < n; r0 += 65535) {
        int64_t k = n - r0 < 65535 ? n - r0 : 65535;
        launch(layernorm_kernel, (unsigned)k, LN_T, 0, st, y + r0 * d, x + r0 * d, w, b, d, eps);
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
    for (int r = 0; r < nq; r++) block_softmax(sc + r * S, S, red);
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

// ---- bidirectional attention (osp_bidir_attn_args: EmbeddingGemma): a block per (FQ queries, query head, row) ----
//
// Query t of row b sees the keys j < len of its row with |t - j| < radius (radius 0: all of them); query head h
// reads KV head h / group. K and V are read as the projections wrote them ([b·T + j][the KV head's columns]). The
// block's scores over the union of its queries' key ranges sit in shared memory, each query's keys outside its own
// range masked; then the CPU's order of operations: q·k, times scale, the soft-cap, the softmax (max-subtracted,
// f32 sum, normalized), and a thread per output element sums p·V over the keys in order (neighbouring threads read
// neighbouring values of a V row). A query that sees no key gets zeros.

// the keys query t of a row of len positions sees: [*lo, *hi)
__device__ __forceinline__ void bidir_range(int64_t t, int64_t len, int radius, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = len;
    if (radius > 0) {
        *lo = t - radius + 1 > 0 ? t - radius + 1 : 0;
        *hi = t + radius < len ? t + radius : len;
    }
}

__global__ void __launch_bounds__(AT) bidir_attn_kernel(const float *q, const float *k, const float *v, float *out,
                                                        const int32_t *lens, int64_t T, int heads, int kv_heads,
                                                        int hd, int radius, int64_t span, float scale, float softcap) {
    OSP_DYN_SHARED(float, sm);
    __shared__ float red[32];
    const int64_t b = blockIdx.z, h = blockIdx.y, t0 = (int64_t)blockIdx.x * FQ;
    const int nq = T - t0 < FQ ? (int)(T - t0) : FQ;
    const int64_t len = lens ? lens[b] : T, ldq = (int64_t)heads * hd, ldk = (int64_t)kv_heads * hd;
    const int64_t hk = h / (heads / kv_heads);
    float *qs = sm, *sc = sm + FQ * hd; // [FQ][hd], [FQ][span]
    int64_t lo, hi, lo1, hi1;           // the block's keys: the first query's lo to the last's hi
    bidir_range(t0, len, radius, &lo, &hi1);
    bidir_range(t0 + nq - 1, len, radius, &lo1, &hi);
    const int64_t nk = hi > lo ? hi - lo : 0; // at most span
    const float *K = k + b * T * ldk + hk * hd, *V = v + b * T * ldk + hk * hd;
    for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) qs[e] = q[(b * T + t0 + e / hd) * ldq + h * hd + e % hd];
    __syncthreads();
    for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) {
        const float *kr = K + (lo + j) * ldk;
        float acc[FQ];
        for (int r = 0; r < FQ; r++) acc[r] = 0.0f;
        for (int e = 0; e < hd; e++) {
            const float kv = kr[e];
            for (int r = 0; r < FQ; r++) acc[r] = __fmaf_rn(qs[r * hd + e], kv, acc[r]);
        }
        for (int r = 0; r < nq; r++) {
            int64_t a, z;
            bidir_range(t0 + r, len, radius, &a, &z);
            float x = __fmul_rn(acc[r], scale);
            if (softcap > 0.0f) x = __fmul_rn(softcap, tanhf(__fdiv_rn(x, softcap)));
            sc[r * span + j] = lo + j >= a && lo + j < z ? x : -INFINITY;
        }
    }
    __syncthreads();
    for (int r = 0; r < nq; r++) {
        int64_t a, z;
        bidir_range(t0 + r, len, radius, &a, &z);
        if (z <= a) continue; // (the same for every thread of the block)
        block_softmax(sc + r * span, nk, red); // a masked key's score is -inf: 0
    }
    __syncthreads();
    for (int o = threadIdx.x; o < nq * hd; o += blockDim.x) {
        const int r = o / hd, e = o % hd;
        int64_t a, z;
        bidir_range(t0 + r, len, radius, &a, &z);
        const float *p = sc + r * span;
        float acc = 0.0f;
        for (int64_t j = a; j < z; j++) acc = __fmaf_rn(p[j - lo], V[j * ldk + e], acc);
        out[(b * T + t0 + r) * ldq + h * hd + e] = acc;
    }
}

// the keys a block's queries see together, at most
static int64_t bidir_span(int64_t T, int radius) {
    const int64_t w = (int64_t)FQ - 1 + 2 * (int64_t)radius - 1;
    return radius > 0 && w < T ? w : T;
}

extern "C" int64_t osp_cu_bidir_attention_smem(int64_t T, int hd, int radius) {
    return (int64_t)sizeof(float) * FQ * (bidir_span(T, radius) + hd);
}

extern "C" int osp_cu_bidir_attention(osp_cu_stream st, const float *q, const float *k, const float *v, float *out,
                                      const int32_t *lens, int nb, int64_t T, int heads, int kv_heads, int hd,
                                      int radius, float scale, float softcap) {
    if (nb <= 0 || T <= 0) return launch_status();
    if (kv_heads <= 0 || heads % kv_heads) return (int)cudaErrorInvalidValue;
    const int64_t span = bidir_span(T, radius), smem = osp_cu_bidir_attention_smem(T, hd, radius);
    if (smem > 48 * 1024) {
        int e = (int)cudaFuncSetAttribute(bidir_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e) return e;
    }
    launch(bidir_attn_kernel, dim3(blocks_for(T, FQ), (unsigned)heads, (unsigned)nb), AT, (size_t)smem, st, q, k, v,
           out, lens, T, heads, kv_heads, hd, radius, span, scale, softcap);
    return launch_status();
}

// ---- the production path's full attention on the tensor cores ----
//
// A block of 8 warps takes 128 queries (16 a warp) of one head over a range of keys, in tiles of 64 keys staged
// in shared memory as bf16 (K as [key][e], V as [e][key], each row padded by 8 so that a quad's fragment loads
// fall in distinct banks). Q·Kᵀ and P·V are mma.sync m16n8k16 (bf16 operands, f32 sums), with the softmax online
// (a running max and sum per row, f32). A whole window's self-attention (osp_full_attn_args.whole) takes all the
// keys in one pass and writes its rows. Otherwise the keys are fixed splits of FK: each writes its rows'
// unnormalized output with their max and sum, and fa_combine_kernel merges the splits in order, so a query's
// numbers depend on its own row and the keys alone, never on how many queries share the call.

#define FQB 128                     // queries a block
#define FB 64                       // keys a tile
#define FK 128                      // keys a split
#define FT 256                      // threads a block

template <int HD, bool ROWS>
__global__ void __launch_bounds__(FT) flash_attn_kernel(const float *q, const float *kh, const float *vt, float *out,
                                                        float *part, float *ml, int64_t n, int64_t S, int64_t ld,
                                                        int64_t keys, int64_t ldkv) {
    constexpr int KP = HD + 8, VP = FB + 8;
    __shared__ uint4 ks4[FB * KP / 8], vs4[HD * VP / 8]; // (uint4: 16-byte aligned)
    uint16_t *ks = (uint16_t *)ks4, *vs = (uint16_t *)vs4;  // [key][e], [e][key]
    const int h = blockIdx.y, split = blockIdx.z, heads = gridDim.y;
    const int64_t i0 = (int64_t)blockIdx.x * FQB, j_lo = (int64_t)split * keys;
    const int64_t j_hi = S < j_lo + keys ? S : j_lo + keys;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // packed: K [heads][S][HD], V [heads][HD][S]; ROWS: K and V as the projections wrote them, [S][ldkv]
    const float *K = ROWS ? kh + (int64_t)h * HD : kh + (int64_t)h * S * HD;
    const float *Vt = ROWS ? vt + (int64_t)h * HD : vt + (int64_t)h * HD * S;
    const int64_t kst = ROWS ? ldkv : HD;
    const int64_t r0 = i0 + warp * 16 + g, r1 = r0 + 8;
    const bool v4 = (S & 3) == 0; // V's rows of keys load 4 at a time
    uint32_t qa[HD / 16][4];
    for (int kk = 0; kk < HD / 16; kk++) {
        const int64_t c = (int64_t)h * HD + kk * 16 + 2 * t;
        const float2 z = make_float2(0.0f, 0.0f);
        const float2 x0 = r0 < n ? *(const float2 *)(q + r0 * ld + c) : z;
        const float2 x1 = r1 < n ? *(const float2 *)(q + r1 * ld + c) : z;
        const float2 x2 = r0 < n ? *(const float2 *)(q + r0 * ld + c + 8) : z;
        const float2 x3 = r1 < n ? *(const float2 *)(q + r1 * ld + c + 8) : z;
        qa[kk][0] = bf16x2(x0.x, x0.y), qa[kk][1] = bf16x2(x1.x, x1.y);
        qa[kk][2] = bf16x2(x2.x, x2.y), qa[kk][3] = bf16x2(x3.x, x3.y);
    }
    float o[HD / 8][4];
    for (int e = 0; e < HD / 8; e++) o[e][0] = o[e][1] = o[e][2] = o[e][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int64_t j0 = j_lo; j0 < j_hi; j0 += FB) {
        __syncthreads(); // the previous tile's reads are done
        for (int i = threadIdx.x; i < FB * HD / 4; i += FT) {
            const int key = i / (HD / 4), e = (i % (HD / 4)) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j0 + key < j_hi) v = *(const float4 *)(K + (j0 + key) * kst + e);
            uint32_t *d = (uint32_t *)(ks + key * KP + e);
            d[0] = bf16x2(v.x, v.y), d[1] = bf16x2(v.z, v.w);
        }
        if (ROWS) // a key's row of V read 4 values at a time, stored down the tile's columns
            for (int i = threadIdx.x; i < FB * HD / 4; i += FT) {
                const int key = i / (HD / 4), e = (i % (HD / 4)) * 4;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (j0 + key < j_hi) v = *(const float4 *)(Vt + (j0 + key) * ldkv + e);
                vs[e * VP + key] = f32_to_bf16(v.x), vs[(e + 1) * VP + key] = f32_to_bf16(v.y);
                vs[(e + 2) * VP + key] = f32_to_bf16(v.z), vs[(e + 3) * VP + key] = f32_to_bf16(v.w);
            }
        else
        for (int i = threadIdx.x; i < HD * FB / 4; i += FT) {
            const int e = i / (FB / 4), j = (i % (FB / 4)) * 4;
            const float *src = Vt + (int64_t)e * S + j0 + j;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (v4 && j0 + j + 3 < j_hi) {
                v = *(const float4 *)src;
            } else {
                if (j0 + j < j_hi) v.x = src[0];
                if (j0 + j + 1 < j_hi) v.y = src[1];
                if (j0 + j + 2 < j_hi) v.z = src[2];
                if (j0 + j + 3 < j_hi) v.w = src[3];
            }
            uint32_t *d = (uint32_t *)(vs + e * VP + j);
            d[0] = bf16x2(v.x, v.y), d[1] = bf16x2(v.z, v.w);
        }
        __syncthreads();
        if (i0 + warp * 16 >= n) continue; // a warp with no query of the call only helps stage the tiles
        float sc[FB / 8][4];
        for (int nt = 0; nt < FB / 8; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const uint16_t *kr = ks + (nt * 8 + g) * KP + 2 * t;
            for (int kk = 0; kk < HD / 16; kk++)
                mma_bf16(sc[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], *(const uint32_t *)(kr + kk * 16),
                         *(const uint32_t *)(kr + kk * 16 + 8));
        }
        float mx0 = m0, mx1 = m1;
        for (int nt = 0; nt < FB / 8; nt++)
            for (int c = 0; c < 2; c++) {
                if (j0 + nt * 8 + 2 * t + c >= j_hi) sc[nt][c] = sc[nt][2 + c] = -INFINITY;
                mx0 = fmaxf(mx0, sc[nt][c]), mx1 = fmaxf(mx1, sc[nt][2 + c]);
            }
        for (int off = 1; off < 4; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        const float a0 = expf(m0 - mx0), a1 = expf(m1 - mx1); // 0 on the first tile (m = -inf)
        l0 *= a0, l1 *= a1;
        for (int e = 0; e < HD / 8; e++) o[e][0] *= a0, o[e][1] *= a0, o[e][2] *= a1, o[e][3] *= a1;
        for (int nt = 0; nt < FB / 8; nt++) {
            sc[nt][0] = expf(sc[nt][0] - mx0), sc[nt][1] = expf(sc[nt][1] - mx0);
            sc[nt][2] = expf(sc[nt][2] - mx1), sc[nt][3] = expf(sc[nt][3] - mx1);
            l0 += sc[nt][0] + sc[nt][1], l1 += sc[nt][2] + sc[nt][3];
        }
        m0 = mx0, m1 = mx1;
        for (int kt = 0; kt < FB / 16; kt++) {
            const uint32_t p0 = bf16x2(sc[2 * kt][0], sc[2 * kt][1]), p1 = bf16x2(sc[2 * kt][2], sc[2 * kt][3]);
            const uint32_t p2 = bf16x2(sc[2 * kt + 1][0], sc[2 * kt + 1][1]);
            const uint32_t p3 = bf16x2(sc[2 * kt + 1][2], sc[2 * kt + 1][3]);
            for (int e = 0; e < HD / 8; e++) {
                const uint16_t *vr = vs + (e * 8 + g) * VP + kt * 16 + 2 * t;
                mma_bf16(o[e], p0, p1, p2, p3, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
            }
        }
    }
    if (i0 + warp * 16 >= n) return;
    for (int off = 1; off < 4; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if (!part) { // one pass over the keys: the rows themselves
        const float i0s = 1.0f / l0, i1s = 1.0f / l1;
        float *ob = out + (int64_t)h * HD + 2 * t;
        for (int e = 0; e < HD / 8; e++) {
            if (r0 < n) *(float2 *)(ob + r0 * ld + e * 8) = make_float2(o[e][0] * i0s, o[e][1] * i0s);
            if (r1 < n) *(float2 *)(ob + r1 * ld + e * 8) = make_float2(o[e][2] * i1s, o[e][3] * i1s);
        }
        return;
    }
    // the split's rows: part [split][n][ld] (unnormalized), ml [split][n][heads][2] (max, sum)
    float *pb = part + (int64_t)split * n * ld + (int64_t)h * HD + 2 * t;
    for (int e = 0; e < HD / 8; e++) {
        if (r0 < n) *(float2 *)(pb + r0 * ld + e * 8) = make_float2(o[e][0], o[e][1]);
        if (r1 < n) *(float2 *)(pb + r1 * ld + e * 8) = make_float2(o[e][2], o[e][3]);
    }
    if (t == 0) {
        float *mb = ml + ((int64_t)split * n * heads + h) * 2;
        if (r0 < n) mb[r0 * heads * 2] = m0, mb[r0 * heads * 2 + 1] = l0;
        if (r1 < n) mb[r1 * heads * 2] = m1, mb[r1 * heads * 2 + 1] = l1;
    }
}

// out[i, h·hd + e] = Σ_s exp(m_s - M) part_s / Σ_s exp(m_s - M) l_s, the splits in order (M their max)
__global__ void fa_combine_kernel(float *out, const float *part, const float *ml, int64_t n, int64_t ld, int heads,
                                  int hd, int splits) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n * ld) return;
    const int64_t i = x / ld, c = x % ld, h = c / hd;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, ml[(((int64_t)s * n + i) * heads + h) * 2]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *m = ml + (((int64_t)s * n + i) * heads + h) * 2;
        const float w = expf(m[0] - M);
        num += w * part[((int64_t)s * n + i) * ld + c];
        den += w * m[1];
    }
    out[x] = num / den;
}

extern "C" int osp_cu_flash_ok(int hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

extern "C" int64_t osp_cu_flash_scratch(int64_t n, int64_t S, int64_t ld, int heads, int whole) {
    return whole ? 0 : (S + FK - 1) / FK * n * (ld + 2 * heads);
}

template <bool ROWS>
static int flash_launch(osp_cu_stream st, dim3 grid, const float *q, const float *kh, const float *vt, float *out,
                        float *part, float *ml, int64_t n, int64_t S, int64_t ld, int hd, int64_t keys, int64_t ldkv) {
    switch (hd) {
    case 16: launch(flash_attn_kernel<16, ROWS>, grid, FT, 0, st, q, kh, vt, out, part, ml, n, S, ld, keys, ldkv); break;
    case 32: launch(flash_attn_kernel<32, ROWS>, grid, FT, 0, st, q, kh, vt, out, part, ml, n, S, ld, keys, ldkv); break;
    case 64: launch(flash_attn_kernel<64, ROWS>, grid, FT, 0, st, q, kh, vt, out, part, ml, n, S, ld, keys, ldkv); break;
    case 128: launch(flash_attn_kernel<128, ROWS>, grid, FT, 0, st, q, kh, vt, out, part, ml, n, S, ld, keys, ldkv); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return 0;
}

extern "C" int osp_cu_flash_attention(osp_cu_stream st, const float *q, const float *kh, const float *vt, float *out,
                                      float *scratch, int64_t n, int64_t S, int64_t ld, int heads, int hd,
                                      int whole, int64_t ldkv) {
    if (n <= 0 || S <= 0) return launch_status();
    const int splits = whole ? 1 : (int)((S + FK - 1) / FK);
    const int64_t keys = whole ? S : FK;
    float *part = whole ? NULL : scratch, *ml = whole ? NULL : scratch + (int64_t)splits * n * ld;
    const dim3 grid(blocks_for(n, FQB), (unsigned)heads, (unsigned)splits);
    const int e = ldkv ? flash_launch<true>(st, grid, q, kh, vt, out, part, ml, n, S, ld, hd, keys, ldkv)
                       : flash_launch<false>(st, grid, q, kh, vt, out, part, ml, n, S, ld, hd, keys, 0);
    if (e) return e;
    if (!whole) launch(fa_combine_kernel, blocks_for(n * ld, EW), EW, 0, st, out, part, ml, n, ld, heads, hd, splits);
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
    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) {
        const float *kr = K + base + j * ld;
        float acc = 0.0f;
        for (int e = 0; e < hd; e++) acc = __fmaf_rn(qs[e], kr[e], acc);
        p[j] = acc;
    }
    block_softmax(p, keys, red);
    __syncthreads();
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        const float *vc = V + base + e;
        float acc = 0.0f;
        for (int64_t j = 0; j < keys; j++) acc = __fmaf_rn(p[j], vc[j * ld], acc);
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
