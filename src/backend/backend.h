/* backend/: a device that holds a model's tensors and computes its forward
 * pass, chosen when the model is loaded (osp_model_params.device).
 *
 * The model code (model/llama.c, model/gemma4.c) describes a chunk of rows
 * as a sequence of coarse operations over whole activations, and never
 * reads or writes activation memory itself: activations, norm weights and
 * KV blocks are osp_dbuf pointers, an incomplete type the model code cannot
 * dereference (only offset, with osp_dbuf_at). A backend owns that memory
 * (host memory on the CPU; device memory elsewhere) and implements the
 * operations on it. Token ids and positions go in as host arrays; logits
 * come back to host memory in one read.
 *
 * A backend is shared by every model loaded on it (it holds no model state);
 * per-session state (the CPU's int8 activation panels, a GPU's stream) is an
 * osp_be_session. Everything a backend does for one row of a batch is the
 * same as for that row alone, bitwise: the batch-invariance promise of the
 * server rests on it.
 *
 * Adding a device is adding a file that fills an osp_backend (backend/cpu/
 * is the reference); nothing in model/ names a device.
 */
#ifndef OSP_BACKEND_H
#define OSP_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "core/core.h"
#include "osprey.h" /* osp_device */
#include "tensor/tensor.h"

typedef struct osp_dbuf osp_dbuf; /* f32 values in a backend's memory: passed, never dereferenced */

typedef const osp_dbuf *osp_vec; /* a weight vector in a backend's memory, or NULL */

static inline osp_dbuf *osp_dbuf_at(const osp_dbuf *p, int64_t i) { return (osp_dbuf *)((const float *)p + i); }


struct osp_kv;
typedef struct osp_be_session osp_be_session;

/* Attention of a chunk of new tokens against each row's cached past (see
 * backend/cpu/attention.c for the semantics every backend must keep). */
typedef struct osp_attn_args {
    const struct osp_kv *kv;
    int32_t layer;               /* storage layer (a donor for shared KV) */
    const int32_t *rows;         /* [nb] KV rows of the batch (host) */
    int32_t nb;
    int32_t T;                   /* new tokens per row */
    int32_t n_heads, n_kv_heads, head_dim;
    float scale;                 /* multiplies q·k */
    float softcap;               /* 0 = none */
    int32_t window;              /* 0 = full causal; else a query sees itself and window-1 earlier */
    const osp_dbuf *q;           /* [nb*T, n_heads*D] */
    const osp_dbuf *k, *v;       /* [nb*T, n_kv_heads*D]: this chunk */
    osp_dbuf *out;               /* [nb*T, n_heads*D] */
    osp_dbuf *scores;            /* [nb*n_heads, score_stride] scratch */
    int64_t score_stride;        /* >= max positions a query can see */
    int chunk_stored;            /* the chunk's K/V are already in the cache (exact tokens): each query reads the
                                    positions before it from the cache, as stored, and only its own from k/v,
                                    as a one-token decode step does */
} osp_attn_args;

/* Final norm, LM head and soft-cap: logits (host) of every position,
 * row b's block at logits + b * ld_rows * vocab, or [B, vocab] of the last
 * positions.
 *
 * Ids out (not with all_logits): ids[b] = the greedy token of row b's
 * logits, exactly ops->argmax's choice (the sampler's greedy pick, after the
 * soft-cap: the first index of the largest value, NaN never chosen, 0 when
 * every value is NaN), and only the rows with need[b] != 0 are sure to
 * have their logits written (need NULL: none); the other rows' blocks of
 * `logits` are scratch. On a GPU only B ids and the needed rows come back.
 *
 * Deferred ids (defer_ids, with ids and need NULL): head may return while
 * the step still runs; the ids are written into `ids` by the ids_wait that
 * follows (a backend without ids_wait writes them before head returns). */
