/* backend/q8act: the production path for MLX 4-bit weights.
 *
 * Activations are quantized per token to int8 in blocks of 32
 * (d_b = max|x| / 127), so a weight row's dot product becomes exact int32
 * sums of u8 codes x s8 activations (AVX-512 VNNI vpdpbusd), one per block,
 * combined in f32:
 *
 *   acc = 0
 *   for each group g:
 *     ga = 0, then ga = fma(isum_b, d_b, ga) for its blocks b in order
 *          isum_b = sum_{j in b} xq_j q_j            (exact int32, then f32)
 *     acc = fma(ga + k_g, s_g, acc)            k_g = sum_b fma(-8 sum_{j in b} xq_j, d_b)
 *     acc = fma(b_g + 8 s_g, gsum_g, acc)      gsum_g = sum_{j in g} x_j (f32)
 *   y = acc
 *
 * The codes are centred by 8 (k_g, from the int8 activations, and the bias
 * term b_g + 8 s_g, from the exact x): the large common part of every
 * weight then meets the exact sum of x, and only the centred part meets
 * the int8 rounding. Every
 * implementation performs exactly this sequence of f32 operations for each
 * (row, token), and the int32 sums are exact whatever their order, so the
 * result is bitwise the same for any number of tokens in a call, any tiling
 * and any CPU tier: a user's numbers do not depend on the batch they share
 * (continuous batching), and a token gets the same matmuls in a prefill
 * chunk as in decode.
 *
 * The fast kernel reads the weight in a repacked layout built once at load
 * (osp_q4pack): tiles of 16 rows, one int32 lane per row, so a block's sum
 * for 16 rows is 8 vpdpbusd with a broadcast activation and no horizontal
 * reduction. Per tile and group g, a segment of 64 + 8 G bytes:
 *   [16 scales][16 biases]        raw 16-bit (the checkpoint's bf16 / f16)
 *   then per block of 32 columns, 4 vectors of 64 bytes; vector v holds,
 *   for row lane l, bytes 4l..4l+3 = q[k+j] | q[k+4+j] << 4 (j < 4),
 *   k = 32 b + 8 v: the low nibbles meet activations k..k+3, the high
 *   nibbles k+4..k+7.
 * Rows past the end of the weight are zero. Tiles follow each other, so a
 * range of rows is one sequential stream.
 */
#ifndef OSP_Q8ACT_H
#define OSP_Q8ACT_H

#include <stddef.h>
#include <stdint.h>
#include "tensor/tensor.h"

#define OSP_Q4PACK_ROWS 16 /* rows per tile; row ranges start at multiples of it */
#define OSP_Q8ACT_SLOTS 8  /* tokens per prepared panel */

/* W <= 8 tokens' int8 activations, interleaved so that a kernel finds
 * every token's data for one block of 32 columns at fixed offsets from
 * one pointer, and a panel of one token is as compact as a plain vector.
 * Slot s of the panel holds token s. */
typedef struct osp_q8act {
    int64_t cols;
    int group;
    int width;    /* W: slots */
    int32_t *xq;  /* [cols / 32][8 quads][W]: 4 int8 activations per int32 */
    float *d;     /* [cols / 32][W] block scales */
    float *kg;    /* [cols / group][W] k_g: -8 sum_b d_b (sum of block b's xq), in block order */
    float *gsum;  /* [cols / group][W] sums of x, in the order osp_q8act_prepare_ref documents */
} osp_q8act;

/* Can this weight take the path? 4 bits, bf16/f16 scales, groups of a
 * multiple of 32. */
int osp_q8act_supported(const osp_weight *w);

/* The repacked layout (see above): its size, and building it from w's
 * MLX layout into dst (64-byte aligned) for tiles [t0, t1). */
size_t osp_q4pack_bytes(const osp_weight *w);
void osp_q4pack(const osp_weight *w, void *dst, int64_t t0, int64_t t1);

/* Bytes of scratch one panel of `cols` needs (any group). */
size_t osp_q8act_bytes(int64_t cols);
/* Lay a panel of `width` (1..8) slots out in mem (osp_q8act_bytes,
 * 64-byte aligned). */
void osp_q8act_init(osp_q8act *a, int64_t cols, int group, int width, void *mem);
/* Quantize x[cols] into slot `slot` of the panel. Bitwise
 * osp_q8act_prepare_ref on every CPU. */
void osp_q8act_prepare(osp_q8act *a, int slot, const float *x);
/* The same for groups [g0, g1) of x (x is still the whole row): what those
 * groups own in the panel, nothing else, so ranges can be prepared by
 * different threads; together they equal osp_q8act_prepare bitwise. */
void osp_q8act_prepare_groups(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1);
/* Scalar reference. gsum: 16 partial sums (lane l adds x[g G + 16 i + l]
 * over i in order), then pairs (l, l + h) for h = 8, 4, 2, 1. */
void osp_q8act_prepare_ref(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1);
void osp_q8act_prepare_avx512(osp_q8act *a, int slot, const float *x, int64_t g0, int64_t g1);

/* y[t * ldy + (r - r0)] for tokens t < n and rows [r0, r1), r0 a multiple of
 * OSP_Q4PACK_ROWS; token t is slot t % 8 of panel acts[t / 8], whose width is
 * min(8, n - 8 (t / 8)). The reference reads w's MLX layout (w->data); the VNNI
 * kernel reads w->packed. Bitwise equal. */
void osp_q8act_matmul_ref(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                          int64_t r1);
void osp_q8act_matmul_vnni(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1);
/* The AVX2 tier (vpmaddubsw + vpmaddwd make the same exact block sums), for CPUs without VNNI. */
void osp_q8act_matmul_avx2(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                           int64_t r1);

/* A tier's kernel for one tile of 16 rows (the first `rows` of them real)
 * against tokens [0, A) of one panel, A its table index: y[a * ldy + i]. */
typedef void (*osp_q8act_tile_fn)(const unsigned char *tile, int64_t ng, int64_t bpg, size_t seg,
                                  const osp_q8act *acts, float *y, int64_t ldy, int64_t rows);
/* The walk every tier shares over the repacked layout: tokens 64 at a time
 * (their panels stay in L2 while the tiles pass), each tile's codes once per
 * panel of <= 8 tokens through tab[scales are f16][panel width]. */
void osp_q8act_walk(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy, int64_t r0,
                    int64_t r1, const osp_q8act_tile_fn tab[2][OSP_Q8ACT_SLOTS + 1]);

typedef void (*osp_q8act_mm_fn)(const osp_weight *w, const osp_q8act *acts, int64_t n, float *y, int64_t ldy,
                                int64_t r0, int64_t r1);
/* The VNNI kernel when this CPU has AVX-512 VNNI, else the AVX2 one where
 * it has AVX2, else NULL (without either the int8 path would be slower
 * than the f32 one, so it is not used, and nothing is repacked). */
osp_q8act_mm_fn osp_q8act_matmul_fast(void);

#endif
