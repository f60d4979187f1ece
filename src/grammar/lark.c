/* grammar/lark: the Lark subset of OpenAI's custom-tool grammars (and
 * llguidance's) into a grammar.
 *
 * The text: definitions `name: alternatives` (a lowercase name: a rule; an
 * uppercase one: a terminal; `?` and `!` before a rule's name and `-> name`
 * after an alternative shape Lark's tree only and are read past). An
 * alternative is a sequence of "strings" (Python escapes; `"..."i` either
 * case), /regexes/ (flags i and s), ranges "a".."z", names, ( groups ),
 * [ optional parts ] and the postfix operators ? * + ~ n, ~ n..m, {n},
 * {n,}, {n,m}. `//` starts a comment. A definition ends at the end of its
 * line unless a group is open or the next line starts with `|`.
 * Statements: `%ignore` (its terminals may come before any terminal of a
 * rule and at the end), `%import common.NAME [-> NEW]` and
 * `%import common (NAME, ...)`. `start` is the start.
 *
 * Refused, each an error naming it: templates, priorities, %declare,
 * %override, %extend, other imports, llguidance's extensions (%json,
 * %llguidance, special tokens, @references, &), a
 * terminal that refers to a rule.
 *
 * It parses into the rule tree of rules.h and compiles as GBNF does (a
 * regex literal is a G_RE node). Lark's own lexer takes the longest match
 * among terminals; here terminals are matched as a context-free grammar
 * reads them, so a text is accepted when some split of it into terminals
 * derives from `start` (the same for every grammar whose terminals do not
 * compete for the same text).
 *
 * OSP_GRAMMAR_JSON_STRING: every lexeme matches the JSON string spelling
 * of its text (escapes for '"', '\\' and control characters), for a tool's
 * input that travels inside a JSON string. */
#include <stdio.h>
#include <string.h>
#include "grammar/rules.h"

typedef struct lk {
    gb g;
    const char *ns;   /* the prefix of names in the text being read ("common." in the common library) */
    int32_t ignore;   /* the rule of the %ignore'd terminals, -1 */
    int common;       /* the common library is read */
} lk;

/* Lark's common terminals (its common.lark), in the subset: the language
 * of each; ESCAPED_STRING and C_COMMENT as plain regular expressions. */
static const char COMMON[] =
    "DIGIT: \"0\"..\"9\"\n"
    "HEXDIGIT: \"a\"..\"f\" | \"A\"..\"F\" | DIGIT\n"
    "INT: DIGIT+\n"
    "SIGNED_INT: [\"+\" | \"-\"] INT\n"
    "DECIMAL: INT \".\" INT? | \".\" INT\n"
    "_EXP: (\"e\" | \"E\") SIGNED_INT\n"
    "FLOAT: INT _EXP | DECIMAL _EXP?\n"
    "SIGNED_FLOAT: [\"+\" | \"-\"] FLOAT\n"
    "NUMBER: FLOAT | INT\n"
    "SIGNED_NUMBER: [\"+\" | \"-\"] NUMBER\n"
    "ESCAPED_STRING: /\"([^\"\\\\\\n]|\\\\[^\\n])*\"/\n"
    "LCASE_LETTER: \"a\"..\"z\"\n"
    "UCASE_LETTER: \"A\"..\"Z\"\n"
    "LETTER: UCASE_LETTER | LCASE_LETTER\n"
    "WORD: LETTER+\n"
    "CNAME: (\"_\" | LETTER) (\"_\" | LETTER | DIGIT)*\n"
    "WS_INLINE: (\" \" | /\\t/)+\n"
    "WS: /[ \\t\\f\\r\\n]/+\n"
    "CR: /\\r/\n"
    "LF: /\\n/\n"
    "NEWLINE: (CR? LF)+\n"
    "SH_COMMENT: /#[^\\n]*/\n"
    "CPP_COMMENT: /\\/\\/[^\\n]*/\n"
    "C_COMMENT: /\\/\\*([^*]|\\*+[^*\\/])*\\*+\\//\n"
    "SQL_COMMENT: /--[^\\n]*/\n";

