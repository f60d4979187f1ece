/* grammar/regex: regular expressions to byte-level DFAs.
 *
 * Pipeline: text -> AST (rnode) -> Thompson NFA (built back to front, so a
 * counted repetition is just its subtree built again) -> byte classes (the
 * coarsest partition of 0..255 that every NFA byte set respects) -> subset
 * construction -> states that cannot reach acceptance folded into the dead
 * state 0. The start state is 1.
 *
 * GR_RE_JSONSTR: the regex speaks of a string's characters (JSON Schema
 * "pattern", unanchored unless ^/$ say so) and the DFA matches the JSON
 * string literal that encodes them: the quotes, escapes for '"', '\\' and
 * control characters, whole UTF-8 sequences for non-ASCII characters, and
 * \uXXXX for a character class that holds non-ASCII ones. GR_RE_JSONBODY is
 * the same without the quotes, or with the opening (GR_RE_OPEN) or closing
 * (GR_RE_CLOSE) one: a piece of a string, as long strings are chunks.
 */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"

enum { R_SET, R_CAT, R_ALT, R_REP, R_EMPTY };
typedef struct rnode {
    uint8_t kind;
    int32_t a, b, min, max; /* max -1: unbounded */
    uint64_t set[4];
} rnode;

typedef struct rparse {
    const char *s;
    size_t n, i;
    int mode;
    int allesc; /* GR_RE_ALLESC */
    int utf8;   /* GR_RE_UTF8 */
    int icase, dotall; /* inside (?i:...), (?s:...) */
    rnode *nodes;
    int32_t n_nodes, cap;
    osp_status st;
} rparse;

#define RE_MAX_NODES 200000
#define RE_MAX_COUNT 5000

static int32_t mk(rparse *p, int kind, int32_t a, int32_t b) {
    if (p->st) return 0;
    if (p->n_nodes == p->cap) {
        if (p->cap >= RE_MAX_NODES) {
            p->st = osp_err(OSP_ERR_UNSUPPORTED, "regex too large");
            return 0;
        }
        int32_t nc = p->cap ? p->cap * 2 : 64;
        rnode *nn = osp_malloc(OSP_POOL_MISC, sizeof(rnode) * nc);
        if (p->nodes) memcpy(nn, p->nodes, sizeof(rnode) * p->n_nodes);
        osp_free(p->nodes);
        p->nodes = nn, p->cap = nc;
    }
    rnode *r = &p->nodes[p->n_nodes];
    memset(r, 0, sizeof *r);
    r->kind = kind, r->a = a, r->b = b;
    return p->n_nodes++;
}
static int32_t mk_set(rparse *p, const uint64_t set[4]) {
    int32_t r = mk(p, R_SET, 0, 0);
    if (!p->st) memcpy(p->nodes[r].set, set, 32);
    return r;
}
static int32_t mk_range(rparse *p, int lo, int hi) {
    uint64_t s[4] = {0};
    for (int c = lo; c <= hi; c++) s[c >> 6] |= 1ull << (c & 63);
    return mk_set(p, s);
}
static int32_t mk_cat(rparse *p, int32_t a, int32_t b) { return a < 0 ? b : b < 0 ? a : mk(p, R_CAT, a, b); }
static int32_t mk_alt(rparse *p, int32_t a, int32_t b) { return a < 0 ? b : b < 0 ? a : mk(p, R_ALT, a, b); }
static int32_t mk_rep(rparse *p, int32_t a, int32_t min, int32_t max) {
    int32_t r = mk(p, R_REP, a, 0);
    if (!p->st) p->nodes[r].min = min, p->nodes[r].max = max;
    return r;
}
static int32_t mk_bytes(rparse *p, const char *s, size_t n) {
    int32_t r = -1;
    for (size_t i = 0; i < n; i++) r = mk_cat(p, r, mk_range(p, (uint8_t)s[i], (uint8_t)s[i]));
    return r;
}

/* A character class over decoded characters: ASCII members and whether
 * every non-ASCII character is in. */
typedef struct cclass {
    uint64_t ascii[2];
    int nonascii;
} cclass;
static void cc_add(cclass *c, int lo, int hi) {
    for (int x = lo; x <= hi; x++) c->ascii[x >> 6] |= 1ull << (x & 63);
}
static int cc_has(const cclass *c, int x) { return (c->ascii[x >> 6] >> (x & 63)) & 1; }

