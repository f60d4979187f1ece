/* backend/cpu/ops_vec: the x86 kernels written once over a small vector
 * layer (vf: a vector of V_LANES floats, vmask: a lane mask, v_* operations:
 * those that differ between the ISAs in width alone below, through V_MM,
 * the others in vec_<isa>.h), compiled once per ISA: ops_avx2.c includes
 * it after vec_avx2.h, ops_avx512.c after vec_avx512.h, each with its own
 * target flags. Tested against
 * ops_scalar.c; results differ from the scalar twin by summation order alone.
 *
 * matmul picks one of three shapes by n (tokens); the ISA file holds the
 * choice and the kernels only one ISA has (4-bit decode, AVX-512's dense
 * decode):
 *  - n == 1 and 4/8-bit codes (the decode hot path): MLX form
 *    s*sum(x*q) + b*sum(x) streamed from the packed rows, group sums of x
 *    made once per call, on the stack, MV_CHUNK columns at a time
 *    (mv_q_fast; 8-bit rows one at a time, q8_row_each).
 *  - n < GB_MIN_N: 4 rows x up to V_MT_T tokens, weights converted to f32
 *    on the fly and each used for every token (mt_any).
 *  - larger n (prefill): a GB_ROWS-row x 128-column tile of W is converted
 *    once to f32 (dequantized), transposed so rows lie along the lanes, and
 *    reused by up to 256 tokens; the micro-kernel keeps 6 tokens x GB_ROWS
 *    rows in registers and broadcasts x (gemm).
 * A kernel's operations, and so its bits, are the ISA's own: each layer
 * keeps the instructions its file had before the two were made one.
 *
 * The including file defines, after this one: matmul, mv_q_ok, q4_pass
 * (one pass of the 4-bit decode) and dense_each (matmul_each's dense rows).
 */
#ifndef OSP_OPS_VEC_H
#define OSP_OPS_VEC_H

#include <math.h>

/* ------------------------------------------------- the layer's common part */

/* Operations whose intrinsic differs between the ISAs in width alone. */
OSP_INLINE vf v_zero(void) { return V_MM(setzero_ps)(); }
OSP_INLINE vf v_set1(float a) { return V_MM(set1_ps)(a); }
OSP_INLINE vf v_ld(const float *p) { return V_MM(loadu_ps)(p); }
OSP_INLINE vf v_lda(const float *p) { return V_MM(load_ps)(p); } /* aligned */
OSP_INLINE void v_st(float *p, vf a) { V_MM(storeu_ps)(p, a); }
OSP_INLINE void v_sta(float *p, vf a) { V_MM(store_ps)(p, a); } /* aligned */
OSP_INLINE vf v_add(vf a, vf b) { return V_MM(add_ps)(a, b); }
OSP_INLINE vf v_sub(vf a, vf b) { return V_MM(sub_ps)(a, b); }
OSP_INLINE vf v_mul(vf a, vf b) { return V_MM(mul_ps)(a, b); }
OSP_INLINE vf v_div(vf a, vf b) { return V_MM(div_ps)(a, b); }
OSP_INLINE vf v_min(vf a, vf b) { return V_MM(min_ps)(a, b); }
OSP_INLINE vf v_max(vf a, vf b) { return V_MM(max_ps)(a, b); }
OSP_INLINE vf v_and(vf a, vf b) { return V_MM(and_ps)(a, b); }
OSP_INLINE vf v_or(vf a, vf b) { return V_MM(or_ps)(a, b); }
OSP_INLINE vf v_fma(vf a, vf b, vf c) { return V_MM(fmadd_ps)(a, b, c); }  /* a*b + c */
OSP_INLINE vf v_fnma(vf a, vf b, vf c) { return V_MM(fnmadd_ps)(a, b, c); } /* c - a*b */
OSP_INLINE vf v_fms(vf a, vf b, vf c) { return V_MM(fmsub_ps)(a, b, c); }  /* a*b - c */

/* In-register V_LANES x V_LANES transpose, r[i][j] -> r[j][i]: 4x4 within
 * each 128-bit block, then the blocks (v_transpose_blocks). */
