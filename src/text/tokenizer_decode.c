/* Decoders: the reference's decode_chain over the list of token strings.
 * ByteLevel (chars -> bytes, all joined, invalid UTF-8 -> U+FFFD per
 * maximal invalid subpart), ByteFallback (runs of <0xNN> -> bytes; a run
 * that is not valid UTF-8 becomes one U+FFFD per byte), Fuse (join),
 * Strip (per token: up to `start` leading / `stop` trailing `content`
 * chars), Replace (per token), Metaspace (replacement -> space; in the
 * first token every replacement is dropped unless prepend_scheme is never).
 * Without a decoder, tokens are joined with spaces.
 *
 * `first` says the list starts the text; it is 0 when the incremental
 * detokenizer decodes a window that continues earlier text, so that only
 * the text's real first token gets the first-token rules. */
#include <jansson.h>
#include <string.h>
#include "text/tokenizer_internal.h"

static osp_status add_step(osp_tokenizer *t, int type, tk_dec **step) {
    tk_dec *q = tk_grow(t->dec, (size_t)t->n_dec, (size_t)t->n_dec + 1, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    t->dec = q;
    *step = &t->dec[t->n_dec++];
    memset(*step, 0, sizeof **step);
    (*step)->type = type;
    return OSP_OK;
}

static osp_status one_char(osp_tokenizer *t, json_t *v, const char *what, uint32_t *cp) {
    const char *s = json_string_value(v);
    int l = 0;
    if (!s || !json_string_length(v) || (*cp = tk_u8dec(s, &l), (size_t)l != json_string_length(v)))
        return osp_err(OSP_ERR_FORMAT, "%s: %s must be one character", t->name, what);
    return OSP_OK;
}

static osp_status parse_one(osp_tokenizer *t, json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return osp_err(OSP_ERR_FORMAT, "%s: decoder without a type", t->name);
    tk_dec *st;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "decoders");
        if (!json_is_array(list)) return osp_err(OSP_ERR_FORMAT, "%s: decoder Sequence without decoders", t->name);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) OSP_TRY(parse_one(t, v));
        return OSP_OK;
    }
    if (!strcmp(type, "ByteLevel")) return add_step(t, TD_BYTELEVEL, &st);
    if (!strcmp(type, "ByteFallback")) return add_step(t, TD_BYTEFALLBACK, &st);
    if (!strcmp(type, "Fuse")) return add_step(t, TD_FUSE, &st);
    if (!strcmp(type, "Strip")) {
        OSP_TRY(add_step(t, TD_STRIP, &st));
        OSP_TRY(one_char(t, json_object_get(j, "content"), "Strip decoder content", &st->cp));
        json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        st->start = json_is_integer(a) ? (int)json_integer_value(a) : 0;
        st->stop = json_is_integer(b) ? (int)json_integer_value(b) : 0;
        if (st->start < 0 || st->stop < 0) return osp_err(OSP_ERR_FORMAT, "%s: Strip decoder with negative counts", t->name);
        return OSP_OK;
    }
    if (!strcmp(type, "Replace")) {
        json_t *content = json_object_get(j, "content");
        if (!json_is_string(content)) return osp_err(OSP_ERR_FORMAT, "%s: Replace decoder without content", t->name);
        OSP_TRY(add_step(t, TD_REPLACE, &st));
        st->content = tk_strndup(json_string_value(content), json_string_length(content));
        st->content_len = json_string_length(content);
        if (!st->content) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
        return tk_parse_pattern(t, json_object_get(j, "pattern"), "Replace decoder", &st->pat);
    }
    if (!strcmp(type, "Metaspace")) {
        OSP_TRY(add_step(t, TD_METASPACE, &st));
        OSP_TRY(one_char(t, json_object_get(j, "replacement"), "Metaspace replacement", &st->cp));
        int scheme;
        OSP_TRY(tk_parse_prepend_scheme(t, j, &scheme));
        st->prepend = scheme != TK_PREPEND_NEVER;
        return OSP_OK;
    }
    if (!strcmp(type, "WordPiece")) {
        json_t *pre = json_object_get(j, "prefix");
        const char *p = json_is_string(pre) ? json_string_value(pre) : "##";
        OSP_TRY(add_step(t, TD_WORDPIECE, &st));
        st->content_len = json_is_string(pre) ? json_string_length(pre) : 2;
        st->content = tk_strndup(p, st->content_len);
        st->cleanup = !json_is_false(json_object_get(j, "cleanup"));
        return st->content ? OSP_OK : osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    }
    return osp_err(OSP_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported", t->name, type);
}

