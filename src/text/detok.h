/* text/detok: incremental detokenization for streaming.
 *
 * Feed ids one at a time; each push returns the text that became final.
 * The concatenation of everything returned (pushes, then flush at the end
 * of the stream) equals osp_tokenizer_decode() of all the ids, byte for
 * byte, and every returned chunk is complete UTF-8:
 *   - an incomplete multi-byte character (byte-level tokens, or
 *     byte-fallback <0xNN> tokens, which the decoder only turns into text
 *     once their run ends) is held back until it is complete;
 *   - SentencePiece leading-space rules (Metaspace, Strip) apply only to
 *     the real start of the text, never to the start of a chunk.
 * Internally the ids since the last point where the text was final form a
 * window that is decoded as a continuation of the text before it; the
 * window is usually one id, so each push costs O(1).
 *
 * A detokenizer belongs to one stream (not thread-safe); the tokenizer may
 * be shared. Decoder chains whose output end is not final after a token
 * (a Strip with stop > 0 or a multi-character Replace after the tokens are
 * joined) are refused by osp_detok_new with OSP_ERR_UNSUPPORTED. */
#ifndef OSP_DETOK_H
#define OSP_DETOK_H

#include "text/tokenizer.h"

typedef struct osp_detok osp_detok;

osp_status osp_detok_new(const osp_tokenizer *t, int skip_special, osp_detok **out);
void osp_detok_free(osp_detok *d);
/* Start a new stream. */
void osp_detok_reset(osp_detok *d);

/* Add one id. *text (valid until the next call on d) receives the newly
 * final UTF-8 text, *len its length (often 0 while text is held back).
 * Ids outside the vocabulary are OSP_ERR_RANGE. */
osp_status osp_detok_push(osp_detok *d, int32_t id, const char **text, size_t *len);
/* End of stream: the text still held back (possibly with U+FFFD for bytes
 * that never completed, exactly as decode renders them). Resets d. */
osp_status osp_detok_flush(osp_detok *d, const char **text, size_t *len);

#endif
