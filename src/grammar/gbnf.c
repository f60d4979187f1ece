/* grammar/gbnf: llama.cpp's GBNF (llama-server's `grammar` field) into a
 * grammar.
 *
 * The text: rules `name ::= alternatives`; an alternative is a sequence of
 * "literals" (escapes \n \r \t \\ \" \[ \] \xNN \uNNNN \UNNNNNNNN),
 * [character classes] ([^...] negated, ranges a-z, the same escapes), `.`
 * (any character), rule names, ( groups ) and the postfix operators * + ?
 * {m} {m,} {m,n}; `#` starts a comment. A rule ends at the end of its line
 * unless a group is open or the next line starts with `|`. `root` is the
 * start. Characters are Unicode code points matched as their UTF-8 bytes.
 *
 * Compilation: a rule that is not recursive and refers only to such rules
 * is regular: it becomes one lexeme (a regex over bytes, classes spelled as
 * UTF-8 byte sequences). The other rules become nonterminals; in their
 * sequences, runs of regular items merge into one lexeme, and groups and
 * repetitions that hold a nonterminal become nonterminals of their own
 * (repetition by left recursion, which an Earley parser takes in linear
 * time). A lexeme that can match nothing is a nonterminal of two
 * productions, empty or the lexeme without its empty match, since the
 * parser moves past a lexeme only on a byte.
 *
 * The rule tree (rules.h) and this compilation are shared with Lark's
 * front end (lark.c), whose regex literals are G_RE nodes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/rules.h"

osp_status gb_fail(gb *g, const char *what) {
    if (!g->st) {
        size_t line = 1, col = 1;
        for (size_t k = 0; k < g->i && k < g->n; k++) g->s[k] == '\n' ? (line++, col = 1) : col++;
        g->st = osp_err(OSP_ERR_INVALID, "grammar: %s at line %zu, column %zu", what, line, col);
    }
    return g->st;
}

static void *grow(void *p, size_t have, size_t *cap, size_t need, size_t elt) {
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = osp_malloc(OSP_POOL_MISC, nc * elt);
    if (!q) return NULL;
    if (have) memcpy(q, p, have * elt);
    osp_free(p);
    *cap = nc;
    return q;
}

int32_t gb_node(gb *g, int kind) {
    if (g->st) return -1;
    if (g->n_nodes >= GB_MAX_NODES) return gb_fail(g, "grammar too large"), -1;
    size_t cap = (size_t)g->cap_nodes;
    gnode *nn = grow(g->nodes, (size_t)g->n_nodes, &cap, (size_t)g->n_nodes + 1, sizeof(gnode));
    if (!nn) return g->st = osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    g->nodes = nn, g->cap_nodes = (int32_t)cap;
    gnode *x = &g->nodes[g->n_nodes];
    memset(x, 0, sizeof *x);
    x->kind = kind, x->first = x->next = -1, x->ref = -1;
    return g->n_nodes++;
}

int gb_push_data(gb *g, uint32_t v) {
    size_t cap = g->cap_data;
    uint32_t *nd = grow(g->data, g->n_data, &cap, (size_t)g->n_data + 1, sizeof(uint32_t));
    if (!nd) return g->st = osp_err(OSP_ERR_NOMEM, "out of memory"), 0;
    g->data = nd, g->cap_data = (uint32_t)cap;
    g->data[g->n_data++] = v;
    return 1;
}

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }
static void utf8_enc(uint32_t c, int k, unsigned char *u) {
    if (k == 1) {
        u[0] = (unsigned char)c;
        return;
    }
    for (int j = k - 1; j > 0; j--) u[j] = (unsigned char)(0x80 | (c & 0x3f)), c >>= 6;
    u[0] = (unsigned char)((0xf00 >> k) | c);
}

int gb_push_utf8(gb *g, uint32_t cp) {
    unsigned char u[4];
    const int k = utf8_len(cp);
    utf8_enc(cp, k, u);
    for (int j = 0; j < k; j++)
        if (!gb_push_data(g, u[j])) return 0;
    return 1;
}

/* ---- parsing ---- */

static int peek(const gb *g) { return g->i < g->n ? (uint8_t)g->s[g->i] : -1; }

/* Blanks and comments; newlines too when nl (inside a group, after '|'). */
static void space(gb *g, int nl) {
    while (g->i < g->n) {
        int c = peek(g);
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) g->i++;
        else if (c == '#') {
            while (g->i < g->n && g->s[g->i] != '\n') g->i++;
        } else break;
    }
}

