/* grammar/schema: JSON Schema -> grammar.
 *
 * Each subschema becomes a nonterminal over lexemes: JSON punctuation and
 * literals, strings (free, with lengths, a pattern or a format), numbers
 * (ranges of integers as digit-by-digit regexes) and object keys. Objects
 * list their properties in the schema's order, optional ones skippable,
 * then (additionalProperties, true by default) any other keys: a key
 * lexeme that excludes the declared names. JSON's whitespace is allowed
 * between tokens (at most 64 bytes in a run). $ref targets are compiled
 * once (memoized by node), so recursive schemas are recursive grammars.
 * allOf is merged into one schema; anyOf/oneOf become alternatives (oneOf's
 * exclusivity is not enforced: a text matching two branches is accepted).
 * A keyword with a meaning we do not enforce is an OSP_ERR_UNSUPPORTED
 * naming it; unknown keywords (vendor extensions) are annotations.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"

typedef struct memo {
    json_t *node;
    int32_t nt;
} memo;

typedef struct sc {
    gr_builder b;
    json_t *root;
    int32_t ws, any, eps;
    memo *memo;
    int32_t n_memo, cap_memo;
    json_t **keep; /* merged schemas, freed at the end */
    int32_t n_keep, cap_keep;
    int depth;
} sc;

#define TRYS(x) OSP_TRY(x)

static const char *const unsupported[] = {
    "propertyNames", "dependencies", "dependentRequired", "dependentSchemas", "if", "then",
    "else", "contains", "minContains", "maxContains", "maxProperties",
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL};

static json_t *keep(sc *c, json_t *j) {
    if (c->n_keep == c->cap_keep) {
        int32_t nc = c->cap_keep ? c->cap_keep * 2 : 16;
        json_t **k = osp_malloc(OSP_POOL_MISC, sizeof(json_t *) * nc);
        if (c->n_keep) memcpy(k, c->keep, sizeof(json_t *) * c->n_keep);
        osp_free(c->keep);
        c->keep = k, c->cap_keep = nc;
    }
    c->keep[c->n_keep++] = j;
    return j;
}

static osp_status prod(sc *c, int32_t lhs, int n, ...) {
    int32_t r[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) r[i] = va_arg(ap, int32_t);
    va_end(ap);
    return gr_b_prod(&c->b, lhs, r, (uint32_t)n);
}
static osp_status lit(sc *c, const char *s, int32_t *sym) { return gr_b_lit(&c->b, s, strlen(s), sym); }
static osp_status re(sc *c, const char *r, int32_t *sym) { return gr_b_regex(&c->b, r, GR_RE_PLAIN, sym); }

#define NUM_RE "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?"
#define INT_RE "-?(0|[1-9][0-9]*)"

/* The generic JSON value. */
static osp_status build_any(sc *c) {
    int32_t v = c->any, obj = gr_b_nt(&c->b), arr = gr_b_nt(&c->b), mem = gr_b_nt(&c->b), mems = gr_b_nt(&c->b),
            vals = gr_b_nt(&c->b);
    int32_t lb, rb, ls, rs, co, cl, str, num, t, f, nu;
    TRYS(lit(c, "{", &lb)); TRYS(lit(c, "}", &rb)); TRYS(lit(c, "[", &ls)); TRYS(lit(c, "]", &rs));
    TRYS(lit(c, ",", &co)); TRYS(lit(c, ":", &cl));
    TRYS(gr_b_regex(&c->b, "[\\s\\S]*", GR_RE_JSONSTR, &str));
    TRYS(re(c, NUM_RE, &num)); TRYS(lit(c, "true", &t)); TRYS(lit(c, "false", &f)); TRYS(lit(c, "null", &nu));
    TRYS(prod(c, v, 1, obj)); TRYS(prod(c, v, 1, arr)); TRYS(prod(c, v, 1, str)); TRYS(prod(c, v, 1, num));
    TRYS(prod(c, v, 1, t)); TRYS(prod(c, v, 1, f)); TRYS(prod(c, v, 1, nu));
    TRYS(prod(c, obj, 3, lb, c->ws, rb));
    TRYS(prod(c, obj, 6, lb, c->ws, mem, mems, c->ws, rb));
    TRYS(prod(c, mem, 5, str, c->ws, cl, c->ws, v));
    TRYS(prod(c, mems, 0));
    TRYS(prod(c, mems, 5, c->ws, co, c->ws, mem, mems));
    TRYS(prod(c, arr, 3, ls, c->ws, rs));
    TRYS(prod(c, arr, 6, ls, c->ws, v, vals, c->ws, rs));
    TRYS(prod(c, vals, 0));
    TRYS(prod(c, vals, 5, c->ws, co, c->ws, v, vals));
    return OSP_OK;
}

/* ---- integer ranges as regexes ---- */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;
static void sb_add(sbuf *s, const char *t, size_t n) {
    if (s->n + n + 1 > s->cap) {
        size_t nc = (s->n + n + 1) * 2;
        char *q = osp_malloc(OSP_POOL_MISC, nc);
        if (s->p) memcpy(q, s->p, s->n);
        osp_free(s->p);
        s->p = q, s->cap = nc;
    }
    memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = 0;
}
static void sb_str(sbuf *s, const char *t) { sb_add(s, t, strlen(t)); }

/* digit strings lo <= hi of the same length n */
static void rng_same(sbuf *s, const char *lo, const char *hi, int n) {
    if (n == 0) return;
    if (lo[0] == hi[0]) {
        sb_add(s, lo, 1);
        rng_same(s, lo + 1, hi + 1, n - 1);
        return;
    }
    char nines[24], zeros[24], tmp[64];
    memset(nines, '9', n), memset(zeros, '0', n);
    sb_str(s, "(");
    sb_add(s, lo, 1);
    sb_str(s, "(");
    rng_same(s, lo + 1, nines, n - 1);
    sb_str(s, ")|");
    if (lo[0] + 1 <= hi[0] - 1) {
        snprintf(tmp, sizeof tmp, "[%c-%c][0-9]{%d}|", lo[0] + 1, hi[0] - 1, n - 1);
        sb_str(s, tmp);
    }
    sb_add(s, hi, 1);
    sb_str(s, "(");
    rng_same(s, zeros, hi + 1, n - 1);
    sb_str(s, "))");
}
/* non-negative integers in [lo, hi] (hi < 0: unbounded), as alternatives */
static void rng_nonneg(sbuf *s, long long lo, long long hi) {
    char L[24], H[24];
    int ln = snprintf(L, sizeof L, "%lld", lo);
    int hn = hi >= 0 ? snprintf(H, sizeof H, "%lld", hi) : 0;
    int first = 1;
    int top = hi >= 0 ? hn : ln;
    for (int d = ln; d <= top; d++) {
        char a[24], z[24];
        if (d == ln) memcpy(a, L, d);
        else memset(a, '0', d), a[0] = '1';
        if (hi >= 0 && d == hn) memcpy(z, H, d);
        else memset(z, '9', d);
        if (!first) sb_str(s, "|");
        first = 0;
        sb_str(s, "(");
        rng_same(s, a, z, d);
        sb_str(s, ")");
    }
    if (hi < 0) {
        char tmp[48];
        snprintf(tmp, sizeof tmp, "|[1-9][0-9]{%d,}", ln);
        sb_str(s, tmp);
    }
}
/* integers in [lo, hi]; has_lo/has_hi say which bounds exist */
static void int_range_re(sbuf *s, int has_lo, long long lo, int has_hi, long long hi) {
    int any = 0;
    sb_str(s, "(");
    /* negative part: -x for x in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        long long xlo = has_hi && hi < 0 ? -hi : 1, xhi = has_lo ? -lo : -1;
        sb_str(s, "-(");
        rng_nonneg(s, xlo, xhi);
        sb_str(s, ")");
        any = 1;
    }
    if (!has_hi || hi >= 0) {
        if (any) sb_str(s, "|");
        rng_nonneg(s, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    sb_str(s, ")");
}

static int is_annotation(const char *k) {
    static const char *const ann[] = {"title", "description", "$schema", "$id", "id", "default", "examples",
                                      "example", "$comment", "readOnly", "writeOnly", "deprecated", "$defs",
                                      "definitions", "$anchor", "contentMediaType", "contentEncoding", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return 1;
    return 0;
}

static osp_status gen(sc *c, json_t *s, int32_t *out);

static osp_status resolve_ref(sc *c, const char *ref, json_t **out) {
    if (ref[0] != '#') return osp_err(OSP_ERR_UNSUPPORTED, "$ref \"%.100s\": only local references (#...)", ref);
    json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return osp_err(OSP_ERR_UNSUPPORTED, "$ref \"%.100s\": anchors", ref);
    while (*p == '/') {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char key[512];
        size_t k = 0;
        for (size_t i = 0; i < n && k < sizeof key - 1; i++) {
            if (p[i] == '~' && i + 1 < n) key[k++] = p[i + 1] == '1' ? '/' : '~', i++;
            else if (p[i] == '%' && i + 2 < n) {
                unsigned v;
                if (sscanf(p + i + 1, "%2x", &v) == 1) key[k++] = (char)v, i += 2;
                else key[k++] = p[i];
            } else key[k++] = p[i];
        }
        key[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, key);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)atol(key));
        else cur = NULL;
        if (!cur) return osp_err(OSP_ERR_INVALID, "$ref \"%.100s\" points nowhere", ref);
        p += n;
    }
    *out = cur;
    return OSP_OK;
}

/* a copy of s without key k */
static json_t *without(sc *c, json_t *s, const char *k) {
    json_t *r = keep(c, json_copy(s));
    json_object_del(r, k);
    return r;
}

static int only_annotations(json_t *s, const char *except) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) if (strcmp(k, except) && !is_annotation(k)) return 0;
    return 1;
}

