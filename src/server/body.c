/* server/body: incremental request-body decoding (see body.h). */
#include <stdio.h>
#include <string.h>
#include "server/body.h"

enum { S_SIZE, S_EXT, S_SIZE_LF, S_DATA, S_DATA_CR, S_DATA_LF, S_TRAILER, S_TRAILER_LF };

#define SIZE_LINE_MAX 4096  /* a chunk-size line with its extensions */
#define TRAILER_MAX 16384   /* all trailer fields together */

static size_t refuse(srv_body *b, int status, const char *msg, size_t used) {
    b->status = status;
    snprintf(b->msg, sizeof b->msg, "%s", msg);
    return used;
}

void srv_body_init(srv_body *b, int chunked, unsigned long long content_length, size_t limit) {
    memset(b, 0, sizeof *b);
    b->chunked = chunked;
    b->limit = limit;
    b->state = S_SIZE;
    if (!chunked) {
        b->remaining = content_length;
        b->done = content_length == 0;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The size line ended: the chunk's data follows, or the trailer (size 0). */
static int size_line_done(srv_body *b) {
    if (!b->digits) return (void)refuse(b, 400, "malformed chunk size", 0), -1;
    if (b->digits > 16 || b->size > b->limit - b->total) {
        char m[96];
        snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes", b->limit);
        return (void)refuse(b, 413, m, 0), -1;
    }
    b->line = 0;
    if (!b->size) {
        b->state = S_TRAILER;
        return 0;
    }
    b->remaining = b->size;
    b->state = S_DATA;
    return 0;
}

size_t srv_body_feed(srv_body *b, const char *in, size_t n, char *out, size_t *out_n) {
    *out_n = 0;
    if (b->done || b->status) return 0;
    if (!b->chunked) {
        size_t k = b->remaining < n ? (size_t)b->remaining : n;
        memcpy(out, in, k);
        *out_n = k;
        b->remaining -= k;
        b->total += k;
        b->done = b->remaining == 0;
        return k;
    }
    size_t i = 0;
    while (i < n && !b->done) {
        char c = in[i];
        switch (b->state) {
        case S_DATA: {
            size_t k = n - i;
            if (k > b->remaining) k = (size_t)b->remaining;
            memcpy(out + *out_n, in + i, k);
            *out_n += k;
            b->total += k;
            b->remaining -= k;
            i += k;
            if (!b->remaining) b->state = S_DATA_CR;
            continue;
        }
        case S_DATA_CR: /* CRLF after a chunk's data (a bare LF is accepted) */
            if (c == '\r') b->state = S_DATA_LF;
            else if (c == '\n') b->state = S_SIZE, b->size = 0, b->digits = 0, b->line = 0;
            else return refuse(b, 400, "a chunk's data is not followed by CRLF", i);
            break;
        case S_DATA_LF:
            if (c != '\n') return refuse(b, 400, "a chunk's data is not followed by CRLF", i);
            b->state = S_SIZE, b->size = 0, b->digits = 0, b->line = 0;
            break;
        case S_SIZE:
        case S_EXT:
            if (++b->line > SIZE_LINE_MAX) return refuse(b, 400, "a chunk-size line is too long", i);
            if (c == '\r') {
                b->state = S_SIZE_LF;
            } else if (c == '\n') {
                if (size_line_done(b)) return i;
            } else if (b->state == S_SIZE && hexval(c) >= 0) {
                if (++b->digits <= 16) b->size = b->size << 4 | (unsigned)hexval(c);
            } else if (c == ';' || c == ' ' || c == '\t') {
                if (!b->digits) return refuse(b, 400, "malformed chunk size", i);
                b->state = S_EXT; /* chunk extensions are ignored */
            } else if (b->state == S_EXT && (unsigned char)c >= 0x20 && c != 0x7f) {
                /* an extension's text */
            } else {
                return refuse(b, 400, "malformed chunk size", i);
            }
            break;
        case S_SIZE_LF:
            if (c != '\n') return refuse(b, 400, "malformed chunk size", i);
            if (size_line_done(b)) return i;
            break;
        case S_TRAILER: /* trailer fields (ignored) until an empty line */
            if (++b->trailer > TRAILER_MAX) return refuse(b, 400, "the chunked body's trailer is too large", i);
            if (c == '\r') {
                b->state = S_TRAILER_LF;
            } else if (c == '\n') {
                if (!b->line) b->done = 1;
                b->line = 0;
            } else if ((unsigned char)c < 0x20 && c != '\t') {
                return refuse(b, 400, "control character in a trailer field", i);
            } else {
                b->line++;
            }
            break;
        case S_TRAILER_LF:
            if (c != '\n') return refuse(b, 400, "malformed trailer field", i);
            if (!b->line) b->done = 1;
            b->line = 0;
            b->state = S_TRAILER;
            break;
        }
        i++;
    }
    return i;
}
