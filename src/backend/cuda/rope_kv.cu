// backend/cuda/rope_kv.cu: RoPE (alone, or with the head norms and the KV store in one launch) and the KV
// cache store (osp_cu_kv_write).
#include "kv.cuh"
#include "norm.cuh"

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

// ---- the KV cache (kv/kv.h's block layout) ----

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

