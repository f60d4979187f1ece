/* server/multipart.c: multipart/form-data (see multipart.h). */
#define _GNU_SOURCE
#include "server/multipart.h"
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The boundary parameter of a Content-Type value, into out (1..70 chars). */
static int boundary_of(const char *ct, char *out, size_t cap) {
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "multipart/form-data", 19) != 0) return -1;
    const char *p = strcasestr(ct, "boundary=");
    if (!p) return -1;
    p += 9;
    size_t n = 0;
    if (*p == '"') {
        p++;
        while (p[n] && p[n] != '"') n++;
        if (p[n] != '"') return -1;
    } else {
        while (p[n] && p[n] != ';' && p[n] != ' ') n++;
    }
    if (n < 1 || n > 70 || n + 1 > cap) return -1;
    memcpy(out, p, n);
    out[n] = 0;
    return 0;
}

/* The value of param (name= / filename=) in a Content-Disposition value of
 * length n, quoted or not; -1 when absent or too long. */
static int param(const char *v, size_t n, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl < n; i++) {
        if (strncasecmp(v + i, key, kl) != 0 || (i && v[i - 1] != ' ' && v[i - 1] != ';')) continue;
        const char *p = v + i + kl, *e = v + n;
        size_t k = 0;
        if (p < e && *p == '"') {
            p++;
            while (p + k < e && p[k] != '"') {
                if (p[k] == '\\' && p + k + 1 < e) k++;
                k++;
            }
            if (p + k >= e) return -1;
        } else {
            while (p + k < e && p[k] != ';' && p[k] != ' ') k++;
        }
        if (k + 1 > cap) return -1;
        memcpy(out, p, k);
        out[k] = 0;
        return 0;
    }
    return -1;
}

int srv_multipart_parse(const char *ct, const char *body, size_t len, srv_form *f, const char **err) {
    char b[80], delim[84];
    f->n = 0;
    if (!ct || boundary_of(ct, b, sizeof b)) {
        *err = "the body must be multipart/form-data with a boundary";
        return -1;
    }
    size_t dl = (size_t)snprintf(delim, sizeof delim, "\r\n--%s", b);
    /* the first delimiter: at the very start (no CRLF before it) or after a preamble */
    const char *p;
    if (len >= dl - 2 && !memcmp(body, delim + 2, dl - 2)) p = body + dl - 2;
    else {
        p = memmem(body, len, delim, dl);
        if (!p) {
            *err = "the multipart body has no part";
            return -1;
        }
        p += dl;
    }
    const char *end = body + len;
    for (;;) {
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return 0; /* the closing delimiter */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') break;
        p += 2;
        const char *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) break;
        if (f->n == SRV_MAX_PARTS) {
            *err = "too many parts in the multipart body";
            return -1;
        }
        srv_part *pt = &f->parts[f->n];
        memset(pt, 0, sizeof *pt);
        int named = 0;
        for (const char *h = p; h < hend;) {
            const char *he = memmem(h, (size_t)(hend - h), "\r\n", 2);
            if (!he) he = hend;
            size_t hl = (size_t)(he - h);
            if (hl > 20 && !strncasecmp(h, "Content-Disposition:", 20)) {
                if (!param(h + 20, hl - 20, "name=", f->names[f->n][0], sizeof f->names[f->n][0])) {
                    pt->name = f->names[f->n][0];
                    named = 1;
                }
                if (!param(h + 20, hl - 20, "filename=", f->names[f->n][1], sizeof f->names[f->n][1]))
                    pt->filename = f->names[f->n][1];
            }
            h = he + 2;
        }
        if (!named) {
            *err = "a multipart part has no Content-Disposition name";
            return -1;
        }
        const char *data = hend + 4;
        const char *next = memmem(data, (size_t)(end - data), delim, dl);
        if (!next) break;
        pt->data = data;
        pt->len = (size_t)(next - data);
        f->n++;
        p = next + dl;
    }
    *err = "the multipart body is truncated or malformed";
    return -1;
}

const srv_part *srv_form_get(const srv_form *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (f->parts[i].name && !strcmp(f->parts[i].name, name)) return &f->parts[i];
    return NULL;
}