OSP_INLINE void v_transpose(vf r[V_LANES]) {
    vf t[V_LANES], u[V_LANES];
    for (int i = 0; i < V_LANES / 2; i++) {
        t[2 * i] = V_MM(unpacklo_ps)(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = V_MM(unpackhi_ps)(r[2 * i], r[2 * i + 1]);
    }
    /* u[4q+e], 128-bit block b: column 4b+e of rows 4q..4q+3 */
    for (int q = 0; q < V_LANES / 4; q++) {
        const vd a0 = V_MM(castps_pd)(t[4 * q]), a1 = V_MM(castps_pd)(t[4 * q + 1]);
        const vd a2 = V_MM(castps_pd)(t[4 * q + 2]), a3 = V_MM(castps_pd)(t[4 * q + 3]);
        u[4 * q] = V_MM(castpd_ps)(V_MM(unpacklo_pd)(a0, a2));
        u[4 * q + 1] = V_MM(castpd_ps)(V_MM(unpackhi_pd)(a0, a2));
        u[4 * q + 2] = V_MM(castpd_ps)(V_MM(unpacklo_pd)(a1, a3));
        u[4 * q + 3] = V_MM(castpd_ps)(V_MM(unpackhi_pd)(a1, a3));
    }
    v_transpose_blocks(u, r);
}

static void matmul(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1);
static int mv_q_ok(const osp_weight *w);
OSP_INLINE void q4_pass(const osp_weight *w, const float *x, const float *sx, int64_t c0, int64_t cw, float *y,
                        int64_t r0, int64_t r1, const int G);
static void dense_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1);

/* Software prefetch distance (bytes ahead in each row) for the streaming
 * kernels: with 4 rows in flight the hardware prefetcher alone leaves
 * DRAM bandwidth unused. */
#define PF_DENSE 512 /* dense rows */
#define PF_Q8 2048   /* 8-bit rows, one at a time */

/* Scales/biases (dtype known only at run time), V_LANES groups at a time,
 * cnt of them valid. */
static vf ld_any(const void *base, osp_dtype dt, int64_t i, int64_t cnt) {
    switch (dt) {
    case OSP_DT_BF16: return v_ld_w_n(base, OSP_DT_BF16, i, cnt);
    case OSP_DT_F16: return v_ld_w_n(base, OSP_DT_F16, i, cnt);
    default: return v_ld_w_n(base, OSP_DT_F32, i, cnt);
    }
}

/* Rows r..r+3 clamped to r1-1: a partial quad reads valid rows and its
 * extra results are dropped. */
static inline void quad_rows(int64_t r, int64_t r1, int64_t rr[4]) {
    for (int i = 0; i < 4; i++) rr[i] = r + i < r1 ? r + i : r1 - 1;
}

/* ------------------------------------------- small n: rows x few tokens */

/* y[t*ldy + i] = W[r+i] . x[t] for 4 rows and NT tokens, weights
 * converted to f32 on the fly (quantized: s*q+b) and used NT times.
 * This is the n == 1 path for dense and uncommon quantized weights, and
 * the small-batch path: W is read once per V_MT_T tokens. */
