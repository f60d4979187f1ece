// backend/cuda/kernels: the CUDA backend's kernels (see kernels.h).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utility>
#include "core/options.h"
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

// ---- matvec: warps stream weight rows in 16-byte chunks ----
//
// A warp takes R consecutive rows of a weight: lane l reads chunks l, l + 32,
// ... of each, loads the matching input chunk once for all R rows, and keeps
// one sum per (row, token) in that chunk order; the warp then adds its
// lanes in a fixed tree. Up to NT tokens share each weight chunk. The order
// of every sum is the same whatever R, NT or the number of tokens in the
// call (batch invariance); rounding is explicit (fma / mul / add intrinsics,
// which the compiler never contracts differently per instantiation).
// Quantized chunks: s * sum(code * x) + b * sum(x) per group.

#define MV_WARPS 8
#define MV_TT 8
#define FMA __fmaf_rn
#define MUL __fmul_rn
#define ADD __fadd_rn

template <int KIND> struct kind_traits {
    static const int E = KIND == 0 ? 4 : KIND == 1 || KIND == 2 ? 8 : KIND == 4 ? 32 : 16; // values per chunk
};

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 as_f4(uint4 u) {
    return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}

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

// the input chunk matching a weight chunk: E floats
template <int KIND> __device__ __forceinline__ void load_x(const float *x, float (&v)[kind_traits<KIND>::E]) {
#pragma unroll
    for (int i = 0; i < kind_traits<KIND>::E; i += 4) {
        const float4 a = ld4(x + i);
        v[i] = a.x, v[i + 1] = a.y, v[i + 2] = a.z, v[i + 3] = a.w;
    }
}

// a small unsigned integer as a float, exactly, without a conversion instruction
__device__ __forceinline__ float small_uint(uint32_t c) { return __uint_as_float(0x4b000000u | c) - 8388608.0f; }

template <int KIND>
__device__ __forceinline__ float chunk_dot(uint4 w, const float (&x)[kind_traits<KIND>::E], float s, float b,
                                           float sxs) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    if (KIND == 0) {
        float d = MUL(__uint_as_float(u[0]), x[0]);
#pragma unroll
        for (int i = 1; i < 4; i++) d = FMA(__uint_as_float(u[i]), x[i], d);
        return d;
    }
    if (KIND == 1 || KIND == 2) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float lo, hi;
            if (KIND == 2) {
                lo = __uint_as_float(u[i] << 16), hi = __uint_as_float(u[i] & 0xffff0000u);
            } else {
                uint32_t v = u[i];
                float2 f = __half22float2(*reinterpret_cast<__half2 *>(&v));
                lo = f.x, hi = f.y;
            }
            d = FMA(hi, x[2 * i + 1], FMA(lo, x[2 * i], d));
        }
        return d;
    }
    // codes: bytes become floats 2^23 + c by a byte permute, then exactly c
    float cx = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (KIND == 4) {
            const uint32_t lo = u[i] & 0x0f0f0f0fu, hi = (u[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                cx = FMA(__uint_as_float(__byte_perm(lo, 0x4b000000u, 0x7540 + j)) - 8388608.0f, x[i * 8 + 2 * j], cx);
                cx = FMA(__uint_as_float(__byte_perm(hi, 0x4b000000u, 0x7540 + j)) - 8388608.0f, x[i * 8 + 2 * j + 1], cx);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
                cx = FMA(__uint_as_float(__byte_perm(u[i], 0x4b000000u, 0x7540 + j)) - 8388608.0f, x[i * 4 + j], cx);
        }
    }
    return FMA(b, sxs, MUL(s, cx)); // sxs: the chunk's sum of x (the caller's, shared by its rows)
}

template <int KIND> __device__ __forceinline__ float chunk_sum(const float (&x)[kind_traits<KIND>::E]) {
    float sx = 0.0f;
#pragma unroll
    for (int i = 0; i < kind_traits<KIND>::E; i++) sx = ADD(sx, x[i]);
    return sx;
}

// Several weights of one kind and width sharing the input (q/k/v, gate/up)
// go in one launch: the warps' row groups run over the weights end to end.
#define MV_MAXW 4
struct mv_set {
    osp_cu_weight w[MV_MAXW];
    float *y[MV_MAXW];
    int64_t ldy[MV_MAXW], end[MV_MAXW]; // end: the last row group + 1 of weight i in the concatenation
    int gsh[MV_MAXW];                     // log2(chunks per quantization group)
    int nw;
};

// S warps share a row (S in 1, 2, 4, 8: a block's 8 warps hold whole rows):
// warp s sums the chunks of the s-th of S equal column ranges, and the
// ranges' sums are added in order. S depends on the weight's shape only,
// never on the number of tokens, so the order of every sum does not either.
template <int KIND, int NT, int R>
__global__ void __launch_bounds__(MV_WARPS * WARP) mv_kernel(const __grid_constant__ mv_set set,
                                                             const float *__restrict__ x, int64_t n, int S) {
    constexpr int E = kind_traits<KIND>::E;
    __shared__ float red[MV_WARPS][R][NT];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int64_t unit = (int64_t)blockIdx.x * MV_WARPS + warp;
    const int seg = (int)(unit % S);
    int64_t r0 = unit / S;
    int wi = 0;
    while (wi < set.nw && r0 >= set.end[wi]) wi++;
    const bool live = wi < set.nw; // a warp past the last row still joins the block's barriers
    if (!live) wi = 0;
    if (wi) r0 -= set.end[wi - 1];
    r0 *= R;
    const osp_cu_weight &w = set.w[wi];
    float *__restrict__ y = set.y[wi];
    const int64_t ldy = set.ldy[wi];
    const int64_t cols = w.cols, nch = cols / E;
    const int64_t c_lo = nch * seg / S, c_hi = nch * (seg + 1) / S;
    const int64_t row_bytes = KIND == 4 ? cols / 2 : KIND == 8 ? cols : cols * (KIND == 0 ? 4 : 2);
    const int64_t ng = KIND >= 4 ? cols / w.group : 0;
    const int gsh = set.gsh[wi];
    const uint4 *rowp[R];
    bool ok[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        ok[r] = live && r0 + r < w.rows;
        rowp[r] = (const uint4 *)((const unsigned char *)w.data + (ok[r] ? r0 + r : 0) * row_bytes);
    }
    for (int64_t t0 = 0; t0 < n; t0 += NT) {
        const int nt = n - t0 < NT ? (int)(n - t0) : NT;
        float acc[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        constexpr int U = NT > 1 ? 4 : 8 / R; // chunks of a row in flight per lane: R * U loads
        for (int64_t c = c_lo + lane; c < c_hi; c += U * WARP) {
            uint4 wv[U][R];
            float sc[U][R], bi[U][R];
#pragma unroll
            for (int k = 0; k < U; k++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int64_t ck = c + k * WARP;
                    wv[k][r] = ok[r] && ck < c_hi ? ld_stream(rowp[r] + ck) : make_uint4(0, 0, 0, 0);
                    sc[k][r] = bi[k][r] = 0.0f;
                    if (KIND >= 4 && ok[r] && ck < c_hi) {
                        const int64_t g = (r0 + r) * ng + (ck >> gsh);
                        sc[k][r] = load_float(w.scales, w.sdtype, g);
                        bi[k][r] = load_float(w.biases, w.sdtype, g);
                    }
                }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t ck = c + k * WARP;
                if (ck >= c_hi) break;
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    float xv[E];
                    load_x<KIND>(x + (t0 + t) * cols + ck * E, xv);
                    const float sxs = KIND >= 4 ? chunk_sum<KIND>(xv) : 0.0f;
#pragma unroll
                    for (int r = 0; r < R; r++)
                        acc[r][t] = ADD(acc[r][t], chunk_dot<KIND>(wv[k][r], xv, sc[k][r], bi[k][r], sxs));
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
        if (S == 1) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (t < nt && ok[r]) y[(t0 + t) * ldy + r0 + r] = acc[r][t];
            continue;
        }
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) red[warp][r][t] = acc[r][t];
        __syncthreads();
        if (seg == 0 && lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float v = red[warp][r][t];
                    for (int k = 1; k < S; k++) v = ADD(v, red[warp + k][r][t]);
                    if (t < nt && ok[r]) y[(t0 + t) * ldy + r0 + r] = v;
                }
        __syncthreads();
    }
}

// The split of a row's columns among warps, from the weights' shape alone:
// enough warps to fill the GPU (8192 row ranges), each range at least a
// chunk per lane.
static int mv_split(const mv_set &set, int E) {
    int64_t rows = 0;
    for (int i = 0; i < set.nw; i++) rows += set.w[i].rows;
    const int64_t nch = set.w[0].cols / E;
    int S = 1;
    while (S < MV_WARPS && rows * S < 8192 && nch / (2 * S) >= WARP) S *= 2;
    return S;
}

template <int KIND, int NT, int R>
static void mv_go(osp_cu_stream st, mv_set set, const float *x, int64_t n, int S) {
    for (int i = 0; i < set.nw; i++) { // row groups of R
        int64_t groups = (set.w[i].rows + R - 1) / R;
        set.end[i] = (i ? set.end[i - 1] : 0) + groups;
    }
    unsigned g = blocks_for(set.end[set.nw - 1] * S, MV_WARPS);
    launch(mv_kernel<KIND, NT, R>, g, MV_WARPS * WARP, 0, st, set, x, n, S);
}

// Rows per warp (single-token calls): one input chunk serves R rows (4 for
// codes, whose input is 32 floats a chunk; 2 for 16-bit weights). Any R
// sums in the same order.
template <int KIND> static void mv_launch(osp_cu_stream st, const mv_set &set, const float *x, int64_t n) {
    const int S = mv_split(set, kind_traits<KIND>::E);
    int64_t rows = 0;
    for (int i = 0; i < set.nw; i++) rows += set.w[i].rows;
    const int rmax = KIND >= 4 ? 4 : KIND == 0 ? 1 : 2;
    const int R = rmax; /* x traffic: each input chunk serves R rows (L1 bandwidth bounds the 4-bit kernel) */
    (void)rows;
    if (n == 1) {
        if (R == 4) mv_go<KIND, 1, (KIND >= 4 ? 4 : 1)>(st, set, x, n, S);
        else if (R == 2) mv_go<KIND, 1, (KIND == 0 ? 1 : 2)>(st, set, x, n, S);
        else mv_go<KIND, 1, 1>(st, set, x, n, S);
    } else if (n == 2) mv_go<KIND, 2, 1>(st, set, x, n, S);
    else if (n <= 4) mv_go<KIND, 4, 1>(st, set, x, n, S);
    else mv_go<KIND, MV_TT, 1>(st, set, x, n, S);
}

// the chunked kernels' layout: 16-byte aligned rows of whole chunks, groups of whole chunks
static int mv_kind(const osp_cu_weight *w) {
    if (((uintptr_t)w->data & 15) != 0) return -1;
    if (!w->qbits) {
        int e = w->dtype == 0 ? 4 : 8;
        return w->cols % e == 0 ? w->dtype : -1;
    }
    int e = w->qbits == 4 ? 32 : w->qbits == 8 ? 16 : 0;
    if (!e || w->cols % e || w->group % e || ((w->group / e) & (w->group / e - 1))) return -1;
    return w->qbits;
}

static int same_shape(const osp_cu_weight *a, const osp_cu_weight *b) {
    return a->dtype == b->dtype && a->qbits == b->qbits && a->group == b->group && a->sdtype == b->sdtype &&
           a->cols == b->cols;
}

extern "C" int osp_cu_matmul_multi(osp_cu_stream st, const osp_cu_weight *const *ws, int nw, const float *x,
                                   int64_t n, float *const *ys, const int64_t *ldys) {
    if (n <= 0) return 0;
    // A token's result must not depend on n: the kernel is chosen by the weight alone.
    for (int i0 = 0; i0 < nw;) {
        const int kind = mv_kind(ws[i0]);
        if (kind < 0) { // the generic kernel, one weight at a time
            if (ws[i0]->rows > 0)
                launch(mm_kernel, blocks_for(ws[i0]->rows, MM_WARPS), MM_WARPS * WARP, 0, st, *ws[i0], x, n, ys[i0], ldys[i0]);
            i0++;
            continue;
        }
        mv_set set;
        set.nw = 0;
        int64_t rows = 0;
        int i = i0;
        for (; i < nw && set.nw < MV_MAXW && mv_kind(ws[i]) == kind && same_shape(ws[i], ws[i0]); i++) {
            set.w[set.nw] = *ws[i], set.y[set.nw] = ys[i], set.ldy[set.nw] = ldys[i];
            int cpg = ws[i]->qbits ? ws[i]->group / (ws[i]->qbits == 4 ? 32 : 16) : 1, sh = 0;
            while ((1 << sh) < cpg) sh++;
            set.gsh[set.nw] = sh;
            rows += ws[i]->rows;
            set.end[set.nw++] = rows;
        }
        i0 = i;
        if (rows <= 0) continue;
        switch (kind) {
        case 0: mv_launch<0>(st, set, x, n); break;
        case 1: mv_launch<1>(st, set, x, n); break;
        case 2: mv_launch<2>(st, set, x, n); break;
        case 4: mv_launch<4>(st, set, x, n); break;
        default: mv_launch<8>(st, set, x, n); break;
        }
    }
    return launch_status();
}

