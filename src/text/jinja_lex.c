/* text/jinja lexer: normalized source -> tokens.
 *
 * A hand-written mirror of jinja2's regex lexer (lexer.py, 3.1) with
 * trim_blocks and lstrip_blocks on:
 * - root state: text up to the first "{{", "{%" or "{#" (or a raw block).
 *   A "-" after the opening delimiter strips all whitespace before the tag;
 *   otherwise, unless it is "+" or the tag is "{{", lstrip_blocks removes
 *   spaces and tabs (Unicode whitespace) between the start of the line and
 *   the tag. "Start of the line" includes the case where the previous match
 *   ended with a newline (jinja2's line_starting).
 * - "-%}" / "-}}" / "-#}" strip all following whitespace; "%}" and "#}"
 *   eat one following newline (trim_blocks); "+%}" keeps it.
 * - inside tags, end delimiters only count when brackets are balanced.
 * Python's \s (str.isspace) is the whitespace everywhere.
 */
#include <stdlib.h>
#include <utf8proc.h>
#include "text/jinja_internal.h"

typedef struct lexer {
    jarena *a;
    const char *s;
    size_t n, pos;
    uint32_t line;
    int line_starting;
    jtok *toks;
    size_t ntok, cap;
    char bal[256]; /* expected closing brackets */
    int nbal;
} lexer;

static osp_status lex_fail(lexer *lx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static osp_status lex_fail(lexer *lx, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return osp_err(OSP_ERR_FORMAT, "template syntax error (line %u): %s", lx->line, msg);
}

static osp_status emit(lexer *lx, jtok_kind k, const char *s, size_t n, uint32_t line, jtok **out) {
    if (lx->ntok == lx->cap) {
        size_t nc = lx->cap ? lx->cap * 2 : 256;
        jtok *t = ja_alloc(lx->a, nc * sizeof *t);
        if (!t) return osp_err(OSP_ERR_NOMEM, "template too large to tokenize");
        if (lx->ntok) memcpy(t, lx->toks, lx->ntok * sizeof *t);
        lx->toks = t;
        lx->cap = nc;
    }
    jtok *t = &lx->toks[lx->ntok++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)k;
    t->line = line;
    t->s.s = s;
    t->s.n = (uint32_t)n;
    if (out) *out = t;
    return OSP_OK;
}

static uint32_t count_nl(const char *s, size_t n) {
    uint32_t c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Length of the run of Python whitespace at s[i..n). */
static size_t space_run(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n) {
        size_t k = j;
        int32_t cp = ju_next(s, n, &k);
        if (!ju_isspace(cp)) break;
        j = k;
    }
    return j - i;
}

/* Apply the begin-tag whitespace rules to the text before a tag. */
static size_t strip_before(lexer *lx, const char *text, size_t len, char sign, int is_var) {
    if (sign == '-') {
        size_t end = 0, i = 0;
        while (i < len) {
            int32_t cp = ju_next(text, len, &i);
            if (!ju_isspace(cp)) end = i;
        }
        return end;
    }
    if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t i = len; i > 0; i--)
            if (text[i - 1] == '\n') { l_pos = i; break; }
        if ((l_pos > 0 || lx->line_starting) && l_pos < len &&
            space_run(text, len, l_pos) == len - l_pos)
            return l_pos;
    }
    return len;
}

/* Emit the text before a tag (after stripping) and advance the line count
 * over all of it, stripped part included. */
static osp_status emit_text(lexer *lx, const char *text, size_t len, size_t keep) {
    if (keep) OSP_TRY(emit(lx, JT_DATA, text, keep, lx->line, NULL));
    lx->line += count_nl(text, len);
    return OSP_OK;
}

