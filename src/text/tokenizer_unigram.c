/* SentencePiece's pieces as Hugging Face tokenizers computes them: the Unigram model (models/unigram, its
 * encode_optimized) and the Precompiled normalizer (spm_precompiled), XLM-RoBERTa's.
 *
 * Unigram: the vocab is a list of [piece, score]; a piece's id is its index. A pre-token is cut by Viterbi over
 * its bytes: at each character start, every piece that begins there (shorter first) may end a path, scored by the
 * sum of its pieces' scores; the first best path into a position is kept (a later one must be strictly better). A
 * character no piece begins with is the unk piece, scored the lowest score minus 10. Walking back, runs of unk
 * pieces fuse into one; a fused run (or any string not in the vocab) is its bytes' <0xNN> pieces when
 * byte_fallback is set and they all exist, else unk_id.
 *
 * Precompiled: the charsmap is [u32 trie size][a darts-clone double-array trie][NUL-terminated replacements]. The
 * text is walked by extended grapheme clusters: a cluster of fewer than 6 bytes whose bytes begin with a key is
 * replaced by the shortest such key's replacement; otherwise each of its characters is, when one begins it, else
 * kept (spm_precompiled's normalize_string, as it is). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "text/tokenizer_internal.h"

#define UNK_PENALTY 10.0

/* ---- the vocab ---- */

