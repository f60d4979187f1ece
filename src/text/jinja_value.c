/* text/jinja values: arena, buffers, errors, conversions from JSON, and the
 * Python behaviour of values: str(), repr(), json.dumps, ==, <, len, in,
 * iteration, attribute/item access under the sandbox, arithmetic.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "text/jinja_internal.h"

/* ------------------------------------------------------------------ arena */

struct jchunk {
    jchunk *next;
    size_t used, cap, pad_;
    char data[];
};

#define CHUNK_BYTES ((size_t)64 << 10)

void ja_init(jarena *a, size_t limit) {
    memset(a, 0, sizeof *a);
    a->limit = limit;
}

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jchunk *c = a->head;
    if (c && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        memset(p, 0, n);
        return p;
    }
    size_t cap = n > CHUNK_BYTES / 4 ? n : CHUNK_BYTES;
    size_t bytes = sizeof(jchunk) + cap;
    if (bytes < n || a->used + bytes > a->limit) { a->over = 1; return NULL; }
    jchunk *nc = osp_malloc(OSP_POOL_MISC, bytes);
    if (!nc) { a->over = 0; return NULL; }
    a->used += bytes;
    nc->cap = cap;
    nc->used = n;
    if (c && cap != CHUNK_BYTES) { /* a big one: keep filling the current chunk */
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    memset(nc->data, 0, n);
    return nc->data;
}

void ja_free(jarena *a) {
    jchunk *c = a->head;
    while (c) {
        jchunk *n = c->next;
        osp_free(c);
        c = n;
    }
    a->head = NULL;
    a->used = 0;
}

/* ------------------------------------------------------------------ errors */

osp_status jerr(jstate *st, osp_status code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return osp_err(code, "template error (line %u): %s", st->line, msg);
}

osp_status jerr_alloc(jstate *st) {
    if (st->a.over)
        return jerr(st, OSP_ERR_RANGE, "rendering used more than the memory limit (%zu MiB)", st->a.limit >> 20);
    return jerr(st, OSP_ERR_NOMEM, "out of memory");
}

void *jalloc(jstate *st, size_t n) { return ja_alloc(&st->a, n); }

/* ------------------------------------------------------------------ buffers */

