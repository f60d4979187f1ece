/* text/jinja builtins: argument binding, the globals (range, dict,
 * namespace, raise_exception, strftime_now), the Python methods of str,
 * dict, list and tuple that templates call, the loop object, and printf
 * style "%" formatting.
 *
 * Sandbox: the methods that mutate a dict or list (append, update, pop...)
 * resolve to an undefined that raises "access to attribute ... is unsafe"
 * when called, as ImmutableSandboxedEnvironment does. Names starting with
 * "_" are never attributes.
 */
#include <math.h>
#include <stdlib.h>
#include "text/jinja_internal.h"

/* ------------------------------------------------------------------ binding */

static int name_eq(jstr a, const char *b) { return a.n == strlen(b) && !memcmp(a.s, b, a.n); }

osp_status jargs_bind(jstate *st, const char *fname, const jargs *a, const char *const *names, int nnames,
                      int nreq, jv *out) {
    for (int i = 0; i < nnames; i++) out[i] = jv_make(JK_ABSENT);
    if (a->n > (uint32_t)nnames)
        return jerr(st, OSP_ERR_INVALID, "TypeError: %s() takes at most %d argument%s (%u given)", fname, nnames,
                    nnames == 1 ? "" : "s", a->n);
    for (uint32_t i = 0; i < a->n; i++) out[i] = a->v[i];
    for (uint32_t k = 0; k < a->nkw; k++) {
        int i;
        for (i = 0; i < nnames; i++)
            if (name_eq(a->kwn[k], names[i])) break;
        if (i == nnames)
            return jerr(st, OSP_ERR_INVALID, "TypeError: %s() got an unexpected keyword argument '%.*s'", fname,
                        (int)a->kwn[k].n, a->kwn[k].s);
        if (out[i].k != JK_ABSENT)
            return jerr(st, OSP_ERR_INVALID, "TypeError: %s() got multiple values for argument '%s'", fname, names[i]);
        out[i] = a->kwv[k];
    }
    for (int i = 0; i < nreq; i++)
        if (out[i].k == JK_ABSENT)
            return jerr(st, OSP_ERR_INVALID, "TypeError: %s() missing required argument '%s'", fname, names[i]);
    return OSP_OK;
}

static osp_status no_args(jstate *st, const char *fname, const jargs *a) {
    if (a->n || a->nkw)
        return jerr(st, OSP_ERR_INVALID, "TypeError: %s() takes no arguments (%u given)", fname, a->n + a->nkw);
    return OSP_OK;
}

static osp_status want_str(jstate *st, const char *what, jv v) {
    if (v.k == JK_UNDEF) return jundef_fail(st, v);
    if (v.k != JK_STR)
        return jerr(st, OSP_ERR_INVALID, "TypeError: %s must be str, not %s", what, jv_type_name(v));
    return OSP_OK;
}

static osp_status want_int(jstate *st, const char *what, jv v, int64_t *out) {
    if (v.k == JK_UNDEF) return jundef_fail(st, v);
    if (v.k != JK_INT && v.k != JK_BOOL)
        return jerr(st, OSP_ERR_INVALID, "TypeError: '%s' object cannot be interpreted as an integer (%s)",
                    jv_type_name(v), what);
    *out = v.u.i;
    return OSP_OK;
}

/* ------------------------------------------------------------------ globals */

static osp_status g_range(jstate *st, const jv *self, const jargs *a, jv *out) {
    (void)self;
    if (a->nkw) return jerr(st, OSP_ERR_INVALID, "TypeError: range() takes no keyword arguments");
    if (a->n < 1 || a->n > 3)
        return jerr(st, OSP_ERR_INVALID, "TypeError: range expected 1 to 3 arguments, got %u", a->n);
    int64_t v[3];
    for (uint32_t i = 0; i < a->n; i++) OSP_TRY(want_int(st, "range", a->v[i], &v[i]));
    int64_t start = a->n == 1 ? 0 : v[0], stop = a->n == 1 ? v[0] : v[1], step = a->n == 3 ? v[2] : 1;
    if (step == 0) return jerr(st, OSP_ERR_INVALID, "ValueError: range() arg 3 must not be zero");
    int64_t len = 0;
    if (step > 0 && start < stop) len = (int64_t)(((__int128)stop - start - 1) / step + 1);
    else if (step < 0 && start > stop) len = (int64_t)(((__int128)start - stop - 1) / (-(__int128)step) + 1);
    if (len > 100000)
        return jerr(st, OSP_ERR_RANGE,
                    "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    jlist *l;
    OSP_TRY(jlist_new(st, (uint32_t)len, &l));
    for (int64_t i = 0; i < len; i++) l->v[l->n++] = jv_int(start + i * step);
    *out = jv_list(l, 0);
    return OSP_OK;
}

/* dict(...) and namespace(...): an optional mapping or pairs, then keywords. */
static osp_status make_dict(jstate *st, const char *fname, const jargs *a, jdict **out) {
    if (a->n > 1) return jerr(st, OSP_ERR_INVALID, "TypeError: %s expected at most 1 argument, got %u", fname, a->n);
    jdict *d;
    OSP_TRY(jdict_new(st, a->nkw, &d));
    if (a->n) {
        jv src = a->v[0];
        if (src.k == JK_UNDEF) return jundef_fail(st, src); /* dict() asks it for .keys */
        if (src.k == JK_DICT || src.k == JK_NS) {
            for (uint32_t i = 0; i < src.u.m->n; i++) OSP_TRY(jdict_set(st, d, src.u.m->k[i], src.u.m->v[i]));
        } else {
            const jv *items;
            uint32_t n;
            OSP_TRY(jv_iter(st, src, &items, &n));
            for (uint32_t i = 0; i < n; i++) {
                const jv *kv;
                uint32_t m;
                if (items[i].k != JK_LIST && items[i].k != JK_TUPLE && items[i].k != JK_STR)
                    return jerr(st, OSP_ERR_INVALID,
                                "TypeError: cannot convert %s sequence element #%u to a sequence", fname, i);
                OSP_TRY(jv_iter(st, items[i], &kv, &m));
                if (m != 2)
                    return jerr(st, OSP_ERR_INVALID,
                                "ValueError: %s sequence element #%u has length %u; 2 is required", fname, i, m);
                OSP_TRY(jdict_set(st, d, kv[0], kv[1]));
            }
        }
    }
    for (uint32_t k = 0; k < a->nkw; k++) OSP_TRY(jdict_set(st, d, jv_strn(a->kwn[k].s, a->kwn[k].n), a->kwv[k]));
    *out = d;
    return OSP_OK;
}

static osp_status g_dict(jstate *st, const jv *self, const jargs *a, jv *out) {
    (void)self;
    jdict *d;
    OSP_TRY(make_dict(st, "dict", a, &d));
    *out = jv_dict(d);
    return OSP_OK;
}

static osp_status g_namespace(jstate *st, const jv *self, const jargs *a, jv *out) {
    (void)self;
    jdict *d;
    OSP_TRY(make_dict(st, "namespace", a, &d));
    *out = jv_make(JK_NS);
    out->u.m = d;
    return OSP_OK;
}

static osp_status g_raise_exception(jstate *st, const jv *self, const jargs *a, jv *out) {
    (void)self;
    (void)out;
    static const char *const names[] = {"message"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "raise_exception", a, names, 1, 1, v));
    jv s;
    OSP_TRY(jv_to_str(st, v[0], &s));
    return osp_err(OSP_ERR_INVALID, "%.*s", (int)s.n, s.u.s);
}