static const char hexd[] = "0123456789abcdef";
/* The JSON encodings of a class's characters. */
static int32_t json_class(rparse *p, const cclass *c) {
    uint64_t s[4] = {0};
    for (int x = 0x20; x < 0x80; x++)
        if (cc_has(c, x) && x != '"' && x != '\\') s[x >> 6] |= 1ull << (x & 63);
    int32_t r = (s[0] | s[1]) ? mk_set(p, s) : -1;
    for (int x = 0; x < 0x20; x++) {
        if (!cc_has(c, x)) continue;
        char e[6] = {'\\', 'u', '0', '0', hexd[x >> 4], hexd[x & 15]};
        const char *sh = x == '\n' ? "\\n" : x == '\t' ? "\\t" : x == '\r' ? "\\r" : x == 8 ? "\\b" : x == 12 ? "\\f" : NULL;
        r = mk_alt(p, r, sh ? mk_bytes(p, sh, 2) : mk_bytes(p, e, 6));
        if (p->allesc && sh) r = mk_alt(p, r, mk_bytes(p, e, 6));
        if (p->allesc && (x & 15) >= 10) e[5] = (char)(e[5] - 32), r = mk_alt(p, r, mk_bytes(p, e, 6));
    }
    if (p->allesc) /* every printable ASCII character as \u00XX too (either case of hex digit) */
        for (int x = 0x20; x < 0x80; x++) {
            if (!cc_has(c, x)) continue;
            uint64_t lo[4] = {0};
            int l = x & 15;
            lo[hexd[l] >> 6] |= 1ull << (hexd[l] & 63);
            if (l >= 10) lo[(hexd[l] - 32) >> 6] |= 1ull << ((hexd[l] - 32) & 63);
            char e[5] = {'\\', 'u', '0', '0', hexd[x >> 4]};
            r = mk_alt(p, r, mk_cat(p, mk_bytes(p, e, 5), mk_set(p, lo)));
        }
    if (cc_has(c, '"')) r = mk_alt(p, r, mk_bytes(p, "\\\"", 2));
    if (cc_has(c, '\\')) r = mk_alt(p, r, mk_bytes(p, "\\\\", 2));
    if (cc_has(c, '/')) r = mk_alt(p, r, mk_bytes(p, "\\/", 2));
    if (c->nonascii) {
        int32_t cont = mk_range(p, 0x80, 0xbf);
        r = mk_alt(p, r, mk_cat(p, mk_range(p, 0xc2, 0xdf), cont));
        r = mk_alt(p, r, mk_cat(p, mk_range(p, 0xe0, 0xef), mk_rep(p, cont, 2, 2)));
        r = mk_alt(p, r, mk_cat(p, mk_range(p, 0xf0, 0xf4), mk_rep(p, cont, 3, 3)));
        uint64_t hx[4] = {0};
        for (const char *h = "0123456789abcdefABCDEF"; *h; h++) hx[*h >> 6] |= 1ull << (*h & 63);
        r = mk_alt(p, r, mk_cat(p, mk_bytes(p, "\\u", 2), mk_rep(p, mk_set(p, hx), 4, 4)));
    }
    if (r < 0) r = mk_set(p, (uint64_t[4]){0}); /* matches nothing */
    return r;
}
/* A class as an AST in the parser's mode (plain: bytes; non-ASCII =
 * 0x80..0xff, or whole UTF-8 characters under GR_RE_UTF8); letters in
 * both cases inside (?i:...). */
static int32_t class_node(rparse *p, const cclass *c0) {
    cclass c = *c0;
    if (p->icase)
        for (int x = 'A'; x <= 'Z'; x++)
            if (cc_has(&c, x) || cc_has(&c, x | 0x20)) cc_add(&c, x, x), cc_add(&c, x | 0x20, x | 0x20);
    if (p->mode != GR_RE_PLAIN) return json_class(p, &c);
    if (p->utf8 && c.nonascii) {
        uint64_t s[4] = {c.ascii[0], c.ascii[1], 0, 0};
        int32_t cont = mk_range(p, 0x80, 0xbf), r = (s[0] | s[1]) ? mk_set(p, s) : -1;
        r = mk_alt(p, r, mk_cat(p, mk_range(p, 0xc2, 0xdf), cont));
        r = mk_alt(p, r, mk_cat(p, mk_range(p, 0xe0, 0xef), mk_rep(p, cont, 2, 2)));
        return mk_alt(p, r, mk_cat(p, mk_range(p, 0xf0, 0xf4), mk_rep(p, cont, 3, 3)));
    }
    uint64_t s[4] = {c.ascii[0], c.ascii[1], c.nonascii ? ~0ull : 0, c.nonascii ? ~0ull : 0};
    return mk_set(p, s);
}
static int32_t char_node(rparse *p, int x) {
    if (x >= 0x80) return mk_range(p, x, x); /* a raw byte (a UTF-8 sequence's part) */
    cclass c = {{0, 0}, 0};
    cc_add(&c, x, x);
    if (p->mode != GR_RE_PLAIN || (p->icase && (x | 0x20) >= 'a' && (x | 0x20) <= 'z')) return class_node(p, &c);
    return mk_range(p, x, x);
}

static osp_status fail(rparse *p, const char *what) {
    if (!p->st) p->st = osp_err(OSP_ERR_UNSUPPORTED, "regex: %s at offset %zu of \"%.*s\"", what, p->i,
                                (int)(p->n > 80 ? 80 : p->n), p->s);
    return p->st;
}
static int peek(rparse *p) { return p->i < p->n ? (uint8_t)p->s[p->i] : -1; }