static int peek(const lk *l) { return l->g.i < l->g.n ? (uint8_t)l->g.s[l->g.i] : -1; }
static int at(const lk *l, const char *t) {
    size_t k = strlen(t);
    return l->g.i + k <= l->g.n && !memcmp(l->g.s + l->g.i, t, k);
}
static osp_status lfail(lk *l, const char *what) { return gb_fail(&l->g, what); }

/* Blanks and comments; newlines too when nl. */
static void space(lk *l, int nl) {
    while (l->g.i < l->g.n) {
        int c = peek(l);
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) l->g.i++;
        else if (at(l, "//")) {
            while (l->g.i < l->g.n && l->g.s[l->g.i] != '\n') l->g.i++;
        } else break;
    }
}

static int name_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int name_char(int c) { return name_start(c) || (c >= '0' && c <= '9'); }

/* A terminal's name: uppercase after the namespace and underscores (the
 * rules made here, "%ignore", count as terminals). */
static int is_terminal(const char *name) {
    if (name[0] == '%') return 1;
    if (!strncmp(name, "common.", 7)) name += 7;
    while (*name == '_') name++;
    return *name >= 'A' && *name <= 'Z';
}

/* The rule named by the name at the cursor (in the current namespace). */
static int32_t name_rule(lk *l, size_t *len_out) {
    size_t a = l->g.i;
    while (name_char(peek(l))) l->g.i++;
    size_t n = l->g.i - a, pn = strlen(l->ns);
    if (len_out) *len_out = n;
    char buf[160];
    if (n + pn >= sizeof buf) return lfail(l, "a name over 150 characters"), -1;
    if (l->g.n_rules > GB_MAX_RULES + 64) return lfail(l, "over 4096 names"), -1; /* (the lookup is linear) */
    memcpy(buf, l->ns, pn), memcpy(buf + pn, l->g.s + a, n);
    return gb_rule_of(&l->g, buf, pn + n);
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* A character of a string: a Python escape or a UTF-8 character. */
static int32_t str_char(lk *l) {
    if (peek(l) != '\\') {
        int32_t c = gb_utf8_char(&l->g);
        if (c < 0) lfail(l, "malformed UTF-8");
        return c;
    }
    l->g.i++;
    int e = peek(l);
    if (e < 0) return lfail(l, "a trailing backslash"), -1;
    l->g.i++;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'b': return '\b';
    case 'a': return '\a';
    case '0': return 0;
    case '\\': case '"': case '\'': return e;
    case 'x': case 'u': case 'U': {
        int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++) {
            int h = hexval(peek(l));
            if (h < 0) return lfail(l, "a bad hex escape in a string"), -1;
            v = v * 16 + (uint32_t)h, l->g.i++;
        }
        if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return lfail(l, "an escape that is no character"), -1;
        return (int32_t)v;
    }
    }
    return lfail(l, "an unknown escape in a string"), -1;
}

/* A "string" (its node); *single: its one code point, or -1. */
static int32_t parse_string(lk *l, int32_t *single) {
    gb *g = &l->g;
    int32_t x = gb_node(g, G_LIT), count = 0;
    if (x < 0) return -1;
    g->nodes[x].off = g->n_data;
    g->i++; /* the quote */
    *single = -1;
    for (;;) {
        int c = peek(l);
        if (c < 0 || c == '\n') return lfail(l, "an unterminated string"), -1;
        if (c == '"') {
            g->i++;
            break;
        }
        int32_t cp = str_char(l);
        if (cp < 0) return -1;
        *single = count++ ? -1 : cp;
        if (!gb_push_utf8(g, (uint32_t)cp)) return -1;
    }
    g->nodes[x].len = g->n_data - g->nodes[x].off;
    if (peek(l) == 'i' && !(g->i + 1 < g->n && name_char((uint8_t)g->s[g->i + 1]))) g->nodes[x].flags = GB_ICASE, g->i++;
    if (count != 1) *single = -1;
    return x;
}