static osp_status g_strftime_now(jstate *st, const jv *self, const jargs *a, jv *out) {
    (void)self;
    static const char *const names[] = {"format"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "strftime_now", a, names, 1, 1, v));
    OSP_TRY(want_str(st, "strftime_now() format", v[0]));
    if (memchr(v[0].u.s, 0, v[0].n)) return jerr(st, OSP_ERR_INVALID, "ValueError: embedded null character");
    char *fmt;
    JALLOC(st, fmt, v[0].n + 2);
    memcpy(fmt, v[0].u.s, v[0].n);
    fmt[v[0].n] = '\x01'; /* tell an empty result from an overflow */
    for (size_t cap = 256; cap <= ((size_t)1 << 20); cap *= 4) {
        char *buf;
        JALLOC(st, buf, cap);
        size_t k = strftime(buf, cap, fmt, &st->now);
        if (k > 0) {
            *out = jv_strn(buf, k - 1);
            return OSP_OK;
        }
    }
    return jerr(st, OSP_ERR_RANGE, "strftime_now() result too long");
}

static const jfunc GLOBALS[] = {
    {"range", g_range},
    {"dict", g_dict},
    {"namespace", g_namespace},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
};

const jfunc *jglobal_find(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof *GLOBALS; i++)
        if (strlen(GLOBALS[i].name) == n && !memcmp(GLOBALS[i].name, name, n)) return &GLOBALS[i];
    return NULL;
}

/* ------------------------------------------------------------------ str methods */

static osp_status m_case(jstate *st, const jv *self, const jargs *a, jv *out, const char *name, ju_case mode) {
    OSP_TRY(no_args(st, name, a));
    return ju_case_map(st, *self, mode, out);
}
static osp_status m_upper(jstate *st, const jv *self, const jargs *a, jv *out) { return m_case(st, self, a, out, "upper", JU_UPPER); }
static osp_status m_lower(jstate *st, const jv *self, const jargs *a, jv *out) { return m_case(st, self, a, out, "lower", JU_LOWER); }
static osp_status m_title(jstate *st, const jv *self, const jargs *a, jv *out) { return m_case(st, self, a, out, "title", JU_TITLE); }
static osp_status m_capitalize(jstate *st, const jv *self, const jargs *a, jv *out) { return m_case(st, self, a, out, "capitalize", JU_CAPITALIZE); }
static osp_status m_swapcase(jstate *st, const jv *self, const jargs *a, jv *out) { return m_case(st, self, a, out, "swapcase", JU_SWAPCASE); }

static osp_status m_strip_common(jstate *st, const jv *self, const jargs *a, jv *out, const char *name, int which) {
    static const char *const names[] = {"chars"};
    jv v[1];
    OSP_TRY(jargs_bind(st, name, a, names, 1, 0, v));
    if (v[0].k == JK_ABSENT || v[0].k == JK_NONE) { *out = ju_strip(*self, NULL, which); return OSP_OK; }
    if (v[0].k != JK_STR) return jerr(st, OSP_ERR_INVALID, "TypeError: %s arg must be None or str", name);
    *out = ju_strip(*self, &v[0], which);
    return OSP_OK;
}
static osp_status m_strip(jstate *st, const jv *self, const jargs *a, jv *out) { return m_strip_common(st, self, a, out, "strip", 3); }
static osp_status m_lstrip(jstate *st, const jv *self, const jargs *a, jv *out) { return m_strip_common(st, self, a, out, "lstrip", 1); }
static osp_status m_rstrip(jstate *st, const jv *self, const jargs *a, jv *out) { return m_strip_common(st, self, a, out, "rstrip", 2); }

