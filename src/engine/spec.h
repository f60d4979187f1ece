/* engine/spec: speculative decoding over the rows of a session.
 *
 * Each round, every row that speculates gets up to K drafted tokens, from a
 * draft model (a second, smaller model sharing the tokenizer, with its own
 * session of as many rows) or from n-gram lookup (the continuation of the
 * latest earlier occurrence of the row's last tokens, in prompt + output).
 * The target then runs one chunk per row, [the row's next token, its
 * drafts] (rows with fewer drafts padded: T = 1 + the most drafts, the
 * padding rolled back), with every token computed exactly as a one-token
 * decode step would compute it (osp_session_set_exact_tokens), and each
 * row's stream verifies its drafts (osp_stream_verify: greedy, the tokens
 * plain decoding gives; sampling, rejection against the target's
 * distribution). The target's KV keeps what was accepted (a speculative
 * round: begin, then rollback to the kept positions); the draft's KV is
 * trimmed to the tokens that were kept. Rows that do not speculate share
 * the chunk with no drafts, so they decode one token as they would alone.
 *
 * K adapts per row within [draft_min, draft_max]: all accepted grows it by
 * 2 (up to the most), otherwise it becomes the accepted count + 1.
 *
 * Rings: the target's and the draft's sessions need spare ring slots for
 * the rollback (draft_max + 1; osp_session_opts.spare).
 */
#ifndef OSP_SPEC_H
#define OSP_SPEC_H

#include <stdint.h>
#include "core/core.h"
#include "osprey.h"
#include "text/tokenizer.h"

typedef struct osp_spec_params {
    int32_t draft_max;  /* most tokens drafted per round (default 4) */
    int32_t draft_min;  /* fewest (default 1) */
    int ngram;          /* n-gram lookup drafting (when there is no draft model) */
    int32_t ngram_max;  /* longest match tried (default 4); down to 1 */
    int32_t max_tokens; /* most tokens a verification pass computes for all rows together (default 8; the
                           server and the CLI take osp_session_pass_tokens, 64 with AMX's bf16 path): past
                           it, checking drafts costs more compute than the bandwidth they save, so a larger
                           batch drafts fewer tokens a row, and none from this many rows on */
} osp_spec_params;

osp_spec_params osp_spec_defaults(void);

typedef struct osp_spec osp_spec;

/* draft: a model on the target's device sharing its tokenizer (checked by
 * osp_spec_check_tokenizers), or NULL for n-gram drafting. The draft's
 * session gets the target's rows and context. */
osp_status osp_spec_new(const osp_spec_params *p, const osp_model *draft, osp_session *target, osp_spec **out);
void osp_spec_free(osp_spec *sp);

/* A clear error unless the two tokenizers map every id to the same text. */
osp_status osp_spec_check_tokenizers(const osp_tokenizer *target, const osp_tokenizer *draft);

/* Load the draft model at path on `device` (osp_device) and check that its
 * tokenizer is tok's (a clear error when it has none, or another). */
osp_status osp_spec_load_draft(const char *path, int device, const osp_tokenizer *tok, osp_model **out);

/* A row begins a new generation (its draft state is forgotten). */
void osp_spec_reset_row(osp_spec *sp, int32_t row);

/* One decode round of nb rows of the target session: row i is session row
 * rows[i], generating with stream st[i]; next[i] is the token to feed (the
 * stream's last), replaced by the next one when more[i] = 1. use[i] = 0:
 * that row does not speculate this round. rc[i]: the row's own failure.
 * Returns a failure of the whole round (the forward pass). */
osp_status osp_spec_step(osp_spec *sp, osp_session *target, const int32_t *rows, int32_t nb, osp_stream *const *st,
                         const int *use, int32_t *next, int *more, osp_status *rc);

/* n-gram lookup: up to k tokens that followed the latest earlier occurrence
 * of the last n tokens of hist (n from ngram_max down to 1); their count. */
int32_t osp_ngram_draft(const int32_t *hist, int64_t nh, int32_t ngram_max, int32_t k, int32_t *out);

#endif
