/* model/config: config.json → osp_config, the one description of a model's
 * shape that the forward pass reads. Anything we cannot run exactly
 * (unknown architecture, rope type, activation) is refused here. */
#ifndef OSP_CONFIG_H
#define OSP_CONFIG_H

#include <jansson.h>
#include <stdint.h>
#include "core/core.h"
#include "tensor/tensor.h"

struct osp_arch_ops;
typedef enum osp_rope_type {
    OSP_ROPE_DEFAULT,
    OSP_ROPE_LINEAR,
    OSP_ROPE_LLAMA3,
    OSP_ROPE_PROPORTIONAL /* Gemma 4 full layers: first partial·D/2 pairs rotate, exponent over full D */
} osp_rope_type;

typedef struct osp_rope {
    osp_rope_type type;
    float theta;
    float factor;            /* linear and llama3 */
    double low_freq_factor;  /* llama3 */
    double high_freq_factor; /* llama3 */
    int32_t orig_max_pos;    /* llama3 original_max_position_embeddings */
    double partial;          /* fraction of head_dim rotated (1 = all) */
} osp_rope;

#define OSP_MAX_EOS 16
#define OSP_CONFIG_MAX_LAYERS 4096 /* num_hidden_layers at most (a config asking more is an error) */

typedef struct osp_config {
    char architecture[64];
    char model_type[32];
    const struct osp_arch_ops *arch; /* model/arch.h */
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, intermediate, vocab, max_pos;
    float eps;
    osp_act act;
    int tie_embeddings;
    int no_head;          /* the checkpoint has no lm_head (an embedder saved from the bare model): hidden
                             states only, no logits (model/embed.h) */
    int qkv_bias, o_bias, mlp_bias;
    int qk_norm;          /* per-head RMSNorm on q and k before RoPE */
    int norm_add_one;     /* Gemma: y = x̂ · (1 + w) */
    int sandwich_norm;    /* Gemma: norms after attention and MLP too */
    float attn_scale;     /* multiplies q·k */
    int embed_scaled;     /* multiply embeddings by sqrt(hidden), in f32 */
    float final_softcap;  /* 0 = none */
    float attn_softcap;   /* 0 = none */
    int32_t sliding_window; /* 0 = none */
    int bidirectional;      /* no causal mask (use_bidirectional_attention: EmbeddingGemma); the whole input in
                               one chunk, hidden states only */
    int32_t bidir_radius;   /* bidirectional sliding layers: |q - k| < radius (transformers' sliding_window/2 + 1) */
    uint8_t *layer_sliding; /* [n_layers] 1 = sliding-window layer */
    osp_rope rope_full, rope_sliding;
    int32_t bos_id;       /* -1 if none */
    int32_t eos_ids[OSP_MAX_EOS];
    int n_eos;
    int32_t q_bits, q_group; /* default MLX quantization, 0 if none */
    json_t *quant;           /* the "quantization" object (per-module overrides) */

    /* Per layer (every architecture; uniform except Gemma 4). */
    int32_t *layer_head_dim;   /* [n_layers] */
    int32_t *layer_kv_heads;   /* [n_layers] */
    int32_t *layer_kv_donor;   /* [n_layers] layer whose KV a layer reuses; -1 = its own */

    /* Gemma 4 */
    int32_t ple_dim;           /* hidden_size_per_layer_input, 0 = no per-layer embeddings */
    int32_t ple_vocab;         /* vocab_size_per_layer_input */
    int k_eq_v;                /* full layers use k_proj's output as V (no v_proj) */
    int v_norm;                /* weightless RMSNorm on V */
    int has_layer_scalar;
    int double_wide;           /* use_double_wide_mlp: KV-shared layers have twice the MLP width */
    int moe;                   /* enable_moe_block */
    int32_t n_experts, top_k_experts, moe_intermediate;

    /* encoders (model/bert.c) */
    int32_t n_pos_embed;       /* max_position_embeddings: rows of the learned position table */
    int32_t type_vocab;        /* type_vocab_size: rows of the token-type table (type 0 is used) */
    int32_t pad_id;            /* pad_token_id; XLM-R counts positions from it (padding_idx + 1 + t) */
    int pos_from_pad;          /* XLM-R's position ids: transformers' create_position_ids_from_input_ids */
    int32_t n_labels;          /* a sequence-classification head's outputs (0: none) */
} osp_config;

/* Parse config.json text (the object at the root, or its text_config). */
osp_status osp_config_parse(json_t *root, const char *path, osp_config *cfg);
osp_status osp_config_load(const char *path, osp_config *cfg);
void osp_config_free(osp_config *cfg);

#endif
