/* server/front: the listening socket, and each connection until its first
 * request head is complete.
 *
 * One thread accepts connections and holds them in a poll set (no thread per
 * connection) while it peeks (MSG_PEEK: nothing is consumed) at what they
 * send. A connection whose head is complete and passes srv_head_check goes
 * to libmicrohttpd (MHD_add_connection), which reads the request from the
 * start. Everything else is answered here, in the API's JSON error shape:
 *   - a malformed head (400, 414, 431, 501, 505);
 *   - no complete head within --timeout seconds of connecting (408);
 *   - more than --max-connections-per-client connections from one address
 *     waiting here, or libmicrohttpd full (503).
 * When the waiting set is full, the connection that has waited longest is
 * closed to make room: idle connections can never lock new clients out.
 * Refused connections are closed gracefully (our side shut down, then what
 * the client still sends is read and dropped for up to a second), so the
 * error reaches a client that is still writing its body. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "server/head.h"
#include "server/server_internal.h"

#define HEAD_MAX (32 * 1024)
#define URI_MAX (8 * 1024)

typedef struct pending {
    int fd;
    int closing;             /* refused: draining input until EOF or the deadline */
    double deadline;
    size_t peeked;           /* bytes seen so far (poll wakes for more only) */
    struct sockaddr_storage addr;
    socklen_t addr_len;
} pending;

struct srv_front {
    srv *s;
    struct MHD_Daemon *d;
    int lfd;
    int wake[2];
    pthread_t thr;
    pending *p;
    int n, cap;
    char buf[HEAD_MAX];
};

static void drop(srv_front *f, int i) {
    close(f->p[i].fd);
    f->p[i] = f->p[--f->n];
}

/* Answer with a JSON error and start a graceful close. */
static void refuse(srv_front *f, int i, int status, const char *msg) {
    pending *c = &f->p[i];
    json_t *e = srv_error_json(status, msg, NULL);
    char *body = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      status, srv_status_text(status), body ? strlen(body) + 1 : 0);
    (void)!send(c->fd, head, (size_t)hn, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (body) {
        (void)!send(c->fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)!send(c->fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    free(body);
    shutdown(c->fd, SHUT_WR);
    int one = 1;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    c->closing = 1;
    c->deadline = osp_now_s() + 1.0;
    OSP_LOG(2, "osprey serve: refused a connection: %d %s", status, msg);
}

/* Hand a connection with a good head to libmicrohttpd (or refuse it with a
 * 503 when libmicrohttpd is at its limits: it would drop it silently). */
static void hand_over(srv_front *f, int i) {
    srv *s = f->s;
    pthread_mutex_lock(&s->conn_mu);
    int full = s->n_conn >= s->limits.max_connections;
    pthread_mutex_unlock(&s->conn_mu);
    if (full) return refuse(f, i, 503, "the server is at --max-connections; try again");
    if (s->limits.per_client > 0 &&
        srv_conns_from(s, (const struct sockaddr *)&f->p[i].addr) >= s->limits.per_client)
        return refuse(f, i, 503, "too many connections from this client");
    pending c = f->p[i];
    f->p[i] = f->p[--f->n];
    int one = 1;
    setsockopt(c.fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    if (MHD_add_connection(f->d, c.fd, (const struct sockaddr *)&c.addr, c.addr_len) != MHD_YES) {
        /* libmicrohttpd closed it (its connection limit, or out of resources) */
        OSP_LOG(1, "osprey serve: a connection was dropped: the server is at --max-connections");
    }
}

static void on_readable(srv_front *f, int i) {
    pending *c = &f->p[i];
    if (c->closing) {
        char sink[4096];
        ssize_t r = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) drop(f, i);
        return;
    }
    ssize_t r = recv(c->fd, f->buf, sizeof f->buf, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { /* gone before a whole head */
        drop(f, i);
        return;
    }
    if (r < 0) return;
    srv_head h;
    int rc = srv_head_check(f->buf, (size_t)r, HEAD_MAX, URI_MAX, &h);
    if (rc > 0) {
        hand_over(f, i);
    } else if (rc < 0) {
        refuse(f, i, h.status, h.msg);
    } else { /* wake again only when more than this has arrived */
        c->peeked = (size_t)r;
        int low = (int)r + 1;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low);
    }
}

static void on_accept(srv_front *f) {
    const srv_limits *L = &f->s->limits;
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(f->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) { /* out of descriptors: make room */
                if (f->n) {
                    int oldest = 0;
                    for (int k = 1; k < f->n; k++)
                        if (f->p[k].deadline < f->p[oldest].deadline) oldest = k;
                    drop(f, oldest);
                    continue;
                }
                OSP_LOG(0, "osprey serve: out of file descriptors");
            }
            return;
        }
        if (f->n == f->cap) { /* full: the longest-waiting connection goes */
            int oldest = 0;
            for (int k = 1; k < f->n; k++)
                if (f->p[k].deadline < f->p[oldest].deadline) oldest = k;
            OSP_LOG(2, "osprey serve: %d connections are waiting for a request head: closing the oldest", f->n);
            drop(f, oldest);
        }
        pending *c = &f->p[f->n];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->addr = a;
        c->addr_len = al;
        c->deadline = osp_now_s() + L->head_timeout;
        f->n++;
        if (L->per_client > 0) {
            int same = 0;
            for (int k = 0; k < f->n; k++) same += !f->p[k].closing && srv_same_host((const struct sockaddr *)&f->p[k].addr, (const struct sockaddr *)&a);
            same += srv_conns_from(f->s, (const struct sockaddr *)&a);
            if (same > L->per_client) refuse(f, f->n - 1, 503, "too many connections from this client");
        }
    }
}