static osp_status flatten(sc *c, json_t *s, json_t **out);

static unsigned type_bits(json_t *t) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
    unsigned m = 0;
    json_t *a = json_is_array(t) ? t : NULL;
    size_t n = a ? json_array_size(a) : 1;
    for (size_t i = 0; i < n; i++) {
        const char *x = json_string_value(a ? json_array_get(a, i) : t);
        if (!x) continue;
        for (int k = 0; k < 7; k++)
            if (!strcmp(x, names[k])) m |= 1u << k;
    }
    return m;
}
static json_t *type_json(unsigned m) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
    json_t *a = json_array();
    for (int k = 0; k < 7; k++)
        if (m & (1u << k)) json_array_append_new(a, json_string(names[k]));
    return a;
}

#define NOT_STRINGS "x-osp-not-strings"   /* strings a `not` removes */
#define NOT_PATTERNS "x-osp-not-patterns" /* patterns a `not` removes */

/* allOf: one schema from two (a wins where they are equal) */
static osp_status merge(sc *c, json_t *a, json_t *b, json_t **out) {
    TRYS(flatten(c, a, &a));
    TRYS(flatten(c, b, &b));
    if (json_is_true(b)) { *out = a; return OSP_OK; }
    if (json_is_true(a)) { *out = b; return OSP_OK; }
    if (json_is_false(a) || json_is_false(b)) { *out = keep(c, json_false()); return OSP_OK; }
    json_t *r = keep(c, json_copy(a));
    const char *k;
    json_t *vb;
    json_object_foreach(b, k, vb) {
        json_t *va = json_object_get(r, k);
        if (!va) { json_object_set(r, k, vb); continue; }
        if (json_equal(va, vb) || is_annotation(k)) continue;
        if (!strcmp(k, "required") || !strcmp(k, NOT_STRINGS) || !strcmp(k, NOT_PATTERNS)) {
            json_t *u = json_copy(va);
            size_t i;
            json_t *x;
            json_array_foreach(vb, i, x) json_array_append(u, x);
            json_object_set_new(r, k, u);
        } else if (!strcmp(k, "properties") && json_is_object(va) && json_is_object(vb)) {
            json_t *u = json_copy(va);
            const char *pk;
            json_t *pv;
            json_object_foreach(vb, pk, pv) {
                json_t *old = json_object_get(u, pk);
                if (!old) json_object_set(u, pk, pv);
                else json_object_set_new(u, pk, json_pack("{s:[OO]}", "allOf", old, pv));
            }
            json_object_set_new(r, k, u);
        } else if (!strcmp(k, "type")) {
            unsigned ma = type_bits(va), mb = type_bits(vb);
            if ((ma & 16) && (mb & 64)) ma |= 64;
            if ((mb & 16) && (ma & 64)) mb |= 64;
            json_object_set_new(r, k, type_json(ma & mb));
        } else if (!strcmp(k, "minLength") || !strcmp(k, "minItems") || !strcmp(k, "minimum")) {
            if (json_number_value(vb) > json_number_value(va)) json_object_set(r, k, vb);
        } else if (!strcmp(k, "maxLength") || !strcmp(k, "maxItems") || !strcmp(k, "maximum")) {
            if (json_number_value(vb) < json_number_value(va)) json_object_set(r, k, vb);
        } else if (!strcmp(k, "additionalProperties") && (json_is_false(va) || json_is_false(vb))) {
            json_object_set_new(r, k, json_false());
        } else if (!strcmp(k, "items") && json_is_object(va) && json_is_object(vb)) {
            json_object_set_new(r, k, json_pack("{s:[OO]}", "allOf", va, vb));
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
            json_object_set_new(r, k, json_pack("[{s:O},{s:O}]", k, va, k, vb)); /* both must hold */
            json_object_set_new(r, "allOf", json_pack("[{s:O},{s:O}]", k, va, k, vb));
            json_object_del(r, k);
        } else if (json_is_object(va) || json_is_object(vb) || !is_annotation(k)) {
            return osp_err(OSP_ERR_UNSUPPORTED, "allOf: cannot merge differing \"%s\"", k);
        }
    }
    *out = r;
    return OSP_OK;
}

/* ---- not ----
 * A schema is its type and, per other keyword K, "an instance of K's type meets K"; its negation is then
 * "another type, or one keyword failed", an anyOf of positive schemas (De Morgan through anyOf, allOf and
 * not). Strings a `not` removes go in internal keywords that gen_string subtracts from the string's DFA.
 * Anything else (properties, items, numbers' enums) stays a compile error. */
static unsigned value_types(json_t *v);
static osp_status negate(sc *c, json_t *n, json_t **out);

