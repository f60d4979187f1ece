/* text/jinja: Python str semantics over UTF-8.
 *
 * Whitespace is exactly CPython's str.isspace() table. Searching and
 * splitting on a separator work on bytes: in valid UTF-8 a valid needle
 * only matches at character boundaries. Case mapping uses utf8proc's simple
 * mappings plus the unconditional SpecialCasing entries Python applies most
 * often (ß, the Latin ligatures, ŉ, ǰ, İ) and Python's final-sigma rule;
 * the rest of SpecialCasing (mostly Greek with iota subscript) is left out.
 */
#include <utf8proc.h>
#include "text/jinja_internal.h"

int ju_isspace(int32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int32_t ju_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s + *i;
    size_t left = n - *i;
    unsigned c = u[0];
    if (c < 0x80 || left < 2) { (*i)++; return (int32_t)c; }
    if ((c & 0xE0) == 0xC0) { *i += 2; return (int32_t)(((c & 0x1F) << 6) | (u[1] & 0x3F)); }
    if ((c & 0xF0) == 0xE0 && left >= 3) {
        *i += 3;
        return (int32_t)(((c & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F));
    }
    if (left >= 4) {
        *i += 4;
        return (int32_t)(((c & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F));
    }
    (*i)++;
    return (int32_t)c;
}

int ju_put(char *o, int32_t cp) {
    unsigned c = (unsigned)cp;
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

int ju_is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

size_t ju_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t ju_offset(const char *s, size_t n, size_t cpi) {
    size_t i = 0, c = 0;
    while (i < n && c < cpi) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        c++;
    }
    return i;
}

int ju_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

int ju_is_printable(int32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7F) return 0;
    if (cp < 0x7F) return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

int ju_is_alnum(int32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return 1;
    default:
        return 0;
    }
}

int ju_is_alpha(int32_t cp) {
    if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return 1;
    default:
        return 0;
    }
}

int ju_is_digit(int32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    return utf8proc_category(cp) == UTF8PROC_CATEGORY_ND;
}

int ju_is_upper(int32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || (utf8proc_tolower(cp) != cp && c != UTF8PROC_CATEGORY_LT);
}

int ju_is_lower(int32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LL || (utf8proc_toupper(cp) != cp && c != UTF8PROC_CATEGORY_LT);
}

int ju_is_cased(int32_t cp) {
    if (cp < 0x80) return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           utf8proc_toupper(cp) != cp || utf8proc_tolower(cp) != cp;
}

static int case_ignorable(int32_t cp) {
    if (cp == '\'' || cp == '.' || cp == ':' || cp == '^' || cp == '`' || cp == 0xB7 || cp == 0x2018 ||
        cp == 0x2019 || cp == 0x2024 || cp == 0x2027)
        return 1;
    if (cp < 0x80) return 0;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_SK:
        return 1;
    default:
        return 0;
    }
}

/* Full mappings: returns the number of code points written to out[3]. */
static int map_upper(int32_t cp, int32_t *out, int title) {
    switch (cp) {
    case 0xDF: out[0] = 'S'; out[1] = title ? 's' : 'S'; return 2;
    case 0xFB00: out[0] = 'F'; out[1] = title ? 'f' : 'F'; return 2;
    case 0xFB01: out[0] = 'F'; out[1] = title ? 'i' : 'I'; return 2;
    case 0xFB02: out[0] = 'F'; out[1] = title ? 'l' : 'L'; return 2;
    case 0xFB03: out[0] = 'F'; out[1] = title ? 'f' : 'F'; out[2] = title ? 'i' : 'I'; return 3;
    case 0xFB04: out[0] = 'F'; out[1] = title ? 'f' : 'F'; out[2] = title ? 'l' : 'L'; return 3;
    case 0xFB05: case 0xFB06: out[0] = 'S'; out[1] = title ? 't' : 'T'; return 2;
    case 0x149: out[0] = 0x2BC; out[1] = 'N'; return 2;
    case 0x1F0: out[0] = 'J'; out[1] = 0x30C; return 2;
    default: break;
    }
    out[0] = title ? utf8proc_totitle(cp) : utf8proc_toupper(cp);
    return 1;
}

