/* model/whisper: the Whisper encoder-decoder. Two layouts: Hugging Face
 * WhisperForConditionalGeneration (config.json with d_model etc.,
 * model.encoder.layers.N.self_attn.q_proj ...) and the MLX community's
 * (mlx_whisper: config.json with n_audio_state etc., encoder.blocks.N.attn.query
 * ..., conv weights [out, k, in], encoder positions computed, weights in
 * model.safetensors or weights.safetensors). Weights f32/f16/bf16, or MLX
 * affine-quantized linear layers and token embedding (config.json's
 * "quantization").
 *
 * The model (osp_whisper) is read-only after load and shared; a request owns
 * an osp_whisper_state: the encoder output of its current 30 s window, the
 * cross-attention K/V computed once from it per decoder layer, the decoder's
 * self-attention KV cache (max_target_positions positions), and scratch, all
 * allocated when the state is made (nothing is allocated per token).
 *
 * Math (reference precision, f32 activations): encoder = GELU(conv1 k3 p1) →
 * GELU(conv2 k3 s2 p1) → + embed_positions → pre-LN blocks (LayerNorm with
 * bias, eps 1e-5; self-attention, q/v/out with bias, k without; q scaled by
 * head_dim^-0.5; fc1 → exact erf GELU → fc2) → layer_norm. Decoder =
 * embed_tokens(ids) (· sqrt(d_model) when scale_embedding) + embed_positions
 * → blocks (causal self-attention over the cache, cross-attention over the
 * window, MLP) → layer_norm → logits tied to embed_tokens (or proj_out when
 * stored). Every step is an osp_backend operation (backend/backend.h), so
 * the model runs on the device it was loaded on (the CPU, or a GPU: every
 * Whisper golden passes with --device cuda at the CPU's bound, and AUTO
 * picks the GPU where there is one).
 */
#ifndef OSP_WHISPER_H
#define OSP_WHISPER_H

#include <stdint.h>
#include "core/core.h"

typedef struct osp_whisper_config {
    int32_t n_mels;          /* 80 or 128 */
    int32_t d_model;
    int32_t enc_layers, dec_layers;
    int32_t enc_heads, dec_heads;
    int32_t enc_ffn, dec_ffn;
    int32_t n_audio_ctx;     /* max_source_positions: 1500 (conv2 halves 3000 frames) */
    int32_t n_text_ctx;      /* max_target_positions: 448 */
    int32_t vocab;
    int32_t decoder_start;   /* <|startoftranscript|> */
    int32_t eos;             /* <|endoftext|> */
    int scale_embedding;
    int qbits, qgroup;       /* 0 when dense */
} osp_whisper_config;

typedef struct osp_whisper osp_whisper;
typedef struct osp_whisper_state osp_whisper_state;

/* Whisper's sinusoidal encoder positions, [len, ch] (f32 arithmetic, as
 * mlx_whisper computes them; Hugging Face checkpoints store them). */
void osp_whisper_sinusoids(int64_t len, int64_t ch, float *out);

/* 1 when the folder's config.json says model_type "whisper" (or its
 * architectures name WhisperForConditionalGeneration). */
int osp_whisper_detect(const char *dir);

/* Load a model folder (or a Hugging Face cache repo folder) on a device
 * (an osp_device; AUTO = the GPU when there is one, as for language models;
 * OSP_DEVICE=cpu|cuda overrides it). */
osp_status osp_whisper_load_on(const char *dir, int device, osp_whisper **out);
/* The same on AUTO. */
osp_status osp_whisper_load(const char *dir, osp_whisper **out);
/* The backend it runs on ("cpu (avx512+vnni+bf16)", "cuda (NVIDIA H200)"). */
const char *osp_whisper_device_name(const osp_whisper *m);
/* One trial of the device's read-bandwidth probe (GB/s; release != 0 frees its buffer), as osp_model_bw_trial:
 * OSP_ERR_UNSUPPORTED on a device without one (the CPU: the bench's triad instead). */
osp_status osp_whisper_bw_trial(const osp_whisper *m, int release, double *gbps);
void osp_whisper_free(osp_whisper *m);
const osp_whisper_config *osp_whisper_get_config(const osp_whisper *m);

osp_status osp_whisper_state_new(const osp_whisper *m, osp_whisper_state **out);
/* With n_rows decoder rows (beams), each its own self-attention cache, all
 * over the same window's cross K/V. The single-row calls below use row 0. */
osp_status osp_whisper_state_new_rows(const osp_whisper *m, int32_t n_rows, osp_whisper_state **out);
void osp_whisper_state_free(osp_whisper_state *s);

/* A state of n_slots windows (cross K/V of each), rows_per_slot decoder rows
 * over each (row r reads window r / rows_per_slot), whose encoder takes up
 * to enc_windows windows a call: the shared state of a transcription batch
 * (speech/batch.c). osp_whisper_state_new_rows is (1, n_rows, 1). */
osp_status osp_whisper_state_new_slots(const osp_whisper *m, int32_t n_slots, int32_t rows_per_slot,
                                       int32_t enc_windows, osp_whisper_state **out);

/* A run of a decoder step: n tokens appended to one row at its position
 * (teacher-forced when n > 1); logits [n, vocab] and/or last [vocab] (the
 * last token's), either NULL when not wanted. */
