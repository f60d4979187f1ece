/* server/front: every connection's socket from accept to close, but for the
 * time a handler thread answers one of its requests.
 *
 * One thread accepts connections and holds them in a poll set (no thread per
 * connection) while it reads their requests: the head (checked by head.c,
 * then by srv_http_admit: route, method, API key, body limit) and the whole
 * body (body.c: Content-Length or chunked). A complete request goes to a new
 * handler thread (srv_http_handle), which writes the response and gives the
 * connection back: kept alive, it waits here for its next request.
 *
 * Nothing a client does can make a state permanent:
 *   - connections are counted here, in every state, and given back on every
 *     path: at --max-connections a new connection makes room by closing the
 *     one that has waited longest for its request (head or body; an idle
 *     kept-alive one is closed quietly, a waiting request gets a 503), and
 *     when every connection is being answered the new one is refused (503);
 *   - deadlines: the head within --timeout of connecting or of the previous
 *     response (408; an idle kept-alive connection is just closed), the body
 *     within --body-timeout of its head (408);
 *   - a refused request (401, 404, 413, ...) is answered as soon as its head
 *     is complete, its body unread;
 *   - every connection closed here on our own is answered first, and closed
 *     gracefully: our side shut down, then what the client still sends is
 *     read and dropped, bounded in time and bytes (LINGER_*), so that the
 *     answer reaches a client that is still writing its body. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include "server/body.h"
#include "server/head.h"
#include "server/server_internal.h"

#define HEAD_MAX (32 * 1024)
#define URI_MAX (8 * 1024)
#define READ_ROUND (256 * 1024)   /* bytes read from one connection per wake: others get their turn */
#define LINGER_S 5.0              /* a graceful close reads and drops the client's bytes this long at most, */
#define LINGER_IDLE_S 2.0         /* or until it is silent this long, */
#define LINGER_BYTES (64u << 20)  /* or this many bytes */
#define SNDBUF (256 * 1024)       /* a connection's send buffer (the kernel doubles it) */

enum { C_HEAD, C_BODY, C_BUSY, C_CLOSING, C_DEAD };

typedef struct fconn {
    int fd;
    int state;
    int fresh;             /* no request yet on this connection (a silent one gets a 408) */
    int returned, keep;    /* C_BUSY: the handler is done (under mu); the connection may take another request */
    double since;          /* when it began to wait for its request: who is evicted first */
    double deadline;
    double linger_end;
    size_t lingered;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char *in;              /* bytes read and not yet used */
    size_t in_len, in_cap;
    size_t body_cap;
    srv_req req;           /* C_BODY, C_BUSY */
    srv_body body;
    struct srv_front *f;
} fconn;

struct srv_front {
    srv *s;
    int lfd;
    int wake[2];
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* a handler thread ended */
    fconn **c;             /* every connection */
    int n, cap;
    int n_live;            /* C_HEAD + C_BODY + C_BUSY: at most max_connections */
    int n_closing;         /* C_CLOSING: at most max_connections */
    int threads;           /* handler threads running */
    int stop;
};

static void wake(srv_front *f) { (void)!write(f->wake[1], "x", 1); }

static int live(const fconn *c) { return c->state == C_HEAD || c->state == C_BODY || c->state == C_BUSY; }

/* Close now (no answer): a client that is gone, an idle kept-alive connection, a linger that ended. */
static void drop(srv_front *f, fconn *c) {
    if (c->state == C_DEAD) return;
    if (live(c)) f->n_live--;
    else if (c->state == C_CLOSING) f->n_closing--;
    close(c->fd);
    c->fd = -1;
    c->state = C_DEAD;
}

static void free_conn(fconn *c) {
    srv_req_clear(&c->req);
    free(c->in);
    free(c);
}

/* The oldest connection in state st (by since), or NULL. */
static fconn *oldest(srv_front *f, int st, int waiting) {
    fconn *o = NULL;
    for (int i = 0; i < f->n; i++) {
        fconn *c = f->c[i];
        int match = waiting ? (c->state == C_HEAD || c->state == C_BODY) : c->state == st;
        if (match && (!o || c->since < o->since)) o = c;
    }
    return o;
}