static osp_status m_split_common(jstate *st, const jv *self, const jargs *a, jv *out, int right) {
    static const char *const names[] = {"sep", "maxsplit"};
    jv v[2];
    const char *fname = right ? "rsplit" : "split";
    OSP_TRY(jargs_bind(st, fname, a, names, 2, 0, v));
    int64_t maxsplit = -1;
    if (v[1].k != JK_ABSENT) OSP_TRY(want_int(st, "maxsplit", v[1], &maxsplit));
    if (v[0].k == JK_ABSENT || v[0].k == JK_NONE) return ju_split(st, *self, NULL, maxsplit, right, out);
    if (v[0].k != JK_STR)
        return jerr(st, OSP_ERR_INVALID, "TypeError: must be str or None, not %s", jv_type_name(v[0]));
    return ju_split(st, *self, &v[0], maxsplit, right, out);
}
static osp_status m_split(jstate *st, const jv *self, const jargs *a, jv *out) { return m_split_common(st, self, a, out, 0); }
static osp_status m_rsplit(jstate *st, const jv *self, const jargs *a, jv *out) { return m_split_common(st, self, a, out, 1); }

/* s[start:end] for the optional start/end arguments of find, count, startswith... */
static osp_status sub_range(jstate *st, jv s, jv start, jv end, jv *out, int64_t *offset) {
    *offset = 0;
    if ((start.k == JK_ABSENT || start.k == JK_NONE) && (end.k == JK_ABSENT || end.k == JK_NONE)) {
        *out = s;
        return OSP_OK;
    }
    OSP_TRY(jv_slice(st, s, start, end, jv_make(JK_ABSENT), out));
    if (start.k == JK_INT || start.k == JK_BOOL) {
        int64_t len = (int64_t)ju_count(s.u.s, s.n), b = start.u.i;
        if (b < 0) b += len;
        if (b < 0) b = 0;
        if (b > len) b = len;
        *offset = b;
    }
    return OSP_OK;
}

static osp_status m_affix(jstate *st, const jv *self, const jargs *a, jv *out, int end) {
    static const char *const names[] = {"prefix", "start", "end"};
    const char *fname = end ? "endswith" : "startswith";
    jv v[3];
    OSP_TRY(jargs_bind(st, fname, a, names, 3, 1, v));
    jv s;
    int64_t off;
    OSP_TRY(sub_range(st, *self, v[1], v[2], &s, &off));
    const jv *cands = &v[0];
    uint32_t nc = 1;
    if (v[0].k == JK_TUPLE) {
        cands = v[0].u.l->v;
        nc = v[0].u.l->n;
    } else if (v[0].k != JK_STR) {
        return jerr(st, OSP_ERR_INVALID, "TypeError: %s first arg must be str or a tuple of str, not %s", fname,
                    jv_type_name(v[0]));
    }
    for (uint32_t i = 0; i < nc; i++) {
        jv p = cands[i];
        if (p.k != JK_STR)
            return jerr(st, OSP_ERR_INVALID, "TypeError: tuple for %s must only contain str, not %s", fname,
                        jv_type_name(p));
        if (p.n <= s.n && !memcmp(end ? s.u.s + s.n - p.n : s.u.s, p.u.s, p.n)) {
            *out = jv_bool(1);
            return OSP_OK;
        }
    }
    *out = jv_bool(0);
    return OSP_OK;
}
static osp_status m_startswith(jstate *st, const jv *self, const jargs *a, jv *out) { return m_affix(st, self, a, out, 0); }
static osp_status m_endswith(jstate *st, const jv *self, const jargs *a, jv *out) { return m_affix(st, self, a, out, 1); }

static osp_status m_replace(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"old", "new", "count"};
    jv v[3];
    OSP_TRY(jargs_bind(st, "replace", a, names, 3, 2, v));
    OSP_TRY(want_str(st, "replace() argument 1", v[0]));
    OSP_TRY(want_str(st, "replace() argument 2", v[1]));
    int64_t count = -1;
    if (v[2].k != JK_ABSENT) OSP_TRY(want_int(st, "count", v[2], &count));
    return ju_replace(st, *self, v[0], v[1], count, out);
}

static osp_status m_find_common(jstate *st, const jv *self, const jargs *a, jv *out, const char *fname, int reverse,
                                int raise) {
    static const char *const names[] = {"sub", "start", "end"};
    jv v[3];
    OSP_TRY(jargs_bind(st, fname, a, names, 3, 1, v));
    OSP_TRY(want_str(st, "substring", v[0]));
    jv s;
    int64_t off;
    OSP_TRY(sub_range(st, *self, v[1], v[2], &s, &off));
    int64_t r = ju_find(s, v[0], reverse);
    if (r < 0 && raise) return jerr(st, OSP_ERR_INVALID, "ValueError: substring not found");
    *out = jv_int(r < 0 ? -1 : r + off);
    return OSP_OK;
}
static osp_status m_find(jstate *st, const jv *self, const jargs *a, jv *out) { return m_find_common(st, self, a, out, "find", 0, 0); }
static osp_status m_rfind(jstate *st, const jv *self, const jargs *a, jv *out) { return m_find_common(st, self, a, out, "rfind", 1, 0); }
static osp_status m_index(jstate *st, const jv *self, const jargs *a, jv *out) { return m_find_common(st, self, a, out, "index", 0, 1); }
static osp_status m_rindex(jstate *st, const jv *self, const jargs *a, jv *out) { return m_find_common(st, self, a, out, "rindex", 1, 1); }

static osp_status m_count(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"sub", "start", "end"};
    jv v[3];
    OSP_TRY(jargs_bind(st, "count", a, names, 3, 1, v));
    OSP_TRY(want_str(st, "substring", v[0]));
    jv s;
    int64_t off;
    OSP_TRY(sub_range(st, *self, v[1], v[2], &s, &off));
    *out = jv_int(ju_count_sub(s, v[0]));
    return OSP_OK;
}