static int map_lower(const int32_t *cps, size_t n, size_t i, int32_t *out) {
    int32_t cp = cps[i];
    if (cp < 0x80) { out[0] = (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; return 1; }
    if (cp == 0x130) { out[0] = 'i'; out[1] = 0x307; return 2; }
    if (cp == 0x3A3) { /* final sigma */
        size_t j = i;
        int32_t c = 0;
        int before = 0;
        while (j > 0) {
            c = cps[--j];
            if (!case_ignorable(c)) { before = ju_is_cased(c); break; }
        }
        int final = before;
        if (final) {
            size_t k = i + 1;
            while (k < n && case_ignorable(cps[k])) k++;
            final = k == n || !ju_is_cased(cps[k]);
        }
        out[0] = final ? 0x3C2 : 0x3C3;
        return 1;
    }
    out[0] = utf8proc_tolower(cp);
    return 1;
}

osp_status ju_case_map(jstate *st, jv s, ju_case mode, jv *out) {
    const char *p = s.u.s;
    size_t n = s.n;
    if (ju_is_ascii(p, n)) {
        char *o;
        JALLOC(st, o, n + 1);
        int prev_cased = 0;
        for (size_t i = 0; i < n; i++) {
            char c = p[i];
            int up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z';
            int want_upper;
            switch (mode) {
            case JU_UPPER: want_upper = 1; break;
            case JU_LOWER: want_upper = 0; break;
            case JU_TITLE: want_upper = !prev_cased; break;
            case JU_CAPITALIZE: want_upper = i == 0; break;
            default: want_upper = lo; break;
            }
            if (want_upper && lo) c = (char)(c - 32);
            else if (!want_upper && up) c = (char)(c + 32);
            o[i] = c;
            prev_cased = up || lo;
        }
        *out = jv_strn(o, n);
        return OSP_OK;
    }
    size_t ncp = ju_count(p, n);
    int32_t *cps;
    JALLOC(st, cps, (ncp + 1) * sizeof *cps);
    for (size_t i = 0, k = 0; i < n; k++) cps[k] = ju_next(p, n, &i);
    char *o;
    JALLOC(st, o, ncp * 12 + 1);
    size_t len = 0;
    int prev_cased = 0;
    for (size_t i = 0; i < ncp; i++) {
        int32_t m[3];
        int k;
        int32_t c = cps[i];
        switch (mode) {
        case JU_UPPER: k = map_upper(c, m, 0); break;
        case JU_LOWER: k = map_lower(cps, ncp, i, m); break;
        case JU_TITLE: k = prev_cased ? map_lower(cps, ncp, i, m) : map_upper(c, m, 1); break;
        case JU_CAPITALIZE: k = i == 0 ? map_upper(c, m, 1) : map_lower(cps, ncp, i, m); break;
        default:
            if (ju_is_upper(c)) k = map_lower(cps, ncp, i, m);
            else if (ju_is_lower(c)) k = map_upper(c, m, 0);
            else { m[0] = c; k = 1; }
            break;
        }
        for (int j = 0; j < k; j++) len += (size_t)ju_put(o + len, m[j]);
        prev_cased = ju_is_cased(c);
    }
    *out = jv_strn(o, len);
    return OSP_OK;
}

static int in_chars(int32_t cp, const jv *chars) {
    if (!chars) return ju_isspace(cp);
    const char *s = chars->u.s;
    size_t n = chars->n, i = 0;
    while (i < n)
        if (ju_next(s, n, &i) == cp) return 1;
    return 0;
}

jv ju_strip(jv s, const jv *chars, int which) {
    const char *p = s.u.s;
    size_t n = s.n, b = 0, e = n;
    if (which & 1) {
        while (b < n) {
            size_t k = b;
            if (!in_chars(ju_next(p, n, &k), chars)) break;
            b = k;
        }
    }
    if (which & 2) {
        size_t i = b, last = b;
        while (i < n) {
            int32_t cp = ju_next(p, n, &i);
            if (!in_chars(cp, chars)) last = i;
        }
        e = last;
    }
    jv r = jv_strn(p + b, e - b);
    return r;
}

static osp_status add_piece(jstate *st, jlist *l, const char *s, size_t n) {
    return jlist_push(st, l, jv_strn(s, n));
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    const char *end = h + hn - nn;
    for (const char *p = h; p <= end; p++) {
        p = memchr(p, nd[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (!memcmp(p, nd, nn)) return p;
    }
    return NULL;
}

static const char *rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i > 0; i--)
        if (!memcmp(h + i - 1, nd, nn)) return h + i - 1;
    return NULL;
}

osp_status ju_split(jstate *st, jv s, const jv *sep, int64_t maxsplit, int right, jv *out) {
    jlist *l;
    OSP_TRY(jlist_new(st, 4, &l));
    const char *p = s.u.s;
    size_t n = s.n;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep) {
        if (!sep->n) return jerr(st, OSP_ERR_INVALID, "ValueError: empty separator");
        if (!right) {
            size_t i = 0;
            while (maxsplit-- > 0) {
                const char *f = find_bytes(p + i, n - i, sep->u.s, sep->n);
                if (!f) break;
                OSP_TRY(add_piece(st, l, p + i, (size_t)(f - (p + i))));
                i = (size_t)(f - p) + sep->n;
            }
            OSP_TRY(add_piece(st, l, p + i, n - i));
        } else {
            size_t e = n;
            while (maxsplit-- > 0) {
                const char *f = rfind_bytes(p, e, sep->u.s, sep->n);
                if (!f) break;
                size_t b = (size_t)(f - p) + sep->n;
                OSP_TRY(add_piece(st, l, p + b, e - b));
                e = (size_t)(f - p);
            }
            OSP_TRY(add_piece(st, l, p, e));
            for (uint32_t a = 0, b = l->n ? l->n - 1 : 0; a < b; a++, b--) {
                jv t = l->v[a];
                l->v[a] = l->v[b];
                l->v[b] = t;
            }
        }
        *out = jv_list(l, 0);
        return OSP_OK;
    }
    /* whitespace split on code points */
    size_t ncp = ju_count(p, n);
    size_t *off;
    int32_t *cps;
    JALLOC(st, off, (ncp + 1) * sizeof *off);
    JALLOC(st, cps, (ncp + 1) * sizeof *cps);
    for (size_t i = 0, k = 0; k < ncp; k++) { off[k] = i; cps[k] = ju_next(p, n, &i); }
    off[ncp] = n;
    if (!right) {
        size_t i = 0;
        while (maxsplit-- > 0) {
            while (i < ncp && ju_isspace(cps[i])) i++;
            if (i == ncp) break;
            size_t j = i++;
            while (i < ncp && !ju_isspace(cps[i])) i++;
            OSP_TRY(add_piece(st, l, p + off[j], off[i] - off[j]));
        }
        if (i < ncp) {
            while (i < ncp && ju_isspace(cps[i])) i++;
            if (i != ncp) OSP_TRY(add_piece(st, l, p + off[i], n - off[i]));
        }
    } else {
        int64_t i = (int64_t)ncp - 1;
        while (maxsplit-- > 0) {
            while (i >= 0 && ju_isspace(cps[i])) i--;
            if (i < 0) break;
            int64_t j = i--;
            while (i >= 0 && !ju_isspace(cps[i])) i--;
            OSP_TRY(add_piece(st, l, p + off[i + 1], off[j + 1] - off[i + 1]));
        }
        if (i >= 0) {
            while (i >= 0 && ju_isspace(cps[i])) i--;
            if (i >= 0) OSP_TRY(add_piece(st, l, p, off[i + 1]));
        }
        for (uint32_t a = 0, b = l->n ? l->n - 1 : 0; a < b; a++, b--) {
            jv t = l->v[a];
            l->v[a] = l->v[b];
            l->v[b] = t;
        }
    }
    *out = jv_list(l, 0);
    return OSP_OK;
}