static json_t *typed(const char *type, const char *k, json_t *v) {
    json_t *r = json_pack("{s:s}", "type", type);
    if (k) json_object_set_new(r, k, v);
    return r;
}
static osp_status negate_values(sc *c, json_t *vals, json_t *branches) {
    unsigned has = 0;
    json_t *strs = json_array(), *lits = json_array();
    size_t i;
    json_t *x;
    osp_status st = OSP_OK;
    json_array_foreach(vals, i, x) {
        has |= value_types(x);
        if (json_is_string(x)) {
            for (const char *q = json_string_value(x); *q && !st; q++)
                if ((uint8_t)*q < 0x20 || (uint8_t)*q >= 0x7f)
                    st = osp_err(OSP_ERR_UNSUPPORTED, "keyword \"not\" of a non-ASCII string");
            json_array_append(strs, x);
        }
    }
    /* null and booleans: the literals left; strings: all but these */
    if (!(has & 1)) json_array_append_new(lits, json_null());
    int t = 0, f = 0;
    json_array_foreach(vals, i, x) t |= json_is_true(x), f |= json_is_false(x);
    if (!t) json_array_append_new(lits, json_true());
    if (!f) json_array_append_new(lits, json_false());
    if (json_array_size(lits)) json_array_append_new(branches, json_pack("{s:O}", "enum", lits));
    json_array_append_new(branches, json_array_size(strs) ? typed("string", NOT_STRINGS, json_incref(strs)) : typed("string", NULL, NULL));
    if (has & (4 | 8 | 16 | 64)) st = st ? st : osp_err(OSP_ERR_UNSUPPORTED, "keyword \"not\" of numbers, arrays or objects as values");
    else {
        json_array_append_new(branches, typed("object", NULL, NULL));
        json_array_append_new(branches, typed("array", NULL, NULL));
        json_array_append_new(branches, typed("number", NULL, NULL));
    }
    json_decref(strs), json_decref(lits);
    return st;
}
/* A bound's complement: `type` instances with `k` = the other side. */
static void negate_bound(json_t *branches, const char *type, const char *k, double v) {
    json_array_append_new(branches, typed(type, k, v == floor(v) && fabs(v) < 1e15 ? json_integer((json_int_t)v) : json_real(v)));
}
static osp_status negate(sc *c, json_t *n, json_t **out) {
    TRYS(flatten(c, n, &n));
    if (json_is_boolean(n) || (json_is_object(n) && only_annotations(n, ""))) {
        *out = keep(c, json_is_false(n) ? json_true() : json_false());
        return OSP_OK;
    }
    if (!json_is_object(n)) return osp_err(OSP_ERR_INVALID, "not: a schema must be an object or a boolean");
    json_t *br = keep(c, json_array());
    json_t *t = json_object_get(n, "type");
    if (t) { /* another type */
        unsigned m = type_bits(t), all = 0x7f & ~64u;
        if (m & 16) m |= 64;
        if ((m & 64) && !(m & 16)) return osp_err(OSP_ERR_UNSUPPORTED, "keyword \"not\" of integer (numbers that are not integers)");
        if (all & ~m) json_array_append_new(br, json_pack("{s:o}", "type", type_json(all & ~m)));
    }
    const char *k;
    json_t *v;
    json_object_foreach(n, k, v) {
        double d = json_number_value(v);
        if (!strcmp(k, "type") || is_annotation(k)) continue;
        if (!strcmp(k, "enum") && json_is_array(v)) TRYS(negate_values(c, v, br));
        else if (!strcmp(k, "const")) {
            json_t *a = json_pack("[O]", v);
            osp_status st = negate_values(c, a, br);
            json_decref(a);
            if (st) return st;
        } else if (!strcmp(k, "pattern") && json_is_string(v)) json_array_append_new(br, typed("string", NOT_PATTERNS, json_pack("[O]", v)));
        else if (!strcmp(k, "minLength") && d > 0) negate_bound(br, "string", "maxLength", d - 1);
        else if (!strcmp(k, "maxLength")) negate_bound(br, "string", "minLength", d + 1);
        else if (!strcmp(k, "minItems") && d > 0) negate_bound(br, "array", "maxItems", d - 1);
        else if (!strcmp(k, "maxItems")) negate_bound(br, "array", "minItems", d + 1);
        else if (!strcmp(k, "minimum") && json_is_number(v)) negate_bound(br, "number", "exclusiveMaximum", d);
        else if (!strcmp(k, "maximum") && json_is_number(v)) negate_bound(br, "number", "exclusiveMinimum", d);
        else if (!strcmp(k, "exclusiveMinimum") && json_is_number(v)) negate_bound(br, "number", "maximum", d);
        else if (!strcmp(k, "exclusiveMaximum") && json_is_number(v)) negate_bound(br, "number", "minimum", d);
        else if (!strcmp(k, "required") && json_is_array(v)) { /* some name is missing */
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) json_array_append_new(br, json_pack("{s:s,s:{s:b}}", "type", "object", "properties", json_string_value(x) ? json_string_value(x) : "", 0));
        } else if (!strcmp(k, "not")) json_array_append(br, v);
        else if ((!strcmp(k, "anyOf") || !strcmp(k, "allOf")) && json_is_array(v)) {
            json_t *parts = json_array();
            size_t i;
            json_t *x, *nx;
            json_array_foreach(v, i, x) {
                osp_status st = negate(c, x, &nx);
                if (st) { json_decref(parts); return st; }
                json_array_append(parts, nx);
            }
            if (!strcmp(k, "anyOf")) json_array_append_new(br, json_pack("{s:o}", "allOf", parts));
            else json_array_append_new(br, json_pack("{s:o}", "anyOf", parts));
        } else return osp_err(OSP_ERR_UNSUPPORTED, "keyword \"not\" of \"%.40s\"", k);
    }
    *out = json_array_size(br) ? keep(c, json_pack("{s:O}", "anyOf", br)) : keep(c, json_false());
    return OSP_OK;
}

/* resolve $ref (with siblings), allOf and not at the top of s */
static osp_status flatten(sc *c, json_t *s, json_t **out) {
    if (++c->depth > 64) return osp_err(OSP_ERR_UNSUPPORTED, "$ref/allOf nested too deep");
    for (int steps = 0; json_is_object(s); steps++) { /* a $ref cycle ends here too */
        if (steps > 64) return osp_err(OSP_ERR_UNSUPPORTED, "$ref/allOf nested too deep");
        json_t *ref = json_object_get(s, "$ref");
        json_t *all = json_object_get(s, "allOf");
        if (ref) {
            if (!json_is_string(ref)) return osp_err(OSP_ERR_INVALID, "$ref is not a string");
            json_t *t;
            TRYS(resolve_ref(c, json_string_value(ref), &t));
            if (only_annotations(s, "$ref")) { s = t; continue; }
            TRYS(merge(c, t, without(c, s, "$ref"), &s));
        } else if (all) {
            if (!json_is_array(all)) return osp_err(OSP_ERR_INVALID, "allOf is not an array");
            json_t *r = without(c, s, "allOf");
            size_t i;
            json_t *x;
            json_array_foreach(all, i, x) TRYS(merge(c, r, x, &r));
            s = r;
        } else if (json_object_get(s, "not")) {
            json_t *neg;
            TRYS(negate(c, json_object_get(s, "not"), &neg));
            TRYS(merge(c, without(c, s, "not"), neg, &s));
        } else break;
    }
    c->depth--;
    *out = s;
    return OSP_OK;
}

static osp_status json_lit(sc *c, json_t *v, int32_t *sym) {
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    if (!t) return osp_err(OSP_ERR_INVALID, "enum value");
    osp_status st = lit(c, t, sym);
    free(t);
    return st;
}

/* ---- strings ---- */
#define DATE                                                                                                  \
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))" \
    "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
#define TIME "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define OCT "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define IPV4 "(" OCT "\\.){3}" OCT
/* RFC 3986, as the validators' "uri" and "uri-reference" check it */
#define HEX "[0-9A-Fa-f]"
#define PCT "%" HEX HEX
#define H16 HEX "{1,4}"
#define LS32 "(" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                                   \
    "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32 "|((" H16 ":){0,1}" H16  \
    ")?::(" H16 ":){3}" LS32 "|((" H16 ":){0,2}" H16 ")?::(" H16 ":){2}" LS32 "|((" H16 ":){0,3}" H16 ")?::" \
    H16 ":" LS32 "|((" H16 ":){0,4}" H16 ")?::" LS32 "|((" H16 ":){0,5}" H16 ")?::" H16 "|((" H16 ":){0,6}"   \
    H16 ")?::)"
#define UNRES "A-Za-z0-9._~\\-"
#define SUBD "!$&'()*+,;="
#define PCHAR "([" UNRES SUBD ":@]|" PCT ")"
#define AUTH                                                                                                   \
    "(([" UNRES SUBD ":]|" PCT ")*@)?(\\[(" IPV6 "|v" HEX "+\\.[" UNRES SUBD ":]+)\\]|([" UNRES SUBD "]|" PCT \
    ")*)(:[0-9]*)?"