static osp_status m_join(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"iterable"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "join", a, names, 1, 1, v));
    const jv *items;
    uint32_t n;
    OSP_TRY(jv_iter(st, v[0], &items, &n));
    jbuf b = {0};
    osp_status rc = OSP_OK;
    for (uint32_t i = 0; i < n && rc == OSP_OK; i++) {
        if (items[i].k != JK_STR) {
            rc = jerr(st, OSP_ERR_INVALID, "TypeError: sequence item %u: expected str instance, %s found", i,
                      jv_type_name(items[i]));
            break;
        }
        if (i) rc = jbuf_put(st, &b, self->u.s, self->n);
        if (rc == OSP_OK) rc = jbuf_put(st, &b, items[i].u.s, items[i].n);
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status m_splitlines(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"keepends"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "splitlines", a, names, 1, 0, v));
    jlist *l;
    OSP_TRY(ju_splitlines(st, self->u.s, self->n, v[0].k != JK_ABSENT && jv_truthy(v[0]), &l));
    *out = jv_list(l, 0);
    return OSP_OK;
}

typedef int (*cp_pred)(int32_t);
static osp_status m_is(jstate *st, const jv *self, const jargs *a, jv *out, const char *name, cp_pred p) {
    OSP_TRY(no_args(st, name, a));
    int ok = self->n > 0;
    for (size_t i = 0; i < self->n && ok;) ok = p(ju_next(self->u.s, self->n, &i));
    *out = jv_bool(ok);
    return OSP_OK;
}
static osp_status m_isspace(jstate *st, const jv *self, const jargs *a, jv *out) { return m_is(st, self, a, out, "isspace", ju_isspace); }
static osp_status m_isalnum(jstate *st, const jv *self, const jargs *a, jv *out) { return m_is(st, self, a, out, "isalnum", ju_is_alnum); }
static osp_status m_isalpha(jstate *st, const jv *self, const jargs *a, jv *out) { return m_is(st, self, a, out, "isalpha", ju_is_alpha); }
static osp_status m_isdigit(jstate *st, const jv *self, const jargs *a, jv *out) { return m_is(st, self, a, out, "isdigit", ju_is_digit); }

static osp_status m_iscase(jstate *st, const jv *self, const jargs *a, jv *out, int upper) {
    OSP_TRY(no_args(st, upper ? "isupper" : "islower", a));
    int cased = 0, bad = 0;
    for (size_t i = 0; i < self->n;) {
        int32_t c = ju_next(self->u.s, self->n, &i);
        if (upper ? ju_is_lower(c) : ju_is_upper(c)) bad = 1;
        if (upper ? ju_is_upper(c) : ju_is_lower(c)) cased = 1;
    }
    *out = jv_bool(cased && !bad);
    return OSP_OK;
}
static osp_status m_isupper(jstate *st, const jv *self, const jargs *a, jv *out) { return m_iscase(st, self, a, out, 1); }
static osp_status m_islower(jstate *st, const jv *self, const jargs *a, jv *out) { return m_iscase(st, self, a, out, 0); }

static osp_status m_affix_remove(jstate *st, const jv *self, const jargs *a, jv *out, int suffix) {
    static const char *const names[] = {"affix"};
    jv v[1];
    OSP_TRY(jargs_bind(st, suffix ? "removesuffix" : "removeprefix", a, names, 1, 1, v));
    OSP_TRY(want_str(st, "argument", v[0]));
    jv s = *self;
    if (v[0].n && v[0].n <= s.n && !memcmp(suffix ? s.u.s + s.n - v[0].n : s.u.s, v[0].u.s, v[0].n)) {
        if (!suffix) s.u.s += v[0].n;
        s.n -= v[0].n;
    }
    s.safe = 0;
    *out = s;
    return OSP_OK;
}
static osp_status m_removeprefix(jstate *st, const jv *self, const jargs *a, jv *out) { return m_affix_remove(st, self, a, out, 0); }
static osp_status m_removesuffix(jstate *st, const jv *self, const jargs *a, jv *out) { return m_affix_remove(st, self, a, out, 1); }

/* center/ljust/rjust: pad to `width` code points. */
static osp_status pad(jstate *st, jv s, int64_t width, jv fill, int mode, jv *out) {
    int64_t len = (int64_t)ju_count(s.u.s, s.n);
    if (width <= len) { *out = s; return OSP_OK; }
    if (width > (int64_t)st->max_output) return jerr(st, OSP_ERR_RANGE, "padding width too large");
    int64_t marg = width - len, left;
    if (mode == 0) left = marg / 2 + (marg & width & 1);
    else left = mode < 0 ? 0 : marg;
    jbuf b = {0};
    osp_status rc = OSP_OK;
    for (int64_t i = 0; i < left && rc == OSP_OK; i++) rc = jbuf_put(st, &b, fill.u.s, fill.n);
    if (rc == OSP_OK) rc = jbuf_put(st, &b, s.u.s, s.n);
    for (int64_t i = 0; i < marg - left && rc == OSP_OK; i++) rc = jbuf_put(st, &b, fill.u.s, fill.n);
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static osp_status m_pad(jstate *st, const jv *self, const jargs *a, jv *out, const char *fname, int mode) {
    static const char *const names[] = {"width", "fillchar"};
    jv v[2];
    OSP_TRY(jargs_bind(st, fname, a, names, 2, 1, v));
    int64_t w;
    OSP_TRY(want_int(st, "width", v[0], &w));
    jv fill = jv_cstr(" ");
    if (v[1].k != JK_ABSENT) {
        if (v[1].k != JK_STR || ju_count(v[1].u.s, v[1].n) != 1)
            return jerr(st, OSP_ERR_INVALID, "TypeError: The fill character must be exactly one character long");
        fill = v[1];
    }
    return pad(st, *self, w, fill, mode, out);
}
static osp_status m_center(jstate *st, const jv *self, const jargs *a, jv *out) { return m_pad(st, self, a, out, "center", 0); }
static osp_status m_ljust(jstate *st, const jv *self, const jargs *a, jv *out) { return m_pad(st, self, a, out, "ljust", -1); }
static osp_status m_rjust(jstate *st, const jv *self, const jargs *a, jv *out) { return m_pad(st, self, a, out, "rjust", 1); }

static osp_status m_zfill(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"width"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "zfill", a, names, 1, 1, v));
    int64_t w;
    OSP_TRY(want_int(st, "width", v[0], &w));
    jv s = *self;
    int64_t len = (int64_t)ju_count(s.u.s, s.n);
    if (w <= len) { *out = s; return OSP_OK; }
    int sign = s.n && (s.u.s[0] == '+' || s.u.s[0] == '-');
    jv rest = jv_strn(s.u.s + sign, s.n - (size_t)sign), padded;
    OSP_TRY(pad(st, rest, w - sign, jv_cstr("0"), 1, &padded));
    if (!sign) { *out = padded; return OSP_OK; }
    return jv_concat2(st, jv_strn(s.u.s, 1), padded, out);
}