static int name_char(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

int32_t gb_rule_of(gb *g, const char *name, size_t len) {
    for (int32_t r = 0; r < g->n_rules; r++)
        if (strlen(g->rules[r].name) == len && !memcmp(g->rules[r].name, name, len)) return r;
    size_t cap = (size_t)g->cap_rules;
    grule *nr = grow(g->rules, (size_t)g->n_rules, &cap, (size_t)g->n_rules + 1, sizeof(grule));
    char *nm = osp_malloc(OSP_POOL_MISC, len + 1);
    if (!nr || !nm) {
        osp_free(nm);
        if (nr) g->rules = nr, g->cap_rules = (int32_t)cap;
        g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
        return -1;
    }
    g->rules = nr, g->cap_rules = (int32_t)cap;
    memcpy(nm, name, len), nm[len] = 0;
    grule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    r->name = nm, r->body = -1, r->nt = -1, r->index = -1;
    return g->n_rules++;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* One UTF-8 character of the text as a code point (-1: malformed). */
int32_t gb_utf8_char(gb *g) {
    const unsigned char *p = (const unsigned char *)g->s + g->i;
    size_t left = g->n - g->i;
    uint32_t c = p[0];
    int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (k < 0 || (size_t)k >= left) return -1;
    if (k) c &= 0x3f >> k;
    for (int j = 1; j <= k; j++) {
        if ((p[j] & 0xc0) != 0x80) return -1;
        c = c << 6 | (p[j] & 0x3f);
    }
    static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (c < least[k] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return -1;
    g->i += (size_t)k + 1;
    return (int32_t)c;
}

/* A character of a literal or class: an escape or a UTF-8 character. */
static int32_t char_at(gb *g) {
    if (peek(g) != '\\') {
        int32_t c = gb_utf8_char(g);
        if (c < 0) gb_fail(g, "malformed UTF-8");
        return c;
    }
    g->i++;
    int e = peek(g);
    if (e < 0) return gb_fail(g, "a trailing backslash"), -1;
    g->i++;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return e;
    case 'x': case 'u': case 'U': {
        int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = hexval(peek(g));
            if (h < 0) return gb_fail(g, "a bad hex escape"), -1;
            v = v * 16 + (uint32_t)h, g->i++;
        }
        if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return gb_fail(g, "an escape that is no character"), -1;
        return (int32_t)v;
    }
    }
    return gb_fail(g, "an unknown escape"), -1;
}

static int32_t parse_alts(gb *g, int nested);

static int32_t parse_literal(gb *g) {
    int32_t x = gb_node(g, G_LIT);
    if (x < 0) return -1;
    g->nodes[x].off = g->n_data;
    g->i++; /* the quote */
    for (;;) {
        int c = peek(g);
        if (c < 0 || c == '\n') return gb_fail(g, "an unterminated literal"), -1;
        if (c == '"') {
            g->i++;
            break;
        }
        int32_t cp = char_at(g);
        if (cp < 0 || !gb_push_utf8(g, (uint32_t)cp)) return -1;
    }
    g->nodes[x].len = g->n_data - g->nodes[x].off;
    return x;
}

static int32_t parse_class(gb *g) {
    int32_t x = gb_node(g, G_CLASS);
    if (x < 0) return -1;
    g->i++; /* [ */
    if (peek(g) == '^') g->nodes[x].neg = 1, g->i++;
    g->nodes[x].off = g->n_data;
    for (;;) {
        int c = peek(g);
        if (c < 0 || c == '\n') return gb_fail(g, "an unterminated character class"), -1;
        if (c == ']') {
            g->i++;
            break;
        }
        int32_t lo = char_at(g), hi;
        if (lo < 0) return -1;
        hi = lo;
        if (peek(g) == '-' && g->i + 1 < g->n && g->s[g->i + 1] != ']') {
            g->i++;
            if ((hi = char_at(g)) < 0) return -1;
            if (hi < lo) return gb_fail(g, "a range whose end comes before its start"), -1;
        }
        if (!gb_push_data(g, (uint32_t)lo) || !gb_push_data(g, (uint32_t)hi)) return -1;
    }
    g->nodes[x].len = (g->n_data - g->nodes[x].off) / 2;
    return x;
}

static int parse_count(gb *g, int32_t *v) {
    int d = 0;
    int64_t x = 0;
    while (peek(g) >= '0' && peek(g) <= '9') {
        x = x * 10 + (g->s[g->i++] - '0'), d++;
        if (x > GB_MAX_COUNT) return gb_fail(g, "a repetition count over 1000"), 0;
    }
    *v = (int32_t)x;
    return d;
}

/* An item and its postfix operators. */
static int32_t parse_item(gb *g, int nested) {
    int c = peek(g);
    int32_t x;
    if (c == '"') x = parse_literal(g);
    else if (c == '[') x = parse_class(g);
    else if (c == '.') x = gb_node(g, G_ANY), g->i++;
    else if (c == '(') {
        if (++g->depth > GB_MAX_DEPTH) return gb_fail(g, "groups nested too deep"), -1;
        g->i++;
        space(g, 1);
        x = parse_alts(g, 1);
        if (x < 0) return -1;
        if (peek(g) != ')') return gb_fail(g, "a missing ')'"), -1;
        g->i++;
        g->depth--;
    } else if (name_char(c)) {
        size_t a = g->i;
        while (name_char(peek(g))) g->i++;
        int32_t r = gb_rule_of(g, g->s + a, g->i - a);
        if (r < 0) return -1;
        if ((x = gb_node(g, G_REF)) >= 0) g->nodes[x].ref = r;
    } else return gb_fail(g, "an unexpected character"), -1;
    if (x < 0) return -1;
    for (;;) {
        space(g, nested);
        int op = peek(g);
        int32_t min, max;
        if (op == '*') min = 0, max = -1, g->i++;
        else if (op == '+') min = 1, max = -1, g->i++;
        else if (op == '?') min = 0, max = 1, g->i++;
        else if (op == '{') {
            g->i++;
            space(g, nested);
            if (!parse_count(g, &min)) return gb_fail(g, "a bad {m,n}"), -1;
            space(g, nested);
            max = min;
            if (peek(g) == ',') {
                g->i++;
                space(g, nested);
                if (!parse_count(g, &max)) max = -1;
                if (g->st) return -1;
                space(g, nested);
            }
            if (peek(g) != '}') return gb_fail(g, "a bad {m,n}"), -1;
            g->i++;
            if (max >= 0 && max < min) return gb_fail(g, "a {m,n} with n < m"), -1;
        } else return x;
        int32_t r = gb_node(g, G_REP);
        if (r < 0) return -1;
        g->nodes[r].first = x, g->nodes[r].min = min, g->nodes[r].max = max;
        x = r;
    }
}

static int32_t parse_seq(gb *g, int nested) {
    int32_t s = gb_node(g, G_SEQ), last = -1;
    if (s < 0) return -1;
    for (;;) {
        space(g, nested);
        int c = peek(g);
        if (c < 0 || c == '|' || c == ')' || c == '\n') break;
        int32_t x = parse_item(g, nested);
        if (x < 0) return -1;
        if (last < 0) g->nodes[s].first = x;
        else g->nodes[last].next = x;
        last = x;
    }
    return s;
}

static int32_t parse_alts(gb *g, int nested) {
    int32_t a = gb_node(g, G_ALT), last;
    if (a < 0) return -1;
    if ((last = parse_seq(g, nested)) < 0) return -1;
    g->nodes[a].first = last;
    for (;;) {
        /* (at the top level a rule also goes on where its next line starts with '|') */
        size_t save = g->i;
        space(g, 1);
        if (peek(g) != '|') {
            if (!nested) g->i = save;
            return a;
        }
        g->i++;
        space(g, 1);
        int32_t s = parse_seq(g, nested);
        if (s < 0) return -1;
        g->nodes[last].next = s;
        last = s;
    }
}

static void parse_rules(gb *g) {
    for (;;) {
        space(g, 1);
        if (g->i >= g->n || g->st) return;
        size_t a = g->i;
        while (name_char(peek(g))) g->i++;
        if (g->i == a) {
            gb_fail(g, "a rule name expected");
            return;
        }
        int32_t r = gb_rule_of(g, g->s + a, g->i - a);
        if (r < 0) return;
        space(g, 0);
        if (g->i + 3 > g->n || memcmp(g->s + g->i, "::=", 3)) {
            gb_fail(g, "'::=' expected");
            return;
        }
        if (g->rules[r].body >= 0) {
            gb_fail(g, "a rule defined twice");
            return;
        }
        g->i += 3;
        space(g, 0);
        int32_t body = parse_alts(g, 0);
        if (body < 0) return;
        g->rules[r].body = body;
        space(g, 0);
        if (g->i < g->n && peek(g) != '\n') {
            gb_fail(g, "an unexpected character");
            return;
        }
    }
}

/* ---- which rules are regular: Tarjan's strongly connected components ---- */

static int add_refs(gb *g, grule *r, int32_t x) {
    for (; x >= 0; x = g->nodes[x].next) {
        const gnode *n = &g->nodes[x];
        if (n->kind == G_REF) {
            size_t cap = (size_t)r->n_adj; /* (grown one at a time: rules refer to few others) */
            int32_t *na = grow(r->adj, (size_t)r->n_adj, &cap, (size_t)r->n_adj + 1, sizeof(int32_t));
            if (!na) return g->st = osp_err(OSP_ERR_NOMEM, "out of memory"), 0;
            r->adj = na, r->adj[r->n_adj++] = n->ref;
        } else if (n->kind >= G_SEQ && !add_refs(g, r, n->first)) return 0;
    }
    return 1;
}

typedef struct tarjan {
    int32_t *stack, sp, counter;
    int32_t *order, n_order; /* rules as their components complete: what a rule refers to comes first */
} tarjan;

static void strong(gb *g, tarjan *t, int32_t v) {
    grule *R = &g->rules[v];
    R->index = R->low = t->counter++;
    t->stack[t->sp++] = v, R->on_stack = 1;
    for (int32_t k = 0; k < g->rules[v].n_adj; k++) {
        int32_t w = g->rules[v].adj[k];
        grule *W = &g->rules[w];
        if (W->index < 0) {
            strong(g, t, w);
            if (g->rules[w].low < g->rules[v].low) g->rules[v].low = g->rules[w].low;
        } else if (W->on_stack && W->index < g->rules[v].low) g->rules[v].low = W->index;
    }
    R = &g->rules[v];
    if (R->low != R->index) return;
    int32_t top = t->sp;
    while (t->stack[--top] != v) {}
    int cyc = t->sp - top > 1;
    for (int32_t k = 0; k < R->n_adj && !cyc; k++) cyc = R->adj[k] == v;
    for (int32_t k = top; k < t->sp; k++) {
        grule *Q = &g->rules[t->stack[k]];
        Q->on_stack = 0, Q->cyclic = cyc;
        t->order[t->n_order++] = t->stack[k];
    }
    t->sp = top;
}

static void find_regular(gb *g) {
    tarjan t = {0};
    t.stack = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)g->n_rules);
    t.order = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)g->n_rules);
    if (!t.stack || !t.order) g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int32_t r = 0; r < g->n_rules && !g->st; r++) add_refs(g, &g->rules[r], g->rules[r].body);
    for (int32_t r = 0; r < g->n_rules && !g->st; r++)
        if (g->rules[r].index < 0) strong(g, &t, r);
    for (int32_t k = 0; k < t.n_order && !g->st; k++) {
        grule *R = &g->rules[t.order[k]];
        R->regular = !R->cyclic;
        for (int32_t j = 0; j < R->n_adj && R->regular; j++) R->regular = g->rules[R->adj[j]].regular;
    }
    osp_free(t.stack), osp_free(t.order);
}

