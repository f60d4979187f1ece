#include <math.h>
#include <string.h>
#include "q8act.h"

static int64_t chunk_codes(int bits) { return bits == 4 ? 128 : 64; }

size_t osp_q8act_bytes(int64_t cols) {
    int64_t nb = cols / 32, nch = (cols + 63) / 64; /* worst case: 8-bit chunks */
    size_t b = 0;
#define R(n) (((size_t)(n) + 63) & ~(size_t)63)
    b += R(cols);                  /* xq */
    b += R(nb * 4);                /* d */
    b += R(nb * 4);                /* gsum (group >= 32) */
    b += R(nch * 64 + 128);        /* xs */
    b += R(nch * 16 * 4) * 2;      /* dl, nxs */
#undef R
    return b;
}

int osp_q8act_supported(const osp_weight *w) {
    return (w->qbits == 4 || w->qbits == 8) && (w->sdtype == OSP_DT_BF16 || w->sdtype == OSP_DT_F16) &&
           w->cols % 32 == 0 && w->group % 32 == 0 &&
           16 * w->group / chunk_codes(w->qbits) <= 32; /* the kernels' scale-index table: 32 chunks */
}

void osp_q8act_prepare(osp_q8act *a, const float *x, const osp_weight *w, void *mem) {
    int64_t C = w->cols, nb = C / 32, cc = chunk_codes(w->qbits), nch = (C + cc - 1) / cc;
    char *p = mem;
#define TAKE(ptr, n) (ptr = (void *)p, p += (((size_t)(n) + 63) & ~(size_t)63))
    TAKE(a->xq, C);
    TAKE(a->d, nb * 4);
    TAKE(a->gsum, nb * 4);
    TAKE(a->xs, nch * cc);
    TAKE(a->dl, nch * 16 * 4);
    TAKE(a->nxs, nch * 16 * 4);
#undef TAKE
    a->cols = C;
    a->bits = w->qbits;
    a->group = w->group;
    a->n_chunks = nch;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        a->d[b] = d;
        for (int j = 0; j < 32; j++) a->xq[b * 32 + j] = (int8_t)lrintf(xb[j] * id);
    }
    for (int64_t g = 0; g < C / w->group; g++) {
        float s = 0;
        for (int64_t j = 0; j < w->group; j++) s += x[g * w->group + j];
        a->gsum[g] = s;
    }
    int c = 1 << (w->qbits - 1), per_lane = w->qbits == 4 ? 8 : 4;
    memset(a->xs, 0, (size_t)(nch * cc));
    for (int64_t ch = 0; ch < nch; ch++) {
        for (int64_t k = 0; k < cc; k++) {
            int64_t j = ch * cc + k;
            if (j >= C) break;
            int64_t pos = w->qbits == 4 ? (k % 2 ? 64 + k / 2 : k / 2) : k;
            a->xs[ch * cc + pos] = a->xq[j];
        }
        for (int l = 0; l < 16; l++) {
            int64_t first = ch * cc + (int64_t)l * per_lane; /* codes of this lane: [first, first + per_lane) */
            int32_t sum = 0;
            for (int k = 0; k < per_lane; k++)
                if (first + k < C) sum += a->xq[first + k];
            a->nxs[ch * 16 + l] = -c * sum;
            a->dl[ch * 16 + l] = first < C ? a->d[first / 32] : 0.0f;
        }
    }
}

void osp_q8act_matvec_ref(const osp_weight *w, const osp_q8act *a, float *y, int64_t r0, int64_t r1) {
    int64_t C = w->cols, G = w->group, ng = C / G, rb = C * w->qbits / 8;
    int c = 1 << (w->qbits - 1);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w->data + r * rb;
        float acc = 0;
        for (int64_t b = 0; b < C / 32; b++) {
            int32_t isum = 0, xs = 0;
            for (int j = 0; j < 32; j++) {
                isum += a->xq[b * 32 + j] * (int32_t)osp_q_code(row, w->qbits, b * 32 + j);
                xs += a->xq[b * 32 + j];
            }
            float s = osp_load_float(w->scales, w->sdtype, r * ng + b * 32 / G);
            acc += a->d[b] * s * (float)(isum - c * xs);
        }
        for (int64_t g = 0; g < ng; g++) {
            float s = osp_load_float(w->scales, w->sdtype, r * ng + g);
            float bi = osp_load_float(w->biases, w->sdtype, r * ng + g);
            acc += (bi + (float)c * s) * a->gsum[g];
        }
        y[r - r0] = acc;
    }
}

void osp_q8act_matmul_ref(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                          int64_t r1) {
    for (int64_t t = 0; t < n; t++) osp_q8act_matvec_ref(w, &acts[t], y + t * ldy, r0, r1);
}

static int have_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

osp_q8act_fn osp_q8act_matvec_fast(void) {
    static osp_q8act_fn fn;
    if (!fn) fn = have_vnni() ? osp_q8act_matvec_vnni : osp_q8act_matvec_ref;
    return fn;
}

osp_q8act_mm_fn osp_q8act_matmul_fast(void) {
    static osp_q8act_mm_fn fn;
    if (!fn) fn = have_vnni() ? osp_q8act_matmul_vnni : osp_q8act_matmul_ref;
    return fn;
}
