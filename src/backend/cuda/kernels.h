/* backend/cuda/kernels: the CUDA backend's kernels behind a plain C
 * interface (a .cu file a job: matvec, matmul_tc, rows, rope_kv, moe,
 * attention, convert, probe; kernels_encdec for Whisper), so that the backend itself (cuda.c) is C and the
 * project's headers never pass through nvcc. Every launcher enqueues on the
 * given stream and returns a cudaError_t as int (0 = fine).
 *
 * Numbers: f32 arithmetic throughout (no fast-math intrinsics); every
 * output element of a row is computed in one fixed order that does not
 * depend on how many rows or tokens share the call, so a sequence's numbers
 * are the same alone and in a batch. */
#ifndef OSP_CUDA_KERNELS_H
#define OSP_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *osp_cu_stream;

/* Whether launches may use programmatic dependent launch (step.c: OSP_CUDA_PDL, core/options) */
int osp_cu_pdl_on(void);

/* A matmul weight on the device: dense (qbits 0; dtype 0 f32, 1 f16, 2 bf16)
 * or MLX affine (codes u32 bitstream rows, scales/biases of sdtype). */
typedef struct osp_cu_weight {
    int dtype, qbits, group, sdtype;
    int64_t rows, cols;
    const void *data, *scales, *biases;
} osp_cu_weight;

/* y[t * ldy + r] = sum_c x[t * w->cols + c] * W[r, c], t < n, r < rows */
int osp_cu_matmul(osp_cu_stream st, const osp_cu_weight *w, const float *x, int64_t n, float *y, int64_t ldy);
/* the same for nw weights sharing x (fused launches where the weights' kinds and widths agree) */
int osp_cu_matmul_multi(osp_cu_stream st, const osp_cu_weight *const *ws, int nw, const float *x, int64_t n,
                        float *const *ys, const int64_t *ldys);

/* The tensor-core matmul's workspace for weights of few rows, whose columns
 * are split among blocks (split-K: partial sums, and a counter per block
 * column that the last split resets). One per stream: launches on one
 * stream run in order, so they may share it. */
typedef struct osp_cu_tc_ws {
    float *part;
    int64_t part_floats;
    unsigned *cnt;
    int64_t n_cnt;
    uint16_t *xb; /* a call's input rounded to bf16 once (calls of more than 8 tokens) */
    int64_t xb_elems;
} osp_cu_tc_ws;
/* The production path's matmul: the same, with bf16 and 4-bit/8-bit weights
 * on the tensor cores (activations and dequantized weights rounded to bf16,
 * f32 accumulation), others as osp_cu_matmul_multi; a token's numbers do
 * not depend on n. */
int osp_cu_matmul_tc_multi(osp_cu_stream st, const osp_cu_weight *const *ws, int nw, const float *x, int64_t n,
                           float *const *ys, const int64_t *ldys, const osp_cu_tc_ws *tw);
/* x_elems: the most input values a call has (tokens x columns); 0, or 1 when out of GPU memory */
int osp_cu_tc_ws_init(osp_cu_tc_ws *ws, int64_t x_elems);
void osp_cu_tc_ws_free(osp_cu_tc_ws *ws);

/* f32 -> bf16 (round to nearest even), and a whole weight dequantized to bf16 [rows, cols] */
int osp_cu_to_bf16(osp_cu_stream st, uint16_t *dst, const float *src, int64_t n);
int osp_cu_weight_to_bf16(osp_cu_stream st, const osp_cu_weight *w, uint16_t *dst);
/* Read `bytes` of buf once (the bandwidth probe); sink: a device word the kernel may touch. */
int osp_cu_read_probe(osp_cu_stream st, const void *buf, int64_t bytes, unsigned *sink, int sms);

int osp_cu_rmsnorm(osp_cu_stream st, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                   int add_one);
/* x += t, then y = rmsnorm(x) (the residual add fused with the next norm) */
int osp_cu_add_rmsnorm(osp_cu_stream st, float *y, float *x, const float *t, const float *w, int64_t n, int64_t d,
                       float eps, int add_one);
