/* text/jinja filters and tests: jinja2's filters.py and tests.py, with
 * Hugging Face's tojson (json.dumps, ensure_ascii=False, no HTML escaping).
 *
 * Filters that return generators in jinja2 (map, select, reject,
 * selectattr, rejectattr, reverse, items) return lists here: the same
 * items when iterated, joined or passed to |list, but printing one shows a
 * list rather than "<generator object ...>".
 */
#include <math.h>
#include <stdlib.h>
#include "text/jinja_internal.h"

#define BIND(fname, names, nreq, v) \
    OSP_TRY(jargs_bind(st, fname, a, names, (int)(sizeof names / sizeof *names), nreq, v))

static int given(jv v) { return v.k != JK_ABSENT; }

/* ------------------------------------------------------------------ helpers */

/* jinja2's make_attrgetter: "a.b.0" looked up with getitem, part by part. */
static osp_status attr_get(jstate *st, jv item, jv attr, jv dflt, jv *out) {
    if (attr.k == JK_STR) {
        const char *s = attr.u.s;
        size_t n = attr.n, i = 0;
        for (;;) {
            size_t e = i;
            while (e < n && s[e] != '.') e++;
            jv key = jv_strn(s + i, e - i);
            int digits = e > i;
            for (size_t k = i; k < e; k++) digits &= s[k] >= '0' && s[k] <= '9';
            if (digits) key = jv_int(strtoll(s + i, NULL, 10));
            OSP_TRY(jv_getitem(st, item, key, &item));
            if (e >= n) break;
            i = e + 1;
        }
    } else {
        OSP_TRY(jv_getitem(st, item, attr, &item));
    }
    if (item.k == JK_UNDEF && given(dflt) && dflt.k != JK_NONE) item = dflt;
    *out = item;
    return OSP_OK;
}

static osp_status lower_key(jstate *st, jv v, int case_sensitive, jv *out) {
    if (!case_sensitive && v.k == JK_STR) return ju_case_map(st, v, JU_LOWER, out);
    *out = v;
    return OSP_OK;
}

/* Stable merge sort of idx[0..n) by keys (Python's sorted, reverse kept stable). */
static osp_status msort(jstate *st, const jv *keys, uint32_t *idx, uint32_t *tmp, uint32_t n, int reverse) {
    if (n < 2) return OSP_OK;
    uint32_t m = n / 2;
    OSP_TRY(msort(st, keys, idx, tmp, m, reverse));
    OSP_TRY(msort(st, keys, idx + m, tmp, n - m, reverse));
    uint32_t i = 0, j = m, k = 0;
    while (i < m && j < n) {
        int c;
        if (reverse) OSP_TRY(jv_cmp(st, keys[idx[i]], keys[idx[j]], "<", &c));
        else OSP_TRY(jv_cmp(st, keys[idx[j]], keys[idx[i]], "<", &c));
        tmp[k++] = c < 0 ? idx[j++] : idx[i++];
    }
    while (i < m) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
    return OSP_OK;
}

static osp_status sort_order(jstate *st, const jv *keys, uint32_t n, int reverse, uint32_t **out) {
    uint32_t *idx, *tmp;
    JALLOC(st, idx, (n + 1) * sizeof *idx);
    JALLOC(st, tmp, (n + 1) * sizeof *tmp);
    for (uint32_t i = 0; i < n; i++) idx[i] = i;
    OSP_TRY(msort(st, keys, idx, tmp, n, reverse));
    *out = idx;
    return OSP_OK;
}

static osp_status list_of(jstate *st, const jv *items, uint32_t n, jv *out) {
    jlist *l;
    OSP_TRY(jlist_new(st, n, &l));
    if (n) memcpy(l->v, items, n * sizeof *items);
    l->n = n;
    *out = jv_list(l, 0);
    return OSP_OK;
}

static osp_status call_test_by_name(jstate *st, jv name, jv item, const jargs *extra, int *res) {
    if (name.k != JK_STR) return jerr(st, OSP_ERR_INVALID, "test name must be a string");
    const jtest_def *t = jtest_find(name.u.s, name.n);
    if (!t) return jerr(st, OSP_ERR_INVALID, "No test named '%.*s'.", (int)name.n, name.u.s);
    return t->fn(st, item, extra, res);
}

/* ------------------------------------------------------------------ string filters */

static osp_status f_string(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "string", a, NULL, 0, 0, NULL));
    uint8_t safe = val.k == JK_STR && val.safe;
    OSP_TRY(jv_to_str(st, val, out));
    out->safe = safe;
    return OSP_OK;
}

static osp_status f_case(jstate *st, jv val, const jargs *a, jv *out, const char *name, ju_case mode) {
    OSP_TRY(jargs_bind(st, name, a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, &val));
    return ju_case_map(st, val, mode, out);
}
static osp_status f_upper(jstate *st, jv val, const jargs *a, jv *out) { return f_case(st, val, a, out, "upper", JU_UPPER); }
static osp_status f_lower(jstate *st, jv val, const jargs *a, jv *out) { return f_case(st, val, a, out, "lower", JU_LOWER); }
static osp_status f_capitalize(jstate *st, jv val, const jargs *a, jv *out) { return f_case(st, val, a, out, "capitalize", JU_CAPITALIZE); }