osp_status jbuf_put(jstate *st, jbuf *b, const char *s, size_t n) {
    if (n > st->max_output || b->n + n > st->max_output)
        return jerr(st, OSP_ERR_RANGE, "output exceeds the limit of %zu bytes", st->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        if (st->a.used + nc > st->a.limit) { st->a.over = 1; return jerr_alloc(st); }
        char *p = osp_malloc(OSP_POOL_MISC, nc);
        if (!p) { st->a.over = 0; return jerr_alloc(st); }
        if (b->n) memcpy(p, b->p, b->n);
        osp_free(b->p);
        st->a.used += nc - b->cap;
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return OSP_OK;
}

osp_status jbuf_putc(jstate *st, jbuf *b, char c) { return jbuf_put(st, b, &c, 1); }

osp_status jbuf_printf(jstate *st, jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return jerr(st, OSP_ERR_INTERNAL, "formatting failed");
    return jbuf_put(st, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

void jbuf_free(jstate *st, jbuf *b) {
    if (b->p) {
        osp_free(b->p);
        st->a.used -= b->cap;
    }
    memset(b, 0, sizeof *b);
}

osp_status jbuf_take(jstate *st, jbuf *b, jv *out) {
    char *s = jalloc(st, b->n + 1);
    if (!s) { jbuf_free(st, b); return jerr_alloc(st); }
    if (b->n) memcpy(s, b->p, b->n);
    *out = jv_strn(s, b->n);
    jbuf_free(st, b);
    return OSP_OK;
}

/* ------------------------------------------------------------------ containers */

osp_status jv_str_copy(jstate *st, const char *s, size_t n, jv *out) {
    char *p;
    JALLOC(st, p, n + 1);
    if (n) memcpy(p, s, n);
    *out = jv_strn(p, n);
    return OSP_OK;
}

osp_status jv_concat2(jstate *st, jv a, jv b, jv *out) {
    if ((uint64_t)a.n + b.n > st->max_output)
        return jerr(st, OSP_ERR_RANGE, "string longer than the output limit (%zu bytes)", st->max_output);
    if (!b.n) { *out = a; out->safe = 0; return OSP_OK; }
    if (!a.n) { *out = b; out->safe = 0; return OSP_OK; }
    char *p;
    JALLOC(st, p, (size_t)a.n + b.n + 1);
    memcpy(p, a.u.s, a.n);
    memcpy(p + a.n, b.u.s, b.n);
    *out = jv_strn(p, (size_t)a.n + b.n);
    return OSP_OK;
}

osp_status jlist_new(jstate *st, uint32_t cap, jlist **out) {
    jlist *l;
    JALLOC(st, l, sizeof *l);
    if (cap) JALLOC(st, l->v, cap * sizeof *l->v);
    l->cap = cap;
    *out = l;
    return OSP_OK;
}

osp_status jlist_push(jstate *st, jlist *l, jv v) {
    if (l->n == l->cap) {
        if (l->cap >= (1u << 30)) return jerr(st, OSP_ERR_RANGE, "list too long");
        uint32_t nc = l->cap ? l->cap * 2 : 4;
        jv *a;
        JALLOC(st, a, nc * sizeof *a);
        if (l->n) memcpy(a, l->v, l->n * sizeof *a);
        l->v = a;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return OSP_OK;
}

osp_status jdict_new(jstate *st, uint32_t cap, jdict **out) {
    jdict *d;
    JALLOC(st, d, sizeof *d);
    if (cap) {
        JALLOC(st, d->k, cap * sizeof *d->k);
        JALLOC(st, d->v, cap * sizeof *d->v);
    }
    d->cap = cap;
    *out = d;
    return OSP_OK;
}

static int64_t jdict_index(const jdict *d, jv k) {
    if (k.k == JK_STR) {
        for (uint32_t i = 0; i < d->n; i++)
            if (d->k[i].k == JK_STR && d->k[i].n == k.n && !memcmp(d->k[i].u.s, k.u.s, k.n)) return i;
        return -1;
    }
    for (uint32_t i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) return i;
    return -1;
}

osp_status jdict_set(jstate *st, jdict *d, jv k, jv v) {
    int64_t i = jdict_index(d, k);
    if (i >= 0) { d->v[i] = v; return OSP_OK; }
    if (d->n == d->cap) {
        if (d->cap >= (1u << 30)) return jerr(st, OSP_ERR_RANGE, "dict too large");
        uint32_t nc = d->cap ? d->cap * 2 : 4;
        jv *nk, *nv;
        JALLOC(st, nk, nc * sizeof *nk);
        JALLOC(st, nv, nc * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    k.safe = 0;
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return OSP_OK;
}

int jdict_get(const jdict *d, jv k, jv *out) {
    int64_t i = jdict_index(d, k);
    if (i < 0) return 0;
    *out = d->v[i];
    return 1;
}

int jdict_find_str(const jdict *d, const char *s, size_t n, jv *out) {
    return jdict_get(d, jv_strn(s, n), out);
}

static osp_status from_json(jstate *st, const json_t *j, jv *out, int depth) {
    if (depth > 512) return jerr(st, OSP_ERR_RANGE, "input JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d;
        OSP_TRY(jdict_new(st, (uint32_t)json_object_size(j), &d));
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            jv v;
            OSP_TRY(from_json(st, val, &v, depth + 1));
            /* keys are unique in a jansson object: append without a lookup */
            d->k[d->n] = jv_strn(key, strlen(key));
            d->v[d->n] = v;
            d->n++;
        }
        *out = jv_dict(d);
        return OSP_OK;
    }
    case JSON_ARRAY: {
        jlist *l;
        OSP_TRY(jlist_new(st, (uint32_t)json_array_size(j), &l));
        for (size_t i = 0; i < json_array_size(j); i++) {
            OSP_TRY(from_json(st, json_array_get(j, i), &l->v[i], depth + 1));
            l->n++;
        }
        *out = jv_list(l, 0);
        return OSP_OK;
    }
    case JSON_STRING:
        if (json_string_length(j) > UINT32_MAX) return jerr(st, OSP_ERR_RANGE, "input string too long");
        *out = jv_strn(json_string_value(j), json_string_length(j));
        return OSP_OK;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return OSP_OK;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return OSP_OK;
    case JSON_TRUE: *out = jv_bool(1); return OSP_OK;
    case JSON_FALSE: *out = jv_bool(0); return OSP_OK;
    default: *out = jv_none(); return OSP_OK;
    }
}

osp_status jv_from_json(jstate *st, const json_t *j, jv *out) { return from_json(st, j, out, 0); }

/* ------------------------------------------------------------------ undefined */

osp_status jv_undef_msg(jstate *st, jv *out, int security, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jv s;
    OSP_TRY(jv_str_copy(st, msg, strlen(msg), &s));
    *out = jv_undef(security ? JUR_SECURITY : JUR_TEXT, s.u.s, s.n, 0);
    return OSP_OK;
}

osp_status jv_undef_name(jstate *st, jstr name, jv *out) {
    (void)st;
    *out = jv_undef(JUR_NAME, name.s, name.n, 0);
    return OSP_OK;
}

static const char *obj_type_repr(int kind) {
    switch (kind) {
    case JK_NONE: return "None";
    case JK_NS: return "jinja2.utils.Namespace object";
    case JK_LOOP: return "jinja2.runtime.LoopContext object";
    case JK_MACRO: return "jinja2.runtime.Macro object";
    case JK_STR: return "str object";
    case JK_INT: return "int object";
    case JK_FLOAT: return "float object";
    case JK_BOOL: return "bool object";
    case JK_LIST: return "list object";
    case JK_TUPLE: return "tuple object";
    case JK_DICT: return "dict object";
    default: return "object";
    }
}

osp_status jv_undef_attr(jstate *st, jv obj, jstr name, jv *out) {
    (void)st;
    *out = jv_undef(JUR_ATTR, name.s, name.n, obj.k);
    return OSP_OK;
}

osp_status jv_undef_item(jstate *st, jv obj, jv key, jv *out) {
    if (key.k == JK_STR) return jv_undef_attr(st, obj, (jstr){key.u.s, key.n}, out);
    jbuf b = {0};
    osp_status rc = jv_write_repr(st, &b, key);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    rc = jv_undef_msg(st, out, 0, "%s has no element %.*s", obj_type_repr(obj.k), (int)(b.n > 200 ? 200 : b.n), b.p);
    jbuf_free(st, &b);
    return rc;
}

void jundef_describe(jv v, char *buf, size_t n) {
    int len = (int)(v.n > 300 ? 300 : v.n);
    switch (v.pad_) {
    case JUR_NAME: snprintf(buf, n, "'%.*s' is undefined", len, v.u.s); break;
    case JUR_ATTR: snprintf(buf, n, "'%s' has no attribute '%.*s'", obj_type_repr(v.safe), len, v.u.s); break;
    case JUR_PARAM: snprintf(buf, n, "parameter '%.*s' was not provided", len, v.u.s); break;
    case JUR_COND:
        snprintf(buf, n, "the inline if-expression on line %u evaluated to false and no else section was defined.", v.n);
        break;
    case JUR_TEXT: snprintf(buf, n, "%.*s", len, v.u.s); break;
    case JUR_SECURITY: snprintf(buf, n, "SecurityError: %.*s", len, v.u.s); break;
    default: snprintf(buf, n, "value is undefined"); break;
    }
}

osp_status jundef_fail(jstate *st, jv v) {
    char msg[512];
    jundef_describe(v, msg, sizeof msg);
    return jerr(st, OSP_ERR_INVALID, "%s", msg);
}

/* ------------------------------------------------------------------ Python behaviour */

const char *jv_type_name(jv v) {
    switch (v.k) {
    case JK_UNDEF: return "Undefined";
    case JK_NONE: return "NoneType";
    case JK_BOOL: return "bool";
    case JK_INT: return "int";
    case JK_FLOAT: return "float";
    case JK_STR: return "str";
    case JK_LIST: return "list";
    case JK_TUPLE: return "tuple";
    case JK_DICT: return "dict";
    case JK_NS: return "Namespace";
    case JK_MACRO: return "Macro";
    case JK_FUNC: return "function";
    case JK_METHOD: return "builtin_function_or_method";
    case JK_LOOP: return "LoopContext";
    default: return "object";
    }
}

int jv_truthy(jv v) {
    switch (v.k) {
    case JK_UNDEF: case JK_NONE: case JK_ABSENT: return 0;
    case JK_BOOL: case JK_INT: return v.u.i != 0;
    case JK_FLOAT: return v.u.d != 0.0;
    case JK_STR: return v.n != 0;
    case JK_LIST: case JK_TUPLE: return v.u.l->n != 0;
    case JK_DICT: return v.u.m->n != 0;
    default: return 1;
    }
}

static double num_d(jv v) { return v.k == JK_FLOAT ? v.u.d : (double)v.u.i; }

int jv_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.k != JK_FLOAT && b.k != JK_FLOAT) return a.u.i == b.u.i;
        return num_d(a) == num_d(b);
    }
    if (a.k != b.k) return 0;
    switch (a.k) {
    case JK_UNDEF: case JK_NONE: return 1;
    case JK_STR: return a.n == b.n && !memcmp(a.u.s, b.u.s, a.n);
    case JK_LIST: case JK_TUPLE:
        if (a.u.l == b.u.l) return 1;
        if (a.u.l->n != b.u.l->n) return 0;
        for (uint32_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case JK_DICT:
        if (a.u.m == b.u.m) return 1;
        if (a.u.m->n != b.u.m->n) return 0;
        for (uint32_t i = 0; i < a.u.m->n; i++) {
            jv o;
            if (!jdict_get(b.u.m, a.u.m->k[i], &o) || !jv_eq(a.u.m->v[i], o)) return 0;
        }
        return 1;
    case JK_NS: return a.u.m == b.u.m;
    case JK_MACRO: return a.u.mac == b.u.mac;
    case JK_FUNC: return a.u.fn == b.u.fn;
    case JK_METHOD: return a.u.meth == b.u.meth;
    case JK_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

osp_status jv_cmp(jstate *st, jv a, jv b, const char *op, int *res) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.k != JK_FLOAT && b.k != JK_FLOAT) *res = a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        else {
            double x = num_d(a), y = num_d(b);
            *res = x < y ? -1 : x > y;
        }
        return OSP_OK;
    }
    if (a.k == JK_STR && b.k == JK_STR) {
        size_t n = a.n < b.n ? a.n : b.n;
        int c = memcmp(a.u.s, b.u.s, n);
        *res = c < 0 ? -1 : c > 0 ? 1 : a.n < b.n ? -1 : a.n > b.n;
        return OSP_OK;
    }
    if (a.k == b.k && (a.k == JK_LIST || a.k == JK_TUPLE)) {
        uint32_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (uint32_t i = 0; i < n; i++) {
            if (jv_eq(a.u.l->v[i], b.u.l->v[i])) continue;
            return jv_cmp(st, a.u.l->v[i], b.u.l->v[i], op, res);
        }
        *res = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return OSP_OK;
    }
    if (a.k == JK_UNDEF) return jundef_fail(st, a);
    if (b.k == JK_UNDEF) return jundef_fail(st, b);
    return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' not supported between instances of '%s' and '%s'", op,
                jv_type_name(a), jv_type_name(b));
}