/* A /regex/ with its flags; checked on its own so a bad one is named. */
static int32_t parse_regex(lk *l) {
    gb *g = &l->g;
    size_t start = g->i;
    int32_t x = gb_node(g, G_RE);
    if (x < 0) return -1;
    g->nodes[x].off = g->n_data;
    g->i++;
    for (;;) {
        int c = peek(l);
        if (c < 0 || c == '\n') return g->i = start, lfail(l, "an unterminated regex"), -1;
        g->i++;
        if (c == '/') break;
        if (!gb_push_data(g, (uint32_t)c)) return -1;
        if (c == '\\') {
            int d = peek(l);
            if (d < 0 || d == '\n') return g->i = start, lfail(l, "an unterminated regex"), -1;
            if (!gb_push_data(g, (uint32_t)d)) return -1;
            g->i++;
        }
    }
    g->nodes[x].len = g->n_data - g->nodes[x].off;
    while (name_char(peek(l))) {
        int f = peek(l);
        if (f == 'i') g->nodes[x].flags |= GB_ICASE;
        else if (f == 's') g->nodes[x].flags |= GB_DOTALL;
        else {
            char what[64];
            snprintf(what, sizeof what, "the regex flag '%c' (only i and s are supported)", f);
            return lfail(l, what), -1;
        }
        g->i++;
    }
    /* the regex by itself, in the flags' group */
    const gnode *n = &g->nodes[x];
    size_t len = n->len;
    char *re = osp_malloc(OSP_POOL_MISC, len + 8);
    if (!re) return g->st = osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    size_t k = 0;
    const char *open = n->flags == (GB_ICASE | GB_DOTALL) ? "(?is:" : n->flags == GB_ICASE ? "(?i:" : n->flags ? "(?s:" : "(";
    memcpy(re, open, strlen(open)), k = strlen(open);
    for (size_t j = 0; j < len; j++) re[k++] = (char)g->data[n->off + j];
    re[k++] = ')';
    gr_dfa d;
    osp_status st = gr_regex_dfa(re, k, GR_RE_PLAIN | GR_RE_UTF8, &d);
    osp_free(re);
    if (st) {
        char why[300];
        snprintf(why, sizeof why, "a regex it cannot take (%s)", osp_last_error());
        g->i = start;
        return lfail(l, why), -1;
    }
    gr_dfa_free(&d);
    return x;
}

static int parse_count(lk *l, int32_t *v) {
    int d = 0;
    int64_t x = 0;
    while (peek(l) >= '0' && peek(l) <= '9') {
        x = x * 10 + (l->g.s[l->g.i++] - '0'), d++;
        if (x > GB_MAX_COUNT) return lfail(l, "a repetition count over 1000"), 0;
    }
    *v = (int32_t)x;
    return d;
}

static int32_t parse_alts(lk *l, int nested);

static int32_t group(lk *l, char close) {
    gb *g = &l->g;
    if (++g->depth > GB_MAX_DEPTH) return lfail(l, "groups nested too deep"), -1;
    g->i++;
    space(l, 1);
    int32_t x = parse_alts(l, 1);
    if (x < 0) return -1;
    if (peek(l) != close) return lfail(l, close == ')' ? "a missing ')'" : "a missing ']'"), -1;
    g->i++;
    g->depth--;
    return x;
}

static int32_t rep(lk *l, int32_t x, int32_t min, int32_t max) {
    int32_t r = gb_node(&l->g, G_REP);
    if (r < 0) return -1;
    l->g.nodes[r].first = x, l->g.nodes[r].min = min, l->g.nodes[r].max = max;
    return r;
}

/* What an unsupported construct starting with c is called (NULL: none known). */
static const char *refused(lk *l, int c) {
    if (c == '<') return "special tokens (<...>) are not supported";
    if (c == '@') return "grammar references (@...) are not supported";
    if (c == '&') return "'&' (the intersection of terminals) is not supported";
    if (c == '%') return "a '%' directive inside an expression (%json and the like) is not supported";
    if (c == '#') return "'#' comments are not Lark's (use //)";
    return NULL;
}