/* \d \w \s and friends into c; returns 0 when e is none of them. */
static int perl_class(cclass *c, int e) {
    cclass t = {{0, 0}, 0};
    int lower = e | 0x20;
    if (lower == 'd') cc_add(&t, '0', '9');
    else if (lower == 'w') cc_add(&t, '0', '9'), cc_add(&t, 'a', 'z'), cc_add(&t, 'A', 'Z'), cc_add(&t, '_', '_');
    else if (lower == 's') cc_add(&t, ' ', ' '), cc_add(&t, '\t', '\r');
    else return 0;
    if (e != lower) t.ascii[0] = ~t.ascii[0], t.ascii[1] = ~t.ascii[1], t.nonascii = 1;
    c->ascii[0] |= t.ascii[0], c->ascii[1] |= t.ascii[1], c->nonascii |= t.nonascii;
    return 1;
}
static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}
/* An escaped single character (after the backslash): its code, or -1. */
static int esc_char(rparse *p) {
    int e = peek(p);
    if (e < 0) return fail(p, "trailing backslash"), -1;
    p->i++;
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return 12;
    case 'v': return 11;
    case '0': return 0;
    case 'x': case 'u': {
        int nd = e == 'x' ? 2 : 4, v = 0;
        for (int k = 0; k < nd; k++) {
            int h = hexval(peek(p));
            if (h < 0) return fail(p, "bad hex escape"), -1;
            v = v * 16 + h, p->i++;
        }
        if (v > 0x7f) return fail(p, "non-ASCII escape"), -1;
        return v;
    }
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
        return fail(p, "unsupported escape"), -1;
    if (e >= 0x80) return fail(p, "escaped non-ASCII byte"), -1;
    return e;
}

static int32_t parse_alt(rparse *p);

static int32_t parse_class(rparse *p) {
    cclass c = {{0, 0}, 0};
    int neg = 0;
    if (peek(p) == '^') neg = 1, p->i++;
    int first = 1;
    for (;;) {
        int ch = peek(p);
        if (ch < 0) return fail(p, "unterminated class"), -1;
        if (ch == ']' && !first) { p->i++; break; }
        first = 0;
        p->i++;
        int lo;
        if (ch == '\\') {
            int e = peek(p);
            if (e >= 0 && perl_class(&c, e)) { p->i++; continue; }
            if (e == 'b') { p->i++; lo = 8; }
            else if ((lo = esc_char(p)) < 0) return -1;
        } else if (ch == '[' && peek(p) == ':') {
            return fail(p, "POSIX class"), -1;
        } else if (ch >= 0x80) {
            return fail(p, "non-ASCII in a character class"), -1;
        } else lo = ch;
        int hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            int h = peek(p);
            p->i++;
            if (h == '\\') { if ((h = esc_char(p)) < 0) return -1; }
            else if (h >= 0x80) return fail(p, "non-ASCII in a character class"), -1;
            if (h < lo) return fail(p, "bad range"), -1;
            hi = h;
        }
        cc_add(&c, lo, hi);
    }
    if (p->icase) /* (folded before a negation: [^a] under i takes neither case) */
        for (int x = 'A'; x <= 'Z'; x++)
            if (cc_has(&c, x) || cc_has(&c, x | 0x20)) cc_add(&c, x, x), cc_add(&c, x | 0x20, x | 0x20);
    if (neg) c.ascii[0] = ~c.ascii[0], c.ascii[1] = ~c.ascii[1], c.nonascii = !c.nonascii;
    return class_node(p, &c);
}

static int parse_int(rparse *p, int32_t *v) {
    int d = 0;
    int64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (p->s[p->i++] - '0'), d++;
        if (x > RE_MAX_COUNT) x = RE_MAX_COUNT + 1; /* (saturated as it goes: a long run of digits cannot overflow) */
    }
    *v = (int32_t)x;
    return d;
}

static int32_t parse_atom(rparse *p) {
    int ch = peek(p);
    p->i++;
    if (ch == '(') {
        int icase = p->icase, dotall = p->dotall;
        if (peek(p) == '?') { /* (?:...), or flags i and s for the group */
            size_t k = p->i + 1;
            while (k < p->n && (p->s[k] == 'i' || p->s[k] == 's')) {
                if (p->s[k] == 'i') p->icase = 1;
                else p->dotall = 1;
                k++;
            }
            if (k < p->n && p->s[k] == ':') p->i = k + 1;
            else return fail(p, "group flags other than (?i:...) and (?s:...), or lookaround"), -1;
        }
        int32_t r = parse_alt(p);
        p->icase = icase, p->dotall = dotall;
        if (p->st) return -1;
        if (peek(p) != ')') return fail(p, "missing )"), -1;
        p->i++;
        return r < 0 ? mk(p, R_EMPTY, 0, 0) : r;
    }
    if (ch == '[') return parse_class(p);
    if (ch == '.') {
        cclass c = {{~0ull, ~0ull}, 1};
        if (!p->dotall) c.ascii[0] &= ~(1ull << '\n');
        return class_node(p, &c);
    }
    if (ch == '\\') {
        int e = peek(p);
        cclass c = {{0, 0}, 0};
        if (e >= 0 && perl_class(&c, e)) { p->i++; return class_node(p, &c); }
        if (e == 'b' || e == 'B') return fail(p, "word boundary"), -1;
        if (e >= '1' && e <= '9') return fail(p, "backreference"), -1;
        int x = esc_char(p);
        return x < 0 ? -1 : char_node(p, x);
    }
    if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return fail(p, "nothing to repeat"), -1;
    if (ch >= 0x80 && p->mode != GR_RE_PLAIN) return mk_range(p, ch, ch); /* UTF-8 bytes as themselves */
    return char_node(p, ch);
}