osp_status tk_decoder_parse(osp_tokenizer *t, const void *json) {
    t->has_decoder = 1;
    return parse_one(t, (json_t *)json);
}

void tk_dec_free(tk_dec *d) {
    tk_pattern_free(&d->pat);
    osp_free(d->content);
}

const char *tk_decoder_stream_problem(const osp_tokenizer *t) {
    int fused = 0;
    for (int i = 0; i < t->n_dec; i++) {
        const tk_dec *d = &t->dec[i];
        if (d->type == TD_FUSE || d->type == TD_BYTELEVEL) fused = 1;
        if (!fused) continue;
        if (d->type == TD_STRIP && d->stop > 0) return "a Strip decoder with stop > 0 after the tokens are joined";
        if (d->type == TD_REPLACE && (d->pat.is_regex || d->pat.len == 0 ||
                                      (size_t)tk_u8len((unsigned char)d->pat.s[0]) != d->pat.len))
            return "a Replace decoder of more than one character after the tokens are joined";
        if (d->type == TD_BYTEFALLBACK) return "a ByteFallback decoder after the tokens are joined";
    }
    return NULL;
}

/* ---- decoding ---- */

typedef struct dpiece {
    const char *s;
    size_t n;
} dpiece;
typedef struct dlist {
    dpiece *p;
    size_t n, cap;
} dlist;

static osp_status dpush(dlist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        dpiece *q = tk_grow(l->p, l->n, cap, sizeof *q);
        if (!q) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        l->p = q;
        l->cap = cap;
    }
    l->p[l->n].s = s;
    l->p[l->n].n = n;
    l->n++;
    return OSP_OK;
}

static char *adup(tk_arena *ar, const char *s, size_t n) {
    char *a = tk_arena_alloc(ar, n + 1);
    if (a) memcpy(a, s, n);
    return a;
}

static int byte_token(const char *s, size_t n, unsigned *v) {
    /* "<0xNN>" read with u8::from_str_radix(.., 16), which takes a '+' too */
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    unsigned x = 0;
    int digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (i == 3 && c == '+') continue;
        x <<= 4;
        if (c >= '0' && c <= '9') x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') x |= (unsigned)(c - 'A' + 10);
        else return 0;
        digits++;
    }
    *v = x;
    return digits > 0;
}

static osp_status join(tk_arena *ar, const dlist *in, dlist *out) {
    size_t total = 0;
    for (size_t i = 0; i < in->n; i++) total += in->p[i].n;
    char *a = tk_arena_alloc(ar, total + 1);
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < in->n; i++) {
        memcpy(a + k, in->p[i].s, in->p[i].n);
        k += in->p[i].n;
    }
    return dpush(out, a, k);
}