/* An item and its postfix operators. */
static int32_t parse_item(lk *l, int nested) {
    gb *g = &l->g;
    int c = peek(l);
    int32_t x = -1;
    const char *no = refused(l, c);
    if (no) return lfail(l, no), -1;
    if (c == '"') {
        int32_t lo, hi;
        x = parse_string(l, &lo);
        if (x >= 0 && at(l, "..")) { /* a range of characters */
            g->i += 2;
            if (peek(l) != '"') return lfail(l, "a range's end must be a string"), -1;
            if (parse_string(l, &hi) < 0) return -1;
            if (lo < 0 || hi < 0) return lfail(l, "a range's ends must be single characters"), -1;
            if (hi < lo) return lfail(l, "a range whose end comes before its start"), -1;
            g->nodes[x].kind = G_CLASS, g->nodes[x].flags = 0, g->nodes[x].off = g->n_data, g->nodes[x].len = 1;
            if (!gb_push_data(g, (uint32_t)lo) || !gb_push_data(g, (uint32_t)hi)) return -1;
        }
    } else if (c == '/') x = parse_regex(l);
    else if (c == '(') x = group(l, ')');
    else if (c == '[') {
        if ((x = group(l, ']')) >= 0) x = rep(l, x, 0, 1);
    } else if (name_start(c)) {
        int32_t r = name_rule(l, NULL);
        if (r < 0) return -1;
        if (peek(l) == '{') { /* a template's use, unless a count follows */
            size_t k = g->i + 1;
            while (k < g->n && (g->s[k] == ' ' || g->s[k] == '\t')) k++;
            if (k >= g->n || !((g->s[k] >= '0' && g->s[k] <= '9') || g->s[k] == ','))
                return lfail(l, "templates (name{...}) are not supported"), -1;
        }
        if ((x = gb_node(g, G_REF)) >= 0) g->nodes[x].ref = r;
    } else return lfail(l, "an unexpected character"), -1;
    if (x < 0) return -1;
    for (int n_ops = 0;; n_ops++) {
        space(l, nested);
        int op = peek(l);
        if (n_ops == 8 && op >= 0 && strchr("*+?~{", op)) return lfail(l, "over 8 operators on one item"), -1;
        int32_t min, max;
        if (op == '*') min = 0, max = -1, g->i++;
        else if (op == '+') min = 1, max = -1, g->i++;
        else if (op == '?') min = 0, max = 1, g->i++;
        else if (op == '~') { /* ~ n, ~ n..m */
            g->i++;
            space(l, nested);
            if (!parse_count(l, &min)) return lfail(l, "a bad '~ n..m'"), -1;
            max = min;
            if (at(l, "..")) {
                g->i += 2;
                if (!parse_count(l, &max)) return lfail(l, "a bad '~ n..m'"), -1;
            }
            if (max < min) return lfail(l, "a '~ n..m' with m < n"), -1;
        } else if (op == '{') { /* {n} {n,} {n,m} {,m} */
            g->i++;
            space(l, nested);
            int has_min = parse_count(l, &min);
            if (g->st) return -1;
            if (!has_min) min = 0;
            space(l, nested);
            max = min;
            if (peek(l) == ',') {
                g->i++;
                space(l, nested);
                if (!parse_count(l, &max)) max = -1;
                if (g->st) return -1;
                space(l, nested);
            } else if (!has_min) return lfail(l, "a bad {n,m}"), -1;
            if (peek(l) != '}') return lfail(l, "a bad {n,m}"), -1;
            g->i++;
            if (max >= 0 && max < min) return lfail(l, "a {n,m} with m < n"), -1;
        } else return x;
        if ((x = rep(l, x, min, max)) < 0) return -1;
    }
}

static int32_t parse_seq(lk *l, int nested) {
    gb *g = &l->g;
    int32_t s = gb_node(g, G_SEQ), last = -1;
    if (s < 0) return -1;
    for (;;) {
        space(l, nested);
        int c = peek(l);
        if (c < 0 || c == '|' || c == ')' || c == ']' || c == '\n') break;
        if (at(l, "->")) { /* an alias: the tree's only */
            g->i += 2;
            space(l, 0);
            if (peek(l) == '?' || peek(l) == '!') g->i++;
            if (!name_start(peek(l))) return lfail(l, "a name expected after '->'"), -1;
            while (name_char(peek(l))) g->i++;
            space(l, nested);
            c = peek(l);
            if (!(c < 0 || c == '|' || c == ')' || c == ']' || c == '\n')) return lfail(l, "an alias must end its alternative"), -1;
            break;
        }
        int32_t x = parse_item(l, nested);
        if (x < 0) return -1;
        if (last < 0) g->nodes[s].first = x;
        else g->nodes[last].next = x;
        last = x;
    }
    return s;
}