static int32_t parse_rep(rparse *p) {
    int32_t a = parse_atom(p);
    for (;;) {
        if (p->st) return -1;
        int ch = peek(p);
        int32_t min, max;
        if (ch == '*') min = 0, max = -1, p->i++;
        else if (ch == '+') min = 1, max = -1, p->i++;
        else if (ch == '?') min = 0, max = 1, p->i++;
        else if (ch == '{') {
            size_t save = p->i++;
            if (!parse_int(p, &min)) { p->i = save; return fail(p, "bad {"), -1; }
            max = min;
            if (peek(p) == ',') {
                p->i++;
                if (!parse_int(p, &max)) max = -1;
            }
            if (peek(p) != '}') return fail(p, "bad {n,m}"), -1;
            p->i++;
            if (min > RE_MAX_COUNT || max > RE_MAX_COUNT) return fail(p, "repetition count too large"), -1;
            if (max >= 0 && max < min) return fail(p, "bad {n,m}"), -1;
        } else return a;
        if (peek(p) == '?' || peek(p) == '+') p->i++; /* lazy/possessive: the same language */
        a = mk_rep(p, a, min, max);
    }
}

static int32_t parse_cat(rparse *p) {
    int32_t r = -1;
    while (!p->st) {
        int ch = peek(p);
        if (ch < 0 || ch == '|' || ch == ')') break;
        if (ch == '^' || ch == '$') return fail(p, "anchor inside the pattern"), -1;
        r = mk_cat(p, r, parse_rep(p));
    }
    return r;
}

static int32_t parse_alt(rparse *p) {
    int32_t r = parse_cat(p);
    int empty = r < 0;
    while (!p->st && peek(p) == '|') {
        p->i++;
        int32_t b = parse_cat(p);
        if (b < 0) empty = 1;
        else r = mk_alt(p, r, b);
    }
    if (empty && r >= 0) r = mk_rep(p, r, 0, 1);
    return r;
}

/* ---- NFA ---- */
enum { N_SET, N_SPLIT, N_MATCH };
typedef struct nstate {
    uint8_t kind;
    int32_t out1, out2, set; /* set: index into sets */
} nstate;
typedef struct nfa {
    nstate *st;
    int32_t n, cap;
    uint64_t (*sets)[4];
    int32_t n_sets, cap_sets;
    osp_status err;
} nfa;
#define NFA_MAX 400000

static int32_t nfa_new(nfa *f, int kind, int32_t o1, int32_t o2) {
    if (f->err) return 0;
    if (f->n == f->cap) {
        if (f->cap >= NFA_MAX) { f->err = osp_err(OSP_ERR_UNSUPPORTED, "regex too large (NFA)"); return 0; }
        int32_t nc = f->cap ? f->cap * 2 : 256;
        nstate *nn = osp_malloc(OSP_POOL_MISC, sizeof(nstate) * nc);
        if (f->st) memcpy(nn, f->st, sizeof(nstate) * f->n);
        osp_free(f->st);
        f->st = nn, f->cap = nc;
    }
    f->st[f->n] = (nstate){(uint8_t)kind, o1, o2, -1};
    return f->n++;
}
static int32_t nfa_set(nfa *f, const uint64_t s[4], int32_t out) {
    int32_t x = nfa_new(f, N_SET, out, -1);
    if (f->err) return 0;
    if (f->n_sets == f->cap_sets) {
        int32_t nc = f->cap_sets ? f->cap_sets * 2 : 64;
        uint64_t(*ns)[4] = osp_malloc(OSP_POOL_MISC, 32 * (size_t)nc);
        if (f->sets) memcpy(ns, f->sets, 32 * (size_t)f->n_sets);
        osp_free(f->sets);
        f->sets = ns, f->cap_sets = nc;
    }
    memcpy(f->sets[f->n_sets], s, 32);
    f->st[x].set = f->n_sets++;
    return x;
}
static int32_t build(nfa *f, const rnode *ns, int32_t r, int32_t cont) {
    if (f->err) return 0;
    const rnode *x = &ns[r];
    switch (x->kind) {
    case R_SET: return nfa_set(f, x->set, cont);
    case R_CAT: return build(f, ns, x->a, build(f, ns, x->b, cont));
    case R_ALT: {
        int32_t a = build(f, ns, x->a, cont);
        return nfa_new(f, N_SPLIT, a, build(f, ns, x->b, cont));
    }
    case R_EMPTY: return cont;
    case R_REP: {
        int32_t s;
        if (x->max < 0) {
            int32_t loop = nfa_new(f, N_SPLIT, -1, cont);
            int32_t body = build(f, ns, x->a, loop);
            if (!f->err) f->st[loop].out1 = body;
            s = loop;
        } else {
            s = cont;
            for (int32_t k = x->min; k < x->max && !f->err; k++) s = nfa_new(f, N_SPLIT, build(f, ns, x->a, s), cont);
        }
        for (int32_t k = 0; k < x->min && !f->err; k++) s = build(f, ns, x->a, s);
        return s;
    }
    }
    return cont;
}

/* ---- subset construction ---- */
typedef struct dbuild {
    const nfa *f;
    int32_t *stamp, cur;
    int32_t *stack;
    int32_t *rtmp; /* radix_sort's buffer, f->n + 1 */
    int64_t work;  /* NFA states visited and successors gathered: bounded by GR_MAX_DFA_WORK */
    /* DFA states as sorted lists of NFA SET/MATCH states */
    int32_t *lists;
    size_t n_lists, cap_lists;
    size_t *loff; /* [state] offset, lengths by difference */
    int32_t cap_loff;
    int32_t n_states, cap_states;
    int32_t *hslot;
    uint32_t hmask;
} dbuild;