/* Shut our side, then read and drop what the client still sends (see the top). */
static void start_close(srv_front *f, fconn *c) {
    if (c->state == C_CLOSING || c->state == C_DEAD) return;
    if (f->n_closing >= f->s->limits.max_connections) { /* too many lingering: the oldest goes now */
        fconn *o = oldest(f, C_CLOSING, 0);
        if (o) drop(f, o);
    }
    if (live(c)) f->n_live--;
    f->n_closing++;
    c->state = C_CLOSING;
    shutdown(c->fd, SHUT_WR);
    double now = osp_now_s();
    c->linger_end = now + LINGER_S;
    c->deadline = now + LINGER_IDLE_S;
    c->lingered = 0;
}

/* A JSON error response with Connection: close, written without waiting
 * (small: the socket's buffer takes it); path: the request's, once its head
 * is parsed (the error's shape depends on the route), else NULL. */
static void send_error(int fd, int status, const char *msg, const char *path) {
    json_t *e = srv_http_error_json(path, status, msg);
    char *body = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    srv_buf b = {0};
    if (!srv_buf_addf(&b, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                          "Connection: close\r\n\r\n%s\n",
                      status, srv_status_text(status), body ? strlen(body) + 1 : 1, body ? body : ""))
        (void)!send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    srv_buf_free(&b);
    free(body);
}

/* Answer with a JSON error and close gracefully. */
static void refuse_for(srv_front *f, fconn *c, int status, const char *msg, const char *path) {
    send_error(c->fd, status, msg, path);
    OSP_LOG(2, "osprey serve: refused a request: %d %s", status, msg);
    start_close(f, c);
}

static void refuse(srv_front *f, fconn *c, int status, const char *msg) { refuse_for(f, c, status, msg, NULL); }

/* ---- reading a request ---- */

static void *handler_main(void *arg);

/* The request is whole: a handler thread answers it. */
static void dispatch(srv_front *f, fconn *c) {
    srv *s = f->s;
    c->req.body[c->req.body_len] = 0;
    c->req.fd = c->fd;
    c->req.addr = c->addr;
    c->req.write_timeout = s->limits.write_timeout;
    c->state = C_BUSY;
    c->returned = c->keep = 0;
    c->f = f;
    /* the socket blocks no thread: writes wait in poll, up to the write timeout */
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &a, handler_main, c);
    pthread_attr_destroy(&a);
    if (rc) {
        c->state = C_BODY; /* back to a waiting state, to be refused */
        refuse(f, c, 503, "the server cannot start a thread for this request; try again");
        srv_req_clear(&c->req);
        return;
    }
    f->threads++;
}

static void use_input(fconn *c, size_t n) {
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
}

/* Move the buffered input through the body decoder. */
static void feed_body(srv_front *f, fconn *c) {
    if (!c->in_len && !c->body.done) return;
    size_t need = c->req.body_len + c->in_len + 1;
    if (need > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < need) cap *= 2;
        char *b = realloc(c->req.body, cap);
        if (!b) return refuse(f, c, 500, "out of memory while reading the request body");
        c->req.body = b;
        c->body_cap = cap;
    }
    size_t got = 0;
    size_t used = srv_body_feed(&c->body, c->in, c->in_len, c->req.body + c->req.body_len, &got);
    c->req.body_len += got;
    use_input(c, used);
    if (c->body.status == 413) return refuse_for(f, c, c->req.too_large, c->body.msg, c->req.path);
    if (c->body.status) return refuse_for(f, c, c->body.status, c->body.msg, c->req.path);
    if (c->body.done) dispatch(f, c);
}

