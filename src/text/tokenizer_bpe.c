/* The BPE model, as the reference's BPE::tokenize:
 *
 *   1. ignore_merges: a word that is itself in the vocab is one token.
 *   2. the word's characters become symbols (vocab ids); a character not in
 *      the vocab becomes its <0xNN> byte tokens (byte_fallback), else unk
 *      (consecutive unks fused when fuse_unk), else it is dropped.
 *   3. merges: a min-heap of adjacent pairs ordered by (rank, position),
 *      symbols in a linked list; popping an entry whose pair changed since
 *      it was pushed skips it. O(n log n) per word.
 *
 * Words repeat (English prose is mostly a few thousand words), so results
 * for short words go into a direct-mapped cache keyed by their bytes.
 *
 * SentencePiece-style vocabularies (Gemma) see whole lines as one word: no
 * pre-tokenizer cuts them. At load we find the characters c for which some
 * merge result contains "c▁" (c != ▁); cutting a word before every other
 * "▁" cannot change the result (no merge can join across the cut), and
 * turns lines into cacheable words. */
#include <string.h>
#include "text/tokenizer_internal.h"

static osp_status reserve_syms(tk_ctx *c, size_t n) {
    if (n <= c->sym_cap) return OSP_OK;
    size_t cap = c->sym_cap ? c->sym_cap : 256;
    while (cap < n) cap *= 2;
    osp_free(c->sym);
    osp_free(c->heap);
    c->sym = osp_malloc(OSP_POOL_MISC, cap * sizeof *c->sym);
    c->heap = osp_malloc(OSP_POOL_MISC, 2 * cap * sizeof *c->heap);
    c->sym_cap = c->heap_cap = c->sym && c->heap ? cap : 0;
    if (!c->sym_cap) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    return OSP_OK;
}

void tk_ctx_free_bpe(tk_ctx *c) {
    osp_free(c->sym);
    osp_free(c->heap);
    c->sym = NULL;
    c->heap = NULL;
    c->sym_cap = c->heap_cap = 0;
}

/* ---- heap of pairs: min by (rank, pos) ---- */