extern "C" int osp_cu_matmul(osp_cu_stream st, const osp_cu_weight *w, const float *x, int64_t n, float *y,
                             int64_t ldy) {
    return osp_cu_matmul_multi(st, &w, 1, x, n, &y, &ldy);
}

// ---- the production path's matmul: a skinny GEMM on the tensor cores ----
//
// mma.sync m16n8k16 (bf16 operands, f32 accumulation): 16 weight rows by 8
// tokens per instruction. Activations are rounded to bf16 (round to nearest
// even) as they are loaded; 4-bit and 8-bit codes become bf16 weights
// s * c + b (an f32 fma, then rounded), as the production prefill's
// dequantization does. A block takes 16 * MT rows of one weight and KS
// warps split the columns into KS equal ranges of steps (KS from the
// weight's shape: tc_ks); each warp's sum
// runs over its steps in order and the block adds the warps' sums in warp
// order. The column ranges depend on the weight's shape alone, and an mma's
// output for one token depends on that token's column of the input alone
// (a padded token is a column of zeros), so a token's numbers are the same
// whatever the number of tokens in the call, MT or NT (batch invariance):
// one token alone runs the same reduction as among 64.
//
// The k dimension of an mma need not follow the weight's column order, only
// agree between the operands: in a step, thread t of a quad (lane = 4g + t)
// loads one 16-byte chunk of rows g and g + 8 (chunk 4 * step + t), and each
// 8 columns of it (a sub-chunk: 4 words of bf16 pairs) feed two mmas, words
// 0-1 and 2-3 taking the k slots 2t..2t+1 and 2t+8..2t+9; the thread loads
// token g's inputs at the same 8 columns.


struct tc_set {
    osp_cu_weight w[MV_MAXW];
    float *y[MV_MAXW];
    int64_t ldy[MV_MAXW], end[MV_MAXW]; // end: the last block + 1 of weight i in the concatenation
    int64_t poff[MV_MAXW];              // split-K: weight i's partial sums at part + poff[i]
    float *part;                        // [split][token][row] partial sums per weight (split-K)
    unsigned *cnt;                      // per block column: splits done (split-K; the last one resets it)
    int nw;
    // grouped (routed experts, tc_kernel's GR): w[i] is the experts' common shape, gtab[i] (device, one per
    // expert) their data; block x = slot * g_per + (a block of the weights as above); slot j < *g_nact takes
    // expert g_e[j] on the g_cnt[j] rows of x (and of each y) from row g_off[j]
    const osp_cu_weight *gtab[MV_MAXW];
    const int32_t *g_e, *g_off, *g_cnt, *g_nact;
    int64_t g_per;
    int act; // (pair) the activation: 0 SiLU, 1 GELU's tanh form
    // pair (few-token tiles, one split, nw 1): w[0] gate and w[1] up of one shape; tile t's rows g are gate's
    // rows 8t + g and its rows g + 8 up's same rows, and y[0] gets act(gate) * up (act_val) for those 8 features
    int pair;
};

// fma.rn.bf16x2: a * b + c for each half, rounded once to bf16
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
#ifdef OSP_CUEMU
    return osp_cuemu::fma_bf16x2(a, b, c);
#else
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

__device__ __forceinline__ float code_f(uint32_t word, int j) {
    return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7540 + j)) - 8388608.0f;
}

// sub-chunk v (8 columns) of a 16-byte chunk as 4 bf16 pairs
// dq (4-bit codes whose scales and biases are bf16, so s and b are bf16 values): in bf16x2
// arithmetic, two codes an instruction: the pair's nibbles put into the mantissas of 128 + c (bf16 0x4300 | c),
// 128 taken off (exact), then s * c + b rounded once to bf16 (the f32 path rounds s * c + b to f32 first:
// the two differ where that first rounding lands on a bf16 tie, which the KL tier covers)
template <int KIND>
__device__ __forceinline__ void tc_sub(uint4 c, float s, float b, int v, uint32_t (&o)[4], bool dq = false) {
    const uint32_t u[4] = {c.x, c.y, c.z, c.w};
    if (KIND == 2) {
        o[0] = u[0], o[1] = u[1], o[2] = u[2], o[3] = u[3];
    } else if (KIND == 4 && dq) {
        const uint32_t lo = u[v] & 0x0f0f0f0fu, hi = (u[v] >> 4) & 0x0f0f0f0fu;
        const uint32_t s2 = (__float_as_uint(s) >> 16) * 0x10001u, b2 = (__float_as_uint(b) >> 16) * 0x10001u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            // byte 0: column 2j's nibble (lo's byte j), byte 2: column 2j + 1's (hi's byte j)
            const uint32_t t = (__byte_perm(lo, hi, (uint32_t)j | (uint32_t)(4 + j) << 8) & 0x000f000fu) | 0x43004300u;
            o[j] = fma_bf16x2(fma_bf16x2(t, 0x3f803f80u, 0xc300c300u), s2, b2); // (128 + c) * 1 - 128, then s * c + b
        }
    } else if (KIND == 4) { // word v: byte j holds columns 2j (low nibble) and 2j + 1
        const uint32_t lo = u[v] & 0x0f0f0f0fu, hi = (u[v] >> 4) & 0x0f0f0f0fu;
#pragma unroll
        for (int j = 0; j < 4; j++) o[j] = bf16x2(FMA(s, code_f(lo, j), b), FMA(s, code_f(hi, j), b));
    } else { // words 2v, 2v + 1: a column a byte
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t word = u[2 * v + j / 2];
            o[j] = bf16x2(FMA(s, code_f(word, (j & 1) * 2), b), FMA(s, code_f(word, (j & 1) * 2 + 1), b));
        }
    }
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

// The bulk-copy engine (sm_90): a copy from global to shared memory that completes on an mbarrier, which one
// arrival arms with the bytes to expect; a thread waits for the barrier's phase to complete. (The emulator
// makes the copies at the wait, which it takes block-wide: every thread of a block waits at the same point.)
#ifdef OSP_CUEMU
__device__ __forceinline__ void mbar_arm(uint64_t *bar, uint32_t bytes) {
    osp_cuemu::mbar_init(bar, 1);
    osp_cuemu::mbar_expect_tx(bar, bytes);
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    osp_cuemu::bulk_copy(dst, src, bytes, bar);
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) { osp_cuemu::mbar_wait(bar, parity); }
#else
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_arm(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
}
#endif

