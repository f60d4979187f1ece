#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/features.h"
#include "q8act.h"

#define T OSP_Q4PACK_ROWS

int osp_q8act_supported(const osp_weight *w) {
    return w->qbits == 4 && (w->sdtype == OSP_DT_BF16 || w->sdtype == OSP_DT_F16) && w->group % 32 == 0 &&
           w->cols % w->group == 0;
}

static size_t seg_bytes(int group) { return 64 + (size_t)group * 8; }

size_t osp_q4pack_bytes(const osp_weight *w) {
    return (size_t)((w->rows + T - 1) / T) * (size_t)(w->cols / w->group) * seg_bytes(w->group);
}

static uint16_t raw16(const void *p, int64_t i) {
    uint16_t h;
    memcpy(&h, (const unsigned char *)p + 2 * i, 2);
    return h;
}

/* nibble i of a 16-bit x into the low nibble of byte i (of a little-endian word) */
static inline uint32_t spread4(uint32_t x) {
    x = (x | (x << 8)) & 0x00ff00ffu;
    return (x | (x << 4)) & 0x0f0f0f0fu;
}

void osp_q4pack(const osp_weight *w, void *dst, int64_t t0, int64_t t1) {
    const int64_t C = w->cols, G = w->group, ng = C / G, rb = C / 2, bpg = G / 32;
    const size_t seg = seg_bytes(w->group);
    for (int64_t t = t0; t < t1; t++) {
        unsigned char *tile = (unsigned char *)dst + (size_t)t * (size_t)ng * seg;
        for (int64_t g = 0; g < ng; g++) {
            unsigned char *sg = tile + (size_t)g * seg;
            uint16_t sc[T], bi[T];
            for (int l = 0; l < T; l++) {
                int64_t r = t * T + l;
                sc[l] = r < w->rows ? raw16(w->scales, r * ng + g) : 0;
                bi[l] = r < w->rows ? raw16(w->biases, r * ng + g) : 0;
            }
            memcpy(sg, sc, sizeof sc);
            memcpy(sg + 32, bi, sizeof bi);
            for (int64_t v = 0; v < bpg * 4; v++) { /* 8 columns per vector */
                unsigned char *out = sg + 64 + v * 64;
                int64_t k = g * G + v * 8;
                for (int l = 0; l < T; l++) {
                    int64_t r = t * T + l;
                    uint32_t nib = 0; /* nibble i = code k + i (LSB-first bitstream) */
                    if (r < w->rows) memcpy(&nib, (const unsigned char *)w->data + r * rb + k / 2, 4);
                    /* byte j: code k + j | code k + 4 + j << 4 */
                    const uint32_t word = spread4(nib & 0xffffu) | spread4(nib >> 16) << 4;
                    memcpy(out + 4 * l, &word, 4);
                }
            }
        }
    }
}

#define R64(n) (((size_t)(n) + 63) & ~(size_t)63)
#define S OSP_Q8ACT_SLOTS

size_t osp_q8act_bytes(int64_t cols) {
    int64_t nb = cols / 32;
    return R64(cols * S) + R64(nb * 4 * S) * 3; /* xq; d, kg, gsum (group >= 32) */
}

void osp_q8act_init(osp_q8act *a, int64_t cols, int group, int width, void *mem) {
    char *p = mem;
    int64_t nb = cols / 32;
    a->cols = cols;
    a->group = group;
    a->width = width;
    a->xq = (int32_t *)p, p += R64(cols * width);
    a->d = (float *)p, p += R64(nb * 4 * width);
    a->kg = (float *)p, p += R64(nb * 4 * width);
    a->gsum = (float *)p;
}