/* A head may be complete in the input: check it, admit the request, start its body. */
static void try_head(srv_front *f, fconn *c) {
    srv *s = f->s;
    srv_head h;
    int rc = srv_head_check(c->in, c->in_len, HEAD_MAX, URI_MAX, &h);
    if (rc < 0) return refuse(f, c, h.status, h.msg);
    if (rc == 0) return;
    srv_req_clear(&c->req);
    memset(&c->req, 0, sizeof c->req);
    c->body_cap = 0;
    if (srv_req_parse_head(&c->req, c->in, h.head_len)) return refuse(f, c, 500, "out of memory");
    use_input(c, h.head_len);
    c->fresh = 0;
    c->req.t_head = osp_now_s();
    char msg[300];
    size_t limit = 0;
    int st = srv_http_admit(s, &c->req, &limit, msg, sizeof msg);
    if (!st && h.content_length > 0 && (unsigned long long)h.content_length > limit) {
        st = c->req.too_large;
        snprintf(msg, sizeof msg, "the request body is larger than the limit of %zu bytes (%s)", limit,
                 st == 400 ? "--max-audio-body" : "--max-body");
    }
    if (st) return refuse_for(f, c, st, msg, c->req.path);
    srv_body_init(&c->body, h.chunked, h.content_length > 0 ? (unsigned long long)h.content_length : 0, limit);
    c->state = C_BODY;
    c->deadline = s->limits.body_timeout > 0 ? c->req.t_head + s->limits.body_timeout : c->req.t_head + 1e9;
    const char *expect = srv_req_header(&c->req, "Expect");
    if (expect && !c->req.http10 && !strcasecmp(expect, "100-continue") && !c->body.done && !c->in_len)
        (void)!send(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL | MSG_DONTWAIT);
    feed_body(f, c);
}

static void on_readable(srv_front *f, fconn *c) {
    if (c->state == C_CLOSING) {
        char sink[16384];
        for (int k = 0; k < 16; k++) {
            ssize_t r = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return drop(f, c);
            if (r < 0) break;
            c->lingered += (size_t)r;
            if (c->lingered > LINGER_BYTES) return drop(f, c);
        }
        double idle = osp_now_s() + LINGER_IDLE_S;
        c->deadline = idle < c->linger_end ? idle : c->linger_end;
        return;
    }
    size_t round = 0;
    while (round < READ_ROUND && (c->state == C_HEAD || c->state == C_BODY)) {
        /* a head reads up to one byte past its limit (to tell it is over); a body in rounds of 64 KiB. The
         * buffer starts small and doubles: a thousand waiting connections hold a few KiB each */
        size_t room = c->state == C_HEAD ? HEAD_MAX + 1 - (c->in_len < HEAD_MAX ? c->in_len : HEAD_MAX) : 65536;
        if (c->state == C_HEAD && c->in_len > HEAD_MAX) return refuse(f, c, 431, "the request head is larger than the server's limit");
        if (c->in_cap - c->in_len < 1024 && c->in_cap < c->in_len + room) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 4096;
            if (cap > c->in_len + room) cap = c->in_len + room;
            char *p = realloc(c->in, cap);
            if (!p) return refuse(f, c, 500, "out of memory while reading the request");
            c->in = p;
            c->in_cap = cap;
        }
        size_t want = c->in_cap - c->in_len < room ? c->in_cap - c->in_len : room;
        ssize_t r = recv(c->fd, c->in + c->in_len, want, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r < 0) return drop(f, c); /* reset */
        if (r == 0) { /* the client closed its side before a whole request */
            if (c->state == C_HEAD && !c->in_len) return drop(f, c);
            return refuse(f, c, 400, c->state == C_HEAD ? "the connection ended inside the request head"
                                                        : "the connection ended before the whole request body");
        }
        c->in_len += (size_t)r;
        round += (size_t)r;
        if (c->state == C_HEAD) try_head(f, c);
        else feed_body(f, c);
    }
}

/* A handler gave its connection back. */
static void on_returned(srv_front *f, fconn *c) {
    srv *s = f->s;
    int keep = c->keep && !atomic_load(&s->draining) && !f->stop;
    srv_req_clear(&c->req);
    memset(&c->req, 0, sizeof c->req);
    c->body_cap = 0;
    if (!keep) return start_close(f, c);
    c->state = C_HEAD;
    c->since = osp_now_s();
    c->deadline = c->since + s->limits.head_timeout;
    if (c->in_len) try_head(f, c); /* a pipelined request */
}

