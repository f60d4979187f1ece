// backend/cuda/rows.cu: row operations: norms, element-wise ops, the activation, softcap, argmax, gather,
// scatter, the embedding.
#include "norm.cuh"

// ---- row operations ----

#define NORM_THREADS 256

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

__global__ void rmsnorm_kernel(float *y, float *x, const float *t, const float *w, int64_t d, float eps, int add_one) {
    __shared__ float sh[32];
    rms_row_nt(y + blockIdx.x * d, x + blockIdx.x * d, t ? t + blockIdx.x * d : NULL, w, d, eps, add_one, sh,
               (int)blockDim.x);
}

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

