/* tensor/: dtypes, conversions, and the weight descriptor kernels consume.
 *
 * Weights stay in their stored format (mmapped, possibly unaligned):
 * dense f32/f16/bf16 rows, or MLX affine-quantized rows (packed u32
 * codes + per-group scales and biases). Activations are f32.
 */
#ifndef OSP_TENSOR_H
#define OSP_TENSOR_H

#include <stdint.h>
#include <string.h>

typedef enum osp_dtype {
    OSP_DT_F32 = 0,
    OSP_DT_F16,
    OSP_DT_BF16,
    OSP_DT_U32,
    OSP_DT_I32,
    OSP_DT_I8,
    OSP_DT_U8,
    OSP_DT_BOOL,
    OSP_DT_I16,
    OSP_DT_U16,
    OSP_DT_I64,
    OSP_DT_U64,
    OSP_DT_F64,
    OSP_DT_COUNT
} osp_dtype;

/* Size in bytes of one element. */
size_t osp_dtype_size(osp_dtype t);
const char *osp_dtype_name(osp_dtype t);
/* Parse a safetensors dtype string; returns -1 for unknown or refused
 * (F8_*) dtypes. */
int osp_dtype_parse(const char *s);

static inline float osp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t osp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float osp_f16_to_f32(uint16_t h);
uint16_t osp_f32_to_f16(float f);

/* Load element i of a float tensor stored as f32/f16/bf16 (unaligned ok). */
static inline float osp_load_float(const void *p, osp_dtype t, int64_t i) {
    const unsigned char *b = p;
    uint16_t h;
    float f;
    switch (t) {
    case OSP_DT_BF16: memcpy(&h, b + 2 * i, 2); return osp_bf16_to_f32(h);
    case OSP_DT_F16: memcpy(&h, b + 2 * i, 2); return osp_f16_to_f32(h);
    default: memcpy(&f, b + 4 * i, 4); return f;
    }
}

/* A linear weight W[rows=out, cols=in] as stored. y = x · Wᵀ.
 * Dense (dtype F32/F16/BF16): data is [rows, cols] row-major.
 * Quantized (qbits > 0, MLX affine): data is u32 [rows, cols*qbits/32],
 * a little-endian LSB-first bitstream per row; scales and biases are
 * [rows, cols/group] of dtype sdtype; w = scale * q + bias.
 * Pointers may be unaligned (MLX packs tensors back to back). */
typedef struct osp_weight {
    osp_dtype dtype;      /* dense element type; U32 when quantized */
    int64_t rows, cols;
    const void *data;
    int qbits, group;     /* 0, 0 when dense */
    osp_dtype sdtype;     /* scales/biases dtype */
    const void *scales;
    const void *biases;
    const void *packed;   /* the backend's own form of the weight (the CPU: 4-bit
                             repacked for the int8 path, backend/q8act.h), or
                             NULL; owned by the backend's placement */
} osp_weight;

/* Gated activations of an MLP: act(g) * u. */
typedef enum osp_act { OSP_ACT_SILU, OSP_ACT_GELU_TANH } osp_act;

/* Bytes one row of W occupies (codes + scales + biases when quantized). */
int64_t osp_weight_row_bytes(const osp_weight *w);

/* Dequantize/convert row r of W into out[cols] (f32). Scalar, exact. */
void osp_weight_row_f32(const osp_weight *w, int64_t r, float *out);

/* Extract code k from a packed LSB-first bitstream row. */
static inline uint32_t osp_q_code(const unsigned char *row, int bits, int64_t k) {
    int64_t bit = k * bits;
    int64_t byte = bit >> 3;
    int sh = (int)(bit & 7);
    uint32_t v = row[byte];
    if (sh + bits > 8) v |= (uint32_t)row[byte + 1] << 8;
    if (sh + bits > 16) v |= (uint32_t)row[byte + 2] << 16;
    return (v >> sh) & ((1u << bits) - 1u);
}

#endif