// MT row tiles of 16 by NT token tiles of 8, U steps of loads in flight;
// XB: the input comes rounded to bf16 already (osp_cu_to_bf16's rounding is
// the conversion's below: the same numbers), half the bytes and no
// conversions in each of the blocks that read it
// GR: grouped (set.gtab): a block's expert, rows and token count come from the device (no split-K)
// ST (few-token tiles, not grouped; tc_st_bytes): the block's 16 rows (codes, scales, biases; for a bf16 split,
// the split's chunks of each row) come into shared memory by bulk copies issued as the block starts, before it waits for the kernel before it, and the
// steps read them there: every byte of the tile in flight at once, in no registers. The same mma sequence on
// the same operands: the same numbers.
template <int KIND, int KS, int MT, int NT, int U, int MINB, bool XB, bool GR = false, bool ST = false>
__global__ void __launch_bounds__(KS *WARP, MINB) tc_kernel(const __grid_constant__ tc_set set,
                                                           const void *__restrict__ xv, int64_t n) {
    const float *__restrict__ x = (const float *)xv;
    const uint16_t *__restrict__ xh = (const uint16_t *)xv;
    constexpr int CH = KIND == 2 ? 8 : KIND == 4 ? 32 : 16; // columns per 16-byte chunk
    constexpr int V = CH / 8;                               // sub-chunks per chunk
    __shared__ float red[KS][NT][4][WARP];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, g = lane >> 2, t = lane & 3;
    __shared__ uint64_t st_bar; // ST: the tile's barrier
    int64_t tile = blockIdx.x; // (the launch's; of its weight, below)
    [[maybe_unused]] int32_t slot = 0;
    if constexpr (GR) {
        slot = (int32_t)(tile / set.g_per);
        tile -= (int64_t)slot * set.g_per;
    }
    int wi = 0;
    while (wi < set.nw - 1 && tile >= set.end[wi]) wi++;
    if (wi) tile -= set.end[wi - 1];
    const osp_cu_weight &w = set.w[wi];
    [[maybe_unused]] const void *gdata = nullptr, *gscales = nullptr, *gbiases = nullptr; // GR: the expert's
    float *__restrict__ y = set.y[wi];
    const int64_t ldy = set.ldy[wi], rows = w.rows, cols = w.cols, nch = cols / CH, nsteps = (nch + 3) / 4;
    if constexpr (GR) { // the expert and its rows: written by the kernel before this one
        pdl_wait();
        if (slot >= __ldg(set.g_nact)) return;
        const osp_cu_weight *q = set.gtab[wi] + __ldg(set.g_e + slot);
        gdata = q->data, gscales = q->scales, gbiases = q->biases;
        const int64_t off = __ldg(set.g_off + slot);
        n = __ldg(set.g_cnt + slot);
        x += off * cols, y += off * ldy;
    }
    // split-K: block row y of SK takes its share of the steps, its warps split that share
    const int SK = (int)gridDim.y, yb = (int)blockIdx.y;
    const int64_t b_lo = nsteps * yb / SK, b_n = nsteps * (yb + 1) / SK - b_lo;
    const int64_t s_lo = b_lo + b_n * warp / KS, s_hi = b_lo + b_n * (warp + 1) / KS;
    float *__restrict__ part = SK > 1 ? set.part + set.poff[wi] : nullptr;
    const int64_t row_bytes = KIND == 2 ? cols * 2 : KIND == 4 ? cols / 2 : cols;
    const int64_t ng = KIND == 2 ? 0 : cols / (w.group > 0 ? w.group : 1);
    const bool pair = !GR && MT == 1 && NT == 1 && set.pair; // (uniform)
    const int64_t row0 = pair ? tile * 8 : tile * 16 * MT;
    const bool dq = KIND == 4 && w.sdtype == 2;
    static_assert(!ST || (MT == 1 && NT == 1 && !GR), "staged tiles: few-token, one row tile, not grouped");
    [[maybe_unused]] const unsigned char *st_sc = nullptr, *st_bi = nullptr; // ST: [16][ng] scales, biases
    [[maybe_unused]] const uint4 *st_rows = nullptr; // ST: [16][st_rb] codes: the split's chunks from st_c0 on
    [[maybe_unused]] int64_t st_c0 = 0, st_rb = row_bytes;
    if constexpr (ST) { // pieces: the 16 rows (pair: gate's 8, up's 8), each its codes, scales and biases
        OSP_DYN_SHARED(uint4, st_sm);
        // the tile's copies (tile tl of the launch: its weight, rows and sizes its own)
        auto st_issue = [&](int64_t tl) {
            int wj = 0;
            while (wj < set.nw - 1 && tl >= set.end[wj]) wj++;
            if (wj) tl -= set.end[wj - 1];
            const osp_cu_weight &wq = set.w[wj];
            const int64_t rb = KIND == 2 ? wq.cols * 2 : KIND == 4 ? wq.cols / 2 : wq.cols;
            const int64_t gq = KIND == 2 ? 0 : wq.cols / (wq.group > 0 ? wq.group : 1);
            const int64_t r0 = pair ? tl * 8 : tl * 16, per = pair ? 8 : 16;
            const int64_t cnt = wq.rows - r0 < per ? wq.rows - r0 : per;
            const int64_t sb = KIND == 2 ? 0 : gq * (wq.sdtype == 0 ? 4 : 2); // a row's scales (tc_st_bytes: 16s)
            unsigned char *codes = (unsigned char *)st_sm, *scs = codes + 16 * rb, *bis = scs + 16 * sb;
            uint64_t *bar = &st_bar;
            constexpr int K3 = KIND == 2 ? 1 : 3;
            const int pieces = pair ? 2 : 1;
            if (SK > 1) { // (bf16, tc_st_bytes; one tile a block) each row's chunks of this split, a row every st_rb
                const int64_t c0 = 4 * b_lo, c1 = 4 * (b_lo + b_n) < nch ? 4 * (b_lo + b_n) : nch;
                const int64_t srb = 64 * ((nsteps + SK - 1) / SK);
                if (threadIdx.x == 0) mbar_arm(bar, (uint32_t)(cnt * (c1 - c0) * 16));
                __syncthreads();
                if ((int64_t)threadIdx.x < cnt)
                    bulk_g2s(codes + threadIdx.x * srb, (const unsigned char *)wq.data + (r0 + threadIdx.x) * rb + c0 * 16,
                             (uint32_t)((c1 - c0) * 16), bar);
            } else { // a copy a piece's codes, scales and biases
                if (threadIdx.x == 0) mbar_arm(bar, (uint32_t)(pieces * cnt * (rb + 2 * sb)));
                __syncthreads();
                if ((int)threadIdx.x < pieces * K3) {
                    const int pc = (int)threadIdx.x / K3, k = (int)threadIdx.x % K3;
                    const osp_cu_weight &wp = pair ? set.w[pc] : wq;
                    const int64_t lrow = pc * 8; // the piece's first row in shared memory
                    if (k == 0)
                        bulk_g2s(codes + lrow * rb, (const unsigned char *)wp.data + r0 * rb, (uint32_t)(cnt * rb), bar);
                    else
                        bulk_g2s((k == 1 ? scs : bis) + lrow * sb,
                                 (const unsigned char *)(k == 1 ? wp.scales : wp.biases) + r0 * sb,
                                 (uint32_t)(cnt * sb), bar);
                }
            }
        };
        const int64_t sb = KIND == 2 ? 0 : ng * (w.sdtype == 0 ? 4 : 2);
        const unsigned char *codes = (const unsigned char *)st_sm;
        st_rows = (const uint4 *)codes, st_sc = codes + 16 * row_bytes, st_bi = st_sc + 16 * sb;
        if (SK > 1) st_c0 = 4 * b_lo, st_rb = 64 * ((nsteps + SK - 1) / SK);
        st_issue(blockIdx.x);
    }
    const uint4 *rp[MT][2];
    bool rok[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = pair ? row0 + g : row0 + 16 * m + g + 8 * h;
            rok[m][h] = r < rows;
            if constexpr (ST)
                rp[m][h] = (const uint4 *)((const unsigned char *)st_rows + (int64_t)(g + 8 * h) * st_rb);
            else
                rp[m][h] = (const uint4 *)((const unsigned char *)(GR ? gdata : pair ? set.w[h].data : w.data) +
                                           (rok[m][h] ? r : 0) * row_bytes);
        }
    // the first steps' weights on their way before the previous kernel ends
    for (int u = 0; !GR && !ST && u < U && s_lo + u < s_hi; u++) {
        const int64_t ch = (s_lo + u) * 4 + t;
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                if (ch < nch && rok[m][h]) prefetch_l2(rp[m][h] + ch);
    }
    pdl_wait();
    pdl_trigger();
    if constexpr (ST) mbar_wait(&st_bar, 0);
    for (int64_t t0 = 0; t0 < n; t0 += 8 * NT) {
        float acc[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[m][j][c] = 0.0f;
        for (int64_t s = s_lo; s < s_hi; s += U) {
            // U steps of weights and inputs in flight together
            uint4 a[U][MT][2];
            float sc[U][MT][2], bi[U][MT][2];
            uint32_t b[U][V][NT][4];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t ch = (s + u) * 4 + t;
                const bool live = s + u < s_hi && ch < nch;
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const bool ok = live && rok[m][h];
                        if constexpr (ST) a[u][m][h] = ok ? rp[m][h][ch - st_c0] : make_uint4(0, 0, 0, 0);
                        else a[u][m][h] = ok ? ld_stream(rp[m][h] + ch) : make_uint4(0, 0, 0, 0);
                        sc[u][m][h] = bi[u][m][h] = 0.0f;
                        if (KIND != 2 && ok) {
                            if constexpr (ST) {
                                const int64_t gi = (int64_t)(g + 8 * h) * ng + ch * CH / w.group;
                                sc[u][m][h] = load_float(st_sc, w.sdtype, gi);
                                bi[u][m][h] = load_float(st_bi, w.sdtype, gi);
                            } else {
                                const int64_t gi = (pair ? row0 + g : row0 + 16 * m + g + 8 * h) * ng + ch * CH / w.group;
                                sc[u][m][h] = load_float(GR ? gscales : pair ? set.w[h].scales : w.scales, w.sdtype, gi);
                                bi[u][m][h] = load_float(GR ? gbiases : pair ? set.w[h].biases : w.biases, w.sdtype, gi);
                            }
                        }
                    }
#pragma unroll
                for (int v = 0; v < V; v++)
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const int64_t tok = t0 + 8 * j + g;
                        b[u][v][j][0] = b[u][v][j][1] = b[u][v][j][2] = b[u][v][j][3] = 0;
                        if (live && tok < n) {
                            if constexpr (XB) {
                                const uint4 q = *reinterpret_cast<const uint4 *>(xh + tok * cols + ch * CH + 8 * v);
                                b[u][v][j][0] = q.x, b[u][v][j][1] = q.y, b[u][v][j][2] = q.z, b[u][v][j][3] = q.w;
                            } else {
                                const float *xp = x + tok * cols + ch * CH + 8 * v;
                                const float4 p = ld4(xp), q = ld4(xp + 4);
                                b[u][v][j][0] = bf16x2(p.x, p.y), b[u][v][j][1] = bf16x2(p.z, p.w);
                                b[u][v][j][2] = bf16x2(q.x, q.y), b[u][v][j][3] = bf16x2(q.z, q.w);
                            }
                        }
                    }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (s + u >= s_hi) break;
#pragma unroll
                for (int v = 0; v < V; v++) {
                    uint32_t A[MT][2][4];
#pragma unroll
                    for (int m = 0; m < MT; m++)
#pragma unroll
                        for (int h = 0; h < 2; h++) tc_sub<KIND>(a[u][m][h], sc[u][m][h], bi[u][m][h], v, A[m][h], dq);
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        if (t0 + 8 * j >= n) break; // no token in this tile
#pragma unroll
                        for (int m = 0; m < MT; m++) {
                            const uint32_t *bb = b[u][v][j];
                            mma_bf16(acc[m][j], A[m][0][0], A[m][1][0], A[m][0][1], A[m][1][1], bb[0], bb[1]);
                            mma_bf16(acc[m][j], A[m][0][2], A[m][1][2], A[m][0][3], A[m][1][3], bb[2], bb[3]);
                        }
                    }
                }
            }
        }
        // the warps' sums added in warp order, a row tile at a time
#pragma unroll
        for (int m = 0; m < MT; m++) {
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) red[warp][j][c][lane] = acc[m][j][c];
            __syncthreads();
            const float *rf = &red[0][0][0][0];
            constexpr int PER = NT * 4 * WARP;
            if (pair) { // c 0, 1: gate's row g (tokens 2t, 2t + 1); c + 2: up's same row: act(gate) * up, once
                for (int e = threadIdx.x; e < 2 * WARP; e += KS * WARP) {
                    float vg = rf[e], vu = rf[e + 2 * WARP];
#pragma unroll
                    for (int k = 1; k < KS; k++) vg = ADD(vg, rf[k * PER + e]), vu = ADD(vu, rf[k * PER + e + 2 * WARP]);
                    const int l = e % WARP, c = e / WARP;
                    const int64_t row = row0 + (l >> 2), tok = t0 + 2 * (l & 3) + c;
                    if (row < rows && tok < n) y[tok * ldy + row] = act_val(set.act, vg, vu);
                }
                __syncthreads();
                continue;
            }
            for (int e = threadIdx.x; e < PER; e += KS * WARP) {
                float v = rf[e];
#pragma unroll
                for (int k = 1; k < KS; k++) v = ADD(v, rf[k * PER + e]);
                const int l = e % WARP, c = (e / WARP) % 4, j = e / (4 * WARP);
                const int64_t row = row0 + 16 * m + (l >> 2) + 8 * (c >> 1), tok = t0 + 8 * j + 2 * (l & 3) + (c & 1);
                if (row < rows && tok < n) {
                    if (SK == 1) y[tok * ldy + row] = v;
                    else part[((int64_t)yb * n + tok) * rows + row] = v;
                }
            }
            __syncthreads();
        }
    }
    if (SK > 1) { // the last block of a row tile adds the splits' sums in split order
        __shared__ int last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&set.cnt[blockIdx.x], 1u) == (unsigned)(SK - 1);
        __syncthreads();
        if (!last) return;
        __threadfence();
        for (int64_t e = threadIdx.x; e < 16 * MT * n; e += KS * WARP) {
            const int64_t row = row0 + e % (16 * MT), tok = e / (16 * MT);
            if (row >= rows) continue;
            float v = __ldcg(part + tok * rows + row);
            for (int k = 1; k < SK; k++) v = ADD(v, __ldcg(part + ((int64_t)k * n + tok) * rows + row));
            y[tok * ldy + row] = v;
        }
        if (threadIdx.x == 0) set.cnt[blockIdx.x] = 0;
    }
}

static int pdl_on() { return osp_options_get()->cuda_pdl; }

// launch with programmatic dependent launch allowed (the kernel begins with pdl_wait)
template <typename... K, typename... A>
static void pdl_launch(void (*k)(K...), dim3 grid, dim3 block, size_t shm, osp_cu_stream st, A &&...args) {
    osp_cu_launch(k, grid, block, shm, (cudaStream_t)st, pdl_on(), std::forward<A>(args)...);
}

// a launch's blocks of mt row tiles over the set's weights end to end (set.end), and each weight's split-K
// partial sums in the workspace (set.poff)
static void tc_layout(tc_set &set, int mt, int64_t n, int sk) {
    for (int i = 0; i < set.nw; i++) {
        const int64_t blocks = set.pair ? (set.w[i].rows + 7) / 8 : (set.w[i].rows + 16 * mt - 1) / (16 * mt);
        set.end[i] = (i ? set.end[i - 1] : 0) + blocks;
        set.poff[i] = (i ? set.poff[i - 1] + sk * n * set.w[i - 1].rows : 0);
    }
}

// 4-bit codes with bf16 scales are converted in bf16x2 arithmetic (tc_sub): about 2.25 instructions a code
// instead of 3.75; the same bits unless s * c and b lie far apart (tc_sub). Every tensor-core launch (few
// tokens, many, grouped) converts alike, so batch invariance holds (docs/NOTES.md, "CUDA switches' figures").

#define TC_ST_MAX (64 * 1024) // the staged tile's shared memory at most

// ST: the staged kernel, shm its tile's bytes (tc_st_bytes)
template <int KIND, int KS, int MT, int NT, int U, int MINB, bool XB = false, bool ST = false>
static void tc_go(osp_cu_stream st, tc_set set, const void *x, int64_t n, int sk, size_t shm = 0) {
    auto k = tc_kernel<KIND, KS, MT, NT, U, MINB, XB, false, ST>;
    static int raised = 0; // (per instantiation) the shared memory a staged block may take, raised once
    if (ST && !raised) {
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_ST_MAX);
        raised = 1;
    }
    tc_layout(set, MT, n, sk);
    const int64_t tiles = set.end[set.nw - 1];
    pdl_launch(k, dim3((unsigned)tiles, (unsigned)sk), dim3(KS * WARP), shm, st, set, x, n);
}

// Few-token launches whose tiles fit take the staged kernel (tc_kernel's ST; two blocks a multiprocessor, as
// the register kernel); the others the register kernel. Three blocks a multiprocessor and bf16 rows too long
// for it split to fit were slower and are gone; figures in docs/NOTES.md ("CUDA switches' figures").