osp_status jv_len(jstate *st, jv v, int64_t *n) {
    switch (v.k) {
    case JK_UNDEF: *n = 0; return OSP_OK;
    case JK_STR: *n = (int64_t)ju_count(v.u.s, v.n); return OSP_OK;
    case JK_LIST: case JK_TUPLE: *n = v.u.l->n; return OSP_OK;
    case JK_DICT: *n = v.u.m->n; return OSP_OK;
    default:
        return jerr(st, OSP_ERR_INVALID, "TypeError: object of type '%s' has no len()", jv_type_name(v));
    }
}

osp_status jv_iter(jstate *st, jv v, const jv **items, uint32_t *n) {
    switch (v.k) {
    case JK_UNDEF: *items = NULL; *n = 0; return OSP_OK;
    case JK_LIST: case JK_TUPLE: *items = v.u.l->v; *n = v.u.l->n; return OSP_OK;
    case JK_DICT: *items = v.u.m->k; *n = v.u.m->n; return OSP_OK;
    case JK_STR: {
        size_t c = ju_count(v.u.s, v.n);
        jv *a;
        JALLOC(st, a, (c + 1) * sizeof *a);
        size_t i = 0;
        for (size_t k = 0; k < c; k++) {
            size_t s0 = i;
            ju_next(v.u.s, v.n, &i);
            a[k] = jv_strn(v.u.s + s0, i - s0);
        }
        *items = a;
        *n = (uint32_t)c;
        return OSP_OK;
    }
    default:
        return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object is not iterable", jv_type_name(v));
    }
}