static osp_status byte_level(tk_arena *ar, const dlist *in, dlist *out, int *pending) {
    tk_buf raw = {0}, txt = {0};
    osp_status st = OSP_OK;
    for (size_t i = 0; i < in->n && st == OSP_OK; i++) {
        const char *s = in->p[i].s;
        size_t n = in->p[i].n, mark = raw.n;
        int ok = 1;
        for (size_t k = 0; k < n && ok;) {
            int len;
            int b = tk_cp_to_byte(tk_u8dec(s + k, &len));
            if (b < 0) ok = 0;
            else {
                char c = (char)b;
                st = tk_buf_put(&raw, &c, 1);
                if (st != OSP_OK) break;
            }
            k += (size_t)len;
        }
        if (st == OSP_OK && !ok) { /* not byte-level text: its own bytes */
            raw.n = mark;
            st = tk_buf_put(&raw, s, n);
        }
    }
    if (st == OSP_OK && pending && tk_utf8_incomplete_tail(raw.p, raw.n)) *pending = 1;
    if (st == OSP_OK) st = tk_utf8_lossy(raw.p ? raw.p : "", raw.n, &txt);
    if (st == OSP_OK) {
        char *a = adup(ar, txt.p ? txt.p : "", txt.n);
        st = a ? dpush(out, a, txt.n) : osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    tk_buf_free(&raw);
    tk_buf_free(&txt);
    return st;
}

static osp_status flush_run(tk_arena *ar, const char *run, size_t n, dlist *out) {
    if (!n) return OSP_OK;
    if (tk_utf8_valid_prefix(run, n) == n) {
        char *a = adup(ar, run, n);
        return a ? dpush(out, a, n) : osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; i < n; i++) OSP_TRY(dpush(out, "\xEF\xBF\xBD", 3));
    return OSP_OK;
}

static osp_status byte_fallback(tk_arena *ar, const dlist *in, dlist *out, int *pending) {
    tk_buf run = {0};
    osp_status st = OSP_OK;
    int last_byte = 0;
    for (size_t i = 0; i < in->n && st == OSP_OK; i++) {
        unsigned v;
        last_byte = byte_token(in->p[i].s, in->p[i].n, &v);
        if (last_byte) {
            char c = (char)v;
            st = tk_buf_put(&run, &c, 1);
            continue;
        }
        st = flush_run(ar, run.p, run.n, out);
        run.n = 0;
        if (st == OSP_OK) st = dpush(out, in->p[i].s, in->p[i].n);
    }
    if (st == OSP_OK) st = flush_run(ar, run.p, run.n, out);
    if (pending && last_byte) *pending = 1;
    tk_buf_free(&run);
    return st;
}

static osp_status strip(tk_arena *ar, const tk_dec *d, const dlist *in, dlist *out, int first, int fused) {
    (void)ar;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->p[i].s;
        size_t n = in->p[i].n, b = 0, e = n;
        int len;
        /* joined text: only the real start of the text is stripped */
        int starts = fused ? (first && i == 0) : 1;
        for (int k = 0; starts && k < d->start && b < e; k++) {
            if (tk_u8dec(s + b, &len) != d->cp) break;
            b += (size_t)len;
        }
        for (int k = 0; k < d->stop && e > b; k++) {
            size_t j = e - 1;
            while (j > b && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            if (tk_u8dec(s + j, &len) != d->cp) break;
            e = j;
        }
        OSP_TRY(dpush(out, s + b, e - b));
    }
    return OSP_OK;
}

static osp_status replace(tk_arena *ar, tk_rx *rx, tk_spans *sp, const tk_dec *d, const dlist *in, dlist *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->p[i].s;
        size_t n = in->p[i].n;
        sp->n = 0;
        OSP_TRY(tk_pattern_find(&d->pat, s, n, rx, sp));
        if (!sp->n) {
            OSP_TRY(dpush(out, s, n));
            continue;
        }
        size_t total = n + sp->n * d->content_len;
        char *a = tk_arena_alloc(ar, total + 1);
        if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        size_t k = 0, prev = 0;
        for (size_t m = 0; m < sp->n; m++) {
            memcpy(a + k, s + prev, sp->p[m].a - prev);
            k += sp->p[m].a - prev;
            memcpy(a + k, d->content, d->content_len);
            k += d->content_len;
            prev = sp->p[m].b;
        }
        memcpy(a + k, s + prev, n - prev);
        k += n - prev;
        OSP_TRY(dpush(out, a, k));
    }
    return OSP_OK;
}

static osp_status metaspace(tk_arena *ar, const tk_dec *d, const dlist *in, dlist *out, int first) {
    char rep[4];
    int rl = tk_u8enc(d->cp, rep);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->p[i].s;
        size_t n = in->p[i].n;
        int drop = first && i == 0 && d->prepend;
        char *a = tk_arena_alloc(ar, n + 1);
        if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        size_t k = 0;
        for (size_t j = 0; j < n;) {
            if (n - j >= (size_t)rl && !memcmp(s + j, rep, (size_t)rl)) {
                if (!drop) a[k++] = ' ';
                j += (size_t)rl;
            } else {
                a[k++] = s[j++];
            }
        }
        OSP_TRY(dpush(out, a, k));
    }
    return OSP_OK;
}

/* WordPiece (tokenizers' wordpiece.rs): a token after the first loses its prefix, or gets a space before it; then,
 * with cleanup, transformers' clean_up_tokenization on each token */
