// backend/cuda/convert.cu: conversions for the tensor-core GEMMs (production prefill).
#include "common.cuh"

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
