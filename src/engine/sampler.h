/* engine/sampler: turns one row's logits into a token, with mlx-lm's
 * semantics and order.
 *
 *   logits ─► processors: logit_bias → repetition → presence → frequency
 *          ─► log-softmax
 *          ─► filters:    top_p → min_p → XTC → top_k   (masked to -inf)
 *          ─► temperature 0: argmax; else a categorical draw over logprobs / T
 *
 * Penalties look at the last `*_context` tokens of the row's history
 * (prompt included). Each sampler owns its RNG, seeded per request, so the
 * same seed gives the same tokens. Scratch is allocated once at init
 * (vocab-sized): sampling allocates nothing. top_k and top_p use partial
 * selection, never a full sort of the vocabulary in the common case.
 */
#ifndef OSP_SAMPLER_H
#define OSP_SAMPLER_H

#include <stdint.h>
#include "core/core.h"
#include "osprey.h" /* osp_sampler_params, osp_bias */

/* mlx-lm's defaults: greedy, no filters, penalties off, context 20. */
osp_sampler_params osp_sampler_defaults(void);

typedef struct osp_sampler osp_sampler;

/* Validates the parameters (ranges as mlx-lm checks them). */
osp_status osp_sampler_new(const osp_sampler_params *p, int32_t vocab, osp_sampler **out);
void osp_sampler_free(osp_sampler *s);

/* Sample from logits[vocab] (modified in place) given the row's history
 * (prompt + generated so far). Returns the token id. If logprobs is not
 * NULL it receives log-softmax of the processed logits before filtering
 * (what OpenAI-style logprobs report). */
int32_t osp_sampler_sample(osp_sampler *s, float *logits, const int32_t *history, int64_t n_history,
                           float *logprobs);

/* 1 when osp_sampler_sample (without logprobs) returns exactly ops->argmax
 * of the logits as given: greedy, and no processor changes a logit (no
 * logit_bias, penalties off). Then a backend may take the token where the
 * logits are (osp_forward_rows_ids). */
int osp_sampler_is_argmax(const osp_sampler_params *p);

/* The distribution osp_sampler_sample draws from, into probs[vocab] (sum 1;
 * logits modified in place): processors, log-softmax (into logprobs when
 * not NULL), filters, softmax at the temperature; temperature 0 puts all
 * the mass on the argmax. For speculative decoding (rejection sampling
 * against it). Returns -1 with XTC, whose filter is itself random. */
int osp_sampler_dist(osp_sampler *s, float *logits, const int32_t *history, int64_t n_history, float *probs,
                     float *logprobs);
/* A draw from probs[vocab] (non-negative, sum > 0; normalized here). */
int32_t osp_sampler_draw(osp_sampler *s, const float *probs);

/* The k largest values of x[n] (no NaN): indices written to idx[k], sorted
 * by decreasing value (ties: lower index first). O(n + k log k). */
void osp_top_k_indices(const float *x, int64_t n, int32_t k, int32_t *idx, int32_t *scratch);

/* A uniform double in [0, 1) from the sampler's stream. */
double osp_sampler_uniform(osp_sampler *s);

#endif