static void *front_main(void *arg) {
    srv_front *f = arg;
    struct pollfd *pf = malloc(sizeof *pf * (size_t)(f->cap + 2));
    if (!pf) return NULL;
    for (;;) {
        double now = osp_now_s(), next = now + 3600;
        for (int i = 0; i < f->n;) { /* deadlines */
            if (f->p[i].deadline <= now) {
                if (f->p[i].closing) drop(f, i);
                else refuse(f, i, 408, "no complete request head within --timeout");
                continue;
            }
            if (f->p[i].deadline < next) next = f->p[i].deadline;
            i++;
        }
        pf[0] = (struct pollfd){.fd = f->wake[0], .events = POLLIN};
        pf[1] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
        for (int i = 0; i < f->n; i++) pf[i + 2] = (struct pollfd){.fd = f->p[i].fd, .events = POLLIN};
        int n_fds = f->n + 2, ms = (int)((next - now) * 1000) + 1;
        int r = poll(pf, (nfds_t)n_fds, ms);
        if (r < 0) continue;
        if (pf[0].revents) break;
        /* connections first (their indices move as they leave), from the end */
        for (int i = n_fds - 1; i >= 2; i--)
            if (pf[i].revents && i - 2 < f->n && f->p[i - 2].fd == pf[i].fd) on_readable(f, i - 2);
        if (pf[1].revents & POLLIN) on_accept(f);
    }
    free(pf);
    return NULL;
}

int srv_front_start(srv *s, struct MHD_Daemon *d, srv_front **out) {
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
    if (!f || pipe2(f->wake, O_CLOEXEC)) {
        free(f);
        close(fd);
        return -1;
    }
    f->s = s;
    f->d = d;
    f->lfd = fd;
    f->cap = s->limits.max_connections;
    f->p = calloc((size_t)f->cap, sizeof *f->p);
    if (!f->p || pthread_create(&f->thr, NULL, front_main, f)) {
        close(f->wake[0]), close(f->wake[1]), close(fd);
        free(f->p);
        free(f);
        return -1;
    }
    fprintf(stderr, "osprey serve: listening on http://%s%s%s:%d\n", strchr(c->host, ':') ? "[" : "", c->host,
            strchr(c->host, ':') ? "]" : "", bound);
    *out = f;
    return 0;
}

void srv_front_stop(srv_front *f) {
    if (!f) return;
    (void)!write(f->wake[1], "x", 1);
    pthread_join(f->thr, NULL);
    for (int i = 0; i < f->n; i++) close(f->p[i].fd);
    close(f->lfd);
    close(f->wake[0]), close(f->wake[1]);
    free(f->p);
    free(f);
}