static int node_regular(const gb *g, int32_t x) {
    const gnode *n = &g->nodes[x];
    if (n->kind == G_REF) return g->rules[n->ref].regular;
    if (n->kind < G_REF) return 1;
    for (int32_t c = n->first; c >= 0; c = g->nodes[c].next)
        if (!node_regular(g, c)) return 0;
    return 1;
}

/* ---- regular parts as regex text over bytes ---- */

static void re_put(gb *g, const char *t, size_t n) {
    if (g->st) return;
    if (g->re_n + n + 1 > GB_MAX_RE) {
        g->st = osp_err(OSP_ERR_UNSUPPORTED, "grammar: a regular part too large (over %d bytes as a regex)", GB_MAX_RE);
        return;
    }
    char *nr = grow(g->re, g->re_n, &g->re_cap, g->re_n + n + 1, 1);
    if (!nr) {
        g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
        return;
    }
    g->re = nr;
    memcpy(g->re + g->re_n, t, n);
    g->re_n += n;
    g->re[g->re_n] = 0;
}
static void re_s(gb *g, const char *t) { re_put(g, t, strlen(t)); }

/* One byte: ASCII letters and digits as themselves, other ASCII as \xNN,
 * the rest raw (the regex takes a byte over 0x7f as itself). */
static void re_byte(gb *g, unsigned b) {
    char t[8];
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b >= 0x80) t[0] = (char)b, t[1] = 0;
    else snprintf(t, sizeof t, "\\x%02x", b);
    re_s(g, t);
}

