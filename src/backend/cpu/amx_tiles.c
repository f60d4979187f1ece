/* backend/cpu/amx_tiles: the AMX tile kernel and the AVX512-BF16 packing
 * (compiled with -mamx-tile -mamx-bf16 -mavx512bf16; called only where
 * osp_bf16t_has(OSP_BF16T_AMX) says the CPU and the kernel allow it). */
#include <immintrin.h>
#include <string.h>
#include "backend/cpu/bf16t.h"

int osp_amx_tiles_built(void) { return 1; }

typedef struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static __thread int configured; /* the tokens a tile this thread's tiles are configured for (0: none) */


/* eight tiles of 16 rows: weights (A: 64 bytes, 32 columns) in 4 and 5, and
 * in 1 and 3 when a call has one token block; C and the activations (B) nb
 * tokens wide: C 0-3, B 6-7 (1 and 3 are C tiles only when nb is 16, where
 * both shapes are 64 bytes) */
static void config(int nb) {
    if (configured == nb) return;
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16;
    c.colsb[0] = c.colsb[2] = c.colsb[6] = c.colsb[7] = (uint16_t)(4 * nb);
    c.colsb[1] = c.colsb[3] = c.colsb[4] = c.colsb[5] = 64;
    _tile_loadconfig(&c);
    configured = nb;
}

/* Rows [lo, hi) of a 16-row tile that starts at row s, for the tokens of block b. */
static void put(const float *c, int64_t s, int64_t lo, int64_t hi, int64_t b, int64_t nbw, int64_t n, float *y,
                int64_t ldy, int64_t r0) {
    const int64_t t0 = b * nbw, nt = n - t0 < nbw ? n - t0 : nbw, m = hi - lo;
    /* a token's m rows: a column of the tile (rows 64 bytes apart), gathered */
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(16));
    const __mmask16 k = (__mmask16)((1u << m) - 1);
    const float *col = c + (lo - s) * 16;
    for (int64_t t = 0; t < nt; t++)
        _mm512_mask_storeu_ps(y + (t0 + t) * ldy + (lo - r0), k,
                              _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, idx, col + t, 4));
}

