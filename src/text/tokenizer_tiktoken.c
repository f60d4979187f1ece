/* tiktoken rank files ("base64(bytes) rank" per line) on the same BPE core.
 *
 * tiktoken merges any two adjacent parts whose concatenation is a token,
 * lowest rank first, leftmost on ties, and takes a whole piece that is a
 * token as it is. That is the BPE model with ignore_merges and a merge
 * (a, b) -> ab of rank rank(ab) for every split of every token into two
 * tokens. Tokens are stored in ByteLevel's alphabet, so the pipeline is
 * Split(pattern, Isolated) + ByteLevel, and the ByteLevel decoder turns ids
 * back into bytes. */
#include <stdlib.h>
#include <string.h>
#include "text/tokenizer_internal.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int b64v(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with padding; returns the byte count or -1. */
static long b64dec(const char *s, size_t n, unsigned char *out) {
    while (n && s[n - 1] == '=') n--;
    long k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64v(s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[k++] = (unsigned char)(acc >> bits);
        }
    }
    return k;
}

typedef struct rank_rec {
    uint32_t off, len; /* raw bytes in a scratch pool */
    int32_t rank;
} rank_rec;

static osp_status parse_ranks(const char *path, const char *txt, size_t n, tk_buf *raw, rank_rec **recs,
                              size_t *n_recs, int32_t *max_rank) {
    size_t cap = 1024, cnt = 0, line = 0;
    rank_rec *r = osp_malloc(OSP_POOL_MISC, cap * sizeof *r);
    if (!r) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
    *max_rank = -1;
    osp_status st = OSP_OK;
    for (size_t i = 0; i < n && st == OSP_OK;) {
        size_t e = i;
        while (e < n && txt[e] != '\n') e++;
        line++;
        size_t le = e;
        if (le > i && txt[le - 1] == '\r') le--;
        if (le > i) {
            const char *sp = memchr(txt + i, ' ', le - i);
            char *endp = NULL;
            long rank = sp ? strtol(sp + 1, &endp, 10) : -1;
            if (!sp || endp != txt + le || rank < 0 || rank >= INT32_MAX / 2) {
                st = osp_err(OSP_ERR_FORMAT, "%s: line %zu is not 'base64 rank'", path, line);
                break;
            }
            size_t bn = (size_t)(sp - (txt + i));
            if ((st = tk_buf_reserve(raw, bn)) != OSP_OK) break;
            long k = b64dec(txt + i, bn, (unsigned char *)raw->p + raw->n);
            if (k < 0) {
                st = osp_err(OSP_ERR_FORMAT, "%s: line %zu: bad base64", path, line);
                break;
            }
            if (cnt == cap) {
                rank_rec *q = tk_grow(r, cnt, cap * 2, sizeof *r);
                if (!q) {
                    st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
                    break;
                }
                r = q;
                cap *= 2;
            }
            r[cnt].off = (uint32_t)raw->n;
            r[cnt].len = (uint32_t)k;
            r[cnt].rank = (int32_t)rank;
            raw->n += (size_t)k;
            if (rank > *max_rank) *max_rank = (int32_t)rank;
            cnt++;
        }
        i = e + 1;
    }
    if (st != OSP_OK) {
        osp_free(r);
        return st;
    }
    *recs = r;
    *n_recs = cnt;
    return OSP_OK;
}

