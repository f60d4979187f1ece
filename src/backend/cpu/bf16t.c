/* backend/cpu/bf16t: which engine runs, the packed activation layouts, the
 * scalar twins and the dispatch (see bf16t.h; the kernels are amx_tiles.c
 * and bf16dot.c). */
#include "backend/cpu/bf16t.h"
#include <cpuid.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "backend/cpu/features.h"
#include "backend/q8act.h"
#include "core/options.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int has_amx, has_dot;
static osp_bf16t_kind engine;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void detect(void) {
    if (!osp_cpu_features_get()->avx512) return;
#if defined(__x86_64__) && defined(__GNUC__)
    /* cpuid leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16; subleaf 1 EAX bit 5 AVX512-BF16 (by hand: older
     * compilers' __builtin_cpu_supports do not know these names) */
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    has_dot = osp_bf16t_dot_built();
    /* the kernel keeps a process's tile state only when asked (Linux 5.16+) */
    if (has_dot && osp_amx_tiles_built() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 24)) &&
        (d & (1u << 22)) && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        has_amx = 1;
#endif
    const osp_options *o = osp_options_get();
    if (o->bf16t == 0) return;
    if (has_amx && o->amx && o->bf16t != 2) engine = OSP_BF16T_AMX;
    else if (has_dot) engine = OSP_BF16T_DOT;
}

int osp_bf16t_has(osp_bf16t_kind k) {
    pthread_once(&once, detect);
    return k == OSP_BF16T_AMX ? has_amx : k == OSP_BF16T_DOT ? has_dot : 0;
}

osp_bf16t_kind osp_bf16t_engine(void) {
    pthread_once(&once, detect);
    return engine;
}

const char *osp_bf16t_name(osp_bf16t_kind k) {
    return k == OSP_BF16T_AMX ? "amx" : k == OSP_BF16T_DOT ? "avx512-bf16" : "none";
}

int osp_bf16t_fits(const osp_weight *w) {
    return !w->qbits && w->dtype == OSP_DT_BF16 && w->cols > 0 && w->cols % OSP_BF16T_COLS == 0 &&
           w->rows >= 16 && w->data;
}

size_t osp_bf16t_packed_bytes(int64_t n, int64_t cols) {
    return (size_t)((n + OSP_BF16T_TOKENS - 1) / OSP_BF16T_TOKENS) * OSP_BF16T_TOKENS * (size_t)cols * sizeof(uint16_t);
}

size_t osp_bf16t_packed_used(osp_bf16t_kind k, int64_t n, int64_t cols) {
    if (k == OSP_BF16T_AMX) {
        const int64_t w = osp_bf16t_width(n);
        return (size_t)((n + w - 1) / w * w) * (size_t)cols * sizeof(uint16_t);
    }
    return (size_t)n * (size_t)cols * sizeof(uint16_t);
}

/* f32 -> bf16, round to nearest even; denormals to signed zero (the bf16
 * instructions read them as zero); NaN stays NaN */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