/* Bytes [lo, hi] at one position. */
static void re_byte_range(gb *g, unsigned lo, unsigned hi) {
    if (lo == hi) return re_byte(g, lo);
    if (hi < 0x80) {
        char t[24];
        snprintf(t, sizeof t, "[\\x%02x-\\x%02x]", lo, hi);
        return re_s(g, t);
    }
    re_s(g, "(");
    for (unsigned b = lo; b <= hi; b++) {
        if (b > lo) re_s(g, "|");
        re_byte(g, b);
    }
    re_s(g, ")");
}


/* Code points [lo, hi] of one encoded length as alternatives of byte-range
 * sequences (each position's bytes free of the others'), "|" before each. */
static void re_utf8_range(gb *g, uint32_t lo, uint32_t hi, int *first) {
    const int k = utf8_len(lo);
    for (int i = 1; i < k; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                re_utf8_range(g, lo, lo | m, first);
                re_utf8_range(g, (lo | m) + 1, hi, first);
                return;
            }
            if ((hi & m) != m) {
                re_utf8_range(g, lo, (hi & ~m) - 1, first);
                re_utf8_range(g, hi & ~m, hi, first);
                return;
            }
        }
    }
    unsigned char a[4], b[4];
    utf8_enc(lo, k, a), utf8_enc(hi, k, b);
    if (!*first) re_s(g, "|");
    *first = 0;
    for (int j = 0; j < k; j++) re_byte_range(g, a[j], b[j]);
}

