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

#include "backend/ops.h"
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
    char dtype_name[16];
};

/* Scratch for one forward call of at most max_tok tokens per row. */
typedef struct osp_scratch {
    int32_t max_tok;
    float *x, *xn, *q, *k, *v, *att, *tmp; /* [N, ...] activations, N = B * max_tok */
    float *g, *u;                          /* [N, I] */
    float *scores;                         /* [B * Hq, max_ctx + max_tok] */
    float *hlast;                          /* [B, hidden] */
    int32_t *ids;                          /* [N] */
} osp_scratch;

struct osp_session {
    const osp_model *m;
    osp_kv *kv;
    osp_scratch sc;
};

/* The forward body: ids [B, T] (T <= scratch max_tok), logits as in
 * osp_forward, row b's block starting at logits + b * logits_ld_rows *
 * vocab; logits == NULL skips the head (intermediate prefill chunk). */
osp_status osp_model_forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits,
                                   float *logits, int64_t logits_ld_rows);

/* y[n, w->rows] = x[n, w->cols] · Wᵀ on the thread pool. */
void osp_matmul(const osp_ops *ops, const osp_weight *w, const float *x, int64_t n, float *y);

/* Fill inv_freq[head_dim/2] for a RoPE configuration (HF semantics, f32). */
void osp_rope_inv_freq(const osp_rope *r, int32_t head_dim, float *inv_freq);
/* Rotate one head vector x[D] (rotate-half layout) at position pos. */
void osp_rope_apply(float *x, int32_t head_dim, const float *inv_freq, int32_t pos);

#endif