void osp_bf16t_pack(osp_bf16t_kind k, const float *x, int64_t n, int64_t cols, uint16_t *xp) {
    if (k != OSP_BF16T_AMX) { /* token-major bf16 rows */
        for (int64_t i = 0; i < n * cols; i++) xp[i] = to_bf16(x[i]);
        return;
    }
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

int osp_q4t_fits(const osp_weight *w) {
    return w->packed && osp_q8act_supported(w) && w->cols % OSP_BF16T_COLS == 0;
}

/* the repacked layout (q8act.h): per tile and group a segment of [16 scales][16 biases] (raw 16-bit), then
 * per block of 32 columns 4 vectors of 64 bytes, row lane l's bytes 4l + j of vector v holding code
 * 32 b + 8 v + j in the low nibble and code 32 b + 8 v + 4 + j in the high one */
void osp_q4t_tile_ref(const osp_weight *w, int64_t tile, uint16_t *out, int64_t ld) {
    const int64_t G = w->group, ng = w->cols / G;
    const size_t seg = 64 + (size_t)G * 8;
    const unsigned char *tp = (const unsigned char *)w->packed + (size_t)tile * (size_t)ng * seg;
    for (int64_t g = 0; g < ng; g++) {
        const unsigned char *sg = tp + (size_t)g * seg;
        for (int l = 0; l < OSP_Q4PACK_ROWS; l++) {
            const float s = osp_load_float(sg, w->sdtype, l), b = osp_load_float(sg + 32, w->sdtype, l);
            for (int64_t c = 0; c < G; c++) {
                const int64_t blk = c / 32, v = c % 32 / 8, j = c % 8;
                const unsigned char byte = sg[64 + blk * 256 + v * 64 + 4 * l + j % 4];
                const int code = j < 4 ? byte & 15 : byte >> 4;
                out[l * ld + g * G + c] = to_bf16(fmaf(s, (float)code, b));
            }
        }
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

/* TDPBF16PS's definition: the columns in order */
static void ref_amx(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
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

/* VDPBF16PS's definition, 16 lanes of column pairs, then the lanes' tree */
static void ref_dot(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    const int64_t K = w->cols;
    const uint16_t *W = w->data;
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = r0; r < r1; r++) {
            const uint16_t *wr = W + r * K, *xr = xp + t * K;
            float l[16];
            for (int i = 0; i < 16; i++) {
                float acc = 0.0f;
                for (int64_t c = 2 * i; c < K; c += OSP_BF16T_COLS) {
                    acc = ftz(acc + bf(wr[c + 1]) * bf(xr[c + 1]));
                    acc = ftz(acc + bf(wr[c]) * bf(xr[c]));
                }
                l[i] = acc;
            }
            for (int h = 8; h >= 1; h /= 2)
                for (int i = 0; i < h; i++) l[i] = l[i] + l[i + h];
            y[t * ldy + (r - r0)] = l[0];
        }
}

void osp_bf16t_ref(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1) {
    if (k == OSP_BF16T_AMX) ref_amx(w, xp, n, y, ldy, r0, r1);
    else ref_dot(w, xp, n, y, ldy, r0, r1);
}

void osp_bf16t_pack_fast(osp_bf16t_kind k, const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0,
                         int64_t j1) {
    if (k == OSP_BF16T_AMX && osp_amx_tiles_built()) osp_bf16t_amx_pack(x, n, cols, xp, j0, j1);
    else if (k == OSP_BF16T_DOT && osp_bf16t_dot_built()) osp_bf16t_dot_pack(x, n, cols, xp, j0, j1);
    else osp_bf16t_pack(k, x, n, cols, xp);
}

void osp_bf16t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                  int64_t r0, int64_t r1) {
    if (k == OSP_BF16T_AMX && osp_amx_tiles_built()) osp_bf16t_amx_mm(w, xp, n, y, ldy, r0, r1, NULL, 0);
    else if (k == OSP_BF16T_DOT && osp_bf16t_dot_built()) osp_bf16t_dot_mm(w, xp, n, y, ldy, r0, r1);
    else osp_bf16t_ref(k, w, xp, n, y, ldy, r0, r1);
}

/* Engine k on a group of dequantized rows; on AMX the next group's source [pf, pf + pf_bytes) is requested
 * into L2 meanwhile. */
static void group_mm(osp_bf16t_kind k, const osp_weight *t, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                     int64_t m, const void *pf, size_t pf_bytes) {
    if (k == OSP_BF16T_AMX && osp_amx_tiles_built()) osp_bf16t_amx_mm(t, xp, n, y, ldy, 0, m, pf, pf_bytes);
    else osp_bf16t_mm(k, t, xp, n, y, ldy, 0, m);
}

void osp_q8t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                int64_t r0, int64_t r1, uint16_t *dq) {
    const int64_t K = w->cols;
    /* (the AVX-512 dequantization needs AVX512-BF16's conversion; bitwise the twin's) */
    void (*const row)(const osp_weight *, int64_t, uint16_t *) =
        osp_bf16t_dot_built() && osp_bf16t_has(OSP_BF16T_DOT) ? osp_q8t_row_fast : osp_q8t_row_ref;
    const int64_t rg = osp_bf16t_group_rows(K);
    for (int64_t a = r0; a < r1; a += rg) {
        /* (AMX takes 16 rows a tile at least: a short block is padded with zero rows) */
        const int64_t m = r1 - a < rg ? r1 - a : rg, mt = m < 16 ? 16 : m;
        for (int64_t i = 0; i < mt; i++) {
            if (i >= m) memset(dq + i * K, 0, (size_t)K * sizeof(uint16_t));
            else row(w, a + i, dq + i * K);
        }
        osp_weight t = *w;
        t.qbits = 0, t.group = 0, t.dtype = OSP_DT_BF16, t.rows = mt, t.data = dq, t.scales = t.biases = NULL;
        const int64_t na = a + rg < r1 ? r1 - (a + rg) : 0; /* the next group's rows: their codes */
        group_mm(k, &t, xp, n, y + (a - r0), ldy, m, na ? (const uint8_t *)w->data + (a + rg) * K : NULL,
                 (size_t)(na < rg ? na : rg) * (size_t)K);
    }
}

void osp_q4t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                int64_t r0, int64_t r1, uint16_t *dq) {
    const int64_t K = w->cols;
    void (*const tile)(const osp_weight *, int64_t, uint16_t *, int64_t) =
        osp_bf16t_dot_built() && osp_bf16t_has(OSP_BF16T_DOT) ? osp_q4t_tile_fast : osp_q4t_tile_ref;
    const int64_t rg = osp_bf16t_group_rows(K);
    for (int64_t a = r0; a < r1; a += rg) {
        /* whole tiles of 16 rows (those past the weight's end are zeros) */
        const int64_t m = r1 - a < rg ? r1 - a : rg, mt = (m + 15) / 16 * 16;
        for (int64_t i = 0; i < mt; i += OSP_Q4PACK_ROWS) tile(w, (a + i) / OSP_Q4PACK_ROWS, dq + i * K, K);
        osp_weight t = *w;
        t.qbits = 0, t.group = 0, t.dtype = OSP_DT_BF16, t.rows = mt, t.data = dq, t.scales = t.biases = NULL;
        t.packed = NULL;
        /* the next group's tiles (a tile is ng segments of 64 + 8 G bytes) */
        const int64_t na = a + rg < r1 ? r1 - (a + rg) : 0, nt = ((na < rg ? na : rg) + 15) / 16;
        const size_t tb = (size_t)(K / w->group) * (64 + (size_t)w->group * 8);
        group_mm(k, &t, xp, n, y + (a - r0), ldy, m,
                 na ? (const unsigned char *)w->packed + (size_t)((a + rg) / 16) * tb : NULL, (size_t)nt * tb);
    }
}