int osp_cu_add(osp_cu_stream st, float *y, const float *x, int64_t n);
int osp_cu_add_bias(osp_cu_stream st, float *y, const float *b, int64_t n, int64_t d);
int osp_cu_scale(osp_cu_stream st, float *y, float a, int64_t n);
/* y[i, j] *= v[j] * a (the MoE router's scale) */
int osp_cu_mul_vec(osp_cu_stream st, float *y, const float *v, float a, int64_t n, int64_t d);
/* act: 0 SiLU, 1 GELU (tanh) */
int osp_cu_act_mul(osp_cu_stream st, int act, float *y, const float *g, const float *u, int64_t n, int64_t d,
                   int64_t ld_u);
int osp_cu_softcap(osp_cu_stream st, float *x, int64_t n, float cap);
/* ids[r] = the first index of the largest non-NaN value of row r of x [rows, n] (0 when all are NaN): the
 * host's ops->argmax, bit for bit */
int osp_cu_argmax(osp_cu_stream st, const float *x, int64_t rows, int64_t n, int32_t *ids);
/* x [B*T, heads, D]; pos: device [B] */
int osp_cu_rope(osp_cu_stream st, float *x, int32_t B, int32_t T, int64_t heads, int32_t D, const float *inv,
                const int32_t *pos);
/* the same on two tensors with the same positions (q and k) */
int osp_cu_rope2(osp_cu_stream st, float *x1, int64_t h1, float *x2, int64_t h2, int32_t B, int32_t T, int32_t D,
                 const float *inv, const int32_t *pos);
/* One side of a fused norm + RoPE: x [B*T, heads, D] in place; norm: each head vector rmsnorm'ed first
 * (weight w, or none; as osp_cu_rmsnorm computes it, bitwise), then rotated as osp_cu_rope does. */
typedef struct osp_cu_rope_side {
    float *x;
    int64_t heads;
    const float *w;
    float eps;
    int32_t norm, add_one;
} osp_cu_rope_side;
/* x[i] = row ids[i] of w as f32 (the host's osp_weight_row_f32, bitwise), times scale when scale != 1; ids on the
 * device (a head's greedy tokens) */
int osp_cu_embed_ids(osp_cu_stream st, const osp_cu_weight *w, const int32_t *ids, int64_t n, float scale, float *x);
/* dst[i] = src[rows[i]] (rows of H floats); out[rows[i]] += w[i] * acc[i] */
int osp_cu_gather(osp_cu_stream st, float *dst, const float *src, const int32_t *rows, int64_t n, int64_t H);
int osp_cu_scatter_axpy(osp_cu_stream st, float *out, const float *acc, const int32_t *rows, const float *w,
                        int64_t n, int64_t H);

/* Routed experts on the device (cuda.c's moe in production precision: no host round trip, so a step with
 * experts can be a graph). The routing: top_idx/top_w [N, K] from the router's logits [N, E] as the host
 * computes them (softmax with the sums in index order, top-k with ties to the lower index, renormalized,
 * times pes[e]; E <= 1024). Its grouping: the N*K pairs as rows of their experts' slots (g_e: the active
 * experts in increasing order, g_off/g_cnt their rows, *g_nact how many), pair_row [N*K] the token of each
 * row, pos_of [N*K] each pair's row, order [N, K] each token's pairs by expert. The combine: out [N, H] =
 * the pairs' rows of acc weighted, added in expert order from 0 (as the host path's scatters). */
int osp_cu_moe_route(osp_cu_stream st, const float *logits, int64_t N, int E, int K, const float *pes,
                     int32_t *top_idx, float *top_w);
int osp_cu_moe_group(osp_cu_stream st, const int32_t *top_idx, int64_t N, int K, int E, int32_t *g_e, int32_t *g_off,
                     int32_t *g_cnt, int32_t *g_nact, int32_t *pair_row, int32_t *pos_of, int32_t *order);