static int32_t parse_alts(lk *l, int nested) {
    gb *g = &l->g;
    int32_t a = gb_node(g, G_ALT), last;
    if (a < 0) return -1;
    if ((last = parse_seq(l, nested)) < 0) return -1;
    g->nodes[a].first = last;
    for (;;) {
        size_t save = g->i;
        space(l, 1);
        if (peek(l) != '|') {
            if (!nested) g->i = save;
            return a;
        }
        g->i++;
        space(l, 1);
        int32_t s = parse_seq(l, nested);
        if (s < 0) return -1;
        g->nodes[last].next = s;
        last = s;
    }
}

static int end_of_line(lk *l) {
    space(l, 0);
    if (l->g.i < l->g.n && peek(l) != '\n') return lfail(l, "an unexpected character"), 0;
    return 1;
}

static void parse_defs(lk *l);

/* The common library's rules, once. */
static void load_common(lk *l) {
    if (l->common) return;
    l->common = 1;
    gb *g = &l->g;
    const char *s = g->s, *ns = l->ns;
    size_t n = g->n, i = g->i;
    g->s = COMMON, g->n = sizeof COMMON - 1, g->i = 0, l->ns = "common.";
    parse_defs(l);
    g->s = s, g->n = n, g->i = i, l->ns = ns;
}

/* rule `as` (in the user's names) := common.name. */
static void import_one(lk *l, const char *name, size_t nl, const char *as, size_t al) {
    gb *g = &l->g;
    char buf[160];
    if (nl + 8 > sizeof buf || al + 1 > sizeof buf) {
        lfail(l, "a name over 150 characters");
        return;
    }
    memcpy(buf, "common.", 7), memcpy(buf + 7, name, nl);
    int32_t src = -1;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (strlen(g->rules[r].name) == nl + 7 && !memcmp(g->rules[r].name, buf, nl + 7) && g->rules[r].body >= 0) src = r;
    if (src < 0) {
        char what[240];
        snprintf(what, sizeof what, "'common.%.*s', which is not among the common terminals", (int)(nl > 60 ? 60 : nl), name);
        lfail(l, what);
        return;
    }
    int32_t dst = gb_rule_of(g, as, al);
    if (dst < 0) return;
    if (g->rules[dst].body >= 0) {
        lfail(l, "a name defined twice");
        return;
    }
    if (is_terminal(g->rules[dst].name) != 1) {
        lfail(l, "a common terminal imported under a rule's (lowercase) name");
        return;
    }
    int32_t a = gb_node(g, G_ALT), s = gb_node(g, G_SEQ), x = gb_node(g, G_REF);
    if (x < 0) return;
    g->nodes[x].ref = src, g->nodes[s].first = x, g->nodes[a].first = s;
    g->rules[dst].body = a;
}

static void parse_import(lk *l) {
    gb *g = &l->g;
    space(l, 0);
    if (!at(l, "common") || (g->i + 6 < g->n && name_char((uint8_t)g->s[g->i + 6]))) {
        lfail(l, "imports other than from 'common' are not supported");
        return;
    }
    g->i += 6;
    load_common(l);
    if (g->st) return;
    space(l, 0);
    if (peek(l) == '.') {
        g->i++;
        size_t a = g->i;
        while (name_char(peek(l))) g->i++;
        size_t nl = g->i - a;
        if (!nl) {
            lfail(l, "a name expected after 'common.'");
            return;
        }
        space(l, 0);
        if (at(l, "->")) {
            g->i += 2;
            space(l, 0);
            size_t b = g->i;
            while (name_char(peek(l))) g->i++;
            if (g->i == b) {
                lfail(l, "a name expected after '->'");
                return;
            }
            import_one(l, g->s + a, nl, g->s + b, g->i - b);
        } else import_one(l, g->s + a, nl, g->s + a, nl);
        return;
    }
    if (peek(l) != '(') {
        lfail(l, "'%import common.NAME' or '%import common (NAMES)' expected");
        return;
    }
    g->i++;
    for (;;) {
        space(l, 1);
        size_t a = g->i;
        while (name_char(peek(l))) g->i++;
        if (g->i == a) {
            lfail(l, "a name expected in the import's list");
            return;
        }
        import_one(l, g->s + a, g->i - a, g->s + a, g->i - a);
        if (g->st) return;
        space(l, 1);
        if (peek(l) == ',') g->i++;
        else if (peek(l) == ')') {
            g->i++;
            return;
        } else {
            lfail(l, "',' or ')' expected in the import's list");
            return;
        }
    }
}

