#include <math.h>
#include <string.h>
#include "tensor.h"

static const struct { const char *name; size_t size; } DT[OSP_DT_COUNT] = {
    [OSP_DT_F32] = {"F32", 4},  [OSP_DT_F16] = {"F16", 2}, [OSP_DT_BF16] = {"BF16", 2},
    [OSP_DT_U32] = {"U32", 4},  [OSP_DT_I32] = {"I32", 4}, [OSP_DT_I8] = {"I8", 1},
    [OSP_DT_U8] = {"U8", 1},    [OSP_DT_BOOL] = {"BOOL", 1}, [OSP_DT_I16] = {"I16", 2},
    [OSP_DT_U16] = {"U16", 2},  [OSP_DT_I64] = {"I64", 8}, [OSP_DT_U64] = {"U64", 8},
    [OSP_DT_F64] = {"F64", 8},
};

size_t osp_dtype_size(osp_dtype t) { return t < OSP_DT_COUNT ? DT[t].size : 0; }
const char *osp_dtype_name(osp_dtype t) { return t < OSP_DT_COUNT ? DT[t].name : "?"; }

int osp_dtype_parse(const char *s) {
    for (int i = 0; i < OSP_DT_COUNT; i++)
        if (strcmp(s, DT[i].name) == 0) return i;
    return -1;
}

float osp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            float f = ldexpf((float)man, -24);
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t osp_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;          /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;         /* overflow -> inf */
    if (a < 0x38800000u) {                              /* subnormal or zero */
        float m = fabsf(f) * 16777216.0f;               /* units of 2^-24 */
        return sign | (uint16_t)nearbyintf(m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1) - 0x38000000u;
    return sign | (uint16_t)(r >> 13);
}

int64_t osp_weight_row_bytes(const osp_weight *w) {
    if (w->qbits == 0) return w->cols * (int64_t)osp_dtype_size(w->dtype);
    return w->cols * w->qbits / 8 + 2 * (w->cols / w->group) * (int64_t)osp_dtype_size(w->sdtype);
}

void osp_weight_row_f32(const osp_weight *w, int64_t r, float *out) {
    if (w->qbits == 0) {
        const unsigned char *base = (const unsigned char *)w->data +
                                    r * w->cols * (int64_t)osp_dtype_size(w->dtype);
        for (int64_t c = 0; c < w->cols; c++) out[c] = osp_load_float(base, w->dtype, c);
        return;
    }
    const unsigned char *row = (const unsigned char *)w->data + r * (w->cols * w->qbits / 8);
    int64_t ng = w->cols / w->group;
    for (int64_t g = 0; g < ng; g++) {
        float s = osp_load_float(w->scales, w->sdtype, r * ng + g);
        float b = osp_load_float(w->biases, w->sdtype, r * ng + g);
        for (int64_t j = 0; j < w->group; j++) {
            int64_t k = g * w->group + j;
            out[k] = s * (float)osp_q_code(row, w->qbits, k) + b;
        }
    }
}