#define SEG PCHAR "*"
#define PATH_ABEMPTY "(/" SEG ")*"
#define PATH_ABS "/(" PCHAR "+(/" SEG ")*)?"
#define QF "(\\?(" PCHAR "|[/?])*)?(#(" PCHAR "|[/?])*)?"
#define URI "[A-Za-z][A-Za-z0-9+.\\-]*:(//" AUTH PATH_ABEMPTY "|" PATH_ABS "|" PCHAR "+(/" SEG ")*|)" QF
#define RELREF                                                                                                 \
    "(//" AUTH PATH_ABEMPTY "|" PATH_ABS "|([" UNRES SUBD "@]|" PCT ")+(/" SEG ")*|)" QF

/* The regex of a format; NULL for one a validator does not check (an annotation, as the specification
 * says of formats it does not define), and an error for one it checks that we cannot. */
static osp_status format_re(const char *f, const char **r) {
    static const char *const checked[] = {"hostname", "idn-hostname", "idn-email", "iri", "iri-reference",
                                          "uri-template", "json-pointer", "relative-json-pointer", "regex",
                                          "duration", "color", "host-name", "ip-address", "ipv6", NULL};
    *r = NULL;
    if (!strcmp(f, "date")) *r = "^" DATE "$";
    else if (!strcmp(f, "time")) *r = "^" TIME "$";
    else if (!strcmp(f, "date-time")) *r = "^" DATE "[Tt ]" TIME "$";
    else if (!strcmp(f, "uuid")) *r = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
    else if (!strcmp(f, "ipv4")) *r = "^" IPV4 "$";
    else if (!strcmp(f, "email")) *r = "^[^\\s@]+@[^\\s@]+$";
    else if (!strcmp(f, "uri")) *r = "^" URI "$";
    else if (!strcmp(f, "uri-reference")) *r = "^(" URI "|" RELREF ")$";
    else
        for (int i = 0; checked[i]; i++)
            if (!strcmp(f, checked[i])) return osp_err(OSP_ERR_UNSUPPORTED, "format \"%.60s\"", f);
    return OSP_OK;
}

/* Strings of a..b characters (b < 0: no bound): one lexeme when short, else chunks of GR_STR_CHUNK
 * characters and a tail with the closing quote, so that a long bound costs a few small DFAs shared by every
 * schema (and their masks' cache entries) instead of one DFA with a state per character. */
#define GR_STR_CHUNK 64
static osp_status str_len_rest(sc *c, long long a, long long b, int open, int32_t *out) {
    char r[96];
    int32_t alt = gr_b_nt(&c->b), t;
    int fl = GR_RE_JSONBODY | (open ? GR_RE_OPEN : 0);
    if (a < GR_STR_CHUNK) { /* the tail: a..min(b, CHUNK-1) characters and the quote */
        if (b < 0) snprintf(r, sizeof r, "^[\\s\\S]{%lld,}$", a);
        else snprintf(r, sizeof r, "^[\\s\\S]{%lld,%lld}$", a, b < GR_STR_CHUNK - 1 ? b : GR_STR_CHUNK - 1);
        TRYS(gr_b_regex(&c->b, r, fl | GR_RE_CLOSE, &t));
        TRYS(prod(c, alt, 1, t));
        if (b < 0) { *out = alt; return OSP_OK; }
    }
    if (b < 0 || b >= GR_STR_CHUNK) { /* a whole chunk, then the rest */
        int32_t rest;
        snprintf(r, sizeof r, "^[\\s\\S]{%d}$", GR_STR_CHUNK);
        TRYS(gr_b_regex(&c->b, r, fl, &t));
        TRYS(str_len_rest(c, a > GR_STR_CHUNK ? a - GR_STR_CHUNK : 0, b < 0 ? -1 : b - GR_STR_CHUNK, 0, &rest));
        TRYS(prod(c, alt, 2, t, rest));
    }
    *out = alt;
    return OSP_OK;
}

/* A string DFA from a regex (JSON string mode), through the builder's cache when it is the only part. */
static osp_status str_part(const char *r, gr_dfa *d) { return gr_regex_dfa_cached(r, GR_RE_JSONSTR, d); }

/* `minus`: the texts a `not` removes (a DFA in JSON string mode), or NULL. */
static osp_status gen_string_minus(sc *c, json_t *s, gr_dfa *minus, int32_t *out) {
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    const char *parts[3];
    char lenre[96];
    int np = 0;
    if (pat) {
        if (!json_is_string(pat)) return osp_err(OSP_ERR_INVALID, "pattern is not a string");
        parts[np++] = json_string_value(pat);
    }
    if (fmt) {
        const char *f = json_string_value(fmt), *r;
        if (!f) return osp_err(OSP_ERR_INVALID, "format is not a string");
        TRYS(format_re(f, &r));
        if (r) parts[np++] = r;
    }
    long long a = mn ? (long long)json_number_value(mn) : 0, b = mx ? (long long)json_number_value(mx) : -1;
    if ((mn && (!json_is_number(mn) || a < 0)) || (mx && (!json_is_number(mx) || b < 0)))
        return osp_err(OSP_ERR_INVALID, "minLength/maxLength must be non-negative numbers");
    if (a > 1000000 || b > 1000000) return osp_err(OSP_ERR_UNSUPPORTED, "minLength/maxLength over 1000000");
    if (b >= 0 && a > b) { *out = gr_b_nt(&c->b); return OSP_OK; } /* nothing */
    int lens = a > 0 || b >= 0;
    if (lens && (np || minus)) { /* with a pattern or a format: one DFA, the product */
        if (a > 2000 || b > 2000) return osp_err(OSP_ERR_UNSUPPORTED, "minLength/maxLength over 2000 together with a pattern, a format or not");
        if (b >= 0) snprintf(lenre, sizeof lenre, "^[\\s\\S]{%lld,%lld}$", a, b);
        else snprintf(lenre, sizeof lenre, "^[\\s\\S]{%lld,}$", a);
        parts[np++] = lenre;
    } else if (lens) {
        if (a < GR_STR_CHUNK && b >= 0 && b < GR_STR_CHUNK) {
            snprintf(lenre, sizeof lenre, "^[\\s\\S]{%lld,%lld}$", a, b);
            return gr_b_regex(&c->b, lenre, GR_RE_JSONSTR, out);
        }
        return str_len_rest(c, a, b, 1, out);
    }
    if (!np && !minus) return gr_b_regex(&c->b, "[\\s\\S]*", GR_RE_JSONSTR, out);
    if (np == 1 && !minus) return gr_b_regex(&c->b, parts[0], GR_RE_JSONSTR, out);
    gr_dfa acc;
    TRYS(str_part(np ? parts[0] : "[\\s\\S]*", &acc));
    for (int i = 1; i < np; i++) {
        gr_dfa x, y;
        osp_status st = str_part(parts[i], &x);
        if (!st) st = gr_dfa_product(&acc, &x, GR_DFA_AND, &y), gr_dfa_free(&x);
        gr_dfa_free(&acc);
        if (st) return st;
        acc = y;
    }
    if (minus) {
        gr_dfa y;
        osp_status st = gr_dfa_product(&acc, minus, GR_DFA_MINUS, &y);
        gr_dfa_free(&acc);
        if (st) return st;
        acc = y;
    }
    return gr_b_dfa(&c->b, &acc, out);
}