/* a compiler without AMX or AVX512-BF16: that engine is never available (the dispatch above runs the twins) */
#ifdef OSP_NO_AMX_TILES
int osp_amx_tiles_built(void) { return 0; }
void osp_bf16t_amx_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0,
                      int64_t r1, const void *pf, size_t pf_bytes) {
    (void)pf, (void)pf_bytes;
    ref_amx(w, xp, n, y, ldy, r0, r1);
}
void osp_bf16t_amx_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1) {
    (void)j0, (void)j1;
    osp_bf16t_pack(OSP_BF16T_AMX, x, n, cols, xp);
}
#endif
#ifdef OSP_NO_BF16_DOT
int osp_bf16t_dot_built(void) { return 0; }
void osp_bf16t_dot_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0,
                      int64_t r1) {
    ref_dot(w, xp, n, y, ldy, r0, r1);
}
void osp_bf16t_dot_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1) {
    (void)j0, (void)j1;
    osp_bf16t_pack(OSP_BF16T_DOT, x, n, cols, xp);
}
void osp_q8t_row_fast(const osp_weight *w, int64_t r, uint16_t *out) { osp_q8t_row_ref(w, r, out); }
void osp_q4t_tile_fast(const osp_weight *w, int64_t tile, uint16_t *out, int64_t ld) {
    osp_q4t_tile_ref(w, tile, out, ld);
}
int osp_bf16t_dot_exact(void) { return 0; }
#endif
