/* model/: a loaded model (immutable once loaded, shared by its sessions)
 * and its per-sequence sessions.
 *
 * A model lives on a backend (backend/backend.h), chosen at load: matmul
 * weights are osp_weight views of the safetensors mapping that the backend
 * places (copies, repacks or uploads) at load; norm weights, biases and
 * RoPE frequencies are osp_dbuf vectors in the backend's memory. The model
 * code never reads either: it hands them to the backend's operations.
 *
 * The architecture is a table (arch.h): llama.c (Llama, Qwen2, Qwen3,
 * Gemma 3) and gemma4.c (Gemma 4) each bind their weights and run their
 * body; the osp_layer fields below are the union of what they use.
 */
#ifndef OSP_MODEL_H
#define OSP_MODEL_H

#include "arch.h"
#include "backend/backend.h"
#include "config.h"
#include "kv/kv.h"
#include "layout.h"
#include "osprey.h"
#include "safetensors.h"

typedef struct osp_layer {
    osp_vec attn_norm;      /* [hidden] input_layernorm */
    osp_vec post_attn_norm; /* [hidden] Gemma: post_attention_layernorm, else NULL */
    osp_vec mlp_norm;       /* [hidden] llama: post_attention_layernorm; Gemma: pre_feedforward_layernorm */
    osp_vec post_mlp_norm;  /* [hidden] Gemma: post_feedforward_layernorm */
    osp_vec post_attn_norm_b, post_mlp_norm_b; /* [hidden] encoders' LayerNorm biases (model/bert.c), else NULL */
    osp_vec q_norm, k_norm; /* [head_dim] or NULL */
    osp_vec bq, bk, bv, bo; /* biases or NULL */
    osp_vec bg, bu, bd;
    osp_weight wq, wk, wv, wo;           /* [Hq*D, hidden], [Hkv*D, hidden] x2, [hidden, Hq*D] */
    osp_weight wg, wu, wd;               /* [I, hidden] x2, [hidden, I] */
    int32_t intermediate;                /* this layer's MLP width (Gemma 4 double-wide layers differ) */
    float layer_scalar;                  /* Gemma 4: h *= layer_scalar after the layer; else 1 */
    /* Gemma 4 per-layer embeddings */
    osp_weight w_ple_gate;               /* [P, hidden] per_layer_input_gate */
    osp_weight w_ple_proj;               /* [hidden, P] per_layer_projection */
    osp_vec post_ple_norm;               /* [hidden] post_per_layer_input_norm */
    /* Gemma 4 mixture of experts */
    osp_vec mlp_norm2, post_mlp_norm1, post_mlp_norm2; /* [hidden] pre_ff_2, post_ff_1, post_ff_2 */
    osp_vec router_scale;                /* [hidden] */
    osp_vec per_expert_scale;            /* [E] */
    osp_weight w_router;                 /* [E, hidden] */
    osp_weight *ex_gate, *ex_up, *ex_down; /* [E]: [Im, hidden], [Im, hidden], [hidden, Im] */
} osp_layer;

struct osp_model {
    osp_config cfg;
    osp_st *st;
    char *dir;
    osp_model_info info;
    const osp_backend *be;
    osp_weight embed;      /* [vocab, hidden] */
    osp_weight head;       /* [vocab, hidden]; == embed when tied */
    osp_vec final_norm;    /* [hidden] */
    float embed_scale;     /* 1 when unscaled */
    osp_vec inv_freq_full; /* [head_dim/2] */
    osp_vec inv_freq_sliding;
    osp_layer *layers;
    /* Gemma 4 per-layer embeddings (ple_dim P > 0) */
    osp_weight embed_ple;      /* [ple_vocab, n_layers * P] */
    osp_weight ple_model_proj; /* [n_layers * P, hidden] */
    osp_vec ple_proj_norm;     /* [P] */
    float embed_ple_scale;     /* sqrt(P), in f32 like embed_scale */
    /* encoders (model/bert.c) */
    osp_weight pos_embed;      /* [n_pos_embed, hidden] learned absolute positions (gathered) */
    osp_weight type_embed;     /* [type_vocab, hidden] token types (gathered) */
    osp_vec embed_norm, embed_norm_b; /* [hidden] the embeddings' LayerNorm */
    osp_weight cls_dense;      /* [hidden, hidden] classifier.dense (gathered: read on the host, in the mapping) */
    osp_weight cls_out;        /* [n_labels, hidden] classifier.out_proj (the same) */
    osp_vec cls_dense_b, cls_out_b; /* [hidden], [n_labels] their biases */
    char dtype_name[16];
    int prefix;                /* which of the loader's name prefixes the checkpoint uses */
    void *placed;              /* the backend's placement of the matmul weights (unplace frees it) */
    int chunk_invariant[2][2]; /* [fast][chunk_exact]: the backend computes rows independently of chunk sizes (backend.h) */
    int32_t pass_tokens[2];    /* [fast]: tokens a pass holds at about one token's cost (backend.h) */
};

