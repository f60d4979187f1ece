/* Tokenizer utilities: growable buffers, a chunked arena, hashing, UTF-8,
 * character classes with the reference library's definitions, and literal
 * or regex patterns.
 *
 * Regexes in tokenizer.json are written for Oniguruma (the Rust library's
 * engine). PCRE2 runs them after a small rewrite of the shorthands whose
 * meaning differs: \s is White_Space (PCRE2's lacks U+0085), \w is
 * Alphabetic|Mark|Nd|Pc (+ the Latin-1 superscripts and fractions outside a
 * class), \d is Nd, \h is a hex digit. Everything else passes through. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "text/tokenizer_internal.h"

/* ---- buffers ---- */

void *tk_grow(void *p, size_t n_old, size_t n_new, size_t elem) {
    void *q = osp_malloc(OSP_POOL_MISC, n_new * elem);
    if (!q) return NULL;
    if (p && n_old) memcpy(q, p, n_old * elem);
    osp_free(p);
    return q;
}

char *tk_strndup(const char *s, size_t n) {
    char *d = osp_malloc(OSP_POOL_MISC, n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

osp_status tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return OSP_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *q = tk_grow(b->p, b->n, cap, 1);
    if (!q) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = q;
    b->cap = cap;
    return OSP_OK;
}

osp_status tk_buf_put(tk_buf *b, const void *p, size_t n) {
    OSP_TRY(tk_buf_reserve(b, n));
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return OSP_OK;
}

void tk_buf_free(tk_buf *b) {
    osp_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

osp_status tk_ivec_reserve(tk_ivec *v, size_t extra) {
    if (v->n + extra <= v->cap) return OSP_OK;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *q = tk_grow(v->p, v->n, cap, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    v->p = q;
    v->cap = cap;
    return OSP_OK;
}

void tk_ivec_free(tk_ivec *v) {
    osp_free(v->p);
    v->p = NULL;
    v->n = v->cap = 0;
}

struct tk_chunk {
    tk_chunk *next;
    size_t used, cap;
    char data[];
};

char *tk_arena_alloc(tk_arena *a, size_t n) {
    tk_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        /* chunks grow 4 KB, 8 KB, ... 1 MB: small calls stay small */
        size_t cap = a->chunk ? a->chunk : 4096;
        if (cap < ((size_t)1 << 20)) a->chunk = cap * 2;
        if (cap < n) cap = n;
        c = osp_malloc(OSP_POOL_MISC, sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

void tk_arena_reset(tk_arena *a) {
    if (!a->head) return;
    tk_chunk *keep = a->head, *c = keep->next;
    while (c) {
        tk_chunk *n = c->next;
        osp_free(c);
        c = n;
    }
    keep->next = NULL;
    keep->used = 0;
}

void tk_arena_free(tk_arena *a) {
    while (a->head) {
        tk_chunk *n = a->head->next;
        osp_free(a->head);
        a->head = n;
    }
    a->chunk = 0;
}

osp_status tk_spans_push(tk_spans *v, uint32_t a, uint32_t b) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        tk_span *q = tk_grow(v->p, v->n, cap, sizeof *q);
        if (!q) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        v->p = q;
        v->cap = cap;
    }
    v->p[v->n].a = a;
    v->p[v->n].b = b;
    v->n++;
    return OSP_OK;
}

osp_status tk_pieces_push(tk_pieces *v, tk_piece pc) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        tk_piece *q = tk_grow(v->p, v->n, cap, sizeof *q);
        if (!q) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        v->p = q;
        v->cap = cap;
    }
    v->p[v->n++] = pc;
    return OSP_OK;
}

/* ---- hashing ---- */

uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ tk_mix64(w)) * 0x9E3779B97F4A7C15ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
    h = (h ^ tk_mix64(w + n)) * 0x9E3779B97F4A7C15ULL;
    return tk_mix64(h);
}

/* ---- UTF-8 ---- */

