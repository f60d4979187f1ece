// backend/cuda/matvec.cu: the reference matmul (f32 arithmetic, any weight: a warp per row) and the matvec
// (warps streaming weight rows in 16-byte chunks), osp_cu_matmul / osp_cu_matmul_multi.
#include "common.cuh"

// ---- matmul: a warp per weight row, tokens in tiles of TT held in registers ----

#define MM_WARPS 4
#define MM_TT 8

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

template <int KIND> struct kind_traits {
    static const int E = KIND == 0 ? 4 : KIND == 1 || KIND == 2 ? 8 : KIND == 4 ? 32 : 16; // values per chunk
};

__device__ __forceinline__ float4 as_f4(uint4 u) {
    return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
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