OSP_INLINE void mt_rows(const osp_weight *w, const qunpack *u, int64_t r, int64_t r1, const float *x, float *y,
                        int64_t ldy, const int NT, const osp_dtype fmt) {
    const int64_t cols = w->cols;
    int64_t rr[4];
    quad_rows(r, r1, rr);
    vf acc[4][V_MT_T], xv[V_MT_T];
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = v_zero();
    if (fmt != OSP_DT_U32) {
        const int64_t es = fmt == OSP_DT_F32 ? 4 : 2, rs = cols * es;
        const unsigned char *row[4];
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rs;
        int64_t c = 0;
        for (; c + V_LANES <= cols; c += V_LANES) {
            for (int t = 0; t < NT; t++) xv[t] = v_ld(x + t * cols + c);
            for (int i = 0; i < 4; i++) {
                if (((c * es) & 63) == 0) /* once per line */
                    _mm_prefetch((const char *)row[i] + c * es + PF_DENSE, _MM_HINT_T0);
                vf wv = v_ld_w(row[i], fmt, c);
                for (int t = 0; t < NT; t++) acc[i][t] = v_fma(wv, xv[t], acc[i][t]);
            }
        }
        if (c < cols) {
            const vmask m = v_tail(cols - c);
            for (int t = 0; t < NT; t++) xv[t] = v_ld_m(x + t * cols + c, m);
            for (int i = 0; i < 4; i++) {
                vf wv = v_ld_w_n(row[i], fmt, c, cols - c);
                for (int t = 0; t < NT; t++) acc[i][t] = v_fma(wv, xv[t], acc[i][t]);
            }
        }
    } else {
        const int64_t G = w->group, ng = cols / G, rb = cols * u->bits / 8;
        const unsigned char *row[4];
        float sb[4][V_LANES] __attribute__((aligned(V_ALIGN))), bb[4][V_LANES] __attribute__((aligned(V_ALIGN)));
        for (int i = 0; i < 4; i++) row[i] = (const unsigned char *)w->data + rr[i] * rb;
        for (int64_t g0 = 0; g0 < ng; g0 += V_LANES) {
            const int64_t cnt = ng - g0 < V_LANES ? ng - g0 : V_LANES;
            for (int i = 0; i < 4; i++) {
                v_sta(sb[i], ld_any(w->scales, w->sdtype, rr[i] * ng + g0, cnt));
                v_sta(bb[i], ld_any(w->biases, w->sdtype, rr[i] * ng + g0, cnt));
            }
            for (int64_t g = 0; g < cnt; g++) {
                for (int64_t c = (g0 + g) * G; c < (g0 + g + 1) * G; c += V_LANES) {
                    for (int t = 0; t < NT; t++) xv[t] = v_ld(x + t * cols + c);
                    for (int i = 0; i < 4; i++) {
                        vf wv = v_fma(v_codes(row[i], rb, u, c), v_bcast(&sb[i][g]), v_bcast(&bb[i][g]));
                        for (int t = 0; t < NT; t++) acc[i][t] = v_fma(wv, xv[t], acc[i][t]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < 4 && r + i < r1; i++)
        for (int t = 0; t < NT; t++) y[t * ldy + i] = v_hsum(acc[i][t]);
}

OSP_INLINE void mt_all(const osp_weight *w, const qunpack *u, const float *x, int64_t n, float *y, int64_t ldy,
                       int64_t r0, int64_t r1, const osp_dtype fmt) {
    for (int64_t t = 0; t < n; t += V_MT_T) {
        const float *xt = x + t * w->cols;
        const int64_t nt = n - t < V_MT_T ? n - t : V_MT_T;
        for (int64_t r = r0; r < r1; r += 4) {
            float *yt = y + t * ldy + (r - r0);
            if (nt == 1) mt_rows(w, u, r, r1, xt, yt, ldy, 1, fmt);
#if V_MT_T > 2
            else if (nt == 2) mt_rows(w, u, r, r1, xt, yt, ldy, 2, fmt);
            else if (nt == 3) mt_rows(w, u, r, r1, xt, yt, ldy, 3, fmt);
#endif
            else mt_rows(w, u, r, r1, xt, yt, ldy, V_MT_T, fmt);
        }
    }
}

static void mt_any(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    qunpack u;
    qunpack_init(&u, w->qbits);
    if (w->qbits) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_F16);
    else mt_all(w, &u, x, n, y, ldy, r0, r1, OSP_DT_F32);
}

/* ------------------------------------- n == 1, 4- and 8-bit, MLX form */

/* Columns of x whose group sums (and for AVX-512's 4-bit a permuted copy)
 * are made per pass, on the stack; longer rows take several passes that add
 * into y. */
#define MV_CHUNK 8192

static void group_sums(const float *x, int64_t ng, int group, float *sx) {
    for (int64_t g = 0; g < ng; g++) {
        vf s = v_zero();
        for (int j = 0; j < group; j += V_LANES) s = v_add(s, v_ld(x + g * group + j));
        sx[g] = v_hsum(s);
    }
}

/* 8-bit: per group, vg = sum x*q (V_LANES codes a step), acc += s * vg with
 * s broadcast from memory; the bias terms b * sum(x) go into the same
 * accumulator, lanes over groups instead of columns: only the total
 * matters. One row at a time: the rows follow each other in memory, so the
 * kernel reads one sequential stream (4 rows side by side were 4 streams a
 * row apart, which the prefetchers followed worse; figures in
 * docs/NOTES.md, "CPU kernels' measured choices"). Dense rows carry half
 * the arithmetic a byte and gained nothing from it.
 * NT tokens (xs apart, their group sums sx MV_CHUNK / 32 apart, outputs ldy
 * apart) share the row's conversion; each token's operations are those it
 * gets alone (NT = 1: the n == 1 kernel), so batched rows stay bitwise. */
OSP_INLINE void q8_row_each(const osp_weight *w, int64_t r, const float *x, int64_t xs, const float *sx, int64_t c0,
                            int64_t cw, float *out, int64_t ldy, int accum, const int G, const int NT) {
    const int64_t ng = w->cols / G, gb = c0 / G, cnt = cw / G;
    const unsigned char *p = (const unsigned char *)w->data + r * w->cols + c0;
    vf acc[V_Q8_T], vg[V_Q8_T];
    for (int t = 0; t < NT; t++) acc[t] = v_zero();
    float sb[V_LANES] __attribute__((aligned(V_ALIGN)));
    for (int64_t gc = 0; gc < cnt; gc += V_LANES) {
        const int64_t gn = cnt - gc < V_LANES ? cnt - gc : V_LANES;
        const vmask m = v_tail(gn);
        const int64_t o = r * ng + gb + gc;
        v_sta(sb, ld_any(w->scales, w->sdtype, o, gn));
        const vf bv = ld_any(w->biases, w->sdtype, o, gn);
        for (int t = 0; t < NT; t++) acc[t] = v_fma(bv, v_ld_m(sx + t * (MV_CHUNK / 32) + gc, m), acc[t]);
        for (int64_t g = 0; g < gn; g++) {
            const int64_t k0 = (gc + g) * G;
            for (int t = 0; t < NT; t++) vg[t] = v_zero();
            for (int j = 0; j < G; j += V_LANES) {
                if (((k0 + j) & 63) == 0) _mm_prefetch((const char *)p + k0 + j + PF_Q8, _MM_HINT_T0);
                const vf d = v_u8(p + k0 + j);
                for (int t = 0; t < NT; t++) vg[t] = v_fma(v_ld(x + t * xs + k0 + j), d, vg[t]);
            }
            for (int t = 0; t < NT; t++) acc[t] = v_fma(v_bcast(&sb[g]), vg[t], acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        const float v = v_hsum(acc[t]);
        out[t * ldy] = accum ? out[t * ldy] + v : v;
    }
}

OSP_INLINE void q8_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1,
                        const int G) {
    float sx[V_Q8_T * (MV_CHUNK / 32)];
    const int64_t C = w->cols;
    for (int64_t c0 = 0; c0 < C; c0 += MV_CHUNK) {
        const int64_t cw = C - c0 < MV_CHUNK ? C - c0 : MV_CHUNK;
        for (int64_t t0 = 0; t0 < n; t0 += V_Q8_T) {
            const int nt = n - t0 < V_Q8_T ? (int)(n - t0) : V_Q8_T;
            for (int t = 0; t < nt; t++) group_sums(x + (t0 + t) * C + c0, cw / G, G, sx + t * (MV_CHUNK / 32));
            const float *xt = x + t0 * C + c0;
            for (int64_t r = r0; r < r1; r++) {
                float *o = y + t0 * ldy + (r - r0);
                switch (nt) {
                case 1: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 1); break;
                case 2: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 2); break;
                case 3: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 3); break;
#if V_Q8_T > 4
                case 4: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 4); break;
                case 5: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 5); break;
                case 6: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 6); break;
                case 7: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, 7); break;
#endif
                default: q8_row_each(w, r, xt, C, sx, c0, cw, o, ldy, c0 > 0, G, V_Q8_T); break;
                }
            }
        }
    }
}