static int line_break(int32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

osp_status ju_splitlines(jstate *st, const char *s, size_t n, int keepends, jlist **out) {
    OSP_TRY(jlist_new(st, 4, out));
    size_t i = 0, start = 0;
    while (i < n) {
        size_t k = i;
        int32_t cp = ju_next(s, n, &k);
        if (!line_break(cp)) { i = k; continue; }
        size_t eol = i;
        if (cp == '\r' && k < n && s[k] == '\n') k++;
        OSP_TRY(add_piece(st, *out, s + start, (keepends ? k : eol) - start));
        start = i = k;
    }
    if (start < n) OSP_TRY(add_piece(st, *out, s + start, n - start));
    return OSP_OK;
}

osp_status ju_replace(jstate *st, jv s, jv old, jv new_, int64_t count, jv *out) {
    jbuf b = {0};
    const char *p = s.u.s;
    size_t n = s.n;
    if (count < 0) count = INT64_MAX;
    osp_status rc = OSP_OK;
    if (!old.n) {
        size_t i = 0;
        while (rc == OSP_OK && count > 0) {
            rc = jbuf_put(st, &b, new_.u.s, new_.n);
            count--;
            if (i >= n) break;
            size_t k = i;
            ju_next(p, n, &k);
            if (rc == OSP_OK) rc = jbuf_put(st, &b, p + i, k - i);
            i = k;
        }
        if (rc == OSP_OK && i < n) rc = jbuf_put(st, &b, p + i, n - i);
    } else {
        size_t i = 0;
        while (rc == OSP_OK && count-- > 0) {
            const char *f = find_bytes(p + i, n - i, old.u.s, old.n);
            if (!f) break;
            rc = jbuf_put(st, &b, p + i, (size_t)(f - (p + i)));
            if (rc == OSP_OK) rc = jbuf_put(st, &b, new_.u.s, new_.n);
            i = (size_t)(f - p) + old.n;
        }
        if (rc == OSP_OK) rc = jbuf_put(st, &b, p + i, n - i);
    }
    if (rc != OSP_OK) { jbuf_free(st, &b); return rc; }
    return jbuf_take(st, &b, out);
}

int64_t ju_find(jv hay, jv needle, int reverse) {
    const char *f = reverse ? rfind_bytes(hay.u.s, hay.n, needle.u.s, needle.n)
                            : find_bytes(hay.u.s, hay.n, needle.u.s, needle.n);
    if (!f) return -1;
    return (int64_t)ju_count(hay.u.s, (size_t)(f - hay.u.s));
}

int64_t ju_count_sub(jv hay, jv needle) {
    if (!needle.n) return (int64_t)ju_count(hay.u.s, hay.n) + 1;
    int64_t c = 0;
    size_t i = 0;
    for (;;) {
        const char *f = find_bytes(hay.u.s + i, hay.n - i, needle.u.s, needle.n);
        if (!f) break;
        c++;
        i = (size_t)(f - hay.u.s) + needle.n;
    }
    return c;
}