/* The strings a `not` removed (NOT_STRINGS, NOT_PATTERNS): one DFA, their union's, in *minus (NULL: none). */
static osp_status string_minus(json_t *s, gr_dfa **minus) {
    json_t *ws = json_object_get(s, NOT_STRINGS), *ps = json_object_get(s, NOT_PATTERNS);
    *minus = NULL;
    if (!json_array_size(ws) && !json_array_size(ps)) return OSP_OK;
    sbuf r = {0};
    size_t i;
    json_t *x;
    json_array_foreach(ps, i, x) { /* each pattern as a group; unanchored ones search */
        const char *q = json_string_value(x);
        size_t n = strlen(q);
        int a = n && q[0] == '^', e = n > (size_t)a && q[n - 1] == '$' && (n < 2 || q[n - 2] != '\\');
        sb_str(&r, r.n ? "|" : ""), sb_str(&r, a ? "((" : "([\\s\\S]*(");
        sb_add(&r, q + a, n - a - e);
        sb_str(&r, e ? "))" : ")[\\s\\S]*)");
    }
    json_array_foreach(ws, i, x) {
        sb_str(&r, r.n ? "|(" : "(");
        for (const char *q = json_string_value(x); *q; q++) {
            if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == ' ')) sb_str(&r, "\\");
            sb_add(&r, q, 1);
        }
        sb_str(&r, ")");
    }
    sbuf w = {0};
    sb_str(&w, "^("), sb_str(&w, r.p), sb_str(&w, ")$");
    osp_free(r.p);
    gr_dfa *d = osp_malloc(OSP_POOL_MISC, sizeof *d);
    osp_status st = gr_regex_dfa(w.p, w.n, GR_RE_JSONSTR | GR_RE_ALLESC, d);
    osp_free(w.p);
    if (st) { osp_free(d); return st; }
    *minus = d;
    return OSP_OK;
}

static osp_status gen_string(sc *c, json_t *s, int32_t *out) {
    gr_dfa *minus;
    TRYS(string_minus(s, &minus));
    osp_status st = gen_string_minus(c, s, minus, out);
    if (minus) gr_dfa_free(minus), osp_free(minus);
    return st;
}

/* Integers (JSON's spelling, a sign and no leading zero) whose value is a multiple of k: the remainder of the
 * digits read so far is the state. */
static void mod_dfa(int32_t k, gr_dfa *d) {
    memset(d, 0, sizeof *d);
    d->ncls = 12; /* 0 other, 1 '-', 2 + digit */
    d->cls['-'] = 1;
    for (int x = 0; x < 10; x++) d->cls['0' + x] = (uint8_t)(2 + x);
    d->nstates = 4 + k; /* 1 start, 2 after '-', 3 "0", 4 + r: a remainder */
    d->next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)d->nstates * d->ncls);
    d->accept = osp_calloc(OSP_POOL_MISC, (size_t)d->nstates);
    d->next[1 * 12 + 1] = 2;
    for (int s0 = 1; s0 <= 2; s0++) {
        d->next[s0 * 12 + 2] = 3;
        for (int x = 1; x < 10; x++) d->next[s0 * 12 + 2 + x] = 4 + x % k;
    }
    for (int32_t r = 0; r < k; r++)
        for (int x = 0; x < 10; x++) d->next[(4 + r) * 12 + 2 + x] = 4 + (int32_t)(((int64_t)r * 10 + x) % k);
    d->accept[3] = d->accept[4] = 1;
}

/* The integers of regex r, and multiples of k when k > 1. */
static osp_status int_term(sc *c, const char *r, int32_t k, int32_t *out) {
    if (k <= 1) return re(c, r, out);
    gr_dfa a, m, x;
    TRYS(gr_regex_dfa_cached(r, GR_RE_PLAIN, &a));
    mod_dfa(k, &m);
    osp_status st = gr_dfa_product(&a, &m, GR_DFA_AND, &x);
    gr_dfa_free(&a), gr_dfa_free(&m);
    if (st) return st;
    return gr_b_dfa(&c->b, &x, out);
}

static osp_status gen_number(sc *c, json_t *s, int integer, int32_t *out) {
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
    /* draft 4: exclusiveMinimum/Maximum are booleans */
    if (json_is_boolean(emn)) { if (json_is_true(emn)) emn = mn, mn = NULL; else emn = NULL; }
    if (json_is_boolean(emx)) { if (json_is_true(emx)) emx = mx, mx = NULL; else emx = NULL; }
    json_t *mo = json_object_get(s, "multipleOf");
    int32_t k = 1;
    if (mo) { /* integers only: a fraction's multiples are judged in floating point by the validators */
        double q = json_number_value(mo);
        if (!json_is_number(mo) || !(q > 0)) return osp_err(OSP_ERR_INVALID, "multipleOf must be a positive number");
        if (!integer || q != floor(q) || q > 100000) return osp_err(OSP_ERR_UNSUPPORTED, "keyword \"multipleOf\" (other than an integer's, to 100000)");
        k = (int32_t)q;
    }
    if (!mn && !mx && !emn && !emx) return integer ? int_term(c, INT_RE, k, out) : re(c, NUM_RE, out);
    if (integer) {
        json_t *bs[4] = {mn, mx, emn, emx};
        for (int i = 0; i < 4; i++) /* before any conversion to long long */
            if (bs[i] && !(fabs(json_number_value(bs[i])) <= 1e15))
                return osp_err(OSP_ERR_UNSUPPORTED, "minimum/maximum beyond 1e15");
        int has_lo = 0, has_hi = 0;
        long long lo = 0, hi = 0;
        if (mn) has_lo = 1, lo = (long long)ceil(json_number_value(mn));
        if (emn) {
            long long e = (long long)floor(json_number_value(emn)) + 1;
            if (!has_lo || e > lo) lo = e;
            has_lo = 1;
        }
        if (mx) has_hi = 1, hi = (long long)floor(json_number_value(mx));
        if (emx) {
            long long e = (long long)ceil(json_number_value(emx)) - 1;
            if (!has_hi || e < hi) hi = e;
            has_hi = 1;
        }
        if ((has_lo && llabs(lo) > 1000000000000000LL) || (has_hi && llabs(hi) > 1000000000000000LL))
            return osp_err(OSP_ERR_UNSUPPORTED, "minimum/maximum beyond 1e15");
        if (has_lo && has_hi && lo > hi) { *out = gr_b_nt(&c->b); return OSP_OK; } /* nothing */
        sbuf b = {0};
        int_range_re(&b, has_lo, lo, has_hi, hi);
        osp_status st = int_term(c, b.p, k, out);
        osp_free(b.p);
        return st;
    }
    /* numbers with inclusive integer bounds: the integer part's range, a fraction, no exponent */
    if (!emn && !emx) {
        double l = mn ? json_number_value(mn) : 0, u = mx ? json_number_value(mx) : 0;
        if ((!mn || (l == floor(l) && fabs(l) < 1e15)) && (!mx || (u == floor(u) && fabs(u) < 1e15)) && (!mn || !mx || l <= u)) {
            long long L = (long long)l, U = (long long)u;
            sbuf b = {0};
            char t[64];
            int alt = 0;
            sb_str(&b, "(");
            if (!mn || L < 0) { /* negative: -(I.F) with I.F <= -L and >= -U (U < 0) */
                long long lo = mx && U < 0 ? -U : 0;
                sb_str(&b, "-(");
                if (!mn) { sbuf r = {0}; rng_nonneg(&r, lo, -1); sb_str(&b, "("), sb_str(&b, r.p), sb_str(&b, ")(\\.[0-9]+)?"); osp_free(r.p); }
                else {
                    if (-L - 1 >= lo) { sbuf r = {0}; rng_nonneg(&r, lo, -L - 1); sb_str(&b, "("), sb_str(&b, r.p), sb_str(&b, ")(\\.[0-9]+)?|"); osp_free(r.p); }
                    snprintf(t, sizeof t, "%lld(\\.0+)?", -L);
                    sb_str(&b, t);
                }
                sb_str(&b, ")");
                alt = 1;
            }
            if (!mx || U >= 0) { /* non-negative: I.F >= max(L, 0), <= U */
                long long lo = mn && L > 0 ? L : 0;
                if (alt) sb_str(&b, "|");
                if (!mx) { sbuf r = {0}; rng_nonneg(&r, lo, -1); sb_str(&b, "("), sb_str(&b, r.p), sb_str(&b, ")(\\.[0-9]+)?"); osp_free(r.p); }
                else {
                    if (U - 1 >= lo) { sbuf r = {0}; rng_nonneg(&r, lo, U - 1); sb_str(&b, "("), sb_str(&b, r.p), sb_str(&b, ")(\\.[0-9]+)?|"); osp_free(r.p); }
                    snprintf(t, sizeof t, "%lld(\\.0+)?", U);
                    sb_str(&b, t);
                }
            }
            sb_str(&b, ")");
            osp_status st = re(c, b.p, out);
            osp_free(b.p);
            return st;
        }
    }
    if (mx || emx) return osp_err(OSP_ERR_UNSUPPORTED, "maximum on a number");
    if (mn && json_number_value(mn) == 0 && !emn) return re(c, "(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?", out);
    if (emn && json_number_value(emn) == 0 && !mn)
        return re(c, "([1-9][0-9]*(\\.[0-9]+)?|0\\.[0-9]*[1-9][0-9]*)([eE][+-]?[0-9]+)?", out);
    return osp_err(OSP_ERR_UNSUPPORTED, "minimum on a number other than 0");
}