static void closure_add(dbuild *b, int32_t s, int32_t *out, int32_t *nout) {
    int32_t sp = 0;
    b->stack[sp++] = s;
    while (sp) {
        int32_t x = b->stack[--sp];
        b->work++;
        if (x < 0 || b->stamp[x] == b->cur) continue;
        b->stamp[x] = b->cur;
        const nstate *n = &b->f->st[x];
        if (n->kind == N_SPLIT) {
            b->stack[sp++] = n->out2;
            b->stack[sp++] = n->out1;
        } else out[(*nout)++] = x;
    }
}
/* l[0..n) ascending (NFA states: 0 <= x < 2^bits, bits <= 24), a pass of a byte at a time through tmp */
static void radix_sort(int32_t *l, int32_t *tmp, int32_t n, int bits) {
    int32_t *src = l, *dst = tmp;
    for (int sh = 0; sh < bits; sh += 8) {
        int32_t cnt[257] = {0};
        for (int32_t i = 0; i < n; i++) cnt[((src[i] >> sh) & 255) + 1]++;
        for (int k = 0; k < 256; k++) cnt[k + 1] += cnt[k];
        for (int32_t i = 0; i < n; i++) dst[cnt[(src[i] >> sh) & 255]++] = src[i];
        int32_t *t = src;
        src = dst, dst = t;
    }
    if (src != l) memcpy(l, src, sizeof(int32_t) * (size_t)n);
}
static uint32_t hash_list(const int32_t *l, int32_t n) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)l[i]) * 16777619u;
    return h;
}
/* Find or add the DFA state of list l; -1 on overflow. */
static int32_t dfa_state(dbuild *b, int32_t *l, int32_t n) {
    if (!n) return 0;
    if (n <= 32) /* most lists are short */
        for (int32_t i = 1; i < n; i++) {
            int32_t x = l[i], j = i;
            for (; j > 0 && l[j - 1] > x; j--) l[j] = l[j - 1];
            l[j] = x;
        }
    else radix_sort(l, b->rtmp, n, b->f->n <= 1 << 16 ? 16 : 24);
    if ((uint32_t)b->n_states * 2 > b->hmask) { /* grow the table */
        uint32_t nm = b->hmask * 2 + 1;
        int32_t *ns = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (nm + 1));
        memset(ns, -1, sizeof(int32_t) * (nm + 1));
        for (int32_t q = 1; q < b->n_states; q++) {
            uint32_t g = hash_list(b->lists + b->loff[q], (int32_t)(b->loff[q + 1] - b->loff[q])) & nm;
            while (ns[g] >= 0) g = (g + 1) & nm;
            ns[g] = q;
        }
        osp_free(b->hslot);
        b->hslot = ns, b->hmask = nm;
    }
    uint32_t h = hash_list(l, n);
    for (uint32_t i = h & b->hmask;; i = (i + 1) & b->hmask) {
        int32_t s = b->hslot[i];
        if (s < 0) {
            if (b->n_states >= GR_MAX_DFA_STATES) return -1;
            if (b->n_lists + n > b->cap_lists) {
                size_t nc = (b->n_lists + n) * 2;
                int32_t *nl = osp_malloc(OSP_POOL_MISC, nc * 4);
                if (b->lists) memcpy(nl, b->lists, b->n_lists * 4);
                osp_free(b->lists);
                b->lists = nl, b->cap_lists = nc;
            }
            memcpy(b->lists + b->n_lists, l, n * 4);
            if (b->n_states + 2 > b->cap_loff) {
                size_t *nl = osp_malloc(OSP_POOL_MISC, sizeof(size_t) * b->cap_loff * 2);
                memcpy(nl, b->loff, sizeof(size_t) * b->cap_loff);
                osp_free(b->loff);
                b->loff = nl, b->cap_loff *= 2;
            }
            s = b->n_states++;
            b->loff[s] = b->n_lists;
            b->n_lists += n;
            b->loff[s + 1] = b->n_lists;
            b->hslot[i] = s;
            return s;
        }
        size_t ln = b->loff[s + 1] - b->loff[s];
        if (ln == (size_t)n && !memcmp(b->lists + b->loff[s], l, n * 4)) return s;
    }
}

