/* backend/cpu/bf16t: the production path for bf16 weights on bf16 hardware
 * arithmetic: activations rounded to bf16 (round to nearest even), products
 * of two bf16 exact in f32, accumulated in f32. Two engines compute it:
 *
 * - AMX (amx_tiles.c; TDPBF16PS): tiles of 16 weight rows by up to 16
 *   tokens by 32 columns. The activations are packed once per call into
 *   the tiles' B layout (blocks of width(n) tokens, each a run of cols / 32
 *   tiles of 16 column pairs x width x 2); an output is the sum over the
 *   columns in order. Its scalar twin is TDPBF16PS's definition (each
 *   product exact, added in column order, rounded to nearest even,
 *   denormals flushed); the hardware rounds inside a 32-column step its own
 *   way (measured on a Xeon), so tiles and twin agree within a few units in
 *   the last place of the terms' sum. With many tokens the rows go in
 *   groups (osp_bf16t_group_rows: about 1 MiB of bf16, kept in L2) and
 *   each pair of token blocks passes over a group two row tiles by two
 *   token blocks a step, while the next group's source is requested into
 *   L2; a C tile lives over all the columns, so the order changes nothing.
 * - DOT (bf16dot.c; AVX512-BF16's VDPBF16PS, for CPUs without AMX: AMD Zen
 *   4/5, Cooper Lake): the activations packed token-major as bf16 rows; an
 *   output (row, token) keeps 16 lane sums, lane l taking the column pairs
 *   (2l + 32j, 2l + 1 + 32j) in order of j, each step adding the odd
 *   column's product and then the even one's (each rounded to nearest even,
 *   denormals flushed: VDPBF16PS's definition, which the twin follows and
 *   Zen 5 matches bitwise), then the lanes added in a fixed tree ((l, l + 8),
 *   then + 4, + 2, + 1).
 *
 * Either way an output depends on its token's activation and its weight row
 * alone: a token gets the same bits alone, among 40 or in a prefill of 512,
 * with any split of the rows (batch and chunk invariance, as the int8 path
 * has), so a batched decode step needs no per-token mode.
 *
 * MLX 8-bit weights join the path in prefill chunks: a group of rows at a
 * time dequantized (s * c + b as one f32 fma, rounded to bf16, as the GPU's
 * production path dequantizes) into the calling thread's scratch, then the
 * bf16 kernel.
 *
 * MLX 4-bit weights, repacked for the int8 path (backend/q8act.h), join it
 * the same way on AMX: tiles of 16 rows expanded from the repacked layout
 * (s * c + b as one f32 fma, rounded to bf16: per row and group a table of
 * the 16 values, each code looked up), a group of rows at a time. Those
 * chunks then differ from the int8 path's decode, so a model of them is not
 * chunk-invariant on AMX (cpu.c), as 8-bit ones are not anywhere.
 */
#ifndef OSP_BACKEND_CPU_BF16T_H
#define OSP_BACKEND_CPU_BF16T_H

#include <stddef.h>
#include <stdint.h>
#include "tensor/tensor.h"

#define OSP_BF16T_COLS 32   /* columns a step (both engines) */
#define OSP_BF16T_TOKENS 16 /* tokens an AMX tile */

typedef enum osp_bf16t_kind { OSP_BF16T_NONE = 0, OSP_BF16T_AMX, OSP_BF16T_DOT } osp_bf16t_kind;

/* Whether this CPU (and, for AMX, the kernel's tile permission) can run
 * engine k, with OSP_ISA below avx512 turning both off (once). */
int osp_bf16t_has(osp_bf16t_kind k);
/* The engine production precision uses (once): AMX where it can run and
 * OSP_AMX=0 does not turn it off, else DOT, else NONE; OSP_BF16T=0 turns
 * the path off, OSP_BF16T=dot picks DOT on a CPU that has both. */
osp_bf16t_kind osp_bf16t_engine(void);
const char *osp_bf16t_name(osp_bf16t_kind k);

/* Can w go on this path: dense bf16, columns a multiple of 32, 16 rows at least. */
int osp_bf16t_fits(const osp_weight *w);

/* Rows the AMX kernel multiplies as one group for cols columns: their bf16
 * form about 1 MiB, so it stays in L2 while every pair of token blocks
 * passes (the activations stream once a group); a multiple of 32 in
 * [32, 256]. The 8-bit and 4-bit paths dequantize that many rows at a time. */
static inline int64_t osp_bf16t_group_rows(int64_t cols) {
    const int64_t g = ((int64_t)1 << 19) / (cols > 0 ? cols : 1) / 32 * 32;
    return g < 32 ? 32 : g > 256 ? 256 : g;
}
/* bf16 values a thread's dequantization scratch holds: a group of rows of
 * any width up to max_cols. */
