/* Quantized KV cache: quantizer wrapper, scalar reference kernels and the
 * run-time choice of variant (kvq.h). */
#include "backend/kvq.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/features.h"
#include "core/core.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"

int osp_kvq_supported(int D, int bits, int group) {
    if (bits == 16) return D > 0 && D <= OSP_KVQ_MAX_D && D % 16 == 0;
    return (bits == 4 || bits == 8) && (group == 32 || group == 64 || group == 128) && D > 0 &&
           D <= OSP_KVQ_MAX_D && D % group == 0;
}

size_t osp_kvq_code_bytes(int D, int bits) { return (size_t)D * (size_t)bits / 8; }

void osp_kvq_quantize(const float *x, int64_t n, int D, int bits, int group, uint8_t *codes,
                      uint16_t *scales, uint16_t *biases) {
    OSP_ASSERT(osp_kvq_supported(D, bits, group));
    if (bits == 16) {
        uint16_t *h = (uint16_t *)(void *)codes;
        for (int64_t i = 0; i < n * D; i++) h[i] = osp_f32_to_bf16(x[i]);
        return;
    }
    const int64_t rb = (int64_t)osp_kvq_code_bytes(D, bits), G = D / group;
    for (int64_t j = 0; j < n; j++) {
        osp_status st = osp_quantize_row(x + j * D, D, bits, group, codes + j * rb,
                                         scales + j * G, biases + j * G);
        OSP_ASSERT(st == OSP_OK);
    }
}

/* Code i of a row (bits 4 or 8). */
static inline int code_at(const uint8_t *row, int bits, int i) {
    return bits == 8 ? row[i] : (row[i >> 1] >> ((i & 1) * 4)) & 0xF;
}

/* Value i of a 16-bit row. */
static inline float bf16_at(const uint8_t *row, int64_t i) {
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    return osp_bf16_to_f32(h);
}

/* s*c + b rounded once: s*c is exact in double (8-bit mantissas), and so
 * is the sum for any realistic exponent gap. */
static inline float deq1(float s, int c, float b) { return (float)((double)s * c + (double)b); }

void osp_kvq_dequantize(const uint8_t *codes, const uint16_t *scales, const uint16_t *biases,
                        int64_t n, int D, int bits, int group, float *x) {
    OSP_ASSERT(osp_kvq_supported(D, bits, group));
    if (bits == 16) {
        for (int64_t i = 0; i < n * D; i++) x[i] = bf16_at(codes, i);
        return;
    }
    const int64_t rb = (int64_t)osp_kvq_code_bytes(D, bits), G = D / group;
    for (int64_t j = 0; j < n; j++)
        for (int i = 0; i < D; i++) {
            int64_t g = j * G + i / group;
            x[j * D + i] = deq1(osp_bf16_to_f32(scales[g]), code_at(codes + j * rb, bits, i),
                                osp_bf16_to_f32(biases[g]));
        }
}

static void scores_scalar(const float *q, int D, int bits, int group, const uint8_t *codes,
                          const uint16_t *scales, const uint16_t *biases, int64_t n,
                          float *scores) {
    const int64_t rb = (int64_t)osp_kvq_code_bytes(D, bits);
    if (bits == 16) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int i = 0; i < D; i++) acc += (double)q[i] * bf16_at(codes + j * rb, i);
            scores[j] = (float)acc;
        }
        return;
    }
    const int64_t G = D / group;
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *row = codes + j * rb;
        double acc = 0;
        for (int g = 0; g < G; g++) {
            float s = osp_bf16_to_f32(scales[j * G + g]), b = osp_bf16_to_f32(biases[j * G + g]);
            for (int i = g * group; i < (g + 1) * group; i++)
                acc += (double)q[i] * deq1(s, code_at(row, bits, i), b);
        }
        scores[j] = (float)acc;
    }
}

static void wsum_scalar(float *o, const float *p, int64_t n, int D, int bits, int group,
                        const uint8_t *codes, const uint16_t *scales, const uint16_t *biases) {
    const int64_t rb = (int64_t)osp_kvq_code_bytes(D, bits), G = bits == 16 ? 0 : D / group;
    double acc[256];
    for (int i0 = 0; i0 < D; i0 += 256) { /* row-major over columns of 256 */
        const int w = D - i0 < 256 ? D - i0 : 256;
        for (int i = 0; i < w; i++) acc[i] = o[i0 + i];
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *row = codes + j * rb;
            if (bits == 16) {
                for (int i = 0; i < w; i++) acc[i] += (double)p[j] * bf16_at(row, i0 + i);
                continue;
            }
            for (int i = 0; i < w; i++) {
                int64_t g = j * G + (i0 + i) / group;
                acc[i] += (double)p[j] * deq1(osp_bf16_to_f32(scales[g]), code_at(row, bits, i0 + i),
                                              osp_bf16_to_f32(biases[g]));
            }
        }
        for (int i = 0; i < w; i++) o[i0 + i] = (float)acc[i];
    }
}

static const osp_kvq_ops SCALAR = {"scalar", scores_scalar, wsum_scalar};

const osp_kvq_ops *osp_kvq_ops_scalar(void) { return &SCALAR; }

/* kvq_avx512.c: its table, with no CPU check (that file may hold AVX-512
 * instructions anywhere, so the check lives here). */
const osp_kvq_ops *osp_kvq_avx512_table(void);

const osp_kvq_ops *osp_kvq_ops_avx512(void) { return osp_cpu_features_get()->avx512 ? osp_kvq_avx512_table() : NULL; }

static const osp_kvq_ops *chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

static void choose(void) {
    const osp_kvq_ops *best = osp_kvq_ops_avx512(); /* OSP_ISA=scalar|avx2 turns it off */
    chosen = best ? best : osp_kvq_ops_scalar();
}

const osp_kvq_ops *osp_kvq_ops_get(void) {
    pthread_once(&chosen_once, choose);
    return chosen;
}