typedef struct osp_whisper_run {
    int32_t row, n;
    const int32_t *ids;
    float *logits, *last;
} osp_whisper_run;

/* What a view asks of its batch: a window to encode into its slot (mel set),
 * or a decoder step (runs, rows of the base), after the row copies
 * (dst, src, n tokens) queued since its last job. */
typedef struct osp_whisper_job {
    const float *mel;  /* [n_mels, 3000], or NULL: a step */
    int32_t slot;
    const int32_t *copies;
    int32_t n_copies;
    osp_whisper_run *runs;
    int32_t n_runs;
} osp_whisper_job;
/* Runs a view's job among others' (blocking); returns its status. */
typedef osp_status (*osp_whisper_submit_fn)(void *ctx, osp_whisper_job *job);

/* A view: a request's part of a slotted state (window `slot`, its first
 * n_rows rows), used like a state of its own by every call below; its
 * encodes and steps go to `submit`, which runs them on the base with
 * osp_whisper_encode_batch / osp_whisper_copy_rows / osp_whisper_step,
 * among other views'. Freed with osp_whisper_state_free (the base stays). */
osp_status osp_whisper_state_view(osp_whisper_state *base, int32_t slot, int32_t n_rows, osp_whisper_submit_fn submit,
                                  void *ctx, osp_whisper_state **out);

/* Encode nw windows (mels[i] into slot slots[i]) in one call; resets those
 * slots' rows. Each window's matmuls are the calls it gets alone. */
osp_status osp_whisper_encode_batch(osp_whisper_state *s, const float *const *mels, const int32_t *slots, int32_t nw);
/* One decoder step of runs on distinct rows, over their windows. Every
 * token is computed as it is alone (the backend's exact tokens), and a run's
 * cross-attention is one call per stretch of runs over one window: a
 * request's runs, given together, get exactly the numbers they get alone. */
osp_status osp_whisper_step(osp_whisper_state *s, const osp_whisper_run *runs, int32_t n_runs);
/* Row copies (dst, src, n tokens) of the base's rows. */
osp_status osp_whisper_copy_rows(osp_whisper_state *s, const int32_t *copies, int32_t n);

/* serial = 1: every operation runs on the calling thread instead of the
 * process thread pool (whose calls must come from one thread at a time),
 * for callers beside another user of the pool (the server's audio route). */
void osp_whisper_state_set_serial(osp_whisper_state *s, int serial);
/* fast = 1: the backend's production precision (on the GPU, the encoder's
 * and long chunks' matmuls on the tensor cores in bf16, and full attention
 * in bf16; on a CPU with a bf16 engine, AMX or AVX512-BF16, bf16 linears on
 * that engine); reference precision (f32, the goldens' bound) otherwise,
 * the default. Other CPUs compute both in reference precision. */
void osp_whisper_state_set_fast(osp_whisper_state *s, int fast);

/* Word timestamps: while set, each decoded token's cross-attention scores
 * (q·k scaled by head_dim^-0.5, before the softmax) for the n_heads (layer,
 * head) pairs go to out[k][position][n_audio_ctx] (positions < max_tok).
 * out NULL: capture off. heads must outlive the capture. */
osp_status osp_whisper_capture_qk(osp_whisper_state *s, const int32_t *heads, int32_t n_heads, float *out,
                                  int32_t max_tok);
/* The model's alignment heads as (layer, head) pairs: generation_config.json's
 * "alignment_heads", else every head of the last half of the decoder layers. */
const int32_t *osp_whisper_alignment_heads(const osp_whisper *m, int32_t *n);

/* Encode one window: mel [n_mels, 3000] → the encoder output and every
 * decoder layer's cross K/V. Resets the decoder (position 0). */
osp_status osp_whisper_encode(osp_whisper_state *s, const float *mel);
/* The current window's encoder output, [n_audio_ctx, d_model]. */
const float *osp_whisper_encoder_out(const osp_whisper_state *s);

/* Run n tokens at the decoder's current position (teacher-forced when
 * n > 1), appending them to the self-attention cache. logits: [n, vocab],
 * or NULL; last: when not NULL, receives the last token's logits [vocab]
 * (cheaper: only that row goes through the vocabulary projection). */
osp_status osp_whisper_decode(osp_whisper_state *s, const int32_t *ids, int32_t n, float *logits, float *last);
/* Tokens in the decoder's cache (row 0). */
int32_t osp_whisper_pos(const osp_whisper_state *s);
/* Keep only the first n cached tokens of row 0 (n <= pos): a new prompt. */
osp_status osp_whisper_truncate(osp_whisper_state *s, int32_t n);

/* Rows (beams): one token for each of nr distinct rows, each at its own
 * position; logits [nr, vocab]. */
osp_status osp_whisper_decode_rows(osp_whisper_state *s, const int32_t *rows, int32_t nr, const int32_t *ids,
                                   float *logits);
int32_t osp_whisper_rows(const osp_whisper_state *s);
int32_t osp_whisper_row_pos(const osp_whisper_state *s, int32_t row); /* -1: no such row */
osp_status osp_whisper_truncate_row(osp_whisper_state *s, int32_t row, int32_t n);
/* Row dst becomes a copy of row src (its cached tokens). */
osp_status osp_whisper_copy_row(osp_whisper_state *s, int32_t dst, int32_t src);

#endif
