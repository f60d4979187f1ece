/* AVX-512 VNNI matvec on int8-quantized activations (see backend/q8act.h).
 * Compiled with -mavx512vnni; used only when cpuid reports it.
 *
 * A row is walked in superblocks of 16 groups: their 16 scales and biases
 * are loaded once, converted to f32, and each chunk (64 bytes of codes)
 * picks its lanes' scales with one permute from a per-call index table. */
#include <immintrin.h>
#include "backend/q8act.h"

/* n (<= 16) consecutive bf16/f16 values from base + g0, as f32; the rest 0. */
static inline __m512 load16(const void *base, osp_dtype dt, int64_t g0, int64_t n) {
    __m256i h;
    if (n >= 16) h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + g0));
    else h = _mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), (const uint16_t *)base + g0);
    if (dt == OSP_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* int32 dot products of one chunk of codes with the prepared activation. */
static inline __attribute__((always_inline)) __m512i chunk_dot(const int bits, __m512i q, __m512i nxs, __m512i xa,
                                                               __m512i xb) {
    if (bits == 4) {
        const __m512i nib = _mm512_set1_epi8(0x0f);
        __m512i lo = _mm512_and_si512(q, nib), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
        return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nxs, lo, xa), hi, xb);
    }
    return _mm512_dpbusd_epi32(nxs, q, xa);
}

static inline __m512i load_codes(const unsigned char *row, int64_t ch, int64_t full, int64_t C, int64_t cc, int bits) {
    if (ch < full) return _mm512_loadu_si512(row + ch * 64);
    int64_t nbytes = (C - ch * cc) * bits / 8;
    return _mm512_maskz_loadu_epi8((__mmask64)((1ull << nbytes) - 1), row + ch * 64);
}

/* Two rows at a time: the activation's loads are shared and the two
 * dependency chains interleave. */
static inline __attribute__((always_inline)) void rows_kernel(const int bits, const osp_weight *w, const osp_q8act *a,
                                                              float *y, int64_t r0, int64_t r1) {
    const int64_t C = w->cols, G = w->group, ng = C / G, rb = C * bits / 8;
    const int64_t cc = bits == 4 ? 128 : 64, nch = a->n_chunks, per_lane = bits == 4 ? 8 : 4;
    const int64_t cps = 16 * G / cc; /* chunks per superblock of 16 groups */
    const int64_t full = C / cc;
    const __m512 center = _mm512_set1_ps((float)(1 << (bits - 1)));
    __m512i idx[32];
    for (int64_t j = 0; j < cps; j++) {
        int32_t t[16];
        for (int l = 0; l < 16; l++) t[l] = (int32_t)((j * cc + l * per_lane) / G);
        idx[j] = _mm512_loadu_si512(t);
    }
    for (int64_t r = r0; r < r1; r += 2) {
        const int two = r + 1 < r1;
        const int64_t r2 = two ? r + 1 : r; /* a lone last row is computed twice, stored once */
        const unsigned char *rowa = (const unsigned char *)w->data + r * rb, *rowb = (const unsigned char *)w->data + r2 * rb;
        const unsigned char *sca = (const unsigned char *)w->scales + r * ng * 2, *scb = (const unsigned char *)w->scales + r2 * ng * 2;
        const unsigned char *bia = (const unsigned char *)w->biases + r * ng * 2, *bib = (const unsigned char *)w->biases + r2 * ng * 2;
        __m512 acca = _mm512_setzero_ps(), accb = _mm512_setzero_ps();
        __m512 biasa = _mm512_setzero_ps(), biasb = _mm512_setzero_ps();
        int64_t ch = 0;
        for (int64_t g0 = 0; g0 < ng; g0 += 16) {
            int64_t n = ng - g0 < 16 ? ng - g0 : 16;
            __mmask16 gm = (__mmask16)(n >= 16 ? 0xffff : ((1u << n) - 1));
            __m512 sa = load16(sca, w->sdtype, g0, n), sb = load16(scb, w->sdtype, g0, n);
            __m512 gs = _mm512_maskz_loadu_ps(gm, a->gsum + g0);
            biasa = _mm512_fmadd_ps(_mm512_fmadd_ps(sa, center, load16(bia, w->sdtype, g0, n)), gs, biasa);
            biasb = _mm512_fmadd_ps(_mm512_fmadd_ps(sb, center, load16(bib, w->sdtype, g0, n)), gs, biasb);
            int64_t end = ch + cps < nch ? ch + cps : nch;
            for (int64_t j = 0; ch < end; ch++, j++) {
                __m512i qa = load_codes(rowa, ch, full, C, cc, bits), qb = load_codes(rowb, ch, full, C, cc, bits);
                _mm_prefetch((const char *)(rowa + ch * 64 + 4096), _MM_HINT_T0);
                _mm_prefetch((const char *)(rowb + ch * 64 + 4096), _MM_HINT_T0);
                const __m512i nxs = _mm512_load_si512(a->nxs + ch * 16);
                const __m512i xa = _mm512_load_si512(a->xs + ch * (bits == 4 ? 128 : 64));
                const __m512i xb = bits == 4 ? _mm512_load_si512(a->xs + ch * 128 + 64) : xa;
                const __m512 dl = _mm512_load_ps(a->dl + ch * 16);
                __m512 ta = _mm512_mul_ps(_mm512_cvtepi32_ps(chunk_dot(bits, qa, nxs, xa, xb)), dl);
                __m512 tb = _mm512_mul_ps(_mm512_cvtepi32_ps(chunk_dot(bits, qb, nxs, xa, xb)), dl);
                acca = _mm512_fmadd_ps(ta, _mm512_permutexvar_ps(idx[j], sa), acca);
                accb = _mm512_fmadd_ps(tb, _mm512_permutexvar_ps(idx[j], sb), accb);
            }
        }
        y[r - r0] = _mm512_reduce_add_ps(_mm512_add_ps(acca, biasa));
        if (two) y[r2 - r0] = _mm512_reduce_add_ps(_mm512_add_ps(accb, biasb));
    }
}