OSP_INLINE void mv_q(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1, const int G,
                     const int BITS) {
    float sx[MV_CHUNK / 32];
    for (int64_t c0 = 0; c0 < w->cols; c0 += MV_CHUNK) {
        const int64_t cw = w->cols - c0 < MV_CHUNK ? w->cols - c0 : MV_CHUNK;
        group_sums(x + c0, cw / G, G, sx);
        if (BITS == 4) q4_pass(w, x + c0, sx, c0, cw, y, r0, r1, G);
        else
            for (int64_t r = r0; r < r1; r++) q8_row_each(w, r, x + c0, 0, sx, c0, cw, y + r - r0, 0, c0 > 0, G, 1);
    }
}

/* The n == 1 kernel of the weights mv_q_ok takes: 4- or 8-bit codes in
 * groups of 32/64/128. */
static void mv_q_fast(const osp_weight *w, const float *x, float *y, int64_t r0, int64_t r1) {
    switch (w->qbits * 1000 + w->group) {
    case 4032: mv_q(w, x, y, r0, r1, 32, 4); break;
    case 4064: mv_q(w, x, y, r0, r1, 64, 4); break;
    case 4128: mv_q(w, x, y, r0, r1, 128, 4); break;
    case 8032: mv_q(w, x, y, r0, r1, 32, 8); break;
    case 8064: mv_q(w, x, y, r0, r1, 64, 8); break;
    default: mv_q(w, x, y, r0, r1, 128, 8); break;
    }
}

/* -------------------------------------------------- large n: tiled GEMM */