int tk_u8enc(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Width of a sequence led by b and the range of its second byte; 0 if b
 * cannot lead one. */
static int lead_info(unsigned char b, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b == 0xE0) { *lo = 0xA0; return 3; }
    if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return 3;
    if (b == 0xED) { *hi = 0x9F; return 3; }
    if (b == 0xF0) { *lo = 0x90; return 4; }
    if (b >= 0xF1 && b <= 0xF3) return 4;
    if (b == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

/* Length of the valid sequence at s[0..n), or -k when only k bytes (the
 * maximal invalid subpart, at least 1) can be consumed. */
static int seq_at(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    unsigned char lo, hi;
    int w = lead_info(s[0], &lo, &hi);
    if (!w) return -1;
    if (n < 2 || s[1] < lo || s[1] > hi) return -1;
    for (int k = 2; k < w; k++)
        if ((size_t)k >= n || s[k] < 0x80 || s[k] > 0xBF) return -k;
    return w;
}

int tk_utf8_seq_len(const char *s, size_t n) { return n ? seq_at((const unsigned char *)s, n) : 0; }

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = seq_at(u + i, n - i);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

osp_status tk_utf8_lossy(const char *s, size_t n, tk_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    OSP_TRY(tk_buf_reserve(out, n));
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && u[j] < 0x80) j++;
        if (j > i) {
            OSP_TRY(tk_buf_put(out, s + i, j - i));
            i = j;
            continue;
        }
        int k = seq_at(u + i, n - i);
        if (k > 0) {
            OSP_TRY(tk_buf_put(out, s + i, (size_t)k));
            i += (size_t)k;
        } else {
            OSP_TRY(tk_buf_put(out, "\xEF\xBF\xBD", 3));
            i += (size_t)-k;
        }
    }
    return OSP_OK;
}

size_t tk_utf8_incomplete_tail(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char b = u[n - k];
        if (b >= 0x80 && b <= 0xBF) continue; /* continuation: look further back */
        unsigned char lo, hi;
        int w = lead_info(b, &lo, &hi);
        if (!w || (int)k >= w) return 0;
        if (k >= 2 && (u[n - k + 1] < lo || u[n - k + 1] > hi)) return 0;
        return k; /* later bytes are continuations, checked above */
    }
    return 0;
}

/* ---- character classes ---- */

int tk_is_white_space(uint32_t cp) {
    if (cp < 0x80) return (cp >= 9 && cp <= 13) || cp == 32;
    if (cp == 0x85) return 1;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

int tk_is_numeric(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tk_is_punct(uint32_t cp) {
    if (cp < 0x80) return ispunct((int)cp) != 0;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

static pthread_once_t word_once = PTHREAD_ONCE_INIT;
static pcre2_code *word_re;
static void word_init(void) {
    int en;
    PCRE2_SIZE eo;
    word_re = pcre2_compile((PCRE2_SPTR) "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                            PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &en, &eo,
                            NULL);
}

/* The Rust regex crate's \w: Alphabetic, marks, Nd, Pc, Join_Control. */
int tk_is_word(uint32_t cp) {
    if (cp < 0x80) return isalnum((int)cp) || cp == '_';
    pthread_once(&word_once, word_init);
    if (!word_re) return 0;
    char b[4];
    int n = tk_u8enc(cp, b);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return 0;
    int rc = pcre2_match(word_re, (PCRE2_SPTR)b, (PCRE2_SIZE)n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc > 0;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) to U+0100.. in byte order. */
uint32_t tk_byte_cp(unsigned b) {
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    if (b == 0xAD) return 256 + 67;
    return b;
}

int tk_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 256 && cp <= 256 + 32) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp <= 256 + 66) return (int)(0x7F + cp - 256 - 33);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

/* ---- patterns ---- */

static const char WORD_IN_CLASS[] = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}";
static const char WORD_EXTRA[] = "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

/* Oniguruma -> PCRE2 rewrite of the shorthands (see the top of the file). */
static osp_status rewrite_regex(const char *src, size_t n, tk_buf *out) {
    int in_class = 0;
    char tmp[160];
    for (size_t i = 0; i < n;) {
        char ch = src[i];
        if (ch == '\\' && i + 1 < n) {
            char e = src[i + 1];
            const char *rep = NULL;
            if (!in_class) {
                switch (e) {
                case 's': rep = "\\p{White_Space}"; break;
                case 'S': rep = "\\P{White_Space}"; break;
                case 'd': rep = "\\p{Nd}"; break;
                case 'D': rep = "\\P{Nd}"; break;
                case 'h': rep = "[0-9A-Fa-f]"; break;
                case 'H': rep = "[^0-9A-Fa-f]"; break;
                case 'w':
                    snprintf(tmp, sizeof tmp, "[%s%s]", WORD_IN_CLASS, WORD_EXTRA);
                    rep = tmp;
                    break;
                case 'W':
                    snprintf(tmp, sizeof tmp, "[^%s%s]", WORD_IN_CLASS, WORD_EXTRA);
                    rep = tmp;
                    break;
                }
            } else {
                switch (e) {
                case 's': rep = "\\p{White_Space}"; break;
                case 'S': rep = "\\P{White_Space}"; break;
                case 'd': rep = "\\p{Nd}"; break;
                case 'D': rep = "\\P{Nd}"; break;
                case 'h': rep = "0-9A-Fa-f"; break;
                case 'w': rep = WORD_IN_CLASS; break;
                }
            }
            if (rep) {
                OSP_TRY(tk_buf_put(out, rep, strlen(rep)));
                i += 2;
                continue;
            }
            /* keep braced escapes (\p{..}, \x{..}) whole */
            size_t j = i + 2;
            if ((e == 'p' || e == 'P' || e == 'x') && j < n && src[j] == '{') {
                while (j < n && src[j] != '}') j++;
                if (j < n) j++;
            }
            OSP_TRY(tk_buf_put(out, src + i, j - i));
            i = j;
            continue;
        }
        if (ch == '[' && !in_class) {
            in_class = 1;
            OSP_TRY(tk_buf_put(out, src + i, 1));
            i++;
            if (i < n && src[i] == '^') OSP_TRY(tk_buf_put(out, src + i++, 1));
            if (i < n && src[i] == ']') OSP_TRY(tk_buf_put(out, src + i++, 1)); /* literal ] */
            continue;
        }
        if (ch == ']' && in_class) in_class = 0;
        OSP_TRY(tk_buf_put(out, src + i, 1));
        i++;
    }
    return OSP_OK;
}

osp_status tk_regex_compile(const char *src, size_t len, const char *what, pcre2_code **out) {
    tk_buf b = {0};
    osp_status st = rewrite_regex(src, len, &b);
    if (st != OSP_OK) return st;
    int en;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, PCRE2_UTF | PCRE2_UCP, &en,
                                   &eo, NULL);
    tk_buf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(en, msg, sizeof msg);
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: regex '%.*s' is not supported: %s", what,
                       (int)(len > 200 ? 200 : len), src, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs it otherwise */
    *out = re;
    return OSP_OK;
}