/* str.format with {}, {0}, {name}, {name.attr}/{0[key]} and !r/!s; no format specs. */
static osp_status m_format(jstate *st, const jv *self, const jargs *a, jv *out) {
    const char *s = self->u.s;
    size_t n = self->n;
    jbuf b = {0};
    osp_status rc = OSP_OK;
    uint32_t auto_idx = 0;
    for (size_t i = 0; i < n && rc == OSP_OK;) {
        char c = s[i];
        if (c == '}' ) {
            if (i + 1 < n && s[i + 1] == '}') { rc = jbuf_putc(st, &b, '}'); i += 2; continue; }
            rc = jerr(st, OSP_ERR_INVALID, "ValueError: Single '}' encountered in format string");
            break;
        }
        if (c != '{') { rc = jbuf_putc(st, &b, c); i++; continue; }
        if (i + 1 < n && s[i + 1] == '{') { rc = jbuf_putc(st, &b, '{'); i += 2; continue; }
        size_t e = i + 1;
        while (e < n && s[e] != '}') e++;
        if (e >= n) { rc = jerr(st, OSP_ERR_INVALID, "ValueError: expected '}' before end of string"); break; }
        const char *f = s + i + 1;
        size_t fl = e - i - 1;
        char conv = 0;
        const char *bang = memchr(f, '!', fl), *colon = memchr(f, ':', fl);
        if (colon) { rc = jerr(st, OSP_ERR_INVALID, "str.format() format specs are not supported"); break; }
        if (bang) {
            if ((size_t)(bang - f) + 2 != fl) { rc = jerr(st, OSP_ERR_INVALID, "ValueError: invalid conversion"); break; }
            conv = bang[1];
            fl = (size_t)(bang - f);
        }
        size_t k = 0;
        while (k < fl && f[k] != '.' && f[k] != '[') k++;
        jv val;
        if (k == 0) {
            if (auto_idx >= a->n) { rc = jerr(st, OSP_ERR_INVALID, "IndexError: Replacement index %u out of range", auto_idx); break; }
            val = a->v[auto_idx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            uint32_t idx = (uint32_t)strtoul(f, NULL, 10);
            if (idx >= a->n) { rc = jerr(st, OSP_ERR_INVALID, "IndexError: Replacement index %u out of range", idx); break; }
            val = a->v[idx];
        } else {
            uint32_t j;
            for (j = 0; j < a->nkw; j++)
                if (a->kwn[j].n == k && !memcmp(a->kwn[j].s, f, k)) break;
            if (j == a->nkw) { rc = jerr(st, OSP_ERR_INVALID, "KeyError: '%.*s'", (int)k, f); break; }
            val = a->kwv[j];
        }
        while (rc == OSP_OK && k < fl) {
            if (f[k] == '.') {
                size_t q = ++k;
                while (k < fl && f[k] != '.' && f[k] != '[') k++;
                rc = jv_getattr(st, val, (jstr){f + q, (uint32_t)(k - q)}, &val);
            } else {
                size_t q = ++k;
                while (k < fl && f[k] != ']') k++;
                jv key = jv_strn(f + q, k - q);
                int digits = k > q;
                for (size_t t = q; t < k; t++) digits &= f[t] >= '0' && f[t] <= '9';
                if (digits) key = jv_int(strtoll(f + q, NULL, 10));
                rc = jv_getitem(st, val, key, &val);
                k++;
            }
        }
        if (rc == OSP_OK) rc = conv == 'r' || conv == 'a' ? jv_write_repr(st, &b, val) : jv_write_str(st, &b, val);
        i = e + 1;
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

static const jfunc STR_METHODS[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"casefold", m_lower}, {"title", m_title},
    {"capitalize", m_capitalize}, {"swapcase", m_swapcase}, {"strip", m_strip}, {"lstrip", m_lstrip},
    {"rstrip", m_rstrip}, {"split", m_split}, {"rsplit", m_rsplit}, {"startswith", m_startswith},
    {"endswith", m_endswith}, {"replace", m_replace}, {"find", m_find}, {"rfind", m_rfind},
    {"index", m_index}, {"rindex", m_rindex}, {"count", m_count}, {"join", m_join},
    {"splitlines", m_splitlines}, {"isspace", m_isspace}, {"isalnum", m_isalnum}, {"isalpha", m_isalpha},
    {"isdigit", m_isdigit}, {"isdecimal", m_isdigit}, {"isupper", m_isupper}, {"islower", m_islower},
    {"removeprefix", m_removeprefix}, {"removesuffix", m_removesuffix}, {"center", m_center},
    {"ljust", m_ljust}, {"rjust", m_rjust}, {"zfill", m_zfill}, {"format", m_format},
};

/* ------------------------------------------------------------------ dict / list methods */

static osp_status m_get(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"key", "default"};
    jv v[2];
    OSP_TRY(jargs_bind(st, "get", a, names, 2, 1, v));
    if (jdict_get(self->u.m, v[0], out)) return OSP_OK;
    *out = v[1].k == JK_ABSENT ? jv_none() : v[1];
    return OSP_OK;
}

static osp_status dict_view(jstate *st, const jv *self, const jargs *a, jv *out, const char *name, int what) {
    OSP_TRY(no_args(st, name, a));
    const jdict *d = self->u.m;
    jlist *l;
    OSP_TRY(jlist_new(st, d->n, &l));
    for (uint32_t i = 0; i < d->n; i++) {
        if (what == 0) l->v[i] = d->k[i];
        else if (what == 1) l->v[i] = d->v[i];
        else {
            jlist *p;
            OSP_TRY(jlist_new(st, 2, &p));
            p->v[0] = d->k[i];
            p->v[1] = d->v[i];
            p->n = 2;
            l->v[i] = jv_list(p, 1);
        }
        l->n++;
    }
    *out = jv_list(l, 0);
    return OSP_OK;
}
static osp_status m_keys(jstate *st, const jv *self, const jargs *a, jv *out) { return dict_view(st, self, a, out, "keys", 0); }
static osp_status m_values(jstate *st, const jv *self, const jargs *a, jv *out) { return dict_view(st, self, a, out, "values", 1); }
static osp_status m_items(jstate *st, const jv *self, const jargs *a, jv *out) { return dict_view(st, self, a, out, "items", 2); }

static osp_status m_dict_copy(jstate *st, const jv *self, const jargs *a, jv *out) {
    OSP_TRY(no_args(st, "copy", a));
    jdict *d;
    OSP_TRY(jdict_new(st, self->u.m->n, &d));
    for (uint32_t i = 0; i < self->u.m->n; i++) OSP_TRY(jdict_set(st, d, self->u.m->k[i], self->u.m->v[i]));
    *out = jv_dict(d);
    return OSP_OK;
}

static osp_status m_list_count(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"value"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "count", a, names, 1, 1, v));
    int64_t c = 0;
    for (uint32_t i = 0; i < self->u.l->n; i++) c += jv_eq(self->u.l->v[i], v[0]);
    *out = jv_int(c);
    return OSP_OK;
}