static osp_status number(tk_json *j, double *v) {
    tkj_ws(j);
    const char *s = j->p;
    OSP_TRY(tkj_skip(j));
    char buf[64];
    size_t n = (size_t)(j->p - s);
    if (n == 0 || n >= sizeof buf || !(*s == '-' || (*s >= '0' && *s <= '9'))) {
        j->p = s;
        return tkj_error(j, "a Unigram score must be a number");
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    *v = strtod(buf, NULL);
    return OSP_OK;
}

osp_status tk_unigram_parse_vocab(osp_tokenizer *t, tk_json *j) {
    tk_buf key = {0};
    size_t cap = 1 << 12, n = 0;
    double *score = osp_malloc(OSP_POOL_MISC, cap * sizeof *score);
    uint32_t *off = osp_malloc(OSP_POOL_MISC, cap * sizeof *off), *len = osp_malloc(OSP_POOL_MISC, cap * sizeof *len);
    osp_status st = score && off && len ? tkj_expect(j, '[') : osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    int first = 1;
    while (st == OSP_OK && tkj_arr_next(j, &first, &st) == 1) {
        if (n == (size_t)INT32_MAX - 1) {
            st = tkj_error(j, "too many pieces");
            break;
        }
        if (n == cap) {
            double *s2 = tk_grow(score, n, cap * 2, sizeof *score);
            if (s2) score = s2;
            uint32_t *o2 = s2 ? tk_grow(off, n, cap * 2, sizeof *off) : NULL;
            if (o2) off = o2;
            uint32_t *l2 = o2 ? tk_grow(len, n, cap * 2, sizeof *len) : NULL;
            if (l2) len = l2;
            if (!l2) {
                st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
                break;
            }
            cap *= 2;
        }
        double v = 0;
        if ((st = tkj_expect(j, '[')) != OSP_OK || (st = tkj_string(j, &key)) != OSP_OK ||
            (st = tkj_expect(j, ',')) != OSP_OK || (st = number(j, &v)) != OSP_OK || (st = tkj_expect(j, ']')) != OSP_OK)
            break;
        if ((st = tk_pool_add(t, (int32_t)n, key.p, key.n, &off[n])) != OSP_OK) break;
        len[n] = (uint32_t)key.n;
        score[n++] = v;
    }
    tk_buf_free(&key);
    if (st == OSP_OK && n == 0) st = osp_err(OSP_ERR_FORMAT, "%s: a Unigram model with an empty vocab", t->name);
    if (st == OSP_OK) st = tk_ids_resize(t, (int32_t)n);
    for (size_t i = 0; i < n && st == OSP_OK; i++) {
        t->mstr[i].off = off[i], t->mstr[i].len = len[i];
        if (i == 0 || score[i] < t->uni_min_score) t->uni_min_score = score[i];
        if ((int32_t)len[i] > t->uni_max_len) t->uni_max_len = (int32_t)len[i];
    }
    osp_free(off);
    osp_free(len);
    if (st == OSP_OK) st = tk_vocab_build_map(t);
    if (st == OSP_OK) {
        osp_free(t->uni_score);
        t->uni_score = score;
    } else {
        osp_free(score);
    }
    return st;
}

/* ---- Viterbi ---- */

typedef struct node {
    double score;
    int32_t from, id; /* from < 0: not reached */
} node;

/* the string s[a, b) as ids: its piece, or its bytes' <0xNN> pieces, or unk */
static osp_status emit(const osp_tokenizer *t, const char *s, size_t a, size_t b, tk_ivec *out) {
    int32_t id;
    if (tk_vocab_find(t, s + a, b - a, &id) == OSP_OK) return tk_ivec_push(out, id);
    int bytes = t->byte_fallback;
    for (size_t i = a; i < b && bytes; i++) bytes = t->byte_tok[(unsigned char)s[i]] >= 0;
    if (bytes) {
        for (size_t i = a; i < b; i++) OSP_TRY(tk_ivec_push(out, t->byte_tok[(unsigned char)s[i]]));
        return OSP_OK;
    }
    if (t->unk_id < 0) return osp_err(OSP_ERR_INVALID, "%s: text outside the vocab and no unk_id", t->name);
    return tk_ivec_push(out, t->unk_id);
}

osp_status tk_unigram_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out) {
    const osp_tokenizer *t = c->t;
    const char *s = pc->s;
    const size_t n = pc->len;
    if (!n) return OSP_OK;
    node *best = (node *)tk_arena_alloc(&c->arena, (n + 1) * sizeof *best + sizeof(double));
    if (!best) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    best = (node *)(((uintptr_t)best + sizeof(double) - 1) & ~(uintptr_t)(sizeof(double) - 1));
    for (size_t i = 0; i <= n; i++) best[i] = (node){0, -1, -1};
    const double unk_score = t->uni_min_score - UNK_PENALTY;
    for (size_t at = 0; at < n;) {
        const size_t mb = (size_t)tk_u8len((unsigned char)s[at]);
        const double base = best[at].score;
        int single = 0;
        for (size_t end = at + 1; end <= n && end - at <= (size_t)t->uni_max_len; end++) {
            if (end < n && ((unsigned char)s[end] & 0xC0) == 0x80) continue; /* pieces end at characters */
            int32_t id;
            if (tk_vocab_find(t, s + at, end - at, &id) != OSP_OK) continue;
            double cand = t->uni_score[id] + base;
            if (best[end].from < 0 || cand > best[end].score) best[end] = (node){cand, (int32_t)at, id};
            if (end - at == mb) single = 1;
        }
        if (!single) {
            if (t->unk_id < 0) return osp_err(OSP_ERR_INVALID, "%s: text outside the vocab and no unk_id", t->name);
            double cand = unk_score + base;
            if (best[at + mb].from < 0 || cand > best[at + mb].score) best[at + mb] = (node){cand, (int32_t)at, t->unk_id};
        }
        at += mb;
    }
    /* back from the end: the path's pieces, reversed, unk runs fused */
    size_t first = out->n;
    for (size_t end = n; end > 0;) {
        size_t a = (size_t)best[end].from;
        if (best[end].id == t->unk_id)
            while (a > 0 && best[a].id == t->unk_id) a = (size_t)best[a].from;
        /* pushed as (b, a) pairs, decoded below once reversed */
        OSP_TRY(tk_ivec_push(out, (int32_t)end));
        OSP_TRY(tk_ivec_push(out, (int32_t)a));
        end = a;
    }
    size_t npairs = (out->n - first) / 2;
    char *raw = tk_arena_alloc(&c->arena, npairs * 2 * sizeof(int32_t) + sizeof(int32_t) - 1);
    if (!raw) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    int32_t *pairs = (int32_t *)(raw + (-(uintptr_t)raw & (sizeof(int32_t) - 1))); /* (the arena's bytes: aligned here) */
    memcpy(pairs, out->p + first, npairs * 2 * sizeof(int32_t));
    out->n = first;
    for (size_t k = npairs; k-- > 0;) OSP_TRY(emit(t, s, (size_t)pairs[2 * k + 1], (size_t)pairs[2 * k], out));
    return OSP_OK;
}

/* ---- Precompiled ---- */

static int b64v(unsigned char ch) {
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    return ch == '+' ? 62 : ch == '/' ? 63 : -1;
}