static void parse_ignore(lk *l) {
    gb *g = &l->g;
    space(l, 0);
    int32_t a = parse_alts(l, 0);
    if (a < 0) return;
    if (l->ignore < 0) {
        if ((l->ignore = gb_rule_of(g, "%ignore", 7)) < 0) return;
        g->rules[l->ignore].body = a;
        return;
    }
    int32_t c = g->nodes[g->rules[l->ignore].body].first;
    while (g->nodes[c].next >= 0) c = g->nodes[c].next;
    g->nodes[c].next = g->nodes[a].first;
}

static void parse_defs(lk *l) {
    gb *g = &l->g;
    for (;;) {
        space(l, 1);
        if (g->i >= g->n || g->st) return;
        if (peek(l) == '%') {
            size_t a = ++g->i;
            while (name_char(peek(l))) g->i++;
            size_t k = g->i - a;
            if (k == 6 && !memcmp(g->s + a, "ignore", 6)) parse_ignore(l);
            else if (k == 6 && !memcmp(g->s + a, "import", 6)) parse_import(l);
            else {
                char what[120];
                g->i = a - 1;
                snprintf(what, sizeof what, "the directive '%%%.*s' is not supported", (int)(k > 40 ? 40 : k), g->s + a);
                lfail(l, what);
                return;
            }
            if (g->st || !end_of_line(l)) return;
            continue;
        }
        if (peek(l) == '?' || peek(l) == '!') g->i++;
        if (!name_start(peek(l))) {
            const char *no = refused(l, peek(l));
            lfail(l, no ? no : "a rule or terminal name expected");
            return;
        }
        int32_t r = name_rule(l, NULL);
        if (r < 0) return;
        space(l, 0);
        if (peek(l) == '{') {
            lfail(l, "templates (name{...}) are not supported");
            return;
        }
        if (peek(l) == '.') {
            lfail(l, "priorities (name.N) are not supported");
            return;
        }
        if (peek(l) != ':' || at(l, "::=")) {
            lfail(l, at(l, "::=") ? "':' expected (this is GBNF's '::=')" : "':' expected");
            return;
        }
        if (g->rules[r].body >= 0) {
            lfail(l, "a name defined twice");
            return;
        }
        g->i++;
        space(l, 0);
        int32_t body = parse_alts(l, 0);
        if (body < 0) return;
        g->rules[r].body = body;
        if (!end_of_line(l)) return;
    }
}

/* A terminal's body refers to a rule: its name, else NULL. */
static const char *term_uses_rule(const gb *g, int32_t x) {
    for (; x >= 0; x = g->nodes[x].next) {
        const gnode *n = &g->nodes[x];
        if (n->kind == G_REF && !is_terminal(g->rules[n->ref].name)) return g->rules[n->ref].name;
        if (n->kind >= G_SEQ) {
            const char *r = term_uses_rule(g, n->first);
            if (r) return r;
        }
    }
    return NULL;
}

/* In a rule's body: before each terminal, the ignored terminals, any number. */
static void add_ignore(lk *l, int32_t x) {
    gb *g = &l->g;
    for (; x >= 0 && !g->st; x = g->nodes[x].next) {
        int k = g->nodes[x].kind;
        if (k >= G_SEQ) {
            add_ignore(l, g->nodes[x].first);
            continue;
        }
        if (k == G_REF && !is_terminal(g->rules[g->nodes[x].ref].name)) continue;
        int32_t y = gb_node(g, G_LIT), ref = gb_node(g, G_REF), star = rep(l, ref, 0, -1);
        if (star < 0) return;
        g->nodes[y] = g->nodes[x], g->nodes[y].next = -1;
        g->nodes[ref].ref = l->ignore, g->nodes[star].next = y;
        g->nodes[x].kind = G_SEQ, g->nodes[x].first = star;
    }
}