/* Match a block end at s[p]: "+%}", "-%}\s*", "%}\n?" (trim_blocks). */
static size_t match_block_end(const lexer *lx, size_t p, char close) {
    const char *s = lx->s;
    size_t n = lx->n;
    if (p + 2 < n && s[p] == '+' && s[p + 1] == close && s[p + 2] == '}') return 3;
    if (p + 2 < n && s[p] == '-' && s[p + 1] == close && s[p + 2] == '}')
        return 3 + space_run(s, n, p + 3);
    if (p + 1 < n && s[p] == close && s[p + 1] == '}') return 2 + (p + 2 < n && s[p + 2] == '\n');
    return 0;
}

static size_t match_var_end(const lexer *lx, size_t p) {
    const char *s = lx->s;
    size_t n = lx->n;
    if (p + 2 < n && s[p] == '-' && s[p + 1] == '}' && s[p + 2] == '}') return 3 + space_run(s, n, p + 3);
    if (p + 1 < n && s[p] == '}' && s[p + 1] == '}') return 2;
    return 0;
}

/* "{%" [-+] \s* "raw" \s* ("-%}" \s* | "%}") at p: length, or 0. */
static size_t match_raw_begin(const lexer *lx, size_t p, char *sign) {
    const char *s = lx->s;
    size_t n = lx->n, q = p + 2;
    *sign = 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q += space_run(s, n, q);
    if (q + 3 > n || memcmp(s + q, "raw", 3)) return 0;
    q += 3;
    q += space_run(s, n, q);
    if (q + 2 < n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') return q + 3 + space_run(s, n, q + 3) - p;
    if (q + 1 < n && s[q] == '%' && s[q + 1] == '}') return q + 2 - p;
    return 0;
}

/* "{%" [-+] \s* "endraw" \s* block-end at p: length, or 0. */
static size_t match_raw_end(const lexer *lx, size_t p, char *sign) {
    const char *s = lx->s;
    size_t n = lx->n, q = p + 2;
    *sign = 0;
    if (p + 1 >= n || s[p] != '{' || s[p + 1] != '%') return 0;
    if (q < n && (s[q] == '-' || s[q] == '+')) *sign = s[q++];
    q += space_run(s, n, q);
    if (q + 6 > n || memcmp(s + q, "endraw", 6)) return 0;
    q += 6;
    q += space_run(s, n, q);
    size_t e = match_block_end(lx, q, '%');
    return e ? q + e - p : 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* (\d+_)*\d+ at p: end, or p when none. */
static size_t digits_us(const char *s, size_t n, size_t p) {
    if (p >= n || !is_digit(s[p])) return p;
    while (p < n && is_digit(s[p])) p++;
    while (p + 1 < n && s[p] == '_' && is_digit(s[p + 1])) {
        p++;
        while (p < n && is_digit(s[p])) p++;
    }
    return p;
}

static size_t match_float(const lexer *lx, size_t p) {
    const char *s = lx->s;
    size_t n = lx->n;
    if (p > 0 && s[p - 1] == '.') return 0;
    size_t q = digits_us(s, n, p);
    if (q == p) return 0;
    size_t frac = q;
    if (q + 1 < n && s[q] == '.' && is_digit(s[q + 1])) frac = digits_us(s, n, q + 1);
    size_t e = frac;
    if (e < n && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < n && (s[x] == '+' || s[x] == '-')) x++;
        size_t y = digits_us(s, n, x);
        if (y > x) return y - p;
    }
    return frac > q ? frac - p : 0;
}

static size_t match_int(const lexer *lx, size_t p) {
    const char *s = lx->s;
    size_t n = lx->n;
    if (p >= n || !is_digit(s[p])) return 0;
    if (s[p] == '0' && p + 1 < n) {
        char c = (char)(s[p + 1] | 0x20);
        int base = c == 'b' ? 2 : c == 'o' ? 8 : c == 'x' ? 16 : 0;
        if (base) {
            size_t q = p + 2;
            for (;;) {
                size_t r = q;
                if (r < n && s[r] == '_') r++;
                if (r >= n) break;
                int ok = base == 16 ? is_hex(s[r]) : (s[r] >= '0' && s[r] < '0' + base);
                if (!ok) break;
                q = r + 1;
            }
            if (q > p + 2) return q - p;
        }
    }
    size_t q = p + 1;
    if (s[p] == '0') {
        for (;;) {
            size_t r = q;
            if (r < n && s[r] == '_') r++;
            if (r < n && s[r] == '0') q = r + 1;
            else break;
        }
        return q - p;
    }
    for (;;) {
        size_t r = q;
        if (r < n && s[r] == '_') r++;
        if (r < n && is_digit(s[r])) q = r + 1;
        else break;
    }
    return q - p;
}

static int name_char(int32_t cp, int first) {
    if (cp < 128)
        return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' ||
               (!first && cp >= '0' && cp <= '9');
    utf8proc_category_t c = utf8proc_category(cp);
    switch (c) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
        return 1;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return !first;
    default:
        return 0;
    }
}