// the staged tile's shared memory for a set, or 0 where it cannot take it: one split, not grouped, rows of
// whole 16-byte chunks (codes, and the scales and biases of a row a multiple of 16 bytes, 16-byte aligned)
static size_t tc_st_bytes(const tc_set &set, int sk) {
    if (sk != 1 && (set.pair || set.w[0].qbits)) return 0; // several splits: bf16 rows, a copy a row
    size_t most = 0;
    for (int i = 0; i < (set.pair ? 2 : set.nw); i++) {
        const osp_cu_weight &w = set.w[i];
        const int64_t rb = !w.qbits ? w.cols * 2 : w.qbits == 4 ? w.cols / 2 : w.cols;
        int64_t sb = 0;
        if (w.qbits) {
            sb = (w.cols / w.group) * (w.sdtype == 0 ? 4 : 2);
            if (sb % 16 || ((uintptr_t)w.scales & 15) || ((uintptr_t)w.biases & 15)) return 0;
        }
        if (rb % 16 || ((uintptr_t)w.data & 15)) return 0;
        const int64_t steps = (rb / 16 + 3) / 4; // (a split's rows: its steps' chunks, kernel's st_rb)
        const size_t b = sk > 1 ? (size_t)(16 * 64 * ((steps + sk - 1) / sk)) : (size_t)(16 * (rb + 2 * sb));
        if (b > most) most = b;
    }
    return most <= TC_ST_MAX ? most : 0;
}

// Tiles by the number of tokens (the numbers do not depend on them): a
// token tile of 8 for up to 8 tokens, two blocks of 8 warps a multiprocessor
// (bf16 with 4 steps of loads in flight, 8-bit 2, 4-bit 1); else 32 rows
// (16 for blocks of 16 warps) by 32 tokens a pass.
// (the few-token kernel's steps of loads in flight and blocks a multiprocessor: measured in docs/NOTES.md,
// "CUDA switches' figures")

// blocks of the few-token kernel a multiprocessor holds (tc_sk's wave)
static int tc_few_blocks(int ks) { return ks == 16 ? 1 : 2; }

static int sm_count(void);

// blocks of MT row tiles for a set's weights
static int64_t tc_blocks(const tc_set &set, int mt) {
    int64_t b = 0;
    for (int i = 0; i < set.nw; i++) b += (set.w[i].rows + 16 * mt - 1) / (16 * mt);
    return b;
}

template <int KIND, int KS>
static void tc_tiles(osp_cu_stream st, const tc_set &set, const float *x, const uint16_t *xb, int64_t n, int sk) {
    const size_t stb = n <= 8 ? tc_st_bytes(set, sk) : 0;
    if (stb) {
        tc_go<KIND, KS, 1, 1, 2, 16 / KS, false, true>(st, set, x, n, sk, stb);
    } else if (n <= 8) { // (U steps in flight: bf16 4, 8-bit 2, 4-bit 1; two blocks of 8 warps a multiprocessor)
        if constexpr (KIND == 2) tc_go<KIND, KS, 1, 1, 4, 16 / KS>(st, set, x, n, sk);
        else if constexpr (KIND == 8) tc_go<KIND, KS, 1, 1, 2, 16 / KS>(st, set, x, n, sk);
        else tc_go<KIND, KS, 1, 1, 1, 16 / KS>(st, set, x, n, sk);
    } else if constexpr (KS == 16) { // 128 registers a thread at most
        if (xb) tc_go<KIND, KS, 1, 4, 1, 1, true>(st, set, xb, n, sk);
        else tc_go<KIND, KS, 1, 4, 1, 1>(st, set, x, n, sk);
    } else if (xb) {
        tc_go<KIND, KS, 2, 4, 1, 1, true>(st, set, xb, n, sk);
    } else {
        tc_go<KIND, KS, 2, 4, 1, 1>(st, set, x, n, sk);
    }
}

// The warps splitting a weight's columns, from its shape alone: 16 for a
// long row (at least 8 steps a warp) in few row tiles (under 256: too few
// blocks of 8 warps to fill the GPU), else 8.
static int64_t tc_steps(const osp_cu_weight *w) {
    const int ch = w->qbits == 4 ? 32 : w->qbits == 8 ? 16 : 8;
    return (w->cols / ch + 3) / 4;
}

static int tc_ks(const osp_cu_weight *w) { return w->rows < 16 * 256 && tc_steps(w) >= 16 * 8 ? 16 : 8; }

static int sm_count(void) {
    static int n = 0;
    if (!n) {
        int d = 0, v = 0;
        if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, d) !=
            cudaSuccess || v < 1)
            v = 1, cudaGetLastError();
        n = v;
    }
    return n;
}

// Split-K: blocks splitting a weight's steps, from its shape (and the GPU's
// multiprocessors) alone, so that a weight of few row tiles still gives
// every multiprocessor blocks to run (the o and down projections of a
// small model, a padded MLP's down projection); each split gets 4 steps a
// warp at least. The splits never make more blocks than one wave holds
// (a second, partial wave costs a whole block's time: 192 row tiles split
// in two ran 1.45 waves). So rows * splits stays under two waves of
// 16-row blocks, which bounds the partial sums' workspace
// (osp_cu_tc_ws_init).
#define TC_MAX_SK 32
// (the splits of w when a launch's row tiles are tiles)
static int tc_sk_tiles(const osp_cu_weight *w, int64_t tiles) {
    const int ks = tc_ks(w);
    const int64_t want = (int64_t)sm_count() * tc_few_blocks(ks); // a wave of the few-token kernel's blocks
    if (tiles >= want) return 1;
    int64_t sk = want / tiles, most = tc_steps(w) / (4 * ks);
    if (sk > most) sk = most;
    if (sk > TC_MAX_SK) sk = TC_MAX_SK;
    return sk < 1 ? 1 : (int)sk;
}

static int tc_sk(const osp_cu_weight *w) { return tc_sk_tiles(w, (w->rows + 15) / 16); }

// the input rounded to bf16 for the tensor-core kernel (PDL: waits for its producer, lets the matmul start)
__global__ void to_bf16_pdl_kernel(uint16_t *dst, const float *src, int64_t n) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f32_to_bf16(src[i]);
}

// The splits of a set of weights in one launch (q, k and v) from all their row tiles, so that together they
// stay in one wave (from q's alone: 384 blocks, 1.45 waves at Llama-1B's shape; docs/NOTES.md, "CUDA switches'
// figures").
static int tc_sk_set(const tc_set &set) { return tc_sk_tiles(&set.w[0], tc_blocks(set, 1)); }

template <int KIND>
static void tc_launch(osp_cu_stream st, tc_set &set, const float *x, int64_t n, const osp_cu_tc_ws *ws) {
    const int sk = tc_sk_set(set);
    int64_t nc = n; // tokens a launch: the splits' partial sums fit the workspace
    if (sk > 1) {
        int64_t per = 0;
        for (int i = 0; i < set.nw; i++) per += (int64_t)sk * set.w[i].rows;
        nc = ws->part_floats / per;
        if (nc > n) nc = n;
        if (nc < 1) nc = 1; // (never: the workspace holds 64 tokens at least)
        set.part = ws->part, set.cnt = ws->cnt;
    }
    // more than 8 tokens: the input rounded to bf16 once, not in every row tile's block
    const int64_t cols = set.w[0].cols;
    uint16_t *xb = n > 8 && ws->xb && n * cols <= ws->xb_elems ? ws->xb : NULL;
    if (xb) pdl_launch(to_bf16_pdl_kernel, dim3(blocks_for(n * cols, 256)), dim3(256), 0, st, xb, x, n * cols);
    float *y0[MV_MAXW];
    for (int i = 0; i < set.nw; i++) y0[i] = set.y[i];
    for (int64_t t = 0; t < n; t += nc) {
        const int64_t m = n - t < nc ? n - t : nc;
        for (int i = 0; i < set.nw; i++) set.y[i] = y0[i] + t * set.ldy[i];
        const uint16_t *xbt = xb ? xb + t * cols : NULL;
        if (tc_ks(&set.w[0]) == 16) tc_tiles<KIND, 16>(st, set, x + t * cols, xbt, m, sk);
        else tc_tiles<KIND, 8>(st, set, x + t * cols, xbt, m, sk);
    }
}

extern "C" int osp_cu_tc_ws_init(osp_cu_tc_ws *ws, int64_t x_elems) {
    ws->part = NULL, ws->cnt = NULL, ws->xb = NULL;
    ws->xb_elems = x_elems;
    ws->part_floats = (int64_t)MV_MAXW * 64 * 64 * sm_count(); // 64 tokens of 4 weights at the rows bound
    ws->n_cnt = (int64_t)MV_MAXW * 2 * sm_count();
    if (cudaMalloc((void **)&ws->part, (size_t)ws->part_floats * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&ws->cnt, (size_t)(ws->n_cnt + 1) * sizeof(unsigned)) != cudaSuccess ||
        cudaMemset(ws->cnt, 0, (size_t)(ws->n_cnt + 1) * sizeof(unsigned)) != cudaSuccess ||
        cudaMalloc((void **)&ws->xb, (size_t)ws->xb_elems * sizeof(uint16_t)) != cudaSuccess) {
        cudaGetLastError();
        osp_cu_tc_ws_free(ws);
        return 1;
    }
    return 0;
}

extern "C" void osp_cu_tc_ws_free(osp_cu_tc_ws *ws) {
    cudaFree(ws->part), cudaFree(ws->cnt), cudaFree(ws->xb);
    ws->part = NULL, ws->cnt = NULL, ws->xb = NULL;
}

// the tensor-core kernel's layout: 16-byte aligned rows of whole chunks, each chunk inside one group
static int tc_kind(const osp_cu_weight *w) {
    if (((uintptr_t)w->data & 15) != 0) return -1;
    if (!w->qbits) return w->dtype == 2 && w->cols % 8 == 0 ? 2 : -1;
    const int ch = w->qbits == 4 ? 32 : w->qbits == 8 ? 16 : 0;
    if (!ch || w->cols % ch || w->group <= 0 || w->group % ch || w->cols % w->group) return -1;
    return w->qbits;
}

extern "C" int osp_cu_matmul_tc_multi(osp_cu_stream st, const osp_cu_weight *const *ws, int nw, const float *x,
                                      int64_t n, float *const *ys, const int64_t *ldys, const osp_cu_tc_ws *tw) {
    if (n <= 0) return 0;
    // the kernel is chosen by the weight alone; others take the f32 kernels
    for (int i0 = 0; i0 < nw;) {
        const int kind = tc_kind(ws[i0]);
        if (kind < 0) {
            int e = osp_cu_matmul_multi(st, ws + i0, 1, x, n, ys + i0, ldys + i0);
            if (e) return e;
            i0++;
            continue;
        }
        tc_set set;
        memset(&set, 0, sizeof set);
        set.nw = 0;
        int64_t rows = 0;
        int i = i0;
        for (; i < nw && set.nw < MV_MAXW && tc_kind(ws[i]) == kind && same_shape(ws[i], ws[i0]) &&
               tc_ks(ws[i]) == tc_ks(ws[i0]) && tc_sk(ws[i]) == tc_sk(ws[i0]);
             i++) {
            set.w[set.nw] = *ws[i], set.y[set.nw] = ys[i], set.ldy[set.nw] = ldys[i];
            rows += ws[i]->rows;
            set.nw++;
        }
        i0 = i;
        if (rows <= 0) continue;
        switch (kind) {
        case 2: tc_launch<2>(st, set, x, n, tw); break;
        case 4: tc_launch<4>(st, set, x, n, tw); break;
        default: tc_launch<8>(st, set, x, n, tw); break;
        }
    }
    return launch_status();
}

extern "C" int osp_cu_tc_ok(const osp_cu_weight *w) { return tc_kind(w) >= 0; }

// the grouped launch: the few-token tiles (a slot has few tokens in decode), no split-K
template <int KIND, int KS>
static void tc_grouped_go(osp_cu_stream st, tc_set &set, const float *x, int64_t slots) {
    constexpr int U = KIND == 2 ? 4 : 2, MINB = KIND == 4 ? 1 : 16 / KS;
    for (int i = 0; i < set.nw; i++) {
        set.end[i] = (i ? set.end[i - 1] : 0) + (set.w[i].rows + 15) / 16;
        set.poff[i] = 0;
    }
    set.g_per = set.end[set.nw - 1];
    pdl_launch(tc_kernel<KIND, KS, 1, 1, U, MINB, false, true>, dim3((unsigned)(slots * set.g_per)), dim3(KS * WARP),
               0, st, set, (const void *)x, (int64_t)0);
}