osp_status jv_contains(jstate *st, jv c, jv item, int *res) {
    switch (c.k) {
    case JK_STR:
        if (item.k != JK_STR)
            return jerr(st, OSP_ERR_INVALID, "TypeError: 'in <string>' requires string as left operand, not %s",
                        jv_type_name(item));
        *res = ju_find(c, item, 0) >= 0;
        return OSP_OK;
    case JK_LIST: case JK_TUPLE:
        *res = 0;
        for (uint32_t i = 0; i < c.u.l->n && !*res; i++) *res = jv_eq(c.u.l->v[i], item);
        return OSP_OK;
    case JK_DICT: {
        jv o;
        *res = jdict_get(c.u.m, item, &o);
        return OSP_OK;
    }
    case JK_UNDEF: *res = 0; return OSP_OK;
    default:
        return jerr(st, OSP_ERR_INVALID, "TypeError: argument of type '%s' is not iterable", jv_type_name(c));
    }
}

/* ------------------------------------------------------------------ printing */

void jfmt_float(double d, char out[40]) {
    if (isnan(d)) { strcpy(out, "nan"); return; }
    if (isinf(d)) { strcpy(out, d < 0 ? "-inf" : "inf"); return; }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e = [-]D[.DDD]e[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *q = e;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int i = nd; i < decpt; i++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static osp_status write_str_repr(jstate *st, jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    OSP_TRY(jbuf_putc(st, b, q));
    size_t i = 0, run = 0;
    while (i < n) {
        size_t k = i;
        int32_t cp = ju_next(s, n, &k);
        char esc[16];
        const char *e = NULL;
        if (cp == q) { esc[0] = '\\'; esc[1] = q; esc[2] = 0; e = esc; }
        else if (cp == '\\') e = "\\\\";
        else if (cp == '\t') e = "\\t";
        else if (cp == '\n') e = "\\n";
        else if (cp == '\r') e = "\\r";
        else if (cp < 0x20 || cp == 0x7F) { snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp); e = esc; }
        else if (cp >= 0x80 && !ju_is_printable(cp)) {
            if (cp <= 0xFF) snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
            else if (cp <= 0xFFFF) snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            else snprintf(esc, sizeof esc, "\\U%08x", (unsigned)cp);
            e = esc;
        }
        if (e) {
            if (i > run) OSP_TRY(jbuf_put(st, b, s + run, i - run));
            OSP_TRY(jbuf_puts(st, b, e));
            run = k;
        }
        i = k;
    }
    if (n > run) OSP_TRY(jbuf_put(st, b, s + run, n - run));
    return jbuf_putc(st, b, q);
}

static osp_status write_val(jstate *st, jbuf *b, jv v, int repr, int depth);

static osp_status write_dict_body(jstate *st, jbuf *b, const jdict *d, int depth) {
    OSP_TRY(jbuf_putc(st, b, '{'));
    for (uint32_t i = 0; i < d->n; i++) {
        if (i) OSP_TRY(jbuf_put(st, b, ", ", 2));
        OSP_TRY(write_val(st, b, d->k[i], 1, depth + 1));
        OSP_TRY(jbuf_put(st, b, ": ", 2));
        OSP_TRY(write_val(st, b, d->v[i], 1, depth + 1));
    }
    return jbuf_putc(st, b, '}');
}

static osp_status write_val(jstate *st, jbuf *b, jv v, int repr, int depth) {
    if (depth > 200) return jerr(st, OSP_ERR_RANGE, "value nested too deeply to print");
    char tmp[64];
    switch (v.k) {
    case JK_UNDEF: return repr ? jbuf_puts(st, b, "Undefined") : OSP_OK;
    case JK_ABSENT:
    case JK_NONE: return jbuf_puts(st, b, "None");
    case JK_BOOL: return jbuf_puts(st, b, v.u.i ? "True" : "False");
    case JK_INT: return jbuf_printf(st, b, "%lld", (long long)v.u.i);
    case JK_FLOAT: jfmt_float(v.u.d, tmp); return jbuf_puts(st, b, tmp);
    case JK_STR: return repr ? write_str_repr(st, b, v.u.s, v.n) : jbuf_put(st, b, v.u.s, v.n);
    case JK_LIST:
    case JK_TUPLE: {
        OSP_TRY(jbuf_putc(st, b, v.k == JK_LIST ? '[' : '('));
        for (uint32_t i = 0; i < v.u.l->n; i++) {
            if (i) OSP_TRY(jbuf_put(st, b, ", ", 2));
            OSP_TRY(write_val(st, b, v.u.l->v[i], 1, depth + 1));
        }
        if (v.k == JK_TUPLE && v.u.l->n == 1) OSP_TRY(jbuf_putc(st, b, ','));
        return jbuf_putc(st, b, v.k == JK_LIST ? ']' : ')');
    }
    case JK_DICT: return write_dict_body(st, b, v.u.m, depth);
    case JK_NS:
        OSP_TRY(jbuf_puts(st, b, "<Namespace "));
        OSP_TRY(write_dict_body(st, b, v.u.m, depth));
        return jbuf_putc(st, b, '>');
    case JK_MACRO: {
        const jnode *d = v.u.mac->def;
        return jbuf_printf(st, b, "<Macro '%.*s'>", (int)d->name.n, d->name.s);
    }
    case JK_FUNC: return jbuf_printf(st, b, "<function %s>", v.u.fn->name);
    case JK_METHOD:
        return jbuf_printf(st, b, "<built-in method %s of %s object>", v.u.meth->f->name,
                           jv_type_name(v.u.meth->self));
    case JK_LOOP:
        return jbuf_printf(st, b, "<LoopContext %lld/%lld>", (long long)v.u.loop->i + 1, (long long)v.u.loop->n);
    default: return OSP_OK;
    }
}

osp_status jv_write_str(jstate *st, jbuf *b, jv v) { return write_val(st, b, v, 0, 0); }
osp_status jv_write_repr(jstate *st, jbuf *b, jv v) { return write_val(st, b, v, 1, 0); }

osp_status jv_to_str(jstate *st, jv v, jv *out) {
    if (v.k == JK_STR) { *out = v; return OSP_OK; }
    if (v.k == JK_UNDEF) { *out = jv_strn("", 0); return OSP_OK; }
    if (v.k == JK_BOOL) { *out = jv_cstr(v.u.i ? "True" : "False"); return OSP_OK; }
    if (v.k == JK_NONE) { *out = jv_cstr("None"); return OSP_OK; }
    jbuf b = {0};
    osp_status rc = jv_write_str(st, &b, v);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

/* ------------------------------------------------------------------ json.dumps */

static osp_status json_str(jstate *st, jbuf *b, const char *s, size_t n, int ensure_ascii) {
    OSP_TRY(jbuf_putc(st, b, '"'));
    size_t i = 0, run = 0;
    while (i < n) {
        size_t k = i;
        int32_t cp = ju_next(s, n, &k);
        char esc[16];
        const char *e = NULL;
        switch (cp) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
                if (cp >= 0x10000) {
                    int32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xD800 | (v >> 10)),
                             (unsigned)(0xDC00 | (v & 0x3FF)));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
                }
                e = esc;
            }
        }
        if (e) {
            if (i > run) OSP_TRY(jbuf_put(st, b, s + run, i - run));
            OSP_TRY(jbuf_puts(st, b, e));
            run = k;
        }
        i = k;
    }
    if (n > run) OSP_TRY(jbuf_put(st, b, s + run, n - run));
    return jbuf_putc(st, b, '"');
}

