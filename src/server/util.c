/* server/util: byte buffers, lossy JSON strings, ids, error bodies. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "server/server_internal.h"

int srv_buf_add(srv_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int srv_buf_addf(srv_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof tmp) return srv_buf_add(b, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = srv_buf_add(b, big, (size_t)n);
    free(big);
    return rc;
}

void srv_buf_free(srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int dump_cb(const char *buffer, size_t size, void *data) { return srv_buf_add(data, buffer, size); }

int srv_buf_add_json(srv_buf *b, const json_t *v) {
    return json_dump_callback(v, dump_cb, b, JSON_COMPACT);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned min;
    if ((c & 0xE0) == 0xC0) k = 2, min = 0x80;
    else if ((c & 0xF0) == 0xE0) k = 3, min = 0x800;
    else if ((c & 0xF8) == 0xF0) k = 4, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    unsigned cp = c & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

int srv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

json_t *srv_json_string_lossy(const char *s, size_t n) {
    if (srv_utf8_valid(s, n)) return json_stringn(s, n);
    srv_buf b = {0};
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(u + i, n - i);
        if (k) srv_buf_add(&b, s + i, k), i += k;
        else srv_buf_add(&b, "\xEF\xBF\xBD", 3), i++;
    }
    json_t *j = json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return j;
}

int srv_buf_add_json_string(srv_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    int bad = srv_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n && !bad;) {
        unsigned c = u[i];
        size_t k = utf8_seq(u + i, n - i);
        if (!k) { /* invalid UTF-8: U+FFFD */
            bad |= srv_buf_add(b, "\xEF\xBF\xBD", 3);
            i++;
        } else if (k > 1) {
            bad |= srv_buf_add(b, s + i, k);
            i += k;
        } else {
            if (c == '"' || c == '\\') {
                char e[2] = {'\\', (char)c};
                bad |= srv_buf_add(b, e, 2);
            } else if (c < 0x20 || c == 0x7f) {
                char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                bad |= srv_buf_add(b, e, 6);
            } else {
                bad |= srv_buf_add(b, s + i, 1);
            }
            i++;
        }
    }
    return bad | srv_buf_add(b, "\"", 1);
}

int srv_same_host(const struct sockaddr *a, const struct sockaddr *b) {
    if (a->sa_family != b->sa_family) return 0;
    if (a->sa_family == AF_INET)
        return !memcmp(&((const struct sockaddr_in *)a)->sin_addr, &((const struct sockaddr_in *)b)->sin_addr, 4);
    if (a->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return 1;
}

const char *srv_status_text(int status) {
    switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 499: return "Client Closed Request";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

void srv_make_id(char *out, size_t cap, const char *prefix) {
    static atomic_ullong counter;
    static __thread unsigned long long x;
    if (!x) x = (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid() ^
                (unsigned long long)(uintptr_t)&x;
    x += 0x9E3779B97F4A7C15ull + atomic_fetch_add(&counter, 1);
    unsigned long long z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    snprintf(out, cap, "%s-%016llx%08llx", prefix, z, (unsigned long long)(atomic_load(&counter) & 0xffffffffu));
}

const char *srv_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 408: return "timeout_error";
    case 501: return "not_implemented_error";
    case 413: return "invalid_request_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

json_t *srv_error_json(int status, const char *message, const char *param) {
    json_t *e = json_object();
    json_object_set_new(e, "message", srv_json_string_lossy(message, strlen(message)));
    json_object_set_new(e, "type", json_string(srv_error_type(status)));
    json_object_set_new(e, "code", json_integer(status));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

json_t *srv_json_get(const json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

int srv_sse_event(srv_buf *b, const char *name, json_t *o) {
    int bad = !o || srv_buf_addf(b, "event: %s\ndata: ", name) || srv_buf_add_json(b, o) || srv_buf_add(b, "\n\n", 2);
    json_decref(o);
    return bad ? -1 : 0;
}

const char *srv_json_type(const json_t *o) {
    json_t *t = json_is_object(o) ? json_object_get(o, "type") : NULL;
    return json_is_string(t) ? json_string_value(t) : NULL;
}