static osp_status nfa_to_dfa(const nfa *f, int32_t start, gr_dfa *out) {
    /* byte classes */
    uint8_t cls[256] = {0};
    int32_t ncls = 1;
    for (int32_t k = 0; k < f->n_sets; k++) {
        int16_t map[512];
        memset(map, -1, sizeof map);
        int32_t nn = 0;
        uint8_t nc[256];
        for (int c = 0; c < 256; c++) {
            int in = (f->sets[k][c >> 6] >> (c & 63)) & 1;
            int key = cls[c] * 2 + in;
            if (map[key] < 0) map[key] = (int16_t)nn++;
            nc[c] = (uint8_t)map[key];
        }
        memcpy(cls, nc, 256);
        ncls = nn;
    }
    uint8_t rep[256];
    for (int c = 255; c >= 0; c--) rep[cls[c]] = (uint8_t)c;

    /* each set's classes as a mask over class numbers (a set is a union of classes) */
    uint64_t(*set_cm)[4] = osp_calloc(OSP_POOL_MISC, 32 * (size_t)f->n_sets + 32);
    for (int32_t k = 0; k < f->n_sets; k++)
        for (int32_t c = 0; c < ncls; c++)
            if ((f->sets[k][rep[c] >> 6] >> (rep[c] & 63)) & 1) set_cm[k][c >> 6] |= 1ull << (c & 63);
    int32_t *bk_off = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)(ncls + 1) * 2), *bk_fill = bk_off + ncls + 1;
    int32_t cap_bk = 1024, *bk = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)cap_bk);

    dbuild b = {0};
    b.f = f;
    b.rtmp = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (f->n + 1));
    b.stamp = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * f->n);
    b.stack = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (f->n * 2 + 2));
    b.cap_loff = 256;
    b.loff = osp_malloc(OSP_POOL_MISC, sizeof(size_t) * b.cap_loff);
    b.hmask = 255;
    b.hslot = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (b.hmask + 1));
    memset(b.hslot, -1, sizeof(int32_t) * (b.hmask + 1));
    int32_t *tmp = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (f->n + 1));
    int32_t cap_next = 1024;
    int32_t *next = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap_next * ncls);
    osp_status st = OSP_OK;

    b.n_states = 1; /* 0: dead */
    b.loff[0] = 0, b.loff[1] = 0;
    int32_t nt = 0;
    b.cur++;
    closure_add(&b, start, tmp, &nt);
    dfa_state(&b, tmp, nt); /* 1: start */
    for (int32_t s = 1; s < b.n_states && !st; s++) {
        if (b.n_states > cap_next) {
            int32_t nc = cap_next * 2;
            while (nc < b.n_states + 1) nc *= 2;
            int32_t *nn = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * nc * ncls);
            memcpy(nn, next, sizeof(int32_t) * cap_next * ncls);
            osp_free(next);
            next = nn, cap_next = nc;
        }
        /* each class's successors in the list's order: a bucket per class, filled from the sets' class lists */
        int32_t *cnt = bk_off;
        memset(cnt, 0, sizeof(int32_t) * (size_t)(ncls + 1));
        for (size_t i = b.loff[s]; i < b.loff[s + 1]; i++) {
            const nstate *n = &f->st[b.lists[i]];
            if (n->kind != N_SET) continue;
            for (int w = 0; w < 4; w++)
                for (uint64_t m = set_cm[n->set][w]; m; m &= m - 1) cnt[w * 64 + __builtin_ctzll(m) + 1]++;
        }
        for (int32_t c = 0; c < ncls; c++) cnt[c + 1] += cnt[c];
        b.work += cnt[ncls] + (int64_t)(b.loff[s + 1] - b.loff[s]);
        if (cnt[ncls] > cap_bk) {
            osp_free(bk);
            cap_bk = cnt[ncls] * 2;
            bk = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)cap_bk);
        }
        for (int32_t c = 0; c < ncls; c++) bk_fill[c] = cnt[c];
        for (size_t i = b.loff[s]; i < b.loff[s + 1]; i++) {
            const nstate *n = &f->st[b.lists[i]];
            if (n->kind != N_SET) continue;
            for (int w = 0; w < 4; w++)
                for (uint64_t m = set_cm[n->set][w]; m; m &= m - 1) bk[bk_fill[w * 64 + __builtin_ctzll(m)]++] = n->out1;
        }
        for (int32_t c = 0; c < ncls; c++) {
            nt = 0;
            b.cur++;
            for (int32_t i = cnt[c]; i < cnt[c + 1]; i++) closure_add(&b, bk[i], tmp, &nt);
            if (b.work > GR_MAX_DFA_WORK) {
                st = osp_err(OSP_ERR_UNSUPPORTED, "regex too complex to compile (over %lld steps of subset construction)",
                             (long long)GR_MAX_DFA_WORK);
                break;
            }
            int32_t t = dfa_state(&b, tmp, nt);
            if (t < 0) { st = osp_err(OSP_ERR_UNSUPPORTED, "regex needs more than %d DFA states", GR_MAX_DFA_STATES); break; }
            next[s * ncls + c] = t;
        }
        if (s + 1 >= cap_next && b.n_states > cap_next) continue;
    }
    int32_t ns = b.n_states;
    if (!st && ns > cap_next) st = osp_err(OSP_ERR_INTERNAL, "dfa table");
    uint8_t *acc = NULL, *live = NULL;
    if (!st) {
        for (int32_t c = 0; c < ncls; c++) next[c] = 0;
        acc = osp_calloc(OSP_POOL_MISC, ns);
        for (int32_t s = 1; s < ns; s++)
            for (size_t i = b.loff[s]; i < b.loff[s + 1]; i++)
                if (f->st[b.lists[i]].kind == N_MATCH) acc[s] = 1;
        /* live: can reach acceptance (fixpoint; DFAs here are small) */
        live = osp_calloc(OSP_POOL_MISC, ns);
        memcpy(live, acc, ns);
        for (int changed = 1; changed;) {
            changed = 0;
            for (int32_t s = ns - 1; s >= 1; s--) {
                if (live[s]) continue;
                for (int32_t c = 0; c < ncls; c++)
                    if (live[next[s * ncls + c]]) { live[s] = 1, changed = 1; break; }
            }
        }
        /* renumber: 0 dead, 1 start (kept even when dead), then live states */
        int32_t *ren = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * ns);
        int32_t m = 2;
        ren[0] = 0, ren[1] = 1;
        for (int32_t s = 2; s < ns; s++) ren[s] = live[s] ? m++ : 0;
        out->ncls = ncls;
        out->nstates = m;
        memcpy(out->cls, cls, 256);
        out->next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * m * ncls);
        out->accept = osp_calloc(OSP_POOL_MISC, m);
        for (int32_t s = 1; s < ns; s++) {
            if (s > 1 && !live[s]) continue;
            int32_t d = ren[s];
            out->accept[d] = acc[s];
            if (!live[s]) continue;
            for (int32_t c = 0; c < ncls; c++) {
                int32_t t = next[s * ncls + c];
                out->next[d * ncls + c] = live[t] ? ren[t] : 0;
            }
        }
        osp_free(ren);
    }
    osp_free(acc), osp_free(live);
    osp_free(next), osp_free(tmp), osp_free(b.hslot), osp_free(b.loff), osp_free(b.lists), osp_free(b.stack),
        osp_free(b.stamp);
    osp_free(b.rtmp), osp_free(set_cm), osp_free(bk_off), osp_free(bk);
    return st;
}