void osp_q8act_matvec_vnni(const osp_weight *w, const osp_q8act *a, float *y, int64_t r0, int64_t r1) {
    if (w->qbits == 4) rows_kernel(4, w, a, y, r0, r1);
    else rows_kernel(8, w, a, y, r0, r1);
}

/* ---- several activations (continuous batching) ----
 *
 * A tile of R rows (MM_ROWS; see MM_TILES) meets A <= MM_ACTS activations:
 * each chunk of codes is loaded and unpacked once per row, each activation's
 * chunk once per tile, and the R x A accumulators stay in registers. For every (row,
 * activation) the float operations are exactly rows_kernel's: the same int32
 * dpbusd chain, cvt, mul by dl and fmadd into one accumulator, the same bias
 * chain over superblocks, the same final add and reduction. So a user's
 * outputs are bitwise those of osp_q8act_matvec_vnni on their activation
 * alone, whoever else is in the batch; only the loads and the interleaving
 * differ. The bias chain reads no codes, so it runs after the codes loop,
 * which leaves the registers to the accumulators.
 *
 * The first tile of activations over a row group prefetches the codes 16 KiB
 * ahead into L2 (T1): with T0 (rows_kernel's 4 KiB) or none, the small
 * batches ran at about half the DRAM bandwidth of one core (Zen 4). */
#define MM_ROWS 4
#define MM_ACTS 4
#define MM_PREFETCH 16384

/* Keeps a loaded vector in a register: otherwise gcc reloads it from memory
 * for each row, and the loads, not the arithmetic, bound the tile. */
#define MM_IN_REG(x) __asm__("" : "+v"(x))

static inline __attribute__((always_inline)) void mm_tile(const int bits, const int R, const int A, const osp_weight *w,
                                                          const osp_q8act *acts, float *y, int64_t ldy, int64_t r,
                                                          int64_t r0, const __m512i *idx, int pf) {
    const int64_t C = w->cols, G = w->group, ng = C / G, rb = C * bits / 8;
    const int64_t cc = bits == 4 ? 128 : 64, nch = acts[0].n_chunks, cps = 16 * G / cc, full = C / cc;
    const unsigned char *row[MM_ROWS], *sc[MM_ROWS], *bi[MM_ROWS];
    _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {
        row[i] = (const unsigned char *)w->data + (r + i) * rb;
        sc[i] = (const unsigned char *)w->scales + (r + i) * ng * 2;
        bi[i] = (const unsigned char *)w->biases + (r + i) * ng * 2;
    }
    __m512 acc[MM_ROWS][MM_ACTS];
    _Pragma("GCC unroll 4") for (int i = 0; i < R; i++)
        _Pragma("GCC unroll 4") for (int t = 0; t < A; t++) acc[i][t] = _mm512_setzero_ps();
    int64_t ch = 0;
    for (int64_t g0 = 0; g0 < ng; g0 += 16) {
        int64_t n = ng - g0 < 16 ? ng - g0 : 16;
        __m512 s[MM_ROWS];
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) s[i] = load16(sc[i], w->sdtype, g0, n);
        int64_t end = ch + cps < nch ? ch + cps : nch;
        for (int64_t j = 0; ch < end; ch++, j++) {
            __m512i lo[MM_ROWS], hi[MM_ROWS];
            __m512 ps[MM_ROWS];
            _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {
                __m512i q = load_codes(row[i], ch, full, C, cc, bits);
                if (pf) _mm_prefetch((const char *)(row[i] + ch * 64 + MM_PREFETCH), _MM_HINT_T1);
                if (bits == 4) {
                    const __m512i nib = _mm512_set1_epi8(0x0f);
                    lo[i] = _mm512_and_si512(q, nib), hi[i] = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
                } else {
                    lo[i] = hi[i] = q;
                }
                ps[i] = _mm512_permutexvar_ps(idx[j], s[i]);
            }
            _Pragma("GCC unroll 4") for (int t = 0; t < A; t++) {
                const osp_q8act *a = &acts[t];
                __m512i nxs = _mm512_load_si512(a->nxs + ch * 16);
                __m512i xa = _mm512_load_si512(a->xs + ch * cc);
                __m512i xb = bits == 4 ? _mm512_load_si512(a->xs + ch * 128 + 64) : xa;
                __m512 dl = _mm512_load_ps(a->dl + ch * 16);
                MM_IN_REG(nxs);
                MM_IN_REG(xa);
                MM_IN_REG(dl);
                if (bits == 4) MM_IN_REG(xb);
                _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {
                    __m512i d = bits == 4 ? _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(nxs, lo[i], xa), hi[i], xb)
                                          : _mm512_dpbusd_epi32(nxs, lo[i], xa);
                    acc[i][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), dl), ps[i], acc[i][t]);
                }
            }
        }
    }
    const __m512 center = _mm512_set1_ps((float)(1 << (bits - 1)));
    _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {
        __m512 bias[MM_ACTS];
        _Pragma("GCC unroll 4") for (int t = 0; t < A; t++) bias[t] = _mm512_setzero_ps();
        for (int64_t g0 = 0; g0 < ng; g0 += 16) {
            int64_t n = ng - g0 < 16 ? ng - g0 : 16;
            __mmask16 gm = (__mmask16)(n >= 16 ? 0xffff : ((1u << n) - 1));
            __m512 sb = _mm512_fmadd_ps(load16(sc[i], w->sdtype, g0, n), center, load16(bi[i], w->sdtype, g0, n));
            _Pragma("GCC unroll 4") for (int t = 0; t < A; t++)
                bias[t] = _mm512_fmadd_ps(sb, _mm512_maskz_loadu_ps(gm, acts[t].gsum + g0), bias[t]);
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < A; t++)
            y[t * ldy + r + i - r0] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][t], bias[t]));
    }
}

