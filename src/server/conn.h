/* server/conn: one HTTP/1.1 request as the handler sees it, and the writing
 * of its response on the client's socket.
 *
 * front.c reads the request (head and whole body) and hands it to a handler
 * thread as an srv_req; the handler answers with srv_req_reply (a body of
 * known length) or srv_req_stream_* (chunked; close-delimited for HTTP/1.0),
 * then gives the connection back to front.c. Every write waits for the
 * client at most the write timeout: a client that reads nothing for that
 * long is "stalled" and its response is abandoned. */
#ifndef OSP_SERVER_CONN_H
#define OSP_SERVER_CONN_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct srv_req {
    int fd;
    struct sockaddr_storage addr;
    /* the request (front.c) */
    char *head;              /* the head's fields, NUL-separated (owned) */
    const char *method;
    const char *path;        /* the target's path, percent-decoded, without the query */
    const char **hname, **hval;
    int n_hdr;
    int http10;
    int client_close;        /* the client asked to close after this request (or HTTP/1.0 without keep-alive) */
    char *body;              /* the decoded body (owned; NUL-terminated) */
    size_t body_len;
    double t_head;           /* when its head arrived */
    int too_large;           /* the status of a body over its route's limit: 413, or 400 for an audio upload */
    /* the response */
    double write_timeout;    /* s a write may wait for the client to read */
    const char *cors_origin; /* Access-Control-Allow-Origin's value, or NULL */
    int head_only;           /* HEAD: headers without the body */
    int status;              /* of the response sent (0: none yet) */
    int streaming, chunked;  /* a stream has begun; its framing */
    int failed;              /* a write failed: the client is gone or stalled */
    int stalled;             /* ... by the write timeout */
    int close_after;         /* close the connection after this response */
} srv_req;

/* Parse a head that srv_head_check accepted (head_len bytes of buf). 0 ok, -1 out of memory. */
int srv_req_parse_head(srv_req *q, const char *buf, size_t head_len);
void srv_req_clear(srv_req *q); /* frees the request's memory (not the socket) */

/* The first field named name (case-insensitive), or NULL. */
const char *srv_req_header(const srv_req *q, const char *name);

/* A whole response: status line, headers (Content-Type, Content-Length, the
 * CORS header, extra: more "Name: value\r\n" lines or NULL), then the body.
 * 0 ok, -1 when the client is gone or stalled (q->failed). */
int srv_req_reply(srv_req *q, int status, const char *ctype, const char *body, size_t len, const char *extra);

/* A response of unknown length, written as it comes. */
int srv_req_stream_begin(srv_req *q, int status, const char *ctype, const char *extra);
int srv_req_stream_write(srv_req *q, const char *p, size_t n);
int srv_req_stream_end(srv_req *q);

/* Write n bytes on a non-blocking socket, waiting for the peer at most
 * timeout_s seconds at a time. 0 ok; -1 failed (*stalled = 1 when it was
 * the timeout). */
int srv_write_all(int fd, const char *p, size_t n, double timeout_s, int *stalled);

#endif