static int cmp_u32pair(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* A class (pairs [lo, hi] of code points, negated or not; NULL: any
 * character) as an alternation of UTF-8 sequences. */
static void re_class(gb *g, const uint32_t *pairs, uint32_t n, int neg) {
    uint32_t *r = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * 2 * ((size_t)n + 4));
    if (!r) {
        g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
        return;
    }
    uint32_t m = 0;
    if (pairs) {
        memcpy(r, pairs, sizeof(uint32_t) * 2 * n);
        qsort(r, n, 2 * sizeof(uint32_t), cmp_u32pair);
        for (uint32_t k = 0; k < n; k++) { /* merge */
            if (m && r[2 * k] <= r[2 * m - 1] + 1) {
                if (r[2 * k + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * k + 1];
            } else r[2 * m] = r[2 * k], r[2 * m + 1] = r[2 * k + 1], m++;
        }
    }
    if (!pairs || neg) { /* the complement within the characters */
        uint32_t *c = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * 2 * ((size_t)m + 2));
        uint32_t nc = 0, at = 0;
        for (uint32_t k = 0; c && k <= m; k++) {
            uint32_t end = k < m ? r[2 * k] : 0x110000;
            if (end > at) c[2 * nc] = at, c[2 * nc + 1] = end - 1, nc++;
            if (k < m) at = r[2 * k + 1] + 1;
        }
        osp_free(r);
        if (!c) {
            g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
            return;
        }
        r = c, m = nc;
    }
    int first = 1;
    re_s(g, "(");
    static const uint32_t cut[][2] = {{0, 0x7f}, {0x80, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xffff}, {0x10000, 0x10ffff}};
    for (uint32_t k = 0; k < m; k++)
        for (int j = 0; j < 5; j++) {
            uint32_t lo = r[2 * k] > cut[j][0] ? r[2 * k] : cut[j][0], hi = r[2 * k + 1] < cut[j][1] ? r[2 * k + 1] : cut[j][1];
            if (lo <= hi) re_utf8_range(g, lo, hi, &first);
        }
    if (first && !g->st) g->st = osp_err(OSP_ERR_INVALID, "grammar: a character class that matches no character");
    re_s(g, ")");
    osp_free(r);
}

static void re_node(gb *g, int32_t x, int depth);

static void re_group(gb *g, int32_t x, int depth) {
    re_s(g, "(");
    re_node(g, x, depth);
    re_s(g, ")");
}