typedef struct osp_head_args {
    const osp_dbuf *x;           /* [B*T, hidden] */
    const osp_dbuf *norm;        /* [hidden] */
    const osp_weight *w;         /* [vocab, hidden] */
    int32_t B, T, all_logits;
    int64_t hidden, vocab, ld_rows;
    float eps, softcap;          /* softcap 0 = none */
    int add_one;
    float *logits;
    const osp_dbuf *res;         /* [B*T, hidden] added to x first (x += res: the last layer's residual add, the
                                    head's norm then the add_rmsnorm's), or NULL */
    int32_t *ids;                /* [B] host, or NULL: no ids out */
    const uint8_t *need;         /* [B] host, with ids: the rows whose logits are wanted too */
    int defer_ids;               /* the ids may come later (ids_wait) */
    osp_dbuf *xn, *hlast;        /* scratch [B*T, hidden], [B, hidden] */
} osp_head_args;

/* The head norms and RoPE of a layer's q and k (the fused entry rope_qk): q = rope(rmsnorm(q) * w) per head
 * vector, then k the same (a norm skipped where its weight is NULL), both at the same positions; then, with kv,
 * the chunk's K and V stored as kv_write(kv, layer, rows, B, k, v, T) does; then, with attn, attention(attn) (its
 * q, k, v these). */
typedef struct osp_rope_qk_args {
    osp_dbuf *q, *k;             /* [B*T, heads, D], in place; k NULL: q alone (a layer reading another's K/V) */
    int64_t q_heads, k_heads;
    int32_t B, T, D;
    const osp_dbuf *inv_freq;
    const int32_t *pos;          /* [B] host: row b's token t at pos[b] + t */
    osp_vec q_norm, k_norm;      /* head norms' weights (rmsnorm's w, with add_one), or NULL: no norm */
    float eps;
    int add_one;
    struct osp_kv *kv;           /* then the store, or NULL */
    int32_t layer;
    const int32_t *rows;         /* [B] KV rows (host) */
    const osp_dbuf *v;
    const struct osp_attn_args *attn; /* then the attention, or NULL */
} osp_rope_qk_args;

/* Routed experts (Gemma 4): router on the residual (weightless RMSNorm,
 * * router_scale * scale, proj, softmax, top-k with ties to the lower index,
 * renormalized, * per_expert_scale), then each chosen expert's gated MLP on
 * the normed input, weighted into out (zeroed first). */
typedef struct osp_moe_args {
    const osp_dbuf *x;           /* [n, hidden] the residual (router input) */
    const osp_dbuf *x2;          /* [n, hidden] the experts' input */
    osp_dbuf *out;               /* [n, hidden] */
    int64_t n, hidden, n_experts, top_k, inter;
    float eps, scale;
    const osp_dbuf *router_scale, *per_expert_scale;
    const osp_weight *router;
    const osp_weight *gate, *up, *down; /* [n_experts] */
    osp_act act;
    /* scratch */
    osp_dbuf *normed, *probs, *moe_x, *moe_acc, *g, *u;
    int32_t *top_idx, *rows;     /* host [n * top_k] */
    float *top_w, *row_w;        /* host [n * top_k] */
} osp_moe_args;

/* Columns of a 1-D convolution for one matmul (Whisper's conv1/conv2):
 * col[t, ci·k + j] (k_major: col[t, j·C + ci]) = x at channel ci, frame
 * stride·t + j - pad, 0 outside [0, t_in); x's (ci, f) is x[ci·ld_c + f·ld_f]. */
typedef struct osp_im2col_args {
    osp_dbuf *col;               /* [t_out, C·k] */
    const osp_dbuf *x;
    int64_t C, t_in, t_out, ld_c, ld_f;
    int32_t k, stride, pad, k_major;
} osp_im2col_args;

/* Attention of n queries over all S keys of a fixed window, no mask (the
 * encoder's self-attention, the decoder's cross-attention). */
typedef struct osp_full_attn_args {
    const osp_dbuf *q;           /* [n, ld]: head h at columns [h·hd, (h+1)·hd), already scaled */
    const osp_dbuf *kh;          /* [heads][S][hd] (pack_kv) */
    const osp_dbuf *vt;          /* [heads][hd][S] */
    osp_dbuf *out;               /* [n, ld] */
    int64_t n, S, ld;
    int32_t heads, hd;
    /* 1: the n queries are the window's own positions, always all of them together (an encoder's
     * self-attention), so the backend may group the work as it likes; 0: a query's numbers must not depend on
     * the others in the call (a decoder's rows, batched) */
    int32_t whole;
} osp_full_attn_args;