// gate and up of one shape and y = act(gate) * up in one launch (tc_set's pair): a decode step of up to 8
// tokens where the two weights' own launch would take one split (else cudaErrorNotSupported: the caller runs
// them and the activation apart). Each row's sum is the one that launch makes (the same warps over the same
// columns, one split), and act_val is act_mul's: the same numbers.
extern "C" int osp_cu_tc_pair_ok(const osp_cu_weight *gw, const osp_cu_weight *uw, int64_t n) {
    const int kind = tc_kind(gw);
    if (kind < 0 || tc_kind(uw) != kind || !same_shape(gw, uw) || tc_ks(gw) != tc_ks(uw) || tc_sk(gw) != tc_sk(uw) ||
        n < 1 || n > 8)
        return 0;
    tc_set set;
    memset(&set, 0, sizeof set);
    set.nw = 2, set.w[0] = *gw, set.w[1] = *uw;
    return tc_sk_set(set) == 1;
}

extern "C" int osp_cu_matmul_tc_pair(osp_cu_stream st, const osp_cu_weight *gw, const osp_cu_weight *uw,
                                     const float *x, int act, int64_t n, float *y, int64_t ldy) {
    if (!osp_cu_tc_pair_ok(gw, uw, n) || (act != 0 && act != 1) || ldy < gw->rows) return (int)cudaErrorNotSupported;
    const int kind = tc_kind(gw);
    tc_set set;
    memset(&set, 0, sizeof set);
    set.nw = 1, set.w[0] = *gw, set.w[1] = *uw, set.pair = 1, set.act = act, set.y[0] = y, set.ldy[0] = ldy;
    const int ks16 = tc_ks(gw) == 16;
    switch (kind) {
    case 2: ks16 ? tc_tiles<2, 16>(st, set, x, NULL, n, 1) : tc_tiles<2, 8>(st, set, x, NULL, n, 1); break;
    case 4: ks16 ? tc_tiles<4, 16>(st, set, x, NULL, n, 1) : tc_tiles<4, 8>(st, set, x, NULL, n, 1); break;
    default: ks16 ? tc_tiles<8, 16>(st, set, x, NULL, n, 1) : tc_tiles<8, 8>(st, set, x, NULL, n, 1); break;
    }
    return launch_status();
}

extern "C" int osp_cu_matmul_tc_grouped(osp_cu_stream st, const osp_cu_weight *const *shapes,
                                        const osp_cu_weight *const *tabs, int nw, const float *x, int64_t slots,
                                        const int32_t *e, const int32_t *off, const int32_t *cnt, const int32_t *nact,
                                        float *const *ys, const int64_t *ldys) {
    if (nw < 1 || nw > MV_MAXW || slots <= 0) return nw < 1 || nw > MV_MAXW ? (int)cudaErrorInvalidValue : 0;
    const int kind = tc_kind(shapes[0]);
    if (kind < 0) return (int)cudaErrorInvalidValue;
    tc_set set;
    memset(&set, 0, sizeof set);
    set.nw = nw;
    for (int i = 0; i < nw; i++) {
        if (tc_kind(shapes[i]) != kind || !same_shape(shapes[i], shapes[0]) || tc_ks(shapes[i]) != tc_ks(shapes[0]))
            return (int)cudaErrorInvalidValue;
        set.w[i] = *shapes[i], set.gtab[i] = tabs[i], set.y[i] = ys[i], set.ldy[i] = ldys[i];
    }
    set.g_e = e, set.g_off = off, set.g_cnt = cnt, set.g_nact = nact;
    const int ks16 = tc_ks(shapes[0]) == 16;
    switch (kind) {
    case 2: ks16 ? tc_grouped_go<2, 16>(st, set, x, slots) : tc_grouped_go<2, 8>(st, set, x, slots); break;
    case 4: ks16 ? tc_grouped_go<4, 16>(st, set, x, slots) : tc_grouped_go<4, 8>(st, set, x, slots); break;
    default: ks16 ? tc_grouped_go<8, 16>(st, set, x, slots) : tc_grouped_go<8, 8>(st, set, x, slots); break;
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
    launch(read_kernel, (unsigned)(sms * 8), 256, 0, st, (const uint4 *)buf, bytes / 16, sink);
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

__global__ void rmsnorm_kernel(float *y, float *x, const float *t, const float *w, int64_t d, float eps, int add_one) {
    __shared__ float sh[32];
    rms_row_nt(y + blockIdx.x * d, x + blockIdx.x * d, t ? t + blockIdx.x * d : NULL, w, d, eps, add_one, sh,
               (int)blockDim.x);
}

// threads of a norm's block for rows of d (the block sum's order depends on it)
static int norm_threads(int64_t d) { return d >= 1024 ? 256 : d >= 256 ? 128 : 64; }

extern "C" int osp_cu_add_rmsnorm(osp_cu_stream st, float *y, float *x, const float *t, const float *w, int64_t n,
                                  int64_t d, float eps, int add_one) {
    if (n <= 0) return 0;
    const int th = norm_threads(d);
    for (int64_t r0 = 0; r0 < n; r0 += 65535) {
        int64_t k = n - r0 < 65535 ? n - r0 : 65535;
        pdl_launch(rmsnorm_kernel, dim3((unsigned)k), dim3(th), 0, st, y + r0 * d, x + r0 * d,
                   t ? t + r0 * d : (const float *)NULL, w, d, eps, add_one);
    }
    return launch_status();
}

extern "C" int osp_cu_rmsnorm(osp_cu_stream st, float *y, const float *x, const float *w, int64_t n, int64_t d,
                              float eps, int add_one) {
    return osp_cu_add_rmsnorm(st, y, (float *)x, NULL, w, n, d, eps, add_one);
}

__global__ void add_kernel(float *y, const float *x, int64_t n) {
    pdl_wait();
    pdl_trigger();
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
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    int64_t r = i / d, j = i % d;
    y[i] = act_val(act, g[i], u[r * ld_u + j]);
}

__global__ void softcap_kernel(float *x, int64_t n, float cap) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// One block per row of n values: the first index of the largest non-NaN
// value (ops->argmax's rule, the sampler's greedy choice), 0 when all are
// NaN. Each thread scans its stride in increasing order keeping the first
// of its largest; the reduction breaks ties to the lower index, so the
// result is the lowest index holding the maximum, as a sequential scan's.
#define AM_THREADS 1024

__device__ __forceinline__ void am_take(float &bv, int &bi, float v, int i) {
    if (i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi))) bv = v, bi = i;
}

__device__ __forceinline__ void am_warp(float &bv, int &bi) {
    for (int o = WARP / 2; o > 0; o >>= 1) {
        float v = __shfl_down_sync(0xffffffffu, bv, o);
        int i = __shfl_down_sync(0xffffffffu, bi, o);
        am_take(bv, bi, v, i);
    }
}

__global__ void __launch_bounds__(AM_THREADS) argmax_kernel(const float *__restrict__ x, int64_t n,
                                                            int32_t *__restrict__ ids) {
    __shared__ float sv[AM_THREADS / WARP];
    __shared__ int si[AM_THREADS / WARP];
    const float *r = x + (int64_t)blockIdx.x * n;
    float bv = 0.0f;
    int bi = -1;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < n; i += AM_THREADS) {
        float v = r[i];
        if (!isnan(v) && (bi < 0 || v > bv)) bv = v, bi = (int)i;
    }
    am_warp(bv, bi);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (lane == 0) sv[w] = bv, si[w] = bi;
    __syncthreads();
    if (w) return;
    bv = lane < AM_THREADS / WARP ? sv[lane] : 0.0f;
    bi = lane < AM_THREADS / WARP ? si[lane] : -1;
    am_warp(bv, bi);
    if (lane == 0) ids[blockIdx.x] = bi < 0 ? 0 : bi;
}

extern "C" int osp_cu_argmax(osp_cu_stream st, const float *x, int64_t rows, int64_t n, int32_t *ids) {
    if (rows > 0 && n > 0) launch(argmax_kernel, (unsigned)rows, AM_THREADS, 0, st, x, n, ids);
    return launch_status();
}

#define EW 256

extern "C" int osp_cu_add(osp_cu_stream st, float *y, const float *x, int64_t n) {
    if (n > 0) pdl_launch(add_kernel, dim3(blocks_for(n, EW)), dim3(EW), 0, st, y, x, n);
    return launch_status();
}

extern "C" int osp_cu_add_bias(osp_cu_stream st, float *y, const float *b, int64_t n, int64_t d) {
    if (n * d > 0) launch(add_bias_kernel, blocks_for(n * d, EW), EW, 0, st, y, b, n, d);
    return launch_status();
}

extern "C" int osp_cu_scale(osp_cu_stream st, float *y, float a, int64_t n) {
    if (n > 0) launch(scale_kernel, blocks_for(n, EW), EW, 0, st, y, a, n);
    return launch_status();
}

extern "C" int osp_cu_mul_vec(osp_cu_stream st, float *y, const float *v, float a, int64_t n, int64_t d) {
    if (n * d > 0) launch(mul_vec_kernel, blocks_for(n * d, EW), EW, 0, st, y, v, a, n, d);
    return launch_status();
}

extern "C" int osp_cu_act_mul(osp_cu_stream st, int act, float *y, const float *g, const float *u, int64_t n,
                              int64_t d, int64_t ld_u) {
    if (n * d > 0) pdl_launch(act_mul_kernel, dim3(blocks_for(n * d, EW)), dim3(EW), 0, st, act, y, g, u, n, d, ld_u);
    return launch_status();
}

extern "C" int osp_cu_softcap(osp_cu_stream st, float *x, int64_t n, float cap) {
    if (n > 0) launch(softcap_kernel, blocks_for(n, EW), EW, 0, st, x, n, cap);
    return launch_status();
}

// RoPE's rotation of pair (i, i + D/2) of one head vector at position p: every RoPE kernel's arithmetic
__device__ __forceinline__ void rope_rot(float *v, int32_t pair, int32_t half, int32_t p, const float *inv) {
    const float a = __fmul_rn((float)p, inv[pair]);
    const float c = cosf(a), s = sinf(a);
    const float a1 = v[pair], a2 = v[pair + half];
    v[pair] = __fmaf_rn(a1, c, -__fmul_rn(a2, s));
    v[pair + half] = __fmaf_rn(a2, c, __fmul_rn(a1, s));
}

// one thread per (row, head, pair) of x1 then of x2 (q and k in one launch)
__global__ void rope_kernel(float *x1, int64_t h1, float *x2, int64_t h2, int32_t T, int32_t D, const float *inv,
                            const int32_t *pos, int64_t n1, int64_t total) {
    pdl_wait();
    pdl_trigger();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    float *x = x1;
    int64_t heads = h1;
    if (i >= n1) i -= n1, x = x2, heads = h2;
    const int32_t half = D / 2;
    int64_t pair = i % half, vec = i / half; // vec = row * heads + head
    int64_t row = vec / heads;
    int32_t b = (int32_t)(row / T), t = (int32_t)(row % T);
    rope_rot(x + vec * D, (int32_t)pair, half, pos[b] + t, inv);
}

__device__ void kv_store(const osp_cu_kvlayer &L, const osp_cu_kvrow &R, int32_t slot, int64_t h, int which,
                         const float *x);
__device__ __forceinline__ int32_t kv_slot(const osp_cu_kvlayer &L, int32_t p);

// The cache store taken in by a norm + RoPE launch (a few-token step's FUSE_KV): x2's vectors (k) stored once rotated,
// and those of v by blocks of their own; tokens t < t0 not stored (kv_write's rule for a long chunk of a ring)
struct rope_store {
    osp_cu_kvlayer L;
    const osp_cu_kvrow *rows; // NULL: no store
    const float *v;
    int32_t t0;
};

// one block per head vector, x1's then x2's (then v's, storing): the vector's norm when its side has one
// (rms_row, the norm kernel's block size: bitwise a norm launch), then its RoPE
__global__ void norm_rope_kernel(osp_cu_rope_side s1, osp_cu_rope_side s2, int64_t n1, int32_t T, int32_t D,
                                 const float *inv, const int32_t *pos, const __grid_constant__ rope_store st,
                                 int64_t n2) {
    __shared__ float sh[32];
    int64_t vec = blockIdx.x;
    if (st.rows && vec >= n1 + n2) { // a V vector: stored as it is
        pdl_wait();
        pdl_trigger();
        vec -= n1 + n2;
        const int64_t H = st.L.n_kv_heads, row = vec / H;
        const int32_t b = (int32_t)(row / T), t = (int32_t)(row % T);
        if (t >= st.t0) kv_store(st.L, st.rows[b], kv_slot(st.L, st.rows[b].pos + t), vec % H, 1, st.v + vec * D);
        return;
    }
    osp_cu_rope_side sd = s1;
    const bool second = vec >= n1;
    if (second) vec -= n1, sd = s2;
    float *v = sd.x + vec * D;
    if (sd.norm) {
        rms_row(v, v, NULL, sd.w, D, sd.eps, sd.add_one, sh);
    } else {
        pdl_wait();
        pdl_trigger();
    }
    __syncthreads(); // the normed vector, written by the block, is read back by other threads
    const int64_t row = vec / sd.heads;
    const int32_t b = (int32_t)(row / T), t = (int32_t)(row % T), half = D / 2;
    for (int32_t pair = threadIdx.x; pair < half; pair += blockDim.x) rope_rot(v, pair, half, pos[b] + t, inv);
    if (second && st.rows && t >= st.t0) {
        __syncthreads(); // the rotated vector, read back by the threads that store it
        kv_store(st.L, st.rows[b], kv_slot(st.L, st.rows[b].pos + t), vec % sd.heads, 0, v);
    }
}

