/* model/: a loaded model (immutable, shared) and its per-sequence
 * session. Weights point into the mmapped safetensors; only small
 * vectors (norm weights, biases, RoPE frequencies) are copied to f32.
 *
 * One transformer body serves the llama family (Llama, Qwen2, Qwen3)
 * and Gemma 3; osp_config's flags select the differences (norm form,
 * q/k norms, biases, sandwich norms, embedding scale, attention scale,
 * sliding layers, soft-caps).
 */
#ifndef OSP_MODEL_H
#define OSP_MODEL_H

#include <pthread.h>
#include "backend/ops.h"
#include "backend/q8act.h"
#include "config.h"
#include "kv/kv.h"
#include "osprey.h"
#include "safetensors.h"

typedef struct osp_layer {
    float *attn_norm;      /* [hidden] input_layernorm */
    float *post_attn_norm; /* [hidden] Gemma: post_attention_layernorm, else NULL */
    float *mlp_norm;       /* [hidden] llama: post_attention_layernorm; Gemma: pre_feedforward_layernorm */
    float *post_mlp_norm;  /* [hidden] Gemma: post_feedforward_layernorm */
    float *q_norm, *k_norm;              /* [head_dim] or NULL */
    float *bq, *bk, *bv, *bo;            /* biases or NULL */
    float *bg, *bu, *bd;
    osp_weight wq, wk, wv, wo;           /* [Hq*D, hidden], [Hkv*D, hidden] x2, [hidden, Hq*D] */
    osp_weight wg, wu, wd;               /* [I, hidden] x2, [hidden, I] */
    int32_t intermediate;                /* this layer's MLP width (Gemma 4 double-wide layers differ) */
    float layer_scalar;                  /* Gemma 4: h *= layer_scalar after the layer; else 1 */
    /* Gemma 4 per-layer embeddings */
    osp_weight w_ple_gate;               /* [P, hidden] per_layer_input_gate */
    osp_weight w_ple_proj;               /* [hidden, P] per_layer_projection */
    float *post_ple_norm;                /* [hidden] post_per_layer_input_norm */
    /* Gemma 4 mixture of experts */
    float *mlp_norm2, *post_mlp_norm1, *post_mlp_norm2; /* [hidden] pre_ff_2, post_ff_1, post_ff_2 */
    float *router_scale;                 /* [hidden] */
    float *per_expert_scale;             /* [E] */
    osp_weight w_router;                 /* [E, hidden] */
    osp_weight *ex_gate, *ex_up, *ex_down; /* [E]: [Im, hidden], [Im, hidden], [hidden, Im] */
} osp_layer;

struct osp_model {
    osp_config cfg;
    osp_st *st;
    char *dir;
    osp_model_info info;
    const osp_ops *ops;
    osp_weight embed;      /* [vocab, hidden] */
    osp_weight head;       /* [vocab, hidden]; == embed when tied */
    float *final_norm;     /* [hidden] */
    float embed_scale;     /* 1 when unscaled */
    float *inv_freq_full;  /* [head_dim/2] */
    float *inv_freq_sliding;
    osp_layer *layers;
    /* Gemma 4 per-layer embeddings (ple_dim P > 0) */
    osp_weight embed_ple;      /* [ple_vocab, n_layers * P] */
    osp_weight ple_model_proj; /* [n_layers * P, hidden] */
    float *ple_proj_norm;      /* [P] */
    float embed_ple_scale;     /* sqrt(P), in f32 like embed_scale */
    char dtype_name[16];
    void *packed;              /* the matmul weights, placed or repacked (model/pack.c), or NULL */
    pthread_mutex_t place_mu;  /* the placement runs once, when the first session is made */
    int placed;
};

