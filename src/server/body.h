/* server/body: a request body as it arrives, decoded incrementally: a
 * Content-Length body, or the chunked transfer coding (RFC 9112 7.1), with
 * the route's size limit applied while it arrives (a chunk announcing more
 * than the limit allows is refused at its size line, before its data).
 * Pure parsing, no I/O: front.c feeds it what it reads, the fuzzer feeds it
 * arbitrary bytes. */
#ifndef OSP_SERVER_BODY_H
#define OSP_SERVER_BODY_H

#include <stddef.h>

typedef struct srv_body {
    int chunked;
    int done;                     /* the whole body has been decoded */
    int status;                   /* refused: 400 (malformed framing) or 413 (over the limit); else 0 */
    char msg[96];                 /* why, when refused */
    int state;                    /* chunked: where in the framing */
    unsigned long long remaining; /* bytes of the body (Content-Length) or of the current chunk still to come */
    unsigned long long size;      /* the chunk size being read */
    int digits;                   /* its hex digits so far */
    size_t line;                  /* bytes of the current size or trailer line */
    size_t trailer;               /* bytes of trailer fields so far */
    size_t total;                 /* body bytes decoded so far */
    size_t limit;
} srv_body;

/* content_length: the body's length (ignored when chunked). */
void srv_body_init(srv_body *b, int chunked, unsigned long long content_length, size_t limit);

/* Decode in[0..n): the body's bytes go to out (room for n bytes), *out_n of
 * them. Returns how many bytes of in were used: all of them, unless the body
 * ended inside in (the rest belongs to the next request) or was refused
 * (b->status). Feeding the same bytes in any split gives the same result. */
size_t srv_body_feed(srv_body *b, const char *in, size_t n, char *out, size_t *out_n);

#endif