static size_t match_name(const lexer *lx, size_t p) {
    size_t q = p;
    int first = 1;
    while (q < lx->n) {
        size_t r = q;
        int32_t cp = ju_next(lx->s, lx->n, &r);
        if (!name_char(cp, first)) break;
        first = 0;
        q = r;
    }
    return q - p;
}

/* Python's unicode-escape decoding of a string literal's body. */
static osp_status unescape(lexer *lx, const char *s, size_t n, jstr *out) {
    char *o = ja_alloc(lx->a, n + 1);
    if (!o) return osp_err(OSP_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i]; continue; }
        char c = s[++i];
        int32_t cp = -1;
        switch (c) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int need = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t u = 0; /* 8 hex digits can exceed an int (found by fuzz_jinja) */
            for (int j = 0; j < need; j++) {
                if (i + 1 + j >= n || !is_hex(s[i + 1 + j]))
                    return lex_fail(lx, "truncated \\%s escape", c == 'x' ? "xXX" : c == 'u' ? "uXXXX" : "UXXXXXXXX");
                char h = s[i + 1 + j];
                u = u * 16 + (uint32_t)(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            i += (size_t)need;
            if (u > 0x10FFFF) return lex_fail(lx, "illegal Unicode character");
            cp = (int)u;
            if (cp >= 0xD800 && cp <= 0xDFFF) return lex_fail(lx, "surrogate code point U+%04X in a string literal", (unsigned)cp);
            break;
        }
        case 'N':
            return lex_fail(lx, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = c - '0';
                for (int j = 0; j < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; j++) cp = cp * 8 + (s[++i] - '0');
            } else {
                o[k++] = '\\';
                i--; /* keep the next character as it is */
                continue;
            }
        }
        k += (size_t)ju_put(o + k, cp);
    }
    o[k] = 0;
    out->s = o;
    out->n = (uint32_t)k;
    return OSP_OK;
}

static const struct { const char *op; jtok_kind k; } OPS[] = {
    {"**", JT_POW}, {"//", JT_FLOORDIV}, {"==", JT_EQ}, {"!=", JT_NE}, {">=", JT_GTEQ}, {"<=", JT_LTEQ},
    {"+", JT_ADD}, {"-", JT_SUB}, {"/", JT_DIV}, {"*", JT_MUL}, {"%", JT_MOD}, {"~", JT_TILDE},
    {"[", JT_LBRACKET}, {"]", JT_RBRACKET}, {"(", JT_LPAREN}, {")", JT_RPAREN}, {"{", JT_LBRACE},
    {"}", JT_RBRACE}, {">", JT_GT}, {"<", JT_LT}, {"=", JT_ASSIGN}, {".", JT_DOT}, {":", JT_COLON},
    {"|", JT_PIPE}, {",", JT_COMMA}, {";", JT_SEMICOLON},
};

