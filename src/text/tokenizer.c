/* The tokenizer's public entry points: encode (the pipeline driver),
 * decode, lookups, and the tables built once the model is read. */
#include <string.h>
#include "text/tokenizer_internal.h"

#define CACHE_ENTRIES 8192

osp_status tk_tokenizer_new(const char *name, osp_tokenizer **out) {
    osp_tokenizer *t = osp_calloc(OSP_POOL_MISC, sizeof *t);
    if (!t) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    t->name = tk_strndup(name, strlen(name));
    t->unk_id = -1;
    t->info.bos_id = t->info.eos_id = t->info.pad_id = t->info.unk_id = -1;
    pthread_mutex_init(&t->cache_mu, NULL);
    if (!t->name) {
        osp_free(t);
        return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    *out = t;
    return OSP_OK;
}

void osp_tokenizer_free(osp_tokenizer *t) {
    if (!t) return;
    osp_free(t->name);
    osp_free(t->pool);
    osp_free(t->mstr);
    osp_free(t->vmap);
    osp_free(t->cp_id);
    osp_free(t->pairs);
    osp_free(t->uni_score);
    osp_free(t->cs_prefix);
    osp_free(t->eow_suffix);
    tk_added_free(t);
    osp_free(t->added_of_id);
    for (int i = 0; i < t->n_norm; i++) tk_norm_free(&t->norm[i]);
    osp_free(t->norm);
    for (int i = 0; i < t->n_pre; i++) tk_pretok_free(&t->pre[i]);
    osp_free(t->pre);
    for (int i = 0; i < t->n_dec; i++) tk_dec_free(&t->dec[i]);
    osp_free(t->dec);
    osp_free(t->pp_prefix);
    osp_free(t->pp_suffix);
    if (t->re_gpt2) pcre2_code_free(t->re_gpt2);
    osp_free(t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    osp_free(t);
}

/* Tables derived from the vocabulary and merges; see tokenizer_bpe.c. */
osp_status tk_finish_model(osp_tokenizer *t) {
    t->cp_id = osp_malloc(OSP_POOL_MISC, 0x10000 * sizeof *t->cp_id);
    t->cache = osp_calloc(OSP_POOL_MISC, CACHE_ENTRIES * sizeof *t->cache);
    if (!t->cp_id || !t->cache) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    t->cache_mask = CACHE_ENTRIES - 1;
    for (int i = 0; i < 0x10000; i++) t->cp_id[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t n = t->mstr[id].len;
        if (n == TK_NONE || n == 0 || n > 3) continue;
        const char *s = t->pool + t->mstr[id].off;
        int len;
        uint32_t cp = tk_u8dec(s, &len);
        if ((uint32_t)len == n && cp < 0x10000) t->cp_id[cp] = id;
    }
    for (int b = 0; b < 256; b++) {
        char name[8], ch[4];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_tok[b] = tk_vocab_get(t, name, 6);
        int n = tk_u8enc(tk_byte_cp((unsigned)b), ch);
        t->bytechar_id[b] = tk_vocab_get(t, ch, (size_t)n);
    }

    /* Cutting words before U+2581 (see tokenizer_bpe.c); the merges were
     * scanned for "c\u2581" while they were read. */
    static const char META[] = "\xE2\x96\x81";
    t->split_meta = t->meta_scanned && !t->meta_overflow && !t->cs_prefix_len && !t->eow_suffix_len &&
                    tk_vocab_get(t, META, 3) >= 0;
    if (!t->split_meta) return OSP_OK;
    /* Byte-fallback and unk symbols do not spell the text they stand for,
     * so a merge that involves one defeats the scan: then never cut. */
    uint8_t *odd = osp_calloc(OSP_POOL_MISC, (size_t)t->n_vocab / 8 + 1);
    if (!odd) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    for (int b = 0; b < 256; b++)
        if (t->byte_tok[b] >= 0) odd[t->byte_tok[b] >> 3] |= (uint8_t)(1u << (t->byte_tok[b] & 7));
    if (t->unk_id >= 0) odd[t->unk_id >> 3] |= (uint8_t)(1u << (t->unk_id & 7));
    for (uint32_t i = 0; i <= t->pmask && t->split_meta; i++) {
        if (t->pairs[i].key == UINT64_MAX) continue;
        uint32_t a = (uint32_t)(t->pairs[i].key >> 32), b = (uint32_t)t->pairs[i].key;
        if ((odd[a >> 3] >> (a & 7)) & 1 || (odd[b >> 3] >> (b & 7)) & 1) t->split_meta = 0;
    }
    osp_free(odd);
    return OSP_OK;
}

/* ---- encode ---- */

osp_status tk_ctx_init(tk_ctx *c, const osp_tokenizer *t) {
    memset(c, 0, sizeof *c);
    c->t = t;
    return tk_rx_init(&c->rx);
}

void tk_ctx_free(tk_ctx *c) {
    tk_arena_free(&c->arena);
    tk_rx_free(&c->rx);
    osp_free(c->spans.p);
    osp_free(c->segs.p);
    osp_free(c->acc.p);
    tk_buf_free(&c->tmp);
    tk_buf_free(&c->tmp2);
    tk_ctx_free_bpe(c);
}

static osp_status encode(tk_ctx *c, const char *text, size_t len, int add_special, tk_ivec *ids) {
    const osp_tokenizer *t = c->t;
    size_t bad = tk_utf8_valid_prefix(text, len);
    if (bad != len) return osp_err(OSP_ERR_INVALID, "text to encode is not valid UTF-8 (byte %zu)", bad);
    if (len > UINT32_MAX / 4) return osp_err(OSP_ERR_RANGE, "text to encode is too long (%zu bytes)", len);
    tk_pieces a = {0}, b = {0}, *res = NULL;
    osp_status st = OSP_OK;
    if (add_special) st = tk_ivec_reserve(ids, (size_t)(t->n_prefix + t->n_suffix));
    if (st == OSP_OK && add_special)
        for (int i = 0; i < t->n_prefix; i++) ids->p[ids->n++] = t->pp_prefix[i];

    /* 1. added tokens on the raw text */
    tk_piece whole = {text, (uint32_t)len, -1, 1, 0};
    if (st == OSP_OK && len) st = tk_added_split(c, &t->trie_raw, &whole, &a);
    /* 2. normalize each remaining piece, then the normalized added tokens */
    if (st == OSP_OK && (t->n_norm || t->trie_norm.used)) {
        b.n = 0;
        for (size_t i = 0; i < a.n && st == OSP_OK; i++) {
            tk_piece pc = a.p[i];
            if (pc.id >= 0) {
                st = tk_pieces_push(&b, pc);
                continue;
            }
            const char *ns;
            size_t nn;
            st = tk_normalize(c, pc.s, pc.len, &ns, &nn);
            if (st != OSP_OK || nn == 0) continue;
            pc.s = ns;
            pc.len = (uint32_t)nn;
            st = tk_added_split(c, &t->trie_norm, &pc, &b);
        }
        tk_pieces tmp = a;
        a = b;
        b = tmp;
    }
    /* 3. pre-tokenize */
    if (st == OSP_OK) st = tk_pretokenize(c, &a, &b, &res);
    /* 4. the model */
    for (size_t i = 0; st == OSP_OK && i < res->n; i++) {
        if (res->p[i].id >= 0) st = tk_ivec_push(ids, res->p[i].id);
        else if (t->model == TK_MODEL_WORDPIECE) st = tk_wordpiece_piece(c, &res->p[i], ids);
        else if (t->model == TK_MODEL_UNIGRAM) st = tk_unigram_piece(c, &res->p[i], ids);
        else st = tk_bpe_piece(c, &res->p[i], ids);
    }
    /* 5. post-process */
    if (st == OSP_OK && add_special) st = tk_ivec_reserve(ids, (size_t)t->n_suffix);
    if (st == OSP_OK && add_special)
        for (int i = 0; i < t->n_suffix; i++) ids->p[ids->n++] = t->pp_suffix[i];
    osp_free(a.p);
    osp_free(b.p);
    return st;
}

static osp_status encode_vec(const osp_tokenizer *t, const char *text, size_t len, int add_special, tk_ivec *ids) {
    if (!t || (!text && len)) return osp_err(OSP_ERR_INVALID, "encode: no tokenizer or text");
    tk_ctx c;
    OSP_TRY(tk_ctx_init(&c, t));
    osp_tokenizer *mt = (osp_tokenizer *)t; /* the cache is the only mutable part */
    c.use_cache = pthread_mutex_trylock(&mt->cache_mu) == 0;
    osp_status st = encode(&c, text ? text : "", len, add_special, ids);
    if (c.use_cache) pthread_mutex_unlock(&mt->cache_mu);
    tk_ctx_free(&c);
    return st;
}

osp_status osp_tokenizer_encode(const osp_tokenizer *t, const char *text, size_t len, int add_special,
                                int32_t *ids, size_t cap, size_t *n_ids) {
    tk_ivec v = {0};
    osp_status st = encode_vec(t, text, len, add_special, &v);
    if (st == OSP_OK) {
        *n_ids = v.n;
        if (v.n > cap) st = osp_err(OSP_ERR_RANGE, "encode: %zu ids do not fit in a buffer of %zu", v.n, cap);
        else if (v.n) memcpy(ids, v.p, v.n * sizeof *ids);
    }
    tk_ivec_free(&v);
    return st;
}

osp_status osp_tokenizer_encode_alloc(const osp_tokenizer *t, const char *text, size_t len, int add_special,
                                      int32_t **ids, size_t *n_ids) {
    tk_ivec v = {0};
    osp_status st = encode_vec(t, text, len, add_special, &v);
    if (st == OSP_OK && !v.p) st = tk_ivec_reserve(&v, 1);
    if (st != OSP_OK) {
        tk_ivec_free(&v);
        return st;
    }
    *ids = v.p;
    *n_ids = v.n;
    return OSP_OK;
}

/* ---- lookups ---- */

const osp_tokenizer_info *osp_tokenizer_get_info(const osp_tokenizer *t) { return &t->info; }

int32_t osp_tokenizer_token_id(const osp_tokenizer *t, const char *s, size_t len) {
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && !memcmp(t->added[i].s, s, len)) return t->added[i].id;
    return tk_vocab_get(t, s, len);
}

const char *osp_tokenizer_token_text(const osp_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    int32_t a = t->added_of_id[id];
    if (a >= 0) {
        *len = t->added[a].len;
        return t->added[a].s;
    }
    if (t->mstr[id].len == TK_NONE) return NULL;
    *len = t->mstr[id].len;
    return t->pool + t->mstr[id].off;
}

int osp_tokenizer_is_special(const osp_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return 0;
    int32_t a = t->added_of_id[id];
    return a >= 0 && t->added[a].special;
}

/* ---- decode ---- */

/* transformers' clean_up_tokenization, one replacement after the other */
static osp_status cleanup_spaces(tk_buf *b) {
    static const char *const R[][2] = {{" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                       {" ' ", "'"},   {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
                                       {" 've", "'ve"}, {" 're", "'re"}};
    for (size_t r = 0; r < sizeof R / sizeof *R; r++) {
        size_t pl = strlen(R[r][0]), rl = strlen(R[r][1]), k = 0;
        for (size_t i = 0; i < b->n;) {
            if (b->n - i >= pl && !memcmp(b->p + i, R[r][0], pl)) {
                memmove(b->p + k, R[r][1], rl); /* rl < pl: never overruns the input */
                k += rl;
                i += pl;
            } else {
                b->p[k++] = b->p[i++];
            }
        }
        b->n = k;
    }
    b->p[b->n] = 0;
    return OSP_OK;
}

osp_status osp_tokenizer_decode(const osp_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                                size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    tk_ivec keep = {0};
    osp_status st = tk_ivec_reserve(&keep, n + 1);
    for (size_t i = 0; i < n && st == OSP_OK; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            st = osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", ids[i],
                         t->n_vocab - 1);
            break;
        }
        if ((flags & OSP_DECODE_SKIP_SPECIAL) && osp_tokenizer_is_special(t, ids[i])) continue;
        keep.p[keep.n++] = ids[i];
    }
    tk_buf out = {0};
    if (st == OSP_OK) st = tk_decode_ids(t, keep.p, keep.n, 1, &out, NULL);
    if (st == OSP_OK && (flags & OSP_DECODE_CLEANUP_SPACES)) st = cleanup_spaces(&out);
    tk_ivec_free(&keep);
    if (st != OSP_OK) {
        tk_buf_free(&out);
        return st;
    }
    *text = out.p;
    if (len) *len = out.n;
    return OSP_OK;
}
