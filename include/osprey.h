/* osprey: local inference engine. Public C API.
 *
 * A loaded model (osp_model) is immutable and may be shared by threads.
 * Per-sequence state (osp_session: KV cache, positions) belongs to one
 * caller at a time. Every function that can fail returns an osp_status;
 * osp_last_error() gives the message (thread-local).
 */
#ifndef OSPREY_H
#define OSPREY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum osp_status {
    OSP_OK = 0,
    OSP_ERR_IO,          /* file missing, unreadable, truncated */
    OSP_ERR_FORMAT,      /* malformed file or header that lies */
    OSP_ERR_UNSUPPORTED, /* dtype, architecture, rope type... we refuse */
    OSP_ERR_INVALID,     /* bad argument from the caller */
    OSP_ERR_NOMEM,
    OSP_ERR_RANGE,       /* context exceeded, token id out of range */
    OSP_ERR_INTERNAL
} osp_status;

/* Message describing the last error on this thread ("" if none). */
const char *osp_last_error(void);
const char *osp_status_name(osp_status s);

typedef struct osp_model osp_model;
typedef struct osp_session osp_session;

typedef struct osp_model_info {
    const char *architecture;   /* e.g. "LlamaForCausalLM" */
    const char *model_type;     /* config model_type */
    int32_t n_layers, hidden, n_heads, n_kv_heads, head_dim, intermediate;
    int32_t vocab;
    int32_t max_ctx;            /* max_position_embeddings */
    int64_t n_params;           /* logical parameter count */
    int64_t weight_bytes;       /* bytes of the tensors used by the forward */
    int64_t decode_bytes;       /* weight bytes streamed per decode step */
    int64_t kv_bytes_per_token; /* f32 KV cache of full-attention layers, one row, per position */
    int64_t kv_bytes_sliding;   /* f32 KV cache of sliding layers, one row, fixed (window slots) */
    int32_t sliding_window;     /* 0 when no sliding layers */
    int32_t n_sliding_layers;
    int32_t n_kv_shared_layers; /* layers reusing another layer's KV (no cache of their own) */
    int32_t quant_bits;         /* 0 when dense */
    int32_t quant_group;
    const char *dtype;          /* dtype of dense weights, e.g. "BF16" */
    const char *dir;            /* the resolved model folder */
    const char *device;         /* where it runs, e.g. "cpu (avx512+vnni+bf16)", "cuda (NVIDIA H200)" */
    const int32_t *eos_ids;     /* config.json eos_token_id (a number or a list) */
    int32_t n_eos;
    int32_t bos_id;             /* -1 if none */
    int32_t has_head;           /* 0: no lm_head (an embedding model): hidden states only, no logits */
} osp_model_info;

/* Where a model runs (its backend, backend/backend.h). */
typedef enum osp_device { OSP_DEVICE_AUTO = 0, OSP_DEVICE_CPU, OSP_DEVICE_CUDA } osp_device;

typedef struct osp_model_params {
    osp_device device; /* AUTO: the best device present (the CPU when there is no other) */
    int place;         /* 1: the backend places the matmul weights at load (copied to huge pages and
                          repacked on the CPU; uploaded on a GPU); 0: bind only, e.g. to inspect (the
                          CPU then reads them from the file mapping) */
} osp_model_params;

/* Load a model folder (config.json + safetensors, sharded or not) or a
 * Hugging Face cache repo folder (models--ORG--NAME), on params->device
 * (NULL = defaults: AUTO, placed). */
osp_status osp_model_load_params(const char *path, const osp_model_params *params, osp_model **out);
/* osp_model_load_params with the defaults. */
osp_status osp_model_load(const char *path, osp_model **out);
void osp_model_free(osp_model *m);
const osp_model_info *osp_model_get_info(const osp_model *m);
/* One trial of the read bandwidth of the device the model runs on, in GB/s
 * (release = 1 frees the probe's memory, *gbps untouched): for devices
 * whose bandwidth the host cannot measure itself (a GPU).
 * OSP_ERR_UNSUPPORTED on the CPU. */
osp_status osp_model_bw_trial(const osp_model *m, int release, double *gbps);

/* The model's artifact identity: SHA-256 (hex) over the files that
 * determine its numbers (weights, config, tokenizer, chat template; see
 * model/identity.c). Each file's hash is memoised in memo_dir (NULL: no
 * memo) by path, size, mtime and inode, so an unchanged model is not
 * read again. osp_identity_dir does the same for a folder. */
osp_status osp_model_identity(const osp_model *m, const char *memo_dir, char out[65]);
osp_status osp_identity_dir(const char *dir, const char *memo_dir, char out[65]);