/* Attention without a causal mask over each row's own positions, the whole sequence in one chunk (a bidirectional
 * encoder's: EmbeddingGemma): query t of row b sees the keys j < len[b] of that row with |t - j| < radius (radius
 * 0: all of them); a query that sees none gets zeros. q, k, v as the projections wrote them (after RoPE); query
 * head h reads KV head h / (n_heads / n_kv_heads), as attention does. */
typedef struct osp_bidir_attn_args {
    const osp_dbuf *q;           /* [nb*T, n_heads*D] */
    const osp_dbuf *k, *v;       /* [nb*T, n_kv_heads*D] */
    osp_dbuf *out;               /* [nb*T, n_heads*D] */
    const int32_t *len;          /* [nb] host: each row's valid positions, or NULL: all T */
    int32_t nb, T, n_heads, n_kv_heads, head_dim, radius;
    float scale;                 /* multiplies q·k */
    float softcap;               /* 0 = none */
} osp_bidir_attn_args;
#define OSP_BIDIR_MAX_T 8192 /* T at most (the caller checks) */

/* Causal attention of n tokens over per-row caches (a Whisper decoder's
 * beams): token i, of row row[i] at position pos[i], sees positions
 * [0, pos[i]] of its row, its own stored first (rows_store). */
typedef struct osp_rows_attn_args {
    const osp_dbuf *q;           /* [n, ld], already scaled */
    const osp_dbuf *k, *v;       /* [rows][ctx][ld] */
    osp_dbuf *out;               /* [n, ld] */
    const int32_t *row, *pos;    /* host [n] */
    int64_t n, ctx, ld;
    int32_t heads, hd;
} osp_rows_attn_args;

/* A range of memory (a file mapping whose pages a placement may give back). */
typedef struct osp_region {
    const void *p;
    size_t n;
} osp_region;

/* Allocation of KV blocks (kv/kv.c keeps rows and positions; the backend
 * keeps the blocks). Blocks come zeroed and are freed with their size (the
 * host's are mappings of their own: core's osp_pages_alloc). */
typedef struct osp_kv_mem {
    void *(*alloc)(size_t bytes);
    void (*free)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *host, const void *src, size_t bytes);   /* block -> host memory (synchronous) */
    void (*from_host)(void *dst, const void *host, size_t bytes); /* host memory -> block (synchronous) */
} osp_kv_mem;