int osp_cu_moe_combine(osp_cu_stream st, float *out, const float *acc, const float *top_w, const int32_t *pos_of,
                       const int32_t *order, int64_t N, int K, int64_t H);
/* Whether the tensor-core matmul takes w (bf16, or 4/8-bit in its layout). */
int osp_cu_tc_ok(const osp_cu_weight *w);
/* Gate and up (one shape, tensor-core kinds) and y = act(gate) * up in one launch for n <= 8 tokens (act 0 SiLU,
 * 1 GELU's tanh form; y [n, ldy]), the same numbers as the two weights' launch and act_mul; where that launch
 * would split the columns over blocks, not (osp_cu_tc_pair_ok 0; the call returns cudaErrorNotSupported). */
int osp_cu_tc_pair_ok(const osp_cu_weight *gw, const osp_cu_weight *uw, int64_t n);
int osp_cu_matmul_tc_pair(osp_cu_stream st, const osp_cu_weight *gw, const osp_cu_weight *uw, const float *x,
                          int act, int64_t n, float *y, int64_t ldy);
/* The experts' matmul for every slot of a grouping at once: for slot j < *nact and weight i,
 * ys[i][(off[j] + t) * ldys[i]] = x[off[j] + t] · (expert e[j] of tabs[i])ᵀ, t < cnt[j]. tabs[i]: device
 * arrays of the experts (shapes[i]: their common shape, tensor-core kinds); slots: the most a grouping has
 * (the grid's size, fixed for a graph). A token's numbers are osp_cu_matmul_tc_multi's without split-K. */
int osp_cu_matmul_tc_grouped(osp_cu_stream st, const osp_cu_weight *const *shapes, const osp_cu_weight *const *tabs,
                             int nw, const float *x, int64_t slots, const int32_t *e, const int32_t *off,
                             const int32_t *cnt, const int32_t *nact, float *const *ys, const int64_t *ldys);

/* A KV layer as the kernels read it (kv/kv.h's layout), one batch row each. */
typedef struct osp_cu_kvrow {
    unsigned char *mem; /* the row's block */
    int32_t cap;        /* slots */
    int32_t pos;        /* positions cached before this chunk */
} osp_cu_kvrow;

typedef struct osp_cu_kvlayer {
    int sliding, ring, bits, group; /* bits 0 f32, 16 bf16, 4/8 quantized */
    int32_t n_kv_heads, head_dim;
    int64_t cb, ng, slot_bytes;
} osp_cu_kvlayer;

typedef struct osp_cu_attn {
    osp_cu_kvlayer L;
    const osp_cu_kvrow *rows; /* device [nb] */
    int32_t nb, T, n_heads, window;
    float scale, softcap;
    const float *q, *k, *v; /* [nb*T, heads*D] */
    float *out;
    int32_t chunk_stored;   /* the chunk is in the cache already: a query reads only its own position from k/v */
    /* one-token steps (T 1, not chunk_stored): q and k come unrotated, RoPE'd here (inv frequencies rope_inv,
     * position rows[b].pos), and the step's k (rotated) and v stored in the cache here, as osp_cu_norm_rope_store
     * would */
    int32_t rope;
    const float *rope_inv;
    /* attn_dec_kernel (an f32 cache, any rope and counters): the compact kernel, every sum in the split
     * kernel's order, so the same numbers (cuda.c: steps of up to 8 tokens) */
    int32_t compact;
} osp_cu_attn;

/* Attention of a chunk's queries, positions cut into nsplit splits of 128
 * (at least enough for the longest row's range); part: device scratch of
 * osp_cu_attention_scratch floats (NULL when that is 0); several splits are
 * combined by a kernel of their own. */
int64_t osp_cu_attention_scratch(const osp_cu_attn *a, int32_t nsplit);
int osp_cu_attention(osp_cu_stream st, const osp_cu_attn *a, float *part, int32_t nsplit);
#define OSP_CU_ATT_SPLIT 128
/* Store k/v [nb*T, Hkv*D] of a chunk at positions rows[i].pos + t. */
int osp_cu_kv_write(osp_cu_stream st, const osp_cu_kvlayer *L, const osp_cu_kvrow *rows, int32_t nb, int32_t T,
                    const float *k, const float *v);