/* jinja2's title: split on runs of [-\s({\[<]; each word: first upper, rest lower. */
static int title_sep(int32_t cp) { return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ju_isspace(cp); }

static osp_status f_title(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "title", a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, &val));
    jbuf b = {0};
    osp_status rc = OSP_OK;
    const char *s = val.u.s;
    size_t n = val.n, i = 0;
    while (i < n && rc == OSP_OK) {
        size_t k = i;
        int32_t cp = ju_next(s, n, &k);
        size_t e = k;
        int sep = title_sep(cp);
        while (e < n) {
            size_t q = e;
            if (title_sep(ju_next(s, n, &q)) != sep) break;
            e = q;
        }
        if (sep) {
            rc = jbuf_put(st, &b, s + i, e - i);
        } else {
            jv first, rest;
            rc = ju_case_map(st, jv_strn(s + i, k - i), JU_UPPER, &first);
            if (rc == OSP_OK) rc = ju_case_map(st, jv_strn(s + k, e - k), JU_LOWER, &rest);
            if (rc == OSP_OK) rc = jbuf_put(st, &b, first.u.s, first.n);
            if (rc == OSP_OK) rc = jbuf_put(st, &b, rest.u.s, rest.n);
        }
        i = e;
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status f_trim(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"chars"};
    jv v[1];
    BIND("trim", names, 0, v);
    OSP_TRY(jv_to_str(st, val, &val));
    if (given(v[0]) && v[0].k != JK_NONE) {
        if (v[0].k != JK_STR) return jerr(st, OSP_ERR_INVALID, "TypeError: strip arg must be None or str");
        *out = ju_strip(val, &v[0], 3);
    } else {
        *out = ju_strip(val, NULL, 3);
    }
    return OSP_OK;
}

static osp_status f_replace(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"old", "new", "count"};
    jv v[3];
    BIND("replace", names, 2, v);
    OSP_TRY(jv_to_str(st, val, &val));
    OSP_TRY(jv_to_str(st, v[0], &v[0]));
    OSP_TRY(jv_to_str(st, v[1], &v[1]));
    int64_t count = -1;
    if (given(v[2]) && v[2].k != JK_NONE) {
        if (v[2].k != JK_INT && v[2].k != JK_BOOL)
            return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object cannot be interpreted as an integer", jv_type_name(v[2]));
        count = v[2].u.i;
    }
    return ju_replace(st, val, v[0], v[1], count, out);
}

static osp_status f_escape(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "escape", a, NULL, 0, 0, NULL));
    if (val.k == JK_STR && val.safe) { *out = val; return OSP_OK; }
    OSP_TRY(jv_to_str(st, val, &val));
    return jv_html_escape(st, val, out);
}

static osp_status f_forceescape(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "forceescape", a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, &val));
    return jv_html_escape(st, val, out);
}

static osp_status f_safe(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "safe", a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, out));
    out->safe = 1;
    return OSP_OK;
}

static osp_status f_indent(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"width", "first", "blank"};
    jv v[3];
    BIND("indent", names, 0, v);
    OSP_TRY(jv_to_str(st, val, &val));
    jv ind = jv_cstr("    ");
    if (given(v[0])) {
        if (v[0].k == JK_STR) ind = v[0];
        else if (v[0].k == JK_INT || v[0].k == JK_BOOL) {
            int64_t w = v[0].u.i < 0 ? 0 : v[0].u.i;
            if (w > 10000) return jerr(st, OSP_ERR_RANGE, "indent width too large");
            char *p;
            JALLOC(st, p, (size_t)w + 1);
            memset(p, ' ', (size_t)w);
            ind = jv_strn(p, (size_t)w);
        } else {
            return jerr(st, OSP_ERR_INVALID, "TypeError: can't multiply sequence by non-int of type '%s'", jv_type_name(v[0]));
        }
    }
    int first = given(v[1]) && jv_truthy(v[1]), blank = given(v[2]) && jv_truthy(v[2]);
    jv s;
    OSP_TRY(jv_concat2(st, val, jv_cstr("\n"), &s));
    jlist *lines;
    OSP_TRY(ju_splitlines(st, s.u.s, s.n, 0, &lines));
    jbuf b = {0};
    osp_status rc = OSP_OK;
    if (first) rc = jbuf_put(st, &b, ind.u.s, ind.n);
    for (uint32_t i = 0; i < lines->n && rc == OSP_OK; i++) {
        jv line = lines->v[i];
        if (i) {
            rc = jbuf_putc(st, &b, '\n');
            if (rc == OSP_OK && (blank || line.n)) rc = jbuf_put(st, &b, ind.u.s, ind.n);
        }
        if (rc == OSP_OK) rc = jbuf_put(st, &b, line.u.s, line.n);
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status f_center(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"width"};
    jv v[1];
    BIND("center", names, 0, v);
    OSP_TRY(jv_to_str(st, val, &val));
    jv w = given(v[0]) ? v[0] : jv_int(80), m;
    jargs ca = {.n = 1, .v = &w};
    osp_status err = OSP_OK;
    jmethod_find(st, val, (jstr){"center", 6}, &m, &err); /* str.center */
    OSP_TRY(err);
    return jcall(st, m, &ca, out);
}