osp_status tk_precompiled_parse(osp_tokenizer *t, tk_norm *st, const char *b64, size_t n) {
    while (n && b64[n - 1] == '=') n--;
    st->content = osp_malloc(OSP_POOL_MISC, n * 3 / 4 + 4);
    if (!st->content) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64v((unsigned char)b64[i]);
        if (v < 0) return osp_err(OSP_ERR_FORMAT, "%s: Precompiled charsmap is not base64", t->name);
        acc = acc << 6 | (uint32_t)v, bits += 6;
        if (bits >= 8) bits -= 8, st->content[k++] = (char)(acc >> bits & 0xFF);
    }
    st->content_len = k;
    uint32_t tsz = 0;
    if (k >= 4) memcpy(&tsz, st->content, 4);
    if (k < 8 || tsz < 4 || tsz % 4 || tsz > k - 4)
        return osp_err(OSP_ERR_FORMAT, "%s: Precompiled charsmap is malformed (its trie does not fit)", t->name);
    const char *blob = st->content + 4 + tsz; /* replacements become text: valid UTF-8 only */
    if (tk_utf8_valid_prefix(blob, k - 4 - tsz) != k - 4 - tsz)
        return osp_err(OSP_ERR_FORMAT, "%s: Precompiled charsmap has replacements that are not UTF-8", t->name);
    return OSP_OK;
}

static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* the replacement of the shortest key s begins with, or NULL */
static const char *transform(const tk_norm *st, const char *s, size_t n, size_t *rn) {
    uint32_t tsz;
    memcpy(&tsz, st->content, 4);
    const size_t units = tsz / 4;
    const unsigned char *arr = (const unsigned char *)st->content + 4;
    const char *blob = st->content + 4 + tsz;
    const size_t blob_n = st->content_len - 4 - tsz;
#define UNIT(i) ((uint32_t)arr[4 * (i)] | (uint32_t)arr[4 * (i) + 1] << 8 | (uint32_t)arr[4 * (i) + 2] << 16 | \
                 (uint32_t)arr[4 * (i) + 3] << 24)
    size_t pos = unit_offset(UNIT(0));
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!ch) return NULL;
        pos ^= ch;
        if (pos >= units) return NULL;
        uint32_t u = UNIT(pos);
        if ((u & (0x80000000u | 0xFFu)) != ch) return NULL;
        pos ^= unit_offset(u);
        if (pos >= units) return NULL;
        if ((u >> 8) & 1) {
            size_t v = UNIT(pos) & 0x7FFFFFFFu;
            if (v >= blob_n) return NULL;
            const char *e = memchr(blob + v, 0, blob_n - v);
            *rn = e ? (size_t)(e - (blob + v)) : blob_n - v;
            return blob + v;
        }
    }
#undef UNIT
    return NULL;
}

osp_status tk_precompiled_normalize(tk_ctx *c, const tk_norm *st, const char *s, size_t n, const char **o,
                                    size_t *on) {
    tk_buf *b = &c->tmp2;
    b->n = 0;
    for (size_t g = 0; g < n;) { /* one extended grapheme cluster [g, e) */
        int len;
        utf8proc_int32_t state = 0, prev = (utf8proc_int32_t)tk_u8dec(s + g, &len);
        size_t e = g + (size_t)len;
        while (e < n) {
            utf8proc_int32_t cp = (utf8proc_int32_t)tk_u8dec(s + e, &len);
            if (utf8proc_grapheme_break_stateful(prev, cp, &state)) break;
            prev = cp;
            e += (size_t)len;
        }
        size_t rn;
        const char *r = e - g < 6 ? transform(st, s + g, e - g, &rn) : NULL;
        if (r) {
            OSP_TRY(tk_buf_put(b, r, rn));
        } else {
            for (size_t i = g; i < e; i += (size_t)len) {
                len = tk_u8len((unsigned char)s[i]);
                r = transform(st, s + i, (size_t)len, &rn);
                OSP_TRY(r ? tk_buf_put(b, r, rn) : tk_buf_put(b, s + i, (size_t)len));
            }
        }
        g = e;
    }
    char *a = tk_arena_alloc(&c->arena, b->n + 1);
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(a, b->p, b->n);
    *o = a;
    *on = b->n;
    return OSP_OK;
}