osp_status tk_pattern_init(tk_pattern *p, const char *s, size_t len, int is_regex, const char *what) {
    memset(p, 0, sizeof *p);
    p->is_regex = is_regex;
    p->s = tk_strndup(s, len);
    if (!p->s) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    p->len = len;
    if (is_regex) return tk_regex_compile(s, len, what, &p->re);
    return OSP_OK;
}

void tk_pattern_free(tk_pattern *p) {
    osp_free(p->s);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

osp_status tk_rx_init(tk_rx *rx) {
    memset(rx, 0, sizeof *rx);
    rx->md = pcre2_match_data_create(16, NULL);
    rx->mc = pcre2_match_context_create(NULL);
    rx->js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!rx->md || !rx->mc || !rx->js) {
        tk_rx_free(rx);
        return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory (regex state)");
    }
    pcre2_jit_stack_assign(rx->mc, NULL, rx->js);
    return OSP_OK;
}

void tk_rx_free(tk_rx *rx) {
    if (rx->md) pcre2_match_data_free(rx->md);
    if (rx->mc) pcre2_match_context_free(rx->mc);
    if (rx->js) pcre2_jit_stack_free(rx->js);
    memset(rx, 0, sizeof *rx);
}

osp_status tk_regex_find(const pcre2_code *re, const char *s, size_t n, tk_rx *rx, tk_spans *out) {
    size_t off = 0;
    while (off <= n) {
        int rc = pcre2_jit_match(re, (PCRE2_SPTR)s, n, off, 0, rx->md, rx->mc);
        if (rc == PCRE2_ERROR_JIT_BADOPTION)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, rx->md, rx->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return osp_err(OSP_ERR_INTERNAL, "tokenizer: regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(rx->md);
        size_t a = ov[0], b = ov[1];
        OSP_TRY(tk_spans_push(out, (uint32_t)a, (uint32_t)b));
        if (b == a) {
            if (a >= n) break;
            off = a + (size_t)tk_u8len((unsigned char)s[a]);
        } else {
            off = b;
        }
    }
    return OSP_OK;
}

osp_status tk_pattern_find(const tk_pattern *p, const char *s, size_t n, tk_rx *rx, tk_spans *out) {
    if (p->is_regex) return tk_regex_find(p->re, s, n, rx, out);
    if (p->len == 0 || n < p->len) return OSP_OK;
    size_t i = 0;
    const char *end = s + n;
    while (i + p->len <= n) {
        const char *q = memchr(s + i, p->s[0], (size_t)(end - (s + i)));
        if (!q || (size_t)(end - q) < p->len) break;
        if (memcmp(q, p->s, p->len) == 0) {
            size_t a = (size_t)(q - s);
            OSP_TRY(tk_spans_push(out, (uint32_t)a, (uint32_t)(a + p->len)));
            i = a + p->len;
        } else {
            i = (size_t)(q - s) + 1;
        }
    }
    return OSP_OK;
}