static osp_status f_wordcount(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "wordcount", a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, &val));
    int64_t c = 0;
    int in = 0;
    for (size_t i = 0; i < val.n;) {
        int32_t cp = ju_next(val.u.s, val.n, &i);
        int w = cp == '_' || ju_is_alnum(cp);
        if (w && !in) c++;
        in = w;
    }
    *out = jv_int(c);
    return OSP_OK;
}

static osp_status f_format(jstate *st, jv val, const jargs *a, jv *out) {
    if (a->n && a->nkw)
        return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: can't handle positional and keyword arguments at the same time");
    OSP_TRY(jv_to_str(st, val, &val));
    jv args;
    if (a->nkw) {
        jdict *d;
        OSP_TRY(jdict_new(st, a->nkw, &d));
        for (uint32_t i = 0; i < a->nkw; i++) OSP_TRY(jdict_set(st, d, jv_strn(a->kwn[i].s, a->kwn[i].n), a->kwv[i]));
        args = jv_dict(d);
    } else {
        jlist *l;
        OSP_TRY(jlist_new(st, a->n, &l));
        for (uint32_t i = 0; i < a->n; i++) l->v[l->n++] = a->v[i];
        args = jv_list(l, 1);
    }
    return jfmt_percent(st, val, args, out);
}

/* ------------------------------------------------------------------ values */

static osp_status f_default(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"default_value", "boolean"};
    jv v[2];
    BIND("default", names, 0, v);
    int boolean = given(v[1]) && jv_truthy(v[1]);
    if (val.k == JK_UNDEF || (boolean && !jv_truthy(val))) *out = given(v[0]) ? v[0] : jv_strn("", 0);
    else *out = val;
    return OSP_OK;
}

static osp_status f_length(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "length", a, NULL, 0, 0, NULL));
    int64_t n;
    OSP_TRY(jv_len(st, val, &n));
    *out = jv_int(n);
    return OSP_OK;
}

static osp_status f_list(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "list", a, NULL, 0, 0, NULL));
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    return list_of(st, items, n, out);
}

static osp_status f_first_last(jstate *st, jv val, const jargs *a, jv *out, int last) {
    OSP_TRY(jargs_bind(st, last ? "last" : "first", a, NULL, 0, 0, NULL));
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    if (!n) return jv_undef_msg(st, out, 0, "No %s item, sequence was empty.", last ? "last" : "first");
    *out = items[last ? n - 1 : 0];
    return OSP_OK;
}
static osp_status f_first(jstate *st, jv val, const jargs *a, jv *out) { return f_first_last(st, val, a, out, 0); }
static osp_status f_last(jstate *st, jv val, const jargs *a, jv *out) { return f_first_last(st, val, a, out, 1); }

static osp_status f_join(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"d", "attribute"};
    jv v[2];
    BIND("join", names, 0, v);
    jv sep = jv_strn("", 0);
    if (given(v[0])) OSP_TRY(jv_to_str(st, v[0], &sep));
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    jbuf b = {0};
    osp_status rc = OSP_OK;
    for (uint32_t i = 0; i < n && rc == OSP_OK; i++) {
        jv it = items[i];
        if (given(v[1]) && v[1].k != JK_NONE) rc = attr_get(st, it, v[1], jv_make(JK_ABSENT), &it);
        if (rc == OSP_OK && i) rc = jbuf_put(st, &b, sep.u.s, sep.n);
        if (rc == OSP_OK) rc = jv_write_str(st, &b, it);
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status f_tojson(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    jv v[4];
    BIND("tojson", names, 0, v);
    jjson_opts o = {.item_sep = ", ", .key_sep = ": "};
    o.ensure_ascii = given(v[0]) && jv_truthy(v[0]);
    o.sort_keys = given(v[3]) && jv_truthy(v[3]);
    if (given(v[1]) && v[1].k != JK_NONE) {
        if (v[1].k == JK_STR) {
            o.indent = v[1].u.s;
            o.indent_n = v[1].n;
        } else if (v[1].k == JK_INT || v[1].k == JK_BOOL) {
            int64_t w = v[1].u.i < 0 ? 0 : v[1].u.i;
            if (w > 1000) return jerr(st, OSP_ERR_RANGE, "tojson indent too large");
            char *p;
            JALLOC(st, p, (size_t)w + 1);
            memset(p, ' ', (size_t)w);
            o.indent = p;
            o.indent_n = (size_t)w;
        } else {
            return jerr(st, OSP_ERR_INVALID, "TypeError: tojson indent must be an int or a string");
        }
        o.item_sep = ",";
    }
    if (given(v[2]) && v[2].k != JK_NONE) {
        if (!jv_is_seq(v[2]) || v[2].u.l->n != 2 || v[2].u.l->v[0].k != JK_STR || v[2].u.l->v[1].k != JK_STR)
            return jerr(st, OSP_ERR_INVALID, "TypeError: tojson separators must be a pair of strings");
        jv s0, s1;
        OSP_TRY(jv_str_copy(st, v[2].u.l->v[0].u.s, v[2].u.l->v[0].n, &s0));
        OSP_TRY(jv_str_copy(st, v[2].u.l->v[1].u.s, v[2].u.l->v[1].n, &s1));
        o.item_sep = s0.u.s;
        o.key_sep = s1.u.s;
    }
    jbuf b = {0};
    osp_status rc = jv_write_json(st, &b, val, &o, 0);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status f_items(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "items", a, NULL, 0, 0, NULL));
    if (val.k == JK_UNDEF) return list_of(st, NULL, 0, out);
    if (val.k != JK_DICT) return jerr(st, OSP_ERR_INVALID, "TypeError: Can only get item pairs from a mapping.");
    jv m;
    osp_status err = OSP_OK;
    jmethod_find(st, val, (jstr){"items", 5}, &m, &err);
    OSP_TRY(err);
    jargs none = {0};
    return jcall(st, m, &none, out);
}