typedef void (*mm_tile_fn)(const osp_weight *w, const osp_q8act *acts, float *y, int64_t ldy, int64_t r, int64_t r0,
                           const __m512i *idx, int pf);
#define MM_TILE(B, R, A)                                                                                              \
    static void mm_tile_##B##_##R##_##A(const osp_weight *w, const osp_q8act *acts, float *y, int64_t ldy, int64_t r, \
                                        int64_t r0, const __m512i *idx, int pf) {                                     \
        mm_tile(B, R, A, w, acts, y, ldy, r, r0, idx, pf);                                                            \
    }
/* Two or more activations: groups of 4 rows. One activation: 2 rows (as
 * rows_kernel), which streams the codes faster than 4 (measured). The last
 * rows of a range that do not fill a group: one at a time. */
#define MM_TILES(B)                                                                                      \
    MM_TILE(B, 1, 1) MM_TILE(B, 1, 2) MM_TILE(B, 1, 3) MM_TILE(B, 1, 4) MM_TILE(B, 2, 1) MM_TILE(B, 4, 2) \
    MM_TILE(B, 4, 3) MM_TILE(B, 4, 4)
MM_TILES(4)
MM_TILES(8)
#define MM_TILE_TABLE(B)                                                                               \
    {{NULL, mm_tile_##B##_1_1, mm_tile_##B##_1_2, mm_tile_##B##_1_3, mm_tile_##B##_1_4},               \
     {NULL, mm_tile_##B##_2_1, NULL, NULL, NULL},                                                       \
     {NULL, NULL, mm_tile_##B##_4_2, mm_tile_##B##_4_3, mm_tile_##B##_4_4}}
/* [bits == 8][rows 1, 2, 4][activations] */
static const mm_tile_fn mm_tiles[2][3][MM_ACTS + 1] = {MM_TILE_TABLE(4), MM_TILE_TABLE(8)};

void osp_q8act_matmul_vnni(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1) {
    if (n <= 0) return;
    const int bits = w->qbits;
    const int64_t cc = bits == 4 ? 128 : 64, per_lane = bits == 4 ? 8 : 4, G = w->group, cps = 16 * G / cc;
    __m512i idx[32]; /* the same table as rows_kernel */
    for (int64_t j = 0; j < cps; j++) {
        int32_t t[16];
        for (int l = 0; l < 16; l++) t[l] = (int32_t)((j * cc + l * per_lane) / G);
        idx[j] = _mm512_loadu_si512(t);
    }
    /* Tiles of near-equal size, so none has one activation unless n == 1:
     * 9 activations run as 3 + 3 + 3, not 4 + 4 + 1. */
    const int64_t nt = (n + MM_ACTS - 1) / MM_ACTS, grp = n == 1 ? 2 : MM_ROWS;
    const mm_tile_fn(*tiles)[MM_ACTS + 1] = mm_tiles[bits == 8];
    for (int64_t r = r0; r < r1;) {
        const int whole = r + grp <= r1;
        for (int64_t k = 0, t0 = 0; k < nt; k++) {
            int64_t a = (n - t0) / (nt - k);
            tiles[whole ? (grp == 2 ? 1 : 2) : 0][a](w, acts + t0, y + t0 * ldy, ldy, r, r0, idx, k == 0);
            t0 += a;
        }
        r += whole ? grp : 1;
    }
}