static osp_status gen_array(sc *c, json_t *s, int32_t *out) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addl = json_object_get(s, "additionalItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    json_t *uniq = json_object_get(s, "uniqueItems");
    if (json_is_true(uniq)) return osp_err(OSP_ERR_UNSUPPORTED, "uniqueItems");
    json_t *rest = items;
    if (json_is_array(items)) { /* draft 4 tuples */
        if (prefix) return osp_err(OSP_ERR_INVALID, "items as an array with prefixItems");
        prefix = items;
        rest = addl;
    } else if (addl && !json_is_true(addl)) {
        if (!prefix) rest = items; /* additionalItems without a tuple means nothing */
        else return osp_err(OSP_ERR_UNSUPPORTED, "additionalItems with prefixItems");
    }
    size_t np = prefix ? json_array_size(prefix) : 0;
    long long min = mn ? (long long)json_number_value(mn) : 0, max = mx ? (long long)json_number_value(mx) : -1;
    int rest_none = json_is_false(rest);
    if (rest_none && (max < 0 || max > (long long)np)) max = (long long)np;
    if (max >= 0 && max < min) { *out = gr_b_nt(&c->b); return OSP_OK; }
    long long bound = (long long)np > min ? (long long)np : min; /* items before the loop */
    if (max >= 0) bound = max;
    if (bound > 256) return osp_err(OSP_ERR_UNSUPPORTED, "minItems/maxItems/prefixItems over 256");
    int32_t ls, rs, co;
    TRYS(lit(c, "[", &ls)); TRYS(lit(c, "]", &rs)); TRYS(lit(c, ",", &co));
    int32_t vrest = c->any;
    if (rest && !rest_none) TRYS(gen(c, rest, &vrest));
    /* tail[k]: what may follow once k items are out */
    int32_t next = -1;
    for (long long k = bound; k >= 1; k--) {
        int32_t t = gr_b_nt(&c->b);
        int32_t v = vrest;
        if (k < (long long)np) TRYS(gen(c, json_array_get(prefix, (size_t)k), &v));
        if (k >= min) TRYS(prod(c, t, 0));
        if (max < 0 || k < max) {
            if (k == bound && max < 0) TRYS(prod(c, t, 5, c->ws, co, c->ws, v, t)); /* the loop */
            else if (next >= 0) TRYS(prod(c, t, 5, c->ws, co, c->ws, v, next));
        }
        next = t;
    }
    int32_t a = gr_b_nt(&c->b);
    if (min == 0) TRYS(prod(c, a, 3, ls, c->ws, rs));
    if (max != 0) {
        int32_t v0 = vrest;
        if (np > 0) TRYS(gen(c, json_array_get(prefix, 0), &v0));
        if (next < 0) { /* bound 0: unbounded list of rest items */
            int32_t t = gr_b_nt(&c->b);
            TRYS(prod(c, t, 0));
            TRYS(prod(c, t, 5, c->ws, co, c->ws, vrest, t));
            next = t;
        }
        TRYS(prod(c, a, 6, ls, c->ws, v0, next, c->ws, rs));
    }
    *out = a;
    return OSP_OK;
}

/* Additional keys of one kind: the key DFA d (taken over) less the declared names, then `: value`, as a
 * production of kv_add. */
static osp_status key_region(sc *c, gr_dfa *d, int32_t val, const char **names, size_t n, int32_t cl, int32_t kv_add) {
    osp_status st = OSP_OK;
    int32_t key;
    if (n) {
        char **w = osp_malloc(OSP_POOL_MISC, sizeof(char *) * n);
        size_t *wl = osp_malloc(OSP_POOL_MISC, sizeof(size_t) * n);
        for (size_t i = 0; i < n; i++) {
            json_t *js = json_string(names[i]);
            w[i] = json_dumps(js, JSON_ENCODE_ANY);
            wl[i] = strlen(w[i]);
            json_decref(js);
        }
        st = gr_dfa_minus_words(d, w, wl, (int)n);
        for (size_t i = 0; i < n; i++) free(w[i]);
        osp_free(w), osp_free(wl);
    }
    if (st) { gr_dfa_free(d); return st; }
    TRYS(gr_b_dfa(&c->b, d, &key));
    return prod(c, kv_add, 5, key, c->ws, cl, c->ws, val);
}