/* Activations for forward calls of at most max_tok tokens in all rows, in
 * the backend's memory; ids and positions on the host. What only one
 * architecture needs is its own (extra, arch.h's scratch_new). */
typedef struct osp_scratch {
    int32_t max_tok;
    osp_dbuf *x, *xn, *q, *k, *v, *att, *tmp; /* [N, ...] activations, N = max_tok */
    osp_dbuf *g, *u;                          /* [N, I] */
    osp_dbuf *scores;                         /* [B * Hq, max_ctx + max_tok] */
    osp_dbuf *hlast;                          /* [B, hidden] */
    int32_t *ids;                             /* [N] host */
    int32_t *bpos;                            /* [rows] host: positions of the batch rows at the chunk's start */
    void *extra;                              /* the architecture's */
} osp_scratch;

struct osp_session {
    const osp_model *m;
    const osp_backend *be;
    osp_be_session *bs;  /* the backend's state (precision mode, its own scratch) */
    int fast;            /* production precision (osp_session_set_fast) */
    int exact;           /* every token as a one-token decode step (osp_session_set_exact_tokens) */
    int chunk_exact;     /* kernels whose numbers do not depend on chunk sizes (osp_session_set_chunk_exact) */
    osp_kv *kv;
    osp_scratch sc;
    int32_t *all_rows;   /* [rows] 0, 1, ... */
    const int32_t *rows; /* the batch of the running forward call: KV rows */
    int32_t nb;
    int32_t *head_ids;   /* the running call's ids out (osp_head_args.ids), NULL when none */
    const uint8_t *head_need; /* [nb] with head_ids: rows whose logits are wanted too */
    int head_defer;      /* the running call's head may defer its ids (osp_head_args.defer_ids) */
    int hidden;          /* the running call wants hidden states, not logits (arch.h's hidden) */
    const int32_t *lens; /* [nb] an encoder's call: the tokens each row attends to (the rest is padding); NULL: all */
    /* a chain of greedy steps (osp_forward_rows_chain) */
    int chain;           /* a step of it is in flight */
    int chain_ahead;     /* 1 (the default; OSP_CHAIN=0: 0): queue a step before its input ids reach the host */
    int32_t chain_nb;
    int32_t *chain_rows; /* [rows] its rows */
    int32_t *chain_ids;  /* [2][rows]: the in-flight step's ids (chain_buf) and the step's before it */
    int chain_buf;
};

/* The table the embedding's rows are read from where the matmul weights are (the head's, when tied: placed). */
static inline const osp_weight *osp_model_embed_rows(const osp_model *m) {
    return m->cfg.tie_embeddings && !m->cfg.no_head ? &m->head : &m->embed;
}

/* Shared helpers of the architectures' bind functions (model/bind.c). */
osp_status osp_bind_linear(osp_model *m, const char *path, int64_t rows, int64_t cols, osp_weight *w);
/* A float vector of n values, in the backend's memory; NULL (with *rc
 * untouched) when absent and not required. Stops at the first error. */
osp_vec osp_bind_vec(osp_model *m, const char *name, int64_t n, int required, osp_status *rc);
/* A scalar of the checkpoint (Gemma 4's layer_scalar) as f32, or def when absent. */
float osp_bind_scalar(osp_model *m, const char *name, float def, osp_status *rc);
/* The loader's visitor of a layout walk: binds each tensor where it says. */
osp_status osp_bind_visit(void *model, const osp_tdesc *d);

/* Fill inv_freq[head_dim/2] for a RoPE configuration (HF semantics, f32). */
void osp_rope_inv_freq(const osp_rope *r, int32_t head_dim, float *inv_freq);

#endif