static osp_status f_dictsort(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    jv v[3];
    BIND("dictsort", names, 0, v);
    if (val.k != JK_DICT) {
        if (val.k == JK_UNDEF) return jundef_fail(st, val);
        return jerr(st, OSP_ERR_INVALID, "AttributeError: '%s' object has no attribute 'items'", jv_type_name(val));
    }
    int by_value = 0;
    if (given(v[1])) {
        if (jv_is_str(v[1], "value")) by_value = 1;
        else if (!jv_is_str(v[1], "key"))
            return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: You can only sort by either 'key' or 'value'");
    }
    int cs = given(v[0]) && jv_truthy(v[0]), rev = given(v[2]) && jv_truthy(v[2]);
    const jdict *d = val.u.m;
    jv *keys;
    JALLOC(st, keys, (d->n + 1) * sizeof *keys);
    for (uint32_t i = 0; i < d->n; i++) OSP_TRY(lower_key(st, by_value ? d->v[i] : d->k[i], cs, &keys[i]));
    uint32_t *idx;
    OSP_TRY(sort_order(st, keys, d->n, rev, &idx));
    jlist *l;
    OSP_TRY(jlist_new(st, d->n, &l));
    for (uint32_t i = 0; i < d->n; i++) {
        jlist *p;
        OSP_TRY(jlist_new(st, 2, &p));
        p->v[0] = d->k[idx[i]];
        p->v[1] = d->v[idx[i]];
        p->n = 2;
        l->v[l->n++] = jv_list(p, 1);
    }
    *out = jv_list(l, 0);
    return OSP_OK;
}

static osp_status f_sort(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"reverse", "case_sensitive", "attribute"};
    jv v[3];
    BIND("sort", names, 0, v);
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    int rev = given(v[0]) && jv_truthy(v[0]), cs = given(v[1]) && jv_truthy(v[1]);
    jv *keys;
    JALLOC(st, keys, (n + 1) * sizeof *keys);
    for (uint32_t i = 0; i < n; i++) {
        jv k = items[i];
        if (given(v[2]) && v[2].k != JK_NONE) OSP_TRY(attr_get(st, k, v[2], jv_make(JK_ABSENT), &k));
        OSP_TRY(lower_key(st, k, cs, &keys[i]));
    }
    uint32_t *idx;
    OSP_TRY(sort_order(st, keys, n, rev, &idx));
    jlist *l;
    OSP_TRY(jlist_new(st, n, &l));
    for (uint32_t i = 0; i < n; i++) l->v[l->n++] = items[idx[i]];
    *out = jv_list(l, 0);
    return OSP_OK;
}

static osp_status f_unique(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    jv v[2];
    BIND("unique", names, 0, v);
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    int cs = given(v[0]) && jv_truthy(v[0]);
    jlist *l, *seen;
    OSP_TRY(jlist_new(st, 0, &l));
    OSP_TRY(jlist_new(st, 0, &seen));
    for (uint32_t i = 0; i < n; i++) {
        jv k = items[i];
        OSP_TRY(jstep(st));
        if (given(v[1]) && v[1].k != JK_NONE) OSP_TRY(attr_get(st, k, v[1], jv_make(JK_ABSENT), &k));
        OSP_TRY(lower_key(st, k, cs, &k));
        int dup = 0;
        for (uint32_t j = 0; j < seen->n && !dup; j++) dup = jv_eq(seen->v[j], k);
        if (dup) continue;
        OSP_TRY(jlist_push(st, seen, k));
        OSP_TRY(jlist_push(st, l, items[i]));
    }
    *out = jv_list(l, 0);
    return OSP_OK;
}

static osp_status f_minmax(jstate *st, jv val, const jargs *a, jv *out, int want_max) {
    static const char *const names[] = {"case_sensitive", "attribute"};
    jv v[2];
    BIND(want_max ? "max" : "min", names, 0, v);
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    if (!n) return jv_undef_msg(st, out, 0, "No aggregated item, sequence was empty.");
    int cs = given(v[0]) && jv_truthy(v[0]);
    uint32_t best = 0;
    jv bk = jv_none();
    for (uint32_t i = 0; i < n; i++) {
        jv k = items[i];
        if (given(v[1]) && v[1].k != JK_NONE) OSP_TRY(attr_get(st, k, v[1], jv_make(JK_ABSENT), &k));
        OSP_TRY(lower_key(st, k, cs, &k));
        if (i) {
            int c;
            OSP_TRY(jv_cmp(st, k, bk, want_max ? ">" : "<", &c));
            if (want_max ? c <= 0 : c >= 0) continue;
        }
        best = i;
        bk = k;
    }
    *out = items[best];
    return OSP_OK;
}
static osp_status f_min(jstate *st, jv val, const jargs *a, jv *out) { return f_minmax(st, val, a, out, 0); }
static osp_status f_max(jstate *st, jv val, const jargs *a, jv *out) { return f_minmax(st, val, a, out, 1); }