void osp_bf16t_amx_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                      const void *pf, size_t pf_bytes) {
    const int64_t nbw = osp_bf16t_width(n), ts = 32 * nbw; /* tokens a tile, elements a packed tile */
    const size_t bs = (size_t)(4 * nbw);                   /* bytes a packed tile's row */
    config((int)nbw);
    const int64_t K = w->cols, nch = K / OSP_BF16T_COLS, rows = w->rows, nb = (n + nbw - 1) / nbw;
    const uint16_t *W = w->data;
    const size_t stride = (size_t)K * sizeof(uint16_t);
    float c[4][256] __attribute__((aligned(64)));
    /* Rows in groups whose weights stay in L2 while each pair of token blocks is multiplied by them, the
     * activations streamed once a group (a row's numbers do not depend on the group or the order). */
    const int64_t rg = osp_bf16t_group_rows(K);
    for (int64_t g = r0; g < r1; g += rg) {
        /* what the next group reads (the caller's, else this weight's next rows), requested into L2 a few
         * lines a step of the pairs of token blocks, so that it does not come from memory then */
        const char *pn = pf, *pe = pn ? pn + pf_bytes : NULL;
        if (!pf && g + rg < r1) {
            const int64_t e = g + 2 * rg < r1 ? g + 2 * rg : r1;
            pn = (const char *)(W + (g + rg) * K), pe = (const char *)(W + e * K);
        }
        const int64_t ga = ((g + rg < r1 ? g + rg : r1) - g + 31) / 32, steps = (nb / 2) * ga * nch;
        const int64_t per = steps && pe > pn ? ((pe - pn) / 64 + steps - 1) / steps : 0; /* lines a step */
        for (int64_t b = 0; b < nb; b += 2)
            for (int64_t a = g; a < r1 && a < g + rg; a += 32) {
                /* two tiles of 16 rows; one at the weight's end starts 16 rows before it (a row's numbers
                 * do not depend on where in a tile it is) */
                const int two = a + 16 < r1;
                const int64_t s0 = a + 16 <= rows ? a : rows - 16, s1 = a + 32 <= rows ? a + 16 : rows - 16;
                const uint16_t *A0 = W + s0 * K, *A1 = W + s1 * K;
                const int b2 = b + 1 < nb;
                const uint16_t *B0 = xp + b * nch * ts, *B1 = xp + (b + 1) * nch * ts;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                if (two && b2) {
                    /* (many tokens) two row tiles by two token blocks: the weights in 4 and 5, the activations in
                     * 6 and 7, each loaded tile used twice */
                    for (int64_t j = 0; j < nch; j++) {
                        for (int64_t q = 0; q < per && pn < pe; q++, pn += 64) _mm_prefetch(pn, _MM_HINT_T1);
                        _tile_loadd(4, A0 + j * 32, stride);
                        _tile_loadd(6, B0 + j * ts, bs);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_loadd(7, B1 + j * ts, bs);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_loadd(5, A1 + j * 32, stride);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                } else if (two) {
                    /* (decode: 1-16 tokens) two steps in flight: the tiles are not renamed, so the next step's
                     * loads go to other tiles (1, 3 and 7 are free here); each sum keeps the column order */
                    int64_t j = 0;
                    /* short rows (a tile load's 16 lines are then spread thin): the next 32 rows, contiguous,
                     * requested into L1 while these are multiplied (+8% on 256-column weights streamed from
                     * memory; longer rows gained nothing) */
                    const int pf = K <= 1024; /* (with more tokens the prefetches only queue) */
                    const char *nx = (const char *)(W + (a + 32) * K), *nend = (const char *)(W + rows * K);
                    const int64_t per = (32 * K * 2 / 64 + nch - 1) / nch; /* lines a step */
                    for (; j + 1 < nch; j += 2) {
                        if (pf)
                            for (int64_t q = 0; q < 2 * per; q++) {
                                const char *p = nx + (j * per + q) * 64;
                                if (p < nend) _mm_prefetch(p, _MM_HINT_T0);
                            }
                        _tile_loadd(4, A0 + j * 32, stride);
                        _tile_loadd(5, A1 + j * 32, stride);
                        _tile_loadd(6, B0 + j * ts, bs);
                        _tile_loadd(1, A0 + (j + 1) * 32, stride);
                        _tile_loadd(3, A1 + (j + 1) * 32, stride);
                        _tile_loadd(7, B0 + (j + 1) * ts, bs);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(0, 1, 7);
                        _tile_dpbf16ps(2, 3, 7);
                    }
                    if (j < nch) {
                        _tile_loadd(4, A0 + j * 32, stride);
                        _tile_loadd(5, A1 + j * 32, stride);
                        _tile_loadd(6, B0 + j * ts, bs);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(2, 5, 6);
                    }
                } else if (b2) {
                    for (int64_t j = 0; j < nch; j++) {
                        _tile_loadd(4, A0 + j * 32, stride);
                        _tile_loadd(6, B0 + j * ts, bs);
                        _tile_loadd(7, B1 + j * ts, bs);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                    }
                } else {
                    for (int64_t j = 0; j < nch; j++) {
                        _tile_loadd(4, A0 + j * 32, stride);
                        _tile_loadd(6, B0 + j * ts, bs);
                        _tile_dpbf16ps(0, 4, 6);
                    }
                }
                _tile_stored(0, c[0], 64);
                if (b2) _tile_stored(1, c[1], 64);
                if (two) _tile_stored(2, c[2], 64);
                if (two && b2) _tile_stored(3, c[3], 64);
                const int64_t e0 = a + 16 < r1 ? a + 16 : r1;
                put(c[0], s0, a, e0, b, nbw, n, y, ldy, r0);
                if (b2) put(c[1], s0, a, e0, b + 1, nbw, n, y, ldy, r0);
                if (two) {
                    const int64_t e1 = a + 32 < r1 ? a + 32 : r1;
                    put(c[2], s1, a + 16, e1, b, nbw, n, y, ldy, r0);
                    if (b2) put(c[3], s1, a + 16, e1, b + 1, nbw, n, y, ldy, r0);
                }
            }
    }
}

void osp_bf16t_amx_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1) {
    const int64_t nch = cols / OSP_BF16T_COLS, nbw = osp_bf16t_width(n), nb = (n + nbw - 1) / nbw;
    uint32_t wds[16][16] __attribute__((aligned(64)));
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = j0; j < j1; j++) {
            for (int64_t m = 0; m < nbw; m++) {
                const int64_t t = b * nbw + m;
                if (t >= n) {
                    _mm512_store_si512(wds[m], _mm512_setzero_si512());
                    continue;
                }
                const float *r = x + t * cols + j * 32;
                /* word kp: columns 2kp (low half) and 2kp + 1 */
                __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(r + 16), _mm512_loadu_ps(r));
                _mm512_store_si512(wds[m], (__m512i)h);
            }
            uint32_t *tile = (uint32_t *)(xp + (b * nch + j) * 32 * nbw);
            for (int kp = 0; kp < 16; kp++)
                for (int64_t m = 0; m < nbw; m++) tile[kp * nbw + m] = wds[m][kp];
        }
}