extern "C" int osp_cu_norm_rope_store(osp_cu_stream st, const osp_cu_rope_side *a, const osp_cu_rope_side *b,
                                      int32_t B, int32_t T, int32_t D, const float *inv, const int32_t *pos,
                                      const osp_cu_kvlayer *L, const osp_cu_kvrow *rows, const float *v) {
    const int64_t n1 = (int64_t)B * T * a->heads, n2 = b ? (int64_t)B * T * b->heads : 0;
    osp_cu_rope_side none = {};
    rope_store sto;
    memset(&sto, 0, sizeof sto);
    int64_t n3 = 0;
    if (L && rows) {
        if (!b || b->heads != L->n_kv_heads || D != L->head_dim || !v) return (int)cudaErrorInvalidValue;
        sto.L = *L, sto.rows = rows, sto.v = v;
        sto.t0 = L->sliding && T > L->ring ? T - L->ring : 0;
        n3 = n2;
    }
    if (n1 + n2 + n3 > 0)
        pdl_launch(norm_rope_kernel, dim3((unsigned)(n1 + n2 + n3)), dim3(norm_threads(D)), 0, st, *a, b ? *b : none,
                   n1, T, D, inv, pos, sto, n2);
    return launch_status();
}

extern "C" int osp_cu_rope2(osp_cu_stream st, float *x1, int64_t h1, float *x2, int64_t h2, int32_t B, int32_t T,
                            int32_t D, const float *inv, const int32_t *pos) {
    int64_t n1 = (int64_t)B * T * h1 * (D / 2), total = n1 + (x2 ? (int64_t)B * T * h2 * (D / 2) : 0);
    if (total > 0) pdl_launch(rope_kernel, dim3(blocks_for(total, EW)), dim3(EW), 0, st, x1, h1, x2, h2, T, D, inv, pos, n1, total);
    return launch_status();
}

extern "C" int osp_cu_rope(osp_cu_stream st, float *x, int32_t B, int32_t T, int64_t heads, int32_t D,
                           const float *inv, const int32_t *pos) {
    return osp_cu_rope2(st, x, heads, NULL, 0, B, T, D, inv, pos);
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
    float *o = out + (int64_t)rows[r] * H + j;
    *o = __fmaf_rn(w[r], acc[i], *o); // as osp_cu_moe_combine adds a token's experts
}

extern "C" int osp_cu_gather(osp_cu_stream st, float *dst, const float *src, const int32_t *rows, int64_t n,
                             int64_t H) {
    if (n * H > 0) launch(gather_kernel, blocks_for(n * H, EW), EW, 0, st, dst, src, rows, n, H);
    return launch_status();
}

// x[i] = row ids[i] of w (f32 values; an affine code's s * c + b rounded as the host's osp_weight_row_f32 rounds
// it, each operation once), times scale when scale != 1 (the host's embed: one rounding)
__global__ void embed_ids_kernel(osp_cu_weight w, const int32_t *ids, int64_t n, float scale, float *x) {
    const int64_t i = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, H = w.cols;
    if (i >= n || c >= H) return;
    const int64_t r = ids[i];
    float v;
    if (!w.qbits) {
        v = load_float((const unsigned char *)w.data + r * H * (w.dtype == 0 ? 4 : 2), w.dtype, c);
    } else {
        const int64_t ng = H / w.group, g = c / w.group;
        const unsigned char *row = (const unsigned char *)w.data + r * (H * w.qbits / 8);
        const float sc = load_float(w.scales, w.sdtype, r * ng + g), bi = load_float(w.biases, w.sdtype, r * ng + g);
        v = __fadd_rn(__fmul_rn(sc, (float)q_code(row, w.qbits, c)), bi);
    }
    x[i * H + c] = scale != 1.0f ? __fmul_rn(v, scale) : v;
}

extern "C" int osp_cu_embed_ids(osp_cu_stream st, const osp_cu_weight *w, const int32_t *ids, int64_t n, float scale,
                                float *x) {
    if (n > 0 && w->cols > 0) launch(embed_ids_kernel, dim3(blocks_for(w->cols, EW), (unsigned)n), dim3(EW), 0, st, *w, ids, n, scale, x);
    return launch_status();
}

extern "C" int osp_cu_scatter_axpy(osp_cu_stream st, float *out, const float *acc, const int32_t *rows,
                                   const float *w, int64_t n, int64_t H) {
    if (n * H > 0) launch(scatter_axpy_kernel, blocks_for(n * H, EW), EW, 0, st, out, acc, rows, w, n, H);
    return launch_status();
}

// ---- routed experts on the device (osp_cu_moe_*) ----

#define MOE_RW 4 // tokens (warps) a block of the routing

// one warp a token: the host's routing (cuda.c's moe: softmax, top-k with ties to the lower index,
// renormalized, times the expert's scale), the sums in the host's order
__global__ void __launch_bounds__(MOE_RW *WARP) moe_route_kernel(const float *logits, int64_t N, int E, int K,
                                                                 const float *pes, int32_t *top_idx, float *top_w) {
    OSP_DYN_SHARED(float, moe_sm);
    const int lane = threadIdx.x % WARP, wl = threadIdx.x / WARP;
    const int64_t i = (int64_t)blockIdx.x * MOE_RW + wl;
    if (i >= N) return;
    float *p = moe_sm + (int64_t)wl * E;
    const float *l = logits + i * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += WARP) {
        const float v = l[e];
        mx = v > mx ? v : mx;
    }
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = v > mx ? v : mx;
    }
    for (int e = lane; e < E; e += WARP) p[e] = expf(l[e] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int e = 0; e < E; e++) sum = __fadd_rn(sum, p[e]);
    const float inv = 1.0f / __shfl_sync(0xffffffffu, sum, 0);
    for (int e = lane; e < E; e += WARP) p[e] = __fmul_rn(p[e], inv);
    __syncwarp();
    unsigned taken = 0; // bit m: expert lane + 32 m is chosen already
    float wsum = 0.0f;
    int32_t *ti = top_idx + i * K;
    float *tw = top_w + i * K;
    for (int k = 0; k < K; k++) {
        float bv = 0.0f;
        int bi = -1;
        for (int m = 0; lane + WARP * m < E; m++) {
            const int e = lane + WARP * m;
            if ((taken >> m) & 1u) continue;
            if (bi < 0 || p[e] > bv) bv = p[e], bi = e;
        }
        for (int o = WARP / 2; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        bi = __shfl_sync(0xffffffffu, bi, 0), bv = __shfl_sync(0xffffffffu, bv, 0);
        if (bi < 0) bi = 0; // (K <= E: never)
        if ((bi % WARP) == lane) taken |= 1u << (bi / WARP);
        if (lane == 0) {
            ti[k] = bi, tw[k] = bv;
            wsum = __fadd_rn(wsum, bv);
        }
    }
    if (lane == 0)
        for (int k = 0; k < K; k++) tw[k] = __fmul_rn(__fdiv_rn(tw[k], wsum), pes[ti[k]]);
}

#define MOE_GT 1024
#define MOE_MAX_E 1024

// one block: the routing's pairs (token, k) grouped by expert, the active experts in increasing order as slots
__global__ void __launch_bounds__(MOE_GT) moe_group_kernel(const int32_t *top_idx, int64_t N, int K, int E,
                                                           int32_t *g_e, int32_t *g_off, int32_t *g_cnt,
                                                           int32_t *g_nact, int32_t *pair_row, int32_t *pos_of,
                                                           int32_t *order) {
    __shared__ int32_t cnt[MOE_MAX_E], base[MOE_MAX_E], fill[MOE_MAX_E];
    const int64_t P = N * K;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = fill[e] = base[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[top_idx[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0, j = 0;
        for (int e = 0; e < E; e++)
            if (cnt[e]) {
                g_e[j] = e, g_off[j] = run, g_cnt[j] = cnt[e], base[e] = run;
                run += cnt[e], j++;
            }
        *g_nact = j;
    }
    __syncthreads();
    // a slot's rows in any order: a token's numbers do not depend on its neighbours in a matmul
    for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = top_idx[p];
        const int32_t pos = base[e] + atomicAdd(&fill[e], 1);
        pair_row[pos] = (int32_t)(p / K);
        pos_of[p] = pos;
    }
    // each token's pairs by expert: the host adds the experts' outputs in that order
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        int32_t *o = order + i * K;
        for (int k = 0; k < K; k++) {
            const int32_t pk = (int32_t)(i * K + k), ek = top_idx[pk];
            int j = k;
            while (j > 0 && top_idx[o[j - 1]] > ek) o[j] = o[j - 1], j--;
            o[j] = pk;
        }
    }
}

__global__ void moe_combine_kernel(float *out, const float *acc, const float *top_w, const int32_t *pos_of,
                                   const int32_t *order, int64_t N, int K, int64_t H) {
    pdl_wait();
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * H) return;
    const int64_t r = i / H, d = i % H;
    float v = 0.0f;
    for (int k = 0; k < K; k++) {
        const int32_t p = order[r * K + k];
        v = __fmaf_rn(top_w[p], acc[(int64_t)pos_of[p] * H + d], v);
    }
    out[i] = v;
}

extern "C" int osp_cu_moe_route(osp_cu_stream st, const float *logits, int64_t N, int E, int K, const float *pes,
                                int32_t *top_idx, float *top_w) {
    if (E < 1 || E > MOE_MAX_E || K < 1 || K > E) return (int)cudaErrorInvalidValue;
    if (N > 0)
        launch(moe_route_kernel, blocks_for(N, MOE_RW), MOE_RW * WARP, sizeof(float) * MOE_RW * E, st, logits, N, E, K, pes,
                                                                                                  top_idx, top_w);
    return launch_status();
}

extern "C" int osp_cu_moe_group(osp_cu_stream st, const int32_t *top_idx, int64_t N, int K, int E, int32_t *g_e,
                                int32_t *g_off, int32_t *g_cnt, int32_t *g_nact, int32_t *pair_row, int32_t *pos_of,
                                int32_t *order) {
    if (E < 1 || E > MOE_MAX_E) return (int)cudaErrorInvalidValue;
    launch(moe_group_kernel, 1, MOE_GT, 0, st, top_idx, N, K, E, g_e, g_off, g_cnt, g_nact, pair_row, pos_of, order);
    return launch_status();
}