static osp_status f_reverse(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "reverse", a, NULL, 0, 0, NULL));
    if (val.k == JK_STR) return jv_slice(st, val, jv_make(JK_ABSENT), jv_make(JK_ABSENT), jv_int(-1), out);
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    jlist *l;
    OSP_TRY(jlist_new(st, n, &l));
    for (uint32_t i = 0; i < n; i++) l->v[l->n++] = items[n - 1 - i];
    *out = jv_list(l, 0);
    return OSP_OK;
}

static osp_status f_sum(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"attribute", "start"};
    jv v[2];
    BIND("sum", names, 0, v);
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    jv acc = given(v[1]) ? v[1] : jv_int(0);
    for (uint32_t i = 0; i < n; i++) {
        jv it = items[i];
        if (given(v[0]) && v[0].k != JK_NONE) OSP_TRY(attr_get(st, it, v[0], jv_make(JK_ABSENT), &it));
        OSP_TRY(jv_binop(st, JO_ADD, acc, it, &acc));
    }
    *out = acc;
    return OSP_OK;
}

static osp_status f_batch(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"linecount", "fill_with"};
    jv v[2];
    BIND("batch", names, 1, v);
    if (v[0].k != JK_INT) return jerr(st, OSP_ERR_INVALID, "TypeError: batch linecount must be an integer");
    int64_t lc = v[0].u.i;
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    jlist *res, *tmp;
    OSP_TRY(jlist_new(st, 0, &res));
    OSP_TRY(jlist_new(st, 0, &tmp));
    for (uint32_t i = 0; i < n; i++) {
        if ((int64_t)tmp->n == lc) {
            OSP_TRY(jlist_push(st, res, jv_list(tmp, 0)));
            OSP_TRY(jlist_new(st, 0, &tmp));
        }
        OSP_TRY(jlist_push(st, tmp, items[i]));
    }
    if (tmp->n) {
        if (given(v[1]) && v[1].k != JK_NONE)
            while ((int64_t)tmp->n < lc) OSP_TRY(jlist_push(st, tmp, v[1]));
        OSP_TRY(jlist_push(st, res, jv_list(tmp, 0)));
    }
    *out = jv_list(res, 0);
    return OSP_OK;
}

static osp_status f_attr(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"name"};
    jv v[1];
    BIND("attr", names, 1, v);
    OSP_TRY(jv_to_str(st, v[0], &v[0]));
    jstr name = {v[0].u.s, v[0].n};
    if (val.k == JK_DICT) {
        osp_status err = OSP_OK;
        if (jmethod_find(st, val, name, out, &err)) return err;
        return jv_undef_attr(st, val, name, out);
    }
    if (val.k == JK_UNDEF) return jv_undef_attr(st, val, name, out);
    return jv_getattr(st, val, name, out);
}

static osp_status f_pprint(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "pprint", a, NULL, 0, 0, NULL));
    jbuf b = {0};
    osp_status rc = jv_write_repr(st, &b, val);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

/* ------------------------------------------------------------------ numbers */

static osp_status f_abs(jstate *st, jv val, const jargs *a, jv *out) {
    OSP_TRY(jargs_bind(st, "abs", a, NULL, 0, 0, NULL));
    if (val.k == JK_INT || val.k == JK_BOOL) {
        if (val.u.i == INT64_MIN) return jerr(st, OSP_ERR_RANGE, "integer overflow");
        *out = jv_int(val.u.i < 0 ? -val.u.i : val.u.i);
        return OSP_OK;
    }
    if (val.k == JK_FLOAT) { *out = jv_float(fabs(val.u.d)); return OSP_OK; }
    if (val.k == JK_UNDEF) return jundef_fail(st, val);
    return jerr(st, OSP_ERR_INVALID, "TypeError: bad operand type for abs(): '%s'", jv_type_name(val));
}

/* Python float(str): whitespace around, underscores between digits, inf/nan. */
static int parse_float(jv s, double *out) {
    jv t = ju_strip(s, NULL, 3);
    if (!t.n || t.n > 400) return 0;
    char buf[512];
    size_t k = 0;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.u.s[i];
        if (c == '_') {
            int ok = i > 0 && i + 1 < t.n && t.u.s[i - 1] >= '0' && t.u.s[i - 1] <= '9' && t.u.s[i + 1] >= '0' &&
                     t.u.s[i + 1] <= '9';
            if (!ok) return 0;
            continue;
        }
        if (c == 'x' || c == 'X' || c == '(' || (unsigned char)c >= 0x80) return 0;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end || end == buf) return 0;
    *out = d;
    return 1;
}