void gr_dfa_free(gr_dfa *d) {
    if (!d) return;
    osp_free(d->next), osp_free(d->accept), osp_free(d->base_st), osp_free(d->on_trie);
    if (d->base) gr_dfa_free(d->base), osp_free(d->base);
    d->next = NULL, d->accept = NULL, d->base = NULL, d->base_st = NULL, d->on_trie = NULL;
}

/* A search (an end left open) needs only the minimum of a repetition at that end: a text holds a match of A X{m,n}
 * somewhere iff it holds one of A X{m} (a match's first m copies are one, and the open end takes the rest), and
 * likewise X{m,n} B. Unbounded counts at an open end are what made ".{0,500}" cost seconds of subset construction. */
static void open_end_min(rnode *ns, int32_t r, int last) {
    while (r >= 0 && ns[r].kind == R_CAT) r = last ? ns[r].b : ns[r].a;
    if (r >= 0 && ns[r].kind == R_REP) ns[r].max = ns[r].min;
}

osp_status gr_regex_dfa(const char *re, size_t len, int mode, gr_dfa *out) {
    memset(out, 0, sizeof *out);
    rparse p = {re, len, 0, mode & 3, (mode & GR_RE_ALLESC) != 0, (mode & GR_RE_UTF8) != 0, 0, 0, NULL, 0, 0, OSP_OK};
    int anch_s = 0, anch_e = 0;
    if (p.n && re[0] == '^') anch_s = 1, p.i = 1;
    if (p.n > p.i && re[p.n - 1] == '$') { /* not an escaped '$': an even run of backslashes before it */
        size_t k = 0;
        while (k + 1 < p.n && re[p.n - 2 - k] == '\\') k++;
        if (k % 2 == 0) anch_e = 1, p.n--;
    }
    int32_t root = parse_alt(&p);
    if (!p.st && p.i < p.n) fail(&p, "unbalanced )");
    if (!p.st && (mode & 3) == GR_RE_JSONBODY) {
        if (!anch_s || !anch_e) fail(&p, "a string body's regex must be anchored");
        if (mode & GR_RE_OPEN) root = mk_cat(&p, mk_range(&p, '"', '"'), root);
        if (mode & GR_RE_CLOSE) root = mk_cat(&p, root, mk_range(&p, '"', '"'));
    }
    if (!p.st && (mode & ~(GR_RE_ALLESC | GR_RE_UTF8)) == GR_RE_JSONSTR) {
        cclass any = {{~0ull, ~0ull}, 1};
        int32_t star = mk_rep(&p, json_class(&p, &any), 0, -1);
        if (!p.st && !anch_s) open_end_min(p.nodes, root, 0);
        if (!p.st && !anch_e) open_end_min(p.nodes, root, 1);
        if (!anch_s) root = mk_cat(&p, star, root);
        if (!anch_e) root = mk_cat(&p, root, star);
        root = mk_cat(&p, mk_range(&p, '"', '"'), mk_cat(&p, root, mk_range(&p, '"', '"')));
    }
    if (!p.st && root < 0) root = mk(&p, R_EMPTY, 0, 0);
    osp_status st = p.st;
    if (!st) {
        nfa f = {0};
        int32_t match = nfa_new(&f, N_MATCH, -1, -1);
        int32_t start = build(&f, p.nodes, root, match);
        st = f.err ? f.err : nfa_to_dfa(&f, start, out);
        osp_free(f.st), osp_free(f.sets);
    }
    osp_free(p.nodes);
    return st;
}

