/* model/arch: an architecture is a table. Each file under model/ that
 * implements one (llama.c: Llama, Qwen2, Qwen3, Gemma 3; gemma4.c: Gemma 4;
 * bert.c: the BERT and XLM-RoBERTa encoders)
 * owns its config keys, its weights' names and shapes, and its forward body;
 * the shared code (config.c, loader.c, session.c, forward.c) reads the table
 * and never names an architecture. A new architecture is a new file with a
 * table, listed in arch.c. */
#ifndef OSP_ARCH_H
#define OSP_ARCH_H

#include <jansson.h>
#include <stdint.h>
#include "core/core.h"
#include "layout.h"

struct osp_config;
struct osp_model;
struct osp_session;

typedef struct osp_arch_ops {
    const char *name;              /* for messages: "llama", "gemma4" */
    const char *const *hf_names;   /* config "architectures" values it serves, NULL-terminated */
    const char *const *model_types;/* the matching model_type values (used when "architectures" is absent) */

    /* config.json: defaults the common parser applies */
    int tie_default;               /* tie_word_embeddings when the config says nothing */
    const char *act_default;       /* the activation when the config names none */
    int sliding_pattern;           /* no layer_types: every sliding_window_pattern-th layer is full (else none slide
                                      unless use_sliding_window) */
    int last_layer_full;           /* the last layer is always full attention */
    int local_rope_base;           /* no per-type rope parameters: sliding layers use rope_local_base_freq */
    /* Its own keys, after the common ones (flags, scales, per-layer geometry). */
    osp_status (*configure)(const json_t *root, const json_t *tc, const char *path, struct osp_config *c);

    /* Every tensor of a checkpoint, in order (model/layout.h); with a model,
     * each description says where the loader binds it (m->layers exists). */
    osp_status (*layout)(const struct osp_config *c, struct osp_model *m, const osp_tnames *names, osp_tvisit visit,
                         void *ctx);

    /* Its own activations for chunks of up to max_tok tokens (NULL hook:
     * none); *inter and *cols raise the widths of the shared scratch (the
     * gated-MLP buffers, the widest matmul input) when it needs more. */
    osp_status (*scratch_new)(const struct osp_model *m, int32_t max_tok, void **extra, int64_t *inter, int64_t *cols);
    void (*scratch_free)(const struct osp_model *m, void *extra);

    /* One chunk of s's current batch: ids [nb, T]; logits as osp_forward
     * writes them, or NULL for an intermediate prefill chunk. Advances the
     * rows' positions by T. With prev_ids, ids may be NULL in a one-token
     * step: the greedy tokens the previous step's head took, where it took
     * them (the backend's embed_prev; osp_forward_rows_chain). */
    osp_status (*forward_chunk)(struct osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                int64_t ld_rows);
    int prev_ids;
    /* forward_chunk honours s->hidden: with logits NULL it leaves the chunk's final normed hidden states (the
     * reference's last_hidden_state) in the scratch's xn [B*T, hidden] (osp_forward_rows_hidden) */
    int hidden;
    /* its embedders are trained for Matryoshka widths (model/embed.h) unless config.json says otherwise */
    int matryoshka;
    /* An encoder (model/bert.c): attention sees a row's whole input, so a call runs each row's tokens as one chunk
     * (as many rows a chunk as fit the session's max_tok; a longer input is refused), reads and writes no KV
     * cache, and a row attends only to its first lens[b] tokens (osp_forward_rows_hidden_lens: the rest is
     * padding). Hidden states only. */
    int encoder;
    /* configure reads the activation itself (the common parser does not look at hidden_act) */
    int own_act;
    /* The weight-name prefixes its checkpoints use, tried in order, and the tensor whose presence picks one
     * (NULL: the loader's decoder prefixes, "model." ..., picked by embed_tokens.weight). */
    const char *const *prefixes;
    const char *probe;
} osp_arch_ops;

/* The table serving an "architectures" name (or, when that is NULL, a
 * model_type); *canonical = the HF name it is known by. NULL if none. */
const osp_arch_ops *osp_arch_find(const char *hf_name, const char *model_type, const char **canonical);

#endif