/* Python int(str, base). */
static int parse_int(jv s, int64_t base, int64_t *out) {
    jv t = ju_strip(s, NULL, 3);
    const char *p = t.u.s, *e = t.u.s + t.n;
    int neg = 0;
    if (p < e && (*p == '+' || *p == '-')) neg = *p++ == '-';
    if (p + 1 < e && p[0] == '0') {
        char c = (char)(p[1] | 0x20);
        int pb = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) { base = pb; p += 2; if (p < e && *p == '_') p++; }
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || p >= e) return 0;
    uint64_t v = 0;
    int prev_digit = 0;
    for (; p < e; p++) {
        if (*p == '_') {
            if (!prev_digit || p + 1 >= e) return 0;
            prev_digit = 0;
            continue;
        }
        int d = *p >= '0' && *p <= '9' ? *p - '0' : (*p | 0x20) >= 'a' && (*p | 0x20) <= 'z' ? (*p | 0x20) - 'a' + 10 : 99;
        if (d >= base) return 0;
        if (v > ((uint64_t)INT64_MAX + 1) / (uint64_t)base) return 0;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_digit = 1;
    }
    if (v > (uint64_t)INT64_MAX + (uint64_t)neg) return 0;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

static osp_status float_to_int(jstate *st, double d, jv *out) {
    if (isinf(d)) return jerr(st, OSP_ERR_INVALID, "OverflowError: cannot convert float infinity to integer");
    if (fabs(d) >= 9.2e18) return jerr(st, OSP_ERR_RANGE, "integer overflow");
    *out = jv_int((int64_t)d);
    return OSP_OK;
}

static osp_status f_int(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"default", "base"};
    jv v[2];
    BIND("int", names, 0, v);
    jv dflt = given(v[0]) ? v[0] : jv_int(0);
    int64_t base = 10;
    if (given(v[1])) {
        if (v[1].k != JK_INT) return jerr(st, OSP_ERR_INVALID, "TypeError: int() base must be an integer");
        base = v[1].u.i;
    }
    switch (val.k) {
    case JK_INT: case JK_BOOL: *out = jv_int(val.u.i); return OSP_OK;
    case JK_FLOAT:
        if (isnan(val.u.d)) { *out = dflt; return OSP_OK; }
        return float_to_int(st, val.u.d, out);
    case JK_STR: {
        int64_t i;
        double d;
        if (parse_int(val, base, &i)) { *out = jv_int(i); return OSP_OK; }
        if (parse_float(val, &d) && !isnan(d)) return float_to_int(st, d, out);
        *out = dflt;
        return OSP_OK;
    }
    default:
        *out = dflt;
        return OSP_OK;
    }
}

static osp_status f_float(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"default"};
    jv v[1];
    BIND("float", names, 0, v);
    jv dflt = given(v[0]) ? v[0] : jv_float(0.0);
    double d;
    switch (val.k) {
    case JK_INT: case JK_BOOL: *out = jv_float((double)val.u.i); return OSP_OK;
    case JK_FLOAT: *out = val; return OSP_OK;
    case JK_STR: *out = parse_float(val, &d) ? jv_float(d) : dflt; return OSP_OK;
    default: *out = dflt; return OSP_OK;
    }
}

static osp_status f_round(jstate *st, jv val, const jargs *a, jv *out) {
    static const char *const names[] = {"precision", "method"};
    jv v[2];
    BIND("round", names, 0, v);
    int64_t prec = 0;
    if (given(v[0])) {
        if (v[0].k != JK_INT && v[0].k != JK_BOOL)
            return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object cannot be interpreted as an integer", jv_type_name(v[0]));
        prec = v[0].u.i;
    }
    int method = 0;
    if (given(v[1])) {
        if (jv_is_str(v[1], "ceil")) method = 1;
        else if (jv_is_str(v[1], "floor")) method = 2;
        else if (!jv_is_str(v[1], "common"))
            return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: method must be common, ceil or floor");
    }
    if (val.k == JK_UNDEF) return jundef_fail(st, val);
    if (!jv_is_num(val))
        return jerr(st, OSP_ERR_INVALID, "TypeError: type %s doesn't define __round__ method", jv_type_name(val));
    if (prec > 300 || prec < -300) return jerr(st, OSP_ERR_RANGE, "round precision out of range");
    double x = val.k == JK_FLOAT ? val.u.d : (double)val.u.i, scale = pow(10.0, (double)prec);
    if (method) { *out = jv_float((method == 1 ? ceil(x * scale) : floor(x * scale)) / scale); return OSP_OK; }
    if (val.k != JK_FLOAT) {
        if (prec >= 0) { *out = jv_int(val.u.i); return OSP_OK; }
        double r = nearbyint(x / pow(10.0, (double)-prec)) * pow(10.0, (double)-prec);
        *out = jv_int((int64_t)r);
        return OSP_OK;
    }
    if (!isfinite(x)) { *out = val; return OSP_OK; }
    if (prec >= 0) {
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)(prec > 340 ? 340 : prec), x);
        *out = jv_float(strtod(buf, NULL));
    } else {
        double p = pow(10.0, (double)-prec);
        *out = jv_float(nearbyint(x / p) * p);
    }
    return OSP_OK;
}

/* ------------------------------------------------------------------ map / select */