/* d minus a finite set of words: the product of d with the words' trie. */
osp_status gr_dfa_minus_words(gr_dfa *d, char *const *words, const size_t *lens, int n) {
    /* trie of words over bytes: node k has kids in a flat table [k*256] */
    size_t total = 1;
    for (int i = 0; i < n; i++) total += lens[i];
    if (total > 20000) return osp_err(OSP_ERR_UNSUPPORTED, "too many excluded property names");
    int32_t *kid = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * total * 256);
    uint8_t *end = osp_calloc(OSP_POOL_MISC, total);
    memset(kid, -1, sizeof(int32_t) * total * 256);
    int32_t nn = 1;
    for (int i = 0; i < n; i++) {
        int32_t k = 0;
        for (size_t j = 0; j < lens[i]; j++) {
            uint8_t c = (uint8_t)words[i][j];
            if (kid[k * 256 + c] < 0) kid[k * 256 + c] = nn++;
            k = kid[k * 256 + c];
        }
        end[k] = 1;
    }
    /* product states (s, k) with k = -1 off the trie; BFS */
    int32_t cap = 1024, ns = 2;
    int32_t *ps = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap), *pk = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap);
    /* states: 0 dead, 1 = (1, root) */
    ps[0] = 0, pk[0] = -1, ps[1] = 1, pk[1] = 0;
    uint32_t hm = 65535;
    int32_t *hs = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (hm + 1));
    memset(hs, -1, sizeof(int32_t) * (hm + 1));
    int32_t ncap = 1024;
    int32_t *next = NULL;
    osp_status st = OSP_OK;
    /* classes: the base's, with every byte that occurs in a word on its own */
    uint8_t inword[256] = {0}, cls2[256], rep2[256];
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < lens[i]; j++) inword[(uint8_t)words[i][j]] = 1;
    int16_t map2[512];
    memset(map2, -1, sizeof map2);
    int32_t nc2 = 0;
    for (int c = 0; c < 256; c++) {
        int key = inword[c] ? 256 + c : d->cls[c];
        if (map2[key] < 0) map2[key] = (int16_t)nc2, rep2[nc2] = (uint8_t)c, nc2++;
        cls2[c] = (uint8_t)map2[key];
    }
    next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)ncap * nc2);
    for (int32_t s = 1; s < ns && !st; s++) {
        for (int32_t cc = 0; cc < nc2; cc++) {
            int c = rep2[cc];
            int32_t ds = gr_dfa_next(d, ps[s], (uint8_t)c);
            if (!ds) continue;
            int32_t k = pk[s] >= 0 ? kid[pk[s] * 256 + c] : -1;
            uint32_t h = ((uint32_t)ds * 2654435761u ^ (uint32_t)(k + 1) * 40503u) & hm;
            int32_t t = -1;
            for (;; h = (h + 1) & hm) {
                if (hs[h] < 0) break;
                if (ps[hs[h]] == ds && pk[hs[h]] == k) { t = hs[h]; break; }
            }
            if (t < 0) {
                if (ns >= GR_MAX_DFA_STATES || ns > (int32_t)hm / 2) { st = osp_err(OSP_ERR_UNSUPPORTED, "property-name exclusion too large"); break; }
                if (ns == cap) {
                    cap *= 2;
                    int32_t *a = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap), *bb = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap);
                    memcpy(a, ps, sizeof(int32_t) * ns), memcpy(bb, pk, sizeof(int32_t) * ns);
                    osp_free(ps), osp_free(pk);
                    ps = a, pk = bb;
                }
                t = ns++;
                ps[t] = ds, pk[t] = k, hs[h] = t;
            }
            if (s >= ncap) {
                int32_t nc2x = ncap * 2;
                while (nc2x <= s) nc2x *= 2;
                int32_t *nx = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)nc2x * nc2);
                memcpy(nx, next, sizeof(int32_t) * (size_t)ncap * nc2);
                osp_free(next);
                next = nx, ncap = nc2x;
            }
            next[s * nc2 + cc] = t;
        }
    }
    if (!st) {
        gr_dfa r = {0};
        r.ncls = nc2;
        memcpy(r.cls, cls2, 256);
        r.nstates = ns;
        r.next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)ns * nc2);
        r.accept = osp_calloc(OSP_POOL_MISC, ns);
        for (int32_t s = 1; s < ns; s++) {
            if (s < ncap) memcpy(r.next + (size_t)s * nc2, next + (size_t)s * nc2, sizeof(int32_t) * nc2);
            r.accept[s] = d->accept[ps[s]] && !(pk[s] >= 0 && end[pk[s]]);
        }
        /* a state can still always finish: the words are finite and d's live states can reach acceptance
         * by more than one path only sometimes, so prune states that cannot reach acceptance */
        uint8_t *live = osp_calloc(OSP_POOL_MISC, ns);
        memcpy(live, r.accept, ns);
        for (int ch = 1; ch;) {
            ch = 0;
            for (int32_t s = ns - 1; s >= 1; s--)
                if (!live[s])
                    for (int32_t c = 0; c < nc2; c++)
                        if (live[r.next[(size_t)s * nc2 + c]]) { live[s] = 1, ch = 1; break; }
        }
        for (int32_t s = 1; s < ns; s++)
            for (int32_t c = 0; c < nc2; c++)
                if (!live[r.next[(size_t)s * nc2 + c]]) r.next[(size_t)s * nc2 + c] = 0;
        osp_free(live);
        r.base_st = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * ns);
        r.on_trie = osp_calloc(OSP_POOL_MISC, ns);
        for (int32_t s = 0; s < ns; s++) r.base_st[s] = ps[s], r.on_trie[s] = pk[s] >= 0;
        if (d->base) st = osp_err(OSP_ERR_INTERNAL, "minus words twice");
        r.base = osp_malloc(OSP_POOL_MISC, sizeof(gr_dfa));
        *r.base = *d;
        *d = r;
    }
    osp_free(next), osp_free(hs), osp_free(ps), osp_free(pk), osp_free(kid), osp_free(end);
    return st;
}