static osp_status json_float(jstate *st, jbuf *b, double d) {
    if (isnan(d)) return jbuf_puts(st, b, "NaN");
    if (isinf(d)) return jbuf_puts(st, b, d < 0 ? "-Infinity" : "Infinity");
    char tmp[40];
    jfmt_float(d, tmp);
    return jbuf_puts(st, b, tmp);
}

static osp_status json_newline(jstate *st, jbuf *b, const jjson_opts *o, int level) {
    OSP_TRY(jbuf_putc(st, b, '\n'));
    for (int i = 0; i < level; i++) OSP_TRY(jbuf_put(st, b, o->indent, o->indent_n));
    return OSP_OK;
}

/* A dict key as json.dumps converts it. */
static osp_status json_key(jstate *st, jv k, jv *out) {
    char tmp[40];
    switch (k.k) {
    case JK_STR: *out = k; return OSP_OK;
    case JK_BOOL: *out = jv_cstr(k.u.i ? "true" : "false"); return OSP_OK;
    case JK_NONE: *out = jv_cstr("null"); return OSP_OK;
    case JK_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)k.u.i); return jv_str_copy(st, tmp, strlen(tmp), out);
    case JK_FLOAT:
        if (isnan(k.u.d)) strcpy(tmp, "NaN");
        else if (isinf(k.u.d)) strcpy(tmp, k.u.d < 0 ? "-Infinity" : "Infinity");
        else jfmt_float(k.u.d, tmp);
        return jv_str_copy(st, tmp, strlen(tmp), out);
    default:
        return jerr(st, OSP_ERR_INVALID, "TypeError: keys must be str, int, float, bool or None, not %s",
                    jv_type_name(k));
    }
}

