/* text/stop: stop strings over a streamed text.
 *
 * Generated text arrives in pieces (from the incremental detokenizer).
 * The matcher emits what can no longer be part of a stop string and holds
 * back the longest tail that is still a prefix of one, so a stop string is
 * never leaked, even split across tokens, and nothing is cut early. When a
 * stop string completes, everything before it is emitted and the match is
 * reported; the stop string itself is not emitted.
 */
#ifndef OSP_STOP_H
#define OSP_STOP_H

#include <stddef.h>
#include "core/core.h"

typedef struct osp_stop osp_stop;

/* n strings (empty ones are ignored). */
osp_status osp_stop_new(const char *const *stops, int n, osp_stop **out);
void osp_stop_free(osp_stop *s);
void osp_stop_reset(osp_stop *s);

/* Append a piece. *emit / *emit_len: text that is final (points into the
 * matcher, valid until the next call). Returns 1 when a stop string
 * completed (then *emit is the text before it and the stream is over), else 0. */
int osp_stop_feed(osp_stop *s, const char *piece, size_t len, const char **emit, size_t *emit_len);
/* End of stream without a stop: everything held back. */
void osp_stop_flush(osp_stop *s, const char **emit, size_t *emit_len);

#endif