extern "C" int osp_cu_moe_combine(osp_cu_stream st, float *out, const float *acc, const float *top_w,
                                  const int32_t *pos_of, const int32_t *order, int64_t N, int K, int64_t H) {
    if (N * H > 0)
        pdl_launch(moe_combine_kernel, dim3(blocks_for(N * H, EW)), dim3(EW), 0, st, out, acc, top_w, pos_of, order, N,
                   K, H);
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

// Store head vector x (D floats the block can read) as head h of K (which 0) or V (1) at a row's slot: f32
// and bf16 by the block's threads, quantized by thread 0 (exactness over speed: a KV vector is small).
// Every store of the cache (kv_write_kernel, norm_rope_kernel's) is this one.
__device__ void kv_store(const osp_cu_kvlayer &L, const osp_cu_kvrow &R, int32_t slot, int64_t h, int which,
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

// a block per (batch row i, token t, head h)
__global__ void kv_write_kernel(osp_cu_kvlayer L, const osp_cu_kvrow *rows, int32_t T, int32_t t0, const float *k,
                                const float *v) {
    pdl_wait();
    pdl_trigger();
    const int32_t i = blockIdx.x, t = t0 + blockIdx.y, h = blockIdx.z;
    const osp_cu_kvrow R = rows[i];
    const int64_t H = L.n_kv_heads, D = L.head_dim;
    const int32_t slot = kv_slot(L, R.pos + t);
    const int64_t src = ((int64_t)i * T + t) * H * D + (int64_t)h * D;
    kv_store(L, R, slot, h, 0, k + src);
    kv_store(L, R, slot, h, 1, v + src);
}

extern "C" int osp_cu_kv_write(osp_cu_stream st, const osp_cu_kvlayer *L, const osp_cu_kvrow *rows, int32_t nb,
                               int32_t T, const float *k, const float *v) {
    int32_t t0 = L->sliding && T > L->ring ? T - L->ring : 0; // older ones would be overwritten anyway
    if (nb <= 0 || T - t0 <= 0) return 0;
    dim3 grid((unsigned)nb, (unsigned)(T - t0), (unsigned)L->n_kv_heads);
    pdl_launch(kv_write_kernel, grid, dim3(64), 0, st, *L, rows, T, t0, k, v);
    return launch_status();
}

// ---- attention: split over positions ("flash decoding") ----
//
// A block per (query row, KV head, split of ATT_S positions): the G query
// heads sharing the KV head are computed together (each K and V row is read
// once for all of them). Positions of a query [lo, p] are cut into splits
// at fixed offsets from lo, so a query's splits, and the order every sum is
// taken in, depend on its own positions only (not on the batch, nor on the
// grid's size: splits past a query's range are empty and add exact zeros).
// One split: the result is written directly; several: partials (max, sum,
// unnormalized output) are combined by attn_combine_kernel in split order.

#define ATT_S 128
#define ATT_MAXG 16
#define ATT_MAXD 512

__device__ __forceinline__ void kv_span(const osp_cu_attn &a, int32_t pos0, int32_t t, int32_t &lo, int32_t &p) {
    p = pos0 + t;
    lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
}

// value d of K/V row j of a query's row: cached (j < cend) or from this chunk
// (cend: the chunk's start, or, when the chunk is already stored (exact
// tokens), the query's own position)
__device__ __forceinline__ float kv_at(const osp_cu_attn &a, const osp_cu_kvrow &R, int which, int32_t b, int32_t hk,
                                       int32_t j, int32_t d, int32_t cend) {
    const osp_cu_kvlayer &L = a.L;
    if (j < cend) return kv_value(L, R, which, hk, kv_slot(L, j), d);
    const float *src = which ? a.v : a.k;
    return src[(((int64_t)b * a.T + (j - R.pos)) * L.n_kv_heads + hk) * L.head_dim + d];
}

// a K row (f32 in the cache or the chunk): 16-byte loads
__device__ __forceinline__ const float *k_row_f32(const osp_cu_attn &a, const osp_cu_kvrow &R, int32_t b, int32_t hk,
                                                  int32_t j, int32_t cend) {
    const osp_cu_kvlayer &L = a.L;
    const int64_t D = L.head_dim;
    if (j >= cend) return a.k + (((int64_t)b * a.T + (j - R.pos)) * L.n_kv_heads + hk) * D;
    if (L.bits != 0) return NULL;
    return (const float *)R.mem + ((int64_t)hk * R.cap + kv_slot(L, j)) * D;
}

// a query head's output value d from its nz splits' partials pp (max, sum, unnormalized output each):
// out = sum_z w_z acc_z / sum_z w_z l_z, w_z = exp(m_z - max m), the splits in order.
__device__ __forceinline__ float combine_one(const float *pp, int32_t nz, int32_t D, int d) {
    float m = -INFINITY;
    for (int32_t z = 0; z < nz; z++) m = fmaxf(m, pp[(int64_t)z * (D + 2)]);
    float l = 0.0f, o = 0.0f;
    for (int32_t z = 0; z < nz; z++) {
        const float w = expf(pp[(int64_t)z * (D + 2)] - m);
        l = __fmaf_rn(w, pp[(int64_t)z * (D + 2) + 1], l);
        o = __fmaf_rn(w, pp[(int64_t)z * (D + 2) + 2 + d], o);
    }
    return __fdiv_rn(o, l);
}

// Both attention kernels' common steps (any block size: loops stride by blockDim.x):
// a block's query row (b * T + t), KV head, split z and its positions [j0, j1) of the query's [lo, p];
// positions before cend come from the cache; pbase: the block's first partial (+ g * nsplit for head g)
struct att_blk {
    int64_t row, pbase;
    int32_t hk, z, b, t, lo, p, cend, j0, j1;
    osp_cu_kvrow R;
};
__device__ __forceinline__ att_blk att_block(const osp_cu_attn &a, int32_t nsplit) {
    att_blk k;
    k.row = blockIdx.x, k.hk = blockIdx.y, k.z = blockIdx.z;
    k.b = (int32_t)(k.row / a.T), k.t = (int32_t)(k.row % a.T);
    k.R = a.rows[k.b];
    kv_span(a, k.R.pos, k.t, k.lo, k.p);
    k.cend = a.chunk_stored ? k.p : k.R.pos;
    k.j0 = k.lo + k.z * ATT_S, k.j1 = min(k.j0 + ATT_S, k.p + 1);
    k.pbase = ((k.row * a.n_heads) + (int64_t)k.hk * (a.n_heads / a.L.n_kv_heads)) * nsplit + k.z;
    return k;
}
// the block's q heads into qs [G][D] and, a.rope and holding the query's own position (returned), that k row
// (unrotated) into krot [D]; then the block synchronizes
__device__ __forceinline__ bool att_load(const osp_cu_attn &a, const att_blk &k, float *qs, float *krot) {
    const int32_t D = a.L.head_dim, Hkv = a.L.n_kv_heads, G = a.n_heads / Hkv;
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i] = a.q[(k.row * a.n_heads + (int64_t)k.hk * G) * D + i];
    const bool own = a.rope && k.p >= k.j0 && k.p < k.j1;
    if (own)
        for (int d = threadIdx.x; d < D; d += blockDim.x) krot[d] = a.k[(((int64_t)k.b * a.T + k.t) * Hkv + k.hk) * D + d];
    __syncthreads();
    return own;
}

// a.rope: the block rotates its q heads qs [G][D] and, holding the query's own position (own), that k row krot,
// and stores it and the v row (rope_rot, kv_store: the numbers of the RoPE launch and the store it replaces)
__device__ __forceinline__ void split_rope(const osp_cu_attn &a, const att_blk &k, float *qs, float *krot, bool own) {
    const int32_t D = a.L.head_dim, Hkv = a.L.n_kv_heads, G = a.n_heads / Hkv, half = D / 2, pp = k.R.pos + k.t;
    for (int i = threadIdx.x; i < G * half; i += blockDim.x) rope_rot(qs + (i / half) * D, i % half, half, pp, a.rope_inv);
    if (own)
        for (int i = threadIdx.x; i < half; i += blockDim.x) rope_rot(krot, i, half, pp, a.rope_inv);
    __syncthreads();
    if (own) {
        kv_store(a.L, k.R, kv_slot(a.L, pp), k.hk, 0, krot);
        kv_store(a.L, k.R, kv_slot(a.L, pp), k.hk, 1, a.v + (((int64_t)k.b * a.T + k.t) * Hkv + k.hk) * D);
    }
}

// per head g, a warp each: the split's max m of its scores ps [G][ATT_S] (nj of them), p = exp(s - m) in their
// place, and their sum l; stat [G][2] = (m, l)
__device__ __forceinline__ void split_softmax(float *ps, float *stat, int G, int32_t nj) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    for (int g = warp; g < G; g += blockDim.x / WARP) {
        float m = -INFINITY;
        for (int i = lane; i < ATT_S; i += WARP) m = fmaxf(m, ps[g * ATT_S + i]);
        m = warp_max(m);
        float l = 0.0f;
        for (int i = lane; i < ATT_S; i += WARP) {
            const float e = i < nj ? expf(ps[g * ATT_S + i] - m) : 0.0f;
            ps[g * ATT_S + i] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) stat[2 * g] = m, stat[2 * g + 1] = l;
    }
    __syncthreads();
}

// the output of one split (a.out), or the split's partials (max, sum, unnormalized output): the nsub subsets'
// sums red [nsub][G][D] added in subset order
__device__ __forceinline__ void split_write(const osp_cu_attn &a, float *part, int32_t nsplit,
                                            const float *red, const float *stat, int nsub, const att_blk &k) {
    const int32_t D = a.L.head_dim, G = a.n_heads / a.L.n_kv_heads;
    const int64_t row = k.row, pbase = k.pbase;
    const int32_t hk = k.hk;
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        float o = red[i];
        for (int u = 1; u < nsub; u++) o = __fadd_rn(o, red[(int64_t)u * G * D + i]);
        const float m = stat[2 * g], l = stat[2 * g + 1];
        if (nsplit == 1) {
            a.out[(row * a.n_heads + (int64_t)hk * G + g) * D + d] = __fdiv_rn(o, l);
        } else {
            float *po = part + (pbase + (int64_t)g * nsplit) * (D + 2);
            if (d == 0) po[0] = m, po[1] = l;
            po[2 + d] = o;
        }
    }
}

// GM: the query heads per KV head rounded up to a power of two (loops unroll to it)
template <int GM>
__global__ void __launch_bounds__(ATT_S) attn_split_kernel(osp_cu_attn a, float *part, int32_t nsplit) {
    OSP_DYN_SHARED(float, sm);
    const int32_t D = a.L.head_dim, Hkv = a.L.n_kv_heads, G = a.n_heads / Hkv;
    float *qs = sm;                        // [G][D]
    float *ps = qs + G * D * (ATT_S / (D / 4)); // [G][ATT_S] (qs: q [G][D], later [nsub][G][D])
    float *stat = ps + G * ATT_S;          // [G]: tile max, then correction
    const att_blk k = att_block(a, nsplit);
    const int32_t hk = k.hk, b = k.b, p = k.p, cend = k.cend, j0 = k.j0, j1 = k.j1;
    const osp_cu_kvrow &R = k.R;
    if (j0 > p) return; // an empty split: the combine reads a query's own splits only
    pdl_wait();
    pdl_trigger();
    // a.rope (one-token steps): q and k come unrotated; the block rotates its q heads, and the split holding
    // the query's own position rotates that k row too and stores it and the v row (split_rope)
    float *krot = stat + ((2 * G + 3) & ~3); // [D], 16-byte aligned (read as float4)
    const bool own = att_load(a, k, qs, krot);
    if (a.rope) split_rope(a, k, qs, krot, own);
    // scores: a thread per position, all G heads
    const int32_t j = j0 + threadIdx.x;
    float sc[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) sc[g] = 0.0f;
    if (j < j1) {
        const float *kr = own && j == p ? krot : k_row_f32(a, R, b, hk, j, cend);
        if (kr && (D & 3) == 0) {
            // 8 loads of the row in flight, then their products in order
            for (int d0 = 0; d0 < D; d0 += 32) {
                float4 kq[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    kq[u] = d0 + 4 * u < D ? *reinterpret_cast<const float4 *>(kr + d0 + 4 * u)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int d = d0 + 4 * u;
                    if (d >= D) break;
                    const float4 kv = kq[u];
#pragma unroll
                    for (int g = 0; g < GM; g++)
                        if (g < G) {
                            const float *q = qs + g * D + d;
                            sc[g] = __fmaf_rn(q[3], kv.w, __fmaf_rn(q[2], kv.z, __fmaf_rn(q[1], kv.y, __fmaf_rn(q[0], kv.x, sc[g]))));
                        }
                }
            }
        } else {
            for (int d = 0; d < D; d++) {
                const float kv = kv_at(a, R, 0, b, hk, j, d, cend);
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) sc[g] = __fmaf_rn(qs[g * D + d], kv, sc[g]);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= G) break;
        float s = -INFINITY;
        if (j < j1) s = a.softcap > 0 ? a.softcap * tanhf(sc[g] * a.scale / a.softcap) : sc[g] * a.scale;
        ps[g * ATT_S + threadIdx.x] = s;
    }
    __syncthreads();
    split_softmax(ps, stat, G, j1 - j0);
    // outputs: a thread owns 4 consecutive dimensions and every nsub-th
    // position (D/4 threads cover a row, ATT_S / (D/4) subsets of positions),
    // all G heads; 8 V rows in flight per thread. The subsets' sums are then
    // added in subset order.
    const int tpr = D / 4, nsub = ATT_S / tpr, sub = threadIdx.x / tpr, d4 = (threadIdx.x % tpr) * 4;
    float acc[GM][4];
#pragma unroll
    for (int g = 0; g < GM; g++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[g][e] = 0.0f;
    const int32_t nj = j1 - j0;
    const bool f32 = a.L.bits == 0;
    if (sub < nsub) {
        for (int32_t jb = sub; jb < nj; jb += 8 * nsub) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int32_t jj = jb + u * nsub, jp = j0 + jj;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (jj >= nj) continue;
                if (jp >= cend)
                    v[u] = ld4(a.v + (((int64_t)b * a.T + (jp - R.pos)) * Hkv + hk) * D + d4);
                else if (f32)
                    v[u] = ld4((const float *)R.mem + ((int64_t)(Hkv + hk) * R.cap + kv_slot(a.L, jp)) * D + d4);
                else
                    v[u] = make_float4(kv_value(a.L, R, 1, hk, kv_slot(a.L, jp), d4),
                                       kv_value(a.L, R, 1, hk, kv_slot(a.L, jp), d4 + 1),
                                       kv_value(a.L, R, 1, hk, kv_slot(a.L, jp), d4 + 2),
                                       kv_value(a.L, R, 1, hk, kv_slot(a.L, jp), d4 + 3));
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int32_t jj = jb + u * nsub;
                if (jj >= nj) break;
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) {
                        const float pg = ps[g * ATT_S + jj];
                        acc[g][0] = __fmaf_rn(pg, v[u].x, acc[g][0]);
                        acc[g][1] = __fmaf_rn(pg, v[u].y, acc[g][1]);
                        acc[g][2] = __fmaf_rn(pg, v[u].z, acc[g][2]);
                        acc[g][3] = __fmaf_rn(pg, v[u].w, acc[g][3]);
                    }
            }
        }
    }
    __syncthreads(); // qs is free: it takes the subsets' sums [nsub][G][D]
    float *red = qs;
    if (sub < nsub)