static inline size_t osp_bf16t_dq_elems(int64_t max_cols) {
    const size_t a = (size_t)32 * (size_t)max_cols, b = (size_t)256 * (size_t)max_cols;
    const size_t c = b < ((size_t)1 << 19) ? b : ((size_t)1 << 19);
    return a > c ? a : c;
}

/* Bytes of the packed form of n tokens of cols columns (either engine's). */
size_t osp_bf16t_packed_bytes(int64_t n, int64_t cols);
/* AMX: tokens a tile holds for a call of n: n up to 16, else 16 (the tiles
 * are configured that wide, so a decode step of one token reads one
 * token's activations, not sixteen). */
static inline int64_t osp_bf16t_width(int64_t n) { return n < OSP_BF16T_TOKENS ? (n > 0 ? n : 1) : OSP_BF16T_TOKENS; }
/* Bytes of the packed form engine k writes for n tokens (the rest is not touched). */
size_t osp_bf16t_packed_used(osp_bf16t_kind k, int64_t n, int64_t cols);
/* x [n, cols] f32 -> engine k's packed bf16 form: the scalar twin of the packing. */
void osp_bf16t_pack(osp_bf16t_kind k, const float *x, int64_t n, int64_t cols, uint16_t *xp);
/* The same with AVX512-BF16 (osp_bf16t_has(k) only) for the 32-column steps
 * [j0, j1) of every token: bitwise the scalar one's. */
void osp_bf16t_pack_fast(osp_bf16t_kind k, const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0,
                         int64_t j1);

/* y[t * ldy + (r - r0)] = sum_c bf16(x[t, c]) * W[r, c] for t < n, r in
 * [r0, r1): engine k's kernel (osp_bf16t_has(k) only), and its scalar twin. */
void osp_bf16t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                  int64_t r0, int64_t r1);
void osp_bf16t_ref(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                   int64_t r0, int64_t r1);

/* MLX 8-bit weights whose groups are whole 32-column steps. */
int osp_q8t_fits(const osp_weight *w);
/* Row r of w dequantized to bf16 [cols]: the scalar twin (s * c + b as one
 * fma, rounded to nearest even), and the AVX-512 form, bitwise the same. */
void osp_q8t_row_ref(const osp_weight *w, int64_t r, uint16_t *out);
void osp_q8t_row_fast(const osp_weight *w, int64_t r, uint16_t *out);
/* Engine k on w's rows, dequantized a group (osp_bf16t_group_rows) at a
 * time into dq (the caller's scratch of osp_bf16t_dq_elems(cols) bf16, one
 * per thread). */
void osp_q8t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                int64_t r0, int64_t r1, uint16_t *dq);

/* Repacked MLX 4-bit weights (w->packed) whose groups are whole 32-column steps. */
int osp_q4t_fits(const osp_weight *w);
/* Tile `tile` (rows 16 tile .. 16 tile + 15) of w->packed dequantized to
 * bf16 rows out[i * ld + c] (rows past the weight's end are zero): the
 * scalar twin (s * c + b as one fma, rounded to nearest even), and the
 * AVX-512 form, bitwise the same. */
void osp_q4t_tile_ref(const osp_weight *w, int64_t tile, uint16_t *out, int64_t ld);
void osp_q4t_tile_fast(const osp_weight *w, int64_t tile, uint16_t *out, int64_t ld);
/* Engine k on w's rows [r0, r1) (r0 a multiple of 16), dequantized a group
 * (osp_bf16t_group_rows) at a time into dq (osp_bf16t_dq_elems(cols) bf16,
 * the calling thread's scratch). */
void osp_q4t_mm(osp_bf16t_kind k, const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy,
                int64_t r0, int64_t r1, uint16_t *dq);

/* ---- the engines' entry points (bf16t.c dispatches to them) ---- */
int osp_amx_tiles_built(void);
/* (pf, pf_bytes: memory the next call will read, requested into L2 while
 * many tokens are multiplied; NULL, 0 for none. Without them the kernel
 * requests its own next group of rows.) */
void osp_bf16t_amx_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0,
                      int64_t r1, const void *pf, size_t pf_bytes);
void osp_bf16t_amx_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1);
int osp_bf16t_dot_built(void);
/* 1 when this CPU's VDPBF16PS computes its definition bitwise (probed once on
 * random lanes; Zen 5 does): then the DOT kernel equals its twin bitwise, else
 * (a CPU that rounds inside the pair its own way, as AMX does) within ulps. */
int osp_bf16t_dot_exact(void);
void osp_bf16t_dot_mm(const osp_weight *w, const uint16_t *xp, int64_t n, float *y, int64_t ldy, int64_t r0,
                      int64_t r1);
void osp_bf16t_dot_pack(const float *x, int64_t n, int64_t cols, uint16_t *xp, int64_t j0, int64_t j1);

#endif
