/* model/embed: a model as an embedder (issue 40).
 *
 * An embedding is the model's final normed hidden states (transformers'
 * last_hidden_state, osp_forward_rows_hidden) pooled over a sequence's
 * positions, then L2-normalized. A checkpoint without lm_head (Qwen3-
 * Embedding: a bare Qwen3Model under Qwen3ForCausalLM's name) loads as an
 * embedder only; any model whose architecture gives hidden states embeds.
 *
 * How it pools: the folder's sentence-transformers files when there are
 * some: modules.json's modules in order (Transformer, Pooling, Dense...,
 * Normalize), 1_Pooling/config.json's mode (pooling_mode_lasttoken,
 * _mean_tokens, _cls_token; any other mode is refused), each Dense
 * module's config.json (in_features, out_features, bias, an Identity or
 * Tanh activation_function) and model.safetensors (linear.weight [out, in],
 * linear.bias), applied in order to the pooled vector on the host, in
 * double (EmbeddingGemma's 2_Dense and 3_Dense). Without modules.json: the last token,
 * normalized (Qwen3-Embedding's documented use; its tokenizer's post-
 * processor appends <|endoftext|>, whose state is the one taken).
 *
 * Matryoshka (`dimensions`): the first d values, renormalized. Allowed when
 * config.json says so (vLLM's keys: is_matryoshka, or matryoshka_dimensions,
 * which then lists the only widths allowed) or, when it says nothing, when
 * the architecture's table does (arch.h's matryoshka: Qwen3, whose embedders
 * are trained for it); otherwise a width other than the full one is refused.
 *
 * Batching (osp_embed_run): up to the session's rows at once, each group
 * padded on the right to its longest member. A causal model's position
 * never sees the padding after it, and an encoder (model/bert.c) or a
 * bidirectional decoder body (EmbeddingGemma) attends to each row's own
 * length (osp_forward_rows_hidden_lens): a row's states are its own (within
 * the matmuls' rounding of a larger batch). Rows are reset after. Such a
 * model's session holds a whole input in one step.
 */
#ifndef OSP_EMBED_H
#define OSP_EMBED_H

#include <stdint.h>
#include "core/core.h"
#include "osprey.h"

typedef enum osp_pooling { OSP_POOLING_LAST, OSP_POOLING_MEAN, OSP_POOLING_CLS } osp_pooling;

#define OSP_EMBED_MAX_MRL 32
#define OSP_EMBED_MAX_DENSE 4

/* a sentence-transformers Dense module: y = act(W x + b) */
typedef struct osp_embed_dense {
    int32_t in, out;
    float *w;  /* [out, in] */
    float *b;  /* [out], or NULL */
    int tanh;  /* activation Tanh (else Identity) */
} osp_embed_dense;

typedef struct osp_embed_config {
    osp_pooling pooling;
    int normalize;                      /* L2-normalize the pooled vector */
    int32_t hidden;                     /* the pooled vector's width (the model's hidden size; osp_embed_run reads
                                           the model's own) */
    int32_t dims;                       /* the embedding's full width (the last Dense's out, else hidden) */
    int matryoshka;                     /* fewer dimensions may be asked */
    int32_t mrl_dims[OSP_EMBED_MAX_MRL];/* config's matryoshka_dimensions: the only widths allowed (none: 1..dims) */
    int n_mrl_dims;
    osp_embed_dense dense[OSP_EMBED_MAX_DENSE]; /* after pooling, in order */
    int n_dense;
    char source[64];                    /* where the pooling came from, for the log: "1_Pooling/config.json", "default" */
} osp_embed_config;

/* Read the folder's sentence-transformers files (see above). OSP_ERR_UNSUPPORTED names what is not run. Free it
 * with osp_embed_config_free (its Dense weights). */
osp_status osp_embed_config_load(const osp_model *m, osp_embed_config *c);
void osp_embed_config_free(osp_embed_config *c);

/* Is a width of d dimensions allowed? OSP_OK, or OSP_ERR_INVALID with a message a client can act on. */
osp_status osp_embed_check_dims(const osp_embed_config *c, int32_t d);

const char *osp_pooling_name(osp_pooling p);

/* Pool one sequence's states h [n, H] (every position, or for LAST/CLS just the one) into out [H]. */
void osp_embed_pool(osp_pooling p, const float *h, int32_t n, int64_t H, float *out);

/* The finished embedding of width d from a pooled vector v [dims] (in place, v's first d): normalized when the
 * config normalizes or d < dims (Matryoshka: truncate, then renormalize). Sums in double. */
void osp_embed_finish(const osp_embed_config *c, float *v, int32_t d);

/* A session for embedding: rows sequences at once, each of up to ctx tokens (the model's context at most), a
 * forward step of up to 512 tokens in all (a prefill chunk's: more rows than fit whole go in chunks). */
osp_status osp_embed_session_new(const osp_model *m, int32_t rows, int32_t ctx, osp_session **out);

/* Embed n sequences (ids[i] of len[i] >= 1 tokens, each at most the session's context) on the session's rows,
 * as many at a time as it has; out [n, dims] gets the pooled vectors, through the Dense modules, before
 * osp_embed_finish. The rows are reset after each group. */
osp_status osp_embed_run(osp_session *s, const osp_embed_config *c, const int32_t *const *ids, const int32_t *len,
                         int32_t n, float *out);

#endif