static osp_status m_list_index(jstate *st, const jv *self, const jargs *a, jv *out) {
    static const char *const names[] = {"value"};
    jv v[1];
    OSP_TRY(jargs_bind(st, "index", a, names, 1, 1, v));
    for (uint32_t i = 0; i < self->u.l->n; i++)
        if (jv_eq(self->u.l->v[i], v[0])) { *out = jv_int(i); return OSP_OK; }
    return jerr(st, OSP_ERR_INVALID, "ValueError: value is not in %s", jv_type_name(*self));
}

static osp_status m_list_copy(jstate *st, const jv *self, const jargs *a, jv *out) {
    OSP_TRY(no_args(st, "copy", a));
    jlist *l;
    OSP_TRY(jlist_new(st, self->u.l->n, &l));
    for (uint32_t i = 0; i < self->u.l->n; i++) l->v[l->n++] = self->u.l->v[i];
    *out = jv_list(l, 0);
    return OSP_OK;
}

static const jfunc DICT_METHODS[] = {
    {"get", m_get}, {"keys", m_keys}, {"values", m_values}, {"items", m_items}, {"copy", m_dict_copy},
};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const jfunc LIST_METHODS[] = {{"count", m_list_count}, {"index", m_list_index}, {"copy", m_list_copy}};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear", NULL};
static const jfunc TUPLE_METHODS[] = {{"count", m_list_count}, {"index", m_list_index}};

/* ------------------------------------------------------------------ loop */

static osp_status m_cycle(jstate *st, const jv *self, const jargs *a, jv *out) {
    if (a->nkw) return jerr(st, OSP_ERR_INVALID, "TypeError: cycle() takes no keyword arguments");
    if (!a->n) return jerr(st, OSP_ERR_INVALID, "TypeError: no items for cycling given");
    *out = a->v[self->u.loop->i % a->n];
    return OSP_OK;
}

static osp_status m_changed(jstate *st, const jv *self, const jargs *a, jv *out) {
    if (a->nkw) return jerr(st, OSP_ERR_INVALID, "TypeError: changed() takes no keyword arguments");
    jlist *l;
    OSP_TRY(jlist_new(st, a->n, &l));
    for (uint32_t i = 0; i < a->n; i++) l->v[l->n++] = a->v[i];
    jv val = jv_list(l, 1);
    jloop *lp = self->u.loop;
    if (!lp->changed_any || !jv_eq(lp->changed_last, val)) {
        lp->changed_any = 1;
        lp->changed_last = val;
        *out = jv_bool(1);
    } else {
        *out = jv_bool(0);
    }
    return OSP_OK;
}

static const jfunc LOOP_METHODS[] = {{"cycle", m_cycle}, {"changed", m_changed}};

static osp_status bind_method(jstate *st, jv self, const jfunc *f, jv *out) {
    jmethod *m;
    JALLOC(st, m, sizeof *m);
    m->self = self;
    m->f = f;
    *out = jv_make(JK_METHOD);
    out->u.meth = m;
    return OSP_OK;
}

int jmethod_find(jstate *st, jv obj, jstr name, jv *out, osp_status *err) {
    const jfunc *tab = NULL;
    size_t n = 0;
    const char *const *unsafe = NULL;
    switch (obj.k) {
    case JK_STR: tab = STR_METHODS; n = sizeof STR_METHODS / sizeof *STR_METHODS; break;
    case JK_DICT: tab = DICT_METHODS; n = sizeof DICT_METHODS / sizeof *DICT_METHODS; unsafe = DICT_UNSAFE; break;
    case JK_LIST: tab = LIST_METHODS; n = sizeof LIST_METHODS / sizeof *LIST_METHODS; unsafe = LIST_UNSAFE; break;
    case JK_TUPLE: tab = TUPLE_METHODS; n = sizeof TUPLE_METHODS / sizeof *TUPLE_METHODS; break;
    case JK_LOOP: tab = LOOP_METHODS; n = sizeof LOOP_METHODS / sizeof *LOOP_METHODS; break;
    default: return 0;
    }
    if (!name.n || name.s[0] == '_') return 0;
    for (size_t i = 0; i < n; i++)
        if (name_eq(name, tab[i].name)) {
            *err = bind_method(st, obj, &tab[i], out);
            return 1;
        }
    for (size_t i = 0; unsafe && unsafe[i]; i++)
        if (name_eq(name, unsafe[i])) {
            *err = jv_undef_msg(st, out, 1, "access to attribute '%s' of '%s' object is unsafe.", unsafe[i],
                                jv_type_name(obj));
            return 1;
        }
    return 0;
}

