/* backend/cpu/amx: the production path for bf16 weights on Intel AMX
 * (TDPBF16PS: bf16 x bf16 products accumulated in f32, tiles of 16 weight
 * rows by 16 tokens by 32 columns).
 *
 * Activations are rounded to bf16 (round to nearest even) and packed once
 * per call into the tiles' B layout; the weights are read as stored
 * (row-major bf16), 16 rows a tile. An output (row, token) is the sum over
 * the columns in order, 32 a tile, and depends on that token's activation
 * alone: a token gets the same bits alone, among 40 or in a prefill of 512
 * (batch and chunk invariance, as the int8 path has). osp_bf16t_ref is the
 * scalar twin (TDPBF16PS's definition: each product exact in f32, added in
 * column order, rounded to nearest even, denormals flushed); the hardware
 * rounds inside a 32-column step its own way (measured on a Xeon: neither
 * that order nor one rounding per pair or per step), so the test holds the
 * tiles to the twin within a few units in the last place of the terms'
 * sum, and to themselves bitwise across token counts.
 */
#ifndef OSP_BACKEND_CPU_AMX_H
#define OSP_BACKEND_CPU_AMX_H

#include <stdint.h>
#include "tensor/tensor.h"

#define OSP_BF16T_COLS 32   /* columns a tile step */
#define OSP_BF16T_TOKENS 16 /* tokens a tile */

/* 1 when this CPU has AMX-BF16, the kernel allowed its tile state, and
 * neither OSP_AMX=0 nor OSP_ISA below avx512 turned it off (once). */
int osp_amx_available(void);

/* Can w go on this path: dense bf16, columns a multiple of 32, 16 rows at least. */
int osp_bf16t_fits(const osp_weight *w);

/* Bytes of the packed form of n tokens of cols columns. */
size_t osp_bf16t_packed_bytes(int64_t n, int64_t cols);
/* Tokens a tile holds for a call of n: n up to 16, else 16 (the tiles are
 * configured that wide, so a decode step of one token reads one token's
 * activations, not sixteen). */
static inline int64_t osp_bf16t_width(int64_t n) { return n < OSP_BF16T_TOKENS ? (n > 0 ? n : 1) : OSP_BF16T_TOKENS; }
/* x [n, cols] f32 -> packed bf16 tiles: blocks of width(n) tokens (missing
 * tokens zero), each a run of cols / 32 tiles of 16 column pairs x width x 2. */
void osp_bf16t_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp);
/* The same with AVX512-BF16 (osp_amx_available() only), for the column
 * tiles [j0, j1) of every token block: bitwise the scalar one's. */
void osp_bf16t_pack_fast(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1);

/* y[t * ldy + (r - r0)] = sum_c bf16(x[t, c]) * W[r, c] for t < n, r in
 * [r0, r1): on the tiles (osp_amx_available()), and the scalar twin. */
void osp_bf16t_amx(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1);
void osp_bf16t_ref(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1);

/* MLX 8-bit weights on the tiles, for many tokens (prefill chunks: the
 * dequantization, 32 rows at a time into the calling thread's scratch, is paid once
 * for all of them): each weight s * c + b (one f32 fma) rounded to bf16, as
 * the GPU's production path dequantizes, then osp_bf16t_amx. */
int osp_q8t_fits(const osp_weight *w);
/* Row r of w dequantized to bf16 [cols] (the scalar twin of the tiles'
 * dequantization: s * c + b as one fma, rounded to nearest even). */
void osp_q8t_row_ref(const osp_weight *w, int64_t r, uint16_t *out);
/* dq: the caller's scratch of 32 x cols bf16 (one per thread) */
void osp_q8t_amx(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                 uint16_t *dq);

#endif