#define GB_ROWS (V_GB_RV * V_LANES) /* rows per W tile */
#define GB_K 128                    /* columns per W tile (a multiple of every group size) */
#define GB_KB 512                   /* columns of x per L2 block (a multiple of GB_K) */
#define GB_TOK 256                  /* tokens sharing one converted tile */
#define GB_T 6                      /* tokens per micro-kernel */
#define GB_MIN_N 16                 /* below this the small-n kernels win */

/* V_LANES weights of row r from column c, left of them valid (c % V_LANES
 * == 0 and left >= V_LANES when quantized). */
OSP_INLINE vf ld_weights(const osp_weight *w, const qunpack *u, int64_t r, int64_t c, int64_t left,
                         const osp_dtype fmt) {
    if (fmt != OSP_DT_U32) {
        const int64_t es = fmt == OSP_DT_F32 ? 4 : 2;
        return v_ld_w_n((const unsigned char *)w->data + r * w->cols * es, fmt, c, left);
    }
    const int64_t rb = w->cols * u->bits / 8;
    const int64_t gi = r * (w->cols / w->group) + c / w->group;
    const vf s = v_set1(osp_load_float(w->scales, w->sdtype, gi));
    const vf b = v_set1(osp_load_float(w->biases, w->sdtype, gi));
    return v_fma(v_codes((const unsigned char *)w->data + r * rb, rb, u, c), s, b);
}

/* wt[c*GB_ROWS + i] = W[rb+i, kc+c] as f32, for i < nr (rows up to the
 * next multiple of V_LANES are zero) and c < kw. */
OSP_INLINE void convert_tile(const osp_weight *w, const qunpack *u, int64_t rb, int nr, int64_t kc, int64_t kw,
                             float *wt, const osp_dtype fmt) {
    for (int rg = 0; rg * V_LANES < nr; rg++) {
        for (int64_t c = 0; c < kw; c += V_LANES) {
            vf v[V_LANES];
            for (int i = 0; i < V_LANES; i++)
                v[i] = rg * V_LANES + i < nr ? ld_weights(w, u, rb + rg * V_LANES + i, kc + c, kw - c, fmt) : v_zero();
            v_transpose(v);
            for (int j = 0; j < V_LANES; j++) v_sta(wt + (c + j) * GB_ROWS + rg * V_LANES, v[j]);
        }
    }
}

static void convert_tile_any(const osp_weight *w, const qunpack *u, int64_t rb, int nr, int64_t kc, int64_t kw,
                             float *wt) {
    if (w->qbits) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_U32);
    else if (w->dtype == OSP_DT_BF16) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_BF16);
    else if (w->dtype == OSP_DT_F16) convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_F16);
    else convert_tile(w, u, rb, nr, kc, kw, wt, OSP_DT_F32);
}

/* y[t*ldy + i] (+)= sum_c x[t*xs + c] * wt[c*GB_ROWS + i] for T tokens and
 * RV*V_LANES rows (stores limited to nr rows). Per column: RV loads of W,
 * T broadcasts of x, T*RV FMAs. */
OSP_INLINE void micro(const float *wt, const float *x, int64_t xs, int64_t kw, float *y, int64_t ldy, int nr,
                      int accum, const int T, const int RV) {
    vf acc[GB_T][V_GB_RV];
    const float *xp[GB_T];
    for (int t = 0; t < T; t++) {
        xp[t] = x + t * xs;
        for (int v = 0; v < RV; v++) acc[t][v] = v_zero();
    }
    for (int64_t c = 0; c < kw; c++) {
        vf wv[V_GB_RV];
        for (int v = 0; v < RV; v++) {
            wv[v] = v_lda(wt + c * GB_ROWS + V_LANES * v);
            /* keep W in registers: GCC would otherwise fold a reload of W
             * into every FMA and run out of load slots */
            __asm__("" : "+" V_REG(wv[v]));
        }
        for (int t = 0; t < T; t++) {
            const vf xb = v_bcast(xp[t] + c);
            for (int v = 0; v < RV; v++) acc[t][v] = v_fma(wv[v], xb, acc[t][v]);
        }
    }
    for (int t = 0; t < T; t++) {
        for (int v = 0; v < RV; v++) {
            const vmask m = v_tail(nr - V_LANES * v);
            float *yp = y + t * ldy + V_LANES * v;
            vf a = acc[t][v];
            if (accum) a = v_add(a, v_ld_m(yp, m));
            v_st_m(yp, m, a);
        }
    }
}

