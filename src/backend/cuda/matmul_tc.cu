// backend/cuda/matmul_tc.cu: the production path's matmul on the tensor cores (tc_kernel) and its launch
// policy (tiles, split-K, the staged few-token kernel), grouped experts, the gate + up pair.
#include "common.cuh"

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
// the register kernel, except 4-bit: a step at a time from shared memory in 64 registers, four blocks); the others
// the register kernel. Three blocks a multiprocessor and bf16 rows too long
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

// blocks of the few-token register kernel a multiprocessor holds (tc_sk's wave; split weights never take the 4-bit
// staged kernel)
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
        if constexpr (KIND == 4) tc_go<KIND, KS, 1, 1, 1, 32 / KS, false, true>(st, set, x, n, sk, stb);
        else tc_go<KIND, KS, 1, 1, 2, 16 / KS, false, true>(st, set, x, n, sk, stb);
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