static osp_status build(osp_tokenizer *t, const char *path, const char *txt, size_t n, const char *pattern,
                        const char *const *specials, int32_t n_specials) {
    tk_buf raw = {0}, mapped = {0};
    rank_rec *r = NULL;
    size_t nr = 0;
    int32_t max_rank = -1;
    osp_status st = parse_ranks(path, txt, n, &raw, &r, &nr, &max_rank);
    if (st != OSP_OK) {
        tk_buf_free(&raw);
        return st;
    }
    if (n_specials < 0 || (n_specials > 0 && !specials)) st = osp_err(OSP_ERR_INVALID, "%s: bad specials", path);
    if (st == OSP_OK) st = tk_ids_resize(t, max_rank + 1 + n_specials);
    /* tokens in ByteLevel's alphabet; the empty token (an unused rank) is left out */
    uint32_t *char_off = NULL; /* mapped offset of each byte of the current token, + end */
    for (size_t i = 0; i < nr && st == OSP_OK; i++) {
        if (!r[i].len) continue;
        if (t->mstr[r[i].rank].len != TK_NONE) {
            st = osp_err(OSP_ERR_FORMAT, "%s: rank %d appears twice", path, r[i].rank);
            break;
        }
        mapped.n = 0;
        for (uint32_t k = 0; k < r[i].len && st == OSP_OK; k++) {
            char ch[4];
            int cl = tk_u8enc(tk_byte_cp((unsigned char)raw.p[r[i].off + k]), ch);
            st = tk_buf_put(&mapped, ch, (size_t)cl);
        }
        if (st == OSP_OK) st = tk_pool_add(t, r[i].rank, mapped.p, mapped.n, &t->mstr[r[i].rank].off);
        t->mstr[r[i].rank].len = (uint32_t)mapped.n;
    }
    if (st == OSP_OK) st = tk_vocab_build_map(t);
    /* merges: every split of a token into two tokens */
    size_t co_cap = 0;
    for (size_t i = 0; i < nr && st == OSP_OK; i++) {
        uint32_t len = r[i].len;
        if (len < 2) continue;
        if (len + 1 > co_cap) {
            osp_free(char_off);
            co_cap = len + 1;
            char_off = osp_malloc(OSP_POOL_MISC, co_cap * sizeof *char_off);
            if (!char_off) {
                st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
        }
        int32_t id = r[i].rank;
        const char *s = t->pool + t->mstr[id].off;
        uint32_t off = 0;
        for (uint32_t k = 0; k < len; k++) {
            char_off[k] = off;
            off += (uint32_t)tk_u8len((unsigned char)s[off]);
        }
        char_off[len] = off;
        for (uint32_t k = 1; k < len && st == OSP_OK; k++) {
            int32_t a = tk_vocab_get(t, s, char_off[k]);
            int32_t b = a >= 0 ? tk_vocab_get(t, s + char_off[k], off - char_off[k]) : -1;
            if (a >= 0 && b >= 0) st = tk_pairs_insert(t, a, b, (uint32_t)id, id);
        }
    }
    osp_free(char_off);
    osp_free(r);
    tk_buf_free(&raw);
    tk_buf_free(&mapped);
    if (st != OSP_OK) return st;
    t->ignore_merges = 1;

    /* specials: added tokens after the ranks */
    t->added = osp_calloc(OSP_POOL_MISC, (size_t)(n_specials ? n_specials : 1) * sizeof *t->added);
    if (!t->added) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
    for (int32_t i = 0; i < n_specials; i++) {
        size_t len = specials[i] ? strlen(specials[i]) : 0;
        if (!len) return osp_err(OSP_ERR_INVALID, "%s: special token %d is empty", path, i);
        tk_added *a = &t->added[t->n_added++];
        a->s = tk_strndup(specials[i], len);
        if (!a->s) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
        a->len = (uint32_t)len;
        a->id = max_rank + 1 + i;
        a->special = 1;
    }
    OSP_TRY(tk_added_finish(t));

    /* Split(pattern, Isolated) + ByteLevel (deferred), ByteLevel decoder */
    t->pre = osp_calloc(OSP_POOL_MISC, 2 * sizeof *t->pre);
    t->dec = osp_calloc(OSP_POOL_MISC, sizeof *t->dec);
    if (!t->pre || !t->dec) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", path);
    t->n_pre = 2;
    t->pre[0].type = TP_SPLIT;
    t->pre[0].behavior = TB_ISOLATED;
    const char *pat = pattern ? pattern : GPT2_PATTERN;
    OSP_TRY(tk_pattern_init(&t->pre[0].pat, pat, strlen(pat), 1, "tiktoken pattern"));
    t->pre[1].type = TP_BYTELEVEL;
    t->n_dec = 1;
    t->has_decoder = 1;
    t->dec[0].type = TD_BYTELEVEL;
    OSP_TRY(tk_finish_model(t));
    t->info.add_bos = t->info.add_eos = 0;
    return OSP_OK;
}

osp_status osp_tokenizer_load_tiktoken(const char *path, const char *pattern, const char *const *specials,
                                       int32_t n_specials, osp_tokenizer **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return osp_err(OSP_ERR_IO, "%s: cannot open", path);
    tk_buf txt = {0};
    char chunk[65536];
    size_t k;
    osp_status st = OSP_OK;
    while (st == OSP_OK && (k = fread(chunk, 1, sizeof chunk, f)) > 0) st = tk_buf_put(&txt, chunk, k);
    if (st == OSP_OK && ferror(f)) st = osp_err(OSP_ERR_IO, "%s: read failed", path);
    fclose(f);
    osp_tokenizer *t = NULL;
    if (st == OSP_OK) st = tk_tokenizer_new(path, &t);
    if (st == OSP_OK) st = build(t, path, txt.p ? txt.p : "", txt.n, pattern, specials, n_specials);
    tk_buf_free(&txt);
    if (st != OSP_OK) {
        osp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return OSP_OK;
}