OSP_INLINE void micro_rv(const float *wt, const float *x, int64_t xs, int64_t kw, float *y, int64_t ldy, int nr,
                         int accum, const int T) {
    switch ((nr + V_LANES - 1) / V_LANES) {
    case 1: micro(wt, x, xs, kw, y, ldy, nr, accum, T, 1); break;
#if V_GB_RV > 2
    case 2: micro(wt, x, xs, kw, y, ldy, nr, accum, T, 2); break;
    case 3: micro(wt, x, xs, kw, y, ldy, nr, accum, T, 3); break;
#endif
    default: micro(wt, x, xs, kw, y, ldy, nr, accum, T, V_GB_RV); break;
    }
}

static void micro_any(const float *wt, const float *x, int64_t xs, int64_t kw, float *y, int64_t ldy, int nt,
                      int nr, int accum) {
    switch (nt) {
    case 1: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, 1); break;
    case 2: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, 2); break;
    case 3: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, 3); break;
    case 4: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, 4); break;
    case 5: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, 5); break;
    default: micro_rv(wt, x, xs, kw, y, ldy, nr, accum, GB_T); break;
    }
}

/* Blocked for the caches: a slice of x (GB_TOK tokens x GB_KB columns)
 * stays in L2 while every row tile of the range passes over it, each
 * converted tile (L1) serving all GB_TOK tokens. */
static void gemm(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    float wt[GB_K * GB_ROWS] __attribute__((aligned(V_ALIGN)));
    qunpack u;
    qunpack_init(&u, w->qbits);
    const int64_t cols = w->cols;
    for (int64_t tb = 0; tb < n; tb += GB_TOK) {
        const int64_t te = tb + GB_TOK < n ? tb + GB_TOK : n;
        for (int64_t kb = 0; kb < cols; kb += GB_KB) {
            const int64_t ke = kb + GB_KB < cols ? kb + GB_KB : cols;
            for (int64_t rb = r0; rb < r1; rb += GB_ROWS) {
                const int nr = (int)(r1 - rb < GB_ROWS ? r1 - rb : GB_ROWS);
                for (int64_t kc = kb; kc < ke; kc += GB_K) {
                    const int64_t kw = ke - kc < GB_K ? ke - kc : GB_K;
                    convert_tile_any(w, &u, rb, nr, kc, kw, wt);
                    for (int64_t t = tb; t < te; t += GB_T) {
                        int nt = (int)(te - t < GB_T ? te - t : GB_T);
                        micro_any(wt, x + t * cols + kc, cols, kw, y + t * ldy + (rb - r0), ldy, nt, nr, kc > 0);
                    }
                }
            }
        }
    }
}

/* Whether matmul has nothing to compute (rows of a weight without columns
 * are zeroed). */
static int matmul_trivial(const osp_weight *w, int64_t n, float *y, int64_t ldy, int64_t r0, int64_t r1) {
    if (n <= 0 || r1 <= r0) return 1;
    if (w->cols > 0) return 0;
    for (int64_t t = 0; t < n; t++) memset(y + t * ldy, 0, (size_t)(r1 - r0) * sizeof(float));
    return 1;
}

/* Dense and 8-bit weights of mv_q's kinds: every token as the one-token
 * kernel gives it. */
static int matmul_each(const osp_weight *w, const float *x, int64_t n, float *y, int64_t ldy, int64_t r0,
                       int64_t r1) {
    if (w->cols <= 0 || (w->qbits && (w->qbits != 8 || !mv_q_ok(w)))) return 0;
    if (n <= 0 || r1 <= r0) return 1;
    if (!w->qbits) {
        dense_each(w, x, n, y, ldy, r0, r1);
        return 1;
    }
    switch (w->group) {
    case 32: q8_each(w, x, n, y, ldy, r0, r1, 32); break;
    case 64: q8_each(w, x, n, y, ldy, r0, r1, 64); break;
    default: q8_each(w, x, n, y, ldy, r0, r1, 128); break;
    }
    return 1;
}

/* ------------------------------------------------------------ elementwise */

static float dot(const float *a, const float *b, int64_t n) {
    vf s0 = v_zero(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 4 * V_LANES <= n; i += 4 * V_LANES) {
        s0 = v_fma(v_ld(a + i), v_ld(b + i), s0);
        s1 = v_fma(v_ld(a + i + V_LANES), v_ld(b + i + V_LANES), s1);
        s2 = v_fma(v_ld(a + i + 2 * V_LANES), v_ld(b + i + 2 * V_LANES), s2);
        s3 = v_fma(v_ld(a + i + 3 * V_LANES), v_ld(b + i + 3 * V_LANES), s3);
    }
    for (; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        s0 = v_fma(v_ld_m(a + i, m), v_ld_m(b + i, m), s0);
    }
    return v_hsum(v_add(v_add(s0, s1), v_add(s2, s3)));
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    const vf av = v_set1(a);
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        v_st_m(y + i, m, v_fma(av, v_ld_m(x + i, m), v_ld_m(y + i, m)));
    }
}

