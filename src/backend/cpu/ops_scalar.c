/* Scalar reference kernels: the definition every SIMD variant is tested
 * against. Straightforward loops, f32 accumulation. */
#include <math.h>
#include "backend/ops.h"

static void matmul_dense(const osp_weight *w, const float *x, int64_t n, float *y,
                         int64_t ldy, int64_t r0, int64_t r1) {
    size_t es = osp_dtype_size(w->dtype);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * w->cols * (int64_t)es;
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * w->cols;
            float acc = 0.0f;
            for (int64_t c = 0; c < w->cols; c++) acc += xt[c] * osp_load_float(row, w->dtype, c);
            y[t * ldy + (r - r0)] = acc;
        }
    }
}

/* Per group: s * sum(x * (q - c)) + (b + s * c) * sum(x), with c = 2^(bits-1).
 * MLX accumulates s * sum(x * q) + b * sum(x); for 8-bit codes the two terms
 * nearly cancel (b is about -128 s) and f32 loses ~5 bits, which fails the
 * goldens. Centring the codes keeps both terms small, so the result is as
 * accurate as summing x * (s * q + b) element by element, at the same cost. */
static void matmul_quant(const osp_weight *w, const float *x, int64_t n, float *y,
                         int64_t ldy, int64_t r0, int64_t r1) {
    int64_t ng = w->cols / w->group, rb = w->cols * w->qbits / 8;
    const int c = 1 << (w->qbits - 1);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * rb;
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * w->cols;
            float acc = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                float sq = 0.0f, sx = 0.0f;
                for (int64_t j = 0; j < w->group; j++) {
                    int64_t k = g * w->group + j;
                    sq += xt[k] * (float)((int)osp_q_code(row, w->qbits, k) - c);
                    sx += xt[k];
                }
                float s = osp_load_float(w->scales, w->sdtype, r * ng + g);
                float b = osp_load_float(w->biases, w->sdtype, r * ng + g);
                acc += s * sq + (b + s * (float)c) * sx;
            }
            y[t * ldy + (r - r0)] = acc;
        }
    }
}

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    if (w->qbits) matmul_quant(w, x, n, y, ldy, r0, r1);
    else matmul_dense(w, x, n, y, ldy, r0, r1);
}

static float dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps, int add_one) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) {
        float m = w ? (add_one ? 1.0f + w[i] : w[i]) : 1.0f;
        y[i] = x[i] * inv * m;
    }
}

static void softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

static float sumexp(const float *x, int64_t n, float *mx_out) {
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < n; i++) sum += expf(x[i] - mx);
    *mx_out = mx;
    return sum;
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        float v = g[i];
        y[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v))) * u[i];
    }
}

static void gelu_erf(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

static void softcap(float *x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

static void wsum(float *y, const float *w, const float *rows, int64_t n, int64_t stride, int64_t dim) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < dim; d++) y[d] += w[j] * rows[j * stride + d];
}

static void scores(float *y, const float *q, const float *rows, int64_t n, int64_t stride, int64_t dim) {
    for (int64_t j = 0; j < n; j++) {
        float s = 0;
        for (int64_t d = 0; d < dim; d++) s += q[d] * rows[j * stride + d];
        y[j] = s;
    }
}

static int32_t select_ge(int32_t *idx, const float *x, int32_t n, float thr) {
    int32_t c = 0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] >= thr) idx[c++] = i;
    return c;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b])) b = i;
    return b < 0 ? 0 : b;
}

static const osp_ops OPS = {
    .name = "scalar", .matmul = matmul, .dot = dot, .axpy = axpy, .rmsnorm = rmsnorm,
    .softmax = softmax, .sumexp = sumexp, .silu_mul = silu_mul, .gelu_tanh_mul = gelu_tanh_mul,
    .gelu_erf = gelu_erf, .softcap = softcap, .wsum = wsum, .scores = scores, .select_ge = select_ge, .argmax = argmax,
};

const osp_ops *osp_ops_scalar(void) { return &OPS; }
