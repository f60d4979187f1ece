/* BERT's tokenizer pieces: the BertNormalizer and the WordPiece model, as Hugging Face tokenizers computes them
 * (normalizers/bert.rs, models/wordpiece).
 *
 * BertNormalizer, in its order: clean_text (drop U+0000, U+FFFD and control characters, the categories C* but
 * tab, newline and return; every White_Space character, and those three, becomes a space), handle_chinese_chars
 * (a space either side of each CJK ideograph), strip_accents (NFD, then drop the nonspacing marks, Mn), lowercase
 * (Rust's to_lowercase, tokenizer_norm.c's). BertPreTokenizer is WhitespaceSplit then Punctuation (isolated)
 * (tokenizer_pretok.c).
 *
 * WordPiece: a word of more than max_input_chars_per_word characters is the unk token; otherwise greedy longest
 * match first from the left, pieces after the first looked up with the continuing_subword_prefix ("##"); a word
 * with a part that matches nothing is one unk token. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "text/tokenizer_internal.h"

static int is_chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int is_other(uint32_t c) { /* Rust's char::is_other: the general categories Cc, Cf, Cs, Co, Cn */
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN;
}

/* clean_text and handle_chinese_chars in one pass: at most three bytes out per byte in (a 3-byte ideograph
 * becomes 5 bytes) */
static osp_status clean(tk_ctx *c, int flags, const char *s, size_t n, const char **o, size_t *on) {
    char *a = tk_arena_alloc(&c->arena, 3 * n + 1);
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int len;
        uint32_t cp = tk_u8dec(s + i, &len);
        const char *from = s + i;
        i += (size_t)len;
        if (flags & TK_BERT_CLEAN) {
            int tnr = cp == '\t' || cp == '\n' || cp == '\r';
            if (cp == 0 || cp == 0xFFFD || (!tnr && is_other(cp))) continue; /* filtered, then mapped */
            if (tnr || tk_is_white_space(cp)) {
                a[k++] = ' ';
                continue;
            }
        }
        int pad = (flags & TK_BERT_CHINESE) && is_chinese(cp);
        if (pad) a[k++] = ' ';
        memcpy(a + k, from, (size_t)len);
        k += (size_t)len;
        if (pad) a[k++] = ' ';
    }
    *o = a;
    *on = k;
    return OSP_OK;
}

/* NFD, then without the nonspacing marks */
static osp_status strip_accents(tk_ctx *c, const char *s, size_t n, const char **o, size_t *on) {
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    if (ascii) {
        *o = s, *on = n;
        return OSP_OK;
    }
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    if (r < 0) return osp_err(OSP_ERR_INTERNAL, "tokenizer: normalization failed: %s", utf8proc_errmsg(r));
    char *a = tk_arena_alloc(&c->arena, (size_t)r + 1);
    if (!a) {
        free(d);
        return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (utf8proc_ssize_t i = 0; i < r;) {
        int len;
        uint32_t cp = tk_u8dec((const char *)d + i, &len);
        if (utf8proc_category((utf8proc_int32_t)cp) != UTF8PROC_CATEGORY_MN) memcpy(a + k, d + i, (size_t)len), k += (size_t)len;
        i += len;
    }
    free(d);
    *o = a;
    *on = k;
    return OSP_OK;
}

osp_status tk_bert_normalize(tk_ctx *c, int flags, const char *s, size_t n, const char **o, size_t *on) {
    if (flags & (TK_BERT_CLEAN | TK_BERT_CHINESE)) OSP_TRY(clean(c, flags, s, n, &s, &n));
    if (flags & TK_BERT_ACCENTS) OSP_TRY(strip_accents(c, s, n, &s, &n));
    if (flags & TK_BERT_LOWER) OSP_TRY(tk_lowercase(c, s, n, &s, &n));
    *o = s;
    *on = n;
    return OSP_OK;
}

static osp_status unk(const osp_tokenizer *t, tk_ivec *out) {
    if (t->unk_id < 0) return osp_err(OSP_ERR_INVALID, "%s: a word is not in the vocab and there is no unk_token", t->name);
    return tk_ivec_push(out, t->unk_id);
}

osp_status tk_wordpiece_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out) {
    const osp_tokenizer *t = c->t;
    const char *s = pc->s;
    const size_t n = pc->len, P = t->cs_prefix_len;
    if (!n) return OSP_OK;
    size_t chars = 0;
    for (size_t i = 0; i < n; i += (size_t)tk_u8len((unsigned char)s[i])) chars++;
    if (chars > (size_t)t->wp_max_chars) return unk(t, out);
    size_t mark = out->n;
    c->tmp.n = 0;
    OSP_TRY(tk_buf_reserve(&c->tmp, P + n));
    memcpy(c->tmp.p, t->cs_prefix, P);
    for (size_t start = 0; start < n;) {
        int32_t id = -1;
        size_t end = n;
        while (end > start) {
            const char *key = s + start;
            size_t kn = end - start;
            if (start > 0) { /* the prefix, then the piece */
                memcpy(c->tmp.p + P, s + start, kn);
                key = c->tmp.p, kn += P;
            }
            if (tk_vocab_find(t, key, kn, &id) == OSP_OK) break;
            id = -1;
            do end--; while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80); /* a char boundary */
        }
        if (id < 0) { /* a part matches nothing: the whole word is unk */
            out->n = mark;
            return unk(t, out);
        }
        OSP_TRY(tk_ivec_push(out, id));
        start = end;
    }
    return OSP_OK;
}