static void rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps, int add_one) {
    vf s0 = v_zero(), s1 = s0;
    int64_t i = 0;
    for (; i + 2 * V_LANES <= n; i += 2 * V_LANES) {
        const vf a = v_ld(x + i), b = v_ld(x + i + V_LANES);
        s0 = v_fma(a, a, s0);
        s1 = v_fma(b, b, s1);
    }
    for (; i < n; i += V_LANES) {
        const vf a = v_ld_m(x + i, v_tail(n - i));
        s0 = v_fma(a, a, s0);
    }
    const float ss = v_hsum(v_add(s0, s1));
    const vf inv = v_set1(1.0f / sqrtf(ss / (float)n + eps)), one = v_set1(1.0f);
    for (i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        vf v = v_mul(v_ld_m(x + i, m), inv);
        if (w) {
            const vf wv = v_ld_m(w + i, m);
            v = v_mul(v, add_one ? v_add(one, wv) : wv);
        }
        v_st_m(y + i, m, v);
    }
}

/* e^x, Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial,
 * scaled by 2^n (v_ldexp: denormals, 0 and inf at the ends like expf). */
OSP_INLINE vf v_exp(vf x) {
    x = v_min(x, v_set1(89.0f));
    x = v_max(x, v_set1(-104.0f));
    const vf n = v_round(v_mul(x, v_set1(1.44269504088896341f)));
    vf r = v_fnma(n, v_set1(0.693359375f), x);
    r = v_fnma(n, v_set1(-2.12194440e-4f), r);
    vf p = v_set1(1.9875691500e-4f);
    p = v_fma(p, r, v_set1(1.3981999507e-3f));
    p = v_fma(p, r, v_set1(8.3334519073e-3f));
    p = v_fma(p, r, v_set1(4.1665795894e-2f));
    p = v_fma(p, r, v_set1(1.6666665459e-1f));
    p = v_fma(p, r, v_set1(5.0000001201e-1f));
    p = v_fma(p, v_mul(r, r), v_add(r, v_set1(1.0f)));
    return v_ldexp(p, n);
}

/* 1 / (1 + e^-x); saturates cleanly to 0 and 1. */
OSP_INLINE vf v_sigmoid(vf x) {
    const vf one = v_set1(1.0f);
    return v_div(one, v_add(one, v_exp(v_sub(v_zero(), x))));
}

/* tanh: odd Taylor series to z^17 below |z| = 0.5 (error < 1e-8), else
 * 1 - 2/(e^2|z| + 1), which has no cancellation there and tends to 1. */
OSP_INLINE vf v_tanh(vf z) {
    const vf one = v_set1(1.0f);
    const vf a = v_abs(z), z2 = v_mul(z, z);
    vf p = v_set1(5.90027440946e-4f);
    p = v_fma(p, z2, v_set1(-1.45583438705e-3f));
    p = v_fma(p, z2, v_set1(3.59212803657e-3f));
    p = v_fma(p, z2, v_set1(-8.86323552990e-3f));
    p = v_fma(p, z2, v_set1(2.18694885362e-2f));
    p = v_fma(p, z2, v_set1(-5.39682539683e-2f));
    p = v_fma(p, z2, v_set1(1.33333333333e-1f));
    p = v_fma(p, z2, v_set1(-3.33333333333e-1f));
    const vf small = v_fma(v_mul(z, z2), p, z);
    const vf e = v_exp(v_add(a, a));
    vf big = v_sub(one, v_div(v_set1(2.0f), v_add(e, one)));
    big = v_or(big, v_and(z, v_set1(-0.0f))); /* z's sign */
    return v_blend(v_lt(a, v_set1(0.5f)), big, small);
}

/* The largest of x[0..n), -inf when n == 0. */
static float vmax_of(const float *x, int64_t n) {
    const vf ninf = v_set1(-INFINITY);
    vf mx = ninf;
    for (int64_t i = 0; i < n; i += V_LANES) mx = v_max(mx, v_ld_m_or(ninf, x + i, v_tail(n - i)));
    return n > 0 ? v_hmax(mx) : -INFINITY;
}