typedef struct osp_backend {
    const char *name;            /* "cpu (avx512+vnni+bf16)", "cuda (H200)" */
    osp_device device;
    int needs_place;             /* sessions need the matmul weights placed (the device cannot read the mapping) */

    /* ---- memory ---- */
    osp_dbuf *(*alloc)(size_t n_floats);            /* NULL when out of memory */
    void (*free)(osp_dbuf *p);
    /* A weight vector as the backend keeps it; `host` is the caller's
     * (osp_malloc'd) copy, which the backend takes over. */
    osp_dbuf *(*adopt_vec)(float *host, int64_t n);
    void (*free_vec)(osp_dbuf *p);
    void (*write)(osp_dbuf *dst, const float *host, int64_t n); /* host -> backend */
    void (*read)(float *host, const osp_dbuf *src, int64_t n);  /* backend -> host */
    const osp_kv_mem *kv_mem;

    /* ---- weights ---- */
    /* Put the n matmul weights where they stream fastest (repacked, or
     * uploaded), once, at load; the weights' pointers move there. `keep`
     * lists data that must stay readable where it is (tables the model
     * gathers rows from); `maps` the file mappings whose pages may be given
     * back once copied. *owned is what unplace frees. */
    osp_status (*place)(osp_weight *const *ws, int n, const void *const *keep, int n_keep, const osp_region *maps,
                        int n_maps, void **owned);
    void (*unplace)(void *owned);

    /* ---- sessions ---- */
    osp_status (*session_new)(int32_t max_tok, int64_t max_cols, osp_be_session **out);
    void (*session_free)(osp_be_session *s);
    /* fast: production precision (int8 activations for 4-bit weights on the
     * CPU); reference precision otherwise. */
    void (*set_fast)(osp_be_session *s, int fast);
    /* on: every token of the following chunks is computed exactly as a
     * one-token decode step would compute it (speculative verification: a
     * chunk of drafted tokens must give each position the numbers plain
     * decoding gives). NULL: the backend does not promise it (no speculation). */
    void (*set_exact_tokens)(osp_be_session *s, int on);
    /* on: kernels whose numbers do not depend on a chunk's token count, where the backend also has a faster
     * one that does (the CPU's 4-bit prefill chunks on AMX tiles): what a prefix cache that reuses any prefix
     * needs (chunk_invariant's chunk_exact). NULL: the backend has no such choice. */
    void (*set_chunk_exact)(osp_be_session *s, int on);
    /* A chunk of B rows of T tokens begins (a batched decode step when
     * T == 1 and B > 1: every row computed exactly as alone). */
    void (*begin_chunk)(osp_be_session *s, int32_t B, int32_t T);
    /* After a chunk: OSP_OK, or the first failure of its operations (with a message). */
    osp_status (*status)(osp_be_session *s);
    /* host -> backend as an operation of the chunk, in its order (host is read at the call): the data a step
     * feeds its first operation, such as a Whisper decoder's embedded tokens */
    void (*upload)(osp_be_session *s, osp_dbuf *dst, const float *host, int64_t n);
    /* Every operation of the chunk is submitted (before its status and reads), for a chunk that does not end at
     * `head`: a backend may run a decode step's operations as one captured graph (CUDA, as at `head`). NULL:
     * nothing to do. */
    void (*end_chunk)(osp_be_session *s);

    /* ---- operations on a chunk's activations ---- */
    /* ys[i] = x · ws[i]ᵀ for n rows; weights of one input share its preparation */
    void (*matmul)(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *x, int64_t n,
                   osp_dbuf *const *ys);
    /* y = rmsnorm(x) * (w ? (add_one ? 1 + w : w) : 1), n rows of d */
    void (*rmsnorm)(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one);
    void (*add)(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n);                 /* y += x */
    void (*add_bias)(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d); /* rows += b */
    void (*scale)(osp_be_session *s, osp_dbuf *y, float a, int64_t n);                         /* y *= a */
    void (*copy)(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n);
    /* y[i, j] = act(g[i, j]) * u[i * ld_u + j], n rows of d (g and y: ld d) */
    void (*act_mul)(osp_be_session *s, osp_act act, osp_dbuf *y, const osp_dbuf *g, const osp_dbuf *u, int64_t n,
                    int64_t d, int64_t ld_u);
    /* RoPE (rotate-half) on x [B*T, heads, D]: row b's token t at position pos[b] + t (host) */
    void (*rope)(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t D,
                 const osp_dbuf *inv_freq, const int32_t *pos);
    /* x[i] = row ids[i] of e (host ids), times scale when scale != 1 */
    void (*embed)(osp_be_session *s, const osp_weight *e, float scale, const int32_t *ids, int64_t n, osp_dbuf *x);
    /* The same with ids = the greedy tokens the previous chunk's head took (its ids out, the same n rows), read
     * where they were taken: a step fed by the step before it, queued before its ids reach the host
     * (osp_forward_rows_chain). NULL, or can_embed_prev(e) == 0 (the table is not where the ids are): not
     * available, and the caller passes host ids to embed. */
    int (*can_embed_prev)(const osp_weight *e);
    void (*embed_prev)(osp_be_session *s, const osp_weight *e, float scale, int64_t n, osp_dbuf *x);
    /* Wait for the oldest head run with defer_ids whose ids have not been waited for, and write its ids where
     * its arguments said; OSP_OK, or the failure of that step (none waiting: OSP_OK). NULL: heads never defer. */
    osp_status (*ids_wait)(osp_be_session *s);
    void (*attention)(osp_be_session *s, const osp_attn_args *a);
    /* store a chunk's K/V in the cache (see osp_kv_write) */
    void (*kv_write)(osp_be_session *s, struct osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                     const osp_dbuf *k, const osp_dbuf *v, int32_t T);
    void (*head)(osp_be_session *s, const osp_head_args *a);
    void (*moe)(osp_be_session *s, const osp_moe_args *a);

    /* ---- fused operations ----
     * Sequences of the operations above that a model issues together, as one entry a backend may run as fewer
     * launches. Each is optional: NULL, the caller gets the sequence of plain operations (the osp_be_* wrappers
     * below and their defaults in backend/fused.c), and a backend that fills one must give the numbers of that
     * sequence bitwise. Nothing else is fused: every plain operation does all it says when it is called, whatever
     * comes next. */
    /* x += t (n·d values), then y = rmsnorm(x) as rmsnorm (y may be x): a residual add and the norm that reads
     * the sum */
    void (*add_rmsnorm)(osp_be_session *s, osp_dbuf *y, osp_dbuf *x, const osp_dbuf *t, const osp_dbuf *w,
                        int64_t n, int64_t d, float eps, int add_one);
    /* osp_rope_qk_args: q's and k's head norms and RoPE, then the K/V store, then the attention */
    void (*rope_qk)(osp_be_session *s, const osp_rope_qk_args *a);
    /* y = act(x · gateᵀ) * (x · upᵀ), n rows of gate->rows (gate and up of the same shape, no biases): the
     * matmul of both weights into y and u, then act_mul(act, y, y, u). u is scratch [n, up->rows] and may be
     * left unwritten. */
    void (*gate_up_act)(osp_be_session *s, osp_act act, const osp_weight *gate, const osp_weight *up,
                        const osp_dbuf *x, int64_t n, osp_dbuf *y, osp_dbuf *u);

    /* ---- encoder-decoder operations (model/whisper.c) ---- */
    /* serial: operations on the calling thread only (the CPU's pool has
     * another user); NULL where that does not apply */
    void (*set_serial)(osp_be_session *s, int serial);
    /* y[n, w->rows] = x[n, w->cols] · Wᵀ (+ bias [w->rows] unless NULL), for
     * long inputs too (the encoder's 3000 frames) */
    void (*linear)(osp_be_session *s, const osp_weight *w, const osp_dbuf *x, int64_t n, const osp_dbuf *bias,
                   osp_dbuf *y);
    /* y = (x - mean) / sqrt(var + eps) * w + b, n rows of d (mean and variance in double) */
    void (*layernorm)(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, const osp_dbuf *b,
                      int64_t n, int64_t d, float eps);
    /* x = x/2 · (1 + erf(x/√2)) (the exact GELU) */
    void (*gelu)(osp_be_session *s, osp_dbuf *x, int64_t n);
    void (*im2col)(osp_be_session *s, const osp_im2col_args *a);
    /* k, v [S, ld] (head h: columns [h·hd, (h+1)·hd)) -> kh [heads][S][hd], vt [heads][hd][S] */
    void (*pack_kv)(osp_be_session *s, osp_dbuf *kh, osp_dbuf *vt, const osp_dbuf *k, const osp_dbuf *v, int64_t S,
                    int64_t ld, int32_t heads, int32_t hd);
    void (*full_attention)(osp_be_session *s, const osp_full_attn_args *a);
    /* Optional: full_attention with a->kh and a->vt being K and V as the projections wrote them ([S, ld], head h
     * at columns [h·hd, (h+1)·hd)): the numbers of pack_kv then full_attention, without the packed copy. Returns
     * 0, having done nothing, where the backend reads them packed (NULL: always); the caller then packs. */
    int (*full_attention_rows)(osp_be_session *s, const osp_full_attn_args *a);
    /* out[i, j] = q[i, head's columns] · kh[head][j]: n rows of S scores
     * before the softmax (the alignment heads, for word timestamps) */
    void (*full_scores)(osp_be_session *s, osp_dbuf *out, const osp_dbuf *q, const osp_dbuf *kh, int64_t n, int64_t S,
                        int64_t ld, int32_t head, int32_t hd);
    /* the caches' [row[i]][pos[i]] = k[i], v[i] (caches [rows][ctx][ld]; row, pos: host [n]) */
    void (*rows_store)(osp_be_session *s, osp_dbuf *kc, osp_dbuf *vc, const osp_dbuf *k, const osp_dbuf *v,
                       const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld);
    void (*rows_attention)(osp_be_session *s, const osp_rows_attn_args *a);
    /* osp_bidir_attn_args (model/llama.c's bidirectional Gemma 3); NULL: not on this backend */
    void (*bidir_attention)(osp_be_session *s, const osp_bidir_attn_args *a);

    /* Are the rows of a chunk computed independently of the chunk's size
     * (one token alone, in a batch of 5 or of 500: the same bits) for these
     * placed matmul weights, in production (fast) or reference precision?
     * Then a prefix computed in any chunks can continue anywhere, bitwise
     * (the prefix cache, model/session.c). chunk_exact: with set_chunk_exact on. NULL = never. */
    int (*chunk_invariant)(const osp_weight *const *ws, int n, int fast, int chunk_exact);
    /* Tokens a chunk of every row can hold at about the cost of a one-token
     * step for these placed weights (speculative verification's default
     * budget, engine/spec.h): past it a pass is bound by compute, not by
     * streaming the weights. NULL = 8. */
    int32_t (*pass_tokens)(const osp_weight *const *ws, int n, int fast);

    /* ---- measuring ---- */
    /* One trial of the device's read bandwidth in GB/s (a kernel that reads
     * a buffer far beyond its caches once), < 0 on failure; release = 1
     * frees the probe's buffer instead. NULL where the caller measures
     * itself (the CPU: bench runs a triad on its threads). */
    double (*bw_trial)(int release);
} osp_backend;