#pragma unroll
        for (int g = 0; g < GM; g++)
            if (g < G)
#pragma unroll
                for (int e = 0; e < 4; e++) red[((int64_t)sub * G + g) * D + d4 + e] = acc[g][e];
    __syncthreads();
    split_write(a, part, nsplit, red, stat, nsub, k);
}

// ---- attention, compact (osp_cu_attn.compact): the splits of attn_split_kernel and their partials (and its
// RoPE taken in, and its last split's combine), for an f32 cache, in code that loops instead of unrolling. A
// decode step's attention is a few blocks on cold instruction caches (ncu: half its stalls wait for an instruction fetch), so it runs short
// loops over few instructions: a K row's 64 dimensions held once and reused for each head, a unit of the
// output (4 dimensions of a head over a subset of positions) a loop step with 16 V rows in flight. Every sum
// is the split kernel's, in its order: the numbers are the same (test_attn_compact), so which kernel a step
// takes (by its number of tokens) does not change a row's numbers.

#define ATD_NT 256 // threads a block: ATD_NT / ATT_S threads a position, each its share of the heads
#define ATD_KC 16  // float4s of a K row a thread holds at once
#define ATD_VU 16  // V rows a thread has in flight

__global__ void __launch_bounds__(ATD_NT) attn_dec_kernel(osp_cu_attn a, float *part, int32_t nsplit) {
    OSP_DYN_SHARED(float, sm);
    const int32_t D = a.L.head_dim, Hkv = a.L.n_kv_heads, G = a.n_heads / Hkv, D4 = D / 4;
    const int nsub = ATT_S / D4; // the split kernel's subsets of positions
    float *qs = sm;                     // [G][D], later the subsets' sums [nsub][G][D]
    float *ps = qs + G * D * nsub;      // [G][ATT_S]
    float *stat = ps + G * ATT_S;       // [G]: max, sum
    const att_blk k = att_block(a, nsplit);
    const int32_t hk = k.hk, b = k.b, p = k.p, cend = k.cend, j0 = k.j0, j1 = k.j1, nj = j1 - j0;
    const osp_cu_kvrow &R = k.R;
    if (j0 > p) return;
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x;
    // a.rope: the split kernel's rotation of q, and of the own k row, stored with v
    float *krot = stat + ((2 * G + 3) & ~3); // [D], 16-byte aligned
    const bool own = att_load(a, k, qs, krot);
    if (a.rope) split_rope(a, k, qs, krot, own);
    // scores: position jl, heads g0, g0 + gs, ... (the split kernel's sums: dimensions in order)
    const int jl = tid % ATT_S, g0 = tid / ATT_S, gs = ATD_NT / ATT_S;
    if (jl < nj) {
        const float *kr = own && j0 + jl == p ? krot : k_row_f32(a, R, b, hk, j0 + jl, cend);
#pragma unroll 1
        for (int c0 = 0; c0 < D4; c0 += ATD_KC) {
            float4 kq[ATD_KC];
#pragma unroll
            for (int u = 0; u < ATD_KC; u++) kq[u] = c0 + u < D4 ? ld4(kr + 4 * (c0 + u)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
            for (int g = g0; g < G; g += gs) {
                float s = c0 ? ps[g * ATT_S + jl] : 0.0f;
                const float *q = qs + g * D + 4 * c0;
#pragma unroll
                for (int u = 0; u < ATD_KC; u++) {
                    if (c0 + u >= D4) break;
                    const float4 kv = kq[u];
                    s = __fmaf_rn(q[4 * u + 3], kv.w, __fmaf_rn(q[4 * u + 2], kv.z, __fmaf_rn(q[4 * u + 1], kv.y, __fmaf_rn(q[4 * u], kv.x, s))));
                }
                ps[g * ATT_S + jl] = s;
            }
        }
#pragma unroll 1
        for (int g = g0; g < G; g += gs) {
            const float s = ps[g * ATT_S + jl];
            ps[g * ATT_S + jl] = a.softcap > 0 ? a.softcap * tanhf(s * a.scale / a.softcap) : s * a.scale;
        }
    } else {
        for (int g = g0; g < G; g += gs) ps[g * ATT_S + jl] = -INFINITY;
    }
    __syncthreads();
    split_softmax(ps, stat, G, nj);
    // outputs: a unit is (subset sub, head g, dimensions d4..d4+3), the split kernel's subsets (ATT_S / (D/4)
    // of positions: sub, sub + nsub, ... summed in order), then the subsets added in order: the split kernel's
    // sums exactly, so the two kernels' numbers are the same. qs (free now) takes the subsets' sums.
    // V row jp: from the chunk (jp >= cend) at a.v[vco + jp * Hkv * D], else from the cache at vk + slot * D,
    // the slot (j0's, plus jj) wrapped once around a sliding layer's ring (the launch needs ring >= ATT_S)
    const int64_t vco = ((int64_t)b * a.T * Hkv + hk) * D - (int64_t)R.pos * Hkv * D;
    const float *vk = (const float *)R.mem + ((int64_t)Hkv + hk) * R.cap * D;
    const int32_t s0 = kv_slot(a.L, j0), ringw = a.L.sliding ? a.L.ring : 0x7fffffff;
#pragma unroll 1
    for (int un = tid; un < nsub * G * D4; un += ATD_NT) {
        const int sub = un / (G * D4), g = (un / D4) % G, d4 = (un % D4) * 4;
        const float *pg = ps + g * ATT_S;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
        for (int32_t jb = sub; jb < nj; jb += ATD_VU * nsub) {
            float4 v[ATD_VU];
#pragma unroll
            for (int u = 0; u < ATD_VU; u++) {
                const int32_t jj = jb + u * nsub, jp = j0 + jj, sl = s0 + jj;
                v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (jj < nj)
                    v[u] = ld4((jp >= cend ? a.v + (vco + (int64_t)jp * Hkv * D) : vk + (int64_t)(sl >= ringw ? sl - ringw : sl) * D) + d4);
            }
#pragma unroll
            for (int u = 0; u < ATD_VU; u++) {
                const int32_t jj = jb + u * nsub;
                if (jj >= nj) break;
                const float w = pg[jj];
                acc.x = __fmaf_rn(w, v[u].x, acc.x);
                acc.y = __fmaf_rn(w, v[u].y, acc.y);
                acc.z = __fmaf_rn(w, v[u].z, acc.z);
                acc.w = __fmaf_rn(w, v[u].w, acc.w);
            }
        }
        float *r = qs + ((int64_t)sub * G + g) * D + d4;
        r[0] = acc.x, r[1] = acc.y, r[2] = acc.z, r[3] = acc.w;
    }
    __syncthreads();
    split_write(a, part, nsplit, qs, stat, nsub, k);
}

// a block per (query, head): combine_one over the query's own splits
__global__ void attn_combine_kernel(osp_cu_attn a, const float *part, int32_t nsplit) {
    pdl_wait();
    pdl_trigger();
    const int64_t row = blockIdx.x;
    const int32_t h = blockIdx.y, D = a.L.head_dim;
    const int32_t b = (int32_t)(row / a.T), t = (int32_t)(row % a.T);
    int32_t lo, p;
    kv_span(a, a.rows[b].pos, t, lo, p);
    const int32_t nz = min((p - lo) / ATT_S + 1, nsplit);
    const float *pp = part + ((row * a.n_heads) + h) * (int64_t)nsplit * (D + 2);
    float *out = a.out + (row * a.n_heads + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[d] = combine_one(pp, nz, D, d);
}

extern "C" int64_t osp_cu_attention_scratch(const osp_cu_attn *a, int32_t nsplit) {
    return nsplit > 1 ? (int64_t)a->nb * a->T * a->n_heads * nsplit * (a->L.head_dim + 2) : 0;
}

extern "C" int osp_cu_attention(osp_cu_stream st, const osp_cu_attn *a, float *part, int32_t nsplit) {
    const int32_t G = a->n_heads / a->L.n_kv_heads, D = a->L.head_dim;
    if (D > ATT_MAXD || G > ATT_MAXG || G * a->L.n_kv_heads != a->n_heads) return (int)cudaErrorInvalidValue;
    if (nsplit < 1) nsplit = 1;
    if (D % 4 || D / 4 > ATT_S) return (int)cudaErrorInvalidValue;
    if (a->rope && (a->T != 1 || a->chunk_stored || !a->rope_inv)) return (int)cudaErrorInvalidValue;
    const int nsub = ATT_S / (D / 4);
    size_t qs = (size_t)G * D * (nsub > 1 ? nsub : 1); // q, then the subsets' sums
    size_t shm = sizeof(float) * (qs + (size_t)(G * ATT_S + ((2 * G + 3) & ~3) + D)); // (+ D: the own k row rotated)
    if (shm > 48 * 1024 - 64) return (int)cudaErrorInvalidValue; // (64: the kernel's own shared word)
    dim3 grid((unsigned)((int64_t)a->nb * a->T), (unsigned)a->L.n_kv_heads, (unsigned)nsplit);
    if (a->compact && a->L.bits == 0 && (!a->L.sliding || a->L.ring >= ATT_S)) // (the same shared memory)
        pdl_launch(attn_dec_kernel, grid, dim3(ATD_NT), shm, st, *a, part, nsplit);
    else if (G <= 1) pdl_launch(attn_split_kernel<1>, grid, dim3(ATT_S), shm, st, *a, part, nsplit);
    else if (G <= 2) pdl_launch(attn_split_kernel<2>, grid, dim3(ATT_S), shm, st, *a, part, nsplit);
    else if (G <= 4) pdl_launch(attn_split_kernel<4>, grid, dim3(ATT_S), shm, st, *a, part, nsplit);
    else if (G <= 8) pdl_launch(attn_split_kernel<8>, grid, dim3(ATT_S), shm, st, *a, part, nsplit);
    else pdl_launch(attn_split_kernel<16>, grid, dim3(ATT_S), shm, st, *a, part, nsplit);
    if (nsplit > 1) {
        dim3 g2((unsigned)((int64_t)a->nb * a->T), (unsigned)a->n_heads);
        pdl_launch(attn_combine_kernel, g2, dim3(D < 128 ? 64 : 128), 0, st, *a, (const float *)part, nsplit);
    }
    return launch_status();
}

// ---- conversions for the tensor-core GEMMs (production prefill) ----

__global__ void to_bf16_kernel(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f32_to_bf16(src[i]);
}

extern "C" int osp_cu_to_bf16(osp_cu_stream st, uint16_t *dst, const float *src, int64_t n) {
    if (n > 0) launch(to_bf16_kernel, blocks_for(n, EW), EW, 0, st, dst, src, n);
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
    if (n > 0) launch(weight_bf16_kernel, blocks_for(n, EW), EW, 0, st, *w, dst);
    return launch_status();
}
