#include <stdlib.h>
#include <string.h>
#include "stop.h"

struct osp_stop {
    char **stops;
    size_t *lens;
    int n;
    char *buf;   /* held-back text, then the emitted part in front of it */
    size_t len, cap;
    size_t emitted; /* bytes of buf already handed out (dropped on next feed) */
};

osp_status osp_stop_new(const char *const *stops, int n, osp_stop **out) {
    *out = NULL;
    osp_stop *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->stops = calloc((size_t)(n > 0 ? n : 1), sizeof *s->stops);
    s->lens = calloc((size_t)(n > 0 ? n : 1), sizeof *s->lens);
    if (!s->stops || !s->lens) {
        osp_stop_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        s->lens[s->n] = strlen(stops[i]);
        s->stops[s->n] = strdup(stops[i]);
        if (!s->stops[s->n]) {
            osp_stop_free(s);
            return osp_err(OSP_ERR_NOMEM, "out of memory");
        }
        s->n++;
    }
    *out = s;
    return OSP_OK;
}

void osp_stop_free(osp_stop *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->stops[i]);
    free(s->stops);
    free(s->lens);
    free(s->buf);
    free(s);
}

void osp_stop_reset(osp_stop *s) { s->len = s->emitted = 0; }

int osp_stop_feed(osp_stop *s, const char *piece, size_t plen, const char **emit, size_t *emit_len) {
    /* drop what was handed out last time */
    if (s->emitted) {
        memmove(s->buf, s->buf + s->emitted, s->len - s->emitted);
        s->len -= s->emitted;
        s->emitted = 0;
    }
    if (s->len + plen + 1 > s->cap) {
        size_t nc = (s->len + plen + 1) * 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) { /* cannot hold back: emit everything as is */
            *emit = piece;
            *emit_len = plen;
            return 0;
        }
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, piece, plen);
    s->len += plen;
    /* earliest completed stop string wins */
    size_t best = (size_t)-1;
    for (int i = 0; i < s->n; i++) {
        if (s->lens[i] > s->len) continue;
        for (size_t p = 0; p + s->lens[i] <= s->len; p++)
            if (memcmp(s->buf + p, s->stops[i], s->lens[i]) == 0) {
                if (p < best) best = p;
                break;
            }
    }
    *emit = s->buf;
    if (best != (size_t)-1) {
        *emit_len = best;
        s->emitted = s->len; /* the stream is over */
        return 1;
    }
    /* hold back the longest tail that is a proper prefix of a stop string */
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t maxk = s->lens[i] - 1 < s->len ? s->lens[i] - 1 : s->len;
        for (size_t k = maxk; k > hold; k--)
            if (memcmp(s->buf + s->len - k, s->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    *emit_len = s->len - hold;
    s->emitted = *emit_len;
    return 0;
}

void osp_stop_flush(osp_stop *s, const char **emit, size_t *emit_len) {
    if (s->emitted) {
        memmove(s->buf, s->buf + s->emitted, s->len - s->emitted);
        s->len -= s->emitted;
    }
    *emit = s->buf ? s->buf : "";
    *emit_len = s->len;
    s->emitted = s->len;
}