/* The fused norm + RoPE of a (osp_cu_rope_side) and of b, a second tensor at the same positions (k after q),
 * or NULL; with L (and rows, v; b required), b's vectors (k, rotated) and v are then stored as
 * osp_cu_kv_write stores them, in the same launch. */
int osp_cu_norm_rope_store(osp_cu_stream st, const osp_cu_rope_side *a, const osp_cu_rope_side *b, int32_t B,
                           int32_t T, int32_t D, const float *inv, const int32_t *pos, const osp_cu_kvlayer *L,
                           const osp_cu_kvrow *rows, const float *v);

/* ---- the encoder-decoder operations (kernels_encdec.cu; osp_backend's
 * linear .. rows_attention, whose comments give the layouts) ---- */
int osp_cu_layernorm(osp_cu_stream st, float *y, const float *x, const float *w, const float *b, int64_t n, int64_t d,
                     float eps);
int osp_cu_gelu(osp_cu_stream st, float *x, int64_t n);
int osp_cu_im2col(osp_cu_stream st, float *col, const float *x, int64_t C, int64_t t_in, int64_t t_out, int64_t ld_c,
                  int64_t ld_f, int k, int stride, int pad, int k_major);
int osp_cu_pack_kv(osp_cu_stream st, float *kh, float *vt, const float *k, const float *v, int64_t S, int64_t ld,
                   int heads, int hd);
/* shared memory a block of the full attention needs (S keys, heads of hd) */
int64_t osp_cu_full_attention_smem(int64_t S, int hd);
int osp_cu_full_attention(osp_cu_stream st, const float *q, const float *kh, const float *vt, float *out, int64_t n,
                          int64_t S, int64_t ld, int heads, int hd);
/* The production path's full attention (the tensor cores, bf16 operands): the same layouts, for heads of
 * hd in {16, 32, 64, 128} (osp_cu_flash_ok); whole: osp_full_attn_args' (the keys in one pass, else in fixed
 * splits merged after); scratch: device floats, osp_cu_flash_scratch of them (none when whole); ldkv > 0: kh and
 * vt are K and V as rows [S][ldkv] (head h at columns h·hd), not packed */
int osp_cu_flash_ok(int hd);
int64_t osp_cu_flash_scratch(int64_t n, int64_t S, int64_t ld, int heads, int whole);
int osp_cu_flash_attention(osp_cu_stream st, const float *q, const float *kh, const float *vt, float *out,
                           float *scratch, int64_t n, int64_t S, int64_t ld, int heads, int hd, int whole,
                           int64_t ldkv);
/* osp_bidir_attn_args' attention (q [nb·T, heads·hd], k and v [nb·T, kv_heads·hd], lens: device [nb] or NULL),
 * f32; shared memory a block needs: osp_cu_bidir_attention_smem */
int64_t osp_cu_bidir_attention_smem(int64_t T, int hd, int radius);
int osp_cu_bidir_attention(osp_cu_stream st, const float *q, const float *k, const float *v, float *out,
                           const int32_t *lens, int nb, int64_t T, int heads, int kv_heads, int hd, int radius,
                           float scale, float softcap);
int osp_cu_full_scores(osp_cu_stream st, float *out, const float *q, const float *kh, int64_t n, int64_t S, int64_t ld,
                       int head, int hd);
/* row, pos: device [n] */
int osp_cu_rows_store(osp_cu_stream st, float *kc, float *vc, const float *k, const float *v, const int32_t *row,
                      const int32_t *pos, int64_t n, int64_t ctx, int64_t ld);
int osp_cu_rows_attention(osp_cu_stream st, const float *q, const float *K, const float *V, float *out,
                          const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld, int heads, int hd);

#ifdef __cplusplus
}
#endif

#endif