static osp_status gen_object(sc *c, json_t *s, int32_t *out) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return osp_err(OSP_ERR_INVALID, "properties is not an object");
    /* the property list: properties in order, then required names not among them */
    size_t np = props ? json_object_size(props) : 0, nr = json_is_array(req) ? json_array_size(req) : 0;
    const char **names = osp_malloc(OSP_POOL_MISC, sizeof(char *) * (np + nr + 1));
    json_t **schemas = osp_malloc(OSP_POOL_MISC, sizeof(json_t *) * (np + nr + 1));
    uint8_t *isreq = osp_calloc(OSP_POOL_MISC, np + nr + 1);
    size_t n = 0;
    const char *k;
    json_t *v;
    osp_status st = OSP_OK;
    if (props) json_object_foreach(props, k, v) names[n] = k, schemas[n] = v, n++;
    for (size_t i = 0; i < nr; i++) {
        const char *r = json_string_value(json_array_get(req, i));
        if (!r) continue;
        size_t j = 0;
        while (j < n && strcmp(names[j], r)) j++;
        if (j == n) names[n] = r, schemas[n] = NULL, n++;
        isreq[j] = 1;
    }
    /* patternProperties: none that constrain (schemas true with additional keys allowed), or one pattern: the
     * keys it matches take its schema (a declared one both), the others additionalProperties */
    json_t *pp = json_object_get(s, "patternProperties"), *pat_schema = NULL;
    const char *pat = NULL;
    if (json_is_object(pp) && json_object_size(pp)) {
        int trivial = 1;
        json_object_foreach(pp, k, v) trivial &= json_is_true(v) || (json_is_object(v) && only_annotations(v, ""));
        if (!(trivial && !json_is_false(addl))) {
            if (json_object_size(pp) != 1) st = osp_err(OSP_ERR_UNSUPPORTED, "keyword \"patternProperties\" with several patterns");
            else json_object_foreach(pp, k, v) pat = k, pat_schema = v;
        }
    }
    json_t *minp = json_object_get(s, "minProperties");
    int nonempty = 0;
    if (minp && json_number_value(minp) > 0) {
        size_t nreq = 0;
        for (size_t i = 0; i < n; i++) nreq += isreq[i];
        if (json_number_value(minp) <= 1) nonempty = 1;
        else if ((double)nreq < json_number_value(minp)) st = osp_err(OSP_ERR_UNSUPPORTED, "keyword \"minProperties\" over 1");
    }
    int32_t lb, rb, co, cl;
    int allow_add = !json_is_false(addl) || pat;
    int32_t kv_add = -1, add_rest = -1;
    if (!st && !(st = lit(c, "{", &lb)) && !(st = lit(c, "}", &rb)) && !(st = lit(c, ",", &co))) st = lit(c, ":", &cl);
    if (!st && pat && !(json_is_true(pat_schema) || (json_is_object(pat_schema) && only_annotations(pat_schema, "")))) {
        /* a declared name the pattern matches meets both schemas */
        gr_dfa d;
        st = gr_regex_dfa_cached(pat, GR_RE_JSONSTR, &d);
        for (size_t i = 0; i < n && !st; i++) {
            json_t *js = json_string(names[i]);
            char *q = json_dumps(js, JSON_ENCODE_ANY);
            int32_t x = 1;
            for (const char *b = q; *b && x; b++) x = gr_dfa_next(&d, x, (uint8_t)*b);
            if (x && d.accept[x]) {
                if (!schemas[i]) schemas[i] = pat_schema;
                else st = merge(c, schemas[i], pat_schema, &schemas[i]);
            }
            free(q);
            json_decref(js);
        }
        if (!st) gr_dfa_free(&d);
    }
    int32_t *kv = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (n + 1));
    for (size_t i = 0; i < n && !st; i++) {
        int32_t key, val = c->any;
        json_t *js = json_string(names[i]);
        st = json_lit(c, js, &key);
        json_decref(js);
        if (!st && schemas[i]) st = gen(c, schemas[i], &val);
        kv[i] = gr_b_nt(&c->b);
        if (!st) st = prod(c, kv[i], 5, key, c->ws, cl, c->ws, val);
    }
    if (!st && allow_add) {
        kv_add = gr_b_nt(&c->b), add_rest = gr_b_nt(&c->b);
        if (pat) { /* keys the pattern matches: its schema */
            int32_t vp;
            gr_dfa d;
            st = gen(c, pat_schema, &vp);
            if (!st) st = gr_regex_dfa_cached(pat, GR_RE_JSONSTR, &d);
            if (!st) st = key_region(c, &d, vp, names, n, cl, kv_add);
        }
        if (!st && !json_is_false(addl)) { /* the other keys: additionalProperties */
            int32_t va = c->any;
            gr_dfa d, pe, x = {0};
            if (addl && !json_is_true(addl)) st = gen(c, addl, &va);
            if (!st) st = gr_regex_dfa_cached("[\\s\\S]*", GR_RE_JSONSTR, &d);
            if (!st && pat) { /* less every spelling of a key the pattern matches */
                st = gr_regex_dfa(pat, strlen(pat), GR_RE_JSONSTR | GR_RE_ALLESC, &pe);
                if (!st) st = gr_dfa_product(&d, &pe, GR_DFA_MINUS, &x), gr_dfa_free(&pe);
                gr_dfa_free(&d);
                d = x;
            }
            if (!st) st = key_region(c, &d, va, names, n, cl, kv_add);
        }
        if (!st) st = prod(c, add_rest, 0);
        if (!st) st = prod(c, add_rest, 5, c->ws, co, c->ws, kv_add, add_rest);
    }
    /* after[i]: something is out, properties i.. may follow; first[i]: nothing is out yet */
    int32_t after = allow_add ? add_rest : c->eps, first = gr_b_nt(&c->b);
    if (!st && !nonempty) st = prod(c, first, 0);
    if (!st && allow_add) st = prod(c, first, 2, kv_add, add_rest);
    for (size_t i = n; i-- > 0 && !st;) {
        int32_t a = gr_b_nt(&c->b), f = gr_b_nt(&c->b);
        st = prod(c, a, 5, c->ws, co, c->ws, kv[i], after);
        if (!st && !isreq[i]) st = prod(c, a, 1, after);
        if (!st) st = prod(c, f, 2, kv[i], after);
        if (!st && !isreq[i]) st = prod(c, f, 1, first);
        after = a, first = f;
    }
    int32_t o = gr_b_nt(&c->b);
    if (!st) st = prod(c, o, 5, lb, c->ws, first, c->ws, rb);
    osp_free(kv), osp_free(names), osp_free(schemas), osp_free(isreq);
    *out = o;
    return st;
}

/* The JSON types a value has (integer-valued numbers are both). */
static unsigned value_types(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return 1;
    case JSON_TRUE: case JSON_FALSE: return 2;
    case JSON_OBJECT: return 4;
    case JSON_ARRAY: return 8;
    case JSON_INTEGER: return 16 | 64;
    case JSON_REAL: return json_real_value(v) == (double)(long long)json_real_value(v) ? 16 | 64 : 16;
    case JSON_STRING: return 32;
    }
    return 0;
}
/* The types a (flattened) schema can match, from type, const and enum. */
static unsigned schema_types(json_t *s) {
    if (!json_is_object(s)) return json_is_false(s) ? 0 : 0x7f;
    json_t *t = json_object_get(s, "type"), *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    unsigned m = t ? type_bits(t) : 0x7f;
    if (m & 16) m |= 64;
    if (m & 64) m |= 16; /* an integer is a number */
    if (cst) m &= value_types(cst);
    if (json_is_array(en)) {
        unsigned e = 0;
        size_t i;
        json_t *x;
        json_array_foreach(en, i, x) e |= value_types(x);
        m &= e;
    }
    return m;
}
/* Two schemas' const/enum value sets share no value (1), or cannot say (0). */
static int values_disjoint(json_t *a, json_t *b) {
    json_t *va = json_object_get(a, "const"), *vb = json_object_get(b, "const");
    json_t *ea = json_object_get(a, "enum"), *eb = json_object_get(b, "enum");
    json_t *la = va ? json_pack("[O]", va) : ea ? json_incref(ea) : NULL;
    json_t *lb = vb ? json_pack("[O]", vb) : eb ? json_incref(eb) : NULL;
    int r = la && lb && json_is_array(la) && json_is_array(lb);
    for (size_t i = 0; r && i < json_array_size(la); i++)
        for (size_t j = 0; r && j < json_array_size(lb); j++)
            if (json_equal(json_array_get(la, i), json_array_get(lb, j))) r = 0;
    json_decref(la), json_decref(lb);
    return r;
}
/* oneOf is compiled as anyOf, which is exact only when no text matches two
 * branches: different types, different constants, or a property (a
 * discriminator) both require with different constants. Otherwise refuse. */
static osp_status one_of_disjoint(sc *c, json_t *arr) {
    size_t n = json_array_size(arr);
    if (n > 64) return osp_err(OSP_ERR_UNSUPPORTED, "oneOf with more than 64 branches");
    json_t *f[64];
    for (size_t i = 0; i < n; i++) TRYS(flatten(c, json_array_get(arr, i), &f[i]));
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!(schema_types(f[i]) & schema_types(f[j]))) continue;
            if (json_is_object(f[i]) && json_is_object(f[j]) && values_disjoint(f[i], f[j])) continue;
            int disc = 0;
            json_t *pi = json_object_get(f[i], "properties"), *pj = json_object_get(f[j], "properties");
            json_t *ri = json_object_get(f[i], "required"), *rj = json_object_get(f[j], "required");
            const char *k;
            json_t *x;
            if (json_is_object(pi) && json_is_object(pj) && json_is_array(ri) && json_is_array(rj))
                json_object_foreach(pi, k, x) {
                    json_t *y = json_object_get(pj, k), *fx, *fy;
                    int req_i = 0, req_j = 0;
                    size_t q;
                    json_t *r;
                    json_array_foreach(ri, q, r) req_i |= json_is_string(r) && !strcmp(json_string_value(r), k);
                    json_array_foreach(rj, q, r) req_j |= json_is_string(r) && !strcmp(json_string_value(r), k);
                    if (!y || !req_i || !req_j) continue;
                    TRYS(flatten(c, x, &fx));
                    TRYS(flatten(c, y, &fy));
                    if (json_is_object(fx) && json_is_object(fy) && values_disjoint(fx, fy)) { disc = 1; break; }
                }
            if (!disc) return osp_err(OSP_ERR_UNSUPPORTED, "keyword \"oneOf\" (branches %zu and %zu may both match)", i, j);
        }
    return OSP_OK;
}

/* oneOf as anyOf: as it is where no text matches two branches; else branch i becomes "B_i and not B_j for every
 * other j" where those negations exist (required-only branches, types, constants...), so exactly one holds. */