/* Tokens inside "{{ }}" or "{% %}" up to and including the end delimiter. */
static osp_status lex_tag(lexer *lx, int is_block) {
    const char *s = lx->s;
    size_t n = lx->n;
    lx->nbal = 0;
    while (lx->pos < n) {
        size_t p = lx->pos;
        if (!lx->nbal) {
            size_t e = is_block ? match_block_end(lx, p, '%') : match_var_end(lx, p);
            if (e) {
                OSP_TRY(emit(lx, is_block ? JT_BLOCK_END : JT_VAR_END, s + p, e, lx->line, NULL));
                lx->line += count_nl(s + p, e);
                lx->line_starting = s[p + e - 1] == '\n';
                lx->pos = p + e;
                return OSP_OK;
            }
        }
        size_t w = space_run(s, n, p);
        if (w) {
            lx->line += count_nl(s + p, w);
            lx->pos += w;
            continue;
        }
        jtok *t;
        size_t len;
        if ((len = match_float(lx, p))) {
            char buf[128];
            size_t k = 0;
            for (size_t i = p; i < p + len && k + 1 < sizeof buf; i++)
                if (s[i] != '_') buf[k++] = s[i];
            buf[k] = 0;
            OSP_TRY(emit(lx, JT_FLOAT, s + p, len, lx->line, &t));
            t->d = strtod(buf, NULL);
        } else if ((len = match_int(lx, p))) {
            int base = 10;
            size_t i = p;
            if (len > 1 && s[p] == '0' && ((s[p + 1] | 0x20) == 'b' || (s[p + 1] | 0x20) == 'o' || (s[p + 1] | 0x20) == 'x')) {
                char c = (char)(s[p + 1] | 0x20);
                base = c == 'b' ? 2 : c == 'o' ? 8 : 16;
                i += 2;
            }
            uint64_t v = 0;
            for (; i < p + len; i++) {
                if (s[i] == '_') continue;
                int dgt = is_digit(s[i]) ? s[i] - '0' : (s[i] | 0x20) - 'a' + 10;
                if (v > (UINT64_MAX - (uint64_t)dgt) / (uint64_t)base || v * (uint64_t)base + (uint64_t)dgt > (uint64_t)INT64_MAX)
                    return lex_fail(lx, "integer literal %.*s is too large", (int)len, s + p);
                v = v * (uint64_t)base + (uint64_t)dgt;
            }
            OSP_TRY(emit(lx, JT_INT, s + p, len, lx->line, &t));
            t->i = (int64_t)v;
        } else if ((len = match_name(lx, p))) {
            OSP_TRY(emit(lx, JT_NAME, s + p, len, lx->line, NULL));
        } else if (s[p] == '\'' || s[p] == '"') {
            char q = s[p];
            size_t i = p + 1;
            while (i < n && s[i] != q) i += s[i] == '\\' ? 2 : 1;
            if (i >= n) return lex_fail(lx, "unexpected char '%c' at %zu (unterminated string)", q, p);
            len = i + 1 - p;
            OSP_TRY(emit(lx, JT_STRING, s + p, len, lx->line, &t));
            OSP_TRY(unescape(lx, s + p + 1, len - 2, &t->s));
            lx->line += count_nl(s + p, len);
            lx->pos = p + len;
            continue;
        } else {
            size_t k;
            for (k = 0; k < sizeof OPS / sizeof *OPS; k++) {
                size_t ol = strlen(OPS[k].op);
                if (p + ol <= n && !memcmp(s + p, OPS[k].op, ol)) break;
            }
            if (k == sizeof OPS / sizeof *OPS) {
                size_t r = p;
                int32_t cp = ju_next(s, n, &r);
                return lex_fail(lx, "unexpected char '%.*s' (U+%04X) at %zu", (int)(r - p), s + p, (unsigned)cp, p);
            }
            len = strlen(OPS[k].op);
            char c = OPS[k].op[0];
            if (len == 1 && (c == '(' || c == '[' || c == '{')) {
                if (lx->nbal == (int)sizeof lx->bal) return lex_fail(lx, "brackets nested too deeply");
                lx->bal[lx->nbal++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (len == 1 && (c == ')' || c == ']' || c == '}')) {
                if (!lx->nbal) return lex_fail(lx, "unexpected '%c'", c);
                char want = lx->bal[--lx->nbal];
                if (want != c) return lex_fail(lx, "unexpected '%c', expected '%c'", c, want);
            }
            OSP_TRY(emit(lx, OPS[k].k, s + p, len, lx->line, NULL));
        }
        lx->pos = p + len;
    }
    return OSP_OK; /* end of source inside a tag: the parser reports it */
}

osp_status jlex(jarena *a, const char *src, size_t n, jtok **out, size_t *ntok) {
    lexer lx;
    memset(&lx, 0, sizeof lx);
    lx.a = a;
    lx.s = src;
    lx.n = n;
    lx.line = 1;
    lx.line_starting = 1;
    while (lx.pos < n) {
        size_t p = lx.pos, i = p;
        const char *hit = NULL;
        while (i + 1 < n) {
            hit = memchr(src + i, '{', n - i - 1);
            if (!hit) break;
            i = (size_t)(hit - src);
            char c = src[i + 1];
            if (c == '{' || c == '%' || c == '#') break;
            i++;
            hit = NULL;
        }
        if (!hit) { /* the rest is text */
            OSP_TRY(emit_text(&lx, src + p, n - p, n - p));
            lx.line_starting = src[n - 1] == '\n';
            lx.pos = n;
            break;
        }
        char kind = src[i + 1];
        char sign = 0, rsign = 0;
        size_t raw = kind == '%' ? match_raw_begin(&lx, i, &rsign) : 0;
        if (raw) sign = rsign;
        else if (i + 2 < n && (src[i + 2] == '-' || src[i + 2] == '+')) sign = src[i + 2];
        size_t keep = strip_before(&lx, src + p, i - p, sign, kind == '{');
        OSP_TRY(emit_text(&lx, src + p, i - p, keep));
        if (raw) {
            lx.line += count_nl(src + i, raw);
            lx.line_starting = src[i + raw - 1] == '\n';
            size_t b = i + raw, e = b, elen = 0;
            char esign = 0;
            for (; e < n; e++)
                if (src[e] == '{' && (elen = match_raw_end(&lx, e, &esign))) break;
            if (!elen) return lex_fail(&lx, "missing end of raw directive");
            size_t k = strip_before(&lx, src + b, e - b, esign, 0);
            OSP_TRY(emit_text(&lx, src + b, e - b, k));
            lx.line += count_nl(src + e, elen);
            lx.line_starting = src[e + elen - 1] == '\n';
            lx.pos = e + elen;
            continue;
        }
        size_t body = i + 2 + (sign ? 1 : 0);
        lx.line_starting = 0;
        if (kind == '#') {
            size_t e = body, elen = 0;
            for (; e < n; e++) {
                if (src[e] == '+' || src[e] == '-' || src[e] == '#') {
                    if (src[e] == '#' && e + 1 < n && src[e + 1] == '}') elen = 2 + (e + 2 < n && src[e + 2] == '\n');
                    else if (src[e] != '#' && e + 2 < n && src[e + 1] == '#' && src[e + 2] == '}')
                        elen = 3 + (src[e] == '-' ? space_run(src, n, e + 3) : 0);
                    if (elen) break;
                }
            }
            if (!elen) return lex_fail(&lx, "missing end of comment tag");
            lx.line += count_nl(src + body, e + elen - body);
            lx.line_starting = src[e + elen - 1] == '\n';
            lx.pos = e + elen;
            continue;
        }
        OSP_TRY(emit(&lx, kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, src + i, body - i, lx.line, NULL));
        lx.pos = body;
        OSP_TRY(lex_tag(&lx, kind == '%'));
    }
    OSP_TRY(emit(&lx, JT_EOF, "", 0, lx.line, NULL));
    *out = lx.toks;
    *ntok = lx.ntok;
    return OSP_OK;
}

const char *jtok_describe(const jtok *t) {
    switch (t->kind) {
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default: return NULL; /* names and operators: their text */
    }
}