static void re_node(gb *g, int32_t x, int depth) {
    if (g->st) return;
    if (depth > GB_MAX_DEPTH + GB_MAX_RULES) {
        g->st = osp_err(OSP_ERR_UNSUPPORTED, "grammar: rules nested too deep");
        return;
    }
    const gnode *n = &g->nodes[x];
    switch (n->kind) {
    case G_LIT:
        for (uint32_t k = 0; k < n->len; k++) {
            unsigned b = g->data[n->off + k];
            if ((n->flags & GB_ICASE) && ((b | 0x20) >= 'a' && (b | 0x20) <= 'z')) {
                char t[5] = {'[', (char)(b | 0x20), (char)(b & ~0x20u), ']', 0};
                re_s(g, t);
            } else re_byte(g, b);
        }
        return;
    case G_RE: {
        re_s(g, n->flags == (GB_ICASE | GB_DOTALL) ? "(?is:" : n->flags == GB_ICASE ? "(?i:" : n->flags ? "(?s:" : "(");
        char t[64];
        for (uint32_t k = 0; k < n->len && !g->st;) {
            uint32_t m = 0;
            while (m < sizeof t && k < n->len) t[m++] = (char)g->data[n->off + k++];
            re_put(g, t, m);
        }
        return re_s(g, ")");
    }
    case G_CLASS: return re_class(g, g->data + n->off, n->len, n->neg);
    case G_ANY: return re_class(g, NULL, 0, 0);
    case G_REF: return re_group(g, g->rules[n->ref].body, depth + 1);
    case G_SEQ:
        for (int32_t c = n->first; c >= 0 && !g->st; c = g->nodes[c].next) re_group(g, c, depth + 1);
        return;
    case G_ALT:
        for (int32_t c = n->first; c >= 0 && !g->st; c = g->nodes[c].next) {
            if (c != n->first) re_s(g, "|");
            re_group(g, c, depth + 1);
        }
        return;
    case G_REP: {
        re_group(g, n->first, depth + 1);
        char t[32];
        if (n->min == 0 && n->max < 0) snprintf(t, sizeof t, "*");
        else if (n->min == 1 && n->max < 0) snprintf(t, sizeof t, "+");
        else if (n->min == 0 && n->max == 1) snprintf(t, sizeof t, "?");
        else if (n->max < 0) snprintf(t, sizeof t, "{%d,}", n->min);
        else snprintf(t, sizeof t, "{%d,%d}", n->min, n->max);
        return re_s(g, t);
    }
    }
}

/* ---- the grammar ---- */

#define GB_NONE INT32_MIN /* a lexeme that matches only the empty text: no symbol */

/* A DFA without its empty match: a new start state with the old one's
 * moves, not accepting (the old start, entered again later, keeps its). */
static osp_status drop_empty(gr_dfa *d) {
    const int32_t n = d->nstates, nc = d->ncls;
    int32_t *next = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)(n + 1) * (size_t)nc);
    uint8_t *acc = osp_malloc(OSP_POOL_MISC, (size_t)n + 1);
    if (!next || !acc) {
        osp_free(next), osp_free(acc);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    memcpy(next, d->next, sizeof(int32_t) * (size_t)n * (size_t)nc);
    memcpy(acc, d->accept, (size_t)n);
    memcpy(next + (size_t)n * nc, d->next + nc, sizeof(int32_t) * (size_t)nc); /* state n: the old start */
    acc[n] = acc[1];
    for (size_t k = 0; k < (size_t)(n + 1) * (size_t)nc; k++)
        if (next[k] == 1) next[k] = n;
    acc[1] = 0;
    osp_free(d->next), osp_free(d->accept);
    d->next = next, d->accept = acc, d->nstates = n + 1;
    return OSP_OK;
}

/* The symbol for the regex in g->re (GB_NONE when it matches only the
 * empty text); one per distinct regex. */