/* The version of the engine's numerics: raised whenever a kernel's results
 * change, so that stored KV (the prefix cache's files) computed by an older
 * engine is never used by a newer one. */
#define OSP_NUMERICS_VERSION 3 /* 2: bf16 weights on AVX512-BF16 (the CPU's DOT engine); 3: 4-bit prefill chunks on AMX */

/* Number of worker threads used by kernels (0 = all cores). Global. */
osp_status osp_set_threads(int n_threads);

/* A session holds B rows of KV cache, each with up to max_ctx positions. */
osp_status osp_session_new(const osp_model *m, int32_t n_rows, int32_t max_ctx,
                           osp_session **out);
void osp_session_free(osp_session *s);
/* Precision of the session's forward passes. 0 (the default): reference
 * precision, f32 activations everywhere (what `osprey logits` checks
 * against the goldens). 1: production, activations quantized to int8 per
 * block of 32 for matmuls with MLX 4/8-bit weights during decode (AVX-512
 * VNNI); measured against the goldens by KL (README). */
void osp_session_set_fast(osp_session *s, int fast);

/* Everything a session can be created with (zero = default). */
typedef struct osp_session_opts {
    int32_t n_rows;               /* rows (sequences), >= 1 */
    int32_t max_ctx;              /* positions per row; <= 0 or too large: the model's */
    int32_t kv_bits;              /* 0 = f32 KV cache; 16 = bf16; 4 or 8 = MLX affine-quantized K/V */
    int32_t kv_group;             /* quantization group along head_dim: 32, 64 (0 = 64) or 128 */
    const int32_t *layer_kv_bits; /* optional [n_layers]: bits per layer (0 = f32, 16 = bf16), overrides kv_bits */
    const int32_t *layer_kv_group;/* optional [n_layers]: groups per layer (0 = kv_group) */
    int32_t spare;                /* sliding-window ring slots beyond the window: the most tokens a
                                     speculative round may roll back once the ring has wrapped */
    int64_t kv_budget;            /* bytes of KV the session may allocate; 0 = unlimited */
    int32_t max_tokens;           /* tokens one forward step runs, all rows together (longer
                                     calls are chunked); 0 = max(rows, min(ctx, 512)) */
} osp_session_opts;

osp_status osp_session_new_opts(const osp_model *m, const osp_session_opts *o, osp_session **out);
/* Per-layer KV quantization from the model folder's kv_config.json (OptiQ:
 * a list of {layer_idx, bits, group_size}) into bits[n_layers] and
 * group[n_layers] (unlisted layers: 0 = full precision). *found = 0 and
 * nothing written when the file is absent. */
osp_status osp_model_kv_config(const osp_model *m, int32_t *bits, int32_t *group, int *found);

/* Forget everything in one row (position back to 0) and free its KV. */
void osp_session_reset_row(osp_session *s, int32_t row);
int32_t osp_session_row_pos(const osp_session *s, int32_t row);
int32_t osp_session_rows(const osp_session *s);
int32_t osp_session_max_ctx(const osp_session *s);
/* Bytes of KV cache the session has allocated now (rows grow on demand, in
 * steps of 256 positions for full-attention layers). */
size_t osp_session_kv_bytes(const osp_session *s);
/* Bytes one row holding n_pos positions takes (for admission control). */
int64_t osp_session_kv_row_bytes(const osp_session *s, int32_t n_pos);

/* Run T new tokens for each of the session's B rows: ids is [B, T]
 * (row-major). Each row continues at its own position. logits receives
 * [B, T, vocab] when all_logits != 0, else [B, vocab] (last position). */
osp_status osp_forward(osp_session *s, const int32_t *ids, int32_t n_tok,
                       int all_logits, float *logits);
/* The same for a subset of rows: batch row i is session row rows[i]
 * (distinct); ids is [nb, T]; logits [nb, T, vocab] or [nb, vocab]. The
 * other rows are untouched. In production precision a decode step (T = 1)
 * computes every row exactly as it would be computed alone, so a row's
 * output never depends on the other rows of the batch. */
osp_status osp_forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids,
                            int32_t n_tok, int all_logits, float *logits);
/* osp_forward_rows with the greedy tokens taken where the logits are (ids
 * out): next[b] = the argmax of row b's last-position logits, exactly the
 * sampler's greedy choice on them (the first largest, never a NaN; 0 when
 * all are NaN). logits [nb, vocab] receives the rows with need_logits[b] != 0
 * (need_logits NULL: none); the other rows' blocks are scratch, left
 * unspecified. On a GPU only the ids and the needed rows are copied back.
 * next may be ids (a decode step feeding its own tokens back). */