/* A token's routed experts from its router probabilities p [E] (after the softmax): the top K, ties to the lower
 * index, into idx [K], their probabilities renormalized to sum 1 and times per_expert_scale [E] into w [K]
 * (backend/moe_route.c: the host routing every backend that routes on the host shares). */
void osp_moe_route_topk(const float *p, int64_t E, int64_t K, const float *per_expert_scale, int32_t *idx, float *w);

/* The fused operations' sequences of plain operations (backend/fused.c): what a backend without the entry
 * gets, and what one with it may fall back to. */
void osp_fused_add_rmsnorm(const osp_backend *be, osp_be_session *s, osp_dbuf *y, osp_dbuf *x, const osp_dbuf *t,
                           const osp_dbuf *w, int64_t n, int64_t d, float eps, int add_one);
void osp_fused_rope_qk(const osp_backend *be, osp_be_session *s, const osp_rope_qk_args *a);
void osp_fused_gate_up_act(const osp_backend *be, osp_be_session *s, osp_act act, const osp_weight *gate,
                           const osp_weight *up, const osp_dbuf *x, int64_t n, osp_dbuf *y, osp_dbuf *u);

/* The fused operations as the models call them: the backend's entry, or its default. */
static inline void osp_be_add_rmsnorm(const osp_backend *be, osp_be_session *s, osp_dbuf *y, osp_dbuf *x,
                                      const osp_dbuf *t, const osp_dbuf *w, int64_t n, int64_t d, float eps,
                                      int add_one) {
    if (be->add_rmsnorm) be->add_rmsnorm(s, y, x, t, w, n, d, eps, add_one);
    else osp_fused_add_rmsnorm(be, s, y, x, t, w, n, d, eps, add_one);
}
static inline void osp_be_rope_qk(const osp_backend *be, osp_be_session *s, const osp_rope_qk_args *a) {
    if (be->rope_qk) be->rope_qk(s, a);
    else osp_fused_rope_qk(be, s, a);
}
static inline void osp_be_gate_up_act(const osp_backend *be, osp_be_session *s, osp_act act,
                                      const osp_weight *gate, const osp_weight *up, const osp_dbuf *x, int64_t n,
                                      osp_dbuf *y, osp_dbuf *u) {
    if (be->gate_up_act) be->gate_up_act(s, act, gate, up, x, n, y, u);
    else osp_fused_gate_up_act(be, s, act, gate, up, x, n, y, u);
}

/* The CPU backend (backend/cpu/): today's kernels, threads and int8 path. */
const osp_backend *osp_backend_cpu(void);
/* The CUDA backend (backend/cuda/, built when the CUDA toolkit is found):
 * NULL, with a message, when no device is present. */
const osp_backend *osp_backend_cuda(void);

/* The backend for a device: AUTO = the best present (the CPU when nothing
 * else is). NULL with an error when that device is not available. */
const osp_backend *osp_backend_get(osp_device d);
/* One trial of the device's read-bandwidth probe in GB/s (release != 0 frees its buffer instead):
 * OSP_ERR_UNSUPPORTED on a device without one (the CPU: benches use the host triad). */
osp_status osp_backend_bw_trial(const osp_backend *be, int release, double *gbps);

#endif