static int32_t lexeme(gb *g) {
    if (g->st || !g->re_n) return GB_NONE;
    for (int32_t k = 0; k < g->n_lex; k++)
        if (!strcmp(g->lex_key[k], g->re)) return g->lex_sym[k];
    gr_dfa d;
    if (g->json) { /* the text as a JSON string's body: ^( ... )$ */
        char *a = osp_malloc(OSP_POOL_MISC, g->re_n + 5);
        if (!a) return g->st = osp_err(OSP_ERR_NOMEM, "out of memory"), GB_NONE;
        memcpy(a, "^(", 2), memcpy(a + 2, g->re, g->re_n), memcpy(a + 2 + g->re_n, ")$", 3);
        g->st = gr_regex_dfa(a, g->re_n + 4, GR_RE_JSONBODY, &d);
        osp_free(a);
    } else g->st = gr_regex_dfa(g->re, g->re_n, GR_RE_PLAIN | GR_RE_UTF8, &d);
    if (g->st) return GB_NONE;
    int live = 0;
    for (int32_t c = 0; c < d.ncls && !live; c++) live = d.next[d.ncls + c] != 0;
    int32_t sym = GB_NONE;
    if (!live) gr_dfa_free(&d); /* only the empty text (or nothing: the finish drops it) */
    else if (!d.accept[1]) g->st = gr_b_dfa(&g->b, &d, &sym);
    else { /* nullable: N -> (nothing) | the lexeme without its empty match */
        int32_t t = 0;
        if ((g->st = drop_empty(&d))) gr_dfa_free(&d);
        else if (!(g->st = gr_b_dfa(&g->b, &d, &t))) {
            sym = gr_b_nt(&g->b);
            if (!(g->st = gr_b_prod(&g->b, sym, NULL, 0))) g->st = gr_b_prod(&g->b, sym, &t, 1);
        }
    }
    size_t cap = (size_t)g->cap_lex, cap2 = (size_t)g->cap_lex;
    char *key = osp_malloc(OSP_POOL_MISC, g->re_n + 1);
    char **nk = grow(g->lex_key, (size_t)g->n_lex, &cap, (size_t)g->n_lex + 1, sizeof(char *));
    if (nk) g->lex_key = nk;
    int32_t *ns = grow(g->lex_sym, (size_t)g->n_lex, &cap2, (size_t)g->n_lex + 1, sizeof(int32_t));
    if (ns) g->lex_sym = ns;
    if (!key || !nk || !ns || cap != cap2) {
        osp_free(key);
        if (!g->st) g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
        return GB_NONE;
    }
    g->cap_lex = (int32_t)cap;
    memcpy(key, g->re, g->re_n + 1);
    g->lex_key[g->n_lex] = key, g->lex_sym[g->n_lex++] = sym;
    return sym;
}

typedef struct symlist {
    int32_t *v;
    size_t n, cap;
} symlist;

static void sl_push(gb *g, symlist *l, int32_t s) {
    if (g->st || s == GB_NONE) return;
    int32_t *nv = grow(l->v, l->n, &l->cap, l->n + 1, sizeof(int32_t));
    if (!nv) {
        g->st = osp_err(OSP_ERR_NOMEM, "out of memory");
        return;
    }
    l->v = nv, l->v[l->n++] = s;
}

static int32_t sym_of(gb *g, int32_t x, int depth);

/* A sequence's symbols: runs of regular items as one lexeme. */
static void seq_syms(gb *g, int32_t seq, symlist *out, int depth) {
    g->re_n = 0;
    if (g->re) g->re[0] = 0;
    for (int32_t c = g->nodes[seq].first; c >= 0 && !g->st; c = g->nodes[c].next) {
        if (node_regular(g, c)) {
            re_group(g, c, 0);
            continue;
        }
        if (g->re_n) sl_push(g, out, lexeme(g));
        g->re_n = 0;
        if (g->re) g->re[0] = 0;
        sl_push(g, out, sym_of(g, c, depth + 1));
        g->re_n = 0; /* (sym_of wrote regexes of its own) */
        if (g->re) g->re[0] = 0;
    }
    if (g->re_n) sl_push(g, out, lexeme(g));
    g->re_n = 0;
}

/* Productions lhs -> each alternative of alt. */
static void alt_prods(gb *g, int32_t lhs, int32_t alt, int depth) {
    for (int32_t s = g->nodes[alt].first; s >= 0 && !g->st; s = g->nodes[s].next) {
        symlist l = {0};
        seq_syms(g, s, &l, depth);
        if (!g->st) g->st = gr_b_prod(&g->b, lhs, l.v, (uint32_t)l.n);
        osp_free(l.v);
    }
}