static void on_deadline(srv_front *f, fconn *c) {
    if (c->state == C_CLOSING) return drop(f, c);
    if (c->state == C_BODY) return refuse(f, c, 408, "the request body did not arrive within --body-timeout");
    if (c->fresh || c->in_len) return refuse(f, c, 408, "no complete request head within --timeout");
    drop(f, c); /* kept alive and idle */
}

/* Room for one more connection: the one that has waited longest for its request goes. 0 = none could. */
static int evict(srv_front *f) {
    fconn *o = oldest(f, 0, 1);
    if (!o) return 0;
    if (o->state == C_HEAD && !o->fresh && !o->in_len) drop(f, o); /* idle between requests: just closed */
    else refuse(f, o, 503, "the server is at --max-connections: this connection waited longest for its request");
    OSP_LOG(2, "osprey serve: at --max-connections: closed the connection that waited longest");
    return 1;
}

static int same_client(srv_front *f, const struct sockaddr *a) {
    int n = 0;
    for (int i = 0; i < f->n; i++)
        n += live(f->c[i]) && srv_same_host((const struct sockaddr *)&f->c[i]->addr, a);
    return n;
}

static void on_accept(srv_front *f) {
    const srv_limits *L = &f->s->limits;
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(f->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) { /* out of descriptors: a lingering close ends, or an eviction */
                fconn *o = oldest(f, C_CLOSING, 0);
                if (o) drop(f, o);
                else if (!evict(f)) {
                    OSP_LOG(0, "osprey serve: out of file descriptors");
                    return;
                }
                continue;
            }
            return;
        }
        /* a fixed send buffer: a reader that stops holds at most this much of the kernel's memory, and is
         * found stalled (--write-timeout) once it is full, not after the buffer has grown to megabytes */
        int sndbuf = SNDBUF;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        fconn *c = calloc(1, sizeof *c);
        if (c && f->n == f->cap) {
            fconn **p = realloc(f->c, sizeof *p * (size_t)(f->cap * 2));
            if (p) f->c = p, f->cap *= 2;
        }
        if (!c || f->n == f->cap) {
            free(c);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->addr = a;
        c->addr_len = al;
        c->fresh = 1;
        c->state = C_HEAD;
        c->since = osp_now_s();
        c->deadline = c->since + L->head_timeout;
        /* over its client's cap: refused (no eviction for it); at the limit: room is made, or it is refused */
        int over = L->per_client > 0 && same_client(f, (const struct sockaddr *)&a) >= L->per_client;
        int full = !over && f->n_live >= L->max_connections && !evict(f);
        f->c[f->n++] = c;
        f->n_live++;
        if (over) refuse(f, c, 503, "too many connections from this client");
        else if (full) refuse(f, c, 503, "the server is at --max-connections; try again");
    }
}

static void *front_main(void *arg) {
    srv_front *f = arg;
    struct pollfd *pf = NULL;
    fconn **pc = NULL;
    int pcap = 0;
    pthread_mutex_lock(&f->mu);
    while (!f->stop) {
        double now = osp_now_s(), next = now + 3600;
        for (int i = 0; i < f->n; i++) { /* handlers done; deadlines */
            fconn *c = f->c[i];
            if (c->state == C_BUSY && c->returned) on_returned(f, c);
            if (c->state != C_BUSY && c->state != C_DEAD && c->deadline <= now) on_deadline(f, c);
        }
        for (int i = 0; i < f->n;) { /* the dead go */
            if (f->c[i]->state == C_DEAD) {
                free_conn(f->c[i]);
                f->c[i] = f->c[--f->n];
            } else {
                i++;
            }
        }
        if (pcap < f->n + 2) {
            pcap = f->cap + 2;
            free(pf), free(pc);
            pf = malloc(sizeof *pf * (size_t)pcap);
            pc = malloc(sizeof *pc * (size_t)pcap);
            if (!pf || !pc) {
                pcap = 0;
                pthread_mutex_unlock(&f->mu);
                usleep(10000);
                pthread_mutex_lock(&f->mu);
                continue;
            }
        }
        int np = 0;
        pf[np++] = (struct pollfd){.fd = f->wake[0], .events = POLLIN};
        pf[np++] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
        for (int i = 0; i < f->n; i++) {
            fconn *c = f->c[i];
            if (c->state == C_BUSY) continue;
            if (c->deadline < next) next = c->deadline;
            pc[np] = c;
            pf[np++] = (struct pollfd){.fd = c->fd, .events = POLLIN};
        }
        int ms = (int)((next - now) * 1000) + 1;
        pthread_mutex_unlock(&f->mu);
        int r = poll(pf, (nfds_t)np, ms);
        pthread_mutex_lock(&f->mu);
        if (r <= 0) continue;
        if (pf[0].revents) {
            char sink[64];
            while (read(f->wake[0], sink, sizeof sink) > 0) {}
        }
        for (int i = 2; i < np; i++)
            if (pf[i].revents && pc[i]->state != C_DEAD && pc[i]->state != C_BUSY) on_readable(f, pc[i]);
        if (pf[1].revents & POLLIN) on_accept(f);
    }
    pthread_mutex_unlock(&f->mu);
    free(pf), free(pc);
    return NULL;
}