static void softmax(float *x, int64_t n) {
    if (n <= 0) return;
    const vf mv = v_set1(vmax_of(x, n));
    vf sum = v_zero();
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        const vf e = v_exp(v_sub(v_ld_m(x + i, m), mv));
        sum = v_add(sum, v_keep(e, m));
        v_st_m(x + i, m, e);
    }
    const vf inv = v_set1(1.0f / v_hsum(sum));
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        v_st_m(x + i, m, v_mul(v_ld_m(x + i, m), inv));
    }
}

static float sumexp(const float *x, int64_t n, float *mx_out) {
    const float mx = vmax_of(x, n);
    const vf mv = v_set1(mx);
    vf s[V_EXP_CHAINS];
    for (int k = 0; k < V_EXP_CHAINS; k++) s[k] = v_zero();
    int64_t i = 0;
    for (; i + V_EXP_CHAINS * V_LANES <= n; i += V_EXP_CHAINS * V_LANES)
        for (int k = 0; k < V_EXP_CHAINS; k++) s[k] = v_add(s[k], v_exp(v_sub(v_ld(x + i + k * V_LANES), mv)));
    for (; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        s[0] = v_add(s[0], v_keep(v_exp(v_sub(v_ld_m(x + i, m), mv)), m));
    }
    vf t = s[0];
    for (int k = 1; k < V_EXP_CHAINS; k++) t = v_add(t, s[k]);
    *mx_out = mx;
    return v_hsum(t);
}

static void silu_mul(float *y, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        const vf gv = v_ld_m(g + i, m);
        v_st_m(y + i, m, v_mul(v_mul(gv, v_sigmoid(gv)), v_ld_m(u + i, m)));
    }
}

/* 0.5 v (1 + tanh z) == v * sigmoid(2z): same value, no cancellation. */
static void gelu_tanh_mul(float *y, const float *g, const float *u, int64_t n) {
    const vf k = v_set1(0.7978845608028654f), c = v_set1(0.044715f);
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        const vf v = v_ld_m(g + i, m);
        const vf z = v_mul(k, v_fma(v_mul(c, v), v_mul(v, v), v));
        v_st_m(y + i, m, v_mul(v_mul(v, v_sigmoid(v_add(z, z))), v_ld_m(u + i, m)));
    }
}

static void gelu_erf(float *x, int64_t n) {
    static const float P[11] = OSP_GELU_ERF_P;
    const vf cap = v_set1(14.1421356f), two = v_set1(2.0f), half = v_set1(0.5f), one = v_set1(1.0f);
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        const vf v = v_ld_m(x + i, m);
        /* |x| up to 10 sqrt 2 (min with the NaN second: a NaN stays NaN) */
        const vf a = v_min(cap, v_abs(v));
        const vf t = v_div(two, v_add(two, v_mul(a, v_set1(0.70710678118654752f))));
        vf p = v_set1(P[10]);
        for (int k = 9; k >= 0; k--) p = v_fma(p, t, v_set1(P[k]));
        /* z^2 = x^2 / 2 = zz + lo exactly (z itself rounded would cost 3e-6 at z = 7), and e^(p - z^2) as
         * e^-zz e^(p - lo) (the sum p - zz would round at zz's scale) */
        const vf hi = v_mul(a, a), zz = v_mul(half, hi), lo = v_mul(half, v_fms(a, a, hi));
        const vf e = v_mul(v_exp(v_sub(v_zero(), zz)), v_exp(v_sub(p, lo)));
        const vf hc = v_mul(half, v_mul(t, e));
        const vf phi = v_blend(v_ge(v, v_zero()), hc, v_sub(one, hc));
        v_st_m(x + i, m, v_mul(v, phi));
    }
}

static void softcap(float *x, int64_t n, float cap) {
    const vf cv = v_set1(cap);
    for (int64_t i = 0; i < n; i += V_LANES) {
        const vmask m = v_tail(n - i);
        v_st_m(x + i, m, v_mul(cv, v_tanh(v_div(v_ld_m(x + i, m), cv))));
    }
}

static const osp_ops OPS = {
    .name = V_OPS_NAME, .matmul = matmul, .matmul_each = matmul_each, .dot = dot, .axpy = axpy,
    .rmsnorm = rmsnorm, .softmax = softmax, .sumexp = sumexp, .silu_mul = silu_mul,
    .gelu_tanh_mul = gelu_tanh_mul, .gelu_erf = gelu_erf, .softcap = softcap,
};

const osp_ops *V_OPS_GET(void) { return &OPS; }

#endif
