/* server/conn: the request as parsed from its head, and the response's
 * framing on the socket (see conn.h). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include "core/core.h"
#include "server/conn.h"
#include "server/server_internal.h"

/* Percent-decoding in place (a malformed escape stays as it is). */
static void unescape(char *s) {
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2])) {
            char hex[3] = {r[1], r[2], 0};
            long v = strtol(hex, NULL, 16);
            if (v) { /* %00 stays as it is: a path holds no NUL */
                *w++ = (char)v;
                r += 2;
                continue;
            }
        }
        *w++ = *r;
    }
    *w = 0;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    return s;
}

/* Does a comma-separated header value list hold token (case-insensitive)? */
static int has_token(const char *v, const char *token) {
    size_t tn = strlen(token);
    for (const char *p = v; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t')) t--;
        if ((size_t)(t - p) == tn && !strncasecmp(p, token, tn)) return 1;
        p = e;
    }
    return 0;
}

int srv_req_parse_head(srv_req *q, const char *buf, size_t head_len) {
    q->head = malloc(head_len + 1);
    if (!q->head) return -1;
    memcpy(q->head, buf, head_len);
    q->head[head_len] = 0;
    int cap = 1;
    for (size_t i = 0; i < head_len; i++) cap += buf[i] == '\n';
    q->hname = malloc(sizeof *q->hname * (size_t)cap);
    q->hval = malloc(sizeof *q->hval * (size_t)cap);
    if (!q->hname || !q->hval) return -1;
    char *p = q->head;
    while (*p == '\r' || *p == '\n') p++; /* empty lines before the request line */
    /* lines, CR and LF cut */
    char *line = p, *next;
    int first = 1;
    for (; *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        else next = line + strlen(line);
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r') line[--n] = 0;
        if (!n) break;
        if (first) { /* METHOD SP target SP version (checked by srv_head_check) */
            first = 0;
            char *sp1 = strchr(line, ' ');
            char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
            if (!sp1 || !sp2) return -1;
            *sp1 = 0, *sp2 = 0;
            q->method = line;
            char *target = sp1 + 1;
            char *query = strchr(target, '?');
            if (query) *query = 0;
            unescape(target);
            q->path = target;
            q->http10 = !strcmp(sp2 + 1, "HTTP/1.0");
            continue;
        }
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        q->hname[q->n_hdr] = line;
        q->hval[q->n_hdr++] = trim(colon + 1);
    }
    if (!q->method) return -1;
    const char *conn = srv_req_header(q, "Connection");
    q->client_close = q->http10 ? !(conn && has_token(conn, "keep-alive")) : (conn && has_token(conn, "close"));
    q->head_only = !strcmp(q->method, "HEAD");
    return 0;
}

void srv_req_clear(srv_req *q) {
    free(q->head);
    free(q->hname);
    free(q->hval);
    free(q->body);
    q->head = q->body = NULL;
    q->hname = q->hval = NULL;
    q->n_hdr = 0;
    q->method = q->path = NULL;
}

const char *srv_req_header(const srv_req *q, const char *name) {
    for (int i = 0; i < q->n_hdr; i++)
        if (!strcasecmp(q->hname[i], name)) return q->hval[i];
    return NULL;
}

/* ---- writing ---- */

int srv_write_all(int fd, const char *p, size_t n, double timeout_s, int *stalled) {
    *stalled = 0;
    double deadline = osp_now_s() + timeout_s;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w, n -= (size_t)w;
            deadline = osp_now_s() + timeout_s; /* the client reads: the wait starts again */
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        double left = deadline - osp_now_s();
        if (left <= 0) {
            *stalled = 1;
            return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno != EINTR) return -1;
        if (r > 0 && (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) && !(pf.revents & POLLOUT)) return -1;
    }
    return 0;
}

static int put(srv_req *q, const char *p, size_t n) {
    if (q->failed) return -1;
    int stalled = 0;
    if (srv_write_all(q->fd, p, n, q->write_timeout, &stalled)) {
        q->failed = 1;
        q->stalled = stalled;
        q->close_after = 1;
        return -1;
    }
    return 0;
}

/* The status line and headers; length < 0: chunked (or close-delimited). */
static int put_head(srv_req *q, int status, const char *ctype, long long length, const char *extra) {
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    srv_buf h = {0};
    int bad = srv_buf_addf(&h, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, srv_status_text(status), date);
    if (status != 204) { /* a 204 has no body, and no Content-Length or Content-Type (RFC 9110 8.6) */
        bad |= srv_buf_addf(&h, "Content-Type: %s\r\n", ctype);
        if (length >= 0) bad |= srv_buf_addf(&h, "Content-Length: %lld\r\n", length);
        else if (!q->http10) bad |= srv_buf_add(&h, "Transfer-Encoding: chunked\r\n", 28);
    }
    if (q->cors_origin) {
        bad |= srv_buf_addf(&h, "Access-Control-Allow-Origin: %s\r\n", q->cors_origin);
        if (strcmp(q->cors_origin, "*")) bad |= srv_buf_add(&h, "Vary: Origin\r\n", 14);
    }
    if (extra) bad |= srv_buf_add(&h, extra, strlen(extra));
    if (q->client_close || (length < 0 && q->http10)) q->close_after = 1;
    if (q->close_after) bad |= srv_buf_add(&h, "Connection: close\r\n", 19);
    else if (q->http10) bad |= srv_buf_add(&h, "Connection: keep-alive\r\n", 24);
    bad |= srv_buf_add(&h, "\r\n", 2);
    q->status = status;
    int rc = bad ? -1 : put(q, h.p, h.len);
    srv_buf_free(&h);
    if (bad) q->failed = 1, q->close_after = 1;
    return rc;
}

int srv_req_reply(srv_req *q, int status, const char *ctype, const char *body, size_t len, const char *extra) {
    if (put_head(q, status, ctype, (long long)len, extra)) return -1;
    if (q->head_only || !len) return 0;
    return put(q, body, len);
}

int srv_req_stream_begin(srv_req *q, int status, const char *ctype, const char *extra) {
    q->streaming = 1;
    q->chunked = !q->http10;
    if (q->head_only) q->close_after = 1;
    return put_head(q, status, ctype, -1, extra);
}

int srv_req_stream_write(srv_req *q, const char *p, size_t n) {
    if (!n || q->head_only) return q->failed ? -1 : 0;
    if (!q->chunked) return put(q, p, n);
    /* one write a chunk: its size line, its data, CRLF */
    srv_buf b = {0};
    if (srv_buf_addf(&b, "%zx\r\n", n) || srv_buf_add(&b, p, n) || srv_buf_add(&b, "\r\n", 2)) {
        srv_buf_free(&b);
        q->failed = 1, q->close_after = 1;
        return -1;
    }
    int rc = put(q, b.p, b.len);
    srv_buf_free(&b);
    return rc;
}

int srv_req_stream_end(srv_req *q) {
    if (q->head_only) return q->failed ? -1 : 0;
    if (q->chunked) return put(q, "0\r\n\r\n", 5);
    q->close_after = 1; /* HTTP/1.0: the end of the body is the close */
    return q->failed ? -1 : 0;
}