static osp_status wordpiece(tk_arena *ar, const tk_dec *d, const dlist *in, dlist *out, int first) {
    static const char *const R[][2] = {{" .", "."},     {" ?", "?"},         {" !", "!"},     {" ,", ","},
                                       {" ' ", "'"},   {" n't", "n't"},     {" 'm", "'m"},   {" do not", " don't"},
                                       {" 's", "'s"},   {" 've", "'ve"},     {" 're", "'re"}};
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->p[i].s;
        size_t n = in->p[i].n, k = 0;
        int strip = !(first && i == 0) && n >= d->content_len && !memcmp(s, d->content, d->content_len);
        int space = !(first && i == 0) && !strip;
        char *a = tk_arena_alloc(ar, n + 2);
        if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        if (space) a[k++] = ' ';
        memcpy(a + k, s + (strip ? d->content_len : 0), n - (strip ? d->content_len : 0));
        k += n - (strip ? d->content_len : 0);
        for (size_t r = 0; d->cleanup && r < sizeof R / sizeof *R; r++) { /* each replacement shortens or keeps */
            size_t pl = strlen(R[r][0]), rl = strlen(R[r][1]), w = 0;
            for (size_t x = 0; x < k;) {
                if (k - x >= pl && !memcmp(a + x, R[r][0], pl)) {
                    memmove(a + w, R[r][1], rl);
                    w += rl, x += pl;
                } else {
                    a[w++] = a[x++];
                }
            }
            k = w;
        }
        OSP_TRY(dpush(out, a, k));
    }
    return OSP_OK;
}

struct tk_decode_scratch {
    tk_arena ar;
    dlist a, b;
    tk_rx rx;
    tk_spans sp;
};

tk_decode_scratch *tk_decode_scratch_new(void) { return osp_calloc(OSP_POOL_MISC, sizeof(tk_decode_scratch)); }

void tk_decode_scratch_free(tk_decode_scratch *s) {
    if (!s) return;
    osp_free(s->a.p);
    osp_free(s->b.p);
    osp_free(s->sp.p);
    tk_rx_free(&s->rx);
    tk_arena_free(&s->ar);
    osp_free(s);
}

osp_status tk_decode_ids(const osp_tokenizer *t, const int32_t *ids, size_t n, int first, tk_buf *out,
                         int *pending) {
    tk_decode_scratch *s = tk_decode_scratch_new();
    if (!s) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    osp_status st = tk_decode_ids_s(t, ids, n, first, out, pending, s);
    tk_decode_scratch_free(s);
    return st;
}

osp_status tk_decode_ids_s(const osp_tokenizer *t, const int32_t *ids, size_t n, int first, tk_buf *out,
                           int *pending, tk_decode_scratch *scr) {
    out->n = 0;
    if (pending) *pending = 0;
    tk_arena_reset(&scr->ar);
    scr->a.n = scr->b.n = scr->sp.n = 0;
    /* the lists swap roles below: work on copies, store them back at the end */
    tk_arena ar = scr->ar;
    dlist a = scr->a, b = scr->b;
    tk_rx rx = scr->rx;
    tk_spans sp = scr->sp;
    osp_status st = OSP_OK;
    for (size_t i = 0; i < n && st == OSP_OK; i++) {
        size_t len;
        const char *s = osp_tokenizer_token_text(t, ids[i], &len);
        if (s) st = dpush(&a, s, len);
    }
    if (st == OSP_OK && !t->has_decoder) {
        for (size_t i = 0; i < a.n && st == OSP_OK; i++) {
            if (i > 0 || !first) st = tk_buf_put(out, " ", 1);
            if (st == OSP_OK) st = tk_buf_put(out, a.p[i].s, a.p[i].n);
        }
        goto done;
    }
    int fused = 0;
    for (int k = 0; k < t->n_dec && st == OSP_OK; k++) {
        const tk_dec *d = &t->dec[k];
        b.n = 0;
        switch (d->type) {
        case TD_BYTELEVEL: st = byte_level(&ar, &a, &b, pending); fused = 1; break;
        case TD_BYTEFALLBACK: st = byte_fallback(&ar, &a, &b, pending); break;
        case TD_FUSE: st = join(&ar, &a, &b); fused = 1; break;
        case TD_STRIP: st = strip(&ar, d, &a, &b, first, fused); break;
        case TD_METASPACE: st = metaspace(&ar, d, &a, &b, first); break;
        case TD_WORDPIECE: st = wordpiece(&ar, d, &a, &b, first); break;
        case TD_REPLACE:
            if (d->pat.is_regex && !rx.md) st = tk_rx_init(&rx);
            if (st == OSP_OK) st = replace(&ar, &rx, &sp, d, &a, &b);
            break;
        }
        dlist tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n && st == OSP_OK; i++) st = tk_buf_put(out, a.p[i].s, a.p[i].n);
done:
    if (st == OSP_OK) st = tk_buf_reserve(out, 0);
    if (st == OSP_OK) out->p[out->n] = 0;
    scr->ar = ar;
    scr->a = a;
    scr->b = b;
    scr->rx = rx;
    scr->sp = sp;
    return st;
}