osp_status osp_forward_rows_ids(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids,
                                int32_t n_tok, const uint8_t *need_logits, float *logits, int32_t *next);

/* The final normed hidden states (the reference's last_hidden_state) instead of logits: no head runs, so a model
 * without lm_head (osp_model_info.has_head 0, an embedder) can run. pos[nb]: the position (0..n_tok-1 of this
 * call) wanted of each row, out [nb, hidden]; pos NULL: every position, out [nb, n_tok, hidden]. */
osp_status osp_forward_rows_hidden(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids,
                                   int32_t n_tok, const int32_t *pos, float *out);
/* The same, row b's input being its first lens[b] tokens (1..n_tok; the rest padding, as a batch padded on the
 * right): an encoder (bidirectional attention) attends to those only; a causal model's positions never see the
 * padding after them, so lens changes nothing there. lens NULL: every row has n_tok. */
osp_status osp_forward_rows_hidden_lens(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids,
                                        int32_t n_tok, const int32_t *lens, const int32_t *pos, float *out);

/* Greedy decoding as a chain of steps, so that a GPU need not wait for the
 * host between them. With ids [nb] (a chain begins): the step of the rows
 * (one token each) fed with ids is queued; prev is not used. With ids NULL
 * (the chain goes on, the same rows): prev[nb] = the greedy tokens of the
 * step fed with the last ids (given or given back), and the step fed with
 * prev is queued, on a GPU before prev reached the host. The tokens are
 * osp_forward_rows_ids's, call for call. logits: [nb, vocab] scratch.
 * osp_forward_chain_end ends a chain: keep 1 finishes the step fed with the
 * last ids given back (last[nb] = its tokens, or NULL); keep 0 undoes it,
 * as if it never ran (the rows stay at the position after those ids).
 * While a chain is in flight the session takes no other forward call, and
 * its rows no other operation. */
osp_status osp_forward_rows_chain(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, float *logits,
                                  int32_t *prev);
osp_status osp_forward_chain_end(osp_session *s, int keep, float *logits, int32_t *last);
/* 1 when the step fed with the last ids a chain gave back is queued (ending with keep 1 only waits for it); 0
 * when the chain waits (lazy: the rows could not go back one, or had no room) or none is in flight. */
int osp_forward_chain_queued(const osp_session *s);
/* 1 when a chain can gain anything here (the device queues steps: a GPU); 0 on the CPU, where a chain computes
 * what osp_forward_rows_ids does, one step later. */
int osp_session_chain_queues(const osp_session *s);

/* Row operations (KV cache). Trim forgets a row's last n positions.
 * A speculative round: round_begin records every row's position,
 * rollback(keep) keeps keep[b] of the tokens row b added since (one entry
 * per row), commit keeps all. Sliding-window layers can go back only as
 * far as their spare ring slots allow (OSP_ERR_RANGE otherwise). */
osp_status osp_session_trim_row(osp_session *s, int32_t row, int32_t n);
void osp_session_round_begin(osp_session *s);
osp_status osp_session_rollback(osp_session *s, const int32_t *keep);
void osp_session_commit(osp_session *s);
/* 1 when a row's numbers do not depend on how its tokens are chunked (one
 * at a time, or any prefill chunks): true of the CPU's production path for
 * 4-bit weights (int8 activations, exact integer sums) and for bf16 weights
 * on AMX tiles, with an f32 KV cache (a chunk attends its own positions in
 * f32, later queries read them as stored); elsewhere matvec, small-batch and
 * GEMM kernels sum in different orders. */
int osp_session_chunk_invariant(const osp_session *s);
/* Tokens one chunk of all rows can hold at about the cost of a one-token step
 * on this session's model, device and precision (the default budget of a
 * speculative verification pass). */
int32_t osp_session_pass_tokens(const osp_session *s);
/* on: every token of later forward calls is computed exactly as a one-token
 * decode step computes it (speculative verification). -1 when the
 * session's device cannot promise that. */
int osp_session_set_exact_tokens(osp_session *s, int on);
/* on: where the device has a faster kernel whose numbers depend on a chunk's token count (the CPU's 4-bit
 * prefill chunks on AMX tiles), use the one that does not, so that osp_session_chunk_invariant can hold (a
 * prefix cache that reuses any prefix, replies included). Off by default. */