static osp_status f_map(jstate *st, jv val, const jargs *a, jv *out) {
    jlist *l;
    OSP_TRY(jlist_new(st, 0, &l));
    *out = jv_list(l, 0);
    if (!jv_truthy(val)) return OSP_OK;
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    int by_attr = 0;
    jv attr = jv_make(JK_ABSENT), dflt = jv_make(JK_ABSENT);
    if (!a->n) {
        for (uint32_t k = 0; k < a->nkw; k++) {
            if (a->kwn[k].n == 9 && !memcmp(a->kwn[k].s, "attribute", 9)) { attr = a->kwv[k]; by_attr = 1; }
            else if (a->kwn[k].n == 7 && !memcmp(a->kwn[k].s, "default", 7)) dflt = a->kwv[k];
            else return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: Unexpected keyword argument '%.*s'",
                             (int)a->kwn[k].n, a->kwn[k].s);
        }
        if (!by_attr) return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: map requires a filter argument");
    }
    const jfilter_def *f = NULL;
    jargs rest = {0};
    if (!by_attr) {
        if (a->v[0].k != JK_STR) return jerr(st, OSP_ERR_INVALID, "map: filter name must be a string");
        f = jfilter_find(a->v[0].u.s, a->v[0].n);
        if (!f) return jerr(st, OSP_ERR_INVALID, "No filter named '%.*s'.", (int)a->v[0].n, a->v[0].u.s);
        rest = *a;
        rest.n--;
        rest.v++;
    }
    for (uint32_t i = 0; i < n; i++) {
        jv r;
        OSP_TRY(jstep(st));
        if (by_attr) OSP_TRY(attr_get(st, items[i], attr, dflt, &r));
        else OSP_TRY(f->fn(st, items[i], &rest, &r));
        OSP_TRY(jlist_push(st, l, r));
    }
    return OSP_OK;
}

static osp_status select_common(jstate *st, jv val, const jargs *a, jv *out, int reject, int by_attr) {
    jlist *l;
    OSP_TRY(jlist_new(st, 0, &l));
    *out = jv_list(l, 0);
    if (!jv_truthy(val)) return OSP_OK;
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, val, &items, &n));
    uint32_t off = 0;
    jv attr = jv_none();
    if (by_attr) {
        if (!a->n) return jerr(st, OSP_ERR_INVALID, "FilterArgumentError: Missing parameter for attribute name");
        attr = a->v[0];
        off = 1;
    }
    int have_test = a->n > off;
    jargs rest = *a;
    if (have_test) {
        rest.n = a->n - off - 1;
        rest.v = a->v + off + 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        jv x = items[i];
        int r;
        OSP_TRY(jstep(st));
        if (by_attr) OSP_TRY(attr_get(st, x, attr, jv_make(JK_ABSENT), &x));
        if (have_test) OSP_TRY(call_test_by_name(st, a->v[off], x, &rest, &r));
        else r = jv_truthy(x);
        if (r != reject) OSP_TRY(jlist_push(st, l, items[i]));
    }
    return OSP_OK;
}
static osp_status f_select(jstate *st, jv val, const jargs *a, jv *out) { return select_common(st, val, a, out, 0, 0); }
static osp_status f_reject(jstate *st, jv val, const jargs *a, jv *out) { return select_common(st, val, a, out, 1, 0); }
static osp_status f_selectattr(jstate *st, jv val, const jargs *a, jv *out) { return select_common(st, val, a, out, 0, 1); }
static osp_status f_rejectattr(jstate *st, jv val, const jargs *a, jv *out) { return select_common(st, val, a, out, 1, 1); }