osp_status jloop_attr(jstate *st, jloop *l, jstr name, jv *out) {
    int64_t i = l->i, n = l->n;
    if (name_eq(name, "index")) *out = jv_int(i + 1);
    else if (name_eq(name, "index0")) *out = jv_int(i);
    else if (name_eq(name, "revindex")) *out = jv_int(n - i);
    else if (name_eq(name, "revindex0")) *out = jv_int(n - i - 1);
    else if (name_eq(name, "first")) *out = jv_bool(i == 0);
    else if (name_eq(name, "last")) *out = jv_bool(i == n - 1);
    else if (name_eq(name, "length")) *out = jv_int(n);
    else if (name_eq(name, "depth")) *out = jv_int(1);
    else if (name_eq(name, "depth0")) *out = jv_int(0);
    else if (name_eq(name, "previtem")) {
        if (i > 0) *out = l->items[i - 1];
        else return jv_undef_msg(st, out, 0, "there is no previous item");
    } else if (name_eq(name, "nextitem")) {
        if (i + 1 < n) *out = l->items[i + 1];
        else return jv_undef_msg(st, out, 0, "there is no next item");
    } else {
        jv self = jv_make(JK_LOOP);
        self.u.loop = l;
        osp_status err = OSP_OK;
        if (jmethod_find(st, self, name, out, &err)) return err;
        return jv_undef_attr(st, self, name, out);
    }
    return OSP_OK;
}

/* ------------------------------------------------------------------ "%" formatting */

static osp_status fmt_int_arg(jstate *st, jv v, char type, int64_t *out) {
    if (v.k == JK_INT || v.k == JK_BOOL) { *out = v.u.i; return OSP_OK; }
    if (v.k == JK_FLOAT && (type == 'd' || type == 'i' || type == 'u')) {
        if (!isfinite(v.u.d) || fabs(v.u.d) >= 9.2e18)
            return jerr(st, OSP_ERR_INVALID, "OverflowError: cannot convert float to integer");
        *out = (int64_t)v.u.d;
        return OSP_OK;
    }
    if (v.k == JK_UNDEF) return jundef_fail(st, v);
    return jerr(st, OSP_ERR_INVALID, "TypeError: %%%c format: %s is required, not %s", type,
                type == 'c' ? "an integer or a unicode character" : "a real number", jv_type_name(v));
}