void osp_session_set_chunk_exact(osp_session *s, int on);
const osp_model *osp_session_model(const osp_session *s);
/* The session's KV cache (kv/kv.h), for the prefix cache (kv/prefix.h). */
struct osp_kv *osp_session_kv(osp_session *s);
/* A new one-row session holding a copy of one row. */
osp_status osp_session_extract_row(const osp_session *s, int32_t row, osp_session **out);
/* A new session whose rows are copies of all rows of parts[0], parts[1], ... */
osp_status osp_session_merge(const osp_session *const *parts, int32_t n, osp_session **out);
/* Keep rows keep[0..n) in that order (they become rows 0..n-1); free the rest. */
osp_status osp_session_filter(osp_session *s, const int32_t *keep, int32_t n);

/* ---- text ---- */

typedef struct osp_tokenizer osp_tokenizer;
/* A folder with tokenizer.json (+ tokenizer_config.json), or the file. */
osp_status osp_tokenizer_load(const char *path, osp_tokenizer **out);
void osp_tokenizer_free(osp_tokenizer *t);

/* ---- generation ---- */

typedef struct osp_bias {
    int32_t token;
    float bias;
} osp_bias;

/* Sampling, with mlx-lm's semantics and order: logit_bias -> repetition ->
 * presence -> frequency penalties (each over the last *_context tokens,
 * prompt included); then top_p -> min_p -> XTC -> top_k; then temperature
 * (0 = greedy argmax) and a categorical draw from a per-request RNG. */
typedef struct osp_sampler_params {
    float temperature;          /* 0 = greedy */
    float top_p;                /* applied when 0 < top_p < 1 */
    float min_p;                /* applied when > 0 */
    int32_t min_tokens_to_keep; /* for min_p, >= 1 */
    int32_t top_k;              /* applied when 0 < top_k < vocab */
    float xtc_probability;      /* applied when > 0 */
    float xtc_threshold;        /* in [0, 0.5] */
    float repetition_penalty;   /* applied when != 0 and != 1 */
    int32_t repetition_context;
    float presence_penalty;     /* applied when != 0 */
    int32_t presence_context;
    float frequency_penalty;    /* applied when != 0 */
    int32_t frequency_context;
    uint64_t seed;
    const osp_bias *logit_bias; /* copied at init */
    int32_t n_logit_bias;
    const int32_t *xtc_exempt;  /* tokens XTC never removes (EOS, newline); copied */
    int32_t n_xtc_exempt;
} osp_sampler_params;

/* Per generated token (eos excluded), before its text: the token's
 * log-probability under the processed, unfiltered distribution and the k
 * most likely tokens (k = osp_gen_params.top_logprobs). */
typedef void (*osp_logprob_cb)(void *user, int32_t token, float logprob, const int32_t *top_ids,
                               const float *top_logprobs, int32_t k);

typedef struct osp_gen_params {
    osp_sampler_params sampler;
    int32_t max_tokens;          /* <= 0: until a stop or the end of the context */
    const char *const *stop;     /* stop strings: never part of the output */
    int32_t n_stop;
    const int32_t *eos;          /* stop tokens: end the stream, not emitted */
    int32_t n_eos;
    int skip_special;            /* leave special tokens out of the text */
    osp_logprob_cb on_logprob;   /* NULL = no logprobs */
    void *logprob_user;
    int32_t top_logprobs;        /* 0..20 alternatives reported to on_logprob */
    struct osp_grammar_matcher *grammar; /* structured output (grammar/grammar.h): each token is sampled among those
                                  it allows, then committed to it; the eos tokens only where it accepts. NULL = none.
                                  The caller owns it; such a stream takes no ids and does not speculate */
    const char *grammar_trigger; /* with a grammar: it holds from the byte after this text (when the reply writes
                                  it) until the grammar is complete, then waits for the text again (tool calls
                                  among free text); NULL: from the first token to the end */
} osp_gen_params;

typedef enum osp_finish { OSP_FINISH_STOP, OSP_FINISH_LENGTH, OSP_FINISH_CANCELLED } osp_finish;

typedef struct osp_gen_stats {
    int32_t n_prompt, n_generated;
    int32_t n_cached;            /* prompt tokens whose KV came from the prefix cache (not computed) */
    int32_t n_draft, n_draft_accepted; /* speculative decoding: tokens drafted, and accepted */
    double ttft_s;               /* start to the first token */
    double prefill_tok_s, decode_tok_s;
    double forward_s;            /* time in the decode forward passes */
    double loop_s;               /* time in sampling, detokenizing, stop strings and callbacks */
    osp_finish finish;
} osp_gen_stats;

/* Called once per generated token with the text that became final (may be
 * empty: incomplete UTF-8 or a possible stop string is held back), and once
 * more at the end with token -1 and the rest. Return non-zero to cancel. */
typedef int (*osp_gen_cb)(void *user, int32_t token, const char *text, size_t len);