static const jfilter_def FILTERS[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
    {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"pprint", f_pprint}, {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum},
    {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
};

const jfilter_def *jfilter_find(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
        if (strlen(FILTERS[i].name) == n && !memcmp(FILTERS[i].name, name, n)) return &FILTERS[i];
    return NULL;
}

/* ------------------------------------------------------------------ tests */

#define TEST0(fn, expr)                                                       \
    static osp_status fn(jstate *st, jv val, const jargs *a, int *res) {     \
        OSP_TRY(jargs_bind(st, &(#fn)[2], a, NULL, 0, 0, NULL));             \
        *res = (expr);                                                        \
        return OSP_OK;                                                        \
    }

TEST0(t_defined, val.k != JK_UNDEF)
TEST0(t_undefined, val.k == JK_UNDEF)
TEST0(t_none, val.k == JK_NONE)
TEST0(t_boolean, val.k == JK_BOOL)
TEST0(t_true, val.k == JK_BOOL && val.u.i)
TEST0(t_false, val.k == JK_BOOL && !val.u.i)
TEST0(t_integer, val.k == JK_INT)
TEST0(t_float, val.k == JK_FLOAT)
TEST0(t_number, jv_is_num(val))
TEST0(t_string, val.k == JK_STR)
TEST0(t_mapping, val.k == JK_DICT)
TEST0(t_sequence, val.k == JK_STR || val.k == JK_LIST || val.k == JK_TUPLE || val.k == JK_DICT || val.k == JK_UNDEF)
TEST0(t_iterable, val.k == JK_STR || val.k == JK_LIST || val.k == JK_TUPLE || val.k == JK_DICT || val.k == JK_UNDEF ||
                      val.k == JK_LOOP)
TEST0(t_callable, val.k == JK_MACRO || val.k == JK_FUNC || val.k == JK_METHOD || val.k == JK_UNDEF ||
                      val.k == JK_LOOP)
TEST0(t_escaped, val.k == JK_STR && val.safe)

static osp_status mod_test(jstate *st, jv val, jv d, int want_zero, int *res) {
    jv r;
    OSP_TRY(jv_binop(st, JO_MOD, val, d, &r));
    int zero = jv_eq(r, jv_int(0));
    *res = want_zero ? zero : jv_eq(r, jv_int(1));
    return OSP_OK;
}

static osp_status t_odd(jstate *st, jv val, const jargs *a, int *res) {
    OSP_TRY(jargs_bind(st, "odd", a, NULL, 0, 0, NULL));
    return mod_test(st, val, jv_int(2), 0, res);
}
static osp_status t_even(jstate *st, jv val, const jargs *a, int *res) {
    OSP_TRY(jargs_bind(st, "even", a, NULL, 0, 0, NULL));
    return mod_test(st, val, jv_int(2), 1, res);
}
static osp_status t_divisibleby(jstate *st, jv val, const jargs *a, int *res) {
    static const char *const names[] = {"num"};
    jv v[1];
    BIND("divisibleby", names, 1, v);
    return mod_test(st, val, v[0], 1, res);
}

static osp_status t_case(jstate *st, jv val, const jargs *a, int *res, int upper) {
    OSP_TRY(jargs_bind(st, upper ? "upper" : "lower", a, NULL, 0, 0, NULL));
    OSP_TRY(jv_to_str(st, val, &val));
    int cased = 0, bad = 0;
    for (size_t i = 0; i < val.n;) {
        int32_t c = ju_next(val.u.s, val.n, &i);
        if (upper ? ju_is_lower(c) : ju_is_upper(c)) bad = 1;
        if (upper ? ju_is_upper(c) : ju_is_lower(c)) cased = 1;
    }
    *res = cased && !bad;
    return OSP_OK;
}
static osp_status t_lower(jstate *st, jv val, const jargs *a, int *res) { return t_case(st, val, a, res, 0); }
static osp_status t_upper(jstate *st, jv val, const jargs *a, int *res) { return t_case(st, val, a, res, 1); }

static osp_status cmp_test(jstate *st, jv val, const jargs *a, int *res, int op, const char *name) {
    static const char *const names[] = {"other"};
    jv v[1];
    BIND(name, names, 1, v);
    if (op == JO_EQ) { *res = jv_eq(val, v[0]); return OSP_OK; }
    if (op == JO_NE) { *res = !jv_eq(val, v[0]); return OSP_OK; }
    int c;
    static const char *opn[] = {[JO_LT] = "<", [JO_LE] = "<=", [JO_GT] = ">", [JO_GE] = ">="};
    OSP_TRY(jv_cmp(st, val, v[0], opn[op], &c));
    *res = op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
    return OSP_OK;
}
static osp_status t_eq(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_EQ, "eq"); }
static osp_status t_ne(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_NE, "ne"); }
static osp_status t_lt(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_LT, "lt"); }
static osp_status t_le(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_LE, "le"); }
static osp_status t_gt(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_GT, "gt"); }
static osp_status t_ge(jstate *st, jv val, const jargs *a, int *res) { return cmp_test(st, val, a, res, JO_GE, "ge"); }

static osp_status t_in(jstate *st, jv val, const jargs *a, int *res) {
    static const char *const names[] = {"seq"};
    jv v[1];
    BIND("in", names, 1, v);
    return jv_contains(st, v[0], val, res);
}

static osp_status t_sameas(jstate *st, jv val, const jargs *a, int *res) {
    static const char *const names[] = {"other"};
    jv v[1];
    BIND("sameas", names, 1, v);
    jv o = v[0];
    if (val.k != o.k) { *res = 0; return OSP_OK; }
    switch (val.k) {
    case JK_NONE: case JK_UNDEF: *res = val.k == JK_NONE; break;
    case JK_BOOL: *res = val.u.i == o.u.i; break;
    case JK_INT: *res = val.u.i == o.u.i && val.u.i >= -5 && val.u.i <= 256; break; /* CPython's small ints */
    case JK_STR: *res = val.u.s == o.u.s && val.n == o.n; break;
    default: *res = jv_eq(val, o) && memcmp(&val.u, &o.u, sizeof val.u) == 0; break;
    }
    return OSP_OK;
}

static osp_status t_filter(jstate *st, jv val, const jargs *a, int *res) {
    OSP_TRY(jargs_bind(st, "filter", a, NULL, 0, 0, NULL));
    *res = val.k == JK_STR && jfilter_find(val.u.s, val.n) != NULL;
    return OSP_OK;
}
static osp_status t_test(jstate *st, jv val, const jargs *a, int *res) {
    OSP_TRY(jargs_bind(st, "test", a, NULL, 0, 0, NULL));
    *res = val.k == JK_STR && jtest_find(val.u.s, val.n) != NULL;
    return OSP_OK;
}

static const jtest_def TESTS[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
    {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float},
    {"number", t_number}, {"string", t_string}, {"mapping", t_mapping}, {"sequence", t_sequence},
    {"iterable", t_iterable}, {"callable", t_callable}, {"escaped", t_escaped}, {"odd", t_odd},
    {"even", t_even}, {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper},
    {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt},
    {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt},
    {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas}, {"filter", t_filter},
    {"test", t_test},
};

const jtest_def *jtest_find(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
        if (strlen(TESTS[i].name) == n && !memcmp(TESTS[i].name, name, n)) return &TESTS[i];
    return NULL;
}