osp_status jv_write_json(jstate *st, jbuf *b, jv v, const jjson_opts *o, int level) {
    if (level > 200) return jerr(st, OSP_ERR_RANGE, "value nested too deeply for tojson");
    switch (v.k) {
    case JK_NONE: return jbuf_puts(st, b, "null");
    case JK_BOOL: return jbuf_puts(st, b, v.u.i ? "true" : "false");
    case JK_INT: return jbuf_printf(st, b, "%lld", (long long)v.u.i);
    case JK_FLOAT: return json_float(st, b, v.u.d);
    case JK_STR: return json_str(st, b, v.u.s, v.n, o->ensure_ascii);
    case JK_LIST:
    case JK_TUPLE: {
        const jlist *l = v.u.l;
        if (!l->n) return jbuf_puts(st, b, "[]");
        OSP_TRY(jbuf_putc(st, b, '['));
        if (o->indent) OSP_TRY(json_newline(st, b, o, level + 1));
        for (uint32_t i = 0; i < l->n; i++) {
            if (i) {
                OSP_TRY(jbuf_puts(st, b, o->item_sep));
                if (o->indent) OSP_TRY(json_newline(st, b, o, level + 1));
            }
            OSP_TRY(jv_write_json(st, b, l->v[i], o, level + 1));
        }
        if (o->indent) OSP_TRY(json_newline(st, b, o, level));
        return jbuf_putc(st, b, ']');
    }
    case JK_DICT: {
        const jdict *d = v.u.m;
        if (!d->n) return jbuf_puts(st, b, "{}");
        uint32_t *order;
        JALLOC(st, order, d->n * sizeof *order);
        for (uint32_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) { /* insertion sort: stable, and dicts are small */
            for (uint32_t i = 1; i < d->n; i++) {
                uint32_t x = order[i];
                uint32_t j = i;
                while (j > 0) {
                    int c;
                    OSP_TRY(jv_cmp(st, d->k[order[j - 1]], d->k[x], "<", &c));
                    if (c <= 0) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        OSP_TRY(jbuf_putc(st, b, '{'));
        if (o->indent) OSP_TRY(json_newline(st, b, o, level + 1));
        for (uint32_t i = 0; i < d->n; i++) {
            if (i) {
                OSP_TRY(jbuf_puts(st, b, o->item_sep));
                if (o->indent) OSP_TRY(json_newline(st, b, o, level + 1));
            }
            jv k;
            OSP_TRY(json_key(st, d->k[order[i]], &k));
            OSP_TRY(json_str(st, b, k.u.s, k.n, o->ensure_ascii));
            OSP_TRY(jbuf_puts(st, b, o->key_sep));
            OSP_TRY(jv_write_json(st, b, d->v[order[i]], o, level + 1));
        }
        if (o->indent) OSP_TRY(json_newline(st, b, o, level));
        return jbuf_putc(st, b, '}');
    }
    default:
        return jerr(st, OSP_ERR_INVALID, "TypeError: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ------------------------------------------------------------------ access */

osp_status jv_getattr(jstate *st, jv obj, jstr name, jv *out) {
    osp_status err = OSP_OK;
    switch (obj.k) {
    case JK_UNDEF:
        return jundef_fail(st, obj);
    case JK_DICT:
        if (jmethod_find(st, obj, name, out, &err)) return err;
        if (jdict_find_str(obj.u.m, name.s, name.n, out)) return OSP_OK;
        return jv_undef_attr(st, obj, name, out);
    case JK_NS:
        if (jdict_find_str(obj.u.m, name.s, name.n, out)) return OSP_OK;
        return jv_undef_attr(st, obj, name, out);
    case JK_LOOP:
        return jloop_attr(st, obj.u.loop, name, out);
    default:
        if (jmethod_find(st, obj, name, out, &err)) return err;
        return jv_undef_attr(st, obj, name, out);
    }
}

static int64_t norm_index(jv key, int64_t len, int *ok) {
    int64_t i = key.u.i;
    if (i < 0) i += len;
    *ok = i >= 0 && i < len;
    return i;
}

osp_status jv_getitem(jstate *st, jv obj, jv key, jv *out) {
    if (obj.k == JK_UNDEF) return jundef_fail(st, obj);
    int is_int = key.k == JK_INT || key.k == JK_BOOL;
    switch (obj.k) {
    case JK_DICT:
        if (jdict_get(obj.u.m, key, out)) return OSP_OK;
        break;
    case JK_LIST:
    case JK_TUPLE:
        if (is_int) {
            int ok;
            int64_t i = norm_index(key, obj.u.l->n, &ok);
            if (ok) { *out = obj.u.l->v[i]; return OSP_OK; }
            return jv_undef_item(st, obj, key, out);
        }
        break;
    case JK_STR:
        if (is_int) {
            int ok;
            int64_t len = (int64_t)ju_count(obj.u.s, obj.n);
            int64_t i = norm_index(key, len, &ok);
            if (ok) {
                size_t b = ju_offset(obj.u.s, obj.n, (size_t)i), e = b;
                ju_next(obj.u.s, obj.n, &e);
                *out = jv_strn(obj.u.s + b, e - b);
                return OSP_OK;
            }
            return jv_undef_item(st, obj, key, out);
        }
        break;
    default:
        break;
    }
    if (key.k == JK_STR) {
        jstr name = {key.u.s, key.n};
        if (obj.k == JK_DICT) {
            osp_status err = OSP_OK;
            if (jmethod_find(st, obj, name, out, &err)) return err;
            return jv_undef_item(st, obj, key, out);
        }
        return jv_getattr(st, obj, name, out);
    }
    return jv_undef_item(st, obj, key, out);
}

static osp_status slice_index(jstate *st, jv v, int64_t *out, int *given) {
    if (v.k == JK_ABSENT || v.k == JK_NONE) { *given = 0; return OSP_OK; }
    if (v.k != JK_INT && v.k != JK_BOOL) /* jinja2 slices bypass environment.getitem: the TypeError escapes */
        return jerr(st, OSP_ERR_INVALID, "TypeError: slice indices must be integers or None or have an __index__ method");
    *given = 1;
    *out = v.u.i;
    return OSP_OK;
}

osp_status jv_slice(jstate *st, jv obj, jv start, jv stop, jv step, jv *out) {
    if (obj.k == JK_UNDEF) return jundef_fail(st, obj);
    if (obj.k == JK_DICT) return jerr(st, OSP_ERR_INVALID, "TypeError: unhashable type: 'slice'");
    if (obj.k != JK_STR && obj.k != JK_LIST && obj.k != JK_TUPLE)
        return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object is not subscriptable", jv_type_name(obj));
    int64_t a = 0, b = 0, s = 1;
    int ga, gb, gs;
    OSP_TRY(slice_index(st, start, &a, &ga));
    OSP_TRY(slice_index(st, stop, &b, &gb));
    OSP_TRY(slice_index(st, step, &s, &gs));
    if (!gs) s = 1;
    if (s == 0) return jerr(st, OSP_ERR_INVALID, "ValueError: slice step cannot be zero");
    int ascii = obj.k == JK_STR && ju_is_ascii(obj.u.s, obj.n);
    int64_t len = obj.k == JK_STR ? (ascii ? (int64_t)obj.n : (int64_t)ju_count(obj.u.s, obj.n)) : obj.u.l->n;
    int64_t lower = s > 0 ? 0 : -1, upper = s > 0 ? len : len - 1;
    if (!ga) a = s < 0 ? upper : lower;
    else {
        if (a < 0) a += len;
        if (a < lower) a = lower;
        else if (a > upper) a = upper;
    }
    if (!gb) b = s < 0 ? lower : upper;
    else {
        if (b < 0) b += len;
        if (b < lower) b = lower;
        else if (b > upper) b = upper;
    }
    int64_t count = 0;
    if (s > 0 && a < b) count = (b - a - 1) / s + 1;
    else if (s < 0 && a > b) count = (a - b - 1) / (-s) + 1;
    if (obj.k != JK_STR) {
        if (s == 1 && a == 0 && count == len) { *out = obj; return OSP_OK; }
        jlist *l;
        OSP_TRY(jlist_new(st, (uint32_t)count, &l));
        for (int64_t k = 0, i = a; k < count; k++, i += s) l->v[l->n++] = obj.u.l->v[i];
        *out = jv_list(l, obj.k == JK_TUPLE);
        return OSP_OK;
    }
    if (ascii && s == 1) { *out = jv_strn(obj.u.s + (count ? a : 0), (size_t)count); return OSP_OK; }
    /* code point offsets */
    size_t *off;
    JALLOC(st, off, ((size_t)len + 1) * sizeof *off);
    for (size_t i = 0, k = 0; k <= (size_t)len; k++) {
        off[k] = i;
        if (k < (size_t)len) ju_next(obj.u.s, obj.n, &i);
    }
    if (s == 1) {
        *out = count ? jv_strn(obj.u.s + off[a], off[a + count] - off[a]) : jv_strn("", 0);
        return OSP_OK;
    }
    char *o;
    JALLOC(st, o, obj.n + 1);
    size_t n = 0;
    for (int64_t k = 0, i = a; k < count; k++, i += s) {
        size_t w = off[i + 1] - off[i];
        memcpy(o + n, obj.u.s + off[i], w);
        n += w;
    }
    *out = jv_strn(o, n);
    return OSP_OK;
}

/* ------------------------------------------------------------------ arithmetic */

static const char *OPNAME[] = {"+", "-", "*", "/", "//", "%", "**"};

static osp_status type_error(jstate *st, int op, jv a, jv b) {
    if (op == JO_ADD && (a.k == JK_STR || a.k == JK_LIST || a.k == JK_TUPLE))
        return jerr(st, OSP_ERR_INVALID, "TypeError: can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
                    jv_type_name(b), jv_type_name(a));
    return jerr(st, OSP_ERR_INVALID, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", OPNAME[op],
                jv_type_name(a), jv_type_name(b));
}

static osp_status repeat(jstate *st, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    /* an empty sequence repeated is empty, however many times (the loops below
     * would spin `times` rounds for nothing: found by fuzz_jinja) */
    if (seq.k == JK_STR ? !seq.n : !seq.u.l->n) times = 0;
    if (seq.k == JK_STR) {
        if (seq.n && (uint64_t)times > st->max_output / seq.n)
            return jerr(st, OSP_ERR_RANGE, "string repetition longer than the output limit (%zu bytes)", st->max_output);
        size_t n = (size_t)times * seq.n;
        char *p;
        JALLOC(st, p, n + 1);
        for (int64_t i = 0; i < times; i++) memcpy(p + (size_t)i * seq.n, seq.u.s, seq.n);
        *out = jv_strn(p, n);
        out->safe = seq.safe;
        return OSP_OK;
    }
    uint64_t total = (uint64_t)seq.u.l->n * (uint64_t)times;
    if (seq.u.l->n && (uint64_t)times > (1u << 26) / seq.u.l->n)
        return jerr(st, OSP_ERR_RANGE, "list repetition too large");
    jlist *l;
    OSP_TRY(jlist_new(st, (uint32_t)total, &l));
    for (int64_t i = 0; i < times; i++)
        for (uint32_t j = 0; j < seq.u.l->n; j++) l->v[l->n++] = seq.u.l->v[j];
    *out = jv_list(l, seq.k == JK_TUPLE);
    return OSP_OK;
}

static osp_status int_pow(jstate *st, int64_t b, int64_t e, jv *out) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) {
            if (__builtin_mul_overflow(r, b, &r)) return jerr(st, OSP_ERR_RANGE, "integer overflow in **");
        }
        e >>= 1;
        if (e && __builtin_mul_overflow(b, b, &b)) return jerr(st, OSP_ERR_RANGE, "integer overflow in **");
    }
    *out = jv_int(r);
    return OSP_OK;
}

osp_status jv_binop(jstate *st, int op, jv a, jv b, jv *out) {
    if (a.k == JK_UNDEF) return jundef_fail(st, a);
    if (b.k == JK_UNDEF) return jundef_fail(st, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        int fl = a.k == JK_FLOAT || b.k == JK_FLOAT;
        int64_t x = a.u.i, y = b.u.i, r;
        double dx = num_d(a), dy = num_d(b);
        switch (op) {
        case JO_ADD:
            if (fl) { *out = jv_float(dx + dy); return OSP_OK; }
            if (__builtin_add_overflow(x, y, &r)) return jerr(st, OSP_ERR_RANGE, "integer overflow");
            *out = jv_int(r);
            return OSP_OK;
        case JO_SUB:
            if (fl) { *out = jv_float(dx - dy); return OSP_OK; }
            if (__builtin_sub_overflow(x, y, &r)) return jerr(st, OSP_ERR_RANGE, "integer overflow");
            *out = jv_int(r);
            return OSP_OK;
        case JO_MUL:
            if (fl) { *out = jv_float(dx * dy); return OSP_OK; }
            if (__builtin_mul_overflow(x, y, &r)) return jerr(st, OSP_ERR_RANGE, "integer overflow");
            *out = jv_int(r);
            return OSP_OK;
        case JO_DIV:
            if (dy == 0) return jerr(st, OSP_ERR_INVALID, "ZeroDivisionError: division by zero");
            *out = jv_float(dx / dy);
            return OSP_OK;
        case JO_FLOORDIV:
        case JO_MOD:
            if (fl ? dy == 0 : y == 0)
                return jerr(st, OSP_ERR_INVALID, "ZeroDivisionError: %s", op == JO_MOD ? "modulo by zero" : "division by zero");
            if (!fl) {
                if (x == INT64_MIN && y == -1) return jerr(st, OSP_ERR_RANGE, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                *out = jv_int(op == JO_MOD ? m : q);
                return OSP_OK;
            } else {
                double mod = fmod(dx, dy), div = (dx - mod) / dy, fd;
                if (mod != 0) {
                    if ((dy < 0) != (mod < 0)) { mod += dy; div -= 1.0; }
                } else {
                    mod = copysign(0.0, dy);
                }
                if (div != 0) {
                    fd = floor(div);
                    if (div - fd > 0.5) fd += 1.0;
                } else {
                    fd = copysign(0.0, dx / dy);
                }
                *out = jv_float(op == JO_MOD ? mod : fd);
                return OSP_OK;
            }
        case JO_POW:
            if (!fl && y >= 0) return int_pow(st, x, y, out);
            if (dx == 0 && dy < 0)
                return jerr(st, OSP_ERR_INVALID, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
            *out = jv_float(pow(dx, dy));
            return OSP_OK;
        default: break;
        }
    }
    if (op == JO_ADD && a.k == JK_STR && b.k == JK_STR) {
        if (a.safe != b.safe) { /* Markup + str escapes the str */
            if (a.safe) OSP_TRY(jv_html_escape(st, b, &b));
            else OSP_TRY(jv_html_escape(st, a, &a));
        }
        int safe = a.safe || b.safe;
        OSP_TRY(jv_concat2(st, a, b, out));
        out->safe = (uint8_t)safe;
        return OSP_OK;
    }
    if (op == JO_ADD && a.k == b.k && (a.k == JK_LIST || a.k == JK_TUPLE)) {
        jlist *l;
        OSP_TRY(jlist_new(st, a.u.l->n + b.u.l->n, &l));
        for (uint32_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
        for (uint32_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
        *out = jv_list(l, a.k == JK_TUPLE);
        return OSP_OK;
    }
    if (op == JO_MUL) {
        if ((a.k == JK_STR || jv_is_seq(a)) && (b.k == JK_INT || b.k == JK_BOOL)) return repeat(st, a, b.u.i, out);
        if ((b.k == JK_STR || jv_is_seq(b)) && (a.k == JK_INT || a.k == JK_BOOL)) return repeat(st, b, a.u.i, out);
    }
    if (op == JO_MOD && a.k == JK_STR) return jfmt_percent(st, a, b, out);
    return type_error(st, op, a, b);
}

/* markupsafe.escape: also the Markup semantics of "+". */
osp_status jv_html_escape(jstate *st, jv s, jv *out) {
    jbuf b = {0};
    size_t run = 0;
    osp_status rc = OSP_OK;
    for (size_t i = 0; i < s.n && rc == OSP_OK; i++) {
        const char *e = NULL;
        switch (s.u.s[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        default: break;
        }
        if (!e) continue;
        rc = jbuf_put(st, &b, s.u.s + run, i - run);
        if (rc == OSP_OK) rc = jbuf_puts(st, &b, e);
        run = i + 1;
    }
    if (rc == OSP_OK) rc = jbuf_put(st, &b, s.u.s + run, s.n - run);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    OSP_TRY(jbuf_take(st, &b, out));
    out->safe = 1;
    return OSP_OK;
}