/* Defaults: mlx-lm's sampler defaults (greedy), overridden by the model's
 * generation_config.json (temperature, top_p, top_k, min_p,
 * repetition_penalty, do_sample=false -> greedy); eos = config.json ∪
 * generation_config.json ∪ the tokenizer's eos. eos_buf holds up to 32 ids. */
osp_status osp_gen_defaults(const osp_model *m, const osp_tokenizer *tok, osp_gen_params *p, int32_t *eos_buf);

/* Generate on row 0 of a one-row session, continuing from its position:
 * prefill the prompt, then sample until an eos token, a stop string,
 * max_tokens or the context limit. */
osp_status osp_generate(osp_session *s, const osp_tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                        const osp_gen_params *p, osp_gen_cb cb, void *user, osp_gen_stats *stats);

/* One generation as a state machine, apart from any session, so that many
 * can share a batch: the caller runs the forward passes (prompt, then each
 * token osp_stream_next hands back, in any row of any session) and gives
 * every set of next-token logits to osp_stream_next. p's arrays (stop
 * strings, eos, logit_bias) must outlive the stream; prompt is copied. */
typedef struct osp_stream osp_stream;
osp_status osp_stream_new(const osp_model *m, const osp_tokenizer *tok, const int32_t *prompt, int32_t n_prompt,
                          int32_t max_ctx, const osp_gen_params *p, osp_gen_cb cb, void *user, osp_stream **out);
/* Sample from logits (modified in place) given that the row now holds
 * row_pos positions; report the token (callbacks) and decide. Returns 1
 * with *next = the token to feed next, or 0 when the generation is over
 * (eos, stop string, max_tokens, context, a callback's cancel, or an error
 * in *rc); the stats then say why. */
int osp_stream_next(osp_stream *g, float *logits, int32_t row_pos, int32_t *next, osp_status *rc);
/* 1 when the stream's choice is exactly the argmax of the logits as they
 * come (greedy; no logit_bias, penalties or logprobs): the caller may then
 * take the token with osp_forward_rows_ids and hand it over instead. */
int osp_stream_takes_id(const osp_stream *g);
/* osp_stream_next for such a stream, with the token its logits' argmax is
 * (osp_forward_rows_ids): the same report, decision and stats. */
int osp_stream_next_id(osp_stream *g, int32_t token, int32_t row_pos, int32_t *next, osp_status *rc);
/* With a grammar: its mask for the next token, computed now rather than in
 * osp_stream_next (which then only applies it), so that a caller can compute
 * it on another thread during the forward pass (the stream must not be used
 * meanwhile; masks of grammars sharing a vocab one thread at a time). */
void osp_stream_mask_ahead(osp_stream *g);
/* End it now (finish = cancelled); nothing more is reported. */
void osp_stream_cancel(osp_stream *g);
/* Speculative verification. logits [K+1, vocab] (modified) were computed
 * for the chunk [the token osp_stream_next last handed out, draft[0..K)]:
 * position i predicts what follows the chunk's token i. The stream takes
 * the drafts its sampler agrees with and one token of its own, emitting
 * each exactly as osp_stream_next would: greedy, the tokens plain decoding
 * picks (given the same logits); sampling, by rejection (accept a draft
 * with min(1, p/q), else draw from the normalized max(0, p - q)), so the
 * tokens follow the target's distribution. q: the draft's distributions
 * [K, vocab], NULL when the drafts were certain (n-gram lookup). row_pos0:
 * the row's positions before the chunk. *n_keep: how many of the chunk's
 * positions stay in the KV cache (the rest must be rolled back). Returns 1
 * with *next when the stream goes on. */
int osp_stream_verify(osp_stream *g, float *logits, const int32_t *draft, int32_t K, const float *q, int32_t row_pos0,
                      int32_t *n_keep, int32_t *next, osp_status *rc);
int osp_stream_greedy(const osp_stream *g);
const osp_gen_params *osp_stream_params(const osp_stream *g);
/* 0 when its tokens cannot be drafted and verified: XTC sampling (no rejection rule), or a grammar. */
int osp_stream_can_speculate(const osp_stream *g);
/* The first n prompt tokens were not computed (their KV came from a cache):
 * stats count them as cached and the prefill speed over the rest. */
void osp_stream_set_cached(osp_stream *g, int32_t n);
/* The stream's tokens so far: the prompt, then every sampled token. */
const int32_t *osp_stream_tokens(const osp_stream *g, int32_t *n);
const osp_gen_stats *osp_stream_stats(const osp_stream *g);
void osp_stream_free(osp_stream *g);

#ifdef __cplusplus
}
#endif
#endif