static osp_status one_of_exclusive(sc *c, json_t *arr, json_t **out) {
    *out = arr;
    if (!one_of_disjoint(c, arr)) return OSP_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", osp_last_error());
    size_t n = json_array_size(arr);
    if (n > 8) return osp_err(OSP_ERR_UNSUPPORTED, "%s", why);
    json_t *neg[8], *r = keep(c, json_array());
    for (size_t i = 0; i < n; i++)
        if (negate(c, json_array_get(arr, i), &neg[i])) return osp_err(OSP_ERR_UNSUPPORTED, "%s", why);
    for (size_t i = 0; i < n; i++) {
        json_t *all = json_array();
        json_array_append(all, json_array_get(arr, i));
        for (size_t j = 0; j < n; j++)
            if (j != i) json_array_append(all, neg[j]);
        json_array_append_new(r, json_pack("{s:o}", "allOf", all));
    }
    *out = r;
    return OSP_OK;
}

static osp_status gen_body(sc *c, json_t *s, int32_t *out) {
    if (json_is_true(s)) { *out = c->any; return OSP_OK; }
    if (json_is_false(s)) { *out = gr_b_nt(&c->b); return OSP_OK; }
    if (!json_is_object(s)) return osp_err(OSP_ERR_INVALID, "a schema must be an object or a boolean");
    TRYS(flatten(c, s, &s));
    if (json_is_boolean(s)) return gen_body(c, s, out);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        for (int i = 0; unsupported[i]; i++)
            if (!strcmp(k, unsupported[i])) {
                return osp_err(OSP_ERR_UNSUPPORTED, "keyword \"%s\"", k);
            }
    }
    json_t *any = json_object_get(s, "anyOf");
    if (!any) {
        any = json_object_get(s, "oneOf");
        if (any && json_is_array(any)) TRYS(one_of_exclusive(c, any, &any));
    }
    if (any) {
        if (!json_is_array(any)) return osp_err(OSP_ERR_INVALID, "anyOf/oneOf is not an array");
        /* the other keywords (a oneOf beside an anyOf too) hold in every branch */
        json_t *rest = without(c, s, json_object_get(s, "anyOf") ? "anyOf" : "oneOf");
        int plain = only_annotations(rest, "");
        int32_t a = gr_b_nt(&c->b);
        size_t i;
        json_t *x;
        json_array_foreach(any, i, x) {
            json_t *m = x;
            if (!plain) TRYS(merge(c, rest, x, &m));
            int32_t y;
            TRYS(gen(c, m, &y));
            TRYS(prod(c, a, 1, y));
        }
        *out = a;
        return OSP_OK;
    }
    json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cst || en) {
        int32_t a = gr_b_nt(&c->b), y;
        if (cst) {
            json_t *ty = json_object_get(s, "type");
            if (!ty || (value_types(cst) & type_bits(ty))) {
                TRYS(json_lit(c, cst, &y));
                TRYS(prod(c, a, 1, y));
            }
        } else {
            if (!json_is_array(en)) return osp_err(OSP_ERR_INVALID, "enum is not an array");
            size_t i;
            json_t *x;
            json_t *ty = json_object_get(s, "type");
            unsigned tm = ty ? type_bits(ty) : 0x7f;
            json_array_foreach(en, i, x) {
                if (!(value_types(x) & tm)) continue; /* no value is both */
                TRYS(json_lit(c, x, &y));
                TRYS(prod(c, a, 1, y));
            }
        }
        *out = a;
        return OSP_OK;
    }
    json_t *t = json_object_get(s, "type");
    unsigned m = t ? type_bits(t) : 0x7f;
    if (json_is_array(t) && !json_array_size(t)) { *out = gr_b_nt(&c->b); return OSP_OK; } /* merged types that meet nowhere */
    if (t && !m) return osp_err(OSP_ERR_INVALID, "type: unknown type");
    if (m & 16) m &= ~64u; /* number covers integer */
    int32_t a = gr_b_nt(&c->b), y;
    if (m & 1) { TRYS(lit(c, "null", &y)); TRYS(prod(c, a, 1, y)); }
    if (m & 2) {
        TRYS(lit(c, "true", &y)); TRYS(prod(c, a, 1, y));
        TRYS(lit(c, "false", &y)); TRYS(prod(c, a, 1, y));
    }
    if (m & 4) { TRYS(gen_object(c, s, &y)); TRYS(prod(c, a, 1, y)); }
    if (m & 8) { TRYS(gen_array(c, s, &y)); TRYS(prod(c, a, 1, y)); }
    if (m & 16) { TRYS(gen_number(c, s, 0, &y)); TRYS(prod(c, a, 1, y)); }
    if (m & 64) { TRYS(gen_number(c, s, 1, &y)); TRYS(prod(c, a, 1, y)); }
    if (m & 32) { TRYS(gen_string(c, s, &y)); TRYS(prod(c, a, 1, y)); }
    *out = a;
    return OSP_OK;
}

/* A schema node: memoized, so a $ref cycle closes on the nonterminal. */
static osp_status gen(sc *c, json_t *s, int32_t *out) {
    for (int32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].node == s) { *out = c->memo[i].nt; return OSP_OK; }
    if (c->n_memo > 100000) return osp_err(OSP_ERR_UNSUPPORTED, "schema too large");
    if (c->n_memo == c->cap_memo) {
        int32_t nc = c->cap_memo ? c->cap_memo * 2 : 64;
        memo *m = osp_malloc(OSP_POOL_MISC, sizeof(memo) * nc);
        if (c->n_memo) memcpy(m, c->memo, sizeof(memo) * c->n_memo);
        osp_free(c->memo);
        c->memo = m, c->cap_memo = nc;
    }
    int32_t nt = gr_b_nt(&c->b);
    c->memo[c->n_memo++] = (memo){s, nt};
    if (++c->depth > 200) return osp_err(OSP_ERR_UNSUPPORTED, "schema nested too deep");
    int32_t body;
    TRYS(gen_body(c, s, &body));
    c->depth--;
    *out = nt;
    return prod(c, nt, 1, body);
}

osp_status osp_grammar_from_json_schema(const char *schema, size_t len, osp_grammar **out) {
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root) return osp_err(OSP_ERR_INVALID, "JSON Schema: %s (line %d)", je.text, je.line);
    sc c;
    memset(&c, 0, sizeof c);
    gr_b_init(&c.b);
    c.root = root;
    osp_status st;
    int32_t w, start = -1;
    c.ws = gr_b_nt(&c.b), c.any = gr_b_nt(&c.b), c.eps = gr_b_nt(&c.b);
    st = re(&c, "[ \\t\\n\\r]{1,64}", &w);
    if (!st) st = prod(&c, c.ws, 0);
    if (!st) st = prod(&c, c.ws, 1, w);
    if (!st) st = prod(&c, c.eps, 0);
    if (!st) st = build_any(&c);
    if (!st) st = gen(&c, root, &start);
    if (!st) {
        /* leading and trailing whitespace, as JSON allows */
        int32_t top = gr_b_nt(&c.b);
        st = prod(&c, top, 3, c.ws, start, c.ws);
        if (!st) st = gr_b_finish(&c.b, top, out);
    }
    gr_b_free(&c.b);
    for (int32_t i = 0; i < c.n_keep; i++) json_decref(c.keep[i]);
    osp_free(c.keep), osp_free(c.memo);
    json_decref(root);
    return st;
}

osp_status osp_grammar_from_regex(const char *r, size_t len, osp_grammar **out) {
    gr_builder b;
    gr_b_init(&b);
    gr_dfa d;
    osp_status st = gr_regex_dfa(r, len, GR_RE_PLAIN, &d);
    int32_t t, s = gr_b_nt(&b);
    if (!st) st = gr_b_dfa(&b, &d, &t);
    if (!st) st = gr_b_prod(&b, s, &t, 1);
    if (!st) st = gr_b_finish(&b, s, out);
    gr_b_free(&b);
    return st;
}