static osp_status compile(lk *l, int flags, osp_grammar **out) {
    gb *g = &l->g;
    int32_t start = -1;
    for (int32_t r = 0; r < g->n_rules && !g->st; r++) {
        const grule *R = &g->rules[r];
        if (!strcmp(R->name, "start") && R->body >= 0) start = r;
        const char *used = R->body >= 0 && is_terminal(R->name) ? term_uses_rule(g, g->nodes[R->body].first) : NULL;
        if (used) g->st = osp_err(OSP_ERR_INVALID, "grammar: terminal '%.60s' refers to rule '%.60s'", R->name, used);
    }
    if (!g->st && start < 0) g->st = osp_err(OSP_ERR_INVALID, "grammar: no 'start' rule");
    if (!g->st && l->ignore >= 0) { /* start' := start %ignore* */
        const int32_t n_user = g->n_rules;
        for (int32_t r = 0; r < n_user && !g->st; r++)
            if (g->rules[r].body >= 0 && !is_terminal(g->rules[r].name)) add_ignore(l, g->nodes[g->rules[r].body].first);
        int32_t top = gb_rule_of(g, "%start", 6), a = gb_node(g, G_ALT), s = gb_node(g, G_SEQ), x = gb_node(g, G_REF),
                y = gb_node(g, G_REF), star = y >= 0 ? rep(l, y, 0, -1) : -1;
        if (!g->st && top >= 0 && star >= 0) {
            g->nodes[x].ref = start, g->nodes[y].ref = l->ignore, g->nodes[x].next = star;
            g->nodes[s].first = x, g->nodes[a].first = s;
            g->rules[top].body = a;
        }
    }
    g->json = (flags & OSP_GRAMMAR_JSON_STRING) != 0;
    return g->st ? g->st : gb_compile(g, l->ignore >= 0 ? "%start" : "start", NULL, out);
}

osp_status osp_grammar_from_lark(const char *text, size_t len, int flags, osp_grammar **out) {
    *out = NULL;
    if (len > GB_MAX_TEXT) return osp_err(OSP_ERR_INVALID, "grammar: over %d bytes", GB_MAX_TEXT);
    if (flags & ~OSP_GRAMMAR_JSON_STRING) return osp_err(OSP_ERR_INVALID, "grammar: unknown flags");
    lk l;
    memset(&l, 0, sizeof l);
    l.g.s = text, l.g.n = len, l.ns = "", l.ignore = -1;
    gr_b_init(&l.g.b);
    parse_defs(&l);
    osp_status st = l.g.st ? l.g.st : compile(&l, flags, out);
    gb_free(&l.g);
    return st;
}

osp_status osp_grammar_from_regex_flags(const char *re, size_t len, int flags, osp_grammar **out) {
    *out = NULL;
    if (len > GB_MAX_TEXT) return osp_err(OSP_ERR_INVALID, "regex: over %d bytes", GB_MAX_TEXT);
    if (flags & ~OSP_GRAMMAR_JSON_STRING) return osp_err(OSP_ERR_INVALID, "grammar: unknown flags");
    gr_dfa d; /* (checked by itself first: its error names its own offsets) */
    osp_status st = gr_regex_dfa(re, len, GR_RE_PLAIN | GR_RE_UTF8, &d);
    if (st) return st;
    gr_dfa_free(&d);
    /* anchored as a whole: a leading ^ and a trailing $ (not escaped) go */
    if (len && re[0] == '^') re++, len--;
    if (len && re[len - 1] == '$') {
        size_t k = 0;
        while (k + 1 < len && re[len - 2 - k] == '\\') k++;
        if (k % 2 == 0) len--;
    }
    gb g;
    memset(&g, 0, sizeof g);
    gr_b_init(&g.b);
    int32_t r = gb_rule_of(&g, "start", 5), a = gb_node(&g, G_ALT), s = gb_node(&g, G_SEQ), x = gb_node(&g, G_RE);
    g.nodes[x].off = g.n_data;
    for (size_t k = 0; k < len && !g.st; k++) gb_push_data(&g, (uint8_t)re[k]);
    if (!g.st) {
        g.nodes[x].len = (uint32_t)len, g.nodes[s].first = x, g.nodes[a].first = s;
        g.rules[r].body = a;
        g.json = (flags & OSP_GRAMMAR_JSON_STRING) != 0;
    }
    st = g.st ? g.st : gb_compile(&g, "start", NULL, out);
    gb_free(&g);
    return st;
}
