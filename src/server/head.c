/* server/head: the checks an HTTP/1.1 request head must pass before the
 * request is admitted (see front.c). Pure parsing, no I/O:
 * the fuzzers drive it directly. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "server/head.h"

static int is_tchar(unsigned char c) {
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Trim spaces and tabs. */
static void trim(const char **p, size_t *n) {
    while (*n && (**p == ' ' || **p == '\t')) (*p)++, (*n)--;
    while (*n && ((*p)[*n - 1] == ' ' || (*p)[*n - 1] == '\t')) (*n)--;
}

static int fail(srv_head *h, int status, const char *msg) {
    h->status = status;
    snprintf(h->msg, sizeof h->msg, "%s", msg);
    return -1;
}

int srv_head_check(const char *buf, size_t n, size_t max_head, size_t max_uri, srv_head *h) {
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    /* the end of the head: CRLF CRLF (a bare LF LF is accepted too) */
    size_t end = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (buf[i] == '\n' && buf[i + 1] == '\n') { end = i + 2; break; }
        if (i + 3 < n && buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            end = i + 4;
            break;
        }
    }
    /* skip empty lines before the request line (RFC 9112 2.2) */
    size_t lead = 0;
    while (lead < n && (buf[lead] == '\r' || buf[lead] == '\n')) lead++;
    if (!end || end <= lead) {
        if (n >= max_head) {
            /* a request line longer than the limit is a 414, anything else a 431 */
            const char *nl = memchr(buf + lead, '\n', n - lead);
            if (!nl) return fail(h, 414, "the request line is longer than the server's limit");
            return fail(h, 431, "the request head is larger than the server's limit");
        }
        return 0;
    }
    if (end > max_head) return fail(h, 431, "the request head is larger than the server's limit");
    h->head_len = end;
    /* request line: METHOD SP TARGET SP HTTP/x.y */
    const char *p = buf + lead, *e = buf + end;
    const char *eol = memchr(p, '\n', (size_t)(e - p));
    size_t ll = (size_t)(eol - p);
    if (ll && p[ll - 1] == '\r') ll--;
    const char *sp1 = memchr(p, ' ', ll);
    if (!sp1 || sp1 == p) return fail(h, 400, "malformed request line");
    for (const char *q = p; q < sp1; q++)
        if (!is_tchar((unsigned char)*q)) return fail(h, 400, "malformed request line");
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', ll - (size_t)(t - p));
    if (!sp2 || sp2 == t) return fail(h, 400, "malformed request line");
    if ((size_t)(sp2 - t) > max_uri) return fail(h, 414, "the request target is longer than the server's limit");
    for (const char *q = t; q < sp2; q++)
        if ((unsigned char)*q <= ' ' || (unsigned char)*q == 0x7f) return fail(h, 400, "malformed request target");
    const char *ver = sp2 + 1;
    size_t vl = ll - (size_t)(ver - p);
    if (vl != 8 || strncmp(ver, "HTTP/", 5) || !isdigit((unsigned char)ver[5]) || ver[6] != '.' ||
        !isdigit((unsigned char)ver[7]))
        return fail(h, 400, "malformed HTTP version");
    if (ver[5] != '1' || (ver[7] != '0' && ver[7] != '1')) return fail(h, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
    h->http10 = ver[7] == '0';
    /* header fields */
    int n_cl = 0, n_te = 0;
    for (p = eol + 1; p < e;) {
        eol = memchr(p, '\n', (size_t)(e - p));
        size_t len = (size_t)(eol - p);
        if (len && p[len - 1] == '\r') len--;
        if (!len) break; /* the empty line */
        if (*p == ' ' || *p == '\t') return fail(h, 400, "obsolete header line folding is not accepted");
        const char *colon = memchr(p, ':', len);
        if (!colon || colon == p) return fail(h, 400, "malformed header field");
        for (const char *q = p; q < colon; q++)
            if (!is_tchar((unsigned char)*q)) return fail(h, 400, "malformed header field name");
        size_t nl = (size_t)(colon - p);
        const char *v = colon + 1;
        size_t vn = len - nl - 1;
        for (size_t i = 0; i < vn; i++)
            if ((unsigned char)v[i] < ' ' && v[i] != '\t') return fail(h, 400, "control character in a header field");
        trim(&v, &vn);
        if (nl == 14 && !strncasecmp(p, "Content-Length", 14)) {
            /* 1*DIGIT, at most 18 digits; repeated only with the same value */
            if (!vn || vn > 18) return fail(h, 400, "invalid Content-Length");
            long long val = 0;
            for (size_t i = 0; i < vn; i++) {
                if (!isdigit((unsigned char)v[i])) return fail(h, 400, "invalid Content-Length");
                val = val * 10 + (v[i] - '0');
            }
            if (n_cl++ && val != h->content_length) return fail(h, 400, "conflicting Content-Length headers");
            h->content_length = val;
        } else if (nl == 17 && !strncasecmp(p, "Transfer-Encoding", 17)) {
            n_te++;
            if (vn != 7 || strncasecmp(v, "chunked", 7) || n_te > 1)
                return fail(h, 501, "only 'Transfer-Encoding: chunked' is supported");
            h->chunked = 1;
        }
        p = eol + 1;
    }
    if (h->chunked && n_cl) return fail(h, 400, "a request may not have both Content-Length and Transfer-Encoding");
    if (h->chunked && h->http10) return fail(h, 400, "chunked transfer coding needs HTTP/1.1");
    return 1;
}
