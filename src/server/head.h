/* server/head: checks an HTTP/1.x request head as it arrives (front.c), so
 * that every malformed request is answered in the API's JSON error shape.
 *
 * Accepted: "METHOD SP target SP HTTP/1.0|1.1" then header fields; at most
 * one Content-Length value (repeats must be equal; digits only, at most 18);
 * Transfer-Encoding only as exactly "chunked", never with Content-Length or
 * under HTTP/1.0; no obsolete line folding; no control characters. */
#ifndef OSP_SERVER_HEAD_H
#define OSP_SERVER_HEAD_H

#include <stddef.h>

typedef struct srv_head {
    size_t head_len;          /* bytes up to and including the empty line */
    long long content_length; /* -1: none */
    int chunked, http10;
    int status;               /* on failure: the HTTP status to answer with */
    char msg[96];             /* on failure: why */
} srv_head;

/* buf holds the first n bytes the client sent. Returns 1: a complete,
 * acceptable head; 0: incomplete (wait for more, unless n >= max_head,
 * which fails); -1: refused (h->status, h->msg). max_uri bounds the request
 * target. */
int srv_head_check(const char *buf, size_t n, size_t max_head, size_t max_uri, srv_head *h);

#endif