void osp_q8act_prepare_ref(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1) {
    const int64_t group = a->group, W = a->width, bpg = group / 32;
    float k = 0; /* k_g, accumulated over the group's blocks */
    for (int64_t b = g0 * bpg; b < g1 * bpg; b++) {
        const float *xb = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < 8; i++) {
            int8_t q[4];
            for (int j = 0; j < 4; j++) {
                q[j] = (int8_t)lrintf(xb[4 * i + j] * id);
                s += q[j];
            }
            memcpy(&a->xq[(b * 8 + i) * W + slot], q, 4);
        }
        a->d[b * W + slot] = d;
        k = fmaf((float)(-8 * s), d, k);
        if ((b + 1) % bpg == 0) a->kg[b / bpg * W + slot] = k, k = 0;
    }
    for (int64_t g = g0; g < g1; g++) {
        float p[16] = {0};
        for (int64_t i = 0; i < group; i += 16)
            for (int l = 0; l < 16; l++) p[l] += x[g * group + i + l];
        for (int h = 8; h >= 1; h /= 2)
            for (int l = 0; l < h; l++) p[l] += p[l + h];
        a->gsum[g * W + slot] = p[0];
    }
}

void osp_q8act_matmul_ref(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                          int64_t r1) {
    const int64_t C = w->cols, G = w->group, ng = C / G, rb = C / 2;
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * rb;
        for (int64_t t = 0; t < n; t++) {
            const osp_q8act *a = &acts[t / S];
            const int slot = (int)(t % S), W = a->width;
            float acc = 0;
            for (int64_t g = 0; g < ng; g++) {
                float s = osp_load_float(w->scales, w->sdtype, r * ng + g);
                float bi = osp_load_float(w->biases, w->sdtype, r * ng + g);
                float ga = 0;
                for (int64_t b = g * G / 32; b < (g + 1) * G / 32; b++) {
                    int32_t isum = 0;
                    for (int j = 0; j < 32; j++) {
                        int8_t q[4];
                        memcpy(q, &a->xq[(b * 8 + j / 4) * W + slot], 4);
                        isum += q[j % 4] * (int32_t)osp_q_code(row, 4, b * 32 + j);
                    }
                    ga = fmaf((float)isum, a->d[b * W + slot], ga);
                }
                acc = fmaf(ga + a->kg[g * W + slot], s, acc);
                acc = fmaf(fmaf(s, 8.0f, bi), a->gsum[g * W + slot], acc);
            }
            y[t * ldy + (r - r0)] = acc;
        }
    }
}

#define TOK_BLOCK 64

void osp_q8act_walk(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                    int64_t r1, const osp_q8act_tile_fn tab[2][OSP_Q8ACT_SLOTS + 1]) {
    const int64_t G = w->group, ng = w->cols / G, bpg = G / 32;
    const size_t seg = seg_bytes(w->group), tile_bytes = (size_t)ng * seg;
    const osp_q8act_tile_fn *row = tab[w->sdtype == OSP_DT_F16];
    for (int64_t a0 = 0; a0 < n; a0 += TOK_BLOCK) {
        const int64_t a1 = n - a0 < TOK_BLOCK ? n : a0 + TOK_BLOCK;
        for (int64_t r = r0; r < r1; r += T) {
            const unsigned char *tile = (const unsigned char *)w->packed + (size_t)(r / T) * tile_bytes;
            const int64_t rows = r1 - r < T ? r1 - r : T;
            for (int64_t t = a0; t < a1; t += S) {
                const int64_t a = a1 - t < S ? a1 - t : S;
                row[a](tile, ng, bpg, seg, &acts[t / S], y + t * ldy + (r - r0), ldy, rows);
            }
        }
    }
}

/* OSP_ISA=scalar|avx2 turns this tier off too (backend/cpu/features.h), so
 * the fallback of a CPU without VNNI can be tested on one that has it. */
static int have_vnni(void) { return osp_cpu_features_get()->vnni; }

void osp_q8act_prepare_groups(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1) {
    static int tier = -1;
    if (tier < 0) tier = have_vnni();
    if (tier) osp_q8act_prepare_avx512(a, slot, x, g0, g1);
    else osp_q8act_prepare_ref(a, slot, x, g0, g1);
}

void osp_q8act_prepare(osp_q8act *a, int slot, const float *x) {
    osp_q8act_prepare_groups(a, slot, x, 0, a->cols / a->group);
}

osp_q8act_mm_fn osp_q8act_matmul_fast(void) {
    static int tier = -1;
    if (tier < 0) tier = have_vnni() ? 2 : osp_cpu_features_get()->avx2 ? 1 : 0;
    return tier == 2 ? osp_q8act_matmul_vnni : tier == 1 ? osp_q8act_matmul_avx2 : NULL;
}