osp_status jfmt_percent(jstate *st, jv fmt, jv args, jv *out) {
    const jv *pos = &args;
    uint32_t npos = 1, next = 0;
    int single = 1;
    const jdict *map = NULL;
    if (args.k == JK_TUPLE) { pos = args.u.l->v; npos = args.u.l->n; single = 0; }
    else if (args.k == JK_DICT) map = args.u.m;
    const char *s = fmt.u.s;
    size_t n = fmt.n;
    jbuf b = {0};
    osp_status rc = OSP_OK;
    for (size_t i = 0; i < n && rc == OSP_OK;) {
        if (s[i] != '%') {
            const char *p = memchr(s + i, '%', n - i);
            size_t e = p ? (size_t)(p - s) : n;
            rc = jbuf_put(st, &b, s + i, e - i);
            i = e;
            continue;
        }
        i++;
        if (i >= n) { rc = jerr(st, OSP_ERR_INVALID, "ValueError: incomplete format"); break; }
        jv val;
        int have_val = 0;
        if (s[i] == '(') {
            size_t e = i + 1;
            while (e < n && s[e] != ')') e++;
            if (e >= n) { rc = jerr(st, OSP_ERR_INVALID, "ValueError: incomplete format key"); break; }
            if (!map) { rc = jerr(st, OSP_ERR_INVALID, "TypeError: format requires a mapping"); break; }
            if (!jdict_find_str(map, s + i + 1, e - i - 1, &val)) {
                rc = jerr(st, OSP_ERR_INVALID, "KeyError: '%.*s'", (int)(e - i - 1), s + i + 1);
                break;
            }
            have_val = 1;
            i = e + 1;
        }
        char flags[8] = {0};
        int nf = 0;
        while (i < n && strchr("-+ #0", s[i]) && nf < 6) flags[nf++] = s[i++];
        int64_t width = -1, prec = -1;
        if (i < n && s[i] == '*') {
            int64_t w;
            if (next >= npos) { rc = jerr(st, OSP_ERR_INVALID, "TypeError: not enough arguments for format string"); break; }
            if ((rc = fmt_int_arg(st, pos[next++], 'd', &w)) != OSP_OK) break;
            width = w;
            i++;
        } else {
            /* Saturating: anything past 100000 is rejected below. */
            while (i < n && s[i] >= '0' && s[i] <= '9') {
                width = (width < 0 ? 0 : width) * 10 + (s[i++] - '0');
                if (width > 1000000) width = 1000000;
            }
        }
        if (i < n && s[i] == '.') {
            i++;
            prec = 0;
            if (i < n && s[i] == '*') {
                if (next >= npos) { rc = jerr(st, OSP_ERR_INVALID, "TypeError: not enough arguments for format string"); break; }
                if ((rc = fmt_int_arg(st, pos[next++], 'd', &prec)) != OSP_OK) break;
                i++;
            } else {
                while (i < n && s[i] >= '0' && s[i] <= '9') {
                    prec = prec * 10 + (s[i++] - '0');
                    if (prec > 1000000) prec = 1000000;
                }
            }
        }
        while (i < n && (s[i] == 'h' || s[i] == 'l' || s[i] == 'L')) i++;
        if (i >= n) { rc = jerr(st, OSP_ERR_INVALID, "ValueError: incomplete format"); break; }
        char type = s[i++];
        if (type == '%') { rc = jbuf_putc(st, &b, '%'); continue; }
        if (width > 100000 || prec > 100000) { rc = jerr(st, OSP_ERR_RANGE, "format width too large"); break; }
        if (!have_val) {
            if (map) val = args;
            else if (next >= npos) { rc = jerr(st, OSP_ERR_INVALID, "TypeError: not enough arguments for format string"); break; }
            else val = pos[next++];
        }
        char spec[32], tmp[512];
        int left = strchr(flags, '-') != NULL;
        jv text;
        switch (type) {
        case 's': case 'r': case 'a': {
            jbuf t = {0};
            rc = type == 's' ? jv_write_str(st, &t, val) : jv_write_repr(st, &t, val);
            if (rc != OSP_OK) { jbuf_free(st, &t); break; }
            rc = jbuf_take(st, &t, &text);
            if (rc == OSP_OK && prec >= 0 && (int64_t)ju_count(text.u.s, text.n) > prec)
                text.n = (uint32_t)ju_offset(text.u.s, text.n, (size_t)prec);
            break;
        }
        case 'c': {
            if (val.k == JK_STR && ju_count(val.u.s, val.n) == 1) { text = val; break; }
            int64_t cp;
            if ((rc = fmt_int_arg(st, val, 'c', &cp)) != OSP_OK) break;
            if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                rc = jerr(st, OSP_ERR_INVALID, "OverflowError: %%c arg not in range(0x110000)");
                break;
            }
            int k = ju_put(tmp, (int32_t)cp);
            rc = jv_str_copy(st, tmp, (size_t)k, &text);
            break;
        }
        case 'd': case 'i': case 'u': case 'o': case 'x': case 'X': {
            int64_t v;
            if ((rc = fmt_int_arg(st, val, type, &v)) != OSP_OK) break;
            char t = type == 'i' || type == 'u' ? 'd' : type;
            int plus = strchr(flags, '+') != NULL, space = strchr(flags, ' ') != NULL, alt = strchr(flags, '#') != NULL;
            uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            char digits[80];
            if (t == 'd') snprintf(digits, sizeof digits, "%llu", (unsigned long long)mag);
            else if (t == 'o') snprintf(digits, sizeof digits, "%llo", (unsigned long long)mag);
            else if (t == 'x') snprintf(digits, sizeof digits, "%llx", (unsigned long long)mag);
            else snprintf(digits, sizeof digits, "%llX", (unsigned long long)mag);
            const char *sign = v < 0 ? "-" : plus ? "+" : space ? " " : "";
            const char *prefix = alt && t == 'o' ? "0o" : alt && t == 'x' ? "0x" : alt && t == 'X' ? "0X" : "";
            size_t nd = strlen(digits), head = strlen(sign) + strlen(prefix);
            size_t zeros = prec > (int64_t)nd ? (size_t)prec - nd : 0;
            if (strchr(flags, '0') && !left && width > (int64_t)(head + zeros + nd)) zeros = (size_t)width - head - nd;
            if (head + zeros + nd >= sizeof tmp) { rc = jerr(st, OSP_ERR_RANGE, "format width too large"); break; }
            snprintf(tmp, sizeof tmp, "%s%s", sign, prefix);
            memset(tmp + head, '0', zeros);
            memcpy(tmp + head + zeros, digits, nd + 1);
            rc = jv_str_copy(st, tmp, strlen(tmp), &text);
            break;
        }
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            double d;
            if (val.k == JK_FLOAT) d = val.u.d;
            else if (val.k == JK_INT || val.k == JK_BOOL) d = (double)val.u.i;
            else if (val.k == JK_UNDEF) { rc = jundef_fail(st, val); break; }
            else { rc = jerr(st, OSP_ERR_INVALID, "TypeError: must be real number, not %s", jv_type_name(val)); break; }
            int k = snprintf(spec, sizeof spec, "%%%s", flags);
            if (width >= 0) k += snprintf(spec + k, sizeof spec - (size_t)k, "%lld", (long long)width);
            snprintf(spec + k, sizeof spec - (size_t)k, ".%lld%c", (long long)(prec < 0 ? 6 : prec), type);
            if (prec > 300 || fabs(d) > 1e300) { rc = jerr(st, OSP_ERR_RANGE, "float format too large"); break; }
            snprintf(tmp, sizeof tmp, spec, d);
            rc = jv_str_copy(st, tmp, strlen(tmp), &text);
            width = -1; /* applied by printf */
            break;
        }
        default:
            rc = jerr(st, OSP_ERR_INVALID, "ValueError: unsupported format character '%c'", type);
        }
        if (rc != OSP_OK) break;
        int64_t len = (int64_t)ju_count(text.u.s, text.n);
        if (width > len) rc = pad(st, text, width, jv_cstr(" "), left ? -1 : 1, &text);
        if (rc == OSP_OK) rc = jbuf_put(st, &b, text.u.s, text.n);
    }
    if (rc == OSP_OK && !map && !single && next < npos)
        rc = jerr(st, OSP_ERR_INVALID, "TypeError: not all arguments converted during string formatting");
    if (rc == OSP_OK && single && !map && next == 0)
        rc = jerr(st, OSP_ERR_INVALID, "TypeError: not all arguments converted during string formatting");
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}