static inline int hless(const tk_hent *a, const tk_hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static inline void sift_down(tk_hent *h, size_t n, size_t i) {
    tk_hent x = h[i];
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = (l + 1 < n && hless(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!hless(&h[m], &x)) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = x;
}

static inline void sift_up(tk_hent *h, size_t i) {
    tk_hent x = h[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

/* Each merge adds at most 2 entries and removes 1 symbol: the heap never
 * holds more than 2 * symbols entries. */
static void merge_all(const osp_tokenizer *t, tk_sym *sym, size_t nsym, tk_hent *heap) {
    size_t hn = 0;
    for (size_t i = 0; i + 1 < nsym; i++) {
        const tk_pair_slot *p = tk_pairs_get(t, sym[i].c, sym[i + 1].c);
        if (p) heap[hn++] = (tk_hent){p->rank, (uint32_t)i, p->id, sym[i].c, sym[i + 1].c};
    }
    for (size_t i = hn / 2; i-- > 0;) sift_down(heap, hn, i);
    while (hn) {
        tk_hent top = heap[0];
        heap[0] = heap[--hn];
        if (hn) sift_down(heap, hn, 0);
        tk_sym *s = &sym[top.pos];
        if (s->len == 0 || s->next < 0 || s->c != top.left) continue;
        tk_sym *r = &sym[s->next];
        if (r->c != top.right) continue;
        s->c = top.id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (s->next >= 0) sym[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0) {
            const tk_pair_slot *p = tk_pairs_get(t, sym[s->prev].c, s->c);
            if (p) {
                heap[hn] = (tk_hent){p->rank, (uint32_t)s->prev, p->id, sym[s->prev].c, s->c};
                sift_up(heap, hn++);
            }
        }
        if (s->next >= 0) {
            const tk_pair_slot *p = tk_pairs_get(t, s->c, sym[s->next].c);
            if (p) {
                heap[hn] = (tk_hent){p->rank, top.pos, p->id, s->c, sym[s->next].c};
                sift_up(heap, hn++);
            }
        }
    }
}

/* ---- symbols ---- */

static inline void add_sym(tk_sym *sym, size_t *n, int32_t id, uint32_t len) {
    sym[*n].c = id;
    sym[*n].len = len;
    sym[*n].prev = (int32_t)*n - 1;
    sym[*n].next = -1;
    if (*n) sym[*n - 1].next = (int32_t)*n;
    (*n)++;
}

/* Id of one character as the vocab spells it at this position (with the
 * continuing-subword prefix / end-of-word suffix), or -1. */
static int32_t char_id_slow(tk_ctx *c, const char *ch, size_t clen, int first, int last) {
    const osp_tokenizer *t = c->t;
    tk_buf *b = &c->tmp2;
    b->n = 0;
    if (!first && t->cs_prefix_len && tk_buf_put(b, t->cs_prefix, t->cs_prefix_len) != OSP_OK) return -1;
    if (tk_buf_put(b, ch, clen) != OSP_OK) return -1;
    if (last && t->eow_suffix_len && tk_buf_put(b, t->eow_suffix, t->eow_suffix_len) != OSP_OK) return -1;
    return tk_vocab_get(t, b->p, b->n);
}

/* Symbols of one word. bl: raw bytes to read through ByteLevel's alphabet. */
static osp_status symbolize(tk_ctx *c, const char *s, size_t n, int bl, size_t *nsym_out) {
    const osp_tokenizer *t = c->t;
    OSP_TRY(reserve_syms(c, 4 * n + 4)); /* byte fallback: up to 4 symbols per char */
    tk_sym *sym = c->sym;
    size_t nsym = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    int simple = !t->cs_prefix_len && !t->eow_suffix_len;
    char mapped[4];
    for (size_t i = 0; i < n;) {
        const char *ch = s + i;
        int clen;
        int32_t id;
        if (bl) {
            clen = 1;
            id = simple ? t->bytechar_id[(unsigned char)*ch] : -1;
            if (id < 0) {
                int ml = tk_u8enc(tk_byte_cp((unsigned char)*ch), mapped);
                id = char_id_slow(c, mapped, (size_t)ml, i == 0, i + 1 == n);
                ch = mapped;
                clen = ml; /* the string the vocab was asked for */
            }
        } else {
            uint32_t cp = tk_u8dec(ch, &clen);
            if (simple) id = cp < 0x10000 ? t->cp_id[cp] : tk_vocab_get(t, ch, (size_t)clen);
            else id = char_id_slow(c, ch, (size_t)clen, i == 0, i + (size_t)clen == n);
        }
        size_t step = bl ? 1 : (size_t)clen;
        if (id >= 0) {
            if (unk >= 0) {
                add_sym(sym, &nsym, unk, unk_len);
                unk = -1;
            }
            add_sym(sym, &nsym, id, (uint32_t)step);
            i += step;
            continue;
        }
        if (t->byte_fallback) {
            /* the bytes of the string looked up, prefix/suffix included */
            const char *bs = ch;
            size_t bn = (size_t)clen;
            if (!simple) {
                char_id_slow(c, ch, (size_t)clen, i == 0, i + step == n);
                bs = c->tmp2.p;
                bn = c->tmp2.n;
            }
            size_t k = 0;
            while (k < bn && t->byte_tok[(unsigned char)bs[k]] >= 0) k++;
            if (k == bn) {
                /* as the reference: a pending unk stays pending (it lands after these) */
                for (k = 0; k < bn; k++) add_sym(sym, &nsym, t->byte_tok[(unsigned char)bs[k]], 1);
                i += step;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && t->fuse_unk) unk_len += (uint32_t)step;
            else {
                if (unk >= 0) add_sym(sym, &nsym, unk, unk_len);
                unk = t->unk_id;
                unk_len = (uint32_t)step;
            }
        }
        i += step;
    }
    if (unk >= 0) add_sym(sym, &nsym, unk, unk_len);
    *nsym_out = nsym;
    return OSP_OK;
}

/* ---- one word, through the cache ---- */

static osp_status word(tk_ctx *c, const char *s, size_t n, int bl, tk_ivec *out) {
    const osp_tokenizer *t = c->t;
    tk_cache_ent *ent = NULL;
    uint64_t h = 0;
    if (c->use_cache && n <= TK_CACHE_KEY) {
        h = tk_hash(s, n) ^ (uint64_t)bl;
        ent = &t->cache[h & t->cache_mask];
        if (ent->h == h && ent->klen == n && ent->nids && !memcmp(ent->key, s, n)) {
            OSP_TRY(tk_ivec_reserve(out, ent->nids));
            memcpy(out->p + out->n, ent->ids, ent->nids * sizeof *ent->ids);
            out->n += ent->nids;
            return OSP_OK;
        }
    }
    size_t nsym;
    OSP_TRY(symbolize(c, s, n, bl, &nsym));
    if (nsym > 1) merge_all(t, c->sym, nsym, c->heap);
    size_t start = out->n;
    for (int32_t i = nsym ? 0 : -1; i >= 0; i = c->sym[i].next) OSP_TRY(tk_ivec_push(out, c->sym[i].c));
    size_t k = out->n - start;
    if (ent && k > 0 && k <= TK_CACHE_IDS) {
        ent->h = h;
        ent->klen = (uint8_t)n;
        ent->nids = (uint8_t)k;
        memcpy(ent->key, s, n);
        memcpy(ent->ids, out->p + start, k * sizeof *out->p);
    }
    return OSP_OK;
}

static int meta_cut_ok(const osp_tokenizer *t, const char *s, size_t i) {
    /* s[i..] starts with U+2581; look at the char before it */
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    int len;
    uint32_t cp = tk_u8dec(s + j, &len);
    if (cp == 0x2581) return 0;
    for (int k = 0; k < t->n_meta_bad; k++)
        if (t->meta_bad[k] == cp) return 0;
    return 1;
}

osp_status tk_bpe_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out) {
    const osp_tokenizer *t = c->t;
    const char *s = pc->s;
    size_t n = pc->len;
    if (n == 0) return OSP_OK;
    if (t->ignore_merges) {
        const char *key = s;
        size_t kn = n;
        if (pc->bl) {
            tk_buf *b = &c->tmp;
            b->n = 0;
            OSP_TRY(tk_buf_reserve(b, 2 * n));
            for (size_t i = 0; i < n; i++) b->n += (size_t)tk_u8enc(tk_byte_cp((unsigned char)s[i]), b->p + b->n);
            key = b->p;
            kn = b->n;
        }
        int32_t id;
        if (tk_vocab_find(t, key, kn, &id) == OSP_OK) return tk_ivec_push(out, id);
    }
    if (!t->split_meta || pc->bl || n <= 3) return word(c, s, n, pc->bl, out);
    size_t b = 0;
    for (size_t i = 1; i + 3 <= n; i++) {
        if ((unsigned char)s[i] != 0xE2 || (unsigned char)s[i + 1] != 0x96 || (unsigned char)s[i + 2] != 0x81)
            continue;
        if (!meta_cut_ok(t, s, i)) continue;
        OSP_TRY(word(c, s + b, i - b, 0, out));
        b = i;
    }
    return word(c, s + b, n - b, 0, out);
}
