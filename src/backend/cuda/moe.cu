// backend/cuda/moe.cu: routed experts on the device: routing, grouping, the combine.
#include "common.cuh"

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

