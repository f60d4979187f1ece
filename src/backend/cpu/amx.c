/* backend/cpu/amx: availability, the packed activation layout and the
 * scalar twin of the tile kernel (see amx.h; the kernel is amx_tiles.c). */
#include "backend/cpu/amx.h"
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "backend/cpu/features.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* amx_tiles.c, built only where the compiler knows AMX */
int osp_amx_tiles_built(void);

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_detect(void) {
    const char *e = getenv("OSP_AMX");
    if (e && e[0] == '0') return;
    if (!osp_amx_tiles_built() || !osp_cpu_features_get()->avx512) return;
#if defined(__x86_64__) && defined(__GNUC__)
    /* cpuid leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16; subleaf 1 EAX bit 5 AVX512-BF16 (by hand: older
     * compilers' __builtin_cpu_supports do not know these names) */
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    /* the kernel keeps a process's tile state only when asked (Linux 5.16+) */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_ok = 1;
#endif
}

int osp_amx_available(void) {
    pthread_once(&amx_once, amx_detect);
    return amx_ok;
}

int osp_bf16t_fits(const osp_weight *w) {
    return !w->qbits && w->dtype == OSP_DT_BF16 && w->cols > 0 && w->cols % OSP_BF16T_COLS == 0 &&
           w->rows >= 16 && w->data;
}

size_t osp_bf16t_packed_bytes(int64_t n, int64_t cols) {
    return (size_t)((n + OSP_BF16T_TOKENS - 1) / OSP_BF16T_TOKENS) * OSP_BF16T_TOKENS * (size_t)cols * sizeof(uint16_t);
}

/* f32 -> bf16, round to nearest even; denormals to signed zero (the tile
 * instructions read them as zero); NaN stays NaN */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void osp_bf16t_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp) {
    const int64_t nch = cols / OSP_BF16T_COLS, nb_w = osp_bf16t_width(n), nb = (n + nb_w - 1) / nb_w;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < nch; j++) {
            uint16_t *tile = xp + (b * nch + j) * 32 * nb_w;
            for (int kp = 0; kp < OSP_BF16T_COLS / 2; kp++)
                for (int64_t m = 0; m < nb_w; m++) {
                    const int64_t t = b * nb_w + m;
                    const float *r = x + t * cols + j * OSP_BF16T_COLS + 2 * kp;
                    tile[(kp * nb_w + m) * 2] = t < n ? to_bf16(r[0]) : 0;
                    tile[(kp * nb_w + m) * 2 + 1] = t < n ? to_bf16(r[1]) : 0;
                }
        }
}

int osp_q8t_fits(const osp_weight *w) {
    return w->qbits == 8 && w->group % OSP_BF16T_COLS == 0 && w->cols % w->group == 0 && w->rows >= 1 && w->data;
}

void osp_q8t_row_ref(const osp_weight *w, int64_t r, uint16_t *out) {
    const uint8_t *codes = (const uint8_t *)w->data + r * w->cols;
    const int64_t ng = w->cols / w->group;
    for (int64_t g = 0; g < ng; g++) {
        const float s = osp_load_float(w->scales, w->sdtype, r * ng + g), b = osp_load_float(w->biases, w->sdtype, r * ng + g);
        for (int64_t k = 0; k < w->group; k++) out[g * w->group + k] = to_bf16(fmaf(s, (float)codes[g * w->group + k], b));
    }
}

static float bf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u; /* denormal inputs read as zero */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ftz(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&f, &u, 4);
    return f;
}

void osp_bf16t_ref(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t K = w->cols, nch = K / OSP_BF16T_COLS, nb_w = osp_bf16t_width(n);
    const uint16_t *W = w->data;
    for (int64_t t = 0; t < n; t++) {
        const int64_t b = t / nb_w, m = t % nb_w;
        for (int64_t r = r0; r < r1; r++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < nch; j++) {
                const uint16_t *tile = xp + (b * nch + j) * 32 * nb_w;
                const uint16_t *wr = W + r * K + j * OSP_BF16T_COLS;
                for (int kp = 0; kp < OSP_BF16T_COLS / 2; kp++) {
                    /* each product is exact in f32; the sums round */
                    acc = ftz(acc + bf(wr[2 * kp]) * bf(tile[(kp * nb_w + m) * 2]));
                    acc = ftz(acc + bf(wr[2 * kp + 1]) * bf(tile[(kp * nb_w + m) * 2 + 1]));
                }
            }
            y[t * ldy + (r - r0)] = acc;
        }
    }
}

#ifdef OSP_NO_AMX_TILES /* a compiler without AMX: never available, the twin stands in */
int osp_amx_tiles_built(void) { return 0; }
void osp_bf16t_amx(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    osp_bf16t_ref(w, xp, n, y, ldy, r0, r1);
}
void osp_bf16t_pack_fast(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1) {
    (void)j0, (void)j1;
    osp_bf16t_pack(x, n, cols, xp);
}
void osp_q8t_amx(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                 uint16_t *dq) { /* the twins, a row at a time */
    osp_weight t = *w;
    t.qbits = 0, t.group = 0, t.dtype = OSP_DT_BF16, t.rows = 1, t.data = dq, t.scales = t.biases = NULL;
    for (int64_t r = r0; r < r1; r++) {
        osp_q8t_row_ref(w, r, dq);
        osp_bf16t_ref(&t, xp, n, y + (r - r0), ldy, 0, 1);
    }
}
#endif