/* The symbol of a part that is not regular. */
static int32_t sym_of(gb *g, int32_t x, int depth) {
    if (g->st) return GB_NONE;
    if (depth > GB_MAX_DEPTH * 2) return g->st = osp_err(OSP_ERR_UNSUPPORTED, "grammar: groups nested too deep"), GB_NONE;
    const gnode *n = &g->nodes[x];
    if (n->kind == G_REF) return g->rules[n->ref].nt;
    int32_t nt = gr_b_nt(&g->b);
    if (n->kind == G_ALT) alt_prods(g, nt, x, depth);
    else if (n->kind == G_SEQ) {
        symlist l = {0};
        seq_syms(g, x, &l, depth);
        if (!g->st) g->st = gr_b_prod(&g->b, nt, l.v, (uint32_t)l.n);
        osp_free(l.v);
    } else { /* G_REP of a part that is not regular: nt -> X^min tail */
        const int32_t min = n->min, max = n->max, item = n->first;
        int32_t xs = node_regular(g, item) ? GB_NONE : sym_of(g, item, depth + 1);
        if (g->st || xs == GB_NONE) return GB_NONE;
        int32_t tail = GB_NONE;
        if (max < 0) { /* tail -> (nothing) | tail X */
            tail = gr_b_nt(&g->b);
            int32_t two[2] = {tail, xs};
            if (!(g->st = gr_b_prod(&g->b, tail, NULL, 0))) g->st = gr_b_prod(&g->b, tail, two, 2);
        } else
            for (int32_t k = 0; k < max - min && !g->st; k++) { /* opt_k -> (nothing) | X opt_(k-1) */
                int32_t o = gr_b_nt(&g->b), two[2] = {xs, tail};
                if (!(g->st = gr_b_prod(&g->b, o, NULL, 0))) g->st = gr_b_prod(&g->b, o, two, tail == GB_NONE ? 1 : 2);
                tail = o;
            }
        symlist l = {0};
        for (int32_t k = 0; k < min; k++) sl_push(g, &l, xs);
        sl_push(g, &l, tail);
        if (!g->st) g->st = gr_b_prod(&g->b, nt, l.v, (uint32_t)l.n);
        osp_free(l.v);
    }
    return g->st ? GB_NONE : nt;
}

void gb_free(gb *g) {
    for (int32_t r = 0; r < g->n_rules; r++) osp_free(g->rules[r].name), osp_free(g->rules[r].adj);
    for (int32_t k = 0; k < g->n_lex; k++) osp_free(g->lex_key[k]);
    osp_free(g->rules), osp_free(g->nodes), osp_free(g->data), osp_free(g->lex_key), osp_free(g->lex_sym);
    osp_free(g->re);
    gr_b_free(&g->b);
}

osp_status gb_compile(gb *g, const char *start_name, const char *prefix, osp_grammar **out) {
    int32_t root = -1;
    for (int32_t r = 0; r < g->n_rules && !g->st; r++) {
        if (g->rules[r].body < 0)
            g->st = osp_err(OSP_ERR_INVALID, "grammar: rule '%.60s' is used but not defined", g->rules[r].name);
        if (!strcmp(g->rules[r].name, start_name)) root = r;
    }
    if (!g->st && root < 0) g->st = osp_err(OSP_ERR_INVALID, "grammar: no '%s' rule", start_name);
    if (!g->st && g->n_rules > GB_MAX_RULES) g->st = osp_err(OSP_ERR_UNSUPPORTED, "grammar: over %d rules", GB_MAX_RULES);
    if (!g->st) find_regular(g);
    for (int32_t r = 0; r < g->n_rules && !g->st; r++)
        if (!g->rules[r].regular) g->rules[r].nt = gr_b_nt(&g->b);
    for (int32_t r = 0; r < g->n_rules && !g->st; r++)
        if (!g->rules[r].regular) alt_prods(g, g->rules[r].nt, g->rules[r].body, 0);
    int32_t start = -1;
    if (!g->st) {
        if (!g->rules[root].regular) start = g->rules[root].nt;
        else {
            start = gr_b_nt(&g->b);
            g->re_n = 0;
            re_node(g, g->rules[root].body, 0);
            int32_t s = lexeme(g);
            if (!g->st) {
                /* (a nullable lexeme is a nonterminal already) */
                g->st = s == GB_NONE ? gr_b_prod(&g->b, start, NULL, 0) : gr_b_prod(&g->b, start, &s, 1);
            }
        }
    }
    if (!g->st && prefix && *prefix) { /* start -> the prefix's bytes, then root */
        int32_t two[2], s2 = gr_b_nt(&g->b);
        g->st = gr_b_lit(&g->b, prefix, strlen(prefix), &two[0]);
        two[1] = start;
        if (!g->st) g->st = gr_b_prod(&g->b, s2, two, 2);
        start = s2;
    }
    if (!g->st) g->st = gr_b_finish(&g->b, start, out);
    return g->st;
}

osp_status osp_grammar_from_gbnf(const char *text, size_t len, const char *prefix, osp_grammar **out) {
    *out = NULL;
    if (len > GB_MAX_TEXT) return osp_err(OSP_ERR_INVALID, "grammar: over %d bytes", GB_MAX_TEXT);
    gb g;
    memset(&g, 0, sizeof g);
    g.s = text, g.n = len;
    gr_b_init(&g.b);
    parse_rules(&g);
    osp_status st = g.st ? g.st : gb_compile(&g, "root", prefix, out);
    gb_free(&g);
    return st;
}