static void *handler_main(void *arg) {
    fconn *c = arg;
    srv_front *f = c->f;
    srv_http_handle(f->s, &c->req);
    pthread_mutex_lock(&f->mu);
    c->keep = c->req.status > 0 && !c->req.close_after && !c->req.failed;
    c->returned = 1;
    f->threads--;
    pthread_cond_broadcast(&f->cv);
    wake(f);
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int srv_front_start(srv *s, srv_front **out) {
    const osp_serve_config *c = &s->cfg;
    *out = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    if (getaddrinfo(c->host, port, &hints, &ai) || !ai) {
        fprintf(stderr, "osprey serve: cannot resolve host '%s'\n", c->host);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
        fprintf(stderr, "osprey serve: cannot listen on %s:%d (%s)\n", c->host, c->port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    int bound = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port : ((struct sockaddr_in *)&a)->sin_port);
    srv_front *f = calloc(1, sizeof *f);
    if (!f || pipe2(f->wake, O_CLOEXEC | O_NONBLOCK)) {
        free(f);
        close(fd);
        return -1;
    }
    f->s = s;
    f->lfd = fd;
    f->cap = 256;
    f->c = calloc((size_t)f->cap, sizeof *f->c);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (!f->c || pthread_create(&f->thr, NULL, front_main, f)) {
        close(f->wake[0]), close(f->wake[1]), close(fd);
        free(f->c);
        free(f);
        return -1;
    }
    fprintf(stderr, "osprey serve: listening on http://%s%s%s:%d\n", strchr(c->host, ':') ? "[" : "", c->host,
            strchr(c->host, ':') ? "]" : "", bound);
    *out = f;
    return 0;
}

int srv_front_stop(srv_front *f, double grace_s) {
    if (!f) return 0;
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    wake(f);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->thr, NULL);
    close(f->lfd);
    pthread_mutex_lock(&f->mu);
    /* responses still being written are cut: their threads see the socket shut and end */
    for (int i = 0; i < f->n; i++)
        if (f->c[i]->state == C_BUSY && !f->c[i]->returned) shutdown(f->c[i]->fd, SHUT_RDWR);
    double until = osp_now_s() + grace_s;
    while (f->threads > 0) {
        double left = until - osp_now_s();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)(left * 1e9);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
    int left = f->threads;
    pthread_mutex_unlock(&f->mu);
    if (left) return left; /* a handler that cannot be interrupted (a transcription): the process ends with it */
    for (int i = 0; i < f->n; i++) {
        fconn *c = f->c[i];
        if (c->state == C_BODY || (c->state == C_HEAD && c->in_len)) /* a request on its way: told why */
            send_error(c->fd, 503, "the server is shutting down", c->state == C_BODY ? c->req.path : NULL);
        if (c->fd >= 0) close(c->fd);
        free_conn(c);
    }
    free(f->c);
    close(f->wake[0]), close(f->wake[1]);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    return 0;
}