/* Scratch for one forward call of at most max_tok tokens in all rows. */
typedef struct osp_scratch {
    int32_t max_tok;
    float *x, *xn, *q, *k, *v, *att, *tmp; /* [N, ...] activations, N = max_tok */
    float *g, *u;                          /* [N, I] */
    float *scores;                         /* [B * Hq, max_ctx + max_tok] */
    float *hlast;                          /* [B, hidden] */
    int32_t *ids;                          /* [N] */
    /* Gemma 4 */
    float *ple;                            /* [N, n_layers * P] combined per-layer inputs */
    float *ple_tmp;                        /* [N, P] */
    float *ple_emb;                        /* [n_layers * P] one token's per-layer embedding */
    float **donor_k, **donor_v;            /* [n_layers] chunk K/V kept for KV-sharing layers, or NULL */
    float *router;                         /* [N, E] */
    int32_t *top_idx;                      /* [N, k] */
    float *top_w;                          /* [N, k] */
    float *moe_x, *moe_out, *moe_acc;      /* [N, hidden] */
    int32_t *moe_rows;                     /* [N] tokens routed to one expert */
    float *moe_w;                          /* [N] their weights */
    void *q8mem;                           /* int8 activation panels for q8cap tokens (fast path) */
    size_t q8stride;                       /* bytes per panel */
    int32_t q8cap;                         /* max_tok */
    osp_q8act *q8acts;                     /* [q8cap / 8] panels */
    int32_t *bpos;                         /* [rows] positions of the batch rows at the chunk's start */
} osp_scratch;

struct osp_session {
    const osp_model *m;
    int fast;      /* production precision: int8 activations for 4-bit weights (backend/q8act.h) */
    int per_token; /* this chunk is a batched decode step: matmuls of other weights run each token alone */
    osp_kv *kv;
    osp_scratch sc;
    int32_t *all_rows; /* [rows] 0, 1, ... */
    const int32_t *rows; /* the batch of the running forward call: KV rows */
    int32_t nb;
};

/* The forward body for the batch s->rows[0..s->nb): ids [nb, T] (nb * T <=
 * scratch max_tok), logits as in osp_forward, batch row b's block starting
 * at logits + b * logits_ld_rows * vocab; logits == NULL skips the head
 * (intermediate prefill chunk). */
osp_status osp_model_forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits,
                                   float *logits, int64_t logits_ld_rows);

/* Gemma 4 (model/gemma4.c): bind its extra tensors; run one chunk. */
osp_status osp_gemma4_bind(osp_model *m, const char *prefix);
osp_status osp_gemma4_forward_chunk(osp_session *s, const int32_t *ids, int32_t T, float *logits_or_null,
                                    int all_logits, int64_t ld_rows);

/* Shared by the architectures (loader.c / forward.c). */
osp_status osp_bind_linear(osp_model *m, const char *path, int64_t rows, int64_t cols, osp_weight *w);
float *osp_bind_vec(osp_model *m, const char *name, int64_t n, int required, osp_status *rc);
void osp_norm_rows(const osp_ops *ops, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                   int add_one);
void osp_embed_rows(const osp_model *m, const osp_weight *e, float scale, const int32_t *ids, int64_t n, float *x);
void osp_head(osp_session *s, const float *x, int32_t B, int32_t T, int all_logits, float *logits, int64_t ld_rows);

/* y[n, w->rows] = x[n, w->cols] · Wᵀ on the thread pool; the session's
 * precision mode picks the kernel (see osp_session_set_fast). */
void osp_matmul(osp_session *s, const osp_weight *w, const float *x, int64_t n, float *y);
/* nw matmuls of one input (q/k/v, gate/up): ys[i] = x · ws[i]ᵀ. The input's
 * int8 form is prepared once and all run in one pass of the pool. */
void osp_matmul_shared(osp_session *s, const osp_weight *const *ws, int nw, const float *x, int64_t n, float *const *ys);

/* Place the matmul weights in huge-page memory, repacking 4-bit ones for
 * the int8 path (model/pack.c). Runs once, when the first session is made
 * (before any forward can read the weights): loading a model only to
 * inspect it copies nothing. Thread-safe. */
osp_status osp_model_place(osp_model *m);

/* Fill inv_freq[head_dim/2] for a RoPE configuration (HF semantics, f32). */
void osp_rope_inv_freq(const osp_rope *r, int32_t head_dim, float *inv_freq);
/* Rotate one head vector x[D] (rotate-half layout) at position pos. */
void osp_rope_apply(float *x, int32_t head_dim, const float *inv_freq, int32_t pos);

#endif
