// backend/cuda/attention.cu: attention, split over positions, in two kernels (the split one, and the compact
// one of few-token steps), and the splits' combine.
#include "kv.cuh"

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

